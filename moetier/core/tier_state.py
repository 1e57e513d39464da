"""The ledger's residency state as flat arrays, and the Python views its readers use.

Contract
--------
One ``TierState(keys, vram_slots)`` holds everything the ledger's compiled commit (moetier.core.commit_kernel)
and its Python ticket path share; both read and write the same buffers, so there is one state, not a copy:

    st      bytearray(keys)        each key's state code (moetier.core.tickets; ABSENT = 0)
    inram   bytearray(keys)        1 where the key holds a RAM slot (the RAM tier)
    link    array('q', 2(keys+1))  the RAM tier's order, oldest first, as a doubly linked list: prev at [0, keys],
                                   next at [keys + 1, 2 keys + 1]; index ``keys`` is the list's head and tail
    owner   array('q', vram_slots) the key in each VRAM slot (-1: free)
    ref     bytearray(vram_slots)  CLOCK's reference bits
    slot    array('q', keys)       each key's VRAM slot (-1: none)
    meta    array('q', M_N)        the CLOCK hand, the tiers' fill counts, the counters the kernel adds to (the
                                   ledger folds them into its ``counters``), a failing key

bytearray and array('q') index from Python about as fast as a dict; numba reads the same memory through
``np.frombuffer`` (``views()``, made once: the buffers never resize). ``States``, ``RamTier`` and ``SlotMap`` are
the mapping / set views over them that the ledger's readers (the runtime, the adapters, the tests) use: the
``state`` dict, the ``ram`` ordered set and the ``slot_of`` dict of before, with the same answers.
"""
from __future__ import annotations

from array import array

import numpy as np

__all__ = ["TierState", "States", "RamTier", "SlotMap", "M_HAND", "M_VRAM_N", "M_RAM_N", "M_VRAM_EV", "M_RAM_EV",
           "M_REFUSED", "M_BAD", "M_LFU_EV", "M_N", "COUNTERS"]

# meta cells
M_HAND, M_VRAM_N, M_RAM_N, M_VRAM_EV, M_RAM_EV, M_REFUSED, M_BAD, M_LFU_EV, M_N = range(9)
# the ledger's counters the kernel adds to, by meta cell
COUNTERS = ((M_VRAM_EV, "vram_evictions"), (M_RAM_EV, "ram_evictions"), (M_REFUSED, "refused_admissions"),
            (M_LFU_EV, "lfu_evictions"))


class TierState:
    """The buffers (module docstring) of a ledger over ``keys`` keys and ``vram_slots`` VRAM slots."""

    __slots__ = ("keys", "st", "inram", "link", "owner", "ref", "slot", "meta", "_views")

    def __init__(self, keys: int, vram_slots: int):
        self.keys = keys
        self.st = bytearray(keys)
        self.inram = bytearray(keys)
        self.link = array("q", [keys]) * (2 * (keys + 1))     # empty list: the head points at itself both ways
        self.owner = array("q", [-1]) * vram_slots
        self.ref = bytearray(vram_slots)
        self.slot = array("q", [-1]) * keys
        self.meta = array("q", bytes(8 * M_N))
        self._views = None

    def views(self) -> tuple:
        """(st, inram, link, owner, ref, slot, meta) as numpy arrays over the same memory."""
        if self._views is None:
            u8, i8 = np.uint8, np.int64
            self._views = (np.frombuffer(self.st, u8), np.frombuffer(self.inram, u8), np.frombuffer(self.link, i8),
                           _view(self.owner, i8), _view(self.ref, u8), np.frombuffer(self.slot, i8),
                           np.frombuffer(self.meta, i8))
        return self._views


def _view(buf, dtype) -> np.ndarray:
    return np.frombuffer(buf, dtype) if len(buf) else np.empty(0, dtype)


