/* tests/unit/test_dp_proc.c -- the DP controller process (core/dp_proc.c)
 * forked from the test as radixd's main would fork it, with the test
 * playing main (PUSH "sched", PULL "main") and two fake replicas (PULL
 * "sched.0" / "sched.1", PUSH "dpc") over real ZMQ sockets: dispatch by
 * round_robin, shortest_queue (following REQ_DONE / REQ_ERROR) and
 * cache_aware (token-prefix affinity), abort splitting, STATS aggregation
 * (the first only after every replica's first), GET_STATS and FLUSH_CACHE
 * fan-in (with a silent replica), SHUTDOWN forwarding and the confirmed
 * exit, bad options; and the detokenizer waiting for its last upstream.
 *
 * Ordering trick: messages of one PUSH socket arrive in order, so a
 * REQ_ERROR sent after a REQ_DONE on the replicas' socket and seen by main
 * proves the controller has taken the REQ_DONE (s_sync). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#include "boot.h"
#include "dp_proc.h"
#include "ipc.h"
#include "ipc_msg.h"
#include "log.h"
#include "sched_proc.h"
#include "../testutil.h"

#define NREP 2
#define WAIT 3000          /* ms: anything expected comes well within this */
#define QUIET 250          /* ms: long enough to say "nothing came" */

struct fx {
    char *dir, *ini, *log;
    struct rx_boot boot;
    rx_ipc_t *ipc;
    char run_dir[512];
    rx_ipc_sock_t *from;            /* main's PULL */
    rx_ipc_sock_t *to_dp;           /* main's PUSH to "sched" */
    rx_ipc_sock_t *rep_in[NREP];    /* replica d's PULL "sched.<d>" */
    rx_ipc_sock_t *rep_out;         /* the replicas' PUSH to "dpc" */
    pid_t pid;
};

static uint64_t s_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static int s_wait_exit (pid_t pid, int ms)
{
    uint64_t end = s_ms () + (uint64_t) ms;
    for (;;) {
        int st;
        pid_t r = waitpid (pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED (st) ? WEXITSTATUS (st) : 128 + WTERMSIG (st);
        if (s_ms () > end) return -1;
        usleep (5000);
    }
}

static char *s_log_text (const struct fx *f)
{
    size_t n;
    if (access (f->log, R_OK) != 0) return strdup ("");
    char *t = tu_read_file (f->log, &n);
    return t ? t : strdup ("");
}

/* INI, boot, run dir; then fork the controller (dp_size n) and open the
 * test's sockets (after the fork: ZMQ threads must not exist at fork). */
static void s_start_n (struct fx *f, const char *policy, int n, const char *extra)
{
    memset (f, 0, sizeof *f);
    f->pid = -1;
    f->dir = tu_tmpdir ();
    f->ini = tu_path (f->dir, "radixd.ini");
    f->log = tu_path (f->dir, "radixd.log");
    char text[4096];
    snprintf (text, sizeof text, "[plugins]\npath = %s\n[log]\nfile = %s\nlevel = debug\n[dp]\npolicy = %s\n%s",
              tu_env ("RX_PLUGIN_BUILD_DIR"), f->log, policy, extra ? extra : "");
    tu_write (f->ini, text);
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&f->boot, f->ini, 0, &err), RX_OK, "%s", err.msg);
    f->ipc = rx_ipc_create ("radix-test-dp", &err);
    cr_assert_not_null (f->ipc, "%s", err.msg);
    snprintf (f->run_dir, sizeof f->run_dir, "%s", rx_ipc_run_dir (f->ipc));

    fflush (NULL);
    f->pid = fork ();
    cr_assert_geq (f->pid, 0);
    if (f->pid == 0) {
        prctl (PR_SET_PDEATHSIG, SIGKILL);
        signal (SIGINT, SIG_IGN);
        signal (SIGTERM, SIG_IGN);
        signal (SIGPIPE, SIG_IGN);
        rx_log_set_role ("dp", NULL);
        struct rx_dp_proc_opts o = { f->run_dir, n, 100 };
        _exit (rx_dp_proc_main (&f->boot, &o));
    }
    f->from = rx_ipc_bind (f->ipc, RX_IPC_PULL, RX_SOCK_MAIN, &err);
    cr_assert_not_null (f->from, "%s", err.msg);
    for (int d = 0; d < NREP; d++) {
        char name[32];
        rx_dp_sched_sock (d, name, sizeof name);
        f->rep_in[d] = rx_ipc_bind (f->ipc, RX_IPC_PULL, name, &err);
        cr_assert_not_null (f->rep_in[d], "%s", err.msg);
    }
    f->to_dp = rx_ipc_connect (f->ipc, RX_IPC_PUSH, RX_SOCK_SCHED, &err);
    cr_assert_not_null (f->to_dp, "%s", err.msg);
    f->rep_out = rx_ipc_connect (f->ipc, RX_IPC_PUSH, RX_SOCK_DPC, &err);
    cr_assert_not_null (f->rep_out, "%s", err.msg);
}

