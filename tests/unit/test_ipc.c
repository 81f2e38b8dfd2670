/* tests/unit/test_ipc.c -- ZMQ channels across real processes: a forked
 * child PULLs and echoes back over PUSH through ipc:// sockets in the
 * private run directory; 10k messages arrive in order; timeouts; polling;
 * malformed messages; the run directory is 0700 and removed; the heartbeat
 * page is seen across processes; tcp:// works; errors carry ZMQ's text. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc.h"
#include "../testutil.h"

static int64_t s_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static rx_ipc_t *s_create (void)
{
    struct rx_err err = { 0 };
    rx_ipc_t *ipc = rx_ipc_create ("radix-test", &err);
    cr_assert_not_null (ipc, "%s", err.msg);
    return ipc;
}

static int s_wait_child (pid_t pid)
{
    int st;
    while (waitpid (pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED (st) ? WEXITSTATUS (st) : 128 + WTERMSIG (st);
}

/* The echo child: its own context on the parent's run dir; binds "down",
 * connects "up"; echoes each decoded message re-encoded (so the codec runs
 * in both processes) until SHUTDOWN, which it echoes too.  Exit codes say
 * what failed. */
static void s_echo_child (const char *dir)
{
    struct rx_err err = { 0 };
    rx_ipc_t *ipc = rx_ipc_join (dir, &err);
    if (!ipc) _exit (10);
    rx_ipc_sock_t *down = rx_ipc_bind (ipc, RX_IPC_PULL, "down", &err);
    rx_ipc_sock_t *up = rx_ipc_connect (ipc, RX_IPC_PUSH, "up", &err);
    if (!down || !up) _exit (11);
    for (;;) {
        struct rx_ipc_msg m;
        int rc = rx_ipc_recv (down, &m, 20000, &err);
        if (rc == RX_EFORMAT) {
            /* report the refusal upstream as a FLUSH_CACHE_REPLY */
            struct rx_ipc_msg r = { .type = RX_IPC_FLUSH_CACHE_REPLY };
            r.u.flush_reply.status = RX_EFORMAT;
            r.u.flush_reply.message = err.msg;
            if (rx_ipc_send (up, &r, 20000, &err) < 0) _exit (12);
            continue;
        }
        if (rc < 0) _exit (13);
        if (rx_ipc_send (up, &m, 20000, &err) < 0) _exit (14);
        int done = m.type == RX_IPC_SHUTDOWN;
        rx_ipc_msg_free (&m);
        if (done) break;
    }
    rx_ipc_destroy (&ipc);     /* not the owner: leaves the run dir */
    _exit (0);
}

struct s_pair {
    rx_ipc_t *ipc;
    rx_ipc_sock_t *up;      /* PULL, bound here */
    rx_ipc_sock_t *down;    /* PUSH, connected to the child's "down" */
    pid_t child;
};

static struct s_pair s_start_echo (void)
{
    struct s_pair p = { 0 };
    struct rx_err err = { 0 };
    p.ipc = s_create ();
    p.up = rx_ipc_bind (p.ipc, RX_IPC_PULL, "up", &err);
    cr_assert_not_null (p.up, "%s", err.msg);
    p.child = fork ();
    cr_assert_geq (p.child, 0);
    if (p.child == 0) s_echo_child (rx_ipc_run_dir (p.ipc));
    p.down = rx_ipc_connect (p.ipc, RX_IPC_PUSH, "down", &err);
    cr_assert_not_null (p.down, "%s", err.msg);
    return p;
}

