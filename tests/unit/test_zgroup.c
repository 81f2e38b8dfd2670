/* tests/unit/test_zgroup.c -- the ZMQ control group (core/zgroup.c): real
 * processes (one fork per rank) over ipc:// and tcp://127.0.0.1, every
 * collective against a reference each rank computes itself from the same
 * seeded generator, the join errors (a rank that never comes, a wrong group
 * size, a rank given twice), a rank killed mid-run, diverged ranks, and the
 * bcast latency (printed, not asserted). */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <radix/err.h>

#include "zgroup.h"

/* The reductions of radix/comm.h (zgroup takes them as int). */
enum { RED_SUM = 0, RED_MAX = 1, RED_MIN = 2 };

/* ---- harness ---------------------------------------------------------- */

/* Shared with the children (MAP_SHARED): what each rank saw. */
struct shared {
    int code[8];              /* a status a rank reports */
    char msg[8][RX_ERR_MSG_MAX];
    double secs[8];           /* an elapsed time a rank reports */
    double median_us;
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

/* A check inside a child: print why and exit non-zero (Criterion's asserts
 * belong to the parent). */
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

static int rank_ = -1;

typedef int (*rank_fn) (int rank, int n, const char *ep, void *arg);

/* Fork one process per entry of ranks[0..np) (the rank each process is
 * given: tests may give a rank twice or leave one out), each running fn with
 * group size n; wait for all (killing them after 60 s) and return their exit
 * statuses in st[]. */
static void s_run_ranks (const int *ranks, int np, int n, const char *ep, rank_fn fn, void *arg,
                         int *st)
{
    pid_t pid[8];
    for (int i = 0; i < np; i++) {
        pid[i] = fork ();
        cr_assert_geq (pid[i], 0);
        if (pid[i] == 0) {
            rank_ = ranks[i];
            alarm (60);
            _exit (fn (ranks[i], n, ep, arg));
        }
    }
    for (int i = 0; i < np; i++) {
        int s;
        while (waitpid (pid[i], &s, 0) < 0 && errno == EINTR) {}
        st[i] = WIFEXITED (s) ? WEXITSTATUS (s) : 128 + WTERMSIG (s);
    }
    /* zgroup removes its ipc file at destroy; a rank 0 that failed a check
     * (_exit) did not get there */
    if (!strncmp (ep, "ipc://", 6)) unlink (ep + 6);
}

/* n ranks 0..n-1; every one must exit 0. */
static void s_run (int n, const char *ep, rank_fn fn, void *arg)
{
    int ranks[8], st[8];
    for (int i = 0; i < n; i++) ranks[i] = i;
    s_run_ranks (ranks, n, n, ep, fn, arg, st);
    for (int i = 0; i < n; i++)
        cr_expect_eq (st[i], 0, "%s: rank %d of %d exited with %d", ep, i, n, st[i]);
}

static char s_ep[256];

static const char *s_ipc (void)
{
    static int k;
    snprintf (s_ep, sizeof s_ep, "ipc:///tmp/rx-zgroup-test-%d-%d", (int) getpid (), k++);
    return s_ep;
}

/* A free TCP port on 127.0.0.1 (bound to port 0, read back, released). */
static const char *s_tcp (void)
{
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    cr_assert_geq (fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
    cr_assert_eq (bind (fd, (struct sockaddr *) &a, sizeof a), 0);
    socklen_t l = sizeof a;
    cr_assert_eq (getsockname (fd, (struct sockaddr *) &a, &l), 0);
    close (fd);
    snprintf (s_ep, sizeof s_ep, "tcp://127.0.0.1:%d", ntohs (a.sin_port));
    return s_ep;
}

/* splitmix64: every rank derives every rank's data from (seed, rank, step). */
static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t s_key (int rank, int step, int what) { return s_mix (((uint64_t) step << 24) ^ ((uint64_t) what << 8) ^ (uint64_t) rank ^ 0x5eed); }

/* Rank r's blob at a step: length in 0..max (0 one time in 5), bytes from the key. */
static size_t s_blob (int r, int step, int what, size_t max, unsigned char *buf)
{
    uint64_t k = s_key (r, step, what);
    size_t len = k % 5 == 0 ? 0 : (size_t) (s_mix (k) % (max + 1));
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char) s_mix (k + i);
    return len;
}

/* ---- collectives vs reference ------------------------------------------ */

#define STEPS 12
#define MAXB  3000

static int s_collectives (int rank, int n, const char *ep, void *arg)
{
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, 10, &err);
    CK (g, "%s", err.msg);
    CK (rx_zgroup_rank (g) == rank && rx_zgroup_size (g) == n, "rank/size");
    unsigned char *mine = malloc (MAXB), *ref = malloc (MAXB * 8);
    for (int step = 0; step < STEPS; step++) {
        /* bcast from every root */
        for (int root = 0; root < n; root++) {
            size_t len = s_blob (root, step, root + 1, MAXB, ref);
            if (rank == root) memcpy (mine, ref, len);
            void *out = (void *) 1;
            size_t out_len = 12345;
            CK (rx_zgroup_bcast (g, root, rank == root ? mine : NULL, rank == root ? len : 0, &out,
                                 &out_len, -1, &err) == RX_OK, "bcast: %s", err.msg);
            CK (out && out_len == len, "bcast root %d: %zu bytes, want %zu", root, out_len, len);
            CK (len == 0 || !memcmp (out, ref, len), "bcast root %d: bytes differ", root);
            free (out);
        }
        /* allgather of variable lengths */
        size_t mylen = s_blob (rank, step, 100, MAXB, mine), tot = 0, lens[8], want[8];
        for (int r = 0; r < n; r++) {
            want[r] = s_blob (r, step, 100, MAXB, ref + tot);
            tot += want[r];
        }
        void *all = NULL;
        CK (rx_zgroup_allgather (g, mine, mylen, &all, lens, -1, &err) == RX_OK, "allgather: %s", err.msg);
        for (int r = 0; r < n; r++) CK (lens[r] == want[r], "allgather lens[%d] %zu want %zu", r, lens[r], want[r]);
        CK (tot == 0 || !memcmp (all, ref, tot), "allgather bytes differ");
        free (all);
        /* allreduce SUM / MAX / MIN */
        for (int red = 0; red < 3; red++) {
            size_t cnt = (size_t) (s_key (0, step, 200 + red) % 40);   /* 0..39 */
            int64_t v[40], w[40];
            for (size_t i = 0; i < cnt; i++) {
                for (int r = 0; r < n; r++) {
                    int64_t x = (int64_t) s_mix (s_key (r, step, 300 + red) + i) >> (i % 3 ? 20 : 0);
                    if (r == rank) v[i] = x;
                    if (r == 0) w[i] = x;
                    else if (red == RED_SUM) w[i] = (int64_t) ((uint64_t) w[i] + (uint64_t) x);
                    else if (red == RED_MAX) w[i] = x > w[i] ? x : w[i];
                    else w[i] = x < w[i] ? x : w[i];
                }
            }
            CK (rx_zgroup_allreduce_i64 (g, v, cnt, red, -1, &err) == RX_OK, "allreduce: %s", err.msg);
            for (size_t i = 0; i < cnt; i++)
                CK (v[i] == w[i], "allreduce red %d [%zu]: %lld want %lld", red, i, (long long) v[i],
                    (long long) w[i]);
        }
        CK (rx_zgroup_barrier (g, -1, &err) == RX_OK, "barrier: %s", err.msg);
    }
    free (mine);
    free (ref);
    rx_zgroup_destroy (&g);
    CK (g == NULL, "destroy NULLs");
    return 0;
}

