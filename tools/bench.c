/* tools/bench.c -- `radix bench`: prompt-processing, generation and batched
 * decode speed of one model, in the shape of llama.cpp's llama-bench so the
 * two can be compared side by side (bench/compare-llamacpp.sh).
 *
 *   radix bench --model F.gguf [--threads T] [--config FILE]
 *               [--pp LIST] [--tg N] [--batch LIST] [--reps N] [--bw-mib N] [--json]
 *               [--greedy] [--sample K] [--depth LIST]
 *
 * Tests (each from an empty KV cache, with pseudo-random token ids, as
 * llama-bench does; see --depth):
 *   ppN   one sequence, N prompt tokens in steps of at most 512 tokens
 *         (llama-bench's default ubatch), logits of the last token only;
 *   tgN   one sequence, N decode steps of one token, logits copied to the
 *         host every step (no sampling: llama-bench does not sample);
 *   tgN@bB  B sequences decoding together, N steps of B tokens (batched
 *         decode; B = 1 repeats tgN).
 * --greedy: every step returns the device argmax of its output rows
 * instead of copying their logits (rx_engine_step_ids), as radixd's greedy
 * requests do; on a GPU that leaves the n_vocab floats per row on the
 * device.
 * --sample K: --greedy, and every step also computes the device sampling
 * candidates of its output rows (softmax at temperature 1, the K most
 * likely tokens, copied back: rx_engine_step_sample), the device's share
 * of radixd's [scheduler] device_sampling; no host draw.
 * --depth LIST (llama-bench's -d): every test runs once per depth D, its
 * sequences first filled with D pseudo-random tokens (untimed, in steps
 * of at most 512 tokens; the test's name gains "@dD").  The fill is done
 * once per test: each run cuts the sequences back to D tokens
 * (rx_engine_seq_truncate) and writes its tokens after them, so a run
 * measures the same work as a fresh fill would give.  Long-context
 * decode, where attention reads D tokens of KV per row per layer.
 * Each test runs once untimed (warm-up: page faults, thread wake-up), then
 * --reps times; the table shows the median with min and max, in tok/s.
 *
 * Also printed: the model's weight bytes, the machine's read bandwidth
 * measured here with `threads` threads (a plain streaming-read loop over a
 * buffer of --bw-mib MiB, default 1 GiB, larger than any cache; best of 3),
 * and the roofline ratio of tg:
 * weight bytes x tok/s / bandwidth -- batch-1 decode reads every weight once
 * per token, so 1.0 is the memory-bound ceiling. */
#include "config.h"

#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot.h"
#include "commands.h"
#include "engine.h"
#include "generate.h"

#define S_MAX_LIST 16
#define S_UBATCH   512

/* ------------------------------------------------------- read bandwidth -- */

struct s_bw {
    const uint64_t *p;
    size_t n;          /* uint64_t words */
    uint64_t sum;
};

/* Eight independent accumulators per cache line keep enough loads in flight
 * for one core to stream at close to its share of the memory bandwidth; the
 * AVX2 build of the loop (vectorised by the compiler, as bench/kernels does)
 * reads about 40% more per core than the scalar one on the benchmark box. */
#define S_BW_LOOP                                                                         \
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;              \
    for (size_t i = 0; i + 8 <= b->n; i += 8) {                                           \
        a0 ^= b->p[i]; a1 ^= b->p[i + 1]; a2 ^= b->p[i + 2]; a3 ^= b->p[i + 3];           \
        a4 ^= b->p[i + 4]; a5 ^= b->p[i + 5]; a6 ^= b->p[i + 6]; a7 ^= b->p[i + 7];       \
    }                                                                                     \
    b->sum = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;

static void s_bw_scan (struct s_bw *b) { S_BW_LOOP }

#if defined(__x86_64__)
__attribute__ ((target ("avx2"))) static void s_bw_scan_avx2 (struct s_bw *b) { S_BW_LOOP }
#endif

static void *s_bw_thread (void *arg)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports ("avx2")) {
        s_bw_scan_avx2 (arg);
        return NULL;
    }
#endif
    s_bw_scan (arg);
    return NULL;
}

/* GB/s (1e9 bytes) read by `threads` threads over `bytes`, best of `tries`;
 * 0 when memory or threads cannot be had. */
