"""Routers: hidden states in, each row's picks (expert ids of the layer) and routing weights out.

Contract
--------
Both routers answer ``route(layer, x, rows) -> (picks, weights)``: ``picks`` and ``weights`` are lists (one per row
of ``x``) of ``topk`` expert ids and float weights, in the order the combine sums them.

- ``StoreRouter(store)``: the model's router, from the router weights in the store (``Store.router``): logits
  ``x @ W[layer].T``, scored by softmax or sigmoid as the store's router record says, the ``topk`` highest scores
  picked (ties: the lower expert id), their scores renormalised to sum 1 when the record says so. Backends route
  with it. ``rows`` is ignored.
- ``TraceRouter(trace, streams, topk)``: replays a routing trace - the picks of each row's (stream, token) in
  ``rows``, with the trace's weights (uniform 1/topk where the trace has none). ``x`` is ignored. The trace-driven
  runtime uses it, which keeps its plans identical to the simulator's.
"""
from __future__ import annotations

import numpy as np


def topk_scores(logits: np.ndarray, k: int, scoring: str = "softmax", renormalize: bool = True):
    """(ids [rows, k] int64, weights [rows, k] float32) of the k best experts per row of ``logits`` [rows, E]."""
    z = np.asarray(logits, dtype=np.float64)
    if scoring == "softmax":
        e = np.exp(z - z.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)
    elif scoring == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-z))
    else:
        raise ValueError(f"router scoring: expected 'softmax' or 'sigmoid', got {scoring!r}")
    ids = np.argsort(-s, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(s, ids, axis=1)
    if renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return ids.astype(np.int64), w.astype(np.float32)


class StoreRouter:
    def __init__(self, store, topk: int | None = None):
        self.store, self._topk, self._rec = store, topk, None

    def _record(self) -> dict:
        """The store's router record, read at the first route (a store without one can still serve compute)."""
        if self._rec is None:
            rec = self.store.router_record()
            k = int(self._topk or rec.get("topk") or 0)
            if k < 1:
                raise ValueError(f"store {self.store.path}: the router record names no topk; give StoreRouter(topk=)")
            self._rec = {**rec, "topk": k}
        return self._rec

    def route(self, layer: int, x, rows=None):
        rec = self._record()
        logits = np.asarray(x, dtype=np.float32) @ self.store.router(layer).T
        ids, weights = topk_scores(logits, rec["topk"], rec["scoring"], rec["renormalize"])
        return ids.tolist(), weights.tolist()


class TraceRouter:
    def __init__(self, trace, streams, topk: int):
        self.trace, self.streams, self.topk = trace, streams, int(topk)

    def route(self, layer: int, x=None, rows=()):
        tr, K = self.trace, self.topk
        picks = self.streams.local_rows(rows, layer)
        if tr.weights is None:
            return picks, [[1.0 / K] * K for _ in rows]
        return picks, [tr.weights[int(tr.segments[i % tr.nseg]) + t, layer, :K].tolist() for i, t in rows]
