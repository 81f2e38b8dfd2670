/* tests/unit/test_gguf.c -- the GGUF reader: every value type on a file made
 * by an independent script (tests/fixtures/gguf/make_fixtures.py), the
 * corrupted-file corpus (each refused with its own message naming the file),
 * truncation and byte-flip sweeps (never a crash), and the real files in
 * ../shared (tiny models, tokenizer vocabularies). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "gguf.h"
#include "../testutil.h"

static char *s_fixture (const char *name)
{
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fixtures/gguf", tu_env ("RX_TOP_SRCDIR"));
    return tu_path (dir, name);
}

/* ------------------------------------------------------ good.gguf: types -- */

Test (gguf, every_value_type)
{
    char *p = s_fixture ("good.gguf");
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    cr_assert_eq (rx_gguf_version (g), 3);
    cr_assert_eq (rx_gguf_alignment (g), 32);
    cr_assert_eq (rx_gguf_kv_count (g), 26);
    cr_assert_str_eq (rx_gguf_path (g), p);

    const char *s;
    size_t n;
    cr_assert_eq (rx_gguf_get_str (g, "general.architecture", &s, &n), RX_OK);
    cr_assert_eq (n, 5);
    cr_assert_eq (memcmp (s, "llama", 5), 0);
    cr_assert_eq (rx_gguf_get_str (g, "t.str", &s, &n), RX_OK);
    cr_assert_eq (n, 6);                                  /* "héllo" in UTF-8 */
    cr_assert_eq (memcmp (s, "h\xc3\xa9llo", 6), 0);

    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    int b;
    cr_assert_eq (rx_gguf_get_u32 (g, "t.u8", &u32), RX_OK);
    cr_assert_eq (u32, 200);
    cr_assert_eq (rx_gguf_get_i64 (g, "t.i8", &i64), RX_OK);
    cr_assert_eq (i64, -100);
    cr_assert_eq (rx_gguf_get_u32 (g, "t.u16", &u32), RX_OK);
    cr_assert_eq (u32, 60000);
    cr_assert_eq (rx_gguf_get_i64 (g, "t.i16", &i64), RX_OK);
    cr_assert_eq (i64, -30000);
    cr_assert_eq (rx_gguf_get_u32 (g, "t.u32", &u32), RX_OK);
    cr_assert_eq (u32, 4000000000u);
    cr_assert_eq (rx_gguf_get_i64 (g, "t.i32", &i64), RX_OK);
    cr_assert_eq (i64, -2000000000);
    cr_assert_eq (rx_gguf_get_u64 (g, "t.u64", &u64), RX_OK);
    cr_assert_eq (u64, 1ull << 40);
    cr_assert_eq (rx_gguf_get_i64 (g, "t.i64", &i64), RX_OK);
    cr_assert_eq (i64, -(1ll << 40));
    cr_assert_eq (rx_gguf_get_f32 (g, "t.f32", &f), RX_OK);
    cr_assert_eq (f, 0.25f);
    cr_assert_eq (rx_gguf_get_f32 (g, "t.f64", &f), RX_OK);
    cr_assert_eq (f, -1.5f);
    cr_assert_eq (rx_gguf_get_bool (g, "t.bool", &b), RX_OK);
    cr_assert_eq (b, 1);

    /* conversions that do not fit, wrong kinds, absent keys */
    cr_assert_eq (rx_gguf_get_u32 (g, "t.i8", &u32), RX_ERANGE);       /* negative */
    cr_assert_eq (rx_gguf_get_u32 (g, "t.u64", &u32), RX_ERANGE);      /* > 32 bits */
    cr_assert_eq (rx_gguf_get_u64 (g, "t.i64", &u64), RX_ERANGE);
    cr_assert_eq (rx_gguf_get_u32 (g, "t.f32", &u32), RX_EINVAL);
    cr_assert_eq (rx_gguf_get_f32 (g, "t.u32", &f), RX_EINVAL);
    cr_assert_eq (rx_gguf_get_bool (g, "t.u8", &b), RX_EINVAL);
    cr_assert_eq (rx_gguf_get_str (g, "t.u8", &s, &n), RX_EINVAL);
    cr_assert_eq (rx_gguf_get_u32 (g, "no.such.key", &u32), RX_ENOENT);
    cr_assert_eq (rx_gguf_get_arr (g, "t.str", NULL, NULL), RX_EINVAL);
    cr_assert_eq (rx_gguf_find_key (g, "no.such.key"), -1);
    long idx = rx_gguf_find_key (g, "t.f64");
    cr_assert_geq (idx, 0);
    cr_assert_str_eq (rx_gguf_kv_key (g, (size_t) idx), "t.f64");
    cr_assert_eq (rx_gguf_kv_type (g, (size_t) idx), RX_GGUF_FLOAT64);
    cr_assert_null (rx_gguf_kv_key (g, 1000));

    /* arrays of every element type */
    static const struct { const char *key; int et; size_t n; } arrs[] = {
        { "t.arr.u8", RX_GGUF_UINT8, 3 },   { "t.arr.i8", RX_GGUF_INT8, 2 },
        { "t.arr.u16", RX_GGUF_UINT16, 1 }, { "t.arr.i16", RX_GGUF_INT16, 2 },
        { "t.arr.u32", RX_GGUF_UINT32, 3 }, { "t.arr.i32", RX_GGUF_INT32, 3 },
        { "t.arr.f32", RX_GGUF_FLOAT32, 2 }, { "t.arr.bool", RX_GGUF_BOOL, 3 },
        { "t.arr.str", RX_GGUF_STRING, 3 }, { "t.arr.u64", RX_GGUF_UINT64, 1 },
        { "t.arr.i64", RX_GGUF_INT64, 1 },  { "t.arr.f64", RX_GGUF_FLOAT64, 1 },
        { "t.arr.empty", RX_GGUF_UINT32, 0 },
    };
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        int et;
        cr_assert_eq (rx_gguf_get_arr (g, arrs[i].key, &et, &n), RX_OK, "%s", arrs[i].key);
        cr_assert_eq (et, arrs[i].et, "%s", arrs[i].key);
        cr_assert_eq (n, arrs[i].n, "%s", arrs[i].key);
    }
    const void *d;
    cr_assert_eq (rx_gguf_arr_data (g, "t.arr.u8", &d), RX_OK);
    cr_assert_eq (memcmp (d, "\x01\x02\xff", 3), 0);
    cr_assert_eq (rx_gguf_arr_data (g, "t.arr.i32", &d), RX_OK);
    int32_t i32[3];
    memcpy (i32, d, sizeof i32);
    cr_assert (i32[0] == -7 && i32[1] == 0 && i32[2] == 7);
    cr_assert_eq (rx_gguf_arr_data (g, "t.arr.f32", &d), RX_OK);
    float f2[2];
    memcpy (f2, d, sizeof f2);
    cr_assert (f2[0] == 0.5f && f2[1] == -0.25f);
    cr_assert_eq (rx_gguf_arr_data (g, "t.arr.u64", &d), RX_OK);
    memcpy (&u64, d, 8);
    cr_assert_eq (u64, 1ull << 63);
    cr_assert_eq (rx_gguf_arr_data (g, "t.arr.str", &d), RX_EINVAL);   /* strings: use arr_str */
    cr_assert_eq (rx_gguf_arr_str (g, "t.arr.str", 0, &s, &n), RX_OK);
    cr_assert (n == 3 && memcmp (s, "<s>", 3) == 0);
    cr_assert_eq (rx_gguf_arr_str (g, "t.arr.str", 1, &s, &n), RX_OK);
    cr_assert_eq (n, 0);
    cr_assert_eq (rx_gguf_arr_str (g, "t.arr.str", 2, &s, &n), RX_OK);
    cr_assert (n == 3 && memcmp (s, "tok", 3) == 0);
    cr_assert_eq (rx_gguf_arr_str (g, "t.arr.str", 3, &s, &n), RX_ERANGE);
    cr_assert_eq (rx_gguf_arr_str (g, "t.arr.u8", 0, &s, &n), RX_EINVAL);
    cr_assert_eq (rx_gguf_arr_str (g, "nope", 0, &s, &n), RX_ENOENT);

    /* raw value bytes: a u32 is its 4 bytes */
    size_t raw_n;
    const void *raw;
    idx = rx_gguf_find_key (g, "t.u32");
    cr_assert_eq (rx_gguf_kv_raw (g, (size_t) idx, &raw, &raw_n), RX_OK);
    cr_assert_eq (raw_n, 4);
    memcpy (&u32, raw, 4);
    cr_assert_eq (u32, 4000000000u);

    /* tensors */
    cr_assert_eq (rx_gguf_tensor_count (g), 2);
    const struct rx_gguf_tensor *a = rx_gguf_find_tensor (g, "a"), *t = rx_gguf_find_tensor (g, "b");
    cr_assert (a && t);
    cr_assert_eq (a, rx_gguf_tensor (g, 0));
    cr_assert_null (rx_gguf_tensor (g, 2));
    cr_assert_null (rx_gguf_find_tensor (g, "c"));
    cr_assert_eq (a->type, RX_F32);
    cr_assert_eq (a->n_dims, 1);
    cr_assert (a->ne[0] == 4 && a->ne[1] == 1 && a->ne[2] == 1 && a->ne[3] == 1);
    cr_assert_eq (a->nbytes, 16);
    cr_assert_eq (t->n_dims, 2);
    cr_assert (t->ne[0] == 3 && t->ne[1] == 2 && t->n_elements == 6);
    cr_assert_eq (t->offset, 32);
    cr_assert_eq (t->nbytes, 24);
    cr_assert_eq (rx_gguf_data_offset (g) % 32, 0);
    cr_assert_eq ((const char *) t->data - (const char *) a->data, 32);
    float av[4], bv[6];
    memcpy (av, a->data, sizeof av);
    memcpy (bv, t->data, sizeof bv);
    for (int i = 0; i < 4; i++) cr_assert_eq (av[i], (float) (i + 1));
    for (int i = 0; i < 6; i++) cr_assert_eq (bv[i], 0.5f * (float) i);
    cr_assert_eq (rx_gguf_file_size (g), rx_gguf_data_offset (g) + 32 + 24);

    rx_gguf_close (&g);
    cr_assert_null (g);
    rx_gguf_close (&g);    /* NULL is fine */
    free (p);
}

