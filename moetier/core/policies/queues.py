"""The array state of a cache written as its authors wrote it (moetier.core.policies.machine): index-linked queues
over the keys, compiled with Numba.

Contract
--------
A machine's state is three arrays: ``iv`` (int64, ``ROWS`` rows, one column per key ``base + j``), ``st`` (int64
scalars: the queues' ends and lengths, the machine's parameters and counters) and ``aux`` (int64, a machine's own
table: W-TinyLFU's sketch). Columns hold keys, not column numbers, so the arrays can grow on either side (``State``).

    iv[Q, j]   the queue key j is in (-1: none)      iv[OQ, j]  ORPH when the tier holds j as an orphan, else -1
    iv[P, j]   the key before it (older), -1 first   iv[OP, j]  the same, in the orphans' queue
    iv[N, j]   the key after it (newer), -1 last     iv[ON, j]
    iv[F, j]   a per-key count or bit (S3-FIFO's, kt-kernel's W-TinyLFU's exact count, SIEVE's visited bit)
    iv[D, j]   the sketch's doorkeeper bit           iv[W, j]   scratch of one batched call (``BLOCKED``: mid-push),
                                                            0 between calls
    st[3q], st[3q + 1], st[3q + 2]   queue q's oldest key, newest key (-1 when empty) and length, q < 8

Queues 0 to 3 hold resident keys (``RESIDENT`` of them), queue ``GHOST`` a ghost list of keys evicted (in the
same links: a key is in one of them at most), and queue ``ORPH`` (its own links, ``OQ``..``ON``: an evicted key may
be an orphan and a ghost at once) the keys a machine dropped while the tier still holds them. ``st[PEND]`` is the
key ``victim`` already accessed (-1: none), ``st[CAP]`` the capacity, ``st[S0:ORDER]`` each machine's own parameters
and counters (its module names them), ``st[ORDER:]`` its resident queues in eviction order (the class's ``ORDER``,
-1 where it has fewer). ``push`` / ``pop`` / ``unlink`` / ``to_end`` are OrderedDict's ``d[k] = None``
(k not in it), ``popitem(last=False)``, ``pop(k)`` and ``move_to_end(k)``. Pure.
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel

__all__ = ["State", "blank", "push", "pop", "unlink", "to_end", "length", "resident", "drop", "Q", "P", "N", "F", "D",
           "OQ", "W", "ROWS", "GHOST", "ORPH", "RESIDENT", "PEND", "CAP", "S0", "ORDER", "BLOCKED"]

Q, P, N, F, D, OQ, OP, ON, W = range(9)
ROWS = 9
_FILL = (-1, -1, -1, 0, 0, -1, -1, -1, 0)      # each row's value for a key never seen
RESIDENT, GHOST, ORPH = 4, 4, 7
BLOCKED = 4                                     # iv[W]: the key is mid-push, no victim (a batched call's pins)
PEND, CAP, S0, ORDER = 24, 25, 26, 37
_SLOTS = 40


def blank(width: int, parts: int = 1) -> np.ndarray:
    """``iv`` of ``parts`` machines, each ``width`` keys none of which has been seen: shape (parts, ROWS, width)."""
    return np.array(_FILL, dtype=np.int64)[None, :, None].repeat(parts, 0).repeat(width, 2)


@kernel
def push(iv, st, base, g, q, k):
    """k joins queue q (links ``g``: Q or OQ) at its newest end."""
    j = k - base
    t = st[3 * q + 1]
    iv[g, j], iv[g + 1, j], iv[g + 2, j] = q, t, -1
    if t >= 0:
        iv[g + 2, t - base] = k
    else:
        st[3 * q] = k
    st[3 * q + 1] = k
    st[3 * q + 2] += 1


@kernel
def unlink(iv, st, base, g, k):
    """k leaves its queue (links ``g``); nothing when it is in none."""
    j = k - base
    q = iv[g, j]
    if q < 0:
        return
    p, n = iv[g + 1, j], iv[g + 2, j]
    if p >= 0:
        iv[g + 2, p - base] = n
    else:
        st[3 * q] = n
    if n >= 0:
        iv[g + 1, n - base] = p
    else:
        st[3 * q + 1] = p
    st[3 * q + 2] -= 1
    iv[g, j] = -1


@kernel
def pop(iv, st, base, q):
    """Queue q's oldest key, removed; -1 when q is empty."""
    k = st[3 * q]
    if k >= 0:
        unlink(iv, st, base, Q, k)
    return k


