/* tests/unit/test_router.c -- radix-router's pure parts: worker URL
 * normalisation, the routing key of each endpoint, the health and breaker
 * state machines, the settings schema against conf/router.ini, and the
 * policy bookkeeping of the worker table (with the route-fixture_ll.so
 * test policy, built in tests/router-fixtures). */
#include <criterion/criterion.h>
#include <string.h>

#include <event2/event.h>

#include "../testutil.h"
#include "conf.h"
#include "loader.h"
#include "route_policy.h"
#include "routekey.h"
#include "router_settings.h"
#include "workers.h"

/* ------------------------------------------------------------ URLs */

static void s_norm_ok (const char *in, const char *want)
{
    char out[RX_WORKER_URL_MAX];
    struct rx_err err = { 0 };
    int rc = rx_worker_url_normalize (in, out, sizeof out, &err);
    cr_assert_eq (rc, RX_OK, "%s: %s", in, err.msg);
    cr_assert_str_eq (out, want, "%s", in);
}

static void s_norm_bad (const char *in, const char *why)
{
    char out[RX_WORKER_URL_MAX];
    struct rx_err err = { 0 };
    int rc = rx_worker_url_normalize (in, out, sizeof out, &err);
    cr_assert_eq (rc, RX_EINVAL, "%s was accepted as %s", in, out);
    cr_assert (strstr (err.msg, why), "%s: message \"%s\" lacks \"%s\"", in, err.msg, why);
}

Test (router_url, normalises)
{
    s_norm_ok ("http://127.0.0.1:30001", "http://127.0.0.1:30001");
    s_norm_ok ("http://127.0.0.1:30001/", "http://127.0.0.1:30001");
    s_norm_ok ("  HTTP://LocalHost:8080 ", "http://localhost:8080");
    s_norm_ok ("http://worker-3.example:80", "http://worker-3.example:80");
    s_norm_ok ("http://example", "http://example:80");
    s_norm_ok ("http://[::1]:30002", "http://[::1]:30002");
    s_norm_ok ("http://[::1]", "http://[::1]:80");
}

Test (router_url, refuses)
{
    s_norm_bad ("", "empty");
    s_norm_bad ("127.0.0.1:30001", "expected http://");
    s_norm_bad ("https://h:1", "https is not supported");
    s_norm_bad ("ftp://h:1", "expected http://");
    s_norm_bad ("http://:30001", "no host");
    s_norm_bad ("http://h:0", "out of range");
    s_norm_bad ("http://h:65536", "out of range");
    s_norm_bad ("http://h:", "empty port");
    s_norm_bad ("http://h:12x", "port has 'x'");
    s_norm_bad ("http://h:80/generate", "port has '/'");
    s_norm_bad ("http://h/generate", "the host has '/'");
    s_norm_bad ("http://u@h:80", "the host has '@'");
    s_norm_bad ("http://h?x=1", "the host has '?'");
    s_norm_bad ("http://[::1", "bad [IPv6] host");
    s_norm_bad ("http://[zz]:1", "bad [IPv6] host");
    s_norm_bad ("http://[::1]x", "expected :PORT");
}

/* ------------------------------------------------------------ routing keys */

static void s_key (int kind, const char *body, const char *want)
{
    struct rx_routekey_buf b = { 0 };
    const char *key;
    size_t klen;
    struct rx_api_error e;
    int rc = rx_routekey_extract (kind, body, strlen (body), &b, &key, &klen, &e);
    cr_assert_eq (rc, RX_OK, "%s: %s", body, e.message);
    cr_assert_eq (klen, strlen (want), "%s: key length %zu, want %zu", body, klen, strlen (want));
    cr_assert (!memcmp (key, want, klen), "%s: key \"%.*s\", want \"%s\"", body, (int) klen, key, want);
    rx_routekey_buf_fini (&b);
}

static void s_key_bad (int kind, const char *body, const char *code)
{
    struct rx_routekey_buf b = { 0 };
    const char *key;
    size_t klen;
    struct rx_api_error e;
    int rc = rx_routekey_extract (kind, body, strlen (body), &b, &key, &klen, &e);
    cr_assert_eq (rc, RX_EINVAL, "%s accepted", body);
    cr_assert_eq (e.status, 400);
    cr_assert_str_eq (e.code, code, "%s", body);
    rx_routekey_buf_fini (&b);
}

