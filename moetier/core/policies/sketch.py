"""The frequency sketch of TinyLFU (Einziger, Friedman and Manes): a count-min sketch of 4-bit counters with a
periodic reset, as Caffeine's simulator keeps it (CountMin4, periodic reset), and an optional doorkeeper.

Contract: ``new(capacity, sample=10, doorkeeper=False) -> (rows, sc)``; ``add(rows, sc, door, base, k)`` records
one use, ``estimate(rows, sc, door, base, k)`` the estimated uses since the last resets. Four rows of ``width`` = the
next power of two >= 4 x capacity counters each; row i of key k is ``((k * A[i] + B[i]) mod 2**64) >> (64 -
log2(width))`` (multiply-shift hashing, fixed odd constants below). ``add`` raises each of the key's four counters
below 15 by one and, when it raised any, counts an addition; after ``sample`` x capacity additions every counter is
halved and the count becomes (count - odd // 4) // 2 (odd: the counters that were odd, whose halves were rounded
down), Caffeine's reset. With the doorkeeper a key's first use since the last reset only enters the doorkeeper (an
exact set here: a Bloom filter with no false positives) and ``estimate`` adds 1 for a key in it; the reset empties
it. Pure.

Array state: ``rows`` int64 (4, width), the counters; ``sc`` int64 (4,): the shift, the additions' limit, the
additions and the doorkeeper's switch; ``door``: a 0/1 per key ``base + j`` (the machine's ``iv[D]``). ``add`` and
``estimate`` are kernels (moetier.core.jit), called from the machine's compiled ``access``.
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel

__all__ = ["new", "add", "estimate", "HASH_A", "HASH_B"]

HASH_A = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
HASH_B = (0x632BE59BD9B4E019, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, 0x94D049BB133111EB)
_A = np.array(HASH_A, dtype=np.uint64)
_B = np.array(HASH_B, dtype=np.uint64)
SHIFT, LIMIT, ADDITIONS, DOOR = range(4)


def new(capacity: int, sample: float = 10, doorkeeper: bool = False):
    """(rows, sc) of an empty sketch for a tier of ``capacity`` keys."""
    width = 1
    while width < 4 * max(1, capacity):
        width <<= 1
    sc = np.array([64 - (width.bit_length() - 1), max(1, int(sample * max(1, capacity))), 0, int(bool(doorkeeper))],
                  dtype=np.int64)
    return np.zeros((4, width), dtype=np.int64), sc


@kernel
def _cell(sc, k, i):
    # the width is at least 4, so the shift is at most 62
    return np.int64((np.uint64(k) * _A[i] + _B[i]) >> np.uint64(sc[SHIFT]))


@kernel
def estimate(rows, sc, door, base, k):
    e = rows[0, _cell(sc, k, 0)]
    for i in range(1, 4):
        e = min(e, rows[i, _cell(sc, k, i)])
    return e + (1 if sc[DOOR] and door[k - base] else 0)


@kernel
def add(rows, sc, door, base, k):
    added = False
    if sc[DOOR] and not door[k - base]:
        door[k - base] = 1
        added = True
    else:
        for i in range(4):
            c = _cell(sc, k, i)
            if rows[i, c] < 15:
                rows[i, c] += 1
                added = True
    if added:
        sc[ADDITIONS] += 1
        if sc[ADDITIONS] >= sc[LIMIT]:
            _reset(rows, sc, door)


@kernel
def _reset(rows, sc, door):
    odd = 0
    for i in range(4):
        for c in range(rows.shape[1]):
            odd += rows[i, c] & 1
            rows[i, c] >>= 1
    sc[ADDITIONS] = (sc[ADDITIONS] - odd // 4) // 2
    door[:] = 0
