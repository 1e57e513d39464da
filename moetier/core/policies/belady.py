"""Belady's MIN (``belady``) with the future known, over array state, the per-key work compiled with Numba.

Contract
--------
The policy interface of moetier.core.policies.residency (insert / hit / remove / victim, ``in``, ``len``) plus
``hit_many(keys)``, ``replace(old, new)``, ``evict_for(k, pins)`` and ``put(k, pins, cap)`` as the LFU has them
(moetier.core.policies.lfu), so the ledger evicts in one compiled call. ``Future(uses, keys)`` is the future: each
key's use positions (step x layers + layer), sorted; ``now`` is the position being served, which the caller advances
(``Future.now[0]``, shared by every policy given the same Future: one write a layer for every part of both tiers;
``policy.now = x`` writes it too; a policy given a dict makes a Future of its own). ``next_use(k)`` is the first use
after ``now`` (inf: none).

Order: each resident key has an entry (-its next use at its last use, key) in a min-heap; the victim is the first
entry in heap order whose key is resident with that next use and not pinned. An entry whose next use has passed
(the key was used since without a hit: another tier computed it) is refreshed where it comes up, its new entry
pushed, and the walk goes on. A key never used again is evicted first; the incoming key is bypassed (``victim``
returns it, ``put`` refuses it, ``evict_for`` names none) when no resident key is needed later than it. The heap is
rebuilt from the residents once it holds more than 4 x the residents + 64 entries. This is the order of the
dict-and-heap Belady it replaced, victim for victim (tests/test_policy_belady.py holds it to that one).

Array state (keys are ``base + i``, ``i`` < the width, which grows on demand): ``res[i]`` the resident's next use,
``inres[i]`` 1 where resident, ``pin[i]`` the scratch flags of an eviction's pins; ``hk, hx`` the heap's (-next
use, key) by place, ``st`` [entries, residents]. The future: ``offs`` (keys + 1) into ``pos`` (every use, by key),
``cur`` each key's first use not yet passed (it only moves on: ``now`` only grows).
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel
from moetier.core.policies.base import _Batched

__all__ = ["BeladyPolicy", "Future", "stack"]

INF = np.inf


class Future:
    """Every key's use positions as flat arrays, a cursor per key, and ``now`` (module docstring): from a dict key ->
    sorted positions, or ``Future.of_uses(key, pos, keys)`` from every use sorted by key, then position."""

    def __init__(self, uses: dict, keys: int = 0):
        items = sorted((int(k), int(p)) for k, u in uses.items() for p in u)
        k, p = np.array(items, np.int64).reshape(-1, 2).T
        self._set(k, p, max([keys, *(int(x) + 1 for x in uses)]))

    @classmethod
    def of_uses(cls, key: np.ndarray, pos: np.ndarray, keys: int) -> "Future":
        out = cls.__new__(cls)
        out._set(key, pos, keys)
        return out

    def _set(self, key, pos, n: int) -> None:
        self.offs = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(key, minlength=n)[:n], out=self.offs[1:])
        self.pos = np.ascontiguousarray(pos, np.int64)
        self.cur = self.offs[:-1].copy()
        self.now = np.full(1, -1, np.int64)
        self.arrays = (self.offs, self.pos, self.cur, self.now)      # what the kernels take as F


@kernel
def _next_use(offs, pos, cur, now, k):
    if k >= cur.shape[0]:
        return INF
    c, end = cur[k], offs[k + 1]
    while c < end and pos[c] <= now[0]:
        c += 1
    cur[k] = c
    return float(pos[c]) if c < end else INF


@kernel
def _less(hk, hx, a, b):
    return hk[a] < hk[b] or hk[a] == hk[b] and hx[a] < hx[b]


@kernel
def _push(hk, hx, st, neg, k):
    p = st[0]
    st[0] += 1
    hk[p], hx[p] = neg, k
    while p > 0:
        q = (p - 1) // 2
        if not _less(hk, hx, p, q):
            break
        hk[p], hk[q] = hk[q], hk[p]
        hx[p], hx[q] = hx[q], hx[p]
        p = q


@kernel
def _pop(hk, hx, st):
    """The heap's first entry (-next use, key), taken out."""
    neg, k = hk[0], hx[0]
    n = st[0] - 1
    st[0] = n
    hk[0], hx[0] = hk[n], hx[n]
    p = 0
    while True:
        c = 2 * p + 1
        if c >= n:
            break
        if c + 1 < n and _less(hk, hx, c + 1, c):
            c += 1
        if not _less(hk, hx, c, p):
            break
        hk[p], hk[c] = hk[c], hk[p]
        hx[p], hx[c] = hx[c], hx[p]
        p = c
    return neg, k


