"""Helpers shared by the CLI's verb modules (main, runtime, probe, conformance): argument types, the parser that
turns argparse errors into UserError, JSON output (strict: no NaN/Infinity), recipe and trace resolution.

Contract: nothing here imports a verb module, so every verb module imports this one and none imports another.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from moetier.errors import UserError

DEFAULT_RECIPE = "glm53-rtx3090-55g-nvx4"


def _number(cast, ok, expected: str):
    """An argparse type: ``cast`` the text, then require ``ok(value)``; the error names what was expected."""
    def parse(s: str):
        try:
            v = cast(s)
        except (ValueError, OverflowError):
            v = None
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}")
        return v
    parse.__name__ = expected
    return parse


positive_int = _number(int, lambda v: v >= 1, "a positive integer")
count = _number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number(float, lambda v: v > 0, "a positive number")
count_float = _number(float, lambda v: v >= 0, "a number >= 0")
fraction = _number(float, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")
seed = _number(int, lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)")


def int_in(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi] (a count whose every unit is work: repeats, a verify window)."""
    return _number(int, lambda v: lo <= v <= hi, f"an integer in [{lo}, {hi}]")


def int_list(s: str) -> list:
    """An argparse type: comma-separated positive integers (``--cache-sizes 64,128``)."""
    try:
        out = [int(x) for x in s.split(",")]
    except ValueError:
        out = []
    if not out or any(v < 1 for v in out):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {s!r}")
    return out


int_list.__name__ = "comma-separated positive integers"


def json_object(s: str) -> dict:
    """An argparse type: a JSON object, strictly parsed (finite numbers)."""
    from moetier import strictjson
    try:
        v = strictjson.loads(s, "value")
    except UserError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object: {e}") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {s!r}")
    return v


json_object.__name__ = "a JSON object"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"{self.prog}: {message}")


def _emit(obj) -> None:
    """One strict JSON document on stdout (no NaN or Infinity tokens): a figure that is not a finite number is
    written as null, and its JSON path is listed under "null_reasons" with why."""
    from moetier import strictjson
    obj, reasons = _finite_or_null(obj)
    if reasons and isinstance(obj, dict):
        obj = {**obj, "null_reasons": reasons}
    print(strictjson.dumps(obj, sort_keys=True, indent=1))


def _finite_or_null(obj, path="$"):
    """(a copy of obj with NaN/infinite floats as None, {json path: reason})."""
    reasons: dict = {}

    def walk(x, p):
        if isinstance(x, float) and not math.isfinite(x):
            reasons[p] = f"not a finite number ({x})"
            return None
        if isinstance(x, dict):
            return {k: walk(v, f"{p}.{k}") for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, f"{p}[{i}]") for i, v in enumerate(x)]
        try:
            import numpy as np
            if isinstance(x, np.floating):
                return walk(float(x), p)
        except ImportError:
            pass
        return x
    return walk(obj, path), reasons


def _resolve(args):
    from moetier.core import records as spec
    return spec.resolve(args.recipe, spec.parse_overrides(args.set or []))


def find_path(p: str) -> Path:
    """A user path as given, else relative to the user data folder, else to the shipped data (traces/ beside the
    registries: moetier.core.records.data_roots)."""
    from moetier.core import records as spec
    q = Path(p)
    if q.exists() or q.is_absolute():
        return q
    for base in spec.data_roots():
        if (base / q).exists():
            return base / q
    return q


def missing_arg(p) -> None:
    """``--missing`` on a command that reads a trace (moetier.traces.format.load_trace)."""
    from moetier.traces.format import MISSING
    p.add_argument("--missing", choices=MISSING, default="error",
                   help="a -1 hole (a missing router record) in the trace: refuse it (default), mask the pick (not "
                        "computed; statistics leave its token out) or drop its token")


def _trace(args, R):
    from moetier.traces.format import load_trace
    path = args.trace or R.trace
    if not path:
        raise UserError(f"recipe {R.id}: no trace given (--trace) and the recipe names none")
    return load_trace(find_path(path), find_path(args.segments) if args.segments else None,
                      layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id,
                      missing=getattr(args, "missing", "error"))


def tok_s(o: dict) -> str:
    """Decode tok/s as printed: a lossy run (masked picks) shows its masked share beside it."""
    s = f"{o['tok_s']:.2f}"
    if o.get("masked_share"):
        s += f" (masked {100 * o['masked_share']:.1f}%)"
    return s


def replay_interval(R, tr, conc: int, steps: int = 0, **kw) -> dict:
    """The prediction interval of one replay (moetier.core.interval: the terms at their slow and fast quantiles),
    its two replays counted on one bar, so the bar has a total and a time left."""
    from moetier.cli import progress
    from moetier.core import interval, sim
    with progress.task(f"interval C{conc}") as cb:
        done = []

        def run(*a, **k):
            base = len(done)
            done.append(1)
            return sim.run(*a, progress=lambda d, n: cb(base * n + d, 2 * n), **k)
        return interval.interval(R, run, tr, conc, max_steps=steps, **kw)
