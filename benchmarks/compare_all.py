"""The compare tables for every shipped recipe on its trace: benchmarks/compare.json and compare.md.

Run: PYTHONPATH=. python benchmarks/compare_all.py [--steps N] [--recipes a,b] [--jobs J]   (about 15 rows and the
oracle's 6 structures x 3 concurrencies x recipes sim runs, fewer where rows replay identically
(moetier.peers.compare.replay_key); --steps caps the measured steps of each run (the warm-up, 600 steps on
the GLM and Qwen recipes, is replayed whatever it says); --jobs runs the replays in a process pool, same figures; --keep adds the named recipes' tables to those of the
others already in the output, from a run with the same steps, so a long run can be done in parts; --rows a,b replays
only the named rows and keeps every other row's cells from the existing output of the same steps, for a change that
touches only those rows: the figures are those a whole run gives, since every replay is deterministic).
The recipes: every shipped recipe whose trace was recorded for its model (``shipped()``; the tiny EXL3 recipes name
the int8 model's trace and are left out). The tables are what `moetier compare RECIPE --steps N --json` prints.
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path

from moetier.atomic import atomic_write
from moetier.cli.common import find_path
from moetier.cli.compare import format_compare, format_summary
from moetier.core import records as spec
from moetier.peers.compare import compare, ratios, replay_key, run_peer
from moetier.peers.rows import ORACLE, PEERS, by_name, replays
from moetier.errors import UserError
from moetier.traces.format import load_trace

HERE = Path(__file__).resolve().parent
CONCS = (1, 2, 4)


def shipped() -> list[str]:
    """Every shipped recipe whose trace loads for its model (layers, experts, top-k and model id), in id order."""
    out = []
    for rid in spec.record_ids("recipe"):
        if not spec.is_shipped("recipe", rid):
            continue
        R = spec.resolve(rid, [])
        try:
            if R.trace:
                load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
                out.append(rid)
        except UserError as e:
            print(f"compare_all: {rid} left out: {e}", file=sys.stderr)
    return out


OVERRIDES: list = []          # --set, dotted recipe overrides applied to every recipe (the workers inherit them)


@lru_cache(maxsize=None)
def _recipe(rid: str):
    R = spec.resolve(rid, spec.parse_overrides(OVERRIDES) if OVERRIDES else [])
    return R, load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)


def _cell(rid: str, peer: str, conc: int, steps: int, overrides: tuple = ()) -> dict:
    OVERRIDES[:] = list(overrides)
    R, tr = _recipe(rid)
    return run_peer(R, tr, by_name(peer), conc, steps)


def _write(out: Path, steps: int, docs: list, command: str) -> None:
    atomic_write(out.with_suffix(".json"), lambda f: f.write(json.dumps(
        {"steps": steps, "command": command, "tables": docs}, indent=1, sort_keys=True).encode()))
    md = [f"# compare: every shipped recipe on its trace ({steps} measured steps per run)", "",
          f"Reproduce: `{command}` (one recipe: `python -m moetier compare RECIPE --steps {steps}`). The figures "
          "are the simulator's on the shipped records: they do not depend on the machine that ran them. The oracle "
          "is the best of Belady under each tier structure (docs/peers.md).", "", format_summary(docs), ""]
    for x in docs:
        md += [f"## {x['recipe']}", "", "```", f"$ {x['command'].replace(' --json', '')}", format_compare(x),
               "```", ""]
    atomic_write(out.with_suffix(".md"), lambda f: f.write("\n".join(md).encode()))


def _kept(out: Path, steps: int, overrides: list, rids: list) -> list:
    """The tables of recipes other than ``rids`` in the existing ``out`` .json, when it ran the same steps and
    overrides (else none: a table from another run is not mixed in)."""
    p = out.with_suffix(".json")
    if not p.exists():
        return []
    d = json.loads(p.read_text())
    same = d.get("steps") == steps and all(f"'{x}'" in d.get("command", "") for x in overrides)
    return [x for x in d.get("tables", []) if x["recipe"] not in rids] if same else []


def _merged(old: dict | None, new: dict) -> dict:
    """``old``'s table with ``new``'s rows put in (in PEERS order, the oracle last) and the ratios taken again."""
    if old is None:
        raise SystemExit(f"compare_all --rows: no table for {new['recipe']} in the output to keep rows from")
    by = {r["peer"]: r for r in old["rows"]}
    by.update({r["peer"]: r for r in new["rows"]})
    order = [p.name for p in PEERS] + ["oracle"]
    rows = sorted(by.values(), key=lambda r: order.index(r["peer"]) if r["peer"] in order else len(order))
    return dict(old, rows=rows, ratios=ratios(rows, old["concs"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--recipes", help="comma-separated recipe ids (default: every shipped recipe with its trace)")
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once (a process pool; same figures)")
    ap.add_argument("--set", nargs="+", default=[], metavar="PATH=VALUE",
                    help="dotted recipe overrides for every recipe, values as JSON (the tables say so)")
    ap.add_argument("--out", default=str(HERE / "compare"))
    ap.add_argument("--rows", help="comma-separated rows to replay; the other rows' cells are kept from the --out "
                                   ".json (same --steps and --set)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the tables of the other recipes already in the --out .json (same --steps and --set; "
                         "the files then read as one run over all of them, in recipe order)")
    a = ap.parse_args(argv)
    OVERRIDES[:] = a.set
    rids = a.recipes.split(",") if a.recipes else shipped()
    kept = _kept(Path(a.out), a.steps, a.set, rids) if a.keep else []
    every = [x["recipe"] for x in kept] + rids
    command = f"PYTHONPATH=. python benchmarks/compare_all.py --steps {a.steps}" + (
        f" --recipes {','.join(sorted(every))}" if sorted(every) != shipped() else "") + (
        " --set " + " ".join(f"'{x}'" for x in a.set) if a.set else "")
    rows = tuple(by_name(n) for n in a.rows.split(",")) if a.rows else None
    before = {x["recipe"]: x for x in _kept(Path(a.out), a.steps, a.set, [])} if rows else {}
    pool = ProcessPoolExecutor(a.jobs) if a.jobs > 1 else None
    futures: dict = {}
    if pool is not None:          # every distinct replay of every recipe queued at once, longest recipes first
        for rid in rids:
            R, _ = _recipe(rid)
            for p in (rows or PEERS + replays(ORACLE)):
                for c in CONCS:
                    key = (rid, replay_key(R, p), c)
                    if key not in futures:
                        futures[key] = pool.submit(_cell, rid, p.name, c, a.steps, tuple(a.set))
    docs = []
    for rid in rids:
        R, tr = _recipe(rid)

        def run_cell(p, c, rid=rid, R=R):
            if pool is None:
                return _cell(rid, p.name, c, a.steps, tuple(a.set))
            return futures[(rid, replay_key(R, p), c)].result()
        d = compare(R, tr, concs=list(CONCS), max_steps=a.steps, trace_name=R.trace, run_cell=run_cell,
                    peers=rows or PEERS, oracle=rows is None,
                    progress=lambda n, i, k: print(f"{rid}: {n} ({i + 1}/{k})", file=sys.stderr, flush=True))
        if rows:
            d = _merged(before.get(rid), d)
        d["command"] = f"python -m moetier compare {rid} --steps {a.steps} --json" + (
            " --set " + " ".join(f"'{x}'" for x in a.set) if a.set else "")
        docs.append(d)
        _write(Path(a.out), a.steps, sorted(kept + docs, key=lambda x: x["recipe"]), command)
    if pool is not None:
        pool.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
