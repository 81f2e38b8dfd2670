/* tests/unit/test_radix_cache.c -- the radix prefix cache: every operation
 * and edge case, then a property test that runs thousands of random
 * operation sequences against a naive reference model.
 *
 * Slot accounting is checked throughout with a real rx_kvpool: every slot is
 * either free in the pool, owned by the tree, or owned by a test "request" --
 * never lost, never owned twice. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "radix_cache.h"
#include "../testutil.h"

/* ---- harness: a pool, a cache, and a log of what the cache freed -------- */

struct freelog {
    size_t   n;               /* evicted nodes */
    size_t   cap;
    int32_t **slots;          /* copy of each node's slots */
    size_t  *len;
};

struct harness {
    rx_kvpool_t      *pool;
    rx_radix_cache_t *cache;
    struct freelog    log;
};

static void s_log_clear (struct freelog *l)
{
    for (size_t i = 0; i < l->n; i++) free (l->slots[i]);
    l->n = 0;
}

static void s_free_cb (void *ud, const int32_t *slots, size_t n)
{
    struct harness *h = ud;
    struct rx_err e = { 0 };
    cr_assert_gt (n, 0);
    /* The pool refuses a double free: a slot the tree frees must be one it
     * was given and still owns. */
    cr_assert_eq (rx_kvpool_free (h->pool, slots, (uint32_t) n, &e), RX_OK, "%s", e.msg);
    struct freelog *l = &h->log;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->slots = realloc (l->slots, l->cap * sizeof *l->slots);
        l->len = realloc (l->len, l->cap * sizeof *l->len);
    }
    l->slots[l->n] = malloc (n * sizeof *slots);
    memcpy (l->slots[l->n], slots, n * sizeof *slots);
    l->len[l->n++] = n;
}

static void s_h_init (struct harness *h, uint32_t n_slots, uint32_t ps)
{
    struct rx_err e = { 0 };
    memset (h, 0, sizeof *h);
    h->pool = rx_kvpool_new (n_slots, ps, &e);
    cr_assert_not_null (h->pool, "%s", e.msg);
    h->cache = rx_radix_cache_new (ps, s_free_cb, h, &e);
    cr_assert_not_null (h->cache, "%s", e.msg);
}

static void s_h_fini (struct harness *h)
{
    rx_radix_cache_destroy (&h->cache);
    cr_assert_null (h->cache);
    rx_kvpool_destroy (&h->pool);
    s_log_clear (&h->log);
    free (h->log.slots);
    free (h->log.len);
}

static void s_check (struct harness *h)
{
    struct rx_err e = { 0 };
    cr_assert_eq (rx_radix_cache_check (h->cache, &e), RX_OK, "%s", e.msg);
}

/* Allocate slots for tokens and insert them; the request's duplicate slots
 * (the part already cached) go back to the pool, as the scheduler does. */
static struct rx_radix_match s_put (struct harness *h, const int32_t *toks, size_t n)
{
    struct rx_err e = { 0 };
    int32_t *slots = malloc ((n ? n : 1) * sizeof *slots);
    cr_assert_eq (rx_kvpool_alloc (h->pool, (uint32_t) n, slots, &e), RX_OK, "%s", e.msg);
    struct rx_radix_match m;
    cr_assert_eq (rx_radix_cache_insert (h->cache, toks, slots, n, &m, &e), RX_OK, "%s", e.msg);
    cr_assert_eq (rx_kvpool_free (h->pool, slots, (uint32_t) m.prefix_len, &e), RX_OK);
    cr_assert_eq (rx_kvpool_free (h->pool, slots + m.len, (uint32_t) (n - m.len), &e), RX_OK);
    free (slots);
    s_check (h);
    return m;
}

static struct rx_radix_match s_match (struct harness *h, const int32_t *toks, size_t n,
                                      int32_t *slots)
{
    struct rx_err e = { 0 };
    struct rx_radix_match m;
    cr_assert_eq (rx_radix_cache_match (h->cache, toks, n, slots, &m, &e), RX_OK, "%s", e.msg);
    cr_assert_eq (m.len, m.prefix_len);
    cr_assert_eq (rx_radix_node_depth (m.last), m.len);
    s_check (h);
    return m;
}

/* Every slot is in the pool's free pages or the tree (no request here). */
static void s_all_accounted (struct harness *h)
{
    cr_assert_eq (rx_kvpool_used (h->pool), rx_radix_cache_total_size (h->cache),
                  "pool holds %u, tree %zu", rx_kvpool_used (h->pool),
                  rx_radix_cache_total_size (h->cache));
}

#define T(...) ((const int32_t[]) { __VA_ARGS__ }), (sizeof ((const int32_t[]) { __VA_ARGS__ }) / 4)

/* ---- unit tests ---------------------------------------------------------- */

Test (radix_cache, rejects_bad_arguments)
{
    struct rx_err e = { 0 };
    cr_assert_null (rx_radix_cache_new (0, s_free_cb, NULL, &e));
    cr_assert (strstr (e.msg, "page_size 0"), "%s", e.msg);
    cr_assert_null (rx_radix_cache_new (8192, s_free_cb, NULL, &e));
    cr_assert_null (rx_radix_cache_new (1, NULL, NULL, &e));
    cr_assert (strstr (e.msg, "free callback"), "%s", e.msg);
    rx_radix_cache_destroy (NULL);

    struct harness h;
    s_h_init (&h, 16, 1);
    struct rx_radix_match m;
    int32_t s[2] = { 0, 1 };
    cr_assert_eq (rx_radix_cache_match (h.cache, NULL, 3, NULL, &m, &e), RX_EINVAL);
    cr_assert (strstr (e.msg, "NULL"), "%s", e.msg);
    cr_assert_eq (rx_radix_cache_match (h.cache, s, 2, NULL, NULL, &e), RX_EINVAL);
    cr_assert_eq (rx_radix_cache_insert (h.cache, NULL, s, 2, &m, &e), RX_EINVAL);
    cr_assert_eq (rx_radix_cache_insert (h.cache, s, NULL, 2, &m, &e), RX_EINVAL);
    cr_assert_eq (rx_radix_cache_insert (h.cache, s, s, 2, NULL, &e), RX_EINVAL);
    int32_t bad[2] = { 3, -1 };
    cr_assert_eq (rx_radix_cache_insert (h.cache, s, bad, 2, &m, &e), RX_EINVAL);
    cr_assert (strstr (e.msg, "slot -1"), "%s", e.msg);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 0, "a refused insert takes nothing");
    cr_assert_eq (rx_radix_cache_lock (h.cache, NULL, &e), RX_EINVAL);
    cr_assert_eq (rx_radix_cache_unlock (h.cache, NULL, &e), RX_EINVAL);

    /* A node of another cache. */
    struct harness h2;
    s_h_init (&h2, 16, 1);
    struct rx_radix_match m2 = s_put (&h2, T (1, 2));
    cr_assert_eq (rx_radix_cache_lock (h.cache, m2.last, &e), RX_EINVAL);
    cr_assert (strstr (e.msg, "another cache"), "%s", e.msg);
    cr_assert_eq (rx_radix_cache_unlock (h.cache, m2.last, &e), RX_EINVAL);
    cr_assert_eq (rx_radix_node_lock_ref (m2.last), 0);
    s_h_fini (&h2);
    s_h_fini (&h);
}

