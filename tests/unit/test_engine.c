/* tests/unit/test_engine.c -- the model runner (core/engine), the llama
 * model plugin and the mha attention plugin on their error paths: every bad
 * file, config, batch or argument gives one clear line and no crash; plus
 * the CLI's contiguous slot allocator and sequence truncation.  The numbers
 * themselves are checked against references in test_models_ref. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/kernel.h>

#include "boot.h"
#include "engine.h"
#include "sampling.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "loader.h"
#include "log.h"
#include "../testutil.h"

static char *s_model (const char *name)
{
    TU_REQUIRE_SHARED ();
    char *dir = tu_path (tu_env ("RADIX_SHARED"), "data/models");
    char *p = tu_path (dir, name);
    free (dir);
    return p;
}

/* Boot from INI text (NULL: defaults), one kernel thread. */
static void s_boot (struct rx_boot *b, const char *ini_text)
{
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_err err = { 0 };
    char *path = NULL, *dir = NULL;
    if (ini_text) {
        dir = tu_tmpdir ();
        path = tu_path (dir, "t.ini");
        tu_write (path, ini_text);
    }
    cr_assert_eq (rx_boot_open (b, path, 0, &err), RX_OK, "%s", err.msg);
    if (!rx_conf_raw (b->conf, "kernels", "threads", NULL))
        cr_assert_eq (rx_conf_set (b->conf, "kernels", "threads", "1", &err), RX_OK, "%s", err.msg);
    free (path);
    free (dir);
}

/* Expect rx_engine_new to fail with code and a one-line message holding
 * every string in want. */
static void s_expect_fail (const char *ini, const char *model, int code, const char *const *want)
{
    struct rx_boot b;
    s_boot (&b, ini);
    struct rx_err err = { 0 };
    struct rx_engine_opts o = { .model_path = model, .n_slots = 64 };
    rx_engine_t *e = rx_engine_new (&b, &o, &err);
    cr_assert_null (e, "engine should have been refused");
    if (code) cr_assert_eq (err.code, code, "%s (%s)", err.msg, rx_status_name (err.code));
    for (const char *const *w = want; *w; w++)
        cr_assert (strstr (err.msg, *w), "message \"%s\" lacks \"%s\"", err.msg, *w);
    cr_assert_null (strchr (err.msg, '\n'), "one line: %s", err.msg);
    rx_boot_close (&b);
}

#define EXPECT_FAIL(ini, model, code, ...)                                      \
    do {                                                                        \
        const char *w_[] = { __VA_ARGS__, NULL };                               \
        s_expect_fail (ini, model, code, w_);                                   \
    } while (0)

static rx_engine_t *s_engine (struct rx_boot *b, const char *ini, const char *model, int64_t slots,
                              int32_t max_tokens)
{
    s_boot (b, ini);
    struct rx_err err = { 0 };
    struct rx_engine_opts o = { .model_path = model, .n_slots = slots, .max_tokens = max_tokens };
    rx_engine_t *e = rx_engine_new (b, &o, &err);
    cr_assert_not_null (e, "%s", err.msg);
    return e;
}

/* ------------------------------------------------------------ bad files -- */

Test (engine, no_model_is_a_config_error)
{
    EXPECT_FAIL (NULL, NULL, RX_ECONFIG, "no model", "[model] path");
}

Test (engine, missing_and_foreign_files_name_the_file)
{
    EXPECT_FAIL (NULL, "/nonexistent/dir/m.gguf", 0, "/nonexistent/dir/m.gguf");
    char *dir = tu_tmpdir ();
    char *junk = tu_path (dir, "junk.gguf");
    tu_write (junk, "this is not a gguf file at all, just text\n");
    EXPECT_FAIL (NULL, junk, 0, "junk.gguf");
    free (junk);
    free (dir);
}

Test (engine, an_architecture_nobody_handles_is_named)
{
    char *m = s_model ("tiny-deepseek2.gguf");
    /* model-deepseek2 handles this file; an_unknown_architecture_is_named
     * covers the auto pick.  A plugin named explicitly still refuses it. */
    EXPECT_FAIL ("[model]\nplugin = llama\n", m, RX_ENOTSUP, "plugin = llama", "\"deepseek2\"");
    free (m);
}

/* model-llama runs MoE files through the [moe] dispatcher (numbers in
 * test_models_ref); an unknown dispatcher is named. */
Test (engine, moe_files_need_their_dispatcher)
{
    char *m = s_model ("tiny-moe.gguf");
    EXPECT_FAIL ("[moe]\ndispatcher = nosuch\n", m, RX_ENOENT, "[moe] dispatcher = nosuch", "moe-nosuch.so");
    free (m);
}

Test (engine, bad_plugin_names_in_the_config)
{
    char *m = s_model ("tiny-llama.gguf");
    EXPECT_FAIL ("[attention]\nbackend = nosuch\n", m, RX_ENOENT, "nosuch", "attn-nosuch.so");
    EXPECT_FAIL ("[model]\nplugin = nosuch\n", m, RX_ENOENT, "nosuch", "model-nosuch.so");
    EXPECT_FAIL ("[kernels]\nbackend = nosuch\n", m, RX_ENOENT, "nosuch");
    free (m);
}

Test (engine, model_path_from_the_ini_is_relative_to_its_folder)
{
    char *dir = tu_tmpdir ();
    char *link = tu_path (dir, "tiny.gguf");
    char *m = s_model ("tiny-llama.gguf");
    cr_assert_eq (symlink (m, link), 0);
    char *ini = tu_path (dir, "r.ini");
    tu_write (ini, "[model]\npath = tiny.gguf\n[kernels]\nthreads = 1\n");
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&b, ini, 0, &err), RX_OK, "%s", err.msg);
    rx_engine_t *e = rx_engine_new (&b, NULL, &err);
    cr_assert_not_null (e, "%s", err.msg);
    const struct rx_model_info *i = rx_engine_info (e);
    cr_assert_str_eq (i->arch, "llama");
    cr_assert_eq (i->n_vocab, 32000);
    cr_assert_eq (i->n_layer, 2);
    cr_assert_eq (i->n_embd, 64);
    cr_assert_eq (i->n_head, 4);
    cr_assert_eq (i->n_kv_head, 2);
    cr_assert_eq (i->n_ctx_train, 512);
    /* 2 layers x 2 KV heads x (16 + 16) dims x 4 bytes */
    cr_assert_eq (i->kv_bytes_per_token, 2u * 2u * 32u * 4u);
    cr_assert_eq (rx_engine_n_slots (e), 512, "default KV: the context length (< 4096)");
    cr_assert (strstr (rx_engine_describe (e), "attn-mha"), "%s", rx_engine_describe (e));
    rx_engine_destroy (&e);
    cr_assert_null (e);
    rx_boot_close (&b);
    unlink (link);
    unlink (ini);
    rmdir (dir);
    free (link);
    free (ini);
    free (m);
    free (dir);
}

/* ---------------------------------------------- mutated copies of a model -- */

struct mutation {
    const char *drop_key;        /* leave this key out */
    const char *set_key;         /* ... or override this one: */
    int set_u32;                 /*   as uint32 */
    const char *set_str;         /*   or as string */
    const char *drop_tensor;     /* leave this tensor out */
    const char *reshape_tensor;  /* declare this 2-D tensor with its dims swapped */
    const char *add_tensor;      /* add a small F32 tensor of this name */
    int to_qwen2;                /* arch qwen2: keys renamed, zero QKV biases */
    int neox_rows;               /* q/k rows permuted so that NeoX RoPE computes what
                                  * normal RoPE did on the original */
};

