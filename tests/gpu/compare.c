/* tests/gpu/compare.c -- every op of kernels-cuda against kernels-cpu on the
 * same random inputs (run by tests/gpu/check.sh on a GPU machine).
 *
 *   tests/gpu/compare [PLUGIN_DIR]     (default $RX_PLUGIN_BUILD_DIR)
 *
 * RX_COMPARE_BACKEND=cpu compares kernels-cpu with itself: a self-test of
 * this harness on machines without a GPU (every error is then 0).
 * RX_COMPARE_INI="[kernels.cuda]\nmatvec = fast\nattention = tiled" gives
 * the compared backend that configuration (check.sh runs both kernel sets).
 * Split-K attention also runs on three more instances of the compared
 * backend with attention_splits = 0, 3 and 7 (the rest as configured).
 *
 * Prints one line per case: PASS/FAIL, the op and shape, and the error
 * max|cuda - cpu| / max|cpu|.  Exit 0 if all pass, 1 if any fails, 77
 * (skipped) when kernels-cuda cannot create an instance (no GPU).
 *
 * Tolerances: the CPU quantizes activations to Q8_0/Q8_K for quantized
 * weights while the GPU multiplies F32 activations (matvec) or F16/BF16
 * ones (cuBLAS), so quantized matmuls compare within 3e-2 of the output's
 * scale, F16/BF16 GEMMs within 1e-2; everything else within 1e-4 (RoPE:
 * 1e-3, the angle math differs by ulps at large positions). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <radix/kernel.h>
#include <radix/plugin.h>

#include "conf.h"
#include "loader.h"
#include "quant.h"

struct be {
    const struct rx_kernels_ops *K;
    void *be;
    const char *name;
};

static struct be C, G;     /* cpu, cuda */
static rx_plugin_t *s_gplug;  /* G's plugin */
static rx_conf_t *s_conf;  /* RX_COMPARE_INI, parsed */
static int n_fail, n_pass;
static uint64_t s_rng = 0x9E3779B97F4A7C15ull;

static float s_unif (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (float) ((s_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

static void s_die (const char *what, const struct rx_err *e)
{
    fprintf (stderr, "compare: %s: %s\n", what, e ? e->msg : "");
    exit (1);
}

#define TRY(b, call)                                                    \
    do {                                                                \
        struct rx_err e_ = { 0 };                                       \
        struct rx_err *err = &e_;                                       \
        if ((call) != RX_OK) {                                          \
            fprintf (stderr, "compare: %s: %s: %s\n", (b)->name, #call, e_.msg); \
            exit (1);                                                   \
        }                                                               \
    } while (0)

/* A device copy of host data on backend b. */
static void *s_up (struct be *b, const void *h, size_t bytes)
{
    void *d = NULL;
    TRY (b, b->K->alloc (b->be, bytes ? bytes : 1, 0, &d, err));
    if (bytes) TRY (b, b->K->copy_h2d (b->be, NULL, d, h, bytes, err));
    return d;
}

/* Uninitialised device memory on backend b (at least one byte). */
static void *s_alloc (struct be *b, size_t bytes)
{
    void *d = NULL;
    TRY (b, b->K->alloc (b->be, bytes ? bytes : 1, 0, &d, err));
    return d;
}

static void s_down (struct be *b, void *h, const void *d, size_t bytes)
{
    TRY (b, b->K->copy_d2h (b->be, NULL, h, d, bytes, err));
    TRY (b, b->K->synchronize (b->be, NULL, err));
}

static void s_check (const char *what, const float *got, const float *ref, size_t n, double tol)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs ((double) got[i] - ref[i]);
        if (!(d == d)) d = INFINITY;
        if (d > md) md = d;
        if (fabs (ref[i]) > mr) mr = fabs (ref[i]);
    }
    double rel = md / (mr > 1e-6 ? mr : 1e-6);
    int ok = rel <= tol;
    printf ("%s  %-52s err %.2e (tol %.0e)\n", ok ? "PASS" : "FAIL", what, rel, tol);
    if (ok) n_pass++; else n_fail++;
}

static void s_check_i (const char *what, const int32_t *got, const int32_t *ref, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != ref[i];
    printf ("%s  %-52s %zu of %zu differ\n", bad ? "FAIL" : "PASS", what, bad, n);
    if (bad) n_fail++; else n_pass++;
}

static float *s_rand (size_t n, float scale)
{
    float *x = malloc (n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = s_unif () * scale;
    return x;
}

/* --------------------------------------------------------------- matmul -- */

static void s_matmul_case (int dtype, size_t in, size_t out, size_t n_exp, int expert, size_t n,
                           uint32_t flags, double tol)
{
    size_t rows = out * n_exp, rb = rx_dtype_row_bytes (dtype, in);
    float *wf = s_rand (in * rows, 0.5f);
    uint8_t *wq = malloc (rb * rows);
    for (size_t r = 0; r < rows; r++) rx_quantize_row (dtype, wf + r * in, wq + r * rb, in);
    struct rx_weight_view v = { .name = "w", .dtype = dtype, .n_dims = n_exp > 1 ? 3 : 2,
                                .ne = { in, out, n_exp, 1 }, .data = wq, .nbytes = rb * rows };
    size_t ldx = in + 16, ldy = out + 8;
    float *x = s_rand (n * ldx, 1.f), *y0 = s_rand (n * ldy, 1.f);
    float *yc = malloc (n * ldy * sizeof *yc), *yg = malloc (n * ldy * sizeof *yg);
    struct be *bs[2] = { &C, &G };
    float *outs[2] = { yc, yg };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        rx_kweight_t *w = NULL;
        TRY (b, b->K->weight_load (b->be, &v, &w, err));
        void *dx = s_up (b, x, n * ldx * 4), *dy = s_up (b, y0, n * ldy * 4);
        TRY (b, b->K->matmul (b->be, NULL, w, expert, dx, ldx, dy, ldy, n, flags, err));
        s_down (b, outs[i], dy, n * ldy * 4);
        b->K->free_ (b->be, dx);
        b->K->free_ (b->be, dy);
        b->K->weight_free (b->be, w);
    }
    /* Compare only the written columns (the pad must be untouched too). */
    char what[96];
    snprintf (what, sizeof what, "matmul %s in %zu out %zu n %zu%s%s", rx_dtype_name (dtype), in,
              out, n, n_exp > 1 ? " expert" : "", flags ? " +=" : "");
    s_check (what, yg, yc, n * ldy, tol);
    free (wf); free (wq); free (x); free (y0); free (yc); free (yg);
}

static void s_get_rows_case (int dtype, size_t in)
{
    size_t rows = 50, rb = rx_dtype_row_bytes (dtype, in);
    float *wf = s_rand (in * rows, 1.f);
    uint8_t *wq = malloc (rb * rows);
    for (size_t r = 0; r < rows; r++) rx_quantize_row (dtype, wf + r * in, wq + r * rb, in);
    struct rx_weight_view v = { .name = "emb", .dtype = dtype, .n_dims = 2, .ne = { in, rows, 1, 1 },
                                .data = wq, .nbytes = rb * rows };
    int32_t ids[5] = { 0, 49, 7, 7, 23 };
    float oc[5 * 300], og[5 * 300];
    struct be *bs[2] = { &C, &G };
    float *outs[2] = { oc, og };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        rx_kweight_t *w = NULL;
        TRY (b, b->K->weight_load (b->be, &v, &w, err));
        void *di = s_up (b, ids, sizeof ids), *dout = NULL;
        TRY (b, b->K->alloc (b->be, sizeof oc, 0, &dout, err));
        TRY (b, b->K->memset_ (b->be, NULL, dout, 0, sizeof oc, err));
        TRY (b, b->K->get_rows (b->be, NULL, w, di, 5, dout, 300, err));
        s_down (b, outs[i], dout, sizeof oc);
        b->K->free_ (b->be, di);
        b->K->free_ (b->be, dout);
        b->K->weight_free (b->be, w);
    }
    char what[64];
    snprintf (what, sizeof what, "get_rows %s ne0 %zu", rx_dtype_name (dtype), in);
    s_check (what, og, oc, 5 * 300, 1e-6);
    free (wf); free (wq);
}

/* ---------------------------------------------------------- elementwise -- */

enum { E_RMS, E_ROPE, E_ROPE_NEOX, E_ROPE_YARN, E_SWIGLU, E_ADD, E_MULB, E_SCALE, E_SOFTMAX,
       E_SIGMOID, E_COPY, E_N };
static const char *const e_names[E_N] = { "rms_norm", "rope normal", "rope neox",
                                          "rope yarn+freq_factors", "swiglu", "add", "mul (bcast)",
                                          "scale", "softmax", "sigmoid", "copy2d" };

static void s_ew_case (int op, size_t rows, size_t dim)
{
    size_t ld = dim + 4, n = rows * ld;
    float *a = s_rand (n, 2.f), *b = s_rand (n, 2.f), *w = s_rand (dim, 1.f);
    int32_t *pos = malloc (rows * sizeof *pos);
    for (size_t r = 0; r < rows; r++) pos[r] = (int32_t) (r * 997 % 40000);
    float ff[64];
    for (int i = 0; i < 64; i++) ff[i] = 1.f + i / 16.f;
    float *res[2] = { malloc (n * 4), malloc (n * 4) };
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *be = bs[i];
        const struct rx_kernels_ops *K = be->K;
        float *da = s_up (be, a, n * 4), *db = s_up (be, b, n * 4), *dw = s_up (be, w, dim * 4);
        float *dy = s_up (be, b, n * 4);
        int32_t *dp = s_up (be, pos, rows * 4);
        float *dff = s_up (be, ff, sizeof ff);
        struct rx_rope_params rp = { .struct_size = sizeof rp, .mode = RX_ROPE_NORMAL, .n_rot = 64,
                                     .n_ctx_orig = 4096, .freq_base = 10000.f, .freq_scale = 1.f,
                                     .ext_factor = 0.f, .attn_factor = 1.f, .beta_fast = 32.f,
                                     .beta_slow = 1.f };
        switch (op) {
        case E_RMS: TRY (be, K->rms_norm (be->be, NULL, da, ld, dw, dy, ld, rows, dim, 1e-5f, err)); break;
        case E_ROPE_NEOX: rp.mode = RX_ROPE_NEOX; /* fall through */
        case E_ROPE:
            TRY (be, K->copy_d2d (be->be, NULL, dy, da, n * 4, err));
            TRY (be, K->rope (be->be, NULL, dy, ld, rows, dim / 128, 128, dp, &rp, err));
            break;
        case E_ROPE_YARN:
            rp.mode = RX_ROPE_NEOX; rp.n_rot = 128; rp.freq_scale = 0.25f; rp.ext_factor = 1.f;
            rp.freq_factors = dff;
            TRY (be, K->copy_d2d (be->be, NULL, dy, da, n * 4, err));
            TRY (be, K->rope (be->be, NULL, dy, ld, rows, dim / 128, 128, dp, &rp, err));
            break;
        case E_SWIGLU: TRY (be, K->swiglu (be->be, NULL, da, ld, db, ld, dy, ld, rows, dim, err)); break;
        case E_ADD: TRY (be, K->add (be->be, NULL, da, ld, db, ld, dy, ld, rows, dim, err)); break;
        case E_MULB: TRY (be, K->mul (be->be, NULL, da, ld, dw, 0, dy, ld, rows, dim, err)); break;
        case E_SCALE: TRY (be, K->scale (be->be, NULL, da, ld, dy, ld, rows, dim, 0.37f, err)); break;
        case E_SOFTMAX:
            TRY (be, K->copy_d2d (be->be, NULL, dy, da, n * 4, err));
            TRY (be, K->softmax (be->be, NULL, dy, ld, rows, dim, 1.7f, err));
            break;
        case E_SIGMOID: TRY (be, K->sigmoid (be->be, NULL, da, ld, dy, ld, rows, dim, err)); break;
        case E_COPY: TRY (be, K->copy2d (be->be, NULL, da, ld, dy, ld, rows, dim, err)); break;
        }
        s_down (be, res[i], dy, n * 4);
        K->free_ (be->be, da); K->free_ (be->be, db); K->free_ (be->be, dw);
        K->free_ (be->be, dy); K->free_ (be->be, dp); K->free_ (be->be, dff);
    }
    char what[96];
    snprintf (what, sizeof what, "%s rows %zu dim %zu", e_names[op], rows, dim);
    s_check (what, res[1], res[0], n, op >= E_ROPE && op <= E_ROPE_YARN ? 1e-3 : 1e-4);
    free (a); free (b); free (w); free (pos); free (res[0]); free (res[1]);
}

