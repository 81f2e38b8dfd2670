/* tools/chat.c -- `radix chat`: talk to a model with its chat template.
 *
 *   radix chat --model F.gguf [--system TEXT] [--template FAMILY]
 *              [--prompt TEXT] [--max-tokens N] [--temperature T] [--top-k K]
 *              [--top-p P] [--seed S] [--threads N] [--ctx N] [--config FILE]
 *
 * Reads one user message per line from stdin (a "> " prompt when stdin is a
 * terminal) and streams each answer to stdout; "/reset" starts over, "/exit"
 * or end of input quits.  --prompt asks one question and exits.  Each turn
 * the whole conversation is rendered with the template (core/chat.h) and
 * tokenized; the KV of the prefix it shares with what the sequence already
 * holds is kept, so a turn only computes the new tokens.  Greedy by default
 * (temperature 0). */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grow.h"
#include "boot.h"
#include "chat.h"
#include "commands.h"
#include "detok.h"
#include "engine.h"
#include "generate.h"
#include "sampling.h"
#include "tokenizer.h"

struct chat {
    rx_engine_t *e;
    rx_tokenizer_t *tok;
    rx_sampler_t *smp;
    struct rx_chat_template ct;
    char *bos, *eos;
    int seq;
    int32_t max_new;
    /* the conversation */
    struct rx_chat_msg *msgs;
    char **owned;                 /* message texts we allocated */
    size_t n_msgs, cap_msgs, cap_owned;
    /* what the sequence holds */
    int32_t *held;
    size_t n_held, cap_held;
    /* the answer being generated */
    char *answer;
    size_t n_answer, cap_answer;
    int32_t *gen;
    size_t n_gen, cap_gen;
    struct rx_detok dt;
};

static int s_add_msg (struct chat *c, const char *role, const char *text, size_t len)
{
    if (rx_grow ((void **) &c->msgs, &c->cap_msgs, c->n_msgs + 1, sizeof *c->msgs) < 0) return -1;
    if (rx_grow ((void **) &c->owned, &c->cap_owned, c->n_msgs + 1, sizeof *c->owned) < 0) return -1;
    char *t = strndup (text, len);
    if (!t) return -1;
    c->owned[c->n_msgs] = t;
    c->msgs[c->n_msgs].role = role;
    c->msgs[c->n_msgs].content = t;
    c->n_msgs++;
    return 0;
}

static void s_drop_msgs (struct chat *c, size_t keep)
{
    while (c->n_msgs > keep) free (c->owned[--c->n_msgs]);
}

static int s_on_token (void *ud, int32_t id)
{
    struct chat *c = ud;
    if (rx_tokenizer_is_eog (c->tok, id)) return 1;
    if (rx_grow ((void **) &c->gen, &c->cap_gen, c->n_gen + 1, sizeof *c->gen) < 0) return 1;
    c->gen[c->n_gen++] = id;
    struct rx_detok_delta d;
    if (rx_detok_push (&c->dt, id, &d, NULL) == RX_OK && d.len) {
        fwrite (d.text, 1, d.len, stdout);
        fflush (stdout);
        if (rx_grow ((void **) &c->answer, &c->cap_answer, c->n_answer + d.len + 1, 1) < 0) return 1;
        memcpy (c->answer + c->n_answer, d.text, d.len);
        c->n_answer += d.len;
    }
    return 0;
}

