/* tests/unit/test_conf.c -- INI parsing and validation: every error path
 * names file:line, the section and key, and what was expected. */
#include <criterion/criterion.h>
#include <string.h>

#include "conf.h"
#include "settings.h"
#include "../testutil.h"

static const struct rx_cfg_key s_keys[] = {
    { "count", RX_CFG_INT, "4", "", 1, 64, NULL },
    { "ratio", RX_CFG_FLOAT, "0.5", "", 0, 1, NULL },
    { "on", RX_CFG_BOOL, "false", "", 0, 0, NULL },
    { "mem", RX_CFG_SIZE, "1MiB", "", 0, 0, NULL },
    { "wait", RX_CFG_DURATION, "2s", "", 0, 0, NULL },
    { "mode", RX_CFG_ENUM, "fast", "", 0, 0, "fast|safe" },
    { "name", RX_CFG_STRING, NULL, "", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};
static const struct rx_cfg_key s_other_keys[] = {
    { "x", RX_CFG_INT, "1", "", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};
static const struct rx_conf_section s_schema[] = {
    { "main", "", s_keys, 0 },
    { "other", "", s_other_keys, RX_KIND_SCHED_POLICY },
    { NULL, NULL, NULL, 0 }
};

/* Plugin lookup stub: only "scheduler"-kind plugin "good" exists, keys x. */
static const struct rx_cfg_key s_plugin_keys[] = {
    { "depth", RX_CFG_INT, "4", "", 1, 8, NULL },
    { "label", RX_CFG_STRING, NULL, "", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};
static const struct rx_cfg_key *s_lookup (void *ud, int kind, const char *name, struct rx_err *err)
{
    (void) ud;
    if (kind == RX_KIND_SCHED_POLICY && strcmp (name, "good") == 0)
        return s_plugin_keys;
    rx_err_set (err, RX_ENOENT, "no schedule policy named \"%s\"", name);
    return NULL;
}

/* Parse and validate text as file "t.ini"; returns the error (code 0 = ok). */
static struct rx_err s_check (const char *text)
{
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "t.ini", &err);
    if (c) {
        rx_conf_validate (c, s_schema, s_lookup, NULL, &err);
        rx_conf_destroy (&c);
        cr_assert_null (c);
    }
    return err;
}

#define EXPECT_ERR(text, ...)                                                   \
    do {                                                                        \
        struct rx_err e_ = s_check (text);                                      \
        cr_assert_neq (e_.code, RX_OK, "expected an error for:\n%s", text);     \
        const char *want_[] = { __VA_ARGS__ };                                  \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)          \
            cr_assert (strstr (e_.msg, want_[i_]), "message \"%s\" lacks \"%s\"", \
                       e_.msg, want_[i_]);                                      \
        cr_assert_null (strchr (e_.msg, '\n'), "one line: %s", e_.msg);         \
    } while (0)

Test (conf, parses_every_type_and_defaults)
{
    const char *text =
        "; comment\n"
        "# another\n"
        "[main]\n"
        "count = 8\n"
        "ratio = 0.25 ; inline comment\n"
        "on = yes\n"
        "mem = 16MiB\n"
        "wait = 250ms\n"
        "mode = safe\n"
        "\n"
        "[other]\n";
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "t.ini", &err);
    cr_assert_not_null (c, "%s", err.msg);
    cr_assert_eq (rx_conf_validate (c, s_schema, s_lookup, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_conf_int (c, "main", "count", -1), 8);
    cr_assert_float_eq (rx_conf_float (c, "main", "ratio", -1), 0.25, 1e-12);
    cr_assert_eq (rx_conf_bool (c, "main", "on", -1), 1);
    cr_assert_eq (rx_conf_size (c, "main", "mem", 0), 16u << 20);
    cr_assert_float_eq (rx_conf_float (c, "main", "wait", -1), 0.25, 1e-12);
    cr_assert_str_eq (rx_conf_str (c, "main", "mode", "?"), "safe");
    /* unset key without default: the caller's fallback */
    cr_assert_str_eq (rx_conf_str (c, "main", "name", "fallback"), "fallback");
    /* a section absent from the file still yields schema defaults */
    cr_assert_eq (rx_conf_int (c, "other", "x", -7), 1);
    int line = 0;
    cr_assert_str_eq (rx_conf_raw (c, "main", "mode", &line), "safe");
    cr_assert_eq (line, 9);
    /* CLI override */
    cr_assert_eq (rx_conf_set (c, "main", "count", "3", &err), RX_OK);
    cr_assert_eq (rx_conf_int (c, "main", "count", -1), 3);
    rx_conf_destroy (&c);
}

Test (conf, defaults_when_unset)
{
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_string ("[main]\n", 7, "t.ini", &err);
    cr_assert_not_null (c);
    cr_assert_eq (rx_conf_validate (c, s_schema, s_lookup, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_conf_int (c, "main", "count", -1), 4);
    cr_assert_eq (rx_conf_size (c, "main", "mem", 0), 1u << 20);
    cr_assert_float_eq (rx_conf_float (c, "main", "wait", -1), 2.0, 1e-12);
    struct rx_cfg_value v;
    cr_assert_eq (rx_conf_value (c, "main", "name", &v, &err), RX_ENOENT);
    cr_assert (strstr (err.msg, "no default"), "%s", err.msg);
    rx_conf_destroy (&c);
}

Test (conf, unknown_section_lists_known)
{
    EXPECT_ERR ("[main]\ncount = 2\n\n[mian]\ncount = 3\n",
                "t.ini:4", "unknown section [mian]", "known sections: main, other");
}

Test (conf, unknown_key_lists_valid_keys)
{
    EXPECT_ERR ("[main]\ncount = 2\ncuont = 3\n",
                "t.ini:3 [main]", "unknown key \"cuont\"",
                "known keys: count, ratio, on, mem, wait, mode, name");
}

Test (conf, wrong_type_names_key_and_type)
{
    EXPECT_ERR ("[main]\n\ncount = many\n", "t.ini:3 [main]", "count = \"many\"", "wrong type",
                "an integer in 1..64");
    EXPECT_ERR ("[main]\non = maybe\n", "t.ini:2 [main]", "on = \"maybe\"", "a boolean");
    EXPECT_ERR ("[main]\nratio = 0.5x\n", "t.ini:2", "a number in 0..1");
    EXPECT_ERR ("[main]\nmem = 12 parsecs\n", "t.ini:2", "mem", "a size in bytes");
    EXPECT_ERR ("[main]\nwait = soon\n", "t.ini:2", "wait", "a duration");
    EXPECT_ERR ("[main]\nmode = turbo\n", "t.ini:2", "mode = \"turbo\"", "one of fast|safe");
    EXPECT_ERR ("[main]\ncount = 3.5\n", "t.ini:2", "count");
    EXPECT_ERR ("[main]\ncount = 99999999999999999999999\n", "t.ini:2", "count");
}

Test (conf, out_of_range_names_range)
{
    EXPECT_ERR ("[main]\ncount = 0\n", "t.ini:2 [main]", "count = \"0\"", "out of range",
                "an integer in 1..64");
    EXPECT_ERR ("[main]\ncount = 65\n", "t.ini:2", "out of range");
    EXPECT_ERR ("[main]\nratio = 1.5\n", "t.ini:2", "ratio", "out of range", "0..1");
    EXPECT_ERR ("[main]\nmem = -1\n", "t.ini:2", "mem");
}

Test (conf, syntax_errors_have_lines)
{
    EXPECT_ERR ("[main]\ncount = 2\nthis line has no equals sign\n", "t.ini:3", "syntax error");
    EXPECT_ERR ("[main\ncount = 2\n", "t.ini:1", "syntax error");
    EXPECT_ERR ("count = 2\n[main]\n", "t.ini:1", "outside any section");
    EXPECT_ERR ("[main]\ncount = 2\n\ncount = 3\n", "t.ini:4 [main]", "duplicate key \"count\"",
                "first set at line 2");
    EXPECT_ERR ("[main]\n[other]\n[main]\n", "t.ini:3", "section [main] appears twice");
    EXPECT_ERR ("[]\n", "t.ini:1", "empty section");
}

Test (conf, first_error_in_file_order)
{
    /* A bad value on line 2 is reported before an unknown key on line 3. */
    EXPECT_ERR ("[main]\ncount = x\nbogus = 1\n", "t.ini:2", "count");
}

Test (conf, overlong_line)
{
    char text[1024];
    snprintf (text, sizeof text, "[main]\nname = %0600d\n", 7);
    EXPECT_ERR (text, "t.ini:2", "line longer than");
}

Test (conf, missing_file)
{
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_file ("/nonexistent/radixd.ini", &err);
    cr_assert_null (c);
    cr_assert (strstr (err.msg, "/nonexistent/radixd.ini: cannot open"), "%s", err.msg);
}

Test (conf, plugin_sections_use_declared_keys)
{
    cr_assert_eq (s_check ("[other.good]\ndepth = 2\nlabel = hi\n").code, RX_OK);
    EXPECT_ERR ("[other.good]\ndepth = 2\ndeepth = 3\n", "t.ini:3 [other.good]",
                "unknown key \"deepth\"", "known keys: depth, label");
    EXPECT_ERR ("[other.good]\ndepth = 9\n", "t.ini:2 [other.good]", "out of range", "1..8");
    EXPECT_ERR ("\n[other.missing]\n", "t.ini:2 [other.missing]", "no schedule policy named \"missing\"");
    /* a dotted section under a section that takes no plugins */
    EXPECT_ERR ("[main.good]\n", "t.ini:1", "unknown section [main.good]");
}

Test (conf, value_parsers)
{
    struct rx_cfg_key k = { "s", RX_CFG_SIZE, NULL, "", 0, 0, NULL };
    struct rx_cfg_value v;
    char why[128];
    cr_assert_eq (rx_cfg_value_parse (&k, "512", &v, why, sizeof why), RX_OK);
    cr_assert_eq (v.u, 512u);
    cr_assert_eq (rx_cfg_value_parse (&k, "64K", &v, why, sizeof why), RX_OK);
    cr_assert_eq (v.u, 65536u);
    cr_assert_eq (rx_cfg_value_parse (&k, "2GiB", &v, why, sizeof why), RX_OK);
    cr_assert_eq (v.u, 2ull << 30);
    cr_assert_eq (rx_cfg_value_parse (&k, "1.5G", &v, why, sizeof why), RX_OK);
    cr_assert_eq (v.u, 3ull << 29);
    cr_assert_neq (rx_cfg_value_parse (&k, "1.5Q", &v, why, sizeof why), RX_OK);
    k.type = RX_CFG_DURATION;
    cr_assert_eq (rx_cfg_value_parse (&k, "2m", &v, why, sizeof why), RX_OK);
    cr_assert_float_eq (v.f, 120.0, 1e-9);
    cr_assert_eq (rx_cfg_value_parse (&k, "1h", &v, why, sizeof why), RX_OK);
    cr_assert_float_eq (v.f, 3600.0, 1e-9);
    k.type = RX_CFG_BOOL;
    cr_assert_eq (rx_cfg_value_parse (&k, "OFF", &v, why, sizeof why), RX_OK);
    cr_assert_eq (v.i, 0);
    k.type = RX_CFG_ENUM;
    k.choices = "a|bb|c";
    cr_assert_eq (rx_cfg_value_parse (&k, "bb", &v, why, sizeof why), RX_OK);
    cr_assert_eq (v.i, 1);
    cr_assert_neq (rx_cfg_value_parse (&k, "b", &v, why, sizeof why), RX_OK);
}

Test (conf, key_table_checks)
{
    struct rx_err err = { 0 };
    cr_assert_eq (rx_cfg_keys_check (s_keys, "p.so", &err), RX_OK, "%s", err.msg);
    static const struct rx_cfg_key bad_def[] = {
        { "n", RX_CFG_INT, "lots", "", 0, 0, NULL }, { NULL, 0, NULL, NULL, 0, 0, NULL } };
    cr_assert_neq (rx_cfg_keys_check (bad_def, "p.so", &err), RX_OK);
    cr_assert (strstr (err.msg, "p.so: default \"lots\" of key \"n\""), "%s", err.msg);
    static const struct rx_cfg_key dup[] = {
        { "n", RX_CFG_INT, NULL, "", 0, 0, NULL }, { "n", RX_CFG_BOOL, NULL, "", 0, 0, NULL },
        { NULL, 0, NULL, NULL, 0, 0, NULL } };
    cr_assert_neq (rx_cfg_keys_check (dup, "p.so", &err), RX_OK);
    cr_assert (strstr (err.msg, "declared twice"), "%s", err.msg);
    static const struct rx_cfg_key badname[] = {
        { "Bad-Name", RX_CFG_INT, NULL, "", 0, 0, NULL }, { NULL, 0, NULL, NULL, 0, 0, NULL } };
    cr_assert_neq (rx_cfg_keys_check (badname, "p.so", &err), RX_OK);
    static const struct rx_cfg_key noenum[] = {
        { "e", RX_CFG_ENUM, NULL, "", 0, 0, NULL }, { NULL, 0, NULL, NULL, 0, 0, NULL } };
    cr_assert_neq (rx_cfg_keys_check (noenum, "p.so", &err), RX_OK);
}

/* The reference config documents every core key and validates as written. */
Test (conf, reference_config_is_complete)
{
    char *path = tu_path (tu_env ("RX_TOP_SRCDIR"), "conf/radixd.ini");
    struct rx_err err = { 0 };
    rx_conf_t *c = rx_conf_parse_file (path, &err);
    cr_assert_not_null (c, "%s", err.msg);
    cr_assert_eq (rx_conf_validate (c, rx_settings_schema (), NULL, NULL, &err), RX_OK, "%s", err.msg);
    rx_conf_destroy (&c);
    FILE *f = fopen (path, "r");
    cr_assert_not_null (f);
    char *text = tu_slurp_fd (fileno (f));
    fclose (f);
    for (const struct rx_conf_section *s = rx_settings_schema (); s->name; s++) {
        char hdr[80];
        snprintf (hdr, sizeof hdr, "\n[%s]\n", s->name);
        const char *at = strstr (text, hdr);
        cr_assert_not_null (at, "conf/radixd.ini lacks section [%s]", s->name);
        for (const struct rx_cfg_key *k = s->keys; k->name; k++) {
            char key[96];
            snprintf (key, sizeof key, "\n%s = ", k->name);
            char key2[96];
            snprintf (key2, sizeof key2, "\n;%s = ", k->name);
            const char *next = strstr (at + 1, "\n[");
            const char *hit = strstr (at, key);
            if (!hit || (next && hit > next)) hit = strstr (at, key2);
            cr_assert (hit && (!next || hit < next), "conf/radixd.ini [%s] does not document %s",
                       s->name, k->name);
        }
    }
    free (text);
    free (path);
}
