"""Replacement policies for one tier of expert slots (RAM or VRAM), pure and slot-count bound.

Contract
--------
A policy tracks which keys hold the tier's ``capacity`` slots and, when the tier is full, names the key to evict.
The tier (moetier.core.ledger.Ledger, or ``replay`` below) owns residency; the policy only orders:

    insert(k)            k became resident (the tier has a free slot for it)
    hit(k)               resident k was used again
    remove(k)            k left the tier (moved to another tier, or evicted after ``victim`` named it)
    victim(k, ok) -> key the resident key to evict so that incoming ``k`` can be kept, among keys with ``ok(key)``
                         true (the tier's pins: the layer's picks, keys mid-transfer); ``k`` itself when the policy
                         would rather not keep ``k`` (admission refused: Belady's bypass, W-TinyLFU's filter); None
                         when every resident key is pinned. ``victim`` may move keys between the policy's own
                         queues (S3-FIFO, 2Q, W-TinyLFU) and remembers evicted keys in its ghost lists; the caller
                         then calls ``remove`` on the key it returned (unless it returned ``k``).

Policies: ``lru``, ``fifo``, ``lfu`` (pick counts that outlive eviction, ties to the least recent), ``dlfu`` (counts
decayed by a half-life in uses of the tier: activation-aware, MoE-Infinity / HybriMoE style), ``2q`` (Johnson and
Shasha: A1in FIFO of 25%, A1out ghost of 50%, Am LRU), ``slru`` (20% probation, 80% protected), ``sieve`` (Zhang et
al. 2024: FIFO with a visited bit and a hand), ``s3fifo`` (Yang et al. 2023: small FIFO of 10%, main FIFO, ghost as
large as main, 2-bit counts; an object leaves the small queue for main when it was used at least once there),
``wtinylfu`` (Caffeine: 1% LRU window, SLRU main, admission by frequency with counts halved every 10 x capacity
uses; exact counts instead of a count-min sketch) and ``belady`` (the future known: evict the key used farthest
ahead, bypass the incoming key when it is that key; ``BeladyPolicy.now`` is set by the caller).

``make(spec, capacity, future=None)`` builds one from a name; ``partitioned(...)`` splits a tier into per-layer
parts (each layer ``capacity // layers`` slots, the remainder to the first layers) with a policy each. ``replay(pol,
seq)`` runs a stand-alone cache over an access sequence (hits), the known-answer harness of the tests.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import OrderedDict

__all__ = ["make", "partitioned", "replay", "POLICIES", "BeladyPolicy", "Partitioned"]


class _Queues:
    """Membership and size over the policy's queues (the attributes named in ``_queues``)."""
    _queues: tuple = ()

    def __contains__(self, k):
        return any(k in getattr(self, q) for q in self._queues)

    def __len__(self):
        return sum(len(getattr(self, q)) for q in self._queues)


def _remember(ghost: OrderedDict, k, cap: int) -> None:
    """Put an evicted key in a ghost list of at most ``cap`` keys (oldest forgotten first)."""
    ghost[k] = None
    while len(ghost) > cap:
        ghost.popitem(last=False)


class _Heaped(_Queues):
    """Resident keys (``res``: key -> its order) popped from a lazily invalidated heap of (order..., key)."""
    _queues = ("res",)

    def remove(self, k):
        self.res.pop(k, None)

    def _top(self, ok):
        """The first resident key in heap order with ok(key), left in the heap; stale entries are dropped."""
        heap, skipped, out = self.heap, [], None
        while heap:
            e = heapq.heappop(heap)
            if self._stale(e):            # (Belady's refresh pushes the key's new entry)
                continue
            skipped.append(e)
            if ok(e[-1]):
                out = e[-1]
                break
        for e in skipped:
            heapq.heappush(self.heap, e)
        if len(self.heap) > 4 * len(self.res) + 64:
            self.heap = [self._entry(x) for x in self.res]
            heapq.heapify(self.heap)
        return out


def _first(order, ok):
    for k in order:
        if ok(k):
            return k
    return None


class LRU(_Queues):
    name = "lru"
    _queues = ("q",)

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.q: OrderedDict = OrderedDict()

    def insert(self, k):
        self.q[k] = None

    def hit(self, k):
        self.q.move_to_end(k)

    def remove(self, k):
        self.q.pop(k, None)

    def victim(self, k, ok):
        return _first(self.q, ok)



class FIFO(LRU):
    name = "fifo"

    def hit(self, k):
        pass


class LFU(_Heaped):
    """Least frequently used; counts survive eviction (a key's history follows it), ties to the least recent use.
    ``halflife`` > 0 decays counts by uses of the tier (dlfu)."""
    name = "lfu"

    def __init__(self, capacity: int, halflife: float = 0.0):
        self.capacity, self.halflife = capacity, float(halflife)
        self.freq: dict = {}
        self.res: dict = {}           # resident key -> its heap entry (score, tick)
        self.heap: list = []
        self.tick = 0
        self.name = "dlfu" if self.halflife > 0 else "lfu"

    def _score(self, k):
        # decay as a growing weight (2^(tick/halflife)) instead of shrinking every count: same order, O(1)
        w = 2.0 ** (self.tick / self.halflife) if self.halflife > 0 else 1.0
        self.freq[k] = self.freq.get(k, 0.0) + w
        if self.halflife > 0 and w > 1e200:          # renormalise before the weights overflow
            self.freq = {x: v / w for x, v in self.freq.items()}
            self.tick = 0
            self.heap = [(self.freq[x], t, x) for x, (_, t) in self.res.items()]
            self.res = {x: (self.freq[x], t) for x, (_, t) in self.res.items()}
            heapq.heapify(self.heap)
        e = (self.freq[k], self.tick)
        self.tick += 1
        return e

    def _touch(self, k):
        e = self._score(k)
        self.res[k] = e
        heapq.heappush(self.heap, (e[0], e[1], k))

    insert = hit = _touch

    def _entry(self, x):
        return self.res[x] + (x,)

    def _stale(self, e):
        return self.res.get(e[2]) != e[:2]

    def victim(self, k, ok):
        return self._top(ok)



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



