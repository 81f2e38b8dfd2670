/* plugins/attention/mha.c -- attn-mha.so: paged multi-head attention (MHA,
 * GQA, MQA) over the kernel backend's kv_store and attention ops.
 *
 * The pool: one device allocation for every layer, K then V per layer, each
 * [n_slots][n_kv_head][hd] of kv_dtype.  forward() stores the new tokens'
 * K/V rows into their slots, then runs the backend's paged causal attention
 * for the batch.  No compute happens here: the kernel backend does it, so
 * this plugin is the same on CPU and CUDA. */
#include <stdint.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/kernel.h>
#include <radix/plugin.h>

#include "common.h"

#define MHA_MAX_LAYERS 4096

struct mha {
    const struct rx_host *host;
    struct rx_kctx k;
    struct rx_attn_config cfg;
    size_t elt;                    /* bytes of one KV element */
    void *mem;                     /* the whole pool (device) */
    uint64_t n_slots;
    struct rx_kv_pool *pools;      /* [n_layer], host array (views into mem) */
};

static void s_destroy (void *a)
{
    struct mha *m = a;
    if (!m) return;
    if (m->mem) m->k.ops->free_ (m->k.be, m->mem);
    if (m->pools) m->host->free_ (m->host, m->pools);
    m->host->free_ (m->host, m);
}

static int s_create (const struct rx_host *host, const struct rx_kctx *k,
                     const struct rx_attn_config *cfg, void **out, struct rx_err *err)
{
    *out = NULL;
    if (!host || !k || !k->ops || !cfg)
        return rx_err_set (err, RX_EINVAL, "attn-mha: create: NULL host, kernels or config");
    if (cfg->struct_size < offsetof (struct rx_attn_config, rope_dim) + sizeof cfg->rope_dim)
        return rx_err_set (err, RX_EINVAL, "attn-mha: config struct too short (%u bytes)",
                           cfg->struct_size);
    if (cfg->kv_kind != RX_ATTN_KV_HEADS)
        return rx_err_set (err, RX_ENOTSUP,
                           "attn-mha: KV kind %d is not per-head K/V (a latent/MLA model needs [attention] backend = mla)",
                           cfg->kv_kind);
    if (cfg->n_layer <= 0 || cfg->n_layer > MHA_MAX_LAYERS || cfg->n_head <= 0
        || cfg->n_kv_head <= 0 || cfg->n_head % cfg->n_kv_head != 0
        || cfg->hd_k <= 0 || cfg->hd_v <= 0 || cfg->hd_k > 4096 || cfg->hd_v > 4096)
        return rx_err_set (err, RX_EINVAL,
                           "attn-mha: bad shapes: %d layers, %d heads, %d kv heads (must divide), head dims %d/%d",
                           cfg->n_layer, cfg->n_head, cfg->n_kv_head, cfg->hd_k, cfg->hd_v);
    size_t elt;
    int rc = rx_attn_check_scale_and_kv ("attn-mha", k, cfg, &elt, err);
    if (rc != RX_OK) return rc;
    struct mha *m = host->alloc (host, sizeof *m, 0);
    if (!m) return rx_err_set (err, RX_ENOMEM, "attn-mha: out of memory");
    memset (m, 0, sizeof *m);
    m->host = host;
    m->k = *k;
    memcpy (&m->cfg, cfg, sizeof m->cfg);
    m->cfg.struct_size = sizeof m->cfg;
    m->elt = elt;
    m->pools = host->alloc (host, (size_t) cfg->n_layer * sizeof *m->pools, 0);
    if (!m->pools) {
        s_destroy (m);
        return rx_err_set (err, RX_ENOMEM, "attn-mha: out of memory");
    }
    memset (m->pools, 0, (size_t) cfg->n_layer * sizeof *m->pools);
    *out = m;
    return RX_OK;
}

static uint64_t s_kv_bytes_per_token (void *a)
{
    struct mha *m = a;
    return (uint64_t) m->cfg.n_layer * (uint64_t) m->cfg.n_kv_head
           * (uint64_t) (m->cfg.hd_k + m->cfg.hd_v) * m->elt;
}

