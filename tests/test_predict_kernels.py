"""The counting predictors' compiled calls against numpy transcripts of their arithmetic (fakes of this test only):
the same rankings and the same counts, exactly, on random routing with repeated ids, empty rows and masked layers."""
import numpy as np
import pytest

from moetier.core.predict import GatedPredictor, TransitionPredictor


def _ref_transition_rank(pred, layer, rows):
    c = pred.counts[layer]
    score = pred.pop[layer + pred.depth] * 1e-3
    for r in rows:
        score = score + c[r].sum(axis=0)
    return np.argsort(-score, kind="stable").tolist()


def _ref_count(c, n, rows, target_rows, min_seen):
    known = picked = 0
    for a, b in zip(rows, target_rows):
        if n is not None:
            known += int((n[a] >= min_seen).sum())
        picked += len(a)
        c[np.ix_(a, b)] += 1.0
        if n is not None:
            n[a] += 1.0
    return known, picked


def _ref_gated_rank(pred, layer, rows, left):
    c, n = pred.counts[layer], pred.seen[layer]
    miss = np.ones(pred.experts, dtype=np.float64)
    for r in rows:
        ok = [a for a in r if n[a] >= pred.min_seen]
        if ok:
            miss *= np.prod(1.0 - c[ok] / n[ok][:, None], axis=0)
    prob = 1.0 - miss
    cand = np.flatnonzero(prob >= pred.threshold)
    return cand[np.argsort(-prob[cand], kind="stable")][:left].tolist()


def _rows(rng, E, K, skewed):
    n = int(rng.integers(1, 5))
    out = []
    for _ in range(n):
        k = int(rng.integers(0, K + 1))
        p = skewed if rng.random() < 0.8 else None
        out.append(rng.choice(E, k, p=p).tolist())       # with replacement: repeated ids in a row
    return out


@pytest.mark.parametrize("seed", range(4))
def test_transition_predictor_ranks_and_counts_as_numpy(seed):
    rng = np.random.default_rng(seed)
    E, K, layers = 24, 4, 3
    skewed = rng.dirichlet(np.full(E, 0.3))
    pred, ref = TransitionPredictor(layers, E), TransitionPredictor(layers, E)
    for _ in range(300):
        layer = int(rng.integers(0, layers - 1))
        rows, nxt = _rows(rng, E, K, skewed), _rows(rng, E, K, skewed)
        assert list(pred.predict(layer, rows)) == _ref_transition_rank(ref, layer, rows)
        pred.observe(layer, rows, nxt)
        _ref_count(ref.counts[layer], None, rows, nxt, 0)
        for b in nxt:
            ref.pop[layer + 1][b] += 1.0
        assert np.array_equal(pred.counts, ref.counts) and np.array_equal(pred.pop, ref.pop)


@pytest.mark.parametrize("seed", range(4))
def test_gated_predictor_ranks_and_counts_as_numpy(seed):
    rng = np.random.default_rng(seed)
    E, K, layers = 24, 4, 3
    skewed = rng.dirichlet(np.full(E, 0.3))
    pred = GatedPredictor(layers, E, min_seen=3, threshold=0.3)
    c, n = pred.counts.copy(), pred.seen.copy()
    issued = 0
    for step in range(300):
        layer = int(rng.integers(0, layers - 1))
        rows, nxt = _rows(rng, E, K, skewed), _rows(rng, E, K, skewed)
        left = int(rng.integers(0, 6))
        pred.threshold = float(rng.uniform(0.05, 0.6))
        pred.budget, pred.step_reads = float(left), 0
        got = list(pred.predict(layer, rows))
        assert got == _ref_gated_rank(pred, layer, rows, left)
        issued += len(got)
        known, picked = _ref_count(c[layer], n[layer], rows, nxt, pred.min_seen)
        assert (known, picked) == _count_of(pred, layer, rows, nxt)
        assert np.array_equal(pred.counts, c) and np.array_equal(pred.seen, n)
    assert issued > 50            # the thresholds let candidates through: the ranking was compared, not only []


def _count_of(pred, layer, rows, nxt):
    from moetier.core.predict import _count, _pack
    return _count(pred.counts[layer], pred.seen[layer], None, _pack(rows, nxt), pred.min_seen)
