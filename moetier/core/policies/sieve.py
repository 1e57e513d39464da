"""SIEVE (Zhang et al., NSDI 2024) as libCacheSim's Sieve.c runs it: one FIFO queue with a visited bit and a hand.

New keys enter at the head (newest end) unvisited; a hit only sets the key's bit. To free a slot the hand walks from
where it stopped (from the tail, the oldest key, when it has no place) toward the head, clearing set bits, wrapping
from the head to the tail, and evicts the first unvisited key; it then stops at the next newer key. No parameters.
It runs the tier protocol directly (insert, hit, remove, victim): a pinned key is passed over as it is, bit kept.
Pure.
"""
from __future__ import annotations

from moetier.core.policies.base import _Queues

__all__ = ["Sieve", "PARAMS"]

PARAMS: dict = {}


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
