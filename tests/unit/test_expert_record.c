/* tests/unit/test_expert_record.c -- EPLB at run time (core/expert_record.h,
 * models/moe_place.h, the placement in model-llama / model-deepseek2):
 *   - the sliding window: sums, eviction, reset, bad sizes;
 *   - the dump is a load file core/eplb.c reads back (same counts), with
 *     balancedness per layer when a placement is given;
 *   - models/moe_place.h: the copy choice (t + rank) % logcnt, counting,
 *     bad placements refused with one line;
 *   - the engine on tiny-moe: recorded counts sum to tokens x k x layers,
 *     and layer 0's per-expert counts of single-token steps equal the top-2
 *     this test computes itself on the host from the GGUF weights
 *     (embedding, attention of one position = its V, router);
 *   - a static placement with redundant copies (tiny-moe, tiny-deepseek2)
 *     gives the same logits as none; bad init_expert_location files fail
 *     the engine with one line naming the file. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <radix/model.h>
#include <radix/moe.h>

#include "boot.h"
#include "engine.h"
#include "eplb.h"
#include "expert_record.h"
#include "gguf.h"
#include "ipc_msg.h"
#include "quant.h"
#include "../../models/moe_place.h"
#include "../testutil.h"

/* ------------------------------------------------------------- the window */

Test (expert_record, window_sums_and_evicts)
{
    struct rx_err err = { 0 };
    rx_expert_record_t *r = rx_expert_record_new (2, 3, 3, &err);
    cr_assert_not_null (r, "%s", err.msg);
    int64_t s1[6] = { 1, 0, 0, 0, 2, 0 }, s2[6] = { 0, 5, 0, 1, 1, 1 }, s3[6] = { 1, 1, 1, 0, 0, 0 },
            s4[6] = { 0, 0, 7, 0, 0, 9 };
    rx_expert_record_add (r, s1);
    rx_expert_record_add (r, s2);
    rx_expert_record_add (r, s3);
    const int64_t w3[6] = { 2, 6, 1, 1, 3, 1 };
    cr_assert_eq (rx_expert_record_steps (r), 3);
    cr_assert_arr_eq (rx_expert_record_sum (r), w3, sizeof w3);
    rx_expert_record_add (r, s4);   /* s1 leaves */
    const int64_t w4[6] = { 1, 6, 8, 1, 1, 10 };
    cr_assert_eq (rx_expert_record_steps (r), 3);
    cr_assert_eq (rx_expert_record_total_steps (r), 4);
    cr_assert_arr_eq (rx_expert_record_sum (r), w4, sizeof w4);
    rx_expert_record_add (r, s1);   /* s2 leaves */
    rx_expert_record_add (r, s1);   /* s3 leaves */
    const int64_t w6[6] = { 2, 0, 7, 0, 4, 9 };
    cr_assert_arr_eq (rx_expert_record_sum (r), w6, sizeof w6);
    rx_expert_record_reset (r);
    const int64_t z[6] = { 0 };
    cr_assert_eq (rx_expert_record_steps (r), 0);
    cr_assert_arr_eq (rx_expert_record_sum (r), z, sizeof z);
    rx_expert_record_add (r, s2);
    cr_assert_arr_eq (rx_expert_record_sum (r), s2, sizeof s2);
    rx_expert_record_free (&r);
    cr_assert_null (r);
    rx_expert_record_free (&r);   /* NULL is a no-op */
}