static void s_start (struct fx *f, const char *policy)
{
    s_start_n (f, policy, NREP, NULL);
}

static void s_stop (struct fx *f)
{
    if (f->pid > 0) {
        kill (f->pid, SIGKILL);
        waitpid (f->pid, NULL, 0);
        f->pid = -1;
    }
    if (getenv ("RX_DP_SHOW_LOG")) {
        char *log = s_log_text (f);
        fprintf (stderr, "--- %s\n%s", f->log, log);
        free (log);
    }
    rx_ipc_destroy (&f->ipc);
    rx_boot_close (&f->boot);
    char cmd[600];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system (cmd) != 0) fprintf (stderr, "cannot remove %s\n", f->dir);
    free (f->dir);
    free (f->ini);
    free (f->log);
}

/* ------------------------------------------------------------ helpers -- */

static void s_send (rx_ipc_sock_t *s, const struct rx_ipc_msg *m)
{
    struct rx_err err = { 0 };
    cr_assert_eq (rx_ipc_send (s, m, WAIT, &err), RX_OK, "%s", err.msg);
}

static void s_recv (rx_ipc_sock_t *s, struct rx_ipc_msg *m, const char *what)
{
    struct rx_err err = { 0 };
    int rc = rx_ipc_recv (s, m, WAIT, &err);
    cr_assert_eq (rc, RX_OK, "%s: %s", what, rc == RX_ETIMEDOUT ? "nothing came" : err.msg);
}

static void s_quiet (rx_ipc_sock_t *s, int ms, const char *what)
{
    struct rx_ipc_msg m;
    struct rx_err err = { 0 };
    int rc = rx_ipc_recv (s, &m, ms, &err);
    if (rc == RX_OK) {
        cr_assert_fail ("%s: unexpected %s", what, rx_ipc_type_name (m.type));
        rx_ipc_msg_free (&m);
    }
    cr_assert_eq (rc, RX_ETIMEDOUT, "%s: %s", what, err.msg);
}

/* Nothing but periodic STATS reaches main for ms. */
static void s_quiet_main (struct fx *f, int ms, const char *what)
{
    uint64_t end = s_ms () + (uint64_t) ms;
    for (uint64_t now = s_ms (); now < end; now = s_ms ()) {
        struct rx_ipc_msg m;
        struct rx_err err = { 0 };
        int rc = rx_ipc_recv (f->from, &m, (int) (end - now), &err);
        if (rc == RX_ETIMEDOUT) return;
        cr_assert_eq (rc, RX_OK, "%s: %s", what, err.msg);
        int periodic = m.type == RX_IPC_STATS && m.u.stats.cookie == 0;
        int type = m.type;
        rx_ipc_msg_free (&m);
        cr_assert (periodic, "%s: unexpected %s", what, rx_ipc_type_name (type));
    }
}

/* The next message to main that is not a periodic STATS. */
static void s_recv_main (struct fx *f, struct rx_ipc_msg *m, const char *what)
{
    uint64_t end = s_ms () + WAIT;
    for (;;) {
        s_recv (f->from, m, what);
        if (!(m->type == RX_IPC_STATS && m->u.stats.cookie == 0)) return;
        rx_ipc_msg_free (m);
        cr_assert_lt (s_ms (), end, "%s: only periodic STATS came", what);
    }
}

static struct rx_ipc_stats s_stats (uint32_t d, uint64_t cookie, uint32_t scale)
{
    struct rx_ipc_stats s;
    memset (&s, 0, sizeof s);
    s.cookie = cookie;
    s.dp_rank = d;
    s.running = 1 * scale;
    s.queued = 2 * scale;
    s.kv_used = 100 * scale;
    s.kv_total = 1000 * scale;
    s.steps = 10 * scale;
    s.prompt_tokens = 400 * scale;
    s.gen_tokens = 50 * scale;
    s.cache_hit_rate = 0.99f;          /* must be recomputed, not summed */
    s.prompt_tps = 1.5f * (float) scale;
    s.gen_tps = 0.5f * (float) scale;
    s.cached_tokens = 100 * scale * scale;
    s.cache_tokens = 30 * scale;
    s.finished = 7 * scale;
    s.retractions = scale;
    s.max_running_requests = 8 * scale;
    s.context_len = 512 * scale;
    s.n_vocab = 32000 + scale;
    s.new_token_ratio = 0.25f * (float) scale;
    return s;
}

static void s_rep_stats (struct fx *f, uint32_t d, uint64_t cookie, uint32_t scale)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_STATS;
    m.u.stats = s_stats (d, cookie, scale);
    s_send (f->rep_out, &m);
}

/* Replica d (scale d + 1) and the aggregate of both: what main must see.
 * Replica 0: scale 1, replica 1: scale 2. */
