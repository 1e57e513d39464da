"""KTransformers' own residency policies (kt-kernel's tiered weight provider), as its code runs them.

Source: kvcache-ai/ktransformers, ``kt-kernel/python/utils/weight_provider.py`` (TwoQPolicy, SLRUPolicy,
SIEVEPolicy, S3FIFOPolicy, WTinyLFUPolicy, create_residency_policy's defaults) at commit
86d18f94db8e01a12d0e8f4e17af76cea2995ad6, checked there by ``kt-kernel/test/per_commit/
test_residency_policy_golden_traces.py``. Each request is placed first and the queues trimmed after, so these evict
on hits too (2Q and SLRU move a key between segments and trim the one that overflows). Where each differs from the
textbook (moetier.core.policies.twoq, slru, sieve, s3fifo, wtinylfu):

* ``kt-2q``: no ghost list; a hit in A1 moves the key to Am (Johnson and Shasha's A1in hit does nothing and A1out
  holds only keys' ids); A1 = round(a1 x capacity) clamped to 1..capacity-1, trimmed oldest-first, then Am.
* ``kt-slru``: protected = round(protected x capacity) clamped to 1..capacity-1; overflow demoted as Caffeine.
* ``kt-sieve``: new keys at the head; after an eviction the hand stays at the evicted key's index, which is now the
  next *older* key (libCacheSim's hand moves to the next newer one).
* ``kt-s3fifo``: S = round(small x capacity) clamped to 1..capacity-1, ghost = max(1, int(ghost x capacity)),
  counts capped at ``freq_cap`` on every hit; a ghost hit enters M with count ``move``; a key moved from S to M
  keeps its count; the queues are trimmed S first, then M, then the total.
* ``kt-wtinylfu``: window = round(window x capacity) clamped to 1..capacity-1 (default 0.1), exact counts halved
  every ``decay`` requests (no sketch), admission when the candidate's count is *greater or equal* to the victim's.

Parameters and defaults are create_residency_policy's: ``kt-2q`` a1=0.25; ``kt-slru`` protected=0.8; ``kt-s3fifo``
small=0.1, ghost=1.0, move=2, freq_cap=3; ``kt-wtinylfu`` window=0.1, protected=0.8, decay=1000. Run as tier
policies through moetier.core.policies.machine. Pure.

The tier they run in: kt-kernel's TieredWeightProvider (the same file at commit
cba709123b51915f116c144a68bc5db3b137dcd0, whose policy classes match those of the commit above; the provider is gone
from the file there, where the policies serve the MESH runtime and
``kt-kernel/scripts/compare_residency_policies.py``, which replays a trace one layer at a time, commit
39894eb7e59f179fd093d359940431fd9d3e4ae1) keeps ``policy_by_layer``: one policy per layer over that layer's expert
ids, each of capacity ``max_tier0_experts`` ids, the same in every layer (``compute_max_tier0_experts``: int(budget /
(layers x expert bytes))). ``record_activations(layer, topk_ids)`` hands the layer's policy the flattened top-k ids
minus the layer's GPU experts; ``_maybe_promote`` promotes in each layer the ids its own policy holds and demotes the
rest. (That function's docstring still says Tier0 promotes the same ids in all layers: so did the EMA hotness tracker
shared by every layer that came before these policies, e.g. RaQiu/ktransformers, commit
46c76a3acd48d40211f260e77c000ea56c8571d7; none of the named policies ran that way.) The ``ktransformers-*`` rows
(moetier.peers.rows) run this as ``ram_partition: layer`` with ``ram_share: even`` and ``ram_uses: tokens`` (every
token's ids in token order, moetier.peers.token_feed); tests/test_kt_tiers.py checks, after every layer of a simulated
run, that their policies hold what the provider's would. Where they differ, because the ledger has one RAM tier: Tier0
is the whole RAM tier (kt-kernel's other experts are mmap pages the OS caches; moetier's are on NVMe); a promotion
follows the policy at the end of the layer (kt-kernel's thread every ``promotion_interval_sec``, 5 s); the tier starts
from the warm-up seed every row shares (kt-kernel's from empty).

Array state (moetier.core.policies.queues): each machine's queues by the names below (A1 ``A1``, Am ``AM``; ``PROB``,
``PROT``; the SIEVE queue ``SQ``, oldest first, its hand ``st[HAND]`` a key or -1, the visited bits ``iv[F]``; S3-FIFO's
``S``, ``M``, the ghost queue, counts ``iv[F]``; W-TinyLFU's queues as moetier.core.policies.wtinylfu has them, the
exact counts ``iv[F]``); the sizes in ``st[S0:]``. Each ``access_*`` is a kernel (moetier.core.jit: Numba, cached).
"""
from __future__ import annotations

from moetier.core.jit import kernel

from moetier.core.policies import wtinylfu
from moetier.core.policies.queues import (CAP, F, GHOST, N, P, Q, S0, State, drop, length, pop, push, to_end,
                                          unlink)
