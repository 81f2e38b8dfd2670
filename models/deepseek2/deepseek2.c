/* models/deepseek2/deepseek2.c -- model-deepseek2.so: DeepSeek-V2/V3 style
 * transformers (arch "deepseek2"): multi-head latent attention (MLA) and
 * DeepSeek mixture of experts, as llama.cpp's deepseek2 graph computes them.
 *
 * One layer (pre-norm residual):
 *     h  = rms_norm(x) * attn_norm
 *     q  = Wq_b (rms_norm(Wq_a h) * q_a_norm)     (or Wq h without q_lora_rank)
 *          per head [q_nope (hd_k - rope) | q_pe (rope)]
 *     kv = Wkv_a_mqa h = [c_kv (kv_lora_rank) | k_pe (rope)];
 *          c_kv = rms_norm(c_kv) * kv_a_norm
 *     RoPE (GGML "normal", YaRN when set) on q_pe and k_pe only
 *     x += Wo attention(q, [c_kv | k_pe], kv_b)     (attention plugin, KV_LATENT:
 *          the plugin stores the latent row and owns the MLA math)
 *     h  = rms_norm(x) * ffn_norm
 *     blocks < leading_dense_block_count: x += down(silu(gate h) * up h)
 *     else (MoE):
 *          s = sigmoid or softmax(Wgate_inp h)     (expert_gating_func 2 / 1)
 *          choose top-k of s + exp_probs_b (the bias only for the choice;
 *            group-limited when expert_group_count > 1: keep the
 *            expert_group_used_count groups with the best sum of their top
 *            two, then top-k inside them)
 *          w = s of the chosen (unbiased), / their sum if expert_weights_norm,
 *              * expert_weights_scale
 *          x += sum_j w_j expert_j(h) + shared_expert(h)
 * then logits = (rms_norm(x) * output_norm) Wout^T for the rows asked for.
 *
 * YaRN (rope.scaling.type yarn, factor f > 1): the rope op gets freq_scale
 * 1/f, ext_factor 1 and attn_factor 1 / (1 + 0.1 ln f) (which cancels the
 * op's own magnitude scaling); the score scale is mscale^2 / sqrt(hd_k) with
 * mscale = 1 + yarn_log_multiplier ln f (llama.cpp's pre-scaling).
 *
 * Routing.  The router matmul, the gating function, the bias and the top-k
 * are kernel ops on the device.  Gathering the unbiased scores of the
 * chosen experts and normalizing them has no kernel op in kernel.h 1.0, so
 * the scores and ids are copied to the host (n_tokens x n_expert floats,
 * one synchronization per MoE layer), the weights computed there and copied
 * back.  Group-limited selection is done on the host too.  The experts run
 * through the MoE dispatcher (radix/moe.h) the core hands in env->moe
 * (required for a model with MoE blocks): dispatch (in chunks of
 * [moe] max_tokens_per_rank rows), one batched matmul per local expert,
 * combine (+= into the residual).  The shared experts are added before
 * the routed sum (so that two-batch overlap, which runs them while the
 * dispatch is in flight, adds in the same order).
 *
 * Tensor parallelism (env->n_rank = N > 1 without DP attention): every
 * rank runs the same batch.  Rank r runs query heads [r*H/N, (r+1)*H/N)
 * (uneven splits are fine; more ranks than heads is refused): its rows of
 * attn_q / attn_q_b and of attn_kv_b (the absorbed W_UK / W_UV of its
 * heads) are pointers into the mapping, its columns of attn_output a packed
 * copy (on the quant type's blocks).  The latent path -- attn_q_a and its
 * norm, attn_kv_a_mqa, kv_a_norm, k_pe -- is computed and stored WHOLE on
 * every rank: the attention plugin gets H/N heads but the KV pool still
 * holds the full latent row per token on each rank, so N ranks hold the
 * tokens of one (the duplication DP attention avoids; docs/parallel.md).
 * The attention output and the dense FFN (columns [f0, f1), as under DP
 * attention) are row-parallel: partial products into hout, all_reduce
 * (SUM), one add to the residual.  The MoE blocks are replicated: every
 * rank routes and runs every expert (and the shared expert) on its
 * identical rows through the dispatcher with ep_size 1 -- no collective,
 * and the result is bitwise the same on every rank since the all-reduced
 * residual is.  Embeddings, norms, the router and the LM head are
 * replicated as in model-llama.
 *
 * DP attention (env->dp_attn, N = env->n_rank ranks), as model-llama does
 * it: each rank runs its own batches, holds its own latent KV and runs MLA
 * with all heads, the embeddings, norms, router, shared expert and LM head
 * on its own rows only.  The dense leading blocks' FFN is split over the
 * ranks (columns [f0, f1) on ffn_down's quant blocks: gate/up rows are a
 * pointer into the mapping, down's column slice a packed host copy): once
 * per step the ranks all-gather their row counts, and in every dense block
 * each all-gathers its normed rows padded to the largest count M, runs its
 * FFN slice over the N*M rows and reduce-scatters (SUM) the partials back.
 * The MoE blocks are not gathered: each rank routes its own rows and the
 * dispatcher (ep_rank = rank, ep_size = env->ep_size: 1, every rank all
 * experts via local; N, experts sharded and rows exchanged over the DP
 * group's comm) brings each rank the routed sum of its rows.  Every rank
 * calls dispatch / combine ceil(M / chunk) times per MoE block (empty
 * chunks dispatch 0 tokens), and a rank without work runs an idle forward
 * (n_tokens 0) that takes part in every collective; when every rank is
 * idle (M = 0) the layers are skipped on all of them alike.
 *
 * Two-batch overlap ([scheduler] two_batch_overlap, env->two_batch_overlap;
 * see s_forward_tbo): a step of at least 2 sequences (under DP attention:
 * every step while a rank of the group has rows) runs its MoE blocks as two
 * micro-batches cut at a sequence boundary (models/tbo.h), model-llama's
 * schedule: MLA + router + shared experts of one while the other's
 * dispatch / combine is in flight through the dispatcher's asynchronous
 * ops (a second dispatcher instance for micro-batch 1).  The leading dense
 * blocks run unsplit before.  Outputs equal the one-batch forward.
 *
 * Every computation is a kernel-backend op (radix/kernel.h); scratch is
 * sized once by reserve(). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#include "moe_route.h"

#include "../batch.h"
#include "../dp_ffn.h"
#include "../graph.h"
#include "../moe_experts.h"
#include "../moe_place.h"
#include "../tbo.h"

#define DS_MAX_LAYERS 1024
#define DS_MAX_DIM    (1 << 20)
#define DS_MAX_EXPERT 4096
#define DS_NAME       "model-deepseek2"
#define DS_GRAPH_TAG  0x6473656b32ull   /* "dsek2": graph keys (models/graph.h) */

enum { DS_GATE_SOFTMAX = 1, DS_GATE_SIGMOID = 2 };

struct ds_layer {
    const float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm;  /* device F32 */
    rx_kweight_t *wq, *wq_a, *wq_b, *wkv_a, *wkv_b, *wo;
    /* dense */
    rx_kweight_t *w_gate, *w_up, *w_down;
    /* MoE */
    rx_kweight_t *w_gate_inp, *w_gate_exps, *w_up_exps, *w_down_exps;
    rx_kweight_t *w_gate_sh, *w_up_sh, *w_down_sh;
    const float *probs_b;                        /* device F32 [n_expert] or NULL */
};

struct ds_model {
    const struct rx_host *host;
    struct rx_kctx k;
    const struct rx_attn_ops *attn_ops;
    void *attn;
    const struct rx_moe_ops *moe_ops;            /* env->moe (required for MoE blocks) */
    const struct rx_host *moe_host;
    void *moe;                                   /* created by reserve() */
    int32_t moe_max_tokens;                      /* env->moe_max_tokens (0: max_tokens) */
    int32_t moe_chunk;                           /* rows per dispatch */
    struct rx_moe_place place;                   /* EPLB placement + recording (models/moe_place.h) */
    int32_t moe_n_phys;                          /* the dispatcher's n_expert (slots) */
    int moe_dev_seen;                            /* the last dispatch that was asked for device
                                                  * offsets gave them (models/moe_experts.h) */
    struct rx_model_graphs graphs;               /* decode-step graphs (models/graph.h) */
    int warm;                                    /* an eager step ran: attn-mla built its
                                                  * per-head weights (host work, not capturable) */
    /* DP attention's decode graphs (graphs.dp, models/graph.h
     * rx_model_graphs_run_padded): the padded batch and the padded rows'
     * logits (device [min(max_bs, T)][n_vocab], reserve); the pad KV slot
     * is n_slots (the pool has one row more). */
    struct rx_model_pad pad;
    float *dp_logits;
    /* DP attention (see the header comment) */
    int32_t rank, n_rank, dp_attn, ep_size;
    int32_t tp;                                  /* tensor parallel: n_rank > 1, not dp_attn */
    int32_t h0, h1;                              /* this rank's heads (all but under TP) */
    int32_t f0, f1;                              /* this rank's dense FFN columns */
    const struct rx_comm_ops *comm;
    void *comm_inst;
    int32_t *dp_cnt_h;                           /* host [N] row counts (create) */
    int32_t *dp_cnt;                             /* device [N] (reserve) */
    float *dp_g, *dp_d;                          /* device [N*T][n_embd] gathered rows, partials */
    void **copies;                               /* packed column slices, freed at destroy */
    size_t n_copies, cap_copies;
    const char *path;
    char arch[32];

    /* hyper-parameters */
    int32_t n_vocab, n_ctx_train, n_layer, n_embd, n_ff;
    int32_t n_head, hd_k, hd_v, n_rot, q_lora, kv_lora;
    int32_t n_dense, n_expert, n_used, n_shared, n_ff_exp;
    int32_t n_group, n_group_used, gating;
    int     w_norm;
    float   w_scale;
    float eps, attn_scale;
    struct rx_rope_params rope;

    /* weights */
    rx_kweight_t *tok_embd, *output;
    const float *output_norm;
    struct ds_layer *layers;
    rx_kweight_t **owned;
    size_t n_owned, cap_owned;
    uint64_t weight_bytes, n_params;

    /* reserve() */
    uint64_t n_slots;
    int32_t max_tokens;
    float *x, *h, *qa, *q, *kv, *att, *gate, *up, *hout, *probs, *sel, *wts;
    void *f32_mem;
    struct rx_model_stage stage;                 /* the batch's index arrays (models/batch.h) */
    int32_t *d_topk;                             /* device [T][n_used] */
    float *h_probs;                              /* host [T][n_expert] */
    int32_t *h_topk;                             /* host [T][n_used] */
    float *h_wts;                                /* host [T][n_used] */
    /* Two-batch overlap ([scheduler] two_batch_overlap, see s_forward_tbo):
     * micro-batch 1's dispatcher instance (one exchange in flight per
     * instance) and its rebased attention index arrays. */
    int32_t tbo;
    struct rx_tbo tbo_state;                     /* models/tbo.h */
};

/* ------------------------------------------------------------ helpers -- */

