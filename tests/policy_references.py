"""Reference caches written from the published algorithms (not from moetier's code), for the differential tests
(tests/test_policy_reference.py) and benchmarks/policy_agreement.py.

Each reference is a whole cache of ``cap`` unit-sized slots with one method, ``get(x)``, that serves one request the
way its source describes it, and ``resident()``, the set of keys it holds. Plain lists, oldest first (``pop(0)``);
slow and obvious on purpose. The sources:

* ``Ref2Q``: Johnson and Shasha, "2Q: a low overhead high performance buffer management replacement algorithm"
  (VLDB 1994), the full version's pseudo-code: on a miss the key is looked up in A1out before ``reclaimfor``; sizes as
  libCacheSim's TwoQ.c (Kin = int(a1 x cap), Kout = int(ghost x cap)).
* ``RefSLRU``: Caffeine's simulator, SegmentedLruPolicy (no admission filter).
* ``RefSieve``: Zhang et al., "SIEVE is simpler than LRU" (NSDI 2024), Algorithm 1.
* ``RefS3FIFO``: Yang et al., "FIFO queues are all you need for cache eviction" (SOSP 2023), as libCacheSim's S3FIFO.c
  runs it (move-to-main threshold, the pre-eviction insertion into M), with S of at least one slot.
* ``RefWTinyLFU``: Caffeine's simulator, WindowTinyLfuPolicy with the TinyLfu admittor over a count-min sketch
  (4 rows of 4-bit counters, periodic halving), the sketch's hashing as moetier documents it
  (moetier.core.policies.sketch's docstring: multiply-shift with the constants below).
* ``RefKT*``: KTransformers' kt-kernel ``weight_provider.py`` policies, as their golden-trace tests describe them.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import OrderedDict

MASK = (1 << 64) - 1
A = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
B = (0x632BE59BD9B4E019, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, 0x94D049BB133111EB)


class Ref2Q:
    def __init__(self, cap, a1=0.25, ghost=0.5):
        self.cap, self.kin, self.kout = cap, int(cap * a1), int(cap * ghost)
        self.a1in, self.a1out, self.am = [], [], []

    def resident(self):
        return set(self.a1in) | set(self.am)

    def get(self, x):
        if x in self.am:
            self.am.remove(x)
            self.am.append(x)
            return
        if x in self.a1in:
            return
        in_ghost = x in self.a1out
        if in_ghost:
            self.a1out.remove(x)
        if len(self.a1in) + len(self.am) == self.cap:          # reclaimfor(x)
            if len(self.a1in) > self.kin:
                y = self.a1in.pop(0)
                self.a1out.append(y)
                if len(self.a1out) > self.kout:
                    self.a1out.pop(0)
            else:
                self.am.pop(0)
        (self.am if in_ghost else self.a1in).append(x)


class RefSLRU:
    def __init__(self, cap, protected=0.8):
        self.cap, self.maxprot = cap, int(cap * protected)
        self.prob, self.prot = [], []

    def resident(self):
        return set(self.prob) | set(self.prot)

    def get(self, x):
        if x in self.prot:
            self.prot.remove(x)
            self.prot.append(x)
        elif x in self.prob:
            self.prob.remove(x)
            if self.maxprot == 0:
                self.prob.append(x)
                return
            if len(self.prot) + 1 > self.maxprot:
                self.prob.append(self.prot.pop(0))
            self.prot.append(x)
        else:
            self.prob.append(x)
            if len(self.prob) + len(self.prot) > self.cap:
                self.prob.pop(0)


class RefSieve:
    def __init__(self, cap):
        self.cap, self.q, self.vis, self.hand = cap, [], {}, None     # q[0]: head (newest)

    def resident(self):
        return set(self.q)

    def get(self, x):
        if x in self.vis:
            self.vis[x] = True
            return
        if len(self.q) == self.cap:
            i = self.q.index(self.hand) if self.hand is not None else len(self.q) - 1
            while self.vis[self.q[i]]:
                self.vis[self.q[i]] = False
                i = i - 1 if i > 0 else len(self.q) - 1
            self.hand = self.q[i - 1] if i > 0 else None
            del self.vis[self.q.pop(i)]
        self.q.insert(0, x)
        self.vis[x] = False


class RefS3FIFO:
    def __init__(self, cap, small=0.1, ghost=0.9, move=2):
        self.cap, self.move = cap, move
        self.ssize = max(1, int(cap * small))
        self.msize = cap - self.ssize
        self.gsize = int(cap * ghost)
        self.S, self.M, self.G, self.f = [], [], [], {}
        self.evicted = False

    def resident(self):
        return set(self.S) | set(self.M)

    def _evict(self):
        self.evicted = True
        if len(self.M) > self.msize or not self.S:
            while True:
                t = self.M.pop(0)
                if self.f[t] > 0:
                    self.M.append(t)
                    self.f[t] = min(self.f[t], 3) - 1
                else:
                    return
        while self.S:
            t = self.S.pop(0)
            if self.f[t] >= self.move:
                self.M.append(t)
                self.f[t] = 0
            else:
                if self.gsize:
                    self.G.append(t)
                    if len(self.G) > self.gsize:
                        self.G.pop(0)
                return

    def get(self, x):
        if x in self.S or x in self.M:
            self.f[x] += 1
            return
        hit_ghost = x in self.G
        if hit_ghost:
            self.G.remove(x)
        while len(self.S) + len(self.M) >= self.cap:
            self._evict()
        if hit_ghost or (not self.evicted and len(self.S) >= self.ssize):
            self.M.append(x)
        else:
            self.S.append(x)
        self.f[x] = 0


class RefCountMin4:
    def __init__(self, cap, sample=10, doorkeeper=False):
        w = 1
        while w < 4 * max(1, cap):
            w *= 2
        self.bits = w.bit_length() - 1
        self.t = [[0] * w for _ in range(4)]
        self.size, self.sample, self.door, self.use_door = 0, sample * max(1, cap), set(), doorkeeper

    def _idx(self, x, i):
        return ((x * A[i] + B[i]) & MASK) >> (64 - self.bits) if self.bits else 0

    def frequency(self, x):
        return min(self.t[i][self._idx(x, i)] for i in range(4)) + (1 if self.use_door and x in self.door else 0)

    def increment(self, x):
        if self.use_door and x not in self.door:
            self.door.add(x)
            added = True
        else:
            added = False
            for i in range(4):
                j = self._idx(x, i)
                if self.t[i][j] < 15:
                    self.t[i][j] += 1
                    added = True
        if added:
            self.size += 1
            if self.size == self.sample:
                odd = sum(v & 1 for row in self.t for v in row)
                self.t = [[v // 2 for v in row] for row in self.t]
                self.size = (self.size - odd // 4) // 2
                self.door = set()


class RefWTinyLFU:
    def __init__(self, cap, window=0.01, protected=0.8, sample=10, doorkeeper=False):
        self.cap = cap
        self.maxwin = cap - int((1.0 - window) * cap)
        self.maxprot = int(protected * (cap - self.maxwin))
        self.win, self.prob, self.prot = [], [], []
        self.sketch = RefCountMin4(cap, sample, doorkeeper)

    def resident(self):
        return set(self.win) | set(self.prob) | set(self.prot)

    def get(self, x):
        self.sketch.increment(x)
        if x in self.win:
            self.win.remove(x)
            self.win.append(x)
        elif x in self.prot:
            self.prot.remove(x)
            self.prot.append(x)
        elif x in self.prob:
            self.prob.remove(x)
            self.prot.append(x)
            if len(self.prot) > self.maxprot:
                self.prob.append(self.prot.pop(0))
        else:
            self.win.append(x)
            if len(self.win) <= self.maxwin:
                return
            cand = self.win.pop(0)
            self.prob.append(cand)
            if len(self.win) + len(self.prob) + len(self.prot) > self.cap:
                victim = self.prob[0]
                f = self.sketch.frequency
                self.prob.remove(victim if f(cand) > f(victim) else cand)


def _kt_split(cap, r):
    return cap if cap <= 1 else max(1, min(cap - 1, int(round(cap * r))))


class RefKT2Q:
    def __init__(self, cap, a1=0.25):
        self.cap, self.a1cap = cap, _kt_split(cap, a1)
        self.amcap = cap - self.a1cap if cap > 1 else 0
        self.a1, self.am = [], []

    def resident(self):
        return set(self.a1) | set(self.am)

    def get(self, x):
        if x in self.am:
            self.am.remove(x)
            self.am.append(x)
            return
        if x in self.a1:
            self.a1.remove(x)
            (self.am if self.amcap else self.a1).append(x)
        else:
            self.a1.append(x)
        while len(self.a1) > self.a1cap:
            self.a1.pop(0)
        while len(self.am) > self.amcap:
            self.am.pop(0)
        while len(self.a1) + len(self.am) > self.cap:
            (self.a1 if self.a1 else self.am).pop(0)


class RefKTSLRU:
    def __init__(self, cap, protected=0.8):
        self.cap, self.pcap = cap, (0 if cap <= 1 else _kt_split(cap, protected))
        self.prob, self.prot = [], []

    def resident(self):
        return set(self.prob) | set(self.prot)

    def get(self, x):
        if x in self.prot:
            self.prot.remove(x)
            self.prot.append(x)
            return
        if x in self.prob:
            self.prob.remove(x)
            (self.prot if self.pcap else self.prob).append(x)
        else:
            self.prob.append(x)
        while len(self.prot) > self.pcap:
            self.prob.append(self.prot.pop(0))
        while len(self.prob) + len(self.prot) > self.cap:
            self.prob.pop(0)


class RefKTWTinyLFU:
    def __init__(self, cap, window=0.1, protected=0.8, decay=1000):
        self.cap, self.wcap = cap, _kt_split(cap, window)
        self.mcap = cap - self.wcap if cap > 1 else 0
        self.pcap = max(0, min(self.mcap, int(self.mcap * protected)))
        self.decay, self.n, self.freq = decay, 0, {}
        self.win, self.prob, self.prot = [], [], []

    def resident(self):
        return set(self.win) | set(self.prob) | set(self.prot)

    def get(self, x):
        self.n += 1
        self.freq[x] = self.freq.get(x, 0) + 1
        if self.n % self.decay == 0:
            self.freq = {k: v // 2 for k, v in self.freq.items() if v // 2}
        for q in (self.win, self.prot):
            if x in q:
                q.remove(x)
                q.append(x)
                return
        if x in self.prob:
            self.prob.remove(x)
            self.prot.append(x)
            while len(self.prot) > self.pcap:
                self.prob.append(self.prot.pop(0))
            return
        self.win.append(x)
        if len(self.win) > self.wcap:
            cand = self.win.pop(0)
            if not self.mcap:
                return
            self.prob.append(cand)
            if len(self.win) + len(self.prob) + len(self.prot) > self.cap:
                victim = self.prob[0]
                self.prob.remove(victim if self.freq.get(cand, 0) >= self.freq.get(victim, 0) else cand)


class RefKTSieve:
    """kt-kernel's SIEVEPolicy: head insertion at index 0; the hand is an index that stays put after an eviction."""

    def __init__(self, cap):
        self.cap, self.q, self.vis, self.hand = cap, [], {}, None

    def resident(self):
        return set(self.q)

    def get(self, x):
        if x in self.vis:
            self.vis[x] = True
            return
        if len(self.q) >= self.cap:
            if self.hand is None or self.hand >= len(self.q):
                self.hand = len(self.q) - 1
            while self.vis[self.q[self.hand]]:
                self.vis[self.q[self.hand]] = False
                self.hand = self.hand - 1 if self.hand > 0 else len(self.q) - 1
            del self.vis[self.q.pop(self.hand)]
            self.hand = min(self.hand, len(self.q) - 1) if self.q else None
        self.q.insert(0, x)
        self.vis[x] = False
        self.hand = len(self.q) - 1 if self.hand is None else self.hand + 1


