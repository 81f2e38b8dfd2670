/* tests/unit/test_gguf_writer.c -- the GGUF writer (round trip through the
 * reader, misuse errors, atomic output) and `radix gguf-gen` run as a real
 * process (shapes, metadata, determinism, quantized output close to f32). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "quant.h"
#include "../testutil.h"

static char *s_dir;

static void s_setup (void) { s_dir = tu_tmpdir (); }

static void s_teardown (void)
{
    char cmd[512];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system (cmd) != 0) fprintf (stderr, "cannot remove %s\n", s_dir);
    free (s_dir);
}

static int s_exists (const char *p) { return access (p, F_OK) == 0; }

TestSuite (gguf_writer, .init = s_setup, .fini = s_teardown);

Test (gguf_writer, round_trip_every_type)
{
    char *p = tu_path (s_dir, "rt.gguf");
    struct rx_err err = { 0 };
    rx_gguf_writer_t *w = rx_gguf_writer_new (p, &err);
    cr_assert_not_null (w, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_set_alignment (w, 64, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_u8 (w, "k.u8", 250, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_i8 (w, "k.i8", -5, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_u16 (w, "k.u16", 65000, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_i16 (w, "k.i16", -300, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_u32 (w, "k.u32", 123456789, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_i32 (w, "k.i32", -123456789, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_u64 (w, "k.u64", 1ull << 50, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_i64 (w, "k.i64", -(1ll << 50), &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_f32 (w, "k.f32", 3.5f, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_f64 (w, "k.f64", 0.125, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_bool (w, "k.bool", 1, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_str (w, "k.str", "hello", &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_strn (w, "k.bin", "a\0b", 3, &err), RX_OK);
    int32_t ia[3] = { -1, 0, 7 };
    cr_assert_eq (rx_gguf_writer_add_arr (w, "k.arr.i32", RX_GGUF_INT32, ia, 3, &err), RX_OK);
    float fa[2] = { 0.5f, -2.0f };
    cr_assert_eq (rx_gguf_writer_add_arr (w, "k.arr.f32", RX_GGUF_FLOAT32, fa, 2, &err), RX_OK);
    uint8_t ba[2] = { 1, 0 };
    cr_assert_eq (rx_gguf_writer_add_arr (w, "k.arr.bool", RX_GGUF_BOOL, ba, 2, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_arr (w, "k.arr.empty", RX_GGUF_UINT64, NULL, 0, &err), RX_OK);
    const char *sa[3] = { "<s>", "", "zz" };
    cr_assert_eq (rx_gguf_writer_add_arr_str (w, "k.arr.str", sa, NULL, 3, &err), RX_OK);
    const char *sb[2] = { "x\0y", "q" };
    size_t sbl[2] = { 3, 1 };
    cr_assert_eq (rx_gguf_writer_add_arr_str (w, "k.arr.bin", sb, sbl, 2, &err), RX_OK);

    uint64_t ne_a[2] = { 5, 3 }, ne_b[1] = { 64 }, ne_c[3] = { 2, 2, 2 };
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "a", RX_F32, 2, ne_a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "b", RX_Q8_0, 1, ne_b, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "c", RX_F16, 3, ne_c, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_tensor_nbytes (w, 0), 60);
    cr_assert_eq (rx_gguf_writer_tensor_nbytes (w, 1), 68);
    cr_assert_eq (rx_gguf_writer_tensor_nbytes (w, 2), 16);
    cr_assert_eq (rx_gguf_writer_begin (w, &err), RX_OK, "%s", err.msg);
    cr_assert (!s_exists (p), "final file exists before finish");
    uint8_t data[60 + 68 + 16];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t) (i * 7 + 1);
    /* odd chunking across tensor boundaries */
    cr_assert_eq (rx_gguf_writer_write (w, data, 7, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_write (w, data + 7, 100, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_write (w, data + 107, sizeof data - 107, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_OK, "%s", err.msg);
    rx_gguf_writer_destroy (&w);
    cr_assert_null (w);
    char tmp[4200];
    snprintf (tmp, sizeof tmp, "%s.tmp", p);
    cr_assert (!s_exists (tmp));

    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    cr_assert_eq (rx_gguf_version (g), 3);
    cr_assert_eq (rx_gguf_alignment (g), 64);
    cr_assert_eq (rx_gguf_kv_count (g), 20);
    cr_assert_str_eq (rx_gguf_kv_key (g, 0), "general.alignment");
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    int b;
    const char *s;
    size_t n;
    int et;
    cr_assert (rx_gguf_get_u32 (g, "k.u8", &u32) == RX_OK && u32 == 250);
    cr_assert_eq (rx_gguf_kv_type (g, (size_t) rx_gguf_find_key (g, "k.u8")), RX_GGUF_UINT8);
    cr_assert (rx_gguf_get_i64 (g, "k.i8", &i64) == RX_OK && i64 == -5);
    cr_assert_eq (rx_gguf_kv_type (g, (size_t) rx_gguf_find_key (g, "k.i8")), RX_GGUF_INT8);
    cr_assert (rx_gguf_get_u32 (g, "k.u16", &u32) == RX_OK && u32 == 65000);
    cr_assert (rx_gguf_get_i64 (g, "k.i16", &i64) == RX_OK && i64 == -300);
    cr_assert (rx_gguf_get_u32 (g, "k.u32", &u32) == RX_OK && u32 == 123456789);
    cr_assert (rx_gguf_get_i64 (g, "k.i32", &i64) == RX_OK && i64 == -123456789);
    cr_assert (rx_gguf_get_u64 (g, "k.u64", &u64) == RX_OK && u64 == 1ull << 50);
    cr_assert (rx_gguf_get_i64 (g, "k.i64", &i64) == RX_OK && i64 == -(1ll << 50));
    cr_assert (rx_gguf_get_f32 (g, "k.f32", &f) == RX_OK && f == 3.5f);
    cr_assert (rx_gguf_get_f32 (g, "k.f64", &f) == RX_OK && f == 0.125f);
    cr_assert_eq (rx_gguf_kv_type (g, (size_t) rx_gguf_find_key (g, "k.f64")), RX_GGUF_FLOAT64);
    cr_assert (rx_gguf_get_bool (g, "k.bool", &b) == RX_OK && b == 1);
    cr_assert (rx_gguf_get_str (g, "k.str", &s, &n) == RX_OK && n == 5 && !memcmp (s, "hello", 5));
    cr_assert (rx_gguf_get_str (g, "k.bin", &s, &n) == RX_OK && n == 3 && !memcmp (s, "a\0b", 3));
    const void *d;
    cr_assert (rx_gguf_get_arr (g, "k.arr.i32", &et, &n) == RX_OK && et == RX_GGUF_INT32 && n == 3);
    cr_assert (rx_gguf_arr_data (g, "k.arr.i32", &d) == RX_OK && !memcmp (d, ia, sizeof ia));
    cr_assert (rx_gguf_arr_data (g, "k.arr.f32", &d) == RX_OK && !memcmp (d, fa, sizeof fa));
    cr_assert (rx_gguf_arr_data (g, "k.arr.bool", &d) == RX_OK && !memcmp (d, ba, sizeof ba));
    cr_assert (rx_gguf_get_arr (g, "k.arr.empty", &et, &n) == RX_OK && et == RX_GGUF_UINT64 && n == 0);
    cr_assert (rx_gguf_get_arr (g, "k.arr.str", &et, &n) == RX_OK && et == RX_GGUF_STRING && n == 3);
    cr_assert (rx_gguf_arr_str (g, "k.arr.str", 0, &s, &n) == RX_OK && n == 3 && !memcmp (s, "<s>", 3));
    cr_assert (rx_gguf_arr_str (g, "k.arr.str", 1, &s, &n) == RX_OK && n == 0);
    cr_assert (rx_gguf_arr_str (g, "k.arr.str", 2, &s, &n) == RX_OK && n == 2 && !memcmp (s, "zz", 2));
    cr_assert (rx_gguf_arr_str (g, "k.arr.bin", 0, &s, &n) == RX_OK && n == 3 && !memcmp (s, "x\0y", 3));

    cr_assert_eq (rx_gguf_tensor_count (g), 3);
    const struct rx_gguf_tensor *ta = rx_gguf_find_tensor (g, "a"), *tb = rx_gguf_find_tensor (g, "b"),
                                *tc = rx_gguf_find_tensor (g, "c");
    cr_assert (ta && tb && tc);
    cr_assert (ta->type == RX_F32 && ta->n_dims == 2 && ta->ne[0] == 5 && ta->ne[1] == 3);
    cr_assert (tb->type == RX_Q8_0 && tb->n_dims == 1 && tb->ne[0] == 64 && tb->nbytes == 68);
    cr_assert (tc->type == RX_F16 && tc->n_dims == 3 && tc->ne[2] == 2 && tc->nbytes == 16);
    /* consecutive padded offsets, as llama.cpp requires */
    cr_assert_eq (ta->offset, 0);
    cr_assert_eq (tb->offset, 64);
    cr_assert_eq (tc->offset, 192);
    cr_assert_eq (rx_gguf_data_offset (g) % 64, 0);
    cr_assert_eq (memcmp (ta->data, data, 60), 0);
    cr_assert_eq (memcmp (tb->data, data + 60, 68), 0);
    cr_assert_eq (memcmp (tc->data, data + 128, 16), 0);
    cr_assert_eq (rx_gguf_file_size (g), rx_gguf_data_offset (g) + 192 + 64);   /* last one padded too */
    rx_gguf_close (&g);
    free (p);
}

Test (gguf_writer, misuse_is_refused)
{
    char *p = tu_path (s_dir, "bad.gguf");
    struct rx_err err = { 0 };
    rx_gguf_writer_t *w = rx_gguf_writer_new (p, &err);
    cr_assert_not_null (w);
    cr_assert_eq (rx_gguf_writer_add_u32 (w, "k", 1, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_str (w, "k", "again", &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "duplicate metadata key 'k'"), "%s", err.msg);
    cr_assert_not_null (strstr (err.msg, p), "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_u32 (w, "", 1, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_set_alignment (w, 48, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "alignment 48"), "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_set_alignment (w, 0, &err), RX_EINVAL);
    uint8_t bad_bool = 2;
    cr_assert_eq (rx_gguf_writer_add_arr (w, "bb", RX_GGUF_BOOL, &bad_bool, 1, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_add_arr (w, "ss", RX_GGUF_STRING, "x", 1, &err), RX_EINVAL);
    uint64_t ne[2] = { 64, 2 }, ne33[1] = { 33 }, ne0[2] = { 4, 0 };
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "t", RX_F32, 2, ne, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "t", RX_F32, 2, ne, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "duplicate tensor name 't'"), "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "q", RX_Q8_0, 1, ne33, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "not a multiple of the q8_0 block 32"), "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "z", RX_F32, 2, ne0, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "u", 4, 2, ne, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "unknown type 4"), "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "d", RX_F32, 5, ne, &err), RX_EINVAL);
    char longname[80];
    memset (longname, 'x', 65);
    longname[65] = '\0';
    cr_assert_eq (rx_gguf_writer_add_tensor (w, longname, RX_F32, 2, ne, &err), RX_EINVAL);
    /* data before begin, metadata after begin, too much data, too little */
    float row[64] = { 0 };
    cr_assert_eq (rx_gguf_writer_write (w, row, 4, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_begin (w, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_u32 (w, "late", 1, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_add_tensor (w, "late", RX_F32, 2, ne, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_begin (w, &err), RX_EINVAL);
    cr_assert_eq (rx_gguf_writer_write (w, row, sizeof row, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "tensor 't' has 256 of its 512 bytes"), "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_write (w, row, sizeof row, &err), RX_OK);
    cr_assert_eq (rx_gguf_writer_write (w, row, 1, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "more tensor data than the tensors declared"), "%s", err.msg);
    /* abandoned: neither the file nor its temporary remains */
    rx_gguf_writer_destroy (&w);
    char tmp[4200];
    snprintf (tmp, sizeof tmp, "%s.tmp", p);
    cr_assert (!s_exists (p));
    cr_assert (!s_exists (tmp));
    rx_gguf_writer_destroy (&w);   /* NULL is fine */

    /* an unwritable place gives one message naming it */
    w = rx_gguf_writer_new ("/nonexistent-dir/x.gguf", &err);
    cr_assert_not_null (w);
    cr_assert_eq (rx_gguf_writer_begin (w, &err), RX_EIO);
    cr_assert_not_null (strstr (err.msg, "/nonexistent-dir/x.gguf.tmp: cannot create"), "%s", err.msg);
    rx_gguf_writer_destroy (&w);
    free (p);
}

Test (gguf_writer, empty_file_without_tensors)
{
    char *p = tu_path (s_dir, "empty.gguf");
    struct rx_err err = { 0 };
    rx_gguf_writer_t *w = rx_gguf_writer_new (p, &err);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_OK, "%s", err.msg);   /* begin implied */
    rx_gguf_writer_destroy (&w);
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    cr_assert_eq (rx_gguf_kv_count (g), 0);
    cr_assert_eq (rx_gguf_tensor_count (g), 0);
    cr_assert_eq (rx_gguf_file_size (g), 32);   /* 24-byte header padded to 32 */
    rx_gguf_close (&g);
    free (p);
}

/* Copying every KV of a real vocabulary reproduces its values byte for byte. */
Test (gguf_writer, copy_kv_from_vocab)
{
    const char *sh = getenv ("RADIX_SHARED");
    if (!sh || !*sh) cr_skip_test ("RADIX_SHARED is not set: no vocabulary to copy");
    char src[4096];
    snprintf (src, sizeof src, "%s/data/tokenizers/ggml-vocab-gpt-2.gguf", sh);
    if (access (src, R_OK) != 0) cr_skip_test ("%s not found", src);
    struct rx_err err = { 0 };
    rx_gguf_t *v = rx_gguf_open (src, &err);
    cr_assert_not_null (v, "%s", err.msg);
    char *p = tu_path (s_dir, "copy.gguf");
    rx_gguf_writer_t *w = rx_gguf_writer_new (p, &err);
    for (size_t i = 0; i < rx_gguf_kv_count (v); i++)
        cr_assert_eq (rx_gguf_writer_copy_kv (w, v, i, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_copy_kv (w, v, 0, &err), RX_EINVAL);          /* duplicate */
    cr_assert_eq (rx_gguf_writer_copy_kv (w, v, 100000, &err), RX_ENOENT);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_OK, "%s", err.msg);
    rx_gguf_writer_destroy (&w);
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    cr_assert_eq (rx_gguf_kv_count (g), rx_gguf_kv_count (v));
    for (size_t i = 0; i < rx_gguf_kv_count (v); i++) {
        const void *a, *b;
        size_t na, nb;
        cr_assert_str_eq (rx_gguf_kv_key (g, i), rx_gguf_kv_key (v, i));
        cr_assert_eq (rx_gguf_kv_type (g, i), rx_gguf_kv_type (v, i));
        rx_gguf_kv_raw (v, i, &a, &na);
        rx_gguf_kv_raw (g, i, &b, &nb);
        cr_assert_eq (na, nb);
        cr_assert_eq (memcmp (a, b, na), 0, "%s differs", rx_gguf_kv_key (v, i));
    }
    rx_gguf_close (&g);
    rx_gguf_close (&v);
    free (p);
}

/* ------------------------------------------------------------ gguf-gen -- */

static const char *s_vocab (void)
{
    static char p[4096];
    const char *sh = getenv ("RADIX_SHARED");
    if (!sh || !*sh) cr_skip_test ("RADIX_SHARED is not set: no vocabulary for gguf-gen");
    snprintf (p, sizeof p, "%s/data/tokenizers/ggml-vocab-llama-spm.gguf", sh);
    if (access (p, R_OK) != 0) cr_skip_test ("%s not found", p);
    return p;
}

/* The llama-spm vocabulary as ("--vocab", PATH), or, without ../shared, a
 * tokenizer-less vocabulary of 1000 as ("--dims", "vocab=1000"). */
static void s_vocab_opt (const char **k, const char **v)
{
    static char p[4096];
    const char *sh = getenv ("RADIX_SHARED");
    if (sh && *sh) {
        snprintf (p, sizeof p, "%s/data/tokenizers/ggml-vocab-llama-spm.gguf", sh);
        if (access (p, R_OK) == 0) {
            *k = "--vocab";
            *v = p;
            return;
        }
    }
    *k = "--dims";
    *v = "vocab=1000";
}

/* Run `radix gguf-gen ARGS... --out DIR/out`; returns the run (caller frees). */
static struct tu_run s_gen (const char *out, const char *const *args)
{
    char *argv[32];
    int n = 0;
    argv[n++] = (char *) tu_env ("RADIX");
    argv[n++] = (char *) "gguf-gen";
    for (; *args; args++) argv[n++] = (char *) *args;
    if (out) {
        argv[n++] = (char *) "--out";
        argv[n++] = (char *) out;
    }
    argv[n] = NULL;
    return tu_run_env (argv, NULL);
}

static void s_expect_u32 (const rx_gguf_t *g, const char *key, uint32_t want)
{
    uint32_t v = 0;
    cr_assert_eq (rx_gguf_get_u32 (g, key, &v), RX_OK, "%s missing", key);
    cr_assert_eq (v, want, "%s = %u, want %u", key, v, want);
}

static int s_same_file (const char *a, const char *b)
{
    size_t na, nb;
    void *x = tu_read_file (a, &na), *y = tu_read_file (b, &nb);
    int same = na == nb && memcmp (x, y, na) == 0;
    free (x);
    free (y);
    return same;
}

Test (gguf_writer, gen_tiny_llama)
{
    const char *vocab = s_vocab ();
    char *out = tu_path (s_dir, "tiny.gguf");
    const char *args[] = { "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "f16", NULL };
    struct tu_run r = s_gen (out, args);
    cr_assert_eq (r.status, 0, "gguf-gen failed: %s", r.err);
    cr_assert_not_null (strstr (r.out, "21 tensors"), "%s", r.out);
    tu_run_free (&r);

    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (out, &err);
    cr_assert_not_null (g, "%s", err.msg);
    const char *s;
    size_t n;
    cr_assert (rx_gguf_get_str (g, "general.architecture", &s, &n) == RX_OK && n == 5 && !memcmp (s, "llama", 5));
    cr_assert (rx_gguf_get_str (g, "general.name", &s, &n) == RX_OK && n == 4 && !memcmp (s, "tiny", 4));
    s_expect_u32 (g, "general.file_type", 1);
    s_expect_u32 (g, "llama.embedding_length", 64);
    s_expect_u32 (g, "llama.block_count", 2);
    s_expect_u32 (g, "llama.attention.head_count", 4);
    s_expect_u32 (g, "llama.attention.head_count_kv", 2);
    s_expect_u32 (g, "llama.feed_forward_length", 128);
    s_expect_u32 (g, "llama.context_length", 512);
    s_expect_u32 (g, "llama.rope.dimension_count", 16);
    s_expect_u32 (g, "llama.vocab_size", 32000);
    float f;
    cr_assert (rx_gguf_get_f32 (g, "llama.rope.freq_base", &f) == RX_OK && f == 10000.0f);
    cr_assert (rx_gguf_get_f32 (g, "llama.attention.layer_norm_rms_epsilon", &f) == RX_OK && f == 1e-5f);
    cr_assert_eq (rx_gguf_find_key (g, "general.quantization_version"), -1);   /* not quantized */

    /* every tokenizer.* key of the vocabulary, byte for byte */
    rx_gguf_t *v = rx_gguf_open (vocab, &err);
    cr_assert_not_null (v, "%s", err.msg);
    int copied = 0;
    for (size_t i = 0; i < rx_gguf_kv_count (v); i++) {
        const char *k = rx_gguf_kv_key (v, i);
        long j = rx_gguf_find_key (g, k);
        if (strncmp (k, "tokenizer.", 10) != 0) continue;
        cr_assert_geq (j, 0, "%s not copied", k);
        const void *a, *b;
        size_t na, nb;
        rx_gguf_kv_raw (v, i, &a, &na);
        rx_gguf_kv_raw (g, (size_t) j, &b, &nb);
        cr_assert (na == nb && memcmp (a, b, na) == 0, "%s differs", k);
        copied++;
    }
    cr_assert_geq (copied, 5);
    rx_gguf_close (&v);

    cr_assert_eq (rx_gguf_tensor_count (g), 21);
    static const struct { const char *n; int type; uint64_t ne0, ne1; } want[] = {
        { "token_embd.weight", RX_F16, 64, 32000 }, { "output.weight", RX_F16, 64, 32000 },
        { "output_norm.weight", RX_F32, 64, 1 },    { "blk.0.attn_norm.weight", RX_F32, 64, 1 },
        { "blk.0.attn_q.weight", RX_F16, 64, 64 },  { "blk.0.attn_k.weight", RX_F16, 64, 32 },
        { "blk.0.attn_v.weight", RX_F16, 64, 32 },  { "blk.1.attn_output.weight", RX_F16, 64, 64 },
        { "blk.1.ffn_norm.weight", RX_F32, 64, 1 }, { "blk.1.ffn_gate.weight", RX_F16, 64, 128 },
        { "blk.1.ffn_up.weight", RX_F16, 64, 128 }, { "blk.1.ffn_down.weight", RX_F16, 128, 64 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, want[i].n);
        cr_assert_not_null (t, "no %s", want[i].n);
        cr_assert_eq (t->type, want[i].type, "%s", want[i].n);
        cr_assert (t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1, "%s shape", want[i].n);
        cr_assert_eq (t->n_dims, want[i].ne1 == 1 ? 1u : 2u, "%s", want[i].n);
    }
    /* sane values: norms near 1, matrices zero-mean with std about 1/sqrt(in) */
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, "blk.0.ffn_norm.weight");
    for (int i = 0; i < 64; i++) {
        float x = ((const float *) t->data)[i];
        cr_assert (x > 0.9f && x < 1.1f, "norm weight %g", x);
    }
    t = rx_gguf_find_tensor (g, "blk.0.ffn_gate.weight");
    double sum = 0, sq = 0;
    for (int i = 0; i < 64 * 128; i++) {
        float x = rx_fp16_to_fp32 (((const uint16_t *) t->data)[i]);
        sum += x;
        sq += (double) x * x;
    }
    double mean = sum / (64 * 128), sd = sqrt (sq / (64 * 128) - mean * mean);
    cr_assert (fabs (mean) < 0.01, "mean %g", mean);
    cr_assert (sd > 0.1 && sd < 0.15, "std %g (want about 1/8)", sd);
    rx_gguf_close (&g);
    free (out);
}

Test (gguf_writer, gen_is_deterministic)
{
    const char *vk, *vocab;
    s_vocab_opt (&vk, &vocab);
    char *a = tu_path (s_dir, "a.gguf"), *b = tu_path (s_dir, "b.gguf"), *c = tu_path (s_dir, "c.gguf");
    /* the thread count never changes the output */
    const char *args1[] = { "--arch", "llama", "--preset", "tiny", vk, vocab, "--type", "q8_0",
                            "--seed", "42", "--threads", "3", NULL };
    const char *args1b[] = { "--arch", "llama", "--preset", "tiny", vk, vocab, "--type", "q8_0",
                             "--seed", "42", "--threads", "1", NULL };
    const char *args2[] = { "--arch", "llama", "--preset", "tiny", vk, vocab, "--type", "q8_0",
                            "--seed", "43", NULL };
    struct tu_run r = s_gen (a, args1);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    r = s_gen (b, args1b);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    r = s_gen (c, args2);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    cr_assert (s_same_file (a, b), "same seed, different bytes");
    cr_assert (!s_same_file (a, c), "different seeds, same bytes");
    /* the seeds differ in the weights, not only in the description */
    struct rx_err err = { 0 };
    rx_gguf_t *ga = rx_gguf_open (a, &err), *gc = rx_gguf_open (c, &err);
    cr_assert (ga && gc);
    const struct rx_gguf_tensor *ta = rx_gguf_find_tensor (ga, "blk.0.attn_q.weight"),
                                *tc = rx_gguf_find_tensor (gc, "blk.0.attn_q.weight");
    cr_assert_eq (ta->nbytes, tc->nbytes);
    cr_assert_neq (memcmp (ta->data, tc->data, ta->nbytes), 0);
    rx_gguf_close (&ga);
    rx_gguf_close (&gc);
    free (a);
    free (b);
    free (c);
}

/* q8_0 of a seed dequantizes close to the f32 file of the same seed. */
Test (gguf_writer, gen_q8_0_close_to_f32)
{
    const char *vk, *vocab;
    s_vocab_opt (&vk, &vocab);
    char *a = tu_path (s_dir, "f32.gguf"), *b = tu_path (s_dir, "q8.gguf");
    const char *args1[] = { "--arch", "llama", "--preset", "tiny", vk, vocab, "--type", "f32", NULL };
    const char *args2[] = { "--arch", "llama", "--preset", "tiny", vk, vocab, "--type", "q8_0", NULL };
    struct tu_run r = s_gen (a, args1);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    r = s_gen (b, args2);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    struct rx_err err = { 0 };
    rx_gguf_t *gf = rx_gguf_open (a, &err), *gq = rx_gguf_open (b, &err);
    cr_assert (gf && gq, "%s", err.msg);
    s_expect_u32 (gf, "general.file_type", 0);
    s_expect_u32 (gq, "general.file_type", 7);
    s_expect_u32 (gq, "general.quantization_version", 2);
    cr_assert_eq (rx_gguf_tensor_count (gf), rx_gguf_tensor_count (gq));
    int checked = 0;
    for (size_t i = 0; i < rx_gguf_tensor_count (gf); i++) {
        const struct rx_gguf_tensor *tf = rx_gguf_tensor (gf, i), *tq = rx_gguf_tensor (gq, i);
        cr_assert_str_eq (tf->name, tq->name);
        cr_assert_eq (tf->type, RX_F32);
        cr_assert_eq (tq->type, tf->n_dims == 1 ? RX_F32 : RX_Q8_0, "%s", tq->name);
        cr_assert_eq (tf->n_elements, tq->n_elements);
        float *y = malloc (tf->n_elements * sizeof *y);
        cr_assert_eq (rx_dequantize_row (tq->type, tq->data, y, tq->n_elements), RX_OK);
        const float *x = tf->data;
        double err2 = 0, sig2 = 0, maxabs = 0;
        for (size_t j = 0; j < tf->n_elements; j++)
            if (fabs (x[j]) > maxabs) maxabs = fabs (x[j]);
        for (size_t j = 0; j < tf->n_elements; j++) {
            double e = (double) y[j] - x[j];
            err2 += e * e;
            sig2 += (double) x[j] * x[j];
            /* q8_0: |error| <= about half a step (block max|x| / 127) */
            cr_assert_leq (fabs (e), maxabs / 127.0 + 1e-6, "%s[%zu]: %g vs %g", tf->name, j, y[j], x[j]);
        }
        cr_assert_lt (sqrt (err2 / sig2), 0.01, "%s: relative error %g", tf->name, sqrt (err2 / sig2));
        if (tf->n_dims == 1)
            cr_assert_eq (memcmp (tf->data, tq->data, tf->nbytes), 0, "%s", tf->name);
        free (y);
        checked++;
    }
    cr_assert_eq (checked, 21);
    rx_gguf_close (&gf);
    rx_gguf_close (&gq);
    free (a);
    free (b);
}

/* K-quants need rows of 256: a 64-wide model falls back (and says so), a
 * 256-wide one keeps the type; the tied preset has no output.weight. */
Test (gguf_writer, gen_kquant_fallback_and_dims)
{
    const char *vocab = s_vocab ();
    char *a = tu_path (s_dir, "k.gguf"), *b = tu_path (s_dir, "k256.gguf");
    const char *args1[] = { "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "q4_k", NULL };
    struct tu_run r = s_gen (a, args1);
    cr_assert_eq (r.status, 0, "%s", r.err);
    cr_assert_not_null (strstr (r.err, "q4_K needs rows that are a multiple of 256"), "%s", r.err);
    cr_assert_not_null (strstr (r.err, "written as q8_0 instead"), "%s", r.err);
    tu_run_free (&r);
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (a, &err);
    cr_assert_not_null (g, "%s", err.msg);
    cr_assert_eq (rx_gguf_find_tensor (g, "blk.0.attn_q.weight")->type, RX_Q8_0);
    s_expect_u32 (g, "general.file_type", 14);
    rx_gguf_close (&g);

    const char *args2[] = { "--arch", "llama", "--dims", "embd=256,layers=1,heads=4,kv_heads=1,ffn=512,ctx=128,tied=1",
                            "--vocab", vocab, "--type", "q6_k", "--name", "k6", NULL };
    r = s_gen (b, args2);
    cr_assert_eq (r.status, 0, "%s", r.err);
    cr_assert_eq (r.err[0], '\0', "unexpected fallback: %s", r.err);
    tu_run_free (&r);
    g = rx_gguf_open (b, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "llama.embedding_length", 256);
    s_expect_u32 (g, "llama.attention.head_count_kv", 1);
    s_expect_u32 (g, "llama.context_length", 128);
    s_expect_u32 (g, "llama.rope.dimension_count", 64);
    cr_assert_null (rx_gguf_find_tensor (g, "output.weight"));               /* tied */
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, "blk.0.attn_k.weight");
    cr_assert (t && t->type == RX_Q6_K && t->ne[0] == 256 && t->ne[1] == 64);
    t = rx_gguf_find_tensor (g, "blk.0.ffn_down.weight");
    cr_assert (t && t->type == RX_Q6_K && t->ne[0] == 512 && t->ne[1] == 256);
    cr_assert_eq (t->nbytes, 256 * 2 * 210);
    rx_gguf_close (&g);
    free (a);
    free (b);
}

/* q4_k_m follows llama.cpp's recipe; several --dims apply in order. */
Test (gguf_writer, gen_q4_k_m_mix)
{
    char *out = tu_path (s_dir, "km.gguf");
    const char *args[] = { "--arch", "llama", "--dims", "embd=256,layers=8,heads=4,kv_heads=2",
                           "--dims", "ffn=256,vocab=256,ctx=64", "--type", "q4_k_m", NULL };
    struct tu_run r = s_gen (out, args);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (out, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "general.file_type", 15);
    s_expect_u32 (g, "llama.feed_forward_length", 256);
    s_expect_u32 (g, "llama.block_count", 8);
    cr_assert_eq (rx_gguf_find_tensor (g, "output.weight")->type, RX_Q6_K);
    cr_assert_eq (rx_gguf_find_tensor (g, "token_embd.weight")->type, RX_Q4_K);
    /* 8 layers: more bits for layer 0, 7 and (l - 1) % 3 == 2, i.e. 3 and 6 */
    static const int q6[8] = { 1, 0, 0, 1, 0, 0, 1, 1 };
    for (int l = 0; l < 8; l++) {
        char name[64];
        snprintf (name, sizeof name, "blk.%d.attn_v.weight", l);
        cr_assert_eq (rx_gguf_find_tensor (g, name)->type, q6[l] ? RX_Q6_K : RX_Q4_K, "%s", name);
        snprintf (name, sizeof name, "blk.%d.ffn_down.weight", l);
        cr_assert_eq (rx_gguf_find_tensor (g, name)->type, q6[l] ? RX_Q6_K : RX_Q4_K, "%s", name);
        snprintf (name, sizeof name, "blk.%d.attn_q.weight", l);
        cr_assert_eq (rx_gguf_find_tensor (g, name)->type, RX_Q4_K, "%s", name);
    }
    rx_gguf_close (&g);
    free (out);
}

Test (gguf_writer, gen_bad_arguments)
{
    static const struct { const char *args[12]; int status; const char *msg; } cases[] = {
        { { "--preset", "tiny", "--dims", "vocab=100", NULL }, 2, "--arch, --out and one of --preset/--dims" },
        { { "--arch", "gpt9", "--preset", "tiny", "--dims", "vocab=100", NULL }, 2, "unknown --arch 'gpt9'" },
        { { "--arch", "llama", "--preset", "huge", "--dims", "vocab=100", NULL }, 2, "unknown --preset 'huge'" },
        { { "--arch", "llama", "--preset", "tiny", "--type", "q3_x", "--dims", "vocab=100", NULL }, 2,
          "unknown --type 'q3_x'" },
        { { "--arch", "llama", "--dims", "embd=64,layers=1,heads=3,ffn=8,vocab=10", NULL }, 2,
          "embd 64 is not a multiple of heads 3" },
        { { "--arch", "llama", "--dims", "embd=64,layers=1,heads=4,kv_heads=3,ffn=8,vocab=10", NULL }, 2,
          "heads 4 is not a multiple of kv_heads 3" },
        { { "--arch", "llama", "--dims", "embd=64,layers=1", NULL }, 2, "must all be set" },
        { { "--arch", "llama", "--preset", "tiny", "--dims", "wings=2", NULL }, 2, "unknown key 'wings'" },
        { { "--arch", "llama", "--preset", "tiny", "--dims", "embd=abc", NULL }, 2, "bad value 'abc' for embd" },
        { { "--arch", "llama", "--preset", "tiny", NULL }, 2, "give --vocab" },
        { { "--arch", "llama", "--preset", "tiny", "--seed", "-1", "--dims", "vocab=10", NULL }, 2, "--seed" },
        { { "--arch", "llama", "--preset", "tiny", "--vocab", "/nonexistent/v.gguf", NULL }, 1,
          "/nonexistent/v.gguf: cannot open" },
    };
    char *out = tu_path (s_dir, "x.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *args = cases[i].args;
        struct tu_run r = s_gen (i == 0 ? NULL : out, args);
        cr_expect_eq (r.status, cases[i].status, "case %zu: status %d: %s", i, r.status, r.err);
        cr_expect_not_null (strstr (r.err, cases[i].msg), "case %zu: %s", i, r.err);
        tu_run_free (&r);
        cr_expect (!s_exists (out), "case %zu left an output file", i);
    }

    /* a vocabulary that is not one: a model GGUF without tokens */
    char *notvocab = tu_path (s_dir, "nov.gguf");
    struct rx_err err = { 0 };
    rx_gguf_writer_t *w = rx_gguf_writer_new (notvocab, &err);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_OK);
    rx_gguf_writer_destroy (&w);
    const char *args[] = { "--arch", "llama", "--preset", "tiny", "--vocab", notvocab, NULL };
    struct tu_run r = s_gen (out, args);
    cr_assert_eq (r.status, 1);
    cr_assert_not_null (strstr (r.err, "no tokenizer.ggml.tokens"), "%s", r.err);
    cr_assert_not_null (strstr (r.err, notvocab), "%s", r.err);
    tu_run_free (&r);
    free (notvocab);
    free (out);
}

/* Without --vocab: --dims vocab=N gives a model with no tokenizer keys. */
Test (gguf_writer, gen_without_vocab)
{
    char *out = tu_path (s_dir, "nv.gguf");
    const char *args[] = { "--arch", "llama", "--preset", "tiny", "--dims", "vocab=300,layers=1", "--type", "bf16",
                           "--seed", "0x10", NULL };
    struct tu_run r = s_gen (out, args);
    cr_assert_eq (r.status, 0, "%s", r.err);
    tu_run_free (&r);
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (out, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "llama.vocab_size", 300);
    s_expect_u32 (g, "llama.block_count", 1);
    s_expect_u32 (g, "general.file_type", 32);
    for (size_t i = 0; i < rx_gguf_kv_count (g); i++)
        cr_assert_neq (strncmp (rx_gguf_kv_key (g, i), "tokenizer.", 10), 0);
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, "token_embd.weight");
    cr_assert (t && t->type == RX_BF16 && t->ne[1] == 300);
    cr_assert_eq (rx_gguf_tensor_count (g), 3 + 9);
    rx_gguf_close (&g);
    free (out);
}
