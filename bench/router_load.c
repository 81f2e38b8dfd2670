/* bench/router_load.c -- a closed-loop HTTP load generator for the router
 * overhead benchmark (bench/router-overhead.sh).
 *
 * N connections (keep-alive by default), each sending its next request as
 * soon as the previous answer is complete, spread round-robin over one or
 * more target URLs, for a warm-up and then a timed window.  One thread and
 * epoll, so that at concurrency 64 on a 2-core box the generator itself is
 * not the bottleneck (its ceiling is measured by pointing it straight at
 * the fake workers: the "direct" row of the benchmark).
 *
 * usage: router-load --url http://H:P[,http://H:P...] [--path /v1/completions]
 *            [--body JSON] [--concurrency 64] [--duration 5] [--warmup 1]
 *            [--close] [--timeout 10]
 *
 * Prints one JSON object on stdout: requests (completed with status 200
 * in the window), errors (connect/read failures, timeouts, other
 * statuses), rps, and latency percentiles in microseconds of the
 * requests that started and finished inside the window.
 *
 * Responses are parsed just enough: status line, Content-Length or
 * chunked transfer encoding, Connection: close. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct s_target {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *req;                  /* the whole request, bytes */
    size_t req_len;
};

enum s_state { S_IDLE, S_CONNECTING, S_SENDING, S_READING };

struct s_conn {
    int fd;
    int target;
    enum s_state state;
    size_t sent;
    char *buf;
    size_t len, cap;
    uint64_t t_start;           /* ns, when the request was started */
    uint64_t deadline;
};

struct s_lat {
    uint32_t *v;
    size_t n, cap;
};

static void s_die (const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    fputs ("router-load: ", stderr);
    vfprintf (stderr, fmt, ap);
    fputc ('\n', stderr);
    va_end (ap);
    exit (2);
}

static uint64_t s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static void s_lat_add (struct s_lat *l, uint32_t us)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 65536;
        l->v = realloc (l->v, l->cap * sizeof *l->v);
        if (!l->v) s_die ("out of memory");
    }
    l->v[l->n++] = us;
}