static void s_check_sum (const struct rx_ipc_stats *s, uint64_t cookie)
{
    cr_assert_eq (s->cookie, cookie);
    cr_assert_eq (s->dp_rank, 0);
    cr_assert_eq (s->running, 3);
    cr_assert_eq (s->queued, 6);
    cr_assert_eq (s->kv_used, 300);
    cr_assert_eq (s->kv_total, 3000);
    cr_assert_eq (s->steps, 20);                    /* the max */
    cr_assert_eq (s->prompt_tokens, 1200);
    cr_assert_eq (s->gen_tokens, 150);
    cr_assert_eq (s->cached_tokens, 100 + 400);
    cr_assert_float_eq (s->cache_hit_rate, 500.0f / 1200.0f, 1e-6);
    cr_assert_float_eq (s->prompt_tps, 4.5f, 1e-6);
    cr_assert_float_eq (s->gen_tps, 1.5f, 1e-6);
    cr_assert_eq (s->cache_tokens, 90);
    cr_assert_eq (s->finished, 21);
    cr_assert_eq (s->retractions, 3);
    cr_assert_eq (s->max_running_requests, 24);
    cr_assert_eq (s->context_len, 512);             /* replica 0's */
    cr_assert_eq (s->n_vocab, 32001);
}

/* Both replicas up: main gets the first STATS. */
static void s_ready (struct fx *f)
{
    s_rep_stats (f, 0, 0, 1);
    s_rep_stats (f, 1, 0, 2);
    struct rx_ipc_msg m;
    s_recv (f->from, &m, "first STATS");
    cr_assert_eq (m.type, RX_IPC_STATS);
    s_check_sum (&m.u.stats, 0);
    rx_ipc_msg_free (&m);
}

static int32_t s_ids[300];

static void s_req_ids (struct fx *f, uint64_t rid, const int32_t *ids, uint32_t n)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_NEW;
    m.u.req.rid = rid;
    m.u.req.kind = RX_REQ_COMPLETION;
    m.u.req.n_input = n;
    m.u.req.input_ids = (int32_t *) ids;
    m.u.req.sp.temperature = 0.5f;
    m.u.req.sp.top_p = 1.0f;
    m.u.req.sp.top_k = -1;
    m.u.req.sp.max_tokens = (int32_t) (rid + 3);
    m.u.req.sp.n = 1;
    m.u.req.sp.n_stop = 1;
    m.u.req.sp.stop[0] = (char *) "\n\n";
    s_send (f->to_dp, &m);
}

static void s_req (struct fx *f, uint64_t rid)
{
    for (int i = 0; i < 8; i++) s_ids[i] = (int32_t) (rid * 100 + (uint64_t) i);
    s_req_ids (f, rid, s_ids, 8);
}

/* Which replica got REQ_NEW rid (the other got nothing); checks that it
 * arrived intact. */
static int s_where (struct fx *f, uint64_t rid)
{
    rx_ipc_sock_t *socks[NREP] = { f->rep_in[0], f->rep_in[1] };
    unsigned char ready[NREP] = { 0 };
    struct rx_err err = { 0 };
    int n = rx_ipc_poll (socks, NREP, ready, WAIT, &err);
    cr_assert_gt (n, 0, "request %llu reached no replica", (unsigned long long) rid);
    cr_assert_eq (n, 1, "both replicas have a message for request %llu", (unsigned long long) rid);
    int d = ready[0] ? 0 : 1;
    struct rx_ipc_msg m;
    s_recv (f->rep_in[d], &m, "REQ_NEW");
    cr_assert_eq (m.type, RX_IPC_REQ_NEW, "replica %d got %s", d, rx_ipc_type_name (m.type));
    cr_assert_eq (m.u.req.rid, rid);
    cr_assert_eq (m.u.req.sp.max_tokens, (int32_t) (rid + 3));
    cr_assert_eq (m.u.req.sp.n_stop, 1);
    cr_assert_str_eq (m.u.req.sp.stop[0], "\n\n");
    cr_assert_geq (m.u.req.n_input, 1);
    rx_ipc_msg_free (&m);
    return d;
}

static void s_done (struct fx *f, const uint64_t *rids, uint32_t n)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_DONE;
    m.u.done.n = n;
    m.u.done.rids = (uint64_t *) rids;
    s_send (f->rep_out, &m);
}

static void s_rep_error (struct fx *f, uint64_t rid, int status, const char *msg)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_ERROR;
    m.u.req_error.rid = rid;
    m.u.req_error.status = status;
    m.u.req_error.message = (char *) msg;
    s_send (f->rep_out, &m);
}

static void s_expect_error (struct fx *f, uint64_t rid, int status, const char *msg)
{
    struct rx_ipc_msg m;
    s_recv_main (f, &m, "REQ_ERROR");
    cr_assert_eq (m.type, RX_IPC_REQ_ERROR, "main got %s", rx_ipc_type_name (m.type));
    cr_assert_eq (m.u.req_error.rid, rid);
    cr_assert_eq (m.u.req_error.status, status);
    cr_assert_str_eq (m.u.req_error.message, msg);
    rx_ipc_msg_free (&m);
}

/* Everything sent on rep_out before now has been taken by the controller. */
static void s_sync (struct fx *f)
{
    static uint64_t n = 1000000;
    s_rep_error (f, ++n, RX_EAGAIN, "sync");
    s_expect_error (f, n, RX_EAGAIN, "sync");
}

