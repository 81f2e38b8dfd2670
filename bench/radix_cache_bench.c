/* bench/radix_cache_bench.c -- timing sanity for the radix prefix cache and
 * the KV slot pool: match + insert of 2,000-token prompts that share a
 * system prompt, and eviction of 100k tokens.  Prints one line per case.
 * Not a test (nothing here fails on time); run by hand:
 *     ./bench/radix_cache_bench [page_size] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpool.h"
#include "radix_cache.h"

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static uint64_t s_rng = 88172645463325252ull;
static int32_t s_tok (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (int32_t) (s_rng % 151936);    /* a Qwen2-sized vocabulary */
}

static void s_free (void *ud, const int32_t *slots, size_t n)
{
    struct rx_err e;
    if (rx_kvpool_free (ud, slots, (uint32_t) n, &e) != RX_OK) {
        fprintf (stderr, "bench: %s\n", e.msg);
        exit (1);
    }
}

static void s_die (const struct rx_err *e)
{
    fprintf (stderr, "bench: %s\n", e->msg);
    exit (1);
}

/* One request as the scheduler will run it: match, lock, allocate the
 * rest, insert, free the duplicates, unlock. */
static void s_request (rx_kvpool_t *pool, rx_radix_cache_t *c, const int32_t *toks, size_t n,
                       int32_t *slots, double *t_match, double *t_insert)
{
    struct rx_err e;
    struct rx_radix_match m, ins;
    double t0 = s_now ();
    if (rx_radix_cache_match (c, toks, n, slots, &m, &e)) s_die (&e);
    double t1 = s_now ();
    rx_radix_cache_lock (c, m.last, &e);
    size_t need = n - m.len;
    if (rx_kvpool_available (pool) < need + rx_kvpool_page_size (pool))
        rx_radix_cache_evict (c, need + rx_kvpool_page_size (pool));
    if (rx_kvpool_alloc (pool, (uint32_t) need, slots + m.len, &e)) s_die (&e);
    double t2 = s_now ();
    if (rx_radix_cache_insert (c, toks, slots, n, &ins, &e)) s_die (&e);
    double t3 = s_now ();
    rx_kvpool_free (pool, slots + m.len, (uint32_t) (ins.prefix_len - m.len), &e);
    rx_kvpool_free (pool, slots + ins.len, (uint32_t) (n - ins.len), &e);
    rx_radix_cache_unlock (c, m.last, &e);
    rx_radix_cache_tick (c);
    *t_match += t1 - t0;
    *t_insert += t3 - t2;
}

int main (int argc, char **argv)
{
    uint32_t ps = argc > 1 ? (uint32_t) atoi (argv[1]) : 1;
    struct rx_err e;
    enum { N_SLOTS = 4 << 20, PROMPT = 2000, SYS = 1000, REQS = 1000 };
    rx_kvpool_t *pool = rx_kvpool_new (N_SLOTS / ps * ps, ps, &e);
    if (!pool) s_die (&e);
    rx_radix_cache_t *c = rx_radix_cache_new (ps, s_free, pool, &e);
    if (!c) s_die (&e);
    printf ("radix_cache_bench: page_size %u, pool %u slots\n", ps, rx_kvpool_capacity (pool));

    /* 1. 2,000-token prompts: a shared 1,000-token system prompt, then
     *    1,000 tokens of their own (half hit, half miss). */
    int32_t *sys = malloc (SYS * sizeof *sys), *toks = malloc (PROMPT * sizeof *toks);
    int32_t *slots = malloc (PROMPT * sizeof *slots);
    for (int i = 0; i < SYS; i++) sys[i] = s_tok ();
    double tm = 0, ti = 0;
    for (int r = 0; r < REQS; r++) {
        memcpy (toks, sys, sizeof (int32_t) * SYS);
        for (int i = SYS; i < PROMPT; i++) toks[i] = s_tok ();
        s_request (pool, c, toks, PROMPT, slots, &tm, &ti);
    }
    printf ("  2000-token prompt, 1000 cached: match %.2f us, insert %.2f us (mean of %d)\n",
            1e6 * tm / REQS, 1e6 * ti / REQS, REQS);
    /* Full hits of the same prompts (the last one again). */
    double t0 = s_now ();
    struct rx_radix_match m;
    for (int r = 0; r < REQS; r++)
        if (rx_radix_cache_match (c, toks, PROMPT, slots, &m, &e)) s_die (&e);
    printf ("  2000-token prompt, all cached:  match %.2f us (%zu matched)\n",
            1e6 * (s_now () - t0) / REQS, m.len);
    printf ("  tree: %zu nodes, %zu tokens\n", rx_radix_cache_node_count (c),
            rx_radix_cache_total_size (c));

    /* 2. Eviction of 100k tokens from that tree (1,000-token leaves). */
    t0 = s_now ();
    size_t freed = rx_radix_cache_evict (c, 100000);
    printf ("  evict 100k tokens (1000-token leaves): %.3f ms, %zu freed\n",
            1e3 * (s_now () - t0), freed);
    rx_radix_cache_flush (c, NULL);

    /* 3. Many small leaves: multi-turn chats extending one another in
     *    16-token steps -> 100k tokens in ~6,250 leaves behind 500 shared
     *    roots. */
    size_t step = ps > 16 ? ps : 16, total = 0;
    int32_t *conv = malloc (4096 * sizeof *conv);
    while (total < 200000) {
        size_t n = 0;
        int turns = 1 + (int) (s_rng % 24);
        for (int t = 0; t < turns && n + step <= 4096; t++) {
            for (size_t i = 0; i < step; i++) conv[n++] = s_tok ();
            s_request (pool, c, conv, n, slots, &tm, &ti);
        }
        total += n;
    }
    printf ("  tree: %zu nodes, %zu tokens\n", rx_radix_cache_node_count (c),
            rx_radix_cache_total_size (c));
    t0 = s_now ();
    freed = rx_radix_cache_evict (c, 100000);
    printf ("  evict 100k tokens (%zu-token nodes): %.3f ms, %zu freed\n", step,
            1e3 * (s_now () - t0), freed);
    t0 = s_now ();
    freed = rx_radix_cache_flush (c, NULL);
    printf ("  flush %zu tokens: %.3f ms\n", freed, 1e3 * (s_now () - t0));

    rx_radix_cache_destroy (&c);
    rx_kvpool_destroy (&pool);
    free (sys);
    free (toks);
    free (slots);
    free (conv);
    return 0;
}
