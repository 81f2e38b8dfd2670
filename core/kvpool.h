/* core/kvpool.h -- KV slot bookkeeping: the token-slot allocator, the
 * request -> token-slot table, and sizing the pool from [cache] kv_memory.
 *
 * The KV memory itself (one K and one V row per slot and layer) is device
 * memory allocated by the attention backend; this module only hands out and
 * takes back integer slot indices 0..n_slots-1 (SGLang's
 * TokenToKVPoolAllocator and ReqToTokenPool).  A runner that wants a scratch
 * slot for padded tokens (CUDA-graph padding) sizes its device buffer with
 * one more row and uses index n_slots for it; the allocator never hands it
 * out.
 *
 * Paging: with page_size P > 1 slots are handed out in whole pages of P
 * consecutive slots (slot = page * P + offset), so that paged attention
 * kernels can address a page by its first slot.  A request's last page may be
 * partly used; rx_kvpool_alloc_extend() keeps filling it before taking a new
 * page.  A page goes back to the free list when every slot of it that was
 * handed out has been freed -- so the radix cache (which owns only whole
 * pages) and a request (which owns the partial tail) can free their parts
 * independently.
 *
 * Determinism: every operation is a pure function of the sequence of calls
 * (a LIFO free-page stack, no hashing of addresses, no clocks), so every rank
 * that runs the same scheduler steps hands out the same slots.
 *
 * Thread-safety: none; one scheduler thread owns a pool and its row table. */
#ifndef RX_KVPOOL_H
#define RX_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

/* Largest pool: slot indices must fit int32 (attention kernels index with
 * int32). */
#define RX_KVPOOL_MAX_SLOTS     ((uint32_t) INT32_MAX)
#define RX_KVPOOL_MAX_PAGE_SIZE 4096u

/* ---- The token-slot allocator ---------------------------------------- */

typedef struct rx_kvpool rx_kvpool_t;

/* A pool of n_slots slots in pages of page_size (1..RX_KVPOOL_MAX_PAGE_SIZE);
 * n_slots must be a positive multiple of page_size and at most
 * RX_KVPOOL_MAX_SLOTS.  Caller owns the result; release with
 * rx_kvpool_destroy.  Memory: about 1 + 10/page_size bytes per slot. */
rx_kvpool_t *rx_kvpool_new (uint32_t n_slots, uint32_t page_size, struct rx_err *err);
/* Accepts NULL; sets *self_p to NULL. */
void rx_kvpool_destroy (rx_kvpool_t **self_p);

uint32_t rx_kvpool_page_size (const rx_kvpool_t *p);
/* Total slots (n_slots). */
uint32_t rx_kvpool_capacity (const rx_kvpool_t *p);
/* Slots in free pages: what rx_kvpool_alloc can hand out now (a multiple of
 * page_size).  Unused slots at the end of a partly used page do not count. */
uint32_t rx_kvpool_available (const rx_kvpool_t *p);
/* Slots handed out and not yet freed. */
uint32_t rx_kvpool_used (const rx_kvpool_t *p);
/* 1 if slot is handed out, 0 if not or out of range. */
int rx_kvpool_is_allocated (const rx_kvpool_t *p, int32_t slot);

/* Hand out n slots for a new sequence, starting on a fresh page: writes
 * them to out[0..n).  All or nothing: RX_EAGAIN (pool unchanged) when fewer
 * than ceil(n / page_size) pages are free -- the caller evicts from the radix
 * cache and retries.  n == 0 succeeds and writes nothing.  O(n). */
int rx_kvpool_alloc (rx_kvpool_t *p, uint32_t n, int32_t *out, struct rx_err *err);

/* Extend a sequence whose last slot is last_slot (-1: the sequence has no
 * slot yet, same as rx_kvpool_alloc): first the free slots after last_slot
 * in its page, then fresh pages.  last_slot must be handed out, and the
 * slots that follow it in its page must not be (RX_EINVAL otherwise: two
 * sequences would share a page tail).  All or nothing; RX_EAGAIN as above. */
int rx_kvpool_alloc_extend (rx_kvpool_t *p, int32_t last_slot, uint32_t n, int32_t *out,
                            struct rx_err *err);

/* Give back n slots.  Each must be handed out and appear once (RX_EINVAL
 * names the first bad one, pool unchanged: a double free is a bug worth a
 * loud message, never silent corruption).  A page returns to the free list
 * when its last handed-out slot is freed.  O(n). */
