/* core/loader.c -- see loader.h. */
#include "config.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <radix/attn.h>
#include <radix/comm.h>
#include <radix/eplb.h>
#include <radix/kernel.h>
#include <radix/model.h>
#include <radix/moe.h>
#include <radix/policy.h>
#include <radix/route.h>

#include "host.h"
#include "loader.h"

/* radix-plugin.pc (configure.ac) and <radix/plugin.h> state the ABI once each. */
_Static_assert (RX_CONF_ABI_MAJOR == RX_ABI_MAJOR && RX_CONF_ABI_MINOR == RX_ABI_MINOR,
                "configure.ac's rx_abi_major/minor differ from RX_ABI_MAJOR/MINOR in <radix/plugin.h>");

#ifndef RX_PLUGINDIR
#  define RX_PLUGINDIR "/usr/local/lib/radix/plugins"
#endif

struct rx_plugin {
    rx_plugin_t *next;
    char *path;                           /* canonical path */
    void *handle;
    const struct rx_plugin_desc *desc;    /* inside the mapped object */
    char section[96];                     /* "<kind section>.<name>" */
    struct rx_host_binding binding;
    void *state;
    int inited;
};

struct rx_loader {
    char **dirs;
    size_t ndirs;
    rx_plugin_t *plugins;                 /* newest first */
};

/* ------------------------------------------------------------------ kinds -- */

struct kind_info {
    const char *section, *prefix, *title;
    size_t min_ops;
};

/* Kinds whose ops header has not landed yet need only the size word. */
static const struct kind_info s_kinds[RX_KIND_COUNT_] = {
    [RX_KIND_KERNELS]      = { "kernels",   "kernels", "kernel backend",
                               RX_KERNELS_OPS_SIZE_1_0 },
    [RX_KIND_ATTENTION]    = { "attention", "attn",    "attention backend",
                               RX_ATTN_OPS_SIZE_1_0 },
    [RX_KIND_LAYOUT]       = { "layout",    "layout",  "parallel layout",    sizeof (uint32_t) },
    [RX_KIND_MOE]          = { "moe",       "moe",     "MoE dispatcher",
                               RX_MOE_OPS_SIZE_1_0 },
    [RX_KIND_COMM]         = { "comm",      "comm",    "comm backend",
                               RX_COMM_OPS_SIZE_1_0 },
    [RX_KIND_EPLB]         = { "eplb",      "eplb",    "EPLB algorithm",
                               RX_EPLB_OPS_SIZE_1_0 },
    [RX_KIND_SCHED_POLICY] = { "scheduler", "sched",   "schedule policy",
                               RX_SCHED_POLICY_OPS_SIZE_1_0 },
    [RX_KIND_ROUTE_POLICY] = { "router",    "route",   "route policy",
                               RX_ROUTE_POLICY_OPS_SIZE_1_1 },
    [RX_KIND_MODEL]        = { "model",     "model",   "model architecture",
                               RX_MODEL_OPS_SIZE_1_0 },
};

static const struct kind_info *s_kind (int kind)
{
    return kind > 0 && kind < RX_KIND_COUNT_ && s_kinds[kind].section ? &s_kinds[kind] : NULL;
}

const char *rx_kind_section (int kind) { return s_kind (kind) ? s_kind (kind)->section : NULL; }
const char *rx_kind_prefix (int kind)  { return s_kind (kind) ? s_kind (kind)->prefix : NULL; }
const char *rx_kind_title (int kind)   { return s_kind (kind) ? s_kind (kind)->title : NULL; }
size_t rx_kind_min_ops_size (int kind) { return s_kind (kind) ? s_kind (kind)->min_ops : 0; }

int rx_kind_from_name (const char *name)
{
    for (int k = 1; k < RX_KIND_COUNT_; k++)
        if (s_kind (k) && (strcmp (name, s_kinds[k].section) == 0 || strcmp (name, s_kinds[k].prefix) == 0))
            return k;
    return 0;
}

/* ------------------------------------------------------------------ setup -- */

