"""CUDA backend (CuPy): error paths and kernel compilation run anywhere; the rest needs an NVIDIA GPU.

Without a GPU (CI): constructing CudaBackend raises BackendUnavailable with a clear message (cupy missing, or
``cupy.cuda.is_available()`` False), and the kernel source compiles with nvcc (skipped when nvcc is absent).
With a GPU: numerics per lane vs the float64 reference (both encodings, rows 1..8 and a multi-pass 11), determinism,
tier and batch invariance (gpu and zerocopy lanes give the same bits), push/drain bytes exact, landed/fence/seq
ordering, a failed fill surfacing as TransportError, and a short runtime run on the tiny-ci-cuda recipe that uses
the gpu, zerocopy and cpu lanes.
"""
import copy
import re
import shutil
import sys

import numpy as np
import pytest

from moetier.bytes import expert
from moetier.core import records as spec
from moetier.bytes import store
from moetier.run.contract import BackendUnavailable
from moetier.run.registry import get_backend
from moetier.bytes.expert import reference
from moetier.bytes.transport import FaultPlan, TransportError

from conformance.bounds import BOUNDS, Tally, breaks, nmse
from conformance.conftest import reference_hook


def _why_no_gpu() -> str | None:
    """None with a usable CUDA device, else the reason (cupy is the cuda12/cuda13 extra, not part of CI)."""
    try:
        import cupy
    except ImportError as e:
        return f"cupy not installed (pip install 'moetier[cuda12]'): {e}"
    try:
        return None if cupy.cuda.is_available() else "no CUDA device: cupy.cuda.is_available() is False"
    except Exception as e:
        return f"no CUDA device: {type(e).__name__}: {e}"


NO_GPU = _why_no_gpu()
HAVE_GPU = NO_GPU is None
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason=NO_GPU or "")

RECIPE = "tiny-ci-cuda"


def _model(encoding: str, layers: int = 1, experts: int = 16, hidden: int = 256, ffn: int = 128) -> dict:
    m = copy.deepcopy(spec.load_record("model", "moetier-tiny-ci-int8"))
    m["id"] = f"cuda-test-{encoding}"
    m["moe"].update(layers=layers, experts=experts)
    lay = expert.layout(hidden, ffn, encoding)
    m["moe"]["expert_bytes"] = lay.record_bytes
    m["store"] = {"format": "record", "record_bytes": lay.record_bytes, "hidden": hidden, "ffn": ffn,
                  "encoding": encoding, "layout": lay.to_json()}
    return m


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """The tiny-ci model's store (int8, 256 records); also used by the error-path test."""
    R = spec.resolve(RECIPE)
    d = tmp_path_factory.mktemp("cuda") / "tiny"
    store.pack(R.model, str(d))
    return str(d)


