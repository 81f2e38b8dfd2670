/* policies/route/round_robin.c -- turns in id order: the candidate with the
 * smallest id above the last one chosen, wrapping to the smallest.  Keyed
 * by id rather than by position, so a worker that is skipped (unhealthy,
 * already tried) or added between calls does not shift everyone's turn. */
#include <stdlib.h>

#include <radix/plugin.h>
#include <radix/route.h>

#include "pick.h"

struct rr {
    int      started;
    uint32_t last;                 /* id chosen last */
};

static int s_create (const struct rx_host *host, void **inst, struct rx_err *err)
{
    (void) host;
    struct rr *r = calloc (1, sizeof *r);
    if (!r)
        return rx_err_set (err, RX_ENOMEM, "route-round_robin: out of memory");
    *inst = r;
    return RX_OK;
}

static void s_destroy (void *inst)
{
    free (inst);
}

static int s_pick (void *inst, const struct rx_route_request *rq,
                   const struct rx_route_worker *w, size_t n, uint64_t seed,
                   size_t *chosen, int *decision, struct rx_err *err)
{
    (void) rq; (void) seed;
    int rc = rx_route_pick_check ("round_robin", w, n, chosen, err);
    if (rc != RX_OK)
        return rc;
    struct rr *r = inst;
    if (!r)
        return rx_err_set (err, RX_EINVAL, "route-round_robin: pick without an instance (call create first)");
    size_t next = n, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i].id < w[first].id)
            first = i;
        if (r->started && w[i].id > r->last && (next == n || w[i].id < w[next].id))
            next = i;
    }
    *chosen = next < n ? next : first;
    r->last = w[*chosen].id;
    r->started = 1;
    if (decision)
        *decision = RX_ROUTE_PLAIN;
    return RX_OK;
}

static const struct rx_route_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .create = s_create,
    .destroy = s_destroy,
    .pick = s_pick,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ROUTE_POLICY, .name = "round_robin", .version = "1.0.0",
                  .description = "each healthy worker in turn, in id order",
                  .ops = &s_ops)
