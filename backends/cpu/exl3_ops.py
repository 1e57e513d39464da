"""Scalar and row primitives of the Numba EXL3 kernel (backends/cpu/exl3.py): fp16 rounding, the
128-block Hadamard butterfly, and LLVM intrinsics that keep the decode loop in 32-bit vector lanes.

Contract: ``round16_(a)`` rounds a float32 array in place to the nearest fp16 value exactly as numpy's float32 ->
float16 -> float32 does (ties to even, overflow to inf, subnormals); ``had_rows_(a, scale)`` is exllamav3's butterfly
order on each 128-wide block of each row, times scale.
``fp16_round(v)`` is the same rounding for one float32 value: LLVM's fptrunc to half and back, one vcvtps2ph /
vcvtph2ps pair per 16 lanes on x86 with F16C or on arm64 (``HW_FP16``); elsewhere an integer round of the float32
bits to 10 mantissa bits, exact wherever no fp16 subnormal or overflow case arises, which covers every value the
decode rounds (mul1 weights are multiples of 2**-18 in [-3.46, 3.35]: one below 2**-14 has at most 4 significant
bits and is already an fp16 value). ``shl32(a, s)`` is a 32-bit left shift (numba widens
integer shifts to 64 bits, which splits a 16-lane loop into two 8-lane halves); s must be below 32.
``transpose8`` moves an 8 x 8 block of 32-bit words to its transpose with vector loads, shuffles and stores
(generic LLVM shufflevector: every target lowers it); ``prefetch`` is llvm.prefetch.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from moetier.core.jit import kernel

JIT = dict(nogil=True)                  # compiled into moetier.core.jit's cache


def _hw_fp16() -> bool:
    """True where LLVM lowers fptrunc/fpext between float and half to instructions (no runtime-library call)."""
    arch = platform.machine().lower()
    if arch in ("aarch64", "arm64"):
        return True
    if arch in ("x86_64", "amd64"):
        try:
            return bool(_llvm.get_host_cpu_features().get("f16c", False))
        except RuntimeError:      # llvmlite cannot read the host's features: take the integer routine
            return False
    return False


HW_FP16 = _hw_fp16()


@intrinsic
def shl32(typingctx, a, s):
    """a << s in 32 bits (a, s uint32, s < 32)."""
    sig = types.uint32(types.uint32, types.uint32)

    def codegen(context, builder, signature, args):
        return builder.shl(args[0], args[1])
    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, i):
    """Hint that arr[i] will be read soon (llvm.prefetch: read, keep in all cache levels); no effect on results."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(a.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def transpose8(typingctx, src, so, ss, dst, do, ds):
    """dst[do + b ds + a] = src[so + a ss + b] for a, b < 8 (uint32 arrays, unsigned offsets and strides): eight
    8-word rows loaded as vectors, transposed by three shuffle stages, stored as eight 8-word rows. No bounds check:
    the caller keeps every index inside its array."""
    sig = types.void(src, so, ss, dst, do, ds)

    def codegen(context, builder, signature, args):
        s_arr = context.make_array(signature.args[0])(context, builder, args[0])
        d_arr = context.make_array(signature.args[3])(context, builder, args[3])
        vty = ir.VectorType(ir.IntType(32), 8)
        vp = vty.as_pointer()
        so_, ss_, do_, ds_ = args[1], args[2], args[4], args[5]
        rows = []
        for a in range(8):
            off = builder.add(so_, builder.mul(ss_, ir.Constant(ss_.type, a)))
            ptr = builder.bitcast(builder.gep(s_arr.data, [off]), vp)
            rows.append(builder.load(ptr, align=4))

        def shuf(x, y, mask):
            return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(ir.IntType(32), 8), mask))
        # stage 1: 32-bit interleave of row pairs (per 128-bit half); stage 2: 64-bit; stage 3: 128-bit halves
        t = []
        for a in range(0, 8, 2):
            t += [shuf(rows[a], rows[a + 1], [0, 8, 1, 9, 4, 12, 5, 13]),
                  shuf(rows[a], rows[a + 1], [2, 10, 3, 11, 6, 14, 7, 15])]
        lo64, hi64 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
        s = [shuf(t[0], t[2], lo64), shuf(t[0], t[2], hi64), shuf(t[1], t[3], lo64), shuf(t[1], t[3], hi64),
             shuf(t[4], t[6], lo64), shuf(t[4], t[6], hi64), shuf(t[5], t[7], lo64), shuf(t[5], t[7], hi64)]
        lo128, hi128 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
        cols = [None] * 8
        for b in range(4):
            cols[b] = shuf(s[b], s[b + 4], lo128)
            cols[b + 4] = shuf(s[b], s[b + 4], hi128)
        for b in range(8):
            off = builder.add(do_, builder.mul(ds_, ir.Constant(ds_.type, b)))
            ptr = builder.bitcast(builder.gep(d_arr.data, [off]), vp)
            builder.store(cols[b], ptr, align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _f32_bits(typingctx, v):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return sig, codegen


@intrinsic
def _bits_f32(typingctx, b):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@intrinsic
def _fptrunc_half(typingctx, v):
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return sig, codegen


@kernel(inline="always", **JIT)
def fp16_round(v):
    """v (float32) rounded to the nearest fp16 value, ties to even: exact for every input with HW_FP16, for inputs
    that need no subnormal or overflow handling otherwise (see the module docstring)."""
    if HW_FP16:
        return _fptrunc_half(v)
    m = _f32_bits(v)
    return _bits_f32(np.uint32(np.uint32(m + np.uint32(0xFFF) + np.uint32(np.uint32(m >> np.uint32(13)) & np.uint32(1)))
                               & np.uint32(0xFFFFE000)))


@kernel(**JIT)
def round16_(a):
    """Round a float32 array in place to the nearest fp16 value (ties to even; overflow to inf), like numpy's
    float32 -> float16 -> float32. With HW_FP16 the conversion pair of fp16_round (one vector pass; NaNs kept as
    they are); elsewhere an integer routine, independent of fastmath and of numba's float16 support."""
    flat = a.reshape(-1)
    u = flat.view(np.uint32)
    if HW_FP16:
        for q in range(u.shape[0]):
            i = np.uint64(q)
            v = flat[i]
            r = _fptrunc_half(v)
            flat[i] = v if np.uint32(u[i] & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r
        return
    for i in range(u.shape[0]):
        v = u[i]
        sign = v & np.uint32(0x80000000)
        m = v & np.uint32(0x7FFFFFFF)
        if m >= np.uint32(0x7F800000):            # inf / nan stay
            continue
        if m >= np.uint32(0x477FF000):            # >= 65520 rounds past the largest fp16
            u[i] = sign | np.uint32(0x7F800000)
        elif m >= np.uint32(0x38800000):          # fp16 normal: keep 10 of 23 mantissa bits
            m = (m + np.uint32(0xFFF) + ((m >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
            u[i] = sign | m
        else:                                     # fp16 subnormal: a multiple of 2**-24
            e = m >> np.uint32(23)
            if e < 102:
                u[i] = sign
            else:
                sh = np.uint32(126) - e
                q = (m & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
                half = np.uint32(1) << (sh - np.uint32(1))
                q = (q + half - np.uint32(1) + ((q >> sh) & np.uint32(1))) >> sh
                f = np.float32(q) * np.float32(2.0 ** -24)
                flat[i] = -f if sign else f


@kernel(**JIT)
def had_rows_(a, scale):
    """In place: each 128-wide block of each row of a [T, n] -> butterfly, times scale."""
    T, n = a.shape
    for r in range(T):
        row = a[r]
        for b in range(n // 128):
            b0 = np.uint64(128 * b)
            h = np.uint64(1)
            while h < np.uint64(128):
                for s in range(128 // (2 * h)):
                    s0 = b0 + np.uint64(s) * np.uint64(2) * h
                    for q in range(h):      # unsigned indices: LLVM vectorises the wider stages
                        i = s0 + np.uint64(q)
                        p = row[i]
                        o = row[i + h]
                        row[i] = p + o
                        row[i + h] = p - o
                h *= np.uint64(2)
            for q in range(128):
                row[b0 + np.uint64(q)] *= scale
