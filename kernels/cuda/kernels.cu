/* kernels/cuda/kernels.cu -- the CUDA kernels and their C launchers (see
 * kernels.h).  Element math (block decoders, RoPE/YaRN factors) comes from
 * cu_math.h, shared with the host unit test; launch shapes from plan.h.
 *
 * Kept deliberately plain so the fat binary (sm_80, sm_90, PTX) builds in
 * about a minute: one template parameter (the weight dtype) for the
 * kernels that read weights, everything else untemplated. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cu_math.h"
#include "kernels.h"
#include "plan.h"

#define S_MAX_GRID 65535u

static __device__ __forceinline__ float s_warp_sum (float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync (0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float s_warp_max (float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf (v, __shfl_xor_sync (0xffffffffu, v, o));
    return v;
}

/* Block-wide sum/max; every thread gets the result.  red: 32 floats of
 * shared memory; blockDim.x a multiple of 32. */
static __device__ float s_block_sum (float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = s_warp_sum (v);
    __syncthreads ();
    if (lane == 0) red[warp] = v;
    __syncthreads ();
    v = lane < nw ? red[lane] : 0.f;
    return s_warp_sum (v);
}

static __device__ float s_block_max (float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = s_warp_max (v);
    __syncthreads ();
    if (lane == 0) red[warp] = v;
    __syncthreads ();
    v = lane < nw ? red[lane] : -INFINITY;
    return s_warp_max (v);
}

/* (value, index) "better": larger value, lower index on ties. */
static __device__ __forceinline__ bool s_better (float v, int i, float bv, int bi)
{
    if (i < 0) return false;      /* an idle lane's empty candidate */
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

static __device__ void s_block_best (float *v, int *i, float *rv, int *ri)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync (0xffffffffu, *v, o);
        int oi = __shfl_xor_sync (0xffffffffu, *i, o);
        if (s_better (ov, oi, *v, *i)) { *v = ov; *i = oi; }
    }
    __syncthreads ();
    if (lane == 0) { rv[warp] = *v; ri[warp] = *i; }
    __syncthreads ();
    *v = lane < nw ? rv[lane] : -INFINITY;
    *i = lane < nw ? ri[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync (0xffffffffu, *v, o);
        int oi = __shfl_xor_sync (0xffffffffu, *i, o);
        if (s_better (ov, oi, *v, *i)) { *v = ov; *i = oi; }
    }
}

static int s_status (void) { return (int) cudaGetLastError (); }

/* ------------------------------------------------------ weight readers -- */

template <int DT>
static __global__ void k_get_rows (const uint8_t *w, size_t row_bytes, size_t ne0, uint64_t n_rows,
                                   const int32_t *ids, size_t n, float *out, size_t ldo)
{
    const size_t nch = ne0 / 32, total = n * nch;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t i = t / nch, c = t % nch;
        const int32_t id = ids[i];
        float v[32];
        if (id >= 0 && (uint64_t) id < n_rows) rx_cu_deq32 (DT, w + (size_t) id * row_bytes, c, v);
        else
            for (int j = 0; j < 32; j++) v[j] = 0.f;
        float *o = out + i * ldo + c * 32;
        for (int j = 0; j < 32; j++) o[j] = v[j];
    }
}

/* Warp sums of sum[0..n) to y[r][o] (lane 0 writes). */
static __device__ __forceinline__ void s_mv_store (const float *sum, int n, int lane, float *y,
                                                   size_t ldy, int o, int acc)
{
#pragma unroll
    for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) {
        if (r >= n) break;
        const float s = s_warp_sum (sum[r]);
        if (lane == 0) {
            float *yo = y + (size_t) r * ldy + o;
            *yo = acc ? *yo + s : s;
        }
    }
}

/* dot (w[0..4k), x[0..4k)), x 16-byte aligned. */
template <int K4>
static __device__ __forceinline__ float s_dot4 (const float *w, const float *x)
{
    const float4 *xv = (const float4 *) x;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < K4; j++) {
        const float4 q = xv[j];
        s += w[4 * j] * q.x + w[4 * j + 1] * q.y + w[4 * j + 2] * q.z + w[4 * j + 3] * q.w;
    }
    return s;
}

/* One warp's output o of n <= RX_CU_MV_MAX_ROWS activation rows against
 * weight row `row`: lane l decodes 32-element chunks l, l+32, ... of the
 * row once and dots each with every activation row (the weight is the
 * bandwidth; activations hit L1/L2).  k_matvec and k_mv_grouped. */
template <int DT>
static __device__ __forceinline__ void s_mv_warp (const uint8_t *row, int in, const float *x,
                                                  size_t ldx, float *y, size_t ldy, int n, int o,
                                                  int lane, int acc)
{
    float sum[RX_CU_MV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) sum[r] = 0.f;
    const int nch = in / 32;
    for (int c = lane; c < nch; c += 32) {
        float v[32];
        rx_cu_deq32 (DT, row, (size_t) c, v);
#pragma unroll
        for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) {
            if (r >= n) break;
            const float *xs = x + (size_t) r * ldx + (size_t) c * 32;
            float s = 0.f;
            if ((((uintptr_t) xs) & 15) == 0) {
                s = s_dot4<8> (v, xs);
            } else {
                for (int j = 0; j < 32; j++) s += v[j] * xs[j];
            }
            sum[r] += s;
        }
    }
    s_mv_store (sum, n, lane, y, ldy, o, acc);
}

/* One warp per output row (s_mv_warp). */
template <int DT>
static __global__ void k_matvec (const uint8_t *w, size_t row_bytes, int in, int out, const float *x,
                                 size_t ldx, float *y, size_t ldy, int n, int acc)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o = blockIdx.x * RX_CU_MV_WARPS + warp;
    if (o >= out) return;
    s_mv_warp<DT> (w + (size_t) o * row_bytes, in, x, ldx, y, ldy, n, o, lane, acc);
}

/* ---- the fast matvec kernels (plan.h RX_CUMV_VEC / RX_CUMV_STAGE) ----
 *
 * k_matvec above decodes a 32-element chunk per lane with byte loads: a
 * BF16 chunk is 64 one-byte loads, and the lanes of a warp read 64 bytes
 * apart.  It ran at ~8% of the H200's copy bandwidth.  These two read the
 * weight row with coalesced 16-byte loads instead, several in flight per
 * lane, which is what a memory-bound matvec needs. */

/* 16 weight bytes (E = 4 F32 or 8 F16/BF16 elements) as floats.  F16 and
 * BF16 to F32 are exact, so the products are the simple kernel's. */
template <int DT>
static __device__ __forceinline__ void s_unpack16 (const uint4 u, float *v)
{
    const uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (DT == RX_CU_F32) {
            v[i] = __uint_as_float (w[i]);
        } else if (DT == RX_CU_BF16) {
            v[2 * i] = __uint_as_float (w[i] << 16);
            v[2 * i + 1] = __uint_as_float (w[i] & 0xffff0000u);
        } else {
            v[2 * i] = __half2float (__ushort_as_half ((unsigned short) (w[i] & 0xffffu)));
            v[2 * i + 1] = __half2float (__ushort_as_half ((unsigned short) (w[i] >> 16)));
        }
    }
}

/* F32/F16/BF16 weights: one warp per output row; lane l reads the row's
 * 16-byte vectors l, l + 32, ..., RX_CU_MV_UNROLL of them before it uses
 * any.  Needs row_bytes % 16 == 0, w and x 16-byte aligned, ldx % 4 == 0
 * (the launcher checks, else the simple kernel runs). */
template <int DT>
static __global__ void __launch_bounds__ (32 * RX_CU_MV_WARPS)
k_mv_vec (const uint8_t *w, size_t row_bytes, int in, int out, const float *x, size_t ldx,
          float *y, size_t ldy, int n, int acc)
{
    constexpr int E = DT == RX_CU_F32 ? 4 : 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o = blockIdx.x * RX_CU_MV_WARPS + warp;
    if (o >= out) return;
    const uint4 *row = (const uint4 *) (w + (size_t) o * row_bytes);
    const int nv = in / E;
    float sum[RX_CU_MV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) sum[r] = 0.f;
    for (int v0 = 0; v0 < nv; v0 += 32 * RX_CU_MV_UNROLL) {
        uint4 u[RX_CU_MV_UNROLL];
#pragma unroll
        for (int k = 0; k < RX_CU_MV_UNROLL; k++) {
            const int v = v0 + k * 32 + lane;
            u[k] = v < nv ? __ldg (row + v) : make_uint4 (0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int k = 0; k < RX_CU_MV_UNROLL; k++) {
            const int v = v0 + k * 32 + lane;
            if (v >= nv) break;
            float wv[E];
            s_unpack16<DT> (u[k], wv);
#pragma unroll
            for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) {
                if (r >= n) break;
                sum[r] += s_dot4<E / 4> (wv, x + (size_t) r * ldx + (size_t) v * E);
            }
        }
    }
    s_mv_store (sum, n, lane, y, ldy, o, acc);
}

/* Bytes of RX_CU_MV_STAGE elements of a block type (a multiple of 16 for
 * every type: plan.c checks it, the host test too). */
template <int DT>
static __host__ __device__ constexpr int s_stage_bytes ()
{
    return DT == RX_CU_Q8_0 ? RX_CU_MV_STAGE / 32 * 34
         : DT == RX_CU_Q4_0 ? RX_CU_MV_STAGE / 32 * 18
         : DT == RX_CU_Q4_1 ? RX_CU_MV_STAGE / 32 * 20
         : DT == RX_CU_Q4_K ? RX_CU_MV_STAGE / 256 * 144
         : DT == RX_CU_Q5_K ? RX_CU_MV_STAGE / 256 * 176
         : DT == RX_CU_Q6_K ? RX_CU_MV_STAGE / 256 * 210
         : 16;
}

