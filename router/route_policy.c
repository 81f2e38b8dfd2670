/* router/route_policy.c -- see route_policy.h. */
#include "config.h"

#include <stdlib.h>

#include <radix/plugin.h>

#include "route_policy.h"

struct rx_rpolicy {
    const struct rx_route_policy_ops *ops;
    const struct rx_plugin_desc *desc;
    void *inst;
};

#define S_HAS(rp, m) RX_HAS (struct rx_route_policy_ops, (rp)->ops, m)

rx_rpolicy_t *rx_rpolicy_new (rx_plugin_t *p, struct rx_err *err)
{
    const struct rx_route_policy_ops *ops = rx_plugin_ops (p);
    const struct rx_plugin_desc *d = rx_plugin_desc (p);
    if (!ops || d->kind != RX_KIND_ROUTE_POLICY) {
        rx_err_set (err, RX_EABI, "%s: not a route policy plugin", rx_plugin_path (p));
        return NULL;
    }
    if (!RX_HAS (struct rx_route_policy_ops, ops, pick)) {
        rx_err_set (err, RX_EABI, "%s: route policy \"%s\" has no pick (ops struct_size %u, needs %zu)",
                    rx_plugin_path (p), d->name, (unsigned) ops->struct_size,
                    offsetof (struct rx_route_policy_ops, pick) + sizeof (ops->pick));
        return NULL;
    }
    rx_rpolicy_t *rp = calloc (1, sizeof *rp);
    if (!rp) {
        rx_err_set (err, RX_ENOMEM, "out of memory");
        return NULL;
    }
    rp->ops = ops;
    rp->desc = d;
    if (S_HAS (rp, create)) {
        struct rx_err perr = { 0 };
        int rc = ops->create (rx_plugin_host (p), &rp->inst, &perr);
        if (rc != RX_OK) {
            rx_err_set (err, rc, "route policy \"%s\" (%s): %s", d->name, rx_plugin_path (p),
                        perr.msg[0] ? perr.msg : "create failed");
            free (rp);
            return NULL;
        }
    }
    return rp;
}

void rx_rpolicy_destroy (rx_rpolicy_t **self_p)
{
    rx_rpolicy_t *rp = self_p ? *self_p : NULL;
    if (!rp) return;
    if (S_HAS (rp, destroy)) rp->ops->destroy (rp->inst);
    free (rp);
    *self_p = NULL;
}

const char *rx_rpolicy_name (const rx_rpolicy_t *rp) { return rp->desc->name; }

int rx_rpolicy_pick (rx_rpolicy_t *rp, const char *text, size_t len, const struct rx_route_worker *w,
                     size_t n, uint64_t seed, size_t *chosen, int *decision, struct rx_err *err)
{
    struct rx_route_request rq = { text ? text : "", text ? len : 0 };
    struct rx_err perr = { 0 };
    size_t c = (size_t) -1;
    int d = RX_ROUTE_PLAIN;
    int rc = rp->ops->pick (rp->inst, &rq, w, n, seed, &c, &d, &perr);
    if (rc != RX_OK)
        return rx_err_set (err, rc, "route policy \"%s\": %s", rp->desc->name, perr.msg[0] ? perr.msg : "pick failed");
    if (c >= n)
        return rx_err_set (err, RX_EINTERNAL, "route policy \"%s\" picked candidate %zu of %zu", rp->desc->name,
                           c, n);
    *chosen = c;
    *decision = (d >= RX_ROUTE_PLAIN && d <= RX_ROUTE_BALANCE) ? d : RX_ROUTE_PLAIN;
    return RX_OK;
}

void rx_rpolicy_added (rx_rpolicy_t *rp, uint32_t id)
{
    if (S_HAS (rp, worker_added)) rp->ops->worker_added (rp->inst, id);
}

void rx_rpolicy_removed (rx_rpolicy_t *rp, uint32_t id)
{
    if (S_HAS (rp, worker_removed)) rp->ops->worker_removed (rp->inst, id);
}

void rx_rpolicy_tick (rx_rpolicy_t *rp, double now_s)
{
    if (S_HAS (rp, tick)) rp->ops->tick (rp->inst, now_s);
}

uint64_t rx_rpolicy_size (rx_rpolicy_t *rp, uint32_t id)
{
    return S_HAS (rp, worker_size) ? rp->ops->worker_size (rp->inst, id) : 0;
}
