/* kernels/cuda/kernels.h -- the launchers of kernels.cu, callable from C.
 *
 * Each enqueues its kernel(s) on `stream` and returns the launch status
 * (a cudaError_t as int: 0 = cudaSuccess).  Arguments were checked by
 * plugin.c; pointers are device pointers; sizes follow plan.h.  Index
 * arrays live on the device, so the kernels cannot report a bad index:
 * get_rows writes a zero row for an id outside the weight, kv_store skips
 * a slot outside the pool, attention reads only slots inside the pool
 * (a bad slot contributes a zero key/value row).
 *
 * Thread-safety: launches on different streams may come from different
 * threads; the kernels keep no state. */
#ifndef RX_CUDA_KERNELS_H
#define RX_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rx_cuk_ew_op {
    RX_CUK_ADD = 0, RX_CUK_MUL = 1, RX_CUK_SCALE = 2, RX_CUK_SIGMOID = 3, RX_CUK_COPY = 4,
    RX_CUK_SWIGLU = 5
};

/* Row ids[i] of a weight (rows of row_bytes, ne0 elements) as F32. */
int rx_cuk_get_rows (cudaStream_t st, int dtype, const void *w, size_t row_bytes, size_t ne0,
                     uint64_t n_rows, const int32_t *ids, size_t n, float *out, size_t ldo);
int rx_cuk_rms_norm (cudaStream_t st, const float *x, size_t ldx, const float *w, float *y,
                     size_t ldy, size_t rows, size_t dim, float eps);
/* corr: rx_cu_rope_corr_dims; theta_scale = freq_base^(-2/n_rot). */
int rx_cuk_rope (cudaStream_t st, float *x, size_t ldx, size_t n_tok, size_t n_head,
                 size_t ld_head, const int32_t *pos, int neox, int n_rot, float theta_scale,
                 float freq_scale, float ext_factor, float attn_factor, float corr0, float corr1,
                 const float *freq_factors);
/* y[r][o] (+)= sum_i x[r][i] * W[o][i], r < n (any n: passes of
 * RX_CU_MV_MAX_ROWS rows).  kernel: plan.h enum rx_cumv_kernel (VEC and
 * STAGE fall back to SIMPLE when w, x or ldx is not 16-byte aligned). */
int rx_cuk_matvec (cudaStream_t st, int dtype, const void *w, size_t row_bytes, size_t in,
                   size_t out, const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                   int accumulate, int kernel);
/* rows x in weight elements -> F16 [rows][in] (dst). */
int rx_cuk_dequant_f16 (cudaStream_t st, int dtype, const void *w, size_t row_bytes, size_t in,
                        size_t rows, void *dst);
/* rows x in weight elements -> F32 [rows][in] (dst), exact for every type. */
int rx_cuk_dequant_f32 (cudaStream_t st, int dtype, const void *w, size_t row_bytes, size_t in,
                        size_t rows, void *dst);
/* x (n x in, ld ldx) -> dst [n][in] of F16 (bf16 = 0) or BF16 (bf16 = 1). */
int rx_cuk_convert (cudaStream_t st, const float *x, size_t ldx, size_t n, size_t in, void *dst,
                    int bf16);
/* x (n x in, ld ldx) -> `parts` arrays of [n][in] F16 (bf16 = 0) or BF16
 * back to back in dst: part 0 = round(x), part p = round(residual_p *
 * scale^p), parts 1..4; sum_p part_p * scale^-p carries ~11 (F16) / 8 (BF16) bits of x
 * per part.  scale = 2^11 keeps F16 residuals out of the subnormals. */
int rx_cuk_convert_split (cudaStream_t st, const float *x, size_t ldx, size_t n, size_t in,
                          void *dst, int bf16, int parts, float scale);
/* x (n x in, ld ldx) -> dst [n][in] F32: each block of qblk (32: rx_q8a,
 * 256: Q8_K) quantized and dequantized as kernels-cpu quantizes
 * activations (cu_math.h rx_cu_q8a_qdq32 / rx_cu_q8k_qdq256). */
int rx_cuk_act_qdq (cudaStream_t st, const float *x, size_t ldx, size_t n, size_t in, int qblk,
                    float *dst);
/* Elementwise: ADD/MUL y = a op b (ldb 0: broadcast row 0 of b); SCALE
 * y = alpha a; SIGMOID; COPY; SWIGLU y = silu(a) * b. */
int rx_cuk_ew (cudaStream_t st, int op, const float *a, size_t lda, const float *b, size_t ldb,
               float *y, size_t ldy, size_t rows, size_t dim, float alpha);
int rx_cuk_softmax (cudaStream_t st, float *x, size_t ldx, size_t rows, size_t dim, float scale);
int rx_cuk_argmax (cudaStream_t st, const float *x, size_t ldx, size_t rows, size_t dim,
                   int32_t *out);
int rx_cuk_topk (cudaStream_t st, const float *x, size_t ldx, size_t rows, size_t dim, size_t k,
                 float *vals, int32_t *idx);
