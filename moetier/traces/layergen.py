"""The per-layer recency generator: synthetic traces whose temporal structure is fitted layer by layer.

Contract
--------
``LayerParams`` (JSON: ``{"model": "recency", "layers": [{"depth_p", "choice", "popularity", "affinity",
"successors", "successor_counts"}, ...]}``, one entry per MoE layer) and ``generate_layers(params, experts=,
topk=, tokens=, segments=, seed=)`` -> a ``Trace`` whose ids are deterministic for a seed and hold ``topk`` DISTINCT
experts per token and layer, slot 0 the router's first choice; ``meta["source"] = "moetier.tracegen.recency"``.

The model is the LRU stack model (Mattson et al., 1970) per layer and routing slot, with the layer's own popularity
and a layer-to-layer transition. Each layer keeps its experts in recency order (0 = the most recently picked); the
picks of a token are made slot by slot, each moved to the top at once, so the token's earlier picks sit on top.

* ``depth_p[k]``: the probabilities of stack depth 0 .. D-1 and, last, of "deeper" (D = len - 1; D = 3 x top-k
  from a fit), spent as exact counts (largest remainder) over the trace: a trace of n tokens holds
  n x depth_p[k][d] picks of depth d in slot k, rounded, whichever experts they land on. An LRU cache of s <= D
  slots per layer hits exactly the picks of depth < s, so the per-layer LRU curve from 1 to D slots is the
  cumulative sum of these probabilities, and the top-1 repeat (slot 0 repeating the previous token's slot 0, which
  sits at depth topk - 1) is ``depth_p[0][topk - 1]``, both to within 1 / n.
* ``popularity``: the layer's selection weights (E numbers >= 0, any scale), spent as a budget of tokens x topk
  picks. Each pick is one draw over the depths that have budget left, depth d weighted by its budget times the pace
  factor (left / due) ** PACE of the expert there (left: what is left of its share; due: its share of the picks
  still to make) times its choice factor (below); a "deeper" pick is then drawn among the experts below D in
  proportion to what is left of theirs. An expert behind its share is re-picked sooner, one ahead of it later, so
  each layer's selection counts end at its popularity while the depth law holds exactly.
* ``choice[k][d]``: the share of slot k's picks at depth d (D: deeper) that are choices, made by popularity and
  transition, rather than recency alone (a repeat takes whoever sits there): depth d's weight has the choice
  factor (1 - c) + c x rel x tilt, rel the popularity of the expert there over the mean popularity found at that
  (slot, depth) so far in the walk (the deeper class: its experts together). With c = 1 a pick is the independent
  reference model's, popular experts taken in proportion to their popularity wherever they sit; with c = 0 the
  depth alone decides. Without it (c = 0 everywhere) a popular expert is held to its share only through the pace
  factor, which lags: the counts come out flatter than the source's and the shallow depths' budgets are spent
  early and run out late. ``choice_share`` reads it off a source: at each (slot, depth), the popularity of the
  picked expert over the mean popularity there is 1 + c x (m2 / m^2 - 1) under the choice factor (m, m2: the first
  two moments of the popularity found there), solved for c and clipped to [0, 1].
* ``successors`` / ``successor_counts``: per expert a of the previous layer, the experts b picked with it and how
  often (the source's co-occurrence counts, the 2 x top-k largest), read as P(b | a). The weight of every
  candidate expert b (at its depth, or below D) is multiplied by its tilt 1 + ``affinity`` x (lift - 1), clipped
  at 0 (within the choice factor), with lift = mean over the token's previous-layer picks a of P(b | a), divided
  by the mean of that over the previous layer's popularity: an expert's tilt is 1 on average, so the transition sets
  which tokens pick an expert (the next-layer predictability; ``affinity`` 0 .. 16 scales it) and leaves its share
  to the pace factor. At the
  first layer a and b are two picks of the same token and slot k is tilted by the token's earlier slots: that
  keeps a token's first-layer picks as coherent as the source's, without which the second layer's predictability
  falls short whatever its affinity (the successors of unrelated picks disagree). Empty lists: no tilt.

Each layer's stack starts full (every expert in a popularity-weighted random order), so a depth always exists.
Segments only bound requests (``Trace.segments``); the stacks run on over them, as the LRU curve that ``trace
stats`` reports does. The walk over (token, layer, slot) is one compiled loop (moetier.core.jit), fed with
random numbers drawn up front from ``numpy.random.default_rng(seed)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from moetier.core.jit import kernel

from moetier.errors import UserError
from moetier.traces.format import Trace, ids_dtype
from moetier.traces.stats import selection_counts

__all__ = ["LayerParams", "generate_layers", "walk", "MODEL", "exact_counts", "transition", "choice_share"]

MODEL = "recency"
_FIELDS = {"depth_p", "choice", "popularity", "affinity", "successors", "successor_counts"}
_WHERE = "generator params (recency model)"
AFFINITY_MAX = 16.0
PACE = 4.0         # the pace factor's power: how hard an expert is held to its popularity share


@dataclass(frozen=True)
class LayerParams:
    depth_p: tuple           # per layer: per slot: D + 1 probabilities
    choice: tuple            # per layer: per slot: D + 1 shares in [0, 1]
    popularity: tuple        # per layer: E selection weights
    affinity: tuple          # per layer
    successors: tuple        # per layer: per expert of the previous layer (the first layer: of the same): expert ids
    successor_counts: tuple  # the same shape: how often each follows

    @property
    def layers(self) -> int:
        return len(self.depth_p)

    @property
    def depth(self) -> int:
        return len(self.depth_p[0][0]) - 1

    @property
    def experts(self) -> int:
        return len(self.popularity[0])

    def arrays(self) -> dict:
        """The parameters as arrays: ``depth_p`` and ``choice`` [L, K, D + 1], ``popularity`` [L, E], ``affinity`` [L],
        ``successors`` and ``successor_counts`` [L, E, W] (W the longest list; shorter ones padded with count 0)."""
        L, E = self.layers, self.experts
        W = max([1] + [len(r) for s in self.successors for r in s])
        succ = np.zeros((L, E, W), dtype=np.int64)
        cnt = np.zeros((L, E, W))
        for l in range(L):
            for a, (s, c) in enumerate(zip(self.successors[l], self.successor_counts[l])):
                succ[l, a, :len(s)], cnt[l, a, :len(c)] = s, c
        return {"depth_p": np.asarray(self.depth_p, dtype=np.float64),
                "choice": np.asarray(self.choice, dtype=np.float64), "affinity": np.asarray(self.affinity, float),
                "popularity": np.asarray(self.popularity, dtype=np.float64), "successors": succ,
                "successor_counts": cnt}

    @classmethod
    def from_arrays(cls, a: dict) -> "LayerParams":
        """The inverse of ``arrays`` (successors with count 0 left out)."""
        L = len(a["affinity"])
        succ, cnt = np.asarray(a["successors"]), np.asarray(a["successor_counts"])
        keep = [[cnt[l, e] > 0 for e in range(cnt.shape[1])] for l in range(L)]
        return cls(depth_p=tuple(tuple(tuple(float(x) for x in row) for row in q) for q in a["depth_p"]),
                   choice=tuple(tuple(tuple(float(x) for x in row) for row in q) for q in a["choice"]),
                   popularity=tuple(tuple(float(x) for x in r) for r in a["popularity"]),
                   affinity=tuple(float(x) for x in a["affinity"]),
                   successors=tuple(tuple(tuple(int(x) for x in succ[l, e][m]) for e, m in enumerate(keep[l]))
                                    for l in range(L)),
                   successor_counts=tuple(tuple(tuple(float(x) for x in cnt[l, e][m]) for e, m in enumerate(keep[l]))
                                          for l in range(L)))

    def to_json(self) -> dict:
        return {"model": MODEL, "layers": [
            {"depth_p": [[round(float(x), 6) for x in row] for row in q],
             "choice": [[round(float(x), 4) for x in row] for row in ch],
             "popularity": [_num(x) for x in pop], "affinity": round(float(a), 4),
             "successors": [[int(x) for x in r] for r in s], "successor_counts": [[_num(x) for x in r] for r in c]}
            for q, ch, pop, a, s, c in zip(self.depth_p, self.choice, self.popularity, self.affinity,
                                           self.successors, self.successor_counts)]}

    @classmethod
    def from_json(cls, d: dict) -> "LayerParams":
        if not isinstance(d, dict) or d.get("model") != MODEL:
            raise UserError(f"{_WHERE}: expected a JSON object with \"model\": \"{MODEL}\"")
        unknown = set(d) - {"model", "layers"}
        if unknown:
            raise UserError(f"{_WHERE}: unknown field(s) {sorted(unknown)}; expected model, layers")
        rows = d.get("layers")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise UserError(f"{_WHERE}: 'layers' must be a non-empty list of objects (one per MoE layer)")
        for i, r in enumerate(rows):
            if set(r) != _FIELDS:
                raise UserError(f"{_WHERE}: layers[{i}] has fields {sorted(r)}; expected {', '.join(sorted(_FIELDS))}")
            if not isinstance(r["popularity"], list):
                raise UserError(f"{_WHERE}: layers[{i}].popularity must be a list of numbers (one per expert)")
            for f in ("depth_p", "choice", "successors", "successor_counts"):
                if not (isinstance(r[f], list) and all(isinstance(x, list) for x in r[f])):
                    raise UserError(f"{_WHERE}: layers[{i}].{f} must be a list of lists")
        p = cls(depth_p=tuple(tuple(tuple(x) for x in r["depth_p"]) for r in rows),
                choice=tuple(tuple(tuple(x) for x in r["choice"]) for r in rows),
                popularity=tuple(tuple(r["popularity"]) for r in rows), affinity=tuple(r["affinity"] for r in rows),
                successors=tuple(tuple(tuple(x) for x in r["successors"]) for r in rows),
                successor_counts=tuple(tuple(tuple(x) for x in r["successor_counts"]) for r in rows))
        p.check()
        return p

    def check(self, experts: int | None = None, topk: int | None = None) -> None:
        E = self.experts
        if experts is not None and E != experts:
            raise UserError(f"{_WHERE}: popularity over {E} experts; the model has {experts}")
        for i in range(self.layers):
            _check_layer(i, self, E, topk)
        D = self.depth
        if any(len(q[0]) != D + 1 for q in self.depth_p):
            raise UserError(f"{_WHERE}: every layer's depth_p rows must have the same length ({D + 1})")
        if not len(self.depth_p[0]) <= D < E:
            raise UserError(f"{_WHERE}: depth {D} must be at least top-k ({len(self.depth_p[0])}) and below the "
                            f"expert count {E}")


def _num(x):
    x = float(x)
    return int(x) if x.is_integer() else round(x, 6)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _check_layer(i: int, p: LayerParams, E: int, topk: int | None) -> None:
    where = f"{_WHERE}: layers[{i}]"
    a, pop = p.affinity[i], p.popularity[i]
    if not (_is_num(a) and a <= AFFINITY_MAX):
        raise UserError(f"{where}.affinity={a!r}, expected a number in [0, {AFFINITY_MAX:g}]")
    if len(pop) != E or not all(_is_num(x) for x in pop) or not sum(pop) > 0:
        raise UserError(f"{where}.popularity must be {E} numbers >= 0 (one per expert), not all 0")
    _check_successors(where, i, p.successors[i], p.successor_counts[i], E)
    _check_depths(where, p.depth_p[i], topk)
    q, ch = p.depth_p[i], p.choice[i]
    if len(ch) != len(q) or not all(len(row) == len(q[0]) and all(_is_num(x) and x <= 1 for x in row) for row in ch):
        raise UserError(f"{where}.choice must be {len(q)} rows of {len(q[0])} numbers in [0, 1] (one row per "
                        f"routing slot, as depth_p)")


def _check_successors(where: str, i: int, s, c, E: int) -> None:
    if (s or c or i) and not (len(s) == len(c) == E and all(len(a) == len(b) for a, b in zip(s, c))):
        raise UserError(f"{where}.successors and successor_counts must be {E} lists (one per expert of the "
                        f"previous layer{'; or both empty' if i == 0 else ''}) of the same lengths")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < E for r in s for x in r):
        raise UserError(f"{where}.successors: expected expert ids in 0..{E - 1}")
    if not all(_is_num(x) for r in c for x in r):
        raise UserError(f"{where}.successor_counts: expected numbers >= 0")


def _check_depths(where: str, q, topk: int | None) -> None:
    if not q or (topk is not None and len(q) != topk):
        raise UserError(f"{where}.depth_p has {len(q)} rows; expected one per routing slot "
                        f"({topk if topk is not None else 'top-k'})")
    for k, row in enumerate(q):
        if not (len(row) == len(q[0]) and all(_is_num(x) for x in row) and abs(sum(row) - 1) <= 1e-3):
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


def transition(ids: np.ndarray, experts: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and expert a of the previous layer: the ``width`` experts b most often picked at the layer in a
    token that picked a at the previous one, and those counts (co-occurrence over every pair of the two layers'
    picks); at the first layer, a and b are two picks of the same token there: ``(successors [L, E, width] int64,
    counts [L, E, width] int64)``."""
    ids = np.asarray(ids, dtype=np.int64)
    T, L, K = ids.shape
    E, W = int(experts), min(int(width), int(experts))
    succ = np.zeros((L, E, W), dtype=np.int64)
    cnt = np.zeros((L, E, W), dtype=np.int64)
    for l in range(L):
        pairs = ids[:, max(l - 1, 0), :, None] * E + ids[:, l, None, :]
        if l == 0:
            pairs = pairs[:, ~np.eye(K, dtype=bool)]
        C = np.bincount(pairs.ravel(), minlength=E * E).reshape(E, E)
        top = np.argsort(-C, axis=1, kind="stable")[:, :W]
        succ[l], cnt[l] = top, np.take_along_axis(C, top, 1)
    return succ, cnt


