"""The planner on caches the expert compute left cold: what one layer call of the runtime's host thread costs there,
and what the operations of its Python glue cost.

    python benchmarks/bench_cold.py [--mb 8] [--calls 1000] [--against DIR --rounds 3] [--out NAME]

Between two timed calls a compiled loop reads ``--mb`` MB (as the cpu lane's expert compute streams its experts:
tiny-local-cpu computes four 1.58 MB experts a layer at C1); each figure is also taken without it (warm). Timed:

* ``plan``: ``Replay.arm`` and ``plan_layer`` (with the host cache model and the idle term, as the runtime's host
  thread calls it) on tiny-local-cpu at C1 (4 picks a layer), under the shipped default policy, on the recipe's
  trace, committed after each call as the simulator does;
* the primitives the glue is made of: a Python call, a Numba call of 11 arguments, ``np.empty``, ``struct.pack`` of
  22 numbers, ``ndarray.tolist``.

min / median / max us over the calls. With ``--against DIR`` each round runs this script in DIR (its moetier on
PYTHONPATH, its own process) and in this tree, the order flipping every round, and the table gives B / A of the
medians over the rounds' medians. ``--out NAME`` writes NAME.json (every round) and NAME.md (the table) beside it.
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

from _rounds import alternate

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
# the shipped default policy (moetier.peers.rows.DEFAULT_POLICY), spelled out: an older tree may lack the constant
POLICY = ['policy.ram_evict="lfu"', 'policy.ram_partition="layer"', 'policy.vram_evict="dlfu"',
          'policy.vram_admit="auto"']
PRIMITIVES = ("python call", "numba call, 11 arguments", "np.empty", "struct.pack, 22 numbers", "ndarray.tolist")


def _stats(ns: list) -> dict:
    return {"min": min(ns) / 1e3, "median": statistics.median(ns) / 1e3, "max": max(ns) / 1e3}


def measure(mb: float, calls: int) -> dict:
    """{figure: {cold: stats, warm: stats}} in this process (its moetier is whatever ``import moetier`` finds)."""
    from struct import Struct

    import numpy as np
    from numba import njit

    from moetier.core import records as spec, sim
    from moetier.core.plan import plan_layer
    from moetier.traces.format import load_trace

    @njit
    def stream(a):
        s = 0.0
        for i in range(0, a.shape[0], 8):        # one read a cache line
            s += a[i]
        return s

    @njit
    def eleven(a, b, c, d, e, f, g, h, i, j, k):
        return c

    def call(a, b, c):
        return a

    R = spec.resolve("tiny-local-cpu", POLICY)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    big, none = np.ones(max(1, int(mb * 2 ** 20) // 8)), np.ones(1)
    P, st, buf, S = np.zeros(39), np.zeros(1024, np.uint8), bytes(200), Struct("8q14d")
    prims = dict(zip(PRIMITIVES, (
        lambda: call(1, 2, 3), lambda: eleven(P, buf, 4, 0, st, True, 0.0, 0.0, 0.0, 0.0, P),
        lambda: np.empty(10), lambda: S.pack(0, 1, 2, 3, 4, 5, 6, 7, *(0.0,) * 14), lambda: P.tolist())))
    out = {k: {"cold": [], "warm": []} for k in ("plan", *PRIMITIVES)}
    perf = time.perf_counter_ns
    for kind, a in (("warm", none), ("cold", big)):     # a phase and a replay each: the same layer calls
        rp = sim.Replay(R)
        rp.ledger.seed(sim.rank_keys(tr.ids[:64, :, :R.topk], R.experts))
        streams = sim.Streams(tr, 1, R.topk, R.experts, offsets=[0])
        for f in prims.values():
            f()
        stream(a)
        t, n = 0.0, 0
        while n < calls + 20:                    # the first 20: kernels loading from the cache
            rows = streams.rows(n // R.layers)
            for layer in range(R.layers):
                picks = streams.picks(rows, layer)
                stream(a)
                t0 = perf()
                rp.arm(layer)
                plan = plan_layer(rp.ctx, rp.ledger, picks, t, rp.chan, rp.llc, idle=rp.idle(t))
                t1 = perf()
                rp.commit(plan, picks)
                rp.after_layer(picks)
                t += plan.ms + 1.0
                for name, f in prims.items():
                    stream(a)
                    p0 = perf()
                    f()
                    out[name][kind].append(perf() - p0)
                if n >= 20:
                    out["plan"][kind].append(t1 - t0)
                n += 1
    return {k: {kind: _stats(v[kind][-calls:]) for kind in v} for k, v in out.items()}


def _side(tree: Path, a) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([sys.executable, str(HERE), "--child", "--mb", str(a.mb), "--calls", str(a.calls)], cwd=tree,
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"bench_cold: the run in {tree} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def rounds(trees: dict, a, run=_side) -> dict:
    """Alternating rounds per side; per figure and kind the medians' min / median / max and B / A."""
    got = alternate("bench_cold", trees, a, run)
    named = {k: "this tree" if str(v) == str(REPO) else str(v) for k, v in trees.items()}
    res = {"mb": a.mb, "calls": a.calls, "rounds": a.rounds, "trees": named,
           "runs": got, "sides": {}}
    for k, runs in got.items():
        res["sides"][k] = {f: {kind: {s: fn([r[f][kind]["median"] for r in runs]) for s, fn in
                                      (("min", min), ("median", statistics.median), ("max", max))}
                               for kind in ("cold", "warm")} for f in runs[0]}
    if "A" in got:
        A, B = res["sides"]["A"], res["sides"]["B"]
        res["ratio_b_over_a"] = {f: {kind: B[f][kind]["median"] / A[f][kind]["median"] for kind in ("cold", "warm")}
                                 for f in B}
    return res


