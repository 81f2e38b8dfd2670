/* bench/kernels.c -- micro-benchmark of kernels-cpu's matvec (decode) and
 * matmul (prefill) paths against a plain memory-read loop.
 *
 *   bench/kernels [-t threads] [-i isa] [-w map|copy] [-m MiB] [-s seconds] [-P] [-D] [-n N]
 *
 * -P skips the prefill shapes, -D the decode ones; -n N: activation rows of
 * the prefill shapes (default 64; 512 is a pp512 ubatch).
 *
 * Loads kernels-cpu.so through the real loader (plugin dir from
 * $RX_PLUGIN_BUILD_DIR, default ./_plugins).  Decode streams every weight
 * once per token, so each shape cycles through enough copies of the matrix
 * (-m MiB in all, default 512) that nothing stays in cache, and reports
 * weight bytes read per second: the number to hold against the read
 * bandwidth of the machine (the roofline). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <radix/kernel.h>

#include "conf.h"
#include "host.h"
#include "loader.h"
#include "quant.h"

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------ read bandwidth loop -- */

struct s_bw {
    const uint64_t *p;
    size_t n;
    int reps;
    uint64_t sum;
};

#if defined(__x86_64__)
__attribute__ ((target ("avx2")))
#endif
static void *s_bw_thread (void *arg)
{
    struct s_bw *b = arg;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (int r = 0; r < b->reps; r++)
        for (size_t i = 0; i + 8 <= b->n; i += 8) {   /* one cache line per step */
            a0 ^= b->p[i]; a1 ^= b->p[i + 1]; a2 ^= b->p[i + 2]; a3 ^= b->p[i + 3];
            a4 ^= b->p[i + 4]; a5 ^= b->p[i + 5]; a6 ^= b->p[i + 6]; a7 ^= b->p[i + 7];
        }
    b->sum = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
    return NULL;
}

