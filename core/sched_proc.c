/* core/sched_proc.c -- the scheduler process: a thin loop of IPC around
 * core/scheduler.c (see sched_proc.h for the contract with main).
 *
 * One iteration: rank 0 takes every pending control message as raw bytes
 * (blocking only when the scheduler has nothing to do, and then at most
 * S_IDLE_WAIT_MS so that the heartbeat and the periodic STATS keep their
 * pace); the batch of messages is broadcast to the other ranks of the TP
 * group (none with tp_size 1); every rank decodes and applies it, runs one
 * scheduler step; rank 0 sends its outputs as one TOKENS message and beats
 * the heartbeat.  Every rank sees the same messages in the same order and
 * the scheduler is deterministic, so every rank forms the same batch. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "expert_record.h"
#include "host.h"
#include "ipc.h"
#include "ipc_msg.h"
#include "kvpool.h"
#include "log.h"
#include "sched_proc.h"
#include "scheduler.h"
#include "zgroup.h"

#define S_IDLE_WAIT_MS 100   /* longest block while idle: the heartbeat's pace */
#define S_MAX_MSGS     256   /* messages taken per iteration before the next step */
#define S_STALL_WAIT_MS 10   /* block this long when a step found nothing to run */
#define S_SYNC_MAGIC    0x434e5953u  /* "SYNC": the per-iteration broadcast */
#define S_ATTN_WAIT_MS  10           /* the idle wait of a DP-attention rank: the group steps together */
#define RX_DP_ATTN_MAX  256          /* most ranks of a DP-attention group ([parallel] tp_size cap) */
#define S_SYNC_ABORT_ALL 1u          /* flag: the drain deadline passed on rank 0 */

/* A request known to this rank, until all its siblings finished. */
struct s_live {
    uint64_t rid;
    int32_t left;               /* siblings not yet finished */
};

struct s_proc {
    struct rx_boot *boot;
    rx_ipc_t *ipc;
    rx_ipc_sock_t *in, *to_detok, *to_main;
    rx_heartbeat_t *hb;
    rx_engine_t *engine;
    rx_sched_t *sched;
    uint32_t n_vocab;
    uint64_t stats_ns;          /* periodic STATS interval */
    uint64_t next_stats_ns;
    uint64_t arrival_wait_ns;   /* [scheduler] arrival_wait */
    int draining;               /* a SHUTDOWN DRAIN came */
    uint64_t drain_deadline_ns; /* 0 = none */
    int stop_now;               /* a SHUTDOWN NOW came (or the drain is over) */
    int lost;                   /* a peer is gone: exit 1 */
    /* ranks */
    struct rx_sched_proc_opts o;
    rx_zgroup_t *zg;            /* the TP group's control group (tp_size > 1) */
    rx_zgroup_t *ag;            /* the DP-attention group's control group (dp_attention) */
    uint8_t *pend;              /* rank 0: this iteration's raw messages, each u32 length + bytes */
    size_t pend_len, pend_cap;
    uint32_t n_pend;
    uint32_t sync_flags;        /* rank 0: S_SYNC_* for this iteration */
    uint64_t n_iter;            /* iterations that stepped (the determinism check's clock) */
    uint64_t sync_ns, step_ns;  /* time in s_sync / s_step over decode steps (tp_size > 1) */
    int last_kind;              /* RX_SCHED_* of the last step */
    uint64_t attn_iter;         /* DP attention: iterations of the group (the same on every rank) */
    uint64_t n_timed;
    struct s_live *live;        /* requests in flight (REQ_DONE, the test hook) */
    size_t n_live, cap_live;
    uint64_t *done;             /* rids finished by the last step */
    size_t n_done, cap_done;
    int diverge_rank;           /* RADIX_TEST_DIVERGE=<rank>:<step> (tests only); -1 = none */
    uint64_t diverge_step;
    const char *up_name;        /* "main" or "the DP controller", for log lines */
};

