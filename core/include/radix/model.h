/* radix/model.h -- the model-architecture kind (RX_KIND_MODEL).
 *
 * ABI: 1.0, being built (members may still be appended before the first
 * release; nothing below is reordered or retyped once released).
 *
 * A model plugin turns a GGUF file into a forward pass: it reads its
 * hyper-parameters and tensors through struct rx_model_src (implemented by
 * the core over its GGUF reader -- the plugin never links the core), loads
 * weights through the kernel backend, creates its attention instance (one
 * attention plugin, chosen by the core), and runs forward() over batches
 * that may mix prefill (several new tokens of a sequence) and decode (one
 * new token) sequences.  Every computation is a kernel-backend op, so the
 * same plugin runs on kernels-cpu and kernels-cuda.
 *
 * Life cycle (the core's model runner, core/engine.c):
 *   1. open the GGUF, read general.architecture, pick the model plugin whose
 *      `architectures` list has it (or the one [model] plugin names);
 *   2. pick the attention backend ([attention] backend; "auto" asks
 *      default_attention(arch), "mha" if that is NULL) and the kernels;
 *   3. create(): hyper-parameters, weights, attention instance;
 *   4. info(): shapes and KV bytes per token, to size the KV pool;
 *   5. reserve(n_slots, max_tokens): KV pool and activation scratch, sized
 *      once: forward() allocates nothing;
 *   6. forward() per step; 7. destroy().
 *
 * Batches.  A step carries n_tokens new tokens of n_seq sequences, grouped
 * by sequence: rows q_start[i] .. q_start[i+1]-1 belong to sequence i.  The
 * KV of sequence i -- its whole context, these new tokens included -- is the
 * slot list kv_slots[kv_start[i] .. kv_start[i+1]-1] (position p is
 * kv_slots[kv_start[i] + p]); new token t at position pos[t] writes its K/V
 * into slot kv_slots[kv_start[i] + pos[t]] and attends to positions
 * 0..pos[t].  Positions of a sequence's new tokens increase and are below
 * its KV length.  Logits are computed only for the rows out_rows[] (e.g. the
 * last token of each sequence, or every row for scoring), into a device
 * buffer [n_out][n_vocab] F32 owned by the caller.  The index arrays are
 * host memory: the model copies them to the device in one transfer (the
 * scheduler builds them on the host anyway; a CUDA plugin uploads them into
 * fixed buffers that a captured graph reads).
 *
 * Parallelism: rx_model_env carries rank / n_rank and the group's comm
 * plugin (a plugin that cannot split refuses n_rank > 1 at create).  Every
 * rank is given the same batches; each computes its share (heads, FFN
 * columns) and the row-parallel outputs are all-reduced, so every rank ends
 * with the same logits.  With env->dp_attn each rank instead runs its own
 * batches (DP attention, see rx_model_env.dp_attn) and gets the logits of
 * its own rows only.  Mixture-of-experts models route their expert rows
 * through the MoE dispatcher plugin the env carries (radix/moe.h).
 *
 * Thread-safety: create/destroy from one thread; one instance is driven by
 * one thread at a time.  Ownership: the instance owns its weights (kernel
 * weight handles), its attention instance and its scratch; the rx_model_src
 * and the GGUF mapping behind it must outlive the instance (zero-copy
 * weights point into the mapping). */
#ifndef RADIX_MODEL_H
#define RADIX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <radix/attn.h>
#include <radix/comm.h>
#include <radix/err.h>
#include <radix/host.h>
#include <radix/kernel.h>
#include <radix/moe.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The model file, as the core exposes it.  Every getter returns RX_OK,
 * RX_ENOENT when the key/tensor is absent, or RX_EINVAL when the stored type
 * does not fit the request (integers convert between widths when the value
 * fits, floats accept float32/float64; an integer that does not fit is
 * RX_ERANGE).  Strings point into the file (not NUL-terminated: use len)
 * and stay valid as long as the source.  Getters do not fill an rx_err: the
 * plugin names the key in its own message. */
struct rx_model_src {
    uint32_t    struct_size;   /* sizeof (struct rx_model_src) */
    void       *ctx;           /* core-private */
    const char *path;          /* the file, for messages */
    /* ---- ABI 1.0 ---- */
    int (*get_u32) (const struct rx_model_src *s, const char *key, uint32_t *out);
    int (*get_i64) (const struct rx_model_src *s, const char *key, int64_t *out);
    int (*get_f32) (const struct rx_model_src *s, const char *key, float *out);
    int (*get_bool) (const struct rx_model_src *s, const char *key, int *out);
    int (*get_str) (const struct rx_model_src *s, const char *key, const char **str,
                    size_t *len);
    /* Numeric arrays (per-layer values): length, then element i converted. */
    int (*arr_len) (const struct rx_model_src *s, const char *key, size_t *n);
    int (*arr_i64) (const struct rx_model_src *s, const char *key, size_t i, int64_t *out);
    int (*arr_f32) (const struct rx_model_src *s, const char *key, size_t i, float *out);
    /* A tensor as the view kernel weight_load() takes (data points into the
     * mapped file and stays valid as long as the source). */
    int (*tensor) (const struct rx_model_src *s, const char *name, struct rx_weight_view *out);
    /* ---- ABI 1.0 ends here.  Append only below. ---- */
};

