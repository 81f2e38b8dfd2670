/* core/scheduler.c -- see scheduler.h.
 *
 * Vocabulary (SGLang's): a request's token sequence is prompt ++ output;
 * n_kv of them have KV in its slots (row of the request -> token table); the
 * first n_prefix of those slots belong to the radix cache (matched or
 * inserted, protected by the lock on `node`), the rest to the request.  A
 * forward pass runs tokens[n_kv .. n_kv + extend) of each request; when that
 * reaches the end of the sequence the last row's logits give the next token.
 * Prefill and decode are the same operation (decode: extend = 1).
 *
 * Slot ownership invariant (rx_sched_check): every slot handed out by the
 * pool is owned by exactly one of the cache or one request's row tail. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grow.h"
#include "kvpool.h"
#include "loader.h"
#include "log.h"
#include "radix_cache.h"
#include "sample_pool.h"
#include "sampling.h"
#include "scheduler.h"

#include <radix/policy.h>

#define S_CLIP_MAX_NEW     4096   /* SGLang's CLIP_MAX_NEW_TOKENS_ESTIMATION */
#define S_RETRACT_STEPS    20     /* SGLang's retract_decode_steps */
#define S_BIG              ((int64_t) 1 << 40)

enum { S_WAITING = 0, S_RUNNING = 1, S_DONE = 2 };

/* One submitted request; its n siblings share it. */
struct s_group {
    struct rx_request req;       /* owned: prompt, sampling params, stop strings */
    uint32_t n_refs;             /* siblings not yet freed */
    struct rx_sampling samp;     /* sampler parameters (seed per sibling) */
    struct rx_penalties pen;
    int      plain_greedy;       /* greedy without penalties: argmax of the raw row */
    int      plain_sample;       /* sampled without penalties: may draw from device candidates */
    int32_t  max_new;            /* effective max_tokens */
};

struct s_req {
    struct s_group *g;
    uint64_t rid;
    uint32_t index;
    uint64_t arrival;            /* unique, increasing: the sort tie-break */
    uint64_t rng;                /* sampler state (starts at the seed) */
    int      state;
    int32_t *toks;               /* prompt ++ output */
    uint32_t len, cap, n_in;
    int      row;                /* kvpool row, -1 none */
    uint32_t n_kv;               /* tokens with KV */
    uint32_t n_prefix;           /* row[0..n_prefix) owned by the cache */
    rx_radix_node_t *node;       /* locked node (NULL: none) */
    uint32_t cached_tokens;      /* at first admission (usage) */
    int      admitted_once;
    int      first_sent;
    /* per step */
    uint32_t match_len;
    rx_radix_node_t *match_node;
    uint32_t extend;
    double   priority;
    int32_t  drawn;              /* this step's token, drawn on the sampling pool */
    int      has_drawn;
    /* when finished / aborted */
    uint8_t  finish;
    int32_t  matched;
};

/* A growable pointer list. */
struct s_list {
    struct s_req **v;
    size_t n, cap;
};

struct rx_sched {
    struct rx_boot *boot;
    rx_engine_t *engine;
    rx_sched_batch_hook batch_hook;  /* rx_sched_set_batch_hook */
    void *batch_hook_ud;
    struct rx_sched_opts o;
    int32_t n_vocab, ctx, engine_max_tokens;
    rx_kvpool_t *pool;
    rx_kvpool_rows_t *rows;
    rx_radix_cache_t *cache;
    rx_plugin_t *policy_plugin;
    const struct rx_sched_policy_ops *policy;
    void *policy_inst;
    rx_sample_pool_t *spool;     /* host sampling threads and their scratch */
    struct s_draw *draws;        /* [cap_draws] this step's host-sampled rows */
    size_t cap_draws;
    int dev_sample;              /* draw plain sampled rows from device candidates (and
                                  * logprobs at temperature 1 from them: s_cand_row) */
    int32_t k_cand;              /* candidates per row: sampling_candidates, at most n_vocab */
    int pen_cand;                /* penalized rows too (the engine can gather logits: s_pen_gather) */

    struct s_list waiting, running, zombies, to_free;
    struct s_req *chunked;       /* mid-prompt request (holds a row and a lock) */
    uint64_t next_arrival, step;
    double new_token_ratio, min_ratio, ratio_decay;
    int group_decode;            /* rx_sched_set_group_decode (default 1) */

    /* step scratch */
    struct s_list batch;
    int32_t *b_tokens, *b_pos, *b_q, *b_kvs, *b_slots, *b_out;
    int32_t *b_ids;              /* [cap_seq] the device argmax of each output row */
    uint8_t *b_want;             /* [cap_seq] 1 = the row's logits are needed on the host */
    float *b_invt;               /* [cap_seq] 1 / temperature of a candidate row, else 0 */
    int32_t *b_crow;             /* [cap_seq] the row's candidate row, or -1 */
    float *b_invt2;              /* [cap_seq] 1: a second candidate row at temperature 1 */
    int32_t *b_lrow;             /* [cap_seq] the candidate row of its logprobs, or -1 */
    uint8_t *b_more;             /* [cap_seq] candidates not enough: fetch the row */
    int32_t *b_goff, *b_gn;      /* [cap_seq] a penalized candidate row's gathered logits
                                  * (g_*: offset, count; count 0: none) */
    float *c_probs;              /* [cap_c] this step's candidates (rx_engine_cands) */
    int32_t *c_ids;
    size_t cap_c;
    /* penalized candidate rows (s_pen_gather, s_pen_draw), [cap_g] each */
    int32_t *g_idx, *g_tok, *g_mid;   /* flat logits index, token, merged candidate id */
    float *g_val, *g_p;               /* raw logit gathered, merged candidate probability */
    size_t cap_g;
    struct rx_cand_pair *g_sort;      /* s_pen_draw's sort scratch [cap_g] */
    size_t cap_tok, cap_seq, cap_slots;
    float *logits;
    size_t cap_logits;
    int32_t *mslots;             /* match scratch [ctx] */
    struct rx_sched_item *items;
    size_t cap_items;

    /* outputs */
    struct rx_ipc_tok_out *ent;
    uint32_t *ent_index;
    int32_t *ent_ids;
    float *ent_lp, *ent_top_lp;
    int32_t *ent_top_ids;
    size_t n_ent, cap_ent;

    /* stats */
    uint64_t st_prompt, st_cached, st_computed, st_gen, st_retract, st_finished;
    uint64_t st_cand_rows, st_cand_full, st_cand_tail;
    uint64_t st_cand_lp_rows, st_cand_lp_full;
    uint64_t st_last_prompt, st_last_gen;
    double st_last_time;
};

/* ------------------------------------------------------------ helpers -- */

/* Sampling parameters that make a greedy draw (the argmax). */
static int s_greedy (const struct rx_sampling_params *sp) { return sp->temperature <= 0 || sp->top_k == 1; }

static int s_list_push (struct s_list *l, struct s_req *r)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        struct s_req **v = realloc (l->v, nc * sizeof *v);
        if (!v) return RX_ENOMEM;
        l->v = v;
        l->cap = nc;
    }
    l->v[l->n++] = r;
    return RX_OK;
}

/* Remove by value, keeping order. */
static int s_list_remove (struct s_list *l, struct s_req *r)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] == r) {
            memmove (&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof *l->v);
            l->n--;
            return 1;
        }
    return 0;
}

static uint64_t s_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static uint32_t s_page (const rx_sched_t *s) { return s->o.page_size; }

static void s_req_free (rx_sched_t *s, struct s_req *r)
{
    (void) s;
    if (!r) return;
    if (r->g && --r->g->n_refs == 0) {
        rx_request_free (&r->g->req);
        free (r->g);
    }
    free (r->toks);
    free (r);
}

static int s_push_token (struct s_req *r, int32_t t)
{
    if (r->len == r->cap) {
        uint32_t nc = r->cap * 2;
        int32_t *v = realloc (r->toks, (size_t) nc * sizeof *v);
        if (!v) return RX_ENOMEM;
        r->toks = v;
        r->cap = nc;
    }
    r->toks[r->len++] = t;
    return RX_OK;
}

/* ------------------------------------------------------------ options -- */

int rx_sched_opts_from_conf (const rx_conf_t *conf, struct rx_sched_opts *o, struct rx_err *err)
{
    memset (o, 0, sizeof *o);
    o->policy = NULL;
    o->page_size = (uint32_t) rx_conf_int (conf, "cache", "page_size", 1);
    o->radix_cache = rx_conf_bool (conf, "cache", "radix_cache", 1);
    o->max_running_requests = (int32_t) rx_conf_int (conf, "scheduler", "max_running_requests", 0);
    o->max_queued_requests = (int32_t) rx_conf_int (conf, "scheduler", "max_queued_requests", 0);
    o->chunked_prefill_size = (int32_t) rx_conf_int (conf, "scheduler", "chunked_prefill_size", 8192);
    o->max_prefill_tokens = (int32_t) rx_conf_int (conf, "scheduler", "max_prefill_tokens", 16384);
    o->schedule_conservativeness = rx_conf_float (conf, "scheduler", "schedule_conservativeness", 1.0);
    o->init_new_token_ratio = rx_conf_float (conf, "scheduler", "init_new_token_ratio", 0.7);
    o->min_new_token_ratio_factor = rx_conf_float (conf, "scheduler", "min_new_token_ratio_factor", 0.14);
    o->new_token_ratio_decay_steps =
        (int32_t) rx_conf_int (conf, "scheduler", "new_token_ratio_decay_steps", 600);
    o->eos_id = -2;
    o->context_len = 0;
    /* DP attention admits more conservatively (struct rx_sched_opts). */
    o->min_reserve_ratio = rx_conf_bool (conf, "parallel", "dp_attention", 0) ? 1.0 : 0.0;
    o->sampling_threads = (int32_t) rx_conf_int (conf, "scheduler", "sampling_threads", 0);
    const char *ds = rx_conf_str (conf, "scheduler", "device_sampling", "auto");
    o->device_sampling = !strcmp (ds, "on") ? 1 : !strcmp (ds, "off") ? 0 : -1;
    o->sampling_candidates = (int32_t) rx_conf_int (conf, "scheduler", "sampling_candidates", 64);
    (void) err;
    return RX_OK;
}

int rx_sched_kv_slots (const rx_conf_t *conf, uint64_t bytes_per_token, const uint64_t *free_bytes,
                       uint32_t *n_slots, struct rx_err *err)
{
    const char *spec = rx_conf_str (conf, "cache", "kv_memory", "0.8");
    uint32_t page = (uint32_t) rx_conf_int (conf, "cache", "page_size", 1);
    uint64_t fb = 0;
    if (free_bytes)
        fb = *free_bytes;
    else {
        int rc = rx_kvpool_meminfo_available (NULL, &fb, err);
        if (rc) return rc;
    }
    return rx_kvpool_size_slots (spec, bytes_per_token, fb, page, n_slots, err);
}

