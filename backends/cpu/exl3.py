"""Numba CPU kernel for one EXL3 (trellis) SwiGLU expert, read in place from its trellis/suh/svh arrays.

Contract: ``expert_forward(expert, x)`` computes, for token rows x [T, H], down(swiglu(gate(x), up(x))) times the
routing weight (and routed scaling factor), float32 [T, H], where each linear is y = had(had(x * suh) @ W_inner) *
svh as specified by ``moetier.bytes.exl3`` (the numpy reference it is checked against). Inputs are the record's own
arrays: trellis int16 [k/16, n/16, 16K] (any K in 1..8, any codebook), suh/svh fp16 (or their uint16 bit patterns);
nothing is copied or converted up front beyond the small scale vectors.

Rounding: fp16 where exllamav3's CUDA kernels store fp16 (adapters.md section 2.4): the input x, the transformed input
had(x * suh) * c, the raw GEMM output, the output after had * c * svh, and the SwiGLU intermediate; the GEMM
accumulates in fp32. ``fp16=False`` skips the roundings (plain fp32). Every rounding is round-to-nearest-even,
identical to numpy's float32 -> float16 conversion.

Decode strategy: a parallel work item is an output band of up to NB adjacent tiles (16 * NB columns; narrower where
that gives every thread a band, _band_width), which streams down all tile rows of the trellis. For each tile row it
first lays the band's tiles side by side as 32-bit windows of their bit rings (units m and m + 1), [16K, lanes],
so that one weight position of all the band's tiles is read with the same window index and shift: state extraction
(exl3_dq.cuh's funnel shift: one 32-bit shift left by the position's offset and one right by 16), the decode, its
fp16 rounding and the FMA then run across the tiles as vector lanes, LANES (16 float32, one 512-bit or two 256-bit
vectors) at a time. Positions are visited in the tile's row-major order (the tensor-core placement is folded into
the window tables), so each position's decoded weights multiply one input and add into one contiguous block of the
[16 columns, lanes] accumulator of each token. At one token (mul1 exact or affine) the decode sits inside the FMA
loop; with more tokens each position is decoded once into a lane vector that every token's FMA reads. All loop
indices are unsigned, because numba's negative-index wraparound code keeps LLVM from vectorising. mul1 is decoded
without a table: fp16(k_inv (1024 + s) + k_bias) with s the byte sum below, whose float32 value is exact, so one
rounding to fp16 (the F16C conversion pair where the CPU has it, backends/cpu/exl3_ops.py) gives the table's value;
mcg and 3inst look the state up in a 65,536-entry table.

``mode="affine"`` (mul1 only) is the fast path: a mul1 weight is affine in the byte sum s of state * 0x83DCD12D,
w = k_inv (1024 + s) + k_bias, so sum_r w_r x_r = k_inv sum_r s_r x_r + (1024 k_inv + k_bias) sum_r x_r: the kernel
accumulates integer byte sums (no table lookup) and adds one per-token constant per column. It skips the fp16
rounding of each weight, so it agrees with the exact path to about 2e-4 relative (rel RMS), not bit-for-bit.

``int_expert_forward`` is the exl3-int stand-in (adapters.md section 2.6, moetier.bytes.exl3): the same containers
and band decode, integer weights (byte sum - 510), +-1 scales, the unscaled butterfly, int64 GEMMs and the integer
gate, so its output is bit-identical to the numpy reference and to any other lane.

Determinism: each output column is owned by one work item with a fixed reduction order (input rows in order), so
results are bit-identical across runs and thread counts. Kernels are compiled with nogil so a lane can run them from
worker threads; parallel=False uses the calling thread only.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
from numba import get_num_threads, njit, prange, set_num_threads

from backends.cpu.exl3_ops import JIT as _JIT
from backends.cpu.exl3_ops import fp16_round, had_rows_, prefetch, round16_, shl32
from moetier.bytes import exl3 as X

NB = 64                     # most tiles per output band (1024 columns)
LANES = 16                  # tiles per vector step: one 512-bit vector of float32 (two 256-bit ones)
MODES = ("exact", "affine")
# decode: table lookup (any codebook), mul1 arithmetic, mul1 affine (byte sums), exl3-int (byte sum - 510)
KIND_LUT, KIND_MUL1, KIND_AFFINE, KIND_INT = 0, 1, 2, 3

_SUM_AFFINE = np.array([1.0, 0.0], np.float32)                   # KIND_AFFINE's "table": s * 1 + 0
_SUM_INT = np.array([1.0, -X.MUL1_BYTE_SUM_MID], np.float32)     # KIND_INT's: s * 1 - 510
_K_INV = np.float32(X.MUL1_K_INV)
_K_CONST = np.float32(1024.0 * X.MUL1_K_INV + X.MUL1_K_BIAS)   # exact in float32 (a multiple of 2**-18)


# --------------------------------------------------------------------------------------------------------------------
# Decode and GEMM


@njit(fastmath=True, **_JIT)
def _gather_tiles(wf, nw, t0, nb, lane0, W, ubuf):
    """ubuf[2w W + lane0 + jj] = word w of tile jj of a band's tile row (wf: the trellis as flat uint32 words, 8K =
    nw per tile; t0: the row's first band word; W: the band's lane count): the even rows of _odd_windows' table.
    The stores are contiguous (LLVM vectorises the loop with strided loads where it finds that cheaper). All
    arguments are unsigned (no negative-index wraparound code)."""
    two = np.uint64(2)
    for w in range(nw):
        w = np.uint64(w)
        e = two * w * W + lane0
        for jj in range(nb):
            jj = np.uint64(jj)
            ubuf[e + jj] = wf[t0 + jj * nw + w]


@njit(fastmath=True, **_JIT)
def _odd_windows(ubuf, nw, W):
    """ubuf[m W + L] becomes the 32-bit window of lane L's tile ring that starts at its 16-bit unit m: the ring is
    the tile's uint32 words MSB-first, so the window at unit 2w is word w itself (_gather_tiles put it there) and the
    one at 2w + 1 is the low half of word w over the high half of word w + 1 (wrapping), formed here for all lanes
    in one vector pass."""
    two = np.uint64(2)
    for w in range(nw):
        w = np.uint64(w)
        e = two * w * W
        e1 = two * (w + np.uint64(1)) * W if w + np.uint64(1) < nw else np.uint64(0)
        o = e + W
        for q in range(W):
            jj = np.uint64(q)
            ubuf[o + jj] = np.uint32(ubuf[e + jj] << np.uint32(16)) | np.uint32(ubuf[e1 + jj] >> np.uint32(16))


@njit(inline="always", **_JIT)
def _state(ubuf, o, sh):
    """The 16-bit window starting sh bits into the 32-bit window ubuf[o]: its top half << sh (exl3_dq.cuh's funnel
    shift), in 32-bit ops so LLVM keeps 16 lanes per vector."""
    return np.uint32(shl32(ubuf[o], sh) >> np.uint32(16))


@njit(inline="always", **_JIT)
def _byte_sum(st):
    """Sum of the four bytes of st * 0x83DCD12D mod 2**32, in 32-bit ops."""
    p = np.uint32(st * np.uint32(X.MUL1_MULT))
    lo = np.uint32(p & np.uint32(0x00FF00FF))
    q = np.uint32(lo + np.uint32(np.uint32(p >> np.uint32(8)) & np.uint32(0x00FF00FF)))
    return np.uint32(np.uint32(q & np.uint32(0xFFFF)) + np.uint32(q >> np.uint32(16)))


@njit(inline="always", **_JIT)
def _mul1(ubuf, o, sh):
    """The mul1 weight of the state at (o, sh), without a table: fp16(k_inv (1024 + s) + k_bias). The float32 affine
    value is exact (a multiple of 2**-18 below 4), so one rounding to fp16 (fp16_round: F16C's conversion pair) is the
    table's value. The byte sum's last step is folded into a multiply: with q the two 16-bit pair sums,
    (q * 0x10001) & 0xFFFF0000 is s * 65536 (s < 1024 fits the high half), and s * 65536 times k_inv / 65536 is
    s k_inv exactly (a power-of-two scaling), so the weight is unchanged and the decode saves an operation."""
    return fp16_round(np.float32(np.int32(_byte_sum(_state(ubuf, o, sh)))) * _K_INV + _K_CONST)


@njit(fastmath=True, **_JIT)
def _decode_pos(ubuf, o, sh, W, kind, lut, wp):
    """wp[:W] = the weights at one tile position of the band's W tiles (o: the position's window row times W, sh: its
    shift): the table value (KIND_LUT), the mul1 weight (KIND_MUL1), the mul1 byte sum (KIND_AFFINE) or the exl3-int
    weight (KIND_INT). Each kind runs one loop of LANES-wide steps that LLVM vectorises (check with inspect_asm);
    indices are unsigned so that numba emits no negative-index wraparound, which would keep the loop scalar."""
    if kind == KIND_LUT:
        for v in range(W // LANES):
            for l in range(LANES):
                jj = np.uint64(v * LANES + l)
                wp[jj] = lut[_state(ubuf, o + jj, sh)]
    elif kind == KIND_MUL1:
        for v in range(W // LANES):
            for l in range(LANES):
                jj = np.uint64(v * LANES + l)
                wp[jj] = _mul1(ubuf, o + jj, sh)
    else:
        # the byte sum s (KIND_AFFINE) or exl3-int's s - 510, as s * lut[0] + lut[1] (_SUM_AFFINE, _SUM_INT). Both are
        # integers below 2048 in magnitude, so fp16_round leaves them as they are; it is there because LLVM leaves
        # this loop scalar without it
        scale, offset = lut[0], lut[1]
        for v in range(W // LANES):
            for l in range(LANES):
                jj = np.uint64(v * LANES + l)
                wp[jj] = fp16_round(np.float32(np.int32(_byte_sum(_state(ubuf, o + jj, sh)))) * scale + offset)


@njit(inline="always", fastmath=True, **_JIT)
def _fused_rows(ubuf, W, um, ush, xh, r0, xl, t0, acc, kind, ntok, lane_x):
    """_fused_fma's loops for a band of W lanes and tokens t0..t0+ntok-1; kind, ntok and lane_x are constants where
    this is inlined, so the branches fold and the token loop unrolls, leaving the lane loop innermost (vectorised).
    lane_x: each lane's input is xl[t, r W + L] (a step of several tile rows), else all lanes take xh[t, r0 + r]."""
    for r in range(16):
        xr = np.uint64(r) * W
        row = np.uint64(r0 + r)
        for c in range(16):
            p = np.uint64(16 * r + c)
            o = um[p] * W
            sh = ush[p]
            a0 = np.uint64(c) * W
            for q in range(W):      # one flat loop: one overlap check of the arrays per position
                jj = np.uint64(q)
                if kind == KIND_MUL1:
                    w = _mul1(ubuf, o + jj, sh)
                else:
                    w = np.float32(np.int32(_byte_sum(_state(ubuf, o + jj, sh))))
                for tok in range(ntok):
                    t = t0 + np.uint64(tok)
                    if lane_x:
                        acc[t, a0 + jj] += w * xl[t, xr + jj]
                    else:
                        acc[t, a0 + jj] += w * xh[t, row]


