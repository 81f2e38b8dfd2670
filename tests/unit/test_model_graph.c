/* tests/unit/test_model_graph.c -- models/graph.h, the decode-step graph
 * bookkeeping of the model plugins, against a mock kernel backend that
 * records graph calls and can make a capture fail:
 *   - the shape rule (decode steps of n <= max_bs sequences, every row's
 *     logits), graphs off without cuda_graph_max_bs;
 *   - first sight of n captures (the step runs inside begin .. end) and
 *     launches; the next step only launches; a new logits or staging
 *     buffer, or a backend that dropped its graphs, captures again;
 *   - a backend that cannot capture (RX_ENOTSUP): the step runs eagerly
 *     and graphs stay off;
 *   - a capture that fails (inside the step, or at graph_end): one warning
 *     line, graphs off, the step run again eagerly, and the call succeeds;
 *     an error of the eager step itself is returned;
 *   - every capture logs one info line;
 *   - DP attention's padding (rx_model_pad_batch): a decode batch and an
 *     idle one padded to M rows, the pad rows one-row sequences on the pad
 *     slot, the real rows untouched;
 *   - rx_model_graphs_ranks: tensor-parallel / DP graphs only with a comm
 *     whose collectives a capture records. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../models/graph.h"

/* ------------------------------------------------------------ the mock -- */

static struct mock {
    int begin_rc, end_rc;       /* what graph_begin / graph_end answer */
    int capturing;
    uint64_t key, have[8];      /* captured keys */
    int n_have;
    int begins, ends, launches;
    char log[512];
    int logs;                   /* warnings */
    int infos;                  /* info lines (captures, rx_model_graphs_ranks) */
    char info[512];
} M;

static int m_begin (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    (void) be; (void) s;
    M.begins++;
    if (M.begin_rc != RX_OK) return rx_err_set (err, M.begin_rc, "mock: begin refused");
    M.capturing = 1;
    M.key = key;
    return RX_OK;
}

static int m_end (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    (void) be; (void) s;
    M.ends++;
    cr_assert (M.capturing && key == M.key, "end of the capture begun");
    M.capturing = 0;
    if (M.end_rc != RX_OK) return rx_err_set (err, M.end_rc, "mock: capture invalidated");
    if (M.n_have < 8) M.have[M.n_have++] = key;
    return RX_OK;
}

static int m_has (void *be, uint64_t key)
{
    (void) be;
    for (int i = 0; i < M.n_have; i++)
        if (M.have[i] == key) return 1;
    return 0;
}

static int m_launch (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err)
{
    (void) be; (void) s;
    cr_assert (m_has (NULL, key), "launch of a captured graph");
    M.launches++;
    (void) err;
    return RX_OK;
}

static void m_log (const struct rx_host *h, int level, const char *fmt, ...)
{
    (void) h;
    cr_assert (level == RX_LOG_WARN || level == RX_LOG_INFO, "level %d", level);
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (level == RX_LOG_WARN ? M.log : M.info, sizeof M.log, fmt, ap);
    va_end (ap);
    if (level == RX_LOG_WARN) M.logs++;
    else M.infos++;
}

static void *m_alloc (const struct rx_host *h, size_t n, size_t align)
{
    (void) h; (void) align;
    return malloc (n);
}

static void m_free (const struct rx_host *h, void *p)
{
    (void) h;
    free (p);
}

static struct rx_kernels_ops K;
static struct rx_host H;
static struct rx_kctx KC;

/* The model's step: counts its runs, inside a capture or not; fails with
 * fail_rc on the runs listed in fail_mask (bit i = run i). */
static struct step { int runs, captured_runs, fail_rc; unsigned fail_mask; } S;

static int s_step (void *model, const struct rx_model_batch *b, const struct rx_model_batch_dev *dv,
                   struct rx_err *err)
{
    (void) model; (void) b; (void) dv;
    int i = S.runs++;
    if (M.capturing) S.captured_runs++;
    if (S.fail_mask & (1u << i)) return rx_err_set (err, S.fail_rc, "step: synchronize inside a capture");
    return RX_OK;
}

