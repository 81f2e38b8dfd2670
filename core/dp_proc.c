/* core/dp_proc.c -- the DP controller process (contract in dp_proc.h).
 *
 * One loop polls main's socket and the replicas' socket.  State: the
 * route-policy handle (router/route_policy.h, the router's own wrapper, so
 * both daemons call policies the same way), a rid -> replica table of the
 * requests in flight (chained hash; the per-replica load is its count),
 * the latest periodic STATS of each replica, and the GET_STATS /
 * FLUSH_CACHE fan-ins still waiting for answers (short lists: main sends
 * a handful at a time). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp_proc.h"
#include "ipc.h"
#include "ipc_msg.h"
#include "loader.h"
#include "log.h"
#include "sched_proc.h"
/* The router's policy wrapper is compiled into libradixcore too (procs.am). */
#include "../router/route_policy.h"

#define S_TICK_MS     1000   /* the policy's tick (cache_aware eviction) */
#define S_MAX_MSGS    256    /* messages taken from one socket per wake-up */
#define S_TOKEN_BYTES 3      /* routing text: 7 bits per byte, ids below 2^21 */
#define S_STOP_SEND_MS 1000  /* SHUTDOWN to a replica that may have stopped */

/* A request in flight on a replica. */
struct s_rid {
    uint64_t rid;
    int rep;
    struct s_rid *next;
};

/* A fan-in of main's GET_STATS or FLUSH_CACHE. */
struct s_fan {
    int type;                  /* RX_IPC_GET_STATS or RX_IPC_FLUSH_CACHE */
    uint64_t main_cookie;
    uint64_t seq;              /* own cookies: seq * n + d + 1 */
    uint64_t deadline_ns;
    int n_got;
    unsigned char *got;        /* n */
    struct rx_ipc_stats *st;   /* GET_STATS: n replies */
    int status;                /* FLUSH_CACHE: RX_OK or the first failure */
    char message[256];
    struct s_fan *next;
};

struct s_proc {
    struct rx_boot *boot;
    int n;
    rx_ipc_t *ipc;
    rx_ipc_sock_t *from_main, *from_reps, *to_main;
    rx_ipc_sock_t **to_rep;     /* n */
    rx_rpolicy_t *rp;
    const char *policy;
    struct rx_route_worker *w;  /* n */
    char (*url)[24];            /* n worker names for the policy's logs */
    uint32_t *load;             /* n */
    uint64_t *dispatched;       /* n */
    uint64_t seed;
    struct s_rid **bucket;      /* power of two */
    size_t n_bucket, n_rid;
    struct rx_ipc_stats *latest;  /* n */
    unsigned char *have;        /* n: latest[d] holds a periodic STATS */
    int ready;                  /* main got the first aggregated STATS */
    uint64_t stats_ns, next_stats_ns, next_tick_ns;
    uint64_t next_seq;
    struct s_fan *fans;
    char *text;                 /* routing text buffer */
    size_t cap_text;
    /* shutdown */
    int stopping;               /* a SHUTDOWN came from main */
    uint64_t stop_deadline_ns;  /* give up waiting for confirmations; 0 = none */
    int n_stopped;              /* replicas that confirmed their stop */
    int lost;                   /* a peer is gone: exit 1 */
};

static uint64_t s_now_ns (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

void rx_dp_sched_sock (int dp_rank, char *buf, size_t cap)
{
    if (buf && cap) snprintf (buf, cap, "%s.%d", RX_SOCK_SCHED, dp_rank);
}

/* --------------------------------------------------------------- sends -- */

/* As the scheduler's: a timeout or socket error means the peer is gone
 * (exit 1); a message that cannot be encoded is our bug (logged, go on). */
static int s_send (struct s_proc *p, rx_ipc_sock_t *sock, const char *peer, int rep,
                   const struct rx_ipc_msg *m)
{
    struct rx_err err = { 0 };
    int rc = rx_ipc_send (sock, m, RX_PROC_SEND_TIMEOUT_MS, &err);
    if (rc == RX_OK) return RX_OK;
    char who[48];
    if (rep >= 0) snprintf (who, sizeof who, "replica %d", rep);
    else snprintf (who, sizeof who, "%s", peer);
    if (rc == RX_EINVAL) {
        rx_log (RX_LOG_ERROR, "dp controller: %s to %s not sent: %s", rx_ipc_type_name (m->type),
                who, err.msg);
        return rc;
    }
    rx_log (RX_LOG_ERROR, "dp controller: cannot send %s to %s (gone?): %s",
            rx_ipc_type_name (m->type), who, err.msg);
    p->lost = 1;
    return rc;
}

static int s_to_main (struct s_proc *p, const struct rx_ipc_msg *m)
{
    return s_send (p, p->to_main, "main", -1, m);
}

static int s_to_rep (struct s_proc *p, int d, const struct rx_ipc_msg *m)
{
    return s_send (p, p->to_rep[d], NULL, d, m);
}

static void s_req_error (struct s_proc *p, uint64_t rid, int status, const char *msg)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_REQ_ERROR;
    m.u.req_error.rid = rid;
    m.u.req_error.status = status;
    m.u.req_error.message = (char *) msg;
    s_to_main (p, &m);
}

