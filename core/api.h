/* core/api.h -- radixd's HTTP API layer without the HTTP: request bodies of
 * the OpenAI and SGLang endpoints parsed and validated into an rx_request,
 * OpenAI-style errors, and the JSON / SSE texts of the answers.  Pure
 * functions over caller data (no sockets, no model), so every path can be
 * unit-tested and fuzzed (tests/unit/test_api.c, tests/fuzz/fuzz_api.c).
 *
 * Endpoints covered:
 *   POST /v1/completions       rx_api_parse_completion, rx_api_completion_response,
 *                              rx_api_completion_chunk
 *   POST /v1/chat/completions  rx_api_parse_chat, rx_api_chat_response,
 *                              rx_api_chat_chunk_role, rx_api_chat_chunk
 *   POST /generate             rx_api_parse_generate, rx_api_generate_response,
 *                              rx_api_generate_chunk (SGLang's native shape)
 *   GET  /v1/models            rx_api_models_response
 *   POST /tokenize, /detokenize, /abort_request  (parse + response)
 *
 * Choices made (and why):
 *  - Errors use OpenAI's shape exactly:
 *      {"error": {"message": "...", "type": "...", "param": "..."|null, "code": "..."|null}}
 *    (SGLang and vLLM add "object": "error" and a numeric "code"; OpenAI's
 *    own SDKs read message/type/param/code, so we keep the reference shape).
 *    type is "invalid_request_error" for every 4xx, also 404 model_not_found
 *    (what api.openai.com answers), "server_error" for 5xx.
 *  - Unknown top-level fields are ignored, as vLLM and SGLang do (OpenAI's
 *    SDKs pass extra_body fields at the top level, and clients send fields
 *    newer than us).  Known fields whose meaning we do not implement and
 *    whose silent omission would change the answer are a 400
 *    (code "unsupported_parameter"): tools / tool_choice (other than "none"),
 *    functions, function_call, response_format (other than {"type":"text"}),
 *    logit_bias (non-empty), suffix (non-empty), best_of (other than 1 or n),
 *    guided_*, regex, json_schema, ebnf, prompt_logprobs, echo + logprobs;
 *    /generate: input_embeds, image_data, lora_path, batch forms.
 *    Inside /generate's sampling_params every key must be known (SGLang
 *    passes them to SamplingParams(**kw), which refuses unknown names).
 *  - A known field with the wrong JSON type is always a 400 naming it in
 *    "param" (code "invalid_type"); JSON null means "not given" for every
 *    optional field.  Integers may be written 16 or 16.0 (pydantic's lax
 *    mode), not 16.5.  Out-of-range values are "invalid_value".  "stop": ""
 *    means no stop string (as OpenAI); an empty string inside a stop array
 *    is a 400.
 *  - Prompt length (vLLM's rule): a prompt of >= ctx_len tokens is a 400
 *    "context_length_exceeded"; ctx_len - 1 tokens is accepted.  max_tokens
 *    omitted = ctx->default_max_tokens, or the room left when that is <= 0,
 *    clamped to the room; then clamped to ctx->max_tokens_cap.  An explicit
 *    max_tokens with prompt + max_tokens > ctx_len is a 400 (vLLM before
 *    0.6; recent vLLM clamps) -- unless ctx->truncate, which keeps the last
 *    ctx_len - 1 prompt tokens (and BOS when the prompt began with it) and
 *    clamps max_tokens to the room.
 *  - Prompts: completion text and /generate text are encoded with BOS as the
 *    model says and control tokens written in the text recognised
 *    (RX_TOK_ADD_SPECIAL | RX_TOK_PARSE_SPECIAL: what a Hugging Face
 *    tokenizer, and so vLLM/SGLang, does); token-id prompts are used as given
 *    (no BOS added).  Chat messages are rendered with ctx->chat and encoded
 *    with RX_TOK_PARSE_SPECIAL only (chat.h).  A one-element batch ("prompt":
 *    ["text"] or [[ids]]) is taken as that prompt; larger batches are a 400.
 *  - Invalid UTF-8 anywhere in a body is a 400 (code "invalid_utf8") naming
 *    the byte offset; jansson refuses it while loading, before any field is
 *    known.  Text we emit (decoded tokens may end in the middle of a UTF-8
 *    sequence) is made valid with U+FFFD replacements; logprob "bytes" keep
 *    the raw bytes.
 *  - -inf / NaN logprobs (JSON has neither) are written as -9999.0, as vLLM.
 *
 * Ownership: parse functions fill *out (which owns its arrays; release with
 * rx_request_free) on success, and leave it empty on failure (freeing it
 * then is harmless).  Builders return a new NUL-terminated string in *json
 * or *sse (caller frees with free()).  Nothing here keeps state; all
 * functions are thread-safe. */
