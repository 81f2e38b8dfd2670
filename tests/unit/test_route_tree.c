/* tests/unit/test_route_tree.c -- cache_aware's approximate radix tree
 * (policies/route/tree.c): hand-checked cases for insert, match, split,
 * UTF-8 boundaries, eviction and removal, then a property test that runs
 * random operation sequences against a naive reference -- per tenant, the
 * set of character prefixes of what it inserted, each with the time of the
 * last insert through it. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../policies/route/tree.h"

/* ---- helpers ------------------------------------------------------------ */

static rx_rtree_t *s_new (void)
{
    struct rx_err err = { 0 };
    rx_rtree_t *t = rx_rtree_new (&err);
    cr_assert_not_null (t, "%s", err.msg);
    return t;
}

static void s_ins (rx_rtree_t *t, const char *s, uint32_t tenant, uint64_t now)
{
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rtree_insert (t, s, strlen (s), tenant, now, &err), RX_OK, "%s", err.msg);
}

static void s_ok (const rx_rtree_t *t)
{
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rtree_check (t, &err), RX_OK, "%s", err.msg);
}

/* tenant's match of s (0 when it is not among the hits). */
static size_t s_match (rx_rtree_t *t, const char *s, size_t len, uint32_t tenant,
                       struct rx_rtree_match *m)
{
    struct rx_err err = { 0 };
    struct rx_rtree_match tmp;
    if (!m) m = &tmp;
    cr_assert_eq (rx_rtree_match (t, s, len, m, &err), RX_OK, "%s", err.msg);
    for (size_t i = 0; i < m->nhits; i++)
        if (m->hits[i].tenant == tenant)
            return m->hits[i].chars;
    return 0;
}
#define MATCH(t, s, ten) s_match ((t), (s), strlen (s), (ten), NULL)

/* ---- characters --------------------------------------------------------- */

Test (route_tree, counts_characters_not_bytes)
{
    cr_assert_eq (rx_rtree_chars ("", 0), 0);
    cr_assert_eq (rx_rtree_chars ("abc", 3), 3);
    cr_assert_eq (rx_rtree_chars ("h\xC3\xA9llo", 6), 5);              /* héllo */
    cr_assert_eq (rx_rtree_chars ("\xE2\x82\xAC", 3), 1);              /* € */
    cr_assert_eq (rx_rtree_chars ("\xF0\x9D\x84\x9E", 4), 1);          /* 𝄞 */
    /* Invalid UTF-8 still segments one fixed way: a truncated sequence is
     * one character, a stray continuation byte is one, 0xF8.. is one. */
    cr_assert_eq (rx_rtree_chars ("\xE2\x82", 2), 1);
    cr_assert_eq (rx_rtree_chars ("\xE2\x82" "A", 3), 2);
    cr_assert_eq (rx_rtree_chars ("\x80\x80", 2), 2);
    cr_assert_eq (rx_rtree_chars ("a\x80", 2), 2);
    cr_assert_eq (rx_rtree_chars ("\xC3\xA9\xA9", 3), 2);
    cr_assert_eq (rx_rtree_chars ("\xF8\x80", 2), 2);
    cr_assert_eq (rx_rtree_chars ("\xF0\x9D\x84\x9E\x80", 5), 2);      /* at most 4 bytes */
}

/* ---- insert and match --------------------------------------------------- */

