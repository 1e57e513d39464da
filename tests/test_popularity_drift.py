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


def test_the_replay_counts_a_hand_worked_sequence_exactly():
    """Two slots, one pick a token, under plain LFU: t0 0 enters, t1 1 enters, t2 0 hits (count 2), t3 2 evicts 1
    (count 1 against 2), t4 1 evicts 2 (0 holds count 2, 2 count 1), t5 0 hits. Only tokens past the warm-up
    count."""
    from benchmarks.popularity_drift import _replay
    seq = np.array([[0], [1], [0], [2], [1], [0]])
    core = np.array([True, False, False])
    assert _replay(seq, "lfu", 2, 3, 1, core) == (2, 2, 0)        # hits at t2 and t5; evictions 1, then 2
    core = np.array([False, True, True])
    assert _replay(seq, "lfu", 2, 3, 1, core) == (2, 2, 2)        # both evictions of a core expert
    assert _replay(seq, "lfu", 2, 3, 3, core) == (1, 2, 2)        # warm-up 3: only t5's hit counts


def test_an_unknown_recipe_is_one_line_and_exit_2_before_any_work(capsys):
    """A bad id anywhere in --recipes is refused before the first recipe's replay (minutes on the real traces)."""
    from benchmarks import popularity_drift
    rc = popularity_drift.main(["--recipes", "tiny-ci-cpu,no-such-recipe"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "--recipes" in err and "no-such-recipe" in err and "Traceback" not in err