#ifndef RX_API_H
#define RX_API_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "chat.h"
#include "request.h"
#include "tokenizer.h"

/* ---- errors ----------------------------------------------------------- */

#define RX_API_MSG_MAX   512
#define RX_API_PARAM_MAX 64

/* An HTTP error the server answers with.  type and code point to static
 * strings; param and message are copies.  param "" and code NULL are
 * written as JSON null. */
struct rx_api_error {
    int status;                     /* HTTP status: 400, 404, 500 */
    const char *type;               /* "invalid_request_error", "server_error" */
    const char *code;               /* "invalid_json", "invalid_type", "invalid_value",
                                     * "missing_required_parameter", "unsupported_parameter",
                                     * "unknown_parameter", "invalid_utf8",
                                     * "context_length_exceeded",
                                     * "model_not_found", "internal_error"; or NULL */
    char param[RX_API_PARAM_MAX];   /* the offending field ("temperature", "messages[1].role"), or "" */
    char message[RX_API_MSG_MAX];   /* one line for the client */
};

/* Fill *e (if non-NULL): type follows from status (>= 500 "server_error",
 * else "invalid_request_error").  param may be NULL.  Returns RX_EINVAL for
 * status < 500, RX_EINTERNAL otherwise, so `return rx_api_error_set (...)`
 * works in parse code. */
#if defined(__GNUC__)
__attribute__ ((format (printf, 5, 6)))
#endif
int rx_api_error_set (struct rx_api_error *e, int status, const char *code, const char *param,
                      const char *fmt, ...);
/* The same with a va_list (for the servers' own printf-like reply helpers). */
int rx_api_error_vset (struct rx_api_error *e, int status, const char *code, const char *param,
                       const char *fmt, va_list ap);

/* {"error": {"message", "type", "param", "code"}}.  RX_ENOMEM only. */
int rx_api_error_json (const struct rx_api_error *e, char **json);

/* ---- request parsing -------------------------------------------------- */

/* What the parser needs to know about the served model.  Borrowed for the
 * call. */
struct rx_api_ctx {
    const rx_tokenizer_t *tok;            /* required */
    const struct rx_chat_template *chat;  /* NULL: chat requests are a 400 */
    const char *const *models;            /* served model names (n_models >= 1); the
                                           * first answers requests that name none */
    size_t n_models;
    int32_t ctx_len;                      /* context length in tokens (>= 2) */
    int32_t n_vocab;                      /* ids must be in [0, n_vocab); 0 = tokenizer's */
    int32_t default_max_tokens;           /* max_tokens when the client gives none; <= 0 =
                                           * the room left in the context */
    int32_t max_tokens_cap;               /* server maximum for max_tokens; <= 0 = none */
    int truncate;                         /* 1: keep the tail of over-long prompts */
};

/* POST /v1/completions.  OpenAI fields: model, prompt (string, token ids,
 * or a one-element batch of either), max_tokens, temperature, top_p, n,
 * stream, stream_options.include_usage, stop (string or array), seed,
 * logprobs (integer 0..20: top alternatives per token), echo,
 * frequency_penalty, presence_penalty, user (ignored); SGLang/vLLM
 * extensions: top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
 * stop_token_ids, skip_special_tokens.  Returns RX_OK, or RX_EINVAL (4xx) /
 * RX_ENOMEM / RX_EINTERNAL (5xx) with *err filled. */