/* ---------------------------------------------------------- rid table -- */

static size_t s_hash (const struct s_proc *p, uint64_t rid)
{
    uint64_t x = rid;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t) x & (p->n_bucket - 1);
}

static struct s_rid **s_rid_slot (struct s_proc *p, uint64_t rid)
{
    struct s_rid **pp = &p->bucket[s_hash (p, rid)];
    while (*pp && (*pp)->rid != rid) pp = &(*pp)->next;
    return pp;
}

/* Double the buckets at load factor 1. */
static int s_rid_grow (struct s_proc *p)
{
    size_t nb = p->n_bucket ? p->n_bucket * 2 : 256;
    struct s_rid **b = calloc (nb, sizeof *b);
    if (!b) return RX_ENOMEM;
    struct s_rid **old = p->bucket;
    size_t on = p->n_bucket;
    p->bucket = b;
    p->n_bucket = nb;
    for (size_t i = 0; i < on; i++)
        for (struct s_rid *r = old[i], *nx; r; r = nx) {
            nx = r->next;
            size_t h = s_hash (p, r->rid);
            r->next = b[h];
            b[h] = r;
        }
    free (old);
    return RX_OK;
}

/* Record rid on replica d (a rid already in flight moves: main never
 * reuses one, so that is only a warning). */
static int s_rid_add (struct s_proc *p, uint64_t rid, int d)
{
    struct s_rid **pp = s_rid_slot (p, rid);
    if (*pp) {
        rx_log (RX_LOG_WARN, "dp controller: request %llu is already in flight on replica %d",
                (unsigned long long) rid, (*pp)->rep);
        if (p->load[(*pp)->rep]) p->load[(*pp)->rep]--;
        (*pp)->rep = d;
        p->load[d]++;
        return RX_OK;
    }
    if (p->n_rid >= p->n_bucket && s_rid_grow (p) != RX_OK) return RX_ENOMEM;
    struct s_rid *r = malloc (sizeof *r);
    if (!r) return RX_ENOMEM;
    r->rid = rid;
    r->rep = d;
    size_t h = s_hash (p, rid);
    r->next = p->bucket[h];
    p->bucket[h] = r;
    p->n_rid++;
    p->load[d]++;
    return RX_OK;
}

/* The replica rid is in flight on, or -1. */
static int s_rid_find (struct s_proc *p, uint64_t rid)
{
    struct s_rid *r = *s_rid_slot (p, rid);
    return r ? r->rep : -1;
}

/* rid ended (DONE or ERROR) on replica from: its load drops.  Returns 1 if
 * it was in flight there. */
static int s_rid_end (struct s_proc *p, uint64_t rid, int from)
{
    struct s_rid **pp = s_rid_slot (p, rid), *r = *pp;
    if (!r || r->rep != from) {
        rx_log (RX_LOG_DEBUG, "dp controller: replica %d ended request %llu, not in flight there",
                from, (unsigned long long) rid);
        return 0;
    }
    *pp = r->next;
    if (p->load[from]) p->load[from]--;
    free (r);
    p->n_rid--;
    return 1;
}

static void s_rid_free_all (struct s_proc *p)
{
    for (size_t i = 0; i < p->n_bucket; i++)
        for (struct s_rid *r = p->bucket[i], *nx; r; r = nx) {
            nx = r->next;
            free (r);
        }
    free (p->bucket);
    p->bucket = NULL;
    p->n_bucket = p->n_rid = 0;
}

/* ------------------------------------------------------------- stats -- */

