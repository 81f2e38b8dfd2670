/* tests/cuemu/cuemu_internal.h -- the seam between the two halves of the
 * CUDA emulator (tests/cuemu/README.md): the SIMT executor (simt.cc: runs
 * a kernel grid on the CPU, one fiber per GPU thread) and the runtime
 * (runtime.cc: memory, streams, events, graphs, cuBLAS).  C++17. */
#ifndef RX_CUEMU_INTERNAL_H
#define RX_CUEMU_INTERNAL_H

#include <cstddef>
#include <functional>

#include <cuda_runtime_api.h>

namespace cuemu {

/* Work on a stream: runs fn now (every stream is synchronous here), or,
 * while the stream is capturing a graph (cudaStreamBeginCapture), appends
 * fn to the graph, which cudaGraphLaunch runs in order.  Kernel launches
 * and cudaMemcpyAsync / cudaMemsetAsync go through it.  (runtime.cc) */
void enqueue (cudaStream_t st, std::function<void ()> fn);

/* A launch error (bad configuration, a deadlocked barrier, a mismatched
 * warp op), kept for cudaGetLastError / cudaPeekAtLastError; the message
 * goes to stderr once, prefixed "cuemu: ".  (runtime.cc) */
void set_error (cudaError_t e, const char *msg);

/* The largest dynamic shared memory a kernel may ask for: 48 KiB, or what
 * cudaFuncSetAttribute (fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
 * n) allowed (at most max_smem_optin).  (runtime.cc) */
size_t max_dyn_smem (const void *fn);

constexpr int max_threads_per_block = 1024;
constexpr size_t max_smem_optin = 227 * 1024;   /* H100/H200 */
constexpr int sm_count = 132;

}  // namespace cuemu

#endif
