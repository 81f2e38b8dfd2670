/* core/quant.c -- GGML block formats: scalar reference quantize/dequantize.
 *
 * The quantizers reproduce llama.cpp's reference ("_ref") quantizers step by
 * step -- same search grids, same rounding helper, same packing -- so the
 * files radix writes are standard and the activation blocks it builds hold the
 * same integers llama.cpp's do.  Pure C, libc/libm only (see quant.h). */
#include <math.h>
#include <string.h>

#include "quant.h"

_Static_assert (sizeof (rx_block_q8_0) == 34, "q8_0 block");
_Static_assert (sizeof (rx_block_q4_0) == 18, "q4_0 block");
_Static_assert (sizeof (rx_block_q4_1) == 20, "q4_1 block");
_Static_assert (sizeof (rx_block_q4_K) == 144, "q4_K block");
_Static_assert (sizeof (rx_block_q5_K) == 176, "q5_K block");
_Static_assert (sizeof (rx_block_q6_K) == 210, "q6_K block");
_Static_assert (sizeof (rx_block_q8_K) == 292, "q8_K block");

#define S_MIN(a, b) ((a) < (b) ? (a) : (b))
#define S_MAX(a, b) ((a) > (b) ? (a) : (b))
#define S_GROUP_MAX_EPS 1e-15f

/* ------------------------------------------------------------ fp16/bf16 -- */

static inline uint32_t s_bits (float f) { uint32_t u; memcpy (&u, &f, 4); return u; }
static inline float s_float (uint32_t u) { float f; memcpy (&f, &u, 4); return f; }

uint16_t rx_fp32_to_fp16 (float f)
{
    uint32_t u = s_bits (f);
    uint16_t sign = (uint16_t) ((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)                              /* inf or NaN (quiet) */
        return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (a >= 0x477ff000u)                              /* >= 65520: rounds to inf */
        return sign | 0x7c00;
    if (a < 0x38800000u) {                             /* below 2^-14: subnormal */
        /* Adding 0.5 puts the value's 2^-24 units in the low mantissa bits
         * and lets the FPU round to nearest even. */
        float t = s_float (a) + 0.5f;
        return sign | (uint16_t) (s_bits (t) - 0x3f000000u);
    }
    uint32_t h = (a >> 13) - (112u << 10);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;                                           /* carries into the exponent */
    return sign | (uint16_t) h;
}

float rx_fp16_to_fp32 (uint16_t h)
{
    uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = (float) m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return s_float (sign | 0x7f800000u | (m << 13));
    return s_float (sign | ((e + 112) << 23) | (m << 13));
}

uint16_t rx_fp32_to_bf16 (float f)
{
    uint32_t u = s_bits (f);
    if ((u & 0x7fffffffu) > 0x7f800000u)               /* NaN: keep it quiet */
        return (uint16_t) ((u >> 16) | 64);
    return (uint16_t) ((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

float rx_bf16_to_fp32 (uint16_t h)
{
    return s_float ((uint32_t) h << 16);
}

/* -------------------------------------------------------------- helpers -- */

/* Round to nearest (ties to even) for |x| < 2^22, GGML's nearest_int. */
static inline int s_nearest_int (float fval)
{
    float val = fval + 12582912.f;
    int i;
    memcpy (&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline float s_h2f (uint16_t h) { return rx_fp16_to_fp32 (h); }
static inline uint16_t s_f2h (float f) { return rx_fp32_to_fp16 (f); }

/* ---------------------------------------------------------- 32-blocks -- */

static void s_quant_q8_0 (const float *x, rx_block_q8_0 *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.f;
        for (int j = 0; j < 32; j++)
            amax = S_MAX (amax, fabsf (x[j]));
        const float d = amax / 127.f;
        const float id = d ? 1.f / d : 0.f;
        y[i].d = s_f2h (d);
        for (int j = 0; j < 32; j++)
            y[i].q[j] = (int8_t) roundf (x[j] * id);
    }
}

static void s_dequant_q8_0 (const rx_block_q8_0 *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        const float d = s_h2f (x[i].d);
        for (int j = 0; j < 32; j++)
            y[j] = x[i].q[j] * d;
    }
}

static void s_quant_q4_0 (const float *x, rx_block_q4_0 *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.f, max = 0.f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf (x[j])) {
                amax = fabsf (x[j]);
                max = x[j];
            }
        const float d = max / -8;
        const float id = d ? 1.f / d : 0.f;
        y[i].d = s_f2h (d);
        for (int j = 0; j < 16; j++) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            const uint8_t q0 = (uint8_t) S_MIN (15, (int8_t) (x0 + 8.5f));
            const uint8_t q1 = (uint8_t) S_MIN (15, (int8_t) (x1 + 8.5f));
            y[i].q[j] = (uint8_t) (q0 | (q1 << 4));
        }
    }
}

static void s_dequant_q4_0 (const rx_block_q4_0 *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        const float d = s_h2f (x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j]      = ((x[i].q[j] & 0x0f) - 8) * d;
            y[j + 16] = ((x[i].q[j] >> 4) - 8) * d;
        }
    }
}

