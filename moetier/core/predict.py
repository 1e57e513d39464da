"""Prefetch predictors: which experts will the layer ``depth`` ahead pick?

Contract
--------
A predictor ranks candidate experts of layer ``layer + depth`` from what is known when layer ``layer`` runs:

    predict(layer, rows, future) -> ranked LOCAL expert ids of the target layer (a list or an int64 array)
    observe(layer, rows, target_rows)  - called once the target layer's true picks are known (learning)

``rows`` = this step's per-row local expert ids at ``layer`` (a list of lists). ``future`` holds the target layer's
TRUE picks and is only for what-if predictors (``uses_future = True``); a real predictor must ignore it. The
executor filters the ranking to keys that need an NVMe read and caps it at the prefetch budget.

- ``recall``: the reference's what-if: a deterministic hash selects a fraction ``recall`` of the true picks. No false
  positives, so it bounds what a predictor of that recall can give.
- ``transition``: a real, past-only predictor: online counts of (expert at layer l -> expert at layer l+depth) for
  the same token, plus the target layer's popularity as a tie-breaker.
- ``gated``: the same online counts read as probabilities, with a confidence threshold and a read budget per token,
  both adapted online from its own precision (``GatedPredictor``): a read is worth issuing only when it is likely
  to be used, so on routing the past does not predict it issues next to nothing, and where it does it issues what
  passes the threshold. Per layer it goes dormant (neither predicts nor learns) where its reads do not pay for the
  host time a run costs, and probes again after a back-off.

A predictor may also have ``begin_step(step)`` (called as a decode step starts), ``issued(layer, ids)`` (the
local ids of the target layer the executor read for it, after its filter and cap), ``runs(layer)`` (whether it
runs on that layer this step; without it, every layer), ``price(save_ms=, waste_ms=, run_ms=)`` (what a used read
saves, a wasted one costs and a run costs, from the recipe) and ``learn_from(ids)`` (tokens held out from the run,
before the first step). The executor (moetier.core.replay.Replay) calls them, in the simulator and the runtime alike.

The counting predictors' per-call work (a ranking from a layer's rows, the counts a layer's rows add) is compiled
(moetier.core.jit) over their count arrays; a call packs its rows into one int64 array (``_pack``). Their
adaptation (the gated predictor's threshold, budget and dormancy) is a few scalars per call and stays Python.
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel


def _pack(*groups) -> np.ndarray:
    """Row groups (each a list of rows of local ids) as one int64 array: per group its row count, then each row's
    length, then the ids in order (the kernels' ``R``)."""
    out = []
    for rows in groups:
        out.append(len(rows))
        out.extend(map(len, rows))
    for rows in groups:
        for r in rows:
            out += r
    return np.fromiter(out, np.int64, len(out))


@kernel
def _once(ids, a, b, j) -> bool:
    """Whether ids[j] is the first of its value in ids[a:b] (numpy's fancy-index += adds a repeated index once)."""
    for i in range(a, j):
        if ids[i] == ids[j]:
            return False
    return True


@kernel
def _count(c, n, pop, R, min_seen):
    """Add rows -> target rows (R: _pack(rows, target_rows)) to transition counts ``c``, source counts ``n`` and the
    target layer's popularity ``pop`` (None: not kept), as numpy's ``c[np.ix_(a, b)] += 1`` and ``n[a] += 1`` a pair
    of rows at a time and ``pop[b] += 1`` for every target row. Returns the picks of the rows and those seen
    ``min_seen`` times before their row counted them."""
    na, nb = R[0], R[R[0] + 1]
    la, lb = 1, R[0] + 2                       # each group's first length
    ia = lb + nb                               # the first id of the rows, then the target rows'
    ib = ia
    for r in range(na):
        ib += R[la + r]
    known = picked = 0
    for r in range(nb):
        eb = ib + R[lb + r]
        if pop is not None:
            for q in range(ib, eb):
                if _once(R, ib, eb, q):
                    pop[R[q]] += np.float32(1.0)
        if r < na:
            ea = ia + R[la + r]
            for j in range(ia, ea):
                a = R[j]
                picked += 1
                if n is not None and n[a] >= min_seen:
                    known += 1
                if _once(R, ia, ea, j):
                    for q in range(ib, eb):
                        if _once(R, ib, eb, q):
                            c[a, R[q]] += np.float32(1.0)
            if n is not None:
                for j in range(ia, ea):
                    if _once(R, ia, ea, j):
                        n[R[j]] += np.float32(1.0)
            ia = ea
        ib = eb
    return known, picked


@kernel
def _transition_rank(c, pop, R):
    """Every expert of the target layer, most likely first: popularity x 1e-3 plus, per row, the sum of its picks'
    transition counts (float32, in numpy's order: a row's sum first, then onto the score); ties by id."""
    score = pop * np.float32(1e-3)
    E, n = len(pop), R[0]
    s = np.empty(E, np.float32)
    at = n + 1
    for r in range(n):
        s[:] = 0.0
        for j in range(at, at + R[1 + r]):
            s += c[R[j]]
        score += s
        at += R[1 + r]
    return np.argsort(-score, kind="mergesort")


@kernel
def _gated_rank(c, n, R, min_seen, threshold, left):
    """The target layer's experts whose chance of a pick (1 - prod over rows and their seen picks of 1 - count /
    seen) is at least ``threshold``, most likely first (ties by id), at most ``left`` of them."""
    E, rows = c.shape[1], R[0]
    miss = np.ones(E)
    q = np.empty(E, np.float32)
    at = rows + 1
    for r in range(rows):
        first = True
        for j in range(at, at + R[1 + r]):
            a = R[j]
            if n[a] < min_seen:
                continue
            p = np.float32(1.0) - c[a] / n[a]
            if first:
                q[:] = p
                first = False
            else:
                q *= p
        if not first:
            miss *= q
        at += R[1 + r]
    prob = 1.0 - miss
    cand = np.flatnonzero(prob >= threshold)
    order = np.argsort(-prob[cand], kind="mergesort")
    return cand[order[:max(left, 0)]]


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
        return _transition_rank(self.counts[layer], self.pop[layer + self.depth], _pack(rows))

    def observe(self, layer, rows, target_rows):
        _count(self.counts[layer], None, self.pop[layer + self.depth], _pack(rows, target_rows), 0)


class GatedPredictor:
    """Transition counts as probabilities, gated by a confidence threshold and a per-token read budget, and dormant
    on the layers where predicting does not pay.

    P(e at l+depth | a at l) = count(a -> e) / count(a), read only once ``a`` has been seen ``min_seen`` times; the
    chance a row picks e is 1 - prod over the row's picks (1 - P); over rows the same. An expert is returned when
    that chance is at least ``threshold``, most likely first, while the step's reads stay under ``budget``.
    Both adapt to the precision of what the executor issued (the share of issued reads the target layer picked,
    an average over the last ~``window`` reads): below ``target`` the threshold rises by ``step`` and the budget
    halves; above target + 0.1 the threshold falls by step / 2 (not below ``floor``) and the budget grows by one
    read per token up to ``max_budget``. A wasted read costs NVMe time a demand read may need, a used one saves
    a demand read's latency, so the target precision is where the two balance (0.6 by default: docs/peers.md).

    Dormancy, per source layer: each time a layer runs (predicts, and learns once its target's picks are known) it
    books its net gain, ms = used reads x ``save_ms`` - wasted reads x ``waste_ms`` - ``run_ms`` (the host time of
    running the predictor on a layer; ``price`` sets the three from the recipe), once it has learned: most of the
    picks it predicts from seen ``min_seen`` times, or ``learn`` runs done. After ``patience`` runs awake, or
    ``probe`` runs of a probe, a layer whose mean gain over those runs is below 0 (or is 0 while a run costs host
    time) goes dormant: it neither predicts nor learns for ``sleep`` steps (doubling at each failed probe, up to
    ``max_sleep``), then probes again; a probe that pays wakes it and resets the back-off. ``runs(layer)`` says,
    before the layer is planned, whether the predictor runs on it this step (it predicts for ``layer`` or learns
    from ``layer - depth``): the planner charges the predictor's host time only there.
    """
    name = "gated"
    uses_future = False

    def __init__(self, layers: int, experts: int, depth: int = 1, *, threshold: float = 0.5,
                 target: float = 0.6, budget: float | None = None, max_budget: float | None = None,
                 min_seen: int = 8, step: float = 0.02, floor: float = 0.2, window: int = 200,
                 patience: int = 16, probe: int = 2, sleep: int = 32, max_sleep: int = 256, learn: int = 32):
        self.depth, self.experts, self.layers = depth, experts, layers
        S = max(layers - depth, 1)
        self.counts = np.zeros((S, experts, experts), dtype=np.float32)
        self.seen = np.zeros((S, experts), dtype=np.float32)
        self.threshold, self.target, self.step, self.floor = float(threshold), float(target), step, floor
        self.max_budget = float(max_budget if max_budget is not None else layers * 4)
        self.budget = float(budget if budget is not None else self.max_budget / 4)
        self.min_seen, self.alpha = min_seen, 1.0 / max(1, window)
        self.precision = target            # running precision of the issued reads
        self.step_reads = 0
        self.pending: dict = {}            # target layer -> local ids issued for it this step
        # dormancy (class docstring)
        self.patience, self.probe, self.sleep0, self.max_sleep = int(patience), int(probe), int(sleep), int(max_sleep)
        self.save_ms, self.waste_ms, self.run_ms = 1.0, 1.0, 0.0
        self.now = 0
        self.on = np.ones(S, dtype=bool)           # source layers that run this step
        self.wake_at = np.zeros(S, dtype=np.int64)  # a dormant layer's next probe (step); 0: awake
        self.probing = np.zeros(S, dtype=bool)
        self.sleep = np.full(S, self.sleep0, dtype=np.int64)
        self.learn = int(learn)
        self.learned = np.zeros(S, dtype=np.int64)  # runs so far (learning)
        self.gain = np.zeros(S)                    # net gain (ms) booked since the layer's last verdict ...
        self.nruns = np.zeros(S, dtype=np.int64)   # ... over this many runs

    def learn_from(self, ids: np.ndarray) -> None:
        """Transition counts from tokens held out from the run (ids [tokens, layers, >= top-k]; masked picks, -1,
        left out), before the first step: what a layer has learned there it need not learn while it costs host
        time (a layer is judged once most of its picks were seen ``min_seen`` times)."""
        ids = np.asarray(ids, dtype=np.int64)
        d, E = self.depth, self.experts
        for layer in range(min(len(self.counts), ids.shape[1] - d)):
            a, b = ids[:, layer, :], ids[:, layer + d, :]
            ok = (a[:, :, None] >= 0) & (b[:, None, :] >= 0)
            pair = (a[:, :, None] * E + b[:, None, :])[ok]
            self.counts[layer] += np.bincount(pair, minlength=E * E).reshape(E, E).astype(np.float32)
            self.seen[layer] += np.bincount(a[a >= 0], minlength=E).astype(np.float32)

    def price(self, *, save_ms: float, waste_ms: float, run_ms: float) -> None:
        """What a used read saves, a wasted read costs, and one run of the predictor on a layer costs (ms)."""
        self.save_ms, self.waste_ms, self.run_ms = float(save_ms), float(waste_ms), float(run_ms)

    def begin_step(self, step: int) -> None:
        self.step_reads = 0
        self.pending.clear()
        self.now = step
        self.on = self.wake_at <= step
        self.probing |= self.on & (self.wake_at > 0)
        self.wake_at[self.on] = 0

    def runs(self, layer: int) -> bool:
        """Whether the predictor runs on ``layer`` this step: predicts for it or learns from ``layer - depth``."""
        S, d = len(self.on), self.depth
        return bool((layer < S and layer + d < self.layers and self.on[layer])
                    or (d <= layer < S + d and self.on[layer - d]))

    def predict(self, layer, rows, future=None):
        left = int(self.budget) - self.step_reads
        if left <= 0 or layer >= len(self.counts) or not self.on[layer]:
            return []
        return _gated_rank(self.counts[layer], self.seen[layer], _pack(rows), self.min_seen, self.threshold, left)

    def issued(self, layer, ids) -> None:
        self.step_reads += len(ids)
        self.pending.setdefault(layer + self.depth, []).extend(ids)

    def observe(self, layer, rows, target_rows):
        if layer >= len(self.on) or not self.on[layer]:
            return
        known, picked = _count(self.counts[layer], self.seen[layer], None, _pack(rows, target_rows), self.min_seen)
        ids = self.pending.pop(layer + self.depth, None) or ()
        truth = set()
        for b in target_rows:
            truth.update(b)
        used = sum(1 for e in ids if e in truth)
        self.learned[layer] += 1
        if 2 * known >= picked or self.learned[layer] > self.learn:
            # judged once most of the picks it predicts from have been seen min_seen times (or after ``learn`` runs):
            # a layer still learning issues little because it knows little, not because routing is unpredictable
            self._verdict(layer, used * self.save_ms - (len(ids) - used) * self.waste_ms - self.run_ms)
        if not ids:
            return
        for e in ids:
            self.precision += self.alpha * ((1.0 if e in truth else 0.0) - self.precision)
        if self.precision < self.target:
            self.threshold = min(0.99, self.threshold + self.step)
            self.budget = max(1.0, self.budget / 2)
        else:
            self.budget = min(self.max_budget, self.budget + 1.0)
            if self.precision > self.target + 0.1:
                self.threshold = max(self.floor, self.threshold - self.step / 2)

    def _verdict(self, layer: int, gain: float) -> None:
        """Book one run's gain; at the end of a verdict's span, keep the layer awake or put it to sleep."""
        self.gain[layer] += gain
        self.nruns[layer] += 1
        if self.nruns[layer] < (self.probe if self.probing[layer] else self.patience):
            return
        g = self.gain[layer]
        pays = g > 0 or (g == 0 and self.run_ms == 0)
        if pays:
            if self.probing[layer]:
                self.sleep[layer] = self.sleep0
        else:
            if self.probing[layer]:
                self.sleep[layer] = min(self.max_sleep, 2 * self.sleep[layer])
            self.wake_at[layer] = self.now + self.sleep[layer]
        self.probing[layer] = False
        self.gain[layer], self.nruns[layer] = 0.0, 0


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
    if kind == "gated":
        kw = {k: float(pf[k]) for k in ("threshold", "target") if pf.get(k) is not None}
        if pf.get("read_budget") is not None:
            kw["max_budget"] = float(pf["read_budget"])
        return GatedPredictor(layers, experts, depth, **kw)
    raise ValueError(f"policy.prefetch.predictor: expected 'recall', 'transition', 'gated' or 'none', got {kind!r}")
