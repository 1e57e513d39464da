"""CUDA C source of the CUDA backend's EXL3 expert kernels (cupy.RawModule / NVRTC), and their launch sequence.

The same math as backends/sycl/exl3.cl (and the spec, moetier.bytes.exl3): per linear an input transform
round16(had(round16(x) * suh)), the raw GEMM xh @ W_inner with W_inner decoded on the fly from the record's int16
tiles (state = the 16-bit window of the tile's MSB-first ring ending at bit (t+1) K; weight = lut[state]; element t
at row-major tile position perm[t]), then round16(had(round16(y)) * svh); the SwiGLU intermediate (clamped by
act_limit) is rounded to fp16; products accumulate in float32 (adapters.md section 2.4). fp16 rounding is an
integer round-to-nearest-even on the float32 bits (as backends/cpu/exl3.py), so no cuda_fp16 header is needed.

Work-items: one thread per (row, 128-block) for the transforms, per (job, output column) for the GEMM (tile rows in
order, the 16 rows of a tile in order), per element for SwiGLU and the decode. Every output element has one owner and
a fixed order: no atomics, the same bits whichever lane (gpu: device slot; zerocopy: mapped host slot) and batch.
Job table: int64 [jobs, 3] (record address, first row, rows), as the int kernels'; ``rexp`` maps a row to its job.
"""
from __future__ import annotations

import numpy as np

THREADS = 128

SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;

__device__ __forceinline__ float r16(float v) {
    unsigned u = __float_as_uint(v);
    const unsigned sign = u & 0x80000000u;
    unsigned m = u & 0x7FFFFFFFu;
    if (m >= 0x7F800000u) return v;                                   // inf / nan
    if (m >= 0x477FF000u) return __uint_as_float(sign | 0x7F800000u);   // past the largest fp16
    if (m >= 0x38800000u) {                                           // fp16 normal: keep 10 mantissa bits
        m = (m + 0xFFFu + ((m >> 13) & 1u)) & 0xFFFFE000u;
        return __uint_as_float(sign | m);
    }
    const int e = (int)(m >> 23);                                     // fp16 subnormal: a multiple of 2**-24
    if (e < 102) return __uint_as_float(sign);
    const unsigned sh = 126u - (unsigned)e;
    unsigned q = (m & 0x7FFFFFu) | 0x800000u;
    q = (q + (1u << (sh - 1u)) - 1u + ((q >> sh) & 1u)) >> sh;
    const float f = (float)q * 5.9604644775390625e-08f;
    return sign ? -f : f;
}

__device__ __forceinline__ float h2f(unsigned short h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = (float)m * 5.9604644775390625e-08f;
    else if (e == 31) v = m ? __int_as_float(0x7FC00000) : __int_as_float(0x7F800000);
    else v = ldexpf((float)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

__device__ __forceinline__ void butterfly128(float* v) {
    for (int h = 1; h < 128; h *= 2)
        for (int s = 0; s < 128; s += 2 * h)
            for (int q = s; q < s + h; q++) {
                const float a = v[q], b = v[q + h];
                v[q] = a + b;
                v[q + h] = a - b;
            }
}

#define HAD_SCALE 0.08838834764831845f

extern "C" __global__ void exl3_in(const i64* __restrict__ jobs, const int* __restrict__ rexp, const i64 suh_off,
                                   const int k, const float* __restrict__ x, const int round_x, const int fp16,
                                   float* __restrict__ xh, const int total) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int nb = k / 128, r = idx / nb, blk = idx % nb;
    const unsigned short* suh = (const unsigned short*)(jobs[3 * rexp[r]] + suh_off);
    float v[128];
    for (int q = 0; q < 128; q++) {
        const int c = blk * 128 + q;
        const float xv = round_x ? r16(x[(i64)r * k + c]) : x[(i64)r * k + c];
        v[q] = xv * h2f(suh[c]);
    }
    butterfly128(v);
    for (int q = 0; q < 128; q++) {
        const float o = v[q] * HAD_SCALE;
        xh[(i64)r * k + blk * 128 + q] = fp16 ? r16(o) : o;
    }
}

extern "C" __global__ void exl3_out(const i64* __restrict__ jobs, const int* __restrict__ rexp, const i64 svh_off,
                                    const int n, const int fp16, float* __restrict__ y, const int total) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int nb = n / 128, r = idx / nb, blk = idx % nb;
    const unsigned short* svh = (const unsigned short*)(jobs[3 * rexp[r]] + svh_off);
    float* row = y + (i64)r * n + blk * 128;
    float v[128];
    for (int q = 0; q < 128; q++) v[q] = fp16 ? r16(row[q]) : row[q];
    butterfly128(v);
    for (int q = 0; q < 128; q++) {
        const float o = v[q] * HAD_SCALE * h2f(svh[blk * 128 + q]);
        row[q] = fp16 ? r16(o) : o;
    }
}

