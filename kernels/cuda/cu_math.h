/* kernels/cuda/cu_math.h -- element math shared by the CUDA kernels and the
 * host unit test: GGML block decoders, fp16/bf16 decoding, the RoPE/YaRN
 * factors.
 *
 * Every function is `RX_CU_HD static inline`: __host__ __device__ under
 * nvcc, a plain static inline function when a C compiler includes this
 * header (tests/unit/test_kernels_cuda_host.c does, and checks each decoder
 * against core/quant.c's reference dequantizer and the CPU backend's RoPE
 * formulas).  So the math the GPU runs is tested on machines without one.
 *
 * Pure functions, no state: thread-safe.  Depends on <stdint.h> and
 * <math.h> only (no radix headers: nvcc compiles it as C++). */
#ifndef RX_CU_MATH_H
#define RX_CU_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#  define RX_CU_HD __host__ __device__
#else
#  define RX_CU_HD
#endif

/* Multiply and add rounded separately, as the CPU backend (compiled for
 * baseline x86-64, no FMA) does: nvcc otherwise contracts a * b + c into
 * one fma, which rounds once and can differ from the CPU by an ulp of a
 * large RoPE angle, or flip a quantized activation across a rounding tie. */
#ifdef __CUDA_ARCH__
#  define RX_CU_MUL(a, b) __fmul_rn ((a), (b))
#  define RX_CU_ADD(a, b) __fadd_rn ((a), (b))
#  define RX_CU_SUB(a, b) __fsub_rn ((a), (b))
#else
#  define RX_CU_MUL(a, b) ((a) * (b))
#  define RX_CU_ADD(a, b) ((a) + (b))
#  define RX_CU_SUB(a, b) ((a) - (b))
#endif

/* enum rx_dtype values (radix/dtype.h; ABI, never renumbered) repeated here
 * so this header stands alone under nvcc. */
enum {
    RX_CU_F32 = 0, RX_CU_F16 = 1, RX_CU_Q4_0 = 2, RX_CU_Q4_1 = 3, RX_CU_Q8_0 = 8,
    RX_CU_Q4_K = 12, RX_CU_Q5_K = 13, RX_CU_Q6_K = 14, RX_CU_BF16 = 30
};

/* ------------------------------------------------------ fp16 / bf16 -- */

RX_CU_HD static inline float rx_cu_bits_f32 (uint32_t u)
{
    union { uint32_t u; float f; } c;
    c.u = u;
    return c.f;
}

/* IEEE half -> float, exact (subnormals, inf, NaN). */
RX_CU_HD static inline float rx_cu_h2f (uint16_t h)
{
    uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float f = (float) man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return rx_cu_bits_f32 (sign | 0x7f800000u | (man << 13));
    return rx_cu_bits_f32 (sign | ((exp + 112) << 23) | (man << 13));
}

RX_CU_HD static inline float rx_cu_bf2f (uint16_t h)
{
    return rx_cu_bits_f32 ((uint32_t) h << 16);
}

RX_CU_HD static inline uint32_t rx_cu_f32_bits (float f)
{
    union { uint32_t u; float f; } c;
    c.f = f;
    return c.u;
}

/* float -> IEEE half bits, round to nearest even: core/quant.c's
 * rx_fp32_to_fp16, bit for bit (the activation quantizers round their
 * scale through fp16 with it). */
RX_CU_HD static inline uint16_t rx_cu_f2h (float f)
{
    const uint32_t u = rx_cu_f32_bits (f);
    const uint16_t sign = (uint16_t) ((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t) (sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) return (uint16_t) (sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* subnormal: adding 0.5 lets the FPU round the 2^-24 units */
        const float t = RX_CU_ADD (rx_cu_bits_f32 (a), 0.5f);
        return (uint16_t) (sign | (uint16_t) (rx_cu_f32_bits (t) - 0x3f000000u));
    }
    uint32_t h = (a >> 13) - (112u << 10);
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t) (sign | h);
}

/* Little-endian 16-bit load from a byte pointer (GGML blocks are packed:
 * no alignment is assumed beyond 1). */
RX_CU_HD static inline uint16_t rx_cu_ld16 (const uint8_t *p)
{
    return (uint16_t) (p[0] | (p[1] << 8));
}

/* ---------------------------------------------------- block formats -- */

/* Elements per block and bytes per block of the weight types the CUDA
 * backend computes on; 0 for any other type. */
RX_CU_HD static inline int rx_cu_blk_elems (int dtype)
{
    switch (dtype) {
    case RX_CU_F32: case RX_CU_F16: case RX_CU_BF16: return 1;
    case RX_CU_Q8_0: case RX_CU_Q4_0: case RX_CU_Q4_1: return 32;
    case RX_CU_Q4_K: case RX_CU_Q5_K: case RX_CU_Q6_K: return 256;
    default: return 0;
    }
}