static int s_check_opts (const struct rx_sched_opts *o, struct rx_err *err)
{
    if (o->page_size < 1 || o->page_size > RX_KVPOOL_MAX_PAGE_SIZE)
        return rx_err_set (err, RX_EINVAL, "scheduler: [cache] page_size %u must be in 1..%u",
                           o->page_size, RX_KVPOOL_MAX_PAGE_SIZE);
    if (o->max_running_requests < 0)
        return rx_err_set (err, RX_EINVAL, "scheduler: [scheduler] max_running_requests %d must be >= 0",
                           o->max_running_requests);
    if (o->max_queued_requests < 0)
        return rx_err_set (err, RX_EINVAL, "scheduler: [scheduler] max_queued_requests %d must be >= 0",
                           o->max_queued_requests);
    if (o->chunked_prefill_size == 0 || o->chunked_prefill_size < -1)
        return rx_err_set (err, RX_EINVAL,
                           "scheduler: [scheduler] chunked_prefill_size %d must be -1 or >= 1",
                           o->chunked_prefill_size);
    if (o->max_prefill_tokens < 1)
        return rx_err_set (err, RX_EINVAL, "scheduler: [scheduler] max_prefill_tokens %d must be >= 1",
                           o->max_prefill_tokens);
    if (!(o->schedule_conservativeness > 0) || !(o->init_new_token_ratio >= 0) ||
        !(o->min_new_token_ratio_factor >= 0) || o->new_token_ratio_decay_steps < 1)
        return rx_err_set (err, RX_EINVAL,
                           "scheduler: [scheduler] new-token-ratio settings out of range "
                           "(conservativeness > 0, ratios >= 0, decay steps >= 1)");
    if (o->device_sampling && (o->sampling_candidates < 1 || o->sampling_candidates > RX_SCHED_MAX_CANDIDATES))
        return rx_err_set (err, RX_EINVAL, "scheduler: [scheduler] sampling_candidates %d must be in 1..%d",
                           o->sampling_candidates, RX_SCHED_MAX_CANDIDATES);
    if (!(o->min_reserve_ratio >= 0 && o->min_reserve_ratio <= 1))
        return rx_err_set (err, RX_EINVAL, "scheduler: min_reserve_ratio %g must be in 0..1",
                           o->min_reserve_ratio);
    return RX_OK;
}

/* ------------------------------------------------------ create/destroy -- */

static void s_cache_free (void *ud, const int32_t *slots, size_t n)
{
    rx_sched_t *s = ud;
    struct rx_err e = { 0 };
    if (rx_kvpool_free (s->pool, slots, (uint32_t) n, &e))
        rx_log (RX_LOG_ERROR, "scheduler: cache eviction: %s", e.msg);
}

rx_sched_t *rx_sched_new (struct rx_boot *boot, rx_engine_t *engine, const struct rx_sched_opts *o,
                          struct rx_err *err)
{
    if (!boot || !engine) {
        rx_err_set (err, RX_EINVAL, "scheduler: boot and engine are required");
        return NULL;
    }
    rx_sched_t *s = calloc (1, sizeof *s);
    if (!s) {
        rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
        return NULL;
    }
    s->boot = boot;
    s->engine = engine;
    if (o)
        s->o = *o;
    else if (rx_sched_opts_from_conf (boot->conf, &s->o, err))
        goto fail;
    if (s_check_opts (&s->o, err)) goto fail;

    const struct rx_model_info *mi = rx_engine_info (engine);
    s->n_vocab = mi->n_vocab;
    s->ctx = s->o.context_len > 0 ? s->o.context_len : mi->n_ctx_train;
    if (s->ctx <= 1) s->ctx = 4096;
    s->engine_max_tokens = rx_engine_max_tokens (engine);
    int64_t eng_slots = rx_engine_n_slots (engine);
    uint32_t P = s->o.page_size;
    uint64_t n_slots = s->o.n_slots ? s->o.n_slots : (uint64_t) eng_slots;
    if (n_slots > (uint64_t) eng_slots) {
        rx_err_set (err, RX_EINVAL, "scheduler: KV pool of %llu slots exceeds the engine's %lld",
                    (unsigned long long) n_slots, (long long) eng_slots);
        goto fail;
    }
    n_slots -= n_slots % P;
    if (n_slots == 0) {
        rx_err_set (err, RX_EINVAL, "scheduler: KV pool smaller than one page of %u slots", P);
        goto fail;
    }
    if (s->o.eos_id == -2) {
        uint32_t eos;
        s->o.eos_id = rx_gguf_get_u32 (rx_engine_gguf (engine), "tokenizer.ggml.eos_token_id", &eos) == RX_OK
                          ? (int32_t) eos : -1;
    }
    if (s->o.max_running_requests == 0) {
        uint64_t m = n_slots / 2;
        s->o.max_running_requests = (int32_t) (m < 1 ? 1 : m > 1024 ? 1024 : m);
    }
    /* A decode step runs one token per request: never more than the engine's step. */
    if (s->o.max_running_requests > s->engine_max_tokens)
        s->o.max_running_requests = s->engine_max_tokens;

    s->pool = rx_kvpool_new ((uint32_t) n_slots, P, err);
    if (!s->pool) goto fail;
    /* One row per running request plus the chunked one. */
    s->rows = rx_kvpool_rows_new ((uint32_t) s->o.max_running_requests + 1, (uint32_t) s->ctx + 1, err);
    if (!s->rows) goto fail;
    s->cache = rx_radix_cache_new (P, s_cache_free, s, err);
    if (!s->cache) goto fail;

    /* The schedule policy. */
    int rc;
    if (s->o.policy) {
        rc = rx_loader_find (boot->loader, RX_KIND_SCHED_POLICY, s->o.policy, &s->policy_plugin, err);
        if (rc == RX_OK) rc = rx_plugin_init (s->policy_plugin, boot->conf, err);
    } else {
        rc = rx_boot_plugin (boot, "scheduler", "policy", RX_KIND_SCHED_POLICY, &s->policy_plugin, err);
    }
    if (rc) goto fail;
    s->policy = rx_plugin_ops (s->policy_plugin);
    if (s->policy->create && s->policy->create (rx_plugin_host (s->policy_plugin), &s->policy_inst, err))
        goto fail;

    if (!(s->spool = rx_sample_pool_new (s->o.sampling_threads, s->n_vocab, err))) goto fail;
    s->dev_sample = s->o.device_sampling < 0 ? rx_engine_device_sampling (s->engine) : s->o.device_sampling;
    s->k_cand = s->o.sampling_candidates < s->n_vocab ? s->o.sampling_candidates : s->n_vocab;
    s->pen_cand = s->dev_sample && rx_engine_can_gather (s->engine);
    if (s->dev_sample)
        rx_log (RX_LOG_INFO, "scheduler: device sampling: sampled rows draw from their %d most likely tokens%s",
                s->k_cand, s->pen_cand ? " (penalized rows too)" : "");
    s->mslots = malloc ((size_t) (s->ctx + 1) * sizeof *s->mslots);
    if (!s->mslots) {
        rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
        goto fail;
    }
    double init = s->o.init_new_token_ratio * s->o.schedule_conservativeness;
    if (init > 1) init = 1;
    s->new_token_ratio = init;
    s->min_ratio = init * s->o.min_new_token_ratio_factor;
    if (s->min_ratio > 1) s->min_ratio = 1;
    s->ratio_decay = (init - s->min_ratio) / s->o.new_token_ratio_decay_steps;
    s->group_decode = 1;
    s->st_last_time = s_now ();
    return s;
fail:
    rx_sched_destroy (&s);
    return NULL;
}

static void s_free_list (rx_sched_t *s, struct s_list *l)
{
    for (size_t i = 0; i < l->n; i++) s_req_free (s, l->v[i]);
    free (l->v);
    memset (l, 0, sizeof *l);
}

void rx_sched_destroy (rx_sched_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_sched_t *s = *self_p;
    s_free_list (s, &s->waiting);
    s_free_list (s, &s->running);
    s_free_list (s, &s->zombies);
    s_free_list (s, &s->to_free);
    s_req_free (s, s->chunked);
    free (s->batch.v);
    /* The pool goes away with the cache: no need to hand slots back. */
    rx_radix_cache_destroy (&s->cache);
    rx_kvpool_rows_destroy (&s->rows);
    rx_kvpool_destroy (&s->pool);
    if (s->policy && s->policy->destroy) s->policy->destroy (s->policy_inst);
    rx_sample_pool_destroy (&s->spool);
    free (s->draws);
    free (s->mslots);
    free (s->b_tokens); free (s->b_pos); free (s->b_q); free (s->b_kvs);
    free (s->b_slots); free (s->b_out); free (s->logits); free (s->items);
    free (s->b_ids); free (s->b_want); free (s->b_invt); free (s->b_crow); free (s->b_more);
    free (s->b_goff); free (s->b_gn); free (s->b_invt2); free (s->b_lrow);
    free (s->c_probs); free (s->c_ids);
    free (s->g_idx); free (s->g_tok); free (s->g_mid); free (s->g_val); free (s->g_p); free (s->g_sort);
    free (s->ent); free (s->ent_index); free (s->ent_ids); free (s->ent_lp);
    free (s->ent_top_lp); free (s->ent_top_ids);
    free (s);
    *self_p = NULL;
}

/* ------------------------------------------------------------- submit -- */

static struct s_req *s_find_any (const rx_sched_t *s, uint64_t rid)
{
    const struct s_list *ls[2] = { &s->waiting, &s->running };
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < ls[k]->n; i++)
            if (ls[k]->v[i]->rid == rid) return ls[k]->v[i];
    if (s->chunked && s->chunked->rid == rid) return s->chunked;
    return NULL;
}