@kernel
def _touch(F, res, inres, hk, hx, st, base, k):
    """A use of key k: its next use from now, resident from now on, its entry pushed."""
    offs, pos, cur, now = F
    n = _next_use(offs, pos, cur, now, k)
    i = k - base
    if not inres[i]:
        inres[i] = 1
        st[1] += 1
    res[i] = n
    if st[0] >= hk.shape[0]:
        _rebuild(res, inres, hk, hx, st, base)
    _push(hk, hx, st, -n, k)


@kernel
def _rebuild(res, inres, hk, hx, st, base):
    st[0] = 0
    for i in range(inres.shape[0]):
        if inres[i]:
            _push(hk, hx, st, -res[i], base + i)


@kernel
def _pop_valid(F, res, inres, hk, hx, st, base):
    """The next entry in heap order whose key is resident with that next use, refreshing one whose next use has
    passed; its key, or -1 when the heap holds none."""
    while st[0]:
        neg, k = _pop(hk, hx, st)
        i = k - base
        if not inres[i] or res[i] != -neg:
            continue
        if res[i] <= F[3][0]:
            _touch(F, res, inres, hk, hx, st, base, k)
            continue
        return k
    return -1


@kernel
def _victim(F, res, inres, pin, hk, hx, st, base, pins, k):
    """The first resident key in order that is not in ``pins``, all the walked entries put back; or k (a bypass)
    where k is needed no sooner than it; -1 when every resident is pinned."""
    for p in pins:
        if 0 <= p - base < pin.shape[0]:
            pin[p - base] = 1
    skipped = np.empty(st[0] + 1, np.int64)       # a key may have two entries of one next use
    m, out = 0, -1
    while True:
        x = _pop_valid(F, res, inres, hk, hx, st, base)
        if x < 0:
            break
        skipped[m] = x
        m += 1
        if not pin[x - base]:
            out = x
            break
    for p in pins:
        if 0 <= p - base < pin.shape[0]:
            pin[p - base] = 0
    return _settle(F, res, inres, hk, hx, st, base, skipped[:m], out, k)


@kernel
def _settle(F, res, inres, hk, hx, st, base, walked, out, k):
    """The end of a victim walk: the walked keys' entries back, the heap rebuilt once it holds more than 4 x the
    residents + 64 entries; ``k`` (a bypass, where k >= 0 is needed no sooner than ``out``), else ``out``."""
    for x in walked:
        _push(hk, hx, st, -res[x - base], x)
    if st[0] > 4 * st[1] + 64:
        _rebuild(res, inres, hk, hx, st, base)
    if out >= 0 and k >= 0 and _next_use(F[0], F[1], F[2], F[3], k) >= res[out - base]:
        return k
    return out


@kernel
def _put(F, res, inres, pin, hk, hx, st, base, pins, k, cap):
    """k enters: a free slot (-1) while fewer than ``cap`` are resident, else the victim's place (the victim), else
    refused (-2: a bypass, or every resident pinned)."""
    if st[1] < cap:
        _touch(F, res, inres, hk, hx, st, base, k)
        return -1
    v = _victim(F, res, inres, pin, hk, hx, st, base, pins, k)
    if v < 0 or v == k:
        return -2
    inres[v - base] = 0
    st[1] -= 1
    _touch(F, res, inres, hk, hx, st, base, k)
    return v


@kernel
def _touch_keys(F, res, inres, hk, hx, st, base, keys, lim):
    """A use of each of ``keys`` in turn; nothing, and False, when one lies outside [base, base + lim) or the
    arrays."""
    hi = base + min(lim, res.shape[0])
    for k in keys:
        if k < base or k >= hi:
            return False
    for k in keys:
        _touch(F, res, inres, hk, hx, st, base, k)
    return True


