/* tests/unit/test_tokenizer.c -- tokenizers against llama.cpp's reference
 * vectors (../shared/data/tokenizers/NAME.inp/.out, no BOS), the tiny model
 * prompts (prompt_ids with BOS), round trips, byte fallback, special tokens,
 * the pre-tokenizer and every loading error. */
#include <criterion/criterion.h>
#include <pthread.h>

#include "gguf_writer.h"
#include "../testutil.h"
#include "tokenizer.h"
#include "unicode.h"

/* ---- helpers ---------------------------------------------------------- */

/* Path under $RADIX_SHARED, or skip the test when the data is absent. */
static char *s_shared (const char *rel)
{
    const char *root = getenv ("RADIX_SHARED");
    if (!root || !*root) cr_skip_test ("RADIX_SHARED is not set: no shared test data");
    char *p = tu_path (root, rel);
    if (access (p, R_OK) != 0) {
        free (p);
        cr_skip_test ("shared test data %s/%s is absent", root, rel);
    }
    return p;
}

static char *s_read_file (const char *path, size_t *len)
{
    FILE *f = fopen (path, "rb");
    cr_assert_not_null (f, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc (cap);
    size_t r;
    while ((r = fread (buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 >= cap) buf = realloc (buf, cap *= 2);
    }
    fclose (f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static rx_tokenizer_t *s_open (const char *rel)
{
    char *p = s_shared (rel);
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (p, &err);
    cr_assert_not_null (t, "load %s: %s", p, err.msg);
    free (p);
    return t;
}

static void s_encode (const rx_tokenizer_t *t, const char *s, size_t n, unsigned flags,
                      int32_t **ids, size_t *nids)
{
    struct rx_err err = { 0 };
    cr_assert_eq (rx_tokenizer_encode (t, s, n, flags, ids, nids, &err), RX_OK, "encode: %s", err.msg);
}

static char *s_fmt_ids (const int32_t *ids, size_t n)
{
    char *s = malloc (n * 12 + 1);
    size_t o = 0;
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) o += (size_t) sprintf (s + o, "%s%d", i ? " " : "", ids[i]);
    return s;
}

/* ---- the reference vectors -------------------------------------------- */

struct s_case {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
};

/* Cases of NAME.inp (separated by "\n__ggml_vocab_test__\n") with the ids
 * of the matching NAME.out line, as llama.cpp's test-tokenizer-0 reads them. */
static struct s_case *s_load_cases (const char *gguf_path, size_t *ncases)
{
    char inp[1024], outp[1024];
    snprintf (inp, sizeof inp, "%s.inp", gguf_path);
    snprintf (outp, sizeof outp, "%s.out", gguf_path);
    size_t ilen, olen;
    char *in = s_read_file (inp, &ilen), *out = s_read_file (outp, &olen);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t seplen = sizeof sep - 1;
    struct s_case *c = NULL;
    size_t n = 0;
    for (size_t pos = 0; pos < ilen;) {
        char *next = memmem (in + pos, ilen - pos, sep, seplen);
        size_t end = next ? (size_t) (next - in) : ilen;
        c = realloc (c, (n + 1) * sizeof *c);
        c[n].len = end - pos;
        c[n].text = malloc (c[n].len + 1);
        memcpy (c[n].text, in + pos, c[n].len);
        c[n].text[c[n].len] = '\0';
        n++;
        if (!next) break;
        pos = end + seplen;
    }
    size_t line = 0;
    for (char *p = out; *p && line < n; line++) {
        char *nl = strchr (p, '\n');
        if (nl) *nl = '\0';
        c[line].ids = NULL;
        c[line].n = 0;
        for (char *q = p; *q;) {
            while (*q == ' ') q++;
            if (!*q) break;
            char *e;
            long v = strtol (q, &e, 10);
            cr_assert (e != q, "%s line %zu: bad number", outp, line + 1);
            c[line].ids = realloc (c[line].ids, (c[line].n + 1) * sizeof (int32_t));
            c[line].ids[c[line].n++] = (int32_t) v;
            q = e;
        }
        p = nl ? nl + 1 : p + strlen (p);
    }
    cr_assert_eq (line, n, "%s has %zu cases but %s has %zu lines", inp, n, outp, line);
    free (in);
    free (out);
    *ncases = n;
    return c;
}

static void s_free_cases (struct s_case *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free (c[i].text);
        free (c[i].ids);
    }
    free (c);
}

static void s_check_vocab (const char *name, int expect_model, const char *expect_pre)
{
    char rel[256];
    snprintf (rel, sizeof rel, "data/tokenizers/ggml-vocab-%s.gguf", name);
    char *path = s_shared (rel);
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (path, &err);
    cr_assert_not_null (t, "%s: %s", path, err.msg);
    cr_assert_eq (rx_tokenizer_model (t), expect_model);
    cr_assert_str_eq (rx_tokenizer_pre (t), expect_pre);
    size_t n;
    struct s_case *c = s_load_cases (path, &n);
    cr_assert_gt (n, 40, "%s: only %zu cases", name, n);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        size_t nids;
        s_encode (t, c[i].text, c[i].len, 0, &ids, &nids);
        int same = nids == c[i].n && (nids == 0 || memcmp (ids, c[i].ids, nids * sizeof *ids) == 0);
        if (!same) {
            char *got = s_fmt_ids (ids, nids), *want = s_fmt_ids (c[i].ids, c[i].n);
            cr_log_error ("%s case %zu \"%.60s\":\n  want %s\n  got  %s", name, i, c[i].text, want, got);
            free (got);
            free (want);
            failures++;
        }
        free (ids);
    }
    cr_expect_eq (failures, 0, "%s: %d of %zu cases differ from llama.cpp", name, failures, n);
    s_free_cases (c, n);
    rx_tokenizer_free (&t);
    cr_assert_null (t);
    free (path);
}

Test (vectors, llama_spm) { s_check_vocab ("llama-spm", RX_TOK_MODEL_SPM, "default"); }
Test (vectors, phi_3) { s_check_vocab ("phi-3", RX_TOK_MODEL_SPM, "default"); }
Test (vectors, gpt_2) { s_check_vocab ("gpt-2", RX_TOK_MODEL_BPE, "gpt-2"); }
Test (vectors, falcon) { s_check_vocab ("falcon", RX_TOK_MODEL_BPE, "falcon"); }
Test (vectors, starcoder) { s_check_vocab ("starcoder", RX_TOK_MODEL_BPE, "starcoder"); }
Test (vectors, deepseek_llm) { s_check_vocab ("deepseek-llm", RX_TOK_MODEL_BPE, "deepseek-llm"); }
Test (vectors, deepseek_coder) { s_check_vocab ("deepseek-coder", RX_TOK_MODEL_BPE, "deepseek-coder"); }

/* ---- tiny model prompts (with BOS) ------------------------------------ */

/* Unescape the JSON string starting after the opening quote at *p. */
static char *s_json_string (const char **p)
{
    const char *s = *p;
    char *out = malloc (strlen (s) * 4 + 1);
    size_t o = 0;
    while (*s && *s != '"') {
        if (*s != '\\') {
            out[o++] = *s++;
            continue;
        }
        s++;
        char c = *s++;
        switch (c) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'u': {
            unsigned cp = (unsigned) strtoul ((char[]) { s[0], s[1], s[2], s[3], 0 }, NULL, 16);
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && s[0] == '\\' && s[1] == 'u') {
                unsigned lo = (unsigned) strtoul ((char[]) { s[2], s[3], s[4], s[5], 0 }, NULL, 16);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                s += 6;
            }
            o += rx_utf8_encode (cp, out + o);
            break;
        }
        default: out[o++] = c; break;
        }
    }
    out[o] = '\0';
    *p = *s ? s + 1 : s;
    return out;
}

