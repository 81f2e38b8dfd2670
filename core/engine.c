/* core/engine.c -- see engine.h. */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/comm.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/moe.h>

#include "grow.h"
#include "engine.h"
#include "expert_record.h"
#include "log.h"

struct eng_seq {
    int     used;
    int32_t base, cap, len;
};

struct rx_engine {
    rx_gguf_t *gguf;
    char arch[64];
    char desc[384];
    struct rx_model_src src;

    rx_plugin_t *model_p, *kern_p, *attn_p;
    rx_plugin_t *moe_p;           /* [moe] dispatcher; NULL when none could be loaded */
    const struct rx_kernels_ops *K;
    struct rx_kernels_ops K_1_0;  /* [kernels] ops_abi = 1.0: K as an ABI 1.0 backend's */
    void *be;
    const struct rx_model_ops *M;
    void *model;
    struct rx_model_info info;

    /* tensor parallelism (tp_size > 1) */
    int32_t tp_rank, tp_size;
    rx_plugin_t *comm_p;
    const struct rx_comm_ops *C;
    void *comm;
    int tp_agreed;                /* the ranks exchanged their KV pool sizes (max_tokens with DP attention) */
    int dp_attention;             /* opts.dp_attention */
    int32_t ep_size;              /* [parallel] ep_size: 1, or tp_size with DP attention */

    int64_t n_slots;
    int32_t max_tokens;

    struct eng_seq *seqs;
    int32_t n_seqs;

    /* step scratch (host), grow-only: one int32 block for every index array */
    int32_t *ih;
    size_t cap_ih;
    float *d_logits;              /* device [cap_out][n_vocab] */
    int32_t *d_ids;               /* device [cap_out]: argmax of each output row */
    int32_t cap_out;
    /* device sampling's candidates (rx_engine_forward_sample): */
    float *d_cand;                /* device [min(cap_cand, S_CAND_CHUNK)][n_vocab]: softmax(logits / T) */
    float *d_cvals;               /* device [cap_cand][k_cand] */
    int32_t *d_cidx;
    int32_t cap_cand, k_cand;
    /* rx_engine_logits_gather's indices and values */
    int32_t *d_gidx;
    float *d_gval;
    size_t cap_g;
    uint64_t kcaps;               /* the backend's RX_KCAP_* */
    rx_eplb_rt_t *eplb;           /* MoE models: recording and placement (core/expert_record.h) */
};

/* ------------------------------------------------------- the model source -- */

static const rx_gguf_t *s_g (const struct rx_model_src *s) { return s->ctx; }

static int s_get_u32 (const struct rx_model_src *s, const char *key, uint32_t *out)
{
    return rx_gguf_get_u32 (s_g (s), key, out);
}

static int s_get_i64 (const struct rx_model_src *s, const char *key, int64_t *out)
{
    return rx_gguf_get_i64 (s_g (s), key, out);
}

static int s_get_f32 (const struct rx_model_src *s, const char *key, float *out)
{
    return rx_gguf_get_f32 (s_g (s), key, out);
}

static int s_get_bool (const struct rx_model_src *s, const char *key, int *out)
{
    return rx_gguf_get_bool (s_g (s), key, out);
}

static int s_get_str (const struct rx_model_src *s, const char *key, const char **str,
                      size_t *len)
{
    return rx_gguf_get_str (s_g (s), key, str, len);
}

static int s_arr_len (const struct rx_model_src *s, const char *key, size_t *n)
{
    int t;
    int rc = rx_gguf_get_arr (s_g (s), key, &t, n);
    if (rc == RX_OK && (t == RX_GGUF_STRING || t == RX_GGUF_ARRAY)) return RX_EINVAL;
    return rc;
}

/* Element i of a numeric array as double (exact for every int32 and float). */
static int s_arr_elem (const struct rx_model_src *s, const char *key, size_t i, int64_t *iv,
                       double *dv)
{
    int t;
    size_t n;
    const void *data;
    int rc = rx_gguf_get_arr (s_g (s), key, &t, &n);
    if (rc != RX_OK) return rc;
    if (i >= n) return RX_ERANGE;
    if ((rc = rx_gguf_arr_data (s_g (s), key, &data)) != RX_OK) return rc;
    const unsigned char *p = data;
    int64_t iv_ = 0;
    double dv_ = 0;
    int is_float = 0;
    switch (t) {
    case RX_GGUF_UINT8:  { uint8_t v;  memcpy (&v, p + i, 1); iv_ = v; break; }
    case RX_GGUF_INT8:   { int8_t v;   memcpy (&v, p + i, 1); iv_ = v; break; }
    case RX_GGUF_UINT16: { uint16_t v; memcpy (&v, p + 2 * i, 2); iv_ = v; break; }
    case RX_GGUF_INT16:  { int16_t v;  memcpy (&v, p + 2 * i, 2); iv_ = v; break; }
    case RX_GGUF_UINT32: { uint32_t v; memcpy (&v, p + 4 * i, 4); iv_ = v; break; }
    case RX_GGUF_INT32:  { int32_t v;  memcpy (&v, p + 4 * i, 4); iv_ = v; break; }
    case RX_GGUF_BOOL:   { uint8_t v;  memcpy (&v, p + i, 1); iv_ = v != 0; break; }
    case RX_GGUF_INT64:  { int64_t v;  memcpy (&v, p + 8 * i, 8); iv_ = v; break; }
    case RX_GGUF_UINT64: {
        uint64_t v;
        memcpy (&v, p + 8 * i, 8);
        if (v > INT64_MAX) return RX_ERANGE;
        iv_ = (int64_t) v;
        break;
    }
    case RX_GGUF_FLOAT32: { float v;  memcpy (&v, p + 4 * i, 4); dv_ = v; is_float = 1; break; }
    case RX_GGUF_FLOAT64: { double v; memcpy (&v, p + 8 * i, 8); dv_ = v; is_float = 1; break; }
    default: return RX_EINVAL;
    }
    if (iv) {
        if (is_float) return RX_EINVAL;
        *iv = iv_;
    }
    if (dv) *dv = is_float ? dv_ : (double) iv_;
    return RX_OK;
}

static int s_arr_i64 (const struct rx_model_src *s, const char *key, size_t i, int64_t *out)
{
    return s_arr_elem (s, key, i, out, NULL);
}

static int s_arr_f32 (const struct rx_model_src *s, const char *key, size_t i, float *out)
{
    double d;
    int rc = s_arr_elem (s, key, i, NULL, &d);
    if (rc == RX_OK) *out = (float) d;
    return rc;
}

