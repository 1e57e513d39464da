"""Leave-one-domain-out check of the generator's skew fit on the OLMoE routing counts, per layer (docs/traces.md).

For each of the five domains and each of the three layers in the counts (0, 7, 15): fit the layer's ``zipf_s`` on
the other four domains (the grid value whose top-8 selection counts best match their mean normalised entropy and
top-25% share), generate that layer (E=64, top-8, 12,000 tokens, seed 0), and compare its entropy and top-25% share
with the domain left out; tolerance 0.03 each. ``others`` is the range of the four other domains' own figures: a
held-out value outside it by more than 0.03 cannot be met by any fit that matches the others.

Run: PYTHONPATH=. python benchmarks/trace_fit_lodo.py [--counts PATH] [--json]   (exit 3 when a cell misses)
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from moetier.traces.gen import OLMOE_COUNTS, GenParams, generate, inclusion_stats
from moetier.traces.stats import _top_share, norm_entropy

E, K, LAYERS, TOL = 64, 8, (0, 7, 15), 0.03
GRID = np.round(np.arange(0.0, 2.51, 0.02), 4)


def share(c) -> float:
    return _top_share(c, 0.25)


def skew_of(s: float) -> tuple[float, float]:
    tr = generate(GenParams(zipf_s=float(s)), layers=1, experts=E, topk=K, tokens=12000, segments=1, seed=0)
    c = np.bincount(tr.ids[:, 0].ravel(), minlength=E)
    return norm_entropy(c), share(c)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default=str(OLMOE_COUNTS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    z = np.load(a.counts, allow_pickle=False)
    domains = sorted({k.split("__")[2] for k in z.files if k.startswith("olmoe__expert_counts__")})
    cnt = np.stack([z[f"olmoe__expert_counts__{d}"] for d in domains])            # [D, 3, E]
    ent = np.array([[norm_entropy(r) for r in dom] for dom in cnt])
    top = np.array([[share(r) for r in dom] for dom in cnt])
    # the grid's expected (entropy, top-25% share) of top-8 selection counts; inclusion_stats gives top-10%, so
    # the share is measured on generated counts
    table = np.array([(inclusion_stats(s, E, K)[0], share(_counts(s))) for s in GRID])
    rows = []
    for i, d in enumerate(domains):
        rest = [j for j in range(len(domains)) if j != i]
        for li, layer in enumerate(LAYERS):
            e_t, t_t = ent[rest, li].mean(), top[rest, li].mean()
            s = GRID[int(np.argmin(((table[:, 0] - e_t) / 0.02) ** 2 + ((table[:, 1] - t_t) / 0.05) ** 2))]
            e_g, t_g = skew_of(s)
            rows.append({"domain": d, "layer": layer, "zipf_s": float(s), "entropy": ent[i, li], "entropy_fit": e_g,
                         "entropy_others": [ent[rest, li].min(), ent[rest, li].max()], "top25": top[i, li],
                         "top25_fit": t_g, "top25_others": [top[rest, li].min(), top[rest, li].max()],
                         "ok": abs(e_g - ent[i, li]) <= TOL and abs(t_g - top[i, li]) <= TOL})
    if a.json:
        print(json.dumps(rows, indent=1, sort_keys=True, default=float))
    else:
        print("| left out | layer | entropy | fit on others | error | others' range | top-25% share | fit on others "
              "| error | others' range | ok |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['domain']} | {r['layer']} | {r['entropy']:.3f} | {r['entropy_fit']:.3f} | "
                  f"{r['entropy_fit'] - r['entropy']:+.3f} | {r['entropy_others'][0]:.3f}-{r['entropy_others'][1]:.3f}"
                  f" | {r['top25']:.3f} | {r['top25_fit']:.3f} | {r['top25_fit'] - r['top25']:+.3f} | "
                  f"{r['top25_others'][0]:.3f}-{r['top25_others'][1]:.3f} | {'yes' if r['ok'] else 'NO'} |")
        print(f"\n{sum(r['ok'] for r in rows)} of {len(rows)} (domain, layer) cells within {TOL} on both")
    return 0 if all(r["ok"] for r in rows) else 3


def _counts(s: float) -> np.ndarray:
    rng = np.random.default_rng(1)
    p = np.arange(1, E + 1, dtype=np.float64) ** -s
    keys = (p / p.sum())[None, :] / rng.standard_exponential((2000, E))
    return np.bincount(np.argpartition(-keys, K - 1, axis=1)[:, :K].ravel(), minlength=E)


if __name__ == "__main__":
    sys.exit(main())
