/* core/sample_pool.h -- the scheduler's host sampling on several threads.
 *
 * After a forward pass the scheduler picks a token for every request whose
 * row is sampled on the host (temperature, top_p, penalties, ...): for a
 * 128k vocabulary that is 1.5-4 ms a row (core/sampling.c), so 64 sampled
 * requests cost a tenth of a second or more a step on one thread -- ten
 * GPU decode steps.  The rows are independent (each request has its own
 * generator state), so they are spread over a few threads, each with its
 * own sampler and scratch; every row's token is what one thread would
 * draw, whatever the thread count ([scheduler] sampling_threads).
 *
 * rx_sample_pool_run (p, n, fn, ctx) calls fn (ctx, i, w) once for each i in
 * [0, n), on the pool's threads and the caller's, and returns when every
 * call has returned; w is the calling thread's scratch.  Fork-join: the
 * workers sleep on a condition variable between runs.
 *
 * Ownership: the pool owns its threads and scratch.  Thread-safety: one
 * thread (the scheduler's) calls run and destroy. */
#ifndef RX_SAMPLE_POOL_H
#define RX_SAMPLE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "sampling.h"

/* One thread's scratch for a sampled row. */
struct rx_sample_scratch {
    rx_sampler_t *sampler;      /* its own scratch arrays (not its params) */
    uint32_t *pen_counts;       /* [n_vocab], zero between rows (rx_penalties_apply) */
    float *row_buf;             /* [n_vocab] */
};

typedef struct rx_sample_pool rx_sample_pool_t;

/* threads: how many threads sample, the caller's included (1 = no extra
 * thread; at most 64); 0 = auto: 1 on machines of up to 4 CPUs, else a
 * quarter of them, at most 8.  NULL + err on failure. */
rx_sample_pool_t *rx_sample_pool_new (int32_t threads, int32_t n_vocab, struct rx_err *err);
/* Joins the threads, frees everything.  NULL is a no-op; sets *self_p NULL. */
void rx_sample_pool_destroy (rx_sample_pool_t **self_p);
/* Threads that sample (the caller's included). */
int32_t rx_sample_pool_threads (const rx_sample_pool_t *p);
/* The caller's own scratch (for a row sampled outside a run). */
struct rx_sample_scratch *rx_sample_pool_scratch (rx_sample_pool_t *p);

typedef void (*rx_sample_fn) (void *ctx, size_t i, struct rx_sample_scratch *w);
void rx_sample_pool_run (rx_sample_pool_t *p, size_t n, rx_sample_fn fn, void *ctx);

#endif /* RX_SAMPLE_POOL_H */
