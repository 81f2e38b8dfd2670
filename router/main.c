/* router/main.c -- radix-router's entry point: options, boot (the router's
 * INI schema through the core's conf/loader, router/router_settings.h), the
 * route-policy plugin, the initial workers, then the event loop
 * (router/proxy.h).
 *
 * Start-up: every worker of [router] workers gets its first health check
 * at once; the router listens when all of them answered or timed out
 * (health_check_timeout at most), so that the first requests already see
 * which workers are up, and logs "ready on http://HOST:PORT (N workers,
 * policy P)".  Workers that are down do not stop it. */
#include "config.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "boot.h"
#include "log.h"
#include "plugininfo.h"
#include "proxy.h"
#include "route_policy.h"
#include "router_settings.h"
#include "workers.h"

static void s_usage (FILE *f)
{
    fprintf (f,
        "usage: radix-router -c FILE [options]\n"
        "  -c, --config FILE      the INI configuration (conf/router.ini is the reference)\n"
        "      --check-config     validate FILE (and the policy plugin it names) and exit 0 or 1\n"
        "      --list-plugins     list every plugin found in the plugin path and exit\n"
        "      --help-plugin NAME print a plugin's INI keys (NAME: cache_aware or route-cache_aware)\n"
        "      --help-config      print every section and key of the router\n"
        "  -V, --version          print version and plugin ABI\n"
        "  -h, --help             this text\n");
}

enum { OPT_CHECK_CONFIG = 256, OPT_LIST, OPT_HELP_PLUGIN, OPT_HELP_CONFIG };

struct s_start {
    struct event_base *base;
    rx_workers_t *ws;
    struct event *poll;
    int timed_out;
};

/* Polls (10 ms) until every initial worker had its first check. */
static void s_on_start_poll (evutil_socket_t fd, short what, void *arg)
{
    struct s_start *st = arg;
    if (rx_workers_unchecked (st->ws) == 0) event_base_loopbreak (st->base);
}

static void s_on_start_deadline (evutil_socket_t fd, short what, void *arg)
{
    struct s_start *st = arg;
    st->timed_out = 1;
    event_base_loopbreak (st->base);
}

static void s_on_signal (evutil_socket_t sig, short what, void *arg)
{
    rx_proxy_t *px = arg;
    rx_info ("signal %d: shutting down", (int) sig);
    rx_proxy_drain (px);
}

