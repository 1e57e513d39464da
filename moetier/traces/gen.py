"""Synthetic routing traces, with knobs fitted to real routing statistics.

Contract
--------
``generate(params, layers=, experts=, topk=, tokens=, segments=, seed=)`` returns a ``Trace`` (see moetier.trace)
whose ids are deterministic for a seed, hold ``topk`` DISTINCT experts per token and layer, ordered like a router's
ranked choices (slot 0 = the strongest pick), and whose ``meta`` holds ``source="moetier.tracegen"``, the params and
the seed. Every knob of ``GenParams`` is monotone in the statistic it models (docs/traces.md):

* ``zipf_s``         popularity skew. Each layer ranks its experts by a random permutation and weights rank r by
                     r^-s: 0 = uniform, larger = more skewed (lower normalised entropy, larger top-10% share).
* ``zipf_jitter``    per-layer spread of s: layer s = zipf_s * max(0, 1 + jitter * N(0, 1)).
* ``reuse``          token-to-token locality: slot k repeats the previous token's slot-k pick (same layer, same
                     segment) with this probability. 0 = none, 1 = frozen routing.
* ``affinity``       cross-layer affinity: a slot not repeated takes, with this probability, one of the
                     ``affinity_width`` fixed successors of the expert in the same slot at layer l-1 (uniformly);
                     successors are drawn once per (layer, expert), favouring popular experts of the next layer.
* ``affinity_width`` number of preferred successors per (layer, expert): smaller = sharper layer-to-layer structure.
* ``drift``          per-segment popularity drift: each segment re-ranks experts with a score correlated
                     (1 - drift) with the base ranking: 0 = same popular experts in every segment, 1 = independent.

Sampling: top-k distinct experts from weights p by the exponential race (keys p / Exp(1), keep the k largest, i.e.
the Gumbel-top-k trick without logarithms). Every other slot is a fresh popularity draw. Repeated and successor
picks are forced into the selection and keep their parent's slot; fresh picks fill the free slots in descending key
order, so slot k pairs with slot k across tokens and layers. The (token, layer)
dependency (reuse needs t-1, affinity needs l-1) is resolved by sweeping anti-diagonals t + l = const, vectorised
over layers.

``fit_olmoe()`` fits zipf_s, zipf_jitter, affinity and drift to the OLMoE-1B-7B routing counts (E=64, top-8) and
returns a report (targets, achieved); reuse is not identifiable from aggregated counts and is left as given.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moetier.errors import UserError
from moetier.traces.format import Trace, ids_dtype
from moetier.traces.stats import nmi_counts, nmi_pairs

__all__ = ["GenParams", "generate", "fit_olmoe", "OLMOE_COUNTS", "inclusion_stats"]

# package data (pyproject.toml: moetier.traces data/*): Apache-2.0 counts from allenai/OLMoE, notice beside them
OLMOE_COUNTS = Path(__file__).resolve().parent / "data" / "olmoe-routing-counts.npz"


@dataclass(frozen=True)
class GenParams:
    zipf_s: float = 1.0
    zipf_jitter: float = 0.0
    reuse: float = 0.0
    affinity: float = 0.0
    affinity_width: int = 8
    drift: float = 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["affinity_width"] = int(d["affinity_width"])
        return {k: (float(v) if k != "affinity_width" else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: dict) -> "GenParams":
        if not isinstance(d, dict):
            raise UserError(f"generator params: expected a JSON object, got {type(d).__name__}")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise UserError(f"generator params: unknown field(s) {sorted(unknown)}; expected "
                            f"{sorted(cls.__dataclass_fields__)}")
        return cls(**d)

    def check(self, experts: int | None = None) -> None:
        def bad(name, want):
            raise UserError(f"generator params: {name}={getattr(self, name)!r}, expected {want}")
        for name in ("zipf_s", "zipf_jitter"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                bad(name, "a finite number >= 0")
        for name in ("reuse", "affinity", "drift"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v <= 1):
                bad(name, "a number in [0, 1]")
        w = self.affinity_width
        if not (isinstance(w, (int, np.integer)) and w >= 1 and (experts is None or w <= experts)):
            bad("affinity_width", f"an integer in 1..{experts if experts else 'experts'}")


def _check_memory(T: int, L: int, K: int) -> None:
    """Refuse a trace that cannot fit in memory before allocating it (the ids, the weights and a copy while
    saving: 24 bytes a pick), rather than dying in numpy's allocator."""
    import psutil
    avail = psutil.virtual_memory().available
    per_token = L * K * 24
    if T * per_token > avail // 2:
        raise UserError(f"generate: tokens={T}: a {T} x {L} x {K} trace needs about {T * per_token / 1e9:.1f} GB, "
                        f"more than half the free memory ({avail / 1e9:.1f} GB); expected at most "
                        f"{avail // 2 // per_token} tokens")


