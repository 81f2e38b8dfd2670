/* tests/unit/test_scheduler.c -- the scheduler core (core/scheduler.c) on the
 * real tiny-llama model: outputs of many concurrent requests equal each
 * request run alone through the engine, prefix-cache hits, chunked prefill,
 * retraction under a tiny KV pool, aborts returning the pool and the cache
 * locks, queue limits, n > 1 with seeds, finish rules, logprobs, flush,
 * every schedule policy; plus the sampling extensions (penalties,
 * logprobs, device sampling) and the dfs_weight policy plugin on a
 * synthetic tree.
 *
 * References are computed with a second engine driven directly through
 * rx_engine_forward (one request at a time, whole-prompt prefill then one
 * token per step), never through the scheduler. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <radix/policy.h>

#include "boot.h"
#include "engine.h"
#include "kvpool.h"
#include "loader.h"
#include "radix_cache.h"
#include "sampling.h"
#include "scheduler.h"
#include "../testutil.h"

#define MAXR 64
#define MAXG 600

/* ------------------------------------------------------------ fixture -- */

struct env {
    struct rx_boot boot;
    rx_engine_t *ref;    /* reference runs */
    rx_engine_t *eng;    /* the scheduler's */
    int32_t V;
};

static char *s_model_path (void)
{
    TU_REQUIRE_SHARED ();
    char *dir = tu_path (tu_env ("RADIX_SHARED"), "data/models");
    char *p = tu_path (dir, "tiny-llama.gguf");
    free (dir);
    return p;
}

static void s_env_open (struct env *e)
{
    memset (e, 0, sizeof *e);
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&e->boot, NULL, 0, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_conf_set (e->boot.conf, "kernels", "threads", "1", &err), RX_OK, "%s", err.msg);
    char *m = s_model_path ();
    struct rx_engine_opts o = { .model_path = m, .n_slots = 512, .max_tokens = 512 };
    e->ref = rx_engine_new (&e->boot, &o, &err);
    cr_assert_not_null (e->ref, "%s", err.msg);
    e->eng = rx_engine_new (&e->boot, &o, &err);
    cr_assert_not_null (e->eng, "%s", err.msg);
    free (m);
    e->V = rx_engine_info (e->eng)->n_vocab;
}

static void s_env_close (struct env *e)
{
    rx_engine_destroy (&e->ref);
    rx_engine_destroy (&e->eng);
    rx_boot_close (&e->boot);
}

static struct rx_sched_opts s_opts (struct env *e, const char *policy)
{
    struct rx_sched_opts o;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_sched_opts_from_conf (e->boot.conf, &o, &err), RX_OK);
    o.policy = policy;
    return o;
}

static rx_sched_t *s_sched (struct env *e, const struct rx_sched_opts *o)
{
    struct rx_err err = { 0 };
    rx_sched_t *s = rx_sched_new (&e->boot, e->eng, o, &err);
    cr_assert_not_null (s, "%s", err.msg);
    return s;
}

/* Deterministic pseudo-random prompt tokens (ids 3 .. 31999). */
static uint64_t s_lcg = 1;
static int32_t s_rand_tok (void)
{
    s_lcg = s_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t) (3 + (s_lcg >> 33) % 31997);
}

/* --------------------------------------------------------- reference -- */

/* Run prompt alone on e->ref: logits of every generated step go to
 * logits_out[k] (NULL: not kept); greedy unless samp (then seeded sampling
 * exactly as the scheduler's sampler does it).  Returns tokens generated. */
static int s_reference (struct env *e, const int32_t *prompt, int n_prompt, int n_gen,
                        const struct rx_sampling *samp, int32_t *out, float *logits_out)
{
    struct rx_err err = { 0 };
    int32_t toks[MAXG], pos[MAXG], slots[MAXG];
    float *logits = malloc ((size_t) e->V * sizeof (float));
    rx_sampler_t *sm = NULL;
    if (samp) {
        sm = rx_sampler_new (samp, e->V, &err);
        cr_assert_not_null (sm, "%s", err.msg);
    }
    for (int i = 0; i < MAXG; i++) slots[i] = i;
    int n = n_prompt;
    memcpy (toks, prompt, (size_t) n_prompt * sizeof *toks);
    int done = 0, start = 0;
    while (done < n_gen) {
        int nt = n - start;
        for (int i = 0; i < nt; i++) pos[i] = start + i;
        int32_t q[2] = { 0, nt }, kv[2] = { 0, n }, orow = nt - 1;
        struct rx_model_batch b = { .struct_size = sizeof b, .n_tokens = nt, .tokens = toks + start,
                                    .pos = pos, .n_seq = 1, .q_start = q, .kv_start = kv,
                                    .kv_slots = slots, .n_out = 1, .out_rows = &orow };
        cr_assert_eq (rx_engine_forward (e->ref, &b, logits, &err), RX_OK, "%s", err.msg);
        if (logits_out) memcpy (logits_out + (size_t) done * e->V, logits, (size_t) e->V * sizeof (float));
        int32_t t = sm ? rx_sampler_sample (sm, logits) : rx_argmax (logits, e->V);
        out[done++] = t;
        start = n;
        toks[n++] = t;
    }
    rx_sampler_destroy (&sm);
    free (logits);
    return done;
}

/* ------------------------------------------------------------ driver -- */

struct res {
    uint64_t rid;
    uint32_t index;
    int32_t  ids[MAXG];
    float    lp[MAXG];
    int32_t  top_ids[MAXG][5];
    float    top_lp[MAXG][5];
    int      n;
    int      finish;
    int32_t  matched;
    uint32_t cached, prompt, completion;
    int      n_first;
};

struct run {
    struct res r[MAXR];
    int n;
    int steps, prefill_steps, decode_steps, retracted;
};

static struct res *s_res (struct run *run, uint64_t rid, uint32_t index)
{
    for (int i = 0; i < run->n; i++)
        if (run->r[i].rid == rid && run->r[i].index == index) return &run->r[i];
    cr_assert (run->n < MAXR);
    struct res *r = &run->r[run->n++];
    memset (r, 0, sizeof *r);
    r->rid = rid;
    r->index = index;
    r->matched = -1;
    return r;
}

static void s_collect (struct run *run, const struct rx_sched_out *o)
{
    for (uint32_t i = 0; i < o->tokens.n; i++) {
        const struct rx_ipc_tok_out *t = &o->tokens.out[i];
        struct res *r = s_res (run, t->rid, o->index[i]);
        cr_assert_eq (r->finish, 0, "rid %llu output after its finish", (unsigned long long) t->rid);
        cr_assert (t->n_ids <= 1);
        for (uint32_t k = 0; k < t->n_ids; k++) {
            cr_assert (r->n < MAXG);
            if (t->has_logprobs) {
                r->lp[r->n] = t->lp.logprob[k];
                for (uint32_t j = 0; j < t->lp.n_top && j < 5; j++) {
                    r->top_ids[r->n][j] = t->lp.top_ids[k * t->lp.n_top + j];
                    r->top_lp[r->n][j] = t->lp.top_logprob[k * t->lp.n_top + j];
                }
            }
            r->ids[r->n++] = t->ids[k];
        }
        r->finish = t->finish;
        r->matched = t->matched;
        r->cached = t->usage.cached_tokens;
        r->prompt = t->usage.prompt_tokens;
        r->completion = t->usage.completion_tokens;
        r->n_first += t->first;
        cr_assert_eq ((int) r->completion, r->n, "usage counts the tokens: rid %llu/%u completion %u n %d finish %d", (unsigned long long) t->rid, o->index[i], r->completion, r->n, t->finish);
    }
}

/* Step until idle (bounded), checking the bookkeeping every step. */
static void s_drain (rx_sched_t *s, struct run *run, int max_steps)
{
    struct rx_err err = { 0 };
    for (int k = 0; k < max_steps; k++) {
        if (rx_sched_idle (s)) return;
        struct rx_sched_out o;
        cr_assert_eq (rx_sched_step (s, &o, &err), RX_OK, "%s", err.msg);
        run->steps++;
        run->prefill_steps += o.kind == RX_SCHED_PREFILL;
        run->decode_steps += o.kind == RX_SCHED_DECODE;
        run->retracted += o.n_retracted;
        s_collect (run, &o);
        cr_assert_eq (rx_sched_check (s, &err), RX_OK, "step %d: %s", k, err.msg);
    }
    cr_assert (rx_sched_idle (s), "not idle after %d steps", max_steps);
}

static void s_submit (rx_sched_t *s, uint64_t rid, const int32_t *prompt, int n, int max_tokens,
                      void (*tweak) (struct rx_request *))
{
    struct rx_request r = { 0 };
    rx_sampling_params_init (&r.sp);
    r.rid = rid;
    r.kind = RX_REQ_GENERATE;
    r.input_ids = malloc ((size_t) n * sizeof (int32_t));
    memcpy (r.input_ids, prompt, (size_t) n * sizeof (int32_t));
    r.n_input = (uint32_t) n;
    r.sp.temperature = 0;
    r.sp.max_tokens = max_tokens;
    r.sp.ignore_eos = 1;
    if (tweak) tweak (&r);
    struct rx_err err = { 0 };
    cr_assert_eq (rx_sched_submit (s, &r, &err), RX_OK, "%s", err.msg);
    cr_assert_null (r.input_ids, "ownership taken");
    rx_request_free (&r);
}

/* A workload of prompts with optional shared prefixes. */
struct work {
    int n;
    int32_t prompt[MAXR][200];
    int n_prompt[MAXR];
    int max_tokens[MAXR];
    int32_t ref[MAXR][MAXG];
};

static void s_make_work (struct env *e, struct work *w, int n, uint64_t seed, int shared)
{
    s_lcg = seed;
    w->n = n;
    int32_t pre[3][40];
    for (int g = 0; g < 3; g++)
        for (int j = 0; j < 40; j++) pre[g][j] = s_rand_tok ();
    for (int i = 0; i < n; i++) {
        int len = 5 + (int) (s_rand_tok () % 50);
        int k = 0;
        w->prompt[i][k++] = 1;
        if (shared && i % 4 != 3) {   /* three groups share a 40-token prefix */
            memcpy (&w->prompt[i][k], pre[i % 3], sizeof pre[0]);
            k += 40;
        }
        for (int j = 0; j < len; j++) w->prompt[i][k++] = s_rand_tok ();
        w->n_prompt[i] = k;
        w->max_tokens[i] = 4 + (int) (s_rand_tok () % 16);
        s_reference (e, w->prompt[i], k, w->max_tokens[i], NULL, w->ref[i], NULL);
    }
}

static void s_submit_work (rx_sched_t *s, const struct work *w)
{
    for (int i = 0; i < w->n; i++)
        s_submit (s, 100 + (uint64_t) i, w->prompt[i], w->n_prompt[i], w->max_tokens[i], NULL);
}

static void s_check_work (const struct work *w, struct run *run, const char *what)
{
    for (int i = 0; i < w->n; i++) {
        struct res *r = s_res (run, 100 + (uint64_t) i, 0);
        cr_assert_eq (r->finish, RX_FINISH_LENGTH, "%s: request %d finish %d", what, i, r->finish);
        cr_assert_eq (r->n, w->max_tokens[i], "%s: request %d: %d tokens", what, i, r->n);
        cr_assert_eq (r->n_first, 1);
        cr_assert_eq (r->prompt, (uint32_t) w->n_prompt[i]);
        for (int k = 0; k < r->n; k++)
            cr_assert_eq (r->ids[k], w->ref[i][k], "%s: request %d token %d: %d, alone %d", what, i,
                          k, r->ids[k], w->ref[i][k]);
    }
}

