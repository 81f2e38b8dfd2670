/* radix/moe.h -- the MoE-dispatcher kind (RX_KIND_MOE).
 *
 * ABI: 1.0, being built (members may still be appended before the first
 * release; nothing below is reordered or retyped once released).
 *
 * A mixture-of-experts layer routes each token to its top-k experts.  The
 * model plugin computes the router (scores, top-k ids and weights) and runs
 * the experts' matmuls; the dispatcher moves the token rows between them:
 *
 *   dispatch (x, topk ids, topk weights)
 *       -> the rows this rank's experts must process, grouped by local
 *          expert (counts and offsets on the host, so the model can size
 *          one matmul per expert), in a buffer the instance owns;
 *   the model runs expert e on rows [offsets[e], offsets[e+1]) of
 *       routed.x into the same rows of routed.y;
 *   combine (routed.y)
 *       -> out[t] = sum over t's k choices of weight * y(t, choice), back in
 *          the tokens' original order (on the rank the tokens came from).
 *
 * Plugins: `local` (ep_size 1: no communication), `ep_normal` (experts
 * sharded over ep_size ranks; all_to_all_v with the real per-rank counts
 * exchanged first: dynamic shapes, for prefill), `ep_low_latency` (fixed
 * buffers sized from max_tokens x ranks x local experts, no count exchange
 * on the critical path, graph-capturable: for decode), `ep_auto` (normal
 * for prefill, low-latency for decode).  All give the same outputs as
 * `local` within float tolerance.
 *
 * Experts are sharded contiguously: rank r owns global experts
 * [r*E/ep_size, (r+1)*E/ep_size).
 *
 * Memory: x, the routing and out are device memory of the kernel backend
 * given at create; routed.x / routed.y belong to the instance and stay
 * valid until the next dispatch or destroy (combine may use routed.y as
 * its scratch: its contents are undefined after combine).  The combine order of the k
 * contributions of a token is fixed (choice 0, 1, ..), so results do not
 * depend on the dispatcher or the ranks' timing.
 *
 * Thread-safety: one thread drives an instance; dispatch and combine
 * alternate (dispatch, then combine of that dispatch), and so do their
 * asynchronous halves (dispatch_start .. below: one exchange in flight per
 * instance). */
#ifndef RADIX_MOE_H
#define RADIX_MOE_H

#include <stddef.h>
#include <stdint.h>

#include <radix/comm.h>
#include <radix/err.h>
#include <radix/host.h>
#include <radix/kernel.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parameters of create() (filled by the model plugin). */
struct rx_moe_config {
    uint32_t struct_size;            /* sizeof (struct rx_moe_config) */
    int32_t  n_expert;               /* experts of the layer, all ranks */
    int32_t  n_expert_used;          /* k: choices per token */
    int32_t  n_embd;                 /* width of a dispatched row and of an expert output row */
    int32_t  max_tokens;             /* most tokens one rank dispatches in one call */
    int32_t  ep_rank, ep_size;       /* this rank in the expert-parallel group; 0 / 1 */
    const struct rx_kernels_ops *kops;  /* the kernel backend (borrowed) */
    void    *kbe;
    rx_kstream_t *stream;            /* NULL = default */
    const struct rx_comm_ops *comm;  /* the EP group's comm (NULL when ep_size is 1) */
    void    *comm_inst;
};

/* What dispatch() hands the model: this rank's expert rows. */
struct rx_moe_routed {
    uint32_t struct_size;            /* set by the caller */
    int32_t  first_expert;           /* global id of local expert 0 */
    int32_t  n_local_expert;
    const int32_t *offsets;          /* host [n_local_expert + 1]: rows of local expert e are
                                        [offsets[e], offsets[e+1]) */
    int32_t  n_rows;                 /* offsets[n_local_expert] */
    float   *x;                      /* device [n_rows][n_embd]: the rows to process */
    float   *y;                      /* device [n_rows][n_embd]: where the model writes expert outputs */
    /* -- appended in ABI 1.3 -- */
    uint32_t flags;                  /* in: RX_MOE_ROUTED_* (0: host offsets, as before) */
    const int32_t *d_offsets;        /* out: device [n_local_expert + 1] or NULL (see below) */
    /* -- appended in ABI 1.4 -- */
    int32_t  group_max_tok;          /* in: the largest n_tok of this call over the EP group when
                                        the caller knows it (DP attention: the ranks' chunk of
                                        the same index, from the step's count exchange), else 0.
                                        moe-ep_auto then picks its mode from it instead of an
                                        all_reduce (no host read: its low-latency calls take the
                                        device path too).  Every rank must pass it alike. */
};

