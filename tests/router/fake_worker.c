/* tests/router/fake_worker.c -- a fast fake radixd worker for the router's
 * tests and benchmarks.
 *
 * It speaks just enough of radixd's HTTP API for radix-router (and
 * sgl-router) to route to it -- GET /health, GET /v1/models, POST
 * /v1/completions, /v1/chat/completions and /generate, non-streamed and
 * SSE-streamed, OpenAI-shaped -- and answers at once, without a model, so a
 * benchmark measures the router and not the worker.  Every answer says who
 * answered: the header "X-Worker: NAME" and a "worker" field in every JSON
 * body and stream chunk.
 *
 * Faults are injected by command-line flags (the initial state) and by
 * POST /_control with a JSON object of the same settings at run time:
 *
 *   delay_ms N            wait N ms before answering (before the first chunk)
 *   chunks N              stream chunks / completion tokens when the request
 *                         gives no max_tokens (default 4)
 *   chunk_interval_ms N   gap between stream chunks (default 0: all at once)
 *   fail_status S         answer the next fail_count API requests with HTTP S
 *   fail_count N          (an OpenAI-shaped error); S = 0 closes the
 *                         connection without an answer instead
 *   health_status S       what GET /health answers (default 200)
 *   hang true|false       accept API requests and never answer them
 *   hang_health true|false   the same for GET /health
 *   close_after_chunks K  streams: send K chunks, then cut the connection
 *                         (no terminating chunk, no [DONE]); -1 = off
 *   die_after N           exit(3) on receiving API request N+1, without an
 *                         answer (a crash); -1 = off
 *   die true              exit(3) now (the control request gets no answer)
 *   reset_stats true      zero the counters below
 *
 * A request body may carry per-request overrides, which a router forwards
 * untouched: "fake_delay_ms", "fake_interval_ms" (and max_tokens sets the
 * number of chunks).
 *
 * GET /_stats answers the counters as JSON: requests (API requests received,
 * counted on arrival, before the body is even parsed: "bad JSON never
 * reached a worker" is requests == 0), by_path, bad_json, health, models,
 * inflight (API requests accepted and not finished: a hung or streaming
 * request whose client went away leaves it), completed, injected_failures,
 * last_body (the last API request body, up to 64 KiB).
 *
 * It prints "fake-worker NAME ready on http://HOST:PORT" on stdout when it
 * listens (--port 0 picks a free port and the line names it).
 *
 * Single-threaded on libevent's evhttp, like the router it tests. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <jansson.h>

#define S_LAST_BODY_MAX (64 * 1024)
#define S_MAX_CHUNKS    100000

enum s_kind { S_COMPLETIONS, S_CHAT, S_GENERATE };

/* The injectable settings (flags at start, POST /_control later). */
struct s_conf {
    long delay_ms;
    long chunks;
    long chunk_interval_ms;
    long fail_status;
    long fail_count;
    long health_status;
    int  hang;
    int  hang_health;
    long close_after_chunks;
    long die_after;
};

struct s_job;

struct s_fw {
    struct event_base *base;
    struct evhttp *http;
    struct event *sweep;        /* periodic check for vanished clients */
    const char *name;
    const char *model;
    int quiet;
    struct s_conf c;
    /* counters (GET /_stats) */
    unsigned long requests, bad_json, health, models, completed, injected;
    unsigned long by_path[3];
    unsigned long seq;
    char *last_body;
    struct s_job *jobs;         /* accepted, unfinished API requests */
    long inflight;
};

/* One accepted API request until its answer is complete (or its client
 * is gone).  Owns nothing of libevent's but the timer. */
struct s_job {
    struct s_fw *fw;
    struct evhttp_request *req;
    struct event *timer;
    struct s_job *prev, *next;
    enum s_kind kind;
    int stream;
    int started;                /* reply head sent */
    int include_usage;
    int hang;                   /* 1: never answered; 2: cutting the connection */
    int counted;                /* an API request (inflight) rather than a health check */
    long chunks, sent, interval_ms, close_after;
    long prompt_tokens;
    unsigned long id;
    char gen_text[64];          /* /generate streams the cumulative text: its tail */
};

static const char *const s_paths[3] = { "/v1/completions", "/v1/chat/completions", "/generate" };

