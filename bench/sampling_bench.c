/* bench/sampling_bench.c -- host sampling cost per row: the full qsort_r of
 * every finite logit that top_p / min_p used to do ("qsort (before)", the
 * old rx_sampler_sample_with copied here) against rx_sampler_sample_with
 * (radix sort, core/sampling.c), on the same rows and seeds.
 *
 *   bench/sampling-bench [repeats (default 7)] [rows (default 8)]
 *
 * Rows: Gaussian logits (sd 2.5) with ~1 in 1000 outliers raised by 10-20,
 * the shape of a language model's next-token logits.  Cases: vocabularies
 * 32000 and 128256, temperature 0.7, top_p 0.9 / 0.95 (top_k off, as every
 * OpenAI client sends), plus min_p 0.05.  Each repeat times `rows` rows with
 * the old code, then with the new; printed: median microseconds per row over
 * the repeats and the ratio, and the same for plain sampling (top_p 1,
 * min_p 0: no sort at all) on the same rows: the floor that exp over every
 * candidate and the draw cost anyway.  Both sorted versions draw the same
 * tokens (checked: exit 1 if not).  Then a decode step of 64 sampled
 * 128k rows on the scheduler's sampling threads (core/sample_pool.h),
 * 1 thread against 2.  Not a test; run by hand (docs/benchmarks.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample_pool.h"
#include "sampling.h"

/* ---- qsort (before): rx_sampler_sample_with before the radix sort
 * (tests/sampling_ref.h, the reference test_sampling checks against). ---- */

#include "../tests/sampling_ref.h"

/* ---- the bench ---- */

static double s_now (void);
static double s_median (double *v, int n);
static void s_fill (float *x, int32_t V, int rows);

/* The scheduler's sampling threads (core/sample_pool.h): a decode step of
 * 64 sampled rows (128256 vocabulary, temperature 0.7, top_p 0.9), ms per
 * step with 1 thread and with 2 (the box's cores), median over reps. */
struct s_pj {
    const float *x;
    int32_t V;
    uint64_t st[64];
    int32_t tok[64];
};

static void s_pool_row (void *ctx, size_t i, struct rx_sample_scratch *w)
{
    struct s_pj *j = ctx;
    struct rx_sampling p;
    rx_sampling_defaults (&p);
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    j->tok[i] = rx_sampler_sample_with (w->sampler, &p, &j->st[i], j->x + i * (size_t) j->V);
}

