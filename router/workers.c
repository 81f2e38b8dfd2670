/* router/workers.c -- see workers.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/event.h>
#include <event2/http.h>

#include "log.h"
#include "workers.h"

struct rx_workers {
    struct event_base *base;
    struct rx_workers_cfg cfg;
    char *endpoint;
    rx_rpolicy_t *policy;
    struct rx_worker **w;
    size_t n, cap;
    uint32_t next_id;
    struct event *timer;
};

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *rx_breaker_name (int state)
{
    switch (state) {
    case RX_BREAKER_OPEN: return "open";
    case RX_BREAKER_HALF_OPEN: return "half_open";
    default: return "closed";
    }
}

/* ------------------------------------------------------------ URLs */

int rx_worker_url_normalize (const char *in, char *out, size_t outlen, struct rx_err *err)
{
    if (!in || !*in) return rx_err_set (err, RX_EINVAL, "empty worker URL");
    const char *p = in;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strlen (p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    if (n >= RX_WORKER_URL_MAX - 16)
        return rx_err_set (err, RX_EINVAL, "worker URL of %zu bytes is too long", n);
    if (n < 7 || strncasecmp (p, "http://", 7) != 0) {
        if (memchr (p, ':', n) && strncasecmp (p, "https://", 8) == 0)
            return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": https is not supported (use http://)", (int) n, p);
        return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": expected http://HOST:PORT", (int) n, p);
    }
    const char *h = p + 7, *end = p + n;
    if (end > h && end[-1] == '/') end--;
    const char *hs, *he, *portp = NULL;
    if (h < end && *h == '[') {
        hs = h + 1;
        he = memchr (hs, ']', (size_t) (end - hs));
        if (!he || he == hs)
            return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": bad [IPv6] host", (int) n, p);
        const char *after = he + 1;
        if (after < end) {
            if (*after != ':')
                return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": expected :PORT after the host", (int) n, p);
            portp = after + 1;
        }
        for (const char *q = hs; q < he; q++)
            if (!isxdigit ((unsigned char) *q) && *q != ':' && *q != '.')
                return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": bad [IPv6] host", (int) n, p);
    } else {
        hs = h;
        he = hs;
        while (he < end && *he != ':') he++;
        if (he < end) portp = he + 1;
        if (he == hs) return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": no host", (int) n, p);
        for (const char *q = hs; q < he; q++)
            if (!isalnum ((unsigned char) *q) && *q != '-' && *q != '.' && *q != '_')
                return rx_err_set (err, RX_EINVAL,
                                   "worker URL \"%.*s\": the host has '%c' (a path, query or user info is not allowed)",
                                   (int) n, p, *q);
    }
    long port = 80;
    if (portp) {
        if (portp >= end) return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": empty port", (int) n, p);
        port = 0;
        for (const char *q = portp; q < end; q++) {
            if (!isdigit ((unsigned char) *q))
                return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": the port has '%c' (a path is not allowed)",
                                   (int) n, p, *q);
            port = port * 10 + (*q - '0');
            if (port > 65535) break;
        }
        if (port < 1 || port > 65535)
            return rx_err_set (err, RX_EINVAL, "worker URL \"%.*s\": port out of range 1..65535", (int) n, p);
    }
    int v6 = *h == '[';
    int w = snprintf (out, outlen, v6 ? "http://[%.*s]:%ld" : "http://%.*s:%ld", (int) (he - hs), hs, port);
    if (w < 0 || (size_t) w >= outlen) return rx_err_set (err, RX_EINVAL, "worker URL too long");
    for (char *q = out + 7; *q && *q != ':'; q++) *q = (char) tolower ((unsigned char) *q);
    return RX_OK;
}

