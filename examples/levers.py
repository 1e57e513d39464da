"""The cumulative lever study on the default recipe (glm53-rtx3090-55g-nvx4 and its shipped trace): one call of
`moetier advise`'s what-if table (moetier.measure.advise_report.upgrade_table) on a fixed path.

    python examples/levers.py [--seed oracle|warmup] [--json] [--plot levers.png] [--quiet] [--workers N]

Each row adds one lever to the previous ones (the first row, all experts in RAM, is the calibration reference and
is not cumulative). `--seed oracle` reproduces the reference's semantics (whole-trace frequency seeding).
The levers are a fixed path that mixes software what-ifs with hardware, each a full replay of the whole trace; the
searched, hardware-only counterpart is `moetier advise RECIPE --upgrades` (docs/advise.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.cli import progress  # noqa: E402
from moetier.cli.common import positive_int  # noqa: E402
from moetier.cli.outpath import file_arg  # noqa: E402
from moetier.measure import advise_report as AR  # noqa: E402

RECIPE = "glm53-rtx3090-55g-nvx4"
# what-ifs in advise_report.upgrade_table's form; "alone": not stacked on the others (the calibration reference)
LEVERS = [
    {"name": "all experts in RAM (230 GB)", "sets": ["budget.ram_gb=230"], "alone": True},
    {"name": "55 GB RAM + NVMe tail", "sets": []},
    {"name": "+ layer-ahead NVMe prefetch (recall 0.7)", "sets": ["policy.prefetch.recall=0.7"]},
    {"name": "+ persistent CPU workers (handoff 0.145 -> 0.03 ms/layer)",
     "sets": ["lane_overrides.cpu.per_layer_ms=0.03"]},
    {"name": "+ fused non-MoE kernels and graphs (fixed 14 -> 9 ms)",
     "sets": ['calibration.fixed_ms={"1": 9, "2": 13, "4": 20}']},
    {"name": "+ 400 more VRAM slots", "sets": ["budget.vram_expert_slots=1910"]},
]


def study(seed: str, concs=(1, 2, 4), workers=None) -> list[dict]:
    """The rows: each lever's full replay (max_steps 0: the whole trace) at each concurrency."""
    with progress.task("levers", unit="replays") as bar:
        table = AR.upgrade_table(RECIPE, concs=concs, steps=0, upgrades=LEVERS, search=False, cumulative=True,
                                 base_overrides=[f"policy.seed={seed}"], workers=workers, progress=bar)
    return [_row(u, seed, concs) for u in table]


def _row(u, seed, concs) -> dict:
    res = u["rows"]
    bad = [r["error"] for r in res.values() if "error" in r]
    if bad:
        raise SystemExit(f"levers: {u['name']}: {bad[0]}")
    c1 = res[concs[0]]
    return {"lever": u["name"], "overrides": u["sets"] + [f"policy.seed={seed}"],
            "tok_s": {str(c): r["tok_s"] for c, r in res.items()},
            "c1_ms": {"fixed": c1["ms_fixed"], "gpu": c1["ms_gpu_moe"], "cpu": c1["ms_cpu_moe"]},
            "nvme_per_tok": c1["nvme_per_tok"], "cpu_experts_per_tok": c1["cpu_experts_per_tok"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", default="warmup", choices=["warmup", "oracle"],
                    help="tier seeding: warmup (held-out warm-up tokens) or oracle (the reference's)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--plot", metavar="PNG", type=file_arg("--plot"), help="also draw the study: bars per lever and concurrency")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    ap.add_argument("--workers", type=positive_int, help="replays at once (default: the CPU count)")
    a = ap.parse_args(argv)
    with progress.session(quiet=a.quiet):
        rows = study(a.seed, workers=a.workers)
    if a.plot:
        from moetier.cli.plots import plot_levers
        print(f"wrote {plot_levers(rows, a.plot)}", file=sys.stderr)
    if a.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    print(f"cumulative levers on {RECIPE} (seed {a.seed}); decode tok/s, C2/C4 are totals across streams")
    print("| lever (cumulative) | C1 | C2 | C4 | C1 ms/step: fixed + max(gpu, cpu) | NVMe/token | CPU experts/token |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t, m = r["tok_s"], r["c1_ms"]
        print(f"| {r['lever']} | {t['1']:.2f} | {t['2']:.2f} | {t['4']:.2f} | {m['fixed']:.1f} + max({m['gpu']:.2f}, "
              f"{m['cpu']:.2f}) | {r['nvme_per_tok']:.1f} | {r['cpu_experts_per_tok']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
