"""The Numba EXL3 expert kernel (backends/cpu/exl3.py) against the numpy reference (moetier/bytes/exl3.py).

Shapes are small (a band and a half of tiles) to keep compile and run time modest; 24 tile columns exercise both a
full NB-tile band and a partial one."""

import numpy as np
import pytest

pytest.importorskip("numba", reason="the CPU backend needs numba (the `cpu` extra)")

from backends.cpu import exl3 as C  # noqa: E402
from moetier.bytes import exl3 as X  # noqa: E402

COLS = 16 * (C.NB + C.NB // 2)


def _rel_rms(a, ref):
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - ref) ** 2) / np.mean(ref ** 2)))


@pytest.mark.parametrize("codebook", X.CODEBOOKS)
@pytest.mark.parametrize("K", X.KS)
def test_decoded_inner_weights_are_bit_exact(K, codebook):
    rng = np.random.default_rng(10 * K + X.codebook_index(codebook))
    trellis = X.random_trellis(rng, 48, COLS, K)     # 3 tile rows: an odd last step
    ref = X.decode_inner(trellis, codebook).astype(np.float32)
    assert np.array_equal(C.decode_inner(trellis, codebook), ref)
    if codebook == "mul1":   # the arithmetic mul1 decode and the table agree
        assert np.array_equal(C.decode_inner(trellis, codebook, table=True), ref)


@pytest.mark.parametrize("nt", [3, 13, 21])
def test_bands_of_any_tile_count_decode_bit_exactly(nt):
    """The band gather moves 8 tiles x 8 words at a time through vector shuffles and the last nb % 8 tiles word by
    word: tile counts that are not multiples of 8, at the smallest and largest word counts (K 1 and 8)."""
    rng = np.random.default_rng(40 + nt)
    for K in (1, 3, 8):
        trellis = X.random_trellis(rng, 32, 16 * nt, K)
        assert np.array_equal(C.decode_inner(trellis), X.decode_inner(trellis).astype(np.float32))


def test_transpose8_moves_each_word_to_its_transposed_place():
    from backends.cpu.exl3_ops import transpose8
    from numba import njit

    @njit
    def run(src, so, ss, dst, do, ds):
        transpose8(src, so, ss, dst, do, ds)
    src = np.random.default_rng(41).integers(0, 2**32, 600, dtype=np.uint64).astype(np.uint32)
    dst = np.zeros(900, np.uint32)
    run(src, np.uint64(5), np.uint64(24), dst, np.uint64(3), np.uint64(100))
    want = np.zeros_like(dst)
    for a in range(8):
        want[3 + 100 * np.arange(8) + a] = src[5 + 24 * a: 5 + 24 * a + 8]
    assert np.array_equal(dst, want)


