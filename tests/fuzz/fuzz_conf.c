/* tests/fuzz/fuzz_conf.c -- libFuzzer harness for the INI loader (core/conf.c)
 * with validation against the real schemas: radixd's (core/settings.c) and
 * radix-router's (router/router_settings.c, then rx_router_settings_load),
 * and plugin sections ([kernels.fuzz], [router.fuzz], ...) checked against a
 * key table that declares every key type with ranges, defaults and choices.
 *
 * Every input must parse, or be refused with one non-empty error line that
 * names the source; a parsed file must validate or be refused the same way;
 * a validated file answers every typed getter, and a value read back parses
 * as its key's type.  The first input byte picks the schema (even: radixd,
 * odd: radix-router); the rest is the INI text.  Build and run:
 * tests/fuzz/run.sh conf.  Inputs it once failed on live in
 * tests/fuzz/regressions-conf/ (replayed by tests/fuzz/replay_conf). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "router_settings.h"
#include "settings.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

/* A plugin that declares one key of every type, with ranges and choices. */
static const struct rx_cfg_key s_keys[] = {
    { "s", RX_CFG_STRING, "x", "a string", 0, 0, NULL },
    { "i", RX_CFG_INT, "3", "an int in range", -5, 1000, NULL },
    { "iu", RX_CFG_INT, NULL, "an int, no range, no default", 0, 0, NULL },
    { "f", RX_CFG_FLOAT, "0.5", "a float in range", 0, 1, NULL },
    { "b", RX_CFG_BOOL, "true", "a bool", 0, 0, NULL },
    { "z", RX_CFG_SIZE, "64K", "a size", 0, 1e12, NULL },
    { "d", RX_CFG_DURATION, "250ms", "a duration", 0, 3600, NULL },
    { "e", RX_CFG_ENUM, "a", "an enum", 0, 0, "a|bb|ccc" },
    { "p", RX_CFG_PATH, NULL, "a path", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key *s_plugin_keys (void *ud, int kind, const char *name,
                                               struct rx_err *err)
{
    (void) ud;
    if (kind <= 0 || kind >= RX_KIND_COUNT_) abort ();      /* the schema's own kinds only */
    if (strcmp (name, "fuzz") == 0) return s_keys;
    rx_err_set (err, RX_ENOENT, "no plugin \"%s\" of kind %d", name, kind);
    return NULL;
}

static void s_need_msg (const struct rx_err *err)
{
    /* One line that names where: the source name is "fuzz.ini". */
    if (!err->msg[0] || strchr (err->msg, '\n') || !strstr (err->msg, "fuzz.ini")) {
        fprintf (stderr, "bad error message: \"%s\"\n", err->msg);
        abort ();
    }
}

/* Read back every declared key of section sec through the typed getters. */
static void s_read_keys (rx_conf_t *c, const char *sec, const struct rx_cfg_key *keys)
{
    for (const struct rx_cfg_key *k = keys; k && k->name; k++) {
        struct rx_cfg_value v;
        struct rx_err err = { 0 };
        int rc = rx_conf_value_in (c, sec, keys, k->name, &v, &err);
        if (rc == RX_OK) {
            if (!v.s) abort ();
            /* What validation accepted parses again, to the same number. */
            struct rx_cfg_value again;
            char why[200];
            if (rx_cfg_value_parse (k, v.s, &again, why, sizeof why) != RX_OK) {
                fprintf (stderr, "[%s] %s = \"%s\" validated but does not parse: %s\n",
                         sec, k->name, v.s, why);
                abort ();
            }
            if (again.i != v.i || again.u != v.u) abort ();
        } else if (rc != RX_ENOENT || !err.msg[0]) {
            abort ();
        }
        switch (k->type) {
        case RX_CFG_INT: (void) rx_conf_int (c, sec, k->name, 7); break;
        case RX_CFG_FLOAT: case RX_CFG_DURATION: (void) rx_conf_float (c, sec, k->name, 7); break;
        case RX_CFG_BOOL: (void) rx_conf_bool (c, sec, k->name, 1); break;
        case RX_CFG_SIZE: (void) rx_conf_size (c, sec, k->name, 7); break;
        default: (void) rx_conf_str (c, sec, k->name, "dflt"); break;
        }
    }
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int router = data[0] & 1;
    /* an exact-size copy, so ASan sees any read past the text */
    size_t len = size - 1;
    char *text = malloc (len ? len : 1);
    if (!text) return 0;
    memcpy (text, data + 1, len);
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_string (text, len, "fuzz.ini", &err);
    free (text);                   /* the conf must have copied what it keeps */
    if (!c) {
        s_need_msg (&err);
        return 0;
    }
    const struct rx_conf_section *schema = router ? rx_router_schema () : rx_settings_schema ();
    int rc = rx_conf_validate (c, schema, s_plugin_keys, NULL, &err);
    if (rc != RX_OK) {
        if (rc != RX_ECONFIG) abort ();
        s_need_msg (&err);
        rx_conf_destroy (&c);
        if (c) abort ();
        return 0;
    }
    int line;
    for (size_t i = 0; rx_conf_section_at (c, i, &line); i++) {
        const char *sec = rx_conf_section_at (c, i, &line);
        if (!rx_conf_has_section (c, sec)) abort ();
        const struct rx_conf_section *cs = NULL;
        for (const struct rx_conf_section *k = schema; k->name; k++)
            if (strcmp (k->name, sec) == 0) cs = k;
        s_read_keys (c, sec, cs ? cs->keys : s_keys);
    }
    if (router) {
        struct rx_router_settings s;
        memset (&s, 0, sizeof s);
        rc = rx_router_settings_load (c, &s, &err);
        if (rc != RX_OK) s_need_msg (&err);
        else if (!s.host || !s.policy || s.port < 0 || s.port > 65535) abort ();
    }
    /* A command-line override after validation: accepted or one clear error. */
    struct rx_err serr = { 0 };
    if (rx_conf_set (c, "log", "level", "debug", &serr) != RX_OK && !serr.msg[0]) abort ();
    rx_conf_destroy (&c);
    if (c) abort ();
    return 0;
}
