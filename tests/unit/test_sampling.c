/* tests/unit/test_sampling.c -- core/sampling: greedy, temperature, top-k,
 * top-p, min-p, seeds, bad parameters, the radix sort of top-p / min-p
 * against the qsort reference it replaced, and drawing from a device's
 * candidates (rx_sampler_sample_cands) against the host sampler. */
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

/* ---- rx_sampler_sample_cands: drawing from a device's candidates ----------
 * The candidates are built here as a device would: probs = softmax(L / T)
 * in float over the whole row, sorted descending (the lower id first on
 * ties), the first k kept.  Where a cut falls inside the candidates the
 * token must be the host sampler's (rx_sampler_sample_with on the raw row,
 * same starting state); where it falls past them, RX_CANDS_FULL; plain
 * sampling must follow softmax(L / T) once RX_CANDS_TAIL is completed as the
 * scheduler does (candidate ids banned, the host sampler on the rest). */

/* The rows' own generator (an LCG), independent of the samplers'. */
static uint64_t s_cl = 1;
static uint32_t s_crand (void)
{
    s_cl = s_cl * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t) (s_cl >> 33);
}
static double s_cunif (void) { return (s_crand () + 0.5) / 2147483648.0; }

/* A row of v logits: Gaussian-ish (sum of 4 uniforms, spread sd), every
 * 7th value rounded to a multiple of 0.25 (ties), ids 3, 11 and 12 equal,
 * and -inf at ids 5 and 17 (when v > 17). */
static void s_crow (float *x, int32_t v, double sd)
{
    for (int32_t i = 0; i < v; i++) {
        double g = (s_cunif () + s_cunif () + s_cunif () + s_cunif () - 2.0) * 1.7320508;
        x[i] = (float) (sd * g);
        if (i % 7 == 0) x[i] = roundf (x[i] * 4) / 4;
    }
    if (v > 17) {
        x[11] = x[12] = x[3];
        x[5] = x[17] = -INFINITY;
    }
}

