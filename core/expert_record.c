/* core/expert_record.c -- see expert_record.h. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <radix/eplb.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#include "expert_record.h"
#include "log.h"

/* ------------------------------------------------------------- the window */

struct rx_expert_record {
    int32_t n_layer, n_expert, window;
    size_t cells;              /* n_layer * n_expert */
    uint32_t *ring;            /* [window][cells] */
    int32_t head;              /* next row to write */
    int32_t n;                 /* rows in use */
    int64_t total;             /* steps added since the reset */
    int64_t *sum;              /* [cells]: sum of the rows in use */
};

rx_expert_record_t *rx_expert_record_new (int32_t n_layer, int32_t n_expert, int32_t window,
                                          struct rx_err *err)
{
    if (n_layer < 1 || n_expert < 1 || window < 1 || (int64_t) n_layer * n_expert > (1 << 24)) {
        rx_err_set (err, RX_EINVAL, "expert record: bad size: %d layers x %d experts, window %d steps",
                    n_layer, n_expert, window);
        return NULL;
    }
    rx_expert_record_t *r = calloc (1, sizeof *r);
    size_t cells = (size_t) n_layer * (size_t) n_expert;
    if (r) {
        r->ring = calloc ((size_t) window * cells, sizeof *r->ring);
        r->sum = calloc (cells, sizeof *r->sum);
    }
    if (!r || !r->ring || !r->sum) {
        rx_err_set (err, RX_ENOMEM, "expert record: out of memory for a window of %d steps x %zu counts "
                    "([eplb] record_window)", window, cells);
        rx_expert_record_free (&r);
        return NULL;
    }
    r->n_layer = n_layer;
    r->n_expert = n_expert;
    r->window = window;
    r->cells = cells;
    return r;
}

void rx_expert_record_free (rx_expert_record_t **self_p)
{
    if (!self_p || !*self_p) return;
    free ((*self_p)->ring);
    free ((*self_p)->sum);
    free (*self_p);
    *self_p = NULL;
}

void rx_expert_record_add (rx_expert_record_t *r, const int64_t *step)
{
    uint32_t *row = r->ring + (size_t) r->head * r->cells;
    if (r->n == r->window)
        for (size_t i = 0; i < r->cells; i++) r->sum[i] -= row[i];
    else
        r->n++;
    for (size_t i = 0; i < r->cells; i++) {
        int64_t v = step[i];
        row[i] = v <= 0 ? 0 : v > UINT32_MAX ? UINT32_MAX : (uint32_t) v;
        r->sum[i] += row[i];
    }
    r->head = (r->head + 1) % r->window;
    r->total++;
}

void rx_expert_record_reset (rx_expert_record_t *r)
{
    memset (r->sum, 0, r->cells * sizeof *r->sum);
    r->head = r->n = 0;
    r->total = 0;
}

int32_t rx_expert_record_steps (const rx_expert_record_t *r) { return r->n; }
int64_t rx_expert_record_total_steps (const rx_expert_record_t *r) { return r->total; }
const int64_t *rx_expert_record_sum (const rx_expert_record_t *r) { return r->sum; }
int32_t rx_expert_record_n_layer (const rx_expert_record_t *r) { return r->n_layer; }
int32_t rx_expert_record_n_expert (const rx_expert_record_t *r) { return r->n_expert; }

