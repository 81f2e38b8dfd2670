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
 * 1 thread against 2.
 *
 *   bench/sampling-bench --cands [repeats (default 7)] [rows (default 8)]
 *
 * (also run after the above without --cands) Device sampling
 * ([scheduler] device_sampling, core/sampling.h rx_sampler_sample_cands)
 * on 128256-entry rows, k = 64 candidates: the device part as kernels-cpu
 * runs it (copy2d + softmax(x / T) + topk + copy of k values and ids back,
 * the engine's s_cands; a batch of `rows` rows, 1 and 2 threads; plugin from
 * $RX_PLUGIN_BUILD_DIR, default ./_plugins), then the host part per case
 * -- the whole-row rx_sampler_sample_with (the old path) against
 * rx_sampler_sample_cands over the row's candidates -- with how often the
 * candidates were not enough (full: cut past them; tail: plain draw past
 * them; both fetch the row and pay the old path again), on peaked rows
 * (as above), spread ones (Gaussian sd 2.5, no outliers) and flat ones
 * (Gaussian sd 1).  Nothing here
 * runs on a GPU.  Not a test; run by hand (docs/benchmarks.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <radix/kernel.h>

#include "conf.h"
#include "host.h"
#include "loader.h"
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

/* ---- device sampling: candidates instead of the whole row ---- */

#define S_K 64

/* kernels-cpu through the real loader (as bench/kernels.c). */
struct s_dev {
    rx_loader_t *l;
    rx_plugin_t *pl;
    const struct rx_kernels_ops *K;
    rx_conf_t *conf;
    struct rx_host_binding bind;
};

static int s_dev_open (struct s_dev *d, struct rx_err *err)
{
    memset (d, 0, sizeof *d);
    const char *dir = getenv ("RX_PLUGIN_BUILD_DIR");
    d->l = rx_loader_new (dir && *dir ? dir : "_plugins", err);
    if (!d->l) return err->code ? err->code : RX_EINVAL;
    int rc = rx_loader_find (d->l, RX_KIND_KERNELS, "cpu", &d->pl, err);
    if (rc == RX_OK) rc = rx_plugin_init (d->pl, NULL, err);
    if (rc != RX_OK) return rc;
    d->K = rx_plugin_ops (d->pl);
    d->conf = rx_conf_new_empty ("sampling-bench");
    if (!d->conf) return rx_err_set (err, RX_ENOMEM, "sampling-bench: out of memory");
    rx_host_bind (&d->bind, "kernels-cpu", "kernels.cpu", d->conf, rx_plugin_desc (d->pl)->keys);
    return RX_OK;
}

static void s_dev_close (struct s_dev *d)
{
    rx_conf_destroy (&d->conf);
    rx_loader_destroy (&d->l);
}

/* The engine's s_cands on kernels-cpu for `rows` rows of x (V wide) at
 * temperature T: probs/ids [rows][S_K] on the host.  Returns the median
 * microseconds per row over reps (the logits are on the "device" first,
 * untimed: they are the forward's output there), or -1 on an error. */
static double s_dev_cands (struct s_dev *d, int threads, const float *x, int32_t V, int rows, float T,
                           int reps, float *probs, int32_t *ids)
{
    const struct rx_kernels_ops *K = d->K;
    struct rx_err err = { 0 };
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = threads };
    void *be = NULL;
    float *dx = NULL, *dc = NULL, *dv = NULL;
    int32_t *di = NULL;
    double *t = malloc ((size_t) reps * sizeof *t), med = -1;
    const size_t n = (size_t) rows * (size_t) V;
    int rc = t ? K->create (&d->bind.host, &kp, &be, &err) : RX_ENOMEM;
    if (rc == RX_OK) rc = K->alloc (be, n * sizeof (float), 0, (void **) &dx, &err);
    if (rc == RX_OK) rc = K->alloc (be, n * sizeof (float), 0, (void **) &dc, &err);
    if (rc == RX_OK) rc = K->alloc (be, (size_t) rows * S_K * sizeof (float), 0, (void **) &dv, &err);
    if (rc == RX_OK) rc = K->alloc (be, (size_t) rows * S_K * sizeof (int32_t), 0, (void **) &di, &err);
    if (rc == RX_OK) rc = K->copy_h2d (be, NULL, dx, x, n * sizeof (float), &err);
    if (rc == RX_OK) rc = K->synchronize (be, NULL, &err);
    for (int r = 0; r < reps && rc == RX_OK; r++) {
        double t0 = s_now ();
        rc = K->copy2d (be, NULL, dx, (size_t) V, dc, (size_t) V, (size_t) rows, (size_t) V, &err);
        if (rc == RX_OK) rc = K->softmax (be, NULL, dc, (size_t) V, (size_t) rows, (size_t) V, 1.0f / T, &err);
        if (rc == RX_OK)
            rc = K->topk (be, NULL, dc, (size_t) V, (size_t) rows, (size_t) V, S_K, dv, di, &err);
        if (rc == RX_OK) rc = K->copy_d2h (be, NULL, probs, dv, (size_t) rows * S_K * sizeof (float), &err);
        if (rc == RX_OK) rc = K->copy_d2h (be, NULL, ids, di, (size_t) rows * S_K * sizeof (int32_t), &err);
        if (rc == RX_OK) rc = K->synchronize (be, NULL, &err);
        t[r] = (s_now () - t0) * 1e6 / rows;
    }
    if (rc == RX_OK) med = s_median (t, reps);
    else fprintf (stderr, "sampling-bench: kernels-cpu: %s\n", err.msg);
    if (be) {
        K->free_ (be, dx);
        K->free_ (be, dc);
        K->free_ (be, dv);
        K->free_ (be, di);
        K->destroy (be);
    }
    free (t);
    return med;
}

