/* tests/unit/test_kernels_cpu.c -- core/quant.c and the CPU kernel backend
 * (kernels-cpu.so, loaded through the real loader as radixd does).
 *
 * Every op is checked against a naive reference written here (double
 * precision, element-index formulas that share no code with the plugin),
 * on every SIMD path this CPU has (forced with the plugin's `isa` key), with
 * awkward shapes: n = 1, rows not a multiple of the thread count, odd block
 * counts.  quant.c is checked against an independent dequantizer, against
 * theoretical error bounds, and byte for byte against llama.cpp's own output
 * (../shared tiny-llama models, quantized by llama.cpp from tiny-llama). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <radix/kernel.h>
#include <radix/plugin.h>

#include "conf.h"
#include "gguf.h"
#include "host.h"
#include "loader.h"
#include "quant.h"
#include "../testutil.h"

/* ------------------------------------------------------------------ rng -- */

static uint64_t s_rng = 0x9E3779B97F4A7C15ull;

static uint64_t s_next (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return s_rng;
}

static float s_unif (void) { return (float) ((s_next () >> 11) * (1.0 / 9007199254740992.0)); }

static float s_gauss (void)
{
    float u = s_unif (), v = s_unif ();
    if (u < 1e-12f) u = 1e-12f;
    return sqrtf (-2.f * logf (u)) * cosf (6.2831853f * v);
}