/* -------------------------------------------------------------- tests -- */

Test (scheduler, reference_prompts_concurrently_match_llamacpp_and_the_engine_alone)
{
    struct env e;
    s_env_open (&e);
    char path[4096];
    snprintf (path, sizeof path, "%s/data/models/tiny-llama.json", tu_env ("RADIX_SHARED"));
    json_error_t je;
    json_t *root = json_load_file (path, 0, &je);
    cr_assert_not_null (root, "%s", je.text);
    json_t *ps = json_object_get (root, "prompts");
    size_t np = json_array_size (ps);
    cr_assert (np >= 4);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    rx_sched_t *s = s_sched (&e, &o);
    int32_t prompt[4][64], greedy[4][32], alone[4][32];
    int n_prompt[4];
    double gap[4][32];
    for (size_t i = 0; i < 4; i++) {
        json_t *p = json_array_get (ps, i), *a = json_object_get (p, "prompt_ids");
        n_prompt[i] = (int) json_array_size (a);
        for (int j = 0; j < n_prompt[i]; j++) prompt[i][j] = (int32_t) json_integer_value (json_array_get (a, (size_t) j));
        a = json_object_get (p, "greedy_ids");
        for (int j = 0; j < 32; j++) greedy[i][j] = (int32_t) json_integer_value (json_array_get (a, (size_t) j));
        json_t *st = json_object_get (p, "steps");
        for (int j = 0; j < 32; j++)
            gap[i][j] = json_number_value (json_object_get (json_array_get (st, (size_t) (n_prompt[i] - 1 + j)), "top2_gap"));
        s_reference (&e, prompt[i], n_prompt[i], 32, NULL, alone[i], NULL);
        s_submit (s, 10 + i, prompt[i], n_prompt[i], 32, NULL);
    }
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 400);
    for (int i = 0; i < 4; i++) {
        struct res *r = s_res (run, 10 + (uint64_t) i, 0);
        cr_assert_eq (r->n, 32);
        for (int k = 0; k < 32; k++) cr_assert_eq (r->ids[k], alone[i][k], "prompt %d token %d", i, k);
        /* llama.cpp's tokens up to the first near-tie (as test_models_ref) */
        for (int k = 0; k < 32; k++) {
            if (gap[i][k] < 2e-3) break;
            cr_assert_eq (r->ids[k], greedy[i][k], "prompt %d token %d vs llama.cpp", i, k);
        }
    }
    json_decref (root);
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, many_concurrent_requests_equal_each_run_alone)
{
    struct env e;
    s_env_open (&e);
    struct work *w = calloc (1, sizeof *w);
    s_make_work (&e, w, 24, 7, 0);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.max_running_requests = 8;
    o.max_prefill_tokens = 128;
    rx_sched_t *s = s_sched (&e, &o);
    s_submit_work (s, w);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 2000);
    s_check_work (w, run, "fcfs");
    cr_assert (run->prefill_steps > 1 && run->decode_steps > 1);
    struct rx_sched_stats st;
    rx_sched_stats (s, &st);
    cr_assert_eq (st.running, 0);
    cr_assert_eq (st.queued, 0);
    cr_assert_eq (st.kv_used, st.cache_tokens, "only the cache holds slots when idle");
    cr_assert_eq (st.cache_protected, 0);
    cr_assert_eq (st.finished, 24);
    free (run);
    free (w);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

static void s_shared_prefix (uint32_t page_size)
{
    struct env e;
    s_env_open (&e);
    struct work *w = calloc (1, sizeof *w);
    s_make_work (&e, w, 12, 11, 1);
    struct rx_sched_opts o = s_opts (&e, "lpm");
    o.page_size = page_size;
    rx_sched_t *s = s_sched (&e, &o);
    struct run *run = calloc (1, sizeof *run);
    /* Prime one request of each group, then the rest. */
    for (int i = 0; i < 3; i++) s_submit (s, 100 + (uint64_t) i, w->prompt[i], w->n_prompt[i], w->max_tokens[i], NULL);
    s_drain (s, run, 500);
    for (int i = 3; i < w->n; i++) s_submit (s, 100 + (uint64_t) i, w->prompt[i], w->n_prompt[i], w->max_tokens[i], NULL);
    s_drain (s, run, 1000);
    s_check_work (w, run, "shared prefix");
    for (int i = 3; i < w->n; i++) {
        struct res *r = s_res (run, 100 + (uint64_t) i, 0);
        if (i % 4 != 3)
            cr_assert (r->cached >= 40 / page_size * page_size, "request %d cached %u", i, r->cached);
        cr_assert_eq (r->cached % page_size, 0);
    }
    struct rx_sched_stats st;
    rx_sched_stats (s, &st);
    cr_assert (st.cached_tokens > 0 && st.cache_hit_rate > 0);
    free (run);
    free (w);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, shared_prefixes_hit_the_cache_and_give_the_same_tokens) { s_shared_prefix (1); }
Test (scheduler, shared_prefixes_with_pages_of_4) { s_shared_prefix (4); }

/* A burst of requests with one new 64-token system prompt: the first step
 * prefills only one of them (the others would compute the same 64 tokens);
 * the next step prefills the rest from the cache, and every output equals
 * the request run alone. */
Test (scheduler, a_burst_with_a_new_common_prefix_computes_it_once)
{
    struct env e;
    s_env_open (&e);
    struct work *w = calloc (1, sizeof *w);
    s_lcg = 21;
    w->n = 4;
    int32_t sys[64];
    for (int k = 0; k < 64; k++) sys[k] = s_rand_tok ();
    for (int i = 0; i < w->n; i++) {
        /* prompt = the common 64 tokens ++ request i's own 16 */
        memcpy (w->prompt[i], sys, sizeof sys);
        for (int k = 64; k < 80; k++) w->prompt[i][k] = s_rand_tok ();
        w->n_prompt[i] = 80;
        w->max_tokens[i] = 4;
        s_reference (&e, w->prompt[i], 80, 4, NULL, w->ref[i], NULL);
    }
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    rx_sched_t *s = s_sched (&e, &o);
    struct run *run = calloc (1, sizeof *run);
    for (int i = 0; i < w->n; i++) s_submit (s, 100 + (uint64_t) i, w->prompt[i], 80, 4, NULL);
    struct rx_sched_out out;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (out.kind, RX_SCHED_PREFILL);
    cr_assert_eq (out.n_seq, 1, "the first prefill takes one request of the burst, not %d", out.n_seq);
    cr_assert_eq (out.n_tokens, 80);
    s_collect (run, &out);
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (out.kind, RX_SCHED_PREFILL);
    cr_assert_eq (out.n_seq, 3, "the rest come together");
    cr_assert_eq (out.n_tokens, 3 * 16, "... and compute only their own 16 tokens each");
    s_collect (run, &out);
    s_drain (s, run, 200);
    s_check_work (w, run, "burst with a common prefix");
    for (int i = 1; i < w->n; i++)
        cr_assert_geq (s_res (run, 100 + (uint64_t) i, 0)->cached, 64, "request %d", i);
    free (run);
    free (w);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, chunked_prefill_gives_the_same_tokens_as_unchunked)
{
    struct env e;
    s_env_open (&e);
    s_lcg = 99;
    int32_t prompt[300], ref[16];
    prompt[0] = 1;
    for (int i = 1; i < 300; i++) prompt[i] = s_rand_tok ();
    s_reference (&e, prompt, 300, 16, NULL, ref, NULL);
    for (int chunked = 0; chunked < 2; chunked++) {
        struct rx_sched_opts o = s_opts (&e, "fcfs");
        o.chunked_prefill_size = chunked ? 64 : -1;
        o.radix_cache = 0;
        rx_sched_t *s = s_sched (&e, &o);
        s_submit (s, 1, prompt, 300, 16, NULL);
        s_lcg = 5;
        int32_t p2[20];
        for (int i = 0; i < 20; i++) p2[i] = s_rand_tok ();
        s_submit (s, 2, p2, 20, 8, NULL);
        struct run *run = calloc (1, sizeof *run);
        s_drain (s, run, 200);
        struct res *r = s_res (run, 1, 0);
        cr_assert_eq (r->n, 16);
        for (int k = 0; k < 16; k++) cr_assert_eq (r->ids[k], ref[k], "chunked %d token %d", chunked, k);
        cr_assert_eq (s_res (run, 2, 0)->n, 8);
        if (chunked)
            cr_assert (run->prefill_steps >= 5, "300 tokens in chunks of 64: %d prefill steps", run->prefill_steps);
        else
            cr_assert (run->prefill_steps <= 2);
        free (run);
        rx_sched_destroy (&s);
    }
    s_env_close (&e);
}

Test (scheduler, a_tiny_pool_forces_retraction_and_every_request_still_matches)
{
    struct env e;
    s_env_open (&e);
    struct work *w = calloc (1, sizeof *w);
    s_lcg = 3;
    w->n = 8;
    for (int i = 0; i < w->n; i++) {
        w->n_prompt[i] = 20;
        w->prompt[i][0] = 1;
        for (int j = 1; j < 20; j++) w->prompt[i][j] = s_rand_tok ();
        w->max_tokens[i] = 40;
        s_reference (&e, w->prompt[i], 20, 40, NULL, w->ref[i], NULL);
    }
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.n_slots = 128;
    o.schedule_conservativeness = 0.01;   /* admit optimistically: decode must retract */
    rx_sched_t *s = s_sched (&e, &o);
    s_submit_work (s, w);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 3000);
    s_check_work (w, run, "retraction");
    struct rx_sched_stats st;
    rx_sched_stats (s, &st);
    cr_assert (run->retracted > 0 && st.retractions > 0, "no retraction happened");
    cr_assert (st.new_token_ratio > 0.007, "retraction raised the ratio (%g)", st.new_token_ratio);
    cr_assert_eq (st.kv_total, 128);
    free (run);
    free (w);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

static void s_snap (rx_sched_t *s, struct rx_sched_stats *st) { rx_sched_stats (s, st); }

