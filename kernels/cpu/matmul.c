/* kernels/cpu/matmul.c -- see matmul.h. */
#include <string.h>

#include "matmul.h"

struct s_job {
    struct rx_mm_job mm;
    const struct rx_kisa *isa;
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

/* Items: weight rows. */
static void s_rows (void *ctx, size_t r0, size_t r1, int tid)
{
    (void) tid;
    struct s_job *j = ctx;
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
    if (arb) {
        arb = (arb + 63) / 64 * 64;
        void *buf = rx_kcpu_scratch (k, arb * n);
        if (!buf)
            return rx_err_set (err, RX_ENOMEM, "kernels-cpu matmul: out of memory for "
                               "%zu x %zu activations", n, in);
        j.mm.xa = buf;
        j.mm.xa_row_bytes = arb;
        /* Quantize the activations first (a separate run: no barrier, so
         * a late worker never holds the others up). */
        rx_kpool_for (k->pool, n, 0, s_quant, &j, rx_kcpu_threads_for (k, (double) n * in * 4));
    } else {
        j.mm.xa = (const uint8_t *) x;
        j.mm.xa_row_bytes = ldx * sizeof (float);
    }
    int nth = rx_kcpu_threads_for (k, (double) n * (double) in * (double) out);
    /* Chunks: a multiple of 16 rows, about 8 per thread for balance. */
    size_t chunk = out / ((size_t) nth * 8);
    chunk = (chunk + 15) / 16 * 16;
    if (chunk < 16) chunk = 16;
    rx_kpool_for (k->pool, out, chunk, s_rows, &j, nth);
    return RX_OK;
}
