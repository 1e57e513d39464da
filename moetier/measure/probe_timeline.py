"""The runtime's per-step counters on the wall clock: cumulative counters as functions of time, the spans the
runtime was stepping, the phase windows between marks, and per-step deltas.

Contract: ``Cum(counters).value(key, t)`` is a cumulative counter at wall time ``t`` (one segment per runtime
instance: the counters restart at every ``runtime.run``); ``step_spans`` merges the steps' [start, end] spans and
``covered`` measures how much of [a, b] they cover; ``phases(marks, t_lo, t_hi)`` names the windows between
marks; ``steps(counters)`` is the per-step deltas plus the times of the baseline steps left out.
"""
from __future__ import annotations

import bisect

import numpy as np

from moetier.measure.probe_file import _finite, _num

CUMULATIVE = ("plan_s", "book_s", "lane_cpu_s", "lane_gpu_s", "lane_zc_s", "nvme_wait_s", "copy_s", "combine_s",
              "reads", "masked", "picks", "layer_calls")
# counters newer runtimes add; absent in older probe files, where they read as 0 without a "missing" note
LATER = ("stage_s",)


class Cum:
    """Cumulative runtime counters as piecewise-linear functions of wall time, one segment per runtime instance
    (the counters restart at every ``runtime.run``): flat between steps, linear within a step."""

    def __init__(self, counters: list[dict]):
        self._cache: dict = {}
        self.segments: list[list[dict]] = []
        prev = None
        for c in counters:
            if prev is None or self._restarted(prev, c):
                self.segments.append([])
            self.segments[-1].append(c)
            prev = c

    @staticmethod
    def _restarted(a: dict, b: dict) -> bool:
        sa, sb = a.get("step"), b.get("step")
        if _finite(sa) and _finite(sb) and sb <= sa:
            return True
        if a.get("conc") != b.get("conc"):
            return True
        return any(_finite(a.get(k)) and _finite(b.get(k)) and b[k] < a[k] for k in CUMULATIVE)

    def value(self, key: str, t: float) -> float:
        tot = 0.0
        for xs, ys in self._curves(key):
            tot += float(np.interp(t, xs, ys))
        return tot

    def _curves(self, key: str):
        """Per segment the breakpoints (step start, previous value), (step end, value), relative to the segment's
        first line (its pre-step value is unknown, so its own step is not counted)."""
        got = self._cache.get(key)
        if got is not None:
            return got
        got = []
        for seg in self.segments:
            base = _num(seg[0].get(key), 0.0)
            xs, ys = [seg[0]["t"]], [0.0]
            prev_v = 0.0
            for c in seg[1:]:
                v = _num(c.get(key), base + prev_v) - base
                start = c["t"] - max(_num(c.get("step_wall_s"), 0.0), 0.0)
                if start > xs[-1]:
                    xs.append(start)
                    ys.append(prev_v)
                if c["t"] > xs[-1]:
                    xs.append(c["t"])
                    ys.append(v)
                else:
                    ys[-1] = v
                prev_v = v
            got.append((np.asarray(xs), np.asarray(ys)))
        self._cache[key] = got
        return got


def step_spans(counters: list[dict]) -> list[tuple[float, float]]:
    spans = []
    for c in counters:
        w = _num(c.get("step_wall_s"), 0.0)
        if w > 0:
            spans.append((c["t"] - w, c["t"]))
    spans.sort()
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def covered(spans, starts, a: float, b: float) -> float:
    tot = 0.0
    i = max(0, bisect.bisect_right(starts, a) - 1)
    while i < len(spans):
        s, e = spans[i]
        if s >= b:
            break
        if e > a:
            tot += min(b, e) - max(a, s)
        i += 1
    return tot


def phases(marks: list[dict], t_lo: float, t_hi: float) -> list[tuple[str, float, float]]:
    if not marks:
        return [("all", t_lo, t_hi)]
    out, seen = [], {}
    for i, m in enumerate(marks):
        end = marks[i + 1]["t"] if i + 1 < len(marks) else max(t_hi, m["t"])
        name = m["phase"]
        if name in seen:                  # the same phase marked twice: keep both windows apart
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 1
        out.append((name, m["t"], end))
    return out


def steps(counters: list[dict]) -> tuple[list[dict], list[float]]:
    """Per-step deltas, and the times of the steps left out: the first line of every runtime instance (its
    counters restart) has no predecessor, so its step is the baseline, not a measured delta."""
    cum = Cum(counters)
    out, excluded = [], []
    for seg in cum.segments:
        excluded.append(seg[0]["t"])
        for a, b in zip(seg, seg[1:]):
            d = {k: max(0.0, _num(b.get(k), 0.0) - _num(a.get(k), 0.0)) for k in CUMULATIVE + LATER}
            d["wall"] = max(0.0, _num(b.get("step_wall_s"), 0.0))
            d["tokens"] = max(0.0, _num(b.get("tokens"), 0.0))
            d["t"], d["measured"], d["conc"] = b["t"], bool(b.get("measured", True)), b.get("conc")
            out.append(d)
    return out, excluded
