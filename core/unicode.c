/* core/unicode.c -- UTF-8 helpers, GPT-2 byte mapping, PCRE2 pre-tokenizer. */
#include "config.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "unicode.h"

/* ---- UTF-8 ------------------------------------------------------------- */

size_t rx_utf8_len (unsigned char lead)
{
    static const unsigned char lookup[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return lookup[lead >> 4];
}

size_t rx_utf8_decode (const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *) s;
    unsigned char c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t need;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) { need = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { need = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { need = 4; v = c & 0x07; min = 0x10000; }
    else goto bad;
    if (n < need) goto bad;
    for (size_t i = 1; i < need; i++) {
        if ((u[i] & 0xC0) != 0x80) goto bad;
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) goto bad;
    *cp = v;
    return need;
bad:
    *cp = RX_UNICODE_REPLACEMENT;
    return 1;
}

size_t rx_utf8_encode (uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char) cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char) (0xC0 | (cp >> 6));
        out[1] = (char) (0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
        out[0] = (char) (0xE0 | (cp >> 12));
        out[1] = (char) (0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char) (0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char) (0xF0 | (cp >> 18));
        out[1] = (char) (0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char) (0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char) (0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

int rx_utf8_valid (const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = rx_utf8_decode (s + i, n - i, &cp);
        if (cp == RX_UNICODE_REPLACEMENT && k == 1 && (unsigned char) s[i] >= 0x80)
            return 0;
        i += k;
    }
    return 1;
}

/* Is u[0..k) a valid but unfinished prefix of a sequence of length need? */
static int s_valid_prefix (const unsigned char *u, size_t k, size_t need)
{
    if (k >= need) return 0;
    for (size_t i = 1; i < k; i++)
        if ((u[i] & 0xC0) != 0x80) return 0;
    if (k >= 2) {
        /* Second byte ranges that rule out overlongs, surrogates, > U+10FFFF. */
        unsigned char c = u[0], d = u[1];
        if (c == 0xE0 && d < 0xA0) return 0;
        if (c == 0xED && d > 0x9F) return 0;
        if (c == 0xF0 && d < 0x90) return 0;
        if (c == 0xF4 && d > 0x8F) return 0;
    }
    return 1;
}

size_t rx_utf8_bad_len (const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *) s;
    unsigned char c = u[0];
    size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!need) return 1;
    size_t k = 1;
    while (k < need && k < n && s_valid_prefix (u, k + 1, need + 1)) k++;
    return k;
}

size_t rx_utf8_incomplete_tail (const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *) s;
    /* The lead byte of an unfinished sequence is at most 3 bytes back. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = u[n - back];
        if ((c & 0xC0) == 0x80) continue;      /* continuation: look further back */
        size_t need = 0;
        if (c >= 0xC2 && c <= 0xDF) need = 2;
        else if (c >= 0xE0 && c <= 0xEF) need = 3;
        else if (c >= 0xF0 && c <= 0xF4) need = 4;
        if (need && s_valid_prefix (u + n - back, back, need)) return back;
        return 0;
    }
    return 0;
}

