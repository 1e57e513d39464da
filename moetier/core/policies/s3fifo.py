"""S3-FIFO (Yang et al., SOSP 2023) as libCacheSim's S3FIFO.c runs it, on a tier of equal-sized slots.

Small FIFO S of int(small x capacity) slots (at least one, below), main FIFO M of the rest, ghost FIFO G of
int(ghost x capacity) keys; each resident key has a use count (set to 0 when it enters S or M, raised by every hit).
A miss looks the key up (and removes it) in G before anything is reclaimed. To free a slot: when M holds more than
its share or S is empty, M's oldest key with a count above 0 goes back to M's newest end with min(count, 3) - 1, the
first one at 0 is evicted; otherwise S's oldest keys whose count reached ``move`` go to M (count 0) until one that did
not leaves S for G. The key then enters M if it was in G, else S, except that until the first eviction a key meeting
a full S enters M. Parameters (libCacheSim's small-size-ratio, ghost-size-ratio, move-to-main-threshold): ``small``
(default 0.1), ``ghost`` (default 0.9), ``move`` (default 2). Where it differs: libCacheSim sizes S by bytes and
refuses an object as large as S (with unit-sized slots and S of one slot, or below ten slots where S rounds to
none, it would admit nothing but ghost hits); here S holds at least one key and takes it. Run as a tier policy
through moetier.core.policies.machine. Pure.

Array state (moetier.core.policies.queues): S and M are queues ``S`` and ``M``, G the ghost queue, a key's count
``iv[F]``; ``st[SCAP]``, ``st[MCAP]``, ``st[GCAP]``, ``st[MOVE]`` the parameters, ``st[EVICTED]`` 1 after the first
eviction. ``access`` is a kernel (moetier.core.jit).
"""
from __future__ import annotations

from moetier.core.jit import kernel

from moetier.core.policies.queues import CAP, F, GHOST, Q, S0, State, drop, length, pop, push, unlink
from moetier.core.policies.spec import count, ratio, share

__all__ = ["S3FIFO", "PARAMS", "access"]

PARAMS = {"small": (0.1, ratio, "a share of the tier, 0 < small < 1"),
          "ghost": (0.9, share, "a share of the tier, 0 to 4"),
          "move": (2, count, "a whole number of uses, at least 1")}
S, M = 0, 1
SCAP, MCAP, GCAP, MOVE, EVICTED = range(S0, S0 + 5)


class S3FIFO(State):
    KIND = "s3fifo"
    QUEUES = {"s": S, "m": M, "g": GHOST}
    ORDER = (S, M)

    def __init__(self, capacity: int, small: float = 0.1, ghost: float = 0.9, move: float = 2):
        super().__init__(capacity)
        scap = max(1, int(capacity * small))
        self.st[SCAP:EVICTED + 1] = (scap, capacity - scap, int(capacity * ghost), int(move), 0)


@kernel
def _evict_small(iv, st, base):
    while length(st, S):
        x = pop(iv, st, base, S)
        if iv[F, x - base] >= st[MOVE]:
            push(iv, st, base, Q, M, x)
            iv[F, x - base] = 0
            continue
        if st[GCAP]:
            push(iv, st, base, Q, GHOST, x)
            if length(st, GHOST) > st[GCAP]:
                pop(iv, st, base, GHOST)
        return x
    return -1


@kernel
def _evict_main(iv, st, base):
    while length(st, M):
        x = pop(iv, st, base, M)
        f = iv[F, x - base]
        if f >= 1:
            push(iv, st, base, Q, M, x)
            iv[F, x - base] = min(f, 3) - 1
            continue
        return x
    return -1


@kernel
def access(iv, st, base, k):
    j = k - base
    q = iv[Q, j]
    if q == S or q == M:
        iv[F, j] += 1
        return
    ghost_hit = q == GHOST
    if ghost_hit:
        unlink(iv, st, base, Q, k)
    while length(st, S) + length(st, M) >= st[CAP]:
        st[EVICTED] = 1
        if length(st, M) > st[MCAP] or not length(st, S):
            x = _evict_main(iv, st, base)
        else:
            x = _evict_small(iv, st, base)
        if x >= 0:
            drop(iv, st, base, x)
    if ghost_hit or (not st[EVICTED] and length(st, S) >= st[SCAP]):
        push(iv, st, base, Q, M, k)
    else:
        push(iv, st, base, Q, S, k)
    iv[F, j] = 0
