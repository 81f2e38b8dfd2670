/* core/plugininfo.c -- see plugininfo.h. */
#include "config.h"

#include <string.h>

#include "plugininfo.h"

static void s_list_one (void *ud, const char *path, rx_plugin_t *p, const struct rx_err *err,
                        int shadowed)
{
    FILE *out = ud;
    if (shadowed) {
        fprintf (out, "%-10s %-16s %-8s %-5s %s (shadowed by an earlier directory)\n",
                 "-", "-", "-", "-", path);
        return;
    }
    if (!p) {
        fprintf (out, "%-10s %-16s %-8s %-5s %s\n    refused: %s\n", "?", "?", "-", "-", path,
                 err ? err->msg : "unknown error");
        return;
    }
    const struct rx_plugin_desc *d = rx_plugin_desc (p);
    char abi[16];
    snprintf (abi, sizeof abi, "%u.%u", (unsigned) d->abi_major, (unsigned) d->abi_minor);
    fprintf (out, "%-10s %-16s %-8s %-5s %s\n", rx_kind_section ((int) d->kind), d->name,
             d->version, abi, rx_plugin_path (p));
}

void rx_print_plugin_list (FILE *out, rx_loader_t *l)
{
    fprintf (out, "%-10s %-16s %-8s %-5s %s\n", "KIND", "NAME", "VERSION", "ABI", "PATH");
    rx_loader_scan (l, s_list_one, out);
    fprintf (out, "searched:");
    for (size_t i = 0; i < rx_loader_dir_count (l); i++)
        fprintf (out, " %s", rx_loader_dir (l, i));
    fprintf (out, "\n");
}

void rx_print_keys (FILE *out, const struct rx_cfg_key *keys)
{
    if (!keys || !keys->name) {
        fprintf (out, "  (no keys)\n");
        return;
    }
    for (const struct rx_cfg_key *k = keys; k->name; k++) {
        char expect[200];
        rx_cfg_key_expect (k, expect, sizeof expect);
        fprintf (out, "  %-24s %-9s default: %s\n      %s\n      expects %s\n", k->name,
                 rx_cfg_type_name (k->type), k->def ? k->def : "(unset)", k->help ? k->help : "",
                 expect);
    }
}

static void s_describe (FILE *out, rx_plugin_t *p)
{
    const struct rx_plugin_desc *d = rx_plugin_desc (p);
    fprintf (out, "%s-%s %s -- %s\n", rx_kind_prefix ((int) d->kind), d->name, d->version,
             d->description);
    fprintf (out, "  kind: %s (%s)\n  ABI: %u.%u (radixd %d.%d)\n  build tag: %s\n  file: %s\n"
             "  INI section: [%s]\n", rx_kind_title ((int) d->kind), rx_kind_section ((int) d->kind),
             (unsigned) d->abi_major, (unsigned) d->abi_minor, RX_ABI_MAJOR, RX_ABI_MINOR,
             d->build_tag, rx_plugin_path (p), rx_plugin_section (p));
    fprintf (out, "keys:\n");
    rx_print_keys (out, d->keys);
}

int rx_print_plugin_help (FILE *out, FILE *err_out, rx_loader_t *l, const char *name)
{
    struct rx_err err = { 0 };
    rx_plugin_t *p = NULL;
    const char *dot = strchr (name, '.');
    const char *dash = strchr (name, '-');
    int kind = 0;
    const char *base = name;
    char kname[64];
    if (dot || dash) {
        const char *sep = dot ? dot : dash;
        snprintf (kname, sizeof kname, "%.*s", (int) (sep - name), name);
        kind = rx_kind_from_name (kname);
        if (kind) base = sep + 1;
    }
    if (kind) {
        if (rx_loader_find (l, kind, base, &p, &err) != RX_OK) {
            fprintf (err_out, "radixd: %s\n", err.msg);
            return err.code;
        }
    } else {
        /* A bare name: try every kind; it must be unambiguous. */
        int found = 0;
        for (int k = 1; k < RX_KIND_COUNT_; k++) {
            rx_plugin_t *q;
            struct rx_err e2 = { 0 };
            if (rx_kind_section (k) && rx_loader_find (l, k, name, &q, &e2) == RX_OK) {
                if (found++) {
                    fprintf (err_out, "radixd: \"%s\" is ambiguous: both %s-%s and %s-%s exist; name the kind (e.g. %s.%s)\n",
                             name, rx_kind_prefix ((int) rx_plugin_desc (p)->kind), name,
                             rx_kind_prefix (k), name, rx_kind_section (k), name);
                    return RX_EINVAL;
                }
                p = q;
            } else if (e2.code != RX_ENOENT && e2.code != RX_OK) {
                fprintf (err_out, "radixd: %s\n", e2.msg);
                return e2.code;
            }
        }
        if (!p) {
            fprintf (err_out, "radixd: no plugin named \"%s\" in", name);
            for (size_t i = 0; i < rx_loader_dir_count (l); i++)
                fprintf (err_out, "%s%s", i ? ":" : " ", rx_loader_dir (l, i));
            fprintf (err_out, " (see radixd --list-plugins)\n");
            return RX_ENOENT;
        }
    }
    s_describe (out, p);
    return RX_OK;
}

int rx_print_plugin_check (FILE *out, FILE *err_out, rx_loader_t *l, const char *file)
{
    struct rx_err err = { 0 };
    rx_plugin_t *p;
    if (rx_loader_open (l, file, 0, &p, &err) != RX_OK) {
        fprintf (err_out, "radixd: %s\n", err.msg);
        return err.code;
    }
    s_describe (out, p);
    fprintf (out, "OK: %s passes every loader check\n", rx_plugin_path (p));
    return RX_OK;
}

void rx_print_config_help (FILE *out, const struct rx_conf_section *schema)
{
    for (const struct rx_conf_section *s = schema; s->name; s++) {
        fprintf (out, "[%s]  %s\n", s->name, s->help ? s->help : "");
        rx_print_keys (out, s->keys);
        fprintf (out, "\n");
    }
}
