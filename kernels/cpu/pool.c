/* kernels/cpu/pool.c -- see pool.h.
 *
 * Protocol: the caller publishes (fn, ctx) and bumps `gen`, whose low bits
 * carry the number of threads taking part: a worker decides from the word
 * alone whether the run is its business, so one that sits out never reads
 * job fields the caller may already be rewriting for the next run.  Workers
 * watch `gen` (spinning, then futex-waiting on it), run their share and
 * decrement `pending`; the caller runs share 0 and spins until pending is 0.
 * The barrier is a sense-reversing counter. */
#include <errno.h>
#include <sched.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"

#if defined(__x86_64__) || defined(__i386__)
#  include <immintrin.h>
#  define S_PAUSE() _mm_pause ()
#elif defined(__aarch64__)
#  define S_PAUSE() __asm__ __volatile__ ("yield")
#else
#  define S_PAUSE() do { } while (0)
#endif

struct s_worker {
    rx_kpool_t *pool;
    int         ith;
    pthread_t   tid;
};

#define S_NTH_BITS 13u                      /* up to 4096 threads */
#define S_NTH_MASK ((1u << S_NTH_BITS) - 1)

struct rx_kpool {
    int nth;
    int spin_us;
    /* Job, published before gen is bumped. */
    rx_kpool_fn fn;
    void *ctx;
    int   nth_use;
    _Alignas (64) _Atomic uint32_t gen;      /* futex word */
    _Alignas (64) _Atomic int pending;
    _Atomic int sleepers;
    _Alignas (64) _Atomic int bar_count;
    _Atomic int bar_sense;
    _Atomic int stop;
    struct s_worker *workers;
    int started;
};

static long s_futex (_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall (SYS_futex, (uint32_t *) addr, op, val, NULL, NULL, 0);
}

