/* kernels/cpu/ops.c -- see ops.h. */
#include <math.h>
#include <string.h>

#include "moe_route.h"
#include "quant.h"
#include "ops.h"

/* ------------------------------------------------------ row parallelism -- */

typedef void (*s_rows_fn) (void *ctx, size_t r0, size_t r1);

struct s_rows {
    s_rows_fn fn;
    void *ctx;
};

static void s_rows_chunk (void *ctx, size_t r0, size_t r1, int tid)
{
    (void) tid;
    struct s_rows *r = ctx;
    r->fn (r->ctx, r0, r1);
}

/* Run fn over [0, rows) in chunks claimed by the pool's threads; work ~
 * elements touched decides how many threads are worth waking. */
static void s_rows_run (struct rx_kcpu *k, size_t rows, double work, s_rows_fn fn, void *ctx)
{
    int nth = rx_kcpu_threads_for (k, work);
    if ((size_t) nth > rows) nth = (int) rows;
    if (nth <= 1) {
        if (rows) fn (ctx, 0, rows);
        return;
    }
    struct s_rows r = { fn, ctx };
    rx_kpool_for (k->pool, rows, 0, s_rows_chunk, &r, nth);
}

/* --------------------------------------------------------------- get_rows -- */

struct s_get_rows {
    const struct rx_kisa *isa;
    const struct rx_kweight *w;
    const int32_t *ids;
    float *out;
    size_t ldo;
};

static void s_get_rows_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_get_rows *c = ctx;
    for (size_t i = r0; i < r1; i++) {
        const uint8_t *row = c->w->data + (size_t) c->ids[i] * c->w->row_bytes;
        if (c->w->repacked)
            c->isa->repacked_row (c->w->dtype, row, c->out + i * c->ldo, (size_t) c->w->ne[0]);
        else
            rx_dequantize_row (c->w->dtype, row, c->out + i * c->ldo, (size_t) c->w->ne[0]);
    }
}

void rx_kcpu_get_rows (struct rx_kcpu *k, const struct rx_kweight *w, const int32_t *ids,
                       size_t n, float *out, size_t ldo)
{
    struct s_get_rows c = { k->isa, w, ids, out, ldo };
    s_rows_run (k, n, (double) n * (double) w->ne[0] * 4, s_get_rows_fn, &c);
}

/* --------------------------------------------------------------- rms_norm -- */

struct s_norm {
    const float *x, *w;
    float *y;
    size_t ldx, ldy, dim;
    float eps;
};

static void s_norm_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_norm *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->ldx;
        float *y = c->y + r * c->ldy;
        /* GGML sums squares in double (ggml_float) for rms_norm. */
        double sum = 0.0;
        for (size_t i = 0; i < c->dim; i++) sum += (double) (x[i] * x[i]);
        const float scale = 1.0f / sqrtf ((float) (sum / (double) c->dim) + c->eps);
        if (c->w)
            for (size_t i = 0; i < c->dim; i++) y[i] = x[i] * scale * c->w[i];
        else
            for (size_t i = 0; i < c->dim; i++) y[i] = x[i] * scale;
    }
}

void rx_kcpu_rms_norm (struct rx_kcpu *k, const float *x, size_t ldx, const float *w,
                       float *y, size_t ldy, size_t rows, size_t dim, float eps)
{
    struct s_norm c = { x, w, y, ldx, ldy, dim, eps };
    s_rows_run (k, rows, (double) rows * (double) dim * 4, s_norm_fn, &c);
}

/* ------------------------------------------------------------------- rope -- */

void rx_kcpu_rope_corr_dims (int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                             float beta_slow, float dims[2])
{
    /* The dimension at which a rotation completes n_rot turns over n_ctx_orig. */
    float start = floorf (n_dims * logf (n_ctx_orig / (beta_fast * 2 * (float) M_PI)) /
                          (2 * logf (freq_base)));
    float end = ceilf (n_dims * logf (n_ctx_orig / (beta_slow * 2 * (float) M_PI)) /
                       (2 * logf (freq_base)));
    dims[0] = start > 0 ? start : 0;
    dims[1] = end < (float) (n_dims - 1) ? end : (float) (n_dims - 1);
}

struct s_rope {
    float *x;
    size_t ldx, n_head, ld_head;
    const int32_t *pos;
    const struct rx_rope_params *p;
    float corr[2];
    float theta_scale;
    float *cache;                 /* per thread: n_rot floats (cos, sin pairs) */
};