Test (expert_record, bad_sizes)
{
    const int32_t bad[][3] = { { 0, 4, 10 }, { 2, 0, 10 }, { 2, 4, 0 }, { -1, 4, 10 }, { 4096, 8192, 1 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct rx_err err = { 0 };
        cr_assert_null (rx_expert_record_new (bad[i][0], bad[i][1], bad[i][2], &err));
        cr_assert_eq (err.code, RX_EINVAL);
        cr_assert (strstr (err.msg, "expert record"), "%s", err.msg);
    }
}

/* The dump is a load file (core/eplb.h) and carries the documented members. */
Test (expert_record, dump_reads_back_as_a_load_file)
{
    struct rx_err err = { 0 };
    rx_expert_record_t *r = rx_expert_record_new (2, 4, 10, &err);
    cr_assert_not_null (r);
    int64_t s[8] = { 10, 0, 0, 2, 1, 1, 1, 1 };
    rx_expert_record_add (r, s);
    rx_expert_record_add (r, s);
    /* 2 GPUs; layer 0 loads {20,0,0,4}: GPU0 {20,0} GPU1 {0,4}: 12/20 = 0.6 */
    const int32_t phy[8] = { 0, 1, 2, 3, 0, 1, 2, 3 };
    struct rx_placement *p = rx_placement_new (2, 4, 4, phy, &err);
    cr_assert_not_null (p, "%s", err.msg);
    char *dir = tu_tmpdir (), *path = tu_path (dir, "d.json");
    FILE *f = fopen (path, "w");
    cr_assert_not_null (f);
    cr_assert_eq (rx_expert_record_write (r, f, p, 2, &err), RX_OK, "%s", err.msg);
    fclose (f);
    double *load = NULL;
    int32_t nl = 0, ne = 0;
    cr_assert_eq (rx_eplb_load_read (path, &load, &nl, &ne, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (nl, 2);
    cr_assert_eq (ne, 4);
    const double want[8] = { 20, 0, 0, 4, 2, 2, 2, 2 };
    for (int i = 0; i < 8; i++) cr_assert_eq (load[i], want[i], "load[%d] = %g", i, load[i]);
    free (load);
    json_error_t je;
    json_t *o = json_load_file (path, 0, &je);
    cr_assert_not_null (o, "%s", je.text);
    cr_assert_eq (json_integer_value (json_object_get (o, "n_steps")), 2);
    cr_assert_eq (json_integer_value (json_object_get (o, "layers")), 2);
    cr_assert_eq (json_integer_value (json_object_get (o, "experts")), 4);
    cr_assert_eq (json_integer_value (json_array_get (json_object_get (o, "tokens_per_layer"), 0)), 24);
    json_t *b = json_object_get (o, "balancedness");
    cr_assert (fabs (json_real_value (json_array_get (b, 0)) - 0.6) < 1e-6);
    cr_assert (fabs (json_real_value (json_array_get (b, 1)) - 1.0) < 1e-6);
    json_decref (o);
    rx_placement_free (&p);
    rx_expert_record_free (&r);
    remove (path);
    remove (dir);
    free (path);
    free (dir);
}

/* ------------------------------------------------------- models/moe_place.h */

/* 1 layer, 3 experts, 5 slots: expert 0 in slots {0, 3}, expert 2 in {2, 4}. */
static const int32_t s_p2l[5] = { 0, 1, 2, 0, 2 };
static const int32_t s_cnt[3] = { 2, 1, 2 };
static const int32_t s_l2p[6] = { 0, 3, 1, -1, 2, 4 };

static struct rx_moe_placement s_pl (void)
{
    return (struct rx_moe_placement) {
        .struct_size = sizeof (struct rx_moe_placement), .n_layer = 1, .n_logical = 3, .n_physical = 5,
        .max_copies = 2, .phy2log = s_p2l, .logcnt = s_cnt, .log2phy = s_l2p,
    };
}

Test (moe_place, copies_alternate_by_row_and_rank)
{
    struct rx_moe_place mp = { 0 };
    struct rx_err err = { 0 };
    struct rx_moe_placement pl = s_pl ();
    cr_assert_eq (rx_moe_place_set (&mp, "t", &pl, 1, 3, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_moe_place_n_physical (&mp, 3), 5);
    /* 4 rows, k = 2 */
    int32_t ids[8] = { 0, 1, 0, 2, 2, 0, 1, 2 };
    rx_moe_place_map (&mp, 0, ids, 4, 2, 0);
    /* row t: copy (t + 0) % cnt */
    const int32_t want0[8] = { 0, 1, 3, 4, 2, 0, 1, 4 };
    cr_assert_arr_eq (ids, want0, sizeof want0);
    int32_t ids1[8] = { 0, 1, 0, 2, 2, 0, 1, 2 };
    rx_moe_place_map (&mp, 0, ids1, 4, 2, 1);   /* rank 1: shifted by one */
    const int32_t want1[8] = { 3, 1, 0, 2, 4, 3, 1, 2 };
    cr_assert_arr_eq (ids1, want1, sizeof want1);
    for (int s = 0; s < 5; s++) cr_assert_eq (rx_moe_place_logical (&mp, 0, s), s_p2l[s]);
    /* identity */
    cr_assert_eq (rx_moe_place_set (&mp, "t", NULL, 1, 3, &err), RX_OK);
    int32_t id2[2] = { 2, 1 };
    rx_moe_place_map (&mp, 0, id2, 1, 2, 0);
    cr_assert (id2[0] == 2 && id2[1] == 1);
    cr_assert_eq (rx_moe_place_logical (&mp, 0, 2), 2);
}

Test (moe_place, counts_logical_choices)
{
    int64_t cnt[2 * 3] = { 0 };
    struct rx_model_env env = { .struct_size = sizeof env, .expert_count = cnt, .expert_count_layers = 2,
                                .expert_count_experts = 3 };
    struct rx_moe_place mp;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_moe_place_init (&mp, "t", &env, 2, 3, &err), RX_OK, "%s", err.msg);
    const int32_t ids[6] = { 0, 1, 0, 2, 2, 1 };
    rx_moe_place_count (&mp, 1, ids, 3, 2);
    rx_moe_place_count (&mp, 1, ids, 1, 2);
    const int64_t want[6] = { 0, 0, 0, 3, 3, 2 };
    cr_assert_arr_eq (cnt, want, sizeof want);
    /* an array too small for the model */
    cr_assert_eq (rx_moe_place_init (&mp, "model-x", &env, 3, 3, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "model-x") && strstr (err.msg, "3 MoE layers"), "%s", err.msg);
    /* no array: nothing counted, no error */
    env.expert_count = NULL;
    cr_assert_eq (rx_moe_place_init (&mp, "t", &env, 2, 3, &err), RX_OK);
    rx_moe_place_count (&mp, 0, ids, 3, 2);
    cr_assert_arr_eq (cnt, want, sizeof want);
}

Test (moe_place, bad_placements)
{
    struct rx_moe_place mp = { 0 };
    struct rx_err err = { 0 };
    struct rx_moe_placement pl = s_pl ();
    cr_assert_eq (rx_moe_place_set (&mp, "model-x", &pl, 2, 3, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "model-x") && strstr (err.msg, "2 MoE layers x 3 experts"), "%s", err.msg);
    cr_assert_eq (rx_moe_place_set (&mp, "model-x", &pl, 1, 4, &err), RX_EINVAL);
    int32_t p2l[5] = { 0, 1, 2, 0, 7 };
    pl.phy2log = p2l;
    cr_assert_eq (rx_moe_place_set (&mp, "model-x", &pl, 1, 3, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "slot 4 holds expert 7"), "%s", err.msg);
    pl = s_pl ();
    int32_t cnt[3] = { 2, 0, 2 };
    pl.logcnt = cnt;
    cr_assert_eq (rx_moe_place_set (&mp, "model-x", &pl, 1, 3, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "0 copies"), "%s", err.msg);
    pl = s_pl ();
    pl.log2phy = NULL;
    cr_assert_eq (rx_moe_place_set (&mp, "model-x", &pl, 1, 3, &err), RX_EINVAL);
    cr_assert_null (mp.pl, "a refused placement is not taken");
}

/* ------------------------------------------------------------- the engine */

static char *s_model (const char *name)
{
    TU_REQUIRE_SHARED ();
    char *dir = tu_path (tu_env ("RADIX_SHARED"), "data/models");
    char *p = tu_path (dir, name);
    free (dir);
    return p;
}

static void s_boot (struct rx_boot *b, const char *ini_text)
{
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_err err = { 0 };
    char *dir = tu_tmpdir (), *path = tu_path (dir, "t.ini");
    tu_write (path, ini_text ? ini_text : "");
    cr_assert_eq (rx_boot_open (b, path, 0, &err), RX_OK, "%s", err.msg);
    if (!rx_conf_raw (b->conf, "kernels", "threads", NULL))
        cr_assert_eq (rx_conf_set (b->conf, "kernels", "threads", "1", &err), RX_OK, "%s", err.msg);
    remove (path);
    remove (dir);
    free (path);
    free (dir);
}

static rx_engine_t *s_engine (struct rx_boot *b, const char *ini, const char *model)
{
    s_boot (b, ini);
    struct rx_err err = { 0 };
    struct rx_engine_opts o = { .model_path = model, .n_slots = 256, .max_tokens = 64 };
    rx_engine_t *e = rx_engine_new (b, &o, &err);
    cr_assert_not_null (e, "%s", err.msg);
    return e;
}

/* Dump through the control and read the load back. */
static double *s_dump (rx_engine_t *e, int32_t *nl, int32_t *ne)
{
    struct rx_err err = { 0 };
    char msg[768];
    cr_assert_eq (rx_eplb_rt_control (rx_engine_eplb (e), RX_EPLB_DUMP, msg, sizeof msg, &err), RX_OK, "%s",
                  err.msg);
    double *load = NULL;
    cr_assert_eq (rx_eplb_load_read (msg, &load, nl, ne, &err), RX_OK, "%s", err.msg);
    remove (msg);
    return load;
}

static char *s_ini_dir (char **dir)
{
    *dir = tu_tmpdir ();
    char *ini = NULL;
    cr_assert (asprintf (&ini, "[eplb]\nrecord_dir = %s\n", *dir) > 0);
    return ini;
}

/* Host reference of tiny-moe's layer-0 router for one token at position 0:
 * attention over one position is that position's V, so
 * x1 = x + Wo (V heads repeated over the query groups), h = rms(x1) * ffn_norm,
 * logits = Wr h; returns the top-2 (distinct) expert ids. */
static float *s_f32 (const rx_gguf_t *g, const char *name, uint64_t *n)
{
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, name);
    cr_assert_not_null (t, "%s", name);
    cr_assert_eq (t->type, RX_F32, "%s is not F32", name);
    *n = t->n_elements;
    return (float *) t->data;
}

static void s_rms (const float *x, const float *w, float *y, int n, float eps)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += (double) x[i] * x[i];
    float r = (float) (1.0 / sqrt (s / n + eps));
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void s_ref_top2 (const rx_gguf_t *g, int32_t tok, int32_t top[2])
{
    uint32_t E, nh, nkv;
    float eps;
    cr_assert_eq (rx_gguf_get_u32 (g, "llama.embedding_length", &E), RX_OK);
    cr_assert_eq (rx_gguf_get_u32 (g, "llama.attention.head_count", &nh), RX_OK);
    cr_assert_eq (rx_gguf_get_u32 (g, "llama.attention.head_count_kv", &nkv), RX_OK);
    cr_assert_eq (rx_gguf_get_f32 (g, "llama.attention.layer_norm_rms_epsilon", &eps), RX_OK);
    const uint32_t hd = E / nh;
    const struct rx_gguf_tensor *te = rx_gguf_find_tensor (g, "token_embd.weight");
    cr_assert_not_null (te);
    float x[256], a[256], v[256], o[256], h[256];
    cr_assert (E <= 256);
    for (uint32_t i = 0; i < E; i++) {
        if (te->type == RX_F16) {
            uint16_t b;
            memcpy (&b, (const uint8_t *) te->data + ((size_t) tok * E + i) * 2, 2);
            x[i] = rx_fp16_to_fp32 (b);
        } else
            x[i] = ((const float *) te->data)[(size_t) tok * E + i];
    }
    uint64_t n;
    s_rms (x, s_f32 (g, "blk.0.attn_norm.weight", &n), a, (int) E, eps);
    const float *wv = s_f32 (g, "blk.0.attn_v.weight", &n);   /* [E][nkv*hd] */
    for (uint32_t j = 0; j < nkv * hd; j++) {
        double s = 0;
        for (uint32_t i = 0; i < E; i++) s += (double) wv[(size_t) j * E + i] * a[i];
        v[j] = (float) s;
    }
    for (uint32_t q = 0; q < nh; q++)   /* query head q reads KV head q / (nh / nkv) */
        memcpy (o + q * hd, v + (q / (nh / nkv)) * hd, hd * sizeof (float));
    const float *wo = s_f32 (g, "blk.0.attn_output.weight", &n);
    for (uint32_t j = 0; j < E; j++) {
        double s = 0;
        for (uint32_t i = 0; i < E; i++) s += (double) wo[(size_t) j * E + i] * o[i];
        x[j] += (float) s;
    }
    s_rms (x, s_f32 (g, "blk.0.ffn_norm.weight", &n), h, (int) E, eps);
    const float *wr = s_f32 (g, "blk.0.ffn_gate_inp.weight", &n);
    const uint32_t NE = (uint32_t) (n / E);
    double lg[64];
    for (uint32_t e = 0; e < NE; e++) {
        double s = 0;
        for (uint32_t i = 0; i < E; i++) s += (double) wr[(size_t) e * E + i] * h[i];
        lg[e] = s;
    }
    top[0] = top[1] = -1;
    for (int k = 0; k < 2; k++)
        for (uint32_t e = 0; e < NE; e++)
            if ((int32_t) e != top[0] && (top[k] < 0 || lg[e] > lg[top[k]])) top[k] = (int32_t) e;
}

Test (expert_record_engine, counts_match_tokens_and_host_top2)
{
    char *model = s_model ("tiny-moe.gguf"), *dir;
    char *ini = s_ini_dir (&dir);
    struct rx_boot b;
    rx_engine_t *e = s_engine (&b, ini, model);
    struct rx_err err = { 0 };
    char msg[768];
    cr_assert_eq (rx_eplb_rt_control (rx_engine_eplb (e), RX_EPLB_START, msg, sizeof msg, &err), RX_OK, "%s",
                  err.msg);
    /* single-token steps at position 0: layer 0 is checkable on the host */
    const int32_t toks[] = { 1, 450, 3681, 17, 29871, 1000, 2, 777 };
    const int NT = (int) (sizeof toks / sizeof toks[0]);
    int64_t want0[4] = { 0 };
    for (int i = 0; i < NT; i++) {
        int seq = rx_engine_seq_new (e, 4, &err);
        cr_assert_geq (seq, 0, "%s", err.msg);
        struct rx_engine_req r = { .seq = seq, .n_tokens = 1, .tokens = &toks[i] };
        cr_assert_eq (rx_engine_step (e, &r, 1, NULL, &err), RX_OK, "%s", err.msg);
        rx_engine_seq_free (e, seq);
        int32_t top[2];
        s_ref_top2 (rx_engine_gguf (e), toks[i], top);
        want0[top[0]]++;
        want0[top[1]]++;
    }
    /* and one 5-token prefill + 3 decode steps */
    int seq = rx_engine_seq_new (e, 16, &err);
    const int32_t p[5] = { 1, 100, 200, 300, 400 };
    struct rx_engine_req r = { .seq = seq, .n_tokens = 5, .tokens = p };
    cr_assert_eq (rx_engine_step (e, &r, 1, NULL, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        r.n_tokens = 1;
        r.tokens = &p[i];
        cr_assert_eq (rx_engine_step (e, &r, 1, NULL, &err), RX_OK, "%s", err.msg);
    }
    int32_t nl, ne;
    double *load = s_dump (e, &nl, &ne);
    cr_assert_eq (nl, 2);
    cr_assert_eq (ne, 4);
    for (int l = 0; l < 2; l++) {
        double s = 0;
        for (int x = 0; x < 4; x++) s += load[l * 4 + x];
        cr_assert_eq (s, (double) (NT + 5 + 3) * 2, "layer %d: %g routed, want tokens x k", l, s);
    }
    free (load);
    /* restart: only the single-token steps, so layer 0 is the host's top-2 */
    cr_assert_eq (rx_eplb_rt_control (rx_engine_eplb (e), RX_EPLB_START, msg, sizeof msg, &err), RX_OK);
    for (int i = 0; i < NT; i++) {
        int s1 = rx_engine_seq_new (e, 4, &err);
        struct rx_engine_req q = { .seq = s1, .n_tokens = 1, .tokens = &toks[i] };
        cr_assert_eq (rx_engine_step (e, &q, 1, NULL, &err), RX_OK, "%s", err.msg);
        rx_engine_seq_free (e, s1);
    }
    cr_assert_eq (rx_eplb_rt_control (rx_engine_eplb (e), RX_EPLB_STOP, msg, sizeof msg, &err), RX_OK);
    /* stopped: a step is not recorded */
    int s2 = rx_engine_seq_new (e, 4, &err);
    struct rx_engine_req q = { .seq = s2, .n_tokens = 1, .tokens = &toks[0] };
    cr_assert_eq (rx_engine_step (e, &q, 1, NULL, &err), RX_OK, "%s", err.msg);
    load = s_dump (e, &nl, &ne);
    for (int x = 0; x < 4; x++)
        cr_assert_eq (load[x], (double) want0[x], "layer 0 expert %d: recorded %g, host top-2 says %lld", x,
                      load[x], (long long) want0[x]);
    free (load);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    remove (dir);
    free (dir);
    free (ini);
    free (model);
}

/* Logits of a 6-token prefill and 4 greedy decode steps. */
static void s_run (const char *model, const char *ini, float *out /* [5][n_vocab] */, int32_t *n_vocab)
{
    struct rx_boot b;
    rx_engine_t *e = s_engine (&b, ini, model);
    struct rx_err err = { 0 };
    const int32_t V = rx_engine_info (e)->n_vocab;
    *n_vocab = V;
    int seq = rx_engine_seq_new (e, 32, &err);
    const int32_t p[6] = { 1, 450, 7483, 310, 3444, 338 };
    struct rx_engine_req r = { .seq = seq, .n_tokens = 6, .tokens = p };
    cr_assert_eq (rx_engine_step (e, &r, 1, out, &err), RX_OK, "%s", err.msg);
    for (int i = 1; i < 5; i++) {
        const float *prev = out + (size_t) (i - 1) * V;
        int32_t best = 0;
        for (int32_t t = 1; t < V; t++)
            if (prev[t] > prev[best]) best = t;
        r.n_tokens = 1;
        r.tokens = &best;
        cr_assert_eq (rx_engine_step (e, &r, 1, out + (size_t) i * V, &err), RX_OK, "%s", err.msg);
    }
    rx_engine_destroy (&e);
    rx_boot_close (&b);
}

static void s_same_logits (const char *name, const char *placement_json)
{
    char *model = s_model (name), *dir = tu_tmpdir (), *pf = tu_path (dir, "place.json"), *ini = NULL;
    tu_write (pf, placement_json);
    cr_assert (asprintf (&ini, "[eplb]\ninit_expert_location = %s\n", pf) > 0);
    float *a = malloc (5 * 40000 * sizeof (float)), *c = malloc (5 * 40000 * sizeof (float));
    int32_t V = 0;
    s_run (model, NULL, a, &V);
    cr_assert_leq (V, 40000);
    s_run (model, ini, c, &V);
    double md = 0;
    for (size_t i = 0; i < (size_t) 5 * V; i++) md = fmax (md, fabs ((double) a[i] - c[i]));
    cr_assert_lt (md, 1e-4, "%s: logits differ by %g with placement %s", name, md, placement_json);
    free (a);
    free (c);
    remove (pf);
    remove (dir);
    free (pf);
    free (dir);
    free (ini);
    free (model);
}

Test (expert_record_engine, static_placement_same_logits_llama)
{
    /* 2 layers x 4 experts in 6 slots: copies of 0 and 3, a permuted order */
    s_same_logits ("tiny-moe.gguf", "{\"phy2log\": [[0, 3, 1, 0, 2, 3], [3, 2, 1, 0, 1, 2]]}");
}

Test (expert_record_engine, static_from_load_file_same_logits_llama)
{
    /* a load file: the deepseek algorithm with 2 redundant slots */
    char *model = s_model ("tiny-moe.gguf"), *dir = tu_tmpdir (), *pf = tu_path (dir, "load.json"), *ini = NULL;
    tu_write (pf, "{\"load\": [[90, 1, 1, 8], [5, 5, 80, 10]]}");
    cr_assert (asprintf (&ini, "[eplb]\ninit_expert_location = %s\nnum_redundant_experts = 2\n", pf) > 0);
    float *a = malloc (5 * 40000 * sizeof (float)), *c = malloc (5 * 40000 * sizeof (float));
    int32_t V = 0;
    s_run (model, NULL, a, &V);
    s_run (model, ini, c, &V);
    double md = 0;
    for (size_t i = 0; i < (size_t) 5 * V; i++) md = fmax (md, fabs ((double) a[i] - c[i]));
    cr_assert_lt (md, 1e-4, "logits differ by %g", md);
    free (a);
    free (c);
    remove (pf);
    remove (dir);
    free (pf);
    free (dir);
    free (ini);
    free (model);
}

Test (expert_record_engine, static_placement_same_logits_deepseek2)
{
    /* 2 MoE layers (block 0 is dense) x 8 experts in 10 slots */
    s_same_logits ("tiny-deepseek2.gguf",
                   "{\"phy2log\": [[0, 3, 1, 0, 2, 3, 7, 6, 5, 4], [7, 6, 5, 4, 3, 2, 1, 0, 0, 1]]}");
}

static void s_bad_init (const char *text, const char *extra, const char *want)
{
    char *model = s_model ("tiny-moe.gguf"), *dir = tu_tmpdir (), *pf = tu_path (dir, "bad.json"), *ini = NULL;
    if (text) tu_write (pf, text);
    cr_assert (asprintf (&ini, "[eplb]\ninit_expert_location = %s\n%s", pf, extra) > 0);
    struct rx_boot b;
    s_boot (&b, ini);
    struct rx_err err = { 0 };
    struct rx_engine_opts o = { .model_path = model, .n_slots = 256, .max_tokens = 64 };
    rx_engine_t *e = rx_engine_new (&b, &o, &err);
    cr_assert_null (e, "engine accepted %s", text ? text : "(no file)");
    cr_assert (strstr (err.msg, "init_expert_location"), "%s", err.msg);
    cr_assert (strstr (err.msg, pf), "message names the file: %s", err.msg);
    cr_assert (strstr (err.msg, want), "message \"%s\" lacks \"%s\"", err.msg, want);
    cr_assert_null (strchr (err.msg, '\n'), "one line: %s", err.msg);
    rx_boot_close (&b);
    remove (pf);
    remove (dir);
    free (pf);
    free (dir);
    free (ini);
    free (model);
}

Test (expert_record_engine, bad_init_expert_location)
{
    s_bad_init ("{\"phy2log\": [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]}", "", "3 layers x 4 experts");
    s_bad_init ("{\"load\": [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]}", "", "2 layers x 5 experts");
    s_bad_init ("{\"phy2log\": [[0, 1, 2, 9], [0, 1, 2, 3]]}", "", "");
    s_bad_init ("not json", "", "");
    s_bad_init (NULL, "", "");   /* no such file */
    s_bad_init ("{\"load\": [[1, 2, 3, 4], [1, 2, 3, 4]]}", "algorithm = nosuch\n", "nosuch");
}

Test (expert_record_engine, dense_model_refuses_controls)
{
    char *model = s_model ("tiny-llama.gguf");
    struct rx_boot b;
    rx_engine_t *e = s_engine (&b, NULL, model);
    cr_assert_null (rx_engine_eplb (e));
    struct rx_err err = { 0 };
    char msg[128];
    cr_assert_eq (rx_eplb_rt_control (rx_engine_eplb (e), RX_EPLB_DUMP, msg, sizeof msg, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "mixture-of-experts"), "%s", err.msg);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (model);
}

/* ------------------------------------------------------------------ IPC */

static void s_roundtrip (const struct rx_ipc_msg *m, struct rx_ipc_msg *out)
{
    struct rx_err err = { 0 };
    uint8_t buf[4096];
    size_t len = 0;
    cr_assert_eq (rx_ipc_encode_into (m, buf, sizeof buf, &len, &err), RX_OK, "%s", err.msg);
    memset (out, 0, sizeof *out);
    cr_assert_eq (rx_ipc_decode (buf, len, out, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (out->type, m->type);
}

Test (expert_record_ipc, messages_roundtrip_and_bad_ones_refused)
{
    struct rx_ipc_msg m = { .type = RX_IPC_EPLB }, got;
    m.u.eplb.cookie = 77;
    m.u.eplb.op = RX_IPC_EPLB_OP_DUMP;
    s_roundtrip (&m, &got);
    cr_assert (got.u.eplb.cookie == 77 && got.u.eplb.op == RX_IPC_EPLB_OP_DUMP);
    rx_ipc_msg_free (&got);
    cr_assert_eq ((int) RX_IPC_EPLB_OP_START, (int) RX_EPLB_START);
    cr_assert_eq ((int) RX_IPC_EPLB_OP_DUMP, (int) RX_EPLB_DUMP);

    struct rx_ipc_msg r = { .type = RX_IPC_EPLB_REPLY };
    r.u.flush_reply.cookie = 5;
    r.u.flush_reply.status = RX_ENOTSUP;
    r.u.flush_reply.message = (char *) "/tmp/radix-eplb/x.json";
    s_roundtrip (&r, &got);
    cr_assert (got.u.flush_reply.cookie == 5 && got.u.flush_reply.status == RX_ENOTSUP);
    cr_assert_str_eq (got.u.flush_reply.message, "/tmp/radix-eplb/x.json");
    rx_ipc_msg_free (&got);

    float bal[3] = { 1.0f, 0.5f, 0.25f };
    struct rx_ipc_msg st = { .type = RX_IPC_EPLB_STATS };
    st.u.eplb_stats = (struct rx_ipc_eplb_stats) { .dp_rank = 1, .rebalanced = 9, .skipped = 4, .n = 3,
                                                   .balancedness = bal };
    s_roundtrip (&st, &got);
    cr_assert (got.u.eplb_stats.dp_rank == 1 && got.u.eplb_stats.rebalanced == 9 && got.u.eplb_stats.skipped == 4);
    cr_assert_eq (got.u.eplb_stats.n, 3);
    cr_assert_arr_eq (got.u.eplb_stats.balancedness, bal, sizeof bal);
    rx_ipc_msg_free (&got);

    /* bad: unknown op on both sides, too many layers */
    struct rx_err err = { 0 };
    uint8_t buf[256];
    size_t len = 0;
    m.u.eplb.op = 9;
    cr_assert_neq (rx_ipc_encode_into (&m, buf, sizeof buf, &len, &err), RX_OK);
    cr_assert (strstr (err.msg, "EPLB"), "%s", err.msg);
    m.u.eplb.op = RX_IPC_EPLB_OP_START;
    cr_assert_eq (rx_ipc_encode_into (&m, buf, sizeof buf, &len, &err), RX_OK, "%s", err.msg);
    buf[len - 1] = 0;   /* the op byte */
    cr_assert_eq (rx_ipc_decode (buf, len, &got, &err), RX_EFORMAT);
    cr_assert (strstr (err.msg, "EPLB"), "%s", err.msg);
    rx_ipc_msg_free (&got);
    st.u.eplb_stats.n = RX_IPC_EPLB_MAX_LAYERS + 1;
    cr_assert_neq (rx_ipc_encode_into (&st, buf, sizeof buf, &len, &err), RX_OK);
    /* a count over the bytes sent */
    st.u.eplb_stats.n = 3;
    cr_assert_eq (rx_ipc_encode_into (&st, buf, sizeof buf, &len, &err), RX_OK, "%s", err.msg);
    cr_assert_neq (rx_ipc_decode (buf, len - 4, &got, &err), RX_OK);
    rx_ipc_msg_free (&got);
}