int rx_api_parse_completion (const char *body, size_t len, const struct rx_api_ctx *ctx,
                             struct rx_request *out, struct rx_api_error *err);

/* POST /v1/chat/completions.  As completions, with messages (array of
 * {role: system|developer|user|assistant, content: string | [{type: "text",
 * text}] | null}) instead of prompt and echo, max_completion_tokens
 * (preferred over max_tokens), logprobs (bool) and top_logprobs (0..20,
 * needs logprobs: true). */
int rx_api_parse_chat (const char *body, size_t len, const struct rx_api_ctx *ctx,
                       struct rx_request *out, struct rx_api_error *err);

/* POST /generate (SGLang): text or input_ids, sampling_params
 * {max_new_tokens, min_new_tokens, temperature, top_p, top_k, min_p,
 * frequency_penalty, presence_penalty, repetition_penalty, stop,
 * stop_token_ids, ignore_eos, skip_special_tokens, n, sampling_seed (alias
 * seed), no_stop_trim, spaces_between_special_tokens (accepted, no effect)},
 * stream, rid (string, kept in out->ext_id), return_logprob,
 * top_logprobs_num.  max_new_tokens 0 is allowed here (prefill only). */
int rx_api_parse_generate (const char *body, size_t len, const struct rx_api_ctx *ctx,
                           struct rx_request *out, struct rx_api_error *err);

/* POST /tokenize (vLLM/SGLang): {model?, prompt: string, add_special_tokens?
 * (default true)} or {model?, messages: [...]} (rendered like chat, then
 * encoded without BOS).  *ids new (free()), may be NULL when *n == 0. */
int rx_api_parse_tokenize (const char *body, size_t len, const struct rx_api_ctx *ctx,
                           int32_t **ids, size_t *n, struct rx_api_error *err);

/* POST /detokenize: {model?, tokens: [ids]}; ids checked against the
 * vocabulary.  *ids new (free()), may be NULL when *n == 0. */
int rx_api_parse_detokenize (const char *body, size_t len, const struct rx_api_ctx *ctx,
                             int32_t **ids, size_t *n, struct rx_api_error *err);

/* POST /abort_request (SGLang): {rid: string} or {abort_all: true}.  *rid is
 * a new string (free()) or NULL when *all is set. */
int rx_api_parse_abort (const char *body, size_t len, char **rid, int *all,
                        struct rx_api_error *err);

/* ---- responses -------------------------------------------------------- */

enum rx_api_finish {
    RX_API_FINISH_NONE   = 0,   /* still running (stream chunks): null */
    RX_API_FINISH_STOP   = 1,   /* EOS, a stop string or a stop token: "stop" */
    RX_API_FINISH_LENGTH = 2,   /* max_tokens or the context: "length" */
    RX_API_FINISH_ABORT  = 3    /* aborted: "abort" (vLLM's word) */
};

/* One alternative token of a logprobs entry. */
struct rx_api_top_logprob {
    int32_t id;
    const char *text;             /* the token's bytes (need not be valid UTF-8) */
    size_t len;
    float logprob;
};

/* The sampled token at one position, with its top alternatives. */
struct rx_api_token_logprob {
    int32_t id;
    const char *text;
    size_t len;
    float logprob;
    uint32_t n_top;
    const struct rx_api_top_logprob *top;
};

/* One generated sequence.  logprobs NULL: the field is null (not asked). */
struct rx_api_choice {
    const char *text;             /* the whole output (or, in chunks, the delta) */
    size_t len;
    int finish;                   /* enum rx_api_finish */
    int32_t matched_id;           /* /generate: the stop token that ended it, or -1 */
    const char *matched_str;      /* /generate: the stop string that ended it, or NULL */
    const struct rx_api_token_logprob *logprobs;
    size_t n_logprobs;
    uint32_t text_offset;         /* completions logprobs: byte offset of the first token's
                                   * text in the whole output (stream chunks, echo) */
};

struct rx_api_usage {
    int32_t prompt_tokens;
    int32_t completion_tokens;    /* over all choices */
    int32_t cached_tokens;        /* prompt tokens served from the prefix cache */
};

