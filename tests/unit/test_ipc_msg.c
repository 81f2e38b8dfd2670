/* tests/unit/test_ipc_msg.c -- the IPC message codec: every type round-trips
 * with edge values, every truncation and forged count is refused with one
 * "ipc message: ..." line, single-byte corruptions never crash (and what
 * still decodes re-encodes to the same bytes), other versions are refused
 * naming both, the encoder refuses what the decoder would, and the fuzz
 * seeds and regressions (tests/fuzz/corpus/ipc, tests/fuzz/regressions-ipc)
 * behave.
 *
 * RX_IPC_WRITE_CORPUS=<dir> makes the "seeds" test (re)write the seed
 * corpus from the samples below. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <string.h>

#include "ipc_msg.h"
#include "../testutil.h"

/* ------------------------------------------------------------ samples
 * Static arrays, so the samples are borrowed (never rx_ipc_msg_free'd). */

static int32_t s_ids_long[1000];
static char s_stop_storage[RX_MAX_STOP][32];
static char *s_stops[RX_MAX_STOP];

static void s_init_arrays (void)
{
    for (int i = 0; i < 1000; i++) s_ids_long[i] = i * 7919 - 3000000;
    s_ids_long[0] = INT32_MIN;
    s_ids_long[999] = INT32_MAX;
    for (int i = 0; i < RX_MAX_STOP; i++) {
        snprintf (s_stop_storage[i], sizeof s_stop_storage[i], "stop-%d-\xc3\xa9\xe4\xb8\x96", i);
        s_stops[i] = s_stop_storage[i];
    }
    s_stop_storage[0][0] = '\n';   /* control chars are fine */
    s_stop_storage[0][1] = '\0';
}

static void s_req_full (struct rx_ipc_msg *m)
{
    s_init_arrays ();
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_REQ_NEW;
    struct rx_request *r = &m->u.req;
    r->rid = UINT64_MAX;
    r->kind = RX_REQ_CHAT;
    r->stream = 1;
    r->echo = 0;
    r->input_ids = s_ids_long;
    r->n_input = 1000;
    r->sp.temperature = 0.7f;
    r->sp.top_p = 0.95f;
    r->sp.top_k = -1;
    r->sp.min_p = 0.05f;
    r->sp.frequency_penalty = -2.0f;
    r->sp.presence_penalty = 2.0f;
    r->sp.repetition_penalty = 1.1f;
    r->sp.max_tokens = INT32_MAX;
    r->sp.min_tokens = 3;
    r->sp.n = 64;
    r->sp.top_logprobs = 20;
    r->sp.logprobs = 1;
    r->sp.ignore_eos = 1;
    r->sp.has_seed = 1;
    r->sp.skip_special_tokens = 0;
    r->sp.seed = 0x0123456789abcdefull;
    r->sp.n_stop = RX_MAX_STOP;
    for (int i = 0; i < RX_MAX_STOP; i++) r->sp.stop[i] = s_stops[i];
    r->sp.n_stop_ids = RX_MAX_STOP_IDS;
    for (int i = 0; i < RX_MAX_STOP_IDS; i++) r->sp.stop_ids[i] = 128000 + i;
}

static void s_req_empty (struct rx_ipc_msg *m)
{
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_REQ_NEW;
    m->u.req.rid = 0;
    m->u.req.kind = RX_REQ_COMPLETION;
    m->u.req.sp.temperature = 1.0f;
    m->u.req.sp.top_p = 1.0f;
    m->u.req.sp.top_k = -1;
    m->u.req.sp.max_tokens = -1;
    m->u.req.sp.n = 1;
    m->u.req.sp.skip_special_tokens = 1;
}

static uint64_t s_rids[3] = { 1, 0x8000000000000000ull, UINT64_MAX };

static void s_abort (struct rx_ipc_msg *m, uint32_t n)
{
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_REQ_ABORT;
    m->u.abort.n = n;
    m->u.abort.rids = n ? s_rids : NULL;
}

/* REQ_DONE: REQ_ABORT's layout under its own type. */
static uint64_t s_done_rids[2] = { 0x0102030405060708ull, 7 };

static void s_done (struct rx_ipc_msg *m, uint32_t n)
{
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_REQ_DONE;
    m->u.done.n = n;
    m->u.done.rids = n ? s_done_rids : NULL;
}

/* REQ_ABORT_SEQ: (rid, sibling index) pairs. */
static struct rx_ipc_seq_ref s_seqs[2] = { { 0x0102030405060708ull, 2 }, { 7, 0xfffffffeu } };

static void s_abort_seq (struct rx_ipc_msg *m, uint32_t n)
{
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_REQ_ABORT_SEQ;
    m->u.abort_seq.n = n;
    m->u.abort_seq.seqs = n ? s_seqs : NULL;
}

static int32_t s_tok_ids[4] = { 5, 0, -1, 151643 };
static float s_tok_lp[4] = { -0.01f, -3.5f, 0.0f, -1e30f };
static int32_t s_top_ids[4 * RX_MAX_TOP_LOGPROBS];
static float s_top_lp[4 * RX_MAX_TOP_LOGPROBS];
static struct rx_ipc_tok_out s_tok_out[3];

static void s_tokens (struct rx_ipc_msg *m, uint32_t n)
{
    s_init_arrays ();
    for (int i = 0; i < 4 * RX_MAX_TOP_LOGPROBS; i++) {
        s_top_ids[i] = i * 3;
        s_top_lp[i] = -0.5f * (float) i;
    }
    memset (s_tok_out, 0, sizeof s_tok_out);
    /* running, with full top-k logprobs */
    s_tok_out[0].rid = 42;
    s_tok_out[0].index = 63;
    s_tok_out[0].finish = RX_FINISH_NONE;
    s_tok_out[0].matched = -1;
    s_tok_out[0].usage = (struct rx_ipc_usage) { 1000, 512, 4 };
    s_tok_out[0].n_ids = 4;
    s_tok_out[0].ids = s_tok_ids;
    s_tok_out[0].has_logprobs = 1;
    s_tok_out[0].lp = (struct rx_ipc_logprobs) { 4, RX_MAX_TOP_LOGPROBS, NULL, s_tok_lp, s_top_ids,
                                                 s_top_lp };
    /* first output: carries every stop string */
    s_tok_out[1].rid = UINT64_MAX;
    s_tok_out[1].index = UINT32_MAX;
    s_tok_out[1].finish = RX_FINISH_STOP_ID;
    s_tok_out[1].matched = 128001;
    s_tok_out[1].usage = (struct rx_ipc_usage) { UINT32_MAX, 0, 1 };
    s_tok_out[1].n_ids = 1;
    s_tok_out[1].ids = s_tok_ids + 3;
    s_tok_out[1].first = 1;
    s_tok_out[1].skip_special_tokens = 1;
    s_tok_out[1].n_stop = RX_MAX_STOP;
    for (int i = 0; i < RX_MAX_STOP; i++) s_tok_out[1].stop[i] = s_stops[i];
    /* aborted with no new token, logprobs block empty */
    s_tok_out[2].rid = 0;
    s_tok_out[2].finish = RX_FINISH_ABORT;
    s_tok_out[2].matched = -1;
    s_tok_out[2].has_logprobs = 1;
    s_tok_out[2].lp.n_top = 3;
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_TOKENS;
    m->u.tokens.step = 1ull << 40;
    m->u.tokens.n = n;
    m->u.tokens.out = n ? s_tok_out : NULL;
}

