/* core/conf.c -- see conf.h.
 *
 * Debian's libinih is built without INI_HANDLER_LINENO and with 200-byte
 * lines, so we drive ini_parse_stream with our own line-counting reader: inih
 * calls the handler right after each line is read, so the reader's count is
 * the handler's line.  The reader also notes "[section]" lines (inih only
 * reports sections through keys) and lines too long for inih's buffer. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "conf.h"

struct entry {
    char *section;
    char *key;
    char *value;
    int   line;
};

struct section {
    char *name;
    int   line;
    const struct rx_cfg_key *keys;   /* after validation: its declared keys */
};

struct rx_conf {
    char *name;
    struct entry *e;
    size_t ne, cape;
    struct section *s;
    size_t ns, caps;
    /* parse state */
    FILE *stream;
    int   line;
    int   err_line;
    struct rx_err perr;
    int   validated;
    const struct rx_conf_section *schema;   /* set by rx_conf_validate */
};

/* ---------------------------------------------------------------- values -- */

const char *rx_cfg_type_name (int type)
{
    switch (type) {
    case RX_CFG_STRING:   return "string";
    case RX_CFG_INT:      return "integer";
    case RX_CFG_FLOAT:    return "number";
    case RX_CFG_BOOL:     return "boolean";
    case RX_CFG_SIZE:     return "size";
    case RX_CFG_DURATION: return "duration";
    case RX_CFG_ENUM:     return "choice";
    case RX_CFG_PATH:     return "path";
    default:              return "?";
    }
}

static int s_has_range (const struct rx_cfg_key *k) { return k->min < k->max; }

void rx_cfg_key_expect (const struct rx_cfg_key *k, char *buf, size_t len)
{
    switch (k->type) {
    case RX_CFG_INT:
        if (s_has_range (k))
            snprintf (buf, len, "an integer in %.0f..%.0f", k->min, k->max);
        else
            snprintf (buf, len, "an integer");
        break;
    case RX_CFG_FLOAT:
        if (s_has_range (k))
            snprintf (buf, len, "a number in %g..%g", k->min, k->max);
        else
            snprintf (buf, len, "a number");
        break;
    case RX_CFG_BOOL:
        snprintf (buf, len, "a boolean (true/false, yes/no, on/off, 1/0)");
        break;
    case RX_CFG_SIZE:
        if (s_has_range (k))
            snprintf (buf, len, "a size in bytes (e.g. 512, 64K, 16MiB, 2GiB) in %.0f..%.0f",
                      k->min, k->max);
        else
            snprintf (buf, len, "a size in bytes (e.g. 512, 64K, 16MiB, 2GiB)");
        break;
    case RX_CFG_DURATION:
        if (s_has_range (k))
            snprintf (buf, len, "a duration (e.g. 30, 30s, 250ms, 2m) of %gs..%gs", k->min, k->max);
        else
            snprintf (buf, len, "a duration (e.g. 30, 30s, 250ms, 2m)");
        break;
    case RX_CFG_ENUM:
        snprintf (buf, len, "one of %s", k->choices ? k->choices : "(none)");
        break;
    case RX_CFG_PATH:
        snprintf (buf, len, "a path");
        break;
    default:
        snprintf (buf, len, "a string");
        break;
    }
}

/* Parses a real number and an optional unit suffix. */
static int s_number_unit (const char *text, double *num, const char **unit)
{
    const char *p = text;
    while (isspace ((unsigned char) *p)) p++;
    if (!*p) return -1;
    errno = 0;
    char *end;
    double v = strtod (p, &end);
    if (end == p || errno == ERANGE || !isfinite (v)) return -1;
    while (isspace ((unsigned char) *end)) end++;
    *num = v;
    *unit = end;
    return 0;
}

static int s_range_check (const struct rx_cfg_key *k, double v)
{
    return !s_has_range (k) || (v >= k->min && v <= k->max);
}

