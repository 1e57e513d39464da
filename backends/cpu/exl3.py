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

Decode strategy: see backends/cpu/exl3_band.py (bands of up to NB tiles decoded side by side as vector lanes,
the decode inside the FMA loop for mul1, unsigned indices so that LLVM vectorises). mul1 is decoded without a
table; mcg and 3inst look the state up in a 65,536-entry table.

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
from numba import get_num_threads, set_num_threads

from backends.cpu.exl3_band import LANES, NB  # noqa: F401  (the band geometry, re-exported)
from backends.cpu.exl3_band import (KIND_AFFINE, KIND_INT, KIND_LUT, KIND_MUL1, _SUM_AFFINE, _SUM_INT, _band_width,
                                     _decode_inner, _gemm)
from backends.cpu.exl3_ops import JIT as _JIT
from backends.cpu.exl3_ops import had_rows_, round16_
from moetier.bytes import exl3 as X
from moetier.core.jit import kernel

MODES = ("exact", "affine")


@kernel(**_JIT)
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


@kernel(**_JIT)
def _input_transform(x, suh, fp16, xh):
    """xh = had(x * suh) (rounded to fp16 when fp16)."""
    for r in range(x.shape[0]):
        for q in range(x.shape[1]):
            xh[r, q] = x[r, q] * suh[q]
    had_rows_(xh, np.float32(X.HAD_SCALE))
    if fp16:
        round16_(xh)


@kernel(**_JIT)
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


@kernel(**_JIT)
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


@kernel(**_JIT)
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
    return np.asarray(v).view(np.float16).astype(np.float32).reshape(-1)


def _linear(L: _Linear, x: np.ndarray, fp16: bool) -> np.ndarray:
    y = np.empty((x.shape[0], L.n), np.float32)
    _linear_nb(x, L.suh, L.svh, L.words, L.lut, L.um, L.ush, L.kind, _width(L), fp16, y)
    return y


@contextmanager
def _team(parallel: bool):
    """parallel=False: the same compiled kernels on a one-thread team for the calling thread (numba's thread count
    is thread-local), so results are bit-identical and no barrier waits on other cores."""
    old = get_num_threads()
    if parallel or old == 1:       # nothing to change (each set costs microseconds, which a small expert notices)
        yield
        return
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