/* -------------------------------------------------- the corrupted corpus -- */

static const struct { const char *file; const char *msg; } s_bad[] = {
    { "bad-magic.gguf",          "not a GGUF file: bad magic 47 47 55 58" },
    { "bad-version.gguf",        "unsupported GGUF version 7" },
    { "bad-version1.gguf",       "GGUF version 1 is not supported" },
    { "bad-bigendian.gguf",      "big-endian GGUF" },
    { "bad-empty.gguf",          "not a GGUF file: only 0 bytes" },
    { "bad-trunc-header.gguf",   "truncated file: tensor count needs 8 bytes, 4 left" },
    { "bad-trunc-kv.gguf",       "truncated file: value type needs 4 bytes, 2 left" },
    { "bad-trunc-tinfo.gguf",    "truncated file: tensor dimension needs 8 bytes, 3 left" },
    { "bad-str-past-eof.gguf",   "key 'general.architecture': string length 1000000 runs past the end of the file" },
    { "bad-arr-count.gguf",      "array of 4611686018427387904 uint32 values runs past the end of the file" },
    { "bad-arr-str-count.gguf",  "array of 18446744073709551615 strings cannot fit" },
    { "bad-arr-str-len.gguf",    "string 1 of the array has length 1099511627776, past the end of the file" },
    { "bad-value-type.gguf",     "key 't.x': unknown value type 13" },
    { "bad-elem-type.gguf",      "key 't.x': unknown array element type 99" },
    { "bad-nested-array.gguf",   "arrays of arrays are not supported" },
    { "bad-bool.gguf",           "key 't.b': bool value is 2" },
    { "bad-dup-key.gguf",        "duplicate metadata key 'general.architecture'" },
    { "bad-empty-key.gguf",      "metadata key 0 is empty" },
    { "bad-key-nul.gguf",        "metadata key 0 contains a NUL byte" },
    { "bad-kv-count.gguf",       "metadata count 9223372036854775808 cannot fit" },
    { "bad-tensor-count.gguf",   "tensor count 18446744073709551615 cannot fit" },
    { "bad-align-zero.gguf",     "general.alignment is 0 (must be a non-zero power of two)" },
    { "bad-align-npot.gguf",     "general.alignment is 48 (must be a non-zero power of two)" },
    { "bad-align-type.gguf",     "general.alignment has type uint64 (must be uint32)" },
    { "bad-ndims.gguf",          "tensor 'a': n_dims is 5 (must be 1..4)" },
    { "bad-ndims0.gguf",         "tensor 'a': n_dims is 0" },
    { "bad-zero-dim.gguf",       "tensor 'b': dimension 1 is 0" },
    { "bad-dim-overflow.gguf",   "tensor 'b': element count overflows" },
    { "bad-dim-int64.gguf",      "tensor 'a': dimension 0 is 9223372036854775808 (more than INT64_MAX)" },
    { "bad-bytes-overflow.gguf", "tensor 'b': byte size overflows" },
    { "bad-tensor-type.gguf",    "tensor 'a': unknown or unsupported type 99" },
    { "bad-tensor-type4.gguf",   "tensor 'a': unknown or unsupported type 4" },
    { "bad-row-block.gguf",      "tensor 'b': row length 33 is not a multiple of the q8_0 block size 32" },
    { "bad-data-past-eof.gguf",  "tensor 'b': data [64, +24) runs past the end of the file" },
    { "bad-offset-overflow.gguf", "tensor 'b': data [18446744073709551584, +24) runs past the end" },
    { "bad-misaligned.gguf",     "tensor 'b': data offset 16 is not a multiple of the alignment 32" },
    { "bad-overlap.gguf",        "tensors 'a' and 'b' overlap" },
    { "bad-dup-tensor.gguf",     "duplicate tensor name 'a'" },
    { "bad-empty-name.gguf",     "tensor 0 has an empty name" },
    { "bad-long-name.gguf",      "tensor 0: name is 65 bytes long (the limit is 64)" },
    { "bad-no-data.gguf",        "truncated file: the data section should start at offset 160, file has 143 bytes" },
};

