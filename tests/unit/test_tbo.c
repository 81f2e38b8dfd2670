/* tests/unit/test_tbo.c -- two-batch overlap (TBO).
 *
 * split: models/tbo.h's cut of a batch into two micro-batches against a
 *   brute-force reference written here (the cut that minimizes the larger
 *   half, ties to the smaller index): never inside a sequence, decode at
 *   half the requests, 1 sequence and empty batches not split, and
 *   rx_tbo_sub's rebased arrays.
 * schedule: models/tbo.h's micro-batch schedule (rx_tbo_plan,
 *   rx_tbo_layers) against a recording mock dispatcher and model: the
 *   call order of its comment, written out here, with the asynchronous ops
 *   and the sequential fallback; under DP attention a rank with an empty
 *   micro-batch or none makes the same dispatcher calls; an error drains
 *   what is in flight and is returned as raised.
 * dispatcher: the asynchronous ops of radix/moe.h (dispatch_start/wait,
 *   combine_start/wait) of every MoE plugin at ep_size 1, two instances
 *   with exchanges interleaved as the model runs them, give bitwise the
 *   blocking dispatch/combine results; calls out of order are RX_EINVAL.
 * engine: tiny-moe through the engine with [scheduler] two_batch_overlap
 *   on and off, a script of multi-sequence steps (prefill, decode, mixed
 *   prefill + decode, 1-request batches): alone with moe-local, and under
 *   DP attention over 2 forked ranks (comm-shm) with ep_size 2 and
 *   ep_normal, ep_low_latency, ep_auto (and ep_normal in chunks of 5
 *   tokens), where one rank also runs 1-request steps and idle steps while
 *   the other works.  Every rank's greedy tokens must be identical with TBO
 *   on and off, and the logits equal within 1e-4 (the max difference is
 *   printed: the avx512 GEMM picks other kernels for fewer rows) -- and
 *   bitwise equal with [kernels.cpu] isa = scalar (alone and DP 2).  Plus
 *   the sequential fallback with a dispatcher without the asynchronous ops
 *   (tests/tbo-fixtures/moe-local_sync.so: moe-local's ABI 1.0 table).
 * deepseek2: the same script on tiny-deepseek2 (MLA, a leading dense
 *   block, MoE with a shared expert): alone (local, chunks of 5, scalar
 *   bitwise, the sequential fallback), DP attention over 2 ranks with
 *   ep_size 2 (ep_normal also scalar bitwise and in chunks of 5,
 *   ep_low_latency, ep_auto) and ep_size 1 (local), and tensor parallelism
 *   over 2 ranks (the same script on both); logits within 1e-5.
 *
 * No Criterion .timeout (see test_models_ref.c); the ranks have the comm
 * timeout and the parent kills them after S_DEADLINE seconds. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <radix/kernel.h>
#include <radix/moe.h>

#include "boot.h"
#include "engine.h"
#include "loader.h"
#include "sampling.h"
#include "../../models/tbo.h"
#include "../testutil.h"

#define S_DEADLINE 180
#define S_MAX_ROWS 1024
#define S_MAX_GEN  256

/* ------------------------------------------------------------- split -- */

/* The reference: the cut s in 1 .. n_seq-1 whose larger half (tokens) is
 * smallest, ties to the smaller s; 0 when n_seq < 2. */
static int32_t s_ref_split (const int32_t *len, int32_t n_seq)
{
    if (n_seq < 2) return 0;
    int64_t total = 0;
    for (int32_t i = 0; i < n_seq; i++) total += len[i];
    int32_t best = 0;
    int64_t best_big = INT64_MAX, left = 0;
    for (int32_t s = 1; s < n_seq; s++) {
        left += len[s - 1];
        int64_t big = left > total - left ? left : total - left;
        if (big < best_big) {
            best_big = big;
            best = s;
        }
    }
    return best;
}

static int32_t s_split_lens (const int32_t *len, int32_t n_seq)
{
    int32_t q[65];
    q[0] = 0;
    for (int32_t i = 0; i < n_seq; i++) q[i + 1] = q[i] + len[i];
    return rx_tbo_split (q, n_seq);
}

Test (split, decode_halves_the_requests)
{
    int32_t one[64];
    for (int i = 0; i < 64; i++) one[i] = 1;
    cr_assert_eq (s_split_lens (one, 2), 1);
    cr_assert_eq (s_split_lens (one, 4), 2);
    cr_assert_eq (s_split_lens (one, 5), 2);   /* the odd one goes to micro-batch 1 */
    cr_assert_eq (s_split_lens (one, 64), 32);
}

Test (split, one_sequence_and_empty_are_not_split)
{
    int32_t len[1] = { 100 };
    cr_assert_eq (s_split_lens (len, 1), 0);
    cr_assert_eq (s_split_lens (len, 0), 0);
    cr_assert_eq (rx_tbo_split (NULL, 0), 0);
    int32_t q[2] = { 0, 1 };
    cr_assert_eq (rx_tbo_split (q, 1), 0);   /* one decode request */
}

Test (split, prefill_balances_tokens_without_cutting_a_sequence)
{
    /* {10, 1, 1, 8}: the first sequence alone is exactly half. */
    int32_t a[] = { 10, 1, 1, 8 };
    cr_assert_eq (s_split_lens (a, 4), 1);
    int32_t b[] = { 3, 3, 3, 3 };
    cr_assert_eq (s_split_lens (b, 4), 2);
    /* A long sequence last: every cut leaves it whole on one side. */
    int32_t c[] = { 1, 1, 1, 9 };
    cr_assert_eq (s_split_lens (c, 4), 3);
    /* Two sequences always split between them, however unequal. */
    int32_t d[] = { 61, 5 };
    cr_assert_eq (s_split_lens (d, 2), 1);
    /* Mixed: decode rows around one prefill. */
    int32_t e[] = { 1, 1, 1, 20, 1 };
    cr_assert_eq (s_split_lens (e, 5), 3);
    /* A tie (|2 q - n| equal at two cuts) goes to the smaller index. */
    int32_t f[] = { 2, 2, 2 };
    cr_assert_eq (s_split_lens (f, 3), 1);
}

Test (split, random_batches_match_the_reference)
{
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 2000; it++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int32_t n = (int32_t) (rng % 64) + 1, len[64];
        for (int32_t i = 0; i < n; i++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            /* half the batches decode-only, the others mixed lengths */
            len[i] = it % 2 ? 1 : (int32_t) (rng % (rng % 3 == 0 ? 200 : 8)) + 1;
        }
        int32_t s = s_split_lens (len, n);
        cr_assert_eq (s, s_ref_split (len, n), "batch %d (%d sequences)", it, n);
        if (n >= 2) cr_assert (s >= 1 && s < n);
    }
}

Test (split, sub_batch_is_rebased)
{
    const int32_t tok[7] = { 10, 11, 12, 13, 14, 15, 16 }, pos[7] = { 0, 1, 2, 0, 5, 6, 0 };
    const int32_t q[4] = { 0, 3, 6, 7 }, kv[4] = { 0, 3, 10, 11 };
    int32_t slots[11];
    for (int i = 0; i < 11; i++) slots[i] = 100 + i;
    const struct rx_model_batch b = {
        .struct_size = sizeof b, .n_tokens = 7, .tokens = tok, .pos = pos, .n_seq = 3,
        .q_start = q, .kv_start = kv, .kv_slots = slots,
    };
    int32_t qs[4], ks[4];
    struct rx_model_batch sub;
    cr_assert_eq (rx_tbo_split (q, 3), 1);   /* |6-7| = 1 < |12-7| = 5 */
    rx_tbo_sub (&b, 1, 3, qs, ks, &sub);
    cr_assert_eq (sub.n_seq, 2);
    cr_assert_eq (sub.n_tokens, 4);
    cr_assert_eq (sub.tokens, tok + 3);
    cr_assert_eq (sub.pos, pos + 3);
    cr_assert_eq (sub.kv_slots, slots + 3);
    cr_assert_eq (qs[0], 0);
    cr_assert_eq (qs[1], 3);
    cr_assert_eq (qs[2], 4);
    cr_assert_eq (ks[0], 0);
    cr_assert_eq (ks[1], 7);
    cr_assert_eq (ks[2], 8);
    cr_assert_eq (sub.n_out, 0);
}

