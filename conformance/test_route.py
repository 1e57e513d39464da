"""Route: ``route(layer, x)`` against a float64 router of the store's own router record (weights, scoring,
renormalisation, top-k): each row's picks are the top-k experts and its weights their scores.

Rows whose k-th and (k+1)-th float64 scores lie closer than ``TIE`` are not judged on the pick set (float32 logits
may order them either way); at least half the rows must be clear of ties, or the check says so. A backend whose
route() raises BackendUnavailable (an engine adapter: the engine routes) skips as NOT_SUPPORTED with its reason.
"""
from __future__ import annotations

import numpy as np
import pytest

from conformance.conftest import EXPERTS, LAYERS, first_kit
from moetier.run.contract import BackendUnavailable

ROWS = 64
TIE = 1e-4            # relative score gap below which two experts' order is float32's to pick
WEIGHT_TOL = 1e-5     # float32 softmax / sigmoid of float32 logits vs float64


def reference_route(store, layer: int, x: np.ndarray):
    """(top-k ids [rows, k] by float64 score, all scores [rows, E] as the record scores them, renormalised top-k
    weights or raw ones as the record says, the k-th to (k+1)-th score gap)."""
    rec = store.router_record()
    k = int(rec["topk"])
    z = x.astype(np.float64) @ np.asarray(store.router(layer), np.float64).T
    if rec["scoring"] == "softmax":
        s = np.exp(z - z.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
    else:
        s = 1.0 / (1.0 + np.exp(-z))
    order = np.argsort(-s, axis=1, kind="stable")
    ids = order[:, :k]
    w = np.take_along_axis(s, ids, axis=1)
    if rec["renormalize"]:
        w = w / w.sum(axis=1, keepdims=True)
    srt = np.take_along_axis(s, order, axis=1)
    gap = (srt[:, k - 1] - srt[:, k]) / srt[:, k - 1] if k < s.shape[1] else np.ones(len(s))
    return ids, s, w, gap, rec


@pytest.mark.parametrize("layer", range(LAYERS))
def test_route_top_k_of_the_store_router(kits, layer):
    """Every row: exactly k distinct expert ids of the layer, the k best by score, and weights equal to their
    scores (renormalised to sum 1 where the router record says so)."""
    kit = first_kit(kits)
    x = kit.xrows(ROWS, seed=20 + layer)
    try:
        picks, weights = kit.be.route(layer, x)
    except BackendUnavailable as e:          # an engine adapter whose engine routes refuses route(), and says why
        pytest.skip(f"NOT_SUPPORTED: {e}")
    ids, _, want_w, gap, rec = reference_route(kit.store, layer, x)
    k, experts = ids.shape[1], EXPERTS
    assert len(picks) == ROWS and len(weights) == ROWS, f"route returned {len(picks)} rows of picks for {ROWS}"
    judged = 0
    for r in range(ROWS):
        p, w = [int(e) for e in picks[r]], np.asarray(weights[r], np.float64)
        assert len(p) == k and len(w) == k, f"layer {layer} row {r}: {len(p)} picks, {len(w)} weights; topk is {k}"
        assert len(set(p)) == k and all(0 <= e < experts for e in p), f"layer {layer} row {r}: picks {p}"
        if rec["renormalize"]:
            assert abs(w.sum() - 1) < WEIGHT_TOL, f"layer {layer} row {r}: weights sum {w.sum():.7f}, not 1"
        if gap[r] < TIE:
            continue
        judged += 1
        assert sorted(p) == sorted(ids[r].tolist()), \
            f"layer {layer} row {r}: picks {sorted(p)} are not the top-{k} {sorted(ids[r].tolist())}"
        by_id = dict(zip(ids[r].tolist(), want_w[r]))
        off = max(abs(wi - by_id[e]) for e, wi in zip(p, w))
        assert off < WEIGHT_TOL, f"layer {layer} row {r}: a weight is off its score by {off:.3g}"
    assert judged >= ROWS // 2, f"only {judged} of {ROWS} rows clear of a near-tie: the check judged too little"
