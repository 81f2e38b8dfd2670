/* models/llama/llama.c -- model-llama.so: dense decoder-only transformers of
 * the Llama family: Llama 2/3, Mistral, TinyLlama, SmolLM2 (arch "llama",
 * tied embeddings when output.weight is absent) and Qwen2 (arch "qwen2":
 * QKV bias, NeoX RoPE).
 *
 * One layer (pre-norm residual):
 *     h = rms_norm(x) * attn_norm
 *     q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv);  RoPE on q, k
 *     x += attention(q, k, v) Wo^T                    (attention plugin)
 *     h = rms_norm(x) * ffn_norm
 *     x += (silu(h Wgate^T) * h Wup^T) Wdown^T
 * then logits = (rms_norm(x) * output_norm) Wout^T for the rows asked for.
 *
 * Mixture of experts (Mixtral style: <arch>.expert_count > 0, tensors
 * ffn_gate_inp, ffn_{gate,up,down}_exps instead of the dense FFN): the FFN
 * is x += sum over the top-k experts e of w_e down_e(silu(gate_e h) * up_e h),
 * the router's softmax over every expert renormalized over the top k.  The
 * rows travel through the MoE dispatcher plugin of the env (radix/moe.h,
 * one instance made by reserve(), shared by the layers): dispatch groups
 * them by expert, one matmul per expert with rows, combine adds the
 * weighted sum to the residual.  With tensor parallelism an MoE model is
 * refused (RX_ENOTSUP); with DP attention it runs expert-parallel (below).
 *
 * Tensor parallelism (env->n_rank > 1): rank r of N runs KV heads
 * [r*Hkv/N, (r+1)*Hkv/N) (an integer split, uneven when N does not divide
 * Hkv) and the query heads that read them, and FFN columns
 * [r*F/N, (r+1)*F/N) rounded to ffn_down's quant block.  Wq/Wk/Wv (and
 * their biases) and Wgate/Wup are column-parallel: this rank's rows of the
 * GGUF matrix are a pointer into the mapping (zero copy).  Wo and Wdown are
 * row-parallel: this rank's columns of every row are packed into a host
 * copy (block-aligned in the quant type, else RX_ENOTSUP), and their
 * partial outputs are all-reduced (SUM) through env->comm before the
 * residual add, which happens once, after the reduction.  Embeddings, norms
 * and the LM head are replicated: every rank computes the full logits, so
 * no gather is needed and all ranks sample the same tokens (the reduction
 * is bitwise identical on every rank).
 *
 * DP attention (env->dp_attn, N = env->n_rank ranks): each rank runs its
 * own batches and holds its own KV; attention (all heads, Wo whole) and the
 * embeddings, norms and LM head run on the rank's own rows only.  The
 * dense FFN is split as with tensor parallelism (FFN columns [f0, f1))
 * and fed the rows of every rank: once per step the ranks all-gather their
 * row counts (I32), and in every layer each all-gathers its normed rows
 * padded to the largest count M (an [N*M][n_embd] block), runs its FFN
 * slice over all of them, and reduce-scatters (SUM) the partial outputs so
 * it gets the whole FFN output of its own M-row block, of which it adds
 * its n rows to the residual.  A rank without work runs an idle forward
 * (n_tokens 0) that only takes part in these collectives; when every rank
 * is idle (M = 0) the layers are skipped on all of them alike.  The ranks
 * must reserve the same max_tokens (the engine agrees on it).
 * With [scheduler] cuda_graph_max_bs and a comm whose collectives a
 * capture records, decode steps replay graphs: every rank the graph of
 * the group's largest batch, its own batch padded to it (models/graph.h;
 * the vote rides on the count exchange, models/dp_ffn.h).
 *
 * MoE under DP attention: an MoE layer is not gathered / reduce-scattered.
 * Each rank routes its OWN rows (router, top-k) and hands them to the
 * dispatcher, created with ep_rank = rank, ep_size = env->ep_size (1: all
 * experts on every rank, no exchange; n_rank: experts sharded, the ep_*
 * dispatchers exchange the rows over the DP group's comm).  The rank runs
 * only the experts the dispatcher gives it (first_expert ..) on the rows it
 * receives from every rank, and combine brings each rank the sum for its
 * own rows.  Every rank calls dispatch / combine the same number of times
 * in every MoE layer -- ceil(M / chunk) with M the group's largest row
 * count, empty chunks (and idle ranks) dispatching 0 tokens -- so the
 * dispatcher's collectives always have all ranks.
 *
 * Every computation is a kernel-backend op (radix/kernel.h); this file only
 * reads hyper-parameters, loads weight handles, checks the batch and keeps
 * buffers.  Scratch is sized once by reserve(): forward() allocates nothing
 * (except when a batch's slot lists outgrow their buffer, which doubles). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#include "../batch.h"
#include "../dp_ffn.h"
#include "../graph.h"
#include "../moe_experts.h"
#include "../moe_place.h"
#include "../tbo.h"

#define LL_MAX_LAYERS 1024
#define LL_MAX_DIM    (1 << 20)
#define LL_GRAPH_TAG  0x6c6c616d61ull   /* "llama": graph keys (models/graph.h) */

enum ll_arch { LL_LLAMA = 0, LL_QWEN2 = 1 };

struct ll_layer {
    const float *attn_norm, *ffn_norm;          /* device F32 [n_embd] */
    const float *bq, *bk, *bv;                  /* device F32 biases or NULL */
    rx_kweight_t *wq, *wk, *wv, *wo;
    rx_kweight_t *w_gate, *w_up, *w_down;       /* dense FFN (NULL in an MoE layer) */
    /* Fused projections ([model.llama] fuse_weights): Q, K and V rows in
     * one weight (wq/wk/wv NULL), gate and up rows in one (w_gate/w_up
     * NULL); NULL when not fused. */
    rx_kweight_t *wqkv, *w_gu;
    /* MoE FFN (n_expert > 0): router [n_embd, n_expert], experts
     * [n_embd, n_ff_exp, n_expert] (gate, up) and [n_ff_exp, n_embd, n_expert] */
    rx_kweight_t *gate_inp, *gate_exps, *up_exps, *down_exps;
};

/* This rank's share of the heads and FFN columns (everything when n_rank
 * is 1). */
struct ll_split {
    int32_t kv0, kv1;              /* KV heads [kv0, kv1) */
    int32_t q0, q1;                /* query heads [q0, q1) */
    int32_t f0, f1;                /* FFN columns [f0, f1) */
};

struct ll_model {
    const struct rx_host *host;
    struct rx_kctx k;
    const struct rx_attn_ops *attn_ops;
    void *attn;
    const char *path;
    char arch[32];
    enum ll_arch kind;

    /* hyper-parameters */
    int32_t n_vocab, n_ctx_train, n_layer, n_embd, n_ff;
    int32_t n_head, n_kv_head, hd_k, hd_v;       /* n_ff, n_head, n_kv_head: this rank's */
    int32_t n_ff_all, n_head_all, n_kv_head_all; /* the whole model's */
    /* mixture of experts (Mixtral style): 0 experts = dense */
    int32_t n_expert, n_expert_used, n_ff_exp;
    const struct rx_moe_ops *moe_ops;            /* env->moe */
    const struct rx_host *moe_host;
    int32_t moe_max_tokens;                      /* env->moe_max_tokens (0 = reserve's) */
    void *moe;                                   /* dispatcher instance (reserve) */
    int32_t moe_chunk;                           /* its max_tokens: tokens per dispatch */
    struct rx_moe_place place;                   /* EPLB placement + recording (models/moe_place.h) */
    int moe_dev_seen;                            /* the last dispatch that was asked for device
                                                  * offsets gave them (models/moe_experts.h) */
    int32_t moe_n_phys;                          /* the dispatcher's n_expert (slots) */

    /* tensor parallelism (or DP attention when dp_attn) */
    int32_t rank, n_rank;
    int32_t dp_attn;                             /* env->dp_attn */
    int32_t ep_size;                             /* env->ep_size: 1, or n_rank with dp_attn */
    float *dp_g, *dp_d;                          /* DP: [N*T][n_embd] gathered rows, FFN partials */
    int32_t *dp_cnt;                             /* DP: device [N] row counts of the ranks */
    int32_t *dp_cnt_h;                           /* DP: host copy [N] (create) */
    const struct rx_comm_ops *comm;
    void *comm_inst;
    struct ll_split sp;
    float eps;
    struct rx_rope_params rope;

    /* weights */
    rx_kweight_t *tok_embd, *output;             /* output may be tok_embd (tied) */
    const float *output_norm;
    struct ll_layer *layers;
    rx_kweight_t **owned;                        /* every handle we loaded */
    size_t n_owned, cap_owned;
    /* Packed host copies of row-parallel slices: weight_load may keep the
     * pointer, so they live until destroy (after the handles are freed). */
    void **copies;
    size_t n_copies, cap_copies;
    int fuse;                                    /* [model.llama] fuse_weights, resolved */
    int weight_copy;                             /* the backend has RX_KCAP_WEIGHT_COPY */
    uint64_t weight_bytes, n_params;

    /* reserve() */
    uint64_t n_slots;
    int32_t max_tokens;
    float *x, *h, *q, *kk, *v, *att, *gate, *up, *hout;  /* device scratch */
    float *router, *topw;                        /* MoE: [T][n_expert], [T][k] */
    int32_t *topi;                               /* MoE: [T][k] expert ids (device) */
    void *f32_mem;                               /* one allocation for the above */
    struct rx_model_stage stage;                 /* the batch's index arrays (models/batch.h) */

    /* Two-batch overlap (env->two_batch_overlap; MoE models only, see
     * s_forward_tbo): micro-batch 1's dispatcher instance (one exchange in
     * flight per instance), made by reserve() when the dispatcher has the
     * asynchronous ops, and micro-batch 1's rebased q_start / kv_start. */
    int32_t tbo;
    struct rx_model_graphs graphs;               /* decode-step graphs (models/graph.h) */
    /* DP attention's decode graphs (graphs.dp, models/graph.h
     * rx_model_graphs_run_padded): the padded batch and the padded rows'
     * logits (device [min(max_bs, T)][n_vocab], reserve); the pad KV slot
     * is n_slots (the pool has one row more). */
    struct rx_model_pad pad;
    float *dp_logits;
    struct rx_tbo tbo_state;                     /* moe2 re-made when moe_n_phys changes */
};

/* ------------------------------------------------------------ helpers -- */

static void *s_zalloc (const struct rx_host *h, size_t n)
{
    void *p = h->alloc (h, n, 0);
    if (p) memset (p, 0, n);
    return p;
}

static int s_key_u32 (struct ll_model *m, const struct rx_model_src *src, const char *name,
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
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: missing key %s", src->path, key);
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: key %s is not an unsigned integer (%s)",
                           src->path, key, rx_status_name (rc));
    return RX_OK;
}

