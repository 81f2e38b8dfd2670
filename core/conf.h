/* core/conf.h -- INI configuration: parse with inih, validate against declared keys.
 *
 * The core parses the whole file once, copying every string into its own
 * table; plugins never see inih (its compile options cannot leak into the
 * ABI).  Validation knows the core's sections (settings.c) and, for a section
 * named [<kind>.<plugin>], the keys the plugin declares in its descriptor.
 * Every error is one line naming file:line, the section and key, and what was
 * expected.  Not thread-safe while parsing; read-only afterwards. */
#ifndef RX_CONF_H
#define RX_CONF_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/plugin.h>

typedef struct rx_conf rx_conf_t;

/* A section the core knows.  plugin_kind > 0 means sections named
 * [<name>.<plugin>] configure a plugin of that kind and are checked
 * against the keys it declares. */
struct rx_conf_section {
    const char *name;
    const char *help;
    const struct rx_cfg_key *keys;
    int plugin_kind;
};

/* A parsed value of one declared key. */
struct rx_cfg_value {
    const char *s;    /* the text (always set) */
    int64_t     i;    /* INT, BOOL (0/1) */
    double      f;    /* FLOAT, DURATION (seconds), SIZE (bytes, also in u) */
    uint64_t    u;    /* SIZE in bytes */
};

/* Parse TEXT as a value of key K.  On failure writes "expected ..." into
 * why and returns RX_EINVAL or RX_ERANGE. */
int rx_cfg_value_parse (const struct rx_cfg_key *k, const char *text,
                        struct rx_cfg_value *out, char *why, size_t whylen);
/* Human-readable expected type and range of K, e.g. "an integer in 1..1024". */
void rx_cfg_key_expect (const struct rx_cfg_key *k, char *buf, size_t len);
const char *rx_cfg_type_name (int type);
/* Checks a key table a plugin declares (names, types, defaults parse).
 * owner names the plugin in the message. */
int rx_cfg_keys_check (const struct rx_cfg_key *keys, const char *owner, struct rx_err *err);
const struct rx_cfg_key *rx_cfg_keys_find (const struct rx_cfg_key *keys, const char *name);

/* Parse a file.  Caller owns the result; release with rx_conf_destroy.
 * Syntax errors (not "key = value", over-long line, key outside a section,
 * duplicate key) are reported here. */
rx_conf_t *rx_conf_parse_file (const char *path, struct rx_err *err);
/* Parse text held in memory; name is used in messages in place of a file. */
rx_conf_t *rx_conf_parse_string (const char *text, size_t len, const char *name,
                                 struct rx_err *err);
/* An empty configuration (every value at its default). */
rx_conf_t *rx_conf_new_empty (const char *name);
void rx_conf_destroy (rx_conf_t **self_p);

/* Looks up the keys of plugin `name` of `kind` for validation.  Returns the
 * key table (may be an empty table) or NULL with err set (plugin missing or
 * refused).  The table must stay valid while the conf is used. */
typedef const struct rx_cfg_key *(*rx_conf_plugin_keys_fn) (void *ud, int kind,
                                                            const char *name,
                                                            struct rx_err *err);

/* Validate every section and key; the first problem (in file order) is
 * reported.  plugin_keys may be NULL: then plugin sections are an error.
 * Also remembers the schema so typed getters can apply defaults. */
int rx_conf_validate (rx_conf_t *c, const struct rx_conf_section *schema,
                      rx_conf_plugin_keys_fn plugin_keys, void *ud, struct rx_err *err);

/* Override or add a value as if written in the file at line 0 (the CLI). */
int rx_conf_set (rx_conf_t *c, const char *section, const char *key, const char *value,
                 struct rx_err *err);

const char *rx_conf_name (const rx_conf_t *c);
/* The raw text of section.key as written, or NULL; *line gets its line. */
const char *rx_conf_raw (const rx_conf_t *c, const char *section, const char *key, int *line);
/* 1 if the section appears in the file. */
int rx_conf_has_section (const rx_conf_t *c, const char *section);
/* Iterate sections in file order: returns the name of the i-th or NULL. */
const char *rx_conf_section_at (const rx_conf_t *c, size_t i, int *line);

/* Typed lookup after rx_conf_validate: the written value, else the declared
 * default.  RX_ENOENT when the key is undeclared or has neither. */
int rx_conf_value (const rx_conf_t *c, const char *section, const char *key,
                   struct rx_cfg_value *out, struct rx_err *err);
/* As rx_conf_value with an explicit key table (a plugin's declared keys). */
int rx_conf_value_in (const rx_conf_t *c, const char *section, const struct rx_cfg_key *keys,
                      const char *key, struct rx_cfg_value *out, struct rx_err *err);
/* Shorthands that return the default given here if unset and undeclared-default. */
const char *rx_conf_str (const rx_conf_t *c, const char *section, const char *key, const char *dflt);
int64_t     rx_conf_int (const rx_conf_t *c, const char *section, const char *key, int64_t dflt);
double      rx_conf_float (const rx_conf_t *c, const char *section, const char *key, double dflt);
int         rx_conf_bool (const rx_conf_t *c, const char *section, const char *key, int dflt);
uint64_t    rx_conf_size (const rx_conf_t *c, const char *section, const char *key, uint64_t dflt);

#endif
