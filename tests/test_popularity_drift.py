"""benchmarks/popularity_drift.py on traces the test writes, where the answer is known. Picks drawn independently
from one Zipf popularity are stationary: plain counts converge on the most popular experts, so a cache ordered by
them hits more and evicts fewer of the request's hot experts than one whose counts halve every 4 x S uses."""
from types import SimpleNamespace

import numpy as np

from benchmarks.popularity_drift import drift
from moetier.traces.format import Trace

E, L, K, S, T = 32, 2, 2, 8, 800


def _fake_recipe_and_trace(seed: int = 0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1)
    ids = np.array([[rng.choice(E, K, replace=False, p=p / p.sum()) for _ in range(L)] for _ in range(T)], np.int32)
    R = SimpleNamespace(experts=E, layers=L, topk=K, ram_slots=S * L, trace="fake", policy={"warmup_tokens": 200})
    return R, Trace(ids=ids, segments=np.array([0, T // 2, T]))


def test_stationary_popularity_keeps_its_top_set_and_lfu_keeps_the_hot_experts():
    x = drift(*_fake_recipe_and_trace())
    assert x["share"] == S and x["halflife"] == 4 * S / K and x["random"] == S / E
    assert x["within"] >= 0.75 and x["across"] >= 0.75     # the same popularity in both windows and both requests
    assert x["hit_lfu"] > x["hit_dlfu"]
    assert x["core_lfu"] < 0.8 * x["core_dlfu"]


def test_a_request_with_other_hot_experts_overlaps_less():
    R, tr = _fake_recipe_and_trace()
    ids = tr.ids.copy()
    ids[T // 2:] = E - 1 - ids[T // 2:]                      # the second request's popularity reversed
    x = drift(R, Trace(ids=ids, segments=tr.segments))
    assert x["across"] <= 0.25 and x["within"] >= 0.75