static char s_utf8_text[] = "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8e\x89\n\"q\"";
static struct rx_ipc_text_out s_text_out[3];

static void s_text (struct rx_ipc_msg *m, uint32_t n)
{
    memset (s_text_out, 0, sizeof s_text_out);
    s_text_out[0].rid = 7;
    s_text_out[0].index = 2;
    s_text_out[0].finish = RX_FINISH_NONE;
    s_text_out[0].matched = -1;
    s_text_out[0].usage = (struct rx_ipc_usage) { 10, 0, 3 };
    s_text_out[0].text = s_utf8_text;
    s_text_out[0].text_len = (uint32_t) strlen (s_utf8_text);
    s_text_out[0].has_logprobs = 1;
    s_text_out[0].lp = (struct rx_ipc_logprobs) { 4, 2, s_tok_ids, s_tok_lp, s_top_ids, s_top_lp };
    s_text_out[1].rid = UINT64_MAX;
    s_text_out[1].index = UINT32_MAX;
    s_text_out[1].finish = RX_FINISH_STOP_STR;
    s_text_out[1].matched = 15;
    s_text_out[1].usage = (struct rx_ipc_usage) { 1, 1, 100 };
    s_text_out[1].text = "";
    s_text_out[1].text_len = 0;
    s_text_out[2].rid = 3;
    s_text_out[2].finish = RX_FINISH_LENGTH;
    s_text_out[2].matched = -1;
    s_text_out[2].text = "a\0b";          /* embedded NUL is fine in text */
    s_text_out[2].text_len = 3;
    memset (m, 0, sizeof *m);
    m->type = RX_IPC_TEXT;
    m->u.text.n = n;
    m->u.text.out = n ? s_text_out : NULL;
}

static void s_control (struct rx_ipc_msg *m, int which)
{
    memset (m, 0, sizeof *m);
    switch (which) {
    case 0:
        m->type = RX_IPC_FLUSH_CACHE;
        m->u.cookie = UINT64_MAX;
        break;
    case 1:
        m->type = RX_IPC_FLUSH_CACHE_REPLY;
        m->u.flush_reply.cookie = 9;
        m->u.flush_reply.status = RX_EAGAIN;
        m->u.flush_reply.message = "3 requests are running; flush refused";
        break;
    case 2:
        m->type = RX_IPC_FLUSH_CACHE_REPLY;
        m->u.flush_reply.cookie = 0;
        m->u.flush_reply.status = RX_OK;
        m->u.flush_reply.message = "";
        break;
    case 3:
        m->type = RX_IPC_GET_STATS;
        m->u.cookie = 12345;
        break;
    case 4:
        m->type = RX_IPC_STATS;
        m->u.stats = (struct rx_ipc_stats) { 12345, 3, 17, 250, 100000, UINT64_MAX, 1ull << 33,
                                             987654321, 123456789, 0.625f, 2500.5f, 180.25f,
                                             555555, 1ull << 35, 4242, 7, 1024, 131072, 151936,
                                             0.4375f, 1ull << 40, 77, UINT64_MAX - 5, 1ull << 41, 99 };
        break;
    case 5:
        m->type = RX_IPC_SHUTDOWN;
        m->u.shutdown.mode = RX_IPC_SHUTDOWN_DRAIN;
        m->u.shutdown.deadline_ms = 30000;
        break;
    case 6:
        m->type = RX_IPC_SHUTDOWN;
        m->u.shutdown.mode = RX_IPC_SHUTDOWN_NOW;
        m->u.shutdown.deadline_ms = 0;
        break;
    case 7:
        m->type = RX_IPC_REQ_ERROR;
        m->u.req_error.rid = 0x1122334455667788ull;
        m->u.req_error.status = RX_EAGAIN;
        m->u.req_error.message = "scheduler: queue full (4 waiting, max_queued_requests 4) \xe2\x80\x94 retry";
        break;
    default:
        m->type = RX_IPC_REQ_ERROR;
        m->u.req_error.rid = UINT64_MAX;
        m->u.req_error.status = INT32_MIN;
        m->u.req_error.message = "";
        break;
    }
}

/* EPLB, EPLB_REPLY, EPLB_STATS (core/expert_record.h) */
static float s_eplb_bal[3] = { 1.0f, 0.5f, 0.0f };

static void s_eplb (int i, struct rx_ipc_msg *m)
{
    memset (m, 0, sizeof *m);
    if (i == 0) {
        m->type = RX_IPC_EPLB;
        m->u.eplb.cookie = UINT64_MAX;
        m->u.eplb.op = RX_IPC_EPLB_OP_DUMP;
    } else if (i == 1) {
        m->type = RX_IPC_EPLB_REPLY;
        m->u.flush_reply.cookie = 3;
        m->u.flush_reply.status = RX_ENOTSUP;
        m->u.flush_reply.message = "/tmp/radix-eplb/x.json";
    } else {
        m->type = RX_IPC_EPLB_STATS;
        m->u.eplb_stats.dp_rank = 2;
        m->u.eplb_stats.rebalanced = 7;
        m->u.eplb_stats.skipped = UINT64_MAX;
        m->u.eplb_stats.n = 3;
        m->u.eplb_stats.balancedness = s_eplb_bal;
    }
}

#define S_NSAMPLES 24
static void s_sample (int i, struct rx_ipc_msg *m)
{
    s_init_arrays ();
    switch (i) {
    case 0: s_req_full (m); break;
    case 1: s_req_empty (m); break;
    case 2: s_abort (m, 0); break;
    case 3: s_abort (m, 3); break;
    case 4: s_tokens (m, 0); break;
    case 5: s_tokens (m, 3); break;
    case 6: s_text (m, 0); break;
    case 7: s_text (m, 3); break;
    case 17: s_done (m, 0); break;
    case 18: s_done (m, 2); break;
    case 19: case 20: case 21: s_eplb (i - 19, m); break;
    case 22: s_abort_seq (m, 0); break;
    case 23: s_abort_seq (m, 2); break;
    default: s_control (m, i - 8); break;
    }
}