/* rx_moe_routed.flags: the caller can run the experts from device offsets
 * alone (the kernel backend's matmul_grouped, radix/kernel.h) and needs no
 * host copy of them.  A dispatcher that honours it sorts the rows on the
 * device without a synchronize (moe-local does, when the backend has
 * moe_sort, gather_rows and moe_combine), so a step with MoE blocks can be
 * captured as a graph: it returns offsets = NULL, d_offsets set, and n_rows
 * an upper bound of the rows (rows from d_offsets[n_local_expert] on are
 * unused).  Dispatchers that honour it: moe-local (n_rows n_tok x k; needs
 * moe_sort, gather_rows, moe_combine) and moe-ep_low_latency (n_rows
 * ep_size x max_tokens x k; needs those and moe_ll_pack / moe_ll_unpack:
 * the fixed-shape exchange then carries the counts on the device, so a
 * step with DP attention + expert parallelism can be captured too).
 * On both, d_offsets - first_expert is valid too, as device offsets
 * [n_expert + 1] over ALL experts (zero-length ranges outside this rank's):
 * what matmul_grouped needs on a 3-D weight holding every expert (pass
 * d_offsets itself for a weight of the local experts only).
 * moe-ep_auto honours it too on a call whose group_max_tok (below) puts
 * it in low-latency mode.  moe-ep_normal, moe-ep_auto without that hint
 * or in normal mode (their per-call choices read counts on the host), and
 * every dispatcher on a backend without those ops ignore the flag: host offsets as before, d_offsets NULL, so the caller checks which
 * it got.  The device sort does not check the ids: a
 * choice outside the experts is left out of the layer (the host path
 * reports it).  Only dispatch() looks at the flag; dispatch_wait hands out
 * host offsets. */
#define RX_MOE_ROUTED_DEVICE (1u << 0)

struct rx_moe_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */

    /* (required) host: the plugin's host table ([moe.<name>] keys).  A
     * config it cannot run (ep_size > 1 without comm, for `local` any
     * ep_size > 1) is RX_EINVAL / RX_ENOTSUP with one line naming it. */
    int  (*create) (const struct rx_host *host, const struct rx_moe_config *cfg, void **moe,
                    struct rx_err *err);
    void (*destroy) (void *moe);
    /* (required) x: [n_tok][ldx] rows; ids: device int32 [n_tok][k] global
     * expert ids; w: device F32 [n_tok][k] weights.  n_tok may be 0 (an
     * idle rank still takes part in the collectives).  n_tok > max_tokens
     * is RX_ERANGE (never a buffer overrun). */
    int  (*dispatch) (void *moe, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                      const float *w, struct rx_moe_routed *routed, struct rx_err *err);
    /* (required) out[t] (= or += with RX_MM_ACCUMULATE in flags) the
     * weighted sum of token t's expert outputs, from routed->y of the last
     * dispatch. */
    int  (*combine) (void *moe, float *out, size_t ldo, uint32_t flags, struct rx_err *err);

    /* ---- ABI 1.0 ends here.  Append only below. ---- */

    /* (optional, all four or none: check with RX_HAS (struct rx_moe_ops,
     * ops, combine_wait)) the asynchronous halves of dispatch / combine, for
     * two-batch overlap: the model computes one micro-batch while the other
     * micro-batch's exchange is in flight through the comm plugin's
     * start/wait.  One exchange is in flight per instance, so a model that
     * overlaps two micro-batches creates two instances (one per
     * micro-batch; they may share one comm instance: comm collectives run
     * in issue order, and every rank issues them in the same order).
     *   dispatch (x, ..) == dispatch_start (x, ..) + dispatch_wait (routed)
     *   combine (out, ..) == combine_start (out, ..) + combine_wait ()
     * with identical results.  Between a start and its wait the instance's
     * buffers belong to the exchange; x, ids and w may be reused as soon
     * as dispatch_start returns (the rows are copied out), out must stay
     * valid until combine_wait (which writes it).  A start may still block
     * on a collective it needs first (ep_normal exchanges the row counts
     * before it can size the rows' exchange; ep_auto agrees on the mode):
     * only the bulk row exchange overlaps.  Calls out of order (a wait with
     * nothing started, a second start before the wait, combine_start
     * without a dispatched batch) are RX_EINVAL.  A plugin without real
     * overlap (`local`) does the work in start or wait. */
    int  (*dispatch_start) (void *moe, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                            const float *w, struct rx_err *err);
    int  (*dispatch_wait) (void *moe, struct rx_moe_routed *routed, struct rx_err *err);
    int  (*combine_start) (void *moe, float *out, size_t ldo, uint32_t flags, struct rx_err *err);
    int  (*combine_wait) (void *moe, struct rx_err *err);
};

#define RX_MOE_OPS_SIZE_1_0 \
    (offsetof (struct rx_moe_ops, combine) + sizeof (void *))

/* An expert placement (EPLB, docs/eplb.md "At run time"), as the core hands
 * it to a model plugin (rx_model_ops.set_placement).  Each MoE layer has
 * n_physical expert slots (n_logical + redundant copies); slot s of layer l
 * runs the weights of logical expert phy2log[l][s].  The model maps each
 * token's chosen logical expert to one of its copies before dispatch, so
 * the dispatcher is created with n_expert = n_physical and works on slots
 * (rank r owns slots [r*P/ep_size, (r+1)*P/ep_size)).  Layers are counted
 * over the MoE layers only (a model's dense leading blocks have no row).
 * Arrays are host memory owned by the core, valid until the next
 * set_placement or the model's destroy. */
struct rx_moe_placement {
    uint32_t struct_size;            /* sizeof (struct rx_moe_placement) */
    int32_t  n_layer, n_logical, n_physical;
    int32_t  max_copies;             /* stride of log2phy */
    const int32_t *phy2log;          /* [n_layer][n_physical] */
    const int32_t *logcnt;           /* [n_layer][n_logical], each >= 1 */
    const int32_t *log2phy;          /* [n_layer][n_logical][max_copies], -1 padded */
};

#ifdef __cplusplus
}
#endif
#endif /* RADIX_MOE_H */