static double s_read_bw (size_t bytes, int threads, int tries)
{
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    uint64_t *buf = aligned_alloc (64, bytes);
    if (!buf) return 0;
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_t tid[64];
    struct s_bw b[64];
    size_t per = bytes / 8 / (size_t) threads / 8 * 8;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int t = 0; t < tries; t++) {
        int started = 0;
        double t0 = rx_gen_now ();
        for (int i = 0; i < threads; i++) {
            b[i] = (struct s_bw) { buf + (size_t) i * per, per, 0 };
            if (pthread_create (&tid[i], NULL, s_bw_thread, &b[i]) != 0) break;
            started++;
        }
        for (int i = 0; i < started; i++) {
            pthread_join (tid[i], NULL);
            sink ^= b[i].sum;
        }
        double dt = rx_gen_now () - t0;
        double gbs = started && dt > 0 ? (double) per * 8 * started / dt / 1e9 : 0;
        if (gbs > best) best = gbs;
    }
    (void) sink;
    free (buf);
    return best;
}

/* --------------------------------------------------------------- tests -- */

struct s_result {
    char   name[48];
    int    kind;        /* 0 pp, 1 tg, 2 batched */
    int    n;           /* tokens (pp) or steps (tg) */
    int    batch;
    int    depth;       /* tokens already in each sequence (--depth) */
    int    reps;
    double tps[64];     /* tok/s of each timed rep */
    double med, min, max;
};

