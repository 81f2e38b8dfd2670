/* policies/route/cache_aware.c -- sgl-router's cache-aware policy over an
 * approximate radix tree of the texts it routed (tree.h), with two fixes
 * its users asked for.
 *
 * pick, over the candidates only (workers the caller did not offer --
 * unhealthy, breaker open, already tried -- are ignored even when their
 * marks match best):
 *   1. imbalanced = max_load - min_load > balance_abs_threshold AND
 *      max_load > min_load * balance_rel_threshold  ->  the least loaded
 *      (ties: lowest id); decision BALANCE.
 *   2. else match the text against the tree; the best candidate's match
 *      ratio (matched characters / text characters; 0 for an empty text)
 *      > cache_threshold  ->  that candidate (ties: least loaded, then
 *      lowest id); decision CACHE_HIT.
 *   3. else  ->  among the candidates whose trees are smallest, the least
 *      loaded (ties: lowest id); decision CACHE_MISS.  sgl-router sends a
 *      miss to the smallest tree alone, which piles load onto one worker.
 *   Then the text is recorded under the chosen worker (times: a counter of
 *   picks, so LRU order is pick order).
 * worker_removed drops the worker's marks at once (the caller calls it on
 * a failure too, not only when a breaker opens); tick evicts every
 * eviction_interval, per worker, least recently used leaves first, down
 * to max_tree_size characters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <radix/plugin.h>
#include <radix/route.h>

#include "pick.h"
#include "tree.h"

struct ca {
    const struct rx_host *host;
    double   cache_threshold;
    int64_t  balance_abs;
    double   balance_rel;
    double   eviction_interval;    /* seconds */
    int64_t  max_tree_size;        /* characters per worker */
    rx_rtree_t *tree;
    uint64_t clock;                /* picks so far: the tree's time */
    double   last_evict;           /* tick time of the last eviction; NAN before the first tick */
};

