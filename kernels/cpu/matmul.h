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

#endif
