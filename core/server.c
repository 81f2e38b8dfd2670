/* core/server.c -- radixd's main process (see server.h). */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <jansson.h>

#include "api.h"
#include "auth.h"
#include "chat.h"
#include "conf.h"
#include "detok_proc.h"
#include "gguf.h"
#include "histogram.h"
#include "ipc.h"
#include "ipc_msg.h"
#include "log.h"
#include "metrics.h"
#include "request.h"
#include "sched_proc.h"
#include "engine.h"
#include "topology.h"
#include "dp_proc.h"
#include "server.h"
#include "supervisor.h"
#include "tokenizer.h"

#define S_HASH          1024
#define S_SEND_TIMEOUT  2000     /* ms: a send to the scheduler that cannot be queued is an error */
#define S_TICK_MS       100
#define S_FORCE_GRACE   10.0     /* s after the drain deadline before children are killed */

/* ------------------------------------------------------------ types */

struct s_choice {
    char *text;                          /* non-stream: the whole output; /generate stream: so far */
    size_t len, cap;
    struct rx_api_token_logprob *lp;     /* non-stream: every token's logprobs (owned, incl. top) */
    size_t n_lp, cap_lp;
    int finish;                          /* enum rx_api_finish once done */
    int ipc_finish;                      /* enum rx_finish */
    int32_t matched;
    int done;
    int role_sent;                       /* chat stream: the role chunk went out */
    uint32_t completion_tokens;
    uint32_t text_offset;                /* completions stream: bytes sent so far */
};

/* What a connection's close callback points to. */
enum { S_PEND_LIVE = 1, S_PEND_CTL = 2 };

struct rx_server;

struct s_live {
    int tag;                             /* S_PEND_LIVE */
    struct rx_server *srv;
    struct s_live *hnext, *prev, *next;
    uint64_t rid;
    struct evhttp_request *req;          /* NULL once the client is gone */
    int kind;                            /* enum rx_request_kind */
    int internal;                        /* /health_generate's probe */
    int stream, echo, logprobs, include_usage;
    int headers_sent;
    char id[64];
    char *model, *ext_id;
    char *stops[RX_MAX_STOP];
    uint32_t n_stops;
    char *prompt_text;
    size_t prompt_len;
    uint32_t n, n_done;
    struct s_choice *ch;
    uint32_t prompt_tokens, cached_tokens;
    int64_t created;
    double t0, t_first, t_last;
};

enum { S_CTL_FLUSH = 1, S_CTL_INFO = 2,
       /* expert distribution record: S_CTL_EPLB + RX_IPC_EPLB_OP_* (1 start, 2 stop, 3 dump) */
       S_CTL_EPLB = 10 };

struct s_ctl {
    int tag;                             /* S_PEND_CTL */
    struct s_ctl *next;
    uint64_t cookie;
    int type;
    struct evhttp_request *req;
};

/* One child process: the detokenizer, the DP controller, a scheduler rank. */
struct s_kid {
    pid_t pid;
    char role[48];               /* its log role: "detok", "dpc", "sched", "sched.tp1", ... */
    int sent_sig;                /* the signal main sent it (SIGKILL), 0 if none: a death by that
                                    signal is main's doing, not a fault */
    pid_t dead_pid;              /* reaped, its end not yet reported (s_reap_all): its pid ... */
    int dead_st;                 /* ... and its waitpid status */
};

struct rx_server {
    struct rx_boot *boot;
    const rx_conf_t *conf;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *listener;
    struct event *ev_zmq, *ev_tick, *ev_term, *ev_int, *ev_chld;

    rx_ipc_t *ipc;
    rx_ipc_sock_t *in, *to_sched;
    rx_heartbeat_t *hb;
    pid_t sched_pid;                     /* the child main sends to: replica 0's rank 0, or the DP
                                            controller (dp_size > 1); 0 once reaped */
    struct s_kid *kids;                  /* every child; pid 0 once reaped */
    size_t n_kids;
    struct rx_topo topo;

    rx_gguf_t *gguf;
    rx_tokenizer_t *tok;
    struct rx_chat_template chat;
    int have_chat;
    struct rx_api_ctx api;
    const char *names[1];
    char *served_name;
    const char *model_path;
    char *model_path_buf;                /* owned: [model] path resolved */

    /* [server] */
    const char *host, *api_key, *admin_key, *cors;
    int port;
    uint64_t max_body, max_header;
    double watchdog, shutdown_timeout;

    int ready, draining, exiting, exit_code;
    int have_cause;                      /* a child's unexpected end was named as the reason to stop */
    double drain_deadline;

    struct s_live *bucket[S_HASH];
    struct s_live *live;                 /* list of every live request */
    size_t n_live;
    struct s_ctl *ctl;
    uint64_t next_cookie, next_rid;

    struct rx_ipc_stats stats;
    struct rx_ipc_eplb_stats eplb;       /* dp rank 0's last EPLB_STATS (balancedness owned) */
    int have_stats;
    struct rx_hist ttft, itl, e2e;
    uint64_t n_finished, n_aborted, n_rejected, n_disconnects;
    int64_t started;
    char url[160];
};
typedef struct rx_server rx_server_t;

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ replies */

static const char *s_reason (int status)
{
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default:  return status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

/* Send body (NUL-terminated) with a status; frees nothing. */
static void s_reply (struct evhttp_request *req, int status, const char *ctype, const char *body)
{
    struct evbuffer *b = evbuffer_new ();
    if (b && body) evbuffer_add (b, body, strlen (body));
    if (ctype) evhttp_add_header (evhttp_request_get_output_headers (req), "Content-Type", ctype);
    evhttp_send_reply (req, status, s_reason (status), b);
    if (b) evbuffer_free (b);
}

static void s_reply_json (struct evhttp_request *req, int status, char *json)
{
    s_reply (req, status, "application/json", json ? json : "{}");
    free (json);
}

static void s_reply_api_error (struct evhttp_request *req, const struct rx_api_error *e)
{
    char *json = NULL;
    if (e->status == 503)
        evhttp_add_header (evhttp_request_get_output_headers (req), "Retry-After", "1");
    if (rx_api_error_json (e, &json) != RX_OK) {
        s_reply (req, 500, "text/plain", "out of memory\n");
        return;
    }
    s_reply_json (req, e->status, json);
}

#if defined(__GNUC__)
__attribute__ ((format (printf, 5, 6)))
#endif
static void s_reply_error (struct evhttp_request *req, int status, const char *code,
                           const char *param, const char *fmt, ...)
{
    struct rx_api_error e;
    va_list ap;
    va_start (ap, fmt);
    rx_api_error_vset (&e, status, code, param, fmt, ap);
    va_end (ap);
    s_reply_api_error (req, &e);
}

/* ------------------------------------------------------------ live table */

static struct s_live *s_find (rx_server_t *s, uint64_t rid)
{
    for (struct s_live *l = s->bucket[rid % S_HASH]; l; l = l->hnext)
        if (l->rid == rid) return l;
    return NULL;
}

static void s_choice_fini (struct s_choice *c)
{
    free (c->text);
    for (size_t i = 0; i < c->n_lp; i++) free ((void *) c->lp[i].top);
    free (c->lp);
}

static void s_unlink (rx_server_t *s, struct s_live *l)
{
    struct s_live **pp = &s->bucket[l->rid % S_HASH];
    while (*pp && *pp != l) pp = &(*pp)->hnext;
    if (*pp) *pp = l->hnext;
    if (l->prev) l->prev->next = l->next;
    else s->live = l->next;
    if (l->next) l->next->prev = l->prev;
    s->n_live--;
}

static void s_live_free (rx_server_t *s, struct s_live *l)
{
    s_unlink (s, l);
    for (uint32_t i = 0; l->ch && i < l->n; i++) s_choice_fini (&l->ch[i]);
    free (l->ch);
    for (uint32_t i = 0; i < l->n_stops; i++) free (l->stops[i]);
    free (l->model);
    free (l->ext_id);
    free (l->prompt_text);
    free (l);
}

static void s_on_close (struct evhttp_connection *conn, void *arg);

/* Detach l from its connection's close callback (the request is ending). */
static void s_forget_conn (struct evhttp_request *req)
{
    struct evhttp_connection *c = req ? evhttp_request_get_connection (req) : NULL;
    if (c) evhttp_connection_set_closecb (c, NULL, NULL);
}

static void s_watch_conn (struct evhttp_request *req, void *pending)
{
    struct evhttp_connection *c = evhttp_request_get_connection (req);
    if (c) evhttp_connection_set_closecb (c, s_on_close, pending);
}

static int s_send_abort (rx_server_t *s, uint64_t rid)
{
    struct rx_ipc_msg m = { .type = RX_IPC_REQ_ABORT };
    m.u.abort.n = 1;
    m.u.abort.rids = &rid;
    struct rx_err err = { 0 };
    if (!s->to_sched || s->sched_pid <= 0) return RX_EIO;
    int rc = rx_ipc_send (s->to_sched, &m, S_SEND_TIMEOUT, &err);
    if (rc != RX_OK) rx_warn ("cannot send an abort to the scheduler: %s", err.msg);
    return rc;
}

/* Stop sibling `index` of rid alone (its stop string was found while other
 * siblings still run), so it frees its KV now instead of generating up to
 * max_tokens for nothing. */
static int s_send_abort_seq (rx_server_t *s, uint64_t rid, uint32_t index)
{
    struct rx_ipc_seq_ref q = { rid, index };
    struct rx_ipc_msg m = { .type = RX_IPC_REQ_ABORT_SEQ };
    m.u.abort_seq.n = 1;
    m.u.abort_seq.seqs = &q;
    struct rx_err err = { 0 };
    if (!s->to_sched || s->sched_pid <= 0) return RX_EIO;
    int rc = rx_ipc_send (s->to_sched, &m, S_SEND_TIMEOUT, &err);
    if (rc != RX_OK) rx_warn ("cannot send a sibling abort to the scheduler: %s", err.msg);
    return rc;
}

/* ------------------------------------------------------------ output */

static int s_api_finish (int f)
{
    switch (f) {
    case RX_FINISH_EOS: case RX_FINISH_STOP_ID: case RX_FINISH_STOP_STR: return RX_API_FINISH_STOP;
    case RX_FINISH_LENGTH: return RX_API_FINISH_LENGTH;
    case RX_FINISH_ABORT: return RX_API_FINISH_ABORT;
    default: return RX_API_FINISH_NONE;
    }
}

static void s_choice_view (const struct s_live *l, const struct s_choice *c, struct rx_api_choice *v)
{
    memset (v, 0, sizeof *v);
    v->text = c->text ? c->text : "";
    v->len = c->len;
    v->finish = c->finish;
    v->matched_id = -1;
    if (c->ipc_finish == RX_FINISH_EOS || c->ipc_finish == RX_FINISH_STOP_ID) v->matched_id = c->matched;
    if (c->ipc_finish == RX_FINISH_STOP_STR && c->matched >= 0 && (uint32_t) c->matched < l->n_stops)
        v->matched_str = l->stops[c->matched];
}

static void s_usage (const struct s_live *l, struct rx_api_usage *u)
{
    u->prompt_tokens = (int32_t) l->prompt_tokens;
    u->cached_tokens = (int32_t) l->cached_tokens;
    u->completion_tokens = 0;
    for (uint32_t i = 0; i < l->n; i++) u->completion_tokens += (int32_t) l->ch[i].completion_tokens;
}

/* The logprobs of one TEXT entry as API entries (tops allocated). */
static int s_convert_lp (rx_server_t *s, const struct rx_ipc_text_out *e,
                         struct rx_api_token_logprob **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!e->has_logprobs || e->lp.n == 0) return RX_OK;
    struct rx_api_token_logprob *v = calloc (e->lp.n, sizeof *v);
    if (!v) return RX_ENOMEM;
    for (uint32_t i = 0; i < e->lp.n; i++) {
        const char *p = "";
        size_t pl = 0;
        v[i].id = e->lp.ids[i];
        if (rx_tokenizer_piece (s->tok, v[i].id, 0, &p, &pl) != RX_OK) { p = ""; pl = 0; }
        v[i].text = p;
        v[i].len = pl;
        v[i].logprob = e->lp.logprob[i];
        if (e->lp.n_top > 0) {
            struct rx_api_top_logprob *t = calloc (e->lp.n_top, sizeof *t);
            if (!t) {
                for (uint32_t j = 0; j < i; j++) free ((void *) v[j].top);
                free (v);
                return RX_ENOMEM;
            }
            for (uint32_t k = 0; k < e->lp.n_top; k++) {
                t[k].id = e->lp.top_ids[(size_t) i * e->lp.n_top + k];
                t[k].logprob = e->lp.top_logprob[(size_t) i * e->lp.n_top + k];
                if (rx_tokenizer_piece (s->tok, t[k].id, 0, &t[k].text, &t[k].len) != RX_OK) {
                    t[k].text = "";
                    t[k].len = 0;
                }
            }
            v[i].top = t;
            v[i].n_top = e->lp.n_top;
        }
    }
    *out = v;
    *n = e->lp.n;
    return RX_OK;
}

