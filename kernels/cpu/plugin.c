/* kernels/cpu/plugin.c -- kernels-cpu: the descriptor, the ops table, the
 * instance (memory, streams, graphs, weights) and argument checks for every
 * op.  The compute lives in matmul.c, ops.c and attn.c. */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <radix/kernel.h>
#include <radix/plugin.h>

#include "attn.h"
#include "graph.h"
#include "matmul.h"
#include "ops.h"
#include "../moe_ll_args.h"
#include "plugin.h"
#include "quant.h"

#define S_VERSION "0.1.0"
#define S_DEFAULT_ALIGN 64
#define S_BUF_MAGIC 0x6675424bu
#define S_STREAM_MAGIC 0x6d727453u
/* Address space the guard mode reserves (nothing is committed until used). */
#define S_GUARD_RESERVE ((size_t) 16 << 30)

/* Header in front of every alloc()ed block: lets free_ spot foreign
 * pointers and destroy release whatever the caller forgot. */
struct rx_kbuf {
    uint32_t magic;
    void *raw;
    size_t bytes;
    struct rx_kbuf *prev, *next;
};

struct rx_kstream {
    uint32_t magic;
};

/* ----------------------------------------------------------------- keys -- */

static const struct rx_cfg_key s_keys[] = {
    { "isa", RX_CFG_ENUM, "auto", "SIMD path: auto picks the best this CPU has", 0, 0,
      "auto|scalar|avx2|avx512" },
    { "spin_us", RX_CFG_INT, "1000", "microseconds an idle worker spins before sleeping",
      0, 1000000, NULL },
    { "weights", RX_CFG_ENUM, "auto",
      "auto: repack into the SIMD path's layout where it has one (huge pages), else "
      "compute on the mmapped file; map: always zero copy; copy: GGML layout in huge pages",
      0, 0, "auto|map|copy" },
    { "guard_device_memory", RX_CFG_BOOL, "false",
      "test only: alloc() memory and plain weights are PROT_NONE outside kernel ops, so a "
      "host dereference of a device pointer crashes as it would on a GPU (also: environment "
      "RADIX_KCPU_GUARD=1)", 0, 0, NULL },
    { "graphs", RX_CFG_BOOL, "false",
      "test only: emulate graphs (graph_begin .. graph_end record the ops without running them, "
      "graph_launch replays them) so a model's graph path runs on the CPU as on a GPU; no "
      "speed-up (also: environment RADIX_KCPU_GRAPHS=1)", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

/* ------------------------------------------------------------- helpers -- */

void *rx_kcpu_scratch (struct rx_kcpu *k, size_t bytes)
{
    if (bytes <= k->scratch_cap) return k->scratch;
    size_t cap = bytes + bytes / 4;
    cap = (cap + 4095) / 4096 * 4096;
    void *p = aligned_alloc (64, cap);
    if (!p) return NULL;
    free (k->scratch);
    k->scratch = p;
    k->scratch_cap = cap;
    return p;
}

int rx_kcpu_threads_for (const struct rx_kcpu *k, double work)
{
    /* Waking a worker costs about a microsecond while it spins: not worth it
     * below some tens of thousands of element operations. */
    if (k->nth <= 1 || work < 32768.0) return 1;
    int n = (int) (work / 16384.0);
    return n < k->nth ? (n < 1 ? 1 : n) : k->nth;
}

/* A key of our section; its default when the host has no config.  A value
 * the host cannot parse is a configuration error (one line from the host). */
static int s_cfg_str (const struct rx_host *h, const char *key, const char *dflt,
                      const char **out, struct rx_err *err)
{
    *out = dflt;
    if (!h || !h->cfg_str) return RX_OK;
    int rc = h->cfg_str (h, key, out);
    if (rc == RX_ENOENT || !*out) {
        *out = dflt;
        return RX_OK;
    }
    if (rc != RX_OK)
        return rx_err_set (err, RX_ECONFIG, "kernels-cpu: [kernels.cpu] %s: invalid value (%s)",
                           key, rx_status_name (rc));
    return RX_OK;
}

static long s_ncpu (void)
{
    cpu_set_t set;
    if (sched_getaffinity (0, sizeof set, &set) == 0) {
        int n = CPU_COUNT (&set);
        if (n > 0) return n;
    }
    long n = sysconf (_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* ------------------------------------------------------------- instance -- */

static void s_destroy (void *be);

static int s_create (const struct rx_host *host, const struct rx_kernels_params *p, void **be,
                     struct rx_err *err)
{
    if (!be) return rx_err_set (err, RX_EINVAL, "kernels-cpu create: be is NULL");
    *be = NULL;
    int threads = 0;
    if (p) {
        if (p->struct_size < offsetof (struct rx_kernels_params, device) + sizeof (int32_t))
            return rx_err_set (err, RX_EABI, "kernels-cpu create: params struct_size %u too "
                               "small", p->struct_size);
        threads = p->threads;
        if (p->device != 0 && p->device != RX_KDEVICE_AUTO)
            return rx_err_set (err, RX_EINVAL, "kernels-cpu create: device %d: the CPU "
                               "backend has only device 0", p->device);
        if (p->struct_size >= offsetof (struct rx_kernels_params, rank) + sizeof (int32_t))
            RX_HLOG (host, RX_LOG_DEBUG, "create: rank %d, device %s -> %d", p->rank,
                     p->device == RX_KDEVICE_AUTO ? "auto" : "0", rx_kernels_pick_device (p, 1));
    }
    if (threads < 0 || threads > 4096)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu create: threads = %d (0..4096)", threads);
    if (threads == 0) threads = (int) s_ncpu ();

    const char *isa_name, *weights;
    int rc = s_cfg_str (host, "isa", "auto", &isa_name, err);
    if (rc == RX_OK) rc = s_cfg_str (host, "weights", "auto", &weights, err);
    if (rc != RX_OK) return rc;
    int64_t spin = 1000;
    if (host && host->cfg_int && host->cfg_int (host, "spin_us", &spin) != RX_OK) spin = 1000;
    int guard = 0;
    if (host && host->cfg_bool && host->cfg_bool (host, "guard_device_memory", &guard) != RX_OK)
        guard = 0;
    const char *genv = getenv ("RADIX_KCPU_GUARD");
    if (genv && *genv && strcmp (genv, "0") != 0) guard = 1;
    int graphs = 0;
    if (host && host->cfg_bool && host->cfg_bool (host, "graphs", &graphs) != RX_OK) graphs = 0;
    const char *grenv = getenv ("RADIX_KCPU_GRAPHS");
    if (grenv && *grenv && strcmp (grenv, "0") != 0) graphs = 1;
    int wmode;
    if (strcmp (weights, "auto") == 0) wmode = RX_KW_AUTO;
    else if (strcmp (weights, "map") == 0) wmode = RX_KW_MAP;
    else if (strcmp (weights, "copy") == 0) wmode = RX_KW_COPY;
    else
        return rx_err_set (err, RX_ECONFIG, "kernels-cpu: weights = %s: use auto, map or copy",
                           weights);
    int isa_id;
    rc = rx_kisa_from_name (isa_name, &isa_id, err);
    if (rc != RX_OK) return rc;

    struct rx_kcpu *k = calloc (1, sizeof *k);
    if (!k) return rx_err_set (err, RX_ENOMEM, "kernels-cpu create: out of memory");
    k->host = host;
    k->nth = threads;
    k->isa_id = isa_id;
    k->isa = rx_kisa_get (isa_id);
    k->weights_mode = wmode;
    k->pool = rx_kpool_new (threads, (int) spin, err);
    if (!k->pool) {
        free (k);
        return err ? err->code : RX_ENOMEM;
    }
    if (guard) {
        if (!(k->guard = rx_kguard_new (S_GUARD_RESERVE, err))) {
            rx_kpool_destroy (&k->pool);
            free (k);
            return err ? err->code : RX_ENOMEM;
        }
        rx_kguard_install_handler ();
        RX_HLOG (host, RX_LOG_INFO, "guard_device_memory: device memory is inaccessible to the "
                 "host outside kernel ops (test mode)");
    }
    if (graphs) {
        /* as many as kernels-cuda keeps by default */
        if (!(k->graphs = rx_kgraphs_new (64, err))) {
            rx_kguard_destroy (&k->guard);
            rx_kpool_destroy (&k->pool);
            free (k);
            return err ? err->code : RX_ENOMEM;
        }
        RX_HLOG (host, RX_LOG_INFO, "graphs: emulated (ops recorded at capture, replayed at "
                 "launch; test mode)");
    }
    RX_HLOG (host, RX_LOG_INFO, "%d threads, isa %s (cpu: %s), weights %s",
             threads, k->isa->name, rx_kisa_features (), weights);
    *be = k;
    return RX_OK;
}

static void s_weight_release (struct rx_kcpu *k, struct rx_kweight *w);

static void s_destroy (void *be)
{
    struct rx_kcpu *k = be;
    if (!k) return;
    rx_kpool_destroy (&k->pool);
    if (k->graphs)
        RX_HLOG (k->host, RX_LOG_DEBUG, "graphs: %zu kept, %llu launches", rx_kgraphs_count (k->graphs),
                 (unsigned long long) rx_kgraphs_launches (k->graphs));
    rx_kgraphs_destroy (&k->graphs);
    while (k->weights) s_weight_release (k, k->weights);
    while (k->bufs) {
        struct rx_kbuf *b = k->bufs;
        k->bufs = b->next;
        b->magic = 0;
        free (b->raw);
    }
    rx_kguard_destroy (&k->guard);   /* after the weights: they free their blocks */
    free (k->scratch);
    free (k->xq_buf);
    free (k);
}

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
static uint64_t s_mem_available (void)
{
    FILE *f = fopen ("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets (line, sizeof line, f))
        if (sscanf (line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose (f);
    return (uint64_t) kb * 1024;
}

static int s_info (void *be, struct rx_kernels_info *info)
{
    struct rx_kcpu *k = be;
    if (!k || !info || info->struct_size < offsetof (struct rx_kernels_info, threads))
        return RX_EINVAL;
    uint32_t sz = info->struct_size;
    info->name = "cpu";
    snprintf (info->device, sizeof info->device, "%s %s (%d threads)",
#if defined(__x86_64__)
              "x86-64",
#elif defined(__aarch64__)
              "aarch64",
#else
              "cpu",
#endif
              k->isa->name, k->nth);
    long pages = sysconf (_SC_PHYS_PAGES), psz = sysconf (_SC_PAGESIZE);
    info->mem_bytes = pages > 0 && psz > 0 ? (uint64_t) pages * (uint64_t) psz : 0;
    /* Guard mode: device pointers are not host-visible (that is its point). */
    info->caps = (k->guard ? 0 : RX_KCAP_HOST_VISIBLE) | RX_KCAP_KV_F16 | (k->graphs ? RX_KCAP_GRAPHS : 0);
    if (sz >= offsetof (struct rx_kernels_info, threads) + sizeof (int32_t))
        info->threads = k->nth;
    if (sz >= offsetof (struct rx_kernels_info, device_index) + sizeof (int32_t)) {
        info->mem_free = s_mem_available ();
        info->n_devices = 1;
        info->device_index = 0;
    }
    return RX_OK;
}

/* --------------------------------------------------------------- memory -- */

static int s_alloc (void *be, size_t bytes, size_t align, void **dptr, struct rx_err *err)
{
    struct rx_kcpu *k = be;
    if (!k || !dptr) return rx_err_set (err, RX_EINVAL, "kernels-cpu alloc: NULL argument");
    *dptr = NULL;
    if (align == 0) align = S_DEFAULT_ALIGN;
    if (align & (align - 1) || align > 1u << 21)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu alloc: align %zu is not a power of two "
                           "<= 2 MiB", align);
    if (align < S_DEFAULT_ALIGN) align = S_DEFAULT_ALIGN;
    if (k->guard) return rx_kguard_alloc (k->guard, bytes, align, dptr, err);
    size_t hdr = (sizeof (struct rx_kbuf) + align - 1) / align * align;
    if (bytes > SIZE_MAX - hdr - align)
        return rx_err_set (err, RX_ENOMEM, "kernels-cpu alloc: %zu bytes is too large", bytes);
    size_t total = hdr + (bytes ? bytes : 1);
    total = (total + align - 1) / align * align;
    void *raw = aligned_alloc (align, total);
    if (!raw)
        return rx_err_set (err, RX_ENOMEM, "kernels-cpu alloc: out of memory (%zu bytes)", bytes);
    uint8_t *user = (uint8_t *) raw + hdr;
    struct rx_kbuf *b = (struct rx_kbuf *) (user - sizeof *b);
    b->magic = S_BUF_MAGIC;
    b->raw = raw;
    b->bytes = bytes;
    b->prev = NULL;
    b->next = k->bufs;
    if (k->bufs) k->bufs->prev = b;
    k->bufs = b;
    *dptr = user;
    return RX_OK;
}

static void s_free (void *be, void *dptr)
{
    struct rx_kcpu *k = be;
    if (!k || !dptr) return;
    /* A graph may point into this memory: drop them (as kernels-cuda does). */
    rx_kgraphs_clear (k->graphs);
    if (k->guard && rx_kguard_contains (k->guard, dptr)) {
        if (rx_kguard_free (k->guard, dptr) != RX_OK)
            RX_HLOG (k->host, RX_LOG_ERROR, "free: %p is not the start of a guarded buffer; "
                     "ignored", dptr);
        return;
    }
    /* Look the pointer up rather than read a header in front of memory that
     * may not be ours. */
    struct rx_kbuf *b = k->bufs;
    while (b && (uint8_t *) b + sizeof *b != (uint8_t *) dptr) b = b->next;
    if (!b || b->magic != S_BUF_MAGIC) {
        RX_HLOG (k->host, RX_LOG_ERROR, "free: %p was not allocated here; ignored",
                 dptr);
        return;
    }
    b->magic = 0;
    if (b->prev) b->prev->next = b->next; else k->bufs = b->next;
    if (b->next) b->next->prev = b->prev;
    free (b->raw);
}

/* Guard mode: is p on the side of a copy it should be (dev: device memory
 * of this instance; else host memory)?  On a GPU the wrong side faults or
 * copies garbage. */
static int s_side (const struct rx_kcpu *k, const void *p, int dev, const char *what,
                   const char *arg, struct rx_err *err)
{
    if (!k->guard || rx_kguard_contains (k->guard, p) == dev) return RX_OK;
    return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: %s %p is %s (guard mode)", what, arg, p,
                       dev ? "not device memory of this backend" : "device memory: use copy_d2d");
}

static int s_copy (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                   struct rx_err *err, const char *what, int dst_dev, int src_dev)
{
    const struct rx_kcpu *k = be;
    if (!be) return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: no backend", what);
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: bad stream", what);
    if (bytes == 0) return RX_OK;
    if (!dst || !src) return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: NULL pointer", what);
    int rc = s_side (k, dst, dst_dev, what, "dst", err);
    if (rc == RX_OK) rc = s_side (k, src, src_dev, what, "src", err);
    if (rc != RX_OK) return rc;
    memmove (dst, src, bytes);
    return RX_OK;
}

static int s_copy_h2d (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                       struct rx_err *err)
{
    return s_copy (be, s, dst, src, bytes, err, "copy_h2d", 1, 0);
}

static int s_copy_d2h (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                       struct rx_err *err)
{
    return s_copy (be, s, dst, src, bytes, err, "copy_d2h", 0, 1);
}

static int s_copy_d2d (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                       struct rx_err *err)
{
    return s_copy (be, s, dst, src, bytes, err, "copy_d2d", 1, 1);
}

static int s_memset (void *be, rx_kstream_t *s, void *dst, int byte, size_t bytes,
                     struct rx_err *err)
{
    if (!be) return rx_err_set (err, RX_EINVAL, "kernels-cpu memset: no backend");
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu memset: bad stream");
    if (bytes == 0) return RX_OK;
    if (!dst) return rx_err_set (err, RX_EINVAL, "kernels-cpu memset: NULL pointer");
    int rc = s_side (be, dst, 1, "memset", "dst", err);
    if (rc != RX_OK) return rc;
    memset (dst, byte, bytes);
    return RX_OK;
}

/* ------------------------------------------------------ streams, graphs -- */

/* An op a graph cannot hold was issued during a capture (emulated graphs):
 * as a CUDA capture does, the capture is dropped and the op fails. */
static int s_not_capturable (struct rx_kcpu *k, const char *op, struct rx_err *err)
{
    uint64_t key = 0;
    rx_kgraphs_capturing (k->graphs, &key);
    rx_kgraphs_abort (k->graphs);
    return rx_err_set (err, RX_EINVAL, "kernels-cpu %s during the capture of graph %llu: a graph "
                       "cannot hold it (the capture is dropped)", op, (unsigned long long) key);
}

static int s_stream_create (void *be, rx_kstream_t **s, struct rx_err *err)
{
    if (!be || !s) return rx_err_set (err, RX_EINVAL, "kernels-cpu stream_create: NULL argument");
    *s = malloc (sizeof **s);
    if (!*s) return rx_err_set (err, RX_ENOMEM, "kernels-cpu stream_create: out of memory");
    (*s)->magic = S_STREAM_MAGIC;
    return RX_OK;
}

static void s_stream_destroy (void *be, rx_kstream_t *s)
{
    (void) be;
    if (!s || s->magic != S_STREAM_MAGIC) return;
    s->magic = 0;
    free (s);
}

static int s_synchronize (void *be, rx_kstream_t *s, struct rx_err *err)
{
    if (!be) return rx_err_set (err, RX_EINVAL, "kernels-cpu synchronize: no backend");
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu synchronize: bad stream");
    struct rx_kcpu *k = be;
    if (rx_kgraphs_capturing (k->graphs, NULL)) return s_not_capturable (k, "synchronize", err);
    return RX_OK;   /* every op already ran to completion */
}

static int s_graph_begin (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    struct rx_kcpu *k = be;
    if (!k) return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_begin: no backend");
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_begin: bad stream");
    if (!k->graphs)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cpu: graph %llu not captured (no graphs on "
                           "the CPU): run the ops eagerly", (unsigned long long) key);
    return rx_kgraphs_begin (k->graphs, key, err);
}

static int s_graph_end (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    struct rx_kcpu *k = be;
    if (!k) return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_end: no backend");
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_end: bad stream");
    if (!k->graphs)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cpu: graph %llu: no capture in progress "
                           "(no graphs on the CPU)", (unsigned long long) key);
    return rx_kgraphs_end (k->graphs, key, err);
}

static int s_graph_launch (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    struct rx_kcpu *k = be;
    if (!k) return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_launch: no backend");
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_launch: bad stream");
    if (!k->graphs)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cpu: graph %llu was never captured (no "
                           "graphs on the CPU)", (unsigned long long) key);
    return rx_kgraphs_launch (k->graphs, be, s, key, err);
}

static int s_graph_has (void *be, uint64_t key)
{
    struct rx_kcpu *k = be;
    return k && rx_kgraphs_has (k->graphs, key);
}

/* -------------------------------------------------------------- weights -- */

/* Memory for a weight we own: big ones are mapped on 2 MiB boundaries and
 * advised to use huge pages (decode streams every weight each token, so
 * TLB misses count); small ones come from malloc (*mapped = 0). */
static void *s_weight_mem (size_t bytes, size_t *mapped)
{
    *mapped = 0;
    if (bytes < (1u << 20)) return aligned_alloc (64, (bytes + 63) / 64 * 64);
    size_t len = (bytes + (1u << 21) - 1) & ~(size_t) ((1u << 21) - 1);
    void *m = mmap (NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise (m, len, MADV_HUGEPAGE);
#endif
    *mapped = len;
    return m;
}

static int s_weight_ok (const struct rx_kweight *w)
{
    return w && w->magic == RX_KWEIGHT_MAGIC;
}

static int s_weight_load (void *be, const struct rx_weight_view *v, rx_kweight_t **out,
                          struct rx_err *err)
{
    struct rx_kcpu *k = be;
    if (!k || !v || !out) return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: NULL argument");
    *out = NULL;
    const char *name = v->name ? v->name : "(unnamed)";
    if (!rx_quant_supported (v->dtype) || v->dtype == RX_Q8_K)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cpu weight_load: %s: dtype %s (%d) is not "
                           "supported (f32 f16 bf16 q8_0 q4_0 q4_1 q4_K q5_K q6_K)", name,
                           rx_dtype_name (v->dtype), v->dtype);
    if (v->n_dims < 1 || v->n_dims > 4)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: %s: n_dims %u (1..4)",
                           name, v->n_dims);
    uint64_t n_el = 1;
    for (int i = 0; i < 4; i++) {
        if (v->ne[i] == 0 || v->ne[i] > (1ull << 40) || (i >= (int) v->n_dims && v->ne[i] != 1))
            return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: %s: bad ne[%d] = %llu",
                               name, i, (unsigned long long) v->ne[i]);
        if (n_el > UINT64_MAX / v->ne[i])
            return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: %s: too many elements",
                               name);
        n_el *= v->ne[i];
    }
    size_t row_bytes = rx_dtype_row_bytes (v->dtype, (size_t) v->ne[0]);
    if (row_bytes == 0)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: %s: ne[0] = %llu is not a "
                           "multiple of the %s block (%zu)", name, (unsigned long long) v->ne[0],
                           rx_dtype_name (v->dtype), rx_dtype_block (v->dtype));
    uint64_t rows = n_el / v->ne[0];
    if (rows > SIZE_MAX / row_bytes || (size_t) rows * row_bytes != v->nbytes)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: %s: %zu bytes given, "
                           "shape and dtype need %llu", name, v->nbytes,
                           (unsigned long long) (rows * row_bytes));
    if (!v->data)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_load: %s: data is NULL", name);
    struct rx_kweight *w = calloc (1, sizeof *w);
    if (!w) return rx_err_set (err, RX_ENOMEM, "kernels-cpu weight_load: out of memory");
    w->magic = RX_KWEIGHT_MAGIC;
    w->dtype = v->dtype;
    w->n_dims = v->n_dims;
    memcpy (w->ne, v->ne, sizeof w->ne);
    w->row_bytes = row_bytes;
    w->data = v->data;
    size_t rp_rb = 0;
    if (k->weights_mode == RX_KW_AUTO && k->isa->repack_row_bytes && v->n_dims >= 2)
        rp_rb = k->isa->repack_row_bytes (v->dtype, (size_t) v->ne[0]);
    if (rp_rb || (k->weights_mode == RX_KW_COPY && v->nbytes >= (1u << 20))) {
        size_t bytes = rp_rb ? rp_rb * (size_t) rows : v->nbytes;
        void *m = s_weight_mem (bytes, &w->owned_bytes);
        if (!m) {
            free (w);
            return rx_err_set (err, RX_ENOMEM, "kernels-cpu weight_load: %s: cannot allocate "
                               "%zu bytes: %s", name, bytes, strerror (errno));
        }
        if (rp_rb) {
            k->isa->repack (v->dtype, v->data, m, (size_t) v->ne[0], (size_t) rows);
            w->row_bytes = rp_rb;
            w->repacked = 1;
        } else {
            memcpy (m, v->data, v->nbytes);
        }
        w->owned = m;
        w->data = m;
    }
    if (k->guard && !w->repacked) {
        /* The op reads the weight where weight_data() points: there. */
        int rc = rx_kguard_alloc (k->guard, v->nbytes, 64, &w->guarded, err);
        if (rc != RX_OK) {
            if (w->owned && w->owned_bytes) munmap (w->owned, w->owned_bytes);
            else free (w->owned);
            free (w);
            return rc;
        }
        memcpy (w->guarded, w->data, v->nbytes);   /* inside weight_load: open */
        w->data = w->guarded;
        if (w->owned && w->owned_bytes) munmap (w->owned, w->owned_bytes);
        else free (w->owned);
        w->owned = NULL;
        w->owned_bytes = 0;
    }
    w->next = k->weights;
    if (k->weights) k->weights->prev = w;
    k->weights = w;
    *out = w;
    return RX_OK;
}

