"""The array-state (decayed) LFU (moetier.core.policies.lfu) against the dict-and-heap LFU it replaced
(tests/policy_references.RefHeapLFU), operation by operation: the same victims under pins, the same resident sets,
through renormalisations (a half-life of a few uses passes 1e200 within a few thousand uses), batched hits as
single hits, ``replace`` as remove + insert and ``evict_for`` (the heap's walk past pinned keys) as the victim
among the keys not pinned, then remove + insert."""
import numpy as np
import pytest

from moetier.core.policies import residency as P
from moetier.core.policies.lfu import LFU
from tests.policy_references import RefHeapLFU


def _drive(pol, ref, rng, n, keys, base=0, batch=False):
    for step in range(n):
        op = rng.integers(0, 10)
        if op < 2 and len(ref):                      # a victim under pins, then its eviction
            pinned = set((base + rng.integers(0, keys, rng.integers(0, 9))).tolist())
            ok = lambda x: x not in pinned  # noqa: E731
            rv = ref.victim(None, ok)
            k = int(base + rng.integers(0, keys))
            if op == 1 and k not in pinned and k not in ref.res:
                # the tier's eviction for an incoming key: the compiled walk down the heap, past the pins
                v = pol.evict_for(k, np.array(sorted(pinned), np.int64))
                assert v == rv, (step, v, rv)
                if v is not None:
                    ref.remove(v)
                    ref.insert(k)
                continue
            v = pol.victim(None, ok)
            assert v == rv, (step, v, rv)
            if v is not None and op == 1:            # an eviction for an incoming key: one call
                pol.replace(v, k)
                ref.remove(v)
                ref.insert(k)
            elif v is not None:
                pol.remove(v)
                ref.remove(v)
        elif op < 3:
            k = int(base + rng.integers(0, keys))
            pol.remove(k)
            ref.remove(k)
        elif batch and op < 6:
            ks = (base + rng.integers(0, keys, rng.integers(1, 9))).tolist()
            pol.hit_many(ks)
            for k in ks:
                ref.hit(k)
        else:
            k = int(base + rng.integers(0, keys))
            pol.insert(k)
            ref.insert(k)
        assert len(pol) == len(ref)
    assert sorted(k for k in range(base, base + keys) if k in pol) == sorted(ref.res)


@pytest.mark.parametrize("halflife", [0.0, 0.5, 3.0, 40.0])
@pytest.mark.parametrize("batch", [False, True])
def test_array_lfu_evicts_as_the_heap_lfu(halflife, batch):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        _drive(LFU(16, halflife, base=300, width=8), RefHeapLFU(16, halflife), rng, 3000, 40, base=300, batch=batch)


def test_renormalisation_happens_and_keeps_the_order():
    pol, ref = LFU(4, 1.0), RefHeapLFU(4, 1.0)
    for k in list(range(6)) * 200:                   # 1,200 uses at half-life 1: 2^1200 passes 1e200
        pol.hit(k)
        ref.hit(k)
    assert pol.st[0] < 1200                          # the tick restarted
    assert pol.victim(None, lambda _k: True) == ref.victim(None, lambda _k: True)


def test_partitioned_dlfu_batches_per_part_and_rejects_a_key_below_its_part():
    pol = P.partitioned("dlfu", 8, 2, 4)
    pol.hit_many([4, 5, 4])                          # layer 1's part, one compiled call
    pol.hit_many([0, 7])                             # two parts: key by key
    assert [k in pol for k in range(8)] == [True, False, False, False, True, True, False, True]
    with pytest.raises(ValueError, match="below"):
        pol.parts[1].insert(2)
