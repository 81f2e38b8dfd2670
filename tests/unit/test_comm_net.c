/* tests/unit/test_comm_net.c -- the network comm plugins, loaded with dlopen
 * from the build tree's plugin folder with a minimal host table:
 *   comm-zmq: 2-3 forked ranks over tcp://127.0.0.1 and ipc, every
 *     collective and dtype against a reference each rank computes from the
 *     same seeded data (the reference arithmetic is the test's own), bitwise
 *     equal results on every rank, start/wait, and the failures (bad
 *     arguments, ranks that disagree, a killed rank).
 *   comm-nccl (only when built): the descriptor, and create() on a machine
 *     without a GPU failing with RX_EDEVICE (never a crash or a hang). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/plugin.h>

#include "../testutil.h"

/* ---- plugin + host table --------------------------------------------------- */

static void h_log (const struct rx_host *h, int level, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    vfprintf (stderr, fmt, ap);
    va_end (ap);
    fputc ('\n', stderr);
}
static void *h_alloc (const struct rx_host *h, size_t size, size_t align) { return malloc (size ? size : 1); }
static void h_free (const struct rx_host *h, void *p) { free (p); }

static const struct rx_host s_host = {
    .struct_size = sizeof (struct rx_host), .abi_major = RX_ABI_MAJOR, .abi_minor = RX_ABI_MINOR,
    .log = h_log, .alloc = h_alloc, .free_ = h_free,
};

static char *s_so_path (const char *name)
{
    char f[64];
    snprintf (f, sizeof f, "comm-%s.so", name);
    return tu_path (tu_env ("RX_PLUGIN_BUILD_DIR"), f);
}

/* dlopen comm-<name>.so and return its descriptor (handle left open). */
static const struct rx_plugin_desc *s_load (const char *name)
{
    char *p = s_so_path (name);
    void *h = dlopen (p, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null (h, "dlopen %s: %s", p, dlerror ());
    free (p);
    rx_plugin_entry_fn fn = (rx_plugin_entry_fn) dlsym (h, RX_PLUGIN_ENTRY);
    cr_assert_not_null (fn, "%s", dlerror ());
    const struct rx_plugin_desc *d = fn ();
    cr_assert_eq (d->magic, RX_PLUGIN_MAGIC);
    cr_assert_eq (d->abi_major, RX_ABI_MAJOR);
    cr_assert_eq (d->kind, RX_KIND_COMM);
    cr_assert_str_eq (d->name, name);
    const struct rx_comm_ops *ops = d->ops;
    cr_assert_geq (ops->struct_size, RX_COMM_OPS_SIZE_1_0);
    cr_assert (ops->create && ops->destroy && ops->all_reduce && ops->all_gather && ops->reduce_scatter
               && ops->all_to_all_v && ops->broadcast && ops->barrier && ops->start && ops->wait && ops->check);
    return d;
}

static const struct rx_comm_ops *Z;   /* comm-zmq's ops (loaded before forking) */

/* ---- ranks as processes ------------------------------------------------------ */

struct shared {
    int code[8];
    char msg[8][RX_ERR_MSG_MAX];
    double secs[8];
    uint64_t hash[8];        /* a hash of every all_reduce result, per rank */
};
static struct shared *S;

static void s_shared_init (void)
{
    S = mmap (NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq (S, MAP_FAILED);
    memset (S, 0, sizeof *S);
}

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int rank_ = -1;

#define CK(cond, ...)                                                          \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf (stderr, "rank %d: %s:%d: check failed: %s: ", rank_,      \
                     __FILE__, __LINE__, #cond);                               \
            fprintf (stderr, __VA_ARGS__);                                     \
            fputc ('\n', stderr);                                              \
            _exit (1);                                                         \
        }                                                                      \
    } while (0)

typedef int (*rank_fn) (void *comm, int rank, int n, void *arg);

struct job {
    const char *ep;
    double timeout_s;
    rank_fn fn;
    void *arg;
};

