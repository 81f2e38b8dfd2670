/* router/proxy.c -- see proxy.h. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "api.h"
#include "auth.h"
#include "histogram.h"
#include "log.h"
#include "proxy.h"
#include "routekey.h"

#define S_MAX_ATTEMPTS 16
#define S_LAST_BODY_MAX (64 * 1024)

struct s_req {
    struct s_req *prev, *next;            /* px->active or px->queue; px->free_list via next */
    rx_proxy_t *px;
    struct evhttp_request *client;        /* NULL once the client is gone */
    struct evhttp_request *up;            /* the attempt in flight */
    struct rx_worker *w;                  /* its worker */
    struct evhttp_connection *conn;       /* its connection */
    int kind;                             /* enum rx_routekey_kind */
    int first_eligible;                   /* GET /v1/models */
    enum evhttp_cmd_type method;
    const char *uri;                      /* borrowed from client */
    const unsigned char *body;            /* borrowed from client's input buffer */
    size_t body_len;
    struct rx_routekey_buf keybuf;        /* kept across reuse */
    const char *key;
    size_t klen;
    double t0;
    int attempts;
    uint32_t tried[S_MAX_ATTEMPTS];
    int queued, active;
    int headers_sent, discard, sse, in_make, sync_done, sync_ok;
    int up_err;
    int last_status;                      /* last retryable worker answer, 0 = none */
    char last_ctype[128];
    struct evbuffer *last_body;
    char why[RX_WORKER_URL_MAX + 128];     /* the last attempt's failure */
    struct event *ev_timeout, *ev_backoff;
};

/* An admin request waiting for a new worker's first health check. */
struct s_admin {
    struct s_admin *prev, *next;
    rx_proxy_t *px;
    struct evhttp_request *client;
    int legacy, in_add, done;
    struct rx_worker *w;
};

