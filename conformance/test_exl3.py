"""EXL3: each lane's EXL3 kernel against the numpy reference (moetier.bytes.exl3; adapters.md sections 2.4, 2.6).

* decoded W_inner bit-exact on random trellises for every K (1..8) and codebook (3inst, mcg, mul1);
* the raw Hadamard-domain GEMM bit-exact under one-hot activation rows (each output row is one decoded weight row,
  so the summation order cannot matter);
* a full expert from its record bytes (``compute`` on an exl3 store) within the exl3 bounds of conformance.bounds,
  fp16 rounded where the engines round, and bit-identical whichever slot the bytes landed in.

The decode and raw GEMM go through the backend's test hooks ``exl3_decode(lane, trellis, codebook)`` and
``exl3_raw_gemm(lane, xh, trellis, codebook)`` (the trellis copied into the memory that lane reads); a backend
without them skips those checks as NOT_SUPPORTED.
"""
from __future__ import annotations

import numpy as np
import pytest

from conformance import bounds
from conformance import capabilities as caps
from conformance.conftest import NK
from moetier.bytes import exl3
from moetier.run.contract import LANES

ROWS = (1, 3, 8)
KEY_ROWS = 64         # rows per key for its own scale: over 12 rows fp16 rounding alone moves one key's by 3.4e-4


def _lane(be, lane):
    why = caps.lane_skip(be, lane)
    if why:
        pytest.skip(why)


def _hook(be, name):
    f = getattr(be, name, None)
    if not callable(f):
        pytest.skip(f"NOT_SUPPORTED: backend {be.capabilities.name} has no {name} hook")
    return f


def _kit(kits, lane):
    kit = kits("exl3")
    _lane(kit.be, lane)
    return kit


@pytest.mark.parametrize("codebook", exl3.CODEBOOKS)
@pytest.mark.parametrize("lane", LANES)
def test_exl3_decode_bit_exact(kits, lane, codebook):
    """W_inner of random trellises, K = 1..8, bit-for-bit the reference's decode (every value an exact fp16)."""
    be = _kit(kits, lane).be
    decode = _hook(be, "exl3_decode")
    rng = np.random.default_rng([exl3.codebook_index(codebook), 11])
    for K in exl3.KS:
        t = exl3.random_trellis(rng, 48, 272, K)      # 3 x 17 tiles: a partial band of tiles
        got = np.asarray(decode(lane, t, codebook))
        want = exl3.decode_inner(t, codebook).astype(np.float32)
        assert got.dtype == np.float32 and got.shape == want.shape, (K, got.dtype, got.shape)
        bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
        assert not len(bad), f"K={K} {codebook}: {len(bad)} weights differ, first at {bad[0].tolist()}"


@pytest.mark.parametrize("codebook", exl3.CODEBOOKS)
@pytest.mark.parametrize("lane", LANES)
def test_exl3_one_hot_raw_gemm_bit_exact(kits, lane, codebook):
    """xh = one-hot rows (and a scaled one): each output row is one decoded weight row, bit-for-bit."""
    be = _kit(kits, lane).be
    gemm = _hook(be, "exl3_raw_gemm")
    rng = np.random.default_rng([exl3.codebook_index(codebook), 12])
    for K in (2, 3, 5):
        t = exl3.random_trellis(rng, 256, 128, K)
        rows = np.array([0, 17, 128, 255])
        xh = np.zeros((len(rows), 256), np.float32)
        xh[np.arange(len(rows)), rows] = (1.0, -1.0, 0.5, 2.0)
        got = np.asarray(gemm(lane, xh, t, codebook))
        want = (exl3.raw_gemm(xh, exl3.Exl3Linear(t, np.ones(256, np.float16), np.ones(128, np.float16), codebook))
                .astype(np.float32))
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
            f"K={K} {codebook}: one-hot raw GEMM differs in {int((got != want).sum())} of {got.size} outputs"