char *rx_utf8_sanitize (const char *s, size_t n, size_t *out_len)
{
    /* Worst case every byte becomes 3. */
    char *out = malloc (n * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = rx_utf8_decode (s + i, n - i, &cp);
        if (cp == RX_UNICODE_REPLACEMENT && k == 1 && (unsigned char) s[i] >= 0x80) {
            memcpy (out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        } else {
            memcpy (out + o, s + i, k);
            o += k;
        }
        i += k;
    }
    out[o] = '\0';
    if (out_len) *out_len = o;
    return out;
}

/* ---- GPT-2 byte mapping ----------------------------------------------- */

/* Printable Latin-1 bytes map to themselves; the other 68 bytes map, in byte
 * order, to U+0100, U+0101, ... */
static int s_byte_is_printable (unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t rx_byte_to_unicode (uint8_t b)
{
    if (s_byte_is_printable (b)) return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!s_byte_is_printable (c)) n++;
    return 256 + n;
}

int rx_unicode_to_byte (uint32_t cp)
{
    if (cp < 256) return s_byte_is_printable (cp) ? (int) cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned n = cp - 256;
    for (unsigned c = 0; c < 256; c++)
        if (!s_byte_is_printable (c) && n-- == 0) return (int) c;
    return -1;
}

/* ---- pre-tokenizer ---------------------------------------------------- */

struct rx_pretok {
    size_t n;
    pcre2_code **re;
};

/* Widen \s / \S to Unicode White_Space: PCRE2's UCP \s lacks U+0085 (NEL),
 * which the reference (Rust regex, and llama.cpp's own tables) include.
 * Outside a class: \s -> [\s\x{85}], \S -> [^\s\x{85}]; inside a class:
 * \s -> \s\x{85}.  \S inside a class cannot be widened that way and is kept
 * (no supported pre-tokenizer uses it). */
static char *s_widen_space (const char *pat)
{
    size_t n = strlen (pat);
    char *out = malloc (n * 6 + 1);
    if (!out) return NULL;
    size_t o = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char d = pat[i + 1];
            if (d == 's') {
                const char *r = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
                memcpy (out + o, r, strlen (r));
                o += strlen (r);
                i++;
                continue;
            }
            if (d == 'S' && !in_class) {
                memcpy (out + o, "[^\\s\\x{85}]", 11);
                o += 11;
                i++;
                continue;
            }
            out[o++] = c;
            out[o++] = d;
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = c;
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < n && pat[i + 1] == '^') out[o++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']') out[o++] = pat[++i];
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

rx_pretok_t *rx_pretok_new (const char *const *patterns, size_t n, struct rx_err *err)
{
    rx_pretok_t *p = calloc (1, sizeof *p);
    if (!p || !(p->re = calloc (n ? n : 1, sizeof *p->re))) {
        free (p);
        rx_err_set (err, RX_ENOMEM, "pre-tokenizer: out of memory");
        return NULL;
    }
    p->n = n;
    for (size_t i = 0; i < n; i++) {
        char *pat = s_widen_space (patterns[i]);
        if (!pat) {
            rx_pretok_free (&p);
            rx_err_set (err, RX_ENOMEM, "pre-tokenizer: out of memory");
            return NULL;
        }
        int ec;
        PCRE2_SIZE eo;
        p->re[i] = pcre2_compile ((PCRE2_SPTR) pat, PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        free (pat);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message (ec, msg, sizeof msg);
            rx_err_set (err, RX_EINVAL, "pre-tokenizer regex %zu (\"%.60s\"): %s at offset %zu",
                        i, patterns[i], (const char *) msg, (size_t) eo);
            rx_pretok_free (&p);
            return NULL;
        }
        /* JIT when available; the interpreter is the fallback either way. */
        (void) pcre2_jit_compile (p->re[i], PCRE2_JIT_COMPLETE);
    }
    return p;
}

void rx_pretok_free (rx_pretok_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_pretok_t *p = *self_p;
    for (size_t i = 0; i < p->n; i++)
        if (p->re[i]) pcre2_code_free (p->re[i]);
    free (p->re);
    free (p);
    *self_p = NULL;
}

struct s_spans {
    struct rx_span *v;
    size_t n, cap;
};

static int s_push (struct s_spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct rx_span *v = realloc (s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return 0;
}

/* Split one piece [off, off+len) of text with re, appending to out. */
static int s_split_piece (const pcre2_code *re, pcre2_match_data *md, const char *text,
                          size_t off, size_t len, struct s_spans *out, struct rx_err *err)
{
    const PCRE2_SPTR subj = (PCRE2_SPTR) (text + off);
    size_t pos = 0, prev_end = 0;
    while (pos < len) {
        int rc = pcre2_match (re, subj, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match (re, subj, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message (rc, msg, sizeof msg);
            return rx_err_set (err, RX_EINTERNAL, "pre-tokenizer: regex match failed: %s",
                               (const char *) msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer (md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            /* Empty match: no piece; step one code point and retry. */
            pos = ms + 1;
            while (pos < len && ((unsigned char) text[off + pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > prev_end && s_push (out, off + prev_end, ms - prev_end) < 0) goto oom;
        if (s_push (out, off + ms, me - ms) < 0) goto oom;
        prev_end = pos = me;
    }
    if (prev_end < len && s_push (out, off + prev_end, len - prev_end) < 0) goto oom;
    return RX_OK;
oom:
    return rx_err_set (err, RX_ENOMEM, "pre-tokenizer: out of memory");
}

int rx_pretok_split (const rx_pretok_t *p, const char *text, size_t len,
                     struct rx_span **spans, size_t *n, struct rx_err *err)
{
    struct s_spans cur = { 0 }, next = { 0 };
    *spans = NULL;
    *n = 0;
    if (len == 0) return RX_OK;
    if (s_push (&cur, 0, len) < 0)
        return rx_err_set (err, RX_ENOMEM, "pre-tokenizer: out of memory");
    int rc = RX_OK;
    for (size_t r = 0; r < p->n; r++) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern (p->re[r], NULL);
        if (!md) {
            rc = rx_err_set (err, RX_ENOMEM, "pre-tokenizer: out of memory");
            break;
        }
        next.n = 0;
        for (size_t i = 0; i < cur.n && rc == RX_OK; i++)
            rc = s_split_piece (p->re[r], md, text, cur.v[i].off, cur.v[i].len, &next, err);
        pcre2_match_data_free (md);
        if (rc != RX_OK) break;
        struct s_spans t = cur;
        cur = next;
        next = t;
    }
    free (next.v);
    if (rc != RX_OK) {
        free (cur.v);
        return rc;
    }
    *spans = cur.v;
    *n = cur.n;
    return RX_OK;
}