static float s_yarn_ramp (float low, float high, int i0)
{
    const float y = (float) (i0 / 2 - low) / fmaxf (0.001f, high - low);
    return 1 - fminf (1, fmaxf (0, y));
}

static void s_rope_fn (void *ctx, size_t t0, size_t t1)
{
    struct s_rope *c = ctx;
    const struct rx_rope_params *p = c->p;
    const int n_rot = p->n_rot;
    float cs[2 * 1024];           /* n_rot <= 2048 checked by plugin.c */
    for (size_t t = t0; t < t1; t++) {
        /* GGML's rope cache: theta advances by repeated multiplication. */
        float theta = (float) c->pos[t];
        for (int i0 = 0; i0 < n_rot; i0 += 2) {
            const float ff = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
            float theta_extrap = theta / ff;
            float theta_interp = p->freq_scale * theta_extrap;
            float th = theta_interp, mscale = p->attn_factor;
            if (p->ext_factor != 0.0f) {
                float ramp_mix = s_yarn_ramp (c->corr[0], c->corr[1], i0) * p->ext_factor;
                th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
                mscale *= 1.0f + 0.1f * logf (1.0f / p->freq_scale);
            }
            cs[i0] = cosf (th) * mscale;
            cs[i0 + 1] = sinf (th) * mscale;
            theta *= c->theta_scale;
        }
        for (size_t h = 0; h < c->n_head; h++) {
            float *x = c->x + t * c->ldx + h * c->ld_head;
            if (p->mode == RX_ROPE_NEOX) {
                const int half = n_rot / 2;
                for (int i0 = 0; i0 < n_rot; i0 += 2) {
                    const float x0 = x[i0 / 2], x1 = x[i0 / 2 + half];
                    x[i0 / 2] = x0 * cs[i0] - x1 * cs[i0 + 1];
                    x[i0 / 2 + half] = x0 * cs[i0 + 1] + x1 * cs[i0];
                }
            } else {
                for (int i0 = 0; i0 < n_rot; i0 += 2) {
                    const float x0 = x[i0], x1 = x[i0 + 1];
                    x[i0] = x0 * cs[i0] - x1 * cs[i0 + 1];
                    x[i0 + 1] = x0 * cs[i0 + 1] + x1 * cs[i0];
                }
            }
        }
    }
}

void rx_kcpu_rope (struct rx_kcpu *k, float *x, size_t ldx, size_t n_tok, size_t n_head,
                   size_t ld_head, const int32_t *pos, const struct rx_rope_params *p)
{
    struct s_rope c;
    memset (&c, 0, sizeof c);
    c.x = x;
    c.ldx = ldx;
    c.n_head = n_head;
    c.ld_head = ld_head;
    c.pos = pos;
    c.p = p;
    c.theta_scale = powf (p->freq_base, -2.0f / (float) p->n_rot);
    rx_kcpu_rope_corr_dims (p->n_rot, p->n_ctx_orig, p->freq_base, p->beta_fast, p->beta_slow,
                            c.corr);
    s_rows_run (k, n_tok, (double) n_tok * (double) (n_head * (size_t) p->n_rot) * 8,
                s_rope_fn, &c);
}

/* ---------------------------------------------------------- elementwise -- */

struct s_ew {
    const float *a, *b;
    float *y;
    size_t lda, ldb, ldy, dim;
    float alpha;
    int op;
};

static void s_swiglu_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_ew *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *g = c->a + r * c->lda, *u = c->b + r * c->ldb;
        float *o = c->y + r * c->ldy;
        for (size_t i = 0; i < c->dim; i++)
            o[i] = g[i] / (1.0f + expf (-g[i])) * u[i];
    }
}

void rx_kcpu_swiglu (struct rx_kcpu *k, const float *g, size_t ldg, const float *u, size_t ldu,
                     float *o, size_t ldo, size_t rows, size_t dim)
{
    struct s_ew c = { .a = g, .b = u, .y = o, .lda = ldg, .ldb = ldu, .ldy = ldo, .dim = dim };
    s_rows_run (k, rows, (double) rows * (double) dim * 16, s_swiglu_fn, &c);
}

