/* kernels/cuda/plan.c -- see plan.h. */
#include "plan.h"
#include "cu_math.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint32_t rx_cuplan_blocks (size_t n, uint32_t per_block, uint32_t max_blocks)
{
    if (per_block == 0) per_block = 1;
    size_t b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (max_blocks && b > max_blocks) b = max_blocks;
    return (uint32_t) b;
}

uint32_t rx_cuplan_row_threads (size_t dim)
{
    size_t t = (dim + 31) / 32 * 32;
    if (t < 32) t = 32;
    if (t > RX_CU_ROW_THREADS) t = RX_CU_ROW_THREADS;
    return (uint32_t) t;
}

size_t rx_cuplan_attn_smem (int hd_k, int hd_v)
{
    (void) hd_v;
    return ((size_t) hd_k + RX_CU_ATTN_TILE + 32) * sizeof (float);
}

int rx_cuplan_attn_tiled (int enabled, int hd_k, int hd_v, int n_tokens, int n_seq)
{
    return enabled && hd_k > 0 && hd_v > 0 && hd_k <= RX_CU_ATTN_TILED_MAXD &&
           hd_v <= RX_CU_ATTN_TILED_MAXD && n_seq > 0 && n_tokens >= 4 * n_seq;
}

size_t rx_cuplan_attn_tiled_smem (int hd_k, int hd_v)
{
    return ((size_t) RX_CU_ATTN_QT * (size_t) (hd_k + 1) + (size_t) RX_CU_ATTN_KT * (size_t) (hd_k + 1) +
            (size_t) RX_CU_ATTN_KT * (size_t) (hd_v + 1) + (size_t) RX_CU_ATTN_QT * (RX_CU_ATTN_KT + 1)) *
           sizeof (float);
}

int rx_cuplan_attn_splits_parse (const char *s, int *setting, struct rx_err *err)
{
    if (!setting) return rx_err_set (err, RX_EINVAL, "kernels-cuda attention_splits: NULL result");
    if (s && (!strcmp (s, "0") || !strcmp (s, "off"))) {
        *setting = 0;
        return RX_OK;
    }
    if (s && !strcmp (s, "auto")) {
        *setting = RX_CU_ATTN_SPLITS_AUTO;
        return RX_OK;
    }
    char *end = NULL;
    errno = 0;
    long v = s && *s >= '0' && *s <= '9' ? strtol (s, &end, 10) : 0;
    if (!s || !end || *end || v < 1)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda: [kernels.cuda] attention_splits = '%s' "
                           "(0 or off, auto, or a number of splits 1..%d)", s ? s : "(null)",
                           RX_CU_ATTN_SPLITS_MAX);
    *setting = errno == ERANGE || v > RX_CU_ATTN_SPLITS_MAX ? RX_CU_ATTN_SPLITS_MAX : (int) v;
    return RX_OK;
}

int rx_cuplan_attn_splits (int rows, int n_seq, int heads, int n_sm, int setting)
{
    if (setting == 0 || rows <= 0 || heads <= 0 || n_seq <= 0) return 1;
    if ((int64_t) rows >= 4 * (int64_t) n_seq) return 1;   /* prefill-like */
    if (setting == RX_CU_ATTN_SPLITS_AUTO) {
        if (n_sm <= 0) return 1;
        const int64_t blocks = (int64_t) rows * heads, want = 2 * (int64_t) n_sm;
        int64_t sp = (want + blocks - 1) / blocks;
        if (sp > RX_CU_ATTN_SPLITS_AUTO_MAX) sp = RX_CU_ATTN_SPLITS_AUTO_MAX;
        return sp < 1 ? 1 : (int) sp;
    }
    if (setting < 1) return 1;
    return setting > RX_CU_ATTN_SPLITS_MAX ? RX_CU_ATTN_SPLITS_MAX : setting;
}

size_t rx_cuplan_attn_split_bytes (int rows, int heads, int splits, int hd_v)
{
    if (rows <= 0 || heads <= 0 || splits <= 0 || hd_v <= 0) return 0;
    const size_t per = ((size_t) hd_v + 2) * sizeof (float);
    size_t n = (size_t) rows;
    if (n > SIZE_MAX / (size_t) heads) return 0;
    n *= (size_t) heads;
    if (n > SIZE_MAX / (size_t) splits) return 0;
    n *= (size_t) splits;
    return n > SIZE_MAX / per ? 0 : n * per;
}

size_t rx_cuplan_mv_stage_bytes (int dtype)
{
    if (rx_cu_blk_elems (dtype) <= 1) return 0;
    return rx_cu_row_bytes (dtype, RX_CU_MV_STAGE);
}

