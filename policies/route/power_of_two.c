/* policies/route/power_of_two.c -- "the power of two choices": draw two
 * distinct candidates from the per-call seed and take the less loaded
 * (the first drawn on a tie).  Nearly as even as shortest_queue, but
 * herds less when many routers share stale load counts. */
#include <radix/plugin.h>
#include <radix/route.h>

#include "pick.h"

static int s_pick (void *inst, const struct rx_route_request *rq,
                   const struct rx_route_worker *w, size_t n, uint64_t seed,
                   size_t *chosen, int *decision, struct rx_err *err)
{
    (void) inst; (void) rq;
    int rc = rx_route_pick_check ("power_of_two", w, n, chosen, err);
    if (rc != RX_OK)
        return rc;
    if (decision)
        *decision = RX_ROUTE_PLAIN;
    if (n == 1) {
        *chosen = 0;
        return RX_OK;
    }
    uint64_t r = rx_route_mix (seed);
    size_t a = rx_route_below (r, n);
    /* The second draw is over the n - 1 others: distinct by construction. */
    size_t b = rx_route_below (rx_route_mix (r), n - 1);
    if (b >= a)
        b++;
    *chosen = w[b].load < w[a].load ? b : a;
    return RX_OK;
}

static const struct rx_route_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .pick = s_pick,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_ROUTE_POLICY, .name = "power_of_two", .version = "1.0.0",
                  .description = "two random workers, the less loaded of them",
                  .ops = &s_ops)