/* Block-quantized weights: one warp per output row.  The warp copies
 * RX_CU_MV_STAGE elements of the row at a time (whole blocks, a multiple
 * of 16 bytes) into its slice of shared memory with coalesced 16-byte
 * loads, then each lane decodes 32-element chunks from there with the
 * tested block decoder (cu_math.h rx_cu_deq32) and dots them with the
 * activations.  Needs row_bytes % 16 == 0, w and x 16-byte aligned,
 * ldx % 4 == 0. */
template <int DT>
static __global__ void __launch_bounds__ (32 * RX_CU_MV_WARPS)
k_mv_stage (const uint8_t *w, size_t row_bytes, int in, int out, const float *x, size_t ldx,
            float *y, size_t ldy, int n, int acc)
{
    constexpr int SB = s_stage_bytes<DT> ();
    static_assert (SB % 16 == 0, "a stage must be whole 16-byte vectors");
    __shared__ uint4 stage[RX_CU_MV_WARPS][SB / 16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o = blockIdx.x * RX_CU_MV_WARPS + warp;
    if (o >= out) return;   /* whole warps leave: only __syncwarp below */
    const uint8_t *row = w + (size_t) o * row_bytes;
    uint4 *buf = stage[warp];
    float sum[RX_CU_MV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) sum[r] = 0.f;
    for (int e0 = 0; e0 < in; e0 += RX_CU_MV_STAGE) {
        const int ne = in - e0 < RX_CU_MV_STAGE ? in - e0 : RX_CU_MV_STAGE;
        const size_t nb = rx_cu_row_bytes (DT, (size_t) ne);
        /* e0 is a multiple of the stage: 16-byte aligned in the row. */
        const uint4 *src = (const uint4 *) (row + (size_t) (e0 / RX_CU_MV_STAGE) * SB);
        const int n16 = (int) (nb / 16);   /* whole: row_bytes and SB are multiples of 16 */
        __syncwarp ();   /* every lane is done with the previous stage */
        for (int v0 = 0; v0 < n16; v0 += 32 * 4) {
            uint4 t[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int v = v0 + k * 32 + lane;
                if (v < n16) t[k] = __ldg (src + v);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int v = v0 + k * 32 + lane;
                if (v < n16) buf[v] = t[k];
            }
        }
        __syncwarp ();
        const int nc = ne / 32;
        for (int c = lane; c < nc; c += 32) {
            float v[32];
            rx_cu_deq32 (DT, (const uint8_t *) buf, (size_t) c, v);
#pragma unroll
            for (int r = 0; r < RX_CU_MV_MAX_ROWS; r++) {
                if (r >= n) break;
                sum[r] += s_dot4<8> (v, x + (size_t) r * ldx + (size_t) e0 + (size_t) c * 32);
            }
        }
    }
    s_mv_store (sum, n, lane, y, ldy, o, acc);
}

template <int DT>
static __global__ void k_dequant_f16 (const uint8_t *w, size_t row_bytes, size_t in, size_t rows,
                                      __half *dst)
{
    const size_t nch = in / 32, total = rows * nch;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t r = t / nch, c = t % nch;
        float v[32];
        rx_cu_deq32 (DT, w + r * row_bytes, c, v);
        __half *d = dst + r * in + c * 32;
        for (int j = 0; j < 32; j++) d[j] = __float2half_rn (v[j]);
    }
}

template <int DT>
static __global__ void k_dequant_f32 (const uint8_t *w, size_t row_bytes, size_t in, size_t rows,
                                      float *dst)
{
    const size_t nch = in / 32, total = rows * nch;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t r = t / nch, c = t % nch;
        float v[32];
        rx_cu_deq32 (DT, w + r * row_bytes, c, v);
        float *d = dst + r * in + c * 32;
        for (int j = 0; j < 32; j++) d[j] = v[j];
    }
}

#define S_DISPATCH(dtype, KERNEL, grid, block, ...)                                     \
    switch (dtype) {                                                                    \
    case RX_CU_F32: KERNEL<RX_CU_F32><<<grid, block, 0, st>>> (__VA_ARGS__); break;     \
    case RX_CU_F16: KERNEL<RX_CU_F16><<<grid, block, 0, st>>> (__VA_ARGS__); break;     \
    case RX_CU_BF16: KERNEL<RX_CU_BF16><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    case RX_CU_Q8_0: KERNEL<RX_CU_Q8_0><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    case RX_CU_Q4_0: KERNEL<RX_CU_Q4_0><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    case RX_CU_Q4_1: KERNEL<RX_CU_Q4_1><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    case RX_CU_Q4_K: KERNEL<RX_CU_Q4_K><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    case RX_CU_Q5_K: KERNEL<RX_CU_Q5_K><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    case RX_CU_Q6_K: KERNEL<RX_CU_Q6_K><<<grid, block, 0, st>>> (__VA_ARGS__); break;   \
    default: return (int) cudaErrorInvalidValue;                                        \
    }

/* get_rows of an F32/F16/BF16 weight whose rows are not whole 32-element
 * chunks: one thread per element. */
static __global__ void k_get_rows_plain (int dtype, const uint8_t *w, size_t row_bytes, size_t ne0,
                                         uint64_t n_rows, const int32_t *ids, size_t n, float *out,
                                         size_t ldo)
{
    const size_t total = n * ne0;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t i = t / ne0, j = t % ne0;
        const int32_t id = ids[i];
        float v = 0.f;
        if (id >= 0 && (uint64_t) id < n_rows) {
            const uint8_t *r = w + (size_t) id * row_bytes;
            if (dtype == RX_CU_F32) v = ((const float *) r)[j];
            else if (dtype == RX_CU_F16) v = rx_cu_h2f (((const uint16_t *) r)[j]);
            else v = rx_cu_bf2f (((const uint16_t *) r)[j]);
        }
        out[i * ldo + j] = v;
    }
}

extern "C" int rx_cuk_get_rows (cudaStream_t st, int dtype, const void *w, size_t row_bytes,
                                size_t ne0, uint64_t n_rows, const int32_t *ids, size_t n,
                                float *out, size_t ldo)
{
    if (n == 0) return 0;
    if (ne0 % 32) {
        k_get_rows_plain<<<rx_cuplan_blocks (n * ne0, 256, S_MAX_GRID), 256, 0, st>>> (
            dtype, (const uint8_t *) w, row_bytes, ne0, n_rows, ids, n, out, ldo);
        return s_status ();
    }
    const uint32_t g = rx_cuplan_blocks (n * (ne0 / 32), 128, S_MAX_GRID);
    S_DISPATCH (dtype, k_get_rows, g, 128, (const uint8_t *) w, row_bytes, ne0, n_rows, ids, n,
                out, ldo);
    return s_status ();
}

extern "C" int rx_cuk_matvec (cudaStream_t st, int dtype, const void *w, size_t row_bytes,
                              size_t in, size_t out, const float *x, size_t ldx, float *y,
                              size_t ldy, size_t n, int accumulate, int kernel)
{
    /* The fast kernels read x as float4: aligned rows only, else simple. */
    if (kernel != RX_CUMV_SIMPLE &&
        ((((uintptr_t) w) & 15) || (((uintptr_t) x) & 15) || (n > 1 && ldx % 4)))
        kernel = RX_CUMV_SIMPLE;
    const uint32_t g = rx_cuplan_blocks (out, RX_CU_MV_WARPS, 0);
    for (size_t r0 = 0; r0 < n; r0 += RX_CU_MV_MAX_ROWS) {
        const int nr = (int) (n - r0 < RX_CU_MV_MAX_ROWS ? n - r0 : RX_CU_MV_MAX_ROWS);
        const uint8_t *wb = (const uint8_t *) w;
        const float *xr = x + r0 * ldx;
        float *yr = y + r0 * ldy;
        if (kernel == RX_CUMV_VEC) {
            switch (dtype) {
            case RX_CU_F32: k_mv_vec<RX_CU_F32><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_F16: k_mv_vec<RX_CU_F16><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_BF16: k_mv_vec<RX_CU_BF16><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            default: return (int) cudaErrorInvalidValue;
            }
        } else if (kernel == RX_CUMV_STAGE) {
            switch (dtype) {
            case RX_CU_Q8_0: k_mv_stage<RX_CU_Q8_0><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_Q4_0: k_mv_stage<RX_CU_Q4_0><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_Q4_1: k_mv_stage<RX_CU_Q4_1><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_Q4_K: k_mv_stage<RX_CU_Q4_K><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_Q5_K: k_mv_stage<RX_CU_Q5_K><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            case RX_CU_Q6_K: k_mv_stage<RX_CU_Q6_K><<<g, 32 * RX_CU_MV_WARPS, 0, st>>> (wb, row_bytes, (int) in, (int) out, xr, ldx, yr, ldy, nr, accumulate); break;
            default: return (int) cudaErrorInvalidValue;
            }
        } else {
            S_DISPATCH (dtype, k_matvec, g, 32 * RX_CU_MV_WARPS, wb, row_bytes, (int) in,
                        (int) out, xr, ldx, yr, ldy, nr, accumulate);
        }
        int rc = s_status ();
        if (rc) return rc;
    }
    return 0;
}

extern "C" int rx_cuk_dequant_f16 (cudaStream_t st, int dtype, const void *w, size_t row_bytes,
                                   size_t in, size_t rows, void *dst)
{
    const uint32_t g = rx_cuplan_blocks (rows * (in / 32), 256, S_MAX_GRID);
    S_DISPATCH (dtype, k_dequant_f16, g, 256, (const uint8_t *) w, row_bytes, in, rows,
                (__half *) dst);
    return s_status ();
}

extern "C" int rx_cuk_dequant_f32 (cudaStream_t st, int dtype, const void *w, size_t row_bytes,
                                   size_t in, size_t rows, void *dst)
{
    const uint32_t g = rx_cuplan_blocks (rows * (in / 32), 256, S_MAX_GRID);
    S_DISPATCH (dtype, k_dequant_f32, g, 256, (const uint8_t *) w, row_bytes, in, rows,
                (float *) dst);
    return s_status ();
}

