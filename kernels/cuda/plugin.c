/* kernels/cuda/plugin.c -- kernels-cuda: the descriptor, the ops table, the
 * instance (device, streams, memory pool, cuBLAS, graphs, weights) and the
 * argument checks of every op.  Kernels live in kernels.cu; launch plans in
 * plan.c; graph bookkeeping in graphs.c; the device memory pool in
 * mempool.c.
 *
 * Every CUDA / cuBLAS call is checked: a failure is RX_EDEVICE (RX_ENOMEM
 * for an allocation) with the op, the call and the library's error string
 * in one line.  Asynchronous errors surface at synchronize().
 *
 * One process drives one device (one scheduler rank per GPU): create()
 * selects params->device with cudaSetDevice and the instance assumes it
 * stays current on the thread that drives it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <radix/kernel.h>
#include <radix/plugin.h>

#include "cu_math.h"
#include "graphs.h"
#include "kernels.h"
#include "mempool.h"
#include "plan.h"
#include "../moe_ll_args.h"
#include "prof.h"

#define S_VERSION "0.1.0"
#define S_STREAM_MAGIC 0x6d727443u
#define S_WEIGHT_MAGIC 0x7457434bu
#define S_CUBLAS_WS (32u << 20)
#define S_PROF_RING 1024           /* op event pairs between two profile flushes */

struct rx_kstream {
    uint32_t magic;
    cudaStream_t st;
};

struct rx_kweight {
    uint32_t magic;
    int dtype;
    uint32_t n_dims;
    uint64_t ne[4];
    size_t row_bytes;
    void *d;                       /* device copy of the GGML bytes */
    struct rx_kweight *prev, *next;
};

/* One profiled op: events around it on its stream. */
struct s_pev {
    cudaEvent_t a, b;
    char name[40];
};

struct s_cuda {
    const struct rx_host *host;
    int device;
    char dev_name[96];
    uint64_t mem_bytes;
    int n_devices;
    struct rx_kstream dflt;        /* the NULL stream of the ABI: a real stream
                                    * (the legacy stream cannot be captured) */
    cublasHandle_t blas;
    void *blas_ws;
    rx_cumem_t *mem;
    rx_cugraphs_t *graphs;
    cudaGraph_t cap_graph;         /* unused between captures */
    struct rx_kweight *weights;
    size_t mv_rows;                /* [kernels.cuda] matvec_max_rows */
    int fast_mv;                   /* [kernels.cuda] matvec = fast */
    int attn_tiled;                /* [kernels.cuda] attention = tiled */
    int attn_splits;               /* [kernels.cuda] attention_splits: plan.h setting */
    int n_sm;                      /* the device's multiprocessors (split count) */
    int half_gemm;                 /* [kernels.cuda] gemm_activations = half */
    struct rx_cuprof *prof;        /* [kernels.cuda] profile: NULL when off */
    struct s_pev *pev;             /* S_PROF_RING pairs, events created lazily */
    size_t n_pev;
    void *scratch;                 /* matmul GEMM scratch (pool memory) */
    size_t scratch_cap;
    void *attn_part;               /* split attention partials (pool memory) */
    size_t attn_part_cap;
    void **retired;                /* old scratch a captured graph may still use */
    size_t n_retired;
};

/* ----------------------------------------------------------------- keys -- */