Test (scheduler, aborts_return_the_pool_and_the_locks)
{
    struct env e;
    s_env_open (&e);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.max_running_requests = 1;
    rx_sched_t *s = s_sched (&e, &o);
    struct run *run = calloc (1, sizeof *run);
    s_lcg = 21;
    int32_t p[30], q[25];
    for (int i = 0; i < 30; i++) p[i] = s_rand_tok ();
    for (int i = 0; i < 25; i++) q[i] = s_rand_tok ();
    /* Prime the cache with p, so that a re-run of p changes nothing. */
    s_submit (s, 1, p, 30, 5, NULL);
    s_drain (s, run, 100);
    struct rx_sched_stats b0, b1;
    s_snap (s, &b0);
    cr_assert (b0.cache_tokens >= 30);
    /* A running p and a waiting q (max_running_requests = 1). */
    s_submit (s, 2, p, 30, 100, NULL);
    s_submit (s, 3, q, 25, 100, NULL);
    struct rx_err err = { 0 };
    struct rx_sched_out out;
    for (int k = 0; k < 4; k++) {
        cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
        s_collect (run, &out);
    }
    s_snap (s, &b1);
    cr_assert_eq (b1.running, 1);
    cr_assert_eq (b1.queued, 1);
    cr_assert (b1.cache_protected > 0);
    cr_assert_eq (rx_sched_abort (s, 3), 1);   /* waiting */
    cr_assert_eq (rx_sched_abort (s, 2), 1);   /* running */
    cr_assert_eq (rx_sched_abort (s, 2), 0);
    cr_assert_eq (rx_sched_abort (s, 777), 0);
    struct rx_sched_stats a;
    s_snap (s, &a);
    cr_assert_eq (a.running, 0);
    cr_assert_eq (a.queued, 0);
    cr_assert_eq (a.kv_used, b0.kv_used, "used %llu, baseline %llu", (unsigned long long) a.kv_used, (unsigned long long) b0.kv_used);
    cr_assert_eq (a.kv_free, b0.kv_free);
    cr_assert_eq (a.cache_evictable, b0.cache_evictable);
    cr_assert_eq (a.cache_protected, b0.cache_protected);
    cr_assert_eq (a.cache_protected, 0);
    cr_assert_eq (rx_sched_check (s, &err), RX_OK, "%s", err.msg);
    cr_assert_not (rx_sched_idle (s), "abort outputs are pending");
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK);
    cr_assert_eq (out.tokens.n, 2);
    for (uint32_t i = 0; i < 2; i++) cr_assert_eq (out.tokens.out[i].finish, RX_FINISH_ABORT);
    s_collect (run, &out);
    cr_assert_eq (s_res (run, 3, 0)->n, 0);
    cr_assert (s_res (run, 2, 0)->n >= 1);
    cr_assert (rx_sched_idle (s));
    /* An unprimed running request: its own slots come back; what it
     * inserted after its prefill stays as evictable cache only. */
    s_snap (s, &b0);
    s_submit (s, 4, q, 25, 100, NULL);
    for (int k = 0; k < 3; k++) cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK);
    cr_assert_eq (rx_sched_abort (s, 4), 1);
    s_snap (s, &a);
    cr_assert_eq (a.cache_protected, 0);
    cr_assert_eq (a.kv_used - a.cache_evictable, b0.kv_used - b0.cache_evictable);
    cr_assert_eq (rx_sched_check (s, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK);
    cr_assert (rx_sched_idle (s));
    size_t freed = 0;
    cr_assert_eq (rx_sched_flush_cache (s, &freed, &err), RX_OK);
    s_snap (s, &a);
    cr_assert_eq (a.kv_used, 0);
    cr_assert_eq (a.kv_free, a.kv_total);
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

static void s_n3 (struct rx_request *r)
{
    r->sp.n = 3;
    r->sp.temperature = 1.0f;
    r->sp.top_k = 40;
    r->sp.has_seed = 1;
    r->sp.seed = 42;
}

Test (scheduler, max_queued_requests_refuses_with_eagain)
{
    struct env e;
    s_env_open (&e);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.max_queued_requests = 4;
    rx_sched_t *s = s_sched (&e, &o);
    int32_t p[5] = { 1, 50, 60, 70, 80 };
    s_submit (s, 1, p, 5, 3, NULL);
    s_submit (s, 2, p, 5, 3, s_n3);   /* 3 siblings: 4 waiting */
    struct rx_request r = { 0 };
    rx_sampling_params_init (&r.sp);
    r.rid = 3;
    r.input_ids = malloc (5 * sizeof (int32_t));
    memcpy (r.input_ids, p, sizeof p);
    r.n_input = 5;
    r.sp.max_tokens = 3;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_sched_submit (s, &r, &err), RX_EAGAIN);
    cr_assert (strstr (err.msg, "max_queued_requests"), "%s", err.msg);
    cr_assert_not_null (r.input_ids, "refused: still the caller's");
    struct rx_sched_out out;
    struct run *run = calloc (1, sizeof *run);
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    s_collect (run, &out);
    cr_assert_eq (rx_sched_submit (s, &r, &err), RX_OK, "%s", err.msg);
    s_drain (s, run, 100);
    cr_assert_eq (run->n, 5, "rid 1, three siblings of rid 2, rid 3");
    free (run);
    rx_request_free (&r);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, n3_with_a_seed_is_reproducible_and_siblings_differ)
{
    struct env e;
    s_env_open (&e);
    s_lcg = 77;
    int32_t p[12];
    p[0] = 1;
    for (int i = 1; i < 12; i++) p[i] = s_rand_tok ();
    int32_t got[2][3][16];
    for (int inst = 0; inst < 2; inst++) {
        struct rx_sched_opts o = s_opts (&e, "fcfs");
        rx_sched_t *s = s_sched (&e, &o);
        s_submit (s, 9, p, 12, 16, s_n3);
        struct run *run = calloc (1, sizeof *run);
        s_drain (s, run, 200);
        cr_assert_eq (run->n, 3);
        for (uint32_t i = 0; i < 3; i++) {
            struct res *r = s_res (run, 9, i);
            cr_assert_eq (r->n, 16);
            memcpy (got[inst][i], r->ids, sizeof got[0][0]);
        }
        free (run);
        rx_sched_destroy (&s);
    }
    cr_assert_arr_eq (got[0], got[1], sizeof got[0], "two instances agree");
    cr_assert (memcmp (got[0][0], got[0][1], sizeof got[0][0]) || memcmp (got[0][1], got[0][2], sizeof got[0][0]),
               "siblings differ");
    cr_assert (memcmp (got[0][0], got[0][1], sizeof got[0][0]) && memcmp (got[0][0], got[0][2], sizeof got[0][0]) &&
               memcmp (got[0][1], got[0][2], sizeof got[0][0]));
    /* Sibling i samples with seed 42 + i exactly as a lone sampler would. */
    for (int i = 0; i < 3; i++) {
        struct rx_sampling sp = { .temperature = 1.0f, .top_k = 40, .top_p = 1, .min_p = 0, .seed = 42 + (uint64_t) i };
        int32_t ref[16];
        s_reference (&e, p, 12, 16, &sp, ref, NULL);
        cr_assert_arr_eq (ref, got[0][i], sizeof ref, "sibling %d equals seed %d alone", i, 42 + i);
    }
    s_env_close (&e);
}

/* REQ_ABORT_SEQ: one sibling of an n = 3 request stops (main saw its stop
 * string); its KV returns at once, it reports one token-less ABORT finish,
 * and the other siblings run on to max_tokens with exactly the tokens they
 * would have had (seed 42 + i, as a lone sampler).  Unknown rids and
 * indices, and a sibling aborted already, change nothing. */
Test (scheduler, abort_seq_stops_one_sibling_and_the_others_run_on)
{
    struct env e;
    s_env_open (&e);
    s_lcg = 77;
    int32_t p[12];
    p[0] = 1;
    for (int i = 1; i < 12; i++) p[i] = s_rand_tok ();
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.radix_cache = 0;   /* kv_used is the requests' own slots alone */
    rx_sched_t *s = s_sched (&e, &o);
    s_submit (s, 9, p, 12, 40, s_n3);
    struct run *run = calloc (1, sizeof *run);
    struct rx_err err = { 0 };
    struct rx_sched_out out;
    for (int k = 0; k < 6; k++) {
        cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
        s_collect (run, &out);
    }
    struct rx_sched_stats b, a;
    s_snap (s, &b);
    cr_assert_eq (b.running, 3);
    cr_assert (b.kv_used >= 3 * 12, "kv_used %llu", (unsigned long long) b.kv_used);
    int n1 = s_res (run, 9, 1)->n;
    cr_assert (n1 >= 2 && n1 < 40, "sibling 1 has %d tokens", n1);
    /* unknown: nothing happens */
    cr_assert_eq (rx_sched_abort_seq (s, 9, 3), 0);
    cr_assert_eq (rx_sched_abort_seq (s, 777, 0), 0);
    cr_assert_eq (rx_sched_abort_seq (NULL, 9, 0), 0);
    s_snap (s, &a);
    cr_assert_eq (a.running, 3);
    cr_assert_eq (a.kv_used, b.kv_used);
    /* sibling 1 alone */
    cr_assert_eq (rx_sched_abort_seq (s, 9, 1), 1);
    cr_assert_eq (rx_sched_abort_seq (s, 9, 1), 0, "aborted already");
    s_snap (s, &a);
    cr_assert_eq (a.running, 2);
    /* its prompt and output slots, less the last sampled token (no KV yet) */
    cr_assert_eq (b.kv_used - a.kv_used, (uint64_t) (12 + n1 - 1), "kv_used %llu -> %llu, n1 %d",
                  (unsigned long long) b.kv_used, (unsigned long long) a.kv_used, n1);
    cr_assert_eq (rx_sched_check (s, &err), RX_OK, "%s", err.msg);
    /* the next step reports its finish, without tokens; the others decode */
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    int seen_abort = 0, seen_other = 0;
    for (uint32_t i = 0; i < out.tokens.n; i++) {
        const struct rx_ipc_tok_out *t = &out.tokens.out[i];
        cr_assert_eq (t->rid, 9);
        if (t->index == 1) {
            seen_abort++;
            cr_assert_eq (t->finish, RX_FINISH_ABORT);
            cr_assert_eq (t->n_ids, 0);
        } else {
            seen_other++;
            cr_assert_eq (t->n_ids, 1);
        }
    }
    cr_assert_eq (seen_abort, 1);
    cr_assert_eq (seen_other, 2);
    s_collect (run, &out);
    s_drain (s, run, 200);
    cr_assert_eq (run->n, 3);
    cr_assert_eq (s_res (run, 9, 1)->n, n1, "no token after the abort");
    cr_assert_eq (s_res (run, 9, 1)->finish, RX_FINISH_ABORT);
    for (uint32_t i = 0; i < 3; i += 2) {
        struct res *r = s_res (run, 9, i);
        cr_assert_eq (r->n, 40, "sibling %u: %d tokens", i, r->n);
        cr_assert_eq (r->finish, RX_FINISH_LENGTH);
        struct rx_sampling sp = { .temperature = 1.0f, .top_k = 40, .top_p = 1, .min_p = 0, .seed = 42 + (uint64_t) i };
        int32_t ref[40];
        s_reference (&e, p, 12, 40, &sp, ref, NULL);
        cr_assert_arr_eq (ref, r->ids, sizeof ref, "sibling %u equals seed %u alone", i, 42 + i);
    }
    s_snap (s, &a);
    cr_assert_eq (a.kv_used, 0);
    cr_assert_eq (rx_sched_abort_seq (s, 9, 0), 0, "finished");
    free (run);
    rx_sched_destroy (&s);

    /* A waiting sibling (max_running_requests = 1): it never runs. */
    o.max_running_requests = 1;
    s = s_sched (&e, &o);
    s_submit (s, 5, p, 12, 8, s_n3);
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    s_snap (s, &a);
    cr_assert_eq (a.running, 1);
    cr_assert_eq (a.queued, 2);
    run = calloc (1, sizeof *run);
    s_collect (run, &out);
    cr_assert_eq (rx_sched_abort_seq (s, 5, 2), 1);
    s_snap (s, &a);
    cr_assert_eq (a.queued, 1);
    s_drain (s, run, 200);
    cr_assert_eq (s_res (run, 5, 2)->n, 0);
    cr_assert_eq (s_res (run, 5, 2)->finish, RX_FINISH_ABORT);
    cr_assert_eq (s_res (run, 5, 0)->n, 8);
    cr_assert_eq (s_res (run, 5, 1)->n, 8);
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

static int32_t s_stop_tok, s_min_tokens;
static void s_tw_stop (struct rx_request *r) { r->sp.n_stop_ids = 1; r->sp.stop_ids[0] = s_stop_tok; }
static void s_tw_min (struct rx_request *r)
{
    r->sp.n_stop_ids = 1;
    r->sp.stop_ids[0] = s_stop_tok;
    r->sp.min_tokens = s_min_tokens;
}
static void s_tw_eos (struct rx_request *r) { r->sp.ignore_eos = 0; }

Test (scheduler, stop_ids_max_tokens_min_tokens_and_eos)
{
    struct env e;
    s_env_open (&e);
    s_lcg = 5150;
    int32_t p[10], ref[24];
    p[0] = 1;
    for (int i = 1; i < 10; i++) p[i] = s_rand_tok ();
    float *lg = malloc (24 * (size_t) e.V * sizeof (float));
    s_reference (&e, p, 10, 24, NULL, ref, lg);
    /* a token whose first occurrence is at j >= 2 */
    int j = 2;
    for (; j < 24; j++) {
        int seen = 0;
        for (int k = 0; k < j; k++) seen |= ref[k] == ref[j];
        if (!seen) break;
    }
    cr_assert (j < 24);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.eos_id = ref[j];   /* pretend the model's EOS is that token */
    rx_sched_t *s = s_sched (&e, &o);
    s_stop_tok = ref[j];
    s_submit (s, 1, p, 10, 24, s_tw_stop);
    s_submit (s, 2, p, 10, 24, s_tw_eos);
    s_submit (s, 3, p, 10, 24, NULL);      /* ignore_eos */
    s_submit (s, 4, p, 10, 0, NULL);
    s_submit (s, 5, p, 10, 7, NULL);
    s_stop_tok = ref[0];
    s_min_tokens = 3;
    s_submit (s, 6, p, 10, 24, s_tw_min);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 300);
    struct res *r = s_res (run, 1, 0);
    cr_assert_eq (r->finish, RX_FINISH_STOP_ID);
    cr_assert_eq (r->matched, ref[j]);
    cr_assert_eq (r->n, j + 1);
    r = s_res (run, 2, 0);
    cr_assert_eq (r->finish, RX_FINISH_EOS);
    cr_assert_eq (r->matched, ref[j]);
    cr_assert_eq (r->n, j + 1);
    r = s_res (run, 3, 0);
    cr_assert_eq (r->finish, RX_FINISH_LENGTH);
    cr_assert_eq (r->n, 24);
    cr_assert_arr_eq (r->ids, ref, sizeof ref);
    r = s_res (run, 4, 0);
    cr_assert_eq (r->finish, RX_FINISH_LENGTH);
    cr_assert_eq (r->n, 0);
    r = s_res (run, 5, 0);
    cr_assert_eq (r->finish, RX_FINISH_LENGTH);
    cr_assert_eq (r->n, 7);
    /* min_tokens 3 with stop id = the greedy first token: position 0 takes
     * the second-best token (the stop id is banned). */
    r = s_res (run, 6, 0);
    cr_assert (r->n >= 3);
    for (int k = 0; k < 3; k++) cr_assert_neq (r->ids[k], ref[0]);
    float *row = malloc ((size_t) e.V * sizeof (float));
    memcpy (row, lg, (size_t) e.V * sizeof (float));
    row[ref[0]] = -INFINITY;
    row[ref[j]] = -INFINITY;   /* EOS (o.eos_id) is banned too */
    cr_assert_eq (r->ids[0], rx_argmax (row, e.V));
    free (row);
    free (lg);
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, the_context_length_ends_a_request)
{
    struct env e;
    s_env_open (&e);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.context_len = 40;
    rx_sched_t *s = s_sched (&e, &o);
    int32_t p[30];
    s_lcg = 8;
    for (int i = 0; i < 30; i++) p[i] = s_rand_tok ();
    s_submit (s, 1, p, 30, -1, NULL);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 100);
    cr_assert_eq (s_res (run, 1, 0)->finish, RX_FINISH_LENGTH);
    cr_assert_eq (s_res (run, 1, 0)->n, 10);
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

