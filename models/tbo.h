/* models/tbo.h -- two-batch overlap (TBO): where a step's batch is cut into
 * two micro-batches and the schedule that interleaves them, written once
 * for the model plugins.  Header-only: plugins link no shared code.
 *
 * A batch is a list of sequences whose rows are contiguous (q_start, see
 * radix/model.h).  Micro-batch 0 is sequences [0, s), micro-batch 1
 * sequences [s, n_seq): a sequence is never cut, so each micro-batch is a
 * valid batch for the attention backend on its own (its KV and positions are
 * whole) and the token rows of the two are [0, q_start[s]) and
 * [q_start[s], n_tokens).
 *
 * rx_tbo_split (q_start, n_seq) -> s:
 *   - decode (every sequence one row): half the requests, s = n_seq / 2
 *     (an odd count puts the extra one in micro-batch 1);
 *   - prefill / extend / mixed: the s in 1 .. n_seq-1 whose cumulative
 *     token count q_start[s] is nearest half the tokens (|2 q_start[s] -
 *     n_tokens| smallest; a tie goes to the smaller s), so the two halves
 *     carry as equal a load as whole sequences allow;
 *   - 0 or 1 sequence (an idle batch, one request): 0, no split.  The model
 *     then runs the batch as one (alone), or -- under DP attention, where
 *     every rank must make the same collective calls -- as micro-batch 1
 *     empty (one request: (all, empty); idle: two empties).
 * For decode the two rules agree (equal rows per sequence); the decode rule
 * is kept explicit because it is SGLang's (half the request count).
 *
 * rx_tbo_sub (b, s0, s1, q_start, kv_start, sub): the host batch of
 * sequences [s0, s1) of b, its q_start / kv_start rebased to 0 into the
 * caller's arrays of s1 - s0 + 1 entries; its tokens, pos and kv_slots
 * point into b's.  No output rows (the model computes the logits once, on
 * the whole batch, after the layers).
 *
 * The schedule (rx_tbo_plan, rx_tbo_layers; see rx_tbo_layers for the
 * order) is the same for every MoE model: it needs the MoE dispatcher
 * (radix/moe.h), the row buffers and two model callbacks in struct
 * rx_tbo_model -- front: the attention half of layer l over a micro-batch's
 * rows up to the router (and whatever else runs beside the routed experts,
 * e.g. shared experts); experts: the local experts over the rows a dispatch
 * handed this rank.  rx_tbo_reserve keeps the per-model TBO buffers and
 * micro-batch 1's dispatcher instance (struct rx_tbo).
 *
 * Thread-safety: rx_tbo_split / rx_tbo_sub are pure functions; the rest
 * runs on the model's forward thread, as the model's own code does. */
#ifndef RX_MODELS_TBO_H
#define RX_MODELS_TBO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/err.h>
#include <radix/host.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#include "batch.h"

static inline int32_t rx_tbo_split (const int32_t *q_start, int32_t n_seq)
{
    if (!q_start || n_seq < 2) return 0;
    const int64_t n = q_start[n_seq];
    if (n == n_seq) return n_seq / 2;   /* decode: one row per sequence */
    int32_t best = 1;
    int64_t best_d = -1;
    for (int32_t s = 1; s < n_seq; s++) {
        int64_t d = 2 * (int64_t) q_start[s] - n;
        if (d < 0) d = -d;
        if (best_d < 0 || d < best_d) {
            best_d = d;
            best = s;
        }
    }
    return best;
}

