// moetier SYCL backend: OpenCL C kernels for one routed SwiGLU expert record (moetier.expert layout).
//
// The math mirrors backends/cpu/kernels.py:
//   * activations are quantized per token row to int16 with one float32 scale (A = min(32767, (2^31-1)/(128 n)));
//   * each weight row is dotted with the quantized row in exact int32 arithmetic, then scaled once;
//   * int8: w = q[r, c] * s[r]        -> y = float(dot) * (s[r] * sx)
//   * int4g32: w = (nib - 8) * s[r, g] -> per group of 32 columns an exact int32 sum  sum(nib * x) - 8 * sum(x),
//     scaled by the group scale and summed over groups in float32 in ascending group order.
// Determinism: every output element is written by exactly one work-item, whose reduction order is fixed (the
// int32 parts are exact, so their order cannot matter; float sums run in ascending group order). No atomics.
//
// Buffers: `base` is a byte arena (device slots for the gpu lane, the host RAM pool for the zerocopy lane);
// recs[e] is the byte offset of expert e's record in it; rows rp[e] .. rp[e+1]-1 of the activations belong to e.
// Section offsets (bytes, within a record): o[0..5] = gate_q, up_q, down_q, gate_s, up_s, down_s.

inline int hsum16(int16 v) {
    int8 a = v.lo + v.hi;
    int4 b = a.lo + a.hi;
    int2 c = b.lo + b.hi;
    return c.x + c.y;
}

inline float silu_mul(float g, float u) {
    return g / (1.0f + exp(-g)) * u;
}

// One work-item per row: dst = round(src * A / absmax) (int16), scale = absmax / A, gsum[g] = 8 * sum of group g.
__kernel void quant_rows(__global const float* src, const int n, const int A, __global short* dst,
                         __global float* scale, __global int* gsum) {
    const int r = get_global_id(0);
    __global const float* s = src + (long)r * n;
    __global short* d = dst + (long)r * n;
    const int G = n / 32;
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = fabs(s[i]);
        if (v > amax) amax = v;
    }
    if (amax == 0.0f) {
        for (int i = 0; i < n; i++) d[i] = 0;
        for (int g = 0; g < G; g++) gsum[r * G + g] = 0;
        scale[r] = 0.0f;
        return;
    }
    const float inv = (float)A / amax;
    for (int i = 0; i < n; i++) d[i] = (short)floor(s[i] * inv + 0.5f);
    for (int g = 0; g < G; g++) {
        int t = 0;
        for (int j = 0; j < 32; j++) t += d[g * 32 + j];
        gsum[r * G + g] = 8 * t;
    }
    scale[r] = amax / (float)A;
}

// ---------------------------------------------------------------------------------------------------------------
// int8

inline int dot_i8(__global const char* w, __global const short* x, const int n) {
    int16 acc = (int16)(0);
    for (int i = 0; i < n; i += 16)
        acc += convert_int16(vload16(0, w + i)) * convert_int16(vload16(0, x + i));
    return hsum16(acc);
}

// Work-item it = e * F + f: h[r, f] = silu(gate_f . x_r) * (up_f . x_r) for the rows r of expert e.
__kernel void i8_gate_up(__global const char* base, __global const long* recs, __global const int* rp,
                         const int H, const int F, const long og, const long ou, const long ogs, const long ous,
                         __global const short* xq, __global const float* sx, __global float* h) {
    const int it = get_global_id(0);
    const int e = it / F, f = it % F;
    __global const char* b = base + recs[e];
    __global const char* gw = b + og + (long)f * H;
    __global const char* uw = b + ou + (long)f * H;
    const float gs = ((__global const float*)(b + ogs))[f];
    const float us = ((__global const float*)(b + ous))[f];
    for (int r = rp[e]; r < rp[e + 1]; r++) {
        __global const short* x = xq + (long)r * H;
        float g = (float)dot_i8(gw, x, H) * (gs * sx[r]);
        float u = (float)dot_i8(uw, x, H) * (us * sx[r]);
        h[(long)r * F + f] = silu_mul(g, u);
    }
}

// Work-item it = e * H + o: out[r, o] = down_o . h_r.
__kernel void i8_down(__global const char* base, __global const long* recs, __global const int* rp,
                      const int H, const int F, const long od, const long ods,
                      __global const short* hq, __global const float* sh, __global float* out) {
    const int it = get_global_id(0);
    const int e = it / H, o = it % H;
    __global const char* b = base + recs[e];
    __global const char* dw = b + od + (long)o * F;
    const float ds = ((__global const float*)(b + ods))[o];
    for (int r = rp[e]; r < rp[e + 1]; r++)
        out[(long)r * H + o] = (float)dot_i8(dw, hq + (long)r * F, F) * (ds * sh[r]);
}

// ---------------------------------------------------------------------------------------------------------------
// int4g32: byte k of a row holds columns 2k (low nibble) and 2k+1 (high nibble), stored as q + 8.

inline float dot_i4(__global const uchar* w, __global const float* ws, __global const short* x,
                    __global const int* xg, const int n) {
    float acc = 0.0f;
    const int G = n / 32;
    for (int g = 0; g < G; g++) {
        uchar16 bt = vload16(0, w + g * 16);
        short16 a = vload16(0, x + g * 32);
        short16 c = vload16(0, x + g * 32 + 16);
        int16 xe = convert_int16((short16)(a.even, c.even));
        int16 xo = convert_int16((short16)(a.odd, c.odd));
        int16 p = convert_int16(bt & (uchar)15) * xe + convert_int16(bt >> (uchar)4) * xo;
        acc += (float)(hsum16(p) - xg[g]) * ws[g];
    }
    return acc;
}

__kernel void i4_gate_up(__global const uchar* base, __global const long* recs, __global const int* rp,
                         const int H, const int F, const long og, const long ou, const long ogs, const long ous,
                         __global const short* xq, __global const float* sx, __global const int* xg,
                         __global float* h) {
    const int it = get_global_id(0);
    const int e = it / F, f = it % F;
    const int GH = H / 32;
    __global const uchar* b = base + recs[e];
    __global const uchar* gw = b + og + (long)f * (H / 2);
    __global const uchar* uw = b + ou + (long)f * (H / 2);
    __global const float* gs = (__global const float*)(b + ogs) + (long)f * GH;
    __global const float* us = (__global const float*)(b + ous) + (long)f * GH;
    for (int r = rp[e]; r < rp[e + 1]; r++) {
        __global const short* x = xq + (long)r * H;
        __global const int* g32 = xg + (long)r * GH;
        float g = dot_i4(gw, gs, x, g32, H) * sx[r];
        float u = dot_i4(uw, us, x, g32, H) * sx[r];
        h[(long)r * F + f] = silu_mul(g, u);
    }
}

__kernel void i4_down(__global const uchar* base, __global const long* recs, __global const int* rp,
                      const int H, const int F, const long od, const long ods,
                      __global const short* hq, __global const float* sh, __global const int* hg,
                      __global float* out) {
    const int it = get_global_id(0);
    const int e = it / H, o = it % H;
    const int GF = F / 32;
    __global const uchar* b = base + recs[e];
    __global const uchar* dw = b + od + (long)o * (F / 2);
    __global const float* ds = (__global const float*)(b + ods) + (long)o * GF;
    for (int r = rp[e]; r < rp[e + 1]; r++)
        out[(long)r * H + o] = dot_i4(dw, ds, hq + (long)r * F, hg + (long)r * GF, F) * sh[r];
}
