"""Fit the synthetic GLM trace's generator parameters to the reference's published aggregate figures.

The published simulator figures (reference digest 5.6 / 5.7) on the reference's real G002 trace, with oracle seeding:
all experts in RAM 27.5 / 32.9 / 36.3 tok/s and 55 GB + NVMe tail 23.4 / 30.1 / 33.4 at C1 / C2 / C4. We do not have
that trace, so we fit the generator (popularity skew, token reuse, cross-layer affinity, per-segment drift) until our
simulator with `policy.seed=oracle` and the reference engine's tier policy (global LRU RAM, CLOCK VRAM:
moetier.peers.rows.REFERENCE_POLICY) lands on those figures. This is a fit to published aggregates, not a
measurement; the winning parameters are written into the shipped trace's metadata.

    python examples/fit_glm_trace.py [--evals N] [--write traces/glm53-synth.npz]
"""
from __future__ import annotations

import argparse
import json
import random
import sys

from moetier.core import sim
from moetier.core import records as spec
from moetier.peers.rows import reference_overrides
from moetier.traces.format import save_trace
from moetier.traces.gen import GenParams, generate

RECIPE = "glm53-rtx3090-55g-nvx4"
TARGETS = {230: (27.5, 32.9, 36.3), 55: (23.4, 30.1, 33.4)}
TOL = {230: 0.05, 55: 0.10}
SHAPE = dict(layers=42, experts=288, topk=8, tokens=4800, segments=4)
SEED = 7


def make(p: GenParams):
    return generate(p, seed=SEED, model_id="glm-5.3-flash-exl3-3.05bpw", **SHAPE)


def evaluate(p: GenParams):
    tr = make(p)
    got, worst, ss = {}, 0.0, 0.0
    for ram, want in TARGETS.items():
        R = spec.resolve(RECIPE, [f"budget.ram_gb={ram}", "policy.seed=oracle"] + reference_overrides())
        row = []
        for c, w in zip((1, 2, 4), want):
            tok = sim.run(R, tr, c)["tok_s"]
            row.append(round(tok, 2))
            e = abs(tok / w - 1) / TOL[ram]
            worst, ss = max(worst, e), ss + e * e
        got[ram] = row
    # smooth objective for the search; the acceptance test is worst <= 1
    return max(worst, (ss / 6) ** 0.5), got, tr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=40)
    ap.add_argument("--start", default=None, help="JSON GenParams to start from")
    ap.add_argument("--write", default=None, help="write the best trace here")
    a = ap.parse_args(argv)
    best = GenParams(**json.loads(a.start)) if a.start else GenParams(zipf_s=1.1, zipf_jitter=0.1, reuse=0.35,
                                                                          affinity=0.2, affinity_width=8, drift=0.3)
    bounds = {"zipf_s": (0.4, 2.0), "zipf_jitter": (0.0, 0.5), "reuse": (0.0, 0.8), "drift": (0.0, 1.0)}
    bs, bg, btr = evaluate(best)
    print(json.dumps({"params": best.to_json(), "score": round(bs, 3), "tok_s": bg}), flush=True)
    rng = random.Random(1)
    step = 0.15
    for i in range(a.evals):
        d = best.to_json()
        for k in rng.sample(list(bounds), rng.choice((1, 2))):
            lo, hi = bounds[k]
            d[k] = min(hi, max(lo, d[k] + rng.gauss(0, step) * (hi - lo)))
        p = GenParams(**d)
        s, g, tr = evaluate(p)
        if s < bs:
            best, bs, bg, btr = p, s, g, tr
            print(json.dumps({"eval": i, "params": best.to_json(), "score": round(bs, 3), "tok_s": bg}), flush=True)
        if bs <= 0.25:
            break
        if i % 10 == 9:
            step *= 0.7
    print("best", json.dumps({"params": best.to_json(), "score": round(bs, 3), "tok_s": bg}))
    if a.write:
        btr.meta.update({"fit": {"targets": {str(k): v for k, v in TARGETS.items()}, "achieved": {str(k): v for k, v in bg.items()},
                                 "score_vs_tolerance": round(bs, 3), "recipe": RECIPE, "seed_policy": "oracle"}})
        save_trace(btr, a.write)
    return 0 if bs <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
