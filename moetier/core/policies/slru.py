"""Segmented LRU (Karedla et al. 1994) as Caffeine's simulator runs it (SegmentedLruPolicy, no admission filter).

Probation and protected LRU segments; protected holds at most int(protected x capacity) keys. A miss enters
probation's most recent end and, when the tier is full, probation's least recent key is evicted. A hit in probation
moves the key to protected (protected's least recent key is demoted to probation's most recent end first when
protected is full); a hit in protected moves it to the most recent end. Parameter: ``protected`` (default 0.8, 0 <
protected < 1). Where it differs: with no protected slots (int(protected x capacity) = 0) this is an LRU (a
probation hit moves the key to probation's most recent end), where Caffeine's state check fails on the first
probation hit. Run as a tier policy through moetier.core.policies.machine. Pure.

Array state (moetier.core.policies.queues): queues ``PROB`` and ``PROT``, ``st[PCAP]`` protected's size. ``access``
is a kernel (moetier.core.jit).
"""
from __future__ import annotations

from moetier.core.jit import kernel

from moetier.core.policies.queues import CAP, Q, S0, State, drop, length, pop, push, to_end, unlink
from moetier.core.policies.spec import ratio

__all__ = ["SLRU", "PARAMS", "access"]

PARAMS = {"protected": (0.8, ratio, "a share of the tier, 0 < protected < 1")}
PROB, PROT = 0, 1
PCAP = S0


class SLRU(State):
    KIND = "slru"
    QUEUES = {"prob": PROB, "prot": PROT}
    ORDER = (PROB, PROT)

    def __init__(self, capacity: int, protected: float = 0.8):
        super().__init__(capacity)
        self.st[PCAP] = int(capacity * protected)


@kernel
def access(iv, st, base, k):
    q = iv[Q, k - base]
    if q == PROT:
        to_end(iv, st, base, k)
        return
    if q == PROB:
        if not st[PCAP]:
            to_end(iv, st, base, k)
            return
        if length(st, PROT) >= st[PCAP]:
            push(iv, st, base, Q, PROB, pop(iv, st, base, PROT))
        unlink(iv, st, base, Q, k)
        push(iv, st, base, Q, PROT, k)
        return
    if length(st, PROB) + length(st, PROT) >= st[CAP]:
        drop(iv, st, base, pop(iv, st, base, PROB if length(st, PROB) else PROT))
    push(iv, st, base, Q, PROB, k)
