"""Why plain LFU beats decayed LFU as the per-layer RAM order on the shipped traces: how stationary a layer's expert
popularity is within a request, and what each order evicts.

Run: PYTHONPATH=. python benchmarks/popularity_drift.py [--recipes a,b] [--json]   (a few minutes of one core)

Per recipe, on its trace as the simulator replays it (each segment a stream: its first min(warmup_tokens, half)
tokens warm, the next 150 are measured), with S = RAM slots / layers, one layer's share under ``ram_partition:
layer``:

* ``within``: the overlap of each layer's top-S experts by count over the warm-up with its top-S over the measured
  tokens, mean over layers and segments (1.0: the same set; ``random`` = S / experts is what unrelated sets give);
  ``across``: the same between the first segment's whole counts and each other segment's (other requests).
* ``halflife``: dlfu's default half-life, 4 x S uses of the share, in tokens (k picks a token).
* a stand-alone cache of S slots per layer, run over each layer's picks in trace order with the layer's current
  picks protected (as the ledger protects the layer being planned): ``hit_*``, its hit rate over the measured
  tokens under ``lfu`` and ``dlfu``; ``core_*``, the share of its evictions whose victim is one of the request's
  S most picked experts (counted over warm-up and measured tokens).

No timing, no VRAM tier and no planner enter: this isolates the order; `moetier compare` times it.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from benchmarks.compare_all import _recipe
from moetier.core.policies.residency import make
from moetier.errors import UserError
from moetier.traces.stats import selection_counts

RECIPES = ("glm53-rtx5070-20g-nvme1", "glm53-rtx3090-55g-nvx4", "glm53-rtx3090-55g-nvx4-cold2b",
           "qwen38fn-arcb70-16g-nvx4", "qwen38fn-arcb70-32g-nvx4", "tiny-ci-cpu", "tiny-local-cpu")
MEASURED = 150


def _top(counts: np.ndarray, s: int) -> np.ndarray:
    """bool [layers, experts]: each layer's s largest counts."""
    out = np.zeros(counts.shape, bool)
    np.put_along_axis(out, np.argpartition(-counts, s - 1, axis=1)[:, :s], True, axis=1)
    return out


def _replay(seq: np.ndarray, spec: str, s: int, experts: int, warm: int, core: np.ndarray) -> tuple[int, int, int]:
    """(measured hits, measured evictions, of them of a core expert) of one layer's picks ``seq`` [tokens, k]."""
    pol = make(spec, s, base=0, width=experts)
    hits = ev = evcore = 0
    for t, picks in enumerate(seq.tolist()):
        cur = set(picks)
        for key in picks:
            if key in pol:
                pol.hit(key)
                hits += t >= warm
                continue
            if len(pol) >= s:
                v = pol.victim(key, lambda x: x not in cur)
                if t >= warm:
                    ev += 1
                    evcore += bool(core[v])
                pol.remove(v)
            pol.insert(key)
    return hits, ev, evcore


def drift(R, tr, specs=("lfu", "dlfu")) -> dict:
    """The figures of the module docstring for recipe ``R`` and its trace ``tr``."""
    E, s = R.experts, max(1, min(R.ram_slots // R.layers, R.experts - 1))
    segs = [tr.segment(i) for i in range(tr.nseg)]
    within, picks = [], 0
    tally = {p: np.zeros(3) for p in specs}
    for ids in segs:
        w = min(int(R.policy.get("warmup_tokens", 1000)), len(ids) // 2)
        ids = ids[:w + MEASURED].astype(np.int64)
        warm, measured = _top(selection_counts(ids[:w], E), s), _top(selection_counts(ids[w:], E), s)
        within.append(((warm & measured).sum(1) / s).mean())
        core = _top(selection_counts(ids, E), s)
        picks += ids[w:].size
        for p in specs:
            for l in range(ids.shape[1]):
                tally[p] += _replay(ids[:, l, :], p, s, E, w, core[l])
    whole = [_top(selection_counts(x.astype(np.int64), E), s) for x in segs]
    across = [((whole[0] & x).sum(1) / s).mean() for x in whole[1:]]
    out = {"trace": R.trace, "share": s, "random": s / E, "within": float(np.mean(within)),
           "across": float(np.mean(across)) if across else None, "halflife": make("dlfu", s).halflife / R.topk}
    for p, (h, ev, c) in tally.items():
        out[f"hit_{p}"], out[f"core_{p}"] = h / picks, c / max(ev, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        recipes = {rid: _recipe(rid) for rid in a.recipes.split(",")}    # every id checked before a minute of work
    except UserError as e:
        print(f"popularity_drift: --recipes: {e}", file=sys.stderr)
        return 2
    out = {rid: drift(*r) for rid, r in recipes.items()}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print("| recipe | S | top-S overlap within a request (across requests; random) | dlfu half-life, tokens | "
          "hits lfu / dlfu | evictions of a core expert lfu / dlfu |")
    print("|---|---|---|---|---|---|")
    for rid, x in out.items():
        print(f"| {rid} | {x['share']} | {x['within']:.3f} ({x['across']:.3f}; {x['random']:.3f}) | "
              f"{x['halflife']:.1f} | {x['hit_lfu']:.3f} / {x['hit_dlfu']:.3f} | "
              f"{x['core_lfu']:.3f} / {x['core_dlfu']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