static inline void rx_tbo_sub (const struct rx_model_batch *b, int32_t s0, int32_t s1,
                               int32_t *q_start, int32_t *kv_start, struct rx_model_batch *sub)
{
    const int32_t t0 = b->q_start[s0], k0 = b->kv_start[s0];
    for (int32_t s = s0; s <= s1; s++) {
        q_start[s - s0] = b->q_start[s] - t0;
        kv_start[s - s0] = b->kv_start[s] - k0;
    }
    *sub = (struct rx_model_batch) {
        .struct_size = sizeof *sub, .n_tokens = b->q_start[s1] - t0,
        .tokens = b->tokens ? b->tokens + t0 : NULL, .pos = b->pos ? b->pos + t0 : NULL,
        .n_seq = s1 - s0, .q_start = q_start, .kv_start = kv_start,
        .kv_slots = b->kv_slots ? b->kv_slots + k0 : NULL, .n_out = 0, .out_rows = NULL,
        .logits = NULL,
    };
}


/* ------------------------------------------------------------- state -- */

/* What a model keeps for TBO (zeroed with the model; rx_tbo_reserve fills
 * it, rx_tbo_free empties it): micro-batch 1's rebased q_start / kv_start
 * and its dispatcher instance -- one exchange in flight per instance, so
 * the two micro-batches' exchanges need two.  moe2 is made only when the
 * dispatcher has the asynchronous ops; without them the micro-batches run
 * one after the other through the model's one instance (still correct). */
struct rx_tbo {
    int32_t *idx;           /* device [2 (T+1)]: q_start[T+1] kv_start[T+1] */
    int32_t *idx_h;         /* host [2 (T+1)]: their staging */
    void *moe2;             /* micro-batch 1's dispatcher instance, or NULL */
    int32_t moe2_n_phys;    /* the n_expert moe2 was made for */
};

/* Whether the dispatcher has the asynchronous ops (radix/moe.h ABI 1.1). */
static inline int rx_tbo_has_async (const struct rx_moe_ops *o)
{
    return o && RX_HAS (struct rx_moe_ops, o, combine_wait) && o->dispatch_start && o->dispatch_wait
           && o->combine_start && o->combine_wait;
}

/* Allocates t's index arrays for T tokens (once) and (re)makes moe2 from mc
 * -- the same config as the model's own instance -- when the dispatcher is
 * asynchronous and moe2 is missing or was made for another slot count
 * (mc->n_expert: the placement changed).  who names the model in errors.
 * On an error t stays consistent for rx_tbo_free. */
static inline int rx_tbo_reserve (struct rx_tbo *t, const struct rx_kctx *k, const struct rx_host *host,
                                  int32_t T, const struct rx_moe_ops *moe_ops, const struct rx_host *moe_host,
                                  const struct rx_moe_config *mc, const char *who, struct rx_err *err)
{
    const size_t bytes = 2 * ((size_t) T + 1) * sizeof (int32_t);
    if (!t->idx) {
        void *d;
        int rc = k->ops->alloc (k->be, bytes, 64, &d, err);
        if (rc != RX_OK) return rc;
        t->idx = d;
        if (!(t->idx_h = host->alloc (host, bytes, 64)))
            return rx_err_set (err, RX_ENOMEM, "%s: out of memory (two-batch overlap indices)", who);
    }
    if (!rx_tbo_has_async (moe_ops) || (t->moe2 && t->moe2_n_phys == mc->n_expert)) return RX_OK;
    if (t->moe2) moe_ops->destroy (t->moe2);
    t->moe2 = NULL;
    int rc = moe_ops->create (moe_host, mc, &t->moe2, err);
    if (rc != RX_OK) {
        t->moe2 = NULL;
        return rc;
    }
    t->moe2_n_phys = mc->n_expert;
    return RX_OK;
}

/* Releases what rx_tbo_reserve made (the caller has synchronized the
 * stream); t is zeroed. */
static inline void rx_tbo_free (struct rx_tbo *t, const struct rx_kctx *k, const struct rx_host *host,
                                const struct rx_moe_ops *moe_ops)
{
    if (t->moe2) moe_ops->destroy (t->moe2);
    if (t->idx) k->ops->free_ (k->be, t->idx);
    if (t->idx_h) host->free_ (host, t->idx_h);
    memset (t, 0, sizeof *t);
}

