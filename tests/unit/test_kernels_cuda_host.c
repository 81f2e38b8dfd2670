/* tests/unit/test_kernels_cuda_host.c -- the CUDA backend's host-side parts,
 * tested without a GPU:
 *   cu_math:  the block decoders and fp16/bf16 conversions the kernels run
 *             (kernels/cuda/cu_math.h compiled as C) against core/quant.c's
 *             reference dequantizer; the RoPE/YaRN factors against the CPU
 *             backend's rope op (kernels-cpu.so through the loader);
 *   cumem:    the device memory pool's chunking, splitting, merging, with a
 *             malloc-backed chunk allocator and injected failures;
 *   cugraphs: capture state, LRU bound, replacement, invalidation;
 *   cuplan:   matvec vs GEMM dispatch, slices, scratch sizes, launch dims;
 *   kcuda:    kernels-cuda.so through the real loader (when built): its
 *             descriptor and ops table, and create() failing with
 *             RX_EDEVICE and one line when there is no GPU. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <radix/kernel.h>
#include <radix/plugin.h>

#include "cu_math.h"
#include "graphs.h"
#include "isa.h"
#include "loader.h"
#include "mempool.h"
#include "plan.h"
#include "prof.h"
#include "quant.h"
#include "../testutil.h"

static uint64_t s_rng = 0x2545F4914F6CDD1Dull;

static float s_unif (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (float) ((s_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

/* ------------------------------------------------------------- cu_math -- */

TestSuite (cu_math);

Test (cu_math, dtype_values_match_radix)
{
    /* cu_math.h repeats enum rx_dtype so nvcc needs no radix header. */
    cr_assert_eq (RX_CU_F32, RX_F32);
    cr_assert_eq (RX_CU_F16, RX_F16);
    cr_assert_eq (RX_CU_BF16, RX_BF16);
    cr_assert_eq (RX_CU_Q8_0, RX_Q8_0);
    cr_assert_eq (RX_CU_Q4_0, RX_Q4_0);
    cr_assert_eq (RX_CU_Q4_1, RX_Q4_1);
    cr_assert_eq (RX_CU_Q4_K, RX_Q4_K);
    cr_assert_eq (RX_CU_Q5_K, RX_Q5_K);
    cr_assert_eq (RX_CU_Q6_K, RX_Q6_K);
    const int ts[] = { RX_F32, RX_F16, RX_BF16, RX_Q8_0, RX_Q4_0, RX_Q4_1, RX_Q4_K, RX_Q5_K, RX_Q6_K };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        cr_assert_eq ((size_t) rx_cu_blk_elems (ts[i]), rx_dtype_block (ts[i]), "dtype %d", ts[i]);
        cr_assert_eq (rx_cu_row_bytes (ts[i], 512), rx_dtype_row_bytes (ts[i], 512), "dtype %d", ts[i]);
    }
    cr_assert_eq (rx_cu_blk_elems (RX_Q8_K), 0, "Q8_K is an activation format, not a weight");
    cr_assert_eq (rx_cu_row_bytes (RX_Q4_K, 200), 0);
}

Test (cu_math, half_and_bfloat_decode_every_value)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = rx_cu_h2f ((uint16_t) h), b = rx_fp16_to_fp32 ((uint16_t) h);
        if (isnan (b)) cr_assert (isnan (a), "h %04x", h);
        else cr_assert (a == b && signbit (a) == signbit (b), "h %04x: %g vs %g", h, a, b);
        a = rx_cu_bf2f ((uint16_t) h);
        b = rx_bf16_to_fp32 ((uint16_t) h);
        if (isnan (b)) cr_assert (isnan (a), "bf %04x", h);
        else cr_assert (a == b, "bf %04x: %g vs %g", h, a, b);
    }
}

/* Quantize random rows with the reference quantizer, then decode every
 * 32-element chunk with the kernels' decoder: bit-identical to core's
 * reference dequantizer. */
Test (cu_math, block_decoders_match_reference)
{
    const int ts[] = { RX_F32, RX_F16, RX_BF16, RX_Q8_0, RX_Q4_0, RX_Q4_1, RX_Q4_K, RX_Q5_K, RX_Q6_K };
    const size_t n = 1024;
    float *x = malloc (n * sizeof *x), *ref = malloc (n * sizeof *ref);
    uint8_t *q = malloc (rx_dtype_row_bytes (RX_F32, n));
    for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++) {
        for (int rep = 0; rep < 4; rep++) {
            for (size_t i = 0; i < n; i++) x[i] = s_unif () * (rep == 3 ? 1e-3f : 3.f) + (rep == 2 ? 0.7f : 0.f);
            size_t nb = rx_quantize_row (ts[t], x, q, n);
            cr_assert_eq (nb, rx_dtype_row_bytes (ts[t], n), "dtype %d", ts[t]);
            cr_assert_eq (rx_dequantize_row (ts[t], q, ref, n), RX_OK);
            for (size_t c = 0; c < n / 32; c++) {
                float got[32];
                rx_cu_deq32 (ts[t], q, c, got);
                for (int j = 0; j < 32; j++)
                    cr_assert (got[j] == ref[c * 32 + j], "%s chunk %zu elem %d: %.9g vs ref %.9g",
                               rx_dtype_name (ts[t]), c, j, got[j], ref[c * 32 + j]);
            }
        }
    }
    float z[32];
    rx_cu_deq32 (RX_Q8_K, q, 0, z);   /* an unknown type decodes to zeros, never reads */
    for (int j = 0; j < 32; j++) cr_assert_eq (z[j], 0.f);
    free (x);
    free (ref);
    free (q);
}

/* Float -> half/bfloat encoders, on a spread of bit patterns (normals,
 * subnormals, ties, overflow, inf, NaN): bit-identical to core/quant.c. */
Test (cu_math, half_and_bfloat_encode_match_core)
{
    for (uint64_t u = 0; u < 0x100000000ull; u += 65521) {
        for (uint32_t k = 0; k < 3; k++) {
            uint32_t b = (uint32_t) u ^ (k == 1 ? 0x1000u : k == 2 ? 0x8000u : 0u);
            float f;
            memcpy (&f, &b, sizeof f);
            cr_assert_eq (rx_cu_f2h (f), rx_fp32_to_fp16 (f), "f16 of %08x", b);
            cr_assert_eq (rx_cu_f2bf (f), rx_fp32_to_bf16 (f), "bf16 of %08x", b);
        }
    }
    /* exact ties to even, the largest finite half, rounding up to inf */
    const float v[] = { 1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 65504.f, 65519.f, 65520.f, 0x1p-25f,
                        3 * 0x1p-26f, -0.f, INFINITY, -INFINITY, NAN };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        cr_assert_eq (rx_cu_f2h (v[i]), rx_fp32_to_fp16 (v[i]), "f16 of %g", v[i]);
        cr_assert_eq (rx_cu_f2bf (v[i]), rx_fp32_to_bf16 (v[i]), "bf16 of %g", v[i]);
    }
    cr_assert_eq (rx_cu_f2h (1.f + 0x1p-11f), 0x3c00, "tie rounds to even (down)");
    cr_assert_eq (rx_cu_f2h (1.f + 3 * 0x1p-11f), 0x3c02, "tie rounds to even (up)");
}

/* The split the GEMM path feeds cuBLAS: part 0 is the plain conversion and
 * the parts together carry the activation to ~22 (F16 x 2) / 24 (BF16 x 3)
 * bits, including tiny values whose residual would be an F16 subnormal. */
Test (cu_math, split_half_keeps_f32_precision)
{
    const float mags[] = { 3.f, 1e-3f, 1e-5f, 200.f };
    for (size_t m = 0; m < sizeof mags / sizeof mags[0]; m++) {
        double worst16 = 0, worst_bf = 0, plain16 = 0;
        for (int i = 0; i < 4096; i++) {
            const float x = s_unif () * mags[m];
            if (x == 0.f) continue;
            uint16_t h[3];
            rx_cu_split_half (x, 0, 2, 2048.f, h);
            cr_assert_eq (h[0], rx_fp32_to_fp16 (x), "part 0 is round(x)");
            const double s16 = (double) rx_fp16_to_fp32 (h[0]) + (double) rx_fp16_to_fp32 (h[1]) / 2048.0;
            rx_cu_split_half (x, 1, 3, 256.f, h);
            cr_assert_eq (h[0], rx_fp32_to_bf16 (x));
            const double sbf = (double) rx_bf16_to_fp32 (h[0]) + (double) rx_bf16_to_fp32 (h[1]) / 256.0 +
                               (double) rx_bf16_to_fp32 (h[2]) / 65536.0;
            const double ax = fabs ((double) x);
            /* below 2^-14 part 0 is an F16 subnormal (spacing 2^-24): the
             * scaled lo part still resolves 2^-25 / 2^11 = 2^-36 */
            worst16 = fmax (worst16, fabs (s16 - x) / fmax (ax, 0x1p-15));
            worst_bf = fmax (worst_bf, fabs (sbf - x) / ax);
            plain16 = fmax (plain16, fabs ((double) rx_fp16_to_fp32 (rx_fp32_to_fp16 (x)) - x) / ax);
        }
        cr_assert (plain16 > 0x1p-13, "mag %g: one F16 loses precision (%g)", mags[m], plain16);
        cr_assert (worst16 <= 0x1p-21, "mag %g: f16 hi+lo relative error %g", mags[m], worst16);
        cr_assert (worst_bf <= 0x1p-23, "mag %g: bf16 x3 relative error %g", mags[m], worst_bf);
    }
}

