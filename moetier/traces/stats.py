"""Routing trace statistics (``moetier trace stats``).

Contract
--------
``stats(trace, experts, cache_sizes=None) -> dict`` (JSON-serialisable) and ``format_stats(d) -> str``.

Definitions (picks = the first topk columns; key = layer * E + expert):

* popularity, per layer: ``entropy_norm`` = H(selection counts) / log E (1 = uniform); ``max_over_mean`` = busiest
  expert's picks / mean picks per expert; ``top10_share`` = share of picks taken by the busiest ceil(10% of E)
  experts; ``slot0_*`` = the same for slot 0 only (the first choice when the trace is rank-ordered).
* ``reuse_prev_token``: fraction of picks at token t (same layer) also picked at token t-1; the first token of each
  segment is excluded. Random baseline: topk / E.
* ``reuse_distance``: for each pick, tokens since the same key was last picked in the same segment, bucketed
  <64, 64-255, 256-1023, >=1024, never (first use in its segment).
* cross-layer, per consecutive pair (l, l+1): ``nmi_next`` = mutual information of the k-th pick at l with the k-th
  pick at l+1 over tokens, minus the same with the pairing shuffled (plug-in bias), / log E (0 = independent); ``lift_top_pair`` = the largest lift
  P(a at l, b at l+1) / (P(a) P(b)) over all topk x topk pairs of a token, among pairs seen at least
  LIFT_MIN_COUNT (20) times (1 = independent).
* ``cache``: hit rates of an LRU and of Belady's OPT cache over all keys for each size (slots over the whole model),
  replaying one access stream in (token, layer, slot) order over all segments (the cache is not flushed between
  segments). OPT evicts the key used farthest in the future among the cached keys and the incoming one (next-use
  indices are precomputed with numpy; the replay is a heap loop). OPT >= LRU for every size. Sizes at or above the
  number of distinct keys are computed in closed form (every non-first access hits).

Per layer (users size caches per layer; layers are visited in a cycle, so one LRU over the whole model is not what
a per-layer cache sees):

* ``layer_cache``: LRU and Belady hit rates of a cache of ``s`` slots holding one layer's experts, replaying that
  layer's picks in (token, slot) order over all segments, for each ``s`` in ``sizes`` (default: topk x 1, 2, 3, 4
  and E/4, E/2, capped at E); per layer and the mean over layers.
* ``top1_repeat``: the share of tokens whose first pick (slot 0) repeats the previous token's first pick, same
  layer and segment (the first token of a segment excluded). Random baseline 1 / E.
* ``reuse_distance_fine``: the reuse distance histogram in tokens with buckets 1, 2, 3-4, 5-8, 9-16, 17-64,
  65-256, >256 and never (bucket 1 = the pick repeats one of the previous token's picks).
* ``next_layer``: next-layer predictability: the best recall reachable with k guesses of layer l's picks from
  layer l-1's picks of the same token, for k = topk / 2, topk, 2 topk. The guesses rank layer l's experts b by
  sum over the previous layer's picks a of P(b | a) = (C[a, b] + alpha p(b)) / (C[a] + alpha), with C the
  co-occurrence counts and p the popularity counted on the other half of the trace (2-fold cross-fitting over
  alternating blocks of FOLD_BLOCK = 256 tokens: each half scores the other, so a trace's own noise is not learnt,
  and both halves see every segment's popularity, as an online predictor does); alpha (0, 1, 10,
  100 or popularity alone) is the one with the best recall at topk, per layer. ``predictability`` = the recall at
  k = topk, mean over layers 1..L-1: the recall a transition predictor issuing topk reads a layer can reach.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np

from moetier.errors import UserError
from moetier.traces.format import Trace

__all__ = ["stats", "drop_masked", "norm_entropy", "selection_counts", "lru_hits", "belady_hits", "default_cache_sizes", "next_use",
           "REUSE_BUCKETS", "FINE_BUCKETS", "layer_cache_curves", "stack_depths", "next_layer_recall",
           "default_layer_sizes"]

REUSE_BUCKETS = ["<64", "64-255", "256-1023", ">=1024", "never"]
FINE_BUCKETS = ["1", "2", "3-4", "5-8", "9-16", "17-64", "65-256", ">256", "never"]
_FINE_EDGES = [2, 3, 5, 9, 17, 65, 257]
FOLD_BLOCK = 256
_ALPHAS = (0.0, 1.0, 10.0, 100.0, None)     # next-layer predictor smoothing toward popularity (None: popularity)
LIFT_MIN_COUNT = 20     # a pair must be seen this often to count for lift_top_pair


def default_cache_sizes(layers: int, experts: int, n: int = 6) -> list[int]:
    """Geometric ladder total/2^(n-1) .. total (total = layers * experts), deduplicated, >= 1."""
    total = layers * experts
    return sorted({max(1, int(round(total / 2 ** k))) for k in range(n)})


def next_use(seq: np.ndarray) -> np.ndarray:
    """For every access i, the index of the next access of the same key (len(seq) when never)."""
    seq = np.asarray(seq)
    n = len(seq)
    order = np.argsort(seq, kind="stable")
    s = seq[order]
    nxt = np.full(n, n, dtype=np.int64)
    same = s[1:] == s[:-1]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def lru_hits(seq, size: int) -> int:
    """Hits of an LRU cache of ``size`` slots on the access sequence."""
    if size <= 0:
        return 0
    cache: OrderedDict = OrderedDict()
    hits = 0
    move = cache.move_to_end
    pop = cache.popitem
    for k in (seq.tolist() if isinstance(seq, np.ndarray) else seq):
        if k in cache:
            hits += 1
            move(k)
        else:
            cache[k] = None
            if len(cache) > size:
                pop(last=False)
    return hits


def belady_hits(seq, size: int, nxt: np.ndarray | None = None) -> int:
    """Hits of Belady's OPT cache of ``size`` slots (evict the farthest next use among cached + incoming)."""
    if size <= 0:
        return 0
    seq = np.asarray(seq)
    if nxt is None:
        nxt = next_use(seq)
    keys = seq.tolist()
    nx = nxt.tolist()
    cur: dict = {}          # key -> its next use (valid heap entries have this value)
    heap: list = []         # (-next_use, key), lazily invalidated
    push, pop = heapq.heappush, heapq.heappop
    hits = 0
    for k, n in zip(keys, nx):
        if k in cur:
            hits += 1
            cur[k] = n
            push(heap, (-n, k))
            continue
        if len(cur) < size:
            cur[k] = n
            push(heap, (-n, k))
            continue
        # full: find the cached key with the farthest next use
        while True:
            nn, kk = heap[0]
            if cur.get(kk) == -nn:
                break
            pop(heap)
        if -nn > n:        # the incoming key is needed sooner: evict the farthest cached one
            pop(heap)
            del cur[kk]
            cur[k] = n
            push(heap, (-n, k))
        # else: the incoming key itself is the farthest: it is used once and not kept (bypass)
        if len(heap) > 4 * size + 1024:     # compact stale entries
            heap = [(-v, kk2) for kk2, v in cur.items()]
            heapq.heapify(heap)
    return hits


