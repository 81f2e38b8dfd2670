/* tests/cli/test_radixd.c -- radixd as a user runs it: a real process,
 * its exit status and what it prints.  A bad INI and an incompatible plugin
 * each give exactly one line on stderr and a non-zero exit. */
#include <criterion/criterion.h>
#include <string.h>

#include "../testutil.h"

static char *s_dir;

static void s_setup (void) { s_dir = tu_tmpdir (); }
static void s_teardown (void)
{
    char cmd[512];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system (cmd) != 0) {}
    free (s_dir);
}

/* Write an INI into the temp dir whose [plugins] path has the build's
 * plugins and the fixtures, then run radixd with the given flags. */
static struct tu_run s_radixd (const char *ini_body, const char *a1, const char *a2)
{
    char *ini = tu_path (s_dir, "t.ini");
    char text[4096];
    snprintf (text, sizeof text, "[plugins]\npath = %s:%s\n%s", tu_env ("RX_PLUGIN_BUILD_DIR"),
              tu_env ("RX_FIXTURE_DIR"), ini_body);
    tu_write (ini, text);
    char *argv[] = { (char *) tu_env ("RADIXD"), "-c", ini, (char *) a1, (char *) a2, NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    free (ini);
    return r;
}

#define EXPECT_ONE_LINE_FAILURE(r, ...)                                             \
    do {                                                                            \
        cr_assert_eq ((r).status, 1, "exit %d, stderr: %s", (r).status, (r).err);  \
        cr_assert_eq (tu_lines ((r).err), 1, "want one line, got:\n%s", (r).err);  \
        const char *want_[] = { __VA_ARGS__ };                                      \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)              \
            cr_assert (strstr ((r).err, want_[i_]), "stderr \"%s\" lacks \"%s\"", (r).err, want_[i_]); \
    } while (0)

TestSuite (radixd, .init = s_setup, .fini = s_teardown);