static int s_add_dir (rx_loader_t *l, const char *d, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < l->ndirs; i++)
        if (strlen (l->dirs[i]) == n && strncmp (l->dirs[i], d, n) == 0)
            return 0;
    char **nd = realloc (l->dirs, (l->ndirs + 1) * sizeof *nd);
    if (!nd) return -1;
    l->dirs = nd;
    char *s = malloc (n + 1);
    if (!s) return -1;
    memcpy (s, d, n);
    s[n] = '\0';
    l->dirs[l->ndirs++] = s;
    return 0;
}

static int s_add_path_list (rx_loader_t *l, const char *list)
{
    while (list && *list) {
        const char *colon = strchr (list, ':');
        size_t n = colon ? (size_t) (colon - list) : strlen (list);
        if (s_add_dir (l, list, n) < 0) return -1;
        list = colon ? colon + 1 : NULL;
    }
    return 0;
}

rx_loader_t *rx_loader_new (const char *conf_path, struct rx_err *err)
{
    rx_loader_t *l = calloc (1, sizeof *l);
    if (!l
        || s_add_path_list (l, conf_path) < 0
        || s_add_path_list (l, getenv ("RADIX_PLUGIN_PATH")) < 0
        || s_add_dir (l, RX_PLUGINDIR, strlen (RX_PLUGINDIR)) < 0) {
        rx_loader_destroy (&l);
        rx_err_set (err, RX_ENOMEM, "plugin loader: out of memory");
        return NULL;
    }
    return l;
}

void rx_loader_destroy (rx_loader_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_loader_t *l = *self_p;
    /* fini in reverse order of loading: the list is newest first. */
    for (rx_plugin_t *p = l->plugins; p; p = p->next)
        if (p->inited && p->desc->fini)
            p->desc->fini (p->state);
    rx_plugin_t *p = l->plugins;
    while (p) {
        rx_plugin_t *next = p->next;
        if (p->handle) dlclose (p->handle);
        free (p->path);
        free (p);
        p = next;
    }
    for (size_t i = 0; i < l->ndirs; i++)
        free (l->dirs[i]);
    free (l->dirs);
    free (l);
    *self_p = NULL;
}

size_t rx_loader_dir_count (const rx_loader_t *l) { return l->ndirs; }
const char *rx_loader_dir (const rx_loader_t *l, size_t i) { return i < l->ndirs ? l->dirs[i] : NULL; }

/* ----------------------------------------------------------------- checks -- */

#define ABI_FMT "(plugin ABI %u.%u, radixd ABI %u.%u)"
#define ABI_ARGS(d) (unsigned) (d)->abi_major, (unsigned) (d)->abi_minor, RX_ABI_MAJOR, RX_ABI_MINOR

static int s_valid_name (const char *n, int allow_dash)
{
    if (!n || !*n || strlen (n) > 48) return 0;
    for (const char *p = n; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'
              || (allow_dash && (c == '-' || c == '.' || (c >= 'A' && c <= 'Z')))))
            return 0;
    }
    return 1;
}

/* Compares two "k=v;k=v" tags: 0 if equal key by key, else a message. */
static int s_tag_diff (const char *ours, const char *theirs, char *buf, size_t len)
{
    const char *p = ours;
    while (*p) {
        const char *semi = strchr (p, ';');
        size_t n = semi ? (size_t) (semi - p) : strlen (p);
        const char *eq = memchr (p, '=', n);
        if (eq) {
            size_t kl = (size_t) (eq - p);
            const char *q = theirs;
            const char *found = NULL;
            size_t fl = 0;
            while (q && *q) {
                const char *s2 = strchr (q, ';');
                size_t m = s2 ? (size_t) (s2 - q) : strlen (q);
                if (m > kl && q[kl] == '=' && strncmp (q, p, kl) == 0) {
                    found = q + kl + 1;
                    fl = m - kl - 1;
                }
                q = s2 ? s2 + 1 : NULL;
            }
            size_t vl = n - kl - 1;
            if (!found || fl != vl || strncmp (found, eq + 1, vl) != 0) {
                snprintf (buf, len, "%.*s: radixd %.*s, plugin %.*s", (int) kl, p, (int) vl, eq + 1,
                          found ? (int) fl : 7, found ? found : "missing");
                return 1;
            }
        }
        p = semi ? semi + 1 : p + n;
    }
    return 0;
}

