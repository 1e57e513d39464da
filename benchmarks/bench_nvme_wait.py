"""How long the decode thread waits for a layer's first NVMe read, against the wait for its mean arrival.

    python benchmarks/bench_nvme_wait.py --store DIR [--recipe tiny-local-cpu] [--conc 4] [--steps 120] [--json]

The finding it reproduces (docs/calibration.md, "An arrival is a distribution"): one runtime run of the recipe as
written (warm-up steps included); for the first demand read each layer waits on, X = landed - (when the thread
started waiting), both from the read's submit time. It prints mean X, the mean wait E[max(0, X)], the read
latency's sd / mean, and the wait a normal arrival with that spread would give. The planner
charges a layer's reads one common normal lateness of that spread (moetier.plan.late).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moetier import runtime, spec, store  # noqa: E402
from moetier.plan import late  # noqa: E402
from moetier.trace import load_trace  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--recipe", default="tiny-local-cpu")
    ap.add_argument("--conc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    R = spec.resolve(a.recipe)
    st = store.open_store(a.store, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    first: list[tuple[float, float]] = []        # (latency ms, submit -> wait start ms) of a layer's first wait
    seen: set = set()
    wait = runtime.Runtime._wait

    def timed_wait(self, h, ticket=None, bucket="nvme_wait_s"):   # a diagnostic wrapper, this script only
        t = time.perf_counter()
        wait(self, h, ticket, bucket)
        layer = self.stats["layer_calls"]
        if layer not in seen:
            seen.add(layer)
            first.append(((h.t_landed - h.t_submit) * 1e3, (t - h.t_submit) * 1e3))

    runtime.Runtime._wait = timed_wait
    be = runtime.make_backend("cpu", st, R, a.conc, 1.0)
    try:
        runtime.run(R, st, be, tr, a.conc, max_steps=a.steps)
    finally:
        be.close()
        runtime.Runtime._wait = wait
    if len(first) < 8:
        sys.exit(f"bench_nvme_wait: only {len(first)} layers waited on a read; use a recipe with an NVMe tail")
    x = [lat - start for lat, start in first]
    lat = [v for v, _ in first]
    sd = statistics.pstdev(lat)
    mx, ml = statistics.mean(x), statistics.mean(lat)
    out = {"layers": len(first), "mean_x_ms": mx, "mean_wait_ms": statistics.mean(max(0.0, v) for v in x),
           "wait_for_mean_ms": max(0.0, mx), "latency_mean_ms": ml, "latency_sd_ms": sd, "latency_cv": sd / ml,
           "normal_wait_ms": late(mx, sd)}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| measure | ms |\n|---|---|")
    for k, v in out.items():
        print(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |")


if __name__ == "__main__":
    main()
