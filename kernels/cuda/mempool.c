/* kernels/cuda/mempool.c -- see mempool.h.
 *
 * Blocks of all chunks sit in one address-ordered list per chunk (a chunk
 * is split into consecutive blocks that cover it exactly), so merging a
 * freed block with its neighbours is two pointer checks.  Lookups are
 * linear: a backend instance holds some hundreds of blocks (weights, KV
 * pool, activations), allocated once at start-up. */
#include <stdlib.h>
#include <string.h>

#include "mempool.h"

#define S_MIB ((size_t) 1 << 20)

struct s_chunk;

struct s_block {
    uintptr_t addr;
    size_t size;
    int used;
    struct s_chunk *chunk;
    struct s_block *prev, *next;      /* neighbours inside the chunk */
};

struct s_chunk {
    void *base;
    size_t size;
    int dedicated;
    struct s_block *first;
    struct s_chunk *next;
};

struct rx_cumem {
    struct rx_cumem_cfg cfg;
    rx_cumem_chunk_alloc_fn chunk_alloc;
    rx_cumem_chunk_free_fn chunk_free;
    void *ctx;
    struct s_chunk *chunks;
};

static int s_pow2 (size_t v) { return v && !(v & (v - 1)); }

static size_t s_round_up (size_t v, size_t a) { return (v + a - 1) / a * a; }

int rx_cumem_cfg_resolve (const struct rx_cumem_cfg *in, struct rx_cumem_cfg *out,
                          struct rx_err *err)
{
    struct rx_cumem_cfg c = { 0 };
    if (in) c = *in;
    if (!c.chunk_bytes) c.chunk_bytes = 64 * S_MIB;
    if (!c.big_bytes) c.big_bytes = c.chunk_bytes / 2;
    if (!c.round_bytes) c.round_bytes = 2 * S_MIB;
    if (!c.min_align) c.min_align = 256;
    if (!s_pow2 (c.round_bytes) || !s_pow2 (c.min_align) || c.min_align > 2 * S_MIB)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda pool: round_bytes %zu and min_align "
                           "%zu must be powers of two (min_align <= 2 MiB)", c.round_bytes,
                           c.min_align);
    if (c.big_bytes > c.chunk_bytes || c.chunk_bytes % c.min_align)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda pool: big_bytes %zu must be <= "
                           "chunk_bytes %zu, a multiple of min_align %zu", c.big_bytes,
                           c.chunk_bytes, c.min_align);
    *out = c;
    return RX_OK;
}

/* Bytes a request needs in a fresh chunk: chunks are at least
 * min_align-aligned, so a larger alignment may need a leading pad of up to
 * align - min_align. */
static size_t s_need (const struct rx_cumem_cfg *cfg, size_t bytes, size_t align)
{
    if (align < cfg->min_align) align = cfg->min_align;
    size_t need = s_round_up (bytes ? bytes : 1, cfg->min_align);
    if (align > cfg->min_align) need += align - cfg->min_align;
    return need;
}

size_t rx_cumem_chunk_for (const struct rx_cumem_cfg *cfg, size_t bytes, size_t align)
{
    size_t need = s_need (cfg, bytes, align);
    if (need <= cfg->big_bytes) return cfg->chunk_bytes;
    return s_round_up (need, cfg->round_bytes);
}

rx_cumem_t *rx_cumem_new (const struct rx_cumem_cfg *cfg, rx_cumem_chunk_alloc_fn chunk_alloc,
                          rx_cumem_chunk_free_fn chunk_free, void *ctx, struct rx_err *err)
{
    if (!chunk_alloc || !chunk_free) {
        rx_err_set (err, RX_EINVAL, "kernels-cuda pool: chunk callbacks missing");
        return NULL;
    }
    struct rx_cumem_cfg c;
    if (rx_cumem_cfg_resolve (cfg, &c, err) != RX_OK) return NULL;
    rx_cumem_t *m = calloc (1, sizeof *m);
    if (!m) {
        rx_err_set (err, RX_ENOMEM, "kernels-cuda pool: out of memory");
        return NULL;
    }
    m->cfg = c;
    m->chunk_alloc = chunk_alloc;
    m->chunk_free = chunk_free;
    m->ctx = ctx;
    return m;
}

static void s_chunk_release (rx_cumem_t *m, struct s_chunk *c)
{
    struct s_block *b = c->first;
    while (b) {
        struct s_block *n = b->next;
        free (b);
        b = n;
    }
    m->chunk_free (m->ctx, c->base);
    free (c);
}

void rx_cumem_destroy (rx_cumem_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_cumem_t *m = *self_p;
    while (m->chunks) {
        struct s_chunk *c = m->chunks;
        m->chunks = c->next;
        s_chunk_release (m, c);
    }
    free (m);
    *self_p = NULL;
}

/* Carve [addr, addr + size) out of free block b (which contains it): the
 * parts before and after stay free blocks.  Returns the used block or NULL
 * (out of host memory; nothing changed). */
static struct s_block *s_carve (struct s_block *b, uintptr_t addr, size_t size)
{
    size_t pre = addr - b->addr, post = b->addr + b->size - (addr + size);
    struct s_block *pb = NULL, *nb = NULL;
    if (pre && !(pb = malloc (sizeof *pb))) return NULL;
    if (post && !(nb = malloc (sizeof *nb))) {
        free (pb);
        return NULL;
    }
    if (pb) {
        *pb = (struct s_block) { .addr = b->addr, .size = pre, .chunk = b->chunk,
                                 .prev = b->prev, .next = b };
        if (b->prev) b->prev->next = pb; else b->chunk->first = pb;
        b->prev = pb;
    }
    if (nb) {
        *nb = (struct s_block) { .addr = addr + size, .size = post, .chunk = b->chunk,
                                 .prev = b, .next = b->next };
        if (b->next) b->next->prev = nb;
        b->next = nb;
    }
    b->addr = addr;
    b->size = size;
    b->used = 1;
    return b;
}

