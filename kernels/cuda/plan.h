/* kernels/cuda/plan.h -- launch planning for the CUDA kernels, as plain C:
 * which matmul path a call takes (fused dequant matvec vs cuBLAS GEMM), the
 * scratch it needs, and the grid/block dimensions of the launches.  The
 * plugin (plugin.c) and the kernels (kernels.cu) both follow these plans,
 * and the host unit test checks them without a GPU.
 *
 * Pure functions: thread-safe. */
#ifndef RX_CUDA_PLAN_H
#define RX_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The matvec kernel keeps one accumulator per activation row in registers:
 * at most this many rows per launch. */
#define RX_CU_MV_MAX_ROWS 8
/* Warps (= output rows) per matvec block. */
#define RX_CU_MV_WARPS 4
/* Fast matvec kernels ([kernels.cuda] matvec = fast): 16-byte loads in
 * flight per lane (F32/F16/BF16), and the elements of a block-quantized
 * row staged in shared memory per pass (a multiple of 256, whole K-quant
 * blocks; its bytes are a multiple of 16 for every block type). */
#define RX_CU_MV_UNROLL 8
#define RX_CU_MV_STAGE 2048

/* Which matvec kernel a plan runs. */
enum rx_cumv_kernel {
    RX_CUMV_SIMPLE = 0,     /* a lane decodes 32-element chunks with byte loads (any row) */
    RX_CUMV_VEC    = 1,     /* F32/F16/BF16: coalesced 16-byte loads, row_bytes % 16 == 0 */
    RX_CUMV_STAGE  = 2      /* block types: rows staged in shared memory, row_bytes % 16 == 0 */
};
/* Threads per block of the row kernels (norm, softmax, argmax, topk). */
#define RX_CU_ROW_THREADS 256
/* Attention: threads per (query row, head) block and the score tile. */
#define RX_CU_ATTN_THREADS 128
#define RX_CU_ATTN_TILE 64

enum rx_cumm_path {
    RX_CUMM_MATVEC = 1,     /* fused dequant matvec kernel, F32 activations */
    RX_CUMM_GEMM   = 2      /* cuBLAS: convert X (and dequantize W) then GemmEx */
};

/* The cuBLAS operand type of a GEMM plan. */
enum rx_cumm_gtype { RX_CUMM_G_F32 = 0, RX_CUMM_G_F16 = 1, RX_CUMM_G_BF16 = 2 };

struct rx_cumm_plan {
    int      path;          /* enum rx_cumm_path */
    int      gtype;         /* GEMM: enum rx_cumm_gtype of both operands */
    int      dequant_w;     /* GEMM: W must be dequantized to gtype (F32, or F16) first */
    int      convert_x;     /* GEMM: X must be converted to gtype first */
    size_t   out_slice;     /* GEMM: output rows per cuBLAS call (W scratch bound) */
    size_t   w_scratch;     /* bytes of W scratch (one slice of gtype) */
    size_t   x_scratch;     /* bytes of X scratch (x_parts x n x in of gtype) */
    /* Numerics (docs/gpu.md "Numerics"): activations are treated as
     * kernels-cpu treats them.  act_qblk (32 or 256, 0 for float weights):
     * X is first quantized-dequantized in blocks of act_qblk into q_scratch
     * (n x in F32) as the CPU quantizes it for its integer dots.  GEMM:
     * X is split into x_parts half-precision parts (F16: 2, scale 2^11;
     * BF16: 3, scale 2^8) run as x_parts GEMMs accumulating in F32, so the
     * activations keep ~22 (F16) / 24 (BF16) bits as the CPU's F32 ones
     * (RX_CUPLAN_HALF_GEMM: one part, the precision GPU engines use). */
    int      act_qblk;
    int      x_parts;
    float    x_part_scale;
    size_t   q_scratch;
    /* MATVEC launch: grid.x blocks of RX_CU_MV_WARPS warps; rows in
     * passes of at most RX_CU_MV_MAX_ROWS; mv_kernel: enum rx_cumv_kernel
     * (the launcher still falls back to SIMPLE for unaligned pointers). */
    uint32_t grid_x, block_x, row_passes;
    int      mv_kernel;
};

/* rx_cuplan_matmul flags. */
#define RX_CUPLAN_FAST_MV   1u   /* the fast matvec kernels where the row allows
                                  * (rx_cuplan_mv_kernel; [kernels.cuda] matvec = fast) */
#define RX_CUPLAN_HALF_GEMM 2u   /* GEMMs in one half-precision tensor-core pass: F16/BF16
                                  * X rounded to the weight's type, quantized W dequantized
                                  * to F16 ([kernels.cuda] gemm_activations = half) */

