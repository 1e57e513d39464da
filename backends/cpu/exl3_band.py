"""The band GEMM of the Numba EXL3 kernel (backends/cpu/exl3.py): xh [T, k] @ W_inner, W_inner decoded on the fly
from a trellis (uint32 view [k/16, n/16, 8K]), and the same decode into a dense W_inner for bit-exact checks.

Contract: ``_gemm(words, xh, lut, um, ush, kind, W, out)`` writes out[T, n] = xh @ W_inner for the decode kind (KIND_LUT:
the codebook table lut; KIND_MUL1: mul1 arithmetic, bit-identical to the table; KIND_AFFINE: mul1 byte sums, which the
caller turns into weights by the affine identity; KIND_INT: exl3-int weights, s - 510, into an int64 out), with
(um, ush) the window tables in row-major tile order and W the band width (_band_width). ``_decode_inner`` writes the
decoded W_inner. Each output column has one fixed reduction order whatever the token count, kind or thread team.

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
mcg and 3inst look the state up in a 65,536-entry table. The trellis streams from memory a step ahead of the
decode through software prefetches spread over the step (see _gemm), so a step seldom waits on memory.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from backends.cpu.exl3_ops import JIT as _JIT
from backends.cpu.exl3_ops import fp16_round, prefetch, shl32, transpose8
from moetier.bytes import exl3 as X
from moetier.core.jit import kernel

NB = 64                     # most tiles per output band (1024 columns)
LANES = 16                  # tiles per vector step: one 512-bit vector of float32 (two 256-bit ones)
# decode: table lookup (any codebook), mul1 arithmetic, mul1 affine (byte sums), exl3-int (byte sum - 510)
KIND_LUT, KIND_MUL1, KIND_AFFINE, KIND_INT = 0, 1, 2, 3

_SUM_AFFINE = np.array([1.0, 0.0], np.float32)                   # KIND_AFFINE's "table": s * 1 + 0
_SUM_INT = np.array([1.0, -X.MUL1_BYTE_SUM_MID], np.float32)     # KIND_INT's: s * 1 - 510
_K_INV = np.float32(X.MUL1_K_INV)
_K_CONST = np.float32(1024.0 * X.MUL1_K_INV + X.MUL1_K_BIAS)   # exact in float32 (a multiple of 2**-18)



@kernel(fastmath=True, **_JIT)
def _gather_tiles(wf, nw, t0, nb, lane0, W, ubuf):
    """ubuf[2w W + lane0 + jj] = word w of tile jj of a band's tile row (wf: the trellis as flat uint32 words, 8K =
    nw per tile; t0: the row's first band word; W: the band's lane count): the even rows of _odd_windows' table.
    Blocks of 8 tiles x 8 words (nw = 8K is a multiple of 8) go through transpose8's vector shuffles, 64 words per
    16 vector loads and stores instead of a load and a store per word; the last nb % 8 tiles word by word. All
    arguments are unsigned (no negative-index wraparound code)."""
    two, eight = np.uint64(2), np.uint64(8)
    nb8 = nb // eight * eight
    for wb in range(nw // eight):
        w0 = np.uint64(wb) * eight
        for jb in range(nb // eight):
            j0 = np.uint64(jb) * eight
            transpose8(wf, t0 + j0 * nw + w0, nw, ubuf, two * w0 * W + lane0 + j0, two * W)
    for w in range(nw):
        w = np.uint64(w)
        e = two * w * W + lane0
        for jj in range(nb - nb8):
            jj = nb8 + np.uint64(jj)
            ubuf[e + jj] = wf[t0 + jj * nw + w]


@kernel(fastmath=True, **_JIT)
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


@kernel(inline="always", **_JIT)
def _state(ubuf, o, sh):
    """The 16-bit window starting sh bits into the 32-bit window ubuf[o]: its top half << sh (exl3_dq.cuh's funnel
    shift), in 32-bit ops so LLVM keeps 16 lanes per vector."""
    return np.uint32(shl32(ubuf[o], sh) >> np.uint32(16))


@kernel(inline="always", **_JIT)
def _byte_sum(st):
    """Sum of the four bytes of st * 0x83DCD12D mod 2**32, in 32-bit ops."""
    p = np.uint32(st * np.uint32(X.MUL1_MULT))
    lo = np.uint32(p & np.uint32(0x00FF00FF))
    q = np.uint32(lo + np.uint32(np.uint32(p >> np.uint32(8)) & np.uint32(0x00FF00FF)))
    return np.uint32(np.uint32(q & np.uint32(0xFFFF)) + np.uint32(q >> np.uint32(16)))


@kernel(inline="always", **_JIT)
def _mul1(ubuf, o, sh):
    """The mul1 weight of the state at (o, sh), without a table: fp16(k_inv (1024 + s) + k_bias). The float32 affine
    value is exact (a multiple of 2**-18 below 4), so one rounding to fp16 (fp16_round: F16C's conversion pair) is the
    table's value. The byte sum's last step is folded into a multiply: with q the two 16-bit pair sums,
    (q * 0x10001) & 0xFFFF0000 is s * 65536 (s < 1024 fits the high half), and s * 65536 times k_inv / 65536 is
    s k_inv exactly (a power-of-two scaling), so the weight is unchanged and the decode saves an operation."""
    return fp16_round(np.float32(np.int32(_byte_sum(_state(ubuf, o, sh)))) * _K_INV + _K_CONST)


@kernel(fastmath=True, **_JIT)
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


@kernel(**_JIT)
def _next_lines(nt, nw, j0, nb, i1, R, kt, pf):
    """pf[:n] = word offsets that touch every cache line of the band's words in tile rows i1..i1+R-1 (none past
    kt): one per 16 words (a 64-byte line) and each row's last word, whatever the words' alignment; returns n."""
    n = 0
    for h in range(R):
        if i1 + h >= kt:
            break
        t1 = ((i1 + h) * nt + j0) * nw
        for q in range(0, nb * nw, 16):
            pf[n] = t1 + q
            n += 1
        pf[n] = t1 + nb * nw - 1
        n += 1
    return n


@kernel(inline="always", **_JIT)
def _prefetch_part(wf, pf, n, part, parts):
    """Prefetch part `part` of `parts` equal parts of the lines pf[:n]. The next step's lines are prefetched a part
    at a time while this step computes, not in one burst before it: a burst of software prefetches that miss the
    cache fills the core's miss buffers and stalls it for a memory latency, as long as a demand miss would, while a
    few per part complete under the part's compute (a part is a 1/16 of a step, which at one token is hundreds of
    nanoseconds, more than a memory latency)."""
    per = (n + parts - 1) // parts
    for q in range(part * per, min(n, (part + 1) * per)):
        prefetch(wf, np.uint64(pf[q]))


@kernel(inline="always", fastmath=True, **_JIT)
def _fused_rows(ubuf, W, um, ush, xh, r0, xl, t0, acc, kind, ntok, lane_x, wf, pf, npf):
    """_fused_fma's loops for a band of W lanes and tokens t0..t0+ntok-1; kind, ntok and lane_x are constants where
    this is inlined, so the branches fold and the token loop unrolls, leaving the lane loop innermost (vectorised).
    lane_x: each lane's input is xl[t, r W + L] (a step of several tile rows), else all lanes take xh[t, r0 + r].
    Each of the 16 rows first issues its sixteenth of the next step's prefetches (_prefetch_part)."""
    for r in range(16):
        _prefetch_part(wf, pf, npf, r, 16)
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