int rx_expert_record_write (const rx_expert_record_t *r, FILE *f, const struct rx_placement *p,
                            int32_t n_gpu, struct rx_err *err)
{
    fprintf (f, "{\"load\": [");
    for (int32_t l = 0; l < r->n_layer; l++) {
        fprintf (f, "%s\n  [", l ? "," : "");
        for (int32_t e = 0; e < r->n_expert; e++)
            fprintf (f, "%s%lld", e ? ", " : "", (long long) r->sum[(size_t) l * r->n_expert + e]);
        fputc (']', f);
    }
    fprintf (f, "],\n \"n_steps\": %d, \"window\": %d, \"layers\": %d, \"experts\": %d,\n \"tokens_per_layer\": [",
             r->n, r->window, r->n_layer, r->n_expert);
    for (int32_t l = 0; l < r->n_layer; l++) {
        int64_t s = 0;
        for (int32_t e = 0; e < r->n_expert; e++) s += r->sum[(size_t) l * r->n_expert + e];
        fprintf (f, "%s%lld", l ? ", " : "", (long long) s);
    }
    fputc (']', f);
    if (p && p->n_layer == r->n_layer && p->n_logical == r->n_expert) {
        double *load = malloc ((size_t) r->n_expert * sizeof *load);
        if (!load) return rx_err_set (err, RX_ENOMEM, "expert record: out of memory");
        fprintf (f, ",\n \"n_physical\": %d, \"gpus\": %d, \"balancedness\": [", p->n_physical, n_gpu);
        for (int32_t l = 0; l < r->n_layer; l++) {
            for (int32_t e = 0; e < r->n_expert; e++) load[e] = (double) r->sum[(size_t) l * r->n_expert + e];
            double b = rx_placement_balancedness (p, l, load, n_gpu);
            fprintf (f, "%s%.6f", l ? ", " : "", isfinite (b) ? b : 1.0);
        }
        fputc (']', f);
        free (load);
    }
    fprintf (f, "}\n");
    if (ferror (f)) return rx_err_set (err, RX_EIO, "expert record: write failed");
    return RX_OK;
}

/* ------------------------------------------------------ the engine's part */

struct rx_eplb_rt {
    const rx_conf_t *conf;
    int64_t *counts;                 /* the model's array [rows][n_expert] */
    int32_t rows, n_expert;          /* rows: <arch>.block_count (>= MoE layers) */
    int32_t n_layer;                 /* MoE layers (info), 0: recording off */
    rx_expert_record_t *win;
    struct rx_eplb_rt_attach a;
    int user_on;                     /* HTTP start .. stop */
    int64_t interval;                /* [eplb] rebalance_interval */
    double min_bal;
    int32_t redundant;
    int32_t slots;                   /* slots of a dynamic rebalance: the static placement's, else experts + redundant */
    char algorithm[64];
    char record_dir[512];
    uint64_t n_fwd;                  /* forward passes since start */
    uint64_t n_done, n_skip, n_dump;
    struct rx_placement *place;      /* current (identity when none given) */
    struct rx_moe_placement view;    /* what the model holds (points into place) */
    int64_t *dev;                    /* device [n_layer * n_expert] for the group's all-reduce */
    double *load;                    /* [n_layer * n_expert] scratch */
};

int rx_eplb_rt_new (const rx_conf_t *conf, const rx_gguf_t *g, const char *arch, rx_eplb_rt_t **out,
                    struct rx_err *err)
{
    *out = NULL;
    char key[128];
    uint32_t ne = 0, nb = 0;
    snprintf (key, sizeof key, "%s.expert_count", arch);
    if (rx_gguf_get_u32 (g, key, &ne) != RX_OK || ne == 0) {   /* dense */
        if (rx_conf_str (conf, "eplb", "init_expert_location", NULL) || rx_conf_int (conf, "eplb", "rebalance_interval", 0))
            rx_log (RX_LOG_WARN, "eplb: %s is not a mixture-of-experts model: [eplb] placement keys ignored",
                    rx_gguf_path (g));
        return RX_OK;
    }
    snprintf (key, sizeof key, "%s.block_count", arch);
    if (rx_gguf_get_u32 (g, key, &nb) != RX_OK || nb == 0 || nb > 4096 || ne > 4096)
        return RX_OK;   /* the model plugin reports the bad file */
    rx_eplb_rt_t *rt = calloc (1, sizeof *rt);
    if (rt) rt->counts = calloc ((size_t) nb * ne, sizeof *rt->counts);
    if (!rt || !rt->counts) {
        if (rt) free (rt);
        return rx_err_set (err, RX_ENOMEM, "eplb: out of memory");
    }
    rt->conf = conf;
    rt->rows = (int32_t) nb;
    rt->n_expert = (int32_t) ne;
    rt->interval = rx_conf_int (conf, "eplb", "rebalance_interval", 0);
    rt->min_bal = rx_conf_float (conf, "eplb", "min_rebalance_balancedness", 0.9);
    rt->redundant = (int32_t) rx_conf_int (conf, "eplb", "num_redundant_experts", 0);
    snprintf (rt->algorithm, sizeof rt->algorithm, "%s", rx_conf_str (conf, "eplb", "algorithm", "deepseek"));
    snprintf (rt->record_dir, sizeof rt->record_dir, "%s",
              rx_conf_str (conf, "eplb", "record_dir", "/tmp/radix-eplb"));
    *out = rt;
    return RX_OK;
}

