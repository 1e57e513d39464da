"""LRU and FIFO (``lru``, ``fifo``) over the array state of moetier.core.policies.lfu, compiled with it.

Contract
--------
The LFU's interface and arrays (insert / hit / remove / victim, ``hit_many``, ``replace``, ``evict_for``, ``put``),
ordered by the ticks alone: the count is left out (``st[2]`` says so), so the least (score, tick, key) is the least
tick. ``lru``: every use is a tick, the least recently used key goes first. ``fifo``: only an entry is; a resident
key's use leaves the order as it is, the first key in goes first. ``victim(k, ok)`` returns the first key in that
order with ``ok(key)``, as a queue scanned from its old end would.

Why not a queue of its own: over the same arrays the ledger's compiled commit (moetier.core.commit_kernel) and the
compiled step loop cover an LRU or FIFO tier, global or split per layer, as they cover an LFU one; a heap costs
O(log n) a use where a linked queue costs O(1), inside one compiled call either way.
"""
from __future__ import annotations

from moetier.core.policies import lfu

__all__ = ["LRU", "FIFO"]


class LRU(lfu.LFU):
    """Least recently used first."""
    ORDER, NAME = lfu.LRU, "lru"

    def __init__(self, capacity: int, base: int = 0, width: int = 64):
        super().__init__(capacity, 0.0, base, width)
        self.name = self.NAME
        self.st[2] = self.ORDER


class FIFO(LRU):
    """First in, first out: a use does not move a key."""
    ORDER, NAME = lfu.FIFO, "fifo"
