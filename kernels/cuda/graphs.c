/* kernels/cuda/graphs.c -- see graphs.h.  A small array scanned linearly:
 * a runner captures a handful of batch sizes (tens of graphs at most), and
 * a lookup per decode step costs nothing next to the step. */
#include <stdlib.h>

#include "graphs.h"

struct s_ent {
    uint64_t key;
    void *exec;
    uint64_t used;      /* tick of the last get/end */
};

struct rx_cugraphs {
    struct s_ent *ent;
    size_t n, cap;
    rx_cugraph_free_fn free_fn;
    void *ctx;
    uint64_t tick, evictions;
    int capturing;
    uint64_t cap_key;
};

rx_cugraphs_t *rx_cugraphs_new (size_t cap, rx_cugraph_free_fn free_fn, void *ctx,
                                struct rx_err *err)
{
    if (cap < 1 || cap > 4096) {
        rx_err_set (err, RX_EINVAL, "kernels-cuda graphs: capacity %zu (1..4096)", cap);
        return NULL;
    }
    rx_cugraphs_t *g = calloc (1, sizeof *g);
    if (g) g->ent = calloc (cap, sizeof *g->ent);
    if (!g || !g->ent) {
        free (g);
        rx_err_set (err, RX_ENOMEM, "kernels-cuda graphs: out of memory");
        return NULL;
    }
    g->cap = cap;
    g->free_fn = free_fn;
    g->ctx = ctx;
    return g;
}

static void s_release (rx_cugraphs_t *g, void *exec)
{
    if (exec && g->free_fn) g->free_fn (g->ctx, exec);
}

void rx_cugraphs_destroy (rx_cugraphs_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_cugraphs_t *g = *self_p;
    rx_cugraphs_clear (g);
    free (g->ent);
    free (g);
    *self_p = NULL;
}

static struct s_ent *s_find (const rx_cugraphs_t *g, uint64_t key)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->ent[i].key == key) return &g->ent[i];
    return NULL;
}

int rx_cugraphs_begin (rx_cugraphs_t *g, uint64_t key, struct rx_err *err)
{
    if (!g) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_begin: no graph table");
    if (g->capturing)
        return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_begin %llu: graph %llu is "
                           "still being captured", (unsigned long long) key,
                           (unsigned long long) g->cap_key);
    g->capturing = 1;
    g->cap_key = key;
    return RX_OK;
}

int rx_cugraphs_end (rx_cugraphs_t *g, uint64_t key, void *exec, struct rx_err *err)
{
    if (!g) return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_end: no graph table");
    if (!g->capturing || g->cap_key != key) {
        s_release (g, exec);
        if (!g->capturing)
            return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_end %llu: no capture in "
                               "progress", (unsigned long long) key);
        return rx_err_set (err, RX_EINVAL, "kernels-cuda graph_end %llu: the capture in "
                           "progress is graph %llu", (unsigned long long) key,
                           (unsigned long long) g->cap_key);
    }
    g->capturing = 0;
    struct s_ent *e = s_find (g, key);
    if (e) {
        s_release (g, e->exec);
    } else if (g->n < g->cap) {
        e = &g->ent[g->n++];
    } else {
        e = &g->ent[0];
        for (size_t i = 1; i < g->n; i++)
            if (g->ent[i].used < e->used) e = &g->ent[i];
        s_release (g, e->exec);
        g->evictions++;
    }
    e->key = key;
    e->exec = exec;
    e->used = ++g->tick;
    return RX_OK;
}

void rx_cugraphs_abort (rx_cugraphs_t *g)
{
    if (g) g->capturing = 0;
}

int rx_cugraphs_capturing (const rx_cugraphs_t *g, uint64_t *key)
{
    if (!g || !g->capturing) return 0;
    if (key) *key = g->cap_key;
    return 1;
}

void *rx_cugraphs_get (rx_cugraphs_t *g, uint64_t key)
{
    if (!g) return NULL;
    struct s_ent *e = s_find (g, key);
    if (!e) return NULL;
    e->used = ++g->tick;
    return e->exec;
}

int rx_cugraphs_has (const rx_cugraphs_t *g, uint64_t key)
{
    return g && s_find (g, key) != NULL;
}

int rx_cugraphs_drop (rx_cugraphs_t *g, uint64_t key)
{
    struct s_ent *e = g ? s_find (g, key) : NULL;
    if (!e) return RX_ENOENT;
    s_release (g, e->exec);
    *e = g->ent[--g->n];
    return RX_OK;
}

void rx_cugraphs_clear (rx_cugraphs_t *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->n; i++) s_release (g, g->ent[i].exec);
    g->n = 0;
}

size_t rx_cugraphs_count (const rx_cugraphs_t *g) { return g ? g->n : 0; }

uint64_t rx_cugraphs_evictions (const rx_cugraphs_t *g) { return g ? g->evictions : 0; }