static float *s_randv (size_t n, float scale)
{
    float *x = malloc (n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = s_gauss () * scale;
    return x;
}

/* ------------------------------------------- independent fp16/dequant -- */

static double t_f16 (uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp (m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp (1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint16_t t_u16 (const uint8_t *p) { return (uint16_t) (p[0] | (p[1] << 8)); }

/* Element i of a row of dtype t, from the GGML byte layout (offsets, not
 * structs), in double. */
static double t_deq (int t, const uint8_t *row, size_t i)
{
    switch (t) {
    case RX_F32: { float f; memcpy (&f, row + 4 * i, 4); return f; }
    case RX_F16: return t_f16 (t_u16 (row + 2 * i));
    case RX_BF16: { uint32_t u = (uint32_t) t_u16 (row + 2 * i) << 16; float f; memcpy (&f, &u, 4); return f; }
    case RX_Q8_0: {
        const uint8_t *b = row + (i / 32) * 34;
        return t_f16 (t_u16 (b)) * (int8_t) b[2 + i % 32];
    }
    case RX_Q4_0: case RX_Q4_1: {
        size_t bs = t == RX_Q4_0 ? 18 : 20, e = i % 32;
        const uint8_t *b = row + (i / 32) * bs;
        uint8_t byte = b[bs - 16 + e % 16];
        int nib = e < 16 ? byte & 15 : byte >> 4;
        if (t == RX_Q4_0) return t_f16 (t_u16 (b)) * (nib - 8);
        return t_f16 (t_u16 (b)) * nib + t_f16 (t_u16 (b + 2));
    }
    case RX_Q4_K: case RX_Q5_K: {
        size_t bs = t == RX_Q4_K ? 144 : 176, e = i % 256, sub = e / 32;
        const uint8_t *b = row + (i / 256) * bs, *sc = b + 4;
        int s, m;
        if (sub < 4) { s = sc[sub] & 63; m = sc[sub + 4] & 63; }
        else { s = (sc[sub + 4] & 15) | ((sc[sub - 4] >> 6) << 4); m = (sc[sub + 4] >> 4) | ((sc[sub] >> 6) << 4); }
        const uint8_t *qs = b + (t == RX_Q4_K ? 16 : 48);
        uint8_t byte = qs[(e / 64) * 32 + e % 32];
        int q = sub % 2 == 0 ? byte & 15 : byte >> 4;
        if (t == RX_Q5_K) q += ((b[16 + e % 32] >> sub) & 1) << 4;
        return t_f16 (t_u16 (b)) * s * q - t_f16 (t_u16 (b + 2)) * m;
    }
    case RX_Q6_K: {
        size_t e = i % 256, half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        const uint8_t *b = row + (i / 256) * 210;
        uint8_t lb = b[half * 64 + l + (quarter % 2) * 32];
        int lo = quarter < 2 ? lb & 15 : lb >> 4;
        int hi = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
        int sc = (int8_t) b[192 + half * 8 + l / 16 + 2 * quarter];
        return t_f16 (t_u16 (b + 208)) * sc * ((lo | (hi << 4)) - 32);
    }
    default:
        cr_assert_fail ("t_deq: dtype %d", t);
        return 0;
    }
}

/* ------------------------------------------- test-side activation quant -- */

/* GGML's activation Q8 blocks: d = fp16(amax/127), q = round-even(x*127/amax). */
static void t_q8 (const float *x, size_t in, double *dx, int *qx)
{
    for (size_t b = 0; b < in / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf (amax, fabsf (x[b * 32 + i]));
        float id = amax ? 127.f / amax : 0.f;
        dx[b] = t_f16 (rx_fp32_to_fp16 (amax / 127.f));
        for (int i = 0; i < 32; i++) qx[b * 32 + i] = (int) rintf (x[b * 32 + i] * id);
    }
}

/* GGML's Q8_K: iscale = -127/max (max: the value of largest magnitude). */
static void t_q8k (const float *x, size_t in, double *dx, int *qx)
{
    for (size_t b = 0; b < in / 256; b++) {
        float max = 0, amax = 0;
        for (int i = 0; i < 256; i++)
            if (fabsf (x[b * 256 + i]) > amax) { amax = fabsf (x[b * 256 + i]); max = x[b * 256 + i]; }
        if (!amax) {
            dx[b] = 0;
            for (int i = 0; i < 256; i++) qx[b * 256 + i] = 0;
            continue;
        }
        float is = -127.f / max;
        dx[b] = 1 / is;
        for (int i = 0; i < 256; i++) {
            int v = (int) rintf (is * x[b * 256 + i]);
            qx[b * 256 + i] = v > 127 ? 127 : v;
        }
    }
}

/* Largest magnitude a term of element i's formula can have (tolerances). */
static double t_mag (int t, const uint8_t *row, size_t i)
{
    switch (t) {
    case RX_Q4_K: case RX_Q5_K: {
        const uint8_t *b = row + (i / 256) * (t == RX_Q4_K ? 144 : 176);
        return fabs (t_f16 (t_u16 (b))) * 63 * 31 + fabs (t_f16 (t_u16 (b + 2))) * 63;
    }
    case RX_Q6_K: return fabs (t_f16 (t_u16 (row + (i / 256) * 210 + 208))) * 128 * 32;
    default: return fabs (t_deq (t, row, i));
    }
}

static int s_is_k (int t) { return t == RX_Q4_K || t == RX_Q5_K || t == RX_Q6_K; }
static int s_is_q (int t) { return t != RX_F32 && t != RX_F16 && t != RX_BF16; }

/* ----------------------------------------------------- plugin handling -- */

static const struct rx_kernels_ops *K;
static rx_loader_t *s_loader;
static rx_plugin_t *s_plugin;

static void s_load (void)
{
    struct rx_err err = { 0 };
    s_loader = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (s_loader, "%s", err.msg);
    cr_assert_eq (rx_loader_find (s_loader, RX_KIND_KERNELS, "cpu", &s_plugin, &err), RX_OK,
                  "%s", err.msg);
    cr_assert_eq (rx_plugin_init (s_plugin, NULL, &err), RX_OK, "%s", err.msg);
    K = rx_plugin_ops (s_plugin);
    cr_assert_not_null (K);
    cr_assert_geq (K->struct_size, RX_KERNELS_OPS_SIZE_1_0);
}

static void s_unload (void) { rx_loader_destroy (&s_loader); }

TestSuite (quant);
TestSuite (kcpu, .init = s_load, .fini = s_unload);

/* One host binding per instance (the table must outlive it). */
#define S_MAX_INST 256
static struct rx_host_binding s_bind[S_MAX_INST];
static rx_conf_t *s_confs[S_MAX_INST];
static int s_ninst;

/* Create an instance with [kernels.cpu] isa = isa; returns NULL and fills
 * rc if create refused. */
static void *s_create_rc (const char *isa, int threads, const char *extra, int *rc,
                          struct rx_err *err)
{
    cr_assert_lt (s_ninst, S_MAX_INST);
    char ini[256];
    snprintf (ini, sizeof ini, "[kernels.cpu]\nisa = %s\n%s", isa, extra ? extra : "");
    struct rx_err e = { 0 };
    rx_conf_t *c = rx_conf_parse_string (ini, strlen (ini), "test.ini", &e);
    cr_assert_not_null (c, "%s", e.msg);
    s_confs[s_ninst] = c;
    struct rx_host_binding *b = &s_bind[s_ninst++];
    rx_host_bind (b, "kernels-cpu", "kernels.cpu", c, rx_plugin_desc (s_plugin)->keys);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = threads, .device = 0 };
    void *be = NULL;
    *rc = K->create (&b->host, &p, &be, err);
    return be;
}

static void *s_create_x (const char *isa, int threads, const char *extra)
{
    struct rx_err err = { 0 };
    int rc;
    void *be = s_create_rc (isa, threads, extra, &rc, &err);
    cr_assert_eq (rc, RX_OK, "create isa=%s threads=%d: %s", isa, threads, err.msg);
    return be;
}

static void *s_create (const char *isa, int threads) { return s_create_x (isa, threads, NULL); }

static const char *const s_isas[] = { "scalar", "avx2", "avx512" };

/* Paths x weight layouts: AVX-512 repacks Q8_0/Q4_0/Q4_1 by default (auto)
 * and keeps GGML's layout with weights = map. */
static const struct { const char *isa, *extra; } s_cfgs[] = {
    { "scalar", NULL }, { "avx2", NULL }, { "avx512", NULL }, { "avx512", "weights = map\n" },
    { "avx2", "weights = copy\n" },
};
#define S_NCFG (sizeof s_cfgs / sizeof s_cfgs[0])

/* Is the ISA usable here?  (A refused path must say ENOTSUP, not crash.) */
static int s_isa_ok (const char *isa)
{
    struct rx_err err = { 0 };
    int rc;
    void *be = s_create_rc (isa, 1, NULL, &rc, &err);
    if (rc == RX_OK) {
        K->destroy (be);
        return 1;
    }
    cr_assert_eq (rc, RX_ENOTSUP, "isa=%s: %s", isa, err.msg);
    cr_assert (strstr (err.msg, isa), "%s", err.msg);
    return 0;
}

static rx_kweight_t *s_weight (void *be, int dtype, const void *data, uint64_t ne0, uint64_t ne1,
                               uint64_t ne2)
{
    struct rx_weight_view v = { .name = "w", .dtype = dtype, .n_dims = ne2 > 1 ? 3 : 2,
                                .ne = { ne0, ne1, ne2, 1 }, .data = data,
                                .nbytes = rx_dtype_row_bytes (dtype, ne0) * ne1 * ne2 };
    rx_kweight_t *w = NULL;
    struct rx_err err = { 0 };
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_OK, "%s", err.msg);
    return w;
}

/* Random weights of dtype: quantized from Gaussian values with a spread of
 * row scales (so blocks differ). */
static uint8_t *s_rand_weights (int dtype, size_t in, size_t rows)
{
    size_t rb = rx_dtype_row_bytes (dtype, in);
    uint8_t *w = malloc (rb * rows);
    float *x = malloc (in * sizeof *x);
    for (size_t r = 0; r < rows; r++) {
        float sc = 0.02f + 0.1f * s_unif ();
        for (size_t i = 0; i < in; i++) x[i] = s_gauss () * sc + (i % 7 == 0 ? 0.01f : 0.f);
        cr_assert_eq (rx_quantize_row (dtype, x, w + r * rb, in), rb);
    }
    free (x);
    return w;
}

/* ========================================================= quant tests -- */

Test (quant, fp16_exhaustive_roundtrip_and_rounding)
{
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = t_f16 ((uint16_t) h);
        float f = rx_fp16_to_fp32 ((uint16_t) h);
        if (isnan (ref)) {
            cr_assert (isnan (f), "h=0x%04x", h);
            cr_assert (isnan (rx_fp16_to_fp32 (rx_fp32_to_fp16 (f))));
            continue;
        }
        cr_assert_eq ((double) f, ref, "h=0x%04x: %g vs %g", h, (double) f, ref);
        cr_assert_eq (rx_fp32_to_fp16 (f), h, "roundtrip 0x%04x", h);
    }
    /* Nearest, ties to even, against a brute-force search. */
    for (int i = 0; i < 200000; i++) {
        float f = ldexpf (s_unif () * 2 - 1, (int) (s_next () % 44) - 28);
        uint16_t h = rx_fp32_to_fp16 (f);
        double best = INFINITY;
        for (int d = -1; d <= 1; d++) {
            uint16_t c = (uint16_t) (h + d);
            if ((c & 0x7c00) == 0x7c00 || ((c ^ h) & 0x8000)) continue;
            best = fmin (best, fabs (t_f16 (c) - f));
        }
        cr_assert_leq (fabs (t_f16 (h) - f), best, "f=%a h=0x%04x", (double) f, h);
    }
    cr_assert_eq (rx_fp32_to_fp16 (1.0f + 0x1p-11f), 0x3c00);          /* tie -> even */
    cr_assert_eq (rx_fp32_to_fp16 (1.0f + 3 * 0x1p-11f), 0x3c02);      /* tie -> even (up) */
    cr_assert_eq (rx_fp32_to_fp16 (65504.f), 0x7bff);
    cr_assert_eq (rx_fp32_to_fp16 (65519.f), 0x7bff);
    cr_assert_eq (rx_fp32_to_fp16 (65520.f), 0x7c00);                  /* rounds to inf */
    cr_assert_eq (rx_fp32_to_fp16 (-INFINITY), 0xfc00);
    cr_assert_eq (rx_fp32_to_fp16 (0x1p-24f), 0x0001);
    cr_assert_eq (rx_fp32_to_fp16 (0x1p-25f), 0x0000);                 /* tie -> even (0) */
    cr_assert_eq (rx_fp32_to_fp16 (3 * 0x1p-26f), 0x0001);
    cr_assert_eq (rx_fp32_to_fp16 (-0.0f), 0x8000);
    cr_assert_eq (rx_fp32_to_fp16 (NAN) & 0x7e00, 0x7e00);
}

Test (quant, bf16)
{
    cr_assert_eq (rx_fp32_to_bf16 (1.0f), 0x3f80);
    cr_assert_eq (rx_fp32_to_bf16 (1.0f + 0x1p-8f), 0x3f80);           /* tie -> even */
    cr_assert_eq (rx_fp32_to_bf16 (1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_assert_eq (rx_fp32_to_bf16 (-2.5f), 0xc020);
    cr_assert (isnan (rx_bf16_to_fp32 (rx_fp32_to_bf16 (NAN))));
    cr_assert_eq (rx_bf16_to_fp32 (0x4049), 3.140625f);
    for (int i = 0; i < 10000; i++) {
        float f = s_gauss () * 100;
        float g = rx_bf16_to_fp32 (rx_fp32_to_bf16 (f));
        cr_assert_leq (fabsf (g - f), fabsf (f) * 0x1p-8f, "%g -> %g", (double) f, (double) g);
    }
}

Test (quant, api_errors)
{
    float x[512] = { 0 }, y[512];
    uint8_t buf[1024];
    cr_assert_eq (rx_quantize_row (RX_Q8_0, x, buf, 33), 0);   /* not a multiple of 32 */
    cr_assert_eq (rx_quantize_row (RX_Q4_K, x, buf, 32), 0);
    cr_assert_eq (rx_quantize_row (RX_Q5_0, x, buf, 32), 0);   /* unsupported */
    cr_assert_eq (rx_quantize_row (RX_Q8_0, NULL, buf, 32), 0);
    cr_assert_eq (rx_quantize_row (RX_Q8_0, x, buf, 0), 0);
    cr_assert_eq (rx_quantize_row (77, x, buf, 32), 0);
    cr_assert_eq (rx_dequantize_row (RX_Q8_0, buf, y, 31), RX_EINVAL);
    cr_assert_eq (rx_dequantize_row (RX_Q2_K, buf, y, 256), RX_EINVAL);
    cr_assert_eq (rx_dequantize_row (RX_Q8_0, NULL, y, 32), RX_EINVAL);
    cr_assert_eq (rx_quant_supported (RX_Q6_K), 1);
    cr_assert_eq (rx_quant_supported (RX_Q3_K), 0);
    cr_assert_eq (rx_quantize_row (RX_Q6_K, x, buf, 256), 210);
    cr_assert_eq (rx_quantize_row (RX_Q8_K, x, buf, 256), 292);
}

static const int s_wtypes[] = { RX_F32, RX_F16, RX_BF16, RX_Q8_0, RX_Q4_0, RX_Q4_1,
                                RX_Q4_K, RX_Q5_K, RX_Q6_K };
#define S_NW (sizeof s_wtypes / sizeof s_wtypes[0])

/* Dequantize agrees with the independent decoder, on quantized data and on
 * random bytes (every bit pattern of quants and packed scales). */
Test (quant, dequant_matches_independent_decoder)
{
    const size_t n = 512;
    for (size_t ti = 0; ti < S_NW; ti++) {
        int t = s_wtypes[ti];
        size_t rb = rx_dtype_row_bytes (t, n);
        uint8_t *blk = malloc (rb);
        float *y = malloc (n * sizeof *y);
        for (int rep = 0; rep < 2; rep++) {
            if (rep == 0) {
                float *x = s_randv (n, 1.f);
                rx_quantize_row (t, x, blk, n);
                free (x);
            } else {
                for (size_t i = 0; i < rb; i++) blk[i] = (uint8_t) s_next ();
                /* keep fp16 scales finite and moderate */
                size_t bs = rx_dtype_bytes (t), nb = rb / bs;
                for (size_t b = 0; b < nb && s_is_q (t); b++) {
                    uint8_t *p = blk + b * bs;
                    size_t offs[2] = { 0, 2 };
                    size_t cnt = (t == RX_Q4_1 || t == RX_Q4_K || t == RX_Q5_K) ? 2 : 1;
                    if (t == RX_Q6_K) offs[0] = 208;
                    for (size_t k = 0; k < cnt; k++) {
                        uint16_t h = rx_fp32_to_fp16 (s_gauss ());
                        p[offs[k]] = (uint8_t) h;
                        p[offs[k] + 1] = (uint8_t) (h >> 8);
                    }
                }
                if (!s_is_q (t)) {   /* finite floats */
                    float *x = s_randv (n, 3.f);
                    rx_quantize_row (t, x, blk, n);
                    free (x);
                }
            }
            cr_assert_eq (rx_dequantize_row (t, blk, y, n), RX_OK);
            for (size_t i = 0; i < n; i++) {
                double r = t_deq (t, blk, i);
                cr_assert_leq (fabs (y[i] - r), 1e-6 * t_mag (t, blk, i) + 1e-30,
                               "%s rep %d element %zu: %g vs %g", rx_dtype_name (t), rep, i,
                               (double) y[i], r);
            }
        }
        free (blk);
        free (y);
    }
}

/* Round-trip error: per-element bounds where the format fixes them (half a
 * step), relative RMS bounds for the K-quants. */
Test (quant, roundtrip_error_bounds)
{
    const size_t n = 256 * 16;
    float *x = s_randv (n, 1.f);
    float *y = malloc (n * sizeof *y);
    uint8_t *q = malloc (rx_dtype_row_bytes (RX_F32, n));
    struct { int t; double rms; } k[] = {
        { RX_Q4_K, 0.10 }, { RX_Q5_K, 0.05 }, { RX_Q6_K, 0.025 }, { RX_Q8_K, 0.01 },
    };
    for (size_t ti = 0; ti < S_NW; ti++) {
        int t = s_wtypes[ti];
        cr_assert_eq (rx_quantize_row (t, x, q, n), rx_dtype_row_bytes (t, n));
        cr_assert_eq (rx_dequantize_row (t, q, y, n), RX_OK);
        for (size_t b = 0; b < n / 32; b++) {
            float amax = 0, mn = INFINITY, mx = -INFINITY;
            for (int i = 0; i < 32; i++) {
                float v = x[b * 32 + i];
                amax = fmaxf (amax, fabsf (v));
                mn = fminf (mn, v);
                mx = fmaxf (mx, v);
            }
            double bound;
            switch (t) {
            case RX_F32: bound = 0; break;
            case RX_F16: bound = amax * 0x1p-11; break;
            case RX_BF16: bound = amax * 0x1p-8; break;
            case RX_Q8_0: bound = amax / 127 * 0.5 * 1.002 + amax * 1e-3; break;
            case RX_Q4_0: bound = amax / 8 * 1.01 + amax * 2e-3; break;   /* -max clamps to 7d */
            case RX_Q4_1: bound = (mx - mn) / 15 * 0.5 * 1.01 + (mx - mn) * 2e-3; break;
            default: bound = INFINITY;
            }
            for (int i = 0; i < 32; i++)
                cr_assert_leq (fabs ((double) y[b * 32 + i] - x[b * 32 + i]), bound,
                               "%s block %zu elem %d", rx_dtype_name (t), b, i);
        }
    }
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        cr_assert_eq (rx_quantize_row (k[i].t, x, q, n), rx_dtype_row_bytes (k[i].t, n));
        cr_assert_eq (rx_dequantize_row (k[i].t, q, y, n), RX_OK);
        double se = 0, sx = 0;
        for (size_t j = 0; j < n; j++) {
            se += (y[j] - x[j]) * (double) (y[j] - x[j]);
            sx += x[j] * (double) x[j];
        }
        cr_assert_lt (sqrt (se / sx), k[i].rms, "%s relative rms %g", rx_dtype_name (k[i].t),
                      sqrt (se / sx));
    }
    /* An all-zero row stays zero (no NaN from 0/0). */
    memset (x, 0, 256 * sizeof *x);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        rx_quantize_row (k[i].t, x, q, 256);
        rx_dequantize_row (k[i].t, q, y, 256);
        for (int j = 0; j < 256; j++) cr_assert_eq (y[j], 0.f);
    }
    free (x);
    free (y);
    free (q);
}

/* rx_quantize_row reproduces llama.cpp's reference quantizer byte for byte:
 * tiny-llama-q8/q4 were made by llama.cpp from tiny-llama's weights. */
static void s_check_file_quant (const char *qname, int qtype)
{
    TU_REQUIRE_SHARED ();
    struct rx_err err = { 0 };
    char *bp = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf");
    char *qp = tu_path (tu_env ("RADIX_SHARED"), qname);
    rx_gguf_t *base = rx_gguf_open (bp, &err);
    cr_assert_not_null (base, "%s", err.msg);
    rx_gguf_t *quant = rx_gguf_open (qp, &err);
    cr_assert_not_null (quant, "%s", err.msg);
    int checked = 0;
    for (size_t i = 0; i < rx_gguf_tensor_count (quant); i++) {
        const struct rx_gguf_tensor *tq = rx_gguf_tensor (quant, i);
        if (tq->type != qtype) continue;
        const struct rx_gguf_tensor *tb = rx_gguf_find_tensor (base, tq->name);
        cr_assert_not_null (tb, "%s", tq->name);
        cr_assert (tb->type == RX_F32 || tb->type == RX_F16);
        size_t in = (size_t) tb->ne[0], rows = (size_t) (tb->n_elements / in);
        size_t rb = rx_dtype_row_bytes (qtype, in);
        float *x = malloc (in * sizeof *x);
        uint8_t *q = malloc (rb);
        for (size_t r = 0; r < rows; r++) {
            const uint8_t *src = (const uint8_t *) tb->data + r * rx_dtype_row_bytes (tb->type, in);
            cr_assert_eq (rx_dequantize_row (tb->type, src, x, in), RX_OK);
            cr_assert_eq (rx_quantize_row (qtype, x, q, in), rb);
            cr_assert (memcmp (q, (const uint8_t *) tq->data + r * rb, rb) == 0,
                       "%s %s row %zu differs from llama.cpp", qname, tq->name, r);
        }
        free (x);
        free (q);
        checked++;
    }
    cr_assert_geq (checked, 2, "%s: only %d %s tensors", qname, checked, rx_dtype_name (qtype));
    rx_gguf_close (&base);
    rx_gguf_close (&quant);
    free (bp);
    free (qp);
}

Test (quant, q8_0_matches_llama_cpp_file) { s_check_file_quant ("data/models/tiny-llama-q8.gguf", RX_Q8_0); }
Test (quant, q4_0_matches_llama_cpp_file) { s_check_file_quant ("data/models/tiny-llama-q4.gguf", RX_Q4_0); }

/* ===================================================== backend basics -- */

Test (kcpu, info_memory_streams_graphs)
{
    void *be = s_create ("auto", 2);
    struct rx_kernels_info info;
    memset (&info, 0, sizeof info);
    info.struct_size = sizeof info;
    cr_assert_eq (K->info (be, &info), RX_OK);
    cr_assert_str_eq (info.name, "cpu");
    cr_assert (info.caps & RX_KCAP_HOST_VISIBLE);
    cr_assert_eq (info.caps & (RX_KCAP_GRAPHS | RX_KCAP_ASYNC), 0);
    cr_assert_eq (info.threads, 2);
    cr_assert_gt (info.mem_bytes, 0);
    cr_assert (strstr (info.device, "2 threads"), "%s", info.device);

    struct rx_err err = { 0 };
    void *d = NULL, *d2 = NULL;
    cr_assert_eq (K->alloc (be, 1000, 0, &d, &err), RX_OK);
    cr_assert_eq ((uintptr_t) d % 64, 0);
    cr_assert_eq (K->alloc (be, 100, 4096, &d2, &err), RX_OK);
    cr_assert_eq ((uintptr_t) d2 % 4096, 0);
    cr_assert_eq (K->alloc (be, 100, 48, &d2, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "power of two"), "%s", err.msg);
    rx_kstream_t *s = NULL;
    cr_assert_eq (K->stream_create (be, &s, &err), RX_OK);
    char host[1000], back[1000];
    for (int i = 0; i < 1000; i++) host[i] = (char) i;
    cr_assert_eq (K->copy_h2d (be, s, d, host, 1000, &err), RX_OK);
    cr_assert_eq (K->memset_ (be, s, (char *) d + 10, 7, 5, &err), RX_OK);
    cr_assert_eq (K->copy_d2d (be, s, (char *) d + 500, d, 100, &err), RX_OK);
    cr_assert_eq (K->copy_d2h (be, s, back, d, 1000, &err), RX_OK);
    cr_assert_eq (K->synchronize (be, s, &err), RX_OK);
    for (int i = 0; i < 1000; i++) {
        char want = (i >= 10 && i < 15) ? 7 : (i >= 500 && i < 600) ? (i - 500 >= 10 && i - 500 < 15 ? 7 : (char) (i - 500)) : (char) i;
        cr_assert_eq (back[i], want, "byte %d", i);
    }
    cr_assert_eq (K->copy_h2d (be, s, NULL, host, 4, &err), RX_EINVAL);
    rx_kstream_t *bogus = (rx_kstream_t *) host;
    memset (host, 0, 16);
    cr_assert_eq (K->synchronize (be, bogus, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "stream"), "%s", err.msg);

    /* Graph hooks: RX_ENOTSUP means "run eagerly". */
    cr_assert_eq (K->graph_begin (be, s, 42, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "eagerly"), "%s", err.msg);
    cr_assert_eq (K->graph_end (be, s, 42, &err), RX_ENOTSUP);
    cr_assert_eq (K->graph_launch (be, s, 42, &err), RX_ENOTSUP);
    cr_assert_eq (K->graph_has (be, 42), 0);
    K->stream_destroy (be, s);
    K->free_ (be, d);
    K->free_ (be, host + 64);   /* foreign pointer: logged, ignored */
    K->free_ (be, NULL);
    /* d2 and a weight left allocated on purpose: destroy frees them. */
    float w[64] = { 0 };
    s_weight (be, RX_F32, w, 32, 2, 1);
    K->destroy (be);
    K->destroy (NULL);
}

/* [kernels.cpu] graphs: ops issued during a capture are recorded, not
 * run; a launch runs them on the device memory of launch time with the
 * arguments of capture time; what a graph cannot hold fails and drops the
 * capture; frees drop every graph (graph.h). */
Test (kcpu, emulated_graphs)
{
    void *be = s_create_x ("auto", 1, "graphs = true\n");
    struct rx_kernels_info info;
    memset (&info, 0, sizeof info);
    info.struct_size = sizeof info;
    cr_assert_eq (K->info (be, &info), RX_OK);
    cr_assert (info.caps & RX_KCAP_GRAPHS, "reports graphs");
    struct rx_err err = { 0 };
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float) i;
    float *dx = NULL, *dy = NULL, *dz = NULL;
    cr_assert_eq (K->alloc (be, sizeof x, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof x, 0, (void **) &dy, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
    cr_assert_eq (K->memset_ (be, NULL, dy, 0, sizeof y, &err), RX_OK);
    /* y = 2x; y *= 3 (in place): recorded, not run. */
    cr_assert_eq (K->graph_begin (be, NULL, 7, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->graph_begin (be, NULL, 8, &err), RX_EINVAL, "one capture at a time");
    cr_assert_eq (K->scale (be, NULL, dx, 64, dy, 64, 1, 64, 2.f, &err), RX_OK);
    cr_assert_eq (K->scale (be, NULL, dy, 64, dy, 64, 1, 64, 3.f, &err), RX_OK);
    cr_assert_eq (K->graph_has (be, 7), 0, "not before graph_end");
    cr_assert_eq (K->graph_end (be, NULL, 7, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, y, dy, sizeof y, &err), RX_OK);
    for (int i = 0; i < 64; i++) cr_assert_eq (y[i], 0.f, "capture ran nothing");
    cr_assert (K->graph_has (be, 7));
    cr_assert_eq (K->graph_launch (be, NULL, 7, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, y, dy, sizeof y, &err), RX_OK);
    for (int i = 0; i < 64; i++) cr_assert_eq (y[i], 6.f * (float) i);
    /* The replay reads device memory as it is at launch. */
    for (int i = 0; i < 64; i++) x[i] = (float) (100 - i);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
    cr_assert_eq (K->graph_launch (be, NULL, 7, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, y, dy, sizeof y, &err), RX_OK);
    for (int i = 0; i < 64; i++) cr_assert_eq (y[i], 6.f * (float) (100 - i));
    /* Parameter structs are copied at capture: the caller's may change. */
    struct rx_rope_params rp = { .struct_size = sizeof rp, .mode = RX_ROPE_NORMAL, .n_rot = 64,
                                 .n_ctx_orig = 4096, .freq_base = 10000.f, .freq_scale = 1.f,
                                 .attn_factor = 1.f, .beta_fast = 32.f, .beta_slow = 1.f };
    int32_t pos = 5, *dpos = NULL;
    cr_assert_eq (K->alloc (be, sizeof pos, 0, (void **) &dpos, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dpos, &pos, sizeof pos, &err), RX_OK);
    float want[64];
    cr_assert_eq (K->copy_d2d (be, NULL, dy, dx, sizeof x, &err), RX_OK);
    cr_assert_eq (K->rope (be, NULL, dy, 64, 1, 1, 64, dpos, &rp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, want, dy, sizeof want, &err), RX_OK);
    cr_assert_eq (K->graph_begin (be, NULL, 9, &err), RX_OK);
    cr_assert_eq (K->copy_d2d (be, NULL, dy, dx, sizeof x, &err), RX_OK);
    cr_assert_eq (K->rope (be, NULL, dy, 64, 1, 1, 64, dpos, &rp, &err), RX_OK);
    cr_assert_eq (K->graph_end (be, NULL, 9, &err), RX_OK);
    rp.freq_base = 1.f;   /* too late for graph 9 */
    cr_assert_eq (K->memset_ (be, NULL, dy, 0, sizeof y, &err), RX_OK);
    cr_assert_eq (K->graph_launch (be, NULL, 9, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, y, dy, sizeof y, &err), RX_OK);
    cr_assert (!memcmp (y, want, sizeof y), "rope replayed with the captured params");
    /* What a graph cannot hold: the op fails, the capture is dropped. */
    const char *bad[] = { "synchronize", "copy_d2h", "copy_h2d" };
    for (int k = 0; k < 3; k++) {
        cr_assert_eq (K->graph_begin (be, NULL, 10, &err), RX_OK);
        int rc = k == 0 ? K->synchronize (be, NULL, &err)
               : k == 1 ? K->copy_d2h (be, NULL, y, dy, sizeof y, &err)
                        : K->copy_h2d (be, NULL, dy, y, sizeof y, &err);
        cr_assert_eq (rc, RX_EINVAL, "%s during a capture", bad[k]);
        cr_assert (strstr (err.msg, bad[k]) && strstr (err.msg, "graph 10"), "%s", err.msg);
        cr_assert_eq (K->graph_end (be, NULL, 10, &err), RX_EINVAL, "the capture was dropped");
        cr_assert_eq (K->graph_has (be, 10), 0);
    }
    cr_assert_eq (K->synchronize (be, NULL, &err), RX_OK, "outside a capture: fine");
    /* graph_end of another key drops the capture; unknown keys. */
    cr_assert_eq (K->graph_begin (be, NULL, 11, &err), RX_OK);
    cr_assert_eq (K->graph_end (be, NULL, 12, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "graph 11"), "%s", err.msg);
    cr_assert_eq (K->graph_launch (be, NULL, 11, &err), RX_ENOENT);
    cr_assert_eq (K->graph_launch (be, NULL, 99, &err), RX_ENOENT);
    cr_assert (strstr (err.msg, "capture it again"), "%s", err.msg);
    /* A failing op inside a graph fails its launch. */
    cr_assert_eq (K->graph_begin (be, NULL, 13, &err), RX_OK);
    cr_assert_eq (K->scale (be, NULL, dx, 64, dy, 8, 2, 64, 2.f, &err), RX_OK, "recorded unchecked");
    cr_assert_eq (K->graph_end (be, NULL, 13, &err), RX_OK);
    cr_assert_eq (K->graph_launch (be, NULL, 13, &err), RX_EINVAL, "ldy 8 < dim 64 at replay");
    /* Freeing device memory drops every graph. */
    cr_assert (K->graph_has (be, 7) && K->graph_has (be, 9));
    cr_assert_eq (K->alloc (be, 16, 0, (void **) &dz, &err), RX_OK);
    K->free_ (be, dz);
    cr_assert_eq (K->graph_has (be, 7) + K->graph_has (be, 9), 0, "dropped by free_");
    /* More graphs than kept (64): the least recently used go first. */
    for (uint64_t g = 100; g < 100 + 70; g++) {
        cr_assert_eq (K->graph_begin (be, NULL, g, &err), RX_OK);
        cr_assert_eq (K->scale (be, NULL, dx, 64, dy, 64, 1, 64, 1.f, &err), RX_OK);
        cr_assert_eq (K->graph_end (be, NULL, g, &err), RX_OK);
        if (g == 150) cr_assert_eq (K->graph_launch (be, NULL, 100, &err), RX_OK, "keep 100 fresh");
    }
    cr_assert (K->graph_has (be, 100), "recently launched: kept");
    cr_assert_eq (K->graph_has (be, 101), 0, "least recently used: dropped");
    cr_assert (K->graph_has (be, 169));
    K->free_ (be, dx);
    K->free_ (be, dy);
    K->free_ (be, dpos);
    /* A capture left open at destroy is released (valgrind/ASan: no leak). */
    cr_assert_eq (K->graph_begin (be, NULL, 200, &err), RX_OK);
    cr_assert_eq (K->scale (be, NULL, dx, 64, dx, 64, 1, 64, 1.f, &err), RX_OK);
    K->destroy (be);
}

Test (kcpu, create_errors)
{
    struct rx_err err = { 0 };
    int rc;
    void *be = s_create_rc ("avx9", 1, NULL, &rc, &err);
    cr_assert_null (be);
    cr_assert_neq (rc, RX_OK);
    cr_assert (strstr (err.msg, "isa"), "%s", err.msg);
    be = s_create_rc ("auto", 1, "weights = shared\n", &rc, &err);
    cr_assert_null (be);
    cr_assert_eq (rc, RX_ECONFIG, "%s", err.msg);
    cr_assert (strstr (err.msg, "weights"), "%s", err.msg);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = -1 };
    cr_assert_eq (K->create (NULL, &p, &be, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "threads"), "%s", err.msg);
    p.threads = 1;
    p.device = 3;
    cr_assert_eq (K->create (NULL, &p, &be, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "device"), "%s", err.msg);
    /* NULL host and params: defaults (all cores, auto isa). */
    cr_assert_eq (K->create (NULL, NULL, &be, &err), RX_OK, "%s", err.msg);
    K->destroy (be);
    for (size_t i = 0; i < 3; i++) s_isa_ok (s_isas[i]);
}

Test (kcpu, weight_load_errors)
{
    void *be = s_create ("auto", 1);
    struct rx_err err = { 0 };
    uint8_t buf[4096] = { 0 };
    rx_kweight_t *w = NULL;
    struct rx_weight_view v = { .name = "blk.0.x", .dtype = RX_Q8_0, .n_dims = 2,
                                .ne = { 64, 4, 1, 1 }, .data = buf, .nbytes = 4 * 68 };
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_OK, "%s", err.msg);
    K->weight_free (be, w);
    v.nbytes = 4 * 68 - 1;
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "blk.0.x") && strstr (err.msg, "bytes"), "%s", err.msg);
    v.nbytes = 4 * 68;
    v.ne[0] = 48;
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "multiple"), "%s", err.msg);
    v.ne[0] = 64;
    v.dtype = RX_Q5_0;
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "q5_0"), "%s", err.msg);
    v.dtype = RX_Q8_0;
    v.data = NULL;
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_EINVAL);
    v.data = buf;
    v.n_dims = 5;
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_EINVAL);
    v.n_dims = 2;
    v.ne[2] = 2;   /* beyond n_dims must be 1 */
    cr_assert_eq (K->weight_load (be, &v, &w, &err), RX_EINVAL);
    /* weight_data: plain types only */
    float f[32] = { 1 };
    rx_kweight_t *wf = s_weight (be, RX_F32, f, 32, 1, 1);
    const void *dp = NULL;
    cr_assert_eq (K->weight_data (be, wf, &dp, &err), RX_OK);
    cr_assert_eq (((const float *) dp)[0], 1.f);
    v.ne[2] = 1;
    v.data = buf;
    rx_kweight_t *wq = NULL;
    cr_assert_eq (K->weight_load (be, &v, &wq, &err), RX_OK);
    cr_assert_eq (K->weight_data (be, wq, &dp, &err), RX_ENOTSUP);
    K->weight_free (be, wq);
    K->weight_free (be, (rx_kweight_t *) buf);   /* not a weight: logged, ignored */
    K->destroy (be);
}

