"""A cache written as its authors wrote it (one ``access`` per request: look up, reclaim, insert) run as a tier's
policy (moetier.core.policies.residency: insert, hit, remove, victim), over array state, compiled.

Contract
--------
A machine (moetier.core.policies.twoq, slru, s3fifo, wtinylfu, ktransformers) is its array state
(moetier.core.policies.queues.State) and a compiled ``access(k)`` (a hit or a miss, in the reference's order: the
ghost looked up, then space reclaimed, then ``k`` placed) that hands the keys it drops to the tier; ``discard(k)``
(``k`` left the tier by other means: no ghost) takes ``k`` out of its resident queues, and its resident keys in
order (first to go first) are its queues (``ORDER``) walked oldest first.

``Machine(machine, name)`` runs it under the tier's protocol. The tier tells the policy the incoming key before it asks
for room: ``victim(k, ok)`` runs ``access(k)`` at once, so the ghost is consulted before anything is reclaimed
(libCacheSim's find, evict, insert), and names a dropped key. A key the machine dropped while the tier still holds
it (a reference that evicts on a hit, KTransformers' 2Q; or a dropped key that was pinned) is an *orphan*: it keeps
its slot and is the first ``victim`` names once it may go; a hit on it is a miss to the machine. ``victim`` returns
``k`` when the machine keeps ``k`` out (an admission filter), and, when every dropped key is pinned, the first
key of the order that may go. Without pins the machine's keys are, after every request, exactly the reference's.
``put(k, pins, cap)`` is the ledger's one-call eviction (as moetier.core.policies.lfu has it); ``feed(...)`` serves
a layer's RAM uses (moetier.peers.token_feed) in one compiled call: each a ledger's hit or
fill landing on a per-layer part of ``cap`` slots, nothing pinned but the keys mid-push. Pure.

Every per-request step (``_access``, ``_insert``, ``_remove``, the victim's ``_begin`` / ``_end``, ``_put``,
``_feed``) is a kernel (moetier.core.jit: Numba, cached) over the state's arrays, dispatching on the machine's kind;
``victim`` with a Python ``ok`` walks the compiled order in Python.
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel

from moetier.core.policies import ktransformers as kt, s3fifo, sieve, slru, twoq, wtinylfu
from moetier.core.policies.queues import (BLOCKED, F, N, OQ, ORDER, ORPH, PEND, Q, RESIDENT, W, drop, resident,
                                          unlink)

__all__ = ["Machine", "KINDS", "feed"]

# sieve (moetier.core.policies.sieve) runs the tier protocol itself, not through Machine; it is a kind here so that
# feed serves it too
KINDS = {"2q": 0, "slru": 1, "s3fifo": 2, "wtinylfu": 3, "kt-2q": 4, "kt-slru": 5, "kt-sieve": 6, "kt-s3fifo": 7,
         "kt-wtinylfu": 8, "sieve": 9}
_KT_SIEVE, _SIEVE = KINDS["kt-sieve"], KINDS["sieve"]
# _feed's per-key scratch bits (iv[W]): read this layer, used this layer, held in RAM, held otherwise (and BLOCKED)
_READ, _USED, _CRAM, _COTHER = 1, 2, 8, 16


@kernel
def _machine_access(kind, iv, st, aux, base, k):
    if kind == 0:
        twoq.access(iv, st, base, k)
    elif kind == 1:
        slru.access(iv, st, base, k)
    elif kind == 2:
        s3fifo.access(iv, st, base, k)
    elif kind == 3:
        wtinylfu.access(iv, st, aux, base, k)
    elif kind == 4:
        kt.access_2q(iv, st, base, k)
    elif kind == 5:
        kt.access_slru(iv, st, base, k)
    elif kind == 6:
        kt.access_sieve(iv, st, base, k)
    elif kind == 7:
        kt.access_s3fifo(iv, st, base, k)
    else:
        kt.access_wtinylfu(iv, st, base, k)


@kernel
def _queues(kind, st):
    """The resident queues in eviction order: the machine's ``ORDER``, or 2Q's, which depends on A1in's size."""
    if kind == 0:
        return twoq.queues(st)
    return st[ORDER], st[ORDER + 1], st[ORDER + 2]


@kernel
def _discard(kind, iv, st, base, k):
    if kind == _KT_SIEVE:
        kt.discard_sieve(iv, st, base, k)
    elif resident(iv, base, k):
        unlink(iv, st, base, Q, k)


@kernel
def _size(st):
    n = st[3 * ORPH + 2]
    for q in range(RESIDENT):
        n += st[3 * q + 2]
    return n


@kernel
def _access(kind, iv, st, aux, base, k):
    if kind == _SIEVE:
        iv[F, k - base] = 1
        return
    unlink(iv, st, base, OQ, k)
    _machine_access(kind, iv, st, aux, base, k)
    if not resident(iv, base, k):              # the machine did not keep k (a cache of no slots for it)
        drop(iv, st, base, k)