/* ------------------------------------------------------------ elementwise -- */

static __global__ void k_convert (const float *x, size_t ldx, size_t n, size_t in, void *dst,
                                  int bf16)
{
    const size_t total = n * in;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t r = t / in, c = t % in;
        const float v = x[r * ldx + c];
        if (bf16) ((__nv_bfloat16 *) dst)[t] = __float2bfloat16_rn (v);
        else ((__half *) dst)[t] = __float2half_rn (v);
    }
}

extern "C" int rx_cuk_convert (cudaStream_t st, const float *x, size_t ldx, size_t n, size_t in,
                               void *dst, int bf16)
{
    if (n == 0) return 0;
    k_convert<<<rx_cuplan_blocks (n * in, 256, S_MAX_GRID), 256, 0, st>>> (x, ldx, n, in, dst, bf16);
    return s_status ();
}

/* Part p of x (p < parts) is round((x - sum of parts < p, each scaled) *
 * scale^p): each residual x - round(x) is exact in F32, so parts * 11 (F16)
 * or parts * 8 (BF16) bits of every activation survive. */
static __global__ void k_convert_split (const float *x, size_t ldx, size_t n, size_t in,
                                        void *dst, int bf16, int parts, float scale)
{
    const size_t total = n * in;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t r = t / in, c = t % in;
        uint16_t h[4];
        rx_cu_split_half (x[r * ldx + c], bf16, parts, scale, h);
        for (int p = 0; p < parts; p++) ((uint16_t *) dst)[(size_t) p * total + t] = h[p];
    }
}

extern "C" int rx_cuk_convert_split (cudaStream_t st, const float *x, size_t ldx, size_t n,
                                     size_t in, void *dst, int bf16, int parts, float scale)
{
    if (n == 0) return 0;
    if (parts < 1 || parts > 4) return (int) cudaErrorInvalidValue;
    k_convert_split<<<rx_cuplan_blocks (n * in, 256, S_MAX_GRID), 256, 0, st>>> (
        x, ldx, n, in, dst, bf16, parts, scale);
    return s_status ();
}

/* One thread per activation block: kernels-cpu's activation quantization
 * (cu_math.h), written back as F32 into a dense [n][in] scratch. */
static __global__ void k_act_qdq (const float *x, size_t ldx, size_t n, size_t in, int qblk,
                                  float *dst)
{
    const size_t nb = in / (size_t) qblk, total = n * nb;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t r = t / nb, b = t % nb;
        const float *xs = x + r * ldx + b * (size_t) qblk;
        float *o = dst + r * in + b * (size_t) qblk;
        if (qblk == 32) rx_cu_q8a_qdq32 (xs, o);
        else rx_cu_q8k_qdq256 (xs, o);
    }
}

extern "C" int rx_cuk_act_qdq (cudaStream_t st, const float *x, size_t ldx, size_t n, size_t in,
                               int qblk, float *dst)
{
    if (n == 0) return 0;
    if ((qblk != 32 && qblk != 256) || in % (size_t) qblk) return (int) cudaErrorInvalidValue;
    k_act_qdq<<<rx_cuplan_blocks (n * (in / (size_t) qblk), 128, S_MAX_GRID), 128, 0, st>>> (
        x, ldx, n, in, qblk, dst);
    return s_status ();
}

static __global__ void k_ew (int op, const float *a, size_t lda, const float *b, size_t ldb,
                             float *y, size_t ldy, size_t rows, size_t dim, float alpha)
{
    const size_t total = rows * dim;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t r = t / dim, c = t % dim;
        const float av = a[r * lda + c];
        float v;
        switch (op) {
        case RX_CUK_ADD: v = av + b[r * ldb + c]; break;
        case RX_CUK_MUL: v = av * b[r * ldb + c]; break;
        case RX_CUK_SCALE: v = alpha * av; break;
        case RX_CUK_SIGMOID: v = 1.f / (1.f + expf (-av)); break;
        case RX_CUK_SWIGLU: v = av / (1.f + expf (-av)) * b[r * ldb + c]; break;
        default: v = av; break;
        }
        y[r * ldy + c] = v;
    }
}

extern "C" int rx_cuk_ew (cudaStream_t st, int op, const float *a, size_t lda, const float *b,
                          size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, float alpha)
{
    if (rows == 0 || dim == 0) return 0;
    k_ew<<<rx_cuplan_blocks (rows * dim, 256, S_MAX_GRID), 256, 0, st>>> (op, a, lda, b, ldb, y,
                                                                         ldy, rows, dim, alpha);
    return s_status ();
}

/* --------------------------------------------------------- row reductions -- */

static __global__ void k_rms_norm (const float *x, size_t ldx, const float *w, float *y,
                                   size_t ldy, size_t dim, float eps)
{
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * ldx;
    float *yr = y + blockIdx.x * ldy;
    float s = 0.f;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i] * xr[i];
    s = s_block_sum (s, red);
    const float r = rsqrtf (s / (float) dim + eps);
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * r * (w ? w[i] : 1.f);
}

extern "C" int rx_cuk_rms_norm (cudaStream_t st, const float *x, size_t ldx, const float *w,
                                float *y, size_t ldy, size_t rows, size_t dim, float eps)
{
    for (size_t r0 = 0; r0 < rows; r0 += S_MAX_GRID) {
        const size_t nr = rows - r0 < S_MAX_GRID ? rows - r0 : S_MAX_GRID;
        k_rms_norm<<<(unsigned) nr, rx_cuplan_row_threads (dim), 0, st>>> (x + r0 * ldx, ldx, w,
                                                                           y + r0 * ldy, ldy, dim, eps);
    }
    return s_status ();
}

static __global__ void k_softmax (float *x, size_t ldx, size_t dim, float scale)
{
    __shared__ float red[32];
    float *xr = x + blockIdx.x * ldx;
    float m = -INFINITY;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) m = fmaxf (m, scale * xr[i]);
    m = s_block_max (m, red);
    float s = 0.f;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float e = expf (scale * xr[i] - m);
        xr[i] = e;
        s += e;
    }
    s = s_block_sum (s, red);
    const float inv = 1.f / s;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) xr[i] *= inv;
}

extern "C" int rx_cuk_softmax (cudaStream_t st, float *x, size_t ldx, size_t rows, size_t dim,
                               float scale)
{
    for (size_t r0 = 0; r0 < rows; r0 += S_MAX_GRID) {
        const size_t nr = rows - r0 < S_MAX_GRID ? rows - r0 : S_MAX_GRID;
        k_softmax<<<(unsigned) nr, rx_cuplan_row_threads (dim), 0, st>>> (x + r0 * ldx, ldx, dim,
                                                                          scale);
    }
    return s_status ();
}

/* Top-k by k rounds of "best element after the previous one" in the order
 * (value descending, index ascending): no scratch, exact CPU tie order. */
static __global__ void k_topk (const float *x, size_t ldx, size_t dim, size_t k, float *vals,
                               int32_t *idx)
{
    __shared__ float rv[32];
    __shared__ int ri[32];
    const float *xr = x + blockIdx.x * ldx;
    float pv = INFINITY;
    int pi = -1;
    for (size_t j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = -1;
        for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float v = xr[i];
            const bool after = v < pv || (v == pv && (int) i > pi);
            if (after && s_better (v, (int) i, bv, bi)) { bv = v; bi = (int) i; }
        }
        s_block_best (&bv, &bi, rv, ri);
        if (threadIdx.x == 0) {
            idx[blockIdx.x * k + j] = bi;
            if (vals) vals[blockIdx.x * k + j] = bv;
        }
        pv = bv;
        pi = bi;
    }
}

extern "C" int rx_cuk_topk (cudaStream_t st, const float *x, size_t ldx, size_t rows, size_t dim,
                            size_t k, float *vals, int32_t *idx)
{
    for (size_t r0 = 0; r0 < rows; r0 += S_MAX_GRID) {
        const size_t nr = rows - r0 < S_MAX_GRID ? rows - r0 : S_MAX_GRID;
        k_topk<<<(unsigned) nr, rx_cuplan_row_threads (dim), 0, st>>> (
            x + r0 * ldx, ldx, dim, k, vals ? vals + r0 * k : NULL, idx + r0 * k);
    }
    return s_status ();
}

extern "C" int rx_cuk_argmax (cudaStream_t st, const float *x, size_t ldx, size_t rows,
                              size_t dim, int32_t *out)
{
    return rx_cuk_topk (st, x, ldx, rows, dim, 1, NULL, out);
}

/* ------------------------------------------------------------------ rope -- */

static __global__ void k_rope (float *x, size_t ldx, size_t n_tok, size_t n_head, size_t ld_head,
                               const int32_t *pos, int neox, int n_rot, float theta_scale,
                               float freq_scale, float ext_factor, float attn_factor, float corr0,
                               float corr1, const float *ff)
{
    const size_t half = (size_t) n_rot / 2, total = n_tok * n_head * half;
    const float corr[2] = { corr0, corr1 };
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t i = t % half, h = (t / half) % n_head, tok = t / (half * n_head);
        const int i0 = (int) (2 * i);
        float c, s;
        rx_cu_rope_cs ((float) pos[tok], i0, theta_scale, ff ? ff[i] : 1.f, freq_scale, ext_factor,
                       attn_factor, corr, &c, &s);
        float *xh = x + tok * ldx + h * ld_head;
        const size_t a = neox ? i : (size_t) i0, b = neox ? i + half : (size_t) i0 + 1;
        const float x0 = xh[a], x1 = xh[b];
        /* no fma contraction: the CPU rounds each product */
        xh[a] = RX_CU_SUB (RX_CU_MUL (x0, c), RX_CU_MUL (x1, s));
        xh[b] = RX_CU_ADD (RX_CU_MUL (x0, s), RX_CU_MUL (x1, c));
    }
}