static void s_stop_echo (struct s_pair *p)
{
    struct rx_err err = { 0 };
    struct rx_ipc_msg m = { .type = RX_IPC_SHUTDOWN };
    cr_assert_eq (rx_ipc_send (p->down, &m, 10000, &err), RX_OK, "%s", err.msg);
    struct rx_ipc_msg r;
    cr_assert_eq (rx_ipc_recv (p->up, &r, 10000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_SHUTDOWN);
    rx_ipc_msg_free (&r);
    cr_assert_eq (s_wait_child (p->child), 0);
    rx_ipc_destroy (&p->ipc);
    cr_assert_null (p->ipc);
}

Test (ipc, run_dir_private_and_removed)
{
    /* XDG_RUNTIME_DIR is used when it is a usable directory */
    char *xdg = tu_tmpdir ();
    setenv ("XDG_RUNTIME_DIR", xdg, 1);
    rx_ipc_t *ipc = s_create ();
    char dir[4096];
    snprintf (dir, sizeof dir, "%s", rx_ipc_run_dir (ipc));
    cr_assert_eq (strncmp (dir, xdg, strlen (xdg)), 0, "%s not under %s", dir, xdg);
    cr_assert (strstr (dir, "/radix-test-"), "%s", dir);
    struct stat st;
    cr_assert_eq (stat (dir, &st), 0);
    cr_assert (S_ISDIR (st.st_mode));
    cr_assert_eq (st.st_mode & 07777, 0700, "mode %o", st.st_mode & 07777);
    cr_assert_eq (st.st_uid, getuid ());
    /* put sockets and a heartbeat page in it, then destroy: all gone */
    struct rx_err err = { 0 };
    cr_assert_not_null (rx_ipc_bind (ipc, RX_IPC_PULL, "a", &err), "%s", err.msg);
    cr_assert_not_null (rx_ipc_connect (ipc, RX_IPC_PUSH, "a", &err), "%s", err.msg);
    rx_heartbeat_t *hb = rx_heartbeat_create (ipc, "sched0", &err);
    cr_assert_not_null (hb, "%s", err.msg);
    char *sock = tu_path (dir, "a");
    cr_assert_eq (stat (sock, &st), 0, "socket file %s missing", sock);
    rx_heartbeat_close (&hb);
    cr_assert_null (hb);
    rx_ipc_destroy (&ipc);      /* sockets still open: closed by destroy */
    cr_assert_null (ipc);
    cr_assert_eq (stat (dir, &st), -1, "%s still exists", dir);
    cr_assert_eq (errno, ENOENT);
    free (sock);
    rx_ipc_destroy (&ipc);      /* NULL-safe */
    rx_ipc_destroy (NULL);

    /* an unusable XDG_RUNTIME_DIR falls back to /tmp */
    setenv ("XDG_RUNTIME_DIR", "/nonexistent/dir", 1);
    ipc = s_create ();
    cr_assert_eq (strncmp (rx_ipc_run_dir (ipc), "/tmp/radix-test-", 16), 0, "%s",
                  rx_ipc_run_dir (ipc));
    rx_ipc_destroy (&ipc);
    rmdir (xdg);
    free (xdg);
    unsetenv ("XDG_RUNTIME_DIR");

    /* bad prefix */
    cr_assert_null (rx_ipc_create ("a/b", &err));
    cr_assert_eq (err.code, RX_EINVAL);
    cr_assert (strstr (err.msg, "prefix"), "%s", err.msg);
}

Test (ipc, echo_10k_in_order_across_processes, .timeout = 60)
{
    struct s_pair p = s_start_echo ();
    struct rx_err err = { 0 };
    enum { N = 10000 };
    /* Send them all before reading any: unlimited HWMs mean nothing blocks
     * or is dropped while the echoes pile up in our PULL queue. */
    int32_t ids[3];
    struct rx_ipc_tok_out out = { .matched = -1, .n_ids = 3, .ids = ids };
    for (int i = 0; i < N; i++) {
        struct rx_ipc_msg m = { .type = RX_IPC_TOKENS };
        ids[0] = i, ids[1] = -i, ids[2] = i * 3;
        out.rid = (uint64_t) i * 1000003u;
        m.u.tokens.step = (uint64_t) i;
        m.u.tokens.n = 1;
        m.u.tokens.out = &out;
        /* 30 s: the first send waits for the echo child to connect, which
         * took over 10 s once in an ASan build on a loaded 2-core box. */
        cr_assert_eq (rx_ipc_send (p.down, &m, 30000, &err), RX_OK, "message %d: %s", i, err.msg);
    }
    for (int i = 0; i < N; i++) {
        struct rx_ipc_msg r;
        cr_assert_eq (rx_ipc_recv (p.up, &r, 30000, &err), RX_OK, "message %d: %s", i, err.msg);
        cr_assert_eq (r.type, RX_IPC_TOKENS);
        cr_assert_eq (r.u.tokens.step, (uint64_t) i, "message %d arrived as step %llu", i,
                      (unsigned long long) r.u.tokens.step);
        cr_assert_eq (r.u.tokens.n, 1);
        cr_assert_eq (r.u.tokens.out[0].rid, (uint64_t) i * 1000003u);
        cr_assert_eq (r.u.tokens.out[0].n_ids, 3);
        cr_assert_eq (r.u.tokens.out[0].ids[1], -i);
        cr_assert_eq (r.u.tokens.out[0].ids[2], i * 3);
        rx_ipc_msg_free (&r);
    }
    /* nothing extra */
    struct rx_ipc_msg r;
    cr_assert_eq (rx_ipc_recv (p.up, &r, 50, &err), RX_ETIMEDOUT);
    s_stop_echo (&p);
}

Test (ipc, every_type_crosses_processes, .timeout = 30)
{
    struct s_pair p = s_start_echo ();
    struct rx_err err = { 0 };
    static int32_t in[] = { 1, 2, 3 };
    static char s0[] = "\xe4\xb8\x96", s1[] = "END";
    struct rx_ipc_msg m = { .type = RX_IPC_REQ_NEW };
    m.u.req.rid = UINT64_MAX - 1;
    m.u.req.kind = RX_REQ_GENERATE;
    m.u.req.input_ids = in;
    m.u.req.n_input = 3;
    m.u.req.sp.temperature = 0.5f;
    m.u.req.sp.n_stop = 2;
    m.u.req.sp.stop[0] = s0;
    m.u.req.sp.stop[1] = s1;
    cr_assert_eq (rx_ipc_send (p.down, &m, 5000, &err), RX_OK, "%s", err.msg);
    struct rx_ipc_msg r;
    cr_assert_eq (rx_ipc_recv (p.up, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_REQ_NEW);
    cr_assert_eq (r.u.req.rid, UINT64_MAX - 1);
    cr_assert_eq (r.u.req.n_input, 3);
    cr_assert_eq (r.u.req.input_ids[2], 3);
    cr_assert_str_eq (r.u.req.sp.stop[0], s0);
    cr_assert_str_eq (r.u.req.sp.stop[1], "END");
    cr_assert_eq (r.u.req.sp.temperature, 0.5f);
    rx_ipc_msg_free (&r);

    struct rx_ipc_text_out to = { .rid = 5, .finish = RX_FINISH_STOP_STR, .matched = 1,
                                  .usage = { 3, 1, 2 }, .text = s0, .text_len = 3 };
    m = (struct rx_ipc_msg) { .type = RX_IPC_TEXT };
    m.u.text.n = 1;
    m.u.text.out = &to;
    cr_assert_eq (rx_ipc_send (p.down, &m, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_ipc_recv (p.up, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_TEXT);
    cr_assert_str_eq (r.u.text.out[0].text, s0);
    cr_assert_eq (r.u.text.out[0].finish, RX_FINISH_STOP_STR);
    cr_assert_eq (r.u.text.out[0].usage.cached_tokens, 1);
    rx_ipc_msg_free (&r);

    m = (struct rx_ipc_msg) { .type = RX_IPC_STATS };
    m.u.stats.queued = 77;
    m.u.stats.cache_hit_rate = 0.5f;
    cr_assert_eq (rx_ipc_send (p.down, &m, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_ipc_recv (p.up, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_STATS);
    cr_assert_eq (r.u.stats.queued, 77);
    cr_assert_eq (r.u.stats.cache_hit_rate, 0.5f);
    rx_ipc_msg_free (&r);
    s_stop_echo (&p);
}

/* A malformed message is refused by the receiver with one line, and the
 * channel keeps working. */
Test (ipc, malformed_message_refused_channel_survives, .timeout = 30)
{
    struct s_pair p = s_start_echo ();
    struct rx_err err = { 0 };
    static const uint8_t junk[] = { 'R', 'X', 'I', 'P', 9, 0, 1, 0, 0, 0, 0, 0 };
    cr_assert_eq (rx_ipc_send_raw (p.down, junk, sizeof junk, 5000, &err), RX_OK, "%s", err.msg);
    struct rx_ipc_msg r;
    cr_assert_eq (rx_ipc_recv (p.up, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_FLUSH_CACHE_REPLY);
    cr_assert_eq (r.u.flush_reply.status, RX_EFORMAT);
    cr_assert (strstr (r.u.flush_reply.message, "format version 9"), "%s", r.u.flush_reply.message);
    rx_ipc_msg_free (&r);
    cr_assert_eq (rx_ipc_send_raw (p.down, "", 0, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_ipc_recv (p.up, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert (strstr (r.u.flush_reply.message, "shorter than the 12-byte header"), "%s",
               r.u.flush_reply.message);
    rx_ipc_msg_free (&r);
    /* and a good one still goes through */
    struct rx_ipc_msg m = { .type = RX_IPC_GET_STATS };
    m.u.cookie = 99;
    cr_assert_eq (rx_ipc_send (p.down, &m, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_ipc_recv (p.up, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_GET_STATS);
    cr_assert_eq (r.u.cookie, 99);
    rx_ipc_msg_free (&r);
    s_stop_echo (&p);
}

Test (ipc, timeouts, .timeout = 30)
{
    rx_ipc_t *ipc = s_create ();
    struct rx_err err = { 0 };
    rx_ipc_sock_t *pull = rx_ipc_bind (ipc, RX_IPC_PULL, "quiet", &err);
    cr_assert_not_null (pull, "%s", err.msg);
    struct rx_ipc_msg m;
    int64_t t0 = s_ms ();
    cr_assert_eq (rx_ipc_recv (pull, &m, 300, &err), RX_ETIMEDOUT);
    int64_t dt = s_ms () - t0;
    cr_assert_geq (dt, 290, "returned after %lld ms", (long long) dt);
    cr_assert_lt (dt, 3000, "returned after %lld ms", (long long) dt);
    cr_assert (strstr (err.msg, "receive on ipc://"), "%s", err.msg);
    cr_assert (strstr (err.msg, "timed out"), "%s", err.msg);
    cr_assert_eq (m.type, 0);
    /* 0 = do not wait */
    t0 = s_ms ();
    cr_assert_eq (rx_ipc_recv (pull, &m, 0, &err), RX_ETIMEDOUT);
    cr_assert_lt (s_ms () - t0, 100);
    void *raw;
    size_t n;
    cr_assert_eq (rx_ipc_recv_raw (pull, &raw, &n, 50, &err), RX_ETIMEDOUT);
    cr_assert_null (raw);

    /* A PUSH with no live peer (ZMQ_IMMEDIATE): the send times out instead
     * of queueing for nobody. */
    rx_ipc_sock_t *push = rx_ipc_connect (ipc, RX_IPC_PUSH, "nobody", &err);
    cr_assert_not_null (push, "%s", err.msg);
    struct rx_ipc_msg s = { .type = RX_IPC_FLUSH_CACHE };
    t0 = s_ms ();
    cr_assert_eq (rx_ipc_send (push, &s, 200, &err), RX_ETIMEDOUT, "%s", err.msg);
    dt = s_ms () - t0;
    cr_assert_geq (dt, 190, "returned after %lld ms", (long long) dt);
    cr_assert (strstr (err.msg, "send on ipc://"), "%s", err.msg);
    /* wrong direction */
    cr_assert_eq (rx_ipc_send (pull, &s, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "PULL"), "%s", err.msg);
    cr_assert_eq (rx_ipc_recv (push, &m, 0, &err), RX_EINVAL);
    /* destroy with a pending-for-nobody socket returns promptly (linger) */
    t0 = s_ms ();
    rx_ipc_destroy (&ipc);
    cr_assert_lt (s_ms () - t0, 3000);
}

Test (ipc, poll_several, .timeout = 30)
{
    rx_ipc_t *ipc = s_create ();
    struct rx_err err = { 0 };
    rx_ipc_sock_t *a = rx_ipc_bind (ipc, RX_IPC_PULL, "a", &err);
    rx_ipc_sock_t *b = rx_ipc_bind (ipc, RX_IPC_PULL, "b", &err);
    rx_ipc_sock_t *to_b = rx_ipc_connect (ipc, RX_IPC_PUSH, "b", &err);
    cr_assert (a && b && to_b, "%s", err.msg);
    rx_ipc_sock_t *socks[2] = { a, b };
    unsigned char ready[2] = { 9, 9 };
    int64_t t0 = s_ms ();
    cr_assert_eq (rx_ipc_poll (socks, 2, ready, 150, &err), 0);
    cr_assert_geq (s_ms () - t0, 140);
    cr_assert_eq (ready[0], 0);
    cr_assert_eq (ready[1], 0);
    struct rx_ipc_msg m = { .type = RX_IPC_GET_STATS };
    cr_assert_eq (rx_ipc_send (to_b, &m, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_ipc_poll (socks, 2, ready, 5000, &err), 1);
    cr_assert_eq (ready[0], 0);
    cr_assert_eq (ready[1], 1);
    void *raw;
    size_t n;
    cr_assert_eq (rx_ipc_recv_raw (b, &raw, &n, 0, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n, RX_IPC_HEADER_LEN + 8);
    free (raw);
    cr_assert_eq (rx_ipc_poll (socks, 0, ready, 0, &err), RX_EINVAL);
    rx_ipc_close (&to_b);
    cr_assert_null (to_b);
    rx_ipc_destroy (&ipc);
}

Test (ipc, endpoints_and_errors)
{
    rx_ipc_t *ipc = s_create ();
    struct rx_err err = { 0 };
    char ep[512];
    cr_assert_eq (rx_ipc_endpoint (ipc, "sched", ep, sizeof ep, &err), RX_OK);
    char want[600];
    snprintf (want, sizeof want, "ipc://%s/sched", rx_ipc_run_dir (ipc));
    cr_assert_str_eq (ep, want);
    cr_assert_eq (rx_ipc_endpoint (ipc, "tcp://10.0.0.1:5555", ep, sizeof ep, &err), RX_OK);
    cr_assert_str_eq (ep, "tcp://10.0.0.1:5555");
    cr_assert_eq (rx_ipc_endpoint (ipc, "a/b", ep, sizeof ep, &err), RX_EINVAL);
    cr_assert_eq (rx_ipc_endpoint (ipc, "", ep, sizeof ep, &err), RX_EINVAL);
    cr_assert_eq (rx_ipc_endpoint (ipc, "sched", ep, 8, &err), RX_ERANGE);
    char longname[200];
    memset (longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cr_assert_eq (rx_ipc_endpoint (ipc, longname, ep, sizeof ep, &err), RX_ERANGE);
    cr_assert (strstr (err.msg, "longer than 107 bytes"), "%s", err.msg);
    cr_assert_null (rx_ipc_bind (ipc, RX_IPC_PULL, longname, &err));
    /* ZMQ's own error text comes through */
    cr_assert_null (rx_ipc_connect (ipc, RX_IPC_PUSH, "bogus://x", &err));
    cr_assert_eq (err.code, RX_EIO);
    cr_assert (strstr (err.msg, "bogus://x") && strstr (err.msg, "Protocol not supported"), "%s",
               err.msg);
    /* (ZMQ replaces an existing ipc:// socket file on bind, one reason the
     * run dir is private; a taken tcp port shows the error path.) */
    rx_ipc_sock_t *first = rx_ipc_bind (ipc, RX_IPC_PULL, "tcp://127.0.0.1:*", &err);
    cr_assert_not_null (first, "%s", err.msg);
    char taken[512];
    snprintf (taken, sizeof taken, "%s", rx_ipc_sock_endpoint (first));
    cr_assert_null (rx_ipc_bind (ipc, RX_IPC_PULL, taken, &err));
    cr_assert_eq (err.code, RX_EIO);
    cr_assert (strstr (err.msg, "bind tcp://127.0.0.1:") && strstr (err.msg, "Address already in use"),
               "%s", err.msg);
    cr_assert_null (rx_ipc_bind (ipc, 7, "k", &err));
    cr_assert_eq (err.code, RX_EINVAL);
    /* join needs an existing directory */
    cr_assert_null (rx_ipc_join ("/nonexistent/radix", &err));
    cr_assert_eq (err.code, RX_ENOENT);
    cr_assert (strstr (err.msg, "/nonexistent/radix"), "%s", err.msg);
    rx_ipc_destroy (&ipc);
}

/* tcp:// works the same (multi-node control plane), with port 0 resolved. */
Test (ipc, tcp_loopback, .timeout = 30)
{
    rx_ipc_t *ipc = s_create ();
    struct rx_err err = { 0 };
    rx_ipc_sock_t *pull = rx_ipc_bind (ipc, RX_IPC_PULL, "tcp://127.0.0.1:*", &err);
    cr_assert_not_null (pull, "%s", err.msg);
    const char *ep = rx_ipc_sock_endpoint (pull);
    cr_assert_eq (strncmp (ep, "tcp://127.0.0.1:", 16), 0, "%s", ep);
    cr_assert_neq (strcmp (ep + 16, "*"), 0, "%s", ep);
    rx_ipc_sock_t *push = rx_ipc_connect (ipc, RX_IPC_PUSH, ep, &err);
    cr_assert_not_null (push, "%s", err.msg);
    uint64_t rids[2] = { 11, 22 };
    struct rx_ipc_msg m = { .type = RX_IPC_REQ_ABORT };
    m.u.abort.n = 2;
    m.u.abort.rids = rids;
    cr_assert_eq (rx_ipc_send (push, &m, 5000, &err), RX_OK, "%s", err.msg);
    struct rx_ipc_msg r;
    cr_assert_eq (rx_ipc_recv (pull, &r, 5000, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.type, RX_IPC_REQ_ABORT);
    cr_assert_eq (r.u.abort.n, 2);
    cr_assert_eq (r.u.abort.rids[1], 22);
    rx_ipc_msg_free (&r);
    rx_ipc_destroy (&ipc);
}

/* The heartbeat page: a child (the "scheduler") writes, the parent (the
 * "main process") reads with no IPC round trip. */
Test (ipc, heartbeat_across_processes, .timeout = 30)
{
    rx_ipc_t *ipc = s_create ();
    struct rx_err err = { 0 };
    /* not there yet */
    cr_assert_null (rx_heartbeat_open (ipc, "sched0", &err));
    cr_assert_eq (err.code, RX_ENOENT);
    int go[2], done[2];
    cr_assert_eq (pipe (go), 0);
    cr_assert_eq (pipe (done), 0);
    const char *dir = rx_ipc_run_dir (ipc);
    pid_t pid = fork ();
    cr_assert_geq (pid, 0);
    if (pid == 0) {
        struct rx_err e = { 0 };
        rx_ipc_t *mine = rx_ipc_join (dir, &e);
        if (!mine) _exit (10);
        rx_heartbeat_t *hb = rx_heartbeat_create (mine, "sched0", &e);
        if (!hb) _exit (11);
        for (int i = 0; i < 100; i++) rx_heartbeat_beat (hb);
        rx_heartbeat_set_state (hb, RX_HB_BUSY);
        char c = 1;
        if (write (done[1], &c, 1) != 1) _exit (12);
        if (read (go[0], &c, 1) != 1) _exit (13);     /* parent read round 1 */
        for (int i = 0; i < 50; i++) rx_heartbeat_beat (hb);
        rx_heartbeat_set_state (hb, RX_HB_IDLE);
        if (write (done[1], &c, 1) != 1) _exit (14);
        if (read (go[0], &c, 1) != 1) _exit (15);
        rx_heartbeat_close (&hb);
        rx_ipc_destroy (&mine);
        _exit (0);
    }
    char c;
    cr_assert_eq (read (done[0], &c, 1), 1);
    rx_heartbeat_t *hb = rx_heartbeat_open (ipc, "sched0", &err);
    cr_assert_not_null (hb, "%s", err.msg);
    struct rx_heartbeat_info info;
    rx_heartbeat_read (hb, &info);
    cr_assert_eq (info.beat, 100);
    cr_assert_eq (info.pid, (uint32_t) pid);
    cr_assert_eq (info.state, RX_HB_BUSY);
    cr_assert_neq (info.last_ns, 0);
    cr_assert_lt (info.age_ns, 10ull * 1000000000ull, "age %llu ns", (unsigned long long) info.age_ns);
    uint64_t first_ns = info.last_ns;
    /* the reader cannot bump (read-only mapping; the call is a no-op) */
    rx_heartbeat_beat (hb);
    rx_heartbeat_read (hb, &info);
    cr_assert_eq (info.beat, 100);
    usleep (20000);
    rx_heartbeat_read (hb, &info);
    cr_assert_geq (info.age_ns, 20000000ull, "age grows while nobody beats");
    cr_assert_eq (write (go[1], "x", 1), 1);
    cr_assert_eq (read (done[0], &c, 1), 1);
    rx_heartbeat_read (hb, &info);
    cr_assert_eq (info.beat, 150);
    cr_assert_eq (info.state, RX_HB_IDLE);
    cr_assert_gt (info.last_ns, first_ns);
    cr_assert_eq (write (go[1], "x", 1), 1);
    cr_assert_eq (s_wait_child (pid), 0);
    /* the page outlives its writer: main still sees the last beat */
    rx_heartbeat_read (hb, &info);
    cr_assert_eq (info.beat, 150);
    rx_heartbeat_close (&hb);

    /* a file that is not a heartbeat page */
    char *junk = tu_path (dir, "junk.hb");
    tu_write (junk, "hello");
    cr_assert_null (rx_heartbeat_open (ipc, "junk", &err));
    cr_assert_eq (err.code, RX_EFORMAT);
    cr_assert (strstr (err.msg, "junk.hb") && strstr (err.msg, "not a heartbeat page"), "%s",
               err.msg);
    free (junk);
    cr_assert_null (rx_heartbeat_create (ipc, "../x", &err));
    cr_assert_eq (err.code, RX_EINVAL);
    rx_ipc_destroy (&ipc);
}