static void s_die (const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    fputs ("fake-worker: ", stderr);
    vfprintf (stderr, fmt, ap);
    fputc ('\n', stderr);
    va_end (ap);
    exit (2);
}

/* ------------------------------------------------------------ replies */

static void s_headers (struct s_fw *fw, struct evhttp_request *req, const char *ctype)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers (req);
    evhttp_add_header (h, "Content-Type", ctype);
    evhttp_add_header (h, "X-Worker", fw->name);
}

static void s_reply_json (struct s_fw *fw, struct evhttp_request *req, int status, const char *body)
{
    struct evbuffer *b = evbuffer_new ();
    evbuffer_add (b, body, strlen (body));
    s_headers (fw, req, "application/json");
    evhttp_send_reply (req, status, NULL, b);
    evbuffer_free (b);
}

static void s_reply_error (struct s_fw *fw, struct evhttp_request *req, int status, const char *msg)
{
    char body[512];
    /* msg is ours: no characters that need JSON escaping */
    snprintf (body, sizeof body,
              "{\"error\":{\"message\":\"%s (fake worker %s)\",\"type\":\"%s\",\"param\":null,"
              "\"code\":%d},\"worker\":\"%s\"}",
              msg, fw->name, status >= 500 ? "server_error" : "invalid_request_error", status, fw->name);
    s_reply_json (fw, req, status, body);
}

/* ------------------------------------------------------------ jobs */

static void s_job_unlink (struct s_job *j)
{
    struct s_fw *fw = j->fw;
    if (j->prev) j->prev->next = j->next; else fw->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    if (j->counted) fw->inflight--;
}

static void s_job_free (struct s_job *j)
{
    s_job_unlink (j);
    if (j->timer) event_free (j->timer);
    free (j);
}

static void s_on_close (struct evhttp_connection *c, void *arg);

static void s_forget_conn (struct evhttp_request *req)
{
    struct evhttp_connection *c = evhttp_request_get_connection (req);
    if (c) evhttp_connection_set_closecb (c, NULL, NULL);
}

/* The client went away while j was unfinished.  When libevent detached
 * the request (a failed write or read: evcon is NULL now) it is ours to
 * free; when the connection itself is being freed (our sweep) libevent
 * frees the still attached request. */
static void s_on_close (struct evhttp_connection *c, void *arg)
{
    struct s_job *j = arg;
    if (evhttp_request_get_connection (j->req) == NULL) evhttp_send_reply_end (j->req);
    s_job_free (j);
}

/* j's answer is complete: detach from the connection (which lives on for
 * keep-alive) and free j. */
static void s_job_done (struct s_job *j)
{
    j->fw->completed++;
    s_job_free (j);
}

static void s_usage_json (char *buf, size_t n, const struct s_job *j, long completion)
{
    snprintf (buf, n,
              "{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,\"total_tokens\":%ld,"
              "\"prompt_tokens_details\":{\"cached_tokens\":0}}",
              j->prompt_tokens, completion, j->prompt_tokens + completion);
}

/* The non-streamed answer, whole. */
static void s_answer_full (struct s_job *j)
{
    struct s_fw *fw = j->fw;
    struct evbuffer *b = evbuffer_new ();
    struct evbuffer *text = evbuffer_new ();
    for (long i = 0; i < j->chunks; i++) evbuffer_add_printf (text, "t%ld ", i);
    size_t tl = evbuffer_get_length (text);
    const char *t = (const char *) evbuffer_pullup (text, -1);
    char usage[256];
    s_usage_json (usage, sizeof usage, j, j->chunks);
    long now = (long) time (NULL);
    switch (j->kind) {
    case S_COMPLETIONS:
        evbuffer_add_printf (b, "{\"id\":\"cmpl-%s-%lu\",\"object\":\"text_completion\",\"created\":%ld,"
                             "\"model\":\"%s\",\"worker\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"%.*s\","
                             "\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":%s}",
                             fw->name, j->id, now, fw->model, fw->name, (int) tl, t ? t : "", usage);
        break;
    case S_CHAT:
        evbuffer_add_printf (b, "{\"id\":\"chatcmpl-%s-%lu\",\"object\":\"chat.completion\",\"created\":%ld,"
                             "\"model\":\"%s\",\"worker\":\"%s\",\"choices\":[{\"index\":0,\"message\":"
                             "{\"role\":\"assistant\",\"content\":\"%.*s\"},\"logprobs\":null,"
                             "\"finish_reason\":\"length\"}],\"usage\":%s}",
                             fw->name, j->id, now, fw->model, fw->name, (int) tl, t ? t : "", usage);
        break;
    case S_GENERATE:
        evbuffer_add_printf (b, "{\"text\":\"%.*s\",\"worker\":\"%s\",\"meta_info\":{\"id\":\"%s-%lu\","
                             "\"prompt_tokens\":%ld,\"completion_tokens\":%ld,\"cached_tokens\":0,"
                             "\"finish_reason\":{\"type\":\"length\",\"length\":%ld}}}",
                             (int) tl, t ? t : "", fw->name, fw->name, j->id, j->prompt_tokens,
                             j->chunks, j->chunks);
        break;
    }
    evbuffer_free (text);
    s_forget_conn (j->req);
    s_headers (fw, j->req, "application/json");
    evhttp_send_reply (j->req, 200, NULL, b);
    evbuffer_free (b);
    s_job_done (j);
}

