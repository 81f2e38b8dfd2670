/* tests/unit/test_api.c -- the HTTP API layer (core/api.c): every bad
 * request gets one OpenAI-style error with the right status, type, param and
 * message; good requests map every field; responses and SSE chunks have the
 * OpenAI / SGLang shapes (parsed back with jansson); the fuzz corpus and its
 * regressions replay cleanly.
 *
 * Uses the Llama-2 vocabulary of $RADIX_SHARED/data/models/tiny-llama.gguf
 * (32000 tokens, BOS 1, EOS 2) with a 512-token context; skipped when the
 * file is absent.  Reference ids come from tiny-llama.json (llama.cpp). */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api.h"
#include "chat.h"
#include "request.h"
#include "tokenizer.h"
#include "../testutil.h"

#define CTX 512

static rx_tokenizer_t *s_tok;
static struct rx_chat_template s_ct;
static const char *const s_names[] = { "tiny-llama", "alias" };
static struct rx_api_ctx s_ctx;

static void s_setup (void)
{
    const char *shared = getenv ("RADIX_SHARED");
    char path[4096];
    snprintf (path, sizeof path, "%s/data/models/tiny-llama.gguf", shared ? shared : "/nonexistent");
    if (access (path, R_OK) != 0) {
        cr_skip_test ("%s not found (set RADIX_SHARED to the shared data folder)", path);
        return;
    }
    struct rx_err err = { 0 };
    s_tok = rx_tokenizer_open (path, &err);
    cr_assert_not_null (s_tok, "%s", err.msg);
    cr_assert_eq (rx_chat_template_named (&s_ct, "llama2", &err), RX_OK, "%s", err.msg);
    memset (&s_ctx, 0, sizeof s_ctx);
    s_ctx.tok = s_tok;
    s_ctx.chat = &s_ct;
    s_ctx.models = s_names;
    s_ctx.n_models = 2;
    s_ctx.ctx_len = CTX;
}

static void s_teardown (void)
{
    rx_tokenizer_free (&s_tok);
    rx_chat_template_fini (&s_ct);
}

TestSuite (api, .init = s_setup, .fini = s_teardown);

typedef int (*parse_fn) (const char *, size_t, const struct rx_api_ctx *, struct rx_request *,
                         struct rx_api_error *);

/* Parse body, expecting success; *r must be freed by the caller. */
static void s_ok (parse_fn f, const char *body, struct rx_request *r)
{
    struct rx_api_error e = { 0 };
    int rc = f (body, strlen (body), &s_ctx, r, &e);
    cr_assert_eq (rc, RX_OK, "%s -> %d %s [%s] %s", body, e.status, e.code ? e.code : "-", e.param,
                  e.message);
}

/* Parse body, expecting the error; checks status, type, code, param, a
 * message substring, that out is left empty, and that the error JSON has
 * OpenAI's shape. */
static void s_bad_len (parse_fn f, const char *body, size_t len, int status, const char *code,
                       const char *param, const char *substr)
{
    struct rx_api_error e = { 0 };
    struct rx_request r;
    memset (&r, 0x5a, sizeof r);
    int rc = f (body, len, &s_ctx, &r, &e);
    cr_assert_neq (rc, RX_OK, "accepted: %s", body);
    cr_expect_eq (rc, status >= 500 ? RX_EINTERNAL : RX_EINVAL);
    cr_expect_eq (e.status, status, "%s: status %d (%s)", body, e.status, e.message);
    cr_expect_str_eq (e.type, status == 404 || status < 500 ? "invalid_request_error" : "server_error");
    if (code) cr_expect_str_eq (e.code ? e.code : "(null)", code, "%s: %s", body, e.message);
    cr_expect_str_eq (e.param, param, "%s: param '%s' (%s)", body, e.param, e.message);
    cr_expect (strstr (e.message, substr) != NULL, "%s: message '%s' lacks '%s'", body, e.message,
               substr);
    cr_expect_null (r.input_ids);
    cr_expect_null (r.model);
    cr_expect_eq (r.n_input, 0u);
    cr_expect_eq (r.sp.n_stop, 0u);
    rx_request_free (&r);
    char *js;
    cr_assert_eq (rx_api_error_json (&e, &js), RX_OK);
    json_error_t je;
    json_t *root = json_loads (js, 0, &je);
    cr_assert_not_null (root, "%s: %s", js, je.text);
    cr_expect_eq (json_object_size (root), 1u);
    json_t *err = json_object_get (root, "error");
    cr_assert (json_is_object (err));
    cr_expect_eq (json_object_size (err), 4u);
    cr_expect_str_eq (json_string_value (json_object_get (err, "message")), e.message);
    cr_expect_str_eq (json_string_value (json_object_get (err, "type")), e.type);
    if (param[0]) cr_expect_str_eq (json_string_value (json_object_get (err, "param")), param);
    else cr_expect (json_is_null (json_object_get (err, "param")));
    if (e.code) cr_expect_str_eq (json_string_value (json_object_get (err, "code")), e.code);
    else cr_expect (json_is_null (json_object_get (err, "code")));
    json_decref (root);
    free (js);
}

static void s_bad (parse_fn f, const char *body, int status, const char *code, const char *param,
                   const char *substr)
{
    s_bad_len (f, body, strlen (body), status, code, param, substr);
}

#define CMPL rx_api_parse_completion
#define CHAT rx_api_parse_chat
#define GEN  rx_api_parse_generate

/* A body {"prompt": [1, 100, 100, ...]} of n ids, plus extra fields. */
static char *s_ids_body (const char *key, size_t n, int first, const char *extra)
{
    size_t cap = n * 6 + 256;
    char *b = malloc (cap);
    size_t o = (size_t) snprintf (b, cap, "{\"%s\": [", key);
    for (size_t i = 0; i < n; i++)
        o += (size_t) snprintf (b + o, cap - o, "%s%d", i ? "," : "", i == 0 ? first : 100 + (int) (i % 50));
    snprintf (b + o, cap - o, "]%s%s}", extra ? ", " : "", extra ? extra : "");
    return b;
}

/* ---- malformed bodies ------------------------------------------------ */

Test (api, malformed_json)
{
    s_bad (CMPL, "{", 400, "invalid_json", "", "could not parse the JSON body");
    s_bad (CMPL, "{\"prompt\": \"hi\",}", 400, "invalid_json", "", "could not parse");
    s_bad (CMPL, "{\"prompt\": \"hi\"} trailing", 400, "invalid_json", "", "could not parse");
    s_bad (CMPL, "", 400, "invalid_json", "", "could not parse");
    s_bad (CHAT, "nope", 400, "invalid_json", "", "could not parse");
    s_bad (GEN, "{'text': 'x'}", 400, "invalid_json", "", "could not parse");
    s_bad_len (CMPL, NULL, 0, 400, "invalid_json", "", "could not parse");
    /* a NUL byte inside the body */
    s_bad_len (CMPL, "{\"prompt\":\"a\0b\"}", 16, 400, NULL, "", "");
}

Test (api, body_not_an_object)
{
    s_bad (CMPL, "[1, 2]", 400, "invalid_type", "", "must be a JSON object, but got an array");
    s_bad (CHAT, "[]", 400, "invalid_type", "", "must be a JSON object");
    s_bad (GEN, "[{\"text\": \"a\"}]", 400, "invalid_type", "", "must be a JSON object");
}

Test (api, invalid_utf8)
{
    s_bad (CMPL, "{\"prompt\": \"caf\xc3\"}", 400, "invalid_utf8", "", "not valid UTF-8");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", 400,
           "invalid_utf8", "", "not valid UTF-8");
    s_bad (GEN, "{\"text\": \"\xed\xa0\x80\"}", 400, "invalid_utf8", "", "not valid UTF-8");  /* surrogate */
    s_bad (CMPL, "{\"prompt\": \"\xc0\xaf\"}", 400, "invalid_utf8", "", "not valid UTF-8");   /* overlong */
    s_bad (CMPL, "{\"prompt\": \"a\\u0000b\"}", 400, "invalid_value", "", "NUL");
}

/* ---- wrong types ---------------------------------------------------- */

