/* tests/fuzz/replay.c -- runs a libFuzzer harness (tests/fuzz/fuzz_NAME.c,
 * linked beside this file) over its seed corpus (tests/fuzz/corpus/NAME/)
 * and its regressions (tests/fuzz/regressions-NAME/: inputs it once failed
 * on) as a Criterion test, so `make check` (and the sanitizer builds of
 * scripts/test-hardening) replays every one of them without clang.  A
 * harness reports a broken property with abort(), which fails the test;
 * the file being replayed is logged first so the failure names it.
 * Compile with -DRX_FUZZ_NAME='"NAME"'. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"

#ifndef RX_FUZZ_NAME
#error "compile with -DRX_FUZZ_NAME='\"name\"'"
#endif

int LLVMFuzzerInitialize (int *argc, char ***argv) __attribute__ ((weak));
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static void s_init (void)
{
    if (LLVMFuzzerInitialize) {
        int argc = 1;
        char *args[] = { "replay", NULL }, **argv = args;
        LLVMFuzzerInitialize (&argc, &argv);
    }
}

static int s_cmp (const void *a, const void *b)
{
    return strcmp (*(char *const *) a, *(char *const *) b);
}

/* Replay every file of dir (README excepted) in name order; returns how many. */
static int s_replay_dir (const char *sub)
{
    char dir[4096];
    snprintf (dir, sizeof dir, "%s/tests/fuzz/%s", tu_env ("RX_TOP_SRCDIR"), sub);
    DIR *d = opendir (dir);
    cr_assert_not_null (d, "cannot open %s", dir);
    char *names[4096];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir (d)) && n < 4096) {
        if (de->d_name[0] == '.' || strcmp (de->d_name, "README") == 0) continue;
        names[n++] = strdup (de->d_name);
    }
    closedir (d);
    qsort (names, n, sizeof *names, s_cmp);
    for (size_t i = 0; i < n; i++) {
        char path[8192];
        snprintf (path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen (path, "rb");
        cr_assert_not_null (f, "cannot open %s", path);
        fseek (f, 0, SEEK_END);
        long len = ftell (f);
        rewind (f);
        uint8_t *buf = malloc (len > 0 ? (size_t) len : 1);
        cr_assert_not_null (buf);
        cr_assert_eq (fread (buf, 1, (size_t) len, f), (size_t) len, "short read of %s", path);
        fclose (f);
        fprintf (stderr, "replay %s\n", path);
        cr_assert_eq (LLVMFuzzerTestOneInput (buf, (size_t) len), 0, "%s", path);
        free (buf);
        free (names[i]);
    }
    return (int) n;
}

Test (fuzz, seed_corpus, .init = s_init)
{
    int n = s_replay_dir ("corpus/" RX_FUZZ_NAME);
    cr_assert_geq (n, 5, "only %d seeds in tests/fuzz/corpus/" RX_FUZZ_NAME, n);
}

Test (fuzz, regressions, .init = s_init)
{
    s_replay_dir ("regressions-" RX_FUZZ_NAME);
}