static void s_weight_release (struct rx_kcpu *k, struct rx_kweight *w)
{
    if (w->prev) w->prev->next = w->next; else k->weights = w->next;
    if (w->next) w->next->prev = w->prev;
    if (w->owned && w->owned_bytes) munmap (w->owned, w->owned_bytes);
    else free (w->owned);
    if (w->guarded) rx_kguard_free (k->guard, w->guarded);
    w->magic = 0;
    free (w);
}

static void s_weight_free (void *be, rx_kweight_t *w)
{
    struct rx_kcpu *k = be;
    if (!k || !w) return;
    struct rx_kweight *it = k->weights;
    while (it && it != w) it = it->next;
    if (!it) {
        RX_HLOG (k->host, RX_LOG_ERROR, "weight_free: %p is not a weight; ignored",
                 (void *) w);
        return;
    }
    rx_kgraphs_clear (k->graphs);
    s_weight_release (k, w);
}

static int s_weight_data (void *be, const rx_kweight_t *w, const void **dptr,
                          struct rx_err *err)
{
    if (!be || !dptr || !s_weight_ok (w))
        return rx_err_set (err, RX_EINVAL, "kernels-cpu weight_data: bad argument");
    if (w->dtype != RX_F32 && w->dtype != RX_F16 && w->dtype != RX_BF16)
        return rx_err_set (err, RX_ENOTSUP, "kernels-cpu weight_data: a %s weight has no "
                           "plain element array", rx_dtype_name (w->dtype));
    *dptr = w->data;
    return RX_OK;
}

