/* core/loader.h -- finds, opens and checks plugins; hands each its host table.
 *
 * Search order for a plugin by name: [plugins] path (colon-separated), then
 * $RADIX_PLUGIN_PATH, then the install dir (RX_PLUGINDIR).  A plugin of kind
 * K named N lives in "<prefix(K)>-<N>.so" (kernels-cpu.so, sched-fcfs.so).
 * Names are [A-Za-z0-9_.-] without "..": a name never escapes those dirs.
 *
 * Checks, in order, stopping at the first failure (one line naming the file,
 * the reason and both ABI versions): ELF header, dlopen (RTLD_NOW |
 * RTLD_LOCAL), the rx_plugin_entry symbol, magic, ABI major, ABI minor,
 * descriptor size, build tag, kind, required fields, ops size for the kind,
 * the declared key table.  Plugins are dlclose'd only when the loader is
 * destroyed at shutdown (a plugin may own threads).  Not thread-safe. */
#ifndef RX_LOADER_H
#define RX_LOADER_H

#include <radix/err.h>
#include <radix/host.h>
#include <radix/plugin.h>

#include "conf.h"

typedef struct rx_loader rx_loader_t;
typedef struct rx_plugin rx_plugin_t;

/* Kind names: the INI section ("kernels"), the file prefix ("kernels") and
 * a title ("kernel backend").  NULL for an unknown kind. */
const char *rx_kind_section (int kind);
const char *rx_kind_prefix (int kind);
const char *rx_kind_title (int kind);
/* Kind from its section name or prefix; 0 if none. */
int rx_kind_from_name (const char *name);
/* Minimum ops-table size the core needs for a kind (ABI 1.0 layout). */
size_t rx_kind_min_ops_size (int kind);

/* conf_path: the [plugins] path value or NULL.  Caller owns the result. */
rx_loader_t *rx_loader_new (const char *conf_path, struct rx_err *err);
/* Calls fini of every initialised plugin, then dlcloses all.  NULLs *self_p. */
void rx_loader_destroy (rx_loader_t **self_p);

/* The directories searched, in order (for messages and --list-plugins). */
size_t rx_loader_dir_count (const rx_loader_t *l);
const char *rx_loader_dir (const rx_loader_t *l, size_t i);

/* Open the plugin file at PATH and run every check.  expect_kind 0 accepts
 * any kind.  The loader owns the plugin.  Opening the same file twice
 * returns the same plugin. */
int rx_loader_open (rx_loader_t *l, const char *path, int expect_kind,
                    rx_plugin_t **out, struct rx_err *err);
/* Find plugin NAME of KIND in the search dirs and open it.  NAME may also be
 * the file stem ("kernels-cpu"). */
int rx_loader_find (rx_loader_t *l, int kind, const char *name,
                    rx_plugin_t **out, struct rx_err *err);

/* Call fn for every "*.so" in the search dirs, in order: plugin set on
 * success, else err says why it was refused.  A name already seen in an
 * earlier dir is reported with shadowed = 1. */
typedef void (*rx_loader_scan_fn) (void *ud, const char *path, rx_plugin_t *plugin,
                                   const struct rx_err *err, int shadowed);
void rx_loader_scan (rx_loader_t *l, rx_loader_scan_fn fn, void *ud);

/* Run the plugin's init (once) with a host table bound to its INI section
 * [<kind>.<name>] of conf (conf may be NULL: defaults only). */
int rx_plugin_init (rx_plugin_t *p, const rx_conf_t *conf, struct rx_err *err);

const struct rx_plugin_desc *rx_plugin_desc (const rx_plugin_t *p);
const char *rx_plugin_path (const rx_plugin_t *p);
/* The ops table, valid until the loader is destroyed. */
const void *rx_plugin_ops (const rx_plugin_t *p);
/* The host table bound to this plugin (valid after rx_plugin_init, or
 * defaults-only before it). */
const struct rx_host *rx_plugin_host (rx_plugin_t *p);
/* The plugin-wide state its init returned. */
void *rx_plugin_state (const rx_plugin_t *p);
/* "kernels.cpu": the plugin's INI section. */
const char *rx_plugin_section (const rx_plugin_t *p);

#endif
