/* tests/unit/test_eplb.c -- the placement module (core/eplb.c) and the EPLB
 * algorithm plugins (eplb-deepseek.so, eplb-greedy.so, from
 * $RX_PLUGIN_BUILD_DIR):
 *   - properties on uniform-random and Zipf(1.2) loads over several shapes:
 *     every logical expert has a copy, copies sum to n_physical, each GPU's
 *     slots hold what logcnt / log2phy say, in the hierarchical case every
 *     group lives on one node and a node holds n_group / n_node groups, and
 *     the balancedness is at least the identity placement's (no redundancy,
 *     expert e in slot e: what a model loads without EPLB);
 *   - determinism; a hand-computed example per algorithm (values derived on
 *     paper from the algorithm's steps, written out below);
 *   - every bad precondition's message; bad load / placement files.
 *
 * Why identity, not "the same algorithm without redundancy": LPT packing
 * with equal-size packs is not monotone in the items.  Loads {4,7,9,6} on 2
 * GPUs: without redundancy deepseek packs {9,4} {7,6}, balancedness 1.0;
 * with 6 slots it copies 9 and 7 and reaches max 13.5 (13/13.5).  Against
 * the identity an adversarial order can also win ({6,8,5,9} is split
 * evenly by its order alone, and deepseek with 6 slots gets 14/14.5), so
 * the statement is tested on the loads the issue names (random and Zipf,
 * experts in random order), where it holds, and both counterexamples are
 * pinned as tests so that the docs stay honest. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <radix/eplb.h>

#include "eplb.h"
#include "loader.h"

#include "../testutil.h"

static rx_loader_t *s_loader (void)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (l, "%s", err.msg);
    return l;
}

static struct rx_eplb_problem s_prob (int32_t L, int32_t E, int32_t P, int32_t K, int32_t N, int32_t G,
                                      const double *load)
{
    return (struct rx_eplb_problem) { .struct_size = sizeof (struct rx_eplb_problem), .n_layer = L,
                                      .n_logical = E, .n_physical = P, .n_group = K, .n_node = N,
                                      .n_gpu = G, .load = load };
}

/* ------------------------------------------------------------ loads -- */

static uint64_t s_rng = 88172645463325252ull;
static double s_unif (void) /* xorshift64, [0, 1) */
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (double) (s_rng >> 11) / 9007199254740992.0;
}

/* kind 0: uniform integer loads 0..999; 1: Zipf(1.2) token counts over the
 * experts in a random order (rank r gets 1e5 / (r+1)^1.2). */
static double *s_loads (int kind, int32_t L, int32_t E)
{
    double *w = malloc ((size_t) L * E * sizeof *w);
    int32_t *perm = malloc ((size_t) E * sizeof *perm);
    for (int32_t l = 0; l < L; l++) {
        for (int32_t e = 0; e < E; e++) perm[e] = e;
        for (int32_t e = E - 1; e > 0; e--) {
            int32_t j = (int32_t) (s_unif () * (e + 1)), t = perm[e];
            perm[e] = perm[j];
            perm[j] = t;
        }
        for (int32_t e = 0; e < E; e++)
            w[(size_t) l * E + e] = kind == 0 ? floor (s_unif () * 1000)
                                              : floor (1e5 / pow (perm[e] + 1, 1.2));
    }
    free (perm);
    return w;
}

/* ------------------------------------------------------- properties -- */

