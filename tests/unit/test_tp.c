/* tests/unit/test_tp.c -- tensor parallelism of the llama model plugin
 * through the engine, with the real comm-shm plugin: each rank is a forked
 * process with its own engine (tp_size N, comm "shm", a group name unique
 * to the run), as radixd's peer schedulers are.
 *
 * For each tiny reference model ($RADIX_SHARED/data/models, F16, Q8_0,
 * Q4_0) the ranks run every reference prompt (teacher-forced logits at every
 * position), then 16 greedy tokens; rank 0 and rank 1 write everything to a
 * file and the parent checks:
 *   (a) rank 0's logits equal the tp 1 engine's within the README's
 *       tolerance (1e-3 F16, 0.1 quantized) -- in practice far closer: the
 *       slices are block-aligned, so only the summation order differs;
 *   (b) rank 0's and rank 1's logits are bitwise equal (the all-reduce
 *       adds in one order on every rank, the LM head is replicated);
 *   (c) the greedy tokens equal tp 1's.
 * The same for tiny-deepseek2 under plain TP (heads split, the MLA latent
 * whole on every rank: each rank's KV bytes per token equal tp 1's), and
 * over 3 ranks (heads 1+1+2) the same greedy tokens.
 * Plus: SmolLM2-135M (uneven head split 1+2 KV heads, if the model is in
 * .cache/models), the KV pool agreement (MIN over the ranks), and the
 * errors: 3 ranks over 2 KV heads, an attn_output slice off the quant
 * blocks, an unknown comm plugin, a bad rank, a missing group, a peer that
 * never comes.
 * DP attention (dp_attention, 2 and 3 ranks, F16 and Q8_0): rank r runs
 * its own prompt (different lengths), then rank 0 runs one more while the
 * others call rx_engine_idle; every rank's logits and greedy tokens equal
 * tp 1's for its prompt.  The same with the MoE model (tiny-moe) and
 * each dispatcher: local (ep_size 1: every rank all experts), ep_normal
 * (in chunks of 5 tokens, so the ranks' chunk counts differ), ep_low_latency
 * and ep_auto (ep_size 2: experts sharded, rows exchanged).  Plus: a bad
 * ep_size refused, a refused batch fails both ranks at once,
 * rx_engine_idle without DP attention.
 *
 * No Criterion .timeout here (see test_models_ref.c); the ranks have the
 * comm timeout and the parent kills them after S_DEADLINE seconds. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "boot.h"
#include "engine.h"
#include "sampling.h"
#include "tokenizer.h"
#include "topology.h"
#include "../testutil.h"

#define S_MAX_PROMPTS 8
#define S_N_GEN       16
#define S_DEADLINE    180   /* seconds for all ranks of one run */

/* What one run does: its prompts and engine options. */
struct tp_job {
    const char *gguf;
    int32_t n_prompts;
    const int32_t *prompt[S_MAX_PROMPTS];
    int32_t n_prompt[S_MAX_PROMPTS];
    int32_t n_gen;
    uint64_t kv_bytes;          /* 0: n_slots 1024 */
    const char *comm;           /* NULL: [parallel] comm (default shm) */
    const char *group;
    double timeout_s;
    /* DP attention (s_run_dp): rank r runs prompt[r], then rank 0 runs
     * prompt[size % n_prompts] while the other ranks run idle steps. */
    int dp;
    int32_t dp_idle_only;       /* 1: rx_engine_idle without dp_attention (an error) */
    int32_t dp_bad;             /* 1: rank 1's first step has a token out of the vocabulary */
    /* MoE (s_run_dp): [moe] dispatcher, [parallel] ep_size and [moe]
     * max_tokens_per_rank when set (NULL / 0: the defaults). */
    const char *moe;
    int32_t ep_size;
    int32_t moe_chunk;
    /* MLA model (s_compare_tp2): the latent KV row is whole on every rank,
     * so each rank's KV bytes per token equal tp 1's instead of summing to
     * them. */
    int mla;
    /* DP-attention graphs (dp = 2, s_run_dp_graphs): [scheduler]
     * cuda_graph_max_bs (0: off) with [kernels.cpu] graphs = true. */
    int32_t graph_bs;
    uint64_t graph_tag;         /* the model's graph key tag (llama.c LL_GRAPH_TAG, deepseek2.c DS_GRAPH_TAG) */
};

/* What one rank reports (a file header, then the logits rows). */
struct tp_head {
    int32_t rc;
    char msg[RX_ERR_MSG_MAX];
    char desc[384];
    int32_t n_vocab, n_head, n_kv_head;
    uint64_t kv_bytes_per_token;
    int64_t n_slots;
    int32_t tp_rank, tp_size;
    int32_t n_rows;             /* rows of logits that follow */
    int32_t gen[S_MAX_PROMPTS][S_N_GEN];
    uint64_t weight_bytes;      /* rx_model_info.weight_bytes */
    int32_t graph[4];           /* s_run_dp_graphs: graph_has (model-llama key of n), n = 1..3 */
};

struct tp_out {
    struct tp_head h;
    float *logits;              /* [n_rows][n_vocab] */
};

static int32_t s_rows (const struct tp_job *j)
{
    int32_t n = 0;
    for (int32_t p = 0; p < j->n_prompts; p++) n += j->n_prompt[p] + j->n_gen;
    return n;
}

/* Which of the model's decode graphs of 1 .. 3 rows the backend holds
 * (tag: the model's graph key tag, models/graph.h). */
static void s_graphs_of (rx_engine_t *e, uint64_t tag, struct tp_out *out)
{
    const struct rx_kernels_ops *K = NULL;
    void *be = NULL;
    rx_engine_kernels (e, &K, &be);
    for (int n = 1; n <= 3; n++) out->h.graph[n] = K->graph_has (be, (tag << 24) | (uint64_t) n);
}

static void s_run_dp (const struct tp_job *j, int32_t rank, int32_t size, struct tp_out *out);
static void s_run_dp_graphs (const struct tp_job *j, int32_t rank, struct tp_out *out);

/* Run job as rank/size (size 0: no TP); fills out (out->h.rc != 0 on an
 * error, with the message).  Plain C, no Criterion asserts: it runs inside
 * forked ranks too. */
static void s_run (const struct tp_job *j, int32_t rank, int32_t size, struct tp_out *out)
{
    if (j->dp == 2) {
        s_run_dp_graphs (j, rank, out);
        return;
    }
    if (j->dp) {
        s_run_dp (j, rank, size, out);
        return;
    }
    memset (out, 0, sizeof *out);
    struct rx_boot b;
    struct rx_err err = { 0 };
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    int rc = rx_boot_open (&b, NULL, 0, &err);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "kernels", "threads", "1", &err);
    char num[16];
    snprintf (num, sizeof num, "%d", (int) j->graph_bs);
    if (rc == RX_OK && j->graph_bs) rc = rx_conf_set (b.conf, "kernels.cpu", "graphs", "true", &err);
    if (rc == RX_OK && j->graph_bs) rc = rx_conf_set (b.conf, "scheduler", "cuda_graph_max_bs", num, &err);
    if (rc != RX_OK) {
        out->h.rc = rc;
        snprintf (out->h.msg, sizeof out->h.msg, "%s", err.msg);
        return;
    }
    struct rx_engine_opts o = {
        .model_path = j->gguf, .n_slots = j->kv_bytes ? 0 : 1024, .kv_bytes = j->kv_bytes,
        .max_tokens = 128, .tp_rank = rank, .tp_size = size, .comm = j->comm,
        .comm_group = j->group, .comm_timeout_s = j->timeout_s,
    };
    rx_engine_t *e = rx_engine_new (&b, &o, &err);
    if (!e) {
        out->h.rc = err.code ? err.code : RX_EINTERNAL;
        snprintf (out->h.msg, sizeof out->h.msg, "%s", err.msg);
        rx_boot_close (&b);
        return;
    }
    const struct rx_model_info *mi = rx_engine_info (e);
    out->h.n_vocab = mi->n_vocab;
    out->h.n_head = mi->n_head;
    out->h.n_kv_head = mi->n_kv_head;
    out->h.kv_bytes_per_token = mi->kv_bytes_per_token;
    out->h.weight_bytes = mi->weight_bytes;
    out->h.n_slots = rx_engine_n_slots (e);
    out->h.tp_rank = rx_engine_tp_rank (e);
    out->h.tp_size = rx_engine_tp_size (e);
    snprintf (out->h.desc, sizeof out->h.desc, "%s", rx_engine_describe (e));
    const size_t V = (size_t) mi->n_vocab;
    out->h.n_rows = s_rows (j);
    out->logits = calloc ((size_t) out->h.n_rows * V, sizeof (float));
    float *row = out->logits;
    for (int32_t p = 0; p < j->n_prompts && rc == RX_OK; p++) {
        int seq = rx_engine_seq_new (e, j->n_prompt[p] + j->n_gen, &err);
        if (seq < 0) {
            rc = seq;
            break;
        }
        struct rx_engine_req r = { seq, j->n_prompt[p], j->prompt[p], 1 };
        rc = rx_engine_step (e, &r, 1, row, &err);
        row += (size_t) j->n_prompt[p] * V;
        for (int32_t g = 0; g < j->n_gen && rc == RX_OK; g++) {
            int32_t tok = rx_argmax (row - V, (int32_t) V);
            out->h.gen[p][g] = tok;
            struct rx_engine_req d = { seq, 1, &tok, 1 };
            rc = rx_engine_step (e, &d, 1, row, &err);
            row += V;
        }
        rx_engine_seq_free (e, seq);
    }
    if (rc != RX_OK) {
        out->h.rc = rc;
        snprintf (out->h.msg, sizeof out->h.msg, "%s", err.msg);
    }
    s_graphs_of (e, j->graph_tag, out);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
}

