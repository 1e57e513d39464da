"""The exl3xpu adapter's backend on its own (over moetier's stand-in for the ops): its memory comes from the op table
(usm_kind says host / device), transfers land exactly the store's bytes, landed() is never early - and a backend that
says so too soon is caught by the same check; drains go through the victim ring in the order of reference 4.4."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from tests.adapter_checks import early_landings, record, tiny_model

pytest.importorskip("safetensors", reason="the tiny checkpoint is written with safetensors (the test extra)")


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    from adapters.exl3xpu import model
    return tiny_model(tmp_path_factory, "exl3xpu-backend", model.write_tiny, 1, tensors=False)[1]


def backend(st, ram=8, vram=4, **kw):
    from adapters.exl3xpu.backend import XpuBackend
    from adapters.exl3xpu.ops import ProvidedOps
    return XpuBackend(st, ProvidedOps(), ram_slots=ram, vram_slots=vram, **kw)


def test_transfers_land_the_store_bytes_and_landed_is_never_early(st):
    be = backend(st)
    keys = [3, 17, 30, 8]
    assert early_landings(be, st, keys) == []
    h = be.drain(keys[0], 0, 5)
    be.wait(h)
    assert np.array_equal(be.ram_view(5)[:st.record_bytes], record(st, keys[0]))
    assert be.completed_seq() == h.seq
    from adapters.exl3xpu import surface
    ops, vram, ram = be.ops, be.vram_address(1), be.ram_address(2)
    assert ops.usm_kind(vram) == surface.USM_DEVICE and ops.usm_kind(ram) == surface.USM_HOST
    be.close()
    del be
    gc.collect()
    assert ops.usm_kind(vram) == ops.usm_kind(ram) == surface.USM_UNKNOWN      # freed with the backend


def test_an_early_landing_backend_is_caught(st):
    from conformance.broken import BrokenLandedEarly
    be = BrokenLandedEarly(backend(st))
    assert ("fill", 3) in early_landings(be, st, [3, 17, 30, 8], pushes=False)   # (it wraps fills only)
    be.close()


def test_cpu_lane_is_moetiers_exl3_kernel_on_the_landed_bytes(st):
    from adapters.engine_lanes import cpu_rows
    from moetier.bytes.expert import exl3_expert
    be = backend(st, ram=2, vram=0)
    be.wait(be.fill(21, 1))
    x = np.random.default_rng(2).standard_normal((3, st.layout.hidden)).astype(np.float32)
    got = be.compute("cpu", [(21, 1, [0, 2])], x)[21]
    want = cpu_rows(x[[0, 2]], exl3_expert(st.layout, record(st, 21)), 0.0)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    be.close()


def test_drain_goes_through_the_victim_ring_in_order(st):
    """A drain claims the VRAM bytes into the ring; nothing reaches the RAM slot or its flag before a host step writes
    the claim back; the ring slot is freed only at the host step after the landing was reported."""
    be = backend(st, ring_slots=2)
    be.wait(be.fill(12, 0))
    be.wait(be.push(12, 0, 1))
    be.ram_view(6)[:] = 0
    h = be.drain(12, 1, 6)
    slot = [i for i, k in enumerate(be.ring.keys()) if k == 12]
    assert len(slot) == 1 and h.state == "pending"
    assert be.victims() == [(slot[0], 12, int(be.ring.seqs()[slot[0]]))]      # found in the lagged meta copy
    assert not be.ram_view(6).any() and be.res[12] == 0                        # claimed, not written back
    be.wait(h)
    assert np.array_equal(be.ram_view(6)[:st.record_bytes], record(st, 12)) and be.res[12] == 1
    assert be.ring.keys()[slot[0]] == 12 and be.victims() == []                 # held until the landing is published
    be.wait(be.drain(12, 1, 7))                                                 # the next host step frees it
    assert be.ring.keys()[slot[0]] == -1 and be.ring.drops == 0
    be.close()


def test_more_drains_than_ring_slots_all_land(st):
    """Host-planned evictions never drop: a full ring is written back and freed before the next claim."""
    be = backend(st, ram=8, vram=4, ring_slots=2)
    keys = [3, 17, 30, 8]
    for s, k in enumerate(keys):
        be.wait(be.fill(k, s))
        be.wait(be.push(k, s, s))
    hs = [be.drain(k, s, 4 + s) for s, k in enumerate(keys)]                  # none waited for
    for s, (k, h) in enumerate(zip(keys, hs)):
        be.wait(h)
        assert np.array_equal(be.ram_view(4 + s)[:st.record_bytes], record(st, k)), k
    assert be.ring.drops == 0 and all(be.res[keys] == 1)
    be.close()


def test_a_key_with_a_write_back_in_flight_is_not_evicted_again(st):
    from moetier.bytes.transport import TransportError
    be = backend(st)
    be.wait(be.fill(5, 0))
    be.wait(be.push(5, 0, 0))
    be.drain(5, 0, 3)
    with pytest.raises(TransportError, match=r"^exl3xpu backend: key 5 already has a write-back in flight \(vr_busy\)"):
        be.drain(5, 0, 4)
    be.close()


def test_close_frees_the_pool_after_a_reader_close_that_fails(st):
    be = backend(st)
    pool, real = be.pool, be.reader.close

    def reader_close_fails():     # a fake failure after the real close: the descriptor is gone either way
        real()
        raise OSError("fake: the reader failed to close")
    be.reader.close = reader_close_fails
    with pytest.raises(OSError, match="fake: the reader failed"):
        be.close()
    assert pool._closed, "the slot pool was left open after the reader's failed close"
    assert be.pool is None and be._host is None
