/* tests/fuzz/fuzz_tokenizer.c -- libFuzzer harness for the byte-level BPE
 * tokenizer (core/tokenizer.c, its pre-tokenizer regexes in core/unicode.c).
 *
 * Real vocabularies from $RADIX_SHARED/data/tokenizers: GPT-2 ("gpt2"
 * pre-tokenizer) when the first input byte is even, StarCoder when odd; the
 * rest of the input is the text.  Properties:
 *   - encoding never fails and every id is inside the vocabulary;
 *   - for valid UTF-8 text, decode(encode(text)) == text byte for byte
 *     (byte-level BPE loses nothing: no special tokens are parsed or added),
 *     except bytes the vocabulary has no token for (StarCoder lacks 0xF1):
 *     those are dropped, as llama.cpp does;
 *   - the pieces of the ids, concatenated, are the decoded text;
 *   - invalid UTF-8 is tokenized without a crash (BPE sees U+FFFD).
 * Build and run: tests/fuzz/run.sh tokenizer.  Inputs it once failed on live
 * in tests/fuzz/regressions-tokenizer/ (replayed by tests/fuzz/replay_tokenizer). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

int LLVMFuzzerInitialize (int *argc, char ***argv);
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static rx_tokenizer_t *s_tok[2];
static unsigned char s_lost[2][256];   /* byte has no token in vocabulary v */

static rx_tokenizer_t *s_open (const char *file)
{
    char path[4096];
    const char *sh = getenv ("RADIX_SHARED");
    snprintf (path, sizeof path, "%s/data/tokenizers/%s", sh ? sh : "/work/shared", file);
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (path, &err);
    if (!t) {
        fprintf (stderr, "fuzz_tokenizer: %s (set RADIX_SHARED)\n", err.msg);
        exit (1);
    }
    if (rx_tokenizer_model (t) != RX_TOK_MODEL_BPE) {
        fprintf (stderr, "fuzz_tokenizer: %s is not a byte-level BPE vocabulary\n", path);
        exit (1);
    }
    return t;
}

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    (void) argc;
    (void) argv;
    s_tok[0] = s_open ("ggml-vocab-gpt-2.gguf");
    s_tok[1] = s_open ("ggml-vocab-starcoder.gguf");
    /* Bytes a vocabulary has no token for (StarCoder: 0xF1, the lead byte of
     * planes 4-7) are dropped by encode, as llama.cpp and HF tokenizers do. */
    for (int v = 0; v < 2; v++)
        for (int b = 0; b < 256; b++) {
            char u[4];
            size_t k = rx_utf8_encode (rx_byte_to_unicode ((uint8_t) b), u);
            s_lost[v][b] = rx_tokenizer_find (s_tok[v], u, k) < 0;
        }
    return 0;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const rx_tokenizer_t *t = s_tok[data[0] & 1];
    size_t len = size - 1;
    /* an exact-size copy, so ASan sees any read past the text */
    char *text = malloc (len ? len : 1);
    if (!text) return 0;
    memcpy (text, data + 1, len);
    int32_t *ids = NULL;
    size_t n = 0;
    struct rx_err err = { 0 };
    if (rx_tokenizer_encode (t, text, len, 0, &ids, &n, &err) != RX_OK) {
        fprintf (stderr, "encode failed: %s\n", err.msg);
        abort ();
    }
    if ((n == 0) != (len == 0) || (n && !ids)) abort ();
    size_t nv = rx_tokenizer_n_vocab (t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t) ids[i] >= nv) abort ();
    char *back = NULL;
    size_t blen = 0;
    if (rx_tokenizer_decode (t, ids, n, 0, &back, &blen, &err) != RX_OK || !back) {
        fprintf (stderr, "decode failed: %s\n", err.msg);
        abort ();
    }
    if (back[blen] != '\0') abort ();
    if (rx_utf8_valid (text, len)) {
        /* the text less the bytes the vocabulary cannot represent */
        size_t wl = 0;
        for (size_t i = 0; i < len; i++)
            if (!s_lost[data[0] & 1][(unsigned char) text[i]]) text[wl++] = text[i];
        if (blen != wl || memcmp (back, text, wl) != 0) {
            fprintf (stderr, "round trip differs: %zu bytes in (%zu representable), %zu bytes out\n",
                     len, wl, blen);
            abort ();
        }
    }
    /* The pieces are the decoded text. */
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t pl;
        if (rx_tokenizer_piece (t, ids[i], 0, &s, &pl) != RX_OK) abort ();
        if (off + pl > blen || memcmp (back + off, s, pl) != 0) abort ();
        off += pl;
    }
    if (off != blen) abort ();
    free (back);
    free (ids);
    free (text);
    return 0;
}