static void *s_zalloc (const struct rx_host *h, size_t n)
{
    void *p = h->alloc (h, n, 0);
    if (p) memset (p, 0, n);
    return p;
}

static int s_key_u32 (struct ds_model *m, const struct rx_model_src *src, const char *name,
                      int required, uint32_t dflt, uint32_t *out, struct rx_err *err)
{
    char key[128];
    snprintf (key, sizeof key, "%s.%s", m->arch, name);
    int rc = src->get_u32 (src, key, out);
    if (rc == RX_ENOENT && !required) {
        *out = dflt;
        return RX_OK;
    }
    if (rc == RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": missing key %s", src->path, key);
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": key %s is not an unsigned integer (%s)",
                           src->path, key, rx_status_name (rc));
    return RX_OK;
}

static int s_key_f32 (struct ds_model *m, const struct rx_model_src *src, const char *name,
                      int required, float dflt, float *out, struct rx_err *err)
{
    char key[128];
    snprintf (key, sizeof key, "%s.%s", m->arch, name);
    int rc = src->get_f32 (src, key, out);
    if (rc == RX_ENOENT && !required) {
        *out = dflt;
        return RX_OK;
    }
    if (rc == RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": missing key %s", src->path, key);
    if (rc != RX_OK || !isfinite (*out))
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": key %s is not a finite float",
                           src->path, key);
    return RX_OK;
}

static int s_key_bool (struct ds_model *m, const struct rx_model_src *src, const char *name,
                       int dflt, int *out, struct rx_err *err)
{
    char key[128];
    snprintf (key, sizeof key, "%s.%s", m->arch, name);
    int rc = src->get_bool (src, key, out);
    if (rc == RX_ENOENT) {
        *out = dflt;
        return RX_OK;
    }
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": key %s is not a boolean", src->path, key);
    return RX_OK;
}

static int s_push_owned (struct ds_model *m, rx_kweight_t *w, struct rx_err *err)
{
    if (m->n_owned == m->cap_owned) {
        size_t nc = m->cap_owned ? m->cap_owned * 2 : 64;
        rx_kweight_t **na = s_zalloc (m->host, nc * sizeof *na);
        if (!na) return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory");
        if (m->owned) {
            memcpy (na, m->owned, m->n_owned * sizeof *na);
            m->host->free_ (m->host, m->owned);
        }
        m->owned = na;
        m->cap_owned = nc;
    }
    m->owned[m->n_owned++] = w;
    return RX_OK;
}

static int s_weight_part (struct ds_model *m, const struct rx_model_src *src, const char *name,
                          int64_t ne0, int64_t ne1, int64_t ne2, int optional, int cols,
                          int64_t a0, int64_t a1, rx_kweight_t **w, struct rx_err *err);

/* Load tensor `name`, its shape checked to be [ne0, ne1, ne2] (trailing 0:
 * that dimension is 1).  *w = NULL and RX_OK when optional and absent. */
static int s_weight (struct ds_model *m, const struct rx_model_src *src, const char *name,
                     int64_t ne0, int64_t ne1, int64_t ne2, int optional, rx_kweight_t **w,
                     struct rx_err *err)
{
    return s_weight_part (m, src, name, ne0, ne1, ne2, optional, 0, 0, 0, w, err);
}

/* s_weight, or (a1 > a0) this rank's part of a 2-D [ne0, ne1] matrix:
 * cols 0: rows [a0, a1) (a pointer into the mapping); cols 1: columns
 * [a0, a1) of every row, packed into a host copy kept until destroy (the
 * bounds on the quant type's blocks). */
static int s_weight_part (struct ds_model *m, const struct rx_model_src *src, const char *name,
                          int64_t ne0, int64_t ne1, int64_t ne2, int optional, int cols,
                          int64_t a0, int64_t a1, rx_kweight_t **w, struct rx_err *err)
{
    *w = NULL;
    struct rx_weight_view v;
    memset (&v, 0, sizeof v);
    int rc = src->tensor (src, name, &v);
    if (rc == RX_ENOENT && optional) return RX_OK;
    if (rc == RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": missing tensor %s", src->path, name);
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": cannot read tensor %s (%s)",
                           src->path, name, rx_status_name (rc));
    uint64_t e1 = ne1 ? (uint64_t) ne1 : 1, e2 = ne2 ? (uint64_t) ne2 : 1;
    if (v.ne[0] != (uint64_t) ne0 || v.ne[1] != e1 || v.ne[2] != e2 || v.ne[3] != 1)
        return rx_err_set (err, RX_EFORMAT,
                           "%s: " DS_NAME ": tensor %s has shape [%llu,%llu,%llu,%llu], expected [%lld,%llu,%llu]",
                           src->path, name, (unsigned long long) v.ne[0], (unsigned long long) v.ne[1],
                           (unsigned long long) v.ne[2], (unsigned long long) v.ne[3], (long long) ne0,
                           (unsigned long long) e1, (unsigned long long) e2);
    if (rx_dtype_row_bytes (v.dtype, (size_t) v.ne[0]) == 0)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": tensor %s: %llu columns are not whole %s blocks",
                           src->path, name, (unsigned long long) v.ne[0], rx_dtype_name (v.dtype));
    if (a1 > a0 && !cols) {
        const size_t rb = rx_dtype_row_bytes (v.dtype, (size_t) v.ne[0]);
        v.data = (const unsigned char *) v.data + (size_t) a0 * rb;
        v.ne[1] = (uint64_t) (a1 - a0);
        v.nbytes = (size_t) (a1 - a0) * rb;
    } else if (a1 > a0 && !(a0 == 0 && a1 == ne0)) {
        const size_t blk = rx_dtype_block (v.dtype);
        if ((size_t) a0 % blk || (size_t) a1 % blk)
            return rx_err_set (err, RX_ENOTSUP,
                               "%s: " DS_NAME ": %s: tensor %s (%s, blocks of %zu) cannot be split at columns %lld..%lld of %lld (rank %d of %d)",
                               src->path, m->tp ? "tensor parallelism" : "DP attention", name,
                               rx_dtype_name (v.dtype), blk, (long long) a0, (long long) a1, (long long) ne0,
                               m->rank, m->n_rank);
        const size_t rb = rx_dtype_row_bytes (v.dtype, (size_t) ne0);
        const size_t off = (size_t) a0 / blk * rx_dtype_bytes (v.dtype);
        const size_t sb = (size_t) (a1 - a0) / blk * rx_dtype_bytes (v.dtype);
        unsigned char *copy = m->host->alloc (m->host, sb * (size_t) e1, 64);
        if (!copy)
            return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory (slice of %s, %zu bytes)",
                               name, sb * (size_t) e1);
        if (m->n_copies == m->cap_copies) {
            size_t nc = m->cap_copies ? m->cap_copies * 2 : 16;
            void **na = s_zalloc (m->host, nc * sizeof *na);
            if (!na) {
                m->host->free_ (m->host, copy);
                return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory");
            }
            if (m->copies) {
                memcpy (na, m->copies, m->n_copies * sizeof *na);
                m->host->free_ (m->host, m->copies);
            }
            m->copies = na;
            m->cap_copies = nc;
        }
        m->copies[m->n_copies++] = copy;
        const unsigned char *from = v.data;
        for (uint64_t r = 0; r < e1; r++)
            memcpy (copy + (size_t) r * sb, from + (size_t) r * rb + off, sb);
        v.data = copy;
        v.ne[0] = (uint64_t) (a1 - a0);
        v.nbytes = sb * (size_t) e1;
    }
    rc = m->k.ops->weight_load (m->k.be, &v, w, err);
    if (rc != RX_OK) {
        char why[RX_ERR_MSG_MAX];
        snprintf (why, sizeof why, "%s", err ? err->msg : "");
        *w = NULL;
        return rx_err_set (err, rc, "%s: " DS_NAME ": tensor %s (%s): %s", src->path, name,
                           rx_dtype_name (v.dtype), why);
    }
    if ((rc = s_push_owned (m, *w, err)) != RX_OK) {
        m->k.ops->weight_free (m->k.be, *w);
        *w = NULL;
        return rc;
    }
    m->weight_bytes += v.nbytes;
    m->n_params += v.ne[0] * v.ne[1] * v.ne[2] * v.ne[3];
    return RX_OK;
}

/* A 1-D F32 vector (norm weight, bias) as a device pointer.  *out = NULL
 * when optional and absent. */
static int s_vector (struct ds_model *m, const struct rx_model_src *src, const char *name,
                     int64_t n, int optional, const float **out, struct rx_err *err)
{
    *out = NULL;
    struct rx_weight_view v;
    int rc = src->tensor (src, name, &v);
    if (rc == RX_ENOENT && optional) return RX_OK;
    if (rc == RX_OK && v.dtype != RX_F32)
        return rx_err_set (err, RX_ENOTSUP, "%s: " DS_NAME ": tensor %s is %s, only f32 is supported for norms and biases",
                           src->path, name, rx_dtype_name (v.dtype));
    rx_kweight_t *w;
    if ((rc = s_weight (m, src, name, n, 0, 0, 0, &w, err)) != RX_OK) return rc;
    const void *p;
    if ((rc = m->k.ops->weight_data (m->k.be, w, &p, err)) != RX_OK) return rc;
    *out = p;
    return RX_OK;
}

/* ------------------------------------------------------------ life cycle -- */

static void s_free_scratch (struct ds_model *m)
{
    if (m->f32_mem || m->stage.dev || m->d_topk)
        m->k.ops->synchronize (m->k.be, m->k.stream, NULL);
    if (m->moe) m->moe_ops->destroy (m->moe);
    m->moe = NULL;
    rx_tbo_free (&m->tbo_state, &m->k, m->host, m->moe_ops);
    if (m->f32_mem) m->k.ops->free_ (m->k.be, m->f32_mem);
    rx_model_stage_free (&m->stage, m->host, &m->k);
    if (m->d_topk) m->k.ops->free_ (m->k.be, m->d_topk);
    if (m->h_probs) m->host->free_ (m->host, m->h_probs);
    if (m->h_topk) m->host->free_ (m->host, m->h_topk);
    if (m->h_wts) m->host->free_ (m->host, m->h_wts);
    m->f32_mem = NULL;
    m->d_topk = m->h_topk = NULL;
    m->h_probs = m->h_wts = NULL;
    m->x = m->h = m->qa = m->q = m->kv = m->att = m->gate = m->up = m->hout = NULL;
    m->probs = m->sel = m->wts = m->dp_g = m->dp_d = NULL;
    m->dp_cnt = NULL;
    if (m->dp_logits) m->k.ops->free_ (m->k.be, m->dp_logits);
    m->dp_logits = NULL;
    m->max_tokens = 0;
}