/* ------------------------------------------------------------------ ops -- */

/* Common checks: a backend, a valid stream, a matrix view fits its ld. */
#define S_BEGIN(opname)                                                              \
    struct rx_kcpu *k = be;                                                          \
    static const char *const s_op = opname;                                          \
    if (!k) return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: no backend", s_op);  \
    if (s && s->magic != S_STREAM_MAGIC)                                             \
        return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: bad stream", s_op)

#define S_NEED(cond, ...)                                                            \
    do { if (!(cond)) return rx_err_set (err, RX_EINVAL, __VA_ARGS__); } while (0)

/* Guard mode: a buffer of an op must be device memory of this instance (a
 * host pointer handed to an op works on the CPU and faults on a GPU). */
#define S_DEV(ptr)                                                                   \
    S_NEED (!k->guard || !(ptr) || rx_kguard_contains (k->guard, (ptr)),             \
            "kernels-cpu %s: %s = %p is not device memory of this backend (guard mode: "  \
            "a host pointer passed to an op)", s_op, #ptr, (const void *) (ptr))

/* A rows x dim view with leading dimension ld (ld 0 allowed when bcast). */
#define S_VIEW(ptr, ld, rows, dim, bcast)                                            \
    S_NEED ((ptr) != NULL || (rows) == 0, "kernels-cpu %s: %s is NULL", s_op, #ptr); \
    S_DEV (ptr);                                                                     \
    S_NEED ((ld) >= (dim) || ((bcast) && (ld) == 0) || (rows) <= 1,                  \
            "kernels-cpu %s: %s = %zu is smaller than dim %zu", s_op, #ld, (size_t) (ld), \
            (size_t) (dim))

static int s_get_rows (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *ids,
                       size_t n, float *out, size_t ldo, struct rx_err *err)
{
    S_BEGIN ("get_rows");
    S_NEED (s_weight_ok (w), "kernels-cpu get_rows: bad weight handle");
    S_NEED (n == 0 || ids, "kernels-cpu get_rows: ids is NULL");
    S_DEV (ids);
    S_VIEW (out, ldo, n, (size_t) w->ne[0], 0);
    uint64_t rows = w->ne[1] * w->ne[2] * w->ne[3];
    for (size_t i = 0; i < n; i++)
        S_NEED (ids[i] >= 0 && (uint64_t) ids[i] < rows,
                "kernels-cpu get_rows: id %d at %zu is outside 0..%llu", ids[i], i,
                (unsigned long long) rows - 1);
    rx_kcpu_get_rows (k, w, ids, n, out, ldo);
    return RX_OK;
}

static int s_rms_norm (void *be, rx_kstream_t *s, const float *x, size_t ldx, const float *w,
                       float *y, size_t ldy, size_t rows, size_t dim, float eps,
                       struct rx_err *err)
{
    S_BEGIN ("rms_norm");
    S_NEED (dim > 0, "kernels-cpu rms_norm: dim is 0");
    S_VIEW (x, ldx, rows, dim, 0);
    S_VIEW (y, ldy, rows, dim, 0);
    S_NEED (eps >= 0.f, "kernels-cpu rms_norm: eps %g < 0", (double) eps);
    S_DEV (w);
    rx_kcpu_rms_norm (k, x, ldx, w, y, ldy, rows, dim, eps);
    return RX_OK;
}

static int s_rope (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t n_tok,
                   size_t n_head, size_t ld_head, const int32_t *pos,
                   const struct rx_rope_params *p, struct rx_err *err)
{
    S_BEGIN ("rope");
    S_NEED (p && p->struct_size >= offsetof (struct rx_rope_params, beta_slow) + sizeof (float),
            "kernels-cpu rope: params missing or too old");
    struct rx_rope_params rp;
    memset (&rp, 0, sizeof rp);
    memcpy (&rp, p, p->struct_size < sizeof rp ? p->struct_size : sizeof rp);
    S_NEED (rp.mode == RX_ROPE_NORMAL || rp.mode == RX_ROPE_NEOX,
            "kernels-cpu rope: mode %d (0 normal, 2 neox)", rp.mode);
    S_NEED (rp.n_rot > 0 && rp.n_rot % 2 == 0 && rp.n_rot <= 2048,
            "kernels-cpu rope: n_rot %d must be even, 2..2048", rp.n_rot);
    S_NEED (n_head == 0 || ld_head >= (size_t) rp.n_rot || n_head == 1,
            "kernels-cpu rope: ld_head %zu < n_rot %d", ld_head, rp.n_rot);
    S_NEED (n_tok <= 1 || ldx >= (n_head - 1) * ld_head + (size_t) rp.n_rot,
            "kernels-cpu rope: ldx %zu too small for %zu heads", ldx, n_head);
    S_NEED (rp.freq_base > 0.f && rp.freq_scale > 0.f,
            "kernels-cpu rope: freq_base and freq_scale must be > 0");
    S_NEED (n_tok == 0 || (x && pos), "kernels-cpu rope: NULL pointer");
    S_DEV (x);
    S_DEV (pos);
    S_DEV (rp.freq_factors);
    rx_kcpu_rope (k, x, ldx, n_tok, n_head, ld_head, pos, &rp);
    return RX_OK;
}

static int s_matmul (void *be, rx_kstream_t *s, const rx_kweight_t *w, int expert,
                     const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                     uint32_t flags, struct rx_err *err)
{
    S_BEGIN ("matmul");
    S_NEED (s_weight_ok (w), "kernels-cpu matmul: bad weight handle");
    S_NEED (w->n_dims >= 2 && w->ne[3] == 1, "kernels-cpu matmul: weight must be 2-D or 3-D");
    S_NEED (k->isa->mm_supported (w->dtype), "kernels-cpu matmul: no %s kernel on path %s",
            rx_dtype_name (w->dtype), k->isa->name);
    if (w->ne[2] > 1 || w->n_dims == 3)
        S_NEED (expert >= 0 && (uint64_t) expert < w->ne[2],
                "kernels-cpu matmul: expert %d outside 0..%llu", expert,
                (unsigned long long) w->ne[2] - 1);
    else
        S_NEED (expert <= 0, "kernels-cpu matmul: expert %d for a 2-D weight", expert);
    S_NEED ((flags & ~RX_MM_ACCUMULATE) == 0, "kernels-cpu matmul: unknown flags 0x%x", flags);
    S_VIEW (x, ldx, n, (size_t) w->ne[0], 0);
    S_VIEW (y, ldy, n, (size_t) w->ne[1], 0);
    if (n == 0) return RX_OK;
    return rx_kcpu_matmul (k, w, expert, x, ldx, y, ldy, n, flags, err);
}

static int s_swiglu (void *be, rx_kstream_t *s, const float *gate, size_t ldg, const float *up,
                     size_t ldu, float *out, size_t ldo, size_t rows, size_t dim,
                     struct rx_err *err)
{
    S_BEGIN ("swiglu");
    S_VIEW (gate, ldg, rows, dim, 0);
    S_VIEW (up, ldu, rows, dim, 0);
    S_VIEW (out, ldo, rows, dim, 0);
    rx_kcpu_swiglu (k, gate, ldg, up, ldu, out, ldo, rows, dim);
    return RX_OK;
}

static int s_binop (void *be, rx_kstream_t *s, int op, const char *name, const float *a,
                    size_t lda, const float *b, size_t ldb, float *y, size_t ldy, size_t rows,
                    size_t dim, struct rx_err *err)
{
    struct rx_kcpu *k = be;
    const char *s_op = name;
    if (!k) return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: no backend", s_op);
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu %s: bad stream", s_op);
    S_VIEW (a, lda, rows, dim, 0);
    S_VIEW (b, ldb, rows, dim, 1);
    S_VIEW (y, ldy, rows, dim, 0);
    rx_kcpu_binop (k, op, a, lda, b, ldb, y, ldy, rows, dim);
    return RX_OK;
}

static int s_add (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b,
                  size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    return s_binop (be, s, RX_KOP_ADD, "add", a, lda, b, ldb, y, ldy, rows, dim, err);
}

static int s_mul (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b,
                  size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    return s_binop (be, s, RX_KOP_MUL, "mul", a, lda, b, ldb, y, ldy, rows, dim, err);
}

static int s_scale (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy,
                    size_t rows, size_t dim, float alpha, struct rx_err *err)
{
    S_BEGIN ("scale");
    S_VIEW (x, ldx, rows, dim, 0);
    S_VIEW (y, ldy, rows, dim, 0);
    rx_kcpu_scale (k, x, ldx, y, ldy, rows, dim, alpha);
    return RX_OK;
}

static int s_softmax (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t rows, size_t dim,
                      float scale, struct rx_err *err)
{
    S_BEGIN ("softmax");
    S_NEED (dim > 0, "kernels-cpu softmax: dim is 0");
    S_VIEW (x, ldx, rows, dim, 0);
    rx_kcpu_softmax (k, x, ldx, rows, dim, scale);
    return RX_OK;
}

static int s_sigmoid (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y,
                      size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    S_BEGIN ("sigmoid");
    S_VIEW (x, ldx, rows, dim, 0);
    S_VIEW (y, ldy, rows, dim, 0);
    rx_kcpu_sigmoid (k, x, ldx, y, ldy, rows, dim);
    return RX_OK;
}

static int s_copy2d (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y,
                     size_t ldy, size_t rows, size_t dim, struct rx_err *err)
{
    S_BEGIN ("copy2d");
    S_VIEW (x, ldx, rows, dim, 0);
    S_VIEW (y, ldy, rows, dim, 0);
    rx_kcpu_copy2d (k, x, ldx, y, ldy, rows, dim);
    return RX_OK;
}

static int s_argmax (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows,
                     size_t dim, int32_t *out, struct rx_err *err)
{
    S_BEGIN ("argmax");
    S_NEED (dim > 0 && dim <= INT32_MAX, "kernels-cpu argmax: dim %zu (1..2^31-1)", dim);
    S_VIEW (x, ldx, rows, dim, 0);
    S_NEED (rows == 0 || out, "kernels-cpu argmax: out is NULL");
    S_DEV (out);
    rx_kcpu_argmax (k, x, ldx, rows, dim, out);
    return RX_OK;
}

static int s_topk (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows,
                   size_t dim, size_t kk, float *vals, int32_t *idx, struct rx_err *err)
{
    S_BEGIN ("topk");
    S_NEED (dim > 0 && dim <= INT32_MAX, "kernels-cpu topk: dim %zu (1..2^31-1)", dim);
    S_NEED (kk >= 1 && kk <= dim, "kernels-cpu topk: k = %zu outside 1..%zu", kk, dim);
    S_VIEW (x, ldx, rows, dim, 0);
    S_NEED (rows == 0 || idx, "kernels-cpu topk: idx is NULL");
    S_DEV (idx);
    S_DEV (vals);
    rx_kcpu_topk (k, x, ldx, rows, dim, kk, vals, idx);
    return RX_OK;
}

static int s_moe_route (void *be, rx_kstream_t *s, const float *probs, const float *sel, size_t ld,
                        size_t rows, size_t n_expert, size_t n_group, size_t topk_group, size_t kk,
                        int norm, float scale, int32_t *ids, float *w, struct rx_err *err)
{
    S_BEGIN ("moe_route");
    S_NEED (n_expert >= 1 && n_expert <= RX_KCPU_MOE_MAX_EXPERT,
            "kernels-cpu moe_route: n_expert %zu (1..%d)", n_expert, RX_KCPU_MOE_MAX_EXPERT);
    S_NEED (kk >= 1 && kk <= n_expert, "kernels-cpu moe_route: k = %zu outside 1..%zu", kk, n_expert);
    if (n_group > 1) {
        S_NEED (n_expert % n_group == 0, "kernels-cpu moe_route: %zu experts do not split into %zu groups",
                n_expert, n_group);
        S_NEED (topk_group >= 1 && topk_group <= n_group,
                "kernels-cpu moe_route: topk_group %zu outside 1..%zu", topk_group, n_group);
        S_NEED (topk_group * (n_expert / n_group) >= kk,
                "kernels-cpu moe_route: %zu groups of %zu experts hold fewer than k = %zu", topk_group,
                n_expert / n_group, kk);
    }
    S_VIEW (probs, ld, rows, n_expert, 0);
    S_VIEW (sel, ld, rows, n_expert, 0);
    S_NEED (rows == 0 || (ids && w), "kernels-cpu moe_route: ids or w is NULL");
    S_DEV (ids);
    S_DEV (w);
    if (rows == 0) return RX_OK;
    rx_kcpu_moe_route (k, probs, sel, rows > 1 ? ld : n_expert, rows, n_expert, n_group, topk_group, kk,
                       norm, scale, ids, w);
    return RX_OK;
}

/* -- the MoE expert pass (kernel ABI 1.3) -- */

static int s_moe_sort (void *be, rx_kstream_t *s, const int32_t *ids, size_t n_tok, size_t kk,
                       size_t n_expert, int32_t *offsets, int32_t *row, int32_t *src,
                       struct rx_err *err)
{
    S_BEGIN ("moe_sort");
    S_NEED (n_expert >= 1 && n_expert < INT32_MAX, "kernels-cpu moe_sort: n_expert %zu (1..2^31-2)",
            n_expert);
    S_NEED (kk >= 1, "kernels-cpu moe_sort: k is 0");
    S_NEED (n_tok <= INT32_MAX / kk, "kernels-cpu moe_sort: %zu tokens x k = %zu choices do not fit "
            "int32 rows", n_tok, kk);
    S_NEED (offsets, "kernels-cpu moe_sort: offsets is NULL");
    S_DEV (offsets);
    S_NEED (n_tok == 0 || (ids && row && src), "kernels-cpu moe_sort: ids, row or src is NULL");
    S_DEV (ids);
    S_DEV (row);
    S_DEV (src);
    rx_kcpu_moe_sort (ids, n_tok, kk, n_expert, offsets, row, src);
    return RX_OK;
}

static int s_gather_rows (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *idx,
                          size_t n, size_t dim, float *y, size_t ldy, struct rx_err *err)
{
    S_BEGIN ("gather_rows");
    S_NEED (n == 0 || (x && idx), "kernels-cpu gather_rows: x or idx is NULL");
    S_DEV (x);
    S_DEV (idx);
    /* x's rows are picked by idx: its ld matters even for one row. */
    S_NEED (n == 0 || ldx >= dim, "kernels-cpu gather_rows: ldx = %zu is smaller than dim %zu",
            ldx, dim);
    S_VIEW (y, ldy, n, dim, 0);
    if (n == 0 || dim == 0) return RX_OK;
    rx_kcpu_gather_rows (k, x, ldx, idx, n, dim, y, ldy);
    return RX_OK;
}

/* The offsets are device memory, which the CPU can read: they are checked
 * here (offsets[0] = 0, nondecreasing).  A GPU backend cannot check them
 * without a synchronize; it trusts moe_sort's.  Whether offsets[n_expert]
 * exceeds the rows the caller allocated is not knowable here either. */
static int s_matmul_grouped (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *offsets,
                             size_t row0, const float *x, size_t ldx, float *y, size_t ldy,
                             size_t n, uint32_t flags, struct rx_err *err)
{
    S_BEGIN ("matmul_grouped");
    S_NEED (s_weight_ok (w), "kernels-cpu matmul_grouped: bad weight handle");
    S_NEED (w->n_dims >= 3 && w->ne[3] == 1,
            "kernels-cpu matmul_grouped: weight must be 3-D [in, out, n_expert] (it has %u dims)",
            w->n_dims);
    S_NEED (w->ne[2] < INT32_MAX, "kernels-cpu matmul_grouped: %llu experts",
            (unsigned long long) w->ne[2]);
    S_NEED (k->isa->mm_supported (w->dtype), "kernels-cpu matmul_grouped: no %s kernel on path %s",
            rx_dtype_name (w->dtype), k->isa->name);
    S_NEED ((flags & ~RX_MM_ACCUMULATE) == 0, "kernels-cpu matmul_grouped: unknown flags 0x%x", flags);
    S_VIEW (x, ldx, n, (size_t) w->ne[0], 0);
    S_VIEW (y, ldy, n, (size_t) w->ne[1], 0);
    S_NEED (n == 0 || offsets, "kernels-cpu matmul_grouped: offsets is NULL");
    S_DEV (offsets);
    if (n == 0) return RX_OK;
    S_NEED (row0 <= INT32_MAX && n <= (size_t) INT32_MAX - row0,
            "kernels-cpu matmul_grouped: rows %zu + %zu exceed int32", row0, n);
    const size_t n_expert = (size_t) w->ne[2];
    S_NEED (offsets[0] == 0, "kernels-cpu matmul_grouped: offsets[0] = %d, not 0", offsets[0]);
    for (size_t e = 0; e < n_expert; e++)
        S_NEED (offsets[e + 1] >= offsets[e],
                "kernels-cpu matmul_grouped: offsets[%zu] = %d < offsets[%zu] = %d (offsets must "
                "be nondecreasing, as moe_sort writes them)", e + 1, offsets[e + 1], e, offsets[e]);
    return rx_kcpu_matmul_grouped (k, w, offsets, row0, x, ldx, y, ldy, n, flags, err);
}

static int s_moe_combine (void *be, rx_kstream_t *s, const float *y, size_t ldy, const int32_t *row,
                          const float *w, size_t n_tok, size_t kk, size_t dim, float *out, size_t ldo,
                          uint32_t flags, struct rx_err *err)
{
    S_BEGIN ("moe_combine");
    S_NEED (kk >= 1, "kernels-cpu moe_combine: k is 0");
    S_NEED ((flags & ~RX_MM_ACCUMULATE) == 0, "kernels-cpu moe_combine: unknown flags 0x%x", flags);
    S_NEED (n_tok <= SIZE_MAX / kk, "kernels-cpu moe_combine: %zu tokens x k = %zu overflow", n_tok,
            kk);
    S_NEED (n_tok == 0 || (y && row && w), "kernels-cpu moe_combine: y, row or w is NULL");
    S_DEV (y);
    S_DEV (row);
    S_DEV (w);
    /* y's rows are picked by row: its ld matters even for one token. */
    S_NEED (n_tok == 0 || ldy >= dim, "kernels-cpu moe_combine: ldy = %zu is smaller than dim %zu",
            ldy, dim);
    S_VIEW (out, ldo, n_tok, dim, 0);
    if (n_tok == 0 || dim == 0) return RX_OK;
    rx_kcpu_moe_combine (k, y, ldy, row, w, n_tok, kk, dim, out, ldo, (flags & RX_MM_ACCUMULATE) != 0);
    return RX_OK;
}

/* -- the low-latency expert-parallel exchange (kernel ABI 1.4) -- */

/* The offsets, row and src are device memory, which the CPU can read:
 * checked here (moe_sort's shape: offsets[0] = 0, nondecreasing, at most
 * n_tok * k rows; src rows of x), so a bad one is an error rather than a
 * write past a block.  A GPU backend trusts moe_sort's. */
static int s_moe_ll_pack (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *ids,
                          const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n_tok,
                          size_t kk, size_t n_expert, size_t n_rank, size_t slots, size_t hrows,
                          size_t dim, float *send, int32_t *slot_of, struct rx_err *err)
{
    S_BEGIN ("moe_ll_pack");
    int rc = rx_ll_pack_args ("kernels-cpu", x, ldx, ids, offsets, row, src, n_tok, kk, n_expert, n_rank, slots,
                              hrows, dim, send, slot_of, (size_t) INT32_MAX, err);
    if (rc != RX_OK) return rc;
    S_DEV (x);
    S_DEV (ids);
    S_DEV (offsets);
    S_DEV (row);
    S_DEV (src);
    S_DEV (send);
    S_DEV (slot_of);
    const int32_t n = (int32_t) (n_tok * kk);
    S_NEED (offsets[0] == 0, "kernels-cpu moe_ll_pack: offsets[0] = %d, not 0", offsets[0]);
    for (size_t e = 0; e < n_expert; e++)
        S_NEED (offsets[e + 1] >= offsets[e] && offsets[e + 1] <= n,
                "kernels-cpu moe_ll_pack: offsets[%zu] = %d after offsets[%zu] = %d (moe_sort's "
                "offsets are nondecreasing, at most n_tok * k = %d)", e + 1, offsets[e + 1], e,
                offsets[e], n);
    for (int32_t r = 0; r < offsets[n_expert]; r++)
        S_NEED (src[r] >= 0 && (size_t) src[r] < n_tok, "kernels-cpu moe_ll_pack: src[%d] = %d is "
                "not a token (0..%zu)", r, src[r], n_tok - 1);
    rx_kcpu_moe_ll_pack (x, ldx, ids, offsets, row, src, n_tok, kk, n_expert, n_rank, slots, hrows,
                         dim, send, slot_of);
    return RX_OK;
}

/* The counts arrived from peers and are clamped, not checked (as on a
 * GPU): both backends compute the same from a corrupted header. */
static int s_moe_ll_unpack (void *be, rx_kstream_t *s, const float *recv, size_t n_rank, size_t slots,
                            size_t hrows, size_t dim, size_t n_local, int32_t *offsets, int32_t *order,
                            int32_t *back, struct rx_err *err)
{
    S_BEGIN ("moe_ll_unpack");
    int rc = rx_ll_unpack_args ("kernels-cpu", recv, n_rank, slots, hrows, dim, n_local, offsets, order, back,
                                (size_t) INT32_MAX, err);
    if (rc != RX_OK) return rc;
    S_DEV (recv);
    S_DEV (offsets);
    S_DEV (order);
    S_DEV (back);
    rx_kcpu_moe_ll_unpack (recv, n_rank, slots, hrows, dim, n_local, offsets, order, back);
    return RX_OK;
}

static int s_pool_check (const struct rx_kv_pool *pool, const char *s_op, struct rx_err *err)
{
    S_NEED (pool, "kernels-cpu %s: pool is NULL", s_op);
    S_NEED (pool->k && pool->v, "kernels-cpu %s: pool buffers are NULL", s_op);
    S_NEED (pool->dtype == RX_F32 || pool->dtype == RX_F16,
            "kernels-cpu %s: pool dtype %s (f32 or f16)", s_op, rx_dtype_name (pool->dtype));
    S_NEED (pool->n_kv_head > 0 && pool->hd_k > 0 && pool->hd_v > 0,
            "kernels-cpu %s: pool n_kv_head %d, hd_k %d, hd_v %d must be > 0", s_op,
            pool->n_kv_head, pool->hd_k, pool->hd_v);
    S_NEED (pool->n_slots > 0 && pool->n_slots <= INT32_MAX,
            "kernels-cpu %s: pool n_slots %llu (1..2^31-1)", s_op,
            (unsigned long long) pool->n_slots);
    return RX_OK;
}

static int s_kv_store (void *be, rx_kstream_t *s, const struct rx_kv_pool *pool,
                       const float *kx, size_t ldk, const float *vx, size_t ldv,
                       const int32_t *slots, size_t n_tok, struct rx_err *err)
{
    S_BEGIN ("kv_store");
    int rc = s_pool_check (pool, s_op, err);
    if (rc != RX_OK) return rc;
    size_t nk = (size_t) pool->n_kv_head * (size_t) pool->hd_k;
    size_t nv = (size_t) pool->n_kv_head * (size_t) pool->hd_v;
    S_VIEW (kx, ldk, n_tok, nk, 0);
    S_VIEW (vx, ldv, n_tok, nv, 0);
    S_NEED (n_tok == 0 || slots, "kernels-cpu kv_store: slots is NULL");
    S_DEV (slots);
    S_DEV (pool->k);
    S_DEV (pool->v);
    for (size_t t = 0; t < n_tok; t++)
        S_NEED (slots[t] >= 0 && (uint64_t) slots[t] < pool->n_slots,
                "kernels-cpu kv_store: slot %d for token %zu is outside the pool (%llu slots)",
                slots[t], t, (unsigned long long) pool->n_slots);
    rx_kcpu_kv_store (k, pool, kx, ldk, vx, ldv, slots, n_tok);
    return RX_OK;
}

static int s_attention (void *be, rx_kstream_t *s, const float *q, size_t ldq,
                        const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                        const struct rx_attn_params *p, float *out, size_t ldo,
                        struct rx_err *err)
{
    S_BEGIN ("attention");
    int rc = s_pool_check (pool, s_op, err);
    if (rc != RX_OK) return rc;
    S_NEED (b && p, "kernels-cpu attention: batch or params is NULL");
    S_NEED (p->struct_size >= offsetof (struct rx_attn_params, window) + sizeof (int32_t),
            "kernels-cpu attention: params struct_size %u too small", p->struct_size);
    S_NEED (p->n_head > 0 && p->n_head % pool->n_kv_head == 0,
            "kernels-cpu attention: n_head %d is not a multiple of n_kv_head %d", p->n_head,
            pool->n_kv_head);
    S_NEED (p->window >= 0 && p->softcap >= 0.f,
            "kernels-cpu attention: window %d and softcap %g must be >= 0", p->window,
            (double) p->softcap);
    S_NEED (b->n_seq >= 0 && b->n_tokens >= 0, "kernels-cpu attention: negative counts");
    if (b->n_tokens == 0) return RX_OK;
    S_NEED (b->n_seq > 0 && b->q_start && b->kv_start && b->slots && b->q_pos,
            "kernels-cpu attention: batch arrays missing");
    S_DEV (b->q_start);
    S_DEV (b->kv_start);
    S_DEV (b->slots);
    S_DEV (b->q_pos);
    S_DEV (pool->k);
    S_DEV (pool->v);
    size_t qd = (size_t) p->n_head * (size_t) pool->hd_k;
    size_t od = (size_t) p->n_head * (size_t) pool->hd_v;
    S_VIEW (q, ldq, (size_t) b->n_tokens, qd, 0);
    S_VIEW (out, ldo, (size_t) b->n_tokens, od, 0);
    rc = rx_kcpu_attn_check (pool, b, err);
    if (rc != RX_OK) return rc;
    return rx_kcpu_attention (k, q, ldq, pool, b, p, out, ldo, err);
}

/* --------------------------------------------------- guard-mode wrappers -- */

/* Every op that touches memory runs between rx_kguard_open and _close, so
 * in guard mode device memory is accessible exactly while an op runs. */
#define S_GUARDED(op, params, args)                                          \
    static int g_##op params                                                 \
    {                                                                        \
        struct rx_kcpu *gk = be;                                             \
        if (!gk || !gk->guard) return s_##op args;                           \
        rx_kguard_open (gk->guard);                                          \
        int grc = s_##op args;                                               \
        rx_kguard_close (gk->guard);                                         \
        return grc;                                                          \
    }

S_GUARDED (copy_h2d, (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err),
           (be, s, dst, src, bytes, err))

S_GUARDED (copy_d2h, (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err),
           (be, s, dst, src, bytes, err))

S_GUARDED (copy_d2d, (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err),
           (be, s, dst, src, bytes, err))

S_GUARDED (memset, (void *be, rx_kstream_t *s, void *dst, int byte, size_t bytes, struct rx_err *err),
           (be, s, dst, byte, bytes, err))

S_GUARDED (weight_load, (void *be, const struct rx_weight_view *v, rx_kweight_t **w, struct rx_err *err),
           (be, v, w, err))

S_GUARDED (get_rows, (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *ids, size_t n, float *out, size_t ldo, struct rx_err *err),
           (be, s, w, ids, n, out, ldo, err))

S_GUARDED (rms_norm, (void *be, rx_kstream_t *s, const float *x, size_t ldx, const float *w, float *y, size_t ldy, size_t rows, size_t dim, float eps, struct rx_err *err),
           (be, s, x, ldx, w, y, ldy, rows, dim, eps, err))

S_GUARDED (rope, (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t n_tok, size_t n_head, size_t ld_head, const int32_t *pos, const struct rx_rope_params *p, struct rx_err *err),
           (be, s, x, ldx, n_tok, n_head, ld_head, pos, p, err))

S_GUARDED (matmul, (void *be, rx_kstream_t *s, const rx_kweight_t *w, int expert, const float *x, size_t ldx, float *y, size_t ldy, size_t n, uint32_t flags, struct rx_err *err),
           (be, s, w, expert, x, ldx, y, ldy, n, flags, err))

S_GUARDED (swiglu, (void *be, rx_kstream_t *s, const float *gate, size_t ldg, const float *up, size_t ldu, float *out, size_t ldo, size_t rows, size_t dim, struct rx_err *err),
           (be, s, gate, ldg, up, ldu, out, ldo, rows, dim, err))

S_GUARDED (add, (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b, size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
           (be, s, a, lda, b, ldb, y, ldy, rows, dim, err))

S_GUARDED (mul, (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b, size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
           (be, s, a, lda, b, ldb, y, ldy, rows, dim, err))

S_GUARDED (scale, (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy, size_t rows, size_t dim, float alpha, struct rx_err *err),
           (be, s, x, ldx, y, ldy, rows, dim, alpha, err))

S_GUARDED (softmax, (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t rows, size_t dim, float scale, struct rx_err *err),
           (be, s, x, ldx, rows, dim, scale, err))

S_GUARDED (sigmoid, (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
           (be, s, x, ldx, y, ldy, rows, dim, err))

S_GUARDED (copy2d, (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
           (be, s, x, ldx, y, ldy, rows, dim, err))

S_GUARDED (argmax, (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows, size_t dim, int32_t *out, struct rx_err *err),
           (be, s, x, ldx, rows, dim, out, err))

S_GUARDED (topk, (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows, size_t dim, size_t kk, float *vals, int32_t *idx, struct rx_err *err),
           (be, s, x, ldx, rows, dim, kk, vals, idx, err))

S_GUARDED (moe_route, (void *be, rx_kstream_t *s, const float *probs, const float *sel, size_t ld, size_t rows, size_t n_expert, size_t n_group, size_t topk_group, size_t kk, int norm, float scale, int32_t *ids, float *w, struct rx_err *err),
           (be, s, probs, sel, ld, rows, n_expert, n_group, topk_group, kk, norm, scale, ids, w, err))

S_GUARDED (moe_sort, (void *be, rx_kstream_t *s, const int32_t *ids, size_t n_tok, size_t kk, size_t n_expert, int32_t *offsets, int32_t *row, int32_t *src, struct rx_err *err),
           (be, s, ids, n_tok, kk, n_expert, offsets, row, src, err))

S_GUARDED (gather_rows, (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *idx, size_t n, size_t dim, float *y, size_t ldy, struct rx_err *err),
           (be, s, x, ldx, idx, n, dim, y, ldy, err))

S_GUARDED (matmul_grouped, (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *offsets, size_t row0, const float *x, size_t ldx, float *y, size_t ldy, size_t n, uint32_t flags, struct rx_err *err),
           (be, s, w, offsets, row0, x, ldx, y, ldy, n, flags, err))

S_GUARDED (moe_combine, (void *be, rx_kstream_t *s, const float *y, size_t ldy, const int32_t *row, const float *w, size_t n_tok, size_t kk, size_t dim, float *out, size_t ldo, uint32_t flags, struct rx_err *err),
           (be, s, y, ldy, row, w, n_tok, kk, dim, out, ldo, flags, err))

S_GUARDED (moe_ll_pack, (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *ids, const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n_tok, size_t kk, size_t n_expert, size_t n_rank, size_t slots, size_t hrows, size_t dim, float *send, int32_t *slot_of, struct rx_err *err),
           (be, s, x, ldx, ids, offsets, row, src, n_tok, kk, n_expert, n_rank, slots, hrows, dim, send, slot_of, err))

S_GUARDED (moe_ll_unpack, (void *be, rx_kstream_t *s, const float *recv, size_t n_rank, size_t slots, size_t hrows, size_t dim, size_t n_local, int32_t *offsets, int32_t *order, int32_t *back, struct rx_err *err),
           (be, s, recv, n_rank, slots, hrows, dim, n_local, offsets, order, back, err))

S_GUARDED (kv_store, (void *be, rx_kstream_t *s, const struct rx_kv_pool *pool, const float *kx, size_t ldk, const float *vx, size_t ldv, const int32_t *slots, size_t n_tok, struct rx_err *err),
           (be, s, pool, kx, ldk, vx, ldv, slots, n_tok, err))

S_GUARDED (attention, (void *be, rx_kstream_t *s, const float *q, size_t ldq, const struct rx_kv_pool *pool, const struct rx_attn_batch *b, const struct rx_attn_params *p, float *out, size_t ldo, struct rx_err *err),
           (be, s, q, ldq, pool, b, p, out, ldo, err))

/* ------------------------------------------------- emulated graph capture -- */

/* With [kernels.cpu] graphs, an op issued while a graph is being captured
 * is recorded (graph.h), not run: x_<op> stores its arguments by value in a
 * struct r_<op> and the replay calls g_<op> with them, on the launch's
 * stream.  Pointers are kept as pointers (device memory is read at launch,
 * as on a GPU); the parameter structs of rope, kv_store and attention are
 * copied (a CUDA kernel's arguments are fixed at capture). */
#define S_UNPAREN(...) __VA_ARGS__

#define S_CAPTURED(op, params, fields, names, replay)                                    \
    struct r_##op { S_UNPAREN fields };                                                  \
    static int r_##op (void *be, rx_kstream_t *s, const void *p_, struct rx_err *err)    \
    {                                                                                    \
        const struct r_##op *a = p_;                                                     \
        return g_##op (be, s, S_UNPAREN replay, err);                                    \
    }                                                                                    \
    static int x_##op params                                                             \
    {                                                                                    \
        struct rx_kcpu *xk = be;                                                         \
        if (xk && rx_kgraphs_capturing (xk->graphs, NULL)) {                             \
            struct r_##op a_ = { S_UNPAREN names };                                      \
            return rx_kgraphs_record (xk->graphs, r_##op, &a_, sizeof a_, err);          \
        }                                                                                \
        return g_##op (be, s, S_UNPAREN names, err);                                     \
    }

S_CAPTURED (copy_d2d, (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err),
            (void *dst; const void *src; size_t bytes;), (dst, src, bytes), (a->dst, a->src, a->bytes))
S_CAPTURED (memset, (void *be, rx_kstream_t *s, void *dst, int byte, size_t bytes, struct rx_err *err),
            (void *dst; int byte; size_t bytes;), (dst, byte, bytes), (a->dst, a->byte, a->bytes))
S_CAPTURED (get_rows, (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *ids, size_t n, float *out, size_t ldo, struct rx_err *err),
            (const rx_kweight_t *w; const int32_t *ids; size_t n; float *out; size_t ldo;),
            (w, ids, n, out, ldo), (a->w, a->ids, a->n, a->out, a->ldo))
S_CAPTURED (rms_norm, (void *be, rx_kstream_t *s, const float *x, size_t ldx, const float *w, float *y, size_t ldy, size_t rows, size_t dim, float eps, struct rx_err *err),
            (const float *x; size_t ldx; const float *w; float *y; size_t ldy, rows, dim; float eps;),
            (x, ldx, w, y, ldy, rows, dim, eps), (a->x, a->ldx, a->w, a->y, a->ldy, a->rows, a->dim, a->eps))
S_CAPTURED (matmul, (void *be, rx_kstream_t *s, const rx_kweight_t *w, int expert, const float *x, size_t ldx, float *y, size_t ldy, size_t n, uint32_t flags, struct rx_err *err),
            (const rx_kweight_t *w; int expert; const float *x; size_t ldx; float *y; size_t ldy, n; uint32_t flags;),
            (w, expert, x, ldx, y, ldy, n, flags), (a->w, a->expert, a->x, a->ldx, a->y, a->ldy, a->n, a->flags))
S_CAPTURED (swiglu, (void *be, rx_kstream_t *s, const float *gate, size_t ldg, const float *up, size_t ldu, float *out, size_t ldo, size_t rows, size_t dim, struct rx_err *err),
            (const float *gate; size_t ldg; const float *up; size_t ldu; float *out; size_t ldo, rows, dim;),
            (gate, ldg, up, ldu, out, ldo, rows, dim), (a->gate, a->ldg, a->up, a->ldu, a->out, a->ldo, a->rows, a->dim))
S_CAPTURED (add, (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b, size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
            (const float *a; size_t lda; const float *b; size_t ldb; float *y; size_t ldy, rows, dim;),
            (a, lda, b, ldb, y, ldy, rows, dim), (a->a, a->lda, a->b, a->ldb, a->y, a->ldy, a->rows, a->dim))
S_CAPTURED (mul, (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b, size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
            (const float *a; size_t lda; const float *b; size_t ldb; float *y; size_t ldy, rows, dim;),
            (a, lda, b, ldb, y, ldy, rows, dim), (a->a, a->lda, a->b, a->ldb, a->y, a->ldy, a->rows, a->dim))
S_CAPTURED (scale, (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy, size_t rows, size_t dim, float alpha, struct rx_err *err),
            (const float *x; size_t ldx; float *y; size_t ldy, rows, dim; float alpha;),
            (x, ldx, y, ldy, rows, dim, alpha), (a->x, a->ldx, a->y, a->ldy, a->rows, a->dim, a->alpha))
S_CAPTURED (softmax, (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t rows, size_t dim, float scale, struct rx_err *err),
            (float *x; size_t ldx, rows, dim; float scale;), (x, ldx, rows, dim, scale),
            (a->x, a->ldx, a->rows, a->dim, a->scale))
S_CAPTURED (sigmoid, (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
            (const float *x; size_t ldx; float *y; size_t ldy, rows, dim;), (x, ldx, y, ldy, rows, dim),
            (a->x, a->ldx, a->y, a->ldy, a->rows, a->dim))
S_CAPTURED (copy2d, (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err),
            (const float *x; size_t ldx; float *y; size_t ldy, rows, dim;), (x, ldx, y, ldy, rows, dim),
            (a->x, a->ldx, a->y, a->ldy, a->rows, a->dim))
S_CAPTURED (argmax, (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows, size_t dim, int32_t *out, struct rx_err *err),
            (const float *x; size_t ldx, rows, dim; int32_t *out;), (x, ldx, rows, dim, out),
            (a->x, a->ldx, a->rows, a->dim, a->out))
S_CAPTURED (topk, (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows, size_t dim, size_t kk, float *vals, int32_t *idx, struct rx_err *err),
            (const float *x; size_t ldx, rows, dim, kk; float *vals; int32_t *idx;),
            (x, ldx, rows, dim, kk, vals, idx), (a->x, a->ldx, a->rows, a->dim, a->kk, a->vals, a->idx))

S_CAPTURED (moe_route, (void *be, rx_kstream_t *s, const float *probs, const float *sel, size_t ld, size_t rows, size_t n_expert, size_t n_group, size_t topk_group, size_t kk, int norm, float scale, int32_t *ids, float *w, struct rx_err *err),
            (const float *probs; const float *sel; size_t ld, rows, n_expert, n_group, topk_group, kk; int norm; float scale; int32_t *ids; float *w;),
            (probs, sel, ld, rows, n_expert, n_group, topk_group, kk, norm, scale, ids, w),
            (a->probs, a->sel, a->ld, a->rows, a->n_expert, a->n_group, a->topk_group, a->kk, a->norm, a->scale, a->ids, a->w))

/* The MoE expert pass (ABI 1.3): only pointers and sizes, so a decode
 * step's MoE blocks replay with the routing of launch time. */
S_CAPTURED (moe_sort, (void *be, rx_kstream_t *s, const int32_t *ids, size_t n_tok, size_t kk, size_t n_expert, int32_t *offsets, int32_t *row, int32_t *src, struct rx_err *err),
            (const int32_t *ids; size_t n_tok, kk, n_expert; int32_t *offsets; int32_t *row; int32_t *src;),
            (ids, n_tok, kk, n_expert, offsets, row, src),
            (a->ids, a->n_tok, a->kk, a->n_expert, a->offsets, a->row, a->src))
S_CAPTURED (gather_rows, (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *idx, size_t n, size_t dim, float *y, size_t ldy, struct rx_err *err),
            (const float *x; size_t ldx; const int32_t *idx; size_t n, dim; float *y; size_t ldy;),
            (x, ldx, idx, n, dim, y, ldy), (a->x, a->ldx, a->idx, a->n, a->dim, a->y, a->ldy))
S_CAPTURED (matmul_grouped, (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *offsets, size_t row0, const float *x, size_t ldx, float *y, size_t ldy, size_t n, uint32_t flags, struct rx_err *err),
            (const rx_kweight_t *w; const int32_t *offsets; size_t row0; const float *x; size_t ldx; float *y; size_t ldy, n; uint32_t flags;),
            (w, offsets, row0, x, ldx, y, ldy, n, flags),
            (a->w, a->offsets, a->row0, a->x, a->ldx, a->y, a->ldy, a->n, a->flags))
S_CAPTURED (moe_combine, (void *be, rx_kstream_t *s, const float *y, size_t ldy, const int32_t *row, const float *w, size_t n_tok, size_t kk, size_t dim, float *out, size_t ldo, uint32_t flags, struct rx_err *err),
            (const float *y; size_t ldy; const int32_t *row; const float *w; size_t n_tok, kk, dim; float *out; size_t ldo; uint32_t flags;),
            (y, ldy, row, w, n_tok, kk, dim, out, ldo, flags),
            (a->y, a->ldy, a->row, a->w, a->n_tok, a->kk, a->dim, a->out, a->ldo, a->flags))

/* The low-latency exchange (ABI 1.4): pointers and sizes too, so a
 * replay packs and unpacks the routing and counts of launch time. */
S_CAPTURED (moe_ll_pack, (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *ids, const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n_tok, size_t kk, size_t n_expert, size_t n_rank, size_t slots, size_t hrows, size_t dim, float *send, int32_t *slot_of, struct rx_err *err),
            (const float *x; size_t ldx; const int32_t *ids; const int32_t *offsets; const int32_t *row; const int32_t *src; size_t n_tok, kk, n_expert, n_rank, slots, hrows, dim; float *send; int32_t *slot_of;),
            (x, ldx, ids, offsets, row, src, n_tok, kk, n_expert, n_rank, slots, hrows, dim, send, slot_of),
            (a->x, a->ldx, a->ids, a->offsets, a->row, a->src, a->n_tok, a->kk, a->n_expert, a->n_rank, a->slots, a->hrows, a->dim, a->send, a->slot_of))
S_CAPTURED (moe_ll_unpack, (void *be, rx_kstream_t *s, const float *recv, size_t n_rank, size_t slots, size_t hrows, size_t dim, size_t n_local, int32_t *offsets, int32_t *order, int32_t *back, struct rx_err *err),
            (const float *recv; size_t n_rank, slots, hrows, dim, n_local; int32_t *offsets; int32_t *order; int32_t *back;),
            (recv, n_rank, slots, hrows, dim, n_local, offsets, order, back),
            (a->recv, a->n_rank, a->slots, a->hrows, a->dim, a->n_local, a->offsets, a->order, a->back))

/* The ops whose parameter structs are copied into the record. */
struct r_rope {
    float *x;
    size_t ldx, n_tok, n_head, ld_head;
    const int32_t *pos;
    struct rx_rope_params p;
};

static int r_rope (void *be, rx_kstream_t *s, const void *p_, struct rx_err *err)
{
    const struct r_rope *a = p_;
    return g_rope (be, s, a->x, a->ldx, a->n_tok, a->n_head, a->ld_head, a->pos, &a->p, err);
}

static int x_rope (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t n_tok, size_t n_head,
                   size_t ld_head, const int32_t *pos, const struct rx_rope_params *p, struct rx_err *err)
{
    struct rx_kcpu *xk = be;
    if (!xk || !rx_kgraphs_capturing (xk->graphs, NULL) || !p)
        return g_rope (be, s, x, ldx, n_tok, n_head, ld_head, pos, p, err);
    struct r_rope a = { x, ldx, n_tok, n_head, ld_head, pos, { 0 } };
    /* a caller's older (shorter) struct: what it has, the rest zero */
    memcpy (&a.p, p, p->struct_size < sizeof a.p ? p->struct_size : sizeof a.p);
    return rx_kgraphs_record (xk->graphs, r_rope, &a, sizeof a, err);
}

struct r_kv_store {
    struct rx_kv_pool pool;
    const float *kx, *vx;
    size_t ldk, ldv, n_tok;
    const int32_t *slots;
};

static int r_kv_store (void *be, rx_kstream_t *s, const void *p_, struct rx_err *err)
{
    const struct r_kv_store *a = p_;
    return g_kv_store (be, s, &a->pool, a->kx, a->ldk, a->vx, a->ldv, a->slots, a->n_tok, err);
}

static int x_kv_store (void *be, rx_kstream_t *s, const struct rx_kv_pool *pool, const float *kx,
                       size_t ldk, const float *vx, size_t ldv, const int32_t *slots, size_t n_tok,
                       struct rx_err *err)
{
    struct rx_kcpu *xk = be;
    if (!xk || !rx_kgraphs_capturing (xk->graphs, NULL) || !pool)
        return g_kv_store (be, s, pool, kx, ldk, vx, ldv, slots, n_tok, err);
    struct r_kv_store a = { *pool, kx, vx, ldk, ldv, n_tok, slots };
    return rx_kgraphs_record (xk->graphs, r_kv_store, &a, sizeof a, err);
}

struct r_attention {
    const float *q;
    float *out;
    size_t ldq, ldo;
    struct rx_kv_pool pool;
    struct rx_attn_batch b;
    struct rx_attn_params p;
};

static int r_attention (void *be, rx_kstream_t *s, const void *p_, struct rx_err *err)
{
    const struct r_attention *a = p_;
    return g_attention (be, s, a->q, a->ldq, &a->pool, &a->b, &a->p, a->out, a->ldo, err);
}

static int x_attention (void *be, rx_kstream_t *s, const float *q, size_t ldq,
                        const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                        const struct rx_attn_params *p, float *out, size_t ldo, struct rx_err *err)
{
    struct rx_kcpu *xk = be;
    if (!xk || !rx_kgraphs_capturing (xk->graphs, NULL) || !pool || !b || !p)
        return g_attention (be, s, q, ldq, pool, b, p, out, ldo, err);
    struct r_attention a = { q, out, ldq, ldo, *pool, *b, { 0 } };
    memcpy (&a.p, p, p->struct_size < sizeof a.p ? p->struct_size : sizeof a.p);
    return rx_kgraphs_record (xk->graphs, r_attention, &a, sizeof a, err);
}

/* Host transfers and weight loads cannot be captured: during a capture
 * they drop it and fail (a CUDA capture would be invalidated too), so a
 * model that syncs or copies to the host inside its captured region is
 * caught on the CPU. */
#define S_NOT_IN_GRAPH(op, params, args)                                               \
    static int x_##op params                                                          \
    {                                                                                 \
        struct rx_kcpu *xk = be;                                                      \
        if (xk && rx_kgraphs_capturing (xk->graphs, NULL))                            \
            return s_not_capturable (xk, #op, err);                                   \
        return g_##op args;                                                           \
    }

S_NOT_IN_GRAPH (copy_h2d, (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err),
                (be, s, dst, src, bytes, err))
S_NOT_IN_GRAPH (copy_d2h, (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err),
                (be, s, dst, src, bytes, err))
S_NOT_IN_GRAPH (weight_load, (void *be, const struct rx_weight_view *v, rx_kweight_t **w, struct rx_err *err),
                (be, v, w, err))

/* host_fn (ABI 1.4).  Streams are synchronous, so outside a capture fn
 * runs at once on a copy of arg; during one it becomes a record that calls
 * fn at every launch, each time on a fresh copy of the capture's bytes (a
 * fn that writes its argument does not change the next launch's).  fn runs
 * as host code, outside rx_kguard_open: in guard mode device memory stays
 * inaccessible to it, and the backend ops it calls (copy_d2h, synchronize:
 * comm-shm's collectives) open the guard themselves.  At a launch nothing
 * is being captured, so those ops run (graph.c keeps the launch safe from a
 * free inside fn). */
struct r_host_fn {
    void (*fn) (void *arg);
    size_t bytes;
    _Alignas (16) unsigned char arg[RX_KHOST_FN_MAX_ARG];
};

static int r_host_fn (void *be, rx_kstream_t *s, const void *p_, struct rx_err *err)
{
    (void) be;
    (void) s;
    (void) err;
    const struct r_host_fn *a = p_;
    _Alignas (16) unsigned char arg[RX_KHOST_FN_MAX_ARG];
    memcpy (arg, a->arg, a->bytes);
    a->fn (arg);
    return RX_OK;
}

static int x_host_fn (void *be, rx_kstream_t *s, void (*fn) (void *arg), const void *arg,
                      size_t arg_bytes, struct rx_err *err)
{
    struct rx_kcpu *k = be;
    if (!k) return rx_err_set (err, RX_EINVAL, "kernels-cpu host_fn: no backend");
    if (s && s->magic != S_STREAM_MAGIC)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu host_fn: bad stream");
    if (!fn) return rx_err_set (err, RX_EINVAL, "kernels-cpu host_fn: NULL fn");
    if (arg_bytes > RX_KHOST_FN_MAX_ARG)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu host_fn: arg_bytes %zu is over "
                           "RX_KHOST_FN_MAX_ARG (%d)", arg_bytes, RX_KHOST_FN_MAX_ARG);
    if (arg_bytes && !arg)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu host_fn: NULL arg with arg_bytes %zu",
                           arg_bytes);
    struct r_host_fn a;
    a.fn = fn;
    a.bytes = arg_bytes;
    if (arg_bytes) memcpy (a.arg, arg, arg_bytes);
    if (rx_kgraphs_capturing (k->graphs, NULL))
        return rx_kgraphs_record (k->graphs, r_host_fn, &a, offsetof (struct r_host_fn, arg) + arg_bytes,
                                  err);
    fn (a.arg);
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
    .copy_h2d = x_copy_h2d,
    .copy_d2h = x_copy_d2h,
    .copy_d2d = x_copy_d2d,
    .memset_ = x_memset,
    .stream_create = s_stream_create,
    .stream_destroy = s_stream_destroy,
    .synchronize = s_synchronize,
    .graph_begin = s_graph_begin,
    .graph_end = s_graph_end,
    .graph_launch = s_graph_launch,
    .graph_has = s_graph_has,
    .weight_load = x_weight_load,
    .weight_free = s_weight_free,
    .weight_data = s_weight_data,
    .get_rows = x_get_rows,
    .rms_norm = x_rms_norm,
    .rope = x_rope,
    .matmul = x_matmul,
    .swiglu = x_swiglu,
    .add = x_add,
    .mul = x_mul,
    .scale = x_scale,
    .softmax = x_softmax,
    .sigmoid = x_sigmoid,
    .copy2d = x_copy2d,
    .argmax = x_argmax,
    .topk = x_topk,
    .kv_store = x_kv_store,
    .attention = x_attention,
    .moe_route = x_moe_route,
    .moe_sort = x_moe_sort,
    .gather_rows = x_gather_rows,
    .matmul_grouped = x_matmul_grouped,
    .moe_combine = x_moe_combine,
    .host_fn = x_host_fn,
    .moe_ll_pack = x_moe_ll_pack,
    .moe_ll_unpack = x_moe_ll_unpack,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_KERNELS, .name = "cpu", .version = S_VERSION,
                  .description = "CPU kernels: thread pool, AVX2/AVX-512 with scalar fallback",
                  .keys = s_keys, .ops = &s_ops)