void rx_eplb_rt_env (rx_eplb_rt_t *rt, struct rx_model_env *env)
{
    if (!rt) return;
    env->expert_count = rt->counts;
    env->expert_count_layers = rt->rows;
    env->expert_count_experts = rt->n_expert;
}

/* Hand the current placement to the model (the identity as NULL). */
static int s_apply (rx_eplb_rt_t *rt, struct rx_err *err)
{
    const struct rx_placement *p = rt->place;
    int identity = p->n_physical == p->n_logical;
    for (size_t i = 0; identity && i < (size_t) p->n_layer * p->n_physical; i++)
        identity = p->phy2log[i] == (int32_t) (i % (size_t) p->n_physical);
    rt->view = (struct rx_moe_placement) {
        .struct_size = sizeof rt->view, .n_layer = p->n_layer, .n_logical = p->n_logical,
        .n_physical = p->n_physical, .max_copies = p->max_copies, .phy2log = p->phy2log,
        .logcnt = p->logcnt, .log2phy = p->log2phy,
    };
    if (identity && !RX_HAS (struct rx_model_ops, rt->a.M, set_placement)) return RX_OK;
    if (!RX_HAS (struct rx_model_ops, rt->a.M, set_placement) || !rt->a.M->set_placement)
        return rx_err_set (err, RX_ENOTSUP, "eplb: the model plugin cannot take an expert placement (no set_placement)");
    return rt->a.M->set_placement (rt->a.model, identity ? NULL : &rt->view, err);
}

/* Run the algorithm on load for the current slot count. */
static struct rx_placement *s_compute (rx_eplb_rt_t *rt, const double *load, int32_t n_physical,
                                       struct rx_err *err)
{
    rx_plugin_t *pl = NULL;
    if (rx_loader_find (rt->a.loader, RX_KIND_EPLB, rt->algorithm, &pl, err) != RX_OK) return NULL;
    if (rx_plugin_init (pl, rt->conf, err) != RX_OK) return NULL;
    struct rx_eplb_problem prob = {
        .struct_size = sizeof prob, .n_layer = rt->n_layer, .n_logical = rt->n_expert,
        .n_physical = n_physical, .n_group = 1, .n_node = 1,
        .n_gpu = rt->a.ep_size > 0 ? rt->a.ep_size : 1, .load = load,
    };
    return rx_eplb_compute (rt->a.loader, rt->algorithm, &prob, err);
}

