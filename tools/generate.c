/* tools/generate.c -- `radix generate`: continue a prompt with a model.
 *
 *   radix generate --model F.gguf --prompt "..." [--max-tokens N]
 *                  [--temperature T] [--top-k K] [--top-p P] [--min-p P]
 *                  [--seed S] [--threads N] [--ctx N] [--ids] [--ignore-eos]
 *                  [--config FILE]
 *
 * Prints the continuation as it is generated (with --ids: one line of the
 * generated token ids, space-separated), then the prompt and generation
 * speeds on stderr.  Greedy by default (temperature 0); stops at an
 * end-of-generation token unless --ignore-eos.  The prompt is tokenized as
 * llama.cpp does: BOS added when the model says so, control tokens written
 * in the text recognised.  --config reads an INI ([kernels] threads,
 * [attention], [model] path, [plugins] path ...); options override it. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "boot.h"
#include "commands.h"
#include "detok.h"
#include "engine.h"
#include "generate.h"
#include "sampling.h"
#include "tokenizer.h"

double rx_gen_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

int rx_gen_parse_int (const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol (s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf (stderr, "radix: --%s \"%s\": expected an integer in %ld..%ld\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int rx_gen_parse_float (const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod (s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf (stderr, "radix: --%s \"%s\": expected a number in %g..%g\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int rx_gen_sampling_opt (int c, const char *arg, struct rx_sampling *sp)
{
    double dv;
    long lv;
    switch (c) {
    case 't':
        if (rx_gen_parse_float ("temperature", arg, 0, 100, &dv)) return -1;
        sp->temperature = (float) dv;
        return 1;
    case 'k':
        if (rx_gen_parse_int ("top-k", arg, 0, INT32_MAX, &lv)) return -1;
        sp->top_k = (int32_t) lv;
        return 1;
    case 'P':
        if (rx_gen_parse_float ("top-p", arg, 1e-9, 1, &dv)) return -1;
        sp->top_p = (float) dv;
        return 1;
    case 'M':
        if (rx_gen_parse_float ("min-p", arg, 0, 0.999999, &dv)) return -1;
        sp->min_p = (float) dv;
        return 1;
    case 's': {
        char *end;
        errno = 0;
        unsigned long long v = strtoull (arg, &end, 10);
        if (errno || end == arg || *end || arg[0] == '-') {
            fprintf (stderr, "radix: --seed \"%s\": expected a non-negative integer\n", arg);
            return -1;
        }
        sp->seed = v;
        return 1;
    }
    default:
        return 0;
    }
}

int rx_gen_run (rx_engine_t *e, int32_t seq, const int32_t *prompt, int32_t n_prompt,
                int32_t max_new, rx_sampler_t *smp, rx_gen_token_fn cb, void *ud,
                struct rx_gen_stats *st, int *full, struct rx_err *err)
{
    const int32_t V = rx_engine_info (e)->n_vocab, T = rx_engine_max_tokens (e);
    memset (st, 0, sizeof *st);
    if (full) *full = 0;
    if (n_prompt < 1) return rx_err_set (err, RX_EINVAL, "generate: empty prompt");
    float *logits = malloc ((size_t) V * sizeof *logits);
    if (!logits) return rx_err_set (err, RX_ENOMEM, "generate: out of memory");
    int rc = RX_OK;
    double t0 = rx_gen_now ();
    for (int32_t off = 0; off < n_prompt && rc == RX_OK;) {
        int32_t n = n_prompt - off < T ? n_prompt - off : T;
        struct rx_engine_req r = { seq, n, prompt + off, 0 };
        rc = rx_engine_step (e, &r, 1, off + n == n_prompt ? logits : NULL, err);
        off += n;
    }
    st->n_prompt = n_prompt;
    double t1 = rx_gen_now ();
    st->t_prompt = t1 - t0;
    for (int32_t i = 0; i < max_new && rc == RX_OK; i++) {
        int32_t id = rx_sampler_sample (smp, logits);
        st->n_gen++;
        if (cb && cb (ud, id)) break;
        if (i + 1 == max_new) break;
        if (rx_engine_seq_room (e, seq) < 1) {
            if (full) *full = 1;
            break;
        }
        struct rx_engine_req r = { seq, 1, &id, 0 };
        rc = rx_engine_step (e, &r, 1, logits, err);
    }
    st->t_gen = rx_gen_now () - t1;
    free (logits);
    return rc;
}

/* ------------------------------------------------------------- command -- */

struct gen_out {
    const rx_tokenizer_t *tok;
    int ids, ignore_eos, first;
    struct rx_detok dt;
    FILE *f;
};

static int s_on_token (void *ud, int32_t id)
{
    struct gen_out *o = ud;
    if (!o->ignore_eos && o->tok && rx_tokenizer_is_eog (o->tok, id)) return 1;
    if (o->ids) {
        fprintf (o->f, "%s%d", o->first ? "" : " ", id);
        o->first = 0;
        return 0;
    }
    struct rx_detok_delta d;
    if (o->tok && rx_detok_push (&o->dt, id, &d, NULL) == RX_OK && d.len) {
        fwrite (d.text, 1, d.len, o->f);
        fflush (o->f);
    }
    return 0;
}

