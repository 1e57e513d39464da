"""The per-layer recency generator: synthetic traces whose temporal structure is fitted layer by layer.

Contract
--------
``LayerParams`` (JSON: ``{"model": "recency", "affinity_width": W, "layers": [{"zipf_s", "affinity", "depth_p"},
...]}``, one entry per MoE layer) and ``generate_layers(params, experts=, topk=, tokens=, segments=, seed=)`` -> a
``Trace`` whose ids are deterministic for a seed and hold ``topk`` DISTINCT experts per token and layer, slot 0 the
router's first choice; ``meta["source"] = "moetier.tracegen.recency"``.

The model is the LRU stack model (Mattson et al., 1970) per layer and routing slot: each layer keeps its experts in
recency order (0 = the most recently picked), and the pick in slot k of a token is drawn by its stack depth:

* ``depth_p[k]``: the probabilities of depth 0 .. D-1 and, last, of "deeper" (D = len - 1; D = 3 x top-k from a fit).
  A depth d < D picks the expert at that depth of the stack as it stands at slot k (the token's earlier picks on
  top, so d >= k). An LRU cache of s <= D slots per layer hits exactly the picks of depth < s, so the per-layer LRU
  curve from 1 to D slots is the cumulative sum of these probabilities, and the top-1 repeat (slot 0 repeating the
  previous token's slot 0, which sits at depth topk - 1) is ``depth_p[0][topk - 1]``. The depths of each (layer,
  slot) are drawn as exact counts (largest remainder) in a random order, so a trace of n tokens holds
  n x depth_p[k][d] of each, rounded, and its curve matches the parameters to within 1 / n.
* cross-layer affinity: with probability ``affinity`` (layers after the first) the pick is one of the
  ``affinity_width`` successors of the previous layer's slot-k pick, if the depth the successor has now still has
  budget (so the recency law above holds exactly) and it is not picked already. Successors are W random
  near-rank-preserving maps from the previous layer's popularity ranking to this layer's (a rank-r expert leads to
  experts of rank about r, every expert is a successor W times), so following them keeps the layer's popularity
  law: affinity moves the next-layer predictability and leaves the entropy to ``zipf_s``.
* otherwise the depth is drawn from what is left of the budget; a "deeper" pick is a draw from the layer's
  popularity (a random ranking with Zipf weights rank^-``zipf_s``) among the experts deeper than D.

Each layer's stack starts full (every expert in a popularity-weighted random order), so a depth always exists. The
(token, layer) dependency (depth needs the layer's earlier tokens, affinity the previous layer of the same token)
is resolved by sweeping anti-diagonals t + l = const, vectorised over layers. Segments only bound requests
(``Trace.segments``); the stacks run on over them, as the LRU curve that ``trace stats`` reports does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moetier.errors import UserError
from moetier.traces.format import Trace, ids_dtype

__all__ = ["LayerParams", "generate_layers", "MODEL", "exact_counts"]

MODEL = "recency"
SUCCESSOR_SPREAD = 2.0      # ranks: how far a successor's popularity rank strays from its parent's


@dataclass(frozen=True)
class LayerParams:
    zipf_s: tuple            # per layer
    affinity: tuple          # per layer (the first layer's is unused)
    depth_p: tuple           # per layer: per slot: D + 1 probabilities
    affinity_width: int = 4

    @property
    def layers(self) -> int:
        return len(self.zipf_s)

    @property
    def depth(self) -> int:
        return len(self.depth_p[0][0]) - 1

    def to_json(self) -> dict:
        return {"model": MODEL, "affinity_width": int(self.affinity_width), "layers": [
            {"zipf_s": round(float(s), 4), "affinity": round(float(a), 4),
             "depth_p": [[round(float(x), 6) for x in row] for row in q]}
            for s, a, q in zip(self.zipf_s, self.affinity, self.depth_p)]}

    @classmethod
    def from_json(cls, d: dict) -> "LayerParams":
        where = "generator params (recency model)"
        if not isinstance(d, dict) or d.get("model") != MODEL:
            raise UserError(f"{where}: expected a JSON object with \"model\": \"{MODEL}\"")
        unknown = set(d) - {"model", "affinity_width", "layers"}
        if unknown:
            raise UserError(f"{where}: unknown field(s) {sorted(unknown)}; expected model, affinity_width, layers")
        rows = d.get("layers")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise UserError(f"{where}: 'layers' must be a non-empty list of objects (one per MoE layer)")
        for i, r in enumerate(rows):
            if set(r) != {"zipf_s", "affinity", "depth_p"}:
                raise UserError(f"{where}: layers[{i}] has fields {sorted(r)}; expected affinity, depth_p, zipf_s")
        p = cls(zipf_s=tuple(r["zipf_s"] for r in rows), affinity=tuple(r["affinity"] for r in rows),
                depth_p=tuple(tuple(tuple(x) for x in r["depth_p"]) if isinstance(r["depth_p"], list) else ()
                              for r in rows),
                affinity_width=d.get("affinity_width", 4))
        p.check()
        return p

    def check(self, experts: int | None = None, topk: int | None = None) -> None:
        where = "generator params (recency model)"
        w = self.affinity_width
        if not (isinstance(w, (int, np.integer)) and w >= 1 and (experts is None or w <= experts)):
            raise UserError(f"{where}: affinity_width={w!r}, expected an integer in 1..{experts or 'experts'}")
        for i, (s, a, q) in enumerate(zip(self.zipf_s, self.affinity, self.depth_p)):
            _check_layer(i, s, a, q, topk)
        D = len(self.depth_p[0][0]) - 1
        if any(len(q[0]) != D + 1 for q in self.depth_p):
            raise UserError(f"{where}: every layer's depth_p rows must have the same length ({D + 1})")
        if experts is not None and not (len(self.depth_p[0]) <= D < experts):
            raise UserError(f"{where}: depth {D} must be at least top-k ({len(self.depth_p[0])}) and below the "
                            f"expert count {experts}")


def _check_layer(i: int, s, a, q, topk: int | None) -> None:
    where = f"generator params (recency model): layers[{i}]"
    if not (isinstance(s, (int, float)) and math.isfinite(s) and s >= 0):
        raise UserError(f"{where}.zipf_s={s!r}, expected a finite number >= 0")
    if not (isinstance(a, (int, float)) and 0 <= a <= 1):
        raise UserError(f"{where}.affinity={a!r}, expected a number in [0, 1]")
    if not q or (topk is not None and len(q) != topk):
        raise UserError(f"{where}.depth_p has {len(q)} rows; expected one per routing slot "
                        f"({topk if topk is not None else 'top-k'})")
    for k, row in enumerate(q):
        if not (len(row) == len(q[0]) and all(isinstance(x, (int, float)) and x >= 0 for x in row)
                and abs(sum(row) - 1) <= 1e-3):
            raise UserError(f"{where}.depth_p[{k}] must be {len(q[0])} numbers >= 0 summing to 1")
        if k and any(row[:k]):
            raise UserError(f"{where}.depth_p[{k}]: depths below {k} are impossible in slot {k} (the token's {k} "
                            f"earlier picks sit above them); expected 0 there")


def exact_counts(p: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to n, n x p rounded by largest remainder (p along the last axis)."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum(axis=-1, keepdims=True)
    raw = p * n
    c = np.floor(raw).astype(np.int64)
    short = n - c.sum(axis=-1)
    order = np.argsort(-(raw - c), axis=-1, kind="stable")
    rank = np.argsort(order, axis=-1, kind="stable")
    return c + (rank < short[..., None])


def _zipf(s: np.ndarray, E: int) -> np.ndarray:
    w = np.power(np.arange(1, E + 1, dtype=np.float64)[None, :], -np.asarray(s, dtype=np.float64)[:, None])
    return w / w.sum(axis=1, keepdims=True)


def generate_layers(params: LayerParams, *, experts: int, topk: int, tokens: int, segments=1, seed: int = 0,
                    model_id: str | None = None) -> Trace:
    """A trace [tokens, layers, topk] from the per-layer recency model (module docstring)."""
    from moetier.traces.gen import _check_memory, _segments, diagonals
    if isinstance(params, dict):
        params = LayerParams.from_json(params)
    for name, v in (("experts", experts), ("topk", topk), ("tokens", tokens)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise UserError(f"generate: {name}={v!r}, expected a positive integer")
    L, E, K, T = params.layers, int(experts), int(topk), int(tokens)
    params.check(E, K)
    _check_memory(T, L, K)
    seg = _segments(segments, T)
    D = params.depth
    rng = np.random.default_rng(seed)

    # popularity: a random ranking per layer with Zipf weights; the stacks start in a popularity-weighted order
    rank = np.argsort(rng.random((L, E)), axis=1)                                     # rank[l, r] = expert
    pop = np.empty((L, E))
    np.put_along_axis(pop, rank, _zipf(np.asarray(params.zipf_s), E), axis=1)
    start = np.argsort(-pop / rng.standard_exponential((L, E)), axis=1)                # initial stack, MRU first
    last = np.empty((L, E), dtype=np.int64)
    np.put_along_axis(last, start, -1 - np.arange(E)[None, :], axis=1)                 # older = smaller

    # depth budgets: exact counts per (layer, slot) over the trace, spent as the picks are made; D = deeper
    remain = exact_counts(np.asarray(params.depth_p, dtype=np.float64), T)             # [L, K, D + 1]

    W = int(params.affinity_width)
    aff = np.asarray(params.affinity, dtype=np.float64)
    # successors: W near-rank-preserving permutations per layer pair (the expert of popularity rank r at layer l
    # leads to experts of rank about r at layer l+1), so that following them keeps each layer's popularity law:
    # every expert is a successor W times, the popular ones of popular parents
    succ = np.zeros((max(1, L - 1), E, W), dtype=np.int64)
    r_of = np.argsort(rank, axis=1)                                                    # r_of[l, e] = rank of e
    for l in range(L - 1):
        for w in range(W):
            perm = np.argsort(np.arange(E) + SUCCESSOR_SPREAD * rng.standard_normal(E))   # rank -> rank
            succ[l, :, w] = rank[l + 1, perm[r_of[l]]]

    # fresh draws by inverse CDF over all layers at once: layer l's cumulative popularity shifted by l
    cdf = (np.cumsum(pop, axis=1) / pop.sum(axis=1, keepdims=True) + np.arange(L)[:, None]).ravel()
    cdf[np.arange(1, L + 1) * E - 1] = np.arange(1, L + 1)                               # no rounding gap at the end
    ids = np.zeros((T, L, K), dtype=np.int64)
    top_n = min(E, D + K)
    tries = 16
    for ls, ts in diagonals(T, L):
        n = len(ls)
        rows = np.arange(n)
        lst = last[ls]                                                                  # [n, E], before the token
        top = np.argpartition(-lst, top_n - 1, axis=1)[:, :top_n] if top_n < E else np.tile(np.arange(E), (n, 1))
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(lst, top, 1), axis=1), 1)   # MRU first
        lst_top = np.take_along_axis(lst, top, 1)
        taken = np.zeros((n, top_n), dtype=bool)          # entries of ``top`` picked earlier in this token
        coin = rng.random((n, K))
        which = rng.integers(0, W, size=(n, K))
        u = rng.random((n, K))
        fu = rng.random((n, K, tries)) + ls[:, None, None]
        out = np.full((n, K), -1, dtype=np.int64)
        for k in range(K):
            # the stack at slot k: the token's k picks, then the untaken entries of ``top`` in order (depth k + rank)
            free_rank = np.where(taken, top_n, np.cumsum(~taken, axis=1) - 1)
            # depth >= D: below the (D - k)-th untaken entry, and not picked in this token
            thr = lst_top[rows, np.argmax(free_rank == D - k - 1, axis=1)]
            budget = remain[ls, k]                                                      # [n, D + 1]
            # affinity: the successor of the previous layer's slot-k pick, at its depth now, if that depth's budget
            # is not spent (and it is not picked already)
            cand = succ[np.maximum(ls - 1, 0), ids[ts, np.maximum(ls - 1, 0), k], which[:, k]]   # layer 0: unused
            picked = (out == cand[:, None]).any(axis=1)
            lc = lst[rows, cand]
            cd = np.where(lc >= thr, k + ((lst_top > lc[:, None]) & ~taken).sum(axis=1), D)
            use = (ls > 0) & (coin[:, k] < aff[ls]) & ~picked & (budget[rows, cd] > 0)
            # else a depth drawn from what is left of the budget
            cum = np.cumsum(budget, axis=1)
            dep = np.where(use, cd, np.minimum((cum <= (u[:, k] * cum[:, -1])[:, None]).sum(axis=1), D))
            pick = np.where(use, cand, top[rows, np.argmax(free_rank == (dep - k)[:, None], axis=1)])
            need = np.flatnonzero(~use & (dep == D))
            if len(need):
                # the first of ``tries`` popularity draws that lies deeper than D; the exact masked draw if none does
                x = np.searchsorted(cdf, fu[need, k], side="right") - ls[need, None] * E     # [m, tries]
                ok = (lst[need[:, None], x] < thr[need, None]) & ~(x[:, :, None] == out[need, None, :]).any(-1)
                first = np.argmax(ok, axis=1)
                got = x[np.arange(len(need)), first]
                for i in np.flatnonzero(~ok.any(axis=1)):     # (no new random draws: the stream stays aligned)
                    r = need[i]
                    w = np.where(lst[r] < thr[r], pop[ls[r]], 0.0)
                    w[out[r, :k]] = 0.0
                    c = np.cumsum(w)
                    got[i] = min(E - 1, int(np.searchsorted(c, (fu[r, k, 0] - ls[r]) * c[-1], side="right")))
                pick[need] = got
            out[:, k] = pick
            remain[ls, k, dep] -= 1
            taken |= top == pick[:, None]
        ids[ts, ls] = out
        last[ls[:, None], out] = (ts * K)[:, None] + np.arange(K)[None, :]

    meta = {"source": "moetier.tracegen.recency", "params": params.to_json(), "seed": int(seed), "layers": L,
            "experts": E, "topk": K}
    if model_id is not None:
        meta["model_id"] = model_id
    return Trace(ids=ids.astype(ids_dtype(E)), segments=seg, weights=None, meta=meta)