static void s_binop_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_ew *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *a = c->a + r * c->lda, *b = c->b + r * c->ldb;
        float *y = c->y + r * c->ldy;
        if (c->op == RX_KOP_ADD)
            for (size_t i = 0; i < c->dim; i++) y[i] = a[i] + b[i];
        else
            for (size_t i = 0; i < c->dim; i++) y[i] = a[i] * b[i];
    }
}

void rx_kcpu_binop (struct rx_kcpu *k, int op, const float *a, size_t lda, const float *b,
                    size_t ldb, float *y, size_t ldy, size_t rows, size_t dim)
{
    struct s_ew c = { .a = a, .b = b, .y = y, .lda = lda, .ldb = ldb, .ldy = ldy, .dim = dim,
                      .op = op };
    s_rows_run (k, rows, (double) rows * (double) dim, s_binop_fn, &c);
}

static void s_scale_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_ew *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *x = c->a + r * c->lda;
        float *y = c->y + r * c->ldy;
        for (size_t i = 0; i < c->dim; i++) y[i] = c->alpha * x[i];
    }
}

void rx_kcpu_scale (struct rx_kcpu *k, const float *x, size_t ldx, float *y, size_t ldy,
                    size_t rows, size_t dim, float alpha)
{
    struct s_ew c = { .a = x, .y = y, .lda = ldx, .ldy = ldy, .dim = dim, .alpha = alpha };
    s_rows_run (k, rows, (double) rows * (double) dim, s_scale_fn, &c);
}

static void s_sigmoid_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_ew *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *x = c->a + r * c->lda;
        float *y = c->y + r * c->ldy;
        for (size_t i = 0; i < c->dim; i++) y[i] = 1.0f / (1.0f + expf (-x[i]));
    }
}

void rx_kcpu_sigmoid (struct rx_kcpu *k, const float *x, size_t ldx, float *y, size_t ldy,
                      size_t rows, size_t dim)
{
    struct s_ew c = { .a = x, .y = y, .lda = ldx, .ldy = ldy, .dim = dim };
    s_rows_run (k, rows, (double) rows * (double) dim * 16, s_sigmoid_fn, &c);
}

static void s_copy_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_ew *c = ctx;
    for (size_t r = r0; r < r1; r++)
        memcpy (c->y + r * c->ldy, c->a + r * c->lda, c->dim * sizeof (float));
}

void rx_kcpu_copy2d (struct rx_kcpu *k, const float *x, size_t ldx, float *y, size_t ldy,
                     size_t rows, size_t dim)
{
    struct s_ew c = { .a = x, .y = y, .lda = ldx, .ldy = ldy, .dim = dim };
    s_rows_run (k, rows, (double) rows * (double) dim, s_copy_fn, &c);
}

static void s_softmax_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_ew *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        float *x = c->y + r * c->ldy;
        float max = -INFINITY;
        for (size_t i = 0; i < c->dim; i++) {
            x[i] *= c->alpha;
            max = x[i] > max ? x[i] : max;
        }
        double sum = 0.0;
        for (size_t i = 0; i < c->dim; i++) {
            x[i] = expf (x[i] - max);
            sum += x[i];
        }
        const float inv = (float) (1.0 / sum);
        for (size_t i = 0; i < c->dim; i++) x[i] *= inv;
    }
}

void rx_kcpu_softmax (struct rx_kcpu *k, float *x, size_t ldx, size_t rows, size_t dim,
                      float scale)
{
    struct s_ew c = { .y = x, .ldy = ldx, .dim = dim, .alpha = scale };
    s_rows_run (k, rows, (double) rows * (double) dim * 16, s_softmax_fn, &c);
}

/* ----------------------------------------------------------- argmax/topk -- */

struct s_sel {
    const float *x;
    size_t ldx, dim, k;
    int32_t *idx;
    float *vals;
};

static void s_argmax_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_sel *c = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->ldx;
        /* NaN never wins, the first of equal maxima does, an all-NaN row
         * is 0: the host's rx_argmax (core/sampling.c) exactly, so the
         * scheduler may take a device argmax for a greedy request. */
        size_t best = c->dim;
        for (size_t i = 0; i < c->dim; i++)
            if (!isnan (x[i]) && (best == c->dim || x[i] > x[best])) best = i;
        c->idx[r] = best == c->dim ? 0 : (int32_t) best;
    }
}

void rx_kcpu_argmax (struct rx_kcpu *k, const float *x, size_t ldx, size_t rows, size_t dim,
                     int32_t *out)
{
    struct s_sel c = { .x = x, .ldx = ldx, .dim = dim, .idx = out };
    s_rows_run (k, rows, (double) rows * (double) dim, s_argmax_fn, &c);
}