/* dtype: the weight's enum rx_dtype; n activation rows; W is [in, out].
 * matvec_max_rows: n <= this takes the matvec path (1..RX_CU_MV_MAX_ROWS x
 * any passes; 0 = default 4); slice_bytes bounds the dequantized-W scratch
 * (0 = 64 MiB); flags: RX_CUPLAN_*.  RX_ENOTSUP for a dtype without
 * kernels, RX_EINVAL for bad sizes. */
int rx_cuplan_matmul (int dtype, size_t n, size_t in, size_t out, size_t matvec_max_rows,
                      size_t slice_bytes, unsigned flags, struct rx_cumm_plan *p,
                      struct rx_err *err);

/* The matvec kernel for a weight of dtype with in elements per row:
 * SIMPLE unless fast, and VEC / STAGE only when a row is whole 16-byte
 * vectors (the fast kernels' loads). */
int rx_cuplan_mv_kernel (int dtype, size_t in, int fast);

/* Bytes of RX_CU_MV_STAGE elements of dtype (0 for F32/F16/BF16, which
 * are not staged). */
size_t rx_cuplan_mv_stage_bytes (int dtype);

/* Blocks of `per_block` threads covering n items, at least 1 and at most
 * max_blocks (kernels then loop grid-stride). */
uint32_t rx_cuplan_blocks (size_t n, uint32_t per_block, uint32_t max_blocks);

/* Threads for a row reduction over dim elements: a multiple of 32, at most
 * RX_CU_ROW_THREADS, no more than dim rounded up to 32. */
uint32_t rx_cuplan_row_threads (size_t dim);

/* Dynamic shared memory of the attention kernel (bytes): q (hd_k floats),
 * the score tile and the warp scratch. */
size_t rx_cuplan_attn_smem (int hd_k, int hd_v);

/* The tiled attention kernel ([kernels.cuda] attention = tiled): a block
 * of RX_CU_ATTN_THREADS threads per (RX_CU_ATTN_QT query rows, head);
 * the rows' keys and values come through shared memory RX_CU_ATTN_KT
 * positions at a time, each loaded once for the whole query tile.  Four
 * threads own a query row (its KT scores, a quarter of its output dims). */
#define RX_CU_ATTN_QT 32
#define RX_CU_ATTN_KT 32
#define RX_CU_ATTN_TILED_MAXD 128

/* Whether a call runs the tiled kernel: enabled, both head dims at most
 * RX_CU_ATTN_TILED_MAXD (not MLA's absorbed 576/512), and a prefill-like
 * batch of at least 4 rows per sequence on average (a decode row alone in
 * its tile would leave 31 of 32 rows idle). */
int rx_cuplan_attn_tiled (int enabled, int hd_k, int hd_v, int n_tokens, int n_seq);

/* Dynamic shared memory of the tiled kernel (bytes): Q, K and V tiles
 * (rows padded by one float against bank conflicts) and the P tile. */
size_t rx_cuplan_attn_tiled_smem (int hd_k, int hd_v);

/* Split-K decode attention ("flash-decoding", [kernels.cuda]
 * attention_splits): the simple kernel's keys of each (query row, head)
 * are shared among S blocks that each write a partial online-softmax state
 * (running max m, sum l, the unnormalised V accumulator), and a second
 * kernel merges the S partials.  The setting: 0 = off, RX_CU_ATTN_SPLITS_AUTO,
 * or a fixed count 1..RX_CU_ATTN_SPLITS_MAX. */
#define RX_CU_ATTN_SPLITS_AUTO (-1)
#define RX_CU_ATTN_SPLITS_MAX 64
/* Most splits auto picks. */
#define RX_CU_ATTN_SPLITS_AUTO_MAX 32

/* Parses an attention_splits value: "0" or "off", "auto", or a decimal
 * 1..RX_CU_ATTN_SPLITS_MAX (a larger number is clamped to the maximum).
 * RX_EINVAL (one line naming the value) otherwise. */
int rx_cuplan_attn_splits_parse (const char *s, int *setting, struct rx_err *err);

/* The split count S of a call of the simple attention kernel over rows
 * query rows of n_seq sequences and heads heads on a device of n_sm
 * multiprocessors, from sizes only (the KV lengths live on the device, and
 * a captured graph must stay valid as the context grows).  Only
 * decode-like batches split: fewer than 4 rows per sequence on average
 * (rx_cuplan_attn_tiled's bound; a prefill has rows enough to fill the
 * device, and its partials would take rows x heads x S x (hd_v + 2)
 * floats); any other batch -> 1.  setting 0 -> 1 (off); AUTO -> enough
 * blocks to fill the device twice, ceil(2 n_sm / (rows heads)) clamped to
 * 1..RX_CU_ATTN_SPLITS_AUTO_MAX (1 when n_sm is unknown, <= 0); N -> N
 * clamped to 1..RX_CU_ATTN_SPLITS_MAX.  S = 1 runs the unsplit kernel. */