/* One user turn: render, reuse the shared prefix, generate, remember. */
static int s_turn (struct chat *c, const char *user, size_t ulen, struct rx_err *err)
{
    size_t keep = c->n_msgs;
    if (s_add_msg (c, "user", user, ulen) < 0) return rx_err_set (err, RX_ENOMEM, "out of memory");
    char *prompt = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = rx_chat_render (&c->ct, c->msgs, c->n_msgs, 1, c->bos, c->eos, &prompt, NULL, err);
    if (rc == RX_OK)
        rc = rx_tokenizer_encode (c->tok, prompt, strlen (prompt), RX_TOK_PARSE_SPECIAL, &ids, &n, err);
    free (prompt);
    if (rc == RX_OK && n == 0) rc = rx_err_set (err, RX_EINVAL, "the rendered conversation has no tokens");
    int32_t room = rx_engine_seq_room (c->e, c->seq) + rx_engine_seq_len (c->e, c->seq);
    if (rc == RX_OK && (int64_t) n + 1 > room)
        rc = rx_err_set (err, RX_ERANGE, "the conversation (%zu tokens) no longer fits the KV cache of %d tokens: /reset or raise --ctx",
                         n, room);
    if (rc != RX_OK) {
        free (ids);
        s_drop_msgs (c, keep);
        return rc;
    }
    /* Keep the KV of the common prefix, but always feed at least one token. */
    size_t common = 0;
    while (common < c->n_held && common < n && c->held[common] == ids[common]) common++;
    if (common == n) common = n - 1;
    rx_engine_seq_truncate (c->e, c->seq, (int32_t) common);
    c->n_held = common;
    c->n_answer = 0;
    c->n_gen = 0;
    rx_detok_init (&c->dt, c->tok, RX_DETOK_STRIP_SPACE);
    struct rx_gen_stats st;
    int full = 0;
    int32_t max_new = c->max_new;
    if ((int64_t) n + max_new > room) max_new = (int32_t) (room - (int32_t) n);
    rc = rx_gen_run (c->e, c->seq, ids + common, (int32_t) (n - common), max_new, c->smp, s_on_token,
                     c, &st, &full, err);
    struct rx_detok_delta d;
    if (rx_detok_finish (&c->dt, &d, NULL) == RX_OK && d.len) {
        fwrite (d.text, 1, d.len, stdout);
        if (rx_grow ((void **) &c->answer, &c->cap_answer, c->n_answer + d.len + 1, 1) == 0) {
            memcpy (c->answer + c->n_answer, d.text, d.len);
            c->n_answer += d.len;
        }
    }
    rx_detok_fini (&c->dt);
    fputc ('\n', stdout);
    fflush (stdout);
    if (rc == RX_OK) {
        /* The sequence holds the prompt, then the answer's tokens that were
         * fed back: all of them, or all but the last when generation stopped
         * at --max-tokens (an end-of-generation token is never kept). */
        size_t held = (size_t) rx_engine_seq_len (c->e, c->seq);
        if (held < n || held > n + c->n_gen
            || rx_grow ((void **) &c->held, &c->cap_held, held, sizeof *c->held) < 0) {
            rc = rx_err_set (err, RX_EINTERNAL, "chat: sequence holds %zu tokens, expected %zu..%zu",
                             held, n, n + c->n_gen);
        } else {
            memcpy (c->held, ids, n * sizeof *ids);
            memcpy (c->held + n, c->gen, (held - n) * sizeof *c->gen);
            c->n_held = held;
        }
        if (rc == RX_OK && s_add_msg (c, "assistant", c->answer ? c->answer : "", c->n_answer) < 0)
            rc = rx_err_set (err, RX_ENOMEM, "out of memory");
        if (full) fprintf (stderr, "radix chat: the KV cache is full (/reset or raise --ctx)\n");
        fprintf (stderr, "[%d prompt tokens (%d new) at %.1f tok/s, %d generated at %.1f tok/s]\n",
                 (int) n, st.n_prompt, st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0.0, st.n_gen,
                 st.t_gen > 0 && st.n_gen > 1 ? (st.n_gen - 1) / st.t_gen : 0.0);
    } else {
        s_drop_msgs (c, keep);
        c->n_held = 0;
        rx_engine_seq_truncate (c->e, c->seq, 0);
    }
    free (ids);
    return rc;
}

static void s_usage (FILE *f)
{
    fprintf (f,
             "usage: radix chat --model FILE.gguf [--system TEXT] [--template FAMILY] [--prompt TEXT]\n"
             "                  [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S]\n"
             "                  [--threads N] [--ctx N] [--config FILE]\n"
             "  one user message per input line; /reset starts over, /exit quits.\n"
             "  FAMILY overrides the model's template: chatml, llama2, llama3, mistral,\n"
             "  deepseek2, deepseek3, zephyr.  --prompt: answer one message and exit.\n");
}