static void s_select_case (size_t rows, size_t dim, size_t k)
{
    float *x = s_rand (rows * dim, 1.f);
    for (size_t r = 0; r < rows; r++)       /* ties: equal values at several indices */
        for (size_t i = 0; i < dim; i += 7) x[r * dim + i] = 0.99f;
    int32_t *ic = malloc (rows * k * 4), *ig = malloc (rows * k * 4), *ac = malloc (rows * 4),
            *ag = malloc (rows * 4);
    float *vc = malloc (rows * k * 4), *vg = malloc (rows * k * 4);
    struct be *bs[2] = { &C, &G };
    int32_t *is[2] = { ic, ig }, *as[2] = { ac, ag };
    float *vs[2] = { vc, vg };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        float *dx = s_up (b, x, rows * dim * 4), *dv = NULL;
        int32_t *di = NULL, *da = NULL;
        TRY (b, b->K->alloc (b->be, rows * k * 4, 0, (void **) &dv, err));
        TRY (b, b->K->alloc (b->be, rows * k * 4, 0, (void **) &di, err));
        TRY (b, b->K->alloc (b->be, rows * 4, 0, (void **) &da, err));
        TRY (b, b->K->topk (b->be, NULL, dx, dim, rows, dim, k, dv, di, err));
        TRY (b, b->K->argmax (b->be, NULL, dx, dim, rows, dim, da, err));
        s_down (b, is[i], di, rows * k * 4);
        s_down (b, vs[i], dv, rows * k * 4);
        s_down (b, as[i], da, rows * 4);
        b->K->free_ (b->be, dx); b->K->free_ (b->be, dv); b->K->free_ (b->be, di); b->K->free_ (b->be, da);
    }
    char what[96];
    snprintf (what, sizeof what, "topk rows %zu dim %zu k %zu (ties)", rows, dim, k);
    s_check_i (what, ig, ic, rows * k);
    s_check (what, vg, vc, rows * k, 0);
    snprintf (what, sizeof what, "argmax rows %zu dim %zu (ties)", rows, dim);
    s_check_i (what, ag, ac, rows);
    free (x); free (ic); free (ig); free (ac); free (ag); free (vc); free (vg);
}

/* MoE routing (radix/kernel.h moe_route, an appended op): DeepSeek's
 * group-limited choice and normalized weights; ties in row 0.  Skipped
 * while the compared backend lacks the op. */
static void s_route_case (size_t rows, size_t nx, size_t g, size_t tg, size_t k)
{
    if (!RX_HAS (struct rx_kernels_ops, G.K, moe_route) || !RX_HAS (struct rx_kernels_ops, C.K, moe_route)) {
        printf ("SKIP  moe_route: backend %s lacks the op\n", G.name);
        return;
    }
    float *p = s_rand (rows * nx, 1.f), *sel = s_rand (rows * nx, 1.f);
    for (size_t i = 0; i < rows * nx; i++) p[i] = fabsf (p[i]) + 0.01f;
    for (size_t e = 0; e < nx; e++) sel[e] = 0.5f;
    if (rows >= 3) {   /* NaN and -inf scores: the serial loop's choice, exactly */
        sel[nx] = NAN;
        sel[nx + 5] = -INFINITY;
        sel[2 * nx + 3] = NAN;
        sel[2 * nx + nx - 1] = INFINITY;
    }
    int32_t *ids[2] = { malloc (rows * k * 4), malloc (rows * k * 4) };
    float *w[2] = { malloc (rows * k * 4), malloc (rows * k * 4) };
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        float *dp = s_up (b, p, rows * nx * 4), *ds = s_up (b, sel, rows * nx * 4), *dw = NULL;
        int32_t *di = NULL;
        TRY (b, b->K->alloc (b->be, rows * k * 4, 0, (void **) &dw, err));
        TRY (b, b->K->alloc (b->be, rows * k * 4, 0, (void **) &di, err));
        TRY (b, b->K->moe_route (b->be, NULL, dp, ds, nx, rows, nx, g, tg, k, 1, 2.5f, di, dw, err));
        s_down (b, ids[i], di, rows * k * 4);
        s_down (b, w[i], dw, rows * k * 4);
        b->K->free_ (b->be, dp); b->K->free_ (b->be, ds); b->K->free_ (b->be, dw); b->K->free_ (b->be, di);
    }
    char what[96];
    snprintf (what, sizeof what, "moe_route rows %zu experts %zu groups %zu/%zu k %zu", rows, nx, tg, g, k);
    s_check_i (what, ids[1], ids[0], rows * k);
    s_check (what, w[1], w[0], rows * k, 0);
    free (p); free (sel); free (ids[0]); free (ids[1]); free (w[0]); free (w[1]);
}

/* -------------------------------------------- MoE expert pass (ABI 1.3) -- */

/* The four ops come together (radix/kernel.h): skipped while either
 * backend lacks them. */
static int s_have_moe (const char *what)
{
    if (RX_HAS (struct rx_kernels_ops, G.K, moe_combine) && RX_HAS (struct rx_kernels_ops, C.K, moe_combine) &&
        G.K->moe_sort && C.K->moe_sort && G.K->gather_rows && C.K->gather_rows &&
        G.K->matmul_grouped && C.K->matmul_grouped && G.K->moe_combine && C.K->moe_combine)
        return 1;
    printf ("SKIP  %s: a backend lacks the ABI 1.3 MoE ops\n", what);
    return 0;
}