@pytest.fixture(scope="module", params=["int8", "int4g32"])
def enc_store(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda") / request.param
    store.pack(_model(request.param), str(d), seed=3)
    return store.open_store(str(d))


# -- anywhere ------------------------------------------------------------------------------------------------------

def test_unavailable_is_clear(tiny_store):
    """No cupy -> install hint; no device -> says so; with a device, an oversized arena names the sizes."""
    st = store.open_store(tiny_store)
    try:
        import cupy  # noqa: F401
    except Exception:
        with pytest.raises(BackendUnavailable, match="cupy not installed"):
            get_backend("cuda", st, ram_slots=4, vram_slots=2)
        return
    if not HAVE_GPU:
        with pytest.raises(BackendUnavailable, match=r"no CUDA device \(cupy.cuda.is_available\(\) is False\)"):
            get_backend("cuda", st, ram_slots=4, vram_slots=2)
        return
    free, _ = cupy.cuda.runtime.memGetInfo()
    with pytest.raises(BackendUnavailable, match="do not fit in the free device memory"):
        get_backend("cuda", st, ram_slots=4, vram_slots=free // st.record_bytes + 16)


def test_missing_cupy_message(tiny_store, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)       # `import cupy` raises ImportError
    st = store.open_store(tiny_store)
    with pytest.raises(BackendUnavailable, match=r"cupy not installed: pip install 'moetier\[cuda12\]'"):
        get_backend("cuda", st, ram_slots=4, vram_slots=2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kernel_source_compiles_with_nvcc(tmp_path):
    from backends.cuda import kernels
    log = kernels.nvcc_check(arch="sm_90", workdir=str(tmp_path))
    for name in kernels.KERNEL_NAMES:
        assert f"entry function '{name}'" in log
    assert not re.search(r"[1-9][0-9]* bytes spill stores", log), log


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_exl3_kernel_source_compiles_with_nvcc(tmp_path):
    """The EXL3 kernels (backends/cuda/exl3.py) compile; they run in the conformance EXL3 section where a GPU is."""
    from backends.cuda import exl3, kernels
    log = kernels.nvcc_check(arch="sm_90", workdir=str(tmp_path), source=exl3.SOURCE)
    for name in exl3.KERNEL_NAMES:
        assert f"entry function '{name}'" in log
    assert not re.search(r"[1-9][0-9]* bytes spill stores", log), log


# -- GPU -----------------------------------------------------------------------------------------------------------

def _backend(st, ram=32, vram=16, **kw):
    return get_backend("cuda", st, ram_slots=ram, vram_slots=vram, **kw)


def _load(be, keys):
    """Fill keys into RAM slots 0.. and push them to VRAM slots 0..; returns the record bytes per key."""
    for i, k in enumerate(keys):
        be.wait(be.fill(k, i))
    for i, k in enumerate(keys):
        be.wait(be.push(k, i, i))
    return {k: be.ram_view(i)[:be.record_bytes].copy() for i, k in enumerate(keys)}


@needs_gpu
def test_numerics_per_lane_vs_reference(enc_store):
    st = enc_store
    lay = st.layout
    be = _backend(st)
    try:
        keys = list(range(8))
        recs = _load(be, keys)
        x = np.random.default_rng(5).standard_normal((16, lay.hidden)).astype(np.float32)
        for lane in ("gpu", "zerocopy"):
            tally = Tally(lay.encoding)
            for n in (1, 2, 3, 4, 5, 6, 7, 8, 11):
                jobs = [(k, i, list(range(i, i + n))) for i, k in enumerate(keys[:4])]
                out = be.compute(lane, jobs, x)
                for k, _, rows in jobs:
                    ref = reference(lay, recs[k], x[rows].astype(np.float64))
                    assert out[k].shape == (n, lay.hidden) and out[k].dtype == np.float32
                    tally.add(out[k], ref, f"{lane} {lay.encoding} rows={n} key={k}")
            assert not tally.failures(), tally.failures()
    finally:
        be.close()


@needs_gpu
def test_glm_geometry_int4g32_one_expert():
    """H=4096, F=2048 int4g32 (15.7 MB record): every lane iterates several groups; NMSE vs reference."""
    import tempfile

    import cupy
    lay = expert.layout(4096, 2048, "int4g32")
    m = _model("int4g32", layers=1, experts=1, hidden=4096, ffn=2048)
    with tempfile.TemporaryDirectory() as d:
        store.pack(m, d + "/s")
        s = store.open_store(d + "/s")
        be = _backend(s, ram=2, vram=1)
        try:
            recs = _load(be, [0])
            x = np.random.default_rng(2).standard_normal((3, 4096)).astype(np.float32)
            for lane in ("gpu", "zerocopy"):
                y = be.compute(lane, [(0, 0, [0, 1, 2])], x)[0]
                assert not breaks("int4g32", y, reference(lay, recs[0], x.astype(np.float64))), lane
            d_rec = cupy.asarray(recs[0])
            y2 = be.forward_ptrs([int(d_rec.data.ptr)], [np.arange(3)], x)
            assert np.array_equal(y2, be.compute("gpu", [(0, 0, [0, 1, 2])], x)[0])
        finally:
            be.close()


@needs_gpu
def test_deterministic_and_tier_and_batch_invariant(enc_store):
    st = enc_store
    be = _backend(st)
    try:
        keys = list(range(6))
        _load(be, keys)
        x = np.random.default_rng(9).standard_normal((8, st.layout.hidden)).astype(np.float32)
        jobs = [(k, i, [i % 8, (i + 3) % 8]) for i, k in enumerate(keys)]
        a = be.compute("gpu", jobs, x)
        b = be.compute("gpu", jobs, x)
        z = be.compute("zerocopy", jobs, x)
        rev = be.compute("gpu", list(reversed(jobs)), x)
        for k, s, rows in jobs:
            one = be.compute("gpu", [(k, s, rows)], x)[k]
            for other in (b[k], z[k], rev[k], one):
                assert np.array_equal(a[k], other), f"key {k}: bits differ"
        if be.capabilities.has("cpu"):
            c = be.compute("cpu", jobs, x)
            for k, _, _ in jobs:
                # both lanes within the bound b of the reference: their difference within (2 sqrt(b))^2
                assert nmse(c[k], a[k].astype(np.float64)) < 4 * BOUNDS[st.layout.encoding].nmse
    finally:
        be.close()


@needs_gpu
def test_push_bytes_exact_and_drain_returns_them(tiny_store):
    st = store.open_store(tiny_store)
    be = _backend(st, ram=8, vram=4)
    try:
        rb = st.record_bytes
        with open(st.data_path, "rb") as f:
            f.seek(st.offset(7))
            want = np.frombuffer(f.read(rb), np.uint8)
        be.wait(be.fill(7, 0))
        h = be.push(7, 0, 2)
        be.wait(h)
        assert be.landed(h)
        assert np.array_equal(be.read_vram(2), want)
        be.ram_view(5)[:] = 0
        d = be.drain(7, 2, 5)
        be.wait(d)
        assert np.array_equal(be.ram_view(5)[:rb], want)
        st_ = be.stats
        assert st_["pushes"] == 1 and st_["drains"] == 1 and st_["push_bytes"] == rb
    finally:
        be.close()


@needs_gpu
def test_landed_fence_and_seq_ordering(tiny_store):
    st = store.open_store(tiny_store)
    be = _backend(st, ram=16, vram=8)
    try:
        hs = []
        for i in range(8):
            hs.append(be.fill(i, i))
        for h in hs:
            assert isinstance(be.landed(h), bool)     # non-blocking poll
        for i in range(8):
            be.wait(hs[i])
            hs.append(be.push(i, i, i))
        hs.append(be.drain(3, 3, 12))
        seqs = [h.seq for h in hs]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert be.completed_seq() <= seqs[-1]
        be.fence()
        assert all(be.landed(h) for h in hs)
        assert be.completed_seq() == seqs[-1]
        # a push after a drain of the same VRAM slot sees the drained bytes intact (same copy stream)
        p = be.push(3, 12, 3)
        be.wait(p)
        assert np.array_equal(be.read_vram(3), be.ram_view(3)[:st.record_bytes])
    finally:
        be.close()


@needs_gpu
def test_failed_fill_raises_transport_error(tiny_store):
    st = store.open_store(tiny_store)
    be = _backend(st, ram=4, vram=2, faults=FaultPlan(eio={5}))
    try:
        h = be.fill(5, 0)
        with pytest.raises(TransportError):
            be.wait(h)
        with pytest.raises(TransportError):
            be.landed(h)
        assert be.completed_seq() == h.seq
    finally:
        be.close()


@needs_gpu
def test_runtime_run_uses_every_lane(tiny_store):
    from moetier.run import runtime
    from moetier.traces.format import load_trace
    R = spec.resolve(RECIPE)
    st = store.open_store(tiny_store, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    tally = Tally(R.model["store"]["encoding"])

    digests = []
    for rep in range(2):
        be = get_backend("cuda", st, ram_slots=min(R.keys, R.ram_slots) + 64, vram_slots=R.vram_slots)
        try:
            res = runtime.run(R, st, be, tr, 2, max_steps=10, layer_hook=reference_hook(tally, every=4) if rep == 0 else None)
            stats = be.stats
        finally:
            be.close()
        lanes = res["lanes_ms_per_token"]
        assert lanes["gpu"] > 0 and lanes["zerocopy"] > 0 and lanes["cpu"] > 0, lanes
        assert res["reads_per_token"] > 0 and not res["lossy"]
        assert res["checksum_failures"] == 0 and res["checksum_checked"] > 0
        assert stats["pushes"] > 0 and stats["drains"] > 0
        digests.append(res["digests"])
    assert digests[0] == digests[1], "runtime digests differ between two identical runs"
    assert tally.n and not tally.failures(), tally.failures()


class _FakeCudaError(Exception):
    pass


def _fake_cupy(*, major: int, free: int):
    """A fake cupy with one device of compute capability ``major``.0 and ``free`` bytes free: enough of the module
    for CudaBackend's device checks, which run before anything touches device memory."""
    from types import SimpleNamespace as NS
    runtime = NS(CUDARuntimeError=_FakeCudaError, getDeviceCount=lambda: 1,
                 getDeviceProperties=lambda d: {"name": b"Fake GPU", "major": major, "minor": 0},
                 memGetInfo=lambda: (free, 2 * free))
    return NS(cuda=NS(runtime=runtime, driver=NS(CUDADriverError=_FakeCudaError), is_available=lambda: True,
                      Device=lambda d: NS(use=lambda: None)))


@pytest.mark.parametrize("major,free,match", [(5, 1 << 40, "is sm_50; the kernels need dp2a"),
                                              (9, 1 << 10, "do not fit in the free device memory of Fake GPU")])
def test_device_checks_refuse_with_one_reason(tiny_store, monkeypatch, major, free, match):
    """Without a GPU: an old device and a VRAM tier larger than the free memory are refused before any allocation."""
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(major=major, free=free))
    st = store.open_store(tiny_store)
    with pytest.raises(BackendUnavailable, match=match):
        get_backend("cuda", st, ram_slots=4, vram_slots=2)


class _FakeHandle:
    """A fake handle (no GPU here): records its close, or fails it."""

    def __init__(self, fail: bool = False):
        self.fail, self.closed = fail, False

    def close(self):
        self.closed = True
        if self.fail:
            raise RuntimeError("fake: the lane failed to close")


def test_close_closes_reader_and_pool_after_a_lane_that_fails():
    """CudaBackend.close's own teardown on a backend assembled from fake handles (no GPU to open one): a lane whose
    close fails leaks neither the reader nor the pinned pool, and its error is the one raised."""
    import threading
    from types import SimpleNamespace
    from backends.cuda.backend import CudaBackend
    be = object.__new__(CudaBackend)
    lane, reader, pool = _FakeHandle(fail=True), _FakeHandle(), _FakeHandle()
    be._closed, be.lane, be.reader, be.pool, be._registered, be.cp = False, lane, reader, pool, False, None
    be._slot_event, be.events = threading.Event(), SimpleNamespace(closed=False)
    be.fence = lambda: None
    with pytest.raises(RuntimeError, match="fake: the lane failed"):
        be.close()
    assert reader.closed, "the reader was left open after the lane's failed close"
    assert pool.closed and be.pool is None, "the pinned RAM pool was left open"
    assert be._closed and be.events.closed