static double s_read_bw (size_t bytes, int threads)
{
    uint64_t *buf = aligned_alloc (64, bytes);
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_t tid[64];
    struct s_bw b[64];
    size_t per = bytes / 8 / (size_t) threads / 8 * 8;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = s_now ();
        for (int i = 0; i < threads; i++) {
            b[i] = (struct s_bw) { buf + (size_t) i * per, per, 2, 0 };
            pthread_create (&tid[i], NULL, s_bw_thread, &b[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join (tid[i], NULL);
        double gbs = (double) per * 8 * threads * 2 / (s_now () - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free (buf);
    return best;
}

/* ------------------------------------------------------------ kernels -- */

static const struct rx_kernels_ops *K;
static rx_plugin_t *s_plugin;

static void *s_backend (const char *isa, const char *weights, int threads)
{
    static struct rx_host_binding bind[8];
    static int nb;
    char ini[200];
    snprintf (ini, sizeof ini, "[kernels.cpu]\nisa = %s\nweights = %s\n", isa, weights);
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_string (ini, strlen (ini), "bench", &err);
    if (!c || nb == 8) { fprintf (stderr, "bench: %s\n", err.msg); exit (1); }
    rx_host_bind (&bind[nb], "kernels-cpu", "kernels.cpu", c, rx_plugin_desc (s_plugin)->keys);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = threads };
    void *be = NULL;
    if (K->create (&bind[nb++].host, &p, &be, &err) != RX_OK) {
        fprintf (stderr, "bench: create: %s\n", err.msg);
        exit (1);
    }
    return be;
}

/* Weight bytes with valid scales (values do not matter for speed). */
static void s_fill (int dtype, uint8_t *w, size_t in, size_t rows)
{
    size_t rb = rx_dtype_row_bytes (dtype, in);
    float x[1024];
    uint8_t blk[2048];
    for (size_t i = 0; i < 1024; i++) x[i] = (float) ((i * 7919) % 201) / 100.f - 1.f;
    size_t chunk = rx_dtype_row_bytes (dtype, 256);
    rx_quantize_row (dtype, x, blk, 256);
    for (size_t off = 0; off < rb * rows; off += chunk)
        memcpy (w + off, blk, off + chunk <= rb * rows ? chunk : rb * rows - off);
}

static void s_matvec (void *be, int dtype, size_t in, size_t out, size_t mib, double secs,
                      size_t n, const char *label)
{
    size_t bytes = rx_dtype_row_bytes (dtype, in) * out;
    size_t copies = (mib << 20) / bytes;
    if (copies < 2) copies = 2;
    if (n > 1) copies = 1;             /* prefill: weights stay in cache */
    uint8_t *mem = aligned_alloc (4096, (bytes * copies + 4095) / 4096 * 4096);
    rx_kweight_t **w = calloc (copies, sizeof *w);
    for (size_t c = 0; c < copies; c++) {
        s_fill (dtype, mem + c * bytes, in, out);
        struct rx_weight_view v = { .name = "w", .dtype = dtype, .n_dims = 2, .ne = { in, out, 1, 1 },
                                    .data = mem + c * bytes, .nbytes = bytes };
        struct rx_err err = { 0 };
        if (K->weight_load (be, &v, &w[c], &err) != RX_OK) { fprintf (stderr, "%s\n", err.msg); exit (1); }
    }
    float *x = malloc (in * n * sizeof *x), *y = malloc (out * n * sizeof *y);
    for (size_t i = 0; i < in * n; i++) x[i] = (float) (i % 17) * 0.1f - 0.8f;
    /* warm up one pass */
    for (size_t c = 0; c < copies; c++) K->matmul (be, NULL, w[c], -1, x, in, y, out, n, 0, NULL);
    /* Time every call: on a shared machine the median and the best call
     * say more than the mean (another process may take our core). */
    size_t cap = 1 << 20, calls = 0;
    double *dt = malloc (cap * sizeof *dt);
    double t0 = s_now (), t = 0;
    do {
        for (size_t c = 0; c < copies && calls < cap; c++) {
            double a = s_now ();
            K->matmul (be, NULL, w[c], -1, x, in, y, out, n, 0, NULL);
            dt[calls++] = s_now () - a;
        }
        t = s_now () - t0;
    } while (t < secs && calls < cap);
    qsort (dt, calls, sizeof *dt, s_cmp);
    double med = dt[calls / 2], best = dt[0];
    if (n == 1)
        printf ("  %-6s %5zu -> %-6zu %-7s median %8.1f us %6.2f GB/s   best %8.1f us %6.2f GB/s\n",
                rx_dtype_name (dtype), in, out, label, med * 1e6, (double) bytes / med / 1e9,
                best * 1e6, (double) bytes / best / 1e9);
    else
        printf ("  %-6s %5zu -> %-6zu n=%-4zu median %8.1f us %6.1f GFLOP/s  best %6.1f GFLOP/s\n",
                rx_dtype_name (dtype), in, out, n, med * 1e6,
                2.0 * (double) in * (double) out * (double) n / med / 1e9,
                2.0 * (double) in * (double) out * (double) n / best / 1e9);
    free (dt);
    fflush (stdout);
    for (size_t c = 0; c < copies; c++) K->weight_free (be, w[c]);
    free (w);
    free (mem);
    free (x);
    free (y);
}

int main (int argc, char **argv)
{
    int threads_max = 2;
    const char *isa = "auto", *weights = "auto";
    size_t mib = 512;
    double secs = 1.0;
    int prefill = 1, decode = 1;
    size_t np = 64;
    int opt;
    while ((opt = getopt (argc, argv, "t:i:w:m:s:PDn:")) != -1) {
        switch (opt) {
        case 't': threads_max = atoi (optarg); break;
        case 'i': isa = optarg; break;
        case 'w': weights = optarg; break;
        case 'm': mib = (size_t) atol (optarg); break;
        case 's': secs = atof (optarg); break;
        case 'P': prefill = 0; break;
        case 'D': decode = 0; break;
        case 'n': np = (size_t) atol (optarg); if (np < 1) np = 1; break;
        default:
            fprintf (stderr, "usage: %s [-t threads] [-i isa] [-w map|copy] [-m MiB] [-s secs] [-P] [-D] [-n N]\n", argv[0]);
            return 2;
        }
    }
    const char *dir = getenv ("RX_PLUGIN_BUILD_DIR");
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (dir && *dir ? dir : "_plugins", &err);
    if (!l || rx_loader_find (l, RX_KIND_KERNELS, "cpu", &s_plugin, &err) != RX_OK ||
        rx_plugin_init (s_plugin, NULL, &err) != RX_OK) {
        fprintf (stderr, "bench: %s\n", err.msg);
        return 1;
    }
    K = rx_plugin_ops (s_plugin);
    static const int types[] = { RX_Q8_0, RX_Q4_0, RX_F16 };
    static const size_t shapes[][2] = { { 960, 2560 }, { 2560, 960 }, { 960, 49152 } };
    for (int th = 1; th <= threads_max; th++) {
        printf ("threads %d: plain read loop %.2f GB/s\n", th, s_read_bw ((size_t) 1 << 30, th));
        void *be = s_backend (isa, weights, th);
        struct rx_kernels_info info = { .struct_size = sizeof info };
        K->info (be, &info);
        printf ("  backend: %s, weights %s\n", info.device, weights);
        for (size_t ti = 0; ti < 3 && decode; ti++)
            for (size_t si = 0; si < 3; si++)
                s_matvec (be, types[ti], shapes[si][0], shapes[si][1], mib, secs, 1, "decode");
        if (prefill)
            for (size_t ti = 0; ti < 3; ti++)
                s_matvec (be, types[ti], 960, 2560, mib, secs, np, "prefill");
        K->destroy (be);
    }
    rx_loader_destroy (&l);
    return 0;
}