Test (api, wrong_types)
{
    s_bad (CMPL, "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "invalid_type",
           "temperature", "expected a number, but got a string");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"max_tokens\": 1.5}", 400, "invalid_type", "max_tokens",
           "expected an integer");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"max_tokens\": \"5\"}", 400, "invalid_type", "max_tokens",
           "expected an integer, but got a string");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stream\": \"yes\"}", 400, "invalid_type", "stream",
           "expected a boolean");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stream\": 1}", 400, "invalid_type", "stream",
           "expected a boolean, but got an integer");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop\": 5}", 400, "invalid_type", "stop",
           "expected a string or an array of strings");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop\": [\"a\", 1]}", 400, "invalid_type", "stop",
           "'stop[1]'");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"n\": \"2\"}", 400, "invalid_type", "n", "expected an integer");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"seed\": \"x\"}", 400, "invalid_type", "seed", "expected an integer");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"logprobs\": true}", 400, "invalid_type", "logprobs",
           "expected an integer, but got a boolean");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"echo\": 1}", 400, "invalid_type", "echo", "expected a boolean");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"top_k\": 1.5}", 400, "invalid_type", "top_k", "expected an integer");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"min_p\": []}", 400, "invalid_type", "min_p",
           "expected a number, but got an array");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop_token_ids\": \"2\"}", 400, "invalid_type",
           "stop_token_ids", "expected an array");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop_token_ids\": [2, \"x\"]}", 400, "invalid_type",
           "stop_token_ids", "stop_token_ids[1]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"ignore_eos\": \"true\"}", 400, "invalid_type", "ignore_eos", "boolean");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"model\": 3}", 400, "invalid_type", "model", "expected a string");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"user\": 3}", 400, "invalid_type", "user", "expected a string");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stream\": true, \"stream_options\": 1}", 400, "invalid_type",
           "stream_options", "expected an object");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}",
           400, "invalid_type", "stream_options.include_usage", "expected a boolean");
    s_bad (CMPL, "{\"prompt\": 42}", 400, "invalid_type", "prompt",
           "expected a string or an array of token ids, but got an integer");
    s_bad (CMPL, "{\"prompt\": [1, \"a\"]}", 400, "invalid_type", "prompt", "prompt[1]");
    s_bad (CMPL, "{\"prompt\": [1, 2.5]}", 400, "invalid_type", "prompt", "prompt[1]");
    s_bad (CMPL, "{\"prompt\": [[1, [2]]]}", 400, "invalid_type", "prompt", "prompt[1]");
    s_bad (CMPL, "{\"prompt\": [[[1]]]}", 400, "invalid_type", "prompt", "prompt[0][0]");
    s_bad (CHAT, "{\"messages\": \"hi\"}", 400, "invalid_type", "messages", "expected an array");
    s_bad (CHAT, "{\"messages\": [5]}", 400, "invalid_type", "messages[0]", "expected a message object");
    s_bad (CHAT, "{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}", 400, "invalid_type",
           "messages[0].role", "expected a string");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "invalid_type",
           "messages[0].content", "expected a string or an array of content parts");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [\"x\"]}]}", 400, "invalid_type",
           "messages[0].content[0]", "content part object");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]}",
           400, "invalid_type", "messages[0].content[0]", "needs a string 'text'");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 3}", 400,
           "invalid_type", "logprobs", "expected a boolean");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": \"9\"}",
           400, "invalid_type", "max_completion_tokens", "expected an integer");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": 3}", 400, "invalid_type", "sampling_params",
           "expected an object");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"temperature\": \"x\"}}", 400, "invalid_type",
           "sampling_params.temperature", "expected a number");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"max_new_tokens\": true}}", 400, "invalid_type",
           "sampling_params.max_new_tokens", "expected an integer");
    s_bad (GEN, "{\"text\": \"a\", \"rid\": 5}", 400, "invalid_type", "rid", "expected a string");
    s_bad (GEN, "{\"text\": 5}", 400, "invalid_type", "text", "expected a string");
    s_bad (GEN, "{\"text\": [1, 2]}", 400, "invalid_type", "text", "expected a string, but got an array");
    s_bad (GEN, "{\"input_ids\": \"1 2\"}", 400, "invalid_type", "input_ids", "array of token ids");
    s_bad (GEN, "{\"input_ids\": [\"a\"]}", 400, "invalid_type", "input_ids", "input_ids[0]");
    s_bad (GEN, "{\"text\": \"a\", \"stream\": \"no\"}", 400, "invalid_type", "stream", "boolean");
}

/* ---- out-of-range values ----------------------------------------------- */

Test (api, out_of_range)
{
    s_bad (CMPL, "{\"prompt\": \"hi\", \"temperature\": -1}", 400, "invalid_value", "temperature",
           "temperature must be >= 0 (got -1)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"top_p\": 0}", 400, "invalid_value", "top_p", "top_p must be in (0, 1]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"top_p\": 1.01}", 400, "invalid_value", "top_p", "(got 1.01)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"min_p\": 1.5}", 400, "invalid_value", "min_p", "min_p must be in [0, 1]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"min_p\": -0.1}", 400, "invalid_value", "min_p", "min_p");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"top_k\": 0}", 400, "invalid_value", "top_k", "-1 (disabled) or >= 1");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"top_k\": -2}", 400, "invalid_value", "top_k", "(got -2)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"frequency_penalty\": 2.5}", 400, "invalid_value",
           "frequency_penalty", "in [-2, 2]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"presence_penalty\": -3}", 400, "invalid_value",
           "presence_penalty", "in [-2, 2]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"repetition_penalty\": 0}", 400, "invalid_value",
           "repetition_penalty", "in (0, 2]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"repetition_penalty\": 2.5}", 400, "invalid_value",
           "repetition_penalty", "(got 2.5)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"n\": 0}", 400, "invalid_value", "n", "n must be in [1, 64]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"n\": 65}", 400, "invalid_value", "n", "(got 65)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "invalid_value", "max_tokens", "at least 1");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"max_tokens\": -5}", 400, "invalid_value", "max_tokens", "at least 1");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"max_tokens\": 10000000000}", 400, "invalid_value", "max_tokens",
           "integer out of range");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"max_tokens\": 5, \"min_tokens\": 10}", 400, "invalid_value",
           "min_tokens", "min_tokens must be <= max_tokens (got 10 > 5)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"min_tokens\": -1}", 400, "invalid_value", "min_tokens", ">= 0");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"logprobs\": 21}", 400, "invalid_value", "logprobs",
           "logprobs must be in [0, 20]");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"logprobs\": -1}", 400, "invalid_value", "logprobs", "(got -1)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop\": [\"a\", \"\"]}", 400, "invalid_value", "stop",
           "must not be empty");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
           "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 400, "invalid_value", "stop", "at most 16");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop_token_ids\": [2, 32000]}", 400, "invalid_value",
           "stop_token_ids", "out of the vocabulary [0, 32000)");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stop_token_ids\": [-1]}", 400, "invalid_value",
           "stop_token_ids", "token id -1 is out of the vocabulary");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, "
           "\"top_logprobs\": 21}", 400, "invalid_value", "top_logprobs", "top_logprobs must be in [0, 20]");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
           400, "invalid_value", "top_logprobs", "'logprobs' must be set to true");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 0}",
           400, "invalid_value", "max_completion_tokens", "at least 1");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 3, "
           "\"min_tokens\": 4}", 400, "invalid_value", "min_tokens", "<= max_completion_tokens");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"temperature\": -0.5}}", 400, "invalid_value",
           "sampling_params.temperature", "temperature must be >= 0");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"max_new_tokens\": 2, \"min_new_tokens\": 3}}",
           400, "invalid_value", "sampling_params.min_new_tokens", "min_new_tokens must be <= max_new_tokens");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"max_new_tokens\": -1}}", 400, "invalid_value",
           "sampling_params.max_new_tokens", "must be >= 0");
    s_bad (GEN, "{\"text\": \"a\", \"top_logprobs_num\": 99}", 400, "invalid_value", "top_logprobs_num",
           "top_logprobs_num must be in [0, 20]");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"top_p\": 2}}", 400, "invalid_value",
           "sampling_params.top_p", "top_p");
}

/* ---- prompts ---------------------------------------------------------- */

Test (api, empty_and_missing_prompts)
{
    s_bad (CMPL, "{}", 400, "missing_required_parameter", "prompt", "Missing required parameter: 'prompt'");
    s_bad (CMPL, "{\"prompt\": null}", 400, "missing_required_parameter", "prompt", "'prompt'");
    s_bad (CMPL, "{\"prompt\": \"\"}", 400, "invalid_value", "prompt", "must not be empty");
    s_bad (CMPL, "{\"prompt\": []}", 400, "invalid_value", "prompt", "must not be empty");
    s_bad (CMPL, "{\"prompt\": [[]]}", 400, "invalid_value", "prompt", "must not be empty");
    s_bad (CMPL, "{\"prompt\": [\"\"]}", 400, "invalid_value", "prompt", "must not be empty");
    s_bad (CHAT, "{}", 400, "missing_required_parameter", "messages", "'messages'");
    s_bad (CHAT, "{\"messages\": []}", 400, "invalid_value", "messages", "at least one message");
    s_bad (GEN, "{}", 400, "missing_required_parameter", "text", "Exactly one of 'text' or 'input_ids'");
    s_bad (GEN, "{\"text\": \"a\", \"input_ids\": [1]}", 400, "invalid_value", "text", "Exactly one");
    s_bad (GEN, "{\"text\": \"\"}", 400, "invalid_value", "text", "must not be empty");
    s_bad (GEN, "{\"input_ids\": []}", 400, "invalid_value", "input_ids", "must not be empty");
}