/* The activation quantizers the CUDA matmul applies before quantized
 * weights, against the CPU backend's own: rx_kisa_q8a_quant (Q8_0/Q4_0/
 * Q4_1 weights) and core/quant.c's Q8_K (K-quants), bit for bit. */
Test (cu_math, act_quant_matches_cpu_backend)
{
    cr_assert_eq (rx_cu_act_qblk (RX_Q8_0), 32);
    cr_assert_eq (rx_cu_act_qblk (RX_Q4_0), 32);
    cr_assert_eq (rx_cu_act_qblk (RX_Q4_1), 32);
    cr_assert_eq (rx_cu_act_qblk (RX_Q4_K), 256);
    cr_assert_eq (rx_cu_act_qblk (RX_Q5_K), 256);
    cr_assert_eq (rx_cu_act_qblk (RX_Q6_K), 256);
    cr_assert_eq (rx_cu_act_qblk (RX_F32) + rx_cu_act_qblk (RX_F16) + rx_cu_act_qblk (RX_BF16), 0);
    const size_t n = 1024;
    float x[1024], got[1024], ref[1024];
    rx_q8a qa[1024 / 32];
    rx_block_q8_K qk[1024 / 256];
    for (int rep = 0; rep < 8; rep++) {
        for (size_t i = 0; i < n; i++) {
            switch (rep) {
            case 0: x[i] = s_unif () * 3.f; break;
            case 1: x[i] = s_unif () * 1e-6f; break;              /* fp16 d subnormal */
            case 2:   /* amax 127 -> id 1: x * id = k + 0.5, ties to even */
                x[i] = i % 32 == 0 ? 127.f : (float) ((int) (i % 253) - 126) + 0.5f;
                break;
            case 3: x[i] = i % 64 < 32 ? 0.f : s_unif (); break;    /* zero blocks */
            case 4: x[i] = s_unif () + (i % 256 == 7 ? 50.f : 0.f); break;  /* positive max */
            case 5: x[i] = s_unif () - (i % 256 == 9 ? 50.f : 0.f); break;  /* negative max */
            case 6: x[i] = s_unif () * 3e4f; break;
            default: x[i] = (float) (i % 7) - 3.f; break;
            }
        }
        rx_kisa_q8a_quant (x, qa, n / 32);
        for (size_t b = 0; b < n / 32; b++)
            for (int j = 0; j < 32; j++) ref[b * 32 + j] = (float) qa[b].q[j] * qa[b].d;
        for (size_t b = 0; b < n / 32; b++) rx_cu_q8a_qdq32 (x + b * 32, got + b * 32);
        for (size_t i = 0; i < n; i++)
            cr_assert (memcmp (&got[i], &ref[i], sizeof (float)) == 0,
                       "rep %d q8a elem %zu (x %.9g): %.9g vs cpu %.9g", rep, i, x[i], got[i], ref[i]);
        cr_assert_eq (rx_quantize_row (RX_Q8_K, x, qk, n), sizeof qk);
        cr_assert_eq (rx_dequantize_row (RX_Q8_K, qk, ref, n), RX_OK);
        memcpy (got, x, sizeof x);
        for (size_t b = 0; b < n / 256; b++) rx_cu_q8k_qdq256 (got + b * 256, got + b * 256); /* in place */
        for (size_t i = 0; i < n; i++)
            cr_assert (memcmp (&got[i], &ref[i], sizeof (float)) == 0,
                       "rep %d q8k elem %zu (x %.9g): %.9g vs core %.9g", rep, i, x[i], got[i], ref[i]);
    }
    /* Not the identity: the activation really is rounded to 8 bits. */
    float y[32], z[32];
    for (int j = 0; j < 32; j++) y[j] = 1.f + (float) j / 1000.f;
    rx_cu_q8a_qdq32 (y, z);
    cr_assert (z[1] != y[1] && fabsf (z[1] - y[1]) <= 1.031f / 127 / 2 * 1.001f, "%.9g vs %.9g", z[1], y[1]);
}

Test (cu_math, rope_corr_dims_and_ramp)
{
    /* Llama-style YaRN: n_rot 128, n_ctx_orig 4096, base 10000, beta 32/1. */
    float d[2];
    rx_cu_rope_corr_dims (128, 4096, 10000.f, 32.f, 1.f, d);
    /* Hand-computed: floor(128 ln(4096/(64 pi)) / (2 ln 1e4)) = floor(20.94) = 20,
     * ceil(128 ln(4096/(2 pi)) / (2 ln 1e4)) = ceil(45.03) = 46. */
    cr_assert_float_eq (d[0], 20.f, 0.f);
    cr_assert_float_eq (d[1], 46.f, 0.f);
    rx_cu_rope_corr_dims (8, 16, 10000.f, 32.f, 1.f, d);
    cr_assert_float_eq (d[0], 0.f, 0.f, "clamped at 0");
    cr_assert (d[1] <= 7.f, "clamped at n_dims - 1: %g", d[1]);
    cr_assert_float_eq (rx_cu_yarn_ramp (20.f, 46.f, 0), 1.f, 0.f);
    cr_assert_float_eq (rx_cu_yarn_ramp (20.f, 46.f, 2 * 46), 0.f, 0.f);
    cr_assert_float_eq (rx_cu_yarn_ramp (20.f, 46.f, 2 * 33), 0.5f, 1e-6f);
    /* Plain RoPE: no scaling, cos/sin of pos * base^(-i0/n_rot). */
    const float corr[2] = { 0, 0 };
    float c, s;
    rx_cu_rope_cs (7.f, 4, powf (10000.f, -2.f / 64.f), 1.f, 1.f, 0.f, 1.f, corr, &c, &s);
    const double th = 7.0 * pow (10000.0, -4.0 / 64.0);
    cr_assert_float_eq (c, cos (th), 1e-5);
    cr_assert_float_eq (s, sin (th), 1e-5);
    /* YaRN magnitude scale: attn_factor * (1 + 0.1 ln(1/freq_scale)). */
    rx_cu_rope_cs (0.f, 0, 0.5f, 1.f, 0.25f, 1.f, 2.f, corr, &c, &s);
    cr_assert_float_eq (c, 2.0 * (1.0 + 0.1 * log (4.0)), 1e-5);
}

/* The CPU backend, for reference results of ops whose math is shared. */
static rx_loader_t *s_loader;

static const struct rx_kernels_ops *s_cpu (void **be)
{
    struct rx_err err = { 0 };
    s_loader = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (s_loader, "%s", err.msg);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (s_loader, RX_KIND_KERNELS, "cpu", &p, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (p, NULL, &err), RX_OK, "%s", err.msg);
    const struct rx_kernels_ops *K = rx_plugin_ops (p);
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
    cr_assert_eq (K->create (rx_plugin_host (p), &kp, be, &err), RX_OK, "%s", err.msg);
    return K;
}

/* The device rope kernel's per-element math (k_rope in kernels.cu), run on
 * the host, against kernels-cpu's rope: normal and NeoX, YaRN on and off,
 * with freq factors. */
