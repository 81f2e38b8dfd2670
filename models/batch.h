/* models/batch.h -- what every model plugin does with a struct
 * rx_model_batch before its layers (radix/model.h's batch contract),
 * written once.  Header-only: plugins link no shared code.
 *
 * rx_model_batch_check (who, b, max_tokens, n_vocab, n_slots, allow_idle,
 * err): RX_OK, or RX_EINVAL with one line "<who>: forward: ..." naming the
 * first thing wrong.  allow_idle: an idle batch (0 tokens, 0 sequences, 0
 * output rows; DP attention) is accepted.
 *
 * struct rx_model_stage: the batch's index arrays, staged in one host block
 * and uploaded to the device in one copy per step (rx_model_stage_upload_padded:
 * with pad rows appended, for DP attention's graphs):
 *   tokens[T] pos[T] new_slots[T] q_start[T+1] kv_start[T+1] kv_slots[cap]
 * (T = max_tokens of reserve; new_slots[t] = the KV slot token t writes).
 * rx_model_stage_alloc sizes it for cap KV-slot entries (freeing an older
 * one), rx_model_stage_upload grows it when a batch has more, fills and
 * uploads it and points *d at the device arrays, rx_model_stage_free
 * releases it.
 *
 * rx_model_logits (k, b, x, tmp, E, norm_w, eps, output, n_vocab, err): after
 * the layers, b->logits = rms_norm (x rows b->out_rows) * norm_w, times
 * output^T; the rows are gathered into tmp (at least n_out x E floats) in
 * runs of consecutive rows unless every row is asked for. */
#ifndef RX_MODELS_BATCH_H
#define RX_MODELS_BATCH_H

#include <string.h>

#include <radix/attn.h>
#include <radix/host.h>

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/model.h>

static inline int rx_model_batch_check (const char *who, const struct rx_model_batch *b,
                                        int32_t max_tokens, int32_t n_vocab, uint64_t n_slots,
                                        int allow_idle, struct rx_err *err)
{
    if (!b || b->struct_size < offsetof (struct rx_model_batch, logits) + sizeof b->logits)
        return rx_err_set (err, RX_EINVAL, "%s: forward: NULL or short batch", who);
    if (max_tokens == 0)
        return rx_err_set (err, RX_EINVAL, "%s: forward before reserve()", who);
    const int32_t n = b->n_tokens;
    if (n == 0 && allow_idle) {
        if (b->n_seq != 0 || b->n_out != 0)
            return rx_err_set (err, RX_EINVAL,
                               "%s: forward: an idle batch (0 tokens) with %d sequences and %d output rows (both must be 0)",
                               who, b->n_seq, b->n_out);
        return RX_OK;
    }
    if (n == 0)
        return rx_err_set (err, RX_EINVAL, "%s: forward: 0 tokens (an idle batch needs DP attention)", who);
    if (n < 0 || n > max_tokens)
        return rx_err_set (err, RX_EINVAL, "%s: forward: %d tokens (1 .. %d reserved)", who, n, max_tokens);
    if (b->n_seq <= 0 || b->n_seq > n)
        return rx_err_set (err, RX_EINVAL, "%s: forward: %d sequences for %d tokens", who, b->n_seq, n);
    if (!b->tokens || !b->pos || !b->q_start || !b->kv_start || !b->kv_slots)
        return rx_err_set (err, RX_EINVAL, "%s: forward: NULL tokens, pos, q_start, kv_start or kv_slots", who);
    if (b->n_out < 0 || b->n_out > n || (b->n_out > 0 && (!b->out_rows || !b->logits)))
        return rx_err_set (err, RX_EINVAL, "%s: forward: %d output rows for %d tokens (or NULL rows/logits)",
                           who, b->n_out, n);
    if (b->q_start[0] != 0 || b->q_start[b->n_seq] != n || b->kv_start[0] != 0)
        return rx_err_set (err, RX_EINVAL, "%s: forward: q_start must run 0 .. %d and kv_start start at 0", who, n);
    for (int32_t s = 0; s < b->n_seq; s++) {
        int32_t q0 = b->q_start[s], q1 = b->q_start[s + 1];
        int32_t k0 = b->kv_start[s], k1 = b->kv_start[s + 1];
        if (q1 <= q0)
            return rx_err_set (err, RX_EINVAL, "%s: forward: sequence %d has no tokens (q_start %d .. %d)",
                               who, s, q0, q1);
        if (k1 < k0 || (int64_t) (k1 - k0) < (int64_t) (q1 - q0))
            return rx_err_set (err, RX_EINVAL, "%s: forward: sequence %d: %d KV slots for %d new tokens",
                               who, s, k1 - k0, q1 - q0);
        for (int32_t t = q0; t < q1; t++) {
            if (b->tokens[t] < 0 || b->tokens[t] >= n_vocab)
                return rx_err_set (err, RX_EINVAL, "%s: forward: token %d at row %d out of vocabulary (0 .. %d)",
                                   who, b->tokens[t], t, n_vocab - 1);
            if (b->pos[t] < 0 || b->pos[t] >= k1 - k0 || (t > q0 && b->pos[t] <= b->pos[t - 1]))
                return rx_err_set (err, RX_EINVAL,
                                   "%s: forward: row %d position %d: positions must increase within a sequence and stay below its KV length %d",
                                   who, t, b->pos[t], k1 - k0);
        }
    }
    int64_t total = b->kv_start[b->n_seq];
    for (int64_t i = 0; i < total; i++)
        if (b->kv_slots[i] < 0 || (uint64_t) b->kv_slots[i] >= n_slots)
            return rx_err_set (err, RX_EINVAL, "%s: forward: KV slot %d at %lld out of 0 .. %llu", who,
                               b->kv_slots[i], (long long) i, (unsigned long long) n_slots - 1);
    for (int32_t j = 0; j < b->n_out; j++)
        if (b->out_rows[j] < 0 || b->out_rows[j] >= n || (j > 0 && b->out_rows[j] <= b->out_rows[j - 1]))
            return rx_err_set (err, RX_EINVAL, "%s: forward: output row %d (%d) must increase within 0 .. %d",
                               who, j, b->out_rows[j], n - 1);
    return RX_OK;
}