int rx_cmd_chat (int argc, char **argv)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "system", required_argument, NULL, 'S' },
        { "template", required_argument, NULL, 'T' },
        { "prompt", required_argument, NULL, 'p' },
        { "max-tokens", required_argument, NULL, 'n' },
        RX_GEN_COMMON_OPTIONS,
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *model = NULL, *config = NULL, *threads = NULL, *system = NULL, *family = NULL,
               *one = NULL;
    long max_tokens = 512, ctx = 4096, lv;
    struct rx_sampling sp;
    rx_sampling_defaults (&sp);
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "m:p:n:t:k:s:j:c:h", opts, NULL)) != -1) {
        int sc = rx_gen_sampling_opt (c, optarg, &sp);
        if (sc < 0) return 2;
        if (sc > 0) continue;
        switch (c) {
        case 'm': model = optarg; break;
        case 'S': system = optarg; break;
        case 'T': family = optarg; break;
        case 'p': one = optarg; break;
        case 'c': config = optarg; break;
        case 'n': if (rx_gen_parse_int ("max-tokens", optarg, 1, 1 << 24, &max_tokens)) return 2; break;
        case 'C': if (rx_gen_parse_int ("ctx", optarg, 2, INT32_MAX, &ctx)) return 2; break;
        case 'j': if (rx_gen_parse_int ("threads", optarg, 0, 4096, &lv)) return 2;
                  threads = optarg; break;
        case 'h': s_usage (stdout); return 0;
        default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "radix chat: unexpected argument \"%s\"\n", argv[optind]);
        s_usage (stderr);
        return 2;
    }
    struct rx_err err = { 0 };
    struct rx_boot b;
    if (rx_boot_open (&b, config, RX_BOOT_CHECK_REFS, &err) != RX_OK) {
        fprintf (stderr, "radix: %s\n", err.msg);
        return 1;
    }
    struct chat ch;
    memset (&ch, 0, sizeof ch);
    ch.seq = -1;
    ch.max_new = (int32_t) max_tokens;
    int have_ct = 0, status = 1;
    char *line = NULL;
    size_t cap = 0;
    if (threads && rx_conf_set (b.conf, "kernels", "threads", threads, &err) != RX_OK) goto out;
    struct rx_engine_opts eo = { .model_path = model, .n_slots = ctx, .max_tokens = 0 };
    if (!(ch.e = rx_engine_new (&b, &eo, &err))) goto out;
    if (!(ch.tok = rx_tokenizer_from_gguf (rx_engine_gguf (ch.e), &err))) goto out;
    if ((family ? rx_chat_template_named (&ch.ct, family, &err)
                : rx_chat_template_detect (&ch.ct, rx_tokenizer_chat_template (ch.tok), &err)) != RX_OK)
        goto out;
    have_ct = 1;
    size_t bl = 0, el = 0;
    const char *bt = rx_tokenizer_token_text (ch.tok, rx_tokenizer_bos (ch.tok), &bl);
    const char *et = rx_tokenizer_token_text (ch.tok, rx_tokenizer_eos (ch.tok), &el);
    ch.bos = strndup (bt ? bt : "", bt ? bl : 0);
    ch.eos = strndup (et ? et : "", et ? el : 0);
    if (!ch.bos || !ch.eos) {
        rx_err_set (&err, RX_ENOMEM, "out of memory");
        goto out;
    }
    if (!(ch.smp = rx_sampler_new (&sp, rx_engine_info (ch.e)->n_vocab, &err))) goto out;
    if ((ch.seq = rx_engine_seq_new (ch.e, (int32_t) rx_engine_n_slots (ch.e), &err)) < 0) goto out;
    if (system && s_add_msg (&ch, "system", system, strlen (system)) < 0) {
        rx_err_set (&err, RX_ENOMEM, "out of memory");
        goto out;
    }
    size_t base = ch.n_msgs;
    if (one) {
        if (s_turn (&ch, one, strlen (one), &err) != RX_OK) goto out;
        status = 0;
        goto out;
    }
    int tty = isatty (0);
    for (;;) {
        if (tty) {
            fputs ("> ", stdout);
            fflush (stdout);
        }
        ssize_t n = getline (&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n == 0) continue;
        if (strcmp (line, "/exit") == 0 || strcmp (line, "/quit") == 0) break;
        if (strcmp (line, "/reset") == 0) {
            s_drop_msgs (&ch, base);
            ch.n_held = 0;
            rx_engine_seq_truncate (ch.e, ch.seq, 0);
            continue;
        }
        if (s_turn (&ch, line, (size_t) n, &err) != RX_OK) {
            /* A turn that fails (too long...) is reported; the chat goes on. */
            fprintf (stderr, "radix chat: %s\n", err.msg);
            rx_err_clear (&err);
        }
    }
    status = 0;
out:
    if (status != 0) fprintf (stderr, "radix chat: %s\n", err.msg[0] ? err.msg : "failed");
    free (line);
    s_drop_msgs (&ch, 0);
    free (ch.msgs);
    free (ch.owned);
    free (ch.held);
    free (ch.answer);
    free (ch.gen);
    free (ch.bos);
    free (ch.eos);
    if (have_ct) rx_chat_template_fini (&ch.ct);
    rx_sampler_destroy (&ch.smp);
    rx_tokenizer_free (&ch.tok);
    rx_engine_destroy (&ch.e);
    rx_boot_close (&b);
    return status;
}
