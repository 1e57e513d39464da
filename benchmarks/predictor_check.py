"""The gated predictor against no prefetch and against the recall what-if, on every shipped trace (docs/peers.md).

For each (recipe, trace): the trace's next-layer predictability (moetier.traces.stats.next_layer_recall, recall at
k = top-k, mean over layers), then three replays with the recipe's policy and only ``policy.prefetch`` changed: no
prefetch (depth 0), the gated predictor (depth 1), and the recall what-if (depth 1, ``recall`` = the share of NVMe
picks the gated predictor's reads covered, so both prefetch the same share). The goal (issue 26): gated never below
no prefetch by more than the noise (1%: twice the standard error of repeated measured runs, docs/calibration.md),
and where predictability is above 0.4 a gain at least half the what-if's (less the noise: two gains of a few
hundredths of a percent are equal).

Run: PYTHONPATH=. python benchmarks/predictor_check.py [--steps N] [--concs 1,4] [--json]
The last row is a generated trace with strong layer-to-layer structure on the GLM 20 GB recipe (the shipped traces
are near 0.3 predictability).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import numpy as np

from moetier.cli.common import find_path
from moetier.core import records as spec, sim
from moetier.traces.format import load_trace
from moetier.traces.gen import GenParams, generate
from moetier.traces.stats import next_layer_recall

NOISE = 0.01
CASES = (("glm53-rtx5070-20g-nvme1", None), ("qwen38fn-arcb70-16g-nvx4", None), ("tiny-ci-cuda", None),
         ("tiny-local-cpu", None), ("glm53-rtx5070-20g-nvme1", "affinity"))
PREDICTABLE = {"zipf_s": 1.0, "reuse": 0.3, "affinity": 0.9, "affinity_width": 1}


def _trace(R, kind):
    if kind is None:
        return R.trace, load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)
    tr = generate(GenParams.from_json(PREDICTABLE), layers=R.layers, experts=R.experts, topk=R.topk, tokens=3200,
                  segments=2, seed=0, model_id=R.model_id)
    return f"generated {json.dumps(PREDICTABLE)}", tr


def _pf(R, **pf):
    base = {"depth": 1, "recall": 0.0, "predictor": "none", "budget": 8}
    return replace(R, policy={**R.policy, "prefetch": {**base, **pf}})


def check(rid: str, kind, steps: int, concs) -> dict:
    R = spec.resolve(rid, [])
    name, tr = _trace(R, kind)
    pred = float(np.mean([r[R.topk] for r in next_layer_recall(np.asarray(tr.ids, dtype=np.int64), R.experts,
                                                                  ks=[R.topk])["recall"]]))
    out = {"recipe": rid, "trace": name, "predictability": round(pred, 3), "by_conc": {}}
    for c in concs:
        none = sim.run(_pf(R, depth=0), tr, c, max_steps=steps)
        gated = sim.run(_pf(R, predictor="gated"), tr, c, max_steps=steps)
        rec = gated["prefetch"]["recall"] or 0.0
        whatif = sim.run(_pf(R, predictor="recall", recall=rec), tr, c, max_steps=steps) if rec > 0 else none
        g, w = gated["tok_s"] / none["tok_s"] - 1, whatif["tok_s"] / none["tok_s"] - 1
        ok = g >= -NOISE and (pred <= 0.4 or g >= 0.5 * w - NOISE)      # both within the noise
        out["by_conc"][str(c)] = {
            "none": round(none["tok_s"], 3), "gated": round(gated["tok_s"], 3), "whatif": round(whatif["tok_s"], 3),
            "gated_gain": round(g, 4), "whatif_gain": round(w, 4), "recall": round(rec, 4),
            "precision": gated["prefetch"]["precision"], "reads_per_tok": round(gated["prefetch"]["issued_per_tok"], 2),
            "ok": ok}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--concs", default="1,4")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    concs = [int(c) for c in a.concs.split(",")]
    rows = []
    for rid, kind in CASES:
        rows.append(check(rid, kind, a.steps, concs))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    print("| recipe | trace | predictability | C | no prefetch | gated | gain | gated reads/tok, precision, recall "
          "| what-if at that recall | what-if gain | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for c, v in r["by_conc"].items():
            prec = "-" if v["precision"] is None else f"{v['precision']:.2f}"
            print(f"| {r['recipe']} | {r['trace']} | {r['predictability']:.3f} | {c} | {v['none']:.2f} | "
                  f"{v['gated']:.2f} | {100 * v['gated_gain']:+.1f}% | {v['reads_per_tok']:.1f}, {prec}, "
                  f"{v['recall']:.3f} | {v['whatif']:.2f} | {100 * v['whatif_gain']:+.1f}% | "
                  f"{'met' if v['ok'] else 'MISSED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