static void s_control (struct fx *f, int type, uint64_t cookie)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = (uint16_t) type;
    m.u.cookie = cookie;
    s_send (f->to_dp, &m);
}

/* The cookie replica d got for a fan-out of type. */
static uint64_t s_rep_cookie (struct fx *f, int d, int type)
{
    struct rx_ipc_msg m;
    s_recv (f->rep_in[d], &m, "fan-out");
    cr_assert_eq (m.type, type, "replica %d got %s", d, rx_ipc_type_name (m.type));
    uint64_t c = m.u.cookie;
    rx_ipc_msg_free (&m);
    return c;
}

static void s_flush_reply (struct fx *f, uint64_t cookie, int status, const char *msg)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_FLUSH_CACHE_REPLY;
    m.u.flush_reply.cookie = cookie;
    m.u.flush_reply.status = status;
    m.u.flush_reply.message = (char *) msg;
    s_send (f->rep_out, &m);
}

static void s_shutdown (rx_ipc_sock_t *s, int mode, uint32_t deadline_ms)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_SHUTDOWN;
    m.u.shutdown.mode = (uint8_t) mode;
    m.u.shutdown.deadline_ms = deadline_ms;
    s_send (s, &m);
}

/* main's SHUTDOWN NOW, both replicas get it and confirm: the controller
 * exits 0 and logs its dispatch counts; returns the log. */
static char *s_shutdown_all (struct fx *f)
{
    s_shutdown (f->to_dp, RX_IPC_SHUTDOWN_NOW, 0);
    for (int d = 0; d < NREP; d++) {
        struct rx_ipc_msg m;
        s_recv (f->rep_in[d], &m, "SHUTDOWN");
        cr_assert_eq (m.type, RX_IPC_SHUTDOWN, "replica %d got %s", d, rx_ipc_type_name (m.type));
        cr_assert_eq (m.u.shutdown.mode, RX_IPC_SHUTDOWN_NOW);
        rx_ipc_msg_free (&m);
        s_shutdown (f->rep_out, RX_IPC_SHUTDOWN_NOW, 0);
    }
    cr_assert_eq (s_wait_exit (f->pid, WAIT), 0);
    f->pid = -1;
    return s_log_text (f);
}

/* -------------------------------------------------------------- tests -- */

Test (dp_proc, socket_names)
{
    char b[32];
    rx_dp_sched_sock (0, b, sizeof b);
    cr_assert_str_eq (b, "sched.0");
    rx_dp_sched_sock (13, b, sizeof b);
    cr_assert_str_eq (b, "sched.13");
    rx_dp_sched_sock (13, b, 4);
    cr_assert_str_eq (b, "sch");
    cr_assert_str_eq (RX_SOCK_DPC, "dpc");
}

Test (dp_proc, round_robin_alternates, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_ready (&f);
    int got[6];
    for (uint64_t rid = 1; rid <= 6; rid++) {
        s_req (&f, rid);
        got[rid - 1] = s_where (&f, rid);
    }
    for (int i = 0; i < 6; i++) cr_assert_eq (got[i], i % 2, "request %d went to replica %d", i + 1, got[i]);
    /* the input ids travel unchanged */
    int32_t ids[3] = { 1, 0, 31999 };
    s_req_ids (&f, 7, ids, 3);
    struct rx_ipc_msg m;
    s_recv (f.rep_in[0], &m, "request 7");
    cr_assert_eq (m.u.req.n_input, 3);
    cr_assert_eq (m.u.req.input_ids[0], 1);
    cr_assert_eq (m.u.req.input_ids[1], 0);
    cr_assert_eq (m.u.req.input_ids[2], 31999);
    cr_assert_float_eq (m.u.req.sp.temperature, 0.5f, 0);
    rx_ipc_msg_free (&m);
    s_quiet (f.rep_in[1], QUIET, "replica 1");
    char *log = s_shutdown_all (&f);
    cr_assert (strstr (log, "dp controller: 2 replicas, policy round_robin"), "%s", log);
    cr_assert (strstr (log, "dp controller: dispatched 4 / 3 requests"), "%s", log);
    cr_assert (strstr (log, "-> replica 1"), "no debug line per dispatch:\n%s", log);
    free (log);
    s_stop (&f);
}

