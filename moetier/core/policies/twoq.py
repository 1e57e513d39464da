"""2Q, the full version (Johnson and Shasha, VLDB 1994), as libCacheSim's TwoQ.c runs it.

A1in: FIFO of keys seen once, Kin = int(a1 x capacity) slots' worth; A1out: ghost FIFO of keys evicted from A1in,
Kout = int(ghost x capacity) keys; Am: LRU of the rest. A request for a key in Am moves it to Am's most recent end;
in A1in does nothing; otherwise the key is looked up (and removed) in A1out *before* any space is reclaimed, then,
when the tier is full, A1in's oldest key is evicted into A1out if A1in holds more than Kin keys, else Am's least
recent; the key then enters Am if it was in A1out, else A1in. Parameters (libCacheSim's Ain-size-ratio and
Aout-size-ratio): ``a1`` (default 0.25, 0 < a1 < 1) and ``ghost`` (default 0.5, 0..4). Run as a tier policy through
moetier.core.policies.machine. Pure.
"""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies.base import _Segments
from moetier.core.policies.spec import ratio, share

__all__ = ["TwoQ", "PARAMS"]

PARAMS = {"a1": (0.25, ratio, "a share of the tier, 0 < a1 < 1"),
          "ghost": (0.5, share, "a share of the tier, 0 to 4")}


class TwoQ(_Segments):
    _queues = ("a1in", "am")

    def __init__(self, capacity: int, a1: float = 0.25, ghost: float = 0.5):
        self.capacity = capacity
        self.kin = int(capacity * a1)
        self.kout = int(capacity * ghost)
        self.a1in: OrderedDict = OrderedDict()
        self.a1out: OrderedDict = OrderedDict()
        self.am: OrderedDict = OrderedDict()

    def order(self):
        yield from self.a1in if len(self.a1in) > self.kin else ()
        yield from self.am
        yield from self.a1in if len(self.a1in) <= self.kin else ()

    def access(self, k):
        if k in self.am:
            self.am.move_to_end(k)
            return ()
        if k in self.a1in:
            return ()
        ghost_hit = self.a1out.pop(k, 0) is None
        out = []
        if len(self.a1in) + len(self.am) >= self.capacity:
            if len(self.a1in) > self.kin:
                y = self.a1in.popitem(last=False)[0]
                if self.kout:
                    self.a1out[y] = None
                    if len(self.a1out) > self.kout:
                        self.a1out.popitem(last=False)
                out.append(y)
            elif self.am:
                out.append(self.am.popitem(last=False)[0])
        (self.am if ghost_hit else self.a1in)[k] = None
        return out