/* ------------------------------------------------------------ comparison
 * Field by field, floats bitwise; written here, not taken from the codec. */

static int s_feq (float a, float b) { return memcmp (&a, &b, sizeof a) == 0; }

static void s_eq_lp (const struct rx_ipc_logprobs *a, const struct rx_ipc_logprobs *b, int ids)
{
    cr_assert_eq (a->n, b->n);
    cr_assert_eq (a->n_top, b->n_top);
    for (uint32_t i = 0; i < a->n; i++) {
        if (ids) cr_assert_eq (a->ids[i], b->ids[i]);
        cr_assert (s_feq (a->logprob[i], b->logprob[i]));
    }
    if (!ids) cr_assert_null (b->ids);
    for (uint32_t i = 0; i < a->n * a->n_top; i++) {
        cr_assert_eq (a->top_ids[i], b->top_ids[i]);
        cr_assert (s_feq (a->top_logprob[i], b->top_logprob[i]));
    }
}

static void s_eq_usage (const struct rx_ipc_usage *a, const struct rx_ipc_usage *b)
{
    cr_assert_eq (a->prompt_tokens, b->prompt_tokens);
    cr_assert_eq (a->cached_tokens, b->cached_tokens);
    cr_assert_eq (a->completion_tokens, b->completion_tokens);
}

static void s_eq (const struct rx_ipc_msg *a, const struct rx_ipc_msg *b)
{
    cr_assert_eq (a->type, b->type);
    switch (a->type) {
    case RX_IPC_REQ_NEW: {
        const struct rx_request *x = &a->u.req, *y = &b->u.req;
        cr_assert_eq (x->rid, y->rid);
        cr_assert_eq (x->kind, y->kind);
        cr_assert_eq (x->stream, y->stream);
        cr_assert_eq (x->echo, y->echo);
        cr_assert_eq (x->n_input, y->n_input);
        for (uint32_t i = 0; i < x->n_input; i++) cr_assert_eq (x->input_ids[i], y->input_ids[i]);
        cr_assert (s_feq (x->sp.temperature, y->sp.temperature));
        cr_assert (s_feq (x->sp.top_p, y->sp.top_p));
        cr_assert_eq (x->sp.top_k, y->sp.top_k);
        cr_assert (s_feq (x->sp.min_p, y->sp.min_p));
        cr_assert (s_feq (x->sp.frequency_penalty, y->sp.frequency_penalty));
        cr_assert (s_feq (x->sp.presence_penalty, y->sp.presence_penalty));
        cr_assert (s_feq (x->sp.repetition_penalty, y->sp.repetition_penalty));
        cr_assert_eq (x->sp.max_tokens, y->sp.max_tokens);
        cr_assert_eq (x->sp.min_tokens, y->sp.min_tokens);
        cr_assert_eq (x->sp.n, y->sp.n);
        cr_assert_eq (x->sp.top_logprobs, y->sp.top_logprobs);
        cr_assert_eq (x->sp.logprobs, y->sp.logprobs);
        cr_assert_eq (x->sp.ignore_eos, y->sp.ignore_eos);
        cr_assert_eq (x->sp.has_seed, y->sp.has_seed);
        cr_assert_eq (x->sp.skip_special_tokens, y->sp.skip_special_tokens);
        cr_assert_eq (x->sp.seed, y->sp.seed);
        cr_assert_eq (x->sp.n_stop, y->sp.n_stop);
        for (uint32_t i = 0; i < x->sp.n_stop; i++) cr_assert_str_eq (x->sp.stop[i], y->sp.stop[i]);
        cr_assert_eq (x->sp.n_stop_ids, y->sp.n_stop_ids);
        for (uint32_t i = 0; i < x->sp.n_stop_ids; i++)
            cr_assert_eq (x->sp.stop_ids[i], y->sp.stop_ids[i]);
        break;
    }
    case RX_IPC_REQ_ABORT:
        cr_assert_eq (a->u.abort.n, b->u.abort.n);
        for (uint32_t i = 0; i < a->u.abort.n; i++)
            cr_assert_eq (a->u.abort.rids[i], b->u.abort.rids[i]);
        break;
    case RX_IPC_TOKENS:
        cr_assert_eq (a->u.tokens.step, b->u.tokens.step);
        cr_assert_eq (a->u.tokens.n, b->u.tokens.n);
        for (uint32_t i = 0; i < a->u.tokens.n; i++) {
            const struct rx_ipc_tok_out *x = &a->u.tokens.out[i], *y = &b->u.tokens.out[i];
            cr_assert_eq (x->rid, y->rid);
            cr_assert_eq (x->index, y->index);
            cr_assert_eq (x->finish, y->finish);
            cr_assert_eq (x->matched, y->matched);
            s_eq_usage (&x->usage, &y->usage);
            cr_assert_eq (x->n_ids, y->n_ids);
            for (uint32_t k = 0; k < x->n_ids; k++) cr_assert_eq (x->ids[k], y->ids[k]);
            cr_assert_eq (x->has_logprobs, y->has_logprobs);
            if (x->has_logprobs) s_eq_lp (&x->lp, &y->lp, 0);
            cr_assert_eq (x->first, y->first);
            if (x->first) {
                cr_assert_eq (x->skip_special_tokens, y->skip_special_tokens);
                cr_assert_eq (x->n_stop, y->n_stop);
                for (uint32_t k = 0; k < x->n_stop; k++) cr_assert_str_eq (x->stop[k], y->stop[k]);
            }
        }
        break;
    case RX_IPC_TEXT:
        cr_assert_eq (a->u.text.n, b->u.text.n);
        for (uint32_t i = 0; i < a->u.text.n; i++) {
            const struct rx_ipc_text_out *x = &a->u.text.out[i], *y = &b->u.text.out[i];
            cr_assert_eq (x->rid, y->rid);
            cr_assert_eq (x->index, y->index);
            cr_assert_eq (x->finish, y->finish);
            cr_assert_eq (x->matched, y->matched);
            s_eq_usage (&x->usage, &y->usage);
            cr_assert_eq (x->text_len, y->text_len);
            cr_assert_not_null (y->text);
            cr_assert_eq (memcmp (x->text, y->text, x->text_len), 0);
            cr_assert_eq (y->text[y->text_len], '\0');
            cr_assert_eq (x->has_logprobs, y->has_logprobs);
            if (x->has_logprobs) s_eq_lp (&x->lp, &y->lp, 1);
        }
        break;
    case RX_IPC_FLUSH_CACHE:
    case RX_IPC_GET_STATS:
        cr_assert_eq (a->u.cookie, b->u.cookie);
        break;
    case RX_IPC_FLUSH_CACHE_REPLY:
        cr_assert_eq (a->u.flush_reply.cookie, b->u.flush_reply.cookie);
        cr_assert_eq (a->u.flush_reply.status, b->u.flush_reply.status);
        cr_assert_str_eq (a->u.flush_reply.message, b->u.flush_reply.message);
        break;
    case RX_IPC_STATS: {
        const struct rx_ipc_stats *x = &a->u.stats, *y = &b->u.stats;
        cr_assert_eq (x->cookie, y->cookie);
        cr_assert_eq (x->dp_rank, y->dp_rank);
        cr_assert_eq (x->running, y->running);
        cr_assert_eq (x->queued, y->queued);
        cr_assert_eq (x->kv_used, y->kv_used);
        cr_assert_eq (x->kv_total, y->kv_total);
        cr_assert_eq (x->steps, y->steps);
        cr_assert_eq (x->prompt_tokens, y->prompt_tokens);
        cr_assert_eq (x->gen_tokens, y->gen_tokens);
        cr_assert (s_feq (x->cache_hit_rate, y->cache_hit_rate));
        cr_assert (s_feq (x->prompt_tps, y->prompt_tps));
        cr_assert (s_feq (x->gen_tps, y->gen_tps));
        cr_assert_eq (x->cached_tokens, y->cached_tokens);
        cr_assert_eq (x->cache_tokens, y->cache_tokens);
        cr_assert_eq (x->finished, y->finished);
        cr_assert_eq (x->retractions, y->retractions);
        cr_assert_eq (x->max_running_requests, y->max_running_requests);
        cr_assert_eq (x->context_len, y->context_len);
        cr_assert_eq (x->n_vocab, y->n_vocab);
        cr_assert_eq (x->cand_rows, y->cand_rows);
        cr_assert_eq (x->cand_full, y->cand_full);
        cr_assert_eq (x->cand_tail, y->cand_tail);
        cr_assert_eq (x->cand_lp_rows, y->cand_lp_rows);
        cr_assert_eq (x->cand_lp_full, y->cand_lp_full);
        cr_assert (s_feq (x->new_token_ratio, y->new_token_ratio));
        break;
    }
    case RX_IPC_REQ_ERROR:
        cr_assert_eq (a->u.req_error.rid, b->u.req_error.rid);
        cr_assert_eq (a->u.req_error.status, b->u.req_error.status);
        cr_assert_str_eq (a->u.req_error.message, b->u.req_error.message);
        break;
    case RX_IPC_EPLB:
        cr_assert_eq (a->u.eplb.cookie, b->u.eplb.cookie);
        cr_assert_eq (a->u.eplb.op, b->u.eplb.op);
        break;
    case RX_IPC_EPLB_REPLY:
        cr_assert_eq (a->u.flush_reply.cookie, b->u.flush_reply.cookie);
        cr_assert_eq (a->u.flush_reply.status, b->u.flush_reply.status);
        cr_assert_str_eq (a->u.flush_reply.message, b->u.flush_reply.message);
        break;
    case RX_IPC_EPLB_STATS:
        cr_assert_eq (a->u.eplb_stats.dp_rank, b->u.eplb_stats.dp_rank);
        cr_assert_eq (a->u.eplb_stats.rebalanced, b->u.eplb_stats.rebalanced);
        cr_assert_eq (a->u.eplb_stats.skipped, b->u.eplb_stats.skipped);
        cr_assert_eq (a->u.eplb_stats.n, b->u.eplb_stats.n);
        for (uint32_t i = 0; i < a->u.eplb_stats.n; i++)
            cr_assert (s_feq (a->u.eplb_stats.balancedness[i], b->u.eplb_stats.balancedness[i]));
        break;
    case RX_IPC_REQ_DONE:
        cr_assert_eq (a->u.done.n, b->u.done.n);
        for (uint32_t i = 0; i < a->u.done.n; i++)
            cr_assert_eq (a->u.done.rids[i], b->u.done.rids[i]);
        break;
    case RX_IPC_REQ_ABORT_SEQ:
        cr_assert_eq (a->u.abort_seq.n, b->u.abort_seq.n);
        for (uint32_t i = 0; i < a->u.abort_seq.n; i++) {
            cr_assert_eq (a->u.abort_seq.seqs[i].rid, b->u.abort_seq.seqs[i].rid);
            cr_assert_eq (a->u.abort_seq.seqs[i].index, b->u.abort_seq.seqs[i].index);
        }
        if (!a->u.abort_seq.n) cr_assert_null (b->u.abort_seq.seqs);
        break;
    case RX_IPC_SHUTDOWN:
        cr_assert_eq (a->u.shutdown.mode, b->u.shutdown.mode);
        cr_assert_eq (a->u.shutdown.deadline_ms, b->u.shutdown.deadline_ms);
        break;
    default:
        cr_assert_fail ("unknown type %u", a->type);
    }
}