Test (api, token_ids_outside_vocab)
{
    s_bad (CMPL, "{\"prompt\": [1, 32000]}", 400, "invalid_value", "prompt",
           "'prompt[1]': token id 32000 is out of the vocabulary [0, 32000)");
    s_bad (CMPL, "{\"prompt\": [-1]}", 400, "invalid_value", "prompt", "token id -1");
    s_bad (CMPL, "{\"prompt\": [[5, 99999999999]]}", 400, "invalid_value", "prompt", "out of");
    s_bad (GEN, "{\"input_ids\": [1, 2, 40000]}", 400, "invalid_value", "input_ids", "input_ids[2]");
    /* a model whose vocabulary is smaller than the tokenizer's says so */
    s_ctx.n_vocab = 1000;
    s_bad (CMPL, "{\"prompt\": [1, 999, 1000]}", 400, "invalid_value", "prompt", "[0, 1000)");
    struct rx_request r;
    s_ok (CMPL, "{\"prompt\": [1, 999]}", &r);
    rx_request_free (&r);
}

Test (api, batches_refused)
{
    s_bad (CMPL, "{\"prompt\": [\"a\", \"b\"]}", 400, "unsupported_parameter", "prompt",
           "batched prompts (a list of 2 prompts)");
    s_bad (CMPL, "{\"prompt\": [[1, 2], [3]]}", 400, "unsupported_parameter", "prompt", "batched");
    s_bad (GEN, "{\"text\": [\"a\", \"b\"]}", 400, "unsupported_parameter", "text", "batched");
    s_bad (GEN, "{\"input_ids\": [[1], [2]]}", 400, "unsupported_parameter", "input_ids", "batched");
    s_bad (GEN, "{\"text\": \"a\", \"rid\": [\"x\"]}", 400, "unsupported_parameter", "rid", "batch");
    /* a batch of one is that prompt */
    struct rx_request r;
    s_ok (CMPL, "{\"prompt\": [\"Once upon a time\"]}", &r);
    cr_assert_eq (r.n_input, 5u);
    cr_expect_eq (r.input_ids[1], 9038);
    rx_request_free (&r);
    s_ok (CMPL, "{\"prompt\": [[7, 8, 9]]}", &r);
    cr_assert_eq (r.n_input, 3u);
    cr_expect_eq (r.input_ids[0], 7);
    cr_expect_eq (r.input_ids[2], 9);
    rx_request_free (&r);
}

Test (api, unknown_model)
{
    s_bad (CMPL, "{\"model\": \"gpt-4\", \"prompt\": \"hi\"}", 404, "model_not_found", "model",
           "The model `gpt-4` does not exist");
    s_bad (CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 404,
           "model_not_found", "model", "serves `tiny-llama`");
    struct rx_request r;
    s_ok (CMPL, "{\"model\": \"alias\", \"prompt\": \"hi\"}", &r);
    cr_expect_str_eq (r.model, "alias");
    rx_request_free (&r);
    s_ok (CMPL, "{\"prompt\": \"hi\"}", &r);
    cr_expect_str_eq (r.model, "tiny-llama");
    rx_request_free (&r);
}

Test (api, unsupported_and_unknown_fields)
{
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}",
           400, "unsupported_parameter", "tools", "tool calling");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"auto\"}",
           400, "unsupported_parameter", "tool_choice", "tool_choice");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
           "{\"type\": \"json_object\"}}", 400, "unsupported_parameter", "response_format", "text");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"logit_bias\": {\"50256\": -100}}", 400, "unsupported_parameter",
           "logit_bias", "not supported");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"logit_bias\": 4}", 400, "invalid_type", "logit_bias", "an object");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"best_of\": 3}", 400, "unsupported_parameter", "best_of", "best_of");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"suffix\": \"end\"}", 400, "unsupported_parameter", "suffix", "suffix");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"guided_json\": {}}", 400, "unsupported_parameter", "guided_json", "");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"echo\": true, \"logprobs\": 1}", 400, "unsupported_parameter",
           "echo", "prompt logprobs");
    s_bad (CMPL, "{\"prompt\": \"hi\", \"stream_options\": {\"include_usage\": true}}", 400,
           "invalid_value", "stream_options", "only allowed when 'stream' is true");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"temprature\": 0.5}}", 400, "unknown_parameter",
           "sampling_params.temprature", "Unknown parameter");
    s_bad (GEN, "{\"text\": \"a\", \"sampling_params\": {\"regex\": \"a+\"}}", 400, "unsupported_parameter",
           "sampling_params.regex", "");
    s_bad (GEN, "{\"text\": \"a\", \"image_data\": \"x.png\"}", 400, "unsupported_parameter", "image_data", "");
    /* unknown top-level fields are ignored; so are defaults of the unsupported ones */
    struct rx_request r;
    s_ok (CMPL, "{\"prompt\": \"hi\", \"frobnicate\": [1, {\"a\": 2}], \"best_of\": 1, \"suffix\": \"\", "
          "\"logit_bias\": {}, \"tools\": [], \"tool_choice\": \"none\", \"user\": \"u1\", "
          "\"response_format\": {\"type\": \"text\"}, \"stream_options\": null}", &r);
    rx_request_free (&r);
    s_ok (GEN, "{\"text\": \"a\", \"model\": \"whatever\", \"extra\": 1, \"sampling_params\": "
          "{\"no_stop_trim\": true, \"spaces_between_special_tokens\": false, \"regex\": null}}", &r);
    rx_request_free (&r);
}

Test (api, chat_messages_refused)
{
    s_bad (CHAT, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400, "invalid_value",
           "messages[0].role", "'wizard'");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": \"y\"}]}",
           400, "unsupported_parameter", "messages[1].role", "tool calling");
    s_bad (CHAT, "{\"messages\": [{\"content\": \"x\"}]}", 400, "missing_required_parameter",
           "messages[0].role", "'messages[0].role'");
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
           "\"image_url\": {\"url\": \"x\"}}]}]}", 400, "unsupported_parameter", "messages[0].content[0]",
           "'image_url'");
    /* llama2 needs user/assistant to alternate: the renderer's message comes through */
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"y\"}]}",
           400, "invalid_value", "messages", "Invalid 'messages': ");
    s_ctx.chat = NULL;
    s_bad (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400, NULL, "messages",
           "no chat template");
}

/* ---- context length --------------------------------------------------- */