static void s_props (const char *algo, const struct rx_placement *p, const struct rx_eplb_problem *q)
{
    int32_t E = q->n_logical, P = q->n_physical;
    int hier = q->n_group % q->n_node == 0 && !strcmp (algo, "deepseek");
    cr_assert_eq (p->n_layer, q->n_layer);
    cr_assert_eq (p->n_logical, E);
    cr_assert_eq (p->n_physical, P);
    struct rx_err err = { 0 };
    struct rx_placement *id = rx_placement_identity (q->n_layer, E, &err);
    cr_assert_not_null (id, "%s", err.msg);
    int32_t *cnt = calloc ((size_t) E, sizeof *cnt);
    for (int32_t l = 0; l < q->n_layer; l++) {
        const int32_t *map = p->phy2log + (size_t) l * P;
        memset (cnt, 0, (size_t) E * sizeof *cnt);
        for (int32_t s = 0; s < P; s++) {
            cr_assert (map[s] >= 0 && map[s] < E, "%s layer %d slot %d: %d", algo, l, s, map[s]);
            cnt[map[s]]++;
        }
        int64_t sum = 0;
        for (int32_t e = 0; e < E; e++) {
            cr_assert (cnt[e] >= 1, "%s layer %d: expert %d has no copy", algo, l, e);
            cr_assert_eq (p->logcnt[(size_t) l * E + e], cnt[e]);
            sum += p->logcnt[(size_t) l * E + e];
            /* log2phy lists exactly the expert's slots, increasing, -1 padded */
            const int32_t *lst = p->log2phy + ((size_t) l * E + e) * p->max_copies;
            for (int32_t k = 0; k < p->max_copies; k++) {
                if (k < cnt[e]) {
                    cr_assert_eq (map[lst[k]], e);
                    if (k) cr_assert_gt (lst[k], lst[k - 1]);
                } else {
                    cr_assert_eq (lst[k], -1);
                }
            }
        }
        cr_assert_eq (sum, P, "%s layer %d: copies sum to %lld, not %d", algo, l, (long long) sum, P);
        if (hier) {
            /* every group on one node; each node n_group / n_node groups */
            int32_t gs = E / q->n_group, Pn = P / q->n_node;
            int32_t *gnode = malloc ((size_t) q->n_group * sizeof *gnode);
            for (int32_t g = 0; g < q->n_group; g++) gnode[g] = -1;
            for (int32_t s = 0; s < P; s++) {
                int32_t g = map[s] / gs, n = s / Pn;
                cr_assert (gnode[g] < 0 || gnode[g] == n, "%s layer %d: group %d on nodes %d and %d",
                           algo, l, g, gnode[g], n);
                gnode[g] = n;
            }
            for (int32_t n = 0; n < q->n_node; n++) {
                int32_t k = 0;
                for (int32_t g = 0; g < q->n_group; g++) k += gnode[g] == n;
                cr_assert_eq (k, q->n_group / q->n_node, "layer %d node %d holds %d groups", l, n, k);
            }
            free (gnode);
        }
        const double *w = q->load + (size_t) l * E;
        double b = rx_placement_balancedness (p, l, w, q->n_gpu);
        double b0 = q->n_logical % q->n_gpu ? 0 : rx_placement_balancedness (id, l, w, q->n_gpu);
        cr_assert (b > 0 && b <= 1 + 1e-12, "%s layer %d: balancedness %g", algo, l, b);
        cr_assert (b >= b0 - 1e-12, "%s layer %d: balancedness %g below the identity's %g", algo, l, b, b0);
    }
    free (cnt);
    rx_placement_free (&id);
}

static const struct { int32_t L, E, P, K, N, G; } s_shapes[] = {
    { 4, 256, 288, 8, 1, 8 },  /* the benchmark shape, one node */
    { 4, 256, 288, 8, 2, 8 },  /* two nodes */
    { 3, 256, 320, 8, 4, 16 }, /* four nodes, 16 GPUs */
    { 3, 64, 80, 8, 2, 8 },
    { 3, 12, 16, 4, 2, 4 },
    { 3, 32, 40, 4, 4, 4 },    /* one group per node: groups keep their node */
    { 3, 16, 16, 4, 2, 4 },    /* no redundancy */
    { 3, 60, 64, 6, 4, 8 },    /* groups % nodes != 0: one group, one node */
    { 3, 8, 12, 1, 1, 3 },
    { 2, 64, 72, 1, 1, 72 },   /* one slot per GPU */
};