int rx_sched_submit (rx_sched_t *s, struct rx_request *r, struct rx_err *err)
{
    if (!s || !r) return rx_err_set (err, RX_EINVAL, "scheduler: submit: NULL argument");
    int rc = rx_sampling_params_validate (&r->sp, err);
    if (rc) return rc;
    if (r->n_input == 0 || !r->input_ids)
        return rx_err_set (err, RX_EINVAL, "request %llu: empty prompt", (unsigned long long) r->rid);
    for (uint32_t i = 0; i < r->n_input; i++)
        if (r->input_ids[i] < 0 || r->input_ids[i] >= s->n_vocab)
            return rx_err_set (err, RX_EINVAL, "request %llu: token %d at %u is outside the vocabulary (%d)",
                               (unsigned long long) r->rid, r->input_ids[i], i, s->n_vocab);
    if ((int64_t) r->n_input >= s->ctx)
        return rx_err_set (err, RX_ERANGE,
                           "request %llu: prompt of %u tokens leaves no room in the context of %d",
                           (unsigned long long) r->rid, r->n_input, s->ctx);
    uint32_t P = s_page (s);
    uint64_t need = ((uint64_t) r->n_input + P) / P * P;   /* prompt + one token, in pages */
    if (need > rx_kvpool_capacity (s->pool))
        return rx_err_set (err, RX_ERANGE, "request %llu: prompt of %u tokens does not fit the KV pool of %u",
                           (unsigned long long) r->rid, r->n_input, rx_kvpool_capacity (s->pool));
    if (s_find_any (s, r->rid))
        return rx_err_set (err, RX_EINVAL, "request %llu: rid already in use", (unsigned long long) r->rid);
    uint32_t n = (uint32_t) r->sp.n;
    if (s->o.max_queued_requests > 0 && s->waiting.n + n > (size_t) s->o.max_queued_requests)
        return rx_err_set (err, RX_EAGAIN, "scheduler: queue full (%zu waiting, max_queued_requests %d)",
                           s->waiting.n, s->o.max_queued_requests);

    struct s_group *g = calloc (1, sizeof *g);
    struct s_req **sib = calloc (n, sizeof *sib);
    if (!g || !sib) goto nomem;
    for (uint32_t i = 0; i < n; i++) {
        struct s_req *q = calloc (1, sizeof *q);
        if (!q) goto nomem;
        sib[i] = q;
        q->cap = r->n_input + 16;
        q->toks = malloc ((size_t) q->cap * sizeof *q->toks);
        if (!q->toks) goto nomem;
    }
    if (s->waiting.cap < s->waiting.n + n) {
        size_t nc = s->waiting.n + n + 16;
        struct s_req **v = realloc (s->waiting.v, nc * sizeof *v);
        if (!v) goto nomem;
        s->waiting.v = v;
        s->waiting.cap = nc;
    }
    /* Commit: nothing below fails. */
    g->req = *r;
    memset (r, 0, sizeof *r);
    rx_sampling_params_init (&r->sp);
    const struct rx_sampling_params *sp = &g->req.sp;
    g->n_refs = n;
    rx_sampling_defaults (&g->samp);
    g->samp.temperature = sp->temperature;
    g->samp.top_k = sp->top_k < 0 ? 0 : sp->top_k;
    g->samp.top_p = sp->top_p;
    g->samp.min_p = sp->min_p;
    g->pen.frequency = sp->frequency_penalty;
    g->pen.presence = sp->presence_penalty;
    g->pen.repetition = sp->repetition_penalty;
    const int no_pen = sp->frequency_penalty == 0 && sp->presence_penalty == 0 && sp->repetition_penalty == 1;
    g->plain_greedy = s_greedy (sp) && no_pen;
    g->plain_sample = !s_greedy (sp) && no_pen;
    int64_t room = (int64_t) s->ctx - g->req.n_input;
    g->max_new = (int32_t) (sp->max_tokens < 0 || sp->max_tokens > room ? room : sp->max_tokens);
    uint64_t seed = sp->has_seed ? sp->seed : s_mix (g->req.rid);
    for (uint32_t i = 0; i < n; i++) {
        struct s_req *q = sib[i];
        q->g = g;
        q->rid = g->req.rid;
        q->index = i;
        q->arrival = s->next_arrival++;
        q->rng = seed + i;
        q->state = S_WAITING;
        memcpy (q->toks, g->req.input_ids, (size_t) g->req.n_input * sizeof *q->toks);
        q->len = q->n_in = g->req.n_input;
        q->row = -1;
        q->matched = -1;
        s->waiting.v[s->waiting.n++] = q;
    }
    free (sib);
    return RX_OK;
nomem:
    if (sib)
        for (uint32_t i = 0; i < n; i++)
            if (sib[i]) { free (sib[i]->toks); free (sib[i]); }
    free (sib);
    free (g);
    return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
}

/* ------------------------------------------------------ KV bookkeeping -- */

static void s_free_slots (rx_sched_t *s, const int32_t *slots, uint32_t n)
{
    struct rx_err e = { 0 };
    if (n && rx_kvpool_free (s->pool, slots, n, &e))
        rx_log (RX_LOG_ERROR, "scheduler: %s", e.msg);
}

static void s_unlock (rx_sched_t *s, struct s_req *r)
{
    if (r->node) {
        struct rx_err e = { 0 };
        if (rx_radix_cache_unlock (s->cache, r->node, &e))
            rx_log (RX_LOG_ERROR, "scheduler: %s", e.msg);
        r->node = NULL;
    }
}

/* Give up the request's KV.  insert: put its computed tokens into the cache
 * first (finish, retract; SGLang's cache_finished_req), else free its own
 * slots (abort).  The row is released. */
static void s_release (rx_sched_t *s, struct s_req *r, int insert)
{
    if (r->row < 0) return;
    uint32_t len;   /* row length: n_kv, or more when slots were taken for a step that failed */
    const int32_t *row = rx_kvpool_rows_get (s->rows, r->row, &len);
    uint32_t n_kv = r->n_kv;
    if (insert && s->o.radix_cache && n_kv > 0) {
        struct rx_radix_match m;
        struct rx_err e = { 0 };
        if (rx_radix_cache_insert (s->cache, r->toks, row, n_kv, &m, &e) == RX_OK) {
            /* [n_prefix, prefix_len): ours, duplicating the cache's: free;
             * [prefix_len, m.len): the cache's now; [m.len, len): ours: free. */
            if (m.prefix_len > r->n_prefix)
                s_free_slots (s, row + r->n_prefix, (uint32_t) m.prefix_len - r->n_prefix);
            s_free_slots (s, row + m.len, len - (uint32_t) m.len);
        } else {
            rx_log (RX_LOG_WARN, "scheduler: cache insert: %s", e.msg);
            s_free_slots (s, row + r->n_prefix, len - r->n_prefix);
        }
    } else {
        s_free_slots (s, row + r->n_prefix, len - r->n_prefix);
    }
    s_unlock (s, r);
    struct rx_err e = { 0 };
    rx_kvpool_rows_free (s->rows, r->row, &e);
    r->row = -1;
    r->n_kv = r->n_prefix = 0;
}

/* SGLang's cache_unfinished_req: insert what the request has computed and
 * take the cache's slots (and lock) for it, so later requests share it. */
static void s_cache_unfinished (rx_sched_t *s, struct s_req *r)
{
    if (!s->o.radix_cache || r->row < 0) return;
    uint32_t len;
    const int32_t *row = rx_kvpool_rows_get (s->rows, r->row, &len);
    struct rx_radix_match m, mm;
    struct rx_err e = { 0 };
    if (rx_radix_cache_insert (s->cache, r->toks, row, r->n_kv, &m, &e)) return;
    if (m.len <= r->n_prefix) return;
    if (m.prefix_len > r->n_prefix)
        s_free_slots (s, row + r->n_prefix, (uint32_t) m.prefix_len - r->n_prefix);
    /* The cache's slots for [0, m.len) (ours past prefix_len, its own before). */
    if (rx_radix_cache_match (s->cache, r->toks, m.len, s->mslots, &mm, &e) || mm.len != m.len) {
        rx_log (RX_LOG_ERROR, "scheduler: re-match after insert: %s", e.msg);
        return;
    }
    rx_kvpool_rows_write (s->rows, r->row, 0, s->mslots, (uint32_t) m.len, &e);
    rx_radix_cache_lock (s->cache, mm.last, &e);
    s_unlock (s, r);
    r->node = mm.last;
    r->n_prefix = (uint32_t) m.len;
}

/* Slots a request needs for n more tokens (whole new pages). */
static uint64_t s_need (const rx_sched_t *s, uint32_t n_kv, uint32_t n)
{
    uint32_t P = s_page (s);
    uint64_t have = ((uint64_t) n_kv + P - 1) / P * P;   /* end of its last page */
    uint64_t want = (uint64_t) n_kv + n;
    return want <= have ? 0 : (want - have + P - 1) / P * P;
}

/* Slots for positions n_kv .. n_kv + n of r (appended to its row); evicts
 * from the cache when the pool is short.  All or nothing. */
static int s_alloc (rx_sched_t *s, struct s_req *r, uint32_t n)
{
    uint32_t len;
    const int32_t *row = rx_kvpool_rows_get (s->rows, r->row, &len);
    int32_t last = len ? row[len - 1] : -1;
    if (len != r->n_kv) return RX_EINTERNAL;
    int32_t *out = s->mslots;
    struct rx_err e = { 0 };
    uint64_t want = s_need (s, r->n_kv, n), avail = rx_kvpool_available (s->pool);
    if (want > avail) rx_radix_cache_evict (s->cache, (size_t) (want - avail));
    int rc = rx_kvpool_alloc_extend (s->pool, last, n, out, &e);
    if (rc) return rc;
    rc = rx_kvpool_rows_append (s->rows, r->row, out, n, &e);
    if (rc) s_free_slots (s, out, n);
    return rc;
}

static uint64_t s_room (const rx_sched_t *s)
{
    return (uint64_t) rx_kvpool_available (s->pool) + rx_radix_cache_evictable_size (s->cache);
}

/* Parallel arrays that follow one capacity: grows each *arr[i] to cap
 * elements of size[i].  0, or -1 when any realloc failed (the ones that
 * grew keep their new size, every array its contents). */
static int s_grow_each (size_t cap, void **const arr[], const size_t size[], size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        void *p = realloc (*arr[i], cap * size[i]);
        if (p) *arr[i] = p;
        else rc = -1;
    }
    return rc;
}

/* ------------------------------------------------------------ outputs -- */

static struct rx_ipc_tok_out *s_emit (rx_sched_t *s, struct s_req *r)
{
    size_t i = s->n_ent;
    if (rx_grow ((void **) &s->ent, &s->cap_ent, i + 1, sizeof *s->ent)) return NULL;
    /* parallel arrays follow cap_ent */
    void **const arr[] = { (void **) &s->ent_index, (void **) &s->ent_ids, (void **) &s->ent_lp,
                           (void **) &s->ent_top_ids, (void **) &s->ent_top_lp };
    const size_t size[] = { sizeof *s->ent_index, sizeof *s->ent_ids, sizeof *s->ent_lp,
                            RX_MAX_TOP_LOGPROBS * sizeof *s->ent_top_ids,
                            RX_MAX_TOP_LOGPROBS * sizeof *s->ent_top_lp };
    if (s_grow_each (s->cap_ent, arr, size, sizeof arr / sizeof arr[0])) return NULL;
    s->n_ent++;
    struct rx_ipc_tok_out *t = &s->ent[i];
    memset (t, 0, sizeof *t);
    s->ent_index[i] = r->index;
    t->rid = r->rid;
    t->index = r->index;
    t->finish = RX_FINISH_NONE;
    t->matched = -1;
    t->usage.prompt_tokens = r->n_in;
    t->usage.cached_tokens = r->cached_tokens;
    t->usage.completion_tokens = r->len - r->n_in;
    const struct rx_sampling_params *sp = &r->g->req.sp;
    if (!r->first_sent) {
        r->first_sent = 1;
        t->first = 1;
        t->skip_special_tokens = sp->skip_special_tokens;
        t->n_stop = sp->n_stop;
        for (uint32_t k = 0; k < sp->n_stop; k++) t->stop[k] = sp->stop[k];
    }
    return t;
}

