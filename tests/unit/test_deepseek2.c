/* tests/unit/test_deepseek2.c -- attn-mla.so and model-deepseek2.so beyond
 * the reference comparison (which is in test_models_ref.c):
 *   - attn-mla's absorbed form against a naive expanded-K/V attention
 *     computed here on the host from the same random data: prefill, decode,
 *     a mixed batch, two sequences sharing prefix slots, two layers with
 *     different kv_b, F32 and F16 pools;
 *   - backend/KV-kind mismatches refused with a message naming the right
 *     backend (mla refuses per-head K/V, mha refuses latent models, and the
 *     engine with [attention] backend = mha on a deepseek2 file);
 *   - KV bytes per token for tiny-deepseek2 and DeepSeek-V3's shapes;
 *   - bad configs and calls (shapes, missing kv_b, before kv_alloc, tensor
 *     parallelism).
 * Plugins come from RX_PLUGIN_BUILD_DIR through the real loader; device
 * buffers are only touched through the copy ops. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <radix/attn.h>
#include <radix/kernel.h>
#include <radix/model.h>

#include "boot.h"
#include "engine.h"
#include "loader.h"
#include "../testutil.h"

struct env {
    rx_loader_t *l;
    const struct rx_kernels_ops *K;
    void *be;
    const struct rx_host *kh;
    const struct rx_attn_ops *mla, *mha;
    const struct rx_host *mla_h, *mha_h;
};

static void s_open (struct env *e)
{
    struct rx_err err = { 0 };
    memset (e, 0, sizeof *e);
    e->l = rx_loader_new (tu_env ("RX_PLUGIN_BUILD_DIR"), &err);
    cr_assert_not_null (e->l, "%s", err.msg);
    rx_plugin_t *kp, *ap, *hp;
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_KERNELS, "cpu", &kp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (kp, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_ATTENTION, "mla", &ap, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (ap, NULL, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_loader_find (e->l, RX_KIND_ATTENTION, "mha", &hp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (hp, NULL, &err), RX_OK, "%s", err.msg);
    e->K = rx_plugin_ops (kp);
    e->kh = rx_plugin_host (kp);
    e->mla = rx_plugin_ops (ap);
    e->mla_h = rx_plugin_host (ap);
    e->mha = rx_plugin_ops (hp);
    e->mha_h = rx_plugin_host (hp);
    struct rx_kernels_params p = { .struct_size = sizeof p, .threads = 1 };
    cr_assert_eq (e->K->create (e->kh, &p, &e->be, &err), RX_OK, "%s", err.msg);
}

static void s_close (struct env *e)
{
    e->K->destroy (e->be);
    rx_loader_destroy (&e->l);
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
    cr_assert_eq (e->K->copy_d2h (e->be, NULL, host, dev, bytes, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e->K->synchronize (e->be, NULL, &err), RX_OK, "%s", err.msg);
}

static uint64_t s_rng = 0x9e3779b97f4a7c15ull;
static float s_rand (void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (float) ((double) (s_rng >> 11) / (double) (1ull << 53)) * 2.0f - 1.0f;
}

/* Shapes of the random MLA problem. */
enum { H = 3, NOPE = 8, R = 4, HK = NOPE + R, HV = 6, L = 10, D = L + R, NL = 2, NSLOT = 40 };

static struct rx_attn_config s_cfg (int kv_kind, int kv_dtype)
{
    return (struct rx_attn_config) {
        .struct_size = sizeof (struct rx_attn_config), .kv_kind = kv_kind, .n_layer = NL,
        .n_head = H, .n_kv_head = H, .hd_k = HK, .hd_v = HV, .kv_dtype = kv_dtype,
        .scale = 1.0f / sqrtf ((float) HK), .kv_lora_rank = L, .rope_dim = R,
    };
}

/* The naive form for one query row: K_h,j = [W_UK_h c_j | kpe_j], V_h,j =
 * W_UV_h c_j from kv_b [H*(NOPE+HV)][L]; lat[j] = [c_j | kpe_j] for the
 * visible positions 0..npos-1. */