Test (dp_proc, first_stats_waits_for_every_replica, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_rep_stats (&f, 0, 0, 1);
    s_rep_stats (&f, 0, 0, 1);
    /* 3 stats intervals: still nothing, replica 1 has not reported */
    s_quiet (f.from, 300, "main before replica 1 is up");
    s_rep_stats (&f, 1, 0, 2);
    struct rx_ipc_msg m;
    s_recv (f.from, &m, "first STATS");
    cr_assert_eq (m.type, RX_IPC_STATS);
    s_check_sum (&m.u.stats, 0);
    rx_ipc_msg_free (&m);
    /* then every interval, with the replicas' latest numbers */
    s_rep_stats (&f, 1, 0, 3);
    s_sync (&f);
    s_recv (f.from, &m, "periodic STATS");
    cr_assert_eq (m.type, RX_IPC_STATS);
    cr_assert_eq (m.u.stats.cookie, 0);
    cr_assert_eq (m.u.stats.kv_total, 1000 + 3000);
    cr_assert_eq (m.u.stats.steps, 30);
    cr_assert_float_eq (m.u.stats.new_token_ratio, (0.25f + 0.75f) / 2, 1e-6);
    rx_ipc_msg_free (&m);
    uint64_t t0 = s_ms ();
    s_recv (f.from, &m, "periodic STATS");
    cr_assert_eq (m.u.stats.cookie, 0);
    cr_assert_leq (s_ms () - t0, 1000);
    rx_ipc_msg_free (&m);
    /* a STATS from a rank that does not exist is ignored, not fatal */
    s_rep_stats (&f, 7, 0, 1);
    s_sync (&f);
    char *log = s_shutdown_all (&f);
    cr_assert (strstr (log, "periodic STATS from dp_rank 7 (only 2 replicas); ignored"), "%s", log);
    free (log);
    s_stop (&f);
}

Test (dp_proc, shortest_queue_follows_done_and_errors, .timeout = 30)
{
    struct fx f;
    s_start (&f, "shortest_queue");
    s_ready (&f);
    s_req (&f, 1);
    cr_assert_eq (s_where (&f, 1), 0);          /* loads 0 0: the lowest id */
    s_req (&f, 2);
    cr_assert_eq (s_where (&f, 2), 1);          /* 1 0 */
    s_req (&f, 3);
    cr_assert_eq (s_where (&f, 3), 0);          /* 1 1 */
    s_req (&f, 4);
    cr_assert_eq (s_where (&f, 4), 1);          /* 2 1 */
    s_req (&f, 5);
    cr_assert_eq (s_where (&f, 5), 0);          /* 2 2 -> 3 2 */
    /* replica 0 finishes 1 and 3 (and an unknown rid): loads 1 2 */
    uint64_t done[3] = { 1, 3, 999 };
    s_done (&f, done, 3);
    s_sync (&f);
    s_req (&f, 6);
    cr_assert_eq (s_where (&f, 6), 0);          /* 1 2 -> 2 2 */
    /* replica 1 refuses 2 and 4: main hears of it; loads 2 0 */
    s_rep_error (&f, 2, RX_EAGAIN, "queue full");
    s_expect_error (&f, 2, RX_EAGAIN, "queue full");
    s_rep_error (&f, 4, RX_ERANGE, "prompt too long");
    s_expect_error (&f, 4, RX_ERANGE, "prompt too long");
    s_req (&f, 7);
    cr_assert_eq (s_where (&f, 7), 1);          /* 2 0 -> 2 1 */
    s_req (&f, 8);
    cr_assert_eq (s_where (&f, 8), 1);          /* 2 1 -> 2 2 */
    /* a second DONE of an ended rid changes nothing */
    s_done (&f, done, 2);
    s_sync (&f);
    s_req (&f, 9);
    cr_assert_eq (s_where (&f, 9), 0);          /* 2 2 -> 3 2 */
    char *log = s_shutdown_all (&f);
    cr_assert (strstr (log, "dp controller: dispatched 5 / 4 requests"), "%s", log);
    free (log);
    s_stop (&f);
}

Test (dp_proc, cache_aware_keeps_token_prefixes_together, .timeout = 30)
{
    struct fx f;
    s_start (&f, "cache_aware");
    s_ready (&f);
    /* Two long prompts sharing nothing, each continued three times with a
     * different tail: every continuation goes where its prefix went. */
    int32_t a[200], b[200];
    for (int i = 0; i < 200; i++) {
        a[i] = 1000 + i;
        b[i] = 20000 + 7 * i;       /* high bits differ too */
    }
    s_req_ids (&f, 1, a, 150);
    int da = s_where (&f, 1);
    s_req_ids (&f, 2, b, 150);
    int db = s_where (&f, 2);
    cr_assert_neq (da, db, "a miss goes to the replica with the smaller tree");
    /* three of a in a row, then three of b: load alone would alternate */
    for (uint64_t rid = 3; rid <= 8; rid++) {
        int32_t *p = rid <= 5 ? a : b;
        p[150] = (int32_t) rid;     /* a different continuation each time */
        s_req_ids (&f, rid, p, 151 + (uint32_t) rid);
        cr_assert_eq (s_where (&f, rid), rid <= 5 ? da : db, "request %llu", (unsigned long long) rid);
    }
    char *log = s_shutdown_all (&f);
    cr_assert (strstr (log, "policy cache_aware"), "%s", log);
    free (log);
    s_stop (&f);
}