static void s_out_free (struct tp_out *o)
{
    free (o->logits);
    o->logits = NULL;
}

/* A failed rank reports rc and the message, and no rows. */
static void s_out_fail (struct tp_out *o, int rc, const struct rx_err *err)
{
    o->h.rc = rc;
    snprintf (o->h.msg, sizeof o->h.msg, "%s", err->msg);
    s_out_free (o);
    o->h.n_rows = 0;
}

static int s_write_all (int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write (fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t) w;
    }
    return 0;
}

/* Fork `size` ranks running job; rank r's report goes to dir/rank<r>.  Waits
 * for all of them (killing them after S_DEADLINE) and reads every report. */
static void s_run_ranks (const struct tp_job *j, int32_t size, struct tp_out *outs)
{
    char *dir = tu_tmpdir ();
    pid_t pid[8];
    cr_assert (size <= 8);
    fflush (NULL);
    for (int32_t r = 0; r < size; r++) {
        pid[r] = fork ();
        cr_assert (pid[r] >= 0, "fork: %s", strerror (errno));
        if (pid[r] == 0) {
            alarm (S_DEADLINE + 10);   /* never outlive the test */
            struct tp_out o;
            s_run (j, r, size, &o);
            char name[32];
            snprintf (name, sizeof name, "rank%d", (int) r);
            char *path = tu_path (dir, name);
            int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            int bad = fd < 0 || s_write_all (fd, &o.h, sizeof o.h) != 0
                      || (o.logits && s_write_all (fd, o.logits, (size_t) o.h.n_rows * (size_t) o.h.n_vocab
                                                                 * sizeof (float)) != 0);
            if (fd >= 0) close (fd);
            free (path);
            s_out_free (&o);
            _exit (bad ? 3 : 0);
        }
    }
    time_t t0 = time (NULL);
    int left = size, status[8];
    for (int32_t r = 0; r < size; r++) status[r] = -1;
    while (left > 0) {
        for (int32_t r = 0; r < size; r++) {
            if (status[r] != -1) continue;
            int st;
            pid_t w = waitpid (pid[r], &st, WNOHANG);
            if (w == pid[r]) {
                status[r] = st;
                left--;
            }
        }
        if (left > 0 && time (NULL) - t0 > S_DEADLINE) {
            for (int32_t r = 0; r < size; r++)
                if (status[r] == -1) kill (pid[r], SIGKILL);
        }
        if (left > 0) usleep (20 * 1000);
    }
    for (int32_t r = 0; r < size; r++) {
        cr_assert (WIFEXITED (status[r]) && WEXITSTATUS (status[r]) == 0,
                   "%s: rank %d of %d died (status 0x%x)", j->gguf, r, size, status[r]);
        char name[32];
        snprintf (name, sizeof name, "rank%d", (int) r);
        char *path = tu_path (dir, name);
        size_t n;
        unsigned char *buf = tu_read_file (path, &n);
        cr_assert (buf && n >= sizeof outs[r].h, "%s: rank %d wrote no report", j->gguf, r);
        memcpy (&outs[r].h, buf, sizeof outs[r].h);
        size_t nl = outs[r].h.rc == RX_OK ? (size_t) outs[r].h.n_rows * (size_t) outs[r].h.n_vocab : 0;
        cr_assert_eq (n, sizeof outs[r].h + nl * sizeof (float), "%s: rank %d: short report", j->gguf, r);
        outs[r].logits = NULL;
        if (nl) {
            outs[r].logits = malloc (nl * sizeof (float));
            memcpy (outs[r].logits, buf + sizeof outs[r].h, nl * sizeof (float));
        }
        free (buf);
        unlink (path);
        free (path);
    }
    rmdir (dir);
    free (dir);
}

/* A group name no other run (or concurrent test) uses. */
static const char *s_group (const char *what)
{
    static char g[64];
    static int n;
    snprintf (g, sizeof g, "tp-test-%ld-%s-%d", (long) getpid (), what, n++);
    return g;
}

/* ---- the tiny reference models ---- */

struct ref_prompts {
    int32_t n;
    int32_t *ids[S_MAX_PROMPTS];
    int32_t len[S_MAX_PROMPTS];
};

static char *s_ref_load (const char *model, struct ref_prompts *rp)
{
    TU_REQUIRE_SHARED ();
    const char *shared = tu_env ("RADIX_SHARED");
    char path[4096];
    snprintf (path, sizeof path, "%s/data/models/%s.json", shared, model);
    json_error_t je;
    json_t *root = json_load_file (path, 0, &je);
    cr_assert_not_null (root, "%s:%d: %s", path, je.line, je.text);
    json_t *ps = json_object_get (root, "prompts");
    cr_assert (json_is_array (ps) && json_array_size (ps) > 0);
    rp->n = (int32_t) json_array_size (ps);
    if (rp->n > S_MAX_PROMPTS) rp->n = S_MAX_PROMPTS;
    for (int32_t i = 0; i < rp->n; i++) {
        json_t *a = json_object_get (json_array_get (ps, (size_t) i), "prompt_ids");
        rp->len[i] = (int32_t) json_array_size (a);
        rp->ids[i] = calloc ((size_t) rp->len[i], sizeof (int32_t));
        for (int32_t k = 0; k < rp->len[i]; k++)
            rp->ids[i][k] = (int32_t) json_integer_value (json_array_get (a, (size_t) k));
    }
    json_decref (root);
    snprintf (path, sizeof path, "%s/data/models/%s.gguf", shared, model);
    return strdup (path);
}

static void s_ref_free (struct ref_prompts *rp)
{
    for (int32_t i = 0; i < rp->n; i++) free (rp->ids[i]);
}

/* tp 2 against tp 1 on job: the largest |tp2 - tp1| logit must be within
 * tol, their root mean square within tol_rms; greedy tokens equal unless
 * tp 1's top two were closer than gap_tol. */
static void s_compare_tp2 (const char *what, const struct tp_job *j, double tol, double tol_rms,
                           double gap_tol)
{
    struct tp_out one, two[2];
    s_run_ranks (j, 2, two);
    for (int r = 0; r < 2; r++)
        cr_assert_eq (two[r].h.rc, RX_OK, "%s: tp 2 rank %d: %s", what, r, two[r].h.msg);
    s_run (j, 0, 0, &one);
    cr_assert_eq (one.h.rc, RX_OK, "%s: tp 1: %s", what, one.h.msg);
    cr_assert_eq (one.h.tp_size, 1);
    for (int r = 0; r < 2; r++) {
        char want[64];
        snprintf (want, sizeof want, "tp 2 (rank %d, comm shm)", r);
        cr_assert_not_null (strstr (two[r].h.desc, want), "%s: describe: %s", what, two[r].h.desc);
        cr_assert_eq (two[r].h.tp_rank, r);
        cr_assert_eq (two[r].h.tp_size, 2);
        cr_assert_eq (two[r].h.n_vocab, one.h.n_vocab);
        cr_assert_eq (two[r].h.n_slots, two[0].h.n_slots, "%s: KV pools differ", what);
    }
    /* The heads are split: the two ranks hold all of them between them. */
    cr_assert_eq (two[0].h.n_head + two[1].h.n_head, one.h.n_head);
    cr_assert_eq (two[0].h.n_kv_head + two[1].h.n_kv_head, one.h.n_kv_head);
    if (j->mla)
        for (int r = 0; r < 2; r++)
            cr_assert_eq (two[r].h.kv_bytes_per_token, one.h.kv_bytes_per_token,
                          "%s: MLA rank %d stores %llu KV bytes per token, tp 1 %llu (the latent is whole on every rank)",
                          what, r, (unsigned long long) two[r].h.kv_bytes_per_token,
                          (unsigned long long) one.h.kv_bytes_per_token);
    else
        cr_assert_eq (two[0].h.kv_bytes_per_token + two[1].h.kv_bytes_per_token,
                      one.h.kv_bytes_per_token);
    cr_assert (two[1].h.n_head > 0 && two[0].h.n_head > 0);

    const size_t nl = (size_t) one.h.n_rows * (size_t) one.h.n_vocab;
    cr_assert_eq (two[0].h.n_rows, one.h.n_rows);
    /* (b) rank 0 and rank 1 agree bit for bit. */
    cr_assert (memcmp (two[0].logits, two[1].logits, nl * sizeof (float)) == 0,
               "%s: rank 0 and rank 1 logits differ", what);
    cr_assert (memcmp (two[0].h.gen, two[1].h.gen, sizeof two[0].h.gen) == 0);
    /* (c) the same greedy tokens, up to a step where tp 1's top two were
     * closer than gap_tol (a tie the rounding may break either way); the
     * logits after a different token are not compared. */
    const size_t V = (size_t) one.h.n_vocab;
    char *valid = calloc ((size_t) one.h.n_rows, 1);
    int32_t base = 0, n_equal = 0;
    for (int32_t p = 0; p < j->n_prompts; p++) {
        int32_t g = 0;
        for (; g < j->n_gen; g++) {
            if (two[0].h.gen[p][g] == one.h.gen[p][g]) continue;
            const float *row = one.logits + (size_t) (base + j->n_prompt[p] - 1 + g) * V;
            float top = row[one.h.gen[p][g]], second = -INFINITY;
            for (size_t i = 0; i < V; i++)
                if ((int32_t) i != one.h.gen[p][g] && row[i] > second) second = row[i];
            cr_assert ((double) top - (double) second < gap_tol,
                       "%s: prompt %d: greedy token %d is %d with tp 2, %d with tp 1 (top-2 gap %.3g)",
                       what, p, g, two[0].h.gen[p][g], one.h.gen[p][g], (double) (top - second));
            break;
        }
        n_equal += g;
        for (int32_t r = 0; r < j->n_prompt[p] + g; r++) valid[base + r] = 1;
        base += j->n_prompt[p] + j->n_gen;
    }
    /* (a) tp 2 = tp 1 within the tolerance. */
    double maxd = 0, ss = 0;
    size_t at = 0, n_cmp = 0;
    for (size_t i = 0; i < nl; i++) {
        if (!valid[i / V]) continue;
        double d = fabs ((double) two[0].logits[i] - (double) one.logits[i]);
        ss += d * d;
        n_cmp++;
        if (!(d <= maxd)) {
            maxd = d;
            at = i;
        }
    }
    free (valid);
    const double rms = sqrt (ss / (double) n_cmp);
    cr_assert (maxd <= tol, "%s: tp 2 logit %zu (row %zu) is %.6f, tp 1 %.6f (|d| %.3g > %g)", what,
               at % V, at / V, (double) two[0].logits[at], (double) one.logits[at], maxd, tol);
    cr_assert (rms <= tol_rms, "%s: tp 2 vs tp 1: rms logit difference %.3g > %g", what, rms, tol_rms);
    fprintf (stderr, "test_tp: %s: tp 2 vs tp 1: max |logit diff| %.3g, rms %.3g over %zu logits (tol %g, %g); "
             "heads %d+%d, KV heads %d+%d; %d of %d greedy tokens equal\n", what, maxd, rms, n_cmp, tol,
             tol_rms, two[0].h.n_head, two[1].h.n_head, two[0].h.n_kv_head, two[1].h.n_kv_head, n_equal,
             j->n_gen * j->n_prompts);
    s_out_free (&one);
    s_out_free (&two[0]);
    s_out_free (&two[1]);
}