RX_CU_HD static inline int rx_cu_blk_bytes (int dtype)
{
    switch (dtype) {
    case RX_CU_F32: return 4;
    case RX_CU_F16: case RX_CU_BF16: return 2;
    case RX_CU_Q8_0: return 34;
    case RX_CU_Q4_0: return 18;
    case RX_CU_Q4_1: return 20;
    case RX_CU_Q4_K: return 144;
    case RX_CU_Q5_K: return 176;
    case RX_CU_Q6_K: return 210;
    default: return 0;
    }
}

/* Bytes of one row of n elements; 0 if n is not a multiple of the block. */
RX_CU_HD static inline size_t rx_cu_row_bytes (int dtype, size_t n)
{
    int be = rx_cu_blk_elems (dtype);
    if (be == 0 || n % (size_t) be) return 0;
    return n / (size_t) be * (size_t) rx_cu_blk_bytes (dtype);
}

/* Q4_K / Q5_K: scale and min j (0..7) of the 12-byte scales field. */
RX_CU_HD static inline void rx_cu_scale_min_k4 (int j, const uint8_t *q, float *sc, float *m)
{
    if (j < 4) {
        *sc = (float) (q[j] & 63);
        *m = (float) (q[j + 4] & 63);
    } else {
        *sc = (float) ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float) ((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Decode elements [32c, 32c + 32) of a row (row: the row's first byte) into
 * out[0..32).  The row length must be a multiple of 32 (and of 256 for the
 * K-quants, which weight_load checks).  This is the unit every CUDA kernel
 * that reads weights works on: a warp lane owns one 32-element chunk. */
RX_CU_HD static inline void rx_cu_deq32 (int dtype, const uint8_t *row, size_t c, float *out)
{
    switch (dtype) {
    case RX_CU_F32: {
        const uint8_t *p = row + c * 128;
        for (int j = 0; j < 32; j++) {
            uint32_t u = (uint32_t) p[4 * j] | ((uint32_t) p[4 * j + 1] << 8) |
                         ((uint32_t) p[4 * j + 2] << 16) | ((uint32_t) p[4 * j + 3] << 24);
            out[j] = rx_cu_bits_f32 (u);
        }
        break;
    }
    case RX_CU_F16: {
        const uint8_t *p = row + c * 64;
        for (int j = 0; j < 32; j++) out[j] = rx_cu_h2f (rx_cu_ld16 (p + 2 * j));
        break;
    }
    case RX_CU_BF16: {
        const uint8_t *p = row + c * 64;
        for (int j = 0; j < 32; j++) out[j] = rx_cu_bf2f (rx_cu_ld16 (p + 2 * j));
        break;
    }
    case RX_CU_Q8_0: {
        const uint8_t *b = row + c * 34;
        const float d = rx_cu_h2f (rx_cu_ld16 (b));
        for (int j = 0; j < 32; j++) out[j] = (float) (int8_t) b[2 + j] * d;
        break;
    }
    case RX_CU_Q4_0: {
        const uint8_t *b = row + c * 18;
        const float d = rx_cu_h2f (rx_cu_ld16 (b));
        for (int j = 0; j < 16; j++) {
            out[j] = (float) ((b[2 + j] & 0x0f) - 8) * d;
            out[j + 16] = (float) ((b[2 + j] >> 4) - 8) * d;
        }
        break;
    }
    case RX_CU_Q4_1: {
        const uint8_t *b = row + c * 20;
        const float d = rx_cu_h2f (rx_cu_ld16 (b)), m = rx_cu_h2f (rx_cu_ld16 (b + 2));
        for (int j = 0; j < 16; j++) {
            out[j] = (float) (b[4 + j] & 0x0f) * d + m;
            out[j + 16] = (float) (b[4 + j] >> 4) * d + m;
        }
        break;
    }
    case RX_CU_Q4_K: case RX_CU_Q5_K: {
        /* 256-element block of 8 sub-blocks; sub-block sb uses scale sb.
         * Pairs of sub-blocks share 32 bytes of qs: low nibbles, then high. */
        const int q5 = dtype == RX_CU_Q5_K;
        const uint8_t *b = row + (c / 8) * (size_t) (q5 ? 176 : 144);
        const int sb = (int) (c % 8);
        const float d = rx_cu_h2f (rx_cu_ld16 (b)), dmin = rx_cu_h2f (rx_cu_ld16 (b + 2));
        float sc, m;
        rx_cu_scale_min_k4 (sb, b + 4, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        const uint8_t *qh = b + 16;                      /* Q5_K only */
        const uint8_t *qs = b + (q5 ? 48 : 16) + (sb / 2) * 32;
        const int shift = (sb & 1) * 4;
        const uint8_t hmask = (uint8_t) (1u << sb);
        for (int l = 0; l < 32; l++) {
            int q = (qs[l] >> shift) & 0xF;
            if (q5 && (qh[l] & hmask)) q += 16;
            out[l] = d1 * (float) q - m1;
        }
        break;
    }
    case RX_CU_Q6_K: {
        /* 256 = 2 halves of 128; each half = 4 groups of 32 (q1..q4). */
        const uint8_t *b = row + (c / 8) * 210;
        const int sub = (int) (c % 8), half = sub / 4, grp = sub % 4;
        const uint8_t *ql = b + half * 64, *qh = b + 128 + half * 32;
        const int8_t *sc = (const int8_t *) (b + 192) + half * 8;
        const float d = rx_cu_h2f (rx_cu_ld16 (b + 208));
        for (int l = 0; l < 32; l++) {
            const int lo = grp & 1 ? ql[l + 32] : ql[l];
            const int nib = grp >= 2 ? lo >> 4 : lo & 0xF;
            const int q = (nib | (((qh[l] >> (2 * grp)) & 3) << 4)) - 32;
            out[l] = d * (float) sc[l / 16 + 2 * grp] * (float) q;
        }
        break;
    }
    default:
        for (int j = 0; j < 32; j++) out[j] = 0.f;
        break;
    }
}

/* float -> bfloat16 bits, round to nearest even, NaN kept quiet: core/quant.c's
 * rx_fp32_to_bf16. */
RX_CU_HD static inline uint16_t rx_cu_f2bf (float f)
{
    const uint32_t u = rx_cu_f32_bits (f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t) ((u >> 16) | 64);
    return (uint16_t) ((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

/* Split v into `parts` half-precision values (F16 bits, or BF16 bits when
 * bf16) such that sum_p decode(out[p]) * scale^-p ~= v: part p rounds the
 * residual left by the parts before it, times scale^p (v - round(v) is
 * exact in F32; a power-of-two scale keeps it exact and, for F16, out of
 * the subnormals).  The CUDA GEMM path runs one half-precision GEMM per
 * part, so F32 activations keep ~11 (F16) / 8 (BF16) bits per part. */
RX_CU_HD static inline void rx_cu_split_half (float v, int bf16, int parts, float scale,
                                              uint16_t *out)
{
    for (int p = 0; p < parts; p++) {
        const uint16_t h = bf16 ? rx_cu_f2bf (v) : rx_cu_f2h (v);
        out[p] = h;
        v = RX_CU_MUL (RX_CU_SUB (v, bf16 ? rx_cu_bf2f (h) : rx_cu_h2f (h)), scale);
    }
}

/* ------------------------------------------- activation quantization -- */

/* kernels-cpu (like GGML) quantizes the activations before the dot
 * products with a quantized weight, and the reference logits carry that
 * rounding.  The CUDA backend reproduces it by quantizing-then-
 * dequantizing each activation block in F32 and running its float matmul
 * on the result: the dot products then see the same activation values as
 * the CPU's integer dots (q * d is exact in F32 for both formats below
 * except Q8_K's, whose float d times a 7-bit q rounds once, as the CPU's
 * d * isum does).
 *
 * The activation block for a weight dtype: 32 (kernels-cpu's rx_q8a, for
 * Q8_0/Q4_0/Q4_1), 256 (Q8_K, for the K-quants), 0 (float weights: the
 * CPU keeps F32 activations). */
RX_CU_HD static inline int rx_cu_act_qblk (int dtype)
{
    switch (dtype) {
    case RX_CU_Q8_0: case RX_CU_Q4_0: case RX_CU_Q4_1: return 32;
    case RX_CU_Q4_K: case RX_CU_Q5_K: case RX_CU_Q6_K: return 256;
    default: return 0;
    }
}

/* Round to nearest, ties to even, for |v| < 2^22: GGML's nearest_int
 * (v + 1.5 * 2^23, low mantissa bits), which kernels-cpu and core/quant.c
 * use.  rintf would do the same; this form is the same on every libm. */
RX_CU_HD static inline int rx_cu_nearest_int (float v)
{
    const float t = RX_CU_ADD (v, 12582912.f);
    return (int) (rx_cu_f32_bits (t) & 0x007fffffu) - 0x00400000;
}

/* 32 activations -> the values kernels-cpu's rx_kisa_q8a_quant
 * (kernels/cpu/kern_scalar.c, GGML's x86 quantize_row_q8_0) makes of them:
 * d = fp16(amax / 127), q = nearest_int(x * (127 / amax)) with the
 * unrounded inverse, out = q * d.  out may alias x. */
RX_CU_HD static inline void rx_cu_q8a_qdq32 (const float *x, float *out)
{
    float amax = 0.f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf (x[j]);
        amax = a > amax ? a : amax;
    }
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    const float d = rx_cu_h2f (rx_cu_f2h (amax / 127.f));
    for (int j = 0; j < 32; j++)
        out[j] = RX_CU_MUL ((float) rx_cu_nearest_int (RX_CU_MUL (x[j], id)), d);
}

/* 256 activations -> core/quant.c's Q8_K (quantize then dequantize):
 * iscale = -127 / (the element of largest magnitude), q = min(127,
 * nearest_int(iscale * x)), d = 1 / iscale, out = d * q.  out may alias x. */
RX_CU_HD static inline void rx_cu_q8k_qdq256 (const float *x, float *out)
{
    float max = 0.f, amax = 0.f;
    for (int j = 0; j < 256; j++) {
        const float ax = fabsf (x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax == 0.f) {
        for (int j = 0; j < 256; j++) out[j] = 0.f;
        return;
    }
    const float iscale = -127.f / max, d = 1.f / iscale;
    for (int j = 0; j < 256; j++) {
        int v = rx_cu_nearest_int (RX_CU_MUL (iscale, x[j]));
        v = v < 127 ? v : 127;
        out[j] = RX_CU_MUL (d, (float) v);
    }
}

/* ------------------------------------------------------ RoPE / YaRN -- */

/* GGML's ggml_rope_yarn_corr_dims: the dimensions where YaRN's ramp starts
 * and ends (dims[0] <= dims[1]).  Same formula as kernels/cpu/ops.c. */
RX_CU_HD static inline void rx_cu_rope_corr_dims (int n_dims, int n_ctx_orig, float freq_base,
                                                  float beta_fast, float beta_slow, float dims[2])
{
    const float pi = 3.14159265358979323846f;
    float start = floorf ((float) n_dims * logf ((float) n_ctx_orig / (beta_fast * 2 * pi)) /
                          (2 * logf (freq_base)));
    float end = ceilf ((float) n_dims * logf ((float) n_ctx_orig / (beta_slow * 2 * pi)) /
                       (2 * logf (freq_base)));
    dims[0] = start > 0 ? start : 0;
    dims[1] = end < (float) (n_dims - 1) ? end : (float) (n_dims - 1);
}

RX_CU_HD static inline float rx_cu_yarn_ramp (float low, float high, int i0)
{
    const float y = ((float) (i0 / 2) - low) / fmaxf (0.001f, high - low);
    return 1 - fminf (1, fmaxf (0, y));
}

/* cos/sin (times the magnitude scale) of pair i0 (even, < n_rot) at
 * position pos.  theta_scale = freq_base^(-2/n_rot); ff = the pair's freq
 * factor (1 if none); corr from rx_cu_rope_corr_dims.  theta is advanced by
 * repeated multiplication exactly as kernels-cpu (and GGML's rope cache)
 * does: powf(theta_scale, i0/2) differs from that product by a few ulp,
 * which at positions in the thousands is ~1e-3 of angle (an H200 run of
 * tests/gpu/compare measured 1.5e-3).  Cost: i0/2 multiplies per pair. */
RX_CU_HD static inline void rx_cu_rope_cs (float pos, int i0, float theta_scale, float ff,
                                           float freq_scale, float ext_factor, float attn_factor,
                                           const float corr[2], float *c, float *s)
{
    float theta = pos;
    for (int k = 0; k < i0 / 2; k++) theta = RX_CU_MUL (theta, theta_scale);
    const float theta_extrap = theta / ff;
    const float theta_interp = RX_CU_MUL (freq_scale, theta_extrap);
    float th = theta_interp, mscale = attn_factor;
    if (ext_factor != 0.0f) {
        const float ramp_mix = RX_CU_MUL (rx_cu_yarn_ramp (corr[0], corr[1], i0), ext_factor);
        th = RX_CU_ADD (RX_CU_MUL (theta_interp, 1 - ramp_mix), RX_CU_MUL (theta_extrap, ramp_mix));
        mscale = RX_CU_MUL (mscale, RX_CU_ADD (1.0f, RX_CU_MUL (0.1f, logf (1.0f / freq_scale))));
    }
    *c = RX_CU_MUL (cosf (th), mscale);
    *s = RX_CU_MUL (sinf (th), mscale);
}

#endif /* RX_CU_MATH_H */