Test (zgroup, collectives_ipc_1_to_4_ranks, .timeout = 120)
{
    for (int n = 1; n <= 4; n++) s_run (n, s_ipc (), s_collectives, NULL);
}

Test (zgroup, collectives_tcp_1_to_4_ranks, .timeout = 120)
{
    for (int n = 1; n <= 4; n++) s_run (n, s_tcp (), s_collectives, NULL);
}

/* A group of one needs no peers and no endpoint that exists. */
Test (zgroup, group_of_one_copies)
{
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new ("tcp://192.0.2.1:1", 0, 1, 1, &err);
    cr_assert_not_null (g, "%s", err.msg);
    void *out = NULL;
    size_t len = 0, lens[1];
    cr_assert_eq (rx_zgroup_bcast (g, 0, "abc", 3, &out, &len, -1, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (len, 3);
    cr_assert_arr_eq (out, "abc", 3);
    free (out);
    cr_assert_eq (rx_zgroup_allgather (g, "xy", 2, &out, lens, -1, &err), RX_OK);
    cr_assert_eq (lens[0], 2);
    cr_assert_arr_eq (out, "xy", 2);
    free (out);
    int64_t v[2] = { -5, 7 };
    cr_assert_eq (rx_zgroup_allreduce_i64 (g, v, 2, RED_MAX, -1, &err), RX_OK);
    cr_assert (v[0] == -5 && v[1] == 7);
    cr_assert_eq (rx_zgroup_barrier (g, -1, &err), RX_OK);
    rx_zgroup_destroy (&g);
    cr_assert_null (g);
    rx_zgroup_destroy (&g);   /* NULL: no-op */
}

/* ---- latency ------------------------------------------------------------ */

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

#define NLAT 1000

static int s_latency (int rank, int n, const char *ep, void *arg)
{
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, 10, &err);
    CK (g, "%s", err.msg);
    static double t[NLAT];
    uint64_t x = 0;
    for (int i = 0; i < NLAT; i++) {
        uint64_t v = s_mix ((uint64_t) i);
        void *out = NULL;
        size_t len = 0;
        double t0 = s_now ();
        CK (rx_zgroup_bcast (g, 0, &v, sizeof v, &out, &len, -1, &err) == RX_OK, "bcast %d: %s", i, err.msg);
        t[i] = s_now () - t0;
        CK (len == sizeof v && !memcmp (out, &v, sizeof v), "bcast %d: wrong bytes", i);
        x ^= v;
        free (out);
    }
    if (rank == 0) {
        qsort (t, NLAT, sizeof *t, s_cmp);
        S->median_us = t[NLAT / 2] * 1e6;
    }
    rx_zgroup_destroy (&g);
    return 0;
}

Test (zgroup, bcast_1000_latency, .timeout = 120)
{
    s_shared_init ();
    const char *name[2] = { "ipc", "tcp" };
    for (int k = 0; k < 2; k++) {
        S->median_us = -1;
        s_run (2, k ? s_tcp () : s_ipc (), s_latency, NULL);
        cr_expect_gt (S->median_us, 0);
        fprintf (stderr, "zgroup: %s, 2 ranks: median bcast round trip %.1f us over %d bcasts\n",
                 name[k], S->median_us, NLAT);
        cr_log_info ("zgroup: %s, 2 ranks: median bcast round trip %.1f us over %d bcasts", name[k],
                     S->median_us, NLAT);
    }
}

/* ---- join errors -------------------------------------------------------- */

/* Create only, report status + message + elapsed time. */
static int s_create_only (int rank, int n, const char *ep, void *arg)
{
    double tmo = arg ? *(double *) arg : 1.0;
    struct rx_err err = { 0 };
    double t0 = s_now ();
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, tmo, &err);
    S->secs[rank] = s_now () - t0;
    S->code[rank] = g ? RX_OK : err.code;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", g ? "" : err.msg);
    rx_zgroup_destroy (&g);
    return 0;
}