Test (dp_proc, abort_split_per_replica, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_ready (&f);
    for (uint64_t rid = 11; rid <= 14; rid++) {
        s_req (&f, rid);
        cr_assert_eq (s_where (&f, rid), (int) (rid - 11) % 2);
    }
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_ABORT;
    uint64_t rids[5] = { 14, 11, 77, 12, 13 };
    m.u.abort.n = 5;
    m.u.abort.rids = rids;
    s_send (f.to_dp, &m);
    struct rx_ipc_msg r;
    s_recv (f.rep_in[0], &r, "abort on replica 0");
    cr_assert_eq (r.type, RX_IPC_REQ_ABORT);
    cr_assert_eq (r.u.abort.n, 2);
    cr_assert_eq (r.u.abort.rids[0], 11);
    cr_assert_eq (r.u.abort.rids[1], 13);
    rx_ipc_msg_free (&r);
    s_recv (f.rep_in[1], &r, "abort on replica 1");
    cr_assert_eq (r.type, RX_IPC_REQ_ABORT);
    cr_assert_eq (r.u.abort.n, 2);
    cr_assert_eq (r.u.abort.rids[0], 14);
    cr_assert_eq (r.u.abort.rids[1], 12);
    rx_ipc_msg_free (&r);
    /* only rids in flight on a replica go to it: 11 is done, 77 unknown */
    uint64_t done = 11;
    s_done (&f, &done, 1);
    s_sync (&f);
    rids[0] = 11;
    rids[1] = 77;
    m.u.abort.n = 2;
    s_send (f.to_dp, &m);
    s_quiet (f.rep_in[0], QUIET, "replica 0 after an abort of nothing in flight");
    s_quiet (f.rep_in[1], 10, "replica 1 after an abort of nothing in flight");
    free (s_shutdown_all (&f));
    s_stop (&f);
}

/* REQ_ABORT_SEQ: each (rid, sibling) to the replica owning the rid, the
 * index kept; a rid not in flight is dropped. */
Test (dp_proc, abort_seq_split_per_replica, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_ready (&f);
    /* One at a time: s_where wants exactly one replica with a message. */
    for (uint64_t rid = 21; rid <= 22; rid++) {
        s_req (&f, rid);
        cr_assert_eq (s_where (&f, rid), (int) (rid - 21));
    }
    struct rx_ipc_seq_ref q[4] = { { 22, 2 }, { 21, 1 }, { 99, 0 }, { 21, 0 } };
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_ABORT_SEQ;
    m.u.abort_seq.n = 4;
    m.u.abort_seq.seqs = q;
    s_send (f.to_dp, &m);
    struct rx_ipc_msg r;
    s_recv (f.rep_in[0], &r, "sibling abort on replica 0");
    cr_assert_eq (r.type, RX_IPC_REQ_ABORT_SEQ);
    cr_assert_eq (r.u.abort_seq.n, 2);
    cr_assert_eq (r.u.abort_seq.seqs[0].rid, 21);
    cr_assert_eq (r.u.abort_seq.seqs[0].index, 1);
    cr_assert_eq (r.u.abort_seq.seqs[1].rid, 21);
    cr_assert_eq (r.u.abort_seq.seqs[1].index, 0);
    rx_ipc_msg_free (&r);
    s_recv (f.rep_in[1], &r, "sibling abort on replica 1");
    cr_assert_eq (r.type, RX_IPC_REQ_ABORT_SEQ);
    cr_assert_eq (r.u.abort_seq.n, 1);
    cr_assert_eq (r.u.abort_seq.seqs[0].rid, 22);
    cr_assert_eq (r.u.abort_seq.seqs[0].index, 2);
    rx_ipc_msg_free (&r);
    /* only an unknown rid: nothing is sent */
    m.u.abort_seq.n = 1;
    m.u.abort_seq.seqs = &q[2];
    s_send (f.to_dp, &m);
    s_quiet (f.rep_in[0], QUIET, "replica 0 after a sibling abort of nothing in flight");
    s_quiet (f.rep_in[1], 10, "replica 1 after a sibling abort of nothing in flight");
    free (s_shutdown_all (&f));
    s_stop (&f);
}

Test (dp_proc, get_stats_fan_in, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_ready (&f);
    s_control (&f, RX_IPC_GET_STATS, 4242);
    uint64_t c0 = s_rep_cookie (&f, 0, RX_IPC_GET_STATS);
    uint64_t c1 = s_rep_cookie (&f, 1, RX_IPC_GET_STATS);
    cr_assert_neq (c0, 0);
    cr_assert_neq (c1, 0);
    cr_assert_neq (c0, c1, "each replica gets its own cookie");
    s_rep_stats (&f, 0, c0, 1);
    s_quiet_main (&f, 300, "GET_STATS answered before replica 1");
    struct rx_ipc_msg m;
    s_rep_stats (&f, 1, c1, 2);
    s_recv_main (&f, &m, "STATS 4242");
    cr_assert_eq (m.type, RX_IPC_STATS);
    s_check_sum (&m.u.stats, 4242);
    rx_ipc_msg_free (&m);
    /* a late duplicate answer is dropped */
    s_rep_stats (&f, 1, c1, 2);
    s_sync (&f);

    /* replica 1 stays silent: after ~2 s main gets an answer from replica
     * 0's reply and replica 1's latest periodic STATS, and the log names 1 */
    uint64_t t0 = s_ms ();
    s_control (&f, RX_IPC_GET_STATS, 4243);
    c0 = s_rep_cookie (&f, 0, RX_IPC_GET_STATS);
    s_rep_cookie (&f, 1, RX_IPC_GET_STATS);
    s_rep_stats (&f, 0, c0, 1);
    s_recv_main (&f, &m, "STATS 4243");
    uint64_t took = s_ms () - t0;
    cr_assert_geq (took, RX_DP_STATS_WAIT_MS - 100);
    cr_assert_lt (took, RX_DP_STATS_WAIT_MS + 1500);
    s_check_sum (&m.u.stats, 4243);
    rx_ipc_msg_free (&m);
    char *log = s_shutdown_all (&f);
    cr_assert (strstr (log, "GET_STATS: replica(s) 1 did not answer"), "%s", log);
    free (log);
    s_stop (&f);
}

