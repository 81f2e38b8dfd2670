/* tests/unit/test_kernels_guard.c -- what makes `[kernels] backend = cuda`
 * safe to swap in, checked on the CPU:
 *
 *   - kernels/cpu/guard.c (compiled in here) and kernels-cpu's
 *     guard_device_memory mode: device memory is PROT_NONE outside kernel
 *     ops, so a host dereference crashes (and says so on stderr), and a
 *     host pointer given to an op or a copy's wrong side is RX_EINVAL;
 *   - per-rank device selection: [kernels] device, rx_kernels_pick_device
 *     and the value the engine hands to create() for ranks 0..3;
 *   - KV sizing from a device's free memory (rx_engine_kv_share,
 *     rx_engine_kv_device_bytes, and the engine taking that path when the
 *     backend is not host-visible).
 *
 * The model tests themselves run guarded through tests/guard.sh. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/kernel.h>

#include "boot.h"
#include "conf.h"
#include "engine.h"
#include "host.h"
#include "loader.h"
#include "log.h"
#include "../../kernels/cpu/guard.h"
#include "../testutil.h"

/* The fault tests expect the guard's SIGSEGV; AddressSanitizer (the
 * hardening stage's build) catches it first, writes a report and aborts.
 * Under ASan they are skipped: what they prove is the guard's page
 * protection, which ASan's own checks do not replace. */
#if defined(__SANITIZE_ADDRESS__)
#  define S_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define S_ASAN 1
#  endif
#endif
#ifdef S_ASAN
#  define S_FAULT_SIGNAL 0
#  define S_SKIP_UNDER_ASAN() cr_skip_test ("the guard's SIGSEGV is AddressSanitizer's to report in this build")
#else
#  define S_FAULT_SIGNAL SIGSEGV
#  define S_SKIP_UNDER_ASAN() ((void) 0)
#endif

/* ================================================================ guard -- */

TestSuite (guard);