static void s_check_prompts (const char *json_rel, const char *gguf_rel)
{
    char *jp = s_shared (json_rel);
    rx_tokenizer_t *t = s_open (gguf_rel);
    size_t len;
    char *json = s_read_file (jp, &len);
    int prompts = 0;
    for (const char *p = strstr (json, "\"text\""); p; p = strstr (p, "\"text\"")) {
        p = strchr (p + 6, '"');
        cr_assert_not_null (p);
        p++;
        char *text = s_json_string (&p);
        const char *ids_at = strstr (p, "\"prompt_ids\"");
        cr_assert_not_null (ids_at, "%s: prompt without prompt_ids", jp);
        ids_at = strchr (ids_at, '[') + 1;
        int32_t want[4096];
        size_t nwant = 0;
        while (*ids_at && *ids_at != ']') {
            char *e;
            long v = strtol (ids_at, &e, 10);
            if (e == ids_at) {
                ids_at++;
                continue;
            }
            want[nwant++] = (int32_t) v;
            ids_at = e;
        }
        int32_t *ids;
        size_t n;
        s_encode (t, text, strlen (text), RX_TOK_ADD_SPECIAL, &ids, &n);
        char *g = s_fmt_ids (ids, n), *w = s_fmt_ids (want, nwant);
        cr_expect_str_eq (g, w, "prompt \"%.50s\"", text);
        cr_expect_eq (ids[0], 1, "BOS first");
        free (g);
        free (w);
        free (ids);
        free (text);
        prompts++;
        p = ids_at;
    }
    cr_assert_eq (prompts, 4, "%s: expected 4 prompts, found %d", jp, prompts);
    free (json);
    free (jp);
    rx_tokenizer_free (&t);
}

Test (prompts, tiny_llama)
{
    s_check_prompts ("data/models/tiny-llama.json", "data/models/tiny-llama.gguf");
}