static const struct rx_cfg_key s_keys[] = {
    { "matvec_max_rows", RX_CFG_INT, "4",
      "activation rows up to which matmul uses the fused dequant matvec kernel (above: cuBLAS)",
      1, 64, NULL },
    { "graphs", RX_CFG_INT, "64", "captured CUDA graphs kept (least recently launched evicted)",
      1, 4096, NULL },
    { "chunk_mb", RX_CFG_INT, "64", "device memory pool chunk size in MiB (cudaMalloc unit)",
      2, 65536, NULL },
    { "matvec", RX_CFG_ENUM, "simple",
      "matvec kernel for up to matvec_max_rows rows: simple (byte loads, verified on an H200) or "
      "fast (coalesced 16-byte loads; not yet run on a GPU, see docs/gpu.md)", 0, 0, "simple|fast" },
    { "attention", RX_CFG_ENUM, "simple",
      "attention kernel: simple (a block per query row and head, verified on an H200) or tiled "
      "(query tiles share K/V tiles in shared memory; not yet run on a GPU, see docs/gpu.md)", 0, 0,
      "simple|tiled" },
    { "attention_splits", RX_CFG_STRING, "0",
      "split-K decode attention for the simple kernel's batches: 0 = off (one block per query "
      "row and head, verified on an H200), auto (enough blocks to fill the GPU twice), or a fixed "
      "count 1..64 of blocks sharing each row's keys (not yet run on a GPU, see docs/gpu.md)", 0, 0,
      NULL },
    { "gemm_activations", RX_CFG_ENUM, "f32",
      "GEMM path (more than matvec_max_rows rows): f32 keeps kernels-cpu's numerics (F16/BF16 "
      "weights: activations split in 2-3 half parts, one GEMM each; quantized: F32 GEMM) or half "
      "(one tensor-core pass with activations rounded to F16/BF16, as GPU engines run; misses the "
      "reference-model tolerances)", 0, 0, "f32|half" },
    { "profile", RX_CFG_BOOL, "false",
      "time every op with CUDA events and log a per-op table when the backend is destroyed "
      "(also RADIX_KCUDA_PROFILE=1; adds a little overhead per op)", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

/* ------------------------------------------------------------- helpers -- */

static int s_cuerr (struct rx_err *err, cudaError_t ce, const char *op, const char *call)
{
    return rx_err_set (err, ce == cudaErrorMemoryAllocation ? RX_ENOMEM : RX_EDEVICE,
                       "kernels-cuda %s: %s: %s", op, call, cudaGetErrorString (ce));
}

static const char *s_blas_str (cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

static int s_blaserr (struct rx_err *err, cublasStatus_t st, const char *op, const char *call)
{
    return rx_err_set (err, st == CUBLAS_STATUS_ALLOC_FAILED ? RX_ENOMEM : RX_EDEVICE,
                       "kernels-cuda %s: %s: %s (%d)", op, call, s_blas_str (st), (int) st);
}

#define S_CU(call, op)                                                          \
    do {                                                                        \
        cudaError_t ce_ = (call);                                               \
        if (ce_ != cudaSuccess) return s_cuerr (err, ce_, op, #call);           \
    } while (0)

/* A kernel launcher's status (kernels.h). */
#define S_LAUNCH(call, op)                                                      \
    do {                                                                        \
        int lrc_ = (call);                                                      \
        if (lrc_ != 0) return s_cuerr (err, (cudaError_t) lrc_, op, "kernel launch"); \
    } while (0)

static int s_chunk_alloc (void *ctx, size_t bytes, void **base, struct rx_err *err)
{
    (void) ctx;
    cudaError_t ce = cudaMalloc (base, bytes);
    if (ce != cudaSuccess) {
        (void) cudaGetLastError ();   /* clear the sticky-free error state */
        return rx_err_set (err, ce == cudaErrorMemoryAllocation ? RX_ENOMEM : RX_EDEVICE,
                           "kernels-cuda alloc: cudaMalloc (%zu bytes): %s", bytes,
                           cudaGetErrorString (ce));
    }
    return RX_OK;
}

static void s_chunk_free (void *ctx, void *base)
{
    (void) ctx;
    cudaFree (base);
}

static void s_graph_free (void *ctx, void *exec)
{
    (void) ctx;
    cudaGraphExecDestroy ((cudaGraphExec_t) exec);
}

static int64_t s_cfg_int (const struct rx_host *h, const char *key, int64_t dflt)
{
    int64_t v = dflt;
    if (!h || !h->cfg_int || h->cfg_int (h, key, &v) != RX_OK) v = dflt;
    return v;
}

static const char *s_cfg_str (const struct rx_host *h, const char *key, const char *dflt)
{
    const char *v = NULL;
    if (!h || !h->cfg_str || h->cfg_str (h, key, &v) != RX_OK || !v) v = dflt;
    return v;
}

static int s_cfg_bool (const struct rx_host *h, const char *key, int dflt)
{
    int v = dflt;
    if (!h || !h->cfg_bool || h->cfg_bool (h, key, &v) != RX_OK) v = dflt;
    return v;
}

/* The stream of an op: NULL = the instance's default stream. */
static cudaStream_t s_st (struct s_cuda *c, rx_kstream_t *s) { return s ? s->st : c->dflt.st; }

/* ------------------------------------------------------------- profiler -- */

/* Every recorded pair is complete once its last event is: add them up. */
static void s_prof_flush (struct s_cuda *c)
{
    if (!c->prof || c->n_pev == 0) return;
    if (cudaEventSynchronize (c->pev[c->n_pev - 1].b) == cudaSuccess) {
        for (size_t i = 0; i < c->n_pev; i++) {
            float ms = 0.f;
            if (cudaEventElapsedTime (&ms, c->pev[i].a, c->pev[i].b) == cudaSuccess)
                rx_cuprof_add (c->prof, c->pev[i].name, (double) ms);
        }
    }
    (void) cudaGetLastError ();
    c->n_pev = 0;
}

/* An op's profile scope: S_BEGIN declares one with the cleanup attribute,
 * so s_prof_end records the closing event at every return of the op. */
struct s_pscope {
    struct s_cuda *c;
    cudaStream_t st;
    struct s_pev *ev;
};

static struct s_pscope s_prof_begin (struct s_cuda *c, cudaStream_t st, const char *name)
{
    struct s_pscope ps = { 0 };
    if (!c->prof) return ps;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing (st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        (void) cudaGetLastError ();
        return ps;   /* events in a capture would become graph nodes */
    }
    if (c->n_pev == S_PROF_RING) s_prof_flush (c);
    struct s_pev *e = &c->pev[c->n_pev];
    if ((!e->a && cudaEventCreate (&e->a) != cudaSuccess) ||
        (!e->b && cudaEventCreate (&e->b) != cudaSuccess) || cudaEventRecord (e->a, st) != cudaSuccess) {
        (void) cudaGetLastError ();
        return ps;
    }
    snprintf (e->name, sizeof e->name, "%s", name);
    ps.c = c;
    ps.st = st;
    ps.ev = e;
    return ps;
}

static void s_prof_end (struct s_pscope *ps)
{
    if (!ps->c) return;
    if (cudaEventRecord (ps->ev->b, ps->st) == cudaSuccess) ps->c->n_pev++;
    else (void) cudaGetLastError ();
}

/* Renames the op being timed (matmul: by path and weight type). */
static void s_prof_name (struct s_pscope *ps, const char *name)
{
    if (ps->c) snprintf (ps->ev->name, sizeof ps->ev->name, "%s", name);
}

static void s_prof_report (struct s_cuda *c)
{
    if (!c->prof) return;
    s_prof_flush (c);
    size_t need = rx_cuprof_report (c->prof, NULL, 0) + 1;
    char *txt = malloc (need);
    if (txt) {
        rx_cuprof_report (c->prof, txt, need);
        /* One log line per op; stderr as well, as radix bench prints there. */
        for (char *l = txt, *nl; *l; l = nl + 1) {
            if (!(nl = strchr (l, '\n'))) break;
            *nl = 0;
            RX_HLOG (c->host, RX_LOG_INFO, "%s", l + strlen ("kernels-cuda "));
        }
        free (txt);
    }
}

/* ------------------------------------------------------------- instance -- */

static void s_destroy (void *be);

static int s_create (const struct rx_host *host, const struct rx_kernels_params *p, void **be,
                     struct rx_err *err)
{
    if (!be) return rx_err_set (err, RX_EINVAL, "kernels-cuda create: be is NULL");
    *be = NULL;
    if (p && p->struct_size < offsetof (struct rx_kernels_params, device) + sizeof (int32_t))
        return rx_err_set (err, RX_EABI, "kernels-cuda create: params struct_size %u too "
                           "small", p->struct_size);
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount (&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        (void) cudaGetLastError ();
        return rx_err_set (err, RX_EDEVICE, "kernels-cuda create: no CUDA device "
                           "(cudaGetDeviceCount: %s)",
                           ce != cudaSuccess ? cudaGetErrorString (ce) : "0 devices");
    }
    /* device = auto: the scheduler rank's index modulo the device count. */
    int device = rx_kernels_pick_device (p, ndev);
    if (device < 0 || device >= ndev)
        return rx_err_set (err, RX_EDEVICE, "kernels-cuda create: device %d does not exist "
                           "(%d CUDA devices)", device, ndev);
    S_CU (cudaSetDevice (device), "create");

    struct s_cuda *c = calloc (1, sizeof *c);
    if (!c) return rx_err_set (err, RX_ENOMEM, "kernels-cuda create: out of memory");
    c->host = host;
    c->device = device;
    c->n_devices = ndev;
    c->dflt.magic = S_STREAM_MAGIC;
    c->mv_rows = (size_t) s_cfg_int (host, "matvec_max_rows", 4);
    int rc = RX_OK;
    c->fast_mv = !strcmp (s_cfg_str (host, "matvec", "simple"), "fast");
    c->attn_tiled = !strcmp (s_cfg_str (host, "attention", "simple"), "tiled");
    const char *splits = s_cfg_str (host, "attention_splits", "0");
    if ((rc = rx_cuplan_attn_splits_parse (splits, &c->attn_splits, err)) != RX_OK) goto fail;
    c->half_gemm = !strcmp (s_cfg_str (host, "gemm_activations", "f32"), "half");
    const char *penv = getenv ("RADIX_KCUDA_PROFILE");
    if (s_cfg_bool (host, "profile", 0) || (penv && *penv && strcmp (penv, "0"))) {
        if (!(c->prof = calloc (1, sizeof *c->prof)) ||
            !(c->pev = calloc (S_PROF_RING, sizeof *c->pev))) {
            rc = rx_err_set (err, RX_ENOMEM, "kernels-cuda create: out of memory");
            goto fail;
        }
    }
    struct cudaDeviceProp prop;
    if ((ce = cudaGetDeviceProperties (&prop, device)) != cudaSuccess) {
        rc = s_cuerr (err, ce, "create", "cudaGetDeviceProperties");
        goto fail;
    }
    snprintf (c->dev_name, sizeof c->dev_name, "%.80s (sm_%d%d)", prop.name, prop.major, prop.minor);
    c->mem_bytes = prop.totalGlobalMem;
    c->n_sm = prop.multiProcessorCount;
    if ((ce = cudaStreamCreateWithFlags (&c->dflt.st, cudaStreamNonBlocking)) != cudaSuccess) {
        rc = s_cuerr (err, ce, "create", "cudaStreamCreateWithFlags");
        goto fail;
    }
    struct rx_cumem_cfg mc = { .chunk_bytes = (size_t) s_cfg_int (host, "chunk_mb", 64) << 20 };
    if (!(c->mem = rx_cumem_new (&mc, s_chunk_alloc, s_chunk_free, c, err))) {
        rc = err ? err->code : RX_ENOMEM;
        goto fail;
    }
    if (!(c->graphs = rx_cugraphs_new ((size_t) s_cfg_int (host, "graphs", 64), s_graph_free, c,
                                       err))) {
        rc = err ? err->code : RX_ENOMEM;
        goto fail;
    }
    cublasStatus_t bs = cublasCreate (&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        rc = s_blaserr (err, bs, "create", "cublasCreate");
        goto fail;
    }
    /* A workspace of our own makes cuBLAS calls capturable in graphs. */
    if ((rc = rx_cumem_alloc (c->mem, S_CUBLAS_WS, 256, &c->blas_ws, err)) != RX_OK) goto fail;
    if ((bs = cublasSetWorkspace (c->blas, c->blas_ws, S_CUBLAS_WS)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetStream (c->blas, c->dflt.st)) != CUBLAS_STATUS_SUCCESS) {
        rc = s_blaserr (err, bs, "create", "cublasSetWorkspace/SetStream");
        goto fail;
    }
    char split_txt[24];
    if (c->attn_splits == RX_CU_ATTN_SPLITS_AUTO) snprintf (split_txt, sizeof split_txt, "auto");
    else if (c->attn_splits == 0) snprintf (split_txt, sizeof split_txt, "off");
    else snprintf (split_txt, sizeof split_txt, "%d", c->attn_splits);
    RX_HLOG (host, RX_LOG_INFO, "device %d: %s, %.1f GiB, %d SMs, matvec up to %zu rows (%s), "
             "attention %s (splits %s), gemm activations %s%s", device, c->dev_name,
             (double) c->mem_bytes / (1u << 30), c->n_sm, c->mv_rows,
             c->fast_mv ? "fast" : "simple", c->attn_tiled ? "tiled" : "simple", split_txt,
             c->half_gemm ? "half" : "f32",
             c->prof ? ", profiling every op" : "");
    *be = c;
    return RX_OK;
fail:
    s_destroy (c);
    return rc;
}

static void s_weight_release (struct s_cuda *c, struct rx_kweight *w)
{
    if (w->prev) w->prev->next = w->next; else c->weights = w->next;
    if (w->next) w->next->prev = w->prev;
    if (w->d) rx_cumem_free (c->mem, w->d);
    w->magic = 0;
    free (w);
}

static void s_destroy (void *be)
{
    struct s_cuda *c = be;
    if (!c) return;
    if (c->dflt.st) cudaStreamSynchronize (c->dflt.st);
    s_prof_report (c);
    if (c->pev)
        for (size_t i = 0; i < S_PROF_RING; i++) {
            if (c->pev[i].a) cudaEventDestroy (c->pev[i].a);
            if (c->pev[i].b) cudaEventDestroy (c->pev[i].b);
        }
    free (c->pev);
    free (c->prof);
    rx_cugraphs_destroy (&c->graphs);
    if (c->cap_graph) cudaGraphDestroy (c->cap_graph);
    while (c->weights) s_weight_release (c, c->weights);
    if (c->blas) cublasDestroy (c->blas);
    free (c->retired);
    rx_cumem_destroy (&c->mem);   /* every chunk: buffers, weights, scratch */
    if (c->dflt.st) cudaStreamDestroy (c->dflt.st);
    free (c);
}

static int s_info (void *be, struct rx_kernels_info *info)
{
    struct s_cuda *c = be;
    if (!c || !info || info->struct_size < offsetof (struct rx_kernels_info, threads))
        return RX_EINVAL;
    info->name = "cuda";
    snprintf (info->device, sizeof info->device, "%s", c->dev_name);
    info->mem_bytes = c->mem_bytes;
    info->caps = RX_KCAP_GRAPHS | RX_KCAP_ASYNC | RX_KCAP_KV_F16 | RX_KCAP_WEIGHT_COPY;   /* weight_load: cudaMemcpy */
    if (info->struct_size >= offsetof (struct rx_kernels_info, threads) + sizeof (int32_t))
        info->threads = 0;
    if (info->struct_size >= offsetof (struct rx_kernels_info, device_index) + sizeof (int32_t)) {
        /* Free memory of our device (the calling thread may have another
         * current): the engine sizes a fractional [cache] kv_memory from it.
         * Memory our pool holds but has not handed out counts as used. */
        size_t fr = 0, tot = 0;
        if (cudaSetDevice (c->device) != cudaSuccess || cudaMemGetInfo (&fr, &tot) != cudaSuccess) {
            (void) cudaGetLastError ();
            fr = 0;
        }
        info->mem_free = fr;
        info->n_devices = c->n_devices;
        info->device_index = c->device;
    }
    return RX_OK;
}

/* --------------------------------------------------------------- memory -- */

static int s_alloc (void *be, size_t bytes, size_t align, void **dptr, struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c || !dptr) return rx_err_set (err, RX_EINVAL, "kernels-cuda alloc: NULL argument");
    return rx_cumem_alloc (c->mem, bytes, align, dptr, err);
}

/* Captured graphs hold raw device pointers: once memory is given back they
 * may read freed memory, so every graph is dropped (the runner captures
 * again; buffers are normally allocated once, before any capture). */
static void s_invalidate_graphs (struct s_cuda *c)
{
    if (rx_cugraphs_count (c->graphs) == 0) return;
    cudaStreamSynchronize (c->dflt.st);
    rx_cugraphs_clear (c->graphs);
}

static void s_free (void *be, void *dptr)
{
    struct s_cuda *c = be;
    if (!c || !dptr) return;
    s_invalidate_graphs (c);
    if (rx_cumem_free (c->mem, dptr) != RX_OK)
        RX_HLOG (c->host, RX_LOG_ERROR, "free: %p was not allocated here; ignored", dptr);
}

static int s_stream_ok (rx_kstream_t *s) { return !s || s->magic == S_STREAM_MAGIC; }

static int s_copy (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                   enum cudaMemcpyKind kind, const char *what, struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: no backend", what);
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: bad stream", what);
    if (bytes == 0) return RX_OK;
    if (!dst || !src) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: NULL pointer", what);
    S_CU (cudaMemcpyAsync (dst, src, bytes, kind, s_st (c, s)), what);
    return RX_OK;
}

static int s_copy_h2d (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                       struct rx_err *err)
{
    return s_copy (be, s, dst, src, bytes, cudaMemcpyHostToDevice, "copy_h2d", err);
}

static int s_copy_d2h (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                       struct rx_err *err)
{
    return s_copy (be, s, dst, src, bytes, cudaMemcpyDeviceToHost, "copy_d2h", err);
}

static int s_copy_d2d (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                       struct rx_err *err)
{
    return s_copy (be, s, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy_d2d", err);
}

static int s_memset (void *be, rx_kstream_t *s, void *dst, int byte, size_t bytes,
                     struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda memset: no backend");
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda memset: bad stream");
    if (bytes == 0) return RX_OK;
    if (!dst) return rx_err_set (err, RX_EINVAL, "kernels-cuda memset: NULL pointer");
    S_CU (cudaMemsetAsync (dst, byte, bytes, s_st (c, s)), "memset");
    return RX_OK;
}

/* ------------------------------------------------------ streams, graphs -- */

static int s_stream_create (void *be, rx_kstream_t **s, struct rx_err *err)
{
    if (!be || !s) return rx_err_set (err, RX_EINVAL, "kernels-cuda stream_create: NULL argument");
    *s = calloc (1, sizeof **s);
    if (!*s) return rx_err_set (err, RX_ENOMEM, "kernels-cuda stream_create: out of memory");
    cudaError_t ce = cudaStreamCreateWithFlags (&(*s)->st, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        free (*s);
        *s = NULL;
        return s_cuerr (err, ce, "stream_create", "cudaStreamCreateWithFlags");
    }
    (*s)->magic = S_STREAM_MAGIC;
    return RX_OK;
}

static void s_stream_destroy (void *be, rx_kstream_t *s)
{
    (void) be;
    if (!s || s->magic != S_STREAM_MAGIC) return;
    cudaStreamSynchronize (s->st);
    cudaStreamDestroy (s->st);
    s->magic = 0;
    free (s);
}

static int s_synchronize (void *be, rx_kstream_t *s, struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda synchronize: no backend");
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda synchronize: bad stream");
    S_CU (cudaStreamSynchronize (s_st (c, s)), "synchronize");
    if (c->prof) {
        c->prof->syncs++;
        s_prof_flush (c);
    }
    return RX_OK;
}

static int s_graph_begin (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_begin: no backend");
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_begin: bad stream");
    int rc = rx_cugraphs_begin (c->graphs, key, err);
    if (rc != RX_OK) return rc;
    /* Relaxed: the first eager-size matmul of a capture may grow scratch
     * with cudaMalloc, which the stricter modes forbid. */
    cudaError_t ce = cudaStreamBeginCapture (s_st (c, s), cudaStreamCaptureModeRelaxed);
    if (ce != cudaSuccess) {
        rx_cugraphs_abort (c->graphs);
        return s_cuerr (err, ce, "graph_begin", "cudaStreamBeginCapture");
    }
    return RX_OK;
}

static int s_graph_end (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_end: no backend");
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_end: bad stream");
    uint64_t running;
    if (!rx_cugraphs_capturing (c->graphs, &running) || running != key)
        return rx_cugraphs_end (c->graphs, key, NULL, err);   /* fills the message */
    cudaGraph_t graph = NULL;
    cudaError_t ce = cudaStreamEndCapture (s_st (c, s), &graph);
    if (ce != cudaSuccess) {
        rx_cugraphs_abort (c->graphs);
        if (graph) cudaGraphDestroy (graph);
        return s_cuerr (err, ce, "graph_end", "cudaStreamEndCapture");
    }
    cudaGraphExec_t exec = NULL;
    ce = cudaGraphInstantiate (&exec, graph, 0);
    cudaGraphDestroy (graph);
    if (ce != cudaSuccess) {
        rx_cugraphs_abort (c->graphs);
        return s_cuerr (err, ce, "graph_end", "cudaGraphInstantiate");
    }
    return rx_cugraphs_end (c->graphs, key, (void *) exec, err);
}

static int s_graph_launch (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_launch: no backend");
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_launch: bad stream");
    void *exec = rx_cugraphs_get (c->graphs, key);
    if (!exec)
        return rx_err_set (err, RX_ENOENT, "kernels-cuda graph_launch: graph %llu was not "
                           "captured (or was evicted/invalidated): capture it again",
                           (unsigned long long) key);
    S_CU (cudaGraphLaunch ((cudaGraphExec_t) exec, s_st (c, s)), "graph_launch");
    return RX_OK;
}

static int s_graph_has (void *be, uint64_t key)
{
    struct s_cuda *c = be;
    return c && rx_cugraphs_has (c->graphs, key);
}

/* -------------------------------------------------------------- weights -- */

static int s_weight_ok (const struct rx_kweight *w) { return w && w->magic == S_WEIGHT_MAGIC; }

static int s_weight_load (void *be, const struct rx_weight_view *v, rx_kweight_t **out,
                          struct rx_err *err)
{
    struct s_cuda *c = be;
    if (!c || !v || !out) return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: NULL argument");
    *out = NULL;
    const char *name = v->name ? v->name : "(unnamed)";
    if (rx_cu_blk_elems (v->dtype) == 0)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda weight_load: %s: dtype %s (%d) is not "
                           "supported (f32 f16 bf16 q8_0 q4_0 q4_1 q4_K q5_K q6_K)", name,
                           rx_dtype_name (v->dtype), v->dtype);
    if (v->n_dims < 1 || v->n_dims > 4)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: %s: n_dims %u (1..4)",
                           name, v->n_dims);
    uint64_t n_el = 1;
    for (int i = 0; i < 4; i++) {
        if (v->ne[i] == 0 || v->ne[i] > (1ull << 40) || (i >= (int) v->n_dims && v->ne[i] != 1))
            return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: %s: bad ne[%d] = %llu",
                               name, i, (unsigned long long) v->ne[i]);
        if (n_el > UINT64_MAX / v->ne[i])
            return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: %s: too many elements",
                               name);
        n_el *= v->ne[i];
    }
    /* Quantized rows are decoded in 32-element chunks and must hold whole
     * ones; F32/F16/BF16 take any length (norm weights, biases, routing
     * bias), though matmul needs in % 32 == 0. */
    const int plain = v->dtype == RX_F32 || v->dtype == RX_F16 || v->dtype == RX_BF16;
    size_t row_bytes = v->ne[0] % 32 && !plain ? 0 : rx_cu_row_bytes (v->dtype, (size_t) v->ne[0]);
    if (row_bytes == 0)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: %s: ne[0] = %llu is not a "
                           "multiple of 32 and of the %s block (%d)", name,
                           (unsigned long long) v->ne[0], rx_dtype_name (v->dtype),
                           rx_cu_blk_elems (v->dtype));
    uint64_t rows = n_el / v->ne[0];
    if (rows > SIZE_MAX / row_bytes || (size_t) rows * row_bytes != v->nbytes)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: %s: %zu bytes given, "
                           "shape and dtype need %llu", name, v->nbytes,
                           (unsigned long long) (rows * row_bytes));
    if (!v->data) return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_load: %s: data is NULL", name);
    struct rx_kweight *w = calloc (1, sizeof *w);
    if (!w) return rx_err_set (err, RX_ENOMEM, "kernels-cuda weight_load: out of memory");
    int rc = rx_cumem_alloc (c->mem, v->nbytes, 256, &w->d, err);
    if (rc != RX_OK) {
        free (w);
        return rc;
    }
    cudaError_t ce = cudaMemcpy (w->d, v->data, v->nbytes, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        rx_cumem_free (c->mem, w->d);
        free (w);
        return rx_err_set (err, RX_EDEVICE, "kernels-cuda weight_load: %s: cudaMemcpy (%zu "
                           "bytes): %s", name, v->nbytes, cudaGetErrorString (ce));
    }
    w->magic = S_WEIGHT_MAGIC;
    w->dtype = v->dtype;
    w->n_dims = v->n_dims;
    memcpy (w->ne, v->ne, sizeof w->ne);
    w->row_bytes = row_bytes;
    w->next = c->weights;
    if (c->weights) c->weights->prev = w;
    c->weights = w;
    *out = w;
    return RX_OK;
}