Test (cu_math, rope_matches_cpu_backend)
{
    void *be = NULL;
    const struct rx_kernels_ops *K = s_cpu (&be);
    const int n_tok = 5, n_head = 3, hd = 64;
    float ff[32];
    for (int i = 0; i < 32; i++) ff[i] = 1.f + (float) i / 8.f;
    struct { int mode, n_rot; float fs, ext, af; const float *ff; } cs[] = {
        { RX_ROPE_NORMAL, 64, 1.f, 0.f, 1.f, NULL }, { RX_ROPE_NEOX, 64, 1.f, 0.f, 1.f, NULL },
        { RX_ROPE_NEOX, 32, 0.25f, 1.f, 1.f, NULL }, { RX_ROPE_NORMAL, 64, 0.125f, 1.f, 0.9f, ff },
    };
    int32_t pos[5] = { 0, 1, 17, 4095, 30000 };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        float *x = malloc (sizeof (float) * n_tok * n_head * hd), *ref = malloc (sizeof (float) * n_tok * n_head * hd);
        for (int i = 0; i < n_tok * n_head * hd; i++) x[i] = ref[i] = s_unif ();
        struct rx_rope_params rp = { .struct_size = sizeof rp, .mode = cs[ci].mode, .n_rot = cs[ci].n_rot,
                                     .n_ctx_orig = 4096, .freq_base = 10000.f, .freq_scale = cs[ci].fs,
                                     .ext_factor = cs[ci].ext, .attn_factor = cs[ci].af,
                                     .beta_fast = 32.f, .beta_slow = 1.f, .freq_factors = cs[ci].ff };
        struct rx_err err = { 0 };
        cr_assert_eq (K->rope (be, NULL, ref, (size_t) n_head * hd, n_tok, n_head, hd, pos, &rp, &err),
                      RX_OK, "%s", err.msg);
        float corr[2];
        rx_cu_rope_corr_dims (rp.n_rot, rp.n_ctx_orig, rp.freq_base, rp.beta_fast, rp.beta_slow, corr);
        const float theta_scale = powf (rp.freq_base, -2.f / (float) rp.n_rot);
        const int half = rp.n_rot / 2;
        for (int t = 0; t < n_tok; t++)
            for (int h = 0; h < n_head; h++)
                for (int i = 0; i < half; i++) {
                    float c, s;
                    rx_cu_rope_cs ((float) pos[t], 2 * i, theta_scale, rp.freq_factors ? ff[i] : 1.f,
                                   rp.freq_scale, rp.ext_factor, rp.attn_factor, corr, &c, &s);
                    float *xh = x + ((size_t) t * n_head + h) * hd;
                    const int a = rp.mode == RX_ROPE_NEOX ? i : 2 * i;
                    const int b = rp.mode == RX_ROPE_NEOX ? i + half : 2 * i + 1;
                    const float x0 = xh[a], x1 = xh[b];
                    xh[a] = x0 * c - x1 * s;
                    xh[b] = x0 * s + x1 * c;
                }
        for (int i = 0; i < n_tok * n_head * hd; i++) {
            /* Same theta recurrence, same roundings: on the host (same libm,
             * and no fma contraction in either file: baseline x86-64) the
             * device math equals the CPU's exactly. */
            cr_assert (x[i] == ref[i], "case %zu elem %d: %.9g vs cpu %.9g", ci, i, x[i], ref[i]);
        }
        free (x);
        free (ref);
    }
    K->destroy (be);
    rx_loader_destroy (&s_loader);
}

/* --------------------------------------------------------------- cumem -- */

struct fake_dev {
    int n_alloc, n_free, live, fail_next;
    size_t last_bytes;
};

static int fake_alloc (void *ctx, size_t bytes, void **base, struct rx_err *err)
{
    struct fake_dev *f = ctx;
    if (f->fail_next) {
        f->fail_next = 0;
        return rx_err_set (err, RX_ENOMEM, "fake cudaMalloc (%zu bytes): out of memory", bytes);
    }
    *base = aligned_alloc (4096, bytes);
    cr_assert_not_null (*base);
    f->n_alloc++;
    f->live++;
    f->last_bytes = bytes;
    return RX_OK;
}

static void fake_free (void *ctx, void *base)
{
    struct fake_dev *f = ctx;
    f->n_free++;
    f->live--;
    free (base);
}

TestSuite (cumem);

Test (cumem, config_defaults_and_errors)
{
    struct rx_cumem_cfg c;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cumem_cfg_resolve (NULL, &c, &err), RX_OK);
    cr_assert_eq (c.chunk_bytes, 64u << 20);
    cr_assert_eq (c.big_bytes, 32u << 20);
    cr_assert_eq (c.round_bytes, 2u << 20);
    cr_assert_eq (c.min_align, 256u);
    struct rx_cumem_cfg bad = { .chunk_bytes = 1 << 20, .min_align = 384 };
    cr_assert_eq (rx_cumem_cfg_resolve (&bad, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "powers of two"), "%s", err.msg);
    bad = (struct rx_cumem_cfg) { .chunk_bytes = 1 << 20, .big_bytes = 2 << 20 };
    cr_assert_eq (rx_cumem_cfg_resolve (&bad, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "big_bytes"), "%s", err.msg);
    cr_assert_null (rx_cumem_new (NULL, NULL, fake_free, NULL, &err));
    cr_assert (strstr (err.msg, "callbacks"), "%s", err.msg);
}

Test (cumem, chunk_sizing)
{
    struct rx_cumem_cfg c;
    cr_assert_eq (rx_cumem_cfg_resolve (NULL, &c, NULL), RX_OK);
    cr_assert_eq (rx_cumem_chunk_for (&c, 1, 0), 64u << 20, "small -> shared chunk");
    cr_assert_eq (rx_cumem_chunk_for (&c, 32u << 20, 0), 64u << 20, "exactly big_bytes is small");
    cr_assert_eq (rx_cumem_chunk_for (&c, (32u << 20) + 1, 0), 34u << 20, "big -> own chunk, 2 MiB rounded");
    cr_assert_eq (rx_cumem_chunk_for (&c, 100u << 20, 0), 100u << 20);
    cr_assert_eq (rx_cumem_chunk_for (&c, (100u << 20) - 256, 1u << 20), 102u << 20,
                  "alignment pad counts");
}

