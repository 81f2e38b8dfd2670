/* tests/unit/test_plugin_perms.c -- core/loader.c refuses plugins others
 * could replace: a file or directory writable by others, owned by another
 * user, or writable by a foreign group; the search directory of a name
 * (where a link may live) is held to the same rules.  Real temp dirs and
 * files; the owner/group cases need root (CI runs as root) and are skipped
 * otherwise. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <radix/plugin.h>

#include "loader.h"
#include "../testutil.h"

/* A temp dir holding a copy of the sched-good fixture; returns the dir. */
static char *s_setup (char **so)
{
    char *dir = tu_tmpdir ();
    char *src = tu_path (tu_env ("RX_FIXTURE_DIR"), "sched-good.so");
    *so = tu_path (dir, "sched-good.so");
    char cmd[4096];
    snprintf (cmd, sizeof cmd, "cp '%s' '%s' && chmod 0644 '%s'", src, *so, *so);
    cr_assert_eq (system (cmd), 0);
    free (src);
    return dir;
}

static void s_cleanup (char *dir, char *so)
{
    chmod (dir, 0755);
    unlink (so);
    rmdir (dir);
    free (so);
    free (dir);
}

/* Open path; returns the error (code RX_OK on success). */
static struct rx_err s_open (const char *path)
{
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (NULL, &err);
    cr_assert_not_null (l);
    rx_plugin_t *p = NULL;
    err.code = rx_loader_open (l, path, 0, &p, &err);
    rx_loader_destroy (&l);
    return err;
}

Test (plugin_perms, other_writable_file_names_file_and_mode)
{
    char *so, *dir = s_setup (&so);
    chmod (so, 0646);
    struct rx_err e = s_open (so);
    cr_assert_eq (e.code, RX_EINVAL);
    cr_assert (strstr (e.msg, so) && strstr (e.msg, "file writable by others") && strstr (e.msg, "mode 0646"),
               "%s", e.msg);
    chmod (so, 0644);
    e = s_open (so);
    cr_assert_eq (e.code, RX_OK, "%s", e.msg);
    s_cleanup (dir, so);
}

Test (plugin_perms, other_writable_dir_even_sticky)
{
    char *so, *dir = s_setup (&so);
    chmod (dir, 01777);   /* like /tmp: sticky does not stop new files under other names */
    struct rx_err e = s_open (so);
    cr_assert_eq (e.code, RX_EINVAL);
    cr_assert (strstr (e.msg, "directory writable by others") && strstr (e.msg, "mode 1777")
               && strstr (e.msg, dir), "%s", e.msg);
    chmod (dir, 0757);
    e = s_open (so);
    cr_assert (strstr (e.msg, "mode 0757"), "%s", e.msg);
    s_cleanup (dir, so);
}

Test (plugin_perms, group_writable_own_group_is_fine)
{
    /* umask 002 with per-user groups: build outputs are g+w, group = ours */
    char *so, *dir = s_setup (&so);
    cr_assert_eq (chown (so, (uid_t) -1, getegid ()), 0);
    chmod (so, 0664);
    chmod (dir, 0775);
    struct rx_err e = s_open (so);
    cr_assert_eq (e.code, RX_OK, "%s", e.msg);
    s_cleanup (dir, so);
}

Test (plugin_perms, foreign_owner_or_group_refused)
{
    if (geteuid () != 0) cr_skip_test ("needs root to chown (CI runs as root)");
    char *so, *dir = s_setup (&so);
    cr_assert_eq (chown (so, 12345, (gid_t) -1), 0);
    struct rx_err e = s_open (so);
    cr_assert_eq (e.code, RX_EINVAL);
    cr_assert (strstr (e.msg, "owned by uid 12345") && strstr (e.msg, "neither root nor the running user"),
               "%s", e.msg);
    cr_assert_eq (chown (so, 0, 12345), 0);
    chmod (so, 0664);
    e = s_open (so);
    cr_assert (strstr (e.msg, "file writable by group 12345") && strstr (e.msg, "mode 0664"), "%s", e.msg);
    chmod (so, 0644);      /* readable by the group only: fine */
    e = s_open (so);
    cr_assert_eq (e.code, RX_OK, "%s", e.msg);
    cr_assert_eq (chown (dir, 12345, 0), 0);
    e = s_open (so);
    cr_assert (strstr (e.msg, "in a directory owned by uid 12345") && strstr (e.msg, dir), "%s", e.msg);
    cr_assert_eq (chown (dir, 0, 0), 0);
    s_cleanup (dir, so);
}

Test (plugin_perms, search_dir_of_a_link_is_checked)
{
    /* the real file is safe; the link to it sits in an other-writable
     * search directory, where anyone could point it elsewhere */
    char *so, *dir = s_setup (&so);
    char *links = tu_tmpdir ();
    char *ln = tu_path (links, "sched-good.so");
    cr_assert_eq (symlink (so, ln), 0);
    struct rx_err err = { 0 };
    rx_loader_t *l = rx_loader_new (links, &err);
    cr_assert_not_null (l, "%s", err.msg);
    rx_plugin_t *p = NULL;
    cr_assert_eq (rx_loader_find (l, RX_KIND_SCHED_POLICY, "good", &p, &err), RX_OK, "%s", err.msg);
    rx_loader_destroy (&l);
    chmod (links, 0777);
    l = rx_loader_new (links, &err);
    int rc = rx_loader_find (l, RX_KIND_SCHED_POLICY, "good", &p, &err);
    cr_assert_eq (rc, RX_EINVAL);
    cr_assert (strstr (err.msg, "directory writable by others") && strstr (err.msg, links), "%s", err.msg);
    rx_loader_destroy (&l);
    chmod (links, 0755);
    unlink (ln);
    rmdir (links);
    free (ln);
    free (links);
    s_cleanup (dir, so);
}