def test_next_step_prefetch_touches_every_line_of_the_band_rows():
    """The offsets the kernel prefetches a step ahead cover every 64-byte line of the next step's band words (R
    rows of nb tiles), whatever the words' alignment to lines, and stop at the last tile row."""
    from backends.cpu.exl3_band import _next_lines
    kt, nt, nw, j0, nb, R = 5, 40, 24, 8, 21, 2
    pf = np.empty(R * (nb * nw // 16 + 2), np.uint64)
    for i1, rows in ((2, (2, 3)), (4, (4,)), (5, ())):
        n = _next_lines(nt, nw, j0, nb, i1, R, kt, pf)
        for skew in range(16):        # the array's first word at each word of a line
            got = {(skew + int(w)) // 16 for w in pf[:n]}
            want = {(skew + w) // 16 for i in rows for w in range((i * nt + j0) * nw, (i * nt + j0 + nb) * nw)}
            assert got == want


@pytest.mark.parametrize("codebook", X.CODEBOOKS)
def test_one_hot_raw_gemm_is_bit_exact(codebook):
    rng = np.random.default_rng(20)
    lin = X.random_linear(rng, 256, COLS, K=3, codebook=codebook)
    rows = np.array([0, 5, 130, 255])
    hot = np.zeros((4, 256), np.float32)
    hot[np.arange(4), rows] = 1.0
    got = C.raw_gemm(hot, lin)
    assert np.array_equal(got, X.raw_gemm(hot, lin).astype(np.float32))


@pytest.mark.parametrize("mode", C.MODES)
def test_one_token_fused_decode_gives_the_bits_of_the_batched_path(mode):
    """A one-row mul1 GEMM decodes inside its FMA loop; a batch decodes each tile position first: same products,
    same order, so each row of a batch equals that row alone, bit for bit, in either thread team."""
    rng = np.random.default_rng(23)
    lin = X.random_linear(rng, 256, COLS, K=3)
    xh = rng.standard_normal((3, 256)).astype(np.float32)
    batch = C.raw_gemm(xh, lin, mode=mode)
    for r in range(3):
        assert np.array_equal(C.raw_gemm(xh[r:r + 1], lin, mode=mode)[0], batch[r])
        assert np.array_equal(C.raw_gemm(xh[r:r + 1], lin, mode=mode, parallel=False)[0], batch[r])


@pytest.mark.parametrize("nt", [8, 40, 72, 160])
def test_band_widths_cover_every_tile_in_lane_steps(nt):
    """Bands are whole lane steps of at most NB tiles, and split the output among the threads where it is wide
    enough; a narrow output (Qwen's 640 columns: 40 tiles) still computes every column."""
    for threads in (1, 2, 4):
        w = C._band_width(nt, threads)
        assert w % C.LANES == 0 and C.LANES <= w <= C.NB
        if nt > C.LANES:                       # more than one lane step: no thread of two is left without a band
            assert -(-nt // w) >= min(threads, 2)
    rng = np.random.default_rng(27)
    lin = X.random_linear(rng, 128, 16 * nt, K=3)     # Hadamard blocks: multiples of 128 (8 tiles)
    xh = rng.standard_normal((1, 128)).astype(np.float32)
    ref = X.raw_gemm(np.eye(128, dtype=np.float32), lin).astype(np.float32)
    assert np.array_equal(C.raw_gemm(np.eye(128, dtype=np.float32), lin, parallel=False), ref)
    assert np.allclose(C.raw_gemm(xh, lin), xh.astype(np.float64) @ ref, rtol=1e-5, atol=1e-4)


def test_affine_raw_gemm_agrees_with_the_exact_path():
    rng = np.random.default_rng(21)
    lin = X.random_linear(rng, 256, COLS, K=3)
    xh = rng.standard_normal((2, 256)).astype(np.float32)
    ref = X.raw_gemm(xh, lin)
    affine = C.raw_gemm(xh, lin, mode="affine")
    assert _rel_rms(affine, ref) < 5e-4     # the unrounded weights: about 2e-4 measured
    assert not np.array_equal(affine, C.raw_gemm(xh, lin))
    with pytest.raises(ValueError, match="mul1"):
        C.raw_gemm(xh, X.random_linear(rng, 256, 128, codebook="mcg"), mode="affine")


@pytest.mark.parametrize("mode", C.MODES)
def test_full_expert_within_2e3_of_float64(mode):
    rng = np.random.default_rng(22)
    ex = X.random_expert(rng, 256, COLS, K=3)
    x = (rng.standard_normal((3, 256)) * 0.5).astype(np.float32)
    weights = np.array([0.7, 0.2, 1.0], np.float32)
    ref = X.expert_forward(x, ex, act_limit=10.0, routing_weight=weights, routed_scaling_factor=2.5)
    got = C.expert_forward(ex, x, act_limit=10.0, routing_weight=weights, routed_scaling_factor=2.5, mode=mode)
    assert got.dtype == np.float32 and got.shape == (3, 256)
    assert _rel_rms(got, ref) < 2e-3
    # the fp16 rounding points are where the reference's fp16 option puts them: the kernel is closer to it
    ref16 = X.expert_forward(x, ex, act_limit=10.0, routing_weight=weights, routed_scaling_factor=2.5, fp16=True)
    if mode == "exact":
        assert _rel_rms(got, ref16) < 0.5 * _rel_rms(ref16, ref)   # about 0.3 measured


def test_expert_is_deterministic_across_thread_teams_and_reads_record_bytes_in_place():
    rng = np.random.default_rng(23)
    ex = X.random_expert(rng, 256, COLS, K=4)

    def frozen(lin):   # the arrays a read-only record mapping would give
        def ro(a):
            return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)
        return X.Exl3Linear(ro(lin.trellis), ro(lin.suh), ro(lin.svh), lin.codebook)

    ro_ex = X.Exl3Expert(frozen(ex.gate), frozen(ex.up), frozen(ex.down))
    x = rng.standard_normal((2, 256)).astype(np.float32)
    a = C.expert_forward(ex, x, act_limit=10.0)
    assert np.array_equal(a, C.expert_forward(ro_ex, x, act_limit=10.0, parallel=False))
    assert np.array_equal(a, C.expert_forward(ex, x, act_limit=10.0))


def test_fp16_off_is_plain_fp32():
    rng = np.random.default_rng(24)
    lin = X.random_linear(rng, 128, 128, K=2)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    assert _rel_rms(C.linear_forward(x, lin, fp16=False), X.linear_forward(x, lin)) < 1e-5
    y16 = C.linear_forward(x, lin)
    assert np.array_equal(y16, y16.astype(np.float16).astype(np.float32))


def test_round16_is_numpys_conversion():
    rng = np.random.default_rng(25)
    v = (rng.standard_normal(20000) * np.exp2(rng.integers(-30, 18, 20000))).astype(np.float32)
    edges = np.float32([65504, 65519.99, 65520, 2**-25, 2**-24 * 1.5, -2**-24 * 2.5, 2**-14, np.inf, -0.0, np.nan])
    v = np.concatenate([v, edges])
    with np.errstate(over="ignore"):
        ref = v.astype(np.float16).astype(np.float32)
    got = C.round16(v)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_bad_arguments_name_what_was_expected():
    rng = np.random.default_rng(26)
    ex = X.random_expert(rng, 128, 128)
    with pytest.raises(ValueError, match="mode 'fast'"):
        C.expert_forward(ex, np.zeros((1, 128), np.float32), mode="fast")
    with pytest.raises(ValueError, match=r"x: expected float32 \[rows, 128\]"):
        C.expert_forward(ex, np.zeros((1, 64), np.float32))


@pytest.mark.parametrize("K", [2, 3])
def test_int_stand_in_is_bit_identical_to_the_reference(K):
    rng = np.random.default_rng(30 + K)
    ex = X.random_expert(rng, 256, COLS, K=K)
    x = rng.integers(-7, 8, size=(3, 256))
    weight = np.array([5, -3, 7])
    ref = X.int_expert_forward(x, ex, shift=40, a_max=7, weight=weight)
    assert np.abs(ref).max() > 0
    got = C.int_expert_forward(ex, x, shift=40, a_max=7, weight=weight)
    assert got.dtype == np.int64 and np.array_equal(got, ref)
    assert np.array_equal(C.int_expert_forward(ex, x, shift=40, weight=weight, parallel=False), ref)
    assert np.array_equal(C.int_linear_forward(x, ex.gate), X.int_linear_forward(x, ex.gate))
    with pytest.raises(ValueError, match="expected integers"):
        C.int_linear_forward(x.astype(np.float32), ex.gate)
