/* tests/unit/test_kvpool.c -- the KV slot allocator (pages, extend, double
 * free), the request -> token table, and sizing from [cache] kv_memory. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "kvpool.h"
#include "../testutil.h"

/* call must fail with want_code and a one-line message in e (the caller's
 * struct rx_err) that contains every given string. */
#define EXPECT_ERR(call, want_code, ...)                                              \
    do {                                                                              \
        int rc_ = (call);                                                             \
        cr_assert_eq (rc_, (want_code), "%s: rc %d (%s), want %d", #call, rc_, e.msg, \
                      (want_code));                                                   \
        const char *want_[] = { __VA_ARGS__ };                                        \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)                \
            cr_assert (strstr (e.msg, want_[i_]), "message \"%s\" lacks \"%s\"", e.msg, \
                       want_[i_]);                                                    \
        cr_assert_null (strchr (e.msg, '\n'), "one line: %s", e.msg);                 \
    } while (0)

/* ---- allocator ---------------------------------------------------------- */

Test (kvpool, rejects_bad_geometry)
{
    struct rx_err e = { 0 };
    cr_assert_null (rx_kvpool_new (16, 0, &e));
    cr_assert_eq (e.code, RX_EINVAL);
    cr_assert (strstr (e.msg, "page_size 0"), "%s", e.msg);
    cr_assert_null (rx_kvpool_new (16, 5000, &e));
    cr_assert (strstr (e.msg, "page_size 5000"), "%s", e.msg);
    cr_assert_null (rx_kvpool_new (0, 1, &e));
    cr_assert (strstr (e.msg, "n_slots 0"), "%s", e.msg);
    cr_assert_null (rx_kvpool_new (100, 16, &e));
    cr_assert (strstr (e.msg, "n_slots 100") && strstr (e.msg, "multiple of page_size 16"),
               "%s", e.msg);
    cr_assert_null (rx_kvpool_new (UINT32_MAX, 1, &e));
    rx_kvpool_t *p = NULL;
    rx_kvpool_destroy (&p);          /* NULL is fine */
    rx_kvpool_destroy (NULL);
}

Test (kvpool, page1_alloc_free_all_or_nothing)
{
    struct rx_err e = { 0 };
    rx_kvpool_t *p = rx_kvpool_new (8, 1, &e);
    cr_assert_not_null (p, "%s", e.msg);
    cr_assert_eq (rx_kvpool_capacity (p), 8);
    cr_assert_eq (rx_kvpool_page_size (p), 1);
    cr_assert_eq (rx_kvpool_available (p), 8);

    int32_t a[8], b[8];
    cr_assert_eq (rx_kvpool_alloc (p, 0, NULL, &e), RX_OK);
    cr_assert_eq (rx_kvpool_alloc (p, 5, a, &e), RX_OK);
    /* A fresh pool hands out slots in order. */
    for (int i = 0; i < 5; i++) cr_assert_eq (a[i], i);
    cr_assert_eq (rx_kvpool_available (p), 3);
    cr_assert_eq (rx_kvpool_used (p), 5);
    for (int i = 0; i < 8; i++) cr_assert_eq (rx_kvpool_is_allocated (p, i), i < 5);
    cr_assert_not (rx_kvpool_is_allocated (p, -1));
    cr_assert_not (rx_kvpool_is_allocated (p, 8));

    memset (b, 0x7f, sizeof b);
    EXPECT_ERR (rx_kvpool_alloc (p, 4, b, &e), RX_EAGAIN, "need 4 slots", "3 available");
    cr_assert_eq (b[0], 0x7f7f7f7f, "nothing written on failure");
    cr_assert_eq (rx_kvpool_available (p), 3);
    cr_assert_eq (rx_kvpool_used (p), 5);

    cr_assert_eq (rx_kvpool_alloc (p, 3, b, &e), RX_OK);
    cr_assert_eq (rx_kvpool_available (p), 0);
    EXPECT_ERR (rx_kvpool_alloc (p, 1, b + 3, &e), RX_EAGAIN, "0 available");

    cr_assert_eq (rx_kvpool_free (p, a, 5, &e), RX_OK);
    cr_assert_eq (rx_kvpool_available (p), 5);
    /* LIFO: the most recently freed slot comes back first (deterministic). */
    int32_t c;
    cr_assert_eq (rx_kvpool_alloc (p, 1, &c, &e), RX_OK);
    cr_assert_eq (c, a[4]);
    cr_assert_eq (rx_kvpool_free (p, &c, 1, &e), RX_OK);
    cr_assert_eq (rx_kvpool_free (p, b, 3, &e), RX_OK);
    cr_assert_eq (rx_kvpool_available (p), 8);
    cr_assert_eq (rx_kvpool_used (p), 0);
    rx_kvpool_destroy (&p);
    cr_assert_null (p);
}

