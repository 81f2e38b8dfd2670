/* models/tbo.h -- two-batch overlap (TBO): where a step's batch is cut into
 * two micro-batches, written once for the model plugins.  Header-only:
 * plugins link no shared code.
 *
 * A batch is a list of sequences whose rows are contiguous (q_start, see
 * radix/model.h).  Micro-batch 0 is sequences [0, s), micro-batch 1
 * sequences [s, n_seq): a sequence is never cut, so each micro-batch is a
 * valid batch for the attention backend on its own (its KV and positions are
 * whole) and the token rows of the two are [0, q_start[s]) and
 * [q_start[s], n_tokens).
 *
 * rx_tbo_split (q_start, n_seq) -> s:
 *   - decode (every sequence one row): half the requests, s = n_seq / 2
 *     (an odd count puts the extra one in micro-batch 1);
 *   - prefill / extend / mixed: the s in 1 .. n_seq-1 whose cumulative
 *     token count q_start[s] is nearest half the tokens (|2 q_start[s] -
 *     n_tokens| smallest; a tie goes to the smaller s), so the two halves
 *     carry as equal a load as whole sequences allow;
 *   - 0 or 1 sequence (an idle batch, one request): 0, no split.  The model
 *     then runs the batch as one (alone), or -- under DP attention, where
 *     every rank must make the same collective calls -- as micro-batch 1
 *     empty (one request: (all, empty); idle: two empties).
 * For decode the two rules agree (equal rows per sequence); the decode rule
 * is kept explicit because it is SGLang's (half the request count).
 *
 * rx_tbo_sub (b, s0, s1, q_start, kv_start, sub): the host batch of
 * sequences [s0, s1) of b, its q_start / kv_start rebased to 0 into the
 * caller's arrays of s1 - s0 + 1 entries; its tokens, pos and kv_slots
 * point into b's.  No output rows (the model computes the logits once, on
 * the whole batch, after the layers).
 *
 * Thread-safety: pure functions. */
#ifndef RX_MODELS_TBO_H
#define RX_MODELS_TBO_H

#include <stddef.h>
#include <stdint.h>

#include <radix/model.h>

static inline int32_t rx_tbo_split (const int32_t *q_start, int32_t n_seq)
{
    if (!q_start || n_seq < 2) return 0;
    const int64_t n = q_start[n_seq];
    if (n == n_seq) return n_seq / 2;   /* decode: one row per sequence */
    int32_t best = 1;
    int64_t best_d = -1;
    for (int32_t s = 1; s < n_seq; s++) {
        int64_t d = 2 * (int64_t) q_start[s] - n;
        if (d < 0) d = -d;
        if (best_d < 0 || d < best_d) {
            best_d = d;
            best = s;
        }
    }
    return best;
}

static inline void rx_tbo_sub (const struct rx_model_batch *b, int32_t s0, int32_t s1,
                               int32_t *q_start, int32_t *kv_start, struct rx_model_batch *sub)
{
    const int32_t t0 = b->q_start[s0], k0 = b->kv_start[s0];
    for (int32_t s = s0; s <= s1; s++) {
        q_start[s - s0] = b->q_start[s] - t0;
        kv_start[s - s0] = b->kv_start[s] - k0;
    }
    *sub = (struct rx_model_batch) {
        .struct_size = sizeof *sub, .n_tokens = b->q_start[s1] - t0,
        .tokens = b->tokens ? b->tokens + t0 : NULL, .pos = b->pos ? b->pos + t0 : NULL,
        .n_seq = s1 - s0, .q_start = q_start, .kv_start = kv_start,
        .kv_slots = b->kv_slots ? b->kv_slots + k0 : NULL, .n_out = 0, .out_rows = NULL,
        .logits = NULL,
    };
}

#endif