static int s_static (rx_eplb_rt_t *rt, const char *path, struct rx_err *err)
{
    struct rx_placement *p = NULL;
    double *load = NULL;
    int32_t nl = 0, ne = 0;
    struct rx_err rerr = { 0 };
    int rc = rx_eplb_location_read (path, &p, &load, &nl, &ne, &rerr);
    if (rc != RX_OK) return rx_err_set (err, rc, "[eplb] init_expert_location: %s", rerr.msg);
    if (p) {
        nl = p->n_layer;
        ne = p->n_logical;
    }
    if (nl != rt->n_layer || ne != rt->n_expert) {
        rx_placement_free (&p);
        free (load);
        return rx_err_set (err, RX_EINVAL,
                           "[eplb] init_expert_location = %s: %d layers x %d experts; the model has %d MoE layers x %d experts",
                           path, nl, ne, rt->n_layer, rt->n_expert);
    }
    if (!p) {
        struct rx_err cerr = { 0 };
        p = s_compute (rt, load, rt->n_expert + rt->redundant, &cerr);
        free (load);
        if (!p)
            return rx_err_set (err, cerr.code ? cerr.code : RX_EINVAL, "[eplb] init_expert_location = %s: %s", path,
                               cerr.msg);
    }
    int32_t gpus = rt->a.ep_size > 0 ? rt->a.ep_size : 1;
    if (p->n_physical % gpus) {
        int32_t np = p->n_physical;
        rx_placement_free (&p);
        return rx_err_set (err, RX_EINVAL,
                           "[eplb] init_expert_location = %s: %d slots per layer do not split over ep_size %d",
                           path, np, gpus);
    }
    rx_placement_free (&rt->place);
    rt->place = p;
    rt->slots = p->n_physical;
    rc = s_apply (rt, err);
    if (rc == RX_OK)
        rx_log (RX_LOG_INFO, "eplb: placement from %s: %d MoE layers, %d experts in %d slots",
                path, p->n_layer, p->n_logical, p->n_physical);
    else if (err) {
        char m[sizeof err->msg];
        snprintf (m, sizeof m, "%s", err->msg);
        rx_err_set (err, rc, "[eplb] init_expert_location = %s: %s", path, m);
    }
    return rc;
}

int rx_eplb_rt_start (rx_eplb_rt_t *rt, const struct rx_eplb_rt_attach *a, struct rx_err *err)
{
    rt->a = *a;
    const struct rx_model_info *info = a->info;
    int32_t nl = info->struct_size >= offsetof (struct rx_model_info, n_expert) + sizeof info->n_expert
                 ? info->n_moe_layer : 0;
    const char *init = rx_conf_str (rt->conf, "eplb", "init_expert_location", NULL);
    if (nl <= 0 || nl > rt->rows || info->n_expert != rt->n_expert) {
        if (init || rt->interval > 0)
            return rx_err_set (err, RX_ENOTSUP, "[eplb]: the model plugin does not report its MoE layers: no expert placement");
        return RX_OK;
    }
    rt->n_layer = nl;
    int64_t w = rx_conf_int (rt->conf, "eplb", "record_window", 1000);
    if (!(rt->win = rx_expert_record_new (nl, rt->n_expert, (int32_t) (w > 0 && w < INT32_MAX ? w : 1000), err)))
        return err ? err->code : RX_ENOMEM;
    size_t cells = (size_t) nl * (size_t) rt->n_expert;
    if (!(rt->load = malloc (cells * sizeof *rt->load)))
        return rx_err_set (err, RX_ENOMEM, "eplb: out of memory");
    if (!(rt->place = rx_placement_identity (nl, rt->n_expert, err))) return err ? err->code : RX_ENOMEM;
    rt->slots = rt->n_expert + rt->redundant;
    if (rt->a.dp_group && rt->interval > 0) {
        void *d;
        int rc = a->K->alloc (a->be, cells * sizeof (int64_t), 0, &d, err);
        if (rc != RX_OK) return rc;
        rt->dev = d;
    }
    if (init && *init) {
        int rc = s_static (rt, init, err);
        if (rc != RX_OK) return rc;
    }
    return RX_OK;
}

/* The window's load as doubles (rt->load). */
static void s_load (rx_eplb_rt_t *rt)
{
    const int64_t *sum = rx_expert_record_sum (rt->win);
    for (size_t i = 0; i < (size_t) rt->n_layer * rt->n_expert; i++) rt->load[i] = (double) sum[i];
}

