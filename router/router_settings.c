/* router/router_settings.c -- see router_settings.h.  Keep conf/router.ini
 * in step. */
#include "config.h"

#include <string.h>

#include "router_settings.h"
#include "settings.h"

static const struct rx_cfg_key s_server[] = {
    { "host", RX_CFG_STRING, "127.0.0.1",
      "address the router binds (0.0.0.0 or :: to listen on every interface)", 0, 0, NULL },
    { "port", RX_CFG_INT, "31000", "HTTP port; 0 = any free port (the ready line names it)",
      0, 65535, NULL },
    { "api_key", RX_CFG_STRING, NULL,
      "when set, every request except /health needs \"Authorization: Bearer <key>\"", 0, 0, NULL },
    { "admin_api_key", RX_CFG_STRING, NULL,
      "when set, adding and removing workers (POST /workers, DELETE /workers/..., /add_worker, /remove_worker) needs \"Authorization: Bearer <admin key>\" (the API key alone gets 403)",
      0, 0, NULL },
    { "max_body_size", RX_CFG_SIZE, "8MiB", "largest request body; larger ones get HTTP 413",
      1024, (double) (1ull << 30), NULL },
    { "max_header_size", RX_CFG_SIZE, "64KiB",
      "largest request line + headers; larger ones get HTTP 431 (beyond twice this, the connection is closed)",
      1024, (double) (16ull << 20), NULL },
    { "request_timeout", RX_CFG_DURATION, "600",
      "a request not finished this long after it arrived gets HTTP 504 (a stream ends with an error event)",
      0.001, 86400, NULL },
    { "shutdown_timeout", RX_CFG_DURATION, "30",
      "on SIGTERM, in-flight requests get this long to finish before the router exits", 0, 86400,
      NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_router[] = {
    { "policy", RX_CFG_STRING, "cache_aware",
      "route policy plugin (route-<policy>.so): random, round_robin, shortest_queue, power_of_two, cache_aware",
      0, 0, NULL },
    { "workers", RX_CFG_STRING, "",
      "comma-separated worker URLs (http://host:port); more can be added at run time (POST /workers)",
      0, 0, NULL },
    { "max_concurrent_requests", RX_CFG_INT, "256",
      "most requests proxied at once; more wait in the queue", 1, 1 << 20, NULL },
    { "max_queued_requests", RX_CFG_INT, "1024",
      "most requests waiting for a slot; more are refused with HTTP 429", 0, 1 << 24, NULL },
    { "max_attempts", RX_CFG_INT, "3",
      "tries per request (the first included) before the error goes to the client", 1, 16, NULL },
    { "retry_backoff", RX_CFG_DURATION, "50ms",
      "wait before the first retry; doubled for each further one, with jitter", 0, 60, NULL },
    { "retry_backoff_max", RX_CFG_DURATION, "2s", "upper bound of the wait between retries",
      0, 600, NULL },
    { "health_check_interval", RX_CFG_DURATION, "10s", "time between two health checks of a worker",
      0.01, 86400, NULL },
    { "health_check_timeout", RX_CFG_DURATION, "5s", "a health check not answered this fast failed",
      0.01, 3600, NULL },
    { "health_check_endpoint", RX_CFG_STRING, "/health",
      "path of the health check (GET; 200 = healthy)", 0, 0, NULL },
    { "failure_threshold", RX_CFG_INT, "3",
      "consecutive failed health checks that mark a worker unhealthy", 1, 1000, NULL },
    { "success_threshold", RX_CFG_INT, "2",
      "consecutive passed health checks that mark an unhealthy worker healthy again", 1, 1000,
      NULL },
    { "breaker_failures", RX_CFG_INT, "5",
      "consecutive failed requests that open a worker's circuit breaker (no traffic)", 1, 1000,
      NULL },
    { "breaker_timeout", RX_CFG_DURATION, "30s",
      "an open breaker turns half-open (one trial request at a time) after this long", 0.001,
      86400, NULL },
    { "breaker_successes", RX_CFG_INT, "2",
      "consecutive successful trial requests that close a half-open breaker", 1, 1000, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_conf_section s_schema[] = {
    { "server", "the router's own HTTP server", s_server, 0 },
    { "router", "workers, limits, retries, health checks, breakers; [router.<policy>] configures one policy",
      s_router, RX_KIND_ROUTE_POLICY },
    { "log", "logging", rx_settings_log_keys, 0 },
    { "plugins", "where plugins are found", rx_settings_plugins_keys, 0 },
    { NULL, NULL, NULL, 0 }
};

static const struct rx_plugin_ref s_refs[] = {
    { "router", "policy", RX_KIND_ROUTE_POLICY },
    { NULL, NULL, 0 }
};

const struct rx_conf_section *rx_router_schema (void) { return s_schema; }
const struct rx_plugin_ref *rx_router_plugin_refs (void) { return s_refs; }

static int s_get (const rx_conf_t *c, const char *sec, const char *key, struct rx_cfg_value *v,
                  struct rx_err *err)
{
    memset (v, 0, sizeof *v);
    int rc = rx_conf_value (c, sec, key, v, err);
    if (rc == RX_ENOENT) {   /* declared without default (api_key): unset */
        v->s = NULL;
        return RX_OK;
    }
    return rc;
}

int rx_router_settings_load (const rx_conf_t *c, struct rx_router_settings *s, struct rx_err *err)
{
    struct rx_cfg_value v;
    memset (s, 0, sizeof *s);
#define GET(sec, key) do { int rc_ = s_get (c, sec, key, &v, err); if (rc_ != RX_OK) return rc_; } while (0)
    GET ("server", "host");             s->host = v.s;
    GET ("server", "port");             s->port = (int) v.i;
    GET ("server", "api_key");          s->api_key = v.s;
    GET ("server", "admin_api_key");    s->admin_key = v.s;
    GET ("server", "max_body_size");    s->max_body_size = v.u;
    GET ("server", "max_header_size");  s->max_header_size = v.u;
    GET ("server", "request_timeout");  s->request_timeout = v.f;
    GET ("server", "shutdown_timeout"); s->shutdown_timeout = v.f;
    GET ("router", "policy");           s->policy = v.s;
    GET ("router", "workers");          s->workers = v.s ? v.s : "";
    GET ("router", "max_concurrent_requests"); s->max_concurrent = (int) v.i;
    GET ("router", "max_queued_requests");     s->max_queued = (int) v.i;
    GET ("router", "max_attempts");            s->max_attempts = (int) v.i;
    GET ("router", "retry_backoff");           s->retry_backoff = v.f;
    GET ("router", "retry_backoff_max");       s->retry_backoff_max = v.f;
    GET ("router", "health_check_interval");   s->health_interval = v.f;
    GET ("router", "health_check_timeout");    s->health_timeout = v.f;
    GET ("router", "health_check_endpoint");   s->health_endpoint = v.s;
    GET ("router", "failure_threshold");       s->failure_threshold = (int) v.i;
    GET ("router", "success_threshold");       s->success_threshold = (int) v.i;
    GET ("router", "breaker_failures");        s->breaker_failures = (int) v.i;
    GET ("router", "breaker_timeout");         s->breaker_timeout = v.f;
    GET ("router", "breaker_successes");       s->breaker_successes = (int) v.i;
#undef GET
    if (!s->health_endpoint || s->health_endpoint[0] != '/' || strpbrk (s->health_endpoint, " \t\r\n")) {
        int line = 0;
        rx_conf_raw (c, "router", "health_check_endpoint", &line);
        return rx_err_set (err, RX_ECONFIG, "%s:%d [router]: health_check_endpoint = \"%s\": expected a path starting with /",
                           rx_conf_name (c), line, s->health_endpoint ? s->health_endpoint : "");
    }
    if (!s->policy || !*s->policy)
        return rx_err_set (err, RX_ECONFIG, "%s [router]: policy is empty: expected a route policy name",
                           rx_conf_name (c));
    return RX_OK;
}
