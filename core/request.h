/* core/request.h -- a generation request as it travels through radixd:
 * parsed from HTTP (core/api.c), carried over IPC (core/ipc_msg.c) to the
 * scheduler, which samples with these parameters.
 *
 * Ranges follow SGLang's validation (and OpenAI's where they overlap):
 *   temperature >= 0 (0 = greedy); 0 < top_p <= 1; top_k = -1 (off) or >= 1;
 *   0 <= min_p <= 1; -2 <= frequency_penalty, presence_penalty <= 2;
 *   0 < repetition_penalty <= 2; 0 <= min_tokens <= max_tokens;
 *   0 <= top_logprobs <= 20; n >= 1.
 * rx_sampling_params_validate checks them and names the offending field.
 *
 * Ownership: an rx_request owns its arrays and strings (heap); release with
 * rx_request_free. */
#ifndef RX_REQUEST_H
#define RX_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#define RX_MAX_STOP           16     /* stop strings per request */
#define RX_MAX_STOP_IDS       64     /* stop_token_ids per request */
#define RX_MAX_TOP_LOGPROBS   20
#define RX_MAX_N              64     /* completions per request */

struct rx_sampling_params {
    float    temperature;         /* default 1 */
    float    top_p;               /* default 1 */
    int32_t  top_k;               /* default -1 */
    float    min_p;               /* default 0 */
    float    frequency_penalty;   /* default 0 */
    float    presence_penalty;    /* default 0 */
    float    repetition_penalty;  /* default 1 */
    int32_t  max_tokens;          /* default: -1 = "until the context is full" */
    int32_t  min_tokens;          /* default 0 */
    int32_t  n;                   /* default 1 */
    int32_t  top_logprobs;        /* default 0 */
    uint8_t  logprobs;            /* default 0 */
    uint8_t  ignore_eos;          /* default 0 */
    uint8_t  has_seed;            /* seed given by the client */
    uint8_t  skip_special_tokens; /* default 1 */
    uint64_t seed;
    uint32_t n_stop;
    char    *stop[RX_MAX_STOP];   /* owned, NUL-terminated, non-empty */
    uint32_t n_stop_ids;
    int32_t  stop_ids[RX_MAX_STOP_IDS];
};

/* The defaults above; stop lists empty. */
void rx_sampling_params_init (struct rx_sampling_params *p);
/* RX_EINVAL with "temperature must be >= 0 (got -1)"-style messages;
 * err->msg begins with the field name. */
int  rx_sampling_params_validate (const struct rx_sampling_params *p, struct rx_err *err);
/* Free the stop strings and reset to defaults. */
void rx_sampling_params_fini (struct rx_sampling_params *p);

enum rx_request_kind {
    RX_REQ_COMPLETION = 1,   /* POST /v1/completions */
    RX_REQ_CHAT       = 2,   /* POST /v1/chat/completions */
    RX_REQ_GENERATE   = 3    /* POST /generate (SGLang native) */
};

struct rx_request {
    uint64_t rid;                 /* assigned by the main process */
    int32_t  kind;                /* enum rx_request_kind */
    uint8_t  stream;              /* SSE */
    uint8_t  echo;                /* completions: echo the prompt */
    int32_t *input_ids;           /* owned; the tokenized prompt (after templating) */
    uint32_t n_input;
    struct rx_sampling_params sp;
    /* Appended by the API layer (core/api.c); main process only, not
     * carried over IPC. */
    uint8_t  include_usage;       /* stream_options.include_usage */
    char    *model;               /* owned: the served name asked for (never NULL after parsing) */
    char    *ext_id;              /* owned: /generate's client "rid", or NULL */
};

/* Free what r owns (input_ids, stop strings, model, ext_id) and reset it to
 * an empty request with default sampling params; r itself is the caller's. */
void rx_request_free (struct rx_request *r);

#endif
