"""The EXL3 codec (moetier.bytes.exl3) against exllamav3's golden vectors and against independent spellings of its
spec (adapters.md section 2.3): bit-by-bit state extraction, explicit Hadamard matrices, explicit float64 math."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from moetier.bytes import exl3

ROOT = Path(__file__).resolve().parents[1]


def _oracle_module():
    spec = importlib.util.spec_from_file_location("exl3_golden", ROOT / "tests" / "oracle" / "exl3_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def golden():
    oracle = _oracle_module()
    with np.load(oracle.GOLDEN) as g:
        return oracle, {k: g[k] for k in g.files}


def test_codec_matches_exllamav3_golden_vectors(golden):
    oracle, ref = golden
    assert str(ref["exllamav3_version"]) == "1.6.5"
    assert oracle.compare(ref) == []


@pytest.mark.parametrize("key, corrupt", [
    ("perm", lambda a: np.roll(a, 1)),
    ("cb_mcg_bits", lambda a: a ^ np.uint16(1)),
    ("rot_y", lambda a: a * (1 + 2**-52)),
    ("hot_l", lambda a: -a),
    ("w_full", lambda a: a.T.copy()),
])
def test_golden_comparison_catches_a_corrupted_vector(golden, key, corrupt):
    oracle, ref = golden
    bad = dict(ref)
    bad[key] = corrupt(ref[key])
    assert oracle.compare(bad)


def _states_bit_by_bit(tile: np.ndarray, K: int) -> list[int]:
    """The spec, one bit at a time: little-endian int16 pairs -> uint32 words, concatenated MSB-first into a ring of
    256K bits; state t = the 16 bits ending at bit (t+1)K, circularly, read MSB-first."""
    e = [int(v) & 0xFFFF for v in tile]
    ring = []
    for i in range(8 * K):
        word = e[2 * i] | (e[2 * i + 1] << 16)
        ring += [(word >> (31 - b)) & 1 for b in range(32)]
    states = []
    for t in range(256):
        end = (t + 1) * K
        s = 0
        for b in range(end - 16, end):
            s = (s << 1) | ring[b % (256 * K)]
        states.append(s)
    return states


@pytest.mark.parametrize("K", exl3.KS)
def test_state_extraction_matches_the_bit_by_bit_spec(K):
    rng = np.random.default_rng(K)
    trellis = exl3.random_trellis(rng, 32, 16, K)     # two tiles
    got = exl3.tile_states(trellis)
    for i in range(2):
        assert got[i, 0].tolist() == _states_bit_by_bit(trellis[i, 0], K)


@pytest.mark.parametrize("K", exl3.KS)
def test_pack_states_inverts_extraction(K):
    rng = np.random.default_rng(100 + K)
    trellis = exl3.random_trellis(rng, 48, 32, K)
    assert np.array_equal(exl3.pack_states(exl3.tile_states(trellis), K), trellis)


def test_state_windows_overlap_by_16_minus_k():
    trellis = exl3.random_trellis(np.random.default_rng(7), 16, 16, 3)
    s = exl3.tile_states(trellis)[0, 0]
    assert np.array_equal(s[1:] >> 3, s[:-1] & 0x1FFF)   # each state shifts in 3 new bits
    assert (s[0] >> 3) == (s[-1] & 0x1FFF)              # element 0 wraps to the tile's end


def test_mul1_table_by_hand():
    lut = exl3.codebook_lut("mul1")
    # state 0: byte sum 0, so 1024 * k_inv + k_bias = 6.9296875 - 10.3828125
    assert float(lut[0]) == -3.453125
    s = 12345
    x = (s * 0x83DCD12D) & 0xFFFFFFFF
    byte_sum = sum((x >> (8 * b)) & 255 for b in range(4))
    assert float(lut[s]) == float(np.float16((1024 + byte_sum) * 0.00676727294921875 - 10.3828125))
    assert len(np.unique(lut)) == 913 and float(lut.min()) == -3.453125 and abs(float(lut.max()) - 3.348) < 1e-3
    assert exl3.mul1_byte_sum(np.arange(65536)).max() <= 1005


def test_lop3_tables_by_hand():
    s = 40000
    for name, x in (("mcg", (s * 0xCBAC1FED) & 0xFFFFFFFF), ("3inst", (s * 89226354 + 64248484) & 0xFFFFFFFF)):
        x = (x & 0x8FFF8FFF) ^ 0x3B603B60
        lo, hi = (np.array([x & 0xFFFF, x >> 16], np.uint16).view(np.float16)).astype(np.float64)
        assert exl3.codebook_lut(name)[s] == np.float16(lo + hi)
        assert np.isfinite(exl3.codebook_lut(name)).all()


def test_codebook_lut_is_read_only_and_named():
    with pytest.raises(ValueError):
        exl3.codebook_lut("mul1")[0] = 0
    with pytest.raises(ValueError, match="codebook 'mul2'"):
        exl3.codebook_lut("mul2")
    assert exl3.codebook_lut(2) is exl3.codebook_lut("mul1")


def test_tensor_core_perm_is_a_permutation_with_its_inverse():
    assert sorted(exl3.TC_PERM.tolist()) == list(range(256))
    assert np.array_equal(exl3.TC_PERM[exl3.TC_PERM_INV], np.arange(256))
    assert exl3.TC_PERM[:8].tolist() == [0, 16, 128, 144, 8, 24, 136, 152]


def test_placement_round_trip_and_tile_coordinates():
    rng = np.random.default_rng(3)
    vals = rng.integers(0, 1000, size=(2, 3, 256))
    m = exl3.place_tiles(vals)
    assert m.shape == (32, 48)
    assert np.array_equal(exl3.unplace_tiles(m), vals)
    # element 1 of tile (1, 2) sits at tile row 1, column 0 (perm[1] = 16)
    assert m[16 + 1, 32 + 0] == vals[1, 2, 1]


def test_hadamard_is_orthogonal_and_the_butterfly_is_its_product():
    h = exl3.hadamard_signs(128).astype(np.int64)
    assert np.array_equal(h @ h.T, 128 * np.eye(128, dtype=np.int64))
    assert np.array_equal(h, h.T)
    x = np.random.default_rng(4).integers(-7, 8, size=(5, 256))
    blockdiag = np.kron(np.eye(2, dtype=np.int64), h)
    assert np.array_equal(exl3.butterfly(x), x @ blockdiag)
    y = np.random.default_rng(5).standard_normal((3, 384))
    assert np.allclose(exl3.had(exl3.had(y)), y, rtol=0, atol=1e-13)


def _dense_float64(lin: exl3.Exl3Linear) -> np.ndarray:
    """W = diag(suh) H W_inner H diag(svh) with explicit matrices."""
    def h(n):
        return np.kron(np.eye(n // 128), exl3.hadamard_signs(128)) / np.sqrt(128)
    wi = exl3.decode_inner(lin.trellis, lin.codebook).astype(np.float64)
    return np.diag(lin.suh.astype(np.float64)) @ h(lin.k) @ wi @ h(lin.n) @ np.diag(lin.svh.astype(np.float64))


@pytest.mark.parametrize("codebook", exl3.CODEBOOKS)
def test_reconstruct_and_linear_forward_match_explicit_matrices(codebook):
    rng = np.random.default_rng(6)
    lin = exl3.random_linear(rng, 256, 128, K=4, codebook=codebook)
    w = _dense_float64(lin)
    assert np.allclose(exl3.reconstruct(lin), w, rtol=0, atol=1e-12)
    x = rng.standard_normal((3, 256))
    assert np.allclose(exl3.linear_forward(x, lin), x @ w, rtol=0, atol=1e-11)


def test_expert_forward_matches_explicit_float64_swiglu():
    rng = np.random.default_rng(8)
    ex = exl3.random_expert(rng, 256, 128, K=3)
    x = rng.standard_normal((4, 256)) * 0.3
    weights = np.array([0.5, 0.25, 1.0, 0.125])
    g, u = x @ _dense_float64(ex.gate), x @ _dense_float64(ex.up)
    limit = 10.0
    assert np.abs(u).max() > limit     # so the clamp is exercised
    silu = np.minimum(g / (1 + np.exp(-g)), limit)
    want = (silu * np.clip(u, -limit, limit)) @ _dense_float64(ex.down) * (weights * 2.5)[:, None]
    got = exl3.expert_forward(x, ex, act_limit=limit, routing_weight=weights, routed_scaling_factor=2.5)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-9)
    unclamped = exl3.expert_forward(x, ex, routing_weight=weights, routed_scaling_factor=2.5)
    assert not np.allclose(unclamped, want)


def test_fp16_rounding_points_stay_close_to_float64_and_round():
    rng = np.random.default_rng(9)
    ex = exl3.random_expert(rng, 256, 128, K=3)
    x = rng.standard_normal((2, 256)) * 0.1
    ref = exl3.expert_forward(x, ex, act_limit=10.0)
    r16 = exl3.expert_forward(x, ex, act_limit=10.0, fp16=True)
    assert np.sqrt(np.mean((r16 - ref) ** 2) / np.mean(ref ** 2)) < 2e-3
    assert not np.array_equal(r16, ref)
    y = exl3.linear_forward(x, ex.gate, fp16=True)
    assert np.array_equal(y, y.astype(np.float16).astype(np.float64))


def test_one_hot_raw_gemm_is_a_decoded_row():
    rng = np.random.default_rng(10)
    lin = exl3.random_linear(rng, 128, 256, K=2, codebook="mcg")
    rows = np.array([0, 17, 127])
    hot = np.zeros((3, 128))
    hot[np.arange(3), rows] = 1.0
    wi = exl3.decode_inner(lin.trellis, "mcg")
    assert np.array_equal(exl3.raw_gemm(hot, lin), wi[rows].astype(np.float64))


def test_int_format_is_integer_and_matches_explicit_matrices():
    rng = np.random.default_rng(11)
    ex = exl3.random_expert(rng, 256, 128, K=3)
    wi = exl3.int_inner(ex.gate.trellis)
    assert wi.dtype == np.int64 and wi.min() >= -510 and wi.max() <= 495
    b = np.kron(np.eye(2, dtype=np.int64), exl3.hadamard_signs(128).astype(np.int64))
    s_u = np.where(ex.gate.suh < 0, -1, 1)
    s_v = np.where(ex.gate.svh < 0, -1, 1)
    x = rng.integers(-7, 8, size=(3, 256))
    g = exl3.int_linear_forward(x, ex.gate)
    assert g.dtype == np.int64
    assert np.array_equal(g, ((x * s_u) @ b @ wi @ b[:128, :128]) * s_v)
    a = exl3.int_gate(np.array([-5, 2**40, 100]), np.array([3, 2**40, -7]), shift=2, a_max=7)
    assert a.tolist() == [0, 7, -7]
    y = exl3.int_expert_forward(x, ex, shift=40, a_max=7, weight=np.array([3, 1, 2]))
    again = exl3.int_expert_forward(x[::-1], ex, shift=40, a_max=7, weight=np.array([2, 1, 3]))[::-1]
    assert y.dtype == np.int64 and np.array_equal(y, again)


def test_linear_rejects_bad_arrays_with_the_field_named():
    rng = np.random.default_rng(12)
    t = exl3.random_trellis(rng, 128, 128, 3)
    suh = exl3.random_scales(rng, 128)
    with pytest.raises(ValueError, match="trellis last axis 40"):
        exl3.Exl3Linear(np.zeros((8, 8, 40), np.int16), suh, suh)
    with pytest.raises(ValueError, match="svh float32"):
        exl3.Exl3Linear(t, suh, suh.astype(np.float32))
    with pytest.raises(ValueError, match="multiples of 128"):
        exl3.Exl3Linear(t[:4], suh[:64], suh)
    with pytest.raises(ValueError, match="expert shapes"):
        lin = exl3.Exl3Linear(t, suh, suh)
        exl3.Exl3Expert(lin, lin, exl3.random_linear(rng, 256, 128))
