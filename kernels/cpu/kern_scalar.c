/* kernels/cpu/kern_scalar.c -- the portable matmul path (and the reference
 * the SIMD paths are tested against).
 *
 * Quantized weights use GGML's scheme: activations are quantized per row
 * (Q8_0-style blocks for Q8_0/Q4_0/Q4_1, Q8_K for K-quants), dot products
 * are integer per block and scaled by d_w * d_x in float. */
#include <math.h>
#include <string.h>

#include "quant.h"
#include "isa.h"

void rx_kisa_q8a_quant (const float *x, rx_q8a *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf (x[j]);
            amax = a > amax ? a : amax;
        }
        /* GGML's x86 quantize_row_q8_0: d stored as fp16, id = 127/amax
         * unrounded, round half to even. */
        const float id = amax != 0.f ? 127.f / amax : 0.f;
        y[i].d = rx_fp16_to_fp32 (rx_fp32_to_fp16 (amax / 127.f));
        int s = 0;
        for (int j = 0; j < 32; j++) {
            /* round half to even without a libm call: |x * id| <= 127.5 */
            const float v = x[j] * id + 12582912.f;
            int32_t bits;
            memcpy (&bits, &v, sizeof bits);
            const int q = (bits & 0x007fffff) - 0x00400000;
            y[i].q[j] = (int8_t) q;
            s += q;
        }
        y[i].s = s;
    }
}

size_t rx_kisa_act_row_bytes_ref (int dtype, int repacked, size_t in)
{
    (void) repacked;
    switch (dtype) {
    case RX_Q8_0: case RX_Q4_0: case RX_Q4_1:
        return in / 32 * sizeof (rx_q8a);
    case RX_Q4_K: case RX_Q5_K: case RX_Q6_K:
        return in / RX_QK_K * sizeof (rx_block_q8_K);
    default:
        return 0;
    }
}

void rx_kisa_act_quant_ref (int dtype, int repacked, const float *x, void *dst, size_t in)
{
    (void) repacked;
    switch (dtype) {
    case RX_Q8_0: case RX_Q4_0: case RX_Q4_1:
        rx_kisa_q8a_quant (x, dst, in / 32);
        break;
    case RX_Q4_K: case RX_Q5_K: case RX_Q6_K:
        rx_quantize_row (RX_Q8_K, x, dst, in);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------- dots -- */

static float s_dot_f32 (const void *w, const void *x, size_t in)
{
    const float *a = w, *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in; i++) s += a[i] * b[i];
    return s;
}

static float s_dot_f16 (const void *w, const void *x, size_t in)
{
    const uint16_t *a = w;
    const float *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in; i++) s += rx_fp16_to_fp32 (a[i]) * b[i];
    return s;
}

static float s_dot_bf16 (const void *w, const void *x, size_t in)
{
    const uint16_t *a = w;
    const float *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in; i++) s += rx_bf16_to_fp32 (a[i]) * b[i];
    return s;
}

static float s_dot_q8_0 (const void *w, const void *x, size_t in)
{
    const rx_block_q8_0 *a = w;
    const rx_q8a *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += a[i].q[j] * b[i].q[j];
        s += (float) sumi * (rx_fp16_to_fp32 (a[i].d) * b[i].d);
    }
    return s;
}

static float s_dot_q4_0 (const void *w, const void *x, size_t in)
{
    const rx_block_q4_0 *a = w;
    const rx_q8a *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += ((a[i].q[j] & 0x0f) - 8) * b[i].q[j];
            sumi += ((a[i].q[j] >> 4) - 8) * b[i].q[j + 16];
        }
        s += (float) sumi * (rx_fp16_to_fp32 (a[i].d) * b[i].d);
    }
    return s;
}

static float s_dot_q4_1 (const void *w, const void *x, size_t in)
{
    const rx_block_q4_1 *a = w;
    const rx_q8a *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (a[i].q[j] & 0x0f) * b[i].q[j];
            sumi += (a[i].q[j] >> 4) * b[i].q[j + 16];
        }
        s += (float) sumi * (rx_fp16_to_fp32 (a[i].d) * b[i].d) +
             rx_fp16_to_fp32 (a[i].m) * (b[i].d * (float) b[i].s);
    }
    return s;
}

static float s_dot_q4_K (const void *w, const void *x, size_t in)
{
    const rx_block_q4_K *a = w;
    const rx_block_q8_K *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in / RX_QK_K; i++) {
        const uint8_t *q = a[i].qs;
        const int8_t *qx = b[i].qs;
        int sum_sc = 0, sum_m = 0;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc0, m0, sc1, m1;
            rx_get_scale_min_k4 (j, a[i].scales, &sc0, &m0);
            rx_get_scale_min_k4 (j + 1, a[i].scales, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q[l] & 0xF) * qx[32 * j + l];
                s1 += (q[l] >> 4) * qx[32 * j + 32 + l];
            }
            sum_sc += sc0 * s0 + sc1 * s1;
            sum_m += m0 * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]) +
                     m1 * (b[i].bsums[2 * j + 2] + b[i].bsums[2 * j + 3]);
        }
        s += rx_fp16_to_fp32 (a[i].d) * b[i].d * (float) sum_sc -
             rx_fp16_to_fp32 (a[i].dmin) * b[i].d * (float) sum_m;
    }
    return s;
}