static void s_run_props (const char *algo)
{
    rx_loader_t *l = s_loader ();
    for (int kind = 0; kind < 2; kind++)
        for (size_t i = 0; i < sizeof s_shapes / sizeof s_shapes[0]; i++) {
            double *w = s_loads (kind, s_shapes[i].L, s_shapes[i].E);
            struct rx_eplb_problem q = s_prob (s_shapes[i].L, s_shapes[i].E, s_shapes[i].P, s_shapes[i].K,
                                               s_shapes[i].N, s_shapes[i].G, w);
            struct rx_err err = { 0 };
            struct rx_placement *p = rx_eplb_compute (l, algo, &q, &err);
            cr_assert_not_null (p, "%s shape %zu: %s", algo, i, err.msg);
            s_props (algo, p, &q);
            /* determinism: the same input gives the same placement */
            struct rx_placement *p2 = rx_eplb_compute (l, algo, &q, &err);
            cr_assert_not_null (p2, "%s", err.msg);
            cr_assert (memcmp (p->phy2log, p2->phy2log,
                               (size_t) q.n_layer * q.n_physical * sizeof *p->phy2log) == 0,
                       "%s shape %zu: two runs differ", algo, i);
            rx_placement_free (&p);
            rx_placement_free (&p2);
            cr_assert_null (p);
            free (w);
        }
    rx_loader_destroy (&l);
}

Test (eplb, deepseek_properties_on_random_and_zipf_loads) { s_run_props ("deepseek"); }
Test (eplb, greedy_properties_on_random_and_zipf_loads) { s_run_props ("greedy"); }

/* Redundancy helps a skewed layer: on Zipf loads the 256 -> 288 placement
 * beats the identity by a wide margin (the benchmark's point). */
Test (eplb, zipf_balancedness_improves_clearly)
{
    rx_loader_t *l = s_loader ();
    double *w = s_loads (1, 4, 256);
    struct rx_err err = { 0 };
    struct rx_placement *id = rx_placement_identity (4, 256, &err);
    const char *algos[] = { "deepseek", "greedy" };
    for (int a = 0; a < 2; a++) {
        struct rx_eplb_problem q = s_prob (4, 256, 288, 8, 2, 8, w);
        struct rx_placement *p = rx_eplb_compute (l, algos[a], &q, &err);
        cr_assert_not_null (p, "%s", err.msg);
        for (int32_t k = 0; k < 4; k++) {
            double b0 = rx_placement_balancedness (id, k, w + 256 * k, 8),
                   b = rx_placement_balancedness (p, k, w + 256 * k, 8);
            cr_assert (b0 < 0.6 && b > 0.8, "%s layer %d: %g -> %g", algos[a], k, b0, b);
        }
        rx_placement_free (&p);
    }
    rx_placement_free (&id);
    free (w);
    rx_loader_destroy (&l);
}

/* ------------------------------------------------- hand-computed cases -- */

/* 12 experts in 4 groups of 3, 16 slots, 2 nodes, 4 GPUs (4 slots each).
 * Loads 90 132 40 | 61 104 165 | 39 4 73 | 56 183 86.
 * 1. group loads 262 330 116 325; heaviest first: g1 -> node 0 (330),
 *    g3 -> node 1 (325), g0 -> node 1 (lighter: 587), g2 -> node 0 (446).
 *    node 0's experts: g1 then g2 = 3 4 5 6 7 8; node 1's: g3 then g0 =
 *    9 10 11 0 1 2.
 * 2. node 0 (61 104 165 39 4 73) copies 5 (165 -> 82.5) then 4 (104 -> 52):
 *    physical k0..7 = 3 4 5 6 7 8 5 4, weights 61 52 82.5 39 4 73 82.5 52.
 *    node 1 (56 183 86 90 132 40) copies 10 (-> 91.5) then 1 (132 > 91.5,
 *    -> 66): k0..7 = 9 10 11 0 1 2 10 1, weights 56 91.5 86 90 66 40 91.5 66.
 * 3. node 0 order k2 k6 k5 k0 k1 k7 k3 k4: GPU0 gets k2 (82.5), GPU1 k6
 *    (82.5), GPU0 k5 (155.5, tie -> lower), GPU1 k0 (143.5), GPU1 k1
 *    (195.5), GPU0 k7 (207.5), GPU1 k3 (234.5, full), GPU0 k4 (211.5):
 *    GPU0 = 5 8 4 7, GPU1 = 5 3 4 6.
 *    node 1 order k1 k6 k3 k2 k4 k7 k0 k5: GPU2 k1 (91.5), GPU3 k6 (91.5),
 *    GPU2 k3 (181.5), GPU3 k2 (177.5), GPU3 k4 (243.5), GPU2 k7 (247.5),
 *    GPU3 k0 (299.5, full), GPU2 k5 (287.5): GPU2 = 10 0 1 2, GPU3 = 10 11 1 9.
 * Balancedness: total 1033, mean 258.25, max 299.5: 0.862270...; the
 * identity (3 experts per GPU): 262 330 116 325, 258.25 / 330. */