static void s_weight_free (void *be, rx_kweight_t *w)
{
    struct s_cuda *c = be;
    if (!c || !w) return;
    struct rx_kweight *it = c->weights;
    while (it && it != w) it = it->next;
    if (!it) {
        RX_HLOG (c->host, RX_LOG_ERROR, "weight_free: %p is not a weight; ignored", (void *) w);
        return;
    }
    s_invalidate_graphs (c);
    s_weight_release (c, w);
}

static int s_weight_data (void *be, const rx_kweight_t *w, const void **dptr, struct rx_err *err)
{
    if (!be || !dptr || !s_weight_ok (w))
        return rx_err_set (err, RX_EINVAL, "kernels-cuda weight_data: bad argument");
    if (w->dtype != RX_F32 && w->dtype != RX_F16 && w->dtype != RX_BF16)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cuda weight_data: a %s weight has no "
                           "plain element array", rx_dtype_name (w->dtype));
    *dptr = w->d;
    return RX_OK;
}

/* ------------------------------------------------------------------ ops -- */

#define S_BEGIN(opname)                                                               \
    struct s_cuda *c = be;                                                            \
    static const char *const s_op = opname;                                           \
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: no backend", s_op);  \
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: bad stream", s_op); \
    cudaStream_t st = s_st (c, s);                                                    \
    struct s_pscope ps_ __attribute__ ((cleanup (s_prof_end), unused)) = s_prof_begin (c, st, s_op)