/* ---------------------------------------------------------- schedule -- */

/* models/tbo.h's schedule (rx_tbo_plan, rx_tbo_layers) against a recording
 * dispatcher and model: the op order of its comment, written out by hand
 * here, for the asynchronous ops and the sequential fallback; under DP
 * attention an empty or idle micro-batch makes the same dispatcher calls as
 * a busy one; an error drains what is in flight.  One token per call:
 *   D<i>:<row>+<n> dispatch   S<i>:<row>+<n> dispatch_start   W<i> dispatch_wait
 *   C<i>:<row> combine        c<i>:<row> combine_start        w<i> combine_wait
 *   P<n> attention prepare    F<l>:<row>+<n> model front      E<l> experts
 *   | progress (end of a layer)
 * (i: the dispatcher instance; row: the step row its x / out points at). */

#define S_E 4
#define S_K 2
#define S_ROWS 16

static char s_trace[4096];
static const char *s_fail_tok;          /* the call that fails (RX_EIO), NULL none */
static int s_inst[2];                   /* the two instances: &s_inst[i] */
static int s_pend_d[2], s_pend_c[2];    /* in flight per instance */
static float s_h[S_ROWS * S_E], s_x[S_ROWS * S_E], s_wts[S_ROWS * S_K];
static int32_t s_ids[S_ROWS * S_K];

static int s_rec (struct rx_err *err, const char *fmt, ...)
{
    char tok[64];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (tok, sizeof tok, fmt, ap);
    va_end (ap);
    size_t len = strlen (s_trace);
    snprintf (s_trace + len, sizeof s_trace - len, "%s%s", len ? " " : "", tok);
    if (s_fail_tok && strcmp (tok, s_fail_tok) == 0) return rx_err_set (err, RX_EIO, "mock: %s failed", tok);
    return RX_OK;
}

static int s_inst_of (void *moe)
{
    int i = (int) ((int *) moe - s_inst);
    cr_assert (i == 0 || i == 1, "not one of the two instances");
    return i;
}

static size_t s_row_of (const float *p, const float *base)
{
    size_t off = (size_t) (p - base);
    cr_assert_eq (off % S_E, 0);
    return off / S_E;
}

static void s_check_rows (const float *x, size_t ldx, const int32_t *ids, const float *w, size_t *r)
{
    *r = s_row_of (x, s_h);
    cr_assert_eq (ldx, S_E);
    cr_assert_eq (ids, s_ids + *r * S_K, "ids not the dispatched rows'");
    cr_assert_eq (w, s_wts + *r * S_K, "weights not the dispatched rows'");
}

static int s_m_dispatch (void *moe, const float *x, size_t ldx, int32_t n, const int32_t *ids, const float *w,
                         struct rx_moe_routed *rt, struct rx_err *err)
{
    int i = s_inst_of (moe);
    size_t r;
    s_check_rows (x, ldx, ids, w, &r);
    cr_assert (!s_pend_d[i] && !s_pend_c[i], "blocking dispatch with an exchange in flight");
    rt->n_rows = n;
    return s_rec (err, "D%d:%zu+%d", i, r, n);
}

static int s_m_combine (void *moe, float *out, size_t ldo, uint32_t flags, struct rx_err *err)
{
    cr_assert_eq (flags, RX_MM_ACCUMULATE);
    cr_assert_eq (ldo, S_E);
    return s_rec (err, "C%d:%zu", s_inst_of (moe), s_row_of (out, s_x));
}

static int s_m_dstart (void *moe, const float *x, size_t ldx, int32_t n, const int32_t *ids, const float *w,
                       struct rx_err *err)
{
    int i = s_inst_of (moe);
    size_t r;
    s_check_rows (x, ldx, ids, w, &r);
    cr_assert (!s_pend_d[i] && !s_pend_c[i], "instance %d: a second exchange started", i);
    int rc = s_rec (err, "S%d:%zu+%d", i, r, n);
    if (rc == RX_OK) s_pend_d[i] = 1;
    return rc;
}

static int s_m_dwait (void *moe, struct rx_moe_routed *rt, struct rx_err *err)
{
    int i = s_inst_of (moe);
    cr_assert (s_pend_d[i], "instance %d: dispatch_wait with nothing started", i);
    s_pend_d[i] = 0;   /* a failed wait ends the exchange too */
    return s_rec (err, "W%d", i);
}

static int s_m_cstart (void *moe, float *out, size_t ldo, uint32_t flags, struct rx_err *err)
{
    int i = s_inst_of (moe);
    cr_assert_eq (flags, RX_MM_ACCUMULATE);
    cr_assert (!s_pend_d[i] && !s_pend_c[i], "instance %d: combine_start out of order", i);
    int rc = s_rec (err, "c%d:%zu", i, s_row_of (out, s_x));
    if (rc == RX_OK) s_pend_c[i] = 1;
    return rc;
}

static int s_m_cwait (void *moe, struct rx_err *err)
{
    int i = s_inst_of (moe);
    cr_assert (s_pend_c[i], "instance %d: combine_wait with nothing started", i);
    s_pend_c[i] = 0;
    return s_rec (err, "w%d", i);
}

static int s_m_prepare (void *attn, const struct rx_attn_batch *b, struct rx_err *err)
{
    return s_rec (err, "P%d", b->n_tokens);
}

static int s_m_front (void *model, int32_t l, const struct rx_tbo_mb *b, struct rx_err *err)
{
    cr_assert_eq (model, (void *) s_trace);
    cr_assert_gt (b->n, 0, "front of an empty micro-batch");
    return s_rec (err, "F%d:%zu+%zu", l, b->r0, b->n);
}

static int s_m_experts (void *model, int32_t l, const struct rx_moe_routed *rt, struct rx_err *err)
{
    return s_rec (err, "E%d", l);
}

static void s_m_progress (const struct rx_host *h)
{
    size_t len = strlen (s_trace);
    snprintf (s_trace + len, sizeof s_trace - len, "%s|", len ? " " : "");
}

static int s_m_copy_h2d (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes, struct rx_err *err)
{
    memcpy (dst, src, bytes);
    return RX_OK;
}

static const struct rx_moe_ops s_m_moe = {
    .struct_size = sizeof s_m_moe, .dispatch = s_m_dispatch, .combine = s_m_combine,
    .dispatch_start = s_m_dstart, .dispatch_wait = s_m_dwait, .combine_start = s_m_cstart,
    .combine_wait = s_m_cwait,
};
/* The same table as an ABI 1.0 dispatcher: no asynchronous ops. */
static const struct rx_moe_ops s_m_moe_sync = {
    .struct_size = RX_MOE_OPS_SIZE_1_0, .dispatch = s_m_dispatch, .combine = s_m_combine,
};
static const struct rx_attn_ops s_m_attn = { .struct_size = sizeof s_m_attn, .prepare = s_m_prepare };
static struct rx_host s_m_host;
static struct rx_kernels_ops s_m_kops;

/* A step of n_seq sequences of len[] rows (n_seq 0: idle) through
 * rx_tbo_plan and rx_tbo_layers over layers [0, n_layer); the trace is
 * left in s_trace, the return code returned, err filled. */