Test (gguf, corrupted_corpus_refused_with_clear_message)
{
    for (size_t i = 0; i < sizeof s_bad / sizeof s_bad[0]; i++) {
        char *p = s_fixture (s_bad[i].file);
        struct rx_err err = { 0 };
        rx_gguf_t *g = rx_gguf_open (p, &err);
        cr_expect_null (g, "%s was accepted", s_bad[i].file);
        rx_gguf_close (&g);
        cr_expect_eq (err.code, RX_EFORMAT, "%s: code %d (%s)", s_bad[i].file, err.code, err.msg);
        /* "PATH: what (at offset N)": the file first, then what is wrong */
        cr_expect_eq (strncmp (err.msg, p, strlen (p)), 0, "%s: message does not start with the path: %s",
                      s_bad[i].file, err.msg);
        cr_expect_not_null (strstr (err.msg, s_bad[i].msg), "%s: got \"%s\", want \"%s\"", s_bad[i].file,
                            err.msg, s_bad[i].msg);
        cr_expect_not_null (strstr (err.msg, "(at offset "), "%s: %s", s_bad[i].file, err.msg);
        cr_expect_null (strchr (err.msg, '\n'), "one line: %s", err.msg);

        /* the in-memory path gives the same verdict, naming the given name */
        size_t len;
        void *buf = tu_read_file (p, &len);
        struct rx_err e2 = { 0 };
        g = rx_gguf_open_mem (buf, len, s_bad[i].file, &e2);
        cr_expect_null (g);
        rx_gguf_close (&g);
        cr_expect_eq (strncmp (e2.msg, s_bad[i].file, strlen (s_bad[i].file)), 0, "%s", e2.msg);
        cr_expect_not_null (strstr (e2.msg, s_bad[i].msg), "%s", e2.msg);
        free (buf);
        free (p);
    }
}

