/* tests/testutil.h -- helpers shared by the Criterion tests: locating the
 * build tree, fixtures and ../shared, writing temp files, and running a real
 * process with its output captured. */
#ifndef RX_TESTUTIL_H
#define RX_TESTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* An environment variable the test harness must set (see tests/Makemodule.am). */
static inline const char *tu_env (const char *name)
{
    const char *v = getenv (name);
    if (!v || !*v) {
        fprintf (stderr, "test environment: %s is not set (run through make check)\n", name);
        abort ();
    }
    return v;
}

/* Skip the calling Criterion test (include <criterion/criterion.h> first)
 * when the shared reference data is absent -- e.g. inside make distcheck's
 * unpacked tarball, where ../shared is not beside the sources. */
#define TU_REQUIRE_SHARED()                                                     \
    do {                                                                        \
        char *p_ = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf"); \
        int ok_ = access (p_, R_OK) == 0;                                       \
        free (p_);                                                              \
        if (!ok_)                                                               \
            cr_skip_test ("shared test data absent: %s/data (set RADIX_SHARED)", \
                          tu_env ("RADIX_SHARED"));                             \
    } while (0)

/* A fresh private temporary directory (mode 0755, so plugins may live there). */
static inline char *tu_tmpdir (void)
{
    char tmpl[] = "/tmp/radix-test-XXXXXX";
    char *d = mkdtemp (tmpl);
    if (!d) abort ();
    chmod (d, 0755);
    return strdup (d);
}

static inline char *tu_path (const char *dir, const char *name)
{
    size_t n = strlen (dir) + strlen (name) + 2;
    char *p = malloc (n);
    snprintf (p, n, "%s/%s", dir, name);
    return p;
}

static inline void tu_write (const char *path, const char *text)
{
    FILE *f = fopen (path, "w");
    if (!f) abort ();
    fputs (text, f);
    fclose (f);
}

static inline char *tu_slurp_fd (int fd)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc (cap);
    for (;;) {
        if (n + 1024 > cap) buf = realloc (buf, cap *= 2);
        ssize_t r = read (fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t) r;
    }
    buf[n] = '\0';
    return buf;
}

/* The whole file at path (binary), NUL-terminated for convenience; *len
 * excludes the NUL.  Aborts the test process if it cannot be read. */
static inline void *tu_read_file (const char *path, size_t *len)
{
    int fd = open (path, O_RDONLY);
    if (fd < 0) {
        fprintf (stderr, "cannot open %s: %s\n", path, strerror (errno));
        abort ();
    }
    struct stat st;
    if (fstat (fd, &st) < 0) abort ();
    char *buf = malloc ((size_t) st.st_size + 1);
    size_t n = 0;
    while (n < (size_t) st.st_size) {
        ssize_t r = read (fd, buf + n, (size_t) st.st_size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) abort ();
        n += (size_t) r;
    }
    close (fd);
    buf[n] = '\0';
    *len = n;
    return buf;
}

struct tu_run {
    int status;     /* exit code, or 128+signal */
    char *out;      /* stdout */
    char *err;      /* stderr */
};

/* Run argv (NULL-terminated) with extra "K=V" env entries (NULL-terminated
 * or NULL), capture stdout and stderr.  Output is drained after exit, so
 * keep it under the pipe buffer (64 KiB). */
static inline struct tu_run tu_run_env (char *const argv[], char *const extra_env[])
{
    int po[2], pe[2];
    if (pipe (po) < 0 || pipe (pe) < 0) abort ();
    size_t ne = 0, nx = 0;
    while (environ[ne]) ne++;
    while (extra_env && extra_env[nx]) nx++;
    char **env = calloc (ne + nx + 1, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < nx; i++) env[k++] = extra_env[i];
    for (size_t i = 0; i < ne; i++) {
        int shadow = 0;
        for (size_t j = 0; j < nx; j++) {
            const char *eq = strchr (extra_env[j], '=');
            size_t kl = eq ? (size_t) (eq - extra_env[j]) + 1 : 0;
            if (kl && strncmp (environ[i], extra_env[j], kl) == 0) shadow = 1;
        }
        if (!shadow) env[k++] = environ[i];
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init (&fa);
    posix_spawn_file_actions_adddup2 (&fa, po[1], 1);
    posix_spawn_file_actions_adddup2 (&fa, pe[1], 2);
    posix_spawn_file_actions_addclose (&fa, po[0]);
    posix_spawn_file_actions_addclose (&fa, pe[0]);
    pid_t pid;
    struct tu_run r = { -1, NULL, NULL };
    int rc = posix_spawn (&pid, argv[0], &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy (&fa);
    free (env);
    close (po[1]);
    close (pe[1]);
    if (rc != 0) {
        fprintf (stderr, "spawn %s: %s\n", argv[0], strerror (rc));
        abort ();
    }
    /* Read both pipes with poll-free alternation: stderr is small in our use. */
    r.out = tu_slurp_fd (po[0]);
    r.err = tu_slurp_fd (pe[0]);
    close (po[0]);
    close (pe[0]);
    int st;
    while (waitpid (pid, &st, 0) < 0 && errno == EINTR) {}
    r.status = WIFEXITED (st) ? WEXITSTATUS (st) : 128 + WTERMSIG (st);
    return r;
}

static inline void tu_run_free (struct tu_run *r)
{
    free (r->out);
    free (r->err);
}

/* Number of '\n'-terminated lines in s. */
static inline int tu_lines (const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

#endif
