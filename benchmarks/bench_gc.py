"""The cyclic garbage collector's share of the runtime's step, per calibration arm.

    python benchmarks/bench_gc.py --store DIR [--recipe tiny-local-cpu] [--steps 200] [--arms a,b,..] [--pairs 2]
                                  [--json]

The host time outside every timer differed between arms in ways no runtime counter explained (the mask arm's a
step 26-30% below all-in-RAM C1's, docs/calibration.md). A collection runs wherever an allocation crosses the
threshold, and a full one walks every tracked object - the trace's routing lists included - so how often it runs
depends on what an arm allocates. This runs each arm's runtime (the calibration's cpu arms, interleaved A B A B)
and records every collection's pause (gc.callbacks): ms per step, collections per step by generation, and the
step's time outside the timers (fit.unbooked_ms) with and without the pauses.
"""
from __future__ import annotations

import gc
import json
import statistics
import time

from _recipe import open_recipe, parser  # noqa: E402 - benchmarks/ is on sys.path when this script runs
from moetier.measure import calibrate  # noqa: E402
from moetier.measure import fit  # noqa: E402
from moetier.run import runtime  # noqa: E402


class Pauses:
    """gc.callbacks hook: every collection's pause and generation from the end of the run's first step on (not the
    set-up's), over the steps since (``step`` is the runtime's step hook)."""

    def __init__(self):
        self.ms, self.by_gen, self._t, self.steps = 0.0, [0, 0, 0], 0.0, -1

    def __call__(self, phase, info):
        if self.steps < 0:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.ms += (time.perf_counter() - self._t) * 1e3
            self.by_gen[info["generation"]] += 1

    def step(self, counters) -> None:
        self.steps += 1

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def one(recipe_id, arm, st, tr, steps) -> dict:
    """One run of ``arm``: its tok/s, ms a step outside the timers and in collections, collections a step."""
    R = calibrate.arm_recipe(recipe_id, arm)
    be = runtime.make_backend("cpu", st, R, arm["conc"], 1.0)
    try:
        with Pauses() as p:
            res = runtime.run(R, st, be, tr, arm["conc"], max_steps=steps, step_hook=p.step)
    finally:
        be.close()
    n = max(1, p.steps)                            # warm-up steps too: pauses are not booked to a step
    outside = fit.unbooked_ms({"counters": res["counters"], "steps": res["steps"], "wall_s": res["wall_s"]})
    return {"tok_s": res["tok_s"], "outside_ms": outside, "gc_ms": p.ms / n,
            "gc_per_step": [g / n for g in p.by_gen]}


def main(argv=None):
    ap = parser(200)
    ap.add_argument("--arms", default="allram-C1,tail-C1,tail-mask-C1,tail-C4")
    ap.add_argument("--pairs", type=int, default=2)
    a = ap.parse_args(argv)
    R, st, tr = open_recipe(a)
    by_name = {x["name"]: x for x in calibrate.default_arms(R, vram=False)}
    names = a.arms.split(",")
    runs: dict = {n: [] for n in names}
    for _ in range(a.pairs):
        for n in names:
            runs[n].append(one(R.id, by_name[n], st, tr, a.steps))
    out = {n: {k: statistics.median(r[k] for r in rs) for k in ("tok_s", "outside_ms", "gc_ms")}
           | {"gc_per_step": [statistics.median(r["gc_per_step"][g] for r in rs) for g in range(3)]}
           for n, rs in runs.items()}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| arm | tok/s | outside the timers, ms/step | gc pauses, ms/step | outside less gc | collections/step "
          "(gen 0/1/2) |\n|---|---|---|---|---|---|")
    for n, o in out.items():
        print(f"| {n} | {o['tok_s']:.1f} | {o['outside_ms']:.3f} | {o['gc_ms']:.3f} | "
              f"{o['outside_ms'] - o['gc_ms']:.3f} | {' / '.join(f'{g:.2f}' for g in o['gc_per_step'])} |")


if __name__ == "__main__":
    main()