Test (route_tree, shares_prefixes_and_matches_per_tenant)
{
    rx_rtree_t *t = s_new ();
    s_ins (t, "hello world", 1, 1);
    s_ins (t, "hello there", 2, 2);
    s_ok (t);
    /* "hello " shared, "world" and "there" below it. */
    cr_assert_eq (rx_rtree_node_count (t), 3);
    cr_assert_eq (rx_rtree_total_chars (t), 16);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 11);
    cr_assert_eq (rx_rtree_tenant_size (t, 2), 11);
    cr_assert_eq (rx_rtree_tenant_count (t), 2);

    struct rx_rtree_match m;
    cr_assert_eq (s_match (t, "hello wonder", 12, 1, &m), 8);     /* "hello wo": partial edge counts */
    cr_assert_eq (m.best, 8);
    cr_assert_eq (m.text_chars, 12);
    cr_assert_eq (m.nhits, 2);
    cr_assert_eq (MATCH (t, "hello wonder", 2), 6);
    cr_assert_eq (MATCH (t, "hello there and more", 2), 11);
    cr_assert_eq (MATCH (t, "hello there and more", 1), 6);
    /* Nothing in common: no hits at all. */
    cr_assert_eq (s_match (t, "xyz", 3, 1, &m), 0);
    cr_assert_eq (m.nhits, 0);
    cr_assert_eq (m.best, 0);
    cr_assert_eq (m.text_chars, 3);
    /* Empty text. */
    cr_assert_eq (s_match (t, "", 0, 1, &m), 0);
    cr_assert_eq (m.nhits, 0);
    cr_assert_eq (m.text_chars, 0);
    /* A shorter text ending inside an edge splits it; sizes do not change. */
    s_ins (t, "hello", 2, 3);
    s_ok (t);
    cr_assert_eq (rx_rtree_node_count (t), 4);
    cr_assert_eq (rx_rtree_tenant_size (t, 2), 11);
    cr_assert_eq (rx_rtree_total_chars (t), 16);
    /* Re-inserting the same text changes nothing but times. */
    s_ins (t, "hello world", 1, 4);
    s_ok (t);
    cr_assert_eq (rx_rtree_node_count (t), 4);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 11);
    /* A tenant with no text yet. */
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rtree_add_tenant (t, 9, &err), RX_OK);
    cr_assert_eq (rx_rtree_tenant_count (t), 3);
    cr_assert_eq (rx_rtree_tenant_size (t, 9), 0);
    cr_assert_eq (rx_rtree_tenant_size (t, 12345), 0);
    cr_assert_eq (rx_rtree_insert (t, NULL, 0, 10, 5, &err), RX_OK);
    cr_assert_eq (rx_rtree_tenant_count (t), 4);
    s_ok (t);
    rx_rtree_destroy (&t);
    cr_assert_null (t);
    rx_rtree_destroy (&t);                 /* NULL is a no-op */
    rx_rtree_destroy (NULL);
}

Test (route_tree, splits_only_between_utf8_characters)
{
    rx_rtree_t *t = s_new ();
    /* é = C3 A9 and ê = C3 AA share their first byte. */
    s_ins (t, "h\xC3\xA9llo", 1, 1);
    s_ins (t, "h\xC3\xAAllo", 2, 2);
    s_ok (t);
    cr_assert_eq (rx_rtree_node_count (t), 3);           /* h | éllo | êllo */
    cr_assert_eq (rx_rtree_total_chars (t), 9);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 5);
    cr_assert_eq (MATCH (t, "h\xC3\xA9", 1), 2);
    cr_assert_eq (MATCH (t, "h\xC3\xA9", 2), 1);
    /* A query that shares only the lead byte of a character matches up to
     * the character before it. */
    cr_assert_eq (MATCH (t, "h\xC3", 1), 1);
    cr_assert_eq (MATCH (t, "h\xC3\xAB", 1), 1);
    /* 4-byte characters sharing their first byte (𝄞 F0 9D 84 9E, 😀 F0 9F 98 80). */
    s_ins (t, "a\xF0\x9D\x84\x9E" "b", 3, 3);
    s_ins (t, "a\xF0\x9F\x98\x80" "b", 4, 4);
    s_ok (t);
    cr_assert_eq (rx_rtree_tenant_size (t, 3), 3);
    cr_assert_eq (MATCH (t, "a\xF0\x9D\x84\x9E", 3), 2);
    cr_assert_eq (MATCH (t, "a\xF0\x9D\x84\x9E", 4), 1);
    cr_assert_eq (MATCH (t, "a\xF0\x9D\x84", 3), 1);     /* truncated: another character */
    /* Invalid bytes: a truncated é vs a whole one. */
    s_ins (t, "z\xC3", 5, 5);
    s_ins (t, "z\xC3\xA9", 5, 6);
    s_ok (t);
    cr_assert_eq (rx_rtree_tenant_size (t, 5), 3);       /* z | \xC3 | é */
    cr_assert_eq (MATCH (t, "z\xC3\xA9!", 5), 2);
    cr_assert_eq (MATCH (t, "z\xC3!", 5), 2);
    /* NUL bytes are ordinary characters. */
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rtree_insert (t, "n\0x", 3, 6, 7, &err), RX_OK);
    cr_assert_eq (s_match (t, "n\0y", 3, 6, NULL), 2);
    s_ok (t);
    rx_rtree_destroy (&t);
}