/* Row permutation that turns GGML "normal" RoPE pairs (2i, 2i+1) of each
 * head of hd rows into NeoX pairs (i, i + hd/2). */
static void s_neox_rows (const float *src, float *dst, size_t n_rows, size_t row, size_t hd)
{
    for (size_t h = 0; h < n_rows / hd; h++)
        for (size_t i = 0; i < hd / 2; i++) {
            memcpy (dst + (h * hd + i) * row, src + (h * hd + 2 * i) * row, row * sizeof *src);
            memcpy (dst + (h * hd + hd / 2 + i) * row, src + (h * hd + 2 * i + 1) * row, row * sizeof *src);
        }
}

/* Write a copy of tiny-llama.gguf with one change; returns the path. */
static char *s_mutate (const char *dir, const char *name, const struct mutation *mu)
{
    struct rx_err err = { 0 };
    char *src_path = s_model ("tiny-llama.gguf");
    rx_gguf_t *src = rx_gguf_open (src_path, &err);
    cr_assert_not_null (src, "%s", err.msg);
    char *out = tu_path (dir, name);
    rx_gguf_writer_t *w = rx_gguf_writer_new (out, &err);
    cr_assert_not_null (w, "%s", err.msg);
    for (size_t i = 0; i < rx_gguf_kv_count (src); i++) {
        const char *k = rx_gguf_kv_key (src, i);
        if ((mu->drop_key && !strcmp (k, mu->drop_key)) || (mu->set_key && !strcmp (k, mu->set_key))
            || !strcmp (k, "general.alignment"))
            continue;
        if (mu->to_qwen2 && !strcmp (k, "general.architecture")) {
            cr_assert_eq (rx_gguf_writer_add_str (w, k, "qwen2", &err), RX_OK, "%s", err.msg);
            continue;
        }
        if (mu->to_qwen2 && !strncmp (k, "llama.", 6)) {
            char nk[128];
            snprintf (nk, sizeof nk, "qwen2.%s", k + 6);
            uint32_t u;
            float f;
            if (rx_gguf_kv_type (src, i) == RX_GGUF_FLOAT32) {
                cr_assert_eq (rx_gguf_get_f32 (src, k, &f), RX_OK);
                cr_assert_eq (rx_gguf_writer_add_f32 (w, nk, f, &err), RX_OK, "%s", err.msg);
            } else {
                cr_assert_eq (rx_gguf_get_u32 (src, k, &u), RX_OK, "%s", k);
                cr_assert_eq (rx_gguf_writer_add_u32 (w, nk, u, &err), RX_OK, "%s", err.msg);
            }
            continue;
        }
        cr_assert_eq (rx_gguf_writer_copy_kv (w, src, i, &err), RX_OK, "%s", err.msg);
    }
    if (mu->set_key && mu->set_str)
        cr_assert_eq (rx_gguf_writer_add_str (w, mu->set_key, mu->set_str, &err), RX_OK, "%s", err.msg);
    else if (mu->set_key)
        cr_assert_eq (rx_gguf_writer_add_u32 (w, mu->set_key, (uint32_t) mu->set_u32, &err), RX_OK, "%s", err.msg);
    for (size_t i = 0; i < rx_gguf_tensor_count (src); i++) {
        const struct rx_gguf_tensor *t = rx_gguf_tensor (src, i);
        if (mu->drop_tensor && !strcmp (t->name, mu->drop_tensor)) continue;
        uint64_t ne[4] = { t->ne[0], t->ne[1], t->ne[2], t->ne[3] };
        if (mu->reshape_tensor && !strcmp (t->name, mu->reshape_tensor)) {
            ne[0] = t->ne[1];
            ne[1] = t->ne[0];
        }
        cr_assert_eq (rx_gguf_writer_add_tensor (w, t->name, t->type, t->n_dims, ne, &err), RX_OK, "%s", err.msg);
    }
    static const char *const bias[3] = { "attn_q.bias", "attn_k.bias", "attn_v.bias" };
    const uint64_t bias_n[3] = { 64, 32, 32 };
    for (int l = 0; mu->to_qwen2 && l < 2; l++)
        for (int j = 0; j < 3; j++) {
            char n[64];
            uint64_t ne[4] = { bias_n[j], 1, 1, 1 };
            snprintf (n, sizeof n, "blk.%d.%s", l, bias[j]);
            cr_assert_eq (rx_gguf_writer_add_tensor (w, n, RX_F32, 1, ne, &err), RX_OK, "%s", err.msg);
        }
    uint64_t small[4] = { 8, 1, 1, 1 };
    if (mu->add_tensor)
        cr_assert_eq (rx_gguf_writer_add_tensor (w, mu->add_tensor, RX_F32, 1, small, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_begin (w, &err), RX_OK, "%s", err.msg);
    for (size_t i = 0; i < rx_gguf_tensor_count (src); i++) {
        const struct rx_gguf_tensor *t = rx_gguf_tensor (src, i);
        if (mu->drop_tensor && !strcmp (t->name, mu->drop_tensor)) continue;
        const void *data = t->data;
        float *perm = NULL;
        if (mu->neox_rows && (strstr (t->name, "attn_q.weight") || strstr (t->name, "attn_k.weight"))) {
            cr_assert_eq (t->type, RX_F32);
            perm = malloc (t->nbytes);
            s_neox_rows (t->data, perm, t->ne[1], t->ne[0], 16);
            data = perm;
        }
        cr_assert_eq (rx_gguf_writer_write (w, data, t->nbytes, &err), RX_OK, "%s", err.msg);
        free (perm);
    }
    float zeros[64] = { 0 };
    for (int l = 0; mu->to_qwen2 && l < 2; l++)
        for (int j = 0; j < 3; j++)
            cr_assert_eq (rx_gguf_writer_write (w, zeros, bias_n[j] * sizeof (float), &err), RX_OK, "%s", err.msg);
    if (mu->add_tensor)
        cr_assert_eq (rx_gguf_writer_write (w, zeros, 8 * sizeof (float), &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_OK, "%s", err.msg);
    rx_gguf_writer_destroy (&w);
    rx_gguf_close (&src);
    free (src_path);
    return out;
}

#define MUTANT_FAILS(mut, code, ...)                                       \
    do {                                                                        \
        char *d_ = tu_tmpdir ();                                                \
        struct mutation mu_ = mut;                                              \
        char *p_ = s_mutate (d_, "mutant.gguf", &mu_);                          \
        EXPECT_FAIL (NULL, p_, code, "mutant.gguf", __VA_ARGS__);               \
        unlink (p_);                                                            \
        rmdir (d_);                                                             \
        free (p_);                                                              \
        free (d_);                                                              \
    } while (0)

/* The auto pick names an architecture no plugin handles (and the plugins
 * it looked at). */
Test (engine, an_unknown_architecture_is_named)
{
    MUTANT_FAILS (((struct mutation) { .set_key = "general.architecture", .set_str = "nosuch" }),
                  RX_ENOTSUP, "no model plugin", "\"nosuch\"", "llama");
}

Test (model_llama, missing_or_bad_keys_are_named)
{
    MUTANT_FAILS (((struct mutation) { .drop_key = "llama.attention.layer_norm_rms_epsilon" }),
                  RX_EFORMAT, "missing key llama.attention.layer_norm_rms_epsilon");
    MUTANT_FAILS (((struct mutation) { .drop_key = "llama.block_count" }), RX_EFORMAT,
                  "llama.block_count");
    MUTANT_FAILS (((struct mutation) { .set_key = "llama.attention.head_count_kv", .set_u32 = 3 }),
                  RX_EFORMAT, "bad hyper-parameters", "3 kv heads");
    MUTANT_FAILS (((struct mutation) { .set_key = "llama.rope.dimension_count", .set_u32 = 17 }),
                  RX_EFORMAT, "rope.dimension_count 17");
    MUTANT_FAILS (((struct mutation) { .set_key = "llama.rope.freq_base", .set_str = "ten" }),
                  RX_EFORMAT, "llama.rope.freq_base");
    MUTANT_FAILS (((struct mutation) { .set_key = "llama.rope.scaling.type", .set_str = "longrope" }),
                  RX_ENOTSUP, "longrope");
    MUTANT_FAILS (((struct mutation) { .set_key = "llama.vocab_size", .set_u32 = 1000 }),
                  RX_EFORMAT, "vocab_size 1000");
    MUTANT_FAILS (((struct mutation) { .set_key = "general.architecture", .set_str = "gpt2" }),
                  RX_ENOTSUP, "\"gpt2\"");
}

Test (model_llama, missing_or_misshapen_tensors_are_named)
{
    MUTANT_FAILS (((struct mutation) { .drop_tensor = "blk.1.ffn_up.weight" }), RX_EFORMAT,
                  "missing tensor blk.1.ffn_up.weight");
    MUTANT_FAILS (((struct mutation) { .drop_tensor = "output_norm.weight" }), RX_EFORMAT,
                  "output_norm.weight");
    MUTANT_FAILS (((struct mutation) { .reshape_tensor = "blk.0.attn_k.weight" }), RX_EFORMAT,
                  "blk.0.attn_k.weight", "[32,64,1]", "expected [64,32]");
    MUTANT_FAILS (((struct mutation) { .add_tensor = "rope_freqs.weight" }), RX_ENOTSUP,
                  "rope_freqs.weight");
}

Test (model_llama, no_output_weight_means_tied_embeddings)
{
    char *d = tu_tmpdir ();
    struct mutation mu = { .drop_tensor = "output.weight" };
    char *p = s_mutate (d, "tied.gguf", &mu);
    struct rx_boot b;
    rx_engine_t *e = s_engine (&b, NULL, p, 64, 16);
    struct rx_err err = { 0 };
    int s = rx_engine_seq_new (e, 8, &err);
    cr_assert_geq (s, 0, "%s", err.msg);
    int32_t toks[] = { 1, 450, 7483 };
    float *l = malloc (32000 * sizeof *l);
    struct rx_engine_req r = { s, 3, toks, 0 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_OK, "%s", err.msg);
    /* logits = h . token_embd rows: finite, and not all equal */
    int varied = 0;
    for (int i = 0; i < 32000; i++) {
        cr_assert (isfinite (l[i]));
        varied |= l[i] != l[0];
    }
    cr_assert (varied);
    free (l);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    unlink (p);
    rmdir (d);
    free (p);
    free (d);
}

/* qwen2 = llama + QKV bias + NeoX RoPE.  A qwen2 file made from tiny-llama
 * with zero biases and q/k rows permuted to NeoX order must give the same
 * logits as tiny-llama (whose logits test_models_ref checks against the
 * reference): this exercises the qwen2 path end to end. */
/* Logits of a fixed 9-token sequence: prefill 5, then one at a time. */
static float *s_logits_of (const char *model)
{
    static const int32_t toks[] = { 1, 450, 7483, 310, 3444, 338, 263, 4086, 297 };
    const int n = 9;
    struct rx_boot b;
    rx_engine_t *e = s_engine (&b, NULL, model, 32, 16);
    struct rx_err err = { 0 };
    int s = rx_engine_seq_new (e, n, &err);
    float *lg = malloc ((size_t) n * 32000 * sizeof (float));
    struct rx_engine_req r = { s, 5, toks, 1 };
    cr_assert_eq (rx_engine_step (e, &r, 1, lg, &err), RX_OK, "%s", err.msg);
    for (int t = 5; t < n; t++) {
        r = (struct rx_engine_req) { s, 1, toks + t, 1 };
        cr_assert_eq (rx_engine_step (e, &r, 1, lg + (size_t) t * 32000, &err), RX_OK, "%s", err.msg);
    }
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    return lg;
}

static double s_max_diff (const float *a, const float *b)
{
    double m = 0;
    for (size_t i = 0; i < 9 * 32000; i++)
        if (fabs ((double) a[i] - b[i]) > m) m = fabs ((double) a[i] - b[i]);
    return m;
}

/* qwen2 = llama + QKV bias + NeoX RoPE.  A qwen2 file made from tiny-llama
 * with zero biases and q/k rows permuted to NeoX order must give the same
 * logits as tiny-llama (whose logits test_models_ref checks against the
 * reference): this exercises the qwen2 path end to end.  The same permuted
 * rows in a llama file (normal RoPE) must not match, or the test would not
 * see the RoPE mode at all. */
Test (model_llama, qwen2_neox_rope_and_biases_match_the_llama_original)
{
    char *d = tu_tmpdir ();
    struct mutation mq = { .to_qwen2 = 1, .neox_rows = 1 }, ml = { .neox_rows = 1 };
    char *qp = s_mutate (d, "qwen2.gguf", &mq), *pp = s_mutate (d, "permuted.gguf", &ml);
    char *lp = s_model ("tiny-llama.gguf");
    float *orig = s_logits_of (lp), *qwen = s_logits_of (qp), *perm = s_logits_of (pp);
    double dq = s_max_diff (orig, qwen), dp = s_max_diff (orig, perm);
    cr_assert_lt (dq, 1e-4, "qwen2 copy differs from llama by %g", dq);
    cr_assert_gt (dp, 1e-2, "permuted rows under normal RoPE differ by only %g", dp);
    free (orig);
    free (qwen);
    free (perm);
    unlink (qp);
    unlink (pp);
    rmdir (d);
    free (qp);
    free (pp);
    free (lp);
    free (d);
}

/* ------------------------------------------------------ sequences, steps -- */

Test (engine, contiguous_slots_first_fit_and_reuse)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 100, 16);
    struct rx_err err = { 0 };
    int a = rx_engine_seq_new (e, 40, &err), c = rx_engine_seq_new (e, 40, &err);
    cr_assert (a >= 0 && c >= 0 && a != c);
    cr_assert_eq (rx_engine_seq_new (e, 30, &err), RX_EAGAIN, "only 20 slots left");
    cr_assert (strstr (err.msg, "30"), "%s", err.msg);
    int d = rx_engine_seq_new (e, 20, &err);
    cr_assert_geq (d, 0, "%s", err.msg);
    cr_assert_eq (rx_engine_seq_free (e, a), RX_OK);
    cr_assert_eq (rx_engine_seq_free (e, a), RX_EINVAL, "double free");
    cr_assert_eq (rx_engine_seq_len (e, a), -1);
    int f = rx_engine_seq_new (e, 40, &err);   /* a's range is free again */
    cr_assert_geq (f, 0, "%s", err.msg);
    cr_assert_eq (rx_engine_seq_new (e, 0, &err), RX_EINVAL);
    cr_assert_eq (rx_engine_seq_room (e, f), 40);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

Test (engine, bad_steps_change_nothing)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 64, 8);
    struct rx_err err = { 0 };
    int s = rx_engine_seq_new (e, 10, &err), t = rx_engine_seq_new (e, 10, &err);
    int32_t toks[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
    float *l = malloc (12 * 32000 * sizeof *l);
    struct rx_engine_req r;

    r = (struct rx_engine_req) { 99, 1, toks, 0 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "unknown sequence 99"), "%s", err.msg);
    r = (struct rx_engine_req) { s, 0, toks, 0 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "no tokens"), "%s", err.msg);
    r = (struct rx_engine_req) { s, 11, toks, 0 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "capacity 10"), "%s", err.msg);
    r = (struct rx_engine_req) { s, 9, toks, 0 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "max_tokens 8"), "%s", err.msg);
    struct rx_engine_req two[2] = { { s, 1, toks, 0 }, { s, 1, toks, 0 } };
    cr_assert_eq (rx_engine_step (e, two, 2, l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "twice"), "%s", err.msg);
    int32_t bad_tok = 32000;
    r = (struct rx_engine_req) { s, 1, &bad_tok, 0 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "token 32000") && strstr (err.msg, "vocabulary"), "%s", err.msg);
    cr_assert_eq (rx_engine_step (e, &r, 0, l, &err), RX_EINVAL);
    cr_assert_eq (rx_engine_seq_len (e, s), 0, "failed steps store nothing");
    cr_assert_eq (rx_engine_seq_len (e, t), 0);

    /* A good step after all that. */
    r = (struct rx_engine_req) { s, 3, toks, 1 };
    cr_assert_eq (rx_engine_step (e, &r, 1, l, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_engine_seq_len (e, s), 3);
    cr_assert_eq (rx_engine_n_out (&r, 1), 3);
    free (l);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

Test (engine, truncate_then_refeed_gives_the_same_logits)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 64, 16);
    struct rx_err err = { 0 };
    int s = rx_engine_seq_new (e, 16, &err);
    int32_t toks[] = { 1, 450, 7483, 310, 3444, 338 };
    float *a = malloc (6 * 32000 * sizeof *a), *c = malloc (2 * 32000 * sizeof *c);
    struct rx_engine_req r = { s, 6, toks, 1 };
    cr_assert_eq (rx_engine_step (e, &r, 1, a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_engine_seq_truncate (e, s, 7), RX_EINVAL, "beyond the length");
    cr_assert_eq (rx_engine_seq_truncate (e, s, 4), RX_OK);
    cr_assert_eq (rx_engine_seq_len (e, s), 4);
    r = (struct rx_engine_req) { s, 2, toks + 4, 1 };
    cr_assert_eq (rx_engine_step (e, &r, 1, c, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < 2 * 32000; i++)
        cr_assert (fabsf (a[4 * 32000 + i] - c[i]) <= 1e-4f * (1 + fabsf (c[i])), "logit %d: %g vs %g",
                   i, (double) a[4 * 32000 + i], (double) c[i]);
    free (a);
    free (c);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

/* [scheduler] cuda_graph_max_bs: engine 1 on a backend that cannot capture
 * (kernels-cpu answers graph_begin with RX_ENOTSUP: model-llama runs every
 * step op by op), engine 2 on kernels-cpu's emulated graphs ([kernels.cpu]
 * graphs: ops recorded at capture, replayed at launch, as on a GPU).  Both
 * give engine 0's logits bit for bit -- prefill, decode steps at and above
 * the graph batch limit, replays after the engine grew its logits buffer --
 * and engine 2 holds graphs for batch sizes 1 and 2 only.  The MoE models
 * (tiny-moe, tiny-deepseek2 with MLA) are captured too: their decode steps
 * route and sort the experts' rows on the device (moe_route; moe-local
 * with RX_MOE_ROUTED_DEVICE), so no step copies to the host; a capture
 * with a host copy in it would fail the step. */
static void s_graph_replay (const char *model, uint64_t tag)
{
    char *m = s_model (model);
    struct rx_boot b[3];
    rx_engine_t *e[3] = { s_engine (&b[0], NULL, m, 128, 16),
                          s_engine (&b[1], "[scheduler]\ncuda_graph_max_bs = 2\n", m, 128, 16),
                          s_engine (&b[2], "[scheduler]\ncuda_graph_max_bs = 2\n"
                                           "[kernels.cpu]\ngraphs = true\n", m, 128, 16) };
    struct rx_err err = { 0 };
    const int V = 32000, NE = 3;
    float *lg[3] = { malloc (3 * V * sizeof (float)), malloc (3 * V * sizeof (float)),
                     malloc (3 * V * sizeof (float)) };
    int32_t prompt[3][3] = { { 1, 450, 7483 }, { 1, 310, 3444 }, { 1, 338, 263 } };
    int seq[3][3];
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < NE; i++) {
            seq[i][j] = rx_engine_seq_new (e[i], 16, &err);
            cr_assert_geq (seq[i][j], 0, "%s", err.msg);
            struct rx_engine_req r = { seq[i][j], 3, prompt[j], 0 };
            cr_assert_eq (rx_engine_step (e[i], &r, 1, lg[i], &err), RX_OK, "%s", err.msg);
            cr_assert (!memcmp (lg[0], lg[i], (size_t) V * sizeof (float)), "engine %d, prefill %d", i, j);
        }
    /* Decode: batches of 1, 2 (graph-sized) and 3 (above the limit). */
    const int bs[] = { 1, 1, 2, 2, 2, 3, 1, 1, 2 };
    for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k++) {
        for (int i = 0; i < NE; i++) {
            struct rx_engine_req r[3];
            int32_t tok[3];
            for (int j = 0; j < bs[k]; j++) {
                tok[j] = (int32_t) (100 + 7 * k + j);
                r[j] = (struct rx_engine_req) { seq[i][j], 1, &tok[j], 0 };
            }
            cr_assert_eq (rx_engine_step (e[i], r, bs[k], lg[i], &err), RX_OK, "step %zu: %s", k, err.msg);
        }
        for (int i = 1; i < NE; i++)
            cr_assert (!memcmp (lg[0], lg[i], (size_t) bs[k] * V * sizeof (float)),
                       "engine %d, decode step %zu (batch %d): the same logits", i, k, bs[k]);
    }
    /* The model's graph keys: its tag << 24 | batch size (models/graph.h). */
    const struct rx_kernels_ops *K = NULL;
    void *be = NULL;
    rx_engine_kernels (e[2], &K, &be);
    cr_assert (K->graph_has (be, (tag << 24) | 1) && K->graph_has (be, (tag << 24) | 2),
               "decode steps of 1 and 2 sequences were captured");
    cr_assert_eq (K->graph_has (be, (tag << 24) | 3), 0, "3 > cuda_graph_max_bs");
    rx_engine_kernels (e[1], &K, &be);
    cr_assert_eq (K->graph_has (be, (tag << 24) | 1), 0, "no graphs without [kernels.cpu] graphs");
    for (int i = 0; i < NE; i++) {
        free (lg[i]);
        rx_engine_destroy (&e[i]);
        rx_boot_close (&b[i]);
    }
    free (m);
}