static void s_tiny (const char *model, double tol)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load (model, &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = rp.n, .n_gen = S_N_GEN, .comm = "shm",
                        .group = s_group (model), .timeout_s = 60 };
    for (int32_t i = 0; i < rp.n; i++) {
        j.prompt[i] = rp.ids[i];
        j.n_prompt[i] = rp.len[i];
    }
    s_compare_tp2 (model, &j, tol, tol, 2 * tol);
    s_ref_free (&rp);
    free (gguf);
}

Test (tp, tiny_llama_f16) { s_tiny ("tiny-llama", 1e-3); }
Test (tp, tiny_llama_q8) { s_tiny ("tiny-llama-q8", 0.1); }
Test (tp, tiny_llama_q4) { s_tiny ("tiny-llama-q4", 0.1); }

/* deepseek2 under plain tensor parallelism: heads 2+2 (q_b, kv_b and
 * attn_output split), the MLA latent whole on both ranks (same KV bytes
 * per token as tp 1), the dense block's FFN split, the MoE blocks
 * replicated (dispatcher local); logits within the README's 1e-3 of tp 1,
 * bitwise equal between the ranks, the same greedy tokens. */
Test (tp, tiny_deepseek2_tp2)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-deepseek2", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = rp.n, .n_gen = S_N_GEN, .comm = "shm",
                        .group = s_group ("ds2tp"), .timeout_s = 60, .mla = 1 };
    for (int32_t i = 0; i < rp.n; i++) {
        j.prompt[i] = rp.ids[i];
        j.n_prompt[i] = rp.len[i];
    }
    s_compare_tp2 ("tiny-deepseek2", &j, 1e-3, 1e-3, 2e-3);
    s_ref_free (&rp);
    free (gguf);
}

/* 3 ranks over deepseek2's 4 heads split 1+1+2 (uneven), and the tokens
 * still equal tp 1's (one short prompt, 4 greedy tokens: three forked
 * engines on a shared box). */
Test (tp, tiny_deepseek2_tp3_uneven)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-deepseek2", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { rp.ids[0] },
                        .n_prompt = { rp.len[0] }, .n_gen = 4, .comm = "shm",
                        .group = s_group ("ds2tp3"), .timeout_s = 60, .mla = 1 };
    struct tp_out o[3], one;
    s_run_ranks (&j, 3, o);
    s_run (&j, 0, 0, &one);
    cr_assert_eq (one.h.rc, RX_OK, "tp 1: %s", one.h.msg);
    int32_t heads = 0;
    for (int r = 0; r < 3; r++) {
        cr_assert_eq (o[r].h.rc, RX_OK, "rank %d: %s", r, o[r].h.msg);
        cr_assert_eq (o[r].h.n_head, r == 2 ? 2 : 1, "rank %d has %d heads", r, o[r].h.n_head);
        cr_assert_eq (o[r].h.kv_bytes_per_token, one.h.kv_bytes_per_token);
        heads += o[r].h.n_head;
        for (int32_t g = 0; g < j.n_gen; g++)
            cr_assert_eq (o[r].h.gen[0][g], one.h.gen[0][g], "rank %d: greedy token %d is %d, tp 1 %d", r, g,
                          o[r].h.gen[0][g], one.h.gen[0][g]);
    }
    cr_assert_eq (heads, one.h.n_head);
    for (int r = 0; r < 3; r++) s_out_free (&o[r]);
    s_out_free (&one);
    s_ref_free (&rp);
    free (gguf);
}

/* deepseek2's 4 heads cannot split over 5 ranks: every rank refuses with
 * one line naming the file and the key, none waits for a timeout. */
Test (tp, deepseek2_more_ranks_than_heads)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-deepseek2", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { rp.ids[0] },
                        .n_prompt = { rp.len[0] }, .n_gen = 1, .group = s_group ("ds2five"),
                        .timeout_s = 60 };
    struct tp_out o[5];
    time_t t0 = time (NULL);
    s_run_ranks (&j, 5, o);
    cr_assert (time (NULL) - t0 < 30, "the ranks took %lds to fail", (long) (time (NULL) - t0));
    for (int r = 0; r < 5; r++) {
        cr_assert_eq (o[r].h.rc, RX_ENOTSUP, "rank %d: %s (%s)", r, rx_status_name (o[r].h.rc), o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "5 ranks but only 4 heads"), "%s", o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "tiny-deepseek2.gguf"), "%s", o[r].h.msg);
        s_out_free (&o[r]);
    }
    s_ref_free (&rp);
    free (gguf);
}

/* 4 query heads over 2 KV heads cannot split in 3: every rank refuses with
 * one clear error, and none waits for the others until the timeout. */
Test (tp, three_ranks_over_two_kv_heads)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-llama", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { rp.ids[0] },
                        .n_prompt = { rp.len[0] }, .n_gen = 1, .group = s_group ("three"),
                        .timeout_s = 60 };
    struct tp_out o[3];
    time_t t0 = time (NULL);
    s_run_ranks (&j, 3, o);
    cr_assert (time (NULL) - t0 < 30, "the ranks took %lds to fail", (long) (time (NULL) - t0));
    for (int r = 0; r < 3; r++) {
        cr_assert_eq (o[r].h.rc, RX_ENOTSUP, "rank %d: %s (%s)", r, rx_status_name (o[r].h.rc), o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "3 ranks"), "%s", o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "head_count_kv"), "%s", o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "tiny-llama.gguf"), "%s", o[r].h.msg);
    }
    s_ref_free (&rp);
    free (gguf);
}

/* A mixture-of-experts model is refused with tensor parallelism (until
 * expert parallelism lands): every rank says so, none waits for a timeout. */
Test (tp, moe_model_refused)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-moe", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { rp.ids[0] },
                        .n_prompt = { rp.len[0] }, .n_gen = 1, .group = s_group ("moe"),
                        .timeout_s = 60 };
    struct tp_out o[2];
    time_t t0 = time (NULL);
    s_run_ranks (&j, 2, o);
    cr_assert (time (NULL) - t0 < 30, "the ranks took %lds to fail", (long) (time (NULL) - t0));
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (o[r].h.rc, RX_ENOTSUP, "rank %d: %s (%s)", r, rx_status_name (o[r].h.rc), o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "expert parallelism"), "%s", o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "tiny-moe.gguf"), "%s", o[r].h.msg);
    }
    s_ref_free (&rp);
    free (gguf);
}

/* ---- SmolLM2-135M: 9 query heads / 3 KV heads, split 1+2 ---- */

