"""O_DIRECT reader and slot pool: landed bytes, sequence numbers, fences, faults, fallback, alignment."""

import errno
import os
import warnings

import numpy as np
import pytest

from moetier.bytes import expert
from moetier.bytes import store
from moetier.bytes import transport
from moetier.bytes.transport import FaultPlan, PoolExhausted, Reader, SlotPool, TransportError

MODEL = {"id": "tiny", "moe": {"layers": 2, "experts": 4}, "store": {"hidden": 64, "ffn": 64, "encoding": "int8"}}
SEED = 3


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    out = tmp_path_factory.mktemp("t") / "store"
    store.pack(MODEL, out, seed=SEED)
    return store.open_store(out, model=MODEL)


def _fill_all(rd, pool, keys):
    hs = []
    for k in keys:
        hs.append(rd.fill(k, pool.alloc()))
    return hs


def test_landed_bytes_equal_make_expert(st):
    with SlotPool(8, st.record_bytes) as pool, Reader(st, pool, queue_depth=4, verify_rate=1.0) as rd:
        hs = _fill_all(rd, pool, range(8))
        for h in hs:
            rd.wait(h, timeout=10)
            assert rd.landed(h) and h.state == "landed" and h.verified
            got = bytes(pool.view(h.slot)[:st.record_bytes])
            assert got == expert.make_expert(st.layout, h.key, SEED)
        assert rd.stats["reads"] == 8 and rd.stats["checksum_checked"] == 8
        assert rd.stats["bytes"] == 8 * st.record_bytes and rd.stats["read_ms"] > 0


def test_seq_monotonic_completed_seq_and_fence(st):
    with SlotPool(8, st.record_bytes) as pool, Reader(st, pool, queue_depth=3) as rd:
        assert rd.completed_seq() == 0
        hs = _fill_all(rd, pool, [7, 1, 5, 0, 2, 6, 3, 4])
        assert [h.seq for h in hs] == list(range(1, 9))
        rd.fence()
        assert rd.outstanding == 0
        assert all(h.state == "landed" for h in hs)
        assert rd.completed_seq() == 8
        for h in hs:
            pool.free(h.slot)
        h9 = rd.fill(0, pool.alloc())
        assert h9.seq == 9
        rd.wait(h9)
        assert rd.completed_seq() == 9


def test_completed_seq_is_a_watermark(st):
    # seq 1 is held back (its fault callable blocks) while later seqs finish: completed_seq must stay at 0.
    import threading

    gate = threading.Event()

    def faults(key):
        if key == 0:
            gate.wait(10)
        return None

    with SlotPool(4, st.record_bytes) as pool, Reader(st, pool, queue_depth=4, faults=faults) as rd:
        h1 = rd.fill(0, pool.alloc())
        rest = [rd.fill(k, pool.alloc()) for k in (1, 2, 3)]
        for h in rest:
            rd.wait(h, timeout=10)
        assert not rd.landed(h1)
        assert rd.completed_seq() == 0
        gate.set()
        rd.wait(h1, timeout=10)
        assert rd.completed_seq() == 4


def test_wait_timeout(st):
    import threading

    gate = threading.Event()
    with SlotPool(1, st.record_bytes) as pool, Reader(st, pool, queue_depth=1,
                                                      faults=lambda k: gate.wait(10) and None) as rd:
        h = rd.fill(0, 0)
        with pytest.raises(TimeoutError):
            rd.wait(h, timeout=0.05)
        gate.set()
        rd.wait(h, timeout=10)


@pytest.mark.parametrize("kind,counter,match", [
    ("short", "short_reads", r"short read of key 5 .*got \d+ of \d+ bytes"),
    ("eio", "io_errors", r"key 5 .*failed"),
    ("flip", "checksum_failures", r"checksum mismatch for key 5"),
])
def test_faults_surface_and_never_land(st, kind, counter, match):
    plan = FaultPlan(**{kind: {5}})
    with SlotPool(4, st.record_bytes) as pool, Reader(st, pool, queue_depth=2, faults=plan) as rd:
        good = rd.fill(4, pool.alloc())
        bad = rd.fill(5, pool.alloc())
        rd.fence()
        assert rd.landed(good)
        assert bad.state == "failed" and match.split()[0] in bad.error
        with pytest.raises(TransportError, match=match):
            rd.landed(bad)
        with pytest.raises(TransportError, match=match):
            rd.wait(bad)
        # the failed slot is poisoned (zeroed), never left holding plausible bytes
        assert not np.any(pool.view(bad.slot))
        assert rd.stats[counter] == 1 and rd.stats["failures"] == 1 and rd.stats["reads"] == 2
        assert rd.completed_seq() == 2
        assert plan.fired == [(kind, 5)]


