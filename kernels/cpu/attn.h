/* kernels/cpu/attn.h -- KV-pool store and causal paged attention (GQA,
 * hd_k != hd_v, F32 or F16 pools).  Arguments are checked by plugin.c;
 * indices (slots, positions, offsets) by rx_kcpu_attn_check. */
#ifndef RX_KCPU_ATTN_H
#define RX_KCPU_ATTN_H

#include "plugin.h"

void rx_kcpu_kv_store (struct rx_kcpu *k, const struct rx_kv_pool *pool, const float *kx,
                       size_t ldk, const float *vx, size_t ldv, const int32_t *slots,
                       size_t n_tok);

/* Validate the batch's index arrays (host-visible here) against the pool. */
int rx_kcpu_attn_check (const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                        struct rx_err *err);

int rx_kcpu_attention (struct rx_kcpu *k, const float *q, size_t ldq,
                       const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                       const struct rx_attn_params *p, float *out, size_t ldo,
                       struct rx_err *err);

#endif
