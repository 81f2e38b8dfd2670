/* core/request.c -- sampling parameter defaults and range checks, request
 * release.  The ranges are SGLang's (sglang/srt/sampling/sampling_params.py,
 * SamplingParams.verify) so a client that works against SGLang gets the same
 * answers here; see request.h. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

void rx_sampling_params_init (struct rx_sampling_params *p)
{
    memset (p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = -1;
    p->min_p = 0.0f;
    p->frequency_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = -1;
    p->min_tokens = 0;
    p->n = 1;
    p->top_logprobs = 0;
    p->skip_special_tokens = 1;
}

/* Messages begin with the field name: the API layer maps it to "param". */
int rx_sampling_params_validate (const struct rx_sampling_params *p, struct rx_err *err)
{
    /* !(x >= 0) also catches NaN, which no JSON number gives but IPC might. */
    if (!(p->temperature >= 0.0f) || isinf (p->temperature))
        return rx_err_set (err, RX_EINVAL, "temperature must be >= 0 (got %g)", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return rx_err_set (err, RX_EINVAL, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (p->top_k != -1 && p->top_k < 1)
        return rx_err_set (err, RX_EINVAL, "top_k must be -1 (disabled) or >= 1 (got %d)", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return rx_err_set (err, RX_EINVAL, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return rx_err_set (err, RX_EINVAL, "frequency_penalty must be in [-2, 2] (got %g)",
                           p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return rx_err_set (err, RX_EINVAL, "presence_penalty must be in [-2, 2] (got %g)",
                           p->presence_penalty);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 2.0f))
        return rx_err_set (err, RX_EINVAL, "repetition_penalty must be in (0, 2] (got %g)",
                           p->repetition_penalty);
    if (p->max_tokens < -1)
        return rx_err_set (err, RX_EINVAL, "max_tokens must be >= 0 (got %d)", p->max_tokens);
    if (p->min_tokens < 0)
        return rx_err_set (err, RX_EINVAL, "min_tokens must be >= 0 (got %d)", p->min_tokens);
    if (p->max_tokens >= 0 && p->min_tokens > p->max_tokens)
        return rx_err_set (err, RX_EINVAL, "min_tokens must be <= max_tokens (got %d > %d)",
                           p->min_tokens, p->max_tokens);
    if (p->n < 1 || p->n > RX_MAX_N)
        return rx_err_set (err, RX_EINVAL, "n must be in [1, %d] (got %d)", RX_MAX_N, p->n);
    if (p->top_logprobs < 0 || p->top_logprobs > RX_MAX_TOP_LOGPROBS)
        return rx_err_set (err, RX_EINVAL, "top_logprobs must be in [0, %d] (got %d)",
                           RX_MAX_TOP_LOGPROBS, p->top_logprobs);
    if (p->n_stop > RX_MAX_STOP)
        return rx_err_set (err, RX_EINVAL, "stop: at most %d stop strings (got %u)", RX_MAX_STOP,
                           p->n_stop);
    for (uint32_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return rx_err_set (err, RX_EINVAL, "stop[%u] must not be an empty string", i);
    if (p->n_stop_ids > RX_MAX_STOP_IDS)
        return rx_err_set (err, RX_EINVAL, "stop_token_ids: at most %d ids (got %u)",
                           RX_MAX_STOP_IDS, p->n_stop_ids);
    for (uint32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0)
            return rx_err_set (err, RX_EINVAL, "stop_token_ids[%u] must be >= 0 (got %d)", i,
                               p->stop_ids[i]);
    return RX_OK;
}

void rx_sampling_params_fini (struct rx_sampling_params *p)
{
    for (uint32_t i = 0; i < p->n_stop && i < RX_MAX_STOP; i++)
        free (p->stop[i]);
    rx_sampling_params_init (p);
}

void rx_request_free (struct rx_request *r)
{
    if (!r) return;
    free (r->input_ids);
    free (r->model);
    free (r->ext_id);
    rx_sampling_params_fini (&r->sp);
    struct rx_sampling_params sp = r->sp;
    memset (r, 0, sizeof *r);
    r->sp = sp;
}
