/* tests/cli/test_router_cli.c -- radix-router as a user runs it: a real
 * process, its exit status and what it prints; then a live router in front
 * of a worker served by this test process (a libevent thread), driven over
 * real sockets: proxying, SSE passthrough chunk by chunk, retries, the
 * admin endpoints, errors.  The policy is the test fixture
 * route-fixture_ll.so (tests/router-fixtures: least loaded, lowest id
 * first), so where a request goes is known.  (The Python tests in
 * tests/router/ cover faults and load with the fake worker and real radixd
 * workers.) */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "../testutil.h"

static char *s_dir;

static char *s_router_bin (void) { return tu_path (tu_env ("RX_TOP_BUILDDIR"), "router/radix-router"); }
/* route-fixture_ll.so lives apart from the loader's fixtures. */
static char *s_fixture_dir (void) { return tu_path (tu_env ("RX_TOP_BUILDDIR"), "tests/router-fixtures/.libs"); }

static void s_setup (void) { s_dir = tu_tmpdir (); }
static void s_teardown (void)
{
    char cmd[512];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system (cmd) != 0) {}
    free (s_dir);
}

static struct tu_run s_router (const char *ini_body, const char *a1, const char *a2)
{
    char *ini = tu_path (s_dir, "r.ini");
    char text[4096];
    char *fx = s_fixture_dir ();
    snprintf (text, sizeof text, "[plugins]\npath = %s:%s\n%s", fx, tu_env ("RX_PLUGIN_BUILD_DIR"), ini_body);
    free (fx);
    tu_write (ini, text);
    char *bin = s_router_bin ();
    char *argv[] = { bin, "-c", ini, (char *) a1, (char *) a2, NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    free (ini);
    free (bin);
    return r;
}

#define EXPECT_ONE_LINE_FAILURE(r, ...)                                             \
    do {                                                                            \
        cr_assert_eq ((r).status, 1, "exit %d, stderr: %s", (r).status, (r).err);  \
        cr_assert_eq (tu_lines ((r).err), 1, "want one line, got:\n%s", (r).err);  \
        const char *want_[] = { __VA_ARGS__ };                                      \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)              \
            cr_assert (strstr ((r).err, want_[i_]), "stderr \"%s\" lacks \"%s\"", (r).err, want_[i_]); \
    } while (0)

TestSuite (router_cli, .init = s_setup, .fini = s_teardown);

Test (router_cli, version_help_usage)
{
    char *bin = s_router_bin ();
    char *a1[] = { bin, "-V", NULL };
    struct tu_run r = tu_run_env (a1, NULL);
    cr_assert_eq (r.status, 0);
    cr_assert (strstr (r.out, "radix-router") && strstr (r.out, "plugin ABI 1."), "%s", r.out);
    tu_run_free (&r);
    char *a2[] = { bin, "--help-config", NULL };
    r = tu_run_env (a2, NULL);
    cr_assert_eq (r.status, 0);
    const char *want[] = { "[server]", "[router]", "[log]", "[plugins]", "max_queued_requests", "breaker_timeout",
                           "health_check_endpoint", "request_timeout", "31000" };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) cr_assert (strstr (r.out, want[i]), "lacks %s", want[i]);
    cr_assert_null (strstr (r.out, "[scheduler]"), "radixd's sections are not the router's");
    tu_run_free (&r);
    char *a3[] = { bin, "--bogus", NULL };
    r = tu_run_env (a3, NULL);
    cr_assert_eq (r.status, 2);
    tu_run_free (&r);
    char *a4[] = { bin, "--check-config", NULL };
    r = tu_run_env (a4, NULL);
    cr_assert_eq (r.status, 2);
    cr_assert (strstr (r.err, "needs -c FILE"), "%s", r.err);
    tu_run_free (&r);
    char *a5[] = { bin, NULL };
    r = tu_run_env (a5, NULL);
    cr_assert_eq (r.status, 2);
    tu_run_free (&r);
    free (bin);
}

