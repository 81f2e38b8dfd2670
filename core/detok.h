/* core/detok.h -- incremental (streaming) detokenizer, one state per request.
 *
 * Feed generated token ids one at a time; each call hands back the text that
 * became final with that token:
 *   - never half a UTF-8 character: bytes of an unfinished sequence (a
 *     character split over byte-fallback tokens, or a BPE token holding part
 *     of an emoji) are held until the rest arrives;
 *   - never invalid UTF-8: a byte that cannot start or continue a character
 *     becomes U+FFFD, so every delta can go straight into JSON;
 *   - stop strings are matched across token (chunk) boundaries: text that
 *     could be the start of a stop string is held back until it is known
 *     not to be one; when a stop string completes, the text before it is
 *     released, the stop string itself is not, and the state is "stopped".
 * The concatenation of all deltas (plus rx_detok_finish) equals the UTF-8
 * sanitised decode of the whole sequence, cut at the first stop string.
 *
 * Ownership: the state borrows the tokenizer (it must outlive the state) and
 * copies the stop strings.  Not thread-safe per state; use one per request.
 * The tokenizer itself may be shared. */
#ifndef RX_DETOK_H
#define RX_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "tokenizer.h"

struct rx_detok {
    const rx_tokenizer_t *tok;
    unsigned flags;              /* RX_DETOK_* from tokenizer.h */
    int started;                 /* some text was produced (leading-space strip done) */
    int stopped;                 /* a stop string matched: nothing more is emitted */
    int stop_index;              /* which one, or -1 */
    unsigned char pend[4];       /* unfinished UTF-8 sequence held back */
    size_t npend;
    char **stops;                /* copies */
    size_t *stop_len;
    size_t n_stops;
    char *hold;                  /* valid text held back: may begin a stop string */
    size_t nhold, cap_hold;
    char *out;                   /* the last delta (owned, reused) */
    size_t nout, cap_out;
};

/* What one call produced.  text is valid until the next call on the state. */
struct rx_detok_delta {
    const char *text;            /* NUL-terminated, valid UTF-8 */
    size_t len;
    int stopped;                 /* a stop string completed (now or earlier) */
    int stop_index;              /* index into the stop list, or -1 */
};

/* flags: RX_DETOK_SPECIAL renders control tokens; RX_DETOK_STRIP_SPACE
 * drops the SPM leading space of the very first text (use it when the
 * output does not continue a prompt).  Never fails. */
void rx_detok_init (struct rx_detok *d, const rx_tokenizer_t *tok, unsigned flags);

/* Replace the stop strings (empty strings are ignored).  Call before the
 * first push. */
int rx_detok_set_stops (struct rx_detok *d, const char *const *stops, size_t n, struct rx_err *err);

/* Feed one token id.  RX_EINVAL (and no state change) for an id outside
 * the vocabulary. */
int rx_detok_push (struct rx_detok *d, int32_t id, struct rx_detok_delta *out, struct rx_err *err);

/* Feed raw bytes (what a token stands for); the token path uses this. */
int rx_detok_push_bytes (struct rx_detok *d, const char *bytes, size_t n,
                         struct rx_detok_delta *out, struct rx_err *err);

/* End of the sequence: an unfinished character becomes U+FFFD and text held
 * for stop matching is released. */
int rx_detok_finish (struct rx_detok *d, struct rx_detok_delta *out, struct rx_err *err);

/* Free what the state owns (the struct itself is the caller's). */
void rx_detok_fini (struct rx_detok *d);

#endif
