/* bench/moe_bench.c -- dispatch + combine latency of the MoE dispatchers
 * (ep_normal, ep_low_latency, ep_auto; radix/moe.h) between forked ranks on
 * comm-shm and kernels-cpu, against tokens per rank.
 *
 *   bench/moe-bench [-n RANKS] [-e EXPERTS] [-k TOPK] [-d N_EMBD] [-r REPEATS]
 *
 * Plugins come from $RX_PLUGIN_BUILD_DIR (else ./_plugins) through the
 * core's loader.  For each batch size (1, 4, 16, 64, 256, 512 tokens per
 * rank, random top-k routing) and each row of the table, every rank runs a
 * warm-up and R timed repeats of barrier, dispatch, "expert" (routed.x
 * copied to routed.y: a stand-in, the same for every mode), combine; the
 * table shows the median of rank 0's times in microseconds.
 *   normal        ep_normal,      max_tokens 512
 *   ll/512        ep_low_latency, max_tokens 512 (slots for 512 tokens)
 *   ll/batch      ep_low_latency, max_tokens = the batch (decode config:
 *                 the slots sized to the decode batch)
 *   auto          ep_auto,        max_tokens 512, decode_max_tokens default
 * The seed's expectation (DeepEP): low-latency wins at small decode
 * batches (no count exchange, fixed shapes), normal at large prefill
 * batches (moves only the real rows). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/kernel.h>
#include <radix/moe.h>

#include "loader.h"

#define N_SIZES 6
#define N_MODES 4
#define MAX_REP 200

static const int s_sizes[N_SIZES] = { 1, 4, 16, 64, 256, 512 };
static const char *s_mode_name[N_MODES] = { "normal", "ll/512", "ll/batch", "auto" };
static const char *s_mode_plugin[N_MODES] = { "ep_normal", "ep_low_latency", "ep_low_latency", "ep_auto" };

struct shared {
    double t[N_SIZES][N_MODES];
    int ok;
};

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#define TRY(call)                                                               \
    do {                                                                        \
        if ((call) != RX_OK) {                                                  \
            fprintf (stderr, "rank %d: %s: %s\n", rank, #call, err.msg);        \
            return 1;                                                           \
        }                                                                       \
    } while (0)

static int s_rank (rx_loader_t *l, const char *group, int rank, int P, int NE, int k, int E, int reps,
                   struct shared *sh)
{
    struct rx_err err = { 0 };
    rx_plugin_t *kp, *cp, *mp[N_MODES];
    TRY (rx_loader_find (l, RX_KIND_KERNELS, "cpu", &kp, &err));
    TRY (rx_plugin_init (kp, NULL, &err));
    TRY (rx_loader_find (l, RX_KIND_COMM, "shm", &cp, &err));
    TRY (rx_plugin_init (cp, NULL, &err));
    for (int m = 0; m < N_MODES; m++) {
        TRY (rx_loader_find (l, RX_KIND_MOE, s_mode_plugin[m], &mp[m], &err));
        TRY (rx_plugin_init (mp[m], NULL, &err));
    }
    const struct rx_kernels_ops *K = rx_plugin_ops (kp);
    const struct rx_comm_ops *C = rx_plugin_ops (cp);
    void *be, *comm = NULL;
    struct rx_kernels_params kpar = { .struct_size = sizeof kpar, .threads = 1 };
    TRY (K->create (rx_plugin_host (kp), &kpar, &be, &err));
    struct rx_comm_params cpar = { .struct_size = sizeof cpar, .rank = rank, .n_rank = P, .group = group,
                                   .timeout_s = 60, .kops = K, .kbe = be };
    TRY (C->create (rx_plugin_host (cp), &cpar, &comm, &err));
    const int T = s_sizes[N_SIZES - 1];
    float *x = malloc ((size_t) T * E * sizeof *x), *w = malloc ((size_t) T * k * sizeof *w);
    int32_t *ids = malloc ((size_t) T * k * sizeof *ids);
    for (size_t i = 0; i < (size_t) T * E; i++) x[i] = (float) (s_mix (i + (uint64_t) rank * 977) % 1000) * 1e-3f;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int32_t id;
            int dup;
            uint64_t salt = 0;
            do {
                id = (int32_t) (s_mix ((uint64_t) rank << 40 ^ (uint64_t) (t * k + j) << 8 ^ salt++) % (uint64_t) NE);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == id;
            } while (dup);
            ids[t * k + j] = id;
            w[t * k + j] = 1.0f / (float) k;
        }
    float *dx, *dw, *dout;
    int32_t *dids;
    TRY (K->alloc (be, (size_t) T * E * sizeof *x, 64, (void **) &dx, &err));
    TRY (K->alloc (be, (size_t) T * E * sizeof *x, 64, (void **) &dout, &err));
    TRY (K->alloc (be, (size_t) T * k * sizeof *w, 64, (void **) &dw, &err));
    TRY (K->alloc (be, (size_t) T * k * sizeof *ids, 64, (void **) &dids, &err));
    TRY (K->copy_h2d (be, NULL, dx, x, (size_t) T * E * sizeof *x, &err));
    TRY (K->copy_h2d (be, NULL, dw, w, (size_t) T * k * sizeof *w, &err));
    TRY (K->copy_h2d (be, NULL, dids, ids, (size_t) T * k * sizeof *ids, &err));
    double t[MAX_REP];
    for (int s = 0; s < N_SIZES; s++) {
        const int n = s_sizes[s];
        for (int m = 0; m < N_MODES; m++) {
            const struct rx_moe_ops *M = rx_plugin_ops (mp[m]);
            struct rx_moe_config mc = {
                .struct_size = sizeof mc, .n_expert = NE, .n_expert_used = k, .n_embd = E,
                .max_tokens = m == 2 ? n : T, .ep_rank = rank, .ep_size = P, .kops = K, .kbe = be,
                .comm = C, .comm_inst = comm,
            };
            void *moe;
            TRY (M->create (rx_plugin_host (mp[m]), &mc, &moe, &err));
            for (int it = -3; it < reps; it++) {
                TRY (C->barrier (comm, NULL, &err));
                double t0 = s_now ();
                struct rx_moe_routed r = { .struct_size = sizeof r };
                TRY (M->dispatch (moe, dx, (size_t) E, n, dids, dw, &r, &err));
                if (r.n_rows)
                    TRY (K->copy_d2d (be, NULL, r.y, r.x, (size_t) r.n_rows * E * sizeof (float), &err));
                TRY (M->combine (moe, dout, (size_t) E, 0, &err));
                if (it >= 0) t[it] = s_now () - t0;
            }
            M->destroy (moe);
            qsort (t, (size_t) reps, sizeof *t, s_cmp);
            if (rank == 0) sh->t[s][m] = t[reps / 2];
        }
    }
    K->free_ (be, dx);
    K->free_ (be, dout);
    K->free_ (be, dw);
    K->free_ (be, dids);
    free (x);
    free (w);
    free (ids);
    C->destroy (comm);
    K->destroy (be);
    if (rank == 0) sh->ok = 1;
    return 0;
}

int main (int argc, char **argv)
{
    int P = 2, NE = 16, k = 4, E = 1024, reps = 50, opt;
    while ((opt = getopt (argc, argv, "n:e:k:d:r:h")) != -1) {
        switch (opt) {
        case 'n': P = atoi (optarg); break;
        case 'e': NE = atoi (optarg); break;
        case 'k': k = atoi (optarg); break;
        case 'd': E = atoi (optarg); break;
        case 'r': reps = atoi (optarg); break;
        default:
            fprintf (stderr, "usage: %s [-n RANKS] [-e EXPERTS] [-k TOPK] [-d N_EMBD] [-r REPEATS]\n", argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (P < 2 || P > 16 || NE < P || k < 1 || k > NE || E < 1 || reps < 1 || reps > MAX_REP) {
        fprintf (stderr, "moe-bench: need 2 <= ranks <= 16, ranks <= experts, 1 <= topk <= experts, 1 <= repeats <= %d\n",
                 MAX_REP);
        return 2;
    }
    const char *dir = getenv ("RX_PLUGIN_BUILD_DIR");
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (dir && *dir ? dir : "_plugins", &err);
    if (!l) {
        fprintf (stderr, "moe-bench: %s\n", err.msg);
        return 1;
    }
    struct shared *sh = mmap (NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    memset (sh, 0, sizeof *sh);
    char group[64];
    snprintf (group, sizeof group, "moebench%d", (int) getpid ());
    pid_t pids[16];
    for (int r = 0; r < P; r++) {
        if ((pids[r] = fork ()) == 0) _exit (s_rank (l, group, r, P, NE, k, E, reps, sh));
        if (pids[r] < 0) return 1;
    }
    int bad = 0;
    for (int r = 0; r < P; r++) {
        int st = 0;
        waitpid (pids[r], &st, 0);
        bad |= !WIFEXITED (st) || WEXITSTATUS (st) != 0;
    }
    rx_loader_destroy (&l);
    if (bad || !sh->ok) {
        fprintf (stderr, "moe-bench: a rank failed\n");
        return 1;
    }
    printf ("dispatch + combine, %d ranks on comm-shm, %d experts, top-%d, n_embd %d, median of %d (us)\n",
            P, NE, k, E, reps);
    printf ("%-10s", "tok/rank");
    for (int m = 0; m < N_MODES; m++) printf (" %10s", s_mode_name[m]);
    printf ("\n");
    for (int s = 0; s < N_SIZES; s++) {
        printf ("%-10d", s_sizes[s]);
        for (int m = 0; m < N_MODES; m++) printf (" %10.1f", sh->t[s][m] * 1e6);
        printf ("\n");
    }
    return 0;
}
