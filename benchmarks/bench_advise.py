"""`moetier advise` against the shipped recipes, and the search's rate, side by side in one run.

    python benchmarks/bench_advise.py [--recipes ID ...] [--candidates 24] [--steps 150] [--workers 2]
                                      [--rate-recipe tiny-local-cpu] [--out benchmarks/advise.json] [--json]
    python benchmarks/bench_advise.py --real STORE [--shipped ID] [--advised ID] [--repeats 5] [--run-steps 100]
    python benchmarks/bench_advise.py --phases RECIPE [--conc 1] [--repeats 5]

Goal 1: on every shipped GLM and Qwen recipe (ids starting glm53- or qwen38fn-, or --recipes) at its own memory
(the recipe's RAM cap, VRAM reserve as its slots leave), the advised configuration's simulated tok/s at C1, C2, C4
(150 steps) is >= the shipped recipe's, both full replays of the same trace in the same search; the table says by
how much and which knob mattered most. Goal 2: configurations evaluated per second by the search (distinct
candidates that got at least one replay, over the search's wall time, pool start-up included), on the first recipe
and on --rate-recipe (a cheap one), with replays per second beside it. Writes the JSON (--out) and prints markdown.

Goal 3 (--real STORE, a packed store of tiny-local-cpu's model: `moetier store pack moetier-tiny-16x64-int8`):
`moetier run` of the shipped tiny-local-cpu (--shipped: another starting recipe, such as this machine's
`tiny-local-cpu-bench-cal` from `moetier bench` and `moetier calibrate`, whose predicted interval is this machine's;
at C1, C2, C4) and of each concurrency's advice at its own concurrency (--advised PREFIX: PREFIX-c1, -c2, -c4 in the
user registry, default `SHIPPED-advised`: run `moetier advise SHIPPED` first), --repeats interleaved rounds (shipped, advice c1, c2, c4; then the reverse;
...), each for --run-steps steps, no run record written; per recipe and concurrency the median measured tok/s,
the min-max, the predicted tok/s and whether the measured median fell inside the predicted interval, and the
ratio advised / shipped paired by round (runs of one round are neighbours in time). Writes
benchmarks/advise-real.json beside --out.

Where a candidate's seconds go (--phases RECIPE): one rung-0 cell of the search (advise.fidelities' shortest
replay), timed by phase (recipe resolve, trace load, Streams, seeding, warm-up replay, measured steps) in this
fresh process: after one tiny-ci-cpu cell has loaded the imports and compiled-code caches a worker pays once
(``setup_s``), the recipe's first cell (its trace and Streams cold) and then warm cells (median of --repeats,
another candidate each time so that nothing is reused but what the worker keeps between cells).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.core import records as spec  # noqa: E402
from moetier.measure import advise_report as AR  # noqa: E402
from moetier.measure import advise_space as space  # noqa: E402
from moetier.measure import sweep as S  # noqa: E402

CONCS = (1, 2, 4)


def shipped() -> list[str]:
    return [r for r in spec.record_ids("recipe") if spec.is_shipped("recipe", r)
            and r.startswith(("glm53-", "qwen38fn-"))]


def one(rid: str, n: int, steps: int, ex) -> dict:
    R = spec.resolve(rid)
    t0 = time.perf_counter()
    out = AR.advise(rid, lim=space.limits(R), concs=CONCS, n=n, seed=0, steps=steps, executor=ex)
    wall = time.perf_counter() - t0
    per = {}
    for c in CONCS:
        b, s = out["best"][c], out["start"][c]
        top = out["mattered"][c][0] if out["mattered"][c] else None
        per[str(c)] = {"shipped": s["tok_s"], "advised": b["tok_s"], "gain": b["tok_s"] - s["tok_s"],
                       "interval": out["interval"][c], "overrides": b["overrides"], "top_knob": top,
                       "ok": b["tok_s"] >= s["tok_s"]}
    return {"recipe": rid, "conc": per, "candidates": out["candidates"], "replays": out["cells"],
            "search_s": out["seconds"], "wall_s": wall,
            "candidates_per_s": out["candidates"] / out["seconds"], "replays_per_s": out["cells"] / out["seconds"]}


def rate(rid: str, n: int, steps: int, workers: int) -> dict:
    """The search alone, pool start-up included (a fresh pool): what one `moetier advise` call pays."""
    R = spec.resolve(rid)
    t0 = time.perf_counter()
    with AR._executor(workers, None) as ex:
        from moetier.measure import advise as A
        res = A.search(rid, concs=CONCS, lim=space.limits(R), n=n, seed=0, steps=steps, executor=ex)
    wall = time.perf_counter() - t0
    return {"recipe": rid, "candidates": res["candidates"], "replays": res["cells"], "wall_s": wall,
            "candidates_per_s": res["candidates"] / wall, "replays_per_s": res["cells"] / wall}


def real(store: str, advised: str, repeats: int, steps: int, shipped_id: str = "tiny-local-cpu") -> dict:
    """Goal 3 (module docstring): per concurrency the shipped recipe and that concurrency's advice, run for real."""
    import statistics
    import subprocess
    ids = {c: f"{advised}-c{c}" for c in CONCS}
    missing = [rid for rid in ids.values() if rid not in spec.record_ids("recipe")]
    if missing:          # one line before anything runs
        raise SystemExit(f"--advised {advised}: no recipe {', '.join(missing)} in the registry; expected the "
                         f"records `moetier advise {shipped_id}` writes")
    # one run of the shipped recipe covers every concurrency; each advice runs at its own
    jobs = [(shipped_id, CONCS)] + [(ids[c], (c,)) for c in CONCS]
    got: dict = {}
    for i in range(repeats):
        for rid, concs in (jobs if i % 2 == 0 else jobs[::-1]):
            cmd = [sys.executable, "-m", "moetier", "run", rid, "--store", store, "--conc", *map(str, concs),
                   "--steps", str(steps), "--no-record", "--json", "--quiet"]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if p.returncode:
                raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
            for row in json.loads(p.stdout)["table"]:
                got.setdefault((rid, int(row["conc"])), []).append(row)
            print(f"round {i + 1}: {rid} done", file=sys.stderr)
    out: dict = {}
    for (rid, c), rows in got.items():
        m = [r["measured_tok_s"] for r in rows]
        iv = rows[0]["sim_interval"]
        med = statistics.median(m)
        out.setdefault("shipped" if rid == shipped_id else "advised", {})[str(c)] = {
            "recipe": rid, "measured": m, "measured_median": med, "measured_min": min(m), "measured_max": max(m),
            "sim_tok_s": rows[0]["sim_tok_s"], "sim_interval": iv, "inside": iv["low"] <= med <= iv["high"]}
    # runs of one round are neighbours in time: their ratio cancels most of the machine's drift between rounds
    paired = {}
    for c in map(str, CONCS):
        r = [a / b for a, b in zip(out["advised"][c]["measured"], out["shipped"][c]["measured"])]
        paired[c] = {"ratios": r, "median": statistics.median(r), "advised_faster": sum(x > 1 for x in r),
                     "predicted": out["advised"][c]["sim_tok_s"] / out["shipped"][c]["sim_tok_s"]}
    return {"store": store, "repeats": repeats, "steps": steps, "recipes": out, "paired": paired,
            "advised_ge_shipped": {str(c): out["advised"][str(c)]["measured_median"] >=
                                   out["shipped"][str(c)]["measured_median"] for c in CONCS}}


