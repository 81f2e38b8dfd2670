/* core/sched_proc.c -- the scheduler process: a thin loop of IPC around
 * core/scheduler.c (see sched_proc.h for the contract with main).
 *
 * One iteration: take every pending control message (blocking only when the
 * scheduler has nothing to do, and then at most S_IDLE_WAIT_MS so that the
 * heartbeat and the periodic STATS keep their pace), run one scheduler step,
 * send its outputs as one TOKENS message, beat the heartbeat. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "host.h"
#include "ipc.h"
#include "ipc_msg.h"
#include "kvpool.h"
#include "log.h"
#include "sched_proc.h"
#include "scheduler.h"

#define S_IDLE_WAIT_MS 100   /* longest block while idle: the heartbeat's pace */
#define S_MAX_MSGS     256   /* messages taken per iteration before the next step */
#define S_STALL_WAIT_MS 10   /* block this long when a step found nothing to run */

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

static void s_send_stats (struct s_proc *p, uint64_t cookie)
{
    struct rx_sched_stats st;
    rx_sched_stats (p->sched, &st);
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_STATS;
    struct rx_ipc_stats *s = &m.u.stats;
    s->cookie = cookie;
    s->dp_rank = 0;
    s->running = st.running;
    s->queued = st.queued;
    s->kv_used = st.kv_used;
    s->kv_total = st.kv_total;
    s->steps = st.steps;
    s->prompt_tokens = st.prompt_tokens;
    s->gen_tokens = st.gen_tokens;
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
    s_send (p, p->to_main, "main", &m);
}

static void s_send_req_error (struct s_proc *p, uint64_t rid, int status, const char *msg)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_ERROR;
    m.u.req_error.rid = rid;
    m.u.req_error.status = status < 0 ? status : RX_EINTERNAL;
    m.u.req_error.message = (char *) msg;
    s_send (p, p->to_main, "main", &m);
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
        int rc = rx_sched_submit (p->sched, &m->u.req, &err);
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
        s_send (p, p->to_main, "main", &r);
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

/* One scheduler step; its outputs go to the detokenizer.  Returns 1 when a
 * batch ran or something was emitted. */
