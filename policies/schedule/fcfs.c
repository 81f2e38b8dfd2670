/* policies/schedule/fcfs.c -- first come, first served: priority = arrival. */
#include <radix/plugin.h>
#include <radix/policy.h>

static int s_prioritize (void *inst, struct rx_sched_item *items, size_t n,
                         const struct rx_tree_view *tree, uint64_t seed, struct rx_err *err)
{
    (void) inst; (void) tree; (void) seed; (void) err;
    for (size_t i = 0; i < n; i++)
        items[i].priority = (double) items[i].arrival;
    return RX_OK;
}

static const struct rx_sched_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .prioritize = s_prioritize,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_SCHED_POLICY, .name = "fcfs", .version = "1.0.0",
                  .description = "first come, first served", .ops = &s_ops)