static void s_setup (void)
{
    memset (&M, 0, sizeof M);
    memset (&S, 0, sizeof S);
    memset (&K, 0, sizeof K);
    K.struct_size = sizeof K;
    K.graph_begin = m_begin;
    K.graph_end = m_end;
    K.graph_has = m_has;
    K.graph_launch = m_launch;
    memset (&H, 0, sizeof H);
    H.struct_size = sizeof H;
    H.log = m_log;
    H.alloc = m_alloc;
    H.free_ = m_free;
    KC = (struct rx_kctx) { .ops = &K, .be = &M, .stream = NULL };
}

static struct rx_model_env s_env (int32_t max_bs)
{
    struct rx_model_env env;
    memset (&env, 0, sizeof env);
    env.struct_size = sizeof env;
    env.cuda_graph_max_bs = max_bs;
    return env;
}

/* A decode batch of n sequences (one row each, every row's logits). */
static struct rx_model_batch s_decode (int32_t n, float *logits)
{
    struct rx_model_batch b;
    memset (&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_tokens = n;
    b.n_seq = n;
    b.n_out = n;
    b.logits = logits;
    return b;
}

TestSuite (model_graph, .init = s_setup);

Test (model_graph, shape_rule_and_off_without_max_bs)
{
    struct rx_model_graphs g;
    struct rx_err err = { 0 };
    struct rx_model_env env = s_env (0);
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x6c6c616d61ull, "model-test", &err), RX_OK);
    float lg[4];
    struct rx_model_batch b = s_decode (1, lg);
    cr_assert_eq (rx_model_graphs_shape (&g, &b), 0, "off without cuda_graph_max_bs");
    rx_model_graphs_free (&g, &H);
    env = s_env (4);
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x6c6c616d61ull, "model-test", &err), RX_OK);
    cr_assert (rx_model_graphs_shape (&g, &b));
    b = s_decode (4, lg);
    cr_assert (rx_model_graphs_shape (&g, &b), "n = max_bs");
    b = s_decode (5, lg);
    cr_assert_eq (rx_model_graphs_shape (&g, &b), 0, "n > max_bs");
    b = s_decode (3, lg);
    b.n_tokens = 4;   /* a prefill row in it */
    cr_assert_eq (rx_model_graphs_shape (&g, &b), 0, "not one row per sequence");
    b = s_decode (3, lg);
    b.n_out = 2;
    cr_assert_eq (rx_model_graphs_shape (&g, &b), 0, "not every row's logits");
    cr_assert_eq (rx_model_graphs_key (&g, 3), 0x6c6c616d61000003ull);
    rx_model_graphs_free (&g, &H);
}

Test (model_graph, capture_once_then_replay_recapture_on_new_buffers)
{
    struct rx_model_graphs g;
    struct rx_err err = { 0 };
    struct rx_model_env env = s_env (8);
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
    float lg[8], lg2[8];
    int32_t stage[4], stage2[4];
    struct rx_model_batch_dev dv = { .tokens = stage };
    struct rx_model_batch b = s_decode (2, lg);
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (S.runs, 1);
    cr_assert_eq (S.captured_runs, 1, "the first step of n = 2 is captured");
    cr_assert_eq (M.launches, 1, "and launched");
    for (int i = 0; i < 3; i++)
        cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (S.runs, 1, "replays do not run the step");
    cr_assert_eq (M.launches, 4);
    b.logits = lg2;   /* the engine grew its logits buffer */
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (S.captured_runs, 2, "a new logits buffer captures again");
    dv.tokens = stage2;
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (S.captured_runs, 3, "a new staging buffer captures again");
    M.n_have = 0;   /* the backend dropped its graphs (device memory freed) */
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (S.captured_runs, 4, "a dropped graph is captured again");
    cr_assert_eq (M.logs, 0);
    cr_assert_eq (M.infos, 4, "one info line per capture");
    cr_assert_str_eq (M.info, "model-test: captured the CUDA graph of a 2-sequence decode step");
    rx_model_graphs_free (&g, &H);
}

