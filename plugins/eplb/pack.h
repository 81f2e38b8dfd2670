/* plugins/eplb/pack.h -- what the EPLB plugins share (header-only, static:
 * each .so compiles its own copy and links nothing of the core).  The
 * building blocks are deterministic: every tie is broken by index.
 *
 *   eplb_check      the preconditions every algorithm has (a whole problem,
 *                   positive sizes, at least one slot per logical expert,
 *                   slots divisible over the GPUs), errors named by who.
 *
 *   eplb_replicate  give n_slot - n slots, one at a time, to the item with
 *                   the highest weight per copy (ties: lower index).
 *   eplb_pack       balanced packing: items heaviest first (ties: lower
 *                   index), each into the lightest pack that still has room
 *                   (ties: lower pack); every pack gets n / n_pack items.
 *
 * Not thread-hostile: no globals; the caller hands in the scratch. */
#ifndef RX_EPLB_PACK_H
#define RX_EPLB_PACK_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <radix/eplb.h>
#include <radix/err.h>

static inline int eplb_check (const char *who, const struct rx_eplb_problem *p, struct rx_err *err)
{
    if (!p || p->struct_size < offsetof (struct rx_eplb_problem, load) + sizeof p->load || !p->load)
        return rx_err_set (err, RX_EINVAL, "%s: NULL or short problem", who);
    if (p->n_layer <= 0 || p->n_logical <= 0 || p->n_physical <= 0 || p->n_group <= 0
        || p->n_node <= 0 || p->n_gpu <= 0)
        return rx_err_set (err, RX_EINVAL,
                           "%s: every size must be positive: %d layers, %d logical, %d physical, %d groups, %d nodes, %d GPUs",
                           who, p->n_layer, p->n_logical, p->n_physical, p->n_group, p->n_node, p->n_gpu);
    if (p->n_physical < p->n_logical)
        return rx_err_set (err, RX_EINVAL, "%s: %d physical slots are fewer than the %d logical experts",
                           who, p->n_physical, p->n_logical);
    if (p->n_physical % p->n_gpu)
        return rx_err_set (err, RX_EINVAL, "%s: %d physical slots do not divide over %d GPUs", who,
                           p->n_physical, p->n_gpu);
    return RX_OK;
}

/* qsort_r context: sort indices by weight descending, then index ascending
 * (a total order, so qsort's instability cannot show). */
static inline int eplb_cmp_desc (const void *a, const void *b, void *ctx)
{
    const double *w = ctx;
    int32_t i = *(const int32_t *) a, j = *(const int32_t *) b;
    if (w[i] > w[j]) return -1;
    if (w[i] < w[j]) return 1;
    return (i > j) - (i < j);
}

/* idx[0..n) = 0..n-1 ordered by w descending, index ascending. */
static inline void eplb_order (const double *w, int32_t n, int32_t *idx)
{
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    qsort_r (idx, (size_t) n, sizeof *idx, eplb_cmp_desc, (void *) w);
}

/* Pack n items of weight w into n_pack packs of n / n_pack items (n
 * divisible by n_pack): pack[i] is item i's pack, rank[i] its position in
 * it (in order of arrival).  With one item per pack, item i goes to pack i
 * (DeepSeek's shortcut: nothing to balance, so nothing moves).
 * Scratch: idx[n], pw[n_pack] (double), pn[n_pack]. */
static inline void eplb_pack (const double *w, int32_t n, int32_t n_pack, int32_t *pack, int32_t *rank,
                       int32_t *idx, double *pw, int32_t *pn)
{
    int32_t per = n / n_pack;
    if (per == 1) {
        for (int32_t i = 0; i < n; i++) {
            pack[i] = i;
            rank[i] = 0;
        }
        return;
    }
    eplb_order (w, n, idx);
    for (int32_t k = 0; k < n_pack; k++) {
        pw[k] = 0;
        pn[k] = 0;
    }
    for (int32_t t = 0; t < n; t++) {
        int32_t i = idx[t], best = -1;
        for (int32_t k = 0; k < n_pack; k++)
            if (pn[k] < per && (best < 0 || pw[k] < pw[best])) best = k;
        pack[i] = best;
        rank[i] = pn[best]++;
        pw[best] += w[i];
    }
}

/* Slots 0..n-1 hold items 0..n-1; each further slot s < n_slot gets the
 * item with the highest w / cnt (ties: lower index).  slot2item[n_slot],
 * cnt[n] (out); ratio[n] scratch: w / cnt cached, so the scan is
 * comparisons only (a division per item per slot was most of the run time;
 * the cached quotient is the same double w[i] / cnt[i] gives). */
static inline void eplb_replicate (const double *w, int32_t n, int32_t n_slot, int32_t *slot2item,
                            int32_t *cnt, double *ratio)
{
    for (int32_t i = 0; i < n; i++) {
        slot2item[i] = i;
        cnt[i] = 1;
        ratio[i] = w[i];
    }
    for (int32_t s = n; s < n_slot; s++) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (ratio[i] > ratio[best]) best = i;
        slot2item[s] = best;
        cnt[best]++;
        ratio[best] = w[best] / cnt[best];
    }
}

#endif /* RX_EPLB_PACK_H */
