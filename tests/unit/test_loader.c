/* tests/unit/test_loader.c -- the plugin loader against real shared objects,
 * each wrong in one way (tests/fixtures).  Every refusal is one line naming
 * the file, the reason and both ABI versions. */
#include <criterion/criterion.h>
#include <string.h>

#include <radix/policy.h>

#include "conf.h"
#include "loader.h"
#include "../testutil.h"

static char *s_fixture (const char *name)
{
    return tu_path (tu_env ("RX_FIXTURE_DIR"), name);
}

/* Open fixture NAME expecting kind; returns the error (code 0 on success). */
static struct rx_err s_open (const char *name, int kind, rx_plugin_t **out)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    cr_assert_not_null (l);
    char *path = s_fixture (name);
    rx_plugin_t *p = NULL;
    rx_loader_open (l, path, kind, &p, &err);
    if (out) *out = p;   /* only valid while l lives: callers pass NULL */
    free (path);
    rx_loader_destroy (&l);
    cr_assert_null (l);
    return err;
}

#define EXPECT_REFUSED(name, kind, ...)                                          \
    do {                                                                         \
        struct rx_err e_ = s_open (name, kind, NULL);                            \
        cr_assert_neq (e_.code, RX_OK, "%s should be refused", name);            \
        const char *want_[] = { name, __VA_ARGS__ };                             \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)           \
            cr_assert (strstr (e_.msg, want_[i_]), "message \"%s\" lacks \"%s\"", \
                       e_.msg, want_[i_]);                                       \
        cr_assert_null (strchr (e_.msg, '\n'), "one line: %s", e_.msg);          \
    } while (0)

Test (loader, good_plugin_loads_and_runs)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    char *path = s_fixture ("sched-good.so");
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_open (l, path, RX_KIND_SCHED_POLICY, &p, &err), RX_OK, "%s", err.msg);
    const struct rx_plugin_desc *d = rx_plugin_desc (p);
    cr_assert_str_eq (d->name, "good");
    cr_assert_str_eq (d->version, "1.2.3");
    cr_assert_eq (d->kind, RX_KIND_SCHED_POLICY);
    cr_assert_str_eq (rx_plugin_section (p), "scheduler.good");
    /* Opening the same file again yields the same plugin. */
    rx_plugin_t *again = NULL;
    cr_assert_eq (rx_loader_open (l, path, 0, &again, &err), RX_OK);
    cr_assert_eq (again, p);
    /* Its vtable works. */
    const struct rx_sched_policy_ops *ops = rx_plugin_ops (p);
    struct rx_sched_item items[2] = { { .rid = 1, .prompt_tokens = 5 }, { .rid = 2, .prompt_tokens = 9 } };
    cr_assert_eq (ops->prioritize (NULL, items, 2, NULL, 0, &err), RX_OK);
    cr_assert_float_eq (items[0].priority, -5.0, 1e-12);
    cr_assert_float_eq (items[1].priority, -9.0, 1e-12);
    /* init without config sees the declared defaults through the host table. */
    cr_assert_eq (rx_plugin_init (p, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq ((const char *) rx_plugin_state (p),
                      "depth=4 ratio=0.5 enabled=1 buffer=1048576 mode=fast label=(unset) set=0");
    free (path);
    rx_loader_destroy (&l);
}

Test (loader, plugin_section_reaches_init)
{
    char *dir = tu_env ("RX_FIXTURE_DIR") ? strdup (tu_env ("RX_FIXTURE_DIR")) : NULL;
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (dir, &err);
    const char *text = "[scheduler.good]\ndepth = 7\nmode = safe\nlabel = hello\nbuffer = 2K\n";
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "p.ini", &err);
    cr_assert_not_null (c);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "good", &p, &err), RX_OK, "%s", err.msg);
    static const struct rx_conf_section schema[] = {
        { "scheduler", "", NULL, RX_KIND_SCHED_POLICY }, { NULL, NULL, NULL, 0 } };
    /* without a plugin-key lookup, plugin sections are refused */
    cr_assert_eq (rx_conf_validate (c, schema, NULL, NULL, &err), RX_ECONFIG);
    cr_assert (strstr (err.msg, "plugin sections are not accepted"), "%s", err.msg);
    cr_assert_eq (rx_plugin_init (p, c, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq ((const char *) rx_plugin_state (p),
                      "depth=7 ratio=0.5 enabled=1 buffer=2048 mode=safe label=hello set=1");
    rx_conf_destroy (&c);
    rx_loader_destroy (&l);
    free (dir);
}

Test (loader, init_failure_is_reported)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (tu_env ("RX_FIXTURE_DIR"), &err);
    const char *text = "[scheduler.good]\ndepth = 13\n";
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "p.ini", &err);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "good", &p, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (p, c, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "sched-good.so: init failed: depth 13 is unlucky"), "%s", err.msg);
    rx_conf_destroy (&c);
    rx_loader_destroy (&l);
}

