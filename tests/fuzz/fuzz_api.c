/* tests/fuzz/fuzz_api.c -- libFuzzer harness for radixd's request parser
 * (core/api.c): the HTTP body of /v1/completions, /v1/chat/completions,
 * /generate, /tokenize, /detokenize and /abort_request.
 *
 * Every input must be accepted with a request that fits the context, or be
 * refused with one 4xx error that has a message and serialises to JSON; any
 * leak, bad read or undefined behaviour is a finding (ASan, UBSan, LSan).
 * The tokenizer is the Llama-2 vocabulary of tiny-llama.gguf ($RADIX_SHARED,
 * or RX_FUZZ_MODEL), chat template "llama2", context 512, truncation off on
 * even first bytes and on for odd ones.  Build and run: tests/fuzz/run.sh api. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

static rx_tokenizer_t *s_tok;
static struct rx_chat_template s_ct;
static const char *const s_names[] = { "tiny-llama" };

int LLVMFuzzerInitialize (int *argc, char ***argv);
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int LLVMFuzzerInitialize (int *argc, char ***argv)
{
    char path[4096];
    const char *m = getenv ("RX_FUZZ_MODEL");
    if (m) snprintf (path, sizeof path, "%s", m);
    else snprintf (path, sizeof path, "%s/data/models/tiny-llama.gguf",
                   getenv ("RADIX_SHARED") ? getenv ("RADIX_SHARED") : "/work/shared");
    struct rx_err err = { 0 };
    s_tok = rx_tokenizer_open (path, &err);
    if (!s_tok) {
        fprintf (stderr, "fuzz_api: %s (set RADIX_SHARED or RX_FUZZ_MODEL)\n", err.msg);
        exit (1);
    }
    if (rx_chat_template_named (&s_ct, "llama2", &err) != RX_OK) abort ();
    return 0;
}

static void s_check_err (int rc, const struct rx_api_error *e)
{
    if (rc == RX_OK) return;
    if (rc != RX_EINVAL || (e->status != 400 && e->status != 404) || !e->message[0] || !e->type)
        abort ();
    char *js;
    if (rx_api_error_json (e, &js) != RX_OK) abort ();
    free (js);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    /* an exact-size copy, so ASan sees any read past the body */
    char *body = malloc (size ? size : 1);
    if (!body) return 0;
    memcpy (body, data, size);
    struct rx_api_ctx ctx = {
        .tok = s_tok, .chat = &s_ct, .models = s_names, .n_models = 1, .ctx_len = 512,
        .default_max_tokens = 0, .max_tokens_cap = 0, .truncate = size && (data[0] & 1),
    };
    int (*fns[]) (const char *, size_t, const struct rx_api_ctx *, struct rx_request *,
                  struct rx_api_error *) = { rx_api_parse_completion, rx_api_parse_chat,
                                             rx_api_parse_generate };
    for (size_t i = 0; i < 3; i++) {
        struct rx_request r;
        struct rx_api_error e = { 0 };
        int rc = fns[i] (body, size, &ctx, &r, &e);
        s_check_err (rc, &e);
        if (rc == RX_OK) {
            if (r.n_input == 0 || r.n_input >= 512 || !r.input_ids || !r.model) abort ();
            if (r.sp.max_tokens < 0 || r.n_input + (uint32_t) r.sp.max_tokens > 512) abort ();
            for (uint32_t k = 0; k < r.n_input; k++)
                if (r.input_ids[k] < 0 || r.input_ids[k] >= 32000) abort ();
            struct rx_err ve = { 0 };
            if (rx_sampling_params_validate (&r.sp, &ve) != RX_OK) abort ();
        } else if (r.input_ids || r.model || r.sp.n_stop) {
            abort ();       /* a refused request owns nothing */
        }
        rx_request_free (&r);
    }
    int32_t *ids;
    size_t n;
    struct rx_api_error e = { 0 };
    int rc = rx_api_parse_tokenize (body, size, &ctx, &ids, &n, &e);
    s_check_err (rc, &e);
    if (rc == RX_OK) {
        char *js;
        if (rx_api_tokenize_response (ids, n, 512, &js) != RX_OK) abort ();
        free (js);
        free (ids);
    }
    rc = rx_api_parse_detokenize (body, size, &ctx, &ids, &n, &e);
    s_check_err (rc, &e);
    if (rc == RX_OK) {
        char *text, *js;
        size_t len;
        struct rx_err te = { 0 };
        if (rx_tokenizer_decode (s_tok, ids, n, 0, &text, &len, &te) != RX_OK) abort ();
        if (rx_api_detokenize_response (text, len, &js) != RX_OK) abort ();
        free (js);
        free (text);
        free (ids);
    }
    char *rid;
    int all;
    rc = rx_api_parse_abort (body, size, &rid, &all, &e);
    s_check_err (rc, &e);
    if (rc == RX_OK) free (rid);
    /* the builders on arbitrary bytes as text: output must stay valid JSON text */
    struct rx_api_choice c = { .text = body, .len = size, .finish = size % 4, .matched_id = -1 };
    struct rx_api_meta m = { "cmpl-x", "tiny-llama", 0, 1 };
    struct rx_api_usage u = { 1, 1, 0 };
    char *s;
    if (rx_api_chat_chunk (&m, 0, &c, &s) != RX_OK) abort ();
    free (s);
    if (rx_api_completion_response (&m, &c, 1, &u, &s) != RX_OK) abort ();
    free (s);
    free (body);
    return 0;
}