/* Split [router] workers and add each; a bad URL names file:line. */
static int s_add_initial (rx_workers_t *ws, const rx_conf_t *conf, const char *list, struct rx_err *err)
{
    char *copy = strdup (list);
    if (!copy) return rx_err_set (err, RX_ENOMEM, "out of memory");
    int rc = RX_OK;
    char *save = NULL;
    for (char *tok = strtok_r (copy, ",", &save); tok && rc == RX_OK; tok = strtok_r (NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t') tok++;
        char *end = tok + strlen (tok);
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (!*tok) continue;
        struct rx_err e = { 0 };
        if (rx_workers_add (ws, tok, NULL, NULL, NULL, &e) != RX_OK) {
            int line = 0;
            rx_conf_raw (conf, "router", "workers", &line);
            rc = rx_err_set (err, RX_ECONFIG, "%s:%d [router]: workers: %s", rx_conf_name (conf), line, e.msg);
        }
    }
    free (copy);
    return rc;
}

/* Validates the worker list without starting anything (--check-config). */
static int s_check_workers (const rx_conf_t *conf, const char *list, struct rx_err *err)
{
    char *copy = strdup (list);
    if (!copy) return rx_err_set (err, RX_ENOMEM, "out of memory");
    int rc = RX_OK, n = 0;
    char *save = NULL;
    char seen[64][RX_WORKER_URL_MAX];
    for (char *tok = strtok_r (copy, ",", &save); tok && rc == RX_OK; tok = strtok_r (NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t') tok++;
        char *end = tok + strlen (tok);
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (!*tok) continue;
        struct rx_err e = { 0 };
        char norm[RX_WORKER_URL_MAX];
        int line = 0;
        rx_conf_raw (conf, "router", "workers", &line);
        if (rx_worker_url_normalize (tok, norm, sizeof norm, &e) != RX_OK) {
            rc = rx_err_set (err, RX_ECONFIG, "%s:%d [router]: workers: %s", rx_conf_name (conf), line, e.msg);
            break;
        }
        for (int i = 0; i < n && i < 64; i++)
            if (!strcmp (seen[i], norm))
                rc = rx_err_set (err, RX_ECONFIG, "%s:%d [router]: workers: %s is listed twice", rx_conf_name (conf),
                                 line, norm);
        if (n < 64) snprintf (seen[n], sizeof seen[n], "%s", norm);
        n++;
    }
    free (copy);
    return rc;
}

static int s_run (struct rx_boot *b)
{
    struct rx_err err = { 0 };
    struct rx_router_settings s;
    if (rx_router_settings_load (b->conf, &s, &err) != RX_OK) {
        fprintf (stderr, "radix-router: %s\n", err.msg);
        return 1;
    }
    if (s_check_workers (b->conf, s.workers, &err) != RX_OK) {
        fprintf (stderr, "radix-router: %s\n", err.msg);
        return 1;
    }
    rx_plugin_t *plugin = NULL;
    if (rx_boot_plugin (b, "router", "policy", RX_KIND_ROUTE_POLICY, &plugin, &err) != RX_OK) {
        fprintf (stderr, "radix-router: %s\n", err.msg);
        return 1;
    }
    rx_rpolicy_t *rp = rx_rpolicy_new (plugin, &err);
    if (!rp) {
        fprintf (stderr, "radix-router: %s\n", err.msg);
        return 1;
    }
    signal (SIGPIPE, SIG_IGN);
    int rc = 1;
    /* One thread: no locks; the epoll changelist folds the many enable /
     * disable calls evhttp makes per request into fewer epoll_ctl. */
    struct event_config *ecfg = event_config_new ();
    if (ecfg) {
        event_config_set_flag (ecfg, EVENT_BASE_FLAG_NOLOCK);
        event_config_set_flag (ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    }
    struct event_base *base = ecfg ? event_base_new_with_config (ecfg) : event_base_new ();
    if (ecfg) event_config_free (ecfg);
    rx_workers_t *ws = NULL;
    rx_proxy_t *px = NULL;
    struct event *sigterm = NULL, *sigint = NULL;
    if (!base) {
        fprintf (stderr, "radix-router: cannot create the event loop\n");
        goto out;
    }
    struct rx_workers_cfg wc = {
        .health_interval = s.health_interval, .health_timeout = s.health_timeout,
        .health_endpoint = s.health_endpoint, .failure_threshold = s.failure_threshold,
        .success_threshold = s.success_threshold, .breaker_failures = s.breaker_failures,
        .breaker_successes = s.breaker_successes, .breaker_timeout = s.breaker_timeout,
        .io_timeout = s.request_timeout + 5, .max_idle = (size_t) s.max_concurrent,
    };
    ws = rx_workers_new (base, &wc, rp, &err);
    px = ws ? rx_proxy_new (base, &s, ws, rp, &err) : NULL;
    if (!px || s_add_initial (ws, b->conf, s.workers, &err) != RX_OK) {
        fprintf (stderr, "radix-router: %s\n", err.msg);
        goto out;
    }
    /* Wait for the first round of health checks (bounded). */
    if (rx_workers_unchecked (ws)) {
        struct s_start st = { base, ws, NULL, 0 };
        struct event *poll = event_new (base, -1, EV_PERSIST, s_on_start_poll, &st);
        struct event *dl = evtimer_new (base, s_on_start_deadline, &st);
        struct timeval ptv = { 0, 10000 };
        double d = s.health_timeout + 1;
        struct timeval dtv = { (time_t) d, (suseconds_t) ((d - (double) (time_t) d) * 1e6) };
        if (poll && dl) {
            event_add (poll, &ptv);
            evtimer_add (dl, &dtv);
            event_base_dispatch (base);
        }
        if (poll) event_free (poll);
        if (dl) event_free (dl);
    }
    if (rx_proxy_listen (px, &err) != RX_OK) {
        rx_error ("%s", err.msg);
        goto out;
    }
    sigterm = evsignal_new (base, SIGTERM, s_on_signal, px);
    sigint = evsignal_new (base, SIGINT, s_on_signal, px);
    if (sigterm) evsignal_add (sigterm, NULL);
    if (sigint) evsignal_add (sigint, NULL);
    size_t n = rx_workers_count (ws), up = 0;
    for (size_t i = 0; i < n; i++) up += rx_worker_up (rx_workers_at (ws, i));
    rx_info ("ready on %s (%zu workers, %zu healthy, policy %s)", rx_proxy_url (px), n, up, rx_rpolicy_name (rp));
    event_base_dispatch (base);
    rx_info ("stopped");
    rc = 0;
out:
    if (sigterm) event_free (sigterm);
    if (sigint) event_free (sigint);
    rx_proxy_destroy (&px);
    rx_workers_destroy (&ws);
    rx_rpolicy_destroy (&rp);
    if (base) event_base_free (base);
    return rc;
}

int main (int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
        { "list-plugins", no_argument, NULL, OPT_LIST },
        { "help-plugin", required_argument, NULL, OPT_HELP_PLUGIN },
        { "help-config", no_argument, NULL, OPT_HELP_CONFIG },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = NULL, *help_plugin = NULL;
    int check_config = 0, list = 0, help_config = 0, c;
    while ((c = getopt_long (argc, argv, "c:Vh", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case OPT_CHECK_CONFIG: check_config = 1; break;
        case OPT_LIST: list = 1; break;
        case OPT_HELP_PLUGIN: help_plugin = optarg; break;
        case OPT_HELP_CONFIG: help_config = 1; break;
        case 'V':
            printf ("radix-router %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, RX_ABI_MAJOR, RX_ABI_MINOR);
            return 0;
        case 'h': s_usage (stdout); return 0;
        default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "radix-router: unexpected argument \"%s\"\n", argv[optind]);
        s_usage (stderr);
        return 2;
    }
    if (help_config) {
        rx_print_config_help (stdout, rx_router_schema ());
        return 0;
    }
    if (!config && check_config) {
        fprintf (stderr, "radix-router: --check-config needs -c FILE\n");
        return 2;
    }
    if (!config && !list && !help_plugin) {
        s_usage (stderr);
        return 2;
    }
    rx_log_set_role ("router", NULL);
    struct rx_boot b;
    struct rx_err err = { 0 };
    int diagnostic = list || help_plugin;
    if (rx_boot_open_schema (&b, config, diagnostic ? 0 : RX_BOOT_CHECK_REFS, rx_router_schema (),
                             rx_router_plugin_refs (), &err) != RX_OK) {
        fprintf (stderr, "radix-router: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (list) {
        rx_print_plugin_list (stdout, b.loader);
    } else if (help_plugin) {
        rc = rx_print_plugin_help (stdout, stderr, b.loader, help_plugin) == RX_OK ? 0 : 1;
    } else if (check_config) {
        struct rx_router_settings s;
        if (rx_router_settings_load (b.conf, &s, &err) != RX_OK || s_check_workers (b.conf, s.workers, &err) != RX_OK) {
            fprintf (stderr, "radix-router: %s\n", err.msg);
            rc = 1;
        } else {
            printf ("%s: configuration OK\n", config);
        }
    } else {
        rc = s_run (&b);
    }
    rx_boot_close (&b);
    return rc;
}