/* ============================================================ matmul -- */

/* Reference Y[t][r] for one (expert) matrix: exact-integer form (quantized
 * activations, as llama.cpp) and plain float form; mag = sum |terms|. */
static void s_ref_matmul (int dtype, const uint8_t *w, size_t in, size_t out, const float *x,
                          size_t ldx, size_t n, double *yq, double *yf, double *mag, double *rms)
{
    size_t rb = rx_dtype_row_bytes (dtype, in);
    double *dx = malloc ((in / 32 + 1) * sizeof *dx);
    int *qx = malloc (in * sizeof *qx);
    double *wd = malloc (in * sizeof *wd);
    for (size_t t = 0; t < n; t++) {
        const float *xt = x + t * ldx;
        if (s_is_k (dtype)) t_q8k (xt, in, dx, qx);
        else if (s_is_q (dtype)) t_q8 (xt, in, dx, qx);
        for (size_t r = 0; r < out; r++) {
            for (size_t i = 0; i < in; i++) wd[i] = t_deq (dtype, w + r * rb, i);
            double sq = 0, sf = 0, m = 0, m2 = 0;
            for (size_t i = 0; i < in; i++) {
                sf += wd[i] * xt[i];
                m2 += wd[i] * xt[i] * wd[i] * xt[i];
                if (s_is_q (dtype)) {
                    double term = wd[i] * qx[i] * dx[i / (s_is_k (dtype) ? 256 : 32)];
                    sq += term;
                    m += fabs (term);
                } else {
                    m += fabs (wd[i] * xt[i]);
                }
            }
            yq[t * out + r] = s_is_q (dtype) ? sq : sf;
            yf[t * out + r] = sf;
            rms[t * out + r] = sqrt (m2);
            mag[t * out + r] = m;
        }
    }
    free (dx);
    free (qx);
    free (wd);
}

struct s_shape { size_t in, out, n; };

static void s_check_matmul (void *be, const char *tag, int dtype, const struct s_shape *sh,
                            int n_expert, int accumulate)
{
    const size_t in = sh->in, out = sh->out, n = sh->n;
    const size_t ldx = in + 3, ldy = out + 5;
    uint8_t *w = s_rand_weights (dtype, in, out * (size_t) n_expert);
    rx_kweight_t *kw = s_weight (be, dtype, w, in, out, (uint64_t) n_expert);
    float *x = s_randv (n * ldx, 1.f);
    float *y = malloc (n * ldy * sizeof *y);
    double *yq = malloc (n * out * sizeof *yq), *yf = malloc (n * out * sizeof *yf);
    double *mag = malloc (n * out * sizeof *mag), *rms = malloc (n * out * sizeof *rms);
    for (int e = 0; e < n_expert; e++) {
        const int expert = n_expert > 1 ? e : -1;
        for (size_t i = 0; i < n * ldy; i++) y[i] = accumulate ? (float) (i % 13) - 6.f : NAN;
        struct rx_err err = { 0 };
        cr_assert_eq (K->matmul (be, NULL, kw, expert, x, ldx, y, ldy, n,
                                 accumulate ? RX_MM_ACCUMULATE : 0, &err), RX_OK, "%s", err.msg);
        const uint8_t *we = w + (size_t) e * out * rx_dtype_row_bytes (dtype, in);
        s_ref_matmul (dtype, we, in, out, x, ldx, n, yq, yf, mag, rms);
        for (size_t t = 0; t < n; t++) {
            for (size_t r = 0; r < out; r++) {
                double base = accumulate ? (double) ((t * ldy + r) % 13) - 6.0 : 0.0;
                double got = y[t * ldy + r] - base;
                double tol = 2e-6 * mag[t * out + r] + 1e-6;
                if (dtype == RX_F16 || dtype == RX_BF16 || dtype == RX_F32) tol = 1e-5 * mag[t * out + r] + 1e-6;
                cr_assert_leq (fabs (got - yq[t * out + r]), tol,
                               "%s %s in=%zu out=%zu n=%zu expert=%d: y[%zu][%zu] = %.7g, ref %.7g",
                               tag, rx_dtype_name (dtype), in, out, n, expert, t, r, got,
                               yq[t * out + r]);
                /* Loosely: the float product with dequantized weights (the
                 * activation quantization error is well under 5% of the
                 * root-sum-square of the terms). */
                cr_assert_leq (fabs (got - yf[t * out + r]), 0.05 * rms[t * out + r] + 1e-6,
                               "%s %s: y[%zu][%zu] = %g, float product %g", tag,
                               rx_dtype_name (dtype), t, r, got, yf[t * out + r]);
            }
            /* padding between rows is untouched */
            for (size_t r = out; r < ldy && t + 1 < n; r++)
                cr_assert (accumulate ? y[t * ldy + r] == (float) ((t * ldy + r) % 13) - 6.f
                                      : isnan (y[t * ldy + r]), "%s wrote past out", tag);
        }
    }
    K->weight_free (be, kw);
    free (w);
    free (x);
    free (y);
    free (yq);
    free (yf);
    free (mag);
    free (rms);
}

Test (kcpu, matmul_every_dtype_every_isa, .timeout = 300)
{
    static const struct s_shape s32[] = {
        { 32, 1, 1 }, { 96, 5, 1 }, { 224, 17, 3 }, { 64, 70, 5 }, { 160, 33, 9 },
        { 960, 19, 2 }, { 1600, 6, 1 },   /* 30 and 50 blocks: groups of 16 plus a tail */
    };
    static const struct s_shape s256[] = { { 256, 3, 1 }, { 512, 21, 4 }, { 768, 9, 6 } };
    static const struct s_shape sf[] = {
        { 5, 3, 1 }, { 17, 9, 2 }, { 33, 20, 5 }, { 64, 37, 1 }, { 100, 8, 7 },
    };
    int threads[] = { 1, 2, 3 };
    for (size_t ii = 0; ii < S_NCFG; ii++) {
        if (!s_isa_ok (s_cfgs[ii].isa)) continue;
        for (size_t th = 0; th < 3; th++) {
            void *be = s_create_x (s_cfgs[ii].isa, threads[th], s_cfgs[ii].extra);
            char tag[96];
            snprintf (tag, sizeof tag, "isa=%s %s threads=%d", s_cfgs[ii].isa,
                      s_cfgs[ii].extra ? s_cfgs[ii].extra : "", threads[th]);
            for (size_t ti = 0; ti < S_NW; ti++) {
                int t = s_wtypes[ti];
                const struct s_shape *sh = s_is_k (t) ? s256 : s_is_q (t) ? s32 : sf;
                size_t ns = s_is_k (t) ? 3 : s_is_q (t) ? 7 : 5;
                for (size_t si = 0; si < ns; si++)
                    s_check_matmul (be, tag, t, &sh[si], 1, (int) (si % 2));
                s_check_matmul (be, tag, t, &sh[1], 3, 0);   /* 3-D expert weights */
            }
            K->destroy (be);
        }
    }
}

/* The SIMD paths agree with the scalar path closely on a decode-sized case. */
Test (kcpu, matmul_paths_agree, .timeout = 120)
{
    const size_t in = 1024, out = 77;
    float *x = s_randv (in * 4, 1.f);
    for (size_t ti = 0; ti < S_NW; ti++) {
        int t = s_wtypes[ti];
        uint8_t *w = s_rand_weights (t, in, out);
        float ys[4 * 77], yv[4 * 77];
        void *sc = s_create ("scalar", 1);
        rx_kweight_t *ws = s_weight (sc, t, w, in, out, 1);
        cr_assert_eq (K->matmul (sc, NULL, ws, -1, x, in, ys, out, 4, 0, NULL), RX_OK);
        for (size_t ii = 1; ii < S_NCFG; ii++) {
            if (!s_isa_ok (s_cfgs[ii].isa)) continue;
            void *be = s_create_x (s_cfgs[ii].isa, 2, s_cfgs[ii].extra);
            rx_kweight_t *wv = s_weight (be, t, w, in, out, 1);
            cr_assert_eq (K->matmul (be, NULL, wv, -1, x, in, yv, out, 4, 0, NULL), RX_OK);
            for (size_t i = 0; i < 4 * out; i++)
                cr_assert_leq (fabsf (yv[i] - ys[i]), 2e-5f * (fabsf (ys[i]) + 1.f),
                               "%s %s %s [%zu]: %g vs scalar %g", s_cfgs[ii].isa,
                               s_cfgs[ii].extra ? s_cfgs[ii].extra : "", rx_dtype_name (t), i,
                               (double) yv[i], (double) ys[i]);
            K->destroy (be);
        }
        K->destroy (sc);
        free (w);
    }
    free (x);
}

/* Many activation rows (prompt processing): F32/F16/BF16 take the packed
 * outer-product GEMM on AVX-512 from 16 rows up.  Cover token counts on
 * both sides of that and of its 12-token micro-tile, weight-row panels of
 * 32 with tails (and 3 threads splitting them), column panels of 192 with
 * odd and even tails (the 16-bit types pack two columns per gather), and
 * ld != width on both sides (s_check_matmul pads x and y rows). */
Test (kcpu, matmul_float_many_tokens, .timeout = 300)
{
    static const struct s_shape sh[] = {
        { 1, 5, 16 }, { 2, 96, 16 }, { 17, 3, 20 }, { 64, 65, 48 }, { 385, 70, 31 },
        { 200, 33, 512 }, { 193, 37, 24 },
    };
    static const int ft[] = { RX_F16, RX_F32, RX_BF16 };
    const char *cf[] = { "avx512", "avx2", "scalar" };
    for (size_t ci = 0; ci < 3; ci++) {
        if (!s_isa_ok (cf[ci])) continue;
        for (int th = 1; th <= 3; th += 2) {
            void *be = s_create (cf[ci], th);
            char tag[64];
            snprintf (tag, sizeof tag, "isa=%s threads=%d", cf[ci], th);
            for (size_t ti = 0; ti < 3; ti++) {
                for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++)
                    s_check_matmul (be, tag, ft[ti], &sh[si], 1, (int) (si % 2));
                /* n = 1..17 over two column panels with an odd tail */
                if (ci == 0 || ti == 0)
                    for (size_t n = 1; n <= 17; n++) {
                        const struct s_shape s = { 193, 37, n };
                        s_check_matmul (be, tag, ft[ti], &s, 1, (int) (n % 2));
                    }
                s_check_matmul (be, tag, ft[ti], &sh[3], 3, 1);   /* 3-D expert weights */
            }
            K->destroy (be);
        }
    }
}

/* Small activations are quantized once and reused by the next matmuls of
 * equal rows (Q/K/V, gate/up): a result must never depend on what ran
 * before.  Each product is checked against a fresh instance (empty cache):
 * the same x for two weights and two dtypes, x changed in place at its
 * last element (same pointer), the same rows at another ldx, another n. */
Test (kcpu, matmul_quantized_activation_reuse)
{
    const size_t in = 96, out = 21, n = 3, ldx = 100;
    const int dt[] = { RX_Q4_0, RX_Q4_0, RX_Q8_0, RX_Q4_1, RX_Q4_0 };
    uint8_t *wd[5];
    float *x = s_randv (n * ldx, 1.f), *x2 = s_randv (n * 200, 1.f);
    for (int i = 0; i < 5; i++) wd[i] = s_rand_weights (dt[i], in, out);
    for (size_t ci = 0; ci < S_NCFG; ci++) {
        if (!s_isa_ok (s_cfgs[ci].isa)) continue;
        void *be = s_create_x (s_cfgs[ci].isa, 2, s_cfgs[ci].extra);
        rx_kweight_t *kw[5];
        for (int i = 0; i < 5; i++) kw[i] = s_weight (be, dt[i], wd[i], in, out, 1);
        for (int step = 0; step < 9; step++) {
            const int wi = step % 5;
            const float *xs = x;
            size_t lds = ldx, ns = n;
            if (step == 5) x[(n - 1) * ldx + in - 1] += 0.75f;   /* in place, last element */
            if (step == 6 || step == 7) {                        /* same rows, other ldx */
                for (size_t t = 0; t < n; t++) memcpy (x2 + t * 200, x + t * ldx, in * sizeof (float));
                xs = x2;
                lds = 200;
            }
            if (step == 8) ns = 2;
            float y[3 * 21], yr[3 * 21];
            struct rx_err err = { 0 };
            cr_assert_eq (K->matmul (be, NULL, kw[wi], -1, xs, lds, y, out, ns, 0, &err), RX_OK, "%s", err.msg);
            void *fresh = s_create_x (s_cfgs[ci].isa, 1, s_cfgs[ci].extra);
            rx_kweight_t *fw = s_weight (fresh, dt[wi], wd[wi], in, out, 1);
            cr_assert_eq (K->matmul (fresh, NULL, fw, -1, xs, lds, yr, out, ns, 0, &err), RX_OK, "%s", err.msg);
            for (size_t i = 0; i < ns * out; i++)
                cr_assert_eq (y[i], yr[i], "%s step %d [%zu]: %.9g, fresh instance %.9g",
                              s_cfgs[ci].isa, step, i, (double) y[i], (double) yr[i]);
            K->weight_free (fresh, fw);
            K->destroy (fresh);
        }
        for (int i = 0; i < 5; i++) K->weight_free (be, kw[i]);
        K->destroy (be);
    }
    for (int i = 0; i < 5; i++) free (wd[i]);
    free (x);
    free (x2);
}

Test (kcpu, matmul_errors)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    uint8_t *w = s_rand_weights (RX_Q8_0, 64, 8 * 2);
    rx_kweight_t *w2 = s_weight (be, RX_Q8_0, w, 64, 8, 1);
    rx_kweight_t *w3 = s_weight (be, RX_Q8_0, w, 64, 8, 2);
    float x[2 * 64] = { 0 }, y[2 * 8];
    cr_assert_eq (K->matmul (be, NULL, w2, -1, x, 63, y, 8, 2, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "ldx"), "%s", err.msg);
    cr_assert_eq (K->matmul (be, NULL, w2, -1, x, 64, y, 7, 2, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "ldy"), "%s", err.msg);
    cr_assert_eq (K->matmul (be, NULL, w2, 1, x, 64, y, 8, 1, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "expert"), "%s", err.msg);
    cr_assert_eq (K->matmul (be, NULL, w3, 2, x, 64, y, 8, 1, 0, &err), RX_EINVAL);
    cr_assert_eq (K->matmul (be, NULL, w3, -1, x, 64, y, 8, 1, 0, &err), RX_EINVAL);
    cr_assert_eq (K->matmul (be, NULL, w2, -1, NULL, 64, y, 8, 1, 0, &err), RX_EINVAL);
    cr_assert_eq (K->matmul (be, NULL, w2, -1, x, 64, y, 8, 1, 0x80, &err), RX_EINVAL);
    cr_assert_eq (K->matmul (be, NULL, (rx_kweight_t *) x, -1, x, 64, y, 8, 1, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "weight"), "%s", err.msg);
    cr_assert_eq (K->matmul (be, NULL, w2, -1, x, 64, y, 8, 0, 0, &err), RX_OK);   /* n = 0 */
    float one[32] = { 0 };
    rx_kweight_t *w1 = NULL;
    struct rx_weight_view v = { .dtype = RX_F32, .n_dims = 1, .ne = { 32, 1, 1, 1 },
                                .data = one, .nbytes = sizeof one };
    cr_assert_eq (K->weight_load (be, &v, &w1, &err), RX_OK);
    cr_assert_eq (K->matmul (be, NULL, w1, -1, x, 64, y, 8, 1, 0, &err), RX_EINVAL);   /* 1-D */
    K->destroy (be);
    free (w);
}

/* ======================================================== row ops -- */

Test (kcpu, get_rows_every_dtype)
{
    const size_t rows = 9;
    int32_t ids[5] = { 8, 0, 3, 3, 7 };
    for (size_t ii = 0; ii < S_NCFG; ii++) {
        if (!s_isa_ok (s_cfgs[ii].isa)) continue;
        void *be = s_create_x (s_cfgs[ii].isa, 2, s_cfgs[ii].extra);
        for (size_t ti = 0; ti < S_NW; ti++) {
            int t = s_wtypes[ti];
            const size_t in = s_is_k (t) ? 512 : 480;   /* 480: 15 blocks, a partial group */
            uint8_t *w = s_rand_weights (t, in, rows);
            rx_kweight_t *kw = s_weight (be, t, w, in, rows, 1);
            float out[5 * 520];
            struct rx_err err = { 0 };
            cr_assert_eq (K->get_rows (be, NULL, kw, ids, 5, out, 520, &err), RX_OK, "%s", err.msg);
            size_t rb = rx_dtype_row_bytes (t, in);
            for (int r = 0; r < 5; r++)
                for (size_t i = 0; i < in; i++) {
                    double ref = t_deq (t, w + (size_t) ids[r] * rb, i);
                    cr_assert_leq (fabs (out[r * 520 + i] - ref), 1e-6 * t_mag (t, w + (size_t) ids[r] * rb, i) + 1e-30,
                                   "%s row %d [%zu]", rx_dtype_name (t), r, i);
                }
            int32_t bad = 9;
            cr_assert_eq (K->get_rows (be, NULL, kw, &bad, 1, out, 520, &err), RX_EINVAL);
            cr_assert (strstr (err.msg, "id 9"), "%s", err.msg);
            K->weight_free (be, kw);
            free (w);
        }
        K->destroy (be);
    }
}