/* Graph key tags: llama.c LL_GRAPH_TAG, deepseek2.c DS_GRAPH_TAG. */
Test (engine, cuda_graph_max_bs_replays_decode_steps) { s_graph_replay ("tiny-llama.gguf", 0x6c6c616d61ull); }
Test (engine, cuda_graph_max_bs_replays_moe_decode_steps) { s_graph_replay ("tiny-moe.gguf", 0x6c6c616d61ull); }
Test (engine, cuda_graph_max_bs_replays_deepseek2_decode_steps)
{
    s_graph_replay ("tiny-deepseek2.gguf", 0x6473656b32ull);
}

/* [model.llama] fuse_weights = true loads Q/K/V and gate/up as one weight
 * each (one matmul and one rope call fewer per layer): the logits are
 * those of the separate weights, bit for bit, through a prefill and
 * decode steps, for F32, Q8_0 and Q4 files; the log says how many layers
 * were fused (so the test cannot pass by not fusing).  A bad value is a
 * configuration error naming the key. */
static char *s_engine_logged (struct rx_boot *b, rx_engine_t **e, const char *ini, const char *model)
{
    char *dir = tu_tmpdir (), *lpath = tu_path (dir, "log.txt");
    s_boot (b, ini);   /* before the log is redirected: booting sets [log] */
    int lvl = rx_log_get_level ();
    cr_assert_eq (rx_log_set_file (lpath), 0);
    rx_log_set_level (RX_LOG_INFO);
    struct rx_err err = { 0 };
    struct rx_engine_opts o = { .model_path = model, .n_slots = 64, .max_tokens = 16 };
    *e = rx_engine_new (b, &o, &err);
    rx_log_set_level (lvl);
    rx_log_set_file (NULL);
    cr_assert_not_null (*e, "%s", err.msg);
    FILE *f = fopen (lpath, "r");
    cr_assert_not_null (f);
    char *log = tu_slurp_fd (fileno (f));
    fclose (f);
    unlink (lpath);
    rmdir (dir);
    free (lpath);
    free (dir);
    return log;
}

