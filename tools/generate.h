/* tools/generate.h -- the generation loop shared by `radix generate` and
 * `radix chat`: feed a prompt into a sequence (in steps of at most the
 * engine's max_tokens), then sample token after token.  Not thread-safe. */
#ifndef RX_TOOLS_GENERATE_H
#define RX_TOOLS_GENERATE_H

#include <stdint.h>

#include <radix/err.h>

#include "engine.h"
#include "sampling.h"

struct rx_gen_stats {
    int32_t n_prompt;     /* tokens fed */
    int32_t n_gen;        /* tokens sampled */
    double  t_prompt;     /* seconds: prompt steps (until the first sampled token) */
    double  t_gen;        /* seconds: the decode steps after it */
};

/* Called for every sampled token; return nonzero to stop (the token counts
 * as generated but is not fed back). */
typedef int (*rx_gen_token_fn) (void *ud, int32_t id);

/* Append prompt[0..n_prompt) (n_prompt >= 1) to seq, then sample up to
 * max_new tokens, feeding each back.  Stops early when cb says so or the
 * sequence is full (reported as RX_OK with fewer tokens; *full set if not
 * NULL).  Allocates one row of logits per call, nothing per token. */
int rx_gen_run (rx_engine_t *e, int32_t seq, const int32_t *prompt, int32_t n_prompt,
                int32_t max_new, rx_sampler_t *smp, rx_gen_token_fn cb, void *ud,
                struct rx_gen_stats *st, int *full, struct rx_err *err);

/* Seconds from a monotonic clock. */
double rx_gen_now (void);

/* Parse helpers for the CLI options (exit status 2 on error, message on
 * stderr naming the option). */
int rx_gen_parse_int (const char *opt, const char *s, long lo, long hi, long *out);
int rx_gen_parse_float (const char *opt, const char *s, double lo, double hi, double *out);

/* The long options both commands take (struct option entries); the
 * sampling ones are handled by rx_gen_sampling_opt, --threads (j) and
 * --ctx (C) by each command. */
#define RX_GEN_COMMON_OPTIONS                                 \
    { "temperature", required_argument, NULL, 't' },          \
    { "top-k", required_argument, NULL, 'k' },                \
    { "top-p", required_argument, NULL, 'P' },                \
    { "min-p", required_argument, NULL, 'M' },                \
    { "seed", required_argument, NULL, 's' },                 \
    { "threads", required_argument, NULL, 'j' },              \
    { "ctx", required_argument, NULL, 'C' }

/* The sampling options both commands take: --temperature (t), --top-k (k),
 * --top-p (P), --min-p (M), --seed (s).  Returns 1 if c was one of them and
 * was applied to sp, 0 if c is another option, -1 on a bad value (message
 * on stderr). */
int rx_gen_sampling_opt (int c, const char *arg, struct rx_sampling *sp);

#endif
