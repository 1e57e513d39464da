"""Prefetch predictors: which experts will the layer ``depth`` ahead pick?

Contract
--------
A predictor ranks candidate experts of layer ``layer + depth`` from what is known when layer ``layer`` runs:

    predict(layer, rows, future) -> ranked list of LOCAL expert ids of the target layer
    observe(layer, rows, target_rows)  - called once the target layer's true picks are known (learning)

``rows`` = this step's per-row local expert ids at ``layer`` (a list of lists). ``future`` holds the target layer's
TRUE picks and is only for what-if predictors (``uses_future = True``); a real predictor must ignore it. The
executor filters the ranking to keys that need an NVMe read and caps it at the prefetch budget.

- ``recall``: the reference's what-if: a deterministic hash selects a fraction ``recall`` of the true picks. No false
  positives, so it bounds what a predictor of that recall can give.
- ``transition``: a real, past-only predictor: online counts of (expert at layer l -> expert at layer l+depth) for
  the same token, plus the target layer's popularity as a tie-breaker.
"""
from __future__ import annotations

import numpy as np


class RecallOracle:
    name = "recall"
    uses_future = True

    def __init__(self, recall: float, experts: int, depth: int = 1):
        self.depth = depth
        self.threshold = int(round(recall * 1000))
        self.experts = experts
        self.salt = 0

    def predict(self, layer, rows, future):
        if future is None:
            return []
        th, salt, base = self.threshold, self.salt, (layer + self.depth) * self.experts
        # the hash uses the global key, like the reference's what-if
        return [e for e in future if ((base + e) * 2654435761 + salt) % 1000 < th]

    def observe(self, layer, rows, target_rows):
        pass


class TransitionPredictor:
    name = "transition"
    uses_future = False

    def __init__(self, layers: int, experts: int, depth: int = 1):
        self.depth = depth
        self.counts = np.zeros((max(layers - depth, 1), experts, experts), dtype=np.float32)
        self.pop = np.zeros((layers, experts), dtype=np.float32)

    def predict(self, layer, rows, future=None):
        c = self.counts[layer]
        score = self.pop[layer + self.depth] * 1e-3
        for r in rows:
            score = score + c[r].sum(axis=0)
        return np.argsort(-score, kind="stable").tolist()

    def observe(self, layer, rows, target_rows):
        c = self.counts[layer]
        for a, b in zip(rows, target_rows):
            c[np.ix_(a, b)] += 1.0
        for b in target_rows:
            self.pop[layer + self.depth][b] += 1.0


def make_predictor(policy: dict, layers: int, experts: int):
    """Build the predictor the recipe's policy.prefetch asks for, or None when prefetch is off."""
    pf = policy.get("prefetch") or {}
    depth = int(pf.get("depth") or 0)
    kind = pf.get("predictor", "recall")
    if depth <= 0 or kind in (None, "none"):
        return None
    if kind == "recall":
        recall = float(pf.get("recall") or 0.0)
        return RecallOracle(recall, experts, depth) if recall > 0 else None
    if kind == "transition":
        return TransitionPredictor(layers, experts, depth)
    raise ValueError(f"policy.prefetch.predictor: expected 'recall', 'transition' or 'none', got {kind!r}")
