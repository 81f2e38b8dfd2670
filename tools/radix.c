/* tools/radix.c -- the radix tool CLI: offline commands around the engine.
 *
 *   radix plugins [--config FILE]     list plugins (as radixd --list-plugins)
 *   radix version
 *
 * Later milestones add generate, tokenize, chat, gguf-gen, bench and eplb;
 * each is one entry in the command table below. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "boot.h"
#include "log.h"
#include "commands.h"
#include "plugininfo.h"

static int s_cmd_version (int argc, char **argv)
{
    (void) argc; (void) argv;
    printf ("radix %s (plugin ABI %d.%d)\n", PACKAGE_VERSION, RX_ABI_MAJOR, RX_ABI_MINOR);
    return 0;
}

static int s_cmd_plugins (int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' }, { NULL, 0, NULL, 0 }
    };
    const char *config = NULL;
    int c;
    while ((c = getopt_long (argc, argv, "c:", opts, NULL)) != -1) {
        if (c == 'c') config = optarg;
        else return 2;
    }
    struct rx_boot b;
    struct rx_err err = { 0 };
    if (rx_boot_open (&b, config, 0, &err) != RX_OK) {
        fprintf (stderr, "radix: %s\n", err.msg);
        return 1;
    }
    rx_print_plugin_list (stdout, b.loader);
    rx_boot_close (&b);
    return 0;
}

static const struct {
    const char *name;
    int (*fn) (int argc, char **argv);
    const char *help;
} s_cmds[] = {
    { "plugins", s_cmd_plugins, "list plugins found in the plugin path [--config FILE]" },
    { "gguf-gen", rx_cmd_gguf_gen, "write a random-weight model GGUF (--arch llama --preset tiny ...)" },
    { "tokenize", rx_cmd_tokenize, "print the token ids of a text or chat (--model F.gguf --text ...)" },
    { "generate", rx_cmd_generate, "continue a prompt with a model (--model F.gguf --prompt ... [--ids])" },
    { "chat", rx_cmd_chat, "chat with a model using its chat template (--model F.gguf)" },
    { "bench", rx_cmd_bench, "prompt/generation/batched-decode speed table (--model F.gguf --threads T)" },
    { "eplb", rx_cmd_eplb, "plan an expert placement from a load file (--algorithm deepseek --load F ...)" },
    { "version", s_cmd_version, "print version and plugin ABI" },
};

static void s_usage (FILE *f)
{
    fprintf (f, "usage: radix COMMAND [options]\ncommands:\n");
    for (size_t i = 0; i < sizeof s_cmds / sizeof s_cmds[0]; i++)
        fprintf (f, "  %-10s %s\n", s_cmds[i].name, s_cmds[i].help);
}

int main (int argc, char **argv)
{
    rx_log_set_role ("radix", NULL);
    if (argc < 2) {
        s_usage (stderr);
        return 2;
    }
    if (!strcmp (argv[1], "-h") || !strcmp (argv[1], "--help") || !strcmp (argv[1], "help")) {
        s_usage (stdout);
        return 0;
    }
    if (!strcmp (argv[1], "--version") || !strcmp (argv[1], "-V"))
        return s_cmd_version (argc, argv);
    for (size_t i = 0; i < sizeof s_cmds / sizeof s_cmds[0]; i++)
        if (strcmp (argv[1], s_cmds[i].name) == 0)
            return s_cmds[i].fn (argc - 1, argv + 1);
    fprintf (stderr, "radix: unknown command \"%s\"\n", argv[1]);
    s_usage (stderr);
    return 2;
}