Test (prompts, tiny_deepseek2)
{
    s_check_prompts ("data/models/tiny-deepseek2.json", "data/models/tiny-deepseek2.gguf");
}

/* ---- properties on the real vocabularies ------------------------------ */

static void s_round_trip (const char *name)
{
    char rel[256];
    snprintf (rel, sizeof rel, "data/tokenizers/ggml-vocab-%s.gguf", name);
    char *path = s_shared (rel);
    rx_tokenizer_t *t = s_open (rel);
    size_t n;
    struct s_case *c = s_load_cases (path, &n);
    unsigned dflags = rx_tokenizer_model (t) == RX_TOK_MODEL_SPM ? RX_DETOK_STRIP_SPACE : 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        size_t nids, tl;
        char *text;
        struct rx_err err = { 0 };
        s_encode (t, c[i].text, c[i].len, 0, &ids, &nids);
        cr_assert_eq (rx_tokenizer_decode (t, ids, nids, dflags, &text, &tl, &err), RX_OK, "%s", err.msg);
        cr_expect (tl == c[i].len && memcmp (text, c[i].text, tl) == 0,
                   "%s case %zu: \"%s\" decodes back to \"%s\"", name, i, c[i].text, text);
        free (text);
        free (ids);
    }
    s_free_cases (c, n);
    rx_tokenizer_free (&t);
    free (path);
}

Test (roundtrip, all_vocabularies)
{
    static const char *const names[] = {
        "llama-spm", "phi-3", "gpt-2", "falcon", "starcoder", "deepseek-llm", "deepseek-coder"
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) s_round_trip (names[i]);
}

Test (spm, byte_fallback)
{
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-llama-spm.gguf");
    /* U+1D11E MUSICAL SYMBOL G CLEF is not in the Llama vocabulary. */
    const char *clef = "\xF0\x9D\x84\x9E";
    cr_assert_eq (rx_tokenizer_find (t, clef, 4), RX_TOKEN_NONE);
    cr_assert_eq (rx_tokenizer_find (t, "<0xF0>", 6), 3 + 0xF0, "byte tokens are ids 3..258");
    int32_t *ids;
    size_t n;
    s_encode (t, clef, 4, 0, &ids, &n);
    /* "▁" (29871) then one <0xXX> token per byte: id = 3 + byte. */
    int32_t want[] = { 29871, 3 + 0xF0, 3 + 0x9D, 3 + 0x84, 3 + 0x9E };
    cr_assert_eq (n, 5);
    cr_assert_arr_eq (ids, want, sizeof want);
    /* Each byte token decodes to exactly its byte. */
    const char *s;
    size_t l;
    cr_assert_eq (rx_tokenizer_piece (t, 3 + 0x9D, 0, &s, &l), RX_OK);
    cr_assert_eq (l, 1);
    cr_assert_eq ((unsigned char) s[0], 0x9D);
    char *text;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_tokenizer_decode (t, ids, n, RX_DETOK_STRIP_SPACE, &text, &l, &err), RX_OK);
    cr_assert_str_eq (text, clef);
    free (text);
    free (ids);
    /* Invalid UTF-8 survives byte for byte. */
    s_encode (t, "a\xFF" "b", 3, 0, &ids, &n);
    cr_assert_eq (rx_tokenizer_decode (t, ids, n, RX_DETOK_STRIP_SPACE, &text, &l, &err), RX_OK);
    cr_assert_eq (l, 3);
    cr_assert_str_eq (text, "a\xFF" "b");
    free (text);
    free (ids);
    rx_tokenizer_free (&t);
}