Test (zgroup, a_rank_that_never_joins_is_named, .timeout = 30)
{
    s_shared_init ();
    int ranks[2] = { 0, 1 }, st[2];
    double tmo = 0.6;
    s_run_ranks (ranks, 2, 4, s_ipc (), s_create_only, &tmo, st);   /* ranks 2, 3 never start */
    cr_assert_eq (S->code[0], RX_ETIMEDOUT, "%s", S->msg[0]);
    cr_expect (strstr (S->msg[0], "ranks 2, 3 never joined"), "%s", S->msg[0]);
    cr_expect_lt (S->secs[0], tmo + 1.0);
    /* rank 1 learns why from rank 0 instead of timing out on its own */
    cr_assert_eq (S->code[1], RX_ETIMEDOUT, "%s", S->msg[1]);
    cr_expect (strstr (S->msg[1], "ranks 2, 3 never joined"), "%s", S->msg[1]);

    /* and a lone non-zero rank: rank 0 never came */
    s_run_ranks (ranks + 1, 1, 2, s_tcp (), s_create_only, &tmo, st);
    cr_assert_eq (S->code[1], RX_ETIMEDOUT, "%s", S->msg[1]);
    cr_expect (strstr (S->msg[1], "rank 0 did not welcome"), "%s", S->msg[1]);
}

static int s_create_n (int rank, int n, const char *ep, void *arg)
{
    /* rank 1 believes in a group of n+1 */
    return s_create_only (rank, rank == 1 ? n + 1 : n, ep, arg);
}

