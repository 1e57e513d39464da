"""What `moetier trace stats` prints: the ``traces.stats.stats`` dict as tables through ``render.table``.

Contract: ``print_trace_stats(d)`` prints, in order, the trace summary, the reuse-distance histograms, the
whole-model cache curve, the per-layer cache curve and the per-layer table, each with a legend saying what its
columns are (rich on a terminal, markdown when piped). Every figure is a field of ``trace stats --json``, rounded.
"""
from __future__ import annotations

from moetier.cli.render import table


def _pct(x: float, nd: int = 1) -> str:
    return f"{100 * x:.{nd}f}%"


def _summary(d: dict) -> None:
    s = d["summary"]
    rows = [["popularity entropy (normalized, 1 = uniform)", f"{s['entropy_norm']}"],
            ["hottest expert / mean expert", f"{s['max_over_mean']}"],
            ["share of picks on the top 10% of experts", f"{s['top10_share']}"],
            ["slot-0 (top-1) entropy (normalized)", f"{s['slot0_entropy_norm']}"],
            ["token-to-token reuse (random order)", f"{s['reuse_prev_token']} ({d['reuse_random_baseline']})"],
            ["top-1 repeat (random order)", f"{s['top1_repeat']} ({d['top1_random_baseline']})"],
            ["next-layer normalized mutual information", f"{s['nmi_next']}"],
            ["lift of the most frequent layer-to-layer pair", f"{s['lift_top_pair']}"]]
    nl = d.get("next_layer")
    if nl:
        rows.append([f"next-layer recall with k guesses ({nl['method']})",
                     ", ".join(f"k={k}: {v}" for k, v in nl["recall"].items())])
    table(["measure (mean over layers)", "value"], rows,
          title=f"trace: {d['tokens']} tokens x {d['layers']} layers x top-{d['topk']} over {d['experts']} experts, "
                f"{d['segments']} segment(s), {d['picks']} picks",
          legend=("reuse: share of a token's picks in a layer that the previous token also picked there; "
                  "top-1 repeat: the same for the highest-weighted pick alone.",
                  "next-layer recall: the best share of layer l's picks reachable with k guesses made from layer "
                  "l-1's picks (what a next-layer predictor can hope for)."))


def _reuse(d: dict) -> None:
    for key, title in (("reuse_distance", "reuse distance"), ("reuse_distance_fine", "reuse distance, fine")):
        r = d[key]
        print()
        table(["tokens since last use", *map(str, r["buckets"])], [["share of picks", *map(_pct, r["fraction"])]],
              title=f"{title} (tokens between two picks of the same expert in a layer, within a segment)")


def _curves(d: dict) -> None:
    c = d.get("cache")
    if c:
        print()
        table(["slots", "of model", "LRU", "Belady"],
              [[f"{sz:,}", _pct(fr), _pct(a), _pct(b)]
               for sz, fr, a, b in zip(c["sizes"], c["slots_fraction"], c["lru"], c["belady"])],
              title=f"cache hit rate, one cache over the whole model ({c['accesses']:,} accesses, "
                    f"{c['distinct_keys']:,} distinct keys; {c['order']})",
              legend=("LRU: least-recently-used replacement; Belady: the optimal replacement with the future known "
                      "(an upper bound for any policy at that size).",))
    lc = d.get("layer_cache")
    if lc:
        print()
        table(["slots per layer", "LRU", "Belady"],
              [[str(sz), _pct(a), _pct(b)] for sz, a, b in zip(lc["sizes"], lc["lru"], lc["belady"])],
              title="cache hit rate, one cache per layer (mean over layers)")


def _per_layer(d: dict) -> None:
    k, lc = str(d["topk"]), d.get("layer_cache")
    heads = ["layer", "entropy", "max/mean", "top10%", "reuse", "top-1 repeat", "d=1", "nmi l+1", "lift",
             f"recall@{k}"]
    if lc:
        heads += [f"LRU/Belady {s}" for s in lc["sizes"]]
    rows = []
    for i, p in enumerate(d["per_layer"]):
        row = [str(p["layer"]), f"{p['entropy_norm']:.3f}", f"{p['max_over_mean']:.2f}", f"{p['top10_share']:.3f}",
               f"{p['reuse_prev_token']:.3f}", f"{p['top1_repeat']:.3f}", f"{p['reuse_distance_fine'][0]:.3f}",
               "-" if p["nmi_next"] is None else f"{p['nmi_next']:.3f}",
               "-" if p["lift_top_pair"] is None else f"{p['lift_top_pair']:.2f}",
               f"{p['next_layer_recall'][k]:.3f}" if p.get("next_layer_recall") else "-"]
        if lc:
            row += [f"{a:.2f}/{b:.2f}" for a, b in zip(lc["per_layer"]["lru"][i], lc["per_layer"]["belady"][i])]
        rows.append(row)
    print()
    table(heads, rows, title="per layer",
          legend=("d=1: share of picks reused by the very next token (reuse distance 1); nmi l+1: normalized "
                  "mutual information with the next layer's picks; lift: of the most frequent pair with the next "
                  "layer; recall@k: next-layer recall with top-k guesses.",
                  "LRU/Belady N: hit rates of a per-layer cache of N slots."))


def print_trace_stats(d: dict) -> None:
    """Print ``stats()`` output as tables (module docstring)."""
    _summary(d)
    _reuse(d)
    _curves(d)
    _per_layer(d)
