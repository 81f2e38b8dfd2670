/* tests/unit/test_moe.c -- moe-local.so (radix/moe.h) loaded through the
 * real loader, on kernels-cpu: dispatch groups the rows by expert (offsets,
 * routed.x), the test plays the experts (a known function per expert), and
 * combine must equal a naive reference sum over the k choices; edge cases
 * (no tokens, one token, every token to one expert, too many tokens) and
 * bad configs.  Device buffers are only touched through the copy ops. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <radix/kernel.h>
#include <radix/moe.h>

#include "loader.h"
#include "../testutil.h"

struct env {
    rx_loader_t *l;
    const struct rx_kernels_ops *K;
    void *be;
    const struct rx_moe_ops *M;
    const struct rx_host *mh;
};

static void s_open (struct env *e)
{
    struct rx_err err = { 0 };
    memset (e, 0, sizeof *e);
    e->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (e->l, "%s", err.msg);
    rx_plugin_t *kp, *mp;
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_KERNELS, "cpu", &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (kp, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_MOE, "local", &mp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (mp, NULL, &err), RX_OK, "%s", err.msg);
    e->K = rx_plugin_ops (kp);
    e->M = rx_plugin_ops (mp);
    e->mh = rx_plugin_host (mp);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 1 };
    cr_assert_eq (e->K->create (rx_plugin_host (kp), &p, &e->be, &err), RX_OK, "%s", err.msg);
}

static void s_close (struct env *e)
{
    e->K->destroy (e->be);
    rx_loader_destroy (&e->l);
}

static struct rx_moe_config s_cfg (struct env *e, int n_expert, int k, int n_embd, int max_tokens)
{
    return (struct rx_moe_config) {
        .struct_size = sizeof (struct rx_moe_config), .n_expert = n_expert, .n_expert_used = k,
        .n_embd = n_embd, .max_tokens = max_tokens, .ep_rank = 0, .ep_size = 1,
        .kops = e->K, .kbe = e->be,
    };
}

static void *s_dev (struct env *e, size_t bytes, const void *host)
{
    void *d;
    struct rx_err err = { 0 };
    cr_assert_eq (e->K->alloc (e->be, bytes ? bytes : 4, 0, &d, &err), RX_OK, "%s", err.msg);
    if (host && bytes) cr_assert_eq (e->K->copy_h2d (e->be, NULL, d, host, bytes, &err), RX_OK, "%s", err.msg);
    return d;
}

static void s_get (struct env *e, void *host, const void *dev, size_t bytes)
{
    struct rx_err err = { 0 };
    if (!bytes) return;
    cr_assert_eq (e->K->copy_d2h (e->be, NULL, host, dev, bytes, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e->K->synchronize (e->be, NULL, &err), RX_OK, "%s", err.msg);
}

/* The experts the test plays: expert e maps a row to x * (e + 1) + 0.25 e. */
static float s_expert (int e, float x) { return x * (float) (e + 1) + 0.25f * (float) e; }

static uint64_t s_rng = 88172645463325252ull;
static uint32_t s_rand (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t) (s_rng >> 16);
}

/* One full round: dispatch n_tok tokens routed by ids/w (host arrays,
 * [n_tok][k]), check routed against a naive grouping, run the experts,
 * combine (with `accumulate` onto a known out) and compare with the naive
 * reference. */
