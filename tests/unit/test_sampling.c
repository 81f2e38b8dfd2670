/* tests/unit/test_sampling.c -- core/sampling: greedy, temperature, top-k,
 * top-p, min-p, seeds, and bad parameters. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

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
