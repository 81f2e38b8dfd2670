/* core/sample_pool.c -- see sample_pool.h. */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sample_pool.h"

#define S_MAX_THREADS 64

struct rx_sample_pool {
    int32_t n;                         /* threads, the caller's included */
    struct rx_sample_scratch *w;       /* [n]; [0] is the caller's */
    pthread_t *th;                     /* [n - 1] */
    int32_t n_started;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;                      /* bumped by every run (and by destroy) */
    int quit;
    /* the current run */
    rx_sample_fn fn;
    void *ctx;
    size_t count;
    atomic_size_t next;
    int32_t busy;                      /* workers still in the run */
};

struct s_arg {
    rx_sample_pool_t *p;
    int32_t id;
};

static void s_work (rx_sample_pool_t *p, struct rx_sample_scratch *w)
{
    for (;;) {
        size_t i = atomic_fetch_add_explicit (&p->next, 1, memory_order_relaxed);
        if (i >= p->count) return;
        p->fn (p->ctx, i, w);
    }
}

static void *s_main (void *a)
{
    rx_sample_pool_t *p = ((struct s_arg *) a)->p;
    const int32_t id = ((struct s_arg *) a)->id;
    free (a);
    uint64_t seen = 0;
    pthread_mutex_lock (&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit) pthread_cond_wait (&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock (&p->mu);
        s_work (p, &p->w[id]);
        pthread_mutex_lock (&p->mu);
        if (--p->busy == 0) pthread_cond_signal (&p->done);
    }
    pthread_mutex_unlock (&p->mu);
    return NULL;
}

static int32_t s_auto (void)
{
    long n = sysconf (_SC_NPROCESSORS_ONLN);
    if (n <= 4) return 1;
    return n / 4 > 8 ? 8 : (int32_t) (n / 4);
}

void rx_sample_pool_destroy (rx_sample_pool_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_sample_pool_t *p = *self_p;
    if (p->th) {
        pthread_mutex_lock (&p->mu);
        p->quit = 1;
        pthread_cond_broadcast (&p->go);
        pthread_mutex_unlock (&p->mu);
        for (int32_t i = 0; i < p->n_started; i++) pthread_join (p->th[i], NULL);
        free (p->th);
    }
    pthread_mutex_destroy (&p->mu);
    pthread_cond_destroy (&p->go);
    pthread_cond_destroy (&p->done);
    if (p->w)
        for (int32_t i = 0; i < p->n; i++) {
            rx_sampler_destroy (&p->w[i].sampler);
            free (p->w[i].pen_counts);
            free (p->w[i].row_buf);
        }
    free (p->w);
    free (p);
    *self_p = NULL;
}

rx_sample_pool_t *rx_sample_pool_new (int32_t threads, int32_t n_vocab, struct rx_err *err)
{
    if (threads < 0 || threads > S_MAX_THREADS) {
        rx_err_set (err, RX_EINVAL, "sampling: %d sampling threads (0 = auto, 1 .. %d)", threads,
                    S_MAX_THREADS);
        return NULL;
    }
    if (n_vocab <= 0) {
        rx_err_set (err, RX_EINVAL, "sampling: vocabulary of %d", n_vocab);
        return NULL;
    }
    rx_sample_pool_t *p = calloc (1, sizeof *p);
    if (!p) {
        rx_err_set (err, RX_ENOMEM, "sampling: out of memory");
        return NULL;
    }
    pthread_mutex_init (&p->mu, NULL);
    pthread_cond_init (&p->go, NULL);
    pthread_cond_init (&p->done, NULL);
    p->n = threads ? threads : s_auto ();
    p->w = calloc ((size_t) p->n, sizeof *p->w);
    if (!p->w) goto oom;
    struct rx_sampling sp;
    rx_sampling_defaults (&sp);
    for (int32_t i = 0; i < p->n; i++) {
        struct rx_sample_scratch *w = &p->w[i];
        if (!(w->sampler = rx_sampler_new (&sp, n_vocab, err))) goto fail;
        w->pen_counts = calloc ((size_t) n_vocab, sizeof *w->pen_counts);
        w->row_buf = malloc ((size_t) n_vocab * sizeof *w->row_buf);
        if (!w->pen_counts || !w->row_buf) goto oom;
    }
    if (p->n > 1) {
        if (!(p->th = calloc ((size_t) p->n - 1, sizeof *p->th))) goto oom;
        for (int32_t i = 1; i < p->n; i++) {
            struct s_arg *a = malloc (sizeof *a);
            if (!a) goto oom;
            a->p = p;
            a->id = i;
            int rc = pthread_create (&p->th[i - 1], NULL, s_main, a);
            if (rc != 0) {
                free (a);
                rx_err_set (err, RX_ENOMEM, "sampling: cannot start sampling thread %d of %d: %s", i, p->n - 1,
                            strerror (rc));
                goto fail;
            }
            p->n_started++;
        }
    }
    return p;
oom:
    rx_err_set (err, RX_ENOMEM, "sampling: out of memory (%d sampling threads, vocabulary %d)", p->n, n_vocab);
fail:
    rx_sample_pool_destroy (&p);
    return NULL;
}

int32_t rx_sample_pool_threads (const rx_sample_pool_t *p)
{
    return p ? p->n : 0;
}

struct rx_sample_scratch *rx_sample_pool_scratch (rx_sample_pool_t *p)
{
    return &p->w[0];
}

void rx_sample_pool_run (rx_sample_pool_t *p, size_t n, rx_sample_fn fn, void *ctx)
{
    if (n == 0) return;
    if (p->n == 1 || n == 1) {
        for (size_t i = 0; i < n; i++) fn (ctx, i, &p->w[0]);
        return;
    }
    pthread_mutex_lock (&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    atomic_store_explicit (&p->next, 0, memory_order_relaxed);
    p->busy = p->n_started;
    p->gen++;
    pthread_cond_broadcast (&p->go);
    pthread_mutex_unlock (&p->mu);
    s_work (p, &p->w[0]);
    pthread_mutex_lock (&p->mu);
    while (p->busy > 0) pthread_cond_wait (&p->done, &p->mu);
    pthread_mutex_unlock (&p->mu);
}
