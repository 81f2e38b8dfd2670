/* models/moe_place.h -- expert placement (EPLB) and expert-distribution
 * recording in a model plugin's MoE layer, written once for every MoE model
 * (model-llama, model-deepseek2).  Header-only: plugins link no shared code.
 *
 * After its top-k a model calls
 *   rx_moe_place_count  to add its rows' (token, logical expert) choices to
 *                       the core's recording array (rx_model_env
 *                       .expert_count; nothing when NULL), and
 *   rx_moe_place_map    to replace each logical id by one of its physical
 *                       copies (nothing under the identity placement).
 * Both work on host ids: a model whose ids are on the device calls
 * rx_moe_place_route, which copies the n x k ids down (kops->copy_d2h, a
 * few hundred bytes), counts, maps and copies them back only when the
 * placement is not the identity.  On kernels-cpu the copies are memcpy.
 *
 * Choice of copy (deterministic, the same on every rank, spreads tokens
 * evenly over the copies): token row t of rank r (t counted from the first
 * row of this forward on this rank) with logical expert e of layer l goes to
 * slot log2phy[l][e][(t + r) % logcnt[l][e]].  Outputs do not depend on it:
 * every copy runs the same weights.
 *
 * Weights: slot s runs the weights of logical expert phy2log[l][s]
 * (rx_moe_place_logical).  On kernels-cpu the expert tensors are mmapped
 * whole, so "moving" an expert to a slot is pointing at the logical
 * expert's slice; a device backend that keeps only its slots' weights would
 * copy them from the host mapping when the placement changes.
 *
 * Thread-safety: as the model instance (one thread). */
#ifndef RX_MODELS_MOE_PLACE_H
#define RX_MODELS_MOE_PLACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <radix/err.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/moe.h>
#include <radix/plugin.h>

struct rx_moe_place {
    const struct rx_moe_placement *pl;   /* NULL = identity (n_physical = n_expert) */
    int64_t *count;                      /* env->expert_count or NULL */
    int32_t count_layers, count_experts;
    int32_t *ids_h;                      /* host scratch for device ids [cap] */
    size_t cap;
    int on;                              /* count this step (rx_moe_place_step) */
    int decode;                          /* this step is one token per sequence */
    int dev_backend;                     /* the backend runs the expert pass on the device
                                          * (models/moe_experts.h; set at init) */
};

/* At the start of each forward: whether this step's choices are counted
 * (rx_model_batch.count_experts; a batch without the member: yes). */
static inline void rx_moe_place_step (struct rx_moe_place *mp, const struct rx_model_batch *b)
{
    mp->on = b->struct_size >= offsetof (struct rx_model_batch, count_experts) + sizeof b->count_experts
                 ? b->count_experts != 0 : 1;
    mp->decode = b->n_tokens == b->n_seq;
}

/* Whether this step counts the choices (a host copy of the ids). */
static inline int rx_moe_place_counting (const struct rx_moe_place *mp)
{
    return mp->count && mp->on;
}

/* From the env at create.  n_moe_layer / n_expert: the model's; an array
 * too small for them is RX_EINVAL. */
static inline int rx_moe_place_init (struct rx_moe_place *mp, const char *who,
                                     const struct rx_model_env *env, int32_t n_moe_layer,
                                     int32_t n_expert, struct rx_err *err)
{
    mp->pl = NULL;
    mp->count = NULL;
    mp->ids_h = NULL;
    mp->cap = 0;
    mp->on = 1;
    mp->decode = 0;
    /* The ABI 1.3 expert ops on a backend where a host copy costs: an
     * asynchronous or graph-capturing one.  On a synchronous host backend
     * (kernels-cpu) the host path costs nothing and keeps its checks of
     * the ids. */
    struct rx_kernels_info ki = { .struct_size = sizeof ki };
    const struct rx_kernels_ops *K = env->k.ops;
    mp->dev_backend = K && RX_HAS (struct rx_kernels_ops, K, moe_combine) && K->matmul_grouped && K->moe_sort
                      && K->gather_rows && K->info && K->info (env->k.be, &ki) == RX_OK
                      && (ki.caps & (RX_KCAP_ASYNC | RX_KCAP_GRAPHS));
    if (env->struct_size < offsetof (struct rx_model_env, expert_count_experts) + sizeof (int32_t)
        || !env->expert_count || n_moe_layer <= 0)
        return RX_OK;
    if (env->expert_count_layers < n_moe_layer || env->expert_count_experts != n_expert)
        return rx_err_set (err, RX_EINVAL,
                           "%s: the expert-recording array is [%d][%d]; the model has %d MoE layers of %d experts",
                           who, env->expert_count_layers, env->expert_count_experts, n_moe_layer, n_expert);
    mp->count = env->expert_count;
    mp->count_layers = env->expert_count_layers;
    mp->count_experts = env->expert_count_experts;
    return RX_OK;
}

static inline void rx_moe_place_fini (struct rx_moe_place *mp)
{
    free (mp->ids_h);
    mp->ids_h = NULL;
    mp->cap = 0;
    mp->pl = NULL;
}