Test (api, context_boundary)
{
    struct rx_request r;
    char *b;
    /* ctx - 1 prompt tokens: accepted, one token of room */
    b = s_ids_body ("prompt", CTX - 1, 1, NULL);
    s_ok (CMPL, b, &r);
    cr_expect_eq (r.n_input, (uint32_t) CTX - 1);
    cr_expect_eq (r.sp.max_tokens, 1);
    rx_request_free (&r);
    free (b);
    b = s_ids_body ("prompt", CTX - 1, 1, "\"max_tokens\": 1");
    s_ok (CMPL, b, &r);
    cr_expect_eq (r.sp.max_tokens, 1);
    rx_request_free (&r);
    free (b);
    b = s_ids_body ("prompt", CTX - 1, 1, "\"max_tokens\": 2");
    s_bad (CMPL, b, 400, "context_length_exceeded", "max_tokens",
           "This model's maximum context length is 512 tokens. However, you requested 513 tokens "
           "(511 in the prompt, 2 in the completion)");
    free (b);
    /* ctx and ctx + 1: refused */
    b = s_ids_body ("prompt", CTX, 1, NULL);
    s_bad (CMPL, b, 400, "context_length_exceeded", "prompt",
           "This model's maximum context length is 512 tokens. However, your prompt is 512 tokens");
    free (b);
    b = s_ids_body ("prompt", CTX + 1, 1, NULL);
    s_bad (CMPL, b, 400, "context_length_exceeded", "prompt", "your prompt is 513 tokens");
    free (b);
    b = s_ids_body ("input_ids", CTX + 1, 1, NULL);
    s_bad (GEN, b, 400, "context_length_exceeded", "input_ids", "maximum context length is 512");
    free (b);
    /* a text prompt over the context, and chat */
    size_t n = 3000;
    char *big = malloc (n * 6 + 64);
    strcpy (big, "{\"prompt\": \"");
    for (size_t i = 0; i < n; i++) strcat (big, "word ");
    strcat (big, "\"}");
    s_bad (CMPL, big, 400, "context_length_exceeded", "prompt", "maximum context length is 512 tokens");
    free (big);
    big = malloc (n * 6 + 128);
    strcpy (big, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (size_t i = 0; i < n; i++) strcat (big, "word ");
    strcat (big, "\"}]}");
    s_bad (CHAT, big, 400, "context_length_exceeded", "messages", "However, your messages are ");
    free (big);
}

Test (api, context_truncation)
{
    s_ctx.truncate = 1;
    struct rx_request r;
    /* BOS first: kept, then the last ctx-2 tokens */
    char *b = s_ids_body ("prompt", CTX + 10, 1, "\"max_tokens\": 50");
    s_ok (CMPL, b, &r);
    cr_assert_eq (r.n_input, (uint32_t) CTX - 1);
    cr_expect_eq (r.input_ids[0], 1);
    /* original id i (i >= 1) is 100 + i % 50; the last one was i = CTX + 9 */
    cr_expect_eq (r.input_ids[CTX - 2], 100 + (CTX + 9) % 50);
    cr_expect_eq (r.input_ids[1], 100 + (CTX + 9 - (CTX - 3)) % 50);
    cr_expect_eq (r.sp.max_tokens, 1);
    rx_request_free (&r);
    free (b);
    /* no BOS: just the tail */
    b = s_ids_body ("prompt", CTX + 10, 7, NULL);
    s_ok (CMPL, b, &r);
    cr_assert_eq (r.n_input, (uint32_t) CTX - 1);
    cr_expect_eq (r.input_ids[0], 100 + 11 % 50);
    rx_request_free (&r);
    free (b);
    /* max_tokens over the room is clamped */
    b = s_ids_body ("prompt", 500, 1, "\"max_tokens\": 100, \"min_tokens\": 50");
    s_ok (CMPL, b, &r);
    cr_expect_eq (r.n_input, 500u);
    cr_expect_eq (r.sp.max_tokens, 12);
    cr_expect_eq (r.sp.min_tokens, 12);
    rx_request_free (&r);
    free (b);
}

Test (api, max_tokens_defaults_and_cap)
{
    struct rx_request r;
    s_ok (CMPL, "{\"prompt\": \"Once upon a time\"}", &r);
    cr_expect_eq (r.sp.max_tokens, CTX - 5);     /* the room left */
    rx_request_free (&r);
    s_ctx.default_max_tokens = 16;
    s_ok (CMPL, "{\"prompt\": \"Once upon a time\", \"min_tokens\": 20}", &r);
    cr_expect_eq (r.sp.max_tokens, 16);
    cr_expect_eq (r.sp.min_tokens, 16);
    rx_request_free (&r);
    s_ctx.max_tokens_cap = 8;
    s_ok (CMPL, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 100}", &r);
    cr_expect_eq (r.sp.max_tokens, 8);
    rx_request_free (&r);
    /* the cap is applied before the context check: 400 -> 8, and 505 + 8 > 512 */
    char *b = s_ids_body ("prompt", 505, 1, "\"max_tokens\": 400");
    s_bad (CMPL, b, 400, "context_length_exceeded", "max_tokens",
           "you requested 513 tokens (505 in the prompt, 8 in the completion)");
    free (b);
    b = s_ids_body ("prompt", 504, 1, "\"max_tokens\": 400");
    s_ok (CMPL, b, &r);
    cr_expect_eq (r.sp.max_tokens, 8);
    rx_request_free (&r);
    free (b);
}

/* ---- happy paths -------------------------------------------------------- */

Test (api, completion_fields)
{
    struct rx_request r;
    s_ok (CMPL, "{\"model\": \"tiny-llama\", \"prompt\": \"Once upon a time\", \"max_tokens\": 20, "
          "\"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, "
          "\"frequency_penalty\": 0.5, \"presence_penalty\": -0.5, \"repetition_penalty\": 1.1, "
          "\"seed\": 42, \"n\": 3, \"stop\": [\"a\", \"bc\"], \"stop_token_ids\": [2, 13], "
          "\"ignore_eos\": true, \"skip_special_tokens\": false, \"min_tokens\": 2, \"logprobs\": 3, "
          "\"echo\": false, \"stream\": true, \"stream_options\": {\"include_usage\": true}, "
          "\"user\": \"me\"}", &r);
    cr_expect_eq (r.kind, RX_REQ_COMPLETION);
    /* llama.cpp's ids for this text (tiny-llama.json) */
    static const int32_t want[] = { 1, 9038, 2501, 263, 931 };
    cr_assert_eq (r.n_input, 5u);
    for (int i = 0; i < 5; i++) cr_expect_eq (r.input_ids[i], want[i]);
    cr_expect_eq (r.sp.max_tokens, 20);
    cr_expect_float_eq (r.sp.temperature, 0.5f, 1e-6);
    cr_expect_float_eq (r.sp.top_p, 0.9f, 1e-6);
    cr_expect_eq (r.sp.top_k, 40);
    cr_expect_float_eq (r.sp.min_p, 0.05f, 1e-6);
    cr_expect_float_eq (r.sp.frequency_penalty, 0.5f, 1e-6);
    cr_expect_float_eq (r.sp.presence_penalty, -0.5f, 1e-6);
    cr_expect_float_eq (r.sp.repetition_penalty, 1.1f, 1e-6);
    cr_expect (r.sp.has_seed);
    cr_expect_eq (r.sp.seed, 42u);
    cr_expect_eq (r.sp.n, 3);
    cr_assert_eq (r.sp.n_stop, 2u);
    cr_expect_str_eq (r.sp.stop[0], "a");
    cr_expect_str_eq (r.sp.stop[1], "bc");
    cr_assert_eq (r.sp.n_stop_ids, 2u);
    cr_expect_eq (r.sp.stop_ids[0], 2);
    cr_expect_eq (r.sp.stop_ids[1], 13);
    cr_expect (r.sp.ignore_eos);
    cr_expect_not (r.sp.skip_special_tokens);
    cr_expect_eq (r.sp.min_tokens, 2);
    cr_expect (r.sp.logprobs);
    cr_expect_eq (r.sp.top_logprobs, 3);
    cr_expect_not (r.echo);
    cr_expect (r.stream);
    cr_expect (r.include_usage);
    cr_expect_str_eq (r.model, "tiny-llama");
    rx_request_free (&r);
    cr_expect_null (r.input_ids);
    cr_expect_eq (r.sp.n_stop, 0u);
}

Test (api, completion_defaults)
{
    struct rx_request r;
    s_ok (CMPL, "{\"prompt\": [1, 9038], \"temperature\": null, \"stop\": null, \"seed\": null, "
          "\"logprobs\": null, \"echo\": true, \"integral\": 1, \"n\": 2.0}", &r);
    cr_expect_eq (r.n_input, 2u);                  /* ids as given, no BOS added */
    cr_expect_float_eq (r.sp.temperature, 1.0f, 1e-6);
    cr_expect_float_eq (r.sp.top_p, 1.0f, 1e-6);
    cr_expect_eq (r.sp.top_k, -1);
    cr_expect_float_eq (r.sp.repetition_penalty, 1.0f, 1e-6);
    cr_expect_eq (r.sp.n, 2);                      /* 2.0 is an integer */
    cr_expect_not (r.sp.has_seed);
    cr_expect_not (r.sp.logprobs);
    cr_expect_eq (r.sp.n_stop, 0u);
    cr_expect (r.sp.skip_special_tokens);
    cr_expect (r.echo);
    cr_expect_not (r.stream);
    cr_expect_not (r.include_usage);
    rx_request_free (&r);
    /* stop as a string; seed negative and huge; logprobs 0 = the sampled token only */
    s_ok (CMPL, "{\"prompt\": \"x\", \"stop\": \"\\n\\n\", \"seed\": -1, \"logprobs\": 0}", &r);
    cr_assert_eq (r.sp.n_stop, 1u);
    cr_expect_str_eq (r.sp.stop[0], "\n\n");
    cr_expect (r.sp.has_seed);
    cr_expect_eq (r.sp.seed, UINT64_MAX);
    cr_expect (r.sp.logprobs);
    cr_expect_eq (r.sp.top_logprobs, 0);
    rx_request_free (&r);
    s_ok (CMPL, "{\"prompt\": \"x\", \"seed\": 9223372036854775807, \"stop\": \"\"}", &r);
    cr_expect_eq (r.sp.seed, (uint64_t) INT64_MAX);
    cr_expect_eq (r.sp.n_stop, 0u);
    rx_request_free (&r);
}

/* The expected ids: the conversation rendered by the template module
 * (checked on its own in test_chat) encoded without BOS. */
static void s_expect_chat_ids (const struct rx_request *r, const struct rx_chat_msg *m, size_t n)
{
    struct rx_err err = { 0 };
    char *text;
    size_t len;
    cr_assert_eq (rx_chat_render (&s_ct, m, n, 1, "<s>", "</s>", &text, &len, &err), RX_OK, "%s", err.msg);
    int32_t *ids;
    size_t k;
    cr_assert_eq (rx_tokenizer_encode (s_tok, text, len, RX_TOK_PARSE_SPECIAL, &ids, &k, &err), RX_OK);
    cr_assert_eq (r->n_input, k);
    for (size_t i = 0; i < k; i++) cr_expect_eq (r->input_ids[i], ids[i], "id %zu", i);
    free (ids);
    free (text);
}

Test (api, chat_fields)
{
    struct rx_request r;
    s_ok (CHAT, "{\"model\": \"alias\", \"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
          "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hello\"}, "
          "{\"type\": \"text\", \"text\": \"there\"}], \"name\": \"bob\"}], \"max_tokens\": 5, "
          "\"max_completion_tokens\": 7, \"logprobs\": true, \"top_logprobs\": 4, \"n\": 2, "
          "\"seed\": 7, \"stop\": \"END\", \"temperature\": 0}", &r);
    cr_expect_eq (r.kind, RX_REQ_CHAT);
    struct rx_chat_msg m[] = { { "system", "Be brief." }, { "user", "Hello\nthere" } };
    s_expect_chat_ids (&r, m, 2);
    /* the template wrote BOS once: not doubled */
    cr_expect_eq (r.input_ids[0], 1);
    cr_expect_neq (r.input_ids[1], 1);
    cr_expect_eq (r.sp.max_tokens, 7);            /* max_completion_tokens wins */
    cr_expect (r.sp.logprobs);
    cr_expect_eq (r.sp.top_logprobs, 4);
    cr_expect_eq (r.sp.n, 2);
    cr_expect_eq (r.sp.seed, 7u);
    cr_expect_float_eq (r.sp.temperature, 0.0f, 1e-9);
    cr_assert_eq (r.sp.n_stop, 1u);
    cr_expect_str_eq (r.sp.stop[0], "END");
    cr_expect_str_eq (r.model, "alias");
    rx_request_free (&r);
    /* a conversation with an assistant turn and a null content */
    s_ok (CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
          "\"content\": null}, {\"role\": \"user\", \"content\": \"Again\"}], \"logprobs\": false}", &r);
    struct rx_chat_msg m2[] = { { "user", "Hi" }, { "assistant", "" }, { "user", "Again" } };
    s_expect_chat_ids (&r, m2, 3);
    cr_expect_not (r.sp.logprobs);
    cr_expect_eq (r.sp.max_tokens, CTX - (int32_t) r.n_input);
    rx_request_free (&r);
}

Test (api, generate_fields)
{
    struct rx_request r;
    s_ok (GEN, "{\"text\": \"Once upon a time\", \"rid\": \"req-7\", \"stream\": true, "
          "\"return_logprob\": true, \"top_logprobs_num\": 2, \"logprob_start_len\": -1, "
          "\"sampling_params\": {\"max_new_tokens\": 32, \"min_new_tokens\": 4, \"temperature\": 0.7, "
          "\"top_p\": 0.8, \"top_k\": 20, \"min_p\": 0.1, \"frequency_penalty\": 0.1, "
          "\"presence_penalty\": 0.2, \"repetition_penalty\": 1.05, \"stop\": [\"\\n\"], "
          "\"stop_token_ids\": [2], \"ignore_eos\": true, \"skip_special_tokens\": false, \"n\": 1, "
          "\"sampling_seed\": 99}}", &r);
    cr_expect_eq (r.kind, RX_REQ_GENERATE);
    static const int32_t want[] = { 1, 9038, 2501, 263, 931 };
    cr_assert_eq (r.n_input, 5u);
    for (int i = 0; i < 5; i++) cr_expect_eq (r.input_ids[i], want[i]);
    cr_expect_str_eq (r.ext_id, "req-7");
    cr_expect (r.stream);
    cr_expect (r.sp.logprobs);
    cr_expect_eq (r.sp.top_logprobs, 2);
    cr_expect_eq (r.sp.max_tokens, 32);
    cr_expect_eq (r.sp.min_tokens, 4);
    cr_expect_float_eq (r.sp.temperature, 0.7f, 1e-6);
    cr_expect_float_eq (r.sp.top_p, 0.8f, 1e-6);
    cr_expect_eq (r.sp.top_k, 20);
    cr_expect_float_eq (r.sp.min_p, 0.1f, 1e-6);
    cr_expect_float_eq (r.sp.repetition_penalty, 1.05f, 1e-6);
    cr_assert_eq (r.sp.n_stop, 1u);
    cr_expect_str_eq (r.sp.stop[0], "\n");
    cr_expect_eq (r.sp.n_stop_ids, 1u);
    cr_expect_eq (r.sp.stop_ids[0], 2);
    cr_expect (r.sp.ignore_eos);
    cr_expect_not (r.sp.skip_special_tokens);
    cr_expect (r.sp.has_seed);
    cr_expect_eq (r.sp.seed, 99u);
    cr_expect_str_eq (r.model, "tiny-llama");
    rx_request_free (&r);
    /* input_ids, max_new_tokens 0 (prefill only), seed alias */
    s_ok (GEN, "{\"input_ids\": [1, 2, 3], \"sampling_params\": {\"max_new_tokens\": 0, \"seed\": 5}}", &r);
    cr_expect_eq (r.n_input, 3u);
    cr_expect_eq (r.sp.max_tokens, 0);
    cr_expect_eq (r.sp.seed, 5u);
    cr_expect_null (r.ext_id);
    rx_request_free (&r);
}

Test (api, tokenize_detokenize_abort)
{
    int32_t *ids;
    size_t n;
    struct rx_api_error e = { 0 };
    const char *b = "{\"model\": \"tiny-llama\", \"prompt\": \"Once upon a time\"}";
    cr_assert_eq (rx_api_parse_tokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_OK, "%s", e.message);
    cr_assert_eq (n, 5u);
    cr_expect_eq (ids[0], 1);
    cr_expect_eq (ids[4], 931);
    char *js;
    cr_assert_eq (rx_api_tokenize_response (ids, n, CTX, &js), RX_OK);
    cr_expect_str_eq (js, "{\"tokens\":[1,9038,2501,263,931],\"count\":5,\"max_model_len\":512}");
    free (js);
    free (ids);
    b = "{\"prompt\": \"Once upon a time\", \"add_special_tokens\": false}";
    cr_assert_eq (rx_api_parse_tokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_OK);
    cr_assert_eq (n, 4u);
    cr_expect_eq (ids[0], 9038);
    free (ids);
    b = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}";
    cr_assert_eq (rx_api_parse_tokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_OK, "%s", e.message);
    cr_expect_eq (ids[0], 1);
    cr_expect_neq (ids[1], 1);
    free (ids);
    b = "{\"prompt\": 5}";
    cr_expect_eq (rx_api_parse_tokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_EINVAL);
    cr_expect_str_eq (e.param, "prompt");
    cr_expect_null (ids);
    b = "{\"model\": \"x\", \"prompt\": \"a\"}";
    cr_expect_eq (rx_api_parse_tokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_EINVAL);
    cr_expect_eq (e.status, 404);

    b = "{\"tokens\": [1, 9038, 2501]}";
    cr_assert_eq (rx_api_parse_detokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_OK);
    cr_assert_eq (n, 3u);
    cr_expect_eq (ids[2], 2501);
    free (ids);
    b = "{\"tokens\": [1, 32000]}";
    cr_expect_eq (rx_api_parse_detokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_EINVAL);
    cr_expect_str_eq (e.param, "tokens");
    cr_expect (strstr (e.message, "out of the vocabulary") != NULL);
    b = "{}";
    cr_expect_eq (rx_api_parse_detokenize (b, strlen (b), &s_ctx, &ids, &n, &e), RX_EINVAL);
    cr_expect_str_eq (e.code, "missing_required_parameter");
    cr_assert_eq (rx_api_detokenize_response ("Once upon\xe2\x96", 11, &js), RX_OK);
    cr_expect_str_eq (js, "{\"prompt\":\"Once upon\xef\xbf\xbd\xef\xbf\xbd\"}");
    free (js);

    char *rid;
    int all;
    b = "{\"rid\": \"abc\"}";
    cr_assert_eq (rx_api_parse_abort (b, strlen (b), &rid, &all, &e), RX_OK);
    cr_expect_str_eq (rid, "abc");
    cr_expect_not (all);
    free (rid);
    b = "{\"abort_all\": true}";
    cr_assert_eq (rx_api_parse_abort (b, strlen (b), &rid, &all, &e), RX_OK);
    cr_expect_null (rid);
    cr_expect (all);
    b = "{\"rid\": 3}";
    cr_expect_eq (rx_api_parse_abort (b, strlen (b), &rid, &all, &e), RX_EINVAL);
    cr_expect_str_eq (e.param, "rid");
    b = "{}";
    cr_expect_eq (rx_api_parse_abort (b, strlen (b), &rid, &all, &e), RX_EINVAL);
    cr_expect_str_eq (e.code, "missing_required_parameter");
}