static int s_cmp_u32 (const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v. */
static uint32_t s_pct (const struct s_lat *l, double p)
{
    if (!l->n) return 0;
    size_t k = (size_t) ceil (p / 100.0 * (double) l->n);
    if (k < 1) k = 1;
    if (k > l->n) k = l->n;
    return l->v[k - 1];
}

static void s_parse_url (const char *url, const char *path, const char *body, struct s_target *t)
{
    if (strncmp (url, "http://", 7)) s_die ("--url %s: want http://HOST:PORT", url);
    const char *h = url + 7;
    const char *colon = strrchr (h, ':');
    if (!colon) s_die ("--url %s: no port", url);
    char host[256], port[16];
    size_t hl = (size_t) (colon - h);
    if (hl == 0 || hl >= sizeof host) s_die ("--url %s: bad host", url);
    memcpy (host, h, hl);
    host[hl] = '\0';
    size_t pl = strcspn (colon + 1, "/");
    if (pl == 0 || pl >= sizeof port) s_die ("--url %s: bad port", url);
    memcpy (port, colon + 1, pl);
    port[pl] = '\0';
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai;
    int rc = getaddrinfo (host, port, &hints, &ai);
    if (rc) s_die ("--url %s: %s", url, gai_strerror (rc));
    memcpy (&t->addr, ai->ai_addr, ai->ai_addrlen);
    t->addrlen = ai->ai_addrlen;
    freeaddrinfo (ai);
    size_t bl = strlen (body);
    size_t cap = strlen (path) + strlen (host) + strlen (port) + bl + 256;
    t->req = malloc (cap);
    if (!t->req) s_die ("out of memory");
    int n = snprintf (t->req, cap,
                      "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                      "Accept: */*\r\nContent-Length: %zu\r\n\r\n%s",
                      path, host, port, bl, body);
    t->req_len = (size_t) n;
}

/* ---------------------------------------------------------------- HTTP */

/* Is a complete response in c->buf?  Returns 1 (complete: *status, *close
 * set), 0 (need more), -1 (malformed). */
static int s_response_done (const struct s_conn *c, int *status, int *close_after)
{
    const char *b = c->buf;
    const char *end = memmem (b, c->len, "\r\n\r\n", 4);
    if (!end) return c->len > 65536 ? -1 : 0;
    size_t head = (size_t) (end - b) + 4;
    if (c->len < 12 || strncmp (b, "HTTP/1.", 7)) return -1;
    *status = atoi (b + 9);
    *close_after = strncmp (b, "HTTP/1.0", 8) == 0;
    long clen = -1;
    int chunked = 0;
    const char *line = memchr (b, '\n', head);
    while (line && line + 1 < b + head) {
        line++;
        const char *eol = memchr (line, '\n', (size_t) (b + head - line));
        if (!eol) break;
        size_t ll = (size_t) (eol - line);
        if (ll > 15 && !strncasecmp (line, "Content-Length:", 15)) clen = atol (line + 15);
        else if (ll > 18 && !strncasecmp (line, "Transfer-Encoding:", 18) &&
                 memmem (line, ll, "chunked", 7)) chunked = 1;
        else if (ll > 11 && !strncasecmp (line, "Connection:", 11)) {
            if (memmem (line, ll, "close", 5)) *close_after = 1;
            else if (memmem (line, ll, "keep-alive", 10)) *close_after = 0;
        }
        line = eol;
    }
    if (chunked) {
        size_t p = head;
        for (;;) {
            const char *nl = memmem (b + p, c->len - p, "\r\n", 2);
            if (!nl) return 0;
            char *ep;
            unsigned long n = strtoul (b + p, &ep, 16);
            if (ep == b + p) return -1;
            p = (size_t) (nl - b) + 2;
            if (n == 0) {
                /* trailers (none expected), then the final CRLF */
                const char *fin = memmem (b + p - 2, c->len - (p - 2), "\r\n\r\n", 4);
                return fin ? 1 : 0;
            }
            if (c->len < p + n + 2) return 0;
            p += n + 2;
        }
    }
    if (clen >= 0) return c->len >= head + (size_t) clen ? 1 : 0;
    if (*status == 204 || *status == 304) return 1;
    return 0;                   /* body until close: finished by EOF */
}

/* ---------------------------------------------------------------- loop */

struct s_run {
    int ep;
    struct s_target *t;
    int nt;
    struct s_conn *c;
    int n;
    int keepalive;
    uint64_t timeout_ns;
    uint64_t win_start, win_end;
    int stopping;
    struct s_lat lat;
    unsigned long ok, errors, non200, connects;
    char last_err[160];
};

static void s_err (struct s_run *r, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (r->last_err, sizeof r->last_err, fmt, ap);
    va_end (ap);
}

static void s_close (struct s_run *r, struct s_conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl (r->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close (c->fd);
    }
    c->fd = -1;
    c->state = S_IDLE;
}

static void s_watch (struct s_run *r, struct s_conn *c, uint32_t ev, int add)
{
    struct epoll_event e = { .events = ev, .data.ptr = c };
    if (epoll_ctl (r->ep, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &e) < 0)
        s_die ("epoll_ctl: %s", strerror (errno));
}

static void s_send (struct s_run *r, struct s_conn *c);

/* Begin the next request on c (connecting first when needed). */
static void s_start (struct s_run *r, struct s_conn *c)
{
    c->t_start = s_now ();
    c->deadline = c->t_start + r->timeout_ns;
    c->len = 0;
    c->sent = 0;
    if (c->fd < 0) {
        const struct s_target *t = &r->t[c->target];
        c->fd = socket (t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->fd < 0) s_die ("socket: %s", strerror (errno));
        int one = 1;
        setsockopt (c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        r->connects++;
        if (connect (c->fd, (const struct sockaddr *) &t->addr, t->addrlen) < 0) {
            if (errno != EINPROGRESS) {
                /* counted at once; the loop retries it later */
                s_err (r, "connect: %s", strerror (errno));
                r->errors++;
                close (c->fd);
                c->fd = -1;
                c->state = S_IDLE;
                return;
            }
            c->state = S_CONNECTING;
            s_watch (r, c, EPOLLOUT, 1);
            return;
        }
        c->state = S_SENDING;
        s_watch (r, c, EPOLLOUT, 1);
    }
    c->state = S_SENDING;
    s_send (r, c);
}

static void s_fail (struct s_run *r, struct s_conn *c, const char *what)
{
    s_err (r, "%s", what);
    uint64_t now = s_now ();
    if (now >= r->win_start && now <= r->win_end) r->errors++;
    s_close (r, c);
}

static void s_send (struct s_run *r, struct s_conn *c)
{
    const struct s_target *t = &r->t[c->target];
    while (c->sent < t->req_len) {
        ssize_t k = send (c->fd, t->req + c->sent, t->req_len - c->sent, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) { s_watch (r, c, EPOLLOUT, 0); return; }
            if (errno == EINTR) continue;
            s_fail (r, c, strerror (errno));
            return;
        }
        c->sent += (size_t) k;
    }
    c->state = S_READING;
    s_watch (r, c, EPOLLIN | EPOLLRDHUP, 0);
}

static void s_finish (struct s_run *r, struct s_conn *c, int status, int close_after)
{
    uint64_t now = s_now ();
    if (c->t_start >= r->win_start && now <= r->win_end) {
        if (status == 200) {
            r->ok++;
            uint64_t us = (now - c->t_start) / 1000;
            s_lat_add (&r->lat, us > UINT32_MAX ? UINT32_MAX : (uint32_t) us);
        } else {
            r->non200++;
            r->errors++;
            s_err (r, "HTTP %d", status);
        }
    }
    if (close_after || !r->keepalive) s_close (r, c);
    else c->state = S_IDLE;
}

static void s_read (struct s_run *r, struct s_conn *c)
{
    for (;;) {
        if (c->cap - c->len < 16384) {
            c->cap = c->cap ? c->cap * 2 : 65536;
            c->buf = realloc (c->buf, c->cap);
            if (!c->buf) s_die ("out of memory");
        }
        ssize_t k = recv (c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            s_fail (r, c, strerror (errno));
            return;
        }
        if (k == 0) {
            int status, cl;
            c->buf[c->len] = '\0';
            if (c->len && s_response_done (c, &status, &cl) == 0 && memmem (c->buf, c->len, "\r\n\r\n", 4)) {
                /* a body delimited by the close */
                s_finish (r, c, status, 1);
                return;
            }
            s_fail (r, c, c->len ? "connection closed mid-response" : "connection closed before an answer");
            return;
        }
        c->len += (size_t) k;
    }
    c->buf[c->len] = '\0';
    int status = 0, close_after = 0;
    int rc = s_response_done (c, &status, &close_after);
    if (rc < 0) s_fail (r, c, "malformed response");
    else if (rc > 0) s_finish (r, c, status, close_after);
}

static void s_loop (struct s_run *r, uint64_t until)
{
    struct epoll_event ev[256];
    for (;;) {
        uint64_t now = s_now ();
        if (now >= until) return;
        if (!r->stopping)
            for (int i = 0; i < r->n; i++)
                if (r->c[i].state == S_IDLE) s_start (r, &r->c[i]);
        for (int i = 0; i < r->n; i++)
            if (r->c[i].state != S_IDLE && now > r->c[i].deadline) s_fail (r, &r->c[i], "timeout");
        int ms = (int) ((until - now) / 1000000) + 1;
        if (ms > 100) ms = 100;
        int k = epoll_wait (r->ep, ev, 256, ms);
        if (k < 0 && errno != EINTR) s_die ("epoll_wait: %s", strerror (errno));
        for (int i = 0; i < k; i++) {
            struct s_conn *c = ev[i].data.ptr;
            if (c->fd < 0) continue;
            if (c->state == S_CONNECTING) {
                int e = 0;
                socklen_t el = sizeof e;
                getsockopt (c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (e) { s_fail (r, c, strerror (e)); continue; }
                c->state = S_SENDING;
            }
            if (c->state == S_SENDING) s_send (r, c);
            else if (c->state == S_READING) s_read (r, c);
        }
    }
}

int main (int argc, char **argv)
{
    static const struct option opts[] = {
        { "url", required_argument, 0, 'u' }, { "path", required_argument, 0, 'p' },
        { "body", required_argument, 0, 'b' }, { "concurrency", required_argument, 0, 'c' },
        { "duration", required_argument, 0, 'd' }, { "warmup", required_argument, 0, 'w' },
        { "close", no_argument, 0, 'C' }, { "timeout", required_argument, 0, 't' },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
    };
    const char *urls = NULL, *path = "/v1/completions";
    const char *body = "{\"model\":\"fake-model\",\"prompt\":\"hello router\",\"max_tokens\":4}";
    int conc = 64, keepalive = 1;
    double duration = 5, warmup = 1, timeout = 10;
    int o;
    while ((o = getopt_long (argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (o) {
        case 'u': urls = optarg; break;
        case 'p': path = optarg; break;
        case 'b': body = optarg; break;
        case 'c': conc = (int) strtol (optarg, &end, 10);
                  if (*end || conc < 1 || conc > 4096) s_die ("--concurrency %s: want 1..4096", optarg);
                  break;
        case 'd': duration = strtod (optarg, &end);
                  if (*end || !(duration > 0)) s_die ("--duration %s: want seconds > 0", optarg);
                  break;
        case 'w': warmup = strtod (optarg, &end);
                  if (*end || warmup < 0) s_die ("--warmup %s: want seconds >= 0", optarg);
                  break;
        case 't': timeout = strtod (optarg, &end);
                  if (*end || !(timeout > 0)) s_die ("--timeout %s: want seconds > 0", optarg);
                  break;
        case 'C': keepalive = 0; break;
        case 'h':
            puts ("usage: router-load --url http://H:P[,...] [--path P] [--body JSON] [--concurrency N]\n"
                  "                   [--duration S] [--warmup S] [--close] [--timeout S]");
            return 0;
        default: return 2;
        }
    }
    if (!urls || optind != argc) s_die ("usage: router-load --url http://H:P[,...] [options] (--help)");
    signal (SIGPIPE, SIG_IGN);

    struct s_run r = { .keepalive = keepalive, .n = conc };
    char *list = strdup (urls);
    for (char *save = NULL, *u = strtok_r (list, ",", &save); u; u = strtok_r (NULL, ",", &save)) {
        r.t = realloc (r.t, (size_t) (r.nt + 1) * sizeof *r.t);
        if (!r.t) s_die ("out of memory");
        s_parse_url (u, path, body, &r.t[r.nt++]);
    }
    free (list);
    if (!r.nt) s_die ("--url: no URL");
    r.c = calloc ((size_t) conc, sizeof *r.c);
    r.ep = epoll_create1 (EPOLL_CLOEXEC);
    if (!r.c || r.ep < 0) s_die ("setup failed");
    for (int i = 0; i < conc; i++) {
        r.c[i].fd = -1;
        r.c[i].target = i % r.nt;
    }
    r.timeout_ns = (uint64_t) (timeout * 1e9);
    uint64_t t0 = s_now ();
    r.win_start = t0 + (uint64_t) (warmup * 1e9);
    r.win_end = r.win_start + (uint64_t) (duration * 1e9);
    s_loop (&r, r.win_end);
    /* what is still in flight at the end of the window is not counted */
    r.stopping = 1;
    for (int i = 0; i < conc; i++) s_close (&r, &r.c[i]);

    qsort (r.lat.v, r.lat.n, sizeof *r.lat.v, s_cmp_u32);
    double sum = 0;
    for (size_t i = 0; i < r.lat.n; i++) sum += r.lat.v[i];
    printf ("{\"urls\":\"%s\",\"path\":\"%s\",\"concurrency\":%d,\"keepalive\":%s,\"duration_s\":%g,"
            "\"requests\":%lu,\"errors\":%lu,\"non200\":%lu,\"connects\":%lu,\"rps\":%.1f,"
            "\"lat_us\":{\"mean\":%.1f,\"p50\":%u,\"p90\":%u,\"p99\":%u,\"max\":%u}",
            urls, path, conc, keepalive ? "true" : "false", duration, r.ok, r.errors, r.non200,
            r.connects, (double) r.ok / duration, r.lat.n ? sum / (double) r.lat.n : 0.0,
            s_pct (&r.lat, 50), s_pct (&r.lat, 90), s_pct (&r.lat, 99), s_pct (&r.lat, 100));
    if (r.errors) {
        printf (",\"last_error\":\"");
        for (const char *p = r.last_err; *p; p++) if (*p != '"' && *p != '\\') putchar (*p);
        putchar ('"');
    }
    printf ("}\n");
    for (int i = 0; i < conc; i++) free (r.c[i].buf);
    for (int i = 0; i < r.nt; i++) free (r.t[i].req);
    free (r.t);
    free (r.c);
    free (r.lat.v);
    close (r.ep);
    return r.ok ? 0 : 1;
}