static int s_child (int rank, int n, struct job *j)
{
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = rank, .n_rank = n, .group = "tp0",
                                .bootstrap = j->ep, .timeout_s = j->timeout_s };
    struct rx_err err = { 0 };
    void *comm = NULL;
    CK (Z->create (&s_host, &p, &comm, &err) == RX_OK && comm, "create: %s", err.msg);
    int rc = j->fn (comm, rank, n, j->arg);
    Z->destroy (comm);
    return rc;
}

static void s_run (int n, struct job *j, int *st)
{
    pid_t pid[8];
    for (int i = 0; i < n; i++) {
        pid[i] = fork ();
        cr_assert_geq (pid[i], 0);
        if (pid[i] == 0) {
            rank_ = i;
            alarm (60);
            _exit (s_child (i, n, j));
        }
    }
    for (int i = 0; i < n; i++) {
        int s;
        while (waitpid (pid[i], &s, 0) < 0 && errno == EINTR) {}
        st[i] = WIFEXITED (s) ? WEXITSTATUS (s) : 128 + WTERMSIG (s);
    }
    /* a rank 0 that failed a check (_exit) left its ipc file behind */
    if (!strncmp (j->ep, "ipc://", 6)) unlink (j->ep + 6);
}

static void s_run_ok (int n, struct job *j)
{
    int st[8];
    s_run (n, j, st);
    for (int i = 0; i < n; i++) cr_expect_eq (st[i], 0, "%s: rank %d of %d exited with %d", j->ep, i, n, st[i]);
}

static char s_ep[256];

static const char *s_ipc (void)
{
    static int k;
    snprintf (s_ep, sizeof s_ep, "ipc:///tmp/rx-commnet-test-%d-%d", (int) getpid (), k++);
    return s_ep;
}

