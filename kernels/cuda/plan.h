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
    int      dequant_w;     /* GEMM: W must be dequantized to F16 first */
    int      convert_x;     /* GEMM: X must be converted to gtype first */
    size_t   out_slice;     /* GEMM: output rows per cuBLAS call (W scratch bound) */
    size_t   w_scratch;     /* bytes of W scratch (one slice, F16) */
    size_t   x_scratch;     /* bytes of X scratch (x_parts x n x in of gtype) */
    /* Numerics (docs/gpu.md "Numerics"): activations are treated as
     * kernels-cpu treats them.  act_qblk (32 or 256, 0 for float weights):
     * X is first quantized-dequantized in blocks of act_qblk into q_scratch
     * (n x in F32) as the CPU quantizes it for its integer dots.  GEMM:
     * X is split into x_parts half-precision parts (F16: 2, scale 2^11;
     * BF16: 3, scale 2^8) run as x_parts GEMMs accumulating in F32, so the
     * activations keep ~22 (F16) / 24 (BF16) bits as the CPU's F32 ones. */
    int      act_qblk;
    int      x_parts;
    float    x_part_scale;
    size_t   q_scratch;
    /* MATVEC launch: grid.x blocks of RX_CU_MV_WARPS warps; rows in
     * passes of at most RX_CU_MV_MAX_ROWS. */
    uint32_t grid_x, block_x, row_passes;
};

/* dtype: the weight's enum rx_dtype; n activation rows; W is [in, out].
 * matvec_max_rows: n <= this takes the matvec path (1..RX_CU_MV_MAX_ROWS x
 * any passes; 0 = default 4); slice_bytes bounds the dequantized-W scratch
 * (0 = 64 MiB).  RX_ENOTSUP for a dtype without kernels, RX_EINVAL for bad
 * sizes. */
int rx_cuplan_matmul (int dtype, size_t n, size_t in, size_t out, size_t matvec_max_rows,
                      size_t slice_bytes, struct rx_cumm_plan *p, struct rx_err *err);

/* Blocks of `per_block` threads covering n items, at least 1 and at most
 * max_blocks (kernels then loop grid-stride). */
uint32_t rx_cuplan_blocks (size_t n, uint32_t per_block, uint32_t max_blocks);

/* Threads for a row reduction over dim elements: a multiple of 32, at most
 * RX_CU_ROW_THREADS, no more than dim rounded up to 32. */
uint32_t rx_cuplan_row_threads (size_t dim);

/* Dynamic shared memory of the attention kernel (bytes): q (hd_k floats),
 * the score tile and the warp scratch. */
size_t rx_cuplan_attn_smem (int hd_k, int hd_v);

#ifdef __cplusplus
}
#endif
#endif