Test (kcpu, rms_norm_swiglu_elementwise_softmax)
{
    static const size_t dims[] = { 1, 7, 64, 960, 4099 };
    static const size_t rowss[] = { 1, 3, 33 };
    for (size_t ii = 0; ii < 3; ii++) {
        if (!s_isa_ok (s_isas[ii])) continue;
        void *be = s_create (s_isas[ii], 2);
        for (size_t di = 0; di < 5; di++)
            for (size_t ri = 0; ri < 3; ri++) {
                const size_t dim = dims[di], rows = rowss[ri], ld = dim + 2;
                float *a = s_randv (rows * ld, 2.f), *b = s_randv (rows * ld, 1.f);
                float *wn = s_randv (dim, 1.f), *y = malloc (rows * ld * sizeof *y);
                struct rx_err err = { 0 };
                /* rms_norm with and without weight */
                for (int with_w = 0; with_w < 2; with_w++) {
                    cr_assert_eq (K->rms_norm (be, NULL, a, ld, with_w ? wn : NULL, y, ld, rows, dim,
                                               1e-5f, &err), RX_OK, "%s", err.msg);
                    for (size_t r = 0; r < rows; r++) {
                        double ss = 0;
                        for (size_t i = 0; i < dim; i++) ss += (double) a[r * ld + i] * a[r * ld + i];
                        double sc = 1.0 / sqrt (ss / dim + 1e-5);
                        for (size_t i = 0; i < dim; i++) {
                            double ref = a[r * ld + i] * sc * (with_w ? wn[i] : 1.0);
                            cr_assert_leq (fabs (y[r * ld + i] - ref), 1e-5 * fabs (ref) + 1e-6,
                                           "rms_norm dim %zu row %zu [%zu]", dim, r, i);
                        }
                    }
                }
                /* swiglu */
                cr_assert_eq (K->swiglu (be, NULL, a, ld, b, ld, y, ld, rows, dim, &err), RX_OK);
                for (size_t r = 0; r < rows; r++)
                    for (size_t i = 0; i < dim; i++) {
                        double g = a[r * ld + i], ref = g / (1 + exp (-g)) * b[r * ld + i];
                        cr_assert_leq (fabs (y[r * ld + i] - ref), 1e-5 * fabs (ref) + 1e-6, "swiglu");
                    }
                /* add / mul with a broadcast row (ldb = 0) and full */
                for (int bc = 0; bc < 2; bc++) {
                    size_t ldb = bc ? 0 : ld;
                    cr_assert_eq (K->add (be, NULL, a, ld, b, ldb, y, ld, rows, dim, &err), RX_OK);
                    for (size_t r = 0; r < rows; r++)
                        for (size_t i = 0; i < dim; i++)
                            cr_assert_eq (y[r * ld + i], a[r * ld + i] + b[r * ldb + i], "add");
                    cr_assert_eq (K->mul (be, NULL, a, ld, b, ldb, y, ld, rows, dim, &err), RX_OK);
                    for (size_t r = 0; r < rows; r++)
                        for (size_t i = 0; i < dim; i++)
                            cr_assert_eq (y[r * ld + i], a[r * ld + i] * b[r * ldb + i], "mul");
                }
                cr_assert_eq (K->scale (be, NULL, a, ld, y, ld, rows, dim, -0.5f, &err), RX_OK);
                for (size_t r = 0; r < rows; r++)
                    for (size_t i = 0; i < dim; i++) cr_assert_eq (y[r * ld + i], -0.5f * a[r * ld + i]);
                cr_assert_eq (K->sigmoid (be, NULL, a, ld, y, ld, rows, dim, &err), RX_OK);
                for (size_t r = 0; r < rows; r++)
                    for (size_t i = 0; i < dim; i++) {
                        double ref = 1 / (1 + exp (-(double) a[r * ld + i]));
                        cr_assert_leq (fabs (y[r * ld + i] - ref), 1e-6, "sigmoid");
                    }
                cr_assert_eq (K->copy2d (be, NULL, a, ld, y, ld, rows, dim, &err), RX_OK);
                for (size_t r = 0; r < rows; r++)
                    cr_assert (memcmp (y + r * ld, a + r * ld, dim * 4) == 0, "copy2d");
                /* softmax with scale, in place */
                memcpy (y, a, rows * ld * sizeof *y);
                cr_assert_eq (K->softmax (be, NULL, y, ld, rows, dim, 0.7f, &err), RX_OK);
                for (size_t r = 0; r < rows; r++) {
                    double mx = -INFINITY, s = 0;
                    for (size_t i = 0; i < dim; i++) mx = fmax (mx, 0.7 * a[r * ld + i]);
                    for (size_t i = 0; i < dim; i++) s += exp (0.7 * a[r * ld + i] - mx);
                    for (size_t i = 0; i < dim; i++) {
                        double ref = exp (0.7 * a[r * ld + i] - mx) / s;
                        cr_assert_leq (fabs (y[r * ld + i] - ref), 1e-6 * ref + 1e-7, "softmax");
                    }
                }
                free (a);
                free (b);
                free (wn);
                free (y);
            }
        struct rx_err err = { 0 };
        float z[8];
        cr_assert_eq (K->rms_norm (be, NULL, z, 3, NULL, z, 4, 2, 4, 1e-5f, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "ldx"), "%s", err.msg);
        cr_assert_eq (K->add (be, NULL, z, 4, NULL, 4, z, 4, 2, 4, &err), RX_EINVAL);
        cr_assert_eq (K->softmax (be, NULL, z, 4, 2, 0, 1.f, &err), RX_EINVAL);
        K->destroy (be);
    }
}

/* moe_route against a reference written from its definition (rank
 * counting, not the scans the op uses): group scores = sum of the two best,
 * the kept groups, the k best of them in order, weights normalized in
 * double and scaled; ties; the bad-argument messages. */
Test (kcpu, moe_route_groups_ties_weights)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    const size_t rows = 19, nx = 64, ld = 67;
    float *probs = s_randv (rows * ld, 1.f), *sel = s_randv (rows * ld, 1.f);
    for (size_t i = 0; i < rows * ld; i++) probs[i] = fabsf (probs[i]) + 0.01f;
    /* row 0: every sel equal (ties everywhere); row 1: two groups tie */
    for (size_t e = 0; e < nx; e++) sel[e] = 0.5f;
    for (size_t e = 0; e < nx; e++) sel[ld + e] = e / 8 == 2 || e / 8 == 5 ? 1.f : 0.f;
    const struct { size_t g, tg, k; int norm; float scale; } cfgs[] = {
        { 8, 3, 6, 1, 2.5f }, { 8, 1, 4, 0, 1.f }, { 1, 1, 8, 1, 1.f }, { 64, 8, 8, 1, 1.f },
        { 4, 4, 64, 0, 0.5f },
    };
    int32_t *ids = malloc (rows * nx * sizeof *ids);
    float *w = malloc (rows * nx * sizeof *w);
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        const size_t G = cfgs[ci].g, TG = cfgs[ci].tg, KK = cfgs[ci].k, per = nx / G;
        cr_assert_eq (K->moe_route (be, NULL, probs, sel, ld, rows, nx, G, TG, KK, cfgs[ci].norm,
                                    cfgs[ci].scale, ids, w, &err), RX_OK, "%s", err.msg);
        for (size_t r = 0; r < rows; r++) {
            const float *sr = sel + r * ld;
            /* group g is kept iff fewer than TG groups come before it */
            float gs[64];
            for (size_t g = 0; g < G; g++) {
                float a = -INFINITY, b = -INFINITY;
                for (size_t e = g * per; e < (g + 1) * per; e++) {
                    if (sr[e] > a) { b = a; a = sr[e]; } else if (sr[e] > b) b = sr[e];
                }
                gs[g] = per > 1 ? a + b : a;
            }
            int kept[64];
            for (size_t g = 0; g < G; g++) {
                size_t before = 0;
                for (size_t h = 0; h < G; h++) before += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
                kept[g] = G == 1 || before < TG;
            }
            double sum = 0;
            for (size_t j = 0; j < KK; j++) sum += probs[r * ld + (size_t) ids[r * KK + j]];
            for (size_t j = 0; j < KK; j++) {
                const int32_t e = ids[r * KK + j];
                cr_assert (e >= 0 && (size_t) e < nx && kept[e / per], "cfg %zu row %zu: %d", ci, r, e);
                size_t before = 0;   /* kept experts that rank above e */
                for (size_t q = 0; q < nx; q++)
                    before += kept[q / per] && (sr[q] > sr[e] || (sr[q] == sr[e] && q < (size_t) e));
                cr_assert_eq (before, j, "cfg %zu row %zu: choice %zu is expert %d", ci, r, j, e);
                float want = probs[r * ld + (size_t) e];
                if (cfgs[ci].norm) want = (float) (want / sum);
                want *= cfgs[ci].scale;
                cr_assert_eq (w[r * KK + j], want, "cfg %zu row %zu weight %zu", ci, r, j);
            }
        }
        if (ci == 0) {
            for (size_t j = 0; j < KK; j++) cr_assert_eq (ids[j], (int32_t) j, "all equal: the lowest first");
            for (size_t j = 0; j < KK; j++) cr_assert (ids[KK + j] / 8 == 2 || ids[KK + j] / 8 == 5);
        }
    }
    const struct { size_t nx, g, tg, k; const char *want; } bad[] = {
        { 64, 8, 3, 0, "k = 0" }, { 64, 8, 3, 65, "k = 65" }, { 60, 8, 3, 2, "do not split" },
        { 64, 8, 9, 2, "topk_group 9" }, { 64, 8, 1, 9, "fewer than k" }, { 2048, 1, 1, 2, "n_expert 2048" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq (K->moe_route (be, NULL, probs, sel, ld, 1, bad[i].nx, bad[i].g, bad[i].tg, bad[i].k, 1,
                                    1.f, ids, w, &err), RX_EINVAL, "case %zu", i);
        cr_assert (strstr (err.msg, bad[i].want), "case %zu: %s", i, err.msg);
    }
    cr_assert_eq (K->moe_route (be, NULL, probs, sel, 10, 2, nx, 8, 3, 2, 1, 1.f, ids, w, &err), RX_EINVAL,
                  "ld below n_expert");
    cr_assert_eq (K->moe_route (be, NULL, probs, sel, ld, 2, nx, 8, 3, 2, 1, 1.f, NULL, w, &err), RX_EINVAL);
    free (ids);
    free (w);
    free (probs);
    free (sel);
    K->destroy (be);
}

Test (kcpu, argmax_topk)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    const size_t rows = 37, dim = 1000, ld = 1003;
    float *x = s_randv (rows * ld, 1.f);
    /* ties: row 0 has two equal maxima, row 1 is constant */
    x[10] = 9.f;
    x[500] = 9.f;
    for (size_t i = 0; i < dim; i++) x[ld + i] = 0.25f;
    int32_t am[37];
    cr_assert_eq (K->argmax (be, NULL, x, ld, rows, dim, am, &err), RX_OK);
    cr_assert_eq (am[0], 10);
    cr_assert_eq (am[1], 0);
    for (size_t r = 2; r < rows; r++) {
        size_t best = 0;
        for (size_t i = 1; i < dim; i++) if (x[r * ld + i] > x[r * ld + best]) best = i;
        cr_assert_eq ((size_t) am[r], best);
    }
    size_t ks[] = { 1, 2, 40, 1000 };
    for (size_t ki = 0; ki < 4; ki++) {
        size_t k = ks[ki];
        float *vals = malloc (rows * k * sizeof *vals);
        int32_t *idx = malloc (rows * k * sizeof *idx);
        cr_assert_eq (K->topk (be, NULL, x, ld, rows, dim, k, vals, idx, &err), RX_OK);
        for (size_t r = 0; r < rows; r++) {
            /* reference: rank = number of elements that must come first */
            for (size_t j = 0; j < k; j++) {
                int32_t i = idx[r * k + j];
                cr_assert (i >= 0 && (size_t) i < dim);
                cr_assert_eq (vals[r * k + j], x[r * ld + i]);
                size_t rank = 0;
                for (size_t q = 0; q < dim; q++)
                    if (x[r * ld + q] > x[r * ld + i] || (x[r * ld + q] == x[r * ld + i] && q < (size_t) i)) rank++;
                cr_assert_eq (rank, j, "k=%zu row %zu pos %zu", k, r, j);
            }
        }
        free (vals);
        free (idx);
    }
    int32_t idx1[37];
    cr_assert_eq (K->topk (be, NULL, x, ld, rows, dim, 1, NULL, idx1, &err), RX_OK);
    for (size_t r = 0; r < rows; r++) cr_assert_eq (idx1[r], am[r]);
    cr_assert_eq (K->topk (be, NULL, x, ld, rows, dim, 0, NULL, idx1, &err), RX_EINVAL);
    cr_assert_eq (K->topk (be, NULL, x, ld, rows, dim, dim + 1, NULL, idx1, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "k ="), "%s", err.msg);
    free (x);
    K->destroy (be);
}

/* RoPE reference: GGML's definition (theta advanced by repeated float
 * multiplication, YaRN ramp), written out per element. */
static void s_ref_rope (float *x, int n_rot, int mode, int pos, const struct rx_rope_params *p)
{
    float theta_scale = powf (p->freq_base, -2.0f / n_rot);
    float corr0 = floorf (n_rot * logf (p->n_ctx_orig / (p->beta_fast * 2 * (float) M_PI)) / (2 * logf (p->freq_base)));
    float corr1 = ceilf (n_rot * logf (p->n_ctx_orig / (p->beta_slow * 2 * (float) M_PI)) / (2 * logf (p->freq_base)));
    corr0 = fmaxf (0, corr0);
    corr1 = fminf ((float) (n_rot - 1), corr1);
    float theta = (float) pos;
    float *orig = malloc ((size_t) n_rot * sizeof *orig);
    memcpy (orig, x, (size_t) n_rot * sizeof *orig);
    for (int i = 0; i < n_rot / 2; i++) {
        float ff = p->freq_factors ? p->freq_factors[i] : 1.0f;
        float te = theta / ff, ti = p->freq_scale * te, th = ti, ms = p->attn_factor;
        if (p->ext_factor != 0) {
            float y = ((float) i - corr0) / fmaxf (0.001f, corr1 - corr0);
            float ramp = (1 - fminf (1, fmaxf (0, y))) * p->ext_factor;
            th = ti * (1 - ramp) + te * ramp;
            ms *= 1.0f + 0.1f * logf (1.0f / p->freq_scale);
        }
        double c = cos (th) * ms, s = sin (th) * ms;
        int i0 = mode == RX_ROPE_NEOX ? i : 2 * i, i1 = mode == RX_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
        x[i0] = (float) (orig[i0] * c - orig[i1] * s);
        x[i1] = (float) (orig[i0] * s + orig[i1] * c);
        theta *= theta_scale;
    }
    free (orig);
}

Test (kcpu, rope_normal_neox_yarn)
{
    const size_t n_tok = 5, n_head = 3, hd = 48, ld_head = 50, ldx = n_head * ld_head + 4;
    int32_t pos[5] = { 0, 1, 7, 63, 300 };
    float ff[24];
    for (int i = 0; i < 24; i++) ff[i] = 1.f + 0.5f * i;
    for (size_t ii = 0; ii < 3; ii++) {
        if (!s_isa_ok (s_isas[ii])) continue;
        void *be = s_create (s_isas[ii], 2);
        for (int mode = 0; mode <= 2; mode += 2)
            for (int variant = 0; variant < 3; variant++) {
                struct rx_rope_params p = { .struct_size = sizeof p, .mode = mode, .n_rot = 32,
                                            .n_ctx_orig = 4096, .freq_base = 10000.f,
                                            .freq_scale = 1.f, .ext_factor = 0.f,
                                            .attn_factor = 1.f, .beta_fast = 32.f, .beta_slow = 1.f };
                if (variant == 1) { p.freq_scale = 0.25f; p.ext_factor = 1.f; p.attn_factor = 0.9f; p.freq_base = 500000.f; }
                if (variant == 2) { p.freq_factors = ff; p.n_rot = hd; }
                float *x = s_randv (n_tok * ldx, 1.f);
                float *ref = malloc (n_tok * ldx * sizeof *ref);
                memcpy (ref, x, n_tok * ldx * sizeof *ref);
                struct rx_err err = { 0 };
                cr_assert_eq (K->rope (be, NULL, x, ldx, n_tok, n_head, ld_head, pos, &p, &err), RX_OK,
                              "%s", err.msg);
                for (size_t t = 0; t < n_tok; t++)
                    for (size_t h = 0; h < n_head; h++)
                        s_ref_rope (ref + t * ldx + h * ld_head, p.n_rot, mode, pos[t], &p);
                for (size_t i = 0; i < n_tok * ldx; i++)
                    cr_assert_leq (fabsf (x[i] - ref[i]), 2e-5f * (1 + fabsf (ref[i])),
                                   "rope mode %d variant %d [%zu]: %g vs %g", mode, variant, i,
                                   (double) x[i], (double) ref[i]);
                free (x);
                free (ref);
            }
        /* Plain RoPE at small positions equals the textbook formula. */
        struct rx_rope_params p = { .struct_size = sizeof p, .mode = 0, .n_rot = 16,
                                    .n_ctx_orig = 512, .freq_base = 10000.f, .freq_scale = 1.f,
                                    .attn_factor = 1.f, .beta_fast = 32.f, .beta_slow = 1.f };
        float v[16];
        for (int i = 0; i < 16; i++) v[i] = (float) (i + 1);
        int32_t p3 = 3;
        cr_assert_eq (K->rope (be, NULL, v, 16, 1, 1, 16, &p3, &p, NULL), RX_OK);
        for (int i = 0; i < 8; i++) {
            double th = 3 * pow (10000.0, -2.0 * i / 16);
            double a = 2 * i + 1, b = 2 * i + 2;
            cr_assert_leq (fabs (v[2 * i] - (a * cos (th) - b * sin (th))), 1e-4);
            cr_assert_leq (fabs (v[2 * i + 1] - (a * sin (th) + b * cos (th))), 1e-4);
        }
        struct rx_err err = { 0 };
        p.n_rot = 15;
        cr_assert_eq (K->rope (be, NULL, v, 16, 1, 1, 16, &p3, &p, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "n_rot"), "%s", err.msg);
        p.n_rot = 16;
        p.mode = 1;
        cr_assert_eq (K->rope (be, NULL, v, 16, 1, 1, 16, &p3, &p, &err), RX_EINVAL);
        K->destroy (be);
    }
}

/* ========================================================= attention -- */

