/* core/detok.c -- incremental UTF-8-safe detokenizer with stop strings. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "detok.h"
#include "grow.h"
#include "unicode.h"

void rx_detok_init (struct rx_detok *d, const rx_tokenizer_t *tok, unsigned flags)
{
    memset (d, 0, sizeof *d);
    d->tok = tok;
    d->flags = flags;
    d->stop_index = -1;
}

void rx_detok_fini (struct rx_detok *d)
{
    for (size_t i = 0; i < d->n_stops; i++) free (d->stops[i]);
    free (d->stops);
    free (d->stop_len);
    free (d->hold);
    free (d->out);
    d->stops = NULL;
    d->stop_len = NULL;
    d->n_stops = 0;
    d->hold = d->out = NULL;
    d->nhold = d->cap_hold = d->nout = d->cap_out = 0;
}

int rx_detok_set_stops (struct rx_detok *d, const char *const *stops, size_t n, struct rx_err *err)
{
    for (size_t i = 0; i < d->n_stops; i++) free (d->stops[i]);
    free (d->stops);
    free (d->stop_len);
    d->stops = NULL;
    d->stop_len = NULL;
    d->n_stops = 0;
    if (n == 0) return RX_OK;
    d->stops = calloc (n, sizeof *d->stops);
    d->stop_len = calloc (n, sizeof *d->stop_len);
    if (!d->stops || !d->stop_len) goto oom;
    for (size_t i = 0; i < n; i++) {
        if (!stops[i] || !*stops[i]) continue;
        if (!(d->stops[d->n_stops] = strdup (stops[i]))) goto oom;
        d->stop_len[d->n_stops++] = strlen (stops[i]);
    }
    return RX_OK;
oom:
    return rx_err_set (err, RX_ENOMEM, "detokenizer: out of memory");
}

static int s_out_put (struct rx_detok *d, const char *s, size_t n)
{
    if (rx_grow ((void **) &d->out, &d->cap_out, d->nout + n + 1, 1) < 0) return -1;
    if (n) memcpy (d->out + d->nout, s, n);
    d->nout += n;
    d->out[d->nout] = '\0';
    return 0;
}

static int s_hold_put (struct rx_detok *d, const char *s, size_t n)
{
    if (rx_grow ((void **) &d->hold, &d->cap_hold, d->nhold + n + 1, 1) < 0) return -1;
    if (n) memcpy (d->hold + d->nhold, s, n);
    d->nhold += n;
    return 0;
}

/* Move finished text through stop matching into the delta.  final: no more
 * text will come, so nothing needs holding. */
static int s_release (struct rx_detok *d, int final)
{
    if (d->n_stops == 0) {
        int rc = s_out_put (d, d->hold, d->nhold);
        d->nhold = 0;
        return rc;
    }
    /* Earliest complete stop string in the held text. */
    size_t best = (size_t) -1;
    int which = -1;
    for (size_t i = 0; i < d->n_stops; i++) {
        if (d->stop_len[i] > d->nhold) continue;
        const char *m = memmem (d->hold, d->nhold, d->stops[i], d->stop_len[i]);
        if (m && (size_t) (m - d->hold) < best) {
            best = (size_t) (m - d->hold);
            which = (int) i;
        }
    }
    if (which >= 0) {
        int rc = s_out_put (d, d->hold, best);
        d->nhold = 0;
        d->stopped = 1;
        d->stop_index = which;
        return rc;
    }
    /* Keep the longest suffix that is a proper prefix of some stop string. */
    size_t keep = 0;
    if (!final) {
        for (size_t i = 0; i < d->n_stops; i++) {
            size_t max = d->stop_len[i] - 1 < d->nhold ? d->stop_len[i] - 1 : d->nhold;
            for (size_t k = max; k > keep; k--) {
                if (memcmp (d->hold + d->nhold - k, d->stops[i], k) == 0) {
                    keep = k;
                    break;
                }
            }
        }
    }
    if (s_out_put (d, d->hold, d->nhold - keep) < 0) return -1;
    if (keep) memmove (d->hold, d->hold + d->nhold - keep, keep);
    d->nhold = keep;
    return 0;
}

