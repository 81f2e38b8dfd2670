/* core/sampling.h -- picking the next token from a row of logits.
 *
 * Greedy (temperature <= 0, or top_k == 1): the largest logit, the lowest id
 * on ties -- the same rule as the kernels' argmax and the reference files.
 * Otherwise: logits / temperature, keep the top_k largest (0 = all), softmax,
 * keep the smallest set whose probability reaches top_p (1 = all), drop
 * those below min_p times the best one (0 = none), renormalise, draw.
 *
 * Determinism: a sampler draws from its own generator (splitmix64 seeded by
 * `seed`); the same seed and logits give the same tokens on every machine
 * and rank (the serving milestone keeps one sampler per request).  Ties in
 * sorting are broken by token id, so the order never depends on qsort.
 *
 * Memory: the sampler keeps 24 bytes of scratch per vocabulary entry (3 MB
 * for 128k) plus 24 KB; sampling allocates nothing.  Thread-safety: one sampler per thread. */
#ifndef RX_SAMPLING_H
#define RX_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

struct rx_sampling {
    float    temperature;   /* <= 0: greedy */
    int32_t  top_k;         /* 0: off */
    float    top_p;         /* (0, 1]; 1: off */
    float    min_p;         /* [0, 1); 0: off */
    uint64_t seed;
};

/* temperature 0 (greedy), top_k 0, top_p 1, min_p 0, seed 0. */
void rx_sampling_defaults (struct rx_sampling *p);

typedef struct rx_sampler rx_sampler_t;

/* RX_EINVAL with one line for a parameter out of range (negative top_k,
 * top_p outside (0, 1], min_p outside [0, 1), NaN temperature, n_vocab < 1).
 * Caller owns the result; release with rx_sampler_destroy. */
rx_sampler_t *rx_sampler_new (const struct rx_sampling *p, int32_t n_vocab, struct rx_err *err);
void rx_sampler_destroy (rx_sampler_t **self_p);

/* The next token for one row of n_vocab logits (not modified).  NaN logits
 * are never chosen; a row of only NaN/-inf gives token 0. */
int32_t rx_sampler_sample (rx_sampler_t *s, const float *logits);

/* As rx_sampler_sample with other parameters and generator state: one
 * sampler (its scratch) serves many requests, each keeping its own
 * parameters and *state (start it at the request's seed).  min_p may be 1
 * here (keep only the best tokens).  Parameters are not checked: validate
 * them first (rx_sampling_params_validate). */
int32_t rx_sampler_sample_with (rx_sampler_t *s, const struct rx_sampling *p, uint64_t *state,
                                const float *logits);

/* Drawing from a row's candidates instead of its whole row: a device
 * backend's scheduler has the device compute probs = softmax(logits / T)
 * over the whole vocabulary and copy back only its k largest, best first
 * (the lower id first on ties) -- k probabilities and ids instead of
 * n_vocab logits, and no host pass over the row ([scheduler]
 * device_sampling, docs/config.md).  rx_sampler_sample_cands draws p's
 * token from them when the cut p asks for falls inside the candidates:
 *
 *   top_k in 2..k           the first top_k candidates, then top_p and min_p
 *                           over them, as rx_sampler_sample_with;
 *   no top_k, top_p < 1     when the candidates reach top_p of the row's
 *                           mass (probs sum to 1 over the row);
 *   no top_k, min_p only    when the k-th candidate is below min_p times
 *                           the best;
 *   plain sampling          when the uniform draw lands in the candidates'
 *                           mass.
 *
 * Candidates are walked best first, where rx_sampler_sample_with walks
 * plain sampling in id order: the same distribution, but a seed does not
 * draw the same tokens as the host path.  Otherwise it returns
 * RX_CANDS_FULL (sample the whole row with rx_sampler_sample_with: a cut
 * beyond the candidates, top_k > k, non-finite candidates) or
 * RX_CANDS_TAIL (plain sampling whose draw fell past the candidates: draw
 * again from the row with the k candidate ids banned -- the tail's
 * distribution, so the token keeps its probability).  Either way one
 * uniform was taken from *state first.  Greedy parameters give
 * RX_CANDS_FULL (the caller takes the argmax).  k <= n_vocab. */
#define RX_CANDS_FULL (-1)
#define RX_CANDS_TAIL (-2)
int32_t rx_sampler_sample_cands (const struct rx_sampling *p, uint64_t *state, const float *probs,
                                 const int32_t *ids, int32_t k, int32_t n_vocab);