static const struct rx_cfg_key s_keys[] = {
    { "cache_threshold", RX_CFG_FLOAT, "0.3",
      "route to the best-matching worker when matched/total characters of the request text is above this",
      0, 1, NULL },
    { "balance_abs_threshold", RX_CFG_INT, "64",
      "imbalanced when max - min in-flight requests is above this and balance_rel_threshold is crossed too: the least loaded worker then gets the request",
      0, 1e9, NULL },
    { "balance_rel_threshold", RX_CFG_FLOAT, "1.5",
      "imbalanced when the max in-flight count is above the min times this and balance_abs_threshold is crossed too",
      0, 1e9, NULL },
    { "eviction_interval", RX_CFG_DURATION, "120s",
      "how often each worker's part of the tree is evicted (least recently used first) to max_tree_size",
      0, 1e9, NULL },
    { "max_tree_size", RX_CFG_INT, "67108864",
      "characters of request text the tree keeps per worker after an eviction (2^26)",
      0, 1e15, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

/* Read one declared key through the host into out; without a host (a
 * caller with no config) out keeps the default it was given. */
static int s_cfg (const struct rx_host *h, const char *key, int type, void *out,
                  struct rx_err *err)
{
    if (!h)
        return RX_OK;
    int rc = type == RX_CFG_INT ? h->cfg_int (h, key, out)
           : type == RX_CFG_DURATION ? h->cfg_seconds (h, key, out)
           : h->cfg_float (h, key, out);
    if (rc == RX_OK)
        return RX_OK;
    const struct rx_cfg_key *k = s_keys;
    while (k->name && strcmp (k->name, key) != 0)
        k++;
    return rx_err_set (err, RX_ECONFIG, "route-cache_aware: [router.cache_aware] %s: not a valid %s in %g..%g (%s)",
                       key, type == RX_CFG_INT ? "integer" : type == RX_CFG_DURATION ? "duration" : "number",
                       k->name ? k->min : 0, k->name ? k->max : 0, rx_status_name (rc));
}

static void s_destroy (void *inst)
{
    struct ca *c = inst;
    if (!c)
        return;
    rx_rtree_destroy (&c->tree);
    free (c);
}

static int s_create (const struct rx_host *host, void **inst, struct rx_err *err)
{
    struct ca *c = calloc (1, sizeof *c);
    if (!c)
        return rx_err_set (err, RX_ENOMEM, "route-cache_aware: out of memory");
    /* The defaults of s_keys (current sgl-router's). */
    *c = (struct ca) { .host = host, .cache_threshold = 0.3, .balance_abs = 64, .balance_rel = 1.5,
                       .eviction_interval = 120, .max_tree_size = INT64_C (1) << 26,
                       .last_evict = NAN };
    int rc;
    if ((rc = s_cfg (host, "cache_threshold", RX_CFG_FLOAT, &c->cache_threshold, err)) != RX_OK
        || (rc = s_cfg (host, "balance_abs_threshold", RX_CFG_INT, &c->balance_abs, err)) != RX_OK
        || (rc = s_cfg (host, "balance_rel_threshold", RX_CFG_FLOAT, &c->balance_rel, err)) != RX_OK
        || (rc = s_cfg (host, "eviction_interval", RX_CFG_DURATION, &c->eviction_interval, err)) != RX_OK
        || (rc = s_cfg (host, "max_tree_size", RX_CFG_INT, &c->max_tree_size, err)) != RX_OK)
        goto fail;
    /* The host already range-checks declared keys; this guards a host that
     * does not (a test harness, a future caller). */
    if (!(c->cache_threshold >= 0 && c->cache_threshold <= 1) || c->balance_abs < 0
        || !(c->balance_rel >= 0) || !(c->eviction_interval >= 0) || c->max_tree_size < 0) {
        rc = rx_err_set (err, RX_ECONFIG, "route-cache_aware: [router.cache_aware] value out of range "
                         "(cache_threshold %g in [0,1], balance_abs_threshold %lld >= 0, "
                         "balance_rel_threshold %g >= 0, eviction_interval %g >= 0, max_tree_size %lld >= 0)",
                         c->cache_threshold, (long long) c->balance_abs, c->balance_rel,
                         c->eviction_interval, (long long) c->max_tree_size);
        goto fail;
    }
    c->tree = rx_rtree_new (err);
    if (!c->tree) {
        rc = RX_ENOMEM;
        goto fail;
    }
    RX_HLOG (host, RX_LOG_DEBUG, "cache_threshold %g, balance %lld abs / %g rel, eviction every %gs to %lld chars",
             c->cache_threshold, (long long) c->balance_abs, c->balance_rel,
             c->eviction_interval, (long long) c->max_tree_size);
    *inst = c;
    return RX_OK;
fail:
    s_destroy (c);
    return rc;
}

/* Index of the lightest (load, then id) of the w[i] with key[i] == want
 * (every w[i] when key is NULL). */
static size_t s_lightest (const struct rx_route_worker *w, size_t n, const uint64_t *key,
                          uint64_t want)
{
    size_t best = n;
    for (size_t i = 0; i < n; i++)
        if ((!key || key[i] == want) && (best == n || rx_route_lighter (&w[i], &w[best])))
            best = i;
    return best;
}

static int s_pick (void *inst, const struct rx_route_request *rq,
                   const struct rx_route_worker *w, size_t n, uint64_t seed,
                   size_t *chosen, int *decision, struct rx_err *err)
{
    (void) seed;
    int rc = rx_route_pick_check ("cache_aware", w, n, chosen, err);
    if (rc != RX_OK)
        return rc;
    struct ca *c = inst;
    if (!c)
        return rx_err_set (err, RX_EINVAL, "route-cache_aware: pick without an instance (call create first)");
    const char *text = rq ? rq->text : NULL;
    size_t len = rq ? rq->len : 0;
    if (!text && len)
        return rx_err_set (err, RX_EINVAL, "route-cache_aware: request text is NULL but len is %zu", len);

    uint32_t lo = w[0].load, hi = w[0].load;
    for (size_t i = 1; i < n; i++) {
        if (w[i].load < lo) lo = w[i].load;
        if (w[i].load > hi) hi = w[i].load;
    }
    int why;
    size_t pick;
    if ((int64_t) hi - (int64_t) lo > c->balance_abs && (double) hi > (double) lo * c->balance_rel) {
        pick = s_lightest (w, n, NULL, 0);
        why = RX_ROUTE_BALANCE;
    } else {
        struct rx_rtree_match m;
        if ((rc = rx_rtree_match (c->tree, text, len, &m, err)) != RX_OK)
            return rc;
        /* key[i]: candidate i's match, then its tree size (small arrays:
         * a few dozen workers; a stack buffer for the common case). */
        uint64_t small[64], *key = n <= 64 ? small : malloc (n * sizeof *key);
        if (!key)
            return rx_err_set (err, RX_ENOMEM, "route-cache_aware: out of memory for %zu candidates", n);
        uint64_t best = 0;
        for (size_t i = 0; i < n; i++) {
            key[i] = 0;
            for (size_t j = 0; j < m.nhits; j++)
                if (m.hits[j].tenant == w[i].id) {
                    key[i] = m.hits[j].chars;
                    break;
                }
            if (key[i] > best)
                best = key[i];
        }
        if (m.text_chars && (double) best / (double) m.text_chars > c->cache_threshold) {
            pick = s_lightest (w, n, key, best);
            why = RX_ROUTE_CACHE_HIT;
        } else {
            uint64_t least = UINT64_MAX;
            for (size_t i = 0; i < n; i++) {
                key[i] = rx_rtree_tenant_size (c->tree, w[i].id);
                if (key[i] < least)
                    least = key[i];
            }
            pick = s_lightest (w, n, key, least);
            why = RX_ROUTE_CACHE_MISS;
        }
        if (key != small)
            free (key);
    }
    /* Recording is best effort: a request is routed even if its text could
     * not be remembered (the tree stays consistent, only less informed). */
    struct rx_err ierr = { 0 };
    if (rx_rtree_insert (c->tree, text, len, w[pick].id, ++c->clock, &ierr) != RX_OK)
        RX_HLOG (c->host, RX_LOG_WARN, "%s", ierr.msg);
    *chosen = pick;
    if (decision)
        *decision = why;
    return RX_OK;
}

static void s_worker_added (void *inst, uint32_t id)
{
    struct ca *c = inst;
    struct rx_err err = { 0 };
    if (c && rx_rtree_add_tenant (c->tree, id, &err) != RX_OK)
        RX_HLOG (c->host, RX_LOG_WARN, "%s", err.msg);
}

static void s_worker_removed (void *inst, uint32_t id)
{
    struct ca *c = inst;
    if (c)
        rx_rtree_remove_tenant (c->tree, id);
}

static void s_tick (void *inst, double now_s)
{
    struct ca *c = inst;
    if (!c)
        return;
    if (isnan (c->last_evict)) {           /* the first tick starts the clock */
        c->last_evict = now_s;
        return;
    }
    if (now_s - c->last_evict < c->eviction_interval)
        return;
    c->last_evict = now_s;
    struct rx_err err = { 0 };
    int64_t freed = rx_rtree_evict (c->tree, (uint64_t) c->max_tree_size, &err);
    if (freed < 0)
        RX_HLOG (c->host, RX_LOG_WARN, "%s", err.msg);
    else if (freed > 0)
        RX_HLOG (c->host, RX_LOG_DEBUG, "evicted %lld characters; tree now %zu nodes, %llu characters",
                 (long long) freed, rx_rtree_node_count (c->tree),
                 (unsigned long long) rx_rtree_total_chars (c->tree));
}

static uint64_t s_worker_size (void *inst, uint32_t id)
{
    struct ca *c = inst;
    return c ? rx_rtree_tenant_size (c->tree, id) : 0;
}

static const struct rx_route_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .create = s_create,
    .destroy = s_destroy,
    .pick = s_pick,
    .worker_added = s_worker_added,
    .worker_removed = s_worker_removed,
    .tick = s_tick,
    .worker_size = s_worker_size,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ROUTE_POLICY, .name = "cache_aware", .version = "1.0.0",
                  .description = "the worker whose routed texts share the longest prefix, balanced by load",
                  .keys = s_keys, .ops = &s_ops)
