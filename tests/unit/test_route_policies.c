/* tests/unit/test_route_policies.c -- the route-* plugins, loaded from the
 * build tree through the real loader: each policy's decisions (cache_aware:
 * both imbalance thresholds, hit/miss at the threshold, the miss rule,
 * ejection on worker_removed, eviction on tick), their errors, their INI
 * keys, and the loader's checks for the route-policy kind. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <radix/route.h>

#include "conf.h"
#include "loader.h"
#include "../testutil.h"

/* ---- harness: one loader + config + instance per policy ------------------ */

struct pol {
    rx_loader_t *l;
    rx_conf_t *conf;
    rx_plugin_t *pl;
    const struct rx_route_policy_ops *ops;
    void *inst;
};

/* Load route-<name> with ini as its config (NULL: defaults) and create an
 * instance; returns create's status (err set on failure). */
static int s_open_rc (struct pol *p, const char *name, const char *ini, struct rx_err *err)
{
    memset (p, 0, sizeof *p);
    p->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), err);
    cr_assert_not_null (p->l, "%s", err->msg);
    cr_assert_eq (rx_loader_find (p->l, RX_KIND_ROUTE_POLICY, name, &p->pl, err), RX_OK, "%s", err->msg);
    if (ini) {
        p->conf = rx_conf_parse_string (ini, strlen (ini), "router-test.ini", err);
        cr_assert_not_null (p->conf, "%s", err->msg);
    }
    cr_assert_eq (rx_plugin_init (p->pl, p->conf, err), RX_OK, "%s", err->msg);
    p->ops = rx_plugin_ops (p->pl);
    if (!p->ops->create)
        return RX_OK;
    return p->ops->create (rx_plugin_host (p->pl), &p->inst, err);
}

static void s_open (struct pol *p, const char *name, const char *ini)
{
    struct rx_err err = { 0 };
    cr_assert_eq (s_open_rc (p, name, ini, &err), RX_OK, "%s", err.msg);
}

static void s_close (struct pol *p)
{
    if (p->inst && p->ops->destroy)
        p->ops->destroy (p->inst);
    rx_conf_destroy (&p->conf);
    rx_loader_destroy (&p->l);
}

/* pick over w[0..n) for text; returns the chosen worker's id. */
static uint32_t s_pick (struct pol *p, const char *text, struct rx_route_worker *w, size_t n,
                        uint64_t seed, int *decision)
{
    struct rx_route_request rq = { text, text ? strlen (text) : 0 };
    size_t chosen = 999;
    struct rx_err err = { 0 };
    cr_assert_eq (p->ops->pick (p->inst, &rq, w, n, seed, &chosen, decision, &err), RX_OK, "%s", err.msg);
    cr_assert_lt (chosen, n);
    return w[chosen].id;
}

#define W(i, l) ((struct rx_route_worker) { .id = (i), .url = "http://127.0.0.1:1", .load = (l) })

/* ---- descriptors and the loader ------------------------------------------ */

Test (route_policies, all_five_load_as_route_policies)
{
    const char *names[] = { "random", "round_robin", "shortest_queue", "power_of_two", "cache_aware" };
    for (size_t i = 0; i < 5; i++) {
        struct pol p;
        s_open (&p, names[i], NULL);
        const struct rx_plugin_desc *d = rx_plugin_desc (p.pl);
        cr_assert_eq (d->kind, RX_KIND_ROUTE_POLICY);
        cr_assert_str_eq (d->name, names[i]);
        cr_assert (strstr (rx_plugin_path (p.pl), "route-"), "%s", rx_plugin_path (p.pl));
        cr_assert_geq (p.ops->struct_size, RX_ROUTE_POLICY_OPS_SIZE_1_1);
        cr_assert_not_null (p.ops->pick);
        s_close (&p);
    }
    cr_assert_str_eq (rx_kind_section (RX_KIND_ROUTE_POLICY), "router");
    cr_assert_eq (rx_kind_min_ops_size (RX_KIND_ROUTE_POLICY), RX_ROUTE_POLICY_OPS_SIZE_1_1);
}

