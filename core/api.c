/* core/api.c -- request bodies to rx_request, answers to JSON / SSE text.
 * The rules (unknown fields, types, lengths, errors) are stated in api.h;
 * this file follows them field by field.  jansson does the JSON: it refuses
 * invalid UTF-8 and \u0000 while loading, bounds nesting depth, and writes
 * the answers. */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api.h"

/* ---- errors ----------------------------------------------------------- */

int rx_api_error_vset (struct rx_api_error *e, int status, const char *code, const char *param,
                       const char *fmt, va_list ap)
{
    int rc = status >= 500 ? RX_EINTERNAL : RX_EINVAL;
    if (!e) return rc;
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf (e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf (e->message, sizeof e->message, fmt, ap);
    return rc;
}

int rx_api_error_set (struct rx_api_error *e, int status, const char *code, const char *param,
                      const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    int rc = rx_api_error_vset (e, status, code, param, fmt, ap);
    va_end (ap);
    return rc;
}

static int s_oom (struct rx_api_error *e)
{
    rx_api_error_set (e, 500, "internal_error", NULL, "out of memory while handling the request");
    return RX_ENOMEM;
}

/* Build a string the way json_string would, but never fail on bytes that
 * are not UTF-8: each bad byte becomes U+FFFD.  NULL only on OOM. */
static size_t s_utf8_seq (const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned min, cp;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

static json_t *s_jstr (const char *text, size_t len)
{
    if (!text) text = "", len = 0;
    const unsigned char *s = (const unsigned char *) text;
    size_t bad = 0;
    for (size_t i = 0; i < len;) {
        size_t k = s_utf8_seq (s + i, len - i);
        if (!k) { bad++; k = 1; }
        i += k;
    }
    if (!bad) return json_stringn (text, len);
    char *buf = malloc (len + 2 * bad + 1);   /* 1 byte -> 3 bytes */
    if (!buf) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = s_utf8_seq (s + i, len - i);
        if (!k) {
            memcpy (buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy (buf + o, s + i, k);
            o += k;
            i += k;
        }
    }
    json_t *j = json_stringn (buf, o);
    free (buf);
    return j;
}

int rx_api_error_json (const struct rx_api_error *e, char **json)
{
    *json = NULL;
    json_t *inner = json_object ();
    json_t *root = json_object ();
    if (!inner || !root) goto oom;
    if (json_object_set_new (inner, "message", s_jstr (e->message, strlen (e->message))) ||
        json_object_set_new (inner, "type", json_string (e->type ? e->type : "invalid_request_error")) ||
        json_object_set_new (inner, "param", e->param[0] ? s_jstr (e->param, strlen (e->param))
                                                         : json_null ()) ||
        json_object_set_new (inner, "code", e->code ? json_string (e->code) : json_null ()))
        goto oom;
    if (json_object_set (root, "error", inner)) goto oom;
    *json = json_dumps (root, JSON_COMPACT);
    json_decref (inner);
    json_decref (root);
    return *json ? RX_OK : RX_ENOMEM;
oom:
    json_decref (inner);
    json_decref (root);
    return RX_ENOMEM;
}

/* ---- field access ----------------------------------------------------- */

static const char *s_kind_name (const json_t *v)
{
    switch (json_typeof (v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a number";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    default:           return "null";
    }
}

static void s_param (char *buf, size_t size, const char *prefix, const char *key)
{
    snprintf (buf, size, "%s%s", prefix ? prefix : "", key);
}

static int s_bad_type (struct rx_api_error *e, const char *prefix, const char *key, const char *want,
                       const json_t *v)
{
    char p[RX_API_PARAM_MAX];
    s_param (p, sizeof p, prefix, key);
    return rx_api_error_set (e, 400, "invalid_type", p,
                             "Invalid type for '%s': expected %s, but got %s instead.", p, want,
                             s_kind_name (v));
}

/* The getters: 1 = absent (missing or null), 0 = *out set, < 0 = error. */
static int s_get_bool (json_t *o, const char *prefix, const char *key, int *out,
                       struct rx_api_error *e)
{
    json_t *v = json_object_get (o, key);
    if (!v || json_is_null (v)) return 1;
    if (!json_is_boolean (v)) return s_bad_type (e, prefix, key, "a boolean", v);
    *out = json_is_true (v);
    return 0;
}

static int s_get_num (json_t *o, const char *prefix, const char *key, double *out,
                      struct rx_api_error *e)
{
    json_t *v = json_object_get (o, key);
    if (!v || json_is_null (v)) return 1;
    if (!json_is_number (v)) return s_bad_type (e, prefix, key, "a number", v);
    *out = json_number_value (v);
    return 0;
}

/* An integer value (JSON integer, or a real with no fraction) in [lo, hi]. */
static int s_int_of (const json_t *v, int64_t lo, int64_t hi, int64_t *out)
{
    double d;
    if (json_is_integer (v)) {
        json_int_t i = json_integer_value (v);
        if (i < lo || i > hi) return -2;
        *out = i;
        return 0;
    }
    if (!json_is_real (v)) return -1;
    d = json_real_value (v);
    if (d != floor (d)) return -1;
    if (!(d >= -9.2e18 && d <= 9.2e18)) return -2;   /* keeps the cast defined */
    int64_t i = (int64_t) d;
    if (i < lo || i > hi) return -2;
    *out = i;
    return 0;
}

static int s_get_int (json_t *o, const char *prefix, const char *key, int64_t lo, int64_t hi,
                      int64_t *out, struct rx_api_error *e)
{
    json_t *v = json_object_get (o, key);
    if (!v || json_is_null (v)) return 1;
    int r = s_int_of (v, lo, hi, out);
    if (r == -1) return s_bad_type (e, prefix, key, "an integer", v);
    if (r == -2) {
        char p[RX_API_PARAM_MAX];
        s_param (p, sizeof p, prefix, key);
        return rx_api_error_set (e, 400, "invalid_value", p,
                                 "Invalid '%s': integer out of range (expected %" PRId64
                                 " to %" PRId64 ").", p, lo, hi);
    }
    return 0;
}

static int s_get_i32 (json_t *o, const char *prefix, const char *key, int32_t *out,
                      struct rx_api_error *e)
{
    int64_t v;
    int r = s_get_int (o, prefix, key, INT32_MIN, INT32_MAX, &v, e);
    if (r == 0) *out = (int32_t) v;
    return r;
}

static int s_get_f32 (json_t *o, const char *prefix, const char *key, float *out,
                      struct rx_api_error *e)
{
    double d = 0;
    int r = s_get_num (o, prefix, key, &d, e);
    if (r == 0) *out = (float) d;
    return r;
}

static int s_get_u8 (json_t *o, const char *prefix, const char *key, uint8_t *out,
                     struct rx_api_error *e)
{
    int b;
    int r = s_get_bool (o, prefix, key, &b, e);
    if (r == 0) *out = (uint8_t) b;
    return r;
}

static int s_get_str (json_t *o, const char *prefix, const char *key, json_t **out,
                      struct rx_api_error *e)
{
    json_t *v = json_object_get (o, key);
    if (!v || json_is_null (v)) return 1;
    if (!json_is_string (v)) return s_bad_type (e, prefix, key, "a string", v);
    *out = v;
    return 0;
}

static int s_unsupported (struct rx_api_error *e, const char *prefix, const char *key,
                          const char *why)
{
    char p[RX_API_PARAM_MAX];
    s_param (p, sizeof p, prefix, key);
    return rx_api_error_set (e, 400, "unsupported_parameter", p,
                             "Unsupported parameter: '%s' %s.", p, why);
}

/* ---- loading ---------------------------------------------------------- */

static int s_load (const char *body, size_t len, json_t **root, struct rx_api_error *e)
{
    json_error_t je;
    *root = json_loadb (body ? body : "", body ? len : 0, 0, &je);
    if (!*root) {
#if JANSSON_VERSION_HEX >= 0x020b00
        int code = json_error_code (&je);
        int utf8 = code == json_error_invalid_utf8, nul = code == json_error_null_character;
#else
        int utf8 = strstr (je.text, "decode byte") != NULL, nul = strstr (je.text, "\\u0000") != NULL;
#endif
        if (utf8)
            return rx_api_error_set (e, 400, "invalid_utf8", NULL,
                                     "The request body is not valid UTF-8 (byte offset %d): "
                                     "JSON text must be UTF-8.", je.position);
        if (nul)
            return rx_api_error_set (e, 400, "invalid_value", NULL,
                                     "The request body holds a \\u0000 (NUL) character in a "
                                     "string (byte offset %d); NUL is not allowed.", je.position);
        return rx_api_error_set (e, 400, "invalid_json", NULL,
                                 "We could not parse the JSON body of your request: %s "
                                 "(line %d, column %d).", je.text, je.line, je.column);
    }
    if (!json_is_object (*root)) {
        const char *k = s_kind_name (*root);
        json_decref (*root);
        *root = NULL;
        return rx_api_error_set (e, 400, "invalid_type", NULL,
                                 "The request body must be a JSON object, but got %s.", k);
    }
    return RX_OK;
}

static int s_check_ctx (const struct rx_api_ctx *ctx, struct rx_api_error *e)
{
    if (!ctx || !ctx->tok || !ctx->models || ctx->n_models < 1 || ctx->ctx_len < 2)
        return rx_api_error_set (e, 500, "internal_error", NULL,
                                 "api: server misconfigured (no tokenizer, model name or context length)");
    return RX_OK;
}

static int32_t s_vocab (const struct rx_api_ctx *ctx)
{
    if (ctx->n_vocab > 0) return ctx->n_vocab;
    size_t n = rx_tokenizer_n_vocab (ctx->tok);
    return n > INT32_MAX ? INT32_MAX : (int32_t) n;
}

/* model: optional; must be a served name (404 otherwise).  *name is a copy. */
static int s_model (json_t *root, const struct rx_api_ctx *ctx, char **name, struct rx_api_error *e)
{
    json_t *v = NULL;
    int r = s_get_str (root, NULL, "model", &v, e);
    if (r < 0) return r;
    const char *m = ctx->models[0];
    if (r == 0) {
        m = NULL;
        for (size_t i = 0; i < ctx->n_models && !m; i++)
            if (ctx->models[i] && strcmp (ctx->models[i], json_string_value (v)) == 0)
                m = ctx->models[i];
        if (!m || json_string_length (v) != strlen (m))
            return rx_api_error_set (e, 404, "model_not_found", "model",
                                     "The model `%.200s` does not exist. This server serves `%.200s`.",
                                     json_string_value (v), ctx->models[0]);
    }
    *name = strdup (m);
    return *name ? RX_OK : s_oom (e);
}

/* ---- token ids -------------------------------------------------------- */

/* arr: a JSON array of token ids in [0, vocab).  *ids new. */
static int s_ids (json_t *arr, const char *param, int32_t vocab, int32_t **ids, size_t *n,
                  struct rx_api_error *e)
{
    size_t k = json_array_size (arr);
    *ids = NULL;
    *n = 0;
    if (k == 0) return RX_OK;
    int32_t *v = malloc (k * sizeof *v);
    if (!v) return s_oom (e);
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get (arr, i);
        int64_t id;
        int r = s_int_of (x, INT64_MIN, INT64_MAX, &id);
        if (r == -1) {
            free (v);
            return rx_api_error_set (e, 400, "invalid_type", param,
                                     "Invalid type for '%s[%zu]': expected a token id (integer), "
                                     "but got %s instead.", param, i, s_kind_name (x));
        }
        if (r < 0 || id < 0 || id >= vocab) {
            free (v);
            if (r < 0)
                return rx_api_error_set (e, 400, "invalid_value", param,
                                         "Invalid '%s[%zu]': token id out of range [0, %d).",
                                         param, i, vocab);
            return rx_api_error_set (e, 400, "invalid_value", param,
                                     "Invalid '%s[%zu]': token id %" PRId64
                                     " is out of the vocabulary [0, %d).", param, i, id, vocab);
        }
        v[i] = (int32_t) id;
    }
    *ids = v;
    *n = k;
    return RX_OK;
}

static int s_encode (const struct rx_api_ctx *ctx, const char *text, size_t len, unsigned flags,
                     int32_t **ids, size_t *n, struct rx_api_error *e)
{
    struct rx_err re = { 0 };
    if (rx_tokenizer_encode (ctx->tok, text, len, flags, ids, n, &re) != RX_OK) {
        if (re.code == RX_ENOMEM) return s_oom (e);
        return rx_api_error_set (e, 500, "internal_error", NULL, "tokenizer: %s", re.msg);
    }
    return RX_OK;
}

/* ---- chat messages ---------------------------------------------------- */

struct s_msgs {
    struct rx_chat_msg *m;
    char **owned;
    size_t n, n_owned;
};

static void s_msgs_fini (struct s_msgs *ms)
{
    for (size_t i = 0; i < ms->n_owned; i++) free (ms->owned[i]);
    free (ms->owned);
    free (ms->m);
    memset (ms, 0, sizeof *ms);
}

static int s_msg_content (json_t *c, size_t i, struct s_msgs *ms, const char **out,
                          struct rx_api_error *e)
{
    char p[RX_API_PARAM_MAX];
    snprintf (p, sizeof p, "messages[%zu].content", i);
    if (!c || json_is_null (c)) {
        *out = "";
        return RX_OK;
    }
    if (json_is_string (c)) {
        *out = json_string_value (c);
        return RX_OK;
    }
    if (!json_is_array (c))
        return rx_api_error_set (e, 400, "invalid_type", p,
                                 "Invalid type for '%s': expected a string or an array of content "
                                 "parts, but got %s instead.", p, s_kind_name (c));
    /* Text parts joined with "\n", as vLLM does. */
    size_t total = 0, np = json_array_size (c);
    for (size_t j = 0; j < np; j++) {
        json_t *part = json_array_get (c, j);
        char pp[RX_API_PARAM_MAX + 32];
        snprintf (pp, sizeof pp, "%s[%zu]", p, j);
        if (!json_is_object (part))
            return rx_api_error_set (e, 400, "invalid_type", pp,
                                     "Invalid type for '%s': expected a content part object, but "
                                     "got %s instead.", pp, s_kind_name (part));
        json_t *type = json_object_get (part, "type");
        if (!json_is_string (type))
            return rx_api_error_set (e, 400, "invalid_type", pp,
                                     "Invalid '%s': a content part needs a string 'type'.", pp);
        if (strcmp (json_string_value (type), "text") != 0)
            return rx_api_error_set (e, 400, "unsupported_parameter", pp,
                                     "Unsupported content part type '%.64s' in '%s': this model "
                                     "only takes text.", json_string_value (type), pp);
        json_t *text = json_object_get (part, "text");
        if (!json_is_string (text))
            return rx_api_error_set (e, 400, "invalid_type", pp,
                                     "Invalid '%s': a text part needs a string 'text'.", pp);
        total += json_string_length (text) + 1;
    }
    char *buf = malloc (total + 1);
    if (!buf) return s_oom (e);
    size_t o = 0;
    for (size_t j = 0; j < np; j++) {
        json_t *text = json_object_get (json_array_get (c, j), "text");
        if (j) buf[o++] = '\n';
        memcpy (buf + o, json_string_value (text), json_string_length (text));
        o += json_string_length (text);
    }
    buf[o] = '\0';
    ms->owned[ms->n_owned++] = buf;
    *out = buf;
    return RX_OK;
}

static int s_messages (json_t *root, struct s_msgs *ms, struct rx_api_error *e)
{
    json_t *arr = json_object_get (root, "messages");
    if (!arr || json_is_null (arr))
        return rx_api_error_set (e, 400, "missing_required_parameter", "messages",
                                 "Missing required parameter: 'messages'.");
    if (!json_is_array (arr)) return s_bad_type (e, NULL, "messages", "an array", arr);
    size_t n = json_array_size (arr);
    if (n == 0)
        return rx_api_error_set (e, 400, "invalid_value", "messages",
                                 "Invalid 'messages': empty array. Expected an array with at "
                                 "least one message.");
    ms->m = calloc (n, sizeof *ms->m);
    ms->owned = calloc (n, sizeof *ms->owned);
    if (!ms->m || !ms->owned) return s_oom (e);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get (arr, i);
        char p[RX_API_PARAM_MAX];
        snprintf (p, sizeof p, "messages[%zu]", i);
        if (!json_is_object (msg))
            return rx_api_error_set (e, 400, "invalid_type", p,
                                     "Invalid type for '%s': expected a message object, but got "
                                     "%s instead.", p, s_kind_name (msg));
        json_t *role = json_object_get (msg, "role");
        snprintf (p, sizeof p, "messages[%zu].role", i);
        if (!role || json_is_null (role))
            return rx_api_error_set (e, 400, "missing_required_parameter", p,
                                     "Missing required parameter: '%s'.", p);
        if (!json_is_string (role))
            return rx_api_error_set (e, 400, "invalid_type", p,
                                     "Invalid type for '%s': expected a string, but got %s instead.",
                                     p, s_kind_name (role));
        const char *r = json_string_value (role);
        if (strcmp (r, "developer") == 0) r = "system";   /* OpenAI's newer name */
        if (strcmp (r, "system") && strcmp (r, "user") && strcmp (r, "assistant")) {
            if (strcmp (r, "tool") == 0 || strcmp (r, "function") == 0)
                return rx_api_error_set (e, 400, "unsupported_parameter", p,
                                         "Unsupported role '%s' in '%s': tool calling is not "
                                         "supported.", r, p);
            return rx_api_error_set (e, 400, "invalid_value", p,
                                     "Invalid value for '%s': '%.64s'. Supported values are: "
                                     "'system', 'developer', 'user' and 'assistant'.", p, r);
        }
        ms->m[i].role = strcmp (r, "system") == 0 ? "system"
                      : strcmp (r, "user") == 0 ? "user" : "assistant";
        int rc = s_msg_content (json_object_get (msg, "content"), i, ms, &ms->m[i].content, e);
        if (rc) return rc;
        ms->n++;
    }
    return RX_OK;
}

/* Render the conversation and encode it (no BOS added: the template wrote it). */
static int s_chat_ids (json_t *root, const struct rx_api_ctx *ctx, int32_t **ids, size_t *n,
                       struct rx_api_error *e)
{
    struct s_msgs ms = { 0 };
    char *bos = NULL, *eos = NULL, *text = NULL;
    size_t tlen = 0;
    int rc = s_messages (root, &ms, e);
    if (rc) goto out;
    if (!ctx->chat) {
        rc = rx_api_error_set (e, 400, NULL, "messages",
                               "This model has no chat template, so chat requests cannot be "
                               "served; use /v1/completions, or start radixd with a chat "
                               "template family.");
        goto out;
    }
    size_t bl = 0, el = 0;
    const char *bt = rx_tokenizer_token_text (ctx->tok, rx_tokenizer_bos (ctx->tok), &bl);
    const char *et = rx_tokenizer_token_text (ctx->tok, rx_tokenizer_eos (ctx->tok), &el);
    bos = strndup (bt ? bt : "", bt ? bl : 0);
    eos = strndup (et ? et : "", et ? el : 0);
    if (!bos || !eos) { rc = s_oom (e); goto out; }
    struct rx_err re = { 0 };
    if (rx_chat_render (ctx->chat, ms.m, ms.n, 1, bos, eos, &text, &tlen, &re) != RX_OK) {
        if (re.code == RX_ENOMEM) rc = s_oom (e);
        else rc = rx_api_error_set (e, 400, "invalid_value", "messages",
                                    "Invalid 'messages': %s", re.msg);
        goto out;
    }
    rc = s_encode (ctx, text, tlen, RX_TOK_PARSE_SPECIAL, ids, n, e);
out:
    free (text);
    free (bos);
    free (eos);
    s_msgs_fini (&ms);
    return rc;
}

/* ---- prompts ---------------------------------------------------------- */

static int s_empty_prompt (struct rx_api_error *e, const char *param)
{
    return rx_api_error_set (e, 400, "invalid_value", param,
                             "Invalid '%s': the prompt must not be empty.", param);
}

/* A completion prompt or /generate text/input_ids: string, ids, or a batch
 * of one.  text_ok/ids_ok say which forms this key allows. */
static int s_prompt (json_t *v, const char *param, int text_ok, int ids_ok, int nested,
                     const struct rx_api_ctx *ctx, int32_t **ids, size_t *n, struct rx_api_error *e)
{
    if (json_is_string (v) && text_ok) {
        if (json_string_length (v) == 0) return s_empty_prompt (e, param);
        return s_encode (ctx, json_string_value (v), json_string_length (v),
                         RX_TOK_ADD_SPECIAL | RX_TOK_PARSE_SPECIAL, ids, n, e);
    }
    if (!json_is_array (v))
        return rx_api_error_set (e, 400, "invalid_type", param,
                                 "Invalid type for '%s': expected %s, but got %s instead.", param,
                                 text_ok && ids_ok ? "a string or an array of token ids"
                                 : text_ok ? "a string" : "an array of token ids",
                                 s_kind_name (v));
    size_t k = json_array_size (v);
    if (k == 0) return s_empty_prompt (e, param);
    json_t *first = json_array_get (v, 0);
    if (nested && (json_is_string (first) || json_is_array (first)))
        return rx_api_error_set (e, 400, "invalid_type", param,
                                 "Invalid type for '%s[0][0]': expected a token id, but got %s "
                                 "instead.", param, s_kind_name (first));
    if (json_is_string (first) || json_is_array (first)) {
        /* the batch form: a list of prompts */
        if (k > 1)
            return rx_api_error_set (e, 400, "unsupported_parameter", param,
                                     "Unsupported '%s': batched prompts (a list of %zu prompts) are "
                                     "not supported; send one prompt per request.", param, k);
        if (json_is_string (first) && !text_ok)
            return rx_api_error_set (e, 400, "invalid_type", param,
                                     "Invalid type for '%s[0]': expected an array of token ids, but "
                                     "got a string instead.", param);
        return s_prompt (first, param, text_ok, 1, 1, ctx, ids, n, e);
    }
    if (!ids_ok)
        return rx_api_error_set (e, 400, "invalid_type", param,
                                 "Invalid type for '%s': expected a string, but got an array of "
                                 "%s instead.", param, s_kind_name (first));
    return s_ids (v, param, s_vocab (ctx), ids, n, e);
}

/* ---- sampling fields -------------------------------------------------- */

static int s_stop (json_t *o, const char *prefix, struct rx_sampling_params *sp,
                   struct rx_api_error *e)
{
    char p[RX_API_PARAM_MAX];
    s_param (p, sizeof p, prefix, "stop");
    json_t *v = json_object_get (o, "stop");
    if (!v || json_is_null (v)) return 1;
    if (json_is_string (v)) {
        if (json_string_length (v) == 0) return 1;   /* OpenAI: "" = no stop string */
        if (!(sp->stop[0] = strdup (json_string_value (v)))) return s_oom (e);
        sp->n_stop = 1;
        return 0;
    }
    if (!json_is_array (v)) return s_bad_type (e, prefix, "stop", "a string or an array of strings", v);
    size_t k = json_array_size (v);
    if (k > RX_MAX_STOP)
        return rx_api_error_set (e, 400, "invalid_value", p,
                                 "Invalid '%s': at most %d stop strings (got %zu).", p, RX_MAX_STOP, k);
    for (size_t i = 0; i < k; i++) {
        json_t *s = json_array_get (v, i);
        if (!json_is_string (s))
            return rx_api_error_set (e, 400, "invalid_type", p,
                                     "Invalid type for '%s[%zu]': expected a string, but got %s "
                                     "instead.", p, i, s_kind_name (s));
        if (json_string_length (s) == 0)
            return rx_api_error_set (e, 400, "invalid_value", p,
                                     "Invalid '%s[%zu]': stop strings must not be empty.", p, i);
        if (!(sp->stop[sp->n_stop] = strdup (json_string_value (s)))) return s_oom (e);
        sp->n_stop++;
    }
    return 0;
}

static int s_stop_ids (json_t *o, const char *prefix, int32_t vocab, struct rx_sampling_params *sp,
                       struct rx_api_error *e)
{
    char p[RX_API_PARAM_MAX];
    s_param (p, sizeof p, prefix, "stop_token_ids");
    json_t *v = json_object_get (o, "stop_token_ids");
    if (!v || json_is_null (v)) return 1;
    if (!json_is_array (v)) return s_bad_type (e, prefix, "stop_token_ids", "an array of token ids", v);
    if (json_array_size (v) > RX_MAX_STOP_IDS)
        return rx_api_error_set (e, 400, "invalid_value", p,
                                 "Invalid '%s': at most %d ids (got %zu).", p, RX_MAX_STOP_IDS,
                                 json_array_size (v));
    int32_t *ids;
    size_t n;
    int rc = s_ids (v, p, vocab, &ids, &n, e);
    if (rc) return rc;
    if (n) memcpy (sp->stop_ids, ids, n * sizeof *ids);
    sp->n_stop_ids = (uint32_t) n;
    free (ids);
    return 0;
}

/* Fields shared by the OpenAI endpoints and /generate's sampling_params
 * (same names there).  prefix: "" or "sampling_params.". */
static int s_common_sampling (json_t *o, const char *prefix, int32_t vocab,
                              struct rx_sampling_params *sp, struct rx_api_error *e)
{
    int r;
#define CHK(x) do { if ((r = (x)) < 0) return r; } while (0)
    CHK (s_get_f32 (o, prefix, "temperature", &sp->temperature, e));
    CHK (s_get_f32 (o, prefix, "top_p", &sp->top_p, e));
    CHK (s_get_i32 (o, prefix, "top_k", &sp->top_k, e));
    CHK (s_get_f32 (o, prefix, "min_p", &sp->min_p, e));
    CHK (s_get_f32 (o, prefix, "frequency_penalty", &sp->frequency_penalty, e));
    CHK (s_get_f32 (o, prefix, "presence_penalty", &sp->presence_penalty, e));
    CHK (s_get_f32 (o, prefix, "repetition_penalty", &sp->repetition_penalty, e));
    CHK (s_get_i32 (o, prefix, "n", &sp->n, e));
    CHK (s_get_u8 (o, prefix, "ignore_eos", &sp->ignore_eos, e));
    CHK (s_get_u8 (o, prefix, "skip_special_tokens", &sp->skip_special_tokens, e));
    CHK (s_stop (o, prefix, sp, e));
    CHK (s_stop_ids (o, prefix, vocab, sp, e));
#undef CHK
    return RX_OK;
}

static int s_seed (json_t *o, const char *prefix, const char *key, struct rx_sampling_params *sp,
                   struct rx_api_error *e)
{
    int64_t s;
    int r = s_get_int (o, prefix, key, INT64_MIN, INT64_MAX, &s, e);
    if (r == 0) {
        sp->seed = (uint64_t) s;
        sp->has_seed = 1;
    }
    return r;
}

/* rx_sampling_params_validate names the internal field first; rename it to
 * the one the client wrote for param and message. */
struct s_alias { const char *field, *client; };

static int s_validate (const struct rx_sampling_params *sp, const char *prefix,
                       const struct s_alias *aliases, struct rx_api_error *e)
{
    struct rx_err re = { 0 };
    if (rx_sampling_params_validate (sp, &re) == RX_OK) return RX_OK;
    size_t fl = strspn (re.msg, "abcdefghijklmnopqrstuvwxyz_");
    char field[64];
    snprintf (field, sizeof field, "%.*s", (int) fl, re.msg);
    const char *client = field;
    for (const struct s_alias *a = aliases; a && a->field; a++)
        if (strcmp (a->field, field) == 0) client = a->client;
    /* other field names in the rest ("<= max_tokens") are renamed too */
    char rest[RX_ERR_MSG_MAX + 64];
    size_t o = 0;
    for (const char *s = re.msg + fl; *s && o + 1 < sizeof rest;) {
        size_t wl = strspn (s, "abcdefghijklmnopqrstuvwxyz_");
        const char *w = NULL;
        for (const struct s_alias *a = aliases; wl && a && a->field && !w; a++)
            if (strlen (a->field) == wl && strncmp (a->field, s, wl) == 0) w = a->client;
        if (w) {
            o += (size_t) snprintf (rest + o, sizeof rest - o, "%s", w);
            s += wl;
        } else if (wl) {
            o += (size_t) snprintf (rest + o, sizeof rest - o, "%.*s", (int) wl, s);
            s += wl;
        } else {
            rest[o++] = *s++;
        }
        if (o >= sizeof rest) o = sizeof rest - 1;
    }
    rest[o] = '\0';
    char p[RX_API_PARAM_MAX];
    s_param (p, sizeof p, prefix, client);
    return rx_api_error_set (e, 400, "invalid_value", p, "Invalid '%s': %s%s", p, client, rest);
}

/* ---- lengths ---------------------------------------------------------- */

/* Apply the context rules of api.h to out->input_ids / sp.max_tokens.
 * max_given: the client set max_tokens (its value is in sp.max_tokens). */
static int s_lengths (const struct rx_api_ctx *ctx, struct rx_request *out, int max_given,
                      const char *prompt_word, const char *max_param, struct rx_api_error *e)
{
    int64_t ctxl = ctx->ctx_len;
    int64_t n = out->n_input;
    const int chat = strcmp (prompt_word, "messages") == 0;
    if (n == 0) return s_empty_prompt (e, prompt_word);
    if (n >= ctxl) {
        if (!ctx->truncate)
            return rx_api_error_set (e, 400, "context_length_exceeded", prompt_word,
                                     "This model's maximum context length is %" PRId64 " tokens. "
                                     "However, your %s %" PRId64 " tokens long, which leaves no "
                                     "room for the completion (at most %" PRId64 " prompt tokens). "
                                     "Please reduce the length of the %s.", ctxl,
                                     chat ? "messages are" : "prompt is", n, ctxl - 1,
                                     chat ? "messages" : "prompt");
        /* keep the tail, and BOS in front when the prompt began with it */
        int64_t keep = ctxl - 1;
        int32_t bos = rx_tokenizer_bos (ctx->tok);
        int64_t skip = n - keep;
        if (bos != RX_TOKEN_NONE && out->input_ids[0] == bos) {
            memmove (out->input_ids + 1, out->input_ids + skip + 1,
                     (size_t) (keep - 1) * sizeof *out->input_ids);
        } else {
            memmove (out->input_ids, out->input_ids + skip, (size_t) keep * sizeof *out->input_ids);
        }
        out->n_input = (uint32_t) keep;
        n = keep;
    }
    int64_t room = ctxl - n;
    int64_t mt = out->sp.max_tokens;
    if (max_given) {
        if (ctx->max_tokens_cap > 0 && mt > ctx->max_tokens_cap) mt = ctx->max_tokens_cap;
        if (n + mt > ctxl) {
            if (!ctx->truncate)
                return rx_api_error_set (e, 400, "context_length_exceeded", max_param,
                                         "This model's maximum context length is %" PRId64
                                         " tokens. However, you requested %" PRId64 " tokens (%"
                                         PRId64 " in the %s, %" PRId64 " in the completion). "
                                         "Please reduce the length of the %s or completion.",
                                         ctxl, n + mt, n, chat ? "messages" : "prompt", mt,
                                         chat ? "messages" : "prompt");
            mt = room;
        }
    } else {
        mt = ctx->default_max_tokens > 0 && ctx->default_max_tokens < room
                 ? ctx->default_max_tokens : room;
        if (ctx->max_tokens_cap > 0 && mt > ctx->max_tokens_cap) mt = ctx->max_tokens_cap;
    }
    out->sp.max_tokens = (int32_t) mt;
    if (out->sp.min_tokens > out->sp.max_tokens) out->sp.min_tokens = out->sp.max_tokens;
    return RX_OK;
}

/* ---- OpenAI endpoints ------------------------------------------------- */

/* Known fields we do not implement: refuse when set to anything that would
 * change the answer. */
static int s_refuse_unsupported (json_t *root, const struct rx_sampling_params *sp,
                                 struct rx_api_error *e)
{
    static const char *const s_never[] = {
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "regex",
        "json_schema", "ebnf", "prompt_logprobs", "structural_tag", NULL
    };
    for (const char *const *k = s_never; *k; k++) {
        json_t *v = json_object_get (root, *k);
        if (v && !json_is_null (v)) return s_unsupported (e, NULL, *k, "is not supported by this server");
    }
    json_t *v;
    if ((v = json_object_get (root, "tools")) && !json_is_null (v)) {
        if (!json_is_array (v)) return s_bad_type (e, NULL, "tools", "an array", v);
        if (json_array_size (v)) return s_unsupported (e, NULL, "tools", "(tool calling) is not supported");
    }
    if ((v = json_object_get (root, "functions")) && !json_is_null (v)) {
        if (!json_is_array (v)) return s_bad_type (e, NULL, "functions", "an array", v);
        if (json_array_size (v)) return s_unsupported (e, NULL, "functions", "(function calling) is not supported");
    }
    static const char *const s_choice[] = { "tool_choice", "function_call", NULL };
    for (const char *const *k = s_choice; *k; k++) {
        v = json_object_get (root, *k);
        if (v && !json_is_null (v) && !(json_is_string (v) && strcmp (json_string_value (v), "none") == 0))
            return s_unsupported (e, NULL, *k, "is not supported (only \"none\")");
    }
    if ((v = json_object_get (root, "response_format")) && !json_is_null (v)) {
        if (!json_is_object (v)) return s_bad_type (e, NULL, "response_format", "an object", v);
        json_t *t = json_object_get (v, "type");
        if (!json_is_string (t) || strcmp (json_string_value (t), "text") != 0)
            return s_unsupported (e, NULL, "response_format", "is not supported (only {\"type\": \"text\"})");
    }
    if ((v = json_object_get (root, "logit_bias")) && !json_is_null (v)) {
        if (!json_is_object (v)) return s_bad_type (e, NULL, "logit_bias", "an object", v);
        if (json_object_size (v)) return s_unsupported (e, NULL, "logit_bias", "is not supported");
    }
    if ((v = json_object_get (root, "suffix")) && !json_is_null (v)) {
        if (!json_is_string (v)) return s_bad_type (e, NULL, "suffix", "a string", v);
        if (json_string_length (v)) return s_unsupported (e, NULL, "suffix", "is not supported");
    }
    int64_t bo;
    int r = s_get_int (root, NULL, "best_of", 1, INT32_MAX, &bo, e);
    if (r < 0) return r;
    if (r == 0 && bo != 1 && bo != sp->n)
        return s_unsupported (e, NULL, "best_of", "other than 1 or n is not supported");
    json_t *user = json_object_get (root, "user");
    if (user && !json_is_null (user) && !json_is_string (user))
        return s_bad_type (e, NULL, "user", "a string", user);
    return RX_OK;
}

static int s_parse_openai (int kind, const char *body, size_t len, const struct rx_api_ctx *ctx,
                           struct rx_request *out, struct rx_api_error *e)
{
    json_t *root = NULL;
    memset (out, 0, sizeof *out);
    rx_sampling_params_init (&out->sp);
    out->kind = kind;
    int rc = s_check_ctx (ctx, e);
    if (rc) return rc;
    if ((rc = s_load (body, len, &root, e))) return rc;
    const int chat = kind == RX_REQ_CHAT;
    struct rx_sampling_params *sp = &out->sp;
    int32_t vocab = s_vocab (ctx);
    int r, max_given = 0;
    const char *max_param = "max_tokens";
#define CHK(x) do { if ((r = (x)) < 0) { rc = r; goto fail; } } while (0)
    CHK (s_model (root, ctx, &out->model, e));
    CHK (s_common_sampling (root, NULL, vocab, sp, e));
    CHK (s_refuse_unsupported (root, sp, e));
    CHK (s_seed (root, NULL, "seed", sp, e));
    CHK (s_get_i32 (root, NULL, "min_tokens", &sp->min_tokens, e));
    CHK (s_get_i32 (root, NULL, "max_tokens", &sp->max_tokens, e));
    max_given = r == 0;
    if (chat) {
        int32_t mct;
        CHK (s_get_i32 (root, NULL, "max_completion_tokens", &mct, e));
        if (r == 0) {
            sp->max_tokens = mct;
            max_given = 1;
            max_param = "max_completion_tokens";
        }
    }
    if (max_given && sp->max_tokens < 1) {
        rc = rx_api_error_set (e, 400, "invalid_value", max_param,
                               "Invalid '%s': must be at least 1 (got %d).", max_param,
                               sp->max_tokens);
        goto fail;
    }
    int stream = 0;
    CHK (s_get_bool (root, NULL, "stream", &stream, e));
    out->stream = (uint8_t) stream;
    json_t *so = json_object_get (root, "stream_options");
    if (so && !json_is_null (so)) {
        if (!json_is_object (so)) { rc = s_bad_type (e, NULL, "stream_options", "an object", so); goto fail; }
        if (!stream) {
            rc = rx_api_error_set (e, 400, "invalid_value", "stream_options",
                                   "Invalid 'stream_options': only allowed when 'stream' is true.");
            goto fail;
        }
        CHK (s_get_u8 (so, "stream_options.", "include_usage", &out->include_usage, e));
    }
    struct s_alias alias[4] = { { NULL, NULL } };
    if (chat) {
        int lp = 0;
        CHK (s_get_bool (root, NULL, "logprobs", &lp, e));
        sp->logprobs = (uint8_t) lp;
        CHK (s_get_i32 (root, NULL, "top_logprobs", &sp->top_logprobs, e));
        if (r == 0 && sp->top_logprobs > 0 && !lp) {
            rc = rx_api_error_set (e, 400, "invalid_value", "top_logprobs",
                                   "Invalid 'top_logprobs': 'logprobs' must be set to true when "
                                   "'top_logprobs' is used.");
            goto fail;
        }
        alias[0] = (struct s_alias) { "max_tokens", max_param };
    } else {
        int32_t lp;
        CHK (s_get_i32 (root, NULL, "logprobs", &lp, e));
        if (r == 0) {
            sp->logprobs = 1;
            sp->top_logprobs = lp;
        }
        alias[0] = (struct s_alias) { "top_logprobs", "logprobs" };
        int echo = 0;
        CHK (s_get_bool (root, NULL, "echo", &echo, e));
        out->echo = (uint8_t) echo;
        if (echo && sp->logprobs) {
            rc = s_unsupported (e, NULL, "echo", "together with 'logprobs' (prompt logprobs) is not supported");
            goto fail;
        }
    }
    CHK (s_validate (sp, NULL, alias, e));
    /* the prompt last: it is the expensive part */
    int32_t *ids = NULL;
    size_t n = 0;
    const char *pw = chat ? "messages" : "prompt";
    if (chat) {
        CHK (s_chat_ids (root, ctx, &ids, &n, e));
    } else {
        json_t *pv = json_object_get (root, "prompt");
        if (!pv || json_is_null (pv)) {
            rc = rx_api_error_set (e, 400, "missing_required_parameter", "prompt",
                                   "Missing required parameter: 'prompt'.");
            goto fail;
        }
        CHK (s_prompt (pv, "prompt", 1, 1, 0, ctx, &ids, &n, e));
    }
    out->input_ids = ids;
    if (n > INT32_MAX) n = INT32_MAX;   /* then s_lengths refuses it */
    out->n_input = (uint32_t) n;
    CHK (s_lengths (ctx, out, max_given, pw, max_param, e));
#undef CHK
    json_decref (root);
    return RX_OK;
fail:
    json_decref (root);
    rx_request_free (out);
    out->kind = kind;
    return rc;
}

int rx_api_parse_completion (const char *body, size_t len, const struct rx_api_ctx *ctx,
                             struct rx_request *out, struct rx_api_error *err)
{
    return s_parse_openai (RX_REQ_COMPLETION, body, len, ctx, out, err);
}

int rx_api_parse_chat (const char *body, size_t len, const struct rx_api_ctx *ctx,
                       struct rx_request *out, struct rx_api_error *err)
{
    return s_parse_openai (RX_REQ_CHAT, body, len, ctx, out, err);
}

/* ---- /generate -------------------------------------------------------- */

static int s_generate_sampling (json_t *sp_obj, int32_t vocab, struct rx_request *out,
                                int *max_given, struct rx_api_error *e)
{
    static const char *const s_known[] = {
        "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_token_ids",
        "ignore_eos", "skip_special_tokens", "n", "sampling_seed", "seed", "no_stop_trim",
        "spaces_between_special_tokens", "stream_interval", "logit_bias", "regex", "json_schema",
        "ebnf", "structural_tag", "custom_params", NULL
    };
    static const char *const s_unsup[] = { "regex", "json_schema", "ebnf", "structural_tag",
                                           "custom_params", NULL };
    const char *pre = "sampling_params.";
    const char *key;
    json_t *v;
    json_object_foreach (sp_obj, key, v) {
        int known = 0;
        for (const char *const *k = s_known; *k && !known; k++) known = strcmp (*k, key) == 0;
        if (!known) {
            char p[RX_API_PARAM_MAX];
            s_param (p, sizeof p, pre, key);
            return rx_api_error_set (e, 400, "unknown_parameter", p,
                                     "Unknown parameter: '%s'.", p);
        }
    }
    for (const char *const *k = s_unsup; *k; k++) {
        v = json_object_get (sp_obj, *k);
        if (v && !json_is_null (v)) return s_unsupported (e, pre, *k, "is not supported by this server");
    }
    if ((v = json_object_get (sp_obj, "logit_bias")) && !json_is_null (v)) {
        if (!json_is_object (v)) return s_bad_type (e, pre, "logit_bias", "an object", v);
        if (json_object_size (v)) return s_unsupported (e, pre, "logit_bias", "is not supported");
    }
    struct rx_sampling_params *sp = &out->sp;
    int r;
    int b;
    int32_t i32;
#define CHK(x) do { if ((r = (x)) < 0) return r; } while (0)
    CHK (s_common_sampling (sp_obj, pre, vocab, sp, e));
    CHK (s_get_i32 (sp_obj, pre, "max_new_tokens", &sp->max_tokens, e));
    *max_given = r == 0;
    CHK (s_get_i32 (sp_obj, pre, "min_new_tokens", &sp->min_tokens, e));
    CHK (s_seed (sp_obj, pre, "sampling_seed", sp, e));
    if (r == 1) CHK (s_seed (sp_obj, pre, "seed", sp, e));
    CHK (s_get_bool (sp_obj, pre, "no_stop_trim", &b, e));
    CHK (s_get_bool (sp_obj, pre, "spaces_between_special_tokens", &b, e));
    CHK (s_get_i32 (sp_obj, pre, "stream_interval", &i32, e));
#undef CHK
    return RX_OK;
}

int rx_api_parse_generate (const char *body, size_t len, const struct rx_api_ctx *ctx,
                           struct rx_request *out, struct rx_api_error *e)
{
    json_t *root = NULL;
    memset (out, 0, sizeof *out);
    rx_sampling_params_init (&out->sp);
    out->kind = RX_REQ_GENERATE;
    int rc = s_check_ctx (ctx, e);
    if (rc) return rc;
    if ((rc = s_load (body, len, &root, e))) return rc;
    int32_t vocab = s_vocab (ctx);
    int r, max_given = 0;
    json_t *v;
#define CHK(x) do { if ((r = (x)) < 0) { rc = r; goto fail; } } while (0)
    static const char *const s_unsup[] = { "input_embeds", "image_data", "audio_data",
                                           "video_data", "lora_path", NULL };
    for (const char *const *k = s_unsup; *k; k++) {
        v = json_object_get (root, *k);
        if (v && !json_is_null (v)) { rc = s_unsupported (e, NULL, *k, "is not supported by this server"); goto fail; }
    }
    if (!(out->model = strdup (ctx->models[0]))) { rc = s_oom (e); goto fail; }
    v = json_object_get (root, "rid");
    if (v && !json_is_null (v)) {
        if (json_is_array (v)) {
            rc = s_unsupported (e, NULL, "rid", "as a list (a batch) is not supported; send one request each");
            goto fail;
        }
        if (!json_is_string (v)) { rc = s_bad_type (e, NULL, "rid", "a string", v); goto fail; }
        if (!(out->ext_id = strdup (json_string_value (v)))) { rc = s_oom (e); goto fail; }
    }
    int stream = 0, lp = 0;
    CHK (s_get_bool (root, NULL, "stream", &stream, e));
    out->stream = (uint8_t) stream;
    CHK (s_get_bool (root, NULL, "return_logprob", &lp, e));
    out->sp.logprobs = (uint8_t) lp;
    CHK (s_get_i32 (root, NULL, "top_logprobs_num", &out->sp.top_logprobs, e));
    int32_t i32;
    int b;
    CHK (s_get_i32 (root, NULL, "logprob_start_len", &i32, e));   /* accepted, no prompt logprobs */
    CHK (s_get_bool (root, NULL, "return_text_in_logprobs", &b, e));
    json_t *spo = json_object_get (root, "sampling_params");
    if (spo && !json_is_null (spo)) {
        if (!json_is_object (spo)) { rc = s_bad_type (e, NULL, "sampling_params", "an object", spo); goto fail; }
        CHK (s_generate_sampling (spo, vocab, out, &max_given, e));
    }
    if (max_given && out->sp.max_tokens < 0) {
        rc = rx_api_error_set (e, 400, "invalid_value", "sampling_params.max_new_tokens",
                               "Invalid 'sampling_params.max_new_tokens': must be >= 0 (got %d).",
                               out->sp.max_tokens);
        goto fail;
    }
    static const struct s_alias alias[] = { { "max_tokens", "max_new_tokens" },
                                            { "min_tokens", "min_new_tokens" },
                                            { "top_logprobs", "top_logprobs_num" }, { NULL, NULL } };
    /* top_logprobs_num is top-level; the rest live in sampling_params */
    struct rx_err re = { 0 };
    if (rx_sampling_params_validate (&out->sp, &re) != RX_OK) {
        CHK (s_validate (&out->sp, strncmp (re.msg, "top_logprobs", 12) ? "sampling_params." : NULL,
                         alias, e));
    }
    json_t *text = json_object_get (root, "text");
    json_t *ids = json_object_get (root, "input_ids");
    if (text && json_is_null (text)) text = NULL;
    if (ids && json_is_null (ids)) ids = NULL;
    if (!text == !ids) {
        rc = rx_api_error_set (e, 400, text ? "invalid_value" : "missing_required_parameter",
                               "text", "Exactly one of 'text' or 'input_ids' must be given.");
        goto fail;
    }
    int32_t *pids = NULL;
    size_t n = 0;
    if (text) CHK (s_prompt (text, "text", 1, 0, 0, ctx, &pids, &n, e));
    else CHK (s_prompt (ids, "input_ids", 0, 1, 0, ctx, &pids, &n, e));
    out->input_ids = pids;
    if (n > INT32_MAX) n = INT32_MAX;
    out->n_input = (uint32_t) n;
    CHK (s_lengths (ctx, out, max_given, text ? "text" : "input_ids",
                    "sampling_params.max_new_tokens", e));
#undef CHK
    json_decref (root);
    return RX_OK;
fail:
    json_decref (root);
    rx_request_free (out);
    out->kind = RX_REQ_GENERATE;
    return rc;
}

/* ---- /tokenize, /detokenize, /abort_request --------------------------- */

int rx_api_parse_tokenize (const char *body, size_t len, const struct rx_api_ctx *ctx,
                           int32_t **ids, size_t *n, struct rx_api_error *e)
{
    json_t *root = NULL;
    char *model = NULL;
    *ids = NULL;
    *n = 0;
    int rc = s_check_ctx (ctx, e);
    if (rc) return rc;
    if ((rc = s_load (body, len, &root, e))) return rc;
    if ((rc = s_model (root, ctx, &model, e))) goto out;
    json_t *prompt = json_object_get (root, "prompt");
    json_t *msgs = json_object_get (root, "messages");
    if (prompt && json_is_null (prompt)) prompt = NULL;
    if (msgs && json_is_null (msgs)) msgs = NULL;
    if (!prompt == !msgs) {
        rc = rx_api_error_set (e, 400, prompt ? "invalid_value" : "missing_required_parameter",
                               "prompt", "Exactly one of 'prompt' or 'messages' must be given.");
        goto out;
    }
    int add = prompt ? 1 : 0;
    int r = s_get_bool (root, NULL, "add_special_tokens", &add, e);
    if (r < 0) { rc = r; goto out; }
    if (msgs) {
        if (add) {
            rc = s_unsupported (e, NULL, "add_special_tokens",
                                "with 'messages' is not supported (the chat template writes BOS)");
            goto out;
        }
        rc = s_chat_ids (root, ctx, ids, n, e);
        goto out;
    }
    if (!json_is_string (prompt)) {
        rc = s_bad_type (e, NULL, "prompt", "a string", prompt);
        goto out;
    }
    rc = s_encode (ctx, json_string_value (prompt), json_string_length (prompt),
                   RX_TOK_PARSE_SPECIAL | (add ? RX_TOK_ADD_SPECIAL : 0), ids, n, e);
out:
    free (model);
    json_decref (root);
    return rc;
}

int rx_api_parse_detokenize (const char *body, size_t len, const struct rx_api_ctx *ctx,
                             int32_t **ids, size_t *n, struct rx_api_error *e)
{
    json_t *root = NULL;
    char *model = NULL;
    *ids = NULL;
    *n = 0;
    int rc = s_check_ctx (ctx, e);
    if (rc) return rc;
    if ((rc = s_load (body, len, &root, e))) return rc;
    if ((rc = s_model (root, ctx, &model, e))) goto out;
    json_t *t = json_object_get (root, "tokens");
    if (!t || json_is_null (t)) {
        rc = rx_api_error_set (e, 400, "missing_required_parameter", "tokens",
                               "Missing required parameter: 'tokens'.");
        goto out;
    }
    if (!json_is_array (t)) {
        rc = s_bad_type (e, NULL, "tokens", "an array of token ids", t);
        goto out;
    }
    rc = s_ids (t, "tokens", s_vocab (ctx), ids, n, e);
out:
    free (model);
    json_decref (root);
    return rc;
}

int rx_api_parse_abort (const char *body, size_t len, char **rid, int *all,
                        struct rx_api_error *e)
{
    json_t *root = NULL, *v = NULL;
    *rid = NULL;
    *all = 0;
    int rc = s_load (body, len, &root, e);
    if (rc) return rc;
    int r = s_get_bool (root, NULL, "abort_all", all, e);
    if (r < 0) { rc = r; goto out; }
    r = s_get_str (root, NULL, "rid", &v, e);
    if (r < 0) { rc = r; goto out; }
    if (r == 0 && !*all && !(*rid = strdup (json_string_value (v)))) { rc = s_oom (e); goto out; }
    if (!*all && !*rid)
        rc = rx_api_error_set (e, 400, "missing_required_parameter", "rid",
                               "Missing required parameter: 'rid' (or 'abort_all': true).");
out:
    json_decref (root);
    return rc;
}

/* ---- response builders ------------------------------------------------ */

/* JSON numbers for logprobs: finite, rounded to float precision so the
 * text stays short ("-0.1", not "-0.10000000149011612"). */
static json_t *s_jlogprob (float lp)
{
    if (!isfinite (lp)) return json_real (-9999.0);
    char buf[32];
    snprintf (buf, sizeof buf, "%.7g", (double) lp);
    return json_real (strtod (buf, NULL));
}

static json_t *s_jfinish (int f)
{
    switch (f) {
    case RX_API_FINISH_STOP:   return json_string ("stop");
    case RX_API_FINISH_LENGTH: return json_string ("length");
    case RX_API_FINISH_ABORT:  return json_string ("abort");
    default:                   return json_null ();
    }
}

/* json_object_set_new / json_array_append_new that remember a failure
 * (a NULL value or OOM), so builders check once at the end. */
struct s_b { int bad; };

/* (jansson's *_new functions release v when they fail, also when o is NULL) */
static void s_set (struct s_b *b, json_t *o, const char *k, json_t *v)
{
    if (!v || json_object_set_new (o, k, v)) b->bad = 1;
}

static void s_push (struct s_b *b, json_t *a, json_t *v)
{
    if (!v || json_array_append_new (a, v)) b->bad = 1;
}

static json_t *s_usage (struct s_b *b, const struct rx_api_usage *u)
{
    json_t *o = json_object (), *d = json_object ();
    s_set (b, o, "prompt_tokens", json_integer (u->prompt_tokens));
    s_set (b, o, "completion_tokens", json_integer (u->completion_tokens));
    s_set (b, o, "total_tokens", json_integer ((json_int_t) u->prompt_tokens + u->completion_tokens));
    s_set (b, d, "cached_tokens", json_integer (u->cached_tokens));
    s_set (b, o, "prompt_tokens_details", d);
    if (!o) b->bad = 1;
    return o;
}

static json_t *s_jbytes (struct s_b *b, const char *s, size_t len)
{
    json_t *a = json_array ();
    for (size_t i = 0; i < len; i++) s_push (b, a, json_integer ((unsigned char) s[i]));
    if (!a) b->bad = 1;
    return a;
}

/* Completions: {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static json_t *s_completion_logprobs (struct s_b *b, const struct rx_api_choice *c)
{
    if (!c->logprobs) return json_null ();
    json_t *o = json_object ();
    json_t *toks = json_array (), *lps = json_array (), *tops = json_array (), *offs = json_array ();
    size_t off = c->text_offset;
    for (size_t i = 0; i < c->n_logprobs; i++) {
        const struct rx_api_token_logprob *t = &c->logprobs[i];
        s_push (b, toks, s_jstr (t->text, t->len));
        s_push (b, lps, s_jlogprob (t->logprob));
        json_t *top = json_object ();
        for (uint32_t j = 0; j < t->n_top; j++) {
            json_t *k = s_jstr (t->top[j].text, t->top[j].len);
            if (!k) { b->bad = 1; continue; }
            s_set (b, top, json_string_value (k), s_jlogprob (t->top[j].logprob));
            json_decref (k);
        }
        s_push (b, tops, top);
        s_push (b, offs, json_integer ((json_int_t) off));
        off += t->len;
    }
    s_set (b, o, "tokens", toks);
    s_set (b, o, "token_logprobs", lps);
    s_set (b, o, "top_logprobs", tops);
    s_set (b, o, "text_offset", offs);
    if (!o) b->bad = 1;
    return o;
}

/* Chat: {"content": [{"token","logprob","bytes","top_logprobs":[...]}]}. */
static json_t *s_chat_logprobs (struct s_b *b, const struct rx_api_choice *c)
{
    if (!c->logprobs) return json_null ();
    json_t *o = json_object (), *content = json_array ();
    for (size_t i = 0; i < c->n_logprobs; i++) {
        const struct rx_api_token_logprob *t = &c->logprobs[i];
        json_t *x = json_object (), *top = json_array ();
        s_set (b, x, "token", s_jstr (t->text, t->len));
        s_set (b, x, "logprob", s_jlogprob (t->logprob));
        s_set (b, x, "bytes", s_jbytes (b, t->text, t->len));
        for (uint32_t j = 0; j < t->n_top; j++) {
            json_t *y = json_object ();
            s_set (b, y, "token", s_jstr (t->top[j].text, t->top[j].len));
            s_set (b, y, "logprob", s_jlogprob (t->top[j].logprob));
            s_set (b, y, "bytes", s_jbytes (b, t->top[j].text, t->top[j].len));
            s_push (b, top, y);
        }
        s_set (b, x, "top_logprobs", top);
        s_push (b, content, x);
    }
    s_set (b, o, "content", content);
    if (!o) b->bad = 1;
    return o;
}

static json_t *s_head (struct s_b *b, const struct rx_api_meta *m, const char *object)
{
    json_t *o = json_object ();
    s_set (b, o, "id", s_jstr (m->id, m->id ? strlen (m->id) : 0));
    s_set (b, o, "object", json_string (object));
    s_set (b, o, "created", json_integer (m->created));
    s_set (b, o, "model", s_jstr (m->model, m->model ? strlen (m->model) : 0));
    if (!o) b->bad = 1;
    return o;
}

/* Dump o (consumed) into *out, with "data: " / "\n\n" around it when sse. */
static int s_dump (struct s_b *b, json_t *o, int sse, char **out)
{
    *out = NULL;
    if (b->bad || !o) {
        json_decref (o);
        return RX_ENOMEM;
    }
    char *s = json_dumps (o, JSON_COMPACT | JSON_REAL_PRECISION (15));
    json_decref (o);
    if (!s) return RX_ENOMEM;
    if (!sse) {
        *out = s;
        return RX_OK;
    }
    size_t n = strlen (s);
    char *w = malloc (n + 9);
    if (!w) {
        free (s);
        return RX_ENOMEM;
    }
    memcpy (w, "data: ", 6);
    memcpy (w + 6, s, n);
    memcpy (w + 6 + n, "\n\n", 3);
    free (s);
    *out = w;
    return RX_OK;
}

void rx_api_make_id (char *buf, size_t size, const char *prefix, uint64_t rid)
{
    snprintf (buf, size, "%s-%016" PRIx64, prefix, rid);
}

static int s_response (const struct rx_api_meta *m, const struct rx_api_choice *c, size_t n,
                       const struct rx_api_usage *u, int chat, char **json)
{
    struct s_b b = { 0 };
    json_t *o = s_head (&b, m, chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array ();
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_object ();
        s_set (&b, x, "index", json_integer ((json_int_t) i));
        if (chat) {
            json_t *msg = json_object ();
            s_set (&b, msg, "role", json_string ("assistant"));
            s_set (&b, msg, "content", s_jstr (c[i].text, c[i].len));
            s_set (&b, x, "message", msg);
            s_set (&b, x, "logprobs", s_chat_logprobs (&b, &c[i]));
        } else {
            s_set (&b, x, "text", s_jstr (c[i].text, c[i].len));
            s_set (&b, x, "logprobs", s_completion_logprobs (&b, &c[i]));
        }
        s_set (&b, x, "finish_reason", s_jfinish (c[i].finish));
        s_push (&b, choices, x);
    }
    s_set (&b, o, "choices", choices);
    if (u) s_set (&b, o, "usage", s_usage (&b, u));
    return s_dump (&b, o, 0, json);
}

int rx_api_completion_response (const struct rx_api_meta *m, const struct rx_api_choice *c,
                                size_t n, const struct rx_api_usage *u, char **json)
{
    return s_response (m, c, n, u, 0, json);
}

int rx_api_chat_response (const struct rx_api_meta *m, const struct rx_api_choice *c, size_t n,
                          const struct rx_api_usage *u, char **json)
{
    return s_response (m, c, n, u, 1, json);
}

/* One streamed choice.  kind: 0 completion text, 1 chat role, 2 chat content. */
static int s_chunk (const struct rx_api_meta *m, uint32_t index, const struct rx_api_choice *c,
                    int kind, char **sse)
{
    struct s_b b = { 0 };
    json_t *o = s_head (&b, m, kind ? "chat.completion.chunk" : "text_completion");
    json_t *choices = json_array (), *x = json_object ();
    s_set (&b, x, "index", json_integer (index));
    if (kind == 0) {
        s_set (&b, x, "text", s_jstr (c->text, c->len));
        s_set (&b, x, "logprobs", s_completion_logprobs (&b, c));
        s_set (&b, x, "finish_reason", s_jfinish (c->finish));
    } else {
        json_t *d = json_object ();
        if (kind == 1) {
            s_set (&b, d, "role", json_string ("assistant"));
            s_set (&b, d, "content", json_string (""));
            s_set (&b, x, "logprobs", json_null ());
            s_set (&b, x, "finish_reason", json_null ());
        } else {
            if (c->len) s_set (&b, d, "content", s_jstr (c->text, c->len));
            s_set (&b, x, "logprobs", s_chat_logprobs (&b, c));
            s_set (&b, x, "finish_reason", s_jfinish (c->finish));
        }
        s_set (&b, x, "delta", d);
    }
    s_push (&b, choices, x);
    s_set (&b, o, "choices", choices);
    if (m->include_usage) s_set (&b, o, "usage", json_null ());
    return s_dump (&b, o, 1, sse);
}

int rx_api_completion_chunk (const struct rx_api_meta *m, uint32_t index,
                             const struct rx_api_choice *c, char **sse)
{
    return s_chunk (m, index, c, 0, sse);
}

int rx_api_chat_chunk_role (const struct rx_api_meta *m, uint32_t index, char **sse)
{
    return s_chunk (m, index, NULL, 1, sse);
}

int rx_api_chat_chunk (const struct rx_api_meta *m, uint32_t index, const struct rx_api_choice *c,
                       char **sse)
{
    return s_chunk (m, index, c, 2, sse);
}

int rx_api_usage_chunk (const struct rx_api_meta *m, int chat, const struct rx_api_usage *u,
                        char **sse)
{
    struct s_b b = { 0 };
    json_t *o = s_head (&b, m, chat ? "chat.completion.chunk" : "text_completion");
    s_set (&b, o, "choices", json_array ());
    s_set (&b, o, "usage", s_usage (&b, u));
    return s_dump (&b, o, 1, sse);
}

const char *rx_api_sse_done (void)
{
    return "data: [DONE]\n\n";
}

int rx_api_models_response (const char *const *names, size_t n, int64_t created,
                            const char *owned_by, int32_t max_model_len, char **json)
{
    struct s_b b = { 0 };
    json_t *o = json_object (), *data = json_array ();
    s_set (&b, o, "object", json_string ("list"));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_object ();
        s_set (&b, x, "id", s_jstr (names[i], strlen (names[i])));
        s_set (&b, x, "object", json_string ("model"));
        s_set (&b, x, "created", json_integer (created));
        s_set (&b, x, "owned_by", s_jstr (owned_by ? owned_by : "radix",
                                          strlen (owned_by ? owned_by : "radix")));
        s_set (&b, x, "max_model_len", json_integer (max_model_len));
        s_push (&b, data, x);
    }
    s_set (&b, o, "data", data);
    return s_dump (&b, o, 0, json);
}