/* Random expert ids in -1 .. n_expert (both ends invalid), or valid only. */
static int32_t *s_ids (size_t n, size_t n_expert, int invalid)
{
    int32_t *ids = malloc ((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        int32_t v = (int32_t) ((s_unif () * 0.5f + 0.5f) * (float) n_expert);
        if (v >= (int32_t) n_expert) v = (int32_t) n_expert - 1;
        if (invalid && i % 13 == 5) v = -1;
        if (invalid && i % 17 == 3) v = (int32_t) n_expert;
        ids[i] = v;
    }
    if (n > 3) ids[1] = ids[2] = ids[0];   /* one expert twice in a token and across tokens */
    return ids;
}

static void s_sort_case (size_t n_tok, size_t k, size_t n_expert, int invalid)
{
    if (!s_have_moe ("moe_sort")) return;
    const size_t n = n_tok * k;
    int32_t *ids = s_ids (n, n_expert, invalid);
    int32_t *res[2][3];
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        int32_t *di = s_up (b, ids, n * 4), *doff = NULL, *drow = NULL, *dsrc = NULL;
        const int32_t junk = 0x5a5a5a5a;
        int32_t *fill = malloc ((n + n_expert + 1) * 4);
        for (size_t j = 0; j < n + n_expert + 1; j++) fill[j] = junk;
        doff = s_up (b, fill, (n_expert + 1) * 4);
        drow = s_up (b, fill, n * 4);
        dsrc = s_up (b, fill, n * 4);
        TRY (b, b->K->moe_sort (b->be, NULL, di, n_tok, k, n_expert, doff, drow, dsrc, err));
        for (int a = 0; a < 3; a++) res[i][a] = malloc ((n + n_expert + 1) * 4);
        s_down (b, res[i][0], doff, (n_expert + 1) * 4);
        s_down (b, res[i][1], drow, n * 4);
        s_down (b, res[i][2], dsrc, n * 4);
        b->K->free_ (b->be, di); b->K->free_ (b->be, doff); b->K->free_ (b->be, drow);
        b->K->free_ (b->be, dsrc);
        free (fill);
    }
    char what[96];
    snprintf (what, sizeof what, "moe_sort tok %zu k %zu experts %zu%s: offsets", n_tok, k, n_expert,
              invalid ? " (invalid ids)" : "");
    s_check_i (what, res[1][0], res[0][0], n_expert + 1);
    snprintf (what, sizeof what, "moe_sort tok %zu k %zu experts %zu: row", n_tok, k, n_expert);
    s_check_i (what, res[1][1], res[0][1], n);
    snprintf (what, sizeof what, "moe_sort tok %zu k %zu experts %zu: src", n_tok, k, n_expert);
    s_check_i (what, res[1][2], res[0][2], n);
    for (int i = 0; i < 2; i++)
        for (int a = 0; a < 3; a++) free (res[i][a]);
    free (ids);
}

static void s_gather_case (size_t nx, size_t n, size_t dim)
{
    if (!s_have_moe ("gather_rows")) return;
    const size_t ldx = dim + 3, ldy = dim + 5;
    float *x = s_rand (nx * ldx, 1.f), *y0 = s_rand (n * ldy, 7.f);
    int32_t *idx = malloc (n * 4);
    for (size_t i = 0; i < n; i++) idx[i] = i % 5 == 2 ? -1 : (int32_t) ((i * 7 + 3) % nx);
    float *res[2] = { malloc (n * ldy * 4), malloc (n * ldy * 4) };
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        float *dx = s_up (b, x, nx * ldx * 4), *dy = s_up (b, y0, n * ldy * 4);
        int32_t *di = s_up (b, idx, n * 4);
        TRY (b, b->K->gather_rows (b->be, NULL, dx, ldx, di, n, dim, dy, ldy, err));
        s_down (b, res[i], dy, n * ldy * 4);
        b->K->free_ (b->be, dx); b->K->free_ (b->be, dy); b->K->free_ (b->be, di);
    }
    char what[96];
    snprintf (what, sizeof what, "gather_rows n %zu dim %zu (idx -1, pad kept)", n, dim);
    s_check (what, res[1], res[0], n * ldy, 0);
    free (x); free (y0); free (idx); free (res[0]); free (res[1]);
}

static void s_combine_case (size_t n_tok, size_t k, size_t dim, uint32_t flags)
{
    if (!s_have_moe ("moe_combine")) return;
    const size_t ny = n_tok * k + 3, ldy = dim + 2, ldo = dim + 6;
    float *y = s_rand (ny * ldy, 3.f), *w = s_rand (n_tok * k, 1.f), *o0 = s_rand (n_tok * ldo, 5.f);
    int32_t *row = malloc (n_tok * k * 4);
    for (size_t i = 0; i < n_tok * k; i++) row[i] = i % 7 == 4 ? -1 : (int32_t) ((i * 11 + 1) % ny);
    if (n_tok > 2)   /* a token with no choice left: zeros, or out kept with += */
        for (size_t j = 0; j < k; j++) row[2 * k + j] = -1;
    float *res[2] = { malloc (n_tok * ldo * 4), malloc (n_tok * ldo * 4) };
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        float *dy = s_up (b, y, ny * ldy * 4), *dw = s_up (b, w, n_tok * k * 4);
        float *dout = s_up (b, o0, n_tok * ldo * 4);
        int32_t *dr = s_up (b, row, n_tok * k * 4);
        TRY (b, b->K->moe_combine (b->be, NULL, dy, ldy, dr, dw, n_tok, k, dim, dout, ldo, flags, err));
        s_down (b, res[i], dout, n_tok * ldo * 4);
        b->K->free_ (b->be, dy); b->K->free_ (b->be, dw); b->K->free_ (b->be, dout);
        b->K->free_ (b->be, dr);
    }
    char what[96];
    snprintf (what, sizeof what, "moe_combine tok %zu k %zu dim %zu%s (exact)", n_tok, k, dim,
              flags ? " +=" : "");
    s_check (what, res[1], res[0], n_tok * ldo, 0);
    free (y); free (w); free (o0); free (row); free (res[0]); free (res[1]);
}

/* matmul_grouped over a window [row0, row0 + n) of the rows moe_sort's
 * offsets describe (computed here on the host from random ids, invalid
 * ones included, so offsets[n_expert] < the choices).  y is filled with a
 * sentinel first: rows at or past offsets[n_expert] must keep it, on
 * both backends. */
static void s_grouped_case (int dtype, size_t in, size_t out, size_t n_exp, size_t n_choice,
                            size_t row0, size_t n, uint32_t flags, double tol)
{
    if (!s_have_moe ("matmul_grouped")) return;
    const size_t rows = out * n_exp, rb = rx_dtype_row_bytes (dtype, in);
    float *wf = s_rand (in * rows, 0.5f);
    uint8_t *wq = malloc (rb * rows);
    for (size_t r = 0; r < rows; r++) rx_quantize_row (dtype, wf + r * in, wq + r * rb, in);
    struct rx_weight_view v = { .name = "w_exps", .dtype = dtype, .n_dims = 3,
                                .ne = { in, out, n_exp, 1 }, .data = wq, .nbytes = rb * rows };
    int32_t *ids = s_ids (n_choice, n_exp, 1);
    int32_t *off = calloc (n_exp + 1, 4);
    for (size_t i = 0; i < n_choice; i++)
        if (ids[i] >= 0 && (size_t) ids[i] < n_exp) off[ids[i] + 1]++;
    for (size_t e = 0; e < n_exp; e++) off[e + 1] += off[e];
    const size_t valid = (size_t) off[n_exp];
    const size_t ldx = in + 8, ldy = out + 4;
    float *x = s_rand (n * ldx, 1.f), *y0 = malloc (n * ldy * 4);
    for (size_t i = 0; i < n * ldy; i++) y0[i] = flags ? s_unif () : 4242.f;
    float *res[2] = { malloc (n * ldy * 4), malloc (n * ldy * 4) };
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        rx_kweight_t *w = NULL;
        TRY (b, b->K->weight_load (b->be, &v, &w, err));
        float *dx = s_up (b, x, n * ldx * 4), *dy = s_up (b, y0, n * ldy * 4);
        int32_t *doff = s_up (b, off, (n_exp + 1) * 4);
        TRY (b, b->K->matmul_grouped (b->be, NULL, w, doff, row0, dx, ldx, dy, ldy, n, flags, err));
        s_down (b, res[i], dy, n * ldy * 4);
        b->K->free_ (b->be, dx); b->K->free_ (b->be, dy); b->K->free_ (b->be, doff);
        b->K->weight_free (b->be, w);
    }
    char what[128];
    snprintf (what, sizeof what, "matmul_grouped %s in %zu out %zu x%zu rows %zu+%zu/%zu%s",
              rx_dtype_name (dtype), in, out, n_exp, row0, n, valid, flags ? " +=" : "");
    s_check (what, res[1], res[0], n * ldy, tol);
    /* The rows past the valid ones, and every row's pad, exactly as given. */
    size_t bad = 0;
    for (int i = 0; i < 2; i++)
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < ldy; c++)
                if ((row0 + r >= valid || c >= out) && res[i][r * ldy + c] != y0[r * ldy + c]) bad++;
    snprintf (what, sizeof what, "matmul_grouped %s: rows past offsets[n_expert] kept",
              rx_dtype_name (dtype));
    printf ("%s  %-52s %zu values changed\n", bad ? "FAIL" : "PASS", what, bad);
    if (bad) n_fail++; else n_pass++;
    free (wf); free (wq); free (ids); free (off); free (x); free (y0); free (res[0]); free (res[1]);
}