static void s_quant_q4_1 (const float *x, rx_block_q4_1 *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float min = INFINITY, max = -INFINITY;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.f / d : 0.f;
        y[i].d = s_f2h (d);
        y[i].m = s_f2h (min);
        for (int j = 0; j < 16; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const uint8_t q0 = (uint8_t) S_MIN (15, (int8_t) (x0 + 0.5f));
            const uint8_t q1 = (uint8_t) S_MIN (15, (int8_t) (x1 + 0.5f));
            y[i].q[j] = (uint8_t) (q0 | (q1 << 4));
        }
    }
}

static void s_dequant_q4_1 (const rx_block_q4_1 *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        const float d = s_h2f (x[i].d), m = s_h2f (x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j]      = (x[i].q[j] & 0x0f) * d + m;
            y[j + 16] = (x[i].q[j] >> 4) * d + m;
        }
    }
}

/* ------------------------------------------------------------- K-quants -- */

/* Weighted least-squares fit of x ~ scale*L + min over a grid of candidate
 * inverse scales (GGML's make_qkx2_quants); returns scale, *the_min = -min. */
static float s_make_qkx2 (int n, int nmax, const float *x, const float *w, uint8_t *L,
                          float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = s_nearest_int (iscale * (x[i] - min));
        L[i] = (uint8_t) S_MAX (0, S_MIN (nmax, l));
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = s_nearest_int (iscale * (x[i] - min));
            l = S_MAX (0, S_MIN (nmax, l));
            Laux[i] = (uint8_t) l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * diff * diff;
            }
            if (err < best_error) {
                memcpy (L, Laux, (size_t) n);
                best_error = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric fit with weights x^2 (GGML's make_qx_quants, rmse_type 1, no
 * importance weights); L gets values in [0, 2*nmax). */
static float s_make_qx (int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf (x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < S_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = s_nearest_int (iscale * x[i]);
        l = S_MAX (-nmax, S_MIN (nmax - 1, l));
        L[i] = (int8_t) (l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = s_nearest_int (iscale * x[i]);
            l = S_MAX (-nmax, S_MIN (nmax - 1, l));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = s_nearest_int (iscale * x[i]);
                L[i] = (int8_t) (nmax + S_MAX (-nmax, S_MIN (nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Shared by Q4_K and Q5_K: fit 8 sub-blocks of 32 with nmax levels, store
 * the 6-bit scales/mins and d/dmin, and requantize into L. */
static void s_qk_scales (const float *x, int nmax, float rmin, float rdelta, int nstep,
                         uint16_t *d_out, uint16_t *dmin_out, uint8_t *scales_out, uint8_t *L)
{
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf (sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf (x[32 * j + l]);
        scales[j] = s_make_qkx2 (32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                 rmin, rdelta, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset (scales_out, 0, RX_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t) s_nearest_int (inv_scale * scales[j]);
        uint8_t lm = (uint8_t) s_nearest_int (inv_min * mins[j]);
        ls = S_MIN (63, ls);
        lm = S_MIN (63, lm);
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (uint8_t) ((ls & 0xF) | ((lm & 0xF) << 4));
            scales_out[j - 4] |= (uint8_t) ((ls >> 4) << 6);
            scales_out[j - 0] |= (uint8_t) ((lm >> 4) << 6);
        }
    }
    *d_out = s_f2h (max_scale / 63.f);
    *dmin_out = s_f2h (max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        rx_get_scale_min_k4 (j, scales_out, &sc, &m);
        const float d = s_h2f (*d_out) * sc;
        if (!d) continue;
        const float dm = s_h2f (*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = s_nearest_int ((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t) S_MAX (0, S_MIN (nmax, l));
        }
    }
}

static void s_quant_q4_K (const float *x, rx_block_q4_K *y, size_t nb)
{
    uint8_t L[RX_QK_K];
    for (size_t i = 0; i < nb; i++, x += RX_QK_K) {
        s_qk_scales (x, 15, -1.f, 0.1f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < RX_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t) (L[j + l] | (L[j + l + 32] << 4));
    }
}

static void s_dequant_q4_K (const rx_block_q4_K *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = s_h2f (x[i].d), min = s_h2f (x[i].dmin);
        for (int j = 0, is = 0; j < RX_QK_K; j += 64, q += 32, is += 2) {
            uint8_t sc, m;
            rx_get_scale_min_k4 (is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            rx_get_scale_min_k4 (is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void s_quant_q5_K (const float *x, rx_block_q5_K *y, size_t nb)
{
    uint8_t L[RX_QK_K];
    for (size_t i = 0; i < nb; i++, x += RX_QK_K) {
        s_qk_scales (x, 31, -0.5f, 0.1f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset (qh, 0, RX_QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < RX_QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t) (l1 | (l2 << 4));
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

static void s_dequant_q5_K (const rx_block_q5_K *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = s_h2f (x[i].d), min = s_h2f (x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < RX_QK_K; j += 64, ql += 32, is += 2) {
            uint8_t sc, m;
            rx_get_scale_min_k4 (is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            rx_get_scale_min_k4 (is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void s_quant_q6_K (const float *x, rx_block_q6_K *y, size_t nb)
{
    int8_t L[RX_QK_K];
    float scales[RX_QK_K / 16];
    for (size_t i = 0; i < nb; i++, x += RX_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < RX_QK_K / 16; ib++) {
            const float scale = s_make_qx (16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf (scale) > max_abs_scale) {
                max_abs_scale = fabsf (scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < S_GROUP_MAX_EPS) {
            memset (&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = s_f2h (1 / iscale);
        for (int ib = 0; ib < RX_QK_K / 16; ib++)
            y[i].scales[ib] = (int8_t) S_MIN (127, s_nearest_int (iscale * scales[ib]));
        for (int j = 0; j < RX_QK_K / 16; j++) {
            float d = s_h2f (y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = s_nearest_int (x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t) (S_MAX (-32, S_MIN (31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < RX_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t) (q1 | (q3 << 4));
                ql[l + 32] = (uint8_t) (q2 | (q4 << 4));
                qh[l] = (uint8_t) ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                   ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

static void s_dequant_q6_K (const rx_block_q6_K *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const float d = s_h2f (x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < RX_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

static void s_quant_q8_K (const float *x, rx_block_q8_K *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += RX_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < RX_QK_K; j++) {
            float ax = fabsf (x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            memset (&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < RX_QK_K; j++) {
            int v = s_nearest_int (iscale * x[j]);
            y[i].qs[j] = (int8_t) S_MIN (127, v);
        }
        for (int j = 0; j < RX_QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t) sum;
        }
        y[i].d = 1 / iscale;
    }
}

static void s_dequant_q8_K (const rx_block_q8_K *x, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += RX_QK_K)
        for (int j = 0; j < RX_QK_K; j++)
            y[j] = x[i].d * x[i].qs[j];
}

/* ------------------------------------------------------------------ API -- */

int rx_quant_supported (int type)
{
    switch (type) {
    case RX_F32: case RX_F16: case RX_BF16: case RX_Q8_0: case RX_Q4_0: case RX_Q4_1:
    case RX_Q4_K: case RX_Q5_K: case RX_Q6_K: case RX_Q8_K:
        return 1;
    default:
        return 0;
    }
}

size_t rx_quantize_row (int type, const float *x, void *y, size_t n)
{
    if (!rx_quant_supported (type) || !x || !y || n == 0)
        return 0;
    size_t bytes = rx_dtype_row_bytes (type, n);
    if (bytes == 0)
        return 0;
    size_t nb = n / rx_dtype_block (type);
    switch (type) {
    case RX_F32: memmove (y, x, n * sizeof (float)); break;
    case RX_F16: { uint16_t *h = y; for (size_t i = 0; i < n; i++) h[i] = rx_fp32_to_fp16 (x[i]); break; }
    case RX_BF16: { uint16_t *h = y; for (size_t i = 0; i < n; i++) h[i] = rx_fp32_to_bf16 (x[i]); break; }
    case RX_Q8_0: s_quant_q8_0 (x, y, nb); break;
    case RX_Q4_0: s_quant_q4_0 (x, y, nb); break;
    case RX_Q4_1: s_quant_q4_1 (x, y, nb); break;
    case RX_Q4_K: s_quant_q4_K (x, y, nb); break;
    case RX_Q5_K: s_quant_q5_K (x, y, nb); break;
    case RX_Q6_K: s_quant_q6_K (x, y, nb); break;
    case RX_Q8_K: s_quant_q8_K (x, y, nb); break;
    default: return 0;
    }
    return bytes;
}

int rx_dequantize_row (int type, const void *x, float *y, size_t n)
{
    if (!rx_quant_supported (type) || !x || !y || rx_dtype_row_bytes (type, n) == 0)
        return RX_EINVAL;
    size_t nb = n / rx_dtype_block (type);
    switch (type) {
    case RX_F32: memmove (y, x, n * sizeof (float)); break;
    case RX_F16: { const uint16_t *h = x; for (size_t i = 0; i < n; i++) y[i] = rx_fp16_to_fp32 (h[i]); break; }
    case RX_BF16: { const uint16_t *h = x; for (size_t i = 0; i < n; i++) y[i] = rx_bf16_to_fp32 (h[i]); break; }
    case RX_Q8_0: s_dequant_q8_0 (x, y, nb); break;
    case RX_Q4_0: s_dequant_q4_0 (x, y, nb); break;
    case RX_Q4_1: s_dequant_q4_1 (x, y, nb); break;
    case RX_Q4_K: s_dequant_q4_K (x, y, nb); break;
    case RX_Q5_K: s_dequant_q5_K (x, y, nb); break;
    case RX_Q6_K: s_dequant_q6_K (x, y, nb); break;
    case RX_Q8_K: s_dequant_q8_K (x, y, nb); break;
    default: return RX_EINVAL;
    }
    return RX_OK;
}
