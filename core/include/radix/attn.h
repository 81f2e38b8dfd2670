/* radix/attn.h -- the attention-backend kind (RX_KIND_ATTENTION).
 *
 * ABI: 1.0, being built (members may still be appended before the first
 * release; nothing below is reordered or retyped once released).
 *
 * An attention backend owns the paged KV pool of one model instance (every
 * layer) and computes attention for one layer over a batch of sequences.  A
 * model plugin creates one instance for its shapes (rx_attn_config), asks it
 * for the KV bytes per token, has it allocate the pool for n_slots tokens,
 * and calls forward() once per layer per step.  All compute goes through the
 * kernel backend it was created with (radix/kernel.h), so an attention
 * plugin runs on the CPU and on CUDA alike.
 *
 * Paging.  The pool holds n_slots token slots (page size 1).  A sequence's
 * KV lives in arbitrary slots: position p of sequence i is in slot
 * slots[kv_start[i] + p] (struct rx_attn_batch of kernel.h).  The core's KV
 * allocator (later: the radix prefix cache) hands out slots; the backend only
 * reads and writes the slots it is told.  Sequences may share slots (a
 * common prefix) as long as nobody writes them.
 *
 * Why one kind for MHA and MLA.  DeepSeek MLA stores one latent per token
 * (kv_lora_rank compressed values + the rope part of the key, shared by every
 * head) instead of K and V per KV head, and its decode path uses the absorbed
 * form (q_nope.W_UK against the latent, W_UV applied after).  What differs is
 * only what the model hands over per layer and what a slot stores; the
 * batch, the slot addressing, pool allocation and the per-layer call are the
 * same.  So:
 *   - rx_attn_config.kv_kind says what a token's KV is: RX_ATTN_KV_HEADS (K
 *     and V rows per KV head: MHA/GQA/MQA) or RX_ATTN_KV_LATENT (one latent
 *     row of kv_lora_rank + rope_dim values).  A backend refuses a kind it
 *     does not implement at create(), with a message naming the backend to
 *     use ("mha" cannot run a latent model: use "mla").
 *   - struct rx_attn_io carries the per-layer tensors; members a kind does
 *     not use are NULL/0, and members added for MLA (the kv_b weight the
 *     absorbed form needs) are appended, guarded by struct_size.  For
 *     KV_LATENT, k is the latent row [c_kv (normed) | k_pe (roped)] and v is
 *     NULL; q is per head [q_nope | q_pe].
 *   - prepare() (optional) is called once per step before the layers, so a
 *     backend can plan split-KV work or pick prefill/decode kernels once
 *     (FlashInfer's plan/run), instead of per layer.
 * This keeps the model plugin free of KV layout details: the same llama
 * plugin runs on any "heads" backend, and deepseek2 on any "latent" one.
 *
 * Tensor parallelism (later): the model creates the instance with the
 * heads of its rank (n_head / n_kv_head are per rank); nothing here changes.
 *
 * Thread-safety: an instance is driven by one thread (the model runner of
 * one scheduler rank), on the stream it was created with.
 *
 * Ownership: the instance owns its KV pool (device memory from the kernel
 * backend) and frees it in destroy().  Pointers in rx_attn_io and the batch
 * are borrowed for the call. */
#ifndef RADIX_ATTN_H
#define RADIX_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/host.h>
#include <radix/kernel.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel backend a component computes on: ops table, instance, stream.
 * Fixed forever (three members; a new need gets a new struct). */
struct rx_kctx {
    const struct rx_kernels_ops *ops;
    void                        *be;
    rx_kstream_t                *stream;   /* NULL = the default stream */
};

/* What one token's KV is (values are ABI; append only). */
enum rx_attn_kv_kind {
    RX_ATTN_KV_HEADS  = 1,   /* K [n_kv_head][hd_k] and V [n_kv_head][hd_v] */
    RX_ATTN_KV_LATENT = 2    /* one row [kv_lora_rank + rope_dim] (MLA) */
};

/* The shapes an instance is created for (filled by the model plugin).  All
 * head counts are those of this rank. */