static const char *s_tcp (void)
{
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
    cr_assert_eq (bind (fd, (struct sockaddr *) &a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname (fd, (struct sockaddr *) &a, &l);
    close (fd);
    snprintf (s_ep, sizeof s_ep, "tcp://127.0.0.1:%d", ntohs (a.sin_port));
    return s_ep;
}

/* ---- data and reference -------------------------------------------------------- */

static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The i-th value rank r contributes to test `t`, as a double.  f16/bf16 get
 * small integers (-64..64), exact in both and in every partial sum of <= 3
 * ranks, so the reference needs no rounding model; f32 gets arbitrary
 * floats (summed in rank order in float below); integers span their range. */
static double s_val (int dtype, int t, int r, size_t i)
{
    uint64_t k = s_mix (((uint64_t) t << 40) ^ ((uint64_t) r << 32) ^ i);
    switch (dtype) {
    case RX_F16: case RX_BF16: return (double) ((int) (k % 129) - 64);
    case RX_F32: return (double) (float) (((double) (k >> 11) / 9007199254740992.0 - 0.5) * 200.0);
    default: return 0;
    }
}

static int64_t s_ival (int dtype, int t, int r, size_t i)
{
    uint64_t k = s_mix (((uint64_t) t << 40) ^ ((uint64_t) r << 32) ^ i ^ 0xabcdull);
    return dtype == RX_I32 ? (int64_t) (int32_t) (uint32_t) k : (int64_t) k;
}

/* IEEE half / bfloat16 of small integers: exact encodings written by hand. */
static uint16_t s_to_f16 (double v)
{
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    double a = fabs (v);
    int e = 0;
    while (a >= 2) { a /= 2; e++; }
    /* a in [1,2): mantissa 10 bits */
    uint16_t m = (uint16_t) llround ((a - 1) * 1024);
    return (uint16_t) (sign | (uint16_t) ((e + 15) << 10) | m);
}

static uint16_t s_to_bf16 (double v)
{
    float f = (float) v;
    uint32_t u;
    memcpy (&u, &f, 4);
    return (uint16_t) (u >> 16);   /* exact for small integers */
}

static size_t s_elt (int dtype) { return rx_comm_dtype_size (dtype); }

/* Store value v (double or integer) as element i of dtype in buf. */
static void s_put (void *buf, int dtype, size_t i, double v, int64_t iv)
{
    unsigned char *b = buf;
    switch (dtype) {
    case RX_F32: { float f = (float) v; memcpy (b + 4 * i, &f, 4); break; }
    case RX_F16: { uint16_t h = s_to_f16 (v); memcpy (b + 2 * i, &h, 2); break; }
    case RX_BF16: { uint16_t h = s_to_bf16 (v); memcpy (b + 2 * i, &h, 2); break; }
    case RX_I32: { int32_t x = (int32_t) iv; memcpy (b + 4 * i, &x, 4); break; }
    default: memcpy (b + 8 * i, &iv, 8); break;
    }
}

/* Fill rank r's contribution to test t: cnt elements. */
static void s_fill (void *buf, int dtype, int t, int r, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) s_put (buf, dtype, i, s_val (dtype, t, r, i), s_ival (dtype, t, r, i));
}

/* Reference reduction of element i over ranks 0..n-1 in order, stored. */
static void s_ref (void *buf, int dtype, int red, int t, int n, size_t i, size_t src_i)
{
    if (dtype == RX_F32) {
        float acc = (float) s_val (dtype, t, 0, src_i);
        for (int r = 1; r < n; r++) {
            float v = (float) s_val (dtype, t, r, src_i);
            acc = red == RX_COMM_SUM ? acc + v : red == RX_COMM_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
        s_put (buf, dtype, i, acc, 0);
    } else if (dtype == RX_F16 || dtype == RX_BF16) {
        double acc = s_val (dtype, t, 0, src_i);
        for (int r = 1; r < n; r++) {
            double v = s_val (dtype, t, r, src_i);
            acc = red == RX_COMM_SUM ? acc + v : red == RX_COMM_MAX ? fmax (acc, v) : fmin (acc, v);
        }
        s_put (buf, dtype, i, acc, 0);
    } else {
        int64_t acc = s_ival (dtype, t, 0, src_i);
        for (int r = 1; r < n; r++) {
            int64_t v = s_ival (dtype, t, r, src_i);
            if (red == RX_COMM_SUM) acc = dtype == RX_I32 ? (int64_t) (int32_t) ((uint32_t) acc + (uint32_t) v)
                                                          : (int64_t) ((uint64_t) acc + (uint64_t) v);
            else if (red == RX_COMM_MAX) acc = v > acc ? v : acc;
            else acc = v < acc ? v : acc;
        }
        s_put (buf, dtype, i, 0, acc);
    }
}

static uint64_t s_hash (uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static const int DT[5] = { RX_F32, RX_F16, RX_BF16, RX_I32, RX_I64 };

/* ---- every collective ------------------------------------------------------------ */

static int s_everything (void *comm, int rank, int n, void *arg)
{
    struct rx_err err = { 0 };
    const size_t MAXC = 700;
    unsigned char *a = malloc (MAXC * 8 * 8), *b = malloc (MAXC * 8 * 8), *w = malloc (MAXC * 8 * 8);
    uint64_t h = 1469598103934665603ull;
    int t = 0;
    for (int di = 0; di < 5; di++) {
        int dt = DT[di];
        size_t e = s_elt (dt);
        for (int red = 0; red < 3; red++) {
            /* all_reduce, out of place then in place */
            size_t cnt = (size_t) (s_mix ((uint64_t) ++t) % MAXC);
            s_fill (a, dt, t, rank, cnt);
            CK (Z->all_reduce (comm, NULL, a, b, cnt, dt, red, &err) == RX_OK, "all_reduce: %s", err.msg);
            for (size_t i = 0; i < cnt; i++) s_ref (w, dt, red, t, n, i, i);
            CK (!memcmp (b, w, cnt * e), "all_reduce dtype %d red %d cnt %zu differs", dt, red, cnt);
            h = s_hash (h, b, cnt * e);
            CK (Z->all_reduce (comm, NULL, a, a, cnt, dt, red, &err) == RX_OK, "all_reduce in place: %s", err.msg);
            CK (!memcmp (a, w, cnt * e), "all_reduce in place differs");
            /* reduce_scatter: rank r reduces block r of n*cnt */
            cnt = (size_t) (s_mix ((uint64_t) ++t) % (MAXC / 3));
            s_fill (a, dt, t, rank, cnt * (size_t) n);
            CK (Z->reduce_scatter (comm, NULL, a, b, cnt, dt, red, &err) == RX_OK, "reduce_scatter: %s", err.msg);
            for (size_t i = 0; i < cnt; i++) s_ref (w, dt, red, t, n, i, (size_t) rank * cnt + i);
            CK (!memcmp (b, w, cnt * e), "reduce_scatter dtype %d red %d differs", dt, red);
        }
        /* all_gather, out of place and in place */
        size_t cnt = (size_t) (s_mix ((uint64_t) ++t) % MAXC);
        s_fill (a, dt, t, rank, cnt);
        CK (Z->all_gather (comm, NULL, a, b, cnt, dt, &err) == RX_OK, "all_gather: %s", err.msg);
        for (int r = 0; r < n; r++) s_fill (w + (size_t) r * cnt * e, dt, t, r, cnt);
        CK (!memcmp (b, w, (size_t) n * cnt * e), "all_gather dtype %d differs", dt);
        memset (b, 0x5a, (size_t) n * cnt * e);
        s_fill (b + (size_t) rank * cnt * e, dt, t, rank, cnt);
        CK (Z->all_gather (comm, NULL, b + (size_t) rank * cnt * e, b, cnt, dt, &err) == RX_OK, "%s", err.msg);
        CK (!memcmp (b, w, (size_t) n * cnt * e), "all_gather in place dtype %d differs", dt);
        /* broadcast from every root */
        for (int root = 0; root < n; root++) {
            cnt = (size_t) (s_mix ((uint64_t) ++t) % MAXC);
            if (rank == root) s_fill (a, dt, t, root, cnt);
            else memset (a, 0, cnt * e);
            CK (Z->broadcast (comm, NULL, a, cnt, dt, root, &err) == RX_OK, "broadcast: %s", err.msg);
            s_fill (w, dt, t, root, cnt);
            CK (!memcmp (a, w, cnt * e), "broadcast root %d differs", root);
        }
        /* all_to_all_v: C[s][d] elements from s to d (zeros included),
         * packed with a gap of one element between pieces */
        ++t;
        size_t C[8][8];
        for (int s = 0; s < n; s++)
            for (int d = 0; d < n; d++) {
                uint64_t k = s_mix (((uint64_t) t << 8) | (uint64_t) (s * 8 + d));
                C[s][d] = k % 4 == 0 ? 0 : (size_t) (k % 50);
            }
        size_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
        for (int p = 0; p < n; p++) {
            sc[p] = C[rank][p]; sd[p] = so; so += sc[p] + 1;
            rc[p] = C[p][rank]; rd[p] = ro; ro += rc[p] + 1;
        }
        /* piece for p: values of test (t, rank*8+p) */
        for (int p = 0; p < n; p++) s_fill (a + sd[p] * e, dt, t * 64 + rank * 8 + p, rank, sc[p]);
        memset (b, 0x77, ro * e);
        memset (w, 0x77, ro * e);
        for (int p = 0; p < n; p++) s_fill (w + rd[p] * e, dt, t * 64 + p * 8 + rank, p, rc[p]);
        CK (Z->all_to_all_v (comm, NULL, a, sc, sd, b, rc, rd, dt, &err) == RX_OK, "all_to_all_v: %s", err.msg);
        CK (!memcmp (b, w, ro * e), "all_to_all_v dtype %d differs", dt);
    }
    CK (Z->barrier (comm, NULL, &err) == RX_OK, "barrier: %s", err.msg);

    /* start / wait: two in flight, completed in start order */
    size_t cnt = 333;
    s_fill (a, RX_F32, 999, rank, cnt);
    struct rx_comm_op o1 = { .struct_size = sizeof o1, .kind = RX_COMM_ALL_REDUCE, .dtype = RX_F32,
                             .red = RX_COMM_SUM, .send = a, .recv = b, .count = cnt };
    struct rx_comm_op o2 = { .struct_size = sizeof o2, .kind = RX_COMM_BARRIER };
    rx_comm_req_t *q1 = NULL, *q2 = NULL;
    CK (Z->start (comm, &o1, &q1, &err) == RX_OK && q1, "start: %s", err.msg);
    CK (Z->start (comm, &o2, &q2, &err) == RX_OK && q2, "start: %s", err.msg);
    CK (Z->wait (comm, q1, &err) == RX_OK, "wait: %s", err.msg);
    CK (Z->wait (comm, q2, &err) == RX_OK, "wait: %s", err.msg);
    for (size_t i = 0; i < cnt; i++) s_ref (w, RX_F32, RX_COMM_SUM, 999, n, i, i);
    CK (!memcmp (b, w, cnt * 4), "start/wait all_reduce differs");
    h = s_hash (h, b, cnt * 4);
    CK (Z->check (comm, &err) == RX_OK, "check: %s", err.msg);
    S->hash[rank] = h;
    free (a);
    free (b);
    free (w);
    return 0;
}

static void s_everything_on (int n, const char *ep)
{
    s_shared_init ();
    struct job j = { ep, 20, s_everything, NULL };
    s_run_ok (n, &j);
    for (int r = 1; r < n; r++)
        cr_expect_eq (S->hash[r], S->hash[0], "rank %d's all_reduce results differ from rank 0's", r);
    cr_expect_neq (S->hash[0], 0);
}

Test (comm_zmq, descriptor)
{
    const struct rx_plugin_desc *d = s_load ("zmq");
    cr_expect_str_eq (d->name, "zmq");
}

Test (comm_zmq, every_collective_2_ranks_tcp, .timeout = 120)
{
    Z = s_load ("zmq")->ops;
    s_everything_on (2, s_tcp ());
}

Test (comm_zmq, every_collective_3_ranks_tcp, .timeout = 120)
{
    Z = s_load ("zmq")->ops;
    s_everything_on (3, s_tcp ());
}

Test (comm_zmq, every_collective_3_ranks_ipc, .timeout = 120)
{
    Z = s_load ("zmq")->ops;
    s_everything_on (3, s_ipc ());
}

Test (comm_zmq, one_rank_is_a_copy)
{
    Z = s_load ("zmq")->ops;
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = 0, .n_rank = 1, .group = "solo",
                                .bootstrap = "ipc:///nonexistent/x", .timeout_s = 1 };
    struct rx_err err = { 0 };
    void *c = NULL;
    cr_assert_eq (Z->create (&s_host, &p, &c, &err), RX_OK, "%s", err.msg);
    float x[3] = { 1.5f, -2, 3 }, y[3] = { 0 };
    cr_assert_eq (Z->all_reduce (c, NULL, x, y, 3, RX_F32, RX_COMM_SUM, &err), RX_OK, "%s", err.msg);
    cr_assert_arr_eq (x, y, sizeof x);
    Z->destroy (c);
}

/* ---- errors ---------------------------------------------------------------------- */

Test (comm_zmq, bad_create_arguments)
{
    Z = s_load ("zmq")->ops;
    struct rx_err err = { 0 };
    void *c = (void *) 1;
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = 0, .n_rank = 2, .group = "g",
                                .bootstrap = NULL, .timeout_s = 1 };
    cr_assert_eq (Z->create (&s_host, &p, &c, &err), RX_EINVAL);
    cr_assert_null (c);
    cr_expect (strstr (err.msg, "no bootstrap endpoint"), "%s", err.msg);
    p.bootstrap = "ipc:///tmp/x";
    p.rank = 2;
    cr_assert_eq (Z->create (&s_host, &p, &c, &err), RX_EINVAL);
    cr_expect (strstr (err.msg, "rank 2 of 2"), "%s", err.msg);
    p.rank = 0;
    p.struct_size = 8;
    cr_assert_eq (Z->create (&s_host, &p, &c, &err), RX_EINVAL);
    p.struct_size = sizeof p;
    p.bootstrap = "bogus://x";
    cr_assert_eq (Z->create (&s_host, &p, &c, &err), RX_EIO);
    cr_expect (strstr (err.msg, "comm-zmq g rank 0") && strstr (err.msg, "cannot bind"), "%s", err.msg);
    /* a rank that never comes: named */
    p.bootstrap = s_ipc ();
    p.timeout_s = 0.3;
    cr_assert_eq (Z->create (&s_host, &p, &c, &err), RX_ETIMEDOUT);
    cr_expect (strstr (err.msg, "rank 1 never joined"), "%s", err.msg);
}

/* One rank passes a dtype the plugin refuses: it fails EINVAL and the
 * others hear of it (no timeout); every later call fails at once. */
static int s_bad_dtype (void *comm, int rank, int n, void *arg)
{
    struct rx_err err = { 0 };
    float x[4] = { 0 };
    double t0 = s_now ();
    int rc = Z->all_reduce (comm, NULL, x, x, 4, rank == 1 ? RX_Q4_0 : RX_F32, RX_COMM_SUM, &err);
    S->code[rank] = rc;
    S->secs[rank] = s_now () - t0;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    CK (rc != RX_OK, "must fail");
    CK (Z->check (comm, &err) != RX_OK, "check after failure must fail");
    t0 = s_now ();
    CK (Z->barrier (comm, NULL, &err) != RX_OK, "barrier after failure must fail");
    CK (s_now () - t0 < 0.5, "and at once");
    return 0;
}

Test (comm_zmq, a_bad_dtype_breaks_the_group_everywhere, .timeout = 30)
{
    Z = s_load ("zmq")->ops;
    s_shared_init ();
    struct job j = { s_tcp (), 5, s_bad_dtype, NULL };
    s_run_ok (2, &j);
    cr_expect_eq (S->code[1], RX_EINVAL, "%s", S->msg[1]);
    cr_expect (strstr (S->msg[1], "is not supported"), "%s", S->msg[1]);
    cr_expect_eq (S->code[0], RX_EINVAL, "rank 0 hears rank 1's error: %s", S->msg[0]);
    cr_expect (strstr (S->msg[0], "is not supported"), "%s", S->msg[0]);
    cr_expect_lt (S->secs[0], 3.0, "not by timeout");
}

/* Ranks call all_reduce with different counts / reductions: RX_EIO on all. */
static int s_disagree (void *comm, int rank, int n, void *arg)
{
    int which = *(int *) arg;
    struct rx_err err = { 0 };
    float x[8] = { 0 }, y[8] = { 0 };
    int rc;
    if (which == 0) rc = Z->all_reduce (comm, NULL, x, x, rank == 2 ? 8 : 4, RX_F32, RX_COMM_SUM, &err);
    else if (which == 1) rc = Z->all_reduce (comm, NULL, x, x, 4, RX_F32, rank == 1 ? RX_COMM_MAX : RX_COMM_SUM, &err);
    else {
        /* all_to_all_v: rank 0 sends 2 to rank 1, rank 1 expects 3 */
        size_t sc[3] = { 1, 1, 1 }, sd[3] = { 0, 2, 4 }, rcn[3] = { 1, 1, 1 }, rd[3] = { 0, 2, 4 };
        if (rank == 0) sc[1] = 2;
        if (rank == 1) rcn[0] = 3;
        rc = Z->all_to_all_v (comm, NULL, x, sc, sd, y, rcn, rd, RX_F32, &err);
    }
    S->code[rank] = rc;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    return 0;
}

static void s_disagree_case (int which, int want, const char *text)
{
    Z = s_load ("zmq")->ops;
    s_shared_init ();
    struct job j = { s_ipc (), 5, s_disagree, &which };
    double t0 = s_now ();
    s_run_ok (3, &j);
    cr_expect_lt (s_now () - t0, 4.0);
    for (int r = 0; r < 3; r++) {
        cr_expect_eq (S->code[r], want, "rank %d: %d %s", r, S->code[r], S->msg[r]);
        cr_expect (strstr (S->msg[r], text), "rank %d: \"%s\" lacks \"%s\"", r, S->msg[r], text);
    }
}

Test (comm_zmq, different_counts_are_eio_on_all_ranks, .timeout = 30)
{
    s_disagree_case (0, RX_EIO, "ranks diverged");
}

Test (comm_zmq, different_reductions_are_eio_on_all_ranks, .timeout = 30)
{
    s_disagree_case (1, RX_EIO, "ranks diverged");
}

Test (comm_zmq, all_to_all_count_mismatch_fails_on_all_ranks, .timeout = 30)
{
    s_disagree_case (2, RX_EINVAL, "rank 0 sends 2 elements to rank 1, which expects 3");
}

/* A rank killed between collectives: the others time out within timeout_s. */
static int s_killed (void *comm, int rank, int n, void *arg)
{
    struct rx_err err = { 0 };
    int64_t v[2] = { rank, 1 };
    CK (Z->all_reduce (comm, NULL, v, v, 2, RX_I64, RX_COMM_SUM, &err) == RX_OK, "%s", err.msg);
    CK (v[1] == n, "sum");
    if (rank == 2) raise (SIGKILL);
    double t0 = s_now ();
    S->code[rank] = Z->all_reduce (comm, NULL, v, v, 2, RX_I64, RX_COMM_SUM, &err);
    S->secs[rank] = s_now () - t0;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    return 0;
}

Test (comm_zmq, a_killed_rank_times_out_the_others, .timeout = 30)
{
    Z = s_load ("zmq")->ops;
    s_shared_init ();
    struct job j = { s_tcp (), 1.0, s_killed, NULL };
    int st[3];
    s_run (3, &j, st);
    cr_expect_eq (st[2], 128 + SIGKILL);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq (st[r], 0);
        cr_expect_eq (S->code[r], RX_ETIMEDOUT, "rank %d: %s", r, S->msg[r]);
        cr_expect_lt (S->secs[r], 2.0, "rank %d: %.2f s", r, S->secs[r]);
        cr_expect (strstr (S->msg[r], "rank 2"), "rank %d names rank 2: %s", r, S->msg[r]);
    }
}

