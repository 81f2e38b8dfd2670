/* tests/cuemu/cuemu.h -- the device side of the CUDA emulator: the CUDA
 * built-in types and variables, the device intrinsics kernels.cu uses, and
 * cuemu::launch, which runs a kernel grid on the CPU with one fiber per
 * GPU thread (simt.cc; tests/cuemu/README.md "The SIMT executor").
 *
 * Included through the shim <cuda_runtime.h> by the code prep.sh makes of
 * a .cu file; C++17, g++.  Not for host C code (plugin.c sees only
 * <cuda_runtime_api.h>).
 *
 * Thread-safety: launches may come from any host thread; simt.cc runs one
 * grid at a time under a global mutex.  The device functions below may be
 * called only from a kernel that cuemu is running (they act on the
 * current emulated thread). */
#ifndef RX_CUEMU_H
#define RX_CUEMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

#include "cuemu_internal.h"

/* ------------------------------------------------ CUDA built-in types -- */

/* uint3 and dim3 come from <vector_types.h> (through cuda_runtime_api.h);
 * the other vector types kernels use are here. */
#ifndef CUEMU_MORE_VECTOR_TYPES
#define CUEMU_MORE_VECTOR_TYPES
struct int2 { int x, y; };
struct alignas (16) int4 { int x, y, z, w; };
struct alignas (8) uint2 { unsigned int x, y; };
struct alignas (16) uint4 { unsigned int x, y, z, w; };
struct alignas (8) float2 { float x, y; };
struct alignas (16) float4 { float x, y, z, w; };
static inline uint4 make_uint4 (unsigned x, unsigned y, unsigned z, unsigned w) { return { x, y, z, w }; }
static inline uint2 make_uint2 (unsigned x, unsigned y) { return { x, y }; }
static inline float4 make_float4 (float x, float y, float z, float w) { return { x, y, z, w }; }
static inline float2 make_float2 (float x, float y) { return { x, y }; }
static inline int2 make_int2 (int x, int y) { return { x, y }; }
static inline int4 make_int4 (int x, int y, int z, int w) { return { x, y, z, w }; }
#endif

/* The built-in variables of the thread the executor is running (it sets
 * them before it resumes a thread's fiber). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* ------------------------------------------------- qualifiers -------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas (n)
#define __constant__ static
/* Blocks run one at a time, so a function's static is its block's shared
 * memory (prep.sh adds cuemu::shared_decl, which poisons it per block). */
#define __shared__ static

namespace cuemu {

/* ------------------------------------------------------------ launch -- */

struct launch_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const char *name;   /* for messages; prep.sh sets it */
    launch_cfg &named (const char *n) { name = n; return *this; }
};

/* <<<grid, block[, smem[, stream]]>>> */
inline launch_cfg cfg (dim3 grid, dim3 block, size_t smem = 0, cudaStream_t st = 0)
{
    return launch_cfg { grid, block, smem, st, nullptr };
}

using thread_fn = void (*) (void *ctx);

/* The configuration check of a launch: false (after set_error) when the
 * block has 0 or more than 1024 threads (or a dimension past CUDA's
 * 1024 x 1024 x 64), a grid dimension is 0 or past 2^31-1 x 65535 x 65535
 * (cudaErrorInvalidConfiguration), or smem is over max_dyn_smem (kernel)
 * (cudaErrorInvalidValue). */
bool check_cfg (const launch_cfg &c, const void *kernel);

/* Runs the grid now, block after block, each thread calling fn (ctx).
 * A deadlock or a warp-op misuse: set_error (cudaErrorLaunchFailure) and
 * the rest of the grid is abandoned.  Returns the cudaError_t. */
cudaError_t run_grid (const launch_cfg &c, const void *kernel, thread_fn fn, void *ctx);

/* Launch kernel k: checks the configuration, then copies the arguments,
 * converted to the kernel's parameter types, into a closure that runs the
 * grid and hands it to enqueue (c.stream) -- so a captured launch replays
 * with the captured values. */
