"""LFU and decayed LFU (``lfu``, ``dlfu``) over array state, the per-key work compiled with Numba.

Contract
--------
The policy interface of moetier.core.policies.residency (insert / hit / remove / victim, ``in``, ``len``) plus
``hit_many(keys)``, the hits of one layer call in one compiled call, ``replace(old, new)``, an eviction's
remove and insert in one, and, for a tier where the keys in ``pins`` are all that may not go (the ledger's: the
layer's picks and the keys mid-push), ``evict_for(k, pins)`` (victim, remove and insert in one call) and
``put(k, pins, cap)`` (the same, or an insert while fewer than ``cap`` keys are resident). Order: the resident
key with the least (score, tick, key) goes first; a use adds ``2^(tick / halflife)`` to the key's count
(``halflife`` 0: 1), the decay as a growing weight instead of shrinking every count (same order, O(1)); ``tick``
counts the policy's uses, and when the weight passes 1e200 every count is divided by it and ``tick`` restarts at 0.
Counts outlive eviction (a key's history follows it); a resident key's score is its count at its last use (or at
the last renormalisation).
``victim(k, ok)`` is never told no: it returns the first key in that order with ``ok(key)``, or None.

Array state (keys are ``base + i``, ``i`` < the arrays' width, which grows on demand):

    fs[0, i]  count of key i (float64)            iv[0, i]  tick of key i's last use (int64)
    fs[1, i]  its resident score (float64)        iv[1, i]  its place in the resident list, -1 if not resident
    st[0]     the policy's tick                   iv[2, :n] the resident list (indices), n = st[1]
    st[2]     the order: COUNT, or by the ticks alone, LRU (a use is a tick) or FIFO (an entry is)
    fs[2, :n] the heap's scores, by place         iv[3, :n] the heap's ticks, by place (each no greater
                                                   than its resident's own: see below)

The resident list is a binary min-heap on the by-place (score, tick, index), a place's children at 2p + 1 and
2p + 2. A use changes only its key's own entries: its place keeps the key it had, a lower bound, since a use only
raises a key. An eviction walks down from the root best first, and a place it finds stale takes its resident's key
and sinks; it stops at the first fresh place whose resident is not pinned: the least key, as a scan of every
resident would find, having read a few places (a VRAM tier holds thousands).

The kernels are compiled once into a cache (moetier.core.jit): a second process loads them instead; the
ledger's compiled commit (moetier.core.commit_kernel) calls the same ones. ``stack(parts)`` lays several LFUs'
arrays out as one array each, indexed by part first, the parts' own arrays rebound as views into them (what a
compiled caller indexes by part, a per-layer split's layer); a part must not grow past its width afterwards (its
arrays would leave the stack), which a part sized for its keys (a layer's experts, or every key) never does.
"""
from __future__ import annotations

import numpy as np
from moetier.core.jit import kernel
from moetier.core.policies.base import _Batched

__all__ = ["LFU", "stack", "COUNT", "LRU", "FIFO"]

_RENORM = 1e200
COUNT, LRU, FIFO = range(3)            # st[2], the order: by count, by last use, by entry