def test_flip_undetected_when_not_sampled(st):
    # verify_rate 0: nothing is checked, which is exactly why tests and `moetier verify` use 1.0
    with SlotPool(1, st.record_bytes) as pool, Reader(st, pool, verify_rate=0.0, faults=FaultPlan(flip={2})) as rd:
        h = rd.wait(rd.fill(2, 0))
        assert h.state == "landed" and not h.verified and rd.stats["checksum_checked"] == 0


def test_verify_rate_sampling(st):
    with SlotPool(8, st.record_bytes) as pool, Reader(st, pool, verify_rate=0.25) as rd:
        _fill_all(rd, pool, range(8))
        rd.fence()
        assert rd.stats["checksum_checked"] == 2


def test_fault_once_then_retry_succeeds(st):
    plan = FaultPlan(eio={1}, once=True)
    with SlotPool(1, st.record_bytes) as pool, Reader(st, pool, faults=plan) as rd:
        h = rd.fill(1, 0)
        with pytest.raises(TransportError):
            rd.wait(h)
        h2 = rd.wait(rd.fill(1, 0))
        assert h2.seq == 2 and bytes(pool.view(0)[:st.record_bytes]) == expert.make_expert(st.layout, 1, SEED)


def test_busy_slot_and_bad_args_rejected(st):
    import threading

    gate = threading.Event()
    with SlotPool(2, st.record_bytes) as pool, Reader(st, pool, faults=lambda k: gate.wait(10) and None) as rd:
        rd.fill(0, 0)
        with pytest.raises(TransportError, match="in flight"):
            rd.fill(1, 0)
        with pytest.raises(ValueError):
            rd.fill(99, 1)
        with pytest.raises(ValueError):
            rd.fill(0, 5)
        gate.set()
    with SlotPool(1, 4096) as small:
        if st.record_bytes > 4096:
            with pytest.raises(ValueError, match="slot_bytes"):
                Reader(st, small)