/* Point the entries into the flat arrays (after every realloc is done). */
static void s_finalize_out (rx_sched_t *s, struct rx_sched_out *out)
{
    for (size_t i = 0; i < s->n_ent; i++) {
        struct rx_ipc_tok_out *t = &s->ent[i];
        t->ids = t->n_ids ? &s->ent_ids[i] : NULL;
        if (t->has_logprobs) {
            t->lp.n = t->n_ids;
            t->lp.ids = NULL;
            t->lp.logprob = &s->ent_lp[i];
            t->lp.top_ids = t->lp.n_top ? &s->ent_top_ids[i * RX_MAX_TOP_LOGPROBS] : NULL;
            t->lp.top_logprob = t->lp.n_top ? &s->ent_top_lp[i * RX_MAX_TOP_LOGPROBS] : NULL;
        }
    }
    out->tokens.step = s->step;
    out->tokens.n = (uint32_t) s->n_ent;
    out->tokens.out = s->n_ent ? s->ent : NULL;
    out->index = s->n_ent ? s->ent_index : NULL;
}

/* A request is done (finish set): emit happens by the caller; here it
 * leaves every list and is freed at the next step. */
static void s_retire (rx_sched_t *s, struct s_req *r)
{
    r->state = S_DONE;
    s_list_push (&s->to_free, r);
    s->st_finished++;
}

/* ------------------------------------------------------------- abort -- */

int rx_sched_abort_all (rx_sched_t *s)
{
    if (!s) return 0;
    int n = 0;
    /* Each rx_sched_abort takes every sibling of its rid off every list. */
    while (s->chunked) n += rx_sched_abort (s, s->chunked->rid);
    while (s->running.n) n += rx_sched_abort (s, s->running.v[0]->rid);
    while (s->waiting.n) n += rx_sched_abort (s, s->waiting.v[0]->rid);
    return n;
}

/* Take r off its list, free its KV and queue its ABORT finish for the
 * next step. */
static void s_abort_one (rx_sched_t *s, struct s_req *r)
{
    if (r == s->chunked)
        s->chunked = NULL;
    else if (!s_list_remove (&s->waiting, r))
        s_list_remove (&s->running, r);
    s_release (s, r, 0);
    r->finish = RX_FINISH_ABORT;
    r->matched = -1;
    r->state = S_DONE;
    s_list_push (&s->zombies, r);
}

int rx_sched_abort (rx_sched_t *s, uint64_t rid)
{
    if (!s) return 0;
    int n = 0;
    struct s_req *r;
    while ((r = s_find_any (s, rid))) {
        s_abort_one (s, r);
        n++;
    }
    return n;
}

int rx_sched_abort_seq (rx_sched_t *s, uint64_t rid, uint32_t index)
{
    if (!s) return 0;
    const struct s_list *ls[2] = { &s->waiting, &s->running };
    struct s_req *r = s->chunked && s->chunked->rid == rid && s->chunked->index == index ? s->chunked : NULL;
    for (int k = 0; k < 2 && !r; k++)
        for (size_t i = 0; i < ls[k]->n && !r; i++)
            if (ls[k]->v[i]->rid == rid && ls[k]->v[i]->index == index) r = ls[k]->v[i];
    if (!r) return 0;
    s_abort_one (s, r);
    return 1;
}

/* ---------------------------------------------------------- prefill -- */

/* Match every waiting request (at most len - 1 tokens: one must be
 * computed to get logits) and order them with the policy. */
static int s_cmp_items (const void *a, const void *b)
{
    const struct s_req *x = *(struct s_req *const *) a, *y = *(struct s_req *const *) b;
    if (x->priority < y->priority) return -1;
    if (x->priority > y->priority) return 1;
    return (x->arrival > y->arrival) - (x->arrival < y->arrival);
}

static int s_order_waiting (rx_sched_t *s, struct rx_err *err)
{
    size_t n = s->waiting.n;
    if (rx_grow ((void **) &s->items, &s->cap_items, n, sizeof *s->items))
        return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
    rx_radix_node_t *root = rx_radix_cache_root (s->cache);
    for (size_t i = 0; i < n; i++) {
        struct s_req *r = s->waiting.v[i];
        r->match_len = 0;
        r->match_node = root;
        if (s->o.radix_cache) {
            struct rx_radix_match m;
            if (rx_radix_cache_match (s->cache, r->toks, r->len - 1, NULL, &m, err) == RX_OK) {
                r->match_len = (uint32_t) m.len;
                r->match_node = m.last;
            }
        }
        struct rx_sched_item *it = &s->items[i];
        it->rid = r->rid;
        it->arrival = r->arrival;
        it->prompt_tokens = r->len;
        it->cached_tokens = r->match_len;
        it->node = r->match_node == root ? 0 : (uintptr_t) r->match_node;
        it->priority = 0;
    }
    struct rx_tree_view tv;
    rx_radix_cache_tree_view (s->cache, &tv);
    int rc = s->policy->prioritize (s->policy_inst, s->items, n, &tv, s_mix (s->step), err);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        double p = s->items[i].priority;
        s->waiting.v[i]->priority = isnan (p) ? 0 : p;
    }
    qsort (s->waiting.v, n, sizeof *s->waiting.v, s_cmp_items);
    return RX_OK;
}

static int64_t s_reserve_new (const struct s_req *r)
{
    int64_t left = (int64_t) r->g->max_new - (int64_t) (r->len - r->n_in);
    if (left < 0) left = 0;
    return left > S_CLIP_MAX_NEW ? S_CLIP_MAX_NEW : left;
}

/* Admit r: row, cached prefix (locked), then `extend` slots.  Undone on
 * failure (r stays waiting). */
static int s_admit (rx_sched_t *s, struct s_req *r, uint32_t extend)
{
    struct rx_err e = { 0 };
    int row = rx_kvpool_rows_alloc (s->rows, &e);
    if (row < 0) return row;
    r->row = row;
    r->n_kv = r->n_prefix = 0;
    if (r->match_len) {
        struct rx_radix_match m;
        if (rx_radix_cache_match (s->cache, r->toks, r->match_len, s->mslots, &m, &e) ||
            m.len != r->match_len) {
            rx_kvpool_rows_free (s->rows, row, &e);
            r->row = -1;
            return RX_EINTERNAL;
        }
        rx_kvpool_rows_append (s->rows, row, s->mslots, r->match_len, &e);
        rx_radix_cache_lock (s->cache, m.last, &e);
        r->node = m.last;
        r->n_kv = r->n_prefix = r->match_len;
    }
    int rc = s_alloc (s, r, extend);
    if (rc) {
        s_unlock (s, r);
        rx_kvpool_rows_free (s->rows, row, &e);
        r->row = -1;
        r->n_kv = r->n_prefix = 0;
        return rc;
    }
    if (!r->admitted_once) {
        r->admitted_once = 1;
        r->cached_tokens = r->match_len < r->n_in ? r->match_len : r->n_in;
        s->st_prompt += r->n_in;
        s->st_cached += r->cached_tokens;
    }
    r->state = S_RUNNING;
    r->extend = extend;
    return RX_OK;
}

/* SGLang's get_new_batch_prefill + PrefillAdder.  Fills s->batch. */
/* In-batch prefix sharing (SGLang's in-batch prefix caching): r's
 * uncached part begins with at least S_IN_BATCH_SHARE tokens that a request
 * already in this prefill batch is computing from the same cache match.
 * Prefilling both would compute those tokens twice; deferring r one step
 * lets it hit them in the cache (the batch member inserts its prefix when
 * its prefill ends).  This is what keeps a burst of requests with a new
 * common system prompt from computing the prompt once per request. */
#define S_IN_BATCH_SHARE 32
static int s_shares_with_batch (const rx_sched_t *s, const struct s_req *r)
{
    for (size_t b = 0; b < s->batch.n; b++) {
        const struct s_req *o = s->batch.v[b];
        if (o->match_len != r->match_len || o->n_kv > r->match_len) continue;
        uint32_t m = r->match_len, n = 0;
        uint32_t lim = (r->len < o->len ? r->len : o->len) - m;
        while (n < lim && n < S_IN_BATCH_SHARE && r->toks[m + n] == o->toks[m + n]) n++;
        if (n >= S_IN_BATCH_SHARE) return 1;
    }
    return 0;
}

