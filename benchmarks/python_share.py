"""Where a replay's time goes: per replay of `moetier compare`, the share of its time in the compiled kernels and in
each piece of the core that stays Python (the NVMe channel's prefetch queue, the ledger's ticket path, the Python
residency policies: Belady's and the per-layer parts' Python side; the predictor's adaptation, the planner's and the
executor's glue).

    python benchmarks/python_share.py [--recipe glm53-rtx3090-55g-nvx4] [--conc 4] [--steps 100] [--warmup 100]
                                      [--rows NAME,...] [--out NAME]

The recipe's own row runs twice: as compare runs it (through the simulator's compiled step loop where that covers it)
and layer by layer (``moetier-per-layer``: plan_layer and Replay.commit per layer call, the runtime host thread's path).
Each replay runs, after a one-step run that loads its kernels, once timed (its wall) and once under cProfile, whose
per-function own time (tottime) is booked to the piece the function's file belongs to (``PIECES``: the channel's queue,
the predictor's Python side, Belady's and the per-layer partitions' Python, the other policies' Python, the ledger's
Python methods (the ticket path, commits the compiled one does not cover), plan_layer's and the executor's glue, the
peers' hooks); a Numba kernel is recognised by its dispatcher and booked to ``kernels`` (its call, its crossing and its
work). cProfile adds a cost per Python call, so the shares overstate Python against the kernels: they say where the
Python is, the timed wall what it costs.
``--out NAME`` writes NAME.json and NAME.md beside this script.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.core import records as spec  # noqa: E402
from moetier.core import sim  # noqa: E402
from moetier.errors import UserError  # noqa: E402
from moetier.peers.compare import distinct_replays, run_peer  # noqa: E402
from moetier.peers.rows import DEFAULT  # noqa: E402
from _recipe import recipe_trace  # noqa: E402

# file (under moetier/) -> piece; the first prefix that matches
PIECES = (
    ("core/channel.py", "channel queue"),
    ("core/predict.py", "predictor"),
    ("core/policies/residency.py", "Belady, partitions"),
    ("core/policies/belady.py", "Belady, partitions"),
    ("core/policies/", "other policies"),
    ("core/ledger.py", "ledger"),
    ("core/tier_", "ledger"),
    ("core/tickets.py", "ledger"),
    ("core/plan.py", "plan_layer glue"),
    ("core/llc.py", "plan_layer glue"),
    ("core/lanes.py", "plan_layer glue"),
    ("core/replay.py", "executor glue"),
    ("core/sim.py", "executor glue"),
    ("core/step_kernel.py", "executor glue"),
    ("peers/", "peer hooks"),
)
KERNELS, OTHER = "kernels", "other"


def _kernel_codes() -> set:
    """(file, first line, name) of every Numba dispatcher in moetier's loaded modules: cProfile's key for it."""
    from numba.core.registry import CPUDispatcher
    out = set()
    for name, mod in list(sys.modules.items()):
        if name.startswith("moetier.") and mod is not None:
            for v in vars(mod).values():
                if isinstance(v, CPUDispatcher):
                    c = v.py_func.__code__
                    out.add((c.co_filename, c.co_firstlineno, c.co_name))
    return out


def piece(key: tuple, kernels: set) -> str:
    """The piece a cProfile function key (file, line, name) is booked to."""
    if key in kernels:
        return KERNELS
    path = key[0].replace("\\", "/")
    at = path.rfind("/moetier/")
    if at < 0:
        return OTHER
    rel = path[at + len("/moetier/"):]
    return next((p for prefix, p in PIECES if rel.startswith(prefix)), OTHER)


def shares(prof: cProfile.Profile) -> dict:
    """{piece: share of the profiled own time}."""
    st = pstats.Stats(prof).stats
    kernels = _kernel_codes()
    by: dict = {}
    for key, (_cc, _nc, tt, _ct, _callers) in st.items():
        p = piece(key, kernels)
        by[p] = by.get(p, 0.0) + tt
    total = sum(by.values()) or 1.0
    return {p: t / total for p, t in sorted(by.items(), key=lambda kv: -kv[1])}


def _layer_by_layer(R, trace, peer, conc: int, max_steps: int) -> dict:
    """The recipe's own row through the per-layer path (a plan hook turns the compiled step loop off): plan_layer and
    Replay.commit per layer call, what the runtime's host thread runs."""
    return sim.run(R, trace, conc, max_steps=max_steps, plan_hook=lambda step, layer, plan: None)


LAYER_BY_LAYER = "moetier-per-layer"


def measure(R, trace, name: str, peer, conc: int, steps: int) -> dict:
    run = _layer_by_layer if name == LAYER_BY_LAYER else run_peer
    run(R, trace, peer, conc, max_steps=1)          # loads its kernels from the cache: not the replay's time
    t0 = time.perf_counter()
    run(R, trace, peer, conc, max_steps=steps)
    wall = time.perf_counter() - t0
    prof = cProfile.Profile()
    prof.runcall(run, R, trace, peer, conc, max_steps=steps)
    return {"wall_s": wall, "shares": shares(prof)}


def table(res: dict) -> str:
    cols = [KERNELS] + [p for p in dict.fromkeys(p for _, p in PIECES)] + [OTHER]
    cols = [c for c in cols if any(r["shares"].get(c, 0) >= 0.005 for r in res["rows"])]
    lines = [f"{res['recipe']}, C{res['conc']}, {res['steps']} measured steps, {res['warmup']} warm-up tokens; "
             "share of the profiled time (%); wall unprofiled",
             "| row | wall s | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in res["rows"]:
        lines.append(f"| {r['row']} | {r['wall_s']:.2f} | "
                     + " | ".join(f"{100 * r['shares'].get(c, 0.0):.0f}" for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="glm53-rtx3090-55g-nvx4")
    ap.add_argument("--conc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=100, help="warm-up tokens per stream (policy.warmup_tokens)")
    ap.add_argument("--rows", help="comma-separated rows (default: every distinct replay of moetier compare)")
    ap.add_argument("--out", help="write benchmarks/NAME.json and NAME.md")
    a = ap.parse_args(argv)
    if a.conc < 1 or a.steps < 1 or a.warmup < 0:
        print("python_share: --conc and --steps: expected at least 1, --warmup at least 0", file=sys.stderr)
        return 2
    try:
        R = spec.resolve(a.recipe)
    except (OSError, ValueError, UserError) as e:
        print(f"python_share: --recipe {a.recipe}: {e}", file=sys.stderr)
        return 2
    R = replace(R, policy=dict(R.policy, warmup_tokens=a.warmup))
    names = None if a.rows is None else set(a.rows.split(","))
    every = distinct_replays(R)
    every.insert(1, (LAYER_BY_LAYER, DEFAULT))
    todo = [(n, p) for n, p in every if names is None or n in names]
    if names is not None and len(todo) != len(names):
        known = ", ".join(n for n, _ in every)
        print(f"python_share: --rows {a.rows}: expected rows of {a.recipe}'s compare ({known})", file=sys.stderr)
        return 2
    trace = recipe_trace(R)
    res = {"recipe": a.recipe, "conc": a.conc, "steps": a.steps, "warmup": a.warmup, "rows": []}
    for name, peer in todo:
        print(f"python_share: {name}", file=sys.stderr, flush=True)
        res["rows"].append(dict(measure(R, trace, name, peer, a.conc, a.steps), row=name))
    print(table(res))
    if a.out:
        base = Path(__file__).resolve().parent / a.out
        base.with_suffix(".json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        base.with_suffix(".md").write_text(table(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