static uint64_t s_now_ns (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

/* One message to a peer.  A timeout or socket error means the peer is gone
 * (main exited, the detokenizer died): logged, and the loop ends with exit
 * status 1.  A message that cannot be encoded is a bug of ours: logged, and
 * the loop goes on. */
static int s_send (struct s_proc *p, rx_ipc_sock_t *sock, const char *peer,
                   const struct rx_ipc_msg *m)
{
    if (!sock) return RX_OK;   /* ranks other than 0 answer nobody */
    struct rx_err err = { 0 };
    int rc = rx_ipc_send (sock, m, RX_PROC_SEND_TIMEOUT_MS, &err);
    if (rc == RX_OK) return RX_OK;
    if (rc == RX_EINVAL) {
        rx_log (RX_LOG_ERROR, "scheduler: %s to %s not sent: %s", rx_ipc_type_name (m->type), peer,
                err.msg);
        return rc;
    }
    rx_log (RX_LOG_ERROR, "scheduler: cannot send %s to %s (gone?): %s",
            rx_ipc_type_name (m->type), peer, err.msg);
    p->lost = 1;
    return rc;
}

/* An MoE model's placement balancedness for main's /metrics (with every
 * STATS; nothing for a dense model). */
static void s_send_eplb_stats (struct s_proc *p)
{
    rx_eplb_rt_t *rt = rx_engine_eplb (p->engine);
    if (!rt || p->lost) return;
    double *b = malloc (RX_IPC_EPLB_MAX_LAYERS * sizeof *b);
    float *f = malloc (RX_IPC_EPLB_MAX_LAYERS * sizeof *f);
    int32_t n = b && f ? rx_eplb_rt_balancedness (rt, b, RX_IPC_EPLB_MAX_LAYERS) : 0;
    if (n > 0) {
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_EPLB_STATS;
        for (int32_t i = 0; i < n; i++) f[i] = (float) b[i];
        m.u.eplb_stats.dp_rank = (uint32_t) p->o.dp_rank;
        rx_eplb_rt_counters (rt, &m.u.eplb_stats.rebalanced, &m.u.eplb_stats.skipped);
        m.u.eplb_stats.n = (uint32_t) n;
        m.u.eplb_stats.balancedness = f;
        s_send (p, p->to_main, p->up_name, &m);
    }
    free (b);
    free (f);
}

static void s_send_stats (struct s_proc *p, uint64_t cookie)
{
    if (!p->to_main) return;
    struct rx_sched_stats st;
    rx_sched_stats (p->sched, &st);
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_STATS;
    struct rx_ipc_stats *s = &m.u.stats;
    s->cookie = cookie;
    s->dp_rank = (uint32_t) p->o.dp_rank;
    s->running = st.running;
    s->queued = st.queued;
    s->kv_used = st.kv_used;
    s->kv_total = st.kv_total;
    s->steps = st.steps;
    s->prompt_tokens = st.prompt_tokens;
    s->gen_tokens = st.gen_tokens;
    s->cand_rows = st.cand_rows;
    s->cand_full = st.cand_full;
    s->cand_tail = st.cand_tail;
    s->cand_lp_rows = st.cand_lp_rows;
    s->cand_lp_full = st.cand_lp_full;
    s->cache_hit_rate = (float) st.cache_hit_rate;
    s->prompt_tps = (float) st.prompt_tps;
    s->gen_tps = (float) st.gen_tps;
    s->cached_tokens = st.cached_tokens;
    s->cache_tokens = st.cache_tokens;
    s->finished = st.finished;
    s->retractions = st.retractions;
    s->max_running_requests = st.max_running_requests;
    s->context_len = st.context_len;
    s->n_vocab = p->n_vocab;
    s->new_token_ratio = (float) st.new_token_ratio;
    s_send (p, p->to_main, p->up_name, &m);
    s_send_eplb_stats (p);
}

static void s_send_req_error (struct s_proc *p, uint64_t rid, int status, const char *msg)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_ERROR;
    m.u.req_error.rid = rid;
    m.u.req_error.status = status < 0 ? status : RX_EINTERNAL;
    m.u.req_error.message = (char *) msg;
    s_send (p, p->to_main, p->up_name, &m);
}

/* ---- requests in flight (REQ_DONE for the DP controller; the test hook) */

static int s_live_add (struct s_proc *p, uint64_t rid, int32_t n)
{
    if (p->n_live == p->cap_live) {
        size_t cap = p->cap_live ? 2 * p->cap_live : 64;
        struct s_live *v = realloc (p->live, cap * sizeof *v);
        if (!v) return RX_ENOMEM;
        p->live = v;
        p->cap_live = cap;
    }
    p->live[p->n_live++] = (struct s_live) { rid, n };
    return RX_OK;
}

/* One sibling of rid finished; when it was the last, rid joins p->done. */
static void s_live_finish (struct s_proc *p, uint64_t rid)
{
    for (size_t i = 0; i < p->n_live; i++) {
        if (p->live[i].rid != rid) continue;
        if (--p->live[i].left > 0) return;
        p->live[i] = p->live[--p->n_live];
        if (p->n_done == p->cap_done) {
            size_t cap = p->cap_done ? 2 * p->cap_done : 64;
            uint64_t *v = realloc (p->done, cap * sizeof *v);
            if (!v) return;   /* the DP controller's load count drifts by one; logged nowhere */
            p->done = v;
            p->cap_done = cap;
        }
        p->done[p->n_done++] = rid;
        return;
    }
}