/* The whole expert pass captured as one graph on the compared backend and
 * replayed: the same bits as the eager run (no op synchronizes or
 * allocates in a way capture refuses). */
static void s_moe_graph_case (int dtype)
{
    struct rx_kernels_info gi = { .struct_size = sizeof gi };
    G.K->info (G.be, &gi);
    if (!(gi.caps & RX_KCAP_GRAPHS)) {
        printf ("SKIP  moe graph: backend %s does not capture\n", gi.name);
        return;
    }
    if (!s_have_moe ("moe graph")) return;
    const struct rx_kernels_ops *K = G.K;
    const size_t n_tok = 6, k = 4, n_exp = 8, in = 256, out = 64, n = n_tok * k;
    const size_t rb = rx_dtype_row_bytes (dtype, in);
    float *wf = s_rand (in * out * n_exp, 0.5f);
    uint8_t *wq = malloc (rb * out * n_exp);
    for (size_t r = 0; r < out * n_exp; r++) rx_quantize_row (dtype, wf + r * in, wq + r * rb, in);
    struct rx_weight_view v = { .name = "w_exps", .dtype = dtype, .n_dims = 3,
                                .ne = { in, out, n_exp, 1 }, .data = wq, .nbytes = rb * out * n_exp };
    rx_kweight_t *w = NULL;
    TRY (&G, K->weight_load (G.be, &v, &w, err));
    int32_t *ids = s_ids (n, n_exp, 1);
    float *x = s_rand (n_tok * in, 1.f), *cw = s_rand (n, 1.f);
    int32_t *di = s_up (&G, ids, n * 4), *doff = NULL, *drow = NULL, *dsrc = NULL;
    float *dx = s_up (&G, x, n_tok * in * 4), *dw = s_up (&G, cw, n * 4), *dxs = NULL, *dys = NULL,
          *dout = NULL;
    TRY (&G, K->alloc (G.be, (n_exp + 1) * 4, 0, (void **) &doff, err));
    TRY (&G, K->alloc (G.be, n * 4, 0, (void **) &drow, err));
    TRY (&G, K->alloc (G.be, n * 4, 0, (void **) &dsrc, err));
    TRY (&G, K->alloc (G.be, n * in * 4, 0, (void **) &dxs, err));
    TRY (&G, K->alloc (G.be, n * out * 4, 0, (void **) &dys, err));
    TRY (&G, K->alloc (G.be, n_tok * out * 4, 0, (void **) &dout, err));
    rx_kstream_t *st = NULL;
    TRY (&G, K->stream_create (G.be, &st, err));
    float *eager = malloc (n_tok * out * 4), *replay = malloc (n_tok * out * 4);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) TRY (&G, K->graph_begin (G.be, st, 77, err));
        TRY (&G, K->memset_ (G.be, st, dys, 0, n * out * 4, err));
        TRY (&G, K->moe_sort (G.be, st, di, n_tok, k, n_exp, doff, drow, dsrc, err));
        TRY (&G, K->gather_rows (G.be, st, dx, in, dsrc, n, in, dxs, in, err));
        TRY (&G, K->matmul_grouped (G.be, st, w, doff, 0, dxs, in, dys, out, n, 0, err));
        TRY (&G, K->moe_combine (G.be, st, dys, out, drow, dw, n_tok, k, out, dout, out, 0, err));
        if (pass == 1) {
            TRY (&G, K->graph_end (G.be, st, 77, err));
            TRY (&G, K->memset_ (G.be, st, dout, 0xff, n_tok * out * 4, err));
            TRY (&G, K->graph_launch (G.be, st, 77, err));
        }
        TRY (&G, K->synchronize (G.be, st, err));
        TRY (&G, K->copy_d2h (G.be, st, pass ? replay : eager, dout, n_tok * out * 4, err));
        TRY (&G, K->synchronize (G.be, st, err));
    }
    char what[96];
    snprintf (what, sizeof what, "moe expert pass %s: graph replay = eager", rx_dtype_name (dtype));
    s_check (what, replay, eager, n_tok * out, 0);
    K->stream_destroy (G.be, st);
    void *fr[] = { di, doff, drow, dsrc, dx, dw, dxs, dys, dout };
    for (size_t j = 0; j < sizeof fr / sizeof fr[0]; j++) K->free_ (G.be, fr[j]);
    K->weight_free (G.be, w);
    free (wf); free (wq); free (ids); free (x); free (cw); free (eager); free (replay);
}

/* ---------------------- the low-latency expert-parallel exchange (ABI 1.4) -- */

static int s_have_ll (const char *what)
{
    if (RX_HAS (struct rx_kernels_ops, G.K, moe_ll_unpack) &&
        RX_HAS (struct rx_kernels_ops, C.K, moe_ll_unpack) && G.K->moe_ll_pack &&
        C.K->moe_ll_pack && G.K->moe_ll_unpack && C.K->moe_ll_unpack && G.K->moe_sort && C.K->moe_sort)
        return 1;
    printf ("SKIP  %s: a backend lacks the ABI 1.4 low-latency exchange ops\n", what);
    return 0;
}

/* moe_ll_pack on both backends from the same moe_sort output (kernels-
 * cpu's): every block (headers, sent rows, and the junk kept in unsent
 * rows) and slot_of bit for bit.  skew: most choices go to expert 0. */
static void s_ll_pack_case (size_t n_tok, size_t k, size_t n_expert, size_t n_rank, size_t slots,
                            size_t hrows, size_t dim, int skew)
{
    if (!s_have_ll ("moe_ll_pack")) return;
    const size_t n = n_tok * k, ldx = dim + 3, blk = (hrows + slots) * dim;
    int32_t *ids = s_ids (n, n_expert, 1);
    if (skew)
        for (size_t i = 0; i < n; i++)
            if (i % 5 != 4) ids[i] = 0;
    float *x = s_rand ((n_tok ? n_tok : 1) * ldx, 2.f), *junk = s_rand (n_rank * blk, 9.f);
    int32_t *off = malloc ((n_expert + 1) * 4), *row = malloc ((n ? n : 1) * 4),
            *src = malloc ((n ? n : 1) * 4);
    {
        int32_t *di = s_up (&C, ids, n * 4), *doff = s_alloc (&C, (n_expert + 1) * 4);
        int32_t *drow = s_alloc (&C, n * 4), *dsrc = s_alloc (&C, n * 4);
        TRY (&C, C.K->moe_sort (C.be, NULL, di, n_tok, k, n_expert, doff, drow, dsrc, err));
        s_down (&C, off, doff, (n_expert + 1) * 4);
        if (n) s_down (&C, row, drow, n * 4);
        if (n) s_down (&C, src, dsrc, n * 4);
        C.K->free_ (C.be, di); C.K->free_ (C.be, doff); C.K->free_ (C.be, drow); C.K->free_ (C.be, dsrc);
    }
    float *send[2] = { malloc (n_rank * blk * 4), malloc (n_rank * blk * 4) };
    int32_t *slot[2] = { malloc ((n ? n : 1) * 4), malloc ((n ? n : 1) * 4) };
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        float *dx = s_up (b, x, n_tok * ldx * 4), *dsend = s_up (b, junk, n_rank * blk * 4);
        int32_t *di = s_up (b, ids, n * 4), *doff = s_up (b, off, (n_expert + 1) * 4);
        int32_t *drow = s_up (b, row, n * 4), *dsrc = s_up (b, src, n * 4), *dslot = s_alloc (b, n * 4);
        TRY (b, b->K->moe_ll_pack (b->be, NULL, n_tok ? dx : NULL, ldx, n_tok ? di : NULL, doff,
                                   n_tok ? drow : NULL, n_tok ? dsrc : NULL, n_tok, k, n_expert, n_rank,
                                   slots, hrows, dim, dsend, n_tok ? dslot : NULL, err));
        s_down (b, send[i], dsend, n_rank * blk * 4);
        if (n) s_down (b, slot[i], dslot, n * 4);
        void *fr[] = { dx, dsend, di, doff, drow, dsrc, dslot };
        for (size_t j = 0; j < sizeof fr / sizeof fr[0]; j++) b->K->free_ (b->be, fr[j]);
    }
    char what[128];
    snprintf (what, sizeof what, "moe_ll_pack tok %zu k %zu experts %zu ranks %zu hrows %zu%s: send",
              n_tok, k, n_expert, n_rank, hrows, skew ? " skewed" : "");
    s_check_i (what, (const int32_t *) send[1], (const int32_t *) send[0], n_rank * blk);
    if (n) {
        snprintf (what, sizeof what, "moe_ll_pack tok %zu k %zu experts %zu ranks %zu: slot_of", n_tok,
                  k, n_expert, n_rank);
        s_check_i (what, slot[1], slot[0], n);
    }
    free (ids); free (x); free (junk); free (off); free (row); free (src);
    for (int i = 0; i < 2; i++) { free (send[i]); free (slot[i]); }
}