/* One SSE event for chunk i of j (i == j->chunks: the finish chunk). */
static void s_event (struct s_job *j, struct evbuffer *b, long i)
{
    struct s_fw *fw = j->fw;
    int last = i == j->chunks - 1;
    long now = (long) time (NULL);
    switch (j->kind) {
    case S_COMPLETIONS:
        evbuffer_add_printf (b, "data: {\"id\":\"cmpl-%s-%lu\",\"object\":\"text_completion\",\"created\":%ld,"
                             "\"model\":\"%s\",\"worker\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"t%ld \","
                             "\"logprobs\":null,\"finish_reason\":%s}]}\n\n",
                             fw->name, j->id, now, fw->model, fw->name, i, last ? "\"length\"" : "null");
        break;
    case S_CHAT:
        evbuffer_add_printf (b, "data: {\"id\":\"chatcmpl-%s-%lu\",\"object\":\"chat.completion.chunk\","
                             "\"created\":%ld,\"model\":\"%s\",\"worker\":\"%s\",\"choices\":[{\"index\":0,"
                             "\"delta\":{%s\"content\":\"t%ld \"},\"logprobs\":null,\"finish_reason\":%s}]}\n\n",
                             fw->name, j->id, now, fw->model, fw->name,
                             i == 0 ? "\"role\":\"assistant\"," : "", i, last ? "\"length\"" : "null");
        break;
    case S_GENERATE: {
        /* SGLang's /generate stream: each event carries the text so far;
         * ours keeps only the newest token to stay O(1) per chunk. */
        snprintf (j->gen_text, sizeof j->gen_text, "t%ld ", i);
        evbuffer_add_printf (b, "data: {\"text\":\"%s\",\"worker\":\"%s\",\"index\":%ld,\"meta_info\":"
                             "{\"id\":\"%s-%lu\",\"prompt_tokens\":%ld,\"completion_tokens\":%ld,"
                             "\"finish_reason\":%s}}\n\n",
                             j->gen_text, fw->name, i, fw->name, j->id, j->prompt_tokens, i + 1,
                             last ? "{\"type\":\"length\"}" : "null");
        break;
    }
    }
}

static void s_stream_end (struct s_job *j)
{
    struct evbuffer *b = evbuffer_new ();
    if (j->include_usage && j->kind != S_GENERATE) {
        char usage[256];
        s_usage_json (usage, sizeof usage, j, j->chunks);
        evbuffer_add_printf (b, "data: {\"id\":\"%s-%lu\",\"object\":\"%s\",\"model\":\"%s\",\"worker\":\"%s\","
                             "\"choices\":[],\"usage\":%s}\n\n",
                             j->fw->name, j->id, j->kind == S_CHAT ? "chat.completion.chunk" : "text_completion",
                             j->fw->model, j->fw->name, usage);
    }
    evbuffer_add_printf (b, "data: [DONE]\n\n");
    evhttp_send_reply_chunk (j->req, b);
    evbuffer_free (b);
    s_forget_conn (j->req);
    evhttp_send_reply_end (j->req);
    s_job_done (j);
}

