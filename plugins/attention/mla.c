/* plugins/attention/mla.c -- attn-mla.so: DeepSeek multi-head latent
 * attention (MLA) over a paged latent KV pool, on the kernel backend's
 * kv_store, matmul, copy2d and attention ops.
 *
 * What a slot stores.  One row per token per layer: [c_kv | k_pe], the
 * RMS-normed KV latent (kv_lora_rank values) and the roped key part shared
 * by every head (rope_dim values) -- instead of K and V per head.  For
 * DeepSeek-V3 (61 layers, kv_lora_rank 512, rope 64) that is 61 x 576 x 4
 * = 140,544 bytes per token in F32, against 61 x 128 x (192 + 128) x 4 =
 * 9,994,240 for the same model expanded to per-head K/V (71x less).
 *
 * The absorbed form (used for prefill and decode alike).  kv_b maps the
 * latent to, per head h, [k_nope_h (qk_nope) | v_h (hd_v)]:
 *     k_nope_h = W_UK_h c_kv,   v_h = W_UV_h c_kv.
 * So q_nope_h . k_nope_h = (W_UK_h^T q_nope_h) . c_kv, and the head output
 * sum_j p_j v_h,j = W_UV_h (sum_j p_j c_kv,j).  Per head:
 *     q_abs_h = [W_UK_h^T q_nope_h | q_pe_h]           (kv_lora_rank + rope_dim)
 *     o_lat_h = softmax(scale * q_abs_h . [c_kv | k_pe]_j) weighted sum of
 *               the latent rows
 *     out_h   = W_UV_h o_lat_h[0 .. kv_lora_rank)
 * The middle line is the kernel backend's ordinary paged attention with one
 * KV "head" of width kv_lora_rank + rope_dim whose V pool is the K pool
 * itself (pool.v == pool.k, hd_v == hd_k): it also sums the rope_dim tail,
 * which is ignored (about 11% extra on the weighted sum for V3's shapes).
 * So no new kernel op is needed and every backend with the 1.0 ops runs it.
 *
 * W_UK^T and W_UV per head are built once per layer from io->w_kv_b (the
 * first forward() of a layer, again if the handle changes): the kv_b rows
 * are dequantized with get_rows (any dtype), copied to the host, rearranged
 * into two 3-D F32 weights [qk_nope, kv_lora_rank, n_head] and
 * [kv_lora_rank, hd_v, n_head], and loaded with weight_load; matmul's
 * `expert` argument selects the head.  Those host copies live until
 * destroy() (weight_load may keep the pointer).
 *
 * Scratch (q_abs and o_lat, [tokens][n_head * (kv_lora_rank + rope_dim)])
 * grows in prepare() (or forward() without it) to the largest batch seen.
 *
 * Heads in one call.  Per head, the absorbed form is 2 matmuls and a copy:
 * 3 x n_head launches a layer (384 for V3), which a GPU pays for at
 * decode.  With the kernel ABI 1.3 ops (gather_rows, matmul_grouped) and a
 * batch of at most MLA_BATCH_MAX tokens, the heads run as the "experts" of
 * one grouped matmul: the token-major rows (token t, head h) are gathered
 * head-major (row h*n + t), W_UK^T / W_UV run over them with offsets h*n,
 * and the results are gathered back token-major -- 8 launches a layer
 * whatever n_head, with the same numbers (each head's matmul sees the same
 * n rows).  The index arrays depend on n only; they are built once per
 * batch size (in prepare(), so a graph capture never builds them) and kept:
 * (n_head + 1 + 2 n n_head) int32 each, 33 MiB for V3's 128 heads if every
 * size up to MLA_BATCH_MAX is seen.  Larger batches (prefill) keep the
 * per-head matmuls, which a GPU backend runs as GEMMs.
 *
 * Thread-safety and ownership: as radix/attn.h. */
#include <stdint.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/kernel.h>
#include <radix/plugin.h>

#include "common.h"

#define MLA_MAX_LAYERS 4096
#define MLA_MAX_DIM    8192
#define MLA_BATCH_MAX  256     /* most tokens whose heads run in one grouped call */

struct mla_layer_w {
    const rx_kweight_t *src;       /* the kv_b these were built from */
    rx_kweight_t *wukt;            /* [qk_nope, L, H]: head h = W_UK_h^T */
    rx_kweight_t *wuv;             /* [L, hd_v, H]:    head h = W_UV_h */
    float *host_ukt, *host_uv;     /* host data behind them */
};

