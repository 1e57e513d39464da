"""Prediction intervals: a predicted tok/s with the range the measured noise of its terms allows.

Contract
--------
``spreads(R)`` reads each cost term's measured spread from the recipe's engines (engine ``term_spread``, written by
`moetier bench`: {term: {"n", "rel_p10", "rel_p90", "rel_sd"}}, quantiles over the bench's repetitions as ratios to
the written value). ``corner(R, side)`` is the recipe with every cost term at its low (``"fast"``: p10) or high
(``"slow"``: p90) quantile. ``interval(R, run, ...)`` replays both corners with ``run`` (``moetier.core.sim.run``'s
signature) and returns {"low", "high", "basis"}: the slow corner's tok/s and the fast corner's.

Why the corners, not a Monte Carlo over independent terms: on the machines this is measured on, the noise that moves
a run is common-mode (the whole machine runs faster or slower for seconds to minutes: a shared host, frequency
scaling, the page cache), so the terms move together, and two replays cost what a usable Monte Carlo would cost
twenty times over (``moetier table`` replays every concurrency).

A term without a measured spread takes the median spread of the record's measured ones (the same machine's noise);
a recipe whose engines carry no spread at all takes ``DEFAULT_REL`` (p10 / p90 at -5% / +5% of every term, the
noise `moetier calibrate` flags an arm's measurement for, ``calibrate.NOISE_FLAG_PCT``). Pure: no I/O.
"""
from __future__ import annotations

import copy
import dataclasses
import statistics

DEFAULT_REL = (0.95, 1.05)
# the term keys a spread can be recorded under; each is scaled by the corner's factor for that key
LANE_TERMS = ("per_layer_ms", "per_expert_ms", "per_extra_token_ms", "per_call_ms", "per_read_ms",
              "per_read_busy_ms", "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")
# engine fields of the NVMe channel that are times (scaled with "nvme_latency"); cv_* are ratios and stay
_CHANNEL_TIMES = ("nvme_latency_by_rows_qd_ms", "nvme_latency_by_rows_burst_ms", "nvme_wake_ms_by_rows",
                  "lane_lateness_sd_ms_by_rows")


def recorded(R) -> dict:
    """{term: (rel_p10, rel_p90)} the recipe's engines recorded (the last engine wins a term both have)."""
    out: dict = {}
    for eng in getattr(R, "engines", None) or ():
        for k, s in (eng.get("term_spread") or {}).items():
            out[k] = (float(s["rel_p10"]), float(s["rel_p90"]))
    return out


def spreads(R) -> tuple[dict, tuple, str]:
    """The measured spreads, the (p10, p90) a term without one takes, and which basis that is."""
    got = recorded(R)
    if not got:
        return {}, DEFAULT_REL, "default"
    lo = statistics.median(v[0] for v in got.values())
    hi = statistics.median(v[1] for v in got.values())
    return got, (min(lo, 1.0), max(hi, 1.0)), "measured"


def _scale(x, f):
    """A number, or a nested {key: number} table, times f."""
    if isinstance(x, dict):
        return {k: _scale(v, f) for k, v in x.items()}
    return x * f if isinstance(x, (int, float)) and not isinstance(x, bool) else x


def corner(R, side: str):
    """``R`` with every cost term at its ``side`` ("fast": p10, "slow": p90) quantile."""
    if side not in ("fast", "slow"):
        raise ValueError(f"corner: side must be 'fast' or 'slow', got {side!r}")
    got, default, _ = spreads(R)
    i = 0 if side == "fast" else 1

    def f(key: str) -> float:
        return got[key][i] if key in got else default[i]

    lanes = {}
    for name, ln in R.lanes.items():
        upd = {t: getattr(ln, t) * f(f"{name}.{t}") for t in LANE_TERMS if getattr(ln, t, None) is not None}
        lanes[name] = dataclasses.replace(ln, **upd)
    host = {k: (v * f(f"host.{k}") if isinstance(v, (int, float)) else v) for k, v in R.host.items()}
    fixed = {r: v * f("fixed_ms") for r, v in R.fixed_ms.items()}
    lat = f("nvme_latency")
    engines = []
    for eng in R.engines:
        e = copy.deepcopy(eng)
        for fld in _CHANNEL_TIMES:
            if fld in e:
                e[fld] = _scale(e[fld], lat)
        engines.append(e)
    hw = copy.deepcopy(R.hardware)
    nv = hw.get("nvme") or {}
    for fld in ("latency_by_qd_ms", "latency_by_rows_qd_ms"):
        if fld in nv:
            nv[fld] = _scale(nv[fld], lat)
    if "cpu_ms_per_read" in nv:
        nv["cpu_ms_per_read"] = nv["cpu_ms_per_read"] * f("cpu.per_read_ms")
    return dataclasses.replace(
        R, lanes=lanes, host=host, fixed_ms=fixed, engines=engines, hardware=hw,
        h2d_gbps=R.h2d_gbps / f("copy"), nvme_bw_gbps=R.nvme_bw_gbps / lat,
        nvme_bw_qd1_gbps=R.nvme_bw_qd1_gbps / lat, nvme_latency_ms=R.nvme_latency_ms * lat)


def interval(R, run, *args, **kw) -> dict:
    """The predicted tok/s range: ``run(corner, *args, **kw)["tok_s"]`` at the slow and the fast corner."""
    _, _, basis = spreads(R)
    low = run(corner(R, "slow"), *args, **kw)["tok_s"]
    high = run(corner(R, "fast"), *args, **kw)["tok_s"]
    return {"low": min(low, high), "high": max(low, high), "basis": basis}


def inside(measured: float, iv: dict | None) -> bool | None:
    """Whether a measured tok/s fell inside an interval (None without one)."""
    if not iv:
        return None
    return iv["low"] <= measured <= iv["high"]
