/* core/eplb.c -- see eplb.h. */
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <radix/eplb.h>

#include "eplb.h"

/* Sizes beyond these are certainly a broken file, and keep every product of
 * two sizes well inside int32 / size_t. */
#define EPLB_MAX_LAYER   65536
#define EPLB_MAX_EXPERT  65536

/* ------------------------------------------------------------- placement -- */

void rx_placement_free (struct rx_placement **self_p)
{
    if (!self_p || !*self_p) return;
    struct rx_placement *p = *self_p;
    free (p->phy2log);
    free (p->logcnt);
    free (p->log2phy);
    free (p);
    *self_p = NULL;
}

struct rx_placement *rx_placement_new (int32_t n_layer, int32_t n_logical, int32_t n_physical,
                                       const int32_t *phy2log, struct rx_err *err)
{
    if (n_layer <= 0 || n_logical <= 0 || n_physical <= 0 || n_layer > EPLB_MAX_LAYER
        || n_logical > EPLB_MAX_EXPERT || n_physical > EPLB_MAX_EXPERT) {
        rx_err_set (err, RX_EINVAL, "placement: bad size: %d layers, %d logical, %d physical experts (each 1..%d)",
                    n_layer, n_logical, n_physical, EPLB_MAX_EXPERT);
        return NULL;
    }
    if (n_physical < n_logical) {
        rx_err_set (err, RX_EINVAL, "placement: %d physical slots cannot hold %d logical experts",
                    n_physical, n_logical);
        return NULL;
    }
    if (!phy2log) {
        rx_err_set (err, RX_EINVAL, "placement: NULL phy2log");
        return NULL;
    }
    size_t L = (size_t) n_layer, E = (size_t) n_logical, P = (size_t) n_physical;
    struct rx_placement *p = calloc (1, sizeof *p);
    if (!p) goto oom;
    p->n_layer = n_layer;
    p->n_logical = n_logical;
    p->n_physical = n_physical;
    p->phy2log = malloc (L * P * sizeof *p->phy2log);
    p->logcnt = calloc (L * E, sizeof *p->logcnt);
    if (!p->phy2log || !p->logcnt) goto oom;
    memcpy (p->phy2log, phy2log, L * P * sizeof *p->phy2log);

    int32_t maxc = 0;
    for (size_t l = 0; l < L; l++) {
        int32_t *cnt = p->logcnt + l * E;
        for (size_t s = 0; s < P; s++) {
            int32_t e = phy2log[l * P + s];
            if (e < 0 || e >= n_logical) {
                rx_err_set (err, RX_EINVAL, "placement: layer %zu slot %zu holds expert %d, outside 0..%d",
                            l, s, e, n_logical - 1);
                rx_placement_free (&p);
                return NULL;
            }
            cnt[e]++;
        }
        for (size_t e = 0; e < E; e++) {
            if (cnt[e] == 0) {
                rx_err_set (err, RX_EINVAL, "placement: layer %zu: logical expert %zu has no slot", l, e);
                rx_placement_free (&p);
                return NULL;
            }
            if (cnt[e] > maxc) maxc = cnt[e];
        }
    }
    p->max_copies = maxc;
    p->log2phy = malloc (L * E * (size_t) maxc * sizeof *p->log2phy);
    if (!p->log2phy) goto oom;
    for (size_t i = 0; i < L * E * (size_t) maxc; i++) p->log2phy[i] = -1;
    for (size_t l = 0; l < L; l++) {
        int32_t *row = p->log2phy + l * E * (size_t) maxc;
        /* slots in increasing order: append each slot to its expert's list */
        for (size_t s = 0; s < P; s++) {
            int32_t *lst = row + (size_t) phy2log[l * P + s] * (size_t) maxc;
            int k = 0;
            while (lst[k] >= 0) k++;
            lst[k] = (int32_t) s;
        }
    }
    return p;
oom:
    rx_placement_free (&p);
    rx_err_set (err, RX_ENOMEM, "placement: out of memory for %d layers x %d slots", n_layer, n_physical);
    return NULL;
}

struct rx_placement *rx_placement_identity (int32_t n_layer, int32_t n_logical, struct rx_err *err)
{
    if (n_layer <= 0 || n_logical <= 0 || n_layer > EPLB_MAX_LAYER || n_logical > EPLB_MAX_EXPERT) {
        rx_err_set (err, RX_EINVAL, "placement: bad size: %d layers, %d experts", n_layer, n_logical);
        return NULL;
    }
    int32_t *ids = malloc ((size_t) n_layer * (size_t) n_logical * sizeof *ids);
    if (!ids) {
        rx_err_set (err, RX_ENOMEM, "placement: out of memory");
        return NULL;
    }
    for (int32_t l = 0; l < n_layer; l++)
        for (int32_t e = 0; e < n_logical; e++) ids[(size_t) l * n_logical + e] = e;
    struct rx_placement *p = rx_placement_new (n_layer, n_logical, n_logical, ids, err);
    free (ids);
    return p;
}

