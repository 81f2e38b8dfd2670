/* tests/unit/test_comm_shm.c -- comm-shm.so loaded through the real loader
 * from the build tree; ranks are forked processes (and threads in one test).
 * Every collective against a naive reference the test computes itself
 * (each rank regenerates every rank's input from a seed): all dtypes and
 * reductions, chunking past buffer_size, in-place forms, zero counts,
 * start/wait, bitwise-identical all_reduce results across ranks; and the
 * failures: a rank that never joins, a rank that dies, is stuck or leaves,
 * mismatched calls, bad arguments, a stale segment, nothing left in /dev/shm.
 * Overlap: started ops run on a progress thread while the rank computes
 * (start() returns at once although the peer is 0.2 s late), a blocking call
 * after a start keeps the order, no thread without start(), too many started
 * ops, a peer that dies or hangs under started ops, destroy with an op in
 * flight.  Graphs (ABI 1.4): on kernels-cpu with emulated graphs, blocking
 * collectives captured into a graph run at every launch (eager ones in
 * between), a peer dead before a launch, graph_capturable. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/plugin.h>

#include "conf.h"
#include "loader.h"
#include "../testutil.h"

/* ---- harness ------------------------------------------------------------- */

struct env {
    rx_loader_t *l;
    rx_conf_t *conf;
    rx_plugin_t *pl;
    const struct rx_comm_ops *ops;
    const struct rx_host *host;
    char group[64];
};

static int s_group_no;

/* Load comm-shm with ini as its config (NULL: defaults) and pick a group
 * name unique to this test process. */
static void s_load (struct env *e, const char *ini)
{
    struct rx_err err = { 0 };
    memset (e, 0, sizeof *e);
    e->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (e->l, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_COMM, "shm", &e->pl, &err), RX_OK, "%s", err.msg);
    if (ini) {
        e->conf = rx_conf_parse_string (ini, strlen (ini), "comm-test.ini", &err);
        cr_assert_not_null (e->conf, "%s", err.msg);
    }
    cr_assert_eq (rx_plugin_init (e->pl, e->conf, &err), RX_OK, "%s", err.msg);
    e->ops = rx_plugin_ops (e->pl);
    e->host = rx_plugin_host (e->pl);
    snprintf (e->group, sizeof e->group, "t%d-%d", (int) getpid (), ++s_group_no);
}

/* /dev/shm/radix-<group> must not exist (the segment was unlinked). */
static void s_assert_no_segment (const struct env *e)
{
    char path[128];
    snprintf (path, sizeof path, "/dev/shm/radix-%s", e->group);
    cr_assert_neq (access (path, F_OK), 0, "%s was left behind", path);
}

static void s_close (struct env *e)
{
    s_assert_no_segment (e);
    rx_conf_destroy (&e->conf);
    rx_loader_destroy (&e->l);
}

static int s_create (struct env *e, int rank, int n, double timeout_s, void **c, struct rx_err *err)
{
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = rank, .n_rank = n,
                                .group = e->group, .timeout_s = timeout_s };
    return e->ops->create (e->host, &p, c, err);
}

/* A rank's body: returns 0 on success, else prints why and returns 1. */
typedef int (*rank_fn) (struct env *e, void *c, int rank, int n, void *ud);

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf (stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);     \
            fprintf (stderr, __VA_ARGS__);                                      \
            fputc ('\n', stderr);                                               \
            return 1;                                                           \
        }                                                                       \
    } while (0)

#define CHECK_OK(call)                                                          \
    do {                                                                        \
        struct rx_err e_ = { 0 };                                               \
        int rc_ = (call);                                                       \
        (void) e_;                                                              \
        CHECK (rc_ == RX_OK, "%s -> %d", #call, rc_);                           \
    } while (0)

static int s_rank_main (struct env *e, int rank, int n, double timeout_s, rank_fn fn, void *ud)
{
    struct rx_err err = { 0 };
    void *c = NULL;
    int rc = s_create (e, rank, n, timeout_s, &c, &err);
    if (rc) {
        fprintf (stderr, "rank %d: create: %s\n", rank, err.msg);
        return 1;
    }
    int r = fn (e, c, rank, n, ud);
    e->ops->destroy (c);
    return r;
}

/* Fork n ranks running fn; assert every one exits 0 within 60 s. */
static void s_run_ranks (struct env *e, int n, double timeout_s, rank_fn fn, void *ud)
{
    pid_t pids[16];
    for (int r = 0; r < n; r++) {
        pids[r] = fork ();
        cr_assert_geq (pids[r], 0);
        if (pids[r] == 0) {
            alarm (60);
            _exit (s_rank_main (e, r, n, timeout_s, fn, ud));
        }
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        cr_assert_eq (waitpid (pids[r], &st, 0), pids[r]);
        cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0,
                   "rank %d of %d failed (status 0x%x; see stderr)", r, n, st);
    }
}

/* ---- deterministic data -------------------------------------------------- */

static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Element i of rank r's input for test seed s, as a double in [-1, 1). */
static double s_val (uint64_t s, int r, size_t i)
{
    return (double) (s_mix (s * 1000003u + (uint64_t) r * 0x100000001ull + i) >> 11) * 0x1.0p-52 - 1.0;
}

static uint16_t s_bf16_round (float f)      /* round to nearest even (no NaN inputs here) */
{
    uint32_t u;
    memcpy (&u, &f, 4);
    return (uint16_t) ((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static float s_bf16_f (uint16_t b)
{
    uint32_t u = (uint32_t) b << 16;
    float f;
    memcpy (&f, &u, 4);
    return f;
}

/* Fill buf with count elements of rank r's input (dtype dt). */
static void s_fill (void *buf, int dt, uint64_t s, int r, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        double v = s_val (s, r, i);
        switch (dt) {
        case RX_F32: ((float *) buf)[i] = (float) v; break;
        case RX_F16: ((_Float16 *) buf)[i] = (_Float16) (v * 4); break;
        case RX_BF16: ((uint16_t *) buf)[i] = s_bf16_round ((float) (v * 100)); break;
        case RX_I32: ((int32_t *) buf)[i] = (int32_t) (s_mix (s + i * 7 + (uint64_t) r) >> 32); break;
        case RX_I64: ((int64_t *) buf)[i] = (int64_t) s_mix (s * 3 + i * 11 + (uint64_t) r); break;
        }
    }
}

/* The naive reference: out[i] = red over ranks 0..n-1 in order of in[r][i];
 * f16/bf16 accumulate in float and round once. */
static void s_ref_reduce (void *out, int dt, int red, uint64_t s, int n, size_t count, size_t first)
{
    size_t elt = rx_comm_dtype_size (dt);
    unsigned char *in = malloc ((first + count) * elt * n + 1);
    for (int r = 0; r < n; r++) s_fill (in + (size_t) r * (first + count) * elt, dt, s, r, first + count);
#define IN(T, r, i) (((T *) (in + (size_t) (r) * (first + count) * elt))[first + (i)])
#define RED(a, b) (red == RX_COMM_SUM ? (a) + (b) : red == RX_COMM_MAX ? ((b) > (a) ? (b) : (a)) : ((b) < (a) ? (b) : (a)))
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case RX_F32: { float a = IN (float, 0, i); for (int r = 1; r < n; r++) a = RED (a, IN (float, r, i)); ((float *) out)[i] = a; break; }
        case RX_F16: { float a = (float) IN (_Float16, 0, i); for (int r = 1; r < n; r++) a = RED (a, (float) IN (_Float16, r, i)); ((_Float16 *) out)[i] = (_Float16) a; break; }
        case RX_BF16: { float a = s_bf16_f (IN (uint16_t, 0, i)); for (int r = 1; r < n; r++) a = RED (a, s_bf16_f (IN (uint16_t, r, i))); ((uint16_t *) out)[i] = s_bf16_round (a); break; }
        case RX_I32: {
            int32_t a = IN (int32_t, 0, i);
            for (int r = 1; r < n; r++) {
                int32_t b = IN (int32_t, r, i);
                a = red == RX_COMM_SUM ? (int32_t) ((uint32_t) a + (uint32_t) b) : RED (a, b);
            }
            ((int32_t *) out)[i] = a;
            break;
        }
        case RX_I64: {
            int64_t a = IN (int64_t, 0, i);
            for (int r = 1; r < n; r++) {
                int64_t b = IN (int64_t, r, i);
                a = red == RX_COMM_SUM ? (int64_t) ((uint64_t) a + (uint64_t) b) : RED (a, b);
            }
            ((int64_t *) out)[i] = a;
            break;
        }
        }
    }
#undef IN
#undef RED
    free (in);
}

/* ---- the plugin ---------------------------------------------------------- */

Test (comm_shm, loads_as_comm_shm)
{
    struct env e;
    s_load (&e, NULL);
    const struct rx_plugin_desc *d = rx_plugin_desc (e.pl);
    cr_assert_eq (d->kind, RX_KIND_COMM);
    cr_assert_str_eq (d->name, "shm");
    cr_assert (strstr (rx_plugin_path (e.pl), "comm-shm"), "%s", rx_plugin_path (e.pl));
    cr_assert_geq (e.ops->struct_size, RX_COMM_OPS_SIZE_1_0);
    cr_assert_str_eq (d->keys[0].name, "buffer_size");
    cr_assert_eq (d->keys[0].type, RX_CFG_SIZE);
    s_close (&e);
}

