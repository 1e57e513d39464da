"""Fit the per-layer recency generator (moetier.traces.layergen) to a routing trace, and check the fit per layer.

Contract
--------
``fit_trace(trace, experts, *, seed=0, rounds=2) -> dict`` returns ``{"params": LayerParams JSON, "checks": [...],
"ok": bool, "shape", "experts", "segments", "seed", "seconds"}``. ``checks`` holds one row per layer and statistic:
``{"layer", "statistic", "source", "fitted", "diff", "tolerance", "ok"}`` (for the LRU curve, the figures at the
cache size where the difference is largest, and ``"size"``), measured on the source and on a trace generated with
the fitted parameters at the source's shape (tokens, layers, top-k, segment boundaries) and ``seed``:

* ``lru_curve``: the layer's LRU hit rate at every cache size from 1 to 3 x top-k slots (moetier.traces.stats:
  ``layer_cache``); tolerance 0.01 at each size;
* ``top1_repeat``: slot 0 repeating the previous token's slot 0 (same segment); tolerance 0.02;
* ``entropy_norm``: normalised popularity entropy H / log E of the layer's selection counts; tolerance 0.01;
* ``predictability``: next-layer recall at k = top-k from the previous layer (layers 1..L-1;
  moetier.traces.stats.next_layer_recall); tolerance 0.03.

The fit: the depth law of every (layer, slot) is the source's histogram of LRU stack depths below 3 x top-k (so the
LRU curve and the top-1 repeat are the source's by construction, to within the rounding of exact counts), and so
is the share of each (slot, depth)'s picks made by choice rather than recency (``choice_share``); the popularity
starts as the source's selection counts and the transition is the source's co-occurrence counts
(moetier.traces.layergen). Then, all layers on one generated trace a step: ``rounds`` passes of per-layer
bisection of ``affinity`` on the layer's predictability (0 .. 16, then a bracket an eighth as wide around the best
value), each step also moving the popularity weights toward the source's counts by half the log-ratio of what they
gave; last, 8 steps of both (affinity by (target / got) ** 2), keeping the step with the fewest entropy and
predictability rows outside tolerance (then the smallest excess), which the check replays exactly. Deterministic
for a seed. Pure: no I/O.
"""
from __future__ import annotations

import time

import numpy as np

from moetier.errors import UserError
from moetier.traces.format import Trace
from moetier.traces.layergen import AFFINITY_MAX, LayerParams, choice_share, transition, walk
from moetier.traces.stats import (_top1_repeat, drop_masked, next_layer_recall, norm_entropy, selection_counts,
                                  stack_depths)

__all__ = ["fit_trace", "measure", "check_fit", "TOLERANCE", "format_fit", "STATISTICS"]

TOLERANCE = {"lru_curve": 0.01, "top1_repeat": 0.02, "entropy_norm": 0.01, "predictability": 0.03}
STATISTICS = tuple(TOLERANCE)
DEPTH_PER_TOPK = 3          # the LRU curve is fitted and checked from 1 to 3 x top-k slots per layer
_BISECT_STEPS = 8
_POLISH_STEPS = 8
GAIN = 2.0                # a polishing step multiplies affinity by (target / got) ** GAIN
ROOT = 4.0                # the first layer's affinity, where it has one: the second layer's over ROOT
SUCCESSORS_PER_TOPK = 2   # successors kept per expert of the previous layer: 2 x top-k
MIN_TOKENS = 64


def measure(ids: np.ndarray, segments: np.ndarray, experts: int, *, predictability: bool = True) -> dict:
    """Per-layer statistics of ids [tokens, layers, topk] (module docstring): ``lru`` [L, 3 x top-k] (sizes 1..),
    ``top1_repeat`` [L], ``entropy_norm`` [L], ``predictability`` [L - 1] (None on one layer or when not asked),
    and ``depth`` (the stack depths, capped at 3 x top-k)."""
    ids = np.asarray(ids, dtype=np.int64)
    T, L, K = ids.shape
    E = int(experts)
    D = DEPTH_PER_TOPK * K
    depth = stack_depths(ids, D)
    first = np.zeros(T, dtype=bool)
    first[np.asarray(segments, dtype=np.int64)[:-1]] = True
    counts = selection_counts(ids, E)
    out = {"sizes": list(range(1, D + 1)), "depth": depth,
           "lru": np.stack([(depth < s).mean(axis=(0, 2)) for s in range(1, D + 1)], axis=1),
           "top1_repeat": _top1_repeat(ids, first), "entropy_norm": np.array([norm_entropy(c) for c in counts]),
           "predictability": None}
    if predictability and L > 1:
        out["predictability"] = _predictability(ids, E)
    return out


def _predictability(ids: np.ndarray, experts: int) -> np.ndarray:
    K = ids.shape[2]
    return np.array([r[K] for r in next_layer_recall(ids, experts, ks=[K])["recall"]])