Test (router_key, per_endpoint)
{
    s_key (RX_ROUTEKEY_GENERATE, "{\"text\": \"The capital of France\", \"sampling_params\": {}}", "The capital of France");
    s_key (RX_ROUTEKEY_GENERATE, "{\"text\": [\"first\", \"second\"]}", "first");
    s_key (RX_ROUTEKEY_GENERATE, "{\"input_ids\": [1, 2, 3]}", "");
    s_key (RX_ROUTEKEY_COMPLETIONS, "{\"model\": \"m\", \"prompt\": \"once upon\"}", "once upon");
    s_key (RX_ROUTEKEY_COMPLETIONS, "{\"prompt\": [\"a b\"]}", "a b");
    s_key (RX_ROUTEKEY_COMPLETIONS, "{\"prompt\": [1, 2]}", "");
    s_key (RX_ROUTEKEY_COMPLETIONS, "{\"prompt\": 42}", "");
    s_key (RX_ROUTEKEY_CHAT,
           "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
           " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}, {\"type\": \"text\", \"text\": \"there\"}]},"
           " {\"role\": \"assistant\", \"content\": null}, {\"role\": \"user\", \"content\": \"again\"}]}",
           "be brief\nhi\nthere\nagain");
    s_key (RX_ROUTEKEY_CHAT, "{\"messages\": \"oops\"}", "");
    s_key (RX_ROUTEKEY_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u00e9t\\u00e9\"}]}", "\xc3\xa9t\xc3\xa9");
    s_key (RX_ROUTEKEY_NONE, "not json at all", "");
}

Test (router_key, embedded_nul_is_kept)
{
    struct rx_routekey_buf b = { 0 };
    const char *key;
    size_t klen;
    struct rx_api_error e;
    const char *body = "{\"text\": \"a\\u0000b\"}";
    cr_assert_eq (rx_routekey_extract (RX_ROUTEKEY_GENERATE, body, strlen (body), &b, &key, &klen, &e), RX_OK);
    cr_assert_eq (klen, 3);
    cr_assert (!memcmp (key, "a\0b", 3));
    rx_routekey_buf_fini (&b);
}

Test (router_key, bad_bodies)
{
    s_key_bad (RX_ROUTEKEY_GENERATE, "{\"text\": ", "invalid_json");
    s_key_bad (RX_ROUTEKEY_COMPLETIONS, "", "invalid_json");
    s_key_bad (RX_ROUTEKEY_CHAT, "[1, 2]", "invalid_type");
    s_key_bad (RX_ROUTEKEY_CHAT, "\"text\"", "invalid_type");
    s_key_bad (RX_ROUTEKEY_GENERATE, "{\"text\": \"\xff\"}", "invalid_json");
}

Test (router_key, buffer_is_reused)
{
    struct rx_routekey_buf b = { 0 };
    const char *key;
    size_t klen;
    struct rx_api_error e;
    char big[3000];
    memset (big, 'x', sizeof big);
    char body[3100];
    snprintf (body, sizeof body, "{\"text\": \"%.*s\"}", (int) sizeof big, big);
    cr_assert_eq (rx_routekey_extract (RX_ROUTEKEY_GENERATE, body, strlen (body), &b, &key, &klen, &e), RX_OK);
    cr_assert_eq (klen, sizeof big);
    char *p = b.p;
    const char *small = "{\"text\": \"y\"}";
    cr_assert_eq (rx_routekey_extract (RX_ROUTEKEY_GENERATE, small, strlen (small), &b, &key, &klen, &e), RX_OK);
    cr_assert_eq (b.p, p, "a smaller key must not reallocate");
    cr_assert_eq (klen, 1);
    rx_routekey_buf_fini (&b);
}

/* ------------------------------------------------------------ state machines */

static const struct rx_workers_cfg s_cfg = {
    .health_interval = 10, .health_timeout = 5, .health_endpoint = "/health",
    .failure_threshold = 3, .success_threshold = 2,
    .breaker_failures = 5, .breaker_successes = 2, .breaker_timeout = 30,
};

