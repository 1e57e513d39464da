"""Numba CPU lane kernels: one routed SwiGLU expert (moetier.expert record layout) for a few token rows.

Strategy (the one llama.cpp uses for q8_0 x q8 activations, widened to int16 activations):

* activations are quantized on the fly per token row to int16 with one float32 scale per row;
* each weight row is dotted with the quantized activations in exact int32 arithmetic (LLVM turns the
  int8 x int16 -> int32 reduction into vpmovsxbw + vpmaddwd), then scaled once;
* int8: one int32 sum per output element, so there is no float reduction at all;
  int4g32: an exact int32 product per weight byte (two columns), scaled by its group scale and summed in
  float32 (one flat loop over the row; the "-8" nibble offset is folded out per group).
* the activation range is chosen so that the int32 sums cannot overflow: |q_w| <= 128 (int8) and
  A = min(32767, (2**31 - 1) // (128 * n)) for a reduction of length n.

Determinism: every output element is computed by one thread with a fixed reduction order (parallel loops run
over (expert, output-row block) work items, never over a reduction), so results are bit-identical across runs
and independent of the thread count; the activation rounding is compiled without fastmath, so a process that
compiles the kernels and one that loads them from numba's cache agree too. The record is read in place from the
uint8 buffer it lives in.

Shared cores: a numba parallel region waits for its slowest thread, so when another process holds a core a call
can stall for a scheduler time slice (~16 ms measured). expert_forward(..., parallel=False) runs the same compiled
kernel on a one-thread team for the calling thread (GIL released), so a lane can run one Python worker thread per
core instead; see docs/expert-format.md for measured figures of both modes.
"""

from __future__ import annotations

import math
import time

import numpy as np
from numba import get_num_threads, prange, set_num_threads

from moetier.bytes.expert import EXL3, ExpertLayout, act_range, exl3_expert, section_offsets
from moetier.core.jit import kernel

_JIT = dict(fastmath=True, nogil=True)     # compiled into moetier.core.jit's cache
_JIT_STRICT = dict(_JIT, fastmath=False)    # for roundings whose result must not depend on FMA contraction
BLOCK = 16  # output rows per parallel work item



# --------------------------------------------------------------------------------------------------------------------
# Shared pieces


@kernel(**_JIT_STRICT)
def _quant_row(src, A, dst):
    """dst[:] = round(src * A / absmax) as int16; returns the dequant scale absmax / A.

    Strict IEEE on purpose: under fastmath LLVM may fuse src * inv + 0.5 into one FMA or not, and it chose
    differently for freshly compiled code and the same kernel loaded from numba's cache, so a product that rounds
    to k + 1/2 in float32 landed one int16 step apart between a first and a second process.
    """
    amax = np.float32(0.0)
    for i in range(src.shape[0]):
        v = abs(src[i])
        if v > amax:
            amax = v
    if amax == 0.0:
        for i in range(src.shape[0]):
            dst[i] = 0
        return np.float32(0.0)
    inv = np.float32(A) / amax
    for i in range(src.shape[0]):
        dst[i] = np.int16(math.floor(src[i] * inv + np.float32(0.5)))
    return amax / np.float32(A)


@kernel(**_JIT)
def _silu_mul(g, u):
    return g / (np.float32(1.0) + math.exp(-g)) * u


# --------------------------------------------------------------------------------------------------------------------
# int8 kernels


@kernel(**_JIT)
def _dot_i8(w, x):
    """Exact int32 dot of int8 weights with int16 activations.

    The explicit int32 truncations matter: numba widens int32 * int32 to int64, and only the truncated form lets
    LLVM emit vpmovsxbw + vpmaddwd (~33 GB/s per core here); one loop with two accumulators (gate and up fused)
    falls back to vpmulld at ~12 GB/s, so gate and up are separate calls over the same L1-resident x row.
    """
    s = np.int32(0)
    for i in range(w.shape[0]):
        s = np.int32(s + np.int32(np.int32(w[i]) * np.int32(x[i])))
    return s


@kernel(**_JIT)
def _int8_prep(x, A):
    q = np.empty(x.shape, np.int16)
    s = np.empty(x.shape[0], np.float32)
    for r in range(x.shape[0]):  # serial: a few rows, cheaper than another parallel region
        s[r] = _quant_row(x[r], A, q[r])
    return q, s