/* Every file in the fixture folder is either good.gguf or in the table above
 * (a new corrupted file needs its expected message). */
Test (gguf, corpus_table_is_complete)
{
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fixtures/gguf", tu_env ("RX_TOP_SRCDIR"));
    char cmd[4200];
    snprintf (cmd, sizeof cmd, "ls '%s' | grep '^bad-.*\\.gguf$'", dir);
    FILE *ls = popen (cmd, "r");
    cr_assert_not_null (ls);
    char line[256];
    int n = 0;
    while (fgets (line, sizeof line, ls)) {
        line[strcspn (line, "\n")] = '\0';
        int found = 0;
        for (size_t i = 0; i < sizeof s_bad / sizeof s_bad[0]; i++)
            found |= strcmp (s_bad[i].file, line) == 0;
        cr_expect (found, "%s has no expected message in s_bad", line);
        n++;
    }
    pclose (ls);
    cr_assert_eq ((size_t) n, sizeof s_bad / sizeof s_bad[0]);
}

/* Fuzz regressions: inputs the fuzzer once crashed on (tests/fuzz/regressions).
 * Each must be refused or accepted cleanly; under ASan any bad read fails. */
Test (gguf, fuzz_regressions)
{
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fuzz/regressions", tu_env ("RX_TOP_SRCDIR"));
    char cmd[4200];
    snprintf (cmd, sizeof cmd, "ls '%s' 2>/dev/null", dir);
    FILE *ls = popen (cmd, "r");
    cr_assert_not_null (ls);
    char line[256];
    while (fgets (line, sizeof line, ls)) {
        line[strcspn (line, "\n")] = '\0';
        if (strcmp (line, "README") == 0) continue;
        char *p = tu_path (dir, line);
        struct rx_err err = { 0 };
        rx_gguf_t *g = rx_gguf_open (p, &err);
        if (!g) cr_expect_eq (strncmp (err.msg, p, strlen (p)), 0, "%s", err.msg);
        rx_gguf_close (&g);
        free (p);
    }
    pclose (ls);
}