/* One STATS from the replies present (v[d] NULL = none). */
static void s_aggregate (const struct rx_ipc_stats *const *v, int n, uint64_t cookie,
                         struct rx_ipc_stats *out)
{
    memset (out, 0, sizeof *out);
    out->cookie = cookie;
    out->dp_rank = 0;
    const struct rx_ipc_stats *first = NULL;
    int k = 0;
    double ntr = 0;
    for (int d = 0; d < n; d++) {
        const struct rx_ipc_stats *s = v[d];
        if (!s) continue;
        if (!first) first = s;
        k++;
        out->running += s->running;
        out->queued += s->queued;
        out->kv_used += s->kv_used;
        out->kv_total += s->kv_total;
        if (s->steps > out->steps) out->steps = s->steps;
        out->prompt_tokens += s->prompt_tokens;
        out->gen_tokens += s->gen_tokens;
        out->prompt_tps += s->prompt_tps;
        out->gen_tps += s->gen_tps;
        out->cached_tokens += s->cached_tokens;
        out->cache_tokens += s->cache_tokens;
        out->finished += s->finished;
        out->retractions += s->retractions;
        out->cand_rows += s->cand_rows;
        out->cand_full += s->cand_full;
        out->cand_tail += s->cand_tail;
        out->cand_lp_rows += s->cand_lp_rows;
        out->cand_lp_full += s->cand_lp_full;
        out->max_running_requests += s->max_running_requests;
        ntr += s->new_token_ratio;
    }
    if (!first) return;
    /* Replica 0's model limits (all replicas serve the same model). */
    out->context_len = first->context_len;
    out->n_vocab = first->n_vocab;
    out->cache_hit_rate = out->prompt_tokens
                              ? (float) ((double) out->cached_tokens / (double) out->prompt_tokens)
                              : 0.0f;
    out->new_token_ratio = (float) (ntr / k);
}

static void s_send_periodic (struct s_proc *p)
{
    const struct rx_ipc_stats *v[RX_DP_MAX];
    for (int d = 0; d < p->n; d++) v[d] = p->have[d] ? &p->latest[d] : NULL;
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_STATS;
    s_aggregate (v, p->n, 0, &m.u.stats);
    s_to_main (p, &m);
}

/* ------------------------------------------------------------ fan-ins -- */

static void s_fan_free (struct s_fan *f)
{
    if (!f) return;
    free (f->got);
    free (f->st);
    free (f);
}

/* Answer main for fan-in f (complete or timed out) and free it. */
static void s_fan_answer (struct s_proc *p, struct s_fan *f, int timed_out)
{
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    if (timed_out) {
        char miss[256];
        size_t off = 0;
        miss[0] = '\0';
        for (int d = 0; d < p->n && off + 16 < sizeof miss; d++)
            if (!f->got[d])
                off += (size_t) snprintf (miss + off, sizeof miss - off, "%s%d", off ? ", " : "", d);
        if (f->type == RX_IPC_GET_STATS)
            rx_log (RX_LOG_WARN, "dp controller: GET_STATS: replica(s) %s did not answer in %d ms; "
                    "their latest periodic STATS stand in", miss, RX_DP_STATS_WAIT_MS);
        else {
            rx_log (RX_LOG_WARN, "dp controller: FLUSH_CACHE: replica(s) %s did not answer in %d ms",
                    miss, RX_DP_FLUSH_WAIT_MS);
            if (f->status == RX_OK) {
                f->status = RX_ETIMEDOUT;
                snprintf (f->message, sizeof f->message, "replica(s) %s did not answer the flush", miss);
            }
        }
    }
    if (f->type == RX_IPC_GET_STATS) {
        const struct rx_ipc_stats *v[RX_DP_MAX];
        for (int d = 0; d < p->n; d++)
            v[d] = f->got[d] ? &f->st[d] : p->have[d] ? &p->latest[d] : NULL;
        m.type = RX_IPC_STATS;
        s_aggregate (v, p->n, f->main_cookie, &m.u.stats);
    } else {
        m.type = RX_IPC_FLUSH_CACHE_REPLY;
        m.u.flush_reply.cookie = f->main_cookie;
        m.u.flush_reply.status = f->status;
        if (f->status == RX_OK)
            snprintf (f->message, sizeof f->message, "cache flushed on all %d replicas", p->n);
        m.u.flush_reply.message = f->message;
        rx_log (RX_LOG_INFO, "dp controller: %s", f->message);
    }
    s_to_main (p, &m);
    s_fan_free (f);
}

/* Fan main's GET_STATS / FLUSH_CACHE out to every replica. */
static void s_fan_out (struct s_proc *p, int type, uint64_t main_cookie)
{
    struct s_fan *f = calloc (1, sizeof *f);
    if (f) {
        f->got = calloc ((size_t) p->n, 1);
        if (type == RX_IPC_GET_STATS) f->st = calloc ((size_t) p->n, sizeof *f->st);
    }
    if (!f || !f->got || (type == RX_IPC_GET_STATS && !f->st)) {
        s_fan_free (f);
        rx_log (RX_LOG_ERROR, "dp controller: out of memory for a %s; not answered",
                rx_ipc_type_name (type));
        return;
    }
    f->type = type;
    f->main_cookie = main_cookie;
    f->seq = ++p->next_seq;
    f->status = RX_OK;
    f->deadline_ns = s_now_ns ()
                     + (uint64_t) (type == RX_IPC_GET_STATS ? RX_DP_STATS_WAIT_MS : RX_DP_FLUSH_WAIT_MS)
                           * 1000000ull;
    f->next = p->fans;
    p->fans = f;
    for (int d = 0; d < p->n && !p->lost; d++) {
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = (uint16_t) type;
        m.u.cookie = f->seq * (uint64_t) p->n + (uint64_t) d + 1;
        s_to_rep (p, d, &m);
    }
}

