/* core/unicode.h -- UTF-8 helpers, the GPT-2 byte<->unicode mapping and the
 * PCRE2-based pre-tokenizer (regex splitter) used by the BPE tokenizer.
 *
 * Unicode categories (\p{L}, \p{N}, ...) come from PCRE2 (compiled with
 * UTF + UCP), not from hand-written tables.  Everything here is a pure
 * function or read-only after construction, so it is safe to share between
 * threads. */
#ifndef RX_UNICODE_H
#define RX_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#define RX_UNICODE_REPLACEMENT 0xFFFDu

/* Length of the UTF-8 sequence a lead byte announces (1..4), as llama.cpp's
 * unicode_len_utf8: continuation and invalid lead bytes count as 1. */
size_t rx_utf8_len (unsigned char lead);

/* Decode one code point from s (n > 0 bytes available).  Returns the bytes
 * consumed (>= 1).  Malformed input (bad lead byte, missing continuation,
 * truncated sequence, overlong form, surrogate, > U+10FFFF) consumes one
 * byte and yields U+FFFD. */
size_t rx_utf8_decode (const char *s, size_t n, uint32_t *cp);

/* Encode cp (<= U+10FFFF) into out; returns 1..4, or 0 for an invalid cp. */
size_t rx_utf8_encode (uint32_t cp, char out[4]);

/* At a position where rx_utf8_decode fails: the length of the maximal
 * subpart (the longest prefix of a well-formed sequence, at least 1), so a
 * decoder can emit one U+FFFD per broken sequence as Python's "replace" and
 * the WHATWG encoding standard do. */
size_t rx_utf8_bad_len (const char *s, size_t n);

/* 1 if s[0..n) is entirely valid UTF-8 (no overlongs, no surrogates). */
int rx_utf8_valid (const char *s, size_t n);

/* How many bytes at the end of s[0..n) form the start of a multi-byte
 * sequence that is still valid so far but incomplete (0..3).  A streaming
 * decoder holds those bytes back until the rest arrives. */
size_t rx_utf8_incomplete_tail (const char *s, size_t n);

/* A newly allocated copy of s[0..n) where every malformed byte is replaced
 * by U+FFFD (EF BF BD); the result is valid UTF-8 and NUL-terminated.
 * Caller frees.  NULL only when out of memory. */
char *rx_utf8_sanitize (const char *s, size_t n, size_t *out_len);

/* GPT-2 byte-level mapping: every byte has a printable code point
 * (bytes_to_unicode of the original GPT-2 encoder). */
uint32_t rx_byte_to_unicode (uint8_t b);
/* Inverse: the byte for a mapped code point, or -1 if cp is not one. */
int rx_unicode_to_byte (uint32_t cp);

/* ---- pre-tokenizer ---------------------------------------------------- */

/* A byte range of the input text. */
struct rx_span {
    size_t off;
    size_t len;
};

typedef struct rx_pretok rx_pretok_t;

/* Compile a list of regexes applied one after the other, as llama.cpp's
 * unicode_regex_split does: each regex splits every piece produced by the
 * previous one into its matches and the (non-empty) gaps between them.
 * Patterns use PCRE2 syntax; \s and \S are widened to include U+0085 so that
 * whitespace is Unicode White_Space as in the reference tokenizers.  A bad
 * pattern is an error naming it.  Caller owns the result. */
rx_pretok_t *rx_pretok_new (const char *const *patterns, size_t n, struct rx_err *err);
void rx_pretok_free (rx_pretok_t **self_p);

/* Split text[0..len), which must be valid UTF-8 (see rx_utf8_sanitize), into
 * spans covering it in order.  *spans is allocated (caller frees), *n set.
 * Thread-safe: per-call match state only. */
int rx_pretok_split (const rx_pretok_t *p, const char *text, size_t len,
                     struct rx_span **spans, size_t *n, struct rx_err *err);

#endif
