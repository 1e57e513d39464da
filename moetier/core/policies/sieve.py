"""SIEVE (Zhang et al., NSDI 2024) as libCacheSim's Sieve.c runs it: one FIFO queue with a visited bit and a hand.

New keys enter at the head (newest end) unvisited; a hit only sets the key's bit. To free a slot the hand walks from
where it stopped (from the tail, the oldest key, when it has no place) toward the head, clearing set bits, wrapping
from the head to the tail, and evicts the first unvisited key; it then stops at the next newer key. No parameters.
It runs the tier protocol directly (insert, hit, remove, victim): a pinned key is passed over as it is, bit kept.
Pure.

Array state (moetier.core.policies.queues): the queue ``SQ`` (oldest first), the visited bits ``iv[F]``, the hand
``st[HAND]`` (a key, -1: none). ``insert``, ``remove`` and the hand's ``walk`` are kernels (moetier.core.jit);
``victim(k, ok)`` resumes the walk after each key whose ``ok`` it has to ask.
"""
from __future__ import annotations

from moetier.core.jit import kernel

from moetier.core.policies.queues import BLOCKED, F, N, Q, S0, W, State, length, push, unlink

__all__ = ["Sieve", "PARAMS", "insert", "remove", "walk"]

PARAMS: dict = {}
SQ = 0
HAND = S0


class Sieve(State):
    """FIFO order with a visited bit; the hand walks from the oldest key toward the newest (wrapping), clearing
    bits, evicts the first unvisited key and stays at the next newer one. Pinned keys are passed over as they are."""
    name = "sieve"
    KIND = "sieve"
    QUEUES = {"queue": SQ}

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.st[HAND] = -1
        self.m = self                        # the state moetier.core.policies.machine's feed runs on

    def insert(self, k):
        self.fit(k, k)
        insert(self.iv, self.st, self.base, k)

    def hit(self, k):
        j = k - self.base
        if 0 <= j < self.iv.shape[1]:
            self.iv[F, j] = 1

    def remove(self, k):
        if 0 <= k - self.base < self.iv.shape[1]:
            remove(self.iv, self.st, self.base, k)

    def victim(self, k, ok):
        st = self.st
        x, i, decided = int(st[HAND] if st[HAND] >= 0 else st[SQ]), 0, -1
        while True:
            code, x, i = walk(self.iv, st, self.base, x, i, decided, True)
            if code != 2:
                return x if code == 0 else None
            decided = int(bool(ok(x)))


@kernel
def insert(iv, st, base, k):
    push(iv, st, base, Q, SQ, k)
    iv[F, k - base] = 0


@kernel
def remove(iv, st, base, k):
    j = k - base
    if iv[Q, j] != SQ:
        return
    if st[HAND] == k:
        st[HAND] = iv[N, j]
    unlink(iv, st, base, Q, k)


@kernel
def walk(iv, st, base, x, i, decided, ask):
    """The hand's walk from key x at step i (of at most 2 x resident + 1): ``decided`` is x's ``ok`` when known (1
    or 0, -1: not yet). Returns (0, the victim, i) with the hand past it, (1, -1, i) when there is none, or, with
    ``ask``, (2, x, i) when it needs x's ``ok`` (call again with it); without ``ask`` a key may go unless it is
    marked mid-push (moetier.core.policies.machine's feed)."""
    steps = 2 * length(st, SQ) + 1
    while i < steps:
        if x < 0:
            return 1, -1, i
        j = x - base
        if decided < 0:
            if ask:
                return 2, x, i
            decided = 0 if iv[W, j] & BLOCKED else 1
        if decided:
            if not iv[F, j]:
                st[HAND] = iv[N, j]
                return 0, x, i
            iv[F, j] = 0
        n = iv[N, j]
        x = n if n >= 0 else st[3 * SQ]
        i += 1
        decided = -1
    return 1, -1, i