Test (radix_cache, empty_cache_and_empty_prompt)
{
    struct harness h;
    s_h_init (&h, 16, 1);
    rx_radix_node_t *root = rx_radix_cache_root (h.cache);
    cr_assert_eq (rx_radix_node_depth (root), 0);
    cr_assert_null (rx_radix_node_parent (root));
    struct rx_radix_match m = s_match (&h, NULL, 0, NULL);
    cr_assert_eq (m.len, 0);
    cr_assert_eq (m.last, root);
    m = s_match (&h, T (4, 5, 6), NULL);
    cr_assert_eq (m.len, 0);
    cr_assert_eq (m.last, root);
    m = s_put (&h, NULL, 0);
    cr_assert_eq (m.len, 0);
    cr_assert_eq (m.prefix_len, 0);
    cr_assert_eq (m.last, root);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 0);
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 0);
    cr_assert_eq (rx_radix_cache_evict (h.cache, 100), 0);
    size_t locked = 9;
    cr_assert_eq (rx_radix_cache_flush (h.cache, &locked), 0);
    cr_assert_eq (locked, 0);
    /* Locking the root is a no-op. */
    struct rx_err e = { 0 };
    cr_assert_eq (rx_radix_cache_lock (h.cache, root, &e), RX_OK);
    cr_assert_eq (rx_radix_cache_unlock (h.cache, root, &e), RX_OK);
    cr_assert_eq (rx_radix_cache_protected_size (h.cache), 0);
    s_h_fini (&h);
}

Test (radix_cache, full_and_partial_matches_split_nodes)
{
    struct harness h;
    s_h_init (&h, 64, 1);
    struct rx_radix_match a = s_put (&h, T (1, 2, 3, 4));
    cr_assert_eq (a.prefix_len, 0);
    cr_assert_eq (a.len, 4);
    cr_assert_eq (rx_radix_node_depth (a.last), 4);
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 1);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 4);
    cr_assert_eq (rx_radix_cache_evictable_size (h.cache), 4);

    /* Full match returns the inserted slots (a fresh pool: 0..3). */
    int32_t s[8];
    struct rx_radix_match m = s_match (&h, T (1, 2, 3, 4), s);
    cr_assert_eq (m.len, 4);
    cr_assert_eq (m.last, a.last);
    int32_t want[] = { 0, 1, 2, 3 };
    cr_assert_arr_eq (s, want, sizeof want);
    /* A longer prompt matches the cached part only. */
    m = s_match (&h, T (1, 2, 3, 4, 5, 6), s);
    cr_assert_eq (m.len, 4);
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 1);

    /* Ends inside the edge: the node is split there. */
    memset (s, 0xff, sizeof s);
    m = s_match (&h, T (1, 2, 9), s);
    cr_assert_eq (m.len, 2);
    cr_assert_eq (s[0], 0);
    cr_assert_eq (s[1], 1);
    cr_assert_eq (s[2], -1, "nothing written past the match");
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 2);
    cr_assert_eq (rx_radix_node_depth (m.last), 2);
    /* The old handle is now the lower half and keeps its end depth. */
    cr_assert_eq (rx_radix_node_depth (a.last), 4);
    cr_assert_eq (rx_radix_node_parent (a.last), m.last);
    cr_assert_eq (rx_radix_node_parent (m.last), rx_radix_cache_root (h.cache));
    cr_assert_gt (rx_radix_node_seq (m.last), rx_radix_node_seq (a.last));
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 4, "a split adds no tokens");

    /* No match on the first token. */
    m = s_match (&h, T (2, 1), s);
    cr_assert_eq (m.len, 0);
    s_all_accounted (&h);
    s_h_fini (&h);
}

Test (radix_cache, insert_prefix_extension_and_divergence)
{
    struct harness h;
    s_h_init (&h, 64, 1);
    struct rx_radix_match a = s_put (&h, T (1, 2, 3, 4));

    /* A prefix of an existing key: all cached, split at its end. */
    struct rx_radix_match b = s_put (&h, T (1, 2));
    cr_assert_eq (b.prefix_len, 2);
    cr_assert_eq (b.len, 2);
    cr_assert_eq (rx_radix_node_depth (b.last), 2);
    cr_assert_eq (rx_radix_node_parent (a.last), b.last);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 4);

    /* Same key again: nothing new. */
    struct rx_radix_match c = s_put (&h, T (1, 2, 3, 4));
    cr_assert_eq (c.prefix_len, 4);
    cr_assert_eq (c.last, a.last);
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 2);

    /* A longer key extends the leaf with a new child. */
    struct rx_radix_match d = s_put (&h, T (1, 2, 3, 4, 5, 6));
    cr_assert_eq (d.prefix_len, 4);
    cr_assert_eq (d.len, 6);
    cr_assert_eq (rx_radix_node_parent (d.last), a.last);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 6);

    /* Diverging inside an edge: split, new sibling. */
    struct rx_radix_match f = s_put (&h, T (1, 2, 3, 7, 8));
    cr_assert_eq (f.prefix_len, 3);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 8);
    rx_radix_node_t *fork = rx_radix_node_parent (f.last);
    cr_assert_eq (rx_radix_node_depth (fork), 3);
    cr_assert_eq (rx_radix_node_parent (a.last), fork);
    cr_assert_eq (rx_radix_node_depth (a.last), 4);

    /* Every key matches with the slots the tree kept. */
    int32_t s1[8], s2[8];
    cr_assert_eq (s_match (&h, T (1, 2, 3, 4, 5, 6), s1).len, 6);
    cr_assert_eq (s_match (&h, T (1, 2, 3, 7, 8), s2).len, 5);
    cr_assert_arr_eq (s1, s2, 3 * sizeof *s1, "shared prefix, shared slots");
    s_all_accounted (&h);
    cr_assert_eq (rx_radix_cache_flush (h.cache, NULL), 8);
    cr_assert_eq (rx_kvpool_used (h.pool), 0);
    s_h_fini (&h);
}