static int s_key_f32 (struct ll_model *m, const struct rx_model_src *src, const char *name,
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
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: missing key %s", src->path, key);
    if (rc != RX_OK || !isfinite (*out))
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: key %s is not a finite float",
                           src->path, key);
    return RX_OK;
}

/* Append p to a grow-only pointer array of the model's host heap. */
static int s_push (struct ll_model *m, void ***arr, size_t *n, size_t *cap, void *p,
                   struct rx_err *err)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        void **na = s_zalloc (m->host, nc * sizeof *na);
        if (!na) return rx_err_set (err, RX_ENOMEM, "model-llama: out of memory");
        if (*arr) {
            memcpy (na, *arr, *n * sizeof *na);
            m->host->free_ (m->host, *arr);
        }
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return RX_OK;
}

/* The view of tensor `name`, its shape checked to be [ne0, ne1] (ne1 = 0:
 * a 1-D tensor).  RX_ENOENT (err untouched) when optional and absent. */
static int s_view (const struct rx_model_src *src, const char *name, int64_t ne0, int64_t ne1,
                   int optional, struct rx_weight_view *v, struct rx_err *err)
{
    memset (v, 0, sizeof *v);
    int rc = src->tensor (src, name, v);
    if (rc == RX_ENOENT && optional) return RX_ENOENT;
    if (rc == RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: missing tensor %s", src->path, name);
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: cannot read tensor %s (%s)",
                           src->path, name, rx_status_name (rc));
    int shape_ok = ne1 == 0 ? (v->ne[0] == (uint64_t) ne0 && v->ne[1] == 1 && v->ne[2] == 1 && v->ne[3] == 1)
                            : (v->ne[0] == (uint64_t) ne0 && v->ne[1] == (uint64_t) ne1
                               && v->ne[2] == 1 && v->ne[3] == 1);
    if (!shape_ok) {
        if (ne1 == 0)
            return rx_err_set (err, RX_EFORMAT,
                               "%s: model-llama: tensor %s has shape [%llu,%llu,%llu], expected [%lld]",
                               src->path, name, (unsigned long long) v->ne[0],
                               (unsigned long long) v->ne[1], (unsigned long long) v->ne[2],
                               (long long) ne0);
        return rx_err_set (err, RX_EFORMAT,
                           "%s: model-llama: tensor %s has shape [%llu,%llu,%llu], expected [%lld,%lld]",
                           src->path, name, (unsigned long long) v->ne[0],
                           (unsigned long long) v->ne[1], (unsigned long long) v->ne[2],
                           (long long) ne0, (long long) ne1);
    }
    if (rx_dtype_row_bytes (v->dtype, (size_t) v->ne[0]) == 0)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: tensor %s: %llu columns are not whole %s blocks",
                           src->path, name, (unsigned long long) v->ne[0], rx_dtype_name (v->dtype));
    return RX_OK;
}

/* weight_load v (the whole tensor or this rank's slice of it). */
static int s_load (struct ll_model *m, const struct rx_model_src *src, const char *name,
                   const struct rx_weight_view *v, rx_kweight_t **w, struct rx_err *err)
{
    *w = NULL;
    int rc = m->k.ops->weight_load (m->k.be, v, w, err);
    if (rc != RX_OK) {
        char why[RX_ERR_MSG_MAX];
        snprintf (why, sizeof why, "%s", err ? err->msg : "");
        *w = NULL;
        return rx_err_set (err, rc, "%s: model-llama: tensor %s (%s): %s", src->path, name,
                           rx_dtype_name (v->dtype), why);
    }
    if ((rc = s_push (m, (void ***) &m->owned, &m->n_owned, &m->cap_owned, *w, err)) != RX_OK) {
        m->k.ops->weight_free (m->k.be, *w);
        *w = NULL;
        return rc;
    }
    m->weight_bytes += v->nbytes;
    m->n_params += v->ne[0] * v->ne[1] * v->ne[2] * v->ne[3];
    return RX_OK;
}

/* Load tensor `name`, check its shape [ne0, ne1] (ne1 = 0: a 1-D tensor).
 * *w = NULL and RX_OK when optional and absent. */
static int s_weight (struct ll_model *m, const struct rx_model_src *src, const char *name,
                     int64_t ne0, int64_t ne1, int optional, rx_kweight_t **w,
                     struct rx_err *err)
{
    *w = NULL;
    struct rx_weight_view v;
    int rc = s_view (src, name, ne0, ne1, optional, &v, err);
    if (rc == RX_ENOENT && optional) return RX_OK;
    if (rc != RX_OK) return rc;
    return s_load (m, src, name, &v, w, err);
}

/* A 3-D expert tensor [ne0, ne1, ne2] (ne2 experts of [ne0, ne1]), whole. */
static int s_weight3 (struct ll_model *m, const struct rx_model_src *src, const char *name,
                      int64_t ne0, int64_t ne1, int64_t ne2, rx_kweight_t **w, struct rx_err *err)
{
    *w = NULL;
    struct rx_weight_view v;
    memset (&v, 0, sizeof v);
    int rc = src->tensor (src, name, &v);
    if (rc == RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: missing tensor %s", src->path, name);
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: cannot read tensor %s (%s)",
                           src->path, name, rx_status_name (rc));
    if (v.ne[0] != (uint64_t) ne0 || v.ne[1] != (uint64_t) ne1 || v.ne[2] != (uint64_t) ne2
        || v.ne[3] != 1)
        return rx_err_set (err, RX_EFORMAT,
                           "%s: model-llama: tensor %s has shape [%llu,%llu,%llu,%llu], expected [%lld,%lld,%lld]",
                           src->path, name, (unsigned long long) v.ne[0], (unsigned long long) v.ne[1],
                           (unsigned long long) v.ne[2], (unsigned long long) v.ne[3], (long long) ne0,
                           (long long) ne1, (long long) ne2);
    if (rx_dtype_row_bytes (v.dtype, (size_t) v.ne[0]) == 0)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: tensor %s: %llu columns are not whole %s blocks",
                           src->path, name, (unsigned long long) v.ne[0], rx_dtype_name (v.dtype));
    return s_load (m, src, name, &v, w, err);
}

/* Column-parallel: rows [r0, r1) of the [ne0, ne1] matrix `name` -- a
 * pointer into the mapping, no copy. */
static int s_weight_rows (struct ll_model *m, const struct rx_model_src *src, const char *name,
                          int64_t ne0, int64_t ne1, int64_t r0, int64_t r1, rx_kweight_t **w,
                          struct rx_err *err)
{
    *w = NULL;
    struct rx_weight_view v;
    int rc = s_view (src, name, ne0, ne1, 0, &v, err);
    if (rc != RX_OK) return rc;
    size_t rb = rx_dtype_row_bytes (v.dtype, (size_t) v.ne[0]);
    v.data = (const unsigned char *) v.data + (size_t) r0 * rb;
    v.ne[1] = (uint64_t) (r1 - r0);
    v.nbytes = (size_t) (r1 - r0) * rb;
    return s_load (m, src, name, &v, w, err);
}

/* One part of a fused weight: rows [r0, r1) of the [ne0, ne1] matrix name. */
struct ll_part {
    char name[96];
    int64_t ne1, r0, r1;
};

/* The parts' rows one after another as one weight (output row i of the
 * fused matmul is row i of that stack), from a host copy the model keeps
 * until destroy -- or frees at once when the backend copies at load
 * (RX_KCAP_WEIGHT_COPY).  RX_ENOTSUP, err untouched and *w NULL, when the
 * parts' element types differ (a Q4_K_M file's V in Q6_K): the caller
 * loads them one by one. */
static int s_weight_fused (struct ll_model *m, const struct rx_model_src *src, const struct ll_part *p,
                           int np, int64_t ne0, rx_kweight_t **w, struct rx_err *err)
{
    *w = NULL;
    struct rx_weight_view v[3];
    size_t bytes = 0;
    uint64_t rows = 0;
    for (int i = 0; i < np; i++) {
        int rc = s_view (src, p[i].name, ne0, p[i].ne1, 0, &v[i], err);
        if (rc != RX_OK) return rc;
        if (v[i].dtype != v[0].dtype) return RX_ENOTSUP;
        bytes += (size_t) (p[i].r1 - p[i].r0) * rx_dtype_row_bytes (v[i].dtype, (size_t) ne0);
        rows += (uint64_t) (p[i].r1 - p[i].r0);
    }
    unsigned char *copy = m->host->alloc (m->host, bytes, 64);
    if (!copy)
        return rx_err_set (err, RX_ENOMEM, "model-llama: out of memory (fused %s, %zu bytes)", p[0].name, bytes);
    size_t at = 0;
    for (int i = 0; i < np; i++) {
        size_t rb = rx_dtype_row_bytes (v[i].dtype, (size_t) ne0), n = (size_t) (p[i].r1 - p[i].r0) * rb;
        memcpy (copy + at, (const unsigned char *) v[i].data + (size_t) p[i].r0 * rb, n);
        at += n;
    }
    struct rx_weight_view f = v[0];
    f.data = copy;
    f.ne[1] = rows;
    f.nbytes = bytes;
    int rc = s_load (m, src, p[0].name, &f, w, err);
    if (rc != RX_OK || m->weight_copy) {
        m->host->free_ (m->host, copy);
        return rc;
    }
    if ((rc = s_push (m, &m->copies, &m->n_copies, &m->cap_copies, copy, err)) != RX_OK) {
        m->host->free_ (m->host, copy);
        return rc;   /* the handle is in `owned`: destroy frees it */
    }
    return RX_OK;
}

/* Row-parallel: columns [c0, c1) of every row of the [ne0, ne1] matrix
 * `name`, packed into a host copy the model keeps.  The bounds must fall
 * on the quant type's blocks. */
static int s_weight_cols (struct ll_model *m, const struct rx_model_src *src, const char *name,
                          int64_t ne0, int64_t ne1, int64_t c0, int64_t c1, rx_kweight_t **w,
                          struct rx_err *err)
{
    *w = NULL;
    struct rx_weight_view v;
    int rc = s_view (src, name, ne0, ne1, 0, &v, err);
    if (rc != RX_OK) return rc;
    if (c0 == 0 && c1 == ne0) return s_load (m, src, name, &v, w, err);
    size_t blk = rx_dtype_block (v.dtype);
    if ((size_t) c0 % blk || (size_t) c1 % blk)
        return rx_err_set (err, RX_ENOTSUP,
                           "%s: model-llama: tensor parallelism: tensor %s (%s, blocks of %zu) cannot be split at columns %lld..%lld of %lld (rank %d of %d)",
                           src->path, name, rx_dtype_name (v.dtype), blk, (long long) c0,
                           (long long) c1, (long long) ne0, m->rank, m->n_rank);
    size_t rb = rx_dtype_row_bytes (v.dtype, (size_t) ne0);
    size_t off = (size_t) c0 / blk * rx_dtype_bytes (v.dtype);
    size_t sb = (size_t) (c1 - c0) / blk * rx_dtype_bytes (v.dtype);
    unsigned char *copy = m->host->alloc (m->host, sb * (size_t) ne1, 64);
    if (!copy)
        return rx_err_set (err, RX_ENOMEM, "model-llama: out of memory (slice of %s, %zu bytes)",
                           name, sb * (size_t) ne1);
    if ((rc = s_push (m, &m->copies, &m->n_copies, &m->cap_copies, copy, err)) != RX_OK) {
        m->host->free_ (m->host, copy);
        return rc;
    }
    const unsigned char *from = v.data;
    for (int64_t r = 0; r < ne1; r++)
        memcpy (copy + (size_t) r * sb, from + (size_t) r * rb + off, sb);
    v.data = copy;
    v.ne[0] = (uint64_t) (c1 - c0);
    v.nbytes = sb * (size_t) ne1;
    return s_load (m, src, name, &v, w, err);
}