struct mla {
    const struct rx_host *host;
    struct rx_kctx k;
    struct rx_attn_config cfg;
    int32_t L, R, nope, D;         /* kv_lora_rank, rope_dim, qk_nope, L + R */
    size_t elt;                    /* bytes of one KV element */
    void *mem;                     /* the whole pool (device) */
    uint64_t n_slots;
    struct rx_kv_pool *pools;      /* [n_layer] host array (views into mem) */
    struct mla_layer_w *lw;        /* [n_layer] */
    float *scratch;                /* device: q_abs then o_lat, cap rows each, then (batched
                                    * heads) A and B: cap * n_head rows of WA / WB */
    size_t cap;
    int batched;                   /* the backend has gather_rows and matmul_grouped */
    size_t WA, WB;                 /* max (nope, L), max (L, hd_v) */
    int32_t *idx[MLA_BATCH_MAX + 1];  /* device, per batch size n: offsets [H + 1], then
                                    * head-major [n*H], then token-major [n*H] */
};

static void s_free_layer (struct mla *m, struct mla_layer_w *w)
{
    if (w->wukt) m->k.ops->weight_free (m->k.be, w->wukt);
    if (w->wuv) m->k.ops->weight_free (m->k.be, w->wuv);
    if (w->host_ukt) m->host->free_ (m->host, w->host_ukt);
    if (w->host_uv) m->host->free_ (m->host, w->host_uv);
    memset (w, 0, sizeof *w);
}

static void s_destroy (void *a)
{
    struct mla *m = a;
    if (!m) return;
    if (m->mem || m->scratch) m->k.ops->synchronize (m->k.be, m->k.stream, NULL);
    if (m->lw)
        for (int32_t l = 0; l < m->cfg.n_layer; l++) s_free_layer (m, &m->lw[l]);
    if (m->lw) m->host->free_ (m->host, m->lw);
    for (int i = 0; i <= MLA_BATCH_MAX; i++)
        if (m->idx[i]) m->k.ops->free_ (m->k.be, m->idx[i]);
    if (m->mem) m->k.ops->free_ (m->k.be, m->mem);
    if (m->scratch) m->k.ops->free_ (m->k.be, m->scratch);
    if (m->pools) m->host->free_ (m->host, m->pools);
    m->host->free_ (m->host, m);
}

static int s_create (const struct rx_host *host, const struct rx_kctx *k,
                     const struct rx_attn_config *cfg, void **out, struct rx_err *err)
{
    *out = NULL;
    if (!host || !k || !k->ops || !cfg)
        return rx_err_set (err, RX_EINVAL, "attn-mla: create: NULL host, kernels or config");
    if (cfg->struct_size < offsetof (struct rx_attn_config, rope_dim) + sizeof cfg->rope_dim)
        return rx_err_set (err, RX_EINVAL, "attn-mla: config struct too short (%u bytes)",
                           cfg->struct_size);
    if (cfg->kv_kind != RX_ATTN_KV_LATENT)
        return rx_err_set (err, RX_ENOTSUP,
                           "attn-mla: KV kind %d is not a latent (MLA) KV; a model with per-head K/V needs [attention] backend = mha",
                           cfg->kv_kind);
    if (cfg->n_layer <= 0 || cfg->n_layer > MLA_MAX_LAYERS || cfg->n_head <= 0
        || cfg->n_head > MLA_MAX_DIM || cfg->kv_lora_rank <= 0 || cfg->kv_lora_rank > MLA_MAX_DIM
        || cfg->rope_dim < 0 || cfg->rope_dim % 2 || cfg->hd_k <= cfg->rope_dim
        || cfg->hd_k > MLA_MAX_DIM || cfg->hd_v <= 0 || cfg->hd_v > MLA_MAX_DIM)
        return rx_err_set (err, RX_EINVAL,
                           "attn-mla: bad shapes: %d layers, %d heads, head dims k %d (nope + rope) / v %d, kv_lora_rank %d, rope_dim %d (even, < hd_k)",
                           cfg->n_layer, cfg->n_head, cfg->hd_k, cfg->hd_v, cfg->kv_lora_rank,
                           cfg->rope_dim);
    size_t elt;
    int rc = rx_attn_check_scale_and_kv ("attn-mla", k, cfg, &elt, err);
    if (rc != RX_OK) return rc;
    struct mla *m = host->alloc (host, sizeof *m, 0);
    if (!m) return rx_err_set (err, RX_ENOMEM, "attn-mla: out of memory");
    memset (m, 0, sizeof *m);
    m->host = host;
    m->k = *k;
    memcpy (&m->cfg, cfg, sizeof m->cfg);
    m->cfg.struct_size = sizeof m->cfg;
    m->elt = elt;
    m->L = cfg->kv_lora_rank;
    m->R = cfg->rope_dim;
    m->nope = cfg->hd_k - cfg->rope_dim;
    m->D = m->L + m->R;
    m->batched = RX_HAS (struct rx_kernels_ops, k->ops, moe_combine) && k->ops->gather_rows
                 && k->ops->matmul_grouped && k->ops->copy2d;
    m->WA = (size_t) (m->nope > m->L ? m->nope : m->L);
    m->WB = (size_t) (m->L > cfg->hd_v ? m->L : cfg->hd_v);
    size_t np = (size_t) cfg->n_layer * sizeof *m->pools, nw = (size_t) cfg->n_layer * sizeof *m->lw;
    m->pools = host->alloc (host, np, 0);
    m->lw = host->alloc (host, nw, 0);
    if (!m->pools || !m->lw) {
        s_destroy (m);
        return rx_err_set (err, RX_ENOMEM, "attn-mla: out of memory");
    }
    memset (m->pools, 0, np);
    memset (m->lw, 0, nw);
    *out = m;
    return RX_OK;
}

