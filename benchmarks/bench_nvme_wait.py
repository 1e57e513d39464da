"""How long the decode thread waits for a layer's first NVMe read, against the wait for its mean arrival.

    python benchmarks/bench_nvme_wait.py --store DIR [--recipe tiny-local-cpu] [--conc 4] [--steps 120]
        [--backend cpu|sycl] [--set FIELD=VALUE ...] [--json]

The VRAM arms of the calibration: --backend sycl --set 'engines=["sycl-opencl-cpu"]'
--set budget.vram_expert_slots=102 --set policy.overlap=false.

The finding it reproduces (docs/calibration.md, "An arrival is a distribution"): one runtime run of the recipe as
written (warm-up steps included); for the first demand read each layer waits on, X = landed - (when the thread
started waiting), both from the read's submit time. It prints mean X, the mean wait E[max(0, X)], the read
latency's sd / mean, the wait a normal arrival with that spread would give (moetier.core.arrivals.late), and how
much of the spread the reads of a layer share: the correlation of the lateness of its first two reads and the
shared / own split the calibration fits (moetier.measure.fit_nvme.spread_split; the planner's
moetier.core.arrivals.Finish), and the mean latency by burst size and position (reads issued together land
together) beside the depth table's.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from _recipe import open_recipe, parser  # noqa: E402
from moetier.run import runtime  # noqa: E402
from moetier.measure.fit_nvme import burst_means, spread_split  # noqa: E402
from moetier.core.arrivals import late  # noqa: E402


def main(argv=None):
    ap = parser(steps=120, overrides=True)
    ap.add_argument("--conc", type=int, default=4)
    ap.add_argument("--backend", default="cpu", help="cpu, or sycl with a VRAM tier set (--set ...)")
    a = ap.parse_args(argv)
    R, st, tr = open_recipe(a)
    first: list[tuple[float, float]] = []        # (latency ms, submit -> wait start ms) of a layer's first wait
    seen: set = set()
    wait = runtime.Runtime._wait

    def timed_wait(self, h, ticket=None, bucket="nvme_wait_s", refill=None):   # a diagnostic wrapper, this script
        t = time.perf_counter()
        h = wait(self, h, ticket, bucket, refill)
        layer = self.stats["layer_calls"]
        c = getattr(h, "comp", h)      # the SYCL and CUDA backends' fill handles wrap the Reader's completion
        if layer not in seen and hasattr(c, "t_landed"):
            seen.add(layer)
            first.append(((c.t_landed - c.t_submit) * 1e3, (t - c.t_submit) * 1e3))
        return h

    runtime.Runtime._wait = timed_wait
    be = runtime.make_backend(a.backend, st, R, a.conc, 1.0)
    try:
        runtime.run(R, st, be, tr, a.conc, max_steps=a.steps)
        bursts = [(0, b, q, ms) for b, q, ms in be.reader.burst_ms]      # one runtime run
        means = {q: statistics.mean(v) for q, v in be.reader.latency_by_qd.items() if len(v) >= 8}
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
           "normal_wait_ms": late(mx, sd),
           # the other side of X: when the lane got free (submit -> wait start) spreads too
           "free_mean_ms": statistics.mean(v for _, v in first), "free_sd_ms": statistics.pstdev(v for _, v in first),
           "x_sd_ms": statistics.pstdev(x)}
    # how much of the spread a layer's reads share: the correlation of its first two reads' lateness (each about
    # its depth's mean), and the split the calibration fits (moetier.measure.fit_nvme.spread_split)
    rel: dict = {}
    for _, b, q, ms in bursts:
        if q in means:
            rel.setdefault(b, {})[q] = ms / means[q] - 1
    pairs = np.array([(v[1], v[2]) for v in rel.values() if 1 in v and 2 in v])
    if len(pairs) >= 8:
        out["first_two_reads_correlation"] = float(np.corrcoef(pairs.T)[0, 1])
    # the slowest read against its depth's mean: the tail the calibration winsorizes
    out["latency_max_over_mean"] = max((1 + x for v in rel.values() for x in v.values()), default=0.0)
    by_burst = burst_means(bursts)
    split = spread_split(bursts, means, by_burst)
    if split is not None:
        out["cv_shared"], out["cv_own"] = split
    # reads issued together land together: mean latency by burst size and position, against the depth table
    out["latency_by_burst_ms"] = {n: [round(row[q], 2) for q in sorted(row)] for n, row in sorted(by_burst.items())}
    out["latency_by_depth_ms"] = [round(means[q], 2) for q in sorted(means)]
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| measure | value (ms unless a ratio) |\n|---|---|")
    for k, v in out.items():
        print(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {json.dumps(v)} |")


if __name__ == "__main__":
    main()
