"""Sweep throughput: a 1,000-cell sweep of the default recipe, cells per second on the local process pool and on a
local Ray instance, side by side in one run.

    python benchmarks/bench_sweep.py [--cells 1000] [--blocks 5] [--workers 2] [--json] [--out benchmarks/sweep.json]

The grid is budget.ram_gb x budget.vram_expert_slots x policy.ram_evict x concurrency on glm53-rtx3090-55g-nvx4,
each cell a short replay (policy.warmup_tokens and --steps small: the cost of one cell is resolve + seed + a few
steps, which is what a sweep of thousands of what-ifs pays). The cells are cut into --blocks blocks; each block runs
on the pool and on Ray one after the other, the order alternating between blocks (A B, B A, ...), so machine drift
lands on both. Both backends are started and warmed before the first block (their start-up is reported apart).
Reported per backend: cells/s per block (min / median / max) and over all cells, the median cell's time in its
worker, and the per-cell overhead (workers x wall / cells - mean time in a worker): what the backend adds to each
cell. The rows of both backends must be equal (everything but timing): the benchmark fails otherwise.
Writes the JSON (--out) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.measure import sweep as S  # noqa: E402

RECIPE = "glm53-rtx3090-55g-nvx4"


def grid(n: int, steps: int, warmup: int) -> list:
    """n cells (a multiple of 40 is exact): RAM budgets x 5 VRAM slot counts x 2 policies x 4 concurrencies."""
    per = max(1, -(-n // 40))
    ram = ",".join(str(20 + 4 * i) for i in range(per))
    cells = S.cells(RECIPE, grid=[f"budget.ram_gb={ram}", "budget.vram_expert_slots=1000,1250,1510,1750,2000"],
                    sets=[f"policy.warmup_tokens={warmup}"], concs=[1, 2, 4, 8], policies=["lru", "lfu"],
                    steps=steps)
    return cells[:n]


def _stats(xs) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=1000, help="cells in the sweep (default 1000)")
    ap.add_argument("--blocks", type=int, default=5, help="blocks, each run on both backends (default 5)")
    ap.add_argument("--workers", type=int, default=2, help="pool processes and Ray CPUs (default 2)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per cell (default 2)")
    ap.add_argument("--warmup-tokens", type=int, default=4, help="policy.warmup_tokens per cell (default 4)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "sweep.json"), help="JSON results file")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    a = ap.parse_args(argv)
    import ray

    cells = grid(a.cells, a.steps, a.warmup_tokens)
    S.check(cells)
    blocks = [cells[i::a.blocks] for i in range(a.blocks)]          # strided: each block spans the whole grid
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    t0 = time.perf_counter()
    pool = S.process_pool(a.workers)
    list(pool.map(S.run_cell, cells[:a.workers]))                    # warm: imports, trace load
    start = {"pool": time.perf_counter() - t0}
    t0 = time.perf_counter()
    ray.init(num_cpus=a.workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    S.sweep(cells[:a.workers], tmp / "warm-ray.jsonl", workers=a.workers, ray="local")
    start["ray"] = time.perf_counter() - t0
    per = {"pool": [], "ray": []}
    try:
        for i, blk in enumerate(blocks):
            for b in (("pool", "ray") if i % 2 == 0 else ("ray", "pool")):
                s = S.sweep(blk, tmp / f"{b}.jsonl", workers=a.workers, ray="local" if b == "ray" else None,
                            executor=pool)
                assert s["ran"] == len(blk), s
                per[b].append(s)
    finally:
        pool.shutdown()
        ray.shutdown()
    rows = {b: {r["key"]: r for r in S.read_rows(tmp / f"{b}.jsonl")} for b in per}
    strip = lambda r: {k: v for k, v in r.items() if k not in S.TIMING_FIELDS}  # noqa: E731
    equal = rows["pool"].keys() == rows["ray"].keys() and all(strip(rows["pool"][k]) == strip(rows["ray"][k])
                                                              for k in rows["pool"])
    res = {"recipe": RECIPE, "cells": len(cells), "blocks": a.blocks, "workers": a.workers, "steps": a.steps,
           "warmup_tokens": a.warmup_tokens, "cpus": os.cpu_count(), "results_equal": equal,
           "startup_s": start, "backends": {}}
    for b, ss in per.items():
        wall = sum(s["seconds"] for s in ss)
        cell_s = [r["seconds"] for r in rows[b].values()]
        res["backends"][b] = {
            "cells_per_s": _stats([s["cells_per_s"] for s in ss]), "cells_per_s_all": len(cells) / wall,
            "wall_s": wall, "cell_s_in_worker": _stats(cell_s),
            "overhead_ms_per_cell": 1000 * (a.workers * wall / len(cells) - statistics.fmean(cell_s))}
    Path(a.out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    if a.json:
        print(json.dumps(res, indent=1, sort_keys=True))
    else:
        print(table(res))
    return 0 if equal else 1


def table(res: dict) -> str:
    out = [f"{res['cells']}-cell sweep of {res['recipe']} ({res['steps']} steps, warm-up {res['warmup_tokens']} "
           f"tokens a cell), {res['workers']} workers, {res['blocks']} interleaved blocks; results equal: "
           f"{res['results_equal']}",
           "| backend | cells/s min / median / max (per block) | cells/s over all | cell in worker, median ms | "
           "overhead ms/cell | start-up s |", "|---|---|---|---|---|---|"]
    for b, d in res["backends"].items():
        c = d["cells_per_s"]
        out.append(f"| {'local pool' if b == 'pool' else 'local Ray'} | {c['min']:.2f} / {c['median']:.2f} / "
                   f"{c['max']:.2f} | {d['cells_per_s_all']:.2f} | {1000 * d['cell_s_in_worker']['median']:.1f} | "
                   f"{d['overhead_ms_per_cell']:.1f} | {res['startup_s'][b]:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