/* Host memory as the mock's "device" (the staging block's upload). */
static int m_dalloc (void *be, size_t bytes, size_t align, void **d, struct rx_err *err)
{
    (void) be; (void) align; (void) err;
    *d = malloc (bytes);
    return *d ? RX_OK : RX_ENOMEM;
}
static void m_dfree (void *be, void *d) { (void) be; free (d); }
static int m_h2d (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err)
{
    (void) be; (void) s; (void) err;
    memcpy (dst, src, bytes);
    return RX_OK;
}
static int m_sync (void *be, rx_kstream_t *s, struct rx_err *err) { (void) be; (void) s; (void) err; return RX_OK; }

/* A decode batch of 2 sequences (KV lengths 3 and 1) padded to 4 rows, and
 * an idle batch padded to 3, as staged (rx_model_stage_upload_padded: the
 * pad rows written once, straight into the staging block) and described
 * (rx_model_pad_batch): the real rows as they were, then one-row sequences
 * of token 0 at position 0 on the pad slot; every row's logits into the
 * scratch given; the uploaded copy equal to the host block. */
Test (model_graph, dp_padding)
{
    K.alloc = m_dalloc;
    K.free_ = m_dfree;
    K.copy_h2d = m_h2d;
    K.synchronize = m_sync;
    const int32_t T = 64;
    struct rx_model_stage st = { 0 };
    struct rx_model_pad pad = { 0 };
    struct rx_err err = { 0 };
    cr_assert_eq (rx_model_stage_alloc (&st, &H, &KC, T, 8, "model-test", &err), RX_OK, "%s", err.msg);
    float scratch[1];
    const int32_t tok[2] = { 11, 22 }, pos[2] = { 2, 0 }, qs[3] = { 0, 1, 2 }, ks[3] = { 0, 3, 4 },
                  slots[4] = { 7, 8, 9, 5 }, rows[2] = { 0, 1 };
    float lg[1];
    struct rx_model_batch b = { .struct_size = sizeof b, .n_tokens = 2, .tokens = tok, .pos = pos, .n_seq = 2,
                                .q_start = qs, .kv_start = ks, .kv_slots = slots, .n_out = 2, .out_rows = rows,
                                .logits = lg };
    struct rx_model_batch pb = { 0 };
    struct rx_model_batch_dev dv;
    cr_assert_eq (rx_model_stage_upload_padded (&st, &H, &KC, T, &b, 4, 100, "model-test", &dv, &err), RX_OK, "%s",
                  err.msg);
    cr_assert_eq (rx_model_pad_batch (&pad, &H, &st, T, &b, 4, scratch, &pb, "model-test", &err), RX_OK, "%s",
                  err.msg);
    cr_assert_eq (pb.n_tokens, 4);
    cr_assert_eq (pb.n_seq, 4);
    cr_assert_eq (pb.n_out, 4);
    cr_assert_eq (pb.logits, scratch);
    const int32_t w_tok[4] = { 11, 22, 0, 0 }, w_pos[4] = { 2, 0, 0, 0 }, w_qs[5] = { 0, 1, 2, 3, 4 },
                  w_ks[5] = { 0, 3, 4, 5, 6 }, w_slots[6] = { 7, 8, 9, 5, 100, 100 }, w_rows[4] = { 0, 1, 2, 3 },
                  w_new[4] = { 9, 5, 100, 100 };
    cr_assert_arr_eq (pb.tokens, w_tok, sizeof w_tok);
    cr_assert_arr_eq (pb.pos, w_pos, sizeof w_pos);
    cr_assert_arr_eq (pb.q_start, w_qs, sizeof w_qs);
    cr_assert_arr_eq (pb.kv_start, w_ks, sizeof w_ks);
    cr_assert_arr_eq (pb.kv_slots, w_slots, sizeof w_slots);
    cr_assert_arr_eq (pb.out_rows, w_rows, sizeof w_rows);
    /* the upload: the same arrays, and each row's new slot */
    cr_assert_arr_eq (dv.tokens, w_tok, sizeof w_tok);
    cr_assert_arr_eq (dv.q_start, w_qs, sizeof w_qs);
    cr_assert_arr_eq (dv.kv_slots, w_slots, sizeof w_slots);
    cr_assert_arr_eq (dv.new_slots, w_new, sizeof w_new);
    /* Idle: every row padding; the blocks are reused (and grown when needed). */
    struct rx_model_batch idle = { .struct_size = sizeof idle };
    cr_assert_eq (rx_model_stage_upload_padded (&st, &H, &KC, T, &idle, 3, 100, "model-test", &dv, &err), RX_OK,
                  "%s", err.msg);
    cr_assert_eq (rx_model_pad_batch (&pad, &H, &st, T, &idle, 3, scratch, &pb, "model-test", &err), RX_OK, "%s",
                  err.msg);
    const int32_t i_qs[4] = { 0, 1, 2, 3 }, i_slots[3] = { 100, 100, 100 }, i_tok[3] = { 0, 0, 0 };
    cr_assert_eq (pb.n_tokens, 3);
    cr_assert_eq (pb.n_seq, 3);
    cr_assert_arr_eq (pb.q_start, i_qs, sizeof i_qs);
    cr_assert_arr_eq (pb.kv_start, i_qs, sizeof i_qs);
    cr_assert_arr_eq (pb.kv_slots, i_slots, sizeof i_slots);
    cr_assert_arr_eq (pb.tokens, i_tok, sizeof i_tok);
    cr_assert_arr_eq (dv.new_slots, i_slots, sizeof i_slots);
    /* 64 rows: the staging block (8 KV entries at first) grows */
    cr_assert_eq (rx_model_stage_upload_padded (&st, &H, &KC, T, &b, 64, 100, "model-test", &dv, &err), RX_OK,
                  "%s", err.msg);
    cr_assert_eq (rx_model_pad_batch (&pad, &H, &st, T, &b, 64, scratch, &pb, "model-test", &err), RX_OK, "%s",
                  err.msg);
    cr_assert_geq (st.cap_slots, 4 + 62);
    cr_assert_eq (pb.kv_start[64], 4 + 62);
    cr_assert_eq (pb.kv_slots[65], 100);
    cr_assert_eq (pb.out_rows[63], 63);
    cr_assert_eq (dv.kv_slots[65], 100);
    rx_model_pad_free (&pad, &H);
    cr_assert_null (pad.rows);
    rx_model_stage_free (&st, &H, &KC);
}

