/* router/routekey.c -- see routekey.h. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "routekey.h"

void rx_routekey_buf_fini (struct rx_routekey_buf *b)
{
    free (b->p);
    b->p = NULL;
    b->cap = 0;
}

static int s_reserve (struct rx_routekey_buf *b, size_t need)
{
    if (need <= b->cap) return RX_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > ((size_t) -1) / 2) return RX_ENOMEM;
        cap *= 2;
    }
    char *p = realloc (b->p, cap);
    if (!p) return RX_ENOMEM;
    b->p = p;
    b->cap = cap;
    return RX_OK;
}

/* Append s[0..n) (and a "\n" before it when sep) at *off. */
static int s_append (struct rx_routekey_buf *b, size_t *off, const char *s, size_t n, int sep)
{
    size_t need = *off + n + (sep ? 1 : 0) + 1;
    if (need < n || s_reserve (b, need) != RX_OK) return RX_ENOMEM;
    if (sep) b->p[(*off)++] = '\n';
    memcpy (b->p + *off, s, n);
    *off += n;
    b->p[*off] = '\0';
    return RX_OK;
}

/* A string, or the first element of an array when that is a string. */
static const json_t *s_text_of (const json_t *v)
{
    if (json_is_array (v) && json_array_size (v) > 0) v = json_array_get (v, 0);
    return json_is_string (v) ? v : NULL;
}

static int s_chat_key (const json_t *msgs, struct rx_routekey_buf *b, size_t *off)
{
    size_t i, j;
    const json_t *m, *part;
    int first = 1;
    if (!json_is_array (msgs)) return RX_OK;
    json_array_foreach (msgs, i, m) {
        const json_t *c = json_object_get (m, "content");
        if (json_is_string (c)) {
            if (s_append (b, off, json_string_value (c), json_string_length (c), !first) != RX_OK)
                return RX_ENOMEM;
            first = 0;
        } else if (json_is_array (c)) {
            json_array_foreach (c, j, part) {
                const json_t *t = json_object_get (part, "text");
                if (!json_is_string (t)) continue;
                if (s_append (b, off, json_string_value (t), json_string_length (t), !first) != RX_OK)
                    return RX_ENOMEM;
                first = 0;
            }
        }
    }
    return RX_OK;
}

int rx_routekey_extract (int kind, const char *body, size_t len, struct rx_routekey_buf *b,
                         const char **key, size_t *klen, struct rx_api_error *e)
{
    *key = "";
    *klen = 0;
    if (kind == RX_ROUTEKEY_NONE) return RX_OK;
    json_error_t jerr;
    json_t *root = json_loadb (body ? body : "", len, JSON_ALLOW_NUL | JSON_DECODE_ANY, &jerr);
    if (!root) {
        if (len == 0)
            return rx_api_error_set (e, 400, "invalid_json", NULL, "the request body is empty: expected a JSON object");
        return rx_api_error_set (e, 400, "invalid_json", NULL, "the request body is not valid JSON: %s (at byte %d)",
                                 jerr.text, jerr.position);
    }
    if (!json_is_object (root)) {
        json_decref (root);
        return rx_api_error_set (e, 400, "invalid_type", NULL, "the request body must be a JSON object");
    }
    size_t off = 0;
    int rc = RX_OK;
    if (s_reserve (b, 1) != RX_OK) {
        json_decref (root);
        return RX_ENOMEM;
    }
    b->p[0] = '\0';
    const json_t *t = NULL;
    switch (kind) {
    case RX_ROUTEKEY_GENERATE: t = s_text_of (json_object_get (root, "text")); break;
    case RX_ROUTEKEY_COMPLETIONS: t = s_text_of (json_object_get (root, "prompt")); break;
    case RX_ROUTEKEY_CHAT: rc = s_chat_key (json_object_get (root, "messages"), b, &off); break;
    default: break;
    }
    if (t) rc = s_append (b, &off, json_string_value (t), json_string_length (t), 0);
    json_decref (root);
    if (rc != RX_OK) return rc;
    *key = b->p;
    *klen = off;
    return RX_OK;
}
