/* kernels/cpu/kern_avx512.c -- the AVX-512 (F, BW, VL, VNNI) path.
 *
 * GGML-layout kernels come from kern_x86.inc (16-lane float kernels, VNNI
 * for the quantized ones).  On top, Q8_0/Q4_0/Q4_1 weights are repacked at
 * load into a block-interleaved row layout -- the same bytes per row as
 * GGML, so decode streams no more memory:
 *
 *     [ quants, groups of 16 blocks ][ d: fp16 x nb ][ m: fp16 x nb (Q4_1) ]
 *
 * Inside a group of gb (<= 16) blocks, vector k (gb x 4 bytes) holds bytes
 * 4k..4k+3 of every block's quants: int32 lane i of every vpdpbusd belongs
 * to block i.  So a whole group accumulates in integer lanes with no
 * shuffles, and one multiply by the 16 block scales (one vector load of
 * fp16 d) finishes it.  Q8_0 quants are stored biased by 128 (q ^ 0x80,
 * unsigned, the operand vpdpbusd wants); Q4 bytes keep both nibbles (low =
 * element j, high = element j + 16) and are split in registers.
 *
 * Activations for these kernels, per row (all parts 64-byte aligned, every
 * group padded to 16 blocks with zeros):
 *     xq   G x 8 x 64 B   vector k, lane i: elements 4k..4k+3 of block i
 *     init G x 16 int32   vpdpbusd start values: -128*sum(q) (Q8_0),
 *                         -8*sum(q) (Q4_0), 0 (Q4_1) per block
 *     dx   G x 16 float   block scales
 *     dxs  G x 16 float   Q4_1 only: d * sum(q) */
#if defined(__x86_64__)
#pragma GCC target ("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define S_AVX512 1
#include "kern_x86.inc"

static int s_rp_type (int dtype)
{
    return dtype == RX_Q8_0 || dtype == RX_Q4_0 || dtype == RX_Q4_1;
}

static size_t s_qb (int dtype) { return dtype == RX_Q8_0 ? 32 : 16; }

static size_t s_repack_row_bytes (int dtype, size_t in)
{
    if (!s_rp_type (dtype) || in % 32) return 0;
    return rx_dtype_row_bytes (dtype, in);   /* same size, other order */
}

/* Quant bytes of block b (byte j) inside a repacked row. */
static inline size_t s_qpos (size_t nb, size_t qb, size_t b, size_t j)
{
    const size_t g = b / 16, i = b % 16, gb = nb - g * 16 < 16 ? nb - g * 16 : 16;
    return g * 16 * qb + (j / 4) * gb * 4 + i * 4 + j % 4;
}

static void s_repack (int dtype, const void *src, void *dst, size_t in, size_t rows)
{
    const size_t nb = in / 32, qb = s_qb (dtype), rb = rx_dtype_row_bytes (dtype, in);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *s = (const uint8_t *) src + r * rb;
        uint8_t *o = (uint8_t *) dst + r * rb;
        uint16_t *d = (uint16_t *) (o + nb * qb), *m = d + nb;
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *q;
            if (dtype == RX_Q8_0) {
                const rx_block_q8_0 *blk = (const rx_block_q8_0 *) s + b;
                d[b] = blk->d;
                q = (const uint8_t *) blk->q;
            } else if (dtype == RX_Q4_0) {
                const rx_block_q4_0 *blk = (const rx_block_q4_0 *) s + b;
                d[b] = blk->d;
                q = blk->q;
            } else {
                const rx_block_q4_1 *blk = (const rx_block_q4_1 *) s + b;
                d[b] = blk->d;
                m[b] = blk->m;
                q = blk->q;
            }
            for (size_t j = 0; j < qb; j++)
                o[s_qpos (nb, qb, b, j)] = dtype == RX_Q8_0 ? (uint8_t) (q[j] ^ 0x80) : q[j];
        }
    }
}

static void s_repacked_row (int dtype, const void *row, float *y, size_t in)
{
    const size_t nb = in / 32, qb = s_qb (dtype);
    const uint8_t *o = row;
    const uint16_t *d = (const uint16_t *) (o + nb * qb), *m = d + nb;
    for (size_t b = 0; b < nb; b++, y += 32) {
        const float db = s_h2f (d[b]);
        if (dtype == RX_Q8_0) {
            for (size_t j = 0; j < 32; j++)
                y[j] = (float) (int8_t) (o[s_qpos (nb, qb, b, j)] ^ 0x80) * db;
        } else {
            const float mb = dtype == RX_Q4_1 ? s_h2f (m[b]) : 0.f;
            const int off = dtype == RX_Q4_0 ? 8 : 0;
            for (size_t j = 0; j < 16; j++) {
                const uint8_t v = o[s_qpos (nb, qb, b, j)];
                y[j] = (float) ((v & 15) - off) * db + mb;
                y[j + 16] = (float) ((v >> 4) - off) * db + mb;
            }
        }
    }
}