Test (bpe, invalid_utf8_becomes_replacement)
{
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-gpt-2.gguf");
    int32_t *ids;
    size_t n, l;
    char *text;
    struct rx_err err = { 0 };
    s_encode (t, "a\xFF" "b\xE2\x82", 5, 0, &ids, &n);
    cr_assert_gt (n, 0);
    cr_assert_eq (rx_tokenizer_decode (t, ids, n, 0, &text, &l, &err), RX_OK);
    /* As llama.cpp: each malformed byte is U+FFFD before tokenizing. */
    cr_assert_str_eq (text, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
    free (text);
    free (ids);
    rx_tokenizer_free (&t);
}

/* Unassigned code points (category Cn) of planes 2..16, in words, between
 * letters, alone and repeated: the fuzzer's find (tests/fuzz/regressions-
 * tokenizer/starcoder-*).  GPT-2 has a token for every byte and round-trips
 * them all.  StarCoder's vocabulary has NO token for byte 0xF1 (mapped
 * U+00F1, the lead byte of planes 4-7, never seen in its training data), so
 * -- as llama.cpp and HF tokenizers (no byte fallback) -- that byte is
 * dropped and everything else survives. */
static void s_check_unassigned (const char *vocab, int drops_f1)
{
    static const char *const cps[] = {
        "\xF0\xAF\xA8\xA0",   /* U+2FA20  plane 2 */
        "\xF0\xBF\xBF\xBD",   /* U+3FFFD  plane 3 */
        "\xF1\x80\x80\x80",   /* U+40000  plane 4 */
        "\xF1\x9F\xA4\x96",   /* U+5F916  plane 5 */
        "\xF1\xBA\xAF\x8D",   /* U+7ABCD  plane 7 */
        "\xF2\x80\x80\x80",   /* U+80000  plane 8 */
        "\xF3\x81\x88\xB4",   /* U+C1234  plane 12 */
        "\xF3\xA0\xA0\x80",   /* U+E0800  plane 14 */
        "\xF3\xBF\xBF\xBE",   /* U+FFFFE  plane 15 */
        "\xF4\x8F\xBF\xBE",   /* U+10FFFE plane 16 */
    };
    static const char *const fmts[] = { "%s", "%s%s%s", "Hello %s world", "x%sy 12%s3 %s!" };
    char rel[128];
    snprintf (rel, sizeof rel, "data/tokenizers/ggml-vocab-%s.gguf", vocab);
    rx_tokenizer_t *t = s_open (rel);
    /* The data itself, not our code, decides whether 0xF1 has a token. */
    cr_assert_eq (rx_tokenizer_find (t, "\xC3\xB1", 2) < 0, drops_f1,
                  "%s: token for byte 0xF1 (U+00F1) expected %s", vocab, drops_f1 ? "absent" : "present");
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            char in[64], want[64];
            int len = snprintf (in, sizeof in, fmts[f], cps[i], cps[i], cps[i]);
            cr_assert (rx_utf8_valid (in, (size_t) len));
            size_t wl = 0;
            for (int k = 0; k < len; k++)
                if (!(drops_f1 && (unsigned char) in[k] == 0xF1)) want[wl++] = in[k];
            int32_t *ids;
            size_t n, l;
            char *text;
            struct rx_err err = { 0 };
            s_encode (t, in, (size_t) len, 0, &ids, &n);
            cr_assert_gt (n, 0, "%s: %s encodes to nothing", vocab, in);
            cr_assert_eq (rx_tokenizer_decode (t, ids, n, 0, &text, &l, &err), RX_OK, "%s", err.msg);
            cr_expect (l == wl && memcmp (text, want, wl) == 0,
                       "%s, code point %zu, form %zu: %d bytes in, %zu bytes out (want %zu)",
                       vocab, i, f, len, l, wl);
            free (text);
            free (ids);
        }
    }
    rx_tokenizer_free (&t);
}

Test (bpe, unassigned_codepoints_gpt2) { s_check_unassigned ("gpt-2", 0); }
Test (bpe, unassigned_codepoints_starcoder) { s_check_unassigned ("starcoder", 1); }

Test (special, parse_special_flag)
{
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-llama-spm.gguf");
    int32_t *ids;
    size_t n;
    /* Recognised: <s> becomes BOS and the text after it gets the space prefix. */
    s_encode (t, "<s>Hello", 8, RX_TOK_PARSE_SPECIAL, &ids, &n);
    int32_t want[] = { 1, 15043 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want, sizeof want);
    free (ids);
    /* Not recognised by default: "<s>" is plain text. */
    s_encode (t, "<s>Hello", 8, 0, &ids, &n);
    cr_assert_gt (n, 2);
    for (size_t i = 0; i < n; i++) cr_assert_neq (ids[i], 1);
    free (ids);
    /* Control tokens decode to nothing unless asked. */
    int32_t seq[] = { 1, 15043, 2 };
    char *text;
    size_t l;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_tokenizer_decode (t, seq, 3, 0, &text, &l, &err), RX_OK);
    cr_assert_str_eq (text, " Hello");
    free (text);
    cr_assert_eq (rx_tokenizer_decode (t, seq, 3, RX_DETOK_SPECIAL, &text, &l, &err), RX_OK);
    cr_assert_str_eq (text, "<s> Hello</s>");
    free (text);
    cr_assert (rx_tokenizer_is_eog (t, 2));
    cr_assert (!rx_tokenizer_is_eog (t, 1));
    /* ADD_SPECIAL follows add_bos_token (true) and add_eos_token (false). */
    s_encode (t, "Hello", 5, RX_TOK_ADD_SPECIAL, &ids, &n);
    cr_assert_eq (n, 2);
    cr_assert_eq (ids[0], 1);
    cr_assert_eq (ids[1], 15043);
    free (ids);
    /* The empty text is no tokens, or just BOS. */
    s_encode (t, "", 0, 0, &ids, &n);
    cr_assert_eq (n, 0);
    s_encode (t, "", 0, RX_TOK_ADD_SPECIAL, &ids, &n);
    cr_assert_eq (n, 1);
    cr_assert_eq (ids[0], 1);
    free (ids);
    cr_assert_eq (rx_tokenizer_decode (t, (int32_t[]) { 32000 }, 1, 0, &text, &l, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "32000"), "%s", err.msg);
    rx_tokenizer_free (&t);
}