/* Cut j's connection mid-stream: what was sent stays sent, the stream has
 * no end.  Ending the reply after the shutdown makes libevent's write of
 * the last chunk fail, which frees the connection and the request. */
static void s_cut (struct s_job *j)
{
    struct evhttp_connection *c = evhttp_request_get_connection (j->req);
    if (c) {
        evhttp_connection_set_closecb (c, NULL, NULL);
        struct bufferevent *bev = evhttp_connection_get_bufferevent (c);
        evutil_socket_t fd = bev ? bufferevent_getfd (bev) : -1;
        if (fd >= 0) shutdown (fd, SHUT_RDWR);
    }
    evhttp_send_reply_end (j->req);
    s_job_free (j);
}

static void s_on_timer (evutil_socket_t fd, short what, void *arg);

/* Register req as unfinished: listed (for the sweep), watched (its
 * connection's close callback), with a timer for what comes next. */
static struct s_job *s_job_new (struct s_fw *fw, struct evhttp_request *req, int counted)
{
    struct s_job *j = calloc (1, sizeof *j);
    if (!j) s_die ("out of memory");
    j->fw = fw;
    j->req = req;
    j->counted = counted;
    j->close_after = -1;
    j->timer = evtimer_new (fw->base, s_on_timer, j);
    if (!j->timer) s_die ("evtimer_new failed");
    j->next = fw->jobs;
    if (fw->jobs) fw->jobs->prev = j;
    fw->jobs = j;
    if (counted) fw->inflight++;
    evhttp_connection_set_closecb (evhttp_request_get_connection (req), s_on_close, j);
    return j;
}

static void s_arm (struct s_job *j, long ms)
{
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    evtimer_add (j->timer, &tv);
}

/* Send chunks until the next one is due later (or the stream is over). */
static void s_stream_more (struct s_job *j)
{
    if (!j->started) {
        s_headers (j->fw, j->req, "text/event-stream");
        evhttp_add_header (evhttp_request_get_output_headers (j->req), "Cache-Control", "no-cache");
        evhttp_send_reply_start (j->req, 200, "OK");
        j->started = 1;
    }
    struct evbuffer *b = evbuffer_new ();
    while (j->sent < j->chunks) {
        if (j->close_after >= 0 && j->sent >= j->close_after) break;
        s_event (j, b, j->sent++);
        if (j->interval_ms > 0) break;
    }
    if (evbuffer_get_length (b)) evhttp_send_reply_chunk (j->req, b);
    evbuffer_free (b);
    if (j->close_after >= 0 && j->sent >= j->close_after) {
        /* let the event loop write what was sent before cutting */
        j->hang = 2;
        s_arm (j, 30);
        return;
    }
    if (j->sent >= j->chunks) {
        s_stream_end (j);
        return;
    }
    s_arm (j, j->interval_ms);
}

static void s_on_timer (evutil_socket_t fd, short what, void *arg)
{
    struct s_job *j = arg;
    if (j->hang == 2) { s_cut (j); return; }
    if (j->stream) s_stream_more (j);
    else s_answer_full (j);
}

/* ------------------------------------------------------------ handlers */

static long s_words (const char *s)
{
    long n = 0;
    int in = 0;
    for (; s && *s; s++) {
        int sp = *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r';
        if (!sp && !in) n++;
        in = !sp;
    }
    return n;
}

static long s_json_long (json_t *o, const char *key, long dflt, long lo, long hi)
{
    json_t *v = json_object_get (o, key);
    if (!json_is_integer (v)) return dflt;
    json_int_t x = json_integer_value (v);
    return x < lo ? lo : x > hi ? hi : (long) x;
}

/* Rough prompt size in words: enough for usage numbers. */
static long s_prompt_tokens (json_t *root, enum s_kind kind)
{
    if (kind == S_CHAT) {
        json_t *msgs = json_object_get (root, "messages");
        size_t i;
        json_t *m;
        long n = 0;
        json_array_foreach (msgs, i, m) n += s_words (json_string_value (json_object_get (m, "content")));
        return n;
    }
    json_t *p = json_object_get (root, kind == S_GENERATE ? "text" : "prompt");
    if (json_is_array (p)) p = json_array_get (p, 0);
    return s_words (json_string_value (p));
}