@njit(inline="always", fastmath=True, **_JIT)
def _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, kind, ntok):
    """_fused_rows for one kind and token count: per-lane inputs for a step of R > 1 tile rows, else one input per
    row, with W a constant for a full band (LLVM unrolls its lane loop into NB / LANES vectors)."""
    if R > 1:
        _fused_rows(ubuf, W, um, ush, xh, r0, xl, t0, acc, kind, ntok, True)
    elif W == NB:
        _fused_rows(ubuf, np.uint64(NB), um, ush, xh, r0, xl, t0, acc, kind, ntok, False)
    else:
        _fused_rows(ubuf, W, um, ush, xh, r0, xl, t0, acc, kind, ntok, False)


@njit(fastmath=True, **_JIT)
def _fused_fma(ubuf, W, um, ush, xh, r0, xl, R, t0, ntok, kind, acc):
    """Tokens t0..t0+ntok-1 (ntok 1, 2 or 4; KIND_MUL1 or KIND_AFFINE), one step of R tile rows from input row r0:
    acc[t, c W + L] += the weight of lane L at tile position (r, c) times its input, for all 256 positions, decoding
    each weight (mul1) or byte sum (affine) in the loop that uses it, so nothing decoded goes through memory. Every
    accumulator takes the same products in the same order whatever the token grouping, so a token's bits do not
    depend on the batch. W and t0 are unsigned (as are all indices: see _decode_pos)."""
    if kind == KIND_MUL1:
        if ntok == 4:
            _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_MUL1, 4)
        elif ntok == 2:
            _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_MUL1, 2)
        else:
            _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_MUL1, 1)
    else:
        if ntok == 4:
            _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_AFFINE, 4)
        elif ntok == 2:
            _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_AFFINE, 2)
        else:
            _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_AFFINE, 1)