@kernel(**_JIT)
def _int8_gate_up_item(slab, recs, offs, H, F, xq, sx, rp, h, it):
    """Work item it = (expert e, block of BLOCK ffn rows): h[rows of e, block] = silu(gate) * up."""
    nb = (F + BLOCK - 1) // BLOCK
    e = it // nb
    f0 = (it % nb) * BLOCK
    f1 = min(F, f0 + BLOCK)
    b = recs[e]
    gq = slab[b + offs[0]:b + offs[0] + F * H].view(np.int8).reshape((F, H))
    uq = slab[b + offs[1]:b + offs[1] + F * H].view(np.int8).reshape((F, H))
    gs = slab[b + offs[3]:b + offs[3] + 4 * F].view(np.float32)
    us = slab[b + offs[4]:b + offs[4] + 4 * F].view(np.float32)
    for f in range(f0, f1):
        gw = gq[f]
        uw = uq[f]
        for r in range(rp[e], rp[e + 1]):
            g = np.float32(_dot_i8(gw, xq[r])) * (gs[f] * sx[r])
            u = np.float32(_dot_i8(uw, xq[r])) * (us[f] * sx[r])
            h[r, f] = _silu_mul(g, u)


@kernel(**_JIT)
def _int8_down_item(slab, recs, offs, H, F, hq, sh, rp, out, it):
    """Work item it = (expert e, block of BLOCK hidden rows): out[rows of e, block] = down @ h."""
    nb = (H + BLOCK - 1) // BLOCK
    e = it // nb
    o0 = (it % nb) * BLOCK
    o1 = min(H, o0 + BLOCK)
    b = recs[e]
    dq = slab[b + offs[2]:b + offs[2] + H * F].view(np.int8).reshape((H, F))
    ds = slab[b + offs[5]:b + offs[5] + 4 * H].view(np.float32)
    for o in range(o0, o1):
        dw = dq[o]
        for r in range(rp[e], rp[e + 1]):
            out[r, o] = np.float32(_dot_i8(dw, hq[r])) * (ds[o] * sh[r])


