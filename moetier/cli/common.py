"""Helpers shared by the CLI's verb modules (main, runtime, probe, conformance): argument types, the parser that
turns argparse errors into UserError, progress on a terminal, JSON output, recipe and trace resolution.

Contract: nothing here imports a verb module, so every verb module imports this one and none imports another.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moetier.errors import UserError

DEFAULT_RECIPE = "glm53-rtx3090-55g-nvx4"
REPO = Path(__file__).resolve().parents[2]


def _number(cast, ok, expected: str):
    """An argparse type: ``cast`` the text, then require ``ok(value)``; the error names what was expected."""
    def parse(s: str):
        try:
            v = cast(s)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}")
        return v
    parse.__name__ = expected
    return parse


positive_int = _number(int, lambda v: v >= 1, "a positive integer")
count = _number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number(float, lambda v: v > 0, "a positive number")
count_float = _number(float, lambda v: v >= 0, "a number >= 0")
fraction = _number(float, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"{self.prog}: {message}")


def _progress(label: str):
    if not sys.stderr.isatty():
        return None

    def cb(i, n):
        sys.stderr.write(f"\r{label}: step {i}/{n}")
        sys.stderr.flush()
        if i + 64 >= n:
            sys.stderr.write("\r" + " " * (len(label) + 30) + "\r")
    return cb


def _emit(obj) -> None:
    print(json.dumps(obj, sort_keys=True, indent=1, default=_jsonable))


def _jsonable(x):
    try:
        import numpy as np
        if isinstance(x, np.generic):
            return x.item()
    except ImportError:
        pass
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _resolve(args):
    from moetier.core import records as spec
    return spec.resolve(args.recipe, spec.parse_overrides(args.set or []))


def find_path(p: str) -> Path:
    """A user path as given, else relative to the repository (shipped traces)."""
    q = Path(p)
    if q.exists() or q.is_absolute():
        return q
    r = REPO / q
    return r if r.exists() else q


def _trace(args, R):
    from moetier.traces.format import load_trace
    path = args.trace or R.trace
    if not path:
        raise UserError(f"recipe {R.id}: no trace given (--trace) and the recipe names none")
    return load_trace(find_path(path), find_path(args.segments) if args.segments else None,
                      layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
