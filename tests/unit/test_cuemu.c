/* tests/unit/test_cuemu.c -- cuemu's runtime (tests/cuemu/runtime.cc) on
 * its own: memory and its checks, the capture rules of the CUDA runtime,
 * graph replay order, events, error state, devices, and cublasGemmEx
 * against a naive loop for every type and transpose combination.  (The
 * SIMT executor has its own tests; kernels/cuda through the emulator is
 * tests/cuemu.sh.)  Each Criterion test runs in its own process, so the
 * CUEMU_* variables set in a test take effect there. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

static void *s_dev (size_t n)
{
    void *p = NULL;
    cr_assert_eq (cudaMalloc (&p, n), cudaSuccess);
    cr_assert_not_null (p);
    return p;
}

static cudaStream_t s_stream (unsigned flags)
{
    cudaStream_t s = NULL;
    cr_assert_eq (cudaStreamCreateWithFlags (&s, flags), cudaSuccess);
    return s;
}

/* ------------------------------------------------------------- memory -- */

Test (cuemu_mem, malloc_counts_against_capacity)
{
    setenv ("CUEMU_MEM_GIB", "2", 1);
    size_t fr0 = 0, tot = 0;
    cr_assert_eq (cudaMemGetInfo (&fr0, &tot), cudaSuccess);
    cr_assert_eq (tot, (size_t) 2 << 30);
    cr_assert_eq (fr0, tot);
    struct cudaDeviceProp p;
    cr_assert_eq (cudaGetDeviceProperties (&p, 0), cudaSuccess);
    cr_assert_eq (p.totalGlobalMem, (size_t) 2 << 30);

    void *a = s_dev (1000);
    cr_assert_eq ((uintptr_t) a % 256, 0, "256-byte aligned like cudaMalloc");
    size_t fr = 0;
    cr_assert_eq (cudaMemGetInfo (&fr, &tot), cudaSuccess);
    cr_assert_eq (fr, fr0 - 1000);
    /* Fresh memory is not zero: 0xff bytes (NaN as F32/F16/BF16). */
    const unsigned char *b = a;
    for (int i = 0; i < 1000; i++) cr_assert_eq (b[i], 0xff);

    void *big = NULL;
    cr_assert_eq (cudaMalloc (&big, (size_t) 2 << 30), cudaErrorMemoryAllocation);
    cr_assert_null (big);
    cr_assert_eq (cudaGetLastError (), cudaErrorMemoryAllocation, "the failure is the last error");
    cr_assert_eq (cudaGetLastError (), cudaSuccess, "and reading it clears it");

    cr_assert_eq (cudaFree (a), cudaSuccess);
    cr_assert_eq (cudaMemGetInfo (&fr, &tot), cudaSuccess);
    cr_assert_eq (fr, fr0);
    cr_assert_eq (cudaFree (NULL), cudaSuccess);
    void *z = (void *) 1;
    cr_assert_eq (cudaMalloc (&z, 0), cudaSuccess);
    cr_assert_null (z);
}

Test (cuemu_mem, fill_can_be_changed)
{
    setenv ("CUEMU_MALLOC_FILL", "0", 1);
    unsigned char *a = s_dev (64);
    for (int i = 0; i < 64; i++) cr_assert_eq (a[i], 0);
    cudaFree (a);
}