static float *s_sort_probs;
static int s_cmp_cand (const void *a, const void *b)
{
    const int32_t i = *(const int32_t *) a, j = *(const int32_t *) b;
    const float x = s_sort_probs[i], y = s_sort_probs[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* The device's candidates of row x: probs = softmax(x / t) in float, the k
 * largest, best first, the lower id first on ties. */
static void s_cands (const float *x, int32_t v, float t, int32_t k, float *probs, int32_t *ids)
{
    float *p = malloc ((size_t) v * sizeof *p);
    int32_t *o = malloc ((size_t) v * sizeof *o);
    cr_assert (p && o);
    const float inv_t = 1.0f / t;
    float mx = -INFINITY;
    for (int32_t i = 0; i < v; i++)
        if (x[i] * inv_t > mx) mx = x[i] * inv_t;
    float sum = 0;
    for (int32_t i = 0; i < v; i++) {
        p[i] = expf (x[i] * inv_t - mx);
        sum += p[i];
    }
    for (int32_t i = 0; i < v; i++) {
        p[i] /= sum;
        o[i] = i;
    }
    s_sort_probs = p;
    qsort (o, (size_t) v, sizeof *o, s_cmp_cand);
    for (int32_t i = 0; i < k; i++) {
        probs[i] = p[o[i]];
        ids[i] = o[i];
    }
    free (p);
    free (o);
}

static struct rx_sampling s_sp (float t, int32_t k, float p, float minp)
{
    struct rx_sampling sp;
    rx_sampling_defaults (&sp);
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = minp;
    return sp;
}

/* For `states` starting states: the candidates' token equals the host
 * sampler's on the raw row, and both leave the generator in the same
 * state.  Returns how many draws came from the candidates (the rest:
 * RX_CANDS_FULL, allowed only when full_ok). */
static int s_same_as_host (const float *x, int32_t v, const struct rx_sampling *sp, int32_t k,
                           int states, int full_ok, const char *what)
{
    float *probs = malloc ((size_t) k * sizeof *probs);
    int32_t *ids = malloc ((size_t) k * sizeof *ids);
    cr_assert (probs && ids);
    s_cands (x, v, sp->temperature, k, probs, ids);
    rx_sampler_t *s = s_new (1, 0, 1, 0, 0, v);
    int from_cands = 0;
    for (int i = 0; i < states; i++) {
        uint64_t st = 0x9e3779b97f4a7c15ull * (uint64_t) (i + 1) ^ 0x1234567ull, st_host = st;
        const int32_t got = rx_sampler_sample_cands (sp, &st, probs, ids, k, v);
        const int32_t want = rx_sampler_sample_with (s, sp, &st_host, x);
        cr_assert_eq (st, st_host, "%s: state %d: one uniform each", what, i);
        if (got == RX_CANDS_FULL && full_ok) continue;
        cr_assert_eq (got, want,
                      "%s: state %d (T %g top_k %d top_p %g min_p %g, k %d): candidates %d, host %d",
                      what, i, (double) sp->temperature, sp->top_k, (double) sp->top_p,
                      (double) sp->min_p, k, got, want);
        from_cands++;
    }
    rx_sampler_destroy (&s);
    free (probs);
    free (ids);
    return from_cands;
}

Test (sampling_cands, top_k_within_the_candidates_draws_the_host_samplers_token)
{
    static const int32_t vocab[] = { 200, 1000 };
    static const float temps[] = { 0.5f, 0.8f, 1.0f, 1.3f };
    static const float top_ps[] = { 1.0f, 0.9f, 0.5f, 0.75f };
    static const float min_ps[] = { 0.0f, 0.05f, 0.2f };
    float *x = malloc (1000 * sizeof *x);
    int combos = 0;
    s_cl = 7;
    for (int vi = 0; vi < 2; vi++) {
        const int32_t v = vocab[vi];
        for (int row = 0; row < 4; row++) {
            s_crow (x, v, 1.0 + row);
            const int32_t k = row % 2 ? 64 : 16;
            for (int c = 0; c < 6; c++) {
                /* top_k 2, k itself, and values between */
                const int32_t tk = c == 0 ? 2 : c == 1 ? k : 2 + (int32_t) (s_crand () % (uint32_t) (k - 1));
                struct rx_sampling sp = s_sp (temps[(row + c) % 4], tk, top_ps[c % 4], min_ps[(c + row) % 3]);
                char what[64];
                snprintf (what, sizeof what, "vocab %d row %d combo %d", v, row, c);
                cr_assert_eq (s_same_as_host (x, v, &sp, k, 500, 0, what), 500);
                combos++;
            }
        }
    }
    cr_assert_eq (combos, 48);
    free (x);
}

/* A peaked row: 6 tokens far above a flat rest, so the nucleus and the
 * min_p cut lie inside any k >= 8.  A flat row: every logit within 1 of
 * the others, so 64 of 1000 candidates hold < 64 * e / 1000 < 18% of the
 * mass and all pass a min_p of 0.05 (ratio >= 1/e). */
static void s_peaked (float *x, int32_t v)
{
    s_crow (x, v, 1.0);
    for (int i = 0; i < 6; i++) x[40 + 13 * i] = 9.0f - 0.5f * (float) i;
    x[40 + 13 * 2] = x[40 + 13 * 1];   /* a tie inside the nucleus */
}
static void s_flat (float *x, int32_t v)
{
    for (int32_t i = 0; i < v; i++) x[i] = (float) s_cunif ();
    x[9] = x[10];
}

Test (sampling_cands, top_p_and_min_p_inside_the_candidates_or_the_whole_row)
{
    const int32_t v = 1000, k = 64;
    float *x = malloc ((size_t) v * sizeof *x);
    s_cl = 11;
    s_peaked (x, v);
    struct rx_sampling sp = s_sp (1.0f, 0, 0.9f, 0);
    cr_assert_eq (s_same_as_host (x, v, &sp, k, 500, 0, "peaked top_p 0.9"), 500);
    sp = s_sp (0.7f, 0, 0.95f, 0);
    cr_assert_eq (s_same_as_host (x, v, &sp, k, 500, 0, "peaked T 0.7 top_p 0.95"), 500);
    sp = s_sp (1.0f, 0, 1, 0.1f);
    cr_assert_eq (s_same_as_host (x, v, &sp, k, 500, 0, "peaked min_p 0.1"), 500);
    sp = s_sp (1.2f, 0, 0.8f, 0.3f);
    cr_assert_eq (s_same_as_host (x, v, &sp, k, 500, 0, "peaked top_p 0.8 min_p 0.3"), 500);
    /* the same peaked row, candidates too few for the nucleus: k 4 holds
     * < 0.9 of the mass (6 tokens share it) */
    sp = s_sp (1.0f, 0, 0.99f, 0);
    cr_assert_eq (s_same_as_host (x, v, &sp, 4, 200, 1, "peaked top_p 0.99 k 4"), 0);

    s_flat (x, v);
    float probs[64];
    int32_t ids[64];
    static const float tps[] = { 0.5f, 0.9f, 0.3f };
    for (int c = 0; c < 4; c++) {
        sp = c < 3 ? s_sp (1.0f, 0, tps[c], 0) : s_sp (1.0f, 0, 1, 0.05f);
        s_cands (x, v, sp.temperature, k, probs, ids);
        for (uint64_t i = 0; i < 300; i++) {
            uint64_t st = i * 977;
            cr_assert_eq (rx_sampler_sample_cands (&sp, &st, probs, ids, k, v), RX_CANDS_FULL,
                          "flat row, case %d, state %llu: the cut lies past the candidates", c,
                          (unsigned long long) i);
        }
    }
    /* top_k > k: the whole row, whatever the row */
    s_peaked (x, v);
    for (int c = 0; c < 2; c++) {
        sp = s_sp (1.0f, k + 1 + 100 * c, c ? 0.9f : 1.0f, 0);
        s_cands (x, v, sp.temperature, k, probs, ids);
        for (uint64_t i = 0; i < 100; i++) {
            uint64_t st = i;
            cr_assert_eq (rx_sampler_sample_cands (&sp, &st, probs, ids, k, v), RX_CANDS_FULL,
                          "top_k %d > k %d", sp.top_k, k);
        }
    }
    free (x);
}

/* Plain sampling the way the scheduler completes it; hist[v] counts the
 * tokens, returns how many draws fell past the candidates. */
static long s_plain_hist (const float *x, int32_t v, float t, int32_t k, long n, uint64_t seed, long *hist)
{
    float *probs = malloc ((size_t) k * sizeof *probs), *row = malloc ((size_t) v * sizeof *row);
    int32_t *ids = malloc ((size_t) k * sizeof *ids);
    cr_assert (probs && row && ids);
    s_cands (x, v, t, k, probs, ids);
    struct rx_sampling sp = s_sp (t, 0, 1, 0);
    rx_sampler_t *s = s_new (1, 0, 1, 0, 0, v);
    memset (hist, 0, (size_t) v * sizeof *hist);
    uint64_t st = seed;
    long tail = 0;
    for (long i = 0; i < n; i++) {
        int32_t tok = rx_sampler_sample_cands (&sp, &st, probs, ids, k, v);
        cr_assert (tok >= 0 || tok == RX_CANDS_TAIL, "draw %ld: %d", i, tok);
        if (tok == RX_CANDS_TAIL) {
            tail++;
            memcpy (row, x, (size_t) v * sizeof *row);
            rx_logits_ban (row, v, ids, (size_t) k);
            tok = rx_sampler_sample_with (s, &sp, &st, row);
        }
        cr_assert (tok >= 0 && tok < v, "draw %ld: %d", i, tok);
        hist[tok]++;
    }
    rx_sampler_destroy (&s);
    free (probs);
    free (row);
    free (ids);
    return tail;
}

/* softmax(x / t) in double */
static void s_softmax_d (const float *x, int32_t v, float t, double *p)
{
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < v; i++)
        if (x[i] > mx) mx = x[i];
    for (int32_t i = 0; i < v; i++) sum += p[i] = exp (((double) x[i] - mx) / t);
    for (int32_t i = 0; i < v; i++) p[i] /= sum;
}

/* Every token's frequency within 5 sd of its probability (and a token of
 * probability 0 never drawn), and Pearson's chi-square over the tokens with
 * mass below a bound (dof ~ 48: mean 48, sd ~ 9.8; 110 is > 6 sd, while
 * moving 1% of the mass from the tail onto the candidates gives ~400). */
static void s_check_dist (const long *hist, const double *p, int32_t v, long n, const char *what)
{
    double chi = 0;
    int cells = 0;
    for (int32_t i = 0; i < v; i++) {
        if (p[i] == 0) {
            cr_assert_eq (hist[i], 0, "%s: token %d has no mass, drawn %ld times", what, i, hist[i]);
            continue;
        }
        const double e = p[i] * (double) n, sd = sqrt (e * (1 - p[i]));
        cr_assert (fabs ((double) hist[i] - e) < 5 * sd + 1, "%s: token %d drawn %ld times, expected %.1f (sd %.1f)",
                   what, i, hist[i], e, sd);
        chi += ((double) hist[i] - e) * ((double) hist[i] - e) / e;
        cells++;
    }
    cr_assert (chi < 110 * (cells - 1) / 48.0, "%s: chi-square %.1f over %d tokens", what, chi, cells);
    cr_log_info ("%s: chi-square %.1f over %d tokens", what, chi, cells);
}

Test (sampling_cands, plain_sampling_follows_the_softmax_tail_included, .timeout = 300)
{
    enum { V = 50, K = 8 };
    const long n = 200000;
    float x[V];
    double p[V];
    long hist[V];
    s_cl = 3;
    s_crow (x, V, 1.0);   /* ties (ids 3, 11, 12; multiples of 0.25), -inf at 5 and 17 */
    static const float temps[] = { 1.0f, 0.7f };
    for (int ti = 0; ti < 2; ti++) {
        const float t = temps[ti];
        s_softmax_d (x, V, t, p);
        float probs[K];
        int32_t ids[K];
        s_cands (x, V, t, K, probs, ids);
        double cmass = 0;
        for (int i = 0; i < K; i++) cmass += p[ids[i]];
        cr_assert (cmass > 0.2 && cmass < 0.9, "T %g: the candidates hold %.3f: a tail to test", (double) t, cmass);
        const long tail = s_plain_hist (x, V, t, K, n, 1000 + (uint64_t) ti, hist);
        char what[32];
        snprintf (what, sizeof what, "T %g k %d", (double) t, K);
        s_check_dist (hist, p, V, n, what);
        /* the tail rate is the tail's mass */
        const double q = 1 - cmass, sd = sqrt (q * (1 - q) * (double) n);
        cr_assert (fabs ((double) tail - q * (double) n) < 5 * sd, "%s: %ld tail draws, expected %.0f", what, tail,
                   q * (double) n);
    }
}

Test (sampling_cands, no_tail_when_the_candidates_hold_every_token_with_mass)
{
    enum { V = 50 };
    float x[V];
    double p[V];
    long hist[V];
    s_cl = 5;
    s_crow (x, V, 1.0);
    /* k == n_vocab: the whole row */
    long tail = s_plain_hist (x, V, 0.9f, V, 50000, 77, hist);
    cr_assert_eq (tail, 0, "k == n_vocab: %ld tail draws", tail);
    s_softmax_d (x, V, 0.9f, p);
    s_check_dist (hist, p, V, 50000, "k == n_vocab");
    /* 6 finite logits, k 8: the last two candidates have probability 0 */
    for (int32_t i = 0; i < V; i++)
        if (i % 9) x[i] = -INFINITY;
    tail = s_plain_hist (x, V, 1.0f, 8, 50000, 78, hist);
    cr_assert_eq (tail, 0, "6 tokens with mass, k 8: %ld tail draws", tail);
    s_softmax_d (x, V, 1.0f, p);
    s_check_dist (hist, p, V, 50000, "6 tokens with mass");
    /* and a top_p / min_p cut needs no more than them either */
    float probs[8];
    int32_t ids[8];
    s_cands (x, V, 1.0f, 8, probs, ids);
    cr_assert_eq (probs[6], 0.0f);
    struct rx_sampling sp = s_sp (1.0f, 0, 0.999f, 0);
    cr_assert_eq (s_same_as_host (x, V, &sp, 8, 300, 0, "6 tokens, top_p 0.999"), 300);
    sp = s_sp (1.0f, 0, 1, 1e-6f);
    cr_assert_eq (s_same_as_host (x, V, &sp, 8, 300, 0, "6 tokens, min_p 1e-6"), 300);
}

Test (sampling_cands, bad_candidates_and_greedy_parameters_go_to_the_whole_row)
{
    enum { V = 100, K = 8 };
    float x[V], probs[K], bad[K];
    int32_t ids[K], bids[K];
    s_cl = 9;
    s_crow (x, V, 1.0);
    s_cands (x, V, 1.0f, K, probs, ids);
    const struct rx_sampling plain = s_sp (1.0f, 0, 1, 0), topk = s_sp (1.0f, 4, 1, 0),
                             topp = s_sp (1.0f, 0, 0.01f, 0);
    const struct rx_sampling *ps[] = { &plain, &topk, &topp };
    /* the good candidates draw a token (top_p 0.01: the first candidate) */
    for (int j = 0; j < 3; j++) {
        uint64_t st = 42;
        int32_t t = rx_sampler_sample_cands (ps[j], &st, probs, ids, K, V);
        cr_assert (t >= 0 || (j == 0 && t == RX_CANDS_TAIL), "params %d: %d", j, t);
    }
    for (int c = 0; c < 8; c++) {
        memcpy (bad, probs, sizeof bad);
        memcpy (bids, ids, sizeof bids);
        int32_t k = K;
        switch (c) {
        case 0: bad[0] = NAN; break;
        case 1: bad[3] = NAN; break;
        case 2: bad[4] = bad[2] * 1.5f; break;               /* increasing */
        case 3: bids[5] = V; break;                          /* id out of range */
        case 4: bids[0] = -1; break;
        case 5: memset (bad, 0, sizeof bad); break;          /* all zero */
        case 6: bad[1] = -0.25f; bad[2] = bad[3] = bad[4] = bad[5] = bad[6] = bad[7] = -0.5f; break;
        case 7: k = V + 1; break;                            /* more candidates than tokens */
        }
        for (int j = 0; j < 3; j++)
            for (uint64_t i = 0; i < 50; i++) {
                uint64_t st = i;
                cr_assert_eq (rx_sampler_sample_cands (ps[j], &st, bad, bids, k, V), RX_CANDS_FULL,
                              "bad case %d, params %d, state %llu", c, j, (unsigned long long) i);
            }
    }
    /* greedy parameters: the caller takes the argmax */
    const struct rx_sampling g0 = s_sp (0, 0, 1, 0), g1 = s_sp (0.8f, 1, 1, 0), gneg = s_sp (-1, 5, 0.9f, 0);
    rx_sampler_t *s = s_new (1, 0, 1, 0, 0, 1);   /* a 1-token vocabulary: one uniform a draw */
    const float one = 0;
    const struct rx_sampling *gs[] = { &g0, &g1, &gneg };
    for (int j = 0; j < 3; j++) {
        uint64_t st = 5, st_one = 5;
        cr_assert_eq (rx_sampler_sample_cands (gs[j], &st, probs, ids, K, V), RX_CANDS_FULL, "greedy %d", j);
        cr_assert_eq (rx_sampler_sample_with (s, &plain, &st_one, &one), 0);
        cr_assert_eq (st, st_one, "greedy %d: one uniform taken all the same", j);
    }
    rx_sampler_destroy (&s);
}

/* Logprobs from candidates at temperature 1 (rx_logprobs_cands) are the
 * double log_softmax of rx_logprobs up to the float softmax's rounding,
 * with the same top ids (ties to the lower id); whatever they cannot give
 * exactly enough is -1: the caller reads the row. */
Test (sampling_cands, logprobs_from_candidates_equal_the_rows)
{
    enum { V = 32000, K = 64 };
    float *x = malloc (V * sizeof *x), probs[K];
    int32_t ids[K];
    cr_assert_not_null (x);
    static const double sds[] = { 1.0, 3.0, 8.0 };
    int checked = 0;
    for (int r = 0; r < 3; r++) {
        s_cl = 100 + (uint64_t) r;
        s_crow (x, V, sds[r]);
        s_cands (x, V, 1.0f, K, probs, ids);
        static const int32_t tops[] = { 0, 1, 5, 20 };
        for (int t = 0; t < 4; t++)
            for (int32_t at = 0; at < K; at += 9) {
                const int32_t n_top = tops[t], chosen = ids[at];
                int32_t hid[20], cid[20];
                float hlp[20], clp[20], lp = 1;
                const float want = rx_logprobs (x, V, chosen, n_top, hid, hlp);
                if (!isnormal (probs[at])) {   /* sd 8: the tail underflows */
                    cr_assert_eq (rx_logprobs_cands (probs, ids, K, chosen, n_top, &lp, cid, clp), -1);
                    continue;
                }
                cr_assert_eq (rx_logprobs_cands (probs, ids, K, chosen, n_top, &lp, cid, clp), 0,
                              "sd %g, n_top %d, candidate %d", sds[r], n_top, at);
                cr_assert_eq (rx_logprobs_cands (probs, ids, K, chosen, n_top, NULL, NULL, NULL), 0, "check only");
                cr_assert_float_eq (lp, want, 1e-4 + 1e-6 * fabsf (want), "sd %g candidate %d: %g vs %g", sds[r],
                                    at, lp, want);
                cr_assert_leq (lp, 0);
                for (int32_t j = 0; j < n_top; j++) {
                    cr_assert_eq (cid[j], hid[j], "sd %g top %d", sds[r], j);
                    cr_assert_float_eq (clp[j], hlp[j], 1e-4 + 1e-6 * fabsf (hlp[j]));
                }
                checked++;
            }
    }
    cr_assert_gt (checked, 60);
    /* what they cannot give */
    s_cl = 7;
    s_crow (x, V, 1.0);
    s_cands (x, V, 1.0f, K, probs, ids);
    float lp;
    cr_assert_eq (rx_logprobs_cands (probs, ids, K, ids[3], K + 1, &lp, NULL, NULL), -1, "n_top > k");
    cr_assert_eq (rx_logprobs_cands (probs, ids, 8, ids[8], 5, &lp, NULL, NULL), -1, "chosen past the k");
    cr_assert_eq (rx_logprobs_cands (probs, ids, 0, ids[0], 0, &lp, NULL, NULL), -1, "k 0");
    cr_assert_eq (rx_logprobs_cands (NULL, ids, K, ids[0], 0, &lp, NULL, NULL), -1);
    float bad[K];
    static const float poison[] = { 0, NAN, INFINITY, 1e-40f /* subnormal */, -0.5f };
    for (int c = 0; c < 5; c++) {
        memcpy (bad, probs, sizeof bad);
        bad[4] = poison[c];
        cr_assert_eq (rx_logprobs_cands (bad, ids, K, ids[4], 0, &lp, NULL, NULL), -1, "chosen's p %g", poison[c]);
        cr_assert_eq (rx_logprobs_cands (bad, ids, K, ids[0], 5, &lp, NULL, NULL), -1, "a top p %g", poison[c]);
        cr_assert_eq (rx_logprobs_cands (bad, ids, K, ids[0], 4, &lp, NULL, NULL), 0, "p %g past the top 4", poison[c]);
    }
    /* a peaked row: the best token's logprob is 0 (not above) */
    for (int32_t i = 0; i < V; i++) x[i] = i == 42 ? 0.f : -200.f;
    s_cands (x, V, 1.0f, K, probs, ids);
    int32_t tid;
    float tlp;
    cr_assert_eq (rx_logprobs_cands (probs, ids, K, 42, 1, &lp, &tid, &tlp), 0);
    cr_assert_eq (tid, 42);
    cr_assert (lp == 0 && tlp == 0, "%g %g", lp, tlp);
    cr_assert_eq (rx_logprobs_cands (probs, ids, K, 42, 2, &lp, NULL, NULL), -1, "the second underflowed");
    free (x);
}

/* rx_cands_penalized against the whole penalized row: the device's
 * candidates of the unpenalized row (float softmax at t), the touched
 * tokens' logits before and after rx_penalties_apply, as the scheduler
 * gathers them; the head it returns is the head of the penalized row's
 * order and its probabilities the penalized softmax (double) within
 * float rounding. */
Test (sampling_cands, penalized_candidates_are_the_head_of_the_penalized_row)
{
    enum { V = 1000, K = 32, NP = 40, NO = 30 };
    float *x = malloc (V * sizeof *x), *px = malloc (V * sizeof *px), probs[K];
    int32_t *order = malloc (V * sizeof *order), cids[K];
    uint32_t *counts = calloc (V, sizeof *counts);
    cr_assert (x && px && order && counts);
    static const float ts[] = { 0.7f, 1.0f, 1.5f };
    static const struct rx_penalties pens[] = {
        { 0.5f, 0, 1 }, { 0, 1.0f, 1 }, { 0, 0, 1.8f }, { 0.3f, 0.2f, 1.3f }, { -0.4f, 0, 1 }, { 2.0f, 3.0f, 0.6f },
    };
    int checked = 0, heads = 0;
    for (int it = 0; it < 36; it++) {
        const float t = ts[it % 3];
        const struct rx_penalties *pen = &pens[(it / 3) % 6];
        s_cl = 500 + (uint64_t) it;
        s_crow (x, V, it % 2 ? 2.0 : 1.0);
        x[5] = x[17] = -INFINITY;
        int32_t prompt[NP], out[NO];
        for (int i = 0; i < NP; i++) prompt[i] = (int32_t) (s_cunif () * V) % V;
        for (int i = 0; i < NO; i++) out[i] = i < 6 ? -1 : (int32_t) (s_cunif () * 60) % 60;   /* repeats */
        out[0] = 3;
        out[1] = 3;   /* the best tokens get hit: s_crow's top is random */
        s_cands (x, V, t, K, probs, cids);
        out[2] = cids[0];
        out[3] = cids[0];
        out[4] = cids[1];
        out[5] = V + 7;   /* outside the vocabulary: ignored */
        /* the whole penalized row, its order and softmax */
        memcpy (px, x, V * sizeof *px);
        rx_penalties_apply (px, V, pen, prompt, NP, out, NO, counts);
        for (int32_t i = 0; i < V; i++) order[i] = i;
        s_sort_probs = px;   /* the order of the penalized row: larger logit, then lower id */
        qsort (order, V, sizeof *order, s_cmp_cand);
        double mx = px[order[0]], z = 0;
        for (int32_t i = 0; i < V; i++) z += exp (((double) px[i] - mx) / t);
        /* what the scheduler gathers: the candidates, then the touched tokens */
        int32_t tok[K + NP + NO], m = 0;
        float raw[K + NP + NO], pl[K + NP + NO];
        for (int q = 0; q < K; q++) tok[m++] = cids[q];
        const int rep = pen->repetition != 1;
        for (int pass = rep ? 0 : 1; pass < 2; pass++)
            for (int i = 0; i < (pass ? NO : NP); i++) {
                const int32_t id = pass ? out[i] : prompt[i];
                int seen = id < 0 || id >= V;
                for (int32_t q = 0; q < m && !seen; q++) seen = tok[q] == id;
                if (!seen) tok[m++] = id;
            }
        for (int32_t q = 0; q < m; q++) {
            raw[q] = x[tok[q]];
            pl[q] = px[tok[q]];
        }
        int32_t hid[K + NP + NO];
        float hp[K + NP + NO];
        struct rx_cand_pair scratch[K + NP + NO];
        const int32_t nh = rx_cands_penalized (tok, raw, pl, m, K, probs[0], t, hid, hp, scratch);
        cr_assert_gt (nh, 0, "iteration %d", it);
        for (int32_t q = 0; q < nh; q++) {
            cr_assert_eq (hid[q], order[q], "iteration %d (t %g, penalties %d): head %d is %d, the row's %d", it, t,
                          (it / 3) % 6, q, hid[q], order[q]);
            const double want = exp (((double) px[order[q]] - mx) / t) / z;
            cr_assert (fabs (hp[q] - want) <= 2e-5 * want + 1e-9, "iteration %d head %d: p %g, want %g", it, q, hp[q],
                       want);
            checked++;
        }
        heads += nh;
        /* pen may be the probabilities' array (the scheduler's way) */
        memcpy (hp, pl, (size_t) m * sizeof *hp);
        cr_assert_eq (rx_cands_penalized (tok, raw, hp, m, K, probs[0], t, hid, hp, scratch), nh);
        cr_assert_eq (hid[0], order[0]);
    }
    cr_log_info ("penalized candidates: %d heads checked, %.1f long on average", checked, heads / 36.0);
    /* what gives -1 */
    s_cl = 77;
    s_crow (x, V, 1.0);
    s_cands (x, V, 1.0f, K, probs, cids);
    int32_t tok[K + 1], hid[K + 1];
    float raw[K + 1], pl[K + 1], hp[K + 1];
    struct rx_cand_pair scratch[K + 1];
    for (int q = 0; q < K; q++) {
        tok[q] = cids[q];
        raw[q] = pl[q] = x[cids[q]];
    }
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 1.0f, hid, hp, scratch), K, "nothing moved: the candidates");
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K - 1, K, probs[0], 1.0f, hid, hp, scratch), -1, "m < k");
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, 0.f, 1.0f, hid, hp, scratch), -1, "p1 0");
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 0.f, hid, hp, scratch), -1, "t 0");
    pl[3] = NAN;
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 1.0f, hid, hp, scratch), -1, "NaN");
    pl[3] = INFINITY;
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 1.0f, hid, hp, scratch), -1, "+inf");
    pl[3] = raw[3];
    pl[0] = raw[0] + 1e4f;   /* boosted past exp's range */
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 1.0f, hid, hp, scratch), -1, "overflow");
    /* a peaked row whose best token holds all but 1e-6 of the mass, then
     * penalized away: what is left is under 1e-3 of the row */
    for (int32_t i = 0; i < V; i++) x[i] = i == 9 ? 30.f : 0.f;
    s_cands (x, V, 1.0f, K, probs, cids);
    for (int q = 0; q < K; q++) {
        tok[q] = cids[q];
        raw[q] = pl[q] = x[cids[q]];
    }
    cr_assert_eq (tok[0], 9);
    pl[0] = -100.f;
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 1.0f, hid, hp, scratch), -1, "mass penalized away");
    /* every candidate penalized below the k-th: no head */
    for (int32_t i = 0; i < V; i++) x[i] = (float) -i * 0.01f;
    s_cands (x, V, 1.0f, K, probs, cids);
    for (int q = 0; q < K; q++) {
        tok[q] = cids[q];
        raw[q] = x[cids[q]];
        pl[q] = raw[q] - 0.5f;
    }
    cr_assert_eq (rx_cands_penalized (tok, raw, pl, K, K, probs[0], 1.0f, hid, hp, scratch), -1, "no head");
    free (x);
    free (px);
    free (order);
    free (counts);
}