Test (model_llama, fused_projections_give_the_same_logits)
{
    const char *files[] = { "tiny-llama.gguf", "tiny-llama-q8.gguf", "tiny-llama-q4.gguf" };
    for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
        char *m = s_model (files[fi]);
        struct rx_boot b[2];
        rx_engine_t *e[2];
        char *log0 = s_engine_logged (&b[0], &e[0], "[model.llama]\nfuse_weights = false\n", m);
        char *log1 = s_engine_logged (&b[1], &e[1], "[model.llama]\nfuse_weights = true\n", m);
        cr_assert_null (strstr (log0, "fused projections"), "%s: not fused: %s", files[fi], log0);
        const int nl = rx_engine_info (e[0])->n_layer;
        char want[96];
        snprintf (want, sizeof want, "Q/K/V in %d of %d layers, gate/up in %d", nl, nl, nl);
        cr_assert (strstr (log1, want), "%s: every layer fused: %s", files[fi], log1);
        struct rx_err err = { 0 };
        const int V = rx_engine_info (e[0])->n_vocab;
        float *lg[2] = { malloc ((size_t) 5 * V * sizeof (float)), malloc ((size_t) 5 * V * sizeof (float)) };
        int32_t toks[8] = { 1, 450, 7483, 310, 3444, 338, 263, 29871 };
        int seq[2];
        for (int i = 0; i < 2; i++) {
            seq[i] = rx_engine_seq_new (e[i], 16, &err);
            struct rx_engine_req r = { seq[i], 5, toks, 1 };
            cr_assert_eq (rx_engine_step (e[i], &r, 1, lg[i], &err), RX_OK, "%s", err.msg);
        }
        cr_assert (!memcmp (lg[0], lg[1], (size_t) 5 * V * sizeof (float)), "%s: prefill logits", files[fi]);
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 2; i++) {
                struct rx_engine_req r = { seq[i], 1, &toks[5 + k], 0 };
                cr_assert_eq (rx_engine_step (e[i], &r, 1, lg[i], &err), RX_OK, "%s", err.msg);
            }
            cr_assert (!memcmp (lg[0], lg[1], (size_t) V * sizeof (float)), "%s: decode step %d", files[fi], k);
        }
        for (int i = 0; i < 2; i++) {
            free (lg[i]);
            rx_engine_destroy (&e[i]);
            rx_boot_close (&b[i]);
        }
        free (log0);
        free (log1);
        free (m);
    }
    /* A bad value: the INI's file and line, at boot. */
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    char *dir = tu_tmpdir (), *path = tu_path (dir, "t.ini");
    tu_write (path, "[model.llama]\nfuse_weights = maybe\n");
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_neq (rx_boot_open (&b, path, 0, &err), RX_OK);
    cr_assert (strstr (err.msg, "t.ini:2") && strstr (err.msg, "fuse_weights = \"maybe\"")
               && strstr (err.msg, "auto|true|false"), "%s", err.msg);
    unlink (path);
    rmdir (dir);
    free (path);
    free (dir);
}

