/* radix/policy.h -- the schedule-policy kind (RX_KIND_SCHED_POLICY).
 *
 * ABI: stable since 1.0.  A schedule policy orders the waiting queue of one
 * scheduler before each step's admission (SGLang's SchedulePolicy).  The
 * core keeps the queue; the policy only assigns a priority to every waiting
 * request, and the core sorts ascending by (priority, arrival) -- a stable,
 * deterministic order, which the multi-rank engine relies on: every rank
 * runs the same policy on the same inputs and must get the same order.
 *
 * Thread-safety: one instance is used by one scheduler thread. */
#ifndef RADIX_POLICY_H
#define RADIX_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/host.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A waiting request as the policy sees it. */
struct rx_sched_item {
    uint64_t  rid;            /* request id (unique per scheduler) */
    uint64_t  arrival;        /* arrival sequence number, increasing */
    uint32_t  prompt_tokens;  /* tokens of the prompt (input) */
    uint32_t  cached_tokens;  /* tokens matched in the radix cache */
    uintptr_t node;           /* deepest matched radix-cache node (0 = root) */
    double    priority;       /* OUT: lower runs first */
};

/* A read-only view of the radix cache's tree shape, for tree-aware policies
 * (dfs_weight).  Node ids are opaque; root has no parent. */
struct rx_tree_view {
    const void *ctx;
    uintptr_t   root;
    uintptr_t (*parent) (const void *ctx, uintptr_t node);  /* root -> root */
};

struct rx_sched_policy_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */
    /* (optional) make an instance; if NULL the instance is NULL. */
    int  (*create) (const struct rx_host *host, void **inst, struct rx_err *err);
    /* (optional) */
    void (*destroy) (void *inst);
    /* (required) fill items[i].priority for all n items.  seed is the same
     * on every rank for a given step (randomised policies use only it). */
    int  (*prioritize) (void *inst, struct rx_sched_item *items, size_t n,
                        const struct rx_tree_view *tree, uint64_t seed,
                        struct rx_err *err);
    /* ---- ABI 1.0 ends here ---- */
};

#define RX_SCHED_POLICY_OPS_SIZE_1_0 \
    (offsetof (struct rx_sched_policy_ops, prioritize) + sizeof (void *))

#ifdef __cplusplus
}
#endif
#endif /* RADIX_POLICY_H */