/* Every proper prefix of a valid file is refused (never accepted, never a
 * crash), with a message that names the buffer. */
Test (gguf, every_truncation_refused)
{
    char *p = s_fixture ("good.gguf");
    size_t len;
    uint8_t *buf = tu_read_file (p, &len);
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc (n ? n : 1);      /* exact size: ASan sees any over-read */
        memcpy (cut, buf, n);
        struct rx_err err = { 0 };
        rx_gguf_t *g = rx_gguf_open_mem (cut, n, "cut.gguf", &err);
        cr_expect_null (g, "prefix of %zu bytes accepted", n);
        rx_gguf_close (&g);
        cr_expect_eq (strncmp (err.msg, "cut.gguf: ", 10), 0, "%zu: %s", n, err.msg);
        free (cut);
    }
    free (buf);
    free (p);
}

/* Every single-byte change of a valid file either opens or gives a message:
 * no crash, no hang. */
Test (gguf, byte_flips_never_crash)
{
    char *p = s_fixture ("good.gguf");
    size_t len;
    uint8_t *buf = tu_read_file (p, &len);
    static const uint8_t xors[] = { 0x01, 0x80, 0xff };
    int refused = 0;
    for (size_t i = 0; i < len; i++)
        for (size_t k = 0; k < sizeof xors; k++) {
            uint8_t *m = malloc (len);
            memcpy (m, buf, len);
            m[i] ^= xors[k];
            struct rx_err err = { 0 };
            rx_gguf_t *g = rx_gguf_open_mem (m, len, "flip.gguf", &err);
            if (g) {
                /* whatever was accepted is readable */
                for (size_t t = 0; t < rx_gguf_tensor_count (g); t++) {
                    const struct rx_gguf_tensor *ti = rx_gguf_tensor (g, t);
                    cr_assert ((const uint8_t *) ti->data + ti->nbytes <= m + len);
                }
                rx_gguf_close (&g);
            } else {
                refused++;
                cr_expect_eq (strncmp (err.msg, "flip.gguf: ", 11), 0, "%s", err.msg);
            }
            free (m);
        }
    cr_assert_gt (refused, 0);
    free (buf);
    free (p);
}

/* Version 2 has the same layout as 3 (3 only added big-endian files). */
Test (gguf, version2_accepted)
{
    char *p = s_fixture ("good.gguf");
    size_t len;
    uint8_t *buf = tu_read_file (p, &len);
    cr_assert_eq (buf[4], 3);
    buf[4] = 2;
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open_mem (buf, len, "v2.gguf", &err);
    cr_assert_not_null (g, "%s", err.msg);
    cr_assert_eq (rx_gguf_version (g), 2);
    cr_assert_eq (rx_gguf_kv_count (g), 26);
    cr_assert_eq (rx_gguf_tensor_count (g), 2);
    cr_assert_str_eq (rx_gguf_path (g), "v2.gguf");
    rx_gguf_close (&g);
    free (buf);
    free (p);
}

