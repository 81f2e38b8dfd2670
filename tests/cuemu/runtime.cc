/* tests/cuemu/runtime.cc -- the host half of cuemu (tests/cuemu/README.md):
 * the CUDA runtime calls and the cuBLAS calls kernels/cuda makes, on the
 * CPU.  The SIMT executor (simt.cc) runs kernel grids; it hands each launch
 * to cuemu::enqueue and reports launch errors with cuemu::set_error.
 *
 * - Device memory is host memory (256-byte aligned), counted against an
 *   emulated capacity (CUEMU_MEM_GIB, default 16).  Fresh allocations are
 *   filled with 0xff bytes (a NaN in F32, F16 and BF16), so a kernel that
 *   reads memory nobody wrote shows it (CUEMU_MALLOC_FILL=none|BYTE).
 * - A stream runs each piece of work when it is enqueued, in order, on the
 *   calling thread; while it is capturing, the work is appended to a graph
 *   instead and cudaGraphLaunch runs it later, in order.
 * - The capture rules of the CUDA runtime are enforced (the bugs a GPU
 *   reports and a CPU run never would): synchronizing or querying a
 *   capturing stream, legacy-stream work while a blocking stream captures,
 *   "unsafe" calls (cudaMalloc, cudaFree, synchronous cudaMemcpy/cudaMemset)
 *   during a global or thread-local capture, an event last recorded in a
 *   capture, ending a capture from the wrong thread.  The offending call
 *   fails and the capture is invalidated: cudaStreamEndCapture then
 *   returns cudaErrorStreamCaptureInvalidated and no graph.
 * - Handles are checked: a destroyed or made-up stream, event, graph or
 *   pointer is an error (the GPU would crash or corrupt), with a "cuemu: "
 *   line on stderr naming the call.
 * - Every failing call becomes the thread's last error; a launch failure
 *   (cudaErrorLaunchFailure, cudaErrorIllegalAddress) is sticky: every
 *   later call returns it, as after a GPU fault.
 *
 * Thread-safety: one mutex guards the runtime's tables; it is never held
 * while work runs (the executor takes its own lock around a grid). */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuemu_internal.h"

#define S_EXPORT extern "C"

typedef std::vector<std::function<void ()>> s_nodes;

struct CUgraph_st {
    std::shared_ptr<s_nodes> nodes;
};

struct CUgraphExec_st {
    std::shared_ptr<const s_nodes> nodes;
};

struct CUstream_st {
    unsigned flags;
    enum cudaStreamCaptureStatus cap;
    enum cudaStreamCaptureMode mode;
    std::thread::id cap_thread;
    std::shared_ptr<s_nodes> graph;   /* while cap != None */
};

struct CUevent_st {
    unsigned flags;
    bool recorded;     /* by a stream outside a capture */
    bool captured;     /* last recorded in a capturing stream */
    double ms;
};

struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
};