Test (eplb, deepseek_hand_computed_example)
{
    static const double w[12] = { 90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86 };
    static const int32_t want[16] = { 5, 8, 4, 7, 5, 3, 4, 6, 10, 0, 1, 2, 10, 11, 1, 9 };
    rx_loader_t *l = s_loader ();
    struct rx_eplb_problem q = s_prob (1, 12, 16, 4, 2, 4, w);
    struct rx_err err = { 0 };
    struct rx_placement *p = rx_eplb_compute (l, "deepseek", &q, &err);
    cr_assert_not_null (p, "%s", err.msg);
    for (int s = 0; s < 16; s++) cr_expect_eq (p->phy2log[s], want[s], "slot %d: %d, want %d", s, p->phy2log[s], want[s]);
    static const int32_t cnt[12] = { 1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1 };
    for (int e = 0; e < 12; e++) cr_expect_eq (p->logcnt[e], cnt[e], "expert %d", e);
    cr_assert_eq (p->max_copies, 2);
    /* expert 4 is in slots 2 and 6; expert 10 in 8 and 12; expert 0 in 9 */
    cr_expect_eq (p->log2phy[4 * 2], 2);
    cr_expect_eq (p->log2phy[4 * 2 + 1], 6);
    cr_expect_eq (p->log2phy[10 * 2], 8);
    cr_expect_eq (p->log2phy[10 * 2 + 1], 12);
    cr_expect_eq (p->log2phy[0], 9);
    cr_expect_eq (p->log2phy[1], -1);
    cr_assert_float_eq (rx_placement_balancedness (p, 0, w, 4), 258.25 / 299.5, 1e-12);
    struct rx_placement *id = rx_placement_identity (1, 12, &err);
    cr_assert_float_eq (rx_placement_balancedness (id, 0, w, 4), 258.25 / 330, 1e-12);
    rx_placement_free (&id);
    rx_placement_free (&p);
    rx_loader_destroy (&l);
}

/* Loads 10 6 3 1, 6 slots, 2 GPUs (3 each).  Replication: 10 is the
 * heaviest per copy (-> 5), then 6 (6 > 5, -> 3).  Copies k0..5 = experts
 * 0 1 2 3 0 1, weights 5 3 3 1 5 3; order k0 k4 k1 k2 k5 k3: GPU0 k0 (5),
 * GPU1 k4 (5), GPU0 k1 (8, tie), GPU1 k2 (8), GPU0 k5 (11, full), GPU1 k3
 * (9).  Refinement: GPU0 {5,3,3} vs GPU1 {5,3,1}: swapping 5<->3 or 3<->1
 * gives {9,11}, 5<->1 {7,13}: no swap lowers 11.  phy2log 0 1 1 | 0 2 3,
 * balancedness 10 / 11.  With groups 3 and nodes 2 (ignored by greedy,
 * and not even divisible) the result is the same. */
Test (eplb, greedy_hand_computed_example)
{
    static const double w[4] = { 10, 6, 3, 1 };
    static const int32_t want[6] = { 0, 1, 1, 0, 2, 3 };
    rx_loader_t *l = s_loader ();
    struct rx_err err = { 0 };
    for (int v = 0; v < 2; v++) {
        struct rx_eplb_problem q = s_prob (1, 4, 6, v ? 3 : 1, v ? 2 : 1, 2, w);
        struct rx_placement *p = rx_eplb_compute (l, "greedy", &q, &err);
        cr_assert_not_null (p, "%s", err.msg);
        for (int s = 0; s < 6; s++) cr_expect_eq (p->phy2log[s], want[s], "slot %d: %d", s, p->phy2log[s]);
        cr_assert_float_eq (rx_placement_balancedness (p, 0, w, 2), 10.0 / 11, 1e-12);
        rx_placement_free (&p);
    }
    rx_loader_destroy (&l);
}

