"""The host's last-level cache: what an expert costs the cpu lane depends on how much streamed since its last use.

Contract
--------
``ReuseModel(curve, record_bytes, keys)``: ``curve`` is the hardware record's ``cpu.reuse_curve`` {bytes:
factor}, the measured cost of one expert on the cpu lane against the bytes the host streamed since that expert was
last computed, relative to a cold expert (1.0); ``keys`` how many keys there are. ``factor(key)`` is that cost factor
for ``key`` now (linear between the measured points, the end values beyond them; 1.0 for a key never seen);
``touch(keys)`` records that keys streamed through the host, in order, one record each. ``distances(keys)`` are the
records streamed since each key's last use (-1: never), ``curve`` the points as the planner kernel reads them,
``last`` each key's ``clock`` at its last use (0: never) as it reads them, and ``reuse_factor(d, ds, fs)`` the
compiled interpolation both ``factor`` and the kernel use. The planner charges a RAM pick ``per_expert_ms * factor``
on the cpu lane; the simulator and the runtime touch the same keys in the same order
(``moetier.core.sim.Replay.touch``: the cpu lane's RAM picks, then the layer's NVMe reads, which land and are
checksummed in host memory), so they plan the same lanes.

Why: on a host whose last-level cache holds many experts (e.g. 300 MiB, ~190 records of 1.58 MB)
an expert computed again soon is cheaper, and NVMe reads stream through the same cache. The same cpu call shape
costs more in a run with an NVMe tail than in an all-in-RAM run (13 experts, no read in flight: 3.08 ms against
2.52 ms). Distance is counted in records streamed, not distinct records: it needs one clock entry per key and
O(1) per touch on the planner's path, and the two agree for the reuse that matters here (the next step's).
"""
from __future__ import annotations

from array import array

import numpy as np

from moetier.core.jit import kernel


class ReuseModel:
    __slots__ = ("_d", "_f", "_last", "last", "clock", "curve")

    def __init__(self, curve: dict, record_bytes: int, keys: int):
        """``keys``: how many keys there are (the ledger's), each < keys."""
        pts = sorted((float(b) / max(1, int(record_bytes)), float(f)) for b, f in curve.items())
        if not pts:
            raise ValueError("ReuseModel: empty reuse curve")
        self._d = np.array([d for d, _ in pts])          # distances in records
        self._f = np.array([f for _, f in pts])
        # what plan_layer hands its kernel after the picks' distances: the points' count, distances, factors
        self.curve = (len(pts), *self._d.tolist(), *self._f.tolist())
        # per key, the clock at its last use (0: never): Python writes it, the planner's kernel reads it (``last``)
        self._last = array("q", bytes(8 * int(keys)))
        self.last = np.frombuffer(self._last, np.int64)
        self.clock = 0

    def distances(self, keys) -> list:
        """Per key, the records streamed since its last use; -1 for a key never seen."""
        c, last = self.clock, self._last
        return [c - u if (u := last[k]) else -1 for k in keys]

    def factor(self, key) -> float:
        return reuse_factor(float(self.distances((key,))[0]), self._d, self._f)

    def touch(self, keys) -> None:
        last = self._last
        c = self.clock
        for k in keys:
            c += 1
            last[k] = c
        self.clock = c


@kernel
def reuse_factor(d, ds, fs):
    """The cost factor at ``d`` records streamed (-1: never seen, 1.0): linear between the curve's points ``ds`` /
    ``fs``, its end values beyond them. The planner kernel computes each RAM pick's factor with it
    (moetier.core.plan_kernel)."""
    if d < 0:
        return 1.0
    n = ds.shape[0]
    i = 0
    while i < n and ds[i] <= d:        # bisect_right
        i += 1
    if i == 0:
        return fs[0]
    if i == n:
        return fs[n - 1]
    d0, d1 = ds[i - 1], ds[i]
    return fs[i - 1] + (fs[i] - fs[i - 1]) * (d - d0) / (d1 - d0)


def reuse_model(R):
    """The recipe's host cache model (hardware cpu.reuse_curve, in the RAM tier's record size), or None."""
    curve = ((getattr(R, "hardware", None) or {}).get("cpu") or {}).get("reuse_curve")
    if not curve or "cpu" not in getattr(R, "lanes", {}):
        return None
    return ReuseModel(curve, R.ram_expert_bytes, R.keys)
