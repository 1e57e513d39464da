"""2Q, the full version (Johnson and Shasha, VLDB 1994), as libCacheSim's TwoQ.c runs it.

A1in: FIFO of keys seen once, Kin = int(a1 x capacity) slots' worth; A1out: ghost FIFO of keys evicted from A1in,
Kout = int(ghost x capacity) keys; Am: LRU of the rest. A request for a key in Am moves it to Am's most recent end;
in A1in does nothing; otherwise the key is looked up (and removed) in A1out *before* any space is reclaimed, then,
when the tier is full, A1in's oldest key is evicted into A1out if A1in holds more than Kin keys, else Am's least
recent; the key then enters Am if it was in A1out, else A1in. Parameters (libCacheSim's Ain-size-ratio and
Aout-size-ratio): ``a1`` (default 0.25, 0 < a1 < 1) and ``ghost`` (default 0.5, 0..4). Run as a tier policy through
moetier.core.policies.machine. Pure.

Array state (moetier.core.policies.queues): A1in is queue ``A1IN``, Am ``AM``, A1out the ghost queue; ``st[KIN]``
and ``st[KOUT]`` the two sizes. ``access`` is a kernel (moetier.core.jit).
"""
from __future__ import annotations

from moetier.core.jit import kernel

from moetier.core.policies.queues import CAP, GHOST, Q, S0, State, drop, length, pop, push, to_end, unlink
from moetier.core.policies.spec import ratio, share

__all__ = ["TwoQ", "PARAMS", "access", "queues"]

PARAMS = {"a1": (0.25, ratio, "a share of the tier, 0 < a1 < 1"),
          "ghost": (0.5, share, "a share of the tier, 0 to 4")}
A1IN, AM = 0, 1
KIN, KOUT = S0, S0 + 1


class TwoQ(State):
    KIND = "2q"
    QUEUES = {"a1in": A1IN, "am": AM, "a1out": GHOST}

    def __init__(self, capacity: int, a1: float = 0.25, ghost: float = 0.5):
        super().__init__(capacity)
        self.st[KIN], self.st[KOUT] = int(capacity * a1), int(capacity * ghost)


@kernel
def queues(st):
    """The resident queues in eviction order: A1in first while it is over its share."""
    if length(st, A1IN) > st[KIN]:
        return A1IN, AM, -1
    return AM, A1IN, -1


@kernel
def access(iv, st, base, k):
    q = iv[Q, k - base]
    if q == AM:
        to_end(iv, st, base, k)
        return
    if q == A1IN:
        return
    ghost_hit = q == GHOST
    if ghost_hit:
        unlink(iv, st, base, Q, k)
    if length(st, A1IN) + length(st, AM) >= st[CAP]:
        if length(st, A1IN) > st[KIN]:
            y = pop(iv, st, base, A1IN)
            if st[KOUT]:
                push(iv, st, base, Q, GHOST, y)
                if length(st, GHOST) > st[KOUT]:
                    pop(iv, st, base, GHOST)
            drop(iv, st, base, y)
        elif length(st, AM):
            drop(iv, st, base, pop(iv, st, base, AM))
    push(iv, st, base, Q, AM if ghost_hit else A1IN, k)