static void s_free_lp (struct rx_api_token_logprob *v, size_t n)
{
    for (size_t i = 0; i < n; i++) free ((void *) v[i].top);
    free (v);
}

static int s_append (char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        while (nc < *len + n + 1) nc *= 2;
        char *nb = realloc (*buf, nc);
        if (!nb) return RX_ENOMEM;
        *buf = nb;
        *cap = nc;
    }
    memcpy (*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return RX_OK;
}

static void s_send_sse (struct s_live *l, char *sse)
{
    if (!sse) return;
    if (l->req) {
        struct evbuffer *b = evbuffer_new ();
        if (b) {
            evbuffer_add (b, sse, strlen (sse));
            evhttp_send_reply_chunk (l->req, b);
            evbuffer_free (b);
        }
    }
    free (sse);
}

static void s_meta (const struct s_live *l, struct rx_api_meta *m)
{
    m->id = l->id;
    m->model = l->model ? l->model : "";
    m->created = l->created;
    m->include_usage = l->include_usage;
}

static void s_stream_start (rx_server_t *s, struct s_live *l)
{
    if (l->headers_sent || !l->req) return;
    struct evkeyvalq *h = evhttp_request_get_output_headers (l->req);
    evhttp_add_header (h, "Content-Type", "text/event-stream");
    evhttp_add_header (h, "Cache-Control", "no-cache");
    evhttp_add_header (h, "X-Accel-Buffering", "no");
    evhttp_send_reply_start (l->req, 200, "OK");
    l->headers_sent = 1;
    if (l->kind == RX_REQ_COMPLETION && l->echo && l->prompt_len) {
        struct rx_api_meta m;
        s_meta (l, &m);
        for (uint32_t i = 0; i < l->n; i++) {
            struct rx_api_choice c = { .text = l->prompt_text, .len = l->prompt_len, .matched_id = -1 };
            char *sse = NULL;
            if (rx_api_completion_chunk (&m, i, &c, &sse) == RX_OK) s_send_sse (l, sse);
        }
    }
}

/* One TEXT entry of a streamed request. */
static void s_stream_delta (rx_server_t *s, struct s_live *l, uint32_t idx, const char *text,
                            size_t len, struct rx_api_token_logprob *lp, size_t n_lp)
{
    struct s_choice *c = &l->ch[idx];
    struct rx_api_meta m;
    s_meta (l, &m);
    struct rx_api_choice v;
    s_choice_view (l, c, &v);
    v.text = text;
    v.len = len;
    v.logprobs = l->logprobs ? lp : NULL;
    v.n_logprobs = l->logprobs ? n_lp : 0;
    char *sse = NULL;
    s_stream_start (s, l);
    switch (l->kind) {
    case RX_REQ_COMPLETION:
        v.text_offset = c->text_offset;
        c->text_offset += (uint32_t) len;
        if (rx_api_completion_chunk (&m, idx, &v, &sse) == RX_OK) s_send_sse (l, sse);
        break;
    case RX_REQ_CHAT:
        if (!c->role_sent) {
            c->role_sent = 1;
            if (rx_api_chat_chunk_role (&m, idx, &sse) == RX_OK) s_send_sse (l, sse);
        }
        if (len > 0 || (v.logprobs && n_lp > 0)) {
            int fin = v.finish;
            v.finish = RX_API_FINISH_NONE;
            if (rx_api_chat_chunk (&m, idx, &v, &sse) == RX_OK) s_send_sse (l, sse);
            v.finish = fin;
        }
        if (v.finish != RX_API_FINISH_NONE) {
            v.text = "";
            v.len = 0;
            v.logprobs = NULL;
            v.n_logprobs = 0;
            if (rx_api_chat_chunk (&m, idx, &v, &sse) == RX_OK) s_send_sse (l, sse);
        }
        break;
    default: {   /* /generate streams the text so far */
        if (s_append (&c->text, &c->len, &c->cap, text, len) != RX_OK) break;
        s_choice_view (l, c, &v);
        struct rx_api_usage u;
        s_usage (l, &u);
        u.completion_tokens = (int32_t) c->completion_tokens;
        if (rx_api_generate_chunk (l->ext_id ? l->ext_id : l->id, &v, &u, l->n > 1 ? (int) idx : -1, &sse) == RX_OK)
            s_send_sse (l, sse);
        break;
    }
    }
}

/* Every choice is done: answer, then forget the request. */
static void s_complete (rx_server_t *s, struct s_live *l)
{
    double now = s_now ();
    rx_hist_observe (&s->e2e, now - l->t0);
    int aborted = 0;
    for (uint32_t i = 0; i < l->n; i++) aborted |= l->ch[i].finish == RX_API_FINISH_ABORT;
    if (aborted) s->n_aborted++;
    else s->n_finished++;

    struct evhttp_request *req = l->req;
    l->req = NULL;
    if (req) s_forget_conn (req);
    if (!req) {
        s_live_free (s, l);
        return;
    }
    if (l->internal) {
        if (aborted) s_reply_error (req, 503, "health_check_failed", NULL, "the probe request was aborted");
        else s_reply_json (req, 200, strdup ("{\"status\":\"ok\"}"));
        s_live_free (s, l);
        return;
    }
    struct rx_api_usage u;
    s_usage (l, &u);
    if (l->stream) {
        l->req = req;
        s_stream_start (s, l);
        struct rx_api_meta m;
        s_meta (l, &m);
        char *sse = NULL;
        if (l->include_usage && l->kind != RX_REQ_GENERATE &&
            rx_api_usage_chunk (&m, l->kind == RX_REQ_CHAT, &u, &sse) == RX_OK)
            s_send_sse (l, sse);
        s_send_sse (l, strdup (rx_api_sse_done ()));
        l->req = NULL;
        evhttp_send_reply_end (req);
        s_live_free (s, l);
        return;
    }
    struct rx_api_choice *v = calloc (l->n, sizeof *v);
    struct rx_api_usage *us = calloc (l->n, sizeof *us);
    char **echoed = calloc (l->n, sizeof *echoed);
    char *json = NULL;
    int rc = v && us && echoed ? RX_OK : RX_ENOMEM;
    for (uint32_t i = 0; rc == RX_OK && i < l->n; i++) {
        struct s_choice *c = &l->ch[i];
        s_choice_view (l, c, &v[i]);
        v[i].logprobs = l->logprobs ? c->lp : NULL;
        v[i].n_logprobs = l->logprobs ? c->n_lp : 0;
        if (l->echo && l->prompt_len) {
            size_t el = 0, ec = 0;
            if (s_append (&echoed[i], &el, &ec, l->prompt_text, l->prompt_len) != RX_OK ||
                s_append (&echoed[i], &el, &ec, v[i].text, v[i].len) != RX_OK)
                rc = RX_ENOMEM;
            else {
                v[i].text = echoed[i];
                v[i].len = el;
                v[i].text_offset = (uint32_t) l->prompt_len;
            }
        }
        us[i] = u;
        us[i].completion_tokens = (int32_t) c->completion_tokens;
    }
    if (rc == RX_OK) {
        struct rx_api_meta m;
        s_meta (l, &m);
        if (l->kind == RX_REQ_COMPLETION) rc = rx_api_completion_response (&m, v, l->n, &u, &json);
        else if (l->kind == RX_REQ_CHAT) rc = rx_api_chat_response (&m, v, l->n, &u, &json);
        else rc = rx_api_generate_response (l->ext_id ? l->ext_id : l->id, v, l->n, us, &json);
    }
    if (rc == RX_OK) s_reply_json (req, 200, json);
    else s_reply_error (req, 500, "internal_error", NULL, "cannot build the response (out of memory)");
    for (uint32_t i = 0; echoed && i < l->n; i++) free (echoed[i]);
    free (echoed);
    free (v);
    free (us);
    s_live_free (s, l);
}

static void s_on_text_entry (rx_server_t *s, const struct rx_ipc_text_out *e)
{
    struct s_live *l = s_find (s, e->rid);
    if (!l || e->index >= l->n) return;
    struct s_choice *c = &l->ch[e->index];
    if (c->done) return;
    double now = s_now ();
    if (e->text_len > 0 || e->usage.completion_tokens > c->completion_tokens) {
        if (l->t_first == 0) {
            l->t_first = now;
            rx_hist_observe (&s->ttft, now - l->t0);
        } else {
            rx_hist_observe (&s->itl, now - l->t_last);
        }
        l->t_last = now;
    }
    l->prompt_tokens = e->usage.prompt_tokens;
    l->cached_tokens = e->usage.cached_tokens;
    c->completion_tokens = e->usage.completion_tokens;
    if (e->finish != RX_FINISH_NONE) {
        c->done = 1;
        c->ipc_finish = e->finish;
        c->finish = s_api_finish (e->finish);
        c->matched = e->matched;
        l->n_done++;
        /* A stop string is found by the detokenizer: the scheduler still
         * runs that sequence until told otherwise.  The last sibling's is
         * stopped with the whole rid below; one of several alone here.
         * Late output for it is dropped above (c->done). */
        if (e->finish == RX_FINISH_STOP_STR && l->n_done < l->n) s_send_abort_seq (s, l->rid, e->index);
    }
    struct rx_api_token_logprob *lp = NULL;
    size_t n_lp = 0;
    if (l->logprobs && s_convert_lp (s, e, &lp, &n_lp) != RX_OK) {
        lp = NULL;
        n_lp = 0;
    }
    if (l->internal || !l->req) {
        s_free_lp (lp, n_lp);
    } else if (l->stream) {
        s_stream_delta (s, l, e->index, e->text, e->text_len, lp, n_lp);
        s_free_lp (lp, n_lp);
    } else {
        s_append (&c->text, &c->len, &c->cap, e->text, e->text_len);
        if (n_lp) {
            if (c->n_lp + n_lp > c->cap_lp) {
                size_t nc = c->cap_lp ? c->cap_lp * 2 : 16;
                while (nc < c->n_lp + n_lp) nc *= 2;
                void *nb = realloc (c->lp, nc * sizeof *c->lp);
                if (nb) {
                    c->lp = nb;
                    c->cap_lp = nc;
                }
            }
            if (c->n_lp + n_lp <= c->cap_lp) {
                memcpy (c->lp + c->n_lp, lp, n_lp * sizeof *lp);
                c->n_lp += n_lp;
                free (lp);
            } else {
                s_free_lp (lp, n_lp);
            }
        }
    }
    if (l->n_done == l->n) {
        /* The last sibling (or the only one, n = 1) may still run in the
         * scheduler after its stop string: abort the rid at once.  Siblings
         * stopped earlier had their REQ_ABORT_SEQ already; this also
         * covers one whose send failed, and aborting a rid the scheduler
         * has finished is a no-op. */
        int stop_str = 0;
        for (uint32_t i = 0; i < l->n; i++) stop_str |= l->ch[i].ipc_finish == RX_FINISH_STOP_STR;
        if (stop_str) s_send_abort (s, l->rid);
        s_complete (s, l);
    }
}