def choice_share(ids: np.ndarray, experts: int, depth: int) -> np.ndarray:
    """Per layer, slot and depth 0 .. ``depth`` (the last: deeper) of a source: the share of its picks there that
    are choices rather than recency alone (module docstring: ``choice``), [L, K, depth + 1] in [0, 1]; 0 where the
    source has no pick or the popularity found there does not vary. The popularity is the layer's selection counts;
    each layer's stack starts in popularity order."""
    ids = np.asarray(ids, dtype=np.int64)
    T, L, K = ids.shape
    E, D = int(experts), int(depth)
    counts = selection_counts(ids, E).astype(np.float64)
    pop = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    found, found2, picked, n = np.zeros((4, L, K, D + 1))
    _found_at_depths(ids, pop, D, found, found2, picked, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        m, m2 = found / T, found2 / T
        lift = picked / n / m                           # the picked expert's popularity over the mean found there
        c = (lift - 1.0) / (m2 / (m * m) - 1.0)
    ok = (n > 0) & (m > 0) & (m2 > m * m * (1 + 1e-9))
    return np.where(ok, np.clip(np.nan_to_num(c), 0.0, 1.0), 0.0)


@kernel
def _found_at_depths(ids, pop, D, found, found2, picked, n):
    """Walk each layer's LRU stack over the source: per (layer, slot, depth), the sum of the popularity found there
    (and of its square) at every pick, and of the picked expert's at the depth picked, and the picks there."""
    T, L, K = ids.shape
    E = pop.shape[1]
    for l in range(L):
        stack = np.argsort(-pop[l], kind="mergesort")
        pos = np.argsort(stack)
        for t in range(T):
            for k in range(K):
                deep = 0.0
                for i in range(D, E):
                    deep += pop[l, stack[i]]
                for d in range(k, D + 1):
                    p = pop[l, stack[d]] if d < D else deep
                    found[l, k, d] += p
                    found2[l, k, d] += p * p
                e = ids[t, l, k]
                d = min(pos[e], D)
                picked[l, k, d] += pop[l, e] if d < D else deep
                n[l, k, d] += 1.0
                _to_top(stack, pos, e)


@kernel
def _to_top(stack, pos, e):
    """Move expert ``e`` to the top of a recency ``stack`` (``pos``: every expert's place in it)."""
    for i in range(pos[e], 0, -1):
        stack[i] = stack[i - 1]
        pos[stack[i]] = i
    stack[0] = e
    pos[e] = 0


@kernel
def _tilt(tilt, prev, n, succ, succ_p, mean_p, aff):
    """The transition's tilt of every expert from the first ``n`` picks ``prev`` (of the previous layer, or the
    token's earlier picks at the first layer): 1 + affinity x (lift - 1), lift = P(b | those picks) over its mean
    ``mean_p`` over the previous layer's popularity, so that an expert's tilt is 1 on average (affinity <= 1)
    whatever share of it the successor lists hold: the tilt moves picks between tokens, not experts."""
    tilt[:] = 0.0
    for j in range(n):
        a = prev[j]
        for i in range(succ.shape[1]):
            tilt[succ[a, i]] += succ_p[a, i] / n
    for e in range(tilt.shape[0]):
        lift = tilt[e] / mean_p[e] if mean_p[e] > 0 else 1.0
        tilt[e] = max(0.0, 1.0 + aff * (lift - 1.0))


@kernel
def _depth_weights(w, stack, urn, pop, tilt, remain, choice, found, n, k, left):
    """Each depth's weight into ``w`` (slot ``k``, ``left`` picks left to the layer): its budget left, times the
    pace factor of the expert there (how far it is behind its popularity share, to the power PACE) and its choice
    factor (1 - c) + c x rel x tilt (module docstring: ``choice``); the deeper class by its experts together.
    ``found`` sums the popularity found at each depth over the slot's ``n`` picks so far, this one included.
    Returns their sum."""
    D = remain.shape[0] - 1
    deep_urn, deep_w, deep_pop = 0.0, 0.0, 0.0
    for i in range(D, stack.shape[0]):
        e = stack[i]
        u = max(urn[e], 0.0)
        deep_urn += u
        deep_w += u * tilt[e]
        deep_pop += pop[e]
    total = 0.0
    for d in range(k, D + 1):
        p = pop[stack[d]] if d < D else deep_pop
        found[d] += p
        rel = p * n / found[d] if found[d] > 0 else 1.0
        if d < D:
            e = stack[d]
            r = max(urn[e], 0.0) / (pop[e] * left) if pop[e] > 0 else 0.0
            t = tilt[e]
        elif deep_urn > 0:
            r = deep_urn / (deep_pop * left)
            t = deep_w / deep_urn
        else:
            w[d] = 0.0
            continue
        w[d] = remain[d] * r ** PACE * (1.0 - choice[d] + choice[d] * rel * t)
        total += w[d]
    return total


@kernel
def _walk(stack, pos, remain, urn, pop, choice, aff, succ, succ_p, mean_p, udepth, ufresh, ids):
    """The picks of every (token, layer, slot) in order (module docstring); ``stack``/``pos`` (each layer's recency
    order and every expert's place in it), ``remain`` (depth budgets) and ``urn`` (popularity left) are updated in
    place; ``ids`` [T, L, K] is filled. ``succ_p`` holds P(b | a) for the successors ``succ``, ``mean_p`` its
    mean over the previous layer's popularity."""
    T, L, K = ids.shape
    E = stack.shape[1]
    D = remain.shape[2] - 1
    w = np.zeros(D + 1)
    tilt = np.ones(E)
    found = np.zeros((L, K, D + 1))
    for t in range(T):
        for l in range(L):
            if l > 0 and aff[l] > 0:
                _tilt(tilt, ids[t, l - 1], K, succ[l], succ_p[l], mean_p[l], aff[l])
            else:
                tilt[:] = 1.0
            for k in range(K):
                if l == 0 and aff[0] > 0 and k > 0:
                    _tilt(tilt, ids[t, 0], k, succ[0], succ_p[0], mean_p[0], aff[0])
                left = (T - t) * K - k          # picks left to the layer
                total = _depth_weights(w, stack[l], urn[l], pop[l], tilt, remain[l, k], choice[l, k], found[l, k],
                                       t + 1, k, left)
                if total <= 0:                  # every expert there past its share: the budget alone
                    for d in range(k, D + 1):
                        w[d] = remain[l, k, d]
                        total += w[d]
                x = udepth[t, l, k] * total
                dep, acc = k, w[k]
                while dep < D and acc <= x:
                    dep += 1
                    acc += w[dep]
                if dep < D:
                    pick = stack[l, dep]
                else:
                    pick = _fresh(stack[l], urn[l], pop[l], tilt, D, ufresh[t, l, k])
                remain[l, k, dep] -= 1
                urn[l, pick] -= 1.0
                ids[t, l, k] = pick
                _to_top(stack[l], pos[l], pick)


@kernel
def _fresh(stack, urn, pop, tilt, D, u):
    """An expert deeper than D in the stack, drawn in proportion to its popularity left times its tilt (to its
    popularity when none there has any left)."""
    E = stack.shape[0]
    total = 0.0
    for i in range(D, E):
        total += max(urn[stack[i]], 0.0) * tilt[stack[i]]
    use_urn = total > 0
    if not use_urn:
        for i in range(D, E):
            total += pop[stack[i]]
    x = u * total
    acc = 0.0
    for i in range(D, E):
        e = stack[i]
        acc += max(urn[e], 0.0) * tilt[e] if use_urn else pop[e]
        if acc > x:
            return e
    return stack[E - 1]


def walk(arrays: dict, tokens: int, topk: int, seed: int) -> np.ndarray:
    """ids [tokens, layers, topk] (int64) from the model's arrays (``LayerParams.arrays``), checked already."""
    T, K = int(tokens), int(topk)
    rng = np.random.default_rng(seed)
    pop = np.asarray(arrays["popularity"], dtype=np.float64)
    pop = pop / pop.sum(axis=1, keepdims=True)
    L, E = pop.shape
    urn = pop * (T * K)
    # the stacks start in a popularity-weighted random order (exponential race), MRU first
    stack = np.argsort(-(pop + 1e-12) / rng.standard_exponential((L, E)), axis=1).astype(np.int64)
    pos = np.argsort(stack, axis=1).astype(np.int64)
    remain = exact_counts(arrays["depth_p"], T)                                       # [L, K, D + 1]
    cnt = np.asarray(arrays["successor_counts"], dtype=np.float64)
    succ_p = cnt / np.maximum(cnt.sum(axis=2, keepdims=True), 1e-300)
    succ = np.asarray(arrays["successors"], dtype=np.int64)
    mean_p = np.zeros((L, E))
    for l in range(L):
        np.add.at(mean_p[l], succ[l].ravel(), (pop[max(l - 1, 0)][:, None] * succ_p[l]).ravel())
    udepth, ufresh = rng.random((T, L, K)), rng.random((T, L, K))
    ids = np.zeros((T, L, K), dtype=np.int64)
    _walk(stack, pos, remain, urn, pop, np.asarray(arrays["choice"], dtype=np.float64),
          np.asarray(arrays["affinity"], dtype=np.float64),
          succ, succ_p, mean_p, udepth, ufresh, ids)
    return ids


def generate_layers(params: LayerParams, *, experts: int, topk: int, tokens: int, segments=1, seed: int = 0,
                    model_id: str | None = None) -> Trace:
    """A trace [tokens, layers, topk] from the per-layer recency model (module docstring)."""
    from moetier.traces.gen import _check_memory, _segments
    if isinstance(params, dict):
        params = LayerParams.from_json(params)
    for name, v in (("experts", experts), ("topk", topk), ("tokens", tokens)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise UserError(f"generate: {name}={v!r}, expected a positive integer")
    L, E, K, T = params.layers, int(experts), int(topk), int(tokens)
    params.check(E, K)
    _check_memory(T, L, K)
    seg = _segments(segments, T)
    ids = walk(params.arrays(), T, K, seed)
    meta = {"source": "moetier.tracegen.recency", "model": MODEL, "seed": int(seed), "layers": L,
            "experts": E, "topk": K}
    if model_id is not None:
        meta["model_id"] = model_id
    return Trace(ids=ids.astype(ids_dtype(E)), segments=seg, weights=None, meta=meta)