@kernel
def _insert(kind, iv, st, aux, base, k):
    if kind == _SIEVE:
        sieve.insert(iv, st, base, k)
        return
    if st[PEND] == k:
        st[PEND] = -1
        return
    _access(kind, iv, st, aux, base, k)


@kernel
def _remove(kind, iv, st, base, k):
    if kind == _SIEVE:
        sieve.remove(iv, st, base, k)
        return
    if iv[OQ, k - base] == ORPH:
        unlink(iv, st, base, OQ, k)
        return
    _discard(kind, iv, st, base, k)
    if st[PEND] == k:
        st[PEND] = -1


@kernel
def _begin(kind, iv, st, aux, base, k):
    """The victim's first step: the incoming key's request, once; True when the machine kept it out."""
    if k >= 0 and st[PEND] != k and not resident(iv, base, k):
        st[PEND] = k
        _access(kind, iv, st, aux, base, k)
        if iv[OQ, k - base] == ORPH:           # kept out by the machine (an admission filter)
            unlink(iv, st, base, OQ, k)
            st[PEND] = -1
            return True
    return False


@kernel
def _end(kind, iv, st, base, k):
    """The victim's last step when nothing may go: the tier refuses k."""
    if st[PEND] == k and k >= 0:
        _discard(kind, iv, st, base, k)
        st[PEND] = -1


@kernel
def _order(kind, iv, st, base, out, orphans):
    """The orphans (when asked), then the machine's keys in order, into ``out``; returns how many."""
    n = 0
    if orphans:
        o = st[3 * ORPH]
        while o >= 0:
            out[n] = o
            n += 1
            o = iv[OQ + 2, o - base]
    for q in _queues(kind, st):
        if q >= 0:
            o = st[3 * q]
            while o >= 0:
                out[n] = o
                n += 1
                o = iv[N, o - base]
    return n


@kernel
def _victim_unpinned(kind, iv, st, aux, base, k):
    """``victim(k, ok)`` where ``ok`` refuses the keys marked mid-push (``iv[W]``); -1 for None."""
    if kind == _SIEVE:
        code, v, _ = sieve.walk(iv, st, base, st[sieve.HAND] if st[sieve.HAND] >= 0 else st[3 * sieve.SQ], 0, -1,
                                False)
        return v if code == 0 else -1
    if _begin(kind, iv, st, aux, base, k):
        return k
    o = st[3 * ORPH]
    while o >= 0:
        if o != k and not iv[W, o - base] & BLOCKED:
            return o
        o = iv[OQ + 2, o - base]
    for q in _queues(kind, st):
        if q >= 0:
            o = st[3 * q]
            while o >= 0:
                if o != k and not iv[W, o - base] & BLOCKED:
                    return o
                o = iv[N, o - base]
    _end(kind, iv, st, base, k)
    return -1


@kernel
def _place(kind, iv, st, aux, base, k, cap):
    """k enters a tier of ``cap`` slots (the ledger's _ram_put_policy, the keys marked BLOCKED pinned): -1 when it
    took a free slot, the key it replaced, or k when the machine kept it out or every key is pinned (the tier
    unchanged)."""
    if _size(st) < cap:
        _insert(kind, iv, st, aux, base, k)
        return -1
    v = _victim_unpinned(kind, iv, st, aux, base, k)
    if v < 0 or v == k:
        return k
    _remove(kind, iv, st, base, v)
    _insert(kind, iv, st, aux, base, k)
    return v


@kernel
def _put(kind, iv, st, aux, base, pins, k, cap):
    """``_place`` with the keys in ``pins`` (an int64 array) pinned."""
    hi = base + iv.shape[1]
    for p in pins:
        if base <= p < hi:
            iv[W, p - base] |= BLOCKED
    v = _place(kind, iv, st, aux, base, k, cap)
    for p in pins:
        if base <= p < hi:
            iv[W, p - base] &= ~BLOCKED
    return v


@kernel
def _fill(kind, iv, st, aux, base, cap, k, log, n):
    """``_place`` of k, logged (0, k): a free slot; (1, k): refused; (2, k, v): v replaced. Returns the log's
    length."""
    v = _place(kind, iv, st, aux, base, k, cap)
    log[1, n] = k
    if v == -1:
        log[0, n] = 0
        iv[W, k - base] |= _CRAM
    elif v == k:
        log[0, n] = 1
        iv[W, k - base] &= ~(_CRAM | _COTHER)
    else:
        log[0, n], log[2, n] = 2, v
        iv[W, v - base] &= ~_CRAM
        iv[W, k - base] |= _CRAM
    return n + 1