static int s_tensor (const struct rx_model_src *s, const char *name, struct rx_weight_view *out)
{
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (s_g (s), name);
    if (!t) return RX_ENOENT;
    memset (out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->type;
    out->n_dims = t->n_dims;
    for (int d = 0; d < 4; d++) out->ne[d] = t->ne[d];
    out->data = t->data;
    out->nbytes = t->nbytes;
    return RX_OK;
}

/* ---------------------------------------------------------- plugin choice -- */

static int s_has_arch (const struct rx_model_ops *ops, const char *arch)
{
    for (const char *const *a = ops->architectures; a && *a; a++)
        if (strcmp (*a, arch) == 0) return 1;
    return 0;
}

static int s_check_model_ops (rx_plugin_t *p, struct rx_err *err)
{
    const struct rx_model_ops *o = rx_plugin_ops (p);
    if (!o->architectures || !o->create || !o->destroy || !o->info || !o->reserve || !o->forward)
        return rx_err_set (err, RX_EABI, "%s: model plugin lacks a required member (architectures, create, destroy, info, reserve or forward)",
                           rx_plugin_path (p));
    return RX_OK;
}

/* [model] plugin = auto: the first model-*.so in the search path whose
 * architectures include arch (only model plugins are opened). */
static int s_find_model (rx_engine_t *e, struct rx_boot *b, const char *arch, struct rx_err *err)
{
    const char *name = rx_conf_str (b->conf, "model", "plugin", "auto");
    if (strcmp (name, "auto") != 0) {
        int rc = rx_loader_find (b->loader, RX_KIND_MODEL, name, &e->model_p, err);
        if (rc != RX_OK) return rc;
        if ((rc = s_check_model_ops (e->model_p, err)) != RX_OK) return rc;
        if (!s_has_arch (rx_plugin_ops (e->model_p), arch))
            return rx_err_set (err, RX_ENOTSUP, "%s: [model] plugin = %s does not handle architecture \"%s\"",
                               rx_gguf_path (e->gguf), name, arch);
        return RX_OK;
    }
    char tried[512] = "";
    size_t off = 0;
    struct rx_err first = { 0 };
    for (size_t i = 0; i < rx_loader_dir_count (b->loader); i++) {
        DIR *d = opendir (rx_loader_dir (b->loader, i));
        if (!d) continue;
        char **names = NULL;
        size_t n = 0;
        struct dirent *de;
        while ((de = readdir (d))) {
            size_t len = strlen (de->d_name);
            if (len < 10 || strncmp (de->d_name, "model-", 6) != 0 || strcmp (de->d_name + len - 3, ".so") != 0)
                continue;
            char **nn = realloc (names, (n + 1) * sizeof *nn);
            if (!nn) break;
            names = nn;
            if (!(names[n] = strndup (de->d_name + 6, len - 9))) break;
            n++;
        }
        closedir (d);
        /* Deterministic order whatever readdir says. */
        for (size_t x = 1; x < n; x++)
            for (size_t y = x; y > 0 && strcmp (names[y - 1], names[y]) > 0; y--) {
                char *t = names[y]; names[y] = names[y - 1]; names[y - 1] = t;
            }
        for (size_t j = 0; j < n && !e->model_p; j++) {
            rx_plugin_t *p;
            struct rx_err perr = { 0 };
            if (rx_loader_find (b->loader, RX_KIND_MODEL, names[j], &p, &perr) != RX_OK
                || s_check_model_ops (p, &perr) != RX_OK) {
                if (!first.msg[0]) first = perr;
                continue;
            }
            if (s_has_arch (rx_plugin_ops (p), arch)) e->model_p = p;
            int w = snprintf (tried + off, sizeof tried - off, "%s%s", off ? ", " : "", names[j]);
            if (w > 0 && (size_t) w < sizeof tried - off) off += (size_t) w;
        }
        for (size_t j = 0; j < n; j++) free (names[j]);
        free (names);
        if (e->model_p) return RX_OK;
    }
    if (first.msg[0])
        return rx_err_set (err, RX_ENOTSUP, "%s: no model plugin handles architecture \"%s\" (tried: %s; refused: %s)",
                           rx_gguf_path (e->gguf), arch, tried[0] ? tried : "none", first.msg);
    return rx_err_set (err, RX_ENOTSUP, "%s: no model plugin handles architecture \"%s\" (tried: %s)",
                       rx_gguf_path (e->gguf), arch, tried[0] ? tried : "no model-*.so in the plugin path");
}

static int s_check_kernel_ops (rx_plugin_t *p, struct rx_err *err)
{
    const struct rx_kernels_ops *k = rx_plugin_ops (p);
    if (!k->create || !k->destroy || !k->info || !k->alloc || !k->free_ || !k->copy_h2d
        || !k->copy_d2h || !k->synchronize || !k->weight_load || !k->weight_free
        || !k->weight_data || !k->get_rows || !k->rms_norm || !k->rope || !k->matmul
        || !k->swiglu || !k->add || !k->copy2d || !k->kv_store || !k->attention)
        return rx_err_set (err, RX_EABI, "%s: kernel backend lacks a required op",
                           rx_plugin_path (p));
    return RX_OK;
}

static int s_check_attn_ops (rx_plugin_t *p, struct rx_err *err)
{
    const struct rx_attn_ops *a = rx_plugin_ops (p);
    if (!a->create || !a->destroy || !a->kv_bytes_per_token || !a->kv_alloc || !a->forward)
        return rx_err_set (err, RX_EABI, "%s: attention backend lacks a required member",
                           rx_plugin_path (p));
    return RX_OK;
}

/* The [moe] dispatcher for the env (every model gets it; a dense model
 * ignores it).  An explicitly configured dispatcher that cannot be loaded
 * is an error; the default one ("local") missing only leaves e->moe_p NULL,
 * so dense models still run where no moe-*.so is installed (an MoE model
 * then refuses to load, naming the missing dispatcher). */
static int s_moe_open (rx_engine_t *e, struct rx_boot *b, struct rx_err *err)
{
    int line = 0;
    int explicit_ = rx_conf_raw (b->conf, "moe", "dispatcher", &line) != NULL;
    const char *name = rx_conf_str (b->conf, "moe", "dispatcher", "local");
    struct rx_err perr = { 0 };
    rx_plugin_t *p = NULL;
    int rc = rx_loader_find (b->loader, RX_KIND_MOE, name, &p, &perr);
    if (rc == RX_OK) rc = rx_plugin_init (p, b->conf, &perr);
    if (rc == RX_OK) {
        const struct rx_moe_ops *m = rx_plugin_ops (p);
        if (m->struct_size < RX_MOE_OPS_SIZE_1_0 || !m->create || !m->destroy || !m->dispatch
            || !m->combine)
            rc = rx_err_set (&perr, RX_EABI, "%s: MoE dispatcher lacks a required member (ABI 1.0)",
                             rx_plugin_path (p));
    }
    if (rc != RX_OK) {
        if (explicit_)
            return rx_err_set (err, rc, "[moe] dispatcher = %s: %s", name, perr.msg);
        rx_log (RX_LOG_DEBUG, "engine: no MoE dispatcher ([moe] dispatcher = %s: %s); mixture-of-experts models cannot load",
                name, perr.msg);
        return RX_OK;
    }
    e->moe_p = p;
    return RX_OK;
}

/* [model] path as written in the file is relative to the file's folder. */
char *rx_engine_model_path (const struct rx_boot *b, const char *path)
{
    if (path) return strdup (path);
    int line = 0;
    const char *p = rx_conf_raw (b->conf, "model", "path", &line);
    if (!p || !*p) return NULL;
    const char *conf = rx_conf_name (b->conf);
    const char *slash = conf ? strrchr (conf, '/') : NULL;
    if (p[0] == '/' || line <= 0 || !slash) return strdup (p);
    size_t n = (size_t) (slash - conf) + strlen (p) + 2;
    char *r = malloc (n);
    if (r) snprintf (r, n, "%.*s/%s", (int) (slash - conf), conf, p);
    return r;
}

static int s_check_comm_ops (rx_plugin_t *p, struct rx_err *err)
{
    const struct rx_comm_ops *c = rx_plugin_ops (p);
    if (c->struct_size < RX_COMM_OPS_SIZE_1_0 || !c->create || !c->destroy || !c->all_reduce
        || !c->all_gather || !c->reduce_scatter || !c->all_to_all_v || !c->broadcast
        || !c->barrier || !c->start || !c->wait)
        return rx_err_set (err, RX_EABI, "%s: comm plugin lacks a required member (ABI 1.0)",
                           rx_plugin_path (p));
    return RX_OK;
}

/* Load the comm plugin and join the group: opts->comm, else [parallel]
 * comm (default "shm"). */
static int s_comm_open (rx_engine_t *e, struct rx_boot *b, const struct rx_engine_opts *o,
                        struct rx_err *err)
{
    const char *name = o->comm ? o->comm : rx_conf_str (b->conf, "parallel", "comm", "shm");
    if (o->tp_rank < 0 || o->tp_rank >= o->tp_size)
        return rx_err_set (err, RX_EINVAL, "engine: tensor-parallel rank %d is outside 0 .. %d",
                           o->tp_rank, o->tp_size - 1);
    if (!o->comm_group || !*o->comm_group)
        return rx_err_set (err, RX_EINVAL, "engine: tensor parallelism (tp %d) needs a comm group name",
                           o->tp_size);
    struct rx_err perr = { 0 };
    int rc = rx_loader_find (b->loader, RX_KIND_COMM, name, &e->comm_p, &perr);
    if (rc != RX_OK) {
        e->comm_p = NULL;
        return rx_err_set (err, rc, "[parallel] comm = %s: %s", name, perr.msg);
    }
    if ((rc = rx_plugin_init (e->comm_p, b->conf, err)) != RX_OK) return rc;
    if ((rc = s_check_comm_ops (e->comm_p, err)) != RX_OK) return rc;
    e->C = rx_plugin_ops (e->comm_p);
    struct rx_comm_params cp = {
        .struct_size = sizeof cp, .rank = o->tp_rank, .n_rank = o->tp_size, .device = 0,
        .group = o->comm_group, .bootstrap = o->comm_bootstrap,
        .timeout_s = o->comm_timeout_s > 0 ? o->comm_timeout_s : 60.0,
        .kops = e->K, .kbe = e->be,
    };
    if ((rc = e->C->create (rx_plugin_host (e->comm_p), &cp, &e->comm, err)) != RX_OK) {
        e->comm = NULL;
        return rc;
    }
    e->tp_rank = o->tp_rank;
    e->tp_size = o->tp_size;
    return RX_OK;
}

/* *v = the smallest *v of every rank (through a device buffer: collectives
 * take the kernel backend's memory). */
static int s_comm_min_i64 (rx_engine_t *e, int64_t *v, struct rx_err *err)
{
    void *d;
    int rc = e->K->alloc (e->be, sizeof *v, 0, &d, err);
    if (rc != RX_OK) return rc;
    rc = e->K->copy_h2d (e->be, NULL, d, v, sizeof *v, err);
    if (rc == RX_OK) rc = e->C->all_reduce (e->comm, NULL, d, d, 1, RX_I64, RX_COMM_MIN, err);
    if (rc == RX_OK) rc = e->K->copy_d2h (e->be, NULL, v, d, sizeof *v, err);
    if (rc == RX_OK) rc = e->K->synchronize (e->be, NULL, err);
    e->K->synchronize (e->be, NULL, NULL);
    e->K->free_ (e->be, d);
    return rc;
}

/* "1.5 GiB", "12.0 MiB", "512 B": for the KV sizing messages. */
static const char *s_bytes_str (uint64_t b, char *buf, size_t cap)
{
    static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB" };
    if (b < 1024) {
        snprintf (buf, cap, "%llu B", (unsigned long long) b);
        return buf;
    }
    double v = (double) b / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    snprintf (buf, cap, "%.1f %s", v, unit[u]);
    return buf;
}

/* opts->kv_bytes as e->n_slots, once the model reported its KV bytes per
 * token (the attention backend and kv_dtype decide it, so the byte budget
 * can only become tokens here, before reserve). */
static int s_kv_slots (rx_engine_t *e, const struct rx_engine_opts *o, int64_t ctx, struct rx_err *err)
{
    char mem[32];
    uint64_t bpt = e->info.kv_bytes_per_token;
    if (bpt == 0)
        return rx_err_set (err, RX_EINTERNAL, "%s: model plugin reports 0 KV bytes per token",
                           rx_plugin_path (e->model_p));
    uint64_t tok = o->kv_bytes / bpt;
    uint64_t cap = (uint64_t) ctx * 64;
    if (cap > INT32_MAX) cap = INT32_MAX;
    if (tok > cap) {
        rx_log (RX_LOG_INFO, "engine: KV memory %s would hold %llu tokens; capped at %llu "
                "(64 x the context length of %lld)", s_bytes_str (o->kv_bytes, mem, sizeof mem),
                (unsigned long long) tok, (unsigned long long) cap, (long long) ctx);
        tok = cap;
    }
    uint64_t need = RX_ENGINE_MIN_KV_TOKENS;
    if (o->max_tokens > 0 && 2 * (uint64_t) o->max_tokens > need) need = 2 * (uint64_t) o->max_tokens;
    if (tok < need)
        return rx_err_set (err, RX_ECONFIG,
                           "KV memory %s holds only %llu tokens of this model (%llu B/token, "
                           "at least %llu needed); raise [cache] kv_memory",
                           s_bytes_str (o->kv_bytes, mem, sizeof mem), (unsigned long long) tok,
                           (unsigned long long) bpt, (unsigned long long) need);
    e->n_slots = (int64_t) tok;
    return RX_OK;
}

/* ---------------------------------------------------- devices, KV sizing -- */

int rx_engine_kernels_params (const rx_conf_t *conf, int32_t rank, struct rx_kernels_params *kp,
                              struct rx_err *err)
{
    if (!kp) return rx_err_set (err, RX_EINVAL, "engine: kernels params: NULL argument");
    *kp = (struct rx_kernels_params) {
        .struct_size = sizeof *kp,
        .threads = (int32_t) rx_conf_int (conf, "kernels", "threads", 0),
        .device = RX_KDEVICE_AUTO,
        .rank = rank < 0 ? 0 : rank,
    };
    const char *dv = conf ? rx_conf_raw (conf, "kernels", "device", NULL) : NULL;
    if (!dv || strcmp (dv, "auto") == 0) return RX_OK;
    char *end;
    long v = strtol (dv, &end, 10);
    while (isspace ((unsigned char) *end)) end++;
    if (end == dv || *end || v < 0 || v > 4096)
        return rx_err_set (err, RX_ECONFIG, "[kernels] device = \"%s\": expected auto or a "
                           "device index 0..4096", dv);
    kp->device = (int32_t) v;
    return RX_OK;
}

int rx_engine_kv_share (const char *spec, double *share)
{
    if (!spec) return 0;
    while (isspace ((unsigned char) *spec)) spec++;
    char *end;
    double v = strtod (spec, &end);
    if (end == spec || !isfinite (v)) return 0;
    int pct = 0;
    while (isspace ((unsigned char) *end)) end++;
    if (*end == '%') {
        pct = 1;
        end++;
    }
    while (isspace ((unsigned char) *end)) end++;
    if (*end) return 0;
    if (!pct && !memchr (spec, '.', (size_t) (end - spec))) return 0;   /* bytes */
    if (pct) v /= 100;
    if (!(v > 0 && v <= 1)) return 0;
    if (share) *share = v;
    return 1;
}

uint64_t rx_engine_kv_device_bytes (double share, uint64_t dev_free, int32_t local_ranks,
                                    int32_t n_devices, int one_device)
{
    if (!(share > 0) || dev_free == 0) return 0;
    if (share > 1) share = 1;
    int64_t ranks = local_ranks > 0 ? local_ranks : 1;
    int64_t per = one_device || n_devices <= 1 ? ranks : (ranks + n_devices - 1) / n_devices;
    return (uint64_t) ((double) dev_free * share) / (uint64_t) per;
}

/* ---------------------------------------------------------------- engine -- */

rx_engine_t *rx_engine_new (struct rx_boot *b, const struct rx_engine_opts *o, struct rx_err *err)
{
    rx_engine_t *e = calloc (1, sizeof *e);
    if (!e) {
        rx_err_set (err, RX_ENOMEM, "engine: out of memory");
        return NULL;
    }
    int rc = RX_OK;
    char *path = rx_engine_model_path (b, o ? o->model_path : NULL);
    if (!path) {
        rx_err_set (err, RX_ECONFIG, "no model: give --model FILE or set [model] path");
        goto fail;
    }
    e->gguf = rx_gguf_open (path, err);
    free (path);
    if (!e->gguf) goto fail;

    const char *arch;
    size_t alen;
    if (rx_gguf_get_str (e->gguf, "general.architecture", &arch, &alen) != RX_OK || alen == 0
        || alen >= sizeof e->arch) {
        rx_err_set (err, RX_EFORMAT, "%s: missing or bad general.architecture", rx_gguf_path (e->gguf));
        goto fail;
    }
    memcpy (e->arch, arch, alen);
    e->arch[alen] = '\0';

    /* Plugins: model, kernels, attention. */
    if ((rc = s_find_model (e, b, e->arch, err)) != RX_OK) goto fail;
    if ((rc = rx_plugin_init (e->model_p, b->conf, err)) != RX_OK) goto fail;
    e->M = rx_plugin_ops (e->model_p);
    if ((rc = rx_boot_plugin (b, "kernels", "backend", RX_KIND_KERNELS, &e->kern_p, err)) != RX_OK)
        goto fail;
    if ((rc = s_check_kernel_ops (e->kern_p, err)) != RX_OK) goto fail;
    e->K = rx_plugin_ops (e->kern_p);
    if (strcmp (rx_conf_str (b->conf, "kernels", "ops_abi", "current"), "1.0") == 0) {
        /* Test mode: everything above the engine sees the backend as one
         * built against ABI 1.0 (no appended op), so the fallbacks the
         * models keep for such backends run here too. */
        memset (&e->K_1_0, 0, sizeof e->K_1_0);
        memcpy (&e->K_1_0, e->K, RX_KERNELS_OPS_SIZE_1_0);
        e->K_1_0.struct_size = (uint32_t) RX_KERNELS_OPS_SIZE_1_0;
        e->K = &e->K_1_0;
    }
    const char *an = rx_conf_str (b->conf, "attention", "backend", "auto");
    if (strcmp (an, "auto") == 0) {
        an = e->M->default_attention ? e->M->default_attention (e->arch) : NULL;
        if (!an) an = "mha";
    }
    if ((rc = rx_loader_find (b->loader, RX_KIND_ATTENTION, an, &e->attn_p, err)) != RX_OK) goto fail;
    if ((rc = rx_plugin_init (e->attn_p, b->conf, err)) != RX_OK) goto fail;
    if ((rc = s_check_attn_ops (e->attn_p, err)) != RX_OK) goto fail;
    if ((rc = s_moe_open (e, b, err)) != RX_OK) goto fail;
    const char *kvd = rx_conf_str (b->conf, "attention", "kv_dtype", "f32");
    int kv_dtype = strcmp (kvd, "f16") == 0 ? RX_F16 : RX_F32;

    /* The kernel backend instance, on this rank's device. */
    struct rx_kernels_params kp;
    int32_t host_rank = (o ? o->dp_rank : 0) * (o && o->tp_size > 1 ? o->tp_size : 1)
                        + (o && o->tp_size > 1 ? o->tp_rank : 0);
    if ((rc = rx_engine_kernels_params (b->conf, host_rank, &kp, err)) != RX_OK) goto fail;
    if ((rc = e->K->create (rx_plugin_host (e->kern_p), &kp, &e->be, err)) != RX_OK) {
        e->be = NULL;
        goto fail;
    }
    struct rx_kernels_info ki = { .struct_size = sizeof ki };
    e->K->info (e->be, &ki);
    e->kcaps = ki.caps;

    /* The tensor-parallel group: joined before the model, which reduces
     * through it. */
    e->tp_size = 1;
    e->dp_attention = o && o->dp_attention;
    /* Expert parallelism: the MoE dispatcher shards the experts over the
     * DP-attention group (the model creates it with this rank, ep_size and
     * the group's comm).  Checked before joining the group: every rank
     * reads the same file, so all refuse alike. */
    int64_t ep = rx_conf_int (b->conf, "parallel", "ep_size", 1);
    int32_t ranks = o && o->tp_size > 1 ? o->tp_size : 1;
    if (ep != 1 && !(e->dp_attention && ranks > 1 && ep == ranks)) {
        rc = rx_err_set (err, RX_ECONFIG,
                         "[parallel] ep_size = %lld: must be 1, or equal to tp_size (%d) with dp_attention on%s",
                         (long long) ep, (int) ranks, e->dp_attention && ranks > 1 ? "" : " (no DP-attention group here)");
        goto fail;
    }
    e->ep_size = (int32_t) ep;
    if (o && o->tp_size > 1 && (rc = s_comm_open (e, b, o, err)) != RX_OK) goto fail;

    /* The model. */
    e->src = (struct rx_model_src) {
        .struct_size = sizeof e->src, .ctx = e->gguf, .path = rx_gguf_path (e->gguf),
        .get_u32 = s_get_u32, .get_i64 = s_get_i64, .get_f32 = s_get_f32,
        .get_bool = s_get_bool, .get_str = s_get_str, .arr_len = s_arr_len,
        .arr_i64 = s_arr_i64, .arr_f32 = s_arr_f32, .tensor = s_tensor,
    };
    struct rx_model_env env = {
        .struct_size = sizeof env, .k = { e->K, e->be, NULL }, .attn = rx_plugin_ops (e->attn_p),
        .attn_host = rx_plugin_host (e->attn_p), .kv_dtype = kv_dtype,
        .rank = e->tp_rank, .n_rank = e->tp_size, .comm = e->C, .comm_inst = e->comm,
        .moe = e->moe_p ? rx_plugin_ops (e->moe_p) : NULL,
        .moe_host = e->moe_p ? rx_plugin_host (e->moe_p) : NULL,
        .moe_max_tokens = (int32_t) rx_conf_int (b->conf, "moe", "max_tokens_per_rank", 0),
        .dp_attn = e->dp_attention && e->tp_size > 1,
        .ep_size = e->ep_size,
        .two_batch_overlap = rx_conf_bool (b->conf, "scheduler", "two_batch_overlap", 0),
        .cuda_graph_max_bs = (int32_t) rx_conf_int (b->conf, "scheduler", "cuda_graph_max_bs", 0),
    };
    if ((rc = rx_eplb_rt_new (b->conf, e->gguf, e->arch, &e->eplb, err)) != RX_OK) goto fail;
    rx_eplb_rt_env (e->eplb, &env);
    if ((rc = e->M->create (rx_plugin_host (e->model_p), &e->src, &env, &e->model, err)) != RX_OK) {
        e->model = NULL;
        goto fail;
    }
    e->info.struct_size = sizeof e->info;
    e->M->info (e->model, &e->info);
    if (e->info.n_vocab <= 0) {
        rc = rx_err_set (err, RX_EINTERNAL, "%s: model plugin reports %d vocabulary entries",
                         rx_plugin_path (e->model_p), e->info.n_vocab);
        goto fail;
    }

    /* KV pool and scratch. */
    int64_t ctx = e->info.n_ctx_train > 0 ? e->info.n_ctx_train : 4096;
    e->n_slots = o && o->n_slots > 0 ? o->n_slots : (ctx < 4096 ? ctx : 4096);
    struct rx_engine_opts kvo = { 0 };
    if (o) kvo = *o;
    double share = o ? o->kv_share : 0;
    if (o && o->kv_bytes && share > 0 && share <= 1 && !(ki.caps & RX_KCAP_HOST_VISIBLE)) {
        /* A device backend: the share is of the device's free memory now
         * that the weights are on it, not of the host's MemAvailable (which
         * the caller measured). */
        struct rx_kernels_info di = { .struct_size = sizeof di };
        uint64_t dev = 0;
        if (e->K->info (e->be, &di) == RX_OK && di.struct_size >= sizeof di)
            dev = rx_engine_kv_device_bytes (share, di.mem_free, o->local_ranks, di.n_devices,
                                             kp.device != RX_KDEVICE_AUTO);
        if (dev) {
            char b1[32], b2[32];
            rx_log (RX_LOG_INFO, "engine: KV memory %s: %.0f%% of %s free on device %d (%s)",
                    s_bytes_str (dev, b1, sizeof b1), share * 100,
                    s_bytes_str (di.mem_free, b2, sizeof b2), di.device_index, ki.device);
            kvo.kv_bytes = dev;
        }
    }
    if (o && o->kv_bytes && (rc = s_kv_slots (e, &kvo, ctx, err)) != RX_OK) goto fail;
    if (e->tp_size > 1 && !e->dp_attention) {
        /* Every rank must end with the same pool (the peer schedulers size
         * their caches from it), but KV bytes per token differ between
         * ranks when the heads split unevenly: take the smallest.  A rank
         * that failed before here sends -1 (see fail:), so the others stop
         * too instead of waiting for the timeout. */
        int64_t mine = e->n_slots;
        e->tp_agreed = 1;
        if ((rc = s_comm_min_i64 (e, &e->n_slots, err)) != RX_OK) goto fail;
        if (e->n_slots < 0) {
            rc = rx_err_set (err, RX_EIO, "engine: tp rank %d: another rank of the group failed to load %s (see its log)",
                             e->tp_rank, rx_gguf_path (e->gguf));
            goto fail;
        }
        if (e->n_slots != mine)
            rx_log (RX_LOG_DEBUG, "engine: tp rank %d: KV pool %lld slots (the group's smallest; this rank could hold %lld)",
                    e->tp_rank, (long long) e->n_slots, (long long) mine);
    }
    if (o && o->kv_bytes) {
        /* At most half the pool per step, so a step never needs all of it. */
        e->max_tokens = o->max_tokens > 0 ? o->max_tokens
                        : (int32_t) (e->n_slots / 2 < 512 ? e->n_slots / 2 : 512);
    } else
        e->max_tokens = o && o->max_tokens > 0 ? o->max_tokens
                        : (int32_t) (e->n_slots < 512 ? e->n_slots : 512);
    if (e->tp_size > 1 && e->dp_attention) {
        /* DP attention: each rank keeps its own KV pool (its own
         * scheduler), but the FFN runs over the rows of every rank, so all
         * must reserve the same step size: the smallest.  -1 = a rank that
         * failed (see fail:). */
        int64_t mt = e->max_tokens;
        e->tp_agreed = 1;
        if ((rc = s_comm_min_i64 (e, &mt, err)) != RX_OK) goto fail;
        if (mt < 0) {
            rc = rx_err_set (err, RX_EIO, "engine: dp attention rank %d: another rank of the group failed to load %s (see its log)",
                             e->tp_rank, rx_gguf_path (e->gguf));
            goto fail;
        }
        if (mt != e->max_tokens)
            rx_log (RX_LOG_DEBUG, "engine: dp attention rank %d: max_tokens %lld (the group's smallest; this rank asked for %d)",
                    e->tp_rank, (long long) mt, e->max_tokens);
        e->max_tokens = (int32_t) mt;
    }
    if (e->eplb) {
        /* Before reserve: a static placement sizes the dispatcher. */
        struct rx_eplb_rt_attach ea = {
            .loader = b->loader, .M = e->M, .model = e->model, .info = &e->info, .K = e->K, .be = e->be,
            .C = e->C, .comm = e->comm, .rank = e->tp_rank,
            .dp_group = e->dp_attention && e->tp_size > 1, .ep_size = e->ep_size,
        };
        if ((rc = rx_eplb_rt_start (e->eplb, &ea, err)) != RX_OK) goto fail;
    }
    if ((rc = e->M->reserve (e->model, (uint64_t) e->n_slots, e->max_tokens, err)) != RX_OK) goto fail;

    char tp[160] = "";
    if (e->tp_size > 1)
        snprintf (tp, sizeof tp, ", %s %d (rank %d, comm %s)%s%s", e->dp_attention ? "dp attention" : "tp",
                  e->tp_size, e->tp_rank, rx_plugin_desc (e->comm_p)->name,
                  e->ep_size > 1 && e->moe_p ? ", ep over the group, moe-" : "",
                  e->ep_size > 1 && e->moe_p ? rx_plugin_desc (e->moe_p)->name : "");
    snprintf (e->desc, sizeof e->desc, "%s: model-%s (%s), kernels-%s [%s], attn-%s, KV %lld slots x %llu B%s",
              rx_gguf_path (e->gguf), rx_plugin_desc (e->model_p)->name, e->arch,
              rx_plugin_desc (e->kern_p)->name, ki.device, rx_plugin_desc (e->attn_p)->name,
              (long long) e->n_slots, (unsigned long long) e->info.kv_bytes_per_token, tp);
    rx_log (RX_LOG_DEBUG, "engine: %s", e->desc);
    return e;

fail:
    if (rc == RX_OK && err && err->code == RX_OK) rx_err_set (err, RX_EINTERNAL, "engine: failed");
    if (e->comm && !e->tp_agreed) {
        /* Tell the ranks waiting at the KV agreement that this one failed. */
        int64_t failed = -1;
        struct rx_err ignored = { 0 };
        e->tp_agreed = 1;
        s_comm_min_i64 (e, &failed, &ignored);
    }
    rx_engine_destroy (&e);
    return NULL;
}

static void s_cands_free (rx_engine_t *e);

void rx_engine_destroy (rx_engine_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_engine_t *e = *self_p;
    if (e->be) e->K->synchronize (e->be, NULL, NULL);
    if (e->model) e->M->destroy (e->model);
    rx_eplb_rt_free (&e->eplb);   /* after the model (it borrows the placement) */
    if (e->d_logits) e->K->free_ (e->be, e->d_logits);
    if (e->d_ids) e->K->free_ (e->be, e->d_ids);
    s_cands_free (e);
    /* After the model (it reduces through the group), before the kernel
     * backend (the instance borrows it). */
    if (e->comm) e->C->destroy (e->comm);
    if (e->be) e->K->destroy (e->be);
    rx_gguf_close (&e->gguf);
    free (e->seqs);
    free (e->ih);
    free (e);
    *self_p = NULL;
}

const struct rx_model_info *rx_engine_info (const rx_engine_t *e) { return &e->info; }
const rx_gguf_t *rx_engine_gguf (const rx_engine_t *e) { return e->gguf; }
int64_t rx_engine_n_slots (const rx_engine_t *e) { return e->n_slots; }
int32_t rx_engine_max_tokens (const rx_engine_t *e) { return e->max_tokens; }
const char *rx_engine_describe (const rx_engine_t *e) { return e->desc; }
void rx_engine_kernels (const rx_engine_t *e, const struct rx_kernels_ops **ops, void **be)
{
    if (ops) *ops = e->K;
    if (be) *be = e->be;
}
int32_t rx_engine_tp_rank (const rx_engine_t *e) { return e->tp_rank; }
int32_t rx_engine_tp_size (const rx_engine_t *e) { return e->tp_size; }
int rx_engine_dp_attention (const rx_engine_t *e) { return e->dp_attention; }
rx_eplb_rt_t *rx_engine_eplb (rx_engine_t *e) { return e->eplb; }

/* ----------------------------------------------------------- sequences -- */

int rx_engine_seq_new (rx_engine_t *e, int32_t capacity, struct rx_err *err)
{
    if (capacity < 1)
        return rx_err_set (err, RX_EINVAL, "engine: sequence capacity %d < 1", capacity);
    /* First fit: candidate bases are 0 and the end of every live range. */
    int64_t best = -1;
    for (int32_t c = -1; c < e->n_seqs; c++) {
        if (c >= 0 && !e->seqs[c].used) continue;
        int64_t base = c < 0 ? 0 : (int64_t) e->seqs[c].base + e->seqs[c].cap;
        if (base + capacity > e->n_slots) continue;
        int ok = 1;
        for (int32_t i = 0; i < e->n_seqs && ok; i++)
            if (e->seqs[i].used && base < (int64_t) e->seqs[i].base + e->seqs[i].cap
                && e->seqs[i].base < base + capacity)
                ok = 0;
        if (ok && (best < 0 || base < best)) best = base;
    }
    if (best < 0)
        return rx_err_set (err, RX_EAGAIN, "engine: no room for %d more tokens of KV (pool of %lld slots)",
                           capacity, (long long) e->n_slots);
    int32_t id = -1;
    for (int32_t i = 0; i < e->n_seqs; i++)
        if (!e->seqs[i].used) { id = i; break; }
    if (id < 0) {
        struct eng_seq *ns = realloc (e->seqs, ((size_t) e->n_seqs + 1) * sizeof *ns);
        if (!ns) return rx_err_set (err, RX_ENOMEM, "engine: out of memory");
        e->seqs = ns;
        id = e->n_seqs++;
    }
    e->seqs[id] = (struct eng_seq) { 1, (int32_t) best, capacity, 0 };
    return id;
}

int rx_engine_seq_free (rx_engine_t *e, int32_t seq)
{
    if (seq < 0 || seq >= e->n_seqs || !e->seqs[seq].used) return RX_EINVAL;
    e->seqs[seq].used = 0;
    return RX_OK;
}

int32_t rx_engine_seq_len (const rx_engine_t *e, int32_t seq)
{
    if (seq < 0 || seq >= e->n_seqs || !e->seqs[seq].used) return -1;
    return e->seqs[seq].len;
}

int32_t rx_engine_seq_room (const rx_engine_t *e, int32_t seq)
{
    if (seq < 0 || seq >= e->n_seqs || !e->seqs[seq].used) return -1;
    return e->seqs[seq].cap - e->seqs[seq].len;
}

int rx_engine_seq_truncate (rx_engine_t *e, int32_t seq, int32_t len)
{
    if (seq < 0 || seq >= e->n_seqs || !e->seqs[seq].used || len < 0 || len > e->seqs[seq].len)
        return RX_EINVAL;
    e->seqs[seq].len = len;
    return RX_OK;
}

/* ---------------------------------------------------------------- step -- */

int32_t rx_engine_n_out (const struct rx_engine_req *reqs, int32_t n_req)
{
    int64_t n = 0;
    for (int32_t i = 0; i < n_req; i++)
        n += reqs[i].all_logits ? reqs[i].n_tokens : 1;
    return n > INT32_MAX ? INT32_MAX : (int32_t) n;
}

static int s_step (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req, float *logits,
                   int32_t *ids, const struct rx_engine_cands *cands, struct rx_err *err);

int rx_engine_step (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req,
                    float *logits, struct rx_err *err)
{
    return s_step (e, reqs, n_req, logits, NULL, NULL, err);
}

int rx_engine_step_ids (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req,
                        int32_t *ids, struct rx_err *err)
{
    if (!ids) return rx_err_set (err, RX_EINVAL, "engine: step_ids: ids is NULL");
    return s_step (e, reqs, n_req, NULL, ids, NULL, err);
}

int rx_engine_step_sample (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req,
                           int32_t *ids, const struct rx_engine_cands *cands, struct rx_err *err)
{
    if (!ids || !cands) return rx_err_set (err, RX_EINVAL, "engine: step_sample: ids or cands is NULL");
    return s_step (e, reqs, n_req, NULL, ids, cands, err);
}

static int s_step (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req, float *logits,
                   int32_t *ids, const struct rx_engine_cands *cands, struct rx_err *err)
{
    if (n_req < 1 || !reqs)
        return rx_err_set (err, RX_EINVAL, "engine: step with %d requests", n_req);
    int64_t n_tok = 0, n_kv = 0;
    for (int32_t i = 0; i < n_req; i++) {
        const struct rx_engine_req *r = &reqs[i];
        if (r->seq < 0 || r->seq >= e->n_seqs || !e->seqs[r->seq].used)
            return rx_err_set (err, RX_EINVAL, "engine: step: unknown sequence %d", r->seq);
        for (int32_t j = 0; j < i; j++)
            if (reqs[j].seq == r->seq)
                return rx_err_set (err, RX_EINVAL, "engine: step: sequence %d appears twice", r->seq);
        const struct eng_seq *s = &e->seqs[r->seq];
        if (r->n_tokens < 1 || !r->tokens)
            return rx_err_set (err, RX_EINVAL, "engine: step: sequence %d has no tokens", r->seq);
        if ((int64_t) s->len + r->n_tokens > s->cap)
            return rx_err_set (err, RX_EINVAL, "engine: step: sequence %d: %d + %d tokens exceed its capacity %d",
                               r->seq, s->len, r->n_tokens, s->cap);
        n_tok += r->n_tokens;
        n_kv += s->len + r->n_tokens;
    }
    if (n_tok > e->max_tokens)
        return rx_err_set (err, RX_EINVAL, "engine: step of %lld tokens exceeds max_tokens %d (split it)",
                           (long long) n_tok, e->max_tokens);
    const int out = logits || ids;
    int32_t n_out = out ? rx_engine_n_out (reqs, n_req) : 0;
    size_t need = 3 * (size_t) n_tok + 2 * ((size_t) n_req + 1) + (size_t) n_kv;
    if (rx_grow ((void **) &e->ih, &e->cap_ih, need, sizeof (int32_t)) < 0)
        return rx_err_set (err, RX_ENOMEM, "engine: out of memory");
    int32_t *tokens = e->ih, *pos = tokens + n_tok, *out_rows = pos + n_tok,
            *q_start = out_rows + n_tok, *kv_start = q_start + n_req + 1, *slots = kv_start + n_req + 1;
    int32_t t = 0, k = 0, o = 0;
    for (int32_t i = 0; i < n_req; i++) {
        const struct rx_engine_req *r = &reqs[i];
        const struct eng_seq *s = &e->seqs[r->seq];
        q_start[i] = t;
        kv_start[i] = k;
        for (int32_t p = 0; p < s->len + r->n_tokens; p++)
            slots[k++] = s->base + p;
        for (int32_t j = 0; j < r->n_tokens; j++, t++) {
            tokens[t] = r->tokens[j];
            pos[t] = s->len + j;
            if (out && (r->all_logits || j == r->n_tokens - 1))
                out_rows[o++] = t;
        }
    }
    q_start[n_req] = t;
    kv_start[n_req] = k;

    struct rx_model_batch mb = {
        .struct_size = sizeof mb, .n_tokens = t, .tokens = tokens, .pos = pos,
        .n_seq = n_req, .q_start = q_start, .kv_start = kv_start, .kv_slots = slots,
        .n_out = n_out, .out_rows = out_rows, .logits = NULL,
    };
    int rc = ids ? rx_engine_forward_sample (e, &mb, NULL, NULL, ids, cands, err)
                 : rx_engine_forward (e, &mb, logits, err);
    if (rc != RX_OK) return rc;
    for (int32_t i = 0; i < n_req; i++)
        e->seqs[reqs[i].seq].len += reqs[i].n_tokens;
    return RX_OK;
}

int rx_engine_forward (rx_engine_t *e, const struct rx_model_batch *b, float *logits,
                       struct rx_err *err)
{
    return rx_engine_forward_ids (e, b, logits, NULL, NULL, err);
}

/* Copies the output rows j with want[j] (all rows when want is NULL) of
 * the device logits to the same rows of logits, runs of rows at a time. */
static int s_logits_down (rx_engine_t *e, float *logits, int32_t n_out, const uint8_t *want,
                          struct rx_err *err)
{
    const size_t row = (size_t) e->info.n_vocab * sizeof (float);
    for (int32_t j = 0; j < n_out;) {
        if (want && !want[j]) {
            j++;
            continue;
        }
        int32_t k = j + 1;
        while (k < n_out && (!want || want[k])) k++;
        int rc = e->K->copy_d2h (e->be, NULL, (char *) logits + (size_t) j * row,
                                 (const char *) e->d_logits + (size_t) j * row, (size_t) (k - j) * row, err);
        if (rc != RX_OK) return rc;
        j = k;
    }
    return RX_OK;
}

static void s_cands_free (rx_engine_t *e)
{
    if (e->d_cand) e->K->free_ (e->be, e->d_cand);
    if (e->d_cvals) e->K->free_ (e->be, e->d_cvals);
    if (e->d_cidx) e->K->free_ (e->be, e->d_cidx);
    e->d_cand = e->d_cvals = NULL;
    e->d_cidx = NULL;
    e->cap_cand = e->k_cand = 0;
    if (e->d_gidx) e->K->free_ (e->be, e->d_gidx);
    if (e->d_gval) e->K->free_ (e->be, e->d_gval);
    e->d_gidx = NULL;
    e->d_gval = NULL;
    e->cap_g = 0;
}

/* Candidate rows are computed S_CAND_CHUNK at a time: the softmax scratch
 * is that many rows of n_vocab floats (32 MiB for a 128k vocabulary),
 * whatever the batch. */
#define S_CAND_CHUNK 64

/* Scratch for n rows of k candidates (grow-only in rows). */
static int s_cands_room (rx_engine_t *e, int32_t n, int32_t k, struct rx_err *err)
{
    if (n <= e->cap_cand && k == e->k_cand) return RX_OK;
    if (e->d_cand) e->K->synchronize (e->be, NULL, NULL);
    if (n < e->cap_cand) n = e->cap_cand;
    s_cands_free (e);
    const size_t V = (size_t) e->info.n_vocab;
    void *d = NULL, *dv = NULL, *di = NULL;
    const size_t chunk = n < S_CAND_CHUNK ? (size_t) n : S_CAND_CHUNK;
    int rc = e->K->alloc (e->be, chunk * V * sizeof (float), 0, &d, err);
    if (rc == RX_OK) rc = e->K->alloc (e->be, (size_t) n * (size_t) k * sizeof (float), 0, &dv, err);
    if (rc == RX_OK) rc = e->K->alloc (e->be, (size_t) n * (size_t) k * sizeof (int32_t), 0, &di, err);
    e->d_cand = d;
    e->d_cvals = dv;
    e->d_cidx = di;
    if (rc != RX_OK) {
        s_cands_free (e);
        return rc;
    }
    e->cap_cand = n;
    e->k_cand = k;
    return RX_OK;
}

/* The candidates of c->inv_t's rows, then of c->inv_t2's (see
 * rx_engine_forward_sample): each row copied, softmax(row * inv_t) over
 * the vocabulary (one call per run of adjacent rows at the same
 * temperature), then the k largest of a chunk's rows in one topk; the
 * whole result copied to the host (synchronized by the caller). */
static int s_cands (rx_engine_t *e, int32_t n_out, const struct rx_engine_cands *c, struct rx_err *err)
{
    const size_t V = (size_t) e->info.n_vocab;
    int32_t n = 0;
    for (int32_t j = 0; j < n_out; j++) n += (c->inv_t[j] > 0) + (c->inv_t2 && c->inv_t2[j] > 0);
    if (n == 0) return RX_OK;
    const int32_t k = c->k < 1 ? 1 : (size_t) c->k > V ? (int32_t) V : c->k;
    int rc = s_cands_room (e, n, k, err);
    if (rc != RX_OK) return rc;
    int32_t done = 0, row = 0;   /* rows through topk; rows in the chunk */
    for (int pass = 0; pass < 2 && rc == RX_OK; pass++) {
        const float *it = pass ? c->inv_t2 : c->inv_t;
        for (int32_t j = 0; it && j < n_out && rc == RX_OK;) {
            if (!(it[j] > 0)) {
                j++;
                continue;
            }
            int32_t m = j + 1;
            while (m < n_out && m - j < S_CAND_CHUNK - row && it[m] == it[j]) m++;
            float *dst = e->d_cand + (size_t) row * V;
            rc = e->K->copy2d (e->be, NULL, e->d_logits + (size_t) j * V, V, dst, V, (size_t) (m - j), V, err);
            if (rc == RX_OK) rc = e->K->softmax (e->be, NULL, dst, V, (size_t) (m - j), V, it[j], err);
            row += m - j;
            j = m;
            if (rc == RX_OK && (row == S_CAND_CHUNK || done + row == n)) {
                rc = e->K->topk (e->be, NULL, e->d_cand, V, (size_t) row, V, (size_t) k,
                                 e->d_cvals + (size_t) done * (size_t) k, e->d_cidx + (size_t) done * (size_t) k,
                                 err);
                done += row;
                row = 0;
            }
        }
    }
    if (rc == RX_OK) rc = e->K->copy_d2h (e->be, NULL, c->probs, e->d_cvals, (size_t) n * (size_t) k * sizeof (float), err);
    if (rc == RX_OK) rc = e->K->copy_d2h (e->be, NULL, c->ids, e->d_cidx, (size_t) n * (size_t) k * sizeof (int32_t), err);
    return rc;
}

int rx_engine_forward_ids (rx_engine_t *e, const struct rx_model_batch *b, float *logits,
                           const uint8_t *want, int32_t *ids, struct rx_err *err)
{
    return rx_engine_forward_sample (e, b, logits, want, ids, NULL, err);
}

int rx_engine_logits_rows (rx_engine_t *e, float *logits, int32_t n_out, const uint8_t *want,
                           struct rx_err *err)
{
    if (n_out > e->cap_out || !logits)
        return rx_err_set (err, RX_EINVAL, "engine: logits rows: %d rows, %d in the last step", n_out, e->cap_out);
    int rc = s_logits_down (e, logits, n_out, want, err);
    if (rc == RX_OK) rc = e->K->synchronize (e->be, NULL, err);
    return rc;
}

int rx_engine_can_gather (const rx_engine_t *e)
{
    return RX_HAS (struct rx_kernels_ops, e->K, gather_rows);
}

int rx_engine_logits_gather (rx_engine_t *e, const int32_t *idx, size_t n, float *out, struct rx_err *err)
{
    if (n == 0) return RX_OK;
    if (!idx || !out) return rx_err_set (err, RX_EINVAL, "engine: logits gather: NULL indices or output");
    if (!rx_engine_can_gather (e))
        return rx_err_set (err, RX_ENOTSUP, "engine: logits gather: the kernel backend has no gather_rows");
    const int64_t total = (int64_t) e->cap_out * e->info.n_vocab;
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= total)
            return rx_err_set (err, RX_EINVAL, "engine: logits gather: index %d outside the %lld logits of the last step",
                               (int) idx[i], (long long) total);
    if (n > e->cap_g) {
        /* Grow-only, doubling, from 64Ki entries (512 KiB): a free drops
         * a CUDA backend's graphs, so it should happen once or never. */
        size_t cap = e->cap_g ? e->cap_g : 65536;
        while (cap < n) cap *= 2;
        if (e->d_gidx || e->d_gval) e->K->synchronize (e->be, NULL, NULL);
        if (e->d_gidx) e->K->free_ (e->be, e->d_gidx);
        if (e->d_gval) e->K->free_ (e->be, e->d_gval);
        e->d_gidx = NULL;
        e->d_gval = NULL;
        e->cap_g = 0;
        void *di = NULL, *dv = NULL;
        int rc = e->K->alloc (e->be, cap * sizeof (int32_t), 0, &di, err);
        if (rc == RX_OK) rc = e->K->alloc (e->be, cap * sizeof (float), 0, &dv, err);
        e->d_gidx = di;
        e->d_gval = dv;
        if (rc != RX_OK) return rc;
        e->cap_g = cap;
    }
    /* The logits as rows of one float: y[i] = logits[idx[i]]. */
    int rc = e->K->copy_h2d (e->be, NULL, e->d_gidx, idx, n * sizeof (int32_t), err);
    if (rc == RX_OK) rc = e->K->gather_rows (e->be, NULL, e->d_logits, 1, e->d_gidx, n, 1, e->d_gval, 1, err);
    if (rc == RX_OK) rc = e->K->copy_d2h (e->be, NULL, out, e->d_gval, n * sizeof (float), err);
    if (rc == RX_OK) rc = e->K->synchronize (e->be, NULL, err);
    return rc;
}