def check_fit(src: dict, fit: dict) -> list[dict]:
    """One row per layer and statistic (module docstring)."""
    rows = []
    L = len(src["entropy_norm"])
    for l in range(L):
        d = np.abs(src["lru"][l] - fit["lru"][l])
        j = int(np.argmax(d))
        rows.append(_row(l, "lru_curve", src["lru"][l][j], fit["lru"][l][j]) | {"size": src["sizes"][j]})
        rows.append(_row(l, "top1_repeat", src["top1_repeat"][l], fit["top1_repeat"][l]))
        rows.append(_row(l, "entropy_norm", src["entropy_norm"][l], fit["entropy_norm"][l]))
        if l and src["predictability"] is not None:
            rows.append(_row(l, "predictability", src["predictability"][l - 1], fit["predictability"][l - 1]))
    return rows


def _row(layer: int, name: str, a: float, b: float) -> dict:
    d = abs(float(a) - float(b))
    return {"layer": layer, "statistic": name, "source": round(float(a), 4), "fitted": round(float(b), 4),
            "diff": round(d, 4), "tolerance": TOLERANCE[name], "ok": d <= TOLERANCE[name]}


def _depth_law(depth: np.ndarray, D: int) -> np.ndarray:
    """Per layer, per slot: the share of picks at stack depth 0..D-1 and deeper (the last entry) [L, K, D + 1]."""
    T, L, K = depth.shape
    key = (np.arange(L)[None, :, None] * K + np.arange(K)[None, None, :]) * (D + 1) + np.minimum(depth, D)
    return np.bincount(key.ravel(), minlength=L * K * (D + 1)).reshape(L, K, D + 1) / T