static uint64_t s_kv_bytes_per_token (void *a)
{
    struct mla *m = a;
    return (uint64_t) m->cfg.n_layer * (uint64_t) m->D * m->elt;
}

static int s_kv_alloc (void *a, uint64_t n_slots, struct rx_err *err)
{
    struct mla *m = a;
    if (n_slots == 0 || n_slots > INT32_MAX)
        return rx_err_set (err, RX_EINVAL, "attn-mla: kv_alloc: %llu slots (1 .. %d)",
                           (unsigned long long) n_slots, INT32_MAX);
    uint64_t per_tok = s_kv_bytes_per_token (m);
    if (per_tok > SIZE_MAX / n_slots)
        return rx_err_set (err, RX_ENOMEM, "attn-mla: KV pool of %llu slots overflows",
                           (unsigned long long) n_slots);
    if (m->mem) {
        m->k.ops->synchronize (m->k.be, m->k.stream, NULL);
        m->k.ops->free_ (m->k.be, m->mem);
        m->mem = NULL;
        m->n_slots = 0;
    }
    size_t bytes = (size_t) (per_tok * n_slots);
    int rc = m->k.ops->alloc (m->k.be, bytes, 0, &m->mem, err);
    if (rc != RX_OK) {
        m->mem = NULL;
        return rx_err_set (err, rc, "attn-mla: cannot allocate the latent KV pool: %llu slots x %llu bytes = %.1f MiB",
                           (unsigned long long) n_slots, (unsigned long long) per_tok,
                           (double) bytes / (1024.0 * 1024.0));
    }
    size_t lbytes = (size_t) n_slots * (size_t) m->D * m->elt;
    char *p = m->mem;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        struct rx_kv_pool *pl = &m->pools[l];
        /* One latent row per slot; V is the same memory (see the header). */
        pl->k = p;
        pl->v = p;
        p += lbytes;
        pl->dtype = m->cfg.kv_dtype;
        pl->n_kv_head = 1;
        pl->hd_k = m->D;
        pl->hd_v = m->D;
        pl->n_slots = n_slots;
    }
    m->n_slots = n_slots;
    RX_HLOG (m->host, RX_LOG_DEBUG, "latent KV pool: %d layers x %llu slots x %d, %.1f MiB (%s)",
             m->cfg.n_layer, (unsigned long long) n_slots, m->D, (double) bytes / (1024.0 * 1024.0),
             rx_dtype_name (m->cfg.kv_dtype));
    return RX_OK;
}