template <class... P, class... A>
void launch (void (*k) (P...), launch_cfg c, A &&...a)
{
    static_assert (sizeof...(P) == sizeof...(A), "kernel launch: wrong number of arguments");
    const void *kp = reinterpret_cast<const void *> (k);
    if (!check_cfg (c, kp)) return;
    struct call {
        void (*k) (P...);
        std::tuple<std::decay_t<P>...> args;
        static void run (void *ctx)
        {
            call *self = static_cast<call *> (ctx);
            std::apply (self->k, self->args);   /* each thread gets its own copies */
        }
    };
    call cl { k, std::tuple<std::decay_t<P>...> (std::forward<A> (a)...) };
    enqueue (c.stream, [cl, c, kp] () mutable { run_grid (c, kp, &call::run, &cl); });
}

/* The block's dynamic shared memory (the <<<..., smem>>> bytes; 128-byte
 * aligned).  Filled with 0xff bytes (float NaN, int -1) before each block,
 * as a GPU leaves it undefined. */
void *dyn_smem ();

/* prep.sh puts this after each `__shared__` declaration (a static, see
 * __shared__ above): the first thread of a block that reaches it fills the
 * variable with 0xff bytes, as a GPU leaves shared memory undefined at a
 * block's start.  (Tracks up to 64 variables per block.) */
void shared_decl (void *p, size_t bytes);

/* ------------------------------------------------------- warp ops ---- */

enum op_kind {
    OP_SYNCTHREADS = 1, OP_SYNCWARP, OP_SHFL_IDX, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR,
    OP_MATCH_ANY, OP_BALLOT, OP_ANY, OP_ALL
};

/* Blocks the current thread at a barrier / warp op (simt.cc); returns the
 * op's result for this thread.  b, c: the shuffle's lane operand and PTX
 * clamp value; val: the thread's value (its bits, zero-extended). */
uint64_t sync_op (int kind, unsigned mask, uint64_t val, int b, int c, const char *file, int line);

template <class T> inline uint64_t to_bits (T v)
{
    static_assert (sizeof (T) <= 8 && std::is_trivially_copyable<T>::value, "warp op on a type over 8 bytes");
    uint64_t u = 0;
    std::memcpy (&u, &v, sizeof v);
    return u;
}
template <class T> inline T from_bits (uint64_t u)
{
    T v;
    std::memcpy (&v, &u, sizeof v);
    return v;
}

}  // namespace cuemu

/* -------------------------------------------------- barriers ------- */

inline void __syncthreads (const char *file = __builtin_FILE (), int line = __builtin_LINE ())
{
    cuemu::sync_op (cuemu::OP_SYNCTHREADS, 0xffffffffu, 0, 0, 0, file, line);
}
inline void __syncwarp (unsigned mask = 0xffffffffu, const char *file = __builtin_FILE (),
                        int line = __builtin_LINE ())
{
    cuemu::sync_op (cuemu::OP_SYNCWARP, mask, 0, 0, 0, file, line);
}
/* One emulated thread runs at a time and memory is the host's: fences are
 * compiler barriers. */
inline void __threadfence () { __asm__ __volatile__ ("" ::: "memory"); }
inline void __threadfence_block () { __asm__ __volatile__ ("" ::: "memory"); }

/* ---------------------------------------------------- shuffles ------- */
/* c operands as CUDA's headers build them for shfl.sync (PTX ISA). */