extern "C" int rx_cuk_rope (cudaStream_t st, float *x, size_t ldx, size_t n_tok, size_t n_head,
                            size_t ld_head, const int32_t *pos, int neox, int n_rot,
                            float theta_scale, float freq_scale, float ext_factor,
                            float attn_factor, float corr0, float corr1, const float *freq_factors)
{
    const size_t total = n_tok * n_head * (size_t) (n_rot / 2);
    if (total == 0) return 0;
    k_rope<<<rx_cuplan_blocks (total, 256, S_MAX_GRID), 256, 0, st>>> (
        x, ldx, n_tok, n_head, ld_head, pos, neox, n_rot, theta_scale, freq_scale, ext_factor,
        attn_factor, corr0, corr1, freq_factors);
    return s_status ();
}

/* ------------------------------------------------------------- KV cache -- */

static __global__ void k_kv_store (void *kpool, void *vpool, int f16, size_t nk, size_t nv,
                                   uint64_t n_slots, const float *k, size_t ldk, const float *v,
                                   size_t ldv, const int32_t *slots, size_t n_tok)
{
    const size_t per = nk + nv, total = n_tok * per;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t tok = t / per, e = t % per;
        const int32_t s = slots[tok];
        if (s < 0 || (uint64_t) s >= n_slots) continue;
        const bool isk = e < nk;
        const size_t j = isk ? e : e - nk, rowlen = isk ? nk : nv;
        const float val = isk ? k[tok * ldk + j] : v[tok * ldv + j];
        void *base = isk ? kpool : vpool;
        const size_t at = (size_t) s * rowlen + j;
        if (f16) ((__half *) base)[at] = __float2half_rn (val);
        else ((float *) base)[at] = val;
    }
}

extern "C" int rx_cuk_kv_store (cudaStream_t st, void *kpool, void *vpool, int f16, size_t nk,
                                size_t nv, uint64_t n_slots, const float *k, size_t ldk,
                                const float *v, size_t ldv, const int32_t *slots, size_t n_tok)
{
    if (n_tok == 0) return 0;
    k_kv_store<<<rx_cuplan_blocks (n_tok * (nk + nv), 256, S_MAX_GRID), 256, 0, st>>> (
        kpool, vpool, f16, nk, nv, n_slots, k, ldk, v, ldv, slots, n_tok);
    return s_status ();
}

/* ------------------------------------------------------------- attention -- */

static __device__ __forceinline__ float s_kv (const void *base, int f16, size_t at)
{
    return f16 ? __half2float (((const __half *) base)[at]) : ((const float *) base)[at];
}

#define S_ATTN_MAXV 8   /* output dims per thread: hd_v <= 8 * RX_CU_ATTN_THREADS */

/* The keys of one (query row, head): the row's sequence (the last s with
 * q_start[s] <= t), its window start and its length, the slot list from
 * the window start, and the KV head; q's head row goes into shared qs. */
struct s_attn_row {
    const int32_t *sl;
    int len, kvh;
};

static __device__ __forceinline__ s_attn_row s_attn_row_setup (
    const float *q, size_t ldq, int n_kv_head, int hd_k, int n_seq, const int32_t *q_start,
    const int32_t *kv_start, const int32_t *slots, const int32_t *q_pos, int n_head, int window,
    int t, int h, float *qs)
{
    int lo = 0, hi = n_seq - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (q_start[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int pos = q_pos[t];
    const int first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    s_attn_row r;
    r.len = pos - first + 1;
    r.sl = slots + kv_start[lo] + first;
    r.kvh = h / (n_head / n_kv_head);
    for (int i = threadIdx.x; i < hd_k; i += blockDim.x) qs[i] = q[(size_t) t * ldq + (size_t) h * hd_k + i];
    return r;
}

/* Positions [j_begin, j_end) of a row's keys (sl) into the online-softmax
 * state m, l, acc of the calling block: tiles of RX_CU_ATTN_TILE
 * positions, scores by warps (lanes split the q.k dot) into the score tile
 * sc, then the update of the running max/sum and of the V accumulators
 * each thread owns (output dims threadIdx.x + j * blockDim.x).  Starts
 * and ends with the block in step (q in qs must be visible). */
static __device__ __forceinline__ void s_attn_keys (
    const float *qs, float *sc, const void *kpool, const void *vpool, int f16, int hd_k, int hd_v,
    uint64_t n_slots, const int32_t *sl, int kvh, size_t krow, size_t vrow, float scale,
    float softcap, int j_begin, int j_end, float (&acc)[S_ATTN_MAXV], float &m, float &l)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j0 = j_begin; j0 < j_end; j0 += RX_CU_ATTN_TILE) {
        const int nt = j_end - j0 < RX_CU_ATTN_TILE ? j_end - j0 : RX_CU_ATTN_TILE;
        for (int jj = warp; jj < nt; jj += nw) {
            const int32_t s = sl[j0 + jj];
            float d = 0.f;
            if (s >= 0 && (uint64_t) s < n_slots) {
                const size_t kb = (size_t) s * krow + (size_t) kvh * hd_k;
                for (int i = lane; i < hd_k; i += 32) d += qs[i] * s_kv (kpool, f16, kb + i);
            }
            d = s_warp_sum (d) * scale;
            if (softcap > 0.f) d = softcap * tanhf (d / softcap);
            if (lane == 0) sc[jj] = d;
        }
        __syncthreads ();
        float tm = -INFINITY;
        for (int jj = 0; jj < nt; jj++) tm = fmaxf (tm, sc[jj]);
        const float nm = fmaxf (m, tm);
        const float corr = m == -INFINITY ? 0.f : expf (m - nm);
        __syncthreads ();
        for (int jj = threadIdx.x; jj < nt; jj += blockDim.x) sc[jj] = expf (sc[jj] - nm);
        __syncthreads ();
        float ps = 0.f;
        for (int jj = 0; jj < nt; jj++) ps += sc[jj];
        l = l * corr + ps;
#pragma unroll
        for (int j = 0; j < S_ATTN_MAXV; j++) acc[j] *= corr;
        for (int jj = 0; jj < nt; jj++) {
            const int32_t s = sl[j0 + jj];
            if (s < 0 || (uint64_t) s >= n_slots) continue;
            const size_t vb = (size_t) s * vrow + (size_t) kvh * hd_v;
            const float p = sc[jj];
#pragma unroll
            for (int j = 0; j < S_ATTN_MAXV; j++) {
                const int d = threadIdx.x + j * blockDim.x;
                if (d < hd_v) acc[j] += p * s_kv (vpool, f16, vb + d);
            }
        }
        m = nm;
        __syncthreads ();
    }
}

/* One block per (query row, head): every key position of the row through
 * s_attn_keys (flash-style: the score row is never materialised).  The
 * same kernel serves decode (1 row per sequence) and prefill; MLA in the
 * absorbed form is this with one KV head, hd_k = kv_lora + rope dims,
 * hd_v = kv_lora. */
static __global__ void k_attention (const float *q, size_t ldq, const void *kpool, const void *vpool,
                                    int f16, int n_kv_head, int hd_k, int hd_v, uint64_t n_slots,
                                    int n_seq, const int32_t *q_start, const int32_t *kv_start,
                                    const int32_t *slots, const int32_t *q_pos, int n_head,
                                    float scale, float softcap, int window, float *out, size_t ldo)
{
    extern __shared__ float sm[];
    float *qs = sm, *sc = sm + hd_k;
    const int t = blockIdx.x, h = blockIdx.y;
    const s_attn_row r = s_attn_row_setup (q, ldq, n_kv_head, hd_k, n_seq, q_start, kv_start, slots,
                                           q_pos, n_head, window, t, h, qs);
    const size_t krow = (size_t) n_kv_head * hd_k, vrow = (size_t) n_kv_head * hd_v;
    float acc[S_ATTN_MAXV];
#pragma unroll
    for (int j = 0; j < S_ATTN_MAXV; j++) acc[j] = 0.f;
    float m = -INFINITY, l = 0.f;
    __syncthreads ();
    s_attn_keys (qs, sc, kpool, vpool, f16, hd_k, hd_v, n_slots, r.sl, r.kvh, krow, vrow, scale,
                 softcap, 0, r.len, acc, m, l);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float *o = out + (size_t) t * ldo + (size_t) h * hd_v;
#pragma unroll
    for (int j = 0; j < S_ATTN_MAXV; j++) {
        const int d = threadIdx.x + j * blockDim.x;
        if (d < hd_v) o[d] = acc[j] * inv;
    }
}

/* Split-K ("flash-decoding", plan.h rx_cuplan_attn_splits): block (t, h,
 * sp) of a grid rows x heads x n_split takes key positions [sp * chunk,
 * min (len, (sp + 1) * chunk)) of row t, chunk = max (RX_CU_ATTN_TILE,
 * ceil (len / n_split)), and writes its unnormalised state to
 * part[t][h][sp] = { acc[hd_v], m, l } (a block past the end writes the
 * empty state m = -inf, l = 0, acc = 0).  k_attn_merge combines them. */
