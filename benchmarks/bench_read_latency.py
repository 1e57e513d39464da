"""Demand-read latency by queue depth under the runtime's own load, with prefetch off and on, arms interleaved.

    python benchmarks/bench_read_latency.py --store DIR [--recipe tiny-local-cpu] [--steps 250] [--conc 1] [--json]

The finding it reproduces (docs/calibration.md): a low-priority prefetch read in service does not slow a demand
read down, so the simulator's channel does not count it into a demand read's queue depth. Depth here is the demand
reads outstanding when a read was submitted (itself included), as the reader records it.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _recipe import open_recipe, parser  # noqa: E402
from moetier import calibrate  # noqa: E402

PREFETCH = ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"]


def main(argv=None):
    ap = parser(steps=250)
    ap.add_argument("--conc", type=int, default=1)
    a = ap.parse_args(argv)
    R, st, tr = open_recipe(a)
    arms = {"prefetch off": [], "prefetch on": PREFETCH}
    runs = {name: [] for name in arms}
    for _ in range(2):                                  # A B A B
        for name, sets in arms.items():
            arm = {"name": name, "set": sets, "conc": a.conc, "fit": False}
            runs[name].append(calibrate._measure(a.recipe, st, tr, arm, a.steps, "cpu", 1.0))
    res = {}
    for name, rs in runs.items():
        lat = calibrate._merge(rs)["latency_by_qd"]
        res[name] = {q: {"reads": len(v), "p50_ms": statistics.median(v)} for q, v in sorted(lat.items()) if len(v) >= 8}
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print("| demand depth | " + " | ".join(f"{n}: p50 ms (reads)" for n in res) + " |")
    print("|---|" + "---|" * len(res))
    for q in sorted({q for v in res.values() for q in v}):
        cells = [f"{v[q]['p50_ms']:.3f} ({v[q]['reads']})" if q in v else "-" for v in res.values()]
        print(f"| {q} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