static void s_usage (FILE *f)
{
    fprintf (f,
             "usage: radix generate --model FILE.gguf --prompt TEXT [--max-tokens N]\n"
             "                      [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
             "                      [--threads N] [--ctx N] [--ids] [--ignore-eos] [--config FILE]\n"
             "  prints the continuation (--ids: the generated token ids on one line), then\n"
             "  prompt and generation speed on stderr.  Greedy unless --temperature > 0.\n");
}

int rx_cmd_generate (int argc, char **argv)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "prompt", required_argument, NULL, 'p' },
        { "max-tokens", required_argument, NULL, 'n' },
        RX_GEN_COMMON_OPTIONS,
        { "ids", no_argument, NULL, 'i' },
        { "ignore-eos", no_argument, NULL, 'E' },
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *model = NULL, *prompt = NULL, *config = NULL, *threads = NULL;
    long max_tokens = 64, ctx = 0, lv;
    int ids = 0, ignore_eos = 0;
    struct rx_sampling sp;
    rx_sampling_defaults (&sp);
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "m:p:n:t:k:s:j:c:ih", opts, NULL)) != -1) {
        int sc = rx_gen_sampling_opt (c, optarg, &sp);
        if (sc < 0) return 2;
        if (sc > 0) continue;
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'c': config = optarg; break;
        case 'i': ids = 1; break;
        case 'E': ignore_eos = 1; break;
        case 'n': if (rx_gen_parse_int ("max-tokens", optarg, 0, 1 << 24, &max_tokens)) return 2; break;
        case 'C': if (rx_gen_parse_int ("ctx", optarg, 1, INT32_MAX, &ctx)) return 2; break;
        case 'j': if (rx_gen_parse_int ("threads", optarg, 0, 4096, &lv)) return 2;
                  threads = optarg; break;
        case 'h': s_usage (stdout); return 0;
        default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "radix generate: unexpected argument \"%s\"\n", argv[optind]);
        s_usage (stderr);
        return 2;
    }
    if (!prompt) {
        fprintf (stderr, "radix generate: --prompt is required\n");
        s_usage (stderr);
        return 2;
    }

    struct rx_err err = { 0 };
    struct rx_boot b;
    if (rx_boot_open (&b, config, RX_BOOT_CHECK_REFS, &err) != RX_OK) {
        fprintf (stderr, "radix: %s\n", err.msg);
        return 1;
    }
    int status = 1;
    rx_engine_t *e = NULL;
    rx_tokenizer_t *tok = NULL;
    rx_sampler_t *smp = NULL;
    int32_t *pids = NULL;
    struct gen_out o = { .ids = ids, .ignore_eos = ignore_eos, .first = 1, .f = stdout };
    int have_dt = 0;
    if (threads && rx_conf_set (b.conf, "kernels", "threads", threads, &err) != RX_OK) goto out;
    struct rx_engine_opts eo = { .model_path = model, .n_slots = ctx, .max_tokens = 0 };
    if (!(e = rx_engine_new (&b, &eo, &err))) goto out;
    if (!(tok = rx_tokenizer_from_gguf (rx_engine_gguf (e), &err))) goto out;
    size_t np = 0;
    if (rx_tokenizer_encode (tok, prompt, strlen (prompt), RX_TOK_ADD_SPECIAL | RX_TOK_PARSE_SPECIAL,
                             &pids, &np, &err) != RX_OK)
        goto out;
    if (np == 0) {
        rx_err_set (&err, RX_EINVAL, "the prompt has no tokens (and the model adds no BOS)");
        goto out;
    }
    int64_t need = (int64_t) np + max_tokens;
    if (need > rx_engine_n_slots (e)) {
        rx_err_set (&err, RX_EINVAL, "prompt (%zu tokens) + --max-tokens %ld exceed the KV cache of %lld tokens (raise --ctx)",
                    np, max_tokens, (long long) rx_engine_n_slots (e));
        goto out;
    }
    int seq = rx_engine_seq_new (e, (int32_t) need, &err);
    if (seq < 0) goto out;
    if (!(smp = rx_sampler_new (&sp, rx_engine_info (e)->n_vocab, &err))) goto out;
    o.tok = tok;
    rx_detok_init (&o.dt, tok, 0);
    have_dt = 1;
    struct rx_gen_stats st;
    if (rx_gen_run (e, seq, pids, (int32_t) np, (int32_t) max_tokens, smp, s_on_token, &o, &st,
                    NULL, &err) != RX_OK)
        goto out;
    if (!ids) {
        struct rx_detok_delta d;
        if (rx_detok_finish (&o.dt, &d, NULL) == RX_OK && d.len) fwrite (d.text, 1, d.len, stdout);
    }
    fputc ('\n', stdout);
    fflush (stdout);
    /* The last sampled token is not fed back: n_gen - 1 decode steps. */
    int32_t steps = st.n_gen > 0 ? st.n_gen - 1 : 0;
    fprintf (stderr, "prompt: %d tokens in %.3f s (%.2f tok/s)\n", st.n_prompt, st.t_prompt,
             st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0.0);
    fprintf (stderr, "generation: %d tokens, %d decode steps in %.3f s (%.2f tok/s)\n", st.n_gen, steps,
             st.t_gen, st.t_gen > 0 ? steps / st.t_gen : 0.0);
    status = 0;
out:
    if (status != 0) fprintf (stderr, "radix generate: %s\n", err.msg[0] ? err.msg : "failed");
    if (have_dt) rx_detok_fini (&o.dt);
    free (pids);
    rx_sampler_destroy (&smp);
    rx_tokenizer_free (&tok);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    return status;
}