static __global__ void k_attn_split (const float *q, size_t ldq, const void *kpool, const void *vpool,
                                     int f16, int n_kv_head, int hd_k, int hd_v, uint64_t n_slots,
                                     int n_seq, const int32_t *q_start, const int32_t *kv_start,
                                     const int32_t *slots, const int32_t *q_pos, int n_head,
                                     float scale, float softcap, int window, int n_split,
                                     float *part)
{
    extern __shared__ float sm[];
    float *qs = sm, *sc = sm + hd_k;
    const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z;
    const s_attn_row r = s_attn_row_setup (q, ldq, n_kv_head, hd_k, n_seq, q_start, kv_start, slots,
                                           q_pos, n_head, window, t, h, qs);
    const size_t krow = (size_t) n_kv_head * hd_k, vrow = (size_t) n_kv_head * hd_v;
    int chunk = (r.len + n_split - 1) / n_split;
    if (chunk < RX_CU_ATTN_TILE) chunk = RX_CU_ATTN_TILE;
    const int64_t b64 = (int64_t) sp * chunk, e64 = b64 + chunk;
    const int jb = b64 < r.len ? (int) b64 : r.len, je = e64 < r.len ? (int) e64 : r.len;
    float acc[S_ATTN_MAXV];
#pragma unroll
    for (int j = 0; j < S_ATTN_MAXV; j++) acc[j] = 0.f;
    float m = -INFINITY, l = 0.f;
    __syncthreads ();
    s_attn_keys (qs, sc, kpool, vpool, f16, hd_k, hd_v, n_slots, r.sl, r.kvh, krow, vrow, scale,
                 softcap, jb, je, acc, m, l);
    float *o = part + (((size_t) t * gridDim.y + h) * n_split + sp) * ((size_t) hd_v + 2);
#pragma unroll
    for (int j = 0; j < S_ATTN_MAXV; j++) {
        const int d = threadIdx.x + j * blockDim.x;
        if (d < hd_v) o[d] = acc[j];
    }
    if (threadIdx.x == 0) {
        o[hd_v] = m;
        o[hd_v + 1] = l;
    }
}

/* One block per (query row, head): out = sum_i acc_i e^(m_i - M) /
 * sum_i l_i e^(m_i - M), M = max_i m_i over the n_split partials with
 * l_i > 0 (an empty split is skipped; no keys at all -> zeros, as
 * k_attention writes). */
static __global__ void k_attn_merge (const float *part, int n_split, int hd_v, float *out, size_t ldo)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t ps = (size_t) hd_v + 2;
    const float *p = part + ((size_t) t * gridDim.y + h) * n_split * ps;
    float mx = -INFINITY;
    for (int i = 0; i < n_split; i++)
        if (p[i * ps + hd_v + 1] > 0.f) mx = fmaxf (mx, p[i * ps + hd_v]);
    float lsum = 0.f;
    for (int i = 0; i < n_split; i++) {
        const float li = p[i * ps + hd_v + 1];
        if (li > 0.f) lsum += li * expf (p[i * ps + hd_v] - mx);
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    float *o = out + (size_t) t * ldo + (size_t) h * hd_v;
    for (int d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float a = 0.f;
        for (int i = 0; i < n_split; i++) {
            const float li = p[i * ps + hd_v + 1];
            if (li > 0.f) a += p[i * ps + d] * expf (p[i * ps + hd_v] - mx);
        }
        o[d] = a * inv;
    }
}

/* RX_CU_ATTN_KT rows of K or V into shared memory (dst, rows ld floats
 * apart): position j's hd values of the head at off in its slot's row of
 * row floats; positions past nt and slots outside the pool are zero.  The
 * block's threads walk the tile along the head dim (coalesced). */
static __device__ __forceinline__ void s_kv_tile (float *dst, int ld, const void *pool, int f16,
                                                  size_t row, size_t off, int hd, const int32_t *sl,
                                                  int nt, uint64_t n_slots)
{
    for (int i = threadIdx.x; i < RX_CU_ATTN_KT * hd; i += blockDim.x) {
        const int kk = i / hd, d = i % hd;
        float v = 0.f;
        if (kk < nt) {
            const int32_t s = sl[kk];
            if (s >= 0 && (uint64_t) s < n_slots) v = s_kv (pool, f16, (size_t) s * row + off + d);
        }
        dst[kk * ld + d] = v;
    }
}

/* The tiled kernel (plan.h rx_cuplan_attn_tiled): a block per
 * (RX_CU_ATTN_QT consecutive rows of the batch, head).  The rows of a tile
 * may belong to several sequences (the last rows of one, the first of the
 * next): the block makes one pass per sequence, over the union of its
 * rows' key positions, and a row only takes the keys of its own sequence
 * between its window start and its position.  Per pass, K and V come into
 * shared memory RX_CU_ATTN_KT positions at a time (coalesced along the
 * head dim); thread 4r + s owns row r's scores for keys s, s + 4, ... and
 * its output dims s, s + 4, ...; the row's running max and sum are kept
 * identical in its four threads by shuffles.  A slot outside the pool is a
 * zero key and value, as in k_attention.  Needs hd_k, hd_v <= 128. */
static __global__ void __launch_bounds__ (RX_CU_ATTN_THREADS)
k_attn_tiled (const float *q, size_t ldq, const void *kpool, const void *vpool, int f16,
              int n_kv_head, int hd_k, int hd_v, uint64_t n_slots, int n_seq, int n_tokens,
              const int32_t *q_start, const int32_t *kv_start, const int32_t *slots,
              const int32_t *q_pos, int n_head, float scale, float softcap, int window,
              float *out, size_t ldo)
{
    constexpr int QT = RX_CU_ATTN_QT, KT = RX_CU_ATTN_KT, NJ = KT / 4;
    constexpr int MAXV = RX_CU_ATTN_TILED_MAXD / 4;
    extern __shared__ float sm[];
    const int ldk = hd_k + 1, ldv = hd_v + 1;
    float *Qs = sm, *Ks = Qs + QT * ldk, *Vs = Ks + KT * ldk, *Ps = Vs + KT * ldv;
    __shared__ int jr[2];
    const int tid = threadIdx.x, r = tid >> 2, sub = tid & 3;
    const int t0 = blockIdx.x * QT, t1 = t0 + QT < n_tokens ? t0 + QT : n_tokens;
    const int h = blockIdx.y, kvh = h / (n_head / n_kv_head);
    const size_t krow = (size_t) n_kv_head * hd_k, vrow = (size_t) n_kv_head * hd_v;
    for (int i = tid; i < QT * hd_k; i += blockDim.x) {
        const int rr = i / hd_k, d = i % hd_k;
        Qs[rr * ldk + d] = t0 + rr < t1 ? q[(size_t) (t0 + rr) * ldq + (size_t) h * hd_k + d] : 0.f;
    }
    /* The sequence of batch row t: the last s with q_start[s] <= t. */
    auto seq_of = [&] (int t) {
        int lo = 0, hi = n_seq - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (q_start[mid] <= t) lo = mid; else hi = mid - 1;
        }
        return lo;
    };
    const int t = t0 + r, have = t < t1;
    const int my_seq = have ? seq_of (t) : -1;
    const int pos = have ? q_pos[t] : 0;
    const int first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    float acc[MAXV];
#pragma unroll
    for (int i = 0; i < MAXV; i++) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int s_lo = seq_of (t0), s_hi = seq_of (t1 - 1);
    for (int sq = s_lo; sq <= s_hi; sq++) {
        const int mine = my_seq == sq;
        __syncthreads ();   /* Q loaded; the last pass is done with jr */
        if (tid == 0) {
            jr[0] = INT_MAX;
            jr[1] = -1;
        }
        __syncthreads ();
        if (mine && sub == 0) {
            atomicMin (&jr[0], first);
            atomicMax (&jr[1], pos);
        }
        __syncthreads ();
        const int jlo = jr[0], jhi = jr[1];
        const int32_t *sl = slots + kv_start[sq];
        for (int j0 = jlo; j0 <= jhi; j0 += KT) {
            const int nt = jhi - j0 + 1 < KT ? jhi - j0 + 1 : KT;
            s_kv_tile (Ks, ldk, kpool, f16, krow, (size_t) kvh * hd_k, hd_k, sl + j0, nt, n_slots);
            s_kv_tile (Vs, ldv, vpool, f16, vrow, (size_t) kvh * hd_v, hd_v, sl + j0, nt, n_slots);
            __syncthreads ();
            float sc[NJ];
#pragma unroll
            for (int jj = 0; jj < NJ; jj++) sc[jj] = 0.f;
            if (mine) {
                const float *qr = Qs + r * ldk;
                for (int d = 0; d < hd_k; d++) {
                    const float qv = qr[d];
#pragma unroll
                    for (int jj = 0; jj < NJ; jj++) sc[jj] += qv * Ks[(sub + 4 * jj) * ldk + d];
                }
            }
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < NJ; jj++) {
                const int k = sub + 4 * jj, j = j0 + k;
                if (mine && k < nt && j >= first && j <= pos) {
                    float v = sc[jj] * scale;
                    if (softcap > 0.f) v = softcap * tanhf (v / softcap);
                    sc[jj] = v;
                    mx = fmaxf (mx, v);
                } else {
                    sc[jj] = -INFINITY;
                }
            }
            mx = fmaxf (mx, __shfl_xor_sync (0xffffffffu, mx, 1));
            mx = fmaxf (mx, __shfl_xor_sync (0xffffffffu, mx, 2));
            const float nm = fmaxf (m, mx);
            const float corr = m == -INFINITY ? 0.f : expf (m - nm);
            float ps = 0.f;
#pragma unroll
            for (int jj = 0; jj < NJ; jj++) {
                const float p = sc[jj] == -INFINITY ? 0.f : expf (sc[jj] - nm);
                Ps[r * (KT + 1) + sub + 4 * jj] = p;
                ps += p;
            }
            ps += __shfl_xor_sync (0xffffffffu, ps, 1);
            ps += __shfl_xor_sync (0xffffffffu, ps, 2);
            l = l * corr + ps;
#pragma unroll
            for (int i = 0; i < MAXV; i++) acc[i] *= corr;
            m = nm;
            __syncwarp ();   /* a row's four threads (one warp) wrote its P row */
            if (mine) {
                const float *pr = Ps + r * (KT + 1);
                for (int k = 0; k < nt; k++) {
                    const float p = pr[k];
                    const float *vr = Vs + k * ldv;
#pragma unroll
                    for (int i = 0; i < MAXV; i++) {
                        const int d = sub + 4 * i;
                        if (d < hd_v) acc[i] += p * vr[d];
                    }
                }
            }
            __syncthreads ();   /* K, V and P are overwritten next */
        }
    }
    if (have) {
        const float inv = l > 0.f ? 1.f / l : 0.f;
        float *o = out + (size_t) t * ldo + (size_t) h * hd_v;
#pragma unroll
        for (int i = 0; i < MAXV; i++) {
            const int d = sub + 4 * i;
            if (d < hd_v) o[d] = acc[i] * inv;
        }
    }
}