struct rx_attn_config {
    uint32_t struct_size;    /* sizeof (struct rx_attn_config) */
    int32_t  kv_kind;        /* enum rx_attn_kv_kind */
    int32_t  n_layer;        /* layers with attention (pool count) */
    int32_t  n_head;         /* query heads */
    int32_t  n_kv_head;      /* KV heads (KV_HEADS); n_head % n_kv_head == 0 */
    int32_t  hd_k;           /* query/key head dim (MLA: qk_nope + qk_rope) */
    int32_t  hd_v;           /* value head dim */
    int32_t  kv_dtype;       /* RX_F32, or RX_F16 where the kernels have RX_KCAP_KV_F16 */
    float    scale;          /* score scale, usually 1/sqrt(hd_k) (MLA: with YaRN mscale) */
    float    softcap;        /* 0 = none */
    int32_t  window;         /* 0 = full causal; else sliding window in positions */
    int32_t  kv_lora_rank;   /* KV_LATENT only: latent dims */
    int32_t  rope_dim;       /* KV_LATENT only: rope part of the key */
};

/* One layer's tensors for forward().  Device pointers, F32, n_tokens rows
 * (the batch's token order), row strides in elements. */
struct rx_attn_io {
    uint32_t     struct_size;  /* sizeof (struct rx_attn_io) */
    const float *q;            /* [n_tokens][n_head * hd_k], RoPE applied */
    size_t       ldq;
    const float *k;            /* new K rows [n_kv_head * hd_k], RoPE applied (LATENT: latent rows) */
    size_t       ldk;
    const float *v;            /* new V rows [n_kv_head * hd_v] (LATENT: NULL) */
    size_t       ldv;
    float       *out;          /* [n_tokens][n_head * hd_v] */
    size_t       ldo;
    /* ---- LATENT only (NULL for KV_HEADS); more members are appended here ---- */
    const rx_kweight_t *w_kv_b; /* the layer's kv_b projection, for the absorbed form */
};

struct rx_attn_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */

    /* (required) host: the attention plugin's host table (logs, its INI
     * section [attention.<name>]).  k: the kernel backend to compute on,
     * borrowed: it must outlive the instance.  A config the backend cannot
     * run is RX_ENOTSUP (wrong kv_kind) or RX_EINVAL (bad shapes). */
    int      (*create) (const struct rx_host *host, const struct rx_kctx *k,
                        const struct rx_attn_config *cfg, void **attn, struct rx_err *err);
    /* (required) frees the pool and the instance; NULL is a no-op. */
    void     (*destroy) (void *attn);
    /* (required) KV bytes one token takes, over all layers. */
    uint64_t (*kv_bytes_per_token) (void *attn);
    /* (required) (re)allocate every layer's pool for n_slots tokens; an
     * earlier pool is freed (its contents are lost).  RX_ENOMEM with the
     * size asked when the device has no room. */
    int      (*kv_alloc) (void *attn, uint64_t n_slots, struct rx_err *err);
    /* (required) layer `layer`: store the new tokens' K/V (token t goes to
     * slot new_slots[t], a device int32[b->n_tokens]), then compute
     * attention for every query row of the batch into io->out.  The batch's
     * positions 0..q_pos[t] must all be stored by then (earlier steps, or
     * this call). */
    int      (*forward) (void *attn, int32_t layer, const struct rx_attn_batch *b,
                         const int32_t *new_slots, const struct rx_attn_io *io,
                         struct rx_err *err);
    /* (optional: NULL = nothing to plan) called once per step with the
     * step's batch, before the first forward(). */
    int      (*prepare) (void *attn, const struct rx_attn_batch *b, struct rx_err *err);

    /* ---- ABI 1.0 ends here.  Append only below (optional members; check
     * with RX_HAS (struct rx_attn_ops, ops, member)). ---- */
};

#define RX_ATTN_OPS_SIZE_1_0 \
    (offsetof (struct rx_attn_ops, forward) + sizeof (void *))

#ifdef __cplusplus
}
#endif
#endif /* RADIX_ATTN_H */