class States:
    """Each key's state as the dict of before: ABSENT keys are not in it."""

    __slots__ = ("st",)

    def __init__(self, st: bytearray):
        self.st = st

    def get(self, k, default=None):
        s = self.st[k]
        return s if s else default

    def __getitem__(self, k):
        s = self.st[k]
        if not s:
            raise KeyError(k)
        return s

    def __setitem__(self, k, v):
        self.st[k] = v

    def __delitem__(self, k):
        if not self.st[k]:
            raise KeyError(k)
        self.st[k] = 0

    def pop(self, k, default=None):
        s = self.st[k]
        self.st[k] = 0
        return s if s else default

    def __contains__(self, k):
        return 0 <= k < len(self.st) and self.st[k] != 0

    def keys(self) -> list:
        return np.flatnonzero(np.frombuffer(self.st, np.uint8)).tolist()

    __iter__ = lambda self: iter(self.keys())

    def values(self) -> list:
        v = np.frombuffer(self.st, np.uint8)
        return v[v != 0].tolist()

    def items(self) -> list:
        return list(zip(self.keys(), self.values()))

    def __len__(self):
        return int(np.count_nonzero(np.frombuffer(self.st, np.uint8)))

    def __bool__(self):
        return self.st.count(0) != len(self.st)

    def __eq__(self, other):
        if isinstance(other, States):
            return self.st == other.st
        return dict(self.items()) == other

    def __repr__(self):
        return f"States({dict(self.items())})"


class RamTier:
    """The RAM tier's keys in eviction order (oldest first): the ordered set of before. ``add`` puts a key at the
    most recent end, ``move_to_end`` moves it there, ``remove`` takes it out."""

    __slots__ = ("inram", "link", "meta", "head")

    def __init__(self, ts: TierState):
        self.inram, self.link, self.meta, self.head = ts.inram, ts.link, ts.meta, ts.keys

    def __contains__(self, k):
        return 0 <= k < self.head and self.inram[k] != 0

    def __len__(self):
        return self.meta[M_RAM_N]

    def __bool__(self):
        return self.meta[M_RAM_N] != 0

    def __iter__(self):
        nxt, h = self.link, self.head
        k = nxt[h + 1 + h]
        while k != h:
            yield k
            k = nxt[h + 1 + k]

    def add(self, k):
        link, h = self.link, self.head
        last = link[h]
        link[k], link[h + 1 + k] = last, h
        link[h + 1 + last] = k
        link[h] = k
        self.inram[k] = 1
        self.meta[M_RAM_N] += 1

    def remove(self, k):
        link, h = self.link, self.head
        p, n = link[k], link[h + 1 + k]
        link[h + 1 + p] = n
        link[n] = p
        self.inram[k] = 0
        self.meta[M_RAM_N] -= 1

    def move_to_end(self, k):
        if not self.inram[k]:
            raise KeyError(k)
        self.remove(k)
        self.add(k)

    def first(self) -> int:
        """The oldest key, or -1 when the tier is empty."""
        h = self.head
        k = self.link[2 * h + 1]
        return -1 if k == h else k

    def __repr__(self):
        return f"RamTier({list(self)})"


class SlotMap:
    """Each VRAM key's slot as the dict of before."""

    __slots__ = ("slot", "meta")

    def __init__(self, ts: TierState):
        self.slot, self.meta = ts.slot, ts.meta

    def __getitem__(self, k):
        s = self.slot[k]
        if s < 0:
            raise KeyError(k)
        return s

    def get(self, k, default=None):
        s = self.slot[k]
        return default if s < 0 else s

    def __setitem__(self, k, s):
        if self.slot[k] < 0:
            self.meta[M_VRAM_N] += 1
        self.slot[k] = s

    def pop(self, k):
        s = self.slot[k]
        if s < 0:
            raise KeyError(k)
        self.slot[k] = -1
        self.meta[M_VRAM_N] -= 1
        return s

    __delitem__ = pop

    def __contains__(self, k):
        return 0 <= k < len(self.slot) and self.slot[k] >= 0

    def __len__(self):
        return self.meta[M_VRAM_N]

    def __bool__(self):
        return self.meta[M_VRAM_N] != 0

    def keys(self) -> list:
        return np.flatnonzero(np.frombuffer(self.slot, np.int64) >= 0).tolist() if len(self.slot) else []

    __iter__ = lambda self: iter(self.keys())

    def values(self) -> list:
        return [self.slot[k] for k in self.keys()]

    def items(self) -> list:
        return [(k, self.slot[k]) for k in self.keys()]

    def __eq__(self, other):
        return dict(self.items()) == (dict(other.items()) if isinstance(other, SlotMap) else other)

    def __repr__(self):
        return f"SlotMap({dict(self.items())})"
