/* kernels/cpu/isa.c -- see isa.h. */
#include <stdio.h>
#include <string.h>

#include "isa.h"

#if defined(__x86_64__)
static int s_has_avx2 (void)
{
    __builtin_cpu_init ();
    return __builtin_cpu_supports ("avx2") && __builtin_cpu_supports ("fma") &&
           __builtin_cpu_supports ("f16c");
}

static int s_has_avx512 (void)
{
    /* The AVX-512 path uses VNNI on 256/512-bit vectors (VL) and byte ops (BW). */
    return s_has_avx2 () && __builtin_cpu_supports ("avx512f") &&
           __builtin_cpu_supports ("avx512bw") && __builtin_cpu_supports ("avx512vl") &&
           __builtin_cpu_supports ("avx512vnni");
}
#endif

int rx_kisa_available (int id)
{
    switch (id) {
    case RX_ISA_SCALAR: return 1;
#if defined(__x86_64__)
    case RX_ISA_AVX2: return s_has_avx2 ();
    case RX_ISA_AVX512: return s_has_avx512 ();
#endif
    default: return 0;
    }
}

int rx_kisa_best (void)
{
    for (int id = RX_ISA_COUNT_ - 1; id > 0; id--)
        if (rx_kisa_available (id)) return id;
    return RX_ISA_SCALAR;
}

static const char *const s_names[RX_ISA_COUNT_] = { "scalar", "avx2", "avx512" };

int rx_kisa_from_name (const char *name, int *id, struct rx_err *err)
{
    if (!name || !*name || strcmp (name, "auto") == 0) {
        *id = rx_kisa_best ();
        return RX_OK;
    }
    for (int i = 0; i < RX_ISA_COUNT_; i++) {
        if (strcmp (name, s_names[i]) != 0) continue;
        if (!rx_kisa_available (i))
            return rx_err_set (err, RX_ENOTSUP, "kernels-cpu: isa = %s: this CPU lacks it "
                               "(has: %s)", name, rx_kisa_features ());
        *id = i;
        return RX_OK;
    }
    return rx_err_set (err, RX_EINVAL, "kernels-cpu: isa = %s: unknown (auto|scalar|avx2|avx512)",
                       name);
}

const struct rx_kisa *rx_kisa_get (int id)
{
    switch (id) {
    case RX_ISA_SCALAR: return &rx_kisa_scalar;
#if defined(__x86_64__)
    case RX_ISA_AVX2: return &rx_kisa_avx2;
    case RX_ISA_AVX512: return &rx_kisa_avx512;
#endif
    default: return NULL;
    }
}

const char *rx_kisa_features (void)
{
    static char buf[160];
#if defined(__x86_64__)
    static const char *const feats[] = { "avx2", "fma", "f16c", "avx512f", "avx512bw",
                                         "avx512vl", "avx512vnni", "avx512bf16" };
    size_t n = 0;
    buf[0] = '\0';
    __builtin_cpu_init ();
    for (size_t i = 0; i < sizeof feats / sizeof feats[0]; i++) {
        int has = 0;
        switch (i) {  /* __builtin_cpu_supports needs a literal */
        case 0: has = __builtin_cpu_supports ("avx2"); break;
        case 1: has = __builtin_cpu_supports ("fma"); break;
        case 2: has = __builtin_cpu_supports ("f16c"); break;
        case 3: has = __builtin_cpu_supports ("avx512f"); break;
        case 4: has = __builtin_cpu_supports ("avx512bw"); break;
        case 5: has = __builtin_cpu_supports ("avx512vl"); break;
        case 6: has = __builtin_cpu_supports ("avx512vnni"); break;
        case 7: has = __builtin_cpu_supports ("avx512bf16"); break;
        }
        if (has) n += (size_t) snprintf (buf + n, sizeof buf - n, "%s%s", n ? " " : "", feats[i]);
    }
    if (n == 0) snprintf (buf, sizeof buf, "x86-64 baseline");
#else
    snprintf (buf, sizeof buf, "portable C");
#endif
    return buf;
}
