/* kernels/cuda/graphs.h -- host-side bookkeeping of captured CUDA graphs.
 *
 * The kernel ABI keys graphs by a uint64 the caller chooses (the model
 * runner uses one key per decode batch size).  This table maps key ->
 * instantiated graph (an opaque pointer: a cudaGraphExec_t in the plugin,
 * anything in the tests), bounded to `cap` entries with least-recently-
 * launched eviction, and tracks the one capture that may be in progress:
 *   begin(key)  -> RX_EINVAL if a capture is already running;
 *   end(key, exec) -> stores exec under key (replacing and freeing an older
 *                  graph of that key; evicting the LRU one when full);
 *                  RX_EINVAL if no capture or a different key is running
 *                  (exec is freed: the caller never leaks it);
 *   abort()     -> forget the running capture (capture failed);
 *   get(key)    -> the exec (marks it used) or NULL;
 *   clear()     -> free every graph (device memory they reference was
 *                  freed or moved: replaying them would read stale pointers).
 * The free callback releases one exec (cudaGraphExecDestroy).
 *
 * Plain C so it is unit-tested without a GPU.  Thread-safety: none (one
 * thread drives a backend instance). */
#ifndef RX_CUDA_GRAPHS_H
#define RX_CUDA_GRAPHS_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

typedef struct rx_cugraphs rx_cugraphs_t;
typedef void (*rx_cugraph_free_fn) (void *ctx, void *exec);

/* cap: 1..4096 graphs kept.  free_fn may be NULL (nothing to release). */
rx_cugraphs_t *rx_cugraphs_new (size_t cap, rx_cugraph_free_fn free_fn, void *ctx,
                                struct rx_err *err);
/* Frees every stored exec.  NULLs *self_p; NULL is a no-op. */
void rx_cugraphs_destroy (rx_cugraphs_t **self_p);

int  rx_cugraphs_begin (rx_cugraphs_t *g, uint64_t key, struct rx_err *err);
int  rx_cugraphs_end (rx_cugraphs_t *g, uint64_t key, void *exec, struct rx_err *err);
void rx_cugraphs_abort (rx_cugraphs_t *g);
/* 1 and *key set while a capture runs, else 0. */
int  rx_cugraphs_capturing (const rx_cugraphs_t *g, uint64_t *key);

void  *rx_cugraphs_get (rx_cugraphs_t *g, uint64_t key);
int    rx_cugraphs_has (const rx_cugraphs_t *g, uint64_t key);
/* Free one graph; RX_ENOENT if key has none. */
int    rx_cugraphs_drop (rx_cugraphs_t *g, uint64_t key);
void   rx_cugraphs_clear (rx_cugraphs_t *g);
size_t rx_cugraphs_count (const rx_cugraphs_t *g);
/* Graphs evicted for space since creation (for logs and tests). */
uint64_t rx_cugraphs_evictions (const rx_cugraphs_t *g);

#endif