int rx_cfg_value_parse (const struct rx_cfg_key *k, const char *text,
                        struct rx_cfg_value *out, char *why, size_t whylen)
{
    struct rx_cfg_value v = { .s = text };
    int rc = RX_OK;
    switch (k->type) {
    case RX_CFG_STRING:
    case RX_CFG_PATH:
        break;
    case RX_CFG_INT: {
        const char *p = text;
        while (isspace ((unsigned char) *p)) p++;
        errno = 0;
        char *end;
        long long n = strtoll (p, &end, 10);
        while (end && isspace ((unsigned char) *end)) end++;
        if (end == p || *end || errno == ERANGE) { rc = RX_EINVAL; break; }
        v.i = n;
        v.f = (double) n;
        if (!s_range_check (k, v.f)) rc = RX_ERANGE;
        break;
    }
    case RX_CFG_FLOAT: {
        const char *unit;
        if (s_number_unit (text, &v.f, &unit) < 0 || *unit) { rc = RX_EINVAL; break; }
        if (!s_range_check (k, v.f)) rc = RX_ERANGE;
        break;
    }
    case RX_CFG_BOOL: {
        static const char *const t[] = { "true", "yes", "on", "1" };
        static const char *const f[] = { "false", "no", "off", "0" };
        rc = RX_EINVAL;
        for (int i = 0; i < 4; i++) {
            if (strcasecmp (text, t[i]) == 0) { v.i = 1; rc = RX_OK; }
            if (strcasecmp (text, f[i]) == 0) { v.i = 0; rc = RX_OK; }
        }
        break;
    }
    case RX_CFG_SIZE: {
        const char *unit;
        double n;
        if (s_number_unit (text, &n, &unit) < 0 || n < 0) { rc = RX_EINVAL; break; }
        static const struct { const char *u; double m; } units[] = {
            { "", 1 }, { "b", 1 }, { "k", 1024.0 }, { "kb", 1024.0 }, { "kib", 1024.0 },
            { "m", 1048576.0 }, { "mb", 1048576.0 }, { "mib", 1048576.0 },
            { "g", 1073741824.0 }, { "gb", 1073741824.0 }, { "gib", 1073741824.0 },
            { "t", 1099511627776.0 }, { "tb", 1099511627776.0 }, { "tib", 1099511627776.0 },
        };
        rc = RX_EINVAL;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcasecmp (unit, units[i].u) == 0) {
                double b = n * units[i].m;
                if (b > 1.8e19) break;
                v.u = (uint64_t) b;
                v.f = (double) v.u;
                v.i = (int64_t) (v.u > INT64_MAX ? INT64_MAX : v.u);
                rc = RX_OK;
                break;
            }
        if (rc == RX_OK && !s_range_check (k, v.f)) rc = RX_ERANGE;
        break;
    }
    case RX_CFG_DURATION: {
        const char *unit;
        double n;
        if (s_number_unit (text, &n, &unit) < 0 || n < 0) { rc = RX_EINVAL; break; }
        static const struct { const char *u; double m; } units[] = {
            { "", 1 }, { "s", 1 }, { "ms", 1e-3 }, { "us", 1e-6 }, { "m", 60 }, { "min", 60 },
            { "h", 3600 },
        };
        rc = RX_EINVAL;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcasecmp (unit, units[i].u) == 0) {
                v.f = n * units[i].m;
                /* Converting a double beyond int64's range is undefined
                 * (fuzz_conf: 2.2e20 s): saturate; the range check below
                 * then refuses it when the key has a range. */
                v.i = v.f < 9.2e18 ? (int64_t) v.f : INT64_MAX;
                rc = RX_OK;
                break;
            }
        if (rc == RX_OK && !s_range_check (k, v.f)) rc = RX_ERANGE;
        break;
    }
    case RX_CFG_ENUM: {
        rc = RX_EINVAL;
        const char *c = k->choices ? k->choices : "";
        size_t tl = strlen (text);
        int idx = 0;
        while (*c) {
            const char *bar = strchr (c, '|');
            size_t cl = bar ? (size_t) (bar - c) : strlen (c);
            if (cl == tl && strncmp (c, text, cl) == 0) { v.i = idx; rc = RX_OK; break; }
            if (!bar) break;
            c = bar + 1;
            idx++;
        }
        break;
    }
    default:
        rc = RX_EINVAL;
        break;
    }
    if (rc != RX_OK) {
        if (why) rx_cfg_key_expect (k, why, whylen);
        return rc;
    }
    if (out) *out = v;
    return RX_OK;
}

