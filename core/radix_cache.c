/* core/radix_cache.c -- radix tree over token ids -> KV slots, with
 * reference-counted locks and LRU eviction by a logical clock.
 * See radix_cache.h for the contract.
 *
 * Layout: every node owns one buffer holding its edge's tokens followed by
 * their slots.  Children are kept in a small open-addressing hash table keyed
 * by a hash of the child's first page (linear probing, backward-shift
 * deletion), so a node costs nothing per vocabulary entry and a leaf has no
 * table at all.  The unlocked leaves -- the eviction candidates -- live in an
 * indexed binary min-heap ordered by (last access, creation seq); every node
 * knows its heap position, so lock/touch/delete are O(log n).
 *
 * Every mutating operation first finds what it will change and allocates all
 * it needs, then commits: an allocation failure leaves the tree unchanged. */
#include "radix_cache.h"

#include <stdlib.h>
#include <string.h>

#define NOT_IN_HEAP SIZE_MAX

struct rx_radix_node {
    struct rx_radix_node  *parent;     /* NULL for the root */
    int32_t               *key;        /* len tokens, then len slots (val) */
    int32_t               *val;
    size_t                 len;
    size_t                 depth;      /* tokens root..end of this edge */
    uint64_t               last;       /* logical clock of the last access */
    uint64_t               seq;        /* creation order (root 0) */
    uint32_t               lock;
    uint32_t               hash;       /* hash of key[0..page_size) */
    struct rx_radix_node **kids;       /* hash table [kcap] or NULL */
    uint32_t               kcap;
    uint32_t               nkids;
    size_t                 heap_idx;   /* NOT_IN_HEAP unless an evictable leaf */
};

struct rx_radix_cache {
    uint32_t          page_size;
    rx_radix_free_fn  free_fn;
    void             *free_ud;
    rx_radix_node_t  *root;
    uint64_t          clock;
    uint64_t          seq;
    size_t            n_nodes;         /* excluding the root */
    size_t            evictable;       /* tokens in nodes with lock == 0 */
    size_t            protected_;      /* tokens in nodes with lock > 0 */
    rx_radix_node_t **heap;
    size_t            heap_n, heap_cap;
};

/* ---- helpers: keys ------------------------------------------------------ */

/* Depends only on token values, never on addresses: the table layout (and
 * so every iteration order) is the same on every rank. */
static uint32_t s_hash_page (const int32_t *t, uint32_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < n; i++) {
        h ^= (uint32_t) t[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return (uint32_t) h;
}

/* Common prefix of a and b in whole pages. */
static size_t s_common (const int32_t *a, size_t alen, const int32_t *b, size_t blen, uint32_t ps)
{
    size_t lim = alen < blen ? alen : blen, i = 0;
    while (i < lim && a[i] == b[i]) i++;
    return i / ps * ps;
}

/* ---- helpers: child tables --------------------------------------------- */

static rx_radix_node_t *s_child_find (const rx_radix_cache_t *c, const rx_radix_node_t *x,
                                      const int32_t *page, uint32_t h)
{
    if (!x->kcap) return NULL;
    uint32_t mask = x->kcap - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        rx_radix_node_t *k = x->kids[i];
        if (!k) return NULL;
        if (k->hash == h && memcmp (k->key, page, c->page_size * sizeof *page) == 0) return k;
    }
}

static void s_child_put_raw (rx_radix_node_t **kids, uint32_t cap, rx_radix_node_t *k)
{
    uint32_t mask = cap - 1, i = k->hash & mask;
    while (kids[i]) i = (i + 1) & mask;
    kids[i] = k;
}

/* Make room for one more child (load factor <= 3/4).  Fails only on ENOMEM,
 * before anything changed. */
static int s_child_reserve (rx_radix_node_t *x)
{
    if ((x->nkids + 1) * 4 <= x->kcap * 3) return 0;
    uint32_t cap = x->kcap ? x->kcap * 2 : 4;
    rx_radix_node_t **kids = calloc (cap, sizeof *kids);
    if (!kids) return -1;
    for (uint32_t i = 0; i < x->kcap; i++)
        if (x->kids[i]) s_child_put_raw (kids, cap, x->kids[i]);
    free (x->kids);
    x->kids = kids;
    x->kcap = cap;
    return 0;
}