static int s_step (struct s_proc *p)
{
    struct rx_sched_out out;
    struct rx_err err = { 0 };
    int rc = rx_sched_step (p->sched, &out, &err);
    if (rc != RX_OK)
        rx_log (RX_LOG_ERROR, "scheduler: step failed, its requests are aborted: %s", err.msg);
    if (out.tokens.n) {
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_TOKENS;
        m.u.tokens = out.tokens;
        s_send (p, p->to_detok, "the detokenizer", &m);
    }
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

/* Everything up to the first STATS.  Returns 0 or 1 (exit status). */
static void s_progress_beat (void *hb)
{
    rx_heartbeat_beat (hb);
}

static int s_start (struct s_proc *p, const struct rx_sched_proc_opts *o)
{
    struct rx_err err = { 0 };
    if (!o || !o->run_dir) {
        rx_log (RX_LOG_ERROR, "scheduler: no run directory given");
        return 1;
    }
    if (!(p->ipc = rx_ipc_join (o->run_dir, &err))
        || !(p->in = rx_ipc_bind (p->ipc, RX_IPC_PULL, RX_SOCK_SCHED, &err))
        || !(p->to_detok = rx_ipc_connect (p->ipc, RX_IPC_PUSH, RX_SOCK_DETOK, &err))
        || !(p->to_main = rx_ipc_connect (p->ipc, RX_IPC_PUSH, RX_SOCK_MAIN, &err))
        || !(p->hb = rx_heartbeat_create (p->ipc, RX_HB_SCHED, &err))) {
        rx_log (RX_LOG_ERROR, "scheduler: %s", err.msg);
        return 1;
    }
    rx_heartbeat_set_state (p->hb, RX_HB_STARTING);
    rx_heartbeat_beat (p->hb);
    /* Plugins call host->progress inside long calls (after each layer of a
     * forward pass): a long prefill keeps the heartbeat fresh. */
    rx_host_set_progress_hook (s_progress_beat, p->hb);

    struct rx_engine_opts eo = { 0 };
    if (s_kv_bytes (p->boot->conf, &eo.kv_bytes, &err) != RX_OK
        || !(p->engine = rx_engine_new (p->boot, &eo, &err))
        || !(p->sched = rx_sched_new (p->boot, p->engine, NULL, &err))) {
        rx_log (RX_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    rx_heartbeat_beat (p->hb);
    p->n_vocab = (uint32_t) rx_engine_info (p->engine)->n_vocab;
    uint64_t bpt = rx_engine_info (p->engine)->kv_bytes_per_token;
    struct rx_sched_stats st;
    rx_sched_stats (p->sched, &st);
    rx_log (RX_LOG_INFO, "KV cache: %llu tokens (%.1f MiB, %llu B/token)",
            (unsigned long long) st.kv_total, (double) st.kv_total * (double) bpt / 1048576.0,
            (unsigned long long) bpt);
    rx_log (RX_LOG_INFO, "scheduler: %s; context %u, max running requests %u",
            rx_engine_describe (p->engine), st.context_len, st.max_running_requests);

    /* The first STATS tells main the scheduler is ready: the heartbeat
     * must say so before (main may answer /health at once). */
    rx_heartbeat_set_state (p->hb, RX_HB_IDLE);
    rx_heartbeat_beat (p->hb);
    s_send_stats (p, 0);
    if (p->lost) return 1;
    int ms = o->stats_interval_ms > 0 ? o->stats_interval_ms : 1000;
    p->stats_ns = (uint64_t) ms * 1000000ull;
    p->next_stats_ns = s_now_ns () + p->stats_ns;
    p->arrival_wait_ns = (uint64_t) (rx_conf_float (p->boot->conf, "scheduler", "arrival_wait", 0.005) * 1e9);
    return 0;
}

/* Take up to S_MAX_MSGS messages: the first waits wait_ms, the others
 * none -- or, with until_ns, every one waits until that time.  Returns 1
 * when the process must exit (a peer is gone), else 0. */
static int s_receive (struct s_proc *p, int wait_ms, uint64_t until_ns)
{
    struct rx_err err = { 0 };
    for (int k = 0; k < S_MAX_MSGS && !p->stop_now; k++) {
        int ms = k == 0 ? wait_ms : 0;
        if (until_ns) {
            uint64_t t = s_now_ns ();
            if (t >= until_ns) break;
            ms = (int) ((until_ns - t + 999999ull) / 1000000ull);
        }
        struct rx_ipc_msg m;
        int rc = rx_ipc_recv (p->in, &m, ms, &err);
        if (rc == RX_ETIMEDOUT) break;
        if (rc == RX_EFORMAT) {
            rx_log (RX_LOG_WARN, "scheduler: dropped a message from main: %s", err.msg);
            continue;
        }
        if (rc != RX_OK) {
            rx_log (RX_LOG_ERROR, "scheduler: cannot receive: %s", err.msg);
            return 1;
        }
        s_handle (p, &m);
        if (p->lost) return 1;
    }
    return 0;
}

/* The serving loop; returns when a SHUTDOWN says so (0) or a peer is gone (1). */
static int s_loop (struct s_proc *p)
{
    int stalled = 0;   /* the last step had work but ran nothing */
    for (;;) {
        uint64_t now = s_now_ns ();
        int wait = 0;
        if (rx_sched_idle (p->sched) || stalled) {
            /* Never spin: a scheduler that cannot run anything now waits
             * for a message (an abort frees room) a little. */
            int most = stalled ? S_STALL_WAIT_MS : S_IDLE_WAIT_MS;
            uint64_t left = p->next_stats_ns > now ? (p->next_stats_ns - now) / 1000000ull : 0;
            wait = left < (uint64_t) most ? (int) left : most;
        }
        int was_idle = rx_sched_idle (p->sched);
        if (s_receive (p, wait, 0)) return 1;
        if (p->stop_now) return 0;
        /* Work arrived at an idle scheduler: give the rest of a burst
         * [scheduler] arrival_wait to arrive, so one prefill batch takes it
         * (else the first request is prefilled alone and the others wait a
         * whole step for theirs). */
        if (was_idle && p->arrival_wait_ns && !rx_sched_idle (p->sched)) {
            if (s_receive (p, -1, s_now_ns () + p->arrival_wait_ns)) return 1;
            if (p->stop_now) return 0;
        }

        now = s_now_ns ();
        if (p->draining && p->drain_deadline_ns && now >= p->drain_deadline_ns
            && !rx_sched_idle (p->sched)) {
            int n = rx_sched_abort_all (p->sched);
            rx_log (RX_LOG_WARN, "scheduler: drain deadline passed; %d requests aborted", n);
        }
        /* BUSY is set before a step, so that a long prefill reads busy
         * (with an old beat), never idle. */
        if (!rx_sched_idle (p->sched)) {
            rx_heartbeat_set_state (p->hb, p->draining ? RX_HB_DRAINING : RX_HB_BUSY);
            rx_heartbeat_beat (p->hb);
            stalled = !s_step (p);
        } else
            stalled = 0;
        if (p->lost) return 1;
        if (p->draining && rx_sched_idle (p->sched)) return 0;

        rx_heartbeat_set_state (p->hb, p->draining ? RX_HB_DRAINING
                                       : rx_sched_idle (p->sched) ? RX_HB_IDLE : RX_HB_BUSY);
        rx_heartbeat_beat (p->hb);
        now = s_now_ns ();
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
         * then SHUTDOWN follows them on the same socket (ordered). */
        int n = rx_sched_abort_all (p.sched);
        if (n) rx_log (RX_LOG_INFO, "scheduler: %d requests aborted by the shutdown", n);
        if (!rx_sched_idle (p.sched)) s_step (&p);
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_SHUTDOWN;
        m.u.shutdown.mode = RX_IPC_SHUTDOWN_NOW;
        if (!p.lost) s_send (&p, p.to_detok, "the detokenizer", &m);
        if (p.lost) status = 1;
        else rx_log (RX_LOG_INFO, "scheduler: stopped");
    }
    if (p.hb) {
        rx_heartbeat_set_state (p.hb, RX_HB_STOPPED);
        rx_heartbeat_beat (p.hb);
    }
    rx_sched_destroy (&p.sched);
    rx_engine_destroy (&p.engine);
    rx_host_set_progress_hook (NULL, NULL);
    rx_heartbeat_close (&p.hb);
    /* Closes the sockets: queued messages get the linger time to leave. */
    rx_ipc_destroy (&p.ipc);
    return status;
}