@kernel(inline="always", fastmath=True, **_JIT)
def _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, kind, ntok, wf, pf, npf):
    """_fused_rows for one kind and token count: per-lane inputs for a step of R > 1 tile rows, else one input per
    row, with W a constant for a full band (LLVM unrolls its lane loop into NB / LANES vectors)."""
    if R > 1:
        _fused_rows(ubuf, W, um, ush, xh, r0, xl, t0, acc, kind, ntok, True, wf, pf, npf)
    elif W == NB:
        _fused_rows(ubuf, np.uint64(NB), um, ush, xh, r0, xl, t0, acc, kind, ntok, False, wf, pf, npf)
    else:
        _fused_rows(ubuf, W, um, ush, xh, r0, xl, t0, acc, kind, ntok, False, wf, pf, npf)


@kernel(inline="always", fastmath=True, **_JIT)
def _fused_tokens(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, kind, ntok, wf, pf, npf):
    """_fused_kind with the token count (1, 2 or 4) a constant in each branch."""
    if ntok == 4:
        _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, kind, 4, wf, pf, npf)
    elif ntok == 2:
        _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, kind, 2, wf, pf, npf)
    else:
        _fused_kind(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, kind, 1, wf, pf, npf)


@kernel(fastmath=True, **_JIT)
def _fused_fma(ubuf, W, um, ush, xh, r0, xl, R, t0, ntok, kind, acc, wf, pf, npf):
    """Tokens t0..t0+ntok-1 (ntok 1, 2 or 4; KIND_MUL1 or KIND_AFFINE), one step of R tile rows from input row r0:
    acc[t, c W + L] += the weight of lane L at tile position (r, c) times its input, for all 256 positions, decoding
    each weight (mul1) or byte sum (affine) in the loop that uses it, so nothing decoded goes through memory. Every
    accumulator takes the same products in the same order whatever the token grouping, so a token's bits do not
    depend on the batch. W and t0 are unsigned (as are all indices: see _decode_pos)."""
    if kind == KIND_MUL1:
        _fused_tokens(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_MUL1, ntok, wf, pf, npf)
    else:
        _fused_tokens(ubuf, W, um, ush, xh, r0, xl, R, t0, acc, KIND_AFFINE, ntok, wf, pf, npf)


