/* router/route_policy.h -- the router's handle on its route-policy plugin
 * (radix/route.h): checks the ops table once, owns the instance, and calls
 * the optional members only when the plugin has them.
 *
 * Ownership: the plugin itself stays owned by the loader (it must outlive
 * the handle); the handle owns the policy instance.  Single-threaded (the
 * router's event loop). */
#ifndef RX_ROUTE_POLICY_H
#define RX_ROUTE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/route.h>

#include "loader.h"

typedef struct rx_rpolicy rx_rpolicy_t;

/* p: an initialised route-policy plugin (rx_boot_plugin).  Refuses, with one
 * line naming the plugin file, an ops table too short for pick or without
 * pick; runs create.  Caller owns the result. */
rx_rpolicy_t *rx_rpolicy_new (rx_plugin_t *p, struct rx_err *err);
/* Runs destroy; NULLs *self_p. */
void rx_rpolicy_destroy (rx_rpolicy_t **self_p);

const char *rx_rpolicy_name (const rx_rpolicy_t *rp);

/* Choose among w[0..n) (n >= 1).  *chosen < n on success; *decision is an
 * enum rx_route_decision.  A plugin answering an index out of range is an
 * RX_EINTERNAL error naming it. */
int rx_rpolicy_pick (rx_rpolicy_t *rp, const char *text, size_t len, const struct rx_route_worker *w,
                     size_t n, uint64_t seed, size_t *chosen, int *decision, struct rx_err *err);
void rx_rpolicy_added (rx_rpolicy_t *rp, uint32_t id);
void rx_rpolicy_removed (rx_rpolicy_t *rp, uint32_t id);
void rx_rpolicy_tick (rx_rpolicy_t *rp, double now_s);
/* 0 when the plugin keeps nothing per worker. */
uint64_t rx_rpolicy_size (rx_rpolicy_t *rp, uint32_t id);

#endif