static void s_naive (const float *kvb, const float *q, const float (*lat)[D], int npos,
                     float scale, float *out)
{
    for (int h = 0; h < H; h++) {
        const float *qh = q + h * HK;
        double sc[64], mx = -INFINITY;
        for (int j = 0; j < npos; j++) {
            double s = 0;
            for (int i = 0; i < NOPE; i++) {
                double k = 0;
                for (int c = 0; c < L; c++) k += (double) kvb[(h * (NOPE + HV) + i) * L + c] * lat[j][c];
                s += qh[i] * k;
            }
            for (int i = 0; i < R; i++) s += (double) qh[NOPE + i] * lat[j][L + i];
            sc[j] = s * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int j = 0; j < npos; j++) sum += (sc[j] = exp (sc[j] - mx));
        for (int v = 0; v < HV; v++) {
            double o = 0;
            for (int j = 0; j < npos; j++) {
                double vv = 0;
                for (int c = 0; c < L; c++) vv += (double) kvb[(h * (NOPE + HV) + NOPE + v) * L + c] * lat[j][c];
                o += sc[j] / sum * vv;
            }
            out[h * HV + v] = (float) o;
        }
    }
}

/* One step: n rows of sequences given by q_start/kv_start/slots/pos. */
struct step {
    int n_seq, n;
    int32_t q_start[3], kv_start[3], slots[32], pos[16], new_slots[16];
    int seq_of[16];              /* which sequence (0 = A, 1 = B) a row is */
};