/* Identity of one response (and of all its chunks). */
struct rx_api_meta {
    const char *id;               /* "cmpl-...", "chatcmpl-..." (rx_api_make_id) */
    const char *model;
    int64_t created;              /* Unix seconds */
    int include_usage;            /* stream_options.include_usage: chunks carry "usage": null */
};

/* "<prefix>-<rid as 16 hex digits>" into buf (NUL-terminated, truncated to size). */
void rx_api_make_id (char *buf, size_t size, const char *prefix, uint64_t rid);

/* {"id","object":"text_completion","created","model","choices":[{"index",
 * "text","logprobs":{"tokens","token_logprobs","top_logprobs","text_offset"}
 * | null,"finish_reason"}],"usage":{...}}.  usage may be NULL (omitted). */
int rx_api_completion_response (const struct rx_api_meta *m, const struct rx_api_choice *c,
                                size_t n, const struct rx_api_usage *u, char **json);

/* {"id","object":"chat.completion","created","model","choices":[{"index",
 * "message":{"role":"assistant","content"},"logprobs":{"content":[{"token",
 * "logprob","bytes","top_logprobs":[...]}]} | null,"finish_reason"}],"usage"}. */
int rx_api_chat_response (const struct rx_api_meta *m, const struct rx_api_choice *c,
                          size_t n, const struct rx_api_usage *u, char **json);

/* SSE chunks: each "data: {...}\n\n".  c->text is the delta, c->finish
 * NONE until the last chunk of that choice (whose delta may be empty). */
int rx_api_completion_chunk (const struct rx_api_meta *m, uint32_t index,
                             const struct rx_api_choice *c, char **sse);
/* The first chunk of each chat choice: delta {"role":"assistant","content":""}. */
int rx_api_chat_chunk_role (const struct rx_api_meta *m, uint32_t index, char **sse);
/* A chat content delta: delta {"content": text} (delta {} when the text is
 * empty and the chunk only carries finish_reason). */
int rx_api_chat_chunk (const struct rx_api_meta *m, uint32_t index, const struct rx_api_choice *c,
                       char **sse);
/* The usage chunk sent last when include_usage: "choices": [] and usage.
 * chat selects the object name ("chat.completion.chunk" / "text_completion"). */
int rx_api_usage_chunk (const struct rx_api_meta *m, int chat, const struct rx_api_usage *u,
                        char **sse);
/* "data: [DONE]\n\n" (static). */
const char *rx_api_sse_done (void);

/* {"object":"list","data":[{"id","object":"model","created","owned_by",
 * "max_model_len"}...]}. */
int rx_api_models_response (const char *const *names, size_t n, int64_t created,
                            const char *owned_by, int32_t max_model_len, char **json);

/* SGLang /generate: {"text", "meta_info": {"id", "finish_reason": {"type":
 * "stop","matched": id|string|null} | {"type":"length","length": N} |
 * {"type":"abort"} | null, "prompt_tokens", "completion_tokens",
 * "cached_tokens"[, "output_token_logprobs": [[logprob, id, text]...],
 * "output_top_logprobs": [[[logprob, id, text]...]...]]}}.  us: one usage
 * per choice (SGLang counts per sequence).  n == 1: that object; n > 1: an
 * array of them, as SGLang answers a request with n > 1. */
int rx_api_generate_response (const char *id, const struct rx_api_choice *c, size_t n,
                              const struct rx_api_usage *us, char **json);
/* A streamed /generate event: "data: <the object above>\n\n".  SGLang
 * streams the cumulative text so far, not a delta.  index >= 0 (a request
 * with n > 1) adds "index": index, saying which sequence the event is for,
 * as SGLang does; -1 leaves it out. */
int rx_api_generate_chunk (const char *id, const struct rx_api_choice *c,
                           const struct rx_api_usage *u, int index, char **sse);

/* /tokenize: {"tokens": [...], "count": n, "max_model_len": ctx_len}. */
int rx_api_tokenize_response (const int32_t *ids, size_t n, int32_t max_model_len, char **json);
/* /detokenize: {"prompt": text} (text made valid UTF-8). */
int rx_api_detokenize_response (const char *text, size_t len, char **json);

#endif
