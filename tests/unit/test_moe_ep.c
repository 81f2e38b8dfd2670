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
 * group's largest batch, bad configs, no /dev/shm segment left behind. */
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
    cr_assert_eq (rx_plugin_init (kp, NULL, &err), RX_OK, "%s", err.msg);
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
