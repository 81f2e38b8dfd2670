/* tools/eplb.c -- `radix eplb`: plan an expert placement offline from a
 * load file (a dump of the expert-distribution recorder, or any
 * {"load": [[...], ...]}) with an EPLB algorithm plugin, and print it as
 * the placement JSON of core/eplb.h (docs/eplb.md).
 *
 *   radix eplb --load FILE [--algorithm deepseek] [--physical R]
 *              [--groups K] [--nodes N] [--gpus G] [--config FILE]
 *
 * Defaults: deepseek, R = the file's experts (no redundancy), K = N = G = 1.
 * Exit: 0 ok; 1 a bad file or a problem the algorithm refuses (one line on
 * stderr); 2 usage. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <radix/eplb.h>

#include "boot.h"
#include "commands.h"
#include "eplb.h"

static void s_usage (FILE *f)
{
    fprintf (f,
             "usage: radix eplb --load FILE [--algorithm NAME] [--physical R] [--groups K]\n"
             "                  [--nodes N] [--gpus G] [--config FILE]\n"
             "  --load FILE       {\"load\": [[tokens per expert], ... per layer]}\n"
             "  --algorithm NAME  EPLB plugin (eplb-NAME.so): deepseek (default), greedy\n"
             "  --physical R      expert slots per layer (default: the experts, no redundancy)\n"
             "  --groups K        expert groups (default 1)\n"
             "  --nodes N         nodes (default 1)\n"
             "  --gpus G          GPUs (EP ranks) in all (default 1)\n"
             "  --config FILE     INI file ([plugins] path, [eplb.NAME] keys)\n"
             "prints {\"phy2log\", \"logcnt\", \"log2phy\", \"balancedness\"} as JSON\n");
}

static int s_posint (const char *opt, const char *v, int32_t *out)
{
    char *end;
    errno = 0;
    long x = strtol (v, &end, 10);
    if (errno || end == v || *end || x <= 0 || x > INT32_MAX) {
        fprintf (stderr, "radix eplb: --%s wants a positive integer, not \"%s\"\n", opt, v);
        return -1;
    }
    *out = (int32_t) x;
    return 0;
}

int rx_cmd_eplb (int argc, char **argv)
{
    static const struct option opts[] = {
        { "algorithm", required_argument, NULL, 'a' }, { "load", required_argument, NULL, 'l' },
        { "physical", required_argument, NULL, 'p' },  { "groups", required_argument, NULL, 'k' },
        { "nodes", required_argument, NULL, 'n' },     { "gpus", required_argument, NULL, 'g' },
        { "config", required_argument, NULL, 'c' },    { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *algo = "deepseek", *loadf = NULL, *config = NULL;
    int32_t phys = 0, groups = 1, nodes = 1, gpus = 1;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long (argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'a': algo = optarg; break;
        case 'l': loadf = optarg; break;
        case 'c': config = optarg; break;
        case 'p': bad = s_posint ("physical", optarg, &phys); break;
        case 'k': bad = s_posint ("groups", optarg, &groups); break;
        case 'n': bad = s_posint ("nodes", optarg, &nodes); break;
        case 'g': bad = s_posint ("gpus", optarg, &gpus); break;
        case 'h': s_usage (stdout); return 0;
        default:
            fprintf (stderr, "radix eplb: unknown or incomplete option \"%s\" (see --help)\n",
                     argv[optind - 1]);
            return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf (stderr, "radix eplb: unexpected argument \"%s\" (see --help)\n", argv[optind]);
        return 2;
    }
    if (!loadf) {
        fprintf (stderr, "radix eplb: --load FILE is required (see --help)\n");
        return 2;
    }

    struct rx_err err = { 0 };
    double *load = NULL;
    int32_t n_layer = 0, n_logical = 0;
    if (rx_eplb_load_read (loadf, &load, &n_layer, &n_logical, &err) != RX_OK) {
        fprintf (stderr, "radix eplb: %s\n", err.msg);
        return 1;
    }
    struct rx_boot b;
    if (rx_boot_open (&b, config, 0, &err) != RX_OK) {
        fprintf (stderr, "radix eplb: %s\n", err.msg);
        free (load);
        return 1;
    }
    int status = 1;
    struct rx_placement *pl = NULL;
    rx_plugin_t *plug = NULL;
    /* init with the config's [eplb.NAME] section first; compute's own init
     * is then a no-op */
    if (rx_loader_find (b.loader, RX_KIND_EPLB, algo, &plug, &err) != RX_OK
        || rx_plugin_init (plug, b.conf, &err) != RX_OK) {
        fprintf (stderr, "radix eplb: %s\n", err.msg);
        goto out;
    }
    struct rx_eplb_problem prob = {
        .struct_size = sizeof prob, .n_layer = n_layer, .n_logical = n_logical,
        .n_physical = phys ? phys : n_logical, .n_group = groups, .n_node = nodes, .n_gpu = gpus,
        .load = load,
    };
    pl = rx_eplb_compute (b.loader, algo, &prob, &err);
    if (!pl) {
        fprintf (stderr, "radix eplb: %s\n", err.msg);
        goto out;
    }
    if (rx_placement_write_json (stdout, pl, load, gpus, &err) != RX_OK || fflush (stdout) != 0) {
        fprintf (stderr, "radix eplb: %s\n", err.msg[0] ? err.msg : "cannot write the output");
        goto out;
    }
    status = 0;
out:
    rx_placement_free (&pl);
    rx_boot_close (&b);
    free (load);
    return status;
}
