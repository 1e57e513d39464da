// moetier SYCL backend: OpenCL C kernels for one EXL3 (trellis) SwiGLU expert record (moetier.bytes.expert's exl3
// layout; the decode spec is moetier.bytes.exl3, which these kernels are checked against).
//
// One linear is y = had(had(x * suh) @ W_inner) * svh, had = the 128-block butterfly times 1/sqrt(128). W_inner is
// decoded on the fly from the record's int16 tiles: the uint32 words of a tile are its little-endian int16 pairs,
// read as one MSB-first ring of 256 K bits; element t's state is the 16-bit window ending at bit (t+1) K; its weight
// is lut[state] (the codebook's 65,536 fp16 values as float32, built by moetier.bytes.exl3.codebook_lut); element t
// sits at row-major tile position perm[t] (tensor-core order), i.e. position p holds element pinv[p].
//
// Rounding (fp16 != 0): to fp16 (round to nearest even, vstore_half_rte) where exllamav3's CUDA kernels store fp16:
// the input x, had(x * suh), the raw GEMM output, the output after had * svh and the SwiGLU intermediate; products
// accumulate in float32. Determinism: every output element is written by one work-item in a fixed order, no atomics.
//
// Buffers: `base` is a byte arena (device slots for the gpu lane, the host RAM pool for the zerocopy lane); recs[e]
// is the byte offset of expert e's record in it; row r of the activations belongs to expert rexp[r] (rows of one
// expert are contiguous: rp[e] .. rp[e+1]-1). Section offsets are bytes within a record.

inline float r16(const float v) {
    ushort b;
    vstore_half_rte(v, 0, (half*)&b);
    return vload_half(0, (const half*)&b);
}

inline float had_scale() { return 0.08838834764831845f; }   // 128 ** -0.5

// 128-wide butterfly in place on a private block, exllamav3's hadamard_rotate order (same as moetier.bytes.exl3)
inline void butterfly128(float* v) {
    for (int h = 1; h < 128; h *= 2)
        for (int s = 0; s < 128; s += 2 * h)
            for (int q = s; q < s + h; q++) {
                const float a = v[q], b = v[q + h];
                v[q] = a + b;
                v[q + h] = a - b;
            }
}

// xh[r, blk] = round16(had(round16?(x) * suh)) over one 128-wide block; one work-item per (row, block).
__kernel void exl3_in(__global const uchar* base, __global const long* recs, __global const int* rexp,
                      const long suh_off, const int k, __global const float* x, const int round_x, const int fp16,
                      __global float* xh) {
    const int nb = k / 128;
    const int r = get_global_id(0) / nb, blk = get_global_id(0) % nb;
    __global const half* suh = (__global const half*)(base + recs[rexp[r]] + suh_off);
    float v[128];
    for (int q = 0; q < 128; q++) {
        const int c = blk * 128 + q;
        const float xv = round_x ? r16(x[(long)r * k + c]) : x[(long)r * k + c];
        v[q] = xv * vload_half(c, suh);
    }
    butterfly128(v);
    for (int q = 0; q < 128; q++) {
        const float o = v[q] * had_scale();
        xh[(long)r * k + blk * 128 + q] = fp16 ? r16(o) : o;
    }
}

// y[r, blk] = round16(had(round16(y)) * svh) in place; one work-item per (row, block).
__kernel void exl3_out(__global const uchar* base, __global const long* recs, __global const int* rexp,
                       const long svh_off, const int n, const int fp16, __global float* y) {
    const int nb = n / 128;
    const int r = get_global_id(0) / nb, blk = get_global_id(0) % nb;
    __global const half* svh = (__global const half*)(base + recs[rexp[r]] + svh_off);
    __global float* row = y + (long)r * n + blk * 128;
    float v[128];
    for (int q = 0; q < 128; q++) v[q] = fp16 ? r16(row[q]) : row[q];
    butterfly128(v);
    for (int q = 0; q < 128; q++) {
        const float o = v[q] * had_scale() * vload_half(blk * 128 + q, svh);
        row[q] = fp16 ? r16(o) : o;
    }
}

// The state of element t of a tile at K bits: the 16-bit window of the MSB-first ring ending at bit (t+1) K.
inline uint state_of(__global const uint* w, const int t, const int K) {
    const int words = 8 * K;
    const int end = (t + 1) * K + 256 * K;            // shifted by a whole ring: element 0's wrap is modular
    const int i0 = ((end - 16) / 32) % words;
    const int i1r = (end - 1) / 32;
    const int sh = (i1r + 1) * 32 - end;
    const ulong m = ((ulong)w[i0] << 32) | (ulong)w[i1r % words];
    return (uint)((m >> sh) & 0xFFFF);
}

// out[r, col] = sum over the k inputs of xh[r, i] * W_inner[i, col] for the rows of expert e, no roundings (the raw
// GEMM); one work-item per (expert, output column), tile rows in order, the 16 rows of a tile in order.
__kernel void exl3_gemm(__global const uchar* base, __global const long* recs, __global const int* rp,
                        const long tr_off, const int k, const int n, const int K, __global const float* lut,
                        __global const int* pinv, __global const float* xh, __global float* out) {
    const int e = get_global_id(0) / n, col = get_global_id(0) % n;
    const int r0 = rp[e], r1 = rp[e + 1];
    const int j = col / 16, c = col % 16, nt = n / 16;
    __global const uchar* tr = base + recs[e] + tr_off;
    for (int r = r0; r < r1; r++) out[(long)r * n + col] = 0.0f;
    for (int i = 0; i < k / 16; i++) {
        __global const uint* w = (__global const uint*)(tr + ((long)i * nt + j) * 32 * K);
        float wv[16];
        for (int rr = 0; rr < 16; rr++) wv[rr] = lut[state_of(w, pinv[rr * 16 + c], K)];
        for (int r = r0; r < r1; r++) {
            float acc = out[(long)r * n + col];
            __global const float* xr = xh + (long)r * k + 16 * i;
            for (int rr = 0; rr < 16; rr++) acc += wv[rr] * xr[rr];
            out[(long)r * n + col] = acc;
        }
    }
}