/* Split a normalised URL into the host (unbracketed), port, Host header. */
static void s_split (struct rx_worker *w, char *host, size_t hostlen)
{
    const char *h = w->url + 7;
    const char *colon = strrchr (h, ':');
    snprintf (w->host_hdr, sizeof w->host_hdr, "%s", h);
    w->port = (uint16_t) atoi (colon + 1);
    if (*h == '[') snprintf (host, hostlen, "%.*s", (int) (colon - h - 2), h + 1);
    else snprintf (host, hostlen, "%.*s", (int) (colon - h), h);
}

/* Resolve once, when the worker is added, so that no connect blocks the
 * loop in getaddrinfo.  A name that does not resolve now is kept (libevent
 * resolves it at connect time) with a warning. */
static void s_resolve (struct rx_worker *w, const char *host)
{
    struct addrinfo hints = { 0 }, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    int rc = getaddrinfo (host, NULL, &hints, &res);
    if (rc == 0 && res &&
        getnameinfo (res->ai_addr, res->ai_addrlen, w->addr, sizeof w->addr, NULL, 0, NI_NUMERICHOST) == 0) {
        freeaddrinfo (res);
        return;
    }
    if (res) freeaddrinfo (res);
    rx_warn ("worker %s: cannot resolve \"%s\" now (%s); will retry at each connect", w->url, host,
             rc ? gai_strerror (rc) : "no address");
    snprintf (w->addr, sizeof w->addr, "%s", host);
}

/* ------------------------------------------------------------ state machines */

void rx_worker_health_result (const struct rx_workers_cfg *cfg, struct rx_worker *w, int ok)
{
    if (ok) {
        w->hc_failures = 0;
        w->hc_successes++;
        if (!w->checked || w->hc_successes >= cfg->success_threshold) w->healthy = 1;
    } else {
        w->hc_successes = 0;
        w->hc_failures++;
        if (!w->checked || w->hc_failures >= cfg->failure_threshold) w->healthy = 0;
    }
    w->checked = 1;
}

void rx_worker_breaker_result (const struct rx_workers_cfg *cfg, struct rx_worker *w, int ok, double now)
{
    if (ok) {
        w->br_failures = 0;
        if (w->breaker == RX_BREAKER_HALF_OPEN && ++w->br_successes >= cfg->breaker_successes) {
            w->breaker = RX_BREAKER_CLOSED;
            w->br_successes = 0;
        }
        return;
    }
    w->br_successes = 0;
    w->br_failures++;
    if (w->breaker == RX_BREAKER_HALF_OPEN ||
        (w->breaker == RX_BREAKER_CLOSED && w->br_failures >= cfg->breaker_failures)) {
        w->breaker = RX_BREAKER_OPEN;
        w->br_opened_at = now;
    }
}

int rx_worker_breaker_poll (const struct rx_workers_cfg *cfg, struct rx_worker *w, double now)
{
    if (w->breaker != RX_BREAKER_OPEN || now - w->br_opened_at < cfg->breaker_timeout) return 0;
    w->breaker = RX_BREAKER_HALF_OPEN;
    w->br_successes = 0;
    return 1;
}

int rx_worker_up (const struct rx_worker *w)
{
    return w->healthy && w->breaker != RX_BREAKER_OPEN;
}

/* The policy forgets a worker that cannot take traffic now. */
static void s_policy_sync (rx_workers_t *ws, struct rx_worker *w)
{
    if (w->in_policy && (!rx_worker_up (w) || w->removed)) {
        w->in_policy = 0;
        if (ws->policy) rx_rpolicy_removed (ws->policy, w->id);
    }
}

int rx_worker_eligible (rx_workers_t *ws, struct rx_worker *w, double now)
{
    if (w->removed || !w->healthy) return 0;
    if (rx_worker_breaker_poll (&ws->cfg, w, now))
        rx_info ("worker %s: circuit breaker half-open (a trial request may pass)", w->url);
    if (w->breaker == RX_BREAKER_OPEN) return 0;
    if (w->breaker == RX_BREAKER_HALF_OPEN && w->probes > 0) return 0;
    if (!w->in_policy) {
        w->in_policy = 1;
        if (ws->policy) rx_rpolicy_added (ws->policy, w->id);
    }
    return 1;
}