Test (cumem, split_merge_and_reuse)
{
    struct fake_dev f = { 0 };
    struct rx_cumem_cfg cfg = { .chunk_bytes = 1 << 20 };
    struct rx_err err = { 0 };
    rx_cumem_t *m = rx_cumem_new (&cfg, fake_alloc, fake_free, &f, &err);
    cr_assert_not_null (m, "%s", err.msg);
    void *a, *b, *c;
    cr_assert_eq (rx_cumem_alloc (m, 1000, 0, &a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_cumem_alloc (m, 3000, 0, &b, &err), RX_OK);
    cr_assert_eq (rx_cumem_alloc (m, 1, 4096, &c, &err), RX_OK);
    cr_assert_eq (f.n_alloc, 1, "three small blocks share one chunk");
    cr_assert_eq (f.last_bytes, 1u << 20);
    cr_assert_eq ((uintptr_t) a % 256, 0);
    cr_assert_eq ((uintptr_t) b, (uintptr_t) a + 1024, "first fit, rounded to 256");
    cr_assert_eq ((uintptr_t) c % 4096, 0);
    cr_assert (rx_cumem_contains (m, (char *) b + 100, 2000));
    cr_assert_not (rx_cumem_contains (m, (char *) b + 100, 3000), "runs past the block");
    struct rx_cumem_stats st;
    rx_cumem_stats (m, &st);
    cr_assert_eq (st.n_blocks, 3);
    cr_assert_eq (st.in_use, 1024 + 3072 + 256);
    cr_assert_eq (st.reserved, 1u << 20);
    /* Free the middle one, then the first: they merge into one hole that a
     * 4000-byte request fits exactly. */
    cr_assert_eq (rx_cumem_free (m, b), RX_OK);
    cr_assert_eq (rx_cumem_free (m, b), RX_ENOENT, "double free is refused");
    cr_assert_eq (rx_cumem_free (m, a), RX_OK);
    void *d;
    cr_assert_eq (rx_cumem_alloc (m, 4000, 0, &d, &err), RX_OK);
    cr_assert_eq (d, a, "merged hole reused");
    cr_assert_eq (rx_cumem_free (m, (char *) d + 256), RX_ENOENT, "not a block start");
    int stack;
    cr_assert_eq (rx_cumem_free (m, &stack), RX_ENOENT, "foreign pointer");
    cr_assert_eq (rx_cumem_free (m, d), RX_OK);
    cr_assert_eq (rx_cumem_free (m, c), RX_OK);
    rx_cumem_stats (m, &st);
    cr_assert_eq (st.n_blocks, 0);
    cr_assert_eq (st.n_free_blocks, 1, "everything merged back into one free block");
    cr_assert_eq (f.live, 1, "shared chunks stay reserved");
    cr_assert_eq (rx_cumem_trim (m), 1);
    cr_assert_eq (f.live, 0);
    rx_cumem_destroy (&m);
    cr_assert_null (m);
    cr_assert_eq (f.n_free, f.n_alloc);
}

Test (cumem, big_requests_get_own_chunks_returned_on_free)
{
    struct fake_dev f = { 0 };
    struct rx_cumem_cfg cfg = { .chunk_bytes = 1 << 20, .round_bytes = 1 << 16 };
    struct rx_err err = { 0 };
    rx_cumem_t *m = rx_cumem_new (&cfg, fake_alloc, fake_free, &f, &err);
    void *w, *s;
    cr_assert_eq (rx_cumem_alloc (m, 3u << 20, 0, &w, &err), RX_OK);
    cr_assert_eq (f.last_bytes, 3u << 20);
    cr_assert_eq (rx_cumem_alloc (m, 100, 0, &s, &err), RX_OK);
    cr_assert_eq (f.n_alloc, 2, "a small block never lands in a dedicated chunk");
    cr_assert_eq (rx_cumem_free (m, w), RX_OK);
    cr_assert_eq (f.live, 1, "the dedicated chunk went back at once");
    /* An exhausted shared chunk makes a second one. */
    void *p[5];
    for (int i = 0; i < 5; i++) cr_assert_eq (rx_cumem_alloc (m, 400u << 10, 0, &p[i], &err), RX_OK);
    struct rx_cumem_stats st;
    rx_cumem_stats (m, &st);
    cr_assert_eq (st.n_chunks, 3, "1 MiB chunks hold two 400 KiB blocks each");
    rx_cumem_destroy (&m);   /* blocks still in use: their chunks go back too */
    cr_assert_eq (f.live, 0);
}

Test (cumem, device_failure_is_reported_and_nothing_leaks)
{
    struct fake_dev f = { 0 };
    struct rx_err err = { 0 };
    rx_cumem_t *m = rx_cumem_new (NULL, fake_alloc, fake_free, &f, &err);
    void *p = (void *) 1;
    f.fail_next = 1;
    cr_assert_eq (rx_cumem_alloc (m, 10, 0, &p, &err), RX_ENOMEM);
    cr_assert_null (p);
    cr_assert (strstr (err.msg, "fake cudaMalloc"), "%s", err.msg);
    cr_assert_eq (rx_cumem_alloc (m, 10, 3, &p, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "align 3"), "%s", err.msg);
    cr_assert_eq (rx_cumem_alloc (m, 10, 4u << 20, &p, &err), RX_EINVAL);
    cr_assert_eq (rx_cumem_alloc (m, SIZE_MAX - 4, 0, &p, &err), RX_ENOMEM);
    cr_assert (strstr (err.msg, "too large"), "%s", err.msg);
    cr_assert_eq (rx_cumem_alloc (m, 0, 0, &p, &err), RX_OK, "0 bytes is one block");
    cr_assert_not_null (p);
    rx_cumem_destroy (&m);
    cr_assert_eq (f.live, 0);
    rx_cumem_destroy (&m);   /* NULL: no-op */
}

/* ------------------------------------------------------------ cugraphs -- */

static int s_freed[64], s_nfreed;

static void fake_graph_free (void *ctx, void *exec)
{
    (void) ctx;
    cr_assert_lt (s_nfreed, 64);
    s_freed[s_nfreed++] = (int) (intptr_t) exec;
}

TestSuite (cugraphs, .init = NULL);

Test (cugraphs, capture_state_machine)
{
    s_nfreed = 0;
    struct rx_err err = { 0 };
    cr_assert_null (rx_cugraphs_new (0, fake_graph_free, NULL, &err));
    cr_assert (strstr (err.msg, "capacity 0"), "%s", err.msg);
    rx_cugraphs_t *g = rx_cugraphs_new (4, fake_graph_free, NULL, &err);
    cr_assert_not_null (g);
    cr_assert_eq (rx_cugraphs_end (g, 1, (void *) 11, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "no capture in progress"), "%s", err.msg);
    cr_assert_eq (s_nfreed, 1, "a refused exec is freed, not leaked");
    cr_assert_eq (s_freed[0], 11);
    uint64_t k = 0;
    cr_assert_not (rx_cugraphs_capturing (g, &k));
    cr_assert_eq (rx_cugraphs_begin (g, 7, &err), RX_OK);
    cr_assert (rx_cugraphs_capturing (g, &k));
    cr_assert_eq (k, 7);
    cr_assert_eq (rx_cugraphs_begin (g, 8, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "graph 7 is still being captured"), "%s", err.msg);
    cr_assert_eq (rx_cugraphs_end (g, 8, (void *) 12, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "the capture in progress is graph 7"), "%s", err.msg);
    cr_assert_eq (rx_cugraphs_end (g, 7, (void *) 70, &err), RX_OK);
    cr_assert_not (rx_cugraphs_capturing (g, NULL));
    cr_assert (rx_cugraphs_has (g, 7));
    cr_assert_not (rx_cugraphs_has (g, 8));
    cr_assert_eq (rx_cugraphs_get (g, 7), (void *) 70);
    cr_assert_null (rx_cugraphs_get (g, 8));
    /* Recapture of the same key replaces (and frees) the old graph. */
    cr_assert_eq (rx_cugraphs_begin (g, 7, &err), RX_OK);
    cr_assert_eq (rx_cugraphs_end (g, 7, (void *) 71, &err), RX_OK);
    cr_assert_eq (rx_cugraphs_count (g), 1);
    cr_assert_eq (s_freed[s_nfreed - 1], 70);
    /* abort forgets a failed capture. */
    cr_assert_eq (rx_cugraphs_begin (g, 9, &err), RX_OK);
    rx_cugraphs_abort (g);
    cr_assert_eq (rx_cugraphs_begin (g, 9, &err), RX_OK);
    rx_cugraphs_abort (g);
    int before = s_nfreed;
    rx_cugraphs_destroy (&g);
    cr_assert_null (g);
    cr_assert_eq (s_nfreed, before + 1, "destroy frees the stored graph");
    cr_assert_eq (s_freed[s_nfreed - 1], 71);
}

Test (cugraphs, lru_eviction_drop_and_clear)
{
    s_nfreed = 0;
    struct rx_err err = { 0 };
    rx_cugraphs_t *g = rx_cugraphs_new (3, fake_graph_free, NULL, &err);
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq (rx_cugraphs_begin (g, (uint64_t) k, &err), RX_OK);
        cr_assert_eq (rx_cugraphs_end (g, (uint64_t) k, (void *) (intptr_t) (100 + k), &err), RX_OK);
    }
    cr_assert_not_null (rx_cugraphs_get (g, 1));   /* 1 used last: 2 is now the LRU */
    cr_assert (rx_cugraphs_has (g, 3));            /* has() does not count as use */
    cr_assert_eq (rx_cugraphs_begin (g, 4, &err), RX_OK);
    cr_assert_eq (rx_cugraphs_end (g, 4, (void *) 104, &err), RX_OK);
    cr_assert_eq (rx_cugraphs_count (g), 3);
    cr_assert_eq (rx_cugraphs_evictions (g), 1);
    cr_assert_eq (s_nfreed, 1);
    cr_assert_eq (s_freed[0], 102, "the least recently launched graph (2) was evicted");
    cr_assert_not (rx_cugraphs_has (g, 2));
    cr_assert (rx_cugraphs_has (g, 1) && rx_cugraphs_has (g, 3) && rx_cugraphs_has (g, 4));
    cr_assert_eq (rx_cugraphs_drop (g, 3), RX_OK);
    cr_assert_eq (rx_cugraphs_drop (g, 3), RX_ENOENT);
    cr_assert_eq (s_freed[1], 103);
    cr_assert_eq (rx_cugraphs_get (g, 4), (void *) 104, "drop kept the others");
    rx_cugraphs_clear (g);
    cr_assert_eq (rx_cugraphs_count (g), 0);
    cr_assert_eq (s_nfreed, 4);
    cr_assert_not (rx_cugraphs_has (g, 1));
    rx_cugraphs_destroy (&g);
    cr_assert_eq (s_nfreed, 4, "nothing freed twice");
}

/* -------------------------------------------------------------- cuplan -- */

TestSuite (cuplan);