static void s_mla_vs_naive (int kv_dtype, double tol)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    struct rx_attn_config c = s_cfg (RX_ATTN_KV_LATENT, kv_dtype);
    void *a = NULL;
    cr_assert_eq (e.mla->create (e.mla_h, &(struct rx_kctx) { e.K, e.be, NULL }, &c, &a, &err), RX_OK,
                  "%s", err.msg);
    cr_assert_eq (e.mla->kv_alloc (a, NSLOT, &err), RX_OK, "%s", err.msg);
    /* a different kv_b per layer */
    static float kvb[NL][H * (NOPE + HV) * L];
    rx_kweight_t *w[NL];
    for (int l = 0; l < NL; l++) {
        for (size_t i = 0; i < sizeof kvb[l] / sizeof (float); i++) kvb[l][i] = s_rand ();
        struct rx_weight_view v = {
            .name = "kv_b", .dtype = RX_F32, .n_dims = 2, .ne = { L, H * (NOPE + HV), 1, 1 },
            .data = kvb[l], .nbytes = sizeof kvb[l],
        };
        cr_assert_eq (e.K->weight_load (e.be, &v, &w[l], &err), RX_OK, "%s", err.msg);
    }
    /* A: 7 positions in scattered slots; B shares A's slots for positions
     * 0..2 (a common prefix) and has its own for 3..5. */
    const int32_t slot_a[7] = { 17, 3, 29, 8, 0, 33, 12 };
    const int32_t slot_b[6] = { 17, 3, 29, 21, 5, 39 };
    static float lat[NL][2][8][D];      /* [layer][seq][pos] the latent rows as stored */
    /* steps: 1) A prefill 0..4;  2) B prefill 3..5 (prefix shared) + A decode 5;
     *        3) A decode 6 alone */
    struct step st[3];
    memset (st, 0, sizeof st);
    st[0].n_seq = 1; st[0].n = 5;
    st[0].q_start[1] = 5; st[0].kv_start[1] = 5;
    for (int i = 0; i < 5; i++) { st[0].pos[i] = i; st[0].slots[i] = slot_a[i]; st[0].seq_of[i] = 0; }
    st[1].n_seq = 2; st[1].n = 4;
    st[1].q_start[1] = 3; st[1].q_start[2] = 4; st[1].kv_start[1] = 6; st[1].kv_start[2] = 12;
    for (int i = 0; i < 3; i++) { st[1].pos[i] = 3 + i; st[1].seq_of[i] = 1; }
    st[1].pos[3] = 5; st[1].seq_of[3] = 0;
    for (int i = 0; i < 6; i++) { st[1].slots[i] = slot_b[i]; st[1].slots[6 + i] = slot_a[i]; }
    st[2].n_seq = 1; st[2].n = 1;
    st[2].q_start[1] = 1; st[2].kv_start[1] = 7;
    st[2].pos[0] = 6; st[2].seq_of[0] = 0;
    for (int i = 0; i < 7; i++) st[2].slots[i] = slot_a[i];
    double max_dev = 0;
    for (int s = 0; s < 3; s++) {
        struct step *p = &st[s];
        for (int t = 0; t < p->n; t++) {
            int q = 0;
            while (t >= p->q_start[q + 1]) q++;
            p->new_slots[t] = p->slots[p->kv_start[q] + p->pos[t]];
        }
        int32_t *d_qs = s_dev (&e, sizeof p->q_start, p->q_start), *d_ks = s_dev (&e, sizeof p->kv_start, p->kv_start);
        int32_t *d_sl = s_dev (&e, sizeof p->slots, p->slots), *d_pos = s_dev (&e, sizeof p->pos, p->pos);
        int32_t *d_new = s_dev (&e, sizeof p->new_slots, p->new_slots);
        struct rx_attn_batch b = { .n_seq = p->n_seq, .n_tokens = p->n, .q_start = d_qs,
                                   .kv_start = d_ks, .slots = d_sl, .q_pos = d_pos };
        cr_assert_eq (e.mla->prepare (a, &b, &err), RX_OK, "%s", err.msg);
        for (int l = 0; l < NL; l++) {
            /* q rows with a padded stride, latent rows with another */
            const size_t ldq = H * HK + 3, ldk = D + 2, ldo = H * HV + 1;
            float qh[16 * (H * HK + 3)], kh[16 * (D + 2)], oh[16 * (H * HV + 1)], ref[H * HV];
            for (size_t i = 0; i < sizeof qh / sizeof *qh; i++) qh[i] = s_rand ();
            for (size_t i = 0; i < sizeof kh / sizeof *kh; i++) kh[i] = s_rand ();
            for (int t = 0; t < p->n; t++) {
                float *row = lat[l][p->seq_of[t]][p->pos[t]];
                for (int i = 0; i < D; i++) {
                    /* what an F16 pool keeps */
                    row[i] = kh[t * ldk + i];
                    if (kv_dtype == RX_F16) row[i] = (float) (_Float16) row[i];
                }
            }
            /* B's shared prefix is A's rows */
            if (s == 1)
                for (int j = 0; j < 3; j++) memcpy (lat[l][1][j], lat[l][0][j], sizeof lat[l][0][j]);
            float *dq = s_dev (&e, sizeof qh, qh), *dk = s_dev (&e, sizeof kh, kh);
            float *dout = s_dev (&e, sizeof oh, NULL);
            struct rx_attn_io io = { .struct_size = sizeof io, .q = dq, .ldq = ldq, .k = dk, .ldk = ldk,
                                     .out = dout, .ldo = ldo, .w_kv_b = w[l] };
            cr_assert_eq (e.mla->forward (a, l, &b, d_new, &io, &err), RX_OK, "%s", err.msg);
            s_get (&e, oh, dout, sizeof oh);
            for (int t = 0; t < p->n; t++) {
                s_naive (kvb[l], qh + t * ldq, (const float (*)[D]) lat[l][p->seq_of[t]], p->pos[t] + 1,
                         c.scale, ref);
                for (int i = 0; i < H * HV; i++) {
                    double d = fabs ((double) oh[t * ldo + i] - ref[i]);
                    if (d > max_dev) max_dev = d;
                    cr_assert (d <= tol, "step %d layer %d row %d (seq %c pos %d) out[%d]: %g, naive %g",
                               s, l, t, "AB"[p->seq_of[t]], p->pos[t], i, (double) oh[t * ldo + i],
                               (double) ref[i]);
                }
            }
            e.K->free_ (e.be, dq);
            e.K->free_ (e.be, dk);
            e.K->free_ (e.be, dout);
        }
        e.K->free_ (e.be, d_qs);
        e.K->free_ (e.be, d_ks);
        e.K->free_ (e.be, d_sl);
        e.K->free_ (e.be, d_pos);
        e.K->free_ (e.be, d_new);
    }
    cr_log_info ("attn-mla absorbed vs naive (%s pool): max |d| %.3g", kv_dtype == RX_F16 ? "f16" : "f32",
                 max_dev);
    e.mla->destroy (a);
    for (int l = 0; l < NL; l++) e.K->weight_free (e.be, w[l]);
    s_close (&e);
}