static void s_destroy (void *p)
{
    struct ds_model *m = p;
    if (!m) return;
    s_free_scratch (m);
    rx_moe_place_fini (&m->place);
    rx_model_graphs_free (&m->graphs, m->host);
    rx_model_pad_free (&m->pad, m->host);
    if (m->attn) m->attn_ops->destroy (m->attn);
    for (size_t i = 0; i < m->n_owned; i++)
        m->k.ops->weight_free (m->k.be, m->owned[i]);
    if (m->owned) m->host->free_ (m->host, m->owned);
    for (size_t i = 0; i < m->n_copies; i++)
        m->host->free_ (m->host, m->copies[i]);
    if (m->copies) m->host->free_ (m->host, m->copies);
    if (m->layers) m->host->free_ (m->host, m->layers);
    if (m->dp_cnt_h) m->host->free_ (m->host, m->dp_cnt_h);
    m->host->free_ (m->host, m);
}

static int s_hparams (struct ds_model *m, const struct rx_model_src *src, struct rx_err *err)
{
    uint32_t u;
    int rc;
#define DS_U32(name, req, dflt, dst) \
    do { if ((rc = s_key_u32 (m, src, name, req, dflt, &u, err))) return rc; \
         if (u > DS_MAX_DIM) return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": %s.%s = %u is too large", \
                                                src->path, m->arch, name, u); \
         dst = (int32_t) u; } while (0)
    DS_U32 ("embedding_length", 1, 0, m->n_embd);
    DS_U32 ("block_count", 1, 0, m->n_layer);
    DS_U32 ("feed_forward_length", 1, 0, m->n_ff);
    DS_U32 ("attention.head_count", 1, 0, m->n_head);
    DS_U32 ("attention.q_lora_rank", 0, 0, m->q_lora);
    DS_U32 ("attention.kv_lora_rank", 1, 0, m->kv_lora);
    DS_U32 ("attention.key_length", 1, 0, m->hd_k);
    DS_U32 ("attention.value_length", 1, 0, m->hd_v);
    DS_U32 ("rope.dimension_count", 1, 0, m->n_rot);
    DS_U32 ("leading_dense_block_count", 0, 0, m->n_dense);
    DS_U32 ("expert_count", 0, 0, m->n_expert);
    DS_U32 ("expert_used_count", 0, 0, m->n_used);
    DS_U32 ("expert_shared_count", 0, 0, m->n_shared);
    DS_U32 ("expert_feed_forward_length", 0, 0, m->n_ff_exp);
    DS_U32 ("expert_group_count", 0, 0, m->n_group);
    DS_U32 ("expert_group_used_count", 0, 0, m->n_group_used);
    DS_U32 ("expert_gating_func", 0, DS_GATE_SOFTMAX, m->gating);
#undef DS_U32
    if ((rc = s_key_u32 (m, src, "context_length", 0, 4096, &u, err))) return rc;
    m->n_ctx_train = u > INT32_MAX ? INT32_MAX : (int32_t) u;
    if ((rc = s_key_f32 (m, src, "expert_weights_scale", 0, 1.0f, &m->w_scale, err))) return rc;
    if ((rc = s_key_bool (m, src, "expert_weights_norm", 0, &m->w_norm, err))) return rc;
    if ((rc = s_key_f32 (m, src, "attention.layer_norm_rms_epsilon", 1, 0, &m->eps, err))) return rc;
    uint32_t n_kv_head;
    if ((rc = s_key_u32 (m, src, "attention.head_count_kv", 0, (uint32_t) m->n_head, &n_kv_head, err))) return rc;

    if (m->n_embd <= 0 || m->n_layer <= 0 || m->n_layer > DS_MAX_LAYERS || m->n_ff <= 0
        || m->n_head <= 0 || m->n_head > 4096 || (int64_t) n_kv_head != m->n_head)
        return rx_err_set (err, RX_EFORMAT,
                           "%s: " DS_NAME ": bad hyper-parameters: n_embd %d, %d layers, n_ff %d, %d heads, %u kv heads (must equal heads)",
                           src->path, m->n_embd, m->n_layer, m->n_ff, m->n_head, n_kv_head);
    if (m->kv_lora <= 0 || m->hd_v <= 0 || m->n_rot <= 0 || m->n_rot % 2 || m->hd_k <= m->n_rot)
        return rx_err_set (err, RX_EFORMAT,
                           "%s: " DS_NAME ": bad MLA shapes: kv_lora_rank %d, key_length %d, value_length %d, rope dims %d (even, < key_length)",
                           src->path, m->kv_lora, m->hd_k, m->hd_v, m->n_rot);
    if (m->n_dense > m->n_layer)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": leading_dense_block_count %d > %d blocks",
                           src->path, m->n_dense, m->n_layer);
    if (m->n_dense < m->n_layer) {   /* there are MoE blocks */
        if (m->n_expert <= 0 || m->n_expert > DS_MAX_EXPERT || m->n_used <= 0 || m->n_used > m->n_expert
            || m->n_ff_exp <= 0)
            return rx_err_set (err, RX_EFORMAT,
                               "%s: " DS_NAME ": bad MoE hyper-parameters: expert_count %d, expert_used_count %d, expert_feed_forward_length %d",
                               src->path, m->n_expert, m->n_used, m->n_ff_exp);
        if (m->gating != DS_GATE_SOFTMAX && m->gating != DS_GATE_SIGMOID)
            return rx_err_set (err, RX_ENOTSUP, "%s: " DS_NAME ": %s.expert_gating_func %d is not supported (1 softmax, 2 sigmoid)",
                               src->path, m->arch, m->gating);
        if (m->n_group > 1
            && (m->n_expert % m->n_group || m->n_group_used <= 0 || m->n_group_used > m->n_group
                || (int64_t) m->n_group_used * (m->n_expert / m->n_group) < m->n_used))
            return rx_err_set (err, RX_EFORMAT,
                               "%s: " DS_NAME ": expert groups: %d experts in %d groups, %d groups used, %d experts used",
                               src->path, m->n_expert, m->n_group, m->n_group_used, m->n_used);
    }
    if (!(m->eps > 0))
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": %s.attention.layer_norm_rms_epsilon must be > 0",
                           src->path, m->arch);

    /* RoPE on the rope part only, GGML "normal" style (llama.cpp's deepseek2). */
    struct rx_rope_params *r = &m->rope;
    memset (r, 0, sizeof *r);
    r->struct_size = sizeof *r;
    r->mode = RX_ROPE_NORMAL;
    r->n_rot = m->n_rot;
    if ((rc = s_key_f32 (m, src, "rope.freq_base", 0, 10000.0f, &r->freq_base, err))) return rc;
    if (!(r->freq_base > 0))
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": rope.freq_base must be > 0", src->path);
    r->freq_scale = 1.0f;
    r->ext_factor = 0.0f;
    r->attn_factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    char key[128];
    const char *stype = NULL;
    size_t stlen = 0;
    snprintf (key, sizeof key, "%s.rope.scaling.type", m->arch);
    rc = src->get_str (src, key, &stype, &stlen);
    if (rc != RX_OK && rc != RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": %s is not a string", src->path, key);
    int is_yarn = rc == RX_OK && stlen == 4 && memcmp (stype, "yarn", 4) == 0;
    if (rc == RX_OK && !is_yarn && !(stlen == 4 && memcmp (stype, "none", 4) == 0))
        return rx_err_set (err, RX_ENOTSUP, "%s: " DS_NAME ": rope scaling type \"%.*s\" is not supported (none, yarn)",
                           src->path, (int) (stlen > 32 ? 32 : stlen), stype);
    float factor = 0, log_mul = 0;
    if ((rc = s_key_f32 (m, src, "rope.scaling.factor", 0, 0.0f, &factor, err))) return rc;
    if ((rc = s_key_f32 (m, src, "rope.scaling.yarn_log_multiplier", 0, 0.0f, &log_mul, err))) return rc;
    if (factor < 0)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": rope scaling factor %g < 0", src->path,
                           (double) factor);
    if ((rc = s_key_u32 (m, src, "rope.scaling.original_context_length", 0,
                         (uint32_t) m->n_ctx_train, &u, err))) return rc;
    r->n_ctx_orig = (int32_t) (u > INT32_MAX ? INT32_MAX : u);
    float mscale = 1.0f;
    if (is_yarn && factor > 1.0f) {
        /* llama.cpp's deepseek2: pre-scale kq_scale by mscale^2 and the rope
         * attn_factor by 1/(1 + 0.1 ln f) (the rope op multiplies it back). */
        r->freq_scale = 1.0f / factor;
        r->ext_factor = 1.0f;
        mscale = 1.0f + log_mul * logf (factor);
        r->attn_factor = 1.0f / (1.0f + 0.1f * logf (factor));
    }
    m->attn_scale = mscale * mscale / sqrtf ((float) m->hd_k);
    return RX_OK;
}