def selection_counts(ids: np.ndarray, experts: int) -> np.ndarray:
    """How often each expert was picked, per layer: [L, experts] (int64) over ids [tokens, layers, top-k]."""
    L = ids.shape[1]
    return np.bincount((np.arange(L)[None, :, None] * experts + ids).ravel(), minlength=L * experts).reshape(L, -1)


def norm_entropy(c: np.ndarray) -> float:
    """H(counts) / log(len(counts)): 1 = uniform; 0 for no counts or a single bin."""
    c = np.asarray(c, dtype=np.float64)
    tot = c.sum()
    if tot <= 0 or len(c) < 2:
        return 0.0
    p = c[c > 0] / tot
    return float(-(p * np.log(p)).sum() / math.log(len(c)))


def _top_share(c: np.ndarray, frac: float = 0.1) -> float:
    c = np.sort(np.asarray(c, dtype=np.float64))[::-1]
    tot = c.sum()
    return float(c[:max(1, int(math.ceil(frac * len(c))))].sum() / tot) if tot > 0 else 0.0


def _mi(joint: np.ndarray) -> float:
    """Plug-in mutual information (nats) of a joint count table."""
    j = np.asarray(joint, dtype=np.float64)
    N = j.sum()
    if N <= 0:
        return 0.0
    p = j / N
    px, py = p.sum(1), p.sum(0)
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / np.outer(px, py)[nz])).sum())