/* A 1-D F32 vector (norm weight, bias) as a device pointer; elements
 * [i0, i1) of it (i1 = 0: all n).  *out = NULL when optional and absent. */
static int s_vector_part (struct ll_model *m, const struct rx_model_src *src, const char *name,
                          int64_t n, int64_t i0, int64_t i1, int optional, const float **out,
                          struct rx_err *err)
{
    *out = NULL;
    struct rx_weight_view v;
    int rc = s_view (src, name, n, 0, optional, &v, err);
    if (rc == RX_ENOENT && optional) return RX_OK;
    if (rc != RX_OK) return rc;
    if (v.dtype != RX_F32)
        return rx_err_set (err, RX_ENOTSUP, "%s: model-llama: tensor %s is %s, only f32 is supported for norms and biases",
                           src->path, name, rx_dtype_name (v.dtype));
    if (i1 > 0) {
        v.data = (const float *) v.data + i0;
        v.ne[0] = (uint64_t) (i1 - i0);
        v.nbytes = (size_t) (i1 - i0) * sizeof (float);
    }
    rx_kweight_t *w;
    if ((rc = s_load (m, src, name, &v, &w, err)) != RX_OK) return rc;
    const void *p;
    rc = m->k.ops->weight_data (m->k.be, w, &p, err);
    if (rc != RX_OK) return rc;
    *out = p;
    return RX_OK;
}

static int s_vector (struct ll_model *m, const struct rx_model_src *src, const char *name,
                     int64_t n, int optional, const float **out, struct rx_err *err)
{
    return s_vector_part (m, src, name, n, 0, 0, optional, out, err);
}

/* ------------------------------------------------------------ life cycle -- */

static void s_free_scratch (struct ll_model *m)
{
    if (m->f32_mem || m->stage.dev || m->moe)
        m->k.ops->synchronize (m->k.be, m->k.stream, NULL);
    if (m->moe) m->moe_ops->destroy (m->moe);
    m->moe = NULL;
    rx_tbo_free (&m->tbo_state, &m->k, m->host, m->moe_ops);
    m->moe_chunk = 0;
    m->moe_n_phys = 0;
    if (m->f32_mem) m->k.ops->free_ (m->k.be, m->f32_mem);
    rx_model_stage_free (&m->stage, m->host, &m->k);
    m->f32_mem = NULL;
    m->x = m->h = m->q = m->kk = m->v = m->att = m->gate = m->up = m->hout = NULL;
    m->router = m->topw = NULL;
    m->topi = NULL;
    m->dp_g = m->dp_d = NULL;
    m->dp_cnt = NULL;
    if (m->dp_logits) m->k.ops->free_ (m->k.be, m->dp_logits);
    m->dp_logits = NULL;
    m->max_tokens = 0;
}

static void s_destroy (void *p)
{
    struct ll_model *m = p;
    if (!m) return;
    s_free_scratch (m);
    rx_moe_place_fini (&m->place);
    if (m->attn) m->attn_ops->destroy (m->attn);
    for (size_t i = 0; i < m->n_owned; i++)
        m->k.ops->weight_free (m->k.be, m->owned[i]);
    if (m->owned) m->host->free_ (m->host, m->owned);
    for (size_t i = 0; i < m->n_copies; i++)
        m->host->free_ (m->host, m->copies[i]);
    if (m->copies) m->host->free_ (m->host, m->copies);
    if (m->layers) m->host->free_ (m->host, m->layers);
    if (m->dp_cnt_h) m->host->free_ (m->host, m->dp_cnt_h);
    rx_model_graphs_free (&m->graphs, m->host);
    rx_model_pad_free (&m->pad, m->host);
    m->host->free_ (m->host, m);
}

static int s_hparams (struct ll_model *m, const struct rx_model_src *src, struct rx_err *err)
{
    uint32_t u;
    int rc;
    if ((rc = s_key_u32 (m, src, "embedding_length", 1, 0, &u, err))) return rc;
    m->n_embd = (int32_t) u;
    if ((rc = s_key_u32 (m, src, "block_count", 1, 0, &u, err))) return rc;
    m->n_layer = (int32_t) u;
    if ((rc = s_key_u32 (m, src, "feed_forward_length", 1, 0, &u, err))) return rc;
    m->n_ff = (int32_t) u;
    if ((rc = s_key_u32 (m, src, "attention.head_count", 1, 0, &u, err))) return rc;
    m->n_head = (int32_t) u;
    if ((rc = s_key_u32 (m, src, "attention.head_count_kv", 0, u, &u, err))) return rc;
    m->n_kv_head = (int32_t) u;
    if ((rc = s_key_u32 (m, src, "context_length", 0, 4096, &u, err))) return rc;
    m->n_ctx_train = u > INT32_MAX ? INT32_MAX : (int32_t) u;
    uint32_t n_expert = 0, n_used = 0, n_ff_exp = 0;
    if ((rc = s_key_u32 (m, src, "expert_count", 0, 0, &n_expert, err))) return rc;
    if (n_expert > 0) {
        if ((rc = s_key_u32 (m, src, "expert_used_count", 1, 0, &n_used, err))) return rc;
        if ((rc = s_key_u32 (m, src, "expert_feed_forward_length", 0, (uint32_t) m->n_ff, &n_ff_exp, err)))
            return rc;
        if (n_expert > 4096 || n_used == 0 || n_used > n_expert || n_ff_exp == 0 || n_ff_exp > LL_MAX_DIM)
            return rx_err_set (err, RX_EFORMAT,
                               "%s: model-llama: bad mixture of experts: %s.expert_count %u (1 .. 4096), expert_used_count %u (1 .. expert_count), expert width %u",
                               src->path, m->arch, n_expert, n_used, n_ff_exp);
        if (m->ep_size > 1 && (uint32_t) m->ep_size > n_expert)
            return rx_err_set (err, RX_ENOTSUP,
                               "%s: model-llama: ep_size %d is more than the %u experts (each rank must own at least one)",
                               src->path, m->ep_size, n_expert);
        if (m->n_rank > 1 && !m->dp_attn)
            return rx_err_set (err, RX_ENOTSUP,
                               "%s: model-llama: mixture-of-experts model (%u experts) with tensor parallelism (%d ranks) is not supported yet (expert parallelism comes later): run it with tp_size 1",
                               src->path, n_expert, m->n_rank);
        if (!m->moe_ops)
            return rx_err_set (err, RX_ENOTSUP,
                               "%s: model-llama: mixture-of-experts model (%u experts) needs a MoE dispatcher plugin ([moe] dispatcher, e.g. moe-local.so), and the engine has none",
                               src->path, n_expert);
    }
    m->n_expert = (int32_t) n_expert;
    m->n_expert_used = (int32_t) n_used;
    m->n_ff_exp = (int32_t) n_ff_exp;
    if (m->n_embd <= 0 || m->n_embd > LL_MAX_DIM || m->n_layer <= 0 || m->n_layer > LL_MAX_LAYERS
        || m->n_ff <= 0 || m->n_ff > LL_MAX_DIM || m->n_head <= 0 || m->n_head > 4096
        || m->n_kv_head <= 0 || m->n_head % m->n_kv_head != 0)
        return rx_err_set (err, RX_EFORMAT,
                           "%s: model-llama: bad hyper-parameters: n_embd %d, %d layers, n_ff %d, %d heads, %d kv heads",
                           src->path, m->n_embd, m->n_layer, m->n_ff, m->n_head, m->n_kv_head);
    /* The head dim defaults to n_embd / n_head when key_length is absent. */
    uint32_t hk, hv;
    if ((rc = s_key_u32 (m, src, "attention.key_length", 0, 0, &hk, err))) return rc;
    if (hk == 0 && m->n_embd % m->n_head != 0)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: n_embd %d is not a multiple of %d heads and %s.attention.key_length is not set",
                           src->path, m->n_embd, m->n_head, m->arch);
    if (hk == 0) hk = (uint32_t) (m->n_embd / m->n_head);
    if ((rc = s_key_u32 (m, src, "attention.value_length", 0, hk, &hv, err))) return rc;
    if (hk == 0 || hk > 4096 || hv == 0 || hv > 4096)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: bad head dims %u/%u", src->path, hk, hv);
    m->hd_k = (int32_t) hk;
    m->hd_v = (int32_t) hv;
    if ((rc = s_key_f32 (m, src, "attention.layer_norm_rms_epsilon", 1, 0, &m->eps, err))) return rc;
    if (!(m->eps > 0))
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: %s.attention.layer_norm_rms_epsilon must be > 0",
                           src->path, m->arch);

    /* RoPE */
    struct rx_rope_params *r = &m->rope;
    memset (r, 0, sizeof *r);
    r->struct_size = sizeof *r;
    r->mode = m->kind == LL_QWEN2 ? RX_ROPE_NEOX : RX_ROPE_NORMAL;
    if ((rc = s_key_u32 (m, src, "rope.dimension_count", 0, hk, &u, err))) return rc;
    if (u == 0 || u > hk || u % 2)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: %s.rope.dimension_count %u must be even and <= head dim %u",
                           src->path, m->arch, u, hk);
    r->n_rot = (int32_t) u;
    if ((rc = s_key_f32 (m, src, "rope.freq_base", 0, 10000.0f, &r->freq_base, err))) return rc;
    if (!(r->freq_base > 0))
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: rope.freq_base must be > 0", src->path);
    r->freq_scale = 1.0f;
    r->ext_factor = 0.0f;
    r->attn_factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->n_ctx_orig = m->n_ctx_train;
    char key[128];
    const char *stype = NULL;
    size_t stlen = 0;
    snprintf (key, sizeof key, "%s.rope.scaling.type", m->arch);
    rc = src->get_str (src, key, &stype, &stlen);
    if (rc != RX_OK && rc != RX_ENOENT)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: %s is not a string", src->path, key);
    /* As llama.cpp: the type defaults to linear, and the factor (or the
     * older rope.scale_linear) scales frequencies whatever the type. */
    float factor = 0;
    if ((rc = s_key_f32 (m, src, "rope.scaling.factor", 0, 0.0f, &factor, err))) return rc;
    if (factor == 0 && (rc = s_key_f32 (m, src, "rope.scale_linear", 0, 0.0f, &factor, err))) return rc;
    if (factor < 0)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: rope scaling factor %g < 0", src->path,
                           (double) factor);
    r->freq_scale = factor == 0 ? 1.0f : 1.0f / factor;
    int is_yarn = stype && stlen == 4 && memcmp (stype, "yarn", 4) == 0;
    if (stype && !is_yarn && !(stlen == 4 && memcmp (stype, "none", 4) == 0)
        && !(stlen == 6 && memcmp (stype, "linear", 6) == 0))
        return rx_err_set (err, RX_ENOTSUP, "%s: model-llama: rope scaling type \"%.*s\" is not supported (none, linear, yarn)",
                           src->path, (int) (stlen > 32 ? 32 : stlen), stype);
    if ((rc = s_key_u32 (m, src, "rope.scaling.original_context_length", 0,
                         (uint32_t) m->n_ctx_train, &u, err))) return rc;
    r->n_ctx_orig = (int32_t) (u > INT32_MAX ? INT32_MAX : u);
    if (is_yarn) {
        /* llama.cpp's defaults with YaRN: ext_factor 1, beta 32/1. */
        r->ext_factor = 1.0f;
        if ((rc = s_key_f32 (m, src, "rope.scaling.attn_factor", 0, 1.0f, &r->attn_factor, err))) return rc;
    }
    return RX_OK;
}

