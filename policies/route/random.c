/* policies/route/random.c -- a uniformly random candidate.  The choice
 * comes from the caller's per-call seed only (never a process-local
 * generator), so the same seed and candidates give the same worker. */
#include <radix/plugin.h>
#include <radix/route.h>

#include "pick.h"

static int s_pick (void *inst, const struct rx_route_request *rq,
                   const struct rx_route_worker *w, size_t n, uint64_t seed,
                   size_t *chosen, int *decision, struct rx_err *err)
{
    (void) inst; (void) rq;
    int rc = rx_route_pick_check ("random", w, n, chosen, err);
    if (rc != RX_OK)
        return rc;
    *chosen = rx_route_below (rx_route_mix (seed), n);
    if (decision)
        *decision = RX_ROUTE_PLAIN;
    return RX_OK;
}

static const struct rx_route_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .pick = s_pick,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ROUTE_POLICY, .name = "random", .version = "1.0.0",
                  .description = "a uniformly random healthy worker (from the per-call seed)",
                  .ops = &s_ops)
