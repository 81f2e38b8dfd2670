/* kernels/cpu/pool.h -- a persistent thread pool for the CPU kernels.
 *
 * Workers are created once with the backend instance and live until it is
 * destroyed: an op never creates threads.  rx_kpool_run() wakes them, runs
 * fn(ctx, ith, nth) on every thread (the caller is thread 0) and returns
 * when all are done.  Idle workers spin for a short while (decode steps come
 * back-to-back, and a futex wake costs tens of microseconds), then sleep on a
 * futex.  rx_kpool_barrier() synchronises the threads of one run (e.g. after
 * quantizing the activations, before the matmul that reads them).
 *
 * Thread-safety: one thread calls rx_kpool_run at a time (the op caller). */
#ifndef RX_KPOOL_H
#define RX_KPOOL_H

#include <stddef.h>

#include <radix/err.h>

typedef struct rx_kpool rx_kpool_t;
typedef void (*rx_kpool_fn) (void *ctx, int ith, int nth);

/* nth >= 1 threads in all (nth - 1 workers).  spin_us: how long an idle
 * worker spins before sleeping.  NULL + err on failure. */
rx_kpool_t *rx_kpool_new (int nth, int spin_us, struct rx_err *err);
/* Stops and joins the workers.  NULLs *self_p; NULL is a no-op. */
void rx_kpool_destroy (rx_kpool_t **self_p);

int rx_kpool_threads (const rx_kpool_t *p);

/* Run fn on every thread; nth_use (1..threads, 0 = all) limits how many take
 * part (small ops need not wake everyone). */
void rx_kpool_run (rx_kpool_t *p, rx_kpool_fn fn, void *ctx, int nth_use);

/* Inside fn: wait until all nth threads of this run reach the barrier. */
void rx_kpool_barrier (rx_kpool_t *p);

#endif
