"""Arrival statistics: when a lane that waits for reads with a spread ends, in expectation.

Contract
--------
``late(mu, sd)`` is E[max(0, mu + e)], e ~ Normal(0, sd); ``max_normal`` the mean and variance of the max of two
independent normals (Clark, 1961); ``Finish`` folds the NVMe picks of one lane (or of the serial timeline) into the
expected end of that lane given the reads' measured spread. Pure arithmetic: no records, no state beyond a Finish.
"""
from __future__ import annotations

import math

INF = float("inf")
SQRT2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def late(mu: float, sd: float) -> float:
    """E[max(0, mu + e)] for e ~ Normal(0, sd): how long a lane free at 0 expects to wait for bytes due at mu whose
    arrival spreads by sd. sd 0: the deterministic max(0, mu)."""
    if sd <= 0.0:
        return mu if mu > 0.0 else 0.0
    z = mu / sd
    return mu * 0.5 * (1.0 + math.erf(z / SQRT2)) + sd * INV_SQRT_2PI * math.exp(-0.5 * z * z)


def max_normal(m1: float, v1: float, m2: float, v2: float) -> tuple[float, float]:
    """Mean and variance of max(X, Y) for independent normals X ~ (m1, v1), Y ~ (m2, v2) (Clark, 1961)."""
    s2 = v1 + v2
    if s2 <= 0.0:
        return (m1, v1) if m1 >= m2 else (m2, v2)
    s = math.sqrt(s2)
    al = (m1 - m2) / s
    p = 0.5 * (1.0 + math.erf(al / SQRT2))
    f = s * INV_SQRT_2PI * math.exp(-0.5 * al * al)
    m = m1 * p + m2 * (1.0 - p) + f
    e2 = (m1 * m1 + v1) * p + (m2 * m2 + v2) * (1.0 - p) + (m1 + m2) * f
    v = e2 - m * m
    return m, (v if v > 0.0 else 0.0)


class Finish:
    """The end of a lane (or of the serial timeline) that computes NVMe picks in arrival order, with the reads'
    arrival spread.

    Deterministically the lane ends at max(free, due): ``free`` if no pick waited for its bytes, ``due`` the end its
    critical read sets (the latest arrival + wake-up + the work after it). A read's lateness has two parts, both
    measured by `moetier calibrate` as a fraction of the read's latency: one the reads of a layer share (they are
    issued together and are late together: the wait for a layer's first read is E[max(0, X)], 0.70 ms against
    0.03 for its mean X, and charging every read an independent spread over-predicted the stall 4-12x) and one of
    each read's own. The own parts make the due time the max of normals (folded pairwise, ``max_normal``); the
    shared part is one draw per layer, of sd cv_shared x the critical read's latency. ``extra`` is what the spread
    adds to the deterministic end, in expectation."""

    __slots__ = ("free", "due", "lat", "m", "v", "own")

    def __init__(self, free: float, own: float):
        self.free, self.due, self.lat, self.m, self.v, self.own = free, -INF, 0.0, -INF, 0.0, own

    def add(self, busy: float, ready: float, a: float) -> None:
        """A pick that keeps the lane ``busy`` ms more when its bytes are there; ``ready`` is when the lane could
        end it if it waited for them (arrival + wake-up + its work); ``a`` is its read's latency."""
        self.free += busy
        xv = (self.own * a) ** 2
        if self.due == -INF:
            self.due, self.lat, self.m, self.v = ready, a, ready, xv
            return
        self.due += busy
        if ready > self.due:
            self.due, self.lat = ready, a
        self.m, self.v = max_normal(self.m + busy, self.v, ready, xv)

    def shift(self, busy: float) -> None:
        """Time the timeline spends on something else (the serial engine's admissions) before the next pick."""
        self.free += busy
        if self.due != -INF:
            self.due += busy
            self.m += busy

    def extra(self, shared: float, lane_sd: float = 0.0) -> float:
        """``shared``: the layer's shared lateness as a fraction of the critical read's latency; ``lane_sd``: the
        lane's own lateness (ms), which races the reads the same way."""
        if self.due == -INF:
            return 0.0
        d = self.due - self.free
        sd = math.sqrt(self.v + (shared * self.lat) ** 2 + lane_sd * lane_sd)
        return late(self.m - self.free, sd) - (d if d > 0.0 else 0.0)