Test (attn_mla, absorbed_equals_naive_f32) { s_mla_vs_naive (RX_F32, 1e-5); }
/* F16 pool: the reference uses the same rounded latents, so only the
 * kernels' F16 arithmetic differs. */
Test (attn_mla, absorbed_equals_naive_f16_pool) { s_mla_vs_naive (RX_F16, 1e-4); }

Test (attn_mla, kv_kind_mismatch_names_the_backend)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    struct rx_kctx k = { e.K, e.be, NULL };
    void *a = (void *) 1;
    struct rx_attn_config c = s_cfg (RX_ATTN_KV_HEADS, RX_F32);
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_ENOTSUP);
    cr_assert_null (a);
    cr_assert (strstr (err.msg, "mha") != NULL, "%s", err.msg);
    c = s_cfg (RX_ATTN_KV_LATENT, RX_F32);
    a = (void *) 1;
    memset (&err, 0, sizeof err);
    cr_assert_eq (e.mha->create (e.mha_h, &k, &c, &a, &err), RX_ENOTSUP);
    cr_assert_null (a);
    cr_assert (strstr (err.msg, "mla") != NULL, "%s", err.msg);
    s_close (&e);
}

Test (attn_mla, bad_configs_and_calls)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    struct rx_kctx k = { e.K, e.be, NULL };
    void *a = NULL;
    struct rx_attn_config c = s_cfg (RX_ATTN_KV_LATENT, RX_F32);
    c.rope_dim = HK;              /* no nope part */
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "rope_dim") != NULL, "%s", err.msg);
    c = s_cfg (RX_ATTN_KV_LATENT, RX_F32);
    c.kv_lora_rank = 0;
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_EINVAL);
    c = s_cfg (RX_ATTN_KV_LATENT, RX_BF16);
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_EINVAL);
    c = s_cfg (RX_ATTN_KV_LATENT, RX_F32);
    c.scale = 0;
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_EINVAL);
    cr_assert_null (a);

    c = s_cfg (RX_ATTN_KV_LATENT, RX_F32);
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_OK, "%s", err.msg);
    int32_t zero[4] = { 0, 1, 0, 1 }, pos0 = 0;
    int32_t *d_i = s_dev (&e, sizeof zero, zero), *d_pos = s_dev (&e, sizeof pos0, &pos0);
    float *buf = s_dev (&e, 64 * sizeof (float), NULL);
    struct rx_attn_batch b = { .n_seq = 1, .n_tokens = 1, .q_start = d_i, .kv_start = d_i,
                               .slots = d_i, .q_pos = d_pos };
    struct rx_attn_io io = { .struct_size = sizeof io, .q = buf, .ldq = H * HK, .k = buf, .ldk = D,
                             .out = buf, .ldo = H * HV, .w_kv_b = NULL };
    cr_assert_eq (e.mla->forward (a, 0, &b, d_i, &io, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "kv_alloc") != NULL, "%s", err.msg);
    cr_assert_eq (e.mla->kv_alloc (a, 0, &err), RX_EINVAL);
    cr_assert_eq (e.mla->kv_alloc (a, 4, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.mla->forward (a, 0, &b, d_i, &io, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "kv_b") != NULL, "%s", err.msg);
    cr_assert_eq (e.mla->forward (a, NL, &b, d_i, &io, &err), RX_EINVAL);
    /* a kv_b with too few rows for the heads: get_rows refuses, named */
    float small[L * 4];
    memset (small, 0, sizeof small);
    rx_kweight_t *w;
    struct rx_weight_view v = { .name = "kv_b", .dtype = RX_F32, .n_dims = 2, .ne = { L, 4, 1, 1 },
                                .data = small, .nbytes = sizeof small };
    cr_assert_eq (e.K->weight_load (e.be, &v, &w, &err), RX_OK, "%s", err.msg);
    io.w_kv_b = w;
    cr_assert_neq (e.mla->forward (a, 0, &b, d_i, &io, &err), RX_OK);
    cr_assert (strstr (err.msg, "kv_b") != NULL, "%s", err.msg);
    e.mla->destroy (a);
    e.mla->destroy (NULL);
    e.K->weight_free (e.be, w);
    e.K->free_ (e.be, d_i);
    e.K->free_ (e.be, d_pos);
    e.K->free_ (e.be, buf);
    s_close (&e);
}

