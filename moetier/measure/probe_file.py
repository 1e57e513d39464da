"""Reading a probe file: the sampler's JSON lines, parsed leniently, and their sampling quality.

Contract: ``read_probe(path)`` returns ``{header, samples, counters, marks, bad_lines, truncated_last_line, errors,
lines}`` - bad lines are counted, a line cut short at the end is flagged, non-finite numbers are refused, each list
is sorted by time; an unreadable file is a one-line UserError. ``quality(P, interval)`` counts samples, gaps (an
interval over ``GAP_FACTOR`` x nominal) and the samples they lost. The small number helpers used throughout the
report live here too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from moetier.errors import UserError

MAX_BYTES = 4 << 30             # a day of 100 ms samples on a 256-core host is about 2 GB
GAP_FACTOR = 2.0                 # an interval longer than 2x nominal is a gap


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x, default=None):
    return float(x) if _finite(x) else default


def _r(x, nd=4):
    return round(float(x), nd) if _finite(x) else None


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty sorted list."""
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


MAX_VALUE = 1e18        # no counter, byte count or time a probe writes comes near this (1 EB; 3e10 years)
MAX_T = 1e11            # a Unix time in seconds before the year 5138


def _plausible(d: dict) -> bool:
    """Every number in a probe line is finite and within MAX_VALUE, its time within [0, MAX_T]: a line that is
    not (a corrupted or hand-made file, 1e308 values) is a bad line, not arithmetic that overflows."""
    t = d.get("t")
    if t is not None and not (_finite(t) and 0 <= t <= MAX_T):
        return False
    stack = [d]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not (_finite(v) and abs(v) <= MAX_VALUE):
            return False
    return True


def _reject_constant(name):
    raise ValueError(f"non-finite number {name}")


def read_probe(path) -> dict:
    """Parse a probe file: {header, samples, counters, marks, bad_lines, truncated_last_line, errors}."""
    from moetier.bounded import open_regular
    p = Path(path)
    try:
        with open_regular(p, f"{path} (probe file)", MAX_BYTES) as f:
            raw = f.read(MAX_BYTES)
    except OSError as e:
        raise UserError(f"{path}: cannot read probe file: {e.strerror or e}") from None
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    truncated = bool(lines) and lines[-1].strip() != ""     # no final newline: the writer died mid-line
    out = {"header": None, "samples": [], "counters": [], "marks": [], "bad_lines": 0, "truncated_last_line": False,
           "errors": [], "lines": 0}
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        out["lines"] += 1
        try:
            d = json.loads(ln, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            if i == len(lines) - 1 and truncated:
                out["truncated_last_line"] = True
            else:
                out["bad_lines"] += 1
            continue
        if not isinstance(d, dict) or not _plausible(d):
            out["bad_lines"] += 1
            continue
        kind = d.get("kind")
        if kind == "header" and out["header"] is None:
            out["header"] = d
        elif kind == "sample":
            if _finite(d.get("t")):
                out["samples"].append(d)
            else:
                out["bad_lines"] += 1
        elif kind == "counters":
            if _finite(d.get("t")):
                out["counters"].append(d)
            else:
                out["bad_lines"] += 1
        elif kind == "mark":
            if _finite(d.get("t")) and isinstance(d.get("phase"), str):
                out["marks"].append(d)
            else:
                out["bad_lines"] += 1
        elif kind == "error":
            out["errors"].append(str(d.get("error")))
        elif kind == "header":
            pass                                            # a second header: an appended recording
        else:
            out["bad_lines"] += 1
    out["samples"].sort(key=lambda s: s["t"])
    out["counters"].sort(key=lambda c: c["t"])
    out["marks"].sort(key=lambda m: m["t"])
    return out


def quality(P: dict, interval: float) -> dict:
    ts = [s["t"] for s in P["samples"]]
    gaps, lost = 0, 0
    hdr_t = _num((P["header"] or {}).get("started"))
    prev = hdr_t
    for s in P["samples"]:
        dt = _num(s.get("dt"), 0.0)
        step = max(dt, s["t"] - prev) if prev is not None else dt
        if step > GAP_FACTOR * interval:
            gaps += 1
            lost += max(0, int(round(step / interval)) - 1)
        prev = s["t"]
    return {"samples": len(ts), "gaps": gaps, "lost": lost, "bad_lines": P["bad_lines"],
            "truncated_last_line": P["truncated_last_line"], "sampler_errors": P["errors"]}