Test (special, user_defined_always_split)
{
    /* deepseek-llm: "ü" is a user-defined token (100014), split out of plain text. */
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-deepseek-llm.gguf");
    cr_assert_eq (rx_tokenizer_find (t, "\xC3\xBC", 2), 100014);
    cr_assert (rx_tokenizer_attr (t, 100014) & RX_TOKATTR_USER_DEFINED);
    int32_t *ids;
    size_t n;
    s_encode (t, "\xC3\xBC\xC3\xBC", 4, 0, &ids, &n);
    int32_t want[] = { 100014, 100014 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want, sizeof want);
    free (ids);
    rx_tokenizer_free (&t);
}

struct s_thread_arg {
    const rx_tokenizer_t *t;
    struct s_case *c;
    size_t n;
    int bad;
};

static void *s_thread (void *p)
{
    struct s_thread_arg *a = p;
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < a->n; i++) {
            int32_t *ids;
            size_t n;
            struct rx_err err = { 0 };
            if (rx_tokenizer_encode (a->t, a->c[i].text, a->c[i].len, 0, &ids, &n, &err) != RX_OK) {
                a->bad++;
                continue;
            }
            if (n != a->c[i].n || (n && memcmp (ids, a->c[i].ids, n * sizeof *ids))) a->bad++;
            free (ids);
        }
    }
    return NULL;
}

Test (threads, concurrent_encode)
{
    char *path = s_shared ("data/tokenizers/ggml-vocab-deepseek-coder.gguf");
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-deepseek-coder.gguf");
    size_t n;
    struct s_case *c = s_load_cases (path, &n);
    pthread_t th[4];
    struct s_thread_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct s_thread_arg) { t, c, n, 0 };
        pthread_create (&th[i], NULL, s_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join (th[i], NULL);
        cr_expect_eq (a[i].bad, 0, "thread %d: %d wrong encodings", i, a[i].bad);
    }
    s_free_cases (c, n);
    rx_tokenizer_free (&t);
    free (path);
}

/* ---- small hand-made vocabularies ------------------------------------- */

#define STR(x) { x, sizeof x - 1 }

Test (spm, merges_by_score)
{
    /* "abc": "ab" (score -1) and "bc" (score -0.5) compete; the higher
     * score wins, leaving "a" + "bc". */
    static const struct rx_str toks[] = {
        STR ("<unk>"), STR ("<s>"), STR ("</s>"), STR ("\xE2\x96\x81"), STR ("a"), STR ("b"),
        STR ("c"), STR ("ab"), STR ("bc"), STR ("\xE2\x96\x81" "a")
    };
    static const float scores[] = { 0, 0, 0, -3, -2, -2, -2, -1, -0.5f, -0.25f };
    static const int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1, 1, 1 };
    struct rx_vocab_desc d;
    rx_vocab_desc_init (&d);
    d.model = "llama";
    d.n_tokens = 10;
    d.tokens = toks;
    d.scores = scores;
    d.types = types;
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_new (&d, &err);
    cr_assert_not_null (t, "%s", err.msg);
    int32_t *ids;
    size_t n;
    /* "▁abc": "▁a" (-0.25) merges first, then only "bc" (-0.5) is left. */
    s_encode (t, "abc", 3, 0, &ids, &n);
    int32_t want[] = { 9, 8 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want, sizeof want);
    free (ids);
    /* No byte tokens: an unknown character falls back to <unk>. */
    s_encode (t, "z", 1, 0, &ids, &n);
    int32_t want2[] = { 3, 0 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want2, sizeof want2);
    free (ids);
    rx_tokenizer_free (&t);
}

