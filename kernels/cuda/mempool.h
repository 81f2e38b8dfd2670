/* kernels/cuda/mempool.h -- the CUDA backend's device memory pool, as plain
 * C over an abstract "chunk" allocator.
 *
 * Device memory comes from cudaMalloc in chunks (never managed memory):
 * small requests are carved out of shared chunks of cfg.chunk_bytes
 * (first fit, with the block split and the rest left free; freed blocks
 * merge with free neighbours), a request larger than cfg.big_bytes gets a
 * chunk of its own, rounded up to cfg.round_bytes, which goes back to the
 * device as soon as it is freed (weights are big; a dedicated chunk keeps
 * a model reload from fragmenting the shared ones).  Shared chunks stay
 * reserved until rx_cumem_trim() or destroy.
 *
 * The pool never touches the memory it manages: it only does address
 * arithmetic, so the tests drive it with malloc'ed chunks on the CPU and
 * the plugin with cudaMalloc/cudaFree.
 *
 * Thread-safety: none; one backend instance is driven by one thread. */
#ifndef RX_CUDA_MEMPOOL_H
#define RX_CUDA_MEMPOOL_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

typedef struct rx_cumem rx_cumem_t;

/* Get a chunk of `bytes` (*base aligned to at least 256); RX_OK or an
 * error status with err filled (e.g. RX_ENOMEM with cudaMalloc's message). */
typedef int (*rx_cumem_chunk_alloc_fn) (void *ctx, size_t bytes, void **base,
                                        struct rx_err *err);
typedef void (*rx_cumem_chunk_free_fn) (void *ctx, void *base);

struct rx_cumem_cfg {
    size_t chunk_bytes;     /* shared chunk size; 0 = 64 MiB */
    size_t big_bytes;       /* requests above get their own chunk; 0 = chunk_bytes / 2 */
    size_t round_bytes;     /* dedicated chunks round up to this; 0 = 2 MiB */
    size_t min_align;       /* every block's alignment at least; 0 = 256 */
};

/* Copy of cfg with every 0 replaced by its default; RX_EINVAL if a value
 * is not a power of two where it must be (round_bytes, min_align) or
 * big_bytes > chunk_bytes. */
int rx_cumem_cfg_resolve (const struct rx_cumem_cfg *in, struct rx_cumem_cfg *out,
                          struct rx_err *err);

/* The chunk size a request of bytes (alignment align) would get if no free
 * block can hold it: cfg.chunk_bytes for a small one, else the request
 * rounded up to round_bytes (cfg resolved). */
size_t rx_cumem_chunk_for (const struct rx_cumem_cfg *cfg, size_t bytes, size_t align);

/* cfg may be NULL (defaults).  The callbacks are required. */
rx_cumem_t *rx_cumem_new (const struct rx_cumem_cfg *cfg, rx_cumem_chunk_alloc_fn chunk_alloc,
                          rx_cumem_chunk_free_fn chunk_free, void *ctx, struct rx_err *err);
/* Gives every chunk back (blocks still in use included).  NULLs *self_p. */
void rx_cumem_destroy (rx_cumem_t **self_p);

/* bytes 0 is treated as 1; align 0 = min_align, else a power of two
 * <= 2 MiB.  RX_EINVAL (bad align), RX_ENOMEM (too large), or the chunk
 * allocator's status. */
int rx_cumem_alloc (rx_cumem_t *m, size_t bytes, size_t align, void **ptr, struct rx_err *err);
/* RX_OK, or RX_ENOENT if ptr is not the start of a block in use here. */
int rx_cumem_free (rx_cumem_t *m, void *ptr);
/* 1 if [ptr, ptr + bytes) lies inside one block in use. */
int rx_cumem_contains (const rx_cumem_t *m, const void *ptr, size_t bytes);
/* Give back shared chunks that are entirely free; returns how many. */
size_t rx_cumem_trim (rx_cumem_t *m);

struct rx_cumem_stats {
    size_t in_use;          /* bytes of blocks in use (as rounded) */
    size_t reserved;        /* bytes of all chunks */
    size_t n_chunks;
    size_t n_blocks;        /* blocks in use */
    size_t n_free_blocks;
};
void rx_cumem_stats (const rx_cumem_t *m, struct rx_cumem_stats *st);

#endif