Test (gguf, open_errors_name_the_file)
{
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open ("/nonexistent/x.gguf", &err);
    cr_assert_null (g);
    cr_assert_eq (err.code, RX_ENOENT);
    cr_assert_not_null (strstr (err.msg, "/nonexistent/x.gguf: cannot open"), "%s", err.msg);
    g = rx_gguf_open ("/tmp", &err);
    cr_assert_null (g);
    cr_assert_not_null (strstr (err.msg, "/tmp: not a regular file"), "%s", err.msg);
    g = rx_gguf_open_mem (NULL, 0, "null", &err);
    cr_assert_null (g);
    cr_assert_not_null (strstr (err.msg, "null: not a GGUF file"), "%s", err.msg);
}

/* ------------------------------------------------------- ../shared files -- */

static const char *s_shared (void)
{
    const char *s = getenv ("RADIX_SHARED");
    if (!s || !*s) cr_skip_test ("RADIX_SHARED is not set: no shared data to read");
    char p[4096];
    snprintf (p, sizeof p, "%s/data/models/tiny-llama.gguf", s);
    if (access (p, R_OK) != 0) cr_skip_test ("%s not found (RADIX_SHARED=%s)", p, s);
    return s;
}

static void s_expect_u32 (const rx_gguf_t *g, const char *key, uint32_t want)
{
    uint32_t v = 0;
    cr_assert_eq (rx_gguf_get_u32 (g, key, &v), RX_OK, "%s missing", key);
    cr_assert_eq (v, want, "%s = %u, want %u", key, v, want);
}

static void s_expect_tensor (const rx_gguf_t *g, const char *name, int type, uint64_t ne0, uint64_t ne1)
{
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, name);
    cr_assert_not_null (t, "no tensor %s", name);
    cr_assert_eq (t->type, type, "%s type %d", name, t->type);
    cr_assert_eq (t->ne[0], ne0, "%s ne0", name);
    cr_assert_eq (t->ne[1], ne1, "%s ne1", name);
    cr_assert_eq (t->n_dims, ne1 == 1 ? 1u : 2u, "%s n_dims", name);
    cr_assert_eq ((uintptr_t) t->data % rx_gguf_alignment (g), 0, "%s not aligned", name);
}

Test (gguf, tiny_llama)
{
    const char *sh = s_shared ();
    char p[4096];
    snprintf (p, sizeof p, "%s/data/models/tiny-llama.gguf", sh);
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    const char *s;
    size_t n;
    cr_assert_eq (rx_gguf_get_str (g, "general.architecture", &s, &n), RX_OK);
    cr_assert (n == 5 && memcmp (s, "llama", 5) == 0);
    s_expect_u32 (g, "llama.embedding_length", 64);
    s_expect_u32 (g, "llama.block_count", 2);
    s_expect_u32 (g, "llama.attention.head_count", 4);
    s_expect_u32 (g, "llama.attention.head_count_kv", 2);
    s_expect_u32 (g, "llama.feed_forward_length", 128);
    s_expect_u32 (g, "llama.context_length", 512);
    s_expect_u32 (g, "llama.rope.dimension_count", 16);
    s_expect_u32 (g, "general.file_type", 1);
    s_expect_u32 (g, "tokenizer.ggml.bos_token_id", 1);
    float f;
    cr_assert_eq (rx_gguf_get_f32 (g, "llama.rope.freq_base", &f), RX_OK);
    cr_assert_eq (f, 10000.0f);
    cr_assert_eq (rx_gguf_get_f32 (g, "llama.attention.layer_norm_rms_epsilon", &f), RX_OK);
    cr_assert_float_eq (f, 1e-5f, 1e-12f);
    int b;
    cr_assert_eq (rx_gguf_get_bool (g, "tokenizer.ggml.add_bos_token", &b), RX_OK);
    cr_assert_eq (b, 1);
    int et;
    cr_assert_eq (rx_gguf_get_arr (g, "tokenizer.ggml.tokens", &et, &n), RX_OK);
    cr_assert_eq (et, RX_GGUF_STRING);
    cr_assert_eq (n, 32000);
    cr_assert_eq (rx_gguf_arr_str (g, "tokenizer.ggml.tokens", 1, &s, &n), RX_OK);
    cr_assert (n == 3 && memcmp (s, "<s>", 3) == 0);
    cr_assert_eq (rx_gguf_arr_str (g, "tokenizer.ggml.tokens", 2, &s, &n), RX_OK);
    cr_assert (n == 4 && memcmp (s, "</s>", 4) == 0);
    cr_assert_eq (rx_gguf_get_arr (g, "tokenizer.ggml.scores", &et, &n), RX_OK);
    cr_assert (et == RX_GGUF_FLOAT32 && n == 32000);
    cr_assert_eq (rx_gguf_get_arr (g, "tokenizer.ggml.token_type", &et, &n), RX_OK);
    cr_assert (et == RX_GGUF_INT32 && n == 32000);

    cr_assert_eq (rx_gguf_tensor_count (g), 21);
    s_expect_tensor (g, "token_embd.weight", RX_F16, 64, 32000);
    s_expect_tensor (g, "output.weight", RX_F16, 64, 32000);
    s_expect_tensor (g, "output_norm.weight", RX_F32, 64, 1);
    for (int l = 0; l < 2; l++) {
        char name[64];
        static const struct { const char *n; uint64_t ne0, ne1; } bt[] = {
            { "attn_norm", 64, 1 }, { "attn_q", 64, 64 }, { "attn_k", 64, 32 }, { "attn_v", 64, 32 },
            { "attn_output", 64, 64 }, { "ffn_norm", 64, 1 }, { "ffn_gate", 64, 128 },
            { "ffn_up", 64, 128 }, { "ffn_down", 128, 64 },
        };
        for (size_t i = 0; i < sizeof bt / sizeof bt[0]; i++) {
            snprintf (name, sizeof name, "blk.%d.%s.weight", l, bt[i].n);
            s_expect_tensor (g, name, RX_F32, bt[i].ne0, bt[i].ne1);
        }
    }
    /* the data is there: f16 embedding values are finite and not all zero */
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, "token_embd.weight");
    cr_assert_eq (t->nbytes, 64 * 32000 * 2);
    const uint16_t *h = t->data;
    int nonzero = 0;
    for (size_t i = 0; i < 64 * 32000; i++) {
        cr_assert_neq (h[i] & 0x7c00, 0x7c00, "inf/nan at %zu", i);
        nonzero += (h[i] & 0x7fff) != 0;
    }
    cr_assert_gt (nonzero, 64 * 32000 / 2);
    rx_gguf_close (&g);
}