double rx_placement_balancedness (const struct rx_placement *p, int32_t layer,
                                  const double *load, int32_t n_gpu)
{
    if (!p || !load || layer < 0 || layer >= p->n_layer || n_gpu <= 0 || p->n_physical % n_gpu)
        return NAN;
    int32_t per = p->n_physical / n_gpu;
    const int32_t *map = p->phy2log + (size_t) layer * p->n_physical;
    const int32_t *cnt = p->logcnt + (size_t) layer * p->n_logical;
    double sum = 0, max = 0;
    for (int32_t g = 0; g < n_gpu; g++) {
        double w = 0;
        for (int32_t s = g * per; s < (g + 1) * per; s++) w += load[map[s]] / cnt[map[s]];
        sum += w;
        if (w > max) max = w;
    }
    return max > 0 ? sum / n_gpu / max : 1.0;
}

/* --------------------------------------------------------------- compute -- */

struct rx_placement *rx_eplb_compute (rx_loader_t *l, const char *name,
                                      const struct rx_eplb_problem *prob, struct rx_err *err)
{
    if (!l || !name || !prob) {
        rx_err_set (err, RX_EINVAL, "eplb: NULL loader, algorithm name or problem");
        return NULL;
    }
    if (prob->struct_size < offsetof (struct rx_eplb_problem, load) + sizeof prob->load) {
        rx_err_set (err, RX_EABI, "eplb: problem struct too short (%u bytes)", prob->struct_size);
        return NULL;
    }
    if (prob->n_layer <= 0 || prob->n_logical <= 0 || prob->n_physical <= 0 || prob->n_group <= 0
        || prob->n_node <= 0 || prob->n_gpu <= 0 || prob->n_layer > EPLB_MAX_LAYER
        || prob->n_logical > EPLB_MAX_EXPERT || prob->n_physical > EPLB_MAX_EXPERT) {
        rx_err_set (err, RX_EINVAL,
                    "eplb: bad problem size: %d layers, %d logical, %d physical, %d groups, %d nodes, %d GPUs (each must be 1..%d)",
                    prob->n_layer, prob->n_logical, prob->n_physical, prob->n_group, prob->n_node,
                    prob->n_gpu, EPLB_MAX_EXPERT);
        return NULL;
    }
    if (!prob->load) {
        rx_err_set (err, RX_EINVAL, "eplb: NULL load");
        return NULL;
    }
    for (size_t i = 0; i < (size_t) prob->n_layer * prob->n_logical; i++)
        if (!(prob->load[i] >= 0) || !isfinite (prob->load[i])) {
            rx_err_set (err, RX_EINVAL, "eplb: load of layer %zu expert %zu is %g (must be finite, >= 0)",
                        i / prob->n_logical, i % prob->n_logical, prob->load[i]);
            return NULL;
        }
    rx_plugin_t *pl = NULL;
    if (rx_loader_find (l, RX_KIND_EPLB, name, &pl, err) != RX_OK) return NULL;
    /* A no-op when the caller already initialised it with its config. */
    if (rx_plugin_init (pl, NULL, err) != RX_OK) return NULL;
    const struct rx_eplb_ops *ops = rx_plugin_ops (pl);
    if (!RX_HAS (struct rx_eplb_ops, ops, rebalance)) {
        rx_err_set (err, RX_EABI, "%s: no rebalance op", rx_plugin_path (pl));
        return NULL;
    }
    size_t n = (size_t) prob->n_layer * prob->n_physical;
    int32_t *phy2log = malloc (n * sizeof *phy2log);
    if (!phy2log) {
        rx_err_set (err, RX_ENOMEM, "eplb: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) phy2log[i] = -1;
    struct rx_err perr = { 0 };
    int rc = ops->rebalance (rx_plugin_host (pl), prob, phy2log, &perr);
    struct rx_placement *p = NULL;
    if (rc != RX_OK) {
        if (perr.msg[0]) /* the plugin's line names it already */
            rx_err_set (err, rc, "%s", perr.msg);
        else
            rx_err_set (err, rc, "eplb-%s: rebalance failed: %s", name, rx_status_name (rc));
    } else {
        struct rx_err cerr = { 0 };
        p = rx_placement_new (prob->n_layer, prob->n_logical, prob->n_physical, phy2log, &cerr);
        if (!p)
            rx_err_set (err, cerr.code == RX_ENOMEM ? RX_ENOMEM : RX_EINTERNAL,
                        "eplb-%s returned a bad placement: %s", name, cerr.msg);
    }
    free (phy2log);
    return p;
}

/* ----------------------------------------------------------------- files -- */

static json_t *s_open_json (const char *path, struct rx_err *err)
{
    json_error_t je;
    json_t *root = json_load_file (path, 0, &je);
    if (!root) {
        rx_err_set (err, je.line < 0 ? RX_EIO : RX_EFORMAT, "%s:%d: not a JSON file: %s", path,
                    je.line, je.text);
        return NULL;
    }
    if (!json_is_object (root)) {
        rx_err_set (err, RX_EFORMAT, "%s: the top level is not a JSON object", path);
        json_decref (root);
        return NULL;
    }
    return root;
}

/* A [layers][experts] array of arrays of numbers (ints when want_int). */
static int s_matrix (const char *path, const char *member, json_t *arr, int want_int,
                     size_t *rows, size_t *cols, struct rx_err *err)
{
    if (!json_is_array (arr))
        return rx_err_set (err, RX_EFORMAT, "%s: \"%s\" is not an array of per-layer arrays", path, member);
    size_t R = json_array_size (arr);
    if (R == 0 || R > EPLB_MAX_LAYER)
        return rx_err_set (err, RX_EFORMAT, "%s: \"%s\" has %zu layers (want 1..%d)", path, member, R,
                           EPLB_MAX_LAYER);
    size_t C = 0;
    for (size_t r = 0; r < R; r++) {
        json_t *row = json_array_get (arr, r);
        if (!json_is_array (row))
            return rx_err_set (err, RX_EFORMAT, "%s: \"%s\"[%zu] is not an array", path, member, r);
        size_t c = json_array_size (row);
        if (r == 0) C = c;
        if (c == 0 || c > EPLB_MAX_EXPERT)
            return rx_err_set (err, RX_EFORMAT, "%s: \"%s\"[%zu] has %zu entries (want 1..%d)", path,
                               member, r, c, EPLB_MAX_EXPERT);
        if (c != C)
            return rx_err_set (err, RX_EFORMAT, "%s: \"%s\"[%zu] has %zu entries, layer 0 has %zu", path,
                               member, r, c, C);
        for (size_t i = 0; i < c; i++) {
            json_t *v = json_array_get (row, i);
            if (want_int ? !json_is_integer (v) : !json_is_number (v))
                return rx_err_set (err, RX_EFORMAT, "%s: \"%s\"[%zu][%zu] is not %s", path, member, r, i,
                                   want_int ? "an integer" : "a number");
        }
    }
    *rows = R;
    *cols = C;
    return RX_OK;
}

static int s_load_from (const char *path, json_t *root, double **load, int32_t *n_layer,
                        int32_t *n_logical, struct rx_err *err)
{
    json_t *arr = json_object_get (root, "load");
    if (!arr) return rx_err_set (err, RX_EFORMAT, "%s: no \"load\" member", path);
    size_t R, C;
    int rc = s_matrix (path, "load", arr, 0, &R, &C, err);
    if (rc != RX_OK) return rc;
    double *m = malloc (R * C * sizeof *m);
    if (!m) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", path);
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++) {
            double v = json_number_value (json_array_get (json_array_get (arr, r), c));
            if (!(v >= 0) || !isfinite (v)) {
                free (m);
                return rx_err_set (err, RX_EFORMAT, "%s: \"load\"[%zu][%zu] is %g (must be >= 0)", path, r,
                                   c, v);
            }
            m[r * C + c] = v;
        }
    *load = m;
    *n_layer = (int32_t) R;
    *n_logical = (int32_t) C;
    return RX_OK;
}

int rx_eplb_load_read (const char *path, double **load, int32_t *n_layer, int32_t *n_logical,
                       struct rx_err *err)
{
    if (!path || !load || !n_layer || !n_logical)
        return rx_err_set (err, RX_EINVAL, "eplb: load_read: NULL argument");
    *load = NULL;
    json_t *root = s_open_json (path, err);
    if (!root) return err ? err->code : RX_EFORMAT;
    int rc = s_load_from (path, root, load, n_layer, n_logical, err);
    json_decref (root);
    return rc;
}

static int s_placement_from (const char *path, json_t *root, struct rx_placement **out,
                             struct rx_err *err)
{
    json_t *arr = json_object_get (root, "phy2log");
    size_t R, C;
    int rc = s_matrix (path, "phy2log", arr, 1, &R, &C, err);
    if (rc != RX_OK) return rc;
    int32_t *ids = malloc (R * C * sizeof *ids);
    if (!ids) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", path);
    json_int_t maxid = -1;
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++) {
            json_int_t v = json_integer_value (json_array_get (json_array_get (arr, r), c));
            if (v < 0 || v >= EPLB_MAX_EXPERT) {
                free (ids);
                return rx_err_set (err, RX_EFORMAT, "%s: \"phy2log\"[%zu][%zu] is %lld (not an expert id)",
                                   path, r, c, (long long) v);
            }
            ids[r * C + c] = (int32_t) v;
            if (v > maxid) maxid = v;
        }
    /* The logical count: logcnt's row length when the file has one, else
     * the largest id + 1 (every expert has a slot, so no expert is lost). */
    size_t n_log = (size_t) maxid + 1;
    json_t *lc = json_object_get (root, "logcnt");
    if (lc) {
        size_t lr, lcn;
        if ((rc = s_matrix (path, "logcnt", lc, 1, &lr, &lcn, err)) != RX_OK) {
            free (ids);
            return rc;
        }
        if (lr != R) {
            free (ids);
            return rx_err_set (err, RX_EFORMAT, "%s: \"logcnt\" has %zu layers, \"phy2log\" %zu", path, lr, R);
        }
        n_log = lcn;
    }
    struct rx_err perr = { 0 };
    *out = rx_placement_new ((int32_t) R, (int32_t) n_log, (int32_t) C, ids, &perr);
    free (ids);
    if (!*out) return rx_err_set (err, RX_EFORMAT, "%s: %s", path, perr.msg);
    if (lc) /* a stated logcnt must agree with phy2log */
        for (size_t r = 0; r < R; r++)
            for (size_t e = 0; e < n_log; e++)
                if (json_integer_value (json_array_get (json_array_get (lc, r), e))
                    != (*out)->logcnt[r * n_log + e]) {
                    rx_placement_free (out);
                    return rx_err_set (err, RX_EFORMAT,
                                       "%s: \"logcnt\"[%zu][%zu] disagrees with the copies in \"phy2log\"",
                                       path, r, e);
                }
    return RX_OK;
}