static void s_api (struct s_fw *fw, struct evhttp_request *req, enum s_kind kind)
{
    fw->requests++;
    fw->by_path[kind]++;
    if (fw->c.die_after >= 0 && (long) fw->requests > fw->c.die_after) {
        if (!fw->quiet) fprintf (stderr, "fake-worker %s: dying on request %lu\n", fw->name, fw->requests);
        _exit (3);
    }
    struct evbuffer *in = evhttp_request_get_input_buffer (req);
    size_t len = evbuffer_get_length (in);
    const char *body = (const char *) evbuffer_pullup (in, -1);
    size_t keep = len < S_LAST_BODY_MAX ? len : S_LAST_BODY_MAX;
    char *lb = realloc (fw->last_body, keep + 1);
    if (lb) {
        memcpy (lb, body ? body : "", keep);
        lb[keep] = '\0';
        fw->last_body = lb;
    }
    if (fw->c.fail_count > 0) {
        fw->c.fail_count--;
        fw->injected++;
        if (fw->c.fail_status == 0) {
            /* A connection that dies without an answer.  Freeing it inside
             * libevent's request callback is not safe: shut the socket now
             * (the client sees the close at once) and let the sweep, which
             * finds it closed, free it. */
            struct s_job *j = s_job_new (fw, req, 0);
            j->hang = 1;
            struct bufferevent *bev = evhttp_connection_get_bufferevent (evhttp_request_get_connection (req));
            evutil_socket_t fd = bev ? bufferevent_getfd (bev) : -1;
            if (fd >= 0) shutdown (fd, SHUT_RDWR);
            return;
        }
        s_reply_error (fw, req, (int) fw->c.fail_status, "injected failure");
        return;
    }
    json_error_t jerr;
    json_t *root = json_loadb (body ? body : "", len, 0, &jerr);
    if (!json_is_object (root)) {
        json_decref (root);
        fw->bad_json++;
        s_reply_error (fw, req, 400, "request body is not a JSON object");
        return;
    }
    struct s_job *j = s_job_new (fw, req, 1);
    j->kind = kind;
    j->id = ++fw->seq;
    j->stream = json_is_true (json_object_get (root, "stream"));
    json_t *so = json_object_get (root, "stream_options");
    j->include_usage = json_is_true (json_object_get (so, "include_usage"));
    json_t *params = kind == S_GENERATE ? json_object_get (root, "sampling_params") : root;
    long mt = s_json_long (params, kind == S_GENERATE ? "max_new_tokens" : "max_tokens", -1, 1, S_MAX_CHUNKS);
    if (mt < 0 && kind == S_CHAT) mt = s_json_long (root, "max_completion_tokens", -1, 1, S_MAX_CHUNKS);
    j->chunks = mt > 0 ? mt : fw->c.chunks;
    j->interval_ms = s_json_long (root, "fake_interval_ms", fw->c.chunk_interval_ms, 0, 3600000);
    long delay = s_json_long (root, "fake_delay_ms", fw->c.delay_ms, 0, 3600000);
    j->close_after = fw->c.close_after_chunks;
    j->prompt_tokens = s_prompt_tokens (root, kind);
    j->hang = fw->c.hang;
    json_decref (root);
    if (j->hang) return;                      /* the sweep notices the client leaving */
    if (delay > 0) { s_arm (j, delay); return; }
    if (j->stream) s_stream_more (j);
    else s_answer_full (j);
}

static void s_health (struct s_fw *fw, struct evhttp_request *req)
{
    fw->health++;
    if (fw->c.hang_health) {                  /* never answered; the sweep frees it */
        s_job_new (fw, req, 0)->hang = 1;
        return;
    }
    if (fw->c.health_status == 200) s_reply_json (fw, req, 200, "{\"status\":\"ok\"}");
    else s_reply_error (fw, req, (int) fw->c.health_status, "injected health failure");
}

static void s_models (struct s_fw *fw, struct evhttp_request *req)
{
    char body[512];
    fw->models++;
    snprintf (body, sizeof body,
              "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":0,"
              "\"owned_by\":\"fake\",\"max_model_len\":4096}],\"worker\":\"%s\"}", fw->model, fw->name);
    s_reply_json (fw, req, 200, body);
}