/* Handle one message from main; takes m's contents (frees them). */
static void s_handle (struct s_proc *p, struct rx_ipc_msg *m)
{
    struct rx_err err = { 0 };
    switch (m->type) {
    case RX_IPC_REQ_NEW: {
        uint64_t rid = m->u.req.rid;
        if (p->draining) {
            s_send_req_error (p, rid, RX_EAGAIN, "server is shutting down");
            break;
        }
        /* On success the scheduler takes the request's arrays and leaves
         * m->u.req empty, so the free below releases nothing of them. */
        int32_t n = m->u.req.sp.n > 0 ? m->u.req.sp.n : 1;
        int rc = rx_sched_submit (p->sched, &m->u.req, &err);
        if (rc == RX_OK && s_live_add (p, rid, n) != RX_OK) {
            rx_log (RX_LOG_ERROR, "scheduler: out of memory tracking request %llu", (unsigned long long) rid);
            p->lost = 1;
        }
        if (rc != RX_OK) {
            rx_log (RX_LOG_DEBUG, "scheduler: request %llu refused: %s", (unsigned long long) rid,
                    err.msg);
            s_send_req_error (p, rid, rc, err.msg);
        }
        break;
    }
    case RX_IPC_REQ_ABORT:
        for (uint32_t i = 0; i < m->u.abort.n; i++) {
            int n = rx_sched_abort (p->sched, m->u.abort.rids[i]);
            rx_log (RX_LOG_DEBUG, "scheduler: abort %llu: %d running or waiting",
                    (unsigned long long) m->u.abort.rids[i], n);
        }
        break;
    case RX_IPC_REQ_ABORT_SEQ:
        /* One sibling each; its ABORT finish (next step) goes to the
         * detokenizer and counts for REQ_DONE like any finish.  Every rank
         * applies it here, in the broadcast's order, like REQ_ABORT. */
        for (uint32_t i = 0; i < m->u.abort_seq.n; i++) {
            const struct rx_ipc_seq_ref *q = &m->u.abort_seq.seqs[i];
            int n = rx_sched_abort_seq (p->sched, q->rid, q->index);
            rx_log (RX_LOG_DEBUG, "scheduler: abort %llu/%u: %s", (unsigned long long) q->rid, q->index,
                    n ? "stopped" : "not running or waiting");
        }
        break;
    case RX_IPC_FLUSH_CACHE: {
        size_t freed = 0;
        char msg[128];
        int rc = rx_sched_flush_cache (p->sched, &freed, &err);
        if (rc == RX_OK) snprintf (msg, sizeof msg, "cache flushed (%zu tokens)", freed);
        struct rx_ipc_msg r;
        memset (&r, 0, sizeof r);
        r.type = RX_IPC_FLUSH_CACHE_REPLY;
        r.u.flush_reply.cookie = m->u.cookie;
        r.u.flush_reply.status = rc;
        r.u.flush_reply.message = rc == RX_OK ? msg : err.msg;
        rx_log (RX_LOG_INFO, "scheduler: %s", r.u.flush_reply.message);
        s_send (p, p->to_main, p->up_name, &r);
        break;
    }
    case RX_IPC_EPLB: {
        /* Expert distribution record control (core/expert_record.h). */
        char msg[768];
        int rc = rx_eplb_rt_control (rx_engine_eplb (p->engine), m->u.eplb.op, msg, sizeof msg, &err);
        struct rx_ipc_msg r;
        memset (&r, 0, sizeof r);
        r.type = RX_IPC_EPLB_REPLY;
        r.u.flush_reply.cookie = m->u.eplb.cookie;
        r.u.flush_reply.status = rc;
        r.u.flush_reply.message = rc == RX_OK ? msg : err.msg;
        rx_log (RX_LOG_INFO, "scheduler: eplb: %s", r.u.flush_reply.message);
        s_send (p, p->to_main, p->up_name, &r);
        break;
    }
    case RX_IPC_GET_STATS:
        s_send_stats (p, m->u.cookie);
        break;
    case RX_IPC_SHUTDOWN:
        if (m->u.shutdown.mode == RX_IPC_SHUTDOWN_NOW) {
            rx_log (RX_LOG_INFO, "scheduler: shutdown now");
            p->stop_now = 1;
            break;
        }
        if (!p->draining)
            rx_log (RX_LOG_INFO, "scheduler: draining (deadline %u ms, 0 = none)",
                    m->u.shutdown.deadline_ms);
        p->draining = 1;
        if (m->u.shutdown.deadline_ms) {
            uint64_t d = s_now_ns () + (uint64_t) m->u.shutdown.deadline_ms * 1000000ull;
            if (!p->drain_deadline_ns || d < p->drain_deadline_ns) p->drain_deadline_ns = d;
        }
        break;
    default:
        rx_log (RX_LOG_WARN, "scheduler: unexpected %s message from main; ignored",
                rx_ipc_type_name (m->type));
        break;
    }
    rx_ipc_msg_free (m);
}

/* [parallel] check_determinism, as the scheduler's batch hook: every rank
 * all-gathers the hash of the batch it is about to run; any difference
 * fails the step on every rank before the model's collectives see
 * mismatched shapes, and stops the daemon with both hashes. */
static int s_check_batch (void *ud, uint64_t step, uint64_t h, struct rx_err *err)
{
    struct s_proc *p = ud;
    uint64_t *all = NULL;
    int rc = rx_zgroup_allgather (p->zg, &h, sizeof h, (void **) &all, NULL, -1, err);
    if (rc != RX_OK) return rc;
    for (int r = 1; r < p->o.tp_size && rc == RX_OK; r++)
        if (all[r] != all[0])
            rc = rx_err_set (err, RX_EINTERNAL,
                             "ranks diverged at step %llu: rank %d's batch hash %016llx differs from rank 0's "
                             "%016llx ([parallel] check_determinism)",
                             (unsigned long long) step, r, (unsigned long long) all[r],
                             (unsigned long long) all[0]);
    free (all);
    return rc;
}