static int s_weights (struct ds_model *m, const struct rx_model_src *src, struct rx_err *err)
{
    int rc;
    struct rx_weight_view tv;
    memset (&tv, 0, sizeof tv);
    if (src->tensor (src, "token_embd.weight", &tv) != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": missing tensor token_embd.weight", src->path);
    if (tv.ne[1] == 0 || tv.ne[1] > INT32_MAX)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": token_embd.weight has %llu rows",
                           src->path, (unsigned long long) tv.ne[1]);
    m->n_vocab = (int32_t) tv.ne[1];
    uint32_t nv;
    if ((rc = s_key_u32 (m, src, "vocab_size", 0, (uint32_t) m->n_vocab, &nv, err))) return rc;
    if ((int64_t) nv != m->n_vocab)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": %s.vocab_size %u but token_embd.weight has %d rows",
                           src->path, m->arch, nv, m->n_vocab);
    const int64_t E = m->n_embd, H = m->n_head, hk = m->hd_k, hv = m->hd_v, L = m->kv_lora,
                  R = m->n_rot, NX = m->n_expert, FE = m->n_ff_exp,
                  FS = (int64_t) m->n_ff_exp * m->n_shared;
    if ((rc = s_weight (m, src, "token_embd.weight", E, m->n_vocab, 0, 0, &m->tok_embd, err))) return rc;
    if ((rc = s_vector (m, src, "output_norm.weight", E, 0, &m->output_norm, err))) return rc;
    if ((rc = s_weight (m, src, "output.weight", E, m->n_vocab, 0, 1, &m->output, err))) return rc;
    if (!m->output) m->output = m->tok_embd;

    m->layers = s_zalloc (m->host, (size_t) m->n_layer * sizeof *m->layers);
    if (!m->layers) return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory");
    for (int32_t l = 0; l < m->n_layer; l++) {
        struct ds_layer *Y = &m->layers[l];
        char n[96];
#define DS_N(suffix) (snprintf (n, sizeof n, "blk.%d." suffix, (int) l), n)
        if ((rc = s_vector (m, src, DS_N ("attn_norm.weight"), E, 0, &Y->attn_norm, err))) return rc;
        /* Tensor parallelism: this rank's heads [h0, h1) of q, kv_b and
         * attn_output (h0 0, h1 H otherwise: a0 = a1 = 0 loads whole). */
        const int64_t h0 = m->tp ? m->h0 : 0, h1 = m->tp ? m->h1 : 0, per = hk - R + hv;
        if (m->q_lora > 0) {
            if ((rc = s_weight (m, src, DS_N ("attn_q_a.weight"), E, m->q_lora, 0, 0, &Y->wq_a, err))) return rc;
            if ((rc = s_vector (m, src, DS_N ("attn_q_a_norm.weight"), m->q_lora, 0, &Y->q_a_norm, err))) return rc;
            if ((rc = s_weight_part (m, src, DS_N ("attn_q_b.weight"), m->q_lora, H * hk, 0, 0, 0, h0 * hk,
                                     h1 * hk, &Y->wq_b, err))) return rc;
        } else {
            if ((rc = s_weight_part (m, src, DS_N ("attn_q.weight"), E, H * hk, 0, 0, 0, h0 * hk, h1 * hk,
                                     &Y->wq, err))) return rc;
        }
        if ((rc = s_weight (m, src, DS_N ("attn_kv_a_mqa.weight"), E, L + R, 0, 0, &Y->wkv_a, err))) return rc;
        if ((rc = s_vector (m, src, DS_N ("attn_kv_a_norm.weight"), L, 0, &Y->kv_a_norm, err))) return rc;
        if ((rc = s_weight_part (m, src, DS_N ("attn_kv_b.weight"), L, H * per, 0, 0, 0, h0 * per, h1 * per,
                                 &Y->wkv_b, err))) return rc;
        if ((rc = s_weight_part (m, src, DS_N ("attn_output.weight"), H * hv, E, 0, 0, 1, h0 * hv, h1 * hv,
                                 &Y->wo, err))) return rc;
        if ((rc = s_vector (m, src, DS_N ("ffn_norm.weight"), E, 0, &Y->ffn_norm, err))) return rc;
        if (l < m->n_dense) {
            /* DP attention / TP: this rank's columns [f0, f1) (all of them on one rank). */
            const int64_t F = m->n_ff, a0 = m->f0, a1 = m->f1;
            if ((rc = s_weight_part (m, src, DS_N ("ffn_gate.weight"), E, F, 0, 0, 0, a0, a1, &Y->w_gate, err))) return rc;
            if ((rc = s_weight_part (m, src, DS_N ("ffn_up.weight"), E, F, 0, 0, 0, a0, a1, &Y->w_up, err))) return rc;
            if ((rc = s_weight_part (m, src, DS_N ("ffn_down.weight"), F, E, 0, 0, 1, a0, a1, &Y->w_down, err))) return rc;
        } else {
            if ((rc = s_weight (m, src, DS_N ("ffn_gate_inp.weight"), E, NX, 0, 0, &Y->w_gate_inp, err))) return rc;
            if ((rc = s_vector (m, src, DS_N ("exp_probs_b.bias"), NX, 1, &Y->probs_b, err))) return rc;
            if ((rc = s_weight (m, src, DS_N ("ffn_gate_exps.weight"), E, FE, NX, 0, &Y->w_gate_exps, err))) return rc;
            if ((rc = s_weight (m, src, DS_N ("ffn_up_exps.weight"), E, FE, NX, 0, &Y->w_up_exps, err))) return rc;
            if ((rc = s_weight (m, src, DS_N ("ffn_down_exps.weight"), FE, E, NX, 0, &Y->w_down_exps, err))) return rc;
            if (m->n_shared > 0) {
                if ((rc = s_weight (m, src, DS_N ("ffn_gate_shexp.weight"), E, FS, 0, 0, &Y->w_gate_sh, err))) return rc;
                if ((rc = s_weight (m, src, DS_N ("ffn_up_shexp.weight"), E, FS, 0, 0, &Y->w_up_sh, err))) return rc;
                if ((rc = s_weight (m, src, DS_N ("ffn_down_shexp.weight"), FS, E, 0, 0, &Y->w_down_sh, err))) return rc;
            }
        }
#undef DS_N
    }
    return RX_OK;
}

/* DP attention or TP: this rank's dense FFN columns [f0, f1), split on
 * ffn_down's quant blocks (the largest of the dense blocks) so that its
 * column slice can be packed; under TP also its heads [h0, h1).  One rank:
 * all of them. */
static int s_split (struct ds_model *m, const struct rx_model_src *src, struct rx_err *err)
{
    const int32_t N = m->n_rank, r = m->rank;
    m->f0 = 0;
    m->f1 = m->n_ff;
    m->h0 = 0;
    m->h1 = m->n_head;
    if (m->tp) {
        if (m->n_head < N)
            return rx_err_set (err, RX_ENOTSUP,
                               "%s: " DS_NAME ": tensor parallelism: %d ranks but only %d heads (attention.head_count): use at most %d ranks or DP attention",
                               src->path, N, m->n_head, m->n_head);
        m->h0 = (int32_t) ((int64_t) r * m->n_head / N);
        m->h1 = (int32_t) ((int64_t) (r + 1) * m->n_head / N);
    }
    if (N == 1 || m->n_dense == 0) return RX_OK;
    size_t blk = 1;
    for (int32_t l = 0; l < m->n_dense; l++) {
        char n[96];
        struct rx_weight_view v;
        snprintf (n, sizeof n, "blk.%d.ffn_down.weight", (int) l);
        if (src->tensor (src, n, &v) == RX_OK && rx_dtype_block (v.dtype) > blk)
            blk = rx_dtype_block (v.dtype);
    }
    const int64_t nb = m->n_ff / (int64_t) blk;
    if (nb < N)
        return rx_err_set (err, RX_ENOTSUP,
                           "%s: " DS_NAME ": %s: n_ff %d in blocks of %zu (ffn_down) cannot be split over %d ranks",
                           src->path, m->tp ? "tensor parallelism" : "DP attention", m->n_ff, blk, N);
    m->f0 = (int32_t) ((int64_t) r * nb / N * (int64_t) blk);
    m->f1 = r + 1 == N ? m->n_ff : (int32_t) ((int64_t) (r + 1) * nb / N * (int64_t) blk);
    return RX_OK;
}