/* rx_engine_forward_ids: the device argmax of every output row equals the
 * host's rx_argmax of the full logits; only the wanted rows are copied
 * (the others keep what the buffer held); no logits buffer is needed when
 * no row is wanted; asking for nothing is an error. */
Test (engine, forward_ids_argmax_on_the_device_and_wanted_rows_only)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 64, 16);
    struct rx_err err = { 0 };
    const int V = 32000;
    int32_t toks[3] = { 1, 450, 7483 }, slots[3] = { 0, 1, 2 }, pos[3] = { 0, 1, 2 };
    int32_t qs[2] = { 0, 3 }, ks[2] = { 0, 3 }, out_rows[3] = { 0, 1, 2 };
    struct rx_model_batch bt = { .struct_size = sizeof bt, .n_tokens = 3, .tokens = toks, .pos = pos,
                                 .n_seq = 1, .q_start = qs, .kv_start = ks, .kv_slots = slots,
                                 .n_out = 3, .out_rows = out_rows };
    float *all = malloc (3 * V * sizeof (float)), *some = malloc (3 * V * sizeof (float));
    cr_assert_eq (rx_engine_forward (e, &bt, all, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < 3 * V; i++) some[i] = -7.f;
    const uint8_t want[3] = { 0, 1, 0 };
    int32_t ids[3] = { -1, -1, -1 };
    cr_assert_eq (rx_engine_forward_ids (e, &bt, some, want, ids, &err), RX_OK, "%s", err.msg);
    for (int j = 0; j < 3; j++) {
        cr_assert_eq (ids[j], rx_argmax (all + (size_t) j * V, V), "row %d", j);
        for (int i = 0; i < V; i += 97)
            cr_assert_eq (some[(size_t) j * V + i], want[j] ? all[(size_t) j * V + i] : -7.f,
                          "row %d logit %d: %s", j, i, want[j] ? "copied" : "left alone");
    }
    const uint8_t none[3] = { 0, 0, 0 };
    int32_t ids2[3];
    cr_assert_eq (rx_engine_forward_ids (e, &bt, NULL, none, ids2, &err), RX_OK, "%s", err.msg);
    cr_assert (!memcmp (ids, ids2, sizeof ids), "ids only, no logits buffer");
    cr_assert_eq (rx_engine_forward_ids (e, &bt, NULL, none, NULL, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "neither logits nor ids"), "%s", err.msg);
    cr_assert_eq (rx_engine_forward_ids (e, &bt, NULL, want, ids2, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "no logits buffer"), "%s", err.msg);
    free (all);
    free (some);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

/* rx_engine_logits_gather: after a forward, the logits at flat indices
 * (row j, token t: j * n_vocab + t) of its output rows, in any order and
 * with repeats, equal the plain forward's; an index past the rows'
 * storage is refused with one line; nothing asked, nothing done. */
Test (engine, logits_gather_reads_single_logits_of_the_last_step)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 64, 16);
    struct rx_err err = { 0 };
    const int V = 32000;
    cr_assert (rx_engine_can_gather (e), "kernels-cpu has gather_rows");
    int32_t toks[3] = { 1, 450, 7483 }, slots[3] = { 0, 1, 2 }, pos[3] = { 0, 1, 2 };
    int32_t qs[2] = { 0, 3 }, ks[2] = { 0, 3 }, out_rows[3] = { 0, 1, 2 };
    struct rx_model_batch bt = { .struct_size = sizeof bt, .n_tokens = 3, .tokens = toks, .pos = pos,
                                 .n_seq = 1, .q_start = qs, .kv_start = ks, .kv_slots = slots,
                                 .n_out = 3, .out_rows = out_rows };
    float *all = malloc (3 * V * sizeof (float));
    cr_assert_eq (rx_engine_forward (e, &bt, all, &err), RX_OK, "%s", err.msg);
    /* 70000 indices (past the first scratch size), every row, repeats */
    enum { N = 70000 };
    int32_t *idx = malloc (N * sizeof *idx);
    float *got = malloc (N * sizeof *got);
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        idx[i] = (int32_t) ((x >> 33) % (3u * V));
    }
    idx[0] = 0;
    idx[1] = 3 * V - 1;
    idx[2] = idx[3];
    cr_assert_eq (rx_engine_logits_gather (e, idx, N, got, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < N; i++) cr_assert_eq (got[i], all[idx[i]], "index %d (%d)", i, idx[i]);
    /* after the next forward they are that step's */
    toks[2] = 900;
    cr_assert_eq (rx_engine_forward (e, &bt, all, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_engine_logits_gather (e, idx, 64, got, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < 64; i++) cr_assert_eq (got[i], all[idx[i]], "step 2, index %d", i);
    cr_assert_eq (rx_engine_logits_gather (e, idx, 0, NULL, &err), RX_OK, "nothing asked");
    idx[7] = 3 * V;   /* one past the three rows the engine holds */
    cr_assert_eq (rx_engine_logits_gather (e, idx, 8, got, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "logits gather") && strstr (err.msg, "outside"), "%s", err.msg);
    idx[7] = -1;
    cr_assert_eq (rx_engine_logits_gather (e, idx, 8, got, &err), RX_EINVAL);
    cr_assert_eq (rx_engine_logits_gather (e, NULL, 8, got, &err), RX_EINVAL);
    free (idx);
    free (got);
    free (all);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

/* Device sampling's candidates (rx_engine_forward_sample): for the rows
 * with inv_t > 0, packed in row order, the k largest of softmax(logits *
 * inv_t) over the row -- checked against the logits of a plain forward:
 * the ids are the k best logits (the lower id first on ties), the probs
 * the softmax computed here in double.  Rows 0 and 1 share a temperature
 * (one softmax call), row 2 has none, row 3 another; the argmax and the
 * wanted row still come back; the row not copied is fetched after the
 * step with rx_engine_logits_rows. */
/* Candidate row cr of (probs, cid) against row l of a plain forward's
 * logits: exactly the K best ids in (logit desc, id asc) order, with the
 * softmax at inv_t computed here in double. */
static void s_check_cands (const float *l, int V, float inv_t, const float *probs, const int32_t *cid, int K,
                           int j)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++) sum += exp (((double) l[i] - mx) * inv_t);
    for (int q = 0; q < K; q++) {
        const int32_t id = cid[q];
        cr_assert (id >= 0 && id < V, "row %d candidate %d: id %d", j, q, id);
        int better = 0;   /* exactly the q-th: q better tokens, no more */
        for (int i = 0; i < V; i++) better += l[i] > l[id] || (l[i] == l[id] && i < id);
        cr_assert_eq (better, q, "row %d candidate %d (id %d) ranks %d", j, q, id, better);
        const double p = exp (((double) l[id] - mx) * inv_t) / sum;
        cr_assert (fabs (probs[q] - p) <= 1e-5 * p + 1e-9, "row %d candidate %d: %g, want %g", j, q,
                   (double) probs[q], p);
    }
}

Test (engine, forward_sample_candidates_are_the_softmax_top_k_of_their_rows)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 64, 16);
    struct rx_err err = { 0 };
    const int V = 32000, K = 16;
    int32_t toks[4] = { 1, 450, 7483, 338 }, slots[4] = { 0, 1, 2, 3 }, pos[4] = { 0, 1, 2, 3 };
    int32_t qs[2] = { 0, 4 }, ks[2] = { 0, 4 }, out_rows[4] = { 0, 1, 2, 3 };
    struct rx_model_batch bt = { .struct_size = sizeof bt, .n_tokens = 4, .tokens = toks, .pos = pos,
                                 .n_seq = 1, .q_start = qs, .kv_start = ks, .kv_slots = slots,
                                 .n_out = 4, .out_rows = out_rows };
    float *all = malloc (4 * V * sizeof (float)), *some = malloc (4 * V * sizeof (float));
    cr_assert_eq (rx_engine_forward (e, &bt, all, &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < 4 * V; i++) some[i] = -7.f;
    const float inv_t[4] = { 1.25f, 1.25f, 0.f, 0.5f };
    const uint8_t want[4] = { 0, 0, 1, 0 };
    float probs[3 * K];
    int32_t cid[3 * K], ids[4];
    const struct rx_engine_cands c = { .k = K, .inv_t = inv_t, .probs = probs, .ids = cid };
    cr_assert_eq (rx_engine_forward_sample (e, &bt, some, want, ids, &c, &err), RX_OK, "%s", err.msg);
    int packed = 0;
    for (int j = 0; j < 4; j++) {
        const float *l = all + (size_t) j * V;
        cr_assert_eq (ids[j], rx_argmax (l, V), "row %d: the argmax still comes back", j);
        cr_assert_eq (some[(size_t) j * V + 5], want[j] ? l[5] : -7.f, "row %d: copied only if wanted", j);
        if (!(inv_t[j] > 0)) continue;
        const int cr = packed++;
        s_check_cands (l, V, inv_t[j], probs + cr * K, cid + cr * K, K, j);
    }
    cr_assert_eq (packed, 3);
    /* the rows candidates were not enough for, after the step */
    const uint8_t more[4] = { 1, 0, 0, 1 };
    cr_assert_eq (rx_engine_logits_rows (e, some, 4, more, &err), RX_OK, "%s", err.msg);
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < V; i += 101)
            cr_assert_eq (some[(size_t) j * V + i], more[j] || want[j] ? all[(size_t) j * V + i] : -7.f,
                          "row %d logit %d", j, i);
    cr_assert_eq (rx_engine_logits_rows (e, some, 99, more, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "logits rows"), "%s", err.msg);
    const struct rx_engine_cands bad = { .k = K, .inv_t = inv_t, .probs = NULL, .ids = cid };
    cr_assert_eq (rx_engine_forward_sample (e, &bt, some, want, ids, &bad, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "candidates"), "%s", err.msg);
    const struct rx_kernels_ops *KO;
    void *kbe;
    rx_engine_kernels (e, &KO, &kbe);
    struct rx_kernels_info ki = { .struct_size = sizeof ki };
    KO->info (kbe, &ki);
    cr_assert_eq (rx_engine_device_sampling (e), !(ki.caps & RX_KCAP_HOST_VISIBLE),
                  "auto: on exactly when the backend's memory is not host-visible (kernels-cpu: off, "
                  "but on in guard mode)");
    free (all);
    free (some);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

