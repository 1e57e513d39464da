"""W-TinyLFU (Einziger, Friedman and Manes, ACM TOS 2017) as Caffeine's simulator runs it (WindowTinyLfuPolicy).

A window LRU of capacity - int((1 - window) x capacity) slots in front of a main SLRU (probation, and protected of
int(protected x main) slots); a frequency sketch (moetier.core.policies.sketch) records every request. A miss enters
the window's most recent end; when the window then holds more than its share, its least recent key (the candidate)
moves to probation's most recent end, and when the tier then holds more than its capacity, the candidate stays only
if its estimated frequency is strictly greater than that of probation's least recent key (the victim), which is
evicted instead; otherwise the candidate is. While the tier warms the window fills first and its overflow fills main,
as in Caffeine (nothing waits for the tier to be full). A hit in the window or protected moves the key to its most
recent end; a hit in probation moves it to protected, whose least recent key is demoted to probation when protected
is over its share. Parameters (Caffeine's percent-main, percent-main-protected, the sketch's sample multiplier and
doorkeeper): ``window`` (default 0.01), ``protected`` (0.8), ``sample`` (10), ``doorkeeper`` (0 or 1, default 0).
Run as a tier policy through moetier.core.policies.machine. Pure.
"""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies.base import _Segments
from moetier.core.policies.sketch import Sketch
from moetier.core.policies.spec import count, flag, ratio

__all__ = ["WTinyLFU", "PARAMS"]

PARAMS = {"window": (0.01, ratio, "a share of the tier, 0 < window < 1"),
          "protected": (0.8, ratio, "a share of main, 0 < protected < 1"),
          "sample": (10, count, "a whole multiple of the capacity, at least 1"),
          "doorkeeper": (0, flag, "0 or 1")}


class WTinyLFU(_Segments):
    _queues = ("prob", "win", "prot")        # order(): probation first, as Caffeine evicts

    def __init__(self, capacity: int, window: float = 0.01, protected: float = 0.8, sample: float = 10,
                 doorkeeper: float = 0):
        self.capacity = capacity
        self.wcap = capacity - int((1.0 - window) * capacity)
        main = capacity - self.wcap
        self.pcap = int(protected * main)
        self.win: OrderedDict = OrderedDict()
        self.prob: OrderedDict = OrderedDict()
        self.prot: OrderedDict = OrderedDict()
        self.sketch = Sketch(capacity, sample, bool(doorkeeper))

    def _record(self, k):
        self.sketch.add(k)

    def _admit(self, cand, vict) -> bool:
        """TinyLFU: the candidate enters main only with a strictly greater estimate."""
        est = self.sketch.estimate
        return est(cand) > est(vict)

    def access(self, k):
        self._record(k)
        if k in self.win:
            self.win.move_to_end(k)
            return ()
        if k in self.prot:
            self.prot.move_to_end(k)
            return ()
        if k in self.prob:
            del self.prob[k]
            self.prot[k] = None
            if len(self.prot) > self.pcap:
                self.prob[self.prot.popitem(last=False)[0]] = None
            return ()
        self.win[k] = None
        if len(self.win) <= self.wcap:
            return ()
        cand = self.win.popitem(last=False)[0]
        self.prob[cand] = None
        if len(self) <= self.capacity:
            return ()
        vict = next(iter(self.prob))
        out = vict if self._admit(cand, vict) else cand
        del self.prob[out]
        return [out]