int rx_kvpool_free (rx_kvpool_t *p, const int32_t *slots, uint32_t n, struct rx_err *err);

/* ---- The request -> token-slot table ----------------------------------- */

/* A fixed table of max_requests rows of max_context int32 slots each
 * (SGLang's req_to_token): row r, position i holds the KV slot of the
 * request's i-th token.  Attention kernels read it directly (see
 * rx_kvpool_rows_table), hence one contiguous array. */
typedef struct rx_kvpool_rows rx_kvpool_rows_t;

/* Caller owns the result; release with rx_kvpool_rows_destroy.  Allocates
 * max_requests * max_context * 4 bytes (zero pages until touched). */
rx_kvpool_rows_t *rx_kvpool_rows_new (uint32_t max_requests, uint32_t max_context,
                                      struct rx_err *err);
void rx_kvpool_rows_destroy (rx_kvpool_rows_t **self_p);

uint32_t rx_kvpool_rows_max_requests (const rx_kvpool_rows_t *t);
uint32_t rx_kvpool_rows_max_context (const rx_kvpool_rows_t *t);
/* Rows not in use. */
uint32_t rx_kvpool_rows_available (const rx_kvpool_rows_t *t);

/* Take a free row (length 0): returns its index >= 0, or RX_EAGAIN when all
 * max_requests rows are in use.  Lowest index first on a fresh table; after
 * frees, the most recently freed row first (deterministic). */
int rx_kvpool_rows_alloc (rx_kvpool_rows_t *t, struct rx_err *err);
/* Release a row in use (RX_EINVAL for a bad or free row).  The slots it
 * lists are NOT freed: they belong to the pool/cache bookkeeping above. */
int rx_kvpool_rows_free (rx_kvpool_rows_t *t, int row, struct rx_err *err);
/* Append n slots at the end of the row; RX_ERANGE if the row would exceed
 * max_context (row unchanged). */
int rx_kvpool_rows_append (rx_kvpool_rows_t *t, int row, const int32_t *slots, uint32_t n,
                           struct rx_err *err);
/* Write n slots at positions pos..pos+n; pos <= length, and the length
 * grows to pos+n if that is longer (after a cache insert the scheduler
 * rewrites a request's prefix with the tree's slots). */
int rx_kvpool_rows_write (rx_kvpool_rows_t *t, int row, uint32_t pos, const int32_t *slots,
                          uint32_t n, struct rx_err *err);
/* Shorten a row to len <= its length (retraction). */
int rx_kvpool_rows_truncate (rx_kvpool_rows_t *t, int row, uint32_t len, struct rx_err *err);
/* The slots of a row in use and its length (NULL for a bad or free row).
 * Valid until the row is next modified or freed. */
const int32_t *rx_kvpool_rows_get (const rx_kvpool_rows_t *t, int row, uint32_t *len);
/* The whole table (row r starts at r * *stride), for kernels. */
const int32_t *rx_kvpool_rows_table (const rx_kvpool_rows_t *t, uint32_t *stride);

/* ---- Sizing ------------------------------------------------------------ */

/* Turn [cache] kv_memory into a slot count.  spec is either a size
 * ("8GiB", "512M", "1073741824": bytes of KV memory) or a fraction of
 * free_bytes ("0.8", or "80%"): a unitless number with a decimal point in
 * (0, 1], or a percentage in (0, 100].  The bytes are divided by
 * bytes_per_token (all layers, K and V) and rounded down to whole pages;
 * the result is capped at RX_KVPOOL_MAX_SLOTS (rounded down to a page).
 * Errors (one line naming [cache] kv_memory): unparsable spec, a fraction
 * out of range, bytes_per_token 0, or memory for less than one page.
 * Pure: free memory is a parameter (see rx_kvpool_meminfo_available). */
int rx_kvpool_size_slots (const char *spec, uint64_t bytes_per_token, uint64_t free_bytes,
                          uint32_t page_size, uint32_t *n_slots, struct rx_err *err);

/* MemAvailable from a meminfo file (path NULL: /proc/meminfo), in bytes.
 * RX_EIO if it cannot be read, RX_EFORMAT if it has no MemAvailable line. */
int rx_kvpool_meminfo_available (const char *path, uint64_t *bytes, struct rx_err *err);

#endif