static uint8_t *s_enc (const struct rx_ipc_msg *m, size_t *len)
{
    struct rx_err err = { 0 };
    uint8_t *buf = NULL;
    int rc = rx_ipc_encode (m, &buf, len, &err);
    cr_assert_eq (rc, RX_OK, "encode %s: %s", rx_ipc_type_name (m->type), err.msg);
    cr_assert_eq (*len, rx_ipc_encoded_size (m, &err));
    return buf;
}

static void s_put_u32 (uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t) v, p[1] = (uint8_t) (v >> 8), p[2] = (uint8_t) (v >> 16), p[3] = (uint8_t) (v >> 24);
}

/* A refusal: RX_EFORMAT, one line starting "ipc message: ", m left empty. */
static void s_refused (const uint8_t *buf, size_t n, const char *ctx)
{
    struct rx_ipc_msg m;
    memset (&m, 0xab, sizeof m);
    struct rx_err err = { 0 };
    int rc = rx_ipc_decode (buf, n, &m, &err);
    cr_assert_eq (rc, RX_EFORMAT, "%s: decode gave %d (%s)", ctx, rc, err.msg);
    cr_assert_eq (err.code, RX_EFORMAT);
    cr_assert_eq (strncmp (err.msg, "ipc message: ", 13), 0, "%s: message \"%s\"", ctx, err.msg);
    cr_assert_gt (strlen (err.msg), 20, "%s: message \"%s\"", ctx, err.msg);
    cr_assert_null (strchr (err.msg, '\n'));
    cr_assert_eq (m.type, 0, "%s: message not left empty", ctx);
}

/* ------------------------------------------------------------ tests */

