/* policies/schedule/lpm.c -- longest prefix match first (SGLang's "lpm").
 * Requests sharing the most cached tokens run first, so the cached prefix is
 * reused before eviction; ties fall back to arrival order (the core's sort). */
#include <radix/plugin.h>
#include <radix/policy.h>

static int s_prioritize (void *inst, struct rx_sched_item *items, size_t n,
                         const struct rx_tree_view *tree, uint64_t seed, struct rx_err *err)
{
    (void) inst; (void) tree; (void) seed; (void) err;
    for (size_t i = 0; i < n; i++)
        items[i].priority = -(double) items[i].cached_tokens;
    return RX_OK;
}

static const struct rx_sched_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .prioritize = s_prioritize,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_SCHED_POLICY, .name = "lpm", .version = "1.0.0",
                  .description = "longest cached prefix first, then arrival", .ops = &s_ops)
