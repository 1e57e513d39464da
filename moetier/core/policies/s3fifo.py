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
"""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies.base import _Segments
from moetier.core.policies.spec import count, ratio, share

__all__ = ["S3FIFO", "PARAMS"]

PARAMS = {"small": (0.1, ratio, "a share of the tier, 0 < small < 1"),
          "ghost": (0.9, share, "a share of the tier, 0 to 4"),
          "move": (2, count, "a whole number of uses, at least 1")}


class S3FIFO(_Segments):
    _queues = ("s", "m")

    def __init__(self, capacity: int, small: float = 0.1, ghost: float = 0.9, move: float = 2):
        self.capacity = capacity
        self.scap = max(1, int(capacity * small))
        self.mcap = capacity - self.scap
        self.gcap = int(capacity * ghost)
        self.move = int(move)
        self.s: OrderedDict = OrderedDict()      # oldest first
        self.m: OrderedDict = OrderedDict()
        self.g: OrderedDict = OrderedDict()
        self.freq: dict = {}
        self.evicted = False

    def discard(self, k):
        super().discard(k)
        self.freq.pop(k, None)

    def _evict_small(self):
        s, freq = self.s, self.freq
        while s:
            x = s.popitem(last=False)[0]
            if freq[x] >= self.move:
                self.m[x] = None
                freq[x] = 0
                continue
            del freq[x]
            if self.gcap:
                self.g[x] = None
                if len(self.g) > self.gcap:
                    self.g.popitem(last=False)
            return x
        return None

    def _evict_main(self):
        m, freq = self.m, self.freq
        while m:
            x = m.popitem(last=False)[0]
            f = freq[x]
            if f >= 1:
                m[x] = None
                freq[x] = min(f, 3) - 1
                continue
            del freq[x]
            return x
        return None

    def access(self, k):
        if k in self.s or k in self.m:
            self.freq[k] += 1
            return ()
        ghost_hit = self.g.pop(k, 0) is None
        out = []
        while len(self.s) + len(self.m) >= self.capacity:
            self.evicted = True
            x = self._evict_main() if len(self.m) > self.mcap or not self.s else self._evict_small()
            if x is not None:
                out.append(x)
        if ghost_hit or (not self.evicted and len(self.s) >= self.scap):
            self.m[k] = None
        else:
            self.s[k] = None
        self.freq[k] = 0
        return out