Test (ipc_msg, round_trip_every_sample)
{
    for (int i = 0; i < S_NSAMPLES; i++) {
        struct rx_ipc_msg m, d;
        s_sample (i, &m);
        size_t len;
        uint8_t *buf = s_enc (&m, &len);
        struct rx_err err = { 0 };
        cr_assert_eq (rx_ipc_decode (buf, len, &d, &err), RX_OK, "sample %d (%s): %s", i,
                      rx_ipc_type_name (m.type), err.msg);
        s_eq (&m, &d);
        /* decode -> encode gives back the same bytes */
        size_t len2;
        uint8_t *buf2 = s_enc (&d, &len2);
        cr_assert_eq (len2, len);
        cr_assert_eq (memcmp (buf, buf2, len), 0, "sample %d re-encodes differently", i);
        rx_ipc_msg_free (&d);
        cr_assert_eq (d.type, 0);
        rx_ipc_msg_free (&d);      /* idempotent */
        free (buf);
        free (buf2);
    }
    rx_ipc_msg_free (NULL);
}

Test (ipc_msg, every_type_covered)
{
    int seen[RX_IPC_TYPE_MAX + 1] = { 0 };
    for (int i = 0; i < S_NSAMPLES; i++) {
        struct rx_ipc_msg m;
        s_sample (i, &m);
        seen[m.type] = 1;
    }
    for (int t = 1; t <= RX_IPC_TYPE_MAX; t++) {
        cr_assert (seen[t], "no sample of type %d", t);
        cr_assert_str_neq (rx_ipc_type_name (t), "?");
    }
    cr_assert_str_eq (rx_ipc_type_name (0), "?");
    cr_assert_str_eq (rx_finish_name (RX_FINISH_STOP_STR), "stop_str");
    cr_assert_str_eq (rx_finish_name (99), "?");
}

Test (ipc_msg, wire_layout_is_little_endian_and_compact)
{
    struct rx_ipc_msg m;
    s_abort (&m, 3);
    size_t len;
    uint8_t *b = s_enc (&m, &len);
    /* header 12 + count 4 + 3 x 8 */
    cr_assert_eq (len, 12 + 4 + 24);
    static const uint8_t head[] = { 'R', 'X', 'I', 'P', 4, 0, RX_IPC_REQ_ABORT, 0, 28, 0, 0, 0,
                                    3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0 };
    cr_assert_eq (memcmp (b, head, sizeof head), 0);
    cr_assert_eq (b[16 + 8 + 7], 0x80);       /* rid 1<<63: top byte last */
    free (b);
    /* TOKENS: 4 ids cost 16 bytes, not more; the sibling index follows
     * the rid as a u32 */
    struct rx_ipc_msg t;
    s_tokens (&t, 1);
    s_tok_out[0].has_logprobs = 0;
    s_tok_out[0].index = 0x01020304u;
    b = s_enc (&t, &len);
    cr_assert_eq (len, 12 + 8 + 4 + (8 + 4 + 1 + 1 + 4 + 12 + 4 + 16));
    static const uint8_t ix[] = { 42, 0, 0, 0, 0, 0, 0, 0, 4, 3, 2, 1 };
    cr_assert_eq (memcmp (b + 12 + 8 + 4, ix, sizeof ix), 0);
    free (b);
    /* REQ_ERROR: rid, status, message */
    memset (&t, 0, sizeof t);
    t.type = RX_IPC_REQ_ERROR;
    t.u.req_error = (struct rx_ipc_req_error) { 5, RX_ERANGE, (char *) "ab" };
    b = s_enc (&t, &len);
    cr_assert_eq (len, 12 + 8 + 4 + 4 + 2);
    cr_assert_eq (b[6], 10);
    cr_assert_eq (b[12], 5);
    int32_t st;
    memcpy (&st, b + 20, 4);
    cr_assert_eq (st, RX_ERANGE);
    cr_assert_eq (memcmp (b + 24, "\x02\0\0\0ab", 6), 0);
    free (b);
    /* REQ_DONE: type 11, then REQ_ABORT's payload */
    s_done (&t, 2);
    b = s_enc (&t, &len);
    static const uint8_t done[] = { 'R', 'X', 'I', 'P', 4, 0, 11, 0, 20, 0, 0, 0,
                                    2, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 7, 0, 0, 0, 0, 0, 0, 0 };
    cr_assert_eq (len, sizeof done);
    cr_assert_eq (memcmp (b, done, sizeof done), 0);
    free (b);
    /* REQ_ABORT_SEQ: type 15, count, then (u64 rid, u32 index) pairs */
    s_abort_seq (&t, 2);
    b = s_enc (&t, &len);
    static const uint8_t aseq[] = { 'R', 'X', 'I', 'P', 4, 0, 15, 0, 28, 0, 0, 0, 2, 0, 0, 0,
                                    8, 7, 6, 5, 4, 3, 2, 1, 2, 0, 0, 0,
                                    7, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff };
    cr_assert_eq (len, sizeof aseq);
    cr_assert_eq (memcmp (b, aseq, sizeof aseq), 0);
    free (b);
    /* STATS v4: 12 + the v1 payload (8 + 3x4 + 5x8 + 3x4) + v2's 4x8 + 3x4
     * + 4 + v3's 3x8 + v4's 2x8 */
    s_control (&t, 4);
    b = s_enc (&t, &len);
    cr_assert_eq (len, 12 + (8 + 12 + 40 + 12) + 32 + 12 + 4 + 24 + 16);
    free (b);
}

Test (ipc_msg, peek)
{
    struct rx_ipc_msg m;
    s_control (&m, 4);
    size_t len;
    uint8_t *b = s_enc (&m, &len);
    uint16_t ty = 0;
    uint32_t pl = 0;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_ipc_peek (b, len, &ty, &pl, &err), RX_OK);
    cr_assert_eq (ty, RX_IPC_STATS);
    cr_assert_eq (pl, len - RX_IPC_HEADER_LEN);
    cr_assert_eq (rx_ipc_peek (NULL, 0, &ty, &pl, &err), RX_EFORMAT);
    free (b);
}

/* Every prefix of every sample is refused: once as is (the header's length
 * no longer matches), once with the header patched to the shorter payload
 * (so the payload's own bounds checks must catch it). */
Test (ipc_msg, every_truncation_refused)
{
    for (int i = 0; i < S_NSAMPLES; i++) {
        struct rx_ipc_msg m;
        s_sample (i, &m);
        size_t len;
        uint8_t *buf = s_enc (&m, &len);
        for (size_t n = 0; n < len; n++) {
            uint8_t *cut = malloc (n ? n : 1);
            memcpy (cut, buf, n);
            char ctx[64];
            snprintf (ctx, sizeof ctx, "sample %d cut to %zu", i, n);
            s_refused (cut, n, ctx);
            if (n >= RX_IPC_HEADER_LEN) {
                s_put_u32 (cut + 8, (uint32_t) (n - RX_IPC_HEADER_LEN));
                snprintf (ctx, sizeof ctx, "sample %d cut to %zu, length patched", i, n);
                s_refused (cut, n, ctx);
            }
            free (cut);
        }
        free (buf);
    }
}