class BeladyPolicy(_Heaped):
    """Belady's MIN with the future known. ``future``: key -> sorted positions of its uses; ``now``: the position
    being served (the caller advances it). A key never used again is evicted first; the incoming key is bypassed
    when no resident key is needed later than it."""
    name = "belady"

    def __init__(self, capacity: int, future: dict):
        self.capacity, self.future = capacity, future
        self.now = -1
        self.res: dict = {}
        self.heap: list = []

    def next_use(self, k) -> float:
        u = self.future.get(k)
        if not u:
            return float("inf")
        i = bisect_right(u, self.now)
        return u[i] if i < len(u) else float("inf")

    def _touch(self, k):
        n = self.next_use(k)
        self.res[k] = n
        heapq.heappush(self.heap, (-n, k))

    insert = hit = _touch

    def _entry(self, x):
        return (-self.res[x], x)

    def _stale(self, e):
        x, res = e[1], self.res
        if x not in res or res[x] != -e[0]:
            return True
        if res[x] <= self.now:            # used since its entry without a hit (another tier computed it): refresh
            self._touch(x)
            return True
        return False

    def victim(self, k, ok):
        out = self._top(ok)
        if out is not None and k is not None and self.next_use(k) >= self.res[out]:
            return k
        return out



POLICIES = {"lru": LRU, "fifo": FIFO, "lfu": LFU, "dlfu": None, "2q": TwoQ, "slru": SLRU, "sieve": Sieve,
            "s3fifo": S3FIFO, "wtinylfu": WTinyLFU, "belady": BeladyPolicy}


def make(spec: str, capacity: int, future: dict | None = None):
    """A policy from its name (``dlfu:HALFLIFE`` for decayed LFU; default half-life 4 x capacity uses)."""
    name, _, arg = str(spec).partition(":")
    if name not in POLICIES:
        raise ValueError(f"residency policy: expected one of {sorted(POLICIES)}, got {spec!r}")
    if name == "belady":
        if future is None:
            raise ValueError("residency policy 'belady' needs the future (an oracle bound only)")
        return BeladyPolicy(capacity, future)
    if name == "dlfu":
        return LFU(capacity, float(arg) if arg else 4.0 * max(1, capacity))
    return POLICIES[name](capacity)


class Partitioned(_Queues):
    """One policy per layer: a key of layer l = key // experts competes only with its own layer's keys; each part
    holds ``capacity // layers`` slots (the first ``capacity % layers`` layers one more)."""
    name = "partitioned"

    def __init__(self, spec: str, capacity: int, layers: int, experts: int, future: dict | None = None):
        base, extra = divmod(capacity, layers)
        self.experts, self.capacity = experts, capacity
        self.caps = [base + (1 if l < extra else 0) for l in range(layers)]
        self.parts = [make(spec, max(1, c), future) for c in self.caps]
        self.name = f"{self.parts[0].name}/layer"

    def part(self, k):
        return self.parts[k // self.experts]

    def insert(self, k):
        self.part(k).insert(k)

    def hit(self, k):
        self.part(k).hit(k)

    def remove(self, k):
        self.part(k).remove(k)

    def full(self, k) -> bool:
        """The incoming key's layer has used its share of slots."""
        return len(self.part(k)) >= self.caps[k // self.experts]

    def victim(self, k, ok):
        return self.part(k).victim(k, ok)

    def __contains__(self, k):
        return k in self.part(k)

    def __len__(self):
        return sum(len(p) for p in self.parts)



def partitioned(spec: str, capacity: int, layers: int, experts: int, future: dict | None = None) -> Partitioned:
    return Partitioned(spec, capacity, layers, experts, future)


def replay(pol, seq, capacity: int | None = None) -> int:
    """Hits of a stand-alone cache run by ``pol`` over the access sequence ``seq`` (no pins). A Belady policy's
    ``now`` follows the position."""
    cap = pol.capacity if capacity is None else capacity
    hits = 0
    always = (lambda _k: True)
    part = isinstance(pol, Partitioned)
    for i, k in enumerate(seq):
        if isinstance(pol, BeladyPolicy):
            pol.now = i
        elif part and isinstance(pol.parts[0], BeladyPolicy):
            for p in pol.parts:
                p.now = i
        if k in pol:
            hits += 1
            pol.hit(k)
            continue
        full = pol.full(k) if part else len(pol) >= cap
        if full:
            v = pol.victim(k, always)
            if v is None or v == k:
                continue
            pol.remove(v)
        pol.insert(k)
    return hits
