"""The exl3xpu adapter's backend on its own (over moetier's provider of the ops): transfers land exactly the store's
bytes, landed() is never early - and a backend that says so too soon is caught by the same check."""
from __future__ import annotations

import numpy as np
import pytest

from tests.adapter_checks import early_landings, record, tiny_model

pytest.importorskip("safetensors", reason="the tiny checkpoint is written with safetensors (the test extra)")


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    from adapters.exl3xpu import model
    return tiny_model(tmp_path_factory, "exl3xpu-backend", model.write_tiny, 1, tensors=False)[1]


def backend(st, ram=8, vram=4):
    from adapters.exl3xpu.backend import XpuBackend
    from adapters.exl3xpu.ops import ProvidedOps
    return XpuBackend(st, ProvidedOps(), ram_slots=ram, vram_slots=vram)


def test_transfers_land_the_store_bytes_and_landed_is_never_early(st):
    be = backend(st)
    keys = [3, 17, 30, 8]
    assert early_landings(be, st, keys) == []
    h = be.drain(keys[0], 0, 5)
    be.wait(h)
    assert np.array_equal(be.ram_view(5)[:st.record_bytes], record(st, keys[0]))
    assert be.completed_seq() == h.seq
    assert be.ops.usm_kind(be.vram_address(1)) == "device" and be.ops.usm_kind(be.ram_address(2)) == "host"
    be.close()
    assert be.ops.usm_kind(be.vram_address(1)) == "unknown"


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
