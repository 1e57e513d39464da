"""exl3xpu's VRAM victim ring from the host side (adapters.exl3xpu.ring): new claims are found once from a lagged
meta copy, and the drain never leaves a RAM page flagged resident before its bytes are there - the race a direct
write-back (flag first) has, which the same observer catches."""
from __future__ import annotations

import numpy as np
import pytest

from adapters.exl3xpu.ring import HEAD, Ring

RB, K, KEYS = 64, 3, 10


def records():
    return np.random.default_rng(0).integers(1, 255, (KEYS, RB), dtype=np.uint8)


class FakeKernel:
    """A fake of exl3xpu's evicting kernel (moe_forward_cached under moe_set_victim_ring): it claims the next free
    ring slot for an evicted key, or drops the eviction when the ring is full."""

    def __init__(self, ring: Ring, recs):
        self.ring, self.recs = ring, recs

    def evict(self, key: int) -> bool:
        r, m = self.ring, self.ring.meta
        keys = r.keys()
        for j in range(r.K):
            i = (int(m[0]) + j) % r.K
            if keys[i] < 0:
                r.buf[i * RB:(i + 1) * RB] = self.recs[key]
                m[1] += 1
                keys[i], r.seqs()[i], m[0] = key, m[1], (i + 1) % r.K
                return True
        m[2] += 1
        return False


def observer(res, pages, recs):
    def check():
        for k in np.flatnonzero(res):
            assert np.array_equal(pages[k], recs[k]), f"RAM page of key {k} flagged resident before its bytes landed"
    return check


def test_claims_are_found_once_from_a_lagged_copy_and_drained_in_order():
    recs = records()
    ring = Ring(K, RB)
    dev = FakeKernel(ring, recs)
    pages, res = np.zeros((KEYS, RB), np.uint8), np.zeros(KEYS, np.uint8)
    assert [dev.evict(k) for k in (4, 7, 2, 9)] == [True, True, True, False]      # ring full: 9 dropped
    assert int(ring.meta[2]) == 1
    lagged = ring.meta.copy()
    found = ring.victims(lagged)
    assert [(s, k) for s, k, _ in found] == [(0, 4), (1, 7), (2, 2)]
    check = observer(res, pages, recs)
    for s, k, q in found:
        assert ring.drain(s, k, q, pages[k], res, set(), after=check)
    assert list(np.flatnonzero(res)) == [2, 4, 7] and list(ring.keys()) == [-1, -1, -1]
    assert ring.victims(lagged) == []                     # the same lagged copy again: nothing new
    assert dev.evict(5) and [(s, k) for s, k, _ in ring.victims(ring.meta.copy())] == [(0, 5)]


def one_claim(key: int):
    """A ring with one claim (key evicted by the fake kernel): (records, ring, its claim, RAM pages, res flags)."""
    recs = records()
    ring = Ring(K, RB)
    FakeKernel(ring, recs).evict(key)
    claim, = ring.victims(ring.meta.copy())
    return recs, ring, claim, np.zeros((KEYS, RB), np.uint8), np.zeros(KEYS, np.uint8)


def test_a_key_with_a_write_back_in_flight_is_left_claimed():
    _, ring, (s, k, q), pages, res = one_claim(3)
    assert not ring.drain(s, k, q, pages[k], res, busy={3})
    assert res[3] == 0 and ring.keys()[s] == 3 and ring.victims(ring.meta.copy()) == [(s, k, q)]


def test_flag_first_write_back_is_caught_by_the_same_observer():
    """BROKEN on purpose (a fake): the direct write-back that sets res before copying the bytes."""
    recs, _, (_, k, _), pages, res = one_claim(6)
    check = observer(res, pages, recs)
    res[k] = 1
    with pytest.raises(AssertionError, match="flagged resident before its bytes landed"):
        check()


def test_meta_of_another_ring_is_refused():
    ring = Ring(K, RB)
    with pytest.raises(ValueError, match=r"victim ring meta: expected int32\[10\] with K=3"):
        ring.victims(np.zeros(HEAD + 2 * 4, np.int32))