__device__ __forceinline__ unsigned state_of(const unsigned* w, const int t, const int K) {
    const int words = 8 * K;
    const int end = (t + 1) * K + 256 * K;
    const int i0 = ((end - 16) / 32) % words;
    const int i1r = (end - 1) / 32;
    const int sh = (i1r + 1) * 32 - end;
    const u64 m = ((u64)w[i0] << 32) | (u64)w[i1r % words];
    return (unsigned)((m >> sh) & 0xFFFFu);
}

extern "C" __global__ void exl3_gemm(const i64* __restrict__ jobs, const int nj, const i64 tr_off, const int k,
                                     const int n, const int K, const float* __restrict__ lut,
                                     const int* __restrict__ pinv, const float* __restrict__ xh,
                                     float* __restrict__ out) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= nj * n) return;
    const int e = idx / n, col = idx % n;
    const int r0 = (int)jobs[3 * e + 1], r1 = r0 + (int)jobs[3 * e + 2];
    const int j = col / 16, c = col % 16, nt = n / 16;
    const unsigned char* tr = (const unsigned char*)(jobs[3 * e] + tr_off);
    for (int r = r0; r < r1; r++) out[(i64)r * n + col] = 0.0f;
    for (int i = 0; i < k / 16; i++) {
        const unsigned* w = (const unsigned*)(tr + ((i64)i * nt + j) * 32 * K);
        float wv[16];
        for (int rr = 0; rr < 16; rr++) wv[rr] = lut[state_of(w, pinv[rr * 16 + c], K)];
        for (int r = r0; r < r1; r++) {
            float acc = out[(i64)r * n + col];
            const float* xr = xh + (i64)r * k + 16 * i;
            for (int rr = 0; rr < 16; rr++) acc = __fadd_rn(acc, __fmul_rn(wv[rr], xr[rr]));
            out[(i64)r * n + col] = acc;
        }
    }
}

extern "C" __global__ void exl3_decode(const unsigned char* __restrict__ tr, const int k, const int n, const int K,
                                       const float* __restrict__ lut, const int* __restrict__ pinv,
                                       float* __restrict__ out) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= k * n) return;
    const int row = idx / n, col = idx % n, nt = n / 16;
    const unsigned* w = (const unsigned*)(tr + ((i64)(row / 16) * nt + col / 16) * 32 * K);
    out[idx] = lut[state_of(w, pinv[(row % 16) * 16 + col % 16], K)];
}