@njit(fastmath=True, **_JIT)
def _fma_tokens(wp, W, xl, xr, a0, acc):
    """acc[tok, a0 + L] += wp[L] xl[tok, xr + L] for every token, L < W (all unsigned)."""
    for tok in range(xl.shape[0]):
        at = acc[tok]
        xt = xl[tok]
        for q in range(W):      # one flat loop: the vectoriser checks that the arrays do not overlap
            jj = np.uint64(q)
            at[a0 + jj] += wp[jj] * xt[xr + jj]


def _band_width(nt: int, threads: int) -> int:
    """Tiles per band: up to NB, and at least as many bands as threads where the trellis is wide enough (a narrow
    output, Qwen's 640 columns, still gives every thread a band); a multiple of LANES unless the output is
    narrower (_step_rows then fills the lanes with more tile rows)."""
    per = -(-nt // threads)
    return min(NB, -(-per // LANES) * LANES)


@njit(**_JIT)
def _step_rows(nb, kt):
    """Tile rows decoded per step for a band of nb tiles: the fewest (1, 2 or 4, dividing kt) whose lanes, rows
    times tiles, fill whole LANES-wide vectors (a 40-tile band takes 2 rows: 80 lanes, no idle lane)."""
    for R in (1, 2, 4):
        if (R * nb) % LANES == 0 and kt % R == 0:
            return R
    return 1


@njit(**_JIT)
def _lane_inputs(xh, i, R, nb, W, xl):
    """xl[t, r W + h nb + jj] = xh[t, 16 (i + h) + r]: each lane's input at each of the 16 rows of a step."""
    for t in range(xh.shape[0]):
        for r in range(16):
            for h in range(R):
                v = xh[t, 16 * (i + h) + r]
                for jj in range(nb):
                    xl[t, r * W + h * nb + jj] = v


@njit(parallel=True, fastmath=True, **_JIT)
def _gemm(words, xh, lut, um, ush, kind, W, out):
    """out[T, n] = xh[T, k] @ W_inner, W_inner decoded on the fly from the trellis [kt, nt, 8K] (uint32 view), in
    bands of up to W tiles. Accumulates in out's dtype: float32, or int64 for KIND_INT (each integer product is exact
    in float64).

    A step takes R tile rows of the band (_step_rows) as lanes h nb + jj, rounded up to whole LANES-wide vectors.
    Each tile position decodes all lanes at once (one window row, one shift), and each token adds them times the
    lanes' inputs into its [16 columns, lanes] accumulator. Lane h of a column sums the tile rows i = h mod R in
    order; the R partial sums are added in order at the end: a fixed order per column, the same for every token
    count, kind and thread team."""
    kt, nt, nw = words.shape
    wf, unw = words.reshape(-1), np.uint64(nw)
    T = xh.shape[0]
    nbands = (nt + W - 1) // W
    for b in prange(nbands):
        j0 = b * W
        nb = min(W, nt - j0)
        R = _step_rows(nb, kt)
        wl = (R * nb + LANES - 1) // LANES * LANES
        uwl = np.uint64(wl)
        ubuf = np.zeros(2 * nw * wl, np.uint32)
        wp = np.empty(wl, np.float32)
        # rows padded past a multiple of 4 KiB: token rows at 4 KiB strides make the CPU's store-to-load checks
        # see false conflicts (4K aliasing)
        xl = np.zeros((T, 16 * wl + 32), xh.dtype)
        acc = np.zeros((T, 16 * wl + 32), out.dtype)
        for i in range(0, kt, R):
            if i + R < kt:          # the next step's band words, a cache line (16 words) at a time
                for h in range(R):
                    t1 = np.uint64(((i + R + h) * nt + j0) * nw)
                    for q in range(0, nb * nw, 16):
                        prefetch(wf, t1 + np.uint64(q))
            for h in range(R):
                _gather_tiles(wf, unw, np.uint64(((i + h) * nt + j0) * nw), np.uint64(nb), np.uint64(h * nb), uwl,
                              ubuf)
            _odd_windows(ubuf, unw, uwl)
            fused = kind == KIND_MUL1 or kind == KIND_AFFINE
            if R > 1 or not fused:
                _lane_inputs(xh, i, R, nb, wl, xl)
            if fused:
                t0 = 0
                while t0 < T:       # tokens in groups of 4, 2, 1: one decode per group
                    g = 4 if T - t0 >= 4 else (2 if T - t0 >= 2 else 1)
                    _fused_fma(ubuf, uwl, um, ush, xh, 16 * i, xl, R, np.uint64(t0), g, kind, acc)
                    t0 += g
                continue
            for p in range(256):
                _decode_pos(ubuf, um[p] * uwl, ush[p], uwl, kind, lut, wp)
                _fma_tokens(wp, uwl, xl, np.uint64(p // 16) * uwl, np.uint64(p % 16) * uwl, acc)
        for tok in range(T):
            cst = np.float32(0.0)
            if kind == KIND_AFFINE:
                xs = np.float32(0.0)
                for q in range(xh.shape[1]):
                    xs += xh[tok, q]
                cst = _K_CONST * xs
            for jj in range(nb):
                for c in range(16):
                    v = acc[tok, c * wl + jj]
                    for h in range(1, R):
                        v += acc[tok, c * wl + h * nb + jj]
                    if kind == KIND_AFFINE:
                        v = _K_INV * v + cst
                    out[tok, 16 * (j0 + jj) + c] = v


@njit(parallel=True, **_JIT)
def _decode_inner(words, kind, lut, um, ush, out):
    """W_inner [k, n] float32 through the same band decode as _gemm (for bit-exact checks)."""
    kt, nt, nw = words.shape
    wf, unw = words.reshape(-1), np.uint64(nw)
    for b in prange((nt + NB - 1) // NB):
        j0 = b * NB
        nb = min(NB, nt - j0)
        wl = np.uint64((nb + LANES - 1) // LANES * LANES)
        ubuf = np.zeros(2 * nw * wl, np.uint32)
        wp = np.empty(wl, np.float32)
        for i in range(kt):
            _gather_tiles(wf, unw, np.uint64((i * nt + j0) * nw), np.uint64(nb), np.uint64(0), wl, ubuf)
            _odd_windows(ubuf, unw, wl)
            for p in range(256):
                _decode_pos(ubuf, um[p] * wl, ush[p], wl, kind, lut, wp)
                for jj in range(nb):
                    out[16 * i + p // 16, 16 * (j0 + jj) + p % 16] = wp[jj]


@njit(**_JIT)
def _int_gate_(g, u, shift, a_max):
    """g = clamp((min(max(g, 0), 2**31-1) * clamp(u, +-(2**31-1))) >> shift, +-a_max) in place (exl3-int)."""
    lim = np.int64(X.INT_CLAMP)
    for r in range(g.shape[0]):
        for q in range(g.shape[1]):
            gv = min(max(g[r, q], np.int64(0)), lim)
            uv = min(max(u[r, q], -lim), lim)
            g[r, q] = min(max((gv * uv) >> shift, -a_max), a_max)


# --------------------------------------------------------------------------------------------------------------------
# Linear and expert


@njit(**_JIT)
def _input_transform(x, suh, fp16, xh):
    """xh = had(x * suh) (rounded to fp16 when fp16)."""
    for r in range(x.shape[0]):
        for q in range(x.shape[1]):
            xh[r, q] = x[r, q] * suh[q]
    had_rows_(xh, np.float32(X.HAD_SCALE))
    if fp16:
        round16_(xh)


@njit(**_JIT)
def _output_transform(y, svh, fp16):
    """y = had(y) * c * svh in place, with the engine's fp16 roundings before and after."""
    if fp16:
        round16_(y)
    had_rows_(y, np.float32(X.HAD_SCALE))
    for r in range(y.shape[0]):
        for q in range(y.shape[1]):
            y[r, q] *= svh[q]
    if fp16:
        round16_(y)


@njit(**_JIT)
def _swiglu_(g, u, limit, fp16):
    """g = min(silu(g), limit) * clamp(u, -limit, limit) in place (limit <= 0: no clamp), fp32."""
    for r in range(g.shape[0]):
        for q in range(g.shape[1]):
            gv = g[r, q]
            s = gv / (np.float32(1.0) + np.float32(math.exp(min(-gv, np.float32(80.0)))))
            uv = u[r, q]
            if limit > 0:
                s = min(s, limit)
                uv = min(max(uv, -limit), limit)
            g[r, q] = s * uv
    if fp16:
        round16_(g)


@njit(**_JIT)
def _linear_nb(x, suh, svh, words, lut, um, ush, kind, W, fp16, y):
    """y = had(had(x * suh) @ W_inner) * svh with the engine's fp16 roundings: one call for the transforms and the
    GEMM (each kernel call from Python costs microseconds, which a small expert notices)."""
    xh = np.empty_like(x)
    _input_transform(x, suh, fp16, xh)
    _gemm(words, xh, lut, um, ush, kind, W, y)
    _output_transform(y, svh, fp16)


class _Linear:
    """One linear's kernel arguments: the trellis as uint32 words (a view), float32 scale vectors, tables."""

    __slots__ = ("words", "suh", "svh", "lut", "um", "ush", "k", "n", "kind")

    def __init__(self, lin, mode: str):
        t = lin.trellis
        if not t.flags.c_contiguous:
            raise ValueError("trellis: expected a contiguous array (it is read in place)")
        self.words = t.view(np.uint32)
        self.k, self.n = lin.k, lin.n
        self.suh = _scales(lin.suh)
        self.svh = _scales(lin.svh)
        self.um, self.ush = _tables(lin.K)
        if mode == "affine" and lin.codebook != "mul1":
            raise ValueError(f"mode 'affine' needs the mul1 codebook, this linear uses {lin.codebook!r}")
        if lin.codebook == "mul1":
            self.kind = KIND_AFFINE if mode == "affine" else KIND_MUL1
        else:
            self.kind = KIND_LUT
        self.lut = _SUM_AFFINE if self.kind == KIND_AFFINE else _lut32(lin.codebook if self.kind == KIND_LUT else "mul1")


_LUTS: dict = {}
_TABLES: dict = {}


def _lut32(codebook) -> np.ndarray:
    cb = X.codebook_index(codebook)
    if cb not in _LUTS:
        _LUTS[cb] = X.codebook_lut(cb).astype(np.float32)
    return _LUTS[cb]


def _tables(K: int):
    """(um, ush) per row-major tile position p: the state of the element placed at p is the 16-bit window starting
    at ring bit S = (t+1)K - 16 (mod 256K), t = TC_PERM_INV[p], i.e. ush = S % 16 bits into 16-bit unit
    um = S // 16. Unsigned, so numba emits no negative-index wraparound code in the hot loops."""
    if K not in _TABLES:
        X.window_tables(K)                     # validates K
        t = X.TC_PERM_INV.astype(np.int64)
        start = ((t + 1) * K - 16) % (256 * K)
        _TABLES[K] = ((start // 16).astype(np.uint64), (start % 16).astype(np.uint32))
    return _TABLES[K]


def _width(L: _Linear) -> int:
    """The band width for L on the current thread team (get_num_threads is the calling thread's team size)."""
    return _band_width(L.n // 16, get_num_threads())


def _scales(v: np.ndarray) -> np.ndarray:
    """fp16 scales (or their uint16 bit patterns) as float32: numpy's conversion is exact."""
    return np.ascontiguousarray(v).view(np.uint16).reshape(-1).view(np.float16).astype(np.float32)


def _linear(L: _Linear, x: np.ndarray, fp16: bool) -> np.ndarray:
    y = np.empty((x.shape[0], L.n), np.float32)
    _linear_nb(x, L.suh, L.svh, L.words, L.lut, L.um, L.ush, L.kind, _width(L), fp16, y)
    return y


@contextmanager
def _team(parallel: bool):
    """parallel=False: the same compiled kernels on a one-thread team for the calling thread (numba's thread count
    is thread-local), so results are bit-identical and no barrier waits on other cores."""
    old = get_num_threads()
    if not parallel:
        set_num_threads(1)
    try:
        yield
    finally:
        set_num_threads(old)


def _rows(x, width: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != width:
        raise ValueError(f"x: expected float32 [rows, {width}], got shape {list(x.shape)}")
    return x


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")


def decode_inner(trellis: np.ndarray, codebook="mul1", table: bool = False) -> np.ndarray:
    """W_inner (k, n) float32 through the kernel's band decode (every value an exact fp16). mul1 is decoded
    arithmetically as in the GEMM unless table=True (the lookup path every other codebook takes)."""
    t = np.ascontiguousarray(trellis)
    K = X.trellis_bits(t)
    out = np.empty((t.shape[0] * 16, t.shape[1] * 16), np.float32)
    um, ush = _tables(K)
    kind = KIND_MUL1 if X.codebook_index(codebook) == 2 and not table else KIND_LUT
    _decode_inner(t.view(np.uint32), kind, _lut32(codebook), um, ush, out)
    return out


def raw_gemm(xh, lin, mode: str = "exact", parallel: bool = True) -> np.ndarray:
    """The Hadamard-domain GEMM xh [T, k] @ W_inner, float32, no transforms or roundings (the one-hot check)."""
    _check_mode(mode)
    L = _Linear(lin, mode)
    xh = _rows(xh, L.k)
    y = np.empty((xh.shape[0], L.n), np.float32)
    with _team(parallel):
        _gemm(L.words, xh, L.lut, L.um, L.ush, L.kind, _width(L), y)
    return y


def linear_forward(x, lin, mode: str = "exact", fp16: bool = True, parallel: bool = True) -> np.ndarray:
    """y = x @ W for one EXL3 linear, float32 [T, n]."""
    _check_mode(mode)
    L = _Linear(lin, mode)
    x = _rows(x, L.k)
    if fp16:
        x = round16(x)
    with _team(parallel):
        return _linear(L, x, fp16)


def expert_forward(expert, x, act_limit: float | None = None, routing_weight=1.0, routed_scaling_factor: float = 1.0,
                   mode: str = "exact", fp16: bool = True, parallel: bool = True) -> np.ndarray:
    """One EXL3 expert (moetier.bytes.exl3.Exl3Expert or anything with gate/up/down linears) on token rows
    x [T, H] -> float32 [T, H], times routing_weight (scalar or per row) * routed_scaling_factor."""
    _check_mode(mode)
    gate, up, down = (_Linear(lin, mode) for lin in (expert.gate, expert.up, expert.down))
    x = _rows(x, gate.k)
    w = np.asarray(routing_weight, dtype=np.float32) * np.float32(routed_scaling_factor)
    with _team(parallel):
        if fp16:
            x = x.copy()
            round16_(x)
        g = _linear(gate, x, fp16)
        u = _linear(up, x, fp16)
        _swiglu_(g, u, np.float32(act_limit or 0.0), fp16)
        y = _linear(down, g, fp16)
    return y * (w[:, None] if w.ndim else w)


def _signs(v: np.ndarray) -> np.ndarray:
    """exl3-int's +-1 scales: the signs of suh/svh."""
    return np.where(np.signbit(v), -1, 1).astype(np.int64)


def _int_linear(L: _Linear, x: np.ndarray) -> np.ndarray:
    xh = x * _signs(L.suh)
    had_rows_(xh, np.int64(1))
    y = np.empty((x.shape[0], L.n), np.int64)
    _gemm(L.words, xh, _SUM_INT, L.um, L.ush, KIND_INT, _width(L), y)
    had_rows_(y, np.int64(1))
    y *= _signs(L.svh)
    return y


def _int_rows(x, width: int) -> np.ndarray:
    x = np.ascontiguousarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != width or x.dtype.kind not in "iu":
        raise ValueError(f"x: expected integers [rows, {width}], got {x.dtype} shape {list(x.shape)}")
    return x.astype(np.int64)


def int_linear_forward(x, lin, parallel: bool = True) -> np.ndarray:
    """exl3-int y = B(B(x * sign(suh)) @ W_int) * sign(svh), int64 [T, n] (moetier.bytes.exl3.int_linear_forward)."""
    L = _Linear(lin, "exact")
    x = _int_rows(x, L.k)
    with _team(parallel):
        return _int_linear(L, x)


def int_expert_forward(expert, x, shift: int, a_max: int = 7, weight=1, parallel: bool = True) -> np.ndarray:
    """exl3-int expert, int64 [T, H]: bit-identical to moetier.bytes.exl3.int_expert_forward on any lane."""
    gate, up, down = (_Linear(lin, "exact") for lin in (expert.gate, expert.up, expert.down))
    x = _int_rows(x, gate.k)
    w = np.asarray(weight, dtype=np.int64)
    with _team(parallel):
        g = _int_linear(gate, x)
        u = _int_linear(up, x)
        _int_gate_(g, u, np.int64(shift), np.int64(a_max))
        y = _int_linear(down, g)
    return y * (w[:, None] if w.ndim else w)


def round16(a) -> np.ndarray:
    """float32 copy of a rounded to fp16 values by the kernels' integer routine."""
    out = np.array(a, dtype=np.float32, copy=True)
    round16_(out)
    return out


def warmup(K: int = 3, codebook="mul1") -> None:
    """Compile (or load from numba's cache) the kernels: a one-tile-band expert at K bits."""
    rng = np.random.default_rng(0)
    ex = X.random_expert(rng, 128, 128, K, codebook)
    for mode in ("exact", "affine") if codebook == "mul1" else ("exact",):
        expert_forward(ex, np.zeros((1, 128), np.float32), act_limit=10.0, mode=mode)
