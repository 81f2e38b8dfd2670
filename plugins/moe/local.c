/* plugins/moe/local.c -- moe-local.so: the MoE dispatcher without
 * communication (ep_size 1: every expert on this rank), see radix/moe.h.
 *
 * dispatch: the routing (ids, weights) is copied to the host (one
 * copy_d2h each, then synchronize: the counts size the model's matmuls),
 * rows are counted per expert, the offsets built, and each choice (t, j)
 * gets its own row of routed.x, ordered by expert, then token, then choice
 * (a stable counting sort).  The x rows are gathered with one copy2d per
 * run of consecutive tokens that land in consecutive routed rows (the
 * kernel ABI has no indexed gather yet; on the CPU backend a copy2d is a
 * plain function call, so per-row copies cost little).
 *
 * Device sort (radix/moe.h RX_MOE_ROUTED_DEVICE): when the caller asks
 * for it and the backend has the ABI 1.3 ops moe_sort, gather_rows and
 * moe_combine, dispatch runs the same counting sort on the device (moe_sort,
 * then one gather_rows of the token rows) and combine is one moe_combine
 * with the same order of float operations: the results are bit for bit
 * those of the host path, without a copy to the host or a synchronize.
 * The weights are copied to the instance (copy_d2d) so that the caller's
 * buffer may change before combine, as on the host path.
 *
 * combine: out[t] = w[t][0] y(t,0) + w[t][1] y(t,1) + .. in choice order,
 * then `=` or `+=` into out.  With the kernel ops of radix/kernel.h 1.0
 * (no axpy) each contribution is scaled in place in routed.y (scale), the
 * k scaled rows are summed into row (t,0) (add), and that row is copied or
 * added to out[t]: routed.y is clobbered by combine.  That is 2k ops per
 * token on the stream: fine on the CPU backend (ops are plain function
 * calls); a GPU backend wants gather/scatter ops appended to kernel.h.
 *
 * Memory: routed.x / routed.y are one device allocation of 2 x max_tokens
 * x k x n_embd floats made at create (plus, for the device sort, the
 * offsets, the row maps and the weights: (n_expert + 1) + 3 x max_tokens x
 * k four-byte values); the host arrays (ids, weights, the
 * row of each choice, offsets) are sized from max_tokens x k at create
 * too, so dispatch allocates nothing.  Thread-safety: see radix/moe.h. */
#include <stdint.h>
#include <string.h>

#include <radix/kernel.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#define ML_MAX_EXPERT 65536
#define ML_MAX_DIM    (1 << 20)

struct ml {
    const struct rx_host *host;
    const struct rx_kernels_ops *K;
    void *be;
    rx_kstream_t *st;
    int32_t n_expert, k, n_embd, max_tokens;

    void *dmem;                 /* device: routed x then y */
    float *rx, *ry;
    /* host scratch, one allocation */
    void *hmem;
    int32_t *ids;               /* [max_tokens * k] */
    float *w;                   /* [max_tokens * k] */
    int32_t *row;               /* [max_tokens * k]: routed row of choice (t, j) */
    int32_t *src;               /* [max_tokens * k]: token of routed row r */
    int32_t *offsets;           /* [n_expert + 1] */
    int32_t *fill;              /* [n_expert]: next free row per expert */

    int32_t n_tok;              /* of the last dispatch; -1 = none yet */

    /* Device sort (see the header): NULL when the backend lacks the ops. */
    int32_t *d_off;             /* [n_expert + 1] */
    int32_t *d_row;             /* [max_tokens * k]: routed row of choice (t, j) */
    int32_t *d_src;             /* [max_tokens * k]: token of routed row r */
    float *d_w;                 /* [max_tokens * k]: the dispatch's weights */
    int dev;                    /* the last dispatch sorted on the device */
    int no_dev;                 /* the backend refused moe_sort for our shape */

    /* The asynchronous halves (see s_dispatch_start). */
    int pend;
    struct rx_moe_routed routed;
    float *cout;
    size_t cldo;
    uint32_t cflags;
};

static void s_destroy (void *p)
{
    struct ml *m = p;
    if (!m) return;
    if (m->dmem) {
        m->K->synchronize (m->be, m->st, NULL);
        m->K->free_ (m->be, m->dmem);
    }
    if (m->hmem) m->host->free_ (m->host, m->hmem);
    m->host->free_ (m->host, m);
}