/* Greedy's swap refinement on a case LPT leaves unbalanced.  Loads 8 7 6 5
 * 4 0, no redundancy, 2 GPUs (3 each).  LPT: GPU0 8, GPU1 7, GPU1 6 (13),
 * GPU0 5 (13, tie), GPU0 4 (17, full), GPU1 0 (13).  Refinement: GPU0
 * {8,5,4}=17, GPU1 {7,6,0}=13: best swap 8<->6 gives {15,15}; after it
 * the loads are equal and no swap lowers 15.  In slot order GPU0 held
 * experts 0 3 4 and GPU1 1 2 5; the swap puts expert 2 in slot 0 and
 * expert 0 in slot 4.  Balanced: 1.0; deepseek (no refinement) 15/17. */
Test (eplb, greedy_refinement_swaps)
{
    static const double w[6] = { 8, 7, 6, 5, 4, 0 };
    static const int32_t want[6] = { 2, 3, 4, 1, 0, 5 };
    rx_loader_t *l = s_loader ();
    struct rx_err err = { 0 };
    struct rx_eplb_problem q = s_prob (1, 6, 6, 1, 1, 2, w);
    struct rx_placement *p = rx_eplb_compute (l, "greedy", &q, &err);
    cr_assert_not_null (p, "%s", err.msg);
    for (int s = 0; s < 6; s++) cr_expect_eq (p->phy2log[s], want[s], "slot %d: %d", s, p->phy2log[s]);
    cr_assert_float_eq (rx_placement_balancedness (p, 0, w, 2), 1.0, 1e-12);
    rx_placement_free (&p);
    p = rx_eplb_compute (l, "deepseek", &q, &err);
    cr_assert_not_null (p, "%s", err.msg);
    cr_assert_float_eq (rx_placement_balancedness (p, 0, w, 2), 15.0 / 17, 1e-12);
    rx_placement_free (&p);
    rx_loader_destroy (&l);
}

/* The counterexamples in the header comment, pinned (worked by hand):
 * {4,7,9,6}, 6 slots: copies of 9 and 7, k0..5 = experts 0 1 2 3 2 1 at
 * 4 3.5 4.5 6 4.5 3.5; GPU0 6, GPU1 4.5, GPU1 9, GPU0 10, GPU1 12.5 (full),
 * GPU0 13.5.  {6,8,5,9}, 6 slots: copies of 9 and 8, 6 4 5 4.5 4.5 4;
 * GPU0 6, GPU1 5, GPU1 9.5, GPU0 10.5, GPU1 13.5 (full), GPU0 14.5. */
Test (eplb, redundancy_is_not_monotone_for_lpt)
{
    static const double w[4] = { 4, 7, 9, 6 }, v[4] = { 6, 8, 5, 9 };
    rx_loader_t *l = s_loader ();
    struct rx_err err = { 0 };
    struct rx_eplb_problem q = s_prob (1, 4, 4, 1, 1, 2, w);
    struct rx_placement *p = rx_eplb_compute (l, "deepseek", &q, &err);
    cr_assert_not_null (p, "%s", err.msg);
    cr_assert_float_eq (rx_placement_balancedness (p, 0, w, 2), 1.0, 1e-12);
    rx_placement_free (&p);
    q.n_physical = 6;
    p = rx_eplb_compute (l, "deepseek", &q, &err);
    cr_assert_not_null (p, "%s", err.msg);
    cr_assert_float_eq (rx_placement_balancedness (p, 0, w, 2), 13.0 / 13.5, 1e-12);
    rx_placement_free (&p);
    q.load = v;
    p = rx_eplb_compute (l, "deepseek", &q, &err);
    cr_assert_not_null (p, "%s", err.msg);
    cr_assert_float_eq (rx_placement_balancedness (p, 0, v, 2), 14.0 / 14.5, 1e-12);
    struct rx_placement *id = rx_placement_identity (1, 4, &err);
    cr_assert_float_eq (rx_placement_balancedness (id, 0, v, 2), 1.0, 1e-12);
    rx_placement_free (&id);
    rx_placement_free (&p);
    rx_loader_destroy (&l);
}