@kernel
def _feed(kind, iv, st, aux, base, cap, seq, states, hits, reads, blocked, ram, log):
    """token_feed's flush in one call: each of ``seq`` in turn is filled when read this layer (first occurrence) or
    used this layer and absent, or hit when in RAM (``states``: each one's ledger state, -1 absent; ``ram``: the
    state RAM; ``hits`` and ``reads`` lie within ``seq``). Logs (0, k): k took a free slot; (1, k): k refused; (2, k,
    v): k replaced v. Returns (the log's length, -1), or (its length, t) when ``seq[t]`` was read but the ledger
    holds it; (-1, -1), nothing done, when a key of ``seq`` or ``blocked`` lies outside the arrays."""
    for a in (seq, blocked):
        for k in a:
            if k < base or k >= base + iv.shape[1]:
                return -1, -1
    for t in range(len(seq)):
        s = states[t]
        iv[W, seq[t] - base] = _CRAM if s == ram else 0 if s < 0 else _COTHER
    for k in hits:
        iv[W, k - base] |= _USED
    for k in reads:
        iv[W, k - base] |= _READ
    for k in blocked:
        iv[W, k - base] |= BLOCKED
    n, err = 0, -1
    for t in range(len(seq)):
        k = seq[t]
        w = iv[W, k - base]
        if w & _READ:
            iv[W, k - base] = (w & ~_READ) | _USED
            if w & (_CRAM | _COTHER):
                err = t
                break
            n = _fill(kind, iv, st, aux, base, cap, k, log, n)
        elif w & _USED:
            if w & _CRAM:
                _access(kind, iv, st, aux, base, k)
            elif not w & _COTHER:
                n = _fill(kind, iv, st, aux, base, cap, k, log, n)
    for a in (seq, blocked):
        for k in a:
            iv[W, k - base] = 0
    return n, err


class Machine:
    __slots__ = ("m", "kind", "capacity", "name")

    def __init__(self, machine, name: str):
        self.m = machine
        self.kind = KINDS[machine.KIND]
        self.capacity = machine.capacity
        self.name = name

    def __contains__(self, k):
        m = self.m
        j = k - m.base
        return 0 <= j < m.iv.shape[1] and (0 <= m.iv[Q, j] < RESIDENT or m.iv[OQ, j] == ORPH)

    def __len__(self):
        return int(_size(self.m.st))

    def _keys(self, orphans: bool) -> list:
        m = self.m
        out = np.empty(len(self), dtype=np.int64)
        return out[:_order(self.kind, m.iv, m.st, m.base, out, orphans)].tolist()

    def resident(self) -> set:
        """The machine's own keys (the reference's resident set), orphans left out."""
        return set(self._keys(False))

    def insert(self, k):
        m = self.m
        m.fit(k, k)
        _insert(self.kind, m.iv, m.st, m.aux, m.base, k)

    def hit(self, k):
        m = self.m
        m.fit(k, k)
        _access(self.kind, m.iv, m.st, m.aux, m.base, k)

    def remove(self, k):
        m = self.m
        if 0 <= k - m.base < m.iv.shape[1]:
            _remove(self.kind, m.iv, m.st, m.base, k)

    def put(self, k, pins, cap=None):
        """``k`` enters a tier of ``cap`` slots (default: the capacity) whose pins are ``pins`` (an int64 array), in
        one compiled call: -1 when it took a free slot, the key it evicted, or ``k`` itself when the machine kept it
        out or every resident key is pinned (nothing changed)."""
        m = self.m
        m.fit(k, k)
        return int(_put(self.kind, m.iv, m.st, m.aux, m.base, pins, k, self.capacity if cap is None else cap))

    def victim(self, k, ok):
        m, kk = self.m, -1 if k is None else k
        if k is not None:
            m.fit(k, k)
        if _begin(self.kind, m.iv, m.st, m.aux, m.base, kk):
            return k
        for o in self._keys(True):
            if o != kk and ok(o):
                return o
        _end(self.kind, m.iv, m.st, m.base, kk)
        return None


def feed(pol, cap: int, seq, states, hits, reads, blocked, ram: int):
    """``_feed`` over ``pol`` (a Machine, or a Sieve; int64 arrays of keys, ``states`` one per ``seq``, ``hits`` and
    ``reads`` within ``seq``): (the log as (event, k, v) rows, the position in ``seq`` of a read the ledger already
    holds, or -1)."""
    m = pol.m
    kind = KINDS[m.KIND]
    log = np.empty((3, len(seq)), dtype=np.int64)
    n, err = _feed(kind, m.iv, m.st, m.aux, m.base, cap, seq, states, hits, reads, blocked, ram, log)
    if n < 0:                            # the arrays grow to the layer's keys once
        m.fit(int(min(seq.min(), blocked.min(initial=seq[0]))), int(max(seq.max(), blocked.max(initial=seq[0]))))
        n, err = _feed(kind, m.iv, m.st, m.aux, m.base, cap, seq, states, hits, reads, blocked, ram, log)
    return log[:, :n].T.tolist() if n else (), err