/* ---- all_reduce ---------------------------------------------------------- */

struct ar_case {
    int dtype, red;
    size_t count;
    uint64_t seed;
    int in_place;
    unsigned char *shared;          /* n * count * elt: each rank's result, for the parent */
};

static int s_ar_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct ar_case *k = ud;
    size_t elt = rx_comm_dtype_size (k->dtype), bytes = k->count * elt;
    unsigned char *send = malloc (bytes + 1), *recv = malloc (bytes + 1), *ref = malloc (bytes + 1);
    s_fill (send, k->dtype, k->seed, rank, k->count);
    memset (recv, 0xab, bytes);
    struct rx_err err = { 0 };
    int rc = k->in_place ? e->ops->all_reduce (c, NULL, send, send, k->count, k->dtype, k->red, &err)
                         : e->ops->all_reduce (c, NULL, send, recv, k->count, k->dtype, k->red, &err);
    CHECK (rc == RX_OK, "all_reduce: %s", err.msg);
    unsigned char *out = k->in_place ? send : recv;
    s_ref_reduce (ref, k->dtype, k->red, k->seed, n, k->count, 0);
    for (size_t i = 0; i < bytes; i++)
        CHECK (out[i] == ref[i], "%s red %d count %zu: byte %zu (element %zu) differs: %02x vs %02x",
               rx_dtype_name (k->dtype), k->red, k->count, i, i / elt, out[i], ref[i]);
    if (k->shared) memcpy (k->shared + (size_t) rank * bytes, out, bytes);
    free (send);
    free (recv);
    free (ref);
    return 0;
}

static void s_ar (const char *ini, int n, int dtype, int red, size_t count, int in_place, int shared)
{
    struct env e;
    s_load (&e, ini);
    struct ar_case k = { dtype, red, count, (uint64_t) (count * 31 + dtype * 7 + red + n), in_place, NULL };
    size_t bytes = count * rx_comm_dtype_size (dtype);
    if (shared) {
        k.shared = mmap (NULL, bytes * n + 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        cr_assert_neq (k.shared, MAP_FAILED);
    }
    s_run_ranks (&e, n, 30, s_ar_rank, &k);
    if (shared) {
        for (int r = 1; r < n; r++)
            cr_assert_eq (memcmp (k.shared, k.shared + (size_t) r * bytes, bytes), 0,
                          "rank %d's all_reduce result differs from rank 0's", r);
        munmap (k.shared, bytes * n + 1);
    }
    s_close (&e);
}

Test (comm_shm, all_reduce_f32_sum_2_3_4_ranks_bitwise_identical)
{
    for (int n = 2; n <= 4; n++) s_ar (NULL, n, RX_F32, RX_COMM_SUM, 10007, 0, 1);
}

Test (comm_shm, all_reduce_every_dtype_and_reduction)
{
    const int dts[] = { RX_F32, RX_F16, RX_BF16, RX_I32, RX_I64 };
    for (size_t d = 0; d < 5; d++)
        for (int red = RX_COMM_SUM; red <= RX_COMM_MIN; red++)
            s_ar (NULL, 3, dts[d], red, 1000 + d * 37, 0, 0);
}

Test (comm_shm, all_reduce_chunked_and_in_place)
{
    /* 4 KiB buffers: 1024 floats a chunk; 10007 is ten chunks and a tail. */
    const char *ini = "[comm.shm]\nbuffer_size = 4K\n";
    s_ar (ini, 3, RX_F32, RX_COMM_SUM, 10007, 0, 1);
    s_ar (ini, 4, RX_BF16, RX_COMM_MAX, 5000, 1, 0);
    s_ar (ini, 2, RX_I64, RX_COMM_SUM, 3001, 1, 1);
    s_ar (NULL, 2, RX_F32, RX_COMM_SUM, 0, 0, 0);           /* zero elements */
    s_ar (NULL, 3, RX_F32, RX_COMM_MIN, 1, 0, 0);
}

Test (comm_shm, one_rank_group)
{
    s_ar (NULL, 1, RX_F32, RX_COMM_SUM, 100, 0, 0);
}

/* ---- all_gather, reduce_scatter, broadcast, all_to_all_v, barrier -------- */

struct misc_case {
    size_t count;       /* all_gather / reduce_scatter / broadcast elements; a2a max per pair */
};

/* Element counts rank s sends rank p (zeros included). */
static size_t s_a2a_count (int s, int p, size_t max)
{
    if ((s + 2 * p) % 3 == 0) return 0;
    return (size_t) (s_mix ((uint64_t) s * 131 + (uint64_t) p) % (max + 1));
}

static int s_misc_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct misc_case *k = ud;
    size_t cnt = k->count;
    struct rx_err err = { 0 };
    int rc;

    /* all_gather (out of place, then in place) */
    float *send = malloc ((cnt + 1) * sizeof (float));
    float *all = malloc ((cnt * n + 1) * sizeof (float));
    float *ref = malloc ((cnt * n + 1) * sizeof (float));
    for (int r = 0; r < n; r++) s_fill (ref + (size_t) r * cnt, RX_F32, 5, r, cnt);
    s_fill (send, RX_F32, 5, rank, cnt);
    rc = e->ops->all_gather (c, NULL, send, all, cnt, RX_F32, &err);
    CHECK (rc == RX_OK, "all_gather: %s", err.msg);
    CHECK (memcmp (all, ref, cnt * n * sizeof (float)) == 0, "all_gather result differs");
    memset (all, 0, cnt * n * sizeof (float));
    memcpy (all + (size_t) rank * cnt, send, cnt * sizeof (float));
    rc = e->ops->all_gather (c, NULL, all + (size_t) rank * cnt, all, cnt, RX_F32, &err);
    CHECK (rc == RX_OK, "all_gather in place: %s", err.msg);
    CHECK (memcmp (all, ref, cnt * n * sizeof (float)) == 0, "in-place all_gather result differs");

    /* reduce_scatter: my send is n*cnt elements; I get block `rank` reduced */
    int32_t *rs_send = malloc ((cnt * n + 1) * 4), *rs_recv = malloc ((cnt + 1) * 4);
    int32_t *rs_ref = malloc ((cnt * n + 1) * 4);
    s_fill (rs_send, RX_I32, 9, rank, cnt * n);
    rc = e->ops->reduce_scatter (c, NULL, rs_send, rs_recv, cnt, RX_I32, RX_COMM_SUM, &err);
    CHECK (rc == RX_OK, "reduce_scatter: %s", err.msg);
    s_ref_reduce (rs_ref, RX_I32, RX_COMM_SUM, 9, n, cnt, (size_t) rank * cnt);
    CHECK (memcmp (rs_recv, rs_ref, cnt * 4) == 0, "reduce_scatter result differs");
    float *fs_send = malloc ((cnt * n + 1) * 4), *fs_recv = malloc ((cnt + 1) * 4), *fs_ref = malloc ((cnt + 1) * 4);
    s_fill (fs_send, RX_F32, 10, rank, cnt * n);
    rc = e->ops->reduce_scatter (c, NULL, fs_send, fs_recv, cnt, RX_F32, RX_COMM_MAX, &err);
    CHECK (rc == RX_OK, "reduce_scatter f32 max: %s", err.msg);
    s_ref_reduce (fs_ref, RX_F32, RX_COMM_MAX, 10, n, cnt, (size_t) rank * cnt);
    CHECK (memcmp (fs_recv, fs_ref, cnt * 4) == 0, "reduce_scatter f32 max result differs");

    /* broadcast from every root */
    for (int root = 0; root < n; root++) {
        int64_t *b = malloc ((cnt + 1) * 8), *bref = malloc ((cnt + 1) * 8);
        s_fill (bref, RX_I64, 100 + (uint64_t) root, root, cnt);
        if (rank == root) memcpy (b, bref, cnt * 8);
        else memset (b, 0x5a, cnt * 8);
        rc = e->ops->broadcast (c, NULL, b, cnt, RX_I64, root, &err);
        CHECK (rc == RX_OK, "broadcast root %d: %s", root, err.msg);
        CHECK (memcmp (b, bref, cnt * 8) == 0, "broadcast from root %d differs", root);
        free (b);
        free (bref);
    }

    /* all_to_all_v: segments laid out in reverse peer order with gaps, so
     * displacements matter; value = sender << 24 | receiver << 16 | index */
    size_t sc[16], sd[16], rcn[16], rd[16], soff = 3, roff = 5;
    for (int p = n - 1; p >= 0; p--) {
        sc[p] = s_a2a_count (rank, p, cnt);
        sd[p] = soff;
        soff += sc[p] + 2;
        rcn[p] = s_a2a_count (p, rank, cnt);
        rd[p] = roff;
        roff += rcn[p] + 1;
    }
    int32_t *as = malloc (soff * 4), *ar = malloc (roff * 4);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < sc[p]; i++) as[sd[p] + i] = (int32_t) ((rank << 24) | (p << 16) | (int) i);
    memset (ar, 0xee, roff * 4);
    rc = e->ops->all_to_all_v (c, NULL, as, sc, sd, ar, rcn, rd, RX_I32, &err);
    CHECK (rc == RX_OK, "all_to_all_v: %s", err.msg);
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < rcn[p]; i++)
            CHECK (ar[rd[p] + i] == (int32_t) ((p << 24) | (rank << 16) | (int) i),
                   "all_to_all_v: element %zu from rank %d is %08x", i, p, (unsigned) ar[rd[p] + i]);
        CHECK (ar[rd[p] + rcn[p]] == (int32_t) 0xeeeeeeee, "all_to_all_v wrote past segment from rank %d", p);
    }
    /* all zero counts */
    size_t z[16] = { 0 };
    rc = e->ops->all_to_all_v (c, NULL, NULL, z, z, NULL, z, z, RX_I32, &err);
    CHECK (rc == RX_OK, "all_to_all_v zero counts: %s", err.msg);

    rc = e->ops->barrier (c, NULL, &err);
    CHECK (rc == RX_OK, "barrier: %s", err.msg);
    rc = e->ops->check (c, &err);
    CHECK (rc == RX_OK, "check: %s", err.msg);
    free (send); free (all); free (ref); free (rs_send); free (rs_recv); free (rs_ref);
    free (fs_send); free (fs_recv); free (fs_ref); free (as); free (ar);
    return 0;
}