static void s_stats (struct s_fw *fw, struct evhttp_request *req)
{
    json_t *o = json_pack ("{s:s, s:I, s:{s:I, s:I, s:I}, s:I, s:I, s:I, s:I, s:I, s:I}",
                           "name", fw->name, "requests", (json_int_t) fw->requests,
                           "by_path", s_paths[0], (json_int_t) fw->by_path[0],
                           s_paths[1], (json_int_t) fw->by_path[1],
                           s_paths[2], (json_int_t) fw->by_path[2],
                           "bad_json", (json_int_t) fw->bad_json, "health", (json_int_t) fw->health,
                           "models", (json_int_t) fw->models, "inflight", (json_int_t) fw->inflight,
                           "completed", (json_int_t) fw->completed,
                           "injected_failures", (json_int_t) fw->injected);
    /* json_string refuses a body that is not UTF-8 (or has a NUL): null then */
    json_t *lb = fw->last_body ? json_string (fw->last_body) : NULL;
    json_object_set_new (o, "last_body", lb ? lb : json_null ());
    char *s = json_dumps (o, JSON_COMPACT);
    json_decref (o);
    s_reply_json (fw, req, 200, s ? s : "{}");
    free (s);
}

/* Apply one setting from a JSON value; -1 when the key is unknown or the
 * value has the wrong type. */
static int s_set (struct s_conf *c, const char *k, json_t *v)
{
    static const struct { const char *name; size_t off; long lo, hi; } nums[] = {
        { "delay_ms", offsetof (struct s_conf, delay_ms), 0, 3600000 },
        { "chunks", offsetof (struct s_conf, chunks), 1, S_MAX_CHUNKS },
        { "chunk_interval_ms", offsetof (struct s_conf, chunk_interval_ms), 0, 3600000 },
        { "fail_status", offsetof (struct s_conf, fail_status), 0, 599 },
        { "fail_count", offsetof (struct s_conf, fail_count), 0, LONG_MAX },
        { "health_status", offsetof (struct s_conf, health_status), 100, 599 },
        { "close_after_chunks", offsetof (struct s_conf, close_after_chunks), -1, S_MAX_CHUNKS },
        { "die_after", offsetof (struct s_conf, die_after), -1, LONG_MAX },
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (strcmp (k, nums[i].name)) continue;
        if (!json_is_integer (v)) return -1;
        json_int_t x = json_integer_value (v);
        if (x < nums[i].lo || x > nums[i].hi) return -1;
        *(long *) ((char *) c + nums[i].off) = (long) x;
        return 0;
    }
    if (!strcmp (k, "hang") || !strcmp (k, "hang_health")) {
        if (!json_is_boolean (v)) return -1;
        *(!strcmp (k, "hang") ? &c->hang : &c->hang_health) = json_is_true (v);
        return 0;
    }
    return -1;
}

static void s_control (struct s_fw *fw, struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer (req);
    json_error_t jerr;
    json_t *root = json_loadb ((const char *) evbuffer_pullup (in, -1), evbuffer_get_length (in), 0, &jerr);
    if (!json_is_object (root)) {
        json_decref (root);
        s_reply_error (fw, req, 400, "POST /_control wants a JSON object");
        return;
    }
    struct s_conf c = fw->c;
    const char *k;
    json_t *v;
    int die = 0, reset = 0;
    json_object_foreach (root, k, v) {
        if (!strcmp (k, "die")) { die = json_is_true (v); continue; }
        if (!strcmp (k, "reset_stats")) { reset = json_is_true (v); continue; }
        if (s_set (&c, k, v) < 0) {
            char msg[160];
            snprintf (msg, sizeof msg, "POST /_control: unknown key or bad value for '%.60s'", k);
            for (char *p = msg; *p; p++) if (*p == '"' || *p == '\\' || (unsigned char) *p < 0x20) *p = '?';
            json_decref (root);
            s_reply_error (fw, req, 400, msg);
            return;
        }
    }
    json_decref (root);
    if (die) {
        if (!fw->quiet) fprintf (stderr, "fake-worker %s: dying on request\n", fw->name);
        _exit (3);
    }
    fw->c = c;
    if (reset) {
        fw->requests = fw->bad_json = fw->health = fw->models = fw->completed = fw->injected = 0;
        memset (fw->by_path, 0, sizeof fw->by_path);
    }
    s_reply_json (fw, req, 200, "{\"ok\":true}");
}