/* The scheduler refused a request. */
static void s_on_req_error (rx_server_t *s, const struct rx_ipc_req_error *e)
{
    struct s_live *l = s_find (s, e->rid);
    if (!l) return;
    struct evhttp_request *req = l->req;
    l->req = NULL;
    s->n_rejected++;
    if (req) {
        s_forget_conn (req);
        if (l->headers_sent) {
            evhttp_send_reply_end (req);
        } else if (e->status == RX_EAGAIN) {
            s_reply_error (req, 503, "server_overloaded", NULL, "%s",
                           e->message && *e->message ? e->message : "too many requests are waiting; retry later");
        } else if (e->status == RX_ERANGE) {
            s_reply_error (req, 400, "context_length_exceeded", "prompt", "%s", e->message ? e->message : "");
        } else if (e->status == RX_EINVAL) {
            s_reply_error (req, 400, "invalid_value", NULL, "%s", e->message ? e->message : "");
        } else {
            s_reply_error (req, 500, "internal_error", NULL, "%s", e->message ? e->message : "");
        }
    }
    s_live_free (s, l);
}

/* ------------------------------------------------------------ control */

static struct s_ctl *s_ctl_take (rx_server_t *s, uint64_t cookie)
{
    for (struct s_ctl **pp = &s->ctl; *pp; pp = &(*pp)->next) {
        if ((*pp)->cookie == cookie) {
            struct s_ctl *c = *pp;
            *pp = c->next;
            return c;
        }
    }
    return NULL;
}

static int s_ctl_send (rx_server_t *s, struct evhttp_request *req, int type)
{
    struct s_ctl *c = calloc (1, sizeof *c);
    if (!c) return RX_ENOMEM;
    c->tag = S_PEND_CTL;
    c->cookie = ++s->next_cookie;
    c->type = type;
    c->req = req;
    struct rx_ipc_msg m = { .type = type == S_CTL_FLUSH ? RX_IPC_FLUSH_CACHE : RX_IPC_GET_STATS };
    m.u.cookie = c->cookie;
    if (type > S_CTL_EPLB) {
        m.type = RX_IPC_EPLB;
        m.u.eplb.cookie = c->cookie;
        m.u.eplb.op = (uint8_t) (type - S_CTL_EPLB);
    }
    struct rx_err err = { 0 };
    if (rx_ipc_send (s->to_sched, &m, S_SEND_TIMEOUT, &err) != RX_OK) {
        free (c);
        s_reply_error (req, 503, "scheduler_unavailable", NULL, "scheduler unreachable: %s", err.msg);
        return RX_EIO;
    }
    c->next = s->ctl;
    s->ctl = c;
    s_watch_conn (req, c);
    return RX_OK;
}

static json_t *s_stats_json (const rx_server_t *s)
{
    const struct rx_ipc_stats *st = &s->stats;
    return json_pack ("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f}",
                      "running", (json_int_t) st->running, "queued", (json_int_t) st->queued,
                      "kv_used_tokens", (json_int_t) st->kv_used, "kv_total_tokens", (json_int_t) st->kv_total,
                      "cache_tokens", (json_int_t) st->cache_tokens, "steps", (json_int_t) st->steps,
                      "prompt_tokens", (json_int_t) st->prompt_tokens,
                      "cached_tokens", (json_int_t) st->cached_tokens,
                      "generation_tokens", (json_int_t) st->gen_tokens,
                      "finished", (json_int_t) st->finished, "retractions", (json_int_t) st->retractions,
                      "cache_hit_rate", (double) st->cache_hit_rate, "prompt_tokens_per_s", (double) st->prompt_tps,
                      "generation_tokens_per_s", (double) st->gen_tps,
                      "new_token_ratio", (double) st->new_token_ratio);
}

static void s_reply_server_info (rx_server_t *s, struct evhttp_request *req)
{
    const rx_conf_t *cf = s->conf;
    json_t *o = json_pack (
        "{s:s,s:s,s:s,s:i,s:i,s:s?,s:I,s:i,s:{s:s,s:I,s:I,s:I,s:I},s:{s:b,s:s,s:I},s:o,s:I}",
        "version", PACKAGE_VERSION, "model_path", s->model_path, "served_model_name", s->served_name,
        "context_length", (int) s->stats.context_len, "n_vocab", (int) s->stats.n_vocab,
        "chat_template", s->have_chat ? rx_chat_family_name (s->chat.family) : NULL,
        "max_running_requests", (json_int_t) s->stats.max_running_requests,
        "port", s->port,
        "scheduler", "policy", rx_conf_str (cf, "scheduler", "policy", "fcfs"),
        "max_queued_requests", (json_int_t) rx_conf_int (cf, "scheduler", "max_queued_requests", 0),
        "chunked_prefill_size", (json_int_t) rx_conf_int (cf, "scheduler", "chunked_prefill_size", 8192),
        "max_prefill_tokens", (json_int_t) rx_conf_int (cf, "scheduler", "max_prefill_tokens", 16384),
        "dp_rank", (json_int_t) s->stats.dp_rank,
        "cache", "radix_cache", rx_conf_bool (cf, "cache", "radix_cache", 1),
        "kv_memory", rx_conf_str (cf, "cache", "kv_memory", "0.8"),
        "page_size", (json_int_t) rx_conf_int (cf, "cache", "page_size", 1),
        "stats", s_stats_json (s), "inflight_requests", (json_int_t) s->n_live);
    char *txt = o ? json_dumps (o, JSON_COMPACT) : NULL;
    json_decref (o);
    if (!txt) s_reply_error (req, 500, "internal_error", NULL, "cannot build the server info");
    else s_reply_json (req, 200, txt);
}

static void s_on_stats (rx_server_t *s, const struct rx_ipc_stats *st);

static void s_on_flush_reply (rx_server_t *s, const struct rx_ipc_flush_reply *r)
{
    struct s_ctl *c = s_ctl_take (s, r->cookie);
    if (!c) return;
    if (c->req) {
        s_forget_conn (c->req);
        if (r->status == RX_OK) {
            json_t *o = json_pack ("{s:s,s:s}", "status", "ok", "message", r->message ? r->message : "");
            char *txt = o ? json_dumps (o, JSON_COMPACT) : NULL;
            json_decref (o);
            s_reply_json (c->req, 200, txt);
        } else {
            s_reply_error (c->req, 400, "requests_running", NULL, "cache not flushed: %s",
                           r->message && *r->message ? r->message : "requests are running");
        }
    }
    free (c);
}

/* The expert-distribution record controls' answer; a dump's message is
 * the file it wrote (in [eplb] record_dir, never a client's path). */
static void s_on_eplb_reply (rx_server_t *s, const struct rx_ipc_flush_reply *r)
{
    struct s_ctl *c = s_ctl_take (s, r->cookie);
    if (!c) return;
    if (c->req) {
        s_forget_conn (c->req);
        const char *msg = r->message ? r->message : "";
        if (r->status == RX_OK) {
            json_t *o = c->type == S_CTL_EPLB + RX_IPC_EPLB_OP_DUMP
                        ? json_pack ("{s:s,s:s,s:s}", "status", "ok", "message", "expert distribution dumped", "path", msg)
                        : json_pack ("{s:s,s:s}", "status", "ok", "message", msg);
            char *txt = o ? json_dumps (o, JSON_COMPACT) : NULL;
            json_decref (o);
            s_reply_json (c->req, 200, txt);
        } else if (r->status == RX_ENOTSUP) {
            s_reply_error (c->req, 400, "not_supported", NULL, "%s", msg);
        } else {
            s_reply_error (c->req, 500, "internal_error", NULL, "%s", msg);
        }
    }
    free (c);
}

/* ------------------------------------------------------------ IPC in */

static void s_start_http (rx_server_t *s);

/* Keep dp rank 0's placement balancedness for /metrics (takes the array). */
static void s_on_eplb_stats (rx_server_t *s, struct rx_ipc_eplb_stats *e)
{
    if (e->dp_rank != 0) return;
    free (s->eplb.balancedness);
    s->eplb = *e;
    e->balancedness = NULL;
    e->n = 0;
}

static void s_on_stats (rx_server_t *s, const struct rx_ipc_stats *st)
{
    s->stats = *st;
    s->have_stats = 1;
    if (!s->ready && !s->exiting) {
        s->api.ctx_len = (int32_t) st->context_len;
        s->api.n_vocab = (int32_t) st->n_vocab;
        s_start_http (s);
    }
    if (st->cookie) {
        struct s_ctl *c = s_ctl_take (s, st->cookie);
        if (c) {
            if (c->req) {
                s_forget_conn (c->req);
                s_reply_server_info (s, c->req);
            }
            free (c);
        }
    }
}

static void s_drain_in (rx_server_t *s)
{
    for (int budget = 0; budget < 4096; budget++) {
        struct rx_ipc_msg m;
        struct rx_err err = { 0 };
        int rc = rx_ipc_recv (s->in, &m, 0, &err);
        if (rc == RX_ETIMEDOUT) return;
        if (rc != RX_OK) {
            rx_warn ("main: dropped an IPC message: %s", err.msg);
            if (rc != RX_EFORMAT) return;
            continue;
        }
        switch (m.type) {
        case RX_IPC_TEXT:
            for (uint32_t i = 0; i < m.u.text.n; i++) s_on_text_entry (s, &m.u.text.out[i]);
            break;
        case RX_IPC_REQ_ERROR: s_on_req_error (s, &m.u.req_error); break;
        case RX_IPC_FLUSH_CACHE_REPLY: s_on_flush_reply (s, &m.u.flush_reply); break;
        case RX_IPC_EPLB_REPLY: s_on_eplb_reply (s, &m.u.flush_reply); break;
        case RX_IPC_EPLB_STATS: s_on_eplb_stats (s, &m.u.eplb_stats); break;
        case RX_IPC_STATS: s_on_stats (s, &m.u.stats); break;
        default:
            rx_warn ("main: unexpected %s message ignored", rx_ipc_type_name (m.type));
        }
        rx_ipc_msg_free (&m);
    }
}