Test (comm_shm, gather_scatter_broadcast_all_to_all_v_2_3_4_ranks)
{
    for (int n = 2; n <= 4; n++) {
        struct env e;
        s_load (&e, NULL);
        struct misc_case k = { 777 };
        s_run_ranks (&e, n, 30, s_misc_rank, &k);
        s_close (&e);
    }
}

Test (comm_shm, every_collective_chunked)
{
    /* 4 KiB buffers: every collective needs several rounds at these counts. */
    struct env e;
    s_load (&e, "[comm.shm]\nbuffer_size = 4K\n");
    struct misc_case k = { 2500 };
    s_run_ranks (&e, 3, 30, s_misc_rank, &k);
    s_close (&e);
}

/* ---- start / wait -------------------------------------------------------- */

static int s_async_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    size_t cnt = 3000;
    float *a = malloc (cnt * 4), *aref = malloc (cnt * 4), *g = malloc (cnt * n * 4), *gref = malloc (cnt * n * 4);
    float *b = malloc (cnt * 4), *bref = malloc (cnt * 4);
    s_fill (a, RX_F32, 21, rank, cnt);
    s_ref_reduce (aref, RX_F32, RX_COMM_SUM, 21, n, cnt, 0);
    for (int r = 0; r < n; r++) s_fill (gref + (size_t) r * cnt, RX_F32, 22, r, cnt);
    float *mine = malloc (cnt * 4);
    s_fill (mine, RX_F32, 22, rank, cnt);
    s_fill (bref, RX_F32, 23, 1, cnt);
    if (rank == 1) memcpy (b, bref, cnt * 4);
    struct rx_comm_op o1 = { .struct_size = sizeof o1, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                             .red = RX_COMM_SUM, .send = a, .recv = a, .count = cnt };
    struct rx_comm_op o2 = { .struct_size = sizeof o2, .kind = RX_COMM_ALL_GATHER, .dtype = RX_F32,
                             .send = mine, .recv = g, .count = cnt };
    struct rx_comm_op o3 = { .struct_size = sizeof o3, .kind = RX_COMM_BROADCAST, .dtype = RX_F32,
                             .root = 1, .send = b, .recv = b, .count = cnt };
    struct rx_comm_op o4 = { .struct_size = sizeof o4, .kind = RX_COMM_BARRIER };
    rx_comm_req_t *q[4] = { 0 };
    struct rx_err err = { 0 };
    const struct rx_comm_op *ops[4] = { &o1, &o2, &o3, &o4 };
    for (int i = 0; i < 4; i++) {
        int rc = e->ops->start (c, ops[i], &q[i], &err);
        CHECK (rc == RX_OK && q[i], "start %d: %s", i, err.msg);
    }
    for (int i = 0; i < 4; i++) {
        int rc = e->ops->wait (c, q[i], &err);
        CHECK (rc == RX_OK, "wait %d: %s", i, err.msg);
    }
    CHECK (memcmp (a, aref, cnt * 4) == 0, "started all_reduce result differs");
    CHECK (memcmp (g, gref, cnt * n * 4) == 0, "started all_gather result differs");
    CHECK (memcmp (b, bref, cnt * 4) == 0, "started broadcast result differs");
    free (a); free (aref); free (g); free (gref); free (b); free (bref); free (mine);
    return 0;
}

Test (comm_shm, start_and_wait)
{
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 3, 10, s_async_rank, NULL);
    s_close (&e);
}

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Threads of this process (/proc/self/task entries). */
static int s_n_threads (void)
{
    DIR *d = opendir ("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir (d)))
        if (de->d_name[0] != '.') n++;
    closedir (d);
    return n;
}

/* Something for the CPU while the collectives are in flight: a sum the
 * rank can check against a closed form. */
static double s_cpu_work (size_t n)
{
    double acc = 0;
    for (size_t i = 1; i <= n; i++) acc += (double) i;
    return acc;
}

/* start all_reduce + all_gather (chunked), compute meanwhile, wait both. */
static int s_overlap_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    size_t cnt = *(const size_t *) ud;
    float *a = malloc (cnt * 4), *aref = malloc (cnt * 4);
    float *mine = malloc (cnt * 4), *g = malloc (cnt * n * 4), *gref = malloc (cnt * n * 4);
    s_fill (a, RX_F32, 31, rank, cnt);
    s_fill (mine, RX_F32, 32, rank, cnt);
    struct rx_comm_op o1 = { .struct_size = sizeof o1, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                             .red = RX_COMM_SUM, .send = a, .recv = a, .count = cnt };
    struct rx_comm_op o2 = { .struct_size = sizeof o2, .kind = RX_COMM_ALL_GATHER, .dtype = RX_F32,
                             .send = mine, .recv = g, .count = cnt };
    rx_comm_req_t *q1 = NULL, *q2 = NULL;
    struct rx_err err = { 0 };
    CHECK (e->ops->start (c, &o1, &q1, &err) == RX_OK, "start all_reduce: %s", err.msg);
    memset (&o1, 0xff, sizeof o1);               /* start() copied it */
    CHECK (e->ops->start (c, &o2, &q2, &err) == RX_OK, "start all_gather: %s", err.msg);
    /* the references are the CPU work done while the ops run */
    s_ref_reduce (aref, RX_F32, RX_COMM_SUM, 31, n, cnt, 0);
    for (int r = 0; r < n; r++) s_fill (gref + (size_t) r * cnt, RX_F32, 32, r, cnt);
    double sum = s_cpu_work (1000000);
    CHECK (sum == 1000000.0 * 1000001.0 / 2, "cpu work %.17g", sum);
    CHECK (e->ops->wait (c, q2, &err) == RX_OK, "wait all_gather: %s", err.msg);   /* out of order */
    CHECK (e->ops->wait (c, q1, &err) == RX_OK, "wait all_reduce: %s", err.msg);
    CHECK (memcmp (a, aref, cnt * 4) == 0, "started all_reduce result differs");
    CHECK (memcmp (g, gref, cnt * n * 4) == 0, "started all_gather result differs");
    CHECK_OK (e->ops->check (c, &e_));
    free (a); free (aref); free (mine); free (g); free (gref);
    return 0;
}

Test (comm_shm, started_ops_overlap_cpu_work_2_3_ranks)
{
    size_t cnt = 50000;                          /* 200 KB: 13 chunks of 16 KiB */
    for (int n = 2; n <= 3; n++) {
        struct env e;
        s_load (&e, "[comm.shm]\nbuffer_size = 16K\n");
        s_run_ranks (&e, n, 10, s_overlap_rank, &cnt);
        s_close (&e);
    }
}

/* Rank 1 starts 200 ms late: rank 0's start() returns at once and its
 * wait() only when rank 1 has joined in. */
static int s_late_peer_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    size_t cnt = 1000;
    float *a = malloc (cnt * 4), *aref = malloc (cnt * 4);
    s_fill (a, RX_F32, 41, rank, cnt);
    s_ref_reduce (aref, RX_F32, RX_COMM_SUM, 41, n, cnt, 0);
    struct rx_comm_op o = { .struct_size = sizeof o, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                            .red = RX_COMM_SUM, .send = a, .recv = a, .count = cnt };
    rx_comm_req_t *q = NULL;
    struct rx_err err = { 0 };
    if (rank == 1) usleep (200000);
    double t0 = s_now ();
    CHECK (e->ops->start (c, &o, &q, &err) == RX_OK, "start: %s", err.msg);
    double t_start = s_now () - t0;
    CHECK (e->ops->wait (c, q, &err) == RX_OK, "wait: %s", err.msg);
    double t_wait = s_now () - t0;
    CHECK (memcmp (a, aref, cnt * 4) == 0, "all_reduce result differs");
    if (rank == 0) {
        CHECK (t_start < 0.05, "start() took %.3f s (it must not wait for the peer)", t_start);
        CHECK (t_wait > 0.15 && t_wait < 2, "wait() returned after %.3f s (peer started 0.2 s late)",
               t_wait);
    }
    free (a); free (aref);
    return 0;
}

Test (comm_shm, start_returns_at_once_wait_waits_for_late_peer)
{
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 10, s_late_peer_rank, NULL);
    s_close (&e);
}

/* A blocking collective after a start without wait: runs after the started
 * op on every rank (whatever the timing), both results right. */
