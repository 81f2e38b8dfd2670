/* core/chat.c -- chat template families (see chat.h).
 *
 * Detection looks for the markers each family's official template writes
 * (the approach of llama.cpp's llm_chat_detect_template); rendering follows
 * the official Jinja templates as Hugging Face evaluates them
 * (trim_blocks, lstrip_blocks), so the prompt matches what the model was
 * tuned on. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"

static const char *const s_names[] = {
    [RX_CHAT_CHATML] = "chatml",       [RX_CHAT_LLAMA2] = "llama2",
    [RX_CHAT_LLAMA3] = "llama3",       [RX_CHAT_MISTRAL] = "mistral",
    [RX_CHAT_DEEPSEEK2] = "deepseek2", [RX_CHAT_DEEPSEEK3] = "deepseek3",
    [RX_CHAT_ZEPHYR] = "zephyr",
};
#define N_FAMILIES ((int) (sizeof s_names / sizeof s_names[0]))
#define KNOWN "chatml, llama2, llama3, mistral, deepseek2, deepseek3, zephyr"

const char *rx_chat_family_name (enum rx_chat_family f)
{
    return (int) f > 0 && (int) f < N_FAMILIES ? s_names[f] : NULL;
}

void rx_chat_template_fini (struct rx_chat_template *t)
{
    free (t->default_system);
    free (t->eos_override);
    memset (t, 0, sizeof *t);
}

int rx_chat_template_named (struct rx_chat_template *t, const char *name, struct rx_err *err)
{
    memset (t, 0, sizeof *t);
    for (int f = 1; f < N_FAMILIES; f++) {
        if (name && strcmp (name, s_names[f]) == 0) {
            t->family = (enum rx_chat_family) f;
            return RX_OK;
        }
    }
    return rx_err_set (err, RX_EINVAL, "unknown chat template family \"%.40s\" (known: " KNOWN ")",
                       name ? name : "");
}

/* ChatML templates that add a system prompt when the conversation has none
 * write it as one string literal: '<|im_start|>system\n...<|im_end|>\n'.
 * Find such a literal (not a concatenation) and unescape it. */
static char *s_chatml_default_system (const char *tmpl)
{
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr (tmpl, head); p; p = strstr (p + 1, head)) {
        const char *q = p + sizeof head - 1;
        if (*q == '\n') q++;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *end = strstr (q, "<|im_end|>");
        if (!end || end == q) continue;
        char *out = malloc ((size_t) (end - q) + 1);
        if (!out) return NULL;
        size_t o = 0;
        int ok = 1;
        for (const char *c = q; c < end && ok; c++) {
            if (*c == '\\' && c + 1 < end) {
                c++;
                out[o++] = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
            } else if (*c == '\'' || *c == '"' || (*c == '{' && (c[1] == '{' || c[1] == '%'))) {
                ok = 0;   /* the literal ends here: it is built from parts */
            } else {
                out[o++] = *c;
            }
        }
        out[o] = '\0';
        if (ok && o > 0) return out;
        free (out);
    }
    return NULL;
}

int rx_chat_template_detect (struct rx_chat_template *t, const char *tmpl, struct rx_err *err)
{
    memset (t, 0, sizeof *t);
    if (!tmpl || !*tmpl)
        return rx_err_set (err, RX_ENOTSUP, "the model has no chat template (tokenizer.chat_template); "
                           "name a family: " KNOWN);
#define HAS(s) (strstr (tmpl, (s)) != NULL)
    if (HAS ("<|im_start|>") && !HAS ("<|im_sep|>") && !HAS ("<end_of_utterance>")) {
        t->family = RX_CHAT_CHATML;
        t->default_system = s_chatml_default_system (tmpl);
    } else if (HAS ("[INST]") && HAS ("<<SYS>>")) {
        t->family = RX_CHAT_LLAMA2;
    } else if (HAS ("[INST]") && !HAS ("[SYSTEM_PROMPT]") && !HAS ("'[INST]'") && !HAS ("\"[INST]\"")
               && (HAS ("'[/INST]'") || HAS ("\"[/INST]\""))) {
        /* Mistral v0.2/v0.3 ("[INST] " + content + "[/INST]", tools or
         * not).  v0.1 (" [/INST]"), v3-tekken ("[INST]" with no space) and
         * v7 ([SYSTEM_PROMPT]) differ and stay unrecognised. */
        t->family = RX_CHAT_MISTRAL;
    } else if (HAS ("<|start_header_id|>") && HAS ("<|end_header_id|>")) {
        t->family = RX_CHAT_LLAMA3;
    } else if (HAS ("'Assistant: ' + message['content'] + eos_token")) {
        t->family = RX_CHAT_DEEPSEEK2;
    } else if (HAS ("<｜Assistant｜>") && HAS ("<｜User｜>")) {
        t->family = RX_CHAT_DEEPSEEK3;
    } else if (HAS ("<|user|>") && HAS ("<|assistant|>") && !HAS ("<|end|>")
               && (HAS ("eos_token") || HAS ("<|endoftext|>"))) {
        t->family = RX_CHAT_ZEPHYR;
        if (!HAS ("eos_token") && !(t->eos_override = strdup ("<|endoftext|>")))
            return rx_err_set (err, RX_ENOMEM, "chat template: out of memory");
    }
#undef HAS
    if (t->family != RX_CHAT_UNKNOWN) return RX_OK;

    /* Quote the start, control characters shown as spaces. */
    char head[49];
    size_t i = 0;
    for (; tmpl[i] && i + 1 < sizeof head; i++)
        head[i] = (unsigned char) tmpl[i] < 0x20 ? ' ' : tmpl[i];
    head[i] = '\0';
    return rx_err_set (err, RX_ENOTSUP, "chat template not recognised (it begins \"%s%s\"); "
                       "name a family instead: " KNOWN, head, tmpl[i] ? "..." : "");
}