/* More candidate rows than the engine computes at once (64 a chunk):
 * 75 one-token sequences, a temperature run that crosses the chunk
 * boundary, rows without candidates inside it; every candidate row is its
 * own softmax top-k, packed in row order. */
Test (engine, forward_sample_candidates_across_chunks)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    enum { N = 75, K = 4 };
    rx_engine_t *e = s_engine (&b, NULL, m, 128, 128);
    struct rx_err err = { 0 };
    const int V = 32000;
    int32_t toks[N], slots[N], pos[N], qs[N + 1], ks[N + 1], out_rows[N], ids[N];
    float inv_t[N];
    for (int i = 0; i < N; i++) {
        toks[i] = 100 + 37 * i;
        slots[i] = qs[i] = ks[i] = out_rows[i] = i;
        pos[i] = 0;
        inv_t[i] = i == 5 || i == 66 ? 0.f : i < 70 ? 1.f : 2.5f;
    }
    qs[N] = ks[N] = N;
    struct rx_model_batch bt = { .struct_size = sizeof bt, .n_tokens = N, .tokens = toks, .pos = pos,
                                 .n_seq = N, .q_start = qs, .kv_start = ks, .kv_slots = slots,
                                 .n_out = N, .out_rows = out_rows };
    float *all = malloc ((size_t) N * V * sizeof (float));
    static float probs[2 * N * K];
    static int32_t cid[2 * N * K];
    cr_assert_eq (rx_engine_forward (e, &bt, all, &err), RX_OK, "%s", err.msg);
    const struct rx_engine_cands c = { .k = K, .inv_t = inv_t, .probs = probs, .ids = cid };
    cr_assert_eq (rx_engine_forward_sample (e, &bt, NULL, NULL, ids, &c, &err), RX_OK, "%s", err.msg);
    int packed = 0;
    for (int j = 0; j < N; j++) {
        if (!(inv_t[j] > 0)) continue;
        const int cr = packed++;
        s_check_cands (all + (size_t) j * V, V, inv_t[j], probs + cr * K, cid + cr * K, K, j);
    }
    cr_assert_eq (packed, N - 2);
    /* second rows (inv_t2: logprobs at temperature 1 of rows sampled at
     * another), packed after every first row; the last chunk holds both */
    float inv_t2[N];
    for (int i = 0; i < N; i++) inv_t2[i] = i % 5 == 0 ? 1.f : i == 71 ? 0.75f : 0.f;
    const struct rx_engine_cands c2 = { .k = K, .inv_t = inv_t, .probs = probs, .ids = cid, .inv_t2 = inv_t2 };
    cr_assert_eq (rx_engine_forward_sample (e, &bt, NULL, NULL, ids, &c2, &err), RX_OK, "%s", err.msg);
    packed = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < N; j++) {
            const float it = pass ? inv_t2[j] : inv_t[j];
            if (!(it > 0)) continue;
            const int cr = packed++;
            s_check_cands (all + (size_t) j * V, V, it, probs + cr * K, cid + cr * K, K, j);
        }
    cr_assert_eq (packed, N - 2 + 16);
    free (all);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