Test (zgroup, group_size_mismatch_is_refused, .timeout = 30)
{
    s_shared_init ();
    int ranks[2] = { 0, 1 }, st[2];
    double tmo = 5;
    s_run_ranks (ranks, 2, 2, s_ipc (), s_create_n, &tmo, st);
    cr_assert_eq (S->code[0], RX_EINVAL, "%s", S->msg[0]);
    cr_expect (strstr (S->msg[0], "rank 1 says the group has 3 ranks, rank 0 says 2"), "%s", S->msg[0]);
    cr_assert_eq (S->code[1], RX_EINVAL, "%s", S->msg[1]);
    cr_expect (strstr (S->msg[1], "says the group has 3 ranks"), "%s", S->msg[1]);
    cr_expect_lt (S->secs[0], 4.0, "refused at once, not at the timeout");
}

/* Two processes given rank 1 (the second reports in slot 2). */
static int s_dup (int rank, int n, const char *ep, void *arg)
{
    struct rx_err err = { 0 };
    if (rank == 1 && arg) usleep (200000);   /* the second one comes later */
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, 3, &err);
    int slot = rank == 1 && arg ? 2 : rank;
    S->code[slot] = g ? RX_OK : err.code;
    snprintf (S->msg[slot], sizeof S->msg[slot], "%s", g ? "" : err.msg);
    rx_zgroup_destroy (&g);
    return 0;
}

static int s_dup_wrap (int rank, int n, const char *ep, void *arg)
{
    /* process index encoded by the rank list: 0, 1, and 1 again (=> 101) */
    return s_dup (rank % 100, n, ep, rank >= 100 ? (void *) 1 : NULL);
}

Test (zgroup, a_rank_given_twice_is_refused, .timeout = 30)
{
    s_shared_init ();
    int ranks[3] = { 0, 1, 101 }, st[3];
    s_run_ranks (ranks, 3, 3, s_ipc (), s_dup_wrap, NULL, st);
    cr_assert_eq (S->code[0], RX_EINVAL, "%s", S->msg[0]);
    cr_expect (strstr (S->msg[0], "rank 1 joined twice"), "%s", S->msg[0]);
    cr_assert_eq (S->code[1], RX_EINVAL, "%s", S->msg[1]);
    cr_assert_eq (S->code[2], RX_EINVAL, "%s", S->msg[2]);
    cr_expect (strstr (S->msg[2], "rank 1 joined twice"), "%s", S->msg[2]);
}

Test (zgroup, bad_arguments)
{
    struct rx_err err = { 0 };
    cr_assert_null (rx_zgroup_new (NULL, 0, 2, 1, &err));
    cr_assert_eq (err.code, RX_EINVAL);
    cr_assert_null (rx_zgroup_new ("ipc:///tmp/x", 2, 2, 1, &err));
    cr_assert_eq (err.code, RX_EINVAL);
    cr_expect (strstr (err.msg, "rank 2 of 2"), "%s", err.msg);
    cr_assert_null (rx_zgroup_new ("ipc:///tmp/x", 0, 0, 1, &err));
    cr_assert_eq (err.code, RX_EINVAL);
    cr_assert_null (rx_zgroup_new ("bogus://nowhere", 0, 2, 1, &err));
    cr_assert_eq (err.code, RX_EIO);
    cr_expect (strstr (err.msg, "cannot bind"), "%s", err.msg);
    cr_assert_null (rx_zgroup_new ("tcp://192.0.2.1:1", 0, 2, 1, &err));   /* not our address */
    cr_assert_eq (err.code, RX_EIO, "%s", err.msg);
    cr_assert_null (rx_zgroup_new ("bogus://nowhere", 1, 2, 1, &err));
    cr_assert_eq (err.code, RX_EIO);
    cr_expect (strstr (err.msg, "cannot connect"), "%s", err.msg);

    /* a bad argument to a collective breaks the group (the others would
     * be out of step), and later calls fail at once */
    rx_zgroup_t *g = rx_zgroup_new ("x", 0, 1, 1, &err);
    cr_assert_not_null (g);
    void *out;
    cr_assert_eq (rx_zgroup_bcast (g, 1, "a", 1, &out, NULL, -1, &err), RX_EINVAL);
    cr_expect (strstr (err.msg, "root 1 of 1"), "%s", err.msg);
    cr_assert_eq (rx_zgroup_barrier (g, -1, &err), RX_EINVAL);
    cr_expect (strstr (err.msg, "broken by an earlier error"), "%s", err.msg);
    rx_zgroup_destroy (&g);
    g = rx_zgroup_new ("x", 0, 1, 1, &err);
    int64_t v = 1;
    cr_assert_eq (rx_zgroup_allreduce_i64 (g, &v, 1, 7, -1, &err), RX_EINVAL);
    cr_expect (strstr (err.msg, "unknown reduction 7"), "%s", err.msg);
    rx_zgroup_destroy (&g);
}