static int s_mixed_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    size_t ca = 7000, cb = 700;
    float *a = malloc (ca * 4), *aref = malloc (ca * 4);
    int32_t *b = malloc (cb * 4), *g = malloc (cb * n * 4), *gref = malloc (cb * n * 4);
    float *d = malloc (cb * 4), *dref = malloc (cb * 4);
    s_fill (a, RX_F32, 51, rank, ca);
    s_ref_reduce (aref, RX_F32, RX_COMM_SUM, 51, n, ca, 0);
    s_fill (b, RX_I32, 52, rank, cb);
    for (int r = 0; r < n; r++) s_fill (gref + (size_t) r * cb, RX_I32, 52, r, cb);
    s_fill (d, RX_F32, 53, rank, cb);
    s_ref_reduce (dref, RX_F32, RX_COMM_MAX, 53, n, cb, 0);
    struct rx_comm_op o = { .struct_size = sizeof o, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                            .red = RX_COMM_SUM, .send = a, .recv = a, .count = ca };
    rx_comm_req_t *q = NULL;
    struct rx_err err = { 0 };
    if (rank == 2) usleep (100000);              /* late to start */
    CHECK (e->ops->start (c, &o, &q, &err) == RX_OK, "start: %s", err.msg);
    if (rank == 1) usleep (100000);              /* late to the blocking call */
    CHECK (e->ops->all_gather (c, NULL, b, g, cb, RX_I32, &err) == RX_OK, "all_gather: %s", err.msg);
    /* the rule (comm.h): the blocking call ran after the started op */
    CHECK (memcmp (a, aref, ca * 4) == 0, "started all_reduce not done when the blocking call returned");
    CHECK (memcmp (g, gref, cb * n * 4) == 0, "blocking all_gather result differs");
    CHECK (e->ops->all_reduce (c, NULL, d, d, cb, RX_F32, RX_COMM_MAX, &err) == RX_OK,
           "all_reduce: %s", err.msg);
    CHECK (e->ops->wait (c, q, &err) == RX_OK, "wait: %s", err.msg);
    CHECK (memcmp (d, dref, cb * 4) == 0, "second blocking all_reduce result differs");
    free (a); free (aref); free (b); free (g); free (gref); free (d); free (dref);
    return 0;
}

Test (comm_shm, blocking_call_after_start_runs_in_order)
{
    struct env e;
    s_load (&e, "[comm.shm]\nbuffer_size = 8K\n");
    s_run_ranks (&e, 3, 10, s_mixed_rank, NULL);
    s_close (&e);
}

/* No progress thread unless start() is called; destroy joins it. */
static int s_thread_count_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    int base = *(const int *) ud;
    CHECK_OK (e->ops->barrier (c, NULL, &e_));
    float x[8] = { 1 };
    CHECK_OK (e->ops->all_reduce (c, NULL, x, x, 8, RX_F32, RX_COMM_SUM, &e_));
    CHECK (s_n_threads () == base, "%d threads after blocking calls (expected %d)", s_n_threads (), base);
    struct rx_comm_op o = { .struct_size = sizeof o, .kind = RX_COMM_BARRIER };
    rx_comm_req_t *q = NULL;
    CHECK_OK (e->ops->start (c, &o, &q, &e_));
    CHECK (s_n_threads () == base + 1, "%d threads after start (expected %d)", s_n_threads (), base + 1);
    CHECK_OK (e->ops->wait (c, q, &e_));
    return 0;
}

static int s_count_threads_main (struct env *e, int rank, int n)
{
    int base = s_n_threads ();
    struct rx_err err = { 0 };
    void *c = NULL;
    if (s_create (e, rank, n, 10, &c, &err)) {
        fprintf (stderr, "rank %d: create: %s\n", rank, err.msg);
        return 1;
    }
    int r = s_thread_count_rank (e, c, rank, n, &base);
    e->ops->destroy (c);
    if (!r && s_n_threads () != base) {
        fprintf (stderr, "rank %d: %d threads after destroy (expected %d)\n", rank, s_n_threads (), base);
        r = 1;
    }
    return r;
}

Test (comm_shm, progress_thread_only_after_start)
{
    struct env e;
    s_load (&e, NULL);
    pid_t pid = fork ();
    if (pid == 0) {
        alarm (30);
        _exit (s_count_threads_main (&e, 1, 2));
    }
    cr_assert_eq (s_count_threads_main (&e, 0, 2), 0);
    int st = 0;
    waitpid (pid, &st, 0);
    cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "rank 1 failed");
    s_close (&e);
}

Test (comm_shm, start_wait_bad_use)
{
    struct env e;
    s_load (&e, NULL);
    struct rx_err err = { 0 };
    void *c = NULL;
    cr_assert_eq (s_create (&e, 0, 1, 2, &c, &err), RX_OK, "%s", err.msg);
    struct rx_comm_op o = { .struct_size = sizeof o, .kind = RX_COMM_BARRIER };
    rx_comm_req_t *q[RX_COMM_MAX_INFLIGHT + 1] = { 0 };
    /* waiting frees a slot: many more than the limit over time is fine */
    for (int i = 0; i < 3 * RX_COMM_MAX_INFLIGHT; i++) {
        cr_assert_eq (e.ops->start (c, &o, &q[0], &err), RX_OK, "start %d: %s", i, err.msg);
        cr_assert_eq (e.ops->wait (c, q[0], &err), RX_OK, "wait %d: %s", i, err.msg);
    }
    /* a req waited on already, or not one of ours: an error, group intact */
    cr_assert_eq (e.ops->wait (c, q[0], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "not a started, unwaited operation"), "%s", err.msg);
    int junk[64];
    cr_assert_eq (e.ops->wait (c, (rx_comm_req_t *) junk, &err), RX_EINVAL);
    cr_assert_eq (e.ops->wait (c, NULL, &err), RX_EINVAL);
    cr_assert_eq (e.ops->start (c, NULL, &q[0], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "NULL instance, op or req"), "%s", err.msg);
    cr_assert_eq (e.ops->check (c, &err), RX_OK, "%s", err.msg);
    /* more than RX_COMM_MAX_INFLIGHT started and not waited on */
    for (int i = 0; i < RX_COMM_MAX_INFLIGHT; i++)
        cr_assert_eq (e.ops->start (c, &o, &q[i], &err), RX_OK, "start %d: %s", i, err.msg);
    rx_comm_req_t *q5 = (rx_comm_req_t *) 1;
    cr_assert_eq (e.ops->start (c, &o, &q5, &err), RX_EINVAL);
    cr_assert_null (q5);
    cr_assert (strstr (err.msg, "4 operations already in flight (max 4"), "%s", err.msg);
    cr_assert (strstr (err.msg, e.group), "%s", err.msg);
    /* the group is broken: the started ops end (either way), later calls fail at once */
    for (int i = 0; i < RX_COMM_MAX_INFLIGHT; i++) {
        int rc = e.ops->wait (c, q[i], &err);
        cr_assert (rc == RX_OK || rc == RX_EINVAL, "wait %d -> %d", i, rc);
    }
    struct rx_err e2 = { 0 };
    cr_assert_eq (e.ops->barrier (c, NULL, &e2), RX_EINVAL);
    cr_assert (strstr (e2.msg, "already in flight"), "%s", e2.msg);
    cr_assert_eq (e.ops->start (c, &o, &q[0], &e2), RX_EINVAL);
    cr_assert_null (q[0]);
    cr_assert_eq (e.ops->check (c, &e2), RX_EINVAL);
    e.ops->destroy (c);
    /* an op struct too short */
    cr_assert_eq (s_create (&e, 0, 1, 2, &c, &err), RX_OK, "%s", err.msg);
    o.struct_size = 8;
    cr_assert_eq (e.ops->start (c, &o, &q[0], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "op struct too short (8 bytes)"), "%s", err.msg);
    e.ops->destroy (c);
    s_close (&e);
}

/* A peer dies, or is stuck, while ops are started: every wait returns the
 * error within the timeout. */
static int s_started_peer_fails_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    int dies = *(const int *) ud;
    float x[64] = { 1 }, y[128];
    CHECK_OK (e->ops->all_reduce (c, NULL, x, x, 64, RX_F32, RX_COMM_SUM, &e_));
    if (rank == 1) {
        if (dies) _exit (0);                   /* no destroy */
        usleep (1500000);                      /* stuck past the 0.5 s timeout */
        return 0;
    }
    struct rx_comm_op o1 = { .struct_size = sizeof o1, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                             .red = RX_COMM_SUM, .send = x, .recv = x, .count = 64 };
    struct rx_comm_op o2 = { .struct_size = sizeof o2, .kind = RX_COMM_ALL_GATHER, .dtype = RX_F32,
                             .send = x, .recv = y, .count = 64 };
    rx_comm_req_t *q1 = NULL, *q2 = NULL;
    struct rx_err err = { 0 }, err2 = { 0 };
    double t0 = s_now ();
    CHECK_OK (e->ops->start (c, &o1, &q1, &e_));
    CHECK_OK (e->ops->start (c, &o2, &q2, &e_));
    int rc = e->ops->wait (c, q1, &err);
    double dt = s_now () - t0;
    int rc2 = e->ops->wait (c, q2, &err2);
    if (dies) {
        CHECK (rc == RX_EIO, "wait with a dead peer -> %d (%s)", rc, err.msg);
        CHECK (strstr (err.msg, "rank 1 (pid ") && strstr (err.msg, "is gone"), "%s", err.msg);
        CHECK (dt < 2, "noticing took %.2f s (timeout 2 s)", dt);
    } else {
        CHECK (rc == RX_ETIMEDOUT, "wait with a stuck peer -> %d (%s)", rc, err.msg);
        CHECK (strstr (err.msg, "rank 1 did not reach all_reduce #2 within 0.5 s"), "%s", err.msg);
        CHECK (dt > 0.45 && dt < 3, "timing out took %.2f s", dt);
    }
    CHECK (rc2 == rc && strcmp (err2.msg, err.msg) == 0, "second wait: %d %s", rc2, err2.msg);
    CHECK (e->ops->check (c, &err2) == rc, "check after the failure");
    return 0;
}

