/* tests/unit/test_sampling.c -- core/sampling: greedy, temperature, top-k,
 * top-p, min-p, seeds, bad parameters, and the radix sort of top-p / min-p
 * against the qsort reference it replaced. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample_pool.h"
#include "sampling.h"

static rx_sampler_t *s_new (float t, int32_t k, float p, float minp, uint64_t seed, int32_t n)
{
    struct rx_sampling sp;
    rx_sampling_defaults (&sp);
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = minp;
    sp.seed = seed;
    struct rx_err err = { 0 };
    rx_sampler_t *s = rx_sampler_new (&sp, n, &err);
    cr_assert_not_null (s, "%s", err.msg);
    return s;
}

Test (sampling, argmax_takes_the_lowest_index_on_ties_and_skips_nan)
{
    float x[] = { 1, 3, NAN, 3, -INFINITY };
    cr_assert_eq (rx_argmax (x, 5), 1);
    float y[] = { NAN, NAN, 2 };
    cr_assert_eq (rx_argmax (y, 3), 2);
    float z[] = { NAN, NAN };
    cr_assert_eq (rx_argmax (z, 2), 0);
}

Test (sampling, greedy_when_temperature_is_zero_or_top_k_is_one)
{
    float x[] = { 0.5f, 2.0f, 1.9f, -1.0f };
    rx_sampler_t *g = s_new (0, 0, 1, 0, 7, 4);
    rx_sampler_t *k1 = s_new (1.5f, 1, 1, 0, 7, 4);
    for (int i = 0; i < 50; i++) {
        cr_assert_eq (rx_sampler_sample (g, x), 1);
        cr_assert_eq (rx_sampler_sample (k1, x), 1);
    }
    rx_sampler_destroy (&g);
    rx_sampler_destroy (&k1);
    cr_assert_null (g);
}

/* Frequencies of n draws. */
static void s_hist (rx_sampler_t *s, const float *x, int32_t v, int n, int *h)
{
    memset (h, 0, (size_t) v * sizeof *h);
    for (int i = 0; i < n; i++) {
        int32_t t = rx_sampler_sample (s, x);
        cr_assert (t >= 0 && t < v);
        h[t]++;
    }
}

Test (sampling, temperature_one_follows_the_softmax)
{
    float x[] = { logf (0.5f), logf (0.3f), logf (0.2f) };
    rx_sampler_t *s = s_new (1, 0, 1, 0, 42, 3);
    int h[3];
    const int n = 20000;
    s_hist (s, x, 3, n, h);
    const double want[] = { 0.5, 0.3, 0.2 };
    for (int i = 0; i < 3; i++)   /* binomial sd <= 0.0036: 0.02 is > 5 sd */
        cr_assert (fabs ((double) h[i] / n - want[i]) < 0.02, "token %d: %d of %d, want %.2f", i,
                   h[i], n, want[i]);
    rx_sampler_destroy (&s);
}

Test (sampling, low_temperature_sharpens_high_flattens)
{
    float x[] = { 1.0f, 0.0f };
    int h[2];
    rx_sampler_t *cold = s_new (0.1f, 0, 1, 0, 1, 2);   /* p0 = 1/(1+e^-10) ~ 0.99995 */
    s_hist (cold, x, 2, 4000, h);
    cr_assert_geq (h[0], 3990);
    rx_sampler_t *hot = s_new (100.0f, 0, 1, 0, 1, 2);  /* p0 ~ 0.5025 */
    s_hist (hot, x, 2, 20000, h);
    cr_assert (fabs (h[0] / 20000.0 - 0.5025) < 0.02, "%d", h[0]);
    rx_sampler_destroy (&cold);
    rx_sampler_destroy (&hot);
}

