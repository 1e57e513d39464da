"""Core speed: plan_layer + ledger bookkeeping per layer call, simulator throughput, and the wall of the commands
that run the core: `moetier table` (warm, and first run after install), `moetier compare`, a sweep.

    python benchmarks/bench_core.py [--json] [--rounds 3]
    python benchmarks/bench_core.py --against DIR [--calls N] [--rounds 3]   # paired A/B against another checkout
    python benchmarks/bench_core.py --opcodes                   # bytecodes per layer call, by function
    python benchmarks/bench_core.py --commit-profile            # the commit kernel alone, and the tiers' work
    python benchmarks/bench_core.py --against DIR --rows 1 --skip sim table table_first compare sweep   # C1 per call
    python benchmarks/bench_core.py --skip compare sweep        # leave out the long measures

Per layer call: plan_layer and the bookkeeping after it (the ledger's commit of the plan and the LFU counts) are
timed separately on every call at C4 (about 31 picks a layer; ``--rows``: another rows per call) on the default
recipe under the shipped default policy (peers.DEFAULT_POLICY); the figures are min / median / max over the calls.

With ``--against``, this tree's simulator path is timed after them: the compiled step loop
(moetier.core.step_kernel) plans and commits every layer of a step in one call, so its figure per layer call is a
step's wall over its layers (min / median / max over 400 steps), on a replay seeded and fed as the per-call sides.

Whole runs, each a fresh process (``--rounds`` of each; min / median / max over them):

* ``sim``: the simulator's layer-plans/s on the shipped GLM trace at C1 (the replay alone, timed inside the process);
* ``table``: `moetier table` wall, warm (a compiled core's cache already filled);
* ``table_first``: `moetier table` wall with a fresh, empty NUMBA_CACHE_DIR: the first run after install, which
  compiles into the cache;
* ``compare``: `moetier compare` of the default recipe, ``--compare-steps`` measured steps and
  ``--compare-warmup`` warm-up tokens per replay, without the gap split unless ``--compare-gap``: the full command
  (1,000 warm-up tokens, the gap's three more replays a row) is tens of minutes on two loaded cores, and every
  replay runs the same per-layer path, so the capped run's ratio is the full one's;
* ``sweep``: a ``--sweep-cells`` sweep of the default recipe (RAM budget x VRAM slots x ram_evict lru/lfu x C1, C2,
  C4, C8; 2 measured steps and 4 warm-up tokens a cell, as benchmarks/bench_sweep.py), 2 workers. The JSON gives
  its wall over the cells (``per_cell_s``, the start-up included): 1,000 x that bounds a 1,000-cell sweep from
  above.

Targets (issue: the core at machine speed): plan_layer + bookkeeping median <= 10 us per layer call at about 31
picks; simulator >= 300,000 layer-plans/s on the GLM trace at C1; `moetier table` <= 2 s warm.

``--runs-only`` (with ``--against``) leaves the per-call A/B out and times the whole runs alone.

``--against DIR`` (e.g. a `git worktree` of main) runs the per-call figure in ``--rounds`` rounds, each running it
once in a process of each tree (DIR's moetier, then this one's, the order flipping every round): the same
statistic on the same picks, so drift in the host's load lands on both. It prints per side the min / median / max
of the rounds' medians, B / A of the medians, and whether every run planned alike (a digest of each plan's lanes
and time: the change keeps every plan). Each side has a process of its own because Numba links two trees' kernels
of the same name to one machine code, so a process holding both would run one side's kernels on the other's
arrays. The whole runs alternate too (round i runs A then B, round i + 1 B then A, each measure in turn), each side
in its own tree (cwd and PYTHONPATH), and each measure gets the ratio B / A of the medians and of the mins.
``--opcodes`` counts the bytecodes each function executes per layer call (sys.settrace opcode events): a figure that
does not move with the host's load, and says where the time goes. ``--commit-profile`` times the commit kernel alone
on the recorded plans (and on a plan with no picks, its crossing) and counts the tiers' work per layer call.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
# the per-call A/B runs this script in a process per side, each importing its own tree's moetier
TREE = "MOETIER_BENCH_TREE"
sys.path.insert(0, os.environ.get(TREE) or str(REPO))

import xxhash  # noqa: E402

from moetier.core import sim  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.core.plan import plan_layer  # noqa: E402
from moetier.peers.rows import DEFAULT_POLICY  # noqa: E402
from _recipe import recipe_trace  # noqa: E402
from _rounds import alternate  # noqa: E402

RECIPE = "glm53-rtx3090-55g-nvx4"
# the shipped default policy, stated rather than inherited from the recipe: the per-call figure is the goal's
DEFAULT = [f"policy.{k}={json.dumps(v)}" for k, v in DEFAULT_POLICY.items()]
TARGETS = {"together_us": 10.0, "layer_plans_per_s": 300_000.0, "table_s": 2.0}
MEASURES = ("sim", "table", "table_first", "compare", "sweep")


def default_recipe() -> tuple:
    """The benchmarked recipe under the shipped default policy, and its trace."""
    R = spec.resolve(RECIPE, DEFAULT)
    return R, recipe_trace(R)


def bench_plan(R, tr, rows_per_call=4, calls=20000):
    """Wall time of plan_layer and of the commit (the bookkeeping) per layer call at C4 (~31 picks per layer), on a
    ledger seeded from the trace's first 1,000 tokens; ``plans``: a digest of every plan's lanes and time (two trees
    that plan alike give the same)."""
    rp, st = _replay_of(R, tr, rows_per_call)
    digest = xxhash.xxh64()
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
            rp.after_layer(picks)
            t2 = perf()
            plan_ns.append(t1 - t0)
            commit_ns.append(t2 - t1)
            npicks.append(len(picks))
            digest.update(repr((plan.lanes(), plan.ms)).encode())
            t += plan.ms + 1.0
        step += 1
    us = lambda xs: {"min": min(xs) / 1e3, "median": statistics.median(xs) / 1e3,  # noqa: E731
                     "max": max(xs) / 1e3}
    return {"plan_us": us(plan_ns), "bookkeeping_us": us(commit_ns),
            "together_us": us([a + b for a, b in zip(plan_ns, commit_ns)]),
            "mean_picks": statistics.mean(npicks), "calls": len(plan_ns), "plans": digest.hexdigest()}


def _replay_of(R, tr, rows_per_call=4):
    """A replay seeded as bench_plan's, and its picks."""
    rp = sim.Replay(R)
    rp.ledger.seed(sim.rank_keys(tr.ids[:1000, :, :R.topk], R.experts))
    return rp, sim.Streams(tr, rows_per_call, R.topk, R.experts, offsets=[0] * rows_per_call)


