/* core/radix_cache.h -- the radix prefix cache: a radix tree over token ids
 * whose edges carry the KV slots of those tokens (SGLang's RadixCache).
 *
 * A request's prompt is matched on arrival (match), the matched node is
 * locked while the request runs (lock/unlock), and the request's tokens --
 * prompt and generated ones, so that multi-turn chats hit -- are inserted as
 * it progresses (insert).  Unlocked leaves are evicted least recently used
 * first when the KV pool runs short (evict), and everything unlocked can be
 * dropped at once (flush, POST /flush_cache).
 *
 * Slot ownership: the tree owns the slots of every token it holds and gives
 * them back only through the free callback given to rx_radix_cache_new
 * (eviction and flush).  insert() takes ownership of the slots it did not
 * already have; for the part that was already cached the caller keeps (and
 * frees) its own duplicate slots.
 *
 * Paging: with page_size P > 1 only whole pages are matched and inserted
 * (keys are cut down to a multiple of P), so every edge holds whole pages
 * and a node boundary never splits a page.
 *
 * Determinism: the LRU order uses a logical clock that the caller advances
 * (rx_radix_cache_tick: one tick per scheduler step, or per operation), never
 * wall time; ties are broken by node creation order (older first).  Children
 * are found through a per-node hash of the first page that never depends on
 * addresses.  So every rank that runs the same sequence of operations builds
 * the same tree, evicts the same nodes and frees the same slots in the same
 * order.
 *
 * Node handles: a match/insert result's node stays valid while it is locked;
 * an unlocked node may be freed by the next evict or flush.  Splitting a node
 * keeps the handle valid (the handle keeps the lower part of the edge and its
 * end depth).  Node pointers are not deterministic across processes: use
 * rx_radix_node_seq for an id that is.
 *
 * Thread-safety: none; one scheduler thread owns a cache. */
#ifndef RX_RADIX_CACHE_H
#define RX_RADIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/policy.h>

typedef struct rx_radix_cache rx_radix_cache_t;
typedef struct rx_radix_node rx_radix_node_t;

/* Called with the slots of one evicted node (n > 0), in eviction order.  It
 * must not call back into the cache.  Typically frees them to the kvpool. */
typedef void (*rx_radix_free_fn) (void *ud, const int32_t *slots, size_t n);

/* An empty cache (only the root) for keys cut to multiples of page_size
 * (1..4096).  free_fn (required) receives evicted slots.  Caller owns the
 * result; release with rx_radix_cache_destroy. */
rx_radix_cache_t *rx_radix_cache_new (uint32_t page_size, rx_radix_free_fn free_fn,
                                      void *free_ud, struct rx_err *err);
/* Releases the tree's memory WITHOUT calling free_fn (the pool usually goes
 * away with it); call rx_radix_cache_flush first to give the slots back.
 * Accepts NULL; sets *self_p to NULL. */
void rx_radix_cache_destroy (rx_radix_cache_t **self_p);

uint32_t rx_radix_cache_page_size (const rx_radix_cache_t *c);

/* The logical clock: every node a match or insert walks through is stamped
 * with it.  tick advances it by one and returns the new value. */
uint64_t rx_radix_cache_tick (rx_radix_cache_t *c);
uint64_t rx_radix_cache_clock (const rx_radix_cache_t *c);

/* The result of a match or insert. */
struct rx_radix_match {
    size_t           len;   /* tokens matched (match) or now cached (insert) */
    size_t           prefix_len;  /* insert: tokens that were cached before;
                                   * match: == len */
    rx_radix_node_t *last;  /* the node whose edge ends at depth len; the
                             * root when len == 0 */
};

/* Longest cached prefix of tokens[0..n), in whole pages.  The matched slots
 * go to slots_out[0..len) when slots_out is not NULL (room for n slots).
 * When the match ends inside an edge the node is split there, so out->last
 * ends exactly at len.  Stamps the matched nodes with the clock.
 * RX_ENOMEM (tree unchanged) if a split cannot allocate. */
int rx_radix_cache_match (rx_radix_cache_t *c, const int32_t *tokens, size_t n,
                          int32_t *slots_out, struct rx_radix_match *out, struct rx_err *err);