static int s_valid_key_name (const char *n)
{
    if (!n || !*n) return 0;
    for (const char *p = n; *p; p++)
        if (!(islower ((unsigned char) *p) || isdigit ((unsigned char) *p) || *p == '_'))
            return 0;
    return 1;
}

const struct rx_cfg_key *rx_cfg_keys_find (const struct rx_cfg_key *keys, const char *name)
{
    for (const struct rx_cfg_key *k = keys; k && k->name; k++)
        if (strcmp (k->name, name) == 0)
            return k;
    return NULL;
}

int rx_cfg_keys_check (const struct rx_cfg_key *keys, const char *owner, struct rx_err *err)
{
    size_t n = 0;
    for (const struct rx_cfg_key *k = keys; k && k->name; k++, n++) {
        if (n > 1000)
            return rx_err_set (err, RX_EINVAL, "%s: key table has no NULL terminator", owner);
        if (!s_valid_key_name (k->name))
            return rx_err_set (err, RX_EINVAL, "%s: invalid key name \"%s\" (use [a-z0-9_])",
                               owner, k->name);
        if (k->type < RX_CFG_STRING || k->type > RX_CFG_PATH)
            return rx_err_set (err, RX_EINVAL, "%s: key \"%s\" has unknown type %d",
                               owner, k->name, k->type);
        if (k->type == RX_CFG_ENUM && (!k->choices || !*k->choices))
            return rx_err_set (err, RX_EINVAL, "%s: enum key \"%s\" has no choices", owner, k->name);
        for (const struct rx_cfg_key *j = keys; j != k; j++)
            if (strcmp (j->name, k->name) == 0)
                return rx_err_set (err, RX_EINVAL, "%s: key \"%s\" declared twice", owner, k->name);
        if (k->def) {
            char why[160];
            if (rx_cfg_value_parse (k, k->def, NULL, why, sizeof why) != RX_OK)
                return rx_err_set (err, RX_EINVAL, "%s: default \"%s\" of key \"%s\" is not %s",
                                   owner, k->def, k->name, why);
        }
    }
    return RX_OK;
}

/* ----------------------------------------------------------------- parse -- */

static char *s_strdup (const char *s)
{
    size_t n = strlen (s) + 1;
    char *d = malloc (n);
    if (d) memcpy (d, s, n);
    return d;
}

static char *s_trim (char *s)
{
    while (isspace ((unsigned char) *s)) s++;
    size_t n = strlen (s);
    while (n > 0 && isspace ((unsigned char) s[n - 1])) s[--n] = '\0';
    return s;
}

static int s_fail (rx_conf_t *c, int line, int code, const char *fmt, ...)
    __attribute__ ((format (printf, 4, 5)));

/* Records the first parse error (in file order). */
static int s_fail (rx_conf_t *c, int line, int code, const char *fmt, ...)
{
    if (c->perr.code != RX_OK && c->err_line <= line)
        return 0;
    char msg[RX_ERR_MSG_MAX];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (msg, sizeof msg, fmt, ap);
    va_end (ap);
    c->err_line = line;
    rx_err_set (&c->perr, code, "%s", msg);
    return 0;
}

static struct section *s_section_find (const rx_conf_t *c, const char *name)
{
    for (size_t i = 0; i < c->ns; i++)
        if (strcmp (c->s[i].name, name) == 0)
            return &c->s[i];
    return NULL;
}

