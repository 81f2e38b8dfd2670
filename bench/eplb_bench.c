/* bench/eplb_bench.c -- bench/eplb-bench: balancedness before / after and
 * the run time of the EPLB algorithm plugins on the synthetic shape:
 * Zipf(1.2) token counts over 256 experts (each layer's experts in its own
 * random order, fixed seed), 58 layers, 288 slots, 8 GPUs, 8 groups, on 1
 * and 2 nodes.  Before = the identity placement (no redundancy, 32 experts
 * per GPU); after = the plugin's.  "split groups" = expert groups whose
 * copies land on more than one node (what deepseek's hierarchy avoids),
 * mean per layer.  Times = medians of the repeats on one thread: the
 * plugin's rebalance of all 58 layers alone, and rx_eplb_compute (plugin
 * lookup, load checks, rebalance, deriving logcnt / log2phy).
 *
 *   RADIX_PLUGIN_PATH=_plugins bench/eplb-bench [REPEATS]
 *
 * Prints a markdown table (docs/benchmarks.md). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <radix/eplb.h>

#include "eplb.h"
#include "loader.h"

#define NL 58
#define NE 256
#define NP 288
#define NG 8
#define NGPU 8

static uint64_t s_rng = 0x9E3779B97F4A7C15ull;
static double s_unif (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (double) (s_rng >> 11) / 9007199254740992.0;
}

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_cmpd (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static void s_stats (const struct rx_placement *p, const double *w, double *mean, double *min)
{
    *mean = 0;
    *min = 1;
    for (int l = 0; l < NL; l++) {
        double b = rx_placement_balancedness (p, l, w + (size_t) l * NE, NGPU);
        *mean += b / NL;
        if (b < *min) *min = b;
    }
}

static double s_split_groups (const struct rx_placement *p, int nodes)
{
    int gs = NE / NG, pn = NP / nodes, total = 0;
    for (int l = 0; l < NL; l++)
        for (int g = 0; g < NG; g++) {
            int seen = 0;
            for (int s = 0; s < NP; s++)
                if (p->phy2log[(size_t) l * NP + s] / gs == g) seen |= 1 << (s / pn);
            total += __builtin_popcount (seen) > 1;
        }
    return (double) total / NL;
}

int main (int argc, char **argv)
{
    int reps = argc > 1 ? atoi (argv[1]) : 51;
    if (reps < 1) reps = 1;
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    if (!l) {
        fprintf (stderr, "eplb-bench: %s\n", err.msg);
        return 1;
    }
    double *w = malloc (sizeof (double) * NL * NE);
    int perm[NE];
    for (int k = 0; k < NL; k++) {
        for (int e = 0; e < NE; e++) perm[e] = e;
        for (int e = NE - 1; e > 0; e--) {
            int j = (int) (s_unif () * (e + 1)), t = perm[e];
            perm[e] = perm[j];
            perm[j] = t;
        }
        for (int e = 0; e < NE; e++) w[k * NE + e] = floor (1e6 / pow (perm[e] + 1, 1.2));
    }
    struct rx_placement *id = rx_placement_identity (NL, NE, &err);
    double bm, bmin;
    s_stats (id, w, &bm, &bmin);
    printf ("| algorithm | nodes | balancedness before (mean / min) | after (mean / min) | split groups | rebalance (median of %d) | rx_eplb_compute |\n",
            reps);
    printf ("|---|---|---|---|---|---|---|\n");
    const char *algos[] = { "deepseek", "greedy" };
    int status = 0;
    double *t = malloc (sizeof (double) * reps);
    for (int a = 0; a < 2; a++)
        for (int nodes = 1; nodes <= 2; nodes++) {
            struct rx_eplb_problem q = { .struct_size = sizeof q, .n_layer = NL, .n_logical = NE,
                                         .n_physical = NP, .n_group = NG, .n_node = nodes, .n_gpu = NGPU,
                                         .load = w };
            struct rx_placement *p = NULL;
            /* the algorithm alone: the plugin's rebalance on all layers */
            rx_plugin_t *pl = NULL;
            if (rx_loader_find (l, RX_KIND_EPLB, algos[a], &pl, &err) != RX_OK
                || rx_plugin_init (pl, NULL, &err) != RX_OK) {
                fprintf (stderr, "eplb-bench: %s\n", err.msg);
                status = 1;
                goto out;
            }
            const struct rx_eplb_ops *ops = rx_plugin_ops (pl);
            int32_t *map = malloc (sizeof (int32_t) * NL * NP);
            for (int r = 0; r < reps; r++) {
                double t0 = s_now ();
                ops->rebalance (rx_plugin_host (pl), &q, map, &err);
                t[r] = s_now () - t0;
            }
            free (map);
            qsort (t, (size_t) reps, sizeof *t, s_cmpd);
            double alg = t[reps / 2];
            for (int r = 0; r < reps; r++) {
                rx_placement_free (&p);
                double t0 = s_now ();
                p = rx_eplb_compute (l, algos[a], &q, &err);
                t[r] = s_now () - t0;
                if (!p) {
                    fprintf (stderr, "eplb-bench: %s\n", err.msg);
                    status = 1;
                    goto out;
                }
            }
            qsort (t, (size_t) reps, sizeof *t, s_cmpd);
            double am, amin;
            s_stats (p, w, &am, &amin);
            printf ("| %s | %d | %.4f / %.4f | %.4f / %.4f | %.2f | %.2f ms | %.2f ms |\n", algos[a], nodes,
                    bm, bmin, am, amin, s_split_groups (p, nodes), alg * 1e3, t[reps / 2] * 1e3);
            rx_placement_free (&p);
        }
out:
    free (t);
    rx_placement_free (&id);
    free (w);
    rx_loader_destroy (&l);
    return status;
}