Test (kvpool, bad_frees_are_refused_and_change_nothing)
{
    struct rx_err e = { 0 };
    rx_kvpool_t *p = rx_kvpool_new (8, 1, &e);
    int32_t a[4];
    cr_assert_eq (rx_kvpool_alloc (p, 4, a, &e), RX_OK);

    int32_t oob[] = { a[0], 8 };
    EXPECT_ERR (rx_kvpool_free (p, oob, 2, &e), RX_EINVAL, "slot 8", "out of range");
    int32_t neg[] = { -3 };
    EXPECT_ERR (rx_kvpool_free (p, neg, 1, &e), RX_EINVAL, "slot -3", "out of range");
    int32_t dup[] = { a[1], a[2], a[1] };
    EXPECT_ERR (rx_kvpool_free (p, dup, 3, &e), RX_EINVAL, "listed twice");
    int32_t never[] = { a[3], 6 };
    EXPECT_ERR (rx_kvpool_free (p, never, 2, &e), RX_EINVAL, "slot 6", "double free");
    EXPECT_ERR (rx_kvpool_free (p, NULL, 1, &e), RX_EINVAL, "NULL");
    /* None of the refused calls freed anything. */
    cr_assert_eq (rx_kvpool_used (p), 4);
    for (int i = 0; i < 4; i++) cr_assert (rx_kvpool_is_allocated (p, a[i]));

    cr_assert_eq (rx_kvpool_free (p, a, 2, &e), RX_OK);
    EXPECT_ERR (rx_kvpool_free (p, a, 1, &e), RX_EINVAL, "double free");
    cr_assert_eq (rx_kvpool_used (p), 2);
    cr_assert_eq (rx_kvpool_free (p, NULL, 0, &e), RX_OK);
    EXPECT_ERR (rx_kvpool_alloc (p, 1, NULL, &e), RX_EINVAL, "NULL");
    rx_kvpool_destroy (&p);
}

Test (kvpool, pages_whole_and_partial)
{
    struct rx_err e = { 0 };
    rx_kvpool_t *p = rx_kvpool_new (64, 16, &e);     /* 4 pages */
    cr_assert_not_null (p, "%s", e.msg);
    int32_t s[64];
    cr_assert_eq (rx_kvpool_alloc (p, 20, s, &e), RX_OK);   /* 2 pages, 12 spare */
    for (int i = 0; i < 20; i++) cr_assert_eq (s[i], i);
    cr_assert_eq (rx_kvpool_available (p), 32);
    cr_assert_eq (rx_kvpool_used (p), 20);

    /* Extending fills the partly used page before taking a new one. */
    cr_assert_eq (rx_kvpool_alloc_extend (p, s[19], 5, s + 20, &e), RX_OK);
    for (int i = 20; i < 25; i++) cr_assert_eq (s[i], i);
    cr_assert_eq (rx_kvpool_available (p), 32, "no new page for 5 tokens in a 12-slot tail");
    cr_assert_eq (rx_kvpool_alloc_extend (p, s[24], 10, s + 25, &e), RX_OK);
    for (int i = 25; i < 32; i++) cr_assert_eq (s[i], i);
    for (int i = 32; i < 35; i++) cr_assert_eq (s[i], i, "a fresh page: %d", s[i]);
    cr_assert_eq (rx_kvpool_available (p), 16);

    /* A new sequence never shares a page with another one. */
    int32_t t[4];
    cr_assert_eq (rx_kvpool_alloc (p, 4, t, &e), RX_OK);
    cr_assert_eq (t[0], 48);
    cr_assert_eq (rx_kvpool_available (p), 0);

    /* Not enough room: nothing taken, not even the tail of the page. */
    int32_t u[32];
    EXPECT_ERR (rx_kvpool_alloc_extend (p, t[3], 13, u, &e), RX_EAGAIN, "need 13 slots");
    cr_assert_not (rx_kvpool_is_allocated (p, 52));
    cr_assert_eq (rx_kvpool_alloc_extend (p, t[3], 12, u, &e), RX_OK);
    cr_assert_eq (u[0], 52);
    cr_assert_eq (u[11], 63);

    /* A page returns when all its handed-out slots are freed, in any order
     * and in as many calls as the owners like (tree: whole pages; request:
     * the partial tail). */
    cr_assert_eq (rx_kvpool_free (p, s, 8, &e), RX_OK);
    cr_assert_eq (rx_kvpool_available (p), 0);
    cr_assert_eq (rx_kvpool_free (p, s + 8, 8, &e), RX_OK);
    cr_assert_eq (rx_kvpool_available (p), 16);
    cr_assert_eq (rx_kvpool_free (p, s + 32, 3, &e), RX_OK);   /* page 2: only 3 used */
    cr_assert_eq (rx_kvpool_available (p), 32);
    /* LIFO over pages. */
    int32_t v;
    cr_assert_eq (rx_kvpool_alloc (p, 1, &v, &e), RX_OK);
    cr_assert_eq (v, 32);
    rx_kvpool_destroy (&p);
}