template <class T>
inline T __shfl_sync (unsigned mask, T var, int srcLane, int width = warpSize,
                      const char *file = __builtin_FILE (), int line = __builtin_LINE ())
{
    return cuemu::from_bits<T> (cuemu::sync_op (cuemu::OP_SHFL_IDX, mask, cuemu::to_bits (var), srcLane,
                                                ((warpSize - width) << 8) | 0x1f, file, line));
}
template <class T>
inline T __shfl_up_sync (unsigned mask, T var, unsigned delta, int width = warpSize,
                         const char *file = __builtin_FILE (), int line = __builtin_LINE ())
{
    return cuemu::from_bits<T> (cuemu::sync_op (cuemu::OP_SHFL_UP, mask, cuemu::to_bits (var), (int) delta,
                                                (warpSize - width) << 8, file, line));
}
template <class T>
inline T __shfl_down_sync (unsigned mask, T var, unsigned delta, int width = warpSize,
                           const char *file = __builtin_FILE (), int line = __builtin_LINE ())
{
    return cuemu::from_bits<T> (cuemu::sync_op (cuemu::OP_SHFL_DOWN, mask, cuemu::to_bits (var), (int) delta,
                                                ((warpSize - width) << 8) | 0x1f, file, line));
}
template <class T>
inline T __shfl_xor_sync (unsigned mask, T var, int laneMask, int width = warpSize,
                          const char *file = __builtin_FILE (), int line = __builtin_LINE ())
{
    return cuemu::from_bits<T> (cuemu::sync_op (cuemu::OP_SHFL_XOR, mask, cuemu::to_bits (var), laneMask,
                                                ((warpSize - width) << 8) | 0x1f, file, line));
}
template <class T>
inline unsigned __match_any_sync (unsigned mask, T value, const char *file = __builtin_FILE (),
                                  int line = __builtin_LINE ())
{
    return (unsigned) cuemu::sync_op (cuemu::OP_MATCH_ANY, mask, cuemu::to_bits (value), 0, 0, file, line);
}
inline unsigned __ballot_sync (unsigned mask, int pred, const char *file = __builtin_FILE (),
                               int line = __builtin_LINE ())
{
    return (unsigned) cuemu::sync_op (cuemu::OP_BALLOT, mask, pred != 0, 0, 0, file, line);
}
inline int __any_sync (unsigned mask, int pred, const char *file = __builtin_FILE (),
                       int line = __builtin_LINE ())
{
    return (int) cuemu::sync_op (cuemu::OP_ANY, mask, pred != 0, 0, 0, file, line);
}
inline int __all_sync (unsigned mask, int pred, const char *file = __builtin_FILE (),
                       int line = __builtin_LINE ())
{
    return (int) cuemu::sync_op (cuemu::OP_ALL, mask, pred != 0, 0, 0, file, line);
}

/* ------------------------------------------------------ atomics ----- */
/* One emulated thread runs at a time and never in the middle of these: a
 * plain read-modify-write is atomic.  Each returns the old value. */

template <class T> inline T __cuemu_atomic_add (T *a, T v) { T o = *a; *a = o + v; return o; }
inline int atomicAdd (int *a, int v) { return __cuemu_atomic_add (a, v); }
inline unsigned atomicAdd (unsigned *a, unsigned v) { return __cuemu_atomic_add (a, v); }
inline unsigned long long atomicAdd (unsigned long long *a, unsigned long long v) { return __cuemu_atomic_add (a, v); }
inline float atomicAdd (float *a, float v) { return __cuemu_atomic_add (a, v); }
inline double atomicAdd (double *a, double v) { return __cuemu_atomic_add (a, v); }
inline int atomicSub (int *a, int v) { int o = *a; *a = o - v; return o; }
inline unsigned atomicSub (unsigned *a, unsigned v) { unsigned o = *a; *a = o - v; return o; }
template <class T> inline T __cuemu_atomic_min (T *a, T v) { T o = *a; if (v < o) *a = v; return o; }
template <class T> inline T __cuemu_atomic_max (T *a, T v) { T o = *a; if (v > o) *a = v; return o; }
inline int atomicMin (int *a, int v) { return __cuemu_atomic_min (a, v); }
inline unsigned atomicMin (unsigned *a, unsigned v) { return __cuemu_atomic_min (a, v); }
inline long long atomicMin (long long *a, long long v) { return __cuemu_atomic_min (a, v); }
inline unsigned long long atomicMin (unsigned long long *a, unsigned long long v) { return __cuemu_atomic_min (a, v); }
inline int atomicMax (int *a, int v) { return __cuemu_atomic_max (a, v); }
inline unsigned atomicMax (unsigned *a, unsigned v) { return __cuemu_atomic_max (a, v); }
inline long long atomicMax (long long *a, long long v) { return __cuemu_atomic_max (a, v); }
inline unsigned long long atomicMax (unsigned long long *a, unsigned long long v) { return __cuemu_atomic_max (a, v); }
inline int atomicExch (int *a, int v) { int o = *a; *a = v; return o; }
inline unsigned atomicExch (unsigned *a, unsigned v) { unsigned o = *a; *a = v; return o; }
inline float atomicExch (float *a, float v) { float o = *a; *a = v; return o; }
inline int atomicCAS (int *a, int cmp, int v) { int o = *a; if (o == cmp) *a = v; return o; }
inline unsigned atomicCAS (unsigned *a, unsigned cmp, unsigned v) { unsigned o = *a; if (o == cmp) *a = v; return o; }
inline unsigned long long atomicCAS (unsigned long long *a, unsigned long long cmp, unsigned long long v)
{
    unsigned long long o = *a;
    if (o == cmp) *a = v;
    return o;
}