static int s_create (const struct rx_host *host, const struct rx_moe_config *cfg, void **out,
                     struct rx_err *err)
{
    if (!out) return rx_err_set (err, RX_EINVAL, "moe-local: create: NULL result pointer");
    *out = NULL;
    if (!host || !host->alloc || !cfg)
        return rx_err_set (err, RX_EINVAL, "moe-local: create: NULL host or config");
    if (cfg->struct_size < offsetof (struct rx_moe_config, comm_inst) + sizeof cfg->comm_inst)
        return rx_err_set (err, RX_EABI, "moe-local: create: config struct too short (%u bytes)",
                           cfg->struct_size);
    if (cfg->ep_size != 1 || cfg->ep_rank != 0)
        return rx_err_set (err, RX_ENOTSUP,
                           "moe-local: expert parallelism (ep_size %d, rank %d) is not supported: `local` runs every expert on one rank (ep_size 1); use the `ep_normal` dispatcher",
                           cfg->ep_size, cfg->ep_rank);
    if (!cfg->kops || !cfg->kbe)
        return rx_err_set (err, RX_EINVAL, "moe-local: create: NULL kernel backend");
    const struct rx_kernels_ops *K = cfg->kops;
    if (!K->alloc || !K->free_ || !K->copy_d2h || !K->synchronize || !K->copy2d || !K->scale
        || !K->add)
        return rx_err_set (err, RX_EABI, "moe-local: kernel backend lacks alloc, free, copy_d2h, synchronize, copy2d, scale or add");
    if (cfg->n_expert <= 0 || cfg->n_expert > ML_MAX_EXPERT || cfg->n_expert_used <= 0
        || cfg->n_expert_used > cfg->n_expert || cfg->n_embd <= 0 || cfg->n_embd > ML_MAX_DIM
        || cfg->max_tokens <= 0 || cfg->max_tokens > (1 << 24))
        return rx_err_set (err, RX_EINVAL,
                           "moe-local: bad config: %d experts (1 .. %d), %d used per token (1 .. n_expert), n_embd %d (1 .. %d), max_tokens %d (1 .. %d)",
                           cfg->n_expert, ML_MAX_EXPERT, cfg->n_expert_used, cfg->n_embd, ML_MAX_DIM,
                           cfg->max_tokens, 1 << 24);
    const size_t R = (size_t) cfg->max_tokens * (size_t) cfg->n_expert_used;
    const size_t E = (size_t) cfg->n_embd;
    if (R > SIZE_MAX / E / 2 / sizeof (float) || R > INT32_MAX)
        return rx_err_set (err, RX_EINVAL, "moe-local: %d tokens x %d choices x %d floats overflow",
                           cfg->max_tokens, cfg->n_expert_used, cfg->n_embd);

    struct ml *m = host->alloc (host, sizeof *m, 0);
    if (!m) return rx_err_set (err, RX_ENOMEM, "moe-local: out of memory");
    memset (m, 0, sizeof *m);
    m->host = host;
    m->K = K;
    m->be = cfg->kbe;
    m->st = cfg->stream;
    m->n_expert = cfg->n_expert;
    m->k = cfg->n_expert_used;
    m->n_embd = cfg->n_embd;
    m->max_tokens = cfg->max_tokens;
    m->n_tok = -1;

    const int dev = RX_HAS (struct rx_kernels_ops, K, moe_combine) && K->moe_sort && K->gather_rows
                    && K->moe_combine && K->copy_d2d;
    const size_t dev_words = dev ? (size_t) cfg->n_expert + 1 + 3 * R : 0;
    const size_t dbytes = 2 * R * E * sizeof (float) + dev_words * 4;
    void *d;
    int rc = K->alloc (m->be, dbytes, 64, &d, err);
    if (rc != RX_OK) {
        s_destroy (m);
        return rx_err_set (err, rc, "moe-local: cannot allocate %.1f MiB for %d tokens x %d choices x %d floats",
                           (double) dbytes / (1024.0 * 1024.0), cfg->max_tokens, cfg->n_expert_used,
                           cfg->n_embd);
    }
    m->dmem = d;
    m->rx = d;
    m->ry = m->rx + R * E;
    if (dev) {
        m->d_w = m->ry + R * E;
        m->d_row = (int32_t *) (m->d_w + R);
        m->d_src = m->d_row + R;
        m->d_off = m->d_src + R;
    }
    size_t hbytes = R * (3 * sizeof (int32_t) + sizeof (float))
                    + (2 * (size_t) cfg->n_expert + 1) * sizeof (int32_t);
    if (!(m->hmem = host->alloc (host, hbytes, 64))) {
        s_destroy (m);
        return rx_err_set (err, RX_ENOMEM, "moe-local: out of memory (%zu bytes of routing scratch)",
                           hbytes);
    }
    m->ids = m->hmem;
    m->w = (float *) (m->ids + R);
    m->row = (int32_t *) (m->w + R);
    m->src = m->row + R;
    m->offsets = m->src + R;
    m->fill = m->offsets + cfg->n_expert + 1;
    *out = m;
    return RX_OK;
}