/* Grow the q_abs / o_lat scratch to n_tok rows. */
static int s_scratch (struct mla *m, size_t n_tok, struct rx_err *err)
{
    if (n_tok <= m->cap) return RX_OK;
    size_t cap = m->cap * 2 > n_tok ? m->cap * 2 : n_tok;
    size_t row = (size_t) m->cfg.n_head * (size_t) m->D;
    /* The batched heads' A and B ride along (only used up to MLA_BATCH_MAX
     * tokens, but sized with the rest: one allocation). */
    const size_t brow = m->batched ? (size_t) m->cfg.n_head * (m->WA + m->WB) : 0;
    const size_t bcap = cap < MLA_BATCH_MAX ? cap : MLA_BATCH_MAX;
    if (m->scratch) {
        m->k.ops->synchronize (m->k.be, m->k.stream, NULL);
        m->k.ops->free_ (m->k.be, m->scratch);
        m->scratch = NULL;
        m->cap = 0;
    }
    void *d;
    const size_t bytes = (2 * cap * row + bcap * brow) * sizeof (float);
    int rc = m->k.ops->alloc (m->k.be, bytes, 64, &d, err);
    if (rc != RX_OK)
        return rx_err_set (err, rc, "attn-mla: cannot allocate %.1f MiB of scratch for %zu tokens",
                           (double) bytes / (1024.0 * 1024.0), cap);
    m->scratch = d;
    m->cap = cap;
    return RX_OK;
}

/* Build W_UK^T and W_UV of layer `layer` from kv_b (see the header). */
static int s_build_layer (struct mla *m, int32_t layer, const rx_kweight_t *kv_b,
                          struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    struct mla_layer_w *w = &m->lw[layer];
    s_free_layer (m, w);
    const size_t H = (size_t) m->cfg.n_head, L = (size_t) m->L, nope = (size_t) m->nope,
                 hv = (size_t) m->cfg.hd_v, per = nope + hv, rows = H * per;
    int32_t *ids_h = m->host->alloc (m->host, rows * sizeof *ids_h, 0);
    float *kvb_h = m->host->alloc (m->host, rows * L * sizeof *kvb_h, 64);
    w->host_ukt = m->host->alloc (m->host, H * nope * L * sizeof (float), 64);
    w->host_uv = m->host->alloc (m->host, H * hv * L * sizeof (float), 64);
    void *ids_d = NULL, *kvb_d = NULL;
    int rc = RX_OK;
    if (!ids_h || !kvb_h || !w->host_ukt || !w->host_uv) {
        rc = rx_err_set (err, RX_ENOMEM, "attn-mla: out of memory (kv_b of layer %d)", layer);
        goto done;
    }
    for (size_t i = 0; i < rows; i++) ids_h[i] = (int32_t) i;
    if ((rc = K->alloc (m->k.be, rows * sizeof (int32_t), 0, &ids_d, err)) != RX_OK) goto done;
    if ((rc = K->alloc (m->k.be, rows * L * sizeof (float), 64, &kvb_d, err)) != RX_OK) goto done;
    if ((rc = K->copy_h2d (m->k.be, m->k.stream, ids_d, ids_h, rows * sizeof (int32_t), err)) != RX_OK)
        goto done;
    rc = K->get_rows (m->k.be, m->k.stream, kv_b, ids_d, rows, kvb_d, L, err);
    if (rc != RX_OK) {
        char why[RX_ERR_MSG_MAX];
        snprintf (why, sizeof why, "%s", err ? err->msg : "");
        rc = rx_err_set (err, rc,
                         "attn-mla: layer %d: kv_b must be [kv_lora_rank %zu, n_head %zu x (qk_nope %zu + v %zu)]: %s",
                         layer, L, H, nope, hv, why);
        goto done;
    }
    if ((rc = K->copy_d2h (m->k.be, m->k.stream, kvb_h, kvb_d, rows * L * sizeof (float), err)) != RX_OK)
        goto done;
    if ((rc = K->synchronize (m->k.be, m->k.stream, err)) != RX_OK) goto done;
    /* kv_b row (h*per + i) is output i of head h, L inputs.
     * W_UK_h^T as expert h of [nope, L]: row c (of L) = column c of W_UK_h,
     * i.e. element [h][c][i] = kvb[h*per + i][c].
     * W_UV_h as expert h of [L, hv]: row j = kv_b row h*per + nope + j. */
    for (size_t h = 0; h < H; h++) {
        float *ukt = w->host_ukt + h * L * nope;
        for (size_t c = 0; c < L; c++)
            for (size_t i = 0; i < nope; i++)
                ukt[c * nope + i] = kvb_h[(h * per + i) * L + c];
        memcpy (w->host_uv + h * hv * L, kvb_h + (h * per + nope) * L, hv * L * sizeof (float));
    }
    struct rx_weight_view v = {
        .name = "attn-mla W_UK^T", .dtype = RX_F32, .n_dims = 3, .ne = { nope, L, H, 1 },
        .data = w->host_ukt, .nbytes = H * nope * L * sizeof (float),
    };
    if ((rc = K->weight_load (m->k.be, &v, &w->wukt, err)) != RX_OK) goto done;
    v.name = "attn-mla W_UV";
    v.ne[0] = L;
    v.ne[1] = hv;
    v.data = w->host_uv;
    v.nbytes = H * hv * L * sizeof (float);
    if ((rc = K->weight_load (m->k.be, &v, &w->wuv, err)) != RX_OK) goto done;
    w->src = kv_b;
done:
    if (ids_d || kvb_d) K->synchronize (m->k.be, m->k.stream, NULL);
    if (ids_d) K->free_ (m->k.be, ids_d);
    if (kvb_d) K->free_ (m->k.be, kvb_d);
    if (ids_h) m->host->free_ (m->host, ids_h);
    if (kvb_h) m->host->free_ (m->host, kvb_h);
    if (rc != RX_OK) s_free_layer (m, w);
    return rc;
}