static void s_check_attention (void *be, const char *tag, int dtype, int n_head, int n_kv,
                               int hd_k, int hd_v, int window, float softcap)
{
    struct rx_err err = { 0 };
    const int n_slots = 96;
    struct rx_kv_pool pool = { .dtype = dtype, .n_kv_head = n_kv, .hd_k = hd_k, .hd_v = hd_v,
                               .n_slots = n_slots };
    size_t esz = dtype == RX_F16 ? 2 : 4;
    cr_assert_eq (K->alloc (be, (size_t) n_slots * n_kv * hd_k * esz, 0, &pool.k, &err), RX_OK);
    cr_assert_eq (K->alloc (be, (size_t) n_slots * n_kv * hd_v * esz, 0, &pool.v, &err), RX_OK);
    /* Three sequences: lengths 1, 7 and 30, slots scattered through the pool. */
    enum { NS = 3 };
    const int len[NS] = { 1, 7, 30 };
    int32_t kv_start[NS + 1] = { 0 };
    for (int s = 0; s < NS; s++) kv_start[s + 1] = kv_start[s] + len[s];
    const int total = kv_start[NS];
    int32_t slots[38];
    int32_t perm[96];
    for (int i = 0; i < n_slots; i++) perm[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        int j = (int) (s_next () % (uint64_t) (i + 1));
        int32_t tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
    }
    for (int i = 0; i < total; i++) slots[i] = perm[i];
    /* Store every position's K/V with kv_store (all sequences at once). */
    const size_t kd = (size_t) n_kv * hd_k, vd = (size_t) n_kv * hd_v;
    float *kall = s_randv ((size_t) total * (kd + 1), 1.f), *vall = s_randv ((size_t) total * vd, 1.f);
    cr_assert_eq (K->kv_store (be, NULL, &pool, kall, kd + 1, vall, vd, slots, (size_t) total, &err),
                  RX_OK, "%s", err.msg);
    /* The pool holds them at their slots (host-visible backend). */
    for (int i = 0; i < total; i++)
        for (size_t e = 0; e < kd; e++) {
            const uint8_t *row = (const uint8_t *) pool.k + (size_t) slots[i] * kd * esz;
            double got = dtype == RX_F16 ? t_f16 (t_u16 (row + 2 * e)) : ((const float *) row)[e];
            double want = dtype == RX_F16 ? t_f16 (rx_fp32_to_fp16 (kall[(size_t) i * (kd + 1) + e]))
                                          : kall[(size_t) i * (kd + 1) + e];
            cr_assert_eq (got, want, "%s kv_store slot %d [%zu]", tag, slots[i], e);
        }
    /* Queries: seq 0 decodes pos 0; seq 1 prefills pos 0..6; seq 2 a chunk
     * at positions 27..29 (KV beyond the query is masked). */
    int32_t q_start[NS + 1] = { 0, 1, 8, 11 };
    int32_t q_pos[11] = { 0, 0, 1, 2, 3, 4, 5, 6, 27, 28, 29 };
    /* make seq 2 longer than its last query to check the causal mask */
    q_pos[10] = 25;
    const int n_tok = 11;
    const size_t qd = (size_t) n_head * hd_k, od = (size_t) n_head * hd_v;
    const size_t ldq = qd + 3, ldo = od + 2;
    float *q = s_randv ((size_t) n_tok * ldq, 1.f), *out = malloc ((size_t) n_tok * ldo * sizeof *out);
    for (size_t i = 0; i < (size_t) n_tok * ldo; i++) out[i] = NAN;
    struct rx_attn_batch b = { .n_seq = NS, .n_tokens = n_tok, .q_start = q_start,
                               .kv_start = kv_start, .slots = slots, .q_pos = q_pos };
    const float scale = 1.f / sqrtf ((float) hd_k);
    struct rx_attn_params p = { .struct_size = sizeof p, .n_head = n_head, .scale = scale,
                                .softcap = softcap, .window = window };
    cr_assert_eq (K->attention (be, NULL, q, ldq, &pool, &b, &p, out, ldo, &err), RX_OK, "%s", err.msg);
    /* Reference: gather the sequence's K/V (as stored) and do softmax(QK^T)V. */
    const int group = n_head / n_kv;
    for (int s = 0; s < NS; s++)
        for (int t = q_start[s]; t < q_start[s + 1]; t++)
            for (int h = 0; h < n_head; h++) {
                const int kvh = h / group, ps = q_pos[t];
                const int first = window > 0 && ps - window + 1 > 0 ? ps - window + 1 : 0;
                double sc[64], mx = -INFINITY, sum = 0;
                for (int j = first; j <= ps; j++) {
                    const float *kr = kall + (size_t) (kv_start[s] + j) * (kd + 1) + (size_t) kvh * hd_k;
                    double d = 0;
                    for (int e = 0; e < hd_k; e++) {
                        double kv = dtype == RX_F16 ? t_f16 (rx_fp32_to_fp16 (kr[e])) : kr[e];
                        d += q[(size_t) t * ldq + (size_t) h * hd_k + e] * kv;
                    }
                    d *= scale;
                    if (softcap > 0) d = softcap * tanh (d / softcap);
                    sc[j - first] = d;
                    mx = fmax (mx, d);
                }
                for (int j = first; j <= ps; j++) sum += (sc[j - first] = exp (sc[j - first] - mx));
                for (int e = 0; e < hd_v; e++) {
                    double o = 0;
                    for (int j = first; j <= ps; j++) {
                        float vv = vall[(size_t) (kv_start[s] + j) * vd + (size_t) kvh * hd_v + e];
                        o += sc[j - first] / sum * (dtype == RX_F16 ? t_f16 (rx_fp32_to_fp16 (vv)) : vv);
                    }
                    float got = out[(size_t) t * ldo + (size_t) h * hd_v + e];
                    cr_assert_leq (fabs (got - o), 2e-5 * (1 + fabs (o)),
                                   "%s seq %d tok %d head %d [%d]: %g vs %g", tag, s, t, h, e,
                                   (double) got, o);
                }
            }
    /* Bad indices are refused with one line. */
    q_pos[10] = 30;
    cr_assert_eq (K->attention (be, NULL, q, ldq, &pool, &b, &p, out, ldo, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "position 30"), "%s", err.msg);
    q_pos[10] = 25;
    slots[3] = n_slots;
    cr_assert_eq (K->attention (be, NULL, q, ldq, &pool, &b, &p, out, ldo, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "slot"), "%s", err.msg);
    cr_assert_eq (K->kv_store (be, NULL, &pool, kall, kd + 1, vall, vd, slots, 4, &err), RX_EINVAL);
    slots[3] = perm[3];
    if (n_kv > 1) {
        p.n_head = n_kv * group + 1;
        cr_assert_eq (K->attention (be, NULL, q, ldq, &pool, &b, &p, out, ldo, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "n_head"), "%s", err.msg);
    }
    K->free_ (be, pool.k);
    K->free_ (be, pool.v);
    free (kall);
    free (vall);
    free (q);
    free (out);
}

Test (kcpu, attention_paged_gqa, .timeout = 120)
{
    for (size_t ii = 0; ii < 3; ii++) {
        if (!s_isa_ok (s_isas[ii])) continue;
        for (int th = 1; th <= 3; th += 2) {
            void *be = s_create (s_isas[ii], th);
            char tag[64];
            snprintf (tag, sizeof tag, "isa=%s threads=%d", s_isas[ii], th);
            s_check_attention (be, tag, RX_F32, 4, 2, 16, 16, 0, 0.f);    /* GQA 2 */
            s_check_attention (be, tag, RX_F32, 4, 4, 48, 32, 0, 0.f);    /* MLA naive: hd_k != hd_v */
            s_check_attention (be, tag, RX_F32, 8, 1, 64, 64, 0, 0.f);    /* MQA */
            s_check_attention (be, tag, RX_F16, 6, 2, 32, 24, 0, 0.f);    /* f16 pool */
            s_check_attention (be, tag, RX_F32, 2, 1, 16, 16, 4, 30.f);   /* window, softcap */
            /* head sizes off the 16-lane grid, value rows over 64 (the
             * AVX-512 block primitives work 64 outputs at a time) */
            s_check_attention (be, tag, RX_F16, 4, 2, 20, 100, 0, 0.f);
            s_check_attention (be, tag, RX_F32, 3, 1, 72, 130, 0, 0.f);
            s_check_attention (be, tag, RX_F16, 2, 1, 128, 16, 0, 0.f);
            K->destroy (be);
        }
    }
}

/* ================================ the MoE expert pass (kernel ABI 1.3) -- */

/* Bits of n floats equal (a NaN sentinel compares equal to itself). */
static int s_bits_eq (const float *a, const float *b, size_t n)
{
    return memcmp (a, b, n * sizeof *a) == 0;
}

/* The definition worked out by hand: 3 tokens x 2 choices over 4 experts,
 * ids [[2, 0], [1, 2], [0, 5]] (5 is no expert).  Sorted by expert, then
 * token, then choice: expert 0 gets (t0, j1), (t2, j0); expert 1 (t1, j0);
 * expert 2 (t0, j0), (t1, j1); expert 3 nothing. */
Test (kcpu, moe_sort_by_hand)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    const int32_t ids[6] = { 2, 0, 1, 2, 0, 5 };
    int32_t off[5 + 1], row[6], src[6 + 1];
    for (int i = 0; i < 6; i++) off[i] = row[i] = src[i] = 77;
    src[6] = 77;
    cr_assert_eq (K->moe_sort (be, NULL, ids, 3, 2, 4, off, row, src, &err), RX_OK, "%s", err.msg);
    const int32_t w_off[5] = { 0, 2, 3, 5, 5 };
    const int32_t w_row[6] = { 3, 0, 2, 4, 1, -1 };
    const int32_t w_src[6] = { 0, 2, 1, 0, 1, -1 };
    for (int i = 0; i < 5; i++) cr_assert_eq (off[i], w_off[i], "offsets[%d] = %d", i, off[i]);
    cr_assert_eq (off[5], 77, "offsets has n_expert + 1 entries");
    for (int i = 0; i < 6; i++) cr_assert_eq (row[i], w_row[i], "row[%d] = %d", i, row[i]);
    for (int i = 0; i < 6; i++) cr_assert_eq (src[i], w_src[i], "src[%d] = %d", i, src[i]);
    cr_assert_eq (src[6], 77, "src has n_tok * k entries");
    /* A negative id: row -1; one token [-1, 3] -> only expert 3 has a row. */
    const int32_t ids2[2] = { -1, 3 };
    cr_assert_eq (K->moe_sort (be, NULL, ids2, 1, 2, 4, off, row, src, &err), RX_OK, "%s", err.msg);
    const int32_t w_off2[5] = { 0, 0, 0, 0, 1 };
    for (int i = 0; i < 5; i++) cr_assert_eq (off[i], w_off2[i], "offsets[%d] = %d", i, off[i]);
    cr_assert (row[0] == -1 && row[1] == 0 && src[0] == 0 && src[1] == -1,
               "row %d %d src %d %d", row[0], row[1], src[0], src[1]);
    /* No tokens: offsets of zeros, nothing else read or written. */
    for (int i = 0; i < 5; i++) off[i] = 77;
    cr_assert_eq (K->moe_sort (be, NULL, NULL, 0, 2, 4, off, NULL, NULL, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < 5; i++) cr_assert_eq (off[i], 0, "offsets[%d] = %d", i, off[i]);
    K->destroy (be);
}

/* Random routings (with invalid ids) against a naive sort: for each
 * expert in turn, the choices naming it in (token, choice) order. */
Test (kcpu, moe_sort_random)
{
    void *be = s_create ("auto", 3);
    struct rx_err err = { 0 };
    for (int it = 0; it < 200; it++) {
        const size_t n_tok = s_next () % 41, kk = 1 + s_next () % 8, ne = 1 + s_next () % 20;
        const size_t n = n_tok * kk;
        int32_t *ids = malloc ((n + 1) * sizeof *ids), *row = malloc ((n + 1) * sizeof *row);
        int32_t *src = malloc ((n + 1) * sizeof *src), *off = malloc ((ne + 2) * sizeof *off);
        int32_t *wrow = malloc ((n + 1) * sizeof *wrow), *wsrc = malloc ((n + 1) * sizeof *wsrc);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = s_next () % 100;
            ids[i] = r < 5 ? -1 - (int32_t) (s_next () % 3) : r < 10 ? (int32_t) (ne + s_next () % 3)
                                                                   : (int32_t) (s_next () % ne);
        }
        for (size_t i = 0; i <= n; i++) row[i] = src[i] = 77;
        for (size_t e = 0; e <= ne + 1; e++) off[e] = 77;
        cr_assert_eq (K->moe_sort (be, NULL, ids, n_tok, kk, ne, off, row, src, &err), RX_OK, "%s", err.msg);
        int32_t next = 0;
        for (size_t i = 0; i < n; i++) wrow[i] = -1;
        for (size_t i = 0; i < n; i++) wsrc[i] = -1;
        for (size_t e = 0; e < ne; e++) {
            cr_assert_eq (off[e], next, "it %d: offsets[%zu] = %d, want %d", it, e, off[e], next);
            for (size_t t = 0; t < n_tok; t++)
                for (size_t j = 0; j < kk; j++)
                    if (ids[t * kk + j] == (int32_t) e) {
                        wrow[t * kk + j] = next;
                        wsrc[next++] = (int32_t) t;
                    }
        }
        cr_assert_eq (off[ne], next, "it %d: offsets[n_expert] = %d, want %d valid", it, off[ne], next);
        cr_assert_eq (off[ne + 1], 77);
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq (row[i], wrow[i], "it %d: row[%zu] = %d, want %d", it, i, row[i], wrow[i]);
            cr_assert_eq (src[i], wsrc[i], "it %d: src[%zu] = %d, want %d", it, i, src[i], wsrc[i]);
        }
        cr_assert (row[n] == 77 && src[n] == 77, "it %d: wrote past n_tok * k", it);
        free (ids);
        free (row);
        free (src);
        free (off);
        free (wrow);
        free (wsrc);
    }
    K->destroy (be);
}

Test (kcpu, gather_rows_zeros_for_negative_idx)
{
    for (int th = 1; th <= 3; th += 2) {
        void *be = s_create ("auto", th);
        struct rx_err err = { 0 };
        enum { XR = 10, LDX = 7, DIM = 5, LDY = 6, N = 6 };
        float x[XR * LDX], y[N * LDY];
        for (int i = 0; i < XR * LDX; i++) x[i] = (float) i * 0.5f - 3.f;
        for (int i = 0; i < N * LDY; i++) y[i] = NAN;
        const int32_t idx[N] = { 3, -1, 0, 9, 3, -7 };
        cr_assert_eq (K->gather_rows (be, NULL, x, LDX, idx, N, DIM, y, LDY, &err), RX_OK, "%s", err.msg);
        for (int i = 0; i < N; i++) {
            for (int c = 0; c < DIM; c++) {
                float want = idx[i] < 0 ? 0.f : x[idx[i] * LDX + c];
                cr_assert_eq (y[i * LDY + c], want, "y[%d][%d] = %g, want %g", i, c,
                              (double) y[i * LDY + c], (double) want);
                if (idx[i] < 0) cr_assert (!signbit (y[i * LDY + c]), "+0");
            }
            cr_assert (isnan (y[i * LDY + DIM]), "padding column untouched");
        }
        cr_assert_eq (K->gather_rows (be, NULL, NULL, 0, NULL, 0, DIM, NULL, 0, &err), RX_OK, "n = 0");
        K->destroy (be);
    }
}

/* matmul_grouped over experts with 7, 0, 20, 1 and 9 rows (37 sorted rows
 * in a buffer of 40): each expert's rows inside the window [row0, row0 +
 * n) give exactly what one matmul call of that expert on those rows
 * gives; rows past offsets[n_expert] and the padding keep their sentinel. */
static void s_check_grouped (void *be, const char *tag, int dtype, size_t in)
{
    enum { NE = 5, NR = 40, OUT = 24 };
    const int32_t off[NE + 1] = { 0, 7, 7, 27, 28, 37 };
    const size_t ldx = in + 3, ldy = OUT + 2;
    uint8_t *wd = s_rand_weights (dtype, in, (size_t) OUT * NE);
    rx_kweight_t *kw = s_weight (be, dtype, wd, in, OUT, NE);
    float *x = s_randv (NR * ldx, 1.f);
    float *y = malloc (NR * ldy * sizeof *y), *yr = malloc (NR * ldy * sizeof *yr);
    float *base = s_randv (NR * ldy, 1.f);
    /* windows: everything (past the rows), inside expert 2, across 2|3|4 up to the end */
    const size_t win[][2] = { { 0, NR }, { 10, 14 }, { 25, 15 }, { 6, 2 }, { 37, 3 } };
    for (int acc = 0; acc < 2; acc++) {
        for (size_t wi = 0; wi < sizeof win / sizeof win[0]; wi++) {
            const size_t row0 = win[wi][0], n = win[wi][1];
            for (size_t i = 0; i < NR * ldy; i++) y[i] = yr[i] = acc ? base[i] : NAN;
            struct rx_err err = { 0 };
            const uint32_t fl = acc ? RX_MM_ACCUMULATE : 0;
            cr_assert_eq (K->matmul_grouped (be, NULL, kw, off, row0, x + row0 * ldx, ldx, y + row0 * ldy,
                                             ldy, n, fl, &err), RX_OK, "%s: %s", tag, err.msg);
            for (int e = 0; e < NE; e++) {
                size_t lo = (size_t) off[e] > row0 ? (size_t) off[e] : row0;
                size_t hi = (size_t) off[e + 1] < row0 + n ? (size_t) off[e + 1] : row0 + n;
                if (lo < hi)
                    cr_assert_eq (K->matmul (be, NULL, kw, e, x + lo * ldx, ldx, yr + lo * ldy, ldy, hi - lo,
                                             fl, &err), RX_OK, "%s", err.msg);
            }
            for (size_t r = 0; r < NR; r++)
                cr_assert (s_bits_eq (y + r * ldy, yr + r * ldy, ldy),
                           "%s %s acc=%d window [%zu, %zu): row %zu differs from matmul (%.9g vs %.9g)%s",
                           tag, rx_dtype_name (dtype), acc, row0, row0 + n, r, (double) y[r * ldy],
                           (double) yr[r * ldy], r >= 37 || r < row0 || r >= row0 + n ? " (should be untouched)" : "");
            /* and the untouched rows really are the sentinel */
            for (size_t r = 37; r < NR; r++)
                for (size_t c = 0; c < ldy; c++)
                    cr_assert (acc ? y[r * ldy + c] == base[r * ldy + c] : isnan (y[r * ldy + c]),
                               "%s: row %zu past offsets[n_expert] written", tag, r);
        }
    }
    K->weight_free (be, kw);
    free (wd);
    free (x);
    free (y);
    free (yr);
    free (base);
}

Test (kcpu, matmul_grouped_equals_matmul_per_expert, .timeout = 120)
{
    for (size_t ii = 0; ii < S_NCFG; ii++) {
        if (!s_isa_ok (s_cfgs[ii].isa)) continue;
        void *be = s_create_x (s_cfgs[ii].isa, 2, s_cfgs[ii].extra);
        char tag[96];
        snprintf (tag, sizeof tag, "isa=%s %s", s_cfgs[ii].isa, s_cfgs[ii].extra ? s_cfgs[ii].extra : "");
        s_check_grouped (be, tag, RX_F32, 64);
        s_check_grouped (be, tag, RX_F16, 40);
        s_check_grouped (be, tag, RX_Q8_0, 64);
        s_check_grouped (be, tag, RX_Q4_K, 256);
        K->destroy (be);
    }
}

/* moe-local's combine (plugins/moe/local.c) with the 1.0 ops, left-out
 * choices (row < 0) skipped: scale each y row by its weight in place, add
 * them into the first in choice order, copy or add that to out[t]; k = 1
 * without accumulate scales straight into out.  y is clobbered. */
static void s_combine_ref (void *be, float *y, size_t ldy, const int32_t *row, const float *w,
                           size_t n_tok, size_t kk, size_t dim, float *out, size_t ldo, int acc)
{
    struct rx_err err = { 0 };
    for (size_t t = 0; t < n_tok; t++) {
        float *o = out + t * ldo, *first = NULL;
        if (kk == 1 && !acc && row[t] >= 0) {
            cr_assert_eq (K->scale (be, NULL, y + (size_t) row[t] * ldy, ldy, o, ldo, 1, dim, w[t], &err), RX_OK);
            continue;
        }
        for (size_t j = 0; j < kk; j++) {
            const int32_t r = row[t * kk + j];
            if (r < 0) continue;
            float *yj = y + (size_t) r * ldy;
            cr_assert_eq (K->scale (be, NULL, yj, ldy, yj, ldy, 1, dim, w[t * kk + j], &err), RX_OK);
            if (!first) first = yj;
            else cr_assert_eq (K->add (be, NULL, first, ldy, yj, ldy, first, ldy, 1, dim, &err), RX_OK);
        }
        if (!first) {
            if (!acc) memset (o, 0, dim * sizeof *o);
        } else if (acc) {
            cr_assert_eq (K->add (be, NULL, o, ldo, first, ldy, o, ldo, 1, dim, &err), RX_OK);
        } else {
            cr_assert_eq (K->copy2d (be, NULL, first, ldy, o, ldo, 1, dim, &err), RX_OK);
        }
    }
}

