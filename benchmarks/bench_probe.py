"""Probe overhead: decode tok/s of the runtime with and without the 100 ms sampler, arms interleaved (A B A B).

    python benchmarks/bench_probe.py --store DIR [--recipe tiny-local-cpu] [--steps 150] [--pairs 4] [--json]

Target (issue 5): the sampler costs < 2% of decode tok/s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moetier import runtime, spec, store  # noqa: E402
from moetier.cli_runtime import _make_backend  # noqa: E402
from moetier.probe import Sampler  # noqa: E402
from moetier.trace import load_trace  # noqa: E402


def one(R, st, tr, steps, probe_path):
    be = _make_backend("cpu", st, R, 1, 1.0)
    s = None
    try:
        if probe_path:
            s = Sampler(probe_path)
            s.start()
        res = runtime.run(R, st, be, tr, 1, max_steps=steps, step_hook=s.counters if s else None)
    finally:
        if s:
            s.stop()
        be.close()
    return res["tok_s"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--recipe", default="tiny-local-cpu")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    R = spec.resolve(a.recipe)
    st = store.open_store(a.store, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    off, on = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.pairs):
            off.append(one(R, st, tr, a.steps, None))
            on.append(one(R, st, tr, a.steps, os.path.join(d, f"p{i}.jsonl")))
    ratio = statistics.median(on) / statistics.median(off)
    res = {"off_tok_s": off, "on_tok_s": on, "median_off": statistics.median(off), "median_on": statistics.median(on),
           "overhead_pct": (1 - ratio) * 100, "target_pct": 2.0}
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print("| arm | tok/s per pair | median |\n|---|---|---|")
    print(f"| no probe | {', '.join(f'{x:.1f}' for x in off)} | {res['median_off']:.1f} |")
    print(f"| probe at 100 ms | {', '.join(f'{x:.1f}' for x in on)} | {res['median_on']:.1f} |")
    print(f"probe overhead {res['overhead_pct']:+.2f}% of decode tok/s (target < 2%)")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
