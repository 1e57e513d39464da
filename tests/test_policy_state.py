"""The array state of the published policies (moetier.core.policies.queues): a part's arrays grow to the keys it
sees, on either side, without losing a key's place; a run of keys that comes in descending order grows them a bounded
number of times, not once per key."""
import pytest

from moetier.core.policies import residency as P


@pytest.mark.parametrize("name", ["2q", "sieve", "kt-s3fifo", "wtinylfu"])
def test_arrays_grow_both_ways_and_keep_every_key(name):
    pol = P.make(name, 500)
    state = pol.m
    keys = list(range(20_000, 19_000, -1)) + list(range(20_001, 20_400))
    for k in keys:
        pol.insert(k)
        assert state.iv.shape[1] <= 4 * 1400            # doubling, not a doubling per key
    assert len(pol) == len(keys) and all(k in pol for k in keys)      # the tier removed none: all held
    assert state.base <= min(keys) and max(keys) < state.base + state.iv.shape[1]


def test_a_descending_run_grows_the_arrays_a_few_times():
    pol = P.make("slru", 4000)
    state, shapes = pol.m, set()
    for k in range(50_000, 46_000, -1):
        pol.insert(k)
        shapes.add(state.iv.shape[1])
        assert len(shapes) <= 8 and state.iv.shape[1] <= 8192
    assert sorted(pol.resident()) == list(range(46_001, 50_001))
