"""The frequency sketch of TinyLFU (Einziger, Friedman and Manes): a count-min sketch of 4-bit counters with a
periodic reset, as Caffeine's simulator keeps it (CountMin4, periodic reset), and an optional doorkeeper.

Contract: ``Sketch(capacity, sample=10, doorkeeper=False)``; ``add(k)`` records one use, ``estimate(k)`` the
estimated uses since the last resets. Four rows of ``width`` = the next power of two >= 4 x capacity counters each;
row i of key k is ``((k * A[i] + B[i]) mod 2**64) >> (64 - log2(width))`` (multiply-shift hashing, fixed odd
constants below). ``add`` raises each of the key's four counters below 15 by one and, when it raised any, counts an
addition; after ``sample`` x capacity additions every counter is halved and the count becomes (count - odd // 4) // 2
(odd: the counters that were odd, whose halves were rounded down), Caffeine's reset. With the doorkeeper a key's first
use since the last reset only enters the doorkeeper (an exact set here: a Bloom filter with no false positives) and
``estimate`` adds 1 for a key in it; the reset empties it. Pure.
"""
from __future__ import annotations

__all__ = ["Sketch", "HASH_A", "HASH_B"]

_M64 = (1 << 64) - 1
HASH_A = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
HASH_B = (0x632BE59BD9B4E019, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, 0x94D049BB133111EB)


class Sketch:
    __slots__ = ("rows", "shift", "limit", "additions", "door", "use_door")

    def __init__(self, capacity: int, sample: float = 10, doorkeeper: bool = False):
        width = 1
        while width < 4 * max(1, capacity):
            width <<= 1
        self.shift = 64 - (width.bit_length() - 1)
        self.rows = [bytearray(width) for _ in range(4)]
        self.limit = max(1, int(sample * max(1, capacity)))
        self.additions = 0
        self.use_door = bool(doorkeeper)
        self.door: set = set()

    def _cells(self, k):
        s = self.shift
        if s == 64:
            return (0, 0, 0, 0)
        return tuple(((k * a + b) & _M64) >> s for a, b in zip(HASH_A, HASH_B))

    def estimate(self, k) -> int:
        rows = self.rows
        e = min(rows[i][c] for i, c in enumerate(self._cells(k)))
        return e + (1 if self.use_door and k in self.door else 0)

    def add(self, k) -> None:
        if self.use_door and k not in self.door:
            self.door.add(k)
            added = True
        else:
            added = False
            for row, c in zip(self.rows, self._cells(k)):
                if row[c] < 15:
                    row[c] += 1
                    added = True
        if added:
            self.additions += 1
            if self.additions >= self.limit:
                self._reset()

    def _reset(self):
        odd = 0
        for row in self.rows:
            for i, v in enumerate(row):
                odd += v & 1
                row[i] = v >> 1
        self.additions = (self.additions - odd // 4) // 2
        self.door.clear()
