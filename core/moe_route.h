/* core/moe_route.h -- DeepSeek's MoE routing of one token row, as plain C
 * (header-only: compiled into kernels-cpu's moe_route op and into
 * model-deepseek2's host fallback for backends without that op, so the two
 * give the same choices and weights bit for bit; plugins link no core).
 *
 * rx_moe_route_choose: the k experts a row picks from its selection scores
 * sel[0 .. nx): with n_group > 1, groups of nx / n_group experts score the
 * sum of their two best sel (their best alone with one expert per group),
 * the topk_group best groups are kept (the lower index on ties); the k best
 * kept experts are chosen in descending sel, the lower index on ties.
 * n_group <= 1: the k best of all.  Scratch: keep[n_group], gs[n_group],
 * taken[nx].
 *
 * rx_moe_route_weights: w[j] = p[ids[j]], divided by their sum (in double)
 * when norm, then times scale.
 *
 * Pure functions: thread-safe. */
#ifndef RX_CORE_MOE_ROUTE_H
#define RX_CORE_MOE_ROUTE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void rx_moe_route_choose (const float *sel, size_t nx, size_t n_group, size_t topk_group,
                                        size_t k, int32_t *ids, uint8_t *keep, float *gs, uint8_t *taken)
{
    const size_t G = n_group > 1 ? n_group : 1, per = nx / G;
    for (size_t g = 0; g < G; g++) {
        keep[g] = G == 1;
        if (G == 1) break;
        float b1 = -INFINITY, b2 = -INFINITY;
        for (size_t e = g * per; e < (g + 1) * per; e++) {
            if (sel[e] > b1) { b2 = b1; b1 = sel[e]; }
            else if (sel[e] > b2) b2 = sel[e];
        }
        gs[g] = per > 1 ? b1 + b2 : b1;
    }
    for (size_t j = 0; G > 1 && j < topk_group; j++) {
        size_t best = G;
        for (size_t g = 0; g < G; g++)
            if (!keep[g] && (best == G || gs[g] > gs[best])) best = g;
        keep[best] = 1;
    }
    memset (taken, 0, nx);
    for (size_t j = 0; j < k; j++) {
        size_t best = nx;
        for (size_t e = 0; e < nx; e++)
            if (keep[e / per] && !taken[e] && (best == nx || sel[e] > sel[best])) best = e;
        taken[best] = 1;
        ids[j] = (int32_t) best;
    }
}

static inline void rx_moe_route_weights (const float *p, const int32_t *ids, size_t k, int norm, float scale,
                                         float *w)
{
    double sum = 0;
    for (size_t j = 0; j < k; j++) {
        w[j] = p[ids[j]];
        sum += w[j];
    }
    for (size_t j = 0; j < k; j++) {
        if (norm) w[j] = (float) (w[j] / sum);
        w[j] *= scale;
    }
}

#endif