/* moe_ll_unpack of a recv buffer with random headers: each block's counts
 * a random split of up to `slots` rows over n_local experts, or with
 * corrupt = 1 some negative counts and sums past slots (both backends
 * clamp alike).  offsets, order and back, exactly. */
static void s_ll_unpack_case (size_t n_rank, size_t slots, size_t hrows, size_t dim, size_t n_local,
                              int corrupt)
{
    if (!s_have_ll ("moe_ll_unpack")) return;
    const size_t blk = (hrows + slots) * dim, nb = n_rank * (hrows + slots);
    float *recv = s_rand (n_rank * blk, 1.f);
    for (size_t q = 0; q < n_rank; q++) {
        int32_t *h = malloc (hrows * dim * 4);
        size_t left = (size_t) ((s_unif () * 0.5f + 0.5f) * (float) (slots + 1));
        if (left > slots) left = slots;
        for (size_t e = 0; e < hrows * dim; e++) h[e] = 0;
        for (size_t e = 0; e < n_local; e++) {
            size_t c = e + 1 == n_local ? left : (size_t) ((s_unif () * 0.5f + 0.5f) * (float) (left + 1));
            if (c > left) c = left;
            h[e] = (int32_t) c;
            left -= c;
        }
        if (corrupt) {
            h[q % n_local] = -7;
            h[(q + 1) % n_local] += (int32_t) slots;   /* the block's sum passes slots */
        }
        memcpy (recv + q * blk, h, hrows * dim * 4);
        free (h);
    }
    int32_t *res[2][3];
    struct be *bs[2] = { &C, &G };
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        float *dr = s_up (b, recv, n_rank * blk * 4);
        int32_t *doff = s_alloc (b, (n_local + 1) * 4), *dord = s_alloc (b, n_rank * slots * 4),
                *dback = s_alloc (b, nb * 4);
        TRY (b, b->K->moe_ll_unpack (b->be, NULL, dr, n_rank, slots, hrows, dim, n_local, doff, dord,
                                     dback, err));
        res[i][0] = malloc ((n_local + 1) * 4);
        res[i][1] = malloc ((slots ? n_rank * slots : 1) * 4);
        res[i][2] = malloc (nb * 4);
        s_down (b, res[i][0], doff, (n_local + 1) * 4);
        if (slots) s_down (b, res[i][1], dord, n_rank * slots * 4);
        s_down (b, res[i][2], dback, nb * 4);
        b->K->free_ (b->be, dr); b->K->free_ (b->be, doff); b->K->free_ (b->be, dord);
        b->K->free_ (b->be, dback);
    }
    char what[128];
    snprintf (what, sizeof what, "moe_ll_unpack ranks %zu slots %zu hrows %zu local %zu%s: offsets",
              n_rank, slots, hrows, n_local, corrupt ? " (clamped)" : "");
    s_check_i (what, res[1][0], res[0][0], n_local + 1);
    snprintf (what, sizeof what, "moe_ll_unpack ranks %zu slots %zu local %zu: order", n_rank, slots,
              n_local);
    s_check_i (what, res[1][1], res[0][1], n_rank * slots);
    snprintf (what, sizeof what, "moe_ll_unpack ranks %zu slots %zu local %zu: back", n_rank, slots,
              n_local);
    s_check_i (what, res[1][2], res[0][2], nb);
    for (int i = 0; i < 2; i++)
        for (int a = 0; a < 3; a++) free (res[i][a]);
    free (recv);
}

/* moe_sort, moe_ll_pack and moe_ll_unpack (the send buffer read back as
 * if every rank had sent the same) captured as one graph on the compared
 * backend and replayed: the same bits as the eager run. */
static void s_ll_graph_case (void)
{
    struct rx_kernels_info gi = { .struct_size = sizeof gi };
    G.K->info (G.be, &gi);
    if (!(gi.caps & RX_KCAP_GRAPHS)) {
        printf ("SKIP  moe_ll graph: backend %s does not capture\n", gi.name);
        return;
    }
    if (!s_have_ll ("moe_ll graph")) return;
    const struct rx_kernels_ops *K = G.K;
    const size_t n_tok = 5, k = 4, n_exp = 10, n_rank = 3, slots = 24, hrows = 1, dim = 16;
    const size_t n = n_tok * k, blk = (hrows + slots) * dim, nb = n_rank * (hrows + slots);
    int32_t *ids = s_ids (n, n_exp, 1);
    float *x = s_rand (n_tok * dim, 1.f);
    int32_t *di = s_up (&G, ids, n * 4), *doff = s_alloc (&G, (n_exp + 1) * 4);
    int32_t *drow = s_alloc (&G, n * 4), *dsrc = s_alloc (&G, n * 4), *dslot = s_alloc (&G, n * 4);
    int32_t *loff = s_alloc (&G, 5 * 4), *dord = s_alloc (&G, n_rank * slots * 4);
    int32_t *dback = s_alloc (&G, nb * 4);
    float *dx = s_up (&G, x, n_tok * dim * 4), *dsend = s_alloc (&G, n_rank * blk * 4);
    rx_kstream_t *st = NULL;
    TRY (&G, K->stream_create (G.be, &st, err));
    const size_t nres = n_rank * blk + n + 5 + n_rank * slots + nb;
    int32_t *res[2] = { malloc (nres * 4), malloc (nres * 4) };
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) TRY (&G, K->graph_begin (G.be, st, 78, err));
        TRY (&G, K->memset_ (G.be, st, dsend, 0, n_rank * blk * 4, err));
        TRY (&G, K->moe_sort (G.be, st, di, n_tok, k, n_exp, doff, drow, dsrc, err));
        TRY (&G, K->moe_ll_pack (G.be, st, dx, dim, di, doff, drow, dsrc, n_tok, k, n_exp, n_rank, slots,
                                 hrows, dim, dsend, dslot, err));
        /* rank 0 owns experts 0..2 (first(1) = 10 / 3 = 3) */
        TRY (&G, K->moe_ll_unpack (G.be, st, dsend, n_rank, slots, hrows, dim, 3, loff, dord, dback, err));
        if (pass == 1) {
            TRY (&G, K->graph_end (G.be, st, 78, err));
            TRY (&G, K->memset_ (G.be, st, dsend, 0xff, n_rank * blk * 4, err));
            TRY (&G, K->memset_ (G.be, st, dslot, 0xff, n * 4, err));
            TRY (&G, K->memset_ (G.be, st, dord, 0xff, n_rank * slots * 4, err));
            TRY (&G, K->memset_ (G.be, st, dback, 0xff, nb * 4, err));
            TRY (&G, K->graph_launch (G.be, st, 78, err));
        }
        TRY (&G, K->synchronize (G.be, st, err));
        int32_t *o = res[pass];
        TRY (&G, K->copy_d2h (G.be, st, o, dsend, n_rank * blk * 4, err));
        TRY (&G, K->copy_d2h (G.be, st, o + n_rank * blk, dslot, n * 4, err));
        TRY (&G, K->copy_d2h (G.be, st, o + n_rank * blk + n, loff, 5 * 4, err));
        TRY (&G, K->copy_d2h (G.be, st, o + n_rank * blk + n + 5, dord, n_rank * slots * 4, err));
        TRY (&G, K->copy_d2h (G.be, st, o + n_rank * blk + n + 5 + n_rank * slots, dback, nb * 4, err));
        TRY (&G, K->synchronize (G.be, st, err));
    }
    s_check_i ("moe_ll pack + unpack: graph replay = eager", res[1], res[0], nres);
    K->stream_destroy (G.be, st);
    void *fr[] = { di, doff, drow, dsrc, dslot, loff, dord, dback, dx, dsend };
    for (size_t j = 0; j < sizeof fr / sizeof fr[0]; j++) K->free_ (G.be, fr[j]);
    free (ids); free (x); free (res[0]); free (res[1]);
}

/* ------------------------------------------------------------ attention -- */

/* Extra instances of the compared backend with their own [kernels.cuda]
 * attention_splits (0, 3, 7): the plugin's host table with cfg_str
 * answering that key, every other key as RX_COMPARE_INI says. */
static struct be G_split[3];
static const char *const s_split_set[4] = { "0", "3", "7", "7x" };
static struct rx_host s_split_host[4];
static const struct rx_host *s_plug_host;

static int s_split_cfg_str (const struct rx_host *h, const char *key, const char **out)
{
    if (!strcmp (key, "attention_splits")) {
        *out = s_split_set[h - s_split_host];
        return RX_OK;
    }
    return s_plug_host->cfg_str (s_plug_host, key, out);
}