#define S_NEED(cond, ...)                                                             \
    do { if (!(cond)) return rx_err_set (err, RX_EINVAL, __VA_ARGS__); } while (0)

#define S_VIEW(ptr, ld, rows, dim, bcast)                                             \
    S_NEED ((ptr) != NULL || (rows) == 0, "kernels-cuda %s: %s is NULL", s_op, #ptr); \
    S_NEED ((ld) >= (dim) || ((bcast) && (ld) == 0) || (rows) <= 1,                   \
            "kernels-cuda %s: %s = %zu is smaller than dim %zu", s_op, #ld, (size_t) (ld), \
            (size_t) (dim))

static int s_get_rows (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *ids,
                       size_t n, float *out, size_t ldo, struct rx_err *err)
{
    S_BEGIN ("get_rows");
    S_NEED (s_weight_ok (w), "kernels-cuda get_rows: bad weight handle");
    S_NEED (n == 0 || ids, "kernels-cuda get_rows: ids is NULL");
    S_VIEW (out, ldo, n, (size_t) w->ne[0], 0);
    uint64_t rows = w->ne[1] * w->ne[2] * w->ne[3];
    S_LAUNCH (rx_cuk_get_rows (st, w->dtype, w->d, w->row_bytes, (size_t) w->ne[0], rows, ids, n,
                               out, n > 1 ? ldo : (size_t) w->ne[0]), s_op);
    return RX_OK;
}

static int s_rms_norm (void *be, rx_kstream_t *s, const float *x, size_t ldx, const float *w,
                       float *y, size_t ldy, size_t rows, size_t dim, float eps, struct rx_err *err)
{
    S_BEGIN ("rms_norm");
    S_NEED (dim > 0, "kernels-cuda rms_norm: dim is 0");
    S_VIEW (x, ldx, rows, dim, 0);
    S_VIEW (y, ldy, rows, dim, 0);
    S_NEED (eps >= 0.f, "kernels-cuda rms_norm: eps %g < 0", (double) eps);
    if (rows == 0) return RX_OK;
    S_LAUNCH (rx_cuk_rms_norm (st, x, ldx, w, y, ldy, rows, dim, eps), s_op);
    return RX_OK;
}

static int s_rope (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t n_tok, size_t n_head,
                   size_t ld_head, const int32_t *pos, const struct rx_rope_params *p,
                   struct rx_err *err)
{
    S_BEGIN ("rope");
    S_NEED (p && p->struct_size >= offsetof (struct rx_rope_params, beta_slow) + sizeof (float),
            "kernels-cuda rope: params missing or too old");
    struct rx_rope_params rp;
    memset (&rp, 0, sizeof rp);
    memcpy (&rp, p, p->struct_size < sizeof rp ? p->struct_size : sizeof rp);
    S_NEED (rp.mode == RX_ROPE_NORMAL || rp.mode == RX_ROPE_NEOX,
            "kernels-cuda rope: mode %d (0 normal, 2 neox)", rp.mode);
    S_NEED (rp.n_rot > 0 && rp.n_rot % 2 == 0 && rp.n_rot <= 2048,
            "kernels-cuda rope: n_rot %d must be even, 2..2048", rp.n_rot);
    S_NEED (n_head == 0 || ld_head >= (size_t) rp.n_rot || n_head == 1,
            "kernels-cuda rope: ld_head %zu < n_rot %d", ld_head, rp.n_rot);
    S_NEED (n_tok <= 1 || ldx >= (n_head - 1) * ld_head + (size_t) rp.n_rot,
            "kernels-cuda rope: ldx %zu too small for %zu heads", ldx, n_head);
    S_NEED (rp.freq_base > 0.f && rp.freq_scale > 0.f,
            "kernels-cuda rope: freq_base and freq_scale must be > 0");
    S_NEED (n_tok == 0 || (x && pos), "kernels-cuda rope: NULL pointer");
    float corr[2];
    rx_cu_rope_corr_dims (rp.n_rot, rp.n_ctx_orig, rp.freq_base, rp.beta_fast, rp.beta_slow, corr);
    const float theta_scale = powf (rp.freq_base, -2.0f / (float) rp.n_rot);
    S_LAUNCH (rx_cuk_rope (st, x, ldx, n_tok, n_head, ld_head, pos, rp.mode == RX_ROPE_NEOX,
                           rp.n_rot, theta_scale, rp.freq_scale, rp.ext_factor, rp.attn_factor,
                           corr[0], corr[1], rp.freq_factors), s_op);
    return RX_OK;
}

/* Device scratch (*buf of *cap bytes), grown on demand.  Old scratch is
 * retired, not freed: a graph captured earlier may still point at it (and
 * freeing would drop every captured graph).  One scratch per use and
 * backend: matmuls on the same stream reuse theirs in order (as GEMMs
 * always did), split attention calls theirs. */
static int s_grow (struct s_cuda *c, void **buf, size_t *bufcap, size_t bytes, const char *op,
                   void **out, struct rx_err *err)
{
    if (bytes > *bufcap) {
        size_t cap = bytes + bytes / 4;
        void *p = NULL;
        int rc = rx_cumem_alloc (c->mem, cap, 256, &p, err);
        if (rc != RX_OK) return rc;
        if (*buf) {
            void **r = realloc (c->retired, (c->n_retired + 1) * sizeof *r);
            if (!r) {
                rx_cumem_free (c->mem, p);
                return rx_err_set (err, RX_ENOMEM, "kernels-cuda %s: out of memory", op);
            }
            c->retired = r;
            c->retired[c->n_retired++] = *buf;
        }
        *buf = p;
        *bufcap = cap;
    }
    *out = *buf;
    return RX_OK;
}

/* Scratch for matmul (quantized activations, GEMM operands). */
static int s_scratch (struct s_cuda *c, size_t bytes, void **out, struct rx_err *err)
{
    return s_grow (c, &c->scratch, &c->scratch_cap, bytes, "matmul", out, err);
}

static int s_matmul (void *be, rx_kstream_t *s, const rx_kweight_t *w, int expert, const float *x,
                     size_t ldx, float *y, size_t ldy, size_t n, uint32_t flags, struct rx_err *err)
{
    S_BEGIN ("matmul");
    S_NEED (s_weight_ok (w), "kernels-cuda matmul: bad weight handle");
    S_NEED (w->n_dims >= 2 && w->ne[3] == 1, "kernels-cuda matmul: weight must be 2-D or 3-D");
    if (w->ne[2] > 1 || w->n_dims == 3)
        S_NEED (expert >= 0 && (uint64_t) expert < w->ne[2],
                "kernels-cuda matmul: expert %d outside 0..%llu", expert,
                (unsigned long long) w->ne[2] - 1);
    else
        S_NEED (expert <= 0, "kernels-cuda matmul: expert %d for a 2-D weight", expert);
    S_NEED ((flags & ~RX_MM_ACCUMULATE) == 0, "kernels-cuda matmul: unknown flags 0x%x", flags);
    const size_t in = (size_t) w->ne[0], out = (size_t) w->ne[1];
    /* cuBLAS takes int sizes and leading dimensions. */
    S_NEED (n <= INT32_MAX && ldx <= INT32_MAX && ldy <= INT32_MAX && in <= INT32_MAX &&
            out <= INT32_MAX, "kernels-cuda matmul: n %zu, ldx %zu or ldy %zu exceeds 2^31-1",
            n, ldx, ldy);
    S_VIEW (x, ldx, n, in, 0);
    S_VIEW (y, ldy, n, out, 0);
    if (n == 0) return RX_OK;
    if (n == 1) {
        ldx = in;
        ldy = out;
    }
    struct rx_cumm_plan pl;
    const unsigned pf = (c->fast_mv ? RX_CUPLAN_FAST_MV : 0u) | (c->half_gemm ? RX_CUPLAN_HALF_GEMM : 0u);
    int rc = rx_cuplan_matmul (w->dtype, n, in, out, c->mv_rows, 0, pf, &pl, err);
    if (rc != RX_OK) return rc;
    if (c->prof) {
        char pn[40];
        snprintf (pn, sizeof pn, "matmul.%s.%s", pl.path == RX_CUMM_MATVEC ?
                  (pl.mv_kernel == RX_CUMV_SIMPLE ? "matvec" : "matvec_fast") : "gemm",
                  rx_dtype_name (w->dtype));
        s_prof_name (&ps_, pn);
    }
    const uint8_t *wd = (const uint8_t *) w->d + (size_t) (expert > 0 ? expert : 0) * out * w->row_bytes;
    const int acc = (flags & RX_MM_ACCUMULATE) != 0;
    /* Scratch layout: [q: n x in F32][xs: x_parts x n x in][ws: W slice]. */
    void *scr = NULL;
    const size_t scr_bytes = pl.q_scratch + pl.x_scratch + pl.w_scratch;
    if (scr_bytes && (rc = s_scratch (c, scr_bytes, &scr, err)) != RX_OK) return rc;
    if (pl.act_qblk) {
        /* The CPU's integer dots see quantized activations: so do we. */
        float *xq = (float *) scr;
        S_LAUNCH (rx_cuk_act_qdq (st, x, ldx, n, in, pl.act_qblk, xq), s_op);
        x = xq;
        ldx = in;
    }
    if (pl.path == RX_CUMM_MATVEC) {
        S_LAUNCH (rx_cuk_matvec (st, w->dtype, wd, w->row_bytes, in, out, x, ldx, y, ldy, n, acc,
                                 pl.mv_kernel), s_op);
        return RX_OK;
    }
    void *xs = (uint8_t *) scr + pl.q_scratch, *ws = (uint8_t *) xs + pl.x_scratch;
    const float one = 1.f, beta = acc ? 1.f : 0.f;
    cublasStatus_t bs = cublasSetStream (c->blas, st);
    if (bs != CUBLAS_STATUS_SUCCESS) return s_blaserr (err, bs, s_op, "cublasSetStream");
    if (pl.gtype == RX_CUMM_G_F32) {
        /* Row-major Y = X W^T is column-major Y^T = W^T(op T on W's [in x out]) X^T.
         * Quantized W: dequantized to F32 slice by slice first. */
        for (size_t o0 = 0; o0 < out; o0 += pl.out_slice) {
            const size_t no = out - o0 < pl.out_slice ? out - o0 : pl.out_slice;
            const void *a = wd + o0 * w->row_bytes;
            if (pl.dequant_w) {
                S_LAUNCH (rx_cuk_dequant_f32 (st, w->dtype, a, w->row_bytes, in, no, ws), s_op);
                a = ws;
            }
            bs = cublasGemmEx (c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int) no, (int) n, (int) in, &one,
                               a, CUDA_R_32F, (int) in, x, CUDA_R_32F, (int) ldx, &beta, y + o0,
                               CUDA_R_32F, (int) ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (bs != CUBLAS_STATUS_SUCCESS) return s_blaserr (err, bs, s_op, "cublasGemmEx (f32)");
        }
        return RX_OK;
    }
    const cudaDataType_t dt = pl.gtype == RX_CUMM_G_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    /* X in x_parts half-precision parts (hi, lo, ...): kernels-cpu keeps
     * F32 activations against F16/BF16 weights; one F16 copy alone is off
     * by ~1e-3 in the logits (H200 run of test_models_ref). */
    S_LAUNCH (rx_cuk_convert_split (st, x, ldx, n, in, xs, pl.gtype == RX_CUMM_G_BF16, pl.x_parts,
                                    pl.x_part_scale), s_op);
    const size_t part_bytes = n * in * 2;
    for (size_t o0 = 0; o0 < out; o0 += pl.out_slice) {
        const size_t no = out - o0 < pl.out_slice ? out - o0 : pl.out_slice;
        const void *a = wd + o0 * w->row_bytes;
        if (pl.dequant_w) {
            S_LAUNCH (rx_cuk_dequant_f16 (st, w->dtype, a, w->row_bytes, in, no, ws), s_op);
            a = ws;
        }
        float alpha = 1.f;
        for (int p = 0; p < pl.x_parts; p++) {
            const float b = p == 0 ? beta : 1.f;
            bs = cublasGemmEx (c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int) no, (int) n, (int) in,
                               &alpha, a, dt, (int) in, (const uint8_t *) xs + (size_t) p * part_bytes,
                               dt, (int) in, &b, y + o0, CUDA_R_32F, (int) ldy, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT);
            if (bs != CUBLAS_STATUS_SUCCESS) return s_blaserr (err, bs, s_op, "cublasGemmEx");
            alpha /= pl.x_part_scale;
        }
    }
    return RX_OK;
}