def _segments(segments, tokens: int) -> np.ndarray:
    if isinstance(segments, (int, np.integer)):
        n = int(segments)
        if not 1 <= n <= tokens:
            raise UserError(f"generate: segments={n}, expected 1..{tokens} (the token count)")
        return np.unique(np.round(np.linspace(0, tokens, n + 1)).astype(np.int64))
    seg = np.asarray(segments, dtype=np.int64)
    if seg.ndim != 1 or len(seg) < 2 or seg[0] != 0 or seg[-1] != tokens or (np.diff(seg) <= 0).any():
        raise UserError(f"generate: segments must be a count or boundaries [0, ..., {tokens}] strictly increasing")
    return seg


def _zipf(ranks: np.ndarray, s: np.ndarray) -> np.ndarray:
    """ranks 1..E along the last axis, s broadcastable; normalised weights rank^-s."""
    w = np.power(ranks.astype(np.float64), -np.asarray(s, dtype=np.float64)[..., None])
    return w / w.sum(axis=-1, keepdims=True)


def _rank(score: np.ndarray) -> np.ndarray:
    """1-based descending rank of each entry along the last axis."""
    return np.argsort(np.argsort(-score, axis=-1), axis=-1) + 1


def diagonals(T: int, L: int):
    """(layers, tokens) of each anti-diagonal t + l = d in order: every (t, l) comes after (t-1, l) and (t, l-1),
    and the layers of one diagonal are independent, so a generator vectorises over them."""
    larange = np.arange(L)
    for d in range(T + L - 1):
        ls = larange[max(0, d - T + 1):min(L - 1, d) + 1]
        yield ls, d - ls