Test (sampling, top_k_top_p_and_min_p_cut_the_tail)
{
    /* probabilities 0.5 0.3 0.15 0.05 */
    float x[] = { logf (0.15f), logf (0.5f), logf (0.05f), logf (0.3f) };
    int h[4];
    rx_sampler_t *k2 = s_new (1, 2, 1, 0, 3, 4);      /* ids 1 and 3 only */
    s_hist (k2, x, 4, 5000, h);
    cr_assert (h[0] == 0 && h[2] == 0 && h[1] > 0 && h[3] > 0, "%d %d %d %d", h[0], h[1], h[2], h[3]);
    cr_assert (fabs (h[1] / 5000.0 - 0.625) < 0.03, "renormalised: %d", h[1]);
    rx_sampler_t *p6 = s_new (1, 0, 0.6f, 0, 3, 4);   /* 0.5 < 0.6 <= 0.8: ids 1, 3 */
    s_hist (p6, x, 4, 5000, h);
    cr_assert (h[0] == 0 && h[2] == 0 && h[1] > 0 && h[3] > 0, "%d %d %d %d", h[0], h[1], h[2], h[3]);
    rx_sampler_t *p5 = s_new (1, 0, 0.5f, 0, 3, 4);   /* exactly the best: id 1 only */
    s_hist (p5, x, 4, 1000, h);
    cr_assert_eq (h[1], 1000);
    rx_sampler_t *m = s_new (1, 0, 1, 0.5f, 3, 4);    /* >= 0.25: ids 1, 3 */
    s_hist (m, x, 4, 5000, h);
    cr_assert (h[0] == 0 && h[2] == 0 && h[1] > 0 && h[3] > 0, "%d %d %d %d", h[0], h[1], h[2], h[3]);
    rx_sampler_t *k3 = s_new (1, 3, 1, 0, 3, 4);      /* ids 1, 3, 0 */
    s_hist (k3, x, 4, 5000, h);
    cr_assert (h[2] == 0 && h[0] > 0, "%d %d %d %d", h[0], h[1], h[2], h[3]);
    rx_sampler_destroy (&k2);
    rx_sampler_destroy (&p6);
    rx_sampler_destroy (&p5);
    rx_sampler_destroy (&m);
    rx_sampler_destroy (&k3);
}

Test (sampling, top_k_ties_keep_the_lower_ids)
{
    float x[] = { 1, 1, 1, 1, 1 };
    int h[5];
    rx_sampler_t *s = s_new (1, 2, 1, 0, 9, 5);
    s_hist (s, x, 5, 2000, h);
    cr_assert (h[0] > 0 && h[1] > 0 && h[2] == 0 && h[3] == 0 && h[4] == 0);
    rx_sampler_destroy (&s);
}

Test (sampling, non_finite_logits_are_never_drawn)
{
    float x[] = { NAN, 0.0f, -INFINITY, 0.0f };
    int h[4];
    rx_sampler_t *s = s_new (1, 0, 1, 0, 5, 4);
    s_hist (s, x, 4, 2000, h);
    cr_assert (h[0] == 0 && h[2] == 0 && h[1] > 0 && h[3] > 0);
    rx_sampler_destroy (&s);
}

Test (sampling, same_seed_same_tokens_other_seed_other_tokens)
{
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float) (i % 7) * 0.1f;
    rx_sampler_t *a = s_new (1, 0, 1, 0, 1234, 64), *b = s_new (1, 0, 1, 0, 1234, 64),
                 *c = s_new (1, 0, 1, 0, 1235, 64);
    int diff = 0;
    for (int i = 0; i < 200; i++) {
        int32_t ta = rx_sampler_sample (a, x), tb = rx_sampler_sample (b, x), tc = rx_sampler_sample (c, x);
        cr_assert_eq (ta, tb, "draw %d", i);
        diff += ta != tc;
    }
    cr_assert_gt (diff, 100, "seeds 1234 and 1235 agree on %d of 200 draws", 200 - diff);
    rx_sampler_destroy (&a);
    rx_sampler_destroy (&b);
    rx_sampler_destroy (&c);
}

static void s_bad (float t, int32_t k, float p, float minp, int32_t n, const char *want)
{
    struct rx_sampling sp = { t, k, p, minp, 0 };
    struct rx_err err = { 0 };
    rx_sampler_t *s = rx_sampler_new (&sp, n, &err);
    cr_assert_null (s);
    cr_assert_eq (err.code, RX_EINVAL);
    cr_assert (strstr (err.msg, want), "\"%s\" lacks \"%s\"", err.msg, want);
}