static char *s_smol_path (void)
{
    char *p = tu_path (tu_env ("RX_TOP_SRCDIR"), ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (access (p, R_OK) != 0) {
        free (p);
        return NULL;
    }
    return p;
}

static void s_smol_prompt (const char *gguf, int32_t **ids, int32_t *n)
{
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (gguf, &err);
    cr_assert_not_null (t, "%s", err.msg);
    const char *text = "The capital of France is";
    size_t nn = 0;
    cr_assert_eq (rx_tokenizer_encode (t, text, strlen (text), RX_TOK_ADD_SPECIAL, ids, &nn, &err),
                  RX_OK, "%s", err.msg);
    *n = (int32_t) nn;
    rx_tokenizer_free (&t);
}

Test (tp, smollm2_uneven_split)
{
    char *gguf = s_smol_path ();
    if (!gguf) cr_skip_test ("SmolLM2-135M-Instruct.Q4_1.gguf is not in .cache/models: skipped");
    int32_t *ids, n;
    s_smol_prompt (gguf, &ids, &n);
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { ids }, .n_prompt = { n },
                        .n_gen = S_N_GEN, .group = s_group ("smol"), .timeout_s = 60 };
    /* 30 layers of Q4_1 with Q8_0-quantized activations amplify the last
     * bit of a different summation order (the partial sums of the ranks):
     * one rounding step of an activation flips its Q8_0 value.  The same
     * model on one rank differs as much between the kernels' avx2 and
     * avx512 paths (max |d| 0.95, rms 0.20 over 12 prompt rows, one argmax
     * changed), so the bounds are that noise floor, not the tiny models'
     * 0.1.  The ranks' bitwise agreement stays exact. */
    s_compare_tp2 ("SmolLM2-135M-Instruct.Q4_1", &j, 2.5, 0.5, 1.0);
    free (ids);
    free (gguf);
}

/* The KV pool: rank 0 holds KV head 0, rank 1 heads 1 and 2, so a byte
 * budget gives rank 0 twice the tokens -- the group takes the smallest. */
Test (tp, kv_pool_is_the_smallest_rank)
{
    char *gguf = s_smol_path ();
    if (!gguf) cr_skip_test ("SmolLM2-135M-Instruct.Q4_1.gguf is not in .cache/models: skipped");
    int32_t tok = 1;
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { &tok }, .n_prompt = { 1 },
                        .n_gen = 1, .group = s_group ("kv"), .timeout_s = 60 };
    struct tp_out o[2];
    j.kv_bytes = 64ull << 20;
    s_run_ranks (&j, 2, o);
    for (int r = 0; r < 2; r++) cr_assert_eq (o[r].h.rc, RX_OK, "rank %d: %s", r, o[r].h.msg);
    uint64_t b0 = o[0].h.kv_bytes_per_token, b1 = o[1].h.kv_bytes_per_token;
    cr_assert_eq (o[0].h.n_kv_head, 1);
    cr_assert_eq (o[1].h.n_kv_head, 2);
    cr_assert_eq (o[0].h.n_head, 3);
    cr_assert_eq (o[1].h.n_head, 6);
    cr_assert_eq (b1, 2 * b0, "KV bytes per token %llu / %llu", (unsigned long long) b0,
                  (unsigned long long) b1);
    int64_t want = (int64_t) ((64ull << 20) / b1);
    for (int r = 0; r < 2; r++)
        cr_assert_eq (o[r].h.n_slots, want, "rank %d: %lld slots, want %lld (rank 1's)", r,
                      (long long) o[r].h.n_slots, (long long) want);
    s_out_free (&o[0]);
    s_out_free (&o[1]);
    free (gguf);
}

/* ---- errors ---- */

/* attn_output column slices that fall inside Q8_0 blocks: 2 heads of 16
 * columns, one per rank, against blocks of 32. */
Test (tp, slice_off_the_quant_blocks)
{
    char *dir = tu_tmpdir ();
    char *out = tu_path (dir, "m.gguf");
    char *argv[] = { (char *) tu_env ("RADIX"), "gguf-gen", "--arch", "llama", "--dims",
                     "embd=32,layers=1,heads=2,kv_heads=2,ffn=64,ctx=64,vocab=256", "--type", "q8_0",
                     "--out", out, NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    cr_assert_eq (r.status, 0, "gguf-gen: %s", r.err);
    tu_run_free (&r);
    int32_t tok = 1;
    struct tp_job j = { .gguf = out, .n_prompts = 1, .prompt = { &tok }, .n_prompt = { 1 },
                        .n_gen = 1, .group = s_group ("blocks"), .timeout_s = 60 };
    struct tp_out o[2];
    s_run_ranks (&j, 2, o);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq (o[k].h.rc, RX_ENOTSUP, "rank %d: %s (%s)", k, rx_status_name (o[k].h.rc), o[k].h.msg);
        cr_assert_not_null (strstr (o[k].h.msg, "blk.0.attn_output.weight"), "%s", o[k].h.msg);
        cr_assert_not_null (strstr (o[k].h.msg, "q8_0"), "%s", o[k].h.msg);
    }
    /* The same file runs with tp 1. */
    struct tp_out one;
    s_run (&j, 0, 1, &one);
    cr_assert_eq (one.h.rc, RX_OK, "%s", one.h.msg);
    s_out_free (&one);
    unlink (out);
    rmdir (dir);
    free (out);
    free (dir);
}

static void s_expect_error (struct tp_job *j, int32_t rank, int32_t size, int code,
                            const char *needle)
{
    struct tp_out o;
    s_run (j, rank, size, &o);
    cr_assert_eq (o.h.rc, code, "want %s, got %s: %s", rx_status_name (code), rx_status_name (o.h.rc),
                  o.h.msg);
    cr_assert_not_null (strstr (o.h.msg, needle), "\"%s\" not in: %s", needle, o.h.msg);
    s_out_free (&o);
}

Test (tp, bad_options)
{
    TU_REQUIRE_SHARED ();
    char *gguf = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf");
    int32_t tok = 1;
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { &tok }, .n_prompt = { 1 },
                        .n_gen = 1, .group = s_group ("bad"), .timeout_s = 60 };
    j.comm = "nosuch";
    s_expect_error (&j, 0, 2, RX_ENOENT, "[parallel] comm = nosuch");
    j.comm = "shm";
    s_expect_error (&j, 2, 2, RX_EINVAL, "rank 2 is outside 0 .. 1");
    s_expect_error (&j, -1, 2, RX_EINVAL, "rank -1");
    j.group = NULL;
    s_expect_error (&j, 0, 2, RX_EINVAL, "comm group");
    free (gguf);
}

/* A peer that never joins: create fails after the timeout with an error
 * instead of hanging. */
Test (tp, missing_peer_times_out)
{
    TU_REQUIRE_SHARED ();
    char *gguf = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf");
    int32_t tok = 1;
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { &tok }, .n_prompt = { 1 },
                        .n_gen = 1, .group = s_group ("alone"), .timeout_s = 1 };
    struct tp_out o;
    time_t t0 = time (NULL);
    s_run (&j, 0, 2, &o);
    cr_assert_neq (o.h.rc, RX_OK);
    cr_assert (time (NULL) - t0 < 20, "took %lds", (long) (time (NULL) - t0));
    cr_assert (o.h.msg[0], "no message");
    s_out_free (&o);
    free (gguf);
}

/* ---- DP attention ---- */

/* One prompt on e: prefill (logits of every row) and n_gen greedy decode
 * steps, the logits rows into *row (advanced), the tokens into gen.  Each
 * call of rx_engine_step is one step of the DP group; *steps counts them. */
static int s_dp_prompt (rx_engine_t *e, const int32_t *ids, int32_t n, int32_t n_gen, float **row,
                        int32_t *gen, int32_t *steps, struct rx_err *err)
{
    const size_t V = (size_t) rx_engine_info (e)->n_vocab;
    int seq = rx_engine_seq_new (e, n + n_gen, err);
    if (seq < 0) return seq;
    struct rx_engine_req r = { seq, n, ids, 1 };
    int rc = rx_engine_step (e, &r, 1, *row, err);
    (*steps)++;
    *row += (size_t) n * V;
    for (int32_t g = 0; g < n_gen && rc == RX_OK; g++) {
        int32_t tok = rx_argmax (*row - V, (int32_t) V);
        gen[g] = tok;
        struct rx_engine_req d = { seq, 1, &tok, 1 };
        rc = rx_engine_step (e, &d, 1, *row, err);
        (*steps)++;
        *row += V;
    }
    rx_engine_seq_free (e, seq);
    return rc;
}

/* A DP-attention rank: phase 1, rank r runs prompt[r] (all ranks busy,
 * different lengths); phase 2, rank 0 runs prompt[size % n_prompts] while
 * the others call rx_engine_idle once per step of rank 0.  Rank 0 reports
 * rows of both prompts (gen[0], gen[1]), the others phase 1's. */