// W_inner [k, n] of one trellis (for the bit-exact decode check); one work-item per element.
__kernel void exl3_decode(__global const uchar* tr, const int k, const int n, const int K, __global const float* lut,
                          __global const int* pinv, __global float* out) {
    const int row = get_global_id(0) / n, col = get_global_id(0) % n;
    const int nt = n / 16;
    __global const uint* w = (__global const uint*)(tr + ((long)(row / 16) * nt + col / 16) * 32 * K);
    out[(long)row * n + col] = lut[state_of(w, pinv[(row % 16) * 16 + col % 16], K)];
}

// g = round16(min(silu(g), limit) * clamp(u, -limit, limit)) (limit <= 0: no clamp); one work-item per element.
__kernel void exl3_swiglu(__global float* g, __global const float* u, const float limit, const int fp16) {
    const long i = get_global_id(0);
    const float gv = g[i];
    float s = gv / (1.0f + exp(fmin(-gv, 80.0f)));
    float uv = u[i];
    if (limit > 0.0f) {
        s = fmin(s, limit);
        uv = fmin(fmax(uv, -limit), limit);
    }
    const float a = s * uv;
    g[i] = fp16 ? r16(a) : a;
}

// ---------------------------------------------------------------------------------------------------------------
// exl3-int (adapters.md section 2.6): the same containers, integer arithmetic, so every lane gives the same bits.
// weight = mul1 byte sum of the state - 510; suh/svh -> their signs; the butterfly without the 1/sqrt(128) scale;
// int64 throughout; gate = clamp((min(max(g, 0), 2^31-1) * clamp(u, +-(2^31-1))) >> shift, +-a_max) (floor shift).

inline long sgn16(__global const ushort* v, const int i) { return (v[i] & 0x8000) ? -1 : 1; }

inline void butterfly128_l(long* v) {
    for (int h = 1; h < 128; h *= 2)
        for (int s = 0; s < 128; s += 2 * h)
            for (int q = s; q < s + h; q++) {
                const long a = v[q], b = v[q + h];
                v[q] = a + b;
                v[q + h] = a - b;
            }
}

__kernel void exl3i_in(__global const uchar* base, __global const long* recs, __global const int* rexp,
                       const long suh_off, const int k, __global const long* x, __global long* xh) {
    const int nb = k / 128;
    const int r = get_global_id(0) / nb, blk = get_global_id(0) % nb;
    __global const ushort* suh = (__global const ushort*)(base + recs[rexp[r]] + suh_off);
    long v[128];
    for (int q = 0; q < 128; q++) v[q] = x[(long)r * k + blk * 128 + q] * sgn16(suh, blk * 128 + q);
    butterfly128_l(v);
    for (int q = 0; q < 128; q++) xh[(long)r * k + blk * 128 + q] = v[q];
}

__kernel void exl3i_out(__global const uchar* base, __global const long* recs, __global const int* rexp,
                        const long svh_off, const int n, __global long* y) {
    const int nb = n / 128;
    const int r = get_global_id(0) / nb, blk = get_global_id(0) % nb;
    __global const ushort* svh = (__global const ushort*)(base + recs[rexp[r]] + svh_off);
    __global long* row = y + (long)r * n + blk * 128;
    long v[128];
    for (int q = 0; q < 128; q++) v[q] = row[q];
    butterfly128_l(v);
    for (int q = 0; q < 128; q++) row[q] = v[q] * sgn16(svh, blk * 128 + q);
}

inline long int_weight(const uint st) {
    const uint p = st * 0x83DCD12Du;
    return (long)((p & 255u) + ((p >> 8) & 255u) + ((p >> 16) & 255u) + (p >> 24)) - 510;
}

__kernel void exl3i_gemm(__global const uchar* base, __global const long* recs, __global const int* rp,
                         const long tr_off, const int k, const int n, const int K, __global const int* pinv,
                         __global const long* xh, __global long* out) {
    const int e = get_global_id(0) / n, col = get_global_id(0) % n;
    const int r0 = rp[e], r1 = rp[e + 1];
    const int j = col / 16, c = col % 16, nt = n / 16;
    __global const uchar* tr = base + recs[e] + tr_off;
    for (int r = r0; r < r1; r++) out[(long)r * n + col] = 0;
    for (int i = 0; i < k / 16; i++) {
        __global const uint* w = (__global const uint*)(tr + ((long)i * nt + j) * 32 * K);
        long wv[16];
        for (int rr = 0; rr < 16; rr++) wv[rr] = int_weight(state_of(w, pinv[rr * 16 + c], K));
        for (int r = r0; r < r1; r++) {
            long acc = out[(long)r * n + col];
            __global const long* xr = xh + (long)r * k + 16 * i;
            for (int rr = 0; rr < 16; rr++) acc += wv[rr] * xr[rr];
            out[(long)r * n + col] = acc;
        }
    }
}

__kernel void exl3i_gate(__global long* g, __global const long* u, const int shift, const long a_max) {
    const long i = get_global_id(0);
    const long C = 2147483647L;
    const long gv = min(max(g[i], 0L), C), uv = min(max(u[i], -C), C);
    const long p = gv * uv;
    const long q = p >= 0 ? (p >> shift) : -((-p + (1L << shift) - 1) >> shift);     // floor(p / 2^shift)
    g[i] = min(max(q, -a_max), a_max);
}