/* ------------------------------------------------ bad preconditions -- */

static void s_expect_refused (rx_loader_t *l, const char *algo, struct rx_eplb_problem q, int code,
                              const char *msg)
{
    struct rx_err err = { 0 };
    struct rx_placement *p = rx_eplb_compute (l, algo, &q, &err);
    cr_assert_null (p, "%s accepted a bad problem (%s)", algo, msg);
    cr_assert_eq (err.code, code, "%s: code %d (%s)", msg, err.code, err.msg);
    cr_assert (strstr (err.msg, msg), "message \"%s\" lacks \"%s\"", err.msg, msg);
}

Test (eplb, bad_preconditions_are_errors_with_a_message)
{
    double w[24];
    for (int i = 0; i < 24; i++) w[i] = i;
    rx_loader_t *l = s_loader ();
    s_expect_refused (l, "deepseek", s_prob (1, 10, 12, 4, 1, 4, w), RX_EINVAL,
                      "10 logical experts do not divide into 4 groups");
    s_expect_refused (l, "deepseek", s_prob (1, 12, 14, 4, 1, 4, w), RX_EINVAL,
                      "14 physical slots do not divide over 4 GPUs");
    s_expect_refused (l, "deepseek", s_prob (1, 12, 12, 4, 4, 6, w), RX_EINVAL,
                      "6 GPUs do not divide over 4 nodes");
    s_expect_refused (l, "deepseek", s_prob (1, 12, 8, 4, 1, 4, w), RX_EINVAL,
                      "8 physical slots are fewer than the 12 logical experts");
    s_expect_refused (l, "greedy", s_prob (1, 12, 8, 4, 1, 4, w), RX_EINVAL,
                      "8 physical slots are fewer than the 12 logical experts");
    s_expect_refused (l, "greedy", s_prob (1, 12, 14, 1, 1, 4, w), RX_EINVAL,
                      "14 physical slots do not divide over 4 GPUs");
    s_expect_refused (l, "deepseek", s_prob (1, 12, 12, 0, 1, 4, w), RX_EINVAL, "bad problem size");
    s_expect_refused (l, "deepseek", s_prob (0, 12, 12, 1, 1, 4, w), RX_EINVAL, "bad problem size");
    s_expect_refused (l, "deepseek", s_prob (1, 12, 12, 1, 1, 4, NULL), RX_EINVAL, "NULL load");
    w[5] = -1;
    s_expect_refused (l, "greedy", s_prob (1, 12, 12, 1, 1, 4, w), RX_EINVAL,
                      "load of layer 0 expert 5 is -1");
    w[5] = NAN;
    s_expect_refused (l, "greedy", s_prob (1, 12, 12, 1, 1, 4, w), RX_EINVAL, "expert 5 is nan");
    w[5] = 5;
    struct rx_eplb_problem q = s_prob (1, 12, 12, 1, 1, 4, w);
    q.struct_size = 8;
    s_expect_refused (l, "deepseek", q, RX_EABI, "problem struct too short");
    /* an algorithm that does not exist */
    struct rx_err err = { 0 };
    q = s_prob (1, 12, 12, 1, 1, 4, w);
    cr_assert_null (rx_eplb_compute (l, "nosuch", &q, &err));
    cr_assert_neq (err.code, RX_OK);
    cr_assert (strstr (err.msg, "nosuch"), "%s", err.msg);
    rx_loader_destroy (&l);
}