static void s_check_combine (void *be, size_t n_tok, size_t kk, size_t dim, int acc, int holes)
{
    const size_t n = n_tok * kk, ldy = dim + 1, ldo = dim + 3;
    int32_t *ids = malloc (n * sizeof *ids), *row = malloc (n * sizeof *row);
    int32_t *src = malloc (n * sizeof *src), off[9];
    for (size_t i = 0; i < n; i++)
        ids[i] = holes && s_next () % 4 == 0 ? -1 : (int32_t) (s_next () % 8);
    if (holes && n_tok > 1)
        for (size_t j = 0; j < kk; j++) ids[kk + j] = -1;   /* token 1: no choice left */
    struct rx_err err = { 0 };
    cr_assert_eq (K->moe_sort (be, NULL, ids, n_tok, kk, 8, off, row, src, &err), RX_OK, "%s", err.msg);
    float *y = s_randv (n * ldy, 1.f), *y2 = malloc (n * ldy * sizeof *y2);
    float *w = s_randv (n, 0.7f);
    float *o = s_randv (n_tok * ldo, 1.f), *o2 = malloc (n_tok * ldo * sizeof *o2);
    memcpy (y2, y, n * ldy * sizeof *y);
    memcpy (o2, o, n_tok * ldo * sizeof *o);
    cr_assert_eq (K->moe_combine (be, NULL, y, ldy, row, w, n_tok, kk, dim, o, ldo,
                                  acc ? RX_MM_ACCUMULATE : 0, &err), RX_OK, "%s", err.msg);
    cr_assert (s_bits_eq (y, y2, n * ldy), "moe_combine leaves y alone");
    s_combine_ref (be, y2, ldy, row, w, n_tok, kk, dim, o2, ldo, acc);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t c = 0; c < ldo; c++)
            cr_assert (s_bits_eq (o + t * ldo + c, o2 + t * ldo + c, 1),
                       "n_tok %zu k %zu dim %zu acc %d: out[%zu][%zu] = %.9g, scale/add sequence %.9g",
                       n_tok, kk, dim, acc, t, c, (double) o[t * ldo + c], (double) o2[t * ldo + c]);
    if (holes && n_tok > 1 && !acc)
        for (size_t c = 0; c < dim; c++) cr_assert_eq (o[ldo + c], 0.f, "a token with no choice: zeros");
    free (ids);
    free (row);
    free (src);
    free (y);
    free (y2);
    free (w);
    free (o);
    free (o2);
}

Test (kcpu, moe_combine_equals_scale_add_sequence, .timeout = 120)
{
    for (int th = 1; th <= 3; th += 2) {
        void *be = s_create ("auto", th);
        for (int acc = 0; acc < 2; acc++) {
            s_check_combine (be, 200, 3, 700, acc, 0);    /* many rows; two column blocks */
            s_check_combine (be, 37, 8, 1025, acc, 1);    /* left-out choices, odd width */
            s_check_combine (be, 9, 1, 64, acc, 0);       /* k = 1 */
            s_check_combine (be, 9, 1, 64, acc, 1);
            s_check_combine (be, 1, 4, 5, acc, 0);
        }
        K->destroy (be);
    }
}

Test (kcpu, moe_ops_errors)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    int32_t ids[4] = { 0, 1, 1, 0 }, off[3], row[4], src[4];
    float x[4 * 64] = { 0 }, y[4 * 64], w4[4] = { 1, 1, 1, 1 };
#define S_BAD(call, op, what)                                                                  \
    do {                                                                                       \
        memset (&err, 0, sizeof err);                                                          \
        cr_assert_eq ((call), RX_EINVAL, "%s: %s accepted", op, what);                         \
        cr_assert (strstr (err.msg, op) && strstr (err.msg, "kernels-cpu"), "%s: %s", what, err.msg); \
    } while (0)
    S_BAD (K->moe_sort (be, NULL, ids, 2, 0, 2, off, row, src, &err), "moe_sort", "k = 0");
    S_BAD (K->moe_sort (be, NULL, ids, 2, 2, 0, off, row, src, &err), "moe_sort", "n_expert 0");
    S_BAD (K->moe_sort (be, NULL, ids, 2, 2, 2, NULL, row, src, &err), "moe_sort", "offsets NULL");
    S_BAD (K->moe_sort (be, NULL, NULL, 2, 2, 2, off, row, src, &err), "moe_sort", "ids NULL");
    S_BAD (K->moe_sort (be, NULL, ids, 2, 2, 2, off, NULL, src, &err), "moe_sort", "row NULL");
    S_BAD (K->moe_sort (be, NULL, ids, 2, 2, 2, off, row, NULL, &err), "moe_sort", "src NULL");
    S_BAD (K->moe_sort (be, NULL, ids, (size_t) 1 << 30, 4, 2, off, row, src, &err), "moe_sort", "overflow");
    S_BAD (K->moe_sort (be, NULL, NULL, 0, 2, 2, NULL, NULL, NULL, &err), "moe_sort", "n_tok 0, offsets NULL");
    S_BAD (K->moe_sort (be, (rx_kstream_t *) x, ids, 2, 2, 2, off, row, src, &err), "moe_sort", "bad stream");
    cr_assert_eq (K->moe_sort (be, NULL, ids, 2, 2, 2, off, row, src, &err), RX_OK, "%s", err.msg);

    S_BAD (K->gather_rows (be, NULL, NULL, 64, row, 4, 64, y, 64, &err), "gather_rows", "x NULL");
    S_BAD (K->gather_rows (be, NULL, x, 64, NULL, 4, 64, y, 64, &err), "gather_rows", "idx NULL");
    S_BAD (K->gather_rows (be, NULL, x, 64, row, 4, 64, NULL, 64, &err), "gather_rows", "y NULL");
    S_BAD (K->gather_rows (be, NULL, x, 63, row, 1, 64, y, 64, &err), "gather_rows", "ldx < dim");
    S_BAD (K->gather_rows (be, NULL, x, 64, row, 4, 64, y, 63, &err), "gather_rows", "ldy < dim");
    cr_assert_eq (K->gather_rows (be, NULL, x, 64, row, 4, 64, y, 64, &err), RX_OK, "%s", err.msg);

    uint8_t *wd = s_rand_weights (RX_F32, 64, 8 * 2);
    rx_kweight_t *w2 = s_weight (be, RX_F32, wd, 64, 8, 1), *w3 = s_weight (be, RX_F32, wd, 64, 8, 2);
    S_BAD (K->matmul_grouped (be, NULL, w2, off, 0, x, 64, y, 8, 4, 0, &err), "matmul_grouped", "2-D weight");
    cr_assert (strstr (err.msg, "3-D"), "%s", err.msg);
    S_BAD (K->matmul_grouped (be, NULL, (rx_kweight_t *) x, off, 0, x, 64, y, 8, 4, 0, &err), "matmul_grouped", "not a weight");
    S_BAD (K->matmul_grouped (be, NULL, w3, off, 0, x, 64, y, 8, 4, 0x10, &err), "matmul_grouped", "flags");
    S_BAD (K->matmul_grouped (be, NULL, w3, off, 0, x, 63, y, 8, 4, 0, &err), "matmul_grouped", "ldx < in");
    S_BAD (K->matmul_grouped (be, NULL, w3, off, 0, x, 64, y, 7, 4, 0, &err), "matmul_grouped", "ldy < out");
    S_BAD (K->matmul_grouped (be, NULL, w3, off, 0, NULL, 64, y, 8, 4, 0, &err), "matmul_grouped", "x NULL");
    S_BAD (K->matmul_grouped (be, NULL, w3, off, 0, x, 64, NULL, 8, 4, 0, &err), "matmul_grouped", "y NULL");
    S_BAD (K->matmul_grouped (be, NULL, w3, NULL, 0, x, 64, y, 8, 4, 0, &err), "matmul_grouped", "offsets NULL");
    int32_t bo[3] = { 1, 2, 4 };
    S_BAD (K->matmul_grouped (be, NULL, w3, bo, 0, x, 64, y, 8, 4, 0, &err), "matmul_grouped", "offsets[0] = 1");
    cr_assert (strstr (err.msg, "offsets[0]"), "%s", err.msg);
    bo[0] = 0;
    bo[2] = 1;
    S_BAD (K->matmul_grouped (be, NULL, w3, bo, 0, x, 64, y, 8, 4, 0, &err), "matmul_grouped", "decreasing");
    cr_assert (strstr (err.msg, "offsets[2] = 1"), "names the entry: %s", err.msg);
    bo[1] = -3;
    S_BAD (K->matmul_grouped (be, NULL, w3, bo, 0, x, 64, y, 8, 4, 0, &err), "matmul_grouped", "negative");
    cr_assert (strstr (err.msg, "offsets[1] = -3"), "names the entry: %s", err.msg);
    cr_assert_eq (K->matmul_grouped (be, NULL, w3, NULL, 0, NULL, 64, NULL, 8, 0, 0, &err), RX_OK, "n = 0: %s", err.msg);
    cr_assert_eq (K->matmul_grouped (be, NULL, w3, off, 0, x, 64, y, 8, 4, 0, &err), RX_OK, "%s", err.msg);

    S_BAD (K->moe_combine (be, NULL, x, 64, row, w4, 2, 0, 64, y, 64, 0, &err), "moe_combine", "k = 0");
    S_BAD (K->moe_combine (be, NULL, x, 64, row, w4, 2, 2, 64, y, 64, 2, &err), "moe_combine", "flags");
    S_BAD (K->moe_combine (be, NULL, NULL, 64, row, w4, 2, 2, 64, y, 64, 0, &err), "moe_combine", "y NULL");
    S_BAD (K->moe_combine (be, NULL, x, 64, NULL, w4, 2, 2, 64, y, 64, 0, &err), "moe_combine", "row NULL");
    S_BAD (K->moe_combine (be, NULL, x, 64, row, NULL, 2, 2, 64, y, 64, 0, &err), "moe_combine", "w NULL");
    S_BAD (K->moe_combine (be, NULL, x, 64, row, w4, 2, 2, 64, NULL, 64, 0, &err), "moe_combine", "out NULL");
    S_BAD (K->moe_combine (be, NULL, x, 63, row, w4, 1, 2, 64, y, 64, 0, &err), "moe_combine", "ldy < dim");
    S_BAD (K->moe_combine (be, NULL, x, 64, row, w4, 2, 2, 64, y, 63, 0, &err), "moe_combine", "ldo < dim");
    cr_assert_eq (K->moe_combine (be, NULL, NULL, 0, NULL, NULL, 0, 2, 64, NULL, 0, 0, &err), RX_OK, "n_tok 0");
    cr_assert_eq (K->moe_combine (be, NULL, x, 64, row, w4, 2, 2, 64, y, 64, 0, &err), RX_OK, "%s", err.msg);
#undef S_BAD
    K->weight_free (be, w2);
    K->weight_free (be, w3);
    free (wd);
    K->destroy (be);
}

/* One MoE expert pass on the device (sort, gather, grouped matmul,
 * combine) captured as a graph: nothing runs at capture; a launch gives
 * what the eager ops give, with the routing in device memory at launch. */
