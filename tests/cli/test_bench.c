/* tests/cli/test_bench.c -- `radix bench` as a real process on the tiny
 * reference model: the tests it runs, the JSON it prints, the weight bytes
 * (checked against the shapes in $RADIX_SHARED/data/models/README.md, the
 * same number llama-bench reports as model_size), and one clear error per bad
 * option.  Speeds are only checked for being positive and ordered: speed is
 * measured by bench/compare-llamacpp.sh, not asserted in tests. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "../testutil.h"

static char *s_shared (const char *rel)
{
    char *p = tu_path (tu_env ("RADIX_SHARED"), rel);
    if (access (p, R_OK) != 0) {
        free (p);
        cr_skip_test ("shared test data %s is absent", rel);
    }
    return p;
}

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

/* tiny-llama: token_embd and output F16 [64,32000]; per block (2) q,o
 * [64,64], k,v [64,32], gate,up [64,128], down [128,64] F32; five F32 norms
 * of 64. */
#define TINY_BYTES (2u * 64 * 32000 * 2 + 2u * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) * 4 + 5u * 64 * 4)

Test (bench, json_lists_every_test_with_ordered_stats)
{
    char *m = s_shared ("data/models/tiny-llama.gguf");
    struct tu_run r = s_radix ((char *[]) { "bench", "--model", m, "--threads", "1", "--pp", "8,16",
                                            "--tg", "4", "--batch", "1,3", "--reps", "3",
                                            "--bw-mib", "16", "--json", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    json_error_t je;
    json_t *root = json_loads (r.out, 0, &je);
    cr_assert_not_null (root, "not JSON (%s): %s", je.text, r.out);
    cr_assert_str_eq (json_string_value (json_object_get (root, "model")), m);
    cr_assert_eq (json_integer_value (json_object_get (root, "threads")), 1);
    cr_assert_eq (json_integer_value (json_object_get (root, "reps")), 3);
    json_int_t bytes = json_integer_value (json_object_get (root, "model_bytes"));
    cr_assert_eq (bytes, (json_int_t) TINY_BYTES, "model_bytes %lld, want %u", (long long) bytes, TINY_BYTES);
    double bw = json_number_value (json_object_get (root, "bandwidth_gbs"));
    cr_assert (bw > 0.1 && bw < 10000, "bandwidth %g GB/s", bw);

    static const struct { const char *name, *kind; int n, batch; } want[] = {
        { "pp8", "pp", 8, 1 }, { "pp16", "pp", 16, 1 }, { "tg4", "tg", 4, 1 },
        { "tg4@b1", "batch", 4, 1 }, { "tg4@b3", "batch", 4, 3 },
    };
    json_t *tests = json_object_get (root, "tests");
    cr_assert_eq (json_array_size (tests), 5, "%s", r.out);
    double tg = 0;
    for (size_t i = 0; i < 5; i++) {
        json_t *t = json_array_get (tests, i);
        cr_assert_str_eq (json_string_value (json_object_get (t, "test")), want[i].name);
        cr_assert_str_eq (json_string_value (json_object_get (t, "kind")), want[i].kind);
        cr_assert_eq (json_integer_value (json_object_get (t, "n")), want[i].n);
        cr_assert_eq (json_integer_value (json_object_get (t, "batch")), want[i].batch);
        double med = json_number_value (json_object_get (t, "tok_s")),
               lo = json_number_value (json_object_get (t, "tok_s_min")),
               hi = json_number_value (json_object_get (t, "tok_s_max"));
        json_t *smp = json_object_get (t, "samples");
        cr_assert_eq (json_array_size (smp), 3);
        double s[3];
        for (size_t k = 0; k < 3; k++) s[k] = json_number_value (json_array_get (smp, k));
        /* min, median, max of the three samples */
        double a = fmin (s[0], fmin (s[1], s[2])), c = fmax (s[0], fmax (s[1], s[2]));
        double b = s[0] + s[1] + s[2] - a - c;
        cr_assert (lo > 0 && fabs (lo - a) < 1e-2 && fabs (med - b) < 1e-2 && fabs (hi - c) < 1e-2,
                   "%s: %g %g %g vs samples %g %g %g", want[i].name, lo, med, hi, s[0], s[1], s[2]);
        if (i == 2) tg = med;
    }
    double roof = json_number_value (json_object_get (root, "tg_roofline"));
    cr_assert (fabs (roof - (double) TINY_BYTES * tg / (bw * 1e9)) < 1e-3 * (roof + 1e-9) + 1e-4,
               "tg_roofline %g for %g tok/s at %g GB/s", roof, tg, bw);
    json_decref (root);
    tu_run_free (&r);
    free (m);
}

Test (bench, table_and_skipped_parts)
{
    char *m = s_shared ("data/models/tiny-llama-q8.gguf");
    struct tu_run r = s_radix ((char *[]) { "bench", "--model", m, "--threads", "2", "--pp", "4",
                                            "--tg", "2", "--batch", "none", "--reps", "1",
                                            "--bw-mib", "0", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert (strstr (r.out, "| pp4 ") && strstr (r.out, "| tg2 "), "%s", r.out);
    cr_assert_null (strstr (r.out, "@b"), "--batch none still ran batches: %s", r.out);
    cr_assert (strstr (r.out, "read bw:    not measured"), "%s", r.out);
    cr_assert_null (strstr (r.out, "roofline:"), "roofline without a bandwidth: %s", r.out);
    cr_assert (strstr (r.out, "2 threads"), "%s", r.out);
    tu_run_free (&r);
    free (m);
}

static void s_bad (char *const *args, int status, const char *needle)
{
    struct tu_run r = s_radix (args);
    cr_assert_eq (r.status, status, "%s %s: status %d, stderr: %s", args[1], args[2] ? args[2] : "",
                  r.status, r.err);
    cr_assert (strstr (r.err, needle), "stderr lacks \"%s\": %s", needle, r.err);
    cr_assert_str_eq (r.out, "", "stdout on error: %s", r.out);
    tu_run_free (&r);
}

Test (bench, greedy_takes_the_device_argmax)
{
    char *m = s_shared ("data/models/tiny-llama.gguf");
    struct tu_run r = s_radix ((char *[]) { "bench", "--model", m, "--threads", "1", "--pp", "8",
                                            "--tg", "3", "--batch", "2", "--reps", "1",
                                            "--bw-mib", "0", "--json", "--greedy", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    json_error_t je;
    json_t *root = json_loads (r.out, 0, &je);
    cr_assert_not_null (root, "not JSON (%s): %s", je.text, r.out);
    cr_assert (json_is_true (json_object_get (root, "greedy")), "%s", r.out);
    json_t *tests = json_object_get (root, "tests");
    cr_assert_eq (json_array_size (tests), 3, "pp8, tg3, tg3@b2: %s", r.out);
    for (size_t i = 0; i < 3; i++)
        cr_assert_gt (json_number_value (json_object_get (json_array_get (tests, i), "tok_s")), 0);
    json_decref (root);
    tu_run_free (&r);
    r = s_radix ((char *[]) { "bench", "--model", m, "--pp", "4", "--tg", "0", "--reps", "1",
                              "--bw-mib", "0", "--greedy", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert (strstr (r.out, "device argmax (--greedy)"), "%s", r.out);
    tu_run_free (&r);
    free (m);
}

/* --sample K: --greedy plus device sampling's candidates every step. */
Test (bench, sample_adds_the_device_candidates)
{
    char *m = s_shared ("data/models/tiny-llama.gguf");
    struct tu_run r = s_radix ((char *[]) { "bench", "--model", m, "--threads", "1", "--pp", "8",
                                            "--tg", "3", "--batch", "2", "--reps", "1",
                                            "--bw-mib", "0", "--json", "--sample", "8", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    json_error_t je;
    json_t *root = json_loads (r.out, 0, &je);
    cr_assert_not_null (root, "not JSON (%s): %s", je.text, r.out);
    cr_assert (json_is_true (json_object_get (root, "greedy")), "--sample implies --greedy: %s", r.out);
    cr_assert_eq (json_integer_value (json_object_get (root, "sample")), 8, "%s", r.out);
    json_t *tests = json_object_get (root, "tests");
    cr_assert_eq (json_array_size (tests), 3, "pp8, tg3, tg3@b2: %s", r.out);
    for (size_t i = 0; i < 3; i++)
        cr_assert_gt (json_number_value (json_object_get (json_array_get (tests, i), "tok_s")), 0);
    json_decref (root);
    tu_run_free (&r);
    s_bad ((char *[]) { "bench", "--model", m, "--sample", "0", NULL }, 2, "--sample \"0\"");
    s_bad ((char *[]) { "bench", "--model", m, "--sample", "4097", NULL }, 2, "--sample \"4097\"");
    free (m);
}

/* --depth: every test once per depth, its sequences filled first.  Each
 * sequence has room for its depth and one run's tokens only, so a second
 * rep that did not cut the sequences back to the depth would fail (no
 * room): status 0 over 3 reps says they were. */
Test (bench, depth_runs_every_test_at_each_depth)
{
    char *m = s_shared ("data/models/tiny-llama.gguf");
    struct tu_run r = s_radix ((char *[]) { "bench", "--model", m, "--threads", "1", "--pp", "8",
                                            "--tg", "3", "--batch", "2", "--reps", "3", "--depth", "0,600",
                                            "--bw-mib", "0", "--json", "--greedy", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    json_error_t je;
    json_t *root = json_loads (r.out, 0, &je);
    cr_assert_not_null (root, "not JSON (%s): %s", je.text, r.out);
    static const struct { const char *name; int depth; } want[] = {
        { "pp8", 0 }, { "tg3", 0 }, { "tg3@b2", 0 }, { "pp8@d600", 600 }, { "tg3@d600", 600 }, { "tg3@b2@d600", 600 },
    };
    json_t *tests = json_object_get (root, "tests");
    cr_assert_eq (json_array_size (tests), 6, "%s", r.out);
    for (size_t i = 0; i < 6; i++) {
        json_t *t = json_array_get (tests, i);
        cr_assert_str_eq (json_string_value (json_object_get (t, "test")), want[i].name);
        cr_assert_eq (json_integer_value (json_object_get (t, "depth")), want[i].depth);
        cr_assert_gt (json_number_value (json_object_get (t, "tok_s")), 0);
    }
    json_decref (root);
    tu_run_free (&r);
    /* the table names them too; the default is depth 0 only */
    r = s_radix ((char *[]) { "bench", "--model", m, "--pp", "none", "--tg", "2", "--batch", "none",
                              "--reps", "1", "--depth", "40", "--bw-mib", "0", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert (strstr (r.out, "| tg2@d40 "), "%s", r.out);
    cr_assert_null (strstr (r.out, "| tg2 "), "%s", r.out);
    tu_run_free (&r);
    s_bad ((char *[]) { "bench", "--model", m, "--depth", "-1", NULL }, 2, "--depth \"-1\"");
    s_bad ((char *[]) { "bench", "--model", m, "--depth", "1048577", NULL }, 2, "--depth \"1048577\"");
    free (m);
}

Test (bench, bad_options_get_one_clear_error)
{
    char *m = s_shared ("data/models/tiny-llama.gguf");
    s_bad ((char *[]) { "bench", NULL }, 2, "--model is required");
    s_bad ((char *[]) { "bench", "--model", m, "--reps", "0", NULL }, 2, "--reps \"0\"");
    s_bad ((char *[]) { "bench", "--model", m, "--pp", "128,abc", NULL }, 2, "--pp \"abc\"");
    s_bad ((char *[]) { "bench", "--model", m, "--pp", ",", NULL }, 2, "--pp \",\"");
    s_bad ((char *[]) { "bench", "--model", m, "--batch", "65", NULL }, 2, "--batch \"65\"");
    s_bad ((char *[]) { "bench", "--model", m, "--tg", "-1", NULL }, 2, "--tg \"-1\"");
    s_bad ((char *[]) { "bench", "--model", m, "--threads", "x", NULL }, 2, "--threads \"x\"");
    s_bad ((char *[]) { "bench", "--model", m, "extra", NULL }, 2, "unexpected argument \"extra\"");
    s_bad ((char *[]) { "bench", "--model", "/nonexistent/m.gguf", "--bw-mib", "0", NULL }, 1,
           "/nonexistent/m.gguf");
    free (m);
}