/* ------------------------------------------------------------ moe_route -- */

struct s_route {
    const float *probs, *sel;
    size_t ld, nx, g, tg, k;
    int norm;
    float scale;
    int32_t *ids;
    float *w;
};

static void s_route_fn (void *ctx, size_t r0, size_t r1)
{
    const struct s_route *c = ctx;
    uint8_t keep[RX_KCPU_MOE_MAX_EXPERT], taken[RX_KCPU_MOE_MAX_EXPERT];
    float gs[RX_KCPU_MOE_MAX_EXPERT];
    for (size_t r = r0; r < r1; r++) {
        int32_t *ids = c->ids + r * c->k;
        rx_moe_route_choose (c->sel + r * c->ld, c->nx, c->g, c->tg, c->k, ids, keep, gs, taken);
        rx_moe_route_weights (c->probs + r * c->ld, ids, c->k, c->norm, c->scale, c->w + r * c->k);
    }
}

void rx_kcpu_moe_route (struct rx_kcpu *k, const float *probs, const float *sel, size_t ld,
                        size_t rows, size_t n_expert, size_t n_group, size_t topk_group,
                        size_t kk, int norm, float scale, int32_t *ids, float *w)
{
    struct s_route c = { .probs = probs, .sel = sel, .ld = ld, .nx = n_expert, .g = n_group,
                         .tg = topk_group, .k = kk, .norm = norm, .scale = scale, .ids = ids, .w = w };
    s_rows_run (k, rows, (double) rows * (double) n_expert * (double) (kk + 1), s_route_fn, &c);
}

static void s_topk_fn (void *ctx, size_t r0, size_t r1)
{
    struct s_sel *c = ctx;
    const size_t kk = c->k;
    for (size_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->ldx;
        int32_t *idx = c->idx + r * kk;
        float *val = c->vals ? c->vals + r * kk : NULL;
        /* Insertion into a sorted list of the best kk so far: strict '>'
         * keeps the lower index first among equal values. */
        size_t n = 0;
        for (size_t i = 0; i < c->dim; i++) {
            const float v = x[i];
            if (n == kk && !(v > x[idx[kk - 1]])) continue;
            size_t p = n < kk ? n++ : kk - 1;
            while (p > 0 && v > x[idx[p - 1]]) {
                idx[p] = idx[p - 1];
                p--;
            }
            idx[p] = (int32_t) i;
        }
        if (val)
            for (size_t j = 0; j < kk; j++) val[j] = x[idx[j]];
    }
}

void rx_kcpu_topk (struct rx_kcpu *k, const float *x, size_t ldx, size_t rows, size_t dim,
                   size_t kk, float *vals, int32_t *idx)
{
    struct s_sel c = { .x = x, .ldx = ldx, .dim = dim, .k = kk, .idx = idx, .vals = vals };
    s_rows_run (k, rows, (double) rows * (double) dim * 2, s_topk_fn, &c);
}

/* ---------------------------------------- MoE expert pass (kernel ABI 1.3) -- */

void rx_kcpu_moe_sort (const int32_t *ids, size_t n_tok, size_t kk, size_t n_expert,
                       int32_t *offsets, int32_t *row, int32_t *src)
{
    /* moe-local's host counting sort, with offsets as the only scratch:
     * count into offsets[e + 1], prefix-sum (offsets[e] = first row of e),
     * place with offsets[e] as e's cursor (it ends at e's end = the first
     * row of e + 1), then shift back by one expert.  Serial: the choices
     * of a step are few and the order must be stable. */
    const size_t n = n_tok * kk;
    memset (offsets, 0, (n_expert + 1) * sizeof *offsets);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && (size_t) ids[i] < n_expert) offsets[ids[i] + 1]++;
    for (size_t e = 0; e < n_expert; e++) offsets[e + 1] += offsets[e];
    const int32_t valid = offsets[n_expert];
    for (size_t i = 0; i < n; i++) {
        const int32_t e = ids[i];
        if (e < 0 || (size_t) e >= n_expert) {
            row[i] = -1;
            continue;
        }
        const int32_t r = offsets[e]++;
        row[i] = r;
        src[r] = (int32_t) (i / kk);
    }
    for (size_t e = n_expert; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
    offsets[n_expert] = valid;
    for (size_t r = (size_t) valid; r < n; r++) src[r] = -1;
}

