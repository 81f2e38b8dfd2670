/* tests/cuemu/include/vector_types.h -- cuemu's stand-in for CUDA's
 * vector_types.h: uint3 and dim3 (the other vector types kernels use are
 * in tests/cuemu/cuemu.h).  C and C++. */
#ifndef CUEMU_VECTOR_TYPES_H
#define CUEMU_VECTOR_TYPES_H

struct uint3 {
    unsigned int x, y, z;
};
typedef struct uint3 uint3;

/* A launch shape; unset members are 1, as in CUDA. */
struct dim3 {
    unsigned int x, y, z;
#ifdef __cplusplus
    constexpr dim3 (unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x (vx), y (vy), z (vz) {}
    constexpr dim3 (uint3 v) : x (v.x), y (v.y), z (v.z) {}
    constexpr operator uint3 () const { return uint3{ x, y, z }; }
#endif
};
typedef struct dim3 dim3;

#endif
