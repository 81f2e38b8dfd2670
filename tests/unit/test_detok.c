/* tests/unit/test_detok.c -- the streaming detokenizer: never half a UTF-8
 * character, never invalid UTF-8, stop strings across chunk boundaries. */
#include <criterion/criterion.h>

#include "detok.h"
#include "../testutil.h"
#include "unicode.h"

struct s_acc {
    char buf[4096];
    size_t n;
};

/* Push bytes, check the delta is valid UTF-8, append it. */
static void s_push (struct rx_detok *d, struct s_acc *a, const char *bytes, size_t n, const char *want)
{
    struct rx_detok_delta out;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_detok_push_bytes (d, bytes, n, &out, &err), RX_OK, "%s", err.msg);
    cr_assert (rx_utf8_valid (out.text, out.len), "delta is not valid UTF-8");
    cr_assert_eq (strlen (out.text), out.len);
    if (want) cr_assert_str_eq (out.text, want);
    memcpy (a->buf + a->n, out.text, out.len);
    a->n += out.len;
    a->buf[a->n] = '\0';
}

static void s_finish (struct rx_detok *d, struct s_acc *a, const char *want)
{
    struct rx_detok_delta out;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_detok_finish (d, &out, &err), RX_OK);
    cr_assert (rx_utf8_valid (out.text, out.len));
    if (want) cr_assert_str_eq (out.text, want);
    memcpy (a->buf + a->n, out.text, out.len);
    a->n += out.len;
    a->buf[a->n] = '\0';
}

Test (utf8, split_characters_are_held)
{
    struct rx_detok d;
    struct s_acc a = { .n = 0 };
    rx_detok_init (&d, NULL, 0);
    s_push (&d, &a, "x\xE2", 2, "x");        /* € = E2 82 AC */
    s_push (&d, &a, "\x82", 1, "");
    s_push (&d, &a, "\xAC" "y", 2, "\xE2\x82\xAC" "y");
    s_push (&d, &a, "\xF0", 1, "");          /* 😀 = F0 9F 98 80 */
    s_push (&d, &a, "\x9F\x98", 2, "");
    s_push (&d, &a, "\x80", 1, "\xF0\x9F\x98\x80");
    s_finish (&d, &a, "");
    cr_assert_str_eq (a.buf, "x\xE2\x82\xAC" "y\xF0\x9F\x98\x80");
    rx_detok_fini (&d);
}

Test (utf8, invalid_bytes_become_replacement)
{
    struct rx_detok d;
    struct s_acc a = { .n = 0 };
    rx_detok_init (&d, NULL, 0);
    s_push (&d, &a, "\xFF", 1, "\xEF\xBF\xBD");               /* never valid: out at once */
    s_push (&d, &a, "\xE2\x82", 2, "");                        /* could still complete */
    s_push (&d, &a, "A", 1, "\xEF\xBF\xBD" "A");               /* one U+FFFD for the broken pair */
    s_push (&d, &a, "\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"); /* surrogate */
    s_push (&d, &a, "\xC3", 1, "");
    s_finish (&d, &a, "\xEF\xBF\xBD");                         /* unfinished at the end */
    cr_assert (rx_utf8_valid (a.buf, a.n));
    rx_detok_fini (&d);
}

/* Feeding any byte string in any chunks gives the same text as feeding it
 * whole, and every delta is valid UTF-8. */
Test (utf8, chunking_does_not_matter)
{
    unsigned seed = 12345;
    static const unsigned char alphabet[] = {
        'a', ' ', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xFF, 0xC0, 0xED, 0xA0, 0x80
    };
    for (int iter = 0; iter < 300; iter++) {
        char s[64];
        size_t n = (size_t) (rand_r (&seed) % 40);
        for (size_t i = 0; i < n; i++) s[i] = (char) alphabet[rand_r (&seed) % sizeof alphabet];
        struct rx_detok whole, parts;
        struct s_acc aw = { .n = 0 }, ap = { .n = 0 };
        rx_detok_init (&whole, NULL, 0);
        rx_detok_init (&parts, NULL, 0);
        s_push (&whole, &aw, s, n, NULL);
        s_finish (&whole, &aw, NULL);
        for (size_t i = 0; i < n;) {
            size_t k = 1 + (size_t) (rand_r (&seed) % 4);
            if (k > n - i) k = n - i;
            s_push (&parts, &ap, s + i, k, NULL);
            i += k;
        }
        s_finish (&parts, &ap, NULL);
        cr_assert_eq (aw.n, ap.n, "iteration %d", iter);
        cr_assert (memcmp (aw.buf, ap.buf, aw.n) == 0, "iteration %d", iter);
        /* Valid input passes through unchanged. */
        if (rx_utf8_valid (s, n)) cr_assert (aw.n == n && memcmp (aw.buf, s, n) == 0);
        rx_detok_fini (&whole);
        rx_detok_fini (&parts);
    }
}