static void s_on_zmq (evutil_socket_t fd, short what, void *arg)
{
    s_drain_in (arg);
}

/* ------------------------------------------------------------ endpoints */

static const char *s_body (struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer (req);
    *len = evbuffer_get_length (b);
    if (*len == 0) return "";
    return (const char *) evbuffer_pullup (b, -1);
}

/* echo: the prompt as the client sent it when it was text (decoding the
 * ids would not give it back byte for byte: SPM adds a leading space, BOS,
 * normalisation), else NULL and the ids are decoded. */
static char *s_echo_text (const char *body, size_t len, size_t *out_len)
{
    json_t *root = json_loadb (body, len, 0, NULL);
    json_t *p = root ? json_object_get (root, "prompt") : NULL;
    if (p && json_is_array (p) && json_array_size (p) == 1) p = json_array_get (p, 0);
    char *t = NULL;
    if (p && json_is_string (p)) {
        *out_len = json_string_length (p);
        if ((t = malloc (*out_len + 1))) memcpy (t, json_string_value (p), *out_len + 1);
    }
    json_decref (root);
    return t;
}

static struct s_live *s_live_new (rx_server_t *s, struct evhttp_request *req, struct rx_request *r,
                                  char *echo, size_t echo_len)
{
    struct s_live *l = calloc (1, sizeof *l);
    uint32_t n = r->sp.n > 0 ? (uint32_t) r->sp.n : 1;
    if (!l || !(l->ch = calloc (n, sizeof *l->ch))) {
        free (l);
        free (echo);
        return NULL;
    }
    l->prompt_text = echo;
    l->prompt_len = echo ? echo_len : 0;
    l->tag = S_PEND_LIVE;
    l->srv = s;
    l->rid = ++s->next_rid;
    l->req = req;
    l->kind = r->kind;
    l->stream = r->stream;
    l->echo = r->echo;
    l->logprobs = r->sp.logprobs;
    l->include_usage = r->include_usage;
    l->n = n;
    l->created = (int64_t) time (NULL);
    l->t0 = s_now ();
    const char *prefix = r->kind == RX_REQ_CHAT ? "chatcmpl" : r->kind == RX_REQ_COMPLETION ? "cmpl" : "gen";
    rx_api_make_id (l->id, sizeof l->id, prefix, l->rid);
    l->model = r->model;
    r->model = NULL;
    l->ext_id = r->ext_id;
    r->ext_id = NULL;
    for (uint32_t i = 0; i < r->sp.n_stop && i < RX_MAX_STOP; i++) {
        if ((l->stops[i] = strdup (r->sp.stop[i]))) l->n_stops = i + 1;
        else break;
    }
    if (r->echo && r->n_input && !l->prompt_text) {
        char *t = NULL;
        size_t tl = 0;
        struct rx_err err = { 0 };
        if (rx_tokenizer_decode (s->tok, r->input_ids, r->n_input, 0, &t, &tl, &err) == RX_OK) {
            l->prompt_text = t;
            l->prompt_len = tl;
        }
    }
    l->hnext = s->bucket[l->rid % S_HASH];
    s->bucket[l->rid % S_HASH] = l;
    l->next = s->live;
    if (s->live) s->live->prev = l;
    s->live = l;
    s->n_live++;
    return l;
}