Test (sampling, bad_parameters_are_refused_with_a_message)
{
    s_bad (1, -1, 1, 0, 10, "top_k");
    s_bad (1, 0, 0, 0, 10, "top_p");
    s_bad (1, 0, 1.5f, 0, 10, "top_p");
    s_bad (1, 0, NAN, 0, 10, "top_p");
    s_bad (1, 0, 1, 1, 10, "min_p");
    s_bad (1, 0, 1, -0.1f, 10, "min_p");
    s_bad (NAN, 0, 1, 0, 10, "temperature");
    s_bad (INFINITY, 0, 1, 0, 10, "temperature");
    s_bad (1, 0, 1, 0, 0, "vocabulary");
    rx_sampler_destroy (NULL);
}

/* ---- radix sort vs the qsort it replaced ------------------------------------
 * s_ref_sample (tests/sampling_ref.h) is rx_sampler_sample_with as it was
 * before the radix sort, kept as the reference: the new sampler must draw
 * the very same token, and leave the generator in the same state, for
 * every row, parameter set and seed. */

#include "../sampling_ref.h"

/* The test's own generator (xorshift64*), independent of the sampler's. */
static uint64_t s_tr = 0x2545f4914f6cdd1dull;
static uint32_t s_rand (void)
{
    s_tr ^= s_tr >> 12;
    s_tr ^= s_tr << 25;
    s_tr ^= s_tr >> 27;
    return (uint32_t) ((s_tr * 0x2545f4914f6cdd1dull) >> 32);
}
static double s_unif (void) { return (s_rand () + 0.5) / 4294967296.0; }
static double s_gauss (void)
{
    return sqrt (-2.0 * log (s_unif ())) * cos (6.283185307179586 * s_unif ());
}

/* Row of kind `kind`: 0 Gaussian with outliers, 1 few distinct values (ties,
 * -0.0 and +0.0 mixed), 2 huge, tiny and subnormal magnitudes, 3 Gaussian
 * with NaN / +-inf sprinkled in, 4 random bit patterns (any float), 5 no
 * finite value at all, 6 nothing above zero and zeros of both signs at the
 * top (the sampler takes a zero's sign from the row, not from its key). */
