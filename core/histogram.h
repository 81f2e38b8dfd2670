/* core/histogram.h -- a Prometheus histogram (cumulative buckets, sum,
 * count) rendered in the text exposition format.  radixd's main process
 * keeps TTFT / inter-token / end-to-end latency histograms with these; the
 * router will too.  Not thread-safe: one event-loop thread observes and
 * renders. */
#ifndef RX_HISTOGRAM_H
#define RX_HISTOGRAM_H

#include <stddef.h>
#include <stdint.h>

#define RX_HIST_MAX_BUCKETS 24

struct rx_hist {
    const char *name;                    /* "radix_time_to_first_token_seconds" */
    const char *help;
    size_t n;                            /* upper bounds (the +Inf bucket is implicit) */
    double le[RX_HIST_MAX_BUCKETS];
    uint64_t count[RX_HIST_MAX_BUCKETS + 1];   /* per bucket, not cumulative */
    double sum;
    uint64_t total;
};

/* bounds: increasing, n <= RX_HIST_MAX_BUCKETS (extra ones are ignored). */
void rx_hist_init (struct rx_hist *h, const char *name, const char *help, const double *bounds,
                   size_t n);
void rx_hist_observe (struct rx_hist *h, double v);
/* Append the exposition (# HELP, # TYPE, _bucket{le=...} cumulative, _sum,
 * _count) to a growing string; returns 0, or -1 when out of memory. */
int rx_hist_render (const struct rx_hist *h, char **buf, size_t *len, size_t *cap);

/* printf-append to a growing string (*buf NUL-terminated); 0 or -1 (ENOMEM). */
#if defined(__GNUC__)
__attribute__ ((format (printf, 4, 5)))
#endif
int rx_strbuf_printf (char **buf, size_t *len, size_t *cap, const char *fmt, ...);

#endif
