"""How far two quick calibrations of one machine disagree, by their number of checked repeats.

    python benchmarks/bench_quick_agreement.py --store DIR [--repeats 2 4] [--steps 200]

In temporary user registries: ``moetier bench --store DIR --recipe tiny-local-cpu`` once, then for every ``--repeats``
value two ``moetier calibrate tiny-local-cpu-bench --quick --repeats N`` runs, each into its own copy of the bench's
records, in the order A(N1) A(N2) .. B(N1) B(N2) .. so that no value gets the quieter minutes. The simulator then
predicts every arm of the calibration matrix without a VRAM tier from each copy; for each N, per arm, B / A - 1 and
its median and max magnitude. Nothing runs the arms for real: this is the quick calibration's own repeatability,
the floor under any error goal set for it (docs/fidelity.md, "A quick calibration"). It prints a table and, with
--json, the figures and the seconds each calibration took.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import bench_fidelity as bf       # beside this script: its bench/calibrate runner and its arm-by-arm changes

sys.path.insert(0, str(bf.REPO))


def predictions(registry: str, rid: str, steps: int) -> dict[str, float]:
    """Every non-VRAM arm of the matrix predicted from ``registry``'s records: arm -> tok/s."""
    from moetier.core import records as spec, sim
    from moetier.measure import calibrate
    prev = spec.set_user_registry(registry)
    try:
        R, tr = bf.recipe_and_trace(rid)
        return {a["name"]: sim.run(calibrate.arm_recipe(rid, a), tr, a["conc"], max_steps=steps)["tok_s"]
                for a in calibrate.default_arms(R, vram=False)}
    finally:
        spec.set_user_registry(prev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="a packed moetier-tiny-16x64-int8 store")
    ap.add_argument("--repeats", type=int, nargs="+", default=[2, 4], help="checked repeats to compare (default 2 4)")
    ap.add_argument("--steps", type=int, default=200, help="steps per predicted arm (default 200)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if any(n < 1 for n in a.repeats) or a.steps < 1:
        print("bench_quick_agreement: --repeats and --steps must be positive", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="moetier-quick-agreement-")
    rid = f"{bf.RECIPE}-bench"
    try:
        bench = os.path.join(base, "bench")
        res = {"bench_s": round(bf.moetier("bench", "--store", a.store, "--recipe", bf.RECIPE, registry=bench), 1),
               "load_before": [round(x, 2) for x in os.getloadavg()], "by_repeats": {}}
        regs: dict[int, list[str]] = {n: [] for n in a.repeats}
        secs: dict[int, list[float]] = {n: [] for n in a.repeats}
        for side in "AB":
            for n in a.repeats:
                reg = shutil.copytree(bench, os.path.join(base, f"{side}{n}"))
                secs[n].append(round(bf.moetier("calibrate", rid, "--store", a.store, "--quick", "--repeats", str(n),
                                                registry=reg), 1))
                regs[n].append(reg)
        for n in a.repeats:
            pa, pb = (predictions(r, rid, a.steps) for r in regs[n])
            res["by_repeats"][str(n)] = {"seconds": secs[n], **bf.changes((arm, pa[arm], pb[arm]) for arm in pa)}
        res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    ns = [str(n) for n in a.repeats]
    print("| arm | " + " | ".join(f"B / A, {n} repeats" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for arm in res["by_repeats"][ns[0]]["by_arm"]:
        print(f"| {arm} | " + " | ".join(f"{res['by_repeats'][n]['by_arm'][arm]:+.1f}%" for n in ns) + " |")
    for n in ns:
        r = res["by_repeats"][n]
        print(f"{n} repeats: median {r['median_abs_pct']:.1f}%, max {r['max_abs_pct']:.1f}% ({r['max_arm']}); "
              f"seconds {r['seconds']}")
    print(f"bench {res['bench_s']} s; load average {res['load_before']} before, {res['load_after']} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
