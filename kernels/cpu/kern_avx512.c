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
 *     dxs  G x 16 float   Q4_1 only: d * sum(q)
 *
 * Also here: the packed outer-product GEMM for F32/F16/BF16 weights and
 * 16+ activation rows (prompt processing), and block primitives for
 * attention (scores of 16 KV rows per transpose-reduction, the V-weighted
 * sum with the output in registers, a vectorized softmax). */
#if defined(__x86_64__)
#pragma GCC target ("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define S_AVX512 1
#include <math.h>

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
    const __m512 absm = _mm512_castsi512_ps (_mm512_set1_epi32 (0x7FFFFFFF));
    for (size_t b = 0; b < nb; b++) {
        /* rx_kisa_q8a_quant's numbers, 16 lanes at a time: the same amax
         * (max ignores NaN lanes like its compare does), d and id from the
         * same scalar expressions, and round-half-even of the same product
         * (vcvtps2dq in the default rounding mode). */
        const float *xb = x + b * 32;
        const __m512 x0 = _mm512_loadu_ps (xb), x1 = _mm512_loadu_ps (xb + 16);
        const float amax = _mm512_reduce_max_ps (_mm512_max_ps (_mm512_and_ps (x1, absm),
                                                                _mm512_and_ps (x0, absm)));
        int32_t s = 0;
        float d;
        uint8_t q[32];
        if (amax <= 3.0e38f) {
            const float id = amax != 0.f ? 127.f / amax : 0.f;
            d = _cvtsh_ss (_cvtss_sh (amax / 127.f, _MM_FROUND_TO_NEAREST_INT));
            const __m512i q0 = _mm512_cvtps_epi32 (_mm512_mul_ps (x0, _mm512_set1_ps (id)));
            const __m512i q1 = _mm512_cvtps_epi32 (_mm512_mul_ps (x1, _mm512_set1_ps (id)));
            s = _mm512_reduce_add_epi32 (_mm512_add_epi32 (q0, q1));
            _mm_storeu_si128 ((__m128i *) q, _mm512_cvtepi32_epi8 (q0));
            _mm_storeu_si128 ((__m128i *) (q + 16), _mm512_cvtepi32_epi8 (q1));
        } else {    /* inf: the scalar routine's numbers, whatever they are */
            rx_q8a a;
            rx_kisa_q8a_quant (xb, &a, 1);
            memcpy (q, a.q, 32);
            s = a.s;
            d = a.d;
        }
        const size_t g = b / 16, i = b % 16;
        uint8_t *gq = o + l.xq + g * 512 + i * 4;
        for (int k = 0; k < 8; k++) memcpy (gq + k * 64, q + 4 * k, 4);
        init[b] = dtype == RX_Q8_0 ? -128 * s : dtype == RX_Q4_0 ? -8 * s : 0;
        dx[b] = d;
        if (dtype == RX_Q4_1) dxs[b] = d * (float) s;
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


/* ------------------------------------- float GEMM for many tokens (pp) -- */

/* F32/F16/BF16 weights times many activation rows (prompt processing): an
 * outer-product, register-blocked GEMM instead of per-output dot products,
 * so no horizontal sums and 2 weight loads feed 2 x S_GMR FMAs.  Per panel
 * of S_GNR weight rows and S_GKC columns, the weights are converted to F32
 * once and packed k-major ([k][32 rows], gathered, so no transpose) into
 * the thread's j->pack, which stays in L1 while every group of S_GMR
 * tokens runs over it: acc[token][2 x 16 rows] += W[k][rows] * x[token][k].
 * The results land as 16 consecutive outputs of a token -- y's own layout. */
#define S_GNR 32                 /* weight rows per panel (2 vectors) */
#define S_GMR 12                 /* tokens per micro-tile */
#ifndef S_GKC
#  define S_GKC 192              /* columns per panel: 24 KiB of F32 */
#endif
#ifndef S_GMAXR
#  define S_GMAXR 256            /* rows packed at once: 192 KiB, in L2 */
#endif
#ifndef S_GEMM_MIN_N
#  define S_GEMM_MIN_N 16        /* below, the dot-product tiles win */
#endif

static int s_gemm_type (int dtype)
{
    return dtype == RX_F16 || dtype == RX_F32 || dtype == RX_BF16;
}

static size_t s_mm_pack_bytes (int dtype, size_t in, size_t n)
{
    (void) in;
    if (!s_gemm_type (dtype) || n < S_GEMM_MIN_N) return 0;
    return (size_t) S_GKC * S_GMAXR * sizeof (float);
}

/* Pack columns [k0, k0 + kc) of nr (<= 32) rows starting at w into
 * p[k - k0][32] as F32, rows nr..31 zero. */
static void s_gemm_pack (int dtype, const uint8_t *w, size_t rb, size_t nr, size_t k0, size_t kc,
                         float *p)
{
    const __m512i idx0 = _mm512_mullo_epi32 (_mm512_setr_epi32 (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32 ((int) rb));
    const __m512i idx1 = _mm512_add_epi32 (idx0, _mm512_set1_epi32 ((int) (16 * rb)));
    const __mmask16 m0 = nr >= 16 ? (__mmask16) 0xFFFF : (__mmask16) ((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? (__mmask16) 0xFFFF : nr > 16 ? (__mmask16) ((1u << (nr - 16)) - 1) : 0;
    const __m512i z = _mm512_setzero_si512 ();
    size_t k = k0;
    const size_t ke = k0 + kc;
    if (dtype == RX_F32) {
        for (; k < ke; k++, p += S_GNR) {
            const uint8_t *b = w + k * 4;
            _mm512_store_ps (p, _mm512_mask_i32gather_ps (_mm512_setzero_ps (), m0, idx0, b, 1));
            _mm512_store_ps (p + 16, _mm512_mask_i32gather_ps (_mm512_setzero_ps (), m1, idx1, b, 1));
        }
        return;
    }
    /* 16-bit types: one dword gather brings columns k and k + 1 (both
     * inside the row: k + 1 < ke <= in). */
    for (; k + 2 <= ke; k += 2, p += 2 * S_GNR) {
        const uint8_t *b = w + k * 2;
        const __m512i g[2] = { _mm512_mask_i32gather_epi32 (z, m0, idx0, b, 1),
                               _mm512_mask_i32gather_epi32 (z, m1, idx1, b, 1) };
        for (int h = 0; h < 2; h++) {
            __m512 lo, hi;
            if (dtype == RX_F16) {
                lo = _mm512_cvtph_ps (_mm512_cvtepi32_epi16 (g[h]));
                hi = _mm512_cvtph_ps (_mm512_cvtepi32_epi16 (_mm512_srli_epi32 (g[h], 16)));
            } else {
                lo = _mm512_castsi512_ps (_mm512_slli_epi32 (g[h], 16));
                hi = _mm512_castsi512_ps (_mm512_and_si512 (g[h], _mm512_set1_epi32 ((int) 0xFFFF0000u)));
            }
            _mm512_store_ps (p + 16 * h, lo);
            _mm512_store_ps (p + S_GNR + 16 * h, hi);
        }
    }
    if (k < ke) {   /* an odd last column: a dword would run past the row */
        for (size_t r = 0; r < S_GNR; r++) {
            float v = 0.f;
            if (r < nr) {
                const uint16_t h = *(const uint16_t *) (w + r * rb + k * 2);
                const uint32_t bits = (uint32_t) h << 16;
                if (dtype == RX_F16) v = s_h2f (h);
                else memcpy (&v, &bits, sizeof v);
            }
            p[r] = v;
        }
    }
}

/* y[m][0..nr) (+)= sum_k p[k][.] * x[m][k] for M tokens (M constant). */
S_INLINE void s_gemm_micro (const float *p, const float *x, size_t ldx, size_t kc, float *y, size_t ldy,
                            const int M, __mmask16 m0, __mmask16 m1, int load_y)
{
    __m512 acc[S_GMR][2];
    S_UNROLL for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps ();
    for (size_t k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_load_ps (p + k * S_GNR), w1 = _mm512_load_ps (p + k * S_GNR + 16);
        _Pragma ("GCC unroll 12") for (int m = 0; m < M; m++) {
            const __m512 b = _mm512_set1_ps (x[(size_t) m * ldx + k]);
            acc[m][0] = _mm512_fmadd_ps (w0, b, acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps (w1, b, acc[m][1]);
        }
    }
    _Pragma ("GCC unroll 12") for (int m = 0; m < M; m++) {
        float *yr = y + (size_t) m * ldy;
        if (load_y) {
            acc[m][0] = _mm512_add_ps (acc[m][0], _mm512_maskz_loadu_ps (m0, yr));
            acc[m][1] = _mm512_add_ps (acc[m][1], _mm512_maskz_loadu_ps (m1, yr + 16));
        }
        _mm512_mask_storeu_ps (yr, m0, acc[m][0]);
        _mm512_mask_storeu_ps (yr + 16, m1, acc[m][1]);
    }
}

#define S_GCASE(M) case M: s_gemm_micro (p, x, ldx, kc, y, ldy, M, m0, m1, load_y); break;
static void s_gemm_tail (const float *p, const float *x, size_t ldx, size_t kc, float *y, size_t ldy,
                         int M, __mmask16 m0, __mmask16 m1, int load_y)
{
    switch (M) {
    S_GCASE (1) S_GCASE (2) S_GCASE (3) S_GCASE (4) S_GCASE (5) S_GCASE (6)
    S_GCASE (7) S_GCASE (8) S_GCASE (9) S_GCASE (10) S_GCASE (11)
    default: break;
    }
}
#undef S_GCASE

S_INLINE __mmask16 s_gmask (size_t nr, int h)   /* rows of vector h (0, 1) in a panel */
{
    const size_t lo = (size_t) h * 16;
    return nr >= lo + 16 ? (__mmask16) 0xFFFF : nr > lo ? (__mmask16) ((1u << (nr - lo)) - 1) : 0;
}

static void __attribute__ ((noinline))
s_mm_gemm (const struct rx_mm_job *j, size_t r0, size_t r1)
{
    const size_t in = j->in, ldx = j->xa_row_bytes / sizeof (float), n = j->n;
    const float *xa = (const float *) j->xa;
    float *p = j->pack;
    const size_t pstride = (size_t) S_GKC * S_GNR;
    for (size_t rb0 = r0; rb0 < r1; rb0 += S_GMAXR) {
        const size_t rn = r1 - rb0 < S_GMAXR ? r1 - rb0 : S_GMAXR, np = (rn + S_GNR - 1) / S_GNR;
        for (size_t k0 = 0; k0 < in; k0 += S_GKC) {
            const size_t kc = in - k0 < S_GKC ? in - k0 : S_GKC;
            for (size_t pi = 0; pi < np; pi++) {
                const size_t r = rb0 + pi * S_GNR, nr = rb0 + rn - r < S_GNR ? rb0 + rn - r : S_GNR;
                s_gemm_pack (j->dtype, j->w + r * j->w_row_bytes, j->w_row_bytes, nr, k0, kc, p + pi * pstride);
            }
            /* Later column panels add to what the first one stored. */
            const int load_y = k0 > 0 || j->accumulate;
            /* Each token tile's x (in L1) runs over every panel (in L2). */
            for (size_t t = 0; t < n; t += S_GMR) {
                const float *x = xa + t * ldx + k0;
                for (size_t pi = 0; pi < np; pi++) {
                    const size_t r = rb0 + pi * S_GNR, nr = rb0 + rn - r < S_GNR ? rb0 + rn - r : S_GNR;
                    float *y = j->y + t * j->ldy + r;
                    if (t + S_GMR <= n)
                        s_gemm_micro (p + pi * pstride, x, ldx, kc, y, j->ldy, S_GMR, s_gmask (nr, 0),
                                      s_gmask (nr, 1), load_y);
                    else
                        s_gemm_tail (p + pi * pstride, x, ldx, kc, y, j->ldy, (int) (n - t), s_gmask (nr, 0),
                                     s_gmask (nr, 1), load_y);
                }
            }
        }
    }
}

/* ------------------------------------------------ attention blocks -- */

/* 16 vectors -> one vector of their 16 sums (a transpose-and-add tree:
 * about 3 operations per sum instead of a full reduction each). */
S_INLINE __m512 s_sum16 (const __m512 *v)
{
    __m512 t[8], w[4];
    S_UNROLL for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps (_mm512_unpacklo_ps (v[2 * i], v[2 * i + 1]),
                              _mm512_unpackhi_ps (v[2 * i], v[2 * i + 1]));
    S_UNROLL for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd (t[2 * i]), b = _mm512_castps_pd (t[2 * i + 1]);
        w[i] = _mm512_add_ps (_mm512_castpd_ps (_mm512_unpacklo_pd (a, b)),
                              _mm512_castpd_ps (_mm512_unpackhi_pd (a, b)));
    }
    const __m512 s01 = _mm512_add_ps (_mm512_shuffle_f32x4 (w[0], w[1], _MM_SHUFFLE (2, 0, 2, 0)),
                                      _mm512_shuffle_f32x4 (w[0], w[1], _MM_SHUFFLE (3, 1, 3, 1)));
    const __m512 s23 = _mm512_add_ps (_mm512_shuffle_f32x4 (w[2], w[3], _MM_SHUFFLE (2, 0, 2, 0)),
                                      _mm512_shuffle_f32x4 (w[2], w[3], _MM_SHUFFLE (3, 1, 3, 1)));
    return _mm512_add_ps (_mm512_shuffle_f32x4 (s01, s23, _MM_SHUFFLE (2, 0, 2, 0)),
                          _mm512_shuffle_f32x4 (s01, s23, _MM_SHUFFLE (3, 1, 3, 1)));
}

S_INLINE __m512 s_kv_dot (const float *q, const uint8_t *row, int dtype, size_t hk, size_t esz)
{
    __m512 acc = _mm512_setzero_ps ();
    size_t i = 0;
    for (; i + 16 <= hk; i += 16)
        acc = _mm512_fmadd_ps (_mm512_loadu_ps (q + i), s_loadw (dtype, row + i * esz, S_FULLMASK), acc);
    if (i < hk) {
        const __mmask16 m = S_TAILMASK ((int) (hk - i));
        acc = _mm512_fmadd_ps (_mm512_maskz_loadu_ps (m, q + i), s_loadw (dtype, row + i * esz, m), acc);
    }
    return acc;
}

/* Scores of 16 rows for one head whose hk = 16 * NV: q stays in registers. */
S_INLINE void s_scores16 (const float *q, const uint8_t *b, int dtype, size_t stride, size_t esz,
                          const int32_t *slots, float *out, const int NV)
{
    __m512 qv[8], v[16];
    S_UNROLL for (int i = 0; i < NV; i++) qv[i] = _mm512_loadu_ps (q + 16 * i);
    S_UNROLL for (int u = 0; u < 16; u++) {
        const uint8_t *row = b + (size_t) slots[u] * stride * esz;
        __m512 acc = _mm512_mul_ps (qv[0], s_loadw (dtype, row, S_FULLMASK));
        S_UNROLL for (int i = 1; i < NV; i++)
            acc = _mm512_fmadd_ps (qv[i], s_loadw (dtype, row + (size_t) i * 16 * esz, S_FULLMASK), acc);
        v[u] = acc;
    }
    _mm512_storeu_ps (out, s_sum16 (v));
}

static void s_attn_scores (const float *q, size_t ldq, size_t nq, const void *base, int dtype,
                           size_t stride, const int32_t *slots, size_t n, size_t hk, float *out,
                           size_t ldo)
{
    const size_t esz = dtype == RX_F16 ? 2 : 4;
    const uint8_t *b = base;
    const int nv = hk % 16 == 0 && hk <= 128 ? (int) (hk / 16) : 0;
    size_t j = 0;
    /* 16 rows (in L1 after the first head) for every head, then the next 16. */
    for (; j + 16 <= n; j += 16)
        for (size_t g = 0; g < nq; g++) {
            const float *qg = q + g * ldq;
            float *o = out + g * ldo + j;
            switch (nv) {
            case 1: s_scores16 (qg, b, dtype, stride, esz, slots + j, o, 1); break;
            case 2: s_scores16 (qg, b, dtype, stride, esz, slots + j, o, 2); break;
            case 4: s_scores16 (qg, b, dtype, stride, esz, slots + j, o, 4); break;
            case 8: s_scores16 (qg, b, dtype, stride, esz, slots + j, o, 8); break;
            default: {
                __m512 v[16];
                S_UNROLL for (int u = 0; u < 16; u++)
                    v[u] = s_kv_dot (qg, b + (size_t) slots[j + (size_t) u] * stride * esz, dtype, hk, esz);
                _mm512_storeu_ps (o, s_sum16 (v));
            }
            }
        }
    for (; j < n; j++)
        for (size_t g = 0; g < nq; g++)
            out[g * ldo + j] = _mm512_reduce_add_ps (s_kv_dot (q + g * ldq, b + (size_t) slots[j] * stride * esz,
                                                               dtype, hk, esz));
}

static void s_attn_wsum (float *o, size_t ldo, const float *p, size_t ldp, size_t nq, const void *base,
                         int dtype, size_t stride, const int32_t *slots, size_t n, size_t hv)
{
    const size_t esz = dtype == RX_F16 ? 2 : 4;
    const uint8_t *b = base;
    /* 64 outputs of up to 4 heads stay in 16 registers over all n rows,
     * each row chunk loaded once for the 4. */
    for (size_t i0 = 0; i0 < hv; i0 += 64) {
        const size_t w = hv - i0 < 64 ? hv - i0 : 64;
        __mmask16 m[4];
        S_UNROLL for (int v = 0; v < 4; v++) {
            const size_t lo = (size_t) v * 16;
            m[v] = w >= lo + 16 ? (__mmask16) 0xFFFF : w > lo ? S_TAILMASK ((int) (w - lo)) : 0;
        }
        for (size_t g0 = 0; g0 < nq; g0 += 4) {
            const size_t G = nq - g0 < 4 ? nq - g0 : 4;
            __m512 acc[4][4];
            S_UNROLL for (int g = 0; g < 4; g++)
                S_UNROLL for (int v = 0; v < 4; v++) acc[g][v] = _mm512_setzero_ps ();
            for (size_t j = 0; j < n; j++) {
                const uint8_t *row = b + ((size_t) slots[j] * stride + i0) * esz;
                __m512 r[4];
                S_UNROLL for (int v = 0; v < 4; v++) r[v] = s_loadw (dtype, row + (size_t) v * 16 * esz, m[v]);
                S_UNROLL for (int g = 0; g < 4; g++) {
                    if ((size_t) g >= G) break;
                    const __m512 pj = _mm512_set1_ps (p[(g0 + (size_t) g) * ldp + j]);
                    S_UNROLL for (int v = 0; v < 4; v++) acc[g][v] = _mm512_fmadd_ps (pj, r[v], acc[g][v]);
                }
            }
            S_UNROLL for (int g = 0; g < 4; g++) {
                if ((size_t) g >= G) break;
                S_UNROLL for (int v = 0; v < 4; v++)
                    _mm512_mask_storeu_ps (o + (g0 + (size_t) g) * ldo + i0 + (size_t) v * 16, m[v], acc[g][v]);
            }
        }
    }
}

/* e^x for x <= 0 (softmax arguments), Cephes' expf polynomial: a few ulp
 * off libm's, underflows to 0 below -87. */
S_INLINE __m512 s_exp_neg (__m512 x)
{
    x = _mm512_max_ps (x, _mm512_set1_ps (-88.f));
    const __m512 n = _mm512_roundscale_ps (_mm512_mul_ps (x, _mm512_set1_ps (1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps (n, _mm512_set1_ps (0.693359375f), x);
    r = _mm512_fnmadd_ps (n, _mm512_set1_ps (-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps (1.9875691500e-4f);
    p = _mm512_fmadd_ps (p, r, _mm512_set1_ps (1.3981999507e-3f));
    p = _mm512_fmadd_ps (p, r, _mm512_set1_ps (8.3334519073e-3f));
    p = _mm512_fmadd_ps (p, r, _mm512_set1_ps (4.1665795894e-2f));
    p = _mm512_fmadd_ps (p, r, _mm512_set1_ps (1.6666665459e-1f));
    p = _mm512_fmadd_ps (p, r, _mm512_set1_ps (5.0000001201e-1f));
    p = _mm512_fmadd_ps (p, _mm512_mul_ps (r, r), _mm512_add_ps (r, _mm512_set1_ps (1.f)));
    return _mm512_scalef_ps (p, n);
}

static void s_softmax (float *sc, size_t n, float scale)
{
    const __m512 vs = _mm512_set1_ps (scale);
    __m512 mx = _mm512_set1_ps (-INFINITY);
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 v = _mm512_mul_ps (_mm512_loadu_ps (sc + j), vs);
        _mm512_storeu_ps (sc + j, v);
        mx = _mm512_max_ps (mx, v);
    }
    if (j < n) {
        const __mmask16 m = S_TAILMASK ((int) (n - j));
        const __m512 v = _mm512_mul_ps (_mm512_maskz_loadu_ps (m, sc + j), vs);
        _mm512_mask_storeu_ps (sc + j, m, v);
        mx = _mm512_mask_max_ps (mx, m, mx, v);
    }
    const __m512 vmax = _mm512_set1_ps (_mm512_reduce_max_ps (mx));
    __m512 sum = _mm512_setzero_ps ();
    for (j = 0; j + 16 <= n; j += 16) {
        const __m512 e = s_exp_neg (_mm512_sub_ps (_mm512_loadu_ps (sc + j), vmax));
        _mm512_storeu_ps (sc + j, e);
        sum = _mm512_add_ps (sum, e);
    }
    if (j < n) {
        const __mmask16 m = S_TAILMASK ((int) (n - j));
        const __m512 e = s_exp_neg (_mm512_sub_ps (_mm512_maskz_loadu_ps (m, sc + j), vmax));
        _mm512_mask_storeu_ps (sc + j, m, e);
        sum = _mm512_add_ps (sum, _mm512_maskz_mov_ps (m, e));
    }
    const __m512 inv = _mm512_set1_ps (1.f / _mm512_reduce_add_ps (sum));
    for (j = 0; j + 16 <= n; j += 16) _mm512_storeu_ps (sc + j, _mm512_mul_ps (_mm512_loadu_ps (sc + j), inv));
    if (j < n) {
        const __mmask16 m = S_TAILMASK ((int) (n - j));
        _mm512_mask_storeu_ps (sc + j, m, _mm512_mul_ps (_mm512_maskz_loadu_ps (m, sc + j), inv));
    }
}

static void s_mm (const struct rx_mm_job *j, size_t r0, size_t r1)
{
    if (j->pack && s_gemm_type (j->dtype) && j->n >= S_GEMM_MIN_N) {
        s_mm_gemm (j, r0, r1);
        return;
    }
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
    .mm_pack_bytes = s_mm_pack_bytes,
    .mm_pack_rows = S_GNR,
    .repack_row_bytes = s_repack_row_bytes,
    .repack = s_repack,
    .repacked_row = s_repacked_row,
    .dot_f32 = s_vdot_f32,
    .dot_f16 = s_vdot_f16,
    .axpy_f32 = s_axpy_f32,
    .axpy_f16 = s_axpy_f16,
    .attn_scores = s_attn_scores,
    .attn_wsum = s_attn_wsum,
    .softmax = s_softmax,
};
#endif