static double s_mean_bal (const rx_eplb_rt_t *rt, const struct rx_placement *p)
{
    int32_t gpus = rt->a.ep_size > 0 ? rt->a.ep_size : 1;
    double s = 0;
    for (int32_t l = 0; l < rt->n_layer; l++) {
        double b = rx_placement_balancedness (p, l, rt->load + (size_t) l * rt->n_expert, gpus);
        s += isfinite (b) ? b : 1.0;
    }
    return s / rt->n_layer;
}

static int s_rebalance (rx_eplb_rt_t *rt, struct rx_err *err)
{
    s_load (rt);
    double before = s_mean_bal (rt, rt->place);
    if (before >= rt->min_bal) {
        rt->n_skip++;
        rx_log (RX_LOG_INFO, "eplb: step %llu: rebalance skipped: balancedness %.4f >= min_rebalance_balancedness %.4f",
                (unsigned long long) rt->n_fwd, before, rt->min_bal);
        return RX_OK;
    }
    struct rx_err cerr = { 0 };
    struct rx_placement *p = s_compute (rt, rt->load, rt->slots, &cerr);
    if (!p) {
        /* Every rank computes the same thing, so every rank fails alike:
         * keep serving on the current placement. */
        rt->n_skip++;
        rx_log (RX_LOG_WARN, "eplb: step %llu: rebalance failed, placement kept: %s",
                (unsigned long long) rt->n_fwd, cerr.msg);
        return RX_OK;
    }
    struct rx_placement *old = rt->place;
    rt->place = p;
    int rc = s_apply (rt, err);
    if (rc != RX_OK) {
        rt->place = old;
        rx_placement_free (&p);
        struct rx_err ignored = { 0 };
        s_apply (rt, &ignored);
        return rc;
    }
    rx_placement_free (&old);
    rt->n_done++;
    rx_log (RX_LOG_INFO, "eplb: step %llu: rebalanced (%s, %d slots): balancedness %.4f -> %.4f",
            (unsigned long long) rt->n_fwd, rt->algorithm, p->n_physical, before, s_mean_bal (rt, p));
    return RX_OK;
}

int rx_eplb_rt_counting (const rx_eplb_rt_t *rt)
{
    return rt && rt->win && (rt->interval > 0 || rt->user_on);
}

int rx_eplb_rt_step (rx_eplb_rt_t *rt, struct rx_err *err)
{
    if (!rt) return RX_OK;
    if (!rt->win) {
        memset (rt->counts, 0, (size_t) rt->rows * rt->n_expert * sizeof *rt->counts);
        return RX_OK;
    }
    size_t cells = (size_t) rt->n_layer * rt->n_expert;
    rt->n_fwd++;
    int rc = RX_OK;
    if (rt->interval > 0) {
        if (rt->dev) {
            /* The group's counts of this step (every rank runs this after
             * every forward, idle ones included). */
            const struct rx_kernels_ops *K = rt->a.K;
            rc = K->copy_h2d (rt->a.be, NULL, rt->dev, rt->counts, cells * sizeof (int64_t), err);
            if (rc == RX_OK)
                rc = rt->a.C->all_reduce (rt->a.comm, NULL, rt->dev, rt->dev, cells, RX_I64, RX_COMM_SUM, err);
            if (rc == RX_OK) rc = K->copy_d2h (rt->a.be, NULL, rt->counts, rt->dev, cells * sizeof (int64_t), err);
            if (rc == RX_OK) rc = K->synchronize (rt->a.be, NULL, err);
        }
        if (rc == RX_OK) rx_expert_record_add (rt->win, rt->counts);
        if (rc == RX_OK && rt->n_fwd % (uint64_t) rt->interval == 0) rc = s_rebalance (rt, err);
    } else if (rt->user_on)
        rx_expert_record_add (rt->win, rt->counts);
    memset (rt->counts, 0, (size_t) rt->rows * rt->n_expert * sizeof *rt->counts);
    return rc;
}

