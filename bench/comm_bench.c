/* bench/comm_bench.c -- bandwidth of a comm plugin's all_reduce (f32 sum) and
 * all_to_all_v between N forked ranks on this host, against a plain memcpy
 * of the same bytes.
 *
 *   bench/comm-bench [-n RANKS] [-p PLUGIN.so] [-b BUFFER_SIZE] [-m MAX_MIB]
 *
 * The plugin is dlopen()ed directly (default: $RX_PLUGIN_BUILD_DIR/comm-shm.so,
 * else _plugins/comm-shm.so) with a minimal host table, so the program needs
 * nothing of the core.  For each size (64 KiB .. 64 MiB, the bytes of one
 * rank's buffer) every rank runs a warm-up and then R timed repeats, each
 * started by a barrier; the table shows the median of rank 0's times as
 * algorithm bandwidth (bytes / time).  all_to_all_v sends bytes/n to every
 * peer (itself included).  Ratios are against memcpy's bandwidth. */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/plugin.h>

#define MAX_SIZES 16
#define MAX_REP   64

static uint64_t s_buffer_size = 8u << 20;

static void *s_alloc (const struct rx_host *h, size_t size, size_t align)
{
    void *p = NULL;
    if (align < sizeof (void *)) align = sizeof (void *);
    return posix_memalign (&p, align, size ? size : 1) == 0 ? p : NULL;
}

static void s_free (const struct rx_host *h, void *p)
{
    free (p);
}