/* The first required member of a kind's 1.0 ops table that is NULL, or
 * NULL when all are set (the table is known to be long enough). */
#define RX_REQ(T, m) do { if (!((const T *) ops)->m) return #m "()"; } while (0)
static const char *s_missing_required (int kind, const void *ops)
{
    switch (kind) {
    case RX_KIND_SCHED_POLICY:
        RX_REQ (struct rx_sched_policy_ops, prioritize);
        break;
    case RX_KIND_ROUTE_POLICY:
        RX_REQ (struct rx_route_policy_ops, pick);
        break;
    case RX_KIND_KERNELS:
        RX_REQ (struct rx_kernels_ops, create);
        RX_REQ (struct rx_kernels_ops, destroy);
        RX_REQ (struct rx_kernels_ops, info);
        RX_REQ (struct rx_kernels_ops, alloc);
        RX_REQ (struct rx_kernels_ops, free_);
        RX_REQ (struct rx_kernels_ops, weight_load);
        RX_REQ (struct rx_kernels_ops, matmul);
        RX_REQ (struct rx_kernels_ops, attention);
        break;
    case RX_KIND_ATTENTION:
        RX_REQ (struct rx_attn_ops, create);
        RX_REQ (struct rx_attn_ops, destroy);
        RX_REQ (struct rx_attn_ops, kv_bytes_per_token);
        RX_REQ (struct rx_attn_ops, kv_alloc);
        RX_REQ (struct rx_attn_ops, forward);
        break;
    case RX_KIND_MODEL:
        RX_REQ (struct rx_model_ops, architectures);
        RX_REQ (struct rx_model_ops, create);
        RX_REQ (struct rx_model_ops, destroy);
        RX_REQ (struct rx_model_ops, info);
        RX_REQ (struct rx_model_ops, reserve);
        RX_REQ (struct rx_model_ops, forward);
        break;
    default:
        break;
    }
    return NULL;
}
#undef RX_REQ