/* The batched heads' index arrays for batch size n (see the header). */
static int s_idx (struct mla *m, size_t n, struct rx_err *err)
{
    if (m->idx[n]) return RX_OK;
    const size_t H = (size_t) m->cfg.n_head, cnt = H + 1 + 2 * n * H;
    int32_t *h = m->host->alloc (m->host, cnt * sizeof *h, 0);
    if (!h) return rx_err_set (err, RX_ENOMEM, "attn-mla: out of memory (head indices)");
    int32_t *off = h, *hm = h + H + 1, *tm = hm + n * H;
    for (size_t i = 0; i <= H; i++) off[i] = (int32_t) (i * n);
    for (size_t hh = 0; hh < H; hh++)
        for (size_t t = 0; t < n; t++) {
            hm[hh * n + t] = (int32_t) (t * H + hh);   /* head-major row <- token-major row */
            tm[t * H + hh] = (int32_t) (hh * n + t);   /* token-major row <- head-major row */
        }
    void *d;
    int rc = m->k.ops->alloc (m->k.be, cnt * sizeof *h, 0, &d, err);
    if (rc == RX_OK) {
        rc = m->k.ops->copy_h2d (m->k.be, m->k.stream, d, h, cnt * sizeof *h, err);
        if (rc == RX_OK) rc = m->k.ops->synchronize (m->k.be, m->k.stream, err);
        if (rc == RX_OK) m->idx[n] = d;
        else m->k.ops->free_ (m->k.be, d);
    }
    m->host->free_ (m->host, h);
    return rc;
}

static int s_prepare (void *a, const struct rx_attn_batch *b, struct rx_err *err)
{
    struct mla *m = a;
    if (!b || b->n_tokens < 0)
        return rx_err_set (err, RX_EINVAL, "attn-mla: prepare: NULL batch or negative count");
    int rc = s_scratch (m, (size_t) b->n_tokens, err);
    if (rc == RX_OK && m->batched && b->n_tokens > 0 && b->n_tokens <= MLA_BATCH_MAX)
        rc = s_idx (m, (size_t) b->n_tokens, err);
    return rc;
}

#define MLA_TRY(expr) do { int rc_ = (expr); if (rc_ != RX_OK) return rc_; } while (0)

