"""Core speed: plan_layer + ledger bookkeeping per layer call, simulator throughput, `moetier table` wall time.

    python benchmarks/bench_core.py [--json]

plan_layer and the bookkeeping after it (the ledger's commit of the plan) are timed separately on every call; the
figures are min / median / max over the calls. Targets: plan_layer + bookkeeping median <= 20 us per layer call at
about 31 picks (C4); simulator >= 50,000 layer-plans/s on the shipped GLM trace at C1; `moetier table` on the default
recipe < 60 s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.core import sim  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.core.plan import plan_layer  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402

RECIPE = "glm53-rtx3090-55g-nvx4"


def bench_plan(R, tr, rows_per_call=4, calls=20000):
    """Wall time of plan_layer and of the commit (the bookkeeping) per layer call at C4 (~31 picks per layer), on a
    ledger seeded from the trace's first 1,000 tokens."""
    rp = sim.Replay(R)
    rp.ledger.seed(sim.rank_keys(tr.ids[:1000, :, :R.topk], R.experts))
    st = sim.Streams(tr, rows_per_call, R.topk, R.experts, offsets=[0, 0, 0, 0])
    plan_ns, commit_ns, npicks = [], [], []
    t = 0.0
    step = 0
    perf = time.perf_counter_ns
    while len(plan_ns) < calls:
        rows = st.rows(step)
        for layer in range(R.layers):
            picks = st.picks(rows, layer)
            t0 = perf()
            plan = plan_layer(rp.ctx, rp.ledger, picks, t, rp.chan)
            t1 = perf()
            rp.commit(plan, picks)
            t2 = perf()
            plan_ns.append(t1 - t0)
            commit_ns.append(t2 - t1)
            npicks.append(len(picks))
            t += plan.ms + 1.0
        step += 1
    us = lambda xs: {"min": min(xs) / 1e3, "median": statistics.median(xs) / 1e3,  # noqa: E731
                     "max": max(xs) / 1e3}
    return {"plan_us": us(plan_ns), "bookkeeping_us": us(commit_ns),
            "together_us": us([a + b for a, b in zip(plan_ns, commit_ns)]),
            "mean_picks": statistics.mean(npicks), "calls": len(plan_ns)}


def bench_sim(R, tr):
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        o = sim.run(R, tr, 1)
        dt = time.perf_counter() - t0
        rate = o["layer_plans"] / dt
        best = max(best or 0, rate)
    return {"layer_plans_per_s": best, "layer_plans": o["layer_plans"], "replay_s": o["layer_plans"] / best}


def bench_table():
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "moetier", "table"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return {"seconds": time.perf_counter() - t0}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    R = spec.resolve(RECIPE)
    tr = load_trace(REPO / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    res = {"plan_layer": bench_plan(R, tr), "simulator": bench_sim(R, tr), "table": bench_table()}
    res["targets"] = {"plan_and_bookkeeping_median_us<=20": res["plan_layer"]["together_us"]["median"] <= 20,
                      "sim_layer_plans_per_s>=50000": res["simulator"]["layer_plans_per_s"] >= 50000,
                      "table_s<60": res["table"]["seconds"] < 60}
    if a.json:
        print(json.dumps(res, indent=1, sort_keys=True))
        return
    p, s, t = res["plan_layer"], res["simulator"], res["table"]
    print("| measure | value | target |\n|---|---|---|")
    for name, key in (("plan_layer", "plan_us"), ("bookkeeping (commit)", "bookkeeping_us"),
                      ("plan_layer + bookkeeping", "together_us")):
        v = p[key]
        target = "<= 20 us" if key == "together_us" else ""
        print(f"| {name} per layer call ({p['mean_picks']:.1f} picks), min / median / max | {v['min']:.1f} / "
              f"{v['median']:.1f} / {v['max']:.1f} us | {target} |")
    print(f"| simulator, C1 on the shipped GLM trace | {s['layer_plans_per_s']:,.0f} layer-plans/s "
          f"({s['replay_s']:.2f} s for {s['layer_plans']:,}) | >= 50,000 |")
    print(f"| moetier table (default recipe) | {t['seconds']:.1f} s | < 60 s |")
    print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
