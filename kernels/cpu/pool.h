/* kernels/cpu/pool.h -- a persistent thread pool for the CPU kernels.
 *
 * Workers are created once with the backend instance and live until it is
 * destroyed: an op never creates threads.  rx_kpool_for() splits [0, n)
 * into chunks that the calling thread and the woken workers claim from a
 * shared counter, and returns when every claimed chunk is done.
 *
 * Built for shared machines: the caller never waits for a worker that has
 * not started -- when the caller runs out of chunks it closes the run, and
 * a worker the scheduler woke too late finds it closed and does nothing.
 * So a descheduled worker costs at most its own chunk, never a time slice
 * of waiting.  Idle workers spin for spin_us (decode issues ops
 * back-to-back, and a futex wake costs tens of microseconds), then sleep
 * on a futex.
 *
 * Thread-safety: one thread calls rx_kpool_for at a time (the op caller). */
#ifndef RX_KPOOL_H
#define RX_KPOOL_H

#include <stddef.h>

#include <radix/err.h>

typedef struct rx_kpool rx_kpool_t;

/* Process items [i0, i1).  tid identifies the thread (0 = the caller,
 * 1..threads-1 the workers), e.g. to pick per-thread scratch. */
typedef void (*rx_kpool_fn) (void *ctx, size_t i0, size_t i1, int tid);

/* nth >= 1 threads in all (nth - 1 workers).  spin_us: how long an idle
 * worker spins before sleeping.  NULL + err on failure. */
rx_kpool_t *rx_kpool_new (int nth, int spin_us, struct rx_err *err);
/* Stops and joins the workers.  NULLs *self_p; NULL is a no-op. */
void rx_kpool_destroy (rx_kpool_t **self_p);

int rx_kpool_threads (const rx_kpool_t *p);

/* Run fn over [0, n) in chunks of `chunk` items (0: n / (4 * threads)),
 * with at most nth_use threads (0 or more than the pool: all). */
void rx_kpool_for (rx_kpool_t *p, size_t n, size_t chunk, rx_kpool_fn fn, void *ctx,
                   int nth_use);

/* Like rx_kpool_for, but chunks shrink towards the end: each claim takes
 * 1/(2 x threads) of the items left, at most chunk and at least min_chunk
 * (chunk should be a multiple of min_chunk; every chunk then starts at a
 * multiple of min_chunk).  min_chunk 0 or >= chunk: fixed chunks. */
void rx_kpool_for_guided (rx_kpool_t *p, size_t n, size_t chunk, size_t min_chunk, rx_kpool_fn fn,
                          void *ctx, int nth_use);

#endif