class RefKTS3FIFO:
    def __init__(self, cap, small=0.1, ghost=1.0, move=2, freq_cap=3):
        self.cap, self.scap = cap, _kt_split(cap, small)
        self.mcap = cap - self.scap if cap > 1 else 0
        self.gcap = max(1, int(max(cap, 1) * ghost))
        self.move, self.fcap = move, freq_cap
        self.S, self.M, self.G, self.f = [], [], [], {}

    def resident(self):
        return set(self.S) | set(self.M)

    def _main(self, x, f):
        if self.mcap:
            self.M.append(x)
            self.f[x] = min(self.fcap, f)

    def _out_main(self):
        while self.M:
            v = self.M.pop(0)
            if self.f[v] >= 1:
                self.f[v] -= 1
                self.M.append(v)
            else:
                del self.f[v]
                return True
        return False

    def _out_small(self):
        if not self.S:
            return False
        v = self.S.pop(0)
        f = self.f.pop(v)
        if f >= self.move and self.mcap:
            self._main(v, f)
            return self._fit()
        if v in self.G:
            self.G.remove(v)
        self.G.append(v)
        while len(self.G) > self.gcap:
            self.G.pop(0)
        return True

    def _fit(self):
        go = True
        while go:
            if len(self.S) > self.scap:
                go = self._out_small()
            elif len(self.M) > self.mcap:
                go = self._out_main()
            elif len(self.S) + len(self.M) > self.cap:
                go = self._out_small() if self.S else self._out_main()
            else:
                go = False
        return len(self.S) <= self.scap and len(self.M) <= self.mcap

    def get(self, x):
        if x in self.S or x in self.M:
            self.f[x] = min(self.fcap, self.f[x] + 1)
            return
        if x in self.G:
            self.G.remove(x)
            self._main(x, self.move)
        else:
            self.S.append(x)
            self.f[x] = 0
        self._fit()