int rx_engine_device_sampling (const rx_engine_t *e)
{
    return !(e->kcaps & RX_KCAP_HOST_VISIBLE);
}

int rx_engine_forward_sample (rx_engine_t *e, const struct rx_model_batch *b, float *logits,
                              const uint8_t *want, int32_t *ids, const struct rx_engine_cands *cands,
                              struct rx_err *err)
{
    if (!b || b->struct_size < sizeof *b)
        return rx_err_set (err, RX_EINVAL, "engine: forward: NULL or short batch");
    int32_t n_out = b->n_out;
    int wanted = n_out > 0 && !want && logits;   /* want NULL: every row, if there is a buffer */
    for (int32_t j = 0; want && j < n_out && !wanted; j++) wanted = want[j] != 0;
    if (wanted && !logits)
        return rx_err_set (err, RX_EINVAL, "engine: forward: %d output rows but no logits buffer", n_out);
    if (n_out > 0 && !wanted && !ids)
        return rx_err_set (err, RX_EINVAL, logits || want ? "engine: forward: %d output rows but neither logits nor ids asked for"
                                                          : "engine: forward: %d output rows but no logits buffer",
                           n_out);
    if (n_out > b->n_tokens)
        return rx_err_set (err, RX_EINVAL, "engine: forward: %d output rows for %d tokens", n_out,
                           b->n_tokens);
    if (cands && (!cands->inv_t || !cands->probs || !cands->ids))
        return rx_err_set (err, RX_EINVAL, "engine: forward: candidates without their arrays");
    if (n_out > e->cap_out) {
        if (e->d_logits || e->d_ids) {
            e->K->synchronize (e->be, NULL, NULL);
            if (e->d_logits) e->K->free_ (e->be, e->d_logits);
            if (e->d_ids) e->K->free_ (e->be, e->d_ids);
            e->d_logits = NULL;
            e->d_ids = NULL;
            e->cap_out = 0;
        }
        void *d, *di;
        int rc = e->K->alloc (e->be, (size_t) n_out * (size_t) e->info.n_vocab * sizeof (float), 0, &d, err);
        if (rc != RX_OK) return rc;
        if ((rc = e->K->alloc (e->be, (size_t) n_out * sizeof (int32_t), 0, &di, err)) != RX_OK) {
            e->K->free_ (e->be, d);
            return rc;
        }
        e->d_logits = d;
        e->d_ids = di;
        e->cap_out = n_out;
    }
    struct rx_model_batch mb = *b;
    mb.struct_size = sizeof mb;
    mb.logits = n_out > 0 ? e->d_logits : NULL;
    /* The model copies its expert choices to the host only when somebody
     * reads the counts (recording on, or EPLB rebalance). */
    mb.count_experts = rx_eplb_rt_counting (e->eplb);
    int rc = e->M->forward (e->model, &mb, err);
    if (rc == RX_OK && n_out > 0 && ids) {
        /* The argmax on the device: a greedy row needs 4 bytes, not its
         * n_vocab logits, back on the host. */
        const size_t V = (size_t) e->info.n_vocab;
        rc = e->K->argmax (e->be, NULL, e->d_logits, V, (size_t) n_out, V, e->d_ids, err);
        if (rc == RX_OK)
            rc = e->K->copy_d2h (e->be, NULL, ids, e->d_ids, (size_t) n_out * sizeof (int32_t), err);
    }
    if (rc == RX_OK && n_out > 0 && cands) rc = s_cands (e, n_out, cands, err);
    if (rc == RX_OK && wanted) rc = s_logits_down (e, logits, n_out, want, err);
    if (rc == RX_OK) rc = e->K->synchronize (e->be, NULL, err);
    if (rc == RX_OK && ids)
        for (int32_t j = 0; j < n_out; j++)
            if (ids[j] < 0 || ids[j] >= e->info.n_vocab) ids[j] = 0;   /* an all-NaN row (as rx_argmax) */
    if (rc == RX_OK) rc = rx_eplb_rt_step (e->eplb, err);   /* EPLB at the step boundary */
    return rc;
}

int rx_engine_idle_group (rx_engine_t *e, int32_t all_decode, struct rx_err *err)
{
    if (!e->dp_attention)
        return rx_err_set (err, RX_EINVAL, "engine: idle step without DP attention (opts.dp_attention)");
    if (e->tp_size == 1) return RX_OK;   /* nobody to keep in step */
    /* The idle batch carries the group's flag: the ranks with work see it
     * too, and a graph-capable model must make the same choice on every
     * rank (replay or not) or the collectives inside differ. */
    struct rx_model_batch mb = { .struct_size = sizeof mb, .n_tokens = 0, .n_seq = 0, .n_out = 0,
                                 .all_decode = all_decode ? 1 : 0 };
    rx_log (RX_LOG_DEBUG, "engine: idle forward on DP-attention rank %d of %d (all_decode %d)", e->tp_rank,
            e->tp_size, mb.all_decode);
    return rx_engine_forward (e, &mb, NULL, err);
}

int rx_engine_idle (rx_engine_t *e, struct rx_err *err)
{
    return rx_engine_idle_group (e, 0, err);
}
