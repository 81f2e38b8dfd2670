/* tests/unit/test_moe_ep.c -- the expert-parallel MoE dispatchers
 * (moe-ep_normal, moe-ep_low_latency, moe-ep_auto; radix/moe.h) between
 * forked ranks on comm-shm, on kernels-cpu, loaded through the real loader.
 *
 * Every rank regenerates every rank's tokens and routing from a seed, so it
 * can check its routed rows against a naive grouping (expert e's rows are
 * rank 0's (token, choice) pairs choosing e, then rank 1's, ..).  The test
 * plays the experts (y = x (e + 1) + 0.25 e) between dispatch and combine,
 * and each rank's combine output must equal, bitwise, what `local` (ep_size
 * 1, all experts on the rank) gives for the same tokens: random routings,
 * every token's first choice on one expert, a rank with 0 tokens, every
 * rank with 0 tokens, batches of one token, full batches, = and +=, and
 * n_tok > max_tokens (RX_ERANGE on every rank, after which the group still
 * works: no collective was entered).  ep_size 2 and 4 (4 with 6 experts:
 * uneven shards), ep_size 1 without a comm, ep_auto switching modes on the
 * group's largest batch, bad configs, no /dev/shm segment left behind.
 *
 * ep_low_latency's device path (RX_MOE_ROUTED_DEVICE: sort, pack, unpack
 * and combine on the device): the same routed rows and bit for bit the
 * same outputs as its host path, for 2 and 3 ranks, idle ranks, uneven
 * batches and multi-row headers; ep_normal / ep_auto ignore the flag; and
 * a whole dispatch + matmul_grouped + combine captured as a graph on
 * kernels-cpu ([kernels.cpu] graphs) replays with new routing each launch,
 * equal to an eager host-path run. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/kernel.h>
#include <radix/moe.h>

#include "conf.h"
#include "loader.h"
#include "../testutil.h"

/* ---- harness ------------------------------------------------------------- */

struct env {
    rx_loader_t *l;
    rx_conf_t *conf;
    const struct rx_kernels_ops *K;
    const struct rx_host *kh;
    const struct rx_comm_ops *C;
    const struct rx_host *ch;
    const struct rx_moe_ops *L, *M;     /* local, the dispatcher under test */
    const struct rx_host *lh, *mh;
    const char *name;
    char group[64];
};

static int s_group_no;

static void s_load (struct env *e, const char *name, const char *ini)
{
    struct rx_err err = { 0 };
    memset (e, 0, sizeof *e);
    e->name = name;
    e->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (e->l, "%s", err.msg);
    if (ini) {
        e->conf = rx_conf_parse_string (ini, strlen (ini), "moe-ep-test.ini", &err);
        cr_assert_not_null (e->conf, "%s", err.msg);
    }
    rx_plugin_t *kp, *cp, *lp, *mp;
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_KERNELS, "cpu", &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (kp, e->conf, &err), RX_OK, "%s", err.msg);   /* [kernels.cpu] graphs */
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_COMM, "shm", &cp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (cp, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_MOE, "local", &lp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (lp, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_MOE, name, &mp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (mp, e->conf, &err), RX_OK, "%s", err.msg);
    e->K = rx_plugin_ops (kp);
    e->kh = rx_plugin_host (kp);
    e->C = rx_plugin_ops (cp);
    e->ch = rx_plugin_host (cp);
    e->L = rx_plugin_ops (lp);
    e->lh = rx_plugin_host (lp);
    e->M = rx_plugin_ops (mp);
    e->mh = rx_plugin_host (mp);
    snprintf (e->group, sizeof e->group, "moeep%d-%d", (int) getpid (), ++s_group_no);
}

static void s_close (struct env *e)
{
    char path[128];
    snprintf (path, sizeof path, "/dev/shm/radix-%s", e->group);
    cr_assert_neq (access (path, F_OK), 0, "%s was left behind", path);
    rx_conf_destroy (&e->conf);
    rx_loader_destroy (&e->l);
}

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf (stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);     \
            fprintf (stderr, __VA_ARGS__);                                      \
            fputc ('\n', stderr);                                               \
            return 1;                                                           \
        }                                                                       \
    } while (0)