/* Every check on a descriptor; the message names the file and the versions. */
static int s_check_desc (const char *path, const struct rx_plugin_desc *d, int expect_kind,
                         struct rx_err *err)
{
    if (d->magic != RX_PLUGIN_MAGIC)
        return rx_err_set (err, RX_EABI, "%s: not a radix plugin descriptor (magic 0x%08x, expected 0x%08x; radixd ABI %u.%u)",
                           path, d->magic, RX_PLUGIN_MAGIC, RX_ABI_MAJOR, RX_ABI_MINOR);
    if (d->abi_major != RX_ABI_MAJOR)
        /* Report the major alone: the rest of the block may not have the fields we expect. */
        return rx_err_set (err, RX_EABI, "%s: ABI major mismatch " ABI_FMT ": rebuild the plugin against radix-plugin %u.x",
                           path, ABI_ARGS (d), RX_ABI_MAJOR);
    if (d->abi_minor > RX_ABI_MINOR)
        return rx_err_set (err, RX_EABI, "%s: plugin needs a newer radixd " ABI_FMT ": upgrade radixd or build the plugin against older headers",
                           path, ABI_ARGS (d));
    if (d->struct_size < RX_PLUGIN_DESC_SIZE_1_0)
        return rx_err_set (err, RX_EABI, "%s: descriptor is %u bytes, ABI 1.0 needs at least %zu " ABI_FMT,
                           path, d->struct_size, (size_t) RX_PLUGIN_DESC_SIZE_1_0, ABI_ARGS (d));
    char diff[160];
    if (!d->build_tag)
        return rx_err_set (err, RX_EABI, "%s: descriptor has no build tag " ABI_FMT " (use RX_PLUGIN_DEFINE)",
                           path, ABI_ARGS (d));
    if (s_tag_diff (RX_BUILD_TAG, d->build_tag, diff, sizeof diff))
        return rx_err_set (err, RX_EABI, "%s: build tag mismatch: %s " ABI_FMT, path, diff, ABI_ARGS (d));
    const struct kind_info *k = s_kind ((int) d->kind);
    if (!k)
        return rx_err_set (err, RX_EABI, "%s: unknown plugin kind %u " ABI_FMT, path, d->kind, ABI_ARGS (d));
    if (expect_kind && (int) d->kind != expect_kind)
        return rx_err_set (err, RX_EABI, "%s: wrong kind: plugin is a %s (%s), expected a %s (%s) " ABI_FMT,
                           path, k->title, k->section, s_kinds[expect_kind].title,
                           s_kinds[expect_kind].section, ABI_ARGS (d));
    if (!s_valid_name (d->name, 0))
        return rx_err_set (err, RX_EABI, "%s: invalid plugin name \"%s\" (use [a-z0-9_], at most 48) " ABI_FMT,
                           path, d->name ? d->name : "(null)", ABI_ARGS (d));
    if (!d->version || !d->description)
        return rx_err_set (err, RX_EABI, "%s: descriptor lacks %s " ABI_FMT, path,
                           d->version ? "a description" : "a version", ABI_ARGS (d));
    const struct rx_ops_head *ops = d->ops;
    if (!ops)
        return rx_err_set (err, RX_EABI, "%s: descriptor has no ops table " ABI_FMT, path, ABI_ARGS (d));
    if (ops->struct_size < k->min_ops)
        return rx_err_set (err, RX_EABI, "%s: ops table too short: %u bytes, a %s needs at least %zu " ABI_FMT,
                           path, ops->struct_size, k->title, k->min_ops, ABI_ARGS (d));
    const char *missing = s_missing_required ((int) d->kind, ops);
    if (missing)
        return rx_err_set (err, RX_EABI, "%s: %s lacks the required member %s " ABI_FMT,
                           path, k->title, missing, ABI_ARGS (d));
    char owner[PATH_MAX + 8];
    snprintf (owner, sizeof owner, "%s", path);
    return rx_cfg_keys_check (d->keys, owner, err);
}

/* Who may replace a plugin: the running user and root only.  Refused: a
 * file or directory writable by others (o+w, sticky or not); one owned by
 * another user (that user could chmod it); group-writable unless the group
 * is root's or the running user's primary group (umask 002 with per-user
 * groups, the Debian default, makes build outputs g+w: harmless there).
 * path names the plugin in the message, what/obj the object checked. */
static int s_check_owner (const char *path, const char *obj, const struct stat *st, const char *what,
                          struct rx_err *err)
{
    unsigned mode = (unsigned) st->st_mode & 07777;
    char where[PATH_MAX + 8] = "";
    if (strcmp (path, obj) != 0) snprintf (where, sizeof where, "%s, ", obj);
    if (st->st_mode & S_IWOTH)
        return rx_err_set (err, RX_EINVAL, "%s: refusing a plugin %s writable by others (%smode %04o): a plugin "
                           "is code run inside the daemon (chmod o-w)", path, what, where, mode);
    if (st->st_uid != 0 && st->st_uid != geteuid ())
        return rx_err_set (err, RX_EINVAL, "%s: refusing a plugin %s owned by uid %u (%smode %04o), neither root "
                           "nor the running user (uid %u), who could replace it", path, what,
                           (unsigned) st->st_uid, where, mode, (unsigned) geteuid ());
    if ((st->st_mode & S_IWGRP) && st->st_gid != 0 && st->st_gid != getegid ())
        return rx_err_set (err, RX_EINVAL, "%s: refusing a plugin %s writable by group %u (%smode %04o), neither "
                           "root's nor the running user's group (chmod g-w)", path, what, (unsigned) st->st_gid,
                           where, mode);
    return RX_OK;
}