@kernel(parallel=True, **_JIT)
def _int8_forward(slab, recs, offs, H, F, x, rp, out, Ax, Ah):
    """recs[e]: byte offset of expert e's record in slab; rows rp[e]:rp[e+1] of x/out belong to expert e."""
    n = recs.shape[0]
    xq, sx = _int8_prep(x, Ax)
    h = np.empty((x.shape[0], F), np.float32)
    for it in prange(n * ((F + BLOCK - 1) // BLOCK)):
        _int8_gate_up_item(slab, recs, offs, H, F, xq, sx, rp, h, it)
    hq, sh = _int8_prep(h, Ah)
    for it in prange(n * ((H + BLOCK - 1) // BLOCK)):
        _int8_down_item(slab, recs, offs, H, F, hq, sh, rp, out, it)


# --------------------------------------------------------------------------------------------------------------------
# int4g32 kernels


@kernel(**_JIT)
def _split_even_odd(q, xe, xo, gsum):
    """xe/xo: even/odd columns of q (so each 16-byte group lines up with 16 lanes); gsum[g] = 8 * sum of group g."""
    G = q.shape[0] // 32
    for g in range(G):
        s = np.int32(0)
        for j in range(16):
            a = np.int32(q[g * 32 + 2 * j])
            c = np.int32(q[g * 32 + 2 * j + 1])
            xe[g * 16 + j] = a
            xo[g * 16 + j] = c
            s += a + c
        gsum[g] = 8 * s


@kernel(**_JIT)
def _dot_int4g32(wq, ws, xe, xo, gsum):
    """sum_g ws[g] * sum_{c in g} (nibble(c) - 8) * x[c].

    One flat loop over the row's bytes (byte k belongs to group k >> 4): an exact int32 product per byte, scaled
    by its group scale and summed in float32; the "- 8" offset is applied per group afterwards via gsum.
    (A per-group inner loop of 16 is not vectorised by LLVM here; this flat form is ~4x faster.)
    """
    acc = np.float32(0.0)
    for k in range(wq.shape[0]):
        bt = np.int32(wq[k])
        p = np.int32(np.int32(np.int32(bt & 15) * np.int32(xe[k])) + np.int32(np.int32(bt >> 4) * np.int32(xo[k])))
        acc += np.float32(p) * ws[k >> 4]
    for g in range(ws.shape[0]):
        acc -= np.float32(gsum[g]) * ws[g]
    return acc


@kernel(**_JIT)
def _int4_prep(x, A):
    """Per row: int16 quantization split into even/odd columns, group offsets, and the row scale."""
    nrow, n = x.shape
    xe = np.empty((nrow, n // 2), np.int16)
    xo = np.empty((nrow, n // 2), np.int16)
    xg = np.empty((nrow, n // 32), np.int32)
    sx = np.empty(nrow, np.float32)
    tmp = np.empty(n, np.int16)
    for r in range(nrow):  # serial: a few rows, cheaper than another parallel region
        sx[r] = _quant_row(x[r], A, tmp)
        _split_even_odd(tmp, xe[r], xo[r], xg[r])
    return xe, xo, xg, sx


@kernel(**_JIT)
def _int4_gate_up_item(slab, recs, offs, H, F, xe, xo, xg, sx, rp, h, it):
    nb = (F + BLOCK - 1) // BLOCK
    e = it // nb
    f0 = (it % nb) * BLOCK
    f1 = min(F, f0 + BLOCK)
    b = recs[e]
    GH = H // 32
    gq = slab[b + offs[0]:b + offs[0] + F * H // 2].reshape((F, H // 2))
    uq = slab[b + offs[1]:b + offs[1] + F * H // 2].reshape((F, H // 2))
    gs = slab[b + offs[3]:b + offs[3] + 4 * F * GH].view(np.float32).reshape((F, GH))
    us = slab[b + offs[4]:b + offs[4] + 4 * F * GH].view(np.float32).reshape((F, GH))
    for f in range(f0, f1):
        for r in range(rp[e], rp[e + 1]):
            g = _dot_int4g32(gq[f], gs[f], xe[r], xo[r], xg[r]) * sx[r]
            u = _dot_int4g32(uq[f], us[f], xe[r], xo[r], xg[r]) * sx[r]
            h[r, f] = _silu_mul(g, u)


@kernel(**_JIT)
def _int4_down_item(slab, recs, offs, H, F, he, ho, hg, sh, rp, out, it):
    nb = (H + BLOCK - 1) // BLOCK
    e = it // nb
    o0 = (it % nb) * BLOCK
    o1 = min(H, o0 + BLOCK)
    b = recs[e]
    GF = F // 32
    dq = slab[b + offs[2]:b + offs[2] + H * F // 2].reshape((H, F // 2))
    ds = slab[b + offs[5]:b + offs[5] + 4 * H * GF].view(np.float32).reshape((H, GF))
    for o in range(o0, o1):
        for r in range(rp[e], rp[e + 1]):
            out[r, o] = _dot_int4g32(dq[o], ds[o], he[r], ho[r], hg[r]) * sh[r]


@kernel(parallel=True, **_JIT)
def _int4_forward(slab, recs, offs, H, F, x, rp, out, Ax, Ah):
    n = recs.shape[0]
    xe, xo, xg, sx = _int4_prep(x, Ax)
    h = np.empty((x.shape[0], F), np.float32)
    for it in prange(n * ((F + BLOCK - 1) // BLOCK)):
        _int4_gate_up_item(slab, recs, offs, H, F, xe, xo, xg, sx, rp, h, it)
    he, ho, hg, sh = _int4_prep(h, Ah)
    for it in prange(n * ((H + BLOCK - 1) // BLOCK)):
        _int4_down_item(slab, recs, offs, H, F, he, ho, hg, sh, rp, out, it)


# --------------------------------------------------------------------------------------------------------------------
# Python API

_OFFS: dict = {}


def _offsets(lay: ExpertLayout) -> np.ndarray:
    k = (lay.hidden, lay.ffn, lay.encoding)
    o = _OFFS.get(k)
    if o is None:
        o = np.array(section_offsets(lay), np.int64)
        _OFFS[k] = o
    return o


def _as_u8(buf) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("expert buffer: expected a contiguous array (the record is read in place, never copied)")
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def _run(lay, slab, recs, x, rp, out, parallel=True):
    if recs.size and (recs.min() < 0 or recs.max() + lay.record_bytes > slab.size):
        raise ValueError(f"expert record out of bounds of its buffer ({slab.size} bytes)")
    H, F = lay.hidden, lay.ffn
    kern = _int8_forward if lay.encoding == "int8" else _int4_forward
    args = (slab, recs, _offsets(lay), H, F, x, rp, out, act_range(H), act_range(F))
    if parallel:
        kern(*args)
    else:
        # The same compiled kernel with a one-thread team for this calling thread (numba's thread count is
        # thread-local): bit-identical results, no barrier with other cores. (A separately compiled serial kernel
        # was measured 2x slower for int4: LLVM vectorised the inlined int4 dot differently.)
        old = get_num_threads()
        set_num_threads(1)
        try:
            kern(*args)
        finally:
            set_num_threads(old)
    return out


def _check_x(lay, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != lay.hidden:
        raise ValueError(f"x: expected float32 [rows, {lay.hidden}], got shape {list(x.shape)}")
    return x


def expert_forward(lay: ExpertLayout, buf_u8, x_f32, out_f32=None, parallel: bool = True) -> np.ndarray:
    """One expert on token rows x [rows, H] -> float32 [rows, H]; the record is read in place from buf_u8.

    parallel=False runs on the calling thread only (GIL released): use it from several Python threads when the
    cores are shared, since a numba parallel region waits for its slowest thread. Results are bit-identical.
    """
    if lay.encoding == EXL3:
        return _exl3_forward(lay, buf_u8, x_f32, out_f32, parallel)
    slab = _as_u8(buf_u8)
    x = _check_x(lay, x_f32)
    rows = x.shape[0]
    if out_f32 is None:
        out_f32 = np.empty((rows, lay.hidden), np.float32)
    elif out_f32.shape != (rows, lay.hidden) or out_f32.dtype != np.float32 or not out_f32.flags.c_contiguous:
        raise ValueError(f"out_f32: expected contiguous float32 [{rows}, {lay.hidden}]")
    return _run(lay, slab, np.zeros(1, np.int64), x, np.array([0, rows], np.int64), out_f32, parallel)


def _exl3_forward(lay: ExpertLayout, buf_u8, x_f32, out_f32=None, parallel: bool = True) -> np.ndarray:
    """An exl3 record through the EXL3 kernel (backends/cpu/exl3.py), reading the record's sections in place."""
    from backends.cpu import exl3 as kx
    y = kx.expert_forward(exl3_expert(lay, _as_u8(buf_u8)), _check_x(lay, x_f32), lay.act_limit or None,
                          parallel=parallel)
    if out_f32 is None:
        return y
    out_f32[...] = y
    return out_f32


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _rows_of(lay: ExpertLayout, xs, n: int):
    """(xcat float32 [sum rows, H], rows per expert, xs is one [n, rows, H] array) of experts_forward's ``xs``."""
    if isinstance(xs, np.ndarray) and xs.ndim == 3:
        if xs.shape[0] != n or xs.shape[2] != lay.hidden:
            raise ValueError(f"xs: expected [{n}, rows, {lay.hidden}], got {list(xs.shape)}")
        return np.ascontiguousarray(xs, dtype=np.float32).reshape(-1, lay.hidden), [xs.shape[1]] * n, True
    xl = [_check_x(lay, xs[e]) for e in range(n)]
    if len(xl) != n:
        raise ValueError(f"xs: expected {n} arrays, got {len(xl)}")
    rows = [a.shape[0] for a in xl]
    return (np.concatenate(xl) if n else np.empty((0, lay.hidden), np.float32)), rows, False


def _one_slab(lay: ExpertLayout, u8: list):
    """(slab, record offsets) when every record is a view into one contiguous array, else None."""
    if not u8:
        return None
    root = _root(u8[0])
    if not (root.flags.c_contiguous and all(_root(b) is root for b in u8)):
        return None
    slab = root.reshape(-1).view(np.uint8)
    base = slab.__array_interface__["data"][0]
    recs = np.array([b.__array_interface__["data"][0] - base for b in u8], np.int64)
    if not ((recs >= 0).all() and (recs + lay.record_bytes <= slab.size).all()):
        return None
    return slab, recs


def experts_forward(lay: ExpertLayout, bufs, xs, outs=None, parallel: bool = True):
    """Several experts in one parallel call (work items are (expert, output-row block) pairs).

    bufs: list of records (uint8 arrays, best all views into one slab; otherwise one call per expert).
    xs: float32 [n, rows, H] (same rows per expert) or a list of [rows_e, H] arrays.
    Returns float32 [n, rows, H] (array input) or a list of [rows_e, H] arrays; bit-identical to expert_forward.
    """
    n = len(bufs)
    if lay.encoding == EXL3:    # one expert at a time: the EXL3 kernel parallelises over an expert's output bands
        ys = [_exl3_forward(lay, bufs[e], xs[e], None, parallel) for e in range(n)]
        return np.stack(ys) if isinstance(xs, np.ndarray) and xs.ndim == 3 else ys
    xcat, rows, as_array = _rows_of(lay, xs, n)
    rp = np.zeros(n + 1, np.int64)
    rp[1:] = np.cumsum(rows)
    out = np.empty((int(rp[-1]), lay.hidden), np.float32)
    u8 = [_as_u8(b) for b in bufs]
    for i, b in enumerate(u8):
        if b.size < lay.record_bytes:
            raise ValueError(f"bufs[{i}]: expected at least {lay.record_bytes} bytes, got {b.size}")
    shared = _one_slab(lay, u8)
    if shared is not None:  # all records are views into one contiguous array: address them as offsets into it
        _run(lay, shared[0], shared[1], xcat, rp, out, parallel)
    else:
        for e in range(n):
            _run(lay, u8[e], np.zeros(1, np.int64), xcat[rp[e]:rp[e + 1]], np.array([0, rows[e]], np.int64),
                 out[rp[e]:rp[e + 1]], parallel)
    if as_array:
        res = out.reshape(n, xs.shape[1], lay.hidden)
        if outs is not None:
            outs[...] = res
            return outs
        return res
    res = [out[rp[e]:rp[e + 1]] for e in range(n)]
    if outs is not None:
        for o, r in zip(outs, res):
            o[...] = r
        return outs
    return res


def warmup(lay: ExpertLayout) -> None:
    """Compile (or load from the on-disk cache) the kernel for this layout's encoding.

    Numba specialises on writability, so both a writable buffer (RAM slot) and a read-only one (bytes,
    read-only mmap) are warmed.
    """
    if lay.encoding == EXL3:
        from backends.cpu import exl3 as kx
        kx.warmup(lay.bits, lay.codebook)
    buf = np.zeros(lay.record_bytes, np.uint8)
    x = np.zeros((1, lay.hidden), np.float32)
    ro = buf.view()
    ro.flags.writeable = False
    for b in (buf, ro):
        expert_forward(lay, b, x)


# --------------------------------------------------------------------------------------------------------------------
# Memory bandwidth (the denominator of the kernel efficiency figures)


@kernel(parallel=True, **_JIT)
def _psum(a, nchunks):
    n = a.shape[0]
    step = (n + nchunks - 1) // nchunks
    part = np.zeros(nchunks, np.float32)
    for c in prange(nchunks):
        blk = a[c * step:min(n, (c + 1) * step)]
        s = np.float32(0.0)
        for i in range(blk.shape[0]):  # loop from 0 so LLVM can prove indices non-negative and vectorize
            s += blk[i]
        part[c] = s
    return part.sum()


def membw_read_gbps(nbytes: int = 1 << 30, threads: int | None = None, repeats: int = 5) -> float:
    """Best-of-N read bandwidth (GB/s, 1e9 bytes/s) of a numba prange float32 sum over nbytes."""
    a = np.ones(max(1, nbytes // 4), np.float32)
    old = get_num_threads()
    if threads is not None:
        set_num_threads(int(threads))
    try:
        nch = get_num_threads() * 8
        _psum(a, nch)
        best = math.inf
        for _ in range(repeats):
            t = time.perf_counter()
            _psum(a, nch)
            best = min(best, time.perf_counter() - t)
    finally:
        set_num_threads(old)
    return a.nbytes / best / 1e9