static void s_on_request (struct evhttp_request *req, void *arg)
{
    struct s_fw *fw = arg;
    const char *uri = evhttp_request_get_uri (req);
    char path[256];
    size_t n = strcspn (uri, "?");
    if (n >= sizeof path) n = sizeof path - 1;
    memcpy (path, uri, n);
    path[n] = '\0';
    enum evhttp_cmd_type m = evhttp_request_get_command (req);
    if (m == EVHTTP_REQ_GET) {
        if (!strcmp (path, "/health") || !strcmp (path, "/health_generate")) { s_health (fw, req); return; }
        if (!strcmp (path, "/v1/models")) { s_models (fw, req); return; }
        if (!strcmp (path, "/_stats")) { s_stats (fw, req); return; }
        /* what sgl-router asks a worker when it is registered */
        if (!strcmp (path, "/get_model_info") || !strcmp (path, "/model_info")) {
            char body[256];
            snprintf (body, sizeof body, "{\"model_path\":\"%s\",\"is_generation\":true,\"worker\":\"%s\"}",
                      fw->model, fw->name);
            s_reply_json (fw, req, 200, body);
            return;
        }
        if (!strcmp (path, "/get_server_info") || !strcmp (path, "/server_info")) {
            s_reply_json (fw, req, 200, "{\"dp_size\":1,\"tp_size\":1}");
            return;
        }
    } else if (m == EVHTTP_REQ_POST) {
        for (int k = 0; k < 3; k++)
            if (!strcmp (path, s_paths[k])) { s_api (fw, req, (enum s_kind) k); return; }
        if (!strcmp (path, "/_control")) { s_control (fw, req); return; }
    }
    if (!fw->quiet) fprintf (stderr, "fake-worker %s: 404 for %s %s\n", fw->name,
                             m == EVHTTP_REQ_GET ? "GET" : m == EVHTTP_REQ_POST ? "POST" : "?", uri);
    s_reply_error (fw, req, 404, "no such endpoint");
}

/* libevent notices a closed connection only when it writes to it: peek at
 * the sockets of requests that have not answered yet (hung, delayed), so
 * "inflight" drops when the router gives up on them. */