/* ---- rendering -------------------------------------------------------- */

struct s_out {
    char *p;
    size_t n, cap;
    int oom;
};

static void s_putn (struct s_out *o, const char *s, size_t n)
{
    if (o->oom) return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1) cap *= 2;
        char *p = realloc (o->p, cap);
        if (!p) {
            o->oom = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy (o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = '\0';
}

static void s_put (struct s_out *o, const char *s)
{
    s_putn (o, s, strlen (s));
}

static int s_ws (char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Jinja's |trim and Python's str.strip() (ASCII whitespace). */
static void s_put_trim (struct s_out *o, const char *s)
{
    size_t a = 0, b = strlen (s);
    while (a < b && s_ws (s[a])) a++;
    while (b > a && s_ws (s[b - 1])) b--;
    s_putn (o, s + a, b - a);
}

static const char *s_role (const struct rx_chat_msg *m)
{
    return m->role ? m->role : "";
}

static const char *s_content (const struct rx_chat_msg *m)
{
    return m->content ? m->content : "";
}

static int s_is (const struct rx_chat_msg *m, const char *role)
{
    return strcmp (s_role (m), role) == 0;
}

/* Families that only know system/user/assistant. */
static int s_check_roles (const struct rx_chat_template *t, const struct rx_chat_msg *msgs, size_t n,
                          struct rx_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (!s_is (&msgs[i], "system") && !s_is (&msgs[i], "user") && !s_is (&msgs[i], "assistant"))
            return rx_err_set (err, RX_EINVAL, "chat message %zu: role \"%.32s\" is not supported by the "
                               "%s template (system, user, assistant)", i, s_role (&msgs[i]),
                               s_names[t->family]);
    return RX_OK;
}

/* Llama 2 and Mistral: an optional leading system message, then strictly
 * user/assistant/user/... */
static int s_check_alternating (const struct rx_chat_template *t, const struct rx_chat_msg *msgs,
                                size_t n, struct rx_err *err)
{
    size_t first = n > 0 && s_is (&msgs[0], "system") ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        const char *want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (!s_is (&msgs[i], want))
            return rx_err_set (err, RX_EINVAL, "chat message %zu: the %s template needs an optional "
                               "system message, then user and assistant turns alternating from user "
                               "(got \"%.32s\", expected \"%s\")", i, s_names[t->family],
                               s_role (&msgs[i]), want);
    }
    return RX_OK;
}

int rx_chat_render (const struct rx_chat_template *t, const struct rx_chat_msg *msgs, size_t n,
                    int add_generation_prompt, const char *bos, const char *eos,
                    char **out, size_t *len, struct rx_err *err)
{
    struct s_out o = { 0 };
    int rc = RX_OK;
    *out = NULL;
    if (len) *len = 0;
    if (!bos) bos = "";
    if (!eos) eos = "";
    if (n && !msgs) return rx_err_set (err, RX_EINVAL, "chat: NULL message list");
    s_put (&o, "");

    switch (t->family) {
    case RX_CHAT_CHATML:
        if (t->default_system && (n == 0 || !s_is (&msgs[0], "system"))) {
            s_put (&o, "<|im_start|>system\n");
            s_put (&o, t->default_system);
            s_put (&o, "<|im_end|>\n");
        }
        for (size_t i = 0; i < n; i++) {
            s_put (&o, "<|im_start|>");
            s_put (&o, s_role (&msgs[i]));
            s_put (&o, "\n");
            s_put (&o, s_content (&msgs[i]));
            s_put (&o, "<|im_end|>\n");
        }
        if (add_generation_prompt) s_put (&o, "<|im_start|>assistant\n");
        break;

    case RX_CHAT_LLAMA2: {
        if ((rc = s_check_alternating (t, msgs, n, err)) != RX_OK) break;
        size_t first = n > 0 && s_is (&msgs[0], "system") ? 1 : 0;
        for (size_t i = first; i < n; i++) {
            /* The system prompt joins the first turn's content, and the
             * whole is stripped (content.strip() in the template). */
            struct s_out c = { 0 };
            if (i == first && first) {
                s_put (&c, "<<SYS>>\n");
                s_put (&c, s_content (&msgs[0]));
                s_put (&c, "\n<</SYS>>\n\n");
            }
            s_put (&c, s_content (&msgs[i]));
            if (c.oom) {
                o.oom = 1;
                free (c.p);
                break;
            }
            if (s_is (&msgs[i], "user")) {
                s_put (&o, bos);
                s_put (&o, "[INST] ");
                s_put_trim (&o, c.p);
                s_put (&o, " [/INST]");
            } else {
                s_put (&o, " ");
                s_put_trim (&o, c.p);
                s_put (&o, " ");
                s_put (&o, eos);
            }
            free (c.p);
        }
        break;
    }

    case RX_CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            if (i == 0) s_put (&o, bos);
            s_put (&o, "<|start_header_id|>");
            s_put (&o, s_role (&msgs[i]));
            s_put (&o, "<|end_header_id|>\n\n");
            s_put_trim (&o, s_content (&msgs[i]));
            s_put (&o, "<|eot_id|>");
        }
        if (add_generation_prompt) s_put (&o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;

    case RX_CHAT_MISTRAL: {
        if ((rc = s_check_alternating (t, msgs, n, err)) != RX_OK) break;
        size_t first = n > 0 && s_is (&msgs[0], "system") ? 1 : 0;
        s_put (&o, bos);
        for (size_t i = first; i < n; i++) {
            if (s_is (&msgs[i], "user")) {
                s_put (&o, "[INST] ");
                if (i == n - 1 && first) {
                    s_put (&o, s_content (&msgs[0]));
                    s_put (&o, "\n\n");
                }
                s_put (&o, s_content (&msgs[i]));
                s_put (&o, "[/INST]");
            } else {
                s_put (&o, " ");
                s_put_trim (&o, s_content (&msgs[i]));
                s_put (&o, eos);
            }
        }
        break;
    }

    case RX_CHAT_DEEPSEEK2:
        if ((rc = s_check_roles (t, msgs, n, err)) != RX_OK) break;
        s_put (&o, bos);
        for (size_t i = 0; i < n; i++) {
            if (s_is (&msgs[i], "user")) {
                s_put (&o, "User: ");
                s_put (&o, s_content (&msgs[i]));
                s_put (&o, "\n\n");
            } else if (s_is (&msgs[i], "assistant")) {
                s_put (&o, "Assistant: ");
                s_put (&o, s_content (&msgs[i]));
                s_put (&o, eos);
            } else {
                s_put (&o, s_content (&msgs[i]));
                s_put (&o, "\n\n");
            }
        }
        if (add_generation_prompt) s_put (&o, "Assistant:");
        break;

    case RX_CHAT_DEEPSEEK3: {
        if ((rc = s_check_roles (t, msgs, n, err)) != RX_OK) break;
        /* The (last) system prompt goes right after BOS. */
        const char *sys = "";
        for (size_t i = 0; i < n; i++)
            if (s_is (&msgs[i], "system")) sys = s_content (&msgs[i]);
        s_put (&o, bos);
        s_put (&o, sys);
        for (size_t i = 0; i < n; i++) {
            if (s_is (&msgs[i], "user")) {
                s_put (&o, "<｜User｜>");
                s_put (&o, s_content (&msgs[i]));
            } else if (s_is (&msgs[i], "assistant")) {
                s_put (&o, "<｜Assistant｜>");
                s_put (&o, s_content (&msgs[i]));
                s_put (&o, "<｜end▁of▁sentence｜>");
            }
        }
        if (add_generation_prompt) s_put (&o, "<｜Assistant｜>");
        break;
    }

    case RX_CHAT_ZEPHYR: {
        if ((rc = s_check_roles (t, msgs, n, err)) != RX_OK) break;
        const char *end = t->eos_override ? t->eos_override : eos;
        for (size_t i = 0; i < n; i++) {
            s_put (&o, "<|");
            s_put (&o, s_role (&msgs[i]));
            s_put (&o, "|>\n");
            s_put (&o, s_content (&msgs[i]));
            s_put (&o, end);
            s_put (&o, "\n");
        }
        if (add_generation_prompt) s_put (&o, "<|assistant|>\n");
        break;
    }

    default:
        rc = rx_err_set (err, RX_EINVAL, "chat: no template family chosen");
        break;
    }

    if (rc == RX_OK && o.oom) rc = rx_err_set (err, RX_ENOMEM, "chat: out of memory");
    if (rc != RX_OK) {
        free (o.p);
        return rc;
    }
    *out = o.p;
    if (len) *len = o.n;
    return RX_OK;
}