static void s_run_dp (const struct tp_job *j, int32_t rank, int32_t size, struct tp_out *out)
{
    memset (out, 0, sizeof *out);
    struct rx_boot b;
    struct rx_err err = { 0 };
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    int rc = rx_boot_open (&b, NULL, 0, &err);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "kernels", "threads", "1", &err);
    if (rc == RX_OK && j->moe) rc = rx_conf_set (b.conf, "moe", "dispatcher", j->moe, &err);
    char num[16];
    snprintf (num, sizeof num, "%d", (int) j->ep_size);
    if (rc == RX_OK && j->ep_size) rc = rx_conf_set (b.conf, "parallel", "ep_size", num, &err);
    snprintf (num, sizeof num, "%d", (int) j->moe_chunk);
    if (rc == RX_OK && j->moe_chunk) rc = rx_conf_set (b.conf, "moe", "max_tokens_per_rank", num, &err);
    if (rc != RX_OK) {
        out->h.rc = rc;
        snprintf (out->h.msg, sizeof out->h.msg, "%s", err.msg);
        rx_boot_close (&b);
        return;
    }
    struct rx_engine_opts o = {
        .model_path = j->gguf, .n_slots = 1024, .max_tokens = 128, .tp_rank = rank,
        .tp_size = size, .comm = j->comm, .comm_group = j->group, .comm_timeout_s = j->timeout_s,
        .dp_attention = !j->dp_idle_only,
    };
    rx_engine_t *e = rx_engine_new (&b, &o, &err);
    if (!e) {
        out->h.rc = err.code ? err.code : RX_EINTERNAL;
        snprintf (out->h.msg, sizeof out->h.msg, "%s", err.msg);
        rx_boot_close (&b);
        return;
    }
    const struct rx_model_info *mi = rx_engine_info (e);
    out->h.n_vocab = mi->n_vocab;
    out->h.n_head = mi->n_head;
    out->h.n_kv_head = mi->n_kv_head;
    out->h.kv_bytes_per_token = mi->kv_bytes_per_token;
    out->h.weight_bytes = mi->weight_bytes;
    out->h.n_slots = rx_engine_n_slots (e);
    out->h.tp_rank = rx_engine_tp_rank (e);
    out->h.tp_size = rx_engine_tp_size (e);
    snprintf (out->h.desc, sizeof out->h.desc, "%s", rx_engine_describe (e));
    if (j->dp_idle_only) {
        rc = rx_engine_idle (e, &err);
        out->h.rc = rc;
        snprintf (out->h.msg, sizeof out->h.msg, "%s", err.msg);
        rx_engine_destroy (&e);
        rx_boot_close (&b);
        return;
    }
    const size_t V = (size_t) mi->n_vocab;
    const int32_t p1 = rank % j->n_prompts, p2 = size % j->n_prompts;
    int32_t rows = j->n_prompt[p1] + j->n_gen + (rank == 0 ? j->n_prompt[p2] + j->n_gen : 0);
    out->h.n_rows = rows;
    out->logits = calloc ((size_t) rows * V, sizeof (float));
    float *row = out->logits;
    int32_t steps = 0;
    if (j->dp_bad && rank == 1) {
        int32_t bad[2] = { 1, mi->n_vocab };
        rc = s_dp_prompt (e, bad, 2, j->n_gen, &row, out->h.gen[0], &steps, &err);
        s_out_fail (out, rc, &err);
        rx_engine_destroy (&e);
        rx_boot_close (&b);
        return;
    }
    rc = s_dp_prompt (e, j->prompt[p1], j->n_prompt[p1], j->n_gen, &row, out->h.gen[0], &steps, &err);
    /* Phase 1 has the same number of steps on every rank (1 + n_gen). */
    if (rc == RX_OK && rank == 0)
        rc = s_dp_prompt (e, j->prompt[p2], j->n_prompt[p2], j->n_gen, &row, out->h.gen[1], &steps, &err);
    else
        for (int32_t s = 0; s < 1 + j->n_gen && rc == RX_OK; s++) rc = rx_engine_idle (e, &err);
    /* Everybody idle: no collective at all, and nothing hangs. */
    if (rc == RX_OK) rc = rx_engine_idle (e, &err);
    if (rc != RX_OK) s_out_fail (out, rc, &err);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
}

/* Compare `n` rows of dp logits (prompt p) with tp 1's: greedy tokens equal
 * up to a near tie (top-2 gap below gap_tol), logits within tol. */
static void s_dp_check (const char *what, const struct tp_job *j, int32_t p, const float *dp,
                        const int32_t *dp_gen, const struct tp_out *one, double tol, double gap_tol)
{
    const size_t V = (size_t) one->h.n_vocab;
    size_t base = 0;
    for (int32_t q = 0; q < p; q++) base += (size_t) (j->n_prompt[q] + j->n_gen);
    const float *ref = one->logits + base * V;
    int32_t g = 0;
    for (; g < j->n_gen; g++) {
        if (dp_gen[g] == one->h.gen[p][g]) continue;
        const float *r = ref + (size_t) (j->n_prompt[p] - 1 + g) * V;
        float top = r[one->h.gen[p][g]], second = -INFINITY;
        for (size_t i = 0; i < V; i++)
            if ((int32_t) i != one->h.gen[p][g] && r[i] > second) second = r[i];
        cr_assert ((double) top - (double) second < gap_tol,
                   "%s: prompt %d: greedy token %d is %d with DP attention, %d with tp 1 (top-2 gap %.3g)",
                   what, p, g, dp_gen[g], one->h.gen[p][g], (double) (top - second));
        break;
    }
    const size_t nrows = (size_t) (j->n_prompt[p] + g);
    double maxd = 0;
    for (size_t i = 0; i < nrows * V; i++) {
        double d = fabs ((double) dp[i] - (double) ref[i]);
        if (!(d <= maxd)) maxd = d;
    }
    cr_assert (maxd <= tol, "%s: prompt %d: DP attention vs tp 1: max |logit diff| %.3g > %g", what, p,
               maxd, tol);
    fprintf (stderr, "test_tp: %s: prompt %d: DP attention vs tp 1: max |logit diff| %.3g over %zu rows (tol %g); %d of %d greedy tokens equal\n",
             what, p, maxd, nrows, tol, g, j->n_gen);
}

/* DP attention over `size` ranks; moe / ep_size / moe_chunk: see tp_job
 * (the tp 1 reference always runs the default dispatcher, local). */
static void s_dp_moe (const char *model, int32_t size, double tol, const char *moe, int32_t ep_size,
                      int32_t moe_chunk)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load (model, &rp);
    cr_assert (rp.n >= 2);
    struct tp_job j = { .gguf = gguf, .n_prompts = rp.n, .n_gen = S_N_GEN, .comm = "shm",
                        .group = s_group ("dp"), .timeout_s = 60, .dp = 1, .moe = moe,
                        .ep_size = ep_size, .moe_chunk = moe_chunk };
    for (int32_t i = 0; i < rp.n; i++) {
        j.prompt[i] = rp.ids[i];
        j.n_prompt[i] = rp.len[i];
    }
    struct tp_out dp[4], one;
    cr_assert (size <= 4);
    time_t t0 = time (NULL);
    s_run_ranks (&j, size, dp);
    for (int32_t r = 0; r < size; r++)
        cr_assert_eq (dp[r].h.rc, RX_OK, "%s: dp rank %d of %d: %s", model, r, size, dp[r].h.msg);
    cr_assert (time (NULL) - t0 < 60, "%s: the DP ranks took %lds", model, (long) (time (NULL) - t0));
    struct tp_job j1 = j;
    j1.dp = 0;
    j1.moe = NULL;
    j1.ep_size = 0;
    j1.moe_chunk = 0;
    s_run (&j1, 0, 0, &one);
    cr_assert_eq (one.h.rc, RX_OK, "%s: tp 1: %s", model, one.h.msg);
    /* The prompts of phase 1 have different lengths. */
    cr_assert_neq (j.n_prompt[0], j.n_prompt[1]);
    for (int32_t r = 0; r < size; r++) {
        char want[64];
        snprintf (want, sizeof want, "dp attention %d (rank %d, comm shm)", size, r);
        cr_assert_not_null (strstr (dp[r].h.desc, want), "%s: describe: %s", model, dp[r].h.desc);
        if (ep_size > 1) {
            snprintf (want, sizeof want, "ep over the group, moe-%s", moe);
            cr_assert_not_null (strstr (dp[r].h.desc, want), "%s: describe: %s", model, dp[r].h.desc);
        }
        /* Every rank holds every head (and its own KV pool). */
        cr_assert_eq (dp[r].h.n_head, one.h.n_head);
        cr_assert_eq (dp[r].h.n_kv_head, one.h.n_kv_head);
        cr_assert_eq (dp[r].h.kv_bytes_per_token, one.h.kv_bytes_per_token);
        /* ... but only its share of the dense FFN (an MoE model's experts
         * are mapped whole: no dense FFN to split; deepseek2 has a leading
         * dense block, split). */
        if (moe && !strstr (model, "deepseek2"))
            cr_assert_leq (dp[r].h.weight_bytes, one.h.weight_bytes);
        else
            cr_assert_lt (dp[r].h.weight_bytes, one.h.weight_bytes, "%s: rank %d holds %llu weight bytes, tp 1 %llu",
                          model, r, (unsigned long long) dp[r].h.weight_bytes,
                          (unsigned long long) one.h.weight_bytes);
        const int32_t p = r % j.n_prompts;
        cr_assert_eq (dp[r].h.n_rows, j.n_prompt[p] + j.n_gen + (r == 0 ? j.n_prompt[size % j.n_prompts] + j.n_gen : 0));
        char what[96];
        snprintf (what, sizeof what, "%s dp %d rank %d", model, size, r);
        s_dp_check (what, &j, p, dp[r].logits, dp[r].h.gen[0], &one, tol, 2 * tol);
    }
    /* Phase 2: rank 0 alone, the others idle. */
    const int32_t p2 = size % j.n_prompts;
    char what[96];
    snprintf (what, sizeof what, "%s dp %d rank 0 (others idle)", model, size);
    s_dp_check (what, &j, p2, dp[0].logits + (size_t) (j.n_prompt[0] + j.n_gen) * (size_t) one.h.n_vocab,
                dp[0].h.gen[1], &one, tol, 2 * tol);
    for (int32_t r = 0; r < size; r++) s_out_free (&dp[r]);
    s_out_free (&one);
    s_ref_free (&rp);
    free (gguf);
}