static int s_dump (rx_eplb_rt_t *rt, char *msg, size_t cap, struct rx_err *err)
{
    if (mkdir (rt->record_dir, 0700) != 0 && errno != EEXIST)
        return rx_err_set (err, RX_EIO, "eplb: cannot create [eplb] record_dir %s: %s", rt->record_dir,
                           strerror (errno));
    char path[700], tmp[720];
    snprintf (path, sizeof path, "%s/expert_distribution_%lld_%d_%llu.json", rt->record_dir,
              (long long) time (NULL), (int) getpid (), (unsigned long long) ++rt->n_dump);
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen (tmp, "w");
    if (!f) return rx_err_set (err, RX_EIO, "eplb: cannot write %s: %s", tmp, strerror (errno));
    int rc = rx_expert_record_write (rt->win, f, rt->place, rt->a.ep_size > 0 ? rt->a.ep_size : 1, err);
    if (fclose (f) != 0 && rc == RX_OK) rc = rx_err_set (err, RX_EIO, "eplb: cannot write %s", tmp);
    if (rc == RX_OK && rename (tmp, path) != 0)
        rc = rx_err_set (err, RX_EIO, "eplb: cannot rename %s: %s", tmp, strerror (errno));
    if (rc != RX_OK) {
        unlink (tmp);
        return rc;
    }
    snprintf (msg, cap, "%s", path);
    return RX_OK;
}

int rx_eplb_rt_control (rx_eplb_rt_t *rt, int op, char *msg, size_t cap, struct rx_err *err)
{
    if (!rt || !rt->win)
        return rx_err_set (err, RX_ENOTSUP, "expert distribution recording needs a mixture-of-experts model");
    switch (op) {
    case RX_EPLB_START:
        /* With rebalance on the window is the group's (every rank keeps
         * the same one): a reset on one rank would split them. */
        if (rt->interval == 0) rx_expert_record_reset (rt->win);
        rt->user_on = 1;
        snprintf (msg, cap, "expert distribution recording started (window %d steps)", rt->win->window);
        return RX_OK;
    case RX_EPLB_STOP:
        rt->user_on = 0;
        snprintf (msg, cap, "expert distribution recording stopped (%d steps in the window)",
                  rx_expert_record_steps (rt->win));
        return RX_OK;
    case RX_EPLB_DUMP:
        return s_dump (rt, msg, cap, err);
    default:
        return rx_err_set (err, RX_EINVAL, "eplb: unknown control %d", op);
    }
}

int32_t rx_eplb_rt_balancedness (rx_eplb_rt_t *rt, double *out, int32_t n)
{
    if (!rt || !rt->win) return 0;
    const int64_t *sum = rx_expert_record_sum (rt->win);
    int32_t gpus = rt->a.ep_size > 0 ? rt->a.ep_size : 1, k = n < rt->n_layer ? n : rt->n_layer;
    for (int32_t l = 0; l < k; l++) {
        for (int32_t e = 0; e < rt->n_expert; e++)
            rt->load[(size_t) l * rt->n_expert + e] = (double) sum[(size_t) l * rt->n_expert + e];
        double b = rx_placement_balancedness (rt->place, l, rt->load + (size_t) l * rt->n_expert, gpus);
        out[l] = isfinite (b) ? b : 1.0;
    }
    return k;
}

void rx_eplb_rt_counters (const rx_eplb_rt_t *rt, uint64_t *done, uint64_t *skipped)
{
    *done = rt ? rt->n_done : 0;
    *skipped = rt ? rt->n_skip : 0;
}

void rx_eplb_rt_free (rx_eplb_rt_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_eplb_rt_t *rt = *self_p;
    if (rt->dev) rt->a.K->free_ (rt->a.be, rt->dev);
    rx_expert_record_free (&rt->win);
    rx_placement_free (&rt->place);
    free (rt->load);
    free (rt->counts);
    free (rt);
    *self_p = NULL;
}
