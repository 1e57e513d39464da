"""The fault seam of the record reader: what a chaos run or a test does to a read, and when.

Contract
--------
``FaultPlan`` is consulted once per read (``plan(key)``) by the reader's worker and answers None or one of
``FAULT_KINDS``; ``apply_delay`` and ``want_bytes`` / ``after_read`` then carry the answer out on the real read: the
bytes are always read, and the plan damages the outcome (fewer bytes, an EIO, a flipped byte) or delays it (a slow
or stalled completion). Any callable with ``plan(key)``'s signature may stand in for a FaultPlan. Nothing here
retries: a damaged read fails, and whoever waits on it (moetier.run.waits) decides whether to read it again.
"""

from __future__ import annotations

import errno
import os
import threading

from moetier.bytes.pool import PAGE

FAULT_KINDS = ("eio", "short", "flip", "slow", "stall")


FAULT_KINDS = ("eio", "short", "flip", "slow", "stall")


class FaultPlan:
    """Fault seam consulted once per read: ``plan(key)`` -> None | "short" | "eio" | "flip" | "slow" | "stall".

    The real read always happens; the plan then damages the outcome: "short" reads one page less than the record
    (so the short-read check fires), "eio" raises OSError(EIO) after the read, "flip" flips one byte of the landed
    bytes (so the checksum check fires when the read is sampled), "slow" delays the read by ``slow_s`` seconds and
    "stall" by ``stall_s`` (a completion that does not arrive in time: the device fence stalls). ``once=True`` makes
    each key's fault fire only on its first read (so a retry succeeds). ``FaultPlan.at_rate(rate, ...)`` instead
    draws a fault for each read at random: with probability ``rate`` one of ``kinds``, else with probability
    ``stall_rate`` a stall; the draw is seeded per key and per read of that key, so a seed faults the same reads
    whatever order the workers take them in. ``fired`` lists (kind, key) in order. Any callable with the same
    signature may be passed as ``faults``.
    """

    def __init__(self, short=(), eio=(), flip=(), *, once: bool = False, flip_at: int = 0, slow=(), stall=(),
                 slow_s: float = 0.005, stall_s: float = 2.0):
        self.short = set(short)
        self.eio = set(eio)
        self.flip = set(flip)
        self.slow = set(slow)
        self.stall = set(stall)
        self.once = once
        self.flip_at = int(flip_at)
        self.slow_s = float(slow_s)
        self.stall_s = float(stall_s)
        self.rate = 0.0
        self.stall_rate = 0.0
        self.kinds: tuple = ()
        self._rng = None
        self.fired: list = []
        self._draws: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def at_rate(cls, rate: float, *, kinds=("eio", "short", "flip", "slow"), stall_rate: float = 0.0, seed: int = 0,
                slow_s: float = 0.005, stall_s: float = 2.0) -> "FaultPlan":
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad or not 0.0 <= rate <= 1.0 or not 0.0 <= stall_rate <= 1.0 - rate:
            raise ValueError(f"FaultPlan.at_rate: kinds {list(kinds)} (known {FAULT_KINDS}), rate {rate}, "
                             f"stall_rate {stall_rate}: expected known kinds and rate + stall_rate <= 1")
        plan = cls(slow_s=slow_s, stall_s=stall_s)
        plan.rate, plan.stall_rate, plan.kinds = float(rate), float(stall_rate), tuple(kinds)
        plan._rng = int(seed)
        return plan

    def _draw(self, key: int) -> float:
        """The uniform draw of this read: a function of (seed, key, how many reads of key came before), so that
        the reader's workers, whatever order they take reads in, fault the same reads on every run of a seed."""
        import random
        n = self._draws.get(key, 0)
        self._draws[key] = n + 1
        return random.Random(f"{self._rng}:{key}:{n}").random()

    def counts(self) -> dict:
        """{kind: faults fired} over every kind."""
        out = dict.fromkeys(FAULT_KINDS, 0)
        for kind, _ in self.fired:
            out[kind] += 1
        return out

    def __call__(self, key: int):
        with self._lock:
            if self._rng is not None:
                u = self._draw(key)
                name = None
                if u < self.rate and self.kinds:
                    name = self.kinds[int(u / self.rate * len(self.kinds)) % len(self.kinds)]
                elif u < self.rate + self.stall_rate:
                    name = "stall"
                if name is not None:
                    self.fired.append((name, key))
                return name
            for name, keys in (("short", self.short), ("eio", self.eio), ("flip", self.flip), ("slow", self.slow),
                               ("stall", self.stall)):
                if key in keys:
                    if self.once:
                        keys.discard(key)
                    self.fired.append((name, key))
                    return name
        return None


def held_s(faults, action) -> float:
    """How long ``action`` holds a read back (0 for no delay): a FaultPlan's slow_s / stall_s, else the defaults."""
    if action == "slow":
        return float(getattr(faults, "slow_s", 0.005))
    if action == "stall":
        return float(getattr(faults, "stall_s", 2.0))
    return 0.0


def want_bytes(action, record_bytes: int) -> int:
    """Bytes the read asks for: one page short of the record under a "short" fault (so the short-read check fires)."""
    return record_bytes - PAGE if action == "short" and record_bytes > PAGE else record_bytes


def after_read(action, view) -> None:
    """Damage a read that happened: "eio" raises OSError(EIO); "flip" flips the first landed byte of ``view()`` (a
    uint8 view of the slot) so that the checksum check fires when the read is verified."""
    if action == "eio":
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    if action == "flip":
        v = view()
        v[0] ^= 0xFF
        del v