Test (route_tree, refuses_null_text)
{
    rx_rtree_t *t = s_new ();
    struct rx_err err = { 0 };
    struct rx_rtree_match m;
    cr_assert_eq (rx_rtree_insert (t, NULL, 3, 1, 1, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "route tree") && strstr (err.msg, "NULL"), "%s", err.msg);
    rx_err_clear (&err);
    cr_assert_eq (rx_rtree_match (t, NULL, 3, &m, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "NULL"), "%s", err.msg);
    cr_assert_eq (rx_rtree_tenant_count (t), 0);
    s_ok (t);
    rx_rtree_destroy (&t);
}

/* ---- eviction and removal ----------------------------------------------- */

Test (route_tree, evicts_least_recently_used_leaves)
{
    rx_rtree_t *t = s_new ();
    struct rx_err err = { 0 };
    s_ins (t, "abc", 1, 1);
    s_ins (t, "abd", 1, 2);
    s_ins (t, "x", 1, 3);
    s_ins (t, "abc", 2, 4);            /* another tenant shares "abc" */
    s_ok (t);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 5);       /* ab c d x */
    /* Under the limit: nothing happens. */
    cr_assert_eq (rx_rtree_evict_tenant (t, 1, 5, &err), 0);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 5);
    /* Down to 3: "c" (time 1) goes, then "d" (time 2), not "x" (time 3). */
    cr_assert_eq (rx_rtree_evict_tenant (t, 1, 3, &err), 2);
    s_ok (t);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 3);
    cr_assert_eq (MATCH (t, "abc", 1), 2);
    cr_assert_eq (MATCH (t, "abd", 1), 2);
    cr_assert_eq (MATCH (t, "x", 1), 1);
    /* Tenant 2 still holds "abc"; the "d" node, held by nobody now, is gone. */
    cr_assert_eq (MATCH (t, "abc", 2), 3);
    cr_assert_eq (rx_rtree_tenant_size (t, 2), 3);
    cr_assert_eq (rx_rtree_node_count (t), 3);           /* ab, c (tenant 2), x */
    /* Down to 1: "ab" became a leaf at time 2, older than "x": whole edges
     * go, so 2 characters are released and 1 ("x") is left. */
    cr_assert_eq (rx_rtree_evict_tenant (t, 1, 1, &err), 2);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 1);
    cr_assert_eq (MATCH (t, "abc", 1), 0);
    cr_assert_eq (MATCH (t, "x", 1), 1);
    s_ok (t);
    /* To zero, for every tenant. */
    cr_assert_eq (rx_rtree_evict (t, 0, &err), 4);
    cr_assert_eq (rx_rtree_node_count (t), 0);
    cr_assert_eq (rx_rtree_total_chars (t), 0);
    cr_assert_eq (rx_rtree_tenant_count (t), 2);          /* still known, empty */
    s_ok (t);
    /* Unknown tenant: nothing. */
    cr_assert_eq (rx_rtree_evict_tenant (t, 77, 0, &err), 0);
    rx_rtree_destroy (&t);
}