Test (kvpool, extend_rejects_bad_last_slot)
{
    struct rx_err e = { 0 };
    rx_kvpool_t *p = rx_kvpool_new (32, 8, &e);
    int32_t a[4], b[4], out[4];
    cr_assert_eq (rx_kvpool_alloc (p, 4, a, &e), RX_OK);
    EXPECT_ERR (rx_kvpool_alloc_extend (p, 20, 1, out, &e), RX_EINVAL, "slot 20",
                "not allocated");
    EXPECT_ERR (rx_kvpool_alloc_extend (p, -2, 1, out, &e), RX_EINVAL, "last_slot -2");
    EXPECT_ERR (rx_kvpool_alloc_extend (p, 99, 1, out, &e), RX_EINVAL, "slot 99");
    /* a[1] is followed by a[2] in the same page: extending it would hand out
     * a slot twice. */
    EXPECT_ERR (rx_kvpool_alloc_extend (p, a[1], 1, out, &e), RX_EINVAL, "slot 2",
                "already allocated");
    cr_assert_eq (rx_kvpool_used (p), 4);
    /* The last slot of a page extends onto a fresh page. */
    cr_assert_eq (rx_kvpool_alloc_extend (p, a[3], 4, b, &e), RX_OK);
    cr_assert_eq (rx_kvpool_alloc_extend (p, b[3], 0, out, &e), RX_OK);
    int32_t c[4];
    cr_assert_eq (rx_kvpool_alloc_extend (p, b[3], 4, c, &e), RX_OK);
    cr_assert_eq (c[0], 8, "page 0 is full after 8 slots");
    rx_kvpool_destroy (&p);
}

/* Random alloc/extend/free against a bitmap model: the pool's counts and
 * its view of every slot stay exact, and two pools fed the same operations
 * hand out the same slots (determinism across ranks). */