Test (ipc_msg, trailing_bytes_refused)
{
    struct rx_ipc_msg m;
    s_control (&m, 0);
    size_t len;
    uint8_t *buf = s_enc (&m, &len);
    uint8_t *big = calloc (1, len + 1);
    memcpy (big, buf, len);
    s_put_u32 (big + 8, (uint32_t) (len + 1 - RX_IPC_HEADER_LEN));
    s_refused (big, len + 1, "trailing byte");
    struct rx_ipc_msg d;
    struct rx_err err = { 0 };
    rx_ipc_decode (big, len + 1, &d, &err);
    cr_assert (strstr (err.msg, "1 trailing bytes"), "%s", err.msg);
    free (big);
    free (buf);
}

/* Every byte position of every sample, several corruptions each: decoding
 * either succeeds -- and then the message is valid: it re-encodes to exactly
 * the corrupted bytes -- or is refused with a proper line.  Crashes and
 * over-reads would kill the test (and ASan builds catch over-reads). */
Test (ipc_msg, single_byte_corruptions)
{
    static const int xors[] = { 0x01, 0x80, 0xff, 0x7f, 0x10 };
    long ok = 0, refused = 0;
    for (int i = 0; i < S_NSAMPLES; i++) {
        struct rx_ipc_msg m;
        s_sample (i, &m);
        size_t len;
        uint8_t *buf = s_enc (&m, &len);
        uint8_t *c = malloc (len);
        for (size_t pos = 0; pos < len; pos++) {
            for (size_t x = 0; x < sizeof xors / sizeof xors[0] + 2; x++) {
                memcpy (c, buf, len);
                c[pos] = x < 5 ? (uint8_t) (c[pos] ^ xors[x]) : x == 5 ? 0x00 : 0xff;
                if (!memcmp (c, buf, len)) continue;
                struct rx_ipc_msg d;
                struct rx_err err = { 0 };
                int rc = rx_ipc_decode (c, len, &d, &err);
                if (rc == RX_OK) {
                    size_t len2;
                    uint8_t *re = s_enc (&d, &len2);
                    cr_assert_eq (len2, len, "sample %d byte %zu: decoded but re-encodes to %zu bytes",
                                  i, pos, len2);
                    cr_assert_eq (memcmp (re, c, len), 0, "sample %d byte %zu re-encodes differently",
                                  i, pos);
                    free (re);
                    rx_ipc_msg_free (&d);
                    ok++;
                } else {
                    char ctx[64];
                    snprintf (ctx, sizeof ctx, "sample %d byte %zu", i, pos);
                    s_refused (c, len, ctx);
                    refused++;
                }
            }
        }
        free (c);
        free (buf);
    }
    /* Both outcomes happen (payload values change freely; structure breaks). */
    cr_assert_gt (ok, 1000);
    cr_assert_gt (refused, 1000);
}

Test (ipc_msg, other_version_refused_naming_both)
{
    struct rx_ipc_msg m;
    s_req_empty (&m);
    size_t len;
    uint8_t *buf = s_enc (&m, &len);
    /* version 1 (before the sibling index and REQ_ERROR), version 2 (before
     * the device sampling counters of STATS), version 3 (before the
     * logprobs counters) and version 5 */
    buf[4] = 1;
    s_refused (buf, len, "version 1");
    struct rx_ipc_msg d;
    struct rx_err err = { 0 };
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, "format version 1,"), "%s", err.msg);
    cr_assert (strstr (err.msg, "speaks version 4"), "%s", err.msg);
    buf[4] = 2;
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, "format version 2,"), "%s", err.msg);
    buf[4] = 3;
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, "format version 3,"), "%s", err.msg);
    buf[4] = 5;
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, "format version 5,"), "%s", err.msg);
    buf[4] = 0;
    buf[5] = 1;   /* 256 */
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, "format version 256"), "%s", err.msg);
    free (buf);
}

Test (ipc_msg, bad_header_refused)
{
    struct rx_ipc_msg m;
    s_control (&m, 3);
    size_t len;
    uint8_t *buf = s_enc (&m, &len);
    struct rx_ipc_msg d;
    struct rx_err err = { 0 };
    buf[0] = 'X';
    s_refused (buf, len, "magic");
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, "bad magic"), "%s", err.msg);
    buf[0] = 'R';
    buf[6] = 0;
    s_refused (buf, len, "type 0");
    buf[6] = RX_IPC_TYPE_MAX + 1;
    s_refused (buf, len, "type max+1");
    rx_ipc_decode (buf, len, &d, &err);
    char want_type[64];
    snprintf (want_type, sizeof want_type, "unknown message type %d", RX_IPC_TYPE_MAX + 1);
    cr_assert (strstr (err.msg, want_type), "%s", err.msg);
    buf[6] = RX_IPC_GET_STATS;
    s_put_u32 (buf + 8, 0xffffffffu);
    s_refused (buf, len, "length");
    free (buf);
}

/* Counts forged to huge values are refused before allocating (a 4-billion
 * element calloc would fail or take seconds; the refusal is immediate and
 * names the claim). */
Test (ipc_msg, forged_counts_refused_before_allocating, .timeout = 10)
{
    struct {
        struct rx_ipc_msg m;
        size_t off;          /* offset of the count in the encoding */
        const char *expect;
    } cases[6];
    s_abort (&cases[0].m, 3);
    cases[0].off = 12;
    cases[0].expect = "claims 4294967295 elements";
    s_tokens (&cases[1].m, 3);
    cases[1].off = 12 + 8;
    cases[1].expect = "claims 4294967295 elements";
    s_text (&cases[2].m, 3);
    cases[2].off = 12;
    cases[2].expect = "claims 4294967295 elements";
    s_req_full (&cases[3].m);
    cases[3].off = 12 + 8 + 4 + 2;     /* n_input */
    cases[3].expect = "claims 4294967295 elements";
    s_done (&cases[4].m, 2);
    cases[4].off = 12;
    cases[4].expect = "claims 4294967295 elements";
    s_abort_seq (&cases[5].m, 2);
    cases[5].off = 12;
    cases[5].expect = "sequences claims 4294967295 elements of 12 bytes";
    for (int i = 0; i < 6; i++) {
        size_t len;
        /* s_tokens/s_text reset their statics: re-sample before encoding */
        if (i == 1) s_tokens (&cases[1].m, 3);
        if (i == 2) s_text (&cases[2].m, 3);
        uint8_t *buf = s_enc (&cases[i].m, &len);
        s_put_u32 (buf + cases[i].off, 0xffffffffu);
        s_refused (buf, len, cases[i].expect);
        struct rx_ipc_msg d;
        struct rx_err err = { 0 };
        rx_ipc_decode (buf, len, &d, &err);
        cr_assert (strstr (err.msg, cases[i].expect), "case %d: %s", i, err.msg);
        free (buf);
    }
    /* A string length over what is left, and the text logprobs count. */
    struct rx_ipc_msg t;
    s_text (&t, 1);
    size_t len;
    uint8_t *buf = s_enc (&t, &len);
    size_t text_len_off = 12 + 4 + 8 + 4 + 1 + 1 + 4 + 12;
    s_put_u32 (buf + text_len_off, 0x7fffffffu);
    s_refused (buf, len, "text length");
    free (buf);
    s_text (&t, 1);
    buf = s_enc (&t, &len);
    size_t lp_n_off = text_len_off + 4 + s_text_out[0].text_len;
    s_put_u32 (buf + lp_n_off, 0x40000000u);
    s_refused (buf, len, "logprob count");
    free (buf);
}