/* The comm side of multi-rank graphs: a comm that cannot capture keeps
 * them off (one info line naming the reason), as does the model's own
 * reason; a capturing one turns on tp or dp. */
static int c_yes (void *comm) { (void) comm; return 1; }
static int c_no (void *comm) { (void) comm; return 0; }

Test (model_graph, ranks_need_a_capturing_comm)
{
    struct rx_err err = { 0 };
    struct rx_model_env env = s_env (4);
    struct rx_comm_ops yes = { .struct_size = sizeof yes, .graph_capturable = c_yes };
    struct rx_comm_ops no = { .struct_size = sizeof no, .graph_capturable = c_no };
    struct rx_comm_ops old = { .struct_size = RX_COMM_OPS_SIZE_1_0 };
    struct { const struct rx_comm_ops *c; int dp; const char *why; int tp_on, dp_on; const char *says; } cases[] = {
        { &yes, 0, NULL, 1, 0, "tensor-parallel rank 1: decode steps of up to 4 rows a rank replay CUDA graphs" },
        { &yes, 1, NULL, 0, 1, "DP attention rank 1: decode steps of up to 4 rows a rank replay CUDA graphs (every rank padded" },
        { &no, 1, NULL, 0, 0, "not as CUDA graphs: the comm plugin's collectives cannot be captured" },
        { &old, 0, NULL, 0, 0, "not as CUDA graphs: the comm plugin's collectives cannot be captured" },
        { &yes, 1, "two-batch overlap", 0, 0, "DP attention rank 1: decode steps run op by op, not as CUDA graphs: two-batch overlap" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rx_model_graphs g;
        cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
        M.infos = 0;
        rx_model_graphs_ranks (&g, "x.gguf", 1, 2, cases[i].dp, cases[i].why, cases[i].c, NULL);
        cr_assert_eq (g.tp, cases[i].tp_on, "case %zu", i);
        cr_assert_eq (g.dp, cases[i].dp_on, "case %zu", i);
        cr_assert_eq (M.infos, 1, "case %zu: one line", i);
        cr_assert (strstr (M.info, cases[i].says), "case %zu: %s", i, M.info);
        rx_model_graphs_free (&g, &H);
    }
    /* One rank: nothing to decide, nothing logged. */
    struct rx_model_graphs g;
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
    M.infos = 0;
    rx_model_graphs_ranks (&g, "x.gguf", 0, 1, 0, NULL, &yes, NULL);
    cr_assert (!g.tp && !g.dp && M.infos == 0);
    rx_model_graphs_free (&g, &H);
}

Test (model_graph, backend_without_graphs_runs_eagerly)
{
    struct rx_model_graphs g;
    struct rx_err err = { 0 };
    struct rx_model_env env = s_env (8);
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
    M.begin_rc = RX_ENOTSUP;
    float lg[4];
    int32_t stage[4];
    struct rx_model_batch_dev dv = { .tokens = stage };
    struct rx_model_batch b = s_decode (1, lg);
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (err.code, RX_OK, "error cleared: %s", err.msg);
    cr_assert_eq (S.runs, 1);
    cr_assert_eq (S.captured_runs, 0);
    cr_assert_eq (g.max_bs, 0, "graphs off from now on");
    cr_assert_eq (rx_model_graphs_shape (&g, &b), 0);
    cr_assert_eq (M.logs, 0, "not a failure: no warning");
    rx_model_graphs_free (&g, &H);
}

Test (model_graph, failed_capture_turns_graphs_off_and_reruns_the_step)
{
    float lg[4];
    int32_t stage[4];
    struct rx_model_batch_dev dv = { .tokens = stage };
    struct rx_model_batch b = s_decode (3, lg);
    struct rx_err err = { 0 };
    struct rx_model_env env = s_env (8);
    /* 1. The step fails inside the capture (a synchronize there). */
    struct rx_model_graphs g;
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
    S.fail_mask = 1u;
    S.fail_rc = RX_EDEVICE;
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (err.code, RX_OK);
    cr_assert_eq (S.runs, 2, "captured once, then eagerly");
    cr_assert_eq (S.captured_runs, 1);
    cr_assert_eq (M.ends, 1, "the capture was ended");
    cr_assert_eq (M.launches, 0, "nothing launched");
    cr_assert_eq (g.max_bs, 0, "graphs off");
    cr_assert_eq (M.logs, 1, "one warning");
    cr_assert (strstr (M.log, "model-test") && strstr (M.log, "3-sequence") && strstr (M.log, "synchronize inside"),
               "%s", M.log);
    rx_model_graphs_free (&g, &H);
    /* 2. The backend invalidates the capture at graph_end. */
    s_setup ();
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
    M.end_rc = RX_EDEVICE;
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (S.runs, 2);
    cr_assert_eq (M.launches, 0);
    cr_assert_eq (g.max_bs, 0);
    cr_assert (strstr (M.log, "capture invalidated"), "%s", M.log);
    rx_model_graphs_free (&g, &H);
    /* 3. The eager rerun fails too: that error is the call's. */
    s_setup ();
    cr_assert_eq (rx_model_graphs_init (&g, &H, &env, 0x42ull, "model-test", &err), RX_OK);
    S.fail_mask = 3u;
    S.fail_rc = RX_ENOMEM;
    cr_assert_eq (rx_model_graphs_run (&g, &KC, NULL, s_step, &b, &dv, &err), RX_ENOMEM);
    cr_assert (strstr (err.msg, "step:"), "%s", err.msg);
    cr_assert_eq (S.runs, 2);
    rx_model_graphs_free (&g, &H);
}