Test (dp_proc, flush_fan_in, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_ready (&f);
    /* both flush */
    s_control (&f, RX_IPC_FLUSH_CACHE, 9);
    uint64_t c0 = s_rep_cookie (&f, 0, RX_IPC_FLUSH_CACHE);
    uint64_t c1 = s_rep_cookie (&f, 1, RX_IPC_FLUSH_CACHE);
    s_flush_reply (&f, c1, RX_OK, "cache flushed (5 tokens)");
    s_quiet_main (&f, QUIET, "flush reply before replica 0");
    s_flush_reply (&f, c0, RX_OK, "cache flushed (7 tokens)");
    struct rx_ipc_msg m;
    s_recv_main (&f, &m, "flush reply");
    cr_assert_eq (m.type, RX_IPC_FLUSH_CACHE_REPLY);
    cr_assert_eq (m.u.flush_reply.cookie, 9);
    cr_assert_eq (m.u.flush_reply.status, RX_OK);
    cr_assert (strstr (m.u.flush_reply.message, "flushed"), "%s", m.u.flush_reply.message);
    rx_ipc_msg_free (&m);
    /* replica 1 refuses: main gets its status and message once */
    s_control (&f, RX_IPC_FLUSH_CACHE, 10);
    c0 = s_rep_cookie (&f, 0, RX_IPC_FLUSH_CACHE);
    c1 = s_rep_cookie (&f, 1, RX_IPC_FLUSH_CACHE);
    s_flush_reply (&f, c0, RX_OK, "cache flushed (0 tokens)");
    s_flush_reply (&f, c1, RX_EAGAIN, "2 requests are running");
    s_recv_main (&f, &m, "flush refusal");
    cr_assert_eq (m.type, RX_IPC_FLUSH_CACHE_REPLY);
    cr_assert_eq (m.u.flush_reply.cookie, 10);
    cr_assert_eq (m.u.flush_reply.status, RX_EAGAIN);
    cr_assert_str_eq (m.u.flush_reply.message, "replica 1: 2 requests are running");
    rx_ipc_msg_free (&m);
    s_quiet_main (&f, QUIET, "a second flush reply");
    free (s_shutdown_all (&f));
    s_stop (&f);
}

Test (dp_proc, drain_forwarded_then_exit_after_every_replica, .timeout = 30)
{
    struct fx f;
    s_start (&f, "round_robin");
    s_ready (&f);
    s_req (&f, 1);
    cr_assert_eq (s_where (&f, 1), 0);
    s_shutdown (f.to_dp, RX_IPC_SHUTDOWN_DRAIN, 5000);
    for (int d = 0; d < NREP; d++) {
        struct rx_ipc_msg m;
        s_recv (f.rep_in[d], &m, "DRAIN");
        cr_assert_eq (m.type, RX_IPC_SHUTDOWN);
        cr_assert_eq (m.u.shutdown.mode, RX_IPC_SHUTDOWN_DRAIN);
        cr_assert_eq (m.u.shutdown.deadline_ms, 5000);
        rx_ipc_msg_free (&m);
    }
    /* while draining: new requests refused here, flush refused, stats
     * answered from what it knows, errors from replicas still relayed */
    s_req (&f, 2);
    s_expect_error (&f, 2, RX_EAGAIN, "server is shutting down");
    s_control (&f, RX_IPC_FLUSH_CACHE, 5);
    struct rx_ipc_msg m;
    s_recv_main (&f, &m, "flush while draining");
    cr_assert_eq (m.type, RX_IPC_FLUSH_CACHE_REPLY);
    cr_assert_eq (m.u.flush_reply.status, RX_EAGAIN);
    rx_ipc_msg_free (&m);
    s_control (&f, RX_IPC_GET_STATS, 6);
    s_recv_main (&f, &m, "stats while draining");
    cr_assert_eq (m.type, RX_IPC_STATS);
    s_check_sum (&m.u.stats, 6);
    rx_ipc_msg_free (&m);
    s_quiet (f.rep_in[0], 10, "replica 0 while draining");
    s_quiet (f.rep_in[1], 10, "replica 1 while draining");
    /* one replica stopped: the controller still runs and relays */
    uint64_t done = 1;
    s_done (&f, &done, 1);
    s_shutdown (f.rep_out, RX_IPC_SHUTDOWN_NOW, 0);
    s_sync (&f);
    cr_assert_eq (s_wait_exit (f.pid, 200), -1, "exited before the last replica stopped");
    /* the second stops: exit 0 */
    s_shutdown (f.rep_out, RX_IPC_SHUTDOWN_NOW, 0);
    cr_assert_eq (s_wait_exit (f.pid, WAIT), 0);
    f.pid = -1;
    char *log = s_log_text (&f);
    cr_assert (strstr (log, "dp controller: dispatched 1 / 0 requests"), "%s", log);
    cr_assert (strstr (log, "dp controller: stopped"), "%s", log);
    free (log);
    s_stop (&f);
}