Test (api, server_misconfigured)
{
    s_ctx.tok = NULL;
    s_bad (CMPL, "{\"prompt\": \"x\"}", 500, "internal_error", "", "misconfigured");
}

Test (api, request_helpers)
{
    struct rx_sampling_params p;
    struct rx_err err = { 0 };
    rx_sampling_params_init (&p);
    cr_expect_eq (rx_sampling_params_validate (&p, &err), RX_OK);
    cr_expect_eq (p.max_tokens, -1);
    cr_expect_eq (p.n, 1);
    p.temperature = NAN;
    cr_expect_eq (rx_sampling_params_validate (&p, &err), RX_EINVAL);
    cr_expect_eq (strncmp (err.msg, "temperature", 11), 0);
    p.temperature = INFINITY;
    cr_expect_eq (rx_sampling_params_validate (&p, &err), RX_EINVAL);
    p.temperature = 0;
    p.n_stop = 1;
    p.stop[0] = strdup ("");
    cr_expect_eq (rx_sampling_params_validate (&p, &err), RX_EINVAL);
    cr_expect_str_eq (err.msg, "stop[0] must not be an empty string");
    p.n_stop_ids = RX_MAX_STOP_IDS + 1;
    rx_sampling_params_fini (&p);   /* frees the stop string (ASan checks) */
    cr_expect_eq (p.n_stop, 0u);
    cr_expect_eq (p.n_stop_ids, 0u);
    cr_expect_float_eq (p.temperature, 1.0f, 1e-9);
    rx_request_free (NULL);
}

