/* tests/unit/test_cuemu_simt.cc -- cuemu's SIMT executor (tests/cuemu/
 * simt.cc) with the runtime: small kernels, launched as prep.sh writes a
 * launch (cuemu::launch (k, cuemu::cfg (grid, block, smem, stream), ...)),
 * checked against values computed here by plain loops.  Reductions with
 * shuffles, every shuffle mode and width per the PTX rules, warp votes and
 * __match_any_sync, barriers with exited threads, multi-dimensional ids,
 * shared memory (limits, undefined at each block's start), the thread
 * order (CUEMU_ORDER), a captured launch's arguments; and the kernel bugs the executor must report
 * (cudaErrorLaunchFailure, never a hang): divergent __syncthreads, a
 * deadlock between a warp op and a barrier, a mask without the caller,
 * mismatched masks; bad configurations run nothing.  A launch failure is
 * sticky in the runtime, and CUEMU_ORDER is read once per process: each
 * Criterion test runs in its own process. */
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <cuda_runtime.h>

/* k<<<conf>>> (args): what prep.sh makes of a launch */
#define LAUNCH(k, conf, ...) cuemu::launch (k, cuemu::cfg conf.named (#k), __VA_ARGS__)

/* ------------------------------------------------------------ kernels -- */

/* Block sums of x[0..n) (grid-stride), by xor then down shuffles. */
static __global__ void k_sum (const int *x, int n, long long *out)
{
    __shared__ long long red[32];
    long long v = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync (0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads ();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync (0xffffffffu, v, o);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }
}

static __global__ void k_shfl (int *out)
{
    const int l = threadIdx.x;
    out[0 * 32 + l] = __shfl_up_sync (0xffffffffu, l, 3, 8);
    out[1 * 32 + l] = __shfl_down_sync (0xffffffffu, l, 5, 16);
    out[2 * 32 + l] = __shfl_sync (0xffffffffu, l, 35, 16);
    out[3 * 32 + l] = __shfl_xor_sync (0xffffffffu, l, 12, 8);
    out[4 * 32 + l] = (int) __match_any_sync (0xffffffffu, l % 3);
    out[5 * 32 + l] = (int) __ballot_sync (0xffffffffu, l & 1);
    out[6 * 32 + l] = __any_sync (0xffffffffu, l == 7) + 2 * __all_sync (0xffffffffu, l < 31);
    /* two halves, each its own mask and call site */
    if (l < 16) out[7 * 32 + l] = __shfl_sync (0x0000ffffu, l * 10, 15 - l);
    else out[7 * 32 + l] = __shfl_sync (0xffff0000u, l * 10, 16);
}

/* Threads >= 64 exit before the barrier: exited threads count as arrived. */
static __global__ void k_exit_early (int *x)
{
    __shared__ int s[64];
    if (threadIdx.x >= 64) return;
    s[threadIdx.x] = threadIdx.x;
    __syncthreads ();
    x[threadIdx.x] = s[63 - threadIdx.x];
}

static __global__ void k_ids (int *x)
{
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    x[b * 64 + t] = (int) (threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16 | blockIdx.x << 20 |
                           blockIdx.y << 24 | blockIdx.z << 28);
}

static __global__ void k_dyn (float *out, int *poisoned)
{
    float *d = (float *) cuemu::dyn_smem ();
    if (threadIdx.x == 0) *poisoned = d[blockDim.x] != d[blockDim.x];   /* NaN: never written */
    d[threadIdx.x] = (float) threadIdx.x;
    __syncthreads ();
    out[threadIdx.x] = d[blockDim.x - 1 - threadIdx.x];
}

