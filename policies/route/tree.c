/* policies/route/tree.c -- see tree.h.
 *
 * Children are kept sorted by the key of their first character (its bytes
 * packed big-endian into 32 bits, zero padded: unique, since only NUL
 * itself starts with a zero byte) and found by binary search.  Walks go
 * through parent pointers rather than recursion: a path can be as deep as
 * a text is long. */
#include <stdlib.h>
#include <string.h>

#include "tree.h"

struct mark {
    uint32_t tenant;
    uint64_t time;                 /* last insert through this node */
};

struct node {
    struct node *parent;           /* NULL for the root */
    char *edge;                    /* owned; elen bytes, not NUL-terminated */
    size_t elen, echars;
    uint32_t key;                  /* first character, packed */
    struct node **kids;            /* owned array; sorted by key */
    uint32_t nkids, ckids;
    struct mark *marks;            /* owned array; one per tenant holding it */
    uint32_t nmarks, cmarks;
};

struct tenant {
    uint32_t id;
    uint64_t size;                 /* characters of the nodes it holds */
};

struct rx_rtree {
    struct node root;              /* empty edge, never marked */
    struct tenant *tenants;
    size_t ntenants, ctenants;
    struct rx_rtree_hit *hits;     /* rx_rtree_match's result */
    size_t chits;
    size_t nodes;
    uint64_t chars;
};

/* ------------------------------------------------------------ characters -- */

/* Bytes of the character at p (n > 0 bytes left): the lead byte says how
 * many continuation bytes may follow; only those present are taken. */
static size_t s_clen (const unsigned char *p, size_t n)
{
    unsigned char b = p[0];
    size_t want = b < 0x80 ? 1 : b >= 0xC0 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3
                : b >= 0xF0 && b < 0xF8 ? 4 : 1;
    size_t k = 1;
    while (k < want && k < n && (p[k] & 0xC0) == 0x80)
        k++;
    return k;
}

static uint32_t s_key (const unsigned char *p, size_t clen)
{
    uint32_t k = 0;
    for (size_t i = 0; i < 4; i++)
        k = (k << 8) | (i < clen ? p[i] : 0u);
    return k;
}

size_t rx_rtree_chars (const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *) text;
    size_t n = 0;
    for (size_t i = 0; i < len; n++)
        i += p[i] < 0x80 ? 1 : s_clen (p + i, len - i);
    return n;
}

/* Common prefix of a[0..na) and b[0..nb) in whole characters: *bytes and
 * *chars. */
static void s_common (const char *a, size_t na, const char *b, size_t nb,
                      size_t *bytes, size_t *chars)
{
    const unsigned char *p = (const unsigned char *) a, *q = (const unsigned char *) b;
    size_t i = 0, c = 0;
    while (i < na && i < nb) {
        if (p[i] < 0x80 && p[i] == q[i]) {      /* ASCII: one byte, one character */
            i++;
            c++;
            continue;
        }
        size_t la = s_clen (p + i, na - i), lb = s_clen (q + i, nb - i);
        if (la != lb || memcmp (p + i, q + i, la) != 0)
            break;
        i += la;
        c++;
    }
    *bytes = i;
    *chars = c;
}

/* ---------------------------------------------------------------- tenants -- */

static struct tenant *s_tenant (const rx_rtree_t *t, uint32_t id)
{
    for (size_t i = 0; i < t->ntenants; i++)
        if (t->tenants[i].id == id)
            return &t->tenants[i];
    return NULL;
}

/* The tenant's entry, added when absent; NULL on allocation failure. */
static struct tenant *s_tenant_get (rx_rtree_t *t, uint32_t id)
{
    struct tenant *tn = s_tenant (t, id);
    if (tn)
        return tn;
    if (t->ntenants == t->ctenants) {
        size_t c = t->ctenants ? 2 * t->ctenants : 8;
        struct tenant *a = realloc (t->tenants, c * sizeof *a);
        if (!a)
            return NULL;
        t->tenants = a;
        t->ctenants = c;
    }
    tn = &t->tenants[t->ntenants++];
    *tn = (struct tenant) { .id = id, .size = 0 };
    return tn;
}