Test (loader, wrong_major_refused)
{
    EXPECT_REFUSED ("sched-badmajor.so", 0, "ABI major mismatch", "plugin ABI 2.0", "radixd ABI 1.4");
}

Test (loader, newer_minor_refused)
{
    EXPECT_REFUSED ("sched-newerminor.so", 0, "needs a newer radixd", "plugin ABI 1.5",
                    "radixd ABI 1.4");
}

Test (loader, wrong_kind_refused)
{
    EXPECT_REFUSED ("sched-wrongkind.so", RX_KIND_SCHED_POLICY, "wrong kind",
                    "plugin is a model architecture (model)", "expected a schedule policy (scheduler)",
                    "plugin ABI 1.4, radixd ABI 1.4");
}

Test (loader, short_vtable_refused)
{
    EXPECT_REFUSED ("sched-shortvtable.so", 0, "ops table too short: 4 bytes",
                    "a schedule policy needs at least", "plugin ABI 1.4, radixd ABI 1.4");
}

Test (loader, null_required_member_refused)
{
    EXPECT_REFUSED ("sched-nullmember.so", 0, "schedule policy lacks the required member prioritize()",
                    "plugin ABI 1.4, radixd ABI 1.4");
}

Test (loader, missing_symbol_refused)
{
    EXPECT_REFUSED ("sched-noentry.so", 0, "not a radix plugin: no 'rx_plugin_entry' symbol",
                    "RX_PLUGIN_DEFINE", "radixd ABI 1.4");
}

Test (loader, build_tag_mismatch_refused)
{
    EXPECT_REFUSED ("sched-badtag.so", 0, "build tag mismatch: tokid: radixd int32, plugin int64");
}

Test (loader, bad_key_table_refused)
{
    EXPECT_REFUSED ("sched-badkeys.so", 0, "default \"deep\" of key \"depth\" is not an integer");
}

Test (loader, non_elf_refused)
{
    char *dir = tu_tmpdir ();
    char *path = tu_path (dir, "sched-text.so");
    tu_write (path, "this is not a shared object\n");
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    rx_plugin_t *p = NULL;
    cr_assert_neq (rx_loader_open (l, path, 0, &p, &err), RX_OK);
    cr_assert (strstr (err.msg, "sched-text.so: not a shared object (no ELF header"), "%s", err.msg);
    /* An ELF header alone is not enough either: dlopen's reason is passed on. */
    tu_write (path, "\177ELF garbage that is not really an object");
    cr_assert_neq (rx_loader_open (l, path, 0, &p, &err), RX_OK);
    cr_assert (strstr (err.msg, "sched-text.so: cannot load:"), "%s", err.msg);
    cr_assert (strstr (err.msg, "ldd"), "%s", err.msg);
    unlink (path);
    rmdir (dir);
    rx_loader_destroy (&l);
    free (path);
    free (dir);
}

Test (loader, world_writable_refused)
{
    char *dir = tu_tmpdir ();
    char *src = s_fixture ("sched-good.so");
    char *dst = tu_path (dir, "sched-good.so");
    char cmd[4096];
    snprintf (cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    cr_assert_eq (system (cmd), 0);
    chmod (dst, 0666);
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    rx_plugin_t *p = NULL;
    cr_assert_neq (rx_loader_open (l, dst, 0, &p, &err), RX_OK);
    cr_assert (strstr (err.msg, "writable by others"), "%s", err.msg);
    chmod (dst, 0644);
    chmod (dir, 0777);
    cr_assert_neq (rx_loader_open (l, dst, 0, &p, &err), RX_OK);
    cr_assert (strstr (err.msg, "directory writable by others"), "%s", err.msg);
    chmod (dir, 0755);
    cr_assert_eq (rx_loader_open (l, dst, 0, &p, &err), RX_OK, "%s", err.msg);
    rx_loader_destroy (&l);
    unlink (dst);
    rmdir (dir);
    free (src); free (dst); free (dir);
}

Test (loader, find_by_name_and_path_order)
{
    struct rx_err err = { 0 };
    char *dir = tu_tmpdir ();
    char *list = malloc (strlen (dir) + strlen (tu_env ("RX_FIXTURE_DIR")) + 2);
    sprintf (list, "%s:%s", dir, tu_env ("RX_FIXTURE_DIR"));
    rx_loader_t *l = rx_loader_new (list, &err);
    cr_assert_eq (rx_loader_dir_count (l) >= 3, 1);   /* + the install dir */
    cr_assert_str_eq (rx_loader_dir (l, 0), dir);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "good", &p, &err), RX_OK, "%s", err.msg);
    cr_assert_str_eq (rx_plugin_desc (p)->name, "good");
    /* the file stem is accepted too */
    rx_plugin_t *q = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "sched-good", &q, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (p, q);
    /* missing: the message names the file looked for and the dirs */
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "nope", &p, &err), RX_ENOENT);
    cr_assert (strstr (err.msg, "no schedule policy named \"nope\" (looked for sched-nope.so in"),
               "%s", err.msg);
    cr_assert (strstr (err.msg, dir), "%s", err.msg);
    /* the wrong kind under a sched- name is refused by kind */
    cr_assert_neq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "wrongkind", &p, &err), RX_OK);
    cr_assert (strstr (err.msg, "wrong kind"), "%s", err.msg);
    rx_loader_destroy (&l);
    rmdir (dir);
    free (dir);
    free (list);
}