Test (router_cli, check_config)
{
    struct tu_run r = s_router ("[router]\npolicy = fixture_ll\nworkers = http://127.0.0.1:30001, http://h:2/\n"
                                "[router.fixture_ll]\ntag = x\n", "--check-config", NULL);
    cr_assert_eq (r.status, 0, "%s", r.err);
    cr_assert (strstr (r.out, "configuration OK"), "%s", r.out);
    tu_run_free (&r);
}

Test (router_cli, bad_configs_give_one_line)
{
    struct tu_run r = s_router ("[router]\npolicy = fixture_ll\nmax_attempts = 99\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "r.ini:5", "max_attempts");
    tu_run_free (&r);
    r = s_router ("[router]\npolicy = fixture_ll\nworkers = http://ok:1, https://bad:2\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "r.ini:5", "workers", "https is not supported");
    tu_run_free (&r);
    r = s_router ("[router]\npolicy = fixture_ll\nworkers = http://a:1,http://a:1/\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "r.ini:5", "listed twice");
    tu_run_free (&r);
    r = s_router ("[router]\npolicy = no_such_policy\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "r.ini:4", "no_such_policy");
    tu_run_free (&r);
    r = s_router ("[router]\npolicy = fixture_ll\n[router.fixture_ll]\nnot_a_key = 1\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "r.ini:6", "not_a_key");
    tu_run_free (&r);
    r = s_router ("[server]\nport = -1\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "r.ini:4", "port");
    tu_run_free (&r);
    /* create failing at start-up: one line, exit 1, no "ready" */
    r = s_router ("[server]\nport = 0\n[router]\npolicy = fixture_ll\n[router.fixture_ll]\ntag = fail\n", NULL, NULL);
    EXPECT_ONE_LINE_FAILURE (r, "fixture_ll", "tag = fail");
    tu_run_free (&r);
}

/* The reference file validates against the real policies (when built). */
Test (router_cli, reference_ini_is_valid)
{
    char *so = tu_path (tu_env ("RX_PLUGIN_BUILD_DIR"), "route-cache_aware.so");
    int have = access (so, R_OK) == 0;
    free (so);
    if (!have) cr_skip_test ("route-cache_aware.so is not built");
    char *ini = tu_path (tu_env ("RX_TOP_SRCDIR"), "conf/router.ini");
    char *bin = s_router_bin ();
    char env[1024];
    snprintf (env, sizeof env, "RADIX_PLUGIN_PATH=%s", tu_env ("RX_PLUGIN_BUILD_DIR"));
    char *argv[] = { bin, "-c", ini, "--check-config", NULL };
    char *envv[] = { env, NULL };
    struct tu_run r = tu_run_env (argv, envv);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    free (ini);
    free (bin);
}

/* ------------------------------------------------------------ a live router */

/* The worker: /health 200 (or 503 when s_w_sick), POST /generate echoes the
 * body's length, "503" in the body answers 503, "stream" streams three SSE
 * events 300 ms apart. */
struct s_worker {
    struct event_base *base;
    struct evhttp *http;
    int port;
    pthread_t th;
    volatile int posts, sick;
    struct event *tick;
};

struct s_stream {
    struct evhttp_request *req;
    struct event *ev;
    int i;
};

static void s_stream_step (evutil_socket_t fd, short what, void *arg)
{
    struct s_stream *st = arg;
    struct evbuffer *b = evbuffer_new ();
    if (st->i < 3) {
        evbuffer_add_printf (b, "data: {\"i\": %d}\n\n", st->i);
        evhttp_send_reply_chunk (st->req, b);
        st->i++;
        struct timeval tv = { 0, 300000 };
        evtimer_add (st->ev, &tv);
    } else {
        evbuffer_add_printf (b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk (st->req, b);
        evhttp_send_reply_end (st->req);
        event_free (st->ev);
        free (st);
    }
    evbuffer_free (b);
}

static void s_worker_cb (struct evhttp_request *req, void *arg)
{
    struct s_worker *w = arg;
    const char *path = evhttp_uri_get_path (evhttp_request_get_evhttp_uri (req));
    struct evbuffer *out = evbuffer_new ();
    struct evkeyvalq *oh = evhttp_request_get_output_headers (req);
    evhttp_add_header (oh, "Content-Type", "application/json");
    if (!strcmp (path, "/health")) {
        evbuffer_add_printf (out, "{}");
        evhttp_send_reply (req, w->sick ? 503 : 200, "X", out);
    } else if (!strcmp (path, "/v1/models")) {
        evbuffer_add_printf (out, "{\"data\":[{\"id\":\"m%d\"}]}", w->port);
        evhttp_send_reply (req, 200, "OK", out);
    } else {
        w->posts++;
        struct evbuffer *in = evhttp_request_get_input_buffer (req);
        size_t n = evbuffer_get_length (in);
        char *body = (char *) evbuffer_pullup (in, -1);
        if (body && memmem (body, n, "503", 3)) {
            evbuffer_add_printf (out, "{\"error\":{\"message\":\"busy %d\"}}", w->port);
            evhttp_send_reply (req, 503, "Busy", out);
        } else if (body && memmem (body, n, "stream", 6)) {
            evhttp_remove_header (oh, "Content-Type");
            evhttp_add_header (oh, "Content-Type", "text/event-stream");
            evhttp_send_reply_start (req, 200, "OK");
            struct s_stream *st = calloc (1, sizeof *st);
            st->req = req;
            st->ev = evtimer_new (w->base, s_stream_step, st);
            s_stream_step (-1, 0, st);
        } else {
            const char *auth = evhttp_find_header (evhttp_request_get_input_headers (req), "Authorization");
            evbuffer_add_printf (out, "{\"port\":%d,\"len\":%zu,\"auth\":\"%s\"}", w->port, n, auth ? auth : "");
            evhttp_send_reply (req, 200, "OK", out);
        }
    }
    evbuffer_free (out);
}

/* Wakes the loop now and then: event_base_loopbreak from the test thread
 * is only seen when the loop wakes (libevent is built without threads
 * here). */
static void s_worker_tick (evutil_socket_t fd, short what, void *arg) {}

static void *s_worker_main (void *arg)
{
    struct s_worker *w = arg;
    event_base_dispatch (w->base);
    return NULL;
}

static void s_worker_start (struct s_worker *w)
{
    /* The router may drop a connection (a health check that timed out on a
     * loaded box) while the fake worker writes its answer: EPIPE, not a
     * SIGPIPE that kills the test. */
    signal (SIGPIPE, SIG_IGN);
    memset (w, 0, sizeof *w);
    w->base = event_base_new ();
    w->http = evhttp_new (w->base);
    evhttp_set_gencb (w->http, s_worker_cb, w);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle (w->http, "127.0.0.1", 0);
    cr_assert_not_null (bs);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname (evhttp_bound_socket_get_fd (bs), (struct sockaddr *) &sa, &sl);
    w->port = ntohs (sa.sin_port);
    struct event *tick = event_new (w->base, -1, EV_PERSIST, s_worker_tick, NULL);
    struct timeval tv = { 0, 20000 };
    event_add (tick, &tv);
    w->tick = tick;
    pthread_create (&w->th, NULL, s_worker_main, w);
}

static void s_worker_stop (struct s_worker *w)
{
    event_base_loopbreak (w->base);
    pthread_join (w->th, NULL);
    event_free (w->tick);
    evhttp_free (w->http);
    event_base_free (w->base);
}

/* The router process, its stderr in a file. */
struct s_live {
    pid_t pid;
    int port;
    char *log;
};

static void s_live_start (struct s_live *L, const char *ini_body)
{
    char *ini = tu_path (s_dir, "live.ini");
    char text[4096];
    char *fx = s_fixture_dir ();
    snprintf (text, sizeof text, "[plugins]\npath = %s\n[server]\nport = 0\n%s", fx, ini_body);
    free (fx);
    tu_write (ini, text);
    L->log = tu_path (s_dir, "live.log");
    char *bin = s_router_bin ();
    pid_t pid = fork ();
    if (pid == 0) {
        /* Dies with the test, and keeps off its stdout: an orphaned router
         * holding the TAP pipe open would hang `make check`. */
        prctl (PR_SET_PDEATHSIG, SIGKILL);
        int fd = open (L->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2 (fd, 1);
        dup2 (fd, 2);
        execl (bin, bin, "-c", ini, (char *) NULL);
        _exit (127);
    }
    L->pid = pid;
    L->port = 0;
    for (int i = 0; i < 500 && !L->port; i++) {
        usleep (10000);
        size_t len;
        char *t = tu_read_file (L->log, &len);
        const char *at = t ? strstr (t, "ready on http://127.0.0.1:") : NULL;
        if (at) L->port = atoi (at + strlen ("ready on http://127.0.0.1:"));
        free (t);
    }
    free (bin);
    free (ini);
    cr_assert_gt (L->port, 0, "the router did not get ready");
}

static void s_live_stop (struct s_live *L)
{
    kill (L->pid, SIGTERM);
    int st;
    waitpid (L->pid, &st, 0);
    cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "the router exited with status %d", st);
    free (L->log);
}

struct s_resp {
    int status;
    char *head, *body;
    double t_first, t_end;   /* seconds after the request was sent: first body byte, end */
};

static double s_mono (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One request on a fresh connection ("Connection: close"); reads to EOF. */
static struct s_resp s_http (int port, const char *method, const char *path, const char *body, const char *extra_hdr)
{
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons (port) };
    sa.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
    cr_assert_eq (connect (fd, (struct sockaddr *) &sa, sizeof sa), 0);
    char *req = NULL;
    size_t bl = body ? strlen (body) : 0;
    int n = asprintf (&req, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n%s\r\n%s", method,
                      path, bl, extra_hdr ? extra_hdr : "", body ? body : "");
    cr_assert_gt (n, 0);
    double t0 = s_mono ();
    cr_assert_eq (write (fd, req, (size_t) n), n);
    free (req);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc (cap);
    struct s_resp r = { 0 };
    char *hend = NULL;
    for (;;) {
        struct pollfd pfd = { fd, POLLIN, 0 };
        cr_assert_gt (poll (&pfd, 1, 10000), 0, "no answer within 10 s");
        if (len + 4096 > cap) buf = realloc (buf, cap *= 2);
        ssize_t k = read (fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t) k;
        buf[len] = '\0';
        if (!hend && (hend = strstr (buf, "\r\n\r\n")) && len > (size_t) (hend + 4 - buf) && !r.t_first)
            r.t_first = s_mono () - t0;
        else if (hend && !r.t_first && len > (size_t) (hend + 4 - buf))
            r.t_first = s_mono () - t0;
    }
    r.t_end = s_mono () - t0;
    close (fd);
    buf[len] = '\0';
    cr_assert_not_null (hend = strstr (buf, "\r\n\r\n"), "no header end in: %s", buf);
    *hend = '\0';
    r.head = buf;
    r.body = hend + 4;
    r.status = atoi (buf + 9);
    return r;
}

static void s_resp_free (struct s_resp *r) { free (r->head); }

Test (router_cli, live_proxy)
{
    struct s_worker w1, w2;
    s_worker_start (&w1);
    s_worker_start (&w2);
    char ini[1024];
    snprintf (ini, sizeof ini,
              "[router]\npolicy = fixture_ll\nworkers = http://127.0.0.1:%d, http://127.0.0.1:%d\n"
              "health_check_interval = 200ms\nhealth_check_timeout = 1s\nretry_backoff = 1ms\n"
              "failure_threshold = 1\nsuccess_threshold = 1\n",
              w1.port, w2.port);
    struct s_live L;
    s_live_start (&L, ini);

    /* Plain answers go to the least loaded, lowest id: w1. */
    struct s_resp r = s_http (L.port, "POST", "/generate", "{\"text\":\"hello\"}", "Authorization: Bearer k1\r\n");
    cr_assert_eq (r.status, 200, "%s\n%s", r.head, r.body);
    char want[128];
    snprintf (want, sizeof want, "{\"port\":%d,\"len\":16,\"auth\":\"Bearer k1\"}", w1.port);
    cr_assert_str_eq (r.body, want);
    cr_assert (strstr (r.head, "Content-Length: "), "a plain answer keeps its length: %s", r.head);
    s_resp_free (&r);

    /* Bad JSON: 400 and no worker saw it. */
    int posts = w1.posts + w2.posts;
    r = s_http (L.port, "POST", "/v1/chat/completions", "{\"messages\": [", NULL);
    cr_assert_eq (r.status, 400);
    cr_assert (strstr (r.body, "\"code\":\"invalid_json\"") && strstr (r.body, "\"type\":\"invalid_request_error\""),
               "%s", r.body);
    cr_assert_eq (w1.posts + w2.posts, posts, "a bad body reached a worker");
    s_resp_free (&r);

    /* A 503 from w1 is retried on w2; the client sees w2's answer... */
    r = s_http (L.port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"user\":\"503\"}", NULL);
    cr_assert_eq (r.status, 503, "both answer 503 here: the last worker error is forwarded");
    cr_assert (strstr (r.body, "busy"), "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "GET", "/metrics", NULL, NULL);
    cr_assert (strstr (r.body, "radix_router_retries_total 1\n"), "%s", r.body);
    s_resp_free (&r);

    /* SSE passes through chunk by chunk: the first event arrives long
     * before the stream (3 x 300 ms) ends. */
    r = s_http (L.port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"stream\":true}", NULL);
    cr_assert_eq (r.status, 200);
    cr_assert (strstr (r.head, "text/event-stream"), "%s", r.head);
    cr_assert (strstr (r.body, "data: {\"i\": 0}") && strstr (r.body, "data: {\"i\": 2}") && strstr (r.body, "[DONE]"),
               "%s", r.body);
    cr_assert_lt (r.t_first, 0.25, "first event after %.3f s: buffered?", r.t_first);
    cr_assert_gt (r.t_end, 0.55, "the stream ended after %.3f s", r.t_end);
    s_resp_free (&r);

    /* GET /v1/models: the first eligible worker. */
    r = s_http (L.port, "GET", "/v1/models", NULL, NULL);
    cr_assert_eq (r.status, 200);
    snprintf (want, sizeof want, "m%d", w1.port);
    cr_assert (strstr (r.body, want), "%s", r.body);
    s_resp_free (&r);

    /* Errors of our own. */
    r = s_http (L.port, "GET", "/nope", NULL, NULL);
    cr_assert_eq (r.status, 404);
    s_resp_free (&r);
    r = s_http (L.port, "GET", "/generate", NULL, NULL);
    cr_assert_eq (r.status, 405);
    cr_assert (strstr (r.head, "Allow: POST"), "%s", r.head);
    s_resp_free (&r);

    /* Admin: list, add (409 twice), remove (404 twice), bad URL 400. */
    r = s_http (L.port, "GET", "/workers", NULL, NULL);
    cr_assert_eq (r.status, 200);
    cr_assert (strstr (r.body, "\"breaker\":\"closed\"") && strstr (r.body, "\"healthy\":true"), "%s", r.body);
    s_resp_free (&r);
    char body[256], path[256];
    snprintf (body, sizeof body, "{\"url\": \"http://127.0.0.1:%d/\"}", w2.port);
    r = s_http (L.port, "POST", "/workers", body, NULL);
    cr_assert_eq (r.status, 409, "%s", r.body);
    s_resp_free (&r);
    snprintf (path, sizeof path, "/workers/http%%3A%%2F%%2F127.0.0.1%%3A%d", w1.port);
    r = s_http (L.port, "DELETE", path, NULL, NULL);
    cr_assert_eq (r.status, 200, "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "DELETE", path, NULL, NULL);
    cr_assert_eq (r.status, 404, "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "POST", "/generate", "{\"text\":\"after\"}", NULL);
    snprintf (want, sizeof want, "\"port\":%d", w2.port);
    cr_assert (r.status == 200 && strstr (r.body, want), "w1 is gone: %s", r.body);
    s_resp_free (&r);
    snprintf (path, sizeof path, "/add_worker?url=http://127.0.0.1:%d", w1.port);
    r = s_http (L.port, "POST", path, NULL, NULL);
    cr_assert_eq (r.status, 200, "%s", r.body);
    cr_assert (strstr (r.body, "Successfully added worker"), "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "POST", "/workers", "{\"url\": \"http://x:1/path\"}", NULL);
    cr_assert_eq (r.status, 400, "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "GET", "/list_workers", NULL, NULL);
    cr_assert (strstr (r.body, "\"urls\":["), "%s", r.body);
    s_resp_free (&r);

    /* Both workers sick: /health 503 once the checks noticed, and requests 503. */
    w1.sick = w2.sick = 1;
    usleep (700000);
    r = s_http (L.port, "GET", "/health", NULL, NULL);
    cr_assert_eq (r.status, 503, "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "POST", "/generate", "{\"text\":\"x\"}", NULL);
    cr_assert_eq (r.status, 503, "%s", r.body);
    cr_assert (strstr (r.body, "no_healthy_worker"), "%s", r.body);
    s_resp_free (&r);
    w1.sick = w2.sick = 0;
    usleep (700000);
    r = s_http (L.port, "GET", "/health", NULL, NULL);
    cr_assert_eq (r.status, 200, "%s", r.body);
    s_resp_free (&r);

    s_live_stop (&L);
    s_worker_stop (&w1);
    s_worker_stop (&w2);
}

Test (router_cli, live_limits_and_key)
{
    struct s_worker w1;
    s_worker_start (&w1);
    char ini[1024];
    snprintf (ini, sizeof ini,
              "api_key = sekrit\nmax_body_size = 2K\n[router]\npolicy = fixture_ll\nworkers = http://127.0.0.1:%d\n",
              w1.port);
    struct s_live L;
    s_live_start (&L, ini);
    struct s_resp r = s_http (L.port, "POST", "/generate", "{\"text\":\"x\"}", NULL);
    cr_assert_eq (r.status, 401, "%s", r.body);
    cr_assert (strstr (r.body, "invalid_api_key"), "%s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "GET", "/health", NULL, NULL);
    cr_assert_eq (r.status, 200, "/health needs no key: %s", r.body);
    s_resp_free (&r);
    r = s_http (L.port, "POST", "/generate", "{\"text\":\"x\"}", "Authorization: Bearer sekrit\r\n");
    cr_assert_eq (r.status, 200, "%s", r.body);
    s_resp_free (&r);
    char big[3000];
    memset (big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char *body = NULL;
    if (asprintf (&body, "{\"text\":\"%s\"}", big) < 0) abort ();
    int posts = w1.posts;
    r = s_http (L.port, "POST", "/generate", body, "Authorization: Bearer sekrit\r\n");
    cr_assert_eq (r.status, 413, "%s", r.body);
    cr_assert_eq (w1.posts, posts);
    s_resp_free (&r);
    free (body);
    s_live_stop (&L);
    s_worker_stop (&w1);
}
