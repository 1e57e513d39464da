"""The cpu lane's call times by shape under the runtime's own load: how a split call scales against an inline one.

    python benchmarks/bench_cpu_lane_shapes.py --store DIR [--recipe tiny-local-cpu] [--steps 250] [--min-calls 300]
                                               [--vram] [--json]

The finding it reproduces (docs/calibration.md, "Why the cpu lane does not fit here"): one run of the calibration's
cpu-only fit arms (no prefetch), with the recipe as written, and the mean time of every call shape
(class, experts, extra rows, reads in flight) seen at least ``--min-calls`` times, from the runtime's call_groups.
The inline per-expert slope and the split calls' one-thread cost per expert (one-row calls, the fewest reads in
flight per expert count) are printed below the table; ``workers`` x their ratio is the speed-up a split call
reaches.

``--vram``: the same for the VRAM arms' gpu and zerocopy lanes (SYCL device slots, calibrate.vram_arms), and the
device-lane fit on the fit arms (C1, C4) with and without its reads-in-flight terms, as each arm's
lane time predicted over measured (docs/calibration.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _recipe import open_recipe, parser  # noqa: E402
from moetier.measure import calibrate  # noqa: E402
from moetier.measure import fit  # noqa: E402


def main(argv=None):
    ap = parser(steps=250)
    ap.add_argument("--min-calls", type=int, default=300)
    ap.add_argument("--vram", action="store_true", help="the VRAM arms' gpu and zerocopy lanes instead")
    a = ap.parse_args(argv)
    R, st, tr = open_recipe(a)
    if a.vram:
        return device_shapes(a, R, st, tr)
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


def device_shapes(a, R, st, tr):
    arms = calibrate.vram_arms(R)
    runs = {x["name"]: calibrate._measure(a.recipe, st, tr, x, a.steps, "sycl", 1.0) for x in arms}
    shapes = [{"arm": name, "lane": lane, "experts": e, "extra": x, "in_flight": cont, "calls": n, "ms": sec * 1e3 / n}
              for name, m in runs.items() for lane, e, x, cont, n, sec in m["call_groups"]
              if lane in ("gpu", "zc") and n >= a.min_calls]
    fitted = [runs[x["name"]] for x in arms if x["fit"]]
    # the same calls with reads in flight taken out: the fit without its read terms
    plain = [{**m, "call_groups": [[p, e, x, 0, n, sec] for p, e, x, _, n, sec in m["call_groups"]]}
             for m in fitted]
    terms = {"with": fit.fit_device_terms(fitted), "without": fit.fit_device_terms(plain)}
    errors = {}
    for name, m in runs.items():
        for lane, key in (("gpu", "gpu"), ("zc", "zerocopy")):
            calls = [g for g in m["call_groups"] if g[0] == lane]
            measured = sum(g[5] for g in calls) * 1e3
            for label, t in terms.items():
                c = t.get(key)
                if c and measured:
                    pred = sum(n * (c["per_layer_ms"] + c["per_expert_ms"] * e + c["per_extra_token_ms"] * x
                                    + c["per_read_ms"] * r + c["per_read_busy_ms"] * (r > 0))
                               for _, e, x, r, n, _ in calls)
                    errors[f"{name} {key} {label}"] = (pred / measured - 1) * 100
    out = {"shapes": shapes, "terms": terms, "lane_time_error_pct": errors}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| arm | lane | experts | extra rows | reads in flight | calls | ms per call |\n|---|---|---|---|---|---|---|")
    for s in shapes:
        print(f"| {s['arm']} | {s['lane']} | {s['experts']} | {s['extra']} | {s['in_flight']} | {s['calls']} | "
              f"{s['ms']:.3f} |")
    for k, v in errors.items():
        print(f"lane time predicted / measured - 1, {k} the reads and step-rows terms: {v:+.1f}%")


if __name__ == "__main__":
    main()
