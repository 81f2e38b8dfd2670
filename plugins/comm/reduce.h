/* plugins/comm/reduce.h -- the element-wise reductions of the CPU comm
 * plugins (comm-shm, comm-zmq), header-only: plugins link no shared code.
 *
 * rx_red_pick (dtype, red) returns fn with fn (dst, src, n, cnt): dst[i] =
 * red over r = 0..n-1, IN THAT ORDER, of src[r][i] for i < cnt.  The fixed
 * order is what makes an all_reduce bitwise identical on every rank.  F16
 * and BF16 are reduced in float and rounded once (round to nearest even);
 * integer sums wrap.  Loads and stores go through memcpy, so the blocks may
 * sit at any byte offset (comm-zmq's are packed after headers); dst may be
 * one of the sources (the accumulator is a stack block). */
#ifndef RX_COMM_REDUCE_H
#define RX_COMM_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <radix/comm.h>
#include <radix/dtype.h>

#define RX_RED_BLK 512   /* elements per block of the stack accumulator */

static inline uint32_t rx_red_f2u (float f) { uint32_t u; memcpy (&u, &f, 4); return u; }
static inline float rx_red_u2f (uint32_t u) { float f; memcpy (&f, &u, 4); return f; }

/* IEEE half <-> float, round to nearest even (after Maratyszcza's FP16). */
static inline float rx_red_h2f (uint16_t h)
{
    uint32_t w = (uint32_t) h << 16, sign = w & 0x80000000u, two_w = w + w;
    float norm = rx_red_u2f ((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float den = rx_red_u2f ((two_w >> 17) | (126u << 23)) - 0.5f;
    return rx_red_u2f (sign | (two_w < (1u << 27) ? rx_red_f2u (den) : rx_red_f2u (norm)));
}

static inline uint16_t rx_red_f2h (float f)
{
    float base = (__builtin_fabsf (f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = rx_red_f2u (f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = rx_red_u2f ((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = rx_red_f2u (base);
    uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (uint16_t) ((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float rx_red_b2f (uint16_t b) { return rx_red_u2f ((uint32_t) b << 16); }

static inline uint16_t rx_red_f2b (float f)
{
    uint32_t u = rx_red_f2u (f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t) ((u >> 16) | 0x40);  /* quiet NaN */
    return (uint16_t) ((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

#define RX_RED_ID(x)       (x)
#define RX_RED_SUM(a, b)   ((a) + (b))
#define RX_RED_MAX(a, b)   ((b) > (a) ? (b) : (a))
#define RX_RED_MIN(a, b)   ((b) < (a) ? (b) : (a))
#define RX_RED_SUMU32(a, b) ((int32_t) ((uint32_t) (a) + (uint32_t) (b)))
#define RX_RED_SUMU64(a, b) ((int64_t) ((uint64_t) (a) + (uint64_t) (b)))

#define RX_RED_FN(NAME, T, A, LOAD, STORE, OP)                                  \
    static void NAME (void *dst, const void *const *src, int n, size_t cnt)     \
    {                                                                           \
        A acc[RX_RED_BLK];                                                      \
        T t;                                                                    \
        for (size_t b = 0; b < cnt; b += RX_RED_BLK) {                          \
            size_t m = cnt - b < RX_RED_BLK ? cnt - b : RX_RED_BLK;             \
            const unsigned char *s0 = (const unsigned char *) src[0] + b * sizeof t; \
            for (size_t i = 0; i < m; i++) {                                    \
                memcpy (&t, s0 + i * sizeof t, sizeof t);                       \
                acc[i] = LOAD (t);                                              \
            }                                                                   \
            for (int r = 1; r < n; r++) {                                       \
                const unsigned char *s = (const unsigned char *) src[r] + b * sizeof t; \
                for (size_t i = 0; i < m; i++) {                                \
                    memcpy (&t, s + i * sizeof t, sizeof t);                    \
                    A v = LOAD (t);                                             \
                    acc[i] = OP (acc[i], v);                                    \
                }                                                               \
            }                                                                   \
            unsigned char *d = (unsigned char *) dst + b * sizeof t;            \
            for (size_t i = 0; i < m; i++) {                                    \
                t = STORE (acc[i]);                                             \
                memcpy (d + i * sizeof t, &t, sizeof t);                        \
            }                                                                   \
        }                                                                       \
    }

RX_RED_FN (rx_red_f32_sum, float, float, RX_RED_ID, RX_RED_ID, RX_RED_SUM)
RX_RED_FN (rx_red_f32_max, float, float, RX_RED_ID, RX_RED_ID, RX_RED_MAX)
RX_RED_FN (rx_red_f32_min, float, float, RX_RED_ID, RX_RED_ID, RX_RED_MIN)
RX_RED_FN (rx_red_f16_sum, uint16_t, float, rx_red_h2f, rx_red_f2h, RX_RED_SUM)
RX_RED_FN (rx_red_f16_max, uint16_t, float, rx_red_h2f, rx_red_f2h, RX_RED_MAX)
RX_RED_FN (rx_red_f16_min, uint16_t, float, rx_red_h2f, rx_red_f2h, RX_RED_MIN)
RX_RED_FN (rx_red_bf16_sum, uint16_t, float, rx_red_b2f, rx_red_f2b, RX_RED_SUM)
RX_RED_FN (rx_red_bf16_max, uint16_t, float, rx_red_b2f, rx_red_f2b, RX_RED_MAX)
RX_RED_FN (rx_red_bf16_min, uint16_t, float, rx_red_b2f, rx_red_f2b, RX_RED_MIN)
RX_RED_FN (rx_red_i32_sum, int32_t, int32_t, RX_RED_ID, RX_RED_ID, RX_RED_SUMU32)
RX_RED_FN (rx_red_i32_max, int32_t, int32_t, RX_RED_ID, RX_RED_ID, RX_RED_MAX)
RX_RED_FN (rx_red_i32_min, int32_t, int32_t, RX_RED_ID, RX_RED_ID, RX_RED_MIN)
RX_RED_FN (rx_red_i64_sum, int64_t, int64_t, RX_RED_ID, RX_RED_ID, RX_RED_SUMU64)
RX_RED_FN (rx_red_i64_max, int64_t, int64_t, RX_RED_ID, RX_RED_ID, RX_RED_MAX)
RX_RED_FN (rx_red_i64_min, int64_t, int64_t, RX_RED_ID, RX_RED_ID, RX_RED_MIN)

typedef void (*rx_red_fn) (void *dst, const void *const *src, int n, size_t cnt);

/* NULL for a type or reduction the collectives do not take. */
static inline rx_red_fn rx_red_pick (int dtype, int red)
{
    static const rx_red_fn t[5][3] = {
        { rx_red_f32_sum, rx_red_f32_max, rx_red_f32_min },
        { rx_red_f16_sum, rx_red_f16_max, rx_red_f16_min },
        { rx_red_bf16_sum, rx_red_bf16_max, rx_red_bf16_min },
        { rx_red_i32_sum, rx_red_i32_max, rx_red_i32_min },
        { rx_red_i64_sum, rx_red_i64_max, rx_red_i64_min },
    };
    if (red < RX_COMM_SUM || red > RX_COMM_MIN) return NULL;
    switch (dtype) {
    case RX_F32: return t[0][red];
    case RX_F16: return t[1][red];
    case RX_BF16: return t[2][red];
    case RX_I32: return t[3][red];
    case RX_I64: return t[4][red];
    default: return NULL;
    }
}

#endif