Test (gguf, tiny_llama_quantized)
{
    const char *sh = s_shared ();
    char p[4096];
    struct rx_err err = { 0 };
    snprintf (p, sizeof p, "%s/data/models/tiny-llama-q8.gguf", sh);
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "general.file_type", 7);
    s_expect_tensor (g, "token_embd.weight", RX_Q8_0, 64, 32000);
    cr_assert_eq (rx_gguf_find_tensor (g, "token_embd.weight")->nbytes, 32000 * 2 * 34);
    s_expect_tensor (g, "blk.1.ffn_down.weight", RX_Q8_0, 128, 64);
    s_expect_tensor (g, "output_norm.weight", RX_F32, 64, 1);
    rx_gguf_close (&g);

    snprintf (p, sizeof p, "%s/data/models/tiny-llama-q4.gguf", sh);
    g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "general.file_type", 2);
    s_expect_tensor (g, "token_embd.weight", RX_Q4_0, 64, 32000);
    s_expect_tensor (g, "output.weight", RX_Q8_0, 64, 32000);
    cr_assert_eq (rx_gguf_find_tensor (g, "blk.0.attn_q.weight")->nbytes, 64 * 2 * 18);
    rx_gguf_close (&g);
}

Test (gguf, other_shared_models)
{
    const char *sh = s_shared ();
    char p[4096];
    struct rx_err err = { 0 };
    snprintf (p, sizeof p, "%s/data/models/tiny-moe.gguf", sh);
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "llama.expert_count", 4);
    const struct rx_gguf_tensor *t = rx_gguf_find_tensor (g, "blk.0.ffn_gate_exps.weight");
    cr_assert_not_null (t);
    cr_assert (t->n_dims == 3 && t->ne[0] == 64 && t->ne[1] == 128 && t->ne[2] == 4);
    cr_assert_eq (t->nbytes, 64 * 128 * 4 * 4);
    rx_gguf_close (&g);

    snprintf (p, sizeof p, "%s/data/models/tiny-deepseek2.gguf", sh);
    g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    s_expect_u32 (g, "deepseek2.attention.kv_lora_rank", 32);
    int b;
    cr_assert_eq (rx_gguf_get_bool (g, "deepseek2.expert_weights_norm", &b), RX_OK);
    cr_assert_eq (b, 1);
    cr_assert_not_null (rx_gguf_find_tensor (g, "blk.1.exp_probs_b.bias"));
    s_expect_tensor (g, "blk.0.attn_kv_b.weight", RX_F32, 32, 256);
    rx_gguf_close (&g);
}

