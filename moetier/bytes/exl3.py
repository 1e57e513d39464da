"""The EXL3 (trellis) weight format as a plain NumPy reference: decode, reconstruct, and an expert's forward.

This is the ground truth every EXL3 kernel (Numba, OpenCL, CUDA) is checked against; it is written for clarity and
exactness, not speed. The format is that of exllamav3 (docs in ../shared/reference/adapters.md section 2; checked
bit-exact against exllamav3 1.6.5's torch code by tests/oracle/exl3_golden.py, whose golden vectors the main suite
replays in tests/test_exl3_codec.py).

One quantized linear (``Exl3Linear``) of in_features k and out_features n, with W stored (in, out) so y = x @ W:

* ``trellis`` int16 [k/16, n/16, 16*K]: one 16x16 tile per (row block i, column block j), 256*K bits per tile,
  K = 1..8 bits per weight.
* ``suh`` fp16 [k], ``svh`` fp16 [n]: input and output sign/scale vectors.
* ``codebook``: "3inst" (cb 0), "mcg" (cb 1) or "mul1" (cb 2); a checkpoint names it by the presence of a ``mcg``
  or ``mul1`` tensor next to the trellis.

Decode, per tile (``tile_states``, ``decode_inner``):

1. words: 8K uint32 from little-endian int16 pairs, w[i] = e[2i] | e[2i+1] << 16, read MSB-first as one ring of
   256*K bits;
2. the state of element t (0..255) is the 16-bit window of that ring ending at bit (t+1)*K (circular: element 0
   takes its top bits from the end of the tile);
3. the weight is ``codebook_lut(cb)[state]`` (fp16), a 65,536-entry table;
4. element t lands at row-major tile position ``TC_PERM[t]`` (exllamav3's tensor-core order); tile (i, j) covers
   W_inner rows 16i.. (input) and columns 16j.. (output).

Reconstruction: W = diag(suh) H W_inner H diag(svh), H the block-diagonal normalised Sylvester Hadamard of
128 x 128 blocks. The forward of one linear is therefore y = had(had(x * suh) @ W_inner) * svh, where ``had`` is the
unnormalised butterfly over 128-wide blocks times 128**-0.5 (exllamav3's ``hadamard_rotate`` order).

Rounding: by default everything after the fp16 table lookup is float64. With ``fp16=True`` the forward rounds to
fp16 where exllamav3's CUDA kernels store fp16 (adapters.md section 2.4): the input x, the transformed input
had(x * suh), the raw GEMM output, the output after had * svh, and the SwiGLU intermediate. Between those points
the arithmetic stays float64, so an fp32-accumulating kernel agrees bit-exactly wherever its sums are exact
(one-hot rows) and to within fp16 rounding elsewhere.

``exl3-int`` (adapters.md section 2.6) keeps the container (tiles, windows, placement) and makes the arithmetic
integer so every backend can agree bit-for-bit: weight = mul1 byte sum of the state - 510, suh/svh = +-1 (their
signs), the Hadamard butterfly without the 1/sqrt(128) scale, int64 GEMMs, and an integer gate
(``int_expert_forward``).

The encoder side (``random_linear``, ``pack_states``) exists for tests and synthetic checkpoints: any int16 bit
pattern is a valid trellis.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TILE = 16
HAD = 128
HAD_SCALE = HAD ** -0.5
KS = tuple(range(1, 9))
CODEBOOKS = ("3inst", "mcg", "mul1")  # index = exllamav3's cb number

MUL1_MULT = 0x83DCD12D
MCG_MULT = 0xCBAC1FED
INST3_MULT = 89226354
INST3_ADD = 64248484
LOP3_MASK = 0x8FFF8FFF
LOP3_XOR = 0x3B603B60
MUL1_K_INV_BITS = 0x1EEE    # fp16 0.00676727...
MUL1_K_BIAS_BITS = 0xC931   # fp16 -10.3828125
MUL1_BYTE_SUM_MID = 510     # exl3-int's zero point (the byte sum ranges over 0..1005 for 16-bit states)


def _fp16_bits_value(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


MUL1_K_INV = _fp16_bits_value(MUL1_K_INV_BITS)
MUL1_K_BIAS = _fp16_bits_value(MUL1_K_BIAS_BITS)


def codebook_index(codebook) -> int:
    """exllamav3's cb number (0 3inst, 1 mcg, 2 mul1) of a codebook given by name or number."""
    if isinstance(codebook, str):
        if codebook not in CODEBOOKS:
            raise ValueError(f"codebook {codebook!r}: expected one of {', '.join(CODEBOOKS)}")
        return CODEBOOKS.index(codebook)
    cb = int(codebook)
    if cb not in (0, 1, 2):
        raise ValueError(f"codebook {codebook!r}: expected 0 (3inst), 1 (mcg) or 2 (mul1)")
    return cb