static void s_round (struct env *e, void *moe, int n_expert, int k, int E, int n_tok,
                     const int32_t *ids, const float *w, int accumulate)
{
    struct rx_err err = { 0 };
    const size_t ldx = (size_t) E + 5, ldo = (size_t) E + 3;
    float *x = malloc ((size_t) (n_tok ? n_tok : 1) * ldx * sizeof *x);
    for (size_t i = 0; i < (size_t) n_tok * ldx; i++) x[i] = (float) ((int) (s_rand () % 2001) - 1000) / 500.0f;
    float *dx = s_dev (e, (size_t) n_tok * ldx * sizeof *x, x);
    int32_t *dids = s_dev (e, (size_t) n_tok * k * sizeof *ids, ids);
    float *dw = s_dev (e, (size_t) n_tok * k * sizeof *w, w);

    struct rx_moe_routed r = { .struct_size = sizeof r };
    cr_assert_eq (e->M->dispatch (moe, dx, ldx, n_tok, dids, dw, &r, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.first_expert, 0);
    cr_assert_eq (r.n_local_expert, n_expert);
    cr_assert_eq (r.offsets[0], 0);
    cr_assert_eq (r.n_rows, n_tok * k);
    cr_assert_eq (r.offsets[n_expert], r.n_rows);
    /* Naive grouping: expert e's rows are the tokens choosing it, in token order. */
    float *rx = malloc ((size_t) (r.n_rows ? r.n_rows : 1) * E * sizeof *rx);
    s_get (e, rx, r.x, (size_t) r.n_rows * E * sizeof *rx);
    for (int ex = 0; ex < n_expert; ex++) {
        int row = r.offsets[ex];
        for (int t = 0; t < n_tok; t++)
            for (int j = 0; j < k; j++) {
                if (ids[t * k + j] != ex) continue;
                cr_assert_lt (row, r.offsets[ex + 1], "expert %d has too few rows", ex);
                cr_assert_eq (memcmp (rx + (size_t) row * E, x + (size_t) t * ldx, (size_t) E * sizeof *x), 0,
                              "expert %d row %d is not token %d", ex, row, t);
                row++;
            }
        cr_assert_eq (row, r.offsets[ex + 1], "expert %d: %d rows, offsets say %d", ex,
                      row - r.offsets[ex], r.offsets[ex + 1] - r.offsets[ex]);
    }
    /* Play the experts into routed.y. */
    for (int ex = 0; ex < n_expert; ex++)
        for (int row = r.offsets[ex]; row < r.offsets[ex + 1]; row++)
            for (int c = 0; c < E; c++)
                rx[(size_t) row * E + c] = s_expert (ex, rx[(size_t) row * E + c]);
    if (r.n_rows)
        cr_assert_eq (e->K->copy_h2d (e->be, NULL, r.y, rx, (size_t) r.n_rows * E * sizeof *rx, &err), RX_OK);

    float *out = malloc ((size_t) (n_tok ? n_tok : 1) * ldo * sizeof *out);
    for (size_t i = 0; i < (size_t) n_tok * ldo; i++) out[i] = (float) i * 0.001f - 3.0f;
    float *dout = s_dev (e, (size_t) n_tok * ldo * sizeof *out, out);
    cr_assert_eq (e->M->combine (moe, dout, ldo, accumulate ? RX_MM_ACCUMULATE : 0, &err), RX_OK, "%s", err.msg);
    float *got = malloc ((size_t) (n_tok ? n_tok : 1) * ldo * sizeof *got);
    s_get (e, got, dout, (size_t) n_tok * ldo * sizeof *got);
    for (int t = 0; t < n_tok; t++) {
        for (int c = 0; c < (int) ldo; c++) {
            float before = out[(size_t) t * ldo + c], g = got[(size_t) t * ldo + c];
            if (c >= E) {   /* the padding columns are left alone */
                cr_assert_eq (g, before, "token %d padding column %d changed", t, c);
                continue;
            }
            float xv = x[(size_t) t * ldx + c];
            double ref = 0;
            for (int j = 0; j < k; j++) ref += (double) w[t * k + j] * s_expert (ids[t * k + j], xv);
            if (accumulate) ref += before;
            cr_assert (fabs (g - ref) <= 1e-5 * (1 + fabs (ref)), "token %d col %d: %.7g, reference %.7g",
                       t, c, (double) g, ref);
        }
    }
    free (got);
    free (out);
    free (rx);
    free (x);
    e->K->free_ (e->be, dout);
    e->K->free_ (e->be, dx);
    e->K->free_ (e->be, dids);
    e->K->free_ (e->be, dw);
}

/* Random distinct top-k ids and positive weights summing to 1. */
static void s_random_routing (int n_expert, int k, int n_tok, int32_t *ids, float *w)
{
    for (int t = 0; t < n_tok; t++) {
        float s = 0;
        for (int j = 0; j < k; j++) {
            int32_t id;
            int dup;
            do {
                id = (int32_t) (s_rand () % (uint32_t) n_expert);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == id;
            } while (dup);
            ids[t * k + j] = id;
            w[t * k + j] = 0.05f + (float) (s_rand () % 1000) / 1000.0f;
            s += w[t * k + j];
        }
        for (int j = 0; j < k; j++) w[t * k + j] /= s;
    }
}

Test (moe_local, random_routing_matches_naive_reference)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    const int NE = 8, k = 3, E = 24, T = 40;
    struct rx_moe_config c = s_cfg (&e, NE, k, E, T);
    void *moe;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    int32_t ids[40 * 3];
    float w[40 * 3];
    /* Several rounds on one instance, of varying sizes, = and +=. */
    const int sizes[] = { 37, 40, 5, 12 };
    for (int i = 0; i < 4; i++) {
        s_random_routing (NE, k, sizes[i], ids, w);
        s_round (&e, moe, NE, k, E, sizes[i], ids, w, i % 2);
    }
    e.M->destroy (moe);
    s_close (&e);
}