Test (stops, matched_across_chunks)
{
    struct rx_detok d;
    struct s_acc a = { .n = 0 };
    struct rx_err err = { 0 };
    static const char *const stops[] = { "\n\n", "END" };
    rx_detok_init (&d, NULL, 0);
    cr_assert_eq (rx_detok_set_stops (&d, stops, 2, &err), RX_OK);
    s_push (&d, &a, "Hello E", 7, "Hello ");   /* "E" may start "END" */
    s_push (&d, &a, "N", 1, "");
    s_push (&d, &a, "X", 1, "ENX");            /* it did not */
    s_push (&d, &a, " the E", 6, " the ");
    s_push (&d, &a, "N", 1, "");
    struct rx_detok_delta out;
    cr_assert_eq (rx_detok_push_bytes (&d, "D and more", 10, &out, &err), RX_OK);
    cr_assert_str_eq (out.text, "");
    cr_assert (out.stopped);
    cr_assert_eq (out.stop_index, 1);
    /* Nothing after a stop. */
    cr_assert_eq (rx_detok_push_bytes (&d, "x", 1, &out, &err), RX_OK);
    cr_assert_eq (out.len, 0);
    cr_assert (out.stopped);
    rx_detok_fini (&d);
    cr_assert_str_eq (a.buf, "Hello ENX the ");
}

Test (stops, text_before_stop_in_same_chunk)
{
    struct rx_detok d;
    struct rx_err err = { 0 };
    static const char *const stops[] = { "\n\n" };
    rx_detok_init (&d, NULL, 0);
    cr_assert_eq (rx_detok_set_stops (&d, stops, 1, &err), RX_OK);
    struct rx_detok_delta out;
    cr_assert_eq (rx_detok_push_bytes (&d, "one\n", 4, &out, &err), RX_OK);
    cr_assert_str_eq (out.text, "one");
    cr_assert_eq (rx_detok_push_bytes (&d, "\ntwo", 4, &out, &err), RX_OK);
    cr_assert_str_eq (out.text, "");
    cr_assert (out.stopped);
    cr_assert_eq (out.stop_index, 0);
    rx_detok_fini (&d);
}

Test (stops, held_prefix_released_at_finish)
{
    struct rx_detok d;
    struct s_acc a = { .n = 0 };
    struct rx_err err = { 0 };
    static const char *const stops[] = { "STOP" };
    rx_detok_init (&d, NULL, 0);
    cr_assert_eq (rx_detok_set_stops (&d, stops, 1, &err), RX_OK);
    s_push (&d, &a, "abc ST", 6, "abc ");
    s_finish (&d, &a, "ST");
    cr_assert_str_eq (a.buf, "abc ST");
    rx_detok_fini (&d);
}

/* ---- with real vocabularies ------------------------------------------- */

static rx_tokenizer_t *s_open (const char *rel)
{
    const char *root = getenv ("RADIX_SHARED");
    if (!root || !*root) cr_skip_test ("RADIX_SHARED is not set: no shared test data");
    char *p = tu_path (root, rel);
    if (access (p, R_OK) != 0) {
        free (p);
        cr_skip_test ("shared test data %s/%s is absent", root, rel);
    }
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (p, &err);
    cr_assert_not_null (t, "%s", err.msg);
    free (p);
    return t;
}

static void s_push_ids (struct rx_detok *d, const int32_t *ids, size_t n, const char *const *want)
{
    for (size_t i = 0; i < n; i++) {
        struct rx_detok_delta out;
        struct rx_err err = { 0 };
        cr_assert_eq (rx_detok_push (d, ids[i], &out, &err), RX_OK, "%s", err.msg);
        cr_assert (rx_utf8_valid (out.text, out.len));
        cr_assert_str_eq (out.text, want[i], "token %zu (id %d)", i, ids[i]);
    }
}

Test (tokens, spm_byte_fallback_character)
{
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-llama-spm.gguf");
    struct rx_detok d;
    rx_detok_init (&d, t, RX_DETOK_STRIP_SPACE);
    /* "▁Hello" then the G clef as four <0xXX> byte tokens (id = 3 + byte). */
    int32_t ids[] = { 15043, 3 + 0xF0, 3 + 0x9D, 3 + 0x84, 3 + 0x9E, 3186 };
    const char *const want[] = { "Hello", "", "", "", "\xF0\x9D\x84\x9E", " world" };
    s_push_ids (&d, ids, 6, want);
    rx_detok_fini (&d);
    /* Without STRIP_SPACE the space of a continuation is kept. */
    rx_detok_init (&d, t, 0);
    const char *const want2[] = { " Hello" };
    s_push_ids (&d, ids, 1, want2);
    /* Control tokens: nothing by default; EOS is end-of-generation. */
    const char *const want3[] = { "" };
    s_push_ids (&d, (int32_t[]) { 2 }, 1, want3);
    cr_assert (rx_tokenizer_is_eog (t, 2));
    struct rx_detok_delta out;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_detok_push (&d, 32000, &out, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "32000"), "%s", err.msg);
    rx_detok_fini (&d);
    rx_detok_init (&d, t, RX_DETOK_SPECIAL);
    const char *const want4[] = { "</s>" };
    s_push_ids (&d, (int32_t[]) { 2 }, 1, want4);
    rx_detok_fini (&d);
    rx_tokenizer_free (&t);
}

Test (tokens, bpe_emoji_split_over_tokens)
{
    rx_tokenizer_t *t = s_open ("data/tokenizers/ggml-vocab-gpt-2.gguf");
    struct rx_detok d;
    rx_detok_init (&d, t, 0);
    /* " this is 🦙.cpp" (gpt-2 vectors): 🦙 = F0 9F A6 99 spread over
     * " \xF0\x9F" (12520), "\xA6" (99) and "\x99" (247). */
    int32_t ids[] = { 428, 318, 12520, 99, 247, 13, 20322 };
    const char *const want[] = { " this", " is", " ", "", "\xF0\x9F\xA6\x99", ".", "cpp" };
    s_push_ids (&d, ids, 7, want);
    rx_detok_fini (&d);
    rx_tokenizer_free (&t);
}
