/* plugins/attention/common.h -- the config checks every attention backend
 * makes at create() (radix/attn.h), written once.  Header-only: plugins
 * link no shared code.
 *
 * rx_attn_check_scale_and_kv (who, k, cfg, &elt, err): the score scale,
 * softcap and window are sane, and the pool's element type is one the
 * kernel backend stores (F32, or F16 with RX_KCAP_KV_F16); *elt = its
 * size in bytes.  RX_EINVAL / RX_ENOTSUP with one line naming who. */
#ifndef RX_ATTN_COMMON_H
#define RX_ATTN_COMMON_H

#include <stddef.h>

#include <radix/attn.h>
#include <radix/dtype.h>
#include <radix/err.h>
#include <radix/kernel.h>

static inline int rx_attn_check_scale_and_kv (const char *who, const struct rx_kctx *k,
                                              const struct rx_attn_config *cfg, size_t *elt,
                                              struct rx_err *err)
{
    if (cfg->window < 0 || cfg->softcap < 0 || !(cfg->scale > 0))
        return rx_err_set (err, RX_EINVAL, "%s: bad scale %g, softcap %g or window %d", who,
                           (double) cfg->scale, (double) cfg->softcap, cfg->window);
    if (cfg->kv_dtype == RX_F32) {
        *elt = 4;
        return RX_OK;
    }
    if (cfg->kv_dtype == RX_F16) {
        struct rx_kernels_info ki = { .struct_size = sizeof ki };
        if (k->ops->info (k->be, &ki) != RX_OK || !(ki.caps & RX_KCAP_KV_F16))
            return rx_err_set (err, RX_ENOTSUP,
                               "%s: kv_dtype f16 is not supported by kernel backend \"%s\" (use f32)", who,
                               ki.name ? ki.name : "?");
        *elt = 2;
        return RX_OK;
    }
    return rx_err_set (err, RX_EINVAL, "%s: kv dtype %s is not supported (f32 or f16)", who,
                       rx_dtype_name (cfg->kv_dtype));
}

#endif