Test (moe_local, every_token_to_one_expert)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    const int NE = 4, k = 1, E = 16, T = 9;
    struct rx_moe_config c = s_cfg (&e, NE, k, E, T);
    void *moe;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    int32_t ids[9];
    float w[9];
    for (int t = 0; t < T; t++) { ids[t] = 2; w[t] = 0.5f + 0.1f * (float) t; }
    s_round (&e, moe, NE, k, E, T, ids, w, 0);
    s_round (&e, moe, NE, k, E, T, ids, w, 1);
    /* k = 2 with one expert taking every token's first choice. */
    e.M->destroy (moe);
    c = s_cfg (&e, NE, 2, E, T);
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    int32_t ids2[18];
    float w2[18];
    for (int t = 0; t < T; t++) {
        ids2[2 * t] = 3;
        ids2[2 * t + 1] = t % 3;
        w2[2 * t] = 0.7f;
        w2[2 * t + 1] = 0.3f;
    }
    s_round (&e, moe, NE, 2, E, T, ids2, w2, 0);
    e.M->destroy (moe);
    s_close (&e);
}

Test (moe_local, zero_and_one_token)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    struct rx_moe_config c = s_cfg (&e, 6, 2, 8, 4);
    void *moe;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    /* n_tok 0: NULL inputs are fine, every offset 0, combine is a no-op. */
    struct rx_moe_routed r = { .struct_size = sizeof r };
    cr_assert_eq (e.M->dispatch (moe, NULL, 8, 0, NULL, NULL, &r, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (r.n_rows, 0);
    cr_assert_eq (r.n_local_expert, 6);
    for (int i = 0; i <= 6; i++) cr_assert_eq (r.offsets[i], 0);
    cr_assert_eq (e.M->combine (moe, NULL, 8, 0, &err), RX_OK, "%s", err.msg);
    s_round (&e, moe, 6, 2, 8, 0, NULL, NULL, 0);
    /* n_tok 1 */
    int32_t ids[2] = { 5, 0 };
    float w[2] = { 0.25f, 0.75f };
    s_round (&e, moe, 6, 2, 8, 1, ids, w, 0);
    s_round (&e, moe, 6, 2, 8, 1, ids, w, 1);
    e.M->destroy (moe);
    s_close (&e);
}

Test (moe_local, bad_dispatch_and_combine)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    struct rx_moe_config c = s_cfg (&e, 4, 2, 8, 3);
    void *moe;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_OK, "%s", err.msg);
    float x[4 * 8] = { 0 };
    int32_t ids[8] = { 0, 1, 2, 3, 0, 1, 2, 3 };
    float w[8] = { 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f };
    float *dx = s_dev (&e, sizeof x, x), *dw = s_dev (&e, sizeof w, w);
    int32_t *dids = s_dev (&e, sizeof ids, ids);
    struct rx_moe_routed r = { .struct_size = sizeof r };
    /* combine before any dispatch */
    err = (struct rx_err) { 0 };
    cr_assert_eq (e.M->combine (moe, dx, 8, 0, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "without a successful dispatch"), "%s", err.msg);
    /* more tokens than max_tokens: RX_ERANGE, never an overrun */
    err = (struct rx_err) { 0 };
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 4, dids, dw, &r, &err), RX_ERANGE);
    cr_assert (strstr (err.msg, "max_tokens 3"), "%s", err.msg);
    cr_assert_eq (e.M->dispatch (moe, dx, 8, -1, dids, dw, &r, &err), RX_EINVAL);
    /* a failed dispatch leaves nothing to combine */
    cr_assert_eq (e.M->combine (moe, dx, 8, 0, &err), RX_EINVAL);
    /* ldx < n_embd, NULL x */
    cr_assert_eq (e.M->dispatch (moe, dx, 7, 2, dids, dw, &r, &err), RX_EINVAL);
    cr_assert_eq (e.M->dispatch (moe, NULL, 8, 2, dids, dw, &r, &err), RX_EINVAL);
    /* expert id out of range */
    int32_t bad[4] = { 0, 1, 4, 0 };
    int32_t *dbad = s_dev (&e, sizeof bad, bad);
    err = (struct rx_err) { 0 };
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 2, dbad, dw, &r, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "expert id 4"), "%s", err.msg);
    /* short routed struct */
    struct rx_moe_routed rs = { .struct_size = 8 };
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 2, dids, dw, &rs, &err), RX_EABI);
    /* a good dispatch; combine with bad ldo or flags; a second combine */
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 2, dids, dw, &r, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.M->combine (moe, dx, 4, 0, &err), RX_EINVAL);
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 2, dids, dw, &r, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.M->combine (moe, dx, 8, 0x10, &err), RX_EINVAL);
    cr_assert_eq (e.M->dispatch (moe, dx, 8, 2, dids, dw, &r, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.M->combine (moe, dx, 8, 0, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.M->combine (moe, dx, 8, 0, &err), RX_EINVAL);
    e.K->free_ (e.be, dx);
    e.K->free_ (e.be, dw);
    e.K->free_ (e.be, dids);
    e.K->free_ (e.be, dbad);
    e.M->destroy (moe);
    s_close (&e);
}

Test (moe_local, bad_configs)
{
    struct env e;
    s_open (&e);
    void *moe = (void *) 1;
    struct rx_err err = { 0 };
    struct rx_moe_config c = s_cfg (&e, 4, 2, 8, 16);
    c.ep_size = 2;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "ep_normal") && strstr (err.msg, "ep_size 2"), "%s", err.msg);
    cr_assert_null (moe);
    struct { int ne, k, E, T; } bad[] = {
        { 0, 1, 8, 16 }, { 4, 0, 8, 16 }, { 4, 5, 8, 16 }, { 4, 2, 0, 16 }, { 4, 2, 8, 0 },
        { -3, 2, 8, 16 }, { 4, 2, 8, -1 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = s_cfg (&e, bad[i].ne, bad[i].k, bad[i].E, bad[i].T);
        err = (struct rx_err) { 0 };
        cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EINVAL, "case %zu", i);
        cr_assert (strstr (err.msg, "moe-local: bad config"), "case %zu: %s", i, err.msg);
    }
    c = s_cfg (&e, 4, 2, 8, 16);
    c.kops = NULL;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EINVAL);
    c = s_cfg (&e, 4, 2, 8, 16);
    c.struct_size = 8;
    cr_assert_eq (e.M->create (e.mh, &c, &moe, &err), RX_EABI);
    cr_assert_eq (e.M->create (e.mh, NULL, &moe, &err), RX_EINVAL);
    /* too big for memory: a clean error from the backend's alloc */
    c = s_cfg (&e, 4, 4, 1 << 20, 1 << 24);
    err = (struct rx_err) { 0 };
    cr_assert_neq (e.M->create (e.mh, &c, &moe, &err), RX_OK);
    cr_assert_null (moe);
    cr_assert (err.msg[0]);
    e.M->destroy (NULL);
    s_close (&e);
}

