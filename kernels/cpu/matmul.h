/* kernels/cpu/matmul.h -- the matmul driver: quantizes activations with the
 * selected path's format (a small activation is quantized once for the
 * following matmuls of equal rows: Q/K/V, gate/up), then splits weight rows
 * over the pool's threads (dynamic, guided chunks, so a thread slowed by
 * another process does not hold the op back and the threads finish close
 * together), giving each thread its packing scratch if the path wants one
 * (the AVX-512 float GEMM). */
#ifndef RX_KCPU_MATMUL_H
#define RX_KCPU_MATMUL_H

#include "plugin.h"

/* Y[n][out] (+)= X[n][in] W^T for 2-D W, or expert e of a 3-D W.
 * Arguments are already checked by plugin.c. */
int rx_kcpu_matmul (struct rx_kcpu *k, const struct rx_kweight *w, int expert,
                    const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                    uint32_t flags, struct rx_err *err);

/* radix/kernel.h 1.3 matmul_grouped over a 3-D W: for each expert e, the
 * rows [max(offsets[e], row0), min(offsets[e+1], row0 + n)) -- row i of x
 * and y being sorted row row0 + i -- go through rx_kcpu_matmul for expert
 * e as one call, so they get exactly what the matmul op gives for those
 * rows (including its choice of kernel by row count).  Rows at or past
 * offsets[n_expert] are not touched.  offsets (w->ne[2] + 1 entries) were
 * checked by plugin.c: offsets[0] = 0, nondecreasing. */
int rx_kcpu_matmul_grouped (struct rx_kcpu *k, const struct rx_kweight *w, const int32_t *offsets,
                            size_t row0, const float *x, size_t ldx, float *y, size_t ldy,
                            size_t n, uint32_t flags, struct rx_err *err);

#endif