/* [logprob, id, text] as SGLang writes its logprob tuples. */
static json_t *s_gen_tuple (struct s_b *b, float lp, int32_t id, const char *text, size_t len)
{
    json_t *a = json_array ();
    s_push (b, a, s_jlogprob (lp));
    s_push (b, a, json_integer (id));
    s_push (b, a, s_jstr (text, len));
    if (!a) b->bad = 1;
    return a;
}

static json_t *s_gen_obj (struct s_b *b, const char *id, const struct rx_api_choice *c,
                          const struct rx_api_usage *u)
{
    json_t *o = json_object (), *mi = json_object ();
    s_set (b, o, "text", s_jstr (c->text, c->len));
    s_set (b, mi, "id", s_jstr (id, id ? strlen (id) : 0));
    json_t *fr;
    switch (c->finish) {
    case RX_API_FINISH_STOP:
        fr = json_object ();
        s_set (b, fr, "type", json_string ("stop"));
        s_set (b, fr, "matched", c->matched_str ? s_jstr (c->matched_str, strlen (c->matched_str))
                                 : c->matched_id >= 0 ? json_integer (c->matched_id) : json_null ());
        break;
    case RX_API_FINISH_LENGTH:
        fr = json_object ();
        s_set (b, fr, "type", json_string ("length"));
        s_set (b, fr, "length", json_integer (u->completion_tokens));
        break;
    case RX_API_FINISH_ABORT:
        fr = json_object ();
        s_set (b, fr, "type", json_string ("abort"));
        break;
    default:
        fr = json_null ();
    }
    s_set (b, mi, "finish_reason", fr);
    s_set (b, mi, "prompt_tokens", json_integer (u->prompt_tokens));
    s_set (b, mi, "completion_tokens", json_integer (u->completion_tokens));
    s_set (b, mi, "cached_tokens", json_integer (u->cached_tokens));
    if (c->logprobs) {
        json_t *tok = json_array (), *top = json_array ();
        for (size_t i = 0; i < c->n_logprobs; i++) {
            const struct rx_api_token_logprob *t = &c->logprobs[i];
            s_push (b, tok, s_gen_tuple (b, t->logprob, t->id, t->text, t->len));
            json_t *tt = json_array ();
            for (uint32_t j = 0; j < t->n_top; j++)
                s_push (b, tt, s_gen_tuple (b, t->top[j].logprob, t->top[j].id, t->top[j].text,
                                            t->top[j].len));
            s_push (b, top, tt);
        }
        s_set (b, mi, "output_token_logprobs", tok);
        s_set (b, mi, "output_top_logprobs", top);
    }
    s_set (b, o, "meta_info", mi);
    if (!o) b->bad = 1;
    return o;
}