/* RX_MOE_ROUTED_DEVICE (radix/moe.h): with the backend's ABI 1.3 ops
 * moe-local sorts on the device.  Against a second instance on the host
 * path, over the same routing: offsets only on the device (the same as the
 * host's), the same routed rows, and combine's outputs bit for bit equal,
 * = and +=.  A choice outside the experts is left out on the device path
 * (the host path refuses it).  On an ABI 1.0 view of the backend (no such
 * ops) the flag is ignored: host offsets, d_offsets NULL. */
Test (moe_local, device_sort_equals_the_host_path)
{
    struct env e;
    s_open (&e);
    cr_assert (RX_HAS (struct rx_kernels_ops, e.K, moe_combine), "kernels-cpu has the ABI 1.3 MoE ops");
    struct rx_err err = { 0 };
    const int NE = 6, k = 2, E = 20, T = 16;
    struct rx_moe_config c = s_cfg (&e, NE, k, E, T);
    void *moe[2];
    for (int i = 0; i < 2; i++) cr_assert_eq (e.M->create (e.mh, &c, &moe[i], &err), RX_OK, "%s", err.msg);
    int32_t ids[16 * 2];
    float w[16 * 2], x[16 * 20];
    for (int round = 0; round < 3; round++) {
        const int n = round == 2 ? 1 : 13 + round;
        s_random_routing (NE, k, n, ids, w);
        for (int i = 0; i < n * E; i++) x[i] = (float) ((int) (s_rand () % 2001) - 1000) / 300.0f;
        float *dx = s_dev (&e, sizeof x, x);
        int32_t *dids = s_dev (&e, sizeof ids, ids);
        float *dw = s_dev (&e, sizeof w, w);
        struct rx_moe_routed r[2] = { { .struct_size = sizeof r[0], .flags = RX_MOE_ROUTED_DEVICE },
                                      { .struct_size = sizeof r[1] } };
        float got[2][16 * 20];
        for (int i = 0; i < 2; i++) {
            cr_assert_eq (e.M->dispatch (moe[i], dx, E, n, dids, dw, &r[i], &err), RX_OK, "%s", err.msg);
            /* Play expert e on the routed rows: y = 2x + e (host offsets for both). */
            float rows[32 * 20];
            s_get (&e, rows, r[i].x, (size_t) n * k * E * sizeof (float));
            const int32_t *off = r[1].offsets;
            if (i == 0) {
                cr_assert_null (r[0].offsets, "device path: no host offsets");
                cr_assert_not_null (r[0].d_offsets);
                cr_assert_eq (r[0].n_rows, n * k);
                continue;
            }
            cr_assert_null (r[1].d_offsets, "host path: no device offsets");
            int32_t doff[7];
            s_get (&e, doff, r[0].d_offsets, sizeof doff);
            cr_assert (!memcmp (doff, off, sizeof doff), "round %d: device offsets equal the host's", round);
            float rows0[32 * 20];
            s_get (&e, rows0, r[0].x, (size_t) n * k * E * sizeof (float));
            cr_assert (!memcmp (rows0, rows, (size_t) n * k * E * sizeof (float)), "round %d: routed rows", round);
            for (int ex = 0; ex < NE; ex++)
                for (int row = off[ex]; row < off[ex + 1]; row++)
                    for (int col = 0; col < E; col++)
                        rows[row * E + col] = 2.0f * rows[row * E + col] + (float) ex * 0.37f;
            for (int j = 0; j < 2; j++)
                cr_assert_eq (e.K->copy_h2d (e.be, NULL, r[j].y, rows, (size_t) n * k * E * sizeof (float), &err),
                              RX_OK);
        }
        for (int i = 0; i < 2; i++) {
            for (int q = 0; q < n * E; q++) got[i][q] = (float) q * 0.01f;
            float *dout = s_dev (&e, (size_t) n * E * sizeof (float), got[i]);
            cr_assert_eq (e.M->combine (moe[i], dout, E, round == 1 ? RX_MM_ACCUMULATE : 0, &err), RX_OK, "%s",
                          err.msg);
            s_get (&e, got[i], dout, (size_t) n * E * sizeof (float));
            e.K->free_ (e.be, dout);
        }
        cr_assert (!memcmp (got[0], got[1], (size_t) n * E * sizeof (float)), "round %d: combine bit for bit", round);
        e.K->free_ (e.be, dx);
        e.K->free_ (e.be, dids);
        e.K->free_ (e.be, dw);
    }

    /* An id outside the experts: left out on the device, refused on the host. */
    int32_t bad[2] = { 1, NE + 3 };
    float bw[2] = { 0.5f, 0.5f }, bx[20], one[20];
    for (int col = 0; col < E; col++) bx[col] = (float) col;
    float *dx = s_dev (&e, sizeof bx, bx), *dw = s_dev (&e, sizeof bw, bw);
    int32_t *dids = s_dev (&e, sizeof bad, bad);
    struct rx_moe_routed r = { .struct_size = sizeof r, .flags = RX_MOE_ROUTED_DEVICE };
    cr_assert_eq (e.M->dispatch (moe[0], dx, E, 1, dids, dw, &r, &err), RX_OK, "%s", err.msg);
    int32_t doff[7];
    s_get (&e, doff, r.d_offsets, sizeof doff);
    cr_assert_eq (doff[NE], 1, "one valid choice");
    cr_assert_eq (doff[2] - doff[1], 1, "expert 1 has it");
    cr_assert_eq (e.K->copy_h2d (e.be, NULL, r.y, bx, sizeof bx, &err), RX_OK);   /* expert = identity */
    float *dout = s_dev (&e, sizeof one, NULL);
    cr_assert_eq (e.M->combine (moe[0], dout, E, 0, &err), RX_OK, "%s", err.msg);
    s_get (&e, one, dout, sizeof one);
    for (int col = 0; col < E; col++) cr_assert_eq (one[col], 0.5f * (float) col, "column %d: only the valid choice", col);
    struct rx_moe_routed rh = { .struct_size = sizeof rh };
    cr_assert_eq (e.M->dispatch (moe[1], dx, E, 1, dids, dw, &rh, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "expert id 9"), "%s", err.msg);
    for (int i = 0; i < 2; i++) e.M->destroy (moe[i]);

    /* An ABI 1.0 backend: the flag is ignored. */
    struct rx_kernels_ops K10;
    memcpy (&K10, e.K, RX_KERNELS_OPS_SIZE_1_0);
    K10.struct_size = (uint32_t) RX_KERNELS_OPS_SIZE_1_0;
    c.kops = &K10;
    void *m10;
    cr_assert_eq (e.M->create (e.mh, &c, &m10, &err), RX_OK, "%s", err.msg);
    int32_t good[2] = { 1, 4 };
    cr_assert_eq (e.K->copy_h2d (e.be, NULL, dids, good, sizeof good, &err), RX_OK);
    struct rx_moe_routed r10 = { .struct_size = sizeof r10, .flags = RX_MOE_ROUTED_DEVICE };
    cr_assert_eq (e.M->dispatch (m10, dx, E, 1, dids, dw, &r10, &err), RX_OK, "%s", err.msg);
    cr_assert_not_null (r10.offsets, "host offsets");
    cr_assert_null (r10.d_offsets, "no device offsets without the ops");
    cr_assert_eq (r10.offsets[NE], 2);
    cr_assert_eq (e.M->combine (m10, dout, E, 0, &err), RX_OK, "%s", err.msg);
    e.M->destroy (m10);
    e.K->free_ (e.be, dout);
    e.K->free_ (e.be, dx);
    e.K->free_ (e.be, dids);
    e.K->free_ (e.be, dw);
    s_close (&e);
}
