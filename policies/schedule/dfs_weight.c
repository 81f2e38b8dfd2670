/* policies/schedule/dfs_weight.c -- SGLang's "dfs-weight": the weight of a
 * radix-tree node is the number of waiting requests whose matched node lies
 * in its subtree; requests are ordered by a depth-first walk from the root
 * that visits heavier children first and lists a node's own requests after
 * its children's (SGLang's _get_dfs_priority), so requests sharing a prefix
 * run together while that prefix is cached.
 *
 * Determinism: node ids are addresses, so they are only used to find nodes
 * (a hash table), never to order them: children of equal weight are ordered
 * by the smallest arrival number in their subtree, which every rank agrees
 * on.  Requests of one node get the same priority; the core then sorts them
 * by arrival. */
#include <stdlib.h>
#include <string.h>

#include <radix/plugin.h>
#include <radix/policy.h>

struct s_node {
    uintptr_t id;
    int32_t   parent;        /* index, -1 for the root */
    int32_t   first_child;   /* after sorting: children as a linked list */
    int32_t   next_sibling;
    uint64_t  weight;
    uint64_t  min_arrival;
    double    prio;
};

struct s_ctx {
    struct s_node *nodes;
    size_t n, cap;
    int32_t *table;          /* open addressing: index into nodes, -1 empty */
    size_t tcap;             /* power of two */
};

static size_t s_hash (uintptr_t id, size_t mask)
{
    uint64_t x = (uint64_t) id * 0x9e3779b97f4a7c15ull;
    return (size_t) (x >> 17) & mask;
}

/* Index of id, adding it when absent; -1 on allocation failure. */
static int32_t s_get (struct s_ctx *c, uintptr_t id, int *added)
{
    size_t mask = c->tcap - 1;
    for (size_t h = s_hash (id, mask);; h = (h + 1) & mask) {
        if (c->table[h] < 0) {
            if (c->n == c->cap) return -1;   /* sized up front: cannot happen */
            struct s_node *nd = &c->nodes[c->n];
            memset (nd, 0, sizeof *nd);
            nd->id = id;
            nd->parent = -1;
            nd->first_child = nd->next_sibling = -1;
            nd->min_arrival = UINT64_MAX;
            c->table[h] = (int32_t) c->n;
            *added = 1;
            return (int32_t) c->n++;
        }
        if (c->nodes[c->table[h]].id == id) {
            *added = 0;
            return c->table[h];
        }
    }
}

/* Heavier first, then the smaller arrival (unique per request). */
static int s_cmp_child (const void *a, const void *b, void *ud)
{
    const struct s_node *base = ud;
    const struct s_node *x = &base[*(const int32_t *) a], *y = &base[*(const int32_t *) b];
    if (x->weight != y->weight) return x->weight > y->weight ? -1 : 1;
    return (x->min_arrival > y->min_arrival) - (x->min_arrival < y->min_arrival);
}

static int s_prioritize (void *inst, struct rx_sched_item *items, size_t n,
                         const struct rx_tree_view *tree, uint64_t seed, struct rx_err *err)
{
    (void) inst; (void) seed;
    if (n == 0) return RX_OK;
    struct s_ctx c = { 0 };
    /* Count the path lengths to size everything once. */
    size_t total = 1;
    for (size_t i = 0; i < n; i++) {
        uintptr_t v = items[i].node ? items[i].node : tree->root;
        while (v != tree->root) {
            total++;
            v = tree->parent (tree->ctx, v);
        }
    }
    c.cap = total;
    c.tcap = 16;
    while (c.tcap < 2 * total) c.tcap *= 2;
    c.nodes = malloc (c.cap * sizeof *c.nodes);
    c.table = malloc (c.tcap * sizeof *c.table);
    int32_t *order = malloc (c.cap * sizeof *order);
    int32_t *stack = malloc (4 * c.cap * sizeof *stack);
    if (!c.nodes || !c.table || !order || !stack) {
        free (c.nodes); free (c.table); free (order); free (stack);
        return rx_err_set (err, RX_ENOMEM, "sched-dfs_weight: out of memory");
    }
    memset (c.table, 0xff, c.tcap * sizeof *c.table);
    int added;
    int32_t root = s_get (&c, tree->root, &added);
    /* Weights and minimum arrivals along every request's path. */
    for (size_t i = 0; i < n; i++) {
        uintptr_t v = items[i].node ? items[i].node : tree->root;
        int32_t child = -1;
        for (;;) {
            int32_t k = s_get (&c, v, &added);
            c.nodes[k].weight++;
            if (items[i].arrival < c.nodes[k].min_arrival) c.nodes[k].min_arrival = items[i].arrival;
            if (child >= 0 && c.nodes[child].parent < 0) c.nodes[child].parent = k;
            if (v == tree->root) break;
            child = k;
            v = tree->parent (tree->ctx, v);
        }
    }
    /* Sort the non-root nodes by (weight desc, arrival); linking them to
     * their parents in that order, each by prepending, leaves every child
     * list lightest first -- the order a stack wants to push them in. */
    size_t m = 0;
    for (size_t k = 0; k < c.n; k++)
        if ((int32_t) k != root) order[m++] = (int32_t) k;
    qsort_r (order, m, sizeof *order, s_cmp_child, c.nodes);
    for (size_t j = 0; j < m; j++) {
        struct s_node *nd = &c.nodes[order[j]];
        nd->next_sibling = c.nodes[nd->parent].first_child;
        c.nodes[nd->parent].first_child = order[j];
    }
    /* Post-order DFS, iterative (paths can be long): entries (node, done). */
    double next = 0;
    size_t sp = 0;
    stack[sp++] = root;
    stack[sp++] = 0;
    while (sp) {
        int32_t done = stack[--sp];
        int32_t k = stack[--sp];
        if (done) {
            c.nodes[k].prio = next++;
            continue;
        }
        stack[sp++] = k;
        stack[sp++] = 1;
        for (int32_t ch = c.nodes[k].first_child; ch >= 0; ch = c.nodes[ch].next_sibling) {
            stack[sp++] = ch;   /* lightest pushed first: the heaviest pops first */
            stack[sp++] = 0;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int32_t k = s_get (&c, items[i].node ? items[i].node : tree->root, &added);
        items[i].priority = c.nodes[k].prio;
    }
    free (c.nodes); free (c.table); free (order); free (stack);
    return RX_OK;
}

static const struct rx_sched_policy_ops s_ops = {
    .struct_size = sizeof s_ops,
    .prioritize = s_prioritize,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_SCHED_POLICY, .name = "dfs_weight", .version = "1.0.0",
                  .description = "depth-first over the radix tree, subtrees with more waiting requests first",
                  .ops = &s_ops)