static void s_delta (struct rx_detok *d, struct rx_detok_delta *out)
{
    if (!out) return;
    out->text = d->out ? d->out : "";
    out->len = d->nout;
    out->stopped = d->stopped;
    out->stop_index = d->stop_index;
}

/* Validate pend + bytes: complete characters go to the held text, invalid
 * bytes become U+FFFD, an unfinished tail waits in pend. */
static int s_feed (struct rx_detok *d, const char *bytes, size_t n, int final)
{
    size_t total = d->npend + n;
    char stackbuf[256];
    char *buf = total <= sizeof stackbuf ? stackbuf : malloc (total);
    if (!buf) return -1;
    memcpy (buf, d->pend, d->npend);
    if (n) memcpy (buf + d->npend, bytes, n);
    size_t tail = final ? 0 : rx_utf8_incomplete_tail (buf, total);
    size_t body = total - tail;
    int rc = 0;
    for (size_t i = 0; i < body && rc == 0;) {
        uint32_t cp;
        size_t k = rx_utf8_decode (buf + i, body - i, &cp);
        if (cp == RX_UNICODE_REPLACEMENT && k == 1 && (unsigned char) buf[i] >= 0x80) {
            /* One U+FFFD per broken sequence (its maximal subpart). */
            k = rx_utf8_bad_len (buf + i, body - i);
            rc = s_hold_put (d, "\xEF\xBF\xBD", 3);
        } else {
            rc = s_hold_put (d, buf + i, k);
        }
        i += k;
    }
    memcpy (d->pend, buf + body, tail);
    d->npend = tail;
    if (buf != stackbuf) free (buf);
    return rc;
}

int rx_detok_push_bytes (struct rx_detok *d, const char *bytes, size_t n,
                         struct rx_detok_delta *out, struct rx_err *err)
{
    d->nout = 0;
    if (d->out) d->out[0] = '\0';
    if (d->stopped) {
        s_delta (d, out);
        return RX_OK;
    }
    if (n > 0 && !d->started) {
        /* Only the first byte of the whole text is the SPM prefix space: mark
         * the start before stripping, so a first piece that was just " " (a
         * byte-fallback <0x20>) does not strip the next piece's space too. */
        d->started = 1;
        if ((d->flags & RX_DETOK_STRIP_SPACE) && bytes[0] == ' ' && d->tok &&
            rx_tokenizer_model (d->tok) == RX_TOK_MODEL_SPM) {
            bytes++;
            n--;
        }
    }
    if (s_feed (d, bytes, n, 0) < 0 || s_release (d, 0) < 0)
        return rx_err_set (err, RX_ENOMEM, "detokenizer: out of memory");
    s_delta (d, out);
    return RX_OK;
}

int rx_detok_push (struct rx_detok *d, int32_t id, struct rx_detok_delta *out, struct rx_err *err)
{
    const char *s;
    size_t n;
    if (rx_tokenizer_piece (d->tok, id, d->flags, &s, &n) != RX_OK)
        return rx_err_set (err, RX_EINVAL, "detokenizer: token id %d is out of range (vocab size %zu)",
                           id, rx_tokenizer_n_vocab (d->tok));
    return rx_detok_push_bytes (d, s, n, out, err);
}

int rx_detok_finish (struct rx_detok *d, struct rx_detok_delta *out, struct rx_err *err)
{
    d->nout = 0;
    if (d->out) d->out[0] = '\0';
    if (!d->stopped) {
        if (s_feed (d, NULL, 0, 1) < 0 || s_release (d, 1) < 0)
            return rx_err_set (err, RX_ENOMEM, "detokenizer: out of memory");
    }
    d->npend = 0;
    s_delta (d, out);
    return RX_OK;
}
