/* plugins/eplb/deepseek.c -- eplb-deepseek.so: DeepSeek's published EPLB
 * algorithm (deepseek-ai/EPLB eplb.py, rebalance_experts), radix/eplb.h.
 *
 * Hierarchical when n_group % n_node == 0, else the same with one group and
 * one node.  Per layer:
 *   1. the n_group expert groups (contiguous runs of n_logical / n_group
 *      experts), weighted by their summed load, are packed onto the n_node
 *      nodes, n_group / n_node each (eplb_pack: heaviest first into the
 *      lightest node with room); node n's "node-local" experts are its
 *      groups in arrival order, each group's experts in id order;
 *   2. within each node, its n_physical / n_node slots are filled by
 *      copying the node-local expert with the highest load per copy
 *      (eplb_replicate);
 *   3. the node's physical experts, weighted by load / copies, are packed
 *      onto the node's n_gpu / n_node GPUs, n_physical / n_gpu each
 *      (eplb_pack); a GPU's slots hold its experts in arrival order.
 * Ties everywhere go to the lower index (pack.h), so the result is
 * deterministic; with one item per pack an item keeps its own pack, as in
 * DeepSeek's code.  Cost per layer: O(E log E + R E + P G) for E experts,
 * R redundant slots, P slots, G GPUs per node.
 *
 * Thread-safety: rebalance is pure (scratch is per call). */
#include <stdint.h>
#include <stdlib.h>

#include <radix/eplb.h>
#include <radix/plugin.h>

#include "pack.h"

static int s_check (const struct rx_eplb_problem *p, struct rx_err *err)
{
    int rc = eplb_check ("eplb-deepseek", p, err);
    if (rc != RX_OK) return rc;
    if (p->n_logical % p->n_group)
        return rx_err_set (err, RX_EINVAL, "eplb-deepseek: %d logical experts do not divide into %d groups",
                           p->n_logical, p->n_group);
    if (p->n_gpu % p->n_node)
        return rx_err_set (err, RX_EINVAL, "eplb-deepseek: %d GPUs do not divide over %d nodes", p->n_gpu,
                           p->n_node);
    return RX_OK;
}

static int s_rebalance (const struct rx_host *host, const struct rx_eplb_problem *p, int32_t *phy2log,
                        struct rx_err *err)
{
    int rc = s_check (p, err);
    if (rc != RX_OK) return rc;
    if (!phy2log) return rx_err_set (err, RX_EINVAL, "eplb-deepseek: NULL phy2log");
    int32_t E = p->n_logical, P = p->n_physical, NG = p->n_group, NN = p->n_node;
    if (NG % NN) NG = NN = 1;                     /* not hierarchical */
    int32_t gs = E / NG, gpn = NG / NN, En = E / NN, Pn = P / NN, Gn = p->n_gpu / NN,
            per_gpu = P / p->n_gpu;
    int32_t nmax = P > NG ? P : NG;

    /* one scratch block: doubles first, then int32s */
    size_t nd = (size_t) NG + 2 * En + Pn + nmax, ni = (size_t) 2 * NG + 2 * E + 3 * Pn + En + 3 * nmax;
    double *dm = malloc (nd * sizeof (double) + ni * sizeof (int32_t));
    if (!dm) return rx_err_set (err, RX_ENOMEM, "eplb-deepseek: out of memory for %d experts", E);
    double *gw = dm, *wm = gw + NG, *ratio = wm + En, *tphy = ratio + En, *pw = tphy + Pn;
    int32_t *gpack = (int32_t *) (pw + nmax), *grank = gpack + NG, *log2m = grank + NG,
            *m2log = log2m + E, *phy2m = m2log + E, *ppack = phy2m + Pn, *prank = ppack + Pn,
            *mcnt = prank + Pn, *idx = mcnt + En, *pn = idx + nmax;

    for (int32_t l = 0; l < p->n_layer; l++) {
        const double *w = p->load + (size_t) l * E;
        int32_t *out = phy2log + (size_t) l * P;
        /* 1: groups onto nodes */
        for (int32_t g = 0; g < NG; g++) {
            gw[g] = 0;
            for (int32_t j = 0; j < gs; j++) gw[g] += w[g * gs + j];
        }
        eplb_pack (gw, NG, NN, gpack, grank, idx, pw, pn);
        for (int32_t e = 0; e < E; e++) {
            int32_t g = e / gs;
            log2m[e] = (gpack[g] * gpn + grank[g]) * gs + e % gs;
            m2log[log2m[e]] = e;
        }
        for (int32_t n = 0; n < NN; n++) {
            /* 2: replicate within the node */
            for (int32_t j = 0; j < En; j++) wm[j] = w[m2log[n * En + j]];
            eplb_replicate (wm, En, Pn, phy2m, mcnt, ratio);
            /* 3: the node's physical experts onto its GPUs */
            for (int32_t k = 0; k < Pn; k++) tphy[k] = wm[phy2m[k]] / mcnt[phy2m[k]];
            eplb_pack (tphy, Pn, Gn, ppack, prank, idx, pw, pn);
            for (int32_t k = 0; k < Pn; k++)
                out[n * Pn + ppack[k] * per_gpu + prank[k]] = m2log[n * En + phy2m[k]];
        }
    }
    free (dm);
    (void) host;
    return RX_OK;
}

static const struct rx_eplb_ops s_ops = {
    .struct_size = sizeof (struct rx_eplb_ops),
    .rebalance = s_rebalance,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_EPLB, .name = "deepseek", .version = "0.1.0",
                  .description = "DeepSeek's hierarchical EPLB: groups onto nodes, hot experts replicated within a node, packed onto its GPUs",
                  .ops = &s_ops)
