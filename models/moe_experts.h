/* models/moe_experts.h -- the routed experts of an MoE layer over the rows
 * a dispatcher handed out (radix/moe.h), written once for every MoE model
 * (model-llama, model-deepseek2).  Header-only: plugins link no shared code.
 *
 * rx_moe_experts_device (place, n_tok): whether a dispatch of n_tok tokens
 * should ask for device offsets (RX_MOE_ROUTED_DEVICE): the backend runs
 * the ABI 1.3 expert ops and a host copy costs there (asynchronous or
 * graph-capturing: rx_moe_place_init), the step is a decode step (one
 * token per sequence) of n_tok <= RX_MOE_DEVICE_MAX_TOKENS, the placement
 * is the identity (the grouped matmul runs expert e's own weights, not a
 * slot's logical expert) and nothing counts this step (rx_moe_place_route
 * copies the ids to the host for that anyway).  Prefill and mixed steps
 * keep host offsets: each expert's rows are one matmul there, which a GPU
 * backend runs as a GEMM, while kernels-cuda's grouped matmul is a matvec
 * per row, made for decode; the one synchronize per layer is small beside
 * a prefill.
 *
 * rx_moe_experts (kc, place, layer, r, w, scratch, err): each local expert
 * e runs down(silu(gate_e x) * up_e x) over its rows of r->x into the same
 * rows of r->y.
 *   - host offsets (r->offsets): one matmul per expert with rows, of the
 *     weights of the slot's logical expert (models/moe_place.h), in pieces
 *     of at most w->piece rows (gate / up hold that many);
 *   - device offsets (r->d_offsets, r->offsets NULL): matmul_grouped over
 *     the r->n_rows rows in windows of w->piece rows, no host copy.
 * Both give the same numbers on kernels-cpu (its grouped matmul is its
 * matmul per expert; test_engine checks the two paths bit for bit, with
 * emulated graphs, which make kernels-cpu take the device path).
 *
 * Thread-safety: as the model instance (one thread). */
#ifndef RX_MODELS_MOE_EXPERTS_H
#define RX_MODELS_MOE_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include <radix/attn.h>
#include <radix/err.h>
#include <radix/kernel.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#include "moe_place.h"

/* Most tokens of one dispatch that take the device-offset path. */
#define RX_MOE_DEVICE_MAX_TOKENS 256

/* One MoE layer's expert weights and the model's scratch for them. */
struct rx_moe_expert_w {
    const rx_kweight_t *gate, *up, *down;   /* [n_embd, n_ff_exp, n_expert] .. */
    float *g, *u;                            /* scratch: piece x ff rows each */
    size_t E, FE;                            /* n_embd, n_ff_exp */
    size_t piece;                            /* rows g and u hold */
};

static inline int rx_moe_experts_device (const struct rx_moe_place *place, size_t n_tok)
{
    return place->dev_backend && place->decode && !place->pl && !rx_moe_place_counting (place)
           && n_tok <= RX_MOE_DEVICE_MAX_TOKENS;
}

static inline int rx_moe_experts (const struct rx_kctx *kc, const struct rx_moe_place *place,
                                  int32_t layer, const struct rx_moe_routed *r,
                                  const struct rx_moe_expert_w *w, struct rx_err *err)
{
    const struct rx_kernels_ops *K = kc->ops;
    void *be = kc->be;
    rx_kstream_t *st = kc->stream;
    const size_t E = w->E, FE = w->FE, P = w->piece;
    int rc = RX_OK;
    if (!r->offsets) {
        if (!r->d_offsets || !K->matmul_grouped)
            return rx_err_set (err, RX_EINVAL, "moe experts: the dispatch gave neither host nor device offsets");
        /* The weights hold every expert: matmul_grouped takes offsets over
         * all of them, which d_offsets - first_expert is (radix/moe.h). */
        const int32_t *goff = r->d_offsets - r->first_expert;
        for (size_t r0 = 0; r0 < (size_t) r->n_rows && rc == RX_OK; r0 += P) {
            const size_t nr = (size_t) r->n_rows - r0 < P ? (size_t) r->n_rows - r0 : P;
            const float *xr = r->x + r0 * E;
            rc = K->matmul_grouped (be, st, w->gate, goff, r0, xr, E, w->g, FE, nr, 0, err);
            if (rc == RX_OK)
                rc = K->matmul_grouped (be, st, w->up, goff, r0, xr, E, w->u, FE, nr, 0, err);
            if (rc == RX_OK) rc = K->swiglu (be, st, w->g, FE, w->u, FE, w->g, FE, nr, FE, err);
            if (rc == RX_OK)
                rc = K->matmul_grouped (be, st, w->down, goff, r0, w->g, FE, r->y + r0 * E, E, nr,
                                        0, err);
        }
        return rc;
    }
    for (int32_t e = 0; e < r->n_local_expert && rc == RX_OK; e++) {
        const int expert = rx_moe_place_logical (place, layer, r->first_expert + e);
        /* An expert with more rows than the scratch holds (duplicate ids,
         * rows from every rank of an expert-parallel group) runs in pieces. */
        for (size_t r0 = (size_t) r->offsets[e]; r0 < (size_t) r->offsets[e + 1] && rc == RX_OK; r0 += P) {
            const size_t left = (size_t) r->offsets[e + 1] - r0, nr = left < P ? left : P;
            const float *xr = r->x + r0 * E;
            rc = K->matmul (be, st, w->gate, expert, xr, E, w->g, FE, nr, 0, err);
            if (rc == RX_OK) rc = K->matmul (be, st, w->up, expert, xr, E, w->u, FE, nr, 0, err);
            if (rc == RX_OK) rc = K->swiglu (be, st, w->g, FE, w->u, FE, w->g, FE, nr, FE, err);
            if (rc == RX_OK)
                rc = K->matmul (be, st, w->down, expert, w->g, FE, r->y + r0 * E, E, nr, 0, err);
        }
    }
    return rc;
}

#endif /* RX_MODELS_MOE_EXPERTS_H */