def _toward(weights: np.ndarray, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Popularity weights a step toward selection counts ``want`` from the counts ``got`` they gave (half the
    log-ratio, so noise in one trace does not swing them), each layer's total kept; 0 stays 0."""
    w = weights * np.sqrt((want + 1.0) / (got + 1.0))
    return np.round(w * (want.sum(axis=1, keepdims=True) / np.maximum(w.sum(axis=1, keepdims=True), 1e-300)), 3)


def _miss(got: np.ndarray, want: np.ndarray, name: str) -> tuple:
    """(layers outside the statistic's tolerance, their total excess over it, as multiples of it)."""
    d = np.abs(got - want) / TOLERANCE[name] if TOLERANCE[name] else np.abs(got - want) * 1e9
    return np.array([float((d > 1).sum()), float(np.maximum(d - 1, 0).sum())])


def _polish(src: dict, arrays: dict, counts: np.ndarray, T: int, K: int, E: int, seed: int, root: bool):
    """Steps moving the popularity weights toward the source's counts and each affinity by (target / got) ** GAIN;
    returns the step with the fewest entropy and predictability rows outside tolerance, then the smallest excess:
    ``((rows, excess), (affinity, weights))``."""
    pred = src["predictability"]
    a, weights = arrays["affinity"], arrays["popularity"]
    if root:
        a = np.concatenate([a[1:2] / ROOT, a[1:]])
    best, keep = (np.inf,), (a, weights)
    for _ in range(_POLISH_STEPS):
        gen = walk(arrays | {"affinity": a, "popularity": weights}, T, K, seed)
        c = selection_counts(gen, E)
        miss = _miss(np.array([norm_entropy(x) for x in c]), src["entropy_norm"], "entropy_norm")
        got = _predictability(gen, E) if pred is not None else None
        if got is not None:
            miss = miss + _miss(got, pred, "predictability")
        if tuple(miss) < best:
            best, keep = tuple(miss), (a, weights)
        weights = _toward(weights, c, counts)
        if got is not None:
            step = np.clip(np.where(got < pred, np.maximum(a[1:], 0.25), a[1:]) * (pred / np.maximum(got, 1e-9))
                           ** GAIN, 0.0, AFFINITY_MAX)
            a = np.round(np.concatenate([step[:1] / ROOT if root else [0.0], step]), 4)
    return best, keep


def fit_trace(trace: Trace, experts: int, *, seed: int = 0, rounds: int = 2) -> dict:
    """Fit LayerParams to ``trace`` and check the fit (module docstring)."""
    t0 = time.time()
    ids, seg, _ = drop_masked(trace, "trace fit")
    T, L, K = ids.shape
    E = int(experts)
    if T < MIN_TOKENS:
        raise UserError(f"trace fit: the trace has {T} tokens; expected at least {MIN_TOKENS} to fit")
    if ids.min() < 0 or ids.max() >= E:
        raise UserError(f"trace fit: expert ids out of range 0..{E - 1} (found {ids.min()}..{ids.max()})")
    D = DEPTH_PER_TOPK * K
    if D >= E:
        raise UserError(f"trace fit: {E} experts per layer; the recency model needs more than 3 x top-k ({D})")
    ids = ids.astype(np.int64)
    src = measure(ids, seg, E)
    succ, cnt = transition(ids, E, SUCCESSORS_PER_TOPK * K)
    law = [[[round(float(x), 6) for x in row] for row in q] for q in _depth_law(src["depth"], D)]   # as in JSON
    arrays = {"depth_p": np.array(law), "choice": np.round(choice_share(ids, E, D), 4), "affinity": np.zeros(L),
              "successors": succ, "successor_counts": cnt, "popularity": selection_counts(ids, E)}
    # per layer, all layers on one generated trace a step: affinity by bisection on the layer's predictability
    # (each pass brackets the last pass's best value more narrowly, and keeps the best value it tried), and the
    # popularity weights a step toward the source's selection counts
    counts = arrays["popularity"].astype(np.float64)
    pred = src["predictability"]
    target = np.concatenate([[0.0], pred]) if pred is not None else np.zeros(L)
    a, weights = np.zeros(L), counts.copy()
    for r in range(int(rounds)):
        width = AFFINITY_MAX * 0.5 ** (3 * r)
        lo, hi = np.maximum(0.0, a - width), np.minimum(AFFINITY_MAX, a + width)
        best, best_x = np.full(L, np.inf), a.copy()
        for _ in range(_BISECT_STEPS - 2 * r):
            x = 0.5 * (lo + hi) if pred is not None else np.zeros(L)
            x[0] = 0.0
            gen = walk(arrays | {"affinity": x, "popularity": weights}, T, K, seed)
            got = np.concatenate([[0.0], _predictability(gen, E)]) if pred is not None else target
            err = np.abs(got - target)
            better = err < best
            best[better], best_x[better] = err[better], x[better]
            up = got < target
            lo, hi = np.where(up, x, lo), np.where(up, hi, x)
            weights = _toward(weights, selection_counts(gen, E), counts)
        a = best_x
    a = np.round(a, 4)
    # last, both a step at a time; where a row is still outside tolerance, again with the first layer's coherence
    # (its affinity the second layer's over ROOT: without it, the second layer's predictability can fall short
    # whatever its affinity); the check below replays the best step exactly
    best, keep = _polish(src, arrays | {"affinity": a, "popularity": weights}, counts, T, K, E, seed, root=False)
    if best[0] and L > 1:
        best, keep = min((best, keep), _polish(src, arrays | {"affinity": a, "popularity": weights}, counts, T, K, E,
                                               seed, root=True), key=lambda x: x[0])
    arrays["affinity"], arrays["popularity"] = keep

    params = LayerParams.from_json(LayerParams.from_arrays(arrays).to_json())   # the figures are those of the JSON
    gen = walk(params.arrays(), T, K, seed)
    checks = check_fit(src, measure(gen, seg, E))
    return {"params": params.to_json(), "checks": checks, "ok": all(c["ok"] for c in checks),
            "shape": [int(T), int(L), int(K)], "experts": E, "segments": int(len(seg) - 1), "seed": int(seed),
            "seconds": round(time.time() - t0, 1)}


def summary(d: dict) -> list[dict]:
    """Per statistic: the largest difference over layers, where, its tolerance and how many layers miss it."""
    out = []
    for name in STATISTICS:
        rows = [c for c in d["checks"] if c["statistic"] == name]
        if rows:
            worst = max(rows, key=lambda c: c["diff"])
            out.append({"statistic": name, "worst_diff": worst["diff"], "worst_layer": worst["layer"],
                        "tolerance": TOLERANCE[name], "layers": len(rows), "missed": sum(not c["ok"] for c in rows)})
    return out


def format_fit(d: dict) -> str:
    """The fit report as text: the summary, then the table per layer and statistic (source, fitted, |diff|,
    tolerance, ok; the LRU curve at its worst cache size)."""
    T, L, K = d["shape"]
    lines = [f"fit of the recency generator to {d.get('trace', 'the trace')}: {T} tokens x {L} layers x top-{K} "
             f"over {d['experts']} experts, {d['segments']} segment(s), seed {d['seed']} ({d['seconds']} s)", "",
             f"  {'statistic':<15} {'worst |diff|':>12} {'layer':>6} {'tol':>6} {'missed':>8}"]
    for r in summary(d):
        lines.append(f"  {r['statistic']:<15} {r['worst_diff']:>12.4f} {r['worst_layer']:>6} {r['tolerance']:>6.2f} "
                     f"{r['missed']:>4}/{r['layers']:<3}")
    lines += ["", f"  {'layer':>5} {'statistic':<15} {'size':>5} {'source':>8} {'fitted':>8} {'|diff|':>7} "
                  f"{'tol':>6}  ok"]
    for c in d["checks"]:
        lines.append(f"  {c['layer']:>5} {c['statistic']:<15} {c.get('size', ''):>5} {c['source']:>8.4f} "
                     f"{c['fitted']:>8.4f} {c['diff']:>7.4f} {c['tolerance']:>6.2f}  {'yes' if c['ok'] else 'NO'}")
    lines.append("")
    missed = [r for r in summary(d) if r["missed"]]
    lines.append("fit within tolerance at every layer" if d["ok"] else "fit OUTSIDE tolerance: " + ", ".join(
        f"{r['statistic']} at {r['missed']} layer(s)" for r in missed))
    return "\n".join(lines)
