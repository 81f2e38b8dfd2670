/* radix/eplb.h -- the expert-placement kind (RX_KIND_EPLB): EPLB algorithms.
 *
 * ABI: 1.0, being built (members may still be appended before the first
 * release; nothing below is reordered or retyped once released).
 *
 * Expert-parallel load balancing (../shared/seeds/003_*.txt, DeepSeek's
 * EPLB): given the recorded load of every (layer, logical expert), choose
 * which logical expert each of the n_physical expert slots holds.  Slots are
 * more than experts by the redundant count, so hot experts get several
 * copies.  GPU g (of n_gpu) owns the contiguous slots
 * [g*n_physical/n_gpu, (g+1)*n_physical/n_gpu); node n (of n_node) owns the
 * GPUs [n*n_gpu/n_node, (n+1)*n_gpu/n_node).
 *
 * An algorithm plugin computes phy2log only.  The core derives the replica
 * counts (logcnt), the logical->physical lists (log2phy, in increasing slot
 * order) and the balancedness from it (core/eplb.c), so every algorithm is
 * judged by the same code.
 *
 * Plugins: `deepseek` (DeepSeek's hierarchical algorithm: groups packed onto
 * nodes, replication within a node, packing onto the node's GPUs), `greedy`
 * (a baseline).  The result must be deterministic: the same input gives the
 * same placement on every rank and every run.
 *
 * Thread-safety: rebalance() is a pure function of its arguments; it may be
 * called from several threads at once. */
#ifndef RADIX_EPLB_H
#define RADIX_EPLB_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/host.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The input of one rebalance. */
struct rx_eplb_problem {
    uint32_t struct_size;        /* sizeof (struct rx_eplb_problem) */
    int32_t  n_layer;            /* MoE layers */
    int32_t  n_logical;          /* experts per layer */
    int32_t  n_physical;         /* slots per layer: n_logical + redundant */
    int32_t  n_group;            /* expert groups (1 = no grouping) */
    int32_t  n_node;             /* nodes */
    int32_t  n_gpu;              /* GPUs (EP ranks) in all */
    const double *load;          /* [n_layer][n_logical]: tokens routed (>= 0) */
};

struct rx_eplb_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */

    /* (required) host: the plugin's host table (its [eplb.<name>] keys).
     * Fill phy2log [n_layer][n_physical] (caller-allocated) with the
     * logical expert each slot holds.  Every logical expert must get at
     * least one slot.  A problem the algorithm cannot place (n_logical not
     * divisible by n_group, n_physical not divisible by n_gpu, n_gpu not
     * divisible by n_node, n_physical < n_logical, a size <= 0) is
     * RX_EINVAL with one line naming the numbers. */
    int  (*rebalance) (const struct rx_host *host, const struct rx_eplb_problem *p,
                       int32_t *phy2log, struct rx_err *err);

    /* ---- ABI 1.0 ends here.  Append only below. ---- */
};

#define RX_EPLB_OPS_SIZE_1_0 \
    (offsetof (struct rx_eplb_ops, rebalance) + sizeof (void *))

#ifdef __cplusplus
}
#endif
#endif /* RADIX_EPLB_H */