@kernel
def to_end(iv, st, base, k):
    """k moves to its queue's newest end."""
    q = iv[Q, k - base]
    unlink(iv, st, base, Q, k)
    push(iv, st, base, Q, q, k)


@kernel
def length(st, q):
    return st[3 * q + 2]


@kernel
def resident(iv, base, k):
    """k is in one of the machine's resident queues."""
    q = iv[Q, k - base]
    return 0 <= q < RESIDENT


@kernel
def drop(iv, st, base, k):
    """The machine dropped k: the tier keeps it as an orphan until it needs the slot (once: a key already an orphan
    keeps its place, as an OrderedDict's assignment does)."""
    if iv[OQ, k - base] != ORPH:
        push(iv, st, base, OQ, ORPH, k)


class State:
    """A machine's arrays and the keys they cover, ``[base, base + width)``, grown on demand (``fit``), except once
    ``stacked`` (views into a ledger's compiled state, moetier.core.tier_ops: grown, they would leave it)."""

    stacked = False

    def __init__(self, capacity: int, aux=None):
        self.capacity = capacity
        self.base, self.iv = 0, np.empty((ROWS, 0), dtype=np.int64)
        self.st = np.full(_SLOTS, -1, dtype=np.int64)
        self.st[2:3 * ORPH + 3:3] = 0
        self.st[CAP] = capacity
        self.st[ORDER:ORDER + len(self.ORDER)] = self.ORDER
        self.aux = np.zeros((1, 1), dtype=np.int64) if aux is None else aux

    def fit(self, lo: int, hi: int) -> None:
        """Make the arrays cover keys ``lo`` to ``hi`` (inclusive)."""
        base, width = self.base, self.iv.shape[1]
        if width and base <= lo and hi < base + width:
            return
        if lo < 0:
            raise ValueError(f"residency policy: key {lo} is negative")
        if self.stacked:
            raise ValueError(f"residency policy: keys {lo}..{hi} outside a stacked part's {base}..{base + width - 1}")
        if not width:
            nb, top = lo - lo % 64, hi + 1
        else:
            nb, top = min(lo, base), max(hi + 1, base + width)
        nw = max(2 * width, top - nb, 64)
        if width and lo < base:           # growing down: all the new room below, so a descending run grows it once
            nb = max(0, top - nw)
        iv = blank(nw)[0]
        iv[:, base - nb:base - nb + width] = self.iv
        self.base, self.iv = nb, iv

    def __len__(self):
        st = self.st
        return int(sum(st[3 * q + 2] for q in range(RESIDENT)))

    def queue(self, q: int) -> list:
        """Queue q's keys, oldest first."""
        out, k, iv, base = [], int(self.st[3 * q]), self.iv, self.base
        g = OQ if q == ORPH else Q
        while k >= 0:
            out.append(k)
            k = int(iv[g + 2, k - base])
        return out

    def __contains__(self, k):
        j = k - self.base
        return 0 <= j < self.iv.shape[1] and 0 <= self.iv[Q, j] < RESIDENT

    def __getattr__(self, name):
        """A queue by the name its module gives it (``QUEUES``), as a list of keys, oldest first."""
        q = type(self).QUEUES.get(name)
        if q is None:
            raise AttributeError(name)
        return self.queue(q)

    QUEUES: dict = {}
    ORDER: tuple = ()