Test (radixd, version)
{
    char *argv[] = { (char *) tu_env ("RADIXD"), "--version", NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    cr_assert_eq (r.status, 0);
    cr_assert (strstr (r.out, "plugin ABI 1.4"), "%s", r.out);
    tu_run_free (&r);
}

Test (radixd, usage_errors_exit_2)
{
    char *argv[] = { (char *) tu_env ("RADIXD"), "--no-such-flag", NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    cr_assert_eq (r.status, 2);
    tu_run_free (&r);
    char *argv2[] = { (char *) tu_env ("RADIXD"), "--check-config", NULL };
    r = tu_run_env (argv2, NULL);
    cr_assert_eq (r.status, 2);
    cr_assert (strstr (r.err, "needs -c FILE"), "%s", r.err);
    tu_run_free (&r);
}

Test (radixd, check_config_ok)
{
    struct tu_run r = s_radixd ("[scheduler]\npolicy = lpm\n[log]\nlevel = debug\n", "--check-config", NULL);
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert (strstr (r.out, "configuration OK"), "%s", r.out);
    tu_run_free (&r);
}

Test (radixd, bad_ini_unknown_key)
{
    struct tu_run r = s_radixd ("[scheduler]\npolicy = fcfs\npolcy = lpm\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:5 [scheduler]", "unknown key \"polcy\"", "known keys: policy");
    tu_run_free (&r);
}

Test (radixd, bad_ini_unknown_section)
{
    struct tu_run r = s_radixd ("[schedular]\npolicy = fcfs\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:3", "unknown section [schedular]", "known sections:");
    tu_run_free (&r);
}

Test (radixd, bad_ini_wrong_type_and_range)
{
    struct tu_run r = s_radixd ("[kernels]\nthreads = two\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [kernels]", "threads = \"two\"", "an integer in 0..4096");
    tu_run_free (&r);
    r = s_radixd ("[kernels]\nthreads = -1\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [kernels]", "out of range");
    tu_run_free (&r);
    r = s_radixd ("[log]\nlevel = loud\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [log]", "one of error|warn|info|debug|trace");
    tu_run_free (&r);
}

Test (radixd, bad_ini_syntax)
{
    struct tu_run r = s_radixd ("[scheduler]\npolicy fcfs\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4", "syntax error");
    tu_run_free (&r);
}

Test (radixd, missing_config_file)
{
    char *argv[] = { (char *) tu_env ("RADIXD"), "-c", "/nonexistent/radixd.ini", "--check-config", NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    EXPECT_ONE_LINE_FAILURE (r, "/nonexistent/radixd.ini: cannot open");
    tu_run_free (&r);
}

Test (radixd, plugin_section_keys_validated)
{
    struct tu_run r = s_radixd ("[scheduler.good]\ndepth = 100\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [scheduler.good]", "depth = \"100\"", "an integer in 1..64");
    tu_run_free (&r);
    r = s_radixd ("[scheduler.good]\ndepht = 1\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [scheduler.good]", "unknown key \"depht\"",
                             "known keys: depth, ratio, enabled, buffer, interval, mode, label");
    tu_run_free (&r);
    r = s_radixd ("[scheduler.missing]\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:3 [scheduler.missing]", "no schedule policy named \"missing\"");
    tu_run_free (&r);
}

Test (radixd, incompatible_plugin_named_in_config)
{
    struct tu_run r = s_radixd ("[scheduler]\npolicy = badmajor\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [scheduler]", "policy = \"badmajor\"", "sched-badmajor.so",
                             "ABI major mismatch", "plugin ABI 2.0, radixd ABI 1.4");
    tu_run_free (&r);
    r = s_radixd ("[scheduler]\npolicy = ../etc/x\n", "--check-config", NULL);
    EXPECT_ONE_LINE_FAILURE (r, "t.ini:4 [scheduler]", "invalid schedule policy name");
    tu_run_free (&r);
}

Test (radixd, list_plugins)
{
    struct tu_run r = s_radixd ("", "--list-plugins", NULL);
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    const char *want[] = { "KIND", "scheduler  fcfs", "scheduler  lpm", "scheduler  random",
                           "sched-fcfs.so", "scheduler  good             1.2.3    1.4",
                           "refused:", "ABI major mismatch" };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert (strstr (r.out, want[i]), "list lacks \"%s\":\n%s", want[i], r.out);
    tu_run_free (&r);
}

Test (radixd, help_plugin)
{
    struct tu_run r = s_radixd ("", "--help-plugin", "scheduler.good");
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    const char *want[] = { "sched-good 1.2.3", "INI section: [scheduler.good]", "depth", "integer",
                           "default: 4", "an integer in 1..64", "one of fast|safe|auto" };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert (strstr (r.out, want[i]), "help lacks \"%s\":\n%s", want[i], r.out);
    tu_run_free (&r);
    r = s_radixd ("", "--help-plugin", "fcfs");
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert (strstr (r.out, "first come, first served"), "%s", r.out);
    cr_assert (strstr (r.out, "(no keys)"), "%s", r.out);
    tu_run_free (&r);
    r = s_radixd ("", "--help-plugin", "nope");
    EXPECT_ONE_LINE_FAILURE (r, "no plugin named \"nope\"");
    tu_run_free (&r);
}

Test (radixd, check_plugin)
{
    char *bad = tu_path (tu_env ("RX_FIXTURE_DIR"), "sched-newerminor.so");
    char *argv[] = { (char *) tu_env ("RADIXD"), "--check-plugin", bad, NULL };
    struct tu_run r = tu_run_env (argv, NULL);
    EXPECT_ONE_LINE_FAILURE (r, "sched-newerminor.so", "plugin ABI 1.5, radixd ABI 1.4");
    tu_run_free (&r);
    char *good = tu_path (tu_env ("RX_FIXTURE_DIR"), "sched-good.so");
    argv[2] = good;
    r = tu_run_env (argv, NULL);
    cr_assert_eq (r.status, 0, "%s", r.err);
    cr_assert (strstr (r.out, "passes every loader check"), "%s", r.out);
    tu_run_free (&r);
    free (bad);
    free (good);
}

Test (radixd, reference_config_checks)
{
    char *ini = tu_path (tu_env ("RX_TOP_SRCDIR"), "conf/radixd.ini");
    char env[4096];
    snprintf (env, sizeof env, "RADIX_PLUGIN_PATH=%s", tu_env ("RX_PLUGIN_BUILD_DIR"));
    char *envv[] = { env, NULL };
    char *argv[] = { (char *) tu_env ("RADIXD"), "-c", ini, "--check-config", NULL };
    struct tu_run r = tu_run_env (argv, envv);
    cr_assert_eq (r.status, 0, "reference config: %s", r.err);
    tu_run_free (&r);
    free (ini);
}