/* ---- responses ---------------------------------------------------------- */

static json_t *s_parse (const char *s)
{
    json_error_t je;
    json_t *j = json_loads (s, 0, &je);
    cr_assert_not_null (j, "%s: %s", s, je.text);
    return j;
}

/* "data: {...}\n\n" -> the object */
static json_t *s_sse (const char *s)
{
    size_t n = strlen (s);
    cr_assert (n > 8 && strncmp (s, "data: ", 6) == 0 && strcmp (s + n - 2, "\n\n") == 0, "%s", s);
    cr_assert_null (memchr (s, '\n', n - 2), "newline inside an SSE event: %s", s);
    json_error_t je;
    json_t *j = json_loadb (s + 6, n - 8, 0, &je);
    cr_assert_not_null (j, "%s: %s", s, je.text);
    return j;
}

#define JS(o, k) json_string_value (json_object_get ((o), (k)))
#define JI(o, k) json_integer_value (json_object_get ((o), (k)))
#define JR(o, k) json_number_value (json_object_get ((o), (k)))

static const struct rx_api_meta s_meta = { "cmpl-0000000000000007", "tiny-llama", 1700000000, 0 };

static void s_expect_usage (json_t *u, int p, int c, int cached)
{
    cr_assert (json_is_object (u));
    cr_expect_eq (JI (u, "prompt_tokens"), p);
    cr_expect_eq (JI (u, "completion_tokens"), c);
    cr_expect_eq (JI (u, "total_tokens"), p + c);
    cr_expect_eq (JI (json_object_get (u, "prompt_tokens_details"), "cached_tokens"), cached);
}

Test (api_resp, completion)
{
    char id[64];
    rx_api_make_id (id, sizeof id, "cmpl", 7);
    cr_expect_str_eq (id, "cmpl-0000000000000007");
    struct rx_api_choice c[2] = {
        { .text = "Hello", .len = 5, .finish = RX_API_FINISH_LENGTH },
        { .text = " \"quoted\"\n", .len = 10, .finish = RX_API_FINISH_STOP },
    };
    struct rx_api_usage u = { 12, 9, 8 };
    char *js;
    cr_assert_eq (rx_api_completion_response (&s_meta, c, 2, &u, &js), RX_OK);
    json_t *o = s_parse (js);
    cr_expect_str_eq (JS (o, "id"), "cmpl-0000000000000007");
    cr_expect_str_eq (JS (o, "object"), "text_completion");
    cr_expect_eq (JI (o, "created"), 1700000000);
    cr_expect_str_eq (JS (o, "model"), "tiny-llama");
    json_t *ch = json_object_get (o, "choices");
    cr_assert_eq (json_array_size (ch), 2u);
    for (size_t i = 0; i < 2; i++) {
        json_t *x = json_array_get (ch, i);
        cr_expect_eq (JI (x, "index"), (json_int_t) i);
        cr_expect (json_is_null (json_object_get (x, "logprobs")));
    }
    cr_expect_str_eq (JS (json_array_get (ch, 0), "text"), "Hello");
    cr_expect_str_eq (JS (json_array_get (ch, 0), "finish_reason"), "length");
    cr_expect_str_eq (JS (json_array_get (ch, 1), "text"), " \"quoted\"\n");
    cr_expect_str_eq (JS (json_array_get (ch, 1), "finish_reason"), "stop");
    s_expect_usage (json_object_get (o, "usage"), 12, 9, 8);
    json_decref (o);
    free (js);
}

static const struct rx_api_top_logprob s_top0[] = { { 15043, "Hello", 5, -0.25f }, { 29871, " ", 1, -1.5f } };
static const struct rx_api_top_logprob s_top1[] = { { 3186, "\xe2\x96", 2, -INFINITY } };
static const struct rx_api_token_logprob s_lp[] = {
    { 15043, "Hello", 5, -0.25f, 2, s_top0 },
    { 3186, "\xe2\x96", 2, -0.5f, 1, s_top1 },   /* half a UTF-8 sequence */
};

Test (api_resp, completion_logprobs)
{
    struct rx_api_choice c = { .text = "Hello\xe2\x96", .len = 7, .finish = RX_API_FINISH_STOP,
                               .logprobs = s_lp, .n_logprobs = 2, .text_offset = 3 };
    char *js;
    cr_assert_eq (rx_api_completion_response (&s_meta, &c, 1, NULL, &js), RX_OK);
    json_t *o = s_parse (js);
    cr_expect_null (json_object_get (o, "usage"));
    json_t *x = json_array_get (json_object_get (o, "choices"), 0);
    cr_expect_str_eq (JS (x, "text"), "Hello\xef\xbf\xbd\xef\xbf\xbd");
    json_t *lp = json_object_get (x, "logprobs");
    cr_assert (json_is_object (lp));
    json_t *toks = json_object_get (lp, "tokens"), *tlp = json_object_get (lp, "token_logprobs");
    json_t *tops = json_object_get (lp, "top_logprobs"), *offs = json_object_get (lp, "text_offset");
    cr_assert_eq (json_array_size (toks), 2u);
    cr_expect_str_eq (json_string_value (json_array_get (toks, 0)), "Hello");
    cr_expect_float_eq (json_number_value (json_array_get (tlp, 0)), -0.25, 1e-9);
    cr_expect_float_eq (json_number_value (json_array_get (tlp, 1)), -0.5, 1e-9);
    json_t *t0 = json_array_get (tops, 0);
    cr_expect_eq (json_object_size (t0), 2u);
    cr_expect_float_eq (JR (t0, "Hello"), -0.25, 1e-9);
    cr_expect_float_eq (JR (t0, " "), -1.5, 1e-9);
    cr_expect_float_eq (JR (json_array_get (tops, 1), "\xef\xbf\xbd\xef\xbf\xbd"), -9999.0, 1e-9);
    cr_expect_eq (json_integer_value (json_array_get (offs, 0)), 3);
    cr_expect_eq (json_integer_value (json_array_get (offs, 1)), 8);
    json_decref (o);
    free (js);
    /* logprobs are short decimals, not float noise */
    cr_assert_eq (rx_api_completion_response (&s_meta, &c, 1, NULL, &js), RX_OK);
    cr_expect (strstr (js, "\"token_logprobs\":[-0.25,-0.5]") != NULL, "%s", js);
    cr_expect (strstr (js, "{\"Hello\":-0.25,\" \":-1.5}") != NULL, "%s", js);
    free (js);
}

