"""The scan-resistant tier replacement policies: 2Q, SLRU, SIEVE, S3-FIFO and W-TinyLFU (the residency policies
KTransformers ships), each over the interface of moetier.core.policies.residency (insert, hit, remove, victim).
Built by name through ``residency.make``; the algorithms and their sizes are in residency's docstring. Pure."""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies.base import _first, _Queues, _remember

__all__ = ["TwoQ", "SLRU", "Sieve", "S3FIFO", "WTinyLFU"]


class TwoQ(_Queues):
    name = "2q"
    _queues = ("a1in", "am")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.kin = max(1, capacity // 4)
        self.kout = max(1, capacity // 2)
        self.a1in: OrderedDict = OrderedDict()
        self.a1out: OrderedDict = OrderedDict()
        self.am: OrderedDict = OrderedDict()

    def insert(self, k):
        if k in self.a1out:
            del self.a1out[k]
            self.am[k] = None
        else:
            self.a1in[k] = None

    def hit(self, k):
        if k in self.am:
            self.am.move_to_end(k)

    def remove(self, k):
        self.a1in.pop(k, None)
        self.am.pop(k, None)

    def victim(self, k, ok):
        if len(self.a1in) > self.kin or not self.am:
            v = _first(self.a1in, ok)
            if v is not None:
                _remember(self.a1out, v, self.kout)
                return v
        v = _first(self.am, ok)
        return v if v is not None else _first(self.a1in, ok)



class SLRU(_Queues):
    name = "slru"
    _queues = ("prob", "prot")

    def __init__(self, capacity: int, protected: float = 0.8):
        self.capacity = capacity
        self.pcap = max(1, int(capacity * protected)) if capacity > 1 else 0
        self.prob: OrderedDict = OrderedDict()
        self.prot: OrderedDict = OrderedDict()

    def insert(self, k):
        self.prob[k] = None

    def hit(self, k):
        if k in self.prot:
            self.prot.move_to_end(k)
            return
        if k in self.prob and self.pcap:
            del self.prob[k]
            self.prot[k] = None
            if len(self.prot) > self.pcap:               # demote the protected segment's LRU to probation
                d, _ = self.prot.popitem(last=False)
                self.prob[d] = None

    def remove(self, k):
        self.prob.pop(k, None)
        self.prot.pop(k, None)

    def victim(self, k, ok):
        v = _first(self.prob, ok)
        return v if v is not None else _first(self.prot, ok)



class Sieve(_Queues):
    """FIFO order with a visited bit; the hand walks from the oldest key toward the newest (wrapping), clearing
    bits, evicts the first unvisited key and stays at the next newer one. Pinned keys are passed over as they are."""
    name = "sieve"
    _queues = ("visited",)

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.visited: dict = {}
        self.older: dict = {}
        self.newer: dict = {}
        self.head = self.tail = self.hand = None     # head: newest, tail: oldest

    def insert(self, k):
        self.visited[k] = 0
        self.older[k], self.newer[k] = self.head, None
        if self.head is not None:
            self.newer[self.head] = k
        self.head = k
        if self.tail is None:
            self.tail = k

    def hit(self, k):
        self.visited[k] = 1

    def remove(self, k):
        if k not in self.visited:
            return
        o, n = self.older.pop(k), self.newer.pop(k)
        del self.visited[k]
        if self.hand == k:
            self.hand = n
        if o is not None:
            self.newer[o] = n
        else:
            self.tail = n
        if n is not None:
            self.older[n] = o
        else:
            self.head = o

    def victim(self, k, ok):
        vis, newer = self.visited, self.newer
        x = self.hand if self.hand is not None else self.tail
        for _ in range(2 * len(vis) + 1):
            if x is None:
                return None
            if ok(x):
                if not vis[x]:
                    self.hand = newer[x]
                    return x
                vis[x] = 0
            x = newer[x] if newer[x] is not None else self.tail
        return None



class S3FIFO(_Queues):
    name = "s3fifo"
    _queues = ("s", "m")

    def __init__(self, capacity: int, small: float = 0.1):
        self.capacity = capacity
        self.scap = max(1, int(round(capacity * small)))
        self.s: OrderedDict = OrderedDict()      # oldest first
        self.m: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()
        self.freq: dict = {}

    def insert(self, k):
        self.freq[k] = 0
        if k in self.ghost:
            del self.ghost[k]
            self.m[k] = None
        else:
            self.s[k] = None

    def hit(self, k):
        self.freq[k] = min(3, self.freq.get(k, 0) + 1)

    def remove(self, k):
        self.s.pop(k, None)
        self.m.pop(k, None)
        self.freq.pop(k, None)

    def _evict_m(self, ok):
        m, freq = self.m, self.freq
        for _ in range(4 * len(m) + 1):          # each pass lowers a count: ends within 4 rounds
            x = _first(m, ok)
            if x is None:
                return None
            if freq.get(x, 0) > 0:
                freq[x] -= 1
                m.move_to_end(x)
                continue
            return x
        return None

    def victim(self, k, ok):
        s, freq = self.s, self.freq
        while len(s) >= self.scap or (s and not self.m):
            x = _first(s, ok)
            if x is None:
                break
            if freq.get(x, 0) >= 1:          # used again while in the small queue: on to main
                del s[x]
                freq[x] = 0
                self.m[x] = None
                continue
            _remember(self.ghost, x, max(1, self.capacity - self.scap))
            return x
        v = self._evict_m(ok)
        return v if v is not None else _first(s, ok)



class WTinyLFU(_Queues):
    name = "wtinylfu"
    _queues = ("win", "main")

    def __init__(self, capacity: int, window: float = 0.01):
        self.capacity = capacity
        self.wcap = max(1, int(round(capacity * window)))
        self.win: OrderedDict = OrderedDict()
        self.main = SLRU(max(1, capacity - self.wcap))
        self.counts: dict = {}
        self.uses, self.sample = 0, 10 * max(1, capacity)

    def _count(self, k):
        self.counts[k] = self.counts.get(k, 0) + 1
        self.uses += 1
        if self.uses >= self.sample:                 # the sketch's reset: halve every count
            self.counts = {x: c // 2 for x, c in self.counts.items() if c > 1}
            self.uses //= 2

    def insert(self, k):
        self._count(k)
        self.win[k] = None

    def hit(self, k):
        self._count(k)
        if k in self.win:
            self.win.move_to_end(k)
        else:
            self.main.hit(k)

    def remove(self, k):
        self.win.pop(k, None)
        self.main.remove(k)

    def victim(self, k, ok):
        main = self.main
        while len(self.win) >= self.wcap:
            cand = _first(self.win, ok)
            if cand is None:
                break
            if len(main) < main.capacity:            # main has room: the window's LRU moves over
                del self.win[cand]
                main.insert(cand)
                continue
            mv = main.victim(cand, ok)
            if mv is None:
                return cand
            if self.counts.get(cand, 0) > self.counts.get(mv, 0):   # TinyLFU admission
                del self.win[cand]
                main.remove(mv)
                main.insert(cand)
                return mv
            return cand
        v = main.victim(k, ok)
        return v if v is not None else _first(self.win, ok)