Test (comm_shm, peer_dies_or_hangs_while_ops_are_started)
{
    int dies = 1;
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 2, s_started_peer_fails_rank, &dies);
    s_close (&e);
    dies = 0;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 0.5, s_started_peer_fails_rank, &dies);
    s_close (&e);
}

/* destroy() with a started op: it lets the op finish with a peer that runs
 * it (the peer's result is right), or gives up after the timeout. */
static int s_destroy_inflight_main (struct env *e, int rank, int n, int peer_comes)
{
    struct rx_err err = { 0 };
    void *c = NULL;
    double timeout = peer_comes ? 10 : 0.5;
    if (s_create (e, rank, n, timeout, &c, &err)) {
        fprintf (stderr, "rank %d: create: %s\n", rank, err.msg);
        return 1;
    }
    size_t cnt = 3000;
    float *a = malloc (cnt * 4), *aref = malloc (cnt * 4);
    s_fill (a, RX_F32, 61, rank, cnt);
    s_ref_reduce (aref, RX_F32, RX_COMM_SUM, 61, n, cnt, 0);
    int ret = 0;
    if (rank == 0) {
        struct rx_comm_op o = { .struct_size = sizeof o, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                                .red = RX_COMM_SUM, .send = a, .recv = a, .count = cnt };
        rx_comm_req_t *q = NULL;
        CHECK (e->ops->start (c, &o, &q, &err) == RX_OK, "start: %s", err.msg);
        double t0 = s_now ();
        e->ops->destroy (c);                     /* no wait() */
        double dt = s_now () - t0;
        if (peer_comes) {
            CHECK (dt > 0.1 && dt < 5, "destroy took %.2f s (peer ran the op after 0.2 s)", dt);
            CHECK (memcmp (a, aref, cnt * 4) == 0, "destroy did not let the op finish");
        } else {
            CHECK (dt > 0.4 && dt < 3, "destroy took %.2f s (timeout 0.5 s)", dt);
        }
    } else {
        usleep (peer_comes ? 200000 : 1500000);
        int rc = e->ops->all_reduce (c, NULL, a, a, cnt, RX_F32, RX_COMM_SUM, &err);
        if (peer_comes) {
            CHECK (rc == RX_OK, "all_reduce with rank 0 in destroy: %s", err.msg);
            CHECK (memcmp (a, aref, cnt * 4) == 0, "all_reduce result differs");
        } else {
            /* rank 0's op timed out (or destroy gave up on it) and broke the group */
            CHECK (rc == RX_ETIMEDOUT, "all_reduce after rank 0 gave up -> %d (%s)", rc, err.msg);
            CHECK (strstr (err.msg, "rank 1 did not reach all_reduce #1 within 0.5 s")
                   || strstr (err.msg, "rank 0 was destroyed with 1 started operation(s)"), "%s", err.msg);
        }
        e->ops->destroy (c);
    }
    free (a); free (aref);
    return ret;
}

Test (comm_shm, destroy_with_a_started_op_does_not_hang)
{
    for (int peer_comes = 1; peer_comes >= 0; peer_comes--) {
        struct env e;
        s_load (&e, NULL);
        pid_t pid = fork ();
        if (pid == 0) {
            alarm (30);
            _exit (s_destroy_inflight_main (&e, 1, 2, peer_comes));
        }
        int r0 = s_destroy_inflight_main (&e, 0, 2, peer_comes);
        int st = 0;
        waitpid (pid, &st, 0);
        cr_assert_eq (r0, 0, "rank 0 failed (peer_comes %d)", peer_comes);
        cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "rank 1 failed (peer_comes %d)", peer_comes);
        s_close (&e);
    }
}

/* ---- ranks as threads of one process ------------------------------------- */

struct thr {
    struct env *e;
    int rank, n, rc;
};

static void *s_thread (void *arg)
{
    struct thr *t = arg;
    struct ar_case k = { RX_F32, RX_COMM_SUM, 20000, 77, 0, NULL };
    t->rc = s_rank_main (t->e, t->rank, t->n, 30, s_ar_rank, &k);
    return NULL;
}

Test (comm_shm, ranks_as_threads)
{
    struct env e;
    s_load (&e, "[comm.shm]\nbuffer_size = 16K\n");
    struct thr t[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        t[r] = (struct thr) { &e, r, 3, -1 };
        cr_assert_eq (pthread_create (&th[r], NULL, s_thread, &t[r]), 0);
    }
    for (int r = 0; r < 3; r++) pthread_join (th[r], NULL);
    for (int r = 0; r < 3; r++) cr_assert_eq (t[r].rc, 0, "thread rank %d failed", r);
    s_close (&e);
}

/* ---- failures ------------------------------------------------------------ */

/* Fork one process per rank in ranks[] that creates with timeout 0.5 s and
 * expects create to fail with RX_ETIMEDOUT and a message containing want. */
static int s_expect_create_timeout (struct env *e, int rank, int n, const char *want)
{
    struct rx_err err = { 0 };
    void *c = (void *) 1;
    double t0 = s_now ();
    int rc = s_create (e, rank, n, 0.5, &c, &err);
    double dt = s_now () - t0;
    CHECK (rc == RX_ETIMEDOUT, "create -> %d (%s)", rc, err.msg);
    CHECK (c == NULL, "create left a handle");
    CHECK (strstr (err.msg, want), "message \"%s\" lacks \"%s\"", err.msg, want);
    CHECK (dt > 0.4 && dt < 5, "create took %.2f s", dt);
    return 0;
}

Test (comm_shm, rank_that_never_joins_times_out_create)
{
    struct env e;
    s_load (&e, NULL);
    pid_t pid = fork ();
    if (pid == 0) _exit (s_expect_create_timeout (&e, 1, 3, "rank(s) 2 did not join within 0.5 s"));
    int st = 0;
    cr_assert_eq (s_expect_create_timeout (&e, 0, 3, "rank(s) 2 did not join within 0.5 s"), 0);
    waitpid (pid, &st, 0);
    cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "rank 1 failed");
    s_assert_no_segment (&e);
    /* rank 0 never comes */
    cr_assert_eq (s_expect_create_timeout (&e, 1, 2, "rank 0 did not create segment /radix-"), 0);
    s_close (&e);
}

static int s_dies_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct rx_err err = { 0 };
    float x[4] = { 1, 2, 3, 4 };
    CHECK_OK (e->ops->all_reduce (c, NULL, x, x, 4, RX_F32, RX_COMM_SUM, &e_));
    if (rank == 1) _exit (0);                  /* dies without leaving: no destroy */
    double t0 = s_now ();
    int rc = e->ops->all_reduce (c, NULL, x, x, 4, RX_F32, RX_COMM_SUM, &err);
    double dt = s_now () - t0;
    CHECK (rc == RX_EIO, "all_reduce with a dead peer -> %d (%s)", rc, err.msg);
    CHECK (strstr (err.msg, "rank 1 (pid ") && strstr (err.msg, "is gone"), "%s", err.msg);
    CHECK (dt < 5, "noticing took %.2f s", dt);
    /* broken: later calls fail at once with the same reason */
    struct rx_err e2 = { 0 };
    CHECK (e->ops->barrier (c, NULL, &e2) == RX_EIO, "barrier after break");
    CHECK (strcmp (e2.msg, err.msg) == 0, "%s vs %s", e2.msg, err.msg);
    CHECK (e->ops->check (c, &e2) == RX_EIO && strstr (e2.msg, "is gone"), "check: %s", e2.msg);
    return 0;
}

Test (comm_shm, dead_peer_fails_fast_not_hangs)
{
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 30, s_dies_rank, NULL);
    s_close (&e);
}

static int s_stuck_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct rx_err err = { 0 };
    float x[4] = { 1, 2, 3, 4 };
    CHECK_OK (e->ops->all_reduce (c, NULL, x, x, 4, RX_F32, RX_COMM_SUM, &e_));
    if (rank == 1) {
        usleep (1500000);                      /* stuck past the peer's timeout */
        double t0 = s_now ();
        int rc = e->ops->all_reduce (c, NULL, x, x, 4, RX_F32, RX_COMM_SUM, &err);
        CHECK (rc == RX_ETIMEDOUT, "late rank's all_reduce -> %d (%s)", rc, err.msg);
        CHECK (s_now () - t0 < 0.45, "late rank waited (the group was already broken)");
        CHECK (strstr (err.msg, "rank 1 did not reach all_reduce #2 within 0.5 s"), "%s", err.msg);
        return 0;
    }
    double t0 = s_now ();
    int rc = e->ops->all_reduce (c, NULL, x, x, 4, RX_F32, RX_COMM_SUM, &err);
    double dt = s_now () - t0;
    CHECK (rc == RX_ETIMEDOUT, "all_reduce with a stuck peer -> %d (%s)", rc, err.msg);
    CHECK (strstr (err.msg, "rank 1 did not reach all_reduce #2 within 0.5 s"), "%s", err.msg);
    CHECK (dt > 0.45 && dt < 3, "timing out took %.2f s", dt);
    return 0;
}