/* Hand a parsed request to the scheduler; the answer comes back as TEXT. */
static void s_dispatch (rx_server_t *s, struct evhttp_request *req, struct rx_request *r, int internal,
                        char *echo, size_t echo_len)
{
    struct s_live *l = s_live_new (s, req, r, echo, echo_len);
    if (!l) {
        rx_request_free (r);
        s_reply_error (req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    l->internal = internal;
    r->rid = l->rid;
    struct rx_ipc_msg m = { .type = RX_IPC_REQ_NEW };
    m.u.req = *r;   /* shallow: encoding only reads it */
    struct rx_err err = { 0 };
    int rc = rx_ipc_send (s->to_sched, &m, S_SEND_TIMEOUT, &err);
    rx_request_free (r);
    if (rc != RX_OK) {
        rx_error ("cannot send a request to the scheduler: %s", err.msg);
        s_live_free (s, l);
        s_reply_error (req, 503, "scheduler_unavailable", NULL, "the scheduler cannot take requests: %s", err.msg);
        return;
    }
    s_watch_conn (req, l);
}

typedef int (*s_parse_fn) (const char *, size_t, const struct rx_api_ctx *, struct rx_request *,
                           struct rx_api_error *);

static void s_generate_like (rx_server_t *s, struct evhttp_request *req, s_parse_fn parse)
{
    size_t len;
    const char *body = s_body (req, &len);
    struct rx_request r;
    memset (&r, 0, sizeof r);
    rx_sampling_params_init (&r.sp);
    struct rx_api_error ae;
    if (parse (body, len, &s->api, &r, &ae) != RX_OK) {
        rx_request_free (&r);
        s_reply_api_error (req, &ae);
        return;
    }
    char *echo = NULL;
    size_t echo_len = 0;
    if (r.kind == RX_REQ_COMPLETION && r.echo) echo = s_echo_text (body, len, &echo_len);
    s_dispatch (s, req, &r, 0, echo, echo_len);
}

static void s_ep_completions (rx_server_t *s, struct evhttp_request *req) { s_generate_like (s, req, rx_api_parse_completion); }
static void s_ep_chat (rx_server_t *s, struct evhttp_request *req)
{
    if (!s->have_chat) {
        s_reply_error (req, 400, "chat_template_unavailable", "messages",
                       "this model has no recognised chat template; set [server] chat_template to a family "
                       "(chatml, llama2, llama3, mistral, deepseek2, deepseek3, zephyr)");
        return;
    }
    s_generate_like (s, req, rx_api_parse_chat);
}
static void s_ep_generate (rx_server_t *s, struct evhttp_request *req) { s_generate_like (s, req, rx_api_parse_generate); }

static void s_ep_models (rx_server_t *s, struct evhttp_request *req)
{
    char *json = NULL;
    if (rx_api_models_response (s->names, 1, s->started, "radix", s->api.ctx_len, &json) != RX_OK)
        s_reply_error (req, 500, "internal_error", NULL, "out of memory");
    else s_reply_json (req, 200, json);
}

static void s_ep_health (rx_server_t *s, struct evhttp_request *req)
{
    struct rx_heartbeat_info hb = { 0 };
    if (s->hb) rx_heartbeat_read (s->hb, &hb);
    double age = hb.last_ns ? (double) hb.age_ns * 1e-9 : -1;
    if (!s->ready || s->draining || s->exiting) {
        s_reply_error (req, 503, "unavailable", NULL, "%s", s->draining ? "shutting down" : "starting");
        return;
    }
    if (s->hb && age < 0) age = 0;   /* ready (STATS came) but not beaten yet */
    if (!s->hb || age > s->watchdog) {
        s_reply_error (req, 503, "scheduler_unresponsive", NULL, "no scheduler heartbeat for %.1f s", age);
        return;
    }
    const char *state = hb.state == RX_HB_BUSY ? "busy" : hb.state == RX_HB_DRAINING ? "draining" : "idle";
    json_t *o = json_pack ("{s:s,s:s,s:I,s:f}", "status", "ok", "scheduler", state, "beat",
                           (json_int_t) hb.beat, "heartbeat_age_s", age);
    char *txt = o ? json_dumps (o, JSON_COMPACT) : NULL;
    json_decref (o);
    s_reply_json (req, 200, txt);
}

static void s_ep_health_generate (rx_server_t *s, struct evhttp_request *req)
{
    struct rx_request r;
    memset (&r, 0, sizeof r);
    rx_sampling_params_init (&r.sp);
    int32_t bos = rx_tokenizer_bos (s->tok);
    r.input_ids = malloc (sizeof *r.input_ids);
    if (!r.input_ids) {
        s_reply_error (req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    r.input_ids[0] = bos >= 0 ? bos : 0;
    r.n_input = 1;
    r.kind = RX_REQ_GENERATE;
    r.sp.max_tokens = 1;
    r.sp.temperature = 0;
    r.sp.ignore_eos = 1;
    s_dispatch (s, req, &r, 1, NULL, 0);
}

static void s_ep_metrics (rx_server_t *s, struct evhttp_request *req)
{
    char *b = NULL;
    size_t len = 0, cap = 0;
    const struct rx_ipc_stats *st = &s->stats;
    double usage = st->kv_total ? (double) st->kv_used / (double) st->kv_total : 0;
    int rc = rx_strbuf_printf (&b, &len, &cap,
        "# HELP radix_requests_running Requests in the scheduler's running batch.\n"
        "# TYPE radix_requests_running gauge\nradix_requests_running %u\n"
        "# HELP radix_requests_queued Requests waiting in the scheduler.\n"
        "# TYPE radix_requests_queued gauge\nradix_requests_queued %u\n"
        "# HELP radix_requests_inflight Requests the HTTP server is answering.\n"
        "# TYPE radix_requests_inflight gauge\nradix_requests_inflight %zu\n"
        "# HELP radix_kv_used_tokens KV cache slots in use (requests and radix cache).\n"
        "# TYPE radix_kv_used_tokens gauge\nradix_kv_used_tokens %llu\n"
        "# HELP radix_kv_total_tokens KV cache slots in the pool.\n"
        "# TYPE radix_kv_total_tokens gauge\nradix_kv_total_tokens %llu\n"
        "# HELP radix_kv_usage_ratio Share of the KV pool in use.\n"
        "# TYPE radix_kv_usage_ratio gauge\nradix_kv_usage_ratio %.6f\n"
        "# HELP radix_cache_tokens Tokens held by the radix prefix cache.\n"
        "# TYPE radix_cache_tokens gauge\nradix_cache_tokens %llu\n"
        "# HELP radix_cache_hit_rate Prompt tokens served from the radix cache / prompt tokens.\n"
        "# TYPE radix_cache_hit_rate gauge\nradix_cache_hit_rate %.6f\n"
        "# HELP radix_prompt_tokens_total Prompt tokens of admitted requests.\n"
        "# TYPE radix_prompt_tokens_total counter\nradix_prompt_tokens_total %llu\n"
        "# HELP radix_cached_prompt_tokens_total Prompt tokens served from the radix cache.\n"
        "# TYPE radix_cached_prompt_tokens_total counter\nradix_cached_prompt_tokens_total %llu\n"
        "# HELP radix_generation_tokens_total Tokens generated.\n"
        "# TYPE radix_generation_tokens_total counter\nradix_generation_tokens_total %llu\n"
        "# HELP radix_prompt_throughput_tokens_per_second Recent prompt tokens per second.\n"
        "# TYPE radix_prompt_throughput_tokens_per_second gauge\nradix_prompt_throughput_tokens_per_second %.3f\n"
        "# HELP radix_generation_throughput_tokens_per_second Recent generated tokens per second.\n"
        "# TYPE radix_generation_throughput_tokens_per_second gauge\nradix_generation_throughput_tokens_per_second %.3f\n"
        "# HELP radix_retractions_total Requests preempted when the KV pool ran out.\n"
        "# TYPE radix_retractions_total counter\nradix_retractions_total %llu\n"
        "# HELP radix_scheduler_steps_total Scheduler iterations.\n"
        "# TYPE radix_scheduler_steps_total counter\nradix_scheduler_steps_total %llu\n"
        "# HELP radix_requests_total Requests answered, by outcome.\n"
        "# TYPE radix_requests_total counter\n"
        "radix_requests_total{outcome=\"finished\"} %llu\nradix_requests_total{outcome=\"aborted\"} %llu\n"
        "radix_requests_total{outcome=\"rejected\"} %llu\nradix_requests_total{outcome=\"disconnected\"} %llu\n",
        st->running, st->queued, s->n_live, (unsigned long long) st->kv_used,
        (unsigned long long) st->kv_total, usage, (unsigned long long) st->cache_tokens,
        (double) st->cache_hit_rate, (unsigned long long) st->prompt_tokens,
        (unsigned long long) st->cached_tokens, (unsigned long long) st->gen_tokens,
        (double) st->prompt_tps, (double) st->gen_tps, (unsigned long long) st->retractions,
        (unsigned long long) st->steps, (unsigned long long) s->n_finished,
        (unsigned long long) s->n_aborted, (unsigned long long) s->n_rejected,
        (unsigned long long) s->n_disconnects);
    if (!rc && st->cand_rows > 0) {
        /* [scheduler] device_sampling (docs/config.md): how often a row's
         * candidates were not enough and its whole row came to the host. */
        const uint64_t ok = st->cand_rows - st->cand_full - st->cand_tail;
        rc = rx_strbuf_printf (&b, &len, &cap,
            "# HELP radix_device_sampling_rows_total Sampled rows drawn from device candidates, by outcome "
            "(full / tail: the whole row was fetched to the host).\n"
            "# TYPE radix_device_sampling_rows_total counter\n"
            "radix_device_sampling_rows_total{outcome=\"candidates\"} %llu\n"
            "radix_device_sampling_rows_total{outcome=\"full\"} %llu\n"
            "radix_device_sampling_rows_total{outcome=\"tail\"} %llu\n",
            (unsigned long long) ok, (unsigned long long) st->cand_full, (unsigned long long) st->cand_tail);
    }
    if (!rc && st->cand_lp_rows > 0) {
        /* logprobs at temperature 1 from the same candidates: full = the
         * row was fetched all the same (top_logprobs past a tiny
         * probability, a draw past the candidates). */
        rc = rx_strbuf_printf (&b, &len, &cap,
            "# HELP radix_device_logprobs_rows_total Rows with logprobs given device candidates, by outcome "
            "(full: the whole row was fetched to the host).\n"
            "# TYPE radix_device_logprobs_rows_total counter\n"
            "radix_device_logprobs_rows_total{outcome=\"candidates\"} %llu\n"
            "radix_device_logprobs_rows_total{outcome=\"full\"} %llu\n",
            (unsigned long long) (st->cand_lp_rows - st->cand_lp_full), (unsigned long long) st->cand_lp_full);
    }
    if (!rc && s->eplb.n > 0) {
        /* EPLB (docs/eplb.md): mean / max GPU load per MoE layer of the
         * current placement over the recorded window (1 = balanced). */
        rc = rx_strbuf_printf (&b, &len, &cap,
            "# HELP radix_eplb_balancedness Mean / max EP-rank load of the current expert placement per MoE layer, over the recorded window.\n"
            "# TYPE radix_eplb_balancedness gauge\n");
        for (uint32_t l = 0; !rc && l < s->eplb.n; l++)
            rc = rx_strbuf_printf (&b, &len, &cap, "radix_eplb_balancedness{layer=\"%u\"} %.6f\n", l,
                                   (double) s->eplb.balancedness[l]);
        if (!rc)
            rc = rx_strbuf_printf (&b, &len, &cap,
                "# HELP radix_eplb_rebalances_total Expert placement rebalances, by outcome.\n"
                "# TYPE radix_eplb_rebalances_total counter\n"
                "radix_eplb_rebalances_total{outcome=\"switched\"} %llu\n"
                "radix_eplb_rebalances_total{outcome=\"skipped\"} %llu\n",
                (unsigned long long) s->eplb.rebalanced, (unsigned long long) s->eplb.skipped);
    }
    if (!rc) rc = rx_hist_render (&s->ttft, &b, &len, &cap);
    if (!rc) rc = rx_hist_render (&s->itl, &b, &len, &cap);
    if (!rc) rc = rx_hist_render (&s->e2e, &b, &len, &cap);
    if (!rc) {
        size_t need = rx_metrics_render (NULL, 0);
        if (need && rx_strbuf_printf (&b, &len, &cap, "%*s", (int) need, "") == 0) {
            len -= need;
            rx_metrics_render (b + len, need + 1);
            len += need;
        }
    }
    if (rc) {
        free (b);
        s_reply_error (req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    s_reply (req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    free (b);
}

static void s_ep_server_info (rx_server_t *s, struct evhttp_request *req)
{
    s_ctl_send (s, req, S_CTL_INFO);
}

static void s_ep_flush (rx_server_t *s, struct evhttp_request *req)
{
    s_ctl_send (s, req, S_CTL_FLUSH);
}

static void s_ep_eplb_start (rx_server_t *s, struct evhttp_request *req)
{
    s_ctl_send (s, req, S_CTL_EPLB + RX_IPC_EPLB_OP_START);
}

static void s_ep_eplb_stop (rx_server_t *s, struct evhttp_request *req)
{
    s_ctl_send (s, req, S_CTL_EPLB + RX_IPC_EPLB_OP_STOP);
}

static void s_ep_eplb_dump (rx_server_t *s, struct evhttp_request *req)
{
    s_ctl_send (s, req, S_CTL_EPLB + RX_IPC_EPLB_OP_DUMP);
}

static void s_ep_tokenize (rx_server_t *s, struct evhttp_request *req)
{
    size_t len, n = 0;
    const char *body = s_body (req, &len);
    int32_t *ids = NULL;
    struct rx_api_error ae;
    char *json = NULL;
    if (rx_api_parse_tokenize (body, len, &s->api, &ids, &n, &ae) != RX_OK) {
        s_reply_api_error (req, &ae);
        return;
    }
    if (rx_api_tokenize_response (ids, n, s->api.ctx_len, &json) != RX_OK)
        s_reply_error (req, 500, "internal_error", NULL, "out of memory");
    else s_reply_json (req, 200, json);
    free (ids);
}

static void s_ep_detokenize (rx_server_t *s, struct evhttp_request *req)
{
    size_t len, n = 0;
    const char *body = s_body (req, &len);
    int32_t *ids = NULL;
    struct rx_api_error ae;
    if (rx_api_parse_detokenize (body, len, &s->api, &ids, &n, &ae) != RX_OK) {
        s_reply_api_error (req, &ae);
        return;
    }
    char *text = NULL, *json = NULL;
    size_t tl = 0;
    struct rx_err err = { 0 };
    if (rx_tokenizer_decode (s->tok, ids, n, 0, &text, &tl, &err) != RX_OK ||
        rx_api_detokenize_response (text, tl, &json) != RX_OK)
        s_reply_error (req, 500, "internal_error", NULL, "cannot detokenize: %s", err.msg);
    else s_reply_json (req, 200, json);
    free (text);
    free (ids);
}

static void s_ep_abort (rx_server_t *s, struct evhttp_request *req)
{
    size_t len;
    const char *body = s_body (req, &len);
    char *rid = NULL;
    int all = 0;
    struct rx_api_error ae;
    if (rx_api_parse_abort (body, len, &rid, &all, &ae) != RX_OK) {
        s_reply_api_error (req, &ae);
        return;
    }
    int n = 0;
    for (struct s_live *l = s->live; l; l = l->next) {
        if (l->internal) continue;
        if (all || (rid && ((l->ext_id && !strcmp (l->ext_id, rid)) || !strcmp (l->id, rid)))) {
            if (s_send_abort (s, l->rid) == RX_OK) n++;
        }
    }
    free (rid);
    json_t *o = json_pack ("{s:i}", "aborted", n);
    char *txt = o ? json_dumps (o, JSON_COMPACT) : NULL;
    json_decref (o);
    s_reply_json (req, 200, txt);
}

struct s_route {
    const char *path;
    enum evhttp_cmd_type method;
    void (*fn) (rx_server_t *, struct evhttp_request *);
    int open;                 /* access level: RX_AUTH_API (0), RX_AUTH_OPEN (1), RX_AUTH_ADMIN */
};

static const struct s_route s_routes[] = {
    { "/v1/completions", EVHTTP_REQ_POST, s_ep_completions, 0 },
    { "/v1/chat/completions", EVHTTP_REQ_POST, s_ep_chat, 0 },
    { "/generate", EVHTTP_REQ_POST, s_ep_generate, 0 },
    { "/v1/models", EVHTTP_REQ_GET, s_ep_models, 0 },
    { "/health", EVHTTP_REQ_GET, s_ep_health, 1 },
    { "/health_generate", EVHTTP_REQ_GET, s_ep_health_generate, 0 },
    { "/metrics", EVHTTP_REQ_GET, s_ep_metrics, 0 },
    { "/get_server_info", EVHTTP_REQ_GET, s_ep_server_info, 0 },
    { "/flush_cache", EVHTTP_REQ_POST, s_ep_flush, RX_AUTH_ADMIN },
    { "/start_expert_distribution_record", EVHTTP_REQ_POST, s_ep_eplb_start, RX_AUTH_ADMIN },
    { "/stop_expert_distribution_record", EVHTTP_REQ_POST, s_ep_eplb_stop, RX_AUTH_ADMIN },
    { "/dump_expert_distribution_record", EVHTTP_REQ_POST, s_ep_eplb_dump, RX_AUTH_ADMIN },
    { "/tokenize", EVHTTP_REQ_POST, s_ep_tokenize, 0 },
    { "/detokenize", EVHTTP_REQ_POST, s_ep_detokenize, 0 },
    { "/abort_request", EVHTTP_REQ_POST, s_ep_abort, 0 },
    { NULL, 0, NULL, 0 }
};

/* CORS: the request's Origin when it is allowed, else NULL. */
static const char *s_cors_origin (const rx_server_t *s, struct evhttp_request *req)
{
    if (!s->cors || !*s->cors) return NULL;
    const char *origin = evhttp_find_header (evhttp_request_get_input_headers (req), "Origin");
    if (!origin) return NULL;
    const char *p = s->cors;
    size_t ol = strlen (origin);
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        if ((t - p == 1 && *p == '*') || ((size_t) (t - p) == ol && !strncmp (p, origin, ol)))
            return origin;
        p = e;
    }
    return NULL;
}

/* Bytes of the request line's URI and the header lines, as sent (what
 * [server] max_header_size bounds). */
static size_t s_header_bytes (struct evhttp_request *req)
{
    const char *uri = evhttp_request_get_uri (req);
    size_t n = uri ? strlen (uri) + 16 : 16;
    for (struct evkeyval *h = evhttp_request_get_input_headers (req)->tqh_first; h; h = h->next.tqe_next)
        n += strlen (h->key) + strlen (h->value) + 4;
    return n;
}

static void s_on_request (struct evhttp_request *req, void *arg)
{
    rx_server_t *s = arg;
    if (s_header_bytes (req) > s->max_header) {
        s_reply_error (req, 431, "request_header_fields_too_large", NULL,
                       "request line and headers over %llu bytes ([server] max_header_size)",
                       (unsigned long long) s->max_header);
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri (req);
    const char *path = uri ? evhttp_uri_get_path (uri) : NULL;
    enum evhttp_cmd_type method = evhttp_request_get_command (req);
    struct evkeyvalq *oh = evhttp_request_get_output_headers (req);
    if (!path || !*path) path = "/";

    const char *origin = s_cors_origin (s, req);
    if (origin) {
        evhttp_add_header (oh, "Access-Control-Allow-Origin", origin);
        evhttp_add_header (oh, "Vary", "Origin");
    }
    if (method == EVHTTP_REQ_OPTIONS && origin) {
        evhttp_add_header (oh, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        evhttp_add_header (oh, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        evhttp_add_header (oh, "Access-Control-Max-Age", "600");
        evhttp_send_reply (req, 204, "No Content", NULL);
        return;
    }
    const struct s_route *r = NULL;
    int path_known = 0;
    for (const struct s_route *x = s_routes; x->path; x++) {
        if (strcmp (x->path, path)) continue;
        path_known = 1;
        if (x->method == method) r = x;
    }
    if (!path_known) {
        s_reply_error (req, 404, "not_found", NULL, "no such endpoint: %s", path);
        return;
    }
    if (!r) {
        for (const struct s_route *x = s_routes; x->path; x++)
            if (!strcmp (x->path, path))
                evhttp_add_header (oh, "Allow", x->method == EVHTTP_REQ_GET ? "GET" : "POST");
        s_reply_error (req, 405, "method_not_allowed", NULL, "%s does not accept this method", path);
        return;
    }
    const char *why = NULL;
    int denied = rx_auth_check (s->api_key, s->admin_key, r->open,
                                evhttp_find_header (evhttp_request_get_input_headers (req), "Authorization"), &why);
    if (denied) {
        if (denied == 401) evhttp_add_header (oh, "WWW-Authenticate", "Bearer");
        s_reply_error (req, denied, denied == 401 ? "invalid_api_key" : "admin_key_required", NULL, "%s", why);
        return;
    }
    if (evbuffer_get_length (evhttp_request_get_input_buffer (req)) > s->max_body) {
        s_reply_error (req, 413, "request_too_large", NULL, "request body over %llu bytes ([server] max_body_size)",
                       (unsigned long long) s->max_body);
        return;
    }
    if ((s->draining || s->exiting) && r->fn != s_ep_health) {
        s_reply_error (req, 503, "shutting_down", NULL, "the server is shutting down");
        return;
    }
    r->fn (s, req);
}

/* A client went away.  libevent still owns the request when it is attached
 * to the connection (it frees it right after this callback); a request it
 * detached (req's connection is NULL) is ours to finish, which frees it. */
static void s_on_close (struct evhttp_connection *conn, void *arg)
{
    int tag = arg ? *(int *) arg : 0;
    struct evhttp_request *req = NULL;
    if (tag == S_PEND_LIVE) {
        struct s_live *l = arg;
        req = l->req;
        l->req = NULL;
        if (req && !evhttp_request_get_connection (req)) {
            if (l->headers_sent) evhttp_send_reply_end (req);
            else evhttp_send_reply (req, 499, "Client Closed Request", NULL);
        }
        /* The request stays in the table until its ABORT finish comes back
         * (the scheduler frees its KV then); it is only no longer answered. */
        l->srv->n_disconnects++;
        rx_debug ("client of request %s disconnected: aborting it", l->id);
        s_send_abort (l->srv, l->rid);
    } else if (tag == S_PEND_CTL) {
        struct s_ctl *c = arg;
        req = c->req;
        c->req = NULL;
        if (req && !evhttp_request_get_connection (req)) evhttp_send_reply (req, 499, "Client Closed Request", NULL);
    }
    (void) conn;
}

/* ------------------------------------------------------------ lifecycle */

static void s_end (rx_server_t *s, int code)
{
    if (s->exiting) return;
    s->exiting = 1;
    s->exit_code = code;
    event_base_loopexit (s->base, NULL);
}

/* A child died unexpectedly: answer what is open, bring the daemon down. */
static void s_fail_all (rx_server_t *s, const char *why)
{
    while (s->live) {
        struct s_live *l = s->live;
        struct evhttp_request *req = l->req;
        l->req = NULL;
        if (req) {
            s_forget_conn (req);
            if (l->headers_sent) evhttp_send_reply_end (req);
            else s_reply_error (req, 500, "internal_error", NULL, "%s", why);
        }
        s_live_free (s, l);
    }
    while (s->ctl) {
        struct s_ctl *c = s->ctl;
        s->ctl = c->next;
        if (c->req) {
            s_forget_conn (c->req);
            s_reply_error (c->req, 500, "internal_error", NULL, "%s", why);
        }
        free (c);
    }
}

static size_t s_kids_alive (const rx_server_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_kids; i++) n += s->kids[i].pid > 0;
    return n;
}

/* "the scheduler process", "the scheduler process sched.tp1", ... */
static void s_kid_name (const struct s_kid *k, char *buf, size_t cap)
{
    const char *what = !strcmp (k->role, "detok") ? "detokenizer" : !strcmp (k->role, "dpc") ? "DP controller"
                                                                                             : "scheduler";
    snprintf (buf, cap, "%s process%s%s", what, strchr (k->role, '.') ? " " : "",
              strchr (k->role, '.') ? k->role : "");
}

/* Kill every child still running whose role starts with prefix ("" = all),
 * remembering that main sent the signal: their deaths are then no fault. */
static void s_kill_kids (rx_server_t *s, const char *prefix)
{
    for (size_t i = 0; i < s->n_kids; i++)
        if (s->kids[i].pid > 0 && !strncmp (s->kids[i].role, prefix, strlen (prefix))) {
            s->kids[i].sent_sig = SIGKILL;
            kill (s->kids[i].pid, SIGKILL);
        }
}

/* ---- who died, and why
 *
 * Children often die together: after `kill -9` of rank 1, rank 0 sees its
 * peer gone and exits 1 within milliseconds, and waitpid(-1) returns the
 * older child (rank 0) first.  So main reaps every child that is already
 * gone before it names a cause, and prefers one killed by a signal it did
 * not send itself (kill -9, the OOM killer): that one is the root cause.
 * Every other unclean end still gets a line of its own; the ends main
 * caused (its own SIGKILL at shutdown) are info. */

/* A death is main's own doing: it sent the signal that ended the child. */
static int s_death_ours (const struct s_kid *k)
{
    return WIFSIGNALED (k->dead_st) && k->sent_sig && WTERMSIG (k->dead_st) == k->sent_sig;
}

static int s_death_foreign_signal (const struct s_kid *k)
{
    return WIFSIGNALED (k->dead_st) && !s_death_ours (k);
}

/* Reap every child that has ended (without waiting) into its s_kid's
 * dead_pid/dead_st; returns how many. */
static size_t s_reap_all (rx_server_t *s)
{
    size_t n = 0;
    int st = 0;
    pid_t pid;
    while ((pid = waitpid (-1, &st, WNOHANG)) > 0) {
        for (size_t i = 0; i < s->n_kids; i++) {
            struct s_kid *k = &s->kids[i];
            if (k->pid != pid) continue;
            k->pid = 0;
            k->dead_pid = pid;
            k->dead_st = st;
            if (pid == s->sched_pid) s->sched_pid = 0;
            n++;
        }
    }
    return n;
}

/* Among the reaped, not yet reported children that ended uncleanly (or,
 * with clean_too, at all), the one to name as the cause: one killed by a
 * signal main did not send, else the first. */
static struct s_kid *s_pick_cause (rx_server_t *s, int clean_too)
{
    struct s_kid *first = NULL;
    for (size_t i = 0; i < s->n_kids; i++) {
        struct s_kid *k = &s->kids[i];
        if (!k->dead_pid || s_death_ours (k)) continue;
        if (s_death_foreign_signal (k)) return k;
        int clean = WIFEXITED (k->dead_st) && WEXITSTATUS (k->dead_st) == 0;
        if (!first && (clean_too || !clean)) first = k;
    }
    return first;
}

/* The cause exited (not killed): give a sibling killed by a signal up to
 * S_CAUSE_WAIT to be reaped too, so it is named instead.  Bounded and
 * only on the way down, so blocking the event loop costs nothing. */
#define S_CAUSE_WAIT 0.2
static void s_wait_for_signalled (rx_server_t *s)
{
    double until = s_now () + S_CAUSE_WAIT;
    while (s_kids_alive (s) && s_now () < until) {
        if (s_reap_all (s)) {
            struct s_kid *c = s_pick_cause (s, 0);
            if (c && s_death_foreign_signal (c)) return;
        }
        usleep (10000);
    }
}

/* The cause's line; why gets the same words without the trailer. */
static void s_report_cause (const struct s_kid *k, const char *ending, char *why, size_t cap)
{
    char how[128], who[96];
    rx_child_describe (k->dead_st, how, sizeof how);
    s_kid_name (k, who, sizeof who);
    snprintf (why, cap, "the %s (pid %d) %s", who, (int) k->dead_pid, how);
    rx_error ("%s%s; %s", why, s_death_foreign_signal (k) ? ", a signal radixd did not send" : "", ending);
}

/* One line for every reaped child not yet reported (but the cause's); a
 * clean exit only with clean_info (while draining, where it is expected). */
static void s_report_rest (rx_server_t *s, int clean_info)
{
    for (size_t i = 0; i < s->n_kids; i++) {
        struct s_kid *k = &s->kids[i];
        if (!k->dead_pid) continue;
        char how[128], who[96];
        rx_child_describe (k->dead_st, how, sizeof how);
        s_kid_name (k, who, sizeof who);
        int clean = WIFEXITED (k->dead_st) && WEXITSTATUS (k->dead_st) == 0;
        if (s_death_ours (k)) rx_info ("the %s (pid %d) %s (sent by radixd)", who, (int) k->dead_pid, how);
        else if (s_death_foreign_signal (k))
            rx_error ("the %s (pid %d) %s, a signal radixd did not send", who, (int) k->dead_pid, how);
        else if (!clean) rx_warn ("the %s (pid %d) %s as well", who, (int) k->dead_pid, how);
        else if (clean_info) rx_info ("the %s (pid %d) %s", who, (int) k->dead_pid, how);
        k->dead_pid = 0;
    }
}

static void s_reap (rx_server_t *s)
{
    if (!s_reap_all (s)) return;
    /* Unexpected: any end while neither draining nor stopping (a clean
     * exit too: a child has no reason to stop on its own), or an unclean
     * one while draining. */
    if (!s->have_cause && !s->exiting) {
        struct s_kid *c = s_pick_cause (s, !s->draining);
        if (c && !s_death_foreign_signal (c)) {
            s_wait_for_signalled (s);
            c = s_pick_cause (s, !s->draining);
        }
        if (c) {
            char why[256];
            s_report_cause (c, "shutting down", why, sizeof why);
            c->dead_pid = 0;
            s->have_cause = 1;
            s_report_rest (s, s->draining);
            s_fail_all (s, why);
            s_end (s, 1);
            return;
        }
    }
    s_report_rest (s, s->draining);
    if (s->draining && !s->exiting && !s_kids_alive (s)) {
        s_drain_in (s);
        s_fail_all (s, "the server shut down before the request finished");
        s_end (s, 0);
    }
}

static void s_on_signal (evutil_socket_t sig, short what, void *arg)
{
    rx_server_t *s = arg;
    if (sig == SIGCHLD) {
        s_reap (s);
        return;
    }
    if (!s->ready) {
        rx_info ("signal %d before the server was ready: stopping", (int) sig);
        s_end (s, 0);
        return;
    }
    if (s->draining) {
        rx_warn ("second signal: aborting every request now");
        struct rx_ipc_msg m = { .type = RX_IPC_SHUTDOWN };
        m.u.shutdown.mode = RX_IPC_SHUTDOWN_NOW;
        struct rx_err err = { 0 };
        if (s->sched_pid > 0) rx_ipc_send (s->to_sched, &m, S_SEND_TIMEOUT, &err);
        s->drain_deadline = s_now ();
        return;
    }
    s->draining = 1;
    s->drain_deadline = s_now () + s->shutdown_timeout;
    if (s->listener) {
        evhttp_del_accept_socket (s->http, s->listener);
        s->listener = NULL;
    }
    rx_info ("signal %d: draining %zu request(s) (up to %.0f s), accepting no more", (int) sig, s->n_live,
             s->shutdown_timeout);
    struct rx_ipc_msg m = { .type = RX_IPC_SHUTDOWN };
    m.u.shutdown.mode = RX_IPC_SHUTDOWN_DRAIN;
    m.u.shutdown.deadline_ms = (uint32_t) (s->shutdown_timeout * 1000.0);
    struct rx_err err = { 0 };
    if (s->sched_pid > 0 && rx_ipc_send (s->to_sched, &m, S_SEND_TIMEOUT, &err) != RX_OK) {
        rx_error ("cannot tell the scheduler to drain: %s", err.msg);
        s_fail_all (s, "the server is shutting down");
        s_end (s, 1);
    }
}

/* libevent notices a closed connection only when it writes to it, so a
 * client that gives up on a non-streamed request would not be seen until
 * the whole answer is generated.  Peek at those sockets instead: a
 * readable socket with nothing to read is closed. */
static void s_check_disconnects (rx_server_t *s)
{
    struct s_live *next;
    for (struct s_live *l = s->live; l; l = next) {
        next = l->next;
        if (!l->req || l->headers_sent) continue;
        struct evhttp_connection *c = evhttp_request_get_connection (l->req);
        struct bufferevent *bev = c ? evhttp_connection_get_bufferevent (c) : NULL;
        evutil_socket_t fd = bev ? bufferevent_getfd (bev) : -1;
        if (fd < 0) continue;
        char b;
        ssize_t k = recv (fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            /* Frees the connection; s_on_close aborts the request and
             * libevent frees the request (still attached). */
            evhttp_connection_free (c);
        }
    }
}

static void s_on_tick (evutil_socket_t fd, short what, void *arg)
{
    rx_server_t *s = arg;
    s_drain_in (s);
    s_reap (s);
    if (s->exiting) return;
    s_check_disconnects (s);
    if (!s->hb && s->sched_pid > 0) {
        struct rx_err err = { 0 };
        s->hb = rx_heartbeat_open (s->ipc, RX_HB_SCHED, &err);
    }
    if (s->ready && s->hb && !s->draining) {
        struct rx_heartbeat_info hb;
        rx_heartbeat_read (s->hb, &hb);
        double age = hb.last_ns ? (double) hb.age_ns * 1e-9 : 0;
        if (hb.state != RX_HB_STOPPED && age > s->watchdog) {
            char why[200];
            snprintf (why, sizeof why, "the scheduler made no progress for %.1f s ([server] watchdog_timeout = %g s): hung",
                      age, s->watchdog);
            rx_error ("%s; shutting down", why);
            s_kill_kids (s, "sched");
            s_fail_all (s, why);
            s_end (s, 1);
            return;
        }
    }
    if (s->draining && s_now () > s->drain_deadline + S_FORCE_GRACE) {
        rx_error ("the children did not stop within %.0f s of the drain deadline; killing them", S_FORCE_GRACE);
        s_fail_all (s, "the server shut down before the request finished");
        s_end (s, 1);
    }
}

static void s_start_http (rx_server_t *s)
{
    s->http = evhttp_new (s->base);
    if (!s->http) {
        rx_error ("cannot create the HTTP server");
        s_end (s, 1);
        return;
    }
    evhttp_set_allowed_methods (s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_OPTIONS |
                                EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH);
    /* libevent refuses (its own 413 page) only far beyond the limit; up to
     * that, the handler answers an OpenAI-style 413. */
    uint64_t hard = s->max_body * 2 + 65536;
    evhttp_set_max_body_size (s->http, (ev_ssize_t) hard);
    /* the same for headers: the handler answers 431 up to twice the limit;
     * beyond, libevent answers 400 and closes the connection */
    evhttp_set_max_headers_size (s->http, (ev_ssize_t) (s->max_header * 2 + 8192));
    evhttp_set_timeout (s->http, 600);
    evhttp_set_gencb (s->http, s_on_request, s);
    s->listener = evhttp_bind_socket_with_handle (s->http, s->host, (ev_uint16_t) s->port);
    if (!s->listener) {
        rx_error ("cannot listen on %s:%d: %s ([server] host/port)", s->host, s->port, strerror (errno));
        s_end (s, 1);
        return;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int port = s->port;
    if (getsockname (evhttp_bound_socket_get_fd (s->listener), (struct sockaddr *) &ss, &sl) == 0)
        port = ntohs (ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *) &ss)->sin6_port
                                               : ((struct sockaddr_in *) &ss)->sin_port);
    s->port = port;
    snprintf (s->url, sizeof s->url, strchr (s->host, ':') ? "http://[%s]:%d" : "http://%s:%d", s->host, port);
    if (!s->hb) {
        struct rx_err herr = { 0 };
        s->hb = rx_heartbeat_open (s->ipc, RX_HB_SCHED, &herr);
        if (!s->hb) rx_warn ("cannot open the scheduler's heartbeat: %s", herr.msg);
    }
    s->ready = 1;
    rx_info ("ready on %s (model %s as \"%s\", context %d, KV %llu tokens, chat template %s)", s->url,
             s->model_path, s->served_name, (int) s->stats.context_len,
             (unsigned long long) s->stats.kv_total, s->have_chat ? rx_chat_family_name (s->chat.family) : "none");
}

/* Children bodies. */
struct s_child_arg {
    struct rx_boot *boot;
    const char *run_dir;
    int n_upstream;                /* the detokenizer's: replicas that send it TOKENS */
    struct rx_topo_rank rank;      /* a scheduler rank's */
};

static int s_sched_body (void *arg)
{
    struct s_child_arg *a = arg;
    return rx_sched_proc_main (a->boot, &a->rank.o);
}

static int s_detok_body (void *arg)
{
    struct s_child_arg *a = arg;
    return rx_detok_proc_main_n (a->boot, a->run_dir, a->n_upstream);
}

static int s_dpc_body (void *arg)
{
    struct s_child_arg *a = arg;
    struct rx_dp_proc_opts o = { .run_dir = a->run_dir, .dp_size = a->n_upstream, .stats_interval_ms = 1000 };
    return rx_dp_proc_main (a->boot, &o);
}

/* Fork one child into s->kids (s->kids has room). */
static int s_spawn (rx_server_t *s, const char *role, rx_child_fn fn, void *arg, struct rx_err *err)
{
    pid_t pid = rx_child_spawn (role, fn, arg, err);
    if (pid < 0) return err->code;
    struct s_kid *k = &s->kids[s->n_kids++];
    k->pid = pid;
    snprintf (k->role, sizeof k->role, "%s", role);
    return RX_OK;
}

/* Fork this node's children: the detokenizer and the DP controller (node
 * 0), and the node's scheduler ranks.  main sends to the DP controller, or
 * to replica 0's rank 0. */
static int s_spawn_children (rx_server_t *s, struct rx_boot *boot, const char *run_dir, struct rx_err *err)
{
    const struct rx_topo *t = &s->topo;
    if (!(s->kids = calloc ((size_t) t->n_local + 2, sizeof *s->kids)))
        return rx_err_set (err, RX_ENOMEM, "out of memory");
    struct s_child_arg ca = { .boot = boot, .run_dir = run_dir, .n_upstream = t->dp_size };
    int rc = RX_OK;
    /* The child gets a copy of ca as it is at fork time. */
    if (t->node_rank == 0) {
        rc = s_spawn (s, "detok", s_detok_body, &ca, err);
        if (rc == RX_OK && t->dp_size > 1) {
            rc = s_spawn (s, "dpc", s_dpc_body, &ca, err);
            if (rc == RX_OK) s->sched_pid = s->kids[s->n_kids - 1].pid;
        }
    }
    for (int g = t->first; rc == RX_OK && g < t->first + t->n_local; g++) {
        rx_topo_rank (t, g, run_dir, &ca.rank);
        rc = s_spawn (s, ca.rank.role, s_sched_body, &ca, err);
        if (rc == RX_OK && g == 0 && t->dp_size == 1) s->sched_pid = s->kids[s->n_kids - 1].pid;
    }
    return rc;
}

static char *s_default_name (const char *path)
{
    const char *b = strrchr (path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen (b);
    if (n > 5 && !strcmp (b + n - 5, ".gguf")) n -= 5;
    return strndup (b, n);
}

static int s_open_model (rx_server_t *s, struct rx_err *err)
{
    /* Relative to the INI file's folder, as the scheduler ranks and the
     * detokenizer resolve it (rx_engine_model_path). */
    s->model_path_buf = rx_engine_model_path (s->boot, NULL);
    s->model_path = s->model_path_buf;
    if (!s->model_path || !*s->model_path)
        return rx_err_set (err, RX_EINVAL, "%s: [model] path is not set: radixd needs a GGUF model file",
                           rx_conf_name (s->conf));
    if (!(s->gguf = rx_gguf_open (s->model_path, err))) return err->code;
    if (!(s->tok = rx_tokenizer_from_gguf (s->gguf, err))) return err->code;
    const char *tmpl = rx_conf_str (s->conf, "server", "chat_template", "auto");
    struct rx_err cerr = { 0 };
    if (!tmpl || !strcmp (tmpl, "auto")) {
        s->have_chat = rx_chat_template_detect (&s->chat, rx_tokenizer_chat_template (s->tok), &cerr) == RX_OK;
        if (!s->have_chat)
            rx_warn ("%s: %s; /v1/chat/completions is disabled until [server] chat_template names a family",
                     s->model_path, cerr.msg);
    } else {
        if (rx_chat_template_named (&s->chat, tmpl, &cerr) != RX_OK)
            return rx_err_set (err, RX_EINVAL, "%s: [server] chat_template: %s", rx_conf_name (s->conf), cerr.msg);
        s->have_chat = 1;
    }
    const char *name = rx_conf_str (s->conf, "server", "served_model_name", NULL);
    s->served_name = name && *name ? strdup (name) : s_default_name (s->model_path);
    if (!s->served_name) return rx_err_set (err, RX_ENOMEM, "out of memory");
    s->names[0] = s->served_name;
    s->api.tok = s->tok;
    s->api.chat = s->have_chat ? &s->chat : NULL;
    s->api.models = s->names;
    s->api.n_models = 1;
    s->api.default_max_tokens = (int32_t) rx_conf_int (s->conf, "server", "default_max_tokens", 0);
    s->api.max_tokens_cap = (int32_t) rx_conf_int (s->conf, "server", "max_tokens_cap", 0);
    s->api.truncate = rx_conf_bool (s->conf, "server", "truncate_prompts", 0);
    return RX_OK;
}

static void s_stop_children (rx_server_t *s)
{
    if (s->sched_pid > 0 && s->to_sched) {
        struct rx_ipc_msg m = { .type = RX_IPC_SHUTDOWN };
        m.u.shutdown.mode = RX_IPC_SHUTDOWN_NOW;
        struct rx_err err = { 0 };
        rx_ipc_send (s->to_sched, &m, 200, &err);
    }
    /* SHUTDOWN flows from the child main talks to through every other one;
     * without it, the rest have nothing left to do. */
    if (s->sched_pid <= 0) s_kill_kids (s, "");
    double until = s_now () + 3.0;
    int others_gone = 0;
    while (s_kids_alive (s) && s_now () < until) {
        /* The detokenizer hears SHUTDOWN from a scheduler; when every
         * other child is gone (a rank died) it waits for nothing: give it
         * a moment, not the full 3 s (issue 10: exit within 5 s). */
        int others = 0;
        for (size_t i = 0; i < s->n_kids; i++) others += s->kids[i].pid > 0 && strcmp (s->kids[i].role, "detok");
        if (!others && !others_gone) {
            others_gone = 1;
            if (until > s_now () + 0.3) until = s_now () + 0.3;
        }
        /* a child that ends badly now still gets its line (after the
         * cause's, or as the only one) */
        if (!s_reap_all (s)) {
            usleep (20000);
            continue;
        }
        s_report_rest (s, 0);
    }
    for (size_t i = 0; i < s->n_kids; i++) {
        if (s->kids[i].pid <= 0) continue;
        char who[96];
        s_kid_name (&s->kids[i], who, sizeof who);
        rx_warn ("killing the %s (pid %d): it did not stop", who, (int) s->kids[i].pid);
        s->kids[i].sent_sig = SIGKILL;
        kill (s->kids[i].pid, SIGKILL);
        waitpid (s->kids[i].pid, NULL, 0);
        s->kids[i].pid = 0;
    }
    s->sched_pid = 0;
}

/* A node other than 0 ([parallel] node_rank > 0): it runs its share of the
 * ranks and nothing else (no HTTP, no detokenizer); its ranks meet node
 * 0's over tcp.  It stops when node 0 stops them (their control group tells
 * them), on SIGTERM/SIGINT (it kills them), or when one dies (exit 1: the
 * other nodes' ranks then time out in their collectives and node 0 stops
 * too). */
static int s_node_main (rx_server_t *s, struct rx_boot *boot)
{
    struct rx_err err = { 0 };
    sigset_t set;
    sigemptyset (&set);
    sigaddset (&set, SIGCHLD);
    sigaddset (&set, SIGTERM);
    sigaddset (&set, SIGINT);
    sigprocmask (SIG_BLOCK, &set, NULL);   /* rx_child_spawn unblocks them in the children */
    int code = 1;
    if (!(s->ipc = rx_ipc_create ("radixd", &err)) ||
        s_spawn_children (s, boot, rx_ipc_run_dir (s->ipc), &err) != RX_OK) {
        rx_error ("%s", err.msg);
        goto out;
    }
    rx_info ("ready: node %d of %d runs ranks %d..%d of tp_size %d, control plane tcp://%s:%d",
             s->topo.node_rank, s->topo.nnodes, s->topo.first, s->topo.first + s->topo.n_local - 1,
             s->topo.tp_size, s->topo.dist_host, s->topo.dist_port);
    for (;;) {
        int sig = sigwaitinfo (&set, NULL);
        if (sig == SIGTERM || sig == SIGINT) {
            rx_info ("signal %d: stopping this node's ranks", sig);
            code = 0;
            break;
        }
        if (sig != SIGCHLD) continue;
        if (!s_reap_all (s)) continue;
        struct s_kid *c = s_pick_cause (s, 0);
        if (c && !s_death_foreign_signal (c)) {
            s_wait_for_signalled (s);
            c = s_pick_cause (s, 0);
        }
        char why[256];
        if (c) {
            s_report_cause (c, "stopping this node", why, sizeof why);
            c->dead_pid = 0;
        }
        s_report_rest (s, 1);
        if (c) break;
        if (!s_kids_alive (s)) {
            code = 0;
            break;
        }
    }
out:
    s_kill_kids (s, "");
    for (size_t i = 0; i < s->n_kids; i++)
        if (s->kids[i].pid > 0) waitpid (s->kids[i].pid, NULL, 0);
    free (s->kids);
    rx_ipc_destroy (&s->ipc);
    if (code == 0) rx_info ("stopped");
    return code;
}

int rx_server_main (struct rx_boot *boot)
{
    static const double lat_b[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 };
    static const double itl_b[] = { 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5 };
    rx_server_t S, *s = &S;
    memset (s, 0, sizeof *s);
    s->boot = boot;
    s->conf = boot->conf;
    s->host = rx_conf_str (s->conf, "server", "host", "127.0.0.1");
    s->port = (int) rx_conf_int (s->conf, "server", "port", 30000);
    s->api_key = rx_conf_str (s->conf, "server", "api_key", NULL);
    s->admin_key = rx_conf_str (s->conf, "server", "admin_api_key", NULL);
    s->cors = rx_conf_str (s->conf, "server", "cors_allow_origins", NULL);
    s->max_body = rx_conf_size (s->conf, "server", "max_body_size", 8u << 20);
    s->max_header = rx_conf_size (s->conf, "server", "max_header_size", 64u << 10);
    s->watchdog = rx_conf_float (s->conf, "server", "watchdog_timeout", 300);
    s->shutdown_timeout = rx_conf_float (s->conf, "server", "shutdown_timeout", 30);
    s->started = (int64_t) time (NULL);
    rx_hist_init (&s->ttft, "radix_time_to_first_token_seconds", "Time from request arrival to its first output.",
                  lat_b, sizeof lat_b / sizeof *lat_b);
    rx_hist_init (&s->itl, "radix_inter_token_latency_seconds", "Time between two outputs of one request.",
                  itl_b, sizeof itl_b / sizeof *itl_b);
    rx_hist_init (&s->e2e, "radix_e2e_request_latency_seconds", "Time from request arrival to its last output.",
                  lat_b, sizeof lat_b / sizeof *lat_b);

    struct rx_err err = { 0 };
    int code = 1;
    struct s_child_arg ca = { .boot = boot };
    signal (SIGPIPE, SIG_IGN);
    if (rx_topo_from_conf (s->conf, &s->topo, &err) != RX_OK) {
        rx_error ("%s", err.msg);
        return 1;
    }
    if (s->topo.node_rank > 0) return s_node_main (s, boot);
    if (s_open_model (s, &err) != RX_OK) {
        rx_error ("%s", err.msg);
        goto out;
    }
    /* The event base and its signal events exist before the children, so
     * no SIGCHLD is lost. */
    if (!(s->base = event_base_new ())) {
        rx_error ("cannot create the event loop");
        goto out;
    }
    s->ev_term = evsignal_new (s->base, SIGTERM, s_on_signal, s);
    s->ev_int = evsignal_new (s->base, SIGINT, s_on_signal, s);
    s->ev_chld = evsignal_new (s->base, SIGCHLD, s_on_signal, s);
    s->ev_tick = event_new (s->base, -1, EV_PERSIST, s_on_tick, s);
    if (!s->ev_term || !s->ev_int || !s->ev_chld || !s->ev_tick || evsignal_add (s->ev_term, NULL) ||
        evsignal_add (s->ev_int, NULL) || evsignal_add (s->ev_chld, NULL)) {
        rx_error ("cannot set up signal handling");
        goto out;
    }
    /* Fork while this process has one thread: ZMQ starts its I/O threads
     * with the first socket, so the children are forked after the run
     * directory exists but before main binds its socket (they connect to
     * it and ZMQ retries until it is there).  A fork from a multithreaded
     * process can leave a lock held forever in the child. */
    if (!(s->ipc = rx_ipc_create ("radixd", &err))) {
        rx_error ("%s", err.msg);
        goto out;
    }
    ca.run_dir = rx_ipc_run_dir (s->ipc);
    if (s_spawn_children (s, boot, ca.run_dir, &err) != RX_OK) {
        rx_error ("%s", err.msg);
        goto out;
    }
    if (!(s->in = rx_ipc_bind (s->ipc, RX_IPC_PULL, RX_SOCK_MAIN, &err))) {
        rx_error ("%s", err.msg);
        goto out;
    }
    if (s->topo.world > 1)
        rx_info ("started %d scheduler rank(s) (tp_size %d, dp_size %d%s), the detokenizer%s; run directory %s",
                 s->topo.n_local, s->topo.tp_size, s->topo.dp_size, s->topo.nnodes > 1 ? ", this node's share" : "",
                 s->topo.dp_size > 1 ? " and the DP controller" : "", ca.run_dir);
    else
        rx_info ("started the scheduler (pid %d) and the detokenizer (pid %d); run directory %s",
                 (int) s->sched_pid, (int) s->kids[0].pid, ca.run_dir);
    if (!(s->to_sched = rx_ipc_connect (s->ipc, RX_IPC_PUSH, RX_SOCK_SCHED, &err))) {
        rx_error ("%s", err.msg);
        goto out;
    }
    int zfd = rx_ipc_sock_fd (s->in);
    s->ev_zmq = zfd >= 0 ? event_new (s->base, zfd, EV_READ | EV_PERSIST, s_on_zmq, s) : NULL;
    struct timeval tick = { 0, S_TICK_MS * 1000 };
    if (!s->ev_zmq || event_add (s->ev_zmq, NULL) || event_add (s->ev_tick, &tick)) {
        rx_error ("cannot watch the IPC socket");
        goto out;
    }
    event_base_dispatch (s->base);
    code = s->exit_code;

out:
    if (s->http) {
        s_fail_all (s, "the server is stopping");
        evhttp_free (s->http);
        s->http = NULL;
    }
    s_stop_children (s);
    if (s->ev_zmq) event_free (s->ev_zmq);
    if (s->ev_tick) event_free (s->ev_tick);
    if (s->ev_term) event_free (s->ev_term);
    if (s->ev_int) event_free (s->ev_int);
    if (s->ev_chld) event_free (s->ev_chld);
    if (s->base) event_base_free (s->base);
    rx_heartbeat_close (&s->hb);
    rx_ipc_destroy (&s->ipc);
    if (s->have_chat) rx_chat_template_fini (&s->chat);
    rx_tokenizer_free (&s->tok);
    rx_gguf_close (&s->gguf);
    free (s->served_name);
    free (s->model_path_buf);
    free (s->kids);
    free (s->eplb.balancedness);
    if (code == 0) rx_info ("stopped");
    return code;
}