Test (api_resp, chat_with_logprobs)
{
    struct rx_api_choice c = { .text = "Hello", .len = 5, .finish = RX_API_FINISH_STOP,
                               .logprobs = s_lp, .n_logprobs = 2 };
    struct rx_api_usage u = { 20, 2, 0 };
    struct rx_api_meta m = { "chatcmpl-1", "alias", 5, 0 };
    char *js;
    cr_assert_eq (rx_api_chat_response (&m, &c, 1, &u, &js), RX_OK);
    json_t *o = s_parse (js);
    cr_expect_str_eq (JS (o, "object"), "chat.completion");
    cr_expect_str_eq (JS (o, "model"), "alias");
    json_t *x = json_array_get (json_object_get (o, "choices"), 0);
    cr_expect_eq (JI (x, "index"), 0);
    json_t *msg = json_object_get (x, "message");
    cr_expect_str_eq (JS (msg, "role"), "assistant");
    cr_expect_str_eq (JS (msg, "content"), "Hello");
    cr_expect_str_eq (JS (x, "finish_reason"), "stop");
    json_t *content = json_object_get (json_object_get (x, "logprobs"), "content");
    cr_assert_eq (json_array_size (content), 2u);
    json_t *e0 = json_array_get (content, 0), *e1 = json_array_get (content, 1);
    cr_expect_str_eq (JS (e0, "token"), "Hello");
    cr_expect_float_eq (JR (e0, "logprob"), -0.25, 1e-9);
    json_t *bytes = json_object_get (e0, "bytes");
    cr_assert_eq (json_array_size (bytes), 5u);
    cr_expect_eq (json_integer_value (json_array_get (bytes, 0)), 'H');
    json_t *tl = json_object_get (e0, "top_logprobs");
    cr_assert_eq (json_array_size (tl), 2u);
    cr_expect_str_eq (JS (json_array_get (tl, 1), "token"), " ");
    cr_expect_float_eq (JR (json_array_get (tl, 1), "logprob"), -1.5, 1e-9);
    cr_expect_eq (json_integer_value (json_array_get (json_object_get (json_array_get (tl, 1), "bytes"), 0)), 32);
    /* raw bytes kept, token text made valid */
    cr_expect_str_eq (JS (e1, "token"), "\xef\xbf\xbd\xef\xbf\xbd");
    bytes = json_object_get (e1, "bytes");
    cr_assert_eq (json_array_size (bytes), 2u);
    cr_expect_eq (json_integer_value (json_array_get (bytes, 0)), 0xe2);
    cr_expect_eq (json_integer_value (json_array_get (bytes, 1)), 0x96);
    cr_expect_float_eq (JR (json_array_get (json_object_get (e1, "top_logprobs"), 0), "logprob"), -9999.0, 1e-9);
    s_expect_usage (json_object_get (o, "usage"), 20, 2, 0);
    json_decref (o);
    free (js);
}

Test (api_resp, chat_stream)
{
    struct rx_api_meta m = { "chatcmpl-2", "tiny-llama", 9, 1 };
    char *s;
    /* role first */
    cr_assert_eq (rx_api_chat_chunk_role (&m, 1, &s), RX_OK);
    json_t *o = s_sse (s);
    cr_expect_str_eq (JS (o, "object"), "chat.completion.chunk");
    cr_expect_str_eq (JS (o, "id"), "chatcmpl-2");
    cr_expect (json_is_null (json_object_get (o, "usage")));
    cr_expect_neq (json_object_get (o, "usage"), NULL);
    json_t *x = json_array_get (json_object_get (o, "choices"), 0);
    cr_expect_eq (JI (x, "index"), 1);
    cr_expect_str_eq (JS (json_object_get (x, "delta"), "role"), "assistant");
    cr_expect_str_eq (JS (json_object_get (x, "delta"), "content"), "");
    cr_expect (json_is_null (json_object_get (x, "finish_reason")));
    json_decref (o);
    free (s);
    /* a content delta with a newline in it stays one SSE line */
    struct rx_api_choice c = { .text = "a\nb", .len = 3 };
    cr_assert_eq (rx_api_chat_chunk (&m, 0, &c, &s), RX_OK);
    o = s_sse (s);
    x = json_array_get (json_object_get (o, "choices"), 0);
    json_t *d = json_object_get (x, "delta");
    cr_expect_eq (json_object_size (d), 1u);
    cr_expect_str_eq (JS (d, "content"), "a\nb");
    cr_expect (json_is_null (json_object_get (x, "finish_reason")));
    cr_expect (json_is_null (json_object_get (x, "logprobs")));
    json_decref (o);
    free (s);
    /* the final chunk: empty delta, finish_reason */
    struct rx_api_choice fin = { .text = "", .len = 0, .finish = RX_API_FINISH_LENGTH };
    cr_assert_eq (rx_api_chat_chunk (&m, 0, &fin, &s), RX_OK);
    o = s_sse (s);
    x = json_array_get (json_object_get (o, "choices"), 0);
    cr_expect_eq (json_object_size (json_object_get (x, "delta")), 0u);
    cr_expect_str_eq (JS (x, "finish_reason"), "length");
    json_decref (o);
    free (s);
    /* usage chunk, then [DONE] */
    struct rx_api_usage u = { 3, 4, 1 };
    cr_assert_eq (rx_api_usage_chunk (&m, 1, &u, &s), RX_OK);
    o = s_sse (s);
    cr_expect_str_eq (JS (o, "object"), "chat.completion.chunk");
    cr_expect_eq (json_array_size (json_object_get (o, "choices")), 0u);
    cr_expect (json_is_array (json_object_get (o, "choices")));
    s_expect_usage (json_object_get (o, "usage"), 3, 4, 1);
    json_decref (o);
    free (s);
    cr_expect_str_eq (rx_api_sse_done (), "data: [DONE]\n\n");
    /* without include_usage chunks carry no usage field */
    m.include_usage = 0;
    cr_assert_eq (rx_api_chat_chunk (&m, 0, &c, &s), RX_OK);
    o = s_sse (s);
    cr_expect_null (json_object_get (o, "usage"));
    json_decref (o);
    free (s);
}

Test (api_resp, completion_stream)
{
    struct rx_api_meta m = { "cmpl-3", "tiny-llama", 9, 0 };
    struct rx_api_choice c = { .text = " world", .len = 6, .finish = RX_API_FINISH_NONE,
                               .logprobs = s_lp, .n_logprobs = 1, .text_offset = 5 };
    char *s;
    cr_assert_eq (rx_api_completion_chunk (&m, 2, &c, &s), RX_OK);
    json_t *o = s_sse (s);
    cr_expect_str_eq (JS (o, "object"), "text_completion");
    json_t *x = json_array_get (json_object_get (o, "choices"), 0);
    cr_expect_eq (JI (x, "index"), 2);
    cr_expect_str_eq (JS (x, "text"), " world");
    cr_expect (json_is_null (json_object_get (x, "finish_reason")));
    json_t *lp = json_object_get (x, "logprobs");
    cr_expect_eq (json_integer_value (json_array_get (json_object_get (lp, "text_offset"), 0)), 5);
    json_decref (o);
    free (s);
    c.finish = RX_API_FINISH_ABORT;
    c.logprobs = NULL;
    cr_assert_eq (rx_api_completion_chunk (&m, 0, &c, &s), RX_OK);
    o = s_sse (s);
    cr_expect_str_eq (JS (json_array_get (json_object_get (o, "choices"), 0), "finish_reason"), "abort");
    json_decref (o);
    free (s);
    struct rx_api_usage u = { 1, 2, 0 };
    cr_assert_eq (rx_api_usage_chunk (&m, 0, &u, &s), RX_OK);
    o = s_sse (s);
    cr_expect_str_eq (JS (o, "object"), "text_completion");
    s_expect_usage (json_object_get (o, "usage"), 1, 2, 0);
    json_decref (o);
    free (s);
}

