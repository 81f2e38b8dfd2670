/* core/boot.h -- the start-up sequence shared by radixd and the radix CLI:
 * parse the INI file, build the plugin search path from it, validate every
 * section (plugin sections against the plugins' declared keys), check that
 * every plugin the file names can be loaded, and apply [log]. */
#ifndef RX_BOOT_H
#define RX_BOOT_H

#include <radix/err.h>

#include "conf.h"
#include "loader.h"

struct rx_boot {
    rx_conf_t   *conf;
    rx_loader_t *loader;
};

enum {
    RX_BOOT_CHECK_REFS = 1   /* also load every plugin a core key names */
};

/* path NULL: no file, defaults only.  On failure err holds one line (with
 * file:line for INI problems) and b is left closed.  Diagnostic commands
 * (--list-plugins, --help-plugin) pass flags 0, so that a config naming a
 * missing plugin can still be inspected. */
int  rx_boot_open (struct rx_boot *b, const char *path, int flags, struct rx_err *err);
/* As rx_boot_open with another daemon's schema (radix-router's
 * router/settings.c) and its plugin-naming keys (terminated by an entry with
 * section NULL; NULL = none).  Both must outlive b. */
struct rx_plugin_ref;
int  rx_boot_open_schema (struct rx_boot *b, const char *path, int flags,
                          const struct rx_conf_section *schema, const struct rx_plugin_ref *refs,
                          struct rx_err *err);
void rx_boot_close (struct rx_boot *b);

/* Load the plugin a core key names (e.g. "kernels", "backend") and run its
 * init bound to its section. */
int  rx_boot_plugin (struct rx_boot *b, const char *section, const char *key, int kind,
                     rx_plugin_t **out, struct rx_err *err);

#endif