/* Hand-made payloads that are structurally plausible but invalid. */
static void s_refuse_patched (const struct rx_ipc_msg *m, size_t off, const uint8_t *bytes,
                              size_t nb, const char *expect)
{
    size_t len;
    uint8_t *buf = s_enc (m, &len);
    cr_assert_leq (off + nb, len);
    memcpy (buf + off, bytes, nb);
    s_refused (buf, len, expect);
    struct rx_ipc_msg d;
    struct rx_err err = { 0 };
    rx_ipc_decode (buf, len, &d, &err);
    cr_assert (strstr (err.msg, expect), "expected \"%s\" in \"%s\"", expect, err.msg);
    free (buf);
}

Test (ipc_msg, invalid_values_refused)
{
    struct rx_ipc_msg m;
    /* REQ_NEW: kind, a bool, too many stop strings / stop ids, empty and
     * NUL-containing stop strings */
    s_req_empty (&m);
    s_refuse_patched (&m, 12 + 8, (const uint8_t[]) { 4, 0, 0, 0 }, 4, "unknown request kind 4");
    s_refuse_patched (&m, 12 + 12, (const uint8_t[]) { 2 }, 1, "stream is 2");
    size_t len;
    uint8_t *b = s_enc (&m, &len);
    /* the empty request ends with n_stop (u8) and n_stop_ids (u8) */
    free (b);
    s_refuse_patched (&m, len - 1, (const uint8_t[]) { 65 }, 1, "65 stop ids");
    s_refuse_patched (&m, len - 2, (const uint8_t[]) { 17 }, 1, "17 stop strings");

    static char one[] = "ab";
    char *stops1[1] = { one };
    s_req_empty (&m);
    m.u.req.sp.n_stop = 1;
    m.u.req.sp.stop[0] = stops1[0];
    b = s_enc (&m, &len);
    free (b);
    /* ... n_stop=1, len=2, 'a','b', n_stop_ids=0 */
    s_refuse_patched (&m, len - 3, (const uint8_t[]) { 0 }, 1, "contains NUL");
    s_refuse_patched (&m, len - 3, (const uint8_t[]) { 0xff }, 1, "not valid UTF-8");

    /* TOKENS: finish, flags */
    s_tokens (&m, 1);
    s_tok_out[0].has_logprobs = 0;
    s_refuse_patched (&m, 12 + 12 + 8 + 4 + 1, (const uint8_t[]) { 6 }, 1, "unknown finish reason 6");
    s_tokens (&m, 1);
    s_tok_out[0].has_logprobs = 0;
    s_refuse_patched (&m, 12 + 12 + 8 + 4, (const uint8_t[]) { 4 }, 1, "unknown flags 0x04");
    /* n_top over 20 */
    s_tokens (&m, 1);
    size_t ntop_off = 12 + 12 + 8 + 4 + 1 + 1 + 4 + 12 + 4 + 16;
    s_refuse_patched (&m, ntop_off, (const uint8_t[]) { 21 }, 1, "21 top logprobs");

    /* TEXT: overlong, surrogate and truncated UTF-8 */
    static char txt[] = "abcd";
    struct rx_ipc_text_out to = { .rid = 1, .matched = -1, .text = txt, .text_len = 4 };
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_TEXT;
    m.u.text.n = 1;
    m.u.text.out = &to;
    size_t toff = 12 + 4 + 8 + 4 + 1 + 1 + 4 + 12 + 4;
    s_refuse_patched (&m, toff, (const uint8_t[]) { 0xc0, 0xaf }, 2, "text is not valid UTF-8");
    s_refuse_patched (&m, toff, (const uint8_t[]) { 0xed, 0xa0, 0x80 }, 3, "not valid UTF-8");
    s_refuse_patched (&m, toff + 2, (const uint8_t[]) { 0xe4, 0xb8 }, 2, "not valid UTF-8");
    s_refuse_patched (&m, toff, (const uint8_t[]) { 0xf4, 0x90, 0x80, 0x80 }, 4, "not valid UTF-8");

    /* TEXT flags */
    s_refuse_patched (&m, 12 + 4 + 8 + 4, (const uint8_t[]) { 2 }, 1, "unknown flags 0x02");

    /* SHUTDOWN mode */
    s_control (&m, 5);
    s_refuse_patched (&m, 12, (const uint8_t[]) { 2 }, 1, "unknown mode 2");

    /* REQ_ERROR: a status that is not an error, a NUL or bad UTF-8 in the
     * message, a message longer than the payload */
    s_control (&m, 7);
    s_refuse_patched (&m, 12 + 8, (const uint8_t[]) { 0, 0, 0, 0 }, 4, "status 0 is not an error");
    s_refuse_patched (&m, 12 + 8, (const uint8_t[]) { 1, 0, 0, 0 }, 4, "status 1 is not an error");
    s_refuse_patched (&m, 12 + 8 + 4 + 4 + 3, (const uint8_t[]) { 0 }, 1, "message contains NUL");
    s_refuse_patched (&m, 12 + 8 + 4 + 4, (const uint8_t[]) { 0xc3 }, 1, "message is not valid UTF-8");
    s_refuse_patched (&m, 12 + 8 + 4, (const uint8_t[]) { 0xff, 0xff, 0, 0 }, 4, "claims 65535 bytes");
}