/* ------------------------------------------------ repacked activations -- */

struct s_act_lay { size_t xq, init, dx, dxs, bytes; };

static struct s_act_lay s_act_layout (int dtype, size_t in)
{
    const size_t ng = (in / 32 + 15) / 16;
    struct s_act_lay l;
    l.xq = 0;
    l.init = ng * 512;
    l.dx = l.init + ng * 64;
    l.dxs = l.dx + ng * 64;
    l.bytes = l.dxs + (dtype == RX_Q4_1 ? ng * 64 : 0);
    return l;
}

static size_t s_act_row_bytes (int dtype, int repacked, size_t in)
{
    if (repacked && s_rp_type (dtype)) return s_act_layout (dtype, in).bytes;
    return rx_kisa_act_row_bytes_ref (dtype, repacked, in);
}

static void s_act_quant (int dtype, int repacked, const float *x, void *dst, size_t in)
{
    if (!(repacked && s_rp_type (dtype))) {
        rx_kisa_act_quant_ref (dtype, repacked, x, dst, in);
        return;
    }
    const struct s_act_lay l = s_act_layout (dtype, in);
    const size_t nb = in / 32;
    uint8_t *o = dst;
    int32_t *init = (int32_t *) (o + l.init);
    float *dx = (float *) (o + l.dx), *dxs = (float *) (o + l.dxs);
    memset (o, 0, l.bytes);
    for (size_t b = 0; b < nb; b++) {
        rx_q8a a;
        rx_kisa_q8a_quant (x + b * 32, &a, 1);   /* the one rounding every path uses */
        const size_t g = b / 16, i = b % 16;
        uint8_t *gq = o + l.xq + g * 512 + i * 4;
        for (int k = 0; k < 8; k++) memcpy (gq + k * 64, a.q + 4 * k, 4);
        init[b] = dtype == RX_Q8_0 ? -128 * a.s : dtype == RX_Q4_0 ? -8 * a.s : 0;
        dx[b] = a.d;
        if (dtype == RX_Q4_1) dxs[b] = a.d * (float) a.s;
    }
}

/* ------------------------------------------------- repacked kernels -- */

#define S_RTR 4
#define S_RTC 2
#ifndef S_PREFETCH
#  define S_PREFETCH 0         /* bytes ahead; 0: one tile of rows ahead */
#endif