class BeladyPolicy(_Batched):
    """Belady's MIN over ``future`` (a Future, or a dict key -> sorted use positions); ``base`` / ``width``: the
    keys it will see (a per-layer part's)."""
    name = "belady"

    def __init__(self, capacity: int, future, base: int = 0, width: int = 64):
        self.capacity, self.base = capacity, base
        self.F = future if isinstance(future, Future) else Future(future)
        self.res, self.inres, self.st = np.zeros(0), np.zeros(0, np.uint8), np.zeros(2, np.int64)
        self._grow(max(1, width))

    def _grow(self, w: int) -> None:
        """Arrays for ``w`` keys, the residents kept and the heap rebuilt from them (the same order)."""
        res, inres = np.zeros(w), np.zeros(w, np.uint8)
        res[:len(self.res)], inres[:len(self.inres)] = self.res, self.inres
        self.res, self.inres, self.pin = res, inres, np.zeros(w, np.uint8)
        self.hk, self.hx = np.empty(4 * w + 66), np.empty(4 * w + 66, np.int64)   # past 4 x residents + 64: rebuilt
        _rebuild(res, inres, self.hk, self.hx, self.st, self.base)
        self._bind()

    def _bind(self) -> None:
        """The kernels' leading arguments over this policy's arrays (again after they move: ``_grow``, ``stack``)."""
        self._a = (self.F.arrays, self.res, self.inres, self.hk, self.hx, self.st, self.base)

    def _index(self, k) -> int:
        i = int(k) - self.base
        if i < 0:
            raise ValueError(f"belady: key {k} is below this policy's first key {self.base}")
        if i >= self.res.shape[0]:
            self._grow(max(2 * self.res.shape[0], i + 1))
        return int(k)

    @property
    def now(self) -> int:
        return int(self.F.now[0])

    @now.setter
    def now(self, v) -> None:
        self.F.now[0] = v

    def next_use(self, k) -> float:
        return _next_use(*self.F.arrays, int(k))

    def insert(self, k):
        _touch(*self._a, self._index(k))

    hit = insert

    def hit_within(self, keys, lim: int = 1 << 62) -> bool:
        """``hit_many`` of keys that all lie within [base, base + lim) and the arrays; False, and nothing done,
        otherwise (moetier.core.policies.residency.Partitioned batches a layer's hits through it)."""
        return _touch_keys(*self._a, np.fromiter(keys, np.int64, len(keys)), lim)

    def remove(self, k):
        i = int(k) - self.base
        if 0 <= i < self.res.shape[0] and self.inres[i]:
            self.inres[i] = 0
            self.st[1] -= 1

    def replace(self, old, new):
        self.remove(old)
        self.insert(new)

    def victim(self, k, ok):
        """The first resident key in order with ``ok(key)`` (every key it walks put back), or ``k`` (a bypass), or
        None."""
        walked, out = [], -1
        while (x := _pop_valid(*self._a)) >= 0:
            walked.append(x)
            if ok(x):
                out = x
                break
        v = _settle(*self._a, np.array(walked, np.int64), out, -1 if k is None else int(k))
        return None if v < 0 else v

    def evict_for(self, k, pins):
        """``victim(k, ok)`` for an ``ok`` refusing exactly ``pins``, and ``replace(it, k)`` where it names a key, in
        one compiled call (``put`` into a tier of no free slot); the evicted key, or None (nothing changed)."""
        v = self.put(k, pins, 0)
        return None if v == k else v

    def put(self, k, pins, cap=None):
        """``k`` enters a tier of ``cap`` slots (default: the capacity): -1 for a free slot, the evicted key, or ``k``
        (refused: a bypass, or every resident pinned)."""
        k = self._index(k)
        f, res, inres, hk, hx, st, base = self._a
        v = _put(f, res, inres, self.pin, hk, hx, st, base, pins, k, self.capacity if cap is None else cap)
        return k if v == -2 else v

    def __contains__(self, k):
        i = int(k) - self.base
        return 0 <= i < self.res.shape[0] and bool(self.inres[i])

    def __len__(self):
        return int(self.st[1])


def stack(parts) -> tuple:
    """(F, res, inres, pin, hk, hx, st) of ``parts`` (Belady policies of one width and one future) stacked by part,
    each part's own arrays now views into them: what the ledger's compiled commit indexes by part
    (moetier.core.tier_ops); a part must not grow past its width afterwards (its arrays would leave the stack)."""
    names = ("res", "inres", "pin", "hk", "hx", "st")
    arrays = [np.stack([getattr(p, n) for p in parts]) for n in names]
    for j, p in enumerate(parts):
        for n, a in zip(names, arrays):
            setattr(p, n, a[j])
        p._bind()
    return (parts[0].F.arrays, *arrays)
