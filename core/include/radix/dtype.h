/* radix/dtype.h -- element types of tensors and weights.
 *
 * ABI: stable since 1.0.  Values equal GGML's type ids (what GGUF files
 * store), so a tensor's type goes from file to kernel unchanged.  Quantized
 * types are stored in blocks: RX_DTYPE_BLOCK elements take RX_DTYPE_BYTES
 * bytes.  Block layouts are GGML's (see core/quant.h for the structs). */
#ifndef RADIX_DTYPE_H
#define RADIX_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rx_dtype {
    RX_F32  = 0,
    RX_F16  = 1,
    RX_Q4_0 = 2,
    RX_Q4_1 = 3,
    RX_Q5_0 = 6,
    RX_Q5_1 = 7,
    RX_Q8_0 = 8,
    RX_Q8_1 = 9,
    RX_Q2_K = 10,
    RX_Q3_K = 11,
    RX_Q4_K = 12,
    RX_Q5_K = 13,
    RX_Q6_K = 14,
    RX_Q8_K = 15,
    RX_I8   = 24,
    RX_I16  = 25,
    RX_I32  = 26,
    RX_I64  = 27,
    RX_F64  = 28,
    RX_BF16 = 30,
    RX_DTYPE_LIMIT_ = 40     /* not a type: ids are below this */
};

#define RX_QK4_0 32
#define RX_QK8_0 32
#define RX_QK_K  256

/* Elements per block (1 for plain types); 0 for an id radix does not know. */
static inline size_t rx_dtype_block (int t)
{
    switch (t) {
    case RX_F32: case RX_F16: case RX_BF16: case RX_I8: case RX_I16: case RX_I32:
    case RX_I64: case RX_F64:
        return 1;
    case RX_Q4_0: case RX_Q4_1: case RX_Q5_0: case RX_Q5_1: case RX_Q8_0: case RX_Q8_1:
        return 32;
    case RX_Q2_K: case RX_Q3_K: case RX_Q4_K: case RX_Q5_K: case RX_Q6_K: case RX_Q8_K:
        return RX_QK_K;
    default:
        return 0;
    }
}

/* Bytes per block; 0 for an unknown id. */
static inline size_t rx_dtype_bytes (int t)
{
    switch (t) {
    case RX_F32: return 4;
    case RX_F16: return 2;
    case RX_BF16: return 2;
    case RX_I8: return 1;
    case RX_I16: return 2;
    case RX_I32: return 4;
    case RX_I64: return 8;
    case RX_F64: return 8;
    case RX_Q4_0: return 2 + 16;
    case RX_Q4_1: return 2 + 2 + 16;
    case RX_Q5_0: return 2 + 4 + 16;
    case RX_Q5_1: return 2 + 2 + 4 + 16;
    case RX_Q8_0: return 2 + 32;
    case RX_Q8_1: return 4 + 32;
    case RX_Q2_K: return 256 / 16 + 256 / 4 + 2 + 2;
    case RX_Q3_K: return 256 / 8 + 256 / 4 + 12 + 2;
    case RX_Q4_K: return 2 + 2 + 12 + 256 / 2;
    case RX_Q5_K: return 2 + 2 + 12 + 256 / 8 + 256 / 2;
    case RX_Q6_K: return 256 / 2 + 256 / 4 + 256 / 16 + 2;
    case RX_Q8_K: return 4 + 256 + 256 / 16 * 2;
    default: return 0;
    }
}

/* Name as GGML prints it ("q4_K"); "?" for unknown ids. */
static inline const char *rx_dtype_name (int t)
{
    switch (t) {
    case RX_F32: return "f32";   case RX_F16: return "f16";   case RX_BF16: return "bf16";
    case RX_Q4_0: return "q4_0"; case RX_Q4_1: return "q4_1"; case RX_Q5_0: return "q5_0";
    case RX_Q5_1: return "q5_1"; case RX_Q8_0: return "q8_0"; case RX_Q8_1: return "q8_1";
    case RX_Q2_K: return "q2_K"; case RX_Q3_K: return "q3_K"; case RX_Q4_K: return "q4_K";
    case RX_Q5_K: return "q5_K"; case RX_Q6_K: return "q6_K"; case RX_Q8_K: return "q8_K";
    case RX_I8: return "i8";     case RX_I16: return "i16";   case RX_I32: return "i32";
    case RX_I64: return "i64";   case RX_F64: return "f64";
    default: return "?";
    }
}

/* Bytes of a row of n elements (n a multiple of the block), 0 if invalid. */
static inline size_t rx_dtype_row_bytes (int t, size_t n)
{
    size_t b = rx_dtype_block (t);
    if (b == 0 || n % b) return 0;
    return n / b * rx_dtype_bytes (t);
}

#ifdef __cplusplus
}
#endif
#endif /* RADIX_DTYPE_H */
