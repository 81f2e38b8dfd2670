/* kernels/cpu/plugin.h -- the CPU backend instance shared by its modules.
 *
 * "Device" memory is host memory here (RX_KCAP_HOST_VISIBLE); streams are
 * synchronous; graphs are not captured (ops run eagerly).  The instance
 * owns a persistent thread pool and a scratch buffer that ops reuse. */
#ifndef RX_KCPU_PLUGIN_H
#define RX_KCPU_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include <radix/host.h>
#include <radix/kernel.h>

#include "guard.h"
#include "isa.h"
#include "pool.h"

struct rx_kbuf;     /* a tracked allocation (plugin.c) */

enum { RX_KW_AUTO = 0, RX_KW_MAP = 1, RX_KW_COPY = 2 };

struct rx_kcpu {
    const struct rx_host *host;
    rx_kpool_t *pool;
    int nth;
    int isa_id;
    const struct rx_kisa *isa;
    int weights_mode;             /* RX_KW_*: [kernels.cpu] weights */
    struct rx_kbuf *bufs;         /* every live alloc(), freed by destroy */
    struct rx_kgraphs *graphs;    /* [kernels.cpu] graphs: emulated graphs (graph.h); NULL = off */
    rx_kguard_t *guard;           /* [kernels.cpu] guard_device_memory: alloc()
                                   * and plain weights live in a region that
                                   * is PROT_NONE outside ops (guard.h); NULL = off */
    struct rx_kweight *weights;   /* every live weight */
    void  *scratch;               /* ops' temporary memory, 64-aligned */
    size_t scratch_cap;
    /* The last small activation matmul.c quantized, with a copy of its
     * source rows: the next matmul of equal rows (Q/K/V, gate/up of one
     * token) reuses it instead of quantizing again.  xq_buf: n rows of
     * xq_row_bytes, then n x in source floats; 64-aligned, owned. */
    void  *xq_buf;
    size_t xq_cap;
    int    xq_valid, xq_dtype, xq_repacked;
    size_t xq_in, xq_n, xq_row_bytes;
};

struct rx_kweight {
    uint32_t magic;
    int      dtype;
    uint32_t n_dims;
    uint64_t ne[4];
    size_t   row_bytes;           /* bytes of one row of ne[0] elements */
    int      repacked;            /* rows in the ISA path's layout, not GGML's */
    const uint8_t *data;
    void    *owned;               /* our copy (weights = copy), else NULL */
    void    *guarded;             /* guard mode: data copied into the guard region */
    size_t   owned_bytes;
    struct rx_kweight *prev, *next;
};

#define RX_KWEIGHT_MAGIC 0x7457584bu

/* Scratch of at least bytes (64-aligned), valid until the next call. */
void *rx_kcpu_scratch (struct rx_kcpu *k, size_t bytes);

/* Threads worth waking for `work` elementary operations. */
int rx_kcpu_threads_for (const struct rx_kcpu *k, double work);

#endif