#define ML_TRY(expr) do { int rc_ = (expr); if (rc_ != RX_OK) return rc_; } while (0)

static int s_dispatch (void *p, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                       const float *w, struct rx_moe_routed *routed, struct rx_err *err)
{
    struct ml *m = p;
    if (!m || !routed)
        return rx_err_set (err, RX_EINVAL, "moe-local: dispatch: NULL instance or routed");
    if (m->pend)
        return rx_err_set (err, RX_EINVAL, "moe-local: dispatch while a started %s is not waited on",
                           m->pend == 1 ? "dispatch" : "combine");
    m->n_tok = -1;
    if (n_tok < 0 || n_tok > m->max_tokens)
        return rx_err_set (err, n_tok < 0 ? RX_EINVAL : RX_ERANGE,
                           "moe-local: dispatch of %d tokens (0 .. max_tokens %d)", n_tok, m->max_tokens);
    if (n_tok > 0 && (!x || !ids || !w || ldx < (size_t) m->n_embd))
        return rx_err_set (err, RX_EINVAL, "moe-local: dispatch: NULL x, ids or weights, or ldx %zu < n_embd %d",
                           ldx, m->n_embd);
    if (routed->struct_size < offsetof (struct rx_moe_routed, y) + sizeof routed->y)
        return rx_err_set (err, RX_EABI, "moe-local: dispatch: routed struct too short (%u bytes)",
                           routed->struct_size);
    const int32_t k = m->k, NE = m->n_expert;
    const size_t n = (size_t) n_tok * (size_t) k, E = (size_t) m->n_embd;
    const int want_dev = routed->struct_size >= offsetof (struct rx_moe_routed, d_offsets) + sizeof routed->d_offsets
                         && (routed->flags & RX_MOE_ROUTED_DEVICE);
    m->dev = 0;
    int rc = want_dev && m->d_off && !m->no_dev ? RX_OK : RX_ENOTSUP;
    if (rc == RX_OK) {
        /* The same stable sort on the device (see the header).  A backend
         * may refuse a shape (kernels-cuda: more than 4096 experts): the
         * host path then, for good. */
        rc = m->K->moe_sort (m->be, m->st, ids, (size_t) n_tok, (size_t) k, (size_t) NE, m->d_off, m->d_row,
                             m->d_src, err);
        if (rc == RX_ENOTSUP) {
            rx_err_clear (err);
            m->no_dev = 1;
        }
    }
    if (rc != RX_ENOTSUP) {
        ML_TRY (rc);
        if (n > 0) ML_TRY (m->K->copy_d2d (m->be, m->st, m->d_w, w, n * sizeof (float), err));
        if (n > 0) ML_TRY (m->K->gather_rows (m->be, m->st, x, ldx, m->d_src, n, E, m->rx, E, err));
        struct rx_moe_routed o = {
            .struct_size = routed->struct_size, .first_expert = 0, .n_local_expert = NE,
            .offsets = NULL, .n_rows = (int32_t) n, .x = m->rx, .y = m->ry,
            .flags = routed->flags, .d_offsets = m->d_off,
        };
        memcpy (routed, &o, routed->struct_size < sizeof o ? routed->struct_size : sizeof o);
        m->dev = 1;
        m->n_tok = n_tok;
        return RX_OK;
    }
    if (n > 0) {
        ML_TRY (m->K->copy_d2h (m->be, m->st, m->ids, ids, n * sizeof *m->ids, err));
        ML_TRY (m->K->copy_d2h (m->be, m->st, m->w, w, n * sizeof *m->w, err));
        ML_TRY (m->K->synchronize (m->be, m->st, err));
    }
    /* Counting sort by expert, stable in (token, choice). */
    memset (m->offsets, 0, ((size_t) NE + 1) * sizeof *m->offsets);
    for (size_t i = 0; i < n; i++) {
        int32_t e = m->ids[i];
        if (e < 0 || e >= NE)
            return rx_err_set (err, RX_EINVAL, "moe-local: dispatch: token %zu choice %zu: expert id %d out of 0 .. %d",
                               i / (size_t) k, i % (size_t) k, e, NE - 1);
        m->offsets[e + 1]++;
    }
    for (int32_t e = 0; e < NE; e++) {
        m->offsets[e + 1] += m->offsets[e];
        m->fill[e] = m->offsets[e];
    }
    for (size_t i = 0; i < n; i++) {
        m->row[i] = m->fill[m->ids[i]]++;
        m->src[m->row[i]] = (int32_t) (i / (size_t) k);
    }
    /* Gather: routed row r reads token src[r]; runs of consecutive rows
     * reading consecutive tokens become one copy. */
    const int32_t n_rows = m->offsets[NE];
    for (int32_t r = 0; r < n_rows;) {
        int32_t len = 1;
        while (r + len < n_rows && m->src[r + len] == m->src[r] + len) len++;
        ML_TRY (m->K->copy2d (m->be, m->st, x + (size_t) m->src[r] * ldx, ldx,
                              m->rx + (size_t) r * E, E, (size_t) len, E, err));
        r += len;
    }
    struct rx_moe_routed o = {
        .struct_size = routed->struct_size, .first_expert = 0, .n_local_expert = NE,
        .offsets = m->offsets, .n_rows = m->offsets[NE], .x = m->rx, .y = m->ry,
    };
    size_t sz = routed->struct_size < sizeof o ? routed->struct_size : sizeof o;
    memcpy (routed, &o, sz);
    m->n_tok = n_tok;
    return RX_OK;
}

