/* skeleton.c -- a complete out-of-tree radix plugin: a schedule policy that
 * runs short prompts first.  Copy this folder to start your own plugin; it
 * needs only the installed headers (pkg-config radix-plugin), never radix's
 * sources or libraries.  See docs/plugins.md. */
#include <radix/host.h>
#include <radix/plugin.h>
#include <radix/policy.h>

/* The INI keys of section [scheduler.skeleton]; radixd validates them
 * before any code of ours runs. */
static const struct rx_cfg_key s_keys[] = {
    { "long_first", RX_CFG_BOOL, "false", "run the longest prompts first instead", 0, 0, NULL },
    { "cached_weight", RX_CFG_FLOAT, "1.0", "how much a cached token counts as already done",
      0, 1, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

struct skeleton {
    const struct rx_host *host;
    int long_first;
    double cached_weight;
};

static int s_create (const struct rx_host *host, void **inst, struct rx_err *err)
{
    struct skeleton *s = host->alloc (host, sizeof *s, 0);
    if (!s)
        return rx_err_set (err, RX_ENOMEM, "skeleton: out of memory");
    s->host = host;
    host->cfg_bool (host, "long_first", &s->long_first);
    host->cfg_float (host, "cached_weight", &s->cached_weight);
    RX_HLOG (host, RX_LOG_INFO, "ready: %s prompts first", s->long_first ? "long" : "short");
    *inst = s;
    return RX_OK;
}

static void s_destroy (void *inst)
{
    struct skeleton *s = inst;
    if (s) s->host->free_ (s->host, s);
}

static int s_prioritize (void *inst, struct rx_sched_item *items, size_t n,
                         const struct rx_tree_view *tree, uint64_t seed, struct rx_err *err)
{
    struct skeleton *s = inst;
    (void) tree; (void) seed; (void) err;
    for (size_t i = 0; i < n; i++) {
        double work = items[i].prompt_tokens - s->cached_weight * items[i].cached_tokens;
        items[i].priority = s->long_first ? -work : work;
    }
    return RX_OK;
}

static const struct rx_sched_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .create = s_create,
    .destroy = s_destroy,
    .prioritize = s_prioritize,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_SCHED_POLICY, .name = "skeleton", .version = "0.1.0",
                  .description = "example out-of-tree policy: shortest remaining prompt first",
                  .keys = s_keys, .ops = &s_ops)