static void s_child_add (rx_radix_node_t *x, rx_radix_node_t *k)
{
    s_child_put_raw (x->kids, x->kcap, k);
    x->nkids++;
}

static uint32_t s_child_slot (const rx_radix_node_t *x, const rx_radix_node_t *k)
{
    uint32_t mask = x->kcap - 1, i = k->hash & mask;
    while (x->kids[i] != k) i = (i + 1) & mask;
    return i;
}

static void s_child_del (rx_radix_node_t *x, rx_radix_node_t *k)
{
    uint32_t mask = x->kcap - 1, i = s_child_slot (x, k);
    x->kids[i] = NULL;
    x->nkids--;
    if (x->nkids == 0) {                 /* leaves carry no table */
        free (x->kids);
        x->kids = NULL;
        x->kcap = 0;
        return;
    }
    /* Backward-shift deletion keeps every probe chain unbroken. */
    for (uint32_t j = (i + 1) & mask; x->kids[j]; j = (j + 1) & mask) {
        uint32_t home = x->kids[j]->hash & mask;
        /* Move kids[j] into the hole if its home is not in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            x->kids[i] = x->kids[j];
            x->kids[j] = NULL;
            i = j;
        }
    }
}

/* ---- helpers: the eviction heap ----------------------------------------- */

/* LRU by the logical clock; ties go to the older node, so the order is a
 * pure function of the operation sequence. */
static int s_before (const rx_radix_node_t *a, const rx_radix_node_t *b)
{
    return a->last < b->last || (a->last == b->last && a->seq < b->seq);
}

static void s_heap_set (rx_radix_cache_t *c, size_t i, rx_radix_node_t *x)
{
    c->heap[i] = x;
    x->heap_idx = i;
}

static void s_heap_up (rx_radix_cache_t *c, size_t i)
{
    rx_radix_node_t *x = c->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_before (x, c->heap[p])) break;
        s_heap_set (c, i, c->heap[p]);
        i = p;
    }
    s_heap_set (c, i, x);
}