Test (radix_cache, locks_protect_and_account)
{
    struct harness h;
    s_h_init (&h, 64, 1);
    struct rx_err e = { 0 };
    struct rx_radix_match a = s_put (&h, T (1, 2, 3, 4));
    struct rx_radix_match b = s_put (&h, T (1, 2, 5, 6, 7));   /* [1,2] [3,4] [5,6,7] */
    cr_assert_eq (rx_radix_cache_lock (h.cache, a.last, &e), RX_OK);
    cr_assert_eq (rx_radix_cache_protected_size (h.cache), 4);
    cr_assert_eq (rx_radix_cache_evictable_size (h.cache), 3);
    cr_assert_eq (rx_radix_node_lock_ref (a.last), 1);
    rx_radix_node_t *fork = rx_radix_node_parent (a.last);
    cr_assert_eq (rx_radix_node_lock_ref (fork), 1);
    s_check (&h);

    /* Two locks through the shared prefix. */
    cr_assert_eq (rx_radix_cache_lock (h.cache, b.last, &e), RX_OK);
    cr_assert_eq (rx_radix_node_lock_ref (fork), 2);
    cr_assert_eq (rx_radix_cache_protected_size (h.cache), 7);
    cr_assert_eq (rx_radix_cache_evict (h.cache, 100), 0, "everything is locked");
    size_t locked;
    cr_assert_eq (rx_radix_cache_flush (h.cache, &locked), 0);
    cr_assert_eq (locked, 7);

    cr_assert_eq (rx_radix_cache_unlock (h.cache, b.last, &e), RX_OK);
    cr_assert_eq (rx_radix_cache_evictable_size (h.cache), 3);
    cr_assert_eq (rx_radix_cache_unlock (h.cache, b.last, &e), RX_EINVAL);
    cr_assert (strstr (e.msg, "not locked"), "%s", e.msg);
    cr_assert_eq (rx_radix_node_lock_ref (fork), 1, "a refused unlock changes nothing");

    /* Only the unlocked leaf goes; the locked path stays. */
    cr_assert_eq (rx_radix_cache_evict (h.cache, 100), 3);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 4);
    cr_assert_eq (rx_radix_cache_flush (h.cache, &locked), 0);
    cr_assert_eq (locked, 4);
    int32_t s[4];
    cr_assert_eq (s_match (&h, T (1, 2, 3, 4), s).len, 4);
    s_all_accounted (&h);

    /* A split under a lock: both halves stay locked. */
    struct rx_radix_match m = s_match (&h, T (1, 9), s);
    cr_assert_eq (m.len, 1);
    cr_assert_eq (rx_radix_node_lock_ref (m.last), 1);
    cr_assert_eq (rx_radix_cache_protected_size (h.cache), 4);

    cr_assert_eq (rx_radix_cache_unlock (h.cache, a.last, &e), RX_OK);
    cr_assert_eq (rx_radix_cache_protected_size (h.cache), 0);
    cr_assert_eq (rx_radix_cache_evictable_size (h.cache), 4);
    cr_assert_eq (rx_radix_cache_evict (h.cache, 4), 4);
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 0);
    cr_assert_eq (rx_kvpool_used (h.pool), 0);
    s_h_fini (&h);
}

/* The log holds the nodes freed so far; node i of it must hold slots
 * want[0..n). */
static void s_log_is (struct harness *h, size_t i, const int32_t *want, size_t n)
{
    cr_assert_gt (h->log.n, i, "only %zu nodes freed", h->log.n);
    cr_assert_eq (h->log.len[i], n, "node %zu: %zu slots, want %zu", i, h->log.len[i], n);
    cr_assert_arr_eq (h->log.slots[i], want, n * sizeof *want);
}

Test (radix_cache, eviction_is_lru_by_logical_clock)
{
    struct harness h;
    s_h_init (&h, 64, 1);
    rx_radix_cache_tick (h.cache);
    s_put (&h, T (1, 1));         /* slots 0,1  at t=1 */
    rx_radix_cache_tick (h.cache);
    s_put (&h, T (2, 2));         /* slots 2,3  at t=2 */
    rx_radix_cache_tick (h.cache);
    s_put (&h, T (3, 3));         /* slots 4,5  at t=3 */
    cr_assert_eq (rx_radix_cache_clock (h.cache), 3);
    rx_radix_cache_tick (h.cache);
    s_match (&h, T (1, 1), NULL); /* touch A at t=4 */

    /* B is now the least recently used; evict(1) frees a whole node. */
    cr_assert_eq (rx_radix_cache_evict (h.cache, 1), 2);
    s_log_is (&h, 0, T (2, 3));
    cr_assert_eq (rx_radix_cache_evict (h.cache, 0), 0, "evict(0) frees nothing");
    cr_assert_eq (rx_radix_cache_evict (h.cache, 3), 4);
    s_log_is (&h, 1, T (4, 5));
    s_log_is (&h, 2, T (0, 1));
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 0, "evicted to exactly zero");
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 0);
    cr_assert_eq (rx_kvpool_used (h.pool), 0);
    s_check (&h);
    s_h_fini (&h);
}

Test (radix_cache, eviction_ties_go_to_the_older_node_and_parents_follow)
{
    struct harness h;
    s_h_init (&h, 64, 1);
    /* All at the same clock: creation order decides. */
    s_put (&h, T (1, 2, 3));      /* seq 1, slots 0,1,2 */
    /* splits: [1,2] seq 2 (slots 0,1), [3] seq 1 (slot 2), [4] seq 3 (gets
     * slots 3,4,5, keeps 5, the duplicates 3,4 go back to the pool) */
    s_put (&h, T (1, 2, 4));
    s_put (&h, T (7));            /* seq 4, slot 4 (LIFO: the last freed) */
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 4);
    /* Leaves [3] (seq 1), [4] (seq 3), [7] (seq 4); [1,2] becomes a leaf
     * after its children go and joins with its own key (t=0, seq 2). */
    cr_assert_eq (rx_radix_cache_flush (h.cache, NULL), 5);
    cr_assert_eq (h.log.n, 4);
    s_log_is (&h, 0, T (2));
    s_log_is (&h, 1, T (5));
    s_log_is (&h, 2, T (0, 1));
    s_log_is (&h, 3, T (4));
    s_h_fini (&h);
}

Test (radix_cache, evictions_are_deterministic)
{
    /* Two caches fed the same operations free the same slots in the same
     * order (what keeps ranks in step). */
    struct harness h[2];
    for (int k = 0; k < 2; k++) {
        s_h_init (&h[k], 4096, 1);
        uint64_t st = 42;
        for (int i = 0; i < 300; i++) {
            int32_t toks[12];
            size_t n = 1 + (st = st * 6364136223846793005ull + 1442695040888963407ull) % 12;
            for (size_t j = 0; j < n; j++)
                toks[j] = (int32_t) ((st >> (16 + 2 * j)) % 3);
            if (i % 7 == 0) rx_radix_cache_tick (h[k].cache);
            s_put (&h[k], toks, n);
            if (i % 11 == 0) rx_radix_cache_evict (h[k].cache, 5);
        }
        rx_radix_cache_flush (h[k].cache, NULL);
    }
    cr_assert_eq (h[0].log.n, h[1].log.n);
    cr_assert_gt (h[0].log.n, 50);
    for (size_t i = 0; i < h[0].log.n; i++) {
        cr_assert_eq (h[0].log.len[i], h[1].log.len[i]);
        cr_assert_arr_eq (h[0].log.slots[i], h[1].log.slots[i], h[0].log.len[i] * 4);
    }
    s_h_fini (&h[0]);
    s_h_fini (&h[1]);
}