extern "C" int rx_cuk_attention (cudaStream_t st, const float *q, size_t ldq, const void *kpool,
                                 const void *vpool, int f16, int n_kv_head, int hd_k, int hd_v,
                                 uint64_t n_slots, int n_seq, int n_tokens, const int32_t *q_start,
                                 const int32_t *kv_start, const int32_t *slots,
                                 const int32_t *q_pos, int n_head, float scale, float softcap,
                                 int window, float *out, size_t ldo, int tiled, int splits,
                                 float *part)
{
    if (n_tokens == 0) return 0;
    if (n_head > 65535) return (int) cudaErrorInvalidValue;
    if (rx_cuplan_attn_tiled (tiled, hd_k, hd_v, n_tokens, n_seq)) {
        const size_t smem = rx_cuplan_attn_tiled_smem (hd_k, hd_v);
        if (smem > 48 * 1024) {
            cudaError_t ce = cudaFuncSetAttribute (k_attn_tiled,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int) smem);
            if (ce != cudaSuccess) return (int) ce;
        }
        dim3 grid ((unsigned) ((n_tokens + RX_CU_ATTN_QT - 1) / RX_CU_ATTN_QT), (unsigned) n_head);
        k_attn_tiled<<<grid, RX_CU_ATTN_THREADS, smem, st>>> (
            q, ldq, kpool, vpool, f16, n_kv_head, hd_k, hd_v, n_slots, n_seq, n_tokens, q_start,
            kv_start, slots, q_pos, n_head, scale, softcap, window, out, ldo);
        return s_status ();
    }
    if (hd_v > S_ATTN_MAXV * RX_CU_ATTN_THREADS) return (int) cudaErrorInvalidValue;
    const size_t smem = rx_cuplan_attn_smem (hd_k, hd_v);
    if (smem > 48 * 1024) {
        cudaError_t ce = cudaFuncSetAttribute (k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int) smem);
        if (ce != cudaSuccess) return (int) ce;
    }
    if (splits > 1) {
        if (!part || splits > 65535) return (int) cudaErrorInvalidValue;
        if (smem > 48 * 1024) {
            cudaError_t ce = cudaFuncSetAttribute (k_attn_split,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int) smem);
            if (ce != cudaSuccess) return (int) ce;
        }
        dim3 sgrid ((unsigned) n_tokens, (unsigned) n_head, (unsigned) splits);
        k_attn_split<<<sgrid, RX_CU_ATTN_THREADS, smem, st>>> (
            q, ldq, kpool, vpool, f16, n_kv_head, hd_k, hd_v, n_slots, n_seq, q_start, kv_start,
            slots, q_pos, n_head, scale, softcap, window, splits, part);
        int rc = s_status ();
        if (rc != 0) return rc;
        dim3 mgrid ((unsigned) n_tokens, (unsigned) n_head);
        k_attn_merge<<<mgrid, RX_CU_ATTN_THREADS, 0, st>>> (part, splits, hd_v, out, ldo);
        return s_status ();
    }
    dim3 grid ((unsigned) n_tokens, (unsigned) n_head);
    k_attention<<<grid, RX_CU_ATTN_THREADS, smem, st>>> (q, ldq, kpool, vpool, f16, n_kv_head, hd_k,
                                                         hd_v, n_slots, n_seq, q_start, kv_start,
                                                         slots, q_pos, n_head, scale, softcap,
                                                         window, out, ldo);
    return s_status ();
}

/* ------------------------------------------------------- MoE expert pass -- */

/* moe_route's block reduction: the lowest index fi and the best (bv, bi)
 * in s_better's order, over every thread.  rf/rv/ri: 32 entries each. */
static __device__ void s_route_reduce (int *fi, float *bv, int *bi, int *rf, float *rv, int *ri)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int pass = 0; pass < 2; pass++) {
        for (int o = 16; o > 0; o >>= 1) {
            const int of = __shfl_xor_sync (0xffffffffu, *fi, o);
            const float ov = __shfl_xor_sync (0xffffffffu, *bv, o);
            const int oi = __shfl_xor_sync (0xffffffffu, *bi, o);
            if (of < *fi) *fi = of;
            if (s_better (ov, oi, *bv, *bi)) { *bv = ov; *bi = oi; }
        }
        if (pass == 1) break;
        __syncthreads ();
        if (lane == 0) { rf[warp] = *fi; rv[warp] = *bv; ri[warp] = *bi; }
        __syncthreads ();
        *fi = lane < nw ? rf[lane] : INT_MAX;
        *bv = lane < nw ? rv[lane] : -INFINITY;
        *bi = lane < nw ? ri[lane] : -1;
    }
}

/* One block per row, core/moe_route.h's algorithm step for step.  The
 * group scores and the group choice are that code run by one thread (per
 * group, then thread 0: G is small).  Each of the k expert choices is a
 * block reduction that reproduces the serial loop "best = the first
 * eligible e, then any later e with sel[e] > sel[best]" exactly, NaN
 * included: when the first eligible sel is NaN nothing compares greater
 * and the serial loop keeps it; otherwise NaNs never win and the result
 * is the largest non-NaN sel, the lowest index on ties (s_better).  So
 * the reduction carries both the first eligible index and the best
 * non-NaN one.  Weights: thread 0, in double, as rx_moe_route_weights. */
static __global__ void k_moe_route (const float *probs, const float *sel, size_t ld, int nx, int G,
                                    int tg, int k, int norm, float scale, int32_t *ids, float *w)
{
    extern __shared__ float rsm[];
    __shared__ int rf[32], ri[32];
    __shared__ float rv[32];
    float *ssel = rsm, *gs = rsm + nx;
    int *sid = (int *) (gs + G);
    unsigned char *taken = (unsigned char *) (sid + k), *keep = taken + nx;
    const size_t r = blockIdx.x;
    const float *sr = sel + r * ld, *pr = probs + r * ld;
    const int per = nx / G;
    for (int e = threadIdx.x; e < nx; e += blockDim.x) {
        ssel[e] = sr[e];
        taken[e] = 0;
    }
    __syncthreads ();
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        keep[g] = G == 1;
        if (G == 1) break;
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            const float v = ssel[e];
            if (v > b1) { b2 = b1; b1 = v; }
            else if (v > b2) b2 = v;
        }
        gs[g] = per > 1 ? __fadd_rn (b1, b2) : b1;
    }
    __syncthreads ();
    if (G > 1 && threadIdx.x == 0)
        for (int j = 0; j < tg; j++) {
            int best = G;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best == G || gs[g] > gs[best])) best = g;
            keep[best] = 1;
        }
    __syncthreads ();
    for (int j = 0; j < k; j++) {
        int fi = INT_MAX, bi = -1;
        float bv = -INFINITY;
        for (int e = threadIdx.x; e < nx; e += blockDim.x) {
            if (!keep[e / per] || taken[e]) continue;
            if (e < fi) fi = e;
            const float v = ssel[e];
            if (!isnan (v) && s_better (v, e, bv, bi)) { bv = v; bi = e; }
        }
        s_route_reduce (&fi, &bv, &bi, rf, rv, ri);
        if (threadIdx.x == 0) {
            /* fi < nx: the host checked that the kept groups hold k experts. */
            const int c = bi < 0 || isnan (ssel[fi]) ? fi : bi;
            sid[j] = c;
            taken[c] = 1;
            ids[r * (size_t) k + j] = c;
        }
        __syncthreads ();
    }
    if (threadIdx.x == 0) {
        double sum = 0;
        for (int j = 0; j < k; j++) sum = __dadd_rn (sum, (double) pr[sid[j]]);
        for (int j = 0; j < k; j++) {
            float v = pr[sid[j]];
            if (norm) v = (float) __ddiv_rn ((double) v, sum);
            w[r * (size_t) k + j] = __fmul_rn (v, scale);
        }
    }
}

extern "C" int rx_cuk_moe_route (cudaStream_t st, const float *probs, const float *sel, size_t ld,
                                 size_t rows, int n_expert, int n_group, int topk_group, int k,
                                 int norm, float scale, int32_t *ids, float *w, size_t smem)
{
    const int G = n_group > 1 ? n_group : 1;
    for (size_t r0 = 0; r0 < rows; r0 += S_MAX_GRID) {
        const size_t nr = rows - r0 < S_MAX_GRID ? rows - r0 : S_MAX_GRID;
        k_moe_route<<<(unsigned) nr, rx_cuplan_row_threads ((size_t) n_expert), smem, st>>> (
            probs + r0 * ld, sel + r0 * ld, ld, n_expert, G, topk_group, k, norm, scale,
            ids + r0 * (size_t) k, w + r0 * (size_t) k);
        int rc = s_status ();
        if (rc) return rc;
    }
    return 0;
}