static int s_sched (const struct rx_moe_ops *mo, int dp_attn, int32_t M, const int32_t *len, int32_t n_seq,
                    int32_t n_layer, size_t chunk, struct rx_err *err)
{
    enum { T = 8 };
    int32_t tok[T] = { 0 }, pos[T] = { 0 }, q[T + 1] = { 0 }, kv[T + 1] = { 0 }, slots[T];
    for (int32_t s = 0; s < n_seq; s++) {
        q[s + 1] = q[s] + len[s];
        kv[s + 1] = kv[s] + len[s];
    }
    for (int i = 0; i < T; i++) slots[i] = i;
    const struct rx_model_batch b = {
        .struct_size = sizeof b, .n_tokens = q[n_seq], .tokens = tok, .pos = pos, .n_seq = n_seq,
        .q_start = q, .kv_start = kv, .kv_slots = slots,
    };
    /* Host arrays stand in for the device ones (the mock copies). */
    const struct rx_model_batch_dev dv = {
        .tokens = tok, .pos = pos, .new_slots = slots, .q_start = q, .kv_start = kv, .kv_slots = slots,
    };
    static int32_t idx[2 * (T + 1)], idx_h[2 * (T + 1)];
    struct rx_tbo t = { .idx = idx, .idx_h = idx_h };
    s_m_kops = (struct rx_kernels_ops) { .struct_size = sizeof s_m_kops, .copy_h2d = s_m_copy_h2d };
    s_m_host = (struct rx_host) { .struct_size = sizeof s_m_host, .progress = s_m_progress };
    const struct rx_kctx k = { .ops = &s_m_kops };
    s_trace[0] = '\0';
    memset (s_pend_d, 0, sizeof s_pend_d);
    memset (s_pend_c, 0, sizeof s_pend_c);
    const int async = rx_tbo_has_async (mo);
    struct rx_tbo_mb mb[2];
    int rc = rx_tbo_plan (mb, &s_inst[0], &s_inst[async ? 1 : 0], &b, n_seq > 0 ? &dv : NULL, &t, &k, T, err);
    cr_assert_eq (rc, RX_OK, "%s", err->msg);
    const struct rx_tbo_model v = {
        .model = s_trace, .front = s_m_front, .experts = s_m_experts, .moe_ops = mo, .attn_ops = &s_m_attn,
        .host = &s_m_host, .h = s_h, .x = s_x, .ids = s_ids, .wts = s_wts, .E = S_E, .k = S_K,
        .chunk = chunk, .dp_attn = dp_attn,
    };
    rc = rx_tbo_layers (&v, mb, 0, n_layer, M, err);
    for (int i = 0; i < 2; i++)
        cr_assert (!s_pend_d[i] && !s_pend_c[i], "instance %d: an exchange left in flight (rc %d)", i, rc);
    return rc;
}

/* The dispatcher calls only (what every rank must issue alike), without rows. */
static void s_collectives (char *out, size_t cap)
{
    char tmp[sizeof s_trace];
    snprintf (tmp, sizeof tmp, "%s", s_trace);
    out[0] = '\0';
    for (char *save = NULL, *tk = strtok_r (tmp, " ", &save); tk; tk = strtok_r (NULL, " ", &save)) {
        if (!strchr ("DSWCcw", tk[0])) continue;
        size_t len = strlen (out);
        snprintf (out + len, cap - len, "%s%.2s", len ? " " : "", tk);
    }
}

/* Micro-batch b: rows [r0, r0 + n) through instance moe, an attention
 * batch of n_seq sequences over these device arrays, nothing in flight. */
static void s_check_mb (const struct rx_tbo_mb *b, size_t r0, size_t n, void *moe, int32_t n_seq,
                        const int32_t *q_start, const int32_t *kv_start, const int32_t *slots, const int32_t *pos,
                        const int32_t *new_slots)
{
    cr_assert_eq (b->r0, r0);
    cr_assert_eq (b->n, n);
    cr_assert_eq (b->moe, moe);
    cr_assert_eq (b->pend, 0);
    cr_assert_eq (b->ab.n_seq, n_seq);
    cr_assert_eq (b->ab.n_tokens, (int32_t) n);
    cr_assert_eq (b->ab.q_start, q_start);
    cr_assert_eq (b->ab.kv_start, kv_start);
    cr_assert_eq (b->ab.slots, slots);
    cr_assert_eq (b->ab.q_pos, pos);
    cr_assert_eq (b->d_pos, pos);
    cr_assert_eq (b->d_new, new_slots);
}

Test (schedule, plan_cuts_and_rebases_micro_batch_1)
{
    /* 3 sequences of 3, 1, 1 rows: cut at 1 (|6-5| < |8-5|). */
    int32_t tok[5] = { 0 }, pos[5] = { 0, 1, 2, 7, 4 }, q[4] = { 0, 3, 4, 5 }, kv[4] = { 0, 3, 11, 16 }, slots[16];
    for (int i = 0; i < 16; i++) slots[i] = 50 + i;
    const struct rx_model_batch b = {
        .struct_size = sizeof b, .n_tokens = 5, .tokens = tok, .pos = pos, .n_seq = 3,
        .q_start = q, .kv_start = kv, .kv_slots = slots,
    };
    int32_t nslot[5] = { 0 };
    const struct rx_model_batch_dev dv = {
        .tokens = tok, .pos = pos, .new_slots = nslot, .q_start = q, .kv_start = kv, .kv_slots = slots,
    };
    enum { T = 6 };
    int32_t idx[2 * (T + 1)], idx_h[2 * (T + 1)];
    memset (idx, 0xff, sizeof idx);
    struct rx_tbo t = { .idx = idx, .idx_h = idx_h };
    s_m_kops = (struct rx_kernels_ops) { .struct_size = sizeof s_m_kops, .copy_h2d = s_m_copy_h2d };
    const struct rx_kctx k = { .ops = &s_m_kops };
    struct rx_tbo_mb mb[2];
    struct rx_err err = { 0 };
    cr_assert_eq (rx_tbo_plan (mb, &s_inst[0], &s_inst[1], &b, &dv, &t, &k, T, &err), RX_OK, "%s", err.msg);
    s_check_mb (&mb[0], 0, 3, &s_inst[0], 1, q, kv, slots, pos, nslot);
    s_check_mb (&mb[1], 3, 2, &s_inst[1], 2, idx, idx + T + 1, slots + 3, pos + 3, nslot + 3);
    /* uploaded: q_start 0 1 2, kv_start 0 8 13 (rebased from 3) */
    cr_assert_eq (idx[0], 0);
    cr_assert_eq (idx[1], 1);
    cr_assert_eq (idx[2], 2);
    cr_assert_eq (idx[T + 1], 0);
    cr_assert_eq (idx[T + 2], 8);
    cr_assert_eq (idx[T + 3], 13);
    /* idle: two empty micro-batches, nothing uploaded */
    const struct rx_model_batch idle = { .struct_size = sizeof idle };
    memset (idx, 0xff, sizeof idx);
    cr_assert_eq (rx_tbo_plan (mb, &s_inst[0], &s_inst[0], &idle, NULL, &t, &k, T, &err), RX_OK);
    cr_assert_eq (mb[0].n + mb[1].n + mb[0].r0 + mb[1].r0, 0);
    cr_assert_eq (mb[1].moe, &s_inst[0]);
    cr_assert_eq (idx[0], -1);
}