def nmi_pairs(a: np.ndarray, b: np.ndarray, experts: int, seed: int = 0) -> float:
    """Normalised MI of paired samples (a[i], b[i]) in 0..E-1, minus the MI of the same samples with b shuffled
    (an empirical estimate of the plug-in bias, which is large when samples are few against E*E cells); / log E."""
    E = int(experts)
    a = np.asarray(a, dtype=np.int64).ravel()
    b = np.asarray(b, dtype=np.int64).ravel()
    if len(a) == 0 or E < 2:
        return 0.0
    mi = _mi(np.bincount(a * E + b, minlength=E * E).reshape(E, E))
    bs = np.random.default_rng(seed).permutation(b)
    null = _mi(np.bincount(a * E + bs, minlength=E * E).reshape(E, E))
    return (mi - null) / math.log(E)


def nmi_counts(joint: np.ndarray, seed: int = 0) -> float:
    """Normalised MI of a joint count table minus that of a same-size multinomial sample of the product of its
    marginals (the same bias estimate as nmi_pairs, for aggregated counts); / log E."""
    j = np.asarray(joint, dtype=np.int64)
    N = int(j.sum())
    p = j / N
    null = np.random.default_rng(seed).multinomial(N, np.outer(p.sum(1), p.sum(0)).ravel()).reshape(j.shape)
    return (_mi(j) - _mi(null)) / math.log(j.shape[0])


def _r(x, nd=4):
    return round(float(x), nd)


def drop_masked(trace: Trace, who: str = "trace stats") -> tuple[np.ndarray, np.ndarray, int]:
    """(ids int64 [tokens, layers, topk], segment boundaries, tokens left out): a trace imported with
    ``--missing mask`` loses the tokens with a masked pick (a missing router record); segments keep the rest."""
    ids = np.asarray(trace.ids).astype(np.int64)
    if ids.ndim != 3:
        raise UserError(f"{who}: expected ids [tokens, layers, topk], found shape {list(ids.shape)}")
    seg = np.asarray(trace.segments, dtype=np.int64)
    if not (ids.size and ids.min() < 0 and trace.meta.get("missing") == "mask"):
        return ids, seg, 0
    keep = (ids >= 0).all(axis=(1, 2))
    seg_of_tok = np.repeat(np.arange(len(seg) - 1), np.diff(seg))[keep]
    ids = ids[keep]
    if not len(ids):
        raise UserError(f"{who}: every token has a masked pick")
    starts = np.flatnonzero(np.concatenate([[True], seg_of_tok[1:] != seg_of_tok[:-1]]))
    return ids, np.concatenate([starts, [len(ids)]]).astype(np.int64), int((~keep).sum())