/* attention: tiled = [kernels.cuda] attention = tiled; the launcher takes
 * the tiled kernel where plan.h rx_cuplan_attn_tiled allows.  Otherwise
 * splits > 1 (plan.h rx_cuplan_attn_splits) runs the split-K kernels:
 * part is device scratch of rx_cuplan_attn_split_bytes (n_tokens, n_head,
 * splits, hd_v) bytes, written then read on st (one call at a time may
 * use it); splits <= 1 runs the unsplit kernel and ignores part. */
/* nk = n_kv_head * hd_k values per K row (nv for V); f16: pool is F16. */
int rx_cuk_kv_store (cudaStream_t st, void *kpool, void *vpool, int f16, size_t nk, size_t nv,
                     uint64_t n_slots, const float *k, size_t ldk, const float *v, size_t ldv,
                     const int32_t *slots, size_t n_tok);
int rx_cuk_attention (cudaStream_t st, const float *q, size_t ldq, const void *kpool,
                      const void *vpool, int f16, int n_kv_head, int hd_k, int hd_v,
                      uint64_t n_slots, int n_seq, int n_tokens, const int32_t *q_start,
                      const int32_t *kv_start, const int32_t *slots, const int32_t *q_pos,
                      int n_head, float scale, float softcap, int window, float *out, size_t ldo,
                      int tiled, int splits, float *part);

/* ---- the MoE expert pass (radix/kernel.h moe_route, moe_sort,
 * gather_rows, matmul_grouped, moe_combine; plan.h for the sizes) ---- */

/* DeepSeek routing, one block per row, as core/moe_route.h (the same
 * choices in the same order and the same weights); smem from
 * rx_cuplan_moe_route.  ids / w: [rows][k]. */
int rx_cuk_moe_route (cudaStream_t st, const float *probs, const float *sel, size_t ld,
                      size_t rows, int n_expert, int n_group, int topk_group, int k, int norm,
                      float scale, int32_t *ids, float *w, size_t smem);
/* Stable counting sort of n = n_tok * k choices in one block of `warps`
 * warps (rx_cuplan_moe_sort); n <= INT32_MAX. */
int rx_cuk_moe_sort (cudaStream_t st, const int32_t *ids, size_t n, int k, int n_expert,
                     int32_t *offsets, int32_t *row, int32_t *src, unsigned warps, size_t smem);
/* y[i] = x[idx[i]] (zeros for idx[i] < 0), n rows of dim. */
int rx_cuk_gather_rows (cudaStream_t st, const float *x, size_t ldx, const int32_t *idx, size_t n,
                        size_t dim, float *y, size_t ldy);
/* Sorted rows row0 .. row0+n-1 (x, y rows 0..n-1) through expert e's slice
 * w + e * expert_bytes of a [in, out, n_expert] weight, e from offsets
 * (device int32 [n_expert + 1]); rows at or past offsets[n_expert] are not
 * written.  The simple matvec kernel (enum rx_cumv_kernel SIMPLE). */
int rx_cuk_matvec_grouped (cudaStream_t st, int dtype, const void *w, size_t row_bytes,
                           size_t expert_bytes, size_t in, size_t out, const int32_t *offsets,
                           int n_expert, size_t row0, const float *x, size_t ldx, float *y,
                           size_t ldy, size_t n, int accumulate);
/* out[t] (+)= the choice-ordered sum of w * y[row] over t's choices with
 * row >= 0, products and sums each rounded (no FMA). */
int rx_cuk_moe_combine (cudaStream_t st, const float *y, size_t ldy, const int32_t *row,
                        const float *w, size_t n_tok, size_t k, size_t dim, float *out,
                        size_t ldo, int accumulate);

/* ---- the low-latency expert-parallel exchange (radix/kernel.h
 * moe_ll_pack, moe_ll_unpack) ---- */

/* Every block's header (n_rank x hrows x dim floats), then, for n = n_tok
 * * k > 0, the sent rows (one thread per sorted row and column) and
 * slot_of (one per choice).  Sizes checked by plugin.c (n_rank * (hrows +
 * slots) fits int32); a sorted row that would land outside its block
 * (offsets not moe_sort's) is dropped. */
int rx_cuk_moe_ll_pack (cudaStream_t st, const float *x, size_t ldx, const int32_t *ids,
                        const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n,
                        int n_expert, int n_rank, int slots, int hrows, size_t dim, float *send,
                        int32_t *slot_of);
/* offsets, order and back from recv's headers in one block of
 * RX_CU_LL_THREADS threads; smem from rx_cuplan_moe_ll_unpack. */
int rx_cuk_moe_ll_unpack (cudaStream_t st, const float *recv, int n_rank, int slots, int hrows,
                          size_t dim, int n_local, int32_t *offsets, int32_t *order, int32_t *back,
                          size_t smem);

#ifdef __cplusplus
}
#endif
#endif
