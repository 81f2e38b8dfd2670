/* core/histogram.c -- see histogram.h. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "histogram.h"

void rx_hist_init (struct rx_hist *h, const char *name, const char *help, const double *bounds,
                   size_t n)
{
    memset (h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->n = n < RX_HIST_MAX_BUCKETS ? n : RX_HIST_MAX_BUCKETS;
    memcpy (h->le, bounds, h->n * sizeof *bounds);
}

void rx_hist_observe (struct rx_hist *h, double v)
{
    size_t i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

int rx_strbuf_printf (char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        size_t room = *cap - *len;
        va_list ap;
        va_start (ap, fmt);
        int k = *buf ? vsnprintf (*buf + *len, room, fmt, ap) : -2;
        va_end (ap);
        if (k == -1) return -1;
        if (k >= 0 && (size_t) k < room) {
            *len += (size_t) k;
            return 0;
        }
        size_t ncap = *cap ? *cap * 2 : 4096;
        while (k > 0 && ncap - *len <= (size_t) k) ncap *= 2;
        char *nb = realloc (*buf, ncap);
        if (!nb) return -1;
        *buf = nb;
        *cap = ncap;
    }
}

int rx_hist_render (const struct rx_hist *h, char **buf, size_t *len, size_t *cap)
{
    if (rx_strbuf_printf (buf, len, cap, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help,
                          h->name))
        return -1;
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n; i++) {
        cum += h->count[i];
        if (rx_strbuf_printf (buf, len, cap, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->le[i],
                              (unsigned long long) cum))
            return -1;
    }
    cum += h->count[h->n];
    return rx_strbuf_printf (buf, len, cap, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n",
                             h->name, (unsigned long long) cum, h->name, h->sum, h->name,
                             (unsigned long long) h->total);
}