namespace {

/* Static tables: destroyed at exit or when the plugin is unloaded (not
 * kept on the heap: a dlclose'd plugin would leak them). */
std::mutex g_mu;
std::map<uintptr_t, size_t> g_mem;           /* live allocations: base -> bytes */
size_t g_mem_used;
std::set<CUstream_st *> g_streams;
std::set<CUevent_st *> g_events;
std::set<CUgraph_st *> g_graphs;
std::set<CUgraphExec_st *> g_execs;
std::set<cublasContext *> g_blas;
std::map<const void *, size_t> g_smem;       /* cudaFuncSetAttribute */
std::atomic<int> g_sticky (cudaSuccess);

/* CUEMU_STATS=1: counts printed at exit, so a test can tell what it
 * exercised (were graphs captured and replayed at all?). */
std::atomic<unsigned long> g_n_work, g_n_captures, g_n_invalidated, g_n_replays;
size_t g_mem_peak;   /* g_mu */

void s_stats (void)
{
    fprintf (stderr, "cuemu: stats: %lu work items run or captured, %lu captures ended (%lu "
             "invalidated), %lu graph launches, %.1f MiB device memory at peak\n",
             g_n_work.load (), g_n_captures.load (), g_n_invalidated.load (), g_n_replays.load (),
             (double) g_mem_peak / (1 << 20));
}

struct s_stats_at_exit {
    s_stats_at_exit ()
    {
        const char *v = getenv ("CUEMU_STATS");
        if (v && *v && strcmp (v, "0")) atexit (s_stats);
    }
} s_stats_init;

thread_local cudaError_t t_last = cudaSuccess;
thread_local int t_dev = 0;
thread_local int t_replay = 0;               /* inside cudaGraphLaunch's work */

const size_t s_dflt_smem = 48 * 1024;

/* ------------------------------------------------------------ settings -- */

long s_env_long (const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv (name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    long x = strtol (v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf (stderr, "cuemu: %s=%s is not an integer in %ld..%ld; using %ld\n", name, v, lo,
                 hi, dflt);
        return dflt;
    }
    return x;
}

size_t s_capacity (void)
{
    static size_t cap = (size_t) s_env_long ("CUEMU_MEM_GIB", 16, 1, 1 << 20) << 30;
    return cap;
}

int s_ndev (void)
{
    static int n = (int) s_env_long ("CUEMU_DEVICES", 1, 0, 64);
    return n;
}

/* -1: no fill. */
int s_fill_byte (void)
{
    static int b = [] {
        const char *v = getenv ("CUEMU_MALLOC_FILL");
        if (!v || !*v) return 0xff;
        if (!strcmp (v, "none")) return -1;
        return (int) s_env_long ("CUEMU_MALLOC_FILL", 0xff, 0, 255);
    }();
    return b;
}

/* -------------------------------------------------------------- errors -- */

void s_say (const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));
void s_say (const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (buf, sizeof buf, fmt, ap);
    va_end (ap);
    fprintf (stderr, "cuemu: %s\n", buf);
}

/* A failing call: its error becomes the thread's last error. */
cudaError_t s_fail (cudaError_t e)
{
    if (g_sticky.load () == cudaSuccess) t_last = e;
    return e;
}

bool s_sticky_code (cudaError_t e)
{
    return e == cudaErrorLaunchFailure || e == cudaErrorIllegalAddress;
}

/* The sticky error, if the emulated device has faulted. */
cudaError_t s_sticky (void)
{
    return (cudaError_t) g_sticky.load ();
}

#define S_STICKY()                                                              \
    do {                                                                        \
        cudaError_t st_ = s_sticky ();                                          \
        if (st_ != cudaSuccess) return st_;                                     \
    } while (0)

/* ------------------------------------------------------------- streams -- */

bool s_legacy (cudaStream_t s)
{
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

void s_invalidate (CUstream_st *s)
{
    if (s->cap == cudaStreamCaptureStatusActive) {
        s->cap = cudaStreamCaptureStatusInvalidated;
        s->graph->clear ();
    }
}

/* Legacy-stream work waits for every blocking stream: one that is
 * capturing would gain an implicit dependency -- an error that
 * invalidates its capture.  g_mu held. */
cudaError_t s_legacy_check (const char *call)
{
    cudaError_t rc = cudaSuccess;
    for (CUstream_st *s : g_streams)
        if (!(s->flags & cudaStreamNonBlocking) && s->cap != cudaStreamCaptureStatusNone) {
            if (rc == cudaSuccess)
                s_say ("%s: legacy-stream work while blocking stream %p is capturing "
                       "(cudaErrorStreamCaptureImplicit; the capture is invalidated)", call,
                       (void *) s);
            s_invalidate (s);
            rc = cudaErrorStreamCaptureImplicit;
        }
    return rc;
}

/* A "potentially unsafe" call (may synchronize implicitly) is refused
 * while this thread has a global or thread-local capture, or another
 * thread a global one (the calling thread's mode is Global, CUDA's
 * default).  g_mu held. */
cudaError_t s_unsafe_check (const char *call)
{
    const std::thread::id me = std::this_thread::get_id ();
    cudaError_t rc = cudaSuccess;
    for (CUstream_st *s : g_streams) {
        if (s->cap == cudaStreamCaptureStatusNone || s->mode == cudaStreamCaptureModeRelaxed)
            continue;
        if (s->cap_thread == me || s->mode == cudaStreamCaptureModeGlobal) {
            if (rc == cudaSuccess)
                s_say ("%s: not permitted while stream %p is capturing in %s mode "
                       "(cudaErrorStreamCaptureUnsupported; the capture is invalidated)", call,
                       (void *) s, s->mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local");
            s_invalidate (s);
            rc = cudaErrorStreamCaptureUnsupported;
        }
    }
    return rc;
}

/* Where work for stream st goes.  Returns cudaSuccess and sets *graph to
 * the capture's node list (or NULL: run now), or an error.  g_mu held. */
cudaError_t s_route (cudaStream_t st, const char *call, std::shared_ptr<s_nodes> *graph)
{
    graph->reset ();
    if (s_legacy (st)) return s_legacy_check (call);
    if (!g_streams.count (st)) {
        s_say ("%s: stream %p does not exist (destroyed, or never created)", call, (void *) st);
        return cudaErrorInvalidResourceHandle;
    }
    if (st->cap == cudaStreamCaptureStatusInvalidated) return cudaErrorStreamCaptureInvalidated;
    if (st->cap == cudaStreamCaptureStatusActive) *graph = st->graph;
    return cudaSuccess;
}

/* Synchronizing (or querying) st: refused while it captures.  g_mu held. */
cudaError_t s_sync_check (cudaStream_t st, const char *call)
{
    if (s_legacy (st)) return s_legacy_check (call);
    if (!g_streams.count (st)) {
        s_say ("%s: stream %p does not exist (destroyed, or never created)", call, (void *) st);
        return cudaErrorInvalidResourceHandle;
    }
    if (st->cap != cudaStreamCaptureStatusNone) {
        s_say ("%s: stream %p is capturing a graph (cudaErrorStreamCaptureUnsupported; the "
               "capture is invalidated)", call, (void *) st);
        s_invalidate (st);
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

/* -------------------------------------------------------------- memory -- */

/* Whether [p, p + n) lies inside one live allocation.  g_mu held. */
bool s_is_dev (const void *p, size_t n)
{
    uintptr_t a = (uintptr_t) p;
    auto it = g_mem.upper_bound (a);
    if (it == g_mem.begin ()) return false;
    --it;
    const uintptr_t off = a - it->first;
    return off < it->second && n <= it->second - off;
}

/* Checks a copy's sides against its kind.  g_mu held. */
cudaError_t s_copy_check (const char *call, void *dst, const void *src, size_t n,
                          enum cudaMemcpyKind kind)
{
    if (n == 0) return cudaSuccess;
    if (!dst || !src) {
        s_say ("%s: NULL %s", call, !dst ? "dst" : "src");
        return cudaErrorInvalidValue;
    }
    bool dst_dev, src_dev;
    switch (kind) {
    case cudaMemcpyHostToHost: dst_dev = false; src_dev = false; break;
    case cudaMemcpyHostToDevice: dst_dev = true; src_dev = false; break;
    case cudaMemcpyDeviceToHost: dst_dev = false; src_dev = true; break;
    case cudaMemcpyDeviceToDevice: dst_dev = true; src_dev = true; break;
    case cudaMemcpyDefault: return cudaSuccess;
    default:
        s_say ("%s: bad cudaMemcpyKind %d", call, (int) kind);
        return cudaErrorInvalidMemcpyDirection;
    }
    /* The GPU would fault (or read host memory through UVA): either way a
     * bug, reported here with the side and the kind. */
    if (dst_dev && !s_is_dev (dst, n)) {
        s_say ("%s: dst %p (%zu bytes) is not inside device memory (kind %d)", call, dst, n,
               (int) kind);
        return cudaErrorInvalidValue;
    }
    if (src_dev && !s_is_dev (src, n)) {
        s_say ("%s: src %p (%zu bytes) is not inside device memory (kind %d)", call, src, n,
               (int) kind);
        return cudaErrorInvalidValue;
    }
    if (!dst_dev && s_is_dev (dst, 1)) {
        s_say ("%s: dst %p is device memory but kind %d says host", call, dst, (int) kind);
        return cudaErrorInvalidValue;
    }
    if (!src_dev && s_is_dev (src, 1)) {
        s_say ("%s: src %p is device memory but kind %d says host", call, src, (int) kind);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

double s_now_ms (void)
{
    return std::chrono::duration<double, std::milli> (
               std::chrono::steady_clock::now ().time_since_epoch ())
        .count ();
}

/* ------------------------------------------------------------- halves -- */

float s_f16 (uint16_t h)
{
    const uint32_t s = (uint32_t) (h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    uint32_t bits;
    if (e == 0) {
        if (m == 0) bits = s;
        else {
            float f = std::ldexp ((float) m, -24);
            memcpy (&bits, &f, 4);
            bits |= s;
        }
    } else if (e == 31) bits = s | 0x7f800000u | (m << 13);
    else bits = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy (&f, &bits, 4);
    return f;
}

float s_bf16 (uint16_t h)
{
    uint32_t bits = (uint32_t) h << 16;
    float f;
    memcpy (&f, &bits, 4);
    return f;
}

float s_elem (const void *p, cudaDataType_t t, size_t i)
{
    switch (t) {
    case CUDA_R_32F: return ((const float *) p)[i];
    case CUDA_R_16F: return s_f16 (((const uint16_t *) p)[i]);
    default: return s_bf16 (((const uint16_t *) p)[i]);
    }
}

size_t s_esize (cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

}  // namespace

/* ------------------------------------------------------ the seam (S) -- */

namespace cuemu {

void enqueue (cudaStream_t st, std::function<void ()> fn)
{
    std::shared_ptr<s_nodes> graph;
    {
        std::lock_guard<std::mutex> lk (g_mu);
        cudaError_t e = s_sticky ();
        if (e == cudaSuccess) e = s_route (st, "kernel launch", &graph);
        if (e != cudaSuccess) {
            s_fail (e);
            return;
        }
        g_n_work++;
        if (graph) {
            graph->push_back (std::move (fn));
            return;
        }
    }
    fn ();
}

void set_error (cudaError_t e, const char *msg)
{
    if (msg && *msg) fprintf (stderr, "cuemu: %s\n", msg);
    if (e == cudaSuccess) return;
    if (s_sticky_code (e)) {
        int ok = cudaSuccess;
        g_sticky.compare_exchange_strong (ok, (int) e);
    }
    s_fail (e);
    /* A launch that fails while its thread captures invalidates the
     * capture, as CUDA does (the executor does not tell which stream: every
     * capture this thread began). */
    if (!t_replay) {
        std::lock_guard<std::mutex> lk (g_mu);
        const std::thread::id me = std::this_thread::get_id ();
        for (CUstream_st *s : g_streams)
            if (s->cap == cudaStreamCaptureStatusActive && s->cap_thread == me) s_invalidate (s);
    }
}

size_t max_dyn_smem (const void *fn)
{
    std::lock_guard<std::mutex> lk (g_mu);
    auto it = g_smem.find (fn);
    return it == g_smem.end () ? s_dflt_smem : it->second;
}

}  // namespace cuemu

/* -------------------------------------------------------------- errors -- */

S_EXPORT const char *cudaGetErrorName (cudaError_t e)
{
    switch (e) {
#define S_N(x) case x: return #x;
    S_N (cudaSuccess) S_N (cudaErrorInvalidValue) S_N (cudaErrorMemoryAllocation)
    S_N (cudaErrorInitializationError) S_N (cudaErrorInvalidConfiguration)
    S_N (cudaErrorInvalidSymbol) S_N (cudaErrorInvalidDevicePointer)
    S_N (cudaErrorInvalidMemcpyDirection) S_N (cudaErrorInvalidDeviceFunction)
    S_N (cudaErrorNoDevice) S_N (cudaErrorInvalidDevice) S_N (cudaErrorInvalidResourceHandle)
    S_N (cudaErrorIllegalState) S_N (cudaErrorNotReady) S_N (cudaErrorIllegalAddress)
    S_N (cudaErrorLaunchOutOfResources) S_N (cudaErrorLaunchFailure) S_N (cudaErrorNotSupported)
    S_N (cudaErrorStreamCaptureUnsupported) S_N (cudaErrorStreamCaptureInvalidated)
    S_N (cudaErrorStreamCaptureUnmatched) S_N (cudaErrorStreamCaptureUnjoined)
    S_N (cudaErrorStreamCaptureIsolation) S_N (cudaErrorStreamCaptureImplicit)
    S_N (cudaErrorCapturedEvent) S_N (cudaErrorStreamCaptureWrongThread) S_N (cudaErrorUnknown)
#undef S_N
    }
    return "cudaErrorUnknown";
}

/* The CUDA runtime's wording. */
S_EXPORT const char *cudaGetErrorString (cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnjoined: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureIsolation: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
        return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
        return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unrecognized error code";
}

S_EXPORT cudaError_t cudaGetLastError (void)
{
    cudaError_t st = s_sticky ();
    if (st != cudaSuccess) return st;
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

S_EXPORT cudaError_t cudaPeekAtLastError (void)
{
    cudaError_t st = s_sticky ();
    return st != cudaSuccess ? st : t_last;
}

/* ------------------------------------------------------------- devices -- */

S_EXPORT cudaError_t cudaGetDeviceCount (int *count)
{
    if (!count) return s_fail (cudaErrorInvalidValue);
    *count = s_ndev ();
    if (*count == 0) return s_fail (cudaErrorNoDevice);
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaSetDevice (int device)
{
    S_STICKY ();
    if (s_ndev () == 0) return s_fail (cudaErrorNoDevice);
    if (device < 0 || device >= s_ndev ()) return s_fail (cudaErrorInvalidDevice);
    t_dev = device;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaGetDevice (int *device)
{
    if (!device) return s_fail (cudaErrorInvalidValue);
    if (s_ndev () == 0) return s_fail (cudaErrorNoDevice);
    *device = t_dev;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaGetDeviceProperties (struct cudaDeviceProp *p, int device)
{
    if (!p) return s_fail (cudaErrorInvalidValue);
    if (device < 0 || device >= s_ndev ()) return s_fail (cudaErrorInvalidDevice);
    memset (p, 0, sizeof *p);
    snprintf (p->name, sizeof p->name, "cuemu (emulated H200)");
    p->totalGlobalMem = s_capacity ();
    p->sharedMemPerBlock = s_dflt_smem;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = cuemu::max_threads_per_block;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = cuemu::sm_count;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->sharedMemPerBlockOptin = cuemu::max_smem_optin;
    p->l2CacheSize = 60 << 20;
    p->memoryBusWidth = 6144;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaDeviceSynchronize (void)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    for (CUstream_st *s : g_streams)
        if (s->cap != cudaStreamCaptureStatusNone) {
            s_say ("cudaDeviceSynchronize: stream %p is capturing a graph "
                   "(cudaErrorStreamCaptureUnsupported; the capture is invalidated)", (void *) s);
            for (CUstream_st *o : g_streams) s_invalidate (o);
            return s_fail (cudaErrorStreamCaptureUnsupported);
        }
    return cudaSuccess;
}

/* -------------------------------------------------------------- memory -- */

S_EXPORT cudaError_t cudaMalloc (void **p, size_t size)
{
    S_STICKY ();
    if (!p) return s_fail (cudaErrorInvalidValue);
    *p = nullptr;
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_unsafe_check ("cudaMalloc");
    if (e != cudaSuccess) return s_fail (e);
    if (size == 0) return cudaSuccess;
    const size_t cap = s_capacity ();
    if (size > cap - g_mem_used) return s_fail (cudaErrorMemoryAllocation);
    const size_t rounded = (size + 255) / 256 * 256;
    void *m = aligned_alloc (256, rounded);
    if (!m) return s_fail (cudaErrorMemoryAllocation);
    /* Fill what can be filled cheaply: a 10 GiB KV pool stays untouched
     * (the OS's zero pages) instead of costing 10 GiB of host memory. */
    const int fill = s_fill_byte ();
    if (fill >= 0 && rounded <= ((size_t) 256 << 20)) memset (m, fill, rounded);
    g_mem[(uintptr_t) m] = size;
    g_mem_used += size;
    g_mem_peak = std::max (g_mem_peak, g_mem_used);
    *p = m;
    return cudaSuccess;
}

/* The release calls work after a sticky fault too (returning it), so a
 * backend torn down after a kernel bug leaks nothing under LeakSanitizer. */
S_EXPORT cudaError_t cudaFree (void *p)
{
    if (!p) return s_sticky ();
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_unsafe_check ("cudaFree");
    if (e != cudaSuccess) return s_fail (e);
    auto it = g_mem.find ((uintptr_t) p);
    if (it == g_mem.end ()) {
        s_say ("cudaFree: %p is not a live cudaMalloc pointer", p);
        return s_fail (cudaErrorInvalidValue);
    }
    g_mem_used -= it->second;
    g_mem.erase (it);
    free (p);
    return s_sticky ();   /* released even after a fault; the fault still reported */
}

S_EXPORT cudaError_t cudaMemGetInfo (size_t *fr, size_t *total)
{
    S_STICKY ();
    if (!fr || !total) return s_fail (cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk (g_mu);
    *total = s_capacity ();
    *fr = *total - g_mem_used;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaMemcpy (void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    S_STICKY ();
    {
        std::lock_guard<std::mutex> lk (g_mu);
        cudaError_t e = s_unsafe_check ("cudaMemcpy");
        if (e == cudaSuccess) e = s_legacy_check ("cudaMemcpy");
        if (e == cudaSuccess) e = s_copy_check ("cudaMemcpy", dst, src, n, kind);
        if (e != cudaSuccess) return s_fail (e);
    }
    if (n) memmove (dst, src, n);
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaMemcpyAsync (void *dst, const void *src, size_t n,
                                      enum cudaMemcpyKind kind, cudaStream_t st)
{
    S_STICKY ();
    std::shared_ptr<s_nodes> graph;
    {
        std::lock_guard<std::mutex> lk (g_mu);
        cudaError_t e = s_copy_check ("cudaMemcpyAsync", dst, src, n, kind);
        if (e == cudaSuccess) e = s_route (st, "cudaMemcpyAsync", &graph);
        if (e != cudaSuccess) return s_fail (e);
        if (graph) {
            if (n) graph->push_back ([=] { memmove (dst, src, n); });
            return cudaSuccess;
        }
    }
    if (n) memmove (dst, src, n);
    return cudaSuccess;
}

static cudaError_t s_memset_check (const char *call, void *p, size_t n)
{
    if (n == 0) return cudaSuccess;
    if (!s_is_dev (p, n)) {
        s_say ("%s: %p (%zu bytes) is not inside device memory", call, p, n);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaMemset (void *p, int value, size_t n)
{
    S_STICKY ();
    {
        std::lock_guard<std::mutex> lk (g_mu);
        cudaError_t e = s_unsafe_check ("cudaMemset");
        if (e == cudaSuccess) e = s_legacy_check ("cudaMemset");
        if (e == cudaSuccess) e = s_memset_check ("cudaMemset", p, n);
        if (e != cudaSuccess) return s_fail (e);
    }
    if (n) memset (p, value, n);
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaMemsetAsync (void *p, int value, size_t n, cudaStream_t st)
{
    S_STICKY ();
    std::shared_ptr<s_nodes> graph;
    {
        std::lock_guard<std::mutex> lk (g_mu);
        cudaError_t e = s_memset_check ("cudaMemsetAsync", p, n);
        if (e == cudaSuccess) e = s_route (st, "cudaMemsetAsync", &graph);
        if (e != cudaSuccess) return s_fail (e);
        if (graph) {
            if (n) graph->push_back ([=] { memset (p, value, n); });
            return cudaSuccess;
        }
    }
    if (n) memset (p, value, n);
    return cudaSuccess;
}

/* ------------------------------------------------------------- streams -- */

S_EXPORT cudaError_t cudaStreamCreateWithFlags (cudaStream_t *ps, unsigned int flags)
{
    S_STICKY ();
    if (!ps || (flags & ~(unsigned) cudaStreamNonBlocking)) return s_fail (cudaErrorInvalidValue);
    CUstream_st *s = new CUstream_st ();
    s->flags = flags;
    s->cap = cudaStreamCaptureStatusNone;
    s->mode = cudaStreamCaptureModeGlobal;
    std::lock_guard<std::mutex> lk (g_mu);
    g_streams.insert (s);
    *ps = s;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaStreamCreate (cudaStream_t *ps)
{
    return cudaStreamCreateWithFlags (ps, cudaStreamDefault);
}

S_EXPORT cudaError_t cudaStreamDestroy (cudaStream_t st)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (s_legacy (st) || !g_streams.erase (st)) {
        s_say ("cudaStreamDestroy: stream %p does not exist", (void *) st);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    if (st->cap != cudaStreamCaptureStatusNone)
        s_say ("cudaStreamDestroy: stream %p destroyed while capturing; the capture is lost",
               (void *) st);
    delete st;
    return s_sticky ();   /* released even after a fault; the fault still reported */
}

S_EXPORT cudaError_t cudaStreamSynchronize (cudaStream_t st)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_sync_check (st, "cudaStreamSynchronize");
    return e == cudaSuccess ? e : s_fail (e);
}

S_EXPORT cudaError_t cudaStreamQuery (cudaStream_t st)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_sync_check (st, "cudaStreamQuery");
    return e == cudaSuccess ? e : s_fail (e);
}

S_EXPORT cudaError_t cudaStreamWaitEvent (cudaStream_t st, cudaEvent_t ev, unsigned int flags)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    if (!ev || !g_events.count (ev)) return s_fail (cudaErrorInvalidResourceHandle);
    std::shared_ptr<s_nodes> graph;
    cudaError_t e = s_route (st, "cudaStreamWaitEvent", &graph);
    if (e != cudaSuccess) return s_fail (e);
    if (ev->captured && !graph) {
        /* Would fork st into the capture: cross-stream capture is not
         * emulated (kernels/cuda captures one stream). */
        s_say ("cudaStreamWaitEvent: joining stream %p to a capture through an event is not "
               "emulated", (void *) st);
        return s_fail (cudaErrorNotSupported);
    }
    return cudaSuccess;   /* every stream has finished its work already */
}

S_EXPORT cudaError_t cudaStreamIsCapturing (cudaStream_t st, enum cudaStreamCaptureStatus *cs)
{
    S_STICKY ();
    if (!cs) return s_fail (cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk (g_mu);
    if (s_legacy (st)) {
        for (CUstream_st *s : g_streams)
            if (!(s->flags & cudaStreamNonBlocking) && s->cap != cudaStreamCaptureStatusNone)
                return s_fail (cudaErrorStreamCaptureImplicit);
        *cs = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    if (!g_streams.count (st)) {
        s_say ("cudaStreamIsCapturing: stream %p does not exist", (void *) st);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    *cs = st->cap;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaStreamBeginCapture (cudaStream_t st, enum cudaStreamCaptureMode mode)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    if (s_legacy (st)) {
        s_say ("cudaStreamBeginCapture: the legacy (NULL) stream cannot be captured");
        return s_fail (cudaErrorStreamCaptureUnsupported);
    }
    if (!g_streams.count (st)) {
        s_say ("cudaStreamBeginCapture: stream %p does not exist", (void *) st);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return s_fail (cudaErrorInvalidValue);
    if (st->cap != cudaStreamCaptureStatusNone) {
        s_say ("cudaStreamBeginCapture: stream %p is already capturing", (void *) st);
        return s_fail (cudaErrorIllegalState);
    }
    st->cap = cudaStreamCaptureStatusActive;
    st->mode = mode;
    st->cap_thread = std::this_thread::get_id ();
    st->graph = std::make_shared<s_nodes> ();
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaStreamEndCapture (cudaStream_t st, cudaGraph_t *pg)
{
    S_STICKY ();
    if (!pg) return s_fail (cudaErrorInvalidValue);
    *pg = nullptr;
    std::lock_guard<std::mutex> lk (g_mu);
    if (s_legacy (st) || !g_streams.count (st)) {
        s_say ("cudaStreamEndCapture: stream %p does not exist", (void *) st);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    if (st->cap == cudaStreamCaptureStatusNone) {
        s_say ("cudaStreamEndCapture: stream %p is not capturing", (void *) st);
        return s_fail (cudaErrorIllegalState);
    }
    if (st->mode != cudaStreamCaptureModeRelaxed && st->cap_thread != std::this_thread::get_id ()) {
        s_say ("cudaStreamEndCapture: stream %p's capture began on another thread", (void *) st);
        return s_fail (cudaErrorStreamCaptureWrongThread);
    }
    const bool ok = st->cap == cudaStreamCaptureStatusActive;
    std::shared_ptr<s_nodes> nodes = std::move (st->graph);
    st->graph.reset ();
    st->cap = cudaStreamCaptureStatusNone;
    g_n_captures++;
    if (!ok) {
        g_n_invalidated++;
        return s_fail (cudaErrorStreamCaptureInvalidated);
    }
    CUgraph_st *g = new CUgraph_st ();
    g->nodes = std::move (nodes);
    g_graphs.insert (g);
    *pg = g;
    return cudaSuccess;
}

/* -------------------------------------------------------------- events -- */

S_EXPORT cudaError_t cudaEventCreateWithFlags (cudaEvent_t *pe, unsigned int flags)
{
    S_STICKY ();
    if (!pe || (flags & ~(unsigned) (cudaEventBlockingSync | cudaEventDisableTiming)))
        return s_fail (cudaErrorInvalidValue);
    CUevent_st *e = new CUevent_st ();
    e->flags = flags;
    std::lock_guard<std::mutex> lk (g_mu);
    g_events.insert (e);
    *pe = e;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaEventCreate (cudaEvent_t *pe)
{
    return cudaEventCreateWithFlags (pe, cudaEventDefault);
}

S_EXPORT cudaError_t cudaEventDestroy (cudaEvent_t ev)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!ev || !g_events.erase (ev)) {
        s_say ("cudaEventDestroy: event %p does not exist", (void *) ev);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    delete ev;
    return s_sticky ();   /* released even after a fault; the fault still reported */
}

S_EXPORT cudaError_t cudaEventRecord (cudaEvent_t ev, cudaStream_t st)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    if (!ev || !g_events.count (ev)) {
        s_say ("cudaEventRecord: event %p does not exist", (void *) ev);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    std::shared_ptr<s_nodes> graph;
    cudaError_t e = s_route (st, "cudaEventRecord", &graph);
    if (e != cudaSuccess) return s_fail (e);
    if (graph) {
        /* In a capture a record only marks a point for other streams to
         * join; the event cannot be waited for or timed until recorded
         * outside a capture again. */
        ev->captured = true;
        ev->recorded = false;
        return cudaSuccess;
    }
    ev->captured = false;
    ev->recorded = true;
    ev->ms = s_now_ms ();   /* the stream's work before it has run already */
    return cudaSuccess;
}

static cudaError_t s_event_wait (cudaEvent_t ev, const char *call)
{
    if (!ev || !g_events.count (ev)) {
        s_say ("%s: event %p does not exist", call, (void *) ev);
        return cudaErrorInvalidResourceHandle;
    }
    if (ev->captured) {
        s_say ("%s: event %p was last recorded in a capturing stream", call, (void *) ev);
        return cudaErrorCapturedEvent;
    }
    return cudaSuccess;   /* never recorded: complete, as in CUDA */
}

S_EXPORT cudaError_t cudaEventQuery (cudaEvent_t ev)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_event_wait (ev, "cudaEventQuery");
    return e == cudaSuccess ? e : s_fail (e);
}

S_EXPORT cudaError_t cudaEventSynchronize (cudaEvent_t ev)
{
    S_STICKY ();
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_event_wait (ev, "cudaEventSynchronize");
    return e == cudaSuccess ? e : s_fail (e);
}

S_EXPORT cudaError_t cudaEventElapsedTime (float *ms, cudaEvent_t a, cudaEvent_t b)
{
    S_STICKY ();
    if (!ms) return s_fail (cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk (g_mu);
    cudaError_t e = s_event_wait (a, "cudaEventElapsedTime");
    if (e == cudaSuccess) e = s_event_wait (b, "cudaEventElapsedTime");
    if (e != cudaSuccess) return s_fail (e);
    /* Never recorded, or created with cudaEventDisableTiming: CUDA says
     * invalid resource handle. */
    if (!a->recorded || !b->recorded || ((a->flags | b->flags) & cudaEventDisableTiming))
        return s_fail (cudaErrorInvalidResourceHandle);
    *ms = (float) (b->ms - a->ms);
    return cudaSuccess;
}

/* -------------------------------------------------------------- graphs -- */

S_EXPORT cudaError_t cudaGraphInstantiate (cudaGraphExec_t *pe, cudaGraph_t g,
                                           unsigned long long flags)
{
    S_STICKY ();
    if (!pe) return s_fail (cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk (g_mu);
    if (!g || !g_graphs.count (g)) {
        s_say ("cudaGraphInstantiate: graph %p does not exist", (void *) g);
        return s_fail (cudaErrorInvalidValue);
    }
    CUgraphExec_st *x = new CUgraphExec_st ();
    x->nodes = std::make_shared<const s_nodes> (*g->nodes);   /* independent of g */
    g_execs.insert (x);
    *pe = x;
    return cudaSuccess;
}

S_EXPORT cudaError_t cudaGraphLaunch (cudaGraphExec_t x, cudaStream_t st)
{
    S_STICKY ();
    std::shared_ptr<const s_nodes> nodes;
    {
        std::lock_guard<std::mutex> lk (g_mu);
        if (!x || !g_execs.count (x)) {
            s_say ("cudaGraphLaunch: executable graph %p does not exist", (void *) x);
            return s_fail (cudaErrorInvalidResourceHandle);
        }
        std::shared_ptr<s_nodes> graph;
        cudaError_t e = s_route (st, "cudaGraphLaunch", &graph);
        if (e != cudaSuccess) return s_fail (e);
        nodes = x->nodes;
        if (graph) {   /* a child graph of the capture */
            graph->push_back ([nodes] {
                for (const auto &fn : *nodes) fn ();
            });
            return cudaSuccess;
        }
    }
    g_n_replays++;
    t_replay++;
    for (const auto &fn : *nodes) {
        if (s_sticky () != cudaSuccess) break;
        fn ();
    }
    t_replay--;
    return s_sticky ();
}

S_EXPORT cudaError_t cudaGraphExecDestroy (cudaGraphExec_t x)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!x || !g_execs.erase (x)) {
        s_say ("cudaGraphExecDestroy: executable graph %p does not exist", (void *) x);
        return s_fail (cudaErrorInvalidResourceHandle);
    }
    delete x;
    return s_sticky ();   /* released even after a fault; the fault still reported */
}

S_EXPORT cudaError_t cudaGraphDestroy (cudaGraph_t g)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!g || !g_graphs.erase (g)) {
        s_say ("cudaGraphDestroy: graph %p does not exist", (void *) g);
        return s_fail (cudaErrorInvalidValue);
    }
    delete g;
    return s_sticky ();   /* released even after a fault; the fault still reported */
}

/* ----------------------------------------------------------- functions -- */

S_EXPORT cudaError_t cudaFuncSetAttribute (const void *fn, enum cudaFuncAttribute attr, int value)
{
    S_STICKY ();
    if (!fn) return s_fail (cudaErrorInvalidDeviceFunction);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || (size_t) value > cuemu::max_smem_optin) {
            s_say ("cudaFuncSetAttribute: %d bytes of dynamic shared memory (0..%zu)", value,
                   cuemu::max_smem_optin);
            return s_fail (cudaErrorInvalidValue);
        }
        {
            std::lock_guard<std::mutex> lk (g_mu);
            g_smem[fn] = (size_t) value;
        }
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        if (value < -1 || value > 100) return s_fail (cudaErrorInvalidValue);
        return cudaSuccess;   /* a hint: no effect on results */
    }
    return s_fail (cudaErrorInvalidValue);
}

/* --------------------------------------------------------------- cuBLAS -- */

S_EXPORT cublasStatus_t cublasCreate (cublasHandle_t *h)
{
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = nullptr;
    if (s_ndev () == 0 || s_sticky () != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasContext *c = new cublasContext ();
    std::lock_guard<std::mutex> lk (g_mu);
    g_blas.insert (c);
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

S_EXPORT cublasStatus_t cublasDestroy (cublasHandle_t h)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!h || !g_blas.erase (h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

S_EXPORT cublasStatus_t cublasSetStream (cublasHandle_t h, cudaStream_t st)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!h || !g_blas.count (h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = st;
    return CUBLAS_STATUS_SUCCESS;
}

S_EXPORT cublasStatus_t cublasGetStream (cublasHandle_t h, cudaStream_t *st)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!h || !g_blas.count (h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!st) return CUBLAS_STATUS_INVALID_VALUE;
    *st = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

S_EXPORT cublasStatus_t cublasSetWorkspace (cublasHandle_t h, void *ws, size_t bytes)
{
    std::lock_guard<std::mutex> lk (g_mu);
    if (!h || !g_blas.count (h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && (!ws || (uintptr_t) ws % 256 || !s_is_dev (ws, bytes)))
        return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

/* The bytes a column-major rows x cols matrix with leading dimension ld
 * spans. */
size_t s_span (int rows, int cols, int ld, size_t es)
{
    if (rows == 0 || cols == 0) return 0;
    return ((size_t) (cols - 1) * (size_t) ld + (size_t) rows) * es;
}

struct s_gemm {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    cudaDataType_t at;
    int lda, ldb, ldc;
    float *C;

    void run () const
    {
        /* op(A) as m rows of k and op(B) as n rows of k, in float. */
        std::vector<float> a ((size_t) m * k), b ((size_t) n * k);
        for (int i = 0; i < m; i++)
            for (int p = 0; p < k; p++)
                a[(size_t) i * k + p] = s_elem (A, at, ta == CUBLAS_OP_N ? (size_t) i + (size_t) p * lda
                                                                        : (size_t) p + (size_t) i * lda);
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++)
                b[(size_t) j * k + p] = s_elem (B, at, tb == CUBLAS_OP_N ? (size_t) p + (size_t) j * ldb
                                                                        : (size_t) j + (size_t) p * ldb);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float *ar = &a[(size_t) i * k], *br = &b[(size_t) j * k];
                float acc = 0.f;
                for (int p = 0; p < k; p++) acc += ar[p] * br[p];
                float *c = &C[(size_t) i + (size_t) j * ldc];
                *c = beta == 0.f ? alpha * acc : alpha * acc + beta * *c;
            }
    }
};

}  // namespace

S_EXPORT cublasStatus_t cublasGemmEx (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                      int m, int n, int k, const void *alpha, const void *A,
                                      cudaDataType_t at, int lda, const void *B, cudaDataType_t bt,
                                      int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                                      cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
    s_gemm g;
    cudaStream_t st;
    {
        std::lock_guard<std::mutex> lk (g_mu);
        if (!h || !g_blas.count (h)) return CUBLAS_STATUS_NOT_INITIALIZED;
        st = h->stream;
    }
    if (s_sticky () != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* Real types: OP_C is OP_T. */
    if (ta == CUBLAS_OP_C) ta = CUBLAS_OP_T;
    if (tb == CUBLAS_OP_C) tb = CUBLAS_OP_T;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
        m < 0 || n < 0 || k < 0 || !alpha || !beta ||
        lda < std::max (1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max (1, tb == CUBLAS_OP_N ? k : n) ||
        ldc < std::max (1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (at != bt || (at != CUDA_R_32F && at != CUDA_R_16F && at != CUDA_R_16BF) || ct != CUDA_R_32F ||
        comp != CUBLAS_COMPUTE_32F || (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    const size_t es = s_esize (at);
    {
        std::lock_guard<std::mutex> lk (g_mu);
        const size_t sa = k ? s_span (ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, es) : 0;
        const size_t sb = k ? s_span (tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, es) : 0;
        const char *bad = (sa && !s_is_dev (A, sa)) ? "A" : (sb && !s_is_dev (B, sb)) ? "B"
                          : !s_is_dev (C, s_span (m, n, ldc, 4)) ? "C" : nullptr;
        if (bad) {
            /* The GPU would fault: an illegal address, sticky. */
            s_say ("cublasGemmEx: %s (m %d n %d k %d, lda %d ldb %d ldc %d) is not inside device "
                   "memory: an illegal address", bad, m, n, k, lda, ldb, ldc);
            int ok = cudaSuccess;
            g_sticky.compare_exchange_strong (ok, (int) cudaErrorIllegalAddress);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
    }
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = *(const float *) alpha;   /* CUBLAS_POINTER_MODE_HOST: read now */
    g.beta = *(const float *) beta;
    g.A = A;
    g.B = B;
    g.at = at;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    g.C = (float *) C;
    cudaError_t before = t_last;
    t_last = cudaSuccess;
    cuemu::enqueue (st, [g] { g.run (); });
    cudaError_t e = t_last;
    if (e == cudaSuccess) t_last = before;
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
