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
"""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies.base import _Segments
from moetier.core.policies.spec import count, ratio, share
from moetier.core.policies.wtinylfu import WTinyLFU

__all__ = ["KT2Q", "KTSLRU", "KTSieve", "KTS3FIFO", "KTWTinyLFU", "MACHINES"]


def _split(capacity: int, r: float) -> int:
    return capacity if capacity <= 1 else max(1, min(capacity - 1, int(round(capacity * r))))


class KT2Q(_Segments):
    PARAMS = {"a1": (0.25, ratio, "a share of the tier, 0 < a1 < 1")}
    _queues = ("a1", "am")

    def __init__(self, capacity: int, a1: float = 0.25):
        self.capacity = capacity
        self.a1cap = _split(capacity, a1)
        self.amcap = capacity - self.a1cap if capacity > 1 else 0
        self.a1: OrderedDict = OrderedDict()
        self.am: OrderedDict = OrderedDict()

    def access(self, k):
        if k in self.am:
            self.am.move_to_end(k)
            return ()
        if k in self.a1:
            del self.a1[k]
            (self.am if self.amcap > 0 else self.a1)[k] = None
        else:
            self.a1[k] = None
        out = []
        while len(self.a1) > self.a1cap:
            out.append(self.a1.popitem(last=False)[0])
        while len(self.am) > self.amcap:
            out.append(self.am.popitem(last=False)[0])
        while len(self) > self.capacity:
            out.append((self.a1 if self.a1 else self.am).popitem(last=False)[0])
        return out


class KTSLRU(_Segments):
    PARAMS = {"protected": (0.8, ratio, "a share of the tier, 0 < protected < 1")}
    _queues = ("prob", "prot")

    def __init__(self, capacity: int, protected: float = 0.8):
        self.capacity = capacity
        self.pcap = 0 if capacity <= 1 else _split(capacity, protected)
        self.prob: OrderedDict = OrderedDict()
        self.prot: OrderedDict = OrderedDict()

    def access(self, k):
        if k in self.prot:
            self.prot.move_to_end(k)
            return ()
        if k in self.prob:
            del self.prob[k]
            (self.prot if self.pcap > 0 else self.prob)[k] = None
        else:
            self.prob[k] = None
        while len(self.prot) > self.pcap:
            self.prob[self.prot.popitem(last=False)[0]] = None
        out = []
        while len(self) > self.capacity:
            out.append(self.prob.popitem(last=False)[0])
        return out


class KTSieve:
    PARAMS: dict = {}

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.queue: list = []                 # index 0: the newest key
        self.visited: dict = {}
        self.hand = None

    def __contains__(self, k):
        return k in self.visited

    def __len__(self):
        return len(self.queue)

    def order(self):
        return reversed(list(self.queue))

    def discard(self, k):
        if k not in self.visited:
            return
        i = self.queue.index(k)
        self.queue.pop(i)
        del self.visited[k]
        if self.hand is not None:
            if i < self.hand:
                self.hand -= 1
            self.hand = min(self.hand, len(self.queue) - 1) if self.queue else None

    def _evict(self):
        q, vis = self.queue, self.visited
        if self.hand is None or self.hand >= len(q):
            self.hand = len(q) - 1
        while True:
            x = q[self.hand]
            if vis[x]:
                vis[x] = False
                self.hand = self.hand - 1 if self.hand > 0 else len(q) - 1
                continue
            q.pop(self.hand)
            del vis[x]
            if q:
                self.hand = min(self.hand, len(q) - 1)
            else:
                self.hand = None
            return x

    def access(self, k):
        if k in self.visited:
            self.visited[k] = True
            return ()
        out = [self._evict()] if len(self.queue) >= self.capacity else []
        self.queue.insert(0, k)
        self.visited[k] = False
        if self.hand is None:
            self.hand = len(self.queue) - 1
        else:
            self.hand += 1
        return out


class KTS3FIFO(_Segments):
    PARAMS = {"small": (0.1, ratio, "a share of the tier, 0 < small < 1"),
              "ghost": (1.0, share, "a share of the tier, 0 to 4"),
              "move": (2, count, "a whole number of uses, at least 1"),
              "freq_cap": (3, count, "a whole number, at least 1")}
    _queues = ("s", "m")

    def __init__(self, capacity: int, small: float = 0.1, ghost: float = 1.0, move: float = 2,
                 freq_cap: float = 3):
        self.capacity = capacity
        self.scap = _split(capacity, small)
        self.mcap = capacity - self.scap if capacity > 1 else 0
        self.gcap = max(1, int(max(capacity, 1) * ghost))
        self.move, self.fcap = int(move), int(freq_cap)
        self.s: OrderedDict = OrderedDict()
        self.m: OrderedDict = OrderedDict()
        self.g: OrderedDict = OrderedDict()
        self.freq: dict = {}

    def discard(self, k):
        super().discard(k)
        self.freq.pop(k, None)

    def _to_main(self, k, f):
        if self.mcap > 0:
            self.m[k] = None
            self.freq[k] = min(self.fcap, max(0, int(f)))

    def _evict_main(self, out):
        while self.m:
            x = self.m.popitem(last=False)[0]
            f = self.freq.get(x, 0)
            if f >= 1:
                self.freq[x] = f - 1
                self.m[x] = None
                continue
            self.freq.pop(x, None)
            out.append(x)
            return True
        return False

    def _evict_small(self, out):
        if not self.s:
            return False
        x = self.s.popitem(last=False)[0]
        f = self.freq.pop(x, 0)
        if f >= self.move and self.mcap > 0:
            self._to_main(x, f)
            return self._trim(out)
        self.g.pop(x, None)
        self.g[x] = None
        while len(self.g) > self.gcap:
            self.g.popitem(last=False)
        out.append(x)
        return True

    def _trim(self, out):
        progress = True
        while progress:
            progress = False
            if len(self.s) > self.scap:
                progress = self._evict_small(out)
            elif len(self.m) > self.mcap:
                progress = self._evict_main(out)
            elif len(self) > self.capacity:
                progress = self._evict_small(out) if self.s else self._evict_main(out)
        return len(self.s) <= self.scap and len(self.m) <= self.mcap and len(self) <= self.capacity

    def access(self, k):
        if k in self.s or k in self.m:
            self.freq[k] = min(self.fcap, self.freq.get(k, 0) + 1)
            return ()
        if k in self.g:
            del self.g[k]
            self._to_main(k, self.move)
        elif self.scap <= 0:
            self._to_main(k, 0)
        else:
            self.s[k] = None
            self.freq[k] = 0
        out: list = []
        self._trim(out)
        return out


class KTWTinyLFU(WTinyLFU):
    """Caffeine's queues with kt-kernel's sizes, exact counts halved every ``decay`` requests and admission on equal
    counts (a window of one key in a tier of one leaves no main: the candidate is dropped, as kt-kernel does)."""
    PARAMS = {"window": (0.1, ratio, "a share of the tier, 0 < window < 1"),
              "protected": (0.8, ratio, "a share of main, 0 < protected < 1"),
              "decay": (1000, count, "a whole number of requests, at least 1")}

    def __init__(self, capacity: int, window: float = 0.1, protected: float = 0.8, decay: float = 1000):
        self.capacity = capacity
        self.wcap = _split(capacity, window)
        main = capacity - self.wcap if capacity > 1 else 0
        self.pcap = max(0, min(main, int(main * protected)))
        self.decay = int(decay)
        self.win: OrderedDict = OrderedDict()
        self.prob: OrderedDict = OrderedDict()
        self.prot: OrderedDict = OrderedDict()
        self.freq: dict = {}
        self.total = 0

    def _record(self, k):
        self.total += 1
        self.freq[k] = self.freq.get(k, 0) + 1
        if self.total % self.decay == 0:
            self.freq = {x: c // 2 for x, c in self.freq.items() if c // 2 > 0}

    def _admit(self, cand, vict) -> bool:
        return self.freq.get(cand, 0) >= self.freq.get(vict, 0)


MACHINES = {"kt-2q": KT2Q, "kt-slru": KTSLRU, "kt-sieve": KTSieve, "kt-s3fifo": KTS3FIFO,
            "kt-wtinylfu": KTWTinyLFU}