/* Rows of Gaussian logits of standard deviation sd, no outliers: at
 * sd 2.5 the mass spreads over the top few hundred tokens, at sd 1 over
 * most of the vocabulary. */
static void s_fill_gauss (float *x, int32_t V, int rows, double sd)
{
    for (size_t i = 0; i < (size_t) rows * (size_t) V; i++)
        x[i] = (float) (sd * sqrt (-2.0 * log (s_unif ())) * cos (6.283185307179586 * s_unif ()));
}

/* The host part of both paths on the same rows: returns 0, or 1 when a
 * candidate draw that sampling.h promises to be the host's was not. */
static int s_cands_bench (int reps, int rows)
{
    const int32_t V = 128256;
    const float T = 0.7f;
    /* draws per row per repeat for the candidate path: one draw is well
     * under a microsecond, too short to time alone */
    const int D = 200;
    float *x = malloc ((size_t) rows * (size_t) V * sizeof *x);
    float *probs = malloc ((size_t) rows * S_K * sizeof *probs);
    int32_t *ids = malloc ((size_t) rows * S_K * sizeof *ids);
    double *t_old = malloc ((size_t) reps * sizeof *t_old), *t_new = malloc ((size_t) reps * sizeof *t_new);
    struct rx_sampling sp;
    rx_sampling_defaults (&sp);
    struct rx_err err = { 0 };
    rx_sampler_t *s = rx_sampler_new (&sp, V, &err);
    struct s_dev dev;
    int bad = 0;
    if (!x || !probs || !ids || !t_old || !t_new || !s) {
        fprintf (stderr, "sampling-bench: %s\n", s ? "out of memory" : err.msg);
        bad = 1;
        goto out;
    }
    if (s_dev_open (&dev, &err) != RX_OK) {
        fprintf (stderr, "sampling-bench: kernels-cpu: %s (set RX_PLUGIN_BUILD_DIR)\n", err.msg);
        s_dev_close (&dev);
        bad = 1;
        goto out;
    }
    static const struct {
        const char *name;
        float top_p, min_p;
        int32_t top_k;
    } cases[] = {
        { "top_p 0.90", 0.9f, 0, 0 }, { "top_p 0.95", 0.95f, 0, 0 }, { "min_p 0.05", 1, 0.05f, 0 },
        { "top_k 40", 1, 0, 40 }, { "plain", 1, 0, 0 },
    };
    static const char *const kinds[][2] = {
        { "peaked", "Gaussian sd 2.5, ~1 in 1000 raised by 10-20" },
        { "spread", "Gaussian sd 2.5, no outliers" },
        { "flat", "Gaussian sd 1" },
    };
    for (int kind = 0; kind < 3; kind++) {
        if (kind == 0) s_fill (x, V, rows);
        else s_fill_gauss (x, V, rows, kind == 1 ? 2.5 : 1.0);
        printf ("\ndevice sampling, %s rows (%s), vocab %d, T %.1f, k %d candidates, %d rows a batch\n",
                kinds[kind][0], kinds[kind][1], V, (double) T, S_K, rows);
        double mass = 0;
        for (int th = 1; th <= 2; th++) {
            double us = s_dev_cands (&dev, th, x, V, rows, T, reps, probs, ids);
            if (us < 0) {
                bad = 1;
                goto out_dev;
            }
            printf ("device part on kernels-cpu, %d thread%s (copy2d + softmax + topk %d + copy back): %8.0f us/row\n",
                    th, th > 1 ? "s" : "", S_K, us);
        }
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < S_K; j++) mass += probs[(size_t) i * S_K + j] / rows;
        printf ("candidates' mass (mean over rows): %.4f\n", mass);
        printf ("%-12s %13s %9s %8s %7s %7s %11s %17s\n", "case", "whole row us", "cands us", "ratio",
                "full", "tail", "same draws", "cands+fallback us");
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            struct rx_sampling p = sp;
            p.temperature = T;
            p.top_p = cases[ci].top_p;
            p.min_p = cases[ci].min_p;
            p.top_k = cases[ci].top_k;
            long n_full = 0, n_tail = 0, n_draw = 0, n_same = 0, n_cmp = 0;
            for (int r = 0; r < reps; r++) {
                int32_t tok_old[1000];
                uint64_t st = 5000u + (uint64_t) r;
                double t0 = s_now ();
                for (int i = 0; i < rows; i++)
                    tok_old[i] = rx_sampler_sample_with (s, &p, &st, x + (size_t) i * (size_t) V);
                double t1 = s_now ();
                /* the first draw of each row from the same state as the
                 * host's: where the cut falls inside the candidates the
                 * token must be the host's (sampling.h) */
                st = 5000u + (uint64_t) r;
                for (int i = 0; i < rows; i++) {
                    int32_t tok = rx_sampler_sample_cands (&p, &st, probs + (size_t) i * S_K,
                                                           ids + (size_t) i * S_K, S_K, V);
                    if (tok >= 0 && (p.top_k > 0 || p.top_p < 1 || p.min_p > 0)) {
                        n_cmp++;
                        n_same += tok == tok_old[i];
                    }
                }
                double t2 = s_now ();
                for (int d = 0; d < D; d++)
                    for (int i = 0; i < rows; i++) {
                        int32_t tok = rx_sampler_sample_cands (&p, &st, probs + (size_t) i * S_K,
                                                               ids + (size_t) i * S_K, S_K, V);
                        n_draw++;
                        n_full += tok == RX_CANDS_FULL;
                        n_tail += tok == RX_CANDS_TAIL;
                    }
                double t3 = s_now ();
                t_old[r] = (t1 - t0) * 1e6 / rows;
                t_new[r] = (t3 - t2) * 1e6 / ((double) rows * D);
            }
            const double mo = s_median (t_old, reps), mn = s_median (t_new, reps);
            const double ff = (double) n_full / (double) n_draw, ft = (double) n_tail / (double) n_draw;
            char same[48] = "-";
            if (n_cmp) snprintf (same, sizeof same, "%ld/%ld", n_same, n_cmp);
            /* a fallback fetches the row and samples it whole: the old
             * cost again (the tail's ban of k ids is noise next to it) */
            printf ("%-12s %13.0f %9.3f %7.0fx %6.1f%% %6.1f%% %11s %17.1f\n", cases[ci].name, mo, mn,
                    mo / mn, 100 * ff, 100 * ft, same, mn + (ff + ft) * mo);
            fflush (stdout);
            bad += n_same != n_cmp && n_cmp - n_same > n_cmp / 100;   /* a rounding tie, not more */
        }
    }
out_dev:
    s_dev_close (&dev);
out:
    rx_sampler_destroy (&s);
    free (x);
    free (probs);
    free (ids);
    free (t_old);
    free (t_new);
    return bad ? 1 : 0;
}

int main (int argc, char **argv)
{
    if (argc > 1 && !strcmp (argv[1], "--cands")) {
        const int reps = argc > 2 ? atoi (argv[2]) : 7;
        const int rows = argc > 3 ? atoi (argv[3]) : 8;
        if (reps < 1 || reps > 1000 || rows < 1 || rows > 1000) {
            fprintf (stderr, "usage: sampling-bench --cands [repeats 1..1000] [rows 1..1000]\n");
            return 2;
        }
        return s_cands_bench (reps, rows);
    }
    const int reps = argc > 1 ? atoi (argv[1]) : 7;
    const int rows = argc > 2 ? atoi (argv[2]) : 8;
    if (reps < 1 || reps > 1000 || rows < 1 || rows > 1000) {
        fprintf (stderr, "usage: sampling-bench [--cands] [repeats 1..1000] [rows 1..1000]\n");
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
    return s_cands_bench (reps, rows);
}
