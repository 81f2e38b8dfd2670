/* kernels/moe_ll_args.h -- the host-side argument rules of the kernel ops
 * moe_ll_pack and moe_ll_unpack (radix/kernel.h, ABI 1.4), written once for
 * every kernel backend so that each refuses the same calls with the same
 * words ("<who> moe_ll_pack: ...").  Header-only: plugins link no shared
 * code.
 *
 * row_lim: the largest row number (slot_of, order, back, counted in rows of
 * dim over all blocks) the backend's loops can take -- INT32_MAX on the
 * CPU, less on a GPU whose kernels step a block past the last row.
 *
 * What the device arrays hold (offsets, row, src, the received counts) is
 * not checked here: a GPU backend cannot read them without a copy to the
 * host.  kernels-cpu checks moe_sort's offsets and src itself. */
#ifndef RX_KERNELS_MOE_LL_ARGS_H
#define RX_KERNELS_MOE_LL_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#define RX_LL_NEED(cond, ...) \
    do { if (!(cond)) return rx_err_set (err, RX_EINVAL, __VA_ARGS__); } while (0)

/* The layout's sizes, common to pack and unpack: n_rank blocks of hrows +
 * slots rows of dim floats. */
static inline int rx_ll_layout_args (const char *who, const char *op, size_t n_rank, size_t slots,
                                     size_t hrows, size_t dim, size_t row_lim, struct rx_err *err)
{
    RX_LL_NEED (n_rank >= 1, "%s %s: n_rank is 0", who, op);
    RX_LL_NEED (hrows >= 1 && dim >= 1, "%s %s: hrows %zu and dim %zu must be >= 1 (the header holds the counts)",
                who, op, hrows, dim);
    RX_LL_NEED (slots <= row_lim / n_rank && hrows <= row_lim / n_rank - slots &&
                n_rank * (hrows + slots) <= SIZE_MAX / sizeof (float) / dim,
                "%s %s: %zu blocks of %zu + %zu rows do not fit int32 row numbers", who, op, n_rank, hrows,
                slots);
    return RX_OK;
}

static inline int rx_ll_pack_args (const char *who, const float *x, size_t ldx, const int32_t *ids,
                                   const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n_tok,
                                   size_t kk, size_t n_expert, size_t n_rank, size_t slots, size_t hrows,
                                   size_t dim, const float *send, const int32_t *slot_of, size_t row_lim,
                                   struct rx_err *err)
{
    RX_LL_NEED (n_expert >= 1 && n_expert < INT32_MAX, "%s moe_ll_pack: n_expert %zu (1..2^31-2)", who, n_expert);
    RX_LL_NEED (n_rank >= 1 && n_rank <= n_expert,
                "%s moe_ll_pack: n_rank %zu outside 1..n_expert (%zu): every rank owns at least one expert", who,
                n_rank, n_expert);
    RX_LL_NEED (kk >= 1, "%s moe_ll_pack: k is 0", who);
    int rc = rx_ll_layout_args (who, "moe_ll_pack", n_rank, slots, hrows, dim, row_lim, err);
    if (rc != RX_OK) return rc;
    RX_LL_NEED (n_tok <= slots / kk, "%s moe_ll_pack: %zu tokens x k = %zu choices exceed the %zu slots of a block",
                who, n_tok, kk, slots);
    const size_t most = (n_expert + n_rank - 1) / n_rank;
    RX_LL_NEED (hrows * dim >= most,
                "%s moe_ll_pack: a header of %zu x %zu int32 cannot hold the largest rank's %zu expert counts (%zu experts over %zu ranks)",
                who, hrows, dim, most, n_expert, n_rank);
    RX_LL_NEED (offsets && send, "%s moe_ll_pack: offsets or send is NULL (the headers are written even for n_tok 0)",
                who);
    RX_LL_NEED (n_tok == 0 || (x && ids && row && src && slot_of),
                "%s moe_ll_pack: x, ids, row, src or slot_of is NULL", who);
    RX_LL_NEED (n_tok == 0 || ldx >= dim, "%s moe_ll_pack: ldx = %zu is smaller than dim %zu", who, ldx, dim);
    return RX_OK;
}

static inline int rx_ll_unpack_args (const char *who, const float *recv, size_t n_rank, size_t slots, size_t hrows,
                                     size_t dim, size_t n_local, const int32_t *offsets, const int32_t *order,
                                     const int32_t *back, size_t row_lim, struct rx_err *err)
{
    int rc = rx_ll_layout_args (who, "moe_ll_unpack", n_rank, slots, hrows, dim, row_lim, err);
    if (rc != RX_OK) return rc;
    RX_LL_NEED (n_local >= 1 && n_local <= hrows * dim,
                "%s moe_ll_unpack: n_local %zu outside 1..%zu (the header's hrows x dim int32)", who, n_local,
                hrows * dim);
    RX_LL_NEED (recv && offsets && order && back, "%s moe_ll_unpack: recv, offsets, order or back is NULL", who);
    return RX_OK;
}

#undef RX_LL_NEED
#endif /* RX_KERNELS_MOE_LL_ARGS_H */