Test (comm_shm, stuck_peer_times_out_and_breaks_the_group)
{
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 0.5, s_stuck_rank, NULL);
    s_close (&e);
}

static int s_leaves_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct rx_err err = { 0 };
    if (rank == 1) return 0;                   /* destroys at once */
    int rc = e->ops->barrier (c, NULL, &err);
    rc = rc ? rc : e->ops->barrier (c, NULL, &err);
    CHECK (rc == RX_EIO, "barrier with a departed peer -> %d (%s)", rc, err.msg);
    CHECK (strstr (err.msg, "rank 1 left the group"), "%s", err.msg);
    return 0;
}

Test (comm_shm, peer_that_left_fails_the_next_collective)
{
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 30, s_leaves_rank, NULL);
    s_close (&e);
}

static int s_mismatch_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct rx_err err = { 0 };
    float x[16] = { 0 };
    int rc = e->ops->all_reduce (c, NULL, x, x, rank == 0 ? 8 : 9, RX_F32, RX_COMM_SUM, &err);
    CHECK (rc == RX_EINVAL, "mismatched all_reduce -> %d (%s)", rc, err.msg);
    CHECK (strstr (err.msg, "count 9") && strstr (err.msg, "count 8"), "%s", err.msg);
    return 0;
}

static int s_a2a_mismatch_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct rx_err err = { 0 };
    int32_t buf[16] = { 0 }, out[16];
    size_t sc[2] = { 2, 2 }, d[2] = { 0, 4 }, rc2[2] = { 2, rank == 0 ? 3 : 2 };
    int rc = e->ops->all_to_all_v (c, NULL, buf, sc, d, out, rc2, d, RX_I32, &err);
    if (rank == 0) {
        CHECK (rc == RX_EINVAL, "a2a mismatch -> %d (%s)", rc, err.msg);
        CHECK (strstr (err.msg, "rank 1 sends 2 elements to rank 0, which expects 3"), "%s", err.msg);
    } else {
        CHECK (rc == RX_EINVAL, "a2a mismatch on rank 1 -> %d (%s)", rc, err.msg);
    }
    return 0;
}

Test (comm_shm, mismatched_calls_fail_on_every_rank)
{
    struct env e;
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 5, s_mismatch_rank, NULL);
    s_close (&e);
    s_load (&e, NULL);
    s_run_ranks (&e, 2, 5, s_a2a_mismatch_rank, NULL);
    s_close (&e);
}

Test (comm_shm, bad_params)
{
    struct env e;
    s_load (&e, NULL);
    struct rx_err err = { 0 };
    void *c = (void *) 1;
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = 2, .n_rank = 2, .group = e.group,
                                .timeout_s = 1 };
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    cr_assert_null (c);
    cr_assert (strstr (err.msg, "rank 2 is out of range (0..1)"), "%s", err.msg);
    p.rank = 0;
    p.n_rank = 0;
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "n_rank 0"), "%s", err.msg);
    p.n_rank = 2;
    p.group = "a/b";
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "bad character"), "%s", err.msg);
    p.group = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";   /* 65 */
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "1..64 characters"), "%s", err.msg);
    p.group = NULL;
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    p.group = e.group;
    p.timeout_s = -1;
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "timeout_s"), "%s", err.msg);
    p.struct_size = 8;
    cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "too short"), "%s", err.msg);

    /* bad collective arguments on a one-rank group: each breaks it */
    const char *want[] = { "dtype q4_0 (2) is not supported", "unknown reduction 7",
                           "root 1 is out of range", "NULL buffer", "NULL counts" };
    for (int i = 0; i < 5; i++) {
        p = (struct rx_comm_params) { .struct_size = sizeof p, .rank = 0, .n_rank = 1,
                                      .group = e.group, .timeout_s = 1 };
        cr_assert_eq (e.ops->create (e.host, &p, &c, &err), RX_OK, "%s", err.msg);
        float x[4] = { 0 };
        int rc;
        switch (i) {
        case 0: rc = e.ops->all_reduce (c, NULL, x, x, 4, RX_Q4_0, RX_COMM_SUM, &err); break;
        case 1: rc = e.ops->all_reduce (c, NULL, x, x, 4, RX_F32, 7, &err); break;
        case 2: rc = e.ops->broadcast (c, NULL, x, 4, RX_F32, 1, &err); break;
        case 3: rc = e.ops->all_gather (c, NULL, NULL, x, 4, RX_F32, &err); break;
        default: rc = e.ops->all_to_all_v (c, NULL, x, NULL, NULL, x, NULL, NULL, RX_F32, &err); break;
        }
        cr_assert_eq (rc, RX_EINVAL, "case %d", i);
        cr_assert (strstr (err.msg, want[i]), "case %d: %s", i, err.msg);
        cr_assert (strstr (err.msg, e.group), "case %d: %s", i, err.msg);
        struct rx_err e2 = { 0 };
        cr_assert_eq (e.ops->barrier (c, NULL, &e2), RX_EINVAL, "broken group must fail at once");
        cr_assert_str_eq (e2.msg, err.msg);
        cr_assert_eq (e.ops->check (c, &e2), RX_EINVAL);
        e.ops->destroy (c);
        s_assert_no_segment (&e);
    }
    e.ops->destroy (NULL);
    s_close (&e);
}

static int s_barrier_rank (struct env *e, void *c, int rank, int n, void *ud)
{
    struct rx_err err = { 0 };
    int rc = e->ops->barrier (c, NULL, &err);
    CHECK (rc == RX_OK, "barrier: %s", err.msg);
    return 0;
}

Test (comm_shm, stale_segment_is_replaced)
{
    struct env e;
    s_load (&e, NULL);
    char path[128];
    snprintf (path, sizeof path, "/dev/shm/radix-%s", e.group);
    FILE *f = fopen (path, "w");
    cr_assert_not_null (f, "%s: %s", path, strerror (errno));
    fputs ("junk left by a crashed run", f);
    fclose (f);
    s_run_ranks (&e, 3, 10, s_barrier_rank, NULL);
    s_close (&e);
}

/* ---- graph capture (ABI 1.4) ---------------------------------------------- */

/* kernels-cpu with emulated graphs ([kernels.cpu] graphs = true) as the
 * backend: comm-shm issues its blocking collectives through host_fn, so a
 * capture records them and every launch runs them (comm.h
 * graph_capturable).  The plugin is loaded in the parent; ranks fork. */
struct kenv {
    rx_loader_t *l;
    rx_conf_t *conf;
    rx_plugin_t *pl;
    const struct rx_kernels_ops *K;
    const struct rx_host *host;
};

static void s_kload (struct kenv *k, const char *ini)
{
    struct rx_err err = { 0 };
    memset (k, 0, sizeof *k);
    k->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (k->l, "%s", err.msg);
    cr_assert_eq (rx_loader_find (k->l, RX_KIND_KERNELS, "cpu", &k->pl, &err), RX_OK, "%s", err.msg);
    k->conf = rx_conf_parse_string (ini, strlen (ini), "kernels-test.ini", &err);
    cr_assert_not_null (k->conf, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (k->pl, k->conf, &err), RX_OK, "%s", err.msg);
    k->K = rx_plugin_ops (k->pl);
    k->host = rx_plugin_host (k->pl);
}

static void s_kclose (struct kenv *k)
{
    rx_loader_destroy (&k->l);
    rx_conf_destroy (&k->conf);
}

static int s_create_k (struct env *e, int rank, int n, double timeout_s, const struct rx_kernels_ops *K,
                       void *be, void **c, struct rx_err *err)
{
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = rank, .n_rank = n, .group = e->group,
                                .timeout_s = timeout_s, .kops = K, .kbe = be };
    return e->ops->create (e->host, &p, c, err);
}

/* Rank r's input of launch l (small integers: sums are exact). */
static float s_gx (int l, int r, size_t i) { return (float) ((l * 7 + r * 3 + (int) (i % 97)) % 50); }

#define S_GKEY 0x51ull
#define S_SENT (-7.f)

struct gcase {
    struct kenv *k;
    size_t m;                    /* elements per rank (all_gather / reduce_scatter / all_reduce) */
    int die;                     /* rank 1 dies after the capture */
};

/* The captured step: s = 2x; g = all_gather (s[0..m)); rs = reduce_scatter
 * (s, SUM); ar = all_reduce (rs, MAX). */
static int s_step (struct env *e, void *c, const struct rx_kernels_ops *K, void *be, int n, size_t m,
                   float *dx, float *ds, float *dg, float *drs, float *dar, struct rx_err *err)
{
    int rc = K->scale (be, NULL, dx, n * m, ds, n * m, 1, n * m, 2.f, err);
    if (!rc) rc = e->ops->all_gather (c, NULL, ds, dg, m, RX_F32, err);
    if (!rc) rc = e->ops->reduce_scatter (c, NULL, ds, drs, m, RX_F32, RX_COMM_SUM, err);
    if (!rc) rc = e->ops->all_reduce (c, NULL, drs, dar, m, RX_F32, RX_COMM_MAX, err);
    return rc;
}