static void s_tw_lp (struct rx_request *r) { r->sp.logprobs = 1; r->sp.top_logprobs = 5; }

Test (scheduler, logprobs_are_the_log_softmax_of_the_engine_logits)
{
    struct env e;
    s_env_open (&e);
    s_lcg = 31;
    int32_t p[15], ref[6];
    p[0] = 1;
    for (int i = 1; i < 15; i++) p[i] = s_rand_tok ();
    float *lg = malloc (6 * (size_t) e.V * sizeof (float));
    s_reference (&e, p, 15, 6, NULL, ref, lg);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    rx_sched_t *s = s_sched (&e, &o);
    s_submit (s, 1, p, 15, 6, s_tw_lp);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 100);
    struct res *r = s_res (run, 1, 0);
    cr_assert_eq (r->n, 6);
    for (int k = 0; k < 6; k++) {
        const float *x = lg + (size_t) k * e.V;
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < e.V; i++) mx = fmax (mx, x[i]);
        for (int i = 0; i < e.V; i++) sum += exp ((double) x[i] - mx);
        double lse = mx + log (sum);
        cr_assert_float_eq (r->lp[k], x[ref[k]] - lse, 1e-4, "token %d: %g vs %g", k, r->lp[k], x[ref[k]] - lse);
        /* top 5 by brute force */
        int used[5] = { -1, -1, -1, -1, -1 };
        for (int t = 0; t < 5; t++) {
            int best = -1;
            for (int i = 0; i < e.V; i++) {
                int skip = 0;
                for (int u = 0; u < t; u++) skip |= used[u] == i;
                if (!skip && (best < 0 || x[i] > x[best])) best = i;
            }
            used[t] = best;
            cr_assert_eq (r->top_ids[k][t], best, "token %d top %d", k, t);
            cr_assert_float_eq (r->top_lp[k][t], x[best] - lse, 1e-4);
        }
        cr_assert_eq (r->top_ids[k][0], ref[k], "greedy: the chosen token is the top one");
    }
    free (lg);
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, flush_cache_only_when_idle_and_it_empties_the_cache)
{
    struct env e;
    s_env_open (&e);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    rx_sched_t *s = s_sched (&e, &o);
    int32_t p[20];
    s_lcg = 4;
    for (int i = 0; i < 20; i++) p[i] = s_rand_tok ();
    s_submit (s, 1, p, 20, 5, NULL);
    struct rx_err err = { 0 };
    size_t freed = 99;
    cr_assert_eq (rx_sched_flush_cache (s, &freed, &err), RX_EAGAIN);
    cr_assert (strstr (err.msg, "running"), "%s", err.msg);
    cr_assert_eq (freed, 0);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 100);
    struct rx_sched_stats st;
    rx_sched_stats (s, &st);
    cr_assert (st.cache_tokens >= 20);
    cr_assert_eq (rx_sched_flush_cache (s, &freed, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (freed, st.cache_tokens);
    rx_sched_stats (s, &st);
    cr_assert_eq (st.cache_tokens, 0);
    cr_assert_eq (st.kv_used, 0);
    /* After the flush the same prompt misses and still gives the same tokens. */
    s_submit (s, 2, p, 20, 5, NULL);
    s_drain (s, run, 100);
    cr_assert_eq (s_res (run, 2, 0)->cached, 0);
    cr_assert_arr_eq (s_res (run, 2, 0)->ids, s_res (run, 1, 0)->ids, 5 * sizeof (int32_t));
    free (run);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, every_policy_runs_a_mixed_workload_to_the_same_outputs)
{
    struct env e;
    s_env_open (&e);
    struct work *w = calloc (1, sizeof *w);
    s_make_work (&e, w, 16, 123, 1);
    const char *pol[] = { "fcfs", "lpm", "random", "dfs_weight" };
    for (int p = 0; p < 4; p++) {
        struct rx_sched_opts o = s_opts (&e, pol[p]);
        o.max_running_requests = 4;
        o.max_prefill_tokens = 100;
        rx_sched_t *s = s_sched (&e, &o);
        /* half first, so that the rest find cached prefixes */
        struct run *run = calloc (1, sizeof *run);
        for (int i = 0; i < 8; i++) s_submit (s, 100 + (uint64_t) i, w->prompt[i], w->n_prompt[i], w->max_tokens[i], NULL);
        struct rx_err err = { 0 };
        struct rx_sched_out out;
        for (int k = 0; k < 6; k++) {
            cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
            s_collect (run, &out);
        }
        for (int i = 8; i < 16; i++) s_submit (s, 100 + (uint64_t) i, w->prompt[i], w->n_prompt[i], w->max_tokens[i], NULL);
        s_drain (s, run, 2000);
        s_check_work (w, run, pol[p]);
        free (run);
        rx_sched_destroy (&s);
    }
    free (w);
    s_env_close (&e);
}

Test (scheduler, without_the_radix_cache_nothing_is_cached)
{
    struct env e;
    s_env_open (&e);
    struct work *w = calloc (1, sizeof *w);
    s_make_work (&e, w, 8, 55, 1);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.radix_cache = 0;
    rx_sched_t *s = s_sched (&e, &o);
    s_submit_work (s, w);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 1000);
    s_check_work (w, run, "no cache");
    struct rx_sched_stats st;
    rx_sched_stats (s, &st);
    cr_assert_eq (st.cached_tokens, 0);
    cr_assert_eq (st.kv_used, 0);
    free (run);
    free (w);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

static void s_expect_submit (rx_sched_t *s, uint64_t rid, const int32_t *p, int n, int code,
                             const char *want, void (*tweak) (struct rx_request *))
{
    struct rx_request r = { 0 };
    rx_sampling_params_init (&r.sp);
    r.rid = rid;
    r.input_ids = n ? malloc ((size_t) n * sizeof (int32_t)) : NULL;
    if (n) memcpy (r.input_ids, p, (size_t) n * sizeof (int32_t));
    r.n_input = (uint32_t) n;
    if (tweak) tweak (&r);
    struct rx_err err = { 0 };
    cr_assert_eq (rx_sched_submit (s, &r, &err), code, "%s", err.msg);
    cr_assert (strstr (err.msg, want), "message \"%s\" lacks \"%s\"", err.msg, want);
    cr_assert_null (strchr (err.msg, '\n'));
    rx_request_free (&r);
}

static void s_tw_badtemp (struct rx_request *r) { r->sp.temperature = -1; }

Test (scheduler, bad_requests_and_options_get_one_clear_line)
{
    struct env e;
    s_env_open (&e);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.n_slots = 64;
    rx_sched_t *s = s_sched (&e, &o);
    int32_t p[600];
    for (int i = 0; i < 600; i++) p[i] = 5 + i;
    s_expect_submit (s, 1, p, 0, RX_EINVAL, "empty prompt", NULL);
    int32_t bad[3] = { 1, 32000, 5 };
    s_expect_submit (s, 1, bad, 3, RX_EINVAL, "outside the vocabulary", NULL);
    s_expect_submit (s, 1, p, 512, RX_ERANGE, "context", NULL);
    s_expect_submit (s, 1, p, 100, RX_ERANGE, "KV pool", NULL);
    s_expect_submit (s, 1, p, 5, RX_EINVAL, "temperature", s_tw_badtemp);
    s_submit (s, 1, p, 5, 2, NULL);
    s_expect_submit (s, 1, p, 5, RX_EINVAL, "already in use", NULL);
    struct run *run = calloc (1, sizeof *run);
    s_drain (s, run, 50);
    free (run);
    rx_sched_destroy (&s);

    struct rx_err err = { 0 };
    o = s_opts (&e, "nosuch");
    cr_assert_null (rx_sched_new (&e.boot, e.eng, &o, &err));
    cr_assert (strstr (err.msg, "nosuch"), "%s", err.msg);
    o = s_opts (&e, "fcfs");
    o.n_slots = 100000;
    cr_assert_null (rx_sched_new (&e.boot, e.eng, &o, &err));
    cr_assert (strstr (err.msg, "exceeds"), "%s", err.msg);
    o = s_opts (&e, "fcfs");
    o.chunked_prefill_size = 0;
    cr_assert_null (rx_sched_new (&e.boot, e.eng, &o, &err));
    cr_assert (strstr (err.msg, "chunked_prefill_size"), "%s", err.msg);
    s_env_close (&e);
}

Test (scheduler, conf_keys_reach_the_options)
{
    char *dir = tu_tmpdir ();
    char *path = tu_path (dir, "s.ini");
    tu_write (path, "[cache]\nkv_memory = 1MiB\nradix_cache = false\npage_size = 16\n"
                    "[scheduler]\npolicy = lpm\nmax_running_requests = 7\nmax_queued_requests = 9\n"
                    "chunked_prefill_size = -1\nmax_prefill_tokens = 333\n");
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&b, path, 0, &err), RX_OK, "%s", err.msg);
    struct rx_sched_opts o;
    cr_assert_eq (rx_sched_opts_from_conf (b.conf, &o, &err), RX_OK);
    cr_assert_eq (o.page_size, 16);
    cr_assert_eq (o.radix_cache, 0);
    cr_assert_eq (o.max_running_requests, 7);
    cr_assert_eq (o.max_queued_requests, 9);
    cr_assert_eq (o.chunked_prefill_size, -1);
    cr_assert_eq (o.max_prefill_tokens, 333);
    cr_assert_float_eq (o.init_new_token_ratio, 0.7, 1e-9);
    uint32_t n = 0;
    uint64_t freeb = 1ull << 30;
    cr_assert_eq (rx_sched_kv_slots (b.conf, 1024, &freeb, &n, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (n, 1024);   /* 1 MiB / 1 KiB per token, a multiple of 16 */
    rx_boot_close (&b);
    free (path);
    free (dir);
}

/* ------------------------------------ DP attention: admission, all_decode -- */

/* A runs alone (prompt 20, max_tokens 200), then B (prompt 20, max_tokens
 * 40) arrives, in a 256-slot pool without the radix cache.  After A's
 * prefill the room is 236 slots and A may still need 199.  With the
 * ordinary reserve (new_token_ratio 0.7: ~139) B's 20 + 40 fit and B is
 * prefilled at once; with DP attention's floor (1: all 199) only 37 are
 * left, so B waits -- decoding never needs a retraction -- until A is done.
 * Along the way: the steps' all_decode and rx_sched_may_prefill. */
static void s_admission (double floor, int *b_step, int *a_done, int *retracted)
{
    struct env e;
    s_env_open (&e);
    struct rx_sched_opts o = s_opts (&e, "fcfs");
    o.n_slots = 256;
    o.radix_cache = 0;
    o.min_reserve_ratio = floor;
    rx_sched_t *s = s_sched (&e, &o);
    int32_t pa[20], pb[20];
    s_lcg = 11;
    pa[0] = pb[0] = 1;
    for (int j = 1; j < 20; j++) {
        pa[j] = s_rand_tok ();
        pb[j] = s_rand_tok ();
    }
    cr_assert_eq (rx_sched_may_prefill (s), 0, "an empty scheduler will not prefill");
    s_submit (s, 1, pa, 20, 200, NULL);
    cr_assert_eq (rx_sched_may_prefill (s), 1, "a waiting request may be prefilled");
    struct rx_err err = { 0 };
    struct rx_sched_out out;
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (out.kind, RX_SCHED_PREFILL);
    cr_assert_eq (out.all_decode, 0, "a prefill step is never all_decode");
    cr_assert_eq (rx_sched_may_prefill (s), 0, "only A runs: the next step decodes");
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (out.kind, RX_SCHED_DECODE);
    cr_assert_eq (out.all_decode, 1, "a decode step with the group flag 1");
    rx_sched_set_group_decode (s, 0);   /* a peer rank prefills */
    cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (out.kind, RX_SCHED_DECODE);
    cr_assert_eq (out.all_decode, 0, "a decode step while a peer prefills");
    rx_sched_set_group_decode (s, 1);
    s_submit (s, 2, pb, 20, 40, NULL);
    cr_assert_eq (rx_sched_may_prefill (s), 1);
    *b_step = *a_done = *retracted = 0;
    int na = 3, nb = 0;   /* tokens of A so far (prefill + 2 decodes) */
    for (int k = 4; k < 400 && !rx_sched_idle (s); k++) {
        cr_assert_eq (rx_sched_step (s, &out, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (rx_sched_check (s, &err), RX_OK, "step %d: %s", k, err.msg);
        cr_assert_eq (out.all_decode, out.kind == RX_SCHED_DECODE, "step %d: kind %d, all_decode %d", k,
                      out.kind, out.all_decode);
        *retracted += out.n_retracted;
        for (uint32_t i = 0; i < out.tokens.n; i++) {
            const struct rx_ipc_tok_out *t = &out.tokens.out[i];
            if (t->rid == 1) {
                na += (int) t->n_ids;
                if (t->finish) *a_done = k;
            } else if (t->rid == 2) {
                if (!nb) *b_step = k;
                nb += (int) t->n_ids;
            }
        }
        if (*b_step == 0) cr_assert_eq (rx_sched_may_prefill (s), 1, "step %d: B still waits", k);
    }
    cr_assert (rx_sched_idle (s));
    cr_assert_eq (na, 200);
    cr_assert_eq (nb, 40);
    rx_sched_destroy (&s);
    s_env_close (&e);
}

Test (scheduler, ordinary_admission_takes_the_second_request_at_once)
{
    int b_step, a_done, retracted;
    s_admission (0, &b_step, &a_done, &retracted);
    cr_assert_eq (b_step, 4, "B prefilled at step %d, not at once", b_step);
    cr_assert (a_done > b_step);
}

Test (scheduler, dp_attention_admission_keeps_the_whole_decode_reserve)
{
    int b_step, a_done, retracted;
    s_admission (1.0, &b_step, &a_done, &retracted);
    cr_assert (a_done > 0 && b_step > a_done, "B started at step %d, A finished at step %d", b_step, a_done);
    cr_assert_eq (retracted, 0);
}

Test (scheduler, dp_attention_sets_the_reserve_floor_and_bad_floors_are_refused)
{
    char *dir = tu_tmpdir ();
    char *path = tu_path (dir, "s.ini");
    tu_write (path, "[parallel]\ndp_attention = true\n");
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&b, path, 0, &err), RX_OK, "%s", err.msg);
    struct rx_sched_opts o;
    cr_assert_eq (rx_sched_opts_from_conf (b.conf, &o, &err), RX_OK);
    cr_assert_float_eq (o.min_reserve_ratio, 1.0, 1e-12);
    rx_boot_close (&b);
    struct env e;
    s_env_open (&e);
    o = s_opts (&e, "fcfs");
    cr_assert_float_eq (o.min_reserve_ratio, 0.0, 1e-12, "no DP attention: no floor");
    const double bad[] = { -0.1, 1.5, NAN };
    for (int i = 0; i < 3; i++) {
        o.min_reserve_ratio = bad[i];
        memset (&err, 0, sizeof err);
        rx_sched_t *s = rx_sched_new (&e.boot, e.eng, &o, &err);
        cr_assert_null (s);
        cr_assert_eq (err.code, RX_EINVAL);
        cr_assert_not_null (strstr (err.msg, "min_reserve_ratio"), "%s", err.msg);
    }
    s_env_close (&e);
    free (path);
    free (dir);
}

/* ---------------------------------------------- sampling extensions -- */

Test (scheduler, penalties_follow_openai_semantics)
{
    float l[6] = { 2, -2, 1, 0.5f, 3, -1 };
    uint32_t counts[6] = { 0 };
    int32_t prompt[2] = { 1, 3 }, out[4] = { 0, 0, 4, 1 };
    struct rx_penalties pen = { .frequency = 0.5f, .presence = 0.25f, .repetition = 2 };
    rx_penalties_apply (l, 6, &pen, prompt, 2, out, 4, counts);
    /* id 0: rep 2/2 = 1, then -0.5*2 - 0.25 = -0.25 */
    cr_assert_float_eq (l[0], -0.25f, 1e-6);
    /* id 1: rep -2*2 = -4 (prompt and output: once), then -0.5 - 0.25 */
    cr_assert_float_eq (l[1], -4.75f, 1e-6);
    cr_assert_float_eq (l[2], 1, 1e-6);          /* untouched */
    cr_assert_float_eq (l[3], 0.25f, 1e-6);      /* prompt only: rep */
    cr_assert_float_eq (l[4], 1.5f - 0.75f, 1e-6);
    cr_assert_float_eq (l[5], -1, 1e-6);
    for (int i = 0; i < 6; i++) cr_assert_eq (counts[i], 0, "scratch left zeroed");
    float m[4] = { 1, 2, 3, 4 };
    int32_t ban[2] = { 3, 99 };
    rx_logits_ban (m, 4, ban, 2);
    cr_assert (isinf (m[3]) && m[3] < 0);
    float x[4] = { 0, (float) log (3.0), NAN, 0 };
    int32_t ti[3];
    float tl[3];
    float lp = rx_logprobs (x, 4, 0, 3, ti, tl);
    cr_assert_float_eq (lp, log (0.2), 1e-6);
    cr_assert_eq (ti[0], 1);
    cr_assert_eq (ti[1], 0);
    cr_assert_eq (ti[2], 3);
    cr_assert_float_eq (tl[0], log (0.6), 1e-6);
    cr_assert (isinf (rx_logprobs (x, 4, 2, 0, ti, tl)));
}

/* ---------------------------------------------------------- dfs_weight -- */

/* A fake tree: node k's parent is par[k]; ids are k + 1 (root = 1). */
static int32_t s_par[16];
static uintptr_t s_parent (const void *ctx, uintptr_t n)
{
    (void) ctx;
    return n == 1 ? 1 : (uintptr_t) s_par[n - 1] + 1;
}

Test (scheduler, dfs_weight_visits_heavier_subtrees_first)
{
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&b, NULL, 0, &err), RX_OK, "%s", err.msg);
    rx_plugin_t *pl;
    cr_assert_eq (rx_loader_find (b.loader, RX_KIND_SCHED_POLICY, "dfs_weight", &pl, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (pl, b.conf, &err), RX_OK, "%s", err.msg);
    const struct rx_sched_policy_ops *ops = rx_plugin_ops (pl);
    /* root 0 -> A 1, B 2;  A -> A1 3;  B -> B1 4, B2 5 */
    int32_t par[6] = { 0, 0, 0, 1, 2, 2 };
    memcpy (s_par, par, sizeof par);
    struct rx_tree_view tv = { .ctx = NULL, .root = 1, .parent = s_parent };
    /* requests (arrival, node): r0 at A1, r1 at B1, r2 at B2, r3 at B,
     * r4 at root, r5 at A */
    uintptr_t nodes[6] = { 4, 5, 6, 3, 0, 2 };
    struct rx_sched_item it[6];
    for (int i = 0; i < 6; i++)
        it[i] = (struct rx_sched_item) { .rid = (uint64_t) i, .arrival = (uint64_t) i, .node = nodes[i] };
    cr_assert_eq (ops->prioritize (NULL, it, 6, &tv, 0, &err), RX_OK);
    /* B subtree weighs 3 (r1, r2, r3), A 2 (r0, r5): B first, post-order:
     * B1 (r1), B2 (r2), B (r3), then A1 (r0), A (r5), then root (r4). */
    int want[6] = { 1, 2, 3, 0, 5, 4 };
    for (int k = 0; k + 1 < 6; k++)
        cr_assert_lt (it[want[k]].priority, it[want[k + 1]].priority, "position %d", k);
    rx_boot_close (&b);
}

