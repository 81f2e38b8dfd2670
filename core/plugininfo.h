/* core/plugininfo.h -- human-readable listings of plugins and config keys,
 * shared by radixd (--list-plugins, --help-plugin, --check-plugin,
 * --help-config) and the radix CLI. */
#ifndef RX_PLUGININFO_H
#define RX_PLUGININFO_H

#include <stdio.h>

#include "conf.h"
#include "loader.h"

/* One line per plugin found: kind, name, version, ABI, path; refused files
 * with their reason. */
void rx_print_plugin_list (FILE *out, rx_loader_t *l);
/* NAME: "fcfs", "sched-fcfs" or "scheduler.fcfs".  Errors go to err_out. */
int  rx_print_plugin_help (FILE *out, FILE *err_out, rx_loader_t *l, const char *name);
/* Runs every loader check on FILE and prints the descriptor. */
int  rx_print_plugin_check (FILE *out, FILE *err_out, rx_loader_t *l, const char *file);
/* The key table as aligned text. */
void rx_print_keys (FILE *out, const struct rx_cfg_key *keys);
void rx_print_config_help (FILE *out, const struct rx_conf_section *schema);

#endif