static void s_dp (const char *model, int32_t size, double tol)
{
    s_dp_moe (model, size, tol, NULL, 0, 0);
}

Test (tp, dp_attention_f16) { s_dp ("tiny-llama", 2, 1e-3); }
Test (tp, dp_attention_q8) { s_dp ("tiny-llama-q8", 2, 0.1); }
/* n_ff 128 splits over 3 ranks (Q8_0: 4 blocks of 32 -> 1+1+2). */
Test (tp, dp_attention_three_ranks) { s_dp ("tiny-llama", 3, 1e-3); }
Test (tp, dp_attention_three_ranks_q8) { s_dp ("tiny-llama-q8", 3, 0.1); }

/* ------------------------------------------- DP attention with graphs -- */

/* One rank's sequences and the rows it has written (s_run_dp_graphs). */
struct dpg {
    rx_engine_t *e;
    size_t V;
    float *row;                 /* the next logits row to write */
    int32_t *gen;               /* greedy tokens, in step order */
    int32_t n_gen, max_gen;
};
struct dpg_seq {
    int seq;
    const float *last;          /* its latest logits row */
};

/* One step of the listed sequences: prefill ids[i] (len[i] tokens) where
 * ids[i] is set, else decode the argmax of the sequence's latest row; each
 * sequence's new row is appended.  n = 0: an idle step. */
static int s_dpg_step (struct dpg *d, int n, struct dpg_seq *const *sq, const int32_t *const *ids,
                       const int32_t *len, struct rx_err *err)
{
    if (n == 0) return rx_engine_idle (d->e, err);
    struct rx_engine_req r[3] = { { 0 } };
    int32_t tok[3] = { 0 };
    for (int i = 0; i < n && i < 3; i++) {
        if (ids && ids[i]) {
            r[i] = (struct rx_engine_req) { sq[i]->seq, len[i], ids[i], 0 };
            continue;
        }
        tok[i] = rx_argmax (sq[i]->last, (int32_t) d->V);
        if (d->n_gen < d->max_gen) d->gen[d->n_gen++] = tok[i];
        r[i] = (struct rx_engine_req) { sq[i]->seq, 1, &tok[i], 0 };
    }
    int rc = rx_engine_step (d->e, r, n, d->row, err);
    for (int i = 0; i < n && rc == RX_OK; i++) {
        sq[i]->last = d->row;
        d->row += d->V;
    }
    return rc;
}

/* DP attention with decode graphs over 2 ranks (tp_job dp = 2; graph_bs =
 * [scheduler] cuda_graph_max_bs, 0 = off; kernels-cpu's emulated graphs in
 * both cases).  The schedule walks every case of the group's decision
 * (rx_dp_counts_graph):
 *   phase 0 (4 steps): rank 0 prefills A (prompt 0) and decodes it 3 steps
 *            while rank 1, which has run no step of its own yet, idles: its
 *            whole batch is padding (deepseek2: its first padded step runs
 *            op by op beside rank 0's replay, attn-mla's first forward);
 *   (1 step): rank 1 prefills B and C (prompts 1 and 0) in one step while
 *            rank 0 decodes A: op by op;
 *   phase 1 (G steps): rank 0 decodes A, rank 1 decodes B and C
 *            (prompts 1 and 0) together: M = 2, rank 0 pads one row;
 *   phase 2 (G steps): rank 0 decodes A, rank 1 is idle: M = 1, rank 1's
 *            whole batch is padding;
 *   phase 3 (1 step):  rank 1 prefills D (prompt 1) while rank 0 decodes A:
 *            one rank prefills, so both run op by op;
 *   phase 4 (G steps): A and D decode alone on their ranks: M = 1;
 *   then one step where both ranks are idle.
 * Rows: rank 0 A's (prefill's last row, then one a step: 3G + 6), rank 1
 * B and C per step then D's (2 + 2G + 1 + G); greedy tokens in step order. */
static void s_run_dp_graphs (const struct tp_job *j, int32_t rank, struct tp_out *out)
{
    memset (out, 0, sizeof *out);
    struct rx_boot b;
    struct rx_err err = { 0 };
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    int rc = rx_boot_open (&b, NULL, 0, &err);
    char num[16];
    snprintf (num, sizeof num, "%d", (int) j->graph_bs);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "kernels", "threads", "1", &err);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "kernels.cpu", "graphs", "true", &err);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "scheduler", "cuda_graph_max_bs", num, &err);
    if (rc == RX_OK && j->moe) rc = rx_conf_set (b.conf, "moe", "dispatcher", j->moe, &err);
    snprintf (num, sizeof num, "%d", (int) j->ep_size);
    if (rc == RX_OK && j->ep_size) rc = rx_conf_set (b.conf, "parallel", "ep_size", num, &err);
    rx_engine_t *e = NULL;
    if (rc == RX_OK) {
        struct rx_engine_opts o = {
            .model_path = j->gguf, .n_slots = 1024, .max_tokens = 128, .tp_rank = rank, .tp_size = 2,
            .comm = j->comm, .comm_group = j->group, .comm_timeout_s = j->timeout_s, .dp_attention = 1,
        };
        if (!(e = rx_engine_new (&b, &o, &err))) rc = err.code ? err.code : RX_EINTERNAL;
    }
    const int32_t G = j->n_gen;
    struct dpg d = { .e = e, .gen = &out->h.gen[0][0], .max_gen = S_MAX_PROMPTS * S_N_GEN };
    struct dpg_seq sa = { -1, NULL }, sb = sa, sc = sa, sd = sa;
    if (rc == RX_OK) {
        d.V = (size_t) rx_engine_info (e)->n_vocab;
        out->h.n_vocab = (int32_t) d.V;
        out->h.n_rows = rank == 0 ? 3 * G + 6 : 3 * G + 3;
        snprintf (out->h.desc, sizeof out->h.desc, "%s", rx_engine_describe (e));
        out->logits = calloc ((size_t) out->h.n_rows * d.V, sizeof (float));
        d.row = out->logits;
        const int32_t cap = j->n_prompt[0] + j->n_prompt[1] + 3 * G + 8;
        struct dpg_seq **mine = rank == 0 ? (struct dpg_seq *[]) { &sa } : (struct dpg_seq *[]) { &sb, &sc };
        for (int i = 0; i < (rank == 0 ? 1 : 2) && rc == RX_OK; i++)
            if ((mine[i]->seq = rx_engine_seq_new (e, cap, &err)) < 0) rc = mine[i]->seq;
        const int32_t *ids[2] = { j->prompt[0], j->prompt[1] }, len[2] = { j->n_prompt[0], j->n_prompt[1] };
        const int32_t *ids1[2] = { j->prompt[1], j->prompt[0] }, len1[2] = { j->n_prompt[1], j->n_prompt[0] };
        for (int32_t s = 0; s < 4 && rc == RX_OK; s++)   /* phase 0 */
            rc = rank == 0 ? s_dpg_step (&d, 1, mine, s == 0 ? ids : NULL, len, &err) : s_dpg_step (&d, 0, mine, NULL, NULL, &err);
        /* Rank 1's prefills (both prompts in one step). */
        if (rc == RX_OK)
            rc = rank == 0 ? s_dpg_step (&d, 1, mine, NULL, NULL, &err) : s_dpg_step (&d, 2, mine, ids1, len1, &err);
        for (int32_t g = 0; g < G && rc == RX_OK; g++)   /* phase 1 */
            rc = s_dpg_step (&d, rank == 0 ? 1 : 2, mine, NULL, NULL, &err);
        if (rank == 1 && rc == RX_OK) {
            rx_engine_seq_free (e, sb.seq);
            rx_engine_seq_free (e, sc.seq);
        }
        for (int32_t g = 0; g < G && rc == RX_OK; g++)   /* phase 2 */
            rc = s_dpg_step (&d, rank == 0 ? 1 : 0, mine, NULL, NULL, &err);
        struct dpg_seq *pd[1] = { &sd };
        if (rank == 1 && rc == RX_OK && (sd.seq = rx_engine_seq_new (e, cap, &err)) < 0) rc = sd.seq;
        if (rc == RX_OK)                                  /* phase 3 */
            rc = rank == 0 ? s_dpg_step (&d, 1, mine, NULL, NULL, &err) : s_dpg_step (&d, 1, pd, &ids[1], &len[1], &err);
        for (int32_t g = 0; g < G && rc == RX_OK; g++)   /* phase 4 */
            rc = s_dpg_step (&d, 1, rank == 0 ? mine : pd, NULL, NULL, &err);
        if (rc == RX_OK) rc = rx_engine_idle (e, &err);
        s_graphs_of (e, j->graph_tag, out);
    }
    if (rc != RX_OK) s_out_fail (out, rc, &err);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
}