static int s_ew (void *be, rx_kstream_t *s, int op, const char *name, const float *a, size_t lda,
                 const float *b, size_t ldb, float *y, size_t ldy, size_t rows, size_t dim,
                 float alpha, int bcast, struct rx_err *err)
{
    struct s_cuda *c = be;
    const char *s_op = name;
    if (!c) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: no backend", s_op);
    if (!s_stream_ok (s)) return rx_err_set (err, RX_EINVAL, "kernels-cuda %s: bad stream", s_op);
    S_VIEW (a, lda, rows, dim, 0);
    if (op == RX_CUK_ADD || op == RX_CUK_MUL || op == RX_CUK_SWIGLU) {
        S_VIEW (b, ldb, rows, dim, bcast);
    }
    S_VIEW (y, ldy, rows, dim, 0);
    if (rows <= 1) {
        lda = ldy = dim;
        if (ldb) ldb = dim;
    }
    struct s_pscope ps_ __attribute__ ((cleanup (s_prof_end), unused)) =
        s_prof_begin (c, s_st (c, s), s_op);
    S_LAUNCH (rx_cuk_ew (s_st (c, s), op, a, lda, b, ldb, y, ldy, rows, dim, alpha), s_op);
    return RX_OK;
}

static int s_swiglu (void *be, rx_kstream_t *s, const float *gate, size_t ldg, const float *up,
                     size_t ldu, float *out, size_t ldo, size_t rows, size_t dim,
                     struct rx_err *err)
{
    return s_ew (be, s, RX_CUK_SWIGLU, "swiglu", gate, ldg, up, ldu, out, ldo, rows, dim, 0.f, 0, err);
}

