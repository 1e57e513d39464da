"""CUDA C source of the CUDA backend's expert kernels (compiled at run time by cupy.RawModule / NVRTC).

One layer-lane call runs four launches over every job of the call (a job = one expert record + its token rows):

1. ``quant_rows``  x [R, H] float32 -> int16 [R, H] + one float32 scale per row (the CPU lane's activation
   quantization: A = min(32767, (2**31 - 1) // (128 * n)), q = floor(x * A / absmax + 0.5), scale = absmax / A).
   int4g32 stores each row split into even columns then odd columns (as backends/cpu/kernels.py does), so the low
   and high nibbles of a weight word line up with contiguous activation pairs.
2. ``gate_up_i8`` / ``gate_up_q4``: one warp per (job, ffn row f) computes the gate and the up row dot products
   for all the job's token rows (reading the weight row once per 8 rows), then h = silu(gate) * up.
3. ``quant_rows`` on h [R, F].
4. ``down_i8`` / ``down_q4``: one warp per (job, hidden row o): out = down @ h.

Integer math: int16 activations x int8 / int4 weights with ``__dp2a_lo`` / ``__dp2a_hi`` (the int16 x int8 form
of the dp4a instruction family, sm_61+), accumulated exactly in int32. For int8 these are the *same* int32 dot
products the CPU lane computes (integer sums do not depend on order); the float scaling is the CPU's formula
(float(dot) * (w_scale * x_scale)). For int4g32 each lane takes whole 32-column groups (one 16-byte load = one
group), forms the exact int32 group sum of (q - 8) * x and adds float(group_sum) * group_scale in float32.

Determinism: each output element is owned by one warp; lane l takes 16-byte chunks (groups) l, l + 32, ... in
order and the 32 lane partials are combined by a fixed shfl_down tree read at lane 0. No atomics, no
dependence on the grid, the batch composition or the job order, so the same record bytes and the same input row
give the same bits whichever lane (gpu: device slot; zerocopy: mapped host slot) and whichever batch.
Records are read through plain global loads, which is also what the zero-copy lane needs (the record pointer is
then a device alias of pinned, mapped host memory and every byte crosses PCIe exactly once per row chunk).
"""

MAXR = 8      # token rows per pass over a weight row (more rows re-read the row, in passes of MAXR)
WARPS = 8     # warps (output rows) per 256-thread block
QUANT_THREADS = 256