def test_odirect_fallback_warns_once_and_reads(st, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", no_direct)
    monkeypatch.setattr(transport, "_WARNED", set())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with SlotPool(2, st.record_bytes) as pool:
            for _ in range(2):
                with Reader(st, pool) as rd:
                    assert rd.direct is False
                    h = rd.wait(rd.fill(6, 0))
                    assert bytes(pool.view(0)[:st.record_bytes]) == expert.make_expert(st.layout, 6, SEED)
                    assert h.verified
    msgs = [str(x.message) for x in w if "O_DIRECT refused" in str(x.message)]
    assert len(msgs) == 1 and "using buffered reads" in msgs[0]


def test_direct_false_is_buffered(st):
    with SlotPool(1, st.record_bytes) as pool, Reader(st, pool, direct=False) as rd:
        assert rd.direct is False
        rd.wait(rd.fill(0, 0))


def test_direct_is_active_on_this_filesystem(st):
    with SlotPool(1, st.record_bytes) as pool, Reader(st, pool) as rd:
        assert rd.direct is True  # ext4 accepts O_DIRECT; if this fails the fs refused it


def test_slot_pool_alignment_and_views():
    with SlotPool(5, 10000) as pool:
        assert pool.slot_bytes == 12288
        assert pool.addr(0) % (2 * 1024 * 1024) == 0
        for i in range(5):
            assert pool.addr(i) % 4096 == 0
            v = pool.view(i)
            assert v.dtype == np.uint8 and v.size == pool.slot_bytes
            assert v.ctypes.data == pool.addr(i)
            v[:] = i
            del v
        assert pool.view(3)[0] == 3 and pool.view(4)[-1] == 4


def test_slot_pool_alloc_free_exhaustion():
    pool = SlotPool(3, 4096)
    assert pool.nfree == 3
    got = [pool.alloc() for _ in range(3)]
    assert got == [0, 1, 2] and pool.nfree == 0
    with pytest.raises(PoolExhausted):
        pool.alloc()
    pool.free(1)
    assert pool.nfree == 1 and pool.alloc() == 1
    pool.free(2)
    with pytest.raises(ValueError, match="already free"):
        pool.free(2)
    with pytest.raises(ValueError, match="out of range"):
        pool.free(3)
    pool.close()
    with pytest.raises(TransportError):
        pool.alloc()
    pool.close()  # idempotent


def test_slot_pool_hugepage_advice_and_4k_control(st):
    with SlotPool(2, st.record_bytes) as pool:
        assert pool.hugepage is True  # THP is in madvise mode on this machine; advice accepted
    with SlotPool(2, st.record_bytes, hugepage=False) as pool, Reader(st, pool) as rd:
        assert pool.hugepage is False and pool.addr(0) % (2 * 1024 * 1024) == 0
        rd.wait(rd.fill(1, 1))
        assert bytes(pool.view(1)[:st.record_bytes]) == expert.make_expert(st.layout, 1, SEED)


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "unavailable"
    return text[text.index("[") + 1:text.index("]")]


def _smaps_anon_huge_of(addr: int) -> int:
    """AnonHugePages of the one mapping that holds addr, read here independently of the pool's own parser."""
    hit = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            a, b = (int(x, 16) for x in head.split("-"))
            hit = a <= addr < b
        elif hit and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the pool")


@pytest.mark.parametrize("n, slot_bytes", [(1, 1_580_000), (2, 102_400), (3, 9_470_000)])
def test_slot_pool_gets_the_huge_pages_it_reports(n, slot_bytes):
    """A pool of any size, even one smaller than a huge page, is backed by huge pages once touched, and
    huge_bytes() agrees with /proc/self/smaps; the 4 KiB control gets none."""
    if _thp_mode() not in ("madvise", "always"):
        pytest.skip(f"transparent huge pages are '{_thp_mode()}' on this machine")
    with SlotPool(n, slot_bytes) as pool:
        assert pool.huge_bytes() == 0                          # nothing is backed before the first touch
        for i in range(n):
            pool.view(i)[:] = 1
        assert pool.huge_bytes() == pool.nbytes
        whole = -(-pool.nbytes // (2 * 1024 * 1024)) * 2 * 1024 * 1024
        assert _smaps_anon_huge_of(pool.base) == whole
    if _thp_mode() == "madvise":
        with SlotPool(n, slot_bytes, hugepage=False) as pool:
            for i in range(n):
                pool.view(i)[:] = 1
            assert pool.huge_bytes() == 0 == _smaps_anon_huge_of(pool.base)


def test_prefetch_yields_to_demand_and_cancels_until_started(st, monkeypatch):
    """A prefetch read does not start while a demand read is outstanding; until it starts it can be withdrawn."""
    import threading
    gate = threading.Event()
    real_read = Reader._read

    def slow_read(self, slot, offset, nbytes):
        if slot == 0:                      # the demand read holds the disk until the test opens the gate
            gate.wait(5)
        return real_read(self, slot, offset, nbytes)

    monkeypatch.setattr(Reader, "_read", slow_read)
    pool = SlotPool(4, st.record_bytes)
    rd = Reader(st, pool, queue_depth=4)
    try:
        d = rd.fill(0, 0)
        p1 = rd.fill(1, 1, prefetch=True)
        p2 = rd.fill(2, 2, prefetch=True)
        assert not p1.started and rd.cancel(p1)          # still queued behind the demand read: withdrawn
        with pytest.raises(TransportError, match="cancelled"):
            rd.landed(p1)
        gate.set()
        rd.wait(d)
        rd.wait(p2)
        assert d.state == "landed" and p2.state == "landed" and not rd.cancel(p2)
        assert rd.stats["cancelled"] == 1 and rd.completed_seq() == 3
        rd.fence()
    finally:
        rd.close()
        pool.close()


def test_demand_reads_in_flight_together_share_a_burst(st):
    import threading

    gate = threading.Event()
    with SlotPool(3, st.record_bytes) as pool, Reader(st, pool, queue_depth=4,
                                                      faults=lambda k: gate.wait(10) and None) as rd:
        a, b = rd.fill(0, 0), rd.fill(1, 1)           # the second is submitted while the first is in flight
        gate.set()
        rd.wait(a)
        rd.wait(b)
        rd.wait(rd.fill(2, 2))                         # none in flight: a new burst
    got = sorted((burst, q) for burst, q, _ in rd.burst_ms)
    assert got == [(1, 1), (1, 2), (2, 1)]
    assert all(ms > 0 for *_, ms in rd.burst_ms)


def test_a_demand_read_beside_a_prefetch_read_in_service_is_booked_apart(st, monkeypatch):
    """The demand reads that found a prefetch read in service stay out of the depth and burst tables, which then
    describe a device the reads do not share (the channel model gives such a read the plain latency)."""
    import threading
    gate, started = threading.Event(), threading.Event()
    real_read = Reader._read

    def held_read(self, slot, offset, nbytes):
        if slot == 0:                      # the prefetch read stays in service until the test opens the gate
            started.set()
            gate.wait(5)
        return real_read(self, slot, offset, nbytes)

    monkeypatch.setattr(Reader, "_read", held_read)
    with SlotPool(3, st.record_bytes) as pool, Reader(st, pool, queue_depth=4) as rd:
        p = rd.fill(0, 0, prefetch=True)
        assert started.wait(5)
        d = rd.fill(1, 1)                  # submitted while the prefetch read is in service
        rd.wait(d)
        gate.set()
        rd.wait(p)
        alone = rd.fill(2, 2)              # the prefetch read is done: the device is its own again
        rd.wait(alone)
    assert d.pf_busy and not alone.pf_busy
    # only the read that had the device to itself enters the tables the channel model is fitted on
    assert {q: len(v) for q, v in rd.latency_by_qd.items()} == {1: 1}
    assert [(b, q) for b, q, _ in rd.burst_ms] == [(alone.burst, 1)]
    assert set(rd.read_timing()) == {"latency_by_qd", "wake_ms", "burst_ms"}