/* ---- comm-nccl ---------------------------------------------------------------------- */

Test (comm_nccl, loads_and_fails_cleanly_without_a_gpu, .timeout = 60)
{
    char *p = s_so_path ("nccl");
    int built = access (p, F_OK) == 0;
    free (p);
    if (!built) cr_skip_test ("comm-nccl was not built (configure found no NCCL)");
    const struct rx_plugin_desc *d = s_load ("nccl");
    const struct rx_comm_ops *ops = d->ops;
    struct rx_comm_params prm = { .struct_size = sizeof prm, .rank = 0, .n_rank = 1, .group = "tp0",
                                  .bootstrap = "ipc:///tmp/unused", .timeout_s = 20 };
    struct rx_err err = { 0 };
    void *c = (void *) 1;
    int gpu = access ("/dev/nvidiactl", F_OK) == 0;
    int rc = ops->create (&s_host, &prm, &c, &err);
    if (!gpu) {
        cr_assert_eq (rc, RX_EDEVICE, "%d %s", rc, err.msg);
        cr_assert_null (c);
        cr_expect (strstr (err.msg, "comm nccl tp0 rank 0: no CUDA device (cudaGetDeviceCount: "), "%s", err.msg);
    } else {
        /* A GPU machine: a group of one forms, and a barrier (the plugin's
         * own device scratch) completes. */
        cr_assert_eq (rc, RX_OK, "%s", err.msg);
        cr_assert_eq (ops->barrier (c, NULL, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (ops->check (c, &err), RX_OK, "%s", err.msg);
        ops->destroy (c);
    }
    /* argument errors come before any CUDA call */
    prm.n_rank = 2;
    prm.bootstrap = NULL;
    cr_assert_eq (ops->create (&s_host, &prm, &c, &err), RX_EINVAL);
    cr_expect (strstr (err.msg, "no bootstrap endpoint"), "%s", err.msg);
    ops->destroy (NULL);
}