static float s_dot_q5_K (const void *w, const void *x, size_t in)
{
    const rx_block_q5_K *a = w;
    const rx_block_q8_K *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in / RX_QK_K; i++) {
        const uint8_t *ql = a[i].qs, *qh = a[i].qh;
        const int8_t *qx = b[i].qs;
        int sum_sc = 0, sum_m = 0;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc0, m0, sc1, m1;
            rx_get_scale_min_k4 (j, a[i].scales, &sc0, &m0);
            rx_get_scale_min_k4 (j + 1, a[i].scales, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) * qx[32 * j + l];
                s1 += ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) * qx[32 * j + 32 + l];
            }
            sum_sc += sc0 * s0 + sc1 * s1;
            sum_m += m0 * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]) +
                     m1 * (b[i].bsums[2 * j + 2] + b[i].bsums[2 * j + 3]);
        }
        s += rx_fp16_to_fp32 (a[i].d) * b[i].d * (float) sum_sc -
             rx_fp16_to_fp32 (a[i].dmin) * b[i].d * (float) sum_m;
    }
    return s;
}

static float s_dot_q6_K (const void *w, const void *x, size_t in)
{
    const rx_block_q6_K *a = w;
    const rx_block_q8_K *b = x;
    float s = 0.f;
    for (size_t i = 0; i < in / RX_QK_K; i++) {
        const uint8_t *ql = a[i].ql, *qh = a[i].qh;
        const int8_t *sc = a[i].scales;
        const int8_t *qx = b[i].qs;
        int sumi = 0;
        for (int n = 0; n < RX_QK_K; n += 128, ql += 64, qh += 32, sc += 8, qx += 128) {
            int g[8] = { 0 };
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                g[is + 0] += q1 * qx[l + 0];
                g[is + 2] += q2 * qx[l + 32];
                g[is + 4] += q3 * qx[l + 64];
                g[is + 6] += q4 * qx[l + 96];
            }
            for (int k = 0; k < 8; k++) sumi += sc[k] * g[k];
        }
        s += rx_fp16_to_fp32 (a[i].d) * b[i].d * (float) sumi;
    }
    return s;
}

typedef float (*s_dot_fn) (const void *w, const void *x, size_t in);

static s_dot_fn s_dot_for (int dtype)
{
    switch (dtype) {
    case RX_F32: return s_dot_f32;
    case RX_F16: return s_dot_f16;
    case RX_BF16: return s_dot_bf16;
    case RX_Q8_0: return s_dot_q8_0;
    case RX_Q4_0: return s_dot_q4_0;
    case RX_Q4_1: return s_dot_q4_1;
    case RX_Q4_K: return s_dot_q4_K;
    case RX_Q5_K: return s_dot_q5_K;
    case RX_Q6_K: return s_dot_q6_K;
    default: return NULL;
    }
}

static int s_mm_supported (int dtype) { return s_dot_for (dtype) != NULL; }

static void s_mm (const struct rx_mm_job *j, size_t r0, size_t r1)
{
    s_dot_fn dot = s_dot_for (j->dtype);
    for (size_t t = 0; t < j->n; t++) {
        const uint8_t *x = j->xa + t * j->xa_row_bytes;
        float *y = j->y + t * j->ldy;
        for (size_t r = r0; r < r1; r++) {
            float v = dot (j->w + r * j->w_row_bytes, x, j->in);
            y[r] = j->accumulate ? y[r] + v : v;
        }
    }
}

static float s_vdot_f32 (const float *a, const float *b, size_t n)
{
    float s = 0.f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float s_vdot_f16 (const float *a, const uint16_t *b, size_t n)
{
    float s = 0.f;
    for (size_t i = 0; i < n; i++) s += a[i] * rx_fp16_to_fp32 (b[i]);
    return s;
}

static void s_axpy_f32 (float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void s_axpy_f16 (float *y, float a, const uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += a * rx_fp16_to_fp32 (x[i]);
}

const struct rx_kisa rx_kisa_scalar = {
    .name = "scalar",
    .act_row_bytes = rx_kisa_act_row_bytes_ref,
    .act_quant = rx_kisa_act_quant_ref,
    .mm_supported = s_mm_supported,
    .mm = s_mm,
    .dot_f32 = s_vdot_f32,
    .dot_f16 = s_vdot_f16,
    .axpy_f32 = s_axpy_f32,
    .axpy_f16 = s_axpy_f16,
};