/* The fan-in one of our cookies belongs to (and in *rep the replica it
 * was sent to), or NULL (a late answer to a fan-in already answered). */
static struct s_fan *s_fan_find (struct s_proc *p, int type, uint64_t cookie, int *rep)
{
    if (!cookie) return NULL;
    uint64_t seq = (cookie - 1) / (uint64_t) p->n;
    int d = (int) ((cookie - 1) % (uint64_t) p->n);
    for (struct s_fan *f = p->fans; f; f = f->next)
        if (f->seq == seq && f->type == type) {
            *rep = d;
            return f;
        }
    return NULL;
}

static void s_fan_unlink (struct s_proc *p, struct s_fan *f)
{
    for (struct s_fan **pp = &p->fans; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            return;
        }
}

/* Fan-ins past their deadline are answered with what they have. */
static void s_fan_expire (struct s_proc *p, uint64_t now)
{
    struct s_fan **pp = &p->fans;
    while (*pp && !p->lost) {
        struct s_fan *f = *pp;
        if (now >= f->deadline_ns) {
            *pp = f->next;
            s_fan_answer (p, f, 1);
        } else
            pp = &f->next;
    }
}

/* ------------------------------------------------------------ routing -- */

/* The routing text of a prompt: each id as S_TOKEN_BYTES ASCII bytes, so
 * every byte is one "character" of the policy's tree and a common prefix
 * of texts is exactly a common prefix of token ids (ids are below 2^21 in
 * every vocabulary we know; higher bits are dropped, which can only merge
 * two ids for routing). */
static int s_route_text (struct s_proc *p, const int32_t *ids, uint32_t n, size_t *len)
{
    size_t need = (size_t) n * S_TOKEN_BYTES;
    if (need > p->cap_text) {
        char *t = realloc (p->text, need);
        if (!t) return RX_ENOMEM;
        p->text = t;
        p->cap_text = need;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t) ids[i];
        p->text[i * S_TOKEN_BYTES + 0] = (char) ((v >> 14) & 0x7f);
        p->text[i * S_TOKEN_BYTES + 1] = (char) ((v >> 7) & 0x7f);
        p->text[i * S_TOKEN_BYTES + 2] = (char) (v & 0x7f);
    }
    *len = need;
    return RX_OK;
}

static void s_req_new (struct s_proc *p, struct rx_ipc_msg *m)
{
    const struct rx_request *r = &m->u.req;
    if (p->stopping) {
        s_req_error (p, r->rid, RX_EAGAIN, "server is shutting down");
        return;
    }
    for (int d = 0; d < p->n; d++) p->w[d].load = p->load[d];
    size_t len = 0, pick = 0;
    int decision = RX_ROUTE_PLAIN;
    struct rx_err err = { 0 };
    int rc = s_route_text (p, r->input_ids, r->n_input, &len);
    if (rc == RX_OK)
        rc = rx_rpolicy_pick (p->rp, p->text, len, p->w, (size_t) p->n, ++p->seed, &pick, &decision,
                              &err);
    else
        rx_err_set (&err, rc, "out of memory for the routing text of %u tokens", r->n_input);
    if (rc != RX_OK) {
        /* Serve anyway: the least loaded replica. */
        pick = 0;
        for (int d = 1; d < p->n; d++)
            if (p->load[d] < p->load[pick]) pick = (size_t) d;
        rx_log (RX_LOG_WARN, "dp controller: request %llu: %s; sent to the least loaded replica %zu",
                (unsigned long long) r->rid, err.msg, pick);
    }
    int d = (int) pick;
    if (s_rid_add (p, r->rid, d) != RX_OK) {
        s_req_error (p, r->rid, RX_ENOMEM, "dp controller: out of memory");
        return;
    }
    p->dispatched[d]++;
    rx_debug ("dp controller: request %llu (%u tokens) -> replica %d (load %u, decision %d)",
              (unsigned long long) r->rid, r->n_input, d, p->load[d], decision);
    if (s_to_rep (p, d, m) != RX_OK && !p->lost) {
        s_rid_end (p, r->rid, d);
        s_req_error (p, r->rid, RX_EINTERNAL, "dp controller: cannot forward the request");
    }
}