/* Fill a device buffer with v (through the backend: guard-safe). */
static int s_dfill (const struct rx_kernels_ops *K, void *be, float *d, size_t cnt, float v, float *tmp)
{
    struct rx_err err = { 0 };
    for (size_t i = 0; i < cnt; i++) tmp[i] = v;
    return K->copy_h2d (be, NULL, d, tmp, cnt * sizeof (float), &err);
}

static int s_graph_rank_body (struct env *e, struct gcase *g, int rank, int n)
{
    const struct rx_kernels_ops *K = g->k->K;
    struct rx_err err = { 0 };
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1, .device = 0 };
    void *be = NULL, *c = NULL;
    CHECK (K->create (g->k->host, &kp, &be, &err) == RX_OK, "kernels create: %s", err.msg);
    CHECK (s_create_k (e, rank, n, g->die ? 2 : 30, K, be, &c, &err) == RX_OK, "create: %s", err.msg);
    CHECK (e->ops->struct_size >= offsetof (struct rx_comm_ops, graph_capturable) + sizeof (void *)
           && e->ops->graph_capturable, "comm-shm has graph_capturable");
    CHECK (e->ops->graph_capturable (c) == 1, "capturable on kernels-cpu");
    size_t m = g->m, nm = (size_t) n * m;
    float *h = malloc (nm * sizeof (float)), *t = malloc (nm * sizeof (float));
    float *dx, *ds, *dg, *drs, *dar;
    int32_t *dcnt, *dcnts, hc[8];
    CHECK_OK (K->alloc (be, nm * 4, 0, (void **) &dx, &e_));
    CHECK_OK (K->alloc (be, nm * 4, 0, (void **) &ds, &e_));
    CHECK_OK (K->alloc (be, nm * 4, 0, (void **) &dg, &e_));
    CHECK_OK (K->alloc (be, m * 4, 0, (void **) &drs, &e_));
    CHECK_OK (K->alloc (be, m * 4, 0, (void **) &dar, &e_));
    CHECK_OK (K->alloc (be, 4, 0, (void **) &dcnt, &e_));
    CHECK_OK (K->alloc (be, 4 * (size_t) n, 0, (void **) &dcnts, &e_));
    /* capture: nothing may run (not the scale, not a collective) */
    for (size_t i = 0; i < nm; i++) h[i] = s_gx (0, rank, i);
    CHECK_OK (K->copy_h2d (be, NULL, dx, h, nm * 4, &e_));
    CHECK_OK (s_dfill (K, be, ds, nm, S_SENT, t));
    CHECK_OK (s_dfill (K, be, dg, nm, S_SENT, t));
    CHECK_OK (s_dfill (K, be, drs, m, S_SENT, t));
    CHECK_OK (s_dfill (K, be, dar, m, S_SENT, t));
    CHECK (K->graph_begin (be, NULL, S_GKEY, &err) == RX_OK, "graph_begin: %s", err.msg);
    CHECK (s_step (e, c, K, be, n, m, dx, ds, dg, drs, dar, &err) == RX_OK, "captured step: %s", err.msg);
    CHECK (K->graph_end (be, NULL, S_GKEY, &err) == RX_OK, "graph_end: %s", err.msg);
    CHECK (K->graph_has (be, S_GKEY), "graph kept");
    float *dbufs[] = { ds, dg, drs, dar };
    size_t dn[] = { nm, nm, m, m };
    for (int b = 0; b < 4; b++) {
        CHECK_OK (K->copy_d2h (be, NULL, t, dbufs[b], dn[b] * 4, &e_));
        for (size_t i = 0; i < dn[b]; i++) CHECK (t[i] == S_SENT, "buffer %d [%zu] written during the capture", b, i);
    }
    if (g->die) {
        if (rank == 1) _exit (0);                 /* gone before the launch, no destroy */
        /* the launch cannot fail (host_fn), its collective breaks the group */
        double t0 = s_now ();
        CHECK (K->graph_launch (be, NULL, S_GKEY, &err) == RX_OK, "launch: %s", err.msg);
        CHECK (s_now () - t0 < 5, "noticing the dead peer took %.2f s", s_now () - t0);
        int rc = e->ops->check (c, &err);
        CHECK (rc == RX_EIO, "check after the launch -> %d (%s)", rc, err.msg);
        CHECK (strstr (err.msg, "rank 1 (pid ") && strstr (err.msg, "is gone")
               && strstr (err.msg, "all_gather #1"), "check names the peer and the op: %s", err.msg);
        struct rx_err e2 = { 0 };
        t0 = s_now ();
        rc = e->ops->all_reduce (c, NULL, drs, dar, m, RX_F32, RX_COMM_SUM, &e2);
        CHECK (rc == RX_EIO && strcmp (e2.msg, err.msg) == 0, "later call -> %d (%s)", rc, e2.msg);
        CHECK (K->graph_launch (be, NULL, S_GKEY, &e2) == RX_OK, "relaunch: %s", e2.msg);
        CHECK (e->ops->check (c, &e2) == RX_EIO && strcmp (e2.msg, err.msg) == 0, "%s", e2.msg);
        CHECK (s_now () - t0 < 0.5, "later calls fail at once (%.2f s)", s_now () - t0);
    } else {
        for (int l = 1; l <= 3; l++) {
            for (size_t i = 0; i < nm; i++) h[i] = s_gx (l, rank, i);
            CHECK_OK (K->copy_h2d (be, NULL, dx, h, nm * 4, &e_));
            for (int b = 0; b < 4; b++) CHECK_OK (s_dfill (K, be, dbufs[b], dn[b], S_SENT, t));
            CHECK (K->graph_launch (be, NULL, S_GKEY, &err) == RX_OK, "launch %d: %s", l, err.msg);
            CHECK (e->ops->check (c, &err) == RX_OK, "check after launch %d: %s", l, err.msg);
            CHECK_OK (K->copy_d2h (be, NULL, t, dg, nm * 4, &e_));
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < m; i++)
                    CHECK (t[r * m + i] == 2.f * s_gx (l, r, i), "launch %d: all_gather [%d][%zu] = %g", l, r,
                           i, t[r * m + i]);
            CHECK_OK (K->copy_d2h (be, NULL, t, drs, m * 4, &e_));
            for (size_t i = 0; i < m; i++) {
                float want = 0;
                for (int r = 0; r < n; r++) want += 2.f * s_gx (l, r, (size_t) rank * m + i);
                CHECK (t[i] == want, "launch %d: reduce_scatter [%zu] = %g, want %g", l, i, t[i], want);
            }
            CHECK_OK (K->copy_d2h (be, NULL, t, dar, m * 4, &e_));
            for (size_t i = 0; i < m; i++) {
                float want = -1;
                for (int q = 0; q < n; q++) {
                    float sum = 0;
                    for (int r = 0; r < n; r++) sum += 2.f * s_gx (l, r, (size_t) q * m + i);
                    if (sum > want) want = sum;
                }
                CHECK (t[i] == want, "launch %d: all_reduce max [%zu] = %g, want %g", l, i, t[i], want);
            }
            /* an eager collective between launches (the DP count
             * all_gather before each step): runs at once, in order */
            int32_t mine = 100 * l + rank;
            CHECK_OK (K->copy_h2d (be, NULL, dcnt, &mine, 4, &e_));
            CHECK (e->ops->all_gather (c, NULL, dcnt, dcnts, 1, RX_I32, &err) == RX_OK, "eager: %s", err.msg);
            CHECK_OK (K->copy_d2h (be, NULL, hc, dcnts, 4 * (size_t) n, &e_));
            for (int r = 0; r < n; r++) CHECK (hc[r] == 100 * l + r, "eager all_gather [%d] = %d", r, hc[r]);
        }
    }
    free (h);
    free (t);
    e->ops->destroy (c);
    K->destroy (be);
    return 0;
}

static void s_graph_run (const char *comm_ini, int n, size_t m, int die)
{
    struct env e;
    struct kenv k;
    s_load (&e, comm_ini);
    s_kload (&k, "[kernels.cpu]\ngraphs = true\nthreads = 1\n");
    struct gcase g = { &k, m, die };
    pid_t pids[4];
    for (int r = 0; r < n; r++) {
        pids[r] = fork ();
        cr_assert_geq (pids[r], 0);
        if (pids[r] == 0) {
            alarm (60);
            _exit (s_graph_rank_body (&e, &g, r, n));
        }
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        cr_assert_eq (waitpid (pids[r], &st, 0), pids[r]);
        cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "rank %d of %d failed (status 0x%x; see stderr)",
                   r, n, st);
    }
    s_kclose (&k);
    if (!die) s_assert_no_segment (&e);
    rx_conf_destroy (&e.conf);
    rx_loader_destroy (&e.l);
}

/* Captured on every rank, replayed 3 times with new inputs and an eager
 * collective between launches; chunked (buffer_size 4 KiB: every
 * collective takes several buffer uses, so the parity of a launch depends
 * on what ran before it). */