static int s_cmp_double (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static void s_summarise (struct s_result *r)
{
    double s[64];
    memcpy (s, r->tps, sizeof (double) * (size_t) r->reps);
    qsort (s, (size_t) r->reps, sizeof s[0], s_cmp_double);
    r->min = s[0];
    r->max = s[r->reps - 1];
    r->med = r->reps % 2 ? s[r->reps / 2] : 0.5 * (s[r->reps / 2 - 1] + s[r->reps / 2]);
}

/* Deterministic token ids spread over the vocabulary (xorshift). */
static void s_tokens (int32_t *t, int n, int32_t n_vocab, uint64_t *state)
{
    for (int i = 0; i < n; i++) {
        uint64_t x = *state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *state = x;
        t[i] = (int32_t) (x % (uint64_t) n_vocab);
    }
}

struct s_ctx {
    rx_engine_t *e;
    int32_t V;
    int32_t *tok;       /* scratch token ids, max(pp, batch) */
    float *logits;      /* [max batch][V] */
    int32_t *ids;       /* [max batch]: --greedy, else NULL */
    struct rx_engine_cands cands;   /* --sample K: k > 0 */
    uint64_t rng;
};

/* A step returning ids (--greedy), with candidates too (--sample). */
static int s_step_ids (struct s_ctx *c, const struct rx_engine_req *req, int32_t n, struct rx_err *err)
{
    return c->cands.k > 0 ? rx_engine_step_sample (c->e, req, n, c->ids, &c->cands, err)
                          : rx_engine_step_ids (c->e, req, n, c->ids, err);
}

/* Appends n pseudo-random tokens to seq in steps of at most S_UBATCH
 * tokens; the last step's output (one row) goes to the host as logits, or
 * as the device argmax (--greedy) when want_out, else nowhere. */
static int s_fill (struct s_ctx *c, int seq, int n, int want_out, struct rx_err *err)
{
    int rc = RX_OK;
    for (int off = 0; off < n && rc == RX_OK;) {
        int k = n - off < S_UBATCH ? n - off : S_UBATCH;
        s_tokens (c->tok, k, c->V, &c->rng);
        struct rx_engine_req r = { seq, k, c->tok, 0 };
        int last = off + k == n;
        if (last && want_out && c->ids) rc = s_step_ids (c, &r, 1, err);
        else rc = rx_engine_step (c->e, &r, 1, last && want_out ? c->logits : NULL, err);
        off += k;
    }
    return rc;
}

/* One run of pp n on seq (already holding its depth): seconds, or < 0
 * with err set. */
static double s_run_pp (struct s_ctx *c, int seq, int n, struct rx_err *err)
{
    double t0 = rx_gen_now ();
    int rc = s_fill (c, seq, n, 1, err);
    double dt = rx_gen_now () - t0;
    return rc == RX_OK ? dt : -1;
}

/* One run of `steps` decode steps over `batch` sequences: seconds. */
static double s_run_tg (struct s_ctx *c, const int *seqs, int steps, int batch, struct rx_err *err)
{
    struct rx_engine_req req[64];
    int rc = RX_OK;
    double t0 = rx_gen_now ();
    for (int s = 0; s < steps && rc == RX_OK; s++) {
        s_tokens (c->tok, batch, c->V, &c->rng);
        for (int i = 0; i < batch; i++) req[i] = (struct rx_engine_req) { seqs[i], 1, c->tok + i, 0 };
        rc = c->ids ? s_step_ids (c, req, batch, err) : rx_engine_step (c->e, req, batch, c->logits, err);
    }
    double dt = rx_gen_now () - t0;
    return rc == RX_OK ? dt : -1;
}

static int s_run (struct s_ctx *c, struct s_result *r, struct rx_err *err)
{
    /* The test's sequences, each with room for its depth and one run's
     * tokens, filled to the depth once (untimed). */
    int seqs[64], ns = 0, nseq = r->kind == 0 ? 1 : r->batch, rc = RX_OK;
    for (; ns < nseq && rc == RX_OK; ns++) {
        seqs[ns] = rx_engine_seq_new (c->e, r->depth + r->n, err);
        if (seqs[ns] < 0) rc = seqs[ns];
        else if (r->depth > 0) rc = s_fill (c, seqs[ns], r->depth, 0, err);
        if (seqs[ns] < 0) break;
    }
    /* Warm-up run (untimed), then the timed ones.  A warm-up tg is short:
     * it only has to wake the threads and touch the weights once. */
    for (int i = -1; i < r->reps && rc == RX_OK; i++) {
        int n = r->n;
        if (i < 0 && r->kind != 0) n = n < 4 ? n : 4;
        for (int k = 0; k < ns && rc == RX_OK; k++) rc = rx_engine_seq_truncate (c->e, seqs[k], r->depth);
        if (rc != RX_OK) {
            rx_err_set (err, rc, "bench: cannot cut a sequence back to %d tokens", r->depth);
            break;
        }
        double dt = r->kind == 0 ? s_run_pp (c, seqs[0], n, err) : s_run_tg (c, seqs, n, r->batch, err);
        if (dt < 0) rc = RX_EINTERNAL;
        else if (i >= 0) r->tps[i] = dt > 0 ? (double) n * r->batch / dt : 0;
    }
    for (int k = 0; k < ns; k++) rx_engine_seq_free (c->e, seqs[k]);
    if (rc != RX_OK) return -1;
    s_summarise (r);
    return 0;
}

/* ------------------------------------------------------------- command -- */

/* "128,512" -> out[]; "" or "none" -> 0 entries.  -1 on a bad list. */
static int s_parse_list (const char *opt, const char *s, long lo, long hi, int *out, int *n)
{
    *n = 0;
    if (!*s || !strcmp (s, "none")) return 0;
    char buf[256];
    if (strlen (s) >= sizeof buf) {
        fprintf (stderr, "radix bench: --%s: list too long\n", opt);
        return -1;
    }
    strcpy (buf, s);
    char *save = NULL;
    for (char *p = strtok_r (buf, ",", &save); p; p = strtok_r (NULL, ",", &save)) {
        long v;
        if (*n == S_MAX_LIST) {
            fprintf (stderr, "radix bench: --%s: at most %d values\n", opt, S_MAX_LIST);
            return -1;
        }
        if (rx_gen_parse_int (opt, p, lo, hi, &v)) return -1;
        out[(*n)++] = (int) v;
    }
    if (*n == 0) {
        fprintf (stderr, "radix bench: --%s \"%s\": expected a comma-separated list\n", opt, s);
        return -1;
    }
    return 0;
}

static void s_usage (FILE *f)
{
    fprintf (f,
             "usage: radix bench --model FILE.gguf [--threads T] [--config FILE]\n"
             "                   [--pp LIST] [--tg N] [--batch LIST] [--reps N] [--bw-mib N] [--json]\n"
             "                   [--greedy] [--sample K] [--depth LIST]\n"
             "  prompt processing (--pp, default 128,512), generation (--tg, default 128)\n"
             "  and batched decode of --tg steps at each --batch size (default 1,4,16) in\n"
             "  tok/s: median (min..max) of --reps runs (default 3) after one warm-up.\n"
             "  Also prints the weight bytes, the measured read bandwidth and the\n"
             "  roofline ratio of tg (bytes x tok/s / bandwidth), bandwidth read over a\n"
             "  --bw-mib buffer (default 1024; 0 skips it).  --pp none, --tg 0 or\n"
             "  --batch none skip that part; --json prints one JSON object instead.\n"
             "  --greedy: each step returns the device argmax of its rows instead of\n"
             "  copying their logits to the host (as greedy serving does).\n"
             "  --sample K (1..4096): --greedy, and each step also computes the K most\n"
             "  likely tokens of every row on the device and copies them back (the\n"
             "  device's share of [scheduler] device_sampling).\n"
             "  --depth LIST (default 0): run every test at each depth D, its sequences\n"
             "  first filled with D tokens (untimed; names end in @dD), as llama-bench -d.\n");
}

static void s_json_str (FILE *f, const char *s)
{
    fputc ('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char) *s;
        if (ch == '"' || ch == '\\') fprintf (f, "\\%c", ch);
        else if (ch < 0x20) fprintf (f, "\\u%04x", ch);
        else fputc (ch, f);
    }
    fputc ('"', f);
}

int rx_cmd_bench (int argc, char **argv)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "threads", required_argument, NULL, 'j' },
        { "config", required_argument, NULL, 'c' },
        { "pp", required_argument, NULL, 'p' },
        { "tg", required_argument, NULL, 'n' },
        { "batch", required_argument, NULL, 'b' },
        { "reps", required_argument, NULL, 'r' },
        { "json", no_argument, NULL, 'J' },
        { "bw-mib", required_argument, NULL, 'B' },
        { "greedy", no_argument, NULL, 'G' },
        { "sample", required_argument, NULL, 'S' },
        { "depth", required_argument, NULL, 'd' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *model = NULL, *config = NULL, *threads = NULL;
    int pp[S_MAX_LIST] = { 128, 512 }, n_pp = 2;
    int bs[S_MAX_LIST] = { 1, 4, 16 }, n_bs = 3;
    int depth[S_MAX_LIST] = { 0 }, n_depth = 1;
    long tg = 128, reps = 3, bw_mib = 1024, lv;
    int json = 0, greedy = 0, c;
    long sample = 0;
    optind = 1;
    while ((c = getopt_long (argc, argv, "m:j:c:p:n:b:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'c': config = optarg; break;
        case 'J': json = 1; break;
        case 'G': greedy = 1; break;
        case 'S': if (rx_gen_parse_int ("sample", optarg, 1, 4096, &sample)) return 2;
                  greedy = 1; break;
        case 'j': if (rx_gen_parse_int ("threads", optarg, 1, 4096, &lv)) return 2;
                  threads = optarg; break;
        case 'p': if (s_parse_list ("pp", optarg, 1, 1 << 16, pp, &n_pp)) return 2; break;
        case 'b': if (s_parse_list ("batch", optarg, 1, 64, bs, &n_bs)) return 2; break;
        case 'd': if (s_parse_list ("depth", optarg, 0, 1 << 20, depth, &n_depth)) return 2;
                  if (n_depth == 0) depth[n_depth++] = 0;
                  break;
        case 'n': if (rx_gen_parse_int ("tg", optarg, 0, 1 << 16, &tg)) return 2; break;
        case 'r': if (rx_gen_parse_int ("reps", optarg, 1, 64, &reps)) return 2; break;
        case 'B': if (rx_gen_parse_int ("bw-mib", optarg, 0, 1 << 20, &bw_mib)) return 2; break;
        case 'h': s_usage (stdout); return 0;
        default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "radix bench: unexpected argument \"%s\"\n", argv[optind]);
        s_usage (stderr);
        return 2;
    }
    if (!model && !config) {
        fprintf (stderr, "radix bench: --model is required (or a --config naming [model] path)\n");
        s_usage (stderr);
        return 2;
    }
    if (tg == 0) n_bs = 0;

    /* KV room: the longest prompt, or the largest batch of tg-token
     * sequences, after the largest depth. */
    int64_t max_pp = 0, max_b = 1, max_d = 0, slots;
    for (int i = 0; i < n_pp; i++) max_pp = pp[i] > max_pp ? pp[i] : max_pp;
    for (int i = 0; i < n_bs; i++) max_b = bs[i] > max_b ? bs[i] : max_b;
    for (int i = 0; i < n_depth; i++) max_d = depth[i] > max_d ? depth[i] : max_d;
    slots = max_b * ((tg > 4 ? tg : 4) + max_d);
    if (n_pp > 0 && max_pp + max_d > slots) slots = max_pp + max_d;
    /* The largest step: a prompt (or depth) chunk, or a batch. */
    int64_t chunk = max_pp > max_d ? max_pp : max_d;
    int32_t max_tokens = (int32_t) (chunk < S_UBATCH ? chunk : S_UBATCH);
    if (max_tokens < max_b) max_tokens = (int32_t) max_b;

    struct rx_err err = { 0 };
    struct rx_boot b;
    if (rx_boot_open (&b, config, RX_BOOT_CHECK_REFS, &err) != RX_OK) {
        fprintf (stderr, "radix bench: %s\n", err.msg);
        return 1;
    }
    int status = 1, nthreads = 0;
    struct s_ctx cx = { 0 };
    float *inv_t = NULL;   /* --sample: 1 / temperature of every row */
    struct s_result res[(2 * S_MAX_LIST + 1) * S_MAX_LIST];
    int n_res = 0;
    if (threads && rx_conf_set (b.conf, "kernels", "threads", threads, &err) != RX_OK) goto out;
    struct rx_engine_opts eo = { .model_path = model, .n_slots = slots, .max_tokens = max_tokens };
    if (!(cx.e = rx_engine_new (&b, &eo, &err))) goto out;
    const struct rx_model_info *mi = rx_engine_info (cx.e);
    cx.V = mi->n_vocab;
    cx.rng = 0x2545F4914F6CDD1Dull;
    size_t ntok = (size_t) max_tokens;
    cx.tok = malloc (ntok * sizeof *cx.tok);
    cx.logits = malloc ((size_t) max_b * (size_t) cx.V * sizeof *cx.logits);
    if (greedy) cx.ids = malloc ((size_t) max_b * sizeof *cx.ids);
    if (sample > 0) {
        inv_t = malloc ((size_t) max_b * sizeof *inv_t);
        cx.cands.probs = malloc ((size_t) max_b * (size_t) sample * sizeof *cx.cands.probs);
        cx.cands.ids = malloc ((size_t) max_b * (size_t) sample * sizeof *cx.cands.ids);
        if (inv_t)
            for (int64_t i = 0; i < max_b; i++) inv_t[i] = 1.f;
        cx.cands.inv_t = inv_t;
        cx.cands.k = (int32_t) sample;
    }
    if (!cx.tok || !cx.logits || (greedy && !cx.ids) ||
        (sample > 0 && (!inv_t || !cx.cands.probs || !cx.cands.ids))) {
        rx_err_set (&err, RX_ENOMEM, "bench: out of memory for %lld logit rows", (long long) max_b);
        goto out;
    }
    /* 0 means one per CPU, as kernels-cpu reads it. */
    nthreads = (int) rx_conf_int (b.conf, "kernels", "threads", 0);
    if (nthreads <= 0) nthreads = (int) sysconf (_SC_NPROCESSORS_ONLN);

    /* Bandwidth first, while nothing else of ours runs.  1 GiB: server
     * parts have last-level caches of a few hundred MiB (260 MiB on the
     * box of docs/benchmarks.md), and the probe must measure memory. */
    double bw = bw_mib > 0 ? s_read_bw ((size_t) bw_mib << 20, nthreads, 3) : 0;

    /* Every test at every depth, depth by depth ("" at depth 0). */
    int tg_res = -1;   /* the batch-1 tg at depth 0: the roofline's */
    for (int d = 0; d < n_depth; d++) {
        char at[16] = "";
        if (depth[d] > 0) snprintf (at, sizeof at, "@d%d", depth[d]);
        for (int i = 0; i < n_pp; i++) {
            struct s_result *r = &res[n_res++];
            *r = (struct s_result) { .kind = 0, .n = pp[i], .batch = 1, .depth = depth[d], .reps = (int) reps };
            snprintf (r->name, sizeof r->name, "pp%d%s", pp[i], at);
        }
        if (tg > 0) {
            struct s_result *r = &res[n_res++];
            *r = (struct s_result) { .kind = 1, .n = (int) tg, .batch = 1, .depth = depth[d], .reps = (int) reps };
            snprintf (r->name, sizeof r->name, "tg%ld%s", tg, at);
            if (depth[d] == 0 && tg_res < 0) tg_res = n_res - 1;
        }
        for (int i = 0; i < n_bs; i++) {
            struct s_result *r = &res[n_res++];
            *r = (struct s_result) { .kind = 2, .n = (int) tg, .batch = bs[i], .depth = depth[d], .reps = (int) reps };
            snprintf (r->name, sizeof r->name, "tg%ld@b%d%s", tg, bs[i], at);
        }
    }
    for (int i = 0; i < n_res; i++) {
        if (!json && isatty (2)) {
            fprintf (stderr, "radix bench: %s ...\r", res[i].name);
            fflush (stderr);
        }
        if (s_run (&cx, &res[i], &err)) goto out;
    }
    if (!json && isatty (2)) fprintf (stderr, "%40s\r", "");

    /* Batch-1 decode at depth 0 reads every weight once a token (at a
     * depth it also reads the KV, which the roofline does not count). */
    double roof = -1;
    if (tg_res >= 0 && bw > 0) roof = (double) mi->weight_bytes * res[tg_res].med / (bw * 1e9);

    const char *name = model ? model : rx_gguf_path (rx_engine_gguf (cx.e));
    if (json) {
        printf ("{\"model\": ");
        s_json_str (stdout, name);
        printf (", \"engine\": ");
        s_json_str (stdout, rx_engine_describe (cx.e));
        printf (", \"threads\": %d, \"model_bytes\": %llu, \"n_params\": %llu, \"bandwidth_gbs\": %.3f, "
                "\"reps\": %ld, \"greedy\": %s, \"sample\": %ld, \"tests\": [",
                nthreads, (unsigned long long) mi->weight_bytes, (unsigned long long) mi->n_params, bw, reps,
                greedy ? "true" : "false", sample);
        for (int i = 0; i < n_res; i++) {
            struct s_result *r = &res[i];
            printf ("%s{\"test\": \"%s\", \"kind\": \"%s\", \"n\": %d, \"batch\": %d, \"depth\": %d, "
                    "\"tok_s\": %.3f, \"tok_s_min\": %.3f, \"tok_s_max\": %.3f, \"samples\": [",
                    i ? ", " : "", r->name, r->kind == 0 ? "pp" : r->kind == 1 ? "tg" : "batch", r->n,
                    r->batch, r->depth, r->med, r->min, r->max);
            for (int k = 0; k < r->reps; k++) printf ("%s%.3f", k ? ", " : "", r->tps[k]);
            printf ("]}");
        }
        printf ("], \"tg_roofline\": ");
        if (roof >= 0) printf ("%.4f}\n", roof);
        else printf ("null}\n");
    } else {
        printf ("model:      %s\n", name);
        printf ("engine:     %s, %d threads\n", rx_engine_describe (cx.e), nthreads);
        printf ("weights:    %.1f MiB (%llu bytes), %.1f M parameters\n", mi->weight_bytes / 1048576.0,
                (unsigned long long) mi->weight_bytes, mi->n_params / 1e6);
        if (bw > 0) printf ("read bw:    %.2f GB/s (%d threads, best of 3 over %ld MiB)\n", bw, nthreads, bw_mib);
        else printf ("read bw:    not measured\n");
        printf ("\n| %-16s | %5s | %10s | %21s |\n", "test", "batch", "tok/s", "min .. max");
        printf ("|------------------|-------|------------|-----------------------|\n");
        for (int i = 0; i < n_res; i++) {
            struct s_result *r = &res[i];
            char mm[48];
            snprintf (mm, sizeof mm, "%.2f .. %.2f", r->min, r->max);
            printf ("| %-16s | %5d | %10.2f | %21s |\n", r->name, r->batch, r->med, mm);
        }
        printf ("\nmedian of %ld runs after one warm-up; tok/s counts all sequences of a batch%s%s.\n", reps,
                greedy ? "; steps return the device argmax (--greedy), not logits" : "",
                sample > 0 ? ", and each row's device sampling candidates (--sample)" : "");
        if (roof >= 0)
            printf ("tg roofline: %.1f MiB x %.2f tok/s / %.2f GB/s = %.2f of the read bandwidth\n",
                    mi->weight_bytes / 1048576.0, res[tg_res].med, bw, roof);
    }
    fflush (stdout);
    status = 0;
out:
    if (status != 0) fprintf (stderr, "radix bench: %s\n", err.msg[0] ? err.msg : "failed");
    free (cx.tok);
    free (inv_t);
    free (cx.cands.probs);
    free (cx.cands.ids);
    free (cx.logits);
    free (cx.ids);
    rx_engine_destroy (&cx.e);
    rx_boot_close (&b);
    return status;
}
