/* plugins/eplb/greedy.c -- eplb-greedy.so: a flat baseline EPLB algorithm
 * (radix/eplb.h) that ignores groups and nodes, to show what DeepSeek's
 * hierarchy buys (locality: with `deepseek` a node holds only its own
 * groups' experts, so a token's experts sit on fewer nodes) and costs.
 *
 * Per layer:
 *   1. replication over all slots: each redundant slot goes to the expert
 *      with the highest load per copy (ties: lower id);
 *   2. longest processing time first: the copies, weighted by load / copies,
 *      heaviest first (ties: lower copy index, copies numbered as step 1
 *      made them: expert e's first copy is e, extra copies follow), each onto the
 *      least-loaded GPU that still has a free slot (ties: lower GPU);
 *   3. refinement: while swapping one copy of the most-loaded GPU with one
 *      copy of the least-loaded GPU lowers the larger of the two loads, make
 *      the best such swap (ties: lower slots), at most n_physical / n_gpu * 2
 *      times.  This is what step 2 with equal-size packs cannot do alone:
 *      fix a heavy pack filled early.
 * Deterministic (every tie by index).  Thread-safety: rebalance is pure. */
#include <stdint.h>
#include <stdlib.h>

#include <radix/eplb.h>
#include <radix/plugin.h>

#include "pack.h"

/* A swap must gain more than this (relative) to count: stops ping-pong on
 * equal loads through rounding. */
#define GR_EPS 1e-12

/* Groups and nodes are ignored, so their divisibility does not matter. */
static int s_check (const struct rx_eplb_problem *p, struct rx_err *err)
{
    return eplb_check ("eplb-greedy", p, err);
}

static int s_rebalance (const struct rx_host *host, const struct rx_eplb_problem *p, int32_t *phy2log,
                        struct rx_err *err)
{
    int rc = s_check (p, err);
    if (rc != RX_OK) return rc;
    if (!phy2log) return rx_err_set (err, RX_EINVAL, "eplb-greedy: NULL phy2log");
    int32_t E = p->n_logical, P = p->n_physical, G = p->n_gpu, per = P / G;
    double *dm = malloc ((size_t) (P + G + E) * sizeof (double) + (size_t) (3 * P + E + G) * sizeof (int32_t));
    if (!dm) return rx_err_set (err, RX_ENOMEM, "eplb-greedy: out of memory for %d slots", P);
    double *wc = dm, *gl = wc + P, *ratio = gl + G;
    int32_t *item = (int32_t *) (ratio + E), *idx = item + P, *cnt = idx + P, *gn = cnt + E,
            *slotw = gn + G; /* slotw: the copy (index into item) in each output slot */

    for (int32_t l = 0; l < p->n_layer; l++) {
        const double *w = p->load + (size_t) l * E;
        int32_t *out = phy2log + (size_t) l * P;
        eplb_replicate (w, E, P, item, cnt, ratio);
        for (int32_t k = 0; k < P; k++) wc[k] = w[item[k]] / cnt[item[k]];
        eplb_order (wc, P, idx);   /* weight desc, then copy index asc */
        for (int32_t g = 0; g < G; g++) {
            gl[g] = 0;
            gn[g] = 0;
        }
        for (int32_t t = 0; t < P; t++) {
            int32_t k = idx[t], best = -1;
            for (int32_t g = 0; g < G; g++)
                if (gn[g] < per && (best < 0 || gl[g] < gl[best])) best = g;
            slotw[best * per + gn[best]++] = k;
            gl[best] += wc[k];
        }
        /* refinement between the heaviest and the lightest GPU */
        for (int32_t it = 0; it < 2 * per && G > 1; it++) {
            int32_t hi = 0, lo = 0;
            for (int32_t g = 1; g < G; g++) {
                if (gl[g] > gl[hi]) hi = g;
                if (gl[g] < gl[lo]) lo = g;
            }
            double bestmax = gl[hi] * (1 - GR_EPS);
            int32_t bx = -1, by = -1;
            for (int32_t x = hi * per; x < (hi + 1) * per; x++)
                for (int32_t y = lo * per; y < (lo + 1) * per; y++) {
                    double d = wc[slotw[x]] - wc[slotw[y]];
                    if (d <= 0) continue;
                    double a = gl[hi] - d, b = gl[lo] + d, m = a > b ? a : b;
                    if (m < bestmax) {
                        bestmax = m;
                        bx = x;
                        by = y;
                    }
                }
            if (bx < 0) break;
            double d = wc[slotw[bx]] - wc[slotw[by]];
            int32_t tmp = slotw[bx];
            slotw[bx] = slotw[by];
            slotw[by] = tmp;
            gl[hi] -= d;
            gl[lo] += d;
        }
        for (int32_t s = 0; s < P; s++) out[s] = item[slotw[s]];
    }
    free (dm);
    (void) host;
    return RX_OK;
}

static const struct rx_eplb_ops s_ops = {
    .struct_size = sizeof (struct rx_eplb_ops),
    .rebalance = s_rebalance,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_EPLB, .name = "greedy", .version = "0.1.0",
                  .description = "flat EPLB baseline: replicate the hottest experts, longest-first onto the least-loaded GPU, then swap-refine",
                  .ops = &s_ops)