static int s_forward (void *a, int32_t layer, const struct rx_attn_batch *b,
                      const int32_t *new_slots, const struct rx_attn_io *io, struct rx_err *err)
{
    struct mla *m = a;
    if (!m->mem)
        return rx_err_set (err, RX_EINVAL, "attn-mla: forward before kv_alloc");
    if (layer < 0 || layer >= m->cfg.n_layer)
        return rx_err_set (err, RX_EINVAL, "attn-mla: layer %d out of 0..%d", layer,
                           m->cfg.n_layer - 1);
    if (!b || !io || !new_slots || io->struct_size < offsetof (struct rx_attn_io, w_kv_b) + sizeof io->w_kv_b
        || !io->q || !io->k || !io->out)
        return rx_err_set (err, RX_EINVAL, "attn-mla: forward: missing batch, slots, q, latent rows or out");
    if (!io->w_kv_b)
        return rx_err_set (err, RX_EINVAL, "attn-mla: forward: layer %d: no kv_b weight (rx_attn_io.w_kv_b)",
                           layer);
    if (b->n_tokens <= 0) return RX_OK;
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t n = (size_t) b->n_tokens, H = (size_t) m->cfg.n_head, D = (size_t) m->D,
                 L = (size_t) m->L, hk = (size_t) m->cfg.hd_k, hv = (size_t) m->cfg.hd_v,
                 nope = (size_t) m->nope, ld = H * D;
    if (m->lw[layer].src != io->w_kv_b) MLA_TRY (s_build_layer (m, layer, io->w_kv_b, err));
    MLA_TRY (s_scratch (m, n, err));
    const struct rx_kv_pool *pool = &m->pools[layer];
    MLA_TRY (K->kv_store (be, st, pool, io->k, io->ldk, io->k, io->ldk, new_slots, n, err));
    float *qa = m->scratch, *ol = m->scratch + m->cap * ld;
    const struct mla_layer_w *w = &m->lw[layer];
    const int batched = m->batched && n <= MLA_BATCH_MAX && io->ldq == H * hk && io->ldo == H * hv;
    if (batched) {
        /* The heads in one grouped call each (see the header). */
        MLA_TRY (s_idx (m, n, err));
        const int32_t *off = m->idx[n], *hm = off + H + 1, *tm = hm + n * H;
        const size_t nh = n * H;
        float *A = ol + m->cap * ld, *B = A + (m->cap < MLA_BATCH_MAX ? m->cap : MLA_BATCH_MAX) * H * m->WA;
        MLA_TRY (K->gather_rows (be, st, io->q, hk, hm, nh, nope, A, nope, err));
        MLA_TRY (K->matmul_grouped (be, st, w->wukt, off, 0, A, nope, B, L, nh, 0, err));
        MLA_TRY (K->gather_rows (be, st, B, L, tm, nh, L, qa, D, err));
        if (m->R > 0) MLA_TRY (K->copy2d (be, st, io->q + nope, hk, qa + L, D, nh, (size_t) m->R, err));
    } else
    for (size_t h = 0; h < H; h++) {
        /* q_abs_h = [W_UK_h^T q_nope_h | q_pe_h] */
        MLA_TRY (K->matmul (be, st, w->wukt, (int) h, io->q + h * hk, io->ldq, qa + h * D, ld, n,
                            0, err));
        if (m->R > 0)
            MLA_TRY (K->copy2d (be, st, io->q + h * hk + nope, io->ldq, qa + h * D + L, ld, n,
                                (size_t) m->R, err));
    }
    struct rx_attn_params p = {
        .struct_size = sizeof p, .n_head = m->cfg.n_head, .scale = m->cfg.scale,
        .softcap = m->cfg.softcap, .window = m->cfg.window,
    };
    MLA_TRY (K->attention (be, st, qa, ld, pool, b, &p, ol, ld, err));
    if (batched) {
        const int32_t *off = m->idx[n], *hm = off + H + 1, *tm = hm + n * H;
        const size_t nh = n * H;
        float *A = ol + m->cap * ld, *B = A + (m->cap < MLA_BATCH_MAX ? m->cap : MLA_BATCH_MAX) * H * m->WA;
        MLA_TRY (K->gather_rows (be, st, ol, D, hm, nh, L, A, L, err));
        MLA_TRY (K->matmul_grouped (be, st, w->wuv, off, 0, A, L, B, hv, nh, 0, err));
        return K->gather_rows (be, st, B, hv, tm, nh, hv, io->out, hv, err);
    }
    for (size_t h = 0; h < H; h++)   /* out_h = W_UV_h o_lat_h[0 .. L) */
        MLA_TRY (K->matmul (be, st, w->wuv, (int) h, ol + h * D, ld, io->out + h * hv, io->ldo, n,
                            0, err));
    return RX_OK;
}

static const struct rx_attn_ops s_ops = {
    .struct_size = sizeof (struct rx_attn_ops),
    .create = s_create,
    .destroy = s_destroy,
    .kv_bytes_per_token = s_kv_bytes_per_token,
    .kv_alloc = s_kv_alloc,
    .forward = s_forward,
    .prepare = s_prepare,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ATTENTION, .name = "mla", .version = "0.1.0",
                  .description = "DeepSeek multi-head latent attention (MLA): latent KV pool, absorbed form",
                  .ops = &s_ops)