static void s_row (float *x, int32_t v, int kind)
{
    static const float few[] = { -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, -0.0f, 0.0f, 2.0f };
    static const float odd[] = { 3e38f, -3e38f, 1e30f, -1e30f, 1e-40f, -1e-40f, 1e-45f,
                                 -1e-45f, 0.0f, -0.0f, 1.17549435e-38f, -1.17549435e-38f,
                                 FLT_MAX, -FLT_MAX, 1.0f, 1.0000001f };
    for (int32_t i = 0; i < v; i++) {
        switch (kind) {
        case 0:
            x[i] = (float) (2.5 * s_gauss ());
            if (s_rand () % 1000 == 0) x[i] += 15.0f;
            break;
        case 1: x[i] = few[s_rand () % 8]; break;
        case 2:
            x[i] = s_rand () % 2 ? odd[s_rand () % 16] : (float) (s_gauss () * 1e-39);
            break;
        case 3: {
            uint32_t r = s_rand () % 10;
            x[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 && s_rand () % 8 == 0 ? INFINITY
                                                                                     : (float) s_gauss ();
            break;
        }
        case 4: {
            uint32_t u = s_rand ();
            memcpy (&x[i], &u, sizeof u);
            break;
        }
        case 5: x[i] = s_rand () % 2 ? NAN : -INFINITY; break;
        default: {
            static const float np[] = { -0.0f, 0.0f, -1e-45f, -1.0f, -3.5f, -0.0f, NAN, -1e-3f };
            x[i] = np[s_rand () % 8];
            break;
        }
        }
    }
}

/* Random parameters; top_k mostly off (0, -1, >= vocab), sometimes on. */
static void s_params (struct rx_sampling *p, int32_t v)
{
    rx_sampling_defaults (p);
    uint32_t r = s_rand () % 16;
    p->temperature = r == 0 ? 0.0f : r == 1 ? 100.0f : (float) (0.05 + 2.0 * s_unif ());
    r = s_rand () % 8;
    p->top_k = r == 0 ? -1 : r == 1 ? v : r == 2 ? v + 5 : r == 3 ? 1 + (int32_t) (s_rand () % 50) : 0;
    r = s_rand () % 6;
    p->top_p = r == 0 ? 1.0f : r == 1 ? 1e-6f : r == 2 ? 0.9f : r == 3 ? 0.95f : (float) s_unif ();
    r = s_rand () % 6;
    p->min_p = r < 3 ? 0.0f : r == 3 ? 1.0f : r == 4 ? 0.05f : (float) s_unif ();
}

Test (sampling, radix_sort_draws_exactly_what_the_qsort_reference_draws, .timeout = 600)
{
    static const int32_t vocab[] = { 1, 2, 3, 255, 256, 257, 32000, 128256 };
    int32_t *idx = malloc (128256 * sizeof *idx);
    float *val = malloc (128256 * sizeof *val), *x = malloc (128256 * sizeof *x);
    cr_assert (idx && val && x);
    long draws = 0, sorted = 0;
    for (size_t vi = 0; vi < sizeof vocab / sizeof *vocab; vi++) {
        const int32_t v = vocab[vi];
        rx_sampler_t *s = s_new (1, 0, 1, 0, 0, v);
        /* fewer rows for the big vocabularies: the reference is the slow one */
        const int rows = v >= 100000 ? 14 : v >= 10000 ? 28 : 140;
        for (int row = 0; row < rows; row++) {
            const int kind = row % 7;
            s_row (x, v, kind);
            for (int ps = 0; ps < 3; ps++) {
                struct rx_sampling p;
                s_params (&p, v);
                if (ps == 0) {   /* the OpenAI case: top_k off, top_p or min_p on */
                    p.temperature = 0.7f;
                    p.top_k = row % 2 ? 0 : -1;
                    p.top_p = 0.9f + 0.05f * (float) (row % 3);
                }
                sorted += p.temperature > 0 && (p.top_p < 1 || p.min_p > 0);
                const int seeds = v >= 10000 ? 1 : 4;
                for (int sd = 0; sd < seeds; sd++) {
                    uint64_t st = ((uint64_t) s_rand () << 32) | s_rand (), st_ref = st;
                    for (int d = 0; d < 3; d++) {
                        int32_t want = s_ref_sample (&p, &st_ref, x, v, idx, val);
                        int32_t got = rx_sampler_sample_with (s, &p, &st, x);
                        cr_assert_eq (got, want,
                                      "vocab %d row %d (kind %d) T %g top_k %d top_p %g min_p %g "
                                      "draw %d: %d, reference %d",
                                      v, row, kind, (double) p.temperature, p.top_k,
                                      (double) p.top_p, (double) p.min_p, d, got, want);
                        cr_assert_eq (st, st_ref);
                        draws++;
                    }
                }
            }
        }
        rx_sampler_destroy (&s);
    }
    cr_log_info ("%ld draws identical (%ld parameter sets sorted all candidates)", draws, sorted);
    cr_assert_gt (sorted, 500);   /* the radix path was the one exercised */
    free (idx);
    free (val);
    free (x);
}

/* With top_p tiny only the first candidate in sorted order survives, so the
 * drawn token shows the order directly (expected values by hand). */
static int32_t s_first (const float *x, int32_t v)
{
    struct rx_sampling p;
    rx_sampling_defaults (&p);
    p.temperature = 1;
    p.top_p = 1e-6f;
    rx_sampler_t *s = s_new (1, 0, 1, 0, 0, v);
    uint64_t st = 99;
    int32_t t = rx_sampler_sample_with (s, &p, &st, x);
    rx_sampler_destroy (&s);
    return t;
}

Test (sampling, sorted_order_is_larger_logit_then_lower_id)
{
    float a[] = { -0.0f, 0.0f, -1.0f };          /* -0.0 == +0.0: lower id */
    cr_assert_eq (s_first (a, 3), 0);
    float b[] = { -1.0f, 0.0f, -0.0f };
    cr_assert_eq (s_first (b, 3), 1);
    float c[] = { 0.0f, 1e-45f, -0.0f };         /* the smallest subnormal beats zero */
    cr_assert_eq (s_first (c, 3), 1);
    float d[] = { -3.0f, -2.0f, -2.5f, NAN, INFINITY };   /* negatives; +inf is not a candidate */
    cr_assert_eq (s_first (d, 5), 1);
    float e[] = { -FLT_MAX, -1e-45f, -INFINITY };
    cr_assert_eq (s_first (e, 3), 1);
    float f[] = { 5.0f, 7.0f, 7.0f, 6.0f };       /* tie: lower id */
    cr_assert_eq (s_first (f, 4), 1);
}

/* ---- core/sample_pool: the scheduler's sampling threads ---------------------
 * Every index runs exactly once per run, on scratch of the pool's own (a
 * thread's sampler, counts and row buffer: never shared by two threads at
 * once, so never the same pointer for two concurrently running calls);
 * zero rows is a no-op; 1 thread runs on the caller; bad counts are one
 * clear line. */

struct pool_ctx {
    atomic_int hits[512];
    struct rx_sample_scratch *who[512];
    atomic_int inside[64];   /* calls running now, per scratch slot */
    struct rx_sample_scratch *base;
    int overlap;
};

static void s_pool_fn (void *ctx, size_t i, struct rx_sample_scratch *w)
{
    struct pool_ctx *c = ctx;
    atomic_fetch_add (&c->hits[i], 1);
    c->who[i] = w;
    size_t slot = (size_t) (w - c->base);
    if (atomic_fetch_add (&c->inside[slot], 1) != 0) c->overlap = 1;
    /* a little work, so the threads really run side by side */
    volatile double x = 0;
    for (int k = 0; k < 2000; k++) x += (double) k * 1e-9;
    w->row_buf[i % 7] = (float) x;
    atomic_fetch_sub (&c->inside[slot], 1);
}

Test (sample_pool, every_row_once_on_the_pools_own_scratch)
{
    struct rx_err err = { 0 };
    for (int threads = 1; threads <= 4; threads++) {
        rx_sample_pool_t *p = rx_sample_pool_new (threads, 1000, &err);
        cr_assert_not_null (p, "%s", err.msg);
        cr_assert_eq (rx_sample_pool_threads (p), threads);
        struct rx_sample_scratch *w0 = rx_sample_pool_scratch (p);
        cr_assert_not_null (w0->sampler);
        cr_assert_not_null (w0->pen_counts);
        for (int run = 0; run < 50; run++) {
            size_t n = (size_t) (run * 37) % 300;
            struct pool_ctx *c = calloc (1, sizeof *c);
            c->base = w0;
            rx_sample_pool_run (p, n, s_pool_fn, c);
            for (size_t i = 0; i < 512; i++)
                cr_assert_eq (atomic_load (&c->hits[i]), i < n ? 1 : 0, "threads %d run %d: row %zu", threads,
                              run, i);
            for (size_t i = 0; i < n; i++)
                cr_assert (c->who[i] >= w0 && c->who[i] < w0 + threads, "the pool's own scratch");
            cr_assert_eq (c->overlap, 0, "one call at a time per scratch");
            if (threads == 1)
                for (size_t i = 0; i < n; i++) cr_assert_eq (c->who[i], w0, "1 thread: the caller's");
            free (c);
        }
        rx_sample_pool_destroy (&p);
        cr_assert_null (p);
    }
    rx_sample_pool_destroy (NULL);
    cr_assert_null (rx_sample_pool_new (-1, 100, &err));
    cr_assert (strstr (err.msg, "sampling threads") && !strchr (err.msg, '\n'), "%s", err.msg);
    cr_assert_null (rx_sample_pool_new (65, 100, &err));
    cr_assert_null (rx_sample_pool_new (2, 0, &err));
    cr_assert (strstr (err.msg, "vocabulary"), "%s", err.msg);
    rx_sample_pool_t *a = rx_sample_pool_new (0, 100, &err);
    cr_assert_not_null (a, "%s", err.msg);
    cr_assert_geq (rx_sample_pool_threads (a), 1, "auto");
    cr_assert_leq (rx_sample_pool_threads (a), 8);
    rx_sample_pool_destroy (&a);
}