def _write_json(path: Path, doc: dict) -> None:
    """The results file whole or not at all (an interrupted run leaves the last one)."""
    from moetier.atomic import atomic_write
    atomic_write(path, lambda f, b=(json.dumps(doc, indent=1, sort_keys=True) + "\n").encode(): f.write(b))


PHASES = ("recipe resolve", "trace load", "Streams", "seeding", "warm-up replay", "measured steps")


def phases(rid: str, conc: int, repeats: int) -> dict:
    """Seconds per phase of one rung-0 cell (module docstring): the cell runs through advise.run_cell as the pool
    runs it, with timers around the phases' functions for the length of the call."""
    import contextlib
    import statistics
    from moetier.core import replay, sim
    from moetier.measure import advise as A
    t0 = time.perf_counter()
    A.run_cell(A.cell("tiny-ci-cpu", [], 1, 1, 1, None))     # the imports and caches any worker's first cell loads
    setup = time.perf_counter() - t0
    st, wu = A.fidelities(150, 1000)[0]
    acc: dict = {}

    @contextlib.contextmanager
    def timed(mod, name, key):
        f = getattr(mod, name)

        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
        setattr(mod, name, g)
        try:
            yield
        finally:
            setattr(mod, name, f)

    def cell(ovr: list) -> dict:
        acc.clear()
        marks: dict = {}
        begin = replay.Replay.begin_step

        # each step's start, marked where sim.run begins it: a plan_hook would mark it too, but asking for each
        # layer's plan takes the replay off the compiled step loop (sim.run), the path the search's cells run
        def marked(rp, step):
            marks.setdefault(step, time.perf_counter())
            return begin(rp, step)
        # the streams' nested lists are built on their first use (Streams._as_lists), inside the first layer call
        with timed(spec, "resolve", "recipe resolve"), timed(S, "_trace", "trace load"), \
                timed(sim, "Streams", "Streams"), timed(replay.Streams, "_as_lists", "Streams"), \
                timed(sim, "_seed", "seeding"):
            replay.Replay.begin_step = marked
            try:
                t = time.perf_counter()
                row = A.run_cell(A.cell(rid, ovr, conc, st, wu, None))
                total = time.perf_counter() - t
            finally:
                replay.Replay.begin_step = begin
        if "error" in row:
            raise SystemExit(f"--phases {rid}: {row['error']}")
        steps = sorted(marks)
        first_measured = marks[steps[len(steps) - st]]
        acc["warm-up replay"] = first_measured - marks[steps[0]]
        acc["measured steps"] = t + total - first_measured      # and the report's few lines after the last step
        acc["total"] = total
        return dict(acc)
    others = [n for n in space.residency_names() if n != "lru"][:repeats]
    first = cell([])
    warm = [cell([f'policy.ram_evict="{n}"']) for n in others]
    med = {k: statistics.median(w.get(k, 0.0) for w in warm) for k in (*PHASES, "total")}
    return {"recipe": rid, "conc": conc, "warmup_tokens": wu, "measured_steps": st, "setup_s": setup,
            "first": first, "warm_median": med, "warm_cells": len(warm)}