def generate(params: GenParams, *, layers: int, experts: int, topk: int, tokens: int, segments=1, seed: int = 0,
             model_id: str | None = None) -> Trace:
    """Synthetic trace [tokens, layers, topk] (see module docstring). ``segments``: a count (equal split) or
    boundaries."""
    if isinstance(params, dict):
        params = GenParams.from_json(params)
    params.check(experts)
    for name, v in (("layers", layers), ("experts", experts), ("topk", topk), ("tokens", tokens)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise UserError(f"generate: {name}={v!r}, expected a positive integer")
    if topk > experts:
        raise UserError(f"generate: topk={topk} exceeds experts={experts}")
    L, E, K, T = int(layers), int(experts), int(topk), int(tokens)
    _check_memory(T, L, K)
    seg = _segments(segments, T)
    nseg = len(seg) - 1
    rng = np.random.default_rng(seed)

    # popularity: per layer s, base ranking score, per-segment drifted ranking
    s_l = params.zipf_s * np.clip(1.0 + params.zipf_jitter * rng.standard_normal(L), 0.0, None)
    g0 = rng.standard_normal((L, E))
    rho = 1.0 - params.drift
    pop = np.empty((nseg, L, E), dtype=np.float32)
    base_p = _zipf(_rank(g0), s_l)
    for j in range(nseg):
        if params.drift == 0:
            pop[j] = base_p
        else:
            g = rho * g0 + math.sqrt(max(0.0, 1.0 - rho * rho)) * rng.standard_normal((L, E))
            pop[j] = _zipf(_rank(g), s_l)

    # successors: for layer l < L-1 and expert e, W distinct experts of layer l+1, favouring popular ones
    W = int(params.affinity_width)
    a = float(params.affinity)
    succ = None
    if a > 0 and L > 1:
        succ = np.empty((L - 1, E, W), dtype=np.int64)
        for l in range(L - 1):
            keys = base_p[l + 1][None, :] / rng.standard_exponential((E, E))
            succ[l] = np.argpartition(-keys, W - 1, axis=1)[:, :W]

    seg_of = np.repeat(np.arange(nseg), np.diff(seg))
    is_start = np.zeros(T, dtype=bool)
    is_start[seg[:-1]] = True
    ids = np.empty((T, L, K), dtype=np.int64)
    reuse = float(params.reuse)
    kpos = np.arange(K)
    for ls, ts in diagonals(T, L):
        n = len(ls)
        rows_all = np.arange(n)
        keys = pop[seg_of[ts], ls] / rng.standard_exponential((n, E)).astype(np.float32)
        # forced candidates per slot: reuse (previous token, same slot) first, else affinity (successor of the
        # previous layer's pick in the same slot), else none (a fresh popularity draw)
        cand = np.full((n, K), -1, dtype=np.int64)
        if reuse > 0:
            ok = ~is_start[ts]
            if ok.any():
                r = rows_all[ok]
                take = rng.random((len(r), K)) < reuse
                cand[r] = np.where(take, ids[ts[r] - 1, ls[r]], -1)
        if succ is not None:
            ok = ls > 0
            if ok.any():
                r = rows_all[ok]
                parent = ids[ts[r], ls[r] - 1]                                   # [m, K]
                pick = succ[ls[r] - 1][np.arange(len(r))[:, None], parent,
                                       rng.integers(0, W, size=(len(r), K))]     # [m, K]
                take = (rng.random((len(r), K)) < a) & (cand[r] < 0)
                cand[r] = np.where(take, pick, cand[r])
        forced = cand >= 0
        if forced.any():
            fr, fk = np.nonzero(forced)
            sel_keys = keys.copy()
            sel_keys[fr, cand[fr, fk]] = np.inf
        else:
            sel_keys = keys
        sel = np.argpartition(-sel_keys, K - 1, axis=1)[:, :K] if K < E else np.tile(np.arange(E), (n, 1))
        nat = np.take_along_axis(keys, sel, axis=1)
        if not forced.any():
            out = np.take_along_axis(sel, np.argsort(-nat, axis=1, kind="stable"), axis=1)
        else:
            # a forced pick keeps its parent slot (the smallest one if forced twice); fresh picks fill the free
            # slots in descending key order (router-like ranking)
            want = np.full((n, E), K, dtype=np.int64)
            for k in range(K - 1, -1, -1):
                m = forced[:, k]
                want[rows_all[m], cand[m, k]] = k
            w = np.take_along_axis(want, sel, axis=1)                           # [n, K] slot or K
            placed = w < K
            out = np.empty((n, K), dtype=np.int64)
            pr, pk = np.nonzero(placed)
            out[pr, w[pr, pk]] = sel[pr, pk]
            occupied = np.zeros((n, K), dtype=bool)
            occupied[pr, w[pr, pk]] = True
            free_pos = np.argsort(occupied, axis=1, kind="stable")              # free slots first, ascending
            order_u = np.argsort(np.where(placed, np.inf, -nat), axis=1, kind="stable")
            nfree = K - placed.sum(axis=1)
            valid = kpos[None, :] < nfree[:, None]
            vr, vj = np.nonzero(valid)
            out[vr, free_pos[vr, vj]] = sel[vr, order_u[vr, vj]]
        ids[ts, ls] = out

    meta = {"source": "moetier.tracegen", "params": params.to_json(), "seed": int(seed), "layers": L,
            "experts": E, "topk": K, "layer_zipf_s": [round(float(x), 6) for x in s_l]}
    if model_id is not None:
        meta["model_id"] = model_id
    return Trace(ids=ids.astype(ids_dtype(E)), segments=seg, weights=None, meta=meta)


# ----------------------------------------------------------------------------------------------------------------
# statistics shared by the fit (the same definitions as moetier.tracestats)

def _norm_entropy(counts: np.ndarray) -> float:
    c = np.asarray(counts, dtype=np.float64)
    p = c[c > 0] / c.sum()
    return float(-(p * np.log(p)).sum() / math.log(len(c)))


def _top_share(counts: np.ndarray, frac: float = 0.1) -> float:
    c = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    n = max(1, int(math.ceil(frac * len(c))))
    return float(c[:n].sum() / c.sum())


def inclusion_stats(s: float, experts: int, topk: int, draws: int = 4000, seed: int = 1) -> tuple[float, float]:
    """(normalised entropy, top-10% share) of selection counts when top-k is drawn without replacement from a
    Zipf(s) popularity (no reuse, no affinity): what one generator layer produces in expectation."""
    rng = np.random.default_rng(seed)
    p = _zipf(np.arange(1, experts + 1), np.array(s))
    keys = p[None, :] / rng.standard_exponential((draws, experts))
    sel = np.argpartition(-keys, topk - 1, axis=1)[:, :topk]
    c = np.bincount(sel.ravel(), minlength=experts)
    return _norm_entropy(c), _top_share(c)


def _bisect(f, target, lo, hi, iters, increasing=True):
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        v = f(mid)
        if (v < target) == increasing:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fit_olmoe(npz_path=None, *, reuse: float = 0.0, affinity_width: int = 1, tokens: int = 12000,
              seed: int = 0, verbose: bool = False) -> dict:
    """Fit GenParams to the OLMoE-1B-7B routing counts (E=64, top-8, layers 0/7/15, five domains).

    Targets (means over domains): normalised entropy and top-10% share of expert_counts per layer (zipf_s, and
    zipf_jitter from the spread of per-row fits), bias-corrected normalised mutual information (moetier.tracestats) of the k-th-with-k-th
    cross-layer joint counts for layers (0,7) and (7,15) (affinity, on a 16-layer generated trace), and the entropy
    gain of pooling the five domains (drift). Returns {"params", "targets", "achieved", "notes", "seconds"}.
    """
    t0 = time.time()
    path = Path(npz_path) if npz_path is not None else OLMOE_COUNTS
    if not path.exists():
        raise UserError(f"fit_olmoe: counts file {path} not found")
    z = np.load(path, allow_pickle=False)
    E, K, L = 64, 8, 16
    layers_at = (0, 7, 15)
    domains = sorted({k.split("__")[2] for k in z.files if k.startswith("olmoe__expert_counts__")})
    cnt = np.stack([z[f"olmoe__expert_counts__{d}"] for d in domains])            # [D, 3, E]
    cross = np.stack([z[f"olmoe__expert_counts_crosslayer__{d}"] for d in domains])  # [D, 2, E, E]
    ent = np.array([[_norm_entropy(r) for r in dom] for dom in cnt])
    top = np.array([[_top_share(r) for r in dom] for dom in cnt])
    nmi = np.array([[nmi_counts(j) for j in dom] for dom in cross])
    pooled = np.array([_norm_entropy(cnt[:, i].sum(0)) for i in range(3)])
    targets = {
        "entropy_norm": float(ent.mean()), "entropy_norm_per_layer": ent.mean(0).round(4).tolist(),
        "top10_share": float(top.mean()), "top10_share_per_layer": top.mean(0).round(4).tolist(),
        "nmi_l0_l7": float(nmi[:, 0].mean()), "nmi_l7_l15": float(nmi[:, 1].mean()), "nmi": float(nmi.mean()),
        "pooled_entropy_gain": float((pooled - ent.mean(0)).mean()),
        "domains": domains,
    }

    # 1. zipf_s per (domain, layer) row: match entropy and top-10% share of the selection counts
    grid = np.round(np.arange(0.0, 2.51, 0.02), 4)
    table = np.array([inclusion_stats(s, E, K) for s in grid])           # [G, 2]
    row_s = []
    for di in range(len(domains)):
        for li in range(3):
            err = ((table[:, 0] - ent[di, li]) / 0.02) ** 2 + ((table[:, 1] - top[di, li]) / 0.05) ** 2
            row_s.append(grid[int(np.argmin(err))])
    row_s = np.array(row_s)
    zipf_s = float(row_s.mean())
    zipf_jitter = float(row_s.std() / zipf_s) if zipf_s > 0 else 0.0

    def gen(p, T=tokens, nseg=1, layers=L):
        return generate(p, layers=layers, experts=E, topk=K, tokens=T, segments=nseg, seed=seed)

    def measured(tr):
        ids = tr.ids
        c = [np.bincount(ids[:, l].ravel(), minlength=E) for l in layers_at]
        return {"entropy_norm": float(np.mean([_norm_entropy(x) for x in c])),
                "top10_share": float(np.mean([_top_share(x) for x in c])),
                        "nmi_l0_l7": nmi_pairs(ids[:, 0], ids[:, 7], E), "nmi_l7_l15": nmi_pairs(ids[:, 7], ids[:, 15], E),
                "nmi_consecutive": float(np.mean([nmi_pairs(ids[:, l], ids[:, l + 1], E) for l in range(L - 1)]))}

    # 2. affinity: bisection on the mean cross-layer NMI (jitter off during the search for a smoother objective)
    def nmi_at(aff):
        m = measured(gen(GenParams(zipf_s, 0.0, 0.0, aff, affinity_width, 0.0), T=tokens // 2))
        return 0.5 * (m["nmi_l0_l7"] + m["nmi_l7_l15"])
    affinity = _bisect(nmi_at, targets["nmi"], 0.0, 1.0, 7)
    if verbose:
        print(f"fit: zipf_s={zipf_s:.3f} jitter={zipf_jitter:.3f} affinity={affinity:.3f} ({time.time() - t0:.1f}s)")

    # 3. drift: entropy gain of pooling 5 segments over the per-segment mean (3 layers suffice: layers independent)
    def gain_at(dr):
        tr = generate(GenParams(zipf_s, 0.0, 0.0, 0.0, affinity_width, dr), layers=3, experts=E, topk=K,
                      tokens=5 * 3000, segments=5, seed=seed)
        per = np.mean([[_norm_entropy(np.bincount(tr.segment(j)[:, l].ravel(), minlength=E)) for l in range(3)]
                       for j in range(5)])
        pool = np.mean([_norm_entropy(np.bincount(tr.ids[:, l].ravel(), minlength=E)) for l in range(3)])
        return float(pool - per)
    drift = _bisect(gain_at, targets["pooled_entropy_gain"], 0.0, 1.0, 7)

    params = GenParams(zipf_s=round(zipf_s, 4), zipf_jitter=round(zipf_jitter, 4), reuse=float(reuse),
                       affinity=round(affinity, 4), affinity_width=int(affinity_width), drift=round(drift, 4))
    final = gen(params)
    achieved = measured(final)
    achieved["nmi"] = 0.5 * (achieved["nmi_l0_l7"] + achieved["nmi_l7_l15"])
    achieved["pooled_entropy_gain"] = gain_at(drift)
    return {
        "params": params.to_json(),
        "targets": targets,
        "achieved": achieved,
        "row_zipf_s": row_s.round(3).tolist(),
        "notes": ["counts are per domain (about 204,800 tokens each, 2048-token chunks); targets are domain means",
                  "nmi: k-th choice paired with k-th choice, minus a shuffled/independent baseline, divided by log(64); the data "
                  "pairs layers 7 apart, the generator chains consecutive layers",
                  "reuse is not identifiable from aggregated counts: left as given",
                  "the consecutive-layer chain loses information fast: only affinity_width=1 reaches the data's "
                  "distance-7 NMI, and then nmi_consecutive (not measurable in the data) is an upper-bound guess",
                  "affinity_width=1 concentrates load on the successor chain: achieved entropy is below target and "
                  "no zipf_s refit fixes it (even uniform popularity stays below); a joint model is future work",
                  "drift at its upper bound means domain-to-domain popularity change exceeds what re-ranking alone "
                  "models (the domains also differ in skew)",
                  f"achieved statistics measured on a generated [{tokens}, 16, 8] trace, seed {seed} (entropy and "
                  f"top-10% share at layers 0/7/15 include zipf_jitter, so they scatter around the target)"],
        "seconds": round(time.time() - t0, 1),
    }