Test (cuplan, matvec_for_small_batches)
{
    struct rx_cumm_plan p;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_matmul (RX_Q8_0, 1, 4096, 11008, 0, 0, 0, &p, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (p.path, RX_CUMM_MATVEC);
    cr_assert_eq (p.block_x, 32 * RX_CU_MV_WARPS);
    cr_assert_eq (p.grid_x, 11008 / RX_CU_MV_WARPS, "one warp per output row");
    cr_assert_eq (p.row_passes, 1);
    cr_assert_eq (p.w_scratch + p.x_scratch, 0, "matvec needs no conversion scratch");
    cr_assert_eq (p.act_qblk, 32, "Q8_0: activations quantized in blocks of 32, as on the CPU");
    cr_assert_eq (p.q_scratch, 4096 * 4);
    cr_assert_eq (rx_cuplan_matmul (RX_Q4_K, 4, 4096, 4097, 0, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.path, RX_CUMM_MATVEC, "default threshold is 4 rows");
    cr_assert_eq (p.grid_x, (4097 + RX_CU_MV_WARPS - 1) / RX_CU_MV_WARPS);
    cr_assert_eq (rx_cuplan_matmul (RX_Q4_K, 5, 4096, 4096, 0, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.path, RX_CUMM_GEMM);
    cr_assert_eq (rx_cuplan_matmul (RX_BF16, 20, 256, 256, 32, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.path, RX_CUMM_MATVEC, "threshold from [kernels.cuda] matvec_max_rows");
    cr_assert_eq (p.row_passes, 3, "20 rows in passes of %d", RX_CU_MV_MAX_ROWS);
}

Test (cuplan, gemm_types_scratch_and_slices)
{
    struct rx_cumm_plan p;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_matmul (RX_F32, 64, 512, 1024, 0, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.path, RX_CUMM_GEMM);
    cr_assert_eq (p.gtype, RX_CUMM_G_F32);
    cr_assert_eq (p.convert_x + p.dequant_w, 0);
    cr_assert_eq (p.x_scratch + p.w_scratch + p.q_scratch, 0, "f32 multiplies in place");
    cr_assert_eq (p.act_qblk, 0);
    cr_assert_eq (rx_cuplan_matmul (RX_BF16, 64, 512, 1024, 0, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.gtype, RX_CUMM_G_BF16);
    cr_assert (p.convert_x && !p.dequant_w);
    cr_assert_eq (p.x_parts, 3, "bf16: 3 parts carry an F32 activation");
    cr_assert_eq (p.x_scratch, 3 * 64 * 512 * 2);
    cr_assert_eq (p.q_scratch, 0, "float weights: F32 activations, as on the CPU");
    cr_assert_eq (p.w_scratch, 0);
    cr_assert_eq (p.out_slice, 1024);
    cr_assert_eq (rx_cuplan_matmul (RX_F16, 64, 512, 1024, 0, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.gtype, RX_CUMM_G_F16);
    cr_assert_eq (p.x_parts, 2, "f16: hi + lo parts");
    cr_assert_float_eq (p.x_part_scale, 2048.f, 0.f);
    cr_assert_eq (p.x_scratch, 2 * 64 * 512 * 2);
    /* Quantized: W dequantized to F32 (exact) in slices bounded by
     * slice_bytes, then an F32 GEMM on the quantized-dequantized X. */
    cr_assert_eq (rx_cuplan_matmul (RX_Q6_K, 512, 4096, 128256, 0, 64u << 20, 0, &p, &err), RX_OK);
    cr_assert_eq (p.gtype, RX_CUMM_G_F32);
    cr_assert (!p.convert_x && p.dequant_w);
    cr_assert_eq (p.act_qblk, 256, "K-quants: Q8_K activations");
    cr_assert_eq (p.q_scratch, 512 * 4096 * 4);
    cr_assert_eq (p.x_scratch, 0);
    cr_assert_eq (p.out_slice, (64u << 20) / (4096 * 4) / 64 * 64);
    cr_assert_eq (p.out_slice % 64, 0);
    cr_assert_eq (p.w_scratch, p.out_slice * 4096 * 4);
    cr_assert_leq (p.w_scratch, 64u << 20);
    cr_assert_eq (rx_cuplan_matmul (RX_Q8_0, 16, 256, 100, 0, 64u << 20, 0, &p, &err), RX_OK);
    cr_assert_eq (p.out_slice, 100, "small weights in one slice");
    cr_assert_eq (p.w_scratch, 100 * 256 * 4);
    cr_assert_eq (rx_cuplan_matmul (RX_Q8_0, 16, 1 << 20, 1000, 0, 1024, 0, &p, &err), RX_OK);
    cr_assert_eq (p.out_slice, 64, "never less than one 64-row tile");
}

Test (cuplan, half_gemms_are_one_tensor_core_pass)
{
    struct rx_cumm_plan p;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_matmul (RX_BF16, 512, 2048, 8192, 0, 0, RX_CUPLAN_HALF_GEMM, &p, &err), RX_OK);
    cr_assert_eq (p.gtype, RX_CUMM_G_BF16);
    cr_assert_eq (p.x_parts, 1, "one pass, X rounded to bf16");
    cr_assert_eq (p.x_scratch, 512 * 2048 * 2);
    cr_assert_eq (rx_cuplan_matmul (RX_F16, 512, 2048, 8192, 0, 0, RX_CUPLAN_HALF_GEMM, &p, &err), RX_OK);
    cr_assert_eq (p.x_parts, 1);
    cr_assert_eq (rx_cuplan_matmul (RX_Q8_0, 512, 2048, 8192, 0, 64u << 20, RX_CUPLAN_HALF_GEMM, &p, &err),
                  RX_OK);
    cr_assert_eq (p.gtype, RX_CUMM_G_F16, "quantized: dequantized to F16, tensor cores");
    cr_assert (p.dequant_w && p.convert_x);
    cr_assert_eq (p.x_parts, 1);
    cr_assert_eq (p.act_qblk, 32, "activations still quantized as on the CPU first");
    cr_assert_eq (p.out_slice, 8192, "2048 x 8192 F16 = 32 MiB: one slice");
    cr_assert_eq (p.w_scratch, (size_t) 8192 * 2048 * 2, "F16 slice");
    cr_assert_eq (rx_cuplan_matmul (RX_Q8_0, 512, 8192, 8192, 0, 64u << 20, RX_CUPLAN_HALF_GEMM, &p, &err),
                  RX_OK);
    cr_assert_eq (p.out_slice, 4096, "64 MiB of F16 rows of 8192");
    cr_assert_eq (rx_cuplan_matmul (RX_BF16, 2, 2048, 8192, 0, 0, RX_CUPLAN_HALF_GEMM, &p, &err), RX_OK);
    cr_assert_eq (p.path, RX_CUMM_MATVEC, "matvec is F32 either way");
}

Test (cuplan, refusals)
{
    struct rx_cumm_plan p;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_matmul (RX_Q8_K, 1, 256, 256, 0, 0, 0, &p, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "no kernel for weight dtype 15"), "%s", err.msg);
    cr_assert_eq (rx_cuplan_matmul (RX_Q4_0, 1, 48, 16, 0, 0, 0, &p, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "in = 48"), "%s", err.msg);
    cr_assert_eq (rx_cuplan_matmul (RX_Q4_K, 1, 128, 16, 0, 0, 0, &p, &err), RX_EINVAL,
                  "K-quant rows hold whole 256-blocks");
    cr_assert_eq (rx_cuplan_matmul (RX_F32, 1, 64, 0, 0, 0, 0, &p, &err), RX_EINVAL);
    cr_assert_eq (rx_cuplan_matmul (RX_F32, 1, 64, 64, 0, 0, 0, NULL, &err), RX_EINVAL);
}

Test (cuplan, launch_dims)
{
    cr_assert_eq (rx_cuplan_blocks (0, 256, 0), 1, "at least one block");
    cr_assert_eq (rx_cuplan_blocks (256, 256, 0), 1);
    cr_assert_eq (rx_cuplan_blocks (257, 256, 0), 2);
    cr_assert_eq (rx_cuplan_blocks (1u << 30, 256, 65535), 65535, "capped: kernels loop");
    cr_assert_eq (rx_cuplan_blocks (10, 0, 0), 10, "per_block 0 treated as 1");
    cr_assert_eq (rx_cuplan_row_threads (1), 32);
    cr_assert_eq (rx_cuplan_row_threads (33), 64);
    cr_assert_eq (rx_cuplan_row_threads (4096), RX_CU_ROW_THREADS);
    cr_assert_eq (rx_cuplan_attn_smem (128, 128), (128 + RX_CU_ATTN_TILE + 32) * 4);
    cr_assert_eq (rx_cuplan_attn_smem (576, 512), (576 + RX_CU_ATTN_TILE + 32) * 4,
                  "MLA latent: q of kv_lora + rope dims");
}

Test (cuplan, fast_matvec_kernel_choice)
{
    /* Off unless asked for ([kernels.cuda] matvec = fast). */
    cr_assert_eq (rx_cuplan_mv_kernel (RX_BF16, 2048, 0), RX_CUMV_SIMPLE);
    cr_assert_eq (rx_cuplan_mv_kernel (RX_BF16, 2048, 1), RX_CUMV_VEC);
    cr_assert_eq (rx_cuplan_mv_kernel (RX_F16, 32, 1), RX_CUMV_VEC, "64-byte rows");
    cr_assert_eq (rx_cuplan_mv_kernel (RX_F32, 32, 1), RX_CUMV_VEC);
    cr_assert_eq (rx_cuplan_mv_kernel (RX_Q8_0, 2048, 1), RX_CUMV_STAGE, "2176-byte rows");
    cr_assert_eq (rx_cuplan_mv_kernel (RX_Q8_0, 96, 1), RX_CUMV_SIMPLE, "102-byte rows are not 16-aligned");
    cr_assert_eq (rx_cuplan_mv_kernel (RX_Q6_K, 512, 1), RX_CUMV_SIMPLE, "420-byte rows");
    cr_assert_eq (rx_cuplan_mv_kernel (RX_Q6_K, 4096, 1), RX_CUMV_STAGE, "3360-byte rows");
    cr_assert_eq (rx_cuplan_mv_kernel (RX_Q4_K, 5632, 1), RX_CUMV_STAGE, "3168-byte rows");
    cr_assert_eq (rx_cuplan_mv_kernel (RX_Q8_K, 256, 1), RX_CUMV_SIMPLE, "no kernels for Q8_K");
    struct rx_cumm_plan p;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_matmul (RX_Q4_0, 1, 4096, 4096, 0, 0, 1, &p, &err), RX_OK);
    cr_assert_eq (p.mv_kernel, RX_CUMV_STAGE);
    cr_assert_eq (rx_cuplan_matmul (RX_Q4_0, 1, 4096, 4096, 0, 0, 0, &p, &err), RX_OK);
    cr_assert_eq (p.mv_kernel, RX_CUMV_SIMPLE);
    cr_assert_eq (rx_cuplan_matmul (RX_BF16, 64, 4096, 4096, 0, 0, 1, &p, &err), RX_OK);
    cr_assert_eq (p.path, RX_CUMM_GEMM, "the fast matvec does not change the GEMM threshold");
}

/* The staged matvec copies a row RX_CU_MV_STAGE elements at a time (as
 * 16-byte vectors) and decodes chunk c of the staged bytes; that must be
 * chunk e0 / 32 + c of the row, for every block type and every stage,
 * including a partial last one.  Emulated here the way the kernel does it
 * (copy then decode), against decoding the row in place. */
Test (cuplan, staged_matvec_decodes_the_rows_chunks)
{
    const int dts[] = { RX_Q8_0, RX_Q4_0, RX_Q4_1, RX_Q4_K, RX_Q5_K, RX_Q6_K };
    const size_t ins[] = { 256, 2048, 2560, 4096, 5632, 6144 + 512 };
    uint64_t seed = 12345;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        const size_t sb = rx_cuplan_mv_stage_bytes (dts[d]);
        cr_assert_eq (sb, rx_cu_row_bytes (dts[d], RX_CU_MV_STAGE));
        cr_assert_eq (sb % 16, 0, "dtype %d: a stage is whole 16-byte vectors", dts[d]);
        for (size_t k = 0; k < sizeof ins / sizeof ins[0]; k++) {
            const size_t in = ins[k], rb = rx_cu_row_bytes (dts[d], in);
            if (rb == 0 || rx_cuplan_mv_kernel (dts[d], in, 1) != RX_CUMV_STAGE) continue;
            uint8_t *row = malloc (rb), *buf = malloc (sb);
            for (size_t i = 0; i < rb; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                row[i] = (uint8_t) (seed >> 56);
            }
            /* finite fp16 scales: clear the exponent's top bit of every
             * 16-bit word (any bytes are valid quants) */
            for (size_t i = 1; i < rb; i += 2) row[i] &= 0x3f;
            for (size_t e0 = 0; e0 < in; e0 += RX_CU_MV_STAGE) {
                const size_t ne = in - e0 < RX_CU_MV_STAGE ? in - e0 : RX_CU_MV_STAGE;
                const size_t nb = rx_cu_row_bytes (dts[d], ne);
                cr_assert_eq (nb % 16, 0, "partial stage of %zu elements: whole vectors", ne);
                memcpy (buf, row + e0 / RX_CU_MV_STAGE * sb, nb);
                for (size_t c = 0; c < ne / 32; c++) {
                    float a[32], b[32];
                    rx_cu_deq32 (dts[d], buf, c, a);
                    rx_cu_deq32 (dts[d], row, e0 / 32 + c, b);
                    cr_assert (!memcmp (a, b, sizeof a), "dtype %d in %zu: stage %zu chunk %zu", dts[d],
                               in, e0 / RX_CU_MV_STAGE, c);
                }
            }
            free (row);
            free (buf);
        }
    }
    cr_assert_eq (rx_cuplan_mv_stage_bytes (RX_BF16), 0, "plain types are not staged");
}

Test (cuplan, tiled_attention_choice_and_smem)
{
    cr_assert (!rx_cuplan_attn_tiled (0, 64, 64, 512, 1), "off unless asked for");
    cr_assert (rx_cuplan_attn_tiled (1, 64, 64, 512, 1), "a 512-token prefill");
    cr_assert (rx_cuplan_attn_tiled (1, 128, 128, 43, 3), "prefill + decode + chunk");
    cr_assert (!rx_cuplan_attn_tiled (1, 64, 64, 16, 16), "pure decode keeps a block per row");
    cr_assert (!rx_cuplan_attn_tiled (1, 576, 512, 512, 1), "MLA absorbed dims");
    cr_assert (!rx_cuplan_attn_tiled (1, 256, 256, 512, 1), "head dims over 128");
    cr_assert (!rx_cuplan_attn_tiled (1, 64, 64, 0, 0));
    const size_t sm = rx_cuplan_attn_tiled_smem (128, 128);
    cr_assert_eq (sm, (size_t) (32 * 129 + 32 * 129 + 32 * 129 + 32 * 33) * 4);
    cr_assert_leq (sm, 227u * 1024, "fits an sm_80/sm_90 block's opt-in shared memory");
}

Test (cuplan, attention_split_count)
{
    /* Off: the unsplit kernel whatever the shape. */
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 132, 0), 1);
    /* auto: ceil (2 x 132 SMs / (rows x heads)), 1..32. */
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 132, RX_CU_ATTN_SPLITS_AUTO), 9, "264 / 32 = 8.25");
    cr_assert_eq (rx_cuplan_attn_splits (4, 4, 32, 132, RX_CU_ATTN_SPLITS_AUTO), 3, "264 / 128");
    cr_assert_eq (rx_cuplan_attn_splits (2, 2, 66, 132, RX_CU_ATTN_SPLITS_AUTO), 2, "exactly 2 x 132");
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 8, 132, RX_CU_ATTN_SPLITS_AUTO), 32, "33 clamped to 32");
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 1, 132, RX_CU_ATTN_SPLITS_AUTO), 32);
    cr_assert_eq (rx_cuplan_attn_splits (9, 9, 32, 132, RX_CU_ATTN_SPLITS_AUTO), 1, "288 blocks fill it");
    cr_assert_eq (rx_cuplan_attn_splits (512, 512, 64, 132, RX_CU_ATTN_SPLITS_AUTO), 1,
                  "a large decode batch");
    cr_assert_eq (rx_cuplan_attn_splits (3, 1, 32, 132, RX_CU_ATTN_SPLITS_AUTO), 3,
                  "3 rows of one sequence are decode-like: 264 / 96");
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 0, RX_CU_ATTN_SPLITS_AUTO), 1, "unknown SM count");
    cr_assert_eq (rx_cuplan_attn_splits (65535, 65535, 65535, 132, RX_CU_ATTN_SPLITS_AUTO), 1,
                  "no int overflow");
    /* A fixed count: exactly that, 1..64, for any decode-like shape. */
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 132, 3), 3);
    cr_assert_eq (rx_cuplan_attn_splits (512, 512, 64, 132, 7), 7);
    cr_assert_eq (rx_cuplan_attn_splits (8, 3, 8, 132, 3), 3, "two decodes and a 6-row chunk");
    /* Prefill-like batches (4 or more rows per sequence) never split. */
    cr_assert_eq (rx_cuplan_attn_splits (12, 3, 8, 132, 3), 1);
    cr_assert_eq (rx_cuplan_attn_splits (4, 1, 32, 132, RX_CU_ATTN_SPLITS_AUTO), 1);
    cr_assert_eq (rx_cuplan_attn_splits (512, 1, 64, 132, 7), 1);
    cr_assert_eq (rx_cuplan_attn_splits (1, 0, 32, 132, 3), 1, "no sequences");
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 0, 7), 7, "the SM count does not matter");
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 132, 100), 64);
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 32, 132, 1), 1);
    cr_assert_eq (rx_cuplan_attn_splits (0, 0, 32, 132, 3), 1, "no rows");
    cr_assert_eq (rx_cuplan_attn_splits (1, 1, 0, 132, RX_CU_ATTN_SPLITS_AUTO), 1, "no heads");
    /* The partials: [rows][heads][splits][hd_v + 2] floats. */
    cr_assert_eq (rx_cuplan_attn_split_bytes (1, 32, 9, 128), (size_t) 32 * 9 * 130 * 4);
    cr_assert_eq (rx_cuplan_attn_split_bytes (3, 16, 3, 512), (size_t) 3 * 16 * 3 * 514 * 4,
                  "MLA's absorbed hd_v");
    cr_assert_eq (rx_cuplan_attn_split_bytes (0, 32, 9, 128), 0);
    cr_assert_eq (rx_cuplan_attn_split_bytes (1, 32, 0, 128), 0);
    if (sizeof (size_t) == 8)
        cr_assert_eq (rx_cuplan_attn_split_bytes (INT32_MAX, INT32_MAX, 64, INT32_MAX), 0,
                      "overflow");
}

