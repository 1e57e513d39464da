"""Demand-read latency by queue depth under the runtime's own load, with prefetch off and on, arms interleaved.

    python benchmarks/bench_read_latency.py --store DIR [--recipe tiny-local-cpu] [--steps 250] [--conc 1] [--json]

What it measures: the demand reads' latency by queue depth with prefetch off and on (the reader keeps the reads
submitted while a prefetch read was in service out of these tables; the simulator's channel gives such a read the
plain latency: a factor for it did not earn its place, docs/calibration.md). Depth here is the demand reads
outstanding when a read was submitted (itself included), as the reader records it.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _recipe import open_recipe, parser  # noqa: E402
from moetier.measure import calibrate  # noqa: E402

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
    merged = {name: calibrate._merge(rs) for name, rs in runs.items()}
    cols = {"prefetch off": merged["prefetch off"]["latency_by_qd"],
            "prefetch on, none in service": merged["prefetch on"]["latency_by_qd"]}
    tabs = {name: {q: {"reads": len(v), "mean_ms": statistics.mean(v), "p50_ms": statistics.median(v)}
                   for q, v in sorted(lat.items()) if len(v) >= 8} for name, lat in cols.items()}
    if a.json:
        print(json.dumps(tabs, indent=1))
        return
    print("| demand depth | " + " | ".join(f"{n}: mean / p50 ms (reads)" for n in tabs) + " |")
    print("|---|" + "---|" * len(tabs))
    for q in sorted({q for v in tabs.values() for q in v}):
        cells = [f"{v[q]['mean_ms']:.3f} / {v[q]['p50_ms']:.3f} ({v[q]['reads']})" if q in v else "-"
                 for v in tabs.values()]
        print(f"| {q} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