Test (radix_cache, page_size_16)
{
    struct harness h;
    s_h_init (&h, 256, 16);
    int32_t toks[64], s[64];
    for (int i = 0; i < 64; i++) toks[i] = i;
    /* 40 tokens: only 32 (2 pages) go in; the caller keeps the tail. */
    struct rx_radix_match a = s_put (&h, toks, 40);
    cr_assert_eq (a.len, 32);
    cr_assert_eq (a.prefix_len, 0);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 32);
    s_all_accounted (&h);
    /* A short prompt (under a page) matches nothing. */
    cr_assert_eq (s_match (&h, toks, 15, s).len, 0);
    cr_assert_eq (s_match (&h, toks, 40, s).len, 32);
    for (int i = 0; i < 32; i++) cr_assert_eq (s[i], i);
    /* A mismatch at token 20 keeps only the first whole page. */
    int32_t other[40];
    memcpy (other, toks, sizeof other);
    other[20] = 99;
    struct rx_radix_match m = s_match (&h, other, 40, s);
    cr_assert_eq (m.len, 16);
    cr_assert_eq (rx_radix_node_depth (a.last), 32);
    cr_assert_eq (rx_radix_node_parent (a.last), m.last);
    /* Inserting it adds one page beside the old one. */
    struct rx_radix_match b = s_put (&h, other, 40);
    cr_assert_eq (b.prefix_len, 16);
    cr_assert_eq (b.len, 32);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 48);

    /* Children are told apart by their whole first page, not its first
     * token: these two differ only at token 17. */
    int32_t x[32], y[32];
    for (int i = 0; i < 32; i++) x[i] = y[i] = 1000 + i;
    y[17] = 5;
    s_put (&h, x, 32);
    struct rx_radix_match yy = s_put (&h, y, 32);
    cr_assert_eq (yy.prefix_len, 16);
    x[1] = 7;   /* same first token, another first page: a new root child */
    struct rx_radix_match xx = s_put (&h, x, 32);
    cr_assert_eq (xx.prefix_len, 0);
    cr_assert_eq (s_match (&h, x, 32, s).len, 32);
    cr_assert_eq (s_match (&h, y, 32, s).len, 32);
    cr_assert_eq (rx_radix_cache_total_size (h.cache), 48 + 32 + 16 + 32);
    s_all_accounted (&h);
    cr_assert_eq (rx_radix_cache_flush (h.cache, NULL), 128);
    for (size_t i = 0; i < h.log.n; i++)
        cr_assert_eq (h.log.len[i] % 16, 0, "only whole pages are freed");
    cr_assert_eq (rx_kvpool_used (h.pool), 0);
    s_h_fini (&h);
}

Test (radix_cache, many_children_large_vocab)
{
    /* A root with thousands of children (ids up to ~150k) exercises the
     * child table's growth and deletion. */
    struct harness h;
    s_h_init (&h, 8192, 1);
    for (int32_t i = 0; i < 3000; i++) {
        rx_radix_cache_tick (h.cache);
        s_put (&h, T (150000 - 37 * i, i));
    }
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 3000);
    /* Evict the oldest half, then everything must still match or not. */
    cr_assert_eq (rx_radix_cache_evict (h.cache, 3000), 3000);
    s_check (&h);
    for (int32_t i = 0; i < 3000; i++) {
        size_t len = s_match (&h, T (150000 - 37 * i, i), NULL).len;
        cr_assert_eq (len, i < 1500 ? 0 : 2, "key %d", i);
    }
    s_all_accounted (&h);
    s_h_fini (&h);
}

Test (radix_cache, deep_chain)
{
    /* One node per inserted chunk: a chain thousands of nodes deep. */
    struct harness h;
    s_h_init (&h, 8192, 1);
    int32_t toks[4000];
    for (int i = 0; i < 4000; i++) toks[i] = i % 5;
    for (size_t n = 1; n <= 4000; n++) {
        struct rx_err e = { 0 };
        int32_t slot;
        cr_assert_eq (rx_kvpool_alloc (h.pool, 1, &slot, &e), RX_OK);
        int32_t slots[4000];
        struct rx_radix_match m;
        cr_assert_eq (rx_radix_cache_match (h.cache, toks, n - 1, slots, &m, &e), RX_OK);
        slots[n - 1] = slot;
        cr_assert_eq (rx_radix_cache_insert (h.cache, toks, slots, n, &m, &e), RX_OK);
        cr_assert_eq (m.prefix_len, n - 1);
    }
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 4000);
    s_check (&h);
    struct rx_tree_view v;
    rx_radix_cache_tree_view (h.cache, &v);
    struct rx_radix_match m = s_match (&h, toks, 4000, NULL);
    uintptr_t x = (uintptr_t) m.last;
    size_t hops = 0;
    while (x != v.root) {
        x = v.parent (v.ctx, x);
        hops++;
    }
    cr_assert_eq (hops, 4000);
    cr_assert_eq (v.parent (v.ctx, v.root), v.root, "root -> root");
    s_h_fini (&h);    /* destroy is iterative: no stack overflow */
}

struct visit_state {
    size_t nodes, tokens, stop_at;
    const rx_radix_node_t *seen[64];
};

static int s_visit_cb (void *ud, const struct rx_radix_node_info *in)
{
    struct visit_state *v = ud;
    int parent_seen = in->start == 0 && in->parent == NULL;
    cr_assert_not (parent_seen, "every visited node has a parent (the root is not visited)");
    parent_seen = in->start == 0;           /* a child of the root */
    for (size_t i = 0; i < v->nodes; i++) parent_seen |= v->seen[i] == in->parent;
    cr_assert (parent_seen, "parents come before children");
    cr_assert_eq (in->start + in->len, rx_radix_node_depth (in->node));
    cr_assert_eq (in->lock_ref, rx_radix_node_lock_ref (in->node));
    cr_assert_eq (in->seq, rx_radix_node_seq (in->node));
    v->seen[v->nodes++] = in->node;
    v->tokens += in->len;
    return v->nodes == v->stop_at ? 7 : 0;
}

Test (radix_cache, visit_and_tree_view)
{
    struct harness h;
    s_h_init (&h, 64, 1);
    s_put (&h, T (1, 2, 3));
    s_put (&h, T (1, 2, 4, 5));
    s_put (&h, T (6));
    s_put (&h, T (9, 9));
    cr_assert_eq (rx_radix_cache_node_count (h.cache), 5);
    struct visit_state v = { .stop_at = 99 };
    cr_assert_eq (rx_radix_cache_visit (h.cache, s_visit_cb, &v), 0);
    cr_assert_eq (v.nodes, 5);
    cr_assert_eq (v.tokens, rx_radix_cache_total_size (h.cache));
    struct visit_state w = { .stop_at = 3 };
    cr_assert_eq (rx_radix_cache_visit (h.cache, s_visit_cb, &w), 7, "stops when fn says so");
    cr_assert_eq (w.nodes, 3);

    struct rx_tree_view tv;
    rx_radix_cache_tree_view (h.cache, &tv);
    cr_assert_eq (tv.ctx, h.cache);
    struct rx_radix_match m = s_match (&h, T (1, 2, 4, 5), NULL);
    uintptr_t p = tv.parent (tv.ctx, (uintptr_t) m.last);
    cr_assert_eq (rx_radix_node_depth ((rx_radix_node_t *) p), 2);
    cr_assert_eq (tv.parent (tv.ctx, p), tv.root);
    cr_assert_eq (tv.root, (uintptr_t) rx_radix_cache_root (h.cache));
    s_h_fini (&h);
}

