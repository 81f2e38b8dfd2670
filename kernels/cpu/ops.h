/* kernels/cpu/ops.h -- row ops of the CPU backend: embedding lookup, norm,
 * RoPE, activations, elementwise, softmax, argmax/top-k.  Portable C that the
 * compiler vectorises; rows are split over the pool's threads when the op is
 * big enough to pay for waking them.  Arguments are checked by plugin.c. */
#ifndef RX_KCPU_OPS_H
#define RX_KCPU_OPS_H

#include "plugin.h"

enum rx_kbinop { RX_KOP_ADD, RX_KOP_MUL };

void rx_kcpu_get_rows (struct rx_kcpu *k, const struct rx_kweight *w, const int32_t *ids,
                       size_t n, float *out, size_t ldo);
void rx_kcpu_rms_norm (struct rx_kcpu *k, const float *x, size_t ldx, const float *w,
                       float *y, size_t ldy, size_t rows, size_t dim, float eps);
void rx_kcpu_rope (struct rx_kcpu *k, float *x, size_t ldx, size_t n_tok, size_t n_head,
                   size_t ld_head, const int32_t *pos, const struct rx_rope_params *p);
void rx_kcpu_swiglu (struct rx_kcpu *k, const float *g, size_t ldg, const float *u, size_t ldu,
                     float *o, size_t ldo, size_t rows, size_t dim);
void rx_kcpu_binop (struct rx_kcpu *k, int op, const float *a, size_t lda, const float *b,
                    size_t ldb, float *y, size_t ldy, size_t rows, size_t dim);
void rx_kcpu_scale (struct rx_kcpu *k, const float *x, size_t ldx, float *y, size_t ldy,
                    size_t rows, size_t dim, float alpha);
void rx_kcpu_softmax (struct rx_kcpu *k, float *x, size_t ldx, size_t rows, size_t dim,
                      float scale);
void rx_kcpu_sigmoid (struct rx_kcpu *k, const float *x, size_t ldx, float *y, size_t ldy,
                      size_t rows, size_t dim);
void rx_kcpu_copy2d (struct rx_kcpu *k, const float *x, size_t ldx, float *y, size_t ldy,
                     size_t rows, size_t dim);
void rx_kcpu_argmax (struct rx_kcpu *k, const float *x, size_t ldx, size_t rows, size_t dim,
                     int32_t *out);
void rx_kcpu_topk (struct rx_kcpu *k, const float *x, size_t ldx, size_t rows, size_t dim,
                   size_t kk, float *vals, int32_t *idx);
/* Experts moe_route handles per row (its scratch lives on the stack). */
#define RX_KCPU_MOE_MAX_EXPERT 1024
/* radix/kernel.h moe_route (arguments checked by the caller). */
void rx_kcpu_moe_route (struct rx_kcpu *k, const float *probs, const float *sel, size_t ld,
                        size_t rows, size_t n_expert, size_t n_group, size_t topk_group,
                        size_t kk, int norm, float scale, int32_t *ids, float *w);

/* radix/kernel.h 1.3 moe_sort, gather_rows and moe_combine (arguments
 * checked by the caller; accumulate: RX_MM_ACCUMULATE).  moe_sort is the
 * stable counting sort of plugins/moe/local.c's dispatch; moe_combine
 * rounds each product w * y to float before adding it (never an FMA), so
 * it equals moe-local's scale/add/copy2d sequence bit for bit. */
void rx_kcpu_moe_sort (const int32_t *ids, size_t n_tok, size_t kk, size_t n_expert,
                       int32_t *offsets, int32_t *row, int32_t *src);
void rx_kcpu_gather_rows (struct rx_kcpu *k, const float *x, size_t ldx, const int32_t *idx,
                          size_t n, size_t dim, float *y, size_t ldy);
void rx_kcpu_moe_combine (struct rx_kcpu *k, const float *y, size_t ldy, const int32_t *row,
                          const float *w, size_t n_tok, size_t kk, size_t dim, float *out,
                          size_t ldo, int accumulate);

/* radix/kernel.h 1.4 moe_ll_pack and moe_ll_unpack (arguments checked by
 * the caller).  Serial: O(n_rank * slots) index work and one row copy per
 * sent row, a decode step's worth. */
void rx_kcpu_moe_ll_pack (const float *x, size_t ldx, const int32_t *ids, const int32_t *offsets,
                          const int32_t *row, const int32_t *src, size_t n_tok, size_t kk,
                          size_t n_expert, size_t n_rank, size_t slots, size_t hrows, size_t dim,
                          float *send, int32_t *slot_of);
void rx_kcpu_moe_ll_unpack (const float *recv, size_t n_rank, size_t slots, size_t hrows,
                            size_t dim, size_t n_local, int32_t *offsets, int32_t *order,
                            int32_t *back);

/* YaRN correction range (GGML's ggml_rope_yarn_corr_dims). */
void rx_kcpu_rope_corr_dims (int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                             float beta_slow, float dims[2]);

#endif
