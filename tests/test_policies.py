"""Tier replacement policies: known answers on tiny traces (moetier.core.policies.residency)."""
import itertools
import random

import numpy as np
import pytest

from moetier.core.policies import residency as P
from moetier.traces.stats import belady_hits, lru_hits, next_use


def _future(seq):
    fut = {}
    for i, k in enumerate(seq):
        fut.setdefault(k, []).append(i)
    return fut


def _brute_opt(seq, cap):
    """Most hits any replacement (with bypass) can get, by exhaustive search over every eviction choice."""
    best = 0

    def go(i, cache, hits):
        nonlocal best
        if i == len(seq):
            best = max(best, hits)
            return
        k = seq[i]
        if k in cache:
            go(i + 1, cache, hits + 1)
            return
        if len(cache) < cap:
            go(i + 1, cache | {k}, hits)
            return
        go(i + 1, cache, hits)                    # bypass
        for v in cache:
            go(i + 1, (cache - {v}) | {k}, hits)
    go(0, frozenset(), 0)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_belady_is_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    seq = [rng.randrange(5) for _ in range(11)]
    cap = 2 + seed % 2
    got = P.replay(P.make("belady", cap, _future(seq)), seq)
    assert got == _brute_opt(seq, cap)
    assert got == belady_hits(np.array(seq), cap, next_use(np.array(seq)))


def test_lru_matches_the_trace_stats_lru():
    rng = np.random.default_rng(3)
    seq = rng.zipf(1.3, 3000) % 60
    for cap in (4, 16, 40):
        assert P.replay(P.make("lru", cap), seq.tolist()) == lru_hits(seq, cap)


def _scan_pattern(hot=4, scan=6, rounds=30):
    """Each round uses the hot keys twice, then ``scan`` keys used once. At 8 slots LRU loses the hot set to every
    scan (4 hot + 6 scanned keys between a hot key's uses) and hits only each round's second pass."""
    seq, fresh = [], itertools.count(1000)
    for _ in range(rounds):
        seq += list(range(hot)) * 2 + [next(fresh) for _ in range(scan)]
    return seq


def test_lru_loses_the_hot_set_on_every_scan():
    assert P.replay(P.make("lru", 8), _scan_pattern()) == 4 * 30


@pytest.mark.parametrize("name", ["sieve", "s3fifo", "2q", "slru", "wtinylfu", "lfu", "dlfu"])
def test_scan_resistant_policies_keep_the_hot_set(name):
    # every hot use hits once the hot set has settled in (2Q's A1in needs a second round)
    got = P.replay(P.make(name, 8), _scan_pattern())
    assert 240 - 8 <= got <= 240, (name, got)


def _sieve_reference(seq, cap):
    """SIEVE as the paper writes it, on a plain list (oldest first)."""
    q, vis, hand, hits = [], {}, 0, 0
    for k in seq:
        if k in vis:
            vis[k] = 1
            hits += 1
            continue
        if len(q) >= cap:
            i = hand if hand < len(q) else 0
            while vis[q[i]]:
                vis[q[i]] = 0
                i = i + 1 if i + 1 < len(q) else 0
            del vis[q[i]]
            q.pop(i)
            hand = i if i < len(q) else 0
        q.append(k)
        vis[k] = 0
    return hits


@pytest.mark.parametrize("seed", range(4))
def test_sieve_matches_the_papers_algorithm(seed):
    rng = np.random.default_rng(seed)
    seq = (rng.zipf(1.2, 2000) % 50).tolist()
    for cap in (3, 10, 25):
        assert P.replay(P.make("sieve", cap), seq) == _sieve_reference(seq, cap)


def test_s3fifo_one_hit_wonders_never_reach_main_and_ghosts_return_to_main():
    pol = P.make("s3fifo", 10)            # small queue of 1; before the first eviction a full S sends keys to main
    for k in range(10):
        pol.insert(k)
    q = pol.m
    assert list(q.s) == [0] and list(q.m) == list(range(1, 10))
    v = pol.victim(99, lambda _k: True)
    assert v == 0 and 0 not in q.m        # used once: to the ghost, not to main
    pol.remove(v)
    pol.insert(99)
    assert 0 in q.g and 99 in q.s
    v = pol.victim(0, lambda _k: True)    # the ghost is looked up before S gives 99 up for it
    assert v == 99
    pol.remove(v)
    pol.insert(0)                         # back from the ghost: straight into main
    assert 0 in q.m and 0 not in q.g


def test_pins_are_never_victims_and_all_pinned_gives_none():
    for name in ("lru", "lfu", "dlfu", "2q", "slru", "sieve", "s3fifo", "wtinylfu", "kt-2q", "kt-slru", "kt-sieve",
                 "kt-s3fifo", "kt-wtinylfu"):
        pol = P.make(name, 4)
        for k in range(4):
            pol.insert(k)
        v = pol.victim(9, lambda k: k != 0 and k != 1)
        assert v in (2, 3, 9), (name, v)
        assert pol.victim(9, lambda k: False) in (None, 9), name


def test_partitioned_keeps_each_layer_to_its_share():
    # 2 layers x 4 experts, 4 slots: layer 0 cycling over 3 experts keeps hitting at 2 slots only with LRU's help
    pol = P.partitioned("lru", 4, 2, 4)
    seq = [0, 1, 4, 0, 1, 5, 6, 7, 0, 1]        # layer 1's scan (4..7) cannot push layer 0's keys out
    assert P.replay(pol, seq) == 4
    glob = P.make("lru", 4)
    assert P.replay(glob, seq) == 2


def test_make_refuses_unknown_names_and_belady_without_future():
    with pytest.raises(ValueError):
        P.make("arc", 4)
    with pytest.raises(ValueError):
        P.make("belady", 4)