static __global__ void k_divergent (int *x)
{
    if (threadIdx.x < 16) __syncthreads ();
    else __syncthreads ();
    x[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

static __global__ void k_deadlock (int *x)
{
    if ((threadIdx.x & 31) < 16) __syncwarp ();
    else __syncthreads ();
    x[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

static __global__ void k_badmask (int *x)
{
    x[threadIdx.x] = __shfl_sync (0x1u, (int) threadIdx.x, 0);
}

static __global__ void k_masks (int *x)
{
    /* lanes 0-15 name the whole warp, lanes 16-31 only their half */
    const unsigned m = threadIdx.x < 16 ? 0xffffffffu : 0xffff0000u;
    x[threadIdx.x] = __shfl_sync (m, (int) threadIdx.x, 0);
}

static __global__ void k_add (int *x, int v)
{
    x[threadIdx.x] += v;
}

/* Reads shared memory nobody wrote in this block, then writes it. */
static __global__ void k_stale (int *out)
{
    __shared__ int s[8]; cuemu::shared_decl (&s, sizeof s);   /* as prep.sh writes it */
    if (threadIdx.x == 0) {
        out[blockIdx.x] = s[5];
        s[5] = 42;
    }
}

/* A missing barrier: thread t reads what thread t + 1 writes. */
static __global__ void k_racy (int *x, int *out)
{
    x[threadIdx.x] = threadIdx.x;
    out[threadIdx.x] = x[(threadIdx.x + 1) % blockDim.x];
}

/* -------------------------------------------------------------- tests -- */

/* What the process wrote to stderr (a test with .init = cr_redirect_stderr):
 * the runtime prints each launch error as one "cuemu: ..." line. */
static std::string s_stderr ()
{
    fflush (stderr);
    FILE *f = cr_get_redirected_stderr ();
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread (buf, 1, sizeof buf, f)) > 0) out.append (buf, n);
    return out;
}

static void s_has (const std::string &text, const char *want)
{
    cr_assert (text.find (want) != std::string::npos, "message lacks \"%s\": %s", want, text.c_str ());
}

Test (cuemu_simt, shuffle_reduction_is_the_sum)
{
    static int x[100000];
    long long ref = 0;
    for (int i = 0; i < 100000; i++) {
        x[i] = i * 7 - 50000;
        ref += x[i];
    }
    long long part[5] = { 0 };
    LAUNCH (k_sum, (5, 1024), x, 100000, part);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    cr_assert_eq (part[0] + part[1] + part[2] + part[3] + part[4], ref);
    long long one = 0;
    LAUNCH (k_sum, (1, 64), x, 1000, &one);
    long long r1 = 0;
    for (int i = 0; i < 1000; i++) r1 += x[i];
    cr_assert_eq (one, r1);
}

Test (cuemu_simt, shuffle_modes_widths_votes_match)
{
    int o[8 * 32];
    LAUNCH (k_shfl, (1, 32), o);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    for (int l = 0; l < 32; l++) {
        /* up 3, width 8: lanes below their segment's start + 3 keep their own */
        cr_assert_eq (o[l], l % 8 >= 3 ? l - 3 : l, "up lane %d", l);
        cr_assert_eq (o[32 + l], l % 16 + 5 < 16 ? l + 5 : l, "down lane %d", l);
        /* idx 35, width 16: lane 35 % 16 = 3 of the caller's segment */
        cr_assert_eq (o[64 + l], (l & 16) + 3, "idx lane %d", l);
        /* xor 12, width 8: a later segment is not readable (own value) */
        cr_assert_eq (o[96 + l], (l ^ 12) / 8 <= l / 8 ? (l ^ 12) : l, "xor lane %d", l);
        unsigned mm = 0;
        for (int j = 0; j < 32; j++)
            if (j % 3 == l % 3) mm |= 1u << j;
        cr_assert_eq ((unsigned) o[128 + l], mm, "match_any lane %d", l);
        cr_assert_eq ((unsigned) o[160 + l], 0xaaaaaaaau, "ballot");
        cr_assert_eq (o[192 + l], 1, "any yes, all no");
        cr_assert_eq (o[224 + l], l < 16 ? (15 - l) * 10 : 160, "half-warp masks lane %d", l);
    }
}

Test (cuemu_simt, exited_threads_count_as_arrived)
{
    int x[256];
    memset (x, 0, sizeof x);
    LAUNCH (k_exit_early, (1, 256), x);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    for (int i = 0; i < 64; i++) cr_assert_eq (x[i], 63 - i);
    cr_assert_eq (x[64], 0);
}

Test (cuemu_simt, multi_dimensional_ids)
{
    static int x[64 * 24];
    LAUNCH (k_ids, (dim3 (2, 3, 4), dim3 (8, 4, 2)), x);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    for (int bz = 0; bz < 4; bz++)
        for (int by = 0; by < 3; by++)
            for (int bx = 0; bx < 2; bx++)
                for (int tz = 0; tz < 2; tz++)
                    for (int ty = 0; ty < 4; ty++)
                        for (int tx = 0; tx < 8; tx++) {
                            const int b = bx + 2 * (by + 3 * bz), t = tx + 8 * (ty + 4 * tz);
                            cr_assert_eq (x[b * 64 + t], tx | ty << 8 | tz << 16 | bx << 20 |
                                                              by << 24 | bz << 28);
                        }
}

Test (cuemu_simt, dynamic_shared_memory_limit_and_poison)
{
    float out[256];
    int poisoned = 0;
    LAUNCH (k_dyn, (1, 256, 49 * 1024), out, &poisoned);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidValue, "over 48 KiB without the attribute");
    cr_assert_eq (cudaFuncSetAttribute (k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
                  cudaSuccess);
    LAUNCH (k_dyn, (2, 256, 49 * 1024), out, &poisoned);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    for (int i = 0; i < 256; i++) cr_assert_eq (out[i], (float) (255 - i));
    cr_assert_eq (poisoned, 1, "shared memory starts undefined (NaN), not zero");
}

Test (cuemu_simt, shared_memory_is_undefined_at_each_block_start)
{
    int out[3] = { 0, 0, 0 };
    LAUNCH (k_stale, (3, 32), out);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    for (int b = 0; b < 3; b++) cr_assert_eq (out[b], -1, "block %d sees 0xff bytes, not 0 or 42", b);
}

Test (cuemu_simt, bad_configurations_run_nothing)
{
    int x[1] = { 5 };
    LAUNCH (k_add, (1, 0), x, 1);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidConfiguration);
    LAUNCH (k_add, (1, 1025), x, 1);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidConfiguration);
    LAUNCH (k_add, (dim3 (1), dim3 (1, 1, 65)), x, 1);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidConfiguration);
    LAUNCH (k_add, (0, 1), x, 1);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidConfiguration);
    LAUNCH (k_add, (dim3 (1, 65536), 1), x, 1);
    cr_assert_eq (cudaGetLastError (), cudaErrorInvalidConfiguration);
    cr_assert_eq (x[0], 5);
    LAUNCH (k_add, (1, 1), x, 1);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
    cr_assert_eq (x[0], 6);
}

