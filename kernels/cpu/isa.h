/* kernels/cpu/isa.h -- instruction-set paths of the CPU kernels and their
 * selection at run time.
 *
 * One kernels-cpu.so runs on any x86-64 (and other targets through the
 * scalar path): each SIMD path is compiled with function target attributes
 * and picked when the CPU has the features (or forced by the plugin's
 * `isa` INI key; a forced path the CPU lacks is an error, not a crash).
 *
 * A path is a table of matmul kernels plus the vector primitives attention
 * needs.  Each path owns the format of its quantized activations
 * (act_row_bytes/act_quant) and may repack weights into its own row layout
 * at load (repack*): the matmul driver only allocates and passes them along.
 * Row ops (norm, rope, softmax...) are portable C in ops.c. */
#ifndef RX_KISA_H
#define RX_KISA_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

/* The scalar path's activation block for Q8_0/Q4_0/Q4_1 weights: GGML's
 * Q8_0 numbers (d rounded through fp16, q = round-to-even(x * 127/amax))
 * plus the sum of q, which Q4_1 needs. */
typedef struct {
    float   d;
    int32_t s;
    int8_t  q[32];
} rx_q8a;

/* Quantize nb blocks of 32 floats into rx_q8a (every path uses this
 * rounding, so they all see the same integers). */
void rx_kisa_q8a_quant (const float *x, rx_q8a *y, size_t nb);

/* The scalar path's activation formats (rx_q8a for Q8_0/Q4_0/Q4_1,
 * rx_block_q8_K for K-quants), shared by the x86 paths. */
size_t rx_kisa_act_row_bytes_ref (int dtype, int repacked, size_t in);
void   rx_kisa_act_quant_ref (int dtype, int repacked, const float *x, void *dst, size_t in);

/* One matmul slice: Y[t][r] (+)= dot(W row r, X row t) for r in [r0, r1),
 * t in [0, n). */
struct rx_mm_job {
    int            dtype;        /* weight dtype */
    const uint8_t *w;            /* first row of the (expert) matrix */
    size_t         w_row_bytes;
    size_t         in;           /* elements per row */
    const uint8_t *xa;           /* activations: F32 rows or the path's format */
    size_t         xa_row_bytes;
    size_t         n;            /* activation rows */
    float         *y;
    size_t         ldy;
    int            accumulate;
    int            repacked;     /* rows are in the path's repacked layout */
    /* Scratch of mm_pack_bytes() bytes, 64-byte aligned, owned by the
     * calling thread for the duration of the call (NULL: none; the path
     * then uses its unpacked kernels). */
    void          *pack;
};

struct rx_kisa {
    const char *name;            /* "scalar", "avx2", "avx512" */
    /* Bytes of one quantized activation row for weight dtype (in elements)
     * and weight layout (repacked or GGML's); 0: the kernels read F32
     * activations directly. */
    size_t (*act_row_bytes) (int dtype, int repacked, size_t in);
    void   (*act_quant) (int dtype, int repacked, const float *x, void *dst, size_t in);
    /* 1 if mm handles dtype. */
    int    (*mm_supported) (int dtype);
    void   (*mm) (const struct rx_mm_job *j, size_t r0, size_t r1);
    /* Optional (NULL: 0).  Bytes of per-thread packing scratch mm wants
     * for a dtype x in x n product (0: none); mm then reads j->pack. */
    size_t (*mm_pack_bytes) (int dtype, size_t in, size_t n);
    /* Rows of a weight panel of the packed kernels: the driver's row
     * chunks are multiples of it (0: 16). */
    size_t mm_pack_rows;
    /* Optional (NULL: GGML layout only).  Bytes of one row of dtype in the
     * path's own layout, 0 if it keeps GGML's; repack rows; dequantize one
     * repacked row (embedding lookup). */
    size_t (*repack_row_bytes) (int dtype, size_t in);
    void   (*repack) (int dtype, const void *src, void *dst, size_t in, size_t rows);
    void   (*repacked_row) (int dtype, const void *row, float *y, size_t in);
    /* Vector primitives for attention (required): dot products and
     * y += a * x over F32 or F16 (KV pool) rows. */
    float (*dot_f32) (const float *a, const float *b, size_t n);
    float (*dot_f16) (const float *a, const uint16_t *b, size_t n);
    void  (*axpy_f32) (float *y, float a, const float *x, size_t n);
    void  (*axpy_f16) (float *y, float a, const uint16_t *x, size_t n);
    /* Optional (NULL: attention loops over the primitives above).  Rows
     * r_j = base + slots[j] * stride elements of dtype (F32 or F16 KV), for
     * nq query heads at once (each row is read once for all of them).
     * attn_scores: out[g * ldo + j] = dot(q + g * ldq, r_j[0..hk)).
     * attn_wsum:   (o + g * ldo)[0..hv) = sum_j p[g * ldp + j] * r_j[0..hv). */
    void  (*attn_scores) (const float *q, size_t ldq, size_t nq, const void *base, int dtype,
                          size_t stride, const int32_t *slots, size_t n, size_t hk, float *out,
                          size_t ldo);
    void  (*attn_wsum) (float *o, size_t ldo, const float *p, size_t ldp, size_t nq, const void *base,
                        int dtype, size_t stride, const int32_t *slots, size_t n, size_t hv);
    /* Optional: sc[0..n) = softmax(sc * scale), in place (no soft cap). */
    void  (*softmax) (float *sc, size_t n, float scale);
};

enum rx_isa_id { RX_ISA_SCALAR = 0, RX_ISA_AVX2 = 1, RX_ISA_AVX512 = 2, RX_ISA_COUNT_ };

/* The best path this CPU supports. */
int rx_kisa_best (void);
/* 1 if the CPU can run path id. */
int rx_kisa_available (int id);
/* id from "auto|scalar|avx2|avx512"; RX_EINVAL for an unknown name,
 * RX_ENOTSUP for a path this CPU (or this build) lacks. */
int rx_kisa_from_name (const char *name, int *id, struct rx_err *err);
const struct rx_kisa *rx_kisa_get (int id);
/* A short description of the CPU features seen ("avx2 fma f16c avx512f ..."). */
const char *rx_kisa_features (void);

/* The paths (kern_*.c). */
extern const struct rx_kisa rx_kisa_scalar;
#if defined(__x86_64__)
extern const struct rx_kisa rx_kisa_avx2;
extern const struct rx_kisa rx_kisa_avx512;
#endif

#endif