/* ------------------------------------------------------------------ nodes -- */

static struct mark *s_mark (const struct node *n, uint32_t tenant)
{
    for (uint32_t i = 0; i < n->nmarks; i++)
        if (n->marks[i].tenant == tenant)
            return &n->marks[i];
    return NULL;
}

/* Mark n with (tenant, now): 1 if the tenant is new to n, 0 if only its
 * time changed, RX_ENOMEM. */
static int s_mark_set (struct node *n, uint32_t tenant, uint64_t now)
{
    struct mark *m = s_mark (n, tenant);
    if (m) {
        m->time = now;
        return 0;
    }
    if (n->nmarks == n->cmarks) {
        uint32_t c = n->cmarks ? 2 * n->cmarks : 2;
        struct mark *a = realloc (n->marks, c * sizeof *a);
        if (!a)
            return RX_ENOMEM;
        n->marks = a;
        n->cmarks = c;
    }
    n->marks[n->nmarks++] = (struct mark) { .tenant = tenant, .time = now };
    return 1;
}

/* Take tenant's mark off n; 1 if it had one. */
static int s_unmark (struct node *n, uint32_t tenant)
{
    struct mark *m = s_mark (n, tenant);
    if (!m)
        return 0;
    *m = n->marks[--n->nmarks];
    return 1;
}