static int s_form_prefill (rx_sched_t *s, struct rx_err *err)
{
    s->batch.n = 0;
    int64_t n_run = (int64_t) s->running.n + (s->chunked ? 1 : 0);
    if (!s->chunked && (s->waiting.n == 0 || n_run >= s->o.max_running_requests)) return RX_OK;

    int64_t rem_input = s->o.max_prefill_tokens;
    if (rem_input > s->engine_max_tokens) rem_input = s->engine_max_tokens;
    int64_t rem_chunk = s->o.chunked_prefill_size > 0 ? s->o.chunked_prefill_size : S_BIG;
    if (rem_chunk > s->engine_max_tokens) rem_chunk = s->engine_max_tokens;
    /* Reserved for the running requests' future tokens (at least
     * min_reserve_ratio of them: DP attention, see scheduler.h). */
    double offset = 0, ratio = s->new_token_ratio;
    if (ratio < s->o.min_reserve_ratio) ratio = s->o.min_reserve_ratio;
    for (size_t i = 0; i < s->running.n; i++)
        offset += (double) s_reserve_new (s->running.v[i]) * ratio;

    /* 1. the chunked request continues. */
    if (s->chunked) {
        struct s_req *r = s->chunked;
        int64_t left = (int64_t) r->len - r->n_kv;
        int64_t ext = left < rem_chunk ? left : rem_chunk;
        if (s_alloc (s, r, (uint32_t) ext) == RX_OK) {
            r->extend = (uint32_t) ext;
            s_list_push (&s->batch, r);
            /* Slots are taken at once (SGLang allocates after the adder), so
             * the room already excludes ext: only the future tokens count. */
            int truncated = ext < left;
            offset += truncated ? 0 : (double) s_reserve_new (r);
            rem_input -= ext;
            rem_chunk -= ext;
        } else {
            return RX_OK;   /* no room now: decode makes progress meanwhile */
        }
    }
    if (s->waiting.n == 0 || rem_chunk <= 0 || rem_input <= 0) return RX_OK;

    int rc = s_order_waiting (s, err);
    if (rc) return rc;

    size_t i = 0;
    int64_t n_new = 0;
    struct s_req *new_chunked = NULL;
    while (i < s->waiting.n) {
        if (n_run + n_new >= s->o.max_running_requests) break;
        struct s_req *r = s->waiting.v[i];
        if (s->o.radix_cache && s_shares_with_batch (s, r)) {
            i++;
            continue;
        }
        int64_t ext = (int64_t) r->len - r->match_len;
        int64_t total = ext + s_reserve_new (r);
        double rem_total = (double) s_room (s) - offset;
        /* Liveness (ours, not SGLang's): with nothing running, the first
         * request may start even if its whole max_tokens cannot be
         * reserved; retraction / the context limit handle the rest. */
        int alone = s->running.n == 0 && s->batch.n == 0 && !s->chunked;
        if ((double) total >= rem_total && !alone) break;
        if (ext >= rem_input && s->batch.n > 0) break;
        int64_t take = ext <= rem_chunk ? ext : rem_chunk;
        if (take <= 0) break;
        if (s_admit (s, r, (uint32_t) take) != RX_OK) break;
        memmove (&s->waiting.v[i], &s->waiting.v[i + 1], (s->waiting.n - i - 1) * sizeof *s->waiting.v);
        s->waiting.n--;
        s_list_push (&s->batch, r);
        n_new++;
        rem_input -= take;
        rem_chunk -= take;
        if (take < ext) {
            new_chunked = r;
            break;
        }
        offset += (double) s_reserve_new (r);
        if ((double) s_room (s) - offset <= 0 || rem_input <= 0 || rem_chunk <= 0) break;
    }
    /* new_chunked (if any) becomes s->chunked after the forward pass: only
     * one request is mid-prompt at a time, since a request is cut only when
     * the chunk budget runs out. */
    (void) new_chunked;
    return RX_OK;
}

/* ----------------------------------------------------------- decode -- */

/* SGLang's retract_decode order: fewest generated tokens first, then the
 * longest prompt, then the newest. */
static size_t s_pick_victim (const rx_sched_t *s)
{
    size_t best = 0;
    for (size_t i = 1; i < s->running.n; i++) {
        const struct s_req *a = s->running.v[i], *b = s->running.v[best];
        uint32_t oa = a->len - a->n_in, ob = b->len - b->n_in;
        if (oa != ob) { if (oa < ob) best = i; continue; }
        if (a->n_in != b->n_in) { if (a->n_in > b->n_in) best = i; continue; }
        if (a->arrival > b->arrival) best = i;
    }
    return best;
}

static uint64_t s_need_all (const rx_sched_t *s, uint32_t steps)
{
    uint64_t need = 0;
    for (size_t i = 0; i < s->running.n; i++)
        need += s_need (s, s->running.v[i]->n_kv, steps);
    return need;
}

static void s_retract (rx_sched_t *s, size_t i)
{
    struct s_req *r = s->running.v[i];
    memmove (&s->running.v[i], &s->running.v[i + 1], (s->running.n - i - 1) * sizeof *s->running.v);
    s->running.n--;
    s_release (s, r, 1);
    r->state = S_WAITING;
    s_list_push (&s->waiting, r);
    s->st_retract++;
}

static int s_form_decode (rx_sched_t *s, struct rx_sched_out *out)
{
    s->batch.n = 0;
    if (!s->running.n) return RX_OK;
    if (s_need_all (s, 1) > s_room (s)) {
        /* Retract until the rest have room for S_RETRACT_STEPS more tokens
         * each (at least one retraction; one request always stays). */
        int first = 1;
        while (s->running.n > 1 && (first || s_room (s) < s_need_all (s, S_RETRACT_STEPS))) {
            first = 0;
            s_retract (s, s_pick_victim (s));
            out->n_retracted++;
        }
        uint64_t dec = 0, maxnew = 0;
        for (size_t i = 0; i < s->running.n; i++) {
            dec += s->running.v[i]->len - s->running.v[i]->n_in;
            maxnew += (uint64_t) s->running.v[i]->g->max_new;
        }
        double r = maxnew ? (double) (dec + S_RETRACT_STEPS * s->running.n) / (double) maxnew : 1;
        s->new_token_ratio = r < 1 ? r : 1;
        if (s_need_all (s, 1) > s_room (s)) {
            /* A lone request that outgrew the pool: it ends here. */
            struct s_req *r0 = s->running.v[0];
            s->running.n = 0;
            r0->finish = RX_FINISH_LENGTH;
            struct rx_ipc_tok_out *t = s_emit (s, r0);
            if (t) t->finish = RX_FINISH_LENGTH;
            s_release (s, r0, 1);
            s_retire (s, r0);
            return RX_OK;
        }
    } else {
        s->new_token_ratio -= s->ratio_decay;
        if (s->new_token_ratio < s->min_ratio) s->new_token_ratio = s->min_ratio;
    }
    for (size_t i = 0; i < s->running.n;) {
        struct s_req *r = s->running.v[i];
        if (s_alloc (s, r, 1) != RX_OK) {   /* not expected after the room check */
            s_retract (s, i);
            out->n_retracted++;
            continue;
        }
        r->extend = 1;
        s_list_push (&s->batch, r);
        i++;
    }
    return RX_OK;
}

/* ---------------------------------------------------- forward, sample -- */

/* Whether s_sample will read r's logits row (else the device argmax the
 * engine returns is its token): sampling, penalties, a min_tokens ban and
 * logprobs need the row; a plain greedy request does not. */
static int s_needs_logits (const struct s_req *r)
{
    const struct rx_sampling_params *sp = &r->g->req.sp;
    const uint32_t n_out = r->len - r->n_in;
    if ((int64_t) n_out >= r->g->max_new) return 0;   /* finishes without a token */
    const int ban = (int64_t) n_out < sp->min_tokens;
    return !(r->g->plain_greedy && !ban) || sp->logprobs;
}

/* This step's host-sampled rows, drawn on the sampling pool before the
 * requests are walked in order (s_draw_all). */
struct s_draw {
    struct s_req *r;
    const float *raw;
    int ban;
    const int32_t *tail;   /* s_draw_row: n_tail ids */
    int32_t n_tail;
};

/* A request with penalties (neither plain greedy nor plain sampled). */
static int s_penalized (const struct s_req *r) { return !r->g->plain_greedy && !r->g->plain_sample; }

/* Whether r's row is banned from EOS and its stop ids this step
 * (min_tokens not reached). */
static int s_banned (const struct s_req *r) { return (int64_t) (r->len - r->n_in) < r->g->req.sp.min_tokens; }

/* A row whose logits the host corrects before the draw: penalties, or
 * the min_tokens ban. */
static int s_corrected (const struct s_req *r) { return s_penalized (r) || s_banned (r); }

/* Whether a corrected row may take candidates: the tokens it touches (the
 * output's; with a repetition penalty the prompt's too; banned EOS and
 * stop ids) are few enough to gather instead of the row (s_pen_gather), a
 * quarter of the vocabulary at most with the candidates. */
static int s_pen_room (const rx_sched_t *s, const struct s_req *r)
{
    const int rep = r->g->pen.repetition != 1 && r->g->pen.repetition > 0;
    uint64_t touched = s_penalized (r) ? (rep ? r->len : r->len - r->n_in) : 0;
    if (s_banned (r)) touched += 1 + (uint64_t) r->g->req.sp.n_stop_ids;
    return touched + (uint64_t) s->k_cand <= (uint64_t) s->n_vocab / 4;
}

/* Whether r's row gets device candidates this step instead of going to
 * the host whole: device sampling on, top_logprobs (if asked) <=
 * sampling_candidates, and a sampled row (the draw), a row with
 * penalties or a min_tokens ban (its candidates corrected on the host:
 * s_pen_draw), or a greedy one with logprobs.  Logprobs are of the raw
 * row (OpenAI's, and the host path's rx_logprobs): candidates at
 * temperature 1 of the uncorrected row are its log_softmax
 * (rx_logprobs_cands); a row drawn at another temperature gets a second
 * candidate row at 1 (s_lp_invt). */
static int s_cand_row (const rx_sched_t *s, const struct s_req *r)
{
    const struct rx_sampling_params *sp = &r->g->req.sp;
    const uint32_t n_out = r->len - r->n_in;
    if (!s->dev_sample || (int64_t) n_out >= r->g->max_new) return 0;
    if (sp->logprobs && sp->top_logprobs > s->k_cand) return 0;
    if (s_corrected (r)) return s->pen_cand && s_pen_room (s, r);
    return r->g->plain_greedy ? sp->logprobs : r->g->plain_sample;
}

/* 1 / the temperature of a candidate row's softmax: 1 for a greedy row
 * (candidates for its logprobs, or its penalized argmax). */
static float s_cand_invt (const struct s_req *r)
{
    return s_greedy (&r->g->req.sp) ? 1.f : (float) (1.0 / (double) r->g->samp.temperature);
}

/* A candidate row's second row for its logprobs: 1 (temperature 1) for a
 * row with logprobs sampled at another temperature, else 0. */
static float s_lp_invt (const struct s_req *r)
{
    return r->g->req.sp.logprobs && !s_greedy (&r->g->req.sp) && s_cand_invt (r) != 1.f ? 1.f : 0.f;
}

