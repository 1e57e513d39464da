"""Leave-one-domain-out check of the generator's skew fit on the OLMoE routing counts (docs/traces.md).

For each of the five domains: fit the generator's skew (``zipf_s`` and ``zipf_jitter``, the same per-row grid fit
as moetier.traces.gen.fit_olmoe) on the other four domains' selection counts, generate a trace with those
parameters (E=64, top-8, 3 layers, 12,000 tokens, seed 0), and compare its skew (normalised entropy and top-10%
share of the selection counts, mean over layers 0/7/15) with the domain left out. The "in-domain" columns fit on the
left-out domain itself: the error the generator makes with the right data, against which the held-out error reads.

Run: PYTHONPATH=. python benchmarks/trace_fit_lodo.py [--counts PATH] [--json]   (about 30 s)
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from moetier.traces.gen import OLMOE_COUNTS, GenParams, _top_share, generate, inclusion_stats
from moetier.traces.stats import norm_entropy

E, K = 64, 8
GRID = np.round(np.arange(0.0, 2.51, 0.02), 4)


def skew_fit(table: np.ndarray, ent: np.ndarray, top: np.ndarray) -> GenParams:
    """zipf_s = mean of the per-row best grid s against (entropy, top-10% share); jitter = their spread."""
    err = ((table[None, :, 0] - ent.ravel()[:, None]) / 0.02) ** 2 + \
          ((table[None, :, 1] - top.ravel()[:, None]) / 0.05) ** 2
    row_s = GRID[np.argmin(err, axis=1)]
    s = float(row_s.mean())
    return GenParams(zipf_s=round(s, 4), zipf_jitter=round(float(row_s.std() / s) if s > 0 else 0.0, 4))


def skew_of(p: GenParams) -> tuple[float, float]:
    tr = generate(p, layers=3, experts=E, topk=K, tokens=12000, segments=1, seed=0)
    c = [np.bincount(tr.ids[:, l].ravel(), minlength=E) for l in range(3)]
    return float(np.mean([norm_entropy(x) for x in c])), float(np.mean([_top_share(x) for x in c]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default=str(OLMOE_COUNTS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    z = np.load(a.counts, allow_pickle=False)
    domains = sorted({k.split("__")[2] for k in z.files if k.startswith("olmoe__expert_counts__")})
    cnt = np.stack([z[f"olmoe__expert_counts__{d}"] for d in domains])            # [D, 3, E]
    ent = np.array([[norm_entropy(r) for r in dom] for dom in cnt])
    top = np.array([[_top_share(r) for r in dom] for dom in cnt])
    table = np.array([inclusion_stats(s, E, K) for s in GRID])
    rows = []
    for i, d in enumerate(domains):
        rest = [j for j in range(len(domains)) if j != i]
        p_out = skew_fit(table, ent[rest], top[rest])
        p_in = skew_fit(table, ent[[i]], top[[i]])
        (e_out, t_out), (e_in, t_in) = skew_of(p_out), skew_of(p_in)
        rows.append({"domain": d, "entropy": ent[i].mean(), "top10": top[i].mean(),
                     "fit_others": p_out.to_json(), "entropy_others": e_out, "top10_others": t_out,
                     "entropy_in": e_in, "top10_in": t_in})
    if a.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    print("| left out | entropy | fit on others | error | in-domain error | top-10% share | fit on others | error "
          "| in-domain error | zipf_s (others) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['domain']} | {r['entropy']:.3f} | {r['entropy_others']:.3f} | "
              f"{r['entropy_others'] - r['entropy']:+.3f} | {r['entropy_in'] - r['entropy']:+.3f} | "
              f"{r['top10']:.3f} | {r['top10_others']:.3f} | {r['top10_others'] - r['top10']:+.3f} | "
              f"{r['top10_in'] - r['top10']:+.3f} | {r['fit_others']['zipf_s']:.2f} |")
    eo = np.abs([r["entropy_others"] - r["entropy"] for r in rows])
    to = np.abs([r["top10_others"] - r["top10"] for r in rows])
    print(f"\nmean |error| held out: entropy {eo.mean():.3f}, top-10% share {to.mean():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
