/* tests/cuemu/include/cuda_fp16.h -- cuemu's __half: IEEE binary16 bits
 * and the conversions kernels.cu uses, bit-exact (round to nearest even,
 * subnormals, inf; NaN -> the canonical 0x7fff).  C++ only. */
#ifndef RX_CUEMU_CUDA_FP16_H
#define RX_CUEMU_CUDA_FP16_H

#include <cstdint>
#include <cstring>

struct __half {
    unsigned short __x;
};
struct __half2 {
    __half x, y;
};

inline float __half2float (__half h)
{
    const uint32_t sign = (uint32_t) (h.__x & 0x8000u) << 16;
    const uint32_t exp = (h.__x >> 10) & 0x1fu, man = h.__x & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {   /* subnormal: normalise */
            int e = -1;
            uint32_t m = man;
            do { e++; m <<= 1; } while ((m & 0x400u) == 0);
            u = sign | ((uint32_t) (112 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    std::memcpy (&f, &u, 4);
    return f;
}

/* float -> binary16, round to nearest even (cvt.rn.f16.f32). */
inline __half __float2half_rn (float f)
{
    uint32_t u;
    std::memcpy (&u, &f, 4);
    const uint16_t sign = (uint16_t) ((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    uint16_t h;
    if (a > 0x7f800000u) {
        h = 0x7fffu;                       /* NaN */
        return __half { h };
    }
    if (a >= 0x477ff000u) {
        h = (uint16_t) (sign | 0x7c00u);   /* rounds to inf (or is inf) */
    } else if (a < 0x38800000u) {          /* half subnormal or zero */
        const int e = (int) (a >> 23);
        if (e < 102) {
            h = sign;                      /* < 2^-25: rounds to 0 */
        } else {
            const uint32_t m = (a & 0x7fffffu) | 0x800000u;
            const int shift = 126 - e;     /* 14..24: to units of 2^-24 */
            uint32_t q = m >> shift;
            const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
            if (rem > halfway || (rem == halfway && (q & 1))) q++;
            h = (uint16_t) (sign | q);
        }
    } else {
        uint32_t q = (a >> 13) - (112u << 10);
        const uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
        h = (uint16_t) (sign | q);
    }
    return __half { h };
}
inline __half __float2half (float f) { return __float2half_rn (f); }
inline unsigned short __half_as_ushort (__half h) { return h.__x; }
inline __half __ushort_as_half (unsigned short u) { return __half { u }; }
inline short __half_as_short (__half h) { return (short) h.__x; }
inline __half __short_as_half (short u) { return __half { (unsigned short) u }; }
inline float __low2float (__half2 h) { return __half2float (h.x); }
inline float __high2float (__half2 h) { return __half2float (h.y); }

#endif