static int s_combine (void *p, float *out, size_t ldo, uint32_t flags, struct rx_err *err)
{
    struct ml *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, "moe-local: combine: NULL instance");
    if (m->pend)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine while a started %s is not waited on",
                           m->pend == 1 ? "dispatch" : "combine");
    if (m->n_tok < 0)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine without a successful dispatch before it");
    const int32_t n_tok = m->n_tok, k = m->k;
    const size_t E = (size_t) m->n_embd;
    m->n_tok = -1;   /* combine consumes (and clobbers) the dispatch */
    if (n_tok == 0) return RX_OK;
    if (!out || ldo < E)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine: NULL out or ldo %zu < n_embd %zu", ldo, E);
    if (flags & ~RX_MM_ACCUMULATE)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine: unknown flags 0x%x", flags);
    const struct rx_kernels_ops *K = m->K;
    if (m->dev)
        return K->moe_combine (m->be, m->st, m->ry, E, m->d_row, m->d_w, (size_t) n_tok, (size_t) k, E, out,
                               ldo, flags, err);
    for (int32_t t = 0; t < n_tok; t++) {
        const int32_t *row = m->row + (size_t) t * k;
        const float *w = m->w + (size_t) t * k;
        float *acc = m->ry + (size_t) row[0] * E;
        float *o = out + (size_t) t * ldo;
        if (k == 1 && !(flags & RX_MM_ACCUMULATE)) {
            ML_TRY (K->scale (m->be, m->st, acc, E, o, E, 1, E, w[0], err));
            continue;
        }
        ML_TRY (K->scale (m->be, m->st, acc, E, acc, E, 1, E, w[0], err));
        for (int32_t j = 1; j < k; j++) {
            float *yj = m->ry + (size_t) row[j] * E;
            ML_TRY (K->scale (m->be, m->st, yj, E, yj, E, 1, E, w[j], err));
            ML_TRY (K->add (m->be, m->st, acc, E, yj, E, acc, E, 1, E, err));
        }
        if (flags & RX_MM_ACCUMULATE)
            ML_TRY (K->add (m->be, m->st, o, E, acc, E, o, E, 1, E, err));
        else
            ML_TRY (K->copy2d (m->be, m->st, acc, E, o, E, 1, E, err));
    }
    return RX_OK;
}