/* ------------------------------------------------------------ lifetime */

static void s_worker_free (struct rx_worker *w)
{
    for (size_t i = 0; i < w->n_idle; i++) evhttp_connection_free (w->idle[i]);
    free (w->idle);
    if (w->hc_conn) evhttp_connection_free (w->hc_conn);   /* drops a pending check silently */
    free (w);
}

static void s_maybe_free (struct rx_worker *w)
{
    if (w->removed && w->load == 0) s_worker_free (w);
}

static void s_on_timer (evutil_socket_t fd, short what, void *arg);

rx_workers_t *rx_workers_new (struct event_base *base, const struct rx_workers_cfg *cfg,
                              rx_rpolicy_t *policy, struct rx_err *err)
{
    rx_workers_t *ws = calloc (1, sizeof *ws);
    if (!ws) goto oom;
    ws->base = base;
    ws->cfg = *cfg;
    ws->endpoint = strdup (cfg->health_endpoint ? cfg->health_endpoint : "/health");
    if (!ws->endpoint) goto oom;
    ws->cfg.health_endpoint = ws->endpoint;
    ws->policy = policy;
    ws->next_id = 1;
    ws->timer = event_new (base, -1, EV_PERSIST, s_on_timer, ws);
    if (!ws->timer) goto oom;
    struct timeval tv = { (time_t) cfg->health_interval,
                          (suseconds_t) ((cfg->health_interval - (double) (time_t) cfg->health_interval) * 1e6) };
    event_add (ws->timer, &tv);
    return ws;
oom:
    rx_err_set (err, RX_ENOMEM, "out of memory");
    rx_workers_destroy (&ws);
    return NULL;
}

void rx_workers_destroy (rx_workers_t **self_p)
{
    rx_workers_t *ws = self_p ? *self_p : NULL;
    if (!ws) return;
    for (size_t i = 0; i < ws->n; i++) s_worker_free (ws->w[i]);
    free (ws->w);
    if (ws->timer) event_free (ws->timer);
    free (ws->endpoint);
    free (ws);
    *self_p = NULL;
}

struct rx_worker *rx_workers_find (rx_workers_t *ws, const char *url)
{
    char norm[RX_WORKER_URL_MAX];
    struct rx_err e = { 0 };
    if (rx_worker_url_normalize (url, norm, sizeof norm, &e) != RX_OK) return NULL;
    for (size_t i = 0; i < ws->n; i++)
        if (!strcmp (ws->w[i]->url, norm)) return ws->w[i];
    return NULL;
}

size_t rx_workers_count (const rx_workers_t *ws) { return ws->n; }
struct rx_worker *rx_workers_at (rx_workers_t *ws, size_t i) { return i < ws->n ? ws->w[i] : NULL; }

size_t rx_workers_unchecked (const rx_workers_t *ws)
{
    size_t k = 0;
    for (size_t i = 0; i < ws->n; i++) k += !ws->w[i]->checked;
    return k;
}

static void s_check (rx_workers_t *ws, struct rx_worker *w);

int rx_workers_add (rx_workers_t *ws, const char *url, void (*on_checked) (void *, struct rx_worker *),
                    void *arg, struct rx_worker **out, struct rx_err *err)
{
    char norm[RX_WORKER_URL_MAX];
    int rc = rx_worker_url_normalize (url, norm, sizeof norm, err);
    if (rc != RX_OK) return rc;
    for (size_t i = 0; i < ws->n; i++)
        if (!strcmp (ws->w[i]->url, norm)) return rx_err_set (err, RX_EAGAIN, "worker %s is already present", norm);
    if (ws->n == ws->cap) {
        size_t cap = ws->cap ? ws->cap * 2 : 8;
        struct rx_worker **nw = realloc (ws->w, cap * sizeof *nw);
        if (!nw) return rx_err_set (err, RX_ENOMEM, "out of memory");
        ws->w = nw;
        ws->cap = cap;
    }
    struct rx_worker *w = calloc (1, sizeof *w);
    if (!w) return rx_err_set (err, RX_ENOMEM, "out of memory");
    snprintf (w->url, sizeof w->url, "%s", norm);
    char host[RX_WORKER_URL_MAX];
    s_split (w, host, sizeof host);
    s_resolve (w, host);
    w->id = ws->next_id++;
    w->owner = ws;
    w->on_checked = on_checked;
    w->on_checked_arg = arg;
    ws->w[ws->n++] = w;
    rx_info ("worker %s added (id %u)", w->url, (unsigned) w->id);
    if (out) *out = w;
    s_check (ws, w);
    return RX_OK;
}

