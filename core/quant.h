/* core/quant.h -- GGML block layouts and scalar reference (de)quantization.
 *
 * The block structs are GGML's byte for byte (what GGUF files store), so a
 * pointer into an mmapped tensor can be cast to an array of them.  The
 * quantizers follow llama.cpp's reference quantizers (quantize_row_*_ref):
 * files written with rx_quantize_row are standard GGUF that llama.cpp reads,
 * and activations quantized here (Q8_0, Q8_K) give the same integers as
 * llama.cpp's, which the CPU kernels rely on to match reference logits.
 *
 * Depends on libc/libm only: this file is compiled into libradixcore and,
 * again, into kernels-cpu.so (plugins cannot link core symbols).
 * Thread-safety: every function is pure (no global state). */
#ifndef RX_QUANT_H
#define RX_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include <radix/dtype.h>
#include <radix/err.h>

#define RX_K_SCALE_SIZE 12

/* d is fp16 bits everywhere below (uint16_t), as in GGML. */
typedef struct { uint16_t d; int8_t q[32]; } rx_block_q8_0;                 /* 34 B */
typedef struct { uint16_t d; uint8_t q[16]; } rx_block_q4_0;                /* 18 B */
typedef struct { uint16_t d, m; uint8_t q[16]; } rx_block_q4_1;             /* 20 B */
typedef struct {                                                            /* 144 B */
    uint16_t d, dmin;
    uint8_t  scales[RX_K_SCALE_SIZE];   /* 8 x (6-bit scale, 6-bit min) */
    uint8_t  qs[RX_QK_K / 2];
} rx_block_q4_K;
typedef struct {                                                            /* 176 B */
    uint16_t d, dmin;
    uint8_t  scales[RX_K_SCALE_SIZE];
    uint8_t  qh[RX_QK_K / 8];           /* high bit of each quant */
    uint8_t  qs[RX_QK_K / 2];           /* low 4 bits */
} rx_block_q5_K;
typedef struct {                                                            /* 210 B */
    uint8_t  ql[RX_QK_K / 2];           /* low 4 bits */
    uint8_t  qh[RX_QK_K / 4];           /* high 2 bits */
    int8_t   scales[RX_QK_K / 16];      /* 8-bit signed scales */
    uint16_t d;
} rx_block_q6_K;
typedef struct {                                                            /* 292 B */
    float    d;                          /* f32, not f16 */
    int8_t   qs[RX_QK_K];
    int16_t  bsums[RX_QK_K / 16];       /* sum of qs in groups of 16 */
} rx_block_q8_K;

/* fp16 / bf16 <-> fp32.  fp16 conversion rounds to nearest even and handles
 * subnormals, inf and NaN; bf16 rounds to nearest even, NaN stays quiet NaN
 * (same as GGML's GGML_FP32_TO_BF16). */
uint16_t rx_fp32_to_fp16 (float f);
float    rx_fp16_to_fp32 (uint16_t h);
uint16_t rx_fp32_to_bf16 (float f);
float    rx_bf16_to_fp32 (uint16_t h);

/* 1 if rx_quantize_row / rx_dequantize_row handle type: F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_K.  0 otherwise. */
int rx_quant_supported (int type);

/* Quantize n floats from x into y (rx_dtype_row_bytes(type, n) bytes).
 * Returns the bytes written; 0 if type is unsupported, n is 0 or not a
 * multiple of the type's block, or x/y is NULL. */
size_t rx_quantize_row (int type, const float *x, void *y, size_t n);

/* Dequantize n elements of type from x into y.  RX_OK, or RX_EINVAL for an
 * unsupported type, n not a multiple of the block, or a NULL pointer. */
int rx_dequantize_row (int type, const void *x, float *y, size_t n);

/* Helpers the K-quant kernels share: unpack scale/min j (0..7) of a Q4_K /
 * Q5_K block's 12-byte scales field. */
static inline void rx_get_scale_min_k4 (int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t) ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t) ((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

#endif /* RX_QUANT_H */