static int s_check_dir (const char *path, const char *dir, struct rx_err *err)
{
    struct stat dst;
    if (stat (dir, &dst) < 0)
        return rx_err_set (err, RX_EIO, "%s: cannot stat plugin directory %s: %s", path, dir, strerror (errno));
    return s_check_owner (path, dir, &dst, "in a directory", err);
}

static rx_plugin_t *s_loaded (rx_loader_t *l, const char *path)
{
    for (rx_plugin_t *p = l->plugins; p; p = p->next)
        if (strcmp (p->path, path) == 0)
            return p;
    return NULL;
}

int rx_loader_open (rx_loader_t *l, const char *path, int expect_kind,
                    rx_plugin_t **out, struct rx_err *err)
{
    char real[PATH_MAX];
    if (!realpath (path, real))
        return rx_err_set (err, RX_ENOENT, "%s: cannot open plugin: %s", path, strerror (errno));
    rx_plugin_t *have = s_loaded (l, real);
    if (have) {
        if (expect_kind && (int) have->desc->kind != expect_kind)
            return s_check_desc (real, have->desc, expect_kind, err);
        *out = have;
        return RX_OK;
    }
    struct stat st;
    if (stat (real, &st) < 0)
        return rx_err_set (err, RX_EIO, "%s: cannot stat plugin: %s", real, strerror (errno));
    if (!S_ISREG (st.st_mode))
        return rx_err_set (err, RX_EINVAL, "%s: not a regular file (radixd ABI %u.%u)", real,
                           RX_ABI_MAJOR, RX_ABI_MINOR);
    /* A plugin is code run inside the daemon: refuse what others may replace. */
    char dir[PATH_MAX];
    snprintf (dir, sizeof dir, "%s", real);
    char *slash = strrchr (dir, '/');
    if (slash && slash != dir) *slash = '\0';
    else if (slash) slash[1] = '\0';
    int prc = s_check_owner (real, real, &st, "file", err);
    if (prc == RX_OK) prc = s_check_dir (real, dir, err);
    if (prc != RX_OK) return prc;
    int fd = open (real, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rx_err_set (err, RX_EIO, "%s: cannot read plugin: %s", real, strerror (errno));
    unsigned char hdr[4] = { 0 };
    ssize_t got = read (fd, hdr, sizeof hdr);
    close (fd);
    if (got != 4 || memcmp (hdr, "\177ELF", 4) != 0)
        return rx_err_set (err, RX_EINVAL, "%s: not a shared object (no ELF header; radixd ABI %u.%u)",
                           real, RX_ABI_MAJOR, RX_ABI_MINOR);
    dlerror ();
    void *h = dlopen (real, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror ();
        return rx_err_set (err, RX_EINVAL, "%s: cannot load: %s (check its dependencies with ldd; radixd ABI %u.%u)",
                           real, e ? e : "unknown dlopen error", RX_ABI_MAJOR, RX_ABI_MINOR);
    }
    rx_plugin_entry_fn entry;
    *(void **) &entry = dlsym (h, RX_PLUGIN_ENTRY);
    if (!entry) {
        dlclose (h);
        return rx_err_set (err, RX_EABI, "%s: not a radix plugin: no '%s' symbol (define it with RX_PLUGIN_DEFINE from <radix/plugin.h>; radixd ABI %u.%u)",
                           real, RX_PLUGIN_ENTRY, RX_ABI_MAJOR, RX_ABI_MINOR);
    }
    const struct rx_plugin_desc *d = entry ();
    int rc = d ? s_check_desc (real, d, expect_kind, err)
               : rx_err_set (err, RX_EABI, "%s: %s() returned NULL (radixd ABI %u.%u)", real,
                             RX_PLUGIN_ENTRY, RX_ABI_MAJOR, RX_ABI_MINOR);
    if (rc == RX_OK)
        for (rx_plugin_t *p = l->plugins; p; p = p->next)
            if (p->desc->kind == d->kind && strcmp (p->desc->name, d->name) == 0) {
                rc = rx_err_set (err, RX_EINVAL, "%s: duplicate %s \"%s\": already loaded from %s",
                                 real, s_kinds[d->kind].title, d->name, p->path);
                break;
            }
    if (rc != RX_OK) {
        /* The message is formatted: the descriptor may now go away. */
        dlclose (h);
        return rc;
    }
    rx_plugin_t *p = calloc (1, sizeof *p);
    if (!p || !(p->path = strdup (real))) {
        free (p);
        dlclose (h);
        return rx_err_set (err, RX_ENOMEM, "%s: out of memory", real);
    }
    p->handle = h;
    p->desc = d;
    snprintf (p->section, sizeof p->section, "%s.%s", s_kinds[d->kind].section, d->name);
    char tag[64];
    snprintf (tag, sizeof tag, "%s-%s", s_kinds[d->kind].prefix, d->name);
    rx_host_bind (&p->binding, tag, p->section, NULL, d->keys);
    p->next = l->plugins;
    l->plugins = p;
    *out = p;
    return RX_OK;
}

/* Open a file found under its conventional name <prefix>-<base>.so: the
 * descriptor must agree with the name. */
static int s_open_named (rx_loader_t *l, const char *path, int kind, const char *base,
                         rx_plugin_t **out, struct rx_err *err)
{
    /* The search directory too: there the name may be a link (the build
     * tree's _plugins), which whoever can write the directory could retarget. */
    char dir[PATH_MAX];
    snprintf (dir, sizeof dir, "%s", path);
    char *slash = strrchr (dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        int crc = s_check_dir (path, dir, err);
        if (crc != RX_OK) return crc;
    }
    int rc = rx_loader_open (l, path, kind, out, err);
    if (rc == RX_OK && strcmp ((*out)->desc->name, base) != 0)
        return rx_err_set (err, RX_EABI, "%s: file name says %s \"%s\" but the plugin calls itself \"%s\"",
                           (*out)->path, s_kinds[kind].title, base, (*out)->desc->name);
    return rc;
}

int rx_loader_find (rx_loader_t *l, int kind, const char *name, rx_plugin_t **out,
                    struct rx_err *err)
{
    const struct kind_info *k = s_kind (kind);
    if (!k)
        return rx_err_set (err, RX_EINVAL, "unknown plugin kind %d", kind);
    if (!name || !*name || strstr (name, "..") || strchr (name, '/') || !s_valid_name (name, 1))
        return rx_err_set (err, RX_EINVAL,
                           "invalid %s name \"%s\": a plugin name is [A-Za-z0-9_.-] without '/' or '..'",
                           k->title, name ? name : "");
    /* Accept "cpu" or the file stem "kernels-cpu". */
    char file[128];
    size_t pl = strlen (k->prefix);
    const char *base = name;
    if (strncmp (name, k->prefix, pl) == 0 && name[pl] == '-')
        base = name + pl + 1;
    snprintf (file, sizeof file, "%s-%s.so", k->prefix, base);
    char searched[1024];
    size_t off = 0;
    searched[0] = '\0';
    for (size_t i = 0; i < l->ndirs; i++) {
        char path[PATH_MAX];
        snprintf (path, sizeof path, "%s/%s", l->dirs[i], file);
        if (access (path, F_OK) == 0)
            return s_open_named (l, path, kind, base, out, err);
        int n = snprintf (searched + off, sizeof searched - off, "%s%s", off ? ":" : "", l->dirs[i]);
        if (n > 0 && (size_t) n < sizeof searched - off) off += (size_t) n;
    }
    return rx_err_set (err, RX_ENOENT, "no %s named \"%s\" (looked for %s in %s)", k->title, base,
                       file, searched[0] ? searched : "(no plugin directories)");
}

static int s_cmp_str (const void *a, const void *b)
{
    return strcmp (*(char *const *) a, *(char *const *) b);
}

/* A file "<prefix>-<base>.so" with a known kind prefix is held to that kind
 * and name; any other *.so is opened as whatever it says it is. */
static int s_open_scanned (rx_loader_t *l, const char *path, const char *file,
                           rx_plugin_t **out, struct rx_err *err)
{
    const char *dash = strchr (file, '-');
    if (dash) {
        char prefix[32], base[64];
        snprintf (prefix, sizeof prefix, "%.*s", (int) (dash - file), file);
        snprintf (base, sizeof base, "%.*s", (int) (strlen (dash + 1) - 3), dash + 1);
        for (int k = 1; k < RX_KIND_COUNT_; k++)
            if (s_kind (k) && strcmp (s_kinds[k].prefix, prefix) == 0)
                return s_open_named (l, path, k, base, out, err);
    }
    return rx_loader_open (l, path, 0, out, err);
}

void rx_loader_scan (rx_loader_t *l, rx_loader_scan_fn fn, void *ud)
{
    char **seen = NULL;
    size_t nseen = 0;
    for (size_t i = 0; i < l->ndirs; i++) {
        DIR *d = opendir (l->dirs[i]);
        if (!d) continue;
        char **names = NULL;
        size_t n = 0;
        struct dirent *de;
        while ((de = readdir (d))) {
            size_t len = strlen (de->d_name);
            if (len < 4 || strcmp (de->d_name + len - 3, ".so") != 0) continue;
            char **nn = realloc (names, (n + 1) * sizeof *nn);
            if (!nn) break;
            names = nn;
            if (!(names[n] = strdup (de->d_name))) break;
            n++;
        }
        closedir (d);
        if (names) qsort (names, n, sizeof *names, s_cmp_str);
        for (size_t j = 0; j < n; j++) {
            char path[PATH_MAX];
            snprintf (path, sizeof path, "%s/%s", l->dirs[i], names[j]);
            int shadowed = 0;
            for (size_t s = 0; s < nseen; s++)
                if (strcmp (seen[s], names[j]) == 0) shadowed = 1;
            rx_plugin_t *p = NULL;
            struct rx_err err = { 0 };
            if (shadowed)   /* an earlier directory wins: do not even open it */
                fn (ud, path, NULL, NULL, 1);
            else if (s_open_scanned (l, path, names[j], &p, &err) == RX_OK)
                fn (ud, path, p, NULL, 0);
            else
                fn (ud, path, NULL, &err, 0);
            if (!shadowed) {
                char **ns = realloc (seen, (nseen + 1) * sizeof *ns);
                if (ns) {
                    seen = ns;
                    seen[nseen++] = names[j];
                    names[j] = NULL;
                }
            }
            free (names[j]);
        }
        free (names);
    }
    for (size_t s = 0; s < nseen; s++)
        free (seen[s]);
    free (seen);
}

/* ----------------------------------------------------------------- plugin -- */

int rx_plugin_init (rx_plugin_t *p, const rx_conf_t *conf, struct rx_err *err)
{
    if (p->inited)
        return RX_OK;
    char tag[64];
    snprintf (tag, sizeof tag, "%s-%s", s_kinds[p->desc->kind].prefix, p->desc->name);
    rx_host_bind (&p->binding, tag, p->section, conf, p->desc->keys);
    if (p->desc->init) {
        struct rx_err perr = { 0 };
        int rc = p->desc->init (&p->binding.host, &p->state, &perr);
        if (rc != RX_OK)
            return rx_err_set (err, rc, "%s: init failed: %s", p->path,
                               perr.msg[0] ? perr.msg : rx_status_name (rc));
    }
    p->inited = 1;
    return RX_OK;
}

const struct rx_plugin_desc *rx_plugin_desc (const rx_plugin_t *p) { return p->desc; }
const char *rx_plugin_path (const rx_plugin_t *p) { return p->path; }
const void *rx_plugin_ops (const rx_plugin_t *p) { return p->desc->ops; }
const struct rx_host *rx_plugin_host (rx_plugin_t *p) { return &p->binding.host; }
void *rx_plugin_state (const rx_plugin_t *p) { return p->state; }
const char *rx_plugin_section (const rx_plugin_t *p) { return p->section; }
