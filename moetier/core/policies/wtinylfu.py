"""W-TinyLFU (Einziger, Friedman and Manes, ACM TOS 2017) as Caffeine's simulator runs it (WindowTinyLfuPolicy).

A window LRU of capacity - int((1 - window) x capacity) slots in front of a main SLRU (probation, and protected of
int(protected x main) slots); a frequency sketch (moetier.core.policies.sketch) records every request. A miss enters
the window's most recent end; when the window then holds more than its share, its least recent key (the candidate)
moves to probation's most recent end, and when the tier then holds more than its capacity, the candidate stays only
if its estimated frequency is strictly greater than that of probation's least recent key (the victim), which is
evicted instead; otherwise the candidate is. While the tier warms the window fills first and its overflow fills main,
as in Caffeine (nothing waits for the tier to be full). A hit in the window or protected moves the key to its most
recent end; a hit in probation moves it to protected, whose least recent key is demoted to probation when protected
is over its share. Parameters (Caffeine's percent-main, percent-main-protected, the sketch's sample multiplier and
doorkeeper): ``window`` (default 0.01), ``protected`` (0.8), ``sample`` (10), ``doorkeeper`` (0 or 1, default 0).
Run as a tier policy through moetier.core.policies.machine. Pure.

Array state (moetier.core.policies.queues): queues ``PROB``, ``WIN``, ``PROT``; ``st[WCAP]``, ``st[PCAP]`` the
window's and protected's sizes; the sketch's counters in ``aux`` and its scalars in ``st[SK:SK + 4]``, its
doorkeeper in ``iv[D]``. ``access`` is a kernel (moetier.core.jit); ``hit_or_enter`` is the queues' part,
which kt-kernel's variant (moetier.core.policies.ktransformers) shares.
"""
from __future__ import annotations

from moetier.core.jit import kernel

from moetier.core.policies import sketch
from moetier.core.policies.queues import CAP, D, Q, S0, State, drop, length, pop, push, to_end, unlink
from moetier.core.policies.spec import count, flag, ratio

__all__ = ["WTinyLFU", "PARAMS", "access", "hit_or_enter", "evict"]

PARAMS = {"window": (0.01, ratio, "a share of the tier, 0 < window < 1"),
          "protected": (0.8, ratio, "a share of main, 0 < protected < 1"),
          "sample": (10, count, "a whole multiple of the capacity, at least 1"),
          "doorkeeper": (0, flag, "0 or 1")}
PROB, WIN, PROT = 0, 1, 2
WCAP, PCAP, SK = S0, S0 + 1, S0 + 2


class WTinyLFU(State):
    KIND = "wtinylfu"
    QUEUES = {"prob": PROB, "win": WIN, "prot": PROT}
    ORDER = (PROB, WIN, PROT)                # probation first, as Caffeine evicts

    def __init__(self, capacity: int, window: float = 0.01, protected: float = 0.8, sample: float = 10,
                 doorkeeper: float = 0):
        rows, sc = sketch.new(capacity, sample, bool(doorkeeper))
        super().__init__(capacity, rows)
        wcap = capacity - int((1.0 - window) * capacity)
        self.st[WCAP], self.st[PCAP] = wcap, int(protected * (capacity - wcap))
        self.st[SK:SK + 4] = sc


@kernel
def hit_or_enter(iv, st, base, k):
    """The queues' part of a request: a hit moves k, a miss enters the window; returns the candidate that the
    window's overflow moved to probation when the tier is then over its capacity (the caller admits it or not),
    else -1."""
    q = iv[Q, k - base]
    if q == WIN or q == PROT:
        to_end(iv, st, base, k)
        return -1
    if q == PROB:
        unlink(iv, st, base, Q, k)
        push(iv, st, base, Q, PROT, k)
        if length(st, PROT) > st[PCAP]:
            push(iv, st, base, Q, PROB, pop(iv, st, base, PROT))
        return -1
    push(iv, st, base, Q, WIN, k)
    if length(st, WIN) <= st[WCAP]:
        return -1
    cand = pop(iv, st, base, WIN)
    push(iv, st, base, Q, PROB, cand)
    if length(st, PROB) + length(st, WIN) + length(st, PROT) <= st[CAP]:
        return -1
    return cand


@kernel
def evict(iv, st, base, out):
    """``out`` (the candidate or probation's oldest key, the victim) leaves the tier."""
    unlink(iv, st, base, Q, out)
    drop(iv, st, base, out)


@kernel
def access(iv, st, aux, base, k):
    sc = st[SK:SK + 4]
    sketch.add(aux, sc, iv[D], base, k)
    cand = hit_or_enter(iv, st, base, k)
    if cand < 0:
        return
    vict = st[3 * PROB]
    admit = sketch.estimate(aux, sc, iv[D], base, cand) > sketch.estimate(aux, sc, iv[D], base, vict)
    evict(iv, st, base, vict if admit else cand)