TEXTBOOK = {"2q": Ref2Q, "slru": RefSLRU, "sieve": RefSieve, "s3fifo": RefS3FIFO, "wtinylfu": RefWTinyLFU}
KTRANSFORMERS = {"kt-2q": RefKT2Q, "kt-slru": RefKTSLRU, "kt-sieve": RefKTSieve, "kt-s3fifo": RefKTS3FIFO,
                 "kt-wtinylfu": RefKTWTinyLFU}


def streams(kind: str, cap: int, n: int, seed: int) -> list:
    """A seeded request stream: ``zipf`` (Zipf 0.9 over 4 x cap + 8 keys, shuffled ranks), ``scan`` (a hot set of
    cap // 2 + 1 keys, each request hot with probability 0.6, else the next key of a cyclic scan over 3 x cap + 5
    cold keys) or ``mixed`` (zipf with a scan burst of 2 x cap + 3 new keys every 100 requests)."""
    import numpy as np
    rng = np.random.default_rng(seed * 1009 + cap)
    if kind == "zipf":
        keys = 4 * cap + 8
        w = 1.0 / np.arange(1, keys + 1) ** 0.9
        perm = rng.permutation(keys)
        return [int(perm[i]) for i in rng.choice(keys, size=n, p=w / w.sum())]
    if kind == "scan":
        hot, cold = cap // 2 + 1, 3 * cap + 5
        out, j = [], 0
        for _ in range(n):
            if rng.random() < 0.6:
                out.append(int(rng.integers(hot)))
            else:
                out.append(hot + j % cold)
                j += 1
        return out
    if kind == "mixed":
        base = streams("zipf", cap, n, seed)
        out, fresh = [], 10_000
        for i, k in enumerate(base):
            if i % 100 == 50:
                out.extend(range(fresh, fresh + 2 * cap + 3))
                fresh += 2 * cap + 3
            out.append(k)
        return out[:n]
    raise ValueError(kind)