static int s_forward (rx_sched_t *s, int32_t all_decode, struct rx_err *err)
{
    size_t n_seq = s->batch.n, n_tok = 0, n_slot = 0, n_out = 0;
    for (size_t i = 0; i < n_seq; i++) {
        struct s_req *r = s->batch.v[i];
        n_tok += r->extend;
        n_slot += r->n_kv + r->extend;
    }
    if (rx_grow ((void **) &s->b_tokens, &s->cap_tok, n_tok, sizeof (int32_t)) ||
        rx_grow ((void **) &s->b_slots, &s->cap_slots, n_slot, sizeof (int32_t)))
        return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
    size_t cap_seq;
    /* b_pos follows cap_tok; q/kv/out follow cap_seq */
    int32_t *pos = realloc (s->b_pos, s->cap_tok * sizeof *pos);
    if (pos) s->b_pos = pos;
    if (n_seq + 1 > s->cap_seq) {
        cap_seq = n_seq + 64;
        void **const arr[] = { (void **) &s->b_q, (void **) &s->b_kvs, (void **) &s->b_out,
                               (void **) &s->b_ids, (void **) &s->b_want, (void **) &s->b_invt,
                               (void **) &s->b_crow, (void **) &s->b_more, (void **) &s->b_goff,
                               (void **) &s->b_gn, (void **) &s->b_invt2, (void **) &s->b_lrow };
        const size_t size[] = { sizeof *s->b_q, sizeof *s->b_kvs, sizeof *s->b_out, sizeof *s->b_ids,
                                sizeof *s->b_want, sizeof *s->b_invt, sizeof *s->b_crow, sizeof *s->b_more,
                                sizeof *s->b_goff, sizeof *s->b_gn, sizeof *s->b_invt2, sizeof *s->b_lrow };
        if (s_grow_each (cap_seq, arr, size, sizeof arr / sizeof arr[0]))
            return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
        s->cap_seq = cap_seq;
    }
    if (!pos) return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
    /* s_draw_all's list: sized here, where the step can still fail. */
    if (s->cap_draws < n_seq) {
        struct s_draw *d = realloc (s->draws, n_seq * sizeof *d);
        if (!d) return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
        s->draws = d;
        s->cap_draws = n_seq;
    }
    size_t t = 0, k = 0, n_cand = 0, n_cand2 = 0;
    for (size_t i = 0; i < n_seq; i++) {
        struct s_req *r = s->batch.v[i];
        uint32_t len;
        const int32_t *row = rx_kvpool_rows_get (s->rows, r->row, &len);
        s->b_q[i] = (int32_t) t;
        s->b_kvs[i] = (int32_t) k;
        memcpy (&s->b_slots[k], row, (size_t) (r->n_kv + r->extend) * sizeof (int32_t));
        k += r->n_kv + r->extend;
        for (uint32_t j = 0; j < r->extend; j++) {
            s->b_tokens[t] = r->toks[r->n_kv + j];
            s->b_pos[t] = (int32_t) (r->n_kv + j);
            t++;
        }
        if (r->n_kv + r->extend == r->len) {
            const int cand = s_cand_row (s, r);
            s->b_want[n_out] = (uint8_t) (!cand && s_needs_logits (r));
            s->b_invt[n_out] = cand ? s_cand_invt (r) : 0.f;
            s->b_crow[n_out] = cand ? (int32_t) n_cand++ : -1;
            /* logprobs: the candidate row itself, or a second one at
             * temperature 1 (numbered after every first row, below) */
            s->b_invt2[n_out] = cand ? s_lp_invt (r) : 0.f;
            s->b_lrow[n_out] = !cand || !r->g->req.sp.logprobs ? -1
                               : s->b_invt2[n_out] > 0 ? -2 - (int32_t) n_cand2++ : s->b_crow[n_out];
            s->b_out[n_out++] = (int32_t) t - 1;
        }
    }
    for (size_t j = 0; j < n_out; j++)
        if (s->b_lrow[j] <= -2) s->b_lrow[j] = (int32_t) n_cand + (-2 - s->b_lrow[j]);
    n_cand += n_cand2;
    s->b_q[n_seq] = (int32_t) t;
    s->b_kvs[n_seq] = (int32_t) k;
    if (rx_grow ((void **) &s->logits, &s->cap_logits, n_out * (size_t) s->n_vocab + 1, sizeof (float)))
        return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
    const size_t n_c = n_cand * (size_t) s->k_cand + 1;
    if (n_c > s->cap_c) {
        float *cp = realloc (s->c_probs, n_c * sizeof *cp);
        if (cp) s->c_probs = cp;
        int32_t *ci = realloc (s->c_ids, n_c * sizeof *ci);
        if (ci) s->c_ids = ci;
        if (!cp || !ci) return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
        s->cap_c = n_c;
    }
    struct rx_model_batch b = {
        .struct_size = sizeof b,
        .n_tokens = (int32_t) n_tok,
        .tokens = s->b_tokens,
        .pos = s->b_pos,
        .n_seq = (int32_t) n_seq,
        .q_start = s->b_q,
        .kv_start = s->b_kvs,
        .kv_slots = s->b_slots,
        .n_out = (int32_t) n_out,
        .out_rows = s->b_out,
        .logits = NULL,
        .all_decode = all_decode,
    };
    const struct rx_engine_cands c = { .k = s->k_cand, .inv_t = s->b_invt,
                                       .probs = s->c_probs, .ids = s->c_ids,
                                       .inv_t2 = n_cand2 ? s->b_invt2 : NULL };
    return rx_engine_forward_sample (s->engine, &b, n_out ? s->logits : NULL, s->b_want, s->b_ids,
                                     n_cand ? &c : NULL, err);
}

static int s_is_stop_id (const struct rx_sampling_params *sp, int32_t t)
{
    for (uint32_t i = 0; i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] == t) return 1;
    return 0;
}

/* Whether r's row this step is sampled on the host (not its max_tokens
 * reached already, not a plain greedy row: the device argmax is its
 * token), and with which ban (min_tokens not reached yet). */
static int s_host_draw (const struct s_req *r, int *ban)
{
    uint32_t n_out = r->len - r->n_in;
    if ((int64_t) n_out >= r->g->max_new) return 0;
    *ban = (int64_t) n_out < r->g->req.sp.min_tokens;
    return !(r->g->plain_greedy && !*ban);
}

/* r's next token from its raw logits row on the host: penalties, the
 * min_tokens ban, then the sampler, with w's scratch (any thread's: a row
 * depends only on its own request, generator state included).  tail: the
 * row's device candidates (n_tail ids) when its draw fell past them
 * (RX_CANDS_TAIL): they are banned and the rest of the row drawn from. */
static int32_t s_draw_row (const rx_sched_t *s, struct s_req *r, const float *raw, int ban,
                           const int32_t *tail, int32_t n_tail, struct rx_sample_scratch *w)
{
    const struct rx_sampling_params *sp = &r->g->req.sp;
    const int32_t V = s->n_vocab;
    float *row = w->row_buf;
    memcpy (row, raw, (size_t) V * sizeof *row);
    rx_penalties_apply (row, V, &r->g->pen, r->toks, r->n_in, r->toks + r->n_in, r->len - r->n_in,
                        w->pen_counts);
    if (ban) {
        if (s->o.eos_id >= 0) rx_logits_ban (row, V, &s->o.eos_id, 1);
        rx_logits_ban (row, V, sp->stop_ids, sp->n_stop_ids);
    }
    if (tail) {
        rx_logits_ban (row, V, tail, (size_t) n_tail);
        const int32_t a = rx_argmax (row, V);
        if (!isfinite (row[a])) return tail[0];   /* nothing past them after all (rounding) */
    }
    return rx_sampler_sample_with (w->sampler, &r->g->samp, &r->rng, row);
}

static void s_draw_one (void *ctx, size_t i, struct rx_sample_scratch *w)
{
    const rx_sched_t *s = ctx;
    struct s_draw *d = &s->draws[i];
    d->r->drawn = s_draw_row (s, d->r, d->raw, d->ban, d->tail, d->n_tail, w);
    d->r->has_drawn = 1;
}

/* r's logprobs for token tok from its candidate row c (temperature 1);
 * -1 when they need the whole row (rx_logprobs_cands). */
static int s_lp_cands (const rx_sched_t *s, const struct s_req *r, int32_t c, int32_t tok, float *lp,
                       int32_t *top_ids, float *top_lp)
{
    const size_t K = (size_t) s->k_cand;
    return rx_logprobs_cands (s->c_probs + (size_t) c * K, s->c_ids + (size_t) c * K, s->k_cand, tok,
                              (int32_t) r->g->req.sp.top_logprobs, lp, top_ids, top_lp);
}

/* ------------------------------------------ penalized candidate rows --
 * Penalties (frequency / presence / repetition) change the logits of the
 * tokens they touch: the output's, with a repetition penalty the prompt's
 * too -- a few, against the vocabulary.  A penalized row still takes the
 * device's candidates of its unpenalized row (at its temperature), and
 * after the forward the raw logits of the candidates and of every touched
 * token are gathered on the device (rx_engine_logits_gather, one call a
 * step).  Here rx_penalties_apply penalizes them exactly as the whole-row
 * path would, and rx_cands_penalized (core/sampling.h) turns them into the
 * head of the penalized row's order with its probabilities, which
 * rx_sampler_sample_cands draws from as from any candidates (past them:
 * the whole row with those ids banned); a greedy row takes the first.
 * rx_cands_penalized's -1 (bad numbers, the mass nearly all penalized
 * away) reads the whole row.  A min_tokens ban is one more correction of
 * the same kind: EOS and the stop ids gathered and set to -inf. */

/* Room for n entries in every g_ array. */
static int s_pen_room_g (rx_sched_t *s, size_t n)
{
    if (n <= s->cap_g) return 0;
    size_t cap = s->cap_g ? s->cap_g : 1024;
    while (cap < n) cap *= 2;
    void **const arr[] = { (void **) &s->g_idx, (void **) &s->g_tok, (void **) &s->g_mid, (void **) &s->g_val,
                           (void **) &s->g_p, (void **) &s->g_sort };
    const size_t size[] = { sizeof *s->g_idx, sizeof *s->g_tok, sizeof *s->g_mid, sizeof *s->g_val,
                            sizeof *s->g_p, sizeof *s->g_sort };
    if (s_grow_each (cap, arr, size, sizeof arr / sizeof arr[0])) return -1;
    s->cap_g = cap;
    return 0;
}

/* Gathers the raw logits of every corrected candidate row of the step
 * (penalties, a min_tokens ban): its k candidates first (in their order),
 * then each token its penalties or ban touch that is not one of them.
 * b_gn[j] = 0: none (the row is fetched whole if it is drawn). */
