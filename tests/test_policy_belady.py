"""Belady over array state (moetier.core.policies.belady) against the dict-and-heap Belady it replaced
(tests/policy_references.RefBelady), operation by operation while the clock moves: the same victims and bypasses
under pins, through ``victim(k, ok)``, ``evict_for`` and ``put``, the same resident sets, keys used without a hit
refreshed where they come up, hits batched or single, heaps rebuilt past 4 x the residents; and the known optimum
on small traces."""
import numpy as np
import pytest

from moetier.core.policies import residency as P
from moetier.core.policies.belady import BeladyPolicy, Future
from tests.policy_references import RefBelady


def _uses(rng, keys, base, span):
    fut = {}
    for pos in range(span):
        for k in rng.choice(keys, size=3, replace=False):
            fut.setdefault(base + int(k), []).append(pos)
    return fut


def _drive(seed, cap, keys, base=0, shared=False):
    rng = np.random.default_rng(seed)
    fut = _uses(rng, keys, base, 2000)
    pol = BeladyPolicy(cap, Future(fut, base + keys) if shared else fut, base=base, width=8)
    ref = RefBelady(cap, fut)
    now = -1
    for step in range(4000):
        if rng.random() < 0.3:
            now += int(rng.integers(1, 3))
            pol.now = ref.now = now
        op = rng.integers(0, 10)
        k = int(base + rng.integers(0, keys))
        pinned = set((base + rng.integers(0, keys, rng.integers(0, 5))).tolist())
        pins = np.array(sorted(pinned), np.int64)
        if op < 2:
            incoming = k if op == 1 else None
            v = pol.victim(incoming, lambda x: x not in pinned)
            assert v == ref.victim(incoming, lambda x: x not in pinned), step
        elif op < 4 and k not in ref:
            rv = ref.victim(k, lambda x: x not in pinned) if len(ref) >= cap else -1
            got = pol.put(k, pins)
            if rv == -1:
                ref.insert(k)
                assert got == -1, step
            elif rv is None or rv == k:
                assert got == k, step
            else:
                ref.remove(rv)
                ref.insert(k)
                assert got == rv, step
        elif op < 5 and k not in ref and len(ref):
            rv = ref.victim(k, lambda x: x not in pinned)
            got = pol.evict_for(k, pins)
            if rv is None or rv == k:
                assert got is None, step
            else:
                ref.remove(rv)
                ref.insert(k)
                assert got == rv, step
        elif op < 6:
            pol.remove(k)
            ref.remove(k)
        elif op < 8:
            ks = (base + rng.integers(0, keys, rng.integers(1, 6))).tolist()
            pol.hit_many(ks)
            for x in ks:
                ref.hit(x)
        elif len(ref) < cap or k in ref:
            pol.insert(k)
            ref.insert(k)
        assert len(pol) == len(ref), step
    assert sorted(x for x in range(base, base + keys) if x in pol) == sorted(ref.res)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cap", [3, 12])
def test_array_belady_evicts_as_the_heap_belady(seed, cap):
    _drive(seed, cap, 30, base=64 * (seed % 2), shared=seed >= 2)


def test_one_future_one_clock_for_every_part():
    fut = Future({0: [5], 9: [3]}, 16)
    pol = P.partitioned("belady", 4, 2, 8, fut)
    fut.now[0] = 4                                  # one write: both parts see it
    assert [p.next_use(k) for p, k in ((pol.parts[0], 0), (pol.parts[1], 9))] == [5.0, float("inf")]
    pol.parts[1].now = 6
    assert pol.parts[0].next_use(0) == float("inf")


def test_a_key_below_its_part_is_refused():
    with pytest.raises(ValueError, match="below"):
        P.partitioned("belady", 4, 2, 8, {}).parts[1].insert(2)