static void s_req_abort (struct s_proc *p, const struct rx_ipc_abort *a)
{
    if (!a->n) return;
    uint64_t *rids = malloc ((size_t) a->n * sizeof *rids);
    if (!rids) {
        rx_log (RX_LOG_ERROR, "dp controller: out of memory splitting an abort of %u requests", a->n);
        return;
    }
    for (int d = 0; d < p->n && !p->lost; d++) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < a->n; i++)
            if (s_rid_find (p, a->rids[i]) == d) rids[k++] = a->rids[i];
        if (!k) continue;
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_REQ_ABORT;
        m.u.abort.n = k;
        m.u.abort.rids = rids;
        rx_debug ("dp controller: abort of %u request(s) -> replica %d", k, d);
        s_to_rep (p, d, &m);
    }
    free (rids);
}

/* REQ_ABORT_SEQ: as REQ_ABORT, each (rid, sibling) to the replica that owns
 * the rid; an unknown rid (finished already) is dropped. */
static void s_req_abort_seq (struct s_proc *p, const struct rx_ipc_abort_seq *a)
{
    if (!a->n) return;
    struct rx_ipc_seq_ref *q = malloc ((size_t) a->n * sizeof *q);
    if (!q) {
        rx_log (RX_LOG_ERROR, "dp controller: out of memory splitting an abort of %u sequences", a->n);
        return;
    }
    for (int d = 0; d < p->n && !p->lost; d++) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < a->n; i++)
            if (s_rid_find (p, a->seqs[i].rid) == d) q[k++] = a->seqs[i];
        if (!k) continue;
        struct rx_ipc_msg m;
        memset (&m, 0, sizeof m);
        m.type = RX_IPC_REQ_ABORT_SEQ;
        m.u.abort_seq.n = k;
        m.u.abort_seq.seqs = q;
        rx_debug ("dp controller: abort of %u sequence(s) -> replica %d", k, d);
        s_to_rep (p, d, &m);
    }
    free (q);
}

/* ---------------------------------------------------------- messages -- */

static void s_stop_begin (struct s_proc *p, const struct rx_ipc_shutdown *sd)
{
    uint64_t now = s_now_ns ();
    uint64_t until = 0;
    if (sd->mode == RX_IPC_SHUTDOWN_NOW)
        until = now + (uint64_t) RX_DP_STOP_WAIT_MS * 1000000ull;
    else if (sd->deadline_ms)
        until = now + ((uint64_t) sd->deadline_ms + RX_DP_STOP_WAIT_MS) * 1000000ull;
    if (until && (!p->stop_deadline_ns || until < p->stop_deadline_ns)) p->stop_deadline_ns = until;
    rx_log (RX_LOG_INFO, "dp controller: shutdown %s (%d of %d replicas stopped already)",
            sd->mode == RX_IPC_SHUTDOWN_NOW ? "now" : "drain", p->n_stopped, p->n);
    p->stopping = 1;
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_SHUTDOWN;
    m.u.shutdown = *sd;
    /* A replica's confirmation does not say which it is, so every replica
     * is told; a live one always takes it at once (no HWM), so one that
     * cannot be reached in S_STOP_SEND_MS has stopped already: not an
     * error here (a NOW after a DRAIN meets those). */
    for (int d = 0; d < p->n; d++) {
        struct rx_err err = { 0 };
        if (rx_ipc_send (p->to_rep[d], &m, S_STOP_SEND_MS, &err) != RX_OK)
            rx_log (RX_LOG_INFO, "dp controller: SHUTDOWN not delivered to replica %d "
                    "(stopped already?): %s", d, err.msg);
    }
}