/* [scheduler] sampling_threads: a step's host-sampled rows are drawn on
 * several threads (core/sample_pool.h).  A mixed workload -- seeded
 * temperature / top_p / min_p / top_k, penalties, min_tokens bans, n = 3
 * siblings, greedy rows beside them -- gives every request the very same
 * tokens with 3 threads as with 1 (each row depends only on its request,
 * generator state included); the pool reports its thread count. */
static int s_mix_i;
static void s_tw_mix (struct rx_request *r)
{
    const int i = s_mix_i;
    r->sp.has_seed = 1;
    r->sp.seed = 1000 + (uint64_t) i;
    switch (i % 6) {
    case 0: r->sp.temperature = 0; break;   /* greedy: the device argmax */
    case 1: r->sp.temperature = 0.8f; r->sp.top_p = 0.9f; break;
    case 2: r->sp.temperature = 1.2f; r->sp.min_p = 0.05f; r->sp.frequency_penalty = 0.5f; break;
    case 3: r->sp.temperature = 0.7f; r->sp.top_k = 20; r->sp.presence_penalty = 0.3f; break;
    case 4: r->sp.temperature = 1.0f; r->sp.n = 3; break;
    case 5: r->sp.temperature = 0.9f; r->sp.repetition_penalty = 1.3f; r->sp.min_tokens = 4; break;
    }
}