Test (route_tree, evicting_a_shared_prefix_waits_for_its_subtree)
{
    rx_rtree_t *t = s_new ();
    struct rx_err err = { 0 };
    s_ins (t, "system prompt: question one", 1, 1);
    s_ins (t, "system prompt: question two", 1, 5);
    s_ins (t, "other", 1, 3);
    /* Times: "system prompt: question " 5, "one" 1, "two" 5, "other" 3. */
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 35);
    cr_assert_eq (rx_rtree_evict_tenant (t, 1, 32, &err), 3);      /* "one" */
    cr_assert_eq (MATCH (t, "system prompt: question one", 1), 24);
    cr_assert_eq (MATCH (t, "system prompt: question two", 1), 27);
    /* The shared prefix is not a leaf while "two" is under it: "other"
     * (time 3) goes next although the prefix's own time is 5. */
    cr_assert_eq (rx_rtree_evict_tenant (t, 1, 31, &err), 5);
    cr_assert_eq (MATCH (t, "other", 1), 0);
    cr_assert_eq (MATCH (t, "system prompt: question two", 1), 27);
    s_ok (t);
    rx_rtree_destroy (&t);
}

Test (route_tree, removing_a_tenant_drops_only_its_marks)
{
    rx_rtree_t *t = s_new ();
    s_ins (t, "shared prefix A", 1, 1);
    s_ins (t, "shared prefix B", 2, 2);
    s_ins (t, "only one", 1, 3);
    s_ok (t);
    rx_rtree_remove_tenant (t, 1);
    s_ok (t);
    cr_assert_eq (rx_rtree_tenant_count (t), 1);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 0);
    cr_assert_eq (MATCH (t, "shared prefix A", 1), 0);
    cr_assert_eq (MATCH (t, "shared prefix A", 2), 14);
    cr_assert_eq (rx_rtree_tenant_size (t, 2), 15);
    cr_assert_eq (rx_rtree_total_chars (t), 15);           /* "only one" and "A" freed */
    rx_rtree_remove_tenant (t, 1);                         /* again: no-op */
    rx_rtree_remove_tenant (t, 2);
    cr_assert_eq (rx_rtree_node_count (t), 0);
    cr_assert_eq (rx_rtree_tenant_count (t), 0);
    s_ok (t);
    /* A removed tenant can come back under the same id. */
    s_ins (t, "again", 1, 9);
    cr_assert_eq (MATCH (t, "again", 1), 5);
    s_ok (t);
    rx_rtree_destroy (&t);
}

/* Deep trees: paths as long as texts; no walk may recurse. */
Test (route_tree, deep_paths_do_not_recurse)
{
    enum { N = 30000 };
    char *s = malloc (N);
    for (size_t i = 0; i < N; i++) s[i] = 'a';
    rx_rtree_t *t = s_new ();
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rtree_insert (t, s, N, 1, 1, &err), RX_OK);
    /* Every 6th length ends inside the edge: 5000 nested nodes. */
    for (size_t k = 6; k < N; k += 6)
        cr_assert_eq (rx_rtree_insert (t, s, k, 2, 2 + k, &err), RX_OK);
    cr_assert_eq (rx_rtree_node_count (t), N / 6);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), N);
    cr_assert_eq (rx_rtree_tenant_size (t, 2), N - 6);
    cr_assert_eq (s_match (t, s, N, 1, NULL), N);
    s_ok (t);
    cr_assert_eq (rx_rtree_evict_tenant (t, 1, 100, &err), N - 96);
    cr_assert_eq (rx_rtree_tenant_size (t, 1), 96);
    s_ok (t);
    rx_rtree_remove_tenant (t, 2);
    s_ok (t);
    cr_assert_eq (rx_rtree_total_chars (t), 96);
    rx_rtree_destroy (&t);
    free (s);
}

/* ---- property test against a naive reference ---------------------------- */

/* Independent of tree.c: the UTF-8 segmentation spelled out from the lead
 * byte's bit pattern. */