/* ---------------------------------------------------------- schedule -- */

/* One micro-batch: its rows [r0, r0 + n) of the step, its attention batch
 * (ab; d_pos, d_new: its rows' positions and new KV slots, device), its
 * dispatcher instance, and where its exchange stands (so that an error can
 * drain what is in flight). */
struct rx_tbo_mb {
    size_t r0, n;
    struct rx_attn_batch ab;
    const int32_t *d_pos, *d_new;
    void *moe;
    size_t c0, cn;          /* the chunk whose exchange is started */
    int pend;               /* 0 none, 1 dispatch started, 2 combine started */
};

/* The model as the schedule sees it.  Row r of the step lives at h + r E
 * (the FFN input the dispatch sends), x + r E (the residual the combine
 * adds into), ids + r k / wts + r k (the router's top-k, device).  front
 * and experts get `model` back; l is the layer. */
struct rx_tbo_model {
    void *model;
    /* Stage A's model part for micro-batch b (b->n > 0) of layer l: the
     * attention half over its rows, the router's ids / wts for them, and
     * whatever runs beside the routed experts (shared experts). */
    int (*front) (void *model, int32_t l, const struct rx_tbo_mb *b, struct rx_err *err);
    /* The local experts of layer l over the rows a dispatch handed this
     * rank (the combine sends their outputs back). */
    int (*experts) (void *model, int32_t l, const struct rx_moe_routed *rt, struct rx_err *err);
    const struct rx_moe_ops *moe_ops;
    const struct rx_attn_ops *attn_ops;
    void *attn;
    const struct rx_host *host;             /* its progress() is called once a layer */
    float *h, *x;
    const int32_t *ids;
    const float *wts;
    size_t E, k;                            /* row width, experts per token */
    size_t chunk;                           /* the dispatcher's max_tokens: rows per dispatch */
    int dp_attn;                            /* DP attention: every rank the same calls */
};

/* Cuts batch b (n_tokens > 0: uploaded, its device arrays dv) into mb[0],
 * mb[1] (rx_tbo_split; one sequence, under DP attention: (all, empty)),
 * micro-batch 1's rebased indices uploaded through t.  An idle batch
 * (n_tokens == 0, dv NULL): two empty micro-batches.  moe1: micro-batch 1's
 * dispatcher instance (t->moe2 with the asynchronous ops, else moe0). */
static inline int rx_tbo_plan (struct rx_tbo_mb mb[2], void *moe0, void *moe1, const struct rx_model_batch *b,
                               const struct rx_model_batch_dev *dv, const struct rx_tbo *t,
                               const struct rx_kctx *k, int32_t T, struct rx_err *err)
{
    memset (mb, 0, 2 * sizeof *mb);
    mb[0].moe = moe0;
    mb[1].moe = moe1;
    const int32_t n = b->n_tokens;
    if (n == 0) return RX_OK;
    int32_t s = rx_tbo_split (b->q_start, b->n_seq);
    if (s == 0) s = b->n_seq;   /* one sequence (DP attention): (all, empty) */
    const int32_t t1 = b->q_start[s];
    struct rx_model_batch sub;
    rx_tbo_sub (b, s, b->n_seq, t->idx_h, t->idx_h + T + 1, &sub);
    int rc = k->ops->copy_h2d (k->be, k->stream, t->idx, t->idx_h, 2 * ((size_t) T + 1) * sizeof (int32_t), err);
    if (rc != RX_OK) return rc;
    mb[0].n = (size_t) t1;
    mb[0].ab = (struct rx_attn_batch) {
        .n_seq = s, .n_tokens = t1, .q_start = dv->q_start, .kv_start = dv->kv_start,
        .slots = dv->kv_slots, .q_pos = dv->pos,
    };
    mb[0].d_pos = dv->pos;
    mb[0].d_new = dv->new_slots;
    mb[1].r0 = (size_t) t1;
    mb[1].n = (size_t) (n - t1);
    mb[1].ab = (struct rx_attn_batch) {
        .n_seq = sub.n_seq, .n_tokens = sub.n_tokens, .q_start = t->idx,
        .kv_start = t->idx + T + 1, .slots = dv->kv_slots + b->kv_start[s], .q_pos = dv->pos + t1,
    };
    mb[1].d_pos = dv->pos + t1;
    mb[1].d_new = dv->new_slots + t1;
    return RX_OK;
}

