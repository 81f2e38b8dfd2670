/* router/workers.h -- radix-router's table of workers: their URLs, health
 * checks, circuit breakers, in-flight counts and keep-alive connection
 * pools, and the route policy's view of them.
 *
 * Health (GET health_check_endpoint every health_check_interval, bounded by
 * health_check_timeout, on a connection of its own so that a check never
 * waits behind a long generation):
 *   - a new worker is unhealthy until its first check: a pass makes it
 *     healthy at once, a failure leaves it unhealthy;
 *   - afterwards failure_threshold consecutive failed checks mark it
 *     unhealthy and success_threshold consecutive passes healthy again.
 * Circuit breaker (fed by request outcomes, not by checks):
 *   - closed: breaker_failures consecutive failed requests open it;
 *   - open: no traffic; after breaker_timeout it is half-open;
 *   - half-open: one trial request at a time; breaker_successes consecutive
 *     successes close it, a failure opens it again.
 * A worker takes traffic ("eligible") when it is healthy and its breaker is
 * not open (half-open: no trial in flight).
 *
 * The route policy hears of a worker (worker_added) when it is first
 * eligible, and loses it (worker_removed) at once when a request to it
 * fails, when it turns unhealthy, when its breaker opens, and when it is
 * removed: its cache affinity ends then.  Once eligible again it is added
 * again under the same id.
 *
 * Removing a worker takes it out of the table at once; requests in flight
 * on it finish (the struct lives until its last attempt ends).
 *
 * Single-threaded: everything runs on the router's event loop. */
#ifndef RX_WORKERS_H
#define RX_WORKERS_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "route_policy.h"

struct event_base;
struct evhttp_connection;

enum rx_breaker_state {
    RX_BREAKER_CLOSED    = 0,
    RX_BREAKER_OPEN      = 1,
    RX_BREAKER_HALF_OPEN = 2
};

#define RX_WORKER_URL_MAX 300

struct rx_worker {
    uint32_t id;                  /* the policy's id: never reused */
    char url[RX_WORKER_URL_MAX];  /* normalised: "http://host:port" */
    char host_hdr[RX_WORKER_URL_MAX]; /* the Host header: "host:port" */
    char addr[RX_WORKER_URL_MAX];   /* numeric address connections use (or the host name) */
    uint16_t port;

    uint32_t load;                /* attempts in flight on it */
    int healthy;
    int checked;                  /* its first health check has finished */
    int hc_failures;              /* consecutive failed checks */
    int hc_successes;             /* consecutive passed checks */
    int breaker;                  /* enum rx_breaker_state */
    int br_failures;              /* consecutive failed requests */
    int br_successes;             /* consecutive successes while half-open */
    double br_opened_at;
    uint32_t probes;              /* half-open trial requests in flight */
    int in_policy;                /* the policy knows it (worker_added called) */
    int removed;                  /* out of the table; freed when load drops to 0 */
    uint64_t n_requests, n_failures;

    /* internals */
    struct evhttp_connection **idle;
    size_t n_idle, cap_idle;
    struct evhttp_connection *hc_conn;
    int hc_pending;
    void (*on_checked) (void *arg, struct rx_worker *w);
    void *on_checked_arg;
    struct rx_workers *owner;
};

typedef struct rx_workers rx_workers_t;

struct rx_workers_cfg {
    double health_interval, health_timeout;
    const char *health_endpoint;  /* copied */
    int failure_threshold, success_threshold;
    int breaker_failures, breaker_successes;
    double breaker_timeout;
    double io_timeout;            /* idle timeout of request connections (request_timeout) */
    size_t max_idle;              /* idle connections kept per worker */
};

/* policy may be NULL (tests).  Caller owns the table; base and policy must
 * outlive it. */
rx_workers_t *rx_workers_new (struct event_base *base, const struct rx_workers_cfg *cfg,
                              rx_rpolicy_t *policy, struct rx_err *err);
/* Frees every worker and connection (requests still in flight on them are
 * freed by libevent without callbacks: call after they ended). */
void rx_workers_destroy (rx_workers_t **self_p);

/* Normalise a worker URL: "http://HOST[:PORT][/]" (HOST a name, an IPv4
 * address or a bracketed IPv6 address; PORT default 80) becomes
 * "http://HOST:PORT".  Anything else (another scheme, a path, a query,
 * user info, a bad port) is RX_EINVAL with err saying what is wrong.  Pure. */
int rx_worker_url_normalize (const char *in, char *out, size_t outlen, struct rx_err *err);

/* Add a worker (url normalised here) and start its first health check at
 * once; on_checked (may be NULL) is called once when that check finished
 * (pass or fail), or when the worker is removed first (w->removed set) --
 * possibly before rx_workers_add returns.
 * RX_EINVAL: bad URL; RX_EAGAIN: already present (err says so). */
int rx_workers_add (rx_workers_t *ws, const char *url,
                    void (*on_checked) (void *arg, struct rx_worker *w), void *arg,
                    struct rx_worker **out, struct rx_err *err);
/* RX_ENOENT when no worker has that (normalised) URL. */
int rx_workers_remove (rx_workers_t *ws, const char *url, struct rx_err *err);
struct rx_worker *rx_workers_find (rx_workers_t *ws, const char *url);

size_t rx_workers_count (const rx_workers_t *ws);
struct rx_worker *rx_workers_at (rx_workers_t *ws, size_t i);
/* Workers whose first health check is still pending. */
size_t rx_workers_unchecked (const rx_workers_t *ws);

/* Can w take a request now?  Turns an open breaker half-open when its time
 * has come, and tells the policy about a worker it does not know yet. */
int rx_worker_eligible (rx_workers_t *ws, struct rx_worker *w, double now);
/* Healthy and breaker not open (for /health and metrics). */
int rx_worker_up (const struct rx_worker *w);

/* A request attempt starts on w (load + 1, a half-open trial). */
void rx_worker_attempt_begin (rx_workers_t *ws, struct rx_worker *w);
/* ... and ended: ok 1 = the worker answered usefully, 0 = it failed (its
 * breaker counts it, the policy drops its affinity), -1 = neither (the
 * client left, the request timed out).  May free a removed w: do not touch
 * w afterwards. */
void rx_worker_attempt_end (rx_workers_t *ws, struct rx_worker *w, int ok, double now);

/* A keep-alive connection to w (an idle one, else a new one); NULL when out
 * of memory.  Give it back with rx_worker_conn_put after the request on it
 * completed or was cancelled -- never from inside its header or chunk
 * callback. */
struct evhttp_connection *rx_worker_conn_get (rx_workers_t *ws, struct rx_worker *w);
void rx_worker_conn_put (rx_workers_t *ws, struct rx_worker *w, struct evhttp_connection *c);

/* Run the health checks now (also done by the table's own timer). */
void rx_workers_check_all (rx_workers_t *ws);

const char *rx_breaker_name (int state);

/* Pure state transitions, exposed for unit tests (now in seconds). */
void rx_worker_health_result (const struct rx_workers_cfg *cfg, struct rx_worker *w, int ok);
void rx_worker_breaker_result (const struct rx_workers_cfg *cfg, struct rx_worker *w, int ok,
                               double now);
/* open -> half-open when breaker_timeout has passed; returns 1 if it changed. */
int  rx_worker_breaker_poll (const struct rx_workers_cfg *cfg, struct rx_worker *w, double now);

#endif