Test (scheduler, sampling_threads_draw_the_same_tokens)
{
    struct env e;
    s_env_open (&e);
    s_lcg = 4242;
    enum { NQ = 12, NP = 9, NG = 14 };
    int32_t p[NQ][NP];
    for (int i = 0; i < NQ; i++) {
        p[i][0] = 1;
        for (int j = 1; j < NP; j++) p[i][j] = s_rand_tok ();
    }
    struct run *run[2];
    for (int inst = 0; inst < 2; inst++) {
        struct rx_sched_opts o = s_opts (&e, "fcfs");
        o.sampling_threads = inst ? 3 : 1;
        rx_sched_t *s = s_sched (&e, &o);
        run[inst] = calloc (1, sizeof *run[inst]);
        for (int i = 0; i < NQ; i++) {
            s_mix_i = i;
            s_submit (s, 100 + (uint64_t) i, p[i], NP, NG, s_tw_mix);
        }
        s_drain (s, run[inst], 400);
        rx_sched_destroy (&s);
    }
    int sampled = 0;
    for (int i = 0; i < NQ; i++)
        for (uint32_t k = 0; k < (i % 6 == 4 ? 3u : 1u); k++) {
            struct res *a = s_res (run[0], 100 + (uint64_t) i, k), *b = s_res (run[1], 100 + (uint64_t) i, k);
            cr_assert_eq (a->n, NG, "request %d.%u ran to max_tokens", i, k);
            cr_assert_eq (b->n, a->n);
            cr_assert_arr_eq (a->ids, b->ids, sizeof a->ids[0] * (size_t) a->n,
                              "request %d.%u: the same tokens with 3 sampling threads", i, k);
            sampled += i % 6 != 0;
        }
    cr_assert_geq (sampled, 10, "most rows were sampled on the host");
    free (run[0]);
    free (run[1]);
    s_env_close (&e);
}

/* ------------------------------------------------- device sampling -- *
 * [scheduler] device_sampling = on, forced on kernels-cpu: a sampled row
 * without logprobs or a min_tokens ban draws from the device's
 * sampling_candidates most likely tokens (rx_sampler_sample_cands; with
 * penalties or a min_tokens ban, corrected for them: rx_cands_penalized).
 * Greedy rows (the device argmax) must give the very same tokens as with
 * device sampling off; top_k rows with top_k <=
 * sampling_candidates draw the host sampler's token (the same uniform, a
 * cut inside the candidates), penalized ones too; plain and top_p rows
 * draw from the same distribution but not the same tokens -- only seeded
 * reproducibility is asserted for them. */

enum { DS_NQ = 16, DS_NP = 9, DS_NG = 12 };
static int s_ds_i;
static void s_tw_ds (struct rx_request *r)
{
    const int i = s_ds_i;
    r->sp.has_seed = 1;
    r->sp.seed = 7000 + (uint64_t) i;
    switch (i % 8) {
    case 0: r->sp.temperature = 0; break;                                          /* greedy */
    case 1: r->sp.temperature = 1.1f; r->sp.frequency_penalty = 0.4f; r->sp.top_k = 30; break;   /* penalized */
    case 2: r->sp.temperature = 0.9f; r->sp.top_k = 25; r->sp.logprobs = 1; r->sp.top_logprobs = 5; break;
    case 3: r->sp.temperature = 1.0f; r->sp.top_k = 30; r->sp.min_tokens = DS_NG; break;   /* banned throughout */
    case 4: r->sp.temperature = 0.8f; r->sp.top_k = 20; break;                       /* candidates */
    case 5: r->sp.temperature = 1.3f; r->sp.top_k = 64; r->sp.top_p = 0.9f; r->sp.min_p = 0.02f; break;
    case 6: r->sp.temperature = 1.0f; r->sp.n = 3; break;                            /* plain, 3 siblings */
    case 7: r->sp.temperature = 0.7f; r->sp.top_p = 0.9f; break;                     /* top_p only */
    }
}
/* rows that must draw exactly what the host path draws */
static int s_ds_same (int i) { return i % 8 <= 5; }
/* requests (times their n) that take the candidate path every step */
static int s_ds_cand (int i)
{
    return i % 8 >= 1 && i % 8 != 6 ? 1 : i % 8 == 6 ? 3 : 0;
}

static void s_ds_run (struct env *e, int32_t ds, int32_t k, int32_t (*p)[DS_NP], void (*tw) (struct rx_request *),
                      struct run *run, struct rx_sched_stats *st)
{
    struct rx_sched_opts o = s_opts (e, "fcfs");
    o.device_sampling = ds;
    o.sampling_candidates = k;
    rx_sched_t *s = s_sched (e, &o);
    for (int i = 0; i < DS_NQ; i++) {
        s_ds_i = i;
        s_submit (s, 100 + (uint64_t) i, p[i], DS_NP, DS_NG, tw);
    }
    s_drain (s, run, 400);
    rx_sched_stats (s, st);
    rx_sched_destroy (&s);
}

static void s_ds_prompts (int32_t (*p)[DS_NP], uint64_t seed)
{
    s_lcg = seed;
    for (int i = 0; i < DS_NQ; i++) {
        p[i][0] = 1;
        for (int j = 1; j < DS_NP; j++) p[i][j] = s_rand_tok ();
    }
}

Test (scheduler, device_sampling_keeps_the_host_paths_and_top_k_draws)
{
    struct env e;
    s_env_open (&e);
    int32_t p[DS_NQ][DS_NP];
    s_ds_prompts (p, 5151);
    /* off, on, on again, auto (off on kernels-cpu: host-visible) */
    static const int32_t ds[] = { 0, 1, 1, -1 };
    struct run *run[4];
    struct rx_sched_stats st[4];
    for (int m = 0; m < 4; m++) {
        run[m] = calloc (1, sizeof *run[m]);
        s_ds_run (&e, ds[m], 64, p, s_tw_ds, run[m], &st[m]);
    }
    uint64_t want_cand = 0;
    for (int i = 0; i < DS_NQ; i++) want_cand += (uint64_t) s_ds_cand (i) * DS_NG;
    cr_assert_eq (st[0].cand_rows, 0, "device sampling off: no candidate rows");
    cr_assert_eq (st[3].cand_rows, 0, "auto on kernels-cpu: off");
    cr_assert_eq (st[1].cand_rows, want_cand, "every step of every candidate request: %llu, want %llu",
                  (unsigned long long) st[1].cand_rows, (unsigned long long) want_cand);
    cr_assert_eq (st[2].cand_rows, st[1].cand_rows);
    cr_assert_eq (st[2].cand_full, st[1].cand_full);
    cr_assert_eq (st[2].cand_tail, st[1].cand_tail);
    cr_assert_leq (st[1].cand_full + st[1].cand_tail, st[1].cand_rows);
    int same = 0, differ = 0;
    for (int i = 0; i < DS_NQ; i++)
        for (uint32_t k = 0; k < (i % 8 == 6 ? 3u : 1u); k++) {
            struct res *r[4];
            for (int m = 0; m < 4; m++) {
                r[m] = s_res (run[m], 100 + (uint64_t) i, k);
                cr_assert_eq (r[m]->n, DS_NG, "mode %d request %d.%u ran to max_tokens", m, i, k);
                cr_assert_eq (r[m]->finish, RX_FINISH_LENGTH);
                for (int t = 0; t < r[m]->n; t++)
                    cr_assert (r[m]->ids[t] >= 0 && r[m]->ids[t] < e.V, "request %d.%u token %d: %d", i, k, t,
                               r[m]->ids[t]);
            }
            cr_assert_arr_eq (r[1]->ids, r[2]->ids, sizeof r[1]->ids[0] * DS_NG,
                              "request %d.%u: a seed gives the same tokens run to run", i, k);
            cr_assert_arr_eq (r[0]->ids, r[3]->ids, sizeof r[0]->ids[0] * DS_NG,
                              "request %d.%u: auto on kernels-cpu is the host path", i, k);
            if (s_ds_same (i)) {
                for (int t = 0; t < DS_NG; t++)
                    cr_assert_eq (r[1]->ids[t], r[0]->ids[t],
                                  "request %d (kind %d) token %d: device sampling %d, host %d", i, i % 8, t,
                                  r[1]->ids[t], r[0]->ids[t]);
                if (i % 8 == 2)   /* logprobs from candidates at temperature 1: float logs */
                    for (int t = 0; t < DS_NG; t++) cr_assert_float_eq (r[1]->lp[t], r[0]->lp[t], 1e-4);
                same++;
            } else {
                differ += memcmp (r[1]->ids, r[0]->ids, sizeof r[0]->ids[0] * DS_NG) != 0;
            }
        }
    cr_assert_eq (same, 12);
    /* plain rows walk the candidates best first: other draws than the host's
     * id-order walk (not a requirement, a check that the path was taken) */
    cr_log_info ("device sampling: %llu candidate rows (%llu full, %llu tail); %d of 8 plain/top_p "
                 "requests drew other tokens than the host path",
                 (unsigned long long) st[1].cand_rows, (unsigned long long) st[1].cand_full,
                 (unsigned long long) st[1].cand_tail, differ);
    cr_assert_gt (differ, 0);
    for (int m = 0; m < 4; m++) free (run[m]);
    s_env_close (&e);
}

/* Logprobs from candidates: greedy rows and sampled rows take their
 * logprobs from candidates at temperature 1 (a row sampled at 0.9 gets a
 * second candidate row at 1: rx_engine_cands inv_t2), no whole row, also
 * when penalties correct their draw (the logprobs stay the raw row's);
 * every logprob any mode emits is the log_softmax of the reference
 * engine's logits along the tokens that request got, and the greedy and
 * top_k rows give the host path's tokens. */
