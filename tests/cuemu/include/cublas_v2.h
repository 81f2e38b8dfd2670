/* tests/cuemu/include/cublas_v2.h -- cuemu's cuBLAS: handles and
 * cublasGemmEx as kernels/cuda calls it, a plain reference loop on the CPU
 * (tests/cuemu/runtime.cc; CUDA 13 names and values).
 *
 * cublasGemmEx: column-major C (m x n) = alpha op(A) op(B) + beta C with
 * op = N or T, A and B both CUDA_R_32F, both CUDA_R_16F or both
 * CUDA_R_16BF, C CUDA_R_32F, CUBLAS_COMPUTE_32F (each product summed in
 * float, k in order), alpha/beta host floats read at the call; enqueued on
 * the handle's stream (so it is captured into a graph like a kernel).
 * beta == 0: C is not read (a NaN there does not propagate), as in BLAS.
 * Anything else: CUBLAS_STATUS_NOT_SUPPORTED or INVALID_VALUE.
 *
 * Thread-safety: one handle per thread, as with cuBLAS. */
#ifndef CUEMU_CUBLAS_V2_H
#define CUEMU_CUBLAS_V2_H

#include <stddef.h>

#include "cuda_runtime_api.h"
#include "library_types.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2
} cublasOperation_t;

typedef enum {
    CUBLAS_GEMM_DEFAULT = -1,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99
} cublasGemmAlgo_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

typedef struct cublasContext *cublasHandle_t;

#ifdef __cplusplus
extern "C" {
#endif

cublasStatus_t cublasCreate (cublasHandle_t *handle);
cublasStatus_t cublasDestroy (cublasHandle_t handle);
cublasStatus_t cublasSetStream (cublasHandle_t handle, cudaStream_t streamId);
cublasStatus_t cublasGetStream (cublasHandle_t handle, cudaStream_t *streamId);
cublasStatus_t cublasSetWorkspace (cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes);
cublasStatus_t cublasGemmEx (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                             int m, int n, int k, const void *alpha, const void *A,
                             cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype,
                             int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                             cublasComputeType_t computeType, cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif

#endif