/* ---- the property test -------------------------------------------------- */

/* The reference: a flat list of cached entries, each the FULL token path
 * from the root to the end of one node, with that node's slots, lock count,
 * access time and creation seq.  Every question is answered by scanning the
 * whole list and comparing whole paths -- no tree pointers, no child index,
 * no heap, no size counters -- so it shares no machinery with the code under
 * test, only the specification:
 *   - match/insert walk page-aligned keys; a match or insert that ends (or
 *     diverges) inside a node splits it: the upper part is a new entry (next
 *     seq) with the same lock count and access time, the lower part keeps
 *     its seq;
 *   - match/insert stamp every entry on the path to the node they end at
 *     with the clock (a new leaf too);
 *   - lock/unlock add/subtract one on every entry on the path;
 *   - evict repeatedly removes the unlocked entry without children that has
 *     the smallest (access time, seq) until enough tokens are freed. */
struct rent {
    int32_t *path;     /* [end] */
    int32_t *slots;    /* [end - start] */
    size_t   start, end;
    uint32_t lock;
    uint64_t last, seq;
};

struct ref {
    struct rent *e;    /* in seq order */
    size_t       n, cap;
    uint32_t     ps;
    uint64_t     clock, seq;
};

/* Entry starting at depth pos whose path agrees with tokens[0..pos+ps). */
static long r_child (const struct ref *r, const int32_t *tokens, size_t pos)
{
    long found = -1;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].start == pos
            && memcmp (r->e[i].path, tokens, (pos + r->ps) * sizeof *tokens) == 0) {
            cr_assert_eq (found, -1, "reference: two entries for one page");
            found = (long) i;
        }
    return found;
}

/* Is entry a on the path of entry b (a == b included)? */
static int r_on_path (const struct rent *a, const struct rent *b)
{
    return a->end <= b->end && memcmp (a->path, b->path, a->end * sizeof *a->path) == 0;
}

static void r_push (struct ref *r, struct rent x)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 32;
        r->e = realloc (r->e, r->cap * sizeof *r->e);
    }
    r->e[r->n++] = x;
}

/* Split entry i so that an entry ends at depth `at`; returns the new upper
 * entry's index. */
static long r_split (struct ref *r, long i, size_t at)
{
    struct rent *lo = &r->e[i];
    size_t m = at - lo->start, rest = lo->end - at;
    struct rent up = {
        .path = malloc (at * sizeof (int32_t)), .slots = malloc (m * sizeof (int32_t)),
        .start = lo->start, .end = at, .lock = lo->lock, .last = lo->last, .seq = ++r->seq,
    };
    memcpy (up.path, lo->path, at * sizeof (int32_t));
    memcpy (up.slots, lo->slots, m * sizeof (int32_t));
    memmove (lo->slots, lo->slots + m, rest * sizeof (int32_t));
    lo->start = at;
    r_push (r, up);
    return (long) r->n - 1;
}

static void r_touch (struct ref *r, long i)
{
    if (i < 0) return;
    for (size_t j = 0; j < r->n; j++)
        if (r_on_path (&r->e[j], &r->e[i])) r->e[j].last = r->clock;
}

/* Walk; returns the entry the match ends at (-1: root) and its length. */
static long r_walk (struct ref *r, const int32_t *tokens, size_t n, int32_t *slots_out,
                    size_t *len)
{
    n = n / r->ps * r->ps;
    size_t pos = 0;
    long at = -1;
    while (pos < n) {
        long i = r_child (r, tokens, pos);
        if (i < 0) break;
        struct rent *x = &r->e[i];
        size_t m = 0;
        while (pos + m < n && x->start + m < x->end && x->path[pos + m] == tokens[pos + m]) m++;
        m = m / r->ps * r->ps;
        if (slots_out) memcpy (slots_out + pos, x->slots, m * sizeof *slots_out);
        if (x->start + m < x->end) {
            at = r_split (r, i, pos + m);
            pos += m;
            break;
        }
        at = i;
        pos += m;
    }
    *len = pos;
    return at;
}

static long r_match (struct ref *r, const int32_t *tokens, size_t n, int32_t *slots_out,
                     size_t *len)
{
    long at = r_walk (r, tokens, n, slots_out, len);
    r_touch (r, at);
    return at;
}

static long r_insert (struct ref *r, const int32_t *tokens, const int32_t *slots, size_t n,
                      size_t *prefix)
{
    n = n / r->ps * r->ps;
    long at = r_walk (r, tokens, n, NULL, prefix);
    if (*prefix < n) {
        struct rent leaf = {
            .path = malloc (n * sizeof (int32_t)),
            .slots = malloc ((n - *prefix) * sizeof (int32_t)),
            .start = *prefix, .end = n, .last = r->clock, .seq = ++r->seq,
        };
        memcpy (leaf.path, tokens, n * sizeof (int32_t));
        memcpy (leaf.slots, slots + *prefix, (n - *prefix) * sizeof (int32_t));
        r_push (r, leaf);
        at = (long) r->n - 1;
    }
    r_touch (r, at);
    return at;
}

/* The entry ending at depth len on tokens' path (-1: root). */
static long r_find (const struct ref *r, const int32_t *tokens, size_t len)
{
    if (len == 0) return -1;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].end == len && memcmp (r->e[i].path, tokens, len * sizeof *tokens) == 0)
            return (long) i;
    cr_assert_fail ("reference: no entry ends at depth %zu", len);
    return -1;
}

static void r_lock (struct ref *r, const int32_t *tokens, size_t len, int delta)
{
    long i = r_find (r, tokens, len);
    if (i < 0) return;
    for (size_t j = 0; j < r->n; j++)
        if (r_on_path (&r->e[j], &r->e[i])) {
            cr_assert (delta > 0 || r->e[j].lock > 0);
            r->e[j].lock += (uint32_t) delta;
        }
}

static int r_has_child (const struct ref *r, size_t i)
{
    for (size_t j = 0; j < r->n; j++)
        if (j != i && r->e[j].start == r->e[i].end && r_on_path (&r->e[i], &r->e[j])) return 1;
    return 0;
}

static void r_remove (struct ref *r, size_t i)
{
    free (r->e[i].path);
    free (r->e[i].slots);
    memmove (r->e + i, r->e + i + 1, (r->n - i - 1) * sizeof *r->e);
    r->n--;
}

