"""Set-up the runtime benchmarks share (bench_probe.py, chaos.py): the recipe arguments, and the recipe, store and
trace they name.

``parser(steps, overrides=...)`` has --store (a packed record store), --recipe, --steps, --json and, with
``overrides``, --set FIELD=VALUE (repeatable recipe overrides); a script adds its own arguments.
``open_recipe(args)`` returns (recipe, store, trace); ``recipe_trace(R)`` loads the recipe's shipped trace alone.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moetier.core import records as spec  # noqa: E402
from moetier.bytes import store  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402


def parser(steps: int, overrides: bool = False) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--recipe", default="tiny-local-cpu")
    ap.add_argument("--steps", type=int, default=steps)
    if overrides:
        ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="recipe override (repeatable)")
    ap.add_argument("--json", action="store_true")
    return ap


def recipe_trace(R):
    return load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)


def open_recipe(a):
    R = spec.resolve(a.recipe, getattr(a, "set", []))
    return R, store.open_store(a.store, model=R.model), recipe_trace(R)
