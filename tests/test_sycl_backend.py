"""SYCL backend (backends/sycl): numerics per lane, determinism, tier invariance, copies, handles, a runtime run.

Skipped as a whole, with the reason, when dpctl (the `sycl` extra) is missing or there is no SYCL device; a run that
sets MOETIER_TEST_REQUIRE=sycl (.ci/run) fails instead.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

if not os.environ.get("OCL_ICD_FILENAMES") and os.path.exists(sys.prefix + "/lib/libintelocl.so"):
    os.environ["OCL_ICD_FILENAMES"] = sys.prefix + "/lib/libintelocl.so"  # before dpctl's first device enumeration
from tests._extras import missing  # noqa: E402

try:
    import dpctl  # noqa: E402
except ImportError as e:
    missing("sycl", f"dpctl is not installed ({e})")
try:
    dpctl.select_default_device()
except Exception as e:     # dpctl's SyclDeviceCreationError: no OpenCL CPU runtime or device
    missing("sycl", f"no SYCL device ({e})")

from moetier.bytes import expert  # noqa: E402
from moetier.bytes import store  # noqa: E402
from moetier.run.contract import BackendUnavailable
from moetier.run.registry import get_backend  # noqa: E402

from backends.sycl.backend import SyclBackend  # noqa: E402
from conformance.bounds import Tally  # noqa: E402
from conformance.conftest import poll_landed  # noqa: E402

SEED = 5
H, F = 256, 128
NKEYS = 8


def _model(enc):
    return {"id": f"sycl-{enc}", "moe": {"layers": 2, "experts": 4},
            "store": {"hidden": H, "ffn": F, "encoding": enc}}


@pytest.fixture(scope="module", params=["int8", "int4g32"])
def be(request, tmp_path_factory):
    enc = request.param
    out = tmp_path_factory.mktemp(enc) / "store"
    store.pack(_model(enc), out, seed=SEED)
    st = store.open_store(out, model=_model(enc))
    b = SyclBackend(st, ram_slots=2 * NKEYS, vram_slots=NKEYS)
    for h in [b.fill(k, k) for k in range(NKEYS)]:          # RAM slot k <- key k (NVMe)
        b.wait(h)
    for h in [b.push(k, k, k) for k in range(NKEYS)]:       # device slot k <- RAM slot k
        b.wait(h)
    yield b
    b.close()


def _rec(b, k):
    return np.frombuffer(expert.make_expert(b.layout, k, SEED), np.uint8)


def _x(rows, seed=0):
    return np.random.default_rng([seed, rows]).standard_normal((rows, H)).astype(np.float32)


@pytest.mark.parametrize("lane", ["gpu", "zerocopy", "cpu"])
@pytest.mark.parametrize("rows", range(1, 9))
def test_numerics_vs_reference(be, lane, rows):
    x = _x(rows)
    jobs = [(k, k, list(range(rows))) for k in range(NKEYS)]
    out = be.compute(lane, jobs, x)
    tally = Tally(be.layout.encoding)
    for k in range(NKEYS):
        assert out[k].dtype == np.float32 and out[k].shape == (rows, H)
        tally.add(out[k], expert.reference(be.layout, _rec(be, k), x), f"{lane} rows={rows} key={k}")
    assert not tally.failures(), tally.failures()


def test_device_lanes_match_cpu_lane(be):
    x = _x(5, seed=1)
    jobs = [(k, k, [0, 2, 4] if k % 2 else [1, 3]) for k in range(NKEYS)]
    c = be.compute("cpu", jobs, x)
    for lane in ("gpu", "zerocopy"):
        d = be.compute(lane, jobs, x)
        for k in range(NKEYS):
            assert np.allclose(d[k], c[k], rtol=1e-4, atol=1e-4), (lane, k, float(np.abs(d[k] - c[k]).max()))


def test_deterministic_bit_identical(be):
    x = _x(6, seed=2)
    jobs = [(k, k, list(range(k % 6 + 1))) for k in range(NKEYS)]
    for lane in ("gpu", "zerocopy"):
        a = be.compute(lane, jobs, x)
        b = be.compute(lane, jobs, x)
        for k in range(NKEYS):
            assert a[k].tobytes() == b[k].tobytes()
    # one expert alone gives the same bits as inside a batch
    solo = be.compute("gpu", [jobs[3]], x)
    assert solo[3].tobytes() == a[3].tobytes()


def test_tier_invariance(be):
    """gpu lane from a pushed device slot == zerocopy lane from the NVMe-filled RAM slot, bit for bit; and a
    device slot refilled by drain->push of another RAM slot computes the same bits again."""
    x = _x(4, seed=3)
    jobs = [(k, k, [0, 1, 2, 3]) for k in range(NKEYS)]
    g = be.compute("gpu", jobs, x)
    z = be.compute("zerocopy", jobs, x)
    for k in range(NKEYS):
        assert g[k].tobytes() == z[k].tobytes()
    # key 2 via a different path: NVMe -> RAM slot 12 -> device slot 2 (overwriting the same bytes)
    be.wait(be.fill(2, 12))
    be.wait(be.push(2, 12, 2))
    g2 = be.compute("gpu", [(2, 2, [0, 1, 2, 3])], x)
    z2 = be.compute("zerocopy", [(2, 12, [0, 1, 2, 3])], x)
    assert g2[2].tobytes() == g[2].tobytes() == z2[2].tobytes()


def test_push_lands_exact_bytes(be):
    for k in range(NKEYS):
        assert np.array_equal(be.read_vram(k), _rec(be, k))


def test_drain_returns_pushed_bytes(be):
    k, vslot, ram = 5, 5, 13
    be.pool.view(ram)[:] = 0
    h = be.drain(k, vslot, ram)
    be.wait(h)
    assert be.landed(h)
    assert np.array_equal(be.pool.view(ram)[:be.record_bytes], _rec(be, k))


def test_drain_ordered_before_later_push(be):
    """drain(slot s) then push(other key -> s) back to back: the drain sees the old bytes."""
    old, new, s, ram_in, ram_out = 6, 7, 6, 7, 14
    hd = be.drain(old, s, ram_out)
    hp = be.push(new, ram_in, s)
    be.wait(hp)
    be.wait(hd)
    assert np.array_equal(be.pool.view(ram_out)[:be.record_bytes], _rec(be, old))
    assert np.array_equal(be.read_vram(s), _rec(be, new))
    be.wait(be.push(old, old, s))  # restore
    assert np.array_equal(be.read_vram(s), _rec(be, old))


def test_landed_never_before_readable_and_fence(be):
    hs = []
    for i in range(6):
        hs.append(be.fill(i, 8 + i))
        hs.append(be.push(i, i, i))
    seqs = [h.seq for h in hs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    def check(h):            # the moment a handle first reports landed, its bytes must be there
        if h.kind == "fill":
            assert np.array_equal(be.pool.view(h.slot)[:be.record_bytes], _rec(be, h.key))
        else:
            assert np.array_equal(be.read_vram(h.dst), _rec(be, h.key))

    poll_landed(be, hs, check)
    be.fence()
    assert be.outstanding == 0
    assert be.completed_seq() == seqs[-1]
    assert all(be.landed(h) for h in hs)
    for i in range(6):
        assert np.array_equal(be.pool.view(8 + i)[:be.record_bytes], _rec(be, i))


def test_seq_monotonic_across_kinds(be):
    a = be.fill(0, 15)
    b = be.push(1, 1, 1)
    c = be.drain(1, 1, 14)
    assert a.seq < b.seq < c.seq
    be.fence()
    assert be.completed_seq() >= c.seq


def test_bad_slots_refused(be):
    with pytest.raises(ValueError):
        be.push(0, 0, NKEYS)
    with pytest.raises(ValueError):
        be.compute("zerocopy", [(0, 10**6, [0])], _x(1))


def test_unavailable_without_dpctl():
    import subprocess
    code = ("import sys; sys.modules['dpctl'] = None\n"
            "from moetier.run.contract import BackendUnavailable\n"
            "from moetier.run.registry import get_backend\n"
            "try:\n    get_backend('sycl', None, ram_slots=1, vram_slots=1)\n"
            "except BackendUnavailable as e:\n    print('UNAVAILABLE', e)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert "UNAVAILABLE" in r.stdout and "dpctl not installed" in r.stdout and "moetier[sycl]" in r.stdout, r


def test_empty_rows(be):
    out = be.compute("gpu", [(0, 0, [])], _x(1))
    assert out[0].shape == (0, H)


def test_unavailable_when_arena_too_big(tmp_path):
    out = tmp_path / "s"
    store.pack(_model("int8"), out, seed=SEED)
    st = store.open_store(out, model=_model("int8"))
    with pytest.raises(BackendUnavailable, match="global memory"):
        get_backend("sycl", st, ram_slots=2, vram_slots=10**9)


# --------------------------------------------------------------------------------------------------------------------
# End to end: runtime.run on tiny-ci-sycl


def _run_counting(monkeypatch, st, R, tr, steps):
    from moetier.run import layer as run_layer, runtime
    counts = {k: 0 for k in ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked")}
    orig = run_layer.plan_layer

    def counting(*a, **kw):
        p = orig(*a, **kw)
        for k, v in p.lanes().items():
            counts[k] += len(v)
        return p

    be = get_backend("sycl", st, ram_slots=min(R.keys, R.ram_slots) + 2 * R.topk + 16, vram_slots=R.vram_slots)
    with monkeypatch.context() as mp:
        mp.setattr(run_layer, "plan_layer", counting)
        try:
            res = runtime.run(R, st, be, tr, 1, max_steps=steps)
            stats = be.stats
        finally:
            be.close()
    return res, counts, stats


def test_runtime_tiny_ci_sycl_all_lanes(tmp_path, monkeypatch):
    from moetier.core import records as spec
    from moetier.traces.format import load_trace
    R = spec.resolve("tiny-ci-sycl")
    out = tmp_path / "store"
    store.pack(R.model, out, seed=0)
    st = store.open_store(out, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    r1, c1, s1 = _run_counting(monkeypatch, st, R, tr, 30)
    for lane in ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu"):
        assert c1[lane] > 0, (lane, c1)
    assert s1["pushes"] > 0 and s1["drains"] > 0 and s1["reads"] > 0
    assert r1["checksum_failures"] == 0
    r2, c2, _ = _run_counting(monkeypatch, st, R, tr, 30)
    assert r1["digests"] == r2["digests"]
    assert c1 == c2


def test_serial_engine_plan_parity_and_copy_time(tmp_path):
    """policy.overlap false (lanes and copies one after another): the runtime makes the simulator's decisions on
    the same modeled clock, which now includes the admissions' and drains' copy time."""
    from moetier.run import runtime
    from moetier.core import sim
    from moetier.core import records as spec
    from moetier.traces.format import load_trace
    R = spec.resolve("tiny-ci-sycl", ["policy.overlap=false"])
    out = tmp_path / "store"
    store.pack(R.model, out, seed=0)
    st = store.open_store(out, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    got, want = [], []

    def rec(dst):
        return lambda s, l, p: dst.append((s, l, {k: sorted(v) for k, v in p.lanes().items()}, round(p.ms, 9)))

    be = get_backend("sycl", st, ram_slots=min(R.keys, R.ram_slots) + 2 * R.topk + 16, vram_slots=R.vram_slots)
    try:
        res = runtime.run(R, st, be, tr, 1, max_steps=30, plan_hook=rec(got))
    finally:
        be.close()
    o = sim.run(R, tr, 1, max_steps=30, plan_hook=rec(want))
    assert got == want and res["ledger"] == o["ledger"]
    assert o["ms_copy"] > 0 and any(p["zerocopy"] for *_, p, _ in got)


def test_close_frees_reader_and_arena_after_a_lane_that_fails(tmp_path):
    """A close that fails (here the cpu lane's, through a FAKE close that raises after stopping the lane) leaks
    nothing after it: the reader's file descriptor is closed and the USM arena released; the error is raised."""
    out = tmp_path / "store"
    store.pack(_model("int8"), out, seed=SEED)
    b = SyclBackend(store.open_store(out, model=_model("int8")), ram_slots=2, vram_slots=1)
    b.wait(b.fill(1, 0))
    fd, real_close = b.reader._fd, b.lane.close

    def failing_close():
        real_close()
        raise RuntimeError("fake: the lane failed to close")
    b.lane.close = failing_close
    with pytest.raises(RuntimeError, match="fake: the lane failed"):
        b.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert b.pool._closed and b.pool.u8 is None