Test (api_resp, models)
{
    const char *names[] = { "tiny-llama", "alias" };
    char *js;
    cr_assert_eq (rx_api_models_response (names, 2, 42, NULL, 512, &js), RX_OK);
    json_t *o = s_parse (js);
    cr_expect_str_eq (JS (o, "object"), "list");
    json_t *d = json_object_get (o, "data");
    cr_assert_eq (json_array_size (d), 2u);
    json_t *m1 = json_array_get (d, 1);
    cr_expect_str_eq (JS (m1, "id"), "alias");
    cr_expect_str_eq (JS (m1, "object"), "model");
    cr_expect_eq (JI (m1, "created"), 42);
    cr_expect_str_eq (JS (m1, "owned_by"), "radix");
    cr_expect_eq (JI (m1, "max_model_len"), 512);
    json_decref (o);
    free (js);
}

Test (api_resp, generate)
{
    struct rx_api_choice c = { .text = "Hi there", .len = 8, .finish = RX_API_FINISH_STOP,
                               .matched_id = 2, .logprobs = s_lp, .n_logprobs = 2 };
    struct rx_api_usage u = { 5, 3, 4 };
    char *js;
    cr_assert_eq (rx_api_generate_response ("req-7", &c, 1, &u, &js), RX_OK);
    json_t *o = s_parse (js);
    cr_expect_str_eq (JS (o, "text"), "Hi there");
    json_t *mi = json_object_get (o, "meta_info");
    cr_expect_str_eq (JS (mi, "id"), "req-7");
    cr_expect_eq (JI (mi, "prompt_tokens"), 5);
    cr_expect_eq (JI (mi, "completion_tokens"), 3);
    cr_expect_eq (JI (mi, "cached_tokens"), 4);
    json_t *fr = json_object_get (mi, "finish_reason");
    cr_expect_str_eq (JS (fr, "type"), "stop");
    cr_expect_eq (JI (fr, "matched"), 2);
    json_t *otl = json_object_get (mi, "output_token_logprobs");
    cr_assert_eq (json_array_size (otl), 2u);
    json_t *t0 = json_array_get (otl, 0);
    cr_expect_float_eq (json_number_value (json_array_get (t0, 0)), -0.25, 1e-9);
    cr_expect_eq (json_integer_value (json_array_get (t0, 1)), 15043);
    cr_expect_str_eq (json_string_value (json_array_get (t0, 2)), "Hello");
    json_t *otop = json_object_get (mi, "output_top_logprobs");
    cr_expect_eq (json_array_size (json_array_get (otop, 0)), 2u);
    cr_expect_eq (json_integer_value (json_array_get (json_array_get (json_array_get (otop, 0), 1), 1)), 29871);
    json_decref (o);
    free (js);
    /* n > 1: an array; length and stop-string finishes */
    struct rx_api_choice cs[2] = {
        { .text = "a", .len = 1, .finish = RX_API_FINISH_LENGTH, .matched_id = -1 },
        { .text = "b", .len = 1, .finish = RX_API_FINISH_STOP, .matched_id = -1, .matched_str = "\n" },
    };
    struct rx_api_usage us[2] = { { 5, 16, 0 }, { 5, 2, 5 } };
    cr_assert_eq (rx_api_generate_response ("r", cs, 2, us, &js), RX_OK);
    o = s_parse (js);
    cr_assert (json_is_array (o));
    cr_assert_eq (json_array_size (o), 2u);
    fr = json_object_get (json_object_get (json_array_get (o, 0), "meta_info"), "finish_reason");
    cr_expect_str_eq (JS (fr, "type"), "length");
    cr_expect_eq (JI (fr, "length"), 16);
    mi = json_object_get (json_array_get (o, 1), "meta_info");
    cr_expect_str_eq (JS (json_object_get (mi, "finish_reason"), "matched"), "\n");
    cr_expect_eq (JI (mi, "cached_tokens"), 5);
    cr_expect_null (json_object_get (mi, "output_token_logprobs"));
    json_decref (o);
    free (js);
    /* a stream event: cumulative text, finish_reason null while running */
    struct rx_api_choice run = { .text = "Hi", .len = 2, .matched_id = -1 };
    cr_assert_eq (rx_api_generate_chunk ("r", &run, &u, -1, &js), RX_OK);
    o = s_sse (js);
    cr_expect_str_eq (JS (o, "text"), "Hi");
    cr_expect (json_is_null (json_object_get (json_object_get (o, "meta_info"), "finish_reason")));
    cr_expect_null (json_object_get (o, "index"));
    json_decref (o);
    free (js);
    /* n > 1: every event says which sequence it is for */
    cr_assert_eq (rx_api_generate_chunk ("r", &run, &u, 1, &js), RX_OK);
    o = s_sse (js);
    cr_expect_eq (JI (o, "index"), 1);
    cr_expect_str_eq (JS (o, "text"), "Hi");
    json_decref (o);
    free (js);
}

Test (api_resp, error_json)
{
    struct rx_api_error e;
    cr_expect_eq (rx_api_error_set (&e, 400, "invalid_value", "top_p", "bad %s", "value"), RX_EINVAL);
    char *js;
    cr_assert_eq (rx_api_error_json (&e, &js), RX_OK);
    cr_expect_str_eq (js, "{\"error\":{\"message\":\"bad value\",\"type\":\"invalid_request_error\","
                          "\"param\":\"top_p\",\"code\":\"invalid_value\"}}");
    free (js);
    cr_expect_eq (rx_api_error_set (&e, 503, NULL, NULL, "busy"), RX_EINTERNAL);
    cr_assert_eq (rx_api_error_json (&e, &js), RX_OK);
    cr_expect_str_eq (js, "{\"error\":{\"message\":\"busy\",\"type\":\"server_error\",\"param\":null,"
                          "\"code\":null}}");
    free (js);
    cr_expect_eq (rx_api_error_set (NULL, 400, NULL, NULL, "x"), RX_EINVAL);
}

/* ---- fuzz corpus and regressions -------------------------------------- */

static char *s_slurp (const char *path, size_t *len)
{
    FILE *f = fopen (path, "rb");
    if (!f) return NULL;
    fseek (f, 0, SEEK_END);
    long n = ftell (f);
    fseek (f, 0, SEEK_SET);
    char *b = malloc ((size_t) n + 1);
    *len = fread (b, 1, (size_t) n, f);
    fclose (f);
    return b;
}

/* Every parser on one body: success, or one 4xx error with a message. */
static void s_replay (const char *body, size_t len, const char *name)
{
    parse_fn fns[] = { CMPL, CHAT, GEN };
    for (size_t i = 0; i < 3; i++) {
        struct rx_request r;
        struct rx_api_error e = { 0 };
        int rc = fns[i] (body, len, &s_ctx, &r, &e);
        if (rc != RX_OK) {
            cr_expect (e.status == 400 || e.status == 404, "%s: status %d", name, e.status);
            cr_expect (e.message[0] != '\0', "%s: empty message", name);
            char *js;
            cr_expect_eq (rx_api_error_json (&e, &js), RX_OK);
            free (js);
        } else {
            cr_expect (r.n_input > 0 && r.n_input < CTX, "%s: %u input ids", name, r.n_input);
            cr_expect (r.sp.max_tokens >= 0 && (int64_t) r.n_input + r.sp.max_tokens <= CTX, "%s", name);
        }
        rx_request_free (&r);
    }
    int32_t *ids;
    size_t n;
    struct rx_api_error e;
    if (rx_api_parse_tokenize (body, len, &s_ctx, &ids, &n, &e) == RX_OK) free (ids);
    if (rx_api_parse_detokenize (body, len, &s_ctx, &ids, &n, &e) == RX_OK) free (ids);
    char *rid;
    int all;
    if (rx_api_parse_abort (body, len, &rid, &all, &e) == RX_OK) free (rid);
}

static size_t s_replay_dir (const char *sub)
{
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fuzz/%s", tu_env ("RX_TOP_SRCDIR"), sub);
    DIR *d = opendir (dir);
    cr_assert_not_null (d, "%s", dir);
    size_t count = 0;
    struct dirent *de;
    while ((de = readdir (d))) {
        if (de->d_name[0] == '.' || strcmp (de->d_name, "README") == 0) continue;
        char *p = tu_path (dir, de->d_name);
        size_t len;
        char *b = s_slurp (p, &len);
        cr_assert_not_null (b, "%s", p);
        s_replay (b, len, p);
        free (b);
        free (p);
        count++;
    }
    closedir (d);
    return count;
}

Test (api, fuzz_corpus_and_regressions)
{
    cr_expect_geq (s_replay_dir ("corpus/api"), 20u);
    s_replay_dir ("regressions-api");
}
