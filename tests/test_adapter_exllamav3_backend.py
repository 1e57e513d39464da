"""The exllamav3 adapter's backend on its own (torch, no engine kernels): transfers land exactly the store's bytes,
landed() is never early - and a backend that says so too soon is caught by the same check."""
from __future__ import annotations

import numpy as np
import pytest

from tests._exllamav3 import needs_engine
from tests.adapter_checks import early_landings, record, tiny_model

pytestmark = needs_engine


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    from adapters.exllamav3 import checkpoint
    return tiny_model(tmp_path_factory, "exllamav3-backend", checkpoint.write_tiny, 1, tensors=False)[1]


def test_transfers_land_the_store_bytes_and_landed_is_never_early(st):
    from adapters.exllamav3.backend import EngineBackend
    be = EngineBackend(st, ram_slots=8, vram_slots=4)
    keys = [3, 17, 30, 8]
    assert early_landings(be, st, keys) == []
    h = be.drain(keys[0], 0, 5)                       # VRAM slot 0 holds keys[0] since its push
    be.wait(h)
    assert np.array_equal(be.ram_view(5)[:st.record_bytes], record(st, keys[0]))
    assert be.completed_seq() == h.seq
    be.close()


def test_an_early_landing_backend_is_caught(st):
    from adapters.exllamav3.backend import EngineBackend
    from conformance.broken import BrokenLandedEarly
    be = BrokenLandedEarly(EngineBackend(st, ram_slots=8, vram_slots=4))
    assert ("fill", 3) in early_landings(be, st, [3, 17, 30, 8], pushes=False)   # (it wraps fills only)
    be.close()


def test_a_store_of_other_records_is_refused(tmp_path):
    from adapters.exllamav3.backend import EngineBackend
    from moetier.bytes import store
    from moetier.run.contract import BackendUnavailable
    model = {"id": "m", "moe": {"layers": 1, "experts": 2, "topk": 1}, "store": {"hidden": 64, "ffn": 64,
                                                                                  "encoding": "int8"}}
    store.pack(model, tmp_path / "s")
    with pytest.raises(BackendUnavailable, match=r"holds 'int8' records, expected 'exl3'"):
        EngineBackend(store.open_store(tmp_path / "s"), ram_slots=2, vram_slots=0)


def test_cpu_lane_is_the_numba_exl3_kernel_on_the_landed_bytes(st):
    pytest.importorskip("numba", reason="the Numba EXL3 kernel needs numba (the cpu extra)")
    from adapters.exllamav3.backend import EngineBackend
    from backends.cpu import exl3 as kernel
    from moetier.bytes.expert import exl3_expert
    be = EngineBackend(st, ram_slots=2, vram_slots=0)
    be.wait(be.fill(21, 1))
    x = np.random.default_rng(2).standard_normal((3, st.layout.hidden)).astype(np.float32)
    got = be.compute("cpu", [(21, 1, [0, 2])], x)[21]
    want = kernel.expert_forward(exl3_expert(st.layout, record(st, 21)), x[[0, 2]], st.layout.act_limit, fp16=True)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    be.close()