Test (router_health, first_check_decides_then_thresholds)
{
    struct rx_worker w = { 0 };
    rx_worker_health_result (&s_cfg, &w, 1);
    cr_assert (w.healthy && w.checked, "a first pass makes it healthy at once");
    rx_worker_health_result (&s_cfg, &w, 0);
    rx_worker_health_result (&s_cfg, &w, 0);
    cr_assert (w.healthy, "2 failures < failure_threshold 3");
    rx_worker_health_result (&s_cfg, &w, 1);
    cr_assert_eq (w.hc_failures, 0, "a pass resets the failure streak");
    rx_worker_health_result (&s_cfg, &w, 0);
    rx_worker_health_result (&s_cfg, &w, 0);
    rx_worker_health_result (&s_cfg, &w, 0);
    cr_assert (!w.healthy, "3 consecutive failures");
    cr_assert_eq (w.hc_failures, 3);
    rx_worker_health_result (&s_cfg, &w, 1);
    cr_assert (!w.healthy, "1 pass < success_threshold 2");
    rx_worker_health_result (&s_cfg, &w, 0);
    rx_worker_health_result (&s_cfg, &w, 1);
    cr_assert (!w.healthy, "the success streak restarted");
    rx_worker_health_result (&s_cfg, &w, 1);
    cr_assert (w.healthy);

    struct rx_worker v = { 0 };
    rx_worker_health_result (&s_cfg, &v, 0);
    cr_assert (!v.healthy && v.checked, "a first failure leaves it unhealthy");
    rx_worker_health_result (&s_cfg, &v, 1);
    cr_assert (!v.healthy, "then it needs success_threshold passes");
    rx_worker_health_result (&s_cfg, &v, 1);
    cr_assert (v.healthy);
}

Test (router_breaker, closed_open_half_open_closed)
{
    struct rx_worker w = { .healthy = 1, .checked = 1 };
    for (int i = 0; i < 4; i++) rx_worker_breaker_result (&s_cfg, &w, 0, 100);
    cr_assert_eq (w.breaker, RX_BREAKER_CLOSED, "4 failures < breaker_failures 5");
    rx_worker_breaker_result (&s_cfg, &w, 1, 100);
    cr_assert_eq (w.br_failures, 0, "a success resets the streak");
    for (int i = 0; i < 5; i++) rx_worker_breaker_result (&s_cfg, &w, 0, 100 + i);
    cr_assert_eq (w.breaker, RX_BREAKER_OPEN);
    cr_assert (!rx_worker_up (&w), "an open breaker takes the worker out");
    cr_assert_eq (rx_worker_breaker_poll (&s_cfg, &w, 104 + 29.9), 0, "before breaker_timeout");
    cr_assert_eq (w.breaker, RX_BREAKER_OPEN);
    cr_assert_eq (rx_worker_breaker_poll (&s_cfg, &w, 104 + 30), 1);
    cr_assert_eq (w.breaker, RX_BREAKER_HALF_OPEN);
    cr_assert (rx_worker_up (&w));
    rx_worker_breaker_result (&s_cfg, &w, 0, 200);
    cr_assert_eq (w.breaker, RX_BREAKER_OPEN, "a failed trial opens it again");
    cr_assert_eq (rx_worker_breaker_poll (&s_cfg, &w, 229), 0, "the timeout restarts");
    cr_assert_eq (rx_worker_breaker_poll (&s_cfg, &w, 230), 1);
    rx_worker_breaker_result (&s_cfg, &w, 1, 231);
    cr_assert_eq (w.breaker, RX_BREAKER_HALF_OPEN, "1 success < breaker_successes 2");
    rx_worker_breaker_result (&s_cfg, &w, 1, 232);
    cr_assert_eq (w.breaker, RX_BREAKER_CLOSED);
    cr_assert_str_eq (rx_breaker_name (RX_BREAKER_HALF_OPEN), "half_open");
}

/* ------------------------------------------------------------ settings */