static uint64_t s_now_ns (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* Wait until gen != seen: spin first, then sleep on the futex. */
static uint32_t s_wait_gen (rx_kpool_t *p, uint32_t seen)
{
    uint32_t g;
    uint64_t deadline = 0;
    for (int i = 0;; i++) {
        g = atomic_load_explicit (&p->gen, memory_order_acquire);
        if (g != seen) return g;
        if ((i & 1023) == 1023) {
            uint64_t now = s_now_ns ();
            if (!deadline) deadline = now + (uint64_t) p->spin_us * 1000u;
            else if (now >= deadline) break;
        }
        S_PAUSE ();
    }
    atomic_fetch_add (&p->sleepers, 1);
    while ((g = atomic_load_explicit (&p->gen, memory_order_acquire)) == seen)
        s_futex (&p->gen, FUTEX_WAIT_PRIVATE, seen);
    atomic_fetch_sub (&p->sleepers, 1);
    return g;
}

/* Wait for *v to drop to 0 (or, for the barrier, to change from `from`):
 * spin briefly, then yield -- on an oversubscribed machine the thread we
 * wait for may need our core to finish. */
static void s_spin_until_zero (_Atomic int *v)
{
    for (unsigned i = 0; atomic_load_explicit (v, memory_order_acquire) > 0; i++) {
        if (i < 4096) S_PAUSE ();
        else sched_yield ();
    }
}

static void s_spin_while_eq (_Atomic int *v, int from)
{
    for (unsigned i = 0; atomic_load_explicit (v, memory_order_acquire) == from; i++) {
        if (i < 4096) S_PAUSE ();
        else sched_yield ();
    }
}

static void *s_worker_main (void *arg)
{
    struct s_worker *w = arg;
    rx_kpool_t *p = w->pool;
    /* Runs are counted from the pool's creation (gen 0), not from when this
     * thread got scheduled: a run published before it first looked is still
     * its business. */
    uint32_t seen = 0;
    for (;;) {
        seen = s_wait_gen (p, seen);
        if (atomic_load_explicit (&p->stop, memory_order_acquire))
            break;
        int nth_use = (int) (seen & S_NTH_MASK);
        if (w->ith < nth_use) {
            p->fn (p->ctx, w->ith, nth_use);
            atomic_fetch_sub_explicit (&p->pending, 1, memory_order_release);
        }
    }
    return NULL;
}

rx_kpool_t *rx_kpool_new (int nth, int spin_us, struct rx_err *err)
{
    if (nth < 1 || nth > 4096) {
        rx_err_set (err, RX_EINVAL, "kernels-cpu pool: bad thread count %d (1..4096)", nth);
        return NULL;
    }
    rx_kpool_t *p = aligned_alloc (64, (sizeof *p + 63) / 64 * 64);
    if (!p) {
        rx_err_set (err, RX_ENOMEM, "kernels-cpu pool: out of memory");
        return NULL;
    }
    memset (p, 0, sizeof *p);
    p->nth = nth;
    p->spin_us = spin_us < 0 ? 0 : spin_us;
    p->nth_use = nth;
    if (nth > 1) {
        p->workers = calloc ((size_t) nth, sizeof *p->workers);
        if (!p->workers) {
            free (p);
            rx_err_set (err, RX_ENOMEM, "kernels-cpu pool: out of memory");
            return NULL;
        }
    }
    for (int i = 1; i < nth; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
        int rc = pthread_create (&p->workers[i].tid, NULL, s_worker_main, &p->workers[i]);
        if (rc != 0) {
            rx_err_set (err, RX_ENOMEM, "kernels-cpu pool: cannot start thread %d of %d: %s",
                        i, nth, strerror (rc));
            p->nth = i;   /* join only those started */
            rx_kpool_destroy (&p);
            return NULL;
        }
        p->started = i;
    }
    return p;
}

void rx_kpool_destroy (rx_kpool_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_kpool_t *p = *self_p;
    atomic_store (&p->stop, 1);
    atomic_fetch_add (&p->gen, 1u << S_NTH_BITS);
    s_futex (&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
    for (int i = 1; i <= p->started; i++)
        pthread_join (p->workers[i].tid, NULL);
    free (p->workers);
    free (p);
    *self_p = NULL;
}

int rx_kpool_threads (const rx_kpool_t *p) { return p->nth; }

void rx_kpool_run (rx_kpool_t *p, rx_kpool_fn fn, void *ctx, int nth_use)
{
    if (nth_use <= 0 || nth_use > p->nth) nth_use = p->nth;
    if (nth_use == 1) {
        p->nth_use = 1;          /* the barrier is a no-op in a one-thread run */
        fn (ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->nth_use = nth_use;
    atomic_store_explicit (&p->bar_count, 0, memory_order_relaxed);
    /* Every worker wakes on gen; those with ith >= nth_use just go back. */
    atomic_store_explicit (&p->pending, nth_use - 1, memory_order_relaxed);
    /* seq_cst pairs with the worker's sleepers++ then gen load: either it
     * sees the new gen or we see it asleep. */
    uint32_t g = atomic_load_explicit (&p->gen, memory_order_relaxed);
    uint32_t ng = ((g >> S_NTH_BITS) + 1) << S_NTH_BITS | (uint32_t) nth_use;
    atomic_store (&p->gen, ng);
    if (atomic_load (&p->sleepers) > 0)
        s_futex (&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
    fn (ctx, 0, nth_use);
    s_spin_until_zero (&p->pending);
}

void rx_kpool_barrier (rx_kpool_t *p)
{
    int n = p->nth_use;
    if (n <= 1) return;
    int sense = atomic_load_explicit (&p->bar_sense, memory_order_relaxed);
    if (atomic_fetch_add_explicit (&p->bar_count, 1, memory_order_acq_rel) == n - 1) {
        atomic_store_explicit (&p->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit (&p->bar_sense, !sense, memory_order_release);
    } else {
        s_spin_while_eq (&p->bar_sense, sense);
    }
}