int rx_api_generate_response (const char *id, const struct rx_api_choice *c, size_t n,
                              const struct rx_api_usage *us, char **json)
{
    struct s_b b = { 0 };
    if (n == 1) return s_dump (&b, s_gen_obj (&b, id, &c[0], &us[0]), 0, json);
    json_t *a = json_array ();
    for (size_t i = 0; i < n; i++) s_push (&b, a, s_gen_obj (&b, id, &c[i], &us[i]));
    return s_dump (&b, a, 0, json);
}

int rx_api_generate_chunk (const char *id, const struct rx_api_choice *c,
                           const struct rx_api_usage *u, int index, char **sse)
{
    struct s_b b = { 0 };
    json_t *o = s_gen_obj (&b, id, c, u);
    if (o && index >= 0) s_set (&b, o, "index", json_integer (index));
    return s_dump (&b, o, 1, sse);
}

int rx_api_tokenize_response (const int32_t *ids, size_t n, int32_t max_model_len, char **json)
{
    struct s_b b = { 0 };
    json_t *o = json_object (), *a = json_array ();
    for (size_t i = 0; i < n; i++) s_push (&b, a, json_integer (ids[i]));
    s_set (&b, o, "tokens", a);
    s_set (&b, o, "count", json_integer ((json_int_t) n));
    s_set (&b, o, "max_model_len", json_integer (max_model_len));
    return s_dump (&b, o, 0, json);
}

int rx_api_detokenize_response (const char *text, size_t len, char **json)
{
    struct s_b b = { 0 };
    json_t *o = json_object ();
    s_set (&b, o, "prompt", s_jstr (text, len));
    return s_dump (&b, o, 0, json);
}
