/* tests/gpu/gpu_peak.cu -- the GPU's measured ceilings for the benchmark
 * table of tests/gpu/check.sh:
 *   d2d_GBps          device-to-device cudaMemcpy of 1 GiB, counted as
 *                     read + write bytes (the bandwidth a memory-bound
 *                     decode can reach), best of 10;
 *   gemm_bf16_TFLOPS  cuBLAS BF16 GEMM, F32 accumulate, 8192^3, best of 5;
 *   gemm_bf16_512_TFLOPS  the same at a 512-token prefill shape
 *                     (m 8192, n 512, k 2048: a 1B model's FFN up).
 * Prints "key value" lines.  Build: nvcc -O2 gpu_peak.cu -lcublas.
 * Exit 1 with one line on any CUDA/cuBLAS error. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                     \
    do {                                                                          \
        cudaError_t e_ = (x);                                                     \
        if (e_ != cudaSuccess) {                                                  \
            fprintf (stderr, "gpu_peak: %s: %s\n", #x, cudaGetErrorString (e_));  \
            exit (1);                                                             \
        }                                                                         \
    } while (0)
#define CB(x)                                                                     \
    do {                                                                          \
        cublasStatus_t s_ = (x);                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
            fprintf (stderr, "gpu_peak: %s: cuBLAS status %d\n", #x, (int) s_);   \
            exit (1);                                                             \
        }                                                                         \
    } while (0)

static double gemm_tflops (cublasHandle_t h, int m, int n, int k, int reps)
{
    __nv_bfloat16 *a, *b;
    float *c;
    CK (cudaMalloc (&a, (size_t) m * k * 2));
    CK (cudaMalloc (&b, (size_t) k * n * 2));
    CK (cudaMalloc (&c, (size_t) m * n * 4));
    CK (cudaMemset (a, 0, (size_t) m * k * 2));
    CK (cudaMemset (b, 0, (size_t) k * n * 2));
    const float one = 1.f, zero = 0.f;
    cudaEvent_t e0, e1;
    CK (cudaEventCreate (&e0));
    CK (cudaEventCreate (&e1));
    double best = 0;
    for (int r = 0; r < reps + 1; r++) {
        CK (cudaEventRecord (e0));
        CB (cublasGemmEx (h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, k, b,
                          CUDA_R_16BF, k, &zero, c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
        CK (cudaEventRecord (e1));
        CK (cudaEventSynchronize (e1));
        float ms;
        CK (cudaEventElapsedTime (&ms, e0, e1));
        double tf = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
        if (r > 0 && tf > best) best = tf;
    }
    cudaFree (a); cudaFree (b); cudaFree (c);
    return best;
}

int main (void)
{
    const size_t bytes = (size_t) 1 << 30;
    void *src, *dst;
    CK (cudaMalloc (&src, bytes));
    CK (cudaMalloc (&dst, bytes));
    CK (cudaMemset (src, 1, bytes));
    cudaEvent_t e0, e1;
    CK (cudaEventCreate (&e0));
    CK (cudaEventCreate (&e1));
    double best = 0;
    for (int r = 0; r < 11; r++) {
        CK (cudaEventRecord (e0));
        CK (cudaMemcpy (dst, src, bytes, cudaMemcpyDeviceToDevice));
        CK (cudaEventRecord (e1));
        CK (cudaEventSynchronize (e1));
        float ms;
        CK (cudaEventElapsedTime (&ms, e0, e1));
        double gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
        if (r > 0 && gbps > best) best = gbps;
    }
    cudaFree (src);
    cudaFree (dst);
    printf ("d2d_GBps %.1f\n", best);
    cublasHandle_t h;
    CB (cublasCreate (&h));
    printf ("gemm_bf16_TFLOPS %.1f\n", gemm_tflops (h, 8192, 8192, 8192, 5));
    printf ("gemm_bf16_512_TFLOPS %.1f\n", gemm_tflops (h, 8192, 512, 2048, 10));
    cublasDestroy (h);
    return 0;
}