def real_rows(doc: dict) -> tuple[list[str], list[str]]:
    """The --real tables' rows (markdown) from advise-real.json: measured per recipe, and the paired ratios."""
    measured = []
    for c in CONCS:
        for side in ("shipped", "advised"):
            p = doc["recipes"][side][str(c)]
            measured.append(f"| C{c} | {p['recipe']} | {p['measured_median']:.2f} ({p['measured_min']:.2f}-"
                            f"{p['measured_max']:.2f}) | {p['sim_tok_s']:.2f} | {p['sim_interval']['low']:.2f}-"
                            f"{p['sim_interval']['high']:.2f} | {'yes' if p['inside'] else 'no'} |")
    paired = [f"| C{c} | {p['median']:.3f} ({min(p['ratios']):.3f}-{max(p['ratios']):.3f}) | "
              f"{p['advised_faster']} of {len(p['ratios'])} | {p['predicted']:.3f} |" for c, p in doc["paired"].items()]
    return measured, paired


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", help="recipe ids (default: every shipped glm53-* and qwen38fn-*)")
    ap.add_argument("--candidates", type=int, default=24, help="candidates per search (default 24)")
    ap.add_argument("--steps", type=int, default=150, help="measured steps of a full replay (default 150)")
    ap.add_argument("--workers", type=int, default=2, help="pool processes (default 2)")
    ap.add_argument("--rate-recipe", default="tiny-local-cpu", help="a cheap recipe for the rate (default tiny)")
    ap.add_argument("--rate-candidates", type=int, default=500, help="candidates of the rate search (default 500; 0: none)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "advise.json"), help="JSON results file")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the tables")
    ap.add_argument("--real", metavar="STORE", help="goal 3 only: run tiny-local-cpu and its advice for real")
    ap.add_argument("--shipped", default="tiny-local-cpu",
                    help="the recipe the advice started from (with --real; default tiny-local-cpu, or this machine's "
                         "tiny-local-cpu-bench-cal, whose interval is this machine's)")
    ap.add_argument("--advised", help="the advice's id prefix: PREFIX-c1, -c2, -c4 (with --real; default advise's: "
                                      "SHIPPED-advised)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds (with --real; default 5)")
    ap.add_argument("--run-steps", type=int, default=100, help="measured steps per run (with --real)")
    ap.add_argument("--phases", metavar="RECIPE", help="where one rung-0 cell's seconds go (module docstring)")
    ap.add_argument("--conc", type=int, default=1, help="the cell's concurrency (with --phases; default 1)")
    a = ap.parse_args(argv)
    if a.phases:
        doc = phases(a.phases, a.conc, a.repeats)
        if a.json:
            print(json.dumps(doc, indent=1, sort_keys=True))
            return 0
        w = doc["warm_median"]
        print(f"{a.phases}: one rung-0 cell at C{a.conc} ({doc['warmup_tokens']} warm-up tokens, "
              f"{doc['measured_steps']} measured steps); a new worker's set-up (imports, compiled-code caches, "
              f"one tiny-ci-cpu cell) {doc['setup_s']:.2f} s")
        print(f"| phase | the recipe's first cell (s) | warm cell, median of {doc['warm_cells']} (s) | share |")
        print("|---|---|---|---|")
        for k in (*PHASES, "total"):
            print(f"| {k} | {doc['first'].get(k, 0.0):.3f} | {w[k]:.3f} | {w[k] / w['total']:.0%} |")
        return 0
    if a.real:
        doc = real(a.real, a.advised or f"{a.shipped}-advised", a.repeats, a.run_steps, a.shipped)
        _write_json(Path(a.out).with_name("advise-real.json"), doc)
        print(f"measured decode tok/s, {a.repeats} interleaved repeats of {a.run_steps} steps, store {a.real}")
        measured, paired = real_rows(doc)
        print("| conc | recipe | measured median (min-max) | predicted | interval | inside |")
        print("|---|---|---|---|---|---|")
        print("\n".join(measured))
        print("\nadvised / shipped, paired by round")
        print("| conc | measured ratio, median (min-max) | rounds the advice was faster | predicted ratio |")
        print("|---|---|---|---|")
        print("\n".join(paired))
        return 0
    recipes = a.recipes or shipped()
    rows = []
    with AR._executor(a.workers, None) as ex:
        for rid in recipes:
            rows.append(one(rid, a.candidates, a.steps, ex))
            print(json.dumps(rows[-1], sort_keys=True), file=sys.stderr, flush=True)   # kept if a later one dies
    rates = [rate(a.rate_recipe, a.rate_candidates, a.steps, a.workers)] if a.rate_candidates else []
    doc = {"recipes": rows, "rate": rates, "candidates": a.candidates, "steps": a.steps, "workers": a.workers,
           "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
           "advised_ge_shipped": all(p["ok"] for r in rows for p in r["conc"].values())}
    _write_json(Path(a.out), doc)
    if a.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
        return 0
    print(f"advised vs shipped, simulated decode tok/s, {a.steps} steps, {a.candidates} candidates a search, seed 0")
    print("| recipe | conc | shipped | advised | gain | advised interval | knob that mattered most (tok/s lost) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for c, p in r["conc"].items():
            iv = p["interval"]
            top = p["top_knob"]
            knob = f"{top['knob']} {top['value']} ({top['lost_tok_s']:.2f})" if top else "-"
            print(f"| {r['recipe']} | C{c} | {p['shipped']:.2f} | {p['advised']:.2f} | {p['gain']:+.2f} | "
                  f"{iv['low']:.2f}-{iv['high']:.2f} | {knob} |")
    print(f"\nsearch rate ({a.workers} workers, {os.cpu_count()} CPUs, 1-min load average {doc['load_avg_1m']:.1f})")
    print("| recipe | configurations | replays | wall s | configurations/s | replays/s |")
    print("|---|---|---|---|---|---|")
    for r in rows + rates:
        wall = r.get("search_s", r["wall_s"])
        print(f"| {r['recipe']} | {r['candidates']} | {r['replays']} | {wall:.1f} | {r['candidates_per_s']:.2f} | "
              f"{r['replays_per_s']:.2f} |")
    return 0 if doc["advised_ge_shipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