static int s_pen_gather (rx_sched_t *s, struct rx_err *err)
{
    const size_t V = (size_t) s->n_vocab, K = (size_t) s->k_cand;
    uint32_t *mark = rx_sample_pool_scratch (s->spool)->pen_counts;   /* zeroed, left zeroed */
    size_t ng = 0, k = 0;
    for (size_t i = 0; i < s->batch.n; i++) {
        struct s_req *r = s->batch.v[i];
        if (r->n_kv + r->extend < r->len) continue;
        const size_t j = k++;
        s->b_gn[j] = 0;
        if (s->b_crow[j] < 0 || !s_corrected (r) || (j + 1) * V > (size_t) INT32_MAX) continue;
        const int rep = r->g->pen.repetition != 1 && r->g->pen.repetition > 0;
        const uint32_t from = !s_penalized (r) ? r->len : rep ? 0 : r->n_in;
        const struct rx_sampling_params *sp = &r->g->req.sp;
        const size_t n_ban = s_banned (r) ? 1 + sp->n_stop_ids : 0;
        if (s_pen_room_g (s, ng + K + (r->len - from) + n_ban))
            return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
        int32_t *tok = s->g_tok + ng;
        const int32_t *cid = s->c_ids + (size_t) s->b_crow[j] * K;
        size_t m = 0;
        int bad = 0;
        for (size_t q = 0; q < K; q++) {
            if (cid[q] < 0 || (size_t) cid[q] >= V || mark[cid[q]]) bad = 1;   /* not the device's topk */
            if (bad) break;
            mark[cid[q]] = 1;
            tok[m++] = cid[q];
        }
        for (size_t q = from; q < r->len + n_ban && !bad; q++) {
            const int32_t t = q < r->len ? r->toks[q] : q == r->len ? s->o.eos_id : sp->stop_ids[q - r->len - 1];
            if (t < 0 || (size_t) t >= V || mark[t]) continue;
            mark[t] = 1;
            tok[m++] = t;
        }
        for (size_t q = 0; q < m; q++) {
            mark[tok[q]] = 0;
            s->g_idx[ng + q] = (int32_t) (j * V + (size_t) tok[q]);
        }
        if (bad) continue;
        s->b_goff[j] = (int32_t) ng;
        s->b_gn[j] = (int32_t) m;
        ng += m;
    }
    return rx_engine_logits_gather (s->engine, s->g_idx, ng, s->g_val, err);
}

/* Penalized candidate row j (candidate row c): its token, or
 * RX_CANDS_FULL / RX_CANDS_TAIL as rx_sampler_sample_cands; the merged
 * candidates are left at g_mid + b_goff[j] (*n_m of them) for a tail
 * draw. */
static int32_t s_pen_draw (rx_sched_t *s, struct s_req *r, size_t j, int32_t c, int32_t *n_m)
{
    *n_m = 0;
    const int32_t m = s->b_gn[j], K = s->k_cand;
    if (m < K) return RX_CANDS_FULL;   /* not gathered */
    const size_t off = (size_t) s->b_goff[j];
    const int32_t *tok = s->g_tok + off;
    const float *lv = s->g_val + off;
    const float p1 = s->c_probs[(size_t) c * (size_t) K];
    struct rx_sample_scratch *w = rx_sample_pool_scratch (s->spool);
    float *row = w->row_buf;   /* only the gathered entries are read */
    for (int32_t q = 0; q < m; q++) row[tok[q]] = lv[q];
    rx_penalties_apply (row, s->n_vocab, &r->g->pen, r->toks, r->n_in, r->toks + r->n_in, r->len - r->n_in,
                        w->pen_counts);
    if (s_banned (r)) {   /* as s_draw_row: EOS and the stop ids to -inf */
        if (s->o.eos_id >= 0) rx_logits_ban (row, s->n_vocab, &s->o.eos_id, 1);
        rx_logits_ban (row, s->n_vocab, r->g->req.sp.stop_ids, r->g->req.sp.n_stop_ids);
    }
    /* the penalized logits, in g_p for now */
    float *lp = s->g_p + off;
    for (int32_t q = 0; q < m; q++) lp[q] = row[tok[q]];
    const int greedy = s_greedy (&r->g->req.sp);
    int32_t *mid = s->g_mid + off;
    const int32_t nh = rx_cands_penalized (tok, lv, lp, m, K, p1, greedy ? 1.f : r->g->samp.temperature, mid, lp,
                                           s->g_sort + off);
    if (nh <= 0) return RX_CANDS_FULL;
    *n_m = nh;
    if (greedy) return mid[0];
    return rx_sampler_sample_cands (&r->g->samp, &r->rng, lp, mid, nh, s->n_vocab);
}

/* Draw every sampled row of the batch (the rows the walk in rx_sched_step
 * reaches, in its order of logits rows): a candidate row from its device
 * candidates here, on this thread (k_cand values each); the rest, and the
 * candidate rows whose cut or draw fell past their candidates (their
 * rows fetched now, in one pass), on the pool.  s_forward sized the list. */
static int s_draw_all (rx_sched_t *s, struct rx_err *err)
{
    size_t n = 0, k = 0, n_more = 0;
    const size_t V = (size_t) s->n_vocab, K = (size_t) s->k_cand;
    if (s->pen_cand) {
        int rc = s_pen_gather (s, err);
        if (rc != RX_OK) return rc;
    }
    for (size_t i = 0; i < s->batch.n; i++) {
        struct s_req *r = s->batch.v[i];
        r->has_drawn = 0;
        if (r->n_kv + r->extend < r->len) continue;   /* mid-prompt: no row */
        const size_t j = k++;
        const float *raw = s->logits + j * V;
        int ban = 0;
        s->b_more[j] = 0;
        const int32_t c = s->b_crow[j], lc = s->b_lrow[j];
        const int lp = lc >= 0;   /* logprobs from candidate row lc */
        if (lp) s->st_cand_lp_rows++;
        if (!s_host_draw (r, &ban)) {
            /* a greedy row with logprobs: its token is the device argmax */
            if (lp && s_lp_cands (s, r, lc, s->b_ids[j], NULL, NULL, NULL)) {
                s->b_more[j] = 1;
                n_more++;
                s->st_cand_lp_full++;
            }
            continue;
        }
        if (c < 0) {
            s->draws[n++] = (struct s_draw) { r, raw, ban, NULL, 0 };
            continue;
        }
        const int32_t *ids = s->c_ids + (size_t) c * K;
        int32_t n_ids = (int32_t) K;
        int32_t tok;
        if (s_corrected (r)) {   /* its candidates corrected for its penalties or ban */
            tok = s_pen_draw (s, r, j, c, &n_ids);
            if (tok == RX_CANDS_TAIL) ids = s->g_mid + s->b_goff[j];
        } else {
            tok = rx_sampler_sample_cands (&r->g->samp, &r->rng, s->c_probs + (size_t) c * K, ids, n_ids,
                                           s->n_vocab);
        }
        s->st_cand_rows++;
        if (tok >= 0) {
            r->drawn = tok;
            r->has_drawn = 1;
            /* its logprobs need the row after all (s_sample reads it) */
            if (lp && s_lp_cands (s, r, lc, tok, NULL, NULL, NULL)) {
                s->b_more[j] = 1;
                n_more++;
                s->st_cand_lp_full++;
            }
            continue;
        }
        s->b_more[j] = 1;
        n_more++;
        if (lp) s->st_cand_lp_full++;
        if (tok == RX_CANDS_TAIL) s->st_cand_tail++;
        else s->st_cand_full++;
        s->draws[n++] = (struct s_draw) { r, raw, ban, tok == RX_CANDS_TAIL ? ids : NULL, n_ids };
    }
    if (n_more) {
        int rc = rx_engine_logits_rows (s->engine, s->logits, (int32_t) k, s->b_more, err);
        if (rc != RX_OK) return rc;
    }
    rx_sample_pool_run (s->spool, n, s_draw_one, s);
    return RX_OK;
}

/* Sample r's next token from its raw logits row (copied to the host only
 * when s_needs_logits said so; else dev_argmax, the device's argmax of the
 * row, is the token; a host-sampled row was drawn by s_draw_all), emit it,
 * check finish.  crow >= 0: the row stayed on the device and its logprobs
 * come from candidate row crow (s_draw_all checked that they can).  Returns 1
 * when the request finished. */
static int s_sample (rx_sched_t *s, struct s_req *r, const float *raw, int32_t dev_argmax, int32_t crow)
{
    const struct rx_sampling_params *sp = &r->g->req.sp;
    const int32_t V = s->n_vocab;
    uint32_t n_out = r->len - r->n_in;
    if ((int64_t) n_out >= r->g->max_new) {   /* max_tokens 0 */
        r->finish = RX_FINISH_LENGTH;
        struct rx_ipc_tok_out *t = s_emit (s, r);
        if (t) t->finish = RX_FINISH_LENGTH;
        return 1;
    }
    int ban = 0;
    int32_t tok;
    if (!s_host_draw (r, &ban)) {
        tok = dev_argmax;   /* = rx_argmax (raw, V), computed on the device (s_needs_logits) */
    } else if (r->has_drawn) {
        tok = r->drawn;
    } else {   /* not expected: s_draw_all draws every host row */
        tok = s_draw_row (s, r, raw, ban, NULL, 0, rx_sample_pool_scratch (s->spool));
    }
    r->has_drawn = 0;
    if (s_push_token (r, tok)) {
        r->finish = RX_FINISH_ABORT;
        struct rx_ipc_tok_out *t = s_emit (s, r);
        if (t) t->finish = RX_FINISH_ABORT;
        return 1;
    }
    s->st_gen++;
    struct rx_ipc_tok_out *t = s_emit (s, r);
    if (!t) return 0;   /* out of memory for the output: the token stays (reported next time) */
    size_t i = (size_t) (t - s->ent);
    t->n_ids = 1;
    s->ent_ids[i] = tok;
    if (sp->logprobs) {
        t->has_logprobs = 1;
        t->lp.n_top = (uint32_t) sp->top_logprobs;
        int32_t *top_ids = &s->ent_top_ids[i * RX_MAX_TOP_LOGPROBS];
        float *top_lp = &s->ent_top_lp[i * RX_MAX_TOP_LOGPROBS];
        if (crow < 0) s->ent_lp[i] = rx_logprobs (raw, V, tok, sp->top_logprobs, top_ids, top_lp);
        else if (s_lp_cands (s, r, crow, tok, &s->ent_lp[i], top_ids, top_lp)) {
            /* not expected: s_draw_all checked the same candidates */
            rx_log (RX_LOG_ERROR, "scheduler: request %llu: no logprobs from its candidates",
                    (unsigned long long) r->g->req.rid);
            s->ent_lp[i] = -INFINITY;
            for (int32_t j = 0; j < sp->top_logprobs; j++) {
                top_ids[j] = -1;
                top_lp[j] = -INFINITY;
            }
        }
    }
    n_out++;
    if (!sp->ignore_eos && s->o.eos_id >= 0 && tok == s->o.eos_id) {
        r->finish = RX_FINISH_EOS;
        r->matched = tok;
    } else if (s_is_stop_id (sp, tok)) {
        r->finish = RX_FINISH_STOP_ID;
        r->matched = tok;
    } else if ((int64_t) n_out >= r->g->max_new) {
        r->finish = RX_FINISH_LENGTH;
    }
    t->finish = r->finish;
    t->matched = r->finish == RX_FINISH_LENGTH ? -1 : r->matched;
    return r->finish != RX_FINISH_NONE;
}

/* ------------------------------------------------------------- step -- */

/* FNV-1a over what the forward pass is about to run: the kind, and per
 * sequence its request, sibling, new tokens, KV length and last token. */