/* One scheduler step; rank 0 sends its outputs to the detokenizer.  Returns
 * 1 when a batch ran or something was emitted. */
static int s_step (struct s_proc *p)
{
    struct rx_sched_out out;
    struct rx_err err = { 0 };
    p->n_iter++;
    if (p->diverge_rank == p->o.tp_rank && p->n_iter == p->diverge_step && p->n_live) {
        /* Test hook: this rank alone drops a request, as a scheduler bug would. */
        rx_log (RX_LOG_WARN, "scheduler: RADIX_TEST_DIVERGE: rank %d drops request %llu at step %llu",
                p->o.tp_rank, (unsigned long long) p->live[0].rid, (unsigned long long) p->n_iter);
        rx_sched_abort (p->sched, p->live[0].rid);
    }
    int rc = rx_sched_step (p->sched, &out, &err);
    if (rc != RX_OK && (p->zg || p->ag)) {
        /* A failed step of a group (a collective timed out, a peer is
         * gone) cannot be retried in step with the others: stop now, and
         * tell the other ranks why so they do not wait out their timeout. */
        rx_log (RX_LOG_ERROR, "scheduler: step failed on rank %d of %d; stopping: %s",
                p->ag ? p->o.attn_rank : p->o.tp_rank, p->ag ? p->o.attn_size : p->o.tp_size, err.msg);
        rx_zgroup_abort (p->zg ? p->zg : p->ag, &err);
        p->lost = 1;
    } else if (rc != RX_OK)
        rx_log (RX_LOG_ERROR, "scheduler: step failed, its requests are aborted: %s", err.msg);
    p->n_done = 0;
    for (uint32_t i = 0; i < out.tokens.n; i++)
        if (out.tokens.out[i].finish != RX_FINISH_NONE) s_live_finish (p, out.tokens.out[i].rid);
    if (out.tokens.n) {
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_TOKENS;
        m.u.tokens = out.tokens;
        s_send (p, p->to_detok, "the detokenizer", &m);
    }
    if (p->n_done && p->o.dp_size > 1) {
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_REQ_DONE;
        m.u.done.n = (uint32_t) p->n_done;
        m.u.done.rids = p->done;
        s_send (p, p->to_main, p->up_name, &m);
    }
    p->last_kind = out.kind;
    return out.kind != RX_SCHED_IDLE || out.tokens.n;
}

/* [cache] kv_memory in bytes.  rx_sched_kv_slots does the parsing (a size,
 * or a fraction of MemAvailable) but answers in tokens of a known size;
 * the engine learns the model's bytes per token only while it starts, so
 * ask for "tokens" of 1 KiB and scale back (exact to 1 KiB, and reaching
 * 2 TiB within the parser's 2^31 cap), and for specs under 1 KiB in bytes
 * (the engine then refuses them with its own line). */
static int s_kv_bytes (const rx_conf_t *conf, uint64_t *bytes, struct rx_err *err)
{
    uint32_t n;
    struct rx_err e1 = { 0 };
    if (rx_sched_kv_slots (conf, 1024, NULL, &n, &e1) == RX_OK) {
        *bytes = (uint64_t) n * 1024;
        return RX_OK;
    }
    int rc = rx_sched_kv_slots (conf, 1, NULL, &n, err);
    if (rc == RX_OK) *bytes = n;
    return rc;
}

/* Is [cache] kv_memory a share of free memory ("0.8", "80%") rather than
 * a size?  A share is split between the ranks of one host, a size is each
 * rank's own (docs/parallel.md). */
static int s_kv_is_share (const rx_conf_t *conf)
{
    const char *v = rx_conf_str (conf, "cache", "kv_memory", "0.8");
    if (!v) return 1;
    char *end;
    double x = strtod (v, &end);
    return end != v && (*end == '%' || (*end == '\0' && x <= 1.0));
}

static void s_progress_beat (void *hb)
{
    rx_heartbeat_beat (hb);
}