struct s_gather {
    const float *x;
    const int32_t *idx;
    float *y;
    size_t ldx, ldy, dim;
};

static void s_gather_fn (void *ctx, size_t r0, size_t r1)
{
    const struct s_gather *c = ctx;
    for (size_t i = r0; i < r1; i++) {
        float *y = c->y + i * c->ldy;
        if (c->idx[i] < 0) memset (y, 0, c->dim * sizeof *y);
        else memcpy (y, c->x + (size_t) c->idx[i] * c->ldx, c->dim * sizeof *y);
    }
}

void rx_kcpu_gather_rows (struct rx_kcpu *k, const float *x, size_t ldx, const int32_t *idx,
                          size_t n, size_t dim, float *y, size_t ldy)
{
    struct s_gather c = { .x = x, .idx = idx, .y = y, .ldx = ldx, .ldy = ldy, .dim = dim };
    s_rows_run (k, n, (double) n * (double) dim, s_gather_fn, &c);
}

/* moe_combine's two row steps, each its own non-inlined function: the
 * product is rounded to float and stored before the sum reads it, so no
 * compiler setting (-mfma with gcc's default -ffp-contract=fast in gnu
 * mode) can fuse w * y + acc into one FMA.  They compute exactly what the
 * scale op (alpha * x) and the add op (a + b) do, so moe_combine equals
 * moe-local's scale/add/copy2d sequence bit for bit. */
static void __attribute__ ((noinline))
s_row_mul (float *restrict p, const float *restrict y, float w, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = w * y[i];
}

static void __attribute__ ((noinline))
s_row_add (float *a, const float *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++) a[i] = a[i] + b[i];
}

/* Columns moe_combine sums at a time (two rows of them on the stack). */
#define S_COMBINE_COLS 512

struct s_combine {
    const float *y, *w;
    const int32_t *row;
    float *out;
    size_t ldy, ldo, k, dim;
    int accumulate;
};

static void s_combine_fn (void *ctx, size_t t0, size_t t1)
{
    const struct s_combine *c = ctx;
    float acc[S_COMBINE_COLS], p[S_COMBINE_COLS];
    for (size_t t = t0; t < t1; t++) {
        const int32_t *row = c->row + t * c->k;
        const float *w = c->w + t * c->k;
        float *o = c->out + t * c->ldo;
        /* Columns are independent: blocks of them keep acc in L1. */
        for (size_t c0 = 0; c0 < c->dim; c0 += S_COMBINE_COLS) {
            const size_t nc = c->dim - c0 < S_COMBINE_COLS ? c->dim - c0 : S_COMBINE_COLS;
            int have = 0;
            for (size_t j = 0; j < c->k; j++) {
                if (row[j] < 0) continue;
                const float *yj = c->y + (size_t) row[j] * c->ldy + c0;
                if (!have) {
                    s_row_mul (acc, yj, w[j], nc);
                    have = 1;
                } else {
                    s_row_mul (p, yj, w[j], nc);
                    s_row_add (acc, p, nc);
                }
            }
            if (c->accumulate) {
                if (have) s_row_add (o + c0, acc, nc);
            } else if (have) {
                memcpy (o + c0, acc, nc * sizeof *acc);
            } else {
                memset (o + c0, 0, nc * sizeof *acc);
            }
        }
    }
}

void rx_kcpu_moe_combine (struct rx_kcpu *k, const float *y, size_t ldy, const int32_t *row,
                          const float *w, size_t n_tok, size_t kk, size_t dim, float *out,
                          size_t ldo, int accumulate)
{
    struct s_combine c = { .y = y, .w = w, .row = row, .out = out, .ldy = ldy, .ldo = ldo,
                           .k = kk, .dim = dim, .accumulate = accumulate };
    s_rows_run (k, n_tok, (double) n_tok * (double) kk * (double) dim * 2, s_combine_fn, &c);
}

/* ------------------------- low-latency expert-parallel exchange (ABI 1.4) -- */

/* The rank that owns expert e when the experts split as first(p) = p *
 * n_expert / n_rank: first(p) <= e  <=>  p * n_expert < (e + 1) * n_rank,
 * so the owner (the largest such p) is ceil((e + 1) * n_rank / n_expert) - 1
 * (kernels-cuda's s_ll_owner is the same formula).  n_expert < 2^31 and
 * n_rank <= n_expert: no overflow in size_t. */
