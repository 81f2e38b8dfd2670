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
 * Memory: the sampler keeps n_vocab-sized scratch; sampling allocates
 * nothing.  Thread-safety: one sampler per thread. */
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

/* Index of the largest value (lowest index on ties; NaN ignored); 0 if none. */
int32_t rx_argmax (const float *x, int32_t n);

#endif