/* One message from main; frees it. */
static void s_from_main (struct s_proc *p, struct rx_ipc_msg *m)
{
    switch (m->type) {
    case RX_IPC_REQ_NEW:
        s_req_new (p, m);
        break;
    case RX_IPC_REQ_ABORT:
        s_req_abort (p, &m->u.abort);
        break;
    case RX_IPC_REQ_ABORT_SEQ:
        s_req_abort_seq (p, &m->u.abort_seq);
        break;
    case RX_IPC_GET_STATS:
        if (p->stopping) {
            /* Replicas may be gone: what we know now. */
            const struct rx_ipc_stats *v[RX_DP_MAX];
            for (int d = 0; d < p->n; d++) v[d] = p->have[d] ? &p->latest[d] : NULL;
            struct rx_ipc_msg r;
            memset (&r, 0, sizeof r);
            r.type = RX_IPC_STATS;
            s_aggregate (v, p->n, m->u.cookie, &r.u.stats);
            s_to_main (p, &r);
        } else
            s_fan_out (p, RX_IPC_GET_STATS, m->u.cookie);
        break;
    case RX_IPC_FLUSH_CACHE:
        if (p->stopping) {
            struct rx_ipc_msg r;
            memset (&r, 0, sizeof r);
            r.type = RX_IPC_FLUSH_CACHE_REPLY;
            r.u.flush_reply.cookie = m->u.cookie;
            r.u.flush_reply.status = RX_EAGAIN;
            r.u.flush_reply.message = (char *) "server is shutting down";
            s_to_main (p, &r);
        } else
            s_fan_out (p, RX_IPC_FLUSH_CACHE, m->u.cookie);
        break;
    case RX_IPC_SHUTDOWN:
        s_stop_begin (p, &m->u.shutdown);
        break;
    case RX_IPC_EPLB:
        /* Expert distribution record controls go to replica 0 (with
         * rebalance on, its window already holds the DP-attention group's
         * counts: core/expert_record.h); its EPLB_REPLY, same cookie, goes
         * back to main as it is. */
        s_to_rep (p, 0, m);
        break;
    default:
        rx_log (RX_LOG_WARN, "dp controller: unexpected %s message from main; ignored",
                rx_ipc_type_name (m->type));
        break;
    }
    rx_ipc_msg_free (m);
}

/* A replica's rank from a STATS, or -1 (logged). */
static int s_rank_of (struct s_proc *p, uint32_t dp_rank, const char *what)
{
    if ((int64_t) dp_rank < (int64_t) p->n) return (int) dp_rank;
    rx_log (RX_LOG_WARN, "dp controller: %s from dp_rank %u (only %d replicas); ignored", what,
            dp_rank, p->n);
    return -1;
}

static void s_stats_in (struct s_proc *p, const struct rx_ipc_stats *st)
{
    if (st->cookie) {
        int d = -1;
        struct s_fan *f = s_fan_find (p, RX_IPC_GET_STATS, st->cookie, &d);
        if (!f) {
            rx_log (RX_LOG_DEBUG, "dp controller: late or unknown STATS cookie %llu dropped",
                    (unsigned long long) st->cookie);
            return;
        }
        if (!f->got[d]) {
            f->got[d] = 1;
            f->n_got++;
            f->st[d] = *st;
        }
        if (f->n_got == p->n) {
            s_fan_unlink (p, f);
            s_fan_answer (p, f, 0);
        }
        return;
    }
    int d = s_rank_of (p, st->dp_rank, "periodic STATS");
    if (d < 0) return;
    p->latest[d] = *st;
    p->have[d] = 1;
    if (p->ready) return;
    for (int k = 0; k < p->n; k++)
        if (!p->have[k]) return;
    /* Every replica is up: main's "scheduler ready". */
    p->ready = 1;
    rx_log (RX_LOG_INFO, "dp controller: all %d replicas ready", p->n);
    s_send_periodic (p);
    p->next_stats_ns = s_now_ns () + p->stats_ns;
}

static void s_flush_in (struct s_proc *p, const struct rx_ipc_flush_reply *r)
{
    int d = -1;
    struct s_fan *f = s_fan_find (p, RX_IPC_FLUSH_CACHE, r->cookie, &d);
    if (!f) {
        rx_log (RX_LOG_DEBUG, "dp controller: late or unknown FLUSH_CACHE_REPLY cookie %llu dropped",
                (unsigned long long) r->cookie);
        return;
    }
    if (f->got[d]) return;
    f->got[d] = 1;
    f->n_got++;
    if (r->status != RX_OK && f->status == RX_OK) {
        f->status = r->status;
        snprintf (f->message, sizeof f->message, "replica %d: %s", d,
                  r->message && *r->message ? r->message : rx_status_name (r->status));
    }
    if (f->n_got == p->n) {
        s_fan_unlink (p, f);
        s_fan_answer (p, f, 0);
    }
}

/* The sender of a REQ_DONE / REQ_ERROR is not on the wire: the replica a
 * rid is in flight on is the one that can end it. */
static void s_from_rep (struct s_proc *p, struct rx_ipc_msg *m)
{
    switch (m->type) {
    case RX_IPC_REQ_DONE:
        for (uint32_t i = 0; i < m->u.done.n; i++) {
            int d = s_rid_find (p, m->u.done.rids[i]);
            if (d >= 0) s_rid_end (p, m->u.done.rids[i], d);
        }
        break;
    case RX_IPC_REQ_ERROR: {
        int d = s_rid_find (p, m->u.req_error.rid);
        if (d >= 0) s_rid_end (p, m->u.req_error.rid, d);
        s_to_main (p, m);
        break;
    }
    case RX_IPC_STATS:
        s_stats_in (p, &m->u.stats);
        break;
    case RX_IPC_FLUSH_CACHE_REPLY:
        s_flush_in (p, &m->u.flush_reply);
        break;
    case RX_IPC_EPLB_REPLY:
    case RX_IPC_EPLB_STATS:   /* main keeps dp rank 0's */
        s_to_main (p, m);
        break;
    case RX_IPC_SHUTDOWN:
        /* A replica confirms its stop (its last message on this socket). */
        if (p->n_stopped < p->n) p->n_stopped++;
        rx_log (RX_LOG_DEBUG, "dp controller: %d of %d replicas stopped", p->n_stopped, p->n);
        break;
    default:
        rx_log (RX_LOG_WARN, "dp controller: unexpected %s message from a replica; ignored",
                rx_ipc_type_name (m->type));
        break;
    }
    rx_ipc_msg_free (m);
}