/* KV bytes per token: tiny-deepseek2 (3 layers, kv_lora_rank 32, rope 16)
 * and DeepSeek-V3 (61 layers, kv_lora_rank 512, rope 64, 128 heads of
 * 192/128) against MHA storing the expanded per-head K/V. */
Test (attn_mla, kv_bytes_per_token)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    struct rx_kctx k = { e.K, e.be, NULL };
    struct rx_attn_config c = {
        .struct_size = sizeof c, .kv_kind = RX_ATTN_KV_LATENT, .n_layer = 3, .n_head = 4,
        .n_kv_head = 4, .hd_k = 48, .hd_v = 32, .kv_dtype = RX_F32, .scale = 0.1f,
        .kv_lora_rank = 32, .rope_dim = 16,
    };
    void *a;
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.mla->kv_bytes_per_token (a), 3u * 48u * 4u);
    e.mla->destroy (a);
    c.n_layer = 61; c.n_head = 128; c.n_kv_head = 128; c.hd_k = 192; c.hd_v = 128;
    c.kv_lora_rank = 512; c.rope_dim = 64;
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_OK, "%s", err.msg);
    uint64_t mla_b = e.mla->kv_bytes_per_token (a);
    cr_assert_eq (mla_b, 61ull * 576 * 4);             /* 140,544 */
    e.mla->destroy (a);
    c.kv_dtype = RX_F16;
    cr_assert_eq (e.mla->create (e.mla_h, &k, &c, &a, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (e.mla->kv_bytes_per_token (a), 61ull * 576 * 2);
    e.mla->destroy (a);
    c.kv_kind = RX_ATTN_KV_HEADS;
    c.kv_dtype = RX_F32;
    cr_assert_eq (e.mha->create (e.mha_h, &k, &c, &a, &err), RX_OK, "%s", err.msg);
    uint64_t mha_b = e.mha->kv_bytes_per_token (a);
    cr_assert_eq (mha_b, 61ull * 128 * (192 + 128) * 4);   /* 9,994,240 */
    e.mha->destroy (a);
    cr_log_info ("DeepSeek-V3 KV bytes/token (f32): MLA %llu, MHA %llu (%.1fx)",
                 (unsigned long long) mla_b, (unsigned long long) mha_b, (double) mha_b / (double) mla_b);
    s_close (&e);
}

/* ---- through the engine ---- */

static const char *s_gguf (char *buf, size_t n)
{
    TU_REQUIRE_SHARED ();
    snprintf (buf, n, "%s/data/models/tiny-deepseek2.gguf", tu_env ("RADIX_SHARED"));
    return buf;
}

static rx_engine_t *s_engine (struct rx_boot *b, const char *backend, const char *moe_max,
                              struct rx_err *err)
{
    char path[4096];
    s_gguf (path, sizeof path);
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    cr_assert_eq (rx_boot_open (b, NULL, 0, err), RX_OK, "%s", err->msg);
    cr_assert_eq (rx_conf_set (b->conf, "kernels", "threads", "1", err), RX_OK, "%s", err->msg);
    if (backend) cr_assert_eq (rx_conf_set (b->conf, "attention", "backend", backend, err), RX_OK, "%s", err->msg);
    if (moe_max) cr_assert_eq (rx_conf_set (b->conf, "moe", "max_tokens_per_rank", moe_max, err), RX_OK, "%s", err->msg);
    struct rx_engine_opts o = { .model_path = path, .n_slots = 128, .max_tokens = 64 };
    return rx_engine_new (b, &o, err);
}

Test (deepseek2, auto_picks_mla_and_reports_latent_kv)
{
    struct rx_boot b;
    struct rx_err err = { 0 };
    rx_engine_t *e = s_engine (&b, NULL, NULL, &err);
    cr_assert_not_null (e, "%s", err.msg);
    const struct rx_model_info *mi = rx_engine_info (e);
    cr_assert_str_eq (mi->arch, "deepseek2");
    cr_assert_eq (mi->n_layer, 3);
    cr_assert_eq (mi->kv_bytes_per_token, 3u * (32 + 16) * 4);   /* one latent row per layer */
    rx_engine_destroy (&e);
    rx_boot_close (&b);
}

Test (deepseek2, mha_backend_is_refused_clearly)
{
    struct rx_boot b;
    struct rx_err err = { 0 };
    rx_engine_t *e = s_engine (&b, "mha", NULL, &err);
    cr_assert_null (e);
    cr_assert_eq (err.code, RX_ENOTSUP, "%d: %s", err.code, err.msg);
    cr_assert (strstr (err.msg, "mla") != NULL, "message should name the mla backend: %s", err.msg);
    cr_assert (strstr (err.msg, "tiny-deepseek2.gguf") != NULL, "message should name the file: %s", err.msg);
    rx_boot_close (&b);
}

/* [moe] max_tokens_per_rank = 3: a 61-token prefill dispatches its MoE
 * rows in 21 chunks; the greedy continuation must still be llama.cpp's
 * (tiny-deepseek2.json, prompt 2: the reference top-2 gaps of these 8
 * steps are >= 0.03, far above any rounding). */
Test (deepseek2, chunked_dispatch_keeps_reference_greedy)
{
    static const int32_t prompt[61] = {
        1, 450, 2030, 301, 18919, 1709, 8389, 472, 278, 7636, 310, 278, 1067, 2593, 29892, 967,
        4796, 10675, 1236, 14067, 1156, 1602, 3076, 310, 15795, 322, 8805, 29889, 7569, 11005,
        278, 1589, 11356, 10784, 2580, 278, 12474, 6337, 284, 380, 7121, 29892, 17151, 2168, 278,
        281, 860, 29892, 322, 20654, 278, 22913, 7901, 1022, 4822, 278, 6501, 4094, 2745, 27470,
        29889 };
    static const int32_t greedy[8] = { 19243, 11618, 1842, 27143, 23492, 17919, 14794, 12550 };
    struct rx_boot b;
    struct rx_err err = { 0 };
    rx_engine_t *e = s_engine (&b, NULL, "3", &err);
    cr_assert_not_null (e, "%s", err.msg);
    const int32_t nv = rx_engine_info (e)->n_vocab;
    float *logits = malloc ((size_t) nv * sizeof *logits);
    int id = rx_engine_seq_new (e, 61 + 8, &err);
    cr_assert_geq (id, 0, "%s", err.msg);
    struct rx_engine_req q = { id, 61, prompt, 0 };
    cr_assert_eq (rx_engine_step (e, &q, 1, logits, &err), RX_OK, "%s", err.msg);
    for (int k = 0; k < 8; k++) {
        int32_t best = 0;
        for (int32_t i = 1; i < nv; i++)
            if (logits[i] > logits[best]) best = i;
        cr_assert_eq (best, greedy[k], "greedy token %d: %d, reference %d", k, best, greedy[k]);
        struct rx_engine_req d = { id, 1, &best, 0 };
        cr_assert_eq (rx_engine_step (e, &d, 1, logits, &err), RX_OK, "%s", err.msg);
    }
    free (logits);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
}

/* The plugin directly: tensor parallelism and a missing dispatcher are
 * refused before the file is read further. */
static int s_no_u32 (const struct rx_model_src *s, const char *k, uint32_t *o) { (void) s; (void) k; (void) o; return RX_ENOENT; }
static int s_no_i64 (const struct rx_model_src *s, const char *k, int64_t *o) { (void) s; (void) k; (void) o; return RX_ENOENT; }
static int s_no_f32 (const struct rx_model_src *s, const char *k, float *o) { (void) s; (void) k; (void) o; return RX_ENOENT; }
static int s_no_bool (const struct rx_model_src *s, const char *k, int *o) { (void) s; (void) k; (void) o; return RX_ENOENT; }
static int s_arch (const struct rx_model_src *s, const char *k, const char **str, size_t *len)
{
    (void) s;
    if (strcmp (k, "general.architecture") != 0) return RX_ENOENT;
    *str = "deepseek2";
    *len = 9;
    return RX_OK;
}
static int s_no_len (const struct rx_model_src *s, const char *k, size_t *n) { (void) s; (void) k; (void) n; return RX_ENOENT; }
static int s_no_ai (const struct rx_model_src *s, const char *k, size_t i, int64_t *o) { (void) s; (void) k; (void) i; (void) o; return RX_ENOENT; }
static int s_no_af (const struct rx_model_src *s, const char *k, size_t i, float *o) { (void) s; (void) k; (void) i; (void) o; return RX_ENOENT; }
static int s_no_t (const struct rx_model_src *s, const char *n, struct rx_weight_view *v) { (void) s; (void) n; (void) v; return RX_ENOENT; }

Test (deepseek2, tensor_parallel_and_bad_files_refused)
{
    struct env e;
    s_open (&e);
    struct rx_err err = { 0 };
    rx_plugin_t *mp;
    cr_assert_eq (rx_loader_find (e.l, RX_KIND_MODEL, "deepseek2", &mp, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (rx_plugin_init (mp, NULL, &err), RX_OK, "%s", err.msg);
    const struct rx_model_ops *M = rx_plugin_ops (mp);
    cr_assert_str_eq (M->architectures[0], "deepseek2");
    cr_assert_str_eq (M->default_attention ("deepseek2"), "mla");
    struct rx_model_src src = {
        .struct_size = sizeof src, .path = "fake.gguf", .get_u32 = s_no_u32, .get_i64 = s_no_i64,
        .get_f32 = s_no_f32, .get_bool = s_no_bool, .get_str = s_arch, .arr_len = s_no_len,
        .arr_i64 = s_no_ai, .arr_f32 = s_no_af, .tensor = s_no_t,
    };
    struct rx_model_env env = {
        .struct_size = sizeof env, .k = { e.K, e.be, NULL }, .attn = e.mla, .attn_host = e.mla_h,
        .kv_dtype = RX_F32, .rank = 1, .n_rank = 2,
    };
    void *m = (void *) 1;
    /* Tensor parallelism needs the group's comm (all_reduce). */
    cr_assert_eq (M->create (rx_plugin_host (mp), &src, &env, &m, &err), RX_EINVAL);
    cr_assert_null (m);
    cr_assert (strstr (err.msg, "tensor-parallel rank 1 of 2 without a comm") != NULL, "%s", err.msg);
    env.rank = 0;
    env.n_rank = 1;
    cr_assert_eq (M->create (rx_plugin_host (mp), &src, &env, &m, &err), RX_EFORMAT);
    cr_assert (strstr (err.msg, "deepseek2.embedding_length") != NULL, "%s", err.msg);
    cr_assert_null (m);
    s_close (&e);
}