static size_t r_clen (const unsigned char *p, size_t n)
{
    size_t want = (p[0] & 0x80) == 0x00 ? 1 : (p[0] & 0xE0) == 0xC0 ? 2
                : (p[0] & 0xF0) == 0xE0 ? 3 : (p[0] & 0xF8) == 0xF0 ? 4 : 1;
    size_t k = 1;
    while (k < want && k < n && (p[k] & 0xC0) == 0x80) k++;
    return k;
}

/* Byte offsets of the character boundaries of s: b[0] = 0 ... b[c] = len. */
static size_t r_bounds (const char *s, size_t len, size_t *b)
{
    size_t c = 0, i = 0;
    b[0] = 0;
    while (i < len) {
        i += r_clen ((const unsigned char *) s + i, len - i);
        b[++c] = i;
    }
    return c;
}

struct r_pref {
    char    *s;
    size_t   len;          /* bytes */
    size_t   chars;
    uint64_t time;
};

#define R_TENANTS 4
static const uint32_t r_ids[R_TENANTS] = { 3, 7, 11, 100000 };

struct ref {
    struct r_pref *p[R_TENANTS];
    size_t n[R_TENANTS], cap[R_TENANTS];
    int known[R_TENANTS];
};

static struct r_pref *r_find (struct ref *r, int ti, const char *s, size_t len)
{
    for (size_t i = 0; i < r->n[ti]; i++)
        if (r->p[ti][i].len == len && memcmp (r->p[ti][i].s, s, len) == 0)
            return &r->p[ti][i];
    return NULL;
}

static void r_insert (struct ref *r, int ti, const char *s, size_t len, uint64_t now)
{
    size_t b[64];
    size_t c = r_bounds (s, len, b);
    r->known[ti] = 1;
    for (size_t k = 1; k <= c; k++) {
        struct r_pref *p = r_find (r, ti, s, b[k]);
        if (p) { p->time = now; continue; }
        if (r->n[ti] == r->cap[ti]) {
            r->cap[ti] = r->cap[ti] ? 2 * r->cap[ti] : 64;
            r->p[ti] = realloc (r->p[ti], r->cap[ti] * sizeof *r->p[ti]);
        }
        p = &r->p[ti][r->n[ti]++];
        p->s = malloc (b[k] + 1);
        memcpy (p->s, s, b[k]);
        p->len = b[k];
        p->chars = k;
        p->time = now;
    }
}

static size_t r_match (struct ref *r, int ti, const char *s, size_t len)
{
    size_t b[64];
    size_t c = r_bounds (s, len, b);
    for (size_t k = c; k > 0; k--)
        if (r_find (r, ti, s, b[k]))
            return k;
    return 0;
}

static void r_clear (struct ref *r, int ti)
{
    for (size_t i = 0; i < r->n[ti]; i++) free (r->p[ti][i].s);
    r->n[ti] = 0;
}

/* xorshift for the test's own choices. */
static uint64_t s_rng;
static uint64_t s_rand (void)
{
    s_rng ^= s_rng << 13; s_rng ^= s_rng >> 7; s_rng ^= s_rng << 17;
    return s_rng;
}
static size_t s_below (size_t n) { return (size_t) (s_rand () % n); }

/* Pieces that make texts: ASCII, 2/3/4-byte characters, and invalid bytes
 * that merge with or stay apart from their neighbours. */
static const char *const s_pieces[] = {
    "a", "b", "c", " ", "\xC3\xA9", "\xC3\xAA", "\xE2\x82\xAC", "\xF0\x9D\x84\x9E",
    "\xF0\x9F\x98\x80", "\xC3", "\x80", "\xF0\x9D",
};
#define N_PIECES (sizeof s_pieces / sizeof s_pieces[0])

/* A random text (at most 40 bytes): often an earlier one's prefix plus a
 * random tail, so texts share prefixes and edges split. */
