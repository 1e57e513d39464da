"""Segmented LRU (Karedla et al. 1994) as Caffeine's simulator runs it (SegmentedLruPolicy, no admission filter).

Probation and protected LRU segments; protected holds at most int(protected x capacity) keys. A miss enters
probation's most recent end and, when the tier is full, probation's least recent key is evicted. A hit in probation
moves the key to protected (protected's least recent key is demoted to probation's most recent end first when
protected is full); a hit in protected moves it to the most recent end. Parameter: ``protected`` (default 0.8, 0 <
protected < 1). Where it differs: with no protected slots (int(protected x capacity) = 0) this is an LRU (a
probation hit moves the key to probation's most recent end), where Caffeine's state check fails on the first
probation hit. Run as a tier policy through moetier.core.policies.machine. Pure.
"""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies.base import _Segments
from moetier.core.policies.spec import ratio

__all__ = ["SLRU", "PARAMS"]

PARAMS = {"protected": (0.8, ratio, "a share of the tier, 0 < protected < 1")}


class SLRU(_Segments):
    _queues = ("prob", "prot")

    def __init__(self, capacity: int, protected: float = 0.8):
        self.capacity = capacity
        self.pcap = int(capacity * protected)
        self.prob: OrderedDict = OrderedDict()
        self.prot: OrderedDict = OrderedDict()

    def access(self, k):
        if k in self.prot:
            self.prot.move_to_end(k)
            return ()
        if k in self.prob:
            if not self.pcap:
                self.prob.move_to_end(k)
                return ()
            if len(self.prot) >= self.pcap:
                self.prob[self.prot.popitem(last=False)[0]] = None
            del self.prob[k]
            self.prot[k] = None
            return ()
        out = []
        if len(self) >= self.capacity:
            src = self.prob if self.prob else self.prot
            out.append(src.popitem(last=False)[0])
        self.prob[k] = None
        return out
