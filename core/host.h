/* core/host.h -- the core's implementation of struct rx_host (radix/host.h).
 *
 * A binding is one plugin's view of the core: its name for log lines, its
 * INI section and declared keys for the cfg getters.  The binding must
 * outlive every use of its host table (the loader owns one per plugin). */
#ifndef RX_HOST_IMPL_H
#define RX_HOST_IMPL_H

#include <radix/host.h>
#include <radix/plugin.h>

#include "conf.h"

struct rx_host_binding {
    struct rx_host host;                /* host.ctx points back here */
    char name[64];                      /* log tag, e.g. "kernels-cpu" */
    char section[96];                   /* e.g. "kernels.cpu" */
    const rx_conf_t *conf;              /* may be NULL: defaults only */
    const struct rx_cfg_key *keys;      /* the plugin's declared keys */
    char metric_prefix[96];             /* "radix_kernels_cpu_" */
};

/* Fill b (all strings copied).  conf may be NULL. */
void rx_host_bind (struct rx_host_binding *b, const char *name, const char *section,
                   const rx_conf_t *conf, const struct rx_cfg_key *keys);

/* What host->progress calls in this process (one hook per process: the
 * scheduler process points it at its heartbeat).  NULL: nothing. */
void rx_host_set_progress_hook (void (*fn) (void *), void *arg);

#endif
