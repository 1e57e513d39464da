"""How well the simulator predicts a machine from `moetier bench` alone, and from `moetier calibrate --quick`.

In a temporary user registry (MOETIER_REGISTRY; nothing shipped and nothing of the user's is read or written):

1. ``moetier bench --store STORE --recipe tiny-local-cpu`` writes the bench's records and recipe ``tiny-local-cpu-bench``
   on them (no calibrated term of the shipped records reaches it);
2. every arm of the calibration matrix without a VRAM tier (``calibrate.default_arms(R, vram=False)``: all-in-RAM,
   the NVMe tail, a tighter budget, prefetch, mask at C1/C2/C4) runs for real on moetier's runtime, its repeats
   interleaved (A B .. A B ..) and pooled as `moetier calibrate` pools them (``calibrate._merge``: the middle
   repeats), and the simulator predicts each from the bench's terms, with its interval (moetier.core.interval);
3. ``moetier calibrate tiny-local-cpu-bench --quick`` fits its terms into the same records; a second quick
   calibration, right after it, fits its own into a copy of the bench's registry; step 2 runs again, predicted from
   the first (the goal) and from the second (how far two quick calibrations of one machine disagree).

The noise floor, beside the errors: each arm's repeats (min-max), the change of each arm's measured tok/s between
the two phases (same code, same arms, minutes apart), and the two quick calibrations' disagreement. An error goal
below the arms' own change between phases cannot be told apart from the machine's noise.

It writes benchmarks/fidelity-<machine>.json and .md: per phase, each arm's measured and predicted tok/s, the
interval, the error, and the median and max |error| and the share of arms inside their interval; the noise floor;
the seconds each command took and the load average (other jobs on a shared machine move every figure).

    python benchmarks/bench_fidelity.py --store /tmp/local-store      # packed moetier-tiny-16x64-int8
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = "tiny-local-cpu"
GOALS = {"bench": {"median": 10.0, "max": 20.0, "inside": 0.8}, "quick": {"median": 5.0, "max": 10.0}}


def machine() -> str:
    """A short description of this machine's hardware: CPU model, cores, memory."""
    import psutil
    model = platform.machine()
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1]
                break
    except OSError:
        pass
    model = re.sub(r"\((r|tm)\)|cpu|processor|\d+-core|@.*", "", model, flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return f"{slug}-{os.cpu_count()}c-{round(psutil.virtual_memory().total / 2**30)}g"


def moetier(*argv, registry: str) -> float:
    """Run one moetier command (this checkout, user registry ``registry``); its seconds."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(REPO), MOETIER_QUIET="1", MOETIER_REGISTRY=registry)
    r = subprocess.run([sys.executable, "-m", "moetier", *argv], cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench_fidelity: moetier {' '.join(argv)} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def measure_arms(recipe_id: str, st, tr, arms, steps: int, repeats: int) -> dict[str, dict]:
    """Every arm for real, repeats interleaved, pooled as calibrate pools them: arm -> {tok_s, each}."""
    from moetier.measure import calibrate
    runs: dict[str, list] = {a["name"]: [] for a in arms}
    for _ in range(repeats):
        for a in arms:
            runs[a["name"]].append(calibrate._measure(recipe_id, st, tr, a, steps, "cpu", 1.0))
    out = {}
    for name, rs in runs.items():
        m = calibrate._merge(rs)
        out[name] = {"tok_s": m["tokens"] / m["wall_s"], "each": m["tok_s_each"]}
    return out


def recipe_and_trace(recipe_id: str):
    """The recipe as the user registry resolves it, and its routing trace."""
    from moetier.cli.common import find_path
    from moetier.core import records as spec
    from moetier.traces.format import load_trace
    R = spec.resolve(recipe_id)
    return R, load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)


def predict_arms(recipe_id: str, tr, arms, measured: dict, steps: int) -> list[dict]:
    """Each arm predicted from the user registry's records, with its interval, against its measured tok/s."""
    from moetier.core import interval, sim
    from moetier.measure import calibrate
    rows = []
    for a in arms:
        meas = measured[a["name"]]["tok_s"]
        R = calibrate.arm_recipe(recipe_id, a)
        pred = sim.run(R, tr, a["conc"], max_steps=steps)["tok_s"]
        iv = interval.interval(R, sim.run, tr, a["conc"], max_steps=steps)
        rows.append({"arm": a["name"], "conc": a["conc"], "measured_tok_s": round(meas, 3),
                     "measured_each": [round(x, 3) for x in measured[a["name"]]["each"]], "sim_tok_s": round(pred, 3),
                     "interval": [round(iv["low"], 3), round(iv["high"], 3)], "basis": iv["basis"],
                     "error_pct": round((pred / meas - 1) * 100, 2), "inside": interval.inside(meas, iv)})
    return rows


def summary(rows) -> dict:
    errs = [abs(r["error_pct"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    return {"arms": len(rows), "median_abs_error_pct": round(statistics.median(errs), 2),
            "max_abs_error_pct": round(max(errs), 2), "max_arm": worst["arm"],
            "inside_share": round(sum(bool(r["inside"]) for r in rows) / len(rows), 3)}


def changes(pairs) -> dict:
    """(arm, a, b) -> per arm b / a - 1 in %, and the median and max of its magnitude."""
    ch = {arm: round((b / a - 1) * 100, 2) for arm, a, b in pairs}
    worst = max(ch, key=lambda k: abs(ch[k]))
    return {"by_arm": ch, "median_abs_pct": round(statistics.median(abs(v) for v in ch.values()), 2),
            "max_abs_pct": round(abs(ch[worst]), 2), "max_arm": worst}


def noise_floor(res: dict) -> dict:
    """What the machine's own noise allows: the arms' change between the phases, the quick calibrations' disagreement."""
    out = {}
    if "quick" in res:
        q = {r["arm"]: r for r in res["quick"]["rows"]}
        out["arm_change"] = changes((r["arm"], r["measured_tok_s"], q[r["arm"]]["measured_tok_s"])
                                    for r in res["bench"]["rows"])
    if "quick_again" in res:
        a = {r["arm"]: r for r in res["quick"]["rows"]}
        out["quick_disagreement"] = changes((r["arm"], a[r["arm"]]["sim_tok_s"], r["sim_tok_s"])
                                            for r in res["quick_again"]["rows"])
    return out


def _spread(each) -> str:
    return f"{min(each):.1f}-{max(each):.1f}"


def markdown(res: dict) -> str:
    out = [f"# Fidelity on {res['machine']}", "",
           f"`python benchmarks/bench_fidelity.py --store STORE --steps {res['steps']} --repeats {res['repeats']}` "
           f"(STORE: `moetier store pack moetier-tiny-16x64-int8`), {res['cores']} cores; load average "
           f"{res['load_before']} before, {res['load_after']} after. Measured tok/s: the middle repeats pooled "
           f"(`calibrate._merge`); repeats: the range of every repeat.", ""]
    titles = (("bench", "From `moetier bench` alone"), ("quick", "From `moetier calibrate --quick`"),
              ("quick_again", "From a second `moetier calibrate --quick`, run right after the first"))
    for phase, title in titles:
        p = res.get(phase)
        if not p:
            continue
        s = p["summary"]
        out += [f"## {title} ({p['seconds']:.0f} s: `{p['command']}`)", "",
                "| arm | conc | measured tok/s | repeats | predicted | interval | error | inside |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['arm']} | {r['conc']} | {r['measured_tok_s']:.2f} | {_spread(r['measured_each'])} | "
                f"{r['sim_tok_s']:.2f} | {r['interval'][0]:.2f}-{r['interval'][1]:.2f} | {r['error_pct']:+.1f}% | "
                f"{'yes' if r['inside'] else 'no'} |" for r in p["rows"]]
        goal = GOALS.get(phase)
        line = (f"Median |error| {s['median_abs_error_pct']:.1f}%, max {s['max_abs_error_pct']:.1f}% "
                f"({s['max_arm']}), {100 * s['inside_share']:.0f}% of {s['arms']} arms inside their interval")
        if goal:
            line += (f"; goals: median <= {goal['median']:.0f}%, max <= {goal['max']:.0f}%"
                     + (f", inside >= {100 * goal['inside']:.0f}%" if "inside" in goal else ""))
        out += ["", line + ".", ""]
    nf = res.get("noise_floor") or {}
    if nf:
        out += ["## The noise floor", "", "| arm | measured, quick phase / bench phase | quick again / quick, predicted |",
                "|---|---|---|"]
        arms = [r["arm"] for r in res["bench"]["rows"]]
        col = lambda key, arm: f"{nf[key]['by_arm'][arm]:+.1f}%" if key in nf else "-"
        out += [f"| {a} | {col('arm_change', a)} | {col('quick_disagreement', a)} |" for a in arms]
        out.append("")
        for key, what in (("arm_change", "The arms' own change between the phases"),
                          ("quick_disagreement", "Two quick calibrations' disagreement")):
            if key in nf:
                out.append(f"{what}: median {nf[key]['median_abs_pct']:.1f}%, max {nf[key]['max_abs_pct']:.1f}% "
                           f"({nf[key]['max_arm']}).")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="a packed moetier-tiny-16x64-int8 store")
    ap.add_argument("--steps", type=int, default=200, help="measured steps per arm and repeat (default 200)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="interleaved repeats of the arms (default 5; the middle 3 are pooled)")
    ap.add_argument("--skip-quick", action="store_true", help="the bench phase only")
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks"), help="where the .json and .md go")
    args = ap.parse_args(argv)
    reg = tempfile.mkdtemp(prefix="moetier-fidelity-")
    again = reg + "-again"
    os.environ["MOETIER_REGISTRY"] = reg
    try:
        run(args, reg, again)
    finally:
        shutil.rmtree(reg, ignore_errors=True)
        shutil.rmtree(again, ignore_errors=True)
    return 0


def run(args, reg: str, again: str) -> None:
    """Both phases into user registry ``reg``; the second quick calibration into ``again``, a copy of the bench's."""
    from moetier.bytes import store
    from moetier.core import records as spec
    from moetier.measure import calibrate
    name = machine()
    res = {"machine": name, "cores": os.cpu_count(), "steps": args.steps, "repeats": args.repeats,
           "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "load_before": [round(x, 2) for x in os.getloadavg()], "goals": GOALS}
    rid = f"{RECIPE}-bench"
    secs = moetier("bench", "--store", args.store, "--recipe", RECIPE, registry=reg)
    shutil.copytree(reg, again)
    R, tr = recipe_and_trace(rid)
    st = store.open_store(args.store, model=R.model)
    arms = calibrate.default_arms(R, vram=False)

    def phase(key, command, seconds, measured):
        rows = predict_arms(rid, tr, arms, measured, args.steps)
        res[key] = {"command": command, "seconds": round(seconds, 1), "rows": rows, "summary": summary(rows)}
        print(key, json.dumps(res[key]["summary"]), file=sys.stderr)

    phase("bench", f"moetier bench --store STORE --recipe {RECIPE}", secs,
          measure_arms(rid, st, tr, arms, args.steps, args.repeats))
    write(res, Path(args.out_dir), name)       # what the bench phase found stays if the next one fails
    if not args.skip_quick:
        quick = ("calibrate", rid, "--store", args.store, "--quick", "--overlay")   # into the records it checks
        secs = moetier(*quick, registry=reg)
        secs_again = moetier(*quick, registry=again)
        measured = measure_arms(rid, st, tr, arms, args.steps, args.repeats)
        phase("quick", f"moetier calibrate {rid} --store STORE --quick", secs, measured)
        prev = spec.set_user_registry(again)
        try:
            phase("quick_again", f"moetier calibrate {rid} --store STORE --quick", secs_again, measured)
        finally:
            spec.set_user_registry(prev)
        res["noise_floor"] = noise_floor(res)
    write(res, Path(args.out_dir), name)

def write(res: dict, out: Path, name: str) -> None:
    from moetier.atomic import atomic_write
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    for path, text in ((out / f"fidelity-{name}.json", json.dumps(res, indent=1) + "\n"),
                       (out / f"fidelity-{name}.md", markdown(res))):
        atomic_write(path, lambda f, b=text.encode(): f.write(b))
    print(f"wrote {out / f'fidelity-{name}.md'}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