SOURCE = r"""
#define MAXR 8
#define WARPS 8

typedef long long i64;

__device__ __forceinline__ float warp_sum_f(float v) {
    // fixed tree: lane 0 ends with ((l0+l16)+(l8+l24))... in the same order on every run
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// 16 int8 weights (one uint4) x 16 int16 activations (two int4 = 32 bytes), exact int32
__device__ __forceinline__ int dot16_i8(uint4 w, const int4* __restrict__ xp, int acc) {
    int4 a = xp[0];
    int4 b = xp[1];
    acc = __dp2a_lo(a.x, (int)w.x, acc);
    acc = __dp2a_hi(a.y, (int)w.x, acc);
    acc = __dp2a_lo(a.z, (int)w.y, acc);
    acc = __dp2a_hi(a.w, (int)w.y, acc);
    acc = __dp2a_lo(b.x, (int)w.z, acc);
    acc = __dp2a_hi(b.y, (int)w.z, acc);
    acc = __dp2a_lo(b.z, (int)w.w, acc);
    acc = __dp2a_hi(b.w, (int)w.w, acc);
    return acc;
}

// one word = 8 nibbles = columns 8i..8i+7 of the group: low nibbles are the even columns (xe pairs 2i, 2i+1),
// high nibbles the odd columns (xo pairs 2i, 2i+1); nibble n means q = n - 8 (per-byte subtract, no borrow)
__device__ __forceinline__ int dot8_q4(unsigned int w, int xe0, int xe1, int xo0, int xo1, int acc) {
    int lo = (int)__vsub4(w & 0x0F0F0F0Fu, 0x08080808u);
    int hi = (int)__vsub4((w >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    acc = __dp2a_lo(xe0, lo, acc);
    acc = __dp2a_hi(xe1, lo, acc);
    acc = __dp2a_lo(xo0, hi, acc);
    acc = __dp2a_hi(xo1, hi, acc);
    return acc;
}

// one group of 32 columns: 16 bytes of weights; xe/xo: 16 int16 each (two int4 each)
__device__ __forceinline__ int dot32_q4(uint4 w, const int4* __restrict__ xe, const int4* __restrict__ xo) {
    int4 e0 = xe[0], e1 = xe[1];
    int4 o0 = xo[0], o1 = xo[1];
    int acc = 0;
    acc = dot8_q4(w.x, e0.x, e0.y, o0.x, o0.y, acc);
    acc = dot8_q4(w.y, e0.z, e0.w, o0.z, o0.w, acc);
    acc = dot8_q4(w.z, e1.x, e1.y, o1.x, o1.y, acc);
    acc = dot8_q4(w.w, e1.z, e1.w, o1.z, o1.w, acc);
    return acc;
}

// ---------------------------------------------------------------------------------------------------------------
// activation quantization: one block per row

extern "C" __global__ void quant_rows(const float* __restrict__ x, int n, int A, int split,
                                      short* __restrict__ q, float* __restrict__ s)
{
    __shared__ float red[256];
    const int r = blockIdx.x;
    const float* xr = x + (i64)r * n;
    short* qr = q + (i64)r * n;
    float m = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
    red[threadIdx.x] = m;
    __syncthreads();
    for (int o = blockDim.x >> 1; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
        __syncthreads();
    }
    const float amax = red[0];
    const int half = n >> 1;
    if (amax == 0.0f) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) qr[i] = 0;
        if (threadIdx.x == 0) s[r] = 0.0f;
        return;
    }
    const float inv = (float)A / amax;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        short v = (short)floorf(__fmul_rn(xr[i], inv) + 0.5f);
        int j = split ? ((i & 1) ? half + (i >> 1) : (i >> 1)) : i;
        qr[j] = v;
    }
    if (threadIdx.x == 0) s[r] = amax / (float)A;
}

// ---------------------------------------------------------------------------------------------------------------
// jobs: int64 [njobs, 3] = (record address readable by the device, first row, rows)
// offs: section byte offsets gate_q, up_q, down_q, gate_s, up_s, down_s

extern "C" __global__ void __launch_bounds__(256, 2) gate_up_i8(const i64* __restrict__ jobs, int H, int F,
                                      i64 og, i64 ou, i64 ogs, i64 ous,
                                      const short* __restrict__ xq, const float* __restrict__ sx,
                                      float* __restrict__ h)
{
    const int e = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int f = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (f >= F) return;
    const unsigned char* rec = (const unsigned char*)jobs[3 * e];
    const i64 row0 = jobs[3 * e + 1];
    const int nr = (int)jobs[3 * e + 2];
    const uint4* gw = (const uint4*)(rec + og + (i64)f * H);
    const uint4* uw = (const uint4*)(rec + ou + (i64)f * H);
    const float gsf = ((const float*)(rec + ogs))[f];
    const float usf = ((const float*)(rec + ous))[f];
    const int nch = H >> 4;
    for (int r0 = 0; r0 < nr; r0 += MAXR) {
        const int m = min(MAXR, nr - r0);
        int ag[MAXR], au[MAXR];
        #pragma unroll
        for (int j = 0; j < MAXR; j++) { ag[j] = 0; au[j] = 0; }
        for (int c = lane; c < nch; c += 32) {
            const uint4 g = gw[c];
            const uint4 u = uw[c];
            #pragma unroll
            for (int j = 0; j < MAXR; j++) {
                if (j < m) {
                    const int4* xp = (const int4*)(xq + (row0 + r0 + j) * H + 16 * c);
                    ag[j] = dot16_i8(g, xp, ag[j]);
                    au[j] = dot16_i8(u, xp, au[j]);
                }
            }
        }
        #pragma unroll
        for (int j = 0; j < MAXR; j++) {
            if (j < m) {
                const int sg = warp_sum_i(ag[j]);
                const int su = warp_sum_i(au[j]);
                if (lane == 0) {
                    const i64 r = row0 + r0 + j;
                    const float gv = (float)sg * (gsf * sx[r]);
                    const float uv = (float)su * (usf * sx[r]);
                    h[r * F + f] = silu_mul(gv, uv);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) down_i8(const i64* __restrict__ jobs, int H, int F, i64 od, i64 ods,
                                   const short* __restrict__ hq, const float* __restrict__ sh,
                                   float* __restrict__ out)
{
    const int e = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (o >= H) return;
    const unsigned char* rec = (const unsigned char*)jobs[3 * e];
    const i64 row0 = jobs[3 * e + 1];
    const int nr = (int)jobs[3 * e + 2];
    const uint4* dw = (const uint4*)(rec + od + (i64)o * F);
    const float dsf = ((const float*)(rec + ods))[o];
    const int nch = F >> 4;
    for (int r0 = 0; r0 < nr; r0 += MAXR) {
        const int m = min(MAXR, nr - r0);
        int ad[MAXR];
        #pragma unroll
        for (int j = 0; j < MAXR; j++) ad[j] = 0;
        for (int c = lane; c < nch; c += 32) {
            const uint4 d = dw[c];
            #pragma unroll
            for (int j = 0; j < MAXR; j++) {
                if (j < m) ad[j] = dot16_i8(d, (const int4*)(hq + (row0 + r0 + j) * F + 16 * c), ad[j]);
            }
        }
        #pragma unroll
        for (int j = 0; j < MAXR; j++) {
            if (j < m) {
                const int sd = warp_sum_i(ad[j]);
                if (lane == 0) {
                    const i64 r = row0 + r0 + j;
                    out[r * H + o] = (float)sd * (dsf * sh[r]);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) gate_up_q4(const i64* __restrict__ jobs, int H, int F,
                                      i64 og, i64 ou, i64 ogs, i64 ous,
                                      const short* __restrict__ xq, const float* __restrict__ sx,
                                      float* __restrict__ h)
{
    const int e = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int f = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (f >= F) return;
    const unsigned char* rec = (const unsigned char*)jobs[3 * e];
    const i64 row0 = jobs[3 * e + 1];
    const int nr = (int)jobs[3 * e + 2];
    const int G = H >> 5;
    const int half = H >> 1;
    const uint4* gw = (const uint4*)(rec + og + (i64)f * half);
    const uint4* uw = (const uint4*)(rec + ou + (i64)f * half);
    const float* gs = (const float*)(rec + ogs) + (i64)f * G;
    const float* us = (const float*)(rec + ous) + (i64)f * G;
    for (int r0 = 0; r0 < nr; r0 += MAXR) {
        const int m = min(MAXR, nr - r0);
        float ag[MAXR], au[MAXR];
        #pragma unroll
        for (int j = 0; j < MAXR; j++) { ag[j] = 0.0f; au[j] = 0.0f; }
        for (int g = lane; g < G; g += 32) {
            const uint4 wg = gw[g];
            const uint4 wu = uw[g];
            const float sgs = gs[g];
            const float sus = us[g];
            #pragma unroll
            for (int j = 0; j < MAXR; j++) {
                if (j < m) {
                    const short* xr = xq + (row0 + r0 + j) * H;
                    const int4* xe = (const int4*)(xr + 16 * g);
                    const int4* xo = (const int4*)(xr + half + 16 * g);
                    ag[j] += (float)dot32_q4(wg, xe, xo) * sgs;
                    au[j] += (float)dot32_q4(wu, xe, xo) * sus;
                }
            }
        }
        #pragma unroll
        for (int j = 0; j < MAXR; j++) {
            if (j < m) {
                const float sg = warp_sum_f(ag[j]);
                const float su = warp_sum_f(au[j]);
                if (lane == 0) {
                    const i64 r = row0 + r0 + j;
                    h[r * F + f] = silu_mul(sg * sx[r], su * sx[r]);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) down_q4(const i64* __restrict__ jobs, int H, int F, i64 od, i64 ods,
                                   const short* __restrict__ hq, const float* __restrict__ sh,
                                   float* __restrict__ out)
{
    const int e = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (o >= H) return;
    const unsigned char* rec = (const unsigned char*)jobs[3 * e];
    const i64 row0 = jobs[3 * e + 1];
    const int nr = (int)jobs[3 * e + 2];
    const int G = F >> 5;
    const int half = F >> 1;
    const uint4* dw = (const uint4*)(rec + od + (i64)o * half);
    const float* ds = (const float*)(rec + ods) + (i64)o * G;
    for (int r0 = 0; r0 < nr; r0 += MAXR) {
        const int m = min(MAXR, nr - r0);
        float ad[MAXR];
        #pragma unroll
        for (int j = 0; j < MAXR; j++) ad[j] = 0.0f;
        for (int g = lane; g < G; g += 32) {
            const uint4 w = dw[g];
            const float sc = ds[g];
            #pragma unroll
            for (int j = 0; j < MAXR; j++) {
                if (j < m) {
                    const short* hr = hq + (row0 + r0 + j) * F;
                    ad[j] += (float)dot32_q4(w, (const int4*)(hr + 16 * g), (const int4*)(hr + half + 16 * g)) * sc;
                }
            }
        }
        #pragma unroll
        for (int j = 0; j < MAXR; j++) {
            if (j < m) {
                const float sd = warp_sum_f(ad[j]);
                if (lane == 0) {
                    const i64 r = row0 + r0 + j;
                    out[r * H + o] = sd * sh[r];
                }
            }
        }
    }
}
"""

KERNEL_NAMES = ("quant_rows", "gate_up_i8", "down_i8", "gate_up_q4", "down_q4")

# NVRTC options: no fast math (expf, not __expf; IEEE division), C++14 for the templates-free source.
NVRTC_OPTIONS = ("--std=c++14",)


def nvcc_check(nvcc: str = "nvcc", arch: str = "sm_90", workdir: str | None = None, source: str | None = None) -> str:
    """Compile SOURCE (or ``source``) with nvcc (-c, no GPU needed); returns ptxas output; raises RuntimeError with
    the log."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(dir=workdir) as d:
        src = os.path.join(d, "moetier_experts.cu")
        with open(src, "w") as f:
            f.write(SOURCE if source is None else source)
        cmd = [nvcc, f"-arch={arch}", "-std=c++14", "-Xptxas", "-v", "-c", src, "-o", os.path.join(d, "k.o")]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"nvcc failed ({p.returncode}): {p.stderr.strip()}")
        return p.stderr