/* Evict; appends each victim's slots to log (as the cache's callback does). */
static size_t r_evict (struct ref *r, size_t want, struct freelog *log)
{
    size_t freed = 0;
    while (freed < want) {
        long best = -1;
        for (size_t i = 0; i < r->n; i++) {
            struct rent *x = &r->e[i];
            if (x->lock || r_has_child (r, i)) continue;
            if (best < 0 || x->last < r->e[best].last
                || (x->last == r->e[best].last && x->seq < r->e[best].seq))
                best = (long) i;
        }
        if (best < 0) break;
        struct rent *x = &r->e[best];
        size_t n = x->end - x->start;
        if (log->n == log->cap) {
            log->cap = log->cap ? 2 * log->cap : 16;
            log->slots = realloc (log->slots, log->cap * sizeof *log->slots);
            log->len = realloc (log->len, log->cap * sizeof *log->len);
        }
        log->slots[log->n] = malloc (n * sizeof (int32_t));
        memcpy (log->slots[log->n], x->slots, n * sizeof (int32_t));
        log->len[log->n++] = n;
        freed += n;
        r_remove (r, (size_t) best);
    }
    return freed;
}

static void r_free (struct ref *r)
{
    while (r->n) r_remove (r, r->n - 1);
    free (r->e);
}

/* A simulated request, as the scheduler will drive the cache. */
struct req {
    int32_t         *toks, *slots;
    size_t           n;            /* tokens with KV */
    size_t           protected_;   /* slots[0..protected_) belong to the tree */
    rx_radix_node_t *last;         /* locked; depth == protected_ */
};

struct prop {
    uint64_t          seed, rng;
    int               op;
    uint32_t          ps, vocab, n_slots;
    size_t            maxlen;
    struct harness    h;
    struct ref        r;
    struct freelog    rlog;
    struct req        req[4];
    int               nreq;
    int32_t         **hist;        /* finished sequences, for shared prefixes */
    size_t           *hist_n;
    int               nhist;
    uint8_t          *seen;        /* per slot, for the ownership check */
    struct { uint64_t ops, evicted_nodes, splits, hits; } stats;
};

