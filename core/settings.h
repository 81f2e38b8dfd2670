/* core/settings.h -- the sections and keys the core itself knows.
 *
 * This table is the source of truth for radixd's INI schema: validation,
 * --help-config and the reference conf/radixd.ini (a test checks that every
 * key here is documented there) come from it.  Sections grow as features
 * land. */
#ifndef RX_SETTINGS_H
#define RX_SETTINGS_H

#include "conf.h"

/* The core schema, terminated by an entry with name NULL. */
const struct rx_conf_section *rx_settings_schema (void);

/* The [log] and [plugins] key tables, shared with radix-router's schema
 * (router/router_settings.c), so both daemons read them the same way. */
extern const struct rx_cfg_key rx_settings_log_keys[];
extern const struct rx_cfg_key rx_settings_plugins_keys[];

/* A core key whose value names a plugin, e.g. [kernels] backend = cpu. */
struct rx_plugin_ref {
    const char *section;
    const char *key;
    int kind;
};
/* Terminated by an entry with section NULL. */
const struct rx_plugin_ref *rx_settings_plugin_refs (void);

#endif