def _plan_side(tree: Path, a) -> dict:
    """bench_plan in a fresh process of ``tree`` (its moetier, and this script)."""
    env = dict(os.environ, PYTHONPATH=str(tree), **{TREE: str(tree)})
    r = subprocess.run([sys.executable, str(HERE), "--child-plan", "--calls", str(a.calls), "--rows", str(a.rows)],
                       cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"bench_core: the per-call run in {tree} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_against(tree: Path, a, run=_plan_side) -> dict:
    """The per-call A/B: ``a.rounds`` rounds, each running bench_plan once in a process of each tree (A: ``tree``,
    B: this one), the order flipping every round. Per side and figure the min / median / max of the rounds'
    medians; ``same_plans``: every run's plans digest alike."""
    got = alternate("bench_core", {"A": tree, "B": REPO}, a, run)
    out = {"against": str(tree), "calls": got["B"][0]["calls"], "rounds": a.rounds, "load": os.getloadavg(),
           "same_plans": len({r["plans"] for runs in got.values() for r in runs}) == 1}
    for k, runs in got.items():
        out[k] = {f: {s: fn([r[f]["median"] for r in runs]) for s, fn in
                      (("min", min), ("median", statistics.median), ("max", max))}
                  for f in ("plan_us", "bookkeeping_us", "together_us")}
    out["ratio_b_over_a"] = out["B"]["together_us"]["median"] / out["A"]["together_us"]["median"]
    return out


def bench_loop(R, tr, rows_per_call=4, steps=400) -> dict:
    """The simulator's own path per layer call: the compiled step loop (moetier.core.step_kernel) plans and commits
    every layer of a step in one call, on a replay seeded as bench_plan's; a step's wall over its layers, min /
    median / max over the steps (the first, which loads the kernels, left out)."""
    from moetier.core.step_kernel import Steps
    rp, st = _replay_of(R, tr, rows_per_call)
    loop = Steps.of(rp, st)
    perf, t, ns = time.perf_counter_ns, 0.0, []
    for step in range(steps + 1):
        t0 = perf()
        t = loop.step(st.rows(step), t, False)
        ns.append((perf() - t0) / R.layers / 1e3)
    ns = ns[1:]
    return {"together_us": {"min": min(ns), "median": statistics.median(ns), "max": max(ns)}, "steps": steps}


def bench_commit(R, tr, rows_per_call=4, calls=4000) -> dict:
    """Where the commit's time goes: the tiers' work per layer call (the plans' lanes, the evictions), and the commit
    kernel timed alone, replaying the same plans back to back on a ledger seeded alike, beside a plan with no picks
    (the crossing alone: the kernel's 16 arguments). us, min / median / max over the calls."""
    import numpy as np

    from moetier.core import commit_kernel as CK
    rp, st = _replay_of(R, tr, rows_per_call)
    L, plans, t, step = rp.ledger, [], 0.0, 0
    while len(plans) < calls:
        rows = st.rows(step)
        for layer in range(R.layers):
            picks = st.picks(rows, layer)
            plan = plan_layer(rp.ctx, L, picks, t, rp.chan)
            plans.append(plan.packed.copy())
            rp.commit(plan, picks)
            rp.after_layer(picks)
            t += plan.ms + 1.0
        step += 1
    counts = L.counters
    lanes = np.mean([O[:6] for O in plans], axis=0).tolist()
    again = _replay_of(R, tr, rows_per_call)[0]
    args, admit, perf = again.ledger._kargs, again.ctx.can_admit, time.perf_counter_ns
    alone, empty, none = [], [], np.zeros(6, np.int64)
    for O in plans:
        t0 = perf()
        CK.commit(O, *args, admit)
        alone.append(perf() - t0)
    if again.ledger.codes != L.codes:
        raise SystemExit("bench_core: the replayed commits left other tiers than the run")
    for _ in range(len(plans)):
        t0 = perf()
        CK.commit(none, *args, admit)
        empty.append(perf() - t0)
    us = lambda xs: {"min": min(xs) / 1e3, "median": statistics.median(xs) / 1e3,  # noqa: E731
                     "max": max(xs) / 1e3}
    n = len(plans)
    return {"calls": n, "lanes": dict(zip(("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked"), lanes)),
            "vram_evictions": counts["vram_evictions"] / n, "ram_evictions": counts["ram_evictions"] / n,
            "commit_alone_us": us(alone), "commit_empty_us": us(empty)}


def bench_opcodes(R, tr, calls: int = 1000) -> dict:
    """Bytecodes executed per layer call (plan_layer + commit), in total and by function, over ``calls`` calls."""
    import collections
    rp, st = _replay_of(R, tr)
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


# the simulator's replay alone, in a fresh process of the tree it runs in: layer-plans / the replay's own seconds
_SIM = ("import json, sys; from moetier.core import records as spec, sim; from moetier.traces.format import load_trace;"
        "R = spec.resolve(sys.argv[1], sys.argv[2:]); "
        "tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk); "
        "o = sim.run(R, tr, 1); print(json.dumps([o['layer_plans'], o['sim_seconds']]))")


def _sweep_grid(cells: int) -> list:
    """`moetier sweep` arguments for about ``cells`` cells (a multiple of 40 is exact), as bench_sweep.py's grid."""
    per = max(1, -(-cells // 40))
    return ["--grid", "budget.ram_gb=" + ",".join(str(20 + 4 * i) for i in range(per)),
            "budget.vram_expert_slots=1000,1250,1510,1750,2000", "--policy", "lru", "lfu", "--conc", "1", "2", "4",
            "8", "--steps", "2", "--set", "policy.warmup_tokens=4", "--workers", "2"]


def whole_run(tree: Path, measure: str, a) -> float:
    """One run of ``measure`` in ``tree`` (its own moetier: cwd and PYTHONPATH): seconds, or layer-plans/s for sim."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory(prefix="bench-core-") as tmp:
        env["MOETIER_REGISTRY"] = str(Path(tmp) / "registry")     # nothing lands in the user's registry
        if measure == "table_first":
            env["NUMBA_CACHE_DIR"] = str(Path(tmp) / "numba")      # empty: this run compiles into it
        cmd = [sys.executable, "-m", "moetier"]
        if measure == "sim":
            cmd = [sys.executable, "-c", _SIM, RECIPE]
        elif measure in ("table", "table_first"):
            cmd += ["table", "--quiet"]
        elif measure == "compare":
            cmd += ["compare", RECIPE, "--steps", str(a.compare_steps), "--quiet", "--json"]
            cmd += [] if a.compare_gap else ["--no-gap"]
            cmd += ["--set", f"policy.warmup_tokens={a.compare_warmup}"] if a.compare_warmup else []
        else:
            cmd += ["sweep", RECIPE, *_sweep_grid(a.sweep_cells), "--out", str(Path(tmp) / "sweep.jsonl"),
                    "--quiet", "--json"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"bench_core: {measure} in {tree} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    if measure == "sim":
        plans, seconds = json.loads(r.stdout.strip().splitlines()[-1])
        return plans / seconds
    return dt


def bench_runs(trees: dict, measures, rounds: int, a) -> dict:
    """``rounds`` runs of every measure on every tree ({side: path}), interleaved: the sides' order flips every
    round, so drift in the host's load lands on both; per side min / median / max, and with two sides the ratios
    B / A of the medians and of the mins (for sim, layer-plans/s: above 1 is faster; for walls below 1 is)."""
    got = {m: {k: [] for k in trees} for m in measures}
    for i in range(rounds):
        order = list(trees) if i % 2 == 0 else list(trees)[::-1]
        for m in measures:
            for k in order:
                got[m][k].append(whole_run(trees[k], m, a))
    out = {}
    for m, by in got.items():
        out[m] = {k: {"min": min(v), "median": statistics.median(v), "max": max(v), "runs": v} for k, v in by.items()}
        if len(trees) == 2:
            sa, sb = out[m]["A"], out[m]["B"]
            out[m]["ratio_b_over_a"] = {"median": sb["median"] / sa["median"], "min": sb["min"] / sa["min"]}
    if "sweep" in out:
        for k in trees:             # the start-up included: scaled to more cells, an upper bound
            out["sweep"][k]["per_cell_s"] = out["sweep"][k]["median"] / a.sweep_cells
        out["sweep"]["cells"] = a.sweep_cells
    if "compare" in out:
        out["compare"].update(steps=a.compare_steps, warmup_tokens=a.compare_warmup, gap=a.compare_gap)
    return out


def targets(per_call: dict, runs: dict, side: str, loop: dict | None = None) -> dict:
    """Each goal met or not, from ``side``'s figures (medians); ``loop``: the compiled step loop's per layer call."""
    out = {"plan_and_bookkeeping_median_us<=10": per_call["together_us"]["median"] <= TARGETS["together_us"]}
    if loop is not None:
        out["step_loop_per_layer_call_median_us<=10"] = loop["together_us"]["median"] <= TARGETS["together_us"]
    if "sim" in runs:
        out["sim_layer_plans_per_s>=300000"] = runs["sim"][side]["median"] >= TARGETS["layer_plans_per_s"]
    if "table" in runs:
        out["table_warm_s<=2"] = runs["table"][side]["median"] <= TARGETS["table_s"]
    return out


def _fmt(m: str, v: dict) -> str:
    unit = " layer-plans/s" if m == "sim" else " s"
    f = (lambda x: f"{x:,.0f}") if m == "sim" else (lambda x: f"{x:.2f}")
    return f"{f(v['min'])} / {f(v['median'])} / {f(v['max'])}{unit}"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", type=Path, help="another checkout: a paired, interleaved A/B of every measure")
    ap.add_argument("--calls", type=int, default=20000, help="layer calls of the per-call figure (default 20000)")
    ap.add_argument("--rows", type=int, default=4, help="token rows per layer call of the per-call figure (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each whole-run measure per side (default 3)")
    ap.add_argument("--skip", nargs="*", default=[], choices=MEASURES, help="whole-run measures to leave out")
    ap.add_argument("--compare-steps", type=int, default=40, help="moetier compare --steps (default 40; 0: all)")
    ap.add_argument("--compare-warmup", type=int, default=100,
                    help="moetier compare's policy.warmup_tokens (default 100; 0: the recipe's 1,000)")
    ap.add_argument("--compare-gap", action="store_true", help="moetier compare with its gap split (3x the replays)")
    ap.add_argument("--sweep-cells", type=int, default=200, help="cells of the sweep (default 200)")
    ap.add_argument("--opcodes", action="store_true", help="bytecodes per layer call, by function")
    ap.add_argument("--commit-profile", action="store_true",
                    help="the commit kernel alone per layer call, its crossing, and the tiers' work per call")
    ap.add_argument("--runs-only", action="store_true",
                    help="with --against: the whole runs alone, no per-call A/B in this process (for a tree whose "
                         "kernels must not share it)")
    ap.add_argument("--child-plan", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    R, tr = default_recipe()
    if a.child_plan:             # one side of the per-call A/B (bench_against): its figures as one JSON line
        print(json.dumps(bench_plan(R, tr, a.rows, calls=a.calls)))
        return
    if a.opcodes:
        return _print_extra(bench_opcodes(R, tr), a.json)
    if a.commit_profile:
        return _print_extra(bench_commit(R, tr, a.rows, min(a.calls, 8000)), a.json)
    measures = [m for m in MEASURES if m not in a.skip]
    if a.against is not None and a.runs_only:
        runs = bench_runs({"A": a.against, "B": REPO}, measures, a.rounds, a)
        print(f"A = {a.against}, B = this tree; whole runs only; load average {os.getloadavg()[0]:.1f}\n"
              "| whole run | A: min / median / max | B: min / median / max | B / A: median / min | target |\n"
              "|---|---|---|---|---|")
        _print_runs(runs, ("A", "B"))
        print(json.dumps({"against": str(a.against), "runs": runs}, sort_keys=True))
        return
    if a.against is not None:
        res = bench_against(a.against, a)
        res["B_loop"] = bench_loop(R, tr, a.rows)
        res["runs"] = bench_runs({"A": a.against, "B": REPO}, measures, a.rounds, a)
        res["targets"] = targets(res["B"], res["runs"], "B", res["B_loop"])
        return _print_extra(res, a.json)
    res = {"plan_layer": bench_plan(R, tr, a.rows, calls=a.calls), "load": os.getloadavg()}
    res["runs"] = bench_runs({"B": REPO}, measures, a.rounds, a)
    res["targets"] = targets(res["plan_layer"], res["runs"], "B")
    if a.json:
        print(json.dumps(res, indent=1, sort_keys=True))
        return
    p = res["plan_layer"]
    print(f"load average {res['load'][0]:.1f}\n| measure | min / median / max | target |\n|---|---|---|")
    for name, key in (("plan_layer", "plan_us"), ("bookkeeping (commit)", "bookkeeping_us"),
                      ("plan_layer + bookkeeping", "together_us")):
        v = p[key]
        target = "<= 10 us median" if key == "together_us" else ""
        print(f"| {name} per layer call ({p['mean_picks']:.1f} picks) | {v['min']:.1f} / {v['median']:.1f} / "
              f"{v['max']:.1f} us | {target} |")
    _print_runs(res["runs"], ("B",))
    print(json.dumps(res, sort_keys=True))


_NAMES = {"sim": ("simulator, C1 on the shipped GLM trace", ">= 300,000 layer-plans/s"),
          "table": ("moetier table, warm", "<= 2 s"), "table_first": ("moetier table, first run (empty cache)", ""),
          "compare": ("moetier compare of the default recipe", "before / after"),
          "sweep": ("sweep of the default recipe", "before / after")}


def _print_runs(runs: dict, sides) -> None:
    for m, by in runs.items():
        name, target = _NAMES[m]
        if m == "compare":
            name += f" (--steps {by['steps']}, warm-up {by['warmup_tokens'] or 'recipe'}{', gap' if by['gap'] else ''})"
        if m == "sweep":
            name += f" ({by['cells']} cells, {by['B']['per_cell_s'] * 1000:.0f} ms a cell)"
        cells = " | ".join(_fmt(m, by[k]) for k in sides)
        ratio = by.get("ratio_b_over_a")
        r = f" | {ratio['median']:.2f} / {ratio['min']:.2f}" if ratio else ""
        print(f"| {name} | {cells}{r} | {target} |")


def _print_extra(res: dict, as_json: bool) -> None:
    """--against / --opcodes / --commit-profile output: a table, then the JSON line."""
    if as_json:
        print(json.dumps(res, indent=1, sort_keys=True))
        return
    if "against" in res:
        print(f"A = {res['against']}, B = this tree; {res['calls']:,} layer calls a run, {res['rounds']} rounds, "
              f"alternated, each run a process of its own; the same plans: {'yes' if res['same_plans'] else 'NO'}; "
              f"load average {res['load'][0]:.1f}")
        print("| side | plan_layer | bookkeeping | together |  (us, min / median / max of the rounds' medians)\n"
              "|---|---|---|---|")
        for k in ("A", "B"):
            cells = (f"{res[k][m]['min']:.1f} / {res[k][m]['median']:.1f} / {res[k][m]['max']:.1f}"
                     for m in ("plan_us", "bookkeeping_us", "together_us"))
            print(f"| {k} | " + " | ".join(cells) + " |")
        v = res["B_loop"]["together_us"]
        print(f"| B, compiled step loop (sim.run's path; a step's time / layers, {res['B_loop']['steps']:,} steps; "
              f"min / median / max over them) | | | {v['min']:.1f} / {v['median']:.1f} / {v['max']:.0f} |")
        print(f"B / A of the medians (together): {res['ratio_b_over_a']:.2f}")
        if res.get("runs"):
            print("| whole run | A: min / median / max | B: min / median / max | B / A: median / min | target |\n"
                  "|---|---|---|---|---|")
            _print_runs(res["runs"], ("A", "B"))
    elif "commit_alone_us" in res:
        lanes = ", ".join(f"{k} {v:.1f}" for k, v in res["lanes"].items())
        print(f"{res['calls']:,} layer calls; picks a call by lane: {lanes}; evictions a call: VRAM "
              f"{res['vram_evictions']:.1f}, RAM {res['ram_evictions']:.1f}\n| commit kernel | min / median / max "
              f"(us) |\n|---|---|")
        for k, name in (("commit_alone_us", "the plans' commits, back to back"),
                        ("commit_empty_us", "a plan with no picks (the crossing)")):
            v = res[k]
            print(f"| {name} | {v['min']:.2f} / {v['median']:.2f} / {v['max']:.1f} |")
    else:
        print(f"{res['per_call']:,.0f} bytecodes per layer call (plan_layer + commit) over {res['calls']:,} calls")
        for k, v in res["by_function"].items():
            print(f"| {k} | {v:,.0f} |")
    print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
