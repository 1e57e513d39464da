"""How warm the cpu lane's calls run: split calls by how long their worker idled, inline calls by whether the host
had just blocked on a read.

    python benchmarks/bench_cpu_call_warmth.py --store DIR [--recipe tiny-local-cpu] [--steps 150] [--repeats 3]
        [--arms allram-C1 tail-C1 tail-mask-C1] [--json]

What it measures (the split call's wake-up term, docs/calibration.md): the calibration's
arms, interleaved, each call timed where the lane runs it (``CpuLane.run``). A split call's worker idle is the time
since the lane's last split call ended (what ``spec.idle_wake`` turns into the planner's units); an inline call
"after a wait" is the first call made after the decode thread blocked on a read (a ``wait`` that took over 50 us).
Prints the mean ms of 4-expert split calls per idle bucket and of 1-3 expert inline calls with and without a wait
before them, per arm.
"""
from __future__ import annotations

import json
import statistics
import time

from _recipe import open_recipe, parser  # noqa: E402 - benchmarks/ is on sys.path when this script runs
from backends.cpu import lane as lane_mod  # noqa: E402
from moetier.measure import calibrate  # noqa: E402
from moetier.run import runtime  # noqa: E402

BUCKETS_MS = ((0.0, 0.2), (0.2, 1.0), (1.0, float("inf")))


def main(argv=None):
    ap = parser(steps=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=["allram-C1", "tail-C1", "tail-mask-C1"])
    a = ap.parse_args(argv)
    R, st, tr = open_recipe(a)
    arms = {x["name"]: x for x in calibrate.default_arms(R, vram=False)}
    unknown = [n for n in a.arms if n not in arms]
    if unknown:
        raise SystemExit(f"bench_cpu_call_warmth: --arms: unknown {unknown}; expected some of {sorted(arms)}")
    calls = []             # (arm, split, experts, waited before, worker idle ms or None, ms)
    state = {"arm": None, "waited": False, "split_end": None}
    run_lane, wait = lane_mod.CpuLane.run, runtime.Runtime._wait

    def timed_run(self, jobs, x, view):          # diagnostic wrappers, this script only
        t0 = time.perf_counter()
        out = run_lane(self, jobs, x, view)
        t1 = time.perf_counter()
        split = self._pool is not None and len(jobs) >= max(2, self.parallel_min)
        idle = (t0 - state["split_end"]) * 1e3 if split and state["split_end"] is not None else None
        calls.append((state["arm"], split, len(jobs), state["waited"], idle, (t1 - t0) * 1e3))
        state["waited"] = False
        if split:
            state["split_end"] = t1
        return out

    def timed_wait(self, h, ticket=None, bucket="nvme_wait_s"):
        t = time.perf_counter()
        wait(self, h, ticket, bucket)
        if bucket == "nvme_wait_s" and time.perf_counter() - t > 50e-6:
            state["waited"] = True

    lane_mod.CpuLane.run, runtime.Runtime._wait = timed_run, timed_wait
    for _ in range(a.repeats):                     # A B C A B C: drift cancels across arms
        for name in a.arms:
            arm = arms[name]
            state.update(arm=name, waited=False, split_end=None)
            Ra = calibrate.arm_recipe(a.recipe, arm)
            be = runtime.make_backend("cpu", st, Ra, arm["conc"], 1.0)
            try:
                runtime.run(Ra, st, be, tr, arm["conc"], max_steps=a.steps)
            finally:
                be.close()

    def mean(sel):
        v = [c[5] for c in calls if sel(c)]
        return {"calls": len(v), "ms": statistics.fmean(v) if v else None}

    out = {}
    for name in a.arms:
        row = {f"split4 idle {lo}-{hi} ms": mean(lambda c, lo=lo, hi=hi: c[0] == name and c[1] and c[2] == 4
                                                   and c[4] is not None and lo <= c[4] < hi)
               for lo, hi in BUCKETS_MS}
        for n in (1, 2, 3):
            for waited in (True, False):
                row[f"inline{n} {'after a wait' if waited else 'no wait'}"] = mean(
                    lambda c, n=n, w=waited: c[0] == name and not c[1] and c[2] == n and c[3] == w)
        out[name] = row
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| arm | calls | n | mean ms |\n|---|---|---|---|")
    for name, row in out.items():
        for k, v in row.items():
            if v["calls"] >= 15:
                print(f"| {name} | {k} | {v['calls']} | {v['ms']:.3f} |")


if __name__ == "__main__":
    main()