static void s_open_splits (rx_plugin_t *p)
{
    s_plug_host = rx_plugin_host (p);
    for (int i = 0; i < 3; i++) {
        struct rx_err err = { 0 };
        s_split_host[i] = *s_plug_host;
        s_split_host[i].cfg_str = s_split_cfg_str;
        G_split[i] = G;
        G_split[i].be = NULL;
        struct rx_kernels_params kp = { .struct_size = sizeof kp };
        if (G.K->create (&s_split_host[i], &kp, &G_split[i].be, &err) != RX_OK)
            s_die ("attention_splits instance", &err);
    }
    if (strcmp (G.name, "cuda")) return;
    /* A bad value: create refuses it with one line naming it. */
    struct rx_err err = { 0 };
    s_split_host[3] = *s_plug_host;
    s_split_host[3].cfg_str = s_split_cfg_str;
    struct rx_kernels_params kp = { .struct_size = sizeof kp };
    void *be = (void *) 1;
    int rc = G.K->create (&s_split_host[3], &kp, &be, &err);
    const int ok = rc == RX_EINVAL && !be && strstr (err.msg, "attention_splits = '7x'");
    printf ("%s  %-52s %s\n", ok ? "PASS" : "FAIL", "create refuses attention_splits = 7x", err.msg);
    if (ok) n_pass++; else n_fail++;
    if (rc == RX_OK) G.K->destroy (be);
}

/* One attention call on backend b: n_seq sequences of lens[s] keys whose
 * last nq[s] positions are the query rows.  KV slots are scattered (a
 * permutation); bad != 0 makes every 5th slot of the attention's list one
 * outside the pool (-1 or past the end: a zero key and value; kernels-cpu
 * refuses those, so such calls compare CUDA instances with each other). */
struct s_attn_in {
    int dtype, n_kv, hd_k, hd_v, n_head, window;
    float softcap;
    int n_seq, n_tok, n_kvtok;
    uint64_t n_slots;
    int32_t q_start[9], kv_start[9], *slots, *q_pos;
    float *kx, *vx, *q;
};

static void s_attn_run (struct be *b, const struct s_attn_in *in, float *res)
{
    const size_t nk = (size_t) in->n_kv * in->hd_k, nv = (size_t) in->n_kv * in->hd_v;
    const size_t ldq = (size_t) in->n_head * in->hd_k, ldo = (size_t) in->n_head * in->hd_v;
    const size_t esz = in->dtype == RX_F16 ? 2 : 4;
    const int n_tok = in->n_tok, n_kvtok = in->n_kvtok;
    struct rx_kv_pool pool = { .dtype = in->dtype, .n_kv_head = in->n_kv, .hd_k = in->hd_k,
                               .hd_v = in->hd_v, .n_slots = in->n_slots };
    TRY (b, b->K->alloc (b->be, in->n_slots * nk * esz, 0, &pool.k, err));
    TRY (b, b->K->alloc (b->be, in->n_slots * nv * esz, 0, &pool.v, err));
    float *dk = s_up (b, in->kx, n_kvtok * nk * 4), *dv = s_up (b, in->vx, n_kvtok * nv * 4);
    int32_t *ds = s_up (b, in->slots, n_kvtok * 4), *dp = s_up (b, in->q_pos, n_tok * 4);
    int32_t *dqs = s_up (b, in->q_start, (in->n_seq + 1) * 4);
    int32_t *dks = s_up (b, in->kv_start, (in->n_seq + 1) * 4);
    float *dq = s_up (b, in->q, n_tok * ldq * 4), *dout = NULL;
    TRY (b, b->K->alloc (b->be, n_tok * ldo * 4, 0, (void **) &dout, err));
    TRY (b, b->K->kv_store (b->be, NULL, &pool, dk, nk, dv, nv, ds, n_kvtok, err));
    struct rx_attn_batch ab = { .n_seq = in->n_seq, .n_tokens = n_tok, .q_start = dqs,
                                .kv_start = dks, .slots = ds, .q_pos = dp };
    if (b == &C) {  /* the CPU reads the index arrays on the host */
        ab.q_start = in->q_start; ab.kv_start = in->kv_start; ab.slots = in->slots;
        ab.q_pos = in->q_pos;
    }
    struct rx_attn_params ap = { .struct_size = sizeof ap, .n_head = in->n_head,
                                 .scale = 1.f / sqrtf ((float) in->hd_k), .softcap = in->softcap,
                                 .window = in->window };
    TRY (b, b->K->attention (b->be, NULL, dq, ldq, &pool, &ab, &ap, dout, ldo, err));
    s_down (b, res, dout, n_tok * ldo * 4);
    void *fr[] = { pool.k, pool.v, dk, dv, ds, dp, dqs, dks, dq, dout };
    for (size_t j = 0; j < sizeof fr / sizeof fr[0]; j++) b->K->free_ (b->be, fr[j]);
}

/* The call on the CPU and on each of the n_g CUDA instances gs (named
 * gnames), each checked against the CPU; bad: against gs[0] instead. */
static void s_attn_cmp (const char *label, int dtype, int n_kv, int hd_k, int hd_v, int n_head,
                        int window, float softcap, int n_seq, const int *lens, const int *nq,
                        int bad, struct be **gs, const char *const *gnames, int n_g)
{
    struct s_attn_in in = { .dtype = dtype, .n_kv = n_kv, .hd_k = hd_k, .hd_v = hd_v,
                            .n_head = n_head, .window = window, .softcap = softcap,
                            .n_seq = n_seq };
    for (int s = 0; s < n_seq; s++) {
        in.q_start[s + 1] = in.q_start[s] + nq[s];
        in.kv_start[s + 1] = in.kv_start[s] + lens[s];
    }
    in.n_tok = in.q_start[n_seq];
    in.n_kvtok = in.kv_start[n_seq];
    /* i -> (131 i + 7) mod n_slots is one-to-one (131 is prime and does not
     * divide n_slots): no two positions share a slot. */
    in.n_slots = ((uint64_t) in.n_kvtok + 511) / 512 * 512;
    in.slots = malloc (in.n_kvtok * 4);
    in.q_pos = malloc (in.n_tok * 4);
    for (int i = 0; i < in.n_kvtok; i++) {
        in.slots[i] = (int32_t) (((uint64_t) i * 131 + 7) % in.n_slots);
        if (bad && i % 5 == 3) in.slots[i] = i % 2 ? -1 : (int32_t) in.n_slots + i;
    }
    for (int s = 0; s < n_seq; s++)
        for (int t = 0; t < nq[s]; t++) in.q_pos[in.q_start[s] + t] = lens[s] - nq[s] + t;
    const size_t nk = (size_t) n_kv * hd_k, nv = (size_t) n_kv * hd_v;
    in.kx = s_rand (in.n_kvtok * nk, 1.f);
    in.vx = s_rand (in.n_kvtok * nv, 1.f);
    const size_t ldq = (size_t) n_head * hd_k, ldo = (size_t) n_head * hd_v;
    in.q = s_rand (in.n_tok * ldq, 1.f);
    float *ref = malloc (in.n_tok * ldo * 4), *got = malloc (in.n_tok * ldo * 4);
    if (bad) s_attn_run (gs[0], &in, ref);
    else s_attn_run (&C, &in, ref);
    char lens_txt[64] = "", what[160];
    for (int s = 0, o = 0; s < n_seq && o < (int) sizeof lens_txt - 12; s++)
        o += snprintf (lens_txt + o, sizeof lens_txt - o, "%s%d", s ? "," : "", lens[s]);
    for (int g = bad ? 1 : 0; g < n_g; g++) {
        s_attn_run (gs[g], &in, got);
        snprintf (what, sizeof what, "attention %s %s %s kv %d hd %d/%d heads %d win %d cap %g "
                  "lens %s%s", label, gnames[g], rx_dtype_name (dtype), n_kv, hd_k, hd_v, n_head,
                  window, (double) softcap, lens_txt, bad ? " bad slots vs splits 0" : "");
        s_check (what, got, ref, in.n_tok * ldo, dtype == RX_F16 ? 1e-3 : 1e-4);
    }
    free (in.slots); free (in.q_pos); free (in.kx); free (in.vx); free (in.q); free (ref); free (got);
}

static void s_attn_case (const char *label, int dtype, int n_kv, int hd_k, int hd_v, int n_head,
                         int window, float softcap)
{
    /* Three sequences: a 37-token prefill, a 1-token decode at position 80,
     * a 5-token chunk continuing at position 11. */
    const int lens[3] = { 37, 81, 16 }, nq[3] = { 37, 1, 5 };
    struct be *gs[1] = { &G };
    const char *const names[1] = { "" };
    s_attn_cmp (label, dtype, n_kv, hd_k, hd_v, n_head, window, softcap, 3, lens, nq, 0, gs, names,
                1);
}

/* Split-K decode attention ([kernels.cuda] attention_splits): decode
 * batches (one row per sequence) whose KV lengths are not multiples of a
 * split's chunk, on the compared backend as configured and with splits
 * 0, 3 and 7. */
