/* kernels/cpu/kern_avx2.c -- the AVX2 + FMA + F16C path (see kern_x86.inc). */
#if defined(__x86_64__)
#pragma GCC target ("avx2,fma,f16c")
#define S_AVX512 0
#include "kern_x86.inc"

const struct rx_kisa rx_kisa_avx2 = {
    .name = "avx2",
    .act_row_bytes = rx_kisa_act_row_bytes_ref,
    .act_quant = rx_kisa_act_quant_ref,
    .mm_supported = s_mm_supported,
    .mm = s_mm_ggml,
    .dot_f32 = s_vdot_f32,
    .dot_f16 = s_vdot_f16,
    .axpy_f32 = s_axpy_f32,
    .axpy_f16 = s_axpy_f16,
};
#endif
