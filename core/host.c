/* core/host.c -- see host.h.  The functions behind struct rx_host. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "log.h"
#include "metrics.h"

#define B(h) ((const struct rx_host_binding *) (h)->ctx)

static void s_log (const struct rx_host *h, int level, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    rx_log_tagged_v (level, B (h)->name, fmt, ap);
    va_end (ap);
}

static int s_log_enabled (const struct rx_host *h, int level)
{
    (void) h;
    return rx_log_enabled (level);
}

static void *s_alloc (const struct rx_host *h, size_t size, size_t align)
{
    (void) h;
    if (size == 0) size = 1;
    if (align <= sizeof (void *))
        return malloc (size);
    if (align & (align - 1))
        return NULL;
    void *p = NULL;
    return posix_memalign (&p, align, size) == 0 ? p : NULL;
}

static void s_free (const struct rx_host *h, void *p)
{
    (void) h;
    free (p);
}

static int s_value (const struct rx_host *h, const char *key, struct rx_cfg_value *v)
{
    const struct rx_host_binding *b = B (h);
    if (!b->conf) {
        /* No config: the declared default. */
        const struct rx_cfg_key *k = rx_cfg_keys_find (b->keys, key);
        if (!k || !k->def) return RX_ENOENT;
        return rx_cfg_value_parse (k, k->def, v, NULL, 0);
    }
    return rx_conf_value_in (b->conf, b->section, b->keys, key, v, NULL);
}

static int s_cfg_str (const struct rx_host *h, const char *key, const char **out)
{
    struct rx_cfg_value v;
    int rc = s_value (h, key, &v);
    if (rc == RX_OK) *out = v.s;
    return rc;
}

static int s_cfg_int (const struct rx_host *h, const char *key, int64_t *out)
{
    struct rx_cfg_value v;
    int rc = s_value (h, key, &v);
    if (rc == RX_OK) *out = v.i;
    return rc;
}

static int s_cfg_float (const struct rx_host *h, const char *key, double *out)
{
    struct rx_cfg_value v;
    int rc = s_value (h, key, &v);
    if (rc == RX_OK) *out = v.f;
    return rc;
}

static int s_cfg_bool (const struct rx_host *h, const char *key, int *out)
{
    struct rx_cfg_value v;
    int rc = s_value (h, key, &v);
    if (rc == RX_OK) *out = (int) v.i;
    return rc;
}

static int s_cfg_size (const struct rx_host *h, const char *key, uint64_t *out)
{
    struct rx_cfg_value v;
    int rc = s_value (h, key, &v);
    if (rc == RX_OK) *out = v.u;
    return rc;
}

static int s_cfg_seconds (const struct rx_host *h, const char *key, double *out)
{
    return s_cfg_float (h, key, out);
}

static int s_cfg_is_set (const struct rx_host *h, const char *key)
{
    const struct rx_host_binding *b = B (h);
    return b->conf && rx_conf_raw (b->conf, b->section, key, NULL) != NULL;
}

static int s_metric_register (const struct rx_host *h, const char *name, int type, const char *help)
{
    char full[192];
    snprintf (full, sizeof full, "%s%s", B (h)->metric_prefix, name ? name : "");
    return rx_metrics_register (full, type, help);
}

static void s_metric_add (const struct rx_host *h, int handle, double v)
{
    (void) h;
    rx_metrics_add (handle, v);
}

static void s_metric_set (const struct rx_host *h, int handle, double v)
{
    (void) h;
    rx_metrics_set (handle, v);
}

static void (*s_progress_fn) (void *);
static void *s_progress_arg;

void rx_host_set_progress_hook (void (*fn) (void *), void *arg)
{
    s_progress_fn = fn;
    s_progress_arg = arg;
}

static void s_progress (const struct rx_host *h)
{
    (void) h;
    if (s_progress_fn) s_progress_fn (s_progress_arg);
}

void rx_host_bind (struct rx_host_binding *b, const char *name, const char *section,
                   const rx_conf_t *conf, const struct rx_cfg_key *keys)
{
    memset (b, 0, sizeof *b);
    snprintf (b->name, sizeof b->name, "%s", name);
    snprintf (b->section, sizeof b->section, "%s", section);
    snprintf (b->metric_prefix, sizeof b->metric_prefix, "radix_%s_", section);
    b->conf = conf;
    b->keys = keys;
    b->host = (struct rx_host) {
        .struct_size = sizeof (struct rx_host),
        .abi_major = RX_ABI_MAJOR,
        .abi_minor = RX_ABI_MINOR,
        .ctx = b,
        .log = s_log,
        .log_enabled = s_log_enabled,
        .alloc = s_alloc,
        .free_ = s_free,
        .cfg_str = s_cfg_str,
        .cfg_int = s_cfg_int,
        .cfg_float = s_cfg_float,
        .cfg_bool = s_cfg_bool,
        .cfg_size = s_cfg_size,
        .cfg_seconds = s_cfg_seconds,
        .cfg_is_set = s_cfg_is_set,
        .metric_register = s_metric_register,
        .metric_add = s_metric_add,
        .metric_set = s_metric_set,
        .progress = s_progress,
    };
}