int rx_cuplan_mv_kernel (int dtype, size_t in, int fast)
{
    const size_t rb = rx_cu_row_bytes (dtype, in);
    if (!fast || rb == 0 || rb % 16) return RX_CUMV_SIMPLE;
    if (rx_cu_blk_elems (dtype) == 1) return RX_CUMV_VEC;
    const size_t sb = rx_cuplan_mv_stage_bytes (dtype);
    return sb && sb % 16 == 0 ? RX_CUMV_STAGE : RX_CUMV_SIMPLE;
}

int rx_cuplan_matmul (int dtype, size_t n, size_t in, size_t out, size_t matvec_max_rows,
                      size_t slice_bytes, unsigned flags, struct rx_cumm_plan *p,
                      struct rx_err *err)
{
    const int half = (flags & RX_CUPLAN_HALF_GEMM) != 0;
    if (!p) return rx_err_set (err, RX_EINVAL, "kernels-cuda matmul plan: NULL plan");
    *p = (struct rx_cumm_plan) { 0 };
    if (rx_cu_blk_elems (dtype) == 0)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda matmul: no kernel for weight dtype %d",
                           dtype);
    if (in == 0 || out == 0 || in % 32 || rx_cu_row_bytes (dtype, in) == 0)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda matmul: in = %zu must be a positive "
                           "multiple of 32 and of the dtype's block, out = %zu > 0", in, out);
    if (out > UINT32_MAX / 2)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda matmul: out = %zu is too large", out);
    if (matvec_max_rows == 0) matvec_max_rows = 4;
    if (slice_bytes == 0) slice_bytes = (size_t) 64 << 20;
    p->act_qblk = rx_cu_act_qblk (dtype);
    if (p->act_qblk) p->q_scratch = n * in * sizeof (float);
    if (n <= matvec_max_rows) {
        p->path = RX_CUMM_MATVEC;
        p->block_x = 32 * RX_CU_MV_WARPS;
        p->grid_x = rx_cuplan_blocks (out, RX_CU_MV_WARPS, 0);
        p->row_passes = (uint32_t) ((n + RX_CU_MV_MAX_ROWS - 1) / RX_CU_MV_MAX_ROWS);
        p->mv_kernel = rx_cuplan_mv_kernel (dtype, in, (flags & RX_CUPLAN_FAST_MV) != 0);
        return RX_OK;
    }
    p->path = RX_CUMM_GEMM;
    switch (dtype) {
    case RX_CU_F32:  p->gtype = RX_CUMM_G_F32; break;
    case RX_CU_BF16: p->gtype = RX_CUMM_G_BF16; p->convert_x = 1; break;
    case RX_CU_F16:  p->gtype = RX_CUMM_G_F16; p->convert_x = 1; break;
    /* Quantized W is dequantized to F32 (exact) for an F32 GEMM: the F16
     * rounding of the dequantized weights (~2^-12) flipped the activation
     * quantization of later layers often enough to move the logits of
     * the quantized reference models by 0.1 (H200 run).  Half GEMMs: to
     * F16, one tensor-core pass. */
    default:
        p->gtype = half ? RX_CUMM_G_F16 : RX_CUMM_G_F32;
        p->dequant_w = 1;
        p->convert_x = half;
        break;
    }
    p->out_slice = out;
    if (p->dequant_w) {
        /* Dequantize W slice by slice so the scratch stays bounded; slices
         * are multiples of 64 rows (whole GEMM tiles). */
        const size_t esz = p->gtype == RX_CUMM_G_F32 ? 4 : 2;
        size_t rows = slice_bytes / (in * esz);
        rows = rows / 64 * 64;
        if (rows < 64) rows = 64;
        if (rows < out) p->out_slice = rows;
        p->w_scratch = p->out_slice * in * esz;
    }
    if (p->convert_x) {
        p->x_parts = half ? 1 : p->gtype == RX_CUMM_G_BF16 ? 3 : 2;
        p->x_part_scale = p->gtype == RX_CUMM_G_BF16 ? 256.f : 2048.f;
        p->x_scratch = (size_t) p->x_parts * n * in * 2;
    }
    return RX_OK;
}

/* ------------------------------------------------------- MoE expert pass -- */

