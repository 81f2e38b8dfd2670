/* kernels/cpu/matmul.c -- see matmul.h. */
#include <stdlib.h>
#include <string.h>

#include "matmul.h"

struct s_job {
    struct rx_mm_job mm;
    const struct rx_kisa *isa;
    uint8_t *pack;          /* per-thread packing scratch, pack_bytes each */
    size_t pack_bytes;
    const float *x;
    size_t ldx;
};

/* Items: activation rows to quantize. */
static void s_quant (void *ctx, size_t t0, size_t t1, int tid)
{
    (void) tid;
    struct s_job *j = ctx;
    for (size_t t = t0; t < t1; t++)
        j->isa->act_quant (j->mm.dtype, j->mm.repacked, j->x + t * j->ldx,
                           (uint8_t *) j->mm.xa + t * j->mm.xa_row_bytes, j->mm.in);
}

/* Activations up to this many elements are cached once quantized (decode:
 * a few rows; comparing and copying them costs less than quantizing). */
#define S_XQ_MAX_ELEMS 65536

/* 1 if k's cached quantized rows came from rows equal to x's. */
static int s_xq_hit (const struct rx_kcpu *k, int dtype, int repacked, size_t in, size_t n,
                     size_t arb, const float *x, size_t ldx)
{
    if (!k->xq_valid || k->xq_dtype != dtype || k->xq_repacked != repacked || k->xq_in != in ||
        k->xq_n != n || k->xq_row_bytes != arb)
        return 0;
    const float *src = (const float *) ((const uint8_t *) k->xq_buf + arb * n);
    for (size_t t = 0; t < n; t++)
        if (memcmp (src + t * in, x + t * ldx, in * sizeof (float)) != 0) return 0;
    return 1;
}

/* The cache buffer for n rows, or NULL (then the caller quantizes into the
 * scratch as for big activations). */
static uint8_t *s_xq_buf (struct rx_kcpu *k, size_t arb, size_t in, size_t n)
{
    const size_t bytes = arb * n + n * in * sizeof (float);
    k->xq_valid = 0;
    if (bytes > k->xq_cap) {
        const size_t cap = (bytes + 4095) / 4096 * 4096;
        void *p = aligned_alloc (64, cap);
        if (!p) return NULL;
        free (k->xq_buf);
        k->xq_buf = p;
        k->xq_cap = cap;
    }
    return k->xq_buf;
}

/* Items: weight rows. */
static void s_rows (void *ctx, size_t r0, size_t r1, int tid)
{
    struct s_job *j = ctx;
    if (j->pack_bytes) {
        /* Each thread packs into its own slice of the scratch. */
        struct rx_mm_job m = j->mm;
        m.pack = j->pack + (size_t) tid * j->pack_bytes;
        j->isa->mm (&m, r0, r1);
        return;
    }
    j->isa->mm (&j->mm, r0, r1);
}

int rx_kcpu_matmul (struct rx_kcpu *k, const struct rx_kweight *w, int expert,
                    const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                    uint32_t flags, struct rx_err *err)
{
    const struct rx_kisa *isa = k->isa;
    size_t in = (size_t) w->ne[0], out = (size_t) w->ne[1];
    struct s_job j;
    memset (&j, 0, sizeof j);
    j.isa = isa;
    j.x = x;
    j.ldx = ldx;
    j.mm.dtype = w->dtype;
    j.mm.w = w->data + (expert > 0 ? (size_t) expert * out * w->row_bytes : 0);
    j.mm.w_row_bytes = w->row_bytes;
    j.mm.in = in;
    j.mm.n = n;
    j.mm.y = y;
    j.mm.ldy = ldy;
    j.mm.accumulate = (flags & RX_MM_ACCUMULATE) != 0;
    j.mm.repacked = w->repacked;
    size_t arb = isa->act_row_bytes (w->dtype, w->repacked, in);
    arb = (arb + 63) / 64 * 64;
    size_t pb = isa->mm_pack_bytes ? isa->mm_pack_bytes (w->dtype, in, n) : 0;
    pb = (pb + 63) / 64 * 64;
    /* tid can be any thread of the pool: one slice each. */
    const size_t nslice = (size_t) rx_kpool_threads (k->pool);
    int quantize = arb != 0;
    uint8_t *xq = NULL;
    if (arb && n * in <= S_XQ_MAX_ELEMS) {
        if (s_xq_hit (k, w->dtype, w->repacked, in, n, arb, x, ldx)) {
            xq = k->xq_buf;
            quantize = 0;
        } else if ((xq = s_xq_buf (k, arb, in, n)) != NULL) {
            float *src = (float *) (xq + arb * n);
            for (size_t t = 0; t < n; t++) memcpy (src + t * in, x + t * ldx, in * sizeof (float));
        }
    }
    if ((arb && !xq) || pb) {
        uint8_t *buf = rx_kcpu_scratch (k, (xq ? 0 : arb * n) + pb * nslice);
        if (!buf)
            return rx_err_set (err, RX_ENOMEM, "kernels-cpu matmul: out of memory for "
                               "%zu x %zu activations", n, in);
        j.pack = pb ? buf + (xq ? 0 : arb * n) : NULL;
        j.pack_bytes = pb;
        if (!xq) xq = buf;
    }
    if (arb) {
        j.mm.xa = xq;
        j.mm.xa_row_bytes = arb;
    } else {
        j.mm.xa = (const uint8_t *) x;
        j.mm.xa_row_bytes = ldx * sizeof (float);
    }
    if (quantize) {
        /* Quantize the activations first (a separate run: no barrier, so
         * a late worker never holds the others up). */
        rx_kpool_for (k->pool, n, 0, s_quant, &j, rx_kcpu_threads_for (k, (double) n * in * 4));
        if (xq == k->xq_buf) {
            k->xq_valid = 1;
            k->xq_dtype = w->dtype;
            k->xq_repacked = w->repacked;
            k->xq_in = in;
            k->xq_n = n;
            k->xq_row_bytes = arb;
        }
    }
    int nth = rx_kcpu_threads_for (k, (double) n * (double) in * (double) out);
    /* Chunks: a multiple of 16 rows (of the packed kernels' panel), about 8
     * per thread for balance. */
    size_t chunk = out / ((size_t) nth * 8);
    const size_t align = pb && isa->mm_pack_rows ? isa->mm_pack_rows : 16;
    chunk = (chunk + align - 1) / align * align;
    if (chunk < align) chunk = align;
    /* Guided down to one unit: the threads of a decode matmul finish within
     * a few microseconds of each other. */
    rx_kpool_for_guided (k->pool, out, chunk, align, s_rows, &j, nth);
    return RX_OK;
}

int rx_kcpu_matmul_grouped (struct rx_kcpu *k, const struct rx_kweight *w, const int32_t *offsets,
                            size_t row0, const float *x, size_t ldx, float *y, size_t ldy,
                            size_t n, uint32_t flags, struct rx_err *err)
{
    const size_t n_expert = (size_t) w->ne[2], end = row0 + n;
    for (size_t e = 0; e < n_expert; e++) {
        size_t lo = (size_t) offsets[e], hi = (size_t) offsets[e + 1];
        if (lo < row0) lo = row0;
        if (hi > end) hi = end;
        if (lo >= hi) continue;
        /* The matmul op's own path for these rows of expert e. */
        int rc = rx_kcpu_matmul (k, w, (int) e, x + (lo - row0) * ldx, ldx, y + (lo - row0) * ldy,
                                 ldy, hi - lo, flags, err);
        if (rc != RX_OK) return rc;
    }
    return RX_OK;
}