static int s_lp_k;   /* top_logprobs of kinds 0-2 */
static void s_tw_lpc (struct rx_request *r)
{
    const int i = s_ds_i;
    r->sp.has_seed = 1;
    r->sp.seed = 9100 + (uint64_t) i;
    r->sp.logprobs = 1;
    r->sp.top_logprobs = i % 4 == 3 ? 5 : s_lp_k;
    switch (i % 4) {
    case 0: r->sp.temperature = 0; break;                            /* greedy: candidates */
    case 1: r->sp.temperature = 1.0f; r->sp.top_k = 20; break;        /* candidates, the host's draw */
    case 2: r->sp.temperature = 1.0f; break;                          /* plain: candidates (tail: row) */
    case 3: r->sp.temperature = 0.9f; r->sp.top_k = 20; break;        /* a second row at temperature 1 */
    }
    if (i >= DS_NQ / 2) {   /* the second half with penalties: drawn from corrected candidates */
        r->sp.repetition_penalty = i % 4 == 0 ? 1.5f : 1.f;
        r->sp.presence_penalty = i % 4 == 1 ? 1.0f : 0.f;
        r->sp.frequency_penalty = i % 4 >= 2 ? 0.5f : 0.f;
    }
}

/* The logits of every generated token of r (prompt p), by one forward of
 * the reference engine over the prompt and all but its last token. */
static void s_lp_check (struct env *e, const int32_t *p, const struct res *r, int n_top, const char *what)
{
    const int nt = DS_NP + r->n - 1;
    int32_t *toks = malloc ((size_t) nt * sizeof *toks), *pos = malloc ((size_t) nt * sizeof *pos);
    int32_t *orow = malloc ((size_t) r->n * sizeof *orow);
    float *lg = malloc ((size_t) r->n * (size_t) e->V * sizeof *lg);
    cr_assert (toks && pos && orow && lg);
    memcpy (toks, p, DS_NP * sizeof *toks);
    memcpy (toks + DS_NP, r->ids, (size_t) (r->n - 1) * sizeof *toks);
    for (int i = 0; i < nt; i++) pos[i] = i;
    for (int t = 0; t < r->n; t++) orow[t] = DS_NP - 1 + t;
    int32_t q[2] = { 0, nt }, kv[2] = { 0, nt };
    struct rx_model_batch b = { .struct_size = sizeof b, .n_tokens = nt, .tokens = toks, .pos = pos, .n_seq = 1,
                                .q_start = q, .kv_start = kv, .kv_slots = pos, .n_out = r->n, .out_rows = orow };
    struct rx_err err = { 0 };
    cr_assert_eq (rx_engine_forward (e->ref, &b, lg, &err), RX_OK, "%s", err.msg);
    for (int t = 0; t < r->n; t++) {
        const float *x = lg + (size_t) t * e->V;
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < e->V; i++) mx = fmax (mx, x[i]);
        for (int i = 0; i < e->V; i++) sum += exp ((double) x[i] - mx);
        const double lse = mx + log (sum);
        cr_assert_float_eq (r->lp[t], x[r->ids[t]] - lse, 1e-4, "%s token %d: %g vs %g", what, t, r->lp[t],
                            x[r->ids[t]] - lse);
        for (int j = 0; j < n_top && j < 5; j++) {
            const int32_t id = r->top_ids[t][j];
            cr_assert (id >= 0 && id < e->V, "%s token %d top %d: %d", what, t, j, id);
            cr_assert_float_eq (r->top_lp[t][j], x[id] - lse, 1e-4, "%s token %d top %d", what, t, j);
            if (j > 0) {   /* best first, the lower id first on ties */
                const int32_t pid = r->top_ids[t][j - 1];
                cr_assert (x[pid] > x[id] || (x[pid] == x[id] && pid < id), "%s token %d: top %d out of order",
                           what, t, j);
            }
        }
        if (n_top > 0) {   /* nothing outside the list beats its last */
            const int32_t last = r->top_ids[t][(n_top < 5 ? n_top : 5) - 1];
            int better = 0;
            for (int i = 0; i < e->V; i++) better += x[i] > x[last];
            cr_assert_lt (better, n_top < 5 ? n_top : 5, "%s token %d: %d tokens beat the top list", what, t, better);
        }
    }
    free (toks);
    free (pos);
    free (orow);
    free (lg);
}

Test (scheduler, device_sampling_logprobs_at_temperature_one_from_candidates)
{
    struct env e;
    s_env_open (&e);
    int32_t p[DS_NQ][DS_NP];
    s_ds_prompts (p, 7373);
    /* off; on with 64 candidates; on with 4 (top_logprobs 5 > 4: the row) */
    static const int32_t ds[] = { 0, 1, 1 }, ks[] = { 64, 64, 4 };
    struct run *run[3];
    struct rx_sched_stats st[3];
    s_lp_k = 5;
    for (int m = 0; m < 3; m++) {
        run[m] = calloc (1, sizeof *run[m]);
        s_ds_run (&e, ds[m], ks[m], p, s_tw_lpc, run[m], &st[m]);
    }
    cr_assert_eq (st[0].cand_lp_rows, 0, "device sampling off");
    /* every request, every step */
    cr_assert_eq (st[1].cand_lp_rows, (uint64_t) DS_NQ * DS_NG, "%llu", (unsigned long long) st[1].cand_lp_rows);
    cr_assert_leq (st[1].cand_lp_full, st[1].cand_full + st[1].cand_tail,
                   "with 64 candidates only a draw past them fetches a row");
    cr_assert_eq (st[2].cand_lp_rows, 0, "top_logprobs 5 > 4 candidates: every logprob row is read whole");
    for (int i = 0; i < DS_NQ; i++)
        for (int m = 0; m < 3; m++) {
            struct res *r = s_res (run[m], 100 + (uint64_t) i, 0);
            char what[64];
            snprintf (what, sizeof what, "mode %d request %d (kind %d)", m, i, i % 4);
            cr_assert_eq (r->n, DS_NG, "%s", what);
            s_lp_check (&e, p[i], r, 5, what);
            if (i % 4 != 2)
                cr_assert_arr_eq (r->ids, s_res (run[0], 100 + (uint64_t) i, 0)->ids, sizeof r->ids[0] * DS_NG,
                                  "%s: the host path's tokens", what);
        }
    cr_log_info ("logprobs from candidates: %llu rows, %llu read whole", (unsigned long long) st[1].cand_lp_rows,
                 (unsigned long long) st[1].cand_lp_full);
    for (int m = 0; m < 3; m++) free (run[m]);
    s_env_close (&e);
}

/* Penalized rows from candidates (rx_cands_penalized): greedy and top_k
 * rows with frequency / presence / repetition penalties and boosts draw
 * exactly the host path's tokens with 64 candidates; with 4 (the head
 * often empty or short: whole rows, where a sampled row draws a second
 * uniform) greedy rows still do; and the penalties do change the text
 * (else this would test nothing).  (exp's overflow under a boost at a low
 * temperature, and a mass penalized away: test_sampling.) */
static int s_pen_plain;   /* 1: the same requests without their penalties */
static int s_greedy_kind (int i) { return i % 8 <= 2 || i % 8 == 6; }
static void s_tw_pen (struct rx_request *r)
{
    const int i = s_ds_i;
    r->sp.has_seed = 1;
    r->sp.seed = 5100 + (uint64_t) i;
    switch (i % 8) {
    case 0: r->sp.temperature = 0; r->sp.frequency_penalty = -1.0f; break;                    /* boosts */
    case 1: r->sp.temperature = 0; r->sp.repetition_penalty = 0.5f; break;
    case 2: r->sp.temperature = 0; r->sp.presence_penalty = -1.5f; break;
    case 3: r->sp.temperature = 1.0f; r->sp.top_k = 10; r->sp.presence_penalty = 1.0f; break;
    case 4: r->sp.temperature = 0.7f; r->sp.top_k = 40; r->sp.repetition_penalty = 1.5f; r->sp.frequency_penalty = 0.5f;
            break;
    case 5: r->sp.temperature = 1.2f; r->sp.frequency_penalty = 1.0f; break;                  /* plain: other draws */
    case 6: r->sp.temperature = 0; r->sp.presence_penalty = -2.0f; r->sp.frequency_penalty = 2.0f;   /* net +2 x count - 2 */
            r->sp.repetition_penalty = 0.7f; break;
    case 7: r->sp.temperature = 0.5f; r->sp.top_k = 5; r->sp.frequency_penalty = -2.0f; break;
    }
    if (s_pen_plain) r->sp.frequency_penalty = r->sp.presence_penalty = 0, r->sp.repetition_penalty = 1;
}

Test (scheduler, device_sampling_penalized_rows_from_candidates)
{
    struct env e;
    s_env_open (&e);
    int32_t p[DS_NQ][DS_NP];
    s_ds_prompts (p, 8484);
    /* off, on with 64 candidates, on again, on with 4, off without penalties */
    static const int32_t ds[] = { 0, 1, 1, 1, 0 }, ks[] = { 64, 64, 64, 4, 64 };
    struct run *run[5];
    struct rx_sched_stats st[5];
    for (int m = 0; m < 5; m++) {
        run[m] = calloc (1, sizeof *run[m]);
        s_pen_plain = m == 4;
        s_ds_run (&e, ds[m], ks[m], p, s_tw_pen, run[m], &st[m]);
    }
    s_pen_plain = 0;
    cr_assert_eq (st[0].cand_rows, 0);
    cr_assert_eq (st[1].cand_rows, (uint64_t) DS_NQ * DS_NG, "every penalized row took candidates: %llu",
                  (unsigned long long) st[1].cand_rows);
    cr_assert_eq (st[3].cand_rows, (uint64_t) DS_NQ * DS_NG);
    /* with 4 candidates the head is often empty or too short: whole rows */
    cr_assert_gt (st[3].cand_full + st[3].cand_tail, 0);
    cr_assert_eq (st[2].cand_full, st[1].cand_full);
    cr_assert_eq (st[2].cand_tail, st[1].cand_tail);
    int changed = 0;
    for (int i = 0; i < DS_NQ; i++) {
        struct res *off = s_res (run[0], 100 + (uint64_t) i, 0);
        for (int m = 1; m < 4; m++) {
            struct res *r = s_res (run[m], 100 + (uint64_t) i, 0);
            cr_assert_eq (r->n, DS_NG, "mode %d request %d", m, i);
            for (int t = 0; t < DS_NG; t++) cr_assert (r->ids[t] >= 0 && r->ids[t] < e.V);
            if (i % 8 != 5 && (m < 3 || s_greedy_kind (i)))   /* whole rows draw a second uniform */
                for (int t = 0; t < DS_NG; t++)
                    cr_assert_eq (r->ids[t], off->ids[t], "mode %d request %d (kind %d) token %d: %d, host %d", m, i,
                                  i % 8, t, r->ids[t], off->ids[t]);
        }
        cr_assert_arr_eq (s_res (run[1], 100 + (uint64_t) i, 0)->ids, s_res (run[2], 100 + (uint64_t) i, 0)->ids,
                          sizeof off->ids[0] * DS_NG, "request %d: reproducible", i);
        if (i % 8 != 5)   /* the penalties' own effect (5: other draws anyway) */
            changed += memcmp (off->ids, s_res (run[4], 100 + (uint64_t) i, 0)->ids, sizeof off->ids[0] * DS_NG) != 0;
    }
    /* the random model's logits are far apart: penalties of at most 2 move
     * the argmax or a top_k draw of about half of these requests */
    cr_assert_geq (changed, 5, "the penalties changed only %d of 14 texts", changed);
    cr_log_info ("penalized rows: %llu from candidates (%llu full, %llu tail); with 4: %llu full, %llu tail",
                 (unsigned long long) st[1].cand_rows, (unsigned long long) st[1].cand_full,
                 (unsigned long long) st[1].cand_tail, (unsigned long long) st[3].cand_full,
                 (unsigned long long) st[3].cand_tail);
    for (int m = 0; m < 5; m++) free (run[m]);
    s_env_close (&e);
}