def drive(pol, cap: int, seq, ok=lambda _k: True):
    """Serve ``seq`` with moetier policy ``pol`` under the tier protocol (moetier.core.ledger's order: a held key
    is a hit; else, when the tier is full, ``victim`` names a key, which is removed, then the key is inserted); yields
    the set of keys the tier holds after each request."""
    held: set = set()
    for k in seq:
        if k in held:
            pol.hit(k)
        else:
            if len(held) >= cap:
                v = pol.victim(k, ok)
                if v is None or v == k:
                    yield held
                    continue
                pol.remove(v)
                held.discard(v)
            pol.insert(k)
            held.add(k)
        yield held


def agreement(make_policy, ref, cap: int, seq, kt: bool = False) -> tuple[int, int]:
    """(steps whose resident sets agree, steps) of moetier's policy against the reference on ``seq``. For the
    KTransformers machines the policy's own set (orphans left out) is compared: the tier keeps a key the reference
    dropped on a hit until it needs the slot."""
    pol = make_policy()
    same = 0
    for n, (held, k) in enumerate(zip(drive(pol, cap, seq), seq), 1):
        ref.get(k)
        mine = pol.resident() if kt else held
        same += mine == ref.resident()
    return same, len(seq)


class RefHeapLFU:
    """(Decayed) LFU as moetier wrote it over dicts and a lazily invalidated heap before its array state
    (moetier.core.policies.lfu): the policy interface itself (insert / hit / remove / victim), so the differential
    test can pin keys and remove them as a tier does. A use adds 2^(tick / halflife); past 1e200 every count is divided
    by the weight, the tick restarts and each resident key's score becomes its count."""

    def __init__(self, cap, halflife=0.0):
        self.cap, self.halflife = cap, float(halflife)
        self.freq, self.res, self.heap, self.tick = {}, {}, [], 0

    def _touch(self, k):
        import heapq
        w = 2.0 ** (self.tick / self.halflife) if self.halflife > 0 else 1.0
        self.freq[k] = self.freq.get(k, 0.0) + w
        if self.halflife > 0 and w > 1e200:
            self.freq = {x: v / w for x, v in self.freq.items()}
            self.tick = 0
            self.res = {x: (self.freq[x], t) for x, (_, t) in self.res.items()}
            self.heap = [(s, t, x) for x, (s, t) in self.res.items()]
            heapq.heapify(self.heap)
        self.res[k] = (self.freq[k], self.tick)
        self.tick += 1
        heapq.heappush(self.heap, (self.freq[k], self.res[k][1], k))

    insert = hit = _touch

    def remove(self, k):
        self.res.pop(k, None)

    def victim(self, k, ok):
        for s, t, x in sorted(self.heap):
            if self.res.get(x) == (s, t) and ok(x):
                return x
        return None

    def __contains__(self, k):
        return k in self.res

    def __len__(self):
        return len(self.res)


