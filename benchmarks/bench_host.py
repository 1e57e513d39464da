"""The runtime's host time per token, paired against another checkout: the planning and bookkeeping the host thread
of `moetier run` does between its lanes (the figures the probe reports as plan and bookkeeping).

    python benchmarks/bench_host.py --store DIR --against DIR [--recipe tiny-local-cpu] [--rounds 4] [--steps 100]
                                    [--set PATH=VALUE ...]

Each round runs `moetier run RECIPE --store STORE --conc 1 4 --steps N --json --no-write` once in each tree (its own
cwd and PYTHONPATH, the same interpreter), the order flipping every round so that drift in the host's load lands on
both; both run the shipped default policy (moetier.peers.rows.DEFAULT_POLICY, passed as --set), then ``--set``'s
overrides (a prefetch predictor, say: its host time is in the plan figure). Per side and
concurrency: plan and bookkeeping ms per token (the run's ``lanes_ms_per_token``) and tok/s, min / median / max over
the rounds, and the ratio B / A of the medians (below 1: B's host does less). ``--out NAME`` writes NAME.json (every
run) and NAME.md (the table) beside this script. A difference inside the rounds' spread is within noise.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.peers.rows import DEFAULT_POLICY  # noqa: E402
from _rounds import alternate  # noqa: E402

FIGURES = (("plan", "plan ms/token"), ("bookkeeping", "bookkeeping ms/token"), ("tok_s", "tok/s"))


def one_run(tree: Path, a) -> dict:
    """{conc: {plan, bookkeeping, tok_s}} of one `moetier run` in ``tree``."""
    sets = [f"policy.{k}={json.dumps(v)}" for k, v in DEFAULT_POLICY.items()] + list(a.set or ())
    cmd = [sys.executable, "-m", "moetier", "run", a.recipe, "--store", str(a.store), "--conc", "1", "4", "--steps",
           str(a.steps), "--json", "--no-write", "--quiet", "--set", *sets]
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(tree), MOETIER_REGISTRY=str(Path(tmp) / "registry"))
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"bench_host: moetier run in {tree} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    out = {}
    for m in json.loads(r.stdout)["measured_runs"]:
        lanes = m["lanes_ms_per_token"]
        out[str(m["conc"])] = {"plan": lanes["plan"], "bookkeeping": lanes["bookkeeping"], "tok_s": m["tok_s"]}
    return out


def rounds(trees: dict, a, run=one_run) -> dict:
    """``a.rounds`` runs per side, the order flipping each round; per side, concurrency and figure the runs and
    min / median / max, and the B / A ratio of the medians."""
    got = alternate("bench_host", trees, a, run)
    res = {"rounds": a.rounds, "steps": a.steps, "recipe": a.recipe, "set": list(getattr(a, "set", None) or ()),
           "load": os.getloadavg(), "sides": {}}
    for k, runs in got.items():
        res["sides"][k] = {c: {f: _stats([r[c][f] for r in runs]) for f, _ in FIGURES} for c in runs[0]}
    res["ratio_b_over_a"] = {c: {f: res["sides"]["B"][c][f]["median"] / res["sides"]["A"][c][f]["median"]
                                 for f, _ in FIGURES} for c in res["sides"]["B"]}
    return res


def _stats(v: list) -> dict:
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "runs": v}


def table(res: dict) -> str:
    sets = f" --set {' '.join(res['set'])}" if res.get("set") else ""
    lines = [f"A = {res['against']}, B = this tree; {res['recipe']}{sets}, {res['steps']} steps, {res['rounds']} "
             f"rounds each, alternated; load average {res['load'][0]:.1f}",
             "| C | figure | A: min / median / max | B: min / median / max | B / A (medians) |", "|---|---|---|---|---|"]
    for c, by in res["sides"]["B"].items():
        for f, name in FIGURES:
            cells = [res["sides"][k][c][f] for k in ("A", "B")]
            fmt = ".1f" if f == "tok_s" else ".3f"
            lines.append(f"| {c} | {name} | " + " | ".join(f"{s['min']:{fmt}} / {s['median']:{fmt}} / {s['max']:{fmt}}"
                                                         for s in cells)
                         + f" | {res['ratio_b_over_a'][c][f]:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True, help="a packed store of the recipe's model")
    ap.add_argument("--against", type=Path, required=True, help="another checkout (side A)")
    ap.add_argument("--recipe", default="tiny-local-cpu")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--set", nargs="+", metavar="PATH=VALUE", help="more recipe overrides, for both sides")
    ap.add_argument("--out", help="write benchmarks/NAME.json and NAME.md")
    a = ap.parse_args(argv)
    for flag, p, what in (("--store", a.store, a.store), ("--against", a.against, a.against / "moetier")):
        if not what.is_dir():
            print(f"bench_host: {flag} {p}: expected a directory{'' if p == what else ' holding moetier/'}",
                  file=sys.stderr)
            return 2
    if a.rounds < 1 or a.steps < 1:
        print("bench_host: --rounds and --steps: expected at least 1", file=sys.stderr)
        return 2
    res = rounds({"A": a.against, "B": REPO}, a)
    res["against"] = str(a.against)
    print(table(res))
    if a.out:
        base = REPO / "benchmarks" / a.out
        base.with_suffix(".json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        base.with_suffix(".md").write_text(table(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