static void s_split_cases (void)
{
    struct be *gs[4] = { &G, &G_split[0], &G_split[1], &G_split[2] };
    const char *const names[4] = { "(as set)", "splits 0", "splits 3", "splits 7" };
    const int one[4] = { 1, 1, 1, 1 };
    const int l1[1] = { 1500 }, l4[4] = { 1, 37, 300, 1500 }, l2[2] = { 300, 1111 };
    const int l3[3] = { 37, 300, 129 }, lm[2] = { 37, 300 };
    s_attn_cmp ("decode", RX_F32, 2, 64, 64, 8, 0, 0.f, 1, l1, one, 0, gs, names, 4);
    s_attn_cmp ("decode gqa", RX_F16, 2, 64, 64, 8, 0, 0.f, 4, l4, one, 0, gs, names, 4);
    s_attn_cmp ("decode window+softcap", RX_F32, 2, 128, 128, 4, 100, 30.f, 2, l2, one, 0, gs,
                names, 4);
    s_attn_cmp ("decode mha", RX_F32, 3, 80, 80, 3, 0, 0.f, 3, l3, one, 0, gs, names, 4);
    s_attn_cmp ("decode mla-absorbed", RX_F32, 1, 576, 512, 8, 0, 0.f, 2, lm, one, 0, gs, names, 4);
    /* A decode-like batch with a 6-row chunk (8 rows < 4 per sequence:
     * splits), and a prefill-like one (37 + 1 + 5 rows: never split). */
    const int ld[3] = { 200, 81, 700 }, nd[3] = { 1, 1, 6 };
    s_attn_cmp ("mixed decode", RX_F32, 2, 64, 64, 4, 0, 0.f, 3, ld, nd, 0, gs, names, 4);
    const int lx[3] = { 37, 81, 16 }, nx[3] = { 37, 1, 5 };
    s_attn_cmp ("mixed prefill", RX_F32, 2, 64, 64, 4, 0, 0.f, 3, lx, nx, 0, gs, names, 4);
    /* Slots outside the pool: zero keys and values, split or not
     * (kernels-cpu refuses them: not in its self-test). */
    if (!strcmp (G.name, "cuda"))
        s_attn_cmp ("decode", RX_F32, 2, 64, 64, 4, 0, 0.f, 2, l2, one, 1, gs + 1, names + 1,
                    3);
}

/* A split decode step captured once as a graph and replayed as the
 * context grows (the split count and the partials depend on the shapes
 * only, so the graph stays valid): two sequences whose keys are stored up
 * to 1500 positions, queried at positions 99/699 and then, only q_pos
 * changed on the device, 1400/1234; each replay against the CPU. */
static void s_split_graph_case (struct be *g, const char *gname)
{
    enum { CAP = 1500, NKV = 2, HD = 64, NH = 8 };
    const int32_t q_start[3] = { 0, 1, 2 }, kv_start[3] = { 0, CAP, 2 * CAP };
    const uint64_t n_slots = 3072;
    int32_t *slots = malloc (2 * CAP * 4);
    for (int i = 0; i < 2 * CAP; i++) slots[i] = (int32_t) (((uint64_t) i * 131 + 7) % n_slots);
    const size_t nk = NKV * HD, ld = NH * HD;
    float *kx = s_rand (2 * CAP * nk, 1.f), *vx = s_rand (2 * CAP * nk, 1.f), *q = s_rand (2 * ld, 1.f);
    float ref[2 * NH * HD], got[2 * NH * HD];
    const int32_t steps[2][2] = { { 99, 699 }, { 1400, 1234 } };
    struct be *bs[2] = { &C, g };
    struct rx_kv_pool pools[2];
    int32_t *dpos[2];
    float *dq[2], *dout[2];
    int32_t *dqs[2], *dks[2], *dsl[2];
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        pools[i] = (struct rx_kv_pool) { .dtype = RX_F32, .n_kv_head = NKV, .hd_k = HD, .hd_v = HD,
                                         .n_slots = n_slots };
        TRY (b, b->K->alloc (b->be, n_slots * nk * 4, 0, &pools[i].k, err));
        TRY (b, b->K->alloc (b->be, n_slots * nk * 4, 0, &pools[i].v, err));
        float *dk = s_up (b, kx, 2 * CAP * nk * 4), *dv = s_up (b, vx, 2 * CAP * nk * 4);
        dsl[i] = s_up (b, slots, 2 * CAP * 4);
        TRY (b, b->K->kv_store (b->be, NULL, &pools[i], dk, nk, dv, nk, dsl[i], 2 * CAP, err));
        TRY (b, b->K->synchronize (b->be, NULL, err));
        b->K->free_ (b->be, dk);
        b->K->free_ (b->be, dv);
        dpos[i] = s_up (b, steps[0], sizeof steps[0]);
        dqs[i] = s_up (b, q_start, sizeof q_start);
        dks[i] = s_up (b, kv_start, sizeof kv_start);
        dq[i] = s_up (b, q, 2 * ld * 4);
        dout[i] = s_alloc (b, 2 * ld * 4);
    }
    struct rx_attn_params ap = { .struct_size = sizeof ap, .n_head = NH, .scale = 0.125f };
    rx_kstream_t *st = NULL;
    TRY (g, g->K->stream_create (g->be, &st, err));
    struct rx_attn_batch gb = { .n_seq = 2, .n_tokens = 2, .q_start = dqs[1], .kv_start = dks[1],
                                .slots = dsl[1], .q_pos = dpos[1] };
    TRY (g, g->K->graph_begin (g->be, st, 77, err));
    TRY (g, g->K->attention (g->be, st, dq[1], ld, &pools[1], &gb, &ap, dout[1], ld, err));
    TRY (g, g->K->graph_end (g->be, st, 77, err));
    for (int k = 0; k < 2; k++) {
        struct rx_attn_batch cb = { .n_seq = 2, .n_tokens = 2, .q_start = q_start,
                                    .kv_start = kv_start, .slots = slots, .q_pos = steps[k] };
        TRY (&C, C.K->attention (C.be, NULL, dq[0], ld, &pools[0], &cb, &ap, dout[0], ld, err));
        s_down (&C, ref, dout[0], sizeof ref);
        TRY (g, g->K->copy_h2d (g->be, st, dpos[1], steps[k], sizeof steps[k], err));
        TRY (g, g->K->graph_launch (g->be, st, 77, err));
        TRY (g, g->K->copy_d2h (g->be, st, got, dout[1], sizeof got, err));
        TRY (g, g->K->synchronize (g->be, st, err));
        char what[128];
        snprintf (what, sizeof what, "attention graph replay %s q_pos %d,%d", gname,
                  (int) steps[k][0], (int) steps[k][1]);
        s_check (what, got, ref, 2 * ld, 1e-4);
    }
    g->K->stream_destroy (g->be, st);
    for (int i = 0; i < 2; i++) {
        struct be *b = bs[i];
        void *fr[] = { pools[i].k, pools[i].v, dsl[i], dpos[i], dqs[i], dks[i], dq[i], dout[i] };
        for (size_t j = 0; j < sizeof fr / sizeof fr[0]; j++) b->K->free_ (b->be, fr[j]);
    }
    free (slots); free (kx); free (vx); free (q);
}

/* --------------------------------------------------------------- graphs -- */

static void s_graph_case (void)
{
    const struct rx_kernels_ops *K = G.K;
    float x[256], y[256], ref[256];
    for (int i = 0; i < 256; i++) { x[i] = (float) i; ref[i] = 2.f * 3.f * (float) i; }
    float *dx = s_up (&G, x, sizeof x), *dy = s_up (&G, x, sizeof x);
    rx_kstream_t *st = NULL;
    TRY (&G, K->stream_create (G.be, &st, err));
    TRY (&G, K->graph_begin (G.be, st, 42, err));
    TRY (&G, K->scale (G.be, st, dx, 256, dy, 256, 1, 256, 2.f, err));
    TRY (&G, K->scale (G.be, st, dy, 256, dy, 256, 1, 256, 3.f, err));
    TRY (&G, K->graph_end (G.be, st, 42, err));
    int has = K->graph_has (G.be, 42);
    TRY (&G, K->memset_ (G.be, st, dy, 0, sizeof y, err));
    TRY (&G, K->graph_launch (G.be, st, 42, err));
    TRY (&G, K->synchronize (G.be, st, err));
    TRY (&G, K->copy_d2h (G.be, st, y, dy, sizeof y, err));
    TRY (&G, K->synchronize (G.be, st, err));
    printf ("%s  %-52s\n", has ? "PASS" : "FAIL", "graph_has after capture");
    if (has) n_pass++; else n_fail++;
    s_check ("graph replay (2 ops captured, replayed once)", y, ref, 256, 0);
    struct rx_err e = { 0 };
    int rc = K->graph_launch (G.be, st, 43, &e);
    printf ("%s  %-52s %s\n", rc == RX_ENOENT ? "PASS" : "FAIL", "graph_launch of an unknown key", e.msg);
    if (rc == RX_ENOENT) n_pass++; else n_fail++;
    K->free_ (G.be, dx);   /* frees invalidate graphs */
    printf ("%s  %-52s\n", !K->graph_has (G.be, 42) ? "PASS" : "FAIL", "free_ invalidates graphs");
    if (!K->graph_has (G.be, 42)) n_pass++; else n_fail++;
    K->free_ (G.be, dy);
    K->stream_destroy (G.be, st);
}

