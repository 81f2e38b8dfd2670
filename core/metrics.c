/* core/metrics.c -- see metrics.h.  A fixed table: metrics are registered at
 * start-up, so a bounded array keeps the hot path (add/set) lock-free. */
#include "config.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <radix/err.h>
#include <radix/host.h>

#include "metrics.h"

#define RX_METRICS_MAX 512

struct metric {
    char name[96];
    char help[160];
    int type;
    _Atomic double value;
    _Atomic unsigned long count;   /* histogram: observations */
};

static struct metric s_m[RX_METRICS_MAX];
static atomic_int s_n;
static pthread_mutex_t s_mu = PTHREAD_MUTEX_INITIALIZER;

int rx_metrics_register (const char *name, int type, const char *help)
{
    if (!name || !*name || type < RX_METRIC_COUNTER || type > RX_METRIC_HISTOGRAM)
        return RX_EINVAL;
    char clean[96];
    size_t j = 0;
    for (const char *p = name; *p && j + 1 < sizeof clean; p++)
        clean[j++] = isalnum ((unsigned char) *p) ? (char) tolower ((unsigned char) *p) : '_';
    clean[j] = '\0';
    pthread_mutex_lock (&s_mu);
    int n = atomic_load (&s_n);
    for (int i = 0; i < n; i++)
        if (strcmp (s_m[i].name, clean) == 0) {
            pthread_mutex_unlock (&s_mu);
            return s_m[i].type == type ? i : RX_EINVAL;
        }
    if (n == RX_METRICS_MAX) {
        pthread_mutex_unlock (&s_mu);
        return RX_ENOMEM;
    }
    struct metric *m = &s_m[n];
    snprintf (m->name, sizeof m->name, "%s", clean);
    snprintf (m->help, sizeof m->help, "%s", help ? help : "");
    m->type = type;
    atomic_store (&m->value, 0.0);
    atomic_store (&m->count, 0);
    atomic_store (&s_n, n + 1);
    pthread_mutex_unlock (&s_mu);
    return n;
}

static struct metric *s_get (int h)
{
    return h >= 0 && h < atomic_load (&s_n) ? &s_m[h] : NULL;
}

void rx_metrics_add (int handle, double v)
{
    struct metric *m = s_get (handle);
    if (!m) return;
    double old = atomic_load (&m->value);
    while (!atomic_compare_exchange_weak (&m->value, &old, old + v)) {}
    atomic_fetch_add (&m->count, 1);
}

void rx_metrics_set (int handle, double v)
{
    struct metric *m = s_get (handle);
    if (m) atomic_store (&m->value, v);
}

double rx_metrics_get (int handle)
{
    struct metric *m = s_get (handle);
    return m ? atomic_load (&m->value) : 0.0;
}

size_t rx_metrics_render (char *buf, size_t len)
{
    size_t off = 0;
    int n = atomic_load (&s_n);
    for (int i = 0; i < n; i++) {
        struct metric *m = &s_m[i];
        const char *t = m->type == RX_METRIC_COUNTER ? "counter"
                      : m->type == RX_METRIC_GAUGE ? "gauge" : "summary";
        char line[512];
        int k;
        if (m->type == RX_METRIC_HISTOGRAM)
            k = snprintf (line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s_sum %.17g\n%s_count %lu\n",
                          m->name, m->help, m->name, t, m->name, atomic_load (&m->value),
                          m->name, atomic_load (&m->count));
        else
            k = snprintf (line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n",
                          m->name, m->help, m->name, t, m->name, atomic_load (&m->value));
        if (k < 0) continue;
        if (off < len)
            memcpy (buf + off, line, (size_t) k < len - off ? (size_t) k : len - off);
        off += (size_t) k;
    }
    if (len) buf[off < len ? off : len - 1] = '\0';
    return off;
}