S_INLINE void s_rp_tile (const struct rx_mm_job *j, size_t r, size_t t, const int R, const int C,
                         const int dtype)
{
    const size_t nb = j->in / 32, qb = s_qb (dtype), ng = (nb + 15) / 16;
    const struct s_act_lay l = s_act_layout (dtype, j->in);
    const __m512i m4 = _mm512_set1_epi8 (0x0F);
    /* Prefetch the same spot of the rows the next tile will read. */
    const size_t pf = S_PREFETCH ? S_PREFETCH : (size_t) R * j->w_row_bytes;
    __m512 acc[S_RTR][S_RTC];
    S_UNROLL for (int a = 0; a < R; a++)
        S_UNROLL for (int c = 0; c < C; c++) acc[a][c] = _mm512_setzero_ps ();
    const uint8_t *wr = j->w + r * j->w_row_bytes;
    const uint8_t *xr = j->xa + t * j->xa_row_bytes;
    for (size_t g = 0; g < ng; g++) {
        const size_t b0 = g * 16, gb = nb - b0 < 16 ? nb - b0 : 16;
        const __mmask16 m = (__mmask16) ((1u << gb) - 1);
        __m512i isum[S_RTR][S_RTC];
        S_UNROLL for (int c = 0; c < C; c++) {
            const __m512i in0 = _mm512_load_si512 (xr + (size_t) c * j->xa_row_bytes + l.init + g * 64);
            S_UNROLL for (int a = 0; a < R; a++) isum[a][c] = in0;
        }
        if (dtype == RX_Q8_0) {
            S_UNROLL for (int k = 0; k < 8; k++) {
                __m512i xk[S_RTC];
                S_UNROLL for (int c = 0; c < C; c++)
                    xk[c] = _mm512_load_si512 (xr + (size_t) c * j->xa_row_bytes + l.xq + g * 512 + (size_t) k * 64);
                S_UNROLL for (int a = 0; a < R; a++) {
                    const uint8_t *q = wr + (size_t) a * j->w_row_bytes + b0 * qb + (size_t) k * gb * 4;
                    _mm_prefetch ((const char *) q + pf, _MM_HINT_T0);
                    const __m512i wk = _mm512_maskz_loadu_epi32 (m, q);
                    S_UNROLL for (int c = 0; c < C; c++) isum[a][c] = _mm512_dpbusd_epi32 (isum[a][c], wk, xk[c]);
                }
            }
        } else {
            S_UNROLL for (int k = 0; k < 4; k++) {
                __m512i xlo[S_RTC], xhi[S_RTC];
                S_UNROLL for (int c = 0; c < C; c++) {
                    const uint8_t *xc = xr + (size_t) c * j->xa_row_bytes + l.xq + g * 512;
                    xlo[c] = _mm512_load_si512 (xc + (size_t) k * 64);
                    xhi[c] = _mm512_load_si512 (xc + (size_t) (k + 4) * 64);
                }
                S_UNROLL for (int a = 0; a < R; a++) {
                    const uint8_t *q = wr + (size_t) a * j->w_row_bytes + b0 * qb + (size_t) k * gb * 4;
                    _mm_prefetch ((const char *) q + pf, _MM_HINT_T0);
                    const __m512i v = _mm512_maskz_loadu_epi32 (m, q);
                    const __m512i lo = _mm512_and_si512 (v, m4);
                    const __m512i hi = _mm512_and_si512 (_mm512_srli_epi16 (v, 4), m4);
                    S_UNROLL for (int c = 0; c < C; c++) {
                        isum[a][c] = _mm512_dpbusd_epi32 (isum[a][c], lo, xlo[c]);
                        isum[a][c] = _mm512_dpbusd_epi32 (isum[a][c], hi, xhi[c]);
                    }
                }
            }
        }
        /* Scale each block's integer sum by d_w * d_x, once per group. */
        __m512 dx[S_RTC];
        S_UNROLL for (int c = 0; c < C; c++)
            dx[c] = _mm512_load_ps ((const float *) (xr + (size_t) c * j->xa_row_bytes + l.dx) + b0);
        S_UNROLL for (int a = 0; a < R; a++) {
            const uint8_t *row = wr + (size_t) a * j->w_row_bytes;
            const __m512 dw = _mm512_cvtph_ps (_mm256_maskz_loadu_epi16 (m, row + nb * qb + b0 * 2));
            S_UNROLL for (int c = 0; c < C; c++)
                acc[a][c] = _mm512_fmadd_ps (_mm512_cvtepi32_ps (isum[a][c]), _mm512_mul_ps (dw, dx[c]),
                                             acc[a][c]);
            if (dtype == RX_Q4_1) {
                const __m512 mw = _mm512_cvtph_ps (_mm256_maskz_loadu_epi16 (m, row + nb * qb + nb * 2 + b0 * 2));
                S_UNROLL for (int c = 0; c < C; c++) {
                    const __m512 dxs = _mm512_load_ps ((const float *) (xr + (size_t) c * j->xa_row_bytes + l.dxs) + b0);
                    acc[a][c] = _mm512_fmadd_ps (mw, dxs, acc[a][c]);
                }
            }
        }
    }
    S_UNROLL for (int c = 0; c < C; c++)
        S_UNROLL for (int a = 0; a < R; a++)
            s_store (j, r + (size_t) a, t + (size_t) c, _mm512_reduce_add_ps (acc[a][c]));
}

S_INLINE void s_rp_q8_0 (const struct rx_mm_job *j, size_t r, size_t t, const int R, const int C)
{ s_rp_tile (j, r, t, R, C, RX_Q8_0); }
S_INLINE void s_rp_q4_0 (const struct rx_mm_job *j, size_t r, size_t t, const int R, const int C)
{ s_rp_tile (j, r, t, R, C, RX_Q4_0); }
S_INLINE void s_rp_q4_1 (const struct rx_mm_job *j, size_t r, size_t t, const int R, const int C)
{ s_rp_tile (j, r, t, R, C, RX_Q4_1); }

S_DRIVER_T (s_mm_rp_q8_0, s_rp_q8_0, S_RTR, S_RTC)
S_DRIVER_T (s_mm_rp_q4_0, s_rp_q4_0, S_RTR, S_RTC)
S_DRIVER_T (s_mm_rp_q4_1, s_rp_q4_1, S_RTR, S_RTC)

static void s_mm (const struct rx_mm_job *j, size_t r0, size_t r1)
{
    if (j->repacked) {
        switch (j->dtype) {
        case RX_Q8_0: s_mm_rp_q8_0 (j, r0, r1); return;
        case RX_Q4_0: s_mm_rp_q4_0 (j, r0, r1); return;
        case RX_Q4_1: s_mm_rp_q4_1 (j, r0, r1); return;
        default: break;
        }
    }
    s_mm_ggml (j, r0, r1);
}

const struct rx_kisa rx_kisa_avx512 = {
    .name = "avx512",
    .act_row_bytes = s_act_row_bytes,
    .act_quant = s_act_quant,
    .mm_supported = s_mm_supported,
    .mm = s_mm,
    .repack_row_bytes = s_repack_row_bytes,
    .repack = s_repack,
    .repacked_row = s_repacked_row,
    .dot_f32 = s_vdot_f32,
    .dot_f16 = s_vdot_f16,
    .axpy_f32 = s_axpy_f32,
    .axpy_f16 = s_axpy_f16,
};
#endif