/* The appended kernel ops against an ABI 1.0 view of the same backend
 * ([kernels] ops_abi = 1.0: no appended ops): model-deepseek2 routes with
 * moe_route, and both MoE models run the experts of their decode steps
 * from device offsets (moe_sort, gather_rows, matmul_grouped, moe_combine;
 * models/moe_experts.h) -- which kernels-cpu takes when it can capture
 * graphs ([kernels.cpu] graphs, no capture asked here), as on a GPU --
 * and without the ops they route and sort on the host as before.  The two
 * give the same logits, bit for bit, through prefills and decode steps of
 * 4 sequences, whose 8 expert rows span two of the model's 4-row windows
 * (max_tokens 4). */
static void s_device_ops_equal_host (const char *model)
{
    char *m = s_model (model);
    struct rx_boot b[2];
    rx_engine_t *e[2] = { s_engine (&b[0], "[kernels.cpu]\ngraphs = true\n", m, 64, 4),
                          s_engine (&b[1], "[kernels]\nops_abi = 1.0\n", m, 64, 4) };
    const struct rx_kernels_ops *K[2];
    void *be;
    for (int i = 0; i < 2; i++) rx_engine_kernels (e[i], &K[i], &be);
    cr_assert (RX_HAS (struct rx_kernels_ops, K[0], moe_combine) && K[0]->moe_route && K[0]->matmul_grouped,
               "kernels-cpu has moe_route and the MoE expert ops");
    cr_assert (!RX_HAS (struct rx_kernels_ops, K[1], moe_route), "hidden by ops_abi = 1.0");
    struct rx_err err = { 0 };
    const int V = rx_engine_info (e[0])->n_vocab;
    float *lg[2] = { malloc ((size_t) 4 * V * sizeof (float)), malloc ((size_t) 4 * V * sizeof (float)) };
    int32_t toks[4][3] = { { 1, 17, 300 }, { 1, 42, 7 }, { 1, 99, 5 }, { 1, 450, 8 } };
    int seq[2][4];
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 2; i++) {
            seq[i][s] = rx_engine_seq_new (e[i], 16, &err);
            struct rx_engine_req r = { seq[i][s], 3, toks[s], 1 };
            cr_assert_eq (rx_engine_step (e[i], &r, 1, lg[i], &err), RX_OK, "%s", err.msg);
        }
        cr_assert (!memcmp (lg[0], lg[1], (size_t) 3 * V * sizeof (float)), "prefill %d", s);
    }
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 2; i++) {
            struct rx_engine_req r[4];
            int32_t tok[4];
            for (int s = 0; s < 4; s++) {
                tok[s] = (int32_t) (100 + 13 * k + s);
                r[s] = (struct rx_engine_req) { seq[i][s], 1, &tok[s], 0 };
            }
            cr_assert_eq (rx_engine_step (e[i], r, 4, lg[i], &err), RX_OK, "%s", err.msg);
        }
        cr_assert (!memcmp (lg[0], lg[1], (size_t) 4 * V * sizeof (float)), "decode step %d", k);
    }
    for (int i = 0; i < 2; i++) {
        free (lg[i]);
        rx_engine_destroy (&e[i]);
        rx_boot_close (&b[i]);
    }
    free (m);
}

Test (engine, deepseek2_device_routing_equals_the_host_fallback)
{
    s_device_ops_equal_host ("tiny-deepseek2.gguf");
}
Test (engine, moe_device_experts_equal_the_host_path) { s_device_ops_equal_host ("tiny-moe.gguf"); }

/* A raw batch over chosen slots; the model plugin checks it. */
static void s_raw_fails (rx_engine_t *e, struct rx_model_batch *bt, float *l, const char *want)
{
    struct rx_err err = { 0 };
    cr_assert_eq (rx_engine_forward (e, bt, l, &err), RX_EINVAL, "should fail: %s", want);
    cr_assert (strstr (err.msg, want), "\"%s\" lacks \"%s\"", err.msg, want);
    cr_assert_null (strchr (err.msg, '\n'));
}