static void s_on_sweep (evutil_socket_t fd_unused, short what, void *arg)
{
    struct s_fw *fw = arg;
    struct s_job *next;
    for (struct s_job *j = fw->jobs; j; j = next) {
        next = j->next;
        if (j->started) continue;
        struct evhttp_connection *c = evhttp_request_get_connection (j->req);
        struct bufferevent *bev = c ? evhttp_connection_get_bufferevent (c) : NULL;
        evutil_socket_t fd = bev ? bufferevent_getfd (bev) : -1;
        if (fd < 0) continue;
        char b;
        ssize_t k = recv (fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            evhttp_connection_free (c);       /* s_on_close frees j */
    }
}

/* ------------------------------------------------------------ main */

static long s_num (const char *opt, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    long x = strtol (v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        s_die ("--%s %s: want an integer in %ld..%ld", opt, v, lo, hi);
    return x;
}

static void s_usage (FILE *f)
{
    fputs ("usage: fake-worker [--host H] [--port P] [--name NAME] [--model ID] [--quiet]\n"
           "                   [--delay-ms N] [--chunks N] [--chunk-interval-ms N]\n"
           "                   [--fail-status S --fail-count N] [--health-status S]\n"
           "                   [--hang] [--hang-health] [--close-after-chunks K] [--die-after N]\n"
           "A fake radixd worker for the router's tests (see tests/router/fake_worker.c).\n", f);
}

int main (int argc, char **argv)
{
    static const struct option opts[] = {
        { "host", required_argument, 0, 'H' }, { "port", required_argument, 0, 'p' },
        { "name", required_argument, 0, 'n' }, { "model", required_argument, 0, 'm' },
        { "delay-ms", required_argument, 0, 'd' }, { "chunks", required_argument, 0, 'c' },
        { "chunk-interval-ms", required_argument, 0, 'i' },
        { "fail-status", required_argument, 0, 's' }, { "fail-count", required_argument, 0, 'f' },
        { "health-status", required_argument, 0, 'h' }, { "hang", no_argument, 0, 'g' },
        { "hang-health", no_argument, 0, 'G' }, { "close-after-chunks", required_argument, 0, 'k' },
        { "die-after", required_argument, 0, 'D' }, { "quiet", no_argument, 0, 'q' },
        { "help", no_argument, 0, '?' }, { 0, 0, 0, 0 }
    };
    struct s_fw fw = { 0 };
    const char *host = "127.0.0.1";
    long port = 0;
    fw.name = "w";
    fw.model = "fake-model";
    fw.c = (struct s_conf) { .chunks = 4, .health_status = 200, .close_after_chunks = -1, .die_after = -1 };
    int o;
    while ((o = getopt_long (argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'H': host = optarg; break;
        case 'p': port = s_num ("port", optarg, 0, 65535); break;
        case 'n': fw.name = optarg; break;
        case 'm': fw.model = optarg; break;
        case 'd': fw.c.delay_ms = s_num ("delay-ms", optarg, 0, 3600000); break;
        case 'c': fw.c.chunks = s_num ("chunks", optarg, 1, S_MAX_CHUNKS); break;
        case 'i': fw.c.chunk_interval_ms = s_num ("chunk-interval-ms", optarg, 0, 3600000); break;
        case 's': fw.c.fail_status = s_num ("fail-status", optarg, 0, 599); break;
        case 'f': fw.c.fail_count = s_num ("fail-count", optarg, 0, LONG_MAX); break;
        case 'h': fw.c.health_status = s_num ("health-status", optarg, 100, 599); break;
        case 'g': fw.c.hang = 1; break;
        case 'G': fw.c.hang_health = 1; break;
        case 'k': fw.c.close_after_chunks = s_num ("close-after-chunks", optarg, -1, S_MAX_CHUNKS); break;
        case 'D': fw.c.die_after = s_num ("die-after", optarg, -1, LONG_MAX); break;
        case 'q': fw.quiet = 1; break;
        default: s_usage (o == '?' && optopt == 0 && !strcmp (argv[optind - 1], "--help") ? stdout : stderr);
                 return o == '?' && !strcmp (argv[optind - 1], "--help") ? 0 : 2;
        }
    }
    if (optind != argc) { s_usage (stderr); return 2; }
    /* names and model ids go into JSON unescaped: keep them plain */
    for (const char *s = fw.name; *s; s++)
        if (!(isalnum ((unsigned char) *s) || strchr ("-_.:", *s))) s_die ("--name %s: use [A-Za-z0-9-_.:]", fw.name);
    for (const char *s = fw.model; *s; s++)
        if (!(isalnum ((unsigned char) *s) || strchr ("-_./:", *s))) s_die ("--model %s: use [A-Za-z0-9-_./:]", fw.model);
    signal (SIGPIPE, SIG_IGN);
    fw.base = event_base_new ();
    fw.http = fw.base ? evhttp_new (fw.base) : NULL;
    if (!fw.http) s_die ("cannot create the event loop");
    evhttp_set_allowed_methods (fw.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE);
    evhttp_set_max_body_size (fw.http, 64 * 1024 * 1024);
    evhttp_set_timeout (fw.http, 3600);
    evhttp_set_gencb (fw.http, s_on_request, &fw);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle (fw.http, host, (ev_uint16_t) port);
    if (!bs) s_die ("cannot listen on %s:%ld: %s", host, port, strerror (errno));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname (evhttp_bound_socket_get_fd (bs), (struct sockaddr *) &ss, &sl) < 0)
        s_die ("getsockname: %s", strerror (errno));
    int bound = ss.ss_family == AF_INET6 ? ntohs (((struct sockaddr_in6 *) &ss)->sin6_port)
                                         : ntohs (((struct sockaddr_in *) &ss)->sin_port);
    fw.sweep = event_new (fw.base, -1, EV_PERSIST, s_on_sweep, &fw);
    struct timeval tv = { 0, 100 * 1000 };
    event_add (fw.sweep, &tv);
    printf ("fake-worker %s ready on http://%s:%d\n", fw.name, host, bound);
    fflush (stdout);
    event_base_dispatch (fw.base);
    return 0;
}