Test (cuplan, attention_splits_setting)
{
    struct rx_err err = { 0 };
    int v = 99;
    cr_assert_eq (rx_cuplan_attn_splits_parse ("0", &v, &err), RX_OK);
    cr_assert_eq (v, 0);
    v = 99;
    cr_assert_eq (rx_cuplan_attn_splits_parse ("off", &v, &err), RX_OK);
    cr_assert_eq (v, 0);
    cr_assert_eq (rx_cuplan_attn_splits_parse ("auto", &v, &err), RX_OK);
    cr_assert_eq (v, RX_CU_ATTN_SPLITS_AUTO);
    cr_assert_eq (rx_cuplan_attn_splits_parse ("7", &v, &err), RX_OK);
    cr_assert_eq (v, 7);
    cr_assert_eq (rx_cuplan_attn_splits_parse ("64", &v, &err), RX_OK);
    cr_assert_eq (v, 64);
    cr_assert_eq (rx_cuplan_attn_splits_parse ("1000", &v, &err), RX_OK);
    cr_assert_eq (v, 64, "clamped to the maximum");
    cr_assert_eq (rx_cuplan_attn_splits_parse ("99999999999999999999999", &v, &err), RX_OK);
    cr_assert_eq (v, 64, "out of long's range: clamped too");
    const char *bad[] = { "", "-1", "-0", "+3", " 3", "3x", "0x10", "AUTO", "on", "00", "2.5" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 42;
        memset (&err, 0, sizeof err);
        cr_assert_eq (rx_cuplan_attn_splits_parse (bad[i], &v, &err), RX_EINVAL, "'%s'", bad[i]);
        cr_assert_eq (v, 42, "'%s' leaves the setting alone", bad[i]);
        char want[64];
        snprintf (want, sizeof want, "attention_splits = '%s' (0 or off, auto, or a number", bad[i]);
        cr_assert (strstr (err.msg, want), "%s", err.msg);
        cr_assert_null (strchr (err.msg, '\n'), "one line: %s", err.msg);
    }
    cr_assert_eq (rx_cuplan_attn_splits_parse (NULL, &v, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "'(null)'"), "%s", err.msg);
    cr_assert_eq (rx_cuplan_attn_splits_parse ("3", NULL, &err), RX_EINVAL);
}