from moetier.core.policies.spec import count, ratio, share

__all__ = ["KT2Q", "KTSLRU", "KTSieve", "KTS3FIFO", "KTWTinyLFU", "MACHINES"]


def _split(capacity: int, r: float) -> int:
    return capacity if capacity <= 1 else max(1, min(capacity - 1, int(round(capacity * r))))


# ---- kt-2q ---------------------------------------------------------------------------------------------------------
A1, AM = 0, 1
A1CAP, AMCAP = S0, S0 + 1


class KT2Q(State):
    KIND = "kt-2q"
    PARAMS = {"a1": (0.25, ratio, "a share of the tier, 0 < a1 < 1")}
    QUEUES = {"a1": A1, "am": AM}
    ORDER = (A1, AM)

    def __init__(self, capacity: int, a1: float = 0.25):
        super().__init__(capacity)
        a1cap = _split(capacity, a1)
        self.st[A1CAP], self.st[AMCAP] = a1cap, capacity - a1cap if capacity > 1 else 0


@kernel
def access_2q(iv, st, base, k):
    q = iv[Q, k - base]
    if q == AM:
        to_end(iv, st, base, k)
        return
    if q == A1:
        unlink(iv, st, base, Q, k)
        push(iv, st, base, Q, AM if st[AMCAP] > 0 else A1, k)
    else:
        push(iv, st, base, Q, A1, k)
    while length(st, A1) > st[A1CAP]:
        drop(iv, st, base, pop(iv, st, base, A1))
    while length(st, AM) > st[AMCAP]:
        drop(iv, st, base, pop(iv, st, base, AM))
    while length(st, A1) + length(st, AM) > st[CAP]:
        drop(iv, st, base, pop(iv, st, base, A1 if length(st, A1) else AM))


# ---- kt-slru -------------------------------------------------------------------------------------------------------
PROB, PROT = 0, 1
PCAP = S0


class KTSLRU(State):
    KIND = "kt-slru"
    PARAMS = {"protected": (0.8, ratio, "a share of the tier, 0 < protected < 1")}
    QUEUES = {"prob": PROB, "prot": PROT}
    ORDER = (PROB, PROT)

    def __init__(self, capacity: int, protected: float = 0.8):
        super().__init__(capacity)
        self.st[PCAP] = 0 if capacity <= 1 else _split(capacity, protected)


@kernel
def access_slru(iv, st, base, k):
    q = iv[Q, k - base]
    if q == PROT:
        to_end(iv, st, base, k)
        return
    if q == PROB:
        unlink(iv, st, base, Q, k)
        push(iv, st, base, Q, PROT if st[PCAP] > 0 else PROB, k)
    else:
        push(iv, st, base, Q, PROB, k)
    while length(st, PROT) > st[PCAP]:
        push(iv, st, base, Q, PROB, pop(iv, st, base, PROT))
    while length(st, PROB) + length(st, PROT) > st[CAP]:
        drop(iv, st, base, pop(iv, st, base, PROB))


# ---- kt-sieve: kt-kernel keeps a list, newest at index 0, and a hand index; here the queue (oldest first) and the
# hand's key, which stays on the same key when the list shifts and, where kt-kernel's index stays put after a
# removal, moves to the next older key (or, when the removed key was the oldest, the next newer one)
SQ = 0
HAND = S0


class KTSieve(State):
    KIND = "kt-sieve"
    PARAMS: dict = {}
    QUEUES = {"queue": SQ}
    ORDER = (SQ,)

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.st[HAND] = -1


@kernel
def _unhand(iv, st, base, k):
    """k leaves the queue; a hand on it moves where kt-kernel's index would then point."""
    if st[HAND] == k:
        p, n = iv[P, k - base], iv[N, k - base]
        st[HAND] = p if p >= 0 else n
    unlink(iv, st, base, Q, k)


@kernel
def discard_sieve(iv, st, base, k):
    if iv[Q, k - base] == SQ:
        _unhand(iv, st, base, k)


@kernel
def access_sieve(iv, st, base, k):
    j = k - base
    if iv[Q, j] == SQ:
        iv[F, j] = 1
        return
    if length(st, SQ) >= st[CAP]:
        if st[HAND] < 0:
            st[HAND] = st[3 * SQ]
        while True:
            x = st[HAND]
            if iv[F, x - base]:
                iv[F, x - base] = 0
                n = iv[N, x - base]            # toward the newest, wrapping to the oldest
                st[HAND] = n if n >= 0 else st[3 * SQ]
                continue
            _unhand(iv, st, base, x)
            drop(iv, st, base, x)
            break
    push(iv, st, base, Q, SQ, k)
    iv[F, j] = 0
    if st[HAND] < 0:
        st[HAND] = st[3 * SQ]


# ---- kt-s3fifo -----------------------------------------------------------------------------------------------------
S, M = 0, 1
SCAP, MCAP, GCAP, MOVE, FCAP = range(S0, S0 + 5)