/* ---- failures mid-run ---------------------------------------------------- */

#define KILL_TMO 1.0

/* 3 ranks, 5 barriers; rank 2 then dies (SIGKILL: no goodbye); ranks 0 and
 * 1 go on with a bcast and must fail within the timeout. */
static int s_killed (int rank, int n, const char *ep, void *arg)
{
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, KILL_TMO, &err);
    CK (g, "%s", err.msg);
    for (int i = 0; i < 5; i++) CK (rx_zgroup_barrier (g, -1, &err) == RX_OK, "%s", err.msg);
    if (rank == 2) raise (SIGKILL);
    double t0 = s_now ();
    void *out = NULL;
    int rc = rx_zgroup_bcast (g, 0, "hi", 2, &out, NULL, -1, &err);
    S->secs[rank] = s_now () - t0;
    S->code[rank] = rc;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    free (out);
    /* broken now: the next call fails at once */
    t0 = s_now ();
    CK (rx_zgroup_barrier (g, -1, &err) == rc, "after failure: %d %s", err.code, err.msg);
    CK (s_now () - t0 < 0.5, "a broken group must fail at once");
    CK (strstr (err.msg, "broken by an earlier error"), "%s", err.msg);
    rx_zgroup_destroy (&g);
    return 0;
}

static void s_killed_on (const char *ep)
{
    s_shared_init ();
    int ranks[3] = { 0, 1, 2 }, st[3];
    s_run_ranks (ranks, 3, 3, ep, s_killed, NULL, st);
    cr_expect_eq (st[0], 0);
    cr_expect_eq (st[1], 0);
    cr_expect_eq (st[2], 128 + SIGKILL);
    for (int r = 0; r < 2; r++) {
        cr_expect_eq (S->code[r], RX_ETIMEDOUT, "rank %d: %s", r, S->msg[r]);
        cr_expect_lt (S->secs[r], KILL_TMO + 0.5, "rank %d failed after %.2f s", r, S->secs[r]);
    }
    cr_expect (strstr (S->msg[0], "rank 2 did not reach bcast #6"), "%s", S->msg[0]);
    cr_expect (strstr (S->msg[1], "rank 2 did not reach bcast #6"), "rank 1 hears the cause: %s", S->msg[1]);
}

Test (zgroup, a_killed_rank_fails_the_others_ipc, .timeout = 30) { s_killed_on (s_ipc ()); }
Test (zgroup, a_killed_rank_fails_the_others_tcp, .timeout = 30) { s_killed_on (s_tcp ()); }

/* Rank 1 destroys its group early: rank 0 learns it left (RX_EIO) at once. */
static int s_leaves (int rank, int n, const char *ep, void *arg)
{
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, 5, &err);
    CK (g, "%s", err.msg);
    CK (rx_zgroup_barrier (g, -1, &err) == RX_OK, "%s", err.msg);
    if (rank == 1) {
        rx_zgroup_destroy (&g);
        return 0;
    }
    double t0 = s_now ();
    S->code[rank] = rx_zgroup_barrier (g, -1, &err);
    S->secs[rank] = s_now () - t0;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    rx_zgroup_destroy (&g);
    return 0;
}

Test (zgroup, a_rank_that_leaves_is_reported, .timeout = 30)
{
    s_shared_init ();
    s_run (2, s_tcp (), s_leaves, NULL);
    cr_assert_eq (S->code[0], RX_EIO, "%s", S->msg[0]);
    cr_expect (strstr (S->msg[0], "rank 1 left the group"), "%s", S->msg[0]);
    cr_expect_lt (S->secs[0], 2.0);
}

/* What each rank calls as collective #3 (after two barriers). */
enum { D_BCAST0, D_BCAST1, D_ALLGATHER, D_SUM, D_MAX, D_SUM4 };