class RefQueue:
    """LRU or FIFO as moetier wrote them over an ordered dict before their array state
    (moetier.core.policies.recency): the oldest key first; a use moves a key to the new end under LRU only. As in
    the array policies, insert and hit are both a use, and a use of a key not resident inserts it."""

    def __init__(self, lru: bool):
        self.lru = lru
        self.res: OrderedDict = OrderedDict()

    def insert(self, k):
        if k not in self.res:
            self.res[k] = None
        elif self.lru:
            self.res.move_to_end(k)

    hit = insert

    def remove(self, k):
        self.res.pop(k, None)

    def victim(self, k, ok):
        return next((x for x in self.res if ok(x)), None)

    def __contains__(self, k):
        return k in self.res

    def __len__(self):
        return len(self.res)


class RefBelady:
    """Belady's MIN as moetier wrote it over a dict and a lazily invalidated heapq before its array state
    (moetier.core.policies.belady): ``future`` key -> sorted use positions, ``now`` set by the caller; a key never
    used again goes first, the incoming key is bypassed when no resident is needed later than it."""

    def __init__(self, capacity, future):
        self.capacity, self.future = capacity, future
        self.now = -1
        self.res, self.heap = {}, []

    def next_use(self, k):
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

    def remove(self, k):
        self.res.pop(k, None)

    def _stale(self, e):
        x, res = e[1], self.res
        if x not in res or res[x] != -e[0]:
            return True
        if res[x] <= self.now:
            self._touch(x)
            return True
        return False

    def victim(self, k, ok):
        heap, skipped, out = self.heap, [], None
        while heap:
            e = heapq.heappop(heap)
            if self._stale(e):
                continue
            skipped.append(e)
            if ok(e[-1]):
                out = e[-1]
                break
        for e in skipped:
            heapq.heappush(self.heap, e)
        if len(self.heap) > 4 * len(self.res) + 64:
            self.heap = [(-self.res[x], x) for x in self.res]
            heapq.heapify(self.heap)
        if out is not None and k is not None and self.next_use(k) >= self.res[out]:
            return k
        return out

    def __contains__(self, k):
        return k in self.res

    def __len__(self):
        return len(self.res)