/* ---------------------------------------------------- math, bits ---- */

template <class T> inline T __ldg (const T *p) { return *p; }
inline int __popc (unsigned x) { return __builtin_popcount (x); }
inline int __popcll (unsigned long long x) { return __builtin_popcountll (x); }
inline int __clz (int x) { return x == 0 ? 32 : __builtin_clz ((unsigned) x); }
inline int __ffs (int x) { return __builtin_ffs (x); }
inline unsigned __brev (unsigned x)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline float __uint_as_float (unsigned u) { float f; std::memcpy (&f, &u, 4); return f; }
inline unsigned __float_as_uint (float f) { unsigned u; std::memcpy (&u, &f, 4); return u; }
inline float __int_as_float (int u) { float f; std::memcpy (&f, &u, 4); return f; }
inline int __float_as_int (float f) { int u; std::memcpy (&u, &f, 4); return u; }
inline double __longlong_as_double (long long u) { double f; std::memcpy (&f, &u, 8); return f; }
inline long long __double_as_longlong (double f) { long long u; std::memcpy (&u, &f, 8); return u; }

/* Explicitly rounded operations: the empty asm keeps g++ from contracting
 * them into an FMA (possible with -mfma / -march=native). */
template <class T> inline T __cuemu_rounded (T v)
{
#if defined(__x86_64__)
    __asm__ ("" : "+x" (v));
#elif defined(__aarch64__)
    __asm__ ("" : "+w" (v));
#endif
    return v;
}
inline float __fadd_rn (float a, float b) { return __cuemu_rounded (a + b); }
inline float __fsub_rn (float a, float b) { return __cuemu_rounded (a - b); }
inline float __fmul_rn (float a, float b) { return __cuemu_rounded (a * b); }
inline float __fdiv_rn (float a, float b) { return __cuemu_rounded (a / b); }
inline float __fmaf_rn (float a, float b, float c) { return std::fma (a, b, c); }
inline double __dadd_rn (double a, double b) { return __cuemu_rounded (a + b); }
inline double __dsub_rn (double a, double b) { return __cuemu_rounded (a - b); }
inline double __dmul_rn (double a, double b) { return __cuemu_rounded (a * b); }
inline double __ddiv_rn (double a, double b) { return __cuemu_rounded (a / b); }
inline float __frcp_rn (float a) { return __cuemu_rounded (1.f / a); }
inline float __fsqrt_rn (float a) { return std::sqrt (a); }

/* The fast-math intrinsics as the accurate functions (a GPU's differ in
 * the last bits; README "Simplifications"). */
inline float rsqrtf (float x) { return 1.f / sqrtf (x); }
inline double rsqrt (double x) { return 1.0 / sqrt (x); }
inline float __expf (float x) { return expf (x); }
inline float __logf (float x) { return logf (x); }
inline float __log2f (float x) { return log2f (x); }
inline float __sinf (float x) { return sinf (x); }
inline float __cosf (float x) { return cosf (x); }
inline float __tanf (float x) { return tanf (x); }
inline float __powf (float x, float y) { return powf (x, y); }
inline float __fdividef (float x, float y) { return x / y; }
inline float __saturatef (float x) { return x != x ? 0.f : x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline void __sincosf (float x, float *s, float *c) { *s = sinf (x); *c = cosf (x); }

/* CUDA's integer min/max overloads (device functions in the global
 * namespace). */
inline int min (int a, int b) { return a < b ? a : b; }
inline int max (int a, int b) { return a > b ? a : b; }
inline unsigned min (unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max (unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min (long long a, long long b) { return a < b ? a : b; }
inline long long max (long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min (unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max (unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min (float a, float b) { return fminf (a, b); }
inline float max (float a, float b) { return fmaxf (a, b); }
inline double min (double a, double b) { return fmin (a, b); }
inline double max (double a, double b) { return fmax (a, b); }

#endif