static int s_add (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b,
                  size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    return s_ew (be, s, RX_CUK_ADD, "add", a, lda, b, ldb, y, ldy, rows, dim, 0.f, 1, err);
}

static int s_mul (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b,
                  size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    return s_ew (be, s, RX_CUK_MUL, "mul", a, lda, b, ldb, y, ldy, rows, dim, 0.f, 1, err);
}

static int s_scale (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy,
                    size_t rows, size_t dim, float alpha, struct rx_err *err)
{
    return s_ew (be, s, RX_CUK_SCALE, "scale", x, ldx, NULL, 0, y, ldy, rows, dim, alpha, 0, err);
}

static int s_sigmoid (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y,
                      size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    return s_ew (be, s, RX_CUK_SIGMOID, "sigmoid", x, ldx, NULL, 0, y, ldy, rows, dim, 0.f, 0, err);
}

static int s_copy2d (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y,
                     size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    return s_ew (be, s, RX_CUK_COPY, "copy2d", x, ldx, NULL, 0, y, ldy, rows, dim, 0.f, 0, err);
}

static int s_softmax (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t rows, size_t dim,
                      float scale, struct rx_err *err)
{
    S_BEGIN ("softmax");
    S_NEED (dim > 0, "kernels-cuda softmax: dim is 0");
    S_VIEW (x, ldx, rows, dim, 0);
    if (rows == 0) return RX_OK;
    S_LAUNCH (rx_cuk_softmax (st, x, ldx, rows, dim, scale), s_op);
    return RX_OK;
}

static int s_argmax (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows,
                     size_t dim, int32_t *out, struct rx_err *err)
{
    S_BEGIN ("argmax");
    S_NEED (dim > 0 && dim <= INT32_MAX, "kernels-cuda argmax: dim %zu (1..2^31-1)", dim);
    S_VIEW (x, ldx, rows, dim, 0);
    S_NEED (rows == 0 || out, "kernels-cuda argmax: out is NULL");
    if (rows == 0) return RX_OK;
    S_LAUNCH (rx_cuk_argmax (st, x, ldx, rows, dim, out), s_op);
    return RX_OK;
}

static int s_topk (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows,
                   size_t dim, size_t kk, float *vals, int32_t *idx, struct rx_err *err)
{
    S_BEGIN ("topk");
    S_NEED (dim > 0 && dim <= INT32_MAX, "kernels-cuda topk: dim %zu (1..2^31-1)", dim);
    S_NEED (kk >= 1 && kk <= dim, "kernels-cuda topk: k = %zu outside 1..%zu", kk, dim);
    S_VIEW (x, ldx, rows, dim, 0);
    S_NEED (rows == 0 || idx, "kernels-cuda topk: idx is NULL");
    if (rows == 0) return RX_OK;
    S_LAUNCH (rx_cuk_topk (st, x, ldx, rows, dim, kk, vals, idx), s_op);
    return RX_OK;
}

/* --------------------------------------------- MoE routing and expert pass -- */

static int s_moe_route (void *be, rx_kstream_t *s, const float *probs, const float *sel, size_t ld,
                        size_t rows, size_t n_expert, size_t n_group, size_t topk_group, size_t kk,
                        int norm, float scale, int32_t *ids, float *w, struct rx_err *err)
{
    S_BEGIN ("moe_route");
    S_NEED (n_expert >= 1, "kernels-cuda moe_route: n_expert is 0");
    S_NEED (kk >= 1 && kk <= n_expert, "kernels-cuda moe_route: k = %zu outside 1..%zu", kk, n_expert);
    if (n_group > 1) {
        S_NEED (n_expert % n_group == 0, "kernels-cuda moe_route: %zu experts do not split into %zu "
                "groups", n_expert, n_group);
        S_NEED (topk_group >= 1 && topk_group <= n_group,
                "kernels-cuda moe_route: topk_group %zu outside 1..%zu", topk_group, n_group);
        S_NEED (topk_group * (n_expert / n_group) >= kk,
                "kernels-cuda moe_route: %zu groups of %zu experts hold fewer than k = %zu",
                topk_group, n_expert / n_group, kk);
    }
    S_VIEW (probs, ld, rows, n_expert, 0);
    S_VIEW (sel, ld, rows, n_expert, 0);
    S_NEED (rows == 0 || (ids && w), "kernels-cuda moe_route: ids or w is NULL");
    size_t smem = 0;
    int rc = rx_cuplan_moe_route (n_expert, n_group, kk, &smem, err);
    if (rc != RX_OK) return rc;
    if (rows == 0) return RX_OK;
    S_LAUNCH (rx_cuk_moe_route (st, probs, sel, rows > 1 ? ld : n_expert, rows, (int) n_expert,
                                (int) (n_group > 1 ? n_group : 1), (int) topk_group, (int) kk, norm,
                                scale, ids, w, smem), s_op);
    return RX_OK;
}