int rx_workers_remove (rx_workers_t *ws, const char *url, struct rx_err *err)
{
    struct rx_worker *w = rx_workers_find (ws, url);
    if (!w) return rx_err_set (err, RX_ENOENT, "no worker %s", url);
    size_t i = 0;
    while (ws->w[i] != w) i++;
    memmove (ws->w + i, ws->w + i + 1, (ws->n - i - 1) * sizeof *ws->w);
    ws->n--;
    w->removed = 1;
    s_policy_sync (ws, w);
    if (w->hc_conn) {   /* frees a pending check without its callback */
        evhttp_connection_free (w->hc_conn);
        w->hc_conn = NULL;
        w->hc_pending = 0;
    }
    if (w->on_checked) {   /* a POST /workers still waiting hears of it now */
        void (*cb) (void *, struct rx_worker *) = w->on_checked;
        w->on_checked = NULL;
        w->load++;          /* keep w alive through the callback */
        cb (w->on_checked_arg, w);
        w->load--;
    }
    rx_info ("worker %s removed (%u request(s) in flight on it finish)", w->url, (unsigned) w->load);
    s_maybe_free (w);
    return RX_OK;
}

/* ------------------------------------------------------------ traffic */

void rx_worker_attempt_begin (rx_workers_t *ws, struct rx_worker *w)
{
    w->load++;
    w->n_requests++;
    if (w->breaker == RX_BREAKER_HALF_OPEN) w->probes++;
}

void rx_worker_attempt_end (rx_workers_t *ws, struct rx_worker *w, int ok, double now)
{
    if (w->load) w->load--;
    if (w->probes) w->probes--;
    if (!ok) w->n_failures++;
    if (!w->removed && ok >= 0) {
        int before = w->breaker;
        rx_worker_breaker_result (&ws->cfg, w, ok, now);
        if (w->breaker != before)
            rx_log (w->breaker == RX_BREAKER_OPEN ? RX_LOG_WARN : RX_LOG_INFO,
                    "worker %s: circuit breaker %s (%d consecutive failed request(s))", w->url,
                    rx_breaker_name (w->breaker), w->br_failures);
        /* A failure ends the worker's cache affinity at once, even while
         * the breaker is still closed: the policy adds it back afresh. */
        if (!ok && w->in_policy) {
            w->in_policy = 0;
            if (ws->policy) rx_rpolicy_removed (ws->policy, w->id);
        }
    }
    s_maybe_free (w);
}

struct evhttp_connection *rx_worker_conn_get (rx_workers_t *ws, struct rx_worker *w)
{
    if (w->n_idle) return w->idle[--w->n_idle];
    struct evhttp_connection *c = evhttp_connection_base_new (ws->base, NULL, w->addr, w->port);
    if (!c) return NULL;
    struct timeval tv = { (time_t) ws->cfg.io_timeout,
                          (suseconds_t) ((ws->cfg.io_timeout - (double) (time_t) ws->cfg.io_timeout) * 1e6) };
    evhttp_connection_set_timeout_tv (c, &tv);
    evhttp_connection_set_retries (c, 0);
    return c;
}