int rx_eplb_location_read (const char *path, struct rx_placement **placement, double **load,
                           int32_t *n_layer, int32_t *n_logical, struct rx_err *err)
{
    if (!path || !placement || !load || !n_layer || !n_logical)
        return rx_err_set (err, RX_EINVAL, "eplb: location_read: NULL argument");
    *placement = NULL;
    *load = NULL;
    json_t *root = s_open_json (path, err);
    if (!root) return err ? err->code : RX_EFORMAT;
    int rc;
    if (json_object_get (root, "phy2log")) {
        rc = s_placement_from (path, root, placement, err);
        if (rc == RX_OK) {
            *n_layer = (*placement)->n_layer;
            *n_logical = (*placement)->n_logical;
        }
    } else if (json_object_get (root, "load")) {
        rc = s_load_from (path, root, load, n_layer, n_logical, err);
    } else {
        rc = rx_err_set (err, RX_EFORMAT, "%s: neither a placement (\"phy2log\") nor a load file (\"load\")",
                         path);
    }
    json_decref (root);
    return rc;
}

static void s_row (FILE *f, const int32_t *v, size_t n)
{
    fputc ('[', f);
    for (size_t i = 0; i < n; i++) fprintf (f, i ? ", %d" : "%d", v[i]);
    fputc (']', f);
}

