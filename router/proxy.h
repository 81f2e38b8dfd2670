/* router/proxy.h -- radix-router's HTTP side: the evhttp server, proxying
 * to the workers over pooled keep-alive evhttp connections, retries,
 * limits, the admin and metrics endpoints.
 *
 * A proxied request (POST /generate, /v1/completions, /v1/chat/completions;
 * GET /v1/models):
 *   1. API key (401), body size (413), JSON object (400: no worker is
 *      touched), routing key (router/routekey.h);
 *   2. no worker can take traffic -> 503; max_concurrent_requests in flight
 *      -> it waits in a FIFO of max_queued_requests; that full -> 429;
 *   3. the policy picks among the eligible workers not yet tried for it
 *      (GET /v1/models: the first eligible worker); the body goes out on an
 *      idle keep-alive connection of that worker;
 *   4. the worker's answer: a stream (text/event-stream, or no
 *      Content-Length) is passed through chunk by chunk as it arrives; a
 *      plain answer is forwarded whole with its Content-Length;
 *   5. a connect failure, a dropped connection, or a 408/429/500/502/503/504
 *      before anything went to the client -> the attempt failed (counts
 *      for the breaker, drops the worker's cache affinity), and after a
 *      backoff (retry_backoff doubled per retry, with jitter, at most
 *      retry_backoff_max) another worker is tried, up to max_attempts; when
 *      none is left the last worker error is forwarded as it was (or 502 /
 *      503 of our own);
 *   6. a worker failing after the stream began ends the stream with
 *      `data: {"error": {...}}` and `data: [DONE]` (SSE) or by closing the
 *      connection (anything else);
 *   7. request_timeout after arrival -> 504, or the stream ends as in 6.
 * A client that goes away cancels its upstream request (the worker then
 * sees its client gone and aborts the generation).
 *
 * Single-threaded: everything runs on the event loop of `base`. */
#ifndef RX_PROXY_H
#define RX_PROXY_H

#include <radix/err.h>

#include "route_policy.h"
#include "router_settings.h"
#include "workers.h"

struct event_base;

typedef struct rx_proxy rx_proxy_t;

/* s, ws and rp are borrowed and must outlive the proxy.  Caller owns the
 * result. */
rx_proxy_t *rx_proxy_new (struct event_base *base, const struct rx_router_settings *s, rx_workers_t *ws,
                          rx_rpolicy_t *rp, struct rx_err *err);
/* Bind [server] host:port (port 0: any free port) and start serving. */
int rx_proxy_listen (rx_proxy_t *px, struct rx_err *err);
/* "http://HOST:PORT" once listening. */
const char *rx_proxy_url (const rx_proxy_t *px);

/* SIGTERM: stop accepting, answer 503 to new requests on open connections,
 * let what is in flight finish; the loop exits when nothing is left, or
 * after shutdown_timeout (what is left is then answered 503 / its stream
 * ended).  A second call ends everything at once. */
void rx_proxy_drain (rx_proxy_t *px);

/* Ends every open request (503 / stream end) and frees everything. */
void rx_proxy_destroy (rx_proxy_t **self_p);

#endif