/* dispatch_start of the micro-batch's last chunk (without the async ops
 * nothing: the blocking dispatch runs at the wait, sequential, still
 * correct). */
static inline int rx_tbo_dispatch_start (const struct rx_tbo_model *v, struct rx_tbo_mb *b, struct rx_err *err)
{
    const size_t r = b->r0 + b->c0;
    if (rx_tbo_has_async (v->moe_ops)) {
        int rc = v->moe_ops->dispatch_start (b->moe, v->h + r * v->E, v->E, (int32_t) b->cn, v->ids + r * v->k,
                                             v->wts + r * v->k, err);
        if (rc != RX_OK) return rc;
    }
    b->pend = 1;
    return RX_OK;
}

/* Stage B of micro-batch b in layer l: dispatch_wait, the local experts,
 * combine_start (without the async ops: the blocking dispatch and combine). */
static inline int rx_tbo_stage_b (const struct rx_tbo_model *v, int32_t l, struct rx_tbo_mb *b,
                                 struct rx_err *err)
{
    const size_t r = b->r0 + b->c0;
    const int async = rx_tbo_has_async (v->moe_ops);
    struct rx_moe_routed rt = { .struct_size = sizeof rt };
    int rc;
    b->pend = 0;
    if (async) rc = v->moe_ops->dispatch_wait (b->moe, &rt, err);
    else rc = v->moe_ops->dispatch (b->moe, v->h + r * v->E, v->E, (int32_t) b->cn, v->ids + r * v->k,
                                    v->wts + r * v->k, &rt, err);
    if (rc != RX_OK) return rc;
    if ((rc = v->experts (v->model, l, &rt, err)) != RX_OK) return rc;
    if (async) rc = v->moe_ops->combine_start (b->moe, v->x + r * v->E, v->E, RX_MM_ACCUMULATE, err);
    else rc = v->moe_ops->combine (b->moe, v->x + r * v->E, v->E, RX_MM_ACCUMULATE, err);
    if (rc != RX_OK) return rc;
    b->pend = async ? 2 : 0;
    return RX_OK;
}

static inline int rx_tbo_combine_wait (const struct rx_tbo_model *v, struct rx_tbo_mb *b, struct rx_err *err)
{
    if (b->pend != 2) return RX_OK;
    b->pend = 0;
    return v->moe_ops->combine_wait (b->moe, err);
}

/* Stage A of micro-batch b in layer l: finish its previous layer's combine,
 * the model's front (attention + router ..) over its rows, every chunk but
 * the last dispatched and combined at once, the last one's dispatch
 * started.  nc: the chunks per micro-batch, the same on every rank under DP
 * attention (an empty micro-batch still makes its nc calls). */