Test (bpe, merges_by_rank)
{
    /* Byte-level: space is "Ġ" (U+0120). Ranks: "a b" < "b c" < "Ġ a". */
    static const struct rx_str toks[] = {
        STR ("a"), STR ("b"), STR ("c"), STR ("\xC4\xA0"), STR ("ab"), STR ("bc"),
        STR ("\xC4\xA0" "a"), STR ("abc"), STR ("<|endoftext|>")
    };
    static const struct rx_str merges[] = {
        STR ("a b"), STR ("b c"), STR ("\xC4\xA0 a"), STR ("ab c")
    };
    static const int32_t types[] = { 1, 1, 1, 1, 1, 1, 1, 1, 3 };
    struct rx_vocab_desc d;
    rx_vocab_desc_init (&d);
    d.model = "gpt2";
    d.pre = "gpt-2";
    d.n_tokens = 9;
    d.tokens = toks;
    d.types = types;
    d.n_merges = 4;
    d.merges = merges;
    d.bos = d.eos = 8;
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_new (&d, &err);
    cr_assert_not_null (t, "%s", err.msg);
    int32_t *ids;
    size_t n;
    /* "abc" -> "ab" + "c" (rank 0) -> "abc" (rank 3); " a" -> "Ġa". */
    s_encode (t, "abc a", 5, 0, &ids, &n);
    int32_t want[] = { 7, 6 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want, sizeof want);
    free (ids);
    /* "bcb": "b c" is the only merge -> "bc" + "b". */
    s_encode (t, "bcb", 3, 0, &ids, &n);
    int32_t want2[] = { 5, 1 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want2, sizeof want2);
    free (ids);
    /* A character with no token at all is dropped, as in llama.cpp. */
    s_encode (t, "q", 1, 0, &ids, &n);
    cr_assert_eq (n, 0);
    /* Control token only with PARSE_SPECIAL. */
    s_encode (t, "a<|endoftext|>", 14, RX_TOK_PARSE_SPECIAL, &ids, &n);
    int32_t want3[] = { 0, 8 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want3, sizeof want3);
    free (ids);
    rx_tokenizer_free (&t);
}

/* Every supported pre-tokenizer compiles and runs; digit handling shows
 * the family's regex: llama3 groups up to 3 digits, qwen2 splits each. */
Test (bpe, pre_families)
{
    static const struct rx_str toks[] = {
        STR ("1"), STR ("2"), STR ("3"), STR ("4"), STR ("5"), STR ("12"), STR ("123"), STR ("45"),
        STR ("34"), STR ("<|begin_of_text|>")
    };
    static const struct rx_str merges[] = { STR ("1 2"), STR ("12 3"), STR ("4 5"), STR ("3 4") };
    static const char *const names[] = {
        "default", "gpt-2", "llama3", "llama-bpe", "deepseek-llm", "deepseek-coder", "deepseek-v3",
        "qwen2", "starcoder", "smollm", "falcon", "refact", "mpt", "dbrx", "chatglm-bpe", "tekken",
        "gpt-4o", "poro-chat", "seed-coder", "bailingmoe", "stablelm2", "command-r"
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct rx_vocab_desc d;
        rx_vocab_desc_init (&d);
        d.model = "gpt2";
        d.pre = names[i];
        d.n_tokens = 10;
        d.tokens = toks;
        d.n_merges = 4;
        d.merges = merges;
        d.bos = d.eos = 9;
        struct rx_err err = { 0 };
        rx_tokenizer_t *t = rx_tokenizer_new (&d, &err);
        cr_assert_not_null (t, "%s: %s", names[i], err.msg);
        cr_assert_str_eq (rx_tokenizer_pre (t), names[i]);
        int32_t *ids;
        size_t n;
        s_encode (t, "12345", 5, RX_TOK_ADD_SPECIAL, &ids, &n);
        char *got = s_fmt_ids (ids, n);
        if (strcmp (names[i], "llama3") == 0 || strcmp (names[i], "llama-bpe") == 0)
            cr_expect_str_eq (got, "9 6 7", "%s (BOS by default, 123|45)", names[i]);
        else if (strcmp (names[i], "qwen2") == 0 || strcmp (names[i], "deepseek-coder") == 0)
            cr_expect_str_eq (got, "0 1 2 3 4", "%s (one digit per piece)", names[i]);
        else if (strcmp (names[i], "gpt-2") == 0)
            cr_expect_str_eq (got, "6 7", "%s (one piece, merged by rank)", names[i]);
        free (got);
        free (ids);
        rx_tokenizer_free (&t);
    }
}

Test (pretok, gpt2_split)
{
    static const char *const re[] = {
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
    };
    struct rx_err err = { 0 };
    rx_pretok_t *p = rx_pretok_new (re, 1, &err);
    cr_assert_not_null (p, "%s", err.msg);
    const char *text = "It's  \xC3\xA9t\xC3\xA9 42!\n";
    struct rx_span *sp;
    size_t n;
    cr_assert_eq (rx_pretok_split (p, text, strlen (text), &sp, &n, &err), RX_OK);
    const char *want[] = { "It", "'s", " ", " \xC3\xA9t\xC3\xA9", " 42", "!", "\n" };
    cr_assert_eq (n, 7, "got %zu pieces", n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq (sp[i].len, strlen (want[i]), "piece %zu", i);
        cr_assert (memcmp (text + sp[i].off, want[i], sp[i].len) == 0, "piece %zu", i);
    }
    free (sp);
    rx_pretok_free (&p);
    cr_assert_null (p);
}

