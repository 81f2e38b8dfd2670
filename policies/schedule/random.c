/* policies/schedule/random.c -- a random order that every rank agrees on:
 * priorities come from a hash of (step seed, request id), never from a
 * process-local generator. */
#include <radix/plugin.h>
#include <radix/policy.h>

/* splitmix64: a fixed, portable mixer. */
static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int s_prioritize (void *inst, struct rx_sched_item *items, size_t n,
                         const struct rx_tree_view *tree, uint64_t seed, struct rx_err *err)
{
    (void) inst; (void) tree; (void) err;
    for (size_t i = 0; i < n; i++)
        items[i].priority = (double) (s_mix (seed ^ s_mix (items[i].rid)) >> 11);
    return RX_OK;
}

static const struct rx_sched_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .prioritize = s_prioritize,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_SCHED_POLICY, .name = "random", .version = "1.0.0",
                  .description = "random order, identical on every rank (seeded per step)",
                  .ops = &s_ops)