Test (schedule, async_order_alone)
{
    /* (3, 2) rows, chunks of 2: micro-batch 0 in 2 chunks (the first
     * blocking), micro-batch 1 in one. */
    const int32_t len[3] = { 3, 1, 1 };
    struct rx_err err = { 0 };
    cr_assert_eq (s_sched (&s_m_moe, 0, 0, len, 3, 2, 2, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq (s_trace,
                      "P3 F0:0+3 D0:0+2 E0 C0:0 S0:2+1 P2 F0:3+2 S1:3+2 W0 E0 c0:2 W1 E0 c1:3 | "
                      "w0 P3 F1:0+3 D0:0+2 E1 C0:0 S0:2+1 w1 P2 F1:3+2 S1:3+2 W0 E1 c0:2 W1 E1 c1:3 | "
                      "w0 w1");
}

Test (schedule, sync_fallback_runs_one_after_the_other)
{
    const int32_t len[3] = { 3, 1, 1 };
    struct rx_err err = { 0 };
    cr_assert_eq (s_sched (&s_m_moe_sync, 0, 0, len, 3, 1, 2, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq (s_trace, "P3 F0:0+3 D0:0+2 E0 C0:0 P2 F0:3+2 D0:2+1 E0 C0:2 D0:3+2 E0 C0:3 |");
}

Test (schedule, dp_empty_and_idle_make_the_same_calls)
{
    /* Under DP attention with the group's largest batch M = 3 and chunks of
     * 2, every micro-batch makes 2 dispatches a layer: a rank with one
     * sequence of 3 rows ((all, empty)), one with 2 + 1, an idle one. */
    const char *want = "D0 C0 S0 D1 C1 S1 W0 c0 W1 c1 w0 D0 C0 S0 w1 D1 C1 S1 W0 c0 W1 c1 w0 w1";
    char got[512];
    struct rx_err err = { 0 };
    const int32_t one[1] = { 3 }, two[2] = { 2, 1 };
    cr_assert_eq (s_sched (&s_m_moe, 1, 3, one, 1, 2, 2, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq (s_trace,
                      "P3 F0:0+3 D0:0+2 E0 C0:0 S0:2+1 D1:3+0 E0 C1:3 S1:5+0 W0 E0 c0:2 W1 E0 c1:5 | "
                      "w0 P3 F1:0+3 D0:0+2 E1 C0:0 S0:2+1 w1 D1:3+0 E1 C1:3 S1:5+0 W0 E1 c0:2 W1 E1 c1:5 | "
                      "w0 w1");
    s_collectives (got, sizeof got);
    cr_assert_str_eq (got, want, "one sequence");
    cr_assert_eq (s_sched (&s_m_moe, 1, 3, two, 2, 2, 2, &err), RX_OK, "%s", err.msg);
    s_collectives (got, sizeof got);
    cr_assert_str_eq (got, want, "two sequences");
    cr_assert_eq (s_sched (&s_m_moe, 1, 3, NULL, 0, 2, 2, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (strchr (s_trace, 'F'), NULL, "an idle rank ran a front: %s", s_trace);
    s_collectives (got, sizeof got);
    cr_assert_str_eq (got, want, "idle");
}

Test (schedule, error_drains_what_is_in_flight)
{
    const int32_t len[3] = { 3, 1, 1 };
    struct rx_err err = { 0 };
    /* micro-batch 1's front fails while micro-batch 0's dispatch is in
     * flight (the layer still ends with progress, then the drain) */
    s_fail_tok = "F0:3+2";
    cr_assert_eq (s_sched (&s_m_moe, 0, 0, len, 3, 2, 2, &err), RX_EIO);
    cr_assert_str_eq (err.msg, "mock: F0:3+2 failed");
    cr_assert_str_eq (s_trace, "P3 F0:0+3 D0:0+2 E0 C0:0 S0:2+1 P2 F0:3+2 | W0");
    /* micro-batch 1's dispatch_wait fails while 0's combine is in flight */
    s_fail_tok = "W1";
    err = (struct rx_err) { 0 };
    cr_assert_eq (s_sched (&s_m_moe, 0, 0, len, 3, 2, 2, &err), RX_EIO);
    cr_assert_str_eq (err.msg, "mock: W1 failed");
    cr_assert_str_eq (s_trace, "P3 F0:0+3 D0:0+2 E0 C0:0 S0:2+1 P2 F0:3+2 S1:3+2 W0 E0 c0:2 W1 | w0");
    /* the last combine_wait fails: the other one is still waited for */
    s_fail_tok = "w0";
    err = (struct rx_err) { 0 };
    cr_assert_eq (s_sched (&s_m_moe, 0, 0, len, 3, 1, 2, &err), RX_EIO);
    cr_assert_str_eq (err.msg, "mock: w0 failed");
    cr_assert_str_eq (s_trace,
                      "P3 F0:0+3 D0:0+2 E0 C0:0 S0:2+1 P2 F0:3+2 S1:3+2 W0 E0 c0:2 W1 E0 c1:3 | w0 w1");
    s_fail_tok = NULL;
}

/* -------------------------------------------------------- dispatcher -- */

struct denv {
    rx_loader_t *l;
    const struct rx_kernels_ops *K;
    void *be;
    const struct rx_moe_ops *M;
    const struct rx_host *mh;
};

static void s_dopen (struct denv *e, const char *name)
{
    struct rx_err err = { 0 };
    memset (e, 0, sizeof *e);
    e->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (e->l, "%s", err.msg);
    rx_plugin_t *kp, *mp;
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_KERNELS, "cpu", &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (kp, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_MOE, name, &mp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (mp, NULL, &err), RX_OK, "%s", err.msg);
    e->K = rx_plugin_ops (kp);
    e->M = rx_plugin_ops (mp);
    e->mh = rx_plugin_host (mp);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 1 };
    cr_assert_eq (e->K->create (rx_plugin_host (kp), &p, &e->be, &err), RX_OK, "%s", err.msg);
}

static void s_dclose (struct denv *e)
{
    e->K->destroy (e->be);
    rx_loader_destroy (&e->l);
}

static void *s_dev (struct denv *e, size_t bytes, const void *host)
{
    void *d;
    struct rx_err err = { 0 };
    cr_assert_eq (e->K->alloc (e->be, bytes ? bytes : 4, 0, &d, &err), RX_OK, "%s", err.msg);
    if (host && bytes) cr_assert_eq (e->K->copy_h2d (e->be, NULL, d, host, bytes, &err), RX_OK, "%s", err.msg);
    return d;
}

/* The experts the test plays on routed rows: y = 2 x + expert. */
static void s_play (struct denv *e, const struct rx_moe_routed *r, int E)
{
    struct rx_err err = { 0 };
    size_t n = (size_t) r->n_rows * (size_t) E;
    float *h = malloc ((n ? n : 1) * sizeof *h);
    if (n) cr_assert_eq (e->K->copy_d2h (e->be, NULL, h, r->x, n * sizeof *h, &err), RX_OK);
    e->K->synchronize (e->be, NULL, NULL);
    for (int32_t x = 0; x < r->n_local_expert; x++)
        for (int32_t i = r->offsets[x]; i < r->offsets[x + 1]; i++)
            for (int c = 0; c < E; c++) h[(size_t) i * E + c] = 2.0f * h[(size_t) i * E + c] + (float) (r->first_expert + x);
    if (n) cr_assert_eq (e->K->copy_h2d (e->be, NULL, r->y, h, n * sizeof *h, &err), RX_OK);
    free (h);
}

static void s_async_equals_blocking (const char *name)
{
    struct denv e;
    s_dopen (&e, name);
    enum { NE = 4, K = 2, E = 16, NT = 9 };
    struct rx_moe_config c = {
        .struct_size = sizeof c, .n_expert = NE, .n_expert_used = K, .n_embd = E, .max_tokens = NT,
        .ep_rank = 0, .ep_size = 1, .kops = e.K, .kbe = e.be,
    };
    struct rx_err err = { 0 };
    void *a, *b;
    cr_assert_eq (e.M->create (e.mh, &c, &a, &err), RX_OK, "%s: %s", name, err.msg);
    cr_assert_eq (e.M->create (e.mh, &c, &b, &err), RX_OK, "%s: %s", name, err.msg);
    cr_assert (RX_HAS (struct rx_moe_ops, e.M, combine_wait) && e.M->dispatch_start && e.M->dispatch_wait
               && e.M->combine_start, "%s lacks the asynchronous ops", name);
    /* Two micro-batches of NT tokens each. */
    float x[2][NT * E], w[2][NT * K], ref[2][NT * E], got[2][NT * E];
    int32_t ids[2][NT * K];
    for (int m = 0; m < 2; m++)
        for (int t = 0; t < NT; t++) {
            for (int i = 0; i < E; i++) x[m][t * E + i] = (float) ((t * 7 + i * 3 + m * 5) % 11) - 5.0f;
            ids[m][t * K] = (t + m) % NE;
            ids[m][t * K + 1] = (t * 3 + 1 + m) % NE;
            w[m][t * K] = 0.25f + 0.05f * (float) t;
            w[m][t * K + 1] = 1.0f - w[m][t * K];
        }
    float *dx[2], *dw[2], *dout[2];
    int32_t *dids[2];
    for (int m = 0; m < 2; m++) {
        dx[m] = s_dev (&e, sizeof x[m], x[m]);
        dw[m] = s_dev (&e, sizeof w[m], w[m]);
        dids[m] = s_dev (&e, sizeof ids[m], ids[m]);
        dout[m] = s_dev (&e, sizeof ref[m], NULL);
    }
    /* Blocking, one instance. */
    for (int m = 0; m < 2; m++) {
        struct rx_moe_routed r = { .struct_size = sizeof r };
        cr_assert_eq (e.M->dispatch (a, dx[m], E, NT, dids[m], dw[m], &r, &err), RX_OK, "%s", err.msg);
        s_play (&e, &r, E);
        cr_assert_eq (e.M->combine (a, dout[m], E, 0, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (e.K->copy_d2h (e.be, NULL, ref[m], dout[m], sizeof ref[m], &err), RX_OK);
    }
    /* Interleaved as model-llama's schedule: start 0, start 1, wait 0,
     * combine_start 0, wait 1, combine_start 1, combine_wait 0, 1. */
    void *inst[2] = { a, b };
    struct rx_moe_routed r[2] = { { .struct_size = sizeof r[0] }, { .struct_size = sizeof r[1] } };
    for (int m = 0; m < 2; m++)
        cr_assert_eq (e.M->dispatch_start (inst[m], dx[m], E, NT, dids[m], dw[m], &err), RX_OK, "%s", err.msg);
    /* a second start on a busy instance, a combine before its dispatch is done */
    cr_assert_eq (e.M->dispatch_start (a, dx[0], E, NT, dids[0], dw[0], &err), RX_EINVAL, "%s", name);
    cr_assert_eq (e.M->combine_start (b, dout[1], E, 0, &err), RX_EINVAL, "%s", name);
    for (int m = 0; m < 2; m++) {
        cr_assert_eq (e.M->dispatch_wait (inst[m], &r[m], &err), RX_OK, "%s: %s", name, err.msg);
        s_play (&e, &r[m], E);
        cr_assert_eq (e.M->combine_start (inst[m], dout[m], E, 0, &err), RX_OK, "%s: %s", name, err.msg);
    }
    cr_assert_eq (e.M->dispatch_wait (a, &r[0], &err), RX_EINVAL, "%s: dispatch_wait during a combine", name);
    for (int m = 0; m < 2; m++) {
        cr_assert_eq (e.M->combine_wait (inst[m], &err), RX_OK, "%s: %s", name, err.msg);
        cr_assert_eq (e.K->copy_d2h (e.be, NULL, got[m], dout[m], sizeof got[m], &err), RX_OK);
        cr_assert_eq (memcmp (got[m], ref[m], sizeof got[m]), 0, "%s: micro-batch %d differs", name, m);
    }
    /* Waits with nothing started; a blocking call after an async round. */
    cr_assert_eq (e.M->combine_wait (a, &err), RX_EINVAL, "%s", name);
    cr_assert_not_null (strstr (err.msg, "without a started combine"), "%s: %s", name, err.msg);
    cr_assert_eq (e.M->dispatch_wait (b, &r[1], &err), RX_EINVAL, "%s", name);
    cr_assert_not_null (strstr (err.msg, "without a started dispatch"), "%s: %s", name, err.msg);
    /* A refused start (too many tokens) leaves the instance usable. */
    cr_assert_eq (e.M->dispatch_start (a, dx[0], E, NT + 1, dids[0], dw[0], &err), RX_ERANGE, "%s", name);
    cr_assert_eq (e.M->dispatch_wait (a, &r[0], &err), RX_EINVAL, "%s", name);
    /* An empty micro-batch (an idle rank's). */
    cr_assert_eq (e.M->dispatch_start (a, NULL, E, 0, NULL, NULL, &err), RX_OK, "%s: %s", name, err.msg);
    cr_assert_eq (e.M->dispatch_wait (a, &r[0], &err), RX_OK, "%s: %s", name, err.msg);
    cr_assert_eq (r[0].n_rows, 0);
    cr_assert_eq (e.M->combine_start (a, NULL, E, RX_MM_ACCUMULATE, &err), RX_OK, "%s: %s", name, err.msg);
    cr_assert_eq (e.M->combine_wait (a, &err), RX_OK, "%s: %s", name, err.msg);
    /* destroy with an exchange started and not waited on: no leak, no hang */
    cr_assert_eq (e.M->dispatch_start (b, dx[1], E, NT, dids[1], dw[1], &err), RX_OK, "%s", err.msg);
    e.M->destroy (a);
    e.M->destroy (b);
    for (int m = 0; m < 2; m++) {
        e.K->free_ (e.be, dx[m]);
        e.K->free_ (e.be, dw[m]);
        e.K->free_ (e.be, dids[m]);
        e.K->free_ (e.be, dout[m]);
    }
    s_dclose (&e);
}

Test (dispatcher, local_async_equals_blocking) { s_async_equals_blocking ("local"); }
Test (dispatcher, ep_normal_async_equals_blocking) { s_async_equals_blocking ("ep_normal"); }
Test (dispatcher, ep_low_latency_async_equals_blocking) { s_async_equals_blocking ("ep_low_latency"); }
Test (dispatcher, ep_auto_async_equals_blocking) { s_async_equals_blocking ("ep_auto"); }

/* ------------------------------------------------------------ engine -- */

struct job {
    const char *gguf;
    int32_t *prompt[4];
    int32_t n_prompt[4];
    const char *moe;            /* NULL: the default (local) */
    int32_t ep_size;            /* 0: default */
    int32_t chunk;              /* [moe] max_tokens_per_rank; 0: default */
    int tbo;
    const char *group;
    const char *isa;            /* [kernels.cpu] isa; NULL: auto */
    const char *model;          /* ../shared/data/models/<model>.gguf; NULL: tiny-moe */
    int tp;                     /* 2 ranks tensor-parallel (the same script on both), not DP attention */
};

/* What one rank reports. */
struct rep {
    int32_t rc;
    char msg[RX_ERR_MSG_MAX];
    int32_t n_vocab, n_rows, n_gen;
    int32_t gen[S_MAX_GEN];
};

struct out {
    struct rep h;
    float *logits;              /* [n_rows][n_vocab] */
};

/* One sequence of the script. */
struct sq {
    int seq;
    int32_t last_row;           /* its newest logits row in out */
};

static int s_step (rx_engine_t *e, struct out *o, const struct rx_engine_req *rq, int32_t n, struct sq **who,
                   struct rx_err *err)
{
    const size_t V = (size_t) o->h.n_vocab;
    int32_t rows = rx_engine_n_out (rq, n);
    if (o->h.n_rows + rows > S_MAX_ROWS) return rx_err_set (err, RX_EINVAL, "test: too many rows");
    int rc = rx_engine_step (e, rq, n, o->logits + (size_t) o->h.n_rows * V, err);
    if (rc != RX_OK) return rc;
    for (int32_t i = 0; i < n; i++) {
        o->h.n_rows += rq[i].all_logits ? rq[i].n_tokens : 1;
        who[i]->last_row = o->h.n_rows - 1;
    }
    return RX_OK;
}

/* Decode one greedy token for each of the n sequences, in one step. */
static int s_decode (rx_engine_t *e, struct out *o, struct sq **s, int32_t n, struct rx_err *err)
{
    const size_t V = (size_t) o->h.n_vocab;
    struct rx_engine_req rq[8];
    int32_t tok[8];
    for (int32_t i = 0; i < n; i++) {
        tok[i] = rx_argmax (o->logits + (size_t) s[i]->last_row * V, (int32_t) V);
        if (o->h.n_gen < S_MAX_GEN) o->h.gen[o->h.n_gen++] = tok[i];
        rq[i] = (struct rx_engine_req) { s[i]->seq, 1, &tok[i], 1 };
    }
    return s_step (e, o, rq, n, s, err);
}

#define S_TRY(x) do { if (rc == RX_OK) rc = (x); } while (0)

/* The script (size 1: rank 0's part alone, no idle steps):
 *   1 prefill: rank 0 three prompts (61 + 5 + 6 tokens), rank 1 two (35 + 5)
 *   2-4 decode every sequence
 *   5 mixed: rank 0 prefills a 35-token prompt while decoding its three;
 *     rank 1 drops one sequence and decodes the other (1 request)
 *   6 rank 0 decodes its four; rank 1 idle
 *   7 1 request on each rank
 *   8 both idle
 *   9 rank 0 a 1-request prefill (6 tokens); rank 1 a prefill + a decode */
static int s_script (rx_engine_t *e, const struct job *j, int32_t rank, int32_t size, struct out *o,
                     struct rx_err *err)
{
    struct sq s[6];
    struct sq *p[6];
    int rc = RX_OK;
    const int32_t *P[4] = { j->prompt[0], j->prompt[1], j->prompt[2], j->prompt[3] };
    const int32_t *L = j->n_prompt;
    /* the sequences: rank 0 {2, 0, 1} (+3 later, +1 at the end); rank 1 {3, 0} (+0 at the end) */
    const int32_t first[2][3] = { { 2, 0, 1 }, { 3, 0, -1 } };
    int32_t ns = rank == 0 ? 3 : 2;
    struct rx_engine_req rq[6];
    for (int32_t i = 0; i < 6; i++) {
        s[i].seq = rx_engine_seq_new (e, 128, err);
        if (s[i].seq < 0) return s[i].seq;
        p[i] = &s[i];
    }
    for (int32_t i = 0; i < ns; i++) {
        int32_t q = first[rank][i];
        rq[i] = (struct rx_engine_req) { s[i].seq, L[q], P[q], 1 };
    }
    S_TRY (s_step (e, o, rq, ns, p, err));
    for (int st = 0; st < 3; st++) S_TRY (s_decode (e, o, p, ns, err));
    if (rank == 0) {
        /* mixed: prefill of prompt 3 in sequence 3 + decode of 0..2 */
        const size_t V = (size_t) o->h.n_vocab;
        int32_t tok[3];
        for (int32_t i = 0; i < 3; i++) {
            tok[i] = rx_argmax (o->logits + (size_t) s[i].last_row * V, (int32_t) V);
            if (o->h.n_gen < S_MAX_GEN) o->h.gen[o->h.n_gen++] = tok[i];
            rq[i] = (struct rx_engine_req) { s[i].seq, 1, &tok[i], 1 };
        }
        rq[3] = (struct rx_engine_req) { s[3].seq, L[3], P[3], 1 };
        S_TRY (s_step (e, o, rq, 4, p, err));
        S_TRY (s_decode (e, o, p, 4, err));                  /* 6 */
        S_TRY (s_decode (e, o, p, 1, err));                  /* 7: 1 request */
        if (size > 1 && rc == RX_OK) rc = rx_engine_idle (e, err);   /* 8 */
        rq[0] = (struct rx_engine_req) { s[4].seq, L[1], P[1], 1 };
        S_TRY (s_step (e, o, rq, 1, &p[4], err));           /* 9: 1-request prefill */
    } else {
        S_TRY (s_decode (e, o, p, 1, err));                  /* 5: 1 request */
        if (rc == RX_OK) rc = rx_engine_idle (e, err);       /* 6 */
        S_TRY (s_decode (e, o, p, 1, err));                  /* 7 */
        if (rc == RX_OK) rc = rx_engine_idle (e, err);       /* 8 */
        const size_t V = (size_t) o->h.n_vocab;
        int32_t tok = rx_argmax (o->logits + (size_t) s[0].last_row * V, (int32_t) V);
        if (o->h.n_gen < S_MAX_GEN) o->h.gen[o->h.n_gen++] = tok;
        rq[0] = (struct rx_engine_req) { s[0].seq, 1, &tok, 1 };
        rq[1] = (struct rx_engine_req) { s[4].seq, L[0], P[0], 1 };
        struct sq *w[2] = { &s[0], &s[4] };
        S_TRY (s_step (e, o, rq, 2, w, err));               /* 9 */
    }
    for (int32_t i = 0; i < 6; i++) rx_engine_seq_free (e, s[i].seq);
    return rc;
}

/* The built plugins plus tests/tbo-fixtures (moe-local_sync). */
static void s_plugin_path (void)
{
    char p[8192];
    snprintf (p, sizeof p, "%s:%s/tests/tbo-fixtures/.libs", tu_env ("RX_PLUGIN_BUILD_DIR"),
              tu_env ("RX_TOP_BUILDDIR"));
    setenv ("RADIX_PLUGIN_PATH", p, 1);
}

/* Run the script as rank/size (size 1: alone); plain C (runs in forked
 * ranks). */
static void s_run (const struct job *j, int32_t rank, int32_t size, struct out *o)
{
    memset (o, 0, sizeof *o);
    struct rx_boot b;
    struct rx_err err = { 0 };
    s_plugin_path ();
    int rc = rx_boot_open (&b, NULL, 0, &err);
    if (rc != RX_OK) {
        o->h.rc = rc;
        snprintf (o->h.msg, sizeof o->h.msg, "%s", err.msg);
        return;
    }
    rc = rx_conf_set (b.conf, "kernels", "threads", "1", &err);
    if (rc == RX_OK && j->isa) rc = rx_conf_set (b.conf, "kernels.cpu", "isa", j->isa, &err);
    if (rc == RX_OK && j->tbo) rc = rx_conf_set (b.conf, "scheduler", "two_batch_overlap", "true", &err);
    if (rc == RX_OK && j->moe) rc = rx_conf_set (b.conf, "moe", "dispatcher", j->moe, &err);
    char num[16];
    snprintf (num, sizeof num, "%d", (int) j->ep_size);
    if (rc == RX_OK && j->ep_size) rc = rx_conf_set (b.conf, "parallel", "ep_size", num, &err);
    snprintf (num, sizeof num, "%d", (int) j->chunk);
    if (rc == RX_OK && j->chunk) rc = rx_conf_set (b.conf, "moe", "max_tokens_per_rank", num, &err);
    rx_engine_t *e = NULL;
    if (rc == RX_OK) {
        struct rx_engine_opts eo = {
            .model_path = j->gguf, .n_slots = 1024, .max_tokens = 128, .tp_rank = rank,
            .tp_size = size > 1 ? size : 0, .comm = size > 1 ? "shm" : NULL,
            .comm_group = j->group, .comm_timeout_s = 60, .dp_attention = size > 1 && !j->tp,
        };
        e = rx_engine_new (&b, &eo, &err);
        if (!e) rc = err.code ? err.code : RX_EINTERNAL;
    }
    if (rc == RX_OK) {
        o->h.n_vocab = rx_engine_info (e)->n_vocab;
        o->logits = calloc ((size_t) S_MAX_ROWS * (size_t) o->h.n_vocab, sizeof (float));
        rc = j->tp ? s_script (e, j, 0, 1, o, &err) : s_script (e, j, rank, size, o, &err);
    }
    if (rc != RX_OK) {
        o->h.rc = rc;
        snprintf (o->h.msg, sizeof o->h.msg, "%s", err.msg);
    }
    rx_engine_destroy (&e);
    rx_boot_close (&b);
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

/* Fork 2 ranks running j; read both reports. */
static void s_run2 (const struct job *j, struct out *outs)
{
    char *dir = tu_tmpdir ();
    pid_t pid[2];
    fflush (NULL);
    for (int32_t r = 0; r < 2; r++) {
        pid[r] = fork ();
        cr_assert (pid[r] >= 0, "fork: %s", strerror (errno));
        if (pid[r] == 0) {
            alarm (S_DEADLINE + 10);
            struct out o;
            s_run (j, r, 2, &o);
            char name[32];
            snprintf (name, sizeof name, "rank%d", (int) r);
            char *path = tu_path (dir, name);
            int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            int bad = fd < 0 || s_write_all (fd, &o.h, sizeof o.h) != 0
                      || (o.logits && s_write_all (fd, o.logits, (size_t) o.h.n_rows * (size_t) o.h.n_vocab * sizeof (float)) != 0);
            if (fd >= 0) close (fd);
            free (path);
            free (o.logits);
            _exit (bad ? 3 : 0);
        }
    }
    time_t t0 = time (NULL);
    int left = 2, status[2] = { -1, -1 };
    while (left > 0) {
        for (int32_t r = 0; r < 2; r++) {
            int st;
            if (status[r] != -1) continue;
            if (waitpid (pid[r], &st, WNOHANG) == pid[r]) {
                status[r] = st;
                left--;
            }
        }
        if (left > 0 && time (NULL) - t0 > S_DEADLINE)
            for (int32_t r = 0; r < 2; r++)
                if (status[r] == -1) kill (pid[r], SIGKILL);
        if (left > 0) usleep (20 * 1000);
    }
    for (int32_t r = 0; r < 2; r++) {
        cr_assert (WIFEXITED (status[r]) && WEXITSTATUS (status[r]) == 0, "rank %d died (status 0x%x)", r, status[r]);
        char name[32];
        snprintf (name, sizeof name, "rank%d", (int) r);
        char *path = tu_path (dir, name);
        size_t n;
        unsigned char *buf = tu_read_file (path, &n);
        cr_assert (buf && n >= sizeof outs[r].h, "rank %d wrote no report", r);
        memcpy (&outs[r].h, buf, sizeof outs[r].h);
        size_t nl = (size_t) outs[r].h.n_rows * (size_t) outs[r].h.n_vocab;
        cr_assert_eq (n, sizeof outs[r].h + nl * sizeof (float), "rank %d: short report", r);
        outs[r].logits = malloc ((nl ? nl : 1) * sizeof (float));
        memcpy (outs[r].logits, buf + sizeof outs[r].h, nl * sizeof (float));
        free (buf);
        unlink (path);
        free (path);
    }
    rmdir (dir);
    free (dir);
}

static void s_load (struct job *j)
{
    TU_REQUIRE_SHARED ();
    const char *shared = tu_env ("RADIX_SHARED");
    const char *model = j->model ? j->model : "tiny-moe";
    char path[4096];
    snprintf (path, sizeof path, "%s/data/models/%s.json", shared, model);
    json_error_t je;
    json_t *root = json_load_file (path, 0, &je);
    cr_assert_not_null (root, "%s:%d: %s", path, je.line, je.text);
    json_t *ps = json_object_get (root, "prompts");
    cr_assert (json_is_array (ps) && json_array_size (ps) >= 4);
    for (size_t i = 0; i < 4; i++) {
        json_t *a = json_object_get (json_array_get (ps, i), "prompt_ids");
        j->n_prompt[i] = (int32_t) json_array_size (a);
        j->prompt[i] = calloc ((size_t) j->n_prompt[i], sizeof (int32_t));
        for (size_t k = 0; k < (size_t) j->n_prompt[i]; k++)
            j->prompt[i][k] = (int32_t) json_integer_value (json_array_get (a, k));
    }
    json_decref (root);
    /* The script's batches fit one 128-token step (61 + 5 + 6, 35 + 3). */
    cr_assert (j->n_prompt[2] + j->n_prompt[0] + j->n_prompt[1] <= 128 && j->n_prompt[3] + 3 <= 128);
    snprintf (path, sizeof path, "%s/data/models/%s.gguf", shared, model);
    j->gguf = strdup (path);
}

static void s_free_job (struct job *j)
{
    for (int i = 0; i < 4; i++) free (j->prompt[i]);
    free ((char *) j->gguf);
}

/* TBO on vs off on one rank's reports: same rows, identical greedy tokens,
 * logits within tol; prints the largest difference. */
static void s_same (const char *what, const struct out *on, const struct out *off, double tol)
{
    cr_assert_eq (on->h.rc, RX_OK, "%s, TBO on: %s", what, on->h.msg);
    cr_assert_eq (off->h.rc, RX_OK, "%s, TBO off: %s", what, off->h.msg);
    cr_assert_eq (on->h.n_rows, off->h.n_rows, "%s", what);
    cr_assert_gt (on->h.n_rows, 0, "%s", what);
    cr_assert_eq (on->h.n_gen, off->h.n_gen, "%s", what);
    double maxd = 0;
    size_t n = (size_t) on->h.n_rows * (size_t) on->h.n_vocab, ndiff = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs ((double) on->logits[i] - (double) off->logits[i]);
        if (d > 0) ndiff++;
        if (!(d <= maxd)) maxd = d;
    }
    fprintf (stderr, "test_tbo: %s: %d logit rows, %d greedy tokens; max |logit diff| TBO on vs off %.3g (%zu of %zu values differ)\n",
             what, on->h.n_rows, on->h.n_gen, maxd, ndiff, n);
    for (int32_t g = 0; g < on->h.n_gen; g++)
        cr_assert_eq (on->h.gen[g], off->h.gen[g], "%s: greedy token %d: %d with TBO, %d without", what, g,
                      on->h.gen[g], off->h.gen[g]);
    cr_assert (maxd <= tol, "%s: max |logit diff| %.3g > %g", what, maxd, tol);
}

static int s_grp;
static const char *s_group (char *buf, size_t n, const char *what)
{
    snprintf (buf, n, "tbo-test-%ld-%s-%d", (long) getpid (), what, s_grp++);
    return buf;
}

/* Alone (no DP), moe-local: prefill, decode, mixed, 1-request batches. */
Test (engine, alone_local_on_equals_off)
{
    struct job j = { 0 };
    s_load (&j);
    struct out on, off;
    j.tbo = 1;
    s_run (&j, 0, 1, &on);
    j.tbo = 0;
    s_run (&j, 0, 1, &off);
    s_same ("alone, local", &on, &off, 1e-4);
    free (on.logits);
    free (off.logits);
    s_free_job (&j);
}

/* Alone in chunks of 5 tokens: each micro-batch's chunks but the last run
 * blocking, the last one overlapped. */
Test (engine, alone_local_chunked_on_equals_off)
{
    struct job j = { .chunk = 5 };
    s_load (&j);
    struct out on, off;
    j.tbo = 1;
    s_run (&j, 0, 1, &on);
    j.tbo = 0;
    s_run (&j, 0, 1, &off);
    s_same ("alone, local, chunks of 5", &on, &off, 1e-4);
    free (on.logits);
    free (off.logits);
    s_free_job (&j);
}

/* The scalar kernels' matmul does not depend on the row count, so there TBO
 * on and off are bitwise equal (the avx512 path picks kernels by rows). */
Test (engine, alone_scalar_bitwise)
{
    struct job j = { .isa = "scalar" };
    s_load (&j);
    struct out on, off;
    j.tbo = 1;
    s_run (&j, 0, 1, &on);
    j.tbo = 0;
    s_run (&j, 0, 1, &off);
    s_same ("alone, local, isa scalar", &on, &off, 0);
    free (on.logits);
    free (off.logits);
    s_free_job (&j);
}

static void s_dp_job (const char *model, int tp, const char *moe, int32_t ep_size, int32_t chunk,
                      const char *isa, double tol)
{
    struct job j = { .moe = moe, .ep_size = ep_size, .chunk = chunk, .isa = isa, .model = model, .tp = tp };
    s_load (&j);
    char g[96];
    struct out on[2], off[2];
    j.tbo = 1;
    j.group = s_group (g, sizeof g, "on");
    time_t t0 = time (NULL);
    s_run2 (&j, on);
    fprintf (stderr, "test_tbo: %s%s 2, %s, ep_size %d: TBO on ran in %lds\n", model ? model : "", tp ? " tp" : " dp", moe,
             ep_size, (long) (time (NULL) - t0));
    j.tbo = 0;
    j.group = s_group (g, sizeof g, "off");
    s_run2 (&j, off);
    for (int r = 0; r < 2; r++) {
        char what[128];
        snprintf (what, sizeof what, "%s%s 2 rank %d, %s, ep_size %d%s%s%s", model ? model : "", tp ? " tp" : " dp",
                  r, moe, ep_size, chunk ? ", chunks of 5" : "", isa ? ", isa " : "", isa ? isa : "");
        s_same (what, &on[r], &off[r], tol);
        free (on[r].logits);
        free (off[r].logits);
    }
    s_free_job (&j);
}

static void s_dp_isa (const char *moe, int32_t ep_size, int32_t chunk, const char *isa, double tol)
{
    s_dp_job (NULL, 0, moe, ep_size, chunk, isa, tol);
}

static void s_dp (const char *moe, int32_t ep_size, int32_t chunk)
{
    s_dp_isa (moe, ep_size, chunk, NULL, 1e-4);
}

/* A dispatcher without the asynchronous ops (moe-local_sync, the ABI 1.0
 * table): the model runs the micro-batches one after the other, same
 * outputs.  The fixture really lacks the ops (checked through the loader). */
Test (engine, sync_dispatcher_fallback)
{
    struct rx_err err = { 0 };
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/tbo-fixtures/.libs", tu_env ("RX_TOP_BUILDDIR"));
    rx_loader_t *l = rx_loader_new (dir, &err);
    cr_assert_not_null (l, "%s", err.msg);
    rx_plugin_t *mp;
    cr_assert_eq (rx_loader_find (l, RX_KIND_MOE, "local_sync", &mp, &err), RX_OK, "%s (make check builds it)", err.msg);
    cr_assert_eq (rx_plugin_init (mp, NULL, &err), RX_OK, "%s", err.msg);
    const struct rx_moe_ops *M = rx_plugin_ops (mp);
    cr_assert (!RX_HAS (struct rx_moe_ops, M, combine_wait) && !RX_HAS (struct rx_moe_ops, M, dispatch_start));
    rx_loader_destroy (&l);

    struct job j = { .moe = "local_sync" };
    s_load (&j);
    struct out on, off;
    j.tbo = 1;
    s_run (&j, 0, 1, &on);
    j.tbo = 0;
    s_run (&j, 0, 1, &off);
    s_same ("alone, local_sync (no async ops)", &on, &off, 1e-4);
    free (on.logits);
    free (off.logits);
    s_free_job (&j);
}

Test (engine, dp_sync_dispatcher_fallback) { s_dp ("local_sync", 1, 0); }

Test (engine, dp_ep_normal_scalar_bitwise) { s_dp_isa ("ep_normal", 2, 0, "scalar", 0); }
Test (engine, dp_ep_normal_on_equals_off) { s_dp ("ep_normal", 2, 0); }
Test (engine, dp_ep_low_latency_on_equals_off) { s_dp ("ep_low_latency", 2, 0); }
Test (engine, dp_ep_auto_on_equals_off) { s_dp ("ep_auto", 2, 0); }
/* Chunks of 5 tokens: micro-batches of several dispatches each, all but the
 * last blocking. */
Test (engine, dp_ep_normal_chunked_on_equals_off) { s_dp ("ep_normal", 2, 5); }
Test (engine, dp_local_on_equals_off) { s_dp ("local", 1, 0); }

/* ------------------------------------------------------ model-deepseek2 -- */

/* tiny-deepseek2 (MLA + a leading dense block + MoE with a shared expert):
 * the same script.  Its leading dense block runs unsplit (under DP
 * attention its blocking gather / reduce-scatter in the one order of the
 * one-batch forward), its MoE blocks as two micro-batches. */
static void s_ds_alone (const char *moe, int32_t chunk, const char *isa, double tol)
{
    struct job j = { .model = "tiny-deepseek2", .moe = moe, .chunk = chunk, .isa = isa };
    s_load (&j);
    struct out on, off;
    j.tbo = 1;
    s_run (&j, 0, 1, &on);
    j.tbo = 0;
    s_run (&j, 0, 1, &off);
    char what[128];
    snprintf (what, sizeof what, "tiny-deepseek2 alone, %s%s%s%s", moe ? moe : "local", chunk ? ", chunks of 5" : "",
              isa ? ", isa " : "", isa ? isa : "");
    s_same (what, &on, &off, tol);
    free (on.logits);
    free (off.logits);
    s_free_job (&j);
}

Test (deepseek2, alone_local_on_equals_off) { s_ds_alone (NULL, 0, NULL, 1e-5); }
Test (deepseek2, alone_local_chunked_on_equals_off) { s_ds_alone (NULL, 5, NULL, 1e-5); }
Test (deepseek2, alone_scalar_bitwise) { s_ds_alone (NULL, 0, "scalar", 0); }
Test (deepseek2, alone_sync_dispatcher_fallback) { s_ds_alone ("local_sync", 0, NULL, 1e-5); }
Test (deepseek2, dp_ep_normal_scalar_bitwise) { s_dp_job ("tiny-deepseek2", 0, "ep_normal", 2, 0, "scalar", 0); }
Test (deepseek2, dp_ep_normal_on_equals_off) { s_dp_job ("tiny-deepseek2", 0, "ep_normal", 2, 0, NULL, 1e-5); }
Test (deepseek2, dp_ep_low_latency_on_equals_off) { s_dp_job ("tiny-deepseek2", 0, "ep_low_latency", 2, 0, NULL, 1e-5); }
Test (deepseek2, dp_ep_auto_on_equals_off) { s_dp_job ("tiny-deepseek2", 0, "ep_auto", 2, 0, NULL, 1e-5); }
Test (deepseek2, dp_ep_normal_chunked_on_equals_off) { s_dp_job ("tiny-deepseek2", 0, "ep_normal", 2, 5, NULL, 1e-5); }
Test (deepseek2, dp_local_on_equals_off) { s_dp_job ("tiny-deepseek2", 0, "local", 1, 0, NULL, 1e-5); }
/* Tensor parallelism (2 ranks, the same batches): attn_output's
 * all-reduce runs per micro-batch; the MoE replicated (local). */
Test (deepseek2, tp_local_on_equals_off) { s_dp_job ("tiny-deepseek2", 1, "local", 0, 0, NULL, 1e-5); }