int rx_cuplan_attn_splits (int rows, int n_seq, int heads, int n_sm, int setting);

/* Bytes of the partials of a split call: [rows][heads][splits][hd_v + 2]
 * floats (acc[hd_v], m, l); 0 on overflow or a zero size. */
size_t rx_cuplan_attn_split_bytes (int rows, int heads, int splits, int hd_v);

/* ---- the MoE expert pass (kernel ABI 1.2 moe_route, 1.3 moe_sort,
 * gather_rows, matmul_grouped, moe_combine) ---- */

/* Experts moe_route and moe_sort take (their scratch is shared memory). */
#define RX_CU_MOE_MAX_EXPERT 4096
/* Shared memory a kernel may take without opting in (bytes). */
#define RX_CU_SMEM_DEFAULT 49152
/* moe_route's static shared memory (its block reduction), left out of
 * the dynamic part rx_cuplan_moe_route sizes. */
#define RX_CU_ROUTE_STATIC_SMEM 512

/* moe_sort runs as one block of *warps warps (1..32): warp w owns a
 * contiguous segment of the choices and a histogram of n_expert counts;
 * *smem = the warps' histograms plus offsets [n_expert + 1] (int32).
 * As many warps as RX_CU_SMEM_DEFAULT holds histograms for.  RX_ENOTSUP
 * for n_expert outside 1..RX_CU_MOE_MAX_EXPERT. */
int rx_cuplan_moe_sort (size_t n_expert, uint32_t *warps, size_t *smem, struct rx_err *err);

/* moe_route: one block of rx_cuplan_row_threads (n_expert) threads per row;
 * *smem = the row's sel (floats), group scores, chosen ids, taken and kept
 * flags.  RX_ENOTSUP when n_expert exceeds RX_CU_MOE_MAX_EXPERT or the
 * scratch exceeds RX_CU_SMEM_DEFAULT; n_group <= 1 counts as one group. */
int rx_cuplan_moe_route (size_t n_expert, size_t n_group, size_t k, size_t *smem,
                         struct rx_err *err);

/* matmul_grouped: the simple matvec kernel per row, each row's expert found
 * in the device offsets.  Quantized weights first quantize-dequantize the
 * activations as kernels-cpu does (act_qblk 32 or 256, as matmul), into a
 * scratch of rows_per_pass x in floats (bounded by slice_bytes, 0 = 64 MiB;
 * a multiple of RX_CU_MV_MAX_ROWS rows, at least that many), so prefill
 * batches run in passes; float weights take all n rows in one pass with no
 * scratch.  grid_x: blocks of RX_CU_MV_WARPS output rows. */
struct rx_cugm_plan {
    int      act_qblk;
    size_t   rows_per_pass;
    size_t   q_scratch;      /* bytes */
    uint32_t grid_x;
};
int rx_cuplan_matmul_grouped (int dtype, size_t n, size_t in, size_t out, size_t slice_bytes,
                              struct rx_cugm_plan *p, struct rx_err *err);

/* ---- the low-latency expert-parallel exchange (kernel ABI 1.4
 * moe_ll_pack, moe_ll_unpack) ---- */

/* Threads of moe_ll_unpack's single block. */
#define RX_CU_LL_THREADS 512
/* The most shared memory moe_ll_unpack takes (opting in above
 * RX_CU_SMEM_DEFAULT): 96 KiB, which every target (sm_80 and up, sm_86's
 * 99 KiB the least) grants. */
#define RX_CU_LL_SMEM_MAX (96 * 1024)
/* moe_ll_unpack runs as one block that keeps, in shared memory, every
 * block's in-block prefix of the clamped counts (n_rank x (n_local + 1))
 * and the offsets (n_local + 1), all int32: *smem bytes.  RX_ENOTSUP when
 * that exceeds RX_CU_LL_SMEM_MAX (e.g. 64 ranks x 256 local experts take
 * 65 KiB); RX_EINVAL for n_rank or n_local 0. */
int rx_cuplan_moe_ll_unpack (size_t n_rank, size_t n_local, size_t *smem, struct rx_err *err);

#ifdef __cplusplus
}
#endif
#endif