/* [model.llama] fuse_weights = auto | true | false (RADIX_LLAMA_FUSE=0|1
 * overrides it, for the test matrix): load Q, K, V as one weight and gate,
 * up as one, so a layer runs 3 matmuls and a rope call fewer -- kernel
 * launches a GPU pays for at batch 1.  The results are the same: each
 * output row is the same dot product (bit for bit on kernels-cpu; a GPU
 * GEMM of another output width may round the last bits differently).  auto = on for a backend that
 * copies weights at load (a GPU); kernels-cpu maps the file without a
 * copy, and a fused copy would only add memory. */
static int s_fuse_mode (struct ll_model *m, struct rx_err *err)
{
    struct rx_kernels_info ki = { .struct_size = sizeof ki };
    if (m->k.ops->info (m->k.be, &ki) == RX_OK) m->weight_copy = (ki.caps & RX_KCAP_WEIGHT_COPY) != 0;
    const char *v = "auto";
    if (m->host->cfg_str) {
        int rc = m->host->cfg_str (m->host, "fuse_weights", &v);
        if (rc == RX_ENOENT || !v) v = "auto";
        else if (rc != RX_OK)
            return rx_err_set (err, RX_ECONFIG, "model-llama: [model.llama] fuse_weights: invalid value (%s)",
                               rx_status_name (rc));
    }
    const char *env = getenv ("RADIX_LLAMA_FUSE");
    if (env && *env) v = strcmp (env, "0") == 0 ? "false" : "true";
    if (strcmp (v, "auto") == 0) m->fuse = m->weight_copy;
    else if (strcmp (v, "true") == 0) m->fuse = 1;
    else if (strcmp (v, "false") == 0) m->fuse = 0;
    else
        return rx_err_set (err, RX_ECONFIG, "model-llama: [model.llama] fuse_weights = %s: use auto, true or false", v);
    return RX_OK;
}

static int s_weights (struct ll_model *m, const struct rx_model_src *src, struct rx_err *err)
{
    int rc;
    struct rx_weight_view tv;
    memset (&tv, 0, sizeof tv);
    rc = src->tensor (src, "token_embd.weight", &tv);
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: missing tensor token_embd.weight", src->path);
    if (tv.ne[1] == 0 || tv.ne[1] > INT32_MAX)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: token_embd.weight has %llu rows",
                           src->path, (unsigned long long) tv.ne[1]);
    m->n_vocab = (int32_t) tv.ne[1];
    uint32_t nv;
    if ((rc = s_key_u32 (m, src, "vocab_size", 0, (uint32_t) m->n_vocab, &nv, err))) return rc;
    if ((int64_t) nv != m->n_vocab)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: %s.vocab_size %u but token_embd.weight has %d rows",
                           src->path, m->arch, nv, m->n_vocab);
    struct rx_weight_view rf;
    if (src->tensor (src, "rope_freqs.weight", &rf) == RX_OK)
        /* Llama 3.1+ long-context RoPE needs per-dimension frequency factors,
         * which the kernel rope op (radix/kernel.h 1.0) does not take yet. */
        return rx_err_set (err, RX_ENOTSUP,
                           "%s: model-llama: rope_freqs.weight (Llama 3.1 RoPE frequency factors) is not supported yet",
                           src->path);

    if ((rc = s_weight (m, src, "token_embd.weight", m->n_embd, m->n_vocab, 0, &m->tok_embd, err))) return rc;
    if ((rc = s_vector (m, src, "output_norm.weight", m->n_embd, 0, &m->output_norm, err))) return rc;
    if ((rc = s_weight (m, src, "output.weight", m->n_embd, m->n_vocab, 1, &m->output, err))) return rc;
    if (!m->output) m->output = m->tok_embd;   /* tied embeddings (SmolLM2, TinyLlama variants) */

    m->layers = s_zalloc (m->host, (size_t) m->n_layer * sizeof *m->layers);
    if (!m->layers) return rx_err_set (err, RX_ENOMEM, "model-llama: out of memory");
    /* Whole-model widths (the file's shapes) and this rank's ranges in them. */
    const struct ll_split *sp = &m->sp;
    const int64_t E = m->n_embd, F = m->n_ff_all, hk = m->hd_k, hv = m->hd_v;
    const int64_t nq = (int64_t) m->n_head_all * hk, nk = (int64_t) m->n_kv_head_all * hk,
                  nv_ = (int64_t) m->n_kv_head_all * hv, no = (int64_t) m->n_head_all * hv;
    const int64_t q0 = sp->q0 * hk, q1 = sp->q1 * hk, k0 = sp->kv0 * hk, k1 = sp->kv1 * hk,
                  v0 = sp->kv0 * hv, v1 = sp->kv1 * hv, o0 = sp->q0 * hv, o1 = sp->q1 * hv;
    const int bias = m->kind == LL_QWEN2;   /* qwen2 has QKV biases; llama files may too */
    for (int32_t l = 0; l < m->n_layer; l++) {
        struct ll_layer *L = &m->layers[l];
        char n[96];
#define LL_NAME(suffix) (snprintf (n, sizeof n, "blk.%d." suffix, (int) l), n)
        if ((rc = s_vector (m, src, LL_NAME ("attn_norm.weight"), E, 0, &L->attn_norm, err))) return rc;
        rc = RX_ENOTSUP;
        if (m->fuse) {
            struct ll_part qkv[3] = { { "", nq, q0, q1 }, { "", nk, k0, k1 }, { "", nv_, v0, v1 } };
            snprintf (qkv[0].name, sizeof qkv[0].name, "blk.%d.attn_q.weight", (int) l);
            snprintf (qkv[1].name, sizeof qkv[1].name, "blk.%d.attn_k.weight", (int) l);
            snprintf (qkv[2].name, sizeof qkv[2].name, "blk.%d.attn_v.weight", (int) l);
            rc = s_weight_fused (m, src, qkv, 3, E, &L->wqkv, err);
            if (rc != RX_OK && rc != RX_ENOTSUP) return rc;
        }
        if (rc == RX_ENOTSUP) {
            if ((rc = s_weight_rows (m, src, LL_NAME ("attn_q.weight"), E, nq, q0, q1, &L->wq, err))) return rc;
            if ((rc = s_weight_rows (m, src, LL_NAME ("attn_k.weight"), E, nk, k0, k1, &L->wk, err))) return rc;
            if ((rc = s_weight_rows (m, src, LL_NAME ("attn_v.weight"), E, nv_, v0, v1, &L->wv, err))) return rc;
        }
        if ((rc = s_vector_part (m, src, LL_NAME ("attn_q.bias"), nq, q0, q1, !bias, &L->bq, err))) return rc;
        if ((rc = s_vector_part (m, src, LL_NAME ("attn_k.bias"), nk, k0, k1, !bias, &L->bk, err))) return rc;
        if ((rc = s_vector_part (m, src, LL_NAME ("attn_v.bias"), nv_, v0, v1, !bias, &L->bv, err))) return rc;
        if ((rc = s_weight_cols (m, src, LL_NAME ("attn_output.weight"), no, E, o0, o1, &L->wo, err))) return rc;
        if ((rc = s_vector (m, src, LL_NAME ("ffn_norm.weight"), E, 0, &L->ffn_norm, err))) return rc;
        if (m->n_expert > 0) {
            const int64_t NE = m->n_expert, FE = m->n_ff_exp;
            if ((rc = s_weight (m, src, LL_NAME ("ffn_gate_inp.weight"), E, NE, 0, &L->gate_inp, err))) return rc;
            if ((rc = s_weight3 (m, src, LL_NAME ("ffn_gate_exps.weight"), E, FE, NE, &L->gate_exps, err))) return rc;
            if ((rc = s_weight3 (m, src, LL_NAME ("ffn_up_exps.weight"), E, FE, NE, &L->up_exps, err))) return rc;
            if ((rc = s_weight3 (m, src, LL_NAME ("ffn_down_exps.weight"), FE, E, NE, &L->down_exps, err))) return rc;
            continue;
        }
        rc = RX_ENOTSUP;
        if (m->fuse && !m->dp_attn) {   /* DP attention's FFN (models/dp_ffn.h) takes gate and up apart */
            struct ll_part gu[2] = { { "", F, sp->f0, sp->f1 }, { "", F, sp->f0, sp->f1 } };
            snprintf (gu[0].name, sizeof gu[0].name, "blk.%d.ffn_gate.weight", (int) l);
            snprintf (gu[1].name, sizeof gu[1].name, "blk.%d.ffn_up.weight", (int) l);
            rc = s_weight_fused (m, src, gu, 2, E, &L->w_gu, err);
            if (rc != RX_OK && rc != RX_ENOTSUP) return rc;
        }
        if (rc == RX_ENOTSUP) {
            if ((rc = s_weight_rows (m, src, LL_NAME ("ffn_gate.weight"), E, F, sp->f0, sp->f1, &L->w_gate, err))) return rc;
            if ((rc = s_weight_rows (m, src, LL_NAME ("ffn_up.weight"), E, F, sp->f0, sp->f1, &L->w_up, err))) return rc;
        }
        if ((rc = s_weight_cols (m, src, LL_NAME ("ffn_down.weight"), F, E, sp->f0, sp->f1, &L->w_down, err))) return rc;
#undef LL_NAME
    }
    return RX_OK;
}