/* A min_tokens ban from candidates: EOS and the stop ids gathered and set
 * to -inf like the host path's ban.  The stop ids are the tokens a plain
 * greedy run chose, so the ban must change the text; greedy and top_k
 * rows then equal the host path's tokens, and every row took candidates. */
static int32_t s_ban_ids[DS_NQ][4];
static int s_ban_on;
static void s_tw_ban (struct rx_request *r)
{
    const int i = s_ds_i;
    r->sp.has_seed = 1;
    r->sp.seed = 6200 + (uint64_t) i;
    r->sp.temperature = i % 2 ? 1.0f : 0;
    r->sp.top_k = i % 2 ? 8 : -1;
    if (!s_ban_on) return;
    r->sp.min_tokens = DS_NG;
    r->sp.n_stop_ids = 4;
    memcpy (r->sp.stop_ids, s_ban_ids[i], sizeof s_ban_ids[i]);
}

Test (scheduler, device_sampling_min_tokens_ban_from_candidates)
{
    struct env e;
    s_env_open (&e);
    int32_t p[DS_NQ][DS_NP];
    s_ds_prompts (p, 9595);
    struct run *run[3];
    struct rx_sched_stats st[3];
    /* plain (host path), then banned: off, on */
    for (int m = 0; m < 3; m++) {
        run[m] = calloc (1, sizeof *run[m]);
        s_ban_on = m > 0;
        if (m == 1)   /* ban what the plain run chose: its 1st, 2nd, 4th and 6th tokens */
            for (int i = 0; i < DS_NQ; i++) {
                const struct res *q = s_res (run[0], 100 + (uint64_t) i, 0);
                const int32_t pick[4] = { q->ids[0], q->ids[1], q->ids[3], q->ids[5] };
                memcpy (s_ban_ids[i], pick, sizeof pick);
            }
        s_ds_run (&e, m == 2, 64, p, s_tw_ban, run[m], &st[m]);
    }
    s_ban_on = 0;
    cr_assert_eq (st[2].cand_rows, (uint64_t) DS_NQ * DS_NG, "every banned row from candidates: %llu",
                  (unsigned long long) st[2].cand_rows);
    int changed = 0;
    for (int i = 0; i < DS_NQ; i++) {
        const struct res *plain = s_res (run[0], 100 + (uint64_t) i, 0), *off = s_res (run[1], 100 + (uint64_t) i, 0),
                         *on = s_res (run[2], 100 + (uint64_t) i, 0);
        cr_assert_eq (on->n, DS_NG);
        for (int t = 0; t < DS_NG; t++) {
            cr_assert_eq (on->ids[t], off->ids[t], "request %d token %d: %d, the host's %d", i, t, on->ids[t],
                          off->ids[t]);
            for (int b = 0; b < 4; b++)
                cr_assert_neq (on->ids[t], s_ban_ids[i][b], "request %d token %d: a banned id", i, t);
        }
        changed += memcmp (plain->ids, on->ids, sizeof on->ids[0] * DS_NG) != 0;
    }
    cr_assert_eq (changed, DS_NQ, "the ban changed %d of %d texts", changed, DS_NQ);
    for (int m = 0; m < 3; m++) free (run[m]);
    s_env_close (&e);
}

/* sampling_candidates = 2: plain sampling at T 1.5 falls past two
 * candidates often (RX_CANDS_TAIL: the row is fetched, the two banned),
 * top_p 0.99 needs more than two (RX_CANDS_FULL), top_k 3 > 2 always
 * does; top_k 2 stays on the candidates.  Every request still runs to
 * max_tokens with ids in the vocabulary, the bookkeeping check passing
 * each step (s_drain), and a seed gives the same tokens run to run. */
static void s_tw_k2 (struct rx_request *r)
{
    const int i = s_ds_i;
    r->sp.has_seed = 1;
    r->sp.seed = 300 + (uint64_t) i;
    switch (i % 4) {
    case 0: r->sp.temperature = 1.5f; break;
    case 1: r->sp.temperature = 1.5f; r->sp.top_p = 0.99f; break;
    case 2: r->sp.temperature = 1.0f; r->sp.top_k = 3; break;
    case 3: r->sp.temperature = 1.0f; r->sp.top_k = 2; break;
    }
}

Test (scheduler, two_candidates_fall_back_to_the_whole_row_and_still_finish)
{
    struct env e;
    s_env_open (&e);
    int32_t p[DS_NQ][DS_NP];
    s_ds_prompts (p, 6262);
    struct run *run[2];
    struct rx_sched_stats st[2];
    for (int m = 0; m < 2; m++) {
        run[m] = calloc (1, sizeof *run[m]);
        s_ds_run (&e, 1, 2, p, s_tw_k2, run[m], &st[m]);
    }
    cr_assert_eq (st[0].cand_rows, (uint64_t) DS_NQ * DS_NG, "every row drew from candidates");
    cr_assert_gt (st[0].cand_tail, 0, "plain draws past 2 candidates");
    /* top_k 3 (4 requests) always; top_p 0.99 mostly */
    cr_assert_gt (st[0].cand_full, (uint64_t) (DS_NQ / 4) * DS_NG, "full: %llu", (unsigned long long) st[0].cand_full);
    cr_assert_leq (st[0].cand_full + st[0].cand_tail, st[0].cand_rows);
    cr_log_info ("k 2: %llu candidate rows, %llu full, %llu tail", (unsigned long long) st[0].cand_rows,
                 (unsigned long long) st[0].cand_full, (unsigned long long) st[0].cand_tail);
    for (int i = 0; i < DS_NQ; i++) {
        struct res *a = s_res (run[0], 100 + (uint64_t) i, 0), *b = s_res (run[1], 100 + (uint64_t) i, 0);
        cr_assert_eq (a->n, DS_NG, "request %d ran to max_tokens", i);
        cr_assert_eq (a->finish, RX_FINISH_LENGTH);
        for (int t = 0; t < DS_NG; t++) cr_assert (a->ids[t] >= 0 && a->ids[t] < e.V, "request %d token %d", i, t);
        cr_assert_arr_eq (a->ids, b->ids, sizeof a->ids[0] * DS_NG, "request %d: reproducible", i);
    }
    free (run[0]);
    free (run[1]);
    s_env_close (&e);
}

/* The INI keys reach rx_sched_opts; a bad value is refused when the
 * config is read (the key's range / choices) and a bad option by
 * rx_sched_new, each with one line naming sampling_candidates or
 * device_sampling. */
static int s_ds_conf (const char *ini, struct rx_sched_opts *o, struct rx_err *err)
{
    char *dir = tu_tmpdir ();
    char *path = tu_path (dir, "s.ini");
    tu_write (path, ini);
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_boot b;
    int rc = rx_boot_open (&b, path, 0, err);
    if (rc == RX_OK) {
        cr_assert_eq (rx_sched_opts_from_conf (b.conf, o, err), RX_OK, "%s", err->msg);
        rx_boot_close (&b);
    }
    free (path);
    free (dir);
    return rc;
}

Test (scheduler, device_sampling_conf_keys_and_bad_candidate_counts)
{
    struct rx_sched_opts o;
    struct rx_err err = { 0 };
    cr_assert_eq (s_ds_conf ("[scheduler]\ndevice_sampling = on\nsampling_candidates = 100\n", &o, &err), RX_OK, "%s",
                  err.msg);
    cr_assert_eq (o.device_sampling, 1);
    cr_assert_eq (o.sampling_candidates, 100);
    cr_assert_eq (s_ds_conf ("[scheduler]\ndevice_sampling = off\nsampling_candidates = 4096\n", &o, &err), RX_OK,
                  "%s", err.msg);
    cr_assert_eq (o.device_sampling, 0);
    cr_assert_eq (o.sampling_candidates, 4096);
    cr_assert_eq (s_ds_conf ("[scheduler]\ndevice_sampling = auto\nsampling_candidates = 1\n", &o, &err), RX_OK, "%s",
                  err.msg);
    cr_assert_eq (o.device_sampling, -1);
    cr_assert_eq (o.sampling_candidates, 1);
    cr_assert_eq (s_ds_conf ("[scheduler]\npolicy = fcfs\n", &o, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (o.device_sampling, -1, "default auto");
    cr_assert_eq (o.sampling_candidates, 64, "default 64");
    static const struct { const char *ini, *key; } bad[] = {
        { "[scheduler]\ndevice_sampling = maybe\n", "device_sampling" },
        { "[scheduler]\nsampling_candidates = 0\n", "sampling_candidates" },
        { "[scheduler]\nsampling_candidates = 5000\n", "sampling_candidates" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset (&err, 0, sizeof err);
        cr_assert_neq (s_ds_conf (bad[i].ini, &o, &err), RX_OK, "%s accepted", bad[i].ini);
        cr_assert (strstr (err.msg, bad[i].key), "\"%s\" lacks %s", err.msg, bad[i].key);
        cr_assert_null (strchr (err.msg, '\n'), "one line: %s", err.msg);
    }

    struct env e;
    s_env_open (&e);
    static const int32_t ks[] = { 0, 5000, -3 };
    for (int ds = -1; ds <= 1; ds += 2)   /* on, and auto (checked whatever it resolves to) */
        for (size_t i = 0; i < 3; i++) {
            o = s_opts (&e, "fcfs");
            o.device_sampling = ds;
            o.sampling_candidates = ks[i];
            memset (&err, 0, sizeof err);
            cr_assert_null (rx_sched_new (&e.boot, e.eng, &o, &err), "device_sampling %d, %d candidates", ds, ks[i]);
            cr_assert_eq (err.code, RX_EINVAL);
            cr_assert (strstr (err.msg, "sampling_candidates"), "%s", err.msg);
            cr_assert_null (strchr (err.msg, '\n'));
        }
    /* the bounds themselves (tiny-llama's 32000 tokens: 4096 is not capped) */
    static const int32_t good[] = { 1, RX_SCHED_MAX_CANDIDATES };
    for (int i = 0; i < 2; i++) {
        o = s_opts (&e, "fcfs");
        o.device_sampling = 1;
        o.sampling_candidates = good[i];
        rx_sched_t *s = s_sched (&e, &o);
        int32_t pr[4] = { 1, 50, 60, 70 };
        s_ds_i = 3;
        s_submit (s, 1, pr, 4, 5, s_tw_k2);   /* top_k 2 */
        struct run *run = calloc (1, sizeof *run);
        s_drain (s, run, 50);
        cr_assert_eq (s_res (run, 1, 0)->n, 5);
        struct rx_sched_stats st;
        rx_sched_stats (s, &st);
        cr_assert_eq (st.cand_rows, 5);
        /* k 1 < top_k 2: the whole row every step; k 4096: never */
        cr_assert_eq (st.cand_full, good[i] == 1 ? 5u : 0u, "k %d: %llu full", good[i],
                      (unsigned long long) st.cand_full);
        free (run);
        rx_sched_destroy (&s);
    }
    s_env_close (&e);
}