Test (pretok, nel_is_whitespace)
{
    /* U+0085 counts as \s (Unicode White_Space), as in the reference. */
    static const char *const re[] = { "\\S+" };
    struct rx_err err = { 0 };
    rx_pretok_t *p = rx_pretok_new (re, 1, &err);
    cr_assert_not_null (p, "%s", err.msg);
    const char *text = "ab\xC2\x85" "cd";
    struct rx_span *sp;
    size_t n;
    cr_assert_eq (rx_pretok_split (p, text, strlen (text), &sp, &n, &err), RX_OK);
    cr_assert_eq (n, 3);
    cr_assert_eq (sp[0].len, 2);
    cr_assert_eq (sp[1].len, 2);   /* the NEL gap */
    cr_assert_eq (sp[2].len, 2);
    free (sp);
    rx_pretok_free (&p);
}

Test (pretok, bad_regex)
{
    static const char *const re[] = { "[a-" };
    struct rx_err err = { 0 };
    cr_assert_null (rx_pretok_new (re, 1, &err));
    cr_assert (strstr (err.msg, "[a-"), "%s", err.msg);
}

/* ---- loading errors --------------------------------------------------- */

static void s_expect_new_fails (const struct rx_vocab_desc *d, const char *needle)
{
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_new (d, &err);
    cr_assert_null (t, "expected failure (%s)", needle);
    cr_assert_neq (err.code, RX_OK);
    cr_assert (strstr (err.msg, needle), "message \"%s\" lacks \"%s\"", err.msg, needle);
}

Test (errors, bad_descriptions)
{
    static const struct rx_str toks[] = { STR ("a"), STR ("b"), STR ("a") };
    static const struct rx_str merges[] = { STR ("a b") };
    struct rx_vocab_desc d;
    rx_vocab_desc_init (&d);
    d.source = "test.gguf";
    d.tokens = toks;
    d.n_tokens = 2;
    s_expect_new_fails (&d, "tokenizer.ggml.model");
    d.model = "bert";
    s_expect_new_fails (&d, "unsupported tokenizer model \"bert\"");
    d.model = "gpt2";
    d.pre = "no-such-pre";
    s_expect_new_fails (&d, "unknown pre-tokenizer \"no-such-pre\"");
    d.pre = "gpt-2";
    s_expect_new_fails (&d, "merges");
    d.merges = merges;
    d.n_merges = 1;
    d.n_tokens = 3;
    s_expect_new_fails (&d, "duplicate token");
    d.n_tokens = 2;
    d.add_bos = 1;   /* default BOS 11 is out of range for 2 tokens */
    s_expect_new_fails (&d, "no BOS");
    d.add_bos = -1;
    d.n_tokens = 0;
    s_expect_new_fails (&d, "test.gguf");
}

Test (errors, missing_file)
{
    struct rx_err err = { 0 };
    cr_assert_null (rx_tokenizer_open ("/nonexistent/model.gguf", &err));
    cr_assert (strstr (err.msg, "/nonexistent/model.gguf"), "%s", err.msg);
}

/* Write a GGUF with the given metadata through the project's writer. */
typedef void (*s_kv_fn) (rx_gguf_writer_t *w);