Test (dp_proc, bad_options_exit_1, .timeout = 30)
{
    struct fx f;
    s_start (&f, "no_such_policy");
    cr_assert_eq (s_wait_exit (f.pid, WAIT), 1);
    f.pid = -1;
    char *log = s_log_text (&f);
    cr_assert (strstr (log, "dp controller: [dp] policy = \"no_such_policy\": "), "%s", log);
    cr_assert_eq (tu_lines (log), 1, "one line:\n%s", log);
    free (log);
    s_stop (&f);

    s_start_n (&f, "round_robin", 0, NULL);
    cr_assert_eq (s_wait_exit (f.pid, WAIT), 1);
    f.pid = -1;
    log = s_log_text (&f);
    cr_assert (strstr (log, "dp controller: dp_size 0 is out of range 1..1024"), "%s", log);
    free (log);
    s_stop (&f);
}

/* The detokenizer with two upstream schedulers stops only at the second
 * SHUTDOWN, and still renders TOKENS between the two. */
Test (dp_proc, detokenizer_waits_for_last_upstream, .timeout = 30)
{
    TU_REQUIRE_SHARED ();
    char *models = tu_path (tu_env ("RADIX_SHARED"), "data/models");
    char *model = tu_path (models, "tiny-llama.gguf");
    free (models);
    char extra[1024];
    snprintf (extra, sizeof extra, "[model]\npath = %s\n", model);
    free (model);
    struct fx f;
    memset (&f, 0, sizeof f);
    f.dir = tu_tmpdir ();
    f.ini = tu_path (f.dir, "radixd.ini");
    f.log = tu_path (f.dir, "radixd.log");
    char text[4096];
    snprintf (text, sizeof text, "[plugins]\npath = %s\n[log]\nfile = %s\nlevel = info\n%s",
              tu_env ("RX_PLUGIN_BUILD_DIR"), f.log, extra);
    tu_write (f.ini, text);
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&f.boot, f.ini, 0, &err), RX_OK, "%s", err.msg);
    f.ipc = rx_ipc_create ("radix-test-dp", &err);
    cr_assert_not_null (f.ipc, "%s", err.msg);
    snprintf (f.run_dir, sizeof f.run_dir, "%s", rx_ipc_run_dir (f.ipc));
    fflush (NULL);
    f.pid = fork ();
    cr_assert_geq (f.pid, 0);
    if (f.pid == 0) {
        prctl (PR_SET_PDEATHSIG, SIGKILL);
        rx_log_set_role ("detok", NULL);
        _exit (rx_detok_proc_main_n (&f.boot, f.run_dir, 2));
    }
    f.from = rx_ipc_bind (f.ipc, RX_IPC_PULL, RX_SOCK_MAIN, &err);
    cr_assert_not_null (f.from, "%s", err.msg);
    rx_ipc_sock_t *to_detok = rx_ipc_connect (f.ipc, RX_IPC_PUSH, RX_SOCK_DETOK, &err);
    cr_assert_not_null (to_detok, "%s", err.msg);

    s_shutdown (to_detok, RX_IPC_SHUTDOWN_NOW, 0);
    /* Llama-2 SPM: 15043 = "▁Hello" */
    int32_t ids[1] = { 15043 };
    struct rx_ipc_tok_out o;
    memset (&o, 0, sizeof o);
    o.rid = 5;
    o.finish = RX_FINISH_LENGTH;
    o.matched = -1;
    o.n_ids = 1;
    o.ids = ids;
    o.first = 1;
    o.skip_special_tokens = 1;
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_TOKENS;
    m.u.tokens.n = 1;
    m.u.tokens.out = &o;
    s_send (to_detok, &m);
    struct rx_ipc_msg t;
    s_recv (f.from, &t, "TEXT after the first SHUTDOWN");
    cr_assert_eq (t.type, RX_IPC_TEXT);
    cr_assert_eq (t.u.text.n, 1);
    cr_assert_eq (t.u.text.out[0].rid, 5);
    cr_assert_eq (t.u.text.out[0].finish, RX_FINISH_LENGTH);
    cr_assert_gt (t.u.text.out[0].text_len, 0);
    rx_ipc_msg_free (&t);
    cr_assert_eq (s_wait_exit (f.pid, 100), -1);
    s_shutdown (to_detok, RX_IPC_SHUTDOWN_NOW, 0);
    cr_assert_eq (s_wait_exit (f.pid, WAIT), 0);
    f.pid = -1;
    s_stop (&f);
}