Test (guard, alloc_free_reuse_and_errors)
{
    struct rx_err err = { 0 };
    long page = sysconf (_SC_PAGESIZE);
    cr_assert_null (rx_kguard_new (0, &err));
    cr_assert_eq (err.code, RX_EINVAL);
    rx_kguard_t *g = rx_kguard_new (16 * (size_t) page, &err);
    cr_assert_not_null (g, "%s", err.msg);
    void *a, *b, *c;
    cr_assert_eq (rx_kguard_alloc (g, 10, 0, &a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq ((uintptr_t) a % (uintptr_t) page, 0, "page aligned");
    cr_assert (rx_kguard_contains (g, a));
    cr_assert_eq (rx_kguard_size (g, a), (size_t) page);
    cr_assert_eq (rx_kguard_alloc (g, (size_t) page + 1, 0, &b, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_kguard_size (g, b), 2 * (size_t) page);
    cr_assert_eq ((uint8_t *) b, (uint8_t *) a + page, "first fit after a");
    cr_assert_eq (rx_kguard_count (g), 2);
    /* Bad frees change nothing. */
    cr_assert_eq (rx_kguard_free (g, (uint8_t *) b + 8), RX_EINVAL);
    cr_assert_eq (rx_kguard_free (g, NULL), RX_EINVAL);
    int local;
    cr_assert_eq (rx_kguard_free (g, &local), RX_EINVAL);
    cr_assert_not (rx_kguard_contains (g, &local));
    cr_assert_eq (rx_kguard_count (g), 2);
    /* The gap a leaves is reused. */
    cr_assert_eq (rx_kguard_free (g, a), RX_OK);
    cr_assert_eq (rx_kguard_free (g, a), RX_EINVAL, "double free refused");
    cr_assert_eq (rx_kguard_alloc (g, 100, 0, &c, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (c, a);
    /* Alignment beyond a page. */
    void *d;
    cr_assert_eq (rx_kguard_alloc (g, 1, 4 * (size_t) page, &d, &err), RX_OK, "%s", err.msg);
    cr_assert_eq ((uintptr_t) d % (4 * (uintptr_t) page), 0);
    cr_assert_eq (rx_kguard_alloc (g, 1, 3, &d, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "power of two"), "%s", err.msg);
    /* Full: one clear line. */
    cr_assert_eq (rx_kguard_alloc (g, 64 * (size_t) page, 0, &d, &err), RX_ENOMEM);
    cr_assert (strstr (err.msg, "guard region"), "%s", err.msg);
    /* 4 of the 16 pages are taken (d sits at page 3 or later): 13 never fit. */
    cr_assert_eq (rx_kguard_alloc (g, 13 * (size_t) page, 0, &d, &err), RX_ENOMEM);
    cr_assert (strstr (err.msg, "no room"), "%s", err.msg);
    rx_kguard_destroy (&g);
    cr_assert_null (g);
    rx_kguard_destroy (&g);
    rx_kguard_destroy (NULL);
}

Test (guard, open_nests_and_freed_pages_read_zero)
{
    struct rx_err err = { 0 };
    rx_kguard_t *g = rx_kguard_new (1 << 20, &err);
    cr_assert_not_null (g, "%s", err.msg);
    int *a;
    cr_assert_eq (rx_kguard_alloc (g, 4096, 0, (void **) &a, &err), RX_OK, "%s", err.msg);
    rx_kguard_open (g);
    a[0] = 41;
    rx_kguard_open (g);      /* nested: a copy inside an op */
    a[0]++;
    rx_kguard_close (g);
    cr_assert_eq (a[0], 42, "still open after the inner close");
    /* A block allocated while open is usable at once. */
    int *b;
    cr_assert_eq (rx_kguard_alloc (g, 4096, 0, (void **) &b, &err), RX_OK, "%s", err.msg);
    b[1] = 7;
    cr_assert_eq (rx_kguard_free (g, a), RX_OK);
    rx_kguard_close (g);
    rx_kguard_close (g);     /* unbalanced close: ignored */
    int *c;
    cr_assert_eq (rx_kguard_alloc (g, 4096, 0, (void **) &c, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (c, a);
    rx_kguard_open (g);
    cr_assert_eq (c[0], 0, "a freed page comes back zeroed");
    cr_assert_eq (b[1], 7);
    rx_kguard_close (g);
    rx_kguard_destroy (&g);
}

Test (guard, access_after_close_faults, .signal = S_FAULT_SIGNAL)
{
    S_SKIP_UNDER_ASAN ();
    struct rx_err err = { 0 };
    rx_kguard_t *g = rx_kguard_new (1 << 20, &err);
    cr_assert_not_null (g, "%s", err.msg);
    volatile int *a;
    cr_assert_eq (rx_kguard_alloc (g, 64, 0, (void **) &a, &err), RX_OK, "%s", err.msg);
    rx_kguard_open (g);
    a[0] = 1;
    rx_kguard_close (g);
    int v = a[0];            /* must fault */
    cr_log_error ("read %d from a closed guard region", v);
}

/* ======================================================= kernels-cpu -- */

static const struct rx_kernels_ops *K;
static rx_loader_t *s_loader;
static rx_plugin_t *s_plugin;
static struct rx_host_binding s_bind[8];
static rx_conf_t *s_conf[8];
static int s_nb;

static void s_load (void)
{
    struct rx_err err = { 0 };
    s_loader = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (s_loader, "%s", err.msg);
    cr_assert_eq (rx_loader_find (s_loader, RX_KIND_KERNELS, "cpu", &s_plugin, &err), RX_OK,
                  "%s", err.msg);
    cr_assert_eq (rx_plugin_init (s_plugin, NULL, &err), RX_OK, "%s", err.msg);
    K = rx_plugin_ops (s_plugin);
}

static void s_unload (void)
{
    for (int i = 0; i < s_nb; i++) rx_conf_destroy (&s_conf[i]);
    rx_loader_destroy (&s_loader);
}

/* A kernels-cpu instance configured by ini ([kernels.cpu] body). */
static void *s_create_p (const char *ini, const struct rx_kernels_params *p, int *rc,
                         struct rx_err *err)
{
    cr_assert_lt (s_nb, 8);
    char text[256];
    snprintf (text, sizeof text, "[kernels.cpu]\n%s", ini ? ini : "");
    struct rx_err e = { 0 };
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "t.ini", &e);
    cr_assert_not_null (c, "%s", e.msg);
    s_conf[s_nb] = c;
    struct rx_host_binding *b = &s_bind[s_nb++];
    rx_host_bind (b, "kernels-cpu", "kernels.cpu", c, rx_plugin_desc (s_plugin)->keys);
    void *be = NULL;
    *rc = K->create (&b->host, p, &be, err);
    return be;
}

static void *s_create (const char *ini)
{
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 2, .device = 0 };
    struct rx_err err = { 0 };
    int rc;
    void *be = s_create_p (ini, &p, &rc, &err);
    cr_assert_eq (rc, RX_OK, "%s", err.msg);
    return be;
}

static rx_kweight_t *s_f32_weight (void *be, const float *v, uint64_t n)
{
    struct rx_weight_view wv = { .name = "norm", .dtype = RX_F32, .n_dims = 1,
                                 .ne = { n, 1, 1, 1 }, .data = v, .nbytes = n * sizeof (float) };
    rx_kweight_t *w = NULL;
    struct rx_err err = { 0 };
    cr_assert_eq (K->weight_load (be, &wv, &w, &err), RX_OK, "%s", err.msg);
    return w;
}

TestSuite (kguard, .init = s_load, .fini = s_unload);

/* Guarded: not host-visible, and the ops still compute right through the
 * copies (x + w, w read where weight_data points; rms_norm by it). */
Test (kguard, ops_and_copies_work_guarded)
{
    void *be = s_create ("guard_device_memory = true\n");
    struct rx_kernels_info info = { .struct_size = sizeof info };
    cr_assert_eq (K->info (be, &info), RX_OK);
    cr_assert_not (info.caps & RX_KCAP_HOST_VISIBLE, "guard mode must not claim host-visible memory");
    cr_assert_gt (info.mem_free, 0);
    cr_assert_eq (info.n_devices, 1);
    cr_assert_eq (info.device_index, 0);
    struct rx_err err = { 0 };
    enum { N = 3000 };   /* crosses pages */
    float *hx = malloc (N * sizeof *hx), *hw = malloc (N * sizeof *hw), *hy = malloc (N * sizeof *hy);
    for (int i = 0; i < N; i++) {
        hx[i] = (float) (i % 17) - 8.f;
        hw[i] = 0.5f + (float) (i % 5);
    }
    rx_kweight_t *w = s_f32_weight (be, hw, N);
    const void *wd;
    cr_assert_eq (K->weight_data (be, w, &wd, &err), RX_OK, "%s", err.msg);
    float *dx, *dy;
    cr_assert_eq (K->alloc (be, N * sizeof (float), 0, (void **) &dx, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->alloc (be, N * sizeof (float), 0, (void **) &dy, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, hx, N * sizeof (float), &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->add (be, NULL, dx, N, wd, 0, dy, N, 1, N, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, hy, dy, N * sizeof (float), &err), RX_OK, "%s", err.msg);
    for (int i = 0; i < N; i++) cr_assert_eq (hy[i], hx[i] + hw[i], "add at %d", i);
    cr_assert_eq (K->rms_norm (be, NULL, dx, N, wd, dy, N, 1, N, 0.f, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, hy, dy, N * sizeof (float), &err), RX_OK, "%s", err.msg);
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double) hx[i] * hx[i];
    double inv = 1.0 / sqrt (ss / N);
    for (int i = 0; i < N; i += 97)
        cr_assert_float_eq (hy[i], hx[i] * inv * hw[i], 1e-4, "rms_norm at %d", i);
    /* Frees: a foreign pointer is logged and ignored (no crash). */
    K->free_ (be, hx);
    K->free_ (be, (uint8_t *) dx + 4);
    K->free_ (be, dx);
    K->free_ (be, dy);
    K->weight_free (be, w);
    K->destroy (be);
    free (hx);
    free (hw);
    free (hy);
}

/* The other direction: a host pointer handed to an op or on the wrong side
 * of a copy is one clear RX_EINVAL line in guard mode (works unguarded). */
Test (kguard, host_pointers_to_ops_are_refused)
{
    void *be = s_create ("guard_device_memory = true\n");
    struct rx_err err = { 0 };
    float host[64] = { 0 }, back[64];
    int32_t hid[4] = { 0, 1, 2, 3 };
    float *d;
    int32_t *did;
    cr_assert_eq (K->alloc (be, sizeof host, 0, (void **) &d, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->alloc (be, sizeof hid, 0, (void **) &did, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->scale (be, NULL, host, 64, d, 64, 1, 64, 2.f, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "scale") && strstr (err.msg, "not device memory"), "%s", err.msg);
    cr_assert_eq (K->add (be, NULL, d, 64, d, 64, host, 64, 1, 64, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "add") && strstr (err.msg, "y = "), "%s", err.msg);
    cr_assert_eq (K->argmax (be, NULL, d, 64, 4, 16, hid, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "out = "), "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, host, back, sizeof host, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "copy_h2d: dst") && strstr (err.msg, "not device memory"), "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, back, host, sizeof host, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "copy_d2h: src"), "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, d, d, 4, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "use copy_d2d"), "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, d, d, 4, &err), RX_EINVAL);
    cr_assert_eq (K->copy_d2d (be, NULL, d, host, 4, &err), RX_EINVAL);
    cr_assert_eq (K->memset_ (be, NULL, host, 0, 4, &err), RX_EINVAL);
    /* The right sides work. */
    cr_assert_eq (K->copy_h2d (be, NULL, did, hid, sizeof hid, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2d (be, NULL, d, d + 32, 16, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->argmax (be, NULL, d, 64, 1, 16, did, &err), RX_OK, "%s", err.msg);
    K->destroy (be);
    /* Unguarded the same host pointers are accepted (host-visible). */
    be = s_create (NULL);
    cr_assert_eq (K->scale (be, NULL, host, 64, host, 64, 1, 64, 2.f, &err), RX_OK, "%s", err.msg);
    K->destroy (be);
}

Test (kguard, host_read_of_alloc_faults, .signal = S_FAULT_SIGNAL)
{
    S_SKIP_UNDER_ASAN ();
    void *be = s_create ("guard_device_memory = true\n");
    struct rx_err err = { 0 };
    volatile float *d;
    cr_assert_eq (K->alloc (be, 64, 0, (void **) &d, &err), RX_OK, "%s", err.msg);
    float v = d[3];
    cr_log_error ("read %g from device memory on the host", (double) v);
}

Test (kguard, host_read_of_weight_data_faults, .signal = S_FAULT_SIGNAL)
{
    S_SKIP_UNDER_ASAN ();
    void *be = s_create ("guard_device_memory = true\n");
    float hw[64] = { 1.f };
    rx_kweight_t *w = s_f32_weight (be, hw, 64);
    const volatile float *wd;
    struct rx_err err = { 0 };
    cr_assert_eq (K->weight_data (be, w, (const void **) &wd, &err), RX_OK, "%s", err.msg);
    float v = wd[0];
    cr_log_error ("read %g from a weight on the host", (double) v);
}

/* The crash names the cause on stderr (the forked child's). */
Test (kguard, fault_message_names_the_cause)
{
    S_SKIP_UNDER_ASAN ();
    int pfd[2];
    cr_assert_eq (pipe (pfd), 0);
    pid_t pid = fork ();
    cr_assert_geq (pid, 0);
    if (pid == 0) {
        dup2 (pfd[1], 2);
        close (pfd[0]);
        void *be = s_create ("guard_device_memory = true\n");
        volatile int *d;
        struct rx_err err = { 0 };
        if (K->alloc (be, 64, 0, (void **) &d, &err) != RX_OK) _exit (3);
        d[0] = 1;
        _exit (4);
    }
    close (pfd[1]);
    char *text = tu_slurp_fd (pfd[0]);
    close (pfd[0]);
    int st;
    cr_assert_eq (waitpid (pid, &st, 0), pid);
    cr_assert (WIFSIGNALED (st) && WTERMSIG (st) == SIGSEGV, "child status %d, stderr: %s", st, text);
    cr_assert (strstr (text, "host access to device memory"), "stderr: %s", text);
    cr_assert (strstr (text, "outside a kernel op"), "stderr: %s", text);
    free (text);
}

/* The MoE expert pass of kernel ABI 1.3 (moe_sort, gather_rows,
 * matmul_grouped, moe_combine) reads its routing and offsets inside the
 * ops: guarded it gives what the unguarded instance gives on host memory,
 * and a host routing array is refused. */
static void s_moe_pass (void *be, const float *wv, const float *x, const int32_t *ids, const float *w,
                        int32_t *off, int32_t *row, int32_t *src, float *xs, float *ys, float *out)
{
    enum { T = 5, KK = 2, NE = 3, IN = 8, OUT = 6 };
    struct rx_err err = { 0 };
    struct rx_weight_view v = { .name = "ffn_up_exps", .dtype = RX_F32, .n_dims = 3,
                                .ne = { IN, OUT, NE, 1 }, .data = wv, .nbytes = IN * OUT * NE * sizeof (float) };
    rx_kweight_t *kw = NULL;
    cr_assert_eq (K->weight_load (be, &v, &kw, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->moe_sort (be, NULL, ids, T, KK, NE, off, row, src, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->gather_rows (be, NULL, x, IN, src, T * KK, IN, xs, IN, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->matmul_grouped (be, NULL, kw, off, 0, xs, IN, ys, OUT, T * KK, 0, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->moe_combine (be, NULL, ys, OUT, row, w, T, KK, OUT, out, OUT, 0, &err), RX_OK, "%s", err.msg);
    K->weight_free (be, kw);
}

Test (kguard, moe_ops_work_guarded)
{
    enum { T = 5, KK = 2, NE = 3, IN = 8, OUT = 6, NR = T * KK };
    float hwv[IN * OUT * NE], hx[T * IN], hw[NR], want[T * OUT], got[T * OUT];
    int32_t hids[NR] = { 0, 2, 1, 1, 2, -1, 0, 2, 1, 0 };
    for (int i = 0; i < IN * OUT * NE; i++) hwv[i] = (float) ((i * 7) % 11) * 0.25f - 1.f;
    for (int i = 0; i < T * IN; i++) hx[i] = (float) ((i * 5) % 13) * 0.5f - 3.f;
    for (int i = 0; i < NR; i++) hw[i] = 0.1f * (float) (i + 1);
    /* unguarded, on host memory */
    void *be = s_create (NULL);
    int32_t off[NE + 1], row[NR], src[NR];
    float xs[NR * IN], ys[NR * OUT];
    s_moe_pass (be, hwv, hx, hids, hw, off, row, src, xs, ys, want);
    K->destroy (be);
    /* guarded, on device memory */
    be = s_create ("guard_device_memory = true\n");
    struct rx_err err = { 0 };
    float *dx, *dw, *dxs, *dys, *dout;
    int32_t *dids, *doff, *drow, *dsrc;
    cr_assert_eq (K->alloc (be, sizeof hx, 0, (void **) &dx, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof hw, 0, (void **) &dw, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof xs, 0, (void **) &dxs, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof ys, 0, (void **) &dys, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof got, 0, (void **) &dout, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof hids, 0, (void **) &dids, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof off, 0, (void **) &doff, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof row, 0, (void **) &drow, &err), RX_OK);
    cr_assert_eq (K->alloc (be, sizeof src, 0, (void **) &dsrc, &err), RX_OK);
    cr_assert_eq (K->copy_h2d (be, NULL, dx, hx, sizeof hx, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, dw, hw, sizeof hw, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, dids, hids, sizeof hids, &err), RX_OK, "%s", err.msg);
    s_moe_pass (be, hwv, dx, dids, dw, doff, drow, dsrc, dxs, dys, dout);
    cr_assert_eq (K->copy_d2h (be, NULL, got, dout, sizeof got, &err), RX_OK, "%s", err.msg);
    cr_assert (memcmp (got, want, sizeof got) == 0, "guarded MoE pass differs from unguarded");
    int nonzero = 0;
    for (int i = 0; i < T * OUT; i++) nonzero += got[i] != 0.f;
    cr_assert_gt (nonzero, T * OUT / 2, "the pass computed something");
    /* host arrays handed to the ops */
    cr_assert_eq (K->moe_sort (be, NULL, hids, T, KK, NE, doff, drow, dsrc, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "moe_sort") && strstr (err.msg, "ids = "), "%s", err.msg);
    cr_assert_eq (K->gather_rows (be, NULL, dx, IN, src, NR, IN, dxs, IN, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "gather_rows") && strstr (err.msg, "not device memory"), "%s", err.msg);
    cr_assert_eq (K->moe_combine (be, NULL, dys, OUT, drow, dw, T, KK, OUT, got, OUT, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "moe_combine") && strstr (err.msg, "out = "), "%s", err.msg);
    K->destroy (be);
}

/* The low-latency exchange of kernel ABI 1.4 (moe_ll_pack, moe_ll_unpack)
 * reads the routing and the headers inside the ops: guarded it gives what
 * the unguarded instance gives on host memory, and a host array handed to
 * either is refused. */
enum { LT = 4, LKK = 2, LNE = 5, LNR = 2, LS = 8, LH = 1, LD = 4, LB = LH + LS };

static void s_ll_pass (void *be, const float *x, const int32_t *ids, int32_t *off, int32_t *row,
                       int32_t *src, float *send, int32_t *slot, int32_t *loff, int32_t *order,
                       int32_t *back)
{
    struct rx_err err = { 0 };
    cr_assert_eq (K->moe_sort (be, NULL, ids, LT, LKK, LNE, off, row, src, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->memset_ (be, NULL, send, 0, LNR * LB * LD * sizeof (float), &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->moe_ll_pack (be, NULL, x, LD, ids, off, row, src, LT, LKK, LNE, LNR, LS, LH, LD, send,
                                  slot, &err), RX_OK, "%s", err.msg);
    /* rank 0 owns experts 0 and 1 (first(1) = 5 / 2 = 2) */
    cr_assert_eq (K->moe_ll_unpack (be, NULL, send, LNR, LS, LH, LD, 2, loff, order, back, &err), RX_OK,
                  "%s", err.msg);
}

Test (kguard, moe_ll_ops_work_guarded)
{
    float hx[LT * LD], hsend[LNR * LB * LD];
    int32_t hids[LT * LKK] = { 0, 4, 1, 0, 3, 2, -1, 1 };
    int32_t off[LNE + 1], row[LT * LKK], src[LT * LKK], slot[LT * LKK], loff[3], order[LNR * LS],
            back[LNR * LB];
    for (int i = 0; i < LT * LD; i++) hx[i] = (float) ((i * 5) % 13) * 0.5f - 3.f;
    void *be = s_create (NULL);
    s_ll_pass (be, hx, hids, off, row, src, hsend, slot, loff, order, back);
    K->destroy (be);
    int32_t want[LT * LKK + 3 + LNR * LS + LNR * LB], got[sizeof want / sizeof want[0]];
    float gsend[LNR * LB * LD];
    memcpy (want, slot, sizeof slot);
    memcpy (want + LT * LKK, loff, sizeof loff);
    memcpy (want + LT * LKK + 3, order, sizeof order);
    memcpy (want + LT * LKK + 3 + LNR * LS, back, sizeof back);
    /* send read back as recv: block 0 counts experts 0, 1 (2 + 2), block 1
     * experts 2, 3 (1 + 1) as if they were rank 0's */
    cr_assert_eq (loff[2], 6, "routed rows %d", loff[2]);

    be = s_create ("guard_device_memory = true\n");
    struct rx_err err = { 0 };
    void *d[10];
    const size_t sz[10] = { sizeof hx, sizeof hids, sizeof off, sizeof row, sizeof src, sizeof hsend,
                            sizeof slot, sizeof loff, sizeof order, sizeof back };
    for (int i = 0; i < 10; i++) cr_assert_eq (K->alloc (be, sz[i], 0, &d[i], &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, d[0], hx, sizeof hx, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_h2d (be, NULL, d[1], hids, sizeof hids, &err), RX_OK, "%s", err.msg);
    s_ll_pass (be, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9]);
    cr_assert_eq (K->copy_d2h (be, NULL, gsend, d[5], sizeof gsend, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, got, d[6], sizeof slot, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, got + LT * LKK, d[7], sizeof loff, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, got + LT * LKK + 3, d[8], sizeof order, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (K->copy_d2h (be, NULL, got + LT * LKK + 3 + LNR * LS, d[9], sizeof back, &err), RX_OK, "%s",
                  err.msg);
    cr_assert (memcmp (gsend, hsend, sizeof gsend) == 0, "guarded pack differs from unguarded");
    cr_assert (memcmp (got, want, sizeof got) == 0, "guarded slot_of / unpack differ from unguarded");
    /* host arrays handed to the ops */
    cr_assert_eq (K->moe_ll_pack (be, NULL, d[0], LD, hids, d[2], d[3], d[4], LT, LKK, LNE, LNR, LS, LH, LD,
                                  d[5], d[6], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "moe_ll_pack") && strstr (err.msg, "ids = "), "%s", err.msg);
    cr_assert_eq (K->moe_ll_pack (be, NULL, d[0], LD, d[1], d[2], d[3], d[4], LT, LKK, LNE, LNR, LS, LH, LD,
                                  hsend, d[6], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "moe_ll_pack") && strstr (err.msg, "send = "), "%s", err.msg);
    cr_assert_eq (K->moe_ll_unpack (be, NULL, hsend, LNR, LS, LH, LD, 2, d[7], d[8], d[9], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "moe_ll_unpack") && strstr (err.msg, "recv = "), "%s", err.msg);
    cr_assert_eq (K->moe_ll_unpack (be, NULL, d[5], LNR, LS, LH, LD, 2, d[7], order, d[9], &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "moe_ll_unpack") && strstr (err.msg, "not device memory"), "%s", err.msg);
    for (int i = 0; i < 10; i++) K->free_ (be, d[i]);
    K->destroy (be);
}

/* Off (the default): host-visible, a host read works. */
Test (kguard, unguarded_is_host_visible)
{
    unsetenv ("RADIX_KCPU_GUARD");
    void *be = s_create (NULL);
    struct rx_kernels_info info = { .struct_size = sizeof info };
    cr_assert_eq (K->info (be, &info), RX_OK);
    cr_assert (info.caps & RX_KCAP_HOST_VISIBLE);
    float *d;
    struct rx_err err = { 0 };
    cr_assert_eq (K->alloc (be, 64, 0, (void **) &d, &err), RX_OK, "%s", err.msg);
    d[0] = 2.f;
    cr_assert_eq (d[0], 2.f);
    K->destroy (be);
}

/* RADIX_KCPU_GUARD=1 turns it on without the key (how tests/guard.sh runs
 * the model tests); "0" does not. */
Test (kguard, environment_switch)
{
    setenv ("RADIX_KCPU_GUARD", "1", 1);
    void *be = s_create (NULL);
    struct rx_kernels_info info = { .struct_size = sizeof info };
    cr_assert_eq (K->info (be, &info), RX_OK);
    cr_assert_not (info.caps & RX_KCAP_HOST_VISIBLE);
    K->destroy (be);
    setenv ("RADIX_KCPU_GUARD", "0", 1);
    be = s_create (NULL);
    cr_assert_eq (K->info (be, &info), RX_OK);
    cr_assert (info.caps & RX_KCAP_HOST_VISIBLE);
    K->destroy (be);
    unsetenv ("RADIX_KCPU_GUARD");
}

/* ============================================================== devices -- */

TestSuite (device, .init = s_load, .fini = s_unload);

Test (device, pick_by_rank)
{
    struct rx_kernels_params p = { .struct_size = sizeof p, .device = RX_KDEVICE_AUTO };
    for (int32_t r = 0; r < 4; r++) {
        p.rank = r;
        cr_assert_eq (rx_kernels_pick_device (&p, 2), r % 2, "rank %d of 2 devices", r);
        cr_assert_eq (rx_kernels_pick_device (&p, 4), r, "rank %d of 4 devices", r);
        cr_assert_eq (rx_kernels_pick_device (&p, 1), 0);
        cr_assert_eq (rx_kernels_pick_device (&p, 8), r);
    }
    p.rank = 5;
    cr_assert_eq (rx_kernels_pick_device (&p, 3), 2);
    cr_assert_eq (rx_kernels_pick_device (&p, 0), 0, "no devices: 0 (create reports it)");
    p.device = 1;
    cr_assert_eq (rx_kernels_pick_device (&p, 4), 1, "explicit device for every rank");
    cr_assert_eq (rx_kernels_pick_device (&p, 1), 1, "explicit: the backend checks it exists");
    /* A caller built before the rank member: auto = device 0. */
    p.device = RX_KDEVICE_AUTO;
    p.struct_size = (uint32_t) offsetof (struct rx_kernels_params, rank);
    cr_assert_eq (rx_kernels_pick_device (&p, 4), 0);
    cr_assert_eq (rx_kernels_pick_device (NULL, 4), 0);
}

static rx_conf_t *s_ini (const char *text)
{
    struct rx_err e = { 0 };
    rx_conf_t *c = rx_conf_parse_string (text, strlen (text), "t.ini", &e);
    cr_assert_not_null (c, "%s", e.msg);
    return c;
}

Test (device, engine_params_from_the_ini)
{
    struct rx_err err = { 0 };
    struct rx_kernels_params kp;
    rx_conf_t *c = s_ini ("[kernels]\nbackend = cpu\n");
    for (int32_t r = 0; r < 4; r++) {
        cr_assert_eq (rx_engine_kernels_params (c, r, &kp, &err), RX_OK, "%s", err.msg);
        cr_assert_eq (kp.struct_size, sizeof kp);
        cr_assert_eq (kp.device, RX_KDEVICE_AUTO);
        cr_assert_eq (kp.rank, r);
        cr_assert_eq (kp.threads, 0);
        cr_assert_eq (rx_kernels_pick_device (&kp, 2), r % 2);
    }
    rx_conf_destroy (&c);
    c = s_ini ("[kernels]\ndevice = 2\n");
    cr_assert_eq (rx_engine_kernels_params (c, 3, &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (kp.device, 2);
    cr_assert_eq (rx_kernels_pick_device (&kp, 4), 2);
    rx_conf_destroy (&c);
    c = s_ini ("[kernels]\ndevice = auto\n");
    cr_assert_eq (rx_engine_kernels_params (c, 1, &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (kp.device, RX_KDEVICE_AUTO);
    rx_conf_destroy (&c);
    static const char *const bad[] = { "-1", "gpu0", "2x", "99999" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char t[64];
        snprintf (t, sizeof t, "[kernels]\ndevice = %s\n", bad[i]);
        c = s_ini (t);
        cr_assert_eq (rx_engine_kernels_params (c, 0, &kp, &err), RX_ECONFIG, "%s", bad[i]);
        cr_assert (strstr (err.msg, "[kernels] device") && strstr (err.msg, bad[i]), "%s", err.msg);
        rx_conf_destroy (&c);
    }
    cr_assert_eq (rx_engine_kernels_params (NULL, 0, NULL, &err), RX_EINVAL);
}

/* kernels-cpu takes auto for any rank, and only device 0. */
Test (device, cpu_backend_accepts_auto_for_every_rank)
{
    struct rx_err err = { 0 };
    int rc;
    for (int32_t r = 0; r < 4; r++) {
        struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 1,
                                       .device = RX_KDEVICE_AUTO, .rank = r };
        void *be = s_create_p (NULL, &p, &rc, &err);
        cr_assert_eq (rc, RX_OK, "rank %d: %s", r, err.msg);
        struct rx_kernels_info info = { .struct_size = sizeof info };
        cr_assert_eq (K->info (be, &info), RX_OK);
        cr_assert_eq (info.device_index, 0);
        K->destroy (be);
    }
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 1, .device = 1 };
    cr_assert_null (s_create_p (NULL, &p, &rc, &err));
    cr_assert_eq (rc, RX_EINVAL);
    cr_assert (strstr (err.msg, "device 1"), "%s", err.msg);
}

/* The engine's view: ranks 0..3 (dp_rank here; tp_rank takes a group)
 * reach create() as rank r with device auto, or the explicit device.
 * kernels-cpu logs what it got at debug level. */
static char *s_engine_log (const char *ini, int32_t dp_rank)
{
    TU_REQUIRE_SHARED ();
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    char *dir = tu_tmpdir ();
    char *ipath = tu_path (dir, "t.ini"), *lpath = tu_path (dir, "log.txt");
    char text[512];
    snprintf (text, sizeof text, "[kernels]\nthreads = 1\n%s", ini);
    tu_write (ipath, text);
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&b, ipath, 0, &err), RX_OK, "%s", err.msg);
    int lvl = rx_log_get_level ();
    cr_assert_eq (rx_log_set_file (lpath), 0);
    rx_log_set_level (RX_LOG_DEBUG);
    char *model = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf");
    struct rx_engine_opts o = { .model_path = model, .n_slots = 64, .dp_rank = dp_rank };
    rx_engine_t *e = rx_engine_new (&b, &o, &err);
    rx_log_set_level (lvl);
    rx_log_set_file (NULL);
    cr_assert_not_null (e, "%s", err.msg);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    FILE *f = fopen (lpath, "r");
    cr_assert_not_null (f);
    char *log = tu_slurp_fd (fileno (f));
    fclose (f);
    unlink (lpath);
    unlink (ipath);
    rmdir (dir);
    free (model);
    free (ipath);
    free (lpath);
    free (dir);
    return log;
}

Test (device, engine_passes_the_rank_to_create)
{
    for (int32_t r = 0; r < 4; r++) {
        char *log = s_engine_log ("", r);
        char want[64];
        snprintf (want, sizeof want, "create: rank %d, device auto -> 0", r);
        cr_assert (strstr (log, want), "rank %d: no \"%s\" in the log:\n%s", r, want, log);
        free (log);
    }
    char *log = s_engine_log ("device = 0\n", 3);
    cr_assert (strstr (log, "create: rank 3, device 0 -> 0"), "%s", log);
    free (log);
}

/* ============================================================ KV sizing -- */

TestSuite (kvsize);

Test (kvsize, share_spec)
{
    double s = 0;
    cr_assert_eq (rx_engine_kv_share ("0.8", &s), 1);
    cr_assert_float_eq (s, 0.8, 1e-12);
    cr_assert_eq (rx_engine_kv_share (" 50 % ", &s), 1);
    cr_assert_float_eq (s, 0.5, 1e-12);
    cr_assert_eq (rx_engine_kv_share ("1.0", &s), 1);
    cr_assert_float_eq (s, 1.0, 1e-12);
    cr_assert_eq (rx_engine_kv_share ("100%", &s), 1);
    cr_assert_float_eq (s, 1.0, 1e-12);
    static const char *const no[] = { "1", "8GiB", "512MiB", "0", "0.0", "1.5", "150%", "0%",
                                      "-0.5", "abc", "", "0.8x", "nan", NULL };
    for (const char *const *p = no; *p; p++) {
        s = -1;
        cr_assert_eq (rx_engine_kv_share (*p, &s), 0, "\"%s\" is not a share", *p);
        cr_assert_eq (s, -1, "\"%s\" left *share alone", *p);
    }
    cr_assert_eq (rx_engine_kv_share (NULL, &s), 0);
}

Test (kvsize, device_arithmetic)
{
    const uint64_t G = 1ull << 30;
    /* One rank, one device: 80% of 10 GiB free. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.8, 10 * G, 1, 1, 0), (uint64_t) (10 * G * 0.8));
    /* Four ranks spread over four devices (auto): each gets its own 80%. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.8, 10 * G, 4, 4, 0), 8 * G);
    /* Four ranks on two devices: two per device. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.8, 10 * G, 4, 2, 0), 4 * G);
    /* Three ranks on two devices: up to two share one. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.5, 8 * G, 3, 2, 0), 2 * G);
    /* Every rank on one explicit device: all four share it. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.8, 10 * G, 4, 8, 1), 2 * G);
    /* More devices than ranks. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.5, 8 * G, 2, 8, 0), 4 * G);
    /* Unknown free memory, no share, no ranks given. */
    cr_assert_eq (rx_engine_kv_device_bytes (0.8, 0, 1, 1, 0), 0);
    cr_assert_eq (rx_engine_kv_device_bytes (0.0, 10 * G, 1, 1, 0), 0);
    cr_assert_eq (rx_engine_kv_device_bytes (0.5, 8 * G, 0, 0, 0), 4 * G);
}

static uint64_t s_mem_available (void)
{
    FILE *f = fopen ("/proc/meminfo", "r");
    cr_assert_not_null (f);
    char line[256];
    unsigned long long kb = 0;
    while (fgets (line, sizeof line, f))
        if (sscanf (line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose (f);
    cr_assert_gt (kb, 0);
    return (uint64_t) kb * 1024;
}

/* n_slots of tiny-llama with kv_bytes and kv_share from the caller (as
 * the scheduler passes them); *bpt: its KV bytes per token. */
static int64_t s_engine_slots (const char *ini, uint64_t kv_bytes, double share, uint64_t *bpt)
{
    TU_REQUIRE_SHARED ();
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    char *dir = tu_tmpdir ();
    char *ipath = tu_path (dir, "t.ini");
    tu_write (ipath, ini);
    struct rx_boot b;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_boot_open (&b, ipath, 0, &err), RX_OK, "%s", err.msg);
    char *model = tu_path (tu_env ("RADIX_SHARED"), "data/models/tiny-llama.gguf");
    struct rx_engine_opts o = { .model_path = model, .kv_bytes = kv_bytes, .local_ranks = 1,
                                .kv_share = share };
    rx_engine_t *e = rx_engine_new (&b, &o, &err);
    cr_assert_not_null (e, "%s", err.msg);
    int64_t n = rx_engine_n_slots (e);
    *bpt = rx_engine_info (e)->kv_bytes_per_token;
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    unlink (ipath);
    rmdir (dir);
    free (ipath);
    free (model);
    free (dir);
    return n;
}

/* A backend that is not host-visible (kernels-cpu guarded stands in for a
 * GPU: its free memory is MemAvailable) gets the share of ITS free memory
 * after the weights, not the caller's host-based kv_bytes; a host-visible
 * one keeps the caller's. */
Test (kvsize, engine_sizes_from_device_free_memory)
{
    const uint64_t caller = 1ull << 20;   /* what the scheduler computed */
    uint64_t bpt;
    int64_t host = s_engine_slots ("[kernels]\nthreads = 1\n", caller, 1e-4, &bpt);
    cr_assert_eq (host, (int64_t) (caller / bpt), "host-visible: the caller's kv_bytes");
    uint64_t m0 = s_mem_available ();
    int64_t dev = s_engine_slots ("[kernels]\nthreads = 1\n[kernels.cpu]\nguard_device_memory = true\n",
                                  caller, 1e-4, &bpt);
    uint64_t m1 = s_mem_available ();
    double lo = (double) (m0 < m1 ? m0 : m1) * 1e-4 / (double) bpt * 0.8;
    double hi = (double) (m0 > m1 ? m0 : m1) * 1e-4 / (double) bpt * 1.2;
    cr_assert ((double) dev >= lo && (double) dev <= hi,
               "device path: %lld slots, want 0.01%% of free memory / %llu B: %.0f..%.0f",
               (long long) dev, (unsigned long long) bpt, lo, hi);
    cr_assert_neq (dev, host);
    /* A size (no share) is used as given, device or not. */
    int64_t sized = s_engine_slots ("[kernels]\nthreads = 1\n[kernels.cpu]\nguard_device_memory = true\n",
                                    caller, 0, &bpt);
    cr_assert_eq (sized, (int64_t) (caller / bpt));
}

/* ================================================ comm plugins, guarded -- */

/* Every collective of a comm plugin on buffers of a guarded kernels-cpu
 * (device memory the host may not touch), 2 forked ranks: the plugin must
 * move them with the backend's copies (comm-shm, comm-zmq stage them). */
static const struct rx_comm_ops *C;
static const struct rx_host *s_chost;

#define CK(cond, ...)                                                          \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf (stderr, "rank %d: line %d: %s: ", rank, __LINE__, #cond); \
            fprintf (stderr, __VA_ARGS__);                                     \
            fputc ('\n', stderr);                                              \
            _exit (1);                                                         \
        }                                                                      \
    } while (0)

/* Device buffer of n floats holding h. */
static float *s_dev (void *be, const float *h, size_t n, int rank)
{
    float *d;
    struct rx_err err = { 0 };
    CK (K->alloc (be, n * sizeof *d, 0, (void **) &d, &err) == RX_OK, "%s", err.msg);
    if (h) CK (K->copy_h2d (be, NULL, d, h, n * sizeof *d, &err) == RX_OK, "%s", err.msg);
    else CK (K->memset_ (be, NULL, d, 0, n * sizeof *d, &err) == RX_OK, "%s", err.msg);
    return d;
}

static void s_back (void *be, float *h, const float *d, size_t n, int rank)
{
    struct rx_err err = { 0 };
    CK (K->copy_d2h (be, NULL, h, d, n * sizeof *h, &err) == RX_OK, "%s", err.msg);
}

static int s_comm_rank (int rank, const char *group, const char *ep)
{
    enum { N = 1000, P = 2 };
    void *be = s_create ("guard_device_memory = true\n");
    struct rx_comm_params p = { .struct_size = sizeof p, .rank = rank, .n_rank = P, .group = group,
                                .bootstrap = ep, .timeout_s = 30, .kops = K, .kbe = be };
    struct rx_err err = { 0 };
    void *cm = NULL;
    CK (C->create (s_chost, &p, &cm, &err) == RX_OK, "create: %s", err.msg);
    static float h[P * N], g[P * N];
    /* all_reduce (sum), in place */
    for (int i = 0; i < N; i++) h[i] = (float) (rank * 1000 + i);
    float *d = s_dev (be, h, N, rank);
    CK (C->all_reduce (cm, NULL, d, d, N, RX_F32, RX_COMM_SUM, &err) == RX_OK, "%s", err.msg);
    s_back (be, g, d, N, rank);
    for (int i = 0; i < N; i++) CK (g[i] == (float) (1000 + 2 * i), "all_reduce[%d] = %g", i, g[i]);
    /* all_gather */
    float *r = s_dev (be, NULL, P * N, rank);
    CK (C->all_gather (cm, NULL, d, r, N, RX_F32, &err) == RX_OK, "%s", err.msg);
    s_back (be, g, r, P * N, rank);
    for (int q = 0; q < P; q++)
        for (int i = 0; i < N; i++)
            CK (g[q * N + i] == (float) (1000 + 2 * i), "all_gather[%d][%d] = %g", q, i, g[q * N + i]);
    /* reduce_scatter (sum): block b of rank q is q + 10 b + i */
    for (int b = 0; b < P; b++)
        for (int i = 0; i < N; i++) h[b * N + i] = (float) (rank + 10 * b + i);
    float *s2 = s_dev (be, h, P * N, rank), *o2 = s_dev (be, NULL, N, rank);
    CK (C->reduce_scatter (cm, NULL, s2, o2, N, RX_F32, RX_COMM_SUM, &err) == RX_OK, "%s", err.msg);
    s_back (be, g, o2, N, rank);
    for (int i = 0; i < N; i++)
        CK (g[i] == (float) (1 + 2 * (10 * rank + i)), "reduce_scatter[%d] = %g", i, g[i]);
    /* broadcast from rank 1 */
    for (int i = 0; i < N; i++) h[i] = rank == 1 ? (float) (7 + i) : -1.f;
    float *bc = s_dev (be, h, N, rank);
    CK (C->broadcast (cm, NULL, bc, N, RX_F32, 1, &err) == RX_OK, "%s", err.msg);
    s_back (be, g, bc, N, rank);
    for (int i = 0; i < N; i++) CK (g[i] == (float) (7 + i), "broadcast[%d] = %g", i, g[i]);
    /* all_to_all_v: rank q sends 1 + q + 2 p elements 100 q + 10 p + j to p */
    size_t sc[P], sd[P], rc[P], rd[P], so = 0, ro = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = (size_t) (1 + rank + 2 * q);
        sd[q] = so;
        so += sc[q];
        rc[q] = (size_t) (1 + q + 2 * rank);
        rd[q] = ro + 1;   /* a gap the op must leave alone */
        ro += rc[q] + 1;
    }
    for (int q = 0; q < P; q++)
        for (size_t j = 0; j < sc[q]; j++) h[sd[q] + j] = (float) (100 * rank + 10 * q + (int) j);
    float *as = s_dev (be, h, so, rank);
    for (size_t i = 0; i < ro; i++) h[i] = -5.f;
    float *ar = s_dev (be, h, ro, rank);
    CK (C->all_to_all_v (cm, NULL, as, sc, sd, ar, rc, rd, RX_F32, &err) == RX_OK, "%s", err.msg);
    s_back (be, g, ar, ro, rank);
    for (int q = 0; q < P; q++) {
        CK (g[rd[q] - 1] == -5.f, "all_to_all_v wrote the gap before %d", q);
        for (size_t j = 0; j < rc[q]; j++)
            CK (g[rd[q] + j] == (float) (100 * q + 10 * rank + (int) j), "all_to_all_v from %d [%zu] = %g",
                q, j, g[rd[q] + j]);
    }
    CK (C->barrier (cm, NULL, &err) == RX_OK, "%s", err.msg);
    C->destroy (cm);
    K->destroy (be);
    return 0;
}

static void s_comm_guarded (const char *name)
{
    rx_plugin_t *cp;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_loader_find (s_loader, RX_KIND_COMM, name, &cp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (cp, NULL, &err), RX_OK, "%s", err.msg);
    C = rx_plugin_ops (cp);
    s_chost = rx_plugin_host (cp);
    char group[64], ep[128];
    snprintf (group, sizeof group, "guard%d%s", (int) getpid (), name);
    snprintf (ep, sizeof ep, "ipc:///tmp/rx-guard-%d-%s", (int) getpid (), name);
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        pid[i] = fork ();
        cr_assert_geq (pid[i], 0);
        if (pid[i] == 0) {
            alarm (60);
            _exit (s_comm_rank (i, group, ep));
        }
    }
    for (int i = 0; i < 2; i++) {
        int st;
        cr_assert_eq (waitpid (pid[i], &st, 0), pid[i]);
        cr_expect (WIFEXITED (st) && WEXITSTATUS (st) == 0, "comm-%s rank %d: status %d (%s)", name,
                   i, st, WIFSIGNALED (st) ? strsignal (WTERMSIG (st)) : "exit");
    }
    unlink (ep + 6);
}

TestSuite (commguard, .init = s_load, .fini = s_unload);

Test (commguard, shm_every_collective_on_device_buffers, .timeout = 60) { s_comm_guarded ("shm"); }
Test (commguard, zmq_every_collective_on_device_buffers, .timeout = 60) { s_comm_guarded ("zmq"); }