static char *s_write_gguf (const char *dir, const char *name, s_kv_fn fn)
{
    char *path = tu_path (dir, name);
    struct rx_err err = { 0 };
    rx_gguf_writer_t *w = rx_gguf_writer_new (path, &err);
    cr_assert_not_null (w, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_add_str (w, "general.architecture", "llama", &err), RX_OK);
    fn (w);
    cr_assert_eq (rx_gguf_writer_begin (w, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_gguf_writer_finish (w, &err), RX_OK, "%s", err.msg);
    rx_gguf_writer_destroy (&w);
    return path;
}

static void s_kv_none (rx_gguf_writer_t *w) { (void) w; }

static void s_kv_tokens_not_strings (rx_gguf_writer_t *w)
{
    struct rx_err err = { 0 };
    int32_t v[3] = { 1, 2, 3 };
    rx_gguf_writer_add_str (w, "tokenizer.ggml.model", "llama", &err);
    rx_gguf_writer_add_arr (w, "tokenizer.ggml.tokens", RX_GGUF_INT32, v, 3, &err);
}

static void s_kv_short_scores (rx_gguf_writer_t *w)
{
    struct rx_err err = { 0 };
    const char *toks[] = { "<unk>", "<s>", "</s>" };
    float sc[2] = { 0, 0 };
    rx_gguf_writer_add_str (w, "tokenizer.ggml.model", "llama", &err);
    rx_gguf_writer_add_arr_str (w, "tokenizer.ggml.tokens", toks, NULL, 3, &err);
    rx_gguf_writer_add_arr (w, "tokenizer.ggml.scores", RX_GGUF_FLOAT32, sc, 2, &err);
}

static void s_kv_model_not_string (rx_gguf_writer_t *w)
{
    struct rx_err err = { 0 };
    rx_gguf_writer_add_u32 (w, "tokenizer.ggml.model", 7, &err);
}

static void s_kv_good_small (rx_gguf_writer_t *w)
{
    struct rx_err err = { 0 };
    const char *toks[] = { "<unk>", "<s>", "</s>", "\xE2\x96\x81", "h", "i", "\xE2\x96\x81h" };
    float sc[7] = { 0, 0, 0, -1, -1, -1, -0.5f };
    int32_t ty[7] = { 2, 3, 3, 1, 1, 1, 1 };
    rx_gguf_writer_add_str (w, "tokenizer.ggml.model", "llama", &err);
    rx_gguf_writer_add_arr_str (w, "tokenizer.ggml.tokens", toks, NULL, 7, &err);
    rx_gguf_writer_add_arr (w, "tokenizer.ggml.scores", RX_GGUF_FLOAT32, sc, 7, &err);
    rx_gguf_writer_add_arr (w, "tokenizer.ggml.token_type", RX_GGUF_INT32, ty, 7, &err);
    rx_gguf_writer_add_u32 (w, "tokenizer.ggml.bos_token_id", 1, &err);
    rx_gguf_writer_add_bool (w, "tokenizer.ggml.add_bos_token", 0, &err);
    rx_gguf_writer_add_str (w, "tokenizer.chat_template", "{{ x }}", &err);
}

Test (errors, bad_gguf_metadata)
{
    char *dir = tu_tmpdir ();
    static const struct {
        const char *file;
        s_kv_fn fn;
        const char *needle;
    } cases[] = {
        { "none.gguf", s_kv_none, "tokenizer.ggml.model is missing" },
        { "tokint.gguf", s_kv_tokens_not_strings, "tokenizer.ggml.tokens is not an array of strings" },
        { "short.gguf", s_kv_short_scores, "tokenizer.ggml.scores has 2 entries" },
        { "modelint.gguf", s_kv_model_not_string, "tokenizer.ggml.model is not a string" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *path = s_write_gguf (dir, cases[i].file, cases[i].fn);
        struct rx_err err = { 0 };
        rx_tokenizer_t *t = rx_tokenizer_open (path, &err);
        cr_expect_null (t, "%s should not load", cases[i].file);
        cr_expect (strstr (err.msg, cases[i].needle) && strstr (err.msg, cases[i].file),
                   "%s: message \"%s\"", cases[i].file, err.msg);
        rx_tokenizer_free (&t);
        unlink (path);
        free (path);
    }
    /* And a small good one: keys are honoured. */
    char *path = s_write_gguf (dir, "good.gguf", s_kv_good_small);
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (path, &err);
    cr_assert_not_null (t, "%s", err.msg);
    cr_assert_eq (rx_tokenizer_add_bos (t), 0);
    cr_assert_str_eq (rx_tokenizer_chat_template (t), "{{ x }}");
    int32_t *ids;
    size_t n;
    s_encode (t, "hi", 2, RX_TOK_ADD_SPECIAL, &ids, &n);
    int32_t want[] = { 6, 5 };
    cr_assert_eq (n, 2);
    cr_assert_arr_eq (ids, want, sizeof want);
    free (ids);
    rx_tokenizer_free (&t);
    unlink (path);
    free (path);
    rmdir (dir);
    free (dir);
}

/* ---- UTF-8 helpers ---------------------------------------------------- */

Test (utf8, helpers)
{
    uint32_t cp;
    cr_assert_eq (rx_utf8_decode ("\xE2\x82\xAC", 3, &cp), 3);
    cr_assert_eq (cp, 0x20AC);
    cr_assert_eq (rx_utf8_decode ("\xC0\x80", 2, &cp), 1);       /* overlong */
    cr_assert_eq (cp, RX_UNICODE_REPLACEMENT);
    cr_assert_eq (rx_utf8_decode ("\xED\xA0\x80", 3, &cp), 1);   /* surrogate */
    cr_assert_eq (rx_utf8_incomplete_tail ("a\xF0\x9F\x98", 4), 3);
    cr_assert_eq (rx_utf8_incomplete_tail ("a\xF0\x9F\x98\x80", 5), 0);
    cr_assert_eq (rx_utf8_incomplete_tail ("a\xE0\x80", 3), 0);  /* can never complete */
    cr_assert_eq (rx_utf8_bad_len ("\xE2\x82" "A", 3), 2);
    cr_assert (rx_utf8_valid ("h\xC3\xA9", 3));
    cr_assert (!rx_utf8_valid ("h\xC3", 2));
    cr_assert_eq (rx_byte_to_unicode (' '), 0x120);
    cr_assert_eq (rx_byte_to_unicode ('A'), 'A');
    cr_assert_eq (rx_unicode_to_byte (0x120), ' ');
    for (int b = 0; b < 256; b++) cr_assert_eq (rx_unicode_to_byte (rx_byte_to_unicode ((uint8_t) b)), b);
}
