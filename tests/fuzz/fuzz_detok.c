/* tests/fuzz/fuzz_detok.c -- libFuzzer harness for the incremental UTF-8
 * detokenizer (core/detok.c).
 *
 * Input: byte 0 picks the flags (bit 0 RX_DETOK_SPECIAL, bit 1
 * RX_DETOK_STRIP_SPACE) and the vocabulary (bit 2: tiny-llama's SentencePiece
 * with byte-fallback tokens, else GPT-2's byte-level BPE); byte 1 the number
 * of stop strings (0..3), each then given as a length byte and its bytes
 * (made valid UTF-8, as the API's JSON strings always are); the rest is
 * token ids, two bytes each (0xFFFF: an id outside the vocabulary, which
 * must be refused without changing the state).  Properties:
 *   - every delta is valid UTF-8 (never half a character);
 *   - without stops, the deltas fed one token at a time (plus finish) equal
 *     the same bytes decoded all at once (rx_tokenizer_decode, then one push
 *     and finish), and equal the raw decode when that is valid UTF-8;
 *   - with stops, the text is a prefix of the no-stop text that contains no
 *     stop string; when stopped, the no-stop text continues with the stop
 *     string reported, else it is the whole text.
 * Build and run: tests/fuzz/run.sh detok.  Inputs it once failed on live in
 * tests/fuzz/regressions-detok/ (replayed by tests/fuzz/replay_detok). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detok.h"
#include "unicode.h"

int LLVMFuzzerInitialize (int *argc, char ***argv);
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static rx_tokenizer_t *s_tok[2];

static rx_tokenizer_t *s_open (const char *rel)
{
    char path[4096];
    const char *sh = getenv ("RADIX_SHARED");
    snprintf (path, sizeof path, "%s/data/%s", sh ? sh : "/work/shared", rel);
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (path, &err);
    if (!t) {
        fprintf (stderr, "fuzz_detok: %s (set RADIX_SHARED)\n", err.msg);
        exit (1);
    }
    return t;
}

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc;
    (void) argv;
    s_tok[0] = s_open ("tokenizers/ggml-vocab-gpt-2.gguf");
    s_tok[1] = s_open ("models/tiny-llama.gguf");
    return 0;
}

struct s_text {
    char *p;
    size_t n;
};

static void s_add (struct s_text *t, const struct rx_detok_delta *d)
{
    if (!d->text || !rx_utf8_valid (d->text, d->len) || d->text[d->len] != '\0') {
        fprintf (stderr, "a delta is not valid NUL-terminated UTF-8\n");
        abort ();
    }
    char *p = realloc (t->p, t->n + d->len + 1);
    if (!p) abort ();
    t->p = p;
    memcpy (t->p + t->n, d->text, d->len);
    t->n += d->len;
    t->p[t->n] = '\0';
}

/* Feed ids one at a time through a fresh state; returns the text. */
static struct s_text s_stream (const rx_tokenizer_t *tok, unsigned flags, const char *const *stops,
                               size_t n_stops, const int32_t *ids, size_t n, int *stopped,
                               int *stop_index)
{
    struct rx_detok d;
    struct rx_detok_delta dl;
    struct rx_err err = { 0 };
    struct s_text out = { NULL, 0 };
    rx_detok_init (&d, tok, flags);
    if (rx_detok_set_stops (&d, stops, n_stops, &err) != RX_OK) abort ();
    for (size_t i = 0; i < n; i++) {
        int rc = rx_detok_push (&d, ids[i], &dl, &err);
        if (ids[i] < 0 || (size_t) ids[i] >= rx_tokenizer_n_vocab (tok)) {
            if (rc != RX_EINVAL || !err.msg[0]) abort ();
            continue;
        }
        if (rc != RX_OK) abort ();
        s_add (&out, &dl);
    }
    if (rx_detok_finish (&d, &dl, &err) != RX_OK) abort ();
    s_add (&out, &dl);
    *stopped = dl.stopped;
    *stop_index = dl.stop_index;
    rx_detok_fini (&d);
    if (!out.p) out.p = calloc (1, 1);
    return out;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    unsigned flags = data[0] & 3;
    const rx_tokenizer_t *tok = s_tok[(data[0] >> 2) & 1];
    size_t n_stops = data[1] % 4, off = 2;
    char *stops[3] = { NULL, NULL, NULL };
    for (size_t i = 0; i < n_stops; i++) {
        size_t l = off < size ? data[off++] : 0;
        if (l > size - off) l = size - off;
        size_t sl;
        stops[i] = rx_utf8_sanitize ((const char *) data + off, l, &sl);
        if (!stops[i]) abort ();
        off += l;
    }
    size_t n = (size - off) / 2, nv = rx_tokenizer_n_vocab (tok);
    int32_t *ids = malloc ((n ? n : 1) * sizeof *ids), *valid = malloc ((n ? n : 1) * sizeof *ids);
    size_t nvalid = 0;
    if (!ids || !valid) abort ();
    for (size_t i = 0; i < n; i++) {
        unsigned v = data[off + 2 * i] | (unsigned) data[off + 2 * i + 1] << 8;
        ids[i] = v == 0xFFFF ? (int32_t) nv : (int32_t) (v % nv);
        if (v != 0xFFFF) valid[nvalid++] = ids[i];
    }
    int stopped, stop_index;
    struct s_text full = s_stream (tok, flags, NULL, 0, ids, n, &stopped, &stop_index);
    if (stopped || stop_index != -1) abort ();
    /* The same bytes all at once. */
    char *raw = NULL;
    size_t nraw = 0;
    struct rx_err err = { 0 };
    if (rx_tokenizer_decode (tok, valid, nvalid, flags & RX_DETOK_SPECIAL, &raw, &nraw, &err) != RX_OK)
        abort ();
    struct rx_detok d;
    struct rx_detok_delta dl;
    struct s_text once = { NULL, 0 };
    rx_detok_init (&d, tok, flags);
    if (rx_detok_push_bytes (&d, raw, nraw, &dl, &err) != RX_OK) abort ();
    s_add (&once, &dl);
    if (rx_detok_finish (&d, &dl, &err) != RX_OK) abort ();
    s_add (&once, &dl);
    rx_detok_fini (&d);
    if (!once.p) once.p = calloc (1, 1);
    if (once.n != full.n || memcmp (once.p, full.p, full.n) != 0) {
        fprintf (stderr, "token at a time gives %zu bytes, all at once %zu\n", full.n, once.n);
        abort ();
    }
    if (rx_utf8_valid (raw, nraw)) {
        /* valid UTF-8 passes through unchanged (but for the SPM leading space) */
        const char *r = raw;
        size_t nr = nraw;
        if ((flags & RX_DETOK_STRIP_SPACE) && rx_tokenizer_model (tok) == RX_TOK_MODEL_SPM &&
            nr && r[0] == ' ')
            r++, nr--;
        if (nr != full.n || memcmp (r, full.p, nr) != 0) abort ();
    }
    if (n_stops) {
        struct s_text cut = s_stream (tok, flags, (const char *const *) stops, n_stops, ids, n,
                                      &stopped, &stop_index);
        if (cut.n > full.n || memcmp (cut.p, full.p, cut.n) != 0) abort ();
        for (size_t i = 0; i < n_stops; i++)
            if (stops[i][0] && memmem (cut.p, cut.n, stops[i], strlen (stops[i]))) abort ();
        if (stopped) {
            if (stop_index < 0 || (size_t) stop_index >= n_stops) abort ();
            /* the index is into the non-empty stops, in order */
            const char *s = NULL;
            for (size_t i = 0, k = 0; i < n_stops; i++)
                if (stops[i][0] && k++ == (size_t) stop_index) s = stops[i];
            if (!s || full.n - cut.n < strlen (s) || memcmp (full.p + cut.n, s, strlen (s)) != 0)
                abort ();
        } else if (cut.n != full.n) {
            abort ();
        }
        free (cut.p);
    }
    free (once.p);
    free (full.p);
    free (raw);
    free (ids);
    free (valid);
    for (size_t i = 0; i < n_stops; i++) free (stops[i]);
    return 0;
}