Test (eplb, placement_new_checks_ids)
{
    struct rx_err err = { 0 };
    int32_t out_of_range[4] = { 0, 1, 2, 3 };
    cr_assert_null (rx_placement_new (1, 3, 4, out_of_range, &err));
    cr_assert (strstr (err.msg, "layer 0 slot 3 holds expert 3, outside 0..2"), "%s", err.msg);
    int32_t missing[4] = { 0, 1, 1, 0 };
    cr_assert_null (rx_placement_new (1, 3, 4, missing, &err));
    cr_assert (strstr (err.msg, "logical expert 2 has no slot"), "%s", err.msg);
    cr_assert_null (rx_placement_new (1, 5, 4, missing, &err));
    cr_assert (strstr (err.msg, "4 physical slots cannot hold 5"), "%s", err.msg);
    cr_assert_null (rx_placement_new (1, 3, 4, NULL, &err));
    cr_assert_null (rx_placement_identity (0, 3, &err));
    /* balancedness: bad GPU counts are NAN, an idle layer is 1 */
    struct rx_placement *id = rx_placement_identity (1, 4, &err);
    double w0[4] = { 0, 0, 0, 0 };
    cr_assert (isnan (rx_placement_balancedness (id, 0, w0, 3)));
    cr_assert (isnan (rx_placement_balancedness (id, 1, w0, 2)));
    cr_assert_float_eq (rx_placement_balancedness (id, 0, w0, 2), 1.0, 0);
    rx_placement_free (&id);
    rx_placement_free (&id); /* NULL-safe */
}

/* ------------------------------------------------------------ files -- */

static char *s_file (const char *dir, const char *name, const char *text)
{
    char *p = tu_path (dir, name);
    tu_write (p, text);
    return p;
}