Test (cuemu_mem, bad_frees_and_copies_are_refused)
{
    char host[64] = { 0 };
    char *d = s_dev (64);
    cr_assert_eq (cudaFree (host), cudaErrorInvalidValue);
    cr_assert_eq (cudaFree (d + 8), cudaErrorInvalidValue, "inside, not the base");
    /* Each side must be what the kind says, and the range inside one
     * allocation. */
    cr_assert_eq (cudaMemcpy (host, host, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cr_assert_eq (cudaMemcpy (host, d, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cr_assert_eq (cudaMemcpy (d + 60, host, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cr_assert_eq (cudaMemcpy (d, host, 8, (enum cudaMemcpyKind) 9), cudaErrorInvalidMemcpyDirection);
    cr_assert_eq (cudaMemset (host, 0, 8), cudaErrorInvalidValue);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidValue);

    for (int i = 0; i < 64; i++) host[i] = (char) i;
    cr_assert_eq (cudaMemcpy (d, host, 64, cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq (cudaMemcpy (d + 32, d, 16, cudaMemcpyDeviceToDevice), cudaSuccess);
    cr_assert_eq (cudaMemset (d + 48, 7, 4), cudaSuccess);
    char back[64];
    cr_assert_eq (cudaMemcpy (back, d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++) {
        char want = i >= 48 && i < 52 ? 7 : i >= 32 && i < 48 ? (char) (i - 32) : (char) i;
        cr_assert_eq (back[i], want, "byte %d", i);
    }
    cudaFree (d);
}

/* ------------------------------------------------------------ capture -- */

/* Work captured on a stream runs only when the graph is launched, in the
 * order it was enqueued, as often as it is launched. */
Test (cuemu_graph, capture_defers_and_replays_in_order)
{
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    unsigned char *d = s_dev (16), h[16];
    cr_assert_eq (cudaMemset (d, 0, 16), cudaSuccess);
    unsigned char src[16];
    memset (src, 5, sizeof src);

    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cr_assert_eq (cudaStreamIsCapturing (s, &cs), cudaSuccess);
    cr_assert_eq (cs, cudaStreamCaptureStatusActive);
    cr_assert_eq (cudaMemsetAsync (d, 1, 16, s), cudaSuccess);
    cr_assert_eq (cudaMemcpyAsync (d + 4, src, 8, cudaMemcpyHostToDevice, s), cudaSuccess);
    cr_assert_eq (cudaMemsetAsync (d + 10, 9, 4, s), cudaSuccess);
    cr_assert_eq (cudaMemcpyAsync (d + 14, d + 10, 2, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    cr_assert_eq (d[0], 0, "captured work has not run");
    cudaGraph_t g = NULL;
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaSuccess);
    cr_assert_not_null (g);
    cr_assert_eq (cudaStreamIsCapturing (s, &cs), cudaSuccess);
    cr_assert_eq (cs, cudaStreamCaptureStatusNone);
    cudaGraphExec_t x = NULL;
    cr_assert_eq (cudaGraphInstantiate (&x, g, 0), cudaSuccess);
    cr_assert_eq (cudaGraphDestroy (g), cudaSuccess, "the executable graph keeps its own copy");
    cr_assert_eq (d[0], 0);

    const unsigned char want[16] = { 1, 1, 1, 1, 5, 5, 5, 5, 5, 5, 9, 9, 9, 9, 9, 9 };
    for (int rep = 0; rep < 2; rep++) {
        cr_assert_eq (cudaMemset (d, 0, 16), cudaSuccess);
        src[0] = (unsigned char) (20 + rep);   /* the host side is read at replay */
        cr_assert_eq (cudaGraphLaunch (x, s), cudaSuccess);
        cr_assert_eq (cudaStreamSynchronize (s), cudaSuccess);
        cr_assert_eq (cudaMemcpy (h, d, 16, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int i = 0; i < 16; i++)
            cr_assert_eq (h[i], i == 4 ? 20 + rep : want[i], "replay %d byte %d", rep, i);
    }
    cr_assert_eq (cudaGraphExecDestroy (x), cudaSuccess);
    cr_assert_eq (cudaGraphExecDestroy (x), cudaErrorInvalidResourceHandle);
    cr_assert_eq (cudaGraphLaunch (x, s), cudaErrorInvalidResourceHandle);
    cudaFree (d);
    cudaStreamDestroy (s);
}

/* A graph launched into a capturing stream becomes part of that capture. */
Test (cuemu_graph, graph_launch_inside_a_capture_nests)
{
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    unsigned char *d = s_dev (4);
    cudaMemset (d, 0, 4);
    cudaGraph_t g1, g2;
    cudaGraphExec_t x1, x2;
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cudaMemsetAsync (d, 3, 2, s);
    cr_assert_eq (cudaStreamEndCapture (s, &g1), cudaSuccess);
    cr_assert_eq (cudaGraphInstantiate (&x1, g1, 0), cudaSuccess);
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaGraphLaunch (x1, s), cudaSuccess);
    cudaMemsetAsync (d + 1, 4, 3, s);
    cr_assert_eq (cudaStreamEndCapture (s, &g2), cudaSuccess);
    cr_assert_eq (d[0], 0);
    cr_assert_eq (cudaGraphInstantiate (&x2, g2, 0), cudaSuccess);
    cr_assert_eq (cudaGraphLaunch (x2, s), cudaSuccess);
    cr_assert_eq (d[0], 3);
    cr_assert_eq (d[1], 4);
    cr_assert_eq (d[3], 4);
    cudaGraphExecDestroy (x1);
    cudaGraphExecDestroy (x2);
    cudaGraphDestroy (g1);
    cudaGraphDestroy (g2);
    cudaFree (d);
    cudaStreamDestroy (s);
}

/* Synchronizing a capturing stream: refused, and the capture is lost --
 * the bug a CPU run never sees and a GPU reports. */
Test (cuemu_graph, sync_inside_capture_invalidates_it)
{
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    unsigned char *d = s_dev (4);
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaMemsetAsync (d, 1, 4, s), cudaSuccess);
    cr_assert_eq (cudaStreamSynchronize (s), cudaErrorStreamCaptureUnsupported);
    cr_assert_eq (cudaGetLastError (), cudaErrorStreamCaptureUnsupported);
    enum cudaStreamCaptureStatus cs;
    cr_assert_eq (cudaStreamIsCapturing (s, &cs), cudaSuccess);
    cr_assert_eq (cs, cudaStreamCaptureStatusInvalidated);
    cr_assert_eq (cudaMemsetAsync (d, 2, 4, s), cudaErrorStreamCaptureInvalidated);
    cudaGraph_t g = (cudaGraph_t) 1;
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaErrorStreamCaptureInvalidated);
    cr_assert_null (g);
    /* The capture is over: the stream works again. */
    cr_assert_eq (cudaStreamIsCapturing (s, &cs), cudaSuccess);
    cr_assert_eq (cs, cudaStreamCaptureStatusNone);
    cr_assert_eq (cudaMemsetAsync (d, 6, 4, s), cudaSuccess);
    cr_assert_eq (cudaStreamSynchronize (s), cudaSuccess);
    cr_assert_eq (d[3], 6);

    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaStreamQuery (s), cudaErrorStreamCaptureUnsupported);
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaErrorStreamCaptureInvalidated);
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaDeviceSynchronize (), cudaErrorStreamCaptureUnsupported);
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaErrorStreamCaptureInvalidated);
    cudaFree (d);
    cudaStreamDestroy (s);
}

/* The legacy stream (synchronous cudaMemcpy) waits for blocking streams:
 * one that captures is invalidated; a non-blocking one in relaxed mode is
 * not concerned (kernels/cuda's streams, and its weight uploads). */
Test (cuemu_graph, legacy_stream_work_and_blocking_captures)
{
    cudaStream_t nb = s_stream (cudaStreamNonBlocking), bl = s_stream (cudaStreamDefault);
    unsigned char *d = s_dev (8), h[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    cudaGraph_t g = NULL;

    cr_assert_eq (cudaStreamBeginCapture (nb, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaMemcpy (d, h, 8, cudaMemcpyHostToDevice), cudaSuccess);
    void *m = NULL;
    cr_assert_eq (cudaMalloc (&m, 64), cudaSuccess, "relaxed mode permits unsafe calls");
    cr_assert_eq (cudaFree (m), cudaSuccess);
    cr_assert_eq (cudaStreamEndCapture (nb, &g), cudaSuccess);
    cr_assert_eq (cudaGraphDestroy (g), cudaSuccess);

    cr_assert_eq (cudaStreamBeginCapture (bl, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaMemcpy (d, h, 8, cudaMemcpyHostToDevice), cudaErrorStreamCaptureImplicit);
    cr_assert_eq (cudaMemsetAsync (d, 0, 8, NULL), cudaErrorStreamCaptureImplicit);
    cr_assert_eq (cudaStreamEndCapture (bl, &g), cudaErrorStreamCaptureInvalidated);
    cr_assert_null (g);
    cr_assert_eq (cudaStreamBeginCapture (NULL, cudaStreamCaptureModeRelaxed),
                  cudaErrorStreamCaptureUnsupported, "the legacy stream cannot capture");
    cudaFree (d);
    cudaStreamDestroy (nb);
    cudaStreamDestroy (bl);
}

/* Global (CUDA's default) and thread-local captures forbid "unsafe" calls
 * such as cudaMalloc and synchronous copies. */
Test (cuemu_graph, global_capture_forbids_unsafe_calls)
{
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    unsigned char *d = s_dev (8), h[8] = { 0 };
    cudaGraph_t g = NULL;
    const enum cudaStreamCaptureMode modes[] = { cudaStreamCaptureModeGlobal,
                                                 cudaStreamCaptureModeThreadLocal };
    for (int i = 0; i < 2; i++) {
        cr_assert_eq (cudaStreamBeginCapture (s, modes[i]), cudaSuccess);
        void *m = (void *) 1;
        cr_assert_eq (cudaMalloc (&m, 64), cudaErrorStreamCaptureUnsupported, "mode %d", i);
        cr_assert_null (m);
        cr_assert_eq (cudaStreamEndCapture (s, &g), cudaErrorStreamCaptureInvalidated);
        cr_assert_eq (cudaStreamBeginCapture (s, modes[i]), cudaSuccess);
        cr_assert_eq (cudaMemcpy (h, d, 8, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported);
        cr_assert_eq (cudaStreamEndCapture (s, &g), cudaErrorStreamCaptureInvalidated);
    }
    cudaFree (d);
    cudaStreamDestroy (s);
}

Test (cuemu_graph, capture_misuse)
{
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    cudaGraph_t g = NULL;
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaErrorIllegalState, "not capturing");
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaErrorIllegalState);
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaSuccess, "the first capture is intact");
    cr_assert_eq (cudaGraphInstantiate (NULL, g, 0), cudaErrorInvalidValue);
    cudaGraphExec_t x = NULL;
    cr_assert_eq (cudaGraphDestroy (g), cudaSuccess);
    cr_assert_eq (cudaGraphInstantiate (&x, g, 0), cudaErrorInvalidValue, "destroyed graph");
    cr_assert_eq (cudaGraphDestroy (g), cudaErrorInvalidValue);
    /* A destroyed stream is an invalid handle, not a crash. */
    cr_assert_eq (cudaStreamDestroy (s), cudaSuccess);
    cr_assert_eq (cudaStreamSynchronize (s), cudaErrorInvalidResourceHandle);
    unsigned char *d = s_dev (4);
    cr_assert_eq (cudaMemsetAsync (d, 0, 4, s), cudaErrorInvalidResourceHandle);
    cr_assert_eq (cudaStreamDestroy (s), cudaErrorInvalidResourceHandle);
    cr_assert_eq (cudaStreamCreateWithFlags (&s, 0x80), cudaErrorInvalidValue);
    cudaFree (d);
}

/* ------------------------------------------------------------- events -- */

Test (cuemu_event, timing_and_captured_events)
{
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    cudaEvent_t a, b, c;
    cr_assert_eq (cudaEventCreate (&a), cudaSuccess);
    cr_assert_eq (cudaEventCreate (&b), cudaSuccess);
    cr_assert_eq (cudaEventCreateWithFlags (&c, cudaEventDisableTiming), cudaSuccess);
    float ms = -1.f;
    cr_assert_eq (cudaEventElapsedTime (&ms, a, b), cudaErrorInvalidResourceHandle, "not recorded");
    cr_assert_eq (cudaEventRecord (a, s), cudaSuccess);
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    nanosleep (&ts, NULL);
    cr_assert_eq (cudaEventRecord (b, s), cudaSuccess);
    cr_assert_eq (cudaEventSynchronize (b), cudaSuccess);
    cr_assert_eq (cudaEventElapsedTime (&ms, a, b), cudaSuccess);
    cr_assert (ms >= 19.f && ms < 2000.f, "%f ms", ms);
    cr_assert_eq (cudaEventRecord (c, s), cudaSuccess);
    cr_assert_eq (cudaEventElapsedTime (&ms, a, c), cudaErrorInvalidResourceHandle, "no timing");

    cudaGraph_t g = NULL;
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cudaEventRecord (b, s), cudaSuccess);
    cr_assert_eq (cudaEventSynchronize (b), cudaErrorCapturedEvent);
    cr_assert_eq (cudaEventQuery (b), cudaErrorCapturedEvent);
    cr_assert_eq (cudaEventElapsedTime (&ms, a, b), cudaErrorCapturedEvent);
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaSuccess, "an event record is legal in a capture");
    cr_assert_eq (cudaEventRecord (b, s), cudaSuccess);
    cr_assert_eq (cudaEventSynchronize (b), cudaSuccess, "recorded outside again");
    cr_assert_eq (cudaEventDestroy (a), cudaSuccess);
    cr_assert_eq (cudaEventRecord (a, s), cudaErrorInvalidResourceHandle);
    cr_assert_eq (cudaEventDestroy (a), cudaErrorInvalidResourceHandle);
    cudaGraphDestroy (g);
    cudaEventDestroy (b);
    cudaEventDestroy (c);
    cudaStreamDestroy (s);
}

/* --------------------------------------------------- errors, devices -- */

Test (cuemu_err, last_error_and_strings)
{
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    cr_assert_eq (cudaSetDevice (5), cudaErrorInvalidDevice);
    cr_assert_eq (cudaPeekAtLastError (), cudaErrorInvalidDevice);
    cr_assert_eq (cudaPeekAtLastError (), cudaErrorInvalidDevice, "peek does not clear");
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidDevice);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    cr_assert_str_eq (cudaGetErrorString (cudaErrorMemoryAllocation), "out of memory");
    cr_assert_str_eq (cudaGetErrorString (cudaErrorInvalidValue), "invalid argument");
    cr_assert_str_eq (cudaGetErrorName (cudaErrorStreamCaptureInvalidated),
                      "cudaErrorStreamCaptureInvalidated");
    cr_assert_str_eq (cudaGetErrorString ((cudaError_t) 12345), "unrecognized error code");
    /* The values are CUDA's: codes printed by the emulator mean the same
     * on a GPU. */
    cr_assert_eq ((int) cudaErrorLaunchFailure, 719);
    cr_assert_eq ((int) cudaErrorStreamCaptureUnsupported, 900);
    cr_assert_eq ((int) cudaErrorStreamCaptureInvalidated, 901);
}

Test (cuemu_err, device_properties)
{
    int n = 0;
    cr_assert_eq (cudaGetDeviceCount (&n), cudaSuccess);
    cr_assert_eq (n, 1);
    struct cudaDeviceProp p;
    cr_assert_eq (cudaGetDeviceProperties (&p, 0), cudaSuccess);
    cr_assert_str_eq (p.name, "cuemu (emulated H200)");
    cr_assert_eq (p.major, 9);
    cr_assert_eq (p.minor, 0);
    cr_assert_eq (p.multiProcessorCount, 132);
    cr_assert_eq (p.warpSize, 32);
    cr_assert_eq (p.sharedMemPerBlockOptin, 227 * 1024);
    cr_assert_eq (cudaGetDeviceProperties (&p, 1), cudaErrorInvalidDevice);
    cr_assert_eq (cudaGetDeviceProperties (NULL, 0), cudaErrorInvalidValue);
    int dev = -1;
    cr_assert_eq (cudaGetDevice (&dev), cudaSuccess);
    cr_assert_eq (dev, 0);
}

Test (cuemu_err, device_count_from_env)
{
    setenv ("CUEMU_DEVICES", "3", 1);
    int n = 0;
    cr_assert_eq (cudaGetDeviceCount (&n), cudaSuccess);
    cr_assert_eq (n, 3);
    cr_assert_eq (cudaSetDevice (2), cudaSuccess);
    int dev = -1;
    cudaGetDevice (&dev);
    cr_assert_eq (dev, 2);
    cr_assert_eq (cudaSetDevice (3), cudaErrorInvalidDevice);
}

Test (cuemu_err, no_device)
{
    setenv ("CUEMU_DEVICES", "0", 1);
    int n = 7;
    cr_assert_eq (cudaGetDeviceCount (&n), cudaErrorNoDevice);
    cr_assert_eq (n, 0);
    cr_assert_eq (cudaSetDevice (0), cudaErrorNoDevice);
    cublasHandle_t h = NULL;
    cr_assert_eq (cublasCreate (&h), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_null (h);
}

Test (cuemu_err, func_attribute)
{
    static int k;   /* any address stands for a kernel here */
    cr_assert_eq (cudaFuncSetAttribute (&k, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024),
                  cudaSuccess);
    cr_assert_eq (cudaFuncSetAttribute (&k, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024),
                  cudaSuccess);
    cr_assert_eq (cudaFuncSetAttribute (&k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        227 * 1024 + 1), cudaErrorInvalidValue);
    cr_assert_eq (cudaFuncSetAttribute (&k, cudaFuncAttributeMaxDynamicSharedMemorySize, -1),
                  cudaErrorInvalidValue);
    cr_assert_eq (cudaFuncSetAttribute (NULL, cudaFuncAttributeMaxDynamicSharedMemorySize, 0),
                  cudaErrorInvalidDeviceFunction);
}

/* ------------------------------------------------------------- cuBLAS -- */

/* Random halves with a decoder independent of the runtime's: value =
 * sign * 2^(e - bias) * (1 + m / 2^mbits), normal numbers only. */
static uint64_t s_rng = 0x243F6A8885A308D3ull;

static uint32_t s_rand (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t) (s_rng >> 32);
}

static float s_fill (void *p, cudaDataType_t t, size_t i)
{
    const uint32_t r = s_rand ();
    const int sign = r & 1;
    if (t == CUDA_R_32F) {
        float v = (float) ((r >> 8) % 2001) / 1000.f - 1.f;
        ((float *) p)[i] = v;
        return v;
    }
    if (t == CUDA_R_16F) {
        const unsigned e = 12 + (r >> 1) % 6, m = (r >> 8) & 1023;   /* 2^-3 .. 2^2 */
        ((uint16_t *) p)[i] = (uint16_t) (sign << 15 | e << 10 | m);
        return (sign ? -1.f : 1.f) * ldexpf (1.f + (float) m / 1024.f, (int) e - 15);
    }
    const unsigned e = 124 + (r >> 1) % 6, m = (r >> 8) & 127;
    ((uint16_t *) p)[i] = (uint16_t) (sign << 15 | e << 7 | m);
    return (sign ? -1.f : 1.f) * ldexpf (1.f + (float) m / 128.f, (int) e - 127);
}

static void s_gemm_case (cudaDataType_t t, cublasOperation_t ta, cublasOperation_t tb)
{
    const int m = 7, n = 5, k = 19;
    const int lda = (ta == CUBLAS_OP_N ? m : k) + 3, ldb = (tb == CUBLAS_OP_N ? k : n) + 2, ldc = m + 1;
    const size_t es = t == CUDA_R_32F ? 4 : 2;
    const int acols = ta == CUBLAS_OP_N ? k : m, bcols = tb == CUBLAS_OP_N ? n : k;
    void *A = s_dev ((size_t) lda * acols * es), *B = s_dev ((size_t) ldb * bcols * es);
    float *C = s_dev ((size_t) ldc * n * 4);
    float av[32][32], bv[32][32];   /* op(A)[i][p], op(B)[p][j] */
    memset (av, 0, sizeof av);
    memset (bv, 0, sizeof bv);
    for (int c = 0; c < acols; c++)
        for (int r = 0; r < lda; r++) {
            float v = s_fill (A, t, (size_t) c * lda + r);
            const int rows = ta == CUBLAS_OP_N ? m : k;
            if (r < rows) {
                if (ta == CUBLAS_OP_N) av[r][c] = v;
                else av[c][r] = v;
            }
        }
    for (int c = 0; c < bcols; c++)
        for (int r = 0; r < ldb; r++) {
            float v = s_fill (B, t, (size_t) c * ldb + r);
            const int rows = tb == CUBLAS_OP_N ? k : n;
            if (r < rows) {
                if (tb == CUBLAS_OP_N) bv[r][c] = v;
                else bv[c][r] = v;
            }
        }
    float c0[64];
    for (int i = 0; i < ldc * n; i++) c0[i] = C[i] = (float) (i % 11) - 5.f;

    cublasHandle_t h;
    cr_assert_eq (cublasCreate (&h), CUBLAS_STATUS_SUCCESS);
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    cr_assert_eq (cublasSetStream (h, s), CUBLAS_STATUS_SUCCESS);
    const float alpha = 0.75f, beta = -1.5f;
    cr_assert_eq (cublasGemmEx (h, ta, tb, m, n, k, &alpha, A, t, lda, B, t, ldb, &beta, C,
                                CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < ldc; i++) {
            const float got = C[(size_t) j * ldc + i];
            if (i >= m) {
                cr_assert_eq (got, c0[j * ldc + i], "padding row %d col %d written", i, j);
                continue;
            }
            double ref = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                ref += (double) av[i][p] * bv[p][j];
                mag += fabs ((double) av[i][p] * bv[p][j]);
            }
            ref = alpha * ref + beta * c0[j * ldc + i];
            mag = fabs (alpha) * mag + fabs (beta * c0[j * ldc + i]);
            cr_assert (fabs (got - ref) <= 1e-5 * mag + 1e-30, "type %d op %d%d C[%d][%d] = %.9g, want %.9g",
                       (int) t, (int) ta, (int) tb, i, j, got, ref);
        }
    /* beta = 0: C is not read (NaN there does not propagate). */
    for (int i = 0; i < ldc * n; i++) C[i] = NAN;
    const float zero = 0.f;
    cr_assert_eq (cublasGemmEx (h, ta, tb, m, n, k, &alpha, A, t, lda, B, t, ldb, &zero, C,
                                CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) cr_assert (!isnan (C[(size_t) j * ldc + i]), "C[%d][%d]", i, j);
    cublasDestroy (h);
    cudaStreamDestroy (s);
    cudaFree (A);
    cudaFree (B);
    cudaFree (C);
}

Test (cuemu_blas, gemm_ex_every_type_and_op)
{
    const cudaDataType_t ts[] = { CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF };
    for (int t = 0; t < 3; t++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                s_gemm_case (ts[t], a ? CUBLAS_OP_T : CUBLAS_OP_N, b ? CUBLAS_OP_T : CUBLAS_OP_N);
}

/* As kernels/cuda uses it inside a graph: captured with its pointers and
 * the alpha/beta of the call, replayed on the data of the replay. */
Test (cuemu_blas, gemm_in_a_graph)
{
    cublasHandle_t h;
    cr_assert_eq (cublasCreate (&h), CUBLAS_STATUS_SUCCESS);
    cudaStream_t s = s_stream (cudaStreamNonBlocking);
    void *ws = s_dev (1 << 20);
    cr_assert_eq (cublasSetWorkspace (h, ws, 1 << 20), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq (cublasSetStream (h, s), CUBLAS_STATUS_SUCCESS);
    float *A = s_dev (4 * 4), *B = s_dev (4 * 4), *C = s_dev (4 * 4);
    A[0] = 2.f;   /* 1 x 1 x 1 */
    B[0] = 3.f;
    C[0] = 0.f;
    float alpha = 1.f, beta = 0.f;
    cr_assert_eq (cudaStreamBeginCapture (s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq (cublasGemmEx (h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 1, &alpha, A, CUDA_R_32F, 1, B,
                                CUDA_R_32F, 1, &beta, C, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_SUCCESS);
    cudaGraph_t g;
    cr_assert_eq (cudaStreamEndCapture (s, &g), cudaSuccess);
    cr_assert_eq (C[0], 0.f, "captured, not run");
    alpha = 100.f;   /* read at the call: no effect on the graph */
    cudaGraphExec_t x;
    cr_assert_eq (cudaGraphInstantiate (&x, g, 0), cudaSuccess);
    A[0] = 5.f;
    cr_assert_eq (cudaGraphLaunch (x, s), cudaSuccess);
    cr_assert_eq (C[0], 15.f);
    cudaGraphExecDestroy (x);
    cudaGraphDestroy (g);
    cublasDestroy (h);
    cudaStreamDestroy (s);
    cudaFree (ws);
    cudaFree (A);
    cudaFree (B);
    cudaFree (C);
}

Test (cuemu_blas, gemm_bad_arguments)
{
    cublasHandle_t h;
    cr_assert_eq (cublasCreate (&h), CUBLAS_STATUS_SUCCESS);
    float *A = s_dev (64 * 4), *C = s_dev (64 * 4);
    const float one = 1.f;
#define G(ta, m, n, k, at, lda, bt, ldb, ct, ldc, comp)                                     \
    cublasGemmEx (h, ta, CUBLAS_OP_N, m, n, k, &one, A, at, lda, A, bt, ldb, &one, C, ct, ldc, \
                  comp, CUBLAS_GEMM_DEFAULT)
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_SUCCESS);
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_16F, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_NOT_SUPPORTED, "A and B types differ");
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_16F, 4, CUDA_R_16F, 4, CUDA_R_16F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_NOT_SUPPORTED, "C not F32");
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUBLAS_COMPUTE_16F),
                  CUBLAS_STATUS_NOT_SUPPORTED);
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_32F, 3, CUDA_R_32F, 4, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_INVALID_VALUE, "lda < k for op T");
    cr_assert_eq (G (CUBLAS_OP_N, 4, 4, 2, CUDA_R_32F, 3, CUDA_R_32F, 4, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_INVALID_VALUE, "lda < m for op N");
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_32F, 4, CUDA_R_32F, 3, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_INVALID_VALUE, "ldb < k");
    cr_assert_eq (G (CUBLAS_OP_T, 4, 4, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUDA_R_32F, 3, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_INVALID_VALUE, "ldc < m");
    cr_assert_eq (G (CUBLAS_OP_T, -1, 4, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq (G (CUBLAS_OP_T, 8, 8, 8, CUDA_R_32F, 8, CUDA_R_32F, 8, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F),
                  CUBLAS_STATUS_SUCCESS, "8x8 fits the 64 floats");
#undef G
    cr_assert_eq (cublasGemmEx (NULL, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, A, CUDA_R_32F, 1, A,
                                CUDA_R_32F, 1, &one, C, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq (cublasSetStream (NULL, NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    char host[16];
    cr_assert_eq (cublasSetWorkspace (h, host, sizeof host), CUBLAS_STATUS_INVALID_VALUE,
                  "the workspace must be device memory");
    cr_assert_eq (cublasDestroy (h), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq (cublasDestroy (h), CUBLAS_STATUS_NOT_INITIALIZED);
    cudaFree (A);
    cudaFree (C);
}

/* Operands outside device memory: the GPU faults (an illegal address,
 * sticky: the context is lost), and so does the emulator. */
Test (cuemu_blas, gemm_on_host_memory_faults_for_good)
{
    cublasHandle_t h;
    cr_assert_eq (cublasCreate (&h), CUBLAS_STATUS_SUCCESS);
    float *A = s_dev (64 * 4), host[64];
    const float one = 1.f;
    cr_assert_eq (cublasGemmEx (h, CUBLAS_OP_T, CUBLAS_OP_N, 8, 8, 8, &one, A, CUDA_R_32F, 8, A,
                                CUDA_R_32F, 8, &one, host, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert_eq (cudaGetLastError (), cudaErrorIllegalAddress);
    cr_assert_eq (cudaGetLastError (), cudaErrorIllegalAddress, "sticky");
    void *p = NULL;
    cr_assert_eq (cudaMalloc (&p, 16), cudaErrorIllegalAddress);
    cr_assert_eq (cudaStreamSynchronize (NULL), cudaErrorIllegalAddress);
    /* Releasing still works (and still reports the fault). */
    cr_assert_eq (cudaFree (A), cudaErrorIllegalAddress);
    cr_assert_eq (cudaFree (A), cudaErrorInvalidValue, "A was released");
    cr_assert_eq (cublasDestroy (h), CUBLAS_STATUS_SUCCESS);
}
