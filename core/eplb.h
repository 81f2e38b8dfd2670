/* core/eplb.h -- expert placements: what an EPLB algorithm plugin
 * (radix/eplb.h) computes, derived, judged, read and written.
 *
 * A placement maps each layer's n_physical expert slots to logical experts
 * (phy2log); logcnt and log2phy are derived from it here, so every
 * algorithm is judged by the same code.  Balancedness of a layer = mean
 * GPU load / max GPU load, where GPU g owns the contiguous slots
 * [g*P/G, (g+1)*P/G) and a logical expert's load is split evenly among its
 * copies (1.0 = perfectly balanced).
 *
 * Files (docs/eplb.md):
 *   load file       {"load": [[per expert], ... per layer]} -- what `radix
 *                   eplb --load` reads and what the expert-distribution
 *                   dump writes (the dump may carry more members).
 *   placement file  {"phy2log": [[...]], "logcnt": [[...]], "log2phy":
 *                   [[[...]]], "balancedness": [...]} -- what `radix eplb`
 *                   prints; reading needs only phy2log.
 *
 * Thread-safety: a placement is immutable after construction; functions
 * on different placements may run concurrently. */
#ifndef RX_EPLB_H
#define RX_EPLB_H

#include <stdint.h>
#include <stdio.h>

#include <radix/eplb.h>   /* struct rx_eplb_problem */
#include <radix/err.h>

#include "loader.h"

struct rx_placement {
    int32_t  n_layer, n_logical, n_physical;
    int32_t  max_copies;       /* the largest logcnt (the stride of log2phy) */
    int32_t *phy2log;          /* [n_layer][n_physical] */
    int32_t *logcnt;           /* [n_layer][n_logical], each >= 1 */
    int32_t *log2phy;          /* [n_layer][n_logical][max_copies], increasing slots, -1 padded */
};

/* A placement from phy2log (copied).  Checks every id is in range and every
 * logical expert has a slot (RX_EINVAL naming the layer and expert). */
struct rx_placement *rx_placement_new (int32_t n_layer, int32_t n_logical, int32_t n_physical,
                                       const int32_t *phy2log, struct rx_err *err);
/* The identity placement (n_physical = n_logical, slot e holds expert e). */
struct rx_placement *rx_placement_identity (int32_t n_layer, int32_t n_logical,
                                            struct rx_err *err);
void rx_placement_free (struct rx_placement **self_p);

/* Balancedness of one layer under load[n_logical], over n_gpu GPUs
 * (n_physical divisible by n_gpu).  A layer with no load is 1.0; NAN for a
 * bad layer or n_gpu (<= 0 or not dividing n_physical). */
double rx_placement_balancedness (const struct rx_placement *p, int32_t layer,
                                  const double *load, int32_t n_gpu);

/* Run the EPLB algorithm plugin `name` (found through l) on the problem and
 * return the derived placement (the plugin's phy2log checked: every id in
 * range, every expert placed, else RX_EINTERNAL naming the plugin).  The
 * loads are checked first (finite, >= 0).  The plugin is initialised here
 * with defaults if nobody did before: to apply its [eplb.<name>] section,
 * call rx_plugin_init (plugin, conf, err) first (as `radix eplb` does).
 * Not thread-safe (the loader is not). */
struct rx_placement *rx_eplb_compute (rx_loader_t *l, const char *name,
                                      const struct rx_eplb_problem *prob, struct rx_err *err);

/* Read a load file: *load = malloc'd [*n_layer][*n_logical] (free()).
 * Errors name the file and what is wrong (not JSON, ragged rows, negative
 * or non-numeric loads, no layers). */
int rx_eplb_load_read (const char *path, double **load, int32_t *n_layer, int32_t *n_logical,
                       struct rx_err *err);
/* Read an `[eplb] init_expert_location` file: a placement file (it has
 * phy2log) sets *placement; a load file (it has load, e.g. a dump) sets
 * *load / *n_layer / *n_logical as rx_eplb_load_read does.  Exactly one of
 * *placement / *load is set on success. */
int rx_eplb_location_read (const char *path, struct rx_placement **placement, double **load,
                           int32_t *n_layer, int32_t *n_logical, struct rx_err *err);

/* Write the placement as the JSON object above (balancedness per layer
 * under load, over n_gpu GPUs; load may be NULL: balancedness omitted). */
int rx_placement_write_json (FILE *f, const struct rx_placement *p, const double *load,
                             int32_t n_gpu, struct rx_err *err);

#endif /* RX_EPLB_H */