# --------------------------------------------------------------------------------------------------------------------
# Codebooks


def _all_states() -> np.ndarray:
    return np.arange(65536, dtype=np.uint64)


def mul1_byte_sum(states) -> np.ndarray:
    """Sum of the four bytes of state * 0x83DCD12D mod 2**32 (0..1005 for 16-bit states), as int64."""
    x = (np.asarray(states, dtype=np.uint64) * MUL1_MULT) & 0xFFFFFFFF
    return ((x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)).astype(np.int64)


def _lop3_pair_sum(x: np.ndarray) -> np.ndarray:
    """fp16 sum (one rounding) of the two fp16 halves of (x & 0x8FFF8FFF) ^ 0x3B603B60."""
    x = ((x & LOP3_MASK) ^ LOP3_XOR).astype(np.uint32)
    lo = (x & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (x >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    return (lo + hi).astype(np.float16)  # the float64 sum is exact, so this is the single fp16 rounding


def codebook_lut(codebook) -> np.ndarray:
    """The 65,536 decoded weights of a codebook, indexed by state, as a read-only fp16 array.

    mul1: fp16((1024 + byte sum) * k_inv + k_bias), one rounding (the GPU's __hfma on the half 0x6400 + sum; the
    float64 product and sum are exact). mcg: x = state * MCG_MULT, 3inst: x = state * INST3_MULT + INST3_ADD (mod
    2**32), then the fp16 sum of the halves of (x & LOP3_MASK) ^ LOP3_XOR. Built once per codebook."""
    return _lut(codebook_index(codebook))


@lru_cache(maxsize=None)
def _lut(cb: int) -> np.ndarray:
    s = _all_states()
    if cb == 2:
        lut = ((1024 + mul1_byte_sum(s)).astype(np.float64) * MUL1_K_INV + MUL1_K_BIAS).astype(np.float16)
    elif cb == 1:
        lut = _lop3_pair_sum((s * MCG_MULT) & 0xFFFFFFFF)
    else:
        lut = _lop3_pair_sum((s * INST3_MULT + INST3_ADD) & 0xFFFFFFFF)
    lut.flags.writeable = False
    return lut


# --------------------------------------------------------------------------------------------------------------------
# Trellis bit layout


def tile_words(trellis: np.ndarray) -> np.ndarray:
    """uint32 words [..., 8K] of int16 tiles [..., 16K]: w[i] = e[2i] | e[2i+1] << 16 (little-endian pairs)."""
    e = np.ascontiguousarray(trellis).view(np.uint16).astype(np.uint32)
    return e[..., 0::2] | (e[..., 1::2] << 16)


@lru_cache(maxsize=None)
def window_tables(K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per element t of a tile at K bits: (i0, i1, shift) such that the state of t is
    ((words[i0] << 32 | words[i1]) >> shift) & 0xFFFF (exllamav3's 64-bit funnel shift). i0 holds the window's
    first bit, i1 its last (possibly the same word); the ring is offset by one tile so element 0's wrap is plain
    modular indexing."""
    if K not in KS:
        raise ValueError(f"K={K}: expected bits per weight in 1..8")
    t = np.arange(256, dtype=np.int64)
    end = (t + 1) * K + 256 * K          # one past the window's last bit, shifted by a whole ring
    start = end - 16
    words = 8 * K
    i0 = (start // 32) % words
    i1_raw = (end - 1) // 32
    shift = (i1_raw + 1) * 32 - end
    for a in (i0, i1_raw, shift):
        a.flags.writeable = False
    i1 = i1_raw % words
    i1.flags.writeable = False
    return i0, i1, shift


def trellis_bits(trellis: np.ndarray) -> int:
    """K of a trellis array [..., 16K]; raises ValueError unless the last axis is 16 * (1..8)."""
    last = trellis.shape[-1]
    if last % 16 or last // 16 not in KS:
        raise ValueError(f"trellis last axis {last}: expected 16*K words with K in 1..8 "
                         "(half-integer rates are not supported)")
    return last // 16


def tile_states(trellis: np.ndarray) -> np.ndarray:
    """The 16-bit state of every element of every tile: int16 [..., 16K] -> int64 [..., 256], trellis order t."""
    K = trellis_bits(trellis)
    w = tile_words(trellis).astype(np.uint64)
    i0, i1, shift = window_tables(K)
    merged = (w[..., i0] << np.uint64(32)) | w[..., i1]
    return ((merged >> shift.astype(np.uint64)) & np.uint64(0xFFFF)).astype(np.int64)


def pack_states(states: np.ndarray, K: int) -> np.ndarray:
    """Inverse of tile_states for consistent states: int [..., 256] -> int16 [..., 16K].

    Bits [t*K, (t+1)*K) of the ring are the low K bits of state t (the window of t ends there); the higher bits of a
    state are its predecessors' and are not read. tile_states(pack_states(s, K)) == s whenever s came from a trellis."""
    if K not in KS:
        raise ValueError(f"K={K}: expected bits per weight in 1..8")
    s = np.asarray(states, dtype=np.int64)
    if s.shape[-1] != 256:
        raise ValueError(f"states last axis {s.shape[-1]}: expected 256 elements per tile")
    low = s & ((1 << K) - 1)
    bits = (low[..., :, None] >> np.arange(K - 1, -1, -1)) & 1           # MSB-first within each symbol
    ring = bits.reshape(*s.shape[:-1], 8 * K, 32)                       # MSB-first within each word
    words = (ring.astype(np.uint64) << np.arange(31, -1, -1, dtype=np.uint64)).sum(axis=-1, dtype=np.uint64)
    e = np.empty((*s.shape[:-1], 16 * K), dtype=np.uint16)
    e[..., 0::2] = (words & np.uint64(0xFFFF)).astype(np.uint16)
    e[..., 1::2] = (words >> np.uint64(16)).astype(np.uint16)
    return e.view(np.int16)


# --------------------------------------------------------------------------------------------------------------------
# Tensor-core placement


def _tensor_core_perm() -> np.ndarray:
    perm = np.empty(256, dtype=np.int64)
    for t in range(32):
        r0 = 2 * (t % 4)
        c0 = t // 4
        rows = (r0, r0 + 1, r0 + 8, r0 + 9)
        for half, c in enumerate((c0, c0 + 8)):
            for q, r in enumerate(rows):
                perm[8 * t + 4 * half + q] = r * TILE + c
    perm.flags.writeable = False
    return perm


TC_PERM = _tensor_core_perm()            # element t -> row-major tile position
TC_PERM_INV = np.argsort(TC_PERM)        # row-major tile position -> element t
TC_PERM_INV.flags.writeable = False


def place_tiles(values: np.ndarray) -> np.ndarray:
    """Per-tile values in trellis order [kt, nt, 256] -> the (16 kt, 16 nt) matrix they tile."""
    kt, nt, _ = values.shape
    tiles = np.empty_like(values)
    tiles[..., TC_PERM] = values
    return tiles.reshape(kt, nt, TILE, TILE).transpose(0, 2, 1, 3).reshape(kt * TILE, nt * TILE)


def unplace_tiles(matrix: np.ndarray) -> np.ndarray:
    """Inverse of place_tiles: (16 kt, 16 nt) -> [kt, nt, 256] in trellis order."""
    k, n = matrix.shape
    tiles = matrix.reshape(k // TILE, TILE, n // TILE, TILE).transpose(0, 2, 1, 3).reshape(k // TILE, n // TILE, 256)
    return tiles[..., TC_PERM]


# --------------------------------------------------------------------------------------------------------------------
# Hadamard


@lru_cache(maxsize=None)
def hadamard_signs(n: int = HAD) -> np.ndarray:
    """The unnormalised Sylvester Hadamard matrix of order n (a power of two), entries +-1 as int8."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard order {n}: expected a power of two")
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h.flags.writeable = False
    return h


def butterfly(x: np.ndarray, n: int = HAD) -> np.ndarray:
    """Unnormalised Walsh-Hadamard butterfly over blocks of n along the last axis (no scale), in exllamav3's
    hadamard_rotate order; exact for integers."""
    x = np.asarray(x)
    shape = x.shape
    if shape[-1] % n:
        raise ValueError(f"last axis {shape[-1]} is not a multiple of the Hadamard block {n}")
    y = x.reshape(-1, n)
    h = 1
    while h < n:
        y = y.reshape(-1, n // (2 * h), 2, h)
        y = np.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), axis=2)
        h *= 2
    return y.reshape(shape)


def had(x: np.ndarray) -> np.ndarray:
    """The normalised 128-block Hadamard along the last axis: butterfly, then times 128**-0.5."""
    return butterfly(x) * HAD_SCALE


# --------------------------------------------------------------------------------------------------------------------
# One linear


@dataclass(frozen=True)
class Exl3Linear:
    """One EXL3 linear: trellis int16 [k/16, n/16, 16K], suh fp16 [k], svh fp16 [n], codebook name."""

    trellis: np.ndarray
    suh: np.ndarray
    svh: np.ndarray
    codebook: str = "mul1"

    def __post_init__(self):
        t = self.trellis
        if t.dtype != np.int16 or t.ndim != 3:
            raise ValueError(f"trellis {t.dtype} {t.shape}: expected int16 [k/16, n/16, 16K]")
        trellis_bits(t)
        k, n = t.shape[0] * TILE, t.shape[1] * TILE
        for name, v, want in (("suh", self.suh, k), ("svh", self.svh, n)):
            if v.dtype != np.float16 or v.shape != (want,):
                raise ValueError(f"{name} {v.dtype} {v.shape}: expected float16 ({want},)")
        if k % HAD or n % HAD:
            raise ValueError(f"linear {k} x {n}: in and out features must be multiples of {HAD}")
        codebook_index(self.codebook)

    @property
    def k(self) -> int:
        return self.trellis.shape[0] * TILE

    @property
    def n(self) -> int:
        return self.trellis.shape[1] * TILE

    @property
    def K(self) -> int:
        return self.trellis.shape[2] // 16


def decode_inner(trellis: np.ndarray, codebook="mul1") -> np.ndarray:
    """W_inner (k, n) fp16 from a trellis [k/16, n/16, 16K]: states -> codebook table -> tensor-core placement."""
    return place_tiles(codebook_lut(codebook)[tile_states(trellis)])


def reconstruct(lin: Exl3Linear) -> np.ndarray:
    """The dense float64 weight W (k, n) = diag(suh) H W_inner H diag(svh), y = x @ W.

    Same order as exllamav3's LinearEXL3.get_weight_tensor (Hadamard over the input axis, times suh, Hadamard over
    the output axis, times svh), without its intermediate fp16 roundings."""
    w = decode_inner(lin.trellis, lin.codebook).astype(np.float64)
    w = had(w.T).T * lin.suh.astype(np.float64)[:, None]
    return had(w) * lin.svh.astype(np.float64)[None, :]


def _r16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(np.float16).astype(np.float64)


def raw_gemm(xh: np.ndarray, lin: Exl3Linear) -> np.ndarray:
    """The Hadamard-domain GEMM xh @ W_inner in float64 (each row of a one-hot xh is one decoded weight row)."""
    return np.asarray(xh, dtype=np.float64) @ decode_inner(lin.trellis, lin.codebook).astype(np.float64)


def linear_forward(x: np.ndarray, lin: Exl3Linear, fp16: bool = False) -> np.ndarray:
    """y = x @ W for token rows x (..., k) -> (..., n), float64; fp16=True rounds where the engine stores fp16."""
    x = np.asarray(x, dtype=np.float64)
    if fp16:
        x = _r16(x)
    xh = had(x * lin.suh.astype(np.float64))
    if fp16:
        xh = _r16(xh)
    y = raw_gemm(xh, lin)
    if fp16:
        y = _r16(y)
    y = had(y) * lin.svh.astype(np.float64)
    return _r16(y) if fp16 else y


def swiglu(g: np.ndarray, u: np.ndarray, act_limit: float | None = None) -> np.ndarray:
    """silu(g) * u in float64; a nonzero act_limit caps silu(g) at the limit and clamps u to [-limit, limit] before
    the product (exllamav3's SiLU path, not the gpt-oss form)."""
    g = np.asarray(g, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    # 1 / (1 + exp(-g)) without an overflow warning for very negative g
    s = g * np.exp(-np.logaddexp(0.0, -g))
    if act_limit:
        s = np.minimum(s, act_limit)
        u = np.clip(u, -act_limit, act_limit)
    return s * u


@dataclass(frozen=True)
class Exl3Expert:
    """A routed SwiGLU expert: gate and up [H -> I], down [I -> H]."""

    gate: Exl3Linear
    up: Exl3Linear
    down: Exl3Linear

    def __post_init__(self):
        g, u, d = self.gate, self.up, self.down
        if (g.k, g.n) != (u.k, u.n) or (d.k, d.n) != (g.n, g.k):
            raise ValueError(f"expert shapes gate {g.k}x{g.n}, up {u.k}x{u.n}, down {d.k}x{d.n}: expected gate = up "
                             "= H x I and down = I x H")

    @property
    def hidden(self) -> int:
        return self.gate.k

    @property
    def inter(self) -> int:
        return self.gate.n


def expert_forward(x: np.ndarray, expert: Exl3Expert, act_limit: float | None = None, routing_weight=1.0,
                   routed_scaling_factor: float = 1.0, fp16: bool = False) -> np.ndarray:
    """One expert's contribution for token rows x (T, H): down(swiglu(gate(x), up(x))) * routing weight * routed
    scaling factor, float64 (T, H). routing_weight is a scalar or one weight per row. fp16=True rounds at the
    engine's points, including the SwiGLU intermediate; the weighted output itself stays float64."""
    g = linear_forward(x, expert.gate, fp16)
    u = linear_forward(x, expert.up, fp16)
    a = swiglu(g, u, act_limit)
    if fp16:
        a = _r16(a)
    y = linear_forward(a, expert.down, fp16)
    w = np.asarray(routing_weight, dtype=np.float64) * routed_scaling_factor
    return y * (w[:, None] if w.ndim else w)


# --------------------------------------------------------------------------------------------------------------------
# exl3-int: the bit-exact stand-in arithmetic


def int_inner(trellis: np.ndarray) -> np.ndarray:
    """exl3-int W_inner (k, n) int64: mul1 byte sum of each state - 510, placed like decode_inner."""
    return place_tiles(mul1_byte_sum(tile_states(trellis)) - MUL1_BYTE_SUM_MID)


def _signs(v: np.ndarray) -> np.ndarray:
    return np.where(np.signbit(np.asarray(v, dtype=np.float16)), -1, 1).astype(np.int64)


def int_linear_forward(x: np.ndarray, lin: Exl3Linear) -> np.ndarray:
    """exl3-int y = B(B(x * sign(suh)) @ W_int) * sign(svh) in int64, B the unscaled butterfly (the codebook is
    ignored: the integer weight is always the mul1 byte sum). |x| <= 7 and k <= 4096 stay below 2**38."""
    x = np.asarray(x, dtype=np.int64)
    y = butterfly(x * _signs(lin.suh)) @ int_inner(lin.trellis)
    return butterfly(y) * _signs(lin.svh)


INT_CLAMP = 2**31 - 1


def int_gate(g: np.ndarray, u: np.ndarray, shift: int, a_max: int) -> np.ndarray:
    """exl3-int gated activation: clamp((min(max(g, 0), 2**31-1) * clamp(u, +-(2**31-1))) >> shift, +-a_max), int64.
    The pre-clamp keeps the product below 2**62 for any linear output; >> is the arithmetic (floor) shift."""
    g = np.minimum(np.maximum(np.asarray(g, dtype=np.int64), 0), INT_CLAMP)
    u = np.clip(np.asarray(u, dtype=np.int64), -INT_CLAMP, INT_CLAMP)
    return np.clip((g * u) >> shift, -a_max, a_max)


def int_expert_forward(x: np.ndarray, expert: Exl3Expert, shift: int, a_max: int = 7, weight=1) -> np.ndarray:
    """exl3-int expert: down(int_gate(gate(x), up(x))) * weight, int64 (T, H). weight is a fixed-point integer (or
    one per row); with |x|, a_max <= 7, H, I <= 4096 and |weight| < 2**16 every value stays below 2**54."""
    g = int_linear_forward(x, expert.gate)
    u = int_linear_forward(x, expert.up)
    y = int_linear_forward(int_gate(g, u, shift, a_max), expert.down)
    w = np.asarray(weight, dtype=np.int64)
    return y * (w[:, None] if w.ndim else w)


# --------------------------------------------------------------------------------------------------------------------
# Encoder side, for tests and synthetic checkpoints


def random_trellis(rng: np.random.Generator, k: int, n: int, K: int) -> np.ndarray:
    """A uniformly random trellis for a k x n linear at K bits (every bit pattern is a valid trellis)."""
    if K not in KS:
        raise ValueError(f"K={K}: expected bits per weight in 1..8")
    if k % TILE or n % TILE:
        raise ValueError(f"linear {k} x {n}: dimensions must be multiples of {TILE}")
    return rng.integers(-32768, 32768, size=(k // TILE, n // TILE, 16 * K), dtype=np.int16)


def random_scales(rng: np.random.Generator, size: int, lo: float = 0.5, hi: float = 2.0) -> np.ndarray:
    """Random sign/scale vector: +-(lo..hi) as fp16, the synthetic-fixture convention of adapters.md section 2.6."""
    mag = rng.uniform(lo, hi, size)
    return (np.where(rng.random(size) < 0.5, -mag, mag)).astype(np.float16)


def random_linear(rng: np.random.Generator, k: int, n: int, K: int = 3, codebook="mul1",
                  scale_range: tuple[float, float] = (0.5, 2.0)) -> Exl3Linear:
    """A random EXL3 linear of k x n at K bits (random trellis, random +-scale suh/svh)."""
    return Exl3Linear(random_trellis(rng, k, n, K), random_scales(rng, k, *scale_range),
                      random_scales(rng, n, *scale_range), CODEBOOKS[codebook_index(codebook)])


def random_expert(rng: np.random.Generator, hidden: int, inter: int, K: int = 3, codebook="mul1",
                  scale_range: tuple[float, float] = (0.5, 2.0)) -> Exl3Expert:
    """A random expert of hidden H x intermediate I (gate/up H -> I, down I -> H)."""
    return Exl3Expert(random_linear(rng, hidden, inter, K, codebook, scale_range),
                      random_linear(rng, hidden, inter, K, codebook, scale_range),
                      random_linear(rng, inter, hidden, K, codebook, scale_range))


def trellis_nbytes(k: int, n: int, K: int) -> int:
    """Bytes of a k x n trellis at K bits (k * n * K / 8)."""
    return k * n * K // 8


def fp16_ulp(v: np.ndarray) -> np.ndarray:
    """The fp16 unit in the last place at each value (2**-24 at subnormals), float64; for tolerance checks."""
    a = np.abs(np.asarray(v, dtype=np.float64))
    e = np.floor(np.log2(np.maximum(a, 2.0**-14)))
    return np.exp2(e - 10)