/* [scheduler] cuda_graph_max_bs under DP attention (2 ranks, comm-shm on
 * kernels-cpu's emulated graphs: radix/comm.h graph_capturable): the same
 * schedule with graphs (max_bs 2) and without gives every row of both
 * ranks' logits -- bit for bit where a rank's batch was not padded (the
 * padded rank's rows through matmuls of 2 rows instead of 1: within 1e-4)
 * -- and the same greedy tokens; graphs of 1 and 2 rows exist on both
 * ranks (rank 0 replayed a padded 2-row graph, rank 1 an all-padding
 * 1-row one), none of 3, and none without cuda_graph_max_bs. */
#define S_LL_TAG 0x6c6c616d61ull
#define S_DS_TAG 0x6473656b32ull

static void s_dp_graphs_ep (const char *model, uint64_t tag, const char *moe, int32_t ep_size, int want)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load (model, &rp);
    cr_assert (rp.n >= 2);
    struct tp_job j = { .gguf = gguf, .n_prompts = 2, .prompt = { rp.ids[0], rp.ids[1] },
                        .n_prompt = { rp.len[0], rp.len[1] }, .n_gen = 6, .comm = "shm",
                        .group = s_group ("dpg"), .timeout_s = 60, .dp = 2, .graph_bs = 2, .graph_tag = tag,
                        .moe = moe, .ep_size = ep_size };
    struct tp_out gr[2], eg[2];
    s_run_ranks (&j, 2, gr);
    j.graph_bs = 0;
    j.group = s_group ("dpe");
    s_run_ranks (&j, 2, eg);
    const int32_t G = j.n_gen;
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (gr[r].h.rc, RX_OK, "%s: graphs, rank %d: %s", model, r, gr[r].h.msg);
        cr_assert_eq (eg[r].h.rc, RX_OK, "%s: op by op, rank %d: %s", model, r, eg[r].h.msg);
        cr_assert_eq (gr[r].h.n_rows, eg[r].h.n_rows);
        if (want)
            cr_assert (gr[r].h.graph[1] && gr[r].h.graph[2], "%s: rank %d: graphs of 1 and 2 rows (%d %d)", model, r,
                       gr[r].h.graph[1], gr[r].h.graph[2]);
        else
            cr_assert (!gr[r].h.graph[1] && !gr[r].h.graph[2], "%s %s: rank %d: no graphs (%d %d)", model,
                       moe ? moe : "", r, gr[r].h.graph[1], gr[r].h.graph[2]);
        cr_assert_eq (gr[r].h.graph[3], 0, "%s: rank %d: no graph of 3 rows", model, r);
        cr_assert (!eg[r].h.graph[1] && !eg[r].h.graph[2], "%s: rank %d: no graphs when off", model, r);
        cr_assert (!memcmp (gr[r].h.gen, eg[r].h.gen, sizeof gr[r].h.gen), "%s: rank %d: the same greedy tokens",
                   model, r);
        const size_t V = (size_t) gr[r].h.n_vocab;
        double maxd = 0;
        for (int32_t i = 0; i < gr[r].h.n_rows; i++) {
            /* Rank 0's phase-1 decode rows were padded (rows 5 .. G + 4). */
            const int padded = r == 0 && i >= 5 && i < G + 5;
            const float *a = gr[r].logits + (size_t) i * V, *c = eg[r].logits + (size_t) i * V;
            if (!padded) {
                cr_assert (!memcmp (a, c, V * sizeof (float)), "%s: rank %d row %d: graph replay == op by op, bit for bit",
                           model, r, i);
                continue;
            }
            for (size_t v = 0; v < V; v++) {
                double dd = fabs ((double) a[v] - (double) c[v]);
                if (!(dd <= maxd)) maxd = dd;
            }
        }
        cr_assert (maxd <= 1e-4, "%s: rank %d: padded rows differ by %g", model, r, maxd);
        fprintf (stderr, "test_tp: %s: DP graphs rank %d: %d rows equal op by op (padded rows within %.3g)\n", model, r,
                 gr[r].h.n_rows, maxd);
        s_out_free (&gr[r]);
        s_out_free (&eg[r]);
    }
    s_ref_free (&rp);
    free (gguf);
}

static void s_dp_graphs (const char *model, uint64_t tag) { s_dp_graphs_ep (model, tag, NULL, 0, 1); }

Test (tp, dp_attention_graphs) { s_dp_graphs ("tiny-llama", S_LL_TAG); }
Test (tp, dp_attention_graphs_q8) { s_dp_graphs ("tiny-llama-q8", S_LL_TAG); }
/* An MoE model (moe-local, every rank all experts: nothing exchanged):
 * its decode steps replay once the dispatcher gives device offsets (after
 * the first decode step), the expert pass inside the graph. */
Test (tp, dp_attention_graphs_moe) { s_dp_graphs ("tiny-moe", S_LL_TAG); }
/* deepseek2 (MLA: attn-mla's host-side prepare runs before each capture
 * or replay of the padded batch; a rank's first padded step runs op by op
 * beside the replaying one), the leading dense block's FFN split over the
 * group, the MoE blocks on the device. */
Test (tp, dp_attention_graphs_deepseek2) { s_dp_graphs ("tiny-deepseek2", S_DS_TAG); }
/* Expert parallelism (ep_size 2): moe-ep_low_latency's device path
 * (kernels' moe_ll_pack / moe_ll_unpack, fixed-shape exchange captured
 * with the step) replays; ep_normal exchanges counts through the host, so
 * its steps run op by op (the same logits either way). */
Test (tp, dp_attention_graphs_moe_ep_low_latency) { s_dp_graphs_ep ("tiny-moe", S_LL_TAG, "ep_low_latency", 2, 1); }
Test (tp, dp_attention_graphs_deepseek2_ep_low_latency)
{
    s_dp_graphs_ep ("tiny-deepseek2", S_DS_TAG, "ep_low_latency", 2, 1);
}
/* ep_auto: the model passes the group's largest chunk (moe.h
 * group_max_tok, from the count exchange), so its mode needs no vote and
 * its decode steps take the low-latency device path and replay too. */
Test (tp, dp_attention_graphs_moe_ep_auto) { s_dp_graphs_ep ("tiny-moe", S_LL_TAG, "ep_auto", 2, 1); }
Test (tp, dp_attention_graphs_moe_ep_normal_op_by_op) { s_dp_graphs_ep ("tiny-moe", S_LL_TAG, "ep_normal", 2, 0); }


/* [scheduler] cuda_graph_max_bs under tensor parallelism (2 ranks, comm-shm
 * on kernels-cpu's emulated graphs): every rank runs the same batch, so
 * every rank replays the same decode graph with the row-parallel
 * all-reduces inside.  The logits of every prompt row and greedy step equal
 * those of the ranks without graphs, bit for bit, on both ranks; the
 * 1-row graph exists only with graphs on. */
static void s_tp_graphs (const char *model, uint64_t tag)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load (model, &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = rp.n, .n_gen = 8, .comm = "shm", .group = s_group ("tpg"),
                        .timeout_s = 60, .graph_bs = 2, .graph_tag = tag };
    for (int32_t i = 0; i < rp.n; i++) {
        j.prompt[i] = rp.ids[i];
        j.n_prompt[i] = rp.len[i];
    }
    struct tp_out gr[2], eg[2];
    s_run_ranks (&j, 2, gr);
    j.graph_bs = 0;
    j.group = s_group ("tpe");
    s_run_ranks (&j, 2, eg);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (gr[r].h.rc, RX_OK, "%s: graphs, rank %d: %s", model, r, gr[r].h.msg);
        cr_assert_eq (eg[r].h.rc, RX_OK, "%s: op by op, rank %d: %s", model, r, eg[r].h.msg);
        cr_assert (gr[r].h.graph[1] && !gr[r].h.graph[2], "%s: rank %d: the 1-row graph only (%d %d)", model, r, gr[r].h.graph[1],
                   gr[r].h.graph[2]);
        cr_assert (!eg[r].h.graph[1], "%s: rank %d: no graph when off", model, r);
        cr_assert_eq (gr[r].h.n_rows, eg[r].h.n_rows);
        cr_assert (!memcmp (gr[r].h.gen, eg[r].h.gen, sizeof gr[r].h.gen), "%s: rank %d: the same greedy tokens", model, r);
        const size_t V = (size_t) gr[r].h.n_vocab;
        for (int32_t i = 0; i < gr[r].h.n_rows; i++)
            cr_assert (!memcmp (gr[r].logits + (size_t) i * V, eg[r].logits + (size_t) i * V, V * sizeof (float)),
                       "%s: rank %d row %d: graph replay == op by op, bit for bit", model, r, i);
        s_out_free (&gr[r]);
        s_out_free (&eg[r]);
    }
    s_ref_free (&rp);
    free (gguf);
}

Test (tp, tp2_graphs) { s_tp_graphs ("tiny-llama", S_LL_TAG); }
/* deepseek2 under TP: heads split (their all-reduce inside the graph),
 * MoE replicated on the device. */
Test (tp, tp2_graphs_deepseek2) { s_tp_graphs ("tiny-deepseek2", S_DS_TAG); }

