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
 * plus its own conditions: no host copy anywhere in the step -- a
 * synchronize inside a capture fails it) and hands the eager forward as a
 * callback.
 *
 * Several ranks (rx_model_graphs_ranks, at create): with a comm plugin
 * whose collectives a capture records (radix/comm.h graph_capturable),
 * tensor-parallel ranks replay the same graph, collectives inside; under
 * DP attention every rank replays the graph of the group's largest batch
 * M with its own batch padded to M (rx_model_stage_upload_padded,
 * rx_model_pad_batch, rx_model_graphs_run_padded), decided per step by models/dp_ffn.h
 * rx_dp_counts_graph with rx_model_graphs_dp_step as this rank's vote.
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
#include <radix/comm.h>
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
    /* Several ranks (rx_model_graphs_ranks): tp = tensor parallelism, each
     * rank replays the same graph with its collectives inside; dp = DP
     * attention, each replays the group's largest batch, padded
     * (rx_model_graphs_run_padded).  Both 0 on one rank. */
    int tp, dp;
    const struct rx_comm_ops *comm;
    void *comm_inst;
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
        RX_HLOG (g->host, RX_LOG_INFO, "%s: captured the CUDA graph of a %d-sequence decode step", g->who, (int) n);
    }
    return K->graph_launch (k->be, k->stream, key, err);
}

/* DP attention (models/dp_ffn.h rx_dp_counts_graph): when every rank's
 * step may replay, every rank replays its graph of M rows (M = the group's
 * largest batch), so a rank with n < M decode rows (n = 0: an idle rank)
 * pads its batch, as SGLang's graph runner does: M - n more sequences of
 * one row each -- token 0 at position 0, whose one KV position is pad_slot
 * (a row past the pool the model asked kv_alloc for, which the core never
 * hands out: its KV is scratch) -- and every row's logits into the model's
 * own scratch (logits, [M][n_vocab] at least), of which the model copies
 * the real rows out after the replay.  The padded rows run through
 * attention and the FFN like real ones; rows do not mix, so the real
 * rows' numbers are those of an unpadded step up to the kernels' choice
 * of path by row count.  b must be a decode-shape batch
 * (rx_model_graphs_shape) or idle (n_tokens 0).
 *
 * The padded index arrays are written once, straight into the staging
 * block (models/batch.h rx_model_stage_upload_padded); rx_model_pad_batch
 * then describes that block as the padded batch *out (its arrays valid
 * until the next upload), with p's out_rows 0 .. M-1. */
struct rx_model_pad {
    int32_t *rows;    /* host [cap]: 0, 1, .. (the padded batch's out_rows) */
    size_t cap;
};

static inline int rx_model_pad_batch (struct rx_model_pad *p, const struct rx_host *host,
                                      const struct rx_model_stage *st, int32_t T,
                                      const struct rx_model_batch *b, int32_t M, float *logits,
                                      struct rx_model_batch *out, const char *who, struct rx_err *err)
{
    if ((size_t) M > p->cap) {
        size_t cap = (size_t) M > 2 * p->cap ? (size_t) M : 2 * p->cap;
        int32_t *r = host->alloc (host, cap * sizeof *r, 64);
        if (!r) return rx_err_set (err, RX_ENOMEM, "%s: out of memory (padded batch)", who);
        for (size_t i = 0; i < cap; i++) r[i] = (int32_t) i;
        if (p->rows) host->free_ (host, p->rows);
        p->rows = r;
        p->cap = cap;
    }
    struct rx_model_batch_dev h;
    rx_model_stage_arrays (st->host, T, &h);
    *out = (struct rx_model_batch) {
        .struct_size = sizeof *out, .n_tokens = M, .tokens = h.tokens, .pos = h.pos,
        .n_seq = (b->n_tokens > 0 ? b->n_seq : 0) + M - b->n_tokens, .q_start = h.q_start,
        .kv_start = h.kv_start, .kv_slots = h.kv_slots, .n_out = M, .out_rows = p->rows, .logits = logits,
    };
    return RX_OK;
}

static inline void rx_model_pad_free (struct rx_model_pad *p, const struct rx_host *host)
{
    if (p->rows) host->free_ (host, p->rows);
    p->rows = NULL;
    p->cap = 0;
}

/* Whether a rank of a multi-rank model may replay graphs (at create, with
 * max_bs on): the comm plugin's collectives must be recorded by a capture
 * (radix/comm.h graph_capturable: comm-nccl; comm-shm on kernels-cpu).
 * Tensor parallelism: every rank runs the same batch, so every rank makes
 * the same choice and replays the same graph (g->tp).  DP attention: every
 * rank replays the group's largest batch, padded (g->dp); why_not: the
 * model's own reason against (NULL: none).  Logs one line either way. */