struct rx_model_stage {
    int32_t *host;          /* host staging block */
    int32_t *dev;           /* the device copy */
    size_t cap_slots;       /* kv_slots entries it holds */
};

/* The arrays of an uploaded batch (device; rx_model_stage_arrays also
 * views the host block). */
struct rx_model_batch_dev {
    const int32_t *tokens, *pos, *new_slots, *q_start, *kv_start, *kv_slots;
};

static inline void rx_model_stage_free (struct rx_model_stage *st, const struct rx_host *host,
                                        const struct rx_kctx *k)
{
    if (st->dev) {
        k->ops->synchronize (k->be, k->stream, NULL);
        k->ops->free_ (k->be, st->dev);
    }
    if (st->host) host->free_ (host, st->host);
    st->dev = st->host = NULL;
    st->cap_slots = 0;
}

static inline int rx_model_stage_alloc (struct rx_model_stage *st, const struct rx_host *host,
                                        const struct rx_kctx *k, int32_t T, size_t cap_slots,
                                        const char *who, struct rx_err *err)
{
    rx_model_stage_free (st, host, k);
    size_t n = 3 * (size_t) T + 2 * ((size_t) T + 1) + cap_slots;
    void *d;
    int rc = k->ops->alloc (k->be, n * sizeof (int32_t), 0, &d, err);
    if (rc != RX_OK) return rc;
    st->dev = d;
    st->host = host->alloc (host, n * sizeof (int32_t), 64);
    if (!st->host) return rx_err_set (err, RX_ENOMEM, "%s: out of memory (staging)", who);
    st->cap_slots = cap_slots;
    return RX_OK;
}

/* The arrays of a staging block at base (host or device copy). */
static inline void rx_model_stage_arrays (const int32_t *base, int32_t T, struct rx_model_batch_dev *d)
{
    d->tokens = base;
    d->pos = d->tokens + T;
    d->new_slots = d->pos + T;
    d->q_start = d->new_slots + T;
    d->kv_start = d->q_start + T + 1;
    d->kv_slots = d->kv_start + T + 1;
}

/* The upload with the batch padded to M rows (M >= b->n_tokens; b may be
 * idle): after b's rows, M - n one-row sequences of token 0 at position 0
 * whose one KV position is pad_slot (DP attention's graphs, models/graph.h
 * rx_model_graphs_run_padded), written straight into the staging block. */