static void s_moe_pass (void *be, rx_kweight_t *kw, const float *dx, const int32_t *dids, const float *dw,
                        int32_t *doff, int32_t *drow, int32_t *dsrc, float *dxs, float *dys, float *dout,
                        size_t n_tok, size_t kk, size_t ne, size_t in, size_t out)
{
    struct rx_err err = { 0 };
    const size_t n = n_tok * kk;
    cr_assert_eq (K->moe_sort (be, NULL, dids, n_tok, kk, ne, doff, drow, dsrc, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->gather_rows (be, NULL, dx, in, dsrc, n, in, dxs, in, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->matmul_grouped (be, NULL, kw, doff, 0, dxs, in, dys, out, n, 0, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->moe_combine (be, NULL, dys, out, drow, dw, n_tok, kk, out, dout, out, 0, &err), RX_OK,
                  "%s", err.msg);
}

Test (kcpu, moe_ops_in_emulated_graphs)
{
    void *be = s_create_x ("auto", 2, "graphs = true\n");
    struct rx_err err = { 0 };
    enum { T = 6, KK = 2, NE = 4, IN = 64, OUT = 16, NR = T * KK };
    uint8_t *wd = s_rand_weights (RX_Q8_0, IN, (size_t) OUT * NE);
    rx_kweight_t *kw = s_weight (be, RX_Q8_0, wd, IN, OUT, NE);
    float *hx = s_randv (T * IN, 1.f), *hw = s_randv (NR, 0.5f);
    int32_t hids[NR], hids2[NR];
    for (int i = 0; i < NR; i++) {
        hids[i] = (int32_t) (s_next () % NE);
        hids2[i] = i == 3 ? -1 : (int32_t) ((i * 3 + 1) % NE);
    }
    float *dx, *dw, *dxs, *dys, *dout;
    int32_t *dids, *doff, *drow, *dsrc;
    cr_assert_eq (K->alloc (be, sizeof (float) * T * IN, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (float) * NR, 0, (void **) &dw, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (float) * NR * IN, 0, (void **) &dxs, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (float) * NR * OUT, 0, (void **) &dys, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (float) * T * OUT, 0, (void **) &dout, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (int32_t) * NR, 0, (void **) &dids, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (int32_t) * (NE + 1), 0, (void **) &doff, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (int32_t) * NR, 0, (void **) &drow, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof (int32_t) * NR, 0, (void **) &dsrc, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, hx, sizeof (float) * T * IN, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dw, hw, sizeof (float) * NR, &err), RX_OK);
    float eager[2][T * OUT], got[T * OUT];
    const int32_t *routes[2] = { hids, hids2 };
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (K->copy_h2d (be, NULL, dids, routes[r], sizeof hids, &err), RX_OK);
        s_moe_pass (be, kw, dx, dids, dw, doff, drow, dsrc, dxs, dys, dout, T, KK, NE, IN, OUT);
        cr_assert_eq (K->copy_d2h (be, NULL, eager[r], dout, sizeof got, &err), RX_OK);
    }
    for (int i = 0; i < T * OUT; i++) cr_assert (isfinite (eager[0][i]) && isfinite (eager[1][i]));
    cr_assert (!s_bits_eq (eager[0], eager[1], T * OUT), "the two routings differ");
    /* capture the pass; it must not run */
    cr_assert_eq (K->memset_ (be, NULL, dout, 0xff, sizeof got, &err), RX_OK);   /* NaN */
    cr_assert_eq (K->memset_ (be, NULL, doff, 0xff, sizeof (int32_t) * (NE + 1), &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dids, hids, sizeof hids, &err), RX_OK);
    cr_assert_eq (K->graph_begin (be, NULL, 31, &err), RX_OK, "%s", err.msg);
    s_moe_pass (be, kw, dx, dids, dw, doff, drow, dsrc, dxs, dys, dout, T, KK, NE, IN, OUT);
    cr_assert_eq (K->graph_end (be, NULL, 31, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, got, dout, sizeof got, &err), RX_OK);
    for (int i = 0; i < T * OUT; i++) cr_assert (isnan (got[i]), "capture ran nothing");
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (K->copy_h2d (be, NULL, dids, routes[r], sizeof hids, &err), RX_OK);
        cr_assert_eq (K->memset_ (be, NULL, dout, 0xff, sizeof got, &err), RX_OK);
        cr_assert_eq (K->graph_launch (be, NULL, 31, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (K->copy_d2h (be, NULL, got, dout, sizeof got, &err), RX_OK);
        cr_assert (s_bits_eq (got, eager[r], T * OUT), "routing %d: replay differs from eager", r);
    }
    /* checks of captured offsets run at replay: bad offsets fail the launch */
    int32_t bad[NE + 1] = { 0, 3, 2, 5, 6 };
    cr_assert_eq (K->graph_begin (be, NULL, 32, &err), RX_OK);
    cr_assert_eq (K->matmul_grouped (be, NULL, kw, doff, 0, dxs, IN, dys, OUT, NR, 0, &err), RX_OK);
    cr_assert_eq (K->graph_end (be, NULL, 32, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, doff, bad, sizeof bad, &err), RX_OK);
    cr_assert_eq (K->graph_launch (be, NULL, 32, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "matmul_grouped") && strstr (err.msg, "offsets[2]"), "%s", err.msg);
    K->weight_free (be, kw);
    K->destroy (be);
    free (wd);
    free (hx);
    free (hw);
}

/* ------------------------------------------------------ host_fn (ABI 1.4) -- */

/* A host function's argument: it copies n floats of device memory src to
 * the host through the backend's copy_d2h (as comm-shm's collectives do)
 * and logs each call. */
struct hf_arg {
    void *be;
    const float *src;            /* device; NULL: copy nothing */
    size_t n;
    int tag;
    float *seen;                 /* host [n]: what it copied */
    int *log;                    /* host: the tags of the calls, in order */
    int *n_log;
    const void **where;          /* the pointer fn was handed */
    int *rc;                     /* copy_d2h's result */
};

static void s_hf (void *p)
{
    struct hf_arg *a = p;
    if (a->where) *a->where = p;
    struct rx_err err = { 0 };
    if (a->src) *a->rc = K->copy_d2h (a->be, NULL, a->seen, a->src, a->n * sizeof (float), &err);
    a->log[(*a->n_log)++] = a->tag;
    a->tag = -1;                 /* writes its copy: the next launch must not see it */
}

/* Outside a capture fn runs before host_fn returns, on a copy of arg. */
Test (kcpu, host_fn_eager_runs_at_once_on_a_copy)
{
    void *be = s_create_x ("auto", 1, "graphs = true\n");
    cr_assert (RX_HAS (struct rx_kernels_ops, K, host_fn), "kernels-cpu has host_fn");
    struct rx_err err = { 0 };
    float x[4] = { 1, 2, 3, 4 }, seen[4] = { 0 }, *dx = NULL;
    cr_assert_eq (K->alloc (be, sizeof x, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
    int log[8], n_log = 0, crc = -99;
    const void *where = NULL;
    struct hf_arg a = { be, dx, 4, 7, seen, log, &n_log, &where, &crc };
    cr_assert_eq (K->host_fn (be, NULL, s_hf, &a, sizeof a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n_log, 1, "ran before host_fn returned");
    cr_assert_eq (log[0], 7);
    cr_assert_eq (crc, RX_OK, "copy_d2h inside fn");
    cr_assert (!memcmp (seen, x, sizeof x));
    cr_assert_neq (where, (const void *) &a, "fn got the backend's copy, not the caller's struct");
    cr_assert_eq (a.tag, 7, "fn wrote its copy only");
    /* another stream works too */
    rx_kstream_t *st = NULL;
    cr_assert_eq (K->stream_create (be, &st, &err), RX_OK);
    struct hf_arg b = { be, NULL, 0, 9, seen, log, &n_log, NULL, &crc };
    cr_assert_eq (K->host_fn (be, st, s_hf, &b, sizeof b, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n_log, 2);
    cr_assert_eq (log[1], 9);
    K->stream_destroy (be, st);
    K->free_ (be, dx);
    K->destroy (be);
}

/* Bad arguments: one clear error naming host_fn, nothing runs, a capture
 * in progress is kept. */
Test (kcpu, host_fn_bad_arguments)
{
    void *be = s_create_x ("auto", 1, "graphs = true\n");
    struct rx_err err = { 0 };
    int log[4], n_log = 0, crc = 0;
    unsigned char big[RX_KHOST_FN_MAX_ARG + 1];
    memset (big, 0, sizeof big);
    struct hf_arg *a = (struct hf_arg *) (void *) big;
    *a = (struct hf_arg) { be, NULL, 0, 1, NULL, log, &n_log, NULL, &crc };
    cr_assert_eq (K->host_fn (be, NULL, s_hf, big, sizeof big, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "host_fn") && strstr (err.msg, "257"), "%s", err.msg);
    cr_assert_eq (K->host_fn (be, NULL, NULL, big, 8, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "host_fn") && strstr (err.msg, "NULL fn"), "%s", err.msg);
    cr_assert_eq (K->host_fn (be, NULL, s_hf, NULL, 8, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "host_fn") && strstr (err.msg, "NULL arg"), "%s", err.msg);
    cr_assert_eq (K->host_fn (NULL, NULL, s_hf, big, 8, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "host_fn"), "%s", err.msg);
    int junk = 0;
    cr_assert_eq (K->host_fn (be, (rx_kstream_t *) (void *) &junk, s_hf, big, 8, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "host_fn") && strstr (err.msg, "stream"), "%s", err.msg);
    cr_assert_eq (n_log, 0, "nothing ran");
    /* the largest argument is fine, eager and captured */
    cr_assert_eq (K->host_fn (be, NULL, s_hf, big, RX_KHOST_FN_MAX_ARG, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n_log, 1);
    cr_assert_eq (K->graph_begin (be, NULL, 3, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, NULL, big, 8, &err), RX_EINVAL);
    cr_assert_eq (K->host_fn (be, NULL, s_hf, big, RX_KHOST_FN_MAX_ARG, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->graph_end (be, NULL, 3, &err), RX_OK, "a refused host_fn keeps the capture: %s",
                  err.msg);
    cr_assert_eq (n_log, 1, "captured, not run");
    cr_assert_eq (K->graph_launch (be, NULL, 3, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n_log, 2);
    K->destroy (be);
}

/* During a capture host_fn is recorded: it runs at every launch, in order
 * with the ops around it, on the capture's argument bytes; the backend's
 * ops it calls at a launch run (nothing is being captured then). */
static void s_hf_free (void *p)
{
    void *const *a = p;
    K->free_ (a[0], a[1]);
}

static void s_hf_begin (void *p)
{
    void **a = p;
    struct rx_err err = { 0 };
    *(int *) a[1] = K->graph_begin (a[0], NULL, 77, &err);
}

Test (kcpu, host_fn_in_a_graph_runs_at_every_launch)
{
    void *be = s_create_x ("auto", 1, "graphs = true\n");
    struct rx_err err = { 0 };
    enum { N = 8 };
    float x[N], y[N], seen[N], *dx = NULL, *dy = NULL;
    for (int i = 0; i < N; i++) x[i] = (float) (i + 1);
    cr_assert_eq (K->alloc (be, sizeof x, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof y, 0, (void **) &dy, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
    cr_assert_eq (K->memset_ (be, NULL, dy, 0, sizeof y, &err), RX_OK);
    int log[16], n_log = 0, crc = -99;
    memset (seen, 0, sizeof seen);
    struct hf_arg a = { be, dy, N, 5, seen, log, &n_log, NULL, &crc };
    /* y = 2x; fn copies y to the host; y *= 3 */
    cr_assert_eq (K->graph_begin (be, NULL, 40, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->scale (be, NULL, dx, N, dy, N, 1, N, 2.f, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, s_hf, &a, sizeof a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->scale (be, NULL, dy, N, dy, N, 1, N, 3.f, &err), RX_OK);
    cr_assert_eq (n_log, 0, "not run during the capture");
    cr_assert_eq (K->graph_end (be, NULL, 40, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n_log, 0, "not run at graph_end");
    a.tag = 6;                   /* too late: the capture has its copy */
    for (int l = 0; l < 3; l++) {
        for (int i = 0; i < N; i++) x[i] = (float) (10 * l + i);
        cr_assert_eq (K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
        crc = -99;
        cr_assert_eq (K->graph_launch (be, NULL, 40, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (n_log, l + 1, "once per launch");
        cr_assert_eq (log[l], 5, "the capture's bytes, every launch (fn's write to its copy is lost)");
        cr_assert_eq (crc, RX_OK, "copy_d2h inside a launched fn runs");
        cr_assert_eq (K->copy_d2h (be, NULL, y, dy, sizeof y, &err), RX_OK);
        for (int i = 0; i < N; i++) {
            cr_assert_eq (seen[i], 2.f * x[i], "launch %d: fn saw y after the first scale", l);
            cr_assert_eq (y[i], 6.f * x[i], "launch %d: the second scale ran after fn", l);
        }
    }
    /* Two host_fns and an op: recorded order. */
    struct hf_arg b1 = { be, NULL, 0, 11, seen, log, &n_log, NULL, &crc };
    struct hf_arg b2 = { be, NULL, 0, 12, seen, log, &n_log, NULL, &crc };
    cr_assert_eq (K->graph_begin (be, NULL, 41, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, s_hf, &b1, sizeof b1, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, s_hf, &b2, sizeof b2, &err), RX_OK);
    cr_assert_eq (K->graph_end (be, NULL, 41, &err), RX_OK);
    n_log = 0;
    cr_assert_eq (K->graph_launch (be, NULL, 41, &err), RX_OK);
    cr_assert_eq (n_log, 2);
    cr_assert (log[0] == 11 && log[1] == 12, "%d %d", log[0], log[1]);
    /* A launched fn cannot capture (graph_begin from inside a launch is
     * refused) ... */
    int brc = 0;
    void *bg[2] = { be, &brc };
    cr_assert_eq (K->graph_begin (be, NULL, 42, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, s_hf_begin, bg, sizeof bg, &err), RX_OK);
    cr_assert_eq (K->graph_end (be, NULL, 42, &err), RX_OK);
    cr_assert_eq (K->graph_launch (be, NULL, 42, &err), RX_OK);
    cr_assert_eq (brc, RX_EINVAL, "graph_begin inside a launch");
    cr_assert_eq (K->graph_begin (be, NULL, 43, &err), RX_OK, "no capture was left open: %s", err.msg);
    cr_assert_eq (K->graph_end (be, NULL, 43, &err), RX_OK);
    /* ... and one that frees memory drops the graphs after the launch, not
     * under it (ASan/valgrind: no use after free). */
    float *dz = NULL;
    cr_assert_eq (K->alloc (be, 64, 0, (void **) &dz, &err), RX_OK);
    void *fr[2] = { be, dz };
    cr_assert_eq (K->graph_begin (be, NULL, 44, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, s_hf_free, fr, sizeof fr, &err), RX_OK);
    cr_assert_eq (K->scale (be, NULL, dx, N, dy, N, 1, N, 1.f, &err), RX_OK);
    cr_assert_eq (K->graph_end (be, NULL, 44, &err), RX_OK);
    cr_assert_eq (K->graph_launch (be, NULL, 44, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, y, dy, sizeof y, &err), RX_OK);
    for (int i = 0; i < N; i++) cr_assert_eq (y[i], x[i], "the op after the freeing fn ran");
    cr_assert_eq (K->graph_has (be, 44) + K->graph_has (be, 40), 0, "dropped once the launch ended");
    K->free_ (be, dx);
    K->free_ (be, dy);
    K->destroy (be);
}

/* Guard mode: fn is host code (device memory stays inaccessible to it);
 * the backend's copies it calls work, eager and launched. */
#if defined(__SANITIZE_ADDRESS__)
#  define S_HF_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define S_HF_ASAN 1
#  endif
#endif

static void s_hf_touch (void *p)
{
    volatile float *d = *(float *const *) p;
    d[0] = 1.f;                  /* a host access to device memory: must fault */
}

Test (kcpu, host_fn_in_guard_mode)
{
    void *be = s_create_x ("auto", 1, "graphs = true\nguard_device_memory = true\n");
    struct rx_err err = { 0 };
    float x[4] = { 1, 2, 3, 4 }, seen[4] = { 0 }, *dx = NULL;
    cr_assert_eq (K->alloc (be, sizeof x, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
    int log[8], n_log = 0, crc = -99;
    struct hf_arg a = { be, dx, 4, 1, seen, log, &n_log, NULL, &crc };
    cr_assert_eq (K->host_fn (be, NULL, s_hf, &a, sizeof a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (crc, RX_OK, "eager copy_d2h in guard mode");
    cr_assert (!memcmp (seen, x, sizeof x));
    cr_assert_eq (K->graph_begin (be, NULL, 50, &err), RX_OK);
    cr_assert_eq (K->scale (be, NULL, dx, 4, dx, 4, 1, 4, 2.f, &err), RX_OK);
    cr_assert_eq (K->host_fn (be, NULL, s_hf, &a, sizeof a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->graph_end (be, NULL, 50, &err), RX_OK);
    crc = -99;
    cr_assert_eq (K->graph_launch (be, NULL, 50, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (crc, RX_OK, "launched copy_d2h in guard mode");
    for (int i = 0; i < 4; i++) cr_assert_eq (seen[i], 2.f * x[i]);
#ifndef S_HF_ASAN
    /* fn itself touching device memory faults, as any host code does */
    pid_t pid = fork ();
    cr_assert_geq (pid, 0);
    if (pid == 0) {
        int fd = open ("/dev/null", O_WRONLY);
        if (fd >= 0) dup2 (fd, 2);
        K->host_fn (be, NULL, s_hf_touch, &dx, sizeof dx, &err);
        _exit (4);
    }
    int st = 0;
    cr_assert_eq (waitpid (pid, &st, 0), pid);
    cr_assert (WIFSIGNALED (st) && WTERMSIG (st) == SIGSEGV, "child status 0x%x", st);
#endif
    K->free_ (be, dx);
    K->destroy (be);
}

/* ------------------ the low-latency expert-parallel exchange (ABI 1.4) -- */

/* The contract's split of experts over ranks, and its owner by scan. */
static size_t t_first (size_t p, size_t ne, size_t nr) { return p * ne / nr; }

static size_t t_owner (size_t e, size_t ne, size_t nr)
{
    size_t p = 0;
    while (p + 1 < nr && t_first (p + 1, ne, nr) <= e) p++;
    return p;
}

static int32_t t_hdr (const float *blk, size_t i)
{
    int32_t v;
    memcpy (&v, blk + i, sizeof v);
    return v;
}

static const uint32_t s_sentinel = 0x7fc0deadu;   /* a NaN payload: unsent rows keep it */

static void s_fill_sentinel (float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) memcpy (p + i, &s_sentinel, 4);
}

static int s_is_sentinel (const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp (p + i, &s_sentinel, 4)) return 0;
    return 1;
}

/* Worked out by hand: moe_sort_by_hand's routing (ids [[2, 0], [1, 2],
 * [0, 5]] over 4 experts: sorted rows e0: (t0, j1), (t2, j0); e1: (t1,
 * j0); e2: (t0, j0), (t1, j1)) packed for 2 ranks (rank 0 owns experts 0
 * and 1, rank 1 experts 2 and 3), hrows 1, dim 4, slots 6: blocks of 7
 * rows.  Then that send buffer unpacked as rank 0's recv (n_local 2). */
Test (kcpu, moe_ll_by_hand)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    enum { T = 3, KK = 2, NE = 4, NR = 2, S = 6, H = 1, D = 4, B = H + S };
    const int32_t ids[T * KK] = { 2, 0, 1, 2, 0, 5 };
    int32_t off[NE + 1], row[T * KK], src[T * KK], slot[T * KK];
    float x[T * (D + 1)], send[NR * B * D];
    for (int i = 0; i < T * (D + 1); i++) x[i] = (float) (10 * (i / (D + 1)) + i % (D + 1)) + 0.5f;
    cr_assert_eq (K->moe_sort (be, NULL, ids, T, KK, NE, off, row, src, &err), RX_OK, "%s", err.msg);
    s_fill_sentinel (send, NR * B * D);
    cr_assert_eq (K->moe_ll_pack (be, NULL, x, D + 1, ids, off, row, src, T, KK, NE, NR, S, H, D, send,
                                  slot, &err), RX_OK, "%s", err.msg);
    const int32_t w_hdr[NR][D] = { { 2, 1, 0, 0 }, { 2, 0, 0, 0 } };
    for (int p = 0; p < NR; p++)
        for (int i = 0; i < D; i++)
            cr_assert_eq (t_hdr (send + p * B * D, i), w_hdr[p][i], "block %d header[%d] = %d", p, i,
                          t_hdr (send + p * B * D, i));
    const int w_tok[NR][3] = { { 0, 2, 1 }, { 0, 1, -1 } };   /* the tokens of the sent rows */
    for (int p = 0; p < NR; p++)
        for (int i = 0; i < S; i++) {
            const float *r = send + ((size_t) p * B + H + i) * D;
            if (i < 3 && w_tok[p][i] >= 0)
                cr_assert (s_bits_eq (r, x + w_tok[p][i] * (D + 1), D), "block %d row %d", p, i);
            else
                cr_assert (s_is_sentinel (r, D), "block %d row %d was written", p, i);
        }
    const int32_t w_slot[T * KK] = { 8, 1, 3, 9, 2, -1 };
    for (int i = 0; i < T * KK; i++) cr_assert_eq (slot[i], w_slot[i], "slot_of[%d] = %d", i, slot[i]);

    /* block 0: e0 2, e1 1; block 1: e0 2, e1 0 -> e0's routed rows are
     * block 0's two then block 1's two, then e1's one. */
    int32_t loff[3], order[NR * S], back[NR * B];
    for (int i = 0; i < NR * S; i++) order[i] = 77;
    cr_assert_eq (K->moe_ll_unpack (be, NULL, send, NR, S, H, D, 2, loff, order, back, &err), RX_OK, "%s",
                  err.msg);
    const int32_t w_off[3] = { 0, 4, 5 };
    const int32_t w_order[NR * S] = { 1, 2, 8, 9, 3, -1, -1, -1, -1, -1, -1, -1 };
    const int32_t w_back[NR * B] = { -1, 0, 1, 4, -1, -1, -1, -1, 2, 3, -1, -1, -1, -1 };
    for (int i = 0; i < 3; i++) cr_assert_eq (loff[i], w_off[i], "offsets[%d] = %d", i, loff[i]);
    for (int i = 0; i < NR * S; i++) cr_assert_eq (order[i], w_order[i], "order[%d] = %d", i, order[i]);
    for (int i = 0; i < NR * B; i++) cr_assert_eq (back[i], w_back[i], "back[%d] = %d", i, back[i]);

    /* n_tok 0 (an idle rank): every header written, all counts 0, nothing
     * else touched; only offsets and send are needed. */
    s_fill_sentinel (send, NR * B * D);
    const int32_t zoff[NE + 1] = { 0 };
    cr_assert_eq (K->moe_ll_pack (be, NULL, NULL, 0, NULL, zoff, NULL, NULL, 0, KK, NE, NR, S, H, D, send,
                                  NULL, &err), RX_OK, "%s", err.msg);
    for (int p = 0; p < NR; p++) {
        for (int i = 0; i < H * D; i++) cr_assert_eq (t_hdr (send + p * B * D, i), 0);
        cr_assert (s_is_sentinel (send + ((size_t) p * B + H) * D, S * D), "block %d rows written", p);
    }
    K->destroy (be);
}

/* Counts cannot be checked on a device: a negative one counts 0 and a
 * block's counts are cut where their sum passes slots.  n_rank 2, slots
 * 4, n_local 3: block 0 says [-5, 3, 9] -> [0, 3, 1], block 1 [2, 2, 2]
 * -> [2, 2, 0].  Worked out by hand. */
Test (kcpu, moe_ll_unpack_clamps_bad_counts)
{
    void *be = s_create ("auto", 1);
    struct rx_err err = { 0 };
    enum { NR = 2, S = 4, H = 1, D = 4, B = H + S, L = 3 };
    float recv[NR * B * D];
    for (int i = 0; i < NR * B * D; i++) recv[i] = (float) i;
    const int32_t h0[D] = { -5, 3, 9, 1234 }, h1[D] = { 2, 2, 2, -1 };   /* [3]: past n_local */
    memcpy (recv, h0, sizeof h0);
    memcpy (recv + B * D, h1, sizeof h1);
    int32_t off[L + 1], order[NR * S], back[NR * B];
    cr_assert_eq (K->moe_ll_unpack (be, NULL, recv, NR, S, H, D, L, off, order, back, &err), RX_OK, "%s",
                  err.msg);
    const int32_t w_off[L + 1] = { 0, 2, 7, 8 };
    const int32_t w_order[NR * S] = { 6, 7, 1, 2, 3, 8, 9, 4 };
    const int32_t w_back[NR * B] = { -1, 2, 3, 4, 7, -1, 0, 1, 5, 6 };
    for (int i = 0; i <= L; i++) cr_assert_eq (off[i], w_off[i], "offsets[%d] = %d", i, off[i]);
    for (int i = 0; i < NR * S; i++) cr_assert_eq (order[i], w_order[i], "order[%d] = %d", i, order[i]);
    for (int i = 0; i < NR * B; i++) cr_assert_eq (back[i], w_back[i], "back[%d] = %d", i, back[i]);
    /* a header of all -1 (say, 0xff bytes): nothing routed */
    memset (recv, 0xff, sizeof recv);
    cr_assert_eq (K->moe_ll_unpack (be, NULL, recv, NR, S, H, D, L, off, order, back, &err), RX_OK);
    for (int i = 0; i <= L; i++) cr_assert_eq (off[i], 0);
    for (int i = 0; i < NR * S; i++) cr_assert_eq (order[i], -1);
    for (int i = 0; i < NR * B; i++) cr_assert_eq (back[i], -1);
    K->destroy (be);
}

/* One rank's side of a random exchange. */
struct ll_rank {
    size_t n_tok;
    int32_t *ids, *off, *row, *src, *slot;
    float *x, *send, *recv, *ret;
};

/* A group of nr ranks simulated in one process: each rank routes its own
 * random tokens (some invalid ids, sometimes skewed to one expert, some
 * ranks idle), sorts and packs; block q of rank p's send becomes block p
 * of rank q's recv; each rank unpacks.  Checked against references
 * computed here from ids alone: every header int, sent row (bits) and
 * unsent row (sentinel), slot_of; offsets, order and back; gather_rows
 * (recv, order) = the routed rows expert-major, rank-minor; back inverts
 * order; and the way back: gather_rows (routed, back), the reverse
 * exchange, and row slot_of of it is the choice's own token row. */
Test (kcpu, moe_ll_random_exchange, .timeout = 120)
{
    void *be = s_create ("auto", 2);
    struct rx_err err = { 0 };
    for (int it = 0; it < 60; it++) {
        const size_t nr = 1 + s_next () % 4, ne = nr + s_next () % 14, kk = 1 + s_next () % 4;
        const size_t max_tok = 1 + s_next () % 9, slots = max_tok * kk + s_next () % 5;
        const size_t most = (ne + nr - 1) / nr;
        const size_t dim = 1 + s_next () % 9, hrows = (most + dim - 1) / dim + s_next () % 2;
        const size_t ldx = dim + s_next () % 3, B = hrows + slots, blk = B * dim;
        const int skew = it % 4 == 3;
        struct ll_rank rk[4];
        for (size_t p = 0; p < nr; p++) {
            struct ll_rank *r = &rk[p];
            r->n_tok = it % 5 == 1 && p == 0 ? 0 : s_next () % (max_tok + 1);
            const size_t n = r->n_tok * kk;
            r->ids = malloc ((n + 1) * 4);
            r->row = malloc ((n + 1) * 4);
            r->src = malloc ((n + 1) * 4);
            r->slot = malloc ((n + 1) * 4);
            r->off = malloc ((ne + 1) * 4);
            r->x = malloc ((r->n_tok * ldx + 1) * 4);
            r->send = malloc (nr * blk * 4);
            r->recv = malloc (nr * blk * 4);
            r->ret = malloc (nr * blk * 4);
            for (size_t i = 0; i < r->n_tok * ldx; i++) r->x[i] = s_gauss ();
            for (size_t i = 0; i < n; i++) {
                const uint64_t u = s_next () % 100;
                r->ids[i] = u < 6 ? -1 : u < 10 ? (int32_t) ne
                          : skew && u < 80 ? (int32_t) (ne - 1) : (int32_t) (s_next () % ne);
            }
            cr_assert_eq (K->moe_sort (be, NULL, r->ids, r->n_tok, kk, ne, r->off, r->row, r->src, &err),
                          RX_OK, "%s", err.msg);
            s_fill_sentinel (r->send, nr * blk);
            for (size_t i = 0; i <= n; i++) r->slot[i] = 77;
            cr_assert_eq (K->moe_ll_pack (be, NULL, r->x, ldx, r->ids, r->off, r->row, r->src, r->n_tok, kk,
                                          ne, nr, slots, hrows, dim, r->send, r->slot, &err),
                          RX_OK, "it %d rank %zu: %s", it, p, err.msg);
            cr_assert_eq (r->slot[n], 77, "slot_of has n_tok * k entries");
            /* the reference: for each destination d, its experts in order,
             * each expert's choices in (token, choice) order */
            for (size_t d = 0; d < nr; d++) {
                const float *b = r->send + d * blk;
                const size_t f0 = t_first (d, ne, nr), f1 = t_first (d + 1, ne, nr);
                size_t i = 0;
                for (size_t e = f0; e < f1; e++) {
                    int32_t cnt = 0;
                    for (size_t t = 0; t < r->n_tok; t++)
                        for (size_t j = 0; j < kk; j++) {
                            if (r->ids[t * kk + j] != (int32_t) e) continue;
                            cr_assert (s_bits_eq (b + (hrows + i) * dim, r->x + t * ldx, dim),
                                       "it %d: rank %zu block %zu row %zu is not token %zu", it, p, d, i, t);
                            cr_assert_eq (r->slot[t * kk + j], (int32_t) (d * B + hrows + i),
                                          "it %d: slot_of[%zu]", it, t * kk + j);
                            cr_assert_eq (t_owner (e, ne, nr), d);
                            cnt++;
                            i++;
                        }
                    cr_assert_eq (t_hdr (b, e - f0), cnt, "it %d: rank %zu block %zu count of expert %zu",
                                  it, p, d, e);
                }
                for (size_t h = f1 - f0; h < hrows * dim; h++)
                    cr_assert_eq (t_hdr (b, h), 0, "it %d: header int %zu past the counts", it, h);
                cr_assert (s_is_sentinel (b + (hrows + i) * dim, (slots - i) * dim),
                           "it %d: rank %zu block %zu: a row past the %zu sent was written", it, p, d, i);
            }
            for (size_t i = 0; i < n; i++)
                if (r->ids[i] < 0 || r->ids[i] >= (int32_t) ne)
                    cr_assert_eq (r->slot[i], -1, "it %d: slot_of of an invalid choice", it);
        }
        /* the exchange */
        for (size_t p = 0; p < nr; p++)
            for (size_t q = 0; q < nr; q++)
                memcpy (rk[q].recv + p * blk, rk[p].send + q * blk, blk * 4);
        for (size_t q = 0; q < nr; q++) {
            struct ll_rank *r = &rk[q];
            const size_t f0 = t_first (q, ne, nr), nl = t_first (q + 1, ne, nr) - f0;
            int32_t *off = malloc ((nl + 2) * 4), *order = malloc ((nr * slots + 1) * 4);
            int32_t *back = malloc ((nr * B + 1) * 4);
            off[nl + 1] = order[nr * slots] = back[nr * B] = 77;
            cr_assert_eq (K->moe_ll_unpack (be, NULL, r->recv, nr, slots, hrows, dim, nl, off, order, back,
                                            &err), RX_OK, "%s", err.msg);
            cr_assert (off[nl + 1] == 77 && order[nr * slots] == 77 && back[nr * B] == 77, "wrote past");
            /* reference order: expert-major, rank-minor, from the senders' ids */
            size_t rr = 0;
            for (size_t e = 0; e < nl; e++) {
                cr_assert_eq (off[e], (int32_t) rr, "it %d rank %zu: offsets[%zu]", it, q, e);
                for (size_t p = 0; p < nr; p++) {
                    size_t before = 0;   /* p's rows for q of the experts before e */
                    for (size_t i = 0; i < rk[p].n_tok * kk; i++)
                        before += rk[p].ids[i] >= (int32_t) f0 && rk[p].ids[i] < (int32_t) (f0 + e);
                    size_t i = 0;
                    for (size_t c = 0; c < rk[p].n_tok * kk; c++) {
                        if (rk[p].ids[c] != (int32_t) (f0 + e)) continue;
                        const int32_t want = (int32_t) (p * B + hrows + before + i);
                        cr_assert_eq (order[rr], want, "it %d rank %zu: order[%zu] = %d, want %d", it, q,
                                      rr, order[rr], want);
                        cr_assert_eq (back[want], (int32_t) rr, "it %d: back[%d]", it, want);
                        rr++;
                        i++;
                    }
                }
            }
            cr_assert_eq (off[nl], (int32_t) rr, "it %d rank %zu: offsets[n_local]", it, q);
            for (size_t i = rr; i < nr * slots; i++) cr_assert_eq (order[i], -1);
            size_t n_back = 0;
            for (size_t i = 0; i < nr * B; i++)
                if (back[i] >= 0) {
                    cr_assert (back[i] < (int32_t) rr && order[back[i]] == (int32_t) i, "back inverts order");
                    n_back++;
                } else {
                    cr_assert_eq (back[i], -1);
                }
            cr_assert_eq (n_back, rr, "it %d: back maps exactly the routed rows", it);
            /* the routed rows, then the way back (y = x: an identity expert) */
            float *routed = malloc ((nr * slots + 1) * dim * 4);
            cr_assert_eq (K->gather_rows (be, NULL, r->recv, dim, order, nr * slots, dim, routed, dim, &err),
                          RX_OK, "%s", err.msg);
            rr = 0;
            for (size_t e = 0; e < nl; e++)
                for (size_t p = 0; p < nr; p++)
                    for (size_t c = 0; c < rk[p].n_tok * kk; c++)
                        if (rk[p].ids[c] == (int32_t) (f0 + e)) {
                            cr_assert (s_bits_eq (routed + rr * dim, rk[p].x + (c / kk) * ldx, dim),
                                       "it %d rank %zu: routed row %zu", it, q, rr);
                            rr++;
                        }
            cr_assert_eq (K->gather_rows (be, NULL, routed, dim, back, nr * B, dim, r->ret, dim, &err), RX_OK,
                          "%s", err.msg);
            free (routed);
            free (off);
            free (order);
            free (back);
        }
        for (size_t p = 0; p < nr; p++) {   /* the reverse exchange: rank p's block q from rank q */
            float *home = malloc (nr * blk * 4);
            for (size_t q = 0; q < nr; q++) memcpy (home + q * blk, rk[q].ret + p * blk, blk * 4);
            for (size_t c = 0; c < rk[p].n_tok * kk; c++)
                if (rk[p].slot[c] >= 0)
                    cr_assert (s_bits_eq (home + (size_t) rk[p].slot[c] * dim, rk[p].x + (c / kk) * ldx, dim),
                               "it %d: rank %zu choice %zu comes back at slot_of", it, p, c);
            free (home);
        }
        for (size_t p = 0; p < nr; p++) {
            struct ll_rank *r = &rk[p];
            free (r->ids); free (r->row); free (r->src); free (r->slot); free (r->off);
            free (r->x); free (r->send); free (r->recv); free (r->ret);
        }
    }
    K->destroy (be);
}

Test (kcpu, moe_ll_errors)
{
    void *be = s_create ("auto", 1);
    struct rx_err err = { 0 };
    enum { T = 2, KK = 2, NE = 4, NR = 2, S = 4, H = 1, D = 4, B = H + S };
    int32_t ids[T * KK] = { 0, 3, 2, 1 }, off[NE + 1], row[T * KK], src[T * KK], slot[T * KK];
    float x[T * D] = { 0 }, send[NR * B * D];
    int32_t loff[3], order[NR * S], back[NR * B];
    cr_assert_eq (K->moe_sort (be, NULL, ids, T, KK, NE, off, row, src, &err), RX_OK);
#define S_BAD(call, op, what, frag)                                                            \
    do {                                                                                       \
        memset (&err, 0, sizeof err);                                                          \
        cr_assert_eq ((call), RX_EINVAL, "%s: %s accepted", op, what);                         \
        cr_assert (strstr (err.msg, op) && strstr (err.msg, "kernels-cpu") && strstr (err.msg, frag), \
                   "%s: %s", what, err.msg);                                                   \
    } while (0)
#define S_PACK(x_, ids_, off_, row_, src_, t_, k_, ne_, nr_, s_, h_, d_, send_, slot_)         \
    K->moe_ll_pack (be, NULL, x_, D, ids_, off_, row_, src_, t_, k_, ne_, nr_, s_, h_, d_, send_, slot_, &err)
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, NR, 3, H, D, send, slot), "moe_ll_pack",
           "n_tok * k > slots", "exceed the 3 slots");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, 1, S, 1, 3, send, slot), "moe_ll_pack",
           "header too small", "largest rank's 4 expert counts");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, 0, S, H, D, send, slot), "moe_ll_pack", "n_rank 0",
           "n_rank 0");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, 5, S, H, D, send, slot), "moe_ll_pack",
           "n_rank > n_expert", "n_rank 5 outside 1..n_expert (4)");
    S_BAD (S_PACK (x, ids, off, row, src, T, 0, NE, NR, S, H, D, send, slot), "moe_ll_pack", "k 0", "k is 0");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, 0, NR, S, H, D, send, slot), "moe_ll_pack", "n_expert 0",
           "n_expert 0");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, NR, S, 0, D, send, slot), "moe_ll_pack", "hrows 0",
           "hrows 0");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, NR, (size_t) 1 << 31, H, D, send, slot), "moe_ll_pack",
           "rows past int32", "do not fit int32");
    S_BAD (S_PACK (x, ids, NULL, row, src, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack",
           "offsets NULL", "offsets or send is NULL");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, NR, S, H, D, NULL, slot), "moe_ll_pack", "send NULL",
           "offsets or send is NULL");
    S_BAD (S_PACK (NULL, NULL, off, NULL, NULL, 0, KK, NE, NR, S, H, D, NULL, NULL), "moe_ll_pack",
           "n_tok 0, send NULL", "written even for n_tok 0");
    S_BAD (S_PACK (NULL, ids, off, row, src, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack", "x NULL",
           "is NULL");
    S_BAD (S_PACK (x, NULL, off, row, src, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack", "ids NULL",
           "is NULL");
    S_BAD (S_PACK (x, ids, off, NULL, src, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack", "row NULL",
           "is NULL");
    S_BAD (S_PACK (x, ids, off, row, NULL, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack", "src NULL",
           "is NULL");
    S_BAD (S_PACK (x, ids, off, row, src, T, KK, NE, NR, S, H, D, send, NULL), "moe_ll_pack", "slot_of NULL",
           "is NULL");
    S_BAD (K->moe_ll_pack (be, NULL, x, D - 1, ids, off, row, src, T, KK, NE, NR, S, H, D, send, slot, &err),
           "moe_ll_pack", "ldx < dim", "ldx = 3");
    S_BAD (K->moe_ll_pack (be, (rx_kstream_t *) x, x, D, ids, off, row, src, T, KK, NE, NR, S, H, D, send,
                           slot, &err), "moe_ll_pack", "bad stream", "bad stream");
    /* offsets and src not moe_sort's: caught on the CPU */
    int32_t boff[NE + 1] = { 0, 3, 2, 4, 4 }, bsrc[T * KK] = { 0, 1, 2, 1 };
    S_BAD (S_PACK (x, ids, boff, row, src, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack",
           "decreasing offsets", "offsets[2] = 2");
    boff[2] = 3;
    boff[4] = 9;
    S_BAD (S_PACK (x, ids, boff, row, src, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack",
           "offsets past n_tok * k", "offsets[4] = 9");
    S_BAD (S_PACK (x, ids, off, row, bsrc, T, KK, NE, NR, S, H, D, send, slot), "moe_ll_pack",
           "src not a token", "src[2] = 2");
    cr_assert_eq (S_PACK (x, ids, off, row, src, T, KK, NE, NR, S, H, D, send, slot), RX_OK, "%s", err.msg);
    /* exactly full: n_tok * k == slots, header exactly the counts */
    cr_assert_eq (S_PACK (x, ids, off, row, src, T, KK, NE, 1, T * KK, 1, NE, send, slot), RX_OK, "%s",
                  err.msg);

#define S_UNPACK(recv_, nr_, s_, h_, d_, nl_, off_, ord_, back_)                                \
    K->moe_ll_unpack (be, NULL, recv_, nr_, s_, h_, d_, nl_, off_, ord_, back_, &err)
    S_BAD (S_UNPACK (send, 0, S, H, D, 2, loff, order, back), "moe_ll_unpack", "n_rank 0", "n_rank is 0");
    S_BAD (S_UNPACK (send, NR, S, H, D, 0, loff, order, back), "moe_ll_unpack", "n_local 0", "n_local 0");
    S_BAD (S_UNPACK (send, NR, S, 1, 2, 3, loff, order, back), "moe_ll_unpack", "n_local > header",
           "n_local 3 outside 1..2");
    S_BAD (S_UNPACK (send, NR, S, 0, D, 2, loff, order, back), "moe_ll_unpack", "hrows 0", "hrows 0");
    S_BAD (S_UNPACK (send, NR, (size_t) 1 << 31, H, D, 2, loff, order, back), "moe_ll_unpack",
           "rows past int32", "do not fit int32");
    S_BAD (S_UNPACK (NULL, NR, S, H, D, 2, loff, order, back), "moe_ll_unpack", "recv NULL", "is NULL");
    S_BAD (S_UNPACK (send, NR, S, H, D, 2, NULL, order, back), "moe_ll_unpack", "offsets NULL", "is NULL");
    S_BAD (S_UNPACK (send, NR, S, H, D, 2, loff, NULL, back), "moe_ll_unpack", "order NULL", "is NULL");
    S_BAD (S_UNPACK (send, NR, S, H, D, 2, loff, order, NULL), "moe_ll_unpack", "back NULL", "is NULL");
    cr_assert_eq (S_UNPACK (send, NR, S, H, D, 2, loff, order, back), RX_OK, "%s", err.msg);
#undef S_UNPACK
#undef S_PACK
#undef S_BAD
    K->destroy (be);
}

/* Captured in an emulated graph: nothing runs at capture; a launch packs
 * and unpacks the routing in device memory at launch time. */
Test (kcpu, moe_ll_in_emulated_graphs)
{
    void *be = s_create_x ("auto", 1, "graphs = true\n");
    struct rx_err err = { 0 };
    enum { T = 3, KK = 2, NE = 4, NR = 2, S = 6, H = 1, D = 4, B = H + S };
    int32_t ids[T * KK] = { 2, 0, 1, 2, 0, 5 }, off[NE + 1], row[T * KK], src[T * KK], slot[T * KK];
    float x[T * D], send[NR * B * D], want_send[NR * B * D];
    int32_t loff[3], order[NR * S], back[NR * B], want[3 + NR * S + NR * B + T * KK];
    for (int i = 0; i < T * D; i++) x[i] = (float) i;
    cr_assert_eq (K->graph_begin (be, NULL, 9, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->moe_sort (be, NULL, ids, T, KK, NE, off, row, src, &err), RX_OK);
    cr_assert_eq (K->moe_ll_pack (be, NULL, x, D, ids, off, row, src, T, KK, NE, NR, S, H, D, send, slot, &err),
                  RX_OK, "%s", err.msg);
    cr_assert_eq (K->moe_ll_unpack (be, NULL, send, NR, S, H, D, 2, loff, order, back, &err), RX_OK, "%s",
                  err.msg);
    cr_assert_eq (K->graph_end (be, NULL, 9, &err), RX_OK, "%s", err.msg);
    /* a new routing, then the eager result of it */
    ids[0] = 1;
    ids[5] = 3;
    s_fill_sentinel (send, NR * B * D);
    cr_assert_eq (K->moe_sort (be, NULL, ids, T, KK, NE, off, row, src, &err), RX_OK);
    cr_assert_eq (K->moe_ll_pack (be, NULL, x, D, ids, off, row, src, T, KK, NE, NR, S, H, D, send, slot, &err),
                  RX_OK);
    cr_assert_eq (K->moe_ll_unpack (be, NULL, send, NR, S, H, D, 2, loff, order, back, &err), RX_OK);
    memcpy (want_send, send, sizeof send);
    memcpy (want, loff, sizeof loff);
    memcpy (want + 3, order, sizeof order);
    memcpy (want + 3 + NR * S, back, sizeof back);
    memcpy (want + 3 + NR * S + NR * B, slot, sizeof slot);
    cr_assert_eq (t_hdr (send, 1), 2, "expert 1 got t0 and t1");
    s_fill_sentinel (send, NR * B * D);
    memset (loff, 0x55, sizeof loff);
    memset (order, 0x55, sizeof order);
    memset (back, 0x55, sizeof back);
    memset (slot, 0x55, sizeof slot);
    cr_assert_eq (K->graph_launch (be, NULL, 9, &err), RX_OK, "%s", err.msg);
    cr_assert (memcmp (send, want_send, sizeof send) == 0, "launched pack differs from eager");
    cr_assert (memcmp (loff, want, sizeof loff) == 0 && memcmp (order, want + 3, sizeof order) == 0 &&
               memcmp (back, want + 3 + NR * S, sizeof back) == 0 &&
               memcmp (slot, want + 3 + NR * S + NR * B, sizeof slot) == 0, "launched unpack differs");
    K->destroy (be);
}