@kernel
def _touch(fs, iv, st, halflife, i):
    """One use of key index i: its count, its score and tick, resident from now on."""
    if st[2]:                        # ordered by the ticks alone (moetier.core.policies.recency): no count
        if st[2] == FIFO and iv[1, i] >= 0:
            return                   # a resident's use leaves its place in the entry order
        w = 0.0
    else:
        w = 2.0 ** (st[0] / halflife) if halflife > 0 else 1.0
    fs[0, i] += w
    if halflife > 0 and w > _RENORM:          # renormalise before the weights overflow
        fs[0, :] /= w
        st[0] = 0
        for j in range(st[1]):
            r = iv[2, j]
            fs[1, r] = fs[0, r]
            fs[2, j] = fs[0, r]
            iv[3, j] = iv[0, r]
        for j in range(st[1] // 2 - 1, -1, -1):   # every place's key is its resident's again: the heap anew
            _down(fs, iv, st[1], j)
    fs[1, i] = fs[0, i]
    iv[0, i] = st[0]
    st[0] += 1
    if iv[1, i] < 0:                 # a new resident enters the heap at its key; a resident's place keeps its old
        p = st[1]                    # key, a lower bound, until an eviction reads it (_evict_for)
        iv[1, i] = p
        iv[2, p] = i
        st[1] += 1
        fs[2, p] = fs[1, i]
        iv[3, p] = iv[0, i]
        _up(fs, iv, p)


@kernel
def _less(fs, iv, a, b):
    """Whether the resident at place a goes before the one at place b: the lesser (score, tick, index)."""
    sa, sb = fs[2, a], fs[2, b]
    if sa != sb:
        return sa < sb
    ta, tb = iv[3, a], iv[3, b]
    return ta < tb if ta != tb else iv[2, a] < iv[2, b]


@kernel
def _swap(fs, iv, a, b):
    ia, ib = iv[2, a], iv[2, b]
    iv[2, a], iv[2, b] = ib, ia
    # a resident pinned for an eviction (its place flipped negative, _evict_for) stays flagged where it moves
    iv[1, ib] = a if iv[1, ib] >= 0 else -2 - a
    iv[1, ia] = b if iv[1, ia] >= 0 else -2 - b
    fs[2, a], fs[2, b] = fs[2, b], fs[2, a]
    iv[3, a], iv[3, b] = iv[3, b], iv[3, a]


@kernel
def _up(fs, iv, p):
    while p > 0:
        q = (p - 1) // 2
        if not _less(fs, iv, p, q):
            return
        _swap(fs, iv, p, q)
        p = q


@kernel
def _down(fs, iv, n, p):
    while True:
        c = 2 * p + 1
        if c >= n:
            return
        if c + 1 < n and _less(fs, iv, c + 1, c):
            c += 1
        if not _less(fs, iv, c, p):
            return
        _swap(fs, iv, p, c)
        p = c


@kernel
def _touch_keys(fs, iv, st, halflife, keys, base, lim):
    """A use of each of ``keys`` in turn (key = base + index); nothing, and False, when one lies outside
    [base, base + lim) or the arrays."""
    hi = base + min(lim, fs.shape[1])
    for k in keys:
        if k < base or k >= hi:
            return False
    for k in keys:
        _touch(fs, iv, st, halflife, k - base)
    return True


@kernel
def _remove(fs, iv, st, i):
    p = iv[1, i]
    if p < 0:
        return
    n = st[1] - 1
    last = iv[2, n]
    iv[2, p] = last
    iv[1, last] = p
    fs[2, p] = fs[2, n]
    iv[3, p] = iv[3, n]
    iv[1, i] = -1
    st[1] -= 1
    if p < n:                        # the last resident took the place: restore the order there
        _down(fs, iv, n, p)
        _up(fs, iv, p)


@kernel
def _replace(fs, iv, st, halflife, old, i):
    """Key index ``old`` leaves, ``i`` enters (or is used again): one call for an eviction's two steps."""
    if old >= 0:
        _remove(fs, iv, st, old)
    _touch(fs, iv, st, halflife, i)


@kernel
def _next(fs, iv, st, s0, t0, i0):
    """The resident index with the least (score, tick, index) above (s0, t0, i0); -1 when none."""
    best, bs, bt = -1, 0.0, 0
    for j in range(st[1]):
        i = iv[2, j]
        s, t = fs[1, i], iv[0, i]
        if s < s0 or (s == s0 and (t < t0 or (t == t0 and i <= i0))):
            continue
        if best < 0 or s < bs or (s == bs and (t < bt or (t == bt and i < best))):
            best, bs, bt = i, s, t
    return best


@kernel
def _evict_for(fs, iv, st, halflife, pins, base, i):
    """The resident index with the least (score, tick, index) whose key (base + index) is not in ``pins`` (an
    int64 array of keys, a layer's few) is replaced by index i; returns it, or -1 (nothing replaced) when every
    resident key is pinned."""
    # a pinned resident's place is flipped negative for the scan (one read per resident, not a search of pins)
    w = fs.shape[1]
    for p in pins:
        r = p - base
        if 0 <= r < w and iv[1, r] >= 0:
            iv[1, r] = -2 - iv[1, r]
    # best first down the heap from its root. A place whose key is stale (its resident was used since) takes its
    # resident's key and sinks within its own subtree, and stays a candidate; a pinned resident's children become
    # candidates in its place (each adds at most one, so they number at most the pins + 1)
    best, n = -1, st[1]
    cand = np.empty(pins.shape[0] + 2, np.int64)
    m = 0
    if n:
        cand[0] = 0
        m = 1
    while m:
        c = 0
        for j in range(1, m):
            if _less(fs, iv, cand[j], cand[c]):
                c = j
        q = cand[c]
        r = iv[2, q]
        if iv[3, q] != iv[0, r] or fs[2, q] != fs[1, r]:
            fs[2, q] = fs[1, r]
            iv[3, q] = iv[0, r]
            _down(fs, iv, n, q)
            continue
        if iv[1, r] >= 0:
            best = r
            break
        m -= 1
        cand[c] = cand[m]
        for ch in (2 * q + 1, 2 * q + 2):
            if ch < n:
                cand[m] = ch
                m += 1
    for p in pins:
        r = p - base
        if 0 <= r < w and iv[1, r] < -1:
            iv[1, r] = -2 - iv[1, r]
    if best >= 0:
        _replace(fs, iv, st, halflife, best, i)
    return best


@kernel
def _put(fs, iv, st, halflife, pins, base, i, cap):
    """Index i enters: into a free slot (-1) while fewer than ``cap`` are resident, else in place of the least
    unpinned resident index (returned), or not at all (-2) when every resident key is pinned."""
    if st[1] < cap:
        _touch(fs, iv, st, halflife, i)
        return -1
    v = _evict_for(fs, iv, st, halflife, pins, base, i)
    return v if v >= 0 else -2


class LFU(_Batched):
    """Least frequently used; counts survive eviction (a key's history follows it), ties to the least recent use.
    ``halflife`` > 0 decays counts by uses of the tier (dlfu). ``base``: the lowest key (a per-layer part's first
    key), ``width``: how many keys from it to size the arrays for (they grow past it on demand)."""

    def __init__(self, capacity: int, halflife: float = 0.0, base: int = 0, width: int = 64):
        self.capacity, self.halflife = capacity, float(halflife)
        self.name = "dlfu" if self.halflife > 0 else "lfu"
        self.base = base
        self.fs = np.zeros((3, max(1, width)))
        self.iv = np.full((4, max(1, width)), -1, dtype=np.int64)
        self.st = np.zeros(3, dtype=np.int64)

    def _index(self, k) -> int:
        i = int(k) - self.base
        if i < 0:
            raise ValueError(f"{self.name}: key {k} is below this policy's first key {self.base}")
        if i >= self.fs.shape[1]:
            n = max(2 * self.fs.shape[1], i + 1)
            fs, iv = np.zeros((3, n)), np.full((4, n), -1, dtype=np.int64)
            fs[:, :self.fs.shape[1]] = self.fs
            iv[:, :self.iv.shape[1]] = self.iv
            self.fs, self.iv = fs, iv
        return i

    def insert(self, k):
        i = self._index(k)               # first: it may grow the arrays
        _touch(self.fs, self.iv, self.st, self.halflife, i)

    hit = insert

    def hit_within(self, keys, lim: int = 1 << 62) -> bool:
        """``hit_many`` of keys that all lie within [base, base + lim) and the arrays, in one compiled call; False,
        and nothing done, otherwise."""
        return _touch_keys(self.fs, self.iv, self.st, self.halflife,
                           np.fromiter(keys, dtype=np.int64, count=len(keys)), self.base, lim)

    def remove(self, k):
        i = int(k) - self.base
        if 0 <= i < self.fs.shape[1]:
            _remove(self.fs, self.iv, self.st, i)

    def replace(self, old, new):
        """``remove(old)`` then ``insert(new)``, in one compiled call."""
        i = self._index(new)
        o = int(old) - self.base
        _replace(self.fs, self.iv, self.st, self.halflife, o if 0 <= o < self.fs.shape[1] else -1, i)

    def evict_for(self, k, pins):
        """``victim(k, ok)`` for an ``ok`` that refuses exactly the keys in ``pins`` (an int64 array) and, when
        it names a key, ``replace(it, k)``: one compiled call. Returns the evicted key, or None (nothing changed)."""
        i = self._index(k)
        v = _evict_for(self.fs, self.iv, self.st, self.halflife, pins, self.base, i)
        return None if v < 0 else self.base + v

    def put(self, k, pins, cap=None):
        """``k`` enters a tier of ``cap`` slots (default: the capacity) whose pins are ``pins``: -1 when it took a
        free slot, the key it evicted, or ``k`` itself when every resident key is pinned (nothing changed)."""
        i = self._index(k)
        v = _put(self.fs, self.iv, self.st, self.halflife, pins, self.base, i, self.capacity if cap is None else cap)
        return -1 if v == -1 else k if v == -2 else self.base + v

    def victim(self, k, ok):
        fs, iv, st, base = self.fs, self.iv, self.st, self.base
        s, t, i = -np.inf, -1, -1
        while True:
            i = _next(fs, iv, st, s, t, i)
            if i < 0:
                return None
            if ok(base + i):
                return base + i
            s, t = fs[1, i], iv[0, i]

    def __contains__(self, k):
        i = int(k) - self.base
        return 0 <= i < self.fs.shape[1] and self.iv[1, i] >= 0

    def __len__(self):
        return int(self.st[1])


def stack(parts) -> tuple:
    """(fs, iv, st) of ``parts`` (LFUs of one width) stacked by part, each part's own arrays now views into them
    (module docstring)."""
    fs, iv, st = np.stack([p.fs for p in parts]), np.stack([p.iv for p in parts]), np.stack([p.st for p in parts])
    for j, p in enumerate(parts):
        p.fs, p.iv, p.st = fs[j], iv[j], st[j]
    return fs, iv, st