Test (comm_shm, graph_captured_collectives_replay_2_3_ranks)
{
    s_graph_run (NULL, 2, 5, 0);
    s_graph_run ("[comm.shm]\nbuffer_size = 4096\n", 2, 1500, 0);
    s_graph_run ("[comm.shm]\nbuffer_size = 4096\n", 3, 1001, 0);
}

/* all_to_all_v captured (ep_low_latency's fixed exchange): rank r sends
 * peer p s_a2a_cnt (m, r, p) elements; segments in reverse peer order
 * with one-element gaps on both sides, so a wrong displacement shows.  The
 * step is s = 2x, then the all_to_all_v of s: the count arrays are the same
 * host arrays at every launch (comm-shm reads them when it runs). */
static size_t s_a2a_cnt (size_t m, int r, int p) { return m + (size_t) (3 * r + p); }
static float s_a2a_val (int l, int r, int p, size_t i) { return (float) ((l * 131 + r * 17 + p * 5 + (int) (i % 89)) % 1000); }

static int s_graph_a2a_body (struct env *e, struct gcase *g, int rank, int n)
{
    const struct rx_kernels_ops *K = g->k->K;
    struct rx_err err = { 0 };
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1, .device = 0 };
    void *be = NULL, *c = NULL;
    CHECK (K->create (g->k->host, &kp, &be, &err) == RX_OK, "kernels create: %s", err.msg);
    CHECK (s_create_k (e, rank, n, 30, K, be, &c, &err) == RX_OK, "create: %s", err.msg);
    CHECK (e->ops->graph_capturable (c) == 1, "capturable on kernels-cpu");
    size_t sc[4], sd[4], rcn[4], rd[4], ns = 1, nr = 1;
    for (int p = n - 1; p >= 0; p--) {           /* reverse order, gaps of 1 */
        sc[p] = s_a2a_cnt (g->m, rank, p);
        sd[p] = ns;
        ns += sc[p] + 1;
        rcn[p] = s_a2a_cnt (g->m, p, rank);
        rd[p] = nr;
        nr += rcn[p] + 1;
    }
    float *h = malloc ((ns > nr ? ns : nr) * sizeof (float)), *dx, *ds, *dr;
    CHECK (h, "out of memory");
    CHECK_OK (K->alloc (be, ns * 4, 0, (void **) &dx, &e_));
    CHECK_OK (K->alloc (be, ns * 4, 0, (void **) &ds, &e_));
    CHECK_OK (K->alloc (be, nr * 4, 0, (void **) &dr, &e_));
    CHECK_OK (s_dfill (K, be, dx, ns, 0.f, h));
    CHECK_OK (s_dfill (K, be, dr, nr, S_SENT, h));
    CHECK (K->graph_begin (be, NULL, S_GKEY, &err) == RX_OK, "graph_begin: %s", err.msg);
    CHECK (K->scale (be, NULL, dx, ns, ds, ns, 1, ns, 2.f, &err) == RX_OK, "captured scale: %s", err.msg);
    CHECK (e->ops->all_to_all_v (c, NULL, ds, sc, sd, dr, rcn, rd, RX_F32, &err) == RX_OK,
           "captured all_to_all_v: %s", err.msg);
    CHECK (K->graph_end (be, NULL, S_GKEY, &err) == RX_OK, "graph_end: %s", err.msg);
    CHECK_OK (K->copy_d2h (be, NULL, h, dr, nr * 4, &e_));
    for (size_t i = 0; i < nr; i++) CHECK (h[i] == S_SENT, "recv [%zu] written during the capture", i);
    for (int l = 1; l <= 3; l++) {
        for (size_t i = 0; i < ns; i++) h[i] = -1.f;
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < sc[p]; i++) h[sd[p] + i] = s_a2a_val (l, rank, p, i);
        CHECK_OK (K->copy_h2d (be, NULL, dx, h, ns * 4, &e_));
        CHECK_OK (s_dfill (K, be, dr, nr, S_SENT, h));
        CHECK (K->graph_launch (be, NULL, S_GKEY, &err) == RX_OK, "launch %d: %s", l, err.msg);
        CHECK (e->ops->check (c, &err) == RX_OK, "check after launch %d: %s", l, err.msg);
        CHECK_OK (K->copy_d2h (be, NULL, h, dr, nr * 4, &e_));
        CHECK (h[0] == S_SENT, "launch %d: wrote before the first segment", l);
        for (int q = 0; q < n; q++) {
            for (size_t i = 0; i < rcn[q]; i++)
                CHECK (h[rd[q] + i] == 2.f * s_a2a_val (l, q, rank, i), "launch %d: from rank %d [%zu] = %g, want %g",
                       l, q, i, h[rd[q] + i], 2.f * s_a2a_val (l, q, rank, i));
            CHECK (h[rd[q] + rcn[q]] == S_SENT, "launch %d: wrote past the segment from rank %d", l, q);
        }
    }
    free (h);
    K->free_ (be, dx);
    K->free_ (be, ds);
    K->free_ (be, dr);
    e->ops->destroy (c);
    K->destroy (be);
    return 0;
}

static void s_graph_a2a_run (const char *comm_ini, int n, size_t m)
{
    struct env e;
    struct kenv k;
    s_load (&e, comm_ini);
    s_kload (&k, "[kernels.cpu]\ngraphs = true\nthreads = 1\n");
    struct gcase g = { &k, m, 0 };
    pid_t pids[4];
    for (int r = 0; r < n; r++) {
        pids[r] = fork ();
        cr_assert_geq (pids[r], 0);
        if (pids[r] == 0) {
            alarm (60);
            _exit (s_graph_a2a_body (&e, &g, r, n));
        }
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        cr_assert_eq (waitpid (pids[r], &st, 0), pids[r]);
        cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "rank %d of %d failed (status 0x%x; see stderr)",
                   r, n, st);
    }
    s_kclose (&k);
    s_assert_no_segment (&e);
    rx_conf_destroy (&e.conf);
    rx_loader_destroy (&e.l);
}

/* all_to_all_v in a graph: nothing moves at capture; every launch moves
 * the launch's data with the counts and displacements of the arrays
 * (chunked too: buffer_size 4 KiB, segments of ~1000 floats). */
Test (comm_shm, graph_captured_all_to_all_v_replay_2_3_ranks)
{
    s_graph_a2a_run (NULL, 2, 5);
    s_graph_a2a_run ("[comm.shm]\nbuffer_size = 4096\n", 2, 1000);
    s_graph_a2a_run ("[comm.shm]\nbuffer_size = 4096\n", 3, 777);
}

/* A peer dies before the launch: the launched collective breaks the group,
 * check() names the op, every later call fails at once. */
Test (comm_shm, graph_launch_with_a_dead_peer_breaks_the_group)
{
    s_graph_run (NULL, 2, 5, 1);
}

/* graph_capturable: 1 on kernels-cpu (host_fn, synchronous), 0 without a
 * backend, 0 on a backend without host_fn (an older kernels plugin) --
 * whose collectives still run, eagerly. */
Test (comm_shm, graph_capturable_needs_a_synchronous_backend_with_host_fn)
{
    struct env e;
    struct kenv k;
    s_load (&e, NULL);
    s_kload (&k, "[kernels.cpu]\ngraphs = true\nthreads = 1\n");
    struct rx_err err = { 0 };
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1, .device = 0 };
    void *be = NULL, *c = NULL;
    cr_assert_eq (k.K->create (k.host, &kp, &be, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (s_create_k (&e, 0, 1, 5, NULL, NULL, &c, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.ops->graph_capturable (c), 0, "no backend");
    e.ops->destroy (c);
    cr_assert_eq (s_create_k (&e, 0, 1, 5, k.K, be, &c, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.ops->graph_capturable (c), 1, "kernels-cpu");
    e.ops->destroy (c);
    struct rx_kernels_ops old = *k.K;
    old.host_fn = NULL;
    cr_assert_eq (s_create_k (&e, 0, 1, 5, &old, be, &c, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.ops->graph_capturable (c), 0, "no host_fn");
    float one[4] = { 1, 2, 3, 4 }, got[4] = { 0 }, *d = NULL;
    cr_assert_eq (k.K->alloc (be, sizeof one, 0, (void **) &d, &err), RX_OK);
    cr_assert_eq (k.K->copy_h2d (be, NULL, d, one, sizeof one, &err), RX_OK);
    cr_assert_eq (e.ops->all_reduce (c, NULL, d, d, 4, RX_F32, RX_COMM_SUM, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (k.K->copy_d2h (be, NULL, got, d, sizeof got, &err), RX_OK);
    cr_assert (!memcmp (got, one, sizeof one));
    /* without host_fn a collective in a capture is not captured: its host
     * copies drop the capture and it fails */
    cr_assert_eq (k.K->graph_begin (be, NULL, 9, &err), RX_OK);
    cr_assert_neq (e.ops->all_reduce (c, NULL, d, d, 4, RX_F32, RX_COMM_SUM, &err), RX_OK);
    cr_assert (strstr (err.msg, "graph 9"), "%s", err.msg);
    cr_assert_eq (k.K->graph_end (be, NULL, 9, &err), RX_EINVAL, "the capture was dropped");
    e.ops->destroy (c);
    k.K->free_ (be, d);
    k.K->destroy (be);
    s_kclose (&k);
    s_close (&e);
}