Test (cuprof, table_sorted_and_totals)
{
    struct rx_cuprof *p = calloc (1, sizeof *p);
    rx_cuprof_add (p, "rms_norm", 1.0);
    rx_cuprof_add (p, "matmul.matvec.bf16", 4.0);
    rx_cuprof_add (p, "rms_norm", 0.5);
    rx_cuprof_add (p, "attention", 2.0);
    p->syncs = 7;
    cr_assert_eq (p->n, 3);
    cr_assert_float_eq (p->total_ms, 7.5, 1e-12);
    char out[2048];
    size_t need = rx_cuprof_report (p, out, sizeof out);
    cr_assert_eq (need, strlen (out));
    const char *a = strstr (out, "matmul.matvec.bf16"), *b = strstr (out, "attention"),
               *c = strstr (out, "rms_norm");
    cr_assert (a && b && c && a < b && b < c, "largest total first:\n%s", out);
    cr_assert (strstr (out, "2 calls      1.500 ms    750.00 us/call  20.0%"), "%s", out);
    cr_assert (strstr (out, "total 7.500 ms of device time in ops, 7 stream synchronizations"), "%s", out);
    /* Truncation: never past cap, ends at a line boundary, NUL-terminated. */
    char small[100];
    memset (small, 'x', sizeof small);
    size_t n2 = rx_cuprof_report (p, small, sizeof small);
    cr_assert_eq (n2, need, "the needed length, as snprintf");
    cr_assert_lt (strlen (small), sizeof small);
    cr_assert (strlen (small) == 0 || small[strlen (small) - 1] == '\n', "%s", small);
    cr_assert_eq (rx_cuprof_report (p, NULL, 0), need, "a size query");
    free (p);
}

Test (cuprof, overflowing_names_go_to_other)
{
    struct rx_cuprof *p = calloc (1, sizeof *p);
    char name[40];
    for (int i = 0; i < RX_CUPROF_MAX + 10; i++) {
        snprintf (name, sizeof name, "op%d", i);
        rx_cuprof_add (p, name, 1.0);
    }
    cr_assert_eq (p->n, RX_CUPROF_MAX);
    cr_assert_str_eq (p->rows[RX_CUPROF_MAX - 1].name, "(other)");
    cr_assert_eq (p->rows[RX_CUPROF_MAX - 1].calls, 11, "op95..op105");
    rx_cuprof_add (p, "op3", 1.0);
    cr_assert_eq (p->rows[3].calls, 2, "a known name still finds its row");
    cr_assert_float_eq (p->total_ms, RX_CUPROF_MAX + 11.0, 1e-9);
    free (p);
}

/* ---- the MoE expert pass ---- */

Test (cuplan, moe_sort_warps_fit_shared_memory)
{
    uint32_t w = 0;
    size_t smem = 0;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_moe_sort (256, &w, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (w, 32, "DeepSeek-V3's 256 experts: a full block of warps");
    cr_assert_eq (smem, (32 * 256 + 257) * 4);
    cr_assert_eq (rx_cuplan_moe_sort (1, &w, &smem, &err), RX_OK);
    cr_assert_eq (w, 32);
    cr_assert_eq (smem, (32 + 2) * 4);
    cr_assert_eq (rx_cuplan_moe_sort (4096, &w, &smem, &err), RX_OK);
    cr_assert_eq (w, 1, "the largest expert count leaves room for one histogram");
    /* Every size: the most warps whose histograms (and the offsets) fit. */
    for (size_t n = 1; n <= RX_CU_MOE_MAX_EXPERT; n += n < 300 ? 1 : 37) {
        cr_assert_eq (rx_cuplan_moe_sort (n, &w, &smem, &err), RX_OK, "n_expert %zu", n);
        cr_assert (w >= 1 && w <= 32, "n_expert %zu: %u warps", n, w);
        cr_assert_eq (smem, ((size_t) w * n + n + 1) * 4, "n_expert %zu", n);
        cr_assert_leq (smem, RX_CU_SMEM_DEFAULT, "n_expert %zu", n);
        cr_assert (w == 32 || (((size_t) w + 1) * n + n + 1) * 4 > RX_CU_SMEM_DEFAULT,
                   "n_expert %zu: %u warps, one more would fit", n, w);
    }
    cr_assert_eq (rx_cuplan_moe_sort (0, &w, &smem, &err), RX_ENOTSUP);
    cr_assert_eq (rx_cuplan_moe_sort (RX_CU_MOE_MAX_EXPERT + 1, &w, &smem, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "kernels-cuda moe_sort: n_expert 4097 outside 1..4096"), "%s", err.msg);
}

/* ---- the low-latency exchange ---- */

Test (cuplan, moe_ll_unpack_counts_fit_shared_memory)
{
    size_t smem = 0;
    struct rx_err err = { 0 };
    /* DeepSeek-V3 over 8 ranks: 32 local experts */
    cr_assert_eq (rx_cuplan_moe_ll_unpack (8, 32, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (smem, (8 * 33 + 33) * 4, "prefix, offsets");
    cr_assert_eq (rx_cuplan_moe_ll_unpack (1, 1, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (smem, (2 + 2) * 4);
    /* moe-ep_low_latency unpacks NE - first experts: rank 0 of 64 over 256 */
    cr_assert_eq (rx_cuplan_moe_ll_unpack (64, 256, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_gt (smem, RX_CU_SMEM_DEFAULT, "this one opts in to more than 48 KiB");
    /* the bound, from both sides: every size that fits is taken, and the
     * first that does not is refused */
    const size_t cap = RX_CU_LL_SMEM_MAX / 4;
    for (size_t nl = 1; nl < 4000; nl += nl < 64 ? 1 : 97) {
        const size_t nr = cap / (nl + 1) - 1;
        cr_assert_eq (rx_cuplan_moe_ll_unpack (nr, nl, &smem, &err), RX_OK, "%zu x %zu: %s", nr, nl, err.msg);
        cr_assert_leq (smem, RX_CU_LL_SMEM_MAX, "%zu x %zu", nr, nl);
        cr_assert_eq (rx_cuplan_moe_ll_unpack (nr + 1, nl, &smem, &err), RX_ENOTSUP, "%zu x %zu", nr + 1, nl);
        cr_assert (strstr (err.msg, "kernels-cuda moe_ll_unpack") && strstr (err.msg, "shared memory"), "%s",
                   err.msg);
    }
    cr_assert_eq (rx_cuplan_moe_ll_unpack (1, cap, &smem, &err), RX_ENOTSUP, "n_local alone too big");
    cr_assert_eq (rx_cuplan_moe_ll_unpack ((size_t) 1 << 40, 4, &smem, &err), RX_ENOTSUP, "no overflow");
    cr_assert_eq (rx_cuplan_moe_ll_unpack (0, 4, &smem, &err), RX_EINVAL);
    cr_assert_eq (rx_cuplan_moe_ll_unpack (4, 0, &smem, &err), RX_EINVAL);
    cr_assert_eq (rx_cuplan_moe_ll_unpack (4, 4, NULL, &err), RX_OK, "smem may be NULL");
}

Test (cuplan, moe_route_scratch)
{
    size_t smem = 0;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cuplan_moe_route (256, 8, 8, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (smem, (256 + 8 + 8) * 4 + 256 + 8, "sel, group scores, ids; taken, keep");
    cr_assert_eq (rx_cuplan_moe_route (64, 0, 6, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (smem, (64 + 1 + 6) * 4 + 64 + 1, "n_group 0 is one group");
    cr_assert_eq (rx_cuplan_moe_route (4096, 1, 4096, &smem, &err), RX_OK, "%s", err.msg);
    cr_assert_leq (smem + RX_CU_ROUTE_STATIC_SMEM, RX_CU_SMEM_DEFAULT);
    cr_assert_eq (rx_cuplan_moe_route (4096, 4096, 4096, &smem, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "bytes of shared memory"), "%s", err.msg);
    cr_assert_eq (rx_cuplan_moe_route (4097, 1, 8, &smem, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "kernels-cuda moe_route: n_expert 4097"), "%s", err.msg);
    cr_assert_eq (rx_cuplan_moe_route (64, 1, 65, &smem, &err), RX_ENOTSUP, "k > n_expert");
    cr_assert_eq (rx_cuplan_moe_route (64, 1, 0, &smem, &err), RX_ENOTSUP, "k 0");
}

Test (cuplan, matmul_grouped_passes)
{
    struct rx_cugm_plan p;
    struct rx_err err = { 0 };
    /* Float weights: one pass over every row, no activation scratch. */
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_BF16, 65536, 7168, 2048, 0, &p, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (p.act_qblk, 0);
    cr_assert_eq (p.rows_per_pass, 65536);
    cr_assert_eq (p.q_scratch, 0);
    cr_assert_eq (p.grid_x, 2048 / RX_CU_MV_WARPS);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_F32, 3, 256, 41, 0, &p, &err), RX_OK);
    cr_assert_eq (p.grid_x, (41 + RX_CU_MV_WARPS - 1) / RX_CU_MV_WARPS);
    /* Quantized: matmul's activation blocks; a prefill batch in passes of
     * at most 64 MiB of quantized rows, whole 8-row groups. */
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_Q4_K, 65536, 7168, 2048, 0, &p, &err), RX_OK);
    cr_assert_eq (p.act_qblk, 256);
    cr_assert_eq (p.rows_per_pass, ((64u << 20) / (7168 * 4)) / 8 * 8);
    cr_assert_eq (p.q_scratch, p.rows_per_pass * 7168 * 4);
    cr_assert_leq (p.q_scratch, 64u << 20);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_Q8_0, 5, 7168, 2048, 0, &p, &err), RX_OK);
    cr_assert_eq (p.act_qblk, 32);
    cr_assert_eq (p.rows_per_pass, 5, "a decode batch: one pass");
    cr_assert_eq (p.q_scratch, 5 * 7168 * 4);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_Q8_0, 100, 4096, 64, 1000, &p, &err), RX_OK);
    cr_assert_eq (p.rows_per_pass, RX_CU_MV_MAX_ROWS, "a tiny bound still takes one row group");
    /* Refusals, as matmul's. */
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_Q8_K, 1, 256, 256, 0, &p, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "kernels-cuda matmul_grouped: no kernel for weight dtype"), "%s", err.msg);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_Q4_0, 1, 48, 16, 0, &p, &err), RX_EINVAL);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_Q4_K, 1, 128, 16, 0, &p, &err), RX_EINVAL);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_F32, 1, 64, 0, 0, &p, &err), RX_EINVAL);
    cr_assert_eq (rx_cuplan_matmul_grouped (RX_F32, 1, 64, 64, 0, NULL, &err), RX_EINVAL);
}