void rx_worker_conn_put (rx_workers_t *ws, struct rx_worker *w, struct evhttp_connection *c)
{
    if (!c) return;
    if (w->removed || w->n_idle >= ws->cfg.max_idle) {
        evhttp_connection_free (c);
        return;
    }
    if (w->n_idle == w->cap_idle) {
        size_t cap = w->cap_idle ? w->cap_idle * 2 : 16;
        struct evhttp_connection **ni = realloc (w->idle, cap * sizeof *ni);
        if (!ni) {
            evhttp_connection_free (c);
            return;
        }
        w->idle = ni;
        w->cap_idle = cap;
    }
    w->idle[w->n_idle++] = c;
}

/* ------------------------------------------------------------ health checks */

static void s_on_check (struct evhttp_request *req, void *arg)
{
    struct rx_worker *w = arg;
    rx_workers_t *ws = w->owner;
    int code = req ? evhttp_request_get_response_code (req) : 0;
    int ok = code == 200;
    int was = w->healthy, first = !w->checked;
    w->hc_pending = 0;
    rx_worker_health_result (&ws->cfg, w, ok);
    if (first)
        rx_log (ok ? RX_LOG_INFO : RX_LOG_WARN, "worker %s: first health check %s%s", w->url,
                ok ? "passed: healthy" : "failed: unhealthy",
                ok ? "" : code ? " (HTTP status)" : " (no answer)");
    else if (was != w->healthy)
        rx_log (w->healthy ? RX_LOG_INFO : RX_LOG_WARN, "worker %s: %s after %d consecutive %s health check(s)",
                w->url, w->healthy ? "healthy" : "unhealthy",
                w->healthy ? w->hc_successes : w->hc_failures, w->healthy ? "passed" : "failed");
    if (!ok) rx_debug ("worker %s: health check failed (status %d)", w->url, code);
    s_policy_sync (ws, w);
    if (first && w->on_checked) {
        void (*cb) (void *, struct rx_worker *) = w->on_checked;
        w->on_checked = NULL;
        cb (w->on_checked_arg, w);
    }
}

static void s_check (rx_workers_t *ws, struct rx_worker *w)
{
    if (w->hc_pending || w->removed) return;
    if (!w->hc_conn) {
        w->hc_conn = evhttp_connection_base_new (ws->base, NULL, w->addr, w->port);
        if (!w->hc_conn) return;
        struct timeval tv = { (time_t) ws->cfg.health_timeout,
                              (suseconds_t) ((ws->cfg.health_timeout - (double) (time_t) ws->cfg.health_timeout) * 1e6) };
        evhttp_connection_set_timeout_tv (w->hc_conn, &tv);
        evhttp_connection_set_retries (w->hc_conn, 0);
    }
    struct evhttp_request *req = evhttp_request_new (s_on_check, w);
    if (!req) return;
    struct evkeyvalq *h = evhttp_request_get_output_headers (req);
    evhttp_add_header (h, "Host", w->host_hdr);
    evhttp_add_header (h, "User-Agent", "radix-router");
    w->hc_pending = 1;
    if (evhttp_make_request (w->hc_conn, req, EVHTTP_REQ_GET, ws->endpoint) != 0) {
        /* libevent freed req; a failed connect start counts as a failed check */
        w->hc_pending = 0;
        s_on_check (NULL, w);
    }
}

void rx_workers_check_all (rx_workers_t *ws)
{
    for (size_t i = 0; i < ws->n; i++) s_check (ws, ws->w[i]);
}

static void s_on_timer (evutil_socket_t fd, short what, void *arg)
{
    rx_workers_t *ws = arg;
    double now = s_now ();
    for (size_t i = 0; i < ws->n; i++) {
        struct rx_worker *w = ws->w[i];
        if (rx_worker_breaker_poll (&ws->cfg, w, now))
            rx_info ("worker %s: circuit breaker half-open (a trial request may pass)", w->url);
    }
    rx_workers_check_all (ws);
}
