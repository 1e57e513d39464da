"""Core speed: plan_layer + ledger bookkeeping per layer call, simulator throughput, `moetier table` wall time.

    python benchmarks/bench_core.py [--json]
    python benchmarks/bench_core.py --against DIR [--calls N]   # paired A/B against another checkout
    python benchmarks/bench_core.py --opcodes                   # bytecodes per layer call, by function

plan_layer and the bookkeeping after it (the ledger's commit of the plan) are timed separately on every call; the
figures are min / median / max over the calls. Targets: plan_layer + bookkeeping median <= 20 us per layer call at
about 31 picks (C4); simulator >= 50,000 layer-plans/s on the shipped GLM trace at C1; `moetier table` on the default
recipe < 60 s.

``--against DIR`` loads DIR's moetier (e.g. a `git worktree` of main) beside this one and plans and commits every
layer call with both, in alternating order, on the same picks: the same statistic for both, taken in one run, so a
loaded host slows both alike; it prints each side's min / median / max, the median of the paired differences, and
how many plans differ (0: the change keeps every plan). ``--opcodes`` counts the bytecodes each function executes per
layer call (sys.settrace opcode events): a figure that does not move with the host's load, and says where the time
goes.
"""
from __future__ import annotations

import argparse
import json
import os
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


def _replay_of(R, tr, sim_mod, rows_per_call=4):
    """A replay seeded as bench_plan's, and its picks, from the given copy of moetier.core.sim."""
    rp = sim_mod.Replay(R)
    rp.ledger.seed(sim_mod.rank_keys(tr.ids[:1000, :, :R.topk], R.experts))
    return rp, sim_mod.Streams(tr, rows_per_call, R.topk, R.experts, offsets=[0] * rows_per_call)


def _load_tree(tree: Path):
    """(sim, plan_layer, records) of the moetier under ``tree``, imported beside the one already loaded."""
    import importlib
    mine = {m: mod for m, mod in sys.modules.items() if m == "moetier" or m.startswith("moetier.")}
    for m in mine:
        del sys.modules[m]
    sys.path.insert(0, str(tree))
    try:
        mods = [importlib.import_module(f"moetier.core.{m}") for m in ("sim", "plan", "records")]
    finally:
        sys.path.remove(str(tree))
        for m in [m for m in sys.modules if m == "moetier" or m.startswith("moetier.")]:
            del sys.modules[m]
        sys.modules.update(mine)
    if not str(Path(mods[0].__file__).resolve()).startswith(str(tree.resolve())):
        raise SystemExit(f"--against {tree}: imported {mods[0].__file__}, not that tree's moetier")
    return mods[0], mods[1].plan_layer, mods[2]


def bench_against(tree: Path, calls: int = 20000) -> dict:
    """Paired, interleaved A/B: this tree (B) and ``tree`` (A) plan and commit the same layer calls."""
    sim_a, plan_a, spec_a = _load_tree(tree)
    R = spec.resolve(RECIPE)
    tr = load_trace(REPO / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    sides = {"A": (*_replay_of(spec_a.resolve(RECIPE), tr, sim_a), plan_a), "B": (*_replay_of(R, tr, sim), plan_layer)}
    st = sides["B"][1]
    ns = {k: ([], []) for k in sides}
    clock = dict.fromkeys(sides, 0.0)
    perf = time.perf_counter_ns
    differ = n = step = 0
    while n < calls:
        rows = st.rows(step)
        for layer in range(R.layers):
            picks = st.picks(rows, layer)
            plans = {}
            for k in (("A", "B") if n % 2 == 0 else ("B", "A")):
                rp, _, plan_fn = sides[k]
                t0 = perf()
                plans[k] = p = plan_fn(rp.ctx, rp.ledger, picks, clock[k], rp.chan)
                t1 = perf()
                rp.commit(p, picks)
                ns[k][0].append(t1 - t0)
                ns[k][1].append(perf() - t1)
                clock[k] += p.ms + 1.0
            differ += plans["A"].lanes() != plans["B"].lanes() or plans["A"].ms != plans["B"].ms
            n += 1
        step += 1
    us = lambda xs: {"min": min(xs) / 1e3, "median": statistics.median(xs) / 1e3,  # noqa: E731
                     "max": max(xs) / 1e3}
    out = {"against": str(tree), "calls": n, "plans_differing": differ, "load": os.getloadavg()}
    for k in sides:
        tog = [a + b for a, b in zip(*ns[k])]
        out[k] = {"plan_us": us(ns[k][0]), "bookkeeping_us": us(ns[k][1]), "together_us": us(tog)}
    tog = {k: [a + b for a, b in zip(*ns[k])] for k in sides}
    out["paired_median_b_minus_a_us"] = statistics.median(b - a for a, b in zip(tog["A"], tog["B"])) / 1e3
    return out


def bench_opcodes(R, tr, calls: int = 1000) -> dict:
    """Bytecodes executed per layer call (plan_layer + commit), in total and by function, over ``calls`` calls."""
    import collections
    rp, st = _replay_of(R, tr, sim)
    picks_list, step = [], 0
    while len(picks_list) < calls:
        rows = st.rows(step)
        picks_list += [st.picks(rows, layer) for layer in range(R.layers)]
        step += 1
    count = collections.Counter()

    def trace(frame, event, arg):
        frame.f_trace_opcodes, frame.f_trace_lines = True, False

        def each(frame, event, arg):
            if event == "opcode":
                count[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1
            return each
        return each
    t = 0.0
    sys.settrace(trace)
    try:
        for picks in picks_list:
            p = plan_layer(rp.ctx, rp.ledger, picks, t, rp.chan)
            rp.commit(p, picks)
            t += p.ms + 1.0
    finally:
        sys.settrace(None)
    n = len(picks_list)
    return {"calls": n, "per_call": sum(count.values()) / n,
            "by_function": {k: v / n for k, v in count.most_common(15)}}


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
    ap.add_argument("--against", type=Path, help="another checkout: a paired, interleaved A/B of plan + commit")
    ap.add_argument("--calls", type=int, default=20000, help="layer calls of --against (default 20000)")
    ap.add_argument("--opcodes", action="store_true", help="bytecodes per layer call, by function")
    a = ap.parse_args(argv)
    R = spec.resolve(RECIPE)
    tr = load_trace(REPO / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    if a.against is not None or a.opcodes:
        return _print_extra(bench_against(a.against, a.calls) if a.against is not None else bench_opcodes(R, tr),
                            a.json)
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


def _print_extra(res: dict, as_json: bool) -> None:
    """--against / --opcodes output: a table, then the JSON line."""
    if as_json:
        print(json.dumps(res, indent=1, sort_keys=True))
        return
    if "against" in res:
        print(f"A = {res['against']}, B = this tree; {res['calls']:,} layer calls, interleaved; plans differing: "
              f"{res['plans_differing']}; load average {res['load'][0]:.1f}")
        print("| side | plan_layer | bookkeeping | together |  (us, min / median / max)\n|---|---|---|---|")
        for k in ("A", "B"):
            print(f"| {k} | " + " | ".join(f"{res[k][m]['min']:.1f} / {res[k][m]['median']:.1f} / {res[k][m]['max']:.0f}"
                                        for m in ("plan_us", "bookkeeping_us", "together_us")) + " |")
        print(f"paired median of B - A (together): {res['paired_median_b_minus_a_us']:+.2f} us")
    else:
        print(f"{res['per_call']:,.0f} bytecodes per layer call (plan_layer + commit) over {res['calls']:,} calls")
        for k, v in res["by_function"].items():
            print(f"| {k} | {v:,.0f} |")
    print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