/* Everything up to the first STATS.  Returns 0 or 1 (exit status). */
static int s_start (struct s_proc *p, const struct rx_sched_proc_opts *o)
{
    struct rx_err err = { 0 };
    if (!o || !o->run_dir) {
        rx_log (RX_LOG_ERROR, "scheduler: no run directory given");
        return 1;
    }
    p->o = *o;
    if (p->o.tp_size < 1) p->o.tp_size = 1;
    if (p->o.dp_size < 1) p->o.dp_size = 1;
    if (p->o.comm_timeout_s <= 0) p->o.comm_timeout_s = 60;
    p->up_name = p->o.dp_size > 1 ? "the DP controller" : "main";
    p->diverge_rank = -1;
    const char *dv = getenv ("RADIX_TEST_DIVERGE");
    unsigned long long dstep;
    int drank;
    if (dv && sscanf (dv, "%d:%llu", &drank, &dstep) == 2) {
        p->diverge_rank = drank;
        p->diverge_step = dstep;
    }
    if (p->o.tp_rank == 0) {
        if (!(p->ipc = rx_ipc_join (o->run_dir, &err))
            || !(p->in = rx_ipc_bind (p->ipc, RX_IPC_PULL, o->in_sock ? o->in_sock : RX_SOCK_SCHED, &err))
            || !(p->to_detok = rx_ipc_connect (p->ipc, RX_IPC_PUSH, RX_SOCK_DETOK, &err))
            || !(p->to_main = rx_ipc_connect (p->ipc, RX_IPC_PUSH, o->up_sock ? o->up_sock : RX_SOCK_MAIN, &err))
            || !(p->hb = rx_heartbeat_create (p->ipc, o->hb_name ? o->hb_name : RX_HB_SCHED, &err))) {
            rx_log (RX_LOG_ERROR, "scheduler: %s", err.msg);
            return 1;
        }
        rx_heartbeat_set_state (p->hb, RX_HB_STARTING);
        rx_heartbeat_beat (p->hb);
        /* Plugins call host->progress inside long calls (after each layer
         * of a forward pass): a long prefill keeps the heartbeat fresh. */
        rx_host_set_progress_hook (s_progress_beat, p->hb);
    }
    if (p->o.dp_attention) {
        if (!o->ctl_endpoint || !o->comm_group || !o->comm_bootstrap || p->o.tp_size != 1
            || p->o.attn_size < 2) {
            rx_log (RX_LOG_ERROR, "scheduler: DP-attention rank %d of %d started without its group",
                    p->o.attn_rank, p->o.attn_size);
            return 1;
        }
        if (!(p->ag = rx_zgroup_new (o->ctl_endpoint, p->o.attn_rank, p->o.attn_size, p->o.comm_timeout_s,
                                     &err))) {
            rx_log (RX_LOG_ERROR, "scheduler: control group %s: %s", o->ctl_endpoint, err.msg);
            return 1;
        }
    } else if (p->o.tp_size > 1) {
        if (!o->ctl_endpoint || !o->comm_group || !o->comm_bootstrap) {
            rx_log (RX_LOG_ERROR, "scheduler: rank %d of %d started without its group's endpoints",
                    p->o.tp_rank, p->o.tp_size);
            return 1;
        }
        if (!(p->zg = rx_zgroup_new (o->ctl_endpoint, p->o.tp_rank, p->o.tp_size, p->o.comm_timeout_s, &err))) {
            rx_log (RX_LOG_ERROR, "scheduler: control group %s: %s", o->ctl_endpoint, err.msg);
            return 1;
        }
    }

    struct rx_engine_opts eo = { 0 };
    if (s_kv_bytes (p->boot->conf, &eo.kv_bytes, &err) != RX_OK) {
        rx_log (RX_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    int local = (int) rx_conf_int (p->boot->conf, "parallel", "nnodes", 1);
    local = p->o.tp_size * p->o.dp_size / (local > 0 ? local : 1);
    if (local > 1 && s_kv_is_share (p->boot->conf)) eo.kv_bytes /= (uint64_t) local;
    eo.tp_rank = p->o.dp_attention ? p->o.attn_rank : p->o.tp_rank;
    eo.tp_size = p->o.dp_attention ? p->o.attn_size : p->o.tp_size;
    eo.dp_attention = p->o.dp_attention;
    eo.comm_group = o->comm_group;
    eo.comm_bootstrap = o->comm_bootstrap;
    eo.comm_timeout_s = p->o.comm_timeout_s;
    eo.dp_rank = p->o.dp_attention ? 0 : p->o.dp_rank;   /* [kernels] device = auto */
    eo.local_ranks = local;                              /* a kv_memory share on a device */
    if (!rx_engine_kv_share (rx_conf_str (p->boot->conf, "cache", "kv_memory", "0.8"), &eo.kv_share))
        eo.kv_share = 0;
    if (!(p->engine = rx_engine_new (p->boot, &eo, &err))
        || !(p->sched = rx_sched_new (p->boot, p->engine, NULL, &err))) {
        rx_log (RX_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    if (p->zg && p->o.check_determinism) rx_sched_set_batch_hook (p->sched, s_check_batch, p);
    if (p->hb) rx_heartbeat_beat (p->hb);
    p->n_vocab = (uint32_t) rx_engine_info (p->engine)->n_vocab;
    uint64_t bpt = rx_engine_info (p->engine)->kv_bytes_per_token;
    struct rx_sched_stats st;
    rx_sched_stats (p->sched, &st);
    rx_log (RX_LOG_INFO, "KV cache: %llu tokens (%.1f MiB, %llu B/token)",
            (unsigned long long) st.kv_total, (double) st.kv_total * (double) bpt / 1048576.0,
            (unsigned long long) bpt);
    rx_log (RX_LOG_INFO, "scheduler: %s; context %u, max running requests %u",
            rx_engine_describe (p->engine), st.context_len, st.max_running_requests);
    int ms = o->stats_interval_ms > 0 ? o->stats_interval_ms : 1000;
    p->stats_ns = (uint64_t) ms * 1000000ull;
    p->next_stats_ns = s_now_ns () + p->stats_ns;
    p->arrival_wait_ns = (uint64_t) (rx_conf_float (p->boot->conf, "scheduler", "arrival_wait", 0.005) * 1e9);
    if (p->o.tp_rank != 0) return 0;

    /* The first STATS tells main the scheduler is ready: the heartbeat
     * must say so before (main may answer /health at once). */
    rx_heartbeat_set_state (p->hb, RX_HB_IDLE);
    rx_heartbeat_beat (p->hb);
    s_send_stats (p, 0);
    return p->lost ? 1 : 0;
}

/* Rank 0: take up to S_MAX_MSGS raw messages into p->pend: the first waits
 * wait_ms, the others none -- or, with until_ns, every one waits until that
 * time.  Returns 1 when the process must exit (the socket broke), else 0. */
static int s_gather (struct s_proc *p, int wait_ms, uint64_t until_ns)
{
    struct rx_err err = { 0 };
    for (int k = 0; k < S_MAX_MSGS; k++) {
        int ms = k == 0 ? wait_ms : 0;
        if (until_ns) {
            uint64_t t = s_now_ns ();
            if (t >= until_ns) break;
            ms = (int) ((until_ns - t + 999999ull) / 1000000ull);
        }
        void *buf = NULL;
        size_t n = 0;
        int rc = rx_ipc_recv_raw (p->in, &buf, &n, ms, &err);
        if (rc == RX_ETIMEDOUT) break;
        if (rc != RX_OK) {
            rx_log (RX_LOG_ERROR, "scheduler: cannot receive: %s", err.msg);
            return 1;
        }
        if (p->pend_len + 4 + n > p->pend_cap) {
            size_t cap = p->pend_cap ? p->pend_cap : 4096;
            while (cap < p->pend_len + 4 + n) cap *= 2;
            uint8_t *v = realloc (p->pend, cap);
            if (!v) {
                free (buf);
                rx_log (RX_LOG_ERROR, "scheduler: out of memory receiving a %zu-byte message", n);
                return 1;
            }
            p->pend = v;
            p->pend_cap = cap;
        }
        uint32_t len = (uint32_t) n;
        memcpy (p->pend + p->pend_len, &len, 4);
        memcpy (p->pend + p->pend_len + 4, buf, n);
        p->pend_len += 4 + n;
        p->n_pend++;
        free (buf);
    }
    return 0;
}

/* Every rank: decode and apply one iteration's messages (header: magic,
 * flags, count; then count x (u32 length, message)). */
static void s_apply (struct s_proc *p, const uint8_t *b, size_t n)
{
    uint32_t hdr[3];
    if (n < sizeof hdr) {
        rx_log (RX_LOG_ERROR, "scheduler: short step broadcast (%zu bytes)", n);
        p->lost = 1;
        return;
    }
    memcpy (hdr, b, sizeof hdr);
    if (hdr[0] != S_SYNC_MAGIC) {
        rx_log (RX_LOG_ERROR, "scheduler: bad step broadcast (magic %08x)", hdr[0]);
        p->lost = 1;
        return;
    }
    size_t off = sizeof hdr;
    for (uint32_t i = 0; i < hdr[2] && !p->stop_now && !p->lost; i++) {
        uint32_t len;
        if (n - off < 4 || (memcpy (&len, b + off, 4), n - off - 4 < len)) {
            rx_log (RX_LOG_ERROR, "scheduler: truncated step broadcast");
            p->lost = 1;
            return;
        }
        struct rx_ipc_msg m;
        struct rx_err err = { 0 };
        if (rx_ipc_decode (b + off + 4, len, &m, &err) != RX_OK)
            rx_log (RX_LOG_WARN, "scheduler: dropped a message from %s: %s", p->up_name, err.msg);
        else
            s_handle (p, &m);
        off += 4 + (size_t) len;
    }
    if ((hdr[1] & S_SYNC_ABORT_ALL) && !rx_sched_idle (p->sched)) {
        int k = rx_sched_abort_all (p->sched);
        rx_log (RX_LOG_WARN, "scheduler: drain deadline passed; %d requests aborted", k);
    }
}

/* The iteration's messages from rank 0 to every rank, then applied.
 * Returns 1 when the process must exit. */
static int s_sync (struct s_proc *p)
{
    uint32_t hdr[3] = { S_SYNC_MAGIC, p->sync_flags, p->n_pend };
    if (p->o.tp_rank == 0) {
        if (p->pend_len + sizeof hdr > p->pend_cap) {
            uint8_t *v = realloc (p->pend, p->pend_len + sizeof hdr);
            if (!v) return 1;
            p->pend = v;
            p->pend_cap = p->pend_len + sizeof hdr;
        }
        memmove (p->pend + sizeof hdr, p->pend, p->pend_len);
        memcpy (p->pend, hdr, sizeof hdr);
        p->pend_len += sizeof hdr;
    }
    const uint8_t *b = p->pend;
    size_t n = p->pend_len;
    void *got = NULL;
    if (p->zg) {
        struct rx_err err = { 0 };
        /* Rank 0 never waits here; the others wait for rank 0's next
         * iteration: at most a step plus S_IDLE_WAIT_MS, far below the
         * timeout unless rank 0 is gone or stuck. */
        if (rx_zgroup_bcast (p->zg, 0, b, n, p->o.tp_rank ? &got : NULL, &n, -1, &err) != RX_OK) {
            rx_log (RX_LOG_ERROR, "scheduler: lost the TP group (rank %d of %d): %s", p->o.tp_rank,
                    p->o.tp_size, err.msg);
            return 1;
        }
        if (p->o.tp_rank) b = got;
    }
    s_apply (p, b, n);
    free (got);
    p->pend_len = 0;
    p->n_pend = 0;
    p->sync_flags = 0;
    return p->lost;
}

/* DP attention: one forward pass with no tokens, so that the model's
 * collectives of a step where other ranks have work pair up; all_decode:
 * the group's flag of this iteration (the model sees it as the busy ranks'
 * models do). */
static void s_idle_forward (struct s_proc *p, int all_decode)
{
    struct rx_err err = { 0 };
    if (rx_engine_idle_group (p->engine, all_decode, &err) == RX_OK) return;
    rx_log (RX_LOG_ERROR, "scheduler: idle forward failed on rank %d of %d; stopping: %s", p->o.attn_rank,
            p->o.attn_size, err.msg);
    rx_zgroup_abort (p->ag, &err);
    p->lost = 1;
}

/* DP attention, once per iteration on every rank of the group: all-gather
 * who has work, who wants to stop and who will not prefill (bit 4:
 * !rx_sched_may_prefill -- idle ranks included); the AND of the last is
 * the step's "every rank decodes" flag (SGLang's all-reduce MIN, folded
 * into this exchange: no extra round trip), handed to the model as
 * rx_model_batch.all_decode.  When anyone has work, every rank
 * runs exactly one forward pass (its own batch, or an idle one).  A rank
 * leaves only when every rank wants to (a SHUTDOWN reaches the ranks at
 * different times, and a rank that left would hang the others' forward
 * passes).  Returns 0 or 1 (a step ran here; *stalled: it ran nothing), 2
 * when the whole group stops now, -1 when the group is lost. */
static int s_attn_step (struct s_proc *p, int *stalled)
{
    struct rx_err err = { 0 };
    int idle = rx_sched_idle (p->sched);
    uint8_t busy = (uint8_t) ((idle ? 0 : 1) | ((p->stop_now || p->draining) && idle ? 2 : 0)
                              | (rx_sched_may_prefill (p->sched) ? 0 : 4)), *all = NULL;
    size_t lens[RX_DP_ATTN_MAX];
    if (rx_zgroup_allgather (p->ag, &busy, 1, (void **) &all, p->o.attn_size <= RX_DP_ATTN_MAX ? lens : NULL,
                             -1, &err) != RX_OK) {
        rx_log (RX_LOG_ERROR, "scheduler: lost the DP-attention group (rank %d of %d): %s", p->o.attn_rank,
                p->o.attn_size, err.msg);
        return -1;
    }
    int any = 0, stop = 1, all_decode = 1;
    for (int r = 0; r < p->o.attn_size; r++) {
        any |= all[r] & 1;
        stop &= (all[r] & 2) != 0;
        all_decode &= (all[r] & 4) != 0;
    }
    free (all);
    *stalled = 0;
    if (stop) return 2;
    p->attn_iter++;
    rx_sched_set_group_decode (p->sched, all_decode);
    if (busy & 1) {
        *stalled = !s_step (p);
        if (!p->lost && p->last_kind == RX_SCHED_IDLE) s_idle_forward (p, all_decode);
    } else if (any)
        s_idle_forward (p, all_decode);
    if (any)
        rx_log (RX_LOG_DEBUG, "scheduler: DP attention iteration %llu: all_decode %d (rank %d ran %s)",
                (unsigned long long) p->attn_iter, all_decode, p->o.attn_rank,
                !(busy & 1) || p->last_kind == RX_SCHED_IDLE ? "idle"
                : p->last_kind == RX_SCHED_PREFILL ? "prefill" : "decode");
    return p->lost ? -1 : busy & 1;
}

/* The serving loop; returns when a SHUTDOWN says so (0) or a peer is gone (1). */
static int s_loop (struct s_proc *p)
{
    int stalled = 0;   /* the last step had work but ran nothing */
    for (;;) {
        if (p->o.tp_rank == 0) {
            uint64_t now = s_now_ns ();
            int wait = 0;
            if (rx_sched_idle (p->sched) || stalled) {
                /* Never spin: a scheduler that cannot run anything now
                 * waits for a message (an abort frees room) a little.  A
                 * DP-attention rank waits less: its group steps together. */
                int most = stalled ? S_STALL_WAIT_MS : p->ag ? S_ATTN_WAIT_MS : S_IDLE_WAIT_MS;
                uint64_t left = p->next_stats_ns > now ? (p->next_stats_ns - now) / 1000000ull : 0;
                wait = left < (uint64_t) most ? (int) left : most;
            }
            int was_idle = rx_sched_idle (p->sched);
            if (s_gather (p, wait, 0)) return 1;
            /* Work arrived at an idle scheduler: give the rest of a burst
             * [scheduler] arrival_wait to arrive, so one prefill batch
             * takes it (else the first request is prefilled alone and the
             * others wait a whole step for theirs). */
            if (was_idle && p->arrival_wait_ns && p->n_pend)
                if (s_gather (p, -1, s_now_ns () + p->arrival_wait_ns)) return 1;
            now = s_now_ns ();
            if (p->draining && p->drain_deadline_ns && now >= p->drain_deadline_ns)
                p->sync_flags |= S_SYNC_ABORT_ALL;
        }
        int busy = !rx_sched_idle (p->sched);   /* identical on every rank */
        uint64_t t0 = s_now_ns ();
        if (s_sync (p)) return 1;
        if (p->ag) {
            /* A SHUTDOWN NOW aborts this rank's requests at once; the rank
             * goes on stepping (idle) until the whole group stops. */
            if (p->stop_now && !rx_sched_idle (p->sched)) {
                int n = rx_sched_abort_all (p->sched);
                if (n) rx_log (RX_LOG_INFO, "scheduler: %d requests aborted by the shutdown", n);
            }
            if (!rx_sched_idle (p->sched) && p->hb) {
                rx_heartbeat_set_state (p->hb, p->draining ? RX_HB_DRAINING : RX_HB_BUSY);
                rx_heartbeat_beat (p->hb);
            }
            int rc = s_attn_step (p, &stalled);
            if (rc < 0) return 1;
            if (rc == 2) return 0;
            goto after_step;
        }
        if (p->stop_now) return 0;
        uint64_t t1 = s_now_ns ();

        /* BUSY is set before a step, so that a long prefill reads busy
         * (with an old beat), never idle. */
        if (!rx_sched_idle (p->sched)) {
            if (p->hb) {
                rx_heartbeat_set_state (p->hb, p->draining ? RX_HB_DRAINING : RX_HB_BUSY);
                rx_heartbeat_beat (p->hb);
            }
            stalled = !s_step (p);
            /* The step sync's cost, where it matters: between two decode
             * steps of a busy group (an idle rank 0 waits for messages on
             * purpose; a prefill step is long enough to hide anything). */
            if (busy && p->zg && p->last_kind == RX_SCHED_DECODE) {
                p->sync_ns += t1 - t0;
                p->step_ns += s_now_ns () - t1;
                p->n_timed++;
            }
        } else
            stalled = 0;
    after_step:
        if (p->lost) return 1;
        if (!p->ag && p->draining && rx_sched_idle (p->sched)) return 0;
        if (!p->hb) continue;

        rx_heartbeat_set_state (p->hb, p->draining ? RX_HB_DRAINING
                                       : rx_sched_idle (p->sched) ? RX_HB_IDLE : RX_HB_BUSY);
        rx_heartbeat_beat (p->hb);
        uint64_t now = s_now_ns ();
        if (now >= p->next_stats_ns) {
            s_send_stats (p, 0);
            if (p->lost) return 1;
            p->next_stats_ns = now + p->stats_ns;
        }
    }
}

int rx_sched_proc_main (struct rx_boot *boot, const struct rx_sched_proc_opts *o)
{
    struct s_proc p;
    memset (&p, 0, sizeof p);
    p.boot = boot;
    int status = s_start (&p, o);
    if (status == 0) status = s_loop (&p);
    if (status == 0) {
        /* Whatever is left is aborted; one step emits the ABORT finishes,
         * then SHUTDOWN follows them on the same socket (ordered).  Every
         * rank does the same, so the step's collectives still pair up. */
        int n = rx_sched_abort_all (p.sched);
        if (n && p.o.tp_rank == 0) rx_log (RX_LOG_INFO, "scheduler: %d requests aborted by the shutdown", n);
        if (!rx_sched_idle (p.sched)) s_step (&p);
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_SHUTDOWN;
        m.u.shutdown.mode = RX_IPC_SHUTDOWN_NOW;
        if (!p.lost) s_send (&p, p.to_detok, "the detokenizer", &m);
        /* The DP controller waits for every replica's last word. */
        if (!p.lost && p.o.dp_size > 1) s_send (&p, p.to_main, p.up_name, &m);
        if (p.lost) status = 1;
        else rx_log (RX_LOG_INFO, "scheduler: stopped");
    }
    if (p.n_timed) {
        double sync_us = (double) p.sync_ns / (double) p.n_timed / 1e3;
        double step_ms = (double) p.step_ns / (double) p.n_timed / 1e6;
        rx_log (RX_LOG_INFO, "scheduler: step sync %.1f us per decode step, %.2f%% of the mean step (%.2f ms, %llu steps)",
                sync_us, 100.0 * sync_us / 1e3 / (step_ms > 0 ? step_ms : 1e-9), step_ms,
                (unsigned long long) p.n_timed);
    }
    if (p.hb) {
        rx_heartbeat_set_state (p.hb, RX_HB_STOPPED);
        rx_heartbeat_beat (p.hb);
    }
    rx_sched_destroy (&p.sched);
    rx_engine_destroy (&p.engine);
    rx_zgroup_destroy (&p.zg);
    rx_zgroup_destroy (&p.ag);
    rx_host_set_progress_hook (NULL, NULL);
    rx_heartbeat_close (&p.hb);
    /* Closes the sockets: queued messages get the linger time to leave. */
    rx_ipc_destroy (&p.ipc);
    free (p.pend);
    free (p.live);
    free (p.done);
    return status;
}