static uint64_t s_batch_hash (const rx_sched_t *s, int kind)
{
    uint64_t h = 14695981039346656037ull;
    uint64_t v[6];
    for (size_t i = 0; i <= s->batch.n; i++) {
        if (i == s->batch.n) {
            v[0] = (uint64_t) kind;
            v[1] = s->batch.n;
            v[2] = v[3] = v[4] = v[5] = 0;
        } else {
            const struct s_req *r = s->batch.v[i];
            v[0] = r->rid;
            v[1] = r->index;
            v[2] = r->extend;
            v[3] = r->n_kv;
            v[4] = r->len;
            v[5] = r->len ? (uint64_t) (uint32_t) r->toks[r->len - 1] : 0;
        }
        const uint8_t *b = (const uint8_t *) v;
        for (size_t k = 0; k < sizeof v; k++) h = (h ^ b[k]) * 1099511628211ull;
    }
    return h;
}

void rx_sched_set_batch_hook (rx_sched_t *s, rx_sched_batch_hook fn, void *ud)
{
    if (!s) return;
    s->batch_hook = fn;
    s->batch_hook_ud = ud;
}

int rx_sched_step (rx_sched_t *s, struct rx_sched_out *out, struct rx_err *err)
{
    memset (out, 0, sizeof *out);
    if (!s) return rx_err_set (err, RX_EINVAL, "scheduler: step: NULL scheduler");
    for (size_t i = 0; i < s->to_free.n; i++) s_req_free (s, s->to_free.v[i]);
    s->to_free.n = 0;
    s->n_ent = 0;
    for (size_t i = 0; i < s->zombies.n; i++) {
        struct s_req *r = s->zombies.v[i];
        struct rx_ipc_tok_out *t = s_emit (s, r);
        if (t) t->finish = RX_FINISH_ABORT;
        s_list_push (&s->to_free, r);
        s->st_finished++;
    }
    s->zombies.n = 0;
    s->step++;
    rx_radix_cache_tick (s->cache);

    int rc = s_form_prefill (s, err);
    if (rc) goto done;
    if (s->batch.n)
        out->kind = RX_SCHED_PREFILL;
    else {
        s_form_decode (s, out);
        if (s->batch.n) out->kind = RX_SCHED_DECODE;
    }
    if (!s->batch.n) goto done;
    out->n_seq = (int32_t) s->batch.n;
    for (size_t i = 0; i < s->batch.n; i++) out->n_tokens += (int32_t) s->batch.v[i]->extend;

    out->all_decode = out->kind == RX_SCHED_DECODE && s->group_decode;
    rc = s->batch_hook ? s->batch_hook (s->batch_hook_ud, s->step, s_batch_hash (s, out->kind), err) : RX_OK;
    if (rc == RX_OK) rc = s_forward (s, out->all_decode, err);
    if (rc == RX_OK) rc = s_draw_all (s, err);
    if (rc) {
        /* The batch cannot run: abort its requests (one clear error up). */
        for (size_t i = 0; i < s->batch.n; i++) {
            struct s_req *r = s->batch.v[i];
            if (r == s->chunked) s->chunked = NULL;
            s_list_remove (&s->running, r);
            s_release (s, r, 0);
            r->finish = RX_FINISH_ABORT;
            struct rx_ipc_tok_out *t = s_emit (s, r);
            if (t) t->finish = RX_FINISH_ABORT;
            s_retire (s, r);
        }
        goto done;
    }
    int prefill = out->kind == RX_SCHED_PREFILL;
    if (prefill) s->chunked = NULL;
    size_t k = 0;
    for (size_t i = 0; i < s->batch.n; i++) {
        struct s_req *r = s->batch.v[i];
        r->n_kv += r->extend;
        if (prefill) s->st_computed += r->extend;
        if (r->n_kv < r->len) {   /* mid-prompt: keep the computed part cached */
            s->chunked = r;
            s_cache_unfinished (s, r);
            continue;
        }
        const float *row = s->logits + k * (size_t) s->n_vocab;
        const int32_t crow = s->b_lrow[k] >= 0 && !s->b_more[k] ? s->b_lrow[k] : -1;
        const int32_t id = s->b_ids[k++];
        if (s_sample (s, r, row, id, crow)) {
            s_list_remove (&s->running, r);
            s_release (s, r, 1);
            s_retire (s, r);
        } else if (prefill) {
            s_cache_unfinished (s, r);
            s_list_push (&s->running, r);
        }
    }
done:
    s_finalize_out (s, out);
    s->batch.n = 0;
    return rc;
}

int rx_sched_idle (const rx_sched_t *s)
{
    return !s->waiting.n && !s->running.n && !s->chunked && !s->zombies.n;
}

int rx_sched_may_prefill (const rx_sched_t *s)
{
    /* s_form_prefill forms a batch only from the chunked request or a
     * waiting one; retraction (in decode) refills waiting after that. */
    return s && (s->waiting.n > 0 || s->chunked);
}

void rx_sched_set_group_decode (rx_sched_t *s, int all_decode)
{
    if (s) s->group_decode = all_decode ? 1 : 0;
}

int rx_sched_flush_cache (rx_sched_t *s, size_t *freed, struct rx_err *err)
{
    if (freed) *freed = 0;
    if (!rx_sched_idle (s))
        return rx_err_set (err, RX_EAGAIN, "scheduler: cannot flush the cache: requests are running");
    size_t n = rx_radix_cache_flush (s->cache, NULL);
    if (freed) *freed = n;
    return RX_OK;
}

void rx_sched_stats (rx_sched_t *s, struct rx_sched_stats *st)
{
    memset (st, 0, sizeof *st);
    st->running = (uint32_t) s->running.n + (s->chunked ? 1 : 0);
    st->queued = (uint32_t) s->waiting.n;
    st->kv_used = rx_kvpool_used (s->pool);
    st->kv_total = rx_kvpool_capacity (s->pool);
    st->kv_free = rx_kvpool_available (s->pool);
    st->cache_tokens = rx_radix_cache_total_size (s->cache);
    st->cache_evictable = rx_radix_cache_evictable_size (s->cache);
    st->cache_protected = rx_radix_cache_protected_size (s->cache);
    st->steps = s->step;
    st->prompt_tokens = s->st_prompt;
    st->cached_tokens = s->st_cached;
    st->computed_tokens = s->st_computed;
    st->gen_tokens = s->st_gen;
    st->cand_rows = s->st_cand_rows;
    st->cand_full = s->st_cand_full;
    st->cand_lp_rows = s->st_cand_lp_rows;
    st->cand_lp_full = s->st_cand_lp_full;
    st->cand_tail = s->st_cand_tail;
    st->retractions = s->st_retract;
    st->finished = s->st_finished;
    st->new_token_ratio = s->new_token_ratio;
    st->max_running_requests = (uint32_t) s->o.max_running_requests;
    st->context_len = (uint32_t) s->ctx;
    st->cache_hit_rate = s->st_prompt ? (double) s->st_cached / (double) s->st_prompt : 0;
    double now = s_now (), dt = now - s->st_last_time;
    if (dt > 0) {
        st->prompt_tps = (double) (s->st_computed - s->st_last_prompt) / dt;
        st->gen_tps = (double) (s->st_gen - s->st_last_gen) / dt;
    }
    s->st_last_time = now;
    s->st_last_prompt = s->st_computed;
    s->st_last_gen = s->st_gen;
}

struct rx_radix_cache *rx_sched_cache (rx_sched_t *s) { return s->cache; }
struct rx_kvpool *rx_sched_pool (rx_sched_t *s) { return s->pool; }

/* ------------------------------------------------------------- check -- */

struct s_chk {
    uint8_t *own;     /* per slot: how many owners */
    uint32_t cap;
    int bad;
};

static int s_chk_node (void *ud, const struct rx_radix_node_info *in)
{
    struct s_chk *c = ud;
    for (size_t i = 0; i < in->len; i++) {
        int32_t sl = in->slots[i];
        if (sl < 0 || (uint32_t) sl >= c->cap) { c->bad = 1; return 1; }
        c->own[sl]++;
    }
    return 0;
}

int rx_sched_check (rx_sched_t *s, struct rx_err *err)
{
    int rc = rx_radix_cache_check (s->cache, err);
    if (rc) return rc;
    struct s_chk c = { .cap = rx_kvpool_capacity (s->pool) };
    c.own = calloc (c.cap, 1);
    if (!c.own) return rx_err_set (err, RX_ENOMEM, "scheduler: out of memory");
    rx_radix_cache_visit (s->cache, s_chk_node, &c);
    rc = RX_OK;
    struct s_req *cur[1] = { s->chunked };
    const struct s_list one = { cur, s->chunked ? 1 : 0, 1 };
    const struct s_list *ls[3] = { &s->running, &one, &s->waiting };
    uint64_t locks = 0;
    for (int l = 0; l < 3 && !rc; l++)
        for (size_t i = 0; i < ls[l]->n && !rc; i++) {
            struct s_req *r = ls[l]->v[i];
            if (r->row < 0) {
                if (r->state == S_RUNNING)
                    rc = rx_err_set (err, RX_EINTERNAL, "scheduler check: running request %llu has no row",
                                     (unsigned long long) r->rid);
                continue;
            }
            uint32_t len;
            const int32_t *row = rx_kvpool_rows_get (s->rows, r->row, &len);
            if (len != r->n_kv || r->n_prefix > r->n_kv) {
                rc = rx_err_set (err, RX_EINTERNAL, "scheduler check: request %llu row length %u, n_kv %u",
                                 (unsigned long long) r->rid, len, r->n_kv);
                break;
            }
            if (r->node) locks++;
            for (uint32_t j = r->n_prefix; j < len; j++) {
                if (row[j] < 0 || (uint32_t) row[j] >= c.cap) { c.bad = 1; break; }
                c.own[row[j]]++;
            }
        }
    for (uint32_t i = 0; i < c.cap && !rc; i++) {
        int alloc = rx_kvpool_is_allocated (s->pool, (int32_t) i);
        /* With pages, a request's last page may have unused slots that are
         * not handed out; every handed-out slot must have exactly one owner. */
        if (c.own[i] > 1 || (alloc && c.own[i] != 1) || (!alloc && c.own[i]))
            rc = rx_err_set (err, RX_EINTERNAL, "scheduler check: slot %u has %u owners (allocated %d)",
                             i, c.own[i], alloc);
    }
    if (!rc && c.bad) rc = rx_err_set (err, RX_EINTERNAL, "scheduler check: slot index out of range");
    if (!rc && !locks && rx_radix_cache_protected_size (s->cache))
        rc = rx_err_set (err, RX_EINTERNAL, "scheduler check: no request holds a lock, yet %zu tokens are protected",
                         rx_radix_cache_protected_size (s->cache));
    free (c.own);
    return rc;
}