@kernel(fastmath=True, **_JIT)
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


@kernel(**_JIT)
def _step_rows(nb, kt):
    """Tile rows decoded per step for a band of nb tiles: the fewest (1, 2 or 4, dividing kt) whose lanes, rows
    times tiles, fill whole LANES-wide vectors (a 40-tile band takes 2 rows: 80 lanes, no idle lane)."""
    for R in (1, 2, 4):
        if (R * nb) % LANES == 0 and kt % R == 0:
            return R
    return 1


@kernel(**_JIT)
def _lane_inputs(xh, i, R, nb, W, xl):
    """xl[t, r W + h nb + jj] = xh[t, 16 (i + h) + r]: each lane's input at each of the 16 rows of a step."""
    for t in range(xh.shape[0]):
        for r in range(16):
            for h in range(R):
                v = xh[t, 16 * (i + h) + r]
                for jj in range(nb):
                    xl[t, r * W + h * nb + jj] = v


@kernel(parallel=True, fastmath=True, **_JIT)
def _gemm(words, xh, lut, um, ush, kind, W, out):
    """out[T, n] = xh[T, k] @ W_inner, W_inner decoded on the fly from the trellis [kt, nt, 8K] (uint32 view), in
    bands of up to W tiles. Accumulates in out's dtype: float32, or int64 for KIND_INT (each integer product is exact
    in float64).

    A step takes R tile rows of the band (_step_rows) as lanes h nb + jj, rounded up to whole LANES-wide vectors.
    Each tile position decodes all lanes at once (one window row, one shift), and each token adds them times the
    lanes' inputs into its [16 columns, lanes] accumulator. Lane h of a column sums the tile rows i = h mod R in
    order; the R partial sums are added in order at the end: a fixed order per column, the same for every token
    count, kind and thread team.

    While a step computes, it prefetches the next step's band words a part at a time (_next_lines, _prefetch_part):
    the hardware prefetchers alone leave the start of each step's gather waiting on memory, as the band moves to
    rows they have not fetched yet (a strided band, or a new 4 KiB page)."""
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
        pf = np.empty(R * (nb * nw // 16 + 2), np.uint64)
        for i in range(0, kt, R):
            npf = _next_lines(nt, nw, j0, nb, i + R, R, kt, pf)
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
                    _fused_fma(ubuf, uwl, um, ush, xh, 16 * i, xl, R, np.uint64(t0), g, kind, acc, wf, pf,
                               npf if t0 == 0 else 0)
                    t0 += g
                continue
            for p in range(256):
                _prefetch_part(wf, pf, npf, p, 256)
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


@kernel(parallel=True, **_JIT)
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