@pytest.mark.parametrize("lane", LANES)
def test_exl3_expert_vs_float64(kits, lane):
    """compute() on exl3 records: every key, 1/3/8 rows, worst NMSE and best uniform scale vs float64 within the
    exl3 bounds (conformance.bounds), each key's own scale too over KEY_ROWS rows (one key x1.001 moves the scale
    over all of them by 6e-5 only), and not exactly float64: the lane rounds to fp16 where the engines do."""
    from conformance.test_numerics import judge
    kit = _kit(kits, lane)
    x = kit.xrows(8, seed=5)
    tally = bounds.Tally("exl3")
    for m in ROWS:
        out = kit.be.compute(lane, [(k, k, list(range(m))) for k in range(NK)], x)
        for k in range(NK):
            y, ref = out[k], kit.ref(k, x)[:m]
            assert y.dtype == np.float32 and y.shape == ref.shape and np.isfinite(y).all(), (k, m)
            tally.add(y, ref, f"key {k} rows {m}")
    xk = kit.xrows(KEY_ROWS, seed=15)
    out = kit.be.compute(lane, [(k, k, list(range(KEY_ROWS))) for k in range(NK)], xk)
    bad = []
    for k in range(NK):                 # each key against its own bounds, and into the lane's tally
        ref, what = kit.ref(k, xk), f"key {k} rows {KEY_ROWS}"
        bad += bounds.breaks("exl3", out[k], ref, what)
        tally.add(out[k], ref, what)
    judge(tally, lane)
    assert not bad, f"lane {lane} exl3, each key alone: " + "; ".join(bad)
    assert tally.worst > 0, "exactly float64: the lane does not round to fp16 where the engines do"


@pytest.mark.parametrize("lane", LANES)
def test_exl3_deterministic_and_slot_invariant(kits, lane):
    """Same bytes + same rows -> same bits: a repeat, one expert alone vs in a batch, and the bytes filled into
    another RAM slot (RAM lanes) or pushed into another VRAM slot (gpu lane)."""
    kit = _kit(kits, lane)
    be, x = kit.be, kit.xrows(4, seed=6)
    jobs = [(k, k, list(range(k % 4 + 1))) for k in range(NK)]
    a = be.compute(lane, jobs, x)
    b = be.compute(lane, jobs, x)
    solo = be.compute(lane, [jobs[3]], x)
    assert all(a[k].tobytes() == b[k].tobytes() for k in range(NK)) and solo[3].tobytes() == a[3].tobytes()
    k, other = NK - 1, NK + 1
    if lane == "gpu":
        be.wait(be.push(k, k, other))
    else:
        be.wait(be.fill(k, other))
    moved = be.compute(lane, [(k, other, jobs[k][2])], x)
    assert moved[k].tobytes() == a[k].tobytes(), f"lane {lane}: key {k} from another slot differs"


INT_SHIFT, INT_AMAX = 16, 7


def test_exl3_int_layer_bit_identical_whatever_the_lanes(kits):
    """exl3-int (adapters.md 2.6): a routed layer (4 rows x top-3, fixed-point weights) combined in int64 equals
    the numpy integer reference bit for bit, for the all-one-lane assignments and random mixes of the lanes."""
    from conformance.conftest import SEED
    from moetier.bytes.expert import exl3_expert
    kit = kits("exl3")
    be = kit.be
    run = _hook(be, "exl3_int_forward")
    lanes = [ln for ln in LANES if not caps.lane_skip(be, ln)]
    rng = np.random.default_rng([SEED, 21])
    x = rng.integers(-7, 8, size=(4, kit.layout.hidden), dtype=np.int64)
    picks = [rng.choice(NK, size=3, replace=False).tolist() for _ in range(4)]
    w = rng.integers(1, 2**12, size=(4, 3), dtype=np.int64)
    ref = np.zeros_like(x)
    for r, ks in enumerate(picks):
        for j, k in enumerate(ks):
            ref[r] += w[r, j] * exl3.int_expert_forward(x[r:r + 1], exl3_expert(kit.layout, kit.rec(k)), INT_SHIFT,
                                                         INT_AMAX)[0]
    assert np.abs(ref).max() > 0
    keys = sorted({k for ks in picks for k in ks})
    rows_of = {k: [r for r, ks in enumerate(picks) if k in ks] for k in keys}
    assignments = [{k: ln for k in keys} for ln in lanes]
    assignments += [{k: lanes[int(rng.integers(len(lanes)))] for k in keys} for _ in range(3)]
    for assign in assignments:
        out = {}
        for ln in lanes:
            ks = [k for k in keys if assign[k] == ln]
            if ks:
                out.update(run(ln, [(k, k, rows_of[k]) for k in ks], x, INT_SHIFT, INT_AMAX))
        y = np.zeros_like(x)
        for r, ks in enumerate(picks):
            for j, k in enumerate(ks):
                y[r] += w[r, j] * out[k][rows_of[k].index(r)]
        assert y.dtype == np.int64 and np.array_equal(y, ref), f"lanes {assign}: layer output differs from exl3-int"