static size_t s_text (char *out, char pool[][48], size_t *plen, size_t npool)
{
    size_t n = 0;
    if (npool && s_below (3) != 0) {
        size_t j = s_below (npool);
        n = plen[j] ? s_below (plen[j] + 1) : 0;
        memcpy (out, pool[j], n);
    }
    size_t tail = s_below (5);
    for (size_t i = 0; i < tail; i++) {
        const char *p = s_pieces[s_below (N_PIECES)];
        size_t l = strlen (p);
        if (n + l > 40) break;
        memcpy (out + n, p, l);
        n += l;
    }
    return n;
}

/* What the random runs exercised (asserted at the end: a run that never
 * evicted or matched anything would prove nothing). */
static struct { unsigned evicted, partial, matched, removed; } s_seen;

/* Every tenant's match of q equals the reference's. */
static void s_check_match (rx_rtree_t *t, struct ref *r, const char *q, size_t qlen)
{
    struct rx_rtree_match m;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rtree_match (t, q, qlen, &m, &err), RX_OK, "%s", err.msg);
    size_t b[64], best = 0, want_hits = 0;
    cr_assert_eq (m.text_chars, r_bounds (q, qlen, b));
    for (int ti = 0; ti < R_TENANTS; ti++) {
        size_t want = r_match (r, ti, q, qlen), got = 0;
        for (size_t i = 0; i < m.nhits; i++)
            if (m.hits[i].tenant == r_ids[ti]) got = m.hits[i].chars;
        cr_assert_eq (got, want, "tenant %u: tree matches %zu chars, reference %zu", r_ids[ti], got, want);
        if (want) want_hits++;
        if (want && want < m.text_chars) s_seen.matched++;
        if (want > best) best = want;
    }
    cr_assert_eq (m.nhits, want_hits);
    cr_assert_eq (m.best, best);
}

/* Check that the tree's eviction of tenant ti to max (already done when
 * freed < 0, else done here) was a valid LRU eviction of whole leaves, then
 * bring the reference in line.  Returns the characters released. */
static size_t s_check_evict (rx_rtree_t *t, struct ref *r, int ti, uint64_t max, int call)
{
    struct rx_err err = { 0 };
    size_t before = r->n[ti];
    if (call) {
        int64_t freed = rx_rtree_evict_tenant (t, r_ids[ti], max, &err);
        cr_assert_geq (freed, 0, "%s", err.msg);
        cr_assert_eq ((size_t) freed, before - rx_rtree_tenant_size (t, r_ids[ti]));
    }
    /* Which reference prefixes the tree still holds. */
    size_t kept = 0;
    uint64_t max_removed = 0, min_kept = UINT64_MAX;
    int any_removed = 0;
    char *held = calloc (before + 1, 1);
    for (size_t i = 0; i < before; i++) {
        struct r_pref *p = &r->p[ti][i];
        held[i] = s_match (t, p->s, p->len, r_ids[ti], NULL) == p->chars;
        if (held[i]) {
            kept++;
            if (p->time < min_kept) min_kept = p->time;
        } else {
            any_removed = 1;
            if (p->time > max_removed) max_removed = p->time;
        }
    }
    cr_assert_eq (rx_rtree_tenant_size (t, r_ids[ti]), kept, "the tree holds what the reference does not");
    if (before <= max) {
        cr_assert_eq (kept, before, "evicted below the limit");
    } else {
        cr_assert_leq (kept, max);
        /* Least recently used first. */
        if (any_removed && kept)
            cr_assert_leq (max_removed, min_kept, "evicted time %llu but kept time %llu",
                           (unsigned long long) max_removed, (unsigned long long) min_kept);
        /* No more than needed: without the newest evicted leaf (a subset of
         * the prefixes at the newest evicted time) it was still over. */
        size_t newest = 0;
        for (size_t i = 0; i < before; i++)
            if (!held[i] && r->p[ti][i].time == max_removed) newest++;
        cr_assert_gt (kept + newest, max, "evicted more than needed");
    }
    if (before > kept) s_seen.evicted++;
    if (kept && before > kept) s_seen.partial++;
    /* Bring the reference in line. */
    size_t w = 0;
    for (size_t i = 0; i < before; i++) {
        if (held[i]) r->p[ti][w++] = r->p[ti][i];
        else free (r->p[ti][i].s);
    }
    r->n[ti] = w;
    free (held);
    return before - kept;
}