def _prev_token_reuse(ids: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per layer: picks at t also picked at t-1 (same segment), over the picks that have a previous token."""
    T, L, K = ids.shape
    rep = np.zeros(L, dtype=np.int64)
    for a in range(1, T, 2048):             # chunked to bound memory
        b = min(T, a + 2048)
        eq = (ids[a:b, :, :, None] == ids[a - 1:b - 1, :, None, :]).any(-1)        # [n, L, K]
        eq &= ~first[a:b, None, None]
        rep += eq.sum(axis=(0, 2))
    valid_prev = int((~first[1:]).sum()) if T > 1 else 0
    return rep / max(1, valid_prev * K)


def _reuse_distances(ids: np.ndarray, seg_of: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reuse distance within segment, per key: (coarse counts [5], coarse per layer [L, 5], fine per layer [L, 9])."""
    T, L, K = ids.shape
    flat_t = np.repeat(np.arange(T), L * K)
    keys = (np.arange(L)[None, :, None] * E + ids).reshape(-1)
    group = seg_of[flat_t] * (L * E) + keys
    order = np.argsort(group, kind="stable")
    g, t = group[order], flat_t[order]
    same = np.concatenate([[False], g[1:] == g[:-1]])
    dist = np.where(same, t - np.concatenate([[0], t[:-1]]), -1)
    bucket = np.where(dist < 0, 4, np.digitize(dist, [64, 256, 1024]))
    layer_of = keys[order] // E
    rd_layer = np.bincount(layer_of * 5 + bucket, minlength=L * 5).reshape(L, 5)
    fine = np.where(dist < 0, 8, np.digitize(dist, _FINE_EDGES))
    fine_layer = np.bincount(layer_of * 9 + fine, minlength=L * 9).reshape(L, 9)
    return np.bincount(bucket, minlength=5), rd_layer, fine_layer


def _top1_repeat(ids: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per layer: slot 0 equal to the previous token's slot 0, same segment."""
    T, L, _ = ids.shape
    if T < 2:
        return np.zeros(L)
    same0 = (ids[1:, :, 0] == ids[:-1, :, 0]) & ~first[1:, None]
    return same0.sum(0) / max(1, int((~first[1:]).sum()))


def _cross_layer(ids: np.ndarray, counts: np.ndarray, E: int, progress, work: int) -> tuple[list, list]:
    """Per consecutive layer pair: (nmi_next, lift_top_pair)."""
    T, L, K = ids.shape
    nmi, lift = [], []
    for l in range(L - 1):
        if progress is not None:
            progress(l, work)
        nmi.append(nmi_pairs(ids[:, l, :].ravel(), ids[:, l + 1, :].ravel(), E, seed=l))
        pa = ids[:, l, :, None] * E + ids[:, l + 1, None, :]                       # all K x K pairs
        jc = np.bincount(pa.ravel(), minlength=E * E)
        expect = np.outer(counts[l], counts[l + 1]).ravel() / (T * K) ** 2 * jc.sum()
        ok = jc >= LIFT_MIN_COUNT
        lift.append(float((jc[ok] / expect[ok]).max()) if ok.any() else 0.0)
    return nmi, lift


def _layer_row(l: int, L: int, p: dict) -> dict:
    """One layer's row of ``per_layer`` from the arrays in ``p``."""
    counts, c0, rd, fine, nxt = p["counts"], p["c0"], p["rd_layer"], p["fine_layer"], p["nxt"]
    last = l == L - 1
    return {
        "layer": l,
        "entropy_norm": _r(norm_entropy(counts[l])),
        "max_over_mean": _r(counts[l].max() / p["mean_load"], 3),
        "top10_share": _r(_top_share(counts[l])),
        "slot0_entropy_norm": _r(norm_entropy(c0[l])),
        "slot0_max_over_mean": _r(c0[l].max() / p["slot0_load"], 3),
        "reuse_prev_token": _r(p["reuse"][l]),
        "reuse_distance": [_r(x) for x in rd[l] / max(1, rd[l].sum())],
        "nmi_next": None if last else _r(p["nmi"][l]),
        "lift_top_pair": None if last else _r(p["lift"][l], 3),
        "top1_repeat": _r(p["top1"][l]),
        "reuse_distance_fine": [_r(x) for x in fine[l] / max(1, fine[l].sum())],
        "next_layer_recall": ({str(k): _r(v) for k, v in nxt["recall"][l - 1].items()}
                              if nxt is not None and l > 0 else None),
    }


_SUMMARY = ("entropy_norm", "max_over_mean", "top10_share", "slot0_entropy_norm", "slot0_max_over_mean",
            "reuse_prev_token", "nmi_next", "lift_top_pair", "top1_repeat")


def stats(trace: Trace, experts: int, cache_sizes=None, *, cache: bool = True, progress=None,
          layer_sizes=None) -> dict:
    """Statistics of ``trace`` for a model with ``experts`` experts per layer (see module docstring).
    ``progress(done, total)`` is called per layer pair and per cache size (the slow parts)."""
    ids, seg, masked_tokens = drop_masked(trace)
    T, L, K = ids.shape
    E = int(experts)
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise UserError(f"trace stats: expert ids out of range 0..{E - 1} (found {ids.min()}..{ids.max()})")
    seg_of = np.repeat(np.arange(len(seg) - 1), np.diff(seg))
    first = np.zeros(T, dtype=bool)
    first[seg[:-1]] = True

    counts = selection_counts(ids, E)
    rd_counts, rd_layer, fine_layer = _reuse_distances(ids, seg_of, E)
    nxt = next_layer_recall(ids, E) if L > 1 else None
    n_sizes = len(cache_sizes) if cache_sizes is not None else len(default_cache_sizes(L, E))
    work = (L - 1) + (n_sizes if cache else 0)
    nmi, lift = _cross_layer(ids, counts, E, progress, work)
    parts = {"counts": counts, "c0": np.bincount((np.arange(L)[None, :] * E + ids[:, :, 0]).ravel(),
                                                 minlength=L * E).reshape(L, E),
             "mean_load": T * K / E, "slot0_load": T / E, "reuse": _prev_token_reuse(ids, first),
             "rd_layer": rd_layer, "fine_layer": fine_layer, "top1": _top1_repeat(ids, first), "nxt": nxt,
             "nmi": nmi, "lift": lift}
    per_layer = [_layer_row(l, L, parts) for l in range(L)]

    def mean(key):
        v = [p[key] for p in per_layer if p[key] is not None]
        return _r(np.mean(v)) if v else None

    out = {
        "tokens": int(T), "layers": int(L), "experts": E, "topk": int(K), "segments": int(len(seg) - 1),
        "masked_tokens_left_out": masked_tokens,
        "picks": int(T * L * K),
        "summary": {k: mean(k) for k in _SUMMARY},
        "reuse_random_baseline": _r(K / E),
        "reuse_distance": {"buckets": REUSE_BUCKETS, "count": rd_counts.tolist(),
                           "fraction": [_r(x) for x in rd_counts / max(1, rd_counts.sum())]},
        "reuse_distance_fine": {"buckets": FINE_BUCKETS, "fraction": [
            _r(x) for x in fine_layer.sum(0) / max(1, fine_layer.sum())]},
        "top1_random_baseline": _r(1 / E),
        "next_layer": None if nxt is None else {
            "ks": nxt["ks"], "predictability": _r(np.mean([r[K] for r in nxt["recall"]])),
            "recall": {str(k): _r(np.mean([r[k] for r in nxt["recall"]])) for k in nxt["ks"]},
            "method": "2-fold cross-fitted co-occurrence ranking from the previous layer's picks"},
        "per_layer": per_layer,
    }
    if cache:
        step = None if progress is None else (lambda i, n: progress(L - 1 + i, work))
        out["cache"] = cache_curves(ids, E, cache_sizes, progress=step)
        out["layer_cache"] = layer_cache_curves(ids, E, layer_sizes)
    return out


def default_layer_sizes(experts: int, topk: int) -> list[int]:
    """Per-layer cache sizes: topk x 1..4, E/4, E/2 (at most E, at least 1)."""
    return sorted({max(1, min(experts, s)) for s in (topk, 2 * topk, 3 * topk, 4 * topk, experts // 4,
                                                     experts // 2)})


def stack_depths(ids: np.ndarray, cap: int | None = None) -> np.ndarray:
    """LRU stack depth of every pick, int64 [tokens, layers, topk]: how many distinct experts of its layer were
    picked since its expert's last pick there (0 = the most recent), replaying each layer's picks in (token, slot)
    order over all segments; ``cap`` (default: never) for a first pick and, given ``cap``, for any depth >= cap. An
    LRU cache of s slots per layer hits exactly the picks with depth < s (Mattson's inclusion property), so one
    pass gives the per-layer LRU curve at every size."""
    ids = np.asarray(ids, dtype=np.int64)
    T, L, K = ids.shape
    never = int(cap) if cap is not None else np.iinfo(np.int64).max
    out = np.full((T, L, K), never, dtype=np.int64)
    for l in range(L):
        stack: list = []
        index, pop, ins = stack.index, stack.pop, stack.insert
        col = out[:, l, :].reshape(-1)
        for i, x in enumerate(ids[:, l, :].ravel().tolist()):
            try:
                d = index(x)
            except ValueError:
                ins(0, x)
                continue
            if d:
                pop(d)
                ins(0, x)
            if cap is None or d < cap:
                col[i] = d
        out[:, l, :] = col.reshape(T, K)
    return out


def layer_cache_curves(ids: np.ndarray, experts: int, sizes=None, *, belady: bool = True) -> dict:
    """Per-layer LRU and Belady hit rates (module docstring: ``layer_cache``); ``belady=False`` leaves Belady out
    (its rates are then reported as None)."""
    T, L, K = ids.shape
    E = int(experts)
    sizes = default_layer_sizes(E, K) if sizes is None else sorted({int(s) for s in sizes})
    if any(s < 1 for s in sizes):
        raise UserError(f"trace stats: per-layer cache sizes must be >= 1 slot, found {sizes}")
    depth = stack_depths(ids, max(sizes))
    lru = np.stack([(depth < sz).mean(axis=(0, 2)) for sz in sizes], axis=1)             # [L, sizes]
    opt = np.full((L, len(sizes)), np.nan)
    for l in range(L) if belady else ():
        seq = np.asarray(ids[:, l, :], dtype=np.int64).ravel()
        n = len(seq)
        distinct = len(np.unique(seq))
        nx = next_use(seq)
        for j, sz in enumerate(sizes):
            opt[l, j] = (n - distinct) / n if sz >= distinct else belady_hits(seq, sz, nx) / n

    def rows(a):
        return [[_r(x) if belady or a is lru else None for x in row] for row in a]
    return {"sizes": sizes, "lru": [_r(x) for x in lru.mean(0)],
            "belady": [_r(x) for x in opt.mean(0)] if belady else None,
            "per_layer": {"lru": rows(lru), "belady": rows(opt)},
            "order": "one layer's picks, token then slot; one stream over all segments"}


def next_layer_recall(ids: np.ndarray, experts: int, ks=None) -> dict:
    """Next-layer predictability (module docstring: ``next_layer``): per layer 1..L-1 {k: recall}."""
    T, L, K = ids.shape
    E = int(experts)
    ks = sorted({max(1, K // 2), K, min(E, 2 * K)}) if ks is None else sorted(set(ks))
    kmax = min(E, max(ks))
    odd = (np.arange(T) // min(FOLD_BLOCK, max(1, T // 8))) % 2 == 1      # short traces: 8 blocks
    a, b = np.flatnonzero(~odd), np.flatnonzero(odd)
    folds = [(a, b), (b, a)]
    out = []
    for l in range(1, L):
        prev, cur = ids[:, l - 1, :].astype(np.int64), ids[:, l, :].astype(np.int64)
        best = None
        for alpha in _ALPHAS:
            hits = dict.fromkeys(ks, 0)
            total = 0
            for test, train in folds:
                if not len(test) or not len(train):
                    continue
                pairs = (prev[train][:, :, None] * E + cur[train][:, None, :]).ravel()
                C = np.bincount(pairs, minlength=E * E).reshape(E, E).astype(np.float64)
                pop = np.bincount(cur[train].ravel(), minlength=E).astype(np.float64)
                pop /= max(1.0, pop.sum())
                if alpha is None:                   # popularity alone
                    P = np.broadcast_to(pop, (E, E))
                else:
                    P = (C + alpha * pop[None, :]) / (C.sum(1, keepdims=True) + alpha + 1e-12)
                score = P[prev[test]].sum(axis=1) + pop * 1e-9                  # [n, E]
                top = np.argpartition(-score, kmax - 1, axis=1)[:, :kmax] if kmax < E else \
                    np.tile(np.arange(E), (len(test), 1))
                top = np.take_along_axis(top, np.argsort(-np.take_along_axis(score, top, 1), axis=1,
                                                         kind="stable"), 1)
                truth = cur[test]
                for k in ks:
                    hits[k] += int((top[:, :k, None] == truth[:, None, :]).any(1).sum())
                total += truth.size
            rec = {k: hits[k] / total if total else 0.0 for k in ks}
            if best is None or rec[K] > best[K]:
                best = rec
        out.append(best)
    return {"ks": ks, "recall": out}


def cache_curves(ids: np.ndarray, experts: int, cache_sizes=None, *, progress=None) -> dict:
    """LRU and OPT hit rates over all keys, one stream in (token, layer, slot) order."""
    T, L, K = ids.shape
    E = int(experts)
    seq = (np.arange(L)[None, :, None] * E + np.asarray(ids, dtype=np.int64)).reshape(-1)
    n = len(seq)
    distinct = int(len(np.unique(seq)))
    if cache_sizes is None:
        sizes = default_cache_sizes(L, E)
    else:
        try:
            sizes = sorted({int(s) for s in cache_sizes})
        except (TypeError, ValueError):
            raise UserError(f"trace stats: cache sizes must be integers, found {cache_sizes!r}") from None
        if any(s < 1 for s in sizes):
            raise UserError(f"trace stats: cache sizes must be >= 1 slot, found {sizes}")
    nxt = next_use(seq)
    lru, opt = [], []
    for i, s in enumerate(sizes):
        if progress is not None:
            progress(i, len(sizes))
        if s >= distinct:
            h = n - distinct
            lru.append(h)
            opt.append(h)
        else:
            lru.append(lru_hits(seq, s))
            opt.append(belady_hits(seq, s, nxt))
    return {"sizes": sizes, "accesses": int(n), "distinct_keys": distinct,
            "lru": [_r(h / n) for h in lru], "belady": [_r(h / n) for h in opt],
            "slots_fraction": [_r(s / (L * E)) for s in sizes],
            "order": "token, layer, slot; one stream over all segments"}