static void s_pool_bench (int reps)
{
    const int32_t V = 128256;
    const int rows = 64;
    float *x = malloc ((size_t) rows * (size_t) V * sizeof *x);
    double *t = malloc ((size_t) reps * sizeof *t);
    if (!x || !t) return;
    s_fill (x, V, rows);
    int32_t first[64];
    printf ("\nsampling threads (core/sample_pool.h): %d rows of %d, T 0.7 top_p 0.90, ms per step\n", rows, V);
    for (int th = 1; th <= 2; th++) {
        struct rx_err err = { 0 };
        rx_sample_pool_t *p = rx_sample_pool_new (th, V, &err);
        if (!p) {
            fprintf (stderr, "sampling-bench: %s\n", err.msg);
            break;
        }
        struct s_pj j = { .x = x, .V = V };
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < rows; i++) j.st[i] = 7u + (uint64_t) i;
            double t0 = s_now ();
            rx_sample_pool_run (p, (size_t) rows, s_pool_row, &j);
            t[r] = (s_now () - t0) * 1e3;
        }
        if (th == 1) memcpy (first, j.tok, sizeof first);
        printf ("threads %d: %8.1f ms%s\n", th, s_median (t, reps),
                th > 1 && memcmp (first, j.tok, sizeof first) ? "  TOKENS DIFFER" : "");
        rx_sample_pool_destroy (&p);
    }
    free (x);
    free (t);
}

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static uint64_t s_rs = 0x9e3779b97f4a7c15ull;
static double s_unif (void)
{
    s_rs ^= s_rs >> 12;
    s_rs ^= s_rs << 25;
    s_rs ^= s_rs >> 27;
    return ((double) ((s_rs * 0x2545f4914f6cdd1dull) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static int s_dcmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static double s_median (double *x, int n)
{
    qsort (x, (size_t) n, sizeof *x, s_dcmp);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Rows of Gaussian logits (sd 2.5), ~1 in 1000 raised by 10-20. */
static void s_fill (float *x, int32_t V, int rows)
{
    for (size_t i = 0; i < (size_t) rows * (size_t) V; i++) {
        double g = sqrt (-2.0 * log (s_unif ())) * cos (6.283185307179586 * s_unif ());
        x[i] = (float) (2.5 * g);
        if (s_unif () < 0.001) x[i] += (float) (10.0 + 10.0 * s_unif ());
    }
}

int main (int argc, char **argv)
{
    const int reps = argc > 1 ? atoi (argv[1]) : 7;
    const int rows = argc > 2 ? atoi (argv[2]) : 8;
    if (reps < 1 || reps > 1000 || rows < 1 || rows > 1000) {
        fprintf (stderr, "usage: sampling-bench [repeats 1..1000] [rows 1..1000]\n");
        return 2;
    }
    static const int32_t vocab[] = { 32000, 128256 };
    static const struct { float top_p, min_p; } cases[] = { { 0.9f, 0 }, { 0.95f, 0 }, { 1, 0.05f } };
    printf ("%-7s %-16s %18s %9s %7s %14s\n", "vocab", "case", "qsort (before) us", "radix us",
            "ratio", "no sort us");
    int bad = 0;
    for (size_t vi = 0; vi < 2; vi++) {
        const int32_t V = vocab[vi];
        float *x = malloc ((size_t) rows * (size_t) V * sizeof *x);
        int32_t *idx = malloc ((size_t) V * sizeof *idx);
        float *val = malloc ((size_t) V * sizeof *val);
        double *t_old = malloc ((size_t) reps * sizeof *t_old), *t_new = malloc ((size_t) reps * sizeof *t_new),
               *t_plain = malloc ((size_t) reps * sizeof *t_plain);
        struct rx_sampling sp;
        rx_sampling_defaults (&sp);
        struct rx_err err = { 0 };
        rx_sampler_t *s = rx_sampler_new (&sp, V, &err);
        if (!x || !idx || !val || !t_old || !t_new || !t_plain || !s) {
            fprintf (stderr, "sampling-bench: %s\n", s ? "out of memory" : err.msg);
            return 1;
        }
        s_fill (x, V, rows);
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            struct rx_sampling p = sp;
            p.temperature = 0.7f;
            p.top_p = cases[ci].top_p;
            p.min_p = cases[ci].min_p;
            for (int r = 0; r < reps; r++) {
                int32_t tok_old[1000], tok_new[1000];
                uint64_t st = 1000u + (uint64_t) r;
                double t0 = s_now ();
                for (int i = 0; i < rows; i++)
                    tok_old[i] = s_ref_sample (&p, &st, x + (size_t) i * (size_t) V, V, idx, val);
                double t1 = s_now ();
                st = 1000u + (uint64_t) r;
                for (int i = 0; i < rows; i++)
                    tok_new[i] = rx_sampler_sample_with (s, &p, &st, x + (size_t) i * (size_t) V);
                double t2 = s_now ();
                struct rx_sampling plain = p;
                plain.top_p = 1;
                plain.min_p = 0;
                for (int i = 0; i < rows; i++)
                    (void) rx_sampler_sample_with (s, &plain, &st, x + (size_t) i * (size_t) V);
                double t3 = s_now ();
                t_old[r] = (t1 - t0) * 1e6 / rows;
                t_new[r] = (t2 - t1) * 1e6 / rows;
                t_plain[r] = (t3 - t2) * 1e6 / rows;
                for (int i = 0; i < rows; i++) bad += tok_old[i] != tok_new[i];
            }
            char name[32];
            if (p.min_p > 0) snprintf (name, sizeof name, "T 0.7 min_p %.2f", (double) p.min_p);
            else snprintf (name, sizeof name, "T 0.7 top_p %.2f", (double) p.top_p);
            double mo = s_median (t_old, reps), mn = s_median (t_new, reps),
                   mp = s_median (t_plain, reps);
            printf ("%-7d %-16s %18.0f %9.0f %6.1fx %14.0f\n", V, name, mo, mn, mo / mn, mp);
            fflush (stdout);
        }
        rx_sampler_destroy (&s);
        free (x);
        free (idx);
        free (val);
        free (t_old);
        free (t_new);
        free (t_plain);
    }
    if (bad) {
        fprintf (stderr, "sampling-bench: %d rows drew different tokens\n", bad);
        return 1;
    }

    printf ("tokens identical on every row (%d repeats x %d rows per case)\n", reps, rows);
    s_pool_bench (reps);
    return 0;
}