#ifndef ML_NO_ASYNC
/* The asynchronous halves (radix/moe.h): nothing is exchanged, so
 * dispatch_start does the whole dispatch, dispatch_wait hands out its
 * routed rows, combine_start remembers out and combine_wait sums into it.
 * `pend` tracks where the instance is: 0 idle, 1 dispatch started (its
 * result kept or its error reported by the wait), 2 combine started. */
static int s_dispatch_start (void *p, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                             const float *w, struct rx_err *err)
{
    struct ml *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, "moe-local: dispatch_start: NULL instance");
    if (m->pend)
        return rx_err_set (err, RX_EINVAL, "moe-local: dispatch_start while a %s is started (wait first)",
                           m->pend == 1 ? "dispatch" : "combine");
    struct rx_moe_routed r = { .struct_size = sizeof r };
    int rc = s_dispatch (m, x, ldx, n_tok, ids, w, &r, err);
    if (rc != RX_OK) return rc;
    m->routed = r;
    m->pend = 1;
    return RX_OK;
}

static int s_dispatch_wait (void *p, struct rx_moe_routed *routed, struct rx_err *err)
{
    struct ml *m = p;
    if (!m || !routed) return rx_err_set (err, RX_EINVAL, "moe-local: dispatch_wait: NULL instance or routed");
    if (m->pend != 1)
        return rx_err_set (err, RX_EINVAL, "moe-local: dispatch_wait without a started dispatch");
    m->pend = 0;
    if (routed->struct_size < offsetof (struct rx_moe_routed, y) + sizeof routed->y) {
        m->n_tok = -1;
        return rx_err_set (err, RX_EABI, "moe-local: dispatch_wait: routed struct too short (%u bytes)",
                           routed->struct_size);
    }
    struct rx_moe_routed o = m->routed;
    o.struct_size = routed->struct_size;
    size_t sz = routed->struct_size < sizeof o ? routed->struct_size : sizeof o;
    memcpy (routed, &o, sz);
    return RX_OK;
}

static int s_combine_start (void *p, float *out, size_t ldo, uint32_t flags, struct rx_err *err)
{
    struct ml *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, "moe-local: combine_start: NULL instance");
    if (m->pend)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine_start while a %s is started (wait first)",
                           m->pend == 1 ? "dispatch" : "combine");
    if (m->n_tok < 0)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine without a successful dispatch before it");
    const size_t E = (size_t) m->n_embd;
    if ((m->n_tok > 0 && (!out || ldo < E)) || (flags & ~RX_MM_ACCUMULATE)) {
        m->n_tok = -1;
        return rx_err_set (err, RX_EINVAL, "moe-local: combine: NULL out, ldo %zu < n_embd %zu or unknown flags 0x%x",
                           ldo, E, flags);
    }
    m->cout = out;
    m->cldo = ldo;
    m->cflags = flags;
    m->pend = 2;
    return RX_OK;
}

static int s_combine_wait (void *p, struct rx_err *err)
{
    struct ml *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, "moe-local: combine_wait: NULL instance");
    if (m->pend != 2)
        return rx_err_set (err, RX_EINVAL, "moe-local: combine_wait without a started combine");
    m->pend = 0;
    return s_combine (m, m->cout, m->cldo, m->cflags, err);
}

static const struct rx_moe_ops s_ops = {
    .struct_size = sizeof (struct rx_moe_ops),
    .create = s_create,
    .destroy = s_destroy,
    .dispatch = s_dispatch,
    .combine = s_combine,
    .dispatch_start = s_dispatch_start,
    .dispatch_wait = s_dispatch_wait,
    .combine_start = s_combine_start,
    .combine_wait = s_combine_wait,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_MOE, .name = "local", .version = "0.1.0",
                  .description = "MoE dispatcher for one rank (ep_size 1): gathers each expert's rows, combines the weighted outputs",
                  .ops = &s_ops)
#else
/* Test fixture (tests/tbo.am: moe-local_sync.so, not installed): the ABI
 * 1.0 table only, as a dispatcher written before the asynchronous ops, so
 * the model's sequential two-batch-overlap fallback is exercised. */
static const struct rx_moe_ops s_ops = {
    .struct_size = RX_MOE_OPS_SIZE_1_0,
    .create = s_create,
    .destroy = s_destroy,
    .dispatch = s_dispatch,
    .combine = s_combine,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_MOE, .name = "local_sync", .version = "0.1.0",
                  .description = "test fixture: moe-local without the asynchronous ops (ABI 1.0 table)",
                  .ops = &s_ops)
#endif