int rx_placement_write_json (FILE *f, const struct rx_placement *p, const double *load,
                             int32_t n_gpu, struct rx_err *err)
{
    if (!f || !p) return rx_err_set (err, RX_EINVAL, "placement: write_json: NULL file or placement");
    if (load && (n_gpu <= 0 || p->n_physical % n_gpu))
        return rx_err_set (err, RX_EINVAL, "placement: %d slots do not divide over %d GPUs", p->n_physical,
                           n_gpu);
    size_t L = (size_t) p->n_layer, E = (size_t) p->n_logical, P = (size_t) p->n_physical,
           M = (size_t) p->max_copies;
    fputs ("{\"phy2log\": [", f);
    for (size_t l = 0; l < L; l++) {
        fputs (l ? ",\n  " : "\n  ", f);
        s_row (f, p->phy2log + l * P, P);
    }
    fputs ("],\n\"logcnt\": [", f);
    for (size_t l = 0; l < L; l++) {
        fputs (l ? ",\n  " : "\n  ", f);
        s_row (f, p->logcnt + l * E, E);
    }
    fputs ("],\n\"log2phy\": [", f);
    for (size_t l = 0; l < L; l++) {
        fputs (l ? ",\n  [" : "\n  [", f);
        for (size_t e = 0; e < E; e++) {
            if (e) fputs (", ", f);
            s_row (f, p->log2phy + (l * E + e) * M, M);
        }
        fputc (']', f);
    }
    fputc (']', f);
    if (load) {
        fputs (",\n\"balancedness\": [", f);
        for (size_t l = 0; l < L; l++)
            fprintf (f, l ? ", %.6f" : "%.6f",
                     rx_placement_balancedness (p, (int32_t) l, load + l * E, n_gpu));
        fputc (']', f);
    }
    fputs ("}\n", f);
    if (ferror (f)) return rx_err_set (err, RX_EIO, "placement: write failed");
    return RX_OK;
}
