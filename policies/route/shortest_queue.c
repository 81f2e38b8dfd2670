/* policies/route/shortest_queue.c -- the candidate with the fewest requests
 * in flight (as the caller counts them); ties go to the lowest index, so
 * the caller's order decides and the result is deterministic. */
#include <radix/plugin.h>
#include <radix/route.h>

#include "pick.h"

static int s_pick (void *inst, const struct rx_route_request *rq,
                   const struct rx_route_worker *w, size_t n, uint64_t seed,
                   size_t *chosen, int *decision, struct rx_err *err)
{
    (void) inst; (void) rq; (void) seed;
    int rc = rx_route_pick_check ("shortest_queue", w, n, chosen, err);
    if (rc != RX_OK)
        return rc;
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (w[i].load < w[best].load)
            best = i;
    *chosen = best;
    if (decision)
        *decision = RX_ROUTE_PLAIN;
    return RX_OK;
}

static const struct rx_route_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .pick = s_pick,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ROUTE_POLICY, .name = "shortest_queue", .version = "1.0.0",
                  .description = "the worker with the fewest requests in flight",
                  .ops = &s_ops)