extern "C" __global__ void exl3_swiglu(float* __restrict__ g, const float* __restrict__ u, const float limit,
                                       const int fp16, const int total) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float gv = g[i];
    float s = gv / (1.0f + expf(fminf(-gv, 80.0f)));
    float uv = u[i];
    if (limit > 0.0f) {
        s = fminf(s, limit);
        uv = fminf(fmaxf(uv, -limit), limit);
    }
    const float a = s * uv;
    g[i] = fp16 ? r16(a) : a;
}
"""

KERNEL_NAMES = ("exl3_in", "exl3_out", "exl3_gemm", "exl3_decode", "exl3_swiglu")


def _grid(n: int) -> tuple:
    return ((max(1, n) + THREADS - 1) // THREADS,)


class Exl3Kernels:
    """The compiled kernels and their codebook tables on one device; ``forward`` enqueues one lane call."""

    def __init__(self, cp, module_cls, options):
        from moetier.bytes import exl3
        self.cp = cp
        self.module = module_cls(code=SOURCE, options=options)
        self.fn = {n: self.module.get_function(n) for n in KERNEL_NAMES}
        self.pinv = cp.asarray(exl3.TC_PERM_INV.astype(np.int32))
        self._luts: dict = {}

    def lut(self, codebook):
        from moetier.bytes import exl3
        name = exl3.CODEBOOKS[exl3.codebook_index(codebook)]
        if name not in self._luts:
            self._luts[name] = self.cp.asarray(exl3.codebook_lut(name).astype(np.float32))
        return self._luts[name]

    def _linear(self, lay, d_jobs, nj, d_rexp, R, lin, k, n, xin, round_x, out):
        cp, fn, sec = self.cp, self.fn, lay.sections
        xh = cp.empty((R, k), cp.float32)
        t = R * (k // 128)
        fn["exl3_in"](_grid(t), (THREADS,), (d_jobs, d_rexp, np.int64(sec[f"{lin}_suh"][0]), np.int32(k), xin,
                                             np.int32(round_x), np.int32(1), xh, np.int32(t)))
        fn["exl3_gemm"](_grid(nj * n), (THREADS,), (d_jobs, np.int32(nj), np.int64(sec[f"{lin}_trellis"][0]),
                                                     np.int32(k), np.int32(n), np.int32(lay.bits),
                                                     self.lut(lay.codebook), self.pinv, xh, out))
        t = R * (n // 128)
        fn["exl3_out"](_grid(t), (THREADS,), (d_jobs, d_rexp, np.int64(sec[f"{lin}_svh"][0]), np.int32(n),
                                              np.int32(1), out, np.int32(t)))

    def forward(self, lay, d_jobs, counts, d_x):
        """Enqueue one lane call on the current stream: d_jobs int64 [nj, 3], counts = rows per job, d_x float32
        [R, H]; returns the device output [R, H] (not synchronized)."""
        cp = self.cp
        H, F = lay.hidden, lay.ffn
        nj, R = len(counts), int(sum(counts))
        d_rexp = cp.asarray(np.repeat(np.arange(nj, dtype=np.int32), counts))
        g = cp.empty((R, F), cp.float32)
        u = cp.empty((R, F), cp.float32)
        out = cp.empty((R, H), cp.float32)
        self._linear(lay, d_jobs, nj, d_rexp, R, "gate", H, F, d_x, 1, g)
        self._linear(lay, d_jobs, nj, d_rexp, R, "up", H, F, d_x, 1, u)
        self.fn["exl3_swiglu"](_grid(R * F), (THREADS,), (g, u, np.float32(lay.act_limit), np.int32(1),
                                                          np.int32(R * F)))
        self._linear(lay, d_jobs, nj, d_rexp, R, "down", F, H, g, 0, out)
        return out

    def decode(self, d_trellis, k: int, n: int, K: int, codebook):
        cp = self.cp
        out = cp.empty((k, n), cp.float32)
        self.fn["exl3_decode"](_grid(k * n), (THREADS,), (d_trellis, np.int32(k), np.int32(n), np.int32(K),
                                                          self.lut(codebook), self.pinv, out))
        return out

    def raw_gemm(self, rec_ptr: int, xh, k: int, n: int, K: int, codebook):
        cp = self.cp
        T = xh.shape[0]
        jobs = cp.asarray(np.array([[rec_ptr, 0, T]], np.int64))
        out = cp.empty((T, n), cp.float32)
        self.fn["exl3_gemm"](_grid(n), (THREADS,), (jobs, np.int32(1), np.int64(0), np.int32(k), np.int32(n),
                                                    np.int32(K), self.lut(codebook), self.pinv, xh, out))
        return out
