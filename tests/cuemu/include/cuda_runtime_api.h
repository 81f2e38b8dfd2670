/* tests/cuemu/include/cuda_runtime_api.h -- cuemu's CUDA runtime API: the
 * subset kernels/cuda calls, implemented on the CPU by tests/cuemu/
 * runtime.cc (tests/cuemu/README.md says what is emulated and what not).
 *
 * Same names, signatures and error codes as CUDA 13, so kernels/cuda
 * compiles unchanged against it.  Device memory is host memory; every
 * stream runs its work when it is enqueued (in order), unless the stream
 * is capturing a graph; the capture rules of the real runtime are
 * enforced.  Every failing call also becomes the calling thread's last
 * error (cudaGetLastError), as in CUDA; cudaErrorLaunchFailure is sticky.
 *
 * uint3 and dim3 come with it (vector_types.h), and for C++ the overloads
 * cudaFuncSetAttribute (kernel, ...) and cudaMalloc (T **, ...).
 *
 * Thread-safety: every call may come from any thread (one internal lock);
 * the last error is per thread.  C and C++. */
#ifndef CUEMU_CUDA_RUNTIME_API_H
#define CUEMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#include "driver_types.h"
#include "library_types.h"
#include "vector_types.h"

#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#endif

const char *cudaGetErrorString (cudaError_t error);
const char *cudaGetErrorName (cudaError_t error);
cudaError_t cudaGetLastError (void);
cudaError_t cudaPeekAtLastError (void);

/* CUEMU_DEVICES (default 1) emulated devices, all H200-like, sharing one
 * memory capacity (CUEMU_MEM_GIB, default 16). */
cudaError_t cudaGetDeviceCount (int *count);
cudaError_t cudaSetDevice (int device);
cudaError_t cudaGetDevice (int *device);
cudaError_t cudaGetDeviceProperties (struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceSynchronize (void);

cudaError_t cudaMalloc (void **devPtr, size_t size);
cudaError_t cudaFree (void *devPtr);
cudaError_t cudaMemGetInfo (size_t *free, size_t *total);
cudaError_t cudaMemcpy (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                             cudaStream_t stream);
cudaError_t cudaMemset (void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync (void *devPtr, int value, size_t count, cudaStream_t stream);

cudaError_t cudaStreamCreate (cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags (cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy (cudaStream_t stream);
cudaError_t cudaStreamSynchronize (cudaStream_t stream);
cudaError_t cudaStreamQuery (cudaStream_t stream);
cudaError_t cudaStreamWaitEvent (cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaStreamIsCapturing (cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t cudaStreamBeginCapture (cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture (cudaStream_t stream, cudaGraph_t *pGraph);

cudaError_t cudaEventCreate (cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags (cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy (cudaEvent_t event);
cudaError_t cudaEventRecord (cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery (cudaEvent_t event);
cudaError_t cudaEventSynchronize (cudaEvent_t event);
cudaError_t cudaEventElapsedTime (float *ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaGraphInstantiate (cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                  unsigned long long flags);
cudaError_t cudaGraphLaunch (cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy (cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy (cudaGraph_t graph);

/* func: the kernel (its address, as the executor's launch sees it). */
cudaError_t cudaFuncSetAttribute (const void *func, enum cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}  /* extern "C" */

/* The C++ overloads of the real headers: a kernel, or a typed pointer. */
template <class T>
static inline cudaError_t cudaFuncSetAttribute (T *entry, enum cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute ((const void *) entry, attr, value);
}

template <class T>
static inline cudaError_t cudaMalloc (T **devPtr, size_t size)
{
    return ::cudaMalloc ((void **) (void *) devPtr, size);
}
#endif

#endif