static inline void rx_model_graphs_ranks (struct rx_model_graphs *g, const char *path, int32_t rank,
                                          int32_t n_rank, int dp_attn, const char *why_not,
                                          const struct rx_comm_ops *comm, void *comm_inst)
{
    if (n_rank <= 1 || g->max_bs <= 0) return;
    const char *why = why_not;
    if (!why && (!RX_HAS (struct rx_comm_ops, comm, graph_capturable) || !comm->graph_capturable (comm_inst)))
        why = "the comm plugin's collectives cannot be captured";
    const char *mode = dp_attn ? "DP attention" : "tensor-parallel";
    if (why) {
        RX_HLOG (g->host, RX_LOG_INFO, "%s: %s rank %d: decode steps run op by op, not as CUDA graphs: %s", path,
                 mode, (int) rank, why);
        return;
    }
    g->dp = dp_attn != 0;
    g->tp = !dp_attn;
    g->comm = comm;
    g->comm_inst = comm_inst;
    RX_HLOG (g->host, RX_LOG_INFO, "%s: %s rank %d: decode steps of up to %d rows a rank replay CUDA graphs%s", path,
             mode, (int) rank, (int) g->max_bs,
             dp_attn ? " (every rank padded to the largest batch)" : " (the all-reduces inside)");
}

/* After a replay with collectives inside: one that failed broke the group
 * (a host node cannot report), and the comm's check() says so now rather
 * than at the next step. */
static inline int rx_model_graphs_comm_check (const struct rx_model_graphs *g, struct rx_err *err)
{
    return (g->tp || g->dp) && RX_HAS (struct rx_comm_ops, g->comm, check) ? g->comm->check (g->comm_inst, err)
                                                                           : RX_OK;
}

/* This rank's half of the DP-attention decision (models/dp_ffn.h
 * rx_dp_counts_graph ANDs it over the group): DP graphs on, and a
 * decode-shape batch of at most max_bs rows or an idle one.  The model
 * adds its own per-step conditions. */
static inline int rx_model_graphs_dp_step (const struct rx_model_graphs *g, const struct rx_model_batch *b)
{
    return g->dp && g->max_bs > 0 && b && (b->n_tokens == 0 || rx_model_graphs_shape (g, b));
}

/* The model's side of a padded DP-attention replay. */
struct rx_model_padded {
    struct rx_model_pad *pad;
    struct rx_model_stage *stage;
    int32_t max_tokens;               /* reserve's T (the stage's) */
    int32_t pad_slot;                 /* = n_slots: the pool has one row more */
    int32_t n_vocab;
    float *logits;                    /* device [min(max_bs, T)][n_vocab] */
    /* Host work before a capture or replay of the padded batch (attn-mla's
     * prepare), or NULL. */
    int (*before) (void *model, const struct rx_model_batch *pb, const struct rx_model_batch_dev *dv,
                   struct rx_err *err);
    /* 1: run the padded step op by op this time (a first step with host
     * work a capture cannot hold: attn-mla's per-head weights).  The
     * other ranks may replay meanwhile: the collectives are the same. */
    int eager;
    const char *who;
};

/* A DP-attention decode step that every rank replays as graph M (the
 * group's largest batch; rx_dp_counts_graph said every rank may): b padded
 * to M rows as it is staged (rx_model_stage_upload_padded,
 * rx_model_pad_batch), replayed (captured the first time), the real rows'
 * logits copied into b->logits, the comm checked. */
static inline int rx_model_graphs_run_padded (struct rx_model_graphs *g, const struct rx_kctx *k, void *model,
                                              rx_model_step_fn step, const struct rx_model_padded *p,
                                              const struct rx_model_batch *b, int32_t M, struct rx_err *err)
{
    struct rx_model_batch pb;
    struct rx_model_batch_dev dv;
    int rc = rx_model_stage_upload_padded (p->stage, g->host, k, p->max_tokens, b, M, p->pad_slot, p->who, &dv,
                                           err);
    if (rc == RX_OK)
        rc = rx_model_pad_batch (p->pad, g->host, p->stage, p->max_tokens, b, M, p->logits, &pb, p->who, err);
    if (rc == RX_OK && p->before) rc = p->before (model, &pb, &dv, err);
    if (rc == RX_OK) rc = p->eager ? step (model, &pb, &dv, err) : rx_model_graphs_run (g, k, model, step, &pb, &dv, err);
    if (rc == RX_OK && b->n_out > 0)
        rc = k->ops->copy_d2d (k->be, k->stream, b->logits, p->logits,
                               (size_t) b->n_out * (size_t) p->n_vocab * sizeof (float), err);
    if (rc == RX_OK) rc = rx_model_graphs_comm_check (g, err);
    return rc;
}

#endif /* RX_MODELS_GRAPH_H */