/* Where the model runs.  Built by the core for create(). */
struct rx_model_env {
    uint32_t struct_size;                  /* sizeof (struct rx_model_env) */
    /* ---- ABI 1.0 ---- */
    struct rx_kctx k;                      /* the kernel backend (borrowed) */
    const struct rx_attn_ops *attn;        /* the attention backend's ops */
    const struct rx_host *attn_host;       /* ... and its host table (its INI section) */
    int32_t kv_dtype;                      /* [attention] kv_dtype: RX_F32 / RX_F16 */
    int32_t rank;                          /* tensor-parallel rank (0) */
    int32_t n_rank;                        /* tensor-parallel size (1) */
    int32_t reserved_;
    /* The tensor-parallel group's comm plugin (radix/comm.h) and instance;
     * NULL when n_rank == 1.  A plugin that splits across ranks reduces
     * its row-parallel outputs with comm->all_reduce (comm_inst, ...). */
    const struct rx_comm_ops *comm;
    void *comm_inst;
    /* The MoE dispatcher plugin ([moe] dispatcher, radix/moe.h) and its
     * host table (its [moe.<name>] section); NULL when the engine has none.
     * A mixture-of-experts model creates its dispatcher instance(s) from
     * these (create() takes moe_host); a dense model ignores them. */
    const struct rx_moe_ops *moe;
    const struct rx_host *moe_host;
    /* [moe] max_tokens_per_rank: the most tokens one dispatch carries (the
     * dispatcher's max_tokens); a model whose step is larger dispatches in
     * chunks.  0 = the max_tokens of reserve(). */
    int32_t moe_max_tokens;
    int32_t reserved2_;
    /* ---- ABI 1.0 ends here.  Append only below. ---- */
    /* 1 = DP attention over the comm group above (rank / n_rank / comm /
     * comm_inst then describe the DP group, not a tensor-parallel one):
     * every rank runs its OWN batches and holds its own KV, attention runs
     * locally with all heads, and only the dense FFN is split over the
     * ranks (as tensor parallelism splits it) -- the rows of every rank are
     * all-gathered before it and reduce-scattered back after it.  Every
     * rank must call forward() once per step of the group, with an idle
     * batch (n_tokens 0) when it has no work, so the collectives of every
     * layer always have all ranks.  0 (or absent: a shorter env) = the
     * tensor-parallel meaning of n_rank. */
    int32_t dp_attn;
    /* [parallel] ep_size: the expert-parallel size of an MoE model's
     * dispatcher.  1 (or 0, or absent: a shorter env) = every rank runs all
     * experts on its own rows (no exchange); with dp_attn it may be n_rank:
     * the dispatcher is created with ep_rank = rank, ep_size = n_rank and
     * the DP group's comm (the same instance: its collectives are ordered
     * with the model's), so experts are sharded over the ranks. */
    int32_t ep_size;
    /* Expert-distribution recording (EPLB, docs/eplb.md): a host array
     * [expert_count_layers][expert_count_experts] the core owns; after its
     * top-k, an MoE model adds to row i (its i-th MoE layer, dense blocks
     * not counted) one per (token, chosen logical expert) of this rank's
     * rows.  No allocation per token; a device backend copies the k ids of
     * each row down (kops->copy_d2h) to count them.  The core reads and
     * zeroes it between steps.  NULL (or absent: a shorter env) = not
     * recording.  A model with more MoE layers or experts than the array
     * has refuses at create. */
    int64_t *expert_count;
    int32_t expert_count_layers;
    int32_t expert_count_experts;
    /* [scheduler] two_batch_overlap: 1 = an MoE model splits each step's
     * batch into two micro-batches (models/tbo.h) and interleaves their
     * layer stages so one computes while the other's MoE dispatch / combine
     * is in flight (radix/moe.h dispatch_start ..).  Outputs are the same
     * as with 0.  Under DP attention every rank runs two micro-batches
     * (empty ones when it cannot split) so their collectives match.  A
     * dense model ignores it.  0 (or absent: a shorter env) = off. */
    int32_t two_batch_overlap;
    /* [scheduler] cuda_graph_max_bs: decode steps of up to this many
     * sequences may be captured once per batch size as a graph of the
     * kernel backend (radix/kernel.h graph_begin ..) and replayed after;
     * the model decides which steps qualify (model-llama: one rank, dense,
     * logits for every row) and runs the others op by op, as it does all
     * of them on a backend that cannot capture.  Outputs are the same.
     * 0 (or absent: a shorter env) = never capture. */
    int32_t cuda_graph_max_bs;
};

