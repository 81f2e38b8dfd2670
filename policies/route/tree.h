/* policies/route/tree.h -- the approximate radix tree of cache_aware
 * (sgl-router's "approx tree"): one tree over the request texts routed to
 * every worker, with per-worker ("tenant") marks.
 *
 * The tree works on the bytes of the text but only ever splits between
 * characters: a character is one byte plus the continuation bytes
 * (10xxxxxx) that follow it, at most three, so valid UTF-8 splits at code
 * points and any other byte string still has one fixed segmentation (a
 * stray continuation byte is a character of its own).  Lengths and sizes are
 * in characters.
 *
 * Each node holds an edge (a non-empty run of characters), its children
 * (keyed by their first character) and, per tenant that holds it, the last
 * time the tenant inserted a text through it.  A tenant that holds a node
 * holds all its ancestors, so "tenant T holds the first k characters of a
 * text" is well defined; its size is the number of characters in the nodes
 * it holds.  A node nobody holds is freed at once.  Times are the caller's
 * (cache_aware uses a counter): only their order matters.
 *
 * Compiled into the cache_aware plugin (plugins do not link the core) and
 * into its unit test.  Not thread-safe: the caller serialises every call. */
#ifndef RX_ROUTE_TREE_H
#define RX_ROUTE_TREE_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

typedef struct rx_rtree rx_rtree_t;

/* One tenant's longest match (in characters) of a text. */
struct rx_rtree_hit {
    uint32_t tenant;
    size_t   chars;
};

/* The result of rx_rtree_match.  hits: every tenant that holds at least
 * the text's first character, with its longest match; borrowed from the
 * tree until its next call.  best: the largest hits[].chars (0 if none);
 * text_chars: characters in the text. */
struct rx_rtree_match {
    const struct rx_rtree_hit *hits;
    size_t nhits;
    size_t best;
    size_t text_chars;
};

/* An empty tree; NULL + err on allocation failure.  Caller owns it. */
rx_rtree_t *rx_rtree_new (struct rx_err *err);
/* Frees every node.  NULLs *self_p; NULL or *NULL is a no-op. */
void rx_rtree_destroy (rx_rtree_t **self_p);

/* Characters in text[0..len) (the segmentation above). */
size_t rx_rtree_chars (const char *text, size_t len);

/* Make tenant known (size 0) if it is not; RX_ENOMEM on failure. */
int rx_rtree_add_tenant (rx_rtree_t *t, uint32_t tenant, struct rx_err *err);

/* Record that tenant holds text[0..len) as of time now: every node on the
 * text's path is marked with (tenant, now), splitting an edge where the
 * text ends or leaves it.  len 0 only makes the tenant known.  text may be
 * NULL only when len is 0.  On RX_ENOMEM a prefix of the text may have been
 * recorded; the tree stays consistent. */
int rx_rtree_insert (rx_rtree_t *t, const char *text, size_t len, uint32_t tenant,
                     uint64_t now, struct rx_err *err);

/* Longest match of text[0..len) per tenant (see struct rx_rtree_match).
 * Does not change access times (the caller inserts what it routes).
 * RX_EINVAL for text NULL with len > 0, RX_ENOMEM when the result array
 * cannot grow. */
int rx_rtree_match (rx_rtree_t *t, const char *text, size_t len,
                    struct rx_rtree_match *out, struct rx_err *err);

/* Characters tenant holds (0 for an unknown tenant). */
uint64_t rx_rtree_tenant_size (const rx_rtree_t *t, uint32_t tenant);
/* Known tenants (added, or inserted under, and not removed). */
size_t rx_rtree_tenant_count (const rx_rtree_t *t);
/* Nodes in the tree, root excluded, and characters stored in them (each
 * character once, however many tenants hold it). */
size_t rx_rtree_node_count (const rx_rtree_t *t);
uint64_t rx_rtree_total_chars (const rx_rtree_t *t);

/* Drop every mark of tenant and forget it (freeing nodes nobody holds any
 * more); an unknown tenant is a no-op. */
void rx_rtree_remove_tenant (rx_rtree_t *t, uint32_t tenant);

/* While tenant holds more than max_chars characters, take its mark off its
 * least-recently-used leaf (a node it holds under which it holds nothing).
 * Whole edges go, so the size may end below max_chars.  Returns the
 * characters released, or RX_ENOMEM (as a negative int64) when the work
 * list cannot be allocated (nothing changed then). */
int64_t rx_rtree_evict_tenant (rx_rtree_t *t, uint32_t tenant, uint64_t max_chars,
                               struct rx_err *err);
/* rx_rtree_evict_tenant for every known tenant; characters released, or a
 * negative status. */
int64_t rx_rtree_evict (rx_rtree_t *t, uint64_t max_chars, struct rx_err *err);

/* Check every invariant (children sorted by distinct first characters,
 * edges non-empty and split at characters, marks held by ancestors, no
 * unheld node, sizes equal to the marks).  RX_EINTERNAL + err naming the
 * first broken one; for tests. */
int rx_rtree_check (const rx_rtree_t *t, struct rx_err *err);

#endif