/* MoE under DP attention (tiny-moe: F16; prompts of 5 and 6 tokens in
 * phase 1, 61 in phase 2 with rank 1 idle): every dispatcher gives each
 * rank the tp 1 (local) logits of its own prompt. */
Test (tp, dp_attention_moe_local) { s_dp_moe ("tiny-moe", 2, 1e-3, "local", 1, 0); }
/* Chunks of 5 tokens: rank 0 (5 tokens) makes 1 dispatch per layer of its
 * own, rank 1 (6) 2, so rank 0 must dispatch an empty chunk too; in phase 2
 * the idle rank 1 dispatches 13 empty chunks per layer. */
Test (tp, dp_attention_moe_ep_normal) { s_dp_moe ("tiny-moe", 2, 1e-3, "ep_normal", 2, 5); }
Test (tp, dp_attention_moe_ep_low_latency) { s_dp_moe ("tiny-moe", 2, 1e-3, "ep_low_latency", 2, 0); }
Test (tp, dp_attention_moe_ep_auto) { s_dp_moe ("tiny-moe", 2, 1e-3, "ep_auto", 2, 0); }

/* deepseek2 (MLA, one leading dense block, sigmoid routing with
 * exp_probs_b, a shared expert) under DP attention over 2 ranks: the dense
 * block's FFN split over the group, the MoE blocks through each
 * dispatcher; every rank's own prompt (5 and 6 tokens) then rank 0 alone
 * (61 tokens) with rank 1 idle, equal to the tp 1 engine's logits and
 * greedy tokens. */
Test (tp, dp_attention_deepseek2_local) { s_dp_moe ("tiny-deepseek2", 2, 1e-3, "local", 1, 0); }
/* Chunks of 5 tokens: the ranks' dispatch counts differ (1 and 2). */
Test (tp, dp_attention_deepseek2_ep_normal) { s_dp_moe ("tiny-deepseek2", 2, 1e-3, "ep_normal", 2, 5); }
Test (tp, dp_attention_deepseek2_ep_auto) { s_dp_moe ("tiny-deepseek2", 2, 1e-3, "ep_auto", 2, 0); }

/* [parallel] ep_size other than 1 or tp_size with DP attention: every rank
 * refuses it at once (RX_ECONFIG naming the key), also on one rank. */
Test (tp, dp_attention_bad_ep_size)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-moe", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { rp.ids[0] },
                        .n_prompt = { rp.len[0] }, .n_gen = 1, .group = s_group ("dpep"),
                        .timeout_s = 60, .dp = 1, .moe = "ep_normal", .ep_size = 3 };
    struct tp_out o[2];
    time_t t0 = time (NULL);
    s_run_ranks (&j, 2, o);
    cr_assert (time (NULL) - t0 < 30, "the ranks took %lds to fail", (long) (time (NULL) - t0));
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (o[r].h.rc, RX_ECONFIG, "rank %d: %s (%s)", r, rx_status_name (o[r].h.rc), o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "[parallel] ep_size = 3"), "%s", o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "tp_size (2)"), "%s", o[r].h.msg);
    }
    /* One rank (no group): ep_size 2 needs DP attention over 2 ranks. */
    j.ep_size = 2;
    s_run (&j, 0, 1, &o[0]);
    cr_assert_eq (o[0].h.rc, RX_ECONFIG, "%s (%s)", rx_status_name (o[0].h.rc), o[0].h.msg);
    cr_assert_not_null (strstr (o[0].h.msg, "[parallel] ep_size = 2"), "%s", o[0].h.msg);
    cr_assert_not_null (strstr (o[0].h.msg, "no DP-attention group"), "%s", o[0].h.msg);
    s_ref_free (&rp);
    free (gguf);
}

/* radixd's check of [parallel] ep_size (rx_topo_from_conf): 1, or
 * tp_size with dp_attention; anything else RX_ECONFIG naming the key. */
Test (tp, topology_ep_size)
{
    struct rx_boot b;
    struct rx_err err = { 0 };
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    cr_assert_eq (rx_boot_open (&b, NULL, 0, &err), RX_OK, "%s", err.msg);
    struct rx_topo t;
    cr_assert_eq (rx_topo_from_conf (b.conf, &t, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_conf_set (b.conf, "parallel", "ep_size", "2", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_topo_from_conf (b.conf, &t, &err), RX_ECONFIG);
    cr_assert_not_null (strstr (err.msg, "[parallel] ep_size: 2: must be 1, or equal to tp_size (1)"), "%s", err.msg);
    cr_assert_not_null (strstr (err.msg, "(it is off)"), "%s", err.msg);
    cr_assert_eq (rx_conf_set (b.conf, "parallel", "tp_size", "2", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_conf_set (b.conf, "parallel", "dp_size", "2", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_conf_set (b.conf, "parallel", "dp_attention", "true", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_topo_from_conf (b.conf, &t, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (t.world, 2);
    cr_assert_eq (rx_conf_set (b.conf, "parallel", "ep_size", "4", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_topo_from_conf (b.conf, &t, &err), RX_ECONFIG);
    cr_assert_not_null (strstr (err.msg, "[parallel] ep_size: 4: must be 1, or equal to tp_size (2)"), "%s", err.msg);
    cr_assert_eq (rx_conf_set (b.conf, "parallel", "ep_size", "1", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_topo_from_conf (b.conf, &t, &err), RX_OK, "%s", err.msg);
    rx_boot_close (&b);
}

/* rx_engine_idle without DP attention is RX_EINVAL (tp 1 and tp 2), and an
 * idle batch (0 tokens) is refused by a non-DP model; with DP attention on
 * one rank rx_engine_idle is a no-op. */
Test (tp, idle_errors)
{
    TU_REQUIRE_SHARED ();
    char *gguf = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf");
    int32_t tok = 1;
    struct tp_job j = { .gguf = gguf, .n_prompts = 1, .prompt = { &tok }, .n_prompt = { 1 },
                        .n_gen = 1, .group = s_group ("idle"), .timeout_s = 60, .dp = 1,
                        .dp_idle_only = 1 };
    struct tp_out o[2];
    s_run (&j, 0, 0, &o[0]);
    cr_assert_eq (o[0].h.rc, RX_EINVAL, "%s", o[0].h.msg);
    cr_assert_not_null (strstr (o[0].h.msg, "without DP attention"), "%s", o[0].h.msg);
    s_run_ranks (&j, 2, o);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq (o[r].h.rc, RX_EINVAL, "rank %d: %s", r, o[r].h.msg);
        cr_assert_not_null (strstr (o[r].h.msg, "without DP attention"), "%s", o[r].h.msg);
    }

    struct rx_boot b;
    struct rx_err err = { 0 };
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    cr_assert_eq (rx_boot_open (&b, NULL, 0, &err), RX_OK, "%s", err.msg);
    struct rx_engine_opts eo = { .model_path = gguf, .n_slots = 64, .max_tokens = 8 };
    rx_engine_t *e = rx_engine_new (&b, &eo, &err);
    cr_assert_not_null (e, "%s", err.msg);
    cr_assert_eq (rx_engine_dp_attention (e), 0);
    struct rx_model_batch mb = { .struct_size = sizeof mb, .n_tokens = 0 };
    cr_assert_eq (rx_engine_forward (e, &mb, NULL, &err), RX_EINVAL);
    cr_assert_not_null (strstr (err.msg, "idle batch needs DP attention"), "%s", err.msg);
    rx_engine_destroy (&e);
    eo.dp_attention = 1;
    e = rx_engine_new (&b, &eo, &err);
    cr_assert_not_null (e, "%s", err.msg);
    cr_assert_eq (rx_engine_dp_attention (e), 1);
    cr_assert_eq (rx_engine_idle (e, &err), RX_OK, "%s", err.msg);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    free (gguf);
}

/* A rank whose batch is refused still takes part in the step's count
 * exchange: it fails with its own error, the other rank at once with one
 * naming it (no wait for the comm timeout). */
Test (tp, dp_attention_refused_batch)
{
    struct ref_prompts rp;
    char *gguf = s_ref_load ("tiny-llama", &rp);
    struct tp_job j = { .gguf = gguf, .n_prompts = 2, .prompt = { rp.ids[0], rp.ids[1] },
                        .n_prompt = { rp.len[0], rp.len[1] }, .n_gen = 2, .group = s_group ("dpbad"),
                        .timeout_s = 60, .dp = 1, .dp_bad = 1 };
    struct tp_out o[2];
    time_t t0 = time (NULL);
    s_run_ranks (&j, 2, o);
    cr_assert (time (NULL) - t0 < 30, "the ranks took %lds to fail", (long) (time (NULL) - t0));
    cr_assert_eq (o[1].h.rc, RX_EINVAL, "rank 1: %s (%s)", rx_status_name (o[1].h.rc), o[1].h.msg);
    cr_assert_not_null (strstr (o[1].h.msg, "out of vocabulary"), "%s", o[1].h.msg);
    cr_assert_eq (o[0].h.rc, RX_EIO, "rank 0: %s (%s)", rx_status_name (o[0].h.rc), o[0].h.msg);
    cr_assert_not_null (strstr (o[0].h.msg, "rank 1 refused its batch"), "%s", o[0].h.msg);
    s_out_free (&o[0]);
    s_out_free (&o[1]);
    s_ref_free (&rp);
    free (gguf);
}