static int s_create (const struct rx_host *host, const struct rx_model_src *src,
                     const struct rx_model_env *env, void **out, struct rx_err *err)
{
    *out = NULL;
    if (!host || !src || !env || !env->k.ops || !env->attn)
        return rx_err_set (err, RX_EINVAL, DS_NAME ": create: NULL host, source, kernels or attention");
    if (src->struct_size < offsetof (struct rx_model_src, tensor) + sizeof src->tensor
        || env->struct_size < offsetof (struct rx_model_env, n_rank) + sizeof env->n_rank)
        return rx_err_set (err, RX_EABI, DS_NAME ": create: source or environment struct too short");
    if (env->n_rank < 1 || env->rank < 0 || env->rank >= env->n_rank)
        return rx_err_set (err, RX_EINVAL, DS_NAME ": create: rank %d of %d", env->rank, env->n_rank);
    const int dp = env->n_rank > 1
                   && env->struct_size >= offsetof (struct rx_model_env, dp_attn) + sizeof env->dp_attn
                   && env->dp_attn;
    if (env->n_rank > 1 && !dp
        && (env->struct_size < offsetof (struct rx_model_env, comm_inst) + sizeof env->comm_inst
            || !env->comm || !env->comm_inst || !env->comm->all_reduce))
        return rx_err_set (err, RX_EINVAL,
                           DS_NAME ": create: tensor-parallel rank %d of %d without a comm instance with all_reduce",
                           env->rank, env->n_rank);
    if (dp
        && (env->struct_size < offsetof (struct rx_model_env, comm_inst) + sizeof env->comm_inst
            || !env->comm || !env->comm_inst || !env->comm->all_gather || !env->comm->reduce_scatter))
        return rx_err_set (err, RX_EINVAL,
                           DS_NAME ": create: DP attention rank %d of %d without a comm instance with all_gather and reduce_scatter",
                           env->rank, env->n_rank);
    int32_t ep = env->struct_size >= offsetof (struct rx_model_env, ep_size) + sizeof env->ep_size
                 && env->ep_size > 1 ? env->ep_size : 1;
    if (ep > 1 && (!dp || ep != env->n_rank))
        return rx_err_set (err, RX_EINVAL,
                           "%s: " DS_NAME ": create: ep_size %d needs DP attention with ep_size = the %d ranks",
                           src->path, ep, env->n_rank);
    const char *arch;
    size_t alen;
    if (src->get_str (src, "general.architecture", &arch, &alen) != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: " DS_NAME ": missing general.architecture", src->path);
    if (!(alen == 9 && memcmp (arch, "deepseek2", 9) == 0))
        return rx_err_set (err, RX_ENOTSUP, "%s: " DS_NAME ": architecture \"%.*s\" is not handled (deepseek2)",
                           src->path, (int) (alen > 32 ? 32 : alen), arch);

    struct ds_model *m = s_zalloc (host, sizeof *m);
    if (!m) return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory");
    m->host = host;
    m->k = env->k;
    m->attn_ops = env->attn;
    m->path = src->path;
    memcpy (m->arch, arch, alen);
    m->rank = env->rank;
    m->n_rank = env->n_rank;
    m->dp_attn = dp;
    m->tp = env->n_rank > 1 && !dp;
    m->ep_size = ep;
    if (m->tp) {
        m->comm = env->comm;
        m->comm_inst = env->comm_inst;
    }
    if (dp) {
        m->comm = env->comm;
        m->comm_inst = env->comm_inst;
        m->dp_cnt_h = s_zalloc (host, (size_t) env->n_rank * sizeof *m->dp_cnt_h);
        if (!m->dp_cnt_h) {
            s_destroy (m);
            return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory");
        }
    }
    if (env->struct_size >= offsetof (struct rx_model_env, moe_max_tokens) + sizeof env->moe_max_tokens
        && env->moe) {
        m->moe_ops = env->moe;
        m->moe_host = env->moe_host ? env->moe_host : host;
        m->moe_max_tokens = env->moe_max_tokens;
    }
    m->tbo = env->struct_size >= offsetof (struct rx_model_env, two_batch_overlap) + sizeof env->two_batch_overlap
             && env->two_batch_overlap;
    int rc = rx_model_graphs_init (&m->graphs, host, env, DS_GRAPH_TAG, DS_NAME, err);
    if (rc == RX_OK) rc = s_hparams (m, src, err);
    if (rc == RX_OK && m->n_dense < m->n_layer && !m->moe_ops)
        rc = rx_err_set (err, RX_ENOTSUP,
                         "%s: " DS_NAME ": a mixture-of-experts model needs a MoE dispatcher ([moe] dispatcher, e.g. local: moe-local.so) and the engine has none",
                         src->path);
    if (rc == RX_OK && m->ep_size > 1 && m->n_dense < m->n_layer && m->ep_size > m->n_expert)
        rc = rx_err_set (err, RX_ENOTSUP,
                         "%s: " DS_NAME ": ep_size %d is more than the %d experts (each rank must own at least one)",
                         src->path, m->ep_size, m->n_expert);
    if (rc == RX_OK) rc = s_split (m, src, err);
    if (rc == RX_OK) rc = s_weights (m, src, err);
    if (rc == RX_OK && m->n_dense < m->n_layer)
        rc = rx_moe_place_init (&m->place, DS_NAME, env, m->n_layer - m->n_dense, m->n_expert, err);
    if (rc == RX_OK) {
        struct rx_attn_config c = {
            .struct_size = sizeof c, .kv_kind = RX_ATTN_KV_LATENT, .n_layer = m->n_layer,
            .n_head = m->h1 - m->h0, .n_kv_head = m->h1 - m->h0, .hd_k = m->hd_k, .hd_v = m->hd_v,
            .kv_dtype = env->kv_dtype, .scale = m->attn_scale, .softcap = 0, .window = 0,
            .kv_lora_rank = m->kv_lora, .rope_dim = m->n_rot,
        };
        rc = env->attn->create (env->attn_host ? env->attn_host : host, &m->k, &c, &m->attn, err);
        if (rc == RX_ENOTSUP) {
            char why[RX_ERR_MSG_MAX];
            snprintf (why, sizeof why, "%s", err ? err->msg : "");
            rc = rx_err_set (err, rc, "%s: " DS_NAME ": the attention backend cannot run MLA (latent KV): %s",
                             src->path, why);
        }
    }
    if (rc != RX_OK) {
        s_destroy (m);
        return rc;
    }
    RX_HLOG (host, RX_LOG_DEBUG,
             "%s: %s, %d layers (%d dense), n_embd %d, %d heads, q_lora %d, kv_lora %d, head dims %d/%d rope %d, experts %d (%d used, %d shared, ff %d, gating %s, groups %d/%d), vocab %d",
             src->path, m->arch, m->n_layer, m->n_dense, m->n_embd, m->n_head, m->q_lora, m->kv_lora,
             m->hd_k, m->hd_v, m->n_rot, m->n_expert, m->n_used, m->n_shared, m->n_ff_exp,
             m->gating == DS_GATE_SIGMOID ? "sigmoid" : "softmax", m->n_group, m->n_group_used,
             m->n_vocab);
    if (m->dp_attn)
        RX_HLOG (host, RX_LOG_DEBUG, "%s: DP-attention rank %d of %d: dense FFN columns %d..%d, ep_size %d",
                 src->path, m->rank, m->n_rank, m->f0, m->f1 - 1, m->ep_size);
    if (m->tp)
        RX_HLOG (host, RX_LOG_DEBUG,
                 "%s: tensor-parallel rank %d of %d: heads %d..%d, dense FFN columns %d..%d, MLA latent and MoE replicated",
                 src->path, m->rank, m->n_rank, m->h0, m->h1 - 1, m->f0, m->f1 - 1);
    /* Graphs with several ranks (models/graph.h rx_model_graphs_ranks):
     * under DP attention not with two-batch overlap; the MoE blocks replay
     * once the dispatcher gives device offsets (s_dp_graph_step: moe-local,
     * moe-ep_low_latency / ep_auto with the backend's low-latency ops); attn-mla's
     * host-side prepare runs before each capture or replay. */
    rx_model_graphs_ranks (&m->graphs, src->path, m->rank, m->n_rank, m->dp_attn,
                           m->dp_attn && m->n_dense < m->n_layer && m->tbo ? "two-batch overlap" : NULL, m->comm,
                           m->comm_inst);
    if (m->tbo && m->n_dense < m->n_layer)
        RX_HLOG (host, RX_LOG_INFO, "%s: two-batch overlap on (%s; the %d leading dense block(s) run unsplit)",
                 src->path,
                 rx_tbo_has_async (m->moe_ops) ? "the dispatcher's exchanges overlap the other micro-batch"
                                               : "the dispatcher has no asynchronous ops: micro-batches run one after the other",
                 m->n_dense);
    *out = m;
    return RX_OK;
}

static int s_info (void *p, struct rx_model_info *info)
{
    struct ds_model *m = p;
    struct rx_model_info i = {
        .struct_size = info->struct_size, .arch = m->arch, .n_vocab = m->n_vocab,
        .n_ctx_train = m->n_ctx_train, .n_layer = m->n_layer, .n_embd = m->n_embd,
        .n_head = m->h1 - m->h0, .n_kv_head = m->h1 - m->h0,
        .kv_bytes_per_token = m->attn_ops->kv_bytes_per_token (m->attn),
        .weight_bytes = m->weight_bytes, .n_params = m->n_params,
        .n_moe_layer = m->n_layer - m->n_dense, .n_expert = m->n_dense < m->n_layer ? m->n_expert : 0,
    };
    size_t n = info->struct_size < sizeof i ? info->struct_size : sizeof i;
    memcpy (info, &i, n);
    return RX_OK;
}

/* Two-batch overlap: the rebased index arrays and micro-batch 1's
 * dispatcher instance (the same config as m->moe's, re-created when the
 * placement changes the slot count); nothing when TBO is off or the model
 * has no MoE block, no second instance without the asynchronous ops. */
static int s_tbo_reserve (struct ds_model *m, struct rx_err *err)
{
    if (!m->tbo || m->n_dense >= m->n_layer || !m->moe) return RX_OK;
    struct rx_moe_config mc = {
        .struct_size = sizeof mc, .n_expert = m->moe_n_phys, .n_expert_used = m->n_used,
        .n_embd = m->n_embd, .max_tokens = m->moe_chunk, .ep_rank = m->ep_size > 1 ? m->rank : 0,
        .ep_size = m->ep_size, .kops = m->k.ops, .kbe = m->k.be, .stream = m->k.stream,
        .comm = m->ep_size > 1 ? m->comm : NULL, .comm_inst = m->ep_size > 1 ? m->comm_inst : NULL,
    };
    return rx_tbo_reserve (&m->tbo_state, &m->k, m->host, m->max_tokens, m->moe_ops, m->moe_host, &mc, DS_NAME,
                           err);
}

static int s_reserve (void *p, uint64_t n_slots, int32_t max_tokens, struct rx_err *err)
{
    struct ds_model *m = p;
    if (n_slots == 0 || n_slots > INT32_MAX || max_tokens <= 0 || max_tokens > (1 << 24))
        return rx_err_set (err, RX_EINVAL, DS_NAME ": reserve: %llu slots (1 .. %d), %d tokens per step (1 .. %d)",
                           (unsigned long long) n_slots, INT32_MAX, max_tokens, 1 << 24);
    s_free_scratch (m);
    m->n_slots = 0;
    /* DP-attention graphs pad with slot n_slots: one pool row more. */
    int rc = m->attn_ops->kv_alloc (m->attn, n_slots + (m->graphs.dp ? 1 : 0), err);
    if (rc != RX_OK) return rc;
    const size_t T = (size_t) max_tokens, E = (size_t) m->n_embd, H = (size_t) m->n_head;
    const size_t NX = m->n_expert > 0 ? (size_t) m->n_expert : 1, K = m->n_used > 0 ? (size_t) m->n_used : 1;
    /* gate/up: the dense FFN (T rows), the shared experts (T rows) or the
     * routed experts (up to T*K rows through the dispatcher). */
    size_t ffw = (size_t) m->n_ff;
    if ((size_t) m->n_ff_exp * (size_t) m->n_shared > ffw) ffw = (size_t) m->n_ff_exp * (size_t) m->n_shared;
    size_t ffn_elems = T * ffw;
    if (T * K * (size_t) m->n_ff_exp > ffn_elems) ffn_elems = T * K * (size_t) m->n_ff_exp;
    /* DP attention: the dense FFN slice runs over the rows of every rank
     * (N*T) from dp_g into dp_d; dp_cnt holds the ranks' row counts. */
    const size_t DN = m->dp_attn ? (size_t) m->n_rank : 0;
    if (DN * T * (size_t) (m->f1 - m->f0) > ffn_elems) ffn_elems = DN * T * (size_t) (m->f1 - m->f0);
#define DS_R(n) (((n) + 15) & ~(size_t) 15)
    size_t sizes[15] = {
        DS_R (T * E), DS_R (T * E), DS_R (T * (size_t) (m->q_lora > 0 ? m->q_lora : 1)),
        DS_R (T * H * m->hd_k), DS_R (T * (size_t) (m->kv_lora + m->n_rot)), DS_R (T * H * m->hd_v),
        DS_R (ffn_elems), DS_R (ffn_elems), DS_R (T * E), DS_R (T * NX), DS_R (T * NX), DS_R (T * K),
        DS_R (DN * T * E), DS_R (DN * T * E), DS_R (DN),
    };
#undef DS_R
    size_t total = 0;
    for (int i = 0; i < 15; i++) total += sizes[i];
    void *mem;
    rc = m->k.ops->alloc (m->k.be, total * sizeof (float), 64, &mem, err);
    if (rc != RX_OK)
        return rx_err_set (err, rc, DS_NAME ": cannot allocate %.1f MiB of activations for %d tokens per step",
                           (double) total * 4 / (1024.0 * 1024.0), max_tokens);
    m->f32_mem = mem;
    float *f = mem;
    float *cnt = NULL;
    float **bufs[15] = { &m->x, &m->h, &m->qa, &m->q, &m->kv, &m->att, &m->gate, &m->up, &m->hout,
                         &m->probs, &m->sel, &m->wts, &m->dp_g, &m->dp_d, &cnt };
    for (int i = 0; i < 15; i++) {
        *bufs[i] = f;
        f += sizes[i];
    }
    m->dp_cnt = (int32_t *) cnt;
    m->max_tokens = max_tokens;
    /* DP attention: the padding rows of a gathered block are never written
     * by this rank; zero them once so no uninitialized value is read. */
    if (m->dp_attn && (rc = m->k.ops->memset_ (m->k.be, m->k.stream, mem, 0, total * sizeof (float), err)) != RX_OK)
        goto fail;
    void *d;
    if ((rc = m->k.ops->alloc (m->k.be, T * K * sizeof (int32_t), 0, &d, err)) != RX_OK) goto fail;
    m->d_topk = d;
    m->h_probs = m->host->alloc (m->host, T * NX * sizeof (float), 64);
    m->h_topk = m->host->alloc (m->host, T * K * sizeof (int32_t), 64);
    m->h_wts = m->host->alloc (m->host, T * K * sizeof (float), 64);
    if (!m->h_probs || !m->h_topk || !m->h_wts) {
        rc = rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory (router staging)");
        goto fail;
    }
    if ((rc = rx_model_stage_alloc (&m->stage, m->host, &m->k, max_tokens, (size_t) n_slots + T, DS_NAME,
                                    err)) != RX_OK)
        goto fail;
    m->moe_chunk = m->moe_max_tokens > 0 && m->moe_max_tokens < max_tokens ? m->moe_max_tokens : max_tokens;
    if (m->moe_ops && m->n_dense < m->n_layer) {
        struct rx_moe_config mc = {
            .struct_size = sizeof mc, .n_expert = rx_moe_place_n_physical (&m->place, m->n_expert),
            .n_expert_used = m->n_used,
            .n_embd = m->n_embd, .max_tokens = m->moe_chunk, .ep_rank = m->ep_size > 1 ? m->rank : 0,
            .ep_size = m->ep_size, .kops = m->k.ops, .kbe = m->k.be, .stream = m->k.stream,
            .comm = m->ep_size > 1 ? m->comm : NULL, .comm_inst = m->ep_size > 1 ? m->comm_inst : NULL,
        };
        if ((rc = m->moe_ops->create (m->moe_host, &mc, &m->moe, err)) != RX_OK) {
            m->moe = NULL;
            goto fail;
        }
        m->moe_n_phys = mc.n_expert;
        if ((rc = s_tbo_reserve (m, err)) != RX_OK) goto fail;
    }
    if (m->graphs.dp) {
        const size_t rows = (size_t) (m->graphs.max_bs < max_tokens ? m->graphs.max_bs : max_tokens);
        if ((rc = m->k.ops->alloc (m->k.be, rows * (size_t) m->n_vocab * sizeof (float), 64, &d, err)) != RX_OK)
            goto fail;
        m->dp_logits = d;
    }
    m->n_slots = n_slots;
    return RX_OK;
fail:
    s_free_scratch (m);
    return rc;
}

/* ---------------------------------------------------------------- forward -- */

static int s_check_batch (const struct ds_model *m, const struct rx_model_batch *b,
                          struct rx_err *err)
{
    return rx_model_batch_check (DS_NAME, b, m->max_tokens, m->n_vocab, m->n_slots, m->dp_attn, err);
}

#define DS_TRY(expr) do { int rc_ = (expr); if (rc_ != RX_OK) return rc_; } while (0)

/* Host part of routing for the n tokens of rows [r0, r0 + n): h_probs holds
 * the unbiased scores.  choose: pick the experts from the selection scores
 * sel_h (group-limited; sel_h's row 0 is row r0); else h_topk already holds
 * the device top-k.  Then the weights into h_wts. */
static void s_route_host (const struct ds_model *m, size_t r0, size_t n, const float *sel_h, int choose)
{
    const size_t NX = (size_t) m->n_expert, K = (size_t) m->n_used;
    for (size_t t = r0; t < r0 + n; t++) {
        const float *s = m->h_probs + t * NX;
        int32_t *ids = m->h_topk + t * K;
        if (choose) {
            /* Group-limited (core/moe_route.h, as kernels-cpu's moe_route). */
            uint8_t keep[DS_MAX_EXPERT], taken[DS_MAX_EXPERT];
            float gs[DS_MAX_EXPERT];
            rx_moe_route_choose (sel_h + (t - r0) * NX, NX, (size_t) m->n_group, (size_t) m->n_group_used,
                                 K, ids, keep, gs, taken);
        }
        rx_moe_route_weights (s, ids, K, m->w_norm, m->w_scale, m->h_wts + t * K);
    }
}

/* The router of rows [r0, r0 + n) of h (see the header comment): scores,
 * choice and weights into the same rows of probs / d_topk / wts, then the
 * EPLB count and mapping (the copy choice counted from row r0, so that a
 * micro-batch picks the copies the whole batch would).  Split from s_moe
 * so that two-batch overlap routes each micro-batch on its own. */
static int s_moe_route (struct ds_model *m, const struct ds_layer *Y, size_t r0, size_t n,
                        struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = (size_t) m->n_embd, NX = (size_t) m->n_expert, KK = (size_t) m->n_used;
    if (n == 0) return RX_OK;
    float *probs = m->probs + r0 * NX, *hp = m->h_probs + r0 * NX, *wts = m->wts + r0 * KK,
          *hw = m->h_wts + r0 * KK;
    int32_t *dk = m->d_topk + r0 * KK, *hk = m->h_topk + r0 * KK;
    /* router: scores (unbiased) in probs, selection scores in sel */
    DS_TRY (K->matmul (be, st, Y->w_gate_inp, -1, m->h + r0 * E, E, probs, NX, n, 0, err));
    if (m->gating == DS_GATE_SIGMOID)
        DS_TRY (K->sigmoid (be, st, probs, NX, probs, NX, n, NX, err));
    else
        DS_TRY (K->softmax (be, st, probs, NX, n, NX, 1.0f, err));
    const float *sel = probs;
    if (Y->probs_b) {
        DS_TRY (K->add (be, st, probs, NX, Y->probs_b, 0, m->sel + r0 * NX, NX, n, NX, err));
        sel = m->sel + r0 * NX;
    }
    const int groups = m->n_group > 1;
    const int32_t ml = (int32_t) (Y - m->layers) - m->n_dense;
    if (RX_HAS (struct rx_kernels_ops, K, moe_route)) {
        /* The choice and its weights on the device; the host sees the ids
         * only to count them (expert recording) or map them to slots
         * (placement). */
        DS_TRY (K->moe_route (be, st, probs, sel, NX, n, NX, groups ? (size_t) m->n_group : 1,
                              groups ? (size_t) m->n_group_used : 1, KK, m->w_norm, m->w_scale, dk, wts,
                              err));
        if (!rx_moe_place_counting (&m->place) && !m->place.pl) return RX_OK;
        DS_TRY (K->copy_d2h (be, st, hk, dk, n * KK * sizeof (int32_t), err));
        DS_TRY (K->synchronize (be, st, err));
        rx_moe_place_count (&m->place, ml, hk, n, KK);
        if (m->place.pl) {
            rx_moe_place_map (&m->place, ml, hk, n, KK, m->rank + (int32_t) r0);
            DS_TRY (K->copy_h2d (be, st, dk, hk, n * KK * sizeof (int32_t), err));
        }
        return RX_OK;
    }
    DS_TRY (K->copy_d2h (be, st, hp, probs, n * NX * sizeof (float), err));
    float *sel_h = NULL;
    if (groups) {
        /* Group-limited selection on the host: it needs the biased
         * selection scores too. */
        sel_h = m->host->alloc (m->host, n * NX * sizeof (float), 64);
        if (!sel_h) return rx_err_set (err, RX_ENOMEM, DS_NAME ": out of memory (expert groups)");
        int rc = K->copy_d2h (be, st, sel_h, sel, n * NX * sizeof (float), err);
        if (rc == RX_OK) rc = K->synchronize (be, st, err);
        if (rc != RX_OK) {
            m->host->free_ (m->host, sel_h);
            return rc;
        }
        s_route_host (m, r0, n, sel_h, 1);
        m->host->free_ (m->host, sel_h);
        DS_TRY (K->copy_h2d (be, st, dk, hk, n * KK * sizeof (int32_t), err));
    } else {
        DS_TRY (K->topk (be, st, sel, NX, n, NX, KK, NULL, dk, err));
        DS_TRY (K->copy_d2h (be, st, hk, dk, n * KK * sizeof (int32_t), err));
        DS_TRY (K->synchronize (be, st, err));
        s_route_host (m, r0, n, NULL, 0);
    }
    DS_TRY (K->copy_h2d (be, st, wts, hw, n * KK * sizeof (float), err));
    /* EPLB: count the logical choices, map them to physical slots. */
    rx_moe_place_count (&m->place, ml, hk, n, KK);
    if (m->place.pl) {
        rx_moe_place_map (&m->place, ml, hk, n, KK, m->rank + (int32_t) r0);
        DS_TRY (K->copy_h2d (be, st, dk, hk, n * KK * sizeof (int32_t), err));
    }
    return RX_OK;
}

/* The local experts over the rows a dispatch handed out
 * (models/moe_experts.h); gate/up hold T*K rows. */
static int s_moe_experts (struct ds_model *m, const struct ds_layer *Y, const struct rx_moe_routed *r,
                          struct rx_err *err)
{
    const struct rx_moe_expert_w w = {
        .gate = Y->w_gate_exps, .up = Y->w_up_exps, .down = Y->w_down_exps, .g = m->gate, .u = m->up,
        .E = (size_t) m->n_embd, .FE = (size_t) m->n_ff_exp,
        .piece = (size_t) m->max_tokens * (size_t) m->n_used,
    };
    return rx_moe_experts (&m->k, &m->place, (int32_t) (Y - m->layers) - m->n_dense, r, &w, err);
}

/* x += the shared experts of rows [r0, r0 + n) of h (this rank's own rows,
 * not dispatched).  Added BEFORE the routed sum, in the one-batch forward
 * too: two-batch overlap runs it in the first stage, while the dispatch
 * is in flight, and the same order of the two additions keeps the results
 * equal. */
static int s_moe_shared (struct ds_model *m, const struct ds_layer *Y, size_t r0, size_t n,
                         struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = (size_t) m->n_embd, FS = (size_t) m->n_ff_exp * (size_t) m->n_shared;
    if (m->n_shared <= 0 || n == 0) return RX_OK;
    DS_TRY (K->matmul (be, st, Y->w_gate_sh, -1, m->h + r0 * E, E, m->gate, FS, n, 0, err));
    DS_TRY (K->matmul (be, st, Y->w_up_sh, -1, m->h + r0 * E, E, m->up, FS, n, 0, err));
    DS_TRY (K->swiglu (be, st, m->gate, FS, m->up, FS, m->gate, FS, n, FS, err));
    return K->matmul (be, st, Y->w_down_sh, -1, m->gate, FS, m->x + r0 * E, E, n, RX_MM_ACCUMULATE, err);
}

/* x += MoE(h) for the n rows of h (see the header comment).  group_rows:
 * the DP group's largest row count (every rank makes the same number of
 * dispatch / combine calls; n may be 0, an idle rank), else n. */
static int s_moe (struct ds_model *m, const struct ds_layer *Y, size_t n, size_t group_rows,
                  struct rx_err *err)
{
    const size_t E = (size_t) m->n_embd, KK = (size_t) m->n_used;
    DS_TRY (s_moe_route (m, Y, 0, n, err));
    DS_TRY (s_moe_shared (m, Y, 0, n, err));
    /* The routed experts through the dispatcher, in chunks of at most
     * its max_tokens rows ([moe] max_tokens_per_rank). */
    for (size_t c0 = 0; c0 < group_rows; c0 += (size_t) m->moe_chunk) {
        /* nc 0: this rank has no rows left but a peer has (DP attention). */
        const size_t nc = c0 >= n ? 0 : n - c0 < (size_t) m->moe_chunk ? n - c0 : (size_t) m->moe_chunk;
        struct rx_moe_routed r = { .struct_size = sizeof r };
        /* DP attention: every rank's chunk c0 has at most this many rows
         * (moe.h group_max_tok: ep_auto's mode without a vote). */
        if (m->dp_attn)
            r.group_max_tok = (int32_t) (group_rows - c0 < (size_t) m->moe_chunk ? group_rows - c0 : (size_t) m->moe_chunk);
        const int dev = rx_moe_experts_device (&m->place, nc);
        if (dev) r.flags = RX_MOE_ROUTED_DEVICE;
        DS_TRY (m->moe_ops->dispatch (m->moe, m->h + c0 * E, E, (int32_t) nc, m->d_topk + c0 * KK,
                                      m->wts + c0 * KK, &r, err));
        if (dev) m->moe_dev_seen = r.d_offsets != NULL;
        DS_TRY (s_moe_experts (m, Y, &r, err));
        DS_TRY (m->moe_ops->combine (m->moe, m->x + c0 * E, E, RX_MM_ACCUMULATE, err));
    }
    return RX_OK;
}

/* DP attention: all-gather the ranks' row counts (n = -1: this rank's
 * batch was refused, so that every rank fails at once instead of waiting
 * in the first layer's collective).  *M = the largest count. */
/* The DP-attention view of this model for models/dp_ffn.h. */
static struct rx_dp_ffn s_dp_view (const struct ds_model *m)
{
    return (struct rx_dp_ffn) {
        .who = DS_NAME, .k = m->k, .comm = m->comm, .comm_inst = m->comm_inst,
        .rank = m->rank, .n_rank = m->n_rank, .max_tokens = m->max_tokens, .cnt = m->dp_cnt,
        .cnt_h = m->dp_cnt_h, .x = m->x, .g = m->dp_g, .d = m->dp_d, .gate = m->gate, .up = m->up,
        .hout = m->hout, .E = (size_t) m->n_embd, .F = (size_t) (m->f1 - m->f0), .eps = m->eps,
    };
}

static int s_dp_counts (struct ds_model *m, int32_t n, int graph_ok, int32_t *M, int *graph_all,
                        struct rx_err *err)
{
    struct rx_dp_ffn v = s_dp_view (m);
    return rx_dp_counts_graph (&v, n, graph_ok, M, graph_all, err);
}

/* DP attention: x += FFN(rms_norm(x)) of a dense block for this rank's n
 * rows (n may be 0, an idle rank), the FFN columns split over the ranks:
 * each rank's rows padded to M are gathered into dp_g ([N*M][E]), this
 * rank's slice runs over all N*M rows into dp_d, and the reduce-scatter
 * hands each rank the summed output of its own block. */
static int s_dp_ffn (struct ds_model *m, const struct ds_layer *Y, size_t n, size_t M,
                     struct rx_err *err)
{
    struct rx_dp_ffn v = s_dp_view (m);
    return rx_dp_ffn (&v, Y->ffn_norm, Y->w_gate, Y->w_up, Y->w_down, n, M, err);
}

/* x += in W^T for a row-parallel W (attn_output, the dense ffn_down) on
 * rows [r0, r0 + nn) of x.  Under tensor parallelism each rank holds a
 * partial product: into the same rows of hout (free until the output rows
 * are gathered), summed over the ranks, added to the residual once.
 * Otherwise W is whole. */
static int s_row_parallel (struct ds_model *m, const rx_kweight_t *w, const float *in, size_t ld_in,
                           size_t r0, size_t nn, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    const size_t E = (size_t) m->n_embd;
    float *x = m->x + r0 * E, *ho = m->hout + r0 * E;
    if (!m->tp)
        return K->matmul (m->k.be, m->k.stream, w, -1, in, ld_in, x, E, nn, RX_MM_ACCUMULATE, err);
    DS_TRY (K->matmul (m->k.be, m->k.stream, w, -1, in, ld_in, ho, E, nn, 0, err));
    DS_TRY (m->comm->all_reduce (m->comm_inst, m->k.stream, ho, ho, nn * E, RX_F32, RX_COMM_SUM, err));
    return K->add (m->k.be, m->k.stream, x, E, ho, E, x, E, nn, E, err);
}

/* The attention half of layer l for rows [r0, r0 + nn) of the batch (ab
 * describes exactly those rows' sequences; d_pos and d_new point at their
 * rows): x += Wo MLA(rms_norm(x)); then for an MoE block h = rms_norm(x) *
 * ffn_norm (the FFN's input; the dense FFN norms its own input). */
static int s_attn (struct ds_model *m, const struct ds_layer *Y, int32_t l, const struct rx_attn_batch *ab,
                   const int32_t *d_pos, const int32_t *d_new, size_t r0, size_t nn, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = (size_t) m->n_embd;
    const size_t H = (size_t) (m->h1 - m->h0), hk = (size_t) m->hd_k, L = (size_t) m->kv_lora,
                 R = (size_t) m->n_rot, qd = H * hk, kvd = L + R, od = H * (size_t) m->hd_v,
                 QL = (size_t) m->q_lora;
    float *x = m->x + r0 * E, *h = m->h + r0 * E, *qa = m->qa + r0 * (QL > 0 ? QL : 1),
          *q = m->q + r0 * qd, *kv = m->kv + r0 * kvd, *att = m->att + r0 * od;
    DS_TRY (K->rms_norm (be, st, x, E, Y->attn_norm, h, E, nn, E, m->eps, err));
    if (Y->wq_a) {
        DS_TRY (K->matmul (be, st, Y->wq_a, -1, h, E, qa, QL, nn, 0, err));
        DS_TRY (K->rms_norm (be, st, qa, QL, Y->q_a_norm, qa, QL, nn, QL, m->eps, err));
        DS_TRY (K->matmul (be, st, Y->wq_b, -1, qa, QL, q, qd, nn, 0, err));
    } else {
        DS_TRY (K->matmul (be, st, Y->wq, -1, h, E, q, qd, nn, 0, err));
    }
    DS_TRY (K->matmul (be, st, Y->wkv_a, -1, h, E, kv, kvd, nn, 0, err));
    DS_TRY (K->rms_norm (be, st, kv, kvd, Y->kv_a_norm, kv, kvd, nn, L, m->eps, err));
    DS_TRY (K->rope (be, st, q + (hk - R), qd, nn, H, hk, d_pos, &m->rope, err));
    DS_TRY (K->rope (be, st, kv + L, kvd, nn, 1, R, d_pos, &m->rope, err));
    const struct rx_attn_io io = {
        .struct_size = sizeof io, .q = q, .ldq = qd, .k = kv, .ldk = kvd,
        .v = NULL, .ldv = 0, .out = att, .ldo = od, .w_kv_b = Y->wkv_b,
    };
    DS_TRY (m->attn_ops->forward (m->attn, l, ab, d_new, &io, err));
    DS_TRY (s_row_parallel (m, Y->wo, att, od, r0, nn, err));
    if (Y->w_gate) return RX_OK;
    return K->rms_norm (be, st, x, E, Y->ffn_norm, h, E, nn, E, m->eps, err);
}

/* The dense FFN of block Y for the nn rows of the batch: under DP attention
 * split over the ranks (s_dp_ffn, blocking collectives; M the group's
 * largest row count), else x += down(silu(gate h) * up h), row-parallel
 * under tensor parallelism. */
static int s_dense (struct ds_model *m, const struct ds_layer *Y, size_t nn, size_t M, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = (size_t) m->n_embd, F = (size_t) (m->f1 - m->f0);
    if (m->dp_attn) return s_dp_ffn (m, Y, nn, M, err);
    DS_TRY (K->rms_norm (be, st, m->x, E, Y->ffn_norm, m->h, E, nn, E, m->eps, err));
    DS_TRY (K->matmul (be, st, Y->w_gate, -1, m->h, E, m->gate, F, nn, 0, err));
    DS_TRY (K->matmul (be, st, Y->w_up, -1, m->h, E, m->up, F, nn, 0, err));
    DS_TRY (K->swiglu (be, st, m->gate, F, m->up, F, m->gate, F, nn, F, err));
    return s_row_parallel (m, Y->w_down, m->gate, F, 0, nn, err);
}

/* logits = (rms_norm(x) * output_norm) Wout^T for the rows b asks for
 * (models/batch.h); hout is free after the layers. */
static int s_logits (struct ds_model *m, const struct rx_model_batch *b, struct rx_err *err)
{
    return rx_model_logits (&m->k, b, m->x, m->hout, (size_t) m->n_embd, m->output_norm, m->eps, m->output,
                            m->n_vocab, err);
}

/* ------------------------------------------------------ two-batch overlap -- */

/* models/tbo.h's stage A for micro-batch b of MoE layer l: MLA attention
 * + router + shared experts over its rows. */
static int s_tbo_front (void *p, int32_t l, const struct rx_tbo_mb *b, struct rx_err *err)
{
    struct ds_model *m = p;
    const struct ds_layer *Y = &m->layers[l];
    DS_TRY (s_attn (m, Y, l, &b->ab, b->d_pos, b->d_new, b->r0, b->n, err));
    DS_TRY (s_moe_route (m, Y, b->r0, b->n, err));
    return s_moe_shared (m, Y, b->r0, b->n, err);
}

static int s_tbo_experts (void *p, int32_t l, const struct rx_moe_routed *rt, struct rx_err *err)
{
    struct ds_model *m = p;
    return s_moe_experts (m, &m->layers[l], rt, err);
}

/* Whether this step runs as two micro-batches: TBO on, a model with MoE
 * blocks, and -- alone or tensor-parallel -- at least 2 sequences; under
 * DP attention always while a rank of the group has rows (M > 0),
 * whatever this rank's batch, so every rank makes the same collective
 * calls (1 sequence: (all, empty); idle: two empties). */
static int s_tbo_on (const struct ds_model *m, const struct rx_model_batch *b, int32_t M)
{
    if (!m->tbo || m->n_dense >= m->n_layer || !m->tbo_state.idx || !m->moe) return 0;
    return m->dp_attn ? M > 0 : b->n_seq >= 2;
}

/* One step as two micro-batches (models/tbo.h cuts the batch at a sequence
 * boundary), models/tbo.h's schedule (rx_tbo_layers) per MoE layer:
 *     A(0): combine_wait(0), MLA(0), router(0), shared experts(0), dispatch_start(0)
 *     A(1): combine_wait(1), MLA(1), router(1), shared experts(1), dispatch_start(1)
 *     B(0): dispatch_wait(0), experts(0), combine_start(0)
 *     B(1): dispatch_wait(1), experts(1), combine_start(1)
 * The leading dense blocks run BEFORE the split, on the whole batch, as in
 * the one-batch forward: under DP attention their FFN is a blocking
 * all-gather + reduce-scatter (no asynchronous half to overlap), so split
 * they would only double the collectives; unsplit, every rank issues them
 * in the same order by construction (an idle rank too: n = 0 rows).  They
 * are a few blocks of many (DeepSeek-V3: 3 of 61).  The results equal the
 * one-batch forward: rows never mix across sequences outside the MoE, each
 * token's expert sum has a fixed order (radix/moe.h), the shared experts
 * are added before the routed sum in both, and the EPLB copy choice counts
 * rows from the batch's first. */
static int s_forward_tbo (struct ds_model *m, const struct rx_model_batch *b, int32_t M, struct rx_err *err)
{
    const int32_t n = b->n_tokens, T = m->max_tokens;
    struct rx_tbo *t = &m->tbo_state;
    if (t->moe2_n_phys != m->moe_n_phys) DS_TRY (s_tbo_reserve (m, err));   /* placement changed */
    struct rx_model_batch_dev dv;
    if (n > 0) DS_TRY (rx_model_stage_upload (&m->stage, m->host, &m->k, T, b, DS_NAME, &dv, err));
    struct rx_tbo_mb mb[2];
    DS_TRY (rx_tbo_plan (mb, m->moe, t->moe2 && rx_tbo_has_async (m->moe_ops) ? t->moe2 : m->moe, b,
                         n > 0 ? &dv : NULL, t, &m->k, T, err));
    struct rx_attn_batch whole = { 0 };
    if (n > 0) {
        whole = (struct rx_attn_batch) {
            .n_seq = b->n_seq, .n_tokens = n, .q_start = dv.q_start, .kv_start = dv.kv_start,
            .slots = dv.kv_slots, .q_pos = dv.pos,
        };
        DS_TRY (m->k.ops->get_rows (m->k.be, m->k.stream, m->tok_embd, dv.tokens, (size_t) n, m->x,
                                    (size_t) m->n_embd, err));
    }
    /* The leading dense blocks, unsplit. */
    if (n > 0 && m->n_dense > 0 && RX_HAS (struct rx_attn_ops, m->attn_ops, prepare))
        DS_TRY (m->attn_ops->prepare (m->attn, &whole, err));
    for (int32_t l = 0; l < m->n_dense; l++) {
        if (n > 0) DS_TRY (s_attn (m, &m->layers[l], l, &whole, dv.pos, dv.new_slots, 0, (size_t) n, err));
        DS_TRY (s_dense (m, &m->layers[l], (size_t) n, (size_t) M, err));
        if (RX_HAS (struct rx_host, m->host, progress)) m->host->progress (m->host);
    }
    const struct rx_tbo_model v = {
        .model = m, .front = s_tbo_front, .experts = s_tbo_experts, .moe_ops = m->moe_ops,
        .attn_ops = m->attn_ops, .attn = m->attn, .host = m->host, .h = m->h, .x = m->x, .ids = m->d_topk,
        .wts = m->wts, .E = (size_t) m->n_embd, .k = (size_t) m->n_used, .chunk = (size_t) m->moe_chunk,
        .dp_attn = m->dp_attn,
    };
    DS_TRY (rx_tbo_layers (&v, mb, m->n_dense, m->n_layer, M, err));
    return n > 0 ? s_logits (m, b, err) : RX_OK;
}

static struct rx_attn_batch s_attn_batch (const struct rx_model_batch *b, const struct rx_model_batch_dev *dv)
{
    return (struct rx_attn_batch) {
        .n_seq = b->n_seq, .n_tokens = b->n_tokens, .q_start = dv->q_start, .kv_start = dv->kv_start,
        .slots = dv->kv_slots, .q_pos = dv->pos,
    };
}

/* One step's layers and logits, op by op (or being captured). */
static int s_forward_eager (struct ds_model *m, const struct rx_model_batch *b,
                            const struct rx_model_batch_dev *dv, int32_t M, struct rx_err *err)
{
    const struct rx_attn_batch ab = s_attn_batch (b, dv);
    const size_t nn = (size_t) b->n_tokens;
    DS_TRY (m->k.ops->get_rows (m->k.be, m->k.stream, m->tok_embd, dv->tokens, nn, m->x, (size_t) m->n_embd, err));
    for (int32_t l = 0; l < m->n_layer; l++) {
        const struct ds_layer *Y = &m->layers[l];
        DS_TRY (s_attn (m, Y, l, &ab, dv->pos, dv->new_slots, 0, nn, err));
        if (Y->w_gate) DS_TRY (s_dense (m, Y, nn, (size_t) M, err));
        else DS_TRY (s_moe (m, Y, nn, m->dp_attn ? (size_t) M : nn, err));
        /* A long prefill is busy, not hung: tell radixd's watchdog. */
        if (RX_HAS (struct rx_host, m->host, progress)) m->host->progress (m->host);
    }
    return s_logits (m, b, err);
}

/* CUDA graphs (models/graph.h): decode steps of one rank (no collectives
 * in the graph) after a first eager step (attn-mla builds its per-head
 * weights on the host then), with routing and experts on the device: the
 * backend's moe_route, no placement or counting, and the dispatcher sorted
 * on the device the last time it was asked (models/moe_experts.h). */
static int s_moe_on_device (const struct ds_model *m, size_t n_tok)
{
    return m->n_dense >= m->n_layer ||
           (m->moe_dev_seen && RX_HAS (struct rx_kernels_ops, m->k.ops, moe_route) && m->k.ops->moe_route &&
            rx_moe_experts_device (&m->place, n_tok));
}

static int s_graph_step (const struct ds_model *m, const struct rx_model_batch *b)
{
    return rx_model_graphs_shape (&m->graphs, b) && (m->n_rank == 1 || m->graphs.tp) && m->warm &&
           s_moe_on_device (m, (size_t) b->n_tokens);
}

/* This rank's half of the DP-attention decision (models/graph.h
 * rx_model_graphs_dp_step), with the MoE layers on the device for up to
 * max_bs rows.  (Not warm: this rank runs its padded step op by op while
 * the others replay, see s_forward.) */
static int s_dp_graph_step (const struct ds_model *m, const struct rx_model_batch *b)
{
    return rx_model_graphs_dp_step (&m->graphs, b) && s_moe_on_device (m, (size_t) m->graphs.max_bs);
}

/* The eager step a graph captures; under DP attention b is the padded
 * batch, whose M rows are every rank's block size. */
static int s_graph_eager (void *p, const struct rx_model_batch *b, const struct rx_model_batch_dev *dv,
                          struct rx_err *err)
{
    const struct ds_model *m = p;
    return s_forward_eager (p, b, dv, m->dp_attn ? b->n_tokens : 0, err);
}

/* attn-mla grows its scratch for the padded batch (host work: before the
 * capture or replay). */
static int s_padded_prepare (void *p, const struct rx_model_batch *pb, const struct rx_model_batch_dev *dv,
                             struct rx_err *err)
{
    struct ds_model *m = p;
    if (!RX_HAS (struct rx_attn_ops, m->attn_ops, prepare) || !m->attn_ops->prepare) return RX_OK;
    const struct rx_attn_batch ab = s_attn_batch (pb, dv);
    return m->attn_ops->prepare (m->attn, &ab, err);
}

static int s_forward (void *p, const struct rx_model_batch *b, struct rx_err *err)
{
    struct ds_model *m = p;
    int rc = s_check_batch (m, b, err);
    if (rc == RX_OK) rx_moe_place_step (&m->place, b);
    int32_t M = 0;
    int dp_graph = 0;
    if (m->dp_attn && m->max_tokens > 0) {
        /* Every rank takes part in the count exchange, a refused batch
         * included (as -1), so the group fails together. */
        struct rx_err e2 = { 0 };
        int rc2 = s_dp_counts (m, rc == RX_OK && b ? b->n_tokens : -1, rc == RX_OK && s_dp_graph_step (m, b),
                               &M, &dp_graph, rc == RX_OK ? err : &e2);
        if (rc == RX_OK) rc = rc2;
    }
    if (rc != RX_OK) return rc;
    if (dp_graph && M <= m->graphs.max_bs) {
        /* Every rank replays graph M, padded; one that has not run an
         * eager step yet runs its padded step op by op (the same
         * collectives) and is warm after it. */
        const struct rx_model_padded pd = {
            .pad = &m->pad, .stage = &m->stage, .max_tokens = m->max_tokens, .pad_slot = (int32_t) m->n_slots,
            .n_vocab = m->n_vocab, .logits = m->dp_logits, .before = s_padded_prepare, .eager = !m->warm,
            .who = DS_NAME,
        };
        DS_TRY (rx_model_graphs_run_padded (&m->graphs, &m->k, m, s_graph_eager, &pd, b, M, err));
        m->warm = 1;
        return RX_OK;
    }
    if (s_tbo_on (m, b, M)) return s_forward_tbo (m, b, M, err);
    if (b->n_tokens == 0) {
        /* Idle (DP attention): only the FFN collectives of every layer, and
         * none at all when every rank is idle. */
        for (int32_t l = 0; l < m->n_layer && M > 0; l++) {
            if (m->layers[l].w_gate) DS_TRY (s_dp_ffn (m, &m->layers[l], 0, (size_t) M, err));
            else DS_TRY (s_moe (m, &m->layers[l], 0, (size_t) M, err));
        }
        return RX_OK;
    }
    struct rx_model_batch_dev dv;
    DS_TRY (rx_model_stage_upload (&m->stage, m->host, &m->k, m->max_tokens, b, DS_NAME, &dv, err));
    /* attn-mla grows its scratch here (host work: before any capture). */
    if (RX_HAS (struct rx_attn_ops, m->attn_ops, prepare) && m->attn_ops->prepare) {
        const struct rx_attn_batch ab = s_attn_batch (b, &dv);
        DS_TRY (m->attn_ops->prepare (m->attn, &ab, err));
    }
    if (s_graph_step (m, b)) {
        DS_TRY (rx_model_graphs_run (&m->graphs, &m->k, m, s_graph_eager, b, &dv, err));
        return rx_model_graphs_comm_check (&m->graphs, err);
    }
    DS_TRY (s_forward_eager (m, b, &dv, M, err));
    m->warm = 1;
    return RX_OK;
}

static const char *s_default_attention (const char *arch)
{
    (void) arch;
    return "mla";
}

/* EPLB (radix/model.h set_placement): take the placement; a new slot
 * count re-creates the dispatcher with the same chunk. */
static int s_set_placement (void *p, const struct rx_moe_placement *pl, struct rx_err *err)
{
    struct ds_model *m = p;
    if (m->n_dense >= m->n_layer)
        return rx_err_set (err, RX_EINVAL, DS_NAME ": set_placement: the model has no MoE layers");
    DS_TRY (rx_moe_place_set (&m->place, DS_NAME, pl, m->n_layer - m->n_dense, m->n_expert, err));
    const int32_t n_phys = rx_moe_place_n_physical (&m->place, m->n_expert);
    if (!m->moe || n_phys == m->moe_n_phys) return RX_OK;
    m->moe_ops->destroy (m->moe);
    m->moe = NULL;
    struct rx_moe_config mc = {
        .struct_size = sizeof mc, .n_expert = n_phys, .n_expert_used = m->n_used,
        .n_embd = m->n_embd, .max_tokens = m->moe_chunk, .ep_rank = m->ep_size > 1 ? m->rank : 0,
        .ep_size = m->ep_size, .kops = m->k.ops, .kbe = m->k.be, .stream = m->k.stream,
        .comm = m->ep_size > 1 ? m->comm : NULL, .comm_inst = m->ep_size > 1 ? m->comm_inst : NULL,
    };
    int rc = m->moe_ops->create (m->moe_host, &mc, &m->moe, err);
    if (rc != RX_OK) {
        m->moe = NULL;
        return rc;
    }
    m->moe_n_phys = n_phys;
    return RX_OK;
}

static const char *const s_archs[] = { "deepseek2", NULL };

static const struct rx_model_ops s_ops = {
    .struct_size = sizeof (struct rx_model_ops),
    .architectures = s_archs,
    .default_attention = s_default_attention,
    .create = s_create,
    .destroy = s_destroy,
    .info = s_info,
    .reserve = s_reserve,
    .forward = s_forward,
    .set_placement = s_set_placement,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_MODEL, .name = "deepseek2", .version = "0.1.0",
                  .description = "DeepSeek-V2/V3 (arch deepseek2): MLA attention, DeepSeek MoE",
                  .ops = &s_ops)
