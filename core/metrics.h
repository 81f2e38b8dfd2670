/* core/metrics.h -- a process-wide registry of named counters and gauges.
 *
 * Plugins register through the host table; the serving issue renders the
 * registry as Prometheus text on /metrics.  Thread-safe. */
#ifndef RX_METRICS_H
#define RX_METRICS_H

#include <stddef.h>

/* Register NAME (sanitised to [a-z0-9_]) of type enum rx_metric_type.
 * Registering an existing name with the same type returns its handle.
 * Returns a handle >= 0, or a negative rx_status. */
int  rx_metrics_register (const char *name, int type, const char *help);
void rx_metrics_add (int handle, double v);
void rx_metrics_set (int handle, double v);
double rx_metrics_get (int handle);
/* Prometheus text exposition of every metric into buf; returns the length
 * it needed (like snprintf). */
size_t rx_metrics_render (char *buf, size_t len);

#endif