static int s_moe_sort (void *be, rx_kstream_t *s, const int32_t *ids, size_t n_tok, size_t kk,
                       size_t n_expert, int32_t *offsets, int32_t *row, int32_t *src,
                       struct rx_err *err)
{
    S_BEGIN ("moe_sort");
    S_NEED (n_expert >= 1, "kernels-cuda moe_sort: n_expert is 0");
    S_NEED (kk >= 1, "kernels-cuda moe_sort: k is 0");
    S_NEED (n_tok <= (INT32_MAX - 1024) / kk, "kernels-cuda moe_sort: %zu tokens x k = %zu choices do not "
            "fit int32 rows", n_tok, kk);
    S_NEED (offsets, "kernels-cuda moe_sort: offsets is NULL");
    S_NEED (n_tok == 0 || (ids && row && src), "kernels-cuda moe_sort: ids, row or src is NULL");
    uint32_t warps = 0;
    size_t smem = 0;
    int rc = rx_cuplan_moe_sort (n_expert, &warps, &smem, err);
    if (rc != RX_OK) return rc;
    /* n_tok 0 still runs: it writes the offsets (zeros). */
    S_LAUNCH (rx_cuk_moe_sort (st, ids, n_tok * kk, (int) kk, (int) n_expert, offsets, row, src,
                               warps, smem), s_op);
    return RX_OK;
}

static int s_gather_rows (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *idx,
                          size_t n, size_t dim, float *y, size_t ldy, struct rx_err *err)
{
    S_BEGIN ("gather_rows");
    S_NEED (n == 0 || (x && idx), "kernels-cuda gather_rows: x or idx is NULL");
    /* x's rows are picked by idx: its ld matters even for one row. */
    S_NEED (n == 0 || ldx >= dim, "kernels-cuda gather_rows: ldx = %zu is smaller than dim %zu",
            ldx, dim);
    S_VIEW (y, ldy, n, dim, 0);
    if (n == 0 || dim == 0) return RX_OK;
    S_LAUNCH (rx_cuk_gather_rows (st, x, ldx, idx, n, dim, y, n > 1 ? ldy : dim), s_op);
    return RX_OK;
}

/* The offsets are device memory: unlike kernels-cpu they are not checked
 * (that would take a synchronize); the kernel trusts moe_sort's.  A row
 * outside [offsets[0], offsets[n_expert]) is not written. */
static int s_matmul_grouped (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *offsets,
                             size_t row0, const float *x, size_t ldx, float *y, size_t ldy,
                             size_t n, uint32_t flags, struct rx_err *err)
{
    S_BEGIN ("matmul_grouped");
    S_NEED (s_weight_ok (w), "kernels-cuda matmul_grouped: bad weight handle");
    S_NEED (w->n_dims >= 3 && w->ne[3] == 1,
            "kernels-cuda matmul_grouped: weight must be 3-D [in, out, n_expert] (it has %u dims)",
            w->n_dims);
    S_NEED (w->ne[2] < INT32_MAX, "kernels-cuda matmul_grouped: %llu experts",
            (unsigned long long) w->ne[2]);
    S_NEED ((flags & ~RX_MM_ACCUMULATE) == 0, "kernels-cuda matmul_grouped: unknown flags 0x%x",
            flags);
    const size_t in = (size_t) w->ne[0], out = (size_t) w->ne[1];
    S_VIEW (x, ldx, n, in, 0);
    S_VIEW (y, ldy, n, out, 0);
    S_NEED (n == 0 || offsets, "kernels-cuda matmul_grouped: offsets is NULL");
    if (n == 0) return RX_OK;
    S_NEED (row0 <= INT32_MAX && n <= (size_t) INT32_MAX - row0,
            "kernels-cuda matmul_grouped: rows %zu + %zu exceed int32", row0, n);
    if (n == 1) {
        ldx = in;
        ldy = out;
    }
    struct rx_cugm_plan pl;
    int rc = rx_cuplan_matmul_grouped (w->dtype, n, in, out, 0, &pl, err);
    if (rc != RX_OK) return rc;
    if (c->prof) {
        char pn[40];
        snprintf (pn, sizeof pn, "matmul_grouped.%s", rx_dtype_name (w->dtype));
        s_prof_name (&ps_, pn);
    }
    /* Scratch of the quantized activations: matmul's, reused in stream
     * order (and grown only past the largest pass so far). */
    void *scr = NULL;
    if (pl.q_scratch && (rc = s_scratch (c, pl.q_scratch, &scr, err)) != RX_OK) return rc;
    const int acc = (flags & RX_MM_ACCUMULATE) != 0;
    for (size_t p0 = 0; p0 < n; p0 += pl.rows_per_pass) {
        const size_t np = n - p0 < pl.rows_per_pass ? n - p0 : pl.rows_per_pass;
        const float *xp = x + p0 * ldx;
        size_t ldxp = ldx;
        if (pl.act_qblk) {
            /* The CPU's integer dots see quantized activations: so do we. */
            S_LAUNCH (rx_cuk_act_qdq (st, xp, ldx, np, in, pl.act_qblk, (float *) scr), s_op);
            xp = (const float *) scr;
            ldxp = in;
        }
        S_LAUNCH (rx_cuk_matvec_grouped (st, w->dtype, w->d, w->row_bytes, out * w->row_bytes, in,
                                         out, offsets, (int) w->ne[2], row0 + p0, xp, ldxp,
                                         y + p0 * ldy, ldy, np, acc), s_op);
    }
    return RX_OK;
}

static int s_moe_combine (void *be, rx_kstream_t *s, const float *y, size_t ldy, const int32_t *row,
                          const float *w, size_t n_tok, size_t kk, size_t dim, float *out, size_t ldo,
                          uint32_t flags, struct rx_err *err)
{
    S_BEGIN ("moe_combine");
    S_NEED (kk >= 1, "kernels-cuda moe_combine: k is 0");
    S_NEED ((flags & ~RX_MM_ACCUMULATE) == 0, "kernels-cuda moe_combine: unknown flags 0x%x", flags);
    S_NEED (n_tok <= SIZE_MAX / kk, "kernels-cuda moe_combine: %zu tokens x k = %zu overflow",
            n_tok, kk);
    S_NEED (n_tok == 0 || (y && row && w), "kernels-cuda moe_combine: y, row or w is NULL");
    /* y's rows are picked by row: its ld matters even for one token. */
    S_NEED (n_tok == 0 || ldy >= dim, "kernels-cuda moe_combine: ldy = %zu is smaller than dim %zu",
            ldy, dim);
    S_VIEW (out, ldo, n_tok, dim, 0);
    if (n_tok == 0 || dim == 0) return RX_OK;
    S_LAUNCH (rx_cuk_moe_combine (st, y, ldy, row, w, n_tok, kk, dim, out, n_tok > 1 ? ldo : dim,
                                  (flags & RX_MM_ACCUMULATE) != 0), s_op);
    return RX_OK;
}

/* -- the low-latency expert-parallel exchange (kernel ABI 1.4) -- */

/* offsets, row and src are trusted (moe_sort's; checking them would take a
 * copy to the host): a sorted row that would land outside its block is
 * dropped by the kernel rather than written past it. */
static int s_moe_ll_pack (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *ids,
                          const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n_tok,
                          size_t kk, size_t n_expert, size_t n_rank, size_t slots, size_t hrows,
                          size_t dim, float *send, int32_t *slot_of, struct rx_err *err)
{
    S_BEGIN ("moe_ll_pack");
    int rc = rx_ll_pack_args ("kernels-cuda", x, ldx, ids, offsets, row, src, n_tok, kk, n_expert, n_rank, slots,
                              hrows, dim, send, slot_of, (size_t) INT32_MAX - 1024, err);
    if (rc != RX_OK) return rc;
    /* n_tok 0 still runs: it writes the headers (counts of zero). */
    S_LAUNCH (rx_cuk_moe_ll_pack (st, x, ldx, ids, offsets, row, src, n_tok * kk, (int) n_expert,
                                  (int) n_rank, (int) slots, (int) hrows, dim, send, slot_of), s_op);
    return RX_OK;
}

