/* kernels/cpu/graph.c -- see graph.h. */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

struct s_rec {
    rx_kgraph_fn fn;
    size_t off;                   /* its argument copy in the graph's arena */
};

struct s_graph {
    uint64_t key;
    uint64_t used;                /* last capture or launch (LRU) */
    struct s_rec *recs;
    size_t n_recs, cap_recs;
    unsigned char *arena;         /* argument copies, 16-aligned each */
    size_t arena_len, arena_cap;
};

struct rx_kgraphs {
    struct s_graph *g;            /* max_graphs slots; key valid when recs != NULL or used */
    int *live;
    size_t max;
    uint64_t clock, launches;
    int capturing;
    struct s_graph cap;           /* the capture in progress */
    int launching;                /* a launch is running its records (host_fn may call back) */
    int clear_pending;            /* rx_kgraphs_clear during a launch: done when it ends */
};

static void s_graph_free (struct s_graph *g)
{
    free (g->recs);
    free (g->arena);
    memset (g, 0, sizeof *g);
}

rx_kgraphs_t *rx_kgraphs_new (size_t max_graphs, struct rx_err *err)
{
    if (max_graphs == 0) max_graphs = 1;
    rx_kgraphs_t *t = calloc (1, sizeof *t);
    if (t) {
        t->g = calloc (max_graphs, sizeof *t->g);
        t->live = calloc (max_graphs, sizeof *t->live);
    }
    if (!t || !t->g || !t->live) {
        if (t) {
            free (t->g);
            free (t->live);
        }
        free (t);
        rx_err_set (err, RX_ENOMEM, "kernels-cpu graphs: out of memory");
        return NULL;
    }
    t->max = max_graphs;
    return t;
}

void rx_kgraphs_destroy (rx_kgraphs_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_kgraphs_t *t = *self_p;
    for (size_t i = 0; i < t->max; i++) s_graph_free (&t->g[i]);
    s_graph_free (&t->cap);
    free (t->g);
    free (t->live);
    free (t);
    *self_p = NULL;
}

int rx_kgraphs_begin (rx_kgraphs_t *g, uint64_t key, struct rx_err *err)
{
    if (g->launching)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_begin %llu: called from inside a "
                           "graph launch (a host_fn cannot capture)", (unsigned long long) key);
    if (g->capturing)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_begin %llu: graph %llu is being "
                           "captured", (unsigned long long) key, (unsigned long long) g->cap.key);
    s_graph_free (&g->cap);
    g->cap.key = key;
    g->capturing = 1;
    return RX_OK;
}

int rx_kgraphs_capturing (const rx_kgraphs_t *g, uint64_t *key)
{
    if (g && g->capturing && key) *key = g->cap.key;
    return g && g->capturing;
}

int rx_kgraphs_record (rx_kgraphs_t *g, rx_kgraph_fn fn, const void *args, size_t bytes,
                       struct rx_err *err)
{
    struct s_graph *c = &g->cap;
    size_t off = (c->arena_len + 15) & ~(size_t) 15;
    if (c->n_recs == c->cap_recs) {
        size_t n = c->cap_recs ? 2 * c->cap_recs : 64;
        struct s_rec *r = realloc (c->recs, n * sizeof *r);
        if (!r) return rx_err_set (err, RX_ENOMEM, "kernels-cpu graph capture: out of memory");
        c->recs = r;
        c->cap_recs = n;
    }
    if (off + bytes > c->arena_cap) {
        size_t n = c->arena_cap ? 2 * c->arena_cap : 4096;
        while (n < off + bytes) n *= 2;
        unsigned char *a = realloc (c->arena, n);
        if (!a) return rx_err_set (err, RX_ENOMEM, "kernels-cpu graph capture: out of memory");
        c->arena = a;
        c->arena_cap = n;
    }
    memcpy (c->arena + off, args, bytes);
    c->arena_len = off + bytes;
    c->recs[c->n_recs++] = (struct s_rec) { fn, off };
    return RX_OK;
}

void rx_kgraphs_abort (rx_kgraphs_t *g)
{
    s_graph_free (&g->cap);
    g->capturing = 0;
}

static struct s_graph *s_find (const rx_kgraphs_t *g, uint64_t key)
{
    for (size_t i = 0; i < g->max; i++)
        if (g->live[i] && g->g[i].key == key) return &g->g[i];
    return NULL;
}

int rx_kgraphs_end (rx_kgraphs_t *g, uint64_t key, struct rx_err *err)
{
    if (!g->capturing)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_end %llu: no capture in progress",
                           (unsigned long long) key);
    if (g->cap.key != key) {
        uint64_t running = g->cap.key;
        rx_kgraphs_abort (g);
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_end %llu: graph %llu is being "
                           "captured (dropped)", (unsigned long long) key,
                           (unsigned long long) running);
    }
    struct s_graph *slot = s_find (g, key);
    if (!slot) {
        /* a free slot, else the least recently used one */
        size_t best = 0;
        for (size_t i = 0; i < g->max; i++) {
            if (!g->live[i]) {
                best = i;
                break;
            }
            if (g->g[i].used < g->g[best].used) best = i;
        }
        slot = &g->g[best];
        g->live[best] = 1;
    }
    s_graph_free (slot);
    *slot = g->cap;
    slot->used = ++g->clock;
    memset (&g->cap, 0, sizeof g->cap);
    g->capturing = 0;
    return RX_OK;
}

int rx_kgraphs_launch (rx_kgraphs_t *g, void *be, rx_kstream_t *s, uint64_t key,
                       struct rx_err *err)
{
    if (g->capturing)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_launch %llu: graph %llu is being "
                           "captured", (unsigned long long) key, (unsigned long long) g->cap.key);
    if (g->launching)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu graph_launch %llu: called from inside a "
                           "graph launch (a host_fn cannot launch)", (unsigned long long) key);
    struct s_graph *gr = s_find (g, key);
    if (!gr)
        return rx_err_set (err, RX_ENOENT, "kernels-cpu graph_launch: graph %llu was not "
                           "captured (or was dropped): capture it again", (unsigned long long) key);
    gr->used = ++g->clock;
    g->launches++;
    /* A record may be a host_fn that calls the backend's ops: they run
     * (nothing is being captured), but a free inside it must not drop the
     * graph under this loop (clear waits for the end of the launch). */
    g->launching = 1;
    int rc = RX_OK;
    for (size_t i = 0; i < gr->n_recs && rc == RX_OK; i++)
        rc = gr->recs[i].fn (be, s, gr->arena + gr->recs[i].off, err);
    g->launching = 0;
    if (g->clear_pending) rx_kgraphs_clear (g);
    return rc;
}

int rx_kgraphs_has (const rx_kgraphs_t *g, uint64_t key)
{
    return g && s_find (g, key) != NULL;
}

void rx_kgraphs_clear (rx_kgraphs_t *g)
{
    if (!g) return;
    if (g->launching) {
        g->clear_pending = 1;
        return;
    }
    g->clear_pending = 0;
    for (size_t i = 0; i < g->max; i++) {
        s_graph_free (&g->g[i]);
        g->live[i] = 0;
    }
}

size_t rx_kgraphs_count (const rx_kgraphs_t *g)
{
    size_t n = 0;
    for (size_t i = 0; g && i < g->max; i++) n += g->live[i] != 0;
    return n;
}

uint64_t rx_kgraphs_launches (const rx_kgraphs_t *g)
{
    return g ? g->launches : 0;
}