/* Index where key is, or would be inserted, in n's kids; *found set. */
static uint32_t s_kid_slot (const struct node *n, uint32_t key, int *found)
{
    uint32_t lo = 0, hi = n->nkids;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (n->kids[mid]->key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < n->nkids && n->kids[lo]->key == key;
    return lo;
}

static int s_kid_insert (struct node *n, uint32_t at, struct node *kid)
{
    if (n->nkids == n->ckids) {
        uint32_t c = n->ckids ? 2 * n->ckids : 2;
        struct node **a = realloc (n->kids, c * sizeof *a);
        if (!a)
            return RX_ENOMEM;
        n->kids = a;
        n->ckids = c;
    }
    memmove (n->kids + at + 1, n->kids + at, (n->nkids - at) * sizeof *n->kids);
    n->kids[at] = kid;
    n->nkids++;
    kid->parent = n;
    return RX_OK;
}

static void s_node_free (struct node *n)
{
    free (n->edge);
    free (n->kids);
    free (n->marks);
    free (n);
}

/* A leaf under parent holding text[0..len); not yet linked. */
static struct node *s_node_new (const char *text, size_t len)
{
    struct node *n = calloc (1, sizeof *n);
    if (!n)
        return NULL;
    n->edge = malloc (len);
    if (!n->edge) {
        free (n);
        return NULL;
    }
    memcpy (n->edge, text, len);
    n->elen = len;
    n->echars = rx_rtree_chars (text, len);
    n->key = s_key ((const unsigned char *) text, s_clen ((const unsigned char *) text, len));
    return n;
}

/* Unlink n (which holds no mark, hence has no kids) from its parent and
 * free it. */
static void s_node_drop (rx_rtree_t *t, struct node *n)
{
    struct node *p = n->parent;
    int found;
    uint32_t i = s_kid_slot (p, n->key, &found);
    memmove (p->kids + i, p->kids + i + 1, (p->nkids - i - 1) * sizeof *p->kids);
    p->nkids--;
    t->nodes--;
    t->chars -= n->echars;
    s_node_free (n);
}

/* Split c after its first `bytes` bytes (`chars` characters, 0 < bytes <
 * c->elen): a new node takes the head of the edge and c's marks, c keeps
 * the tail under it.  Returns the head, or NULL (nothing changed). */
static struct node *s_split (rx_rtree_t *t, struct node *c, size_t bytes, size_t chars)
{
    struct node *h = s_node_new (c->edge, bytes);
    if (!h)
        return NULL;
    h->kids = malloc (2 * sizeof *h->kids);
    h->marks = malloc (c->nmarks * sizeof *h->marks);
    if (!h->kids || !h->marks) {
        s_node_free (h);
        return NULL;
    }
    h->ckids = 2;
    memcpy (h->marks, c->marks, c->nmarks * sizeof *h->marks);
    h->nmarks = h->cmarks = c->nmarks;
    h->echars = chars;
    struct node *p = c->parent;
    int found;
    uint32_t i = s_kid_slot (p, c->key, &found);
    p->kids[i] = h;                       /* same first character, same slot */
    h->parent = p;
    memmove (c->edge, c->edge + bytes, c->elen - bytes);
    c->elen -= bytes;
    c->echars -= chars;
    c->key = s_key ((unsigned char *) c->edge, s_clen ((unsigned char *) c->edge, c->elen));
    h->kids[0] = c;
    h->nkids = 1;
    c->parent = h;
    t->nodes++;
    return h;
}

/* The first kid of n at index >= from that tenant holds; its index in *at. */
static struct node *s_kid_held (const struct node *n, uint32_t from, uint32_t tenant, uint32_t *at)
{
    for (uint32_t i = from; i < n->nkids; i++)
        if (s_mark (n->kids[i], tenant)) {
            *at = i;
            return n->kids[i];
        }
    return NULL;
}

/* ------------------------------------------------------------------- tree -- */

rx_rtree_t *rx_rtree_new (struct rx_err *err)
{
    rx_rtree_t *t = calloc (1, sizeof *t);
    if (!t)
        rx_err_set (err, RX_ENOMEM, "route tree: out of memory");
    return t;
}

void rx_rtree_destroy (rx_rtree_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    rx_rtree_t *t = *self_p;
    struct node *cur = &t->root;
    for (;;) {
        if (cur->nkids) {
            cur = cur->kids[cur->nkids - 1];
            continue;
        }
        if (cur == &t->root)
            break;
        struct node *p = cur->parent;
        s_node_free (cur);
        p->nkids--;
        cur = p;
    }
    free (t->root.kids);
    free (t->tenants);
    free (t->hits);
    free (t);
    *self_p = NULL;
}

int rx_rtree_add_tenant (rx_rtree_t *t, uint32_t tenant, struct rx_err *err)
{
    if (!s_tenant_get (t, tenant))
        return rx_err_set (err, RX_ENOMEM, "route tree: out of memory adding tenant %u", tenant);
    return RX_OK;
}

int rx_rtree_insert (rx_rtree_t *t, const char *text, size_t len, uint32_t tenant,
                     uint64_t now, struct rx_err *err)
{
    if (!text && len)
        return rx_err_set (err, RX_EINVAL, "route tree: insert of %zu bytes from a NULL text", len);
    struct tenant *tn = s_tenant_get (t, tenant);
    if (!tn)
        goto oom;
    struct node *n = &t->root;
    size_t pos = 0;
    while (pos < len) {
        const char *p = text + pos;
        size_t rest = len - pos;
        uint32_t key = s_key ((const unsigned char *) p, s_clen ((const unsigned char *) p, rest));
        int found;
        uint32_t at = s_kid_slot (n, key, &found);
        if (!found) {
            struct node *c = s_node_new (p, rest);
            if (!c)
                goto oom;
            if (s_mark_set (c, tenant, now) < 0 || s_kid_insert (n, at, c) != RX_OK) {
                s_node_free (c);
                goto oom;
            }
            t->nodes++;
            t->chars += c->echars;
            tn->size += c->echars;
            return RX_OK;
        }
        struct node *c = n->kids[at];
        size_t bytes, chars;
        s_common (c->edge, c->elen, p, rest, &bytes, &chars);
        if (bytes < c->elen) {         /* the text ends or leaves inside c's edge */
            c = s_split (t, c, bytes, chars);
            if (!c)
                goto oom;
        }
        int added = s_mark_set (c, tenant, now);
        if (added < 0)
            goto oom;
        if (added)
            tn->size += c->echars;
        pos += bytes;
        n = c;
    }
    return RX_OK;
oom:
    return rx_err_set (err, RX_ENOMEM, "route tree: out of memory inserting %zu bytes for tenant %u",
                       len, tenant);
}

int rx_rtree_match (rx_rtree_t *t, const char *text, size_t len,
                    struct rx_rtree_match *out, struct rx_err *err)
{
    if (!text && len)
        return rx_err_set (err, RX_EINVAL, "route tree: match of %zu bytes from a NULL text", len);
    if (t->chits < t->ntenants) {
        struct rx_rtree_hit *a = realloc (t->hits, t->ntenants * sizeof *a);
        if (!a)
            return rx_err_set (err, RX_ENOMEM, "route tree: out of memory matching");
        t->hits = a;
        t->chits = t->ntenants;
    }
    size_t nhits = 0, matched = 0, pos = 0;
    const struct node *n = &t->root;
    while (pos < len) {
        const char *p = text + pos;
        size_t rest = len - pos;
        uint32_t key = s_key ((const unsigned char *) p, s_clen ((const unsigned char *) p, rest));
        int found;
        uint32_t at = s_kid_slot (n, key, &found);
        if (!found)
            break;
        const struct node *c = n->kids[at];
        size_t bytes, chars;
        s_common (c->edge, c->elen, p, rest, &bytes, &chars);
        matched += chars;
        /* Whoever holds c holds all of its edge, so the matched part of it
         * counts even when the text leaves the edge midway.  Holders of c
         * hold its parent too: the hit list only shrinks going down, so the
         * first node lists every tenant and deeper nodes update. */
        if (n == &t->root) {
            for (uint32_t i = 0; i < c->nmarks && nhits < t->chits; i++)
                t->hits[nhits++] = (struct rx_rtree_hit) { c->marks[i].tenant, matched };
        } else {
            for (size_t i = 0; i < nhits; i++)
                if (s_mark (c, t->hits[i].tenant))
                    t->hits[i].chars = matched;
        }
        if (bytes < c->elen)
            break;
        pos += bytes;
        n = c;
    }
    *out = (struct rx_rtree_match) {
        .hits = t->hits, .nhits = nhits, .best = matched,
        .text_chars = rx_rtree_chars (text, len),
    };
    return RX_OK;
}

uint64_t rx_rtree_tenant_size (const rx_rtree_t *t, uint32_t tenant)
{
    const struct tenant *tn = s_tenant (t, tenant);
    return tn ? tn->size : 0;
}

size_t rx_rtree_tenant_count (const rx_rtree_t *t) { return t->ntenants; }
size_t rx_rtree_node_count (const rx_rtree_t *t) { return t->nodes; }
uint64_t rx_rtree_total_chars (const rx_rtree_t *t) { return t->chars; }

void rx_rtree_remove_tenant (rx_rtree_t *t, uint32_t tenant)
{
    struct tenant *tn = s_tenant (t, tenant);
    if (!tn)
        return;
    /* Post-order over the nodes it holds, without a stack: descend to a
     * held kid while there is one; else unmark the node (dropping it when
     * nobody holds it), and go back up.  Kids already done hold no mark of
     * the tenant any more, so rescanning a parent skips them. */
    struct node *cur = &t->root;
    for (;;) {
        uint32_t at;
        struct node *k = s_kid_held (cur, 0, tenant, &at);
        if (k) {
            cur = k;
            continue;
        }
        if (cur == &t->root)
            break;
        struct node *p = cur->parent;
        s_unmark (cur, tenant);
        if (cur->nmarks == 0)
            s_node_drop (t, cur);
        cur = p;
    }
    *tn = t->tenants[--t->ntenants];
}

/* -------------------------------------------------------------- eviction -- */

struct heap_ent {
    struct node *n;
    uint64_t time, seq;            /* seq: ties go in discovery order */
};

static int s_ent_lt (const struct heap_ent *a, const struct heap_ent *b)
{
    return a->time < b->time || (a->time == b->time && a->seq < b->seq);
}

static void s_heap_push (struct heap_ent *h, size_t *n, struct heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_ent_lt (&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct heap_ent s_heap_pop (struct heap_ent *h, size_t *n)
{
    struct heap_ent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct heap_ent *best = &last;
        if (l < *n && s_ent_lt (&h[l], best)) { m = l; best = &h[l]; }
        if (r < *n && s_ent_lt (&h[r], best)) { m = r; }
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* Calls fn on every node tenant holds that has no held kid, in pre-order. */
static void s_leaves (rx_rtree_t *t, uint32_t tenant,
                      void (*fn) (void *ud, struct node *n), void *ud)
{
    struct node *cur = &t->root;
    uint32_t from = 0;
    for (;;) {
        uint32_t at;
        struct node *k = s_kid_held (cur, from, tenant, &at);
        if (k) {
            cur = k;
            from = 0;
            continue;
        }
        if (cur == &t->root)
            return;
        /* from == 0 here means cur was entered and has no held kid. */
        if (from == 0)
            fn (ud, cur);
        struct node *p = cur->parent;
        int found;
        from = s_kid_slot (p, cur->key, &found) + 1;
        cur = p;
    }
}

struct leaf_acc {
    struct heap_ent *h;
    size_t n;
    uint64_t seq;
    uint32_t tenant;
    int count_only;
};

static void s_leaf_cb (void *ud, struct node *n)
{
    struct leaf_acc *a = ud;
    if (!a->count_only)
        s_heap_push (a->h, &a->n, (struct heap_ent) { n, s_mark (n, a->tenant)->time, a->seq });
    else
        a->n++;
    a->seq++;
}

int64_t rx_rtree_evict_tenant (rx_rtree_t *t, uint32_t tenant, uint64_t max_chars,
                               struct rx_err *err)
{
    struct tenant *tn = s_tenant (t, tenant);
    if (!tn || tn->size <= max_chars)
        return 0;
    struct leaf_acc a = { .tenant = tenant, .count_only = 1 };
    s_leaves (t, tenant, s_leaf_cb, &a);
    /* Each pop pushes at most one parent: the heap never outgrows the
     * leaves found now. */
    a.h = malloc ((a.n ? a.n : 1) * sizeof *a.h);
    if (!a.h)
        return rx_err_set (err, RX_ENOMEM, "route tree: out of memory evicting tenant %u", tenant);
    a.n = 0;
    a.seq = 0;
    a.count_only = 0;
    s_leaves (t, tenant, s_leaf_cb, &a);
    int64_t released = 0;
    while (tn->size > max_chars && a.n) {
        struct node *c = s_heap_pop (a.h, &a.n).n;
        struct node *p = c->parent;
        s_unmark (c, tenant);
        tn->size -= c->echars;
        released += (int64_t) c->echars;
        if (c->nmarks == 0)
            s_node_drop (t, c);
        uint32_t at;
        if (p != &t->root && !s_kid_held (p, 0, tenant, &at))
            s_heap_push (a.h, &a.n, (struct heap_ent) { p, s_mark (p, tenant)->time, a.seq++ });
    }
    free (a.h);
    return released;
}

int64_t rx_rtree_evict (rx_rtree_t *t, uint64_t max_chars, struct rx_err *err)
{
    int64_t total = 0;
    for (size_t i = 0; i < t->ntenants; i++) {
        int64_t r = rx_rtree_evict_tenant (t, t->tenants[i].id, max_chars, err);
        if (r < 0)
            return r;
        total += r;
    }
    return total;
}

/* ------------------------------------------------------------------ check -- */

int rx_rtree_check (const rx_rtree_t *t, struct rx_err *err)
{
    uint64_t *sizes = calloc (t->ntenants + 1, sizeof *sizes);
    if (!sizes)
        return rx_err_set (err, RX_ENOMEM, "route tree check: out of memory");
    int rc = RX_OK;
    size_t nodes = 0;
    uint64_t chars = 0;
    const struct node *cur = &t->root;
    uint32_t from = 0;
    if (t->root.nmarks || t->root.elen)
        { rc = rx_err_set (err, RX_EINTERNAL, "route tree: the root has an edge or a mark"); goto out; }
    for (;;) {
        if (from == 0) {                     /* first visit of cur */
            for (uint32_t i = 0; i < cur->nkids; i++) {
                const struct node *k = cur->kids[i];
                if (k->parent != cur)
                    { rc = rx_err_set (err, RX_EINTERNAL, "route tree: kid %u has a wrong parent", i); goto out; }
                if (i && cur->kids[i - 1]->key >= k->key)
                    { rc = rx_err_set (err, RX_EINTERNAL, "route tree: kids not sorted by distinct first characters"); goto out; }
            }
            if (cur != &t->root) {
                nodes++;
                chars += cur->echars;
                const unsigned char *e = (const unsigned char *) cur->edge;
                if (!cur->elen || cur->echars != rx_rtree_chars (cur->edge, cur->elen)
                    || cur->key != s_key (e, s_clen (e, cur->elen)))
                    { rc = rx_err_set (err, RX_EINTERNAL, "route tree: a node's edge, character count or key is wrong"); goto out; }
                if (!cur->nmarks)
                    { rc = rx_err_set (err, RX_EINTERNAL, "route tree: a node nobody holds was kept"); goto out; }
                for (uint32_t i = 0; i < cur->nmarks; i++) {
                    uint32_t id = cur->marks[i].tenant;
                    size_t ti = 0;
                    while (ti < t->ntenants && t->tenants[ti].id != id)
                        ti++;
                    if (ti == t->ntenants)
                        { rc = rx_err_set (err, RX_EINTERNAL, "route tree: mark of unknown tenant %u", id); goto out; }
                    sizes[ti] += cur->echars;
                    for (uint32_t j = 0; j < i; j++)
                        if (cur->marks[j].tenant == id)
                            { rc = rx_err_set (err, RX_EINTERNAL, "route tree: tenant %u marked twice on a node", id); goto out; }
                    if (cur->parent != &t->root && !s_mark (cur->parent, id))
                        { rc = rx_err_set (err, RX_EINTERNAL, "route tree: tenant %u holds a node but not its parent", id); goto out; }
                }
            }
        }
        if (from < cur->nkids) {
            cur = cur->kids[from];
            from = 0;
            continue;
        }
        if (cur == &t->root)
            break;
        const struct node *p = cur->parent;
        int found;
        from = s_kid_slot (p, cur->key, &found) + 1;
        cur = p;
    }
    if (nodes != t->nodes || chars != t->chars)
        { rc = rx_err_set (err, RX_EINTERNAL, "route tree: counted %zu nodes / %llu chars, recorded %zu / %llu",
                           nodes, (unsigned long long) chars, t->nodes, (unsigned long long) t->chars); goto out; }
    for (size_t i = 0; i < t->ntenants; i++)
        if (sizes[i] != t->tenants[i].size)
            { rc = rx_err_set (err, RX_EINTERNAL, "route tree: tenant %u size %llu, its marks hold %llu",
                               t->tenants[i].id, (unsigned long long) t->tenants[i].size,
                               (unsigned long long) sizes[i]); goto out; }
out:
    free (sizes);
    return rc;
}