/* Take what is waiting on sock (at most S_MAX_MSGS).  Returns 1 when the
 * process must exit. */
static int s_drain (struct s_proc *p, rx_ipc_sock_t *sock, int from_main)
{
    for (int k = 0; k < S_MAX_MSGS; k++) {
        struct rx_ipc_msg m;
        struct rx_err err = { 0 };
        int rc = rx_ipc_recv (sock, &m, 0, &err);
        if (rc == RX_ETIMEDOUT) break;
        if (rc == RX_EFORMAT) {
            rx_log (RX_LOG_WARN, "dp controller: dropped a message from %s: %s",
                    from_main ? "main" : "a replica", err.msg);
            continue;
        }
        if (rc != RX_OK) {
            rx_log (RX_LOG_ERROR, "dp controller: cannot receive: %s", err.msg);
            return 1;
        }
        if (from_main) s_from_main (p, &m);
        else s_from_rep (p, &m);
        if (p->lost) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------- main -- */

static int s_start (struct s_proc *p, struct rx_boot *boot, const struct rx_dp_proc_opts *o)
{
    struct rx_err err = { 0 };
    if (!o || !o->run_dir) {
        rx_log (RX_LOG_ERROR, "dp controller: no run directory given");
        return 1;
    }
    if (o->dp_size < 1 || o->dp_size > RX_DP_MAX) {
        rx_log (RX_LOG_ERROR, "dp controller: dp_size %d is out of range 1..%d", o->dp_size,
                RX_DP_MAX);
        return 1;
    }
    p->n = o->dp_size;
    size_t n = (size_t) p->n;
    p->to_rep = calloc (n, sizeof *p->to_rep);
    p->w = calloc (n, sizeof *p->w);
    p->url = calloc (n, sizeof *p->url);
    p->load = calloc (n, sizeof *p->load);
    p->dispatched = calloc (n, sizeof *p->dispatched);
    p->latest = calloc (n, sizeof *p->latest);
    p->have = calloc (n, 1);
    if (!p->to_rep || !p->w || !p->url || !p->load || !p->dispatched || !p->latest || !p->have
        || s_rid_grow (p) != RX_OK) {
        rx_log (RX_LOG_ERROR, "dp controller: out of memory for %d replicas", p->n);
        return 1;
    }

    /* The policy first: a bad [dp] policy is the likeliest start-up error. */
    p->policy = rx_conf_str (boot->conf, "dp", "policy", "round_robin");
    rx_plugin_t *plugin = NULL;
    if (rx_loader_find (boot->loader, RX_KIND_ROUTE_POLICY, p->policy, &plugin, &err) != RX_OK
        || rx_plugin_init (plugin, boot->conf, &err) != RX_OK
        || !(p->rp = rx_rpolicy_new (plugin, &err))) {
        rx_log (RX_LOG_ERROR, "dp controller: [dp] policy = \"%s\": %s", p->policy, err.msg);
        return 1;
    }
    for (int d = 0; d < p->n; d++) {
        snprintf (p->url[d], sizeof p->url[d], "replica %d", d);
        p->w[d].id = (uint32_t) d;
        p->w[d].url = p->url[d];
        rx_rpolicy_added (p->rp, (uint32_t) d);
    }

    if (!(p->ipc = rx_ipc_join (o->run_dir, &err))
        || !(p->from_main = rx_ipc_bind (p->ipc, RX_IPC_PULL, RX_SOCK_SCHED, &err))
        || !(p->from_reps = rx_ipc_bind (p->ipc, RX_IPC_PULL, RX_SOCK_DPC, &err))
        || !(p->to_main = rx_ipc_connect (p->ipc, RX_IPC_PUSH, RX_SOCK_MAIN, &err))) {
        rx_log (RX_LOG_ERROR, "dp controller: %s", err.msg);
        return 1;
    }
    for (int d = 0; d < p->n; d++) {
        char name[32];
        rx_dp_sched_sock (d, name, sizeof name);
        if (!(p->to_rep[d] = rx_ipc_connect (p->ipc, RX_IPC_PUSH, name, &err))) {
            rx_log (RX_LOG_ERROR, "dp controller: replica %d: %s", d, err.msg);
            return 1;
        }
    }
    int ms = o->stats_interval_ms > 0 ? o->stats_interval_ms : 1000;
    p->stats_ns = (uint64_t) ms * 1000000ull;
    p->next_tick_ns = s_now_ns () + (uint64_t) S_TICK_MS * 1000000ull;
    rx_log (RX_LOG_INFO, "dp controller: %d replicas, policy %s", p->n, rx_rpolicy_name (p->rp));
    return 0;
}

/* Milliseconds until the earliest timer (at most S_TICK_MS). */
static int s_wait_ms (const struct s_proc *p, uint64_t now)
{
    uint64_t until = p->next_tick_ns;
    if (p->ready && !p->stopping && p->next_stats_ns < until) until = p->next_stats_ns;
    for (const struct s_fan *f = p->fans; f; f = f->next)
        if (f->deadline_ns < until) until = f->deadline_ns;
    if (p->stop_deadline_ns && p->stop_deadline_ns < until) until = p->stop_deadline_ns;
    if (until <= now) return 0;
    uint64_t ms = (until - now + 999999ull) / 1000000ull;
    return ms > S_TICK_MS ? S_TICK_MS : (int) ms;
}

static int s_loop (struct s_proc *p)
{
    rx_ipc_sock_t *socks[2] = { p->from_main, p->from_reps };
    for (;;) {
        uint64_t now = s_now_ns ();
        unsigned char ready[2] = { 0, 0 };
        struct rx_err err = { 0 };
        int rc = rx_ipc_poll (socks, 2, ready, s_wait_ms (p, now), &err);
        if (rc < 0) {
            rx_log (RX_LOG_ERROR, "dp controller: poll: %s", err.msg);
            return 1;
        }
        /* Replicas first: a REQ_DONE that came with a REQ_NEW lowers the
         * load the REQ_NEW is routed by. */
        if (ready[1] && s_drain (p, p->from_reps, 0)) return 1;
        if (ready[0] && s_drain (p, p->from_main, 1)) return 1;
        if (p->stopping && p->n_stopped == p->n) return 0;

        now = s_now_ns ();
        s_fan_expire (p, now);
        if (p->lost) return 1;
        if (p->ready && !p->stopping && now >= p->next_stats_ns) {
            s_send_periodic (p);
            if (p->lost) return 1;
            p->next_stats_ns = now + p->stats_ns;
        }
        if (now >= p->next_tick_ns) {
            rx_rpolicy_tick (p->rp, (double) now / 1e9);
            p->next_tick_ns = now + (uint64_t) S_TICK_MS * 1000000ull;
        }
        if (p->stopping && p->stop_deadline_ns && now >= p->stop_deadline_ns) {
            rx_log (RX_LOG_ERROR, "dp controller: %d of %d replicas did not confirm their stop "
                    "within %d ms", p->n - p->n_stopped, p->n, RX_DP_STOP_WAIT_MS);
            return 1;
        }
    }
}

/* "dp controller: dispatched a / b / ... requests" (tests read it). */
static void s_log_dispatched (const struct s_proc *p)
{
    char buf[1024];
    size_t off = 0;
    buf[0] = '\0';
    for (int d = 0; d < p->n && off + 24 < sizeof buf; d++)
        off += (size_t) snprintf (buf + off, sizeof buf - off, "%s%llu", d ? " / " : "",
                                  (unsigned long long) p->dispatched[d]);
    rx_log (RX_LOG_INFO, "dp controller: dispatched %s requests", buf);
}

int rx_dp_proc_main (struct rx_boot *boot, const struct rx_dp_proc_opts *o)
{
    struct s_proc p;
    memset (&p, 0, sizeof p);
    p.boot = boot;
    int status = s_start (&p, boot, o);
    if (status == 0) {
        status = s_loop (&p);
        s_log_dispatched (&p);
        if (status == 0) rx_log (RX_LOG_INFO, "dp controller: stopped");
    }
    while (p.fans) {
        struct s_fan *f = p.fans;
        p.fans = f->next;
        s_fan_free (f);
    }
    rx_rpolicy_destroy (&p.rp);
    s_rid_free_all (&p);
    free (p.text);
    free (p.to_rep);
    free (p.w);
    free (p.url);
    free (p.load);
    free (p.dispatched);
    free (p.latest);
    free (p.have);
    /* Closes the sockets: queued messages get the linger time to leave. */
    rx_ipc_destroy (&p.ipc);
    return status;
}