/* Device candidates of a row with penalties (the scheduler's penalized
 * candidate rows): the device computed the k candidates of the
 * UNPENALIZED row at temperature t; tok[0..m) are those k ids first, in
 * their order, then the other tokens the penalties touch; raw[q] and
 * pen[q] their logits before and after the penalties (rx_penalties_apply);
 * p1 the first candidate's probability.  The row's mass is 1 / p1 in units
 * of exp((l - raw[0]) / t); each moved token changes it by
 * exp((pen - raw[0]) / t) - exp((raw - raw[0]) / t).  Every token outside
 * tok has a logit <= raw[k-1] and keeps it, so the unmoved candidates and
 * the moved tokens now above raw[k-1], sorted (larger penalized logit,
 * then lower id), are the head of the penalized row's order: written to
 * ids / probs (the penalized softmax at t, over the whole row; up to float
 * rounding at a near-tie), their count returned, for
 * rx_sampler_sample_cands.  -1 (read the whole row): NaN or +inf logits,
 * p1 not a normal positive float, t <= 0, m < k, no head, or a mass left
 * under 1e-3 of the row's (the penalties took nearly all of it: the
 * difference would be mostly rounding) or not finite.  scratch: m
 * entries; pen may be probs (read before written). */
struct rx_cand_pair {
    float   l;
    int32_t id;
};
int32_t rx_cands_penalized (const int32_t *tok, const float *raw, const float *pen, int32_t m, int32_t k, float p1,
                            float t, int32_t *ids, float *probs, struct rx_cand_pair *scratch);

/* Penalties on a row of raw logits, before temperature (OpenAI / vLLM
 * semantics): for every token of the output so far, logit -= frequency *
 * count + presence; for every distinct token of the prompt or the output,
 * repetition (> 0, 1 = off) divides a positive logit and multiplies a
 * negative one (CTRL / HF).  Ids outside the vocabulary are ignored. */
struct rx_penalties {
    float frequency;    /* 0: off */
    float presence;     /* 0: off */
    float repetition;   /* 1: off */
};
/* counts: caller's scratch of n_vocab zeroed uint32, left zeroed on return
 * (O(n_prompt + n_out), not O(n_vocab)). */
void rx_penalties_apply (float *logits, int32_t n_vocab, const struct rx_penalties *pen,
                         const int32_t *prompt, size_t n_prompt, const int32_t *out, size_t n_out,
                         uint32_t *counts);

/* Set logits[ids[i]] to -inf (min_tokens: EOS and stop ids cannot be drawn
 * yet).  Ids outside the vocabulary are ignored. */
void rx_logits_ban (float *logits, int32_t n_vocab, const int32_t *ids, size_t n);

/* OpenAI logprobs from a row of RAW logits (log_softmax, computed in
 * double): returns log p(chosen) (-inf for an id outside the vocabulary);
 * top_ids/top_lp[0..n_top) get the n_top most likely ids, best first, ties
 * to the lower id (-1 / -inf past the finite ones).  NaN logits count as
 * absent. */
float rx_logprobs (const float *logits, int32_t n_vocab, int32_t chosen, int32_t n_top,
                   int32_t *top_ids, float *top_lp);

/* The same logprobs from device candidates instead of the row: probs/ids
 * are k candidates at temperature 1 (softmax of the raw row, best first,
 * the lower id first on ties: rx_engine_cands), so log(probs[j]) is the
 * log_softmax of ids[j] -- equal to rx_logprobs up to float rounding (the
 * device's float softmax: ~1e-6 of the double value here).  Returns 0 and
 * fills *lp = log p(chosen) and top_ids/top_lp[0..n_top) (any of the three
 * may be NULL: a check only), or -1 when the candidates cannot give them:
 * n_top > k, chosen not among them, or a probability needed not a normal
 * positive float (it underflowed, or the row has NaN or -inf logits, which
 * rx_logprobs treats apart) -- the caller then reads the row. */
int rx_logprobs_cands (const float *probs, const int32_t *ids, int32_t k, int32_t chosen, int32_t n_top,
                       float *lp, int32_t *top_ids, float *top_lp);

/* Index of the largest value (lowest index on ties; NaN ignored); 0 if none. */
int32_t rx_argmax (const float *x, int32_t n);

#endif