def table(res: dict) -> str:
    sides = list(res["sides"])
    head = (f"{' / '.join(f'{k} = {v}' for k, v in res['trees'].items())}; {res['mb']} MB streamed before each "
            f"cold call; {res['calls']} calls, {res['rounds']} rounds (min / median / max of the rounds' medians, us)")
    cols = [f"{k} {kind}" for kind in ("cold", "warm") for k in sides]
    ratio = "ratio_b_over_a" in res
    lines = [head, "| figure | " + " | ".join(cols) + (" | B / A cold | B / A warm |" if ratio else " |"),
             "|---|" + "---|" * (len(cols) + 2 * ratio)]
    for f in ("plan", *PRIMITIVES):
        cells = [" / ".join(f"{res['sides'][k][f][kind][s]:.2f}" for s in ("min", "median", "max"))
                 for kind in ("cold", "warm") for k in sides]
        extra = [f"{res['ratio_b_over_a'][f][kind]:.2f}" for kind in ("cold", "warm")] if ratio else []
        lines.append(f"| {'plan_layer' if f == 'plan' else f} | " + " | ".join(cells + extra) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=8.0, help="MB streamed before each cold call (default 8)")
    ap.add_argument("--calls", type=int, default=1000, help="timed layer calls per side and kind (default 1000)")
    ap.add_argument("--against", type=Path, help="another checkout: its runs alternate with this tree's")
    ap.add_argument("--rounds", type=int, default=3, help="runs per side (default 3)")
    ap.add_argument("--out", help="write benchmarks/NAME.json and NAME.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.mb <= 0 or a.calls < 1 or a.rounds < 1:
        print("bench_cold: --mb: expected above 0; --calls, --rounds: expected at least 1", file=sys.stderr)
        return 2
    if a.against is not None and not (a.against / "moetier" / "core" / "plan.py").is_file():
        print(f"bench_cold: --against {a.against}: expected a moetier checkout (moetier/core/plan.py)",
              file=sys.stderr)
        return 2
    if a.child:
        print(json.dumps(measure(a.mb, a.calls)))
        return 0
    trees = {"A": a.against, "B": REPO} if a.against is not None else {"B": REPO}
    res = rounds(trees, a)
    print(table(res))
    if a.out:
        (HERE.parent / f"{a.out}.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        (HERE.parent / f"{a.out}.md").write_text(table(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
