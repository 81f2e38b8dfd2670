/* models/graph.h -- CUDA-graph replay of decode steps ([scheduler]
 * cuda_graph_max_bs, SGLang's name), written once for every model plugin
 * (model-llama, model-deepseek2).  Header-only: plugins link no shared code.
 *
 * A decode step (one row per sequence, logits for every row) of n <=
 * max_bs sequences replays the graph captured for n; the first such step
 * captures it.  Everything a step varies -- tokens, positions, slots, KV
 * lengths -- is read by the kernels from the staging buffer uploaded before
 * the replay (models/batch.h), at the same device address every step; the
 * launch shapes depend only on n.  A step with another logits or staging
 * buffer (the engine grew one) captures again, and so does one after the
 * backend dropped its graphs (kernels-cuda and kernels-cpu's emulation drop
 * every graph when device memory is freed: a grown scratch buffer).  A
 * backend that cannot capture answers graph_begin with RX_ENOTSUP: max_bs
 * drops to 0 and every step runs op by op from then on.  So does a capture
 * that fails (a host copy or synchronize inside the step -- a plugin that
 * chose its host path after all): nothing of it ran, so the step is run
 * again op by op, with one warning line, and the request does not fail.
 *
 * The model decides which steps may be captured (rx_model_graphs_shape
 * plus its own conditions: one rank, no host copy anywhere in the step --
 * a synchronize inside a capture fails it) and hands the eager forward as
 * a callback.
 *
 * Graph keys: a model's 40-bit tag << 24 | n.
 *
 * Thread-safety: as the model instance (one thread). */
#ifndef RX_MODELS_GRAPH_H
#define RX_MODELS_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/err.h>
#include <radix/host.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/plugin.h>

#include "batch.h"

struct rx_model_graphs {
    const struct rx_host *host;           /* for the warning line */
    const char *who;                      /* "model-llama" */
    int32_t max_bs;                       /* 0: off (or the backend cannot capture) */
    uint64_t tag;                         /* key = tag << 24 | n */
    /* for_n[n]: the (logits, staging) pair graph n was captured with. */
    struct rx_model_graph_for { const float *logits; const int32_t *stage; } *for_n;
};

/* From the env at create (cuda_graph_max_bs; 0 or an env too old: off). */
static inline int rx_model_graphs_init (struct rx_model_graphs *g, const struct rx_host *host,
                                        const struct rx_model_env *env, uint64_t tag, const char *who,
                                        struct rx_err *err)
{
    memset (g, 0, sizeof *g);
    g->tag = tag;
    g->host = host;
    g->who = who;
    if (env->struct_size < offsetof (struct rx_model_env, cuda_graph_max_bs) + sizeof env->cuda_graph_max_bs
        || env->cuda_graph_max_bs <= 0)
        return RX_OK;
    size_t bytes = ((size_t) env->cuda_graph_max_bs + 1) * sizeof *g->for_n;
    if (!(g->for_n = host->alloc (host, bytes, 0)))
        return rx_err_set (err, RX_ENOMEM, "%s: create: out of memory (graph table)", who);
    memset (g->for_n, 0, bytes);
    g->max_bs = env->cuda_graph_max_bs;
    return RX_OK;
}

static inline void rx_model_graphs_free (struct rx_model_graphs *g, const struct rx_host *host)
{
    if (g->for_n) host->free_ (host, g->for_n);
    g->for_n = NULL;
    g->max_bs = 0;
}

static inline uint64_t rx_model_graphs_key (const struct rx_model_graphs *g, int32_t n)
{
    return g->tag << 24 | (uint64_t) n;
}

/* A decode step a graph of this size may replay: every sequence one row,
 * every row's logits, n <= max_bs. */
static inline int rx_model_graphs_shape (const struct rx_model_graphs *g, const struct rx_model_batch *b)
{
    return g->max_bs > 0 && b->n_tokens <= g->max_bs && b->n_tokens == b->n_seq && b->n_out == b->n_tokens;
}

/* The eager forward of a step the graph captures. */
typedef int (*rx_model_step_fn) (void *model, const struct rx_model_batch *b,
                                 const struct rx_model_batch_dev *dv, struct rx_err *err);

/* Replays graph n (= b->n_tokens), capturing it first when needed; the
 * backend cannot capture: runs step eagerly (and turns graphs off). */
static inline int rx_model_graphs_run (struct rx_model_graphs *g, const struct rx_kctx *k, void *model,
                                       rx_model_step_fn step, const struct rx_model_batch *b,
                                       const struct rx_model_batch_dev *dv, struct rx_err *err)
{
    const struct rx_kernels_ops *K = k->ops;
    const int32_t n = b->n_tokens;
    const uint64_t key = rx_model_graphs_key (g, n);
    struct rx_model_graph_for *f = &g->for_n[n];
    if (!K->graph_has (k->be, key) || f->logits != b->logits || f->stage != dv->tokens) {
        int rc = K->graph_begin (k->be, k->stream, key, err);
        if (rc == RX_ENOTSUP) {
            g->max_bs = 0;   /* the backend cannot capture: op by op from now on */
            rx_err_clear (err);
            return step (model, b, dv, err);
        }
        if (rc != RX_OK) return rc;
        rc = step (model, b, dv, err);
        /* End the capture whatever happened, so the stream is usable. */
        struct rx_err e2 = { 0 };
        int rc2 = K->graph_end (k->be, k->stream, key, rc == RX_OK ? err : &e2);
        if (rc != RX_OK || rc2 != RX_OK) {
            RX_HLOG (g->host, RX_LOG_WARN,
                     "%s: capturing the graph of a %d-sequence decode step failed (%s): CUDA graphs off, steps run op by op",
                     g->who, (int) n, err ? err->msg : rx_status_name (rc != RX_OK ? rc : rc2));
            g->max_bs = 0;
            rx_err_clear (err);
            return step (model, b, dv, err);
        }
        f->logits = b->logits;
        f->stage = dv->tokens;
    }
    return K->graph_launch (k->be, k->stream, key, err);
}

#endif /* RX_MODELS_GRAPH_H */