/* --------------------------------------------------------------- kcuda -- */

static char *s_cuda_so (void)
{
    const char *dir = tu_env ("RX_PLUGIN_BUILD_DIR");
    return tu_path (dir, "kernels-cuda.so");
}

static int s_built (void)
{
    char *p = s_cuda_so ();
    struct stat sb;
    int ok = stat (p, &sb) == 0;
    /* libstdc++ and cuBLAS (the plugin's dependencies) allocate buffers for
     * the life of the process when they load; once the loader dlcloses the
     * plugin, leak checkers would report those as lost.  Keep it mapped. */
    if (ok) cr_assert_not_null (dlopen (p, RTLD_NOW | RTLD_NODELETE), "%s", dlerror ());
    free (p);
#ifdef RX_TEST_CUDA_BUILT
    cr_assert (ok, "configure found nvcc but kernels-cuda.so is not in RX_PLUGIN_BUILD_DIR");
#endif
    return ok;
}

TestSuite (kcuda);

Test (kcuda, loads_through_the_loader, .timeout = 300)
{
    if (!s_built ()) cr_skip_test ("kernels-cuda was not built (configure found no nvcc)");
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (l, "%s", err.msg);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_KERNELS, "cuda", &p, &err), RX_OK, "%s", err.msg);
    const struct rx_plugin_desc *d = rx_plugin_desc (p);
    cr_assert_str_eq (d->name, "cuda", "[kernels] backend = cuda picks it");
    cr_assert_eq (d->kind, RX_KIND_KERNELS);
    cr_assert_eq (d->abi_major, RX_ABI_MAJOR);
    const char *want[] = { "matvec_max_rows", "graphs", "chunk_mb", "matvec", "attention",
                           "attention_splits", "profile" };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int found = 0;
        for (const struct rx_cfg_key *k = d->keys; k && k->name; k++) found |= strcmp (k->name, want[i]) == 0;
        cr_assert (found, "key %s", want[i]);
    }
    cr_assert_eq (rx_plugin_init (p, NULL, &err), RX_OK, "%s", err.msg);
    const struct rx_kernels_ops *K = rx_plugin_ops (p);
    cr_assert_geq (K->struct_size, RX_KERNELS_OPS_SIZE_1_0);
    /* Every ABI 1.0 member is set. */
    const void *const *fn = (const void *const *) ((const char *) K + offsetof (struct rx_kernels_ops, create));
    size_t nfn = (RX_KERNELS_OPS_SIZE_1_0 - offsetof (struct rx_kernels_ops, create)) / sizeof (void *);
    for (size_t i = 0; i < nfn; i++) cr_assert_not_null (fn[i], "op %zu is NULL", i);
    /* The appended MoE ops (ABI 1.2 moe_route, 1.3 the expert pass). */
    cr_assert (RX_HAS (struct rx_kernels_ops, K, moe_route) && K->moe_route);
    cr_assert (RX_HAS (struct rx_kernels_ops, K, moe_combine));
    cr_assert (K->moe_sort && K->gather_rows && K->matmul_grouped && K->moe_combine);
    /* Without an instance they refuse before any CUDA call. */
    int32_t dummy[4] = { 0 };
    cr_assert_eq (K->moe_sort (NULL, NULL, dummy, 1, 1, 4, dummy, dummy, dummy, &err), RX_EINVAL);
    cr_assert_str_eq (err.msg, "kernels-cuda moe_sort: no backend");
    cr_assert_eq (K->moe_combine (NULL, NULL, NULL, 0, NULL, NULL, 0, 1, 1, NULL, 0, 0, &err), RX_EINVAL);
    cr_assert_str_eq (err.msg, "kernels-cuda moe_combine: no backend");
    cr_assert_eq (K->matmul_grouped (NULL, NULL, NULL, NULL, 0, NULL, 0, NULL, 0, 0, 0, &err), RX_EINVAL);
    cr_assert_str_eq (err.msg, "kernels-cuda matmul_grouped: no backend");
    rx_loader_destroy (&l);
}

Test (kcuda, create_without_a_gpu_fails_cleanly, .timeout = 300)
{
    if (!s_built ()) cr_skip_test ("kernels-cuda was not built (configure found no nvcc)");
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_KERNELS, "cuda", &p, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (p, NULL, &err), RX_OK, "%s", err.msg);
    const struct rx_kernels_ops *K = rx_plugin_ops (p);
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .device = 0 };
    void *be = (void *) 1;
    int rc = K->create (rx_plugin_host (p), &kp, &be, &err);
    if (rc == RX_OK) {
        /* A GPU is present: the smallest useful round trip instead. */
        void *d = NULL;
        float h[4] = { 1, 2, 3, 4 }, o[4] = { 0 };
        cr_assert_eq (K->alloc (be, sizeof h, 0, &d, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (K->copy_h2d (be, NULL, d, h, sizeof h, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (K->copy_d2h (be, NULL, o, d, sizeof o, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (K->synchronize (be, NULL, &err), RX_OK, "%s", err.msg);
        cr_assert_arr_eq (o, h, sizeof h);
        K->free_ (be, d);
        K->destroy (be);
    } else {
        cr_assert_eq (rc, RX_EDEVICE, "%d %s", rc, err.msg);
        cr_assert_null (be, "be is NULLed on failure");
        cr_assert (strstr (err.msg, "kernels-cuda create: no CUDA device (cudaGetDeviceCount: "),
                   "%s", err.msg);
        cr_assert_null (strchr (err.msg, '\n'), "one line: %s", err.msg);
    }
    /* Bad arguments are refused before the device is touched. */
    cr_assert_eq (K->create (rx_plugin_host (p), &kp, NULL, &err), RX_EINVAL);
    struct rx_kernels_params old = { .struct_size = 4 };
    cr_assert_eq (K->create (rx_plugin_host (p), &old, &be, &err), RX_EABI);
    cr_assert (strstr (err.msg, "struct_size 4"), "%s", err.msg);
    K->destroy (NULL);
    rx_loader_destroy (&l);
}
