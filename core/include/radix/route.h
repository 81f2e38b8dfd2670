/* radix/route.h -- the routing-policy kind (RX_KIND_ROUTE_POLICY).
 *
 * ABI: since 1.1.  A routing policy picks the worker for each request:
 * radix-router uses it in front of several radixd workers (sgl-router's
 * policies), and the DP controller of a multi-rank radixd reuses it to
 * dispatch among data-parallel replicas.  The caller keeps the workers,
 * their health, circuit breakers and in-flight counts; the policy only
 * chooses among the candidates it is given and may remember what it chose
 * (cache_aware keeps an approximate radix tree of request texts per worker).
 *
 * Worker ids are the caller's: stable for the life of a worker, never
 * given to another worker while the policy instance lives.  The policy
 * hears of a worker through worker_added before it is first a candidate,
 * and of its end -- or of a failure that must drop its cache affinity --
 * through worker_removed; a worker that failed and recovered is added
 * again under the same id.
 *
 * Thread-safety: one instance is used by one thread (the router's event
 * loop); the caller serialises every call. */
#ifndef RADIX_ROUTE_H
#define RADIX_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/host.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A candidate worker as the policy sees it. */
struct rx_route_worker {
    uint32_t    id;        /* the caller's stable id */
    const char *url;       /* "http://127.0.0.1:30001", for logs */
    uint32_t    load;      /* requests in flight on it, as the caller counts them */
};

/* What is being routed.  text is the routing key the caller extracts from
 * the request (the prompt text, or the chat messages' contents joined; may
 * be empty, then len is 0): cache_aware matches it against its tree.
 * Borrowed for the call. */
struct rx_route_request {
    const char *text;
    size_t      len;
};

/* Why pick chose what it chose (for the router's metrics). */
enum rx_route_decision {
    RX_ROUTE_PLAIN      = 0,   /* a policy without cache affinity */
    RX_ROUTE_CACHE_HIT  = 1,   /* cache_aware: best match ratio above the threshold */
    RX_ROUTE_CACHE_MISS = 2,   /* cache_aware: no match good enough: smallest tree(s) */
    RX_ROUTE_BALANCE    = 3    /* cache_aware: the pool was imbalanced: least loaded */
};

struct rx_route_policy_ops {
    uint32_t struct_size;
    /* ---- ABI 1.1 ---- */
    /* (optional) make an instance from the plugin's INI section (host->cfg_*);
     * if NULL the instance is NULL. */
    int  (*create) (const struct rx_host *host, void **inst, struct rx_err *err);
    /* (optional) */
    void (*destroy) (void *inst);
    /* (required) choose one of w[0..n) (n >= 1; every candidate may take
     * the request: healthy, breaker not open, not already tried for it) and
     * set *chosen to its index; *decision (may be NULL) says why.  seed:
     * fresh per call, randomised policies use only it (deterministic tests).
     * A policy that remembers (cache_aware) records rq under the chosen
     * worker here. */
    int  (*pick) (void *inst, const struct rx_route_request *rq,
                  const struct rx_route_worker *w, size_t n, uint64_t seed,
                  size_t *chosen, int *decision, struct rx_err *err);
    /* (optional) a worker joined. */
    void (*worker_added) (void *inst, uint32_t id);
    /* (optional) a worker left, or failed: forget everything about it (its
     * cache affinity ends now, not when a breaker opens). */
    void (*worker_removed) (void *inst, uint32_t id);
    /* (optional) periodic maintenance, about once a second: now_s is
     * CLOCK_MONOTONIC seconds (cache_aware evicts every eviction_interval). */
    void (*tick) (void *inst, double now_s);
    /* (optional) the size of what the policy keeps for a worker (cache_aware:
     * characters in its tree), for GET /workers and /metrics. */
    uint64_t (*worker_size) (void *inst, uint32_t id);
    /* ---- ABI 1.1 ends here ---- */
};

#define RX_ROUTE_POLICY_OPS_SIZE_1_1 \
    (offsetof (struct rx_route_policy_ops, worker_size) + sizeof (void *))

#ifdef __cplusplus
}
#endif
#endif /* RADIX_ROUTE_H */
