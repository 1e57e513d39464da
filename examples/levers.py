"""The cumulative lever study on the default recipe (glm53-rtx3090-55g-nvx4 and its shipped trace).

    python examples/levers.py [--seed oracle|warmup] [--json] [--plot levers.png] [--quiet]

Each row adds one lever to the previous ones (the first row, all experts in RAM, is the calibration reference and
is not cumulative). `--seed oracle` reproduces the reference's semantics (whole-trace frequency seeding).
The levers are a fixed path that mixes software what-ifs with hardware; the searched, hardware-only counterpart is
`moetier advise RECIPE --upgrades` (docs/advise.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moetier.cli import progress  # noqa: E402
from moetier.core import sim  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402

RECIPE = "glm53-rtx3090-55g-nvx4"
LEVERS = [
    ("all experts in RAM (230 GB)", ["budget.ram_gb=230"], False),
    ("55 GB RAM + NVMe tail", [], True),
    ("+ layer-ahead NVMe prefetch (recall 0.7)", ["policy.prefetch.recall=0.7"], True),
    ("+ persistent CPU workers (handoff 0.145 -> 0.03 ms/layer)", ["lane_overrides.cpu.per_layer_ms=0.03"], True),
    ("+ fused non-MoE kernels and graphs (fixed 14 -> 9 ms)", ['calibration.fixed_ms={"1": 9, "2": 13, "4": 20}'],
     True),
    ("+ 400 more VRAM slots", ["budget.vram_expert_slots=1910"], True),
]


def study(seed: str, concs=(1, 2, 4)) -> list[dict]:
    base = spec.resolve(RECIPE)
    tr = load_trace(REPO / base.trace, layers=base.layers, experts=base.experts, topk=base.topk)
    rows, acc = [], []
    with progress.task("levers", unit="replays", total=len(LEVERS) * len(concs)) as bar:
        for name, sets, cumulative in LEVERS:
            overrides = (acc + sets if cumulative else sets) + [f"policy.seed={seed}"]
            if cumulative:
                acc = acc + sets
            R = spec.resolve(RECIPE, overrides)
            res = {}
            for c in concs:
                res[c] = sim.run(R, tr, c)
                bar(len(rows) * len(concs) + len(res))
            rows.append(_row(name, overrides, res, concs))
    return rows


def _row(name, overrides, res, concs) -> dict:
    c1 = res[concs[0]]
    return {"lever": name, "overrides": overrides, "tok_s": {str(c): r["tok_s"] for c, r in res.items()},
            "c1_ms": {"fixed": c1["ms_fixed"], "gpu": c1["ms_gpu_moe"], "cpu": c1["ms_cpu_moe"]},
            "nvme_per_tok": c1["nvme_per_tok"], "cpu_experts_per_tok": c1["cpu_experts_per_tok"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", default="warmup", choices=["warmup", "oracle"],
                    help="tier seeding: warmup (held-out warm-up tokens) or oracle (the reference's)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--plot", metavar="PNG", help="also draw the study: bars per lever and concurrency")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    with progress.session(quiet=a.quiet):
        rows = study(a.seed)
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
