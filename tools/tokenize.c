/* tools/tokenize.c -- `radix tokenize`: print the token ids of a text.
 *
 *   radix tokenize --model F.gguf --text "..." [--bos] [--special]
 *   radix tokenize --model F.gguf --chat ROLE=TEXT ... [--chat-template NAME]
 *                  [--no-generation-prompt] [--show-prompt]
 *
 * Prints the ids on one line, space-separated.  No BOS unless --bos.
 * --special recognises control tokens written in the text (<s>, <|im_start|>).
 * --chat renders the messages with the model's chat template (or the family
 * named by --chat-template) and tokenizes the prompt as the server would:
 * control tokens parsed, BOS only where the template writes it.
 * --show-prompt prints the rendered prompt to stderr first. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "commands.h"
#include "tokenizer.h"

static void s_usage (FILE *f)
{
    fprintf (f,
             "usage: radix tokenize --model FILE.gguf --text TEXT [--bos] [--special]\n"
             "       radix tokenize --model FILE.gguf --chat ROLE=TEXT [--chat ROLE=TEXT ...]\n"
             "                      [--chat-template FAMILY] [--no-generation-prompt] [--show-prompt]\n"
             "  prints the token ids on one line; FAMILY is one of chatml, llama2, llama3,\n"
             "  mistral, deepseek2, deepseek3, zephyr\n");
}

static int s_render_chat (const rx_tokenizer_t *tok, const char *family, char **msgs_raw, size_t n,
                          int gen_prompt, char **prompt, struct rx_err *err)
{
    struct rx_chat_template ct;
    int rc = family ? rx_chat_template_named (&ct, family, err)
                    : rx_chat_template_detect (&ct, rx_tokenizer_chat_template (tok), err);
    if (rc != RX_OK) return rc;
    struct rx_chat_msg *msgs = calloc (n, sizeof *msgs);
    char **roles = calloc (n, sizeof *roles);
    if (!msgs || !roles) {
        rc = rx_err_set (err, RX_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr (msgs_raw[i], '=');
        if (!eq || eq == msgs_raw[i]) {
            rc = rx_err_set (err, RX_EINVAL, "--chat \"%.40s\": expected ROLE=TEXT", msgs_raw[i]);
            goto out;
        }
        if (!(roles[i] = strndup (msgs_raw[i], (size_t) (eq - msgs_raw[i])))) {
            rc = rx_err_set (err, RX_ENOMEM, "out of memory");
            goto out;
        }
        msgs[i].role = roles[i];
        msgs[i].content = eq + 1;
    }
    size_t blen = 0, elen = 0;
    const char *b = rx_tokenizer_token_text (tok, rx_tokenizer_bos (tok), &blen);
    const char *e = rx_tokenizer_token_text (tok, rx_tokenizer_eos (tok), &elen);
    char *bos = strndup (b ? b : "", b ? blen : 0), *eos = strndup (e ? e : "", e ? elen : 0);
    if (!bos || !eos) rc = rx_err_set (err, RX_ENOMEM, "out of memory");
    else rc = rx_chat_render (&ct, msgs, n, gen_prompt, bos, eos, prompt, NULL, err);
    free (bos);
    free (eos);
out:
    if (roles)
        for (size_t i = 0; i < n; i++) free (roles[i]);
    free (roles);
    free (msgs);
    rx_chat_template_fini (&ct);
    return rc;
}

int rx_cmd_tokenize (int argc, char **argv)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "text", required_argument, NULL, 't' },
        { "bos", no_argument, NULL, 'b' },
        { "special", no_argument, NULL, 's' },
        { "chat", required_argument, NULL, 'c' },
        { "chat-template", required_argument, NULL, 'T' },
        { "no-generation-prompt", no_argument, NULL, 'G' },
        { "show-prompt", no_argument, NULL, 'P' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *model = NULL, *text = NULL, *family = NULL;
    int bos = 0, special = 0, gen_prompt = 1, show = 0, c;
    char **chat = calloc ((size_t) argc + 1, sizeof *chat);
    size_t n_chat = 0;
    if (!chat) return 1;
    optind = 1;
    while ((c = getopt_long (argc, argv, "m:t:bsc:T:GPh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': text = optarg; break;
        case 'b': bos = 1; break;
        case 's': special = 1; break;
        case 'c': chat[n_chat++] = optarg; break;
        case 'T': family = optarg; break;
        case 'G': gen_prompt = 0; break;
        case 'P': show = 1; break;
        case 'h': s_usage (stdout); free (chat); return 0;
        default: s_usage (stderr); free (chat); return 2;
        }
    }
    if (optind < argc || !model || (!text && n_chat == 0) || (text && n_chat > 0)) {
        fprintf (stderr, "radix tokenize: %s\n",
                 optind < argc ? "unexpected argument" : !model ? "--model is required"
                 : text ? "--text and --chat exclude each other" : "--text or --chat is required");
        s_usage (stderr);
        free (chat);
        return 2;
    }

    struct rx_err err = { 0 };
    rx_tokenizer_t *tok = rx_tokenizer_open (model, &err);
    char *prompt = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int status = 1;
    if (!tok) goto fail;
    unsigned flags = special ? RX_TOK_PARSE_SPECIAL : 0;
    if (n_chat) {
        if (s_render_chat (tok, family, chat, n_chat, gen_prompt, &prompt, &err) != RX_OK) goto fail;
        if (show) fprintf (stderr, "%s\n", prompt);
        text = prompt;
        flags = RX_TOK_PARSE_SPECIAL;
    }
    if (rx_tokenizer_encode (tok, text, strlen (text), flags, &ids, &n, &err) != RX_OK) goto fail;
    if (bos) {
        if (rx_tokenizer_bos (tok) < 0) {
            rx_err_set (&err, RX_EINVAL, "%s: --bos: the vocabulary has no BOS token", model);
            goto fail;
        }
        printf ("%d%s", rx_tokenizer_bos (tok), n ? " " : "");
    }
    for (size_t i = 0; i < n; i++) printf ("%s%d", i ? " " : "", ids[i]);
    printf ("\n");
    status = fflush (stdout) == 0 ? 0 : 1;
    goto done;
fail:
    fprintf (stderr, "radix tokenize: %s\n", err.msg);
done:
    free (ids);
    free (prompt);
    free (chat);
    rx_tokenizer_free (&tok);
    return status;
}