static int s_diverge (int rank, int n, const char *ep, void *arg)
{
    const int *plan = arg;
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, 5, &err);
    CK (g, "%s", err.msg);
    CK (rx_zgroup_barrier (g, -1, &err) == RX_OK, "%s", err.msg);
    CK (rx_zgroup_barrier (g, -1, &err) == RX_OK, "%s", err.msg);
    void *out = NULL;
    int64_t v[4] = { 1, 2, 3, 4 };
    int rc;
    switch (plan[rank]) {
    case D_BCAST0: rc = rx_zgroup_bcast (g, 0, "x", 1, &out, NULL, -1, &err); break;
    case D_BCAST1: rc = rx_zgroup_bcast (g, 1, "x", 1, &out, NULL, -1, &err); break;
    case D_ALLGATHER: rc = rx_zgroup_allgather (g, "x", 1, &out, NULL, -1, &err); break;
    case D_SUM: rc = rx_zgroup_allreduce_i64 (g, v, 2, RED_SUM, -1, &err); break;
    case D_MAX: rc = rx_zgroup_allreduce_i64 (g, v, 2, RED_MAX, -1, &err); break;
    default: rc = rx_zgroup_allreduce_i64 (g, v, 4, RED_SUM, -1, &err); break;
    }
    free (out);
    S->code[rank] = rc;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    rx_zgroup_destroy (&g);
    return 0;
}

static void s_diverge_case (int a, int b, int c, const char *want0)
{
    s_shared_init ();
    int plan[3] = { a, b, c };
    double t0 = s_now ();
    s_run (3, s_ipc (), s_diverge, plan);
    cr_expect_lt (s_now () - t0, 4.0, "divergence is found at once, not by a timeout");
    for (int r = 0; r < 3; r++) cr_expect_eq (S->code[r], RX_EIO, "rank %d: %d %s", r, S->code[r], S->msg[r]);
    cr_expect (strstr (S->msg[0], want0), "rank 0: \"%s\" lacks \"%s\"", S->msg[0], want0);
    cr_expect (strstr (S->msg[1], "ranks diverged"), "rank 1: %s", S->msg[1]);
}

Test (zgroup, diverged_kinds_are_eio, .timeout = 30)
{
    s_diverge_case (D_BCAST0, D_BCAST0, D_ALLGATHER,
                    "ranks diverged: rank 2 sent allgather #3 while rank 0 is at bcast #3 (root 0)");
}

Test (zgroup, diverged_roots_are_eio, .timeout = 30)
{
    s_diverge_case (D_BCAST0, D_BCAST1, D_BCAST0,
                    "ranks diverged: rank 1 sent bcast #3 (root 1) while rank 0 is at bcast #3 (root 0)");
}

Test (zgroup, diverged_reductions_are_eio, .timeout = 30)
{
    s_diverge_case (D_SUM, D_MAX, D_SUM,
                    "rank 1 sent allreduce #3 (max of 2) while rank 0 is at allreduce #3 (sum of 2)");
    s_diverge_case (D_SUM, D_SUM, D_SUM4,
                    "rank 2 sent allreduce #3 (sum of 4) while rank 0 is at allreduce #3 (sum of 2)");
}

/* One rank is a collective ahead (an extra barrier): sequence numbers differ. */
static int s_ahead (int rank, int n, const char *ep, void *arg)
{
    struct rx_err err = { 0 };
    rx_zgroup_t *g = rx_zgroup_new (ep, rank, n, 5, &err);
    CK (g, "%s", err.msg);
    int rc = RX_OK;
    if (rank == 1) rc = rx_zgroup_barrier (g, -1, &err);
    void *out = NULL;
    if (!rc) rc = rx_zgroup_allgather (g, "x", 1, &out, NULL, -1, &err);
    free (out);
    S->code[rank] = rc;
    snprintf (S->msg[rank], sizeof S->msg[rank], "%s", err.msg);
    rx_zgroup_destroy (&g);
    return 0;
}

Test (zgroup, out_of_step_sequences_are_eio, .timeout = 30)
{
    s_shared_init ();
    s_run (2, s_tcp (), s_ahead, NULL);
    cr_expect_eq (S->code[0], RX_EIO, "%s", S->msg[0]);
    cr_expect_eq (S->code[1], RX_EIO, "%s", S->msg[1]);
    cr_expect (strstr (S->msg[0], "ranks diverged: rank 1 sent barrier #1 while rank 0 is at allgather #1"),
               "%s", S->msg[0]);
}
