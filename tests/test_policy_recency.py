"""LRU and FIFO over the LFU's array state (moetier.core.policies.recency) against the ordered-dict queues they
replaced (tests/policy_references.RefQueue), operation by operation as the LFU is driven (tests/test_policy_lfu):
the same victims under pins, the same resident sets, batched hits as single hits, ``evict_for`` past pinned keys;
and the known answers that tell the two orders apart."""
import numpy as np
import pytest

from moetier.core.policies import residency as P
from moetier.core.policies.recency import FIFO, LRU
from tests.policy_references import RefQueue
from tests.test_policy_lfu import _drive

SEQ = [1, 2, 3, 1, 4, 1, 5, 2, 3, 1, 4, 5]


@pytest.mark.parametrize("cls", [LRU, FIFO], ids=["lru", "fifo"])
@pytest.mark.parametrize("batch", [False, True])
def test_array_queue_evicts_as_the_ordered_dict(cls, batch):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        _drive(cls(16, base=300, width=8), RefQueue(cls is LRU), rng, 3000, 40, base=300, batch=batch)


def test_known_answers_tell_lru_from_fifo():
    # 3 slots: LRU keeps 1 (used again before each eviction) and hits it twice; FIFO evicts 1 as the oldest entry
    assert P.replay(P.make("lru", 3), SEQ) == 2
    assert P.replay(P.make("fifo", 3), SEQ) == 1
    fifo = P.make("fifo", 3)
    for k in (1, 2, 3):
        fifo.insert(k)
    fifo.hit(1)                                  # a use does not move a FIFO key
    assert fifo.victim(9, lambda _k: True) == 1
    lru = P.make("lru", 3)
    for k in (1, 2, 3, 1):
        lru.hit(k)
    assert lru.victim(9, lambda _k: True) == 2 and lru.victim(9, lambda k: k != 2) == 3


def test_a_per_layer_split_takes_its_victim_from_the_incoming_keys_layer():
    pol = P.partitioned("lru", 4, 2, 4)
    for k in (0, 1, 4, 5):
        pol.insert(k)
    pol.hit(0)
    assert pol.evict_for(2, np.array([], np.int64)) == 1     # layer 0's least recent
    assert pol.evict_for(6, np.array([4], np.int64)) == 5    # layer 1's, past the pinned key
    assert sorted(k for k in range(8) if k in pol) == [0, 2, 4, 6]