static size_t s_ll_owner (size_t e, size_t n_expert, size_t n_rank)
{
    return ((e + 1) * n_rank - 1) / n_expert;
}

static size_t s_ll_first (size_t p, size_t n_expert, size_t n_rank)
{
    return p * n_expert / n_rank;
}

void rx_kcpu_moe_ll_pack (const float *x, size_t ldx, const int32_t *ids, const int32_t *offsets,
                          const int32_t *row, const int32_t *src, size_t n_tok, size_t kk,
                          size_t n_expert, size_t n_rank, size_t slots, size_t hrows, size_t dim,
                          float *send, int32_t *slot_of)
{
    const size_t blk_rows = hrows + slots;
    for (size_t p = 0; p < n_rank; p++) {
        const size_t f0 = s_ll_first (p, n_expert, n_rank), f1 = s_ll_first (p + 1, n_expert, n_rank);
        float *blk = send + p * blk_rows * dim;
        /* the header: counts as int32 bit patterns, zeros after them */
        memset (blk, 0, hrows * dim * sizeof *blk);
        for (size_t e = f0; e < f1; e++) {
            const int32_t c = offsets[e + 1] - offsets[e];
            memcpy (blk + (e - f0), &c, sizeof c);
        }
        /* rank p's rows are the sorted rows of its experts, in order */
        const size_t base = (size_t) offsets[f0], c_p = (size_t) (offsets[f1] - offsets[f0]);
        for (size_t i = 0; i < c_p; i++)
            memcpy (blk + (hrows + i) * dim, x + (size_t) src[base + i] * ldx, dim * sizeof *blk);
    }
    for (size_t i = 0; i < n_tok * kk; i++) {
        const int32_t e = ids[i];
        if (row[i] < 0 || e < 0 || (size_t) e >= n_expert) {
            slot_of[i] = -1;
            continue;
        }
        const size_t p = s_ll_owner ((size_t) e, n_expert, n_rank);
        slot_of[i] = (int32_t) (p * blk_rows + hrows) + row[i] -
                     offsets[s_ll_first (p, n_expert, n_rank)];
    }
}

/* Count e of a header (int32 bit patterns), clamped to 0 .. room. */
static size_t s_ll_count (const float *hdr, size_t e, size_t room)
{
    int32_t c;
    memcpy (&c, hdr + e, sizeof c);
    if (c < 0) return 0;
    return (size_t) c < room ? (size_t) c : room;
}

void rx_kcpu_moe_ll_unpack (const float *recv, size_t n_rank, size_t slots, size_t hrows,
                            size_t dim, size_t n_local, int32_t *offsets, int32_t *order,
                            int32_t *back)
{
    /* moe_sort's scheme with offsets as the only scratch: sum the clamped
     * counts into offsets[e + 1], prefix-sum them (offsets[e] = e's first
     * routed row), place block by block with offsets[e] as e's cursor (the
     * blocks in rank order make the rows rank-minor), then shift back. */
    const size_t blk_rows = hrows + slots;
    memset (offsets, 0, (n_local + 1) * sizeof *offsets);
    for (size_t q = 0; q < n_rank; q++) {
        const float *hdr = recv + q * blk_rows * dim;
        size_t run = 0;
        for (size_t e = 0; e < n_local; e++) {
            const size_t c = s_ll_count (hdr, e, slots - run);
            run += c;
            offsets[e + 1] += (int32_t) c;
        }
    }
    for (size_t e = 0; e < n_local; e++) offsets[e + 1] += offsets[e];
    for (size_t r = 0; r < n_rank * slots; r++) order[r] = -1;
    for (size_t i = 0; i < n_rank * blk_rows; i++) back[i] = -1;
    for (size_t q = 0; q < n_rank; q++) {
        const float *hdr = recv + q * blk_rows * dim;
        size_t run = 0;
        for (size_t e = 0; e < n_local; e++) {
            const size_t c = s_ll_count (hdr, e, slots - run);
            for (size_t i = 0; i < c; i++) {
                const int32_t rr = (int32_t) (q * blk_rows + hrows + run + i);
                const int32_t routed = offsets[e] + (int32_t) i;
                order[routed] = rr;
                back[rr] = routed;
            }
            run += c;
            offsets[e] += (int32_t) c;
        }
    }
    for (size_t e = n_local; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}