static inline int rx_tbo_stage_a (const struct rx_tbo_model *v, int32_t l, struct rx_tbo_mb *b, size_t nc,
                                 struct rx_err *err)
{
    const size_t E = v->E, K = v->k, C = v->chunk;
    int rc = rx_tbo_combine_wait (v, b, err);
    if (rc != RX_OK) return rc;
    if (b->n > 0) {
        /* A backend that plans per batch (prepare) plans this micro-batch
         * again: the two alternate in every layer. */
        if (RX_HAS (struct rx_attn_ops, v->attn_ops, prepare)
            && (rc = v->attn_ops->prepare (v->attn, &b->ab, err)) != RX_OK)
            return rc;
        if ((rc = v->front (v->model, l, b, err)) != RX_OK) return rc;
    }
    for (size_t c = 0; c < nc; c++) {
        const size_t c0 = c * C, cn = c0 >= b->n ? 0 : b->n - c0 < C ? b->n - c0 : C;
        if (c + 1 == nc) {
            b->c0 = c0;
            b->cn = cn;
            return rx_tbo_dispatch_start (v, b, err);
        }
        const size_t r = b->r0 + c0;
        struct rx_moe_routed rt = { .struct_size = sizeof rt };
        if ((rc = v->moe_ops->dispatch (b->moe, v->h + r * E, E, (int32_t) cn, v->ids + r * K, v->wts + r * K,
                                        &rt, err)) != RX_OK
            || (rc = v->experts (v->model, l, &rt, err)) != RX_OK
            || (rc = v->moe_ops->combine (b->moe, v->x + r * E, E, RX_MM_ACCUMULATE, err)) != RX_OK)
            return rc;
    }
    return RX_OK;
}

/* MoE layers [l0, l1) of a step as the two micro-batches mb (rx_tbo_plan).
 * Per layer, SGLang's "operations with yield points" as a fixed schedule:
 *     A(0): attention(0), router(0), dispatch_start(0)
 *     A(1): attention(1), router(1), dispatch_start(1)   <- 0's rows in flight
 *     B(0): dispatch_wait(0), experts(0), combine_start(0) <- 1's rows in flight
 *     B(1): dispatch_wait(1), experts(1), combine_start(1) <- 0's combine in flight
 * and the next layer's A(b) begins with combine_wait(b), so micro-batch 1's
 * combine overlaps micro-batch 0's next attention.  Every rank issues the
 * dispatcher's collectives in this one order.  The results equal the
 * one-batch forward: rows never mix across sequences outside the MoE, and
 * each token's expert sum has a fixed order (radix/moe.h).  M: the group's
 * largest batch under DP attention (rx_dp_counts), else unused.  On an
 * error what is still in flight is drained, so the dispatcher instances
 * stay reusable. */
static inline int rx_tbo_layers (const struct rx_tbo_model *v, struct rx_tbo_mb mb[2], int32_t l0, int32_t l1,
                                 int32_t M, struct rx_err *err)
{
    /* Chunks per micro-batch: alone from its own rows; under DP attention
     * from the group's largest batch M (>= either micro-batch of any rank),
     * so every rank makes the same number of dispatch calls. */
    const size_t C = v->chunk;
    size_t nc[2];
    for (int i = 0; i < 2; i++) {
        size_t rows = v->dp_attn ? (size_t) M : mb[i].n;
        nc[i] = rows == 0 ? 1 : (rows + C - 1) / C;
    }
    int rc = RX_OK;
    for (int32_t l = l0; l < l1 && rc == RX_OK; l++) {
        for (int i = 0; i < 2 && rc == RX_OK; i++) rc = rx_tbo_stage_a (v, l, &mb[i], nc[i], err);
        for (int i = 0; i < 2 && rc == RX_OK; i++) rc = rx_tbo_stage_b (v, l, &mb[i], err);
        if (RX_HAS (struct rx_host, v->host, progress)) v->host->progress (v->host);
    }
    for (int i = 0; i < 2 && rc == RX_OK; i++) rc = rx_tbo_combine_wait (v, &mb[i], err);
    if (rc != RX_OK) {
        /* Drain what is still in flight so the instances are reusable (the
         * group is broken anyway if a collective failed). */
        for (int i = 0; i < 2; i++) {
            struct rx_err e2 = { 0 };
            struct rx_moe_routed rt = { .struct_size = sizeof rt };
            if (mb[i].pend == 1 && rx_tbo_has_async (v->moe_ops)) v->moe_ops->dispatch_wait (mb[i].moe, &rt, &e2);
            if (mb[i].pend == 2) v->moe_ops->combine_wait (mb[i].moe, &e2);
        }
    }
    return rc;
}

#endif
