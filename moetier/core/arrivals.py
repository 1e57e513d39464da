"""Arrival statistics: when a lane that waits for reads with a spread ends, in expectation.

Contract
--------
``late(mu, sd)`` is E[max(0, mu + e)], e ~ Normal(0, sd); ``max_normal`` the mean and variance of the max of two
independent normals (Clark, 1961); a *finish* (``finish(free, own, two)``, then ``finish_add`` / ``finish_shift``
/ ``finish_extra``) folds the NVMe picks of one lane (or of the serial timeline) into the expected end of that
lane given the reads' measured spread. Pure arithmetic: no records, no state beyond a finish's array. Compiled
(``moetier.core.jit.kernel``): the planner's kernel (moetier.core.plan_kernel) calls them inside its one call, Python
callers through the dispatcher.

A finish is a float64 array of 7: free, due, lat, m, v, own (see ``finish``) and the exponent 2.0 that squares
through libm's pow as CPython's ``x ** 2`` does (x * x rounds differently in the last bit on about 0.1% of
values; the exponent comes from the caller's array so that the compiler cannot fold the pow into a multiply).
"""
from __future__ import annotations

import math

import numpy as np
from moetier.core.jit import kernel

INF = float("inf")
SQRT2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
FREE, DUE, LAT, M, V, OWN, TWO = range(7)


@kernel
def late(mu: float, sd: float) -> float:
    """E[max(0, mu + e)] for e ~ Normal(0, sd): how long a lane free at 0 expects to wait for bytes due at mu whose
    arrival spreads by sd. sd 0: the deterministic max(0, mu)."""
    if sd <= 0.0:
        return mu if mu > 0.0 else 0.0
    z = mu / sd
    return mu * 0.5 * (1.0 + math.erf(z / SQRT2)) + sd * INV_SQRT_2PI * math.exp(-0.5 * z * z)


@kernel
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


@kernel
def finish(free: float, own: float, two: float):
    """The end of a lane (or of the serial timeline) free at ``free`` that computes NVMe picks in arrival order,
    with the reads' arrival spread; ``own``: each read's own lateness as a fraction of its latency; ``two``: 2.0.

    Deterministically the lane ends at max(free, due): ``free`` if no pick waited for its bytes, ``due`` the end
    its critical read sets (the latest arrival + wake-up + the work after it). A read's lateness has two parts,
    both measured by `moetier calibrate` as a fraction of the read's latency: one the reads of a layer share (they
    are issued together and are late together: the wait for a layer's first read is E[max(0, X)], 0.70 ms against
    0.03 for its mean X, and charging every read an independent spread over-predicted the stall 4-12x) and one of
    each read's own. The own parts make the due time the max of normals (folded pairwise, ``max_normal``: mean m,
    variance v); the shared part is one draw per layer, of sd cv_shared x the critical read's latency (lat).
    ``finish_extra`` is what the spread adds to the deterministic end, in expectation."""
    f = np.empty(7)
    f[FREE], f[DUE], f[LAT], f[M], f[V], f[OWN], f[TWO] = free, -INF, 0.0, -INF, 0.0, own, two
    return f


@kernel
def finish_add(f, busy: float, ready: float, a: float) -> None:
    """A pick that keeps the lane ``busy`` ms more when its bytes are there; ``ready`` is when the lane could end it
    if it waited for them (arrival + wake-up + its work); ``a`` is its read's latency."""
    f[FREE] += busy
    xv = (f[OWN] * a) ** f[TWO]
    if f[DUE] == -INF:
        f[DUE], f[LAT], f[M], f[V] = ready, a, ready, xv
        return
    f[DUE] += busy
    if ready > f[DUE]:
        f[DUE], f[LAT] = ready, a
    f[M], f[V] = max_normal(f[M] + busy, f[V], ready, xv)


@kernel
def finish_shift(f, busy: float) -> None:
    """Time the timeline spends on something else (the serial engine's admissions) before the next pick."""
    f[FREE] += busy
    if f[DUE] != -INF:
        f[DUE] += busy
        f[M] += busy


@kernel
def finish_extra(f, shared: float, lane_sd: float) -> float:
    """``shared``: the layer's shared lateness as a fraction of the critical read's latency; ``lane_sd``: the lane's
    own lateness (ms), which races the reads the same way."""
    if f[DUE] == -INF:
        return 0.0
    d = f[DUE] - f[FREE]
    sd = math.sqrt(f[V] + (shared * f[LAT]) ** f[TWO] + lane_sd * lane_sd)
    return late(f[M] - f[FREE], sd) - (d if d > 0.0 else 0.0)
