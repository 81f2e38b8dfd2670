/* tests/cli/test_eplb_cli.c -- `radix eplb` as a real process: the shape of
 * the JSON it prints (phy2log [L][P], logcnt [L][E] summing to P, log2phy
 * [L][E][max copies] padded with -1, balancedness [L] in (0, 1]), the
 * greedy algorithm by name, and one line on stderr with exit 2 (usage) or
 * 1 (bad file, refused problem) for each bad input. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "../testutil.h"

static struct tu_run s_radix (char *const *args)
{
    static char env[4096];
    snprintf (env, sizeof env, "RADIX_PLUGIN_PATH=%s", tu_env ("RX_PLUGIN_BUILD_DIR"));
    char *extra[] = { env, NULL };
    char *argv[64];
    int n = 0;
    argv[n++] = (char *) tu_env ("RADIX");
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    return tu_run_env (argv, extra);
}

/* 2 layers x 16 experts, skewed so that copies are made. */
static char *s_load_file (const char *dir)
{
    char *p = tu_path (dir, "load.json");
    tu_write (p, "{\"load\": [[900, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 500],\n"
                 "          [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]}\n");
    return p;
}

static void s_shape (const char *out, int L, int E, int P)
{
    json_error_t je;
    json_t *root = json_loads (out, 0, &je);
    cr_assert_not_null (root, "not JSON (%s): %s", je.text, out);
    json_t *pl = json_object_get (root, "phy2log"), *lc = json_object_get (root, "logcnt"),
           *lp = json_object_get (root, "log2phy"), *b = json_object_get (root, "balancedness");
    cr_assert_eq (json_array_size (pl), (size_t) L);
    cr_assert_eq (json_array_size (lc), (size_t) L);
    cr_assert_eq (json_array_size (lp), (size_t) L);
    cr_assert_eq (json_array_size (b), (size_t) L);
    json_int_t allmax = 0; /* log2phy's width: the most copies in any layer */
    for (int l = 0; l < L; l++) {
        json_t *row = json_array_get (pl, l), *cnt = json_array_get (lc, l), *lst = json_array_get (lp, l);
        cr_assert_eq (json_array_size (row), (size_t) P);
        cr_assert_eq (json_array_size (cnt), (size_t) E);
        cr_assert_eq (json_array_size (lst), (size_t) E);
        size_t width = json_array_size (json_array_get (lst, 0));
        json_int_t sum = 0, maxc = 0;
        for (int e = 0; e < E; e++) {
            json_int_t c = json_integer_value (json_array_get (cnt, e));
            cr_assert_geq (c, 1);
            sum += c;
            if (c > maxc) maxc = c;
            json_t *x = json_array_get (lst, e);
            cr_assert_eq (json_array_size (x), width, "log2phy rows are padded to one width");
            for (size_t k = 0; k < width; k++) {
                json_int_t s = json_integer_value (json_array_get (x, k));
                if ((json_int_t) k < c)
                    cr_assert_eq (json_integer_value (json_array_get (row, (size_t) s)), e);
                else
                    cr_assert_eq (s, -1);
            }
        }
        cr_assert_eq (sum, P);
        cr_assert_geq ((json_int_t) width, maxc);
        if (maxc > allmax) allmax = maxc;
        double v = json_number_value (json_array_get (b, l));
        cr_assert (v > 0 && v <= 1, "balancedness %g", v);
    }
    cr_assert_eq ((json_int_t) json_array_size (json_array_get (json_array_get (lp, 0), 0)), allmax);
    json_decref (root);
}

Test (eplb_cli, prints_the_placement_json)
{
    char *d = tu_tmpdir ();
    char *f = s_load_file (d);
    const char *algos[] = { "deepseek", "greedy" };
    for (int a = 0; a < 2; a++) {
        struct tu_run r = s_radix ((char *[]) { "eplb", "--algorithm", (char *) algos[a], "--load", f,
                                                "--physical", "20", "--groups", "4", "--nodes", "2",
                                                "--gpus", "4", NULL });
        cr_assert_eq (r.status, 0, "%s: %s", algos[a], r.err);
        cr_assert_str_empty (r.err);
        s_shape (r.out, 2, 16, 20);
        tu_run_free (&r);
    }
    /* defaults: deepseek, no redundancy, one GPU: balancedness 1 */
    struct tu_run r = s_radix ((char *[]) { "eplb", "--load", f, NULL });
    cr_assert_eq (r.status, 0, "%s", r.err);
    s_shape (r.out, 2, 16, 16);
    cr_assert (strstr (r.out, "\"balancedness\": [1.000000, 1.000000]"), "%s", r.out);
    tu_run_free (&r);
    free (f);
    free (d);
}

static void s_fails (char *const *args, int status, const char *msg)
{
    struct tu_run r = s_radix (args);
    cr_assert_eq (r.status, status, "exit %d (want %d): %s", r.status, status, r.err);
    cr_assert_str_empty (r.out);
    cr_assert_eq (tu_lines (r.err), 1, "stderr: %s", r.err);
    cr_assert (strstr (r.err, msg), "stderr \"%s\" lacks \"%s\"", r.err, msg);
    tu_run_free (&r);
}

Test (eplb_cli, bad_input_one_line_and_exit_code)
{
    char *d = tu_tmpdir ();
    char *f = s_load_file (d);
    char *bad = tu_path (d, "bad.json");
    tu_write (bad, "{\"load\": [[1, 2], [3]]}");
    char *absent = tu_path (d, "absent.json");
    s_fails ((char *[]) { "eplb", NULL }, 2, "--load FILE is required");
    s_fails ((char *[]) { "eplb", "--load", f, "--gpus", "x", NULL }, 2, "--gpus wants a positive integer");
    s_fails ((char *[]) { "eplb", "--load", f, "--physical", "0", NULL }, 2, "--physical wants");
    s_fails ((char *[]) { "eplb", "--load", f, "--frobnicate", NULL }, 2, "unknown or incomplete option");
    s_fails ((char *[]) { "eplb", "--load", f, "stray", NULL }, 2, "unexpected argument \"stray\"");
    s_fails ((char *[]) { "eplb", "--load", absent, NULL }, 1, "absent.json");
    s_fails ((char *[]) { "eplb", "--load", bad, NULL }, 1, "\"load\"[1] has 1 entries, layer 0 has 2");
    s_fails ((char *[]) { "eplb", "--load", f, "--physical", "18", "--gpus", "4", NULL }, 1,
             "18 physical slots do not divide over 4 GPUs");
    s_fails ((char *[]) { "eplb", "--load", f, "--groups", "3", NULL }, 1,
             "16 logical experts do not divide into 3 groups");
    s_fails ((char *[]) { "eplb", "--load", f, "--algorithm", "nosuch", NULL }, 1, "nosuch");
    /* --config: the plugin's section is validated against its (empty) key table */
    char *ini = tu_path (d, "x.ini");
    tu_write (ini, "[eplb.greedy]\nfoo = 1\n");
    s_fails ((char *[]) { "eplb", "--load", f, "--algorithm", "greedy", "--config", ini, NULL }, 1,
             "unknown key \"foo\"");
    tu_write (ini, "[eplb.greedy]\n");
    struct tu_run r = s_radix ((char *[]) { "eplb", "--load", f, "--algorithm", "greedy", "--config", ini,
                                            "--physical", "20", "--gpus", "4", NULL });
    cr_assert_eq (r.status, 0, "%s", r.err);
    s_shape (r.out, 2, 16, 20);
    tu_run_free (&r);
    free (ini);
    free (f);
    free (bad);
    free (absent);
    free (d);
}