static int s_section_add (rx_conf_t *c, const char *name, int line)
{
    struct section *old = s_section_find (c, name);
    if (old) {
        s_fail (c, line, RX_ECONFIG, "%s:%d: section [%s] appears twice (first at line %d)",
                c->name, line, name, old->line);
        return 0;
    }
    if (c->ns == c->caps) {
        size_t cap = c->caps ? c->caps * 2 : 16;
        struct section *s = realloc (c->s, cap * sizeof *s);
        if (!s) return -1;
        c->s = s;
        c->caps = cap;
    }
    char *n = s_strdup (name);
    if (!n) return -1;
    c->s[c->ns++] = (struct section) { .name = n, .line = line };
    return 0;
}

static struct entry *s_entry_find (const rx_conf_t *c, const char *section, const char *key)
{
    for (size_t i = 0; i < c->ne; i++)
        if (strcmp (c->e[i].section, section) == 0 && strcmp (c->e[i].key, key) == 0)
            return &c->e[i];
    return NULL;
}

static int s_entry_add (rx_conf_t *c, const char *section, const char *key, const char *value,
                        int line)
{
    if (c->ne == c->cape) {
        size_t cap = c->cape ? c->cape * 2 : 32;
        struct entry *e = realloc (c->e, cap * sizeof *e);
        if (!e) return -1;
        c->e = e;
        c->cape = cap;
    }
    struct entry en = { s_strdup (section), s_strdup (key), s_strdup (value), line };
    if (!en.section || !en.key || !en.value) {
        free (en.section); free (en.key); free (en.value);
        return -1;
    }
    c->e[c->ne++] = en;
    return 0;
}

/* The reader: one line per call, counted; notes sections and long lines. */
static char *s_reader (char *str, int num, void *stream)
{
    rx_conf_t *c = stream;
    if (!fgets (str, num, c->stream))
        return NULL;
    c->line++;
    size_t len = strlen (str);
    if (len > 0 && str[len - 1] != '\n' && !feof (c->stream)) {
        /* Longer than inih's buffer: swallow the rest of the line. */
        int ch;
        while ((ch = fgetc (c->stream)) != EOF && ch != '\n') {}
        s_fail (c, c->line, RX_ECONFIG, "%s:%d: line longer than %d characters",
                c->name, c->line, num - 2);
        str[0] = '\0';
        return str;
    }
    if (memchr (str, '\0', len + 1) != str + len) {
        s_fail (c, c->line, RX_ECONFIG, "%s:%d: NUL byte in line", c->name, c->line);
    }
    char buf[512];
    snprintf (buf, sizeof buf, "%s", str);
    char *t = s_trim (buf);
    if (*t == '[') {
        char *close = strchr (t, ']');
        if (close) {
            *close = '\0';
            char *name = s_trim (t + 1);
            if (!*name)
                s_fail (c, c->line, RX_ECONFIG, "%s:%d: empty section name []", c->name, c->line);
            else if (s_section_add (c, name, c->line) < 0)
                s_fail (c, c->line, RX_ENOMEM, "%s:%d: out of memory", c->name, c->line);
        }
        /* A missing ']' is inih's syntax error. */
    }
    return str;
}

static int s_handler (void *user, const char *section, const char *name, const char *value)
{
    rx_conf_t *c = user;
    int line = c->line;
    if (!section || !*section) {
        s_fail (c, line, RX_ECONFIG, "%s:%d: key \"%s\" outside any section (add a [section] line above it)",
                c->name, line, name);
        return 1;
    }
    if (!name || !*name) {
        s_fail (c, line, RX_ECONFIG, "%s:%d [%s]: empty key name", c->name, line, section);
        return 1;
    }
    struct entry *old = s_entry_find (c, section, name);
    if (old) {
        s_fail (c, line, RX_ECONFIG,
                "%s:%d [%s]: duplicate key \"%s\" (first set at line %d; note an indented line continues the previous key)",
                c->name, line, section, name, old->line);
        return 1;
    }
    if (s_entry_add (c, section, name, value ? value : "", line) < 0) {
        s_fail (c, line, RX_ENOMEM, "%s:%d: out of memory", c->name, line);
        return 0;
    }
    return 1;
}

