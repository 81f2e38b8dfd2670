/* router/router_settings.h -- radix-router's INI schema.
 *
 * The source of truth for the router's keys: validation (through the same
 * core conf code as radixd, core/conf.h + core/boot.h), --help-config, and
 * conf/router.ini (a test checks that every key here is documented there).
 * [router] is also the plugin section of the route policies: the keys of
 * [router.cache_aware] are the ones route-cache_aware.so declares. */
#ifndef RX_ROUTER_SETTINGS_H
#define RX_ROUTER_SETTINGS_H

#include <stdint.h>

#include <radix/err.h>

#include "conf.h"
#include "settings.h"

/* The schema, terminated by an entry with name NULL. */
const struct rx_conf_section *rx_router_schema (void);
/* [router] policy names a route-policy plugin; terminated by section NULL. */
const struct rx_plugin_ref *rx_router_plugin_refs (void);

/* The validated values the daemon runs with (durations in seconds). */
struct rx_router_settings {
    const char *host;                 /* borrowed from the conf */
    int port;
    const char *api_key;              /* NULL or "": no key */
    const char *admin_key;            /* NULL or "": admin endpoints need the API key only */
    uint64_t max_body_size;
    uint64_t max_header_size;
    double request_timeout;
    double shutdown_timeout;
    const char *policy;
    const char *workers;              /* the comma-separated list as written */
    int max_concurrent;
    int max_queued;
    int max_attempts;
    double retry_backoff;
    double retry_backoff_max;
    double health_interval;
    double health_timeout;
    const char *health_endpoint;
    int failure_threshold;
    int success_threshold;
    int breaker_failures;
    double breaker_timeout;
    int breaker_successes;
};

/* Read every key of a validated conf into *s (strings stay owned by c).
 * Also checks what the schema cannot: health_check_endpoint starts with
 * "/".  Errors name file:line. */
int rx_router_settings_load (const rx_conf_t *c, struct rx_router_settings *s, struct rx_err *err);

#endif