static void s_heap_down (rx_radix_cache_t *c, size_t i)
{
    rx_radix_node_t *x = c->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const rx_radix_node_t *best = x;
        if (l < c->heap_n && s_before (c->heap[l], best)) { m = l; best = c->heap[l]; }
        if (l + 1 < c->heap_n && s_before (c->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        s_heap_set (c, i, c->heap[m]);
        i = m;
    }
    s_heap_set (c, i, x);
}

/* Capacity for every node to be a leaf; reserved before nodes are made so
 * that pushes (in unlock, evict) never fail. */
static int s_heap_reserve (rx_radix_cache_t *c, size_t n)
{
    if (n <= c->heap_cap) return 0;
    size_t cap = c->heap_cap ? c->heap_cap : 64;
    while (cap < n) cap *= 2;
    rx_radix_node_t **h = realloc (c->heap, cap * sizeof *h);
    if (!h) return -1;
    c->heap = h;
    c->heap_cap = cap;
    return 0;
}

static void s_heap_remove (rx_radix_cache_t *c, rx_radix_node_t *x)
{
    size_t i = x->heap_idx;
    x->heap_idx = NOT_IN_HEAP;
    if (i == --c->heap_n) return;
    rx_radix_node_t *y = c->heap[c->heap_n];   /* the last one fills the hole */
    s_heap_set (c, i, y);
    s_heap_up (c, i);
    s_heap_down (c, y->heap_idx);
}

/* Put x in or out of the heap after its lock, children or clock changed. */
static void s_update_leaf (rx_radix_cache_t *c, rx_radix_node_t *x)
{
    int evictable = x != c->root && x->nkids == 0 && x->lock == 0;
    if (evictable && x->heap_idx == NOT_IN_HEAP) {
        s_heap_set (c, c->heap_n++, x);
        s_heap_up (c, x->heap_idx);
    } else if (!evictable && x->heap_idx != NOT_IN_HEAP) {
        s_heap_remove (c, x);
    }
}

/* Stamp x and its ancestors with the clock.  Keys only grow (the clock never
 * goes back), so a leaf in the heap only needs to sink. */
static void s_touch_path (rx_radix_cache_t *c, rx_radix_node_t *x)
{
    for (; x; x = x->parent) {
        if (x->last == c->clock) continue;
        x->last = c->clock;
        if (x->heap_idx != NOT_IN_HEAP) s_heap_down (c, x->heap_idx);
    }
}

/* ---- helpers: nodes ----------------------------------------------------- */

static rx_radix_node_t *s_node_new (size_t len)
{
    rx_radix_node_t *x = calloc (1, sizeof *x);
    if (!x) return NULL;
    x->heap_idx = NOT_IN_HEAP;
    if (len) {
        x->key = malloc (2 * len * sizeof *x->key);
        if (!x->key) {
            free (x);
            return NULL;
        }
        x->val = x->key + len;
    }
    return x;
}

static void s_node_free (rx_radix_node_t *x)
{
    free (x->key);
    free (x->kids);
    free (x);
}

/* A split prepared before commit: the new upper node and its child table. */
struct split {
    rx_radix_node_t *child;   /* node to split (becomes the lower part) */
    size_t           m;       /* tokens that go to the upper part */
    rx_radix_node_t *upper;
};

static int s_split_prepare (struct split *sp, rx_radix_node_t *child, size_t m)
{
    sp->child = child;
    sp->m = m;
    sp->upper = s_node_new (m);
    if (!sp->upper) return -1;
    if (s_child_reserve (sp->upper) < 0) {   /* room for 2 kids (cap 4) */
        s_node_free (sp->upper);
        sp->upper = NULL;
        return -1;
    }
    return 0;
}

/* child -> upper (child's first m tokens) -> child (the rest).  The handle
 * `child` stays the lower part, so a lock held on it keeps its meaning. */
static rx_radix_node_t *s_split_commit (rx_radix_cache_t *c, struct split *sp)
{
    rx_radix_node_t *ch = sp->child, *up = sp->upper, *par = ch->parent;
    size_t m = sp->m, rest = ch->len - m;
    memcpy (up->key, ch->key, m * sizeof *up->key);
    memcpy (up->val, ch->val, m * sizeof *up->val);
    up->len = m;
    up->depth = par->depth + m;
    up->parent = par;
    up->lock = ch->lock;       /* the same requests hold both halves */
    up->last = ch->last;
    up->seq = ++c->seq;
    up->hash = ch->hash;       /* same first page: takes ch's place */
    par->kids[s_child_slot (par, ch)] = up;

    /* In place: the remaining tokens then slots, packed to the front. */
    memmove (ch->key, ch->key + m, rest * sizeof *ch->key);
    memmove (ch->key + rest, ch->val + m, rest * sizeof *ch->val);
    ch->val = ch->key + rest;
    ch->len = rest;
    ch->hash = s_hash_page (ch->key, c->page_size);
    ch->parent = up;
    s_child_add (up, ch);
    c->n_nodes++;
    sp->upper = NULL;
    return up;
}

/* ---- public API --------------------------------------------------------- */

rx_radix_cache_t *rx_radix_cache_new (uint32_t page_size, rx_radix_free_fn free_fn,
                                      void *free_ud, struct rx_err *err)
{
    if (page_size < 1 || page_size > 4096) {
        rx_err_set (err, RX_EINVAL, "radix_cache: page_size %u out of range (1..4096)",
                    page_size);
        return NULL;
    }
    if (!free_fn) {
        rx_err_set (err, RX_EINVAL, "radix_cache: a free callback is required");
        return NULL;
    }
    rx_radix_cache_t *c = calloc (1, sizeof *c);
    if (c) c->root = s_node_new (0);
    if (!c || !c->root) {
        free (c);
        rx_err_set (err, RX_ENOMEM, "radix_cache: out of memory");
        return NULL;
    }
    c->page_size = page_size;
    c->free_fn = free_fn;
    c->free_ud = free_ud;
    return c;
}

void rx_radix_cache_destroy (rx_radix_cache_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_radix_cache_t *c = *self_p;
    /* Iterative post-order through parent links: chains of nodes can be
     * thousands deep (one node per inserted chunk). */
    rx_radix_node_t *x = c->root;
    while (x) {
        if (x->nkids) {
            /* kcap doubles as a cursor that only moves down: each table
             * entry is looked at once. */
            while (!x->kids[x->kcap - 1]) x->kcap--;
            rx_radix_node_t *k = x->kids[--x->kcap];
            x->nkids--;
            x = k;
            continue;
        }
        rx_radix_node_t *p = x->parent;
        s_node_free (x);
        x = p;
    }
    free (c->heap);
    free (c);
    *self_p = NULL;
}

uint32_t rx_radix_cache_page_size (const rx_radix_cache_t *c) { return c->page_size; }
uint64_t rx_radix_cache_tick (rx_radix_cache_t *c) { return ++c->clock; }
uint64_t rx_radix_cache_clock (const rx_radix_cache_t *c) { return c->clock; }
size_t rx_radix_cache_evictable_size (const rx_radix_cache_t *c) { return c->evictable; }
size_t rx_radix_cache_protected_size (const rx_radix_cache_t *c) { return c->protected_; }
size_t rx_radix_cache_total_size (const rx_radix_cache_t *c) { return c->evictable + c->protected_; }
size_t rx_radix_cache_node_count (const rx_radix_cache_t *c) { return c->n_nodes; }
rx_radix_node_t *rx_radix_cache_root (const rx_radix_cache_t *c) { return c->root; }
size_t rx_radix_node_depth (const rx_radix_node_t *x) { return x->depth; }
uint64_t rx_radix_node_seq (const rx_radix_node_t *x) { return x->seq; }
uint32_t rx_radix_node_lock_ref (const rx_radix_node_t *x) { return x->lock; }
rx_radix_node_t *rx_radix_node_parent (const rx_radix_node_t *x) { return x->parent; }

/* Walk down as far as tokens[0..n) matches whole edges.  Returns the deepest
 * node fully matched and the matched length; *cut and *cut_m describe an edge the
 * match ends inside of (cut NULL when it ends on a node boundary).  Copies
 * the matched slots when slots_out is set.  Changes nothing. */
static rx_radix_node_t *s_walk (const rx_radix_cache_t *c, const int32_t *tokens, size_t n,
                                int32_t *slots_out, size_t *pos_out, rx_radix_node_t **cut,
                                size_t *cut_m)
{
    uint32_t ps = c->page_size;
    rx_radix_node_t *x = c->root;
    size_t pos = 0;
    *cut = NULL;
    *cut_m = 0;
    while (pos < n) {
        rx_radix_node_t *k = s_child_find (c, x, tokens + pos, s_hash_page (tokens + pos, ps));
        if (!k) break;
        size_t m = s_common (k->key, k->len, tokens + pos, n - pos, ps);
        if (slots_out) memcpy (slots_out + pos, k->val, m * sizeof *slots_out);
        if (m < k->len) {
            *cut = k;
            *cut_m = m;
            pos += m;
            break;
        }
        x = k;
        pos += m;
    }
    *pos_out = pos;
    return x;
}

int rx_radix_cache_match (rx_radix_cache_t *c, const int32_t *tokens, size_t n,
                          int32_t *slots_out, struct rx_radix_match *out, struct rx_err *err)
{
    if (!out) return rx_err_set (err, RX_EINVAL, "radix_cache: match without a result");
    if (n > 0 && !tokens)
        return rx_err_set (err, RX_EINVAL, "radix_cache: match of %zu tokens from NULL", n);
    n = n / c->page_size * c->page_size;
    size_t pos, cut_m;
    rx_radix_node_t *cut;
    rx_radix_node_t *x = s_walk (c, tokens, n, slots_out, &pos, &cut, &cut_m);
    if (cut) {
        struct split sp = { 0 };
        if (s_split_prepare (&sp, cut, cut_m) < 0 || s_heap_reserve (c, c->n_nodes + 1) < 0) {
            if (sp.upper) s_node_free (sp.upper);
            return rx_err_set (err, RX_ENOMEM, "radix_cache: out of memory splitting a node");
        }
        x = s_split_commit (c, &sp);
    }
    s_touch_path (c, x);
    out->len = out->prefix_len = pos;
    out->last = x;
    return RX_OK;
}

int rx_radix_cache_insert (rx_radix_cache_t *c, const int32_t *tokens, const int32_t *slots,
                           size_t n, struct rx_radix_match *out, struct rx_err *err)
{
    if (!out) return rx_err_set (err, RX_EINVAL, "radix_cache: insert without a result");
    if (n > 0 && (!tokens || !slots))
        return rx_err_set (err, RX_EINVAL, "radix_cache: insert of %zu tokens from NULL", n);
    n = n / c->page_size * c->page_size;
    size_t pos, cut_m;
    rx_radix_node_t *cut;
    rx_radix_node_t *x = s_walk (c, tokens, n, NULL, &pos, &cut, &cut_m);
    for (size_t i = pos; i < n; i++)
        if (slots[i] < 0)
            return rx_err_set (err, RX_EINVAL, "radix_cache: insert: token %zu has slot %d",
                               i, slots[i]);

    /* Prepare: the split, the new leaf, room in the parent's table. */
    struct split sp = { 0 };
    rx_radix_node_t *leaf = NULL;
    size_t rest = n - pos;
    int fail = cut && s_split_prepare (&sp, cut, cut_m) < 0;
    if (!fail && rest) {
        leaf = s_node_new (rest);
        fail = !leaf || (!cut && s_child_reserve (x) < 0);
    }
    if (!fail) fail = s_heap_reserve (c, c->n_nodes + 2) < 0;
    if (fail) {
        if (sp.upper) s_node_free (sp.upper);
        if (leaf) s_node_free (leaf);
        return rx_err_set (err, RX_ENOMEM, "radix_cache: out of memory inserting %zu tokens",
                           rest);
    }

    /* Commit. */
    if (cut) x = s_split_commit (c, &sp);
    if (leaf) {
        memcpy (leaf->key, tokens + pos, rest * sizeof *leaf->key);
        memcpy (leaf->val, slots + pos, rest * sizeof *leaf->val);
        leaf->len = rest;
        leaf->depth = x->depth + rest;
        leaf->parent = x;
        leaf->last = c->clock;
        leaf->seq = ++c->seq;
        leaf->hash = s_hash_page (leaf->key, c->page_size);
        s_child_add (x, leaf);
        c->n_nodes++;
        c->evictable += rest;
        s_update_leaf (c, x);
        s_update_leaf (c, leaf);
        x = leaf;
    }
    s_touch_path (c, x);
    out->prefix_len = pos;
    out->len = n;
    out->last = x;
    return RX_OK;
}

/* NULL, or a node whose parent chain does not end at this root. */
static int s_check_node (const rx_radix_cache_t *c, const rx_radix_node_t *node,
                         const char *op, struct rx_err *err)
{
    if (!node) return rx_err_set (err, RX_EINVAL, "radix_cache: %s of a NULL node", op);
    const rx_radix_node_t *x = node;
    while (x->parent) x = x->parent;
    if (x != c->root)
        return rx_err_set (err, RX_EINVAL, "radix_cache: %s of a node of another cache", op);
    return RX_OK;
}

int rx_radix_cache_lock (rx_radix_cache_t *c, rx_radix_node_t *node, struct rx_err *err)
{
    int rc = s_check_node (c, node, "lock", err);
    if (rc) return rc;
    for (rx_radix_node_t *x = node; x != c->root; x = x->parent) {
        if (x->lock == UINT32_MAX)
            return rx_err_set (err, RX_ERANGE, "radix_cache: lock count overflow");
    }
    for (rx_radix_node_t *x = node; x != c->root; x = x->parent) {
        if (x->lock++ == 0) {
            c->evictable -= x->len;
            c->protected_ += x->len;
            s_update_leaf (c, x);
        }
    }
    return RX_OK;
}

int rx_radix_cache_unlock (rx_radix_cache_t *c, rx_radix_node_t *node, struct rx_err *err)
{
    int rc = s_check_node (c, node, "unlock", err);
    if (rc) return rc;
    /* An ancestor's count is at least its descendant's, so checking the
     * node itself covers the whole path. */
    if (node != c->root && node->lock == 0)
        return rx_err_set (err, RX_EINVAL, "radix_cache: unlock of a node that is not locked "
                           "(depth %zu)", node->depth);
    for (rx_radix_node_t *x = node; x != c->root; x = x->parent) {
        if (--x->lock == 0) {
            c->evictable += x->len;
            c->protected_ -= x->len;
            s_update_leaf (c, x);
        }
    }
    return RX_OK;
}

size_t rx_radix_cache_evict (rx_radix_cache_t *c, size_t n_tokens)
{
    size_t freed = 0;
    while (freed < n_tokens && c->heap_n > 0) {
        rx_radix_node_t *x = c->heap[0];
        s_heap_remove (c, x);
        c->free_fn (c->free_ud, x->val, x->len);
        freed += x->len;
        c->evictable -= x->len;
        rx_radix_node_t *p = x->parent;
        s_child_del (p, x);
        s_node_free (x);
        c->n_nodes--;
        s_update_leaf (c, p);      /* the parent may now be a candidate */
    }
    return freed;
}

size_t rx_radix_cache_flush (rx_radix_cache_t *c, size_t *locked_out)
{
    size_t freed = rx_radix_cache_evict (c, SIZE_MAX);
    if (locked_out) *locked_out = c->protected_;
    return freed;
}

static uintptr_t s_view_parent (const void *ctx, uintptr_t node)
{
    (void) ctx;
    const rx_radix_node_t *x = (const rx_radix_node_t *) node;
    return x->parent ? (uintptr_t) x->parent : node;
}

void rx_radix_cache_tree_view (const rx_radix_cache_t *c, struct rx_tree_view *view)
{
    view->ctx = c;
    view->root = (uintptr_t) c->root;
    view->parent = s_view_parent;
}

/* A growable stack for the walks below. */
struct stack {
    const rx_radix_node_t **v;
    size_t n, cap;
};

static int s_push (struct stack *s, const rx_radix_node_t *x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        const rx_radix_node_t **v = realloc (s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

static int s_push_kids (struct stack *s, const rx_radix_node_t *x)
{
    /* Reverse table order, so children pop in table order. */
    for (uint32_t i = x->kcap; i-- > 0;)
        if (x->kids[i] && s_push (s, x->kids[i]) < 0) return -1;
    return 0;
}

int rx_radix_cache_visit (const rx_radix_cache_t *c,
                          int (*fn) (void *ud, const struct rx_radix_node_info *info),
                          void *ud)
{
    struct stack s = { 0 };
    int rc = 0;
    if (s_push_kids (&s, c->root) < 0) rc = RX_ENOMEM;
    while (!rc && s.n) {
        const rx_radix_node_t *x = s.v[--s.n];
        struct rx_radix_node_info info = {
            .node = x, .parent = x->parent, .start = x->depth - x->len, .len = x->len,
            .tokens = x->key, .slots = x->val, .lock_ref = x->lock, .last_access = x->last,
            .seq = x->seq,
        };
        rc = fn (ud, &info);
        if (!rc && s_push_kids (&s, x) < 0) rc = RX_ENOMEM;
    }
    free (s.v);
    return rc;
}

int rx_radix_cache_check (const rx_radix_cache_t *c, struct rx_err *err)
{
    struct stack s = { 0 };
    size_t nodes = 0, evictable = 0, protected_ = 0, leaves = 0;
    int rc = RX_OK;
    const rx_radix_node_t *root = c->root;
#define FAIL(...) do { rc = rx_err_set (err, RX_EINTERNAL, "radix_cache check: " __VA_ARGS__); \
                       goto out; } while (0)
    if (root->parent || root->len || root->depth || root->lock || root->heap_idx != NOT_IN_HEAP)
        FAIL ("bad root");
    if (s_push (&s, root) < 0) FAIL ("out of memory");
    while (s.n) {
        const rx_radix_node_t *x = s.v[--s.n];
        uint32_t seen = 0;
        uint64_t kid_locks = 0;
        for (uint32_t i = 0; i < x->kcap; i++) {
            const rx_radix_node_t *k = x->kids[i];
            if (!k) continue;
            seen++;
            kid_locks += k->lock;
            if (k->parent != x) FAIL ("node seq %llu: wrong parent", (unsigned long long) k->seq);
            if (s_child_find (c, x, k->key, k->hash) != k)
                FAIL ("node seq %llu: not found in its parent's table",
                      (unsigned long long) k->seq);
            if (s_push (&s, k) < 0) FAIL ("out of memory");
        }
        if (seen != x->nkids) FAIL ("child count %u, table holds %u", x->nkids, seen);
        if (x->kcap & (x->kcap - 1)) FAIL ("table size %u not a power of two", x->kcap);
        if (x->nkids && x->nkids * 4 > x->kcap * 3) FAIL ("child table overfull");
        if (!x->nkids && x->kids) FAIL ("leaf with a table");
        if (kid_locks > x->lock && x != root)
            FAIL ("node seq %llu: lock %u below its children's %llu",
                  (unsigned long long) x->seq, x->lock, (unsigned long long) kid_locks);
        if (x == root) continue;
        nodes++;
        if (x->len == 0 || x->len % c->page_size)
            FAIL ("node seq %llu: edge of %zu tokens", (unsigned long long) x->seq, x->len);
        if (x->depth != x->parent->depth + x->len)
            FAIL ("node seq %llu: depth %zu", (unsigned long long) x->seq, x->depth);
        if (x->hash != s_hash_page (x->key, c->page_size))
            FAIL ("node seq %llu: stale hash", (unsigned long long) x->seq);
        if (x->val != x->key + x->len) FAIL ("node seq %llu: bad buffer", (unsigned long long) x->seq);
        if (x->seq == 0 || x->seq > c->seq) FAIL ("node seq %llu out of range", (unsigned long long) x->seq);
        if (x->last > c->clock) FAIL ("node seq %llu: access after the clock", (unsigned long long) x->seq);
        if (x->lock) protected_ += x->len; else evictable += x->len;
        int leaf = x->nkids == 0 && x->lock == 0;
        leaves += leaf;
        if (leaf != (x->heap_idx != NOT_IN_HEAP))
            FAIL ("node seq %llu: heap membership wrong", (unsigned long long) x->seq);
        if (leaf && (x->heap_idx >= c->heap_n || c->heap[x->heap_idx] != x))
            FAIL ("node seq %llu: bad heap index", (unsigned long long) x->seq);
    }
    if (nodes != c->n_nodes) FAIL ("%zu nodes, counter says %zu", nodes, c->n_nodes);
    if (evictable != c->evictable || protected_ != c->protected_)
        FAIL ("sizes evictable %zu protected %zu, counters %zu %zu", evictable, protected_,
              c->evictable, c->protected_);
    if (leaves != c->heap_n) FAIL ("%zu evictable leaves, heap holds %zu", leaves, c->heap_n);
    if (c->heap_n > c->heap_cap || c->heap_cap < c->n_nodes) FAIL ("heap capacity");
    for (size_t i = 1; i < c->heap_n; i++)
        if (s_before (c->heap[i], c->heap[(i - 1) / 2])) FAIL ("heap order at %zu", i);
#undef FAIL
out:
    free (s.v);
    return rc;
}