/* This rank's heads and FFN columns (see the header comment); sets n_head,
 * n_kv_head and n_ff to this rank's counts. */
static int s_split (struct ll_model *m, const struct rx_model_src *src, struct rx_err *err)
{
    const int32_t N = m->n_rank, r = m->rank;
    m->n_head_all = m->n_head;
    m->n_kv_head_all = m->n_kv_head;
    m->n_ff_all = m->n_ff;
    struct ll_split *sp = &m->sp;
    if (m->dp_attn) {
        /* DP attention: every head on every rank (the FFN split below). */
        sp->kv0 = 0;
        sp->kv1 = m->n_kv_head;
        sp->q0 = 0;
        sp->q1 = m->n_head;
    } else if (N > m->n_kv_head)
        return rx_err_set (err, RX_ENOTSUP,
                           "%s: model-llama: tensor parallelism over %d ranks needs at least %d KV heads; the model has %d (%s.attention.head_count_kv)",
                           src->path, N, N, m->n_kv_head, m->arch);
    if (!m->dp_attn) {
        const int32_t G = m->n_head / m->n_kv_head;
        sp->kv0 = (int32_t) ((int64_t) r * m->n_kv_head / N);
        sp->kv1 = (int32_t) ((int64_t) (r + 1) * m->n_kv_head / N);
        sp->q0 = sp->kv0 * G;
        sp->q1 = sp->kv1 * G;
    }
    /* FFN columns split on ffn_down's blocks (the largest block of any
     * layer: block sizes 1, 32, 256 divide each other), so that its
     * column slice can be packed. */
    size_t blk = 1;
    for (int32_t l = 0; l < m->n_layer && N > 1; l++) {
        char n[96];
        struct rx_weight_view v;
        snprintf (n, sizeof n, "blk.%d.ffn_down.weight", (int) l);
        if (src->tensor (src, n, &v) == RX_OK && rx_dtype_block (v.dtype) > blk)
            blk = rx_dtype_block (v.dtype);
    }
    const int64_t nb = m->n_ff / (int64_t) blk;
    if (nb < N)
        return rx_err_set (err, RX_ENOTSUP,
                           "%s: model-llama: %s: n_ff %d in blocks of %zu (ffn_down) cannot be split over %d ranks",
                           src->path, m->dp_attn ? "DP attention" : "tensor parallelism", m->n_ff, blk, N);
    sp->f0 = (int32_t) ((int64_t) r * nb / N * (int64_t) blk);
    sp->f1 = r + 1 == N ? m->n_ff : (int32_t) ((int64_t) (r + 1) * nb / N * (int64_t) blk);
    m->n_head = sp->q1 - sp->q0;
    m->n_kv_head = sp->kv1 - sp->kv0;
    m->n_ff = sp->f1 - sp->f0;
    return RX_OK;
}

static void s_graph_mode (struct ll_model *m, const char *path);