static void s_property_run (uint64_t seed, int ops)
{
    s_rng = seed;
    rx_rtree_t *t = s_new ();
    struct ref r;
    memset (&r, 0, sizeof r);
    static char pool[256][48];
    size_t plen[256], npool = 0;
    uint64_t clock = 0;
    struct rx_err err = { 0 };
    for (int op = 0; op < ops; op++) {
        int ti = (int) s_below (R_TENANTS);
        size_t k = s_below (100);
        char text[48];
        if (k < 50) {                                  /* insert */
            size_t n = s_text (text, pool, plen, npool);
            if (s_below (5)) clock++;                  /* sometimes equal times */
            cr_assert_eq (rx_rtree_insert (t, text, n, r_ids[ti], clock, &err), RX_OK, "%s", err.msg);
            r_insert (&r, ti, text, n, clock);
            size_t slot = npool < 256 ? npool++ : s_below (256);
            memcpy (pool[slot], text, n);
            plen[slot] = n;
        } else if (k < 78) {                           /* match */
            size_t n = s_text (text, pool, plen, npool);
            s_check_match (t, &r, text, n);
        } else if (k < 90) {                           /* evict one tenant */
            s_check_evict (t, &r, ti, r.n[ti] ? s_below (r.n[ti] + 1) : 0, 1);
        } else if (k < 93) {                           /* evict everyone */
            uint64_t max = s_below (30);
            int64_t freed = rx_rtree_evict (t, max, &err);
            size_t sum = 0;
            for (int j = 0; j < R_TENANTS; j++)
                sum += s_check_evict (t, &r, j, max, 0);
            cr_assert_eq (freed, (int64_t) sum);
        } else if (k < 97) {                           /* remove */
            if (r.n[ti]) s_seen.removed++;
            rx_rtree_remove_tenant (t, r_ids[ti]);
            r_clear (&r, ti);
            r.known[ti] = 0;
        } else {                                       /* add */
            cr_assert_eq (rx_rtree_add_tenant (t, r_ids[ti], &err), RX_OK);
            r.known[ti] = 1;
        }
        s_ok (t);
        size_t known = 0;
        for (int j = 0; j < R_TENANTS; j++) {
            known += (size_t) r.known[j];
            cr_assert_eq (rx_rtree_tenant_size (t, r_ids[j]), r.n[j],
                          "seed %llu op %d: tenant %u size", (unsigned long long) seed, op, r_ids[j]);
        }
        cr_assert_eq (rx_rtree_tenant_count (t), known);
    }
    /* Full sweep: every pool text matches as the reference says. */
    for (size_t i = 0; i < npool; i++)
        s_check_match (t, &r, pool[i], plen[i]);
    for (int j = 0; j < R_TENANTS; j++) {
        rx_rtree_remove_tenant (t, r_ids[j]);
        r_clear (&r, j);
        free (r.p[j]);
    }
    cr_assert_eq (rx_rtree_node_count (t), 0);
    cr_assert_eq (rx_rtree_total_chars (t), 0);
    rx_rtree_destroy (&t);
}

Test (route_tree, random_sequences_agree_with_the_reference)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        s_property_run (seed * 0x9e3779b97f4a7c15ull + 1, 600);
    cr_log_info ("evictions %u (%u partial), partial matches %u, removals %u",
                 s_seen.evicted, s_seen.partial, s_seen.matched, s_seen.removed);
    cr_assert_gt (s_seen.evicted, 1000);
    cr_assert_gt (s_seen.partial, 500);
    cr_assert_gt (s_seen.matched, 3000);
    cr_assert_gt (s_seen.removed, 200);
}