/* Every tokenizer vocabulary opens; where the file states a vocab_size it
 * equals the token count, and scores/types (when present) match it. */
Test (gguf, tokenizer_vocabularies)
{
    const char *sh = s_shared ();
    char cmd[4200];
    snprintf (cmd, sizeof cmd, "ls '%s/data/tokenizers/' | grep '\\.gguf$'", sh);
    FILE *ls = popen (cmd, "r");
    cr_assert_not_null (ls);
    char line[256];
    int files = 0;
    while (fgets (line, sizeof line, ls)) {
        line[strcspn (line, "\n")] = '\0';
        char p[4600];
        snprintf (p, sizeof p, "%s/data/tokenizers/%s", sh, line);
        struct rx_err err = { 0 };
        rx_gguf_t *g = rx_gguf_open (p, &err);
        cr_assert_not_null (g, "%s", err.msg);
        cr_assert_eq (rx_gguf_tensor_count (g), 0);
        int et;
        size_t n, n2;
        cr_assert_eq (rx_gguf_get_arr (g, "tokenizer.ggml.tokens", &et, &n), RX_OK, "%s", line);
        cr_assert_eq (et, RX_GGUF_STRING);
        cr_assert_gt (n, 1000);
        const char *arch;
        size_t al;
        cr_assert_eq (rx_gguf_get_str (g, "general.architecture", &arch, &al), RX_OK);
        char key[128];
        snprintf (key, sizeof key, "%.*s.vocab_size", (int) al, arch);
        uint32_t vs;
        if (rx_gguf_get_u32 (g, key, &vs) == RX_OK) cr_assert_eq (vs, n, "%s: %s", line, key);
        if (rx_gguf_get_arr (g, "tokenizer.ggml.scores", &et, &n2) == RX_OK)
            cr_assert (et == RX_GGUF_FLOAT32 && n2 == n, "%s scores", line);
        cr_assert_eq (rx_gguf_get_arr (g, "tokenizer.ggml.token_type", &et, &n2), RX_OK);
        cr_assert (et == RX_GGUF_INT32 && n2 == n, "%s token_type", line);
        /* the last token is reachable through the index */
        const char *s;
        size_t sl;
        cr_assert_eq (rx_gguf_arr_str (g, "tokenizer.ggml.tokens", n - 1, &s, &sl), RX_OK);
        cr_assert_eq (rx_gguf_arr_str (g, "tokenizer.ggml.tokens", n, &s, &sl), RX_ERANGE);
        rx_gguf_close (&g);
        files++;
    }
    pclose (ls);
    cr_assert_geq (files, 10);
}

Test (gguf, llama_spm_tokens)
{
    const char *sh = s_shared ();
    char p[4096];
    snprintf (p, sizeof p, "%s/data/tokenizers/ggml-vocab-llama-spm.gguf", sh);
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open (p, &err);
    cr_assert_not_null (g, "%s", err.msg);
    const char *s;
    size_t n;
    cr_assert_eq (rx_gguf_arr_str (g, "tokenizer.ggml.tokens", 0, &s, &n), RX_OK);
    cr_assert (n == 5 && memcmp (s, "<unk>", 5) == 0);
    cr_assert_eq (rx_gguf_arr_str (g, "tokenizer.ggml.tokens", 3, &s, &n), RX_OK);
    cr_assert (n == 6 && memcmp (s, "<0x00>", 6) == 0);
    const void *d;
    cr_assert_eq (rx_gguf_arr_data (g, "tokenizer.ggml.token_type", &d), RX_OK);
    int32_t tt[4];
    memcpy (tt, d, sizeof tt);
    cr_assert_eq (tt[0], 2);    /* UNKNOWN */
    cr_assert_eq (tt[1], 3);    /* CONTROL */
    cr_assert_eq (tt[3], 6);    /* BYTE */
    rx_gguf_close (&g);
}