/* A captured launch replays with the argument values of the capture. */
Test (cuemu_simt, captured_launch_replays_its_arguments)
{
    int *x = nullptr;
    cr_assert_eq (cudaMalloc ((void **) &x, 32 * sizeof (int)), cudaSuccess);
    cr_assert_eq (cudaMemset (x, 0, 32 * sizeof (int)), cudaSuccess);
    cudaStream_t st = nullptr;
    cr_assert_eq (cudaStreamCreateWithFlags (&st, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq (cudaStreamBeginCapture (st, cudaStreamCaptureModeRelaxed), cudaSuccess);
    int v = 3;
    LAUNCH (k_add, (1, 32, 0, st), x, v);
    v = 100;
    cudaGraph_t gr = nullptr;
    cr_assert_eq (cudaStreamEndCapture (st, &gr), cudaSuccess);
    cr_assert_eq (x[0], 0, "not run while capturing");
    cudaGraphExec_t ex = nullptr;
    cr_assert_eq (cudaGraphInstantiate (&ex, gr, 0), cudaSuccess);
    cr_assert_eq (cudaGraphLaunch (ex, st), cudaSuccess);
    cr_assert_eq (cudaGraphLaunch (ex, st), cudaSuccess);
    cr_assert_eq (cudaStreamSynchronize (st), cudaSuccess);
    for (int i = 0; i < 32; i++) cr_assert_eq (x[i], 6);
    cudaGraphExecDestroy (ex);
    cudaGraphDestroy (gr);
    cudaStreamDestroy (st);
    cudaFree (x);
}

Test (cuemu_simt, divergent_syncthreads_is_reported, .init = cr_redirect_stderr)
{
    static int x[128];
    LAUNCH (k_divergent, (2, 64), x);
    cr_assert_eq (cudaGetLastError (), cudaErrorLaunchFailure);
    for (int i = 0; i < 128; i++) cr_assert_eq (x[i], 0, "the grid is abandoned");
    const std::string e = s_stderr ();
    s_has (e, "kernel k_divergent: block (0,0,0)");
    s_has (e, "divergent __syncthreads");
    s_has (e, "threads 0-15 wait at __syncthreads (test_cuemu_simt.cc:");
}

Test (cuemu_simt, warp_op_vs_barrier_deadlock_is_reported, .init = cr_redirect_stderr)
{
    static int x[128];
    LAUNCH (k_deadlock, (2, 64), x);
    cr_assert_eq (cudaGetLastError (), cudaErrorLaunchFailure);
    for (int i = 0; i < 128; i++) cr_assert_eq (x[i], 0);
    const std::string e = s_stderr ();
    s_has (e, "kernel k_deadlock: block (0,0,0)");
    s_has (e, "deadlock");
    s_has (e, "threads 0-15 wait at __syncwarp");
    s_has (e, "threads 16-31 wait at __syncthreads");
}

Test (cuemu_simt, mask_without_the_caller_is_reported, .init = cr_redirect_stderr)
{
    int x[32] = { 0 };
    LAUNCH (k_badmask, (1, 32), x);
    cr_assert_eq (cudaGetLastError (), cudaErrorLaunchFailure);
    s_has (s_stderr (), "thread 1 calls __shfl_sync (test_cuemu_simt.cc:");
}

Test (cuemu_simt, different_masks_at_one_op_are_reported, .init = cr_redirect_stderr)
{
    int x[32] = { 0 };
    LAUNCH (k_masks, (1, 32), x);
    cr_assert_eq (cudaGetLastError (), cudaErrorLaunchFailure);
    s_has (s_stderr (), "with different masks");
}

/* Threads run in order (0 first) until they block; CUEMU_ORDER=reverse
 * runs the highest first, so each order exposes one side of a missing
 * barrier. */
static void s_racy (int *out)
{
    int x[64];
    for (int i = 0; i < 64; i++) x[i] = -1;
    LAUNCH (k_racy, (1, 64), x, out);
    cr_assert_eq (cudaGetLastError (), cudaSuccess);
}

Test (cuemu_simt, forward_order_shows_a_read_before_a_later_write)
{
    unsetenv ("CUEMU_ORDER");
    int out[64];
    s_racy (out);
    cr_assert_eq (out[0], -1, "thread 1 has not run when thread 0 reads");
    cr_assert_eq (out[63], 0);
}

Test (cuemu_simt, reverse_order_shows_a_read_before_an_earlier_write)
{
    setenv ("CUEMU_ORDER", "reverse", 1);
    int out[64];
    s_racy (out);
    cr_assert_eq (out[0], 1);
    cr_assert_eq (out[63], -1, "thread 0 runs last");
}