struct rx_proxy {
    struct event_base *base;
    const struct rx_router_settings *s;
    rx_workers_t *ws;
    rx_rpolicy_t *rp;
    struct evhttp *http;
    struct evhttp_bound_socket *listener;
    char url[160];
    int draining;
    struct event *ev_tick, *ev_pump, *ev_drain;
    const struct timeval *ctimeout;       /* common timeout: request_timeout */
    struct s_req *active, *queue_head, *queue_tail, *free_list;
    size_t n_active, n_queued, n_free;
    size_t n_writing;                     /* replies not yet fully written (drain waits) */
    struct s_admin *admins;
    uint64_t seed;
    double last_policy_tick;
    /* candidates, reused */
    struct rx_route_worker *cand;
    struct rx_worker **cand_w;
    size_t cand_cap;
    /* metrics */
    uint64_t status_count[600];
    uint64_t retries, decisions[4], client_gone, timeouts;
    struct rx_hist duration;
};

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t s_rand (rx_proxy_t *px)
{
    uint64_t z = (px->seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static struct timeval s_tv (double s)
{
    if (s < 0) s = 0;
    struct timeval tv = { (time_t) s, (suseconds_t) ((s - (double) (time_t) s) * 1e6) };
    return tv;
}

/* ------------------------------------------------------------ replies */

static const char *s_reason (int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 431: return "Request Header Fields Too Large";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default:  return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

static void s_count (rx_proxy_t *px, int status)
{
    if (status >= 100 && status < 600) px->status_count[status]++;
}

static void s_drain_check (rx_proxy_t *px)
{
    if (px->draining && !px->n_active && !px->n_queued && !px->n_writing) event_active (px->ev_drain, EV_TIMEOUT, 0);
}

static void s_on_reply_done (struct evhttp_request *req, void *arg)
{
    rx_proxy_t *px = arg;
    if (px->n_writing) px->n_writing--;
    s_drain_check (px);
}

/* A reply is about to go out: a drain waits until it is written. */
static void s_track (rx_proxy_t *px, struct evhttp_request *req)
{
    px->n_writing++;
    evhttp_request_set_on_complete_cb (req, s_on_reply_done, px);
}

static void s_reply (rx_proxy_t *px, struct evhttp_request *req, int status, const char *ctype, const char *body)
{
    struct evbuffer *b = evbuffer_new ();
    if (b && body) evbuffer_add (b, body, strlen (body));
    if (ctype) evhttp_add_header (evhttp_request_get_output_headers (req), "Content-Type", ctype);
    s_track (px, req);
    evhttp_send_reply (req, status, s_reason (status), b);
    if (b) evbuffer_free (b);
    s_count (px, status);
}

static void s_reply_json (rx_proxy_t *px, struct evhttp_request *req, int status, json_t *o)
{
    char *txt = o ? json_dumps (o, JSON_COMPACT) : NULL;
    json_decref (o);
    if (!txt) {
        s_reply (px, req, 500, "application/json",
                 "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":\"internal_error\"}}");
        return;
    }
    s_reply (px, req, status, "application/json", txt);
    free (txt);
}

static void s_reply_api_error (rx_proxy_t *px, struct evhttp_request *req, const struct rx_api_error *e)
{
    char *json = NULL;
    if (e->status == 503 || e->status == 429)
        evhttp_add_header (evhttp_request_get_output_headers (req), "Retry-After", "1");
    if (rx_api_error_json (e, &json) != RX_OK) {
        s_reply (px, req, 500, "text/plain", "out of memory\n");
        return;
    }
    s_reply (px, req, e->status, "application/json", json);
    free (json);
}

#if defined(__GNUC__)
__attribute__ ((format (printf, 6, 7)))
#endif
static void s_reply_error (rx_proxy_t *px, struct evhttp_request *req, int status, const char *code,
                           const char *param, const char *fmt, ...)
{
    struct rx_api_error e;
    va_list ap;
    va_start (ap, fmt);
    rx_api_error_vset (&e, status, code, param, fmt, ap);
    va_end (ap);
    s_reply_api_error (px, req, &e);
}

/* ------------------------------------------------------------ request objects */

static void s_on_timeout (evutil_socket_t fd, short what, void *arg);
static void s_on_backoff (evutil_socket_t fd, short what, void *arg);
static void s_on_client_close (struct evhttp_connection *conn, void *arg);

static struct s_req *s_req_get (rx_proxy_t *px)
{
    struct s_req *p = px->free_list;
    if (p) {
        px->free_list = p->next;
        px->n_free--;
    } else {
        p = calloc (1, sizeof *p);
        if (!p) return NULL;
        p->px = px;
        p->last_body = evbuffer_new ();
        p->ev_timeout = evtimer_new (px->base, s_on_timeout, p);
        p->ev_backoff = evtimer_new (px->base, s_on_backoff, p);
        if (!p->last_body || !p->ev_timeout || !p->ev_backoff) {
            if (p->last_body) evbuffer_free (p->last_body);
            if (p->ev_timeout) event_free (p->ev_timeout);
            if (p->ev_backoff) event_free (p->ev_backoff);
            free (p);
            return NULL;
        }
    }
    struct rx_routekey_buf kb = p->keybuf;
    struct evbuffer *lb = p->last_body;
    struct event *et = p->ev_timeout, *eb = p->ev_backoff;
    memset (p, 0, sizeof *p);
    p->px = px;
    p->keybuf = kb;
    p->last_body = lb;
    p->ev_timeout = et;
    p->ev_backoff = eb;
    return p;
}

static void s_req_free_mem (struct s_req *p)
{
    rx_routekey_buf_fini (&p->keybuf);
    evbuffer_free (p->last_body);
    event_free (p->ev_timeout);
    event_free (p->ev_backoff);
    free (p);
}

static void s_req_put (rx_proxy_t *px, struct s_req *p)
{
    evtimer_del (p->ev_timeout);
    evtimer_del (p->ev_backoff);
    evbuffer_drain (p->last_body, evbuffer_get_length (p->last_body));
    if (p->keybuf.cap > (1u << 20)) rx_routekey_buf_fini (&p->keybuf);   /* do not hoard a huge prompt */
    if (px->n_free >= 1024) {
        s_req_free_mem (p);
        return;
    }
    p->next = px->free_list;
    px->free_list = p;
    px->n_free++;
}

static void s_list_unlink (struct s_req **head, struct s_req *p)
{
    if (p->prev) p->prev->next = p->next;
    else *head = p->next;
    if (p->next) p->next->prev = p->prev;
    p->prev = p->next = NULL;
}

/* Stop hearing about the client's connection (before its request ends:
 * libevent may free the connection while we answer). */
static void s_detach_client (struct s_req *p)
{
    struct evhttp_connection *c = p->client ? evhttp_request_get_connection (p->client) : NULL;
    if (c) evhttp_connection_set_closecb (c, NULL, NULL);
}

/* The request is over: bookkeeping, free its slot, wake the queue. */
static void s_finish (struct s_req *p, int status)
{
    rx_proxy_t *px = p->px;
    if (p->active) {
        s_list_unlink (&px->active, p);
        px->n_active--;
        p->active = 0;
        if (px->queue_head) event_active (px->ev_pump, EV_TIMEOUT, 0);
    } else if (p->queued) {
        if (p->prev) p->prev->next = p->next;
        else px->queue_head = p->next;
        if (p->next) p->next->prev = p->prev;
        else px->queue_tail = p->prev;
        p->prev = p->next = NULL;
        p->queued = 0;
        px->n_queued--;
    }
    if (status) rx_hist_observe (&px->duration, s_now () - p->t0);
    s_drain_check (px);
    s_req_put (px, p);
}

/* ------------------------------------------------------------ candidates */

static int s_tried (const struct s_req *p, uint32_t id)
{
    for (int i = 0; i < p->attempts && i < S_MAX_ATTEMPTS; i++)
        if (p->tried[i] == id) return 1;
    return 0;
}

/* Fill px->cand / cand_w with the workers p may go to now; returns how many. */
static size_t s_candidates (rx_proxy_t *px, const struct s_req *p, double now)
{
    size_t n = rx_workers_count (px->ws), k = 0;
    if (n > px->cand_cap) {
        size_t cap = n * 2;
        struct rx_route_worker *c = realloc (px->cand, cap * sizeof *c);
        if (!c) return 0;
        px->cand = c;
        struct rx_worker **cw = realloc (px->cand_w, cap * sizeof *cw);
        if (!cw) return 0;
        px->cand_w = cw;
        px->cand_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        struct rx_worker *w = rx_workers_at (px->ws, i);
        if ((p && s_tried (p, w->id)) || !rx_worker_eligible (px->ws, w, now)) continue;
        px->cand[k].id = w->id;
        px->cand[k].url = w->url;
        px->cand[k].load = w->load;
        px->cand_w[k] = w;
        k++;
        if (p && p->first_eligible) break;
    }
    return k;
}

static int s_any_up (rx_proxy_t *px)
{
    size_t n = rx_workers_count (px->ws);
    for (size_t i = 0; i < n; i++)
        if (rx_worker_up (rx_workers_at (px->ws, i))) return 1;
    return 0;
}

/* ------------------------------------------------------------ proxying */

static int s_retryable (int code)
{
    return code == 408 || code == 429 || code == 500 || code == 502 || code == 503 || code == 504;
}

static int s_bogus_status (int code)
{
    return code < 200 || code > 599;
}

static const char *s_up_err_name (int e)
{
    switch (e) {
    case EVREQ_HTTP_TIMEOUT: return "timed out";
    case EVREQ_HTTP_EOF: return "closed the connection";
    case EVREQ_HTTP_INVALID_HEADER: return "sent a malformed answer";
    case EVREQ_HTTP_BUFFER_ERROR: return "connection error";
    case EVREQ_HTTP_DATA_TOO_LONG: return "sent a malformed body";
    default: return "refused the connection or closed it";
    }
}

static int s_hop_by_hop (const char *k)
{
    static const char *const hop[] = { "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
                                       "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade",
                                       "Content-Length", NULL };
    for (int i = 0; hop[i]; i++)
        if (!strcasecmp (k, hop[i])) return 1;
    return 0;
}

static void s_copy_headers (struct evhttp_request *from, struct evhttp_request *to)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers (from);
    struct evkeyvalq *out = evhttp_request_get_output_headers (to);
    for (struct evkeyval *h = in->tqh_first; h; h = h->next.tqe_next)
        if (!s_hop_by_hop (h->key)) evhttp_add_header (out, h->key, h->value);
}

static void s_attempt (struct s_req *p);

static int s_can_retry (struct s_req *p)
{
    if (!p->client || p->attempts >= p->px->s->max_attempts || p->px->draining) return 0;
    return s_candidates (p->px, p, s_now ()) > 0;
}

/* No attempt left: answer with the last worker error, else our own. */
static void s_fail_final (struct s_req *p, int no_candidate)
{
    rx_proxy_t *px = p->px;
    struct evhttp_request *c = p->client;
    int status = 0;
    if (c) {
        s_detach_client (p);
        if (p->last_status) {
            status = p->last_status;
            struct evkeyvalq *oh = evhttp_request_get_output_headers (c);
            evhttp_add_header (oh, "Content-Type", p->last_ctype[0] ? p->last_ctype : "application/json");
            if (status == 503 || status == 429) evhttp_add_header (oh, "Retry-After", "1");
            s_track (px, c);
            evhttp_send_reply (c, status, s_reason (status), p->last_body);
            s_count (px, status);
        } else if (no_candidate && p->attempts == 0) {
            status = 503;
            s_reply_error (px, c, 503, "no_healthy_worker", NULL, "no healthy worker can take the request");
        } else if (no_candidate) {
            status = 503;
            s_reply_error (px, c, 503, "no_healthy_worker", NULL,
                           "no other healthy worker to retry on after %d failed attempt(s); last: %s", p->attempts,
                           p->why);
        } else {
            status = 502;
            s_reply_error (px, c, 502, "worker_failed", NULL, "%d attempt(s) failed; last: %s", p->attempts, p->why);
        }
    }
    s_finish (p, status);
}

static void s_retry_or_fail (struct s_req *p)
{
    rx_proxy_t *px = p->px;
    if (!p->client) {
        s_finish (p, 0);
        return;
    }
    if (p->attempts >= px->s->max_attempts || px->draining) {
        s_fail_final (p, 0);
        return;
    }
    if (s_candidates (px, p, s_now ()) == 0) {
        s_fail_final (p, 1);
        return;
    }
    double d = px->s->retry_backoff * ldexp (1.0, p->attempts - 1);
    if (d > px->s->retry_backoff_max) d = px->s->retry_backoff_max;
    d *= 0.5 + 0.5 * ((double) (s_rand (px) >> 11) * 0x1.0p-53);   /* equal jitter */
    px->retries++;
    rx_debug ("retrying %s in %.0f ms (attempt %d failed: %s)", p->uri, d * 1e3, p->attempts, p->why);
    struct timeval tv = s_tv (d);
    evtimer_add (p->ev_backoff, &tv);
}

/* A stream already going to the client cannot be retried: end it so the
 * client knows (SSE error event), or drop the connection. */
static void s_stream_abort (struct s_req *p, const char *why)
{
    struct evhttp_request *c = p->client;
    if (c) {
        s_detach_client (p);
        if (p->sse) {
            struct rx_api_error e;
            char *json = NULL;
            rx_api_error_set (&e, 502, "worker_failed", NULL, "%s", why);
            struct evbuffer *b = evbuffer_new ();
            if (b && rx_api_error_json (&e, &json) == RX_OK) {
                evbuffer_add_printf (b, "data: %s\n\ndata: [DONE]\n\n", json);
                evhttp_send_reply_chunk (c, b);
            }
            free (json);
            if (b) evbuffer_free (b);
            evhttp_send_reply_end (c);
        } else {
            struct evhttp_connection *conn = evhttp_request_get_connection (c);
            if (conn) evhttp_connection_free (conn);   /* frees c too */
            else evhttp_send_reply_end (c);
        }
    }
    p->client = NULL;
    s_finish (p, 502);
}

/* End p with an error of our own: a stream already going to the client is
 * ended as above, else the client gets status with an OpenAI-style body. */
static void s_fail (struct s_req *p, int status, const char *code, const char *why)
{
    if (p->headers_sent) {
        s_stream_abort (p, why);
        return;
    }
    if (p->client) {
        s_detach_client (p);
        s_reply_error (p->px, p->client, status, code, NULL, "%s", why);
        p->client = NULL;
    }
    s_finish (p, status);
}

static int s_on_up_headers (struct evhttp_request *up, void *arg)
{
    struct s_req *p = arg;
    int code = evhttp_request_get_response_code (up);
    /* A status outside 200..599 (libevent reads "2x0" as 2) is garbage:
     * never forwarded, a failed attempt like a dropped connection. */
    if ((s_retryable (code) && s_can_retry (p)) || s_bogus_status (code)) {
        p->discard = 1;                            /* keep the body as the last error */
        evhttp_request_set_chunked_cb (up, NULL);
        return 0;
    }
    struct evkeyvalq *ih = evhttp_request_get_input_headers (up);
    const char *ct = evhttp_find_header (ih, "Content-Type");
    int sse = ct && !strncasecmp (ct, "text/event-stream", 17);
    if (!sse && evhttp_find_header (ih, "Content-Length")) {
        evhttp_request_set_chunked_cb (up, NULL);  /* a plain answer: forwarded whole */
        return 0;
    }
    if (!p->client) return 0;
    p->sse = sse;
    p->headers_sent = 1;
    s_copy_headers (up, p->client);
    struct evkeyvalq *oh = evhttp_request_get_output_headers (p->client);
    if (!evhttp_find_header (oh, "X-Accel-Buffering")) evhttp_add_header (oh, "X-Accel-Buffering", "no");
    const char *line = evhttp_request_get_response_code_line (up);
    s_track (p->px, p->client);
    evhttp_send_reply_start (p->client, code, line && *line ? line : s_reason (code));
    s_count (p->px, code);
    return 0;
}

static void s_on_up_chunk (struct evhttp_request *up, void *arg)
{
    struct s_req *p = arg;
    if (p->headers_sent && p->client) evhttp_send_reply_chunk (p->client, evhttp_request_get_input_buffer (up));
}

static void s_on_up_error (enum evhttp_request_error e, void *arg)
{
    struct s_req *p = arg;
    p->up_err = (int) e;
}

static void s_on_up_done (struct evhttp_request *up, void *arg)
{
    struct s_req *p = arg;
    rx_proxy_t *px = p->px;
    int code = up ? evhttp_request_get_response_code (up) : 0;
    if (p->in_make) {   /* failed inside evhttp_make_request: s_attempt handles it */
        p->sync_done = 1;
        return;
    }
    struct rx_worker *w = p->w;
    struct evhttp_connection *conn = p->conn;
    p->up = NULL;
    p->w = NULL;
    p->conn = NULL;
    evtimer_del (p->ev_backoff);   /* the connect check */
    double now = s_now ();
    if (!code) {
        snprintf (p->why, sizeof p->why, "worker %s %s", w->url, s_up_err_name (p->up_err));
        rx_worker_conn_put (px->ws, w, conn);
        rx_worker_attempt_end (px->ws, w, 0, now);
        rx_log (p->headers_sent ? RX_LOG_WARN : RX_LOG_DEBUG, "%s %s", p->uri, p->why);
        if (p->headers_sent) s_stream_abort (p, p->why);
        else s_retry_or_fail (p);
        return;
    }
    if (p->discard && s_bogus_status (code)) {
        snprintf (p->why, sizeof p->why, "worker %s answered an invalid status line (code %d)", w->url, code);
        p->last_status = 0;                        /* the final error is ours: 502 */
        rx_worker_conn_put (px->ws, w, conn);
        rx_worker_attempt_end (px->ws, w, 0, now);
        rx_log (RX_LOG_WARN, "%s %s", p->uri, p->why);
        s_retry_or_fail (p);
        return;
    }
    if (p->discard) {
        snprintf (p->why, sizeof p->why, "worker %s answered HTTP %d", w->url, code);
        p->last_status = code;
        const char *ct = evhttp_find_header (evhttp_request_get_input_headers (up), "Content-Type");
        snprintf (p->last_ctype, sizeof p->last_ctype, "%s", ct ? ct : "");
        evbuffer_drain (p->last_body, evbuffer_get_length (p->last_body));
        struct evbuffer *in = evhttp_request_get_input_buffer (up);
        if (evbuffer_get_length (in) <= S_LAST_BODY_MAX) evbuffer_add_buffer (p->last_body, in);
        rx_worker_conn_put (px->ws, w, conn);
        rx_worker_attempt_end (px->ws, w, 0, now);
        rx_debug ("%s %s", p->uri, p->why);
        s_retry_or_fail (p);
        return;
    }
    int ok = !s_retryable (code) && code < 500;
    rx_worker_conn_put (px->ws, w, conn);
    rx_worker_attempt_end (px->ws, w, ok, now);
    struct evhttp_request *c = p->client;
    if (c) {
        s_detach_client (p);
        if (p->headers_sent) {
            evhttp_send_reply_end (c);
        } else {
            s_copy_headers (up, c);
            const char *line = evhttp_request_get_response_code_line (up);
            s_track (px, c);
            evhttp_send_reply (c, code, line && *line ? line : s_reason (code), evhttp_request_get_input_buffer (up));
            s_count (px, code);
        }
    }
    p->client = NULL;
    s_finish (p, code);
}

static void s_nodelay (struct evhttp_connection *conn)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent (conn);
    evutil_socket_t fd = bev ? bufferevent_getfd (bev) : -1;
    int one = 1;
    if (fd >= 0) setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void s_attempt (struct s_req *p)
{
    rx_proxy_t *px = p->px;
    if (!p->client) {
        s_finish (p, 0);
        return;
    }
    double now = s_now ();
    size_t n = s_candidates (px, p, now);
    if (n == 0) {
        s_fail_final (p, 1);
        return;
    }
    size_t chosen = 0;
    int decision = RX_ROUTE_PLAIN;
    if (!p->first_eligible) {
        /* also with one candidate: a policy that remembers records it */
        struct rx_err err = { 0 };
        if (rx_rpolicy_pick (px->rp, p->key, p->klen, px->cand, n, s_rand (px), &chosen, &decision, &err) != RX_OK) {
            rx_error ("%s (sending the request to the first candidate)", err.msg);
            chosen = 0;
            decision = RX_ROUTE_PLAIN;
        }
    }
    if (!p->first_eligible) px->decisions[decision]++;
    struct rx_worker *w = px->cand_w[chosen];
    struct evhttp_connection *conn = rx_worker_conn_get (px->ws, w);
    struct evhttp_request *up = conn ? evhttp_request_new (s_on_up_done, p) : NULL;
    if (!up) {
        if (conn) rx_worker_conn_put (px->ws, w, conn);
        s_fail (p, 500, "internal_error", "out of memory");
        return;
    }
    evhttp_request_set_header_cb (up, s_on_up_headers);
    evhttp_request_set_chunked_cb (up, s_on_up_chunk);
    evhttp_request_set_error_cb (up, s_on_up_error);
    struct evkeyvalq *oh = evhttp_request_get_output_headers (up);
    struct evkeyvalq *ih = evhttp_request_get_input_headers (p->client);
    evhttp_add_header (oh, "Host", w->host_hdr);
    const char *v;
    if (p->body_len || p->method == EVHTTP_REQ_POST) {
        v = evhttp_find_header (ih, "Content-Type");
        evhttp_add_header (oh, "Content-Type", v ? v : "application/json");
        evbuffer_add (evhttp_request_get_output_buffer (up), p->body, p->body_len);
    }
    if ((v = evhttp_find_header (ih, "Authorization"))) evhttp_add_header (oh, "Authorization", v);
    if ((v = evhttp_find_header (ih, "Accept"))) evhttp_add_header (oh, "Accept", v);
    if ((v = evhttp_find_header (ih, "X-Request-Id"))) evhttp_add_header (oh, "X-Request-Id", v);
    p->tried[p->attempts < S_MAX_ATTEMPTS ? p->attempts : S_MAX_ATTEMPTS - 1] = w->id;
    p->attempts++;
    p->w = w;
    p->conn = conn;
    p->up = up;
    p->discard = 0;
    p->up_err = -1;
    rx_worker_attempt_begin (px->ws, w);
    struct bufferevent *bev = evhttp_connection_get_bufferevent (conn);
    int fresh = !bev || bufferevent_getfd (bev) < 0;
    p->in_make = 1;
    p->sync_done = 0;
    int rc = evhttp_make_request (conn, up, p->method, p->uri);
    p->in_make = 0;
    if (rc == 0 && !p->sync_done) {
        if (fresh) {
            s_nodelay (conn);
            struct timeval tv = s_tv (px->s->health_timeout);
            evtimer_add (p->ev_backoff, &tv);
        }
        return;
    }
    /* The connection failed at once (libevent already freed up). */
    p->up = NULL;
    p->w = NULL;
    p->conn = NULL;
    snprintf (p->why, sizeof p->why, "worker %s: cannot connect", w->url);
    rx_worker_conn_put (px->ws, w, conn);
    rx_worker_attempt_end (px->ws, w, 0, s_now ());
    s_retry_or_fail (p);
}

/* ev_backoff does two jobs that never overlap: between attempts it starts
 * the next one; during an attempt on a fresh connection it checks, after
 * health_check_timeout, that the connection was made -- a worker whose host
 * drops packets would otherwise hold the request until request_timeout. */
static void s_on_backoff (evutil_socket_t fd, short what, void *arg)
{
    struct s_req *p = arg;
    if (!p->up) {
        s_attempt (p);
        return;
    }
    struct bufferevent *bev = evhttp_connection_get_bufferevent (p->conn);
    evutil_socket_t sfd = bev ? bufferevent_getfd (bev) : -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (sfd >= 0 && getpeername (sfd, (struct sockaddr *) &ss, &sl) == 0) return;   /* connected */
    rx_proxy_t *px = p->px;
    struct evhttp_request *up = p->up;
    struct rx_worker *w = p->w;
    struct evhttp_connection *conn = p->conn;
    p->up = NULL;
    p->w = NULL;
    p->conn = NULL;
    evhttp_cancel_request (up);
    snprintf (p->why, sizeof p->why, "worker %s: no connection within %g s ([router] health_check_timeout)", w->url,
              px->s->health_timeout);
    rx_warn ("%s %s", p->uri, p->why);
    rx_worker_conn_put (px->ws, w, conn);
    rx_worker_attempt_end (px->ws, w, 0, s_now ());
    s_retry_or_fail (p);
}

/* Cancel the attempt in flight (client gone, timeout, shutdown): not the
 * worker's fault, so its breaker does not hear of it. */
static void s_cancel_attempt (struct s_req *p)
{
    rx_proxy_t *px = p->px;
    if (!p->up) return;
    struct evhttp_request *up = p->up;
    struct rx_worker *w = p->w;
    struct evhttp_connection *conn = p->conn;
    p->up = NULL;
    p->w = NULL;
    p->conn = NULL;
    evtimer_del (p->ev_backoff);
    evhttp_cancel_request (up);
    rx_worker_conn_put (px->ws, w, conn);
    rx_worker_attempt_end (px->ws, w, -1, s_now ());
}

static void s_on_timeout (evutil_socket_t fd, short what, void *arg)
{
    struct s_req *p = arg;
    rx_proxy_t *px = p->px;
    px->timeouts++;
    s_cancel_attempt (p);
    char why[160];
    snprintf (why, sizeof why, "the request did not finish within %g s ([server] request_timeout)",
              px->s->request_timeout);
    rx_warn ("%s: %s", p->uri ? p->uri : "request", why);
    s_fail (p, 504, "timeout", why);
}

static void s_on_client_close (struct evhttp_connection *conn, void *arg)
{
    struct s_req *p = arg;
    rx_proxy_t *px = p->px;
    struct evhttp_request *req = p->client;
    p->client = NULL;
    px->client_gone++;
    rx_debug ("client of %s went away: cancelling its request", p->uri ? p->uri : "request");
    s_cancel_attempt (p);
    /* A request libevent has detached from the connection is ours to end
     * (that frees it); an attached one libevent frees after this call. */
    if (req && !evhttp_request_get_connection (req)) {
        if (p->headers_sent) evhttp_send_reply_end (req);
        else evhttp_send_reply (req, 499, "Client Closed Request", NULL);
    }
    if (!p->headers_sent) s_count (px, 499);
    s_finish (p, 499);
    (void) conn;
}

static void s_activate (rx_proxy_t *px, struct s_req *p)
{
    p->active = 1;
    p->prev = NULL;
    p->next = px->active;
    if (px->active) px->active->prev = p;
    px->active = p;
    px->n_active++;
    s_attempt (p);
}

static void s_on_pump (evutil_socket_t fd, short what, void *arg)
{
    rx_proxy_t *px = arg;
    while (px->queue_head && px->n_active < (size_t) px->s->max_concurrent) {
        struct s_req *p = px->queue_head;
        px->queue_head = p->next;
        if (px->queue_head) px->queue_head->prev = NULL;
        else px->queue_tail = NULL;
        p->next = p->prev = NULL;
        p->queued = 0;
        px->n_queued--;
        s_activate (px, p);
    }
}

static void s_proxy (rx_proxy_t *px, struct evhttp_request *req, int kind, int first_eligible)
{
    struct s_req *p = s_req_get (px);
    if (!p) {
        s_reply_error (px, req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    p->client = req;
    p->kind = kind;
    p->first_eligible = first_eligible;
    p->method = evhttp_request_get_command (req);
    p->uri = evhttp_request_get_uri (req);
    p->t0 = s_now ();
    struct evbuffer *in = evhttp_request_get_input_buffer (req);
    p->body_len = evbuffer_get_length (in);
    p->body = p->body_len ? evbuffer_pullup (in, -1) : (const unsigned char *) "";
    if (p->body_len && !p->body) {
        s_reply_error (px, req, 500, "internal_error", NULL, "out of memory");
        s_req_put (px, p);
        return;
    }
    struct rx_api_error e;
    int rc = rx_routekey_extract (kind, (const char *) p->body, p->body_len, &p->keybuf, &p->key, &p->klen, &e);
    if (rc != RX_OK) {
        if (rc == RX_ENOMEM) rx_api_error_set (&e, 500, "internal_error", NULL, "out of memory");
        s_reply_api_error (px, req, &e);
        s_req_put (px, p);
        return;
    }
    if (!s_any_up (px)) {
        s_reply_error (px, req, 503, "no_healthy_worker", NULL, "no healthy worker (%zu configured)",
                       rx_workers_count (px->ws));
        s_req_put (px, p);
        return;
    }
    if (px->n_active >= (size_t) px->s->max_concurrent) {
        if (px->n_queued >= (size_t) px->s->max_queued) {
            s_reply_error (px, req, 429, "queue_full", NULL,
                           "too many requests: %zu in flight and %zu queued ([router] max_concurrent_requests, max_queued_requests)",
                           px->n_active, px->n_queued);
            s_req_put (px, p);
            return;
        }
    }
    struct evhttp_connection *conn = evhttp_request_get_connection (req);
    if (conn) evhttp_connection_set_closecb (conn, s_on_client_close, p);
    struct timeval tv = s_tv (px->s->request_timeout);
    evtimer_add (p->ev_timeout, px->ctimeout ? px->ctimeout : &tv);
    if (px->n_active < (size_t) px->s->max_concurrent && !px->queue_head) {
        s_activate (px, p);
        return;
    }
    p->queued = 1;
    p->next = NULL;
    p->prev = px->queue_tail;
    if (px->queue_tail) px->queue_tail->next = p;
    else px->queue_head = p;
    px->queue_tail = p;
    px->n_queued++;
    event_active (px->ev_pump, EV_TIMEOUT, 0);
}

/* ------------------------------------------------------------ own endpoints */

static json_t *s_worker_json (rx_proxy_t *px, struct rx_worker *w)
{
    return json_pack ("{s:s, s:b, s:I, s:I, s:s, s:i, s:i, s:I, s:I}", "url", w->url, "healthy", w->healthy,
                      "load", (json_int_t) w->load, "tree_size", (json_int_t) rx_rpolicy_size (px->rp, w->id),
                      "breaker", rx_breaker_name (w->breaker), "consecutive_failures", w->hc_failures,
                      "breaker_failures", w->br_failures, "requests", (json_int_t) w->n_requests, "failures",
                      (json_int_t) w->n_failures);
}

static void s_ep_health (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    size_t n = rx_workers_count (px->ws), up = 0;
    for (size_t i = 0; i < n; i++) up += rx_worker_up (rx_workers_at (px->ws, i));
    if (!up) {
        s_reply_error (px, req, 503, "no_healthy_worker", NULL, "no healthy worker (%zu configured)", n);
        return;
    }
    s_reply_json (px, req, 200, json_pack ("{s:s, s:I, s:I}", "status", "ok", "healthy_workers", (json_int_t) up,
                                           "workers", (json_int_t) n));
}

static void s_ep_workers_get (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    json_t *a = json_array ();
    size_t n = rx_workers_count (px->ws);
    for (size_t i = 0; a && i < n; i++) json_array_append_new (a, s_worker_json (px, rx_workers_at (px->ws, i)));
    s_reply_json (px, req, 200, json_pack ("{s:o, s:s}", "workers", a, "policy", rx_rpolicy_name (px->rp)));
}

static void s_ep_list_workers (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    json_t *a = json_array ();
    size_t n = rx_workers_count (px->ws);
    for (size_t i = 0; a && i < n; i++) json_array_append_new (a, json_string (rx_workers_at (px->ws, i)->url));
    s_reply_json (px, req, 200, json_pack ("{s:o}", "urls", a));
}

static void s_admin_reply (struct s_admin *a)
{
    rx_proxy_t *px = a->px;
    struct evhttp_request *req = a->client;
    if (req) {
        struct evhttp_connection *c = evhttp_request_get_connection (req);
        if (c) evhttp_connection_set_closecb (c, NULL, NULL);
        struct rx_worker *w = a->w;
        if (a->legacy) {
            char msg[RX_WORKER_URL_MAX + 64];
            snprintf (msg, sizeof msg, "Successfully added worker: %s%s\n", w->url,
                      w->removed ? " (removed since)" : w->healthy ? "" : " (not healthy yet)");
            s_reply (px, req, 200, "text/plain", msg);
        } else {
            s_reply_json (px, req, 201, s_worker_json (px, w));
        }
    }
    if (a->prev) a->prev->next = a->next;
    else px->admins = a->next;
    if (a->next) a->next->prev = a->prev;
    free (a);
}

static void s_on_admin_checked (void *arg, struct rx_worker *w)
{
    struct s_admin *a = arg;
    if (a->in_add) {
        a->done = 1;
        return;
    }
    s_admin_reply (a);
}

static void s_on_admin_close (struct evhttp_connection *conn, void *arg)
{
    struct s_admin *a = arg;
    struct evhttp_request *req = a->client;
    a->client = NULL;
    if (req && !evhttp_request_get_connection (req)) evhttp_send_reply (req, 499, "Client Closed Request", NULL);
}

static void s_add_worker (rx_proxy_t *px, struct evhttp_request *req, const char *url, int legacy)
{
    char norm[RX_WORKER_URL_MAX];
    struct rx_err err = { 0 };
    if (!url || rx_worker_url_normalize (url, norm, sizeof norm, &err) != RX_OK) {
        s_reply_error (px, req, 400, "invalid_value", "url", "%s", url ? err.msg : "missing \"url\"");
        return;
    }
    if (rx_workers_find (px->ws, norm)) {
        s_reply_error (px, req, 409, "worker_exists", "url", "worker %s is already present", norm);
        return;
    }
    struct s_admin *a = calloc (1, sizeof *a);
    if (!a) {
        s_reply_error (px, req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    a->px = px;
    a->client = req;
    a->legacy = legacy;
    a->in_add = 1;
    a->next = px->admins;
    if (px->admins) px->admins->prev = a;
    px->admins = a;
    int rc = rx_workers_add (px->ws, norm, s_on_admin_checked, a, &a->w, &err);
    a->in_add = 0;
    if (rc != RX_OK) {
        a->client = NULL;
        s_admin_reply (a);
        s_reply_error (px, req, rc == RX_EAGAIN ? 409 : rc == RX_EINVAL ? 400 : 500,
                       rc == RX_EAGAIN ? "worker_exists" : rc == RX_EINVAL ? "invalid_value" : "internal_error",
                       "url", "%s", err.msg);
        return;
    }
    if (a->done) {
        s_admin_reply (a);
        return;
    }
    struct evhttp_connection *c = evhttp_request_get_connection (req);
    if (c) evhttp_connection_set_closecb (c, s_on_admin_close, a);
}

static void s_remove_worker (rx_proxy_t *px, struct evhttp_request *req, const char *url, int legacy)
{
    struct rx_err err = { 0 };
    char norm[RX_WORKER_URL_MAX];
    if (!url || rx_worker_url_normalize (url, norm, sizeof norm, &err) != RX_OK) {
        /* A URL we could never have added is simply not there. */
        s_reply_error (px, req, 404, "worker_not_found", "url", "no worker %s", url ? url : "(missing url)");
        return;
    }
    if (rx_workers_remove (px->ws, norm, &err) != RX_OK) {
        s_reply_error (px, req, 404, "worker_not_found", "url", "no worker %s", norm);
        return;
    }
    if (legacy) {
        char msg[RX_WORKER_URL_MAX + 64];
        snprintf (msg, sizeof msg, "Successfully removed worker: %s\n", norm);
        s_reply (px, req, 200, "text/plain", msg);
    } else {
        s_reply_json (px, req, 200, json_pack ("{s:s}", "removed", norm));
    }
}

static void s_ep_workers_post (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    struct evbuffer *in = evhttp_request_get_input_buffer (req);
    size_t len = evbuffer_get_length (in);
    const char *body = len ? (const char *) evbuffer_pullup (in, -1) : "";
    json_error_t jerr;
    json_t *o = json_loadb (body ? body : "", len, 0, &jerr);
    if (!o || !json_is_object (o)) {
        json_decref (o);
        s_reply_error (px, req, 400, "invalid_json", NULL, "expected a JSON object {\"url\": \"http://HOST:PORT\"}");
        return;
    }
    json_t *u = json_object_get (o, "url");
    if (!json_is_string (u)) {
        json_decref (o);
        s_reply_error (px, req, 400, u ? "invalid_type" : "missing_required_parameter", "url",
                       "\"url\" must be a string: http://HOST:PORT");
        return;
    }
    s_add_worker (px, req, json_string_value (u), 0);
    json_decref (o);
}

static void s_ep_workers_delete (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    const char *enc = path + strlen ("/workers/");
    char *url = evhttp_uridecode (enc, 0, NULL);
    if (!url) {
        s_reply_error (px, req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    s_remove_worker (px, req, url, 0);
    free (url);
}

static char *s_query_url (struct evhttp_request *req)
{
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri (req);
    const char *q = u ? evhttp_uri_get_query (u) : NULL;
    struct evkeyvalq kv = { 0 };
    if (!q || evhttp_parse_query_str (q, &kv) != 0) return NULL;
    const char *v = evhttp_find_header (&kv, "url");
    char *r = v ? strdup (v) : NULL;
    evhttp_clear_headers (&kv);
    return r;
}

static void s_ep_add_worker (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    char *url = s_query_url (req);
    s_add_worker (px, req, url, 1);
    free (url);
}

static void s_ep_remove_worker (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    char *url = s_query_url (req);
    s_remove_worker (px, req, url, 1);
    free (url);
}

/* Prometheus label values: \ " and newline escaped. */
static void s_label (char *out, size_t n, const char *v)
{
    size_t k = 0;
    for (; *v && k + 3 < n; v++) {
        if (*v == '\\' || *v == '"') out[k++] = '\\';
        if (*v == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
            continue;
        }
        out[k++] = *v;
    }
    out[k] = '\0';
}

static void s_ep_metrics (rx_proxy_t *px, struct evhttp_request *req, const char *path)
{
    char *b = NULL;
    size_t len = 0, cap = 0;
    int bad = 0;
#define P(...) bad |= rx_strbuf_printf (&b, &len, &cap, __VA_ARGS__)
    P ("# HELP radix_router_requests_total Requests answered by the router, by HTTP status\n"
       "# TYPE radix_router_requests_total counter\n");
    for (int st = 100; st < 600; st++)
        if (px->status_count[st]) P ("radix_router_requests_total{status=\"%d\"} %llu\n", st,
                                     (unsigned long long) px->status_count[st]);
    bad |= rx_hist_render (&px->duration, &b, &len, &cap);
    P ("# HELP radix_router_retries_total Retries of a request on another worker\n"
       "# TYPE radix_router_retries_total counter\nradix_router_retries_total %llu\n",
       (unsigned long long) px->retries);
    P ("# HELP radix_router_timeouts_total Requests ended by request_timeout\n"
       "# TYPE radix_router_timeouts_total counter\nradix_router_timeouts_total %llu\n",
       (unsigned long long) px->timeouts);
    P ("# HELP radix_router_client_disconnects_total Requests whose client went away first\n"
       "# TYPE radix_router_client_disconnects_total counter\nradix_router_client_disconnects_total %llu\n",
       (unsigned long long) px->client_gone);
    static const char *const dn[4] = { "plain", "cache_hit", "cache_miss", "balance" };
    P ("# HELP radix_router_route_decisions_total Policy decisions (cache_aware: hit, miss, balance)\n"
       "# TYPE radix_router_route_decisions_total counter\n");
    for (int i = 0; i < 4; i++)
        P ("radix_router_route_decisions_total{decision=\"%s\"} %llu\n", dn[i], (unsigned long long) px->decisions[i]);
    P ("# HELP radix_router_requests_in_flight Requests being proxied\n"
       "# TYPE radix_router_requests_in_flight gauge\nradix_router_requests_in_flight %zu\n", px->n_active);
    P ("# HELP radix_router_queued_requests Requests waiting for a slot\n"
       "# TYPE radix_router_queued_requests gauge\nradix_router_queued_requests %zu\n", px->n_queued);
    size_t n = rx_workers_count (px->ws);
    static const char *const names[] = { "radix_router_worker_load", "radix_router_worker_healthy",
                                         "radix_router_breaker_state", "radix_router_tree_size",
                                         "radix_router_worker_requests_total", "radix_router_worker_failures_total" };
    static const char *const helps[] = { "Requests in flight on the worker", "1 when the worker passes its health checks",
                                         "Circuit breaker: 0 closed, 1 open, 2 half-open",
                                         "Size of what the policy keeps for the worker (cache_aware: tree characters)",
                                         "Attempts sent to the worker", "Attempts that failed on the worker" };
    for (int m = 0; m < 6; m++) {
        P ("# HELP %s %s\n# TYPE %s %s\n", names[m], helps[m], names[m], m >= 4 ? "counter" : "gauge");
        for (size_t i = 0; i < n; i++) {
            struct rx_worker *w = rx_workers_at (px->ws, i);
            char lab[2 * RX_WORKER_URL_MAX];
            s_label (lab, sizeof lab, w->url);
            unsigned long long v = m == 0 ? w->load : m == 1 ? (unsigned long long) w->healthy
                                 : m == 2 ? (unsigned long long) w->breaker
                                 : m == 3 ? rx_rpolicy_size (px->rp, w->id)
                                 : m == 4 ? w->n_requests : w->n_failures;
            P ("%s{worker=\"%s\"} %llu\n", names[m], lab, v);
        }
    }
#undef P
    if (bad) {
        free (b);
        s_reply_error (px, req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    s_reply (px, req, 200, "text/plain; version=0.0.4", b);
    free (b);
}

/* ------------------------------------------------------------ dispatch */

enum { S_OPEN = 1, S_PREFIX = 2, S_ADMIN = 4 };

struct s_route {
    const char *path;
    enum evhttp_cmd_type method;
    int kind;              /* RX_ROUTEKEY_* for proxied ones, -1 for our own */
    void (*fn) (rx_proxy_t *, struct evhttp_request *, const char *);
    int flags;
};

static const struct s_route s_routes[] = {
    { "/generate", EVHTTP_REQ_POST, RX_ROUTEKEY_GENERATE, NULL, 0 },
    { "/v1/completions", EVHTTP_REQ_POST, RX_ROUTEKEY_COMPLETIONS, NULL, 0 },
    { "/v1/chat/completions", EVHTTP_REQ_POST, RX_ROUTEKEY_CHAT, NULL, 0 },
    { "/v1/models", EVHTTP_REQ_GET, RX_ROUTEKEY_NONE, NULL, 0 },
    { "/health", EVHTTP_REQ_GET, -1, s_ep_health, S_OPEN },
    { "/metrics", EVHTTP_REQ_GET, -1, s_ep_metrics, 0 },
    { "/workers", EVHTTP_REQ_GET, -1, s_ep_workers_get, 0 },
    { "/workers", EVHTTP_REQ_POST, -1, s_ep_workers_post, S_ADMIN },
    { "/workers/", EVHTTP_REQ_DELETE, -1, s_ep_workers_delete, S_PREFIX | S_ADMIN },
    { "/add_worker", EVHTTP_REQ_POST, -1, s_ep_add_worker, S_ADMIN },
    { "/remove_worker", EVHTTP_REQ_POST, -1, s_ep_remove_worker, S_ADMIN },
    { "/list_workers", EVHTTP_REQ_GET, -1, s_ep_list_workers, 0 },
    { NULL, 0, 0, NULL, 0 }
};

static int s_path_match (const struct s_route *r, const char *path)
{
    if (r->flags & S_PREFIX) {
        size_t n = strlen (r->path);
        return !strncmp (path, r->path, n) && path[n];
    }
    return !strcmp (path, r->path);
}

static const char *s_method_name (enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_DELETE: return "DELETE";
    default: return "?";
    }
}

/* Bytes of the request line's URI and the header lines, as sent (what
 * [server] max_header_size bounds). */
static size_t s_header_bytes (struct evhttp_request *req)
{
    const char *uri = evhttp_request_get_uri (req);
    size_t n = uri ? strlen (uri) + 16 : 16;
    for (struct evkeyval *h = evhttp_request_get_input_headers (req)->tqh_first; h; h = h->next.tqe_next)
        n += strlen (h->key) + strlen (h->value) + 4;
    return n;
}

static void s_on_request (struct evhttp_request *req, void *arg)
{
    rx_proxy_t *px = arg;
    if (s_header_bytes (req) > px->s->max_header_size) {
        s_reply_error (px, req, 431, "request_header_fields_too_large", NULL,
                       "request line and headers over %llu bytes ([server] max_header_size)",
                       (unsigned long long) px->s->max_header_size);
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri (req);
    const char *path = uri ? evhttp_uri_get_path (uri) : NULL;
    enum evhttp_cmd_type method = evhttp_request_get_command (req);
    if (!path || !*path) path = "/";
    const struct s_route *r = NULL;
    int path_known = 0;
    for (const struct s_route *x = s_routes; x->path; x++) {
        if (!s_path_match (x, path)) continue;
        path_known = 1;
        if (x->method == method) {
            r = x;
            break;
        }
    }
    if (!path_known) {
        s_reply_error (px, req, 404, "not_found", NULL, "no such endpoint: %s", path);
        return;
    }
    if (!r) {
        char allow[64] = "";
        for (const struct s_route *x = s_routes; x->path; x++)
            if (s_path_match (x, path))
                snprintf (allow + strlen (allow), sizeof allow - strlen (allow), "%s%s", allow[0] ? ", " : "",
                          s_method_name (x->method));
        evhttp_add_header (evhttp_request_get_output_headers (req), "Allow", allow);
        s_reply_error (px, req, 405, "method_not_allowed", NULL, "%s does not accept this method", path);
        return;
    }
    const char *why = NULL;
    int level = (r->flags & S_OPEN) ? RX_AUTH_OPEN : (r->flags & S_ADMIN) ? RX_AUTH_ADMIN : RX_AUTH_API;
    int denied = rx_auth_check (px->s->api_key, px->s->admin_key, level,
                                evhttp_find_header (evhttp_request_get_input_headers (req), "Authorization"), &why);
    if (denied) {
        if (denied == 401) evhttp_add_header (evhttp_request_get_output_headers (req), "WWW-Authenticate", "Bearer");
        s_reply_error (px, req, denied, denied == 401 ? "invalid_api_key" : "admin_key_required", NULL, "%s", why);
        return;
    }
    if (evbuffer_get_length (evhttp_request_get_input_buffer (req)) > px->s->max_body_size) {
        s_reply_error (px, req, 413, "request_too_large", NULL, "request body over %llu bytes ([server] max_body_size)",
                       (unsigned long long) px->s->max_body_size);
        return;
    }
    if (px->draining && r->fn != s_ep_health && r->fn != s_ep_metrics) {
        s_reply_error (px, req, 503, "shutting_down", NULL, "the router is shutting down");
        return;
    }
    if (r->fn) r->fn (px, req, path);
    else s_proxy (px, req, r->kind, r->kind == RX_ROUTEKEY_NONE);
}

/* ------------------------------------------------------------ housekeeping */

/* libevent notices a closed client connection only when it writes to it;
 * a client that gives up on a request still waiting for its worker's first
 * byte would be noticed only then.  Peek at those sockets instead: readable
 * with nothing to read is closed. */
static void s_check_disconnects (rx_proxy_t *px, struct s_req *list)
{
    struct s_req *next;
    for (struct s_req *p = list; p; p = next) {
        next = p->next;
        if (!p->client || p->headers_sent) continue;
        struct evhttp_connection *c = evhttp_request_get_connection (p->client);
        struct bufferevent *bev = c ? evhttp_connection_get_bufferevent (c) : NULL;
        evutil_socket_t fd = bev ? bufferevent_getfd (bev) : -1;
        if (fd < 0) continue;
        char ch;
        ssize_t k = recv (fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            evhttp_connection_free (c);   /* s_on_client_close ends p */
    }
}

static void s_on_tick (evutil_socket_t fd, short what, void *arg)
{
    rx_proxy_t *px = arg;
    double now = s_now ();
    s_check_disconnects (px, px->active);
    s_check_disconnects (px, px->queue_head);
    if (now - px->last_policy_tick >= 1.0) {
        px->last_policy_tick = now;
        rx_rpolicy_tick (px->rp, now);
    }
}

static void s_end_all (rx_proxy_t *px, const char *why)
{
    while (px->queue_head || px->active) {
        struct s_req *p = px->queue_head ? px->queue_head : px->active;
        s_cancel_attempt (p);
        s_fail (p, 503, "shutting_down", why);
    }
}

static void s_on_drain (evutil_socket_t fd, short what, void *arg)
{
    rx_proxy_t *px = arg;
    if (px->n_active || px->n_queued) {
        rx_warn ("shutdown: ending %zu request(s) still in flight", px->n_active + px->n_queued);
        s_end_all (px, "the router is shutting down");
    }
    event_base_loopexit (px->base, NULL);
}

void rx_proxy_drain (rx_proxy_t *px)
{
    if (px->draining) {
        rx_warn ("second signal: ending every request now");
        px->draining = 2;
        event_active (px->ev_drain, EV_TIMEOUT, 0);
        return;
    }
    px->draining = 1;
    if (px->listener) {
        evhttp_del_accept_socket (px->http, px->listener);
        px->listener = NULL;
    }
    rx_info ("draining %zu request(s) (up to %g s), accepting no more", px->n_active + px->n_queued,
             px->s->shutdown_timeout);
    struct timeval tv = s_tv (px->s->shutdown_timeout);
    evtimer_add (px->ev_drain, &tv);
    s_drain_check (px);
}

/* ------------------------------------------------------------ lifecycle */

rx_proxy_t *rx_proxy_new (struct event_base *base, const struct rx_router_settings *s, rx_workers_t *ws,
                          rx_rpolicy_t *rp, struct rx_err *err)
{
    rx_proxy_t *px = calloc (1, sizeof *px);
    if (!px) {
        rx_err_set (err, RX_ENOMEM, "out of memory");
        return NULL;
    }
    px->base = base;
    px->s = s;
    px->ws = ws;
    px->rp = rp;
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    px->seed = (uint64_t) ts.tv_nsec ^ ((uint64_t) ts.tv_sec << 20) ^ (uint64_t) getpid ();
    static const double bounds[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1, 2.5, 5, 10, 30, 60, 120, 300, 600 };
    rx_hist_init (&px->duration, "radix_router_request_duration_seconds",
                  "Time from a request's arrival at the router to the end of its answer", bounds,
                  sizeof bounds / sizeof *bounds);
    px->ev_tick = event_new (base, -1, EV_PERSIST, s_on_tick, px);
    px->ev_pump = event_new (base, -1, 0, s_on_pump, px);
    px->ev_drain = evtimer_new (base, s_on_drain, px);
    struct timeval rt = s_tv (s->request_timeout);
    px->ctimeout = event_base_init_common_timeout (base, &rt);
    px->http = evhttp_new (base);
    if (!px->ev_tick || !px->ev_pump || !px->ev_drain || !px->http) {
        rx_err_set (err, RX_ENOMEM, "out of memory");
        rx_proxy_destroy (&px);
        return NULL;
    }
    struct timeval tick = { 0, 500000 };
    event_add (px->ev_tick, &tick);
    evhttp_set_allowed_methods (px->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_HEAD |
                                EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH);
    /* libevent refuses (its own 413 page) only far beyond the limit; up to
     * that the handler answers an OpenAI-style 413. */
    evhttp_set_max_body_size (px->http, (ev_ssize_t) (s->max_body_size * 2 + 65536));
    /* the handler answers 431 up to twice the limit; beyond, libevent
     * answers 400 and closes the connection */
    evhttp_set_max_headers_size (px->http, (ev_ssize_t) (s->max_header_size * 2 + 8192));
    evhttp_set_timeout (px->http, (int) ceil (s->request_timeout) + 5);
    evhttp_set_gencb (px->http, s_on_request, px);
    return px;
}

int rx_proxy_listen (rx_proxy_t *px, struct rx_err *err)
{
    const struct rx_router_settings *s = px->s;
    struct addrinfo hints = { 0 }, *res = NULL;
    char port[16];
    snprintf (port, sizeof port, "%d", s->port);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo (s->host, port, &hints, &res);
    if (rc != 0)
        return rx_err_set (err, RX_ECONFIG, "cannot listen on %s:%d: %s ([server] host)", s->host, s->port,
                           gai_strerror (rc));
    int fd = socket (res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) {
        setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* accepted sockets inherit it: SSE chunks go out at once */
        setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (fd < 0 || bind (fd, res->ai_addr, res->ai_addrlen) != 0 || listen (fd, 1024) != 0) {
        int e = errno;
        if (fd >= 0) close (fd);
        freeaddrinfo (res);
        return rx_err_set (err, RX_EIO, "cannot listen on %s:%d: %s ([server] host/port)", s->host, s->port,
                           strerror (e));
    }
    freeaddrinfo (res);
    px->listener = evhttp_accept_socket_with_handle (px->http, fd);
    if (!px->listener) {
        close (fd);
        return rx_err_set (err, RX_EIO, "cannot serve on %s:%d", s->host, s->port);
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int p = s->port;
    if (getsockname (fd, (struct sockaddr *) &ss, &sl) == 0)
        p = ntohs (ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *) &ss)->sin6_port
                                            : ((struct sockaddr_in *) &ss)->sin_port);
    snprintf (px->url, sizeof px->url, strchr (s->host, ':') ? "http://[%s]:%d" : "http://%s:%d", s->host, p);
    return RX_OK;
}

const char *rx_proxy_url (const rx_proxy_t *px) { return px->url; }

void rx_proxy_destroy (rx_proxy_t **self_p)
{
    rx_proxy_t *px = self_p ? *self_p : NULL;
    if (!px) return;
    s_end_all (px, "the router is shutting down");
    while (px->admins) {
        struct s_admin *a = px->admins;
        px->admins = a->next;
        free (a);
    }
    if (px->http) evhttp_free (px->http);
    while (px->free_list) {
        struct s_req *p = px->free_list;
        px->free_list = p->next;
        s_req_free_mem (p);
    }
    if (px->ev_tick) event_free (px->ev_tick);
    if (px->ev_pump) event_free (px->ev_pump);
    if (px->ev_drain) event_free (px->ev_drain);
    free (px->cand);
    free (px->cand_w);
    free (px);
    *self_p = NULL;
}