static char *s_fixture (const char *name)
{
    size_t n = strlen (tu_env ("RX_TOP_BUILDDIR")) + strlen (name) + 64;
    char *path = malloc (n);
    snprintf (path, n, "%s/tests/route-fixtures/.libs/%s", tu_env ("RX_TOP_BUILDDIR"), name);
    return path;
}

Test (route_policies, loader_requires_pick_and_a_full_table)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    rx_plugin_t *pl = NULL;
    char *path = s_fixture ("route-nopick.so");
    cr_assert_eq (rx_loader_open (l, path, RX_KIND_ROUTE_POLICY, &pl, &err), RX_EABI);
    cr_assert (strstr (err.msg, "route policy lacks the required member pick()"), "%s", err.msg);
    cr_assert (strstr (err.msg, "route-nopick.so"), "%s", err.msg);
    free (path);
    rx_err_clear (&err);
    path = s_fixture ("route-short.so");
    cr_assert_eq (rx_loader_open (l, path, RX_KIND_ROUTE_POLICY, &pl, &err), RX_EABI);
    cr_assert (strstr (err.msg, "ops table too short"), "%s", err.msg);
    cr_assert (strstr (err.msg, "route policy"), "%s", err.msg);
    free (path);
    rx_loader_destroy (&l);
}

Test (route_policies, cache_aware_declares_its_keys)
{
    struct pol p;
    s_open (&p, "cache_aware", NULL);
    const struct rx_cfg_key *k = rx_plugin_desc (p.pl)->keys;
    const char *want[][2] = { { "cache_threshold", "0.3" }, { "balance_abs_threshold", "64" },
                              { "balance_rel_threshold", "1.5" }, { "eviction_interval", "120s" },
                              { "max_tree_size", "67108864" } };
    for (size_t i = 0; i < 5; i++) {
        const struct rx_cfg_key *f = rx_cfg_keys_find (k, want[i][0]);
        cr_assert_not_null (f, "%s", want[i][0]);
        cr_assert_str_eq (f->def, want[i][1]);
        cr_assert (f->help && *f->help);
    }
    cr_assert_eq (strcmp (rx_plugin_section (p.pl), "router.cache_aware"), 0);
    s_close (&p);
    /* The plain policies take no keys. */
    s_open (&p, "power_of_two", NULL);
    cr_assert_null (rx_plugin_desc (p.pl)->keys);
    s_close (&p);
}

/* The keys reach conf validation with file:line errors, as in radix-router. */
static const struct rx_cfg_key *s_keys_of (void *ud, int kind, const char *name, struct rx_err *err)
{
    rx_loader_t *l = ud;
    rx_plugin_t *pl;
    if (rx_loader_find (l, kind, name, &pl, err) != RX_OK)
        return NULL;
    static const struct rx_cfg_key none[] = { { NULL, 0, NULL, NULL, 0, 0, NULL } };
    return rx_plugin_desc (pl)->keys ? rx_plugin_desc (pl)->keys : none;
}