/* Insert tokens[0..n) with their slots, cut down to whole pages (len = n
 * rounded down to page_size; the caller keeps the slots past len).
 * out->prefix_len = how many of those tokens were cached already: the tree
 * keeps its own slots there and the caller still owns (and should free)
 * slots[0..prefix_len) it allocated itself.  The tree takes ownership of
 * slots[prefix_len..len).  out->last is the node ending at len (split if
 * needed).  Stamps the walked nodes and the new leaf with the clock.
 * RX_ENOMEM leaves the tree unchanged. */
int rx_radix_cache_insert (rx_radix_cache_t *c, const int32_t *tokens, const int32_t *slots,
                           size_t n, struct rx_radix_match *out, struct rx_err *err);

/* Reference counts on node and every ancestor (SGLang's inc/dec_lock_ref): a
 * locked node is never evicted.  Locking the root is a no-op.  unlock of a
 * node that is not locked is RX_EINVAL (nothing changes). */
int rx_radix_cache_lock (rx_radix_cache_t *c, rx_radix_node_t *node, struct rx_err *err);
int rx_radix_cache_unlock (rx_radix_cache_t *c, rx_radix_node_t *node, struct rx_err *err);

/* Evict unlocked leaves, least recently used first (clock, then creation
 * order); a parent that becomes an unlocked leaf joins the candidates.  Stops
 * once at least n_tokens are freed (whole nodes, so it may free more) or
 * nothing is evictable.  Returns the tokens freed.  O(k log L). */
size_t rx_radix_cache_evict (rx_radix_cache_t *c, size_t n_tokens);

/* Free every unlocked node (POST /flush_cache): the same order as evict.
 * Returns the tokens freed; *locked_out (if not NULL) gets the tokens that
 * stayed because running requests lock them (== protected size). */
size_t rx_radix_cache_flush (rx_radix_cache_t *c, size_t *locked_out);

/* Tokens in unlocked / locked nodes, and both together.  O(1). */
size_t rx_radix_cache_evictable_size (const rx_radix_cache_t *c);
size_t rx_radix_cache_protected_size (const rx_radix_cache_t *c);
size_t rx_radix_cache_total_size (const rx_radix_cache_t *c);
/* Nodes other than the root. */
size_t rx_radix_cache_node_count (const rx_radix_cache_t *c);

rx_radix_node_t *rx_radix_cache_root (const rx_radix_cache_t *c);
/* Tokens from the root to the end of node's edge (0 for the root). */
size_t rx_radix_node_depth (const rx_radix_node_t *node);
/* Creation sequence number (root 0): deterministic across ranks. */
uint64_t rx_radix_node_seq (const rx_radix_node_t *node);
uint32_t rx_radix_node_lock_ref (const rx_radix_node_t *node);
/* The parent (NULL for the root). */
rx_radix_node_t *rx_radix_node_parent (const rx_radix_node_t *node);

/* Fill a read-only tree view for schedule policies (radix/policy.h): node
 * ids are node pointers cast to uintptr_t; the view is valid while the cache
 * lives and only for nodes that are still in it. */
void rx_radix_cache_tree_view (const rx_radix_cache_t *c, struct rx_tree_view *view);

/* One node as the visitor sees it (borrowed for the callback only). */
struct rx_radix_node_info {
    const rx_radix_node_t *node;
    const rx_radix_node_t *parent;
    size_t         start;       /* depth where the edge begins */
    size_t         len;         /* tokens on the edge */
    const int32_t *tokens;      /* the edge's tokens [len] */
    const int32_t *slots;       /* their slots [len] */
    uint32_t       lock_ref;
    uint64_t       last_access; /* logical clock */
    uint64_t       seq;
};
/* Calls fn for every node but the root, parents before children, in a
 * deterministic order; stops early and returns fn's value when non-zero. */
int rx_radix_cache_visit (const rx_radix_cache_t *c,
                          int (*fn) (void *ud, const struct rx_radix_node_info *info),
                          void *ud);

/* Walks the whole tree and checks every invariant (parent links, page
 * alignment, child index, lock counts, size counters, the eviction heap).
 * RX_EINTERNAL with the first violation; for tests and debug builds. */
int rx_radix_cache_check (const rx_radix_cache_t *c, struct rx_err *err);

#endif