#define P_ASSERT(p, cond, fmt, ...)                                                \
    cr_assert ((cond), fmt " [property test: page_size %u, seed %llu, op %d]",     \
               ##__VA_ARGS__, (p)->ps, (unsigned long long) (p)->seed, (p)->op)

static uint64_t p_rand (struct prop *p, uint64_t n)
{
    uint64_t z = (p->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return n ? z % n : 0;
}

struct tnode {
    uint64_t seq, last;
    size_t start, len;
    uint32_t lock;
    const int32_t *tokens, *slots;
};

struct collect {
    struct tnode v[4096];
    size_t n;
};

static int p_collect (void *ud, const struct rx_radix_node_info *in)
{
    struct collect *c = ud;
    if (c->n == 4096) return 1;
    c->v[c->n++] = (struct tnode) { in->seq, in->last_access, in->start, in->len,
                                    in->lock_ref, in->tokens, in->slots };
    return 0;
}

static int p_by_seq (const void *a, const void *b)
{
    uint64_t x = ((const struct tnode *) a)->seq, y = ((const struct tnode *) b)->seq;
    return (x > y) - (x < y);
}

static void p_compare_logs (struct prop *p)
{
    struct freelog *a = &p->h.log, *b = &p->rlog;
    P_ASSERT (p, a->n == b->n, "cache evicted %zu nodes, reference %zu", a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        P_ASSERT (p, a->len[i] == b->len[i] && memcmp (a->slots[i], b->slots[i],
                                                       a->len[i] * sizeof (int32_t)) == 0,
                  "eviction %zu differs (%zu vs %zu slots, first %d vs %d)", i, a->len[i],
                  b->len[i], a->slots[i][0], b->slots[i][0]);
    }
    p->stats.evicted_nodes += a->n;
    s_log_clear (a);
    s_log_clear (b);
}

/* After every operation: the whole tree equals the reference, the counters
 * agree, the internal invariants hold, and every slot is owned exactly once. */
static void p_verify (struct prop *p)
{
    struct rx_err e = { 0 };
    rx_radix_cache_t *c = p->h.cache;
    P_ASSERT (p, rx_radix_cache_check (c, &e) == RX_OK, "%s", e.msg);
    static struct collect col;
    col.n = 0;
    P_ASSERT (p, rx_radix_cache_visit (c, p_collect, &col) == 0, "visit");
    qsort (col.v, col.n, sizeof col.v[0], p_by_seq);
    P_ASSERT (p, col.n == p->r.n, "cache has %zu nodes, reference %zu", col.n, p->r.n);
    P_ASSERT (p, rx_radix_cache_node_count (c) == p->r.n, "node count");
    size_t ev = 0, pr = 0;
    for (size_t i = 0; i < col.n; i++) {
        struct tnode *t = &col.v[i];
        struct rent *x = &p->r.e[i];
        size_t len = x->end - x->start;
        P_ASSERT (p, t->seq == x->seq, "node %zu: seq %llu vs %llu", i,
                  (unsigned long long) t->seq, (unsigned long long) x->seq);
        P_ASSERT (p, t->start == x->start && t->len == len, "seq %llu: edge [%zu,+%zu) vs "
                  "[%zu,+%zu)", (unsigned long long) t->seq, t->start, t->len, x->start, len);
        P_ASSERT (p, memcmp (t->tokens, x->path + x->start, len * 4) == 0, "seq %llu: tokens",
                  (unsigned long long) t->seq);
        P_ASSERT (p, memcmp (t->slots, x->slots, len * 4) == 0, "seq %llu: slots",
                  (unsigned long long) t->seq);
        P_ASSERT (p, t->lock == x->lock, "seq %llu: lock %u vs %u", (unsigned long long) t->seq,
                  t->lock, x->lock);
        P_ASSERT (p, t->last == x->last, "seq %llu: last access %llu vs %llu",
                  (unsigned long long) t->seq, (unsigned long long) t->last,
                  (unsigned long long) x->last);
        if (x->lock) pr += len; else ev += len;
    }
    P_ASSERT (p, rx_radix_cache_evictable_size (c) == ev, "evictable %zu vs %zu",
              rx_radix_cache_evictable_size (c), ev);
    P_ASSERT (p, rx_radix_cache_protected_size (c) == pr, "protected %zu vs %zu",
              rx_radix_cache_protected_size (c), pr);

    /* Slot ownership: tree + requests, each slot once, all allocated, and
     * nothing else allocated. */
    memset (p->seen, 0, p->n_slots);
    size_t owned = 0;
    for (size_t i = 0; i < p->r.n; i++)
        for (size_t j = 0; j < p->r.e[i].end - p->r.e[i].start; j++) {
            int32_t s = p->r.e[i].slots[j];
            P_ASSERT (p, rx_kvpool_is_allocated (p->h.pool, s), "tree slot %d is free", s);
            P_ASSERT (p, !p->seen[s], "slot %d owned twice", s);
            p->seen[s] = 1;
            owned++;
        }
    for (int k = 0; k < p->nreq; k++) {
        struct req *q = &p->req[k];
        for (size_t j = q->protected_; j < q->n; j++) {
            int32_t s = q->slots[j];
            P_ASSERT (p, rx_kvpool_is_allocated (p->h.pool, s), "request slot %d is free", s);
            P_ASSERT (p, !p->seen[s], "slot %d owned twice (request %d)", s, k);
            p->seen[s] = 1;
            owned++;
        }
    }
    P_ASSERT (p, rx_kvpool_used (p->h.pool) == owned, "pool has %u slots out, owners %zu: "
              "a slot was lost", rx_kvpool_used (p->h.pool), owned);
}

/* Random tokens; often the prefix of an earlier sequence (so they share). */
static size_t p_prompt (struct prop *p, int32_t *toks)
{
    size_t n = 0, want = (size_t) p_rand (p, p->maxlen / 2 + 1);
    if (p->nhist && p_rand (p, 3) != 0) {
        int k = (int) p_rand (p, (uint64_t) p->nhist);
        n = (size_t) p_rand (p, p->hist_n[k] + 1);
        if (n > want) n = want;
        memcpy (toks, p->hist[k], n * sizeof *toks);
    }
    while (n < want) toks[n++] = (int32_t) p_rand (p, p->vocab);
    return n;
}

/* Match in both; the cache's slots go to slots_out if not NULL. */
static void p_cmp_match (struct prop *p, const int32_t *toks, size_t n, int32_t *slots_out,
                         struct rx_radix_match *m)
{
    struct rx_err e = { 0 };
    int32_t *s1 = malloc ((n + 1) * 4), *s2 = malloc ((n + 1) * 4);
    size_t before = p->r.n, rlen;
    P_ASSERT (p, rx_radix_cache_match (p->h.cache, toks, n, s1, m, &e) == RX_OK, "%s", e.msg);
    r_match (&p->r, toks, n, s2, &rlen);
    P_ASSERT (p, m->len == rlen, "matched %zu, reference %zu", m->len, rlen);
    P_ASSERT (p, memcmp (s1, s2, rlen * 4) == 0, "matched slots differ");
    P_ASSERT (p, rx_radix_node_depth (m->last) == m->len, "last node depth");
    p->stats.splits += p->r.n - before;
    p->stats.hits += rlen;
    if (slots_out) memcpy (slots_out, s1, rlen * 4);
    free (s1);
    free (s2);
}

/* Make room for n more slots after last_slot: allocate, evicting (in both
 * the cache and the reference) when the pool is short. */
static int p_alloc (struct prop *p, int32_t last_slot, size_t n, int32_t *out)
{
    struct rx_err e = { 0 };
    int rc = rx_kvpool_alloc_extend (p->h.pool, last_slot, (uint32_t) n, out, &e);
    if (rc == RX_EAGAIN) {
        size_t need = n + p->ps;    /* generous: whole pages, partial tail */
        size_t a = rx_radix_cache_evict (p->h.cache, need);
        size_t b = r_evict (&p->r, need, &p->rlog);
        P_ASSERT (p, a == b, "evict under pressure freed %zu vs %zu", a, b);
        p_compare_logs (p);
        rc = rx_kvpool_alloc_extend (p->h.pool, last_slot, (uint32_t) n, out, &e);
    }
    P_ASSERT (p, rc == RX_OK || rc == RX_EAGAIN, "%s", e.msg);
    return rc;
}

static void p_lock (struct prop *p, struct req *q, rx_radix_node_t *node, size_t len, int delta)
{
    struct rx_err e = { 0 };
    int rc = delta > 0 ? rx_radix_cache_lock (p->h.cache, node, &e)
                       : rx_radix_cache_unlock (p->h.cache, node, &e);
    P_ASSERT (p, rc == RX_OK, "%s", e.msg);
    r_lock (&p->r, q->toks, len, delta);
}

static void p_free_slots (struct prop *p, const int32_t *s, size_t n)
{
    struct rx_err e = { 0 };
    P_ASSERT (p, rx_kvpool_free (p->h.pool, s, (uint32_t) n, &e) == RX_OK, "%s", e.msg);
}

static void p_remember (struct prop *p, const struct req *q)
{
    int k = p->nhist < 16 ? p->nhist++ : (int) p_rand (p, 16);
    free (p->hist[k]);
    p->hist[k] = malloc ((q->n + 1) * 4);
    memcpy (p->hist[k], q->toks, q->n * 4);
    p->hist_n[k] = q->n;
}

static void p_drop (struct prop *p, int k)
{
    free (p->req[k].toks);
    free (p->req[k].slots);
    p->req[k] = p->req[--p->nreq];
}

/* Insert what request k has so far (SGLang's cache_unfinished_req /
 * cache_finished_req): the tree takes the new whole pages, the request
 * frees its own duplicates of what was cached meanwhile. */
static size_t p_cache_req (struct prop *p, struct req *q)
{
    struct rx_err e = { 0 };
    struct rx_radix_match m;
    size_t rprefix;
    P_ASSERT (p, rx_radix_cache_insert (p->h.cache, q->toks, q->slots, q->n, &m, &e) == RX_OK,
              "%s", e.msg);
    r_insert (&p->r, q->toks, q->slots, q->n, &rprefix);
    P_ASSERT (p, m.prefix_len == rprefix, "insert prefix %zu, reference %zu", m.prefix_len,
              rprefix);
    P_ASSERT (p, m.len == q->n / p->ps * p->ps, "insert len %zu", m.len);
    P_ASSERT (p, m.prefix_len >= q->protected_, "a locked prefix was lost");
    P_ASSERT (p, rx_radix_node_depth (m.last) == m.len, "insert last depth");
    p_free_slots (p, q->slots + q->protected_, m.prefix_len - q->protected_);
    return m.len;
}

static void p_op (struct prop *p)
{
    uint64_t dice = p_rand (p, 100);
    if (dice < 8) {                                   /* tick */
        rx_radix_cache_tick (p->h.cache);
        p->r.clock++;
    } else if (dice < 30 && p->nreq < 4) {            /* a request arrives */
        struct req *q = &p->req[p->nreq];
        q->toks = malloc (p->maxlen * 4);
        q->slots = malloc (p->maxlen * 4);
        size_t n = p_prompt (p, q->toks);
        struct rx_radix_match m;
        p_cmp_match (p, q->toks, n, q->slots, &m);
        q->n = q->protected_ = m.len;
        q->last = m.last;
        p->nreq++;
        p_lock (p, q, m.last, m.len, +1);
        /* prefill: the uncached part of the prompt gets fresh slots */
        if (p_alloc (p, -1, n - m.len, q->slots + m.len) == RX_OK) {
            q->n = n;
        } else {                                      /* no room even after evicting */
            p_lock (p, q, q->last, q->protected_, -1);
            p_drop (p, p->nreq - 1);
        }
    } else if (dice < 55 && p->nreq) {                /* decode a few tokens */
        struct req *q = &p->req[p_rand (p, (uint64_t) p->nreq)];
        size_t k = 1 + (size_t) p_rand (p, 4);
        if (q->n + k > p->maxlen) return;
        for (size_t i = 0; i < k; i++) q->toks[q->n + i] = (int32_t) p_rand (p, p->vocab);
        int32_t last = q->n ? q->slots[q->n - 1] : -1;
        if (p_alloc (p, last, k, q->slots + q->n) == RX_OK) q->n += k;
    } else if (dice < 65 && p->nreq) {                /* cache an unfinished request */
        struct req *q = &p->req[p_rand (p, (uint64_t) p->nreq)];
        size_t len = p_cache_req (p, q);
        /* re-match to pick up the tree's slots and move the lock down */
        struct rx_radix_match m;
        p_cmp_match (p, q->toks, len, q->slots, &m);
        P_ASSERT (p, m.len == len, "re-match %zu of %zu", m.len, len);
        p_lock (p, q, m.last, len, +1);
        p_lock (p, q, q->last, q->protected_, -1);
        q->last = m.last;
        q->protected_ = len;
    } else if (dice < 78 && p->nreq) {                /* finish */
        int k = (int) p_rand (p, (uint64_t) p->nreq);
        struct req *q = &p->req[k];
        size_t len = p_cache_req (p, q);
        p_free_slots (p, q->slots + len, q->n - len);     /* the unaligned tail */
        p_lock (p, q, q->last, q->protected_, -1);
        p_remember (p, q);
        p_drop (p, k);
    } else if (dice < 82 && p->nreq) {                /* abort: nothing inserted */
        int k = (int) p_rand (p, (uint64_t) p->nreq);
        struct req *q = &p->req[k];
        p_free_slots (p, q->slots + q->protected_, q->n - q->protected_);
        p_lock (p, q, q->last, q->protected_, -1);
        p_drop (p, k);
    } else if (dice < 92) {                           /* a probe match, no lock */
        int32_t *toks = malloc (p->maxlen * 4);
        size_t n = p_prompt (p, toks);
        struct rx_radix_match m;
        p_cmp_match (p, toks, n, NULL, &m);
        free (toks);
    } else if (dice < 99) {                           /* evict */
        size_t want = (size_t) p_rand (p, rx_radix_cache_total_size (p->h.cache) + 2 * p->ps);
        size_t a = rx_radix_cache_evict (p->h.cache, want);
        size_t b = r_evict (&p->r, want, &p->rlog);
        P_ASSERT (p, a == b, "evict(%zu) freed %zu, reference %zu", want, a, b);
        P_ASSERT (p, a >= want || rx_radix_cache_evictable_size (p->h.cache) == 0,
                  "evict stopped early");
        p_compare_logs (p);
    } else {                                          /* flush */
        size_t locked;
        size_t a = rx_radix_cache_flush (p->h.cache, &locked);
        size_t b = r_evict (&p->r, SIZE_MAX, &p->rlog);
        P_ASSERT (p, a == b, "flush freed %zu, reference %zu", a, b);
        P_ASSERT (p, locked == rx_radix_cache_protected_size (p->h.cache), "flush: locked");
        P_ASSERT (p, rx_radix_cache_evictable_size (p->h.cache) == 0, "flush left evictable");
        p_compare_logs (p);
    }
}

static void p_run (uint32_t ps, uint64_t seed, int n_ops, struct prop *totals)
{
    struct prop *p = calloc (1, sizeof *p);
    p->seed = p->rng = seed;
    p->ps = ps;
    p->vocab = ps == 1 ? 3 : 2;
    p->maxlen = ps == 1 ? 40 : (ps == 4 ? 80 : 200);
    p->n_slots = ps == 1 ? 64 : (ps == 4 ? 160 : 640);
    s_h_init (&p->h, p->n_slots, ps);
    p->r.ps = ps;
    p->seen = malloc (p->n_slots);
    p->hist = calloc (16, sizeof *p->hist);
    p->hist_n = calloc (16, sizeof *p->hist_n);
    for (p->op = 0; p->op < n_ops; p->op++) {
        p_op (p);
        p_verify (p);
    }
    /* Wind down: every request finishes, the cache is flushed, and every
     * slot is back in the pool. */
    while (p->nreq) {
        struct req *q = &p->req[0];
        size_t len = p_cache_req (p, q);
        p_free_slots (p, q->slots + len, q->n - len);
        p_lock (p, q, q->last, q->protected_, -1);
        p_drop (p, 0);
        p_verify (p);
    }
    size_t locked = 1;
    size_t a = rx_radix_cache_flush (p->h.cache, &locked);
    size_t b = r_evict (&p->r, SIZE_MAX, &p->rlog);
    P_ASSERT (p, a == b && locked == 0, "final flush");
    p_compare_logs (p);
    p_verify (p);
    P_ASSERT (p, rx_kvpool_used (p->h.pool) == 0, "slots leaked");
    P_ASSERT (p, rx_radix_cache_node_count (p->h.cache) == 0, "nodes left");
    totals->stats.ops += (uint64_t) n_ops;
    totals->stats.evicted_nodes += p->stats.evicted_nodes;
    totals->stats.splits += p->stats.splits;
    totals->stats.hits += p->stats.hits;
    s_h_fini (&p->h);
    r_free (&p->r);
    s_log_clear (&p->rlog);
    free (p->rlog.slots);
    free (p->rlog.len);
    for (int i = 0; i < 16; i++) free (p->hist[i]);
    free (p->hist);
    free (p->hist_n);
    free (p->seen);
    free (p);
}

/* RX_PROPTEST_SEQS overrides the number of sequences (e.g. a quick run
 * under valgrind); RX_PROPTEST_SEED runs one seed only (to reproduce a
 * failure: the message names page_size and seed). */
static void p_suite (uint32_t ps, int seqs, int n_ops)
{
    const char *env = getenv ("RX_PROPTEST_SEQS");
    if (env && *env) seqs = atoi (env);
    uint64_t first = 1000 * ps + 1;
    const char *one = getenv ("RX_PROPTEST_SEED");
    if (one && *one) {
        first = strtoull (one, NULL, 10);
        seqs = 1;
    }
    struct prop totals = { 0 };
    for (int i = 0; i < seqs; i++) p_run (ps, first + (uint64_t) i, n_ops, &totals);
    cr_log_info ("page_size %u: %d sequences, %llu ops, %llu evicted nodes, %llu splits, "
                 "%llu matched tokens", ps, seqs, (unsigned long long) totals.stats.ops,
                 (unsigned long long) totals.stats.evicted_nodes,
                 (unsigned long long) totals.stats.splits,
                 (unsigned long long) totals.stats.hits);
    /* The workload must exercise what it claims to. */
    if (seqs >= 20) {
        cr_assert_gt (totals.stats.evicted_nodes, 10 * (uint64_t) seqs);
        cr_assert_gt (totals.stats.splits, 2 * (uint64_t) seqs);
        cr_assert_gt (totals.stats.hits, 100 * (uint64_t) seqs);
    }
}

Test (radix_property, page1, .timeout = 600) { p_suite (1, 1500, 200); }
Test (radix_property, page4, .timeout = 600) { p_suite (4, 700, 200); }
Test (radix_property, page16, .timeout = 600) { p_suite (16, 300, 200); }