rx_conf_t *rx_conf_new_empty (const char *name)
{
    rx_conf_t *c = calloc (1, sizeof *c);
    if (!c) return NULL;
    c->name = s_strdup (name ? name : "(config)");
    if (!c->name) { free (c); return NULL; }
    return c;
}

static rx_conf_t *s_parse_stream (FILE *f, const char *name, struct rx_err *err)
{
    rx_conf_t *c = rx_conf_new_empty (name);
    if (!c) {
        rx_err_set (err, RX_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    c->stream = f;
    int rc = ini_parse_stream (s_reader, c, s_handler, c);
    c->stream = NULL;
    if (rc > 0)
        s_fail (c, rc, RX_ECONFIG,
                "%s:%d: syntax error (expected \"[section]\" or \"key = value\")", c->name, rc);
    else if (rc < 0)
        s_fail (c, 0, RX_ENOMEM, "%s: out of memory while parsing", c->name);
    if (c->perr.code != RX_OK) {
        if (err) *err = c->perr;
        rx_conf_destroy (&c);
        return NULL;
    }
    return c;
}

rx_conf_t *rx_conf_parse_file (const char *path, struct rx_err *err)
{
    FILE *f = fopen (path, "r");
    if (!f) {
        rx_err_set (err, RX_EIO, "%s: cannot open: %s", path, strerror (errno));
        return NULL;
    }
    rx_conf_t *c = s_parse_stream (f, path, err);
    fclose (f);
    return c;
}

rx_conf_t *rx_conf_parse_string (const char *text, size_t len, const char *name,
                                 struct rx_err *err)
{
    if (!name) name = "(string)";
    /* fmemopen of a zero-length buffer fails with EINVAL on glibc. */
    static const char empty[] = "\n";
    FILE *f = len ? fmemopen ((void *) text, len, "r") : fmemopen ((void *) empty, 1, "r");
    if (!f) {
        rx_err_set (err, RX_ENOMEM, "%s: cannot open memory stream: %s", name, strerror (errno));
        return NULL;
    }
    rx_conf_t *c = s_parse_stream (f, name, err);
    fclose (f);
    return c;
}

void rx_conf_destroy (rx_conf_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_conf_t *c = *self_p;
    for (size_t i = 0; i < c->ne; i++) {
        free (c->e[i].section);
        free (c->e[i].key);
        free (c->e[i].value);
    }
    for (size_t i = 0; i < c->ns; i++)
        free (c->s[i].name);
    free (c->e);
    free (c->s);
    free (c->name);
    free (c);
    *self_p = NULL;
}

int rx_conf_set (rx_conf_t *c, const char *section, const char *key, const char *value,
                 struct rx_err *err)
{
    struct entry *e = s_entry_find (c, section, key);
    if (e) {
        char *v = s_strdup (value);
        if (!v) return rx_err_set (err, RX_ENOMEM, "out of memory");
        free (e->value);
        e->value = v;
        e->line = 0;
        return RX_OK;
    }
    if (!s_section_find (c, section) && s_section_add (c, section, 0) < 0)
        return rx_err_set (err, RX_ENOMEM, "out of memory");
    if (s_entry_add (c, section, key, value, 0) < 0)
        return rx_err_set (err, RX_ENOMEM, "out of memory");
    return RX_OK;
}

/* ------------------------------------------------------------- validate -- */

static void s_list_keys (const struct rx_cfg_key *keys, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (const struct rx_cfg_key *k = keys; k && k->name && off + 1 < len; k++) {
        int n = snprintf (buf + off, len - off, "%s%s", off ? ", " : "", k->name);
        if (n < 0) break;
        off += (size_t) n;
    }
    if (!keys || !keys->name)
        snprintf (buf, len, "none: this section takes no keys");
}

static const struct rx_conf_section *s_schema_find (const struct rx_conf_section *schema,
                                                    const char *name)
{
    for (const struct rx_conf_section *s = schema; s && s->name; s++)
        if (strcmp (s->name, name) == 0)
            return s;
    return NULL;
}

static const char *s_where (const rx_conf_t *c, int line, char *buf, size_t len)
{
    if (line > 0)
        snprintf (buf, len, "%s:%d", c->name, line);
    else
        snprintf (buf, len, "%s (command line)", c->name);
    return buf;
}

int rx_conf_validate (rx_conf_t *c, const struct rx_conf_section *schema,
                      rx_conf_plugin_keys_fn plugin_keys, void *ud, struct rx_err *err)
{
    char where[300];
    /* Sections, in file order. */
    for (size_t i = 0; i < c->ns; i++) {
        struct section *s = &c->s[i];
        s->keys = NULL;
        const struct rx_conf_section *cs = s_schema_find (schema, s->name);
        if (cs) {
            s->keys = cs->keys;
            continue;
        }
        const char *dot = strchr (s->name, '.');
        if (dot) {
            char kindsec[64];
            size_t kl = (size_t) (dot - s->name);
            snprintf (kindsec, sizeof kindsec, "%.*s", (int) (kl < 63 ? kl : 63), s->name);
            const struct rx_conf_section *ks = s_schema_find (schema, kindsec);
            if (ks && ks->plugin_kind > 0) {
                if (!plugin_keys)
                    return rx_err_set (err, RX_ECONFIG, "%s [%s]: plugin sections are not accepted here",
                                       s_where (c, s->line, where, sizeof where), s->name);
                struct rx_err perr = { 0 };
                const struct rx_cfg_key *keys = plugin_keys (ud, ks->plugin_kind, dot + 1, &perr);
                if (!keys)
                    return rx_err_set (err, RX_ECONFIG, "%s [%s]: %s",
                                       s_where (c, s->line, where, sizeof where), s->name, perr.msg);
                s->keys = keys;
                continue;
            }
        }
        char known[600];
        size_t off = 0;
        known[0] = '\0';
        for (const struct rx_conf_section *k = schema; k && k->name && off + 1 < sizeof known; k++) {
            int n = snprintf (known + off, sizeof known - off, "%s%s%s", off ? ", " : "", k->name,
                              k->plugin_kind > 0 ? " (and [" : "");
            if (n < 0) break;
            off += (size_t) n;
            if (k->plugin_kind > 0 && off + 1 < sizeof known) {
                n = snprintf (known + off, sizeof known - off, "%s.<plugin>])", k->name);
                if (n < 0) break;
                off += (size_t) n;
            }
        }
        return rx_err_set (err, RX_ECONFIG, "%s: unknown section [%s] (known sections: %s)",
                           s_where (c, s->line, where, sizeof where), s->name, known);
    }
    /* Keys, in file order. */
    for (size_t i = 0; i < c->ne; i++) {
        struct entry *e = &c->e[i];
        struct section *s = s_section_find (c, e->section);
        const struct rx_cfg_key *k = s ? rx_cfg_keys_find (s->keys, e->key) : NULL;
        if (!k) {
            char known[400];
            s_list_keys (s ? s->keys : NULL, known, sizeof known);
            return rx_err_set (err, RX_ECONFIG, "%s [%s]: unknown key \"%s\" (known keys: %s)",
                               s_where (c, e->line, where, sizeof where), e->section, e->key, known);
        }
        char why[200];
        int rc = rx_cfg_value_parse (k, e->value, NULL, why, sizeof why);
        if (rc != RX_OK)
            return rx_err_set (err, RX_ECONFIG, "%s [%s]: %s = \"%s\": %s; expected %s",
                               s_where (c, e->line, where, sizeof where), e->section, e->key,
                               e->value, rc == RX_ERANGE ? "out of range" : "wrong type", why);
    }
    c->validated = 1;
    c->schema = schema;
    return RX_OK;
}

/* --------------------------------------------------------------- lookup -- */

const char *rx_conf_name (const rx_conf_t *c) { return c->name; }

const char *rx_conf_raw (const rx_conf_t *c, const char *section, const char *key, int *line)
{
    struct entry *e = s_entry_find (c, section, key);
    if (line) *line = e ? e->line : 0;
    return e ? e->value : NULL;
}

int rx_conf_has_section (const rx_conf_t *c, const char *section)
{
    return s_section_find (c, section) != NULL;
}

const char *rx_conf_section_at (const rx_conf_t *c, size_t i, int *line)
{
    if (i >= c->ns) return NULL;
    if (line) *line = c->s[i].line;
    return c->s[i].name;
}

int rx_conf_value_in (const rx_conf_t *c, const char *section, const struct rx_cfg_key *keys,
                      const char *key, struct rx_cfg_value *out, struct rx_err *err)
{
    const struct rx_cfg_key *k = rx_cfg_keys_find (keys, key);
    struct entry *e = s_entry_find (c, section, key);
    if (!k)
        return rx_err_set (err, RX_ENOENT, "%s: [%s] %s is not a declared key", c->name, section, key);
    const char *text = e ? e->value : k->def;
    if (!text)
        return rx_err_set (err, RX_ENOENT, "%s: [%s] %s is not set and has no default",
                           c->name, section, key);
    char why[200];
    if (rx_cfg_value_parse (k, text, out, why, sizeof why) != RX_OK)
        return rx_err_set (err, RX_ECONFIG, "%s: [%s] %s = \"%s\": expected %s",
                           c->name, section, key, text, why);
    return RX_OK;
}

int rx_conf_value (const rx_conf_t *c, const char *section, const char *key,
                   struct rx_cfg_value *out, struct rx_err *err)
{
    struct section *s = s_section_find (c, section);
    const struct rx_cfg_key *keys = s ? s->keys : NULL;
    if (!keys) {
        const struct rx_conf_section *cs = s_schema_find (c->schema, section);
        keys = cs ? cs->keys : NULL;
    }
    return rx_conf_value_in (c, section, keys, key, out, err);
}

/* Typed shorthands.  A section that is absent from the file has no keys
 * table of its own; the caller passes the schema default then. */
static int s_lookup (const rx_conf_t *c, const char *section, const char *key,
                     struct rx_cfg_value *v)
{
    return rx_conf_value (c, section, key, v, NULL);
}

const char *rx_conf_str (const rx_conf_t *c, const char *section, const char *key, const char *dflt)
{
    struct rx_cfg_value v;
    return s_lookup (c, section, key, &v) == RX_OK ? v.s : dflt;
}

int64_t rx_conf_int (const rx_conf_t *c, const char *section, const char *key, int64_t dflt)
{
    struct rx_cfg_value v;
    return s_lookup (c, section, key, &v) == RX_OK ? v.i : dflt;
}

double rx_conf_float (const rx_conf_t *c, const char *section, const char *key, double dflt)
{
    struct rx_cfg_value v;
    return s_lookup (c, section, key, &v) == RX_OK ? v.f : dflt;
}

int rx_conf_bool (const rx_conf_t *c, const char *section, const char *key, int dflt)
{
    struct rx_cfg_value v;
    return s_lookup (c, section, key, &v) == RX_OK ? (int) v.i : dflt;
}

uint64_t rx_conf_size (const rx_conf_t *c, const char *section, const char *key, uint64_t dflt)
{
    struct rx_cfg_value v;
    return s_lookup (c, section, key, &v) == RX_OK ? v.u : dflt;
}