Test (eplb, load_file_reads_and_rejects)
{
    char *d = tu_tmpdir ();
    char *f = s_file (d, "ok.json", "{\"load\": [[1, 2.5, 0], [3, 4, 5]], \"extra\": 1}");
    double *w = NULL;
    int32_t L = 0, E = 0;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_eplb_load_read (f, &w, &L, &E, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (L, 2);
    cr_assert_eq (E, 3);
    cr_assert_float_eq (w[1], 2.5, 0);
    cr_assert_float_eq (w[5], 5, 0);
    free (w);
    free (f);

    static const struct { const char *text, *msg; } bad[] = {
        { "{\"load\": [[1, 2], [3]", "not a JSON file" },
        { "[[1, 2]]", "top level is not a JSON object" },
        { "{\"weights\": [[1]]}", "no \"load\" member" },
        { "{\"load\": 5}", "\"load\" is not an array" },
        { "{\"load\": []}", "\"load\" has 0 layers" },
        { "{\"load\": [[]]}", "\"load\"[0] has 0 entries" },
        { "{\"load\": [[1, 2], [3]]}", "\"load\"[1] has 1 entries, layer 0 has 2" },
        { "{\"load\": [[1, \"x\"]]}", "\"load\"[0][1] is not a number" },
        { "{\"load\": [[1, -2]]}", "\"load\"[0][1] is -2" },
        { "{\"load\": [3]}", "\"load\"[0] is not an array" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = s_file (d, "bad.json", bad[i].text);
        w = (double *) 1;
        cr_assert_neq (rx_eplb_load_read (f, &w, &L, &E, &err), RX_OK, "accepted %s", bad[i].text);
        cr_assert_null (w);
        cr_assert (strstr (err.msg, bad[i].msg), "%s: \"%s\" lacks \"%s\"", bad[i].text, err.msg, bad[i].msg);
        cr_assert (strstr (err.msg, "bad.json"), "no file name in \"%s\"", err.msg);
        free (f);
    }
    f = tu_path (d, "absent.json");
    cr_assert_eq (rx_eplb_load_read (f, &w, &L, &E, &err), RX_EIO);
    cr_assert (strstr (err.msg, "absent.json"), "%s", err.msg);
    free (f);
    free (d);
}

Test (eplb, placement_json_round_trip_and_location_files)
{
    char *d = tu_tmpdir ();
    static const double w[8] = { 10, 6, 3, 1, 1, 2, 3, 4 };
    int32_t map[12] = { 0, 1, 1, 0, 2, 3, 3, 0, 1, 2, 3, 3 };
    struct rx_err err = { 0 };
    struct rx_placement *p = rx_placement_new (2, 4, 6, map, &err);
    cr_assert_not_null (p, "%s", err.msg);
    char *f = tu_path (d, "pl.json");
    FILE *fp = fopen (f, "w");
    cr_assert_eq (rx_placement_write_json (fp, p, w, 2, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_placement_write_json (fp, p, w, 4, &err), RX_EINVAL);
    fclose (fp);
    json_error_t je;
    json_t *root = json_load_file (f, 0, &je);
    cr_assert_not_null (root, "%s", je.text);
    json_t *lp = json_object_get (root, "log2phy");
    cr_assert_eq (json_array_size (lp), 2);
    /* layer 1: expert 3 in slots 0, 4 and 5 (max copies 3): [0, 4, 5];
     * expert 0 in slots 1 only -> [1, -1, -1] */
    json_t *e3 = json_array_get (json_array_get (lp, 1), 3);
    cr_assert_eq (json_array_size (e3), 3);
    cr_assert_eq (json_integer_value (json_array_get (e3, 0)), 0);
    cr_assert_eq (json_integer_value (json_array_get (e3, 2)), 5);
    json_t *e0 = json_array_get (json_array_get (lp, 1), 0);
    cr_assert_eq (json_integer_value (json_array_get (e0, 0)), 1);
    cr_assert_eq (json_integer_value (json_array_get (e0, 1)), -1);
    json_t *lc = json_object_get (root, "logcnt");
    cr_assert_eq (json_integer_value (json_array_get (json_array_get (lc, 1), 3)), 3);
    /* layer 0: GPU0 {10/2, 6/2, 6/2} = 11, GPU1 {5, 3, 1} = 9 -> 10/11;
     * layer 1, loads 1 2 3 4, slots 3 0 1 | 2 3 3 (expert 3 thrice):
     * GPU0 4/3+1+2 = 13/3, GPU1 3+8/3 = 17/3 -> 5/(17/3) = 15/17 */
    json_t *b = json_object_get (root, "balancedness");
    cr_assert_float_eq (json_number_value (json_array_get (b, 0)), 10.0 / 11, 1e-6);
    cr_assert_float_eq (json_number_value (json_array_get (b, 1)), 15.0 / 17, 1e-6);
    json_decref (root);

    /* the written file reads back as a placement */
    struct rx_placement *r = NULL;
    double *ld = NULL;
    int32_t L = 0, E = 0;
    cr_assert_eq (rx_eplb_location_read (f, &r, &ld, &L, &E, &err), RX_OK, "%s", err.msg);
    cr_assert_not_null (r);
    cr_assert_null (ld);
    cr_assert_eq (L, 2);
    cr_assert_eq (E, 4);
    cr_assert (memcmp (r->phy2log, map, sizeof map) == 0);
    rx_placement_free (&r);
    free (f);

    /* a load file (a dump) as a location */
    f = s_file (d, "dump.json", "{\"load\": [[1, 2]]}");
    cr_assert_eq (rx_eplb_location_read (f, &r, &ld, &L, &E, &err), RX_OK, "%s", err.msg);
    cr_assert_null (r);
    cr_assert_not_null (ld);
    cr_assert_eq (E, 2);
    free (ld);
    free (f);

    static const struct { const char *text, *msg; } bad[] = {
        { "{\"x\": 1}", "neither a placement" },
        { "{\"phy2log\": [[0, 1, 7]], \"logcnt\": [[1, 1]]}", "slot 2 holds expert 7, outside 0..1" },
        { "{\"phy2log\": [[0, 2, 2]]}", "logical expert 1 has no slot" },
        { "{\"phy2log\": [[0, -1]]}", "\"phy2log\"[0][1] is -1" },
        { "{\"phy2log\": [[0, 1.5]]}", "\"phy2log\"[0][1] is not an integer" },
        { "{\"phy2log\": [[0, 1, 1]], \"logcnt\": [[2, 1]]}", "\"logcnt\"[0][0] disagrees" },
        { "{\"phy2log\": [[0, 1]], \"logcnt\": [[1, 1], [1, 1]]}", "\"logcnt\" has 2 layers" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = s_file (d, "badpl.json", bad[i].text);
        cr_assert_neq (rx_eplb_location_read (f, &r, &ld, &L, &E, &err), RX_OK, "accepted %s", bad[i].text);
        cr_assert_null (r);
        cr_assert_null (ld);
        cr_assert (strstr (err.msg, bad[i].msg), "%s: \"%s\" lacks \"%s\"", bad[i].text, err.msg, bad[i].msg);
        free (f);
    }
    rx_placement_free (&p);
    free (d);
}