static int s_kv_alloc (void *a, uint64_t n_slots, struct rx_err *err)
{
    struct mha *m = a;
    if (n_slots == 0 || n_slots > INT32_MAX)
        return rx_err_set (err, RX_EINVAL, "attn-mha: kv_alloc: %llu slots (1 .. %d)",
                           (unsigned long long) n_slots, INT32_MAX);
    uint64_t per_tok = s_kv_bytes_per_token (m);
    if (per_tok > SIZE_MAX / n_slots)
        return rx_err_set (err, RX_ENOMEM, "attn-mha: KV pool of %llu slots overflows",
                           (unsigned long long) n_slots);
    if (m->mem) {
        m->k.ops->free_ (m->k.be, m->mem);
        m->mem = NULL;
        m->n_slots = 0;
    }
    size_t bytes = (size_t) (per_tok * n_slots);
    int rc = m->k.ops->alloc (m->k.be, bytes, 0, &m->mem, err);
    if (rc != RX_OK) {
        m->mem = NULL;
        return rx_err_set (err, rc, "attn-mha: cannot allocate the KV pool: %llu slots x %llu bytes = %.1f MiB",
                           (unsigned long long) n_slots, (unsigned long long) per_tok,
                           (double) bytes / (1024.0 * 1024.0));
    }
    size_t kbytes = (size_t) n_slots * (size_t) m->cfg.n_kv_head * (size_t) m->cfg.hd_k * m->elt;
    size_t vbytes = (size_t) n_slots * (size_t) m->cfg.n_kv_head * (size_t) m->cfg.hd_v * m->elt;
    char *p = m->mem;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        struct rx_kv_pool *pl = &m->pools[l];
        pl->k = p;
        pl->v = p + kbytes;
        p += kbytes + vbytes;
        pl->dtype = m->cfg.kv_dtype;
        pl->n_kv_head = m->cfg.n_kv_head;
        pl->hd_k = m->cfg.hd_k;
        pl->hd_v = m->cfg.hd_v;
        pl->n_slots = n_slots;
    }
    m->n_slots = n_slots;
    RX_HLOG (m->host, RX_LOG_DEBUG, "KV pool: %d layers x %llu slots, %.1f MiB (%s)",
             m->cfg.n_layer, (unsigned long long) n_slots, (double) bytes / (1024.0 * 1024.0),
             rx_dtype_name (m->cfg.kv_dtype));
    return RX_OK;
}

static int s_forward (void *a, int32_t layer, const struct rx_attn_batch *b,
                      const int32_t *new_slots, const struct rx_attn_io *io, struct rx_err *err)
{
    struct mha *m = a;
    if (!m->mem)
        return rx_err_set (err, RX_EINVAL, "attn-mha: forward before kv_alloc");
    if (layer < 0 || layer >= m->cfg.n_layer)
        return rx_err_set (err, RX_EINVAL, "attn-mha: layer %d out of 0..%d", layer,
                           m->cfg.n_layer - 1);
    if (!b || !io || !new_slots || io->struct_size < offsetof (struct rx_attn_io, ldo) + sizeof io->ldo
        || !io->q || !io->k || !io->v || !io->out)
        return rx_err_set (err, RX_EINVAL, "attn-mha: forward: missing batch, slots, q, k, v or out");
    if (b->n_tokens <= 0)
        return RX_OK;
    const struct rx_kv_pool *pool = &m->pools[layer];
    int rc = m->k.ops->kv_store (m->k.be, m->k.stream, pool, io->k, io->ldk, io->v, io->ldv,
                                 new_slots, (size_t) b->n_tokens, err);
    if (rc != RX_OK) return rc;
    struct rx_attn_params p = {
        .struct_size = sizeof p, .n_head = m->cfg.n_head, .scale = m->cfg.scale,
        .softcap = m->cfg.softcap, .window = m->cfg.window,
    };
    return m->k.ops->attention (m->k.be, m->k.stream, io->q, io->ldq, pool, b, &p, io->out,
                                io->ldo, err);
}

static const struct rx_attn_ops s_ops = {
    .struct_size = sizeof (struct rx_attn_ops),
    .create = s_create,
    .destroy = s_destroy,
    .kv_bytes_per_token = s_kv_bytes_per_token,
    .kv_alloc = s_kv_alloc,
    .forward = s_forward,
    .prepare = NULL,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ATTENTION, .name = "mha", .version = "0.1.0",
                  .description = "paged multi-head attention (MHA/GQA/MQA) on the kernel backend",
                  .ops = &s_ops)
