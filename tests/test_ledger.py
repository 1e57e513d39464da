"""Ledger: CLOCK, exclusive LRU/LFU, host-owned residency through tickets."""
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from moetier.core.ledger import Ledger, ResidencyError, Ticket, TIER_NVME, TIER_RAM, TIER_VRAM


def test_seed_places_hottest_in_vram_then_ram_with_hottest_at_protected_end():
    L = Ledger(100, 2, 3)
    L.seed([10, 11, 12, 13, 14, 15])
    assert [L.tier_of(k) for k in (10, 11)] == [TIER_VRAM, TIER_VRAM]
    assert [L.tier_of(k) for k in (12, 13, 14)] == [TIER_RAM] * 3
    assert L.tier_of(15) == TIER_NVME
    # the coldest seeded RAM key (14) is the first evicted, the hottest (12) the last
    assert L.land(L.begin_fill(50)) == (14,)
    assert L.land(L.begin_fill(51)) == (13,)
    assert L.land(L.begin_fill(52)) == (12,)
    L.check()


def test_resident_only_after_landed():
    L = Ledger(10, 1, 2)
    t = L.begin_fill(3)
    assert L.state_of(3) == "filling" and L.tier_of(3) == TIER_NVME and not L.resident(3)
    L.land(t)
    assert L.state_of(3) == "ram" and L.resident(3)
    p = L.begin_push(3)
    assert L.state_of(3) == "pushing" and L.tier_of(3) == TIER_RAM  # still computed from its RAM copy
    L.land(p)
    assert L.state_of(3) == "vram" and 3 not in L.ram  # exclusive: left RAM on landing


def test_tickets_cannot_be_forged_or_landed_twice():
    L = Ledger(10, 1, 2)
    t = L.begin_fill(1)
    with pytest.raises(ResidencyError):
        L.land(Ticket(t.seq, 1, "fill"))
    L.land(t)
    with pytest.raises(ResidencyError):
        L.land(t)
    with pytest.raises(ResidencyError):
        L.begin_fill(1)  # already resident
    with pytest.raises(ResidencyError):
        L.begin_push(7)  # not in RAM


def test_abort_returns_key_to_where_its_bytes_are():
    L = Ledger(10, 1, 2)
    L.abort(L.begin_fill(4))
    assert L.state_of(4) == "absent"
    L.land(L.begin_fill(4))
    L.abort(L.begin_push(4))
    assert L.state_of(4) == "ram"


def test_clock_never_evicts_protected_and_refuses_when_all_protected():
    L = Ledger(10, 2, 8)
    L.seed([0, 1, 2, 3])
    assert L.begin_push(2, protect={0, 1, 2}) is None
    assert L.state_of(2) == "ram" and L.counters["refused_admissions"] == 1
    t = L.begin_push(2, protect={0, 2})
    assert t.victim == 1 and t.slot == L.clock.slot_of[2]
    # the slot is reserved and the victim leaves VRAM at once; its bytes must drain before the push lands
    assert L.state_of(2) == "pushing" and L.state_of(1) == "draining" and L.state_of(0) == "vram"
    (d,) = L.take_drains()
    assert d.key == 1 and d.slot == t.slot
    L.land(d)
    assert L.land(t) == (2,)  # exclusive: the RAM copy's slot is released
    assert L.state_of(1) == "ram" and L.state_of(2) == "vram"
    L.check()


def test_ram_eviction_skips_protected_and_in_flight():
    L = Ledger(20, 0, 2)
    L.land(L.begin_fill(1))
    L.land(L.begin_fill(2))
    assert L.land(L.begin_fill(3), protect={1}) == (2,)
    # a key mid-push (its RAM copy is being read by the copy engine) is never the victim
    L2 = Ledger(20, 2, 2)
    L2.land(L2.begin_fill(1))
    L2.land(L2.begin_fill(2))
    t = L2.begin_push(1)
    assert L2.state_of(1) == "pushing"
    assert L2.land(L2.begin_fill(3)) == (2,)
    L2.land(t)
    assert L2.state_of(1) == "vram"


def test_lfu_evicts_least_frequent_in_window():
    L = Ledger(20, 0, 3, ram_policy="lfu:3:0")
    for k in (1, 2, 3):
        L.land(L.begin_fill(k))
    L.observe([1, 1, 2, 3, 3], now=0)
    L.observe([1, 3], now=1)
    assert L.land(L.begin_fill(4)) == (2,)
    with pytest.raises(ValueError, match="ram_evict"):
        Ledger(5, 0, 1, ram_policy="mru")


def test_all_in_ram_mode():
    L = Ledger(10, 2, 50)
    assert L.all_in_ram and L.tier_of(7) == TIER_RAM
    L.seed([5, 6])
    assert L.tier_of(5) == TIER_VRAM
    L.land(L.begin_push(7, protect={7, 5}))
    assert L.tier_of(7) == TIER_VRAM and L.tier_of(6) == TIER_RAM


class LedgerMachine(RuleBasedStateMachine):
    """Random transfers landing in random order: a key is resident only after its landed ticket."""

    def __init__(self):
        super().__init__()
        self.L = Ledger(12, 3, 4)
        self.tickets = []
        self.landed_resident = set()

    @rule(k=st.integers(0, 11))
    def fill(self, k):
        if self.L.state_of(k) == "absent":
            self.tickets.append(self.L.begin_fill(k, staging=bool(k % 2)))

    @rule(k=st.integers(0, 11))
    def push(self, k):
        if self.L.state_of(k) in ("ram", "staged"):
            t = self.L.begin_push(k)
            if t is not None:
                self.tickets.append(t)
                self.tickets.extend(self.L.take_drains())

    @precondition(lambda self: self.tickets)
    @rule(i=st.integers(0, 100), protect=st.sets(st.integers(0, 11), max_size=4), fail=st.booleans())
    def complete(self, i, protect, fail):
        t = self.tickets.pop(i % len(self.tickets))
        before = self.L.state_of(t.key)
        if fail:
            self.L.abort(t)
        else:
            self.L.land(t, protect)
        self.tickets.extend(self.L.take_drains())
        assert before in ("filling", "pushing", "draining")

    @invariant()
    def consistent(self):
        self.L.check()
        pending = {t.key for t in self.tickets}
        for k in range(12):
            s = self.L.state_of(k)
            if s in ("filling", "pushing", "draining"):
                assert k in pending
            if k in pending:
                assert s in ("filling", "pushing", "draining")


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
