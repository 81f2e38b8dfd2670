/* kernels/cpu/pool.c -- see pool.h.
 *
 * Protocol.  The caller publishes (fn, ctx, n, chunk), sets `open` to the
 * run's generation word and bumps `gen`, whose low bits carry the number
 * of threads asked to take part (so a worker decides from the word alone
 * whether the run is its business).  A worker that wakes for generation g
 * increments `joined`, and only if `open` still equals g claims chunks;
 * then it decrements `joined`.  The caller claims chunks too; when none are
 * left it sets `open` to 0 and waits for `joined` to reach 0.  Because both
 * sides use sequentially consistent operations (joined++ then load open;
 * store open then load joined), either the caller sees the worker joined
 * and waits for it, or the worker sees the run closed and leaves without
 * touching the job -- which lives on the caller's stack. */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
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

#define S_NTH_BITS 13u                      /* up to 4096 threads */
#define S_NTH_MASK ((1u << S_NTH_BITS) - 1)

struct s_worker {
    rx_kpool_t *pool;
    int         ith;
    pthread_t   tid;
};

struct rx_kpool {
    int nth;
    int spin_us;
    /* The job, published before gen is bumped. */
    rx_kpool_fn fn;
    void *ctx;
    size_t n, chunk, min_chunk;
    size_t guide;                           /* 2 x threads of the run */
    _Alignas (64) _Atomic size_t next;      /* next unclaimed item */
    _Alignas (64) _Atomic uint32_t gen;     /* futex word */
    _Atomic uint32_t open;                  /* gen of the open run, 0 = closed */
    _Alignas (64) _Atomic int joined;       /* workers inside a run */
    _Atomic int sleepers;
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
    while ((g = atomic_load (&p->gen)) == seen)
        s_futex (&p->gen, FUTEX_WAIT_PRIVATE, seen);
    atomic_fetch_sub (&p->sleepers, 1);
    return g;
}

static void s_claim (rx_kpool_t *p, int tid)
{
    if (p->min_chunk >= p->chunk) {
        for (;;) {
            size_t i0 = atomic_fetch_add_explicit (&p->next, p->chunk, memory_order_relaxed);
            if (i0 >= p->n) break;
            size_t i1 = i0 + p->chunk < p->n ? i0 + p->chunk : p->n;
            p->fn (p->ctx, i0, i1, tid);
        }
        return;
    }
    /* Guided: a claim takes 1/(2 x threads) of what is left, between
     * min_chunk and chunk, in multiples of min_chunk -- big chunks while
     * there is much to do, small ones at the end, so the threads finish
     * within a small chunk of each other. */
    size_t i0 = atomic_load_explicit (&p->next, memory_order_relaxed);
    while (i0 < p->n) {
        size_t c = (p->n - i0) / p->guide / p->min_chunk * p->min_chunk;
        c = c < p->min_chunk ? p->min_chunk : c > p->chunk ? p->chunk : c;
        if (!atomic_compare_exchange_weak_explicit (&p->next, &i0, i0 + c, memory_order_relaxed,
                                                    memory_order_relaxed))
            continue;   /* i0 now holds the current value */
        p->fn (p->ctx, i0, i0 + c < p->n ? i0 + c : p->n, tid);
        i0 = atomic_load_explicit (&p->next, memory_order_relaxed);
    }
}

static void *s_worker_main (void *arg)
{
    struct s_worker *w = arg;
    rx_kpool_t *p = w->pool;
    /* Runs are counted from the pool's creation (gen 0), not from when this
     * thread got scheduled. */
    uint32_t seen = 0;
    for (;;) {
        seen = s_wait_gen (p, seen);
        if (atomic_load (&p->stop)) break;
        if (w->ith >= (int) (seen & S_NTH_MASK)) continue;
        atomic_fetch_add (&p->joined, 1);
        if (atomic_load (&p->open) == seen)
            s_claim (p, w->ith);
        atomic_fetch_sub (&p->joined, 1);
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

void rx_kpool_for (rx_kpool_t *p, size_t n, size_t chunk, rx_kpool_fn fn, void *ctx,
                   int nth_use)
{
    rx_kpool_for_guided (p, n, chunk, 0, fn, ctx, nth_use);
}

void rx_kpool_for_guided (rx_kpool_t *p, size_t n, size_t chunk, size_t min_chunk, rx_kpool_fn fn,
                          void *ctx, int nth_use)
{
    if (n == 0) return;
    if (nth_use <= 0 || nth_use > p->nth) nth_use = p->nth;
    if (chunk == 0) chunk = n / (4 * (size_t) nth_use);
    if (chunk == 0) chunk = 1;
    if (nth_use == 1 || chunk >= n) {
        fn (ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    p->min_chunk = min_chunk == 0 || min_chunk > chunk ? chunk : min_chunk;
    p->guide = 2 * (size_t) nth_use;
    atomic_store_explicit (&p->next, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit (&p->gen, memory_order_relaxed);
    uint32_t ng = ((g >> S_NTH_BITS) + 1) << S_NTH_BITS | (uint32_t) nth_use;
    atomic_store (&p->open, ng);
    atomic_store (&p->gen, ng);
    /* seq_cst pairs with the worker's sleepers++ then gen load: either it
     * sees the new gen or we see it asleep. */
    if (atomic_load (&p->sleepers) > 0)
        s_futex (&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
    s_claim (p, 0);
    atomic_store (&p->open, 0);
    /* Wait only for workers that joined this run (or, briefly, a late one
     * on its way out of an earlier run). */
    for (unsigned i = 0; atomic_load (&p->joined) > 0; i++) {
        if (i < 4096) S_PAUSE ();
        else sched_yield ();
    }
}