static struct s_block *s_fit (struct s_chunk *c, size_t size, size_t align)
{
    for (struct s_block *b = c->first; b; b = b->next) {
        if (b->used) continue;
        uintptr_t a = s_round_up (b->addr, align);
        if (a - b->addr <= b->size && b->size - (a - b->addr) >= size) return s_carve (b, a, size);
    }
    return NULL;
}

int rx_cumem_alloc (rx_cumem_t *m, size_t bytes, size_t align, void **ptr, struct rx_err *err)
{
    if (!m || !ptr) return rx_err_set (err, RX_EINVAL, "kernels-cuda alloc: NULL argument");
    *ptr = NULL;
    if (align == 0) align = m->cfg.min_align;
    if (!s_pow2 (align) || align > 2 * S_MIB)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda alloc: align %zu is not a power of two "
                           "<= 2 MiB", align);
    if (align < m->cfg.min_align) align = m->cfg.min_align;
    if (bytes > ((size_t) 1 << 48))
        return rx_err_set (err, RX_ENOMEM, "kernels-cuda alloc: %zu bytes is too large", bytes);
    size_t size = s_round_up (bytes ? bytes : 1, m->cfg.min_align);
    size_t csize = rx_cumem_chunk_for (&m->cfg, bytes, align);
    const int big = s_need (&m->cfg, bytes, align) > m->cfg.big_bytes;
    if (!big)
        for (struct s_chunk *c = m->chunks; c; c = c->next) {
            if (c->dedicated) continue;
            struct s_block *b = s_fit (c, size, align);
            if (b) {
                *ptr = (void *) b->addr;
                return RX_OK;
            }
        }
    struct s_chunk *c = calloc (1, sizeof *c);
    struct s_block *b = calloc (1, sizeof *b);
    if (!c || !b) {
        free (c);
        free (b);
        return rx_err_set (err, RX_ENOMEM, "kernels-cuda alloc: out of host memory");
    }
    int rc = m->chunk_alloc (m->ctx, csize, &c->base, err);
    if (rc != RX_OK) {
        free (c);
        free (b);
        return rc;
    }
    c->size = csize;
    c->dedicated = big;
    *b = (struct s_block) { .addr = (uintptr_t) c->base, .size = csize, .chunk = c };
    c->first = b;
    c->next = m->chunks;
    m->chunks = c;
    struct s_block *u = s_fit (c, size, align);
    if (!u) {
        /* Cannot happen (csize covers size + pad) unless host malloc failed. */
        m->chunks = c->next;
        s_chunk_release (m, c);
        return rx_err_set (err, RX_ENOMEM, "kernels-cuda alloc: out of host memory");
    }
    *ptr = (void *) u->addr;
    return RX_OK;
}

static struct s_block *s_find (const rx_cumem_t *m, uintptr_t a, struct s_chunk **chunk_out,
                               struct s_chunk **prev_out)
{
    struct s_chunk *prev = NULL;
    for (struct s_chunk *c = m->chunks; c; prev = c, c = c->next) {
        uintptr_t base = (uintptr_t) c->base;
        if (a < base || a >= base + c->size) continue;
        for (struct s_block *b = c->first; b; b = b->next)
            if (a >= b->addr && a < b->addr + b->size) {
                if (chunk_out) *chunk_out = c;
                if (prev_out) *prev_out = prev;
                return b;
            }
    }
    return NULL;
}

int rx_cumem_free (rx_cumem_t *m, void *ptr)
{
    if (!m || !ptr) return RX_ENOENT;
    struct s_chunk *c, *cprev;
    struct s_block *b = s_find (m, (uintptr_t) ptr, &c, &cprev);
    if (!b || !b->used || b->addr != (uintptr_t) ptr) return RX_ENOENT;
    b->used = 0;
    if (c->dedicated) {
        if (cprev) cprev->next = c->next; else m->chunks = c->next;
        s_chunk_release (m, c);
        return RX_OK;
    }
    struct s_block *n = b->next;
    if (n && !n->used) {
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        free (n);
    }
    struct s_block *p = b->prev;
    if (p && !p->used) {
        p->size += b->size;
        p->next = b->next;
        if (b->next) b->next->prev = p;
        free (b);
    }
    return RX_OK;
}

int rx_cumem_contains (const rx_cumem_t *m, const void *ptr, size_t bytes)
{
    if (!m || !ptr) return 0;
    struct s_block *b = s_find (m, (uintptr_t) ptr, NULL, NULL);
    if (!b || !b->used) return 0;
    return bytes <= b->addr + b->size - (uintptr_t) ptr;
}

size_t rx_cumem_trim (rx_cumem_t *m)
{
    if (!m) return 0;
    size_t n = 0;
    struct s_chunk **pp = &m->chunks;
    while (*pp) {
        struct s_chunk *c = *pp;
        if (!c->dedicated && !c->first->used && !c->first->next) {
            *pp = c->next;
            s_chunk_release (m, c);
            n++;
        } else {
            pp = &c->next;
        }
    }
    return n;
}

void rx_cumem_stats (const rx_cumem_t *m, struct rx_cumem_stats *st)
{
    memset (st, 0, sizeof *st);
    if (!m) return;
    for (struct s_chunk *c = m->chunks; c; c = c->next) {
        st->n_chunks++;
        st->reserved += c->size;
        for (struct s_block *b = c->first; b; b = b->next) {
            if (b->used) {
                st->n_blocks++;
                st->in_use += b->size;
            } else {
                st->n_free_blocks++;
            }
        }
    }
}