class KTS3FIFO(State):
    KIND = "kt-s3fifo"
    PARAMS = {"small": (0.1, ratio, "a share of the tier, 0 < small < 1"),
              "ghost": (1.0, share, "a share of the tier, 0 to 4"),
              "move": (2, count, "a whole number of uses, at least 1"),
              "freq_cap": (3, count, "a whole number, at least 1")}
    QUEUES = {"s": S, "m": M, "g": GHOST}
    ORDER = (S, M)

    def __init__(self, capacity: int, small: float = 0.1, ghost: float = 1.0, move: float = 2,
                 freq_cap: float = 3):
        super().__init__(capacity)
        scap = _split(capacity, small)
        self.st[SCAP:FCAP + 1] = (scap, capacity - scap if capacity > 1 else 0, max(1, int(max(capacity, 1) * ghost)),
                                  int(move), int(freq_cap))


@kernel
def _to_main(iv, st, base, k, f):
    if st[MCAP] > 0:
        push(iv, st, base, Q, M, k)
        iv[F, k - base] = min(st[FCAP], max(0, f))


@kernel
def _evict_main(iv, st, base):
    while length(st, M):
        x = pop(iv, st, base, M)
        f = iv[F, x - base]
        if f >= 1:
            iv[F, x - base] = f - 1
            push(iv, st, base, Q, M, x)
            continue
        iv[F, x - base] = 0
        drop(iv, st, base, x)
        return True
    return False


@kernel
def _evict_small(iv, st, base):
    """S's oldest key to M (kt-kernel then trims again: the caller's loop goes on) or out, into the ghost queue."""
    if not length(st, S):
        return False
    x = pop(iv, st, base, S)
    f = iv[F, x - base]
    iv[F, x - base] = 0
    if f >= st[MOVE] and st[MCAP] > 0:
        _to_main(iv, st, base, x, f)
        return True
    push(iv, st, base, Q, GHOST, x)
    while length(st, GHOST) > st[GCAP]:
        pop(iv, st, base, GHOST)
    drop(iv, st, base, x)
    return True


@kernel
def access_s3fifo(iv, st, base, k):
    j = k - base
    q = iv[Q, j]
    if q == S or q == M:
        iv[F, j] = min(st[FCAP], iv[F, j] + 1)
        return
    if q == GHOST:
        unlink(iv, st, base, Q, k)
        _to_main(iv, st, base, k, st[MOVE])
    elif st[SCAP] <= 0:
        _to_main(iv, st, base, k, 0)
    else:
        push(iv, st, base, Q, S, k)
        iv[F, j] = 0
    progress = True
    while progress:
        progress = False
        if length(st, S) > st[SCAP]:
            progress = _evict_small(iv, st, base)
        elif length(st, M) > st[MCAP]:
            progress = _evict_main(iv, st, base)
        elif length(st, S) + length(st, M) > st[CAP]:
            progress = _evict_small(iv, st, base) if length(st, S) else _evict_main(iv, st, base)


# ---- kt-wtinylfu ---------------------------------------------------------------------------------------------------
DECAY, TOTAL = wtinylfu.SK, wtinylfu.SK + 1


class KTWTinyLFU(State):
    """Caffeine's queues with kt-kernel's sizes, exact counts halved every ``decay`` requests and admission on equal
    counts (a window of one key in a tier of one leaves no main: the candidate is dropped, as kt-kernel does)."""
    KIND = "kt-wtinylfu"
    PARAMS = {"window": (0.1, ratio, "a share of the tier, 0 < window < 1"),
              "protected": (0.8, ratio, "a share of main, 0 < protected < 1"),
              "decay": (1000, count, "a whole number of requests, at least 1")}
    QUEUES, ORDER = wtinylfu.WTinyLFU.QUEUES, wtinylfu.WTinyLFU.ORDER

    def __init__(self, capacity: int, window: float = 0.1, protected: float = 0.8, decay: float = 1000):
        super().__init__(capacity)
        wcap = _split(capacity, window)
        main = capacity - wcap if capacity > 1 else 0
        st = self.st
        st[wtinylfu.WCAP], st[wtinylfu.PCAP] = wcap, max(0, min(main, int(main * protected)))
        st[DECAY], st[TOTAL] = int(decay), 0


@kernel
def access_wtinylfu(iv, st, base, k):
    st[TOTAL] += 1
    iv[F, k - base] += 1
    if st[TOTAL] % st[DECAY] == 0:
        for j in range(iv.shape[1]):
            iv[F, j] //= 2
    cand = wtinylfu.hit_or_enter(iv, st, base, k)
    if cand < 0:
        return
    vict = st[3 * wtinylfu.PROB]
    wtinylfu.evict(iv, st, base, vict if iv[F, cand - base] >= iv[F, vict - base] else cand)


MACHINES = {"kt-2q": KT2Q, "kt-slru": KTSLRU, "kt-sieve": KTSieve, "kt-s3fifo": KTS3FIFO,
            "kt-wtinylfu": KTWTinyLFU}