Test (ipc_msg, encoder_refuses_what_decoder_would)
{
    struct rx_ipc_msg m;
    struct rx_err err = { 0 };
    uint8_t *buf = (uint8_t *) 1;
    size_t len;
#define ENC_FAILS(expect)                                                          \
    do {                                                                           \
        cr_assert_eq (rx_ipc_encode (&m, &buf, &len, &err), RX_EINVAL, "%s", expect); \
        cr_assert_null (buf);                                                      \
        cr_assert (strstr (err.msg, expect), "expected \"%s\" in \"%s\"", expect, err.msg); \
        cr_assert_eq (rx_ipc_encoded_size (&m, &err), 0);                          \
    } while (0)

    s_req_full (&m);
    m.u.req.sp.n_stop = RX_MAX_STOP + 1;
    ENC_FAILS ("17 stop strings");
    s_req_full (&m);
    m.u.req.sp.stop[3] = (char *) "";
    ENC_FAILS ("stop string 3 is empty");
    s_req_full (&m);
    m.u.req.sp.stop[2] = (char *) "\xff";
    ENC_FAILS ("stop string 2 is not UTF-8");
    s_req_full (&m);
    m.u.req.sp.n_stop_ids = RX_MAX_STOP_IDS + 1;
    ENC_FAILS ("65 stop ids");
    s_req_full (&m);
    m.u.req.kind = 0;
    ENC_FAILS ("unknown request kind 0");
    s_req_full (&m);
    m.u.req.input_ids = NULL;
    ENC_FAILS ("1000 input ids but no array");
    s_req_full (&m);
    m.u.req.echo = 2;
    ENC_FAILS ("neither 0 nor 1");
    s_abort (&m, 3);
    m.u.abort.rids = NULL;
    ENC_FAILS ("REQ_ABORT: 3 rids but no array");
    s_done (&m, 2);
    m.u.done.rids = NULL;
    ENC_FAILS ("REQ_DONE: 2 rids but no array");
    s_abort_seq (&m, 2);
    m.u.abort_seq.seqs = NULL;
    ENC_FAILS ("REQ_ABORT_SEQ: 2 sequences but no array");
    s_tokens (&m, 3);
    s_tok_out[0].lp.n_top = 21;
    ENC_FAILS ("21 top logprobs");
    s_tokens (&m, 3);
    s_tok_out[0].lp.n = 3;
    ENC_FAILS ("logprobs for 3 tokens, chunk has 4");
    s_tokens (&m, 3);
    s_tok_out[2].finish = 9;
    ENC_FAILS ("unknown finish 9");
    s_text (&m, 3);
    s_text_out[0].text = "\xe4\xb8";
    s_text_out[0].text_len = 2;
    ENC_FAILS ("text is not UTF-8");
    s_text (&m, 3);
    s_text_out[0].lp.ids = NULL;
    ENC_FAILS ("logprob arrays missing");
    s_control (&m, 5);
    m.u.shutdown.mode = 7;
    ENC_FAILS ("unknown mode 7");
    s_control (&m, 7);
    m.u.req_error.status = RX_OK;
    ENC_FAILS ("status 0 is not an error");
    s_control (&m, 7);
    m.u.req_error.message = (char *) "bad \xff";
    ENC_FAILS ("REQ_ERROR: message is not UTF-8");
    memset (&m, 0, sizeof m);
    m.type = 77;
    ENC_FAILS ("unknown type 77");

    /* encode_into: a buffer one byte short */
    s_control (&m, 4);
    size_t need = rx_ipc_encoded_size (&m, &err);
    uint8_t small[256];
    cr_assert_lt (need, sizeof small);
    cr_assert_eq (rx_ipc_encode_into (&m, small, need - 1, &len, &err), RX_ERANGE);
    cr_assert (strstr (err.msg, "needs"), "%s", err.msg);
    cr_assert_eq (rx_ipc_encode_into (&m, small, need, &len, &err), RX_OK);
    cr_assert_eq (len, need);
}

/* ------------------------------------------------------------ corpus */

static int s_for_each_file (const char *dir, void (*fn) (const char *path, const uint8_t *b, size_t n))
{
    DIR *d = opendir (dir);
    cr_assert_not_null (d, "cannot open %s", dir);
    struct dirent *e;
    int count = 0;
    while ((e = readdir (d))) {
        if (e->d_name[0] == '.' || strcmp (e->d_name, "README") == 0) continue;
        char *p = tu_path (dir, e->d_name);
        FILE *f = fopen (p, "rb");
        cr_assert_not_null (f, "%s", p);
        uint8_t *b = malloc (1 << 20);
        size_t n = fread (b, 1, 1 << 20, f);
        fclose (f);
        fn (p, b, n);
        free (b);
        free (p);
        count++;
    }
    closedir (d);
    return count;
}

static void s_replay_one (const char *path, const uint8_t *b, size_t n)
{
    struct rx_ipc_msg d;
    struct rx_err err = { 0 };
    int rc = rx_ipc_decode (b, n, &d, &err);
    if (rc == RX_OK) {
        size_t len2;
        uint8_t *re = s_enc (&d, &len2);
        cr_assert (len2 == n && memcmp (re, b, n) == 0, "%s decodes but re-encodes differently", path);
        free (re);
        rx_ipc_msg_free (&d);
    } else {
        s_refused (b, n, path);
    }
}

static void s_seed_one (const char *path, const uint8_t *b, size_t n)
{
    struct rx_ipc_msg d;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_ipc_decode (b, n, &d, &err), RX_OK, "seed %s: %s", path, err.msg);
    rx_ipc_msg_free (&d);
}

/* The committed seeds are valid messages of today's version (regenerate
 * with RX_IPC_WRITE_CORPUS=tests/fuzz/corpus/ipc after a format change). */
Test (ipc_msg, seeds)
{
    const char *out = getenv ("RX_IPC_WRITE_CORPUS");
    if (out && *out) {
        for (int i = 0; i < S_NSAMPLES; i++) {
            struct rx_ipc_msg m;
            s_sample (i, &m);
            size_t len;
            uint8_t *buf = s_enc (&m, &len);
            char name[64];
            snprintf (name, sizeof name, "%02d-%s", i, rx_ipc_type_name (m.type));
            char *p = tu_path (out, name);
            FILE *f = fopen (p, "wb");
            cr_assert_not_null (f, "%s", p);
            fwrite (buf, 1, len, f);
            fclose (f);
            free (p);
            free (buf);
        }
    }
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fuzz/corpus/ipc", tu_env ("RX_TOP_SRCDIR"));
    int n = s_for_each_file (dir, s_seed_one);
    cr_assert_geq (n, S_NSAMPLES, "only %d seeds in %s", n, dir);
}

/* Inputs the fuzzer once crashed on or that misled the decoder. */
Test (ipc_msg, fuzz_regressions)
{
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fuzz/regressions-ipc", tu_env ("RX_TOP_SRCDIR"));
    s_for_each_file (dir, s_replay_one);
}
