/* radix/host.h -- the services the core offers to plugins.
 *
 * ABI: stable since 1.0.  Plugins call back into the core only through this
 * table (the SQLite/Redis model): a third-party plugin links against nothing
 * but libc and its own dependencies.  The core hands each loaded plugin its
 * own table; `ctx` is core-private and identifies the plugin (its name for
 * log lines, its INI section for cfg_*).
 *
 * Thread-safety: log, alloc/free, metric_* and the cfg getters may be called
 * from any thread.  Strings passed in are borrowed for the call; strings
 * returned by cfg_str stay valid until the plugin is unloaded. */
#ifndef RADIX_HOST_H
#define RADIX_HOST_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rx_log_level {
    RX_LOG_ERROR = 0,
    RX_LOG_WARN  = 1,
    RX_LOG_INFO  = 2,
    RX_LOG_DEBUG = 3,
    RX_LOG_TRACE = 4
};

enum rx_metric_type {
    RX_METRIC_COUNTER   = 1,  /* monotonically increasing; metric_add */
    RX_METRIC_GAUGE     = 2,  /* set to a value; metric_set */
    RX_METRIC_HISTOGRAM = 3   /* observations; metric_add records one */
};

struct rx_host {
    uint32_t struct_size;                 /* sizeof (struct rx_host) as compiled into radixd */
    uint16_t abi_major, abi_minor;        /* the core's ABI */
    void    *ctx;                         /* core-private: do not touch */
    /* ---- ABI 1.0 ---- */

    /* Logging: one line, prefixed by the process role, rank and plugin name. */
#if defined(__GNUC__)
    __attribute__ ((format (printf, 3, 4)))
#endif
    void (*log) (const struct rx_host *h, int level, const char *fmt, ...);
    int  (*log_enabled) (const struct rx_host *h, int level);

    /* Allocation accounted to the plugin.  align: 0 or a power of two
     * (>= sizeof (void *)).  Returns NULL on failure.  Free with free_,
     * never with libc free(). */
    void *(*alloc) (const struct rx_host *h, size_t size, size_t align);
    void  (*free_) (const struct rx_host *h, void *p);

    /* Config of the plugin's own section [<kind>.<name>], already validated
     * against its declared keys.  A key that is not set in the file yields its
     * declared default; RX_ENOENT if neither exists (the key has no default)
     * or it was not declared.  Values are parsed by the declared type. */
    int (*cfg_str)    (const struct rx_host *h, const char *key, const char **out);
    int (*cfg_int)    (const struct rx_host *h, const char *key, int64_t *out);
    int (*cfg_float)  (const struct rx_host *h, const char *key, double *out);
    int (*cfg_bool)   (const struct rx_host *h, const char *key, int *out);
    int (*cfg_size)   (const struct rx_host *h, const char *key, uint64_t *out);   /* bytes */
    int (*cfg_seconds)(const struct rx_host *h, const char *key, double *out);     /* DURATION */
    /* 1 if the key was written in the INI file (not just defaulted), else 0. */
    int (*cfg_is_set) (const struct rx_host *h, const char *key);

    /* Metrics, exported by radixd's /metrics as radix_<plugin>_<name>.
     * register returns a handle >= 0 or a negative status. */
    int  (*metric_register) (const struct rx_host *h, const char *name, int type,
                             const char *help);
    void (*metric_add) (const struct rx_host *h, int handle, double v);
    void (*metric_set) (const struct rx_host *h, int handle, double v);

    /* ---- ABI 1.1 ---- */

    /* Long-running calls (a model's forward pass over many layers) call this
     * between units of work, e.g. after each layer: radixd's scheduler bumps
     * its liveness heartbeat, so a long prefill reads as busy, never as
     * hung.  Cheap (an atomic store and a clock read), never blocks, safe to
     * call from the thread that called the plugin.  A 1.0 core lacks it:
     * test RX_HAS (struct rx_host, h, progress) first. */
    void (*progress) (const struct rx_host *h);

    /* ---- ABI 1.1 ends here.  Append only below. ---- */
};

/* Log through the host if it has a logger (a convenience for plugins). */
#define RX_HLOG(h, level, ...) \
    do { if ((h) && (h)->log) (h)->log ((h), (level), __VA_ARGS__); } while (0)

#ifdef __cplusplus
}
#endif
#endif /* RADIX_HOST_H */