static int s_moe_ll_unpack (void *be, rx_kstream_t *s, const float *recv, size_t n_rank, size_t slots,
                            size_t hrows, size_t dim, size_t n_local, int32_t *offsets, int32_t *order,
                            int32_t *back, struct rx_err *err)
{
    S_BEGIN ("moe_ll_unpack");
    int rc = rx_ll_unpack_args ("kernels-cuda", recv, n_rank, slots, hrows, dim, n_local, offsets, order, back,
                                (size_t) INT32_MAX - 1024, err);
    if (rc != RX_OK) return rc;
    size_t smem = 0;
    rc = rx_cuplan_moe_ll_unpack (n_rank, n_local, &smem, err);
    if (rc != RX_OK) return rc;
    S_LAUNCH (rx_cuk_moe_ll_unpack (st, recv, (int) n_rank, (int) slots, (int) hrows, dim, (int) n_local,
                                    offsets, order, back, smem), s_op);
    return RX_OK;
}

static int s_pool_check (const struct rx_kv_pool *pool, const char *s_op, struct rx_err *err)
{
    S_NEED (pool, "kernels-cuda %s: pool is NULL", s_op);
    S_NEED (pool->k && pool->v, "kernels-cuda %s: pool buffers are NULL", s_op);
    S_NEED (pool->dtype == RX_F32 || pool->dtype == RX_F16,
            "kernels-cuda %s: pool dtype %s (f32 or f16)", s_op, rx_dtype_name (pool->dtype));
    S_NEED (pool->n_kv_head > 0 && pool->hd_k > 0 && pool->hd_v > 0,
            "kernels-cuda %s: pool n_kv_head %d, hd_k %d, hd_v %d must be > 0", s_op,
            pool->n_kv_head, pool->hd_k, pool->hd_v);
    S_NEED (pool->n_slots > 0 && pool->n_slots <= INT32_MAX,
            "kernels-cuda %s: pool n_slots %llu (1..2^31-1)", s_op,
            (unsigned long long) pool->n_slots);
    return RX_OK;
}

static int s_kv_store (void *be, rx_kstream_t *s, const struct rx_kv_pool *pool, const float *kx,
                       size_t ldk, const float *vx, size_t ldv, const int32_t *slots,
                       size_t n_tok, struct rx_err *err)
{
    S_BEGIN ("kv_store");
    int rc = s_pool_check (pool, s_op, err);
    if (rc != RX_OK) return rc;
    size_t nk = (size_t) pool->n_kv_head * (size_t) pool->hd_k;
    size_t nv = (size_t) pool->n_kv_head * (size_t) pool->hd_v;
    S_VIEW (kx, ldk, n_tok, nk, 0);
    S_VIEW (vx, ldv, n_tok, nv, 0);
    S_NEED (n_tok == 0 || slots, "kernels-cuda kv_store: slots is NULL");
    S_LAUNCH (rx_cuk_kv_store (st, pool->k, pool->v, pool->dtype == RX_F16, nk, nv, pool->n_slots,
                               kx, n_tok > 1 ? ldk : nk, vx, n_tok > 1 ? ldv : nv, slots, n_tok),
              s_op);
    return RX_OK;
}

static int s_attention (void *be, rx_kstream_t *s, const float *q, size_t ldq,
                        const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                        const struct rx_attn_params *p, float *out, size_t ldo, struct rx_err *err)
{
    S_BEGIN ("attention");
    int rc = s_pool_check (pool, s_op, err);
    if (rc != RX_OK) return rc;
    S_NEED (b && p, "kernels-cuda attention: batch or params is NULL");
    S_NEED (p->struct_size >= offsetof (struct rx_attn_params, window) + sizeof (int32_t),
            "kernels-cuda attention: params struct_size %u too small", p->struct_size);
    S_NEED (p->n_head > 0 && p->n_head % pool->n_kv_head == 0 && p->n_head <= 65535,
            "kernels-cuda attention: n_head %d is not a multiple of n_kv_head %d (<= 65535)",
            p->n_head, pool->n_kv_head);
    S_NEED (p->window >= 0 && p->softcap >= 0.f,
            "kernels-cuda attention: window %d and softcap %g must be >= 0", p->window,
            (double) p->softcap);
    S_NEED (pool->hd_v <= 1024 && pool->hd_k <= 4096,
            "kernels-cuda attention: hd_k %d (<= 4096), hd_v %d (<= 1024)", pool->hd_k, pool->hd_v);
    S_NEED (b->n_seq >= 0 && b->n_tokens >= 0, "kernels-cuda attention: negative counts");
    if (b->n_tokens == 0) return RX_OK;
    S_NEED (b->n_seq > 0 && b->q_start && b->kv_start && b->slots && b->q_pos,
            "kernels-cuda attention: batch arrays missing");
    size_t qd = (size_t) p->n_head * (size_t) pool->hd_k;
    size_t od = (size_t) p->n_head * (size_t) pool->hd_v;
    S_VIEW (q, ldq, (size_t) b->n_tokens, qd, 0);
    S_VIEW (out, ldo, (size_t) b->n_tokens, od, 0);
    int splits = 1;
    void *part = NULL;
    if (rx_cuplan_attn_tiled (c->attn_tiled, pool->hd_k, pool->hd_v, b->n_tokens, b->n_seq)) {
        s_prof_name (&ps_, "attention.tiled");
    } else if ((splits = rx_cuplan_attn_splits (b->n_tokens, b->n_seq, p->n_head, c->n_sm,
                                                c->attn_splits)) > 1) {
        /* Split-K: the partials' scratch depends on the shapes only (not
         * on the KV lengths), so a graph stays valid as the context grows.
         * Grown as matmul's scratch is: a first capture of a larger shape
         * may allocate (graph_begin captures in relaxed mode for that). */
        const size_t pb = rx_cuplan_attn_split_bytes (b->n_tokens, p->n_head, splits, pool->hd_v);
        S_NEED (pb > 0, "kernels-cuda attention: %d rows x %d heads x %d splits of partials "
                "overflow", b->n_tokens, p->n_head, splits);
        if ((rc = s_grow (c, &c->attn_part, &c->attn_part_cap, pb, s_op, &part, err)) != RX_OK)
            return rc;
        s_prof_name (&ps_, "attention.split");
    }
    S_LAUNCH (rx_cuk_attention (st, q, b->n_tokens > 1 ? ldq : qd, pool->k, pool->v,
                                pool->dtype == RX_F16, pool->n_kv_head, pool->hd_k, pool->hd_v,
                                pool->n_slots, b->n_seq, b->n_tokens, b->q_start, b->kv_start,
                                b->slots, b->q_pos, p->n_head, p->scale, p->softcap, p->window,
                                out, b->n_tokens > 1 ? ldo : od, c->attn_tiled, splits,
                                (float *) part), s_op);
    return RX_OK;
}

/* ------------------------------------------------------------ the table -- */

static const struct rx_kernels_ops s_ops = {
    .struct_size = sizeof s_ops,
    .create = s_create,
    .destroy = s_destroy,
    .info = s_info,
    .alloc = s_alloc,
    .free_ = s_free,
    .copy_h2d = s_copy_h2d,
    .copy_d2h = s_copy_d2h,
    .copy_d2d = s_copy_d2d,
    .memset_ = s_memset,
    .stream_create = s_stream_create,
    .stream_destroy = s_stream_destroy,
    .synchronize = s_synchronize,
    .graph_begin = s_graph_begin,
    .graph_end = s_graph_end,
    .graph_launch = s_graph_launch,
    .graph_has = s_graph_has,
    .weight_load = s_weight_load,
    .weight_free = s_weight_free,
    .weight_data = s_weight_data,
    .get_rows = s_get_rows,
    .rms_norm = s_rms_norm,
    .rope = s_rope,
    .matmul = s_matmul,
    .swiglu = s_swiglu,
    .add = s_add,
    .mul = s_mul,
    .scale = s_scale,
    .softmax = s_softmax,
    .sigmoid = s_sigmoid,
    .copy2d = s_copy2d,
    .argmax = s_argmax,
    .topk = s_topk,
    .kv_store = s_kv_store,
    .attention = s_attention,
    .moe_route = s_moe_route,
    .moe_sort = s_moe_sort,
    .gather_rows = s_gather_rows,
    .matmul_grouped = s_matmul_grouped,
    .moe_combine = s_moe_combine,
    .moe_ll_pack = s_moe_ll_pack,
    .moe_ll_unpack = s_moe_ll_unpack,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_KERNELS, .name = "cuda", .version = S_VERSION,
                  .description = "CUDA kernels: cuBLAS GEMM, fused dequant matvec, paged "
                                 "attention, CUDA graphs",
                  .keys = s_keys, .ops = &s_ops)
