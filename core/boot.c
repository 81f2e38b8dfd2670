/* core/boot.c -- see boot.h. */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boot.h"
#include "log.h"
#include "settings.h"

static const struct rx_cfg_key *s_plugin_keys (void *ud, int kind, const char *name,
                                               struct rx_err *err)
{
    static const struct rx_cfg_key none[] = { { NULL, 0, NULL, NULL, 0, 0, NULL } };
    rx_plugin_t *p;
    if (rx_loader_find (ud, kind, name, &p, err) != RX_OK)
        return NULL;
    const struct rx_cfg_key *k = rx_plugin_desc (p)->keys;
    return k ? k : none;
}

/* Relative plugin dirs in the INI are relative to the INI file's folder. */
static char *s_resolve_dirs (const char *list, const char *conf_path)
{
    char base[PATH_MAX] = ".";
    const char *slash = conf_path ? strrchr (conf_path, '/') : NULL;
    if (slash)
        snprintf (base, sizeof base, "%.*s", (int) (slash - conf_path), conf_path);
    size_t cap = strlen (list) * 2 + 64 + strlen (base) * 8, off = 0;
    char *out = malloc (cap);
    if (!out) return NULL;
    out[0] = '\0';
    while (*list) {
        const char *colon = strchr (list, ':');
        size_t n = colon ? (size_t) (colon - list) : strlen (list);
        if (n) {
            int w;
            if (list[0] == '/')
                w = snprintf (out + off, cap - off, "%s%.*s", off ? ":" : "", (int) n, list);
            else
                w = snprintf (out + off, cap - off, "%s%s/%.*s", off ? ":" : "", base, (int) n, list);
            if (w < 0 || (size_t) w >= cap - off) {
                size_t ncap = cap * 2 + (size_t) (w > 0 ? w : 0);
                char *no = realloc (out, ncap);
                if (!no) { free (out); return NULL; }
                out = no;
                cap = ncap;
                continue;   /* redo this entry */
            }
            off += (size_t) w;
        }
        list = colon ? colon + 1 : list + n;
    }
    return out;
}

int rx_boot_open (struct rx_boot *b, const char *path, int flags, struct rx_err *err)
{
    return rx_boot_open_schema (b, path, flags, rx_settings_schema (), rx_settings_plugin_refs (), err);
}

int rx_boot_open_schema (struct rx_boot *b, const char *path, int flags,
                         const struct rx_conf_section *schema, const struct rx_plugin_ref *refs,
                         struct rx_err *err)
{
    memset (b, 0, sizeof *b);
    b->conf = path ? rx_conf_parse_file (path, err) : rx_conf_new_empty ("(defaults)");
    if (!b->conf) {
        if (!path) rx_err_set (err, RX_ENOMEM, "out of memory");
        return err ? err->code : RX_ECONFIG;
    }
    const char *dirs = rx_conf_raw (b->conf, "plugins", "path", NULL);
    char *resolved = dirs ? s_resolve_dirs (dirs, path) : NULL;
    b->loader = rx_loader_new (resolved, err);
    free (resolved);
    if (!b->loader) {
        rx_boot_close (b);
        return RX_ENOMEM;
    }
    int rc = rx_conf_validate (b->conf, schema, s_plugin_keys, b->loader, err);
    for (const struct rx_plugin_ref *r = refs;
         rc == RX_OK && r && (flags & RX_BOOT_CHECK_REFS) && r->section; r++) {
        const char *name = rx_conf_str (b->conf, r->section, r->key, NULL);
        if (!name) continue;
        rx_plugin_t *p;
        struct rx_err perr = { 0 };
        if (rx_loader_find (b->loader, r->kind, name, &p, &perr) != RX_OK) {
            int line = 0;
            rx_conf_raw (b->conf, r->section, r->key, &line);
            if (line > 0)
                rc = rx_err_set (err, RX_ECONFIG, "%s:%d [%s]: %s = \"%s\": %s", rx_conf_name (b->conf),
                                 line, r->section, r->key, name, perr.msg);
            else
                rc = rx_err_set (err, RX_ECONFIG, "%s [%s]: %s = \"%s\" (default): %s", rx_conf_name (b->conf),
                                 r->section, r->key, name, perr.msg);
        }
    }
    if (rc == RX_OK) {
        int level = rx_log_level_parse (rx_conf_str (b->conf, "log", "level", "info"));
        rx_log_set_level (level < 0 ? RX_LOG_INFO : level);
        const char *file = rx_conf_str (b->conf, "log", "file", "-");
        if (rx_log_set_file (file) < 0) {
            int line = 0;
            rx_conf_raw (b->conf, "log", "file", &line);
            rc = rx_err_set (err, RX_ECONFIG, "%s:%d [log]: file = \"%s\": cannot open for appending",
                             rx_conf_name (b->conf), line, file);
        }
    }
    if (rc != RX_OK)
        rx_boot_close (b);
    return rc;
}

void rx_boot_close (struct rx_boot *b)
{
    rx_loader_destroy (&b->loader);
    rx_conf_destroy (&b->conf);
}

int rx_boot_plugin (struct rx_boot *b, const char *section, const char *key, int kind,
                    rx_plugin_t **out, struct rx_err *err)
{
    const char *name = rx_conf_str (b->conf, section, key, NULL);
    if (!name)
        return rx_err_set (err, RX_ECONFIG, "%s: [%s] %s is not set", rx_conf_name (b->conf), section, key);
    int rc = rx_loader_find (b->loader, kind, name, out, err);
    if (rc == RX_OK)
        rc = rx_plugin_init (*out, b->conf, err);
    return rc;
}