/* ----------------------------------------------------------------- main -- */

static void s_open (rx_loader_t *l, const char *name, struct be *b)
{
    struct rx_err err = { 0 };
    rx_plugin_t *p = NULL;
    if (rx_loader_find (l, RX_KIND_KERNELS, name, &p, &err) != RX_OK) s_die (name, &err);
    /* The compared backend may get a configuration (RX_COMPARE_INI, with
     * "\n" written as the two characters, so it fits in one variable). */
    const char *ini = b == &G ? getenv ("RX_COMPARE_INI") : NULL;
    rx_conf_t *conf = NULL;
    if (ini && *ini) {
        char *txt = strdup (ini), *o = txt;
        for (const char *i = ini; *i; i++) {
            if (i[0] == '\\' && i[1] == 'n') { *o++ = '\n'; i++; }
            else *o++ = *i;
        }
        *o = 0;
        conf = rx_conf_parse_string (txt, strlen (txt), "RX_COMPARE_INI", &err);
        free (txt);
        if (!conf) s_die ("RX_COMPARE_INI", &err);
        s_conf = conf;   /* the plugin's host table reads it later: kept to the end */
    }
    if (rx_plugin_init (p, conf, &err) != RX_OK) s_die (name, &err);
    if (b == &G) s_gplug = p;
    b->K = rx_plugin_ops (p);
    b->name = name;
    struct rx_kernels_params kp = { .struct_size = sizeof kp };
    int rc = b->K->create (rx_plugin_host (p), &kp, &b->be, &err);
    if (rc == RX_EDEVICE && b == &G) {
        printf ("SKIP  kernels-cuda: %s\n", err.msg);
        exit (77);
    }
    if (rc != RX_OK) s_die (name, &err);
    struct rx_kernels_info info = { .struct_size = sizeof info };
    b->K->info (b->be, &info);
    printf ("# %s: %s\n", name, info.device);
}

int main (int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : getenv ("RX_PLUGIN_BUILD_DIR");
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (dir, &err);
    if (!l) s_die ("loader", &err);
    s_open (l, "cpu", &C);
    const char *other = getenv ("RX_COMPARE_BACKEND");
    s_open (l, other && *other ? other : "cuda", &G);

    const int dts[] = { RX_F32, RX_F16, RX_BF16, RX_Q8_0, RX_Q4_0, RX_Q4_1, RX_Q4_K, RX_Q5_K, RX_Q6_K };
    const size_t ns[] = { 1, 3, 8, 37 };
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        const int q = dts[d] != RX_F32 && dts[d] != RX_F16 && dts[d] != RX_BF16;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            /* n > 4 takes cuBLAS with F16/BF16 operands: 1e-2. */
            double tol = q ? 3e-2 : (ns[i] > 4 && dts[d] != RX_F32 ? 1e-2 : 1e-4);
            s_matmul_case (dts[d], 512, 96, 1, -1, ns[i], 0, tol);
        }
        s_matmul_case (dts[d], 256, 40, 4, 2, 2, RX_MM_ACCUMULATE, q ? 3e-2 : 1e-4);
        s_matmul_case (dts[d], 256, 40, 4, 3, 20, RX_MM_ACCUMULATE, q ? 3e-2 : (dts[d] == RX_F32 ? 1e-4 : 1e-2));
        s_get_rows_case (dts[d], 256);
        /* Rows of more than one fast-matvec stage (RX_CU_MV_STAGE = 2048
         * elements), the last one partial, and two whole stages. */
        s_matmul_case (dts[d], 2560, 64, 1, -1, 1, 0, q ? 3e-2 : 1e-4);
        s_matmul_case (dts[d], 4096, 48, 1, -1, 3, RX_MM_ACCUMULATE, q ? 3e-2 : 1e-4);
    }
    s_get_rows_case (RX_F32, 40);    /* rows that are not whole 32-element chunks */
    s_get_rows_case (RX_F16, 8);
    s_get_rows_case (RX_BF16, 72);
    for (int op = 0; op < E_N; op++) {
        s_ew_case (op, 1, 512);
        s_ew_case (op, 33, 1024);
    }
    s_select_case (4, 32000, 1);
    s_select_case (7, 64, 8);
    s_select_case (3, 300, 40);
    s_route_case (37, 256, 8, 4, 8);      /* DeepSeek-V3's shape */
    s_route_case (5, 64, 1, 1, 6);
    s_route_case (3, 160, 8, 3, 6);       /* DeepSeek-V2's 160 experts, 8 groups */
    s_route_case (2, 16, 16, 4, 4);       /* one expert per group: a group scores its best */
    s_sort_case (0, 8, 256, 0);           /* n_tok 0: offsets of zeros */
    s_sort_case (1, 8, 256, 0);           /* decode, one token */
    s_sort_case (7, 6, 64, 1);
    s_sort_case (3000, 8, 256, 1);        /* prefill size, every warp busy */
    s_sort_case (500, 2, 4096, 1);        /* the largest expert count: one warp */
    s_gather_case (40, 1, 300);
    s_gather_case (40, 77, 300);
    s_combine_case (1, 8, 512, 0);
    s_combine_case (9, 6, 300, 0);
    s_combine_case (9, 6, 300, RX_MM_ACCUMULATE);
    {
        const int gdts[] = { RX_F32, RX_F16, RX_BF16, RX_Q8_0, RX_Q4_K, RX_Q6_K };
        for (size_t d = 0; d < sizeof gdts / sizeof gdts[0]; d++) {
            const int q = gdts[d] != RX_F32 && gdts[d] != RX_F16 && gdts[d] != RX_BF16;
            const double tol = q ? 3e-2 : 1e-4;
            s_grouped_case (gdts[d], 256, 40, 8, 8, 0, 8, 0, tol);                  /* decode */
            s_grouped_case (gdts[d], 512, 72, 16, 200, 0, 200, 0, tol);             /* prefill */
            s_grouped_case (gdts[d], 256, 40, 8, 120, 37, 60, RX_MM_ACCUMULATE, tol); /* window */
        }
    }
    s_moe_graph_case (RX_Q8_0);
    s_moe_graph_case (RX_BF16);
    /* the low-latency exchange: a rank alone, two, three with 10 experts
     * (3 + 3 + 4), a decode of one token, n_tok 0 (headers only), skew */
    s_ll_pack_case (4, 2, 8, 1, 8, 1, 16, 0);
    s_ll_pack_case (6, 4, 16, 2, 32, 1, 24, 0);
    s_ll_pack_case (7, 3, 10, 3, 24, 2, 4, 0);      /* hrows 2: 8 int32 hold 4 counts */
    s_ll_pack_case (1, 8, 256, 8, 8, 1, 64, 0);
    s_ll_pack_case (0, 8, 10, 3, 16, 1, 8, 0);
    s_ll_pack_case (9, 4, 10, 3, 40, 1, 12, 1);
    s_ll_unpack_case (1, 8, 1, 16, 4, 0);
    s_ll_unpack_case (2, 32, 1, 24, 8, 0);
    s_ll_unpack_case (3, 24, 2, 4, 4, 0);
    s_ll_unpack_case (8, 64, 1, 64, 32, 0);
    s_ll_unpack_case (3, 24, 1, 8, 3, 1);
    s_ll_unpack_case (5, 0, 1, 8, 2, 0);            /* slots 0: nothing routed */
    s_ll_unpack_case (16, 6, 1, 800, 800, 0);      /* 53 KiB of counts: opts in past 48 KiB */
    s_ll_graph_case ();
    s_attn_case ("gqa", RX_F32, 2, 64, 64, 8, 0, 0.f);
    s_attn_case ("gqa", RX_F16, 2, 64, 64, 8, 0, 0.f);
    s_attn_case ("window+softcap", RX_F32, 2, 128, 128, 4, 9, 30.f);
    s_attn_case ("mha", RX_F32, 4, 80, 80, 4, 0, 0.f);
    s_attn_case ("mla-absorbed", RX_F32, 1, 576, 512, 16, 0, 0.f);
    s_open_splits (s_gplug);
    s_split_cases ();
    struct rx_kernels_info gi = { .struct_size = sizeof gi };
    G.K->info (G.be, &gi);
    if (gi.caps & RX_KCAP_GRAPHS) {
        s_split_graph_case (&G_split[1], "splits 3");
        s_split_graph_case (&G, "(as set)");
        s_graph_case ();
    }
    else printf ("SKIP  graphs: backend %s does not capture\n", gi.name);

    for (int i = 0; i < 3; i++) G.K->destroy (G_split[i].be);
    G.K->destroy (G.be);
    C.K->destroy (C.be);
    rx_loader_destroy (&l);
    rx_conf_destroy (&s_conf);
    printf ("compare: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
