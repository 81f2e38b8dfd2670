/* models/dp_ffn.h -- the DP-attention pieces every model plugin runs the
 * same way (radix/model.h, rx_model_env.dp_attn), written once.
 * Header-only: plugins link no shared code.
 *
 * Under DP attention each rank has its own rows; the dense FFN is split over
 * the N ranks as tensor parallelism splits it:
 *   rx_dp_counts   every rank's row count (all_gather of one int32; a rank
 *                  whose batch was refused sends -1 and every rank fails the
 *                  step), *M = the largest: the padded block size of the
 *                  collectives that follow;
 *   rx_dp_counts_graph  the same exchange carrying each rank's "my step may
 *                  replay a graph" flag as a high bit of its count: *all =
 *                  the flags' MIN (SGLang's all-reduce(MIN) of
 *                  can_cuda_graph), the same on every rank, so either every
 *                  rank replays its graph of M rows (padded) or none does;
 *   rx_dp_ffn      x += FFN(rms_norm(x)) for this rank's n rows (n may be 0:
 *                  an idle rank): every rank's rows padded to M are gathered
 *                  into g ([N*M][E], this rank's block normed in place), this
 *                  rank's FFN slice runs over all N*M rows into d, and the
 *                  reduce-scatter hands each rank the summed output of its
 *                  own block (into hout), added to x. */
#ifndef RX_MODELS_DP_FFN_H
#define RX_MODELS_DP_FFN_H

#include <stddef.h>
#include <stdint.h>

#include <radix/attn.h>
#include <radix/comm.h>
#include <radix/err.h>
#include <radix/kernel.h>

/* What the pieces need of a model (its buffers, borrowed). */
struct rx_dp_ffn {
    const char *who;                 /* "model-llama", for messages */
    struct rx_kctx k;
    const struct rx_comm_ops *comm;
    void *comm_inst;
    int32_t rank, n_rank, max_tokens;
    int32_t *cnt;                    /* device [n_rank] */
    int32_t *cnt_h;                  /* host [n_rank] */
    float *x, *g, *d, *gate, *up, *hout;
    size_t E, F;                     /* embedding width, this rank's FFN columns */
    float eps;
};

#define RX_DP_TRY(expr) do { int rc_ = (expr); if (rc_ != RX_OK) return rc_; } while (0)

/* Set in a sent count: this rank's step cannot be a graph replay (counts
 * are at most 1 << 24, reserve's bound). */
#define RX_DP_NO_GRAPH (1 << 30)

static inline int rx_dp_counts_graph (const struct rx_dp_ffn *m, int32_t n, int graph_ok, int32_t *M,
                                      int *all, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    const size_t N = (size_t) m->n_rank;
    const int32_t sent = n < 0 || graph_ok ? n : n | RX_DP_NO_GRAPH;
    RX_DP_TRY (K->copy_h2d (m->k.be, m->k.stream, m->cnt + m->rank, &sent, sizeof sent, err));
    RX_DP_TRY (m->comm->all_gather (m->comm_inst, m->k.stream, m->cnt + m->rank, m->cnt, 1, RX_I32, err));
    RX_DP_TRY (K->copy_d2h (m->k.be, m->k.stream, m->cnt_h, m->cnt, N * sizeof (int32_t), err));
    /* The shapes of every later collective depend on the counts. */
    RX_DP_TRY (K->synchronize (m->k.be, m->k.stream, err));
    int32_t mx = 0;
    int ok = 1;
    for (size_t r = 0; r < N; r++) {
        if (m->cnt_h[r] < 0 && (int32_t) r != m->rank)
            return rx_err_set (err, RX_EIO,
                               "%s: DP attention: rank %zu refused its batch (see its log); rank %d stops this step too",
                               m->who, r, m->rank);
        if (m->cnt_h[r] & RX_DP_NO_GRAPH) ok = 0;
        const int32_t c = m->cnt_h[r] & ~RX_DP_NO_GRAPH;
        if (c > mx) mx = c;
    }
    if (mx > m->max_tokens)
        return rx_err_set (err, RX_EINVAL,
                           "%s: DP attention: a rank has %d tokens, more than this rank's max_tokens %d (every rank must reserve the same)",
                           m->who, mx, m->max_tokens);
    *M = mx;
    if (all) *all = ok && mx > 0;
    return RX_OK;
}

static inline int rx_dp_counts (const struct rx_dp_ffn *m, int32_t n, int32_t *M, struct rx_err *err)
{
    return rx_dp_counts_graph (m, n, 0, M, NULL, err);
}

static inline int rx_dp_ffn (const struct rx_dp_ffn *m, const float *ffn_norm, const rx_kweight_t *w_gate,
                             const rx_kweight_t *w_up, const rx_kweight_t *w_down, size_t n, size_t M,
                             struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->k.ops;
    void *be = m->k.be;
    rx_kstream_t *st = m->k.stream;
    const size_t E = m->E, F = m->F, R = (size_t) m->n_rank * M;
    float *mine = m->g + (size_t) m->rank * M * E;
    if (n > 0) RX_DP_TRY (K->rms_norm (be, st, m->x, E, ffn_norm, mine, E, n, E, m->eps, err));
    RX_DP_TRY (m->comm->all_gather (m->comm_inst, st, mine, m->g, M * E, RX_F32, err));
    RX_DP_TRY (K->matmul (be, st, w_gate, -1, m->g, E, m->gate, F, R, 0, err));
    RX_DP_TRY (K->matmul (be, st, w_up, -1, m->g, E, m->up, F, R, 0, err));
    RX_DP_TRY (K->swiglu (be, st, m->gate, F, m->up, F, m->gate, F, R, F, err));
    RX_DP_TRY (K->matmul (be, st, w_down, -1, m->gate, F, m->d, E, R, 0, err));
    RX_DP_TRY (m->comm->reduce_scatter (m->comm_inst, st, m->d, m->hout, M * E, RX_F32, RX_COMM_SUM, err));
    if (n > 0) RX_DP_TRY (K->add (be, st, m->x, E, m->hout, E, m->x, E, n, E, err));
    return RX_OK;
}

#endif