static uint64_t s_rng (uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void s_random_ops (uint32_t ps, uint64_t seed)
{
    enum { NSEQ = 6, CAP = 256 };
    struct rx_err e = { 0 };
    rx_kvpool_t *p = rx_kvpool_new (CAP, ps, &e), *q = rx_kvpool_new (CAP, ps, &e);
    cr_assert_not_null (p);
    int32_t seqs[NSEQ][CAP];
    uint32_t len[NSEQ] = { 0 };
    uint8_t owned[CAP] = { 0 };
    uint64_t st = seed;
    for (int op = 0; op < 3000; op++) {
        int k = (int) (s_rng (&st) % NSEQ);
        uint32_t n = (uint32_t) (s_rng (&st) % (3 * ps + 5));
        if (s_rng (&st) % 3 == 0 || len[k] + n > CAP) {
            /* free the whole sequence, in two calls split at a random point */
            uint32_t cut = len[k] ? (uint32_t) (s_rng (&st) % len[k]) : 0;
            cr_assert_eq (rx_kvpool_free (p, seqs[k], cut, &e), RX_OK, "seed %llu: %s",
                          (unsigned long long) seed, e.msg);
            cr_assert_eq (rx_kvpool_free (p, seqs[k] + cut, len[k] - cut, &e), RX_OK, "%s",
                          e.msg);
            cr_assert_eq (rx_kvpool_free (q, seqs[k], len[k], &e), RX_OK);
            for (uint32_t i = 0; i < len[k]; i++) owned[seqs[k][i]] = 0;
            len[k] = 0;
            continue;
        }
        int32_t out[CAP], out2[CAP];
        int32_t last = len[k] ? seqs[k][len[k] - 1] : -1;
        uint32_t before = rx_kvpool_available (p);
        int rc = rx_kvpool_alloc_extend (p, last, n, out, &e);
        int rc2 = rx_kvpool_alloc_extend (q, last, n, out2, &e);
        cr_assert_eq (rc, rc2);
        if (rc == RX_EAGAIN) {
            cr_assert_eq (rx_kvpool_available (p), before);
            continue;
        }
        cr_assert_eq (rc, RX_OK, "seed %llu: %s", (unsigned long long) seed, e.msg);
        cr_assert_eq (memcmp (out, out2, n * sizeof *out), 0, "same ops, same slots");
        for (uint32_t i = 0; i < n; i++) {
            cr_assert_not (owned[out[i]], "seed %llu: slot %d handed out twice",
                           (unsigned long long) seed, out[i]);
            owned[out[i]] = 1;
            /* Consecutive within a page, and a sequence's slots in order. */
            int32_t prev = len[k] + i ? (i ? out[i - 1] : last) : -1;
            if (prev >= 0 && (uint32_t) prev % ps != ps - 1)
                cr_assert_eq (out[i], prev + 1, "seed %llu", (unsigned long long) seed);
            if (prev < 0 || (uint32_t) prev % ps == ps - 1)
                cr_assert_eq ((uint32_t) out[i] % ps, 0, "a new page starts at offset 0");
        }
        memcpy (seqs[k] + len[k], out, n * sizeof *out);
        len[k] += n;
        uint32_t used = 0;
        for (int i = 0; i < CAP; i++) {
            used += owned[i];
            cr_assert_eq (rx_kvpool_is_allocated (p, i), owned[i]);
        }
        cr_assert_eq (rx_kvpool_used (p), used);
        /* Free pages = pages with no owned slot. */
        uint32_t free_pages = 0;
        for (uint32_t pg = 0; pg < CAP / ps; pg++) {
            int any = 0;
            for (uint32_t i = 0; i < ps; i++) any |= owned[pg * ps + i];
            free_pages += !any;
        }
        cr_assert_eq (rx_kvpool_available (p), free_pages * ps);
    }
    rx_kvpool_destroy (&p);
    rx_kvpool_destroy (&q);
}

Test (kvpool, random_ops_page1) { for (uint64_t s = 1; s <= 8; s++) s_random_ops (1, s); }
Test (kvpool, random_ops_page4) { for (uint64_t s = 1; s <= 8; s++) s_random_ops (4, s); }
Test (kvpool, random_ops_page16) { for (uint64_t s = 1; s <= 8; s++) s_random_ops (16, s); }

/* ---- request rows -------------------------------------------------------- */

Test (kvpool, rows_alloc_write_read_free)
{
    struct rx_err e = { 0 };
    cr_assert_null (rx_kvpool_rows_new (0, 8, &e));
    cr_assert (strstr (e.msg, "0 rows"), "%s", e.msg);
    cr_assert_null (rx_kvpool_rows_new (4, 0, &e));
    cr_assert_null (rx_kvpool_rows_new (UINT32_MAX / 2, UINT32_MAX / 2, &e));

    rx_kvpool_rows_t *t = rx_kvpool_rows_new (3, 8, &e);
    cr_assert_not_null (t, "%s", e.msg);
    cr_assert_eq (rx_kvpool_rows_max_requests (t), 3);
    cr_assert_eq (rx_kvpool_rows_max_context (t), 8);
    cr_assert_eq (rx_kvpool_rows_available (t), 3);
    cr_assert_eq (rx_kvpool_rows_alloc (t, &e), 0);
    cr_assert_eq (rx_kvpool_rows_alloc (t, &e), 1);
    cr_assert_eq (rx_kvpool_rows_alloc (t, &e), 2);
    EXPECT_ERR (rx_kvpool_rows_alloc (t, &e), RX_EAGAIN, "all 3 request rows");
    cr_assert_eq (rx_kvpool_rows_free (t, 1, &e), RX_OK);
    EXPECT_ERR (rx_kvpool_rows_free (t, 1, &e), RX_EINVAL, "row 1 is not in use");
    EXPECT_ERR (rx_kvpool_rows_free (t, 7, &e), RX_EINVAL, "row 7 out of range");
    EXPECT_ERR (rx_kvpool_rows_free (t, -1, &e), RX_EINVAL, "row -1");
    cr_assert_eq (rx_kvpool_rows_alloc (t, &e), 1, "the freed row comes back");

    uint32_t len = 99;
    cr_assert_not_null (rx_kvpool_rows_get (t, 1, &len));
    cr_assert_eq (len, 0, "a reused row starts empty");
    int32_t a[] = { 5, 6, 7, 8, 9 };
    cr_assert_eq (rx_kvpool_rows_append (t, 1, a, 5, &e), RX_OK);
    cr_assert_eq (rx_kvpool_rows_append (t, 1, a, 3, &e), RX_OK);
    EXPECT_ERR (rx_kvpool_rows_append (t, 1, a, 1, &e), RX_ERANGE, "max_context is 8");
    const int32_t *r = rx_kvpool_rows_get (t, 1, &len);
    cr_assert_eq (len, 8);
    int32_t want[] = { 5, 6, 7, 8, 9, 5, 6, 7 };
    cr_assert_arr_eq (r, want, sizeof want);

    /* Rewrite the prefix with other slots (after a cache insert). */
    int32_t b[] = { 40, 41 };
    cr_assert_eq (rx_kvpool_rows_write (t, 1, 1, b, 2, &e), RX_OK);
    r = rx_kvpool_rows_get (t, 1, &len);
    cr_assert_eq (len, 8);
    cr_assert_eq (r[0], 5);
    cr_assert_eq (r[1], 40);
    cr_assert_eq (r[2], 41);
    cr_assert_eq (r[3], 8);
    EXPECT_ERR (rx_kvpool_rows_write (t, 0, 1, b, 2, &e), RX_EINVAL, "past the end");
    EXPECT_ERR (rx_kvpool_rows_write (t, 1, 7, b, 2, &e), RX_ERANGE, "9 tokens");
    EXPECT_ERR (rx_kvpool_rows_write (t, 1, 0, NULL, 2, &e), RX_EINVAL, "NULL");

    cr_assert_eq (rx_kvpool_rows_truncate (t, 1, 3, &e), RX_OK);
    rx_kvpool_rows_get (t, 1, &len);
    cr_assert_eq (len, 3);
    EXPECT_ERR (rx_kvpool_rows_truncate (t, 1, 4, &e), RX_EINVAL, "length 3 to 4");
    EXPECT_ERR (rx_kvpool_rows_truncate (t, 9, 0, &e), RX_EINVAL, "row 9");

    /* The table view: row r at r * stride. */
    uint32_t stride;
    const int32_t *tab = rx_kvpool_rows_table (t, &stride);
    cr_assert_eq (stride, 8);
    cr_assert_eq (tab[1 * stride + 1], 40);

    cr_assert_eq (rx_kvpool_rows_free (t, 1, &e), RX_OK);
    cr_assert_null (rx_kvpool_rows_get (t, 1, &len));
    cr_assert_eq (len, 0);
    EXPECT_ERR (rx_kvpool_rows_append (t, 1, a, 1, &e), RX_EINVAL, "not in use");
    rx_kvpool_rows_destroy (&t);
    cr_assert_null (t);
    rx_kvpool_rows_destroy (&t);
}

/* ---- sizing -------------------------------------------------------------- */

static uint32_t s_slots (const char *spec, uint64_t bpt, uint64_t free_b, uint32_t ps)
{
    struct rx_err e = { 0 };
    uint32_t n = 0;
    int rc = rx_kvpool_size_slots (spec, bpt, free_b, ps, &n, &e);
    cr_assert_eq (rc, RX_OK, "\"%s\": %s", spec, e.msg);
    return n;
}

Test (kvpool, size_slots_sizes_and_fractions)
{
    const uint64_t MiB = 1ull << 20, GiB = 1ull << 30;
    cr_assert_eq (s_slots ("8GiB", MiB, 0, 1), 8192);
    cr_assert_eq (s_slots ("8 GiB", MiB, 0, 1), 8192);
    cr_assert_eq (s_slots ("512M", 1000, 0, 1), 536870);       /* rounds down */
    cr_assert_eq (s_slots ("512M", 1000, 0, 16), 536864);      /* to whole pages */
    cr_assert_eq (s_slots ("1048576", 1024, 0, 1), 1024);      /* plain bytes */
    cr_assert_eq (s_slots ("0.5", 1024, GiB, 1), 524288);
    cr_assert_eq (s_slots ("50%", 1024, GiB, 1), 524288);
    cr_assert_eq (s_slots (" 80 % ", 1024, 10 * MiB, 1), 8192);
    cr_assert_eq (s_slots ("1.0", 4096, GiB, 1), 262144);
    cr_assert_eq (s_slots ("100%", 4096, GiB, 64), 262144);
    /* Capped at the largest int32 slot index, rounded to a page. */
    cr_assert_eq (s_slots ("1TiB", 1, 0, 1), RX_KVPOOL_MAX_SLOTS);
    cr_assert_eq (s_slots ("0.9", 1, 1ull << 40, 16), RX_KVPOOL_MAX_SLOTS / 16 * 16);
}

Test (kvpool, size_slots_errors)
{
    struct rx_err e = { 0 };
    uint32_t n = 7;
    EXPECT_ERR (rx_kvpool_size_slots ("lots", 1024, 0, 1, &n, &e), RX_ECONFIG,
                "[cache] kv_memory = \"lots\"", "expected a size", "80%");
    EXPECT_ERR (rx_kvpool_size_slots ("8 parsecs", 1024, 0, 1, &n, &e), RX_ECONFIG,
                "\"8 parsecs\"");
    EXPECT_ERR (rx_kvpool_size_slots ("", 1024, 0, 1, &n, &e), RX_ECONFIG, "is empty");
    EXPECT_ERR (rx_kvpool_size_slots (NULL, 1024, 0, 1, &n, &e), RX_ECONFIG, "is empty");
    EXPECT_ERR (rx_kvpool_size_slots ("1.5", 1024, 1ull << 30, 1, &n, &e), RX_ECONFIG,
                "\"1.5\"", "must be in (0, 1]");
    EXPECT_ERR (rx_kvpool_size_slots ("150%", 1024, 1ull << 30, 1, &n, &e), RX_ECONFIG,
                "\"150%\"");
    EXPECT_ERR (rx_kvpool_size_slots ("0%", 1024, 1ull << 30, 1, &n, &e), RX_ECONFIG, "\"0%\"");
    EXPECT_ERR (rx_kvpool_size_slots ("-1GiB", 1024, 0, 1, &n, &e), RX_ECONFIG, "\"-1GiB\"");
    EXPECT_ERR (rx_kvpool_size_slots ("1", 1024, 0, 1, &n, &e), RX_ECONFIG, "1 bytes hold no",
                "1024 bytes per token");
    EXPECT_ERR (rx_kvpool_size_slots ("0.5", 1024, 1000, 1, &n, &e), RX_ECONFIG,
                "fraction of free memory");
    EXPECT_ERR (rx_kvpool_size_slots ("16KiB", 1024, 0, 32, &n, &e), RX_ECONFIG,
                "no page of 32 tokens");
    EXPECT_ERR (rx_kvpool_size_slots ("1GiB", 0, 0, 1, &n, &e), RX_EINVAL, "bytes per token is 0");
    EXPECT_ERR (rx_kvpool_size_slots ("1GiB", 1, 0, 0, &n, &e), RX_EINVAL, "page_size 0");
    cr_assert_eq (n, 7, "untouched on error");
}

Test (kvpool, meminfo)
{
    struct rx_err e = { 0 };
    uint64_t b = 0;
    cr_assert_eq (rx_kvpool_meminfo_available (NULL, &b, &e), RX_OK, "%s", e.msg);
    cr_assert_gt (b, 0);
    cr_assert_eq (b % 1024, 0);

    char *dir = tu_tmpdir ();
    char *good = tu_path (dir, "good"), *none = tu_path (dir, "none"), *bad = tu_path (dir, "bad");
    tu_write (good, "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n");
    tu_write (none, "MemTotal:       16000000 kB\n");
    tu_write (bad, "MemAvailable:    lots\n");
    cr_assert_eq (rx_kvpool_meminfo_available (good, &b, &e), RX_OK, "%s", e.msg);
    cr_assert_eq (b, 2048 * 1024);
    EXPECT_ERR (rx_kvpool_meminfo_available (none, &b, &e), RX_EFORMAT, none,
                "no MemAvailable");
    EXPECT_ERR (rx_kvpool_meminfo_available (bad, &b, &e), RX_EFORMAT, bad, "cannot read");
    char *missing = tu_path (dir, "missing");
    EXPECT_ERR (rx_kvpool_meminfo_available (missing, &b, &e), RX_EIO, missing, "cannot open");
    cr_assert_eq (b, 2048 * 1024, "untouched on error");
    unlink (good);
    unlink (none);
    unlink (bad);
    rmdir (dir);
    free (good);
    free (none);
    free (bad);
    free (missing);
    free (dir);
}
