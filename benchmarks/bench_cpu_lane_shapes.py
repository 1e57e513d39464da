"""The cpu lane's call times by shape under the runtime's own load: how a split call scales against an inline one.

    python benchmarks/bench_cpu_lane_shapes.py --store DIR [--recipe tiny-local-cpu] [--steps 250] [--min-calls 300]
                                               [--json]

The finding it reproduces (docs/calibration.md, "Why the cpu lane does not fit here"): one run of the calibration's
cpu-only fit arms (no prefetch), with the recipe as written, and the mean time of every call shape
(class, experts, extra rows, reads in flight) seen at least ``--min-calls`` times, from the runtime's call_groups.
The inline per-expert slope and the split calls' one-thread cost per expert (one-row calls, the fewest reads in
flight per expert count) are printed below the table; ``workers`` x their ratio is the speed-up a split call
reaches.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _recipe import open_recipe, parser  # noqa: E402
from moetier import calibrate  # noqa: E402


def main(argv=None):
    ap = parser(steps=250)
    ap.add_argument("--min-calls", type=int, default=300)
    a = ap.parse_args(argv)
    R, st, tr = open_recipe(a)
    arms = [x for x in calibrate.default_arms(R, vram=False) if x["fit"] and not any("prefetch" in s for s in x["set"])]
    shapes = []
    for arm in arms:
        res = calibrate._measure(a.recipe, st, tr, arm, a.steps, "cpu", 1.0)
        for lane, e, x, cont, n, sec in res["call_groups"]:
            if lane.startswith("cpu_") and n >= a.min_calls:
                shapes.append({"arm": arm["name"], "cls": lane[4:], "experts": e, "extra": x, "in_flight": cont,
                               "calls": n, "ms": sec * 1e3 / n})
    # per class and expert count, the one-row shape with the fewest reads in flight (inline calls of 2-3 experts
    # happen only in tail arms, where reads are in flight): slopes between the smallest and largest count
    best: dict = {}
    for s in shapes:
        k = (s["cls"], s["experts"])
        if s["extra"] == 0 and (k not in best or s["in_flight"] < best[k]["in_flight"]):
            best[k] = s
    inline = {e: s["ms"] for (c, e), s in best.items() if c == "inline"}
    split = {e: s["ms"] for (c, e), s in best.items() if c == "split"}
    workers = R.lanes["cpu"].workers
    out = {"shapes": shapes, "workers": workers}
    if len(inline) >= 2:
        lo, hi = min(inline), max(inline)
        out["inline_ms_per_expert"] = (inline[hi] - inline[lo]) / (hi - lo)
    if len(split) >= 2:
        lo, hi = min(split), max(split)
        out["split_one_thread_ms_per_expert"] = (split[hi] - split[lo]) / (hi - lo) * workers
    if "inline_ms_per_expert" in out and "split_one_thread_ms_per_expert" in out:
        out["split_speedup"] = workers * out["inline_ms_per_expert"] / out["split_one_thread_ms_per_expert"]
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| arm | class | experts | extra rows | reads in flight | calls | ms per call |")
    print("|---|---|---|---|---|---|---|")
    for s in shapes:
        print(f"| {s['arm']} | {s['cls']} | {s['experts']} | {s['extra']} | {s['in_flight']} | {s['calls']} | "
              f"{s['ms']:.3f} |")
    for k in ("inline_ms_per_expert", "split_one_thread_ms_per_expert", "split_speedup"):
        if k in out:
            print(f"{k}: {out[k]:.3f}")


if __name__ == "__main__":
    main()
