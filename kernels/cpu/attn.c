/* kernels/cpu/attn.c -- see attn.h.
 *
 * One task = (query row, KV head): the query heads that share a KV head are
 * done together so each K/V row is read once for the whole group.  Scores
 * for the visible positions go to a per-thread scratch row, then an exact
 * (two-pass) softmax and the weighted sum of V.  A path with block
 * primitives (isa.h attn_scores/attn_wsum/softmax: AVX-512) does each of
 * the three steps for the whole head group in one call, so a K or V row
 * is loaded once per group and no per-row call or reduction is paid. */
#include <math.h>
#include <string.h>

#include "quant.h"
#include "attn.h"

static inline const void *s_row (const void *base, int dtype, size_t idx, size_t dim)
{
    return (const uint8_t *) base + idx * dim * (dtype == RX_F16 ? 2 : 4);
}

static void s_store_row (void *dst, int dtype, const float *src, size_t n)
{
    if (dtype == RX_F16) {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) h[i] = rx_fp32_to_fp16 (src[i]);
    } else {
        memcpy (dst, src, n * sizeof (float));
    }
}

void rx_kcpu_kv_store (struct rx_kcpu *k, const struct rx_kv_pool *pool, const float *kx,
                       size_t ldk, const float *vx, size_t ldv, const int32_t *slots,
                       size_t n_tok)
{
    (void) k;
    const size_t nk = (size_t) pool->n_kv_head * (size_t) pool->hd_k;
    const size_t nv = (size_t) pool->n_kv_head * (size_t) pool->hd_v;
    for (size_t t = 0; t < n_tok; t++) {
        size_t s = (size_t) slots[t];
        s_store_row ((void *) s_row (pool->k, pool->dtype, s, nk), pool->dtype, kx + t * ldk, nk);
        s_store_row ((void *) s_row (pool->v, pool->dtype, s, nv), pool->dtype, vx + t * ldv, nv);
    }
}

int rx_kcpu_attn_check (const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                        struct rx_err *err)
{
    if (b->q_start[0] != 0 || b->kv_start[0] != 0)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu attention: q_start[0] and kv_start[0] "
                           "must be 0");
    if (b->q_start[b->n_seq] != b->n_tokens)
        return rx_err_set (err, RX_EINVAL, "kernels-cpu attention: q_start[n_seq] = %d but "
                           "n_tokens = %d", b->q_start[b->n_seq], b->n_tokens);
    for (int32_t s = 0; s < b->n_seq; s++) {
        int32_t q0 = b->q_start[s], q1 = b->q_start[s + 1];
        int32_t k0 = b->kv_start[s], k1 = b->kv_start[s + 1];
        if (q1 < q0 || k1 < k0)
            return rx_err_set (err, RX_EINVAL, "kernels-cpu attention: sequence %d: offsets "
                               "decrease", s);
        for (int32_t t = q0; t < q1; t++)
            if (b->q_pos[t] < 0 || b->q_pos[t] >= k1 - k0)
                return rx_err_set (err, RX_EINVAL, "kernels-cpu attention: query row %d at "
                                   "position %d, but sequence %d has %d KV positions",
                                   t, b->q_pos[t], s, k1 - k0);
    }
    int32_t nslots = b->kv_start[b->n_seq];
    for (int32_t i = 0; i < nslots; i++)
        if (b->slots[i] < 0 || (uint64_t) b->slots[i] >= pool->n_slots)
            return rx_err_set (err, RX_EINVAL, "kernels-cpu attention: slot %d at index %d is "
                               "outside the pool (%llu slots)", b->slots[i], i,
                               (unsigned long long) pool->n_slots);
    return RX_OK;
}

struct s_attn {
    const float *q;
    size_t ldq;
    const struct rx_kv_pool *pool;
    const struct rx_attn_batch *b;
    const struct rx_attn_params *p;
    float *out;
    size_t ldo;
    int32_t *tok_seq;             /* query row -> sequence */
    float *scratch;               /* per thread: group * max_len scores + hd_v */
    size_t scratch_per_thread;
    size_t n_tasks;
    const struct rx_kisa *isa;
};

static inline float s_dot (const struct rx_kisa *isa, const float *q, const void *krow, int dtype,
                           size_t n)
{
    return dtype == RX_F16 ? isa->dot_f16 (q, krow, n) : isa->dot_f32 (q, krow, n);
}

static inline void s_axpy (const struct rx_kisa *isa, float *y, float a, const void *vrow,
                           int dtype, size_t n)
{
    if (dtype == RX_F16) isa->axpy_f16 (y, a, vrow, n);
    else isa->axpy_f32 (y, a, vrow, n);
}

/* Raw dot products -> probabilities, in place: scale, soft cap, exact
 * two-pass softmax. */
static void s_softmax (float *sc, size_t len, const struct rx_attn_params *p)
{
    float max = -INFINITY;
    for (size_t j = 0; j < len; j++) {
        float v = sc[j] * p->scale;
        if (p->softcap > 0.f) v = p->softcap * tanhf (v / p->softcap);
        sc[j] = v;
        max = v > max ? v : max;
    }
    double sum = 0.0;
    for (size_t j = 0; j < len; j++) {
        sc[j] = expf (sc[j] - max);
        sum += sc[j];
    }
    const float inv = (float) (1.0 / sum);
    for (size_t j = 0; j < len; j++) sc[j] *= inv;
}