Test (router_settings, defaults)
{
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_new_empty ("(defaults)");
    cr_assert_eq (rx_conf_validate (c, rx_router_schema (), NULL, NULL, &err), RX_OK, "%s", err.msg);
    struct rx_router_settings s;
    cr_assert_eq (rx_router_settings_load (c, &s, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq (s.host, "127.0.0.1");
    cr_assert_eq (s.port, 31000);
    cr_assert_null (s.api_key);
    cr_assert_eq (s.max_body_size, 8u << 20);
    cr_assert_float_eq (s.request_timeout, 600, 1e-9);
    cr_assert_str_eq (s.policy, "cache_aware");
    cr_assert_str_eq (s.workers, "");
    cr_assert_eq (s.max_concurrent, 256);
    cr_assert_eq (s.max_queued, 1024);
    cr_assert_eq (s.max_attempts, 3);
    cr_assert_float_eq (s.retry_backoff, 0.05, 1e-9);
    cr_assert_float_eq (s.retry_backoff_max, 2, 1e-9);
    cr_assert_float_eq (s.health_interval, 10, 1e-9);
    cr_assert_float_eq (s.health_timeout, 5, 1e-9);
    cr_assert_str_eq (s.health_endpoint, "/health");
    cr_assert_eq (s.failure_threshold, 3);
    cr_assert_eq (s.success_threshold, 2);
    cr_assert_eq (s.breaker_failures, 5);
    cr_assert_float_eq (s.breaker_timeout, 30, 1e-9);
    cr_assert_eq (s.breaker_successes, 2);
    rx_conf_destroy (&c);
}

static int s_validate_text (const char *text, struct rx_err *err, struct rx_router_settings *s)
{
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "t.ini", err);
    if (!c) return err->code;
    int rc = rx_conf_validate (c, rx_router_schema (), NULL, NULL, err);
    if (rc == RX_OK) rc = rx_router_settings_load (c, s, err);
    rx_conf_destroy (&c);
    return rc;
}

Test (router_settings, errors_name_file_and_line)
{
    struct rx_err err = { 0 };
    struct rx_router_settings s;
    cr_assert_neq (s_validate_text ("[router]\n\nmax_attempts = 0\n", &err, &s), RX_OK);
    cr_assert (strstr (err.msg, "t.ini:3") && strstr (err.msg, "max_attempts"), "%s", err.msg);
    cr_assert_neq (s_validate_text ("[server]\nport = 70000\n", &err, &s), RX_OK);
    cr_assert (strstr (err.msg, "t.ini:2") && strstr (err.msg, "port"), "%s", err.msg);
    cr_assert_neq (s_validate_text ("[router]\nhealth_check_endpoint = health\n", &err, &s), RX_OK);
    cr_assert (strstr (err.msg, "t.ini:2") && strstr (err.msg, "starting with /"), "%s", err.msg);
    cr_assert_neq (s_validate_text ("[router]\nretry_backoff = soon\n", &err, &s), RX_OK);
    cr_assert (strstr (err.msg, "retry_backoff"), "%s", err.msg);
    cr_assert_neq (s_validate_text ("[router]\nno_such_key = 1\n", &err, &s), RX_OK);
    cr_assert (strstr (err.msg, "no_such_key"), "%s", err.msg);
    cr_assert_neq (s_validate_text ("[scheduler]\npolicy = fcfs\n", &err, &s), RX_OK);
    cr_assert (strstr (err.msg, "scheduler"), "radixd's sections are not the router's: %s", err.msg);
    cr_assert_eq (s_validate_text ("[router]\nretry_backoff = 250ms\nworkers = http://a:1, http://b:2\n", &err, &s), RX_OK,
                  "%s", err.msg);
}

/* Every key of the schema is documented in conf/router.ini, inside its
 * section (as test_conf checks conf/radixd.ini). */
Test (router_settings, reference_ini_documents_every_key)
{
    char *path = tu_path (tu_env ("RX_TOP_SRCDIR"), "conf/router.ini");
    size_t len;
    char *text = tu_read_file (path, &len);
    cr_assert_not_null (text, "cannot read %s", path);
    for (const struct rx_conf_section *s = rx_router_schema (); s->name; s++) {
        char hdr[64];
        snprintf (hdr, sizeof hdr, "\n[%s]\n", s->name);
        const char *at = strstr (text, hdr);
        cr_assert_not_null (at, "conf/router.ini lacks section [%s]", s->name);
        const char *next = strstr (at + 1, "\n[");
        for (const struct rx_cfg_key *k = s->keys; k->name; k++) {
            char pat[80];
            snprintf (pat, sizeof pat, "\n%s = ", k->name);
            const char *hit = strstr (at, pat);
            if (!hit || (next && hit > next)) {
                snprintf (pat, sizeof pat, "\n;%s = ", k->name);
                hit = strstr (at, pat);
            }
            cr_assert (hit && (!next || hit < next), "conf/router.ini [%s] does not document %s", s->name, k->name);
        }
    }
    free (text);
    free (path);
}

/* ------------------------------------------------------------ worker table + policy */

static rx_loader_t *s_loader;
static rx_rpolicy_t *s_policy;

static void s_policy_setup (void)
{
    struct rx_err err = { 0 };
    char *dir = tu_path (tu_env ("RX_TOP_BUILDDIR"), "tests/router-fixtures/.libs");
    s_loader = rx_loader_new (dir, &err);
    free (dir);
    cr_assert_not_null (s_loader, "%s", err.msg);
    rx_plugin_t *p;
    cr_assert_eq (rx_loader_find (s_loader, RX_KIND_ROUTE_POLICY, "fixture_ll", &p, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (p, NULL, &err), RX_OK, "%s", err.msg);
    s_policy = rx_rpolicy_new (p, &err);
    cr_assert_not_null (s_policy, "%s", err.msg);
}

static void s_policy_teardown (void)
{
    rx_rpolicy_destroy (&s_policy);
    rx_loader_destroy (&s_loader);
}

/* Pick among the eligible workers of ws as the proxy does; returns the
 * chosen worker. */
static struct rx_worker *s_pick (rx_workers_t *ws, double now)
{
    struct rx_route_worker c[8];
    struct rx_worker *cw[8];
    size_t n = 0;
    for (size_t i = 0; i < rx_workers_count (ws); i++) {
        struct rx_worker *w = rx_workers_at (ws, i);
        if (!rx_worker_eligible (ws, w, now)) continue;
        c[n] = (struct rx_route_worker) { w->id, w->url, w->load };
        cw[n++] = w;
    }
    cr_assert_gt (n, 0, "no eligible worker");
    size_t chosen;
    int decision;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_rpolicy_pick (s_policy, "k", 1, c, n, 1, &chosen, &decision, &err), RX_OK, "%s", err.msg);
    return cw[chosen];
}

Test (router_workers, policy_hears_of_failures_and_recoveries, .init = s_policy_setup, .fini = s_policy_teardown)
{
    struct event_base *base = event_base_new ();
    struct rx_workers_cfg cfg = s_cfg;
    cfg.breaker_failures = 2;
    cfg.io_timeout = 5;
    cfg.max_idle = 4;
    struct rx_err err = { 0 };
    rx_workers_t *ws = rx_workers_new (base, &cfg, s_policy, &err);
    cr_assert_not_null (ws, "%s", err.msg);
    /* Port 1 on loopback: nothing listens; the checks just fail. */
    struct rx_worker *a, *b;
    cr_assert_eq (rx_workers_add (ws, "http://127.0.0.1:1", NULL, NULL, &a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_workers_add (ws, "http://127.0.0.1:1/", NULL, NULL, &b, &err), RX_EAGAIN);
    cr_assert (strstr (err.msg, "already present"), "%s", err.msg);
    cr_assert_eq (rx_workers_add (ws, "http://127.0.0.1:2", NULL, NULL, &b, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_workers_add (ws, "nope", NULL, NULL, NULL, &err), RX_EINVAL);
    cr_assert_neq (a->id, b->id);
    /* Pretend both passed their checks. */
    a->healthy = b->healthy = a->checked = b->checked = 1;
    cr_assert_eq (s_pick (ws, 1), a, "least loaded, lowest id");
    cr_assert_eq (rx_rpolicy_size (s_policy, a->id), 1);
    rx_worker_attempt_begin (ws, a);
    cr_assert_eq (a->load, 1);
    cr_assert_eq (s_pick (ws, 1), b, "a is busier now");
    /* a fails: the policy forgets it at once (its count restarts), the
     * breaker counts it, but a is still eligible (1 < breaker_failures). */
    rx_worker_attempt_end (ws, a, 0, 2);
    cr_assert_eq (a->load, 0);
    cr_assert_eq (a->br_failures, 1);
    cr_assert_eq (a->in_policy, 0);
    cr_assert_eq (rx_rpolicy_size (s_policy, a->id), 0, "worker_removed dropped its affinity");
    cr_assert_eq (s_pick (ws, 2), a, "added back afresh (the fixture refuses unknown workers)");
    cr_assert_eq (rx_rpolicy_size (s_policy, a->id), 1);
    /* A neutral end (client gone) changes nothing for the breaker. */
    rx_worker_attempt_begin (ws, a);
    rx_worker_attempt_end (ws, a, -1, 3);
    cr_assert_eq (a->br_failures, 1);
    cr_assert_eq (a->in_policy, 1);
    /* Second failure opens the breaker: not eligible, policy forgot it. */
    rx_worker_attempt_begin (ws, a);
    rx_worker_attempt_end (ws, a, 0, 4);
    cr_assert_eq (a->breaker, RX_BREAKER_OPEN);
    cr_assert_eq (rx_worker_eligible (ws, a, 5), 0);
    cr_assert_eq (s_pick (ws, 5), b);
    /* After breaker_timeout: half-open, one trial at a time. */
    cr_assert_eq (rx_worker_eligible (ws, a, 4 + 30), 1);
    cr_assert_eq (a->breaker, RX_BREAKER_HALF_OPEN);
    rx_worker_attempt_begin (ws, a);
    cr_assert_eq (rx_worker_eligible (ws, a, 35), 0, "a trial is in flight");
    rx_worker_attempt_end (ws, a, 1, 36);
    cr_assert_eq (rx_worker_eligible (ws, a, 36), 1);
    rx_worker_attempt_begin (ws, a);
    rx_worker_attempt_end (ws, a, 1, 37);
    cr_assert_eq (a->breaker, RX_BREAKER_CLOSED);
    /* Unhealthy: the next health result syncs the policy; not eligible. */
    b->healthy = 0;
    cr_assert_eq (rx_worker_eligible (ws, b, 40), 0);
    /* Removing a worker with a request in flight keeps it until the end. */
    rx_worker_attempt_begin (ws, a);
    cr_assert_eq (rx_workers_remove (ws, "http://127.0.0.1:1", &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_workers_count (ws), 1);
    cr_assert_null (rx_workers_find (ws, "http://127.0.0.1:1"));
    cr_assert_eq (rx_rpolicy_size (s_policy, a->id), 0);
    cr_assert_eq (rx_workers_remove (ws, "http://127.0.0.1:1", &err), RX_ENOENT);
    rx_worker_attempt_end (ws, a, 1, 41);   /* frees a (ASan would see a leak otherwise) */
    rx_workers_destroy (&ws);
    cr_assert_null (ws);
    event_base_free (base);
}

static int s_checked_calls;
static void s_on_checked (void *arg, struct rx_worker *w)
{
    s_checked_calls++;
    *(int *) arg = w->healthy ? 1 : 2;
}

Test (router_workers, first_check_of_a_dead_worker, .init = s_policy_setup, .fini = s_policy_teardown)
{
    struct event_base *base = event_base_new ();
    struct rx_workers_cfg cfg = s_cfg;
    cfg.health_timeout = 2;
    cfg.io_timeout = 5;
    cfg.max_idle = 4;
    struct rx_err err = { 0 };
    rx_workers_t *ws = rx_workers_new (base, &cfg, s_policy, &err);
    int state = 0;
    s_checked_calls = 0;
    cr_assert_eq (rx_workers_add (ws, "http://127.0.0.1:1", s_on_checked, &state, NULL, &err), RX_OK);
    for (int i = 0; i < 300 && !state; i++) event_base_loop (base, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep (10000);
    cr_assert_eq (state, 2, "the first check of a dead worker fails");
    cr_assert_eq (s_checked_calls, 1);
    cr_assert_eq (rx_workers_unchecked (ws), 0);
    struct rx_worker *w = rx_workers_at (ws, 0);
    cr_assert_eq (w->healthy, 0);
    cr_assert_eq (w->hc_failures, 1);
    /* A worker removed before its first check answers its waiter. */
    state = 0;
    cr_assert_eq (rx_workers_add (ws, "http://10.255.255.1:9", s_on_checked, &state, NULL, &err), RX_OK);
    cr_assert_eq (rx_workers_remove (ws, "http://10.255.255.1:9", &err), RX_OK);
    cr_assert_eq (state, 2);
    cr_assert_eq (s_checked_calls, 2);
    rx_workers_destroy (&ws);
    event_base_free (base);
}