int rx_cuplan_moe_sort (size_t n_expert, uint32_t *warps, size_t *smem, struct rx_err *err)
{
    if (n_expert < 1 || n_expert > RX_CU_MOE_MAX_EXPERT)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda moe_sort: n_expert %zu outside 1..%d "
                           "(the kernel's histograms live in shared memory)", n_expert,
                           RX_CU_MOE_MAX_EXPERT);
    /* W histograms of n_expert plus the offsets, in int32. */
    const size_t cap = RX_CU_SMEM_DEFAULT / sizeof (int32_t) - (n_expert + 1);
    size_t w = cap / n_expert;
    if (w > 32) w = 32;
    if (warps) *warps = (uint32_t) w;   /* >= 1: n_expert <= 4096 leaves room for one */
    if (smem) *smem = (w * n_expert + n_expert + 1) * sizeof (int32_t);
    return RX_OK;
}

int rx_cuplan_moe_route (size_t n_expert, size_t n_group, size_t k, size_t *smem,
                         struct rx_err *err)
{
    const size_t g = n_group > 1 ? n_group : 1;
    if (n_expert < 1 || n_expert > RX_CU_MOE_MAX_EXPERT || k < 1 || k > n_expert || g > n_expert)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda moe_route: n_expert %zu (1..%d), "
                           "n_group %zu, k %zu: no kernel for this shape", n_expert,
                           RX_CU_MOE_MAX_EXPERT, n_group, k);
    /* floats sel[n_expert], gs[g]; int32 ids[k]; bytes taken[n_expert], keep[g];
     * the kernel's static reduction scratch (3 x 32 words) comes on top. */
    const size_t b = (n_expert + g + k) * 4 + n_expert + g;
    if (b > RX_CU_SMEM_DEFAULT - RX_CU_ROUTE_STATIC_SMEM)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda moe_route: n_expert %zu, n_group %zu, "
                           "k %zu need %zu bytes of shared memory (at most %d)", n_expert,
                           n_group, k, b, RX_CU_SMEM_DEFAULT - RX_CU_ROUTE_STATIC_SMEM);
    if (smem) *smem = b;
    return RX_OK;
}

int rx_cuplan_matmul_grouped (int dtype, size_t n, size_t in, size_t out, size_t slice_bytes,
                              struct rx_cugm_plan *p, struct rx_err *err)
{
    if (!p) return rx_err_set (err, RX_EINVAL, "kernels-cuda matmul_grouped plan: NULL plan");
    *p = (struct rx_cugm_plan) { 0 };
    if (rx_cu_blk_elems (dtype) == 0)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda matmul_grouped: no kernel for weight "
                           "dtype %d", dtype);
    if (in == 0 || out == 0 || in % 32 || rx_cu_row_bytes (dtype, in) == 0 || in > INT32_MAX)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda matmul_grouped: in = %zu must be a "
                           "positive multiple of 32 and of the dtype's block, out = %zu > 0",
                           in, out);
    if (out > UINT32_MAX / 2)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda matmul_grouped: out = %zu is too large",
                           out);
    if (slice_bytes == 0) slice_bytes = (size_t) 64 << 20;
    p->grid_x = rx_cuplan_blocks (out, RX_CU_MV_WARPS, 0);
    p->act_qblk = rx_cu_act_qblk (dtype);
    p->rows_per_pass = n;
    if (p->act_qblk) {
        size_t rows = slice_bytes / (in * sizeof (float));
        rows = rows / RX_CU_MV_MAX_ROWS * RX_CU_MV_MAX_ROWS;
        if (rows < RX_CU_MV_MAX_ROWS) rows = RX_CU_MV_MAX_ROWS;
        if (rows < n) p->rows_per_pass = rows;
        p->q_scratch = p->rows_per_pass * in * sizeof (float);
    }
    return RX_OK;
}

/* ------------------------------------ low-latency expert-parallel exchange -- */

int rx_cuplan_moe_ll_unpack (size_t n_rank, size_t n_local, size_t *smem, struct rx_err *err)
{
    if (n_rank == 0 || n_local == 0)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda moe_ll_unpack: n_rank %zu and n_local "
                           "%zu must be >= 1", n_rank, n_local);
    /* int32: prefix [n_rank][n_local + 1], offsets [n_local + 1]: (n_rank +
     * 1) x (n_local + 1) words, bounded before it is multiplied out. */
    const size_t cap = RX_CU_LL_SMEM_MAX / sizeof (int32_t);
    if (n_local >= cap || n_rank + 1 > cap / (n_local + 1))
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda moe_ll_unpack: %zu ranks x %zu local "
                           "experts need more than %d bytes of shared memory (the per-rank "
                           "prefix sums of the counts)", n_rank, n_local, RX_CU_LL_SMEM_MAX);
    if (smem) *smem = (n_rank + 1) * (n_local + 1) * sizeof (int32_t);
    return RX_OK;
}