#define CHECK_OK(call) \
    do { int rc_ = (call); CHECK (rc_ == RX_OK, "%s -> %d: %s", #call, rc_, err.msg); } while (0)

/* ---- deterministic data -------------------------------------------------- */

static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

enum { R_RANDOM = 0, R_SKEW = 1 };

/* Rank q's tokens of one round: x [n][ldx], ids/w [n][k] (distinct ids,
 * positive weights summing to 1).  R_SKEW: every first choice is the last
 * expert (on the last rank). */
static void s_gen (uint64_t seed, int q, int n, int NE, int k, size_t ldx, int kind, float *x,
                   int32_t *ids, float *w)
{
    uint64_t s = s_mix (seed * 7919u + (uint64_t) q);
    for (size_t i = 0; i < (size_t) n * ldx; i++)
        x[i] = (float) ((int) (s_mix (s + i) % 2001) - 1000) / 500.0f;
    for (int t = 0; t < n; t++) {
        float sum = 0;
        for (int j = 0; j < k; j++) {
            int32_t id;
            int dup;
            uint64_t salt = 0;
            do {
                id = (kind == R_SKEW && j == 0) ? NE - 1
                     : (int32_t) (s_mix (s ^ ((uint64_t) (t * 64 + j) << 20) ^ (salt++ << 40)) % (uint64_t) NE);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == id;
            } while (dup);
            ids[t * k + j] = id;
            w[t * k + j] = 0.05f + (float) (s_mix (s + 977u * (uint64_t) (t * k + j)) % 1000) / 1000.0f;
            sum += w[t * k + j];
        }
        for (int j = 0; j < k; j++) w[t * k + j] /= sum;
    }
}

static float s_expert (int e, float x) { return x * (float) (e + 1) + 0.25f * (float) e; }

/* ---- one rank ------------------------------------------------------------ */

struct scen {
    int NE, k, E, T;         /* experts, choices, width, max_tokens */
    int P;
    int check_auto_modes;    /* ep_auto with decode_max_tokens 4 */
};

/* Tokens of rank r in round i (-1: the ERANGE round); kind in *kind. */
#define N_ROUNDS 10
static int s_ntok (const struct scen *sc, int round, int r, int *kind, int *acc)
{
    *kind = R_RANDOM;
    *acc = round % 2;
    switch (round) {
    case 0: return 5 + 3 * r > sc->T ? sc->T : 5 + 3 * r;
    case 1: return r == 1 ? 0 : sc->T;               /* one rank idle */
    case 2: *kind = R_SKEW; return 7;
    case 3: return 1;                                 /* decode-like */
    case 4: return 0;                                 /* every rank idle */
    case 5: return -1;                                /* n_tok > max_tokens */
    case 6: return sc->T;
    case 7: return r == 0 ? 3 : r == 1 ? 4 : 2;       /* group max 4 */
    case 8: return r == 0 ? 2 : 10;                   /* group max 10 */
    case 9: *kind = R_SKEW; return r % 2 ? 1 : 0;
    }
    return 0;
}

struct buf {
    float *x, *w, *out0, *host_out, *ref_out, *rows;
    int32_t *ids;
    float *dx, *dw, *dout;
    int32_t *dids;
};

/* dispatch + play experts + combine on one dispatcher, into b->ref_out
 * (M = local) or b->host_out (r_out given: the routed description, and the
 * routed rows in b->rows for the caller to check).  0 or 1. */
static int s_run_one (const struct env *e, void *be, const struct rx_moe_ops *M, void *moe, int rank,
                      const struct scen *sc, int n, size_t ldx, size_t ldo, int acc, struct buf *b,
                      struct rx_moe_routed *r_out)
{
    struct rx_err err = { 0 };
    const struct rx_kernels_ops *K = e->K;
    const size_t E = (size_t) sc->E;
    struct rx_moe_routed r = { .struct_size = sizeof r };
    CHECK_OK (M->dispatch (moe, b->dx, ldx, n, b->dids, b->dw, &r, &err));
    CHECK (r.offsets[0] == 0 && r.offsets[r.n_local_expert] == r.n_rows, "offsets 0 .. %d, n_rows %d",
           r.offsets[r.n_local_expert], r.n_rows);
    for (int ex = 0; ex < r.n_local_expert; ex++)
        CHECK (r.offsets[ex] <= r.offsets[ex + 1], "offsets decrease at %d", ex);
    const size_t nr = (size_t) (r.n_rows ? r.n_rows : 1);
    float *rows = malloc (nr * E * sizeof *rows), *ys = malloc (nr * E * sizeof *ys);
    if (r.n_rows) {
        CHECK_OK (K->copy_d2h (be, NULL, rows, r.x, (size_t) r.n_rows * E * sizeof *rows, &err));
        CHECK_OK (K->synchronize (be, NULL, &err));
    }
    for (int ex = 0; ex < r.n_local_expert; ex++)
        for (int row = r.offsets[ex]; row < r.offsets[ex + 1]; row++)
            for (size_t c = 0; c < E; c++)
                ys[(size_t) row * E + c] = s_expert (r.first_expert + ex, rows[(size_t) row * E + c]);
    if (r.n_rows)
        CHECK_OK (K->copy_h2d (be, NULL, r.y, ys, (size_t) r.n_rows * E * sizeof *ys, &err));
    free (ys);
    if (r_out) {
        *r_out = r;
        b->rows = rows;
    } else {
        free (rows);
    }
    if (n) CHECK_OK (K->copy_h2d (be, NULL, b->dout, b->out0, (size_t) n * ldo * sizeof (float), &err));
    CHECK_OK (M->combine (moe, n ? b->dout : NULL, ldo, acc ? RX_MM_ACCUMULATE : 0, &err));
    if (n) {
        CHECK_OK (K->copy_d2h (be, NULL, r_out ? b->host_out : b->ref_out, b->dout,
                               (size_t) n * ldo * sizeof (float), &err));
        CHECK_OK (K->synchronize (be, NULL, &err));
    }
    return 0;
}

static int s_rank (const struct env *e, int rank, const struct scen *sc)
{
    struct rx_err err = { 0 };
    const struct rx_kernels_ops *K = e->K;
    void *be = NULL, *comm = NULL, *loc = NULL, *moe = NULL;
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
    CHECK_OK (K->create (e->kh, &kp, &be, &err));
    if (sc->P > 1) {
        struct rx_comm_params cp = { .struct_size = sizeof cp, .rank = rank, .n_rank = sc->P,
                                     .group = e->group, .timeout_s = 20, .kops = K, .kbe = be };
        CHECK_OK (e->C->create (e->ch, &cp, &comm, &err));
    }
    struct rx_moe_config lc = {
        .struct_size = sizeof lc, .n_expert = sc->NE, .n_expert_used = sc->k, .n_embd = sc->E,
        .max_tokens = sc->T, .ep_rank = 0, .ep_size = 1, .kops = K, .kbe = be,
    };
    CHECK_OK (e->L->create (e->lh, &lc, &loc, &err));
    struct rx_moe_config mc = lc;
    mc.ep_rank = rank;
    mc.ep_size = sc->P;
    mc.comm = sc->P > 1 ? e->C : NULL;
    mc.comm_inst = comm;
    CHECK_OK (e->M->create (e->mh, &mc, &moe, &err));

    const int NE = sc->NE, k = sc->k, P = sc->P;
    const size_t E = (size_t) sc->E, ldx = E + 5, ldo = E + 3, T = (size_t) sc->T + 1;
    /* every rank's data of a round, regenerated here */
    float *ax = malloc ((size_t) P * T * ldx * sizeof (float)), *aw = malloc ((size_t) P * T * k * sizeof (float));
    int32_t *aids = malloc ((size_t) P * T * k * sizeof (int32_t));
    struct buf b = { 0 };
    b.out0 = malloc (T * ldo * sizeof (float));
    b.host_out = malloc (T * ldo * sizeof (float));
    b.ref_out = malloc (T * ldo * sizeof (float));
    CHECK_OK (K->alloc (be, T * ldx * sizeof (float), 0, (void **) &b.dx, &err));
    CHECK_OK (K->alloc (be, T * k * sizeof (float), 0, (void **) &b.dw, &err));
    CHECK_OK (K->alloc (be, T * k * sizeof (int32_t), 0, (void **) &b.dids, &err));
    CHECK_OK (K->alloc (be, T * ldo * sizeof (float), 0, (void **) &b.dout, &err));
    const float *ll_x = NULL;

    for (int round = 0; round < N_ROUNDS; round++) {
        int kind = R_RANDOM, acc = 0, ns[16];
        for (int q = 0; q < P; q++) {
            ns[q] = s_ntok (sc, round, q, &kind, &acc);
            if (ns[q] < 0) ns[q] = sc->T + 1;
            s_gen (1000 + (uint64_t) round, q, ns[q], NE, k, ldx, kind, ax + (size_t) q * T * ldx,
                   aids + (size_t) q * T * k, aw + (size_t) q * T * k);
        }
        const int n = ns[rank];
        const float *x = ax + (size_t) rank * T * ldx, *w = aw + (size_t) rank * T * k;
        const int32_t *ids = aids + (size_t) rank * T * k;
        if (n) {
            CHECK_OK (K->copy_h2d (be, NULL, b.dx, x, (size_t) n * ldx * sizeof (float), &err));
            CHECK_OK (K->copy_h2d (be, NULL, b.dw, w, (size_t) n * k * sizeof (float), &err));
            CHECK_OK (K->copy_h2d (be, NULL, b.dids, ids, (size_t) n * k * sizeof (int32_t), &err));
        }
        if (round == 5) {   /* too many tokens: RX_ERANGE on every rank, nothing entered */
            struct rx_moe_routed r = { .struct_size = sizeof r };
            err = (struct rx_err) { 0 };
            int rc = e->M->dispatch (moe, b.dx, ldx, n, b.dids, b.dw, &r, &err);
            CHECK (rc == RX_ERANGE, "dispatch of %d tokens -> %d, want RX_ERANGE", n, rc);
            CHECK (strstr (err.msg, "max_tokens"), "%s", err.msg);
            CHECK (e->M->combine (moe, b.dout, ldo, 0, &err) == RX_EINVAL, "combine after a failed dispatch");
            continue;
        }
        for (size_t i = 0; i < (size_t) n * ldo; i++) b.out0[i] = (float) i * 0.001f - 3.0f;
        /* the reference: local on this rank's tokens */
        if (s_run_one (e, be, e->L, loc, rank, sc, n, ldx, ldo, acc, &b, NULL)) return 1;
        struct rx_moe_routed r;
        if (s_run_one (e, be, e->M, moe, rank, sc, n, ldx, ldo, acc, &b, &r)) return 1;
        /* the grouping: my experts' rows, rank by rank, in (token, choice) order */
        const int first = (int) ((int64_t) rank * NE / P), nl = (int) ((int64_t) (rank + 1) * NE / P) - first;
        CHECK (r.first_expert == first && r.n_local_expert == nl, "round %d: experts %d + %d, want %d + %d",
               round, r.first_expert, r.n_local_expert, first, nl);
        int row = 0;
        for (int ex = first; ex < first + nl; ex++)
            for (int q = 0; q < P; q++)
                for (int t = 0; t < ns[q]; t++)
                    for (int j = 0; j < k; j++) {
                        if (aids[(size_t) q * T * k + (size_t) t * k + j] != ex) continue;
                        CHECK (row < r.n_rows, "round %d: too few rows (%d)", round, r.n_rows);
                        CHECK (memcmp (b.rows + (size_t) row * E, ax + (size_t) q * T * ldx + (size_t) t * ldx,
                                       E * sizeof (float)) == 0,
                               "round %d: routed row %d (expert %d) is not rank %d's token %d", round, row, ex, q, t);
                        row++;
                    }
        CHECK (row == r.n_rows, "round %d: %d routed rows, want %d", round, r.n_rows, row);
        free (b.rows);
        b.rows = NULL;
        if (n)
            CHECK (memcmp (b.host_out, b.ref_out, (size_t) n * ldo * sizeof (float)) == 0,
                   "round %d: combine differs from local's (n_tok %d)", round, n);
        if (sc->check_auto_modes) {
            /* decode_max_tokens 4: rounds 3 and 7 (group max <= 4) share the
             * low-latency buffers; round 8 (group max 10) is normal. */
            if (round == 3) ll_x = r.x;
            if (round == 7) CHECK (r.x == ll_x, "round 7 (group max 4) did not use the low-latency buffers");
            if (round == 8) CHECK (r.x != ll_x, "round 8 (group max 10) used the low-latency buffers");
        }
    }
    K->free_ (be, b.dx);
    K->free_ (be, b.dw);
    K->free_ (be, b.dids);
    K->free_ (be, b.dout);
    free (ax); free (aw); free (aids); free (b.out0); free (b.host_out); free (b.ref_out);
    e->M->destroy (moe);
    e->L->destroy (loc);
    if (comm) e->C->destroy (comm);
    K->destroy (be);
    return 0;
}

static void s_run (const char *name, const char *ini, struct scen sc)
{
    struct env e;
    s_load (&e, name, ini);
    if (sc.P == 1) {
        cr_assert_eq (s_rank (&e, 0, &sc), 0, "see stderr");
    } else {
        pid_t pids[16];
        for (int r = 0; r < sc.P; r++) {
            pids[r] = fork ();
            cr_assert_geq (pids[r], 0);
            if (pids[r] == 0) {
                alarm (60);
                _exit (s_rank (&e, r, &sc));
            }
        }
        for (int r = 0; r < sc.P; r++) {
            int st = 0;
            cr_assert_eq (waitpid (pids[r], &st, 0), pids[r]);
            cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "%s: rank %d of %d failed (status 0x%x; see stderr)",
                       name, r, sc.P, st);
        }
    }
    s_close (&e);
}

#define SC2 ((struct scen) { .NE = 8, .k = 3, .E = 24, .T = 12, .P = 2 })
#define SC4 ((struct scen) { .NE = 6, .k = 2, .E = 20, .T = 12, .P = 4 })
#define SC1 ((struct scen) { .NE = 5, .k = 2, .E = 16, .T = 12, .P = 1 })

Test (moe_ep, normal_matches_local_2_ranks) { s_run ("ep_normal", NULL, SC2); }
Test (moe_ep, normal_matches_local_4_ranks) { s_run ("ep_normal", NULL, SC4); }
Test (moe_ep, low_latency_matches_local_2_ranks) { s_run ("ep_low_latency", NULL, SC2); }
Test (moe_ep, low_latency_matches_local_4_ranks) { s_run ("ep_low_latency", NULL, SC4); }
Test (moe_ep, auto_matches_local_2_ranks) { s_run ("ep_auto", NULL, SC2); }
Test (moe_ep, auto_switches_modes_on_group_max_4_ranks)
{
    struct scen sc = SC4;
    sc.check_auto_modes = 1;
    s_run ("ep_auto", "[moe.ep_auto]\ndecode_max_tokens = 4\n", sc);
}
Test (moe_ep, auto_switches_modes_on_group_max_2_ranks)
{
    struct scen sc = SC2;
    sc.check_auto_modes = 1;
    s_run ("ep_auto", "[moe.ep_auto]\ndecode_max_tokens = 4\n", sc);
}
Test (moe_ep, one_rank_needs_no_comm)
{
    s_run ("ep_normal", NULL, SC1);
    s_run ("ep_low_latency", NULL, SC1);
    s_run ("ep_auto", NULL, SC1);
}
Test (moe_ep, skewed_k1_all_to_one_expert)
{
    /* k = 1 and round 2's skew: every token of every rank to the last expert */
    struct scen sc = { .NE = 4, .k = 1, .E = 8, .T = 12, .P = 2 };
    s_run ("ep_normal", NULL, sc);
    s_run ("ep_low_latency", NULL, sc);
}

Test (moe_ep, bad_configs)
{
    const char *names[] = { "ep_normal", "ep_low_latency", "ep_auto" };
    for (int i = 0; i < 3; i++) {
        struct env e;
        s_load (&e, names[i], NULL);
        struct rx_err err = { 0 };
        void *be, *moe = (void *) 1;
        struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
        cr_assert_eq (e.K->create (e.kh, &kp, &be, &err), RX_OK, "%s", err.msg);
        struct rx_moe_config c0 = {
            .struct_size = sizeof c0, .n_expert = 4, .n_expert_used = 2, .n_embd = 8, .max_tokens = 4,
            .ep_rank = 0, .ep_size = 2, .kops = e.K, .kbe = be,
        }, c = c0;
        err = (struct rx_err) { 0 };
        cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EINVAL, "%s", names[i]);
        cr_assert (strstr (err.msg, "needs") && strstr (err.msg, "comm"), "%s", err.msg);
        cr_assert_null (moe);
        c.comm = e.C;
        c.comm_inst = (void *) 1;   /* never called: the config is refused first */
        struct { int rank, size, ne; } bad[] = { { 2, 2, 4 }, { -1, 2, 4 }, { 0, 0, 4 }, { 0, 5, 4 } };
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
            c.ep_rank = bad[j].rank;
            c.ep_size = bad[j].size;
            c.n_expert = bad[j].ne;
            err = (struct rx_err) { 0 };
            cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EINVAL, "%s case %zu", names[i], j);
            cr_assert (strstr (err.msg, "ep_rank"), "%s", err.msg);
        }
        c = c0;
        c.n_expert_used = 5;
        cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "bad config"), "%s", err.msg);
        c = c0;
        c.struct_size = 8;
        cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EABI);
        c = c0;
        c.kops = NULL;
        cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EINVAL);
        cr_assert_eq (e.M->create (e.mh, NULL, &moe, &err), RX_EINVAL);
        /* too big for memory: a clean error from the backend's alloc */
        c = c0;
        c.ep_size = 1;
        c.n_expert_used = 4;
        c.n_embd = 1 << 20;
        c.max_tokens = 1 << 24;
        err = (struct rx_err) { 0 };
        cr_assert_neq (e.M->create (e.mh, &c, &moe, &err), RX_OK);
        cr_assert_null (moe);
        cr_assert (err.msg[0]);
        /* bad dispatch / combine on a working one-rank instance */
        c = c0;
        c.ep_size = 1;
        cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
        struct rx_moe_routed r = { .struct_size = sizeof r };
        float *dx;
        int32_t *dids;
        cr_assert_eq (e.K->alloc (be, 64 * sizeof (float), 0, (void **) &dx, &err), RX_OK);
        cr_assert_eq (e.K->alloc (be, 8 * sizeof (int32_t), 0, (void **) &dids, &err), RX_OK);
        int32_t bad_ids[4] = { 0, 1, 4, 0 };
        float wv[4] = { 0.5f, 0.5f, 0.5f, 0.5f };
        cr_assert_eq (e.K->copy_h2d (be, NULL, dids, bad_ids, sizeof bad_ids, &err), RX_OK);
        cr_assert_eq (e.K->copy_h2d (be, NULL, dx + 32, wv, sizeof wv, &err), RX_OK);
        cr_assert_eq (e.M->combine (moe, dx, 8, 0, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "without a successful dispatch"), "%s", err.msg);
        cr_assert_eq (e.M->dispatch (moe, dx, 8, 5, dids, dx + 32, &r, &err), RX_ERANGE);
        cr_assert_eq (e.M->dispatch (moe, dx, 8, -1, dids, dx + 32, &r, &err), RX_EINVAL);
        cr_assert_eq (e.M->dispatch (moe, dx, 7, 2, dids, dx + 32, &r, &err), RX_EINVAL);
        cr_assert_eq (e.M->dispatch (moe, NULL, 8, 2, dids, dx + 32, &r, &err), RX_EINVAL);
        err = (struct rx_err) { 0 };
        cr_assert_eq (e.M->dispatch (moe, dx, 8, 2, dids, dx + 32, &r, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "expert id 4"), "%s", err.msg);
        struct rx_moe_routed rs = { .struct_size = 8 };
        cr_assert_eq (e.M->dispatch (moe, dx, 8, 1, dids, dx + 32, &rs, &err), RX_EABI);
        cr_assert_eq (e.M->dispatch (moe, dx, 8, 1, dids, dx + 32, &r, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (e.M->combine (moe, dx + 40, 4, 0, &err), RX_EINVAL);
        cr_assert_eq (e.M->dispatch (moe, dx, 8, 1, dids, dx + 32, &r, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (e.M->combine (moe, dx + 40, 8, 0x10, &err), RX_EINVAL);
        cr_assert_eq (e.M->dispatch (moe, dx, 8, 1, dids, dx + 32, &r, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (e.M->combine (moe, dx + 40, 8, 0, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (e.M->combine (moe, dx + 40, 8, 0, &err), RX_EINVAL);
        e.K->free_ (be, dx);
        e.K->free_ (be, dids);
        e.M->destroy (moe);
        e.M->destroy (NULL);
        e.K->destroy (be);
        s_close (&e);
    }
}

/* ---- the low-latency device path ----------------------------------------- */

struct dscen {
    int NE, k, E, T, P;
    int hint;                   /* s_graph_rank: routed.group_max_tok of every dispatch (0: none) */
};

/* Tokens of rank r in device-path round i: uneven, idle ranks, full. */
#define N_DEV_ROUNDS 6
static int s_dev_ntok (const struct dscen *sc, int round, int r)
{
    switch (round) {
    case 0: return (int[]) { 5, 3, 7 }[r % 3] > sc->T ? sc->T : (int[]) { 5, 3, 7 }[r % 3];
    case 1: return r == 0 ? 0 : sc->T;                 /* rank 0 idle */
    case 2: return sc->T;
    case 3: return r == 1 ? 1 : 0;                     /* decode of one token */
    case 4: return 0;                                  /* every rank idle */
    default: return 1 + r;
    }
}

/* The fake experts: routed rows of local expert e (host offsets off) are
 * scaled by (global id + 1) into y. */
static int s_play_scale (const struct rx_kernels_ops *K, void *be, int rank, const struct rx_moe_routed *r,
                         const int32_t *off, size_t E)
{
    struct rx_err err = { 0 };
    for (int e = 0; e < r->n_local_expert; e++) {
        size_t lo = (size_t) off[e], rows = (size_t) (off[e + 1] - off[e]);
        if (rows)
            CHECK_OK (K->scale (be, NULL, r->x + lo * E, E, r->y + lo * E, E, rows, E,
                                (float) (r->first_expert + e + 1), &err));
    }
    return 0;
}

static const int32_t s_sentinel_off[1] = { -12345 };

/* One rank: for every round, dispatch with flags 0 and with
 * RX_MOE_ROUTED_DEVICE on the same inputs; the device path (ep_low_latency
 * only) must route the same rows and give the same outputs bit for bit. */
static int s_dev_rank (const struct env *e, int rank, const struct dscen *sc)
{
    struct rx_err err = { 0 };
    const struct rx_kernels_ops *K = e->K;
    void *be = NULL, *comm = NULL, *moe = NULL;
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
    CHECK_OK (K->create (e->kh, &kp, &be, &err));
    const int P = sc->P, k = sc->k, NE = sc->NE;
    if (P > 1) {
        struct rx_comm_params cp = { .struct_size = sizeof cp, .rank = rank, .n_rank = P,
                                     .group = e->group, .timeout_s = 20, .kops = K, .kbe = be };
        CHECK_OK (e->C->create (e->ch, &cp, &comm, &err));
    }
    struct rx_moe_config mc = {
        .struct_size = sizeof mc, .n_expert = NE, .n_expert_used = k, .n_embd = sc->E, .max_tokens = sc->T,
        .ep_rank = rank, .ep_size = P, .kops = K, .kbe = be, .comm = P > 1 ? e->C : NULL, .comm_inst = comm,
    };
    CHECK_OK (e->M->create (e->mh, &mc, &moe, &err));
    const int ll = strcmp (e->name, "ep_low_latency") == 0;
    const size_t E = (size_t) sc->E, ldx = E + 2, ldo = E + 1, T = (size_t) sc->T;
    const size_t max_rows = (size_t) P * T * (size_t) k;
    float *x = malloc (T * ldx * sizeof (float)), *w = malloc (T * k * sizeof (float));
    float *out0 = malloc (T * ldo * sizeof (float)), *hout = malloc (T * ldo * sizeof (float));
    float *dvout = malloc (T * ldo * sizeof (float)), *hrows = malloc (max_rows * E * sizeof (float));
    float *drows = malloc (max_rows * E * sizeof (float));
    int32_t *ids = malloc (T * k * sizeof (int32_t)), *hoff = malloc ((size_t) (NE + 1) * sizeof (int32_t));
    int32_t *doff = malloc ((size_t) (NE + 1) * sizeof (int32_t));
    float *dx, *dw, *dout;
    int32_t *dids;
    CHECK_OK (K->alloc (be, T * ldx * sizeof (float), 0, (void **) &dx, &err));
    CHECK_OK (K->alloc (be, T * k * sizeof (float), 0, (void **) &dw, &err));
    CHECK_OK (K->alloc (be, T * k * sizeof (int32_t), 0, (void **) &dids, &err));
    CHECK_OK (K->alloc (be, T * ldo * sizeof (float), 0, (void **) &dout, &err));
    for (int round = 0; round < N_DEV_ROUNDS; round++) {
        const int n = s_dev_ntok (sc, round, rank), acc = round % 2;
        s_gen (5000 + (uint64_t) round, rank, n, NE, k, ldx, R_RANDOM, x, ids, w);
        if (n) {
            CHECK_OK (K->copy_h2d (be, NULL, dx, x, (size_t) n * ldx * sizeof (float), &err));
            CHECK_OK (K->copy_h2d (be, NULL, dw, w, (size_t) n * k * sizeof (float), &err));
            CHECK_OK (K->copy_h2d (be, NULL, dids, ids, (size_t) n * k * sizeof (int32_t), &err));
        }
        for (size_t i = 0; i < (size_t) n * ldo; i++) out0[i] = (float) i * 0.01f - 1.0f;
        float *res[2] = { hout, dvout };
        int nl = 0;
        for (int dev = 0; dev < 2; dev++) {
            struct rx_moe_routed r = { .struct_size = sizeof r, .flags = dev ? RX_MOE_ROUTED_DEVICE : 0,
                                       .d_offsets = s_sentinel_off };
            CHECK_OK (e->M->dispatch (moe, dx, ldx, n, dids, dw, &r, &err));
            nl = r.n_local_expert;
            const int32_t *off;
            if (dev && ll) {
                CHECK (!r.offsets && r.d_offsets && r.d_offsets != s_sentinel_off,
                       "round %d: device path: offsets %p, d_offsets %p", round, (const void *) r.offsets,
                       (const void *) r.d_offsets);
                CHECK ((size_t) r.n_rows == max_rows, "round %d: n_rows %d, want the bound %zu", round, r.n_rows,
                       max_rows);
                /* test only: the device offsets to the host, the global
                 * view (d_offsets - first_expert: [NE + 1], zero-length
                 * ranges outside this rank's experts) */
                const int first = r.first_expert;
                CHECK_OK (K->copy_d2h (be, NULL, doff, r.d_offsets - first, (size_t) (NE + 1) * sizeof (int32_t),
                                       &err));
                CHECK_OK (K->synchronize (be, NULL, &err));
                for (int g = 0; g <= NE; g++) {
                    int32_t want = g < first ? 0 : g > first + nl ? hoff[nl] : hoff[g - first];
                    CHECK (doff[g] == want, "round %d: global device offsets[%d] = %d, want %d (host path, "
                           "first expert %d of %d)", round, g, doff[g], want, first, nl);
                }
                off = doff + first;
                CHECK_OK (K->copy_d2h (be, NULL, drows, r.x, max_rows * E * sizeof (float), &err));
                CHECK (memcmp (drows, hrows, (size_t) hoff[nl] * E * sizeof (float)) == 0,
                       "round %d: device routed rows differ from the host path's", round);
                for (size_t i = (size_t) hoff[nl] * E; i < max_rows * E; i++)
                    CHECK (drows[i] == 0.f, "round %d: unused routed row %zu is not zero", round, i / E);
            } else {
                CHECK (r.offsets && !r.d_offsets, "round %d (%s, flags %u): want host offsets and no d_offsets",
                       round, e->name, r.flags);
                CHECK (r.offsets[0] == 0 && r.offsets[nl] == r.n_rows, "round %d: offsets end %d, n_rows %d",
                       round, r.offsets[nl], r.n_rows);
                if (!dev) {
                    memcpy (hoff, r.offsets, (size_t) (nl + 1) * sizeof (int32_t));
                    if (r.n_rows)
                        CHECK_OK (K->copy_d2h (be, NULL, hrows, r.x, (size_t) r.n_rows * E * sizeof (float), &err));
                }
                off = r.offsets;
            }
            if (s_play_scale (K, be, rank, &r, off, E)) return 1;
            if (n) CHECK_OK (K->copy_h2d (be, NULL, dout, out0, (size_t) n * ldo * sizeof (float), &err));
            CHECK_OK (e->M->combine (moe, n ? dout : NULL, ldo, acc ? RX_MM_ACCUMULATE : 0, &err));
            if (n) CHECK_OK (K->copy_d2h (be, NULL, res[dev], dout, (size_t) n * ldo * sizeof (float), &err));
            CHECK_OK (K->synchronize (be, NULL, &err));
        }
        if (n)
            CHECK (memcmp (hout, dvout, (size_t) n * ldo * sizeof (float)) == 0,
                   "round %d (%s): the device path's combine differs from the host path's (n_tok %d)", round,
                   e->name, n);
        /* and the outputs are the experts' (not, say, all zeros): token
         * 0's first column against a direct sum */
        if (n) {
            float want = 0;
            for (int j = 0; j < k; j++) want += w[j] * (x[0] * (float) (ids[j] + 1));
            if (acc) want += out0[0];
            CHECK (hout[0] - want < 1e-4f && want - hout[0] < 1e-4f, "round %d: out[0][0] %g, want %g", round,
                   (double) hout[0], (double) want);
        }
    }
    K->free_ (be, dx);
    K->free_ (be, dw);
    K->free_ (be, dids);
    K->free_ (be, dout);
    free (x); free (w); free (out0); free (hout); free (dvout); free (hrows); free (drows);
    free (ids); free (hoff); free (doff);
    e->M->destroy (moe);
    if (comm) e->C->destroy (comm);
    K->destroy (be);
    return 0;
}

/* ---- the device path captured as a graph --------------------------------- */

#define S_GKEY 0x6ee1ull

/* Expert e's weight row o, column i (F32 [in E][out E] per expert). */
static float s_wval (int e, size_t o, size_t i) { return (float) ((int) ((e * 7 + o * 3 + i * 5) % 11) - 5) / 8.0f; }

static int s_graph_rank (const struct env *e, int rank, const struct dscen *sc)
{
    struct rx_err err = { 0 };
    const struct rx_kernels_ops *K = e->K;
    void *be = NULL, *comm = NULL, *moe = NULL;
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
    CHECK_OK (K->create (e->kh, &kp, &be, &err));
    const int P = sc->P, k = sc->k, NE = sc->NE;
    if (P > 1) {
        struct rx_comm_params cp = { .struct_size = sizeof cp, .rank = rank, .n_rank = P,
                                     .group = e->group, .timeout_s = 20, .kops = K, .kbe = be };
        CHECK_OK (e->C->create (e->ch, &cp, &comm, &err));
        CHECK (e->C->graph_capturable && e->C->graph_capturable (comm) == 1, "comm-shm capturable");
    }
    struct rx_moe_config mc = {
        .struct_size = sizeof mc, .n_expert = NE, .n_expert_used = k, .n_embd = sc->E, .max_tokens = sc->T,
        .ep_rank = rank, .ep_size = P, .kops = K, .kbe = be, .comm = P > 1 ? e->C : NULL, .comm_inst = comm,
    };
    CHECK_OK (e->M->create (e->mh, &mc, &moe, &err));
    const size_t E = (size_t) sc->E, T = (size_t) sc->T;
    /* a weight of every expert, as the models load it: matmul_grouped then
     * takes the global view d_offsets - first_expert */
    const int first = (int) ((int64_t) rank * NE / P), nl = (int) ((int64_t) (rank + 1) * NE / P) - first;
    float *wd = malloc ((size_t) NE * E * E * sizeof (float));
    for (int ex = 0; ex < NE; ex++)
        for (size_t o = 0; o < E; o++)
            for (size_t i = 0; i < E; i++) wd[((size_t) ex * E + o) * E + i] = s_wval (ex, o, i);
    struct rx_weight_view v = { .name = "experts", .dtype = RX_F32, .n_dims = 3, .ne = { E, E, (uint64_t) NE, 1 },
                                .data = wd, .nbytes = (size_t) NE * E * E * sizeof (float) };
    rx_kweight_t *W = NULL;
    CHECK_OK (K->weight_load (be, &v, &W, &err));
    /* the same n_tok at every launch; with 3 ranks rank 1 is idle */
    const int n = P == 3 && rank == 1 ? 0 : 3 + 2 * rank > sc->T ? sc->T : 3 + 2 * rank;
    float *x = malloc (T * E * sizeof (float)), *w = malloc (T * k * sizeof (float));
    float *got = malloc (T * E * sizeof (float)), *prev = malloc (T * E * sizeof (float));
    float *ref = malloc (T * E * sizeof (float)), *sent = malloc (T * E * sizeof (float));
    int32_t *ids = malloc (T * k * sizeof (int32_t)), *goff = malloc ((size_t) (NE + 1) * sizeof (int32_t));
    for (size_t i = 0; i < T * E; i++) sent[i] = -777.f;
    float *dx, *dw, *dout;
    int32_t *dids, *doff;
    CHECK_OK (K->alloc (be, T * E * sizeof (float), 0, (void **) &dx, &err));
    CHECK_OK (K->alloc (be, T * k * sizeof (float), 0, (void **) &dw, &err));
    CHECK_OK (K->alloc (be, T * k * sizeof (int32_t), 0, (void **) &dids, &err));
    CHECK_OK (K->alloc (be, T * E * sizeof (float), 0, (void **) &dout, &err));
    CHECK_OK (K->alloc (be, (size_t) (NE + 1) * sizeof (int32_t), 0, (void **) &doff, &err));
    s_gen (7000, rank, n, NE, k, E, R_RANDOM, x, ids, w);
    if (n) {
        CHECK_OK (K->copy_h2d (be, NULL, dx, x, (size_t) n * E * sizeof (float), &err));
        CHECK_OK (K->copy_h2d (be, NULL, dw, w, (size_t) n * k * sizeof (float), &err));
        CHECK_OK (K->copy_h2d (be, NULL, dids, ids, (size_t) n * k * sizeof (int32_t), &err));
    }
    CHECK_OK (K->copy_h2d (be, NULL, dout, sent, T * E * sizeof (float), &err));

    /* capture: nothing runs (no host copy or synchronize may happen) */
    CHECK_OK (K->graph_begin (be, NULL, S_GKEY, &err));
    struct rx_moe_routed r = { .struct_size = sizeof r, .flags = RX_MOE_ROUTED_DEVICE,
                               .group_max_tok = sc->hint };
    CHECK_OK (e->M->dispatch (moe, dx, E, n, dids, dw, &r, &err));
    CHECK (!r.offsets && r.d_offsets && r.first_expert == first, "captured dispatch took the host path");
    CHECK_OK (K->matmul_grouped (be, NULL, W, r.d_offsets - r.first_expert, 0, r.x, E, r.y, E, (size_t) r.n_rows, 0,
                                 &err));
    CHECK_OK (e->M->combine (moe, n ? dout : NULL, E, 0, &err));
    CHECK_OK (K->graph_end (be, NULL, S_GKEY, &err));
    CHECK (K->graph_has (be, S_GKEY), "graph kept");
    CHECK_OK (K->copy_d2h (be, NULL, got, dout, T * E * sizeof (float), &err));
    CHECK (memcmp (got, sent, T * E * sizeof (float)) == 0, "out written during the capture");

    for (int l = 1; l <= 3; l++) {
        s_gen (7000 + (uint64_t) l, rank, n, NE, k, E, R_RANDOM, x, ids, w);
        if (n) {
            CHECK_OK (K->copy_h2d (be, NULL, dx, x, (size_t) n * E * sizeof (float), &err));
            CHECK_OK (K->copy_h2d (be, NULL, dw, w, (size_t) n * k * sizeof (float), &err));
            CHECK_OK (K->copy_h2d (be, NULL, dids, ids, (size_t) n * k * sizeof (int32_t), &err));
        }
        CHECK_OK (K->copy_h2d (be, NULL, dout, sent, T * E * sizeof (float), &err));
        CHECK_OK (K->graph_launch (be, NULL, S_GKEY, &err));
        if (comm) CHECK_OK (e->C->check (comm, &err));
        CHECK_OK (K->copy_d2h (be, NULL, got, dout, T * E * sizeof (float), &err));
        /* the reference: the host path, eager, same inputs and experts */
        struct rx_moe_routed h = { .struct_size = sizeof h, .group_max_tok = sc->hint };
        CHECK_OK (e->M->dispatch (moe, dx, E, n, dids, dw, &h, &err));
        CHECK (h.offsets, "flags 0 gave no host offsets");
        for (int g = 0; g <= NE; g++) goff[g] = g < first ? 0 : g > first + nl ? h.offsets[nl] : h.offsets[g - first];
        CHECK_OK (K->copy_h2d (be, NULL, doff, goff, (size_t) (NE + 1) * sizeof (int32_t), &err));
        if (h.n_rows)
            CHECK_OK (K->matmul_grouped (be, NULL, W, doff, 0, h.x, E, h.y, E, (size_t) h.n_rows, 0, &err));
        CHECK_OK (K->copy_h2d (be, NULL, dout, sent, T * E * sizeof (float), &err));
        CHECK_OK (e->M->combine (moe, n ? dout : NULL, E, 0, &err));
        CHECK_OK (K->copy_d2h (be, NULL, ref, dout, T * E * sizeof (float), &err));
        CHECK_OK (K->synchronize (be, NULL, &err));
        for (size_t i = 0; i < (size_t) n * E; i++)
            CHECK (got[i] == ref[i], "launch %d: out[%zu][%zu] = %.9g, eager host path %.9g", l, i / E, i % E,
                   (double) got[i], (double) ref[i]);
        for (size_t i = (size_t) n * E; i < T * E; i++)
            CHECK (got[i] == -777.f, "launch %d: out row %zu past n_tok written", l, i / E);
        if (n && l > 1)
            CHECK (memcmp (got, prev, (size_t) n * E * sizeof (float)) != 0, "launch %d: same output as launch %d",
                   l, l - 1);
        memcpy (prev, got, T * E * sizeof (float));
    }
    K->free_ (be, dx);
    K->free_ (be, dw);
    K->free_ (be, dids);
    K->free_ (be, dout);
    K->free_ (be, doff);
    K->weight_free (be, W);
    free (wd); free (x); free (w); free (got); free (prev); free (ref); free (sent); free (ids); free (goff);
    e->M->destroy (moe);
    if (comm) e->C->destroy (comm);
    K->destroy (be);
    return 0;
}

static void s_run_dev (const char *name, const char *ini, struct dscen sc, int graph)
{
    struct env e;
    s_load (&e, name, ini);
    pid_t pids[8];
    for (int r = 0; r < sc.P; r++) {
        pids[r] = fork ();
        cr_assert_geq (pids[r], 0);
        if (pids[r] == 0) {
            alarm (60);
            _exit (graph ? s_graph_rank (&e, r, &sc) : s_dev_rank (&e, r, &sc));
        }
    }
    for (int r = 0; r < sc.P; r++) {
        int st = 0;
        cr_assert_eq (waitpid (pids[r], &st, 0), pids[r]);
        cr_assert (WIFEXITED (st) && WEXITSTATUS (st) == 0, "%s: rank %d of %d failed (status 0x%x; see stderr)",
                   name, r, sc.P, st);
    }
    s_close (&e);
}

#define DSC2 ((struct dscen) { .NE = 8, .k = 3, .E = 16, .T = 6, .P = 2 })
#define DSC3 ((struct dscen) { .NE = 7, .k = 2, .E = 12, .T = 5, .P = 3 })
/* 20 experts per rank, rows of 8 floats: a header of 3 rows */
#define DSC_HDR ((struct dscen) { .NE = 40, .k = 4, .E = 8, .T = 5, .P = 2 })

Test (moe_ep, low_latency_device_path_equals_host_path_2_3_ranks)
{
    s_run_dev ("ep_low_latency", NULL, DSC2, 0);
    s_run_dev ("ep_low_latency", NULL, DSC3, 0);
    s_run_dev ("ep_low_latency", NULL, DSC_HDR, 0);
    s_run_dev ("ep_low_latency", NULL, (struct dscen) { .NE = 5, .k = 2, .E = 8, .T = 4, .P = 1 }, 0);
}

Test (moe_ep, normal_and_auto_ignore_the_device_flag)
{
    s_run_dev ("ep_normal", NULL, DSC2, 0);
    s_run_dev ("ep_auto", NULL, DSC3, 0);
}

/* ep_auto told the group's largest n_tok (moe.h group_max_tok, as the
 * models pass it under DP attention) picks low-latency without a vote, so
 * its decode dispatches take the device path and are captured; without
 * the hint they keep host offsets (above).  A hint below n_tok is refused
 * before any collective. */
Test (moe_ep, auto_with_group_max_tok_takes_the_device_path)
{
    const char *ini = "[kernels.cpu]\ngraphs = true\nthreads = 1\n";
    struct dscen a = DSC2, b = DSC3;
    a.hint = a.T;
    b.hint = b.T;
    s_run_dev ("ep_auto", ini, a, 1);
    s_run_dev ("ep_auto", ini, b, 1);
    struct env e;
    s_load (&e, "ep_auto", NULL);
    struct rx_err err = { 0 };
    void *be, *moe = NULL;
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
    cr_assert_eq (e.K->create (e.kh, &kp, &be, &err), RX_OK, "%s", err.msg);
    struct rx_moe_config c = { .struct_size = sizeof c, .n_expert = 4, .n_expert_used = 2, .n_embd = 8,
                               .max_tokens = 4, .ep_rank = 0, .ep_size = 1, .kops = e.K, .kbe = be };
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    struct rx_moe_routed r = { .struct_size = sizeof r, .flags = RX_MOE_ROUTED_DEVICE, .group_max_tok = 2 };
    float *dx, *dw;
    int32_t *dids;
    cr_assert_eq (e.K->alloc (be, 4 * 8 * sizeof (float), 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (e.K->alloc (be, 4 * 2 * sizeof (float), 0, (void **) &dw, &err), RX_OK);
    cr_assert_eq (e.K->alloc (be, 4 * 2 * sizeof (int32_t), 0, (void **) &dids, &err), RX_OK);
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 3, dids, dw, &r, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "group_max_tok 2 is below this rank's n_tok 3"), "%s", err.msg);
    e.K->free_ (be, dx);
    e.K->free_ (be, dw);
    e.K->free_ (be, dids);
    e.M->destroy (moe);
    e.K->destroy (be);
    s_close (&e);
}

Test (moe_ep, low_latency_device_path_graph_replays_2_3_ranks)
{
    const char *ini = "[kernels.cpu]\ngraphs = true\nthreads = 1\n";
    s_run_dev ("ep_low_latency", ini, DSC2, 1);
    s_run_dev ("ep_low_latency", ini, DSC3, 1);
    s_run_dev ("ep_low_latency", ini, DSC_HDR, 1);
}

/* Bad calls on the device path get the host path's errors (checked before
 * any device work or collective), and the asynchronous combine after a
 * device dispatch equals the blocking one.  One rank (no comm). */
Test (moe_ep, low_latency_device_path_bad_calls)
{
    struct env e;
    s_load (&e, "ep_low_latency", NULL);
    struct rx_err err = { 0 };
    void *be, *moe = NULL;
    struct rx_kernels_params kp = { .struct_size = sizeof kp, .threads = 1 };
    cr_assert_eq (e.K->create (e.kh, &kp, &be, &err), RX_OK, "%s", err.msg);
    enum { NE = 4, K_ = 2, E = 8, T = 3 };
    struct rx_moe_config c = { .struct_size = sizeof c, .n_expert = NE, .n_expert_used = K_, .n_embd = E,
                               .max_tokens = T, .ep_rank = 0, .ep_size = 1, .kops = e.K, .kbe = be };
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    float x[T * E], w[T * K_], out[2][T * E];
    int32_t ids[T * K_] = { 0, 3, 2, 1, 3, 0 };
    for (int i = 0; i < T * E; i++) x[i] = (float) (i % 13) - 6.f;
    for (int i = 0; i < T * K_; i++) w[i] = 0.25f + 0.125f * (float) i;
    float *dx, *dw, *dout;
    int32_t *dids;
    cr_assert_eq (e.K->alloc (be, sizeof x, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (e.K->alloc (be, sizeof w, 0, (void **) &dw, &err), RX_OK);
    cr_assert_eq (e.K->alloc (be, sizeof ids, 0, (void **) &dids, &err), RX_OK);
    cr_assert_eq (e.K->alloc (be, sizeof out[0], 0, (void **) &dout, &err), RX_OK);
    cr_assert_eq (e.K->copy_h2d (be, NULL, dx, x, sizeof x, &err), RX_OK);
    cr_assert_eq (e.K->copy_h2d (be, NULL, dw, w, sizeof w, &err), RX_OK);
    cr_assert_eq (e.K->copy_h2d (be, NULL, dids, ids, sizeof ids, &err), RX_OK);
    struct rx_moe_routed r = { .struct_size = sizeof r, .flags = RX_MOE_ROUTED_DEVICE };
    err = (struct rx_err) { 0 };
    cr_assert_eq (e.M->dispatch (moe, dx, E, T + 1, dids, dw, &r, &err), RX_ERANGE);
    cr_assert (strstr (err.msg, "max_tokens"), "%s", err.msg);
    cr_assert_eq (e.M->dispatch (moe, dx, E, 2, NULL, dw, &r, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "NULL x, ids or weights"), "%s", err.msg);
    cr_assert_eq (e.M->dispatch (moe, dx, E - 1, 2, dids, dw, &r, &err), RX_EINVAL);
    cr_assert_eq (e.M->combine (moe, dout, E, 0, &err), RX_EINVAL, "combine after failed dispatches");
    /* a device dispatch, then: dispatch_wait has nothing started, a bad
     * combine fails and consumes the dispatch */
    for (int round = 0; round < 2; round++) {
        cr_assert_eq (e.M->dispatch (moe, dx, E, T, dids, dw, &r, &err), RX_OK, "%s", err.msg);
        cr_assert (!r.offsets && r.d_offsets);
        cr_assert_eq (r.n_rows, T * K_);
        struct rx_moe_routed r2 = { .struct_size = sizeof r2 };
        cr_assert_eq (e.M->dispatch_wait (moe, &r2, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, "without a started dispatch"), "%s", err.msg);
        /* the dispatch is still there: experts = identity */
        cr_assert_eq (e.K->copy_d2d (be, NULL, r.y, r.x, (size_t) r.n_rows * E * sizeof (float), &err), RX_OK);
        if (round == 0) {
            cr_assert_eq (e.M->combine (moe, dout, E - 1, 0, &err), RX_EINVAL);
            cr_assert (strstr (err.msg, "ldo"), "%s", err.msg);
            cr_assert_eq (e.M->combine (moe, dout, E, 0, &err), RX_EINVAL, "the bad combine consumed it");
        } else {
            cr_assert_eq (e.M->combine (moe, dout, E, 0x10, &err), RX_EINVAL);
            cr_assert (strstr (err.msg, "flags"), "%s", err.msg);
        }
    }
    /* blocking vs started combine after a device dispatch: the same bits */
    for (int async = 0; async < 2; async++) {
        cr_assert_eq (e.M->dispatch (moe, dx, E, T, dids, dw, &r, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (e.K->scale (be, NULL, r.x, E, r.y, E, (size_t) r.n_rows, E, 3.f, &err), RX_OK);
        if (async) {
            cr_assert_eq (e.M->combine_start (moe, dout, E, 0, &err), RX_OK, "%s", err.msg);
            cr_assert_eq (e.M->combine_wait (moe, &err), RX_OK, "%s", err.msg);
        } else {
            cr_assert_eq (e.M->combine (moe, dout, E, 0, &err), RX_OK, "%s", err.msg);
        }
        cr_assert_eq (e.K->copy_d2h (be, NULL, out[async], dout, sizeof out[0], &err), RX_OK);
    }
    cr_assert (!memcmp (out[0], out[1], sizeof out[0]), "combine_start/wait after a device dispatch");
    for (int t = 0; t < T; t++) {   /* out = 3 x (w0 + w1): every expert the identity x 3 */
        float want = 3.f * x[t * E] * w[t * K_] + 3.f * x[t * E] * w[t * K_ + 1];
        cr_assert_float_eq (out[0][t * E], want, 1e-5, "token %d: %g, want %g", t, (double) out[0][t * E],
                            (double) want);
    }
    e.K->free_ (be, dx);
    e.K->free_ (be, dw);
    e.K->free_ (be, dids);
    e.K->free_ (be, dout);
    e.M->destroy (moe);
    e.K->destroy (be);
    s_close (&e);
}