/* moe_sort in one block, as a stable counting sort.  Why this scheme: it
 * must be stable in (token, choice) and run without a host round trip
 * for a decode step (a few dozen choices) as for a prefill (tens of
 * thousands); one block of up to 32 warps is plenty for both and needs no
 * grid-wide synchronisation, no atomics and no global scratch.
 *
 * Warp w owns the contiguous segment [s0, s1) of the n choices and the
 * histogram h = hist[w][0 .. n_expert) in shared memory (only warp w
 * touches it until phase 2).
 *   1. Count: the warp walks its segment 32 choices at a time; lanes with
 *      the same valid id find each other with __match_any_sync and the
 *      lowest of them adds their number to h[id].
 *   2. Place: per expert e, hist[w][e] becomes the count of e in the
 *      segments before w and off[e] the count overall; warp 0 turns off
 *      into an exclusive prefix sum (lane l sums a contiguous run of
 *      experts, a shuffle scan adds the runs), off[n_expert] = the valid
 *      choices; then hist[w][e] += off[e]: the first sorted row of e's
 *      choices in segment w.
 *   3. Rank: each warp walks its segment again in the same order; a
 *      choice's row is h[id] plus the number of lower lanes with the same
 *      id, after which the group's lowest lane advances h[id].
 * So e's choices land in segment order, then step order, then lane order:
 * the choice order.  O(n / (32 W) + n_expert) steps per warp. */
static __global__ void k_moe_sort (const int32_t *ids, int n, int k, int n_expert, int32_t *offsets,
                                   int32_t *row, int32_t *src)
{
    extern __shared__ int32_t ssm[];
    const int W = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int32_t *hist = ssm, *off = ssm + W * n_expert;
    for (int i = threadIdx.x; i < W * n_expert; i += blockDim.x) hist[i] = 0;
    __syncthreads ();
    const int seg = (n + W - 1) / W;
    const int s0 = min (n, warp * seg), s1 = min (n, s0 + seg);
    int32_t *h = hist + warp * n_expert;
    const unsigned below = (1u << lane) - 1u;
    for (int b = s0; b < s1; b += 32) {       /* 1. count (warp-uniform bounds) */
        const int q = b + lane;
        const int id = q < s1 ? ids[q] : -1;
        const bool ok = id >= 0 && id < n_expert;
        const unsigned peers = __match_any_sync (0xffffffffu, ok ? id : -1);
        if (ok && (peers & below) == 0) h[id] += __popc (peers);
        __syncwarp ();
    }
    __syncthreads ();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {   /* 2. place */
        int run = 0;
        for (int v = 0; v < W; v++) {
            const int c = hist[v * n_expert + e];
            hist[v * n_expert + e] = run;
            run += c;
        }
        off[e] = run;
    }
    __syncthreads ();
    if (warp == 0) {
        const int per = (n_expert + 31) / 32;
        const int e0 = min (n_expert, lane * per), e1 = min (n_expert, e0 + per);
        int mine = 0;
        for (int e = e0; e < e1; e++) mine += off[e];
        int incl = mine;
        for (int d = 1; d < 32; d <<= 1) {
            const int t = __shfl_up_sync (0xffffffffu, incl, d);
            if (lane >= d) incl += t;
        }
        int run = incl - mine;
        for (int e = e0; e < e1; e++) {
            const int c = off[e];
            off[e] = run;
            run += c;
        }
        if (lane == 31) off[n_expert] = incl;
    }
    __syncthreads ();
    for (int i = threadIdx.x; i <= n_expert; i += blockDim.x) offsets[i] = off[i];
    for (int i = threadIdx.x; i < W * n_expert; i += blockDim.x) hist[i] += off[i % n_expert];
    __syncthreads ();
    for (int b = s0; b < s1; b += 32) {       /* 3. rank */
        const int q = b + lane;
        const int id = q < s1 ? ids[q] : -1;
        const bool ok = id >= 0 && id < n_expert;
        const unsigned peers = __match_any_sync (0xffffffffu, ok ? id : -1);
        if (ok) {
            const int r = h[id] + __popc (peers & below);
            row[q] = r;
            src[r] = q / k;
        } else if (q < s1) {
            row[q] = -1;
        }
        __syncwarp ();
        if (ok && (peers & below) == 0) h[id] += __popc (peers);
        __syncwarp ();
    }
    for (int r = off[n_expert] + threadIdx.x; r < n; r += blockDim.x) src[r] = -1;
}

extern "C" int rx_cuk_moe_sort (cudaStream_t st, const int32_t *ids, size_t n, int k, int n_expert,
                                int32_t *offsets, int32_t *row, int32_t *src, unsigned warps,
                                size_t smem)
{
    if (warps < 1 || warps > 32 || n > INT_MAX || k < 1) return (int) cudaErrorInvalidValue;
    k_moe_sort<<<1, 32 * warps, smem, st>>> (ids, (int) n, k, n_expert, offsets, row, src);
    return s_status ();
}

static __global__ void k_gather_rows (const float *x, size_t ldx, const int32_t *idx, size_t n,
                                      size_t dim, float *y, size_t ldy)
{
    const size_t total = n * dim;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t i = t / dim, c = t % dim;
        const int32_t id = idx[i];
        y[i * ldy + c] = id >= 0 ? x[(size_t) id * ldx + c] : 0.f;
    }
}

extern "C" int rx_cuk_gather_rows (cudaStream_t st, const float *x, size_t ldx, const int32_t *idx,
                                   size_t n, size_t dim, float *y, size_t ldy)
{
    if (n == 0 || dim == 0) return 0;
    k_gather_rows<<<rx_cuplan_blocks (n * dim, 256, S_MAX_GRID), 256, 0, st>>> (x, ldx, idx, n, dim,
                                                                               y, ldy);
    return s_status ();
}

/* The expert of sorted row r: the e with offsets[e] <= r < offsets[e+1]
 * (binary search, offsets nondecreasing), or -1 at or past
 * offsets[n_expert] (and before offsets[0], which is 0 from moe_sort). */
static __device__ __forceinline__ int s_expert_of (const int32_t *offsets, int n_expert, long long r)
{
    if (r >= (long long) offsets[n_expert] || r < (long long) offsets[0]) return -1;
    int lo = 0, hi = n_expert;   /* offsets[lo] <= r < offsets[hi] */
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if ((long long) offsets[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* matmul_grouped: blockIdx.y picks RX_CU_MV_MAX_ROWS rows, a warp one
 * output of them.  The rows are sorted by expert, so a group splits into
 * runs of one expert each: a run is one s_mv_warp over that expert's
 * weight row (all of the group's rows when they share the expert, as in
 * prefill; one row per run in decode).  Prefill-size groups would want a
 * grouped GEMM (tensor cores, the weight tile reused by many rows): not
 * done, this reads the expert's weight row once per 8 rows. */
template <int DT>
static __global__ void k_mv_grouped (const uint8_t *w, size_t row_bytes, size_t expert_bytes, int in, int out,
              const int32_t *offsets, int n_expert, long long row0, const float *x, size_t ldx,
              float *y, size_t ldy, int n, int acc)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o = blockIdx.x * RX_CU_MV_WARPS + warp;
    const int i0 = blockIdx.y * RX_CU_MV_MAX_ROWS;
    if (o >= out || i0 >= n) return;   /* whole warps leave */
    const int nr = n - i0 < RX_CU_MV_MAX_ROWS ? n - i0 : RX_CU_MV_MAX_ROWS;
    const int my_e = lane < nr ? s_expert_of (offsets, n_expert, row0 + i0 + lane) : -1;
    for (int a = 0; a < nr;) {        /* warp-uniform: a, b and e come from shuffles */
        const int e = __shfl_sync (0xffffffffu, my_e, a);
        int b = a + 1;
        while (b < nr && __shfl_sync (0xffffffffu, my_e, b) == e) b++;
        if (e >= 0)
            s_mv_warp<DT> (w + (size_t) e * expert_bytes + (size_t) o * row_bytes, in,
                           x + (size_t) (i0 + a) * ldx, ldx, y + (size_t) (i0 + a) * ldy, ldy,
                           b - a, o, lane, acc);
        a = b;
    }
}

extern "C" int rx_cuk_matvec_grouped (cudaStream_t st, int dtype, const void *w, size_t row_bytes,
                                      size_t expert_bytes, size_t in, size_t out,
                                      const int32_t *offsets, int n_expert, size_t row0,
                                      const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                                      int accumulate)
{
    const size_t pass = (size_t) S_MAX_GRID * RX_CU_MV_MAX_ROWS;
    for (size_t r0 = 0; r0 < n; r0 += pass) {
        const size_t nr = n - r0 < pass ? n - r0 : pass;
        const dim3 g (rx_cuplan_blocks (out, RX_CU_MV_WARPS, 0),
                      (unsigned) ((nr + RX_CU_MV_MAX_ROWS - 1) / RX_CU_MV_MAX_ROWS));
        S_DISPATCH (dtype, k_mv_grouped, g, 32 * RX_CU_MV_WARPS, (const uint8_t *) w, row_bytes,
                    expert_bytes, (int) in, (int) out, offsets, n_expert, (long long) (row0 + r0),
                    x + r0 * ldx, ldx, y + r0 * ldy, ldy, (int) nr, accumulate);
        int rc = s_status ();
        if (rc) return rc;
    }
    return 0;
}

/* moe_combine: one thread per (token, column); the choices in order, each
 * product and sum rounded on its own (__fmul_rn/__fadd_rn: nvcc would
 * otherwise contract w * y + acc into an FMA, which kernels-cpu never
 * does). */
static __global__ void k_moe_combine (const float *y, size_t ldy, const int32_t *row, const float *w,
                                      size_t n_tok, size_t k, size_t dim, float *out, size_t ldo,
                                      int accumulate)
{
    const size_t total = n_tok * dim;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const size_t tok = t / dim, c = t % dim;
        const int32_t *rr = row + tok * k;
        const float *wr = w + tok * k;
        float acc = 0.f;
        bool have = false;
        for (size_t j = 0; j < k; j++) {
            const int32_t r = rr[j];
            if (r < 0) continue;
            const float p = __fmul_rn (wr[j], y[(size_t) r * ldy + c]);
            acc = have ? __fadd_rn (acc, p) : p;
            have = true;
        }
        float *o = out + tok * ldo + c;
        if (accumulate) {
            if (have) *o = __fadd_rn (*o, acc);
        } else {
            *o = have ? acc : 0.f;
        }
    }
}

extern "C" int rx_cuk_moe_combine (cudaStream_t st, const float *y, size_t ldy, const int32_t *row,
                                   const float *w, size_t n_tok, size_t k, size_t dim, float *out,
                                   size_t ldo, int accumulate)
{
    if (n_tok == 0 || dim == 0) return 0;
    k_moe_combine<<<rx_cuplan_blocks (n_tok * dim, 256, S_MAX_GRID), 256, 0, st>>> (
        y, ldy, row, w, n_tok, k, dim, out, ldo, accumulate);
    return s_status ();
}

/* ---------------- the low-latency expert-parallel exchange (ABI 1.4) ---- */

/* Rank p's first expert, first(p) = p * n_expert / n_rank, and the owner
 * of expert e: first(p) <= e <=> p * n_expert < (e + 1) * n_rank, so the
 * largest such p is ceil((e + 1) * n_rank / n_expert) - 1 (kernels-cpu
 * ops.c rx_kcpu_moe_ll_owner). */
static __device__ __forceinline__ long long s_ll_first (long long p, int n_expert, int n_rank)
{
    return p * n_expert / n_rank;
}

static __device__ __forceinline__ int s_ll_owner (int e, int n_expert, int n_rank)
{
    return (int) (((long long) (e + 1) * n_rank - 1) / n_expert);
}

/* The header floats of every block: rank p's counts as int32 bit
 * patterns, zeros after them.  hw = hrows * dim, bf = a block's floats. */
static __global__ void k_ll_header (const int32_t *offsets, int n_expert, int n_rank, size_t hw,
                                    size_t bf, float *send)
{
    const size_t total = (size_t) n_rank * hw;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const int p = (int) (t / hw);
        const size_t h = t % hw;
        const long long f0 = s_ll_first (p, n_expert, n_rank), f1 = s_ll_first (p + 1, n_expert, n_rank);
        const int32_t c = (long long) h < f1 - f0 ? offsets[f0 + h + 1] - offsets[f0 + h] : 0;
        send[(size_t) p * bf + h] = __int_as_float (c);
    }
}

