/* core/radixd.c -- the radixd daemon's entry point: options, boot, then the
 * main process (core/server.c), which forks the scheduler and detokenizer. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boot.h"
#include "log.h"
#include "plugininfo.h"
#include "server.h"
#include "settings.h"

static void s_usage (FILE *f)
{
    fprintf (f,
        "usage: radixd -c FILE [options]\n"
        "  -c, --config FILE      the INI configuration (conf/radixd.ini is the reference)\n"
        "      --check-config     validate FILE (and the plugins it names) and exit 0 or 1\n"
        "      --list-plugins     list every plugin found in the plugin path and exit\n"
        "      --help-plugin NAME print a plugin's INI keys (NAME: fcfs, sched-fcfs or scheduler.fcfs)\n"
        "      --check-plugin FILE  run the loader's checks on one .so and print its descriptor\n"
        "      --help-config      print every core section and key\n"
        "  -V, --version          print version and plugin ABI\n"
        "  -h, --help             this text\n");
}

enum { OPT_CHECK_CONFIG = 256, OPT_LIST, OPT_HELP_PLUGIN, OPT_CHECK_PLUGIN, OPT_HELP_CONFIG };

int main (int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
        { "list-plugins", no_argument, NULL, OPT_LIST },
        { "help-plugin", required_argument, NULL, OPT_HELP_PLUGIN },
        { "check-plugin", required_argument, NULL, OPT_CHECK_PLUGIN },
        { "help-config", no_argument, NULL, OPT_HELP_CONFIG },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = NULL, *help_plugin = NULL, *check_plugin = NULL;
    int check_config = 0, list = 0, help_config = 0, c;
    while ((c = getopt_long (argc, argv, "c:Vh", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case OPT_CHECK_CONFIG: check_config = 1; break;
        case OPT_LIST: list = 1; break;
        case OPT_HELP_PLUGIN: help_plugin = optarg; break;
        case OPT_CHECK_PLUGIN: check_plugin = optarg; break;
        case OPT_HELP_CONFIG: help_config = 1; break;
        case 'V':
            printf ("radixd %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, RX_ABI_MAJOR, RX_ABI_MINOR);
            return 0;
        case 'h': s_usage (stdout); return 0;
        default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "radixd: unexpected argument \"%s\"\n", argv[optind]);
        s_usage (stderr);
        return 2;
    }
    if (help_config) {
        rx_print_config_help (stdout, rx_settings_schema ());
        return 0;
    }
    if (!config && check_config) {
        fprintf (stderr, "radixd: --check-config needs -c FILE\n");
        return 2;
    }
    if (!config && !list && !help_plugin && !check_plugin) {
        s_usage (stderr);
        return 2;
    }
    rx_log_set_role ("main", NULL);
    struct rx_boot b;
    struct rx_err err = { 0 };
    int diagnostic = list || help_plugin || check_plugin;
    if (rx_boot_open (&b, config, diagnostic ? 0 : RX_BOOT_CHECK_REFS, &err) != RX_OK) {
        fprintf (stderr, "radixd: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (check_plugin) {
        rc = rx_print_plugin_check (stdout, stderr, b.loader, check_plugin) == RX_OK ? 0 : 1;
    } else if (list) {
        rx_print_plugin_list (stdout, b.loader);
    } else if (help_plugin) {
        rc = rx_print_plugin_help (stdout, stderr, b.loader, help_plugin) == RX_OK ? 0 : 1;
    } else if (check_config) {
        printf ("%s: configuration OK\n", config);
    } else {
        rc = rx_server_main (&b);
    }
    rx_boot_close (&b);
    return rc;
}