Test (loader, path_traversal_refused)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (tu_env ("RX_FIXTURE_DIR"), &err);
    rx_plugin_t *p = NULL;
    const char *bad[] = { "../fixtures/.libs/sched-good", "..", "a/b", "/etc/passwd",
                          "good/../good", "", "sp ace", "x\ny" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, bad[i], &p, &err), RX_EINVAL,
                      "name \"%s\" accepted", bad[i]);
        cr_assert (strstr (err.msg, "invalid schedule policy name"), "%s", err.msg);
    }
    rx_loader_destroy (&l);
}

Test (loader, env_path_is_searched_after_config)
{
    struct rx_err err = { 0 };
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_FIXTURE_DIR"), 1);
    rx_loader_t *l = rx_loader_new ("/nonexistent-first", &err);
    cr_assert_str_eq (rx_loader_dir (l, 0), "/nonexistent-first");
    cr_assert_str_eq (rx_loader_dir (l, 1), tu_env ("RX_FIXTURE_DIR"));
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "good", &p, &err), RX_OK, "%s", err.msg);
    rx_loader_destroy (&l);
    unsetenv ("RADIX_PLUGIN_PATH");
}

struct scan_result { int ok, refused, shadowed; char names[1024]; };
static void s_scan_cb (void *ud, const char *path, rx_plugin_t *p, const struct rx_err *err, int shadowed)
{
    struct scan_result *r = ud;
    /* Only the fixture folder: the install dir may hold real plugins too. */
    if (strncmp (path, tu_env ("RX_FIXTURE_DIR"), strlen (tu_env ("RX_FIXTURE_DIR"))) != 0)
        return;
    if (shadowed) r->shadowed++;
    else if (p) {
        r->ok++;
        strncat (r->names, rx_plugin_desc (p)->name, sizeof r->names - strlen (r->names) - 2);
        strcat (r->names, " ");
    } else {
        cr_assert_not_null (err);
        r->refused++;
    }
}

Test (loader, scan_reports_good_and_refused)
{
    struct rx_err err = { 0 };
    char *list = malloc (2 * strlen (tu_env ("RX_FIXTURE_DIR")) + 2);
    sprintf (list, "%s", tu_env ("RX_FIXTURE_DIR"));
    rx_loader_t *l = rx_loader_new (list, &err);
    struct scan_result r = { 0 };
    rx_loader_scan (l, s_scan_cb, &r);
    cr_assert (strstr (r.names, "good "), "%s", r.names);
    cr_assert_eq (r.ok, 1, "only the good fixture loads, got %d: %s", r.ok, r.names);
    cr_assert_eq (r.refused, 8);
    rx_loader_destroy (&l);
    free (list);
}

Test (loader, kinds_table)
{
    cr_assert_str_eq (rx_kind_prefix (RX_KIND_KERNELS), "kernels");
    cr_assert_str_eq (rx_kind_section (RX_KIND_SCHED_POLICY), "scheduler");
    cr_assert_eq (rx_kind_from_name ("sched"), RX_KIND_SCHED_POLICY);
    cr_assert_eq (rx_kind_from_name ("scheduler"), RX_KIND_SCHED_POLICY);
    cr_assert_eq (rx_kind_from_name ("attn"), RX_KIND_ATTENTION);
    cr_assert_eq (rx_kind_from_name ("nonsense"), 0);
    cr_assert_null (rx_kind_section (0));
    cr_assert_null (rx_kind_section (RX_KIND_COUNT_));
    cr_assert_eq (rx_kind_min_ops_size (RX_KIND_SCHED_POLICY), RX_SCHED_POLICY_OPS_SIZE_1_0);
}
