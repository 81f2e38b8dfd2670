/* tests/cuemu/include/cuda_bf16.h -- cuemu's __nv_bfloat16: the high 16
 * bits of a float, and the conversions kernels.cu uses (round to nearest
 * even; NaN -> the canonical 0x7fff, as cvt.rn.bf16.f32).  C++ only. */
#ifndef RX_CUEMU_CUDA_BF16_H
#define RX_CUEMU_CUDA_BF16_H

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    unsigned short __x;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __bfloat162float (__nv_bfloat16 h)
{
    const uint32_t u = (uint32_t) h.__x << 16;
    float f;
    std::memcpy (&f, &u, 4);
    return f;
}

inline __nv_bfloat16 __float2bfloat16_rn (float f)
{
    uint32_t u;
    std::memcpy (&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16 { 0x7fffu };
    return __nv_bfloat16 { (unsigned short) ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) };
}
inline __nv_bfloat16 __float2bfloat16 (float f) { return __float2bfloat16_rn (f); }
inline unsigned short __bfloat16_as_ushort (__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16 (unsigned short u) { return __nv_bfloat16 { u }; }

#endif