/* What the core needs to know about an instance. */
struct rx_model_info {
    uint32_t    struct_size;        /* set by the caller */
    const char *arch;               /* general.architecture, e.g. "llama" (NUL-terminated, owned by the instance) */
    int32_t     n_vocab;            /* logits per row */
    int32_t     n_ctx_train;        /* <arch>.context_length */
    int32_t     n_layer;
    int32_t     n_embd;
    int32_t     n_head;             /* query heads (this rank) */
    int32_t     n_kv_head;          /* KV heads (this rank) */
    uint64_t    kv_bytes_per_token; /* over all layers, as the attention backend stores it */
    uint64_t    weight_bytes;       /* bytes of the loaded weights (file form) */
    uint64_t    n_params;           /* parameters */
    /* ---- appended (check info->struct_size) ---- */
    int32_t     n_moe_layer;        /* MoE layers (0: a dense model) */
    int32_t     n_expert;           /* logical experts per MoE layer */
};

/* One step.  Host arrays (see the header comment); logits is device memory
 * of the instance's kernel backend, at least n_out * n_vocab floats. */
struct rx_model_batch {
    uint32_t       struct_size;     /* sizeof (struct rx_model_batch) */
    int32_t        n_tokens;        /* 1 .. max_tokens of reserve(); 0 = an idle batch
                                       (n_seq 0, n_out 0, arrays may be NULL): allowed
                                       only with rx_model_env.dp_attn, where it runs
                                       just the collectives of every layer */
    const int32_t *tokens;          /* [n_tokens] token ids */
    const int32_t *pos;             /* [n_tokens] positions within their sequence */
    int32_t        n_seq;           /* >= 1 */
    const int32_t *q_start;         /* [n_seq + 1]: 0 .. n_tokens, non-decreasing, each seq >= 1 row */
    const int32_t *kv_start;        /* [n_seq + 1]: offsets into kv_slots */
    const int32_t *kv_slots;        /* [kv_start[n_seq]]: slot of each position */
    int32_t        n_out;           /* rows wanting logits (0 allowed: KV only) */
    const int32_t *out_rows;        /* [n_out] increasing row indices */
    float         *logits;          /* device [n_out][n_vocab] */
    /* ---- appended: read only when struct_size covers it ---- */
    int32_t        all_decode;      /* 1: a decode step (one token per sequence) on every
                                       rank of the group -- under DP attention the ranks'
                                       "no prefill" bits AND-ed (all-reduce MIN, SGLang's
                                       prepare_dp_attn_batch), an idle rank counting as
                                       decoding -- so a graph-capable backend may replay a
                                       captured decode graph; 0 otherwise (prefill, and the
                                       engine's idle batch) */
    int32_t        count_experts;   /* (ABI 1.3) 1: add this step's expert choices to the
                                       env's expert_count array (expert recording or EPLB
                                       rebalance is on); 0: nobody reads the counts this
                                       step, skip them (an MoE layer then needs no host copy
                                       of its routing).  A batch too short to hold it: 1 */
};

struct rx_model_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */

    /* (required) NULL-terminated list of the general.architecture values
     * this plugin runs ("llama", "qwen2", ...). */
    const char *const *architectures;
    /* (optional: NULL means "mha" for every architecture) the attention
     * backend [attention] backend = auto picks for arch. */
    const char *(*default_attention) (const char *arch);

    /* (required) read the hyper-parameters of src, load its weights on
     * env->k and create the attention instance (env->attn).  host: the
     * model plugin's host table.  src and env are borrowed; src (and the
     * file behind it) and the kernel backend must outlive the instance.  A
     * file this plugin cannot run is RX_ENOTSUP / RX_EFORMAT with one line
     * naming the file and the key or tensor. */
    int  (*create) (const struct rx_host *host, const struct rx_model_src *src,
                    const struct rx_model_env *env, void **model, struct rx_err *err);
    /* (required) frees weights, attention instance, scratch; NULL is a no-op. */
    void (*destroy) (void *model);
    /* (required) info->struct_size set by the caller. */
    int  (*info) (void *model, struct rx_model_info *info);
    /* (required) allocate the KV pool for n_slots tokens and the scratch for
     * steps of up to max_tokens tokens.  May be called again (KV is lost). */
    int  (*reserve) (void *model, uint64_t n_slots, int32_t max_tokens, struct rx_err *err);
    /* (required) one step (see struct rx_model_batch).  Enqueued on the
     * kernel stream; logits are ready after the stream is synchronized. */
    int  (*forward) (void *model, const struct rx_model_batch *b, struct rx_err *err);

    /* ---- ABI 1.0 ends here.  Append only below (optional members; check
     * with RX_HAS (struct rx_model_ops, ops, member)). ---- */

    /* (optional) switch the expert placement (radix/moe.h struct
     * rx_moe_placement; NULL = identity) at a step boundary: between two
     * forward() calls, on every rank of the group at the same step.  pl is
     * borrowed until the next call or destroy.  A placement of another
     * shape than the model's MoE layers / experts is RX_EINVAL with one
     * line.  When n_physical changes the dispatcher is re-created (the KV
     * pool is kept).  Outputs do not change: a copy runs the same weights. */
    int  (*set_placement) (void *model, const struct rx_moe_placement *pl, struct rx_err *err);
};

#define RX_MODEL_OPS_SIZE_1_0 \
    (offsetof (struct rx_model_ops, forward) + sizeof (void *))

#ifdef __cplusplus
}
#endif
#endif /* RADIX_MODEL_H */
