/* models/batch_check.h -- the checks every model plugin runs on a
 * struct rx_model_batch before its forward pass (radix/model.h's batch
 * contract), written once.  Header-only: plugins link no shared code.
 *
 * rx_model_batch_check (who, b, max_tokens, n_vocab, n_slots, allow_idle,
 * err): RX_OK, or RX_EINVAL with one line "<who>: forward: ..." naming the
 * first thing wrong.  allow_idle: an idle batch (0 tokens, 0 sequences, 0
 * output rows; DP attention) is accepted. */
#ifndef RX_MODELS_BATCH_CHECK_H
#define RX_MODELS_BATCH_CHECK_H

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

#endif