static int s_create (const struct rx_host *host, const struct rx_model_src *src,
                     const struct rx_model_env *env, void **out, struct rx_err *err)
{
    *out = NULL;
    if (!host || !src || !env || !env->k.ops || !env->attn)
        return rx_err_set (err, RX_EINVAL, "model-llama: create: NULL host, source, kernels or attention");
    if (src->struct_size < offsetof (struct rx_model_src, tensor) + sizeof src->tensor
        || env->struct_size < offsetof (struct rx_model_env, n_rank) + sizeof env->n_rank)
        return rx_err_set (err, RX_EABI, "model-llama: create: source or environment struct too short");
    if (env->n_rank < 1 || env->rank < 0 || env->rank >= env->n_rank)
        return rx_err_set (err, RX_EINVAL, "model-llama: create: rank %d of %d", env->rank, env->n_rank);
    if (env->n_rank > 1
        && (env->struct_size < offsetof (struct rx_model_env, comm_inst) + sizeof env->comm_inst
            || !env->comm || !env->comm_inst || !env->comm->all_reduce))
        return rx_err_set (err, RX_EINVAL, "model-llama: create: rank %d of %d without a comm instance",
                           env->rank, env->n_rank);
    const char *arch;
    size_t alen;
    if (src->get_str (src, "general.architecture", &arch, &alen) != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: model-llama: missing general.architecture", src->path);
    enum ll_arch kind;
    if (alen == 5 && memcmp (arch, "llama", 5) == 0) kind = LL_LLAMA;
    else if (alen == 5 && memcmp (arch, "qwen2", 5) == 0) kind = LL_QWEN2;
    else
        return rx_err_set (err, RX_ENOTSUP, "%s: model-llama: architecture \"%.*s\" is not handled (llama, qwen2)",
                           src->path, (int) (alen > 32 ? 32 : alen), arch);

    struct ll_model *m = s_zalloc (host, sizeof *m);
    if (!m) return rx_err_set (err, RX_ENOMEM, "model-llama: out of memory");
    m->host = host;
    m->k = env->k;
    m->attn_ops = env->attn;
    m->path = src->path;
    m->kind = kind;
    memcpy (m->arch, arch, alen);
    m->rank = env->rank;
    m->n_rank = env->n_rank;
    if (env->struct_size >= offsetof (struct rx_model_env, dp_attn) + sizeof env->dp_attn
        && env->dp_attn && env->n_rank > 1) {
        if (!env->comm->all_gather || !env->comm->reduce_scatter) {
            s_destroy (m);
            return rx_err_set (err, RX_EINVAL, "model-llama: create: DP attention rank %d of %d: the comm plugin lacks all_gather or reduce_scatter",
                               env->rank, env->n_rank);
        }
        m->dp_attn = 1;
        m->dp_cnt_h = s_zalloc (host, (size_t) env->n_rank * sizeof *m->dp_cnt_h);
        if (!m->dp_cnt_h) {
            s_destroy (m);
            return rx_err_set (err, RX_ENOMEM, "model-llama: out of memory");
        }
    }
    if (m->n_rank > 1) {
        m->comm = env->comm;
        m->comm_inst = env->comm_inst;
    }
    m->ep_size = 1;
    if (env->struct_size >= offsetof (struct rx_model_env, ep_size) + sizeof env->ep_size
        && env->ep_size > 1) {
        if (!m->dp_attn || env->ep_size != m->n_rank) {
            s_destroy (m);
            return rx_err_set (err, RX_EINVAL,
                               "%s: model-llama: create: ep_size %d needs DP attention with ep_size = the %d ranks",
                               src->path, env->ep_size, m->n_rank);
        }
        m->ep_size = env->ep_size;
    }
    if (env->struct_size >= offsetof (struct rx_model_env, moe_max_tokens) + sizeof env->moe_max_tokens
        && env->moe && env->moe->create && env->moe->destroy && env->moe->dispatch
        && env->moe->combine) {
        m->moe_ops = env->moe;
        m->moe_host = env->moe_host ? env->moe_host : host;
        m->moe_max_tokens = env->moe_max_tokens > 0 ? env->moe_max_tokens : 0;
    }
    int grc = rx_model_graphs_init (&m->graphs, host, env, LL_GRAPH_TAG, "model-llama", err);
    if (grc != RX_OK) {
        s_destroy (m);
        return grc;
    }
    m->tbo = env->struct_size >= offsetof (struct rx_model_env, two_batch_overlap) + sizeof env->two_batch_overlap
             && env->two_batch_overlap;
    int rc = s_fuse_mode (m, err);
    if (rc == RX_OK) rc = s_hparams (m, src, err);
    if (rc == RX_OK) rc = s_split (m, src, err);
    if (rc == RX_OK) rc = s_weights (m, src, err);
    if (rc == RX_OK && m->n_expert > 0)
        rc = rx_moe_place_init (&m->place, "model-llama", env, m->n_layer, m->n_expert, err);
    if (rc == RX_OK) {
        struct rx_attn_config c = {
            .struct_size = sizeof c, .kv_kind = RX_ATTN_KV_HEADS, .n_layer = m->n_layer,
            .n_head = m->n_head, .n_kv_head = m->n_kv_head, .hd_k = m->hd_k, .hd_v = m->hd_v,
            .kv_dtype = env->kv_dtype, .scale = 1.0f / sqrtf ((float) m->hd_k),
            .softcap = 0, .window = 0,
        };
        rc = env->attn->create (env->attn_host ? env->attn_host : host, &m->k, &c, &m->attn, err);
    }
    if (rc != RX_OK) {
        s_destroy (m);
        return rc;
    }
    if (m->n_rank > 1)
        RX_HLOG (host, RX_LOG_DEBUG,
                 "%s: %s rank %d of %d: query heads %d..%d, KV heads %d..%d, FFN columns %d..%d",
                 src->path, m->dp_attn ? "DP-attention" : "tensor-parallel", m->rank, m->n_rank, m->sp.q0, m->sp.q1 - 1, m->sp.kv0, m->sp.kv1 - 1,
                 m->sp.f0, m->sp.f1 - 1);
    RX_HLOG (host, RX_LOG_DEBUG,
             "%s: %s, %d layers, n_embd %d, n_ff %d, heads %d/%d, head dim %d, vocab %d, rope %s n_rot %d base %g scale %g, %s embeddings",
             src->path, m->arch, m->n_layer, m->n_embd, m->n_ff_all, m->n_head_all, m->n_kv_head_all, m->hd_k,
             m->n_vocab, m->rope.mode == RX_ROPE_NEOX ? "neox" : "normal", m->rope.n_rot,
             (double) m->rope.freq_base, (double) m->rope.freq_scale,
             m->output == m->tok_embd ? "tied" : "separate");
    if (m->fuse) {
        int32_t nqkv = 0, ngu = 0;
        for (int32_t l = 0; l < m->n_layer; l++) {
            nqkv += m->layers[l].wqkv != NULL;
            ngu += m->layers[l].w_gu != NULL;
        }
        RX_HLOG (host, RX_LOG_INFO, "%s: fused projections (fuse_weights): Q/K/V in %d of %d layers, gate/up in %d",
                 src->path, nqkv, m->n_layer, ngu);
    }
    s_graph_mode (m, src->path);
    if (m->tbo && m->n_expert > 0)
        RX_HLOG (host, RX_LOG_INFO, "%s: two-batch overlap on (%s)", src->path,
                 rx_tbo_has_async (m->moe_ops) ? "the dispatcher's exchanges overlap the other micro-batch"
                                               : "the dispatcher has no asynchronous ops: micro-batches run one after the other");
    *out = m;
    return RX_OK;
}

static int s_info (void *p, struct rx_model_info *info)
{
    struct ll_model *m = p;
    struct rx_model_info i = {
        .struct_size = info->struct_size, .arch = m->arch, .n_vocab = m->n_vocab,
        .n_ctx_train = m->n_ctx_train, .n_layer = m->n_layer, .n_embd = m->n_embd,
        .n_head = m->n_head, .n_kv_head = m->n_kv_head,
        .kv_bytes_per_token = m->attn_ops->kv_bytes_per_token (m->attn),
        .weight_bytes = m->weight_bytes, .n_params = m->n_params,
        .n_moe_layer = m->n_expert > 0 ? m->n_layer : 0, .n_expert = m->n_expert,
    };
    size_t n = info->struct_size < sizeof i ? info->struct_size : sizeof i;
    memcpy (info, &i, n);
    return RX_OK;
}

/* Two-batch overlap (models/tbo.h): micro-batch 1's dispatcher instance
 * (the same config as m->moe's) and the rebased index arrays; nothing when
 * TBO is off or the model dense, no second instance without the
 * asynchronous ops (then the micro-batches run one after the other through
 * m->moe: still correct). */
static int s_tbo_reserve (struct ll_model *m, struct rx_err *err)
{
    if (!m->tbo || m->n_expert == 0 || !m->moe) return RX_OK;
    struct rx_moe_config mc = {
        .struct_size = sizeof mc, .n_expert = m->moe_n_phys, .n_expert_used = m->n_expert_used,
        .n_embd = m->n_embd, .max_tokens = m->moe_chunk, .ep_rank = m->ep_size > 1 ? m->rank : 0,
        .ep_size = m->ep_size, .kops = m->k.ops, .kbe = m->k.be, .stream = m->k.stream,
        .comm = m->ep_size > 1 ? m->comm : NULL, .comm_inst = m->ep_size > 1 ? m->comm_inst : NULL,
    };
    return rx_tbo_reserve (&m->tbo_state, &m->k, m->host, m->max_tokens, m->moe_ops, m->moe_host, &mc,
                           "model-llama", err);
}

static int s_reserve (void *p, uint64_t n_slots, int32_t max_tokens, struct rx_err *err)
{
    struct ll_model *m = p;
    if (n_slots == 0 || n_slots > INT32_MAX || max_tokens <= 0 || max_tokens > (1 << 24))
        return rx_err_set (err, RX_EINVAL, "model-llama: reserve: %llu slots (1 .. %d), %d tokens per step (1 .. %d)",
                           (unsigned long long) n_slots, INT32_MAX, max_tokens, 1 << 24);
    s_free_scratch (m);
    m->n_slots = 0;
    /* DP-attention graphs pad with slot n_slots: one pool row more. */
    int rc = m->attn_ops->kv_alloc (m->attn, n_slots + (m->graphs.dp ? 1 : 0), err);
    if (rc != RX_OK) return rc;
    const size_t T = (size_t) max_tokens;
    const size_t qd = (size_t) m->n_head * m->hd_k, kd = (size_t) m->n_kv_head * m->hd_k,
                 vd = (size_t) m->n_kv_head * m->hd_v, od = (size_t) m->n_head * m->hd_v;
    /* Each buffer rounded to 16 floats (64 bytes) so every one is aligned. */
    const size_t ff = (size_t) (m->n_ff_exp > m->n_ff ? m->n_ff_exp : m->n_ff);
    const size_t NE = (size_t) m->n_expert, KU = (size_t) m->n_expert_used;
#define LL_R(n) (((n) + 15) & ~(size_t) 15)
    /* The MoE router logits, top-k weights and top-k ids (int32, same size
     * as a float) are empty for a dense model. */
    /* DP attention: the FFN runs over the rows of every rank (N*T), in
     * gate/up and the gathered/partial blocks dp_g, dp_d; dp_cnt holds the
     * ranks' row counts (int32). */
    const size_t DN = m->dp_attn ? (size_t) m->n_rank : 0, FT = DN ? DN * T : T;
    size_t sizes[15] = { LL_R (T * m->n_embd), LL_R (T * m->n_embd), LL_R (T * qd), LL_R (T * kd),
                         LL_R (T * vd), LL_R (T * od), LL_R (FT * ff), LL_R (FT * ff),
                         LL_R (T * m->n_embd), LL_R (T * NE), LL_R (T * KU), LL_R (T * KU),
                         LL_R (DN * T * m->n_embd), LL_R (DN * T * m->n_embd), LL_R (DN) };
#undef LL_R
    size_t total = 0;
    for (int i = 0; i < 15; i++) total += sizes[i];
    void *mem;
    rc = m->k.ops->alloc (m->k.be, total * sizeof (float), 64, &mem, err);
    if (rc != RX_OK)
        return rx_err_set (err, rc, "model-llama: cannot allocate %.1f MiB of activations for %d tokens per step",
                           (double) total * 4 / (1024.0 * 1024.0), max_tokens);
    m->f32_mem = mem;
    float *f = mem;
    float *topi = NULL, *cnt = NULL;
    float **bufs[15] = { &m->x, &m->h, &m->q, &m->kk, &m->v, &m->att, &m->gate, &m->up, &m->hout,
                         &m->router, &m->topw, &topi, &m->dp_g, &m->dp_d, &cnt };
    for (int i = 0; i < 15; i++) {
        *bufs[i] = f;
        f += sizes[i];
    }
    m->topi = (int32_t *) topi;
    m->dp_cnt = (int32_t *) cnt;
    if (m->dp_attn) {
        /* The padding rows of a gathered block are never written by this
         * rank: zero them once so no uninitialized (or NaN) value is read. */
        rc = m->k.ops->memset_ (m->k.be, m->k.stream, mem, 0, total * sizeof (float), err);
        if (rc != RX_OK) {
            s_free_scratch (m);
            return rc;
        }
    }
    m->max_tokens = max_tokens;
    if (m->n_expert > 0) {
        /* One dispatcher instance for every MoE layer (they share its
         * buffers: the layers run one after another). */
        int32_t chunk = m->moe_max_tokens > 0 && m->moe_max_tokens < max_tokens ? m->moe_max_tokens
                                                                                  : max_tokens;
        const int32_t n_phys = rx_moe_place_n_physical (&m->place, m->n_expert);
        if ((rc = rx_moe_place_reserve (&m->place, "model-llama", T * KU, err)) != RX_OK) {
            s_free_scratch (m);
            return rc;
        }
        struct rx_moe_config mc = {
            .struct_size = sizeof mc, .n_expert = n_phys, .n_expert_used = m->n_expert_used,
            .n_embd = m->n_embd, .max_tokens = chunk, .ep_rank = m->ep_size > 1 ? m->rank : 0,
            .ep_size = m->ep_size, .kops = m->k.ops, .kbe = m->k.be, .stream = m->k.stream,
            .comm = m->ep_size > 1 ? m->comm : NULL, .comm_inst = m->ep_size > 1 ? m->comm_inst : NULL,
        };
        if ((rc = m->moe_ops->create (m->moe_host, &mc, &m->moe, err)) != RX_OK) {
            m->moe = NULL;
            s_free_scratch (m);
            return rc;
        }
        m->moe_chunk = chunk;
        m->moe_n_phys = n_phys;
        if ((rc = s_tbo_reserve (m, err)) != RX_OK) {
            s_free_scratch (m);
            return rc;
        }
    }
    size_t cap = (size_t) n_slots + T;
    rc = rx_model_stage_alloc (&m->stage, m->host, &m->k, max_tokens, cap, "model-llama", err);
    if (rc == RX_OK && m->graphs.dp) {
        const size_t rows = (size_t) (m->graphs.max_bs < max_tokens ? m->graphs.max_bs : max_tokens);
        void *d;
        rc = m->k.ops->alloc (m->k.be, rows * (size_t) m->n_vocab * sizeof (float), 64, &d, err);
        if (rc == RX_OK) m->dp_logits = d;
    }
    if (rc != RX_OK) {
        s_free_scratch (m);
        return rc;
    }
    m->n_slots = n_slots;
    return RX_OK;
}

/* ---------------------------------------------------------------- forward -- */

static int s_check_batch (const struct ll_model *m, const struct rx_model_batch *b,
                          struct rx_err *err)
{
    return rx_model_batch_check ("model-llama", b, m->max_tokens, m->n_vocab, m->n_slots, m->dp_attn, err);
}

#define LL_TRY(expr) do { int rc_ = (expr); if (rc_ != RX_OK) return rc_; } while (0)

/* x += in W^T for a row-parallel W (attn_output, ffn_down).  With several
 * ranks each holds a partial product: it goes to hout (free until the
 * output rows are gathered), is summed over the ranks, then added to the
 * residual once. */
static int s_row_parallel (struct ll_model *m, const rx_kweight_t *w, const float *in,
                           size_t ld_in, size_t nn, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    const size_t E = (size_t) m->n_embd;
    if (m->n_rank == 1 || m->dp_attn)   /* DP attention: Wo is whole (w_down goes through s_dp_ffn) */
        return K->matmul (m->k.be, m->k.stream, w, -1, in, ld_in, m->x, E, nn, RX_MM_ACCUMULATE, err);
    LL_TRY (K->matmul (m->k.be, m->k.stream, w, -1, in, ld_in, m->hout, E, nn, 0, err));
    LL_TRY (m->comm->all_reduce (m->comm_inst, m->k.stream, m->hout, m->hout, nn * E, RX_F32,
                                 RX_COMM_SUM, err));
    return K->add (m->k.be, m->k.stream, m->x, E, m->hout, E, m->x, E, nn, E, err);
}

/* x += MoE(h) for the nn rows of m->h (Mixtral routing): router logits
 * h Wr^T, the top k of them, their softmax as the weights (= softmax over
 * every expert, the top k renormalized to sum 1, as the selection is the
 * same and p_i / sum_j p_j = exp(l_i) / sum_j exp(l_j)); then through the
 * dispatcher, in chunks of its max_tokens: each local expert e with rows
 * runs down(silu(gate_e x) * up_e x) on its rows of routed.x into
 * routed.y, and combine adds the weighted sum to the residual.  group_rows:
 * the group's largest row count (DP attention: every rank makes the same
 * number of dispatch calls, nn may be 0), else nn. */
/* The router of rows [r0, r0 + nn) of m->h: logits, top k, their
 * softmax into the same rows of topw / topi, then the EPLB count and
 * mapping.  (Split from s_moe_ffn so that two-batch overlap routes each
 * micro-batch's rows on its own.) */
static int s_moe_route (struct ll_model *m, const struct ll_layer *L, size_t r0, size_t nn,
                        struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = (size_t) m->n_embd, NE = (size_t) m->n_expert, KU = (size_t) m->n_expert_used;
    if (nn == 0) return RX_OK;
    LL_TRY (K->matmul (be, st, L->gate_inp, -1, m->h + r0 * E, E, m->router + r0 * NE, NE, nn, 0, err));
    LL_TRY (K->topk (be, st, m->router + r0 * NE, NE, nn, NE, KU, m->topw + r0 * KU, m->topi + r0 * KU, err));
    LL_TRY (K->softmax (be, st, m->topw + r0 * KU, KU, nn, KU, 1.0f, err));
    /* EPLB: count the logical choices, map them to physical slots. */
    return rx_moe_place_route (&m->place, &m->k, (int32_t) (L - m->layers), m->topi + r0 * KU, nn, KU,
                               m->rank, err);
}

/* The local experts over the rows a dispatch handed out (models/moe_experts.h). */
static int s_moe_experts (struct ll_model *m, const struct ll_layer *L, const struct rx_moe_routed *r,
                          struct rx_err *err)
{
    const struct rx_moe_expert_w w = {
        .gate = L->gate_exps, .up = L->up_exps, .down = L->down_exps, .g = m->gate, .u = m->up,
        .E = (size_t) m->n_embd, .FE = (size_t) m->n_ff_exp, .piece = (size_t) m->max_tokens,
    };
    return rx_moe_experts (&m->k, &m->place, (int32_t) (L - m->layers), r, &w, err);
}

static int s_moe_ffn (struct ll_model *m, const struct ll_layer *L, size_t nn, size_t group_rows,
                      struct rx_err *err)
{
    const size_t E = (size_t) m->n_embd, KU = (size_t) m->n_expert_used;
    LL_TRY (s_moe_route (m, L, 0, nn, err));
    for (size_t c0 = 0; c0 < group_rows; c0 += (size_t) m->moe_chunk) {
        /* cn 0: this rank has no rows left but a peer has (DP attention). */
        size_t cn = c0 >= nn ? 0 : nn - c0 < (size_t) m->moe_chunk ? nn - c0 : (size_t) m->moe_chunk;
        struct rx_moe_routed r = { .struct_size = sizeof r };
        /* DP attention: every rank's chunk c0 has at most this many rows
         * (moe.h group_max_tok: ep_auto's mode without a vote). */
        if (m->dp_attn)
            r.group_max_tok = (int32_t) (group_rows - c0 < (size_t) m->moe_chunk ? group_rows - c0 : (size_t) m->moe_chunk);
        const int dev = rx_moe_experts_device (&m->place, cn);
        if (dev) r.flags = RX_MOE_ROUTED_DEVICE;
        LL_TRY (m->moe_ops->dispatch (m->moe, m->h + c0 * E, E, (int32_t) cn, m->topi + c0 * KU,
                                      m->topw + c0 * KU, &r, err));
        if (dev) m->moe_dev_seen = r.d_offsets != NULL;
        LL_TRY (s_moe_experts (m, L, &r, err));
        LL_TRY (m->moe_ops->combine (m->moe, m->x + c0 * E, E, RX_MM_ACCUMULATE, err));
    }
    return RX_OK;
}

/* DP attention: all-gather the ranks' row counts (n = -1: this rank's
 * batch was refused, so that every rank fails at once instead of waiting
 * in the first layer's gather).  *M = the largest count. */
/* The DP-attention view of this model for models/dp_ffn.h. */
static struct rx_dp_ffn s_dp_view (const struct ll_model *m)
{
    return (struct rx_dp_ffn) {
        .who = "model-llama", .k = m->k, .comm = m->comm, .comm_inst = m->comm_inst,
        .rank = m->rank, .n_rank = m->n_rank, .max_tokens = m->max_tokens, .cnt = m->dp_cnt,
        .cnt_h = m->dp_cnt_h, .x = m->x, .g = m->dp_g, .d = m->dp_d, .gate = m->gate, .up = m->up,
        .hout = m->hout, .E = (size_t) m->n_embd, .F = (size_t) m->n_ff, .eps = m->eps,
    };
}

static int s_dp_counts (struct ll_model *m, int32_t n, int graph_ok, int32_t *M, int *graph_all,
                        struct rx_err *err)
{
    struct rx_dp_ffn v = s_dp_view (m);
    return rx_dp_counts_graph (&v, n, graph_ok, M, graph_all, err);
}

/* Graphs with several ranks (models/graph.h rx_model_graphs_ranks): under
 * DP attention also no two-batch overlap and an attention backend without
 * a host-side prepare.  An MoE model's steps replay once its dispatcher
 * gives device offsets (s_dp_graph_step): moe-local, and with expert
 * parallelism moe-ep_low_latency or moe-ep_auto (told group_max_tok) on a
 * backend with the low-latency ops (ep_normal exchanges counts through
 * the host: never). */
static void s_graph_mode (struct ll_model *m, const char *path)
{
    const char *why = NULL;
    if (m->dp_attn && m->n_expert > 0 && m->tbo)
        why = "two-batch overlap";
    else if (m->dp_attn && RX_HAS (struct rx_attn_ops, m->attn_ops, prepare))
        why = "the attention backend prepares on the host";
    rx_model_graphs_ranks (&m->graphs, path, m->rank, m->n_rank, m->dp_attn, why, m->comm, m->comm_inst);
}

/* DP attention: x += FFN(rms_norm(x)) for this rank's n rows (n may be 0,
 * an idle rank), the FFN columns split over the ranks: each rank's rows
 * padded to M are gathered into dp_g ([N*M][E], this rank's block normed
 * in place), this rank's FFN slice runs over all N*M rows into dp_d, and
 * the reduce-scatter hands each rank the summed output of its own block. */
static int s_dp_ffn (struct ll_model *m, const struct ll_layer *L, size_t n, size_t M,
                     struct rx_err *err)
{
    struct rx_dp_ffn v = s_dp_view (m);
    return rx_dp_ffn (&v, L->ffn_norm, L->w_gate, L->w_up, L->w_down, n, M, err);
}

/* The attention half of layer l for rows [r0, r0 + nn) of the batch (ab
 * describes exactly those rows' sequences; d_pos and d_new point at their
 * rows): x += attention(rms_norm(x)) Wo^T, then h = rms_norm(x) * ffn_norm
 * (the FFN's input).  r0 > 0 only in two-batch overlap, which runs MoE
 * models only: no tensor parallelism there, so Wo is whole. */
static int s_attn (struct ll_model *m, const struct ll_layer *L, int32_t l, const struct rx_attn_batch *ab,
                   const int32_t *d_pos, const int32_t *d_new, size_t r0, size_t nn, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = (size_t) m->n_embd;
    const size_t qd = (size_t) m->n_head * m->hd_k, kd = (size_t) m->n_kv_head * m->hd_k,
                 vd = (size_t) m->n_kv_head * m->hd_v, od = (size_t) m->n_head * m->hd_v;
    float *x = m->x + r0 * E, *h = m->h + r0 * E, *att = m->att + r0 * od;
    LL_TRY (K->rms_norm (be, st, x, E, L->attn_norm, h, E, nn, E, m->eps, err));
    float *q, *kk, *v;
    size_t ldq = qd, ldk = kd, ldv = vd;
    if (L->wqkv) {
        /* One matmul into rows of [Q | K | V] over the q, kk, v buffers
         * (contiguous, reserve() sized them for it); Q's heads and K's are
         * adjacent, so one rope call turns both. */
        ldq = ldk = ldv = qd + kd + vd;
        q = m->q + r0 * ldq;
        kk = q + qd;
        v = kk + kd;
        LL_TRY (K->matmul (be, st, L->wqkv, -1, h, E, q, ldq, nn, 0, err));
    } else {
        q = m->q + r0 * qd;
        kk = m->kk + r0 * kd;
        v = m->v + r0 * vd;
        LL_TRY (K->matmul (be, st, L->wq, -1, h, E, q, qd, nn, 0, err));
        LL_TRY (K->matmul (be, st, L->wk, -1, h, E, kk, kd, nn, 0, err));
        LL_TRY (K->matmul (be, st, L->wv, -1, h, E, v, vd, nn, 0, err));
    }
    if (L->bq) LL_TRY (K->add (be, st, q, ldq, L->bq, 0, q, ldq, nn, qd, err));
    if (L->bk) LL_TRY (K->add (be, st, kk, ldk, L->bk, 0, kk, ldk, nn, kd, err));
    if (L->bv) LL_TRY (K->add (be, st, v, ldv, L->bv, 0, v, ldv, nn, vd, err));
    if (L->wqkv)
        LL_TRY (K->rope (be, st, q, ldq, nn, (size_t) (m->n_head + m->n_kv_head), (size_t) m->hd_k, d_pos,
                         &m->rope, err));
    else {
        LL_TRY (K->rope (be, st, q, qd, nn, (size_t) m->n_head, (size_t) m->hd_k, d_pos, &m->rope, err));
        LL_TRY (K->rope (be, st, kk, kd, nn, (size_t) m->n_kv_head, (size_t) m->hd_k, d_pos, &m->rope, err));
    }
    const struct rx_attn_io io = {
        .struct_size = sizeof io, .q = q, .ldq = ldq, .k = kk, .ldk = ldk, .v = v, .ldv = ldv,
        .out = att, .ldo = od,
    };
    LL_TRY (m->attn_ops->forward (m->attn, l, ab, d_new, &io, err));
    if (r0 == 0) LL_TRY (s_row_parallel (m, L->wo, att, od, nn, err));
    else LL_TRY (K->matmul (be, st, L->wo, -1, att, od, x, E, nn, RX_MM_ACCUMULATE, err));
    if (m->dp_attn && !L->gate_exps) return RX_OK;   /* s_dp_ffn norms the gathered rows itself */
    return K->rms_norm (be, st, x, E, L->ffn_norm, h, E, nn, E, m->eps, err);
}

/* logits = (rms_norm(x) * output_norm) Wout^T for the rows b asks for
 * (models/batch.h); hout is free after the layers. */
static int s_logits (struct ll_model *m, const struct rx_model_batch *b, struct rx_err *err)
{
    return rx_model_logits (&m->k, b, m->x, m->hout, (size_t) m->n_embd, m->output_norm, m->eps, m->output,
                            m->n_vocab, err);
}

/* ------------------------------------------------------ two-batch overlap -- */

/* models/tbo.h's stage A for micro-batch b of layer l: attention + router
 * over its rows. */
static int s_tbo_front (void *p, int32_t l, const struct rx_tbo_mb *b, struct rx_err *err)
{
    struct ll_model *m = p;
    LL_TRY (s_attn (m, &m->layers[l], l, &b->ab, b->d_pos, b->d_new, b->r0, b->n, err));
    return s_moe_route (m, &m->layers[l], b->r0, b->n, err);
}

static int s_tbo_experts (void *p, int32_t l, const struct rx_moe_routed *rt, struct rx_err *err)
{
    struct ll_model *m = p;
    return s_moe_experts (m, &m->layers[l], rt, err);
}

/* Whether this step runs as two micro-batches: an MoE model with TBO on,
 * and -- alone -- at least 2 sequences; under DP attention always while a
 * rank of the group has rows (M > 0), whatever this rank's batch, so every
 * rank makes the same collective calls (1 sequence: (all, empty); idle:
 * two empties). */
static int s_tbo_on (const struct ll_model *m, const struct rx_model_batch *b, int32_t M)
{
    if (!m->tbo || m->n_expert == 0 || !m->tbo_state.idx) return 0;
    return m->dp_attn ? M > 0 : b->n_seq >= 2;
}

/* One step as two micro-batches: every layer is MoE, so all run on
 * models/tbo.h's schedule (rx_tbo_layers), then the logits once on the
 * whole batch. */
static int s_forward_tbo (struct ll_model *m, const struct rx_model_batch *b, int32_t M, struct rx_err *err)
{
    const int32_t n = b->n_tokens, T = m->max_tokens;
    struct rx_tbo *t = &m->tbo_state;
    if (t->moe2_n_phys != m->moe_n_phys) LL_TRY (s_tbo_reserve (m, err));   /* placement changed */
    struct rx_model_batch_dev dv;
    if (n > 0) LL_TRY (rx_model_stage_upload (&m->stage, m->host, &m->k, T, b, "model-llama", &dv, err));
    struct rx_tbo_mb mb[2];
    LL_TRY (rx_tbo_plan (mb, m->moe, t->moe2 && rx_tbo_has_async (m->moe_ops) ? t->moe2 : m->moe, b,
                         n > 0 ? &dv : NULL, t, &m->k, T, err));
    if (n > 0)
        LL_TRY (m->k.ops->get_rows (m->k.be, m->k.stream, m->tok_embd, dv.tokens, (size_t) n, m->x,
                                    (size_t) m->n_embd, err));
    const struct rx_tbo_model v = {
        .model = m, .front = s_tbo_front, .experts = s_tbo_experts, .moe_ops = m->moe_ops,
        .attn_ops = m->attn_ops, .attn = m->attn, .host = m->host, .h = m->h, .x = m->x, .ids = m->topi,
        .wts = m->topw, .E = (size_t) m->n_embd, .k = (size_t) m->n_expert_used,
        .chunk = (size_t) m->moe_chunk, .dp_attn = m->dp_attn,
    };
    LL_TRY (rx_tbo_layers (&v, mb, 0, m->n_layer, M, err));
    return n > 0 ? s_logits (m, b, err) : RX_OK;
}

static int s_forward_eager (struct ll_model *m, const struct rx_model_batch *b,
                            const struct rx_model_batch_dev *dvp, int32_t M, struct rx_err *err);

/* CUDA graphs (models/graph.h): decode steps of one rank, or of a
 * tensor-parallel rank whose comm captures its all-reduces (s_graph_mode;
 * every rank decides alike: they run the same batch), with an attention
 * backend without a host-side prepare,
 * and a dense model or one whose MoE layers run without a host copy
 * (models/moe_experts.h: the dispatcher sorted on the device the last time
 * it was asked, no placement or counting, n within the device path's
 * bound). */
static int s_graph_step (const struct ll_model *m, const struct rx_model_batch *b)
{
    return rx_model_graphs_shape (&m->graphs, b) && (m->n_rank == 1 || m->graphs.tp) &&
           (m->n_expert == 0 || (m->moe_dev_seen && rx_moe_experts_device (&m->place, (size_t) b->n_tokens))) &&
           !RX_HAS (struct rx_attn_ops, m->attn_ops, prepare);
}

/* The eager step a graph captures; under DP attention b is the padded
 * batch, whose M rows are every rank's block size. */
static int s_graph_eager (void *p, const struct rx_model_batch *b, const struct rx_model_batch_dev *dv,
                          struct rx_err *err)
{
    const struct ll_model *m = p;
    return s_forward_eager (p, b, dv, m->dp_attn ? b->n_tokens : 0, err);
}

/* This rank's half of the DP-attention graph decision (models/graph.h
 * rx_model_graphs_dp_step): an MoE model's layers also run without a host
 * copy (as s_graph_step; the padded step has at most max_bs rows). */
static int s_dp_graph_step (const struct ll_model *m, const struct rx_model_batch *b)
{
    return rx_model_graphs_dp_step (&m->graphs, b) &&
           (m->n_expert == 0 || (m->moe_dev_seen && rx_moe_experts_device (&m->place, (size_t) m->graphs.max_bs)));
}

static int s_forward (void *p, const struct rx_model_batch *b, struct rx_err *err)
{
    struct ll_model *m = p;
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
    /* (M <= max_bs holds when every rank has the same max_bs; a rank that
     * runs op by op beside replaying ones still makes the same collective
     * calls, so the guard is safe either way.) */
    if (dp_graph && M <= m->graphs.max_bs) {
        const struct rx_model_padded pd = {
            .pad = &m->pad, .stage = &m->stage, .max_tokens = m->max_tokens, .pad_slot = (int32_t) m->n_slots,
            .n_vocab = m->n_vocab, .logits = m->dp_logits, .who = "model-llama",
        };
        return rx_model_graphs_run_padded (&m->graphs, &m->k, m, s_graph_eager, &pd, b, M, err);
    }
    if (s_tbo_on (m, b, M)) return s_forward_tbo (m, b, M, err);
    if (b->n_tokens == 0) {
        /* Idle (DP attention): only the FFN collectives of every layer, and
         * none at all when every rank is idle. */
        for (int32_t l = 0; l < m->n_layer && M > 0; l++) {
            if (m->layers[l].gate_exps) LL_TRY (s_moe_ffn (m, &m->layers[l], 0, (size_t) M, err));
            else LL_TRY (s_dp_ffn (m, &m->layers[l], 0, (size_t) M, err));
        }
        return RX_OK;
    }
    struct rx_model_batch_dev dv;
    LL_TRY (rx_model_stage_upload (&m->stage, m->host, &m->k, m->max_tokens, b, "model-llama", &dv, err));
    if (s_graph_step (m, b)) {
        LL_TRY (rx_model_graphs_run (&m->graphs, &m->k, m, s_graph_eager, b, &dv, err));
        return rx_model_graphs_comm_check (&m->graphs, err);
    }
    return s_forward_eager (m, b, &dv, M, err);
}

/* One step's layers and logits, op by op (or being captured). */
static int s_forward_eager (struct ll_model *m, const struct rx_model_batch *b,
                            const struct rx_model_batch_dev *dvp, int32_t M, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const int32_t n = b->n_tokens;
    const struct rx_model_batch_dev dv = *dvp;
    const int32_t *d_tok = dv.tokens, *d_pos = dv.pos, *d_new = dv.new_slots;

    const struct rx_attn_batch ab = {
        .n_seq = b->n_seq, .n_tokens = n, .q_start = dv.q_start, .kv_start = dv.kv_start,
        .slots = dv.kv_slots, .q_pos = d_pos,
    };
    if (RX_HAS (struct rx_attn_ops, m->attn_ops, prepare))
        LL_TRY (m->attn_ops->prepare (m->attn, &ab, err));

    const size_t E = (size_t) m->n_embd, F = (size_t) m->n_ff;
    const size_t nn = (size_t) n;

    LL_TRY (K->get_rows (be, st, m->tok_embd, d_tok, nn, m->x, E, err));
    for (int32_t l = 0; l < m->n_layer; l++) {
        const struct ll_layer *L = &m->layers[l];
        LL_TRY (s_attn (m, L, l, &ab, d_pos, d_new, 0, nn, err));
        if (m->dp_attn && !L->gate_exps) {
            LL_TRY (s_dp_ffn (m, L, nn, (size_t) M, err));
            if (RX_HAS (struct rx_host, m->host, progress)) m->host->progress (m->host);
            continue;
        }
        if (L->gate_exps) {
            LL_TRY (s_moe_ffn (m, L, nn, m->dp_attn ? (size_t) M : nn, err));
        } else if (L->w_gu) {
            /* Rows of [gate | up] over the gate and up buffers (contiguous),
             * silu(gate) * up in place into each row's gate half. */
            LL_TRY (K->matmul (be, st, L->w_gu, -1, m->h, E, m->gate, 2 * F, nn, 0, err));
            LL_TRY (K->swiglu (be, st, m->gate, 2 * F, m->gate + F, 2 * F, m->gate, 2 * F, nn, F, err));
            LL_TRY (s_row_parallel (m, L->w_down, m->gate, 2 * F, nn, err));
        } else {
            LL_TRY (K->matmul (be, st, L->w_gate, -1, m->h, E, m->gate, F, nn, 0, err));
            LL_TRY (K->matmul (be, st, L->w_up, -1, m->h, E, m->up, F, nn, 0, err));
            LL_TRY (K->swiglu (be, st, m->gate, F, m->up, F, m->gate, F, nn, F, err));
            LL_TRY (s_row_parallel (m, L->w_down, m->gate, F, nn, err));
        }
        /* A long prefill is busy, not hung: tell radixd's watchdog. */
        if (RX_HAS (struct rx_host, m->host, progress)) m->host->progress (m->host);
    }
    return s_logits (m, b, err);
}

/* EPLB (radix/model.h set_placement): take the placement; a new slot
 * count re-creates the dispatcher with the same chunk. */
static int s_set_placement (void *p, const struct rx_moe_placement *pl, struct rx_err *err)
{
    struct ll_model *m = p;
    if (m->n_expert == 0)
        return rx_err_set (err, RX_EINVAL, "model-llama: set_placement: %s is not a mixture-of-experts model", m->arch);
    LL_TRY (rx_moe_place_set (&m->place, "model-llama", pl, m->n_layer, m->n_expert, err));
    const int32_t n_phys = rx_moe_place_n_physical (&m->place, m->n_expert);
    if (!m->moe || n_phys == m->moe_n_phys) return RX_OK;
    m->moe_ops->destroy (m->moe);
    m->moe = NULL;
    struct rx_moe_config mc = {
        .struct_size = sizeof mc, .n_expert = n_phys, .n_expert_used = m->n_expert_used,
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

static const char *const s_archs[] = { "llama", "qwen2", NULL };

static const struct rx_model_ops s_ops = {
    .struct_size = sizeof (struct rx_model_ops),
    .architectures = s_archs,
    .default_attention = NULL,   /* "mha" */
    .create = s_create,
    .destroy = s_destroy,
    .info = s_info,
    .reserve = s_reserve,
    .forward = s_forward,
    .set_placement = s_set_placement,
};

/* [model.llama] */
static const struct rx_cfg_key s_keys[] = {
    { "fuse_weights", RX_CFG_ENUM, "auto",
      "load Q/K/V and gate/up as one weight each (3 matmuls and a rope call fewer per layer, "
      "same results); auto = on for backends that copy weights at load (cuda), off for cpu "
      "(it would only add memory; also: environment RADIX_LLAMA_FUSE=0|1)", 0, 0, "auto|true|false" },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_MODEL, .name = "llama", .version = "0.1.0",
                  .description = "Llama-family transformers: Llama 2/3, Mistral, Mixtral-style MoE, TinyLlama, SmolLM2, Qwen2",
                  .keys = s_keys, .ops = &s_ops)