static void s_attn_tasks (void *ctx, size_t task0, size_t task1, int tid)
{
    struct s_attn *c = ctx;
    const struct rx_kv_pool *pool = c->pool;
    const struct rx_attn_params *p = c->p;
    const size_t hk = (size_t) pool->hd_k, hv = (size_t) pool->hd_v;
    const size_t n_kv = (size_t) pool->n_kv_head;
    const size_t group = (size_t) p->n_head / n_kv;
    const size_t krow = n_kv * hk, vrow = n_kv * hv;
    float *scores = c->scratch + (size_t) tid * c->scratch_per_thread;
    for (size_t task = task0; task < task1; task++) {
        const size_t t = task / n_kv, kvh = task % n_kv;
        const int32_t s = c->tok_seq[t];
        const int32_t *slots = c->b->slots + c->b->kv_start[s];
        const int32_t pos = c->b->q_pos[t];
        int32_t first = 0;
        if (p->window > 0 && pos - p->window + 1 > 0) first = pos - p->window + 1;
        const size_t len = (size_t) (pos - first + 1);
        const size_t esz = pool->dtype == RX_F16 ? 2 : 4;
        if (c->isa->attn_scores && c->isa->attn_wsum) {
            /* The path's block primitives: all heads of the group and every
             * visible row at once (each K/V row read once for the group). */
            const float *q = c->q + t * c->ldq + kvh * group * hk;
            c->isa->attn_scores (q, hk, group, (const uint8_t *) pool->k + kvh * hk * esz, pool->dtype,
                                 krow, slots + first, len, hk, scores, len);
            for (size_t g = 0; g < group; g++) {
                if (c->isa->softmax && !(p->softcap > 0.f)) c->isa->softmax (scores + g * len, len, p->scale);
                else s_softmax (scores + g * len, len, p);
            }
            c->isa->attn_wsum (c->out + t * c->ldo + kvh * group * hv, hv, scores, len, group,
                               (const uint8_t *) pool->v + kvh * hv * esz, pool->dtype, vrow,
                               slots + first, len, hv);
            continue;
        }
        for (size_t g = 0; g < group; g++) {
            const size_t h = kvh * group + g;
            const float *q = c->q + t * c->ldq + h * hk;
            float *sc = scores + g * len;
            for (size_t j = 0; j < len; j++) {
                const void *kr = s_row (pool->k, pool->dtype, (size_t) slots[first + (int32_t) j], krow);
                sc[j] = s_dot (c->isa, q, (const uint8_t *) kr + kvh * hk * esz, pool->dtype, hk);
            }
            s_softmax (sc, len, p);
            float *o = c->out + t * c->ldo + h * hv;
            memset (o, 0, hv * sizeof (float));
            for (size_t j = 0; j < len; j++) {
                const void *vr = s_row (pool->v, pool->dtype, (size_t) slots[first + (int32_t) j], vrow);
                vr = (const uint8_t *) vr + kvh * hv * esz;
                s_axpy (c->isa, o, sc[j], vr, pool->dtype, hv);
            }
        }
    }
}

int rx_kcpu_attention (struct rx_kcpu *k, const float *q, size_t ldq,
                       const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                       const struct rx_attn_params *p, float *out, size_t ldo,
                       struct rx_err *err)
{
    if (b->n_tokens == 0) return RX_OK;
    size_t max_len = 1;
    for (int32_t s = 0; s < b->n_seq; s++) {
        size_t len = (size_t) (b->kv_start[s + 1] - b->kv_start[s]);
        if (len > max_len) max_len = len;
    }
    const size_t group = (size_t) p->n_head / (size_t) pool->n_kv_head;
    const size_t n_tasks = (size_t) b->n_tokens * (size_t) pool->n_kv_head;
    const double work = (double) b->n_tokens * (double) p->n_head * (double) max_len *
                        (double) (pool->hd_k + pool->hd_v);
    int nth = rx_kcpu_threads_for (k, work);
    if ((size_t) nth > n_tasks) nth = (int) n_tasks;
    size_t per = (group * max_len + 15) / 16 * 16;
    size_t bytes = (size_t) b->n_tokens * sizeof (int32_t) + 64 +
                   (size_t) nth * per * sizeof (float);
    uint8_t *mem = rx_kcpu_scratch (k, bytes);
    if (!mem)
        return rx_err_set (err, RX_ENOMEM, "kernels-cpu attention: out of memory for scores "
                           "(%zu tokens x %zu positions)", (size_t) b->n_tokens, max_len);
    struct s_attn c = { .q = q, .ldq = ldq, .pool = pool, .b = b, .p = p, .out = out,
                        .ldo = ldo, .n_tasks = n_tasks, .scratch_per_thread = per,
                        .isa = k->isa };
    c.scratch = (float *) mem;
    c.tok_seq = (int32_t *) (mem + (size_t) nth * per * sizeof (float));
    for (int32_t s = 0; s < b->n_seq; s++)
        for (int32_t t = b->q_start[s]; t < b->q_start[s + 1]; t++)
            c.tok_seq[t] = s;
    /* Scratch is per thread id; only ids below nth take part. */
    if (nth <= 1)
        s_attn_tasks (&c, 0, n_tasks, 0);
    else
        rx_kpool_for (k->pool, n_tasks, 0, s_attn_tasks, &c, nth);
    return RX_OK;
}