/* One thread per (sorted row, column): sorted row r of expert e goes to
 * rank p = owner(e), row r - offsets[first(p)] after the header.  Rows
 * past offsets[n_expert] (invalid choices) send nothing. */
static __global__ void k_ll_rows (const float *x, size_t ldx, const int32_t *offsets,
                                  const int32_t *src, int n, int n_expert, int n_rank, int hrows,
                                  int slots, size_t dim, float *send)
{
    const size_t total = (size_t) n * dim;
    for (size_t t = blockIdx.x * (size_t) blockDim.x + threadIdx.x; t < total;
         t += (size_t) gridDim.x * blockDim.x) {
        const int r = (int) (t / dim);
        const size_t c = t % dim;
        const int e = s_expert_of (offsets, n_expert, r);
        if (e < 0) continue;
        const int p = s_ll_owner (e, n_expert, n_rank);
        const long long i = r - (long long) offsets[s_ll_first (p, n_expert, n_rank)];
        const int32_t tok = src[r];
        if (i < 0 || i >= slots || tok < 0) continue;   /* only with offsets not moe_sort's */
        send[((size_t) p * (hrows + slots) + hrows + (size_t) i) * dim + c] = x[(size_t) tok * ldx + c];
    }
}

static __global__ void k_ll_slot (const int32_t *ids, const int32_t *row, const int32_t *offsets,
                                  int n, int n_expert, int n_rank, int hrows, int slots,
                                  int32_t *slot_of)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int32_t e = ids[i], r = row[i];
        if (r < 0 || e < 0 || e >= n_expert) {
            slot_of[i] = -1;
            continue;
        }
        const int p = s_ll_owner (e, n_expert, n_rank);
        slot_of[i] = (int32_t) ((long long) p * (hrows + slots) + hrows + r -
                                offsets[s_ll_first (p, n_expert, n_rank)]);
    }
}

extern "C" int rx_cuk_moe_ll_pack (cudaStream_t st, const float *x, size_t ldx, const int32_t *ids,
                                   const int32_t *offsets, const int32_t *row, const int32_t *src,
                                   size_t n, int n_expert, int n_rank, int slots, int hrows,
                                   size_t dim, float *send, int32_t *slot_of)
{
    if (n > INT_MAX || n_expert < 1 || n_rank < 1 || n_rank > n_expert || hrows < 1 || dim == 0)
        return (int) cudaErrorInvalidValue;
    const size_t hw = (size_t) hrows * dim, bf = ((size_t) hrows + slots) * dim;
    k_ll_header<<<rx_cuplan_blocks ((size_t) n_rank * hw, 256, S_MAX_GRID), 256, 0, st>>> (
        offsets, n_expert, n_rank, hw, bf, send);
    int rc = s_status ();
    if (rc || n == 0) return rc;
    k_ll_rows<<<rx_cuplan_blocks (n * dim, 256, S_MAX_GRID), 256, 0, st>>> (
        x, ldx, offsets, src, (int) n, n_expert, n_rank, hrows, slots, dim, send);
    rc = s_status ();
    if (rc) return rc;
    k_ll_slot<<<rx_cuplan_blocks (n, 256, S_MAX_GRID), 256, 0, st>>> (
        ids, row, offsets, (int) n, n_expert, n_rank, hrows, slots, slot_of);
    return s_status ();
}

/* The largest i in [0, n) with a[i] <= v, given a[0] <= v and a
 * nondecreasing. */
static __device__ __forceinline__ int s_last_le (const int32_t *a, int n, int v)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if (a[mid] <= v) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* moe_ll_unpack in one block (rx_cuplan_moe_ll_unpack sizes smem):
 *   1. a thread per block q reads its header, clamps each count (negative:
 *      0; cut where the block's sum passes slots) and keeps the in-block
 *      exclusive prefix pre[q][e] (pre[q][n_local] = the block's total);
 *      c(q, e) = pre[q][e + 1] - pre[q][e];
 *   2. a thread per expert sums its counts over the blocks (off[e + 1]),
 *      and thread 0 prefix-sums off;
 *   3. every thread fills order, back and offsets: e by binary search in
 *      off or pre[q], the rank q (order) and the routed row (back) by a
 *      walk over the ranks (rank-minor within e: (q, e)'s first routed
 *      row is off[e] + sum over q' < q of c(q', e)).  The counts are small
 *      (n_rank x n_local); O(log n_local + n_rank) per row. */
static __global__ void k_ll_unpack (const float *recv, int n_rank, int slots, int hrows, size_t dim,
                                    int n_local, int32_t *offsets, int32_t *order, int32_t *back)
{
    extern __shared__ int32_t ssm[];
    const int L = n_local, B = hrows + slots;
    int32_t *pre = ssm, *off = pre + n_rank * (L + 1);
    for (int q = threadIdx.x; q < n_rank; q += blockDim.x) {
        const float *hdr = recv + (size_t) q * B * dim;
        int32_t *pq = pre + q * (L + 1);
        int run = 0;
        for (int e = 0; e < L; e++) {
            int c = __float_as_int (hdr[e]);
            c = c < 0 ? 0 : min (c, slots - run);
            pq[e] = run;
            run += c;
        }
        pq[L] = run;
    }
    __syncthreads ();
    for (int e = threadIdx.x; e < L; e += blockDim.x) {
        int sum = 0;
        for (int q = 0; q < n_rank; q++) sum += pre[q * (L + 1) + e + 1] - pre[q * (L + 1) + e];
        off[e + 1] = sum;
    }
    __syncthreads ();
    if (threadIdx.x == 0) {
        off[0] = 0;
        for (int e = 0; e < L; e++) off[e + 1] += off[e];
    }
    __syncthreads ();
    for (int e = threadIdx.x; e <= L; e += blockDim.x) offsets[e] = off[e];
    const int total = off[L];
    for (int r = threadIdx.x; r < n_rank * slots; r += blockDim.x) {
        if (r >= total) {
            order[r] = -1;
            continue;
        }
        const int e = s_last_le (off, L, r);   /* off[e] <= r < off[e + 1] */
        int q = 0, start = off[e];
        for (;; q++) {                             /* ends: r < off[e + 1] */
            const int c = pre[q * (L + 1) + e + 1] - pre[q * (L + 1) + e];
            if (r < start + c) break;
            start += c;
        }
        order[r] = q * B + hrows + pre[q * (L + 1) + e] + (r - start);
    }
    for (int j = threadIdx.x; j < n_rank * B; j += blockDim.x) {
        const int q = j / B, i = j % B - hrows;
        const int32_t *pq = pre + q * (L + 1);
        if (i < 0 || i >= pq[L]) {
            back[j] = -1;
            continue;
        }
        const int e = s_last_le (pq, L, i);    /* pq[e] <= i < pq[e + 1] */
        int start = off[e];
        for (int v = 0; v < q; v++) start += pre[v * (L + 1) + e + 1] - pre[v * (L + 1) + e];
        back[j] = start + (i - pq[e]);
    }
}

extern "C" int rx_cuk_moe_ll_unpack (cudaStream_t st, const float *recv, int n_rank, int slots,
                                     int hrows, size_t dim, int n_local, int32_t *offsets,
                                     int32_t *order, int32_t *back, size_t smem)
{
    if (n_rank < 1 || n_local < 1 || slots < 0 || hrows < 1 || dim == 0)
        return (int) cudaErrorInvalidValue;
    if (smem > RX_CU_SMEM_DEFAULT) {
        cudaError_t ce = cudaFuncSetAttribute (k_ll_unpack, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int) smem);
        if (ce != cudaSuccess) return (int) ce;
    }
    k_ll_unpack<<<1, RX_CU_LL_THREADS, smem, st>>> (recv, n_rank, slots, hrows, dim, n_local,
                                                    offsets, order, back);
    return s_status ();
}