static int s_cfg_size (const struct rx_host *h, const char *key, uint64_t *out)
{
    if (strcmp (key, "buffer_size") != 0) return RX_ENOENT;
    *out = s_buffer_size;
    return RX_OK;
}

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static double s_median (double *v, int n)
{
    qsort (v, (size_t) n, sizeof *v, s_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int s_reps (size_t bytes)
{
    size_t r = ((size_t) 512 << 20) / bytes;
    return r < 5 ? 5 : r > MAX_REP ? MAX_REP : (int) r;
}

/* Results rank 0 leaves for the parent: [size][0 = all_reduce, 1 = a2a]. */
struct shared {
    double t[MAX_SIZES][2];
    int ok;
};

static int s_rank (const struct rx_comm_ops *ops, const struct rx_host *host, const char *group,
                   int rank, int n, const size_t *sizes, int n_sizes, struct shared *out)
{
    struct rx_err err = { 0 };
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = rank, .n_rank = n, .group = group,
                                .timeout_s = 60 };
    void *c = NULL;
    if (ops->create (host, &p, &c, &err)) {
        fprintf (stderr, "rank %d: %s\n", rank, err.msg);
        return 1;
    }
    size_t maxb = sizes[n_sizes - 1];
    float *send = malloc (maxb), *recv = malloc (maxb);
    if (!send || !recv) return 1;
    for (size_t i = 0; i < maxb / 4; i++) send[i] = (float) (i % 1000) * 0.001f + rank;
    memset (recv, 0, maxb);
    size_t sc[64], sd[64], rc[64], rd[64];
    double t[MAX_REP];
    for (int s = 0; s < n_sizes; s++) {
        size_t bytes = sizes[s], count = bytes / 4;
        int reps = s_reps (bytes);
        for (int kind = 0; kind < 2; kind++) {
            size_t per = count / (size_t) n;
            for (int q = 0; q < n; q++) {
                sc[q] = rc[q] = per;
                sd[q] = rd[q] = (size_t) q * per;
            }
            for (int it = -1; it < reps; it++) {
                int r = ops->barrier (c, NULL, &err);
                double t0 = s_now ();
                if (!r)
                    r = kind == 0 ? ops->all_reduce (c, NULL, send, recv, count, RX_F32, RX_COMM_SUM, &err)
                                  : ops->all_to_all_v (c, NULL, send, sc, sd, recv, rc, rd, RX_F32, &err);
                if (r) {
                    fprintf (stderr, "rank %d: %s\n", rank, err.msg);
                    return 1;
                }
                if (it >= 0) t[it] = s_now () - t0;
            }
            if (rank == 0) out->t[s][kind] = s_median (t, reps);
        }
    }
    ops->destroy (c);
    free (send);
    free (recv);
    if (rank == 0) out->ok = 1;
    return 0;
}

int main (int argc, char **argv)
{
    int n = 2;
    size_t max_mib = 64;
    const char *path = NULL;
    int opt;
    while ((opt = getopt (argc, argv, "n:p:b:m:h")) != -1) {
        switch (opt) {
        case 'n': n = atoi (optarg); break;
        case 'p': path = optarg; break;
        case 'b': s_buffer_size = strtoull (optarg, NULL, 0); break;
        case 'm': max_mib = strtoull (optarg, NULL, 0); break;
        default:
            fprintf (stderr, "usage: %s [-n RANKS] [-p PLUGIN.so] [-b BUFFER_BYTES] [-m MAX_MIB]\n", argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (n < 1 || n > 64 || max_mib < 1) {
        fprintf (stderr, "comm-bench: -n must be 1..64 and -m >= 1\n");
        return 2;
    }
    char def[4096];
    if (!path) {
        const char *d = getenv ("RX_PLUGIN_BUILD_DIR");
        snprintf (def, sizeof def, "%s/comm-shm.so", d && *d ? d : "_plugins");
        path = def;
    }
    void *so = dlopen (path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf (stderr, "comm-bench: %s\n", dlerror ());
        return 1;
    }
    rx_plugin_entry_fn entry = (rx_plugin_entry_fn) dlsym (so, RX_PLUGIN_ENTRY);
    const struct rx_plugin_desc *d = entry ? entry () : NULL;
    if (!d || d->magic != RX_PLUGIN_MAGIC || d->kind != RX_KIND_COMM) {
        fprintf (stderr, "comm-bench: %s is not a comm plugin\n", path);
        return 1;
    }
    const struct rx_comm_ops *ops = d->ops;
    struct rx_host host = { .struct_size = sizeof host, .abi_major = RX_ABI_MAJOR,
                            .abi_minor = RX_ABI_MINOR, .alloc = s_alloc, .free_ = s_free,
                            .cfg_size = s_cfg_size };

    size_t sizes[MAX_SIZES];
    int n_sizes = 0;
    for (size_t b = 64 << 10; b <= (max_mib << 20) && n_sizes < MAX_SIZES; b *= 4) sizes[n_sizes++] = b;

    /* memcpy baseline, in this process */
    double mc[MAX_SIZES];
    {
        size_t maxb = sizes[n_sizes - 1];
        char *a = malloc (maxb), *b = malloc (maxb);
        memset (a, 1, maxb);
        memset (b, 2, maxb);
        for (int s = 0; s < n_sizes; s++) {
            double t[MAX_REP];
            int reps = s_reps (sizes[s]);
            for (int it = -1; it < reps; it++) {
                double t0 = s_now ();
                memcpy (b, a, sizes[s]);
                __asm__ __volatile__ ("" ::: "memory");
                if (it >= 0) t[it] = s_now () - t0;
            }
            mc[s] = s_median (t, reps);
        }
        free (a);
        free (b);
    }

    struct shared *sh = mmap (NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    memset (sh, 0, sizeof *sh);
    char group[64];
    snprintf (group, sizeof group, "bench-%d", (int) getpid ());
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pids[r] = fork ();
        if (pids[r] == 0) _exit (s_rank (ops, &host, group, r, n, sizes, n_sizes, sh));
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid (pids[r], &st, 0);
        if (!WIFEXITED (st) || WEXITSTATUS (st)) bad = 1;
    }
    if (bad || !sh->ok) {
        fprintf (stderr, "comm-bench: a rank failed\n");
        return 1;
    }
    printf ("comm-%s, %d ranks, buffer_size %llu, %ld CPUs; median of repeats; GB/s = 1e9 bytes/s\n",
            d->name, n, (unsigned long long) s_buffer_size, sysconf (_SC_NPROCESSORS_ONLN));
    printf ("%10s %12s %16s %7s %16s %7s\n", "size", "memcpy GB/s", "all_reduce GB/s", "ratio",
            "all_to_all_v GB/s", "ratio");
    for (int s = 0; s < n_sizes; s++) {
        double gb = sizes[s] / 1e9, m = gb / mc[s], ar = gb / sh->t[s][0], aa = gb / sh->t[s][1];
        char sz[32];
        if (sizes[s] >= (1u << 20)) snprintf (sz, sizeof sz, "%zu MiB", sizes[s] >> 20);
        else snprintf (sz, sizeof sz, "%zu KiB", sizes[s] >> 10);
        printf ("%10s %12.2f %16.2f %7.2f %16.2f %7.2f\n", sz, m, ar, ar / m, aa, aa / m);
    }
    return 0;
}
