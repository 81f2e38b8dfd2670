/* kernels/cpu/matmul.c -- see matmul.h. */
#include <stdatomic.h>
#include <string.h>

#include "matmul.h"

struct s_job {
    struct rx_mm_job mm;
    const struct rx_kisa *isa;
    const float *x;
    size_t ldx;
    size_t out;
    size_t chunk;
    _Atomic size_t next;
    rx_kpool_t *pool;
};

static void s_run (void *ctx, int ith, int nth)
{
    struct s_job *j = ctx;
    if (j->mm.xa_row_bytes && j->mm.xa != (const uint8_t *) j->x) {
        /* Phase 1: quantize the activations, rows split over threads. */
        for (size_t t = (size_t) ith; t < j->mm.n; t += (size_t) nth)
            j->isa->act_quant (j->mm.dtype, j->mm.repacked, j->x + t * j->ldx,
                               (uint8_t *) j->mm.xa + t * j->mm.xa_row_bytes, j->mm.in);
        rx_kpool_barrier (j->pool);
    }
    /* Phase 2: chunks of weight rows, taken dynamically. */
    for (;;) {
        size_t r0 = atomic_fetch_add_explicit (&j->next, j->chunk, memory_order_relaxed);
        if (r0 >= j->out) break;
        size_t r1 = r0 + j->chunk < j->out ? r0 + j->chunk : j->out;
        j->isa->mm (&j->mm, r0, r1);
    }
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
    j.out = out;
    j.pool = k->pool;
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
    } else {
        j.mm.xa = (const uint8_t *) x;
        j.mm.xa_row_bytes = ldx * sizeof (float);
    }
    double work = (double) n * (double) in * (double) out;
    int nth = rx_kcpu_threads_for (k, work);
    /* Chunks: a multiple of 16 rows, about 8 per thread for balance, and
     * not smaller than 16 rows of useful work. */
    size_t chunk = out / ((size_t) nth * 8);
    chunk = (chunk + 15) / 16 * 16;
    if (chunk < 16) chunk = 16;
    j.chunk = chunk;
    atomic_init (&j.next, 0);
    rx_kpool_run (k->pool, s_run, &j, nth);
    return RX_OK;
}