Test (route_policies, bad_values_are_refused_with_file_and_line)
{
    static const struct rx_cfg_key router_keys[] = {
        { "policy", RX_CFG_STRING, "cache_aware", "route policy", 0, 0, NULL },
        { NULL, 0, NULL, NULL, 0, 0, NULL } };
    static const struct rx_conf_section schema[] = {
        { "router", "the router", router_keys, RX_KIND_ROUTE_POLICY },
        { NULL, NULL, NULL, 0 } };
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    const char *cases[][2] = {
        { "[router.cache_aware]\ncache_threshold = 0.5\n\ncache_threshold = 1.5\n", NULL },
        { "[router]\npolicy = cache_aware\n[router.cache_aware]\ncache_threshold = 1.5\n", "router-test.ini:4" },
        { "[router.cache_aware]\neviction_interval = soon\n", "router-test.ini:2" },
        { "[router.cache_aware]\nmax_tree_size = -1\n", "router-test.ini:2" },
        { "[router.cache_aware]\ncache_treshold = 0.5\n", "router-test.ini:2" },
        { "[router.cache_aware]\nbalance_abs_threshold = 8\nbalance_rel_threshold = 2\n"
          "eviction_interval = 90s\nmax_tree_size = 1000\ncache_threshold = 0.25\n", "" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rx_err_clear (&err);
        rx_conf_t *c = rx_conf_parse_string (cases[i][0], strlen (cases[i][0]), "router-test.ini", &err);
        if (!cases[i][1]) {                      /* duplicate key: a parse error */
            cr_assert_null (c);
            continue;
        }
        cr_assert_not_null (c, "%s", err.msg);
        int rc = rx_conf_validate (c, schema, s_keys_of, l, &err);
        if (!*cases[i][1])
            cr_assert_eq (rc, RX_OK, "%s", err.msg);
        else {
            cr_assert_eq (rc, RX_ECONFIG, "case %zu accepted", i);
            cr_assert (strstr (err.msg, cases[i][1]), "case %zu: %s", i, err.msg);
        }
        rx_conf_destroy (&c);
    }
    rx_loader_destroy (&l);
}

Test (route_policies, cache_aware_refuses_out_of_range_config)
{
    struct pol p;
    struct rx_err err = { 0 };
    int rc = s_open_rc (&p, "cache_aware", "[router.cache_aware]\ncache_threshold = 1.5\n", &err);
    cr_assert_eq (rc, RX_ECONFIG);
    cr_assert (strstr (err.msg, "[router.cache_aware] cache_threshold") && strstr (err.msg, "0..1"),
               "%s", err.msg);
    cr_assert_null (p.inst);
    s_close (&p);
}

/* ---- bad calls ------------------------------------------------------------ */

Test (route_policies, every_policy_refuses_bad_calls)
{
    const char *names[] = { "random", "round_robin", "shortest_queue", "power_of_two", "cache_aware" };
    for (size_t i = 0; i < 5; i++) {
        struct pol p;
        s_open (&p, names[i], NULL);
        struct rx_route_worker w[2] = { W (1, 0), W (2, 0) };
        struct rx_route_request rq = { "x", 1 };
        size_t chosen = 77;
        struct rx_err err = { 0 };
        cr_assert_eq (p.ops->pick (p.inst, &rq, w, 0, 1, &chosen, NULL, &err), RX_EINVAL, "%s", names[i]);
        cr_assert (strstr (err.msg, names[i]) && strstr (err.msg, "no candidates"), "%s", err.msg);
        cr_assert_eq (chosen, 77);
        rx_err_clear (&err);
        cr_assert_eq (p.ops->pick (p.inst, &rq, NULL, 2, 1, &chosen, NULL, &err), RX_EINVAL);
        rx_err_clear (&err);
        cr_assert_eq (p.ops->pick (p.inst, &rq, w, 2, 1, NULL, NULL, &err), RX_EINVAL);
        cr_assert (strstr (err.msg, names[i]), "%s", err.msg);
        /* decision may be NULL; one candidate is always chosen. */
        cr_assert_eq (p.ops->pick (p.inst, &rq, w, 1, 1, &chosen, NULL, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (chosen, 0);
        s_close (&p);
    }
    /* Stateful policies need their instance; cache_aware a real text. */
    struct pol p;
    s_open (&p, "cache_aware", NULL);
    struct rx_route_worker w[1] = { W (1, 0) };
    struct rx_route_request bad = { NULL, 5 };
    size_t chosen;
    struct rx_err err = { 0 };
    cr_assert_eq (p.ops->pick (p.inst, &bad, w, 1, 0, &chosen, NULL, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "NULL"), "%s", err.msg);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 0);
    cr_assert_eq (p.ops->pick (NULL, NULL, w, 1, 0, &chosen, NULL, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "instance"), "%s", err.msg);
    /* No request at all routes like an empty text. */
    int why = -1;
    cr_assert_eq (p.ops->pick (p.inst, NULL, w, 1, 0, &chosen, &why, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    s_close (&p);
    s_open (&p, "round_robin", NULL);
    cr_assert_eq (p.ops->pick (NULL, NULL, w, 1, 0, &chosen, NULL, &err), RX_EINVAL);
    s_close (&p);
}

/* ---- the plain policies ------------------------------------------------------ */

Test (route_policies, random_is_uniform_and_seed_determined)
{
    struct pol p;
    s_open (&p, "random", NULL);
    struct rx_route_worker w[4] = { W (10, 0), W (11, 9), W (12, 0), W (13, 0) };
    unsigned count[4] = { 0 };
    for (uint64_t seed = 0; seed < 8000; seed++) {
        int why = -1;
        uint32_t id = s_pick (&p, "t", w, 4, seed, &why);
        cr_assert_eq (why, RX_ROUTE_PLAIN);
        cr_assert_eq (s_pick (&p, "other text", w, 4, seed, NULL), id, "seed %llu", (unsigned long long) seed);
        count[id - 10]++;
    }
    /* 2000 expected each; 5 sigma is about 194. */
    for (int i = 0; i < 4; i++)
        cr_assert (count[i] > 1800 && count[i] < 2200, "worker %d chosen %u times of 8000", i, count[i]);
    s_close (&p);
}

Test (route_policies, shortest_queue_takes_the_least_loaded_lowest_index)
{
    struct pol p;
    s_open (&p, "shortest_queue", NULL);
    struct rx_route_worker w[4] = { W (5, 5), W (9, 2), W (1, 7), W (3, 2) };
    int why = -1;
    cr_assert_eq (s_pick (&p, "", w, 4, 1, &why), 9);       /* tie 9/3 at load 2: lowest index */
    cr_assert_eq (why, RX_ROUTE_PLAIN);
    for (uint64_t seed = 0; seed < 20; seed++)
        cr_assert_eq (s_pick (&p, "", w, 4, seed, NULL), 9);
    w[3].load = 1;
    cr_assert_eq (s_pick (&p, "", w, 4, 1, NULL), 3);
    w[0].load = 0;
    cr_assert_eq (s_pick (&p, "", w, 4, 1, NULL), 5);
    s_close (&p);
}

Test (route_policies, power_of_two_picks_the_lighter_of_two_distinct)
{
    struct pol p;
    s_open (&p, "power_of_two", NULL);
    /* Two candidates: the draws are distinct, so the lighter always wins. */
    struct rx_route_worker two[2] = { W (1, 5), W (2, 3) };
    for (uint64_t seed = 0; seed < 500; seed++)
        cr_assert_eq (s_pick (&p, "", two, 2, seed, NULL), 2, "seed %llu", (unsigned long long) seed);
    /* Loads 0 < 1 < 2 < 3: a worker wins when it is drawn with a heavier
     * one: pairs {0,x} 3 of 6, {1,2},{1,3} 2 of 6, {2,3} 1 of 6, never 3. */
    struct rx_route_worker w[4] = { W (20, 0), W (21, 1), W (22, 2), W (23, 3) };
    unsigned count[4] = { 0 };
    for (uint64_t seed = 0; seed < 12000; seed++) {
        int why = -1;
        uint32_t id = s_pick (&p, "", w, 4, seed, &why);
        cr_assert_eq (why, RX_ROUTE_PLAIN);
        cr_assert_eq (s_pick (&p, "", w, 4, seed, NULL), id);
        count[id - 20]++;
    }
    cr_assert_eq (count[3], 0);
    cr_assert (count[0] > 5700 && count[0] < 6300, "%u", count[0]);
    cr_assert (count[1] > 3750 && count[1] < 4250, "%u", count[1]);
    cr_assert (count[2] > 1750 && count[2] < 2250, "%u", count[2]);
    s_close (&p);
}

Test (route_policies, round_robin_turns_in_id_order)
{
    struct pol p;
    s_open (&p, "round_robin", NULL);
    struct rx_route_worker w[3] = { W (20, 0), W (10, 50), W (30, 0) };
    uint32_t want[] = { 10, 20, 30, 10, 20, 30, 10 };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int why = -1;
        cr_assert_eq (s_pick (&p, "", w, 3, i * 7919, &why), want[i], "turn %zu", i);
        cr_assert_eq (why, RX_ROUTE_PLAIN);
    }
    /* Last was 10.  20 is skipped this time (not a candidate): 30 is next. */
    struct rx_route_worker w2[2] = { W (30, 0), W (10, 0) };
    cr_assert_eq (s_pick (&p, "", w2, 2, 0, NULL), 30);
    cr_assert_eq (s_pick (&p, "", w2, 2, 0, NULL), 10);
    /* A worker that joins takes its place in the order at once. */
    struct rx_route_worker w3[4] = { W (20, 0), W (10, 0), W (30, 0), W (15, 0) };
    cr_assert_eq (s_pick (&p, "", w3, 4, 0, NULL), 15);
    cr_assert_eq (s_pick (&p, "", w3, 4, 0, NULL), 20);
    s_close (&p);
}

/* ---- cache_aware ------------------------------------------------------------ */

static const char *T1 = "You are a helpful assistant. Question: what is the capital of France?";
static const char *T2 = "Translate into German: the quick brown fox jumps over the lazy dog.";

Test (route_policies, cache_aware_hits_the_best_match_and_misses_to_small_trees)
{
    struct pol p;
    s_open (&p, "cache_aware", NULL);
    for (uint32_t id = 1; id <= 3; id++)
        p.ops->worker_added (p.inst, id);
    /* Candidates out of id order, all empty: a miss goes to the lowest id. */
    struct rx_route_worker w[3] = { W (3, 0), W (1, 0), W (2, 0) };
    int why = -1;
    cr_assert_eq (s_pick (&p, T1, w, 3, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), strlen (T1));
    /* Another unrelated text: the smallest trees are 2 and 3. */
    cr_assert_eq (s_pick (&p, T2, w, 3, 0, &why), 2);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* A follow-up sharing T1's prefix goes to worker 1 whatever the seed. */
    char follow[256];
    snprintf (follow, sizeof follow, "%s Answer: Paris.", T1);
    for (uint64_t seed = 0; seed < 5; seed++) {
        cr_assert_eq (s_pick (&p, follow, w, 3, seed, &why), 1);
        cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    }
    cr_assert_eq (p.ops->worker_size (p.inst, 1), strlen (follow));
    /* A worker that is not a candidate is never chosen, even if it matches. */
    struct rx_route_worker w23[2] = { W (2, 0), W (3, 0) };
    cr_assert_eq (s_pick (&p, T1, w23, 2, 0, &why), 3);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* Both 1 and 3 now hold T1: the hit goes to the less loaded. */
    struct rx_route_worker w13[2] = { W (1, 6), W (3, 2) };
    cr_assert_eq (s_pick (&p, T1, w13, 2, 0, &why), 3);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    w13[1].load = 6;                          /* equal load: the lower id */
    cr_assert_eq (s_pick (&p, T1, w13, 2, 0, &why), 1);
    /* An empty text is a miss and records nothing. */
    uint64_t before = p.ops->worker_size (p.inst, 1);
    cr_assert_eq (s_pick (&p, "", w, 3, 0, &why), 2);     /* sizes 84, 67, 69 */
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), before);
    s_close (&p);
}

Test (route_policies, cache_aware_match_ratio_must_exceed_the_threshold)
{
    struct pol p;
    s_open (&p, "cache_aware", "[router.cache_aware]\ncache_threshold = 0.5\n");
    struct rx_route_worker one[1] = { W (1, 0) };
    struct rx_route_worker w[2] = { W (1, 0), W (2, 0) };
    int why = -1;
    cr_assert_eq (s_pick (&p, "abcd", one, 1, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* 4 of 8 characters = 0.5, not above: a miss, to the empty worker 2. */
    cr_assert_eq (s_pick (&p, "abcdwxyz", w, 2, 0, &why), 2);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* 4 of 7 (0.57) is a hit; characters, not bytes: "é" is one. */
    cr_assert_eq (s_pick (&p, "abcdpqr", w, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    /* "abcd" + 4 two-byte characters: 4 of 8 characters (bytes would say
     * 4 of 12): a miss.  Worker 1 holds 7, worker 2 holds 8: worker 1. */
    cr_assert_eq (s_pick (&p, "abcd\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", w, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 11);   /* abcd + pqr + éééé */
    s_close (&p);
}

Test (route_policies, cache_aware_misses_to_the_least_loaded_of_the_smallest_trees)
{
    struct pol p;
    s_open (&p, "cache_aware", NULL);
    struct rx_route_worker w1[1] = { W (1, 0) };
    struct rx_route_worker w2[1] = { W (2, 0) };
    s_pick (&p, T1, w1, 1, 0, NULL);          /* worker 1: a big tree */
    s_pick (&p, "xy", w2, 1, 0, NULL);        /* worker 2: a small one */
    /* 3 and 4 are empty; 4 is less loaded than 3; 2 is idle but not smallest. */
    struct rx_route_worker w[4] = { W (1, 0), W (2, 0), W (3, 5), W (4, 2) };
    int why = -1;
    cr_assert_eq (s_pick (&p, T2, w, 4, 0, &why), 4);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* Now 3 is the only empty tree: it gets the next miss despite its load. */
    cr_assert_eq (s_pick (&p, "zzz", w, 4, 0, &why), 3);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* Equal sizes and loads: the lowest id (candidates out of order). */
    struct pol q;
    s_open (&q, "cache_aware", NULL);
    struct rx_route_worker e[3] = { W (8, 1), W (6, 1), W (7, 1) };
    cr_assert_eq (s_pick (&q, "abc", e, 3, 0, &why), 6);
    cr_assert_eq (s_pick (&q, "xyz", e, 3, 0, &why), 7);
    s_close (&q);
    s_close (&p);
}

/* The imbalance rule: abs AND rel (balance_abs_threshold 4, rel 2). */
Test (route_policies, cache_aware_balances_only_when_both_thresholds_are_crossed)
{
    struct pol p;
    s_open (&p, "cache_aware", "[router.cache_aware]\nbalance_abs_threshold = 4\nbalance_rel_threshold = 2\n");
    struct rx_route_worker one[1] = { W (1, 0) };
    s_pick (&p, T1, one, 1, 0, NULL);          /* worker 1 holds T1 */
    struct { uint32_t l1, l2; uint32_t want; int why; const char *what; } cases[] = {
        { 10, 5, 1, RX_ROUTE_CACHE_HIT, "abs only: 5 > 4 but 10 is not > 5*2" },
        { 5, 1, 1, RX_ROUTE_CACHE_HIT, "rel only: 5 > 1*2 but 4 is not > 4" },
        { 11, 5, 2, RX_ROUTE_BALANCE, "both: 6 > 4 and 11 > 10" },
        { 0, 5, 1, RX_ROUTE_BALANCE, "both, the cached worker is the idle one" },
        { 100, 50, 1, RX_ROUTE_CACHE_HIT, "abs only, large" },
        { 9, 0, 2, RX_ROUTE_BALANCE, "min 0: any max above the abs threshold" },
        { 4, 0, 1, RX_ROUTE_CACHE_HIT, "min 0, diff 4: not above abs" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rx_route_worker w[2] = { W (1, cases[i].l1), W (2, cases[i].l2) };
        int why = -1;
        cr_assert_eq (s_pick (&p, T1, w, 2, 0, &why), cases[i].want, "%s", cases[i].what);
        cr_assert_eq (why, cases[i].why, "%s", cases[i].what);
        /* Balancing records the text under whoever took it: forget it again
         * so every case starts from worker 1 alone holding T1. */
        if (cases[i].want == 2) {
            cr_assert_eq (p.ops->worker_size (p.inst, 2), strlen (T1));
            p.ops->worker_removed (p.inst, 2);
        }
    }
    /* Balance ties: the lowest id among the least loaded. */
    struct rx_route_worker w[3] = { W (1, 20), W (7, 3), W (5, 3) };
    int why = -1;
    cr_assert_eq (s_pick (&p, T1, w, 3, 0, &why), 5);
    cr_assert_eq (why, RX_ROUTE_BALANCE);
    s_close (&p);
    /* The defaults: 64 and 1.5. */
    s_open (&p, "cache_aware", NULL);
    s_pick (&p, T1, one, 1, 0, NULL);
    struct rx_route_worker d1[2] = { W (1, 100), W (2, 36) };   /* diff 64: not above */
    cr_assert_eq (s_pick (&p, T1, d1, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    struct rx_route_worker d2[2] = { W (1, 100), W (2, 35) };   /* 65 > 64, 100 > 52.5 */
    cr_assert_eq (s_pick (&p, T1, d2, 2, 0, &why), 2);
    cr_assert_eq (why, RX_ROUTE_BALANCE);
    p.ops->worker_removed (p.inst, 2);        /* 2 holds T1 now: forget it */
    struct rx_route_worker d3[2] = { W (1, 300), W (2, 200) };  /* 100 > 64, 300 = 200*1.5 */
    cr_assert_eq (s_pick (&p, T1, d3, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    s_close (&p);
}

Test (route_policies, cache_aware_forgets_a_removed_worker_at_once)
{
    struct pol p;
    s_open (&p, "cache_aware", NULL);
    struct rx_route_worker w[2] = { W (1, 0), W (2, 0) };
    p.ops->worker_added (p.inst, 1);
    p.ops->worker_added (p.inst, 2);
    int why = -1;
    cr_assert_eq (s_pick (&p, T1, w, 2, 0, &why), 1);
    cr_assert_eq (s_pick (&p, T1, w, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    /* Worker 1 failed: the caller removes it, then adds it back when it is
     * healthy again under the same id.  Its affinity is gone: the next
     * request for T1 is a miss, sent to the smaller tree. */
    p.ops->worker_removed (p.inst, 1);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 0);
    p.ops->worker_added (p.inst, 1);
    s_pick (&p, T2, (struct rx_route_worker[]) { W (2, 0) }, 1, 0, NULL);   /* 2 not empty */
    cr_assert_eq (s_pick (&p, T1, w, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* Removing an unknown worker, twice, or one never added is harmless. */
    p.ops->worker_removed (p.inst, 99);
    p.ops->worker_removed (p.inst, 2);
    p.ops->worker_removed (p.inst, 2);
    cr_assert_eq (p.ops->worker_size (p.inst, 2), 0);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), strlen (T1));
    s_close (&p);
}

Test (route_policies, cache_aware_evicts_on_tick_every_interval)
{
    struct pol p;
    s_open (&p, "cache_aware", "[router.cache_aware]\nmax_tree_size = 10\neviction_interval = 60s\n");
    struct rx_route_worker one[1] = { W (1, 0) };
    s_pick (&p, "aaaaaaaa", one, 1, 0, NULL);
    s_pick (&p, "bbbbbbbb", one, 1, 0, NULL);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 16);
    p.ops->tick (p.inst, 1000.0);              /* starts the clock */
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 16);
    p.ops->tick (p.inst, 1059.5);              /* not yet */
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 16);
    p.ops->tick (p.inst, 1060.0);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 8);   /* the older text went */
    /* The newer text still hits; the older one misses to the empty worker. */
    struct rx_route_worker w[2] = { W (1, 0), W (2, 0) };
    int why = -1;
    cr_assert_eq (s_pick (&p, "bbbbbbbb", w, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    cr_assert_eq (s_pick (&p, "aaaaaaaa", w, 2, 0, &why), 2);
    cr_assert_eq (why, RX_ROUTE_CACHE_MISS);
    /* Grow past the limit again: the next eviction waits another interval. */
    s_pick (&p, "cccccccc", one, 1, 0, NULL);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 16);
    p.ops->tick (p.inst, 1100.0);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 16);
    p.ops->tick (p.inst, 1120.0);
    cr_assert_eq (p.ops->worker_size (p.inst, 1), 8);
    cr_assert_eq (p.ops->worker_size (p.inst, 2), 8);    /* under the limit: kept */
    /* LRU order is pick order: worker 1 last got "bbbbbbbb" at pick 3 and
     * "cccccccc" at pick 5, so it kept "cccccccc". */
    cr_assert_eq (s_pick (&p, "cccccccc", w, 2, 0, &why), 1);
    cr_assert_eq (why, RX_ROUTE_CACHE_HIT);
    s_close (&p);
}