/* Check pl against the model (NULL: back to the identity) and take it. */
static inline int rx_moe_place_set (struct rx_moe_place *mp, const char *who,
                                    const struct rx_moe_placement *pl, int32_t n_moe_layer,
                                    int32_t n_expert, struct rx_err *err)
{
    if (pl) {
        if (pl->struct_size < sizeof *pl || !pl->phy2log || !pl->logcnt || !pl->log2phy)
            return rx_err_set (err, RX_EINVAL, "%s: set_placement: incomplete placement", who);
        if (pl->n_layer != n_moe_layer || pl->n_logical != n_expert || pl->n_physical < n_expert
            || pl->max_copies < 1)
            return rx_err_set (err, RX_EINVAL,
                               "%s: set_placement: placement of %d layers x %d experts (%d slots); the model has %d MoE layers x %d experts",
                               who, pl->n_layer, pl->n_logical, pl->n_physical, n_moe_layer, n_expert);
        for (int64_t i = 0; i < (int64_t) pl->n_layer * pl->n_physical; i++)
            if (pl->phy2log[i] < 0 || pl->phy2log[i] >= n_expert)
                return rx_err_set (err, RX_EINVAL, "%s: set_placement: slot %lld holds expert %d (0 .. %d)",
                                   who, (long long) i, pl->phy2log[i], n_expert - 1);
        for (int64_t i = 0; i < (int64_t) pl->n_layer * pl->n_logical; i++)
            if (pl->logcnt[i] < 1 || pl->logcnt[i] > pl->max_copies)
                return rx_err_set (err, RX_EINVAL, "%s: set_placement: expert %lld has %d copies (1 .. %d)",
                                   who, (long long) i, pl->logcnt[i], pl->max_copies);
    }
    mp->pl = pl;
    return RX_OK;
}

static inline int32_t rx_moe_place_n_physical (const struct rx_moe_place *mp, int32_t n_expert)
{
    return mp->pl ? mp->pl->n_physical : n_expert;
}

/* The logical expert whose weights slot s of MoE layer l runs. */
static inline int32_t rx_moe_place_logical (const struct rx_moe_place *mp, int32_t l, int32_t s)
{
    return mp->pl ? mp->pl->phy2log[(size_t) l * (size_t) mp->pl->n_physical + (size_t) s] : s;
}

/* Host scratch for rx_moe_place_route: n_ids ids (reserve time). */
static inline int rx_moe_place_reserve (struct rx_moe_place *mp, const char *who, size_t n_ids,
                                        struct rx_err *err)
{
    if (n_ids <= mp->cap) return RX_OK;
    int32_t *v = realloc (mp->ids_h, n_ids * sizeof *v);
    if (!v) return rx_err_set (err, RX_ENOMEM, "%s: out of memory (expert ids)", who);
    mp->ids_h = v;
    mp->cap = n_ids;
    return RX_OK;
}

/* Count n rows of k logical ids (host) of MoE layer l. */
static inline void rx_moe_place_count (const struct rx_moe_place *mp, int32_t l, const int32_t *ids,
                                       size_t n, size_t k)
{
    if (!rx_moe_place_counting (mp) || l < 0 || l >= mp->count_layers) return;
    int64_t *row = mp->count + (size_t) l * (size_t) mp->count_experts;
    for (size_t i = 0; i < n * k; i++)
        if (ids[i] >= 0 && ids[i] < mp->count_experts) row[ids[i]]++;
}

/* Map n rows of k logical ids (host, in place) of MoE layer l to slots;
 * rank: this rank in the group (spreads the ranks' rows over the copies). */
static inline void rx_moe_place_map (const struct rx_moe_place *mp, int32_t l, int32_t *ids, size_t n,
                                     size_t k, int32_t rank)
{
    const struct rx_moe_placement *pl = mp->pl;
    if (!pl) return;
    const int32_t *cnt = pl->logcnt + (size_t) l * (size_t) pl->n_logical;
    const int32_t *l2p = pl->log2phy + (size_t) l * (size_t) pl->n_logical * (size_t) pl->max_copies;
    for (size_t t = 0; t < n; t++)
        for (size_t j = 0; j < k; j++) {
            int32_t e = ids[t * k + j];
            if (e < 0 || e >= pl->n_logical) continue;
            size_t c = (t + (size_t) (rank > 0 ? rank : 0)) % (size_t) cnt[e];
            ids[t * k + j] = l2p[(size_t) e * (size_t) pl->max_copies + c];
        }
}

/* Device ids [n][k] of MoE layer l: count and map (see the header). */
static inline int rx_moe_place_route (struct rx_moe_place *mp, const struct rx_kctx *kc, int32_t l,
                                      int32_t *ids_dev, size_t n, size_t k, int32_t rank,
                                      struct rx_err *err)
{
    if ((!rx_moe_place_counting (mp) && !mp->pl) || n == 0) return RX_OK;
    if (n * k > mp->cap)
        return rx_err_set (err, RX_ERANGE, "moe placement: %zu ids, scratch for %zu", n * k, mp->cap);
    const struct rx_kernels_ops *K = kc->ops;
    int rc = K->copy_d2h (kc->be, kc->stream, mp->ids_h, ids_dev, n * k * sizeof (int32_t), err);
    if (rc == RX_OK) rc = K->synchronize (kc->be, kc->stream, err);
    if (rc != RX_OK) return rc;
    rx_moe_place_count (mp, l, mp->ids_h, n, k);
    if (!mp->pl) return RX_OK;
    rx_moe_place_map (mp, l, mp->ids_h, n, k, rank);
    return K->copy_h2d (kc->be, kc->stream, ids_dev, mp->ids_h, n * k * sizeof (int32_t), err);
}

#endif /* RX_MODELS_MOE_PLACE_H */