Test (model_llama, bad_raw_batches_are_refused)
{
    struct rx_boot b;
    char *m = s_model ("tiny-llama.gguf");
    rx_engine_t *e = s_engine (&b, NULL, m, 32, 8);
    float *l = malloc (4 * 32000 * sizeof *l);
    int32_t tok[3] = { 1, 450, 7483 }, pos[3] = { 0, 1, 2 }, qs[2] = { 0, 3 }, ks[2] = { 0, 3 },
            sl[3] = { 5, 9, 2 }, out[3] = { 0, 1, 2 };
    struct rx_model_batch good = {
        .struct_size = sizeof good, .n_tokens = 3, .tokens = tok, .pos = pos, .n_seq = 1,
        .q_start = qs, .kv_start = ks, .kv_slots = sl, .n_out = 3, .out_rows = out,
    };
    struct rx_err err = { 0 };
    cr_assert_eq (rx_engine_forward (e, &good, l, &err), RX_OK, "%s", err.msg);

    struct rx_model_batch bt = good;
    int32_t bad_sl[3] = { 5, 32, 2 };
    bt.kv_slots = bad_sl;
    s_raw_fails (e, &bt, l, "KV slot 32");
    bt = good;
    int32_t bad_pos[3] = { 0, 2, 1 };
    bt.pos = bad_pos;
    s_raw_fails (e, &bt, l, "positions must increase");
    bt = good;
    int32_t far_pos[3] = { 0, 1, 3 };
    bt.pos = far_pos;
    s_raw_fails (e, &bt, l, "KV length 3");
    bt = good;
    int32_t bad_qs[2] = { 0, 2 };
    bt.q_start = bad_qs;
    s_raw_fails (e, &bt, l, "q_start");
    bt = good;
    int32_t bad_out[2] = { 2, 1 };
    bt.out_rows = bad_out;
    bt.n_out = 2;
    s_raw_fails (e, &bt, l, "output row");
    bt = good;
    bt.n_tokens = 9;
    s_raw_fails (e, &bt, l, "9 tokens");
    bt = good;
    int32_t short_ks[2] = { 0, 2 };
    bt.kv_start = short_ks;
    s_raw_fails (e, &bt, l, "2 KV slots for 3 new tokens");
    bt = good;
    s_raw_fails (e, &bt, NULL, "no logits buffer");
    free (l);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (m);
}

/* ------------------------------------------------- attn-mha directly -- */

struct mha_fix {
    rx_loader_t *l;
    const struct rx_kernels_ops *K;
    void *be;
    const struct rx_attn_ops *A;
    const struct rx_host *ah;
};

static void s_mha_open (struct mha_fix *f)
{
    struct rx_err err = { 0 };
    f->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (f->l, "%s", err.msg);
    rx_plugin_t *kp, *ap;
    cr_assert_eq (rx_loader_find (f->l, RX_KIND_KERNELS, "cpu", &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (kp, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (f->l, RX_KIND_ATTENTION, "mha", &ap, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (ap, NULL, &err), RX_OK, "%s", err.msg);
    f->K = rx_plugin_ops (kp);
    f->A = rx_plugin_ops (ap);
    f->ah = rx_plugin_host (ap);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 1 };
    cr_assert_eq (f->K->create (rx_plugin_host (kp), &p, &f->be, &err), RX_OK, "%s", err.msg);
}

static void s_mha_close (struct mha_fix *f)
{
    f->K->destroy (f->be);
    rx_loader_destroy (&f->l);
}

static struct rx_attn_config s_cfg (void)
{
    struct rx_attn_config c = {
        .struct_size = sizeof c, .kv_kind = RX_ATTN_KV_HEADS, .n_layer = 3, .n_head = 4,
        .n_kv_head = 2, .hd_k = 16, .hd_v = 8, .kv_dtype = RX_F32, .scale = 0.25f,
    };
    return c;
}

static void s_mha_refuses (struct mha_fix *f, struct rx_attn_config c, int code, const char *want)
{
    struct rx_kctx k = { f->K, f->be, NULL };
    void *a = (void *) 1;
    struct rx_err err = { 0 };
    cr_assert_eq (f->A->create (f->ah, &k, &c, &a, &err), code, "%s", err.msg);
    cr_assert_null (a);
    cr_assert (strstr (err.msg, want), "\"%s\" lacks \"%s\"", err.msg, want);
}

Test (attn_mha, refuses_configs_it_cannot_run)
{
    struct mha_fix f;
    s_mha_open (&f);
    struct rx_attn_config c = s_cfg ();
    c.kv_kind = RX_ATTN_KV_LATENT;
    s_mha_refuses (&f, c, RX_ENOTSUP, "mla");
    c = s_cfg ();
    c.n_kv_head = 3;
    s_mha_refuses (&f, c, RX_EINVAL, "3 kv heads");
    c = s_cfg ();
    c.hd_v = 0;
    s_mha_refuses (&f, c, RX_EINVAL, "head dims");
    c = s_cfg ();
    c.n_layer = 0;
    s_mha_refuses (&f, c, RX_EINVAL, "0 layers");
    c = s_cfg ();
    c.kv_dtype = RX_Q8_0;
    s_mha_refuses (&f, c, RX_EINVAL, "q8_0");
    c = s_cfg ();
    c.scale = 0;
    s_mha_refuses (&f, c, RX_EINVAL, "scale");
    c = s_cfg ();
    c.struct_size = 8;
    s_mha_refuses (&f, c, RX_EINVAL, "too short");
    s_mha_close (&f);
}

Test (attn_mha, pool_sizing_and_forward_preconditions)
{
    struct mha_fix fx, *f = &fx;
    s_mha_open (f);
    struct rx_kctx k = { f->K, f->be, NULL };
    struct rx_attn_config c = s_cfg ();
    void *a = NULL;
    struct rx_err err = { 0 };
    cr_assert_eq (f->A->create (f->ah, &k, &c, &a, &err), RX_OK, "%s", err.msg);
    /* 3 layers x 2 KV heads x (16 + 8) x 4 bytes */
    cr_assert_eq (f->A->kv_bytes_per_token (a), 3u * 2u * 24u * 4u);
    float q[64] = { 0 }, kv[32] = { 0 }, out[32];
    int32_t *dev;
    cr_assert_eq (f->K->alloc (f->be, 64, 0, (void **) &dev, &err), RX_OK);
    cr_assert_eq (f->K->memset_ (f->be, NULL, dev, 0, 64, &err), RX_OK);   /* device memory */
    struct rx_attn_batch bt = { .n_seq = 1, .n_tokens = 1, .q_start = dev, .kv_start = dev,
                                .slots = dev, .q_pos = dev };
    struct rx_attn_io io = { .struct_size = sizeof io, .q = q, .ldq = 64, .k = kv, .ldk = 32,
                             .v = kv, .ldv = 16, .out = out, .ldo = 32 };
    cr_assert_eq (f->A->forward (a, 0, &bt, dev, &io, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "before kv_alloc"), "%s", err.msg);
    cr_assert_eq (f->A->kv_alloc (a, 0, &err), RX_EINVAL);
    cr_assert_eq (f->A->kv_alloc (a, 100, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (f->A->kv_alloc (a, 50, &err), RX_OK, "again: the old pool is freed");
    cr_assert_eq (f->A->forward (a, 3, &bt, dev, &io, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "layer 3"), "%s", err.msg);
    io.v = NULL;
    cr_assert_eq (f->A->forward (a, 0, &bt, dev, &io, &err), RX_EINVAL);
    f->K->free_ (f->be, dev);
    f->A->destroy (a);
    f->A->destroy (NULL);
    s_mha_close (f);
}