static inline int rx_model_stage_upload_padded (struct rx_model_stage *st, const struct rx_host *host,
                                                const struct rx_kctx *k, int32_t T,
                                                const struct rx_model_batch *b, int32_t M, int32_t pad_slot,
                                                const char *who, struct rx_model_batch_dev *d,
                                                struct rx_err *err)
{
    const int32_t n = b->n_tokens, ns = n > 0 ? b->n_seq : 0;
    const size_t total = (n > 0 ? (size_t) b->kv_start[ns] : 0) + (size_t) (M - n);
    if (total > st->cap_slots) {
        size_t cap = st->cap_slots * 2 > total ? st->cap_slots * 2 : total;
        int rc = rx_model_stage_alloc (st, host, k, T, cap, who, err);
        if (rc != RX_OK) return rc;
    }
    int32_t *h_tok = st->host, *h_pos = h_tok + T, *h_new = h_pos + T, *h_qs = h_new + T,
            *h_ks = h_qs + T + 1, *h_slots = h_ks + T + 1;
    h_qs[0] = h_ks[0] = 0;
    if (n > 0) {
        memcpy (h_tok, b->tokens, (size_t) n * sizeof *h_tok);
        memcpy (h_pos, b->pos, (size_t) n * sizeof *h_pos);
        memcpy (h_qs, b->q_start, ((size_t) ns + 1) * sizeof *h_qs);
        memcpy (h_ks, b->kv_start, ((size_t) ns + 1) * sizeof *h_ks);
        memcpy (h_slots, b->kv_slots, (size_t) b->kv_start[ns] * sizeof *h_slots);
        for (int32_t s = 0; s < ns; s++)
            for (int32_t t = b->q_start[s]; t < b->q_start[s + 1]; t++)
                h_new[t] = b->kv_slots[b->kv_start[s] + b->pos[t]];
    }
    for (int32_t t = n, s = ns; t < M; t++, s++) {
        h_tok[t] = 0;
        h_pos[t] = 0;
        h_new[t] = pad_slot;
        h_qs[s + 1] = t + 1;
        h_slots[h_ks[s]] = pad_slot;
        h_ks[s + 1] = h_ks[s] + 1;
    }
    size_t bytes = (size_t) ((h_slots + total) - h_tok) * sizeof (int32_t);
    int rc = k->ops->copy_h2d (k->be, k->stream, st->dev, st->host, bytes, err);
    if (rc != RX_OK) return rc;
    rx_model_stage_arrays (st->dev, T, d);
    return RX_OK;
}

static inline int rx_model_stage_upload (struct rx_model_stage *st, const struct rx_host *host,
                                         const struct rx_kctx *k, int32_t T,
                                         const struct rx_model_batch *b, const char *who,
                                         struct rx_model_batch_dev *d, struct rx_err *err)
{
    return rx_model_stage_upload_padded (st, host, k, T, b, b->n_tokens, 0, who, d, err);
}

static inline int rx_model_logits (const struct rx_kctx *k, const struct rx_model_batch *b, const float *x,
                                   float *tmp, size_t E, const float *norm_w, float eps,
                                   const rx_kweight_t *output, int32_t n_vocab, struct rx_err *err)
{
    const struct rx_kernels_ops *K = k->ops;
    if (b->n_out == 0) return RX_OK;
    const float *src = x;
    if (b->n_out != b->n_tokens) {
        for (int32_t j = 0; j < b->n_out;) {
            int32_t r0 = b->out_rows[j], len = 1;
            while (j + len < b->n_out && b->out_rows[j + len] == r0 + len) len++;
            int rc = K->copy2d (k->be, k->stream, x + (size_t) r0 * E, E, tmp + (size_t) j * E, E,
                                (size_t) len, E, err);
            if (rc != RX_OK) return rc;
            j += len;
        }
        src = tmp;
    }
    int rc = K->rms_norm (k->be, k->stream, src, E, norm_w, tmp, E, (size_t) b->n_out, E, eps, err);
    if (rc != RX_OK) return rc;
    return K->matmul (k->be, k->stream, output, -1, tmp, E, b->logits, (size_t) n_vocab, (size_t) b->n_out,
                      0, err);
}

#endif
