/* radix/kernel.h -- the compute-kernel backend kind (RX_KIND_KERNELS).
 *
 * ABI: 1.0, being built (ops may still be appended before the first release;
 * nothing below is reordered or retyped once released).  One ops table for
 * every backend: kernels-cpu implements it today, kernels-cuda will
 * implement the same table later, so it speaks of *device* memory and
 * *streams* from the start.
 *
 * Memory model.
 *   - Every buffer an op reads or writes is a device pointer that came from
 *     alloc() of the same backend instance (or lies inside such a buffer).
 *     The core never dereferences a device pointer; it moves data with the
 *     copy ops.  Backends with RX_KCAP_HOST_VISIBLE (the CPU) hand out plain
 *     host memory, which lets tests look inside, but code must not rely on it
 *     ([kernels.cpu] guard_device_memory = true makes every host access to
 *     it outside an op crash, for tests: docs/gpu.md).
 *   - Index arrays (token ids, slots, positions, sequence offsets) are device
 *     buffers too (int32).  Counts the backend needs to size a launch (rows,
 *     n_seq, n_tokens) are host integers passed by value.
 *   - Activations are F32, row-major, with an explicit row count and a leading
 *     dimension ("ld", in elements) for every matrix, so ops work on views
 *     (one head of a packed QKV row, the rope part of an MLA head...).
 *   - Weights live behind opaque handles made by weight_load() from a host
 *     view of a GGUF tensor; they stay in their quantized form and the
 *     kernels compute on them directly.
 *
 * Streams and ordering.  Every op is enqueued on a stream (NULL = the
 * instance's default stream); ops on one stream run in order; results are
 * visible to the host after synchronize().  The CPU backend runs every op to
 * completion before returning (synchronous streams) and reports RX_KCAP_ASYNC
 * unset.  Errors of asynchronous work may surface at synchronize().
 *
 * Graphs (CUDA graphs).  begin_capture(key) .. end_capture() records the ops
 * issued on a stream as graph `key`; launch(key) replays it.  A backend
 * without RX_KCAP_GRAPHS answers begin_capture with RX_ENOTSUP, which means
 * "not captured: run the ops eagerly" -- the caller just keeps issuing ops
 * every step, has() is always 0 and launch() is RX_ENOTSUP.
 *
 * Thread-safety: create/destroy and the plugin's init are called from one
 * thread.  One backend instance is driven by one thread at a time (the
 * model runner of one scheduler rank); the backend may use its own worker
 * threads inside an op.  One exception: a host-side comm plugin (comm-shm's
 * progress thread) calls copy_h2d/copy_d2h/synchronize of the instance
 * while the driving thread issues other ops, so those three must allow
 * that (kernels-cpu: memmove; CUDA: async copies on the op's stream).
 * Different instances are independent.
 *
 * Errors: every int-returning function returns RX_OK or a negative
 * enum rx_status and fills *err (may be NULL) with one line naming the op and
 * what is wrong.  Shapes are checked; a bad argument is RX_EINVAL, never a
 * crash. */
#ifndef RADIX_KERNEL_H
#define RADIX_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include <radix/dtype.h>
#include <radix/err.h>
#include <radix/host.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rx_kstream rx_kstream_t;   /* opaque; NULL = default stream */
typedef struct rx_kweight rx_kweight_t;   /* opaque weight handle */

/* Parameters of create().  Fixed forever except by appending; struct_size
 * tells the backend which members the caller knows. */
struct rx_kernels_params {
    uint32_t struct_size;    /* sizeof (struct rx_kernels_params) */
    int32_t  threads;        /* worker threads; 0 = one per core ([kernels] threads) */
    int32_t  device;         /* device index (GPU ordinal) >= 0 ([kernels] device), or
                              * RX_KDEVICE_AUTO: rank modulo the device count (see
                              * rx_kernels_pick_device); 0 or auto for the CPU */
    /* -- appended -- */
    int32_t  rank;           /* this scheduler's index among the ranks of its host
                              * (dp_rank * tp_size + tp_rank); used by device = auto */
};

/* rx_kernels_params.device: pick by rank (SGLang: gpu_id = base_gpu_id + rank). */
#define RX_KDEVICE_AUTO (-1)

/* The device index create() should use with n_devices devices: p->device
 * when >= 0 (the backend checks it exists), else rank % n_devices (0 when
 * the caller predates the rank member).  p NULL: 0. */
static inline int32_t rx_kernels_pick_device (const struct rx_kernels_params *p, int32_t n_devices)
{
    if (!p || p->device >= 0) return p ? p->device : 0;
    int32_t rank = p->struct_size >= sizeof (struct rx_kernels_params) ? p->rank : 0;
    if (n_devices < 1 || rank < 0) return 0;
    return rank % n_devices;
}

/* Capability bits of rx_kernels_info.caps (append only). */
#define RX_KCAP_GRAPHS       (1u << 0)  /* begin_capture/launch really capture */
#define RX_KCAP_ASYNC        (1u << 1)  /* ops return before the work is done */
#define RX_KCAP_HOST_VISIBLE (1u << 2)  /* device pointers are host memory */
#define RX_KCAP_KV_F16       (1u << 3)  /* kv_store/attention accept RX_F16 pools */
#define RX_KCAP_WEIGHT_COPY  (1u << 4)  /* weight_load copies the view's data before it
                                         * returns: the caller may free a host copy it
                                         * made for the view (ABI 1.3) */

struct rx_kernels_info {
    uint32_t    struct_size;     /* set by the caller: sizeof as it knows it */
    const char *name;            /* backend name, "cpu" */
    char        device[128];     /* "x86-64 avx512 (2 threads)", "NVIDIA H100 80GB" */
    uint64_t    mem_bytes;       /* device memory (CPU: physical RAM) */
    uint64_t    caps;            /* RX_KCAP_* */
    int32_t     threads;         /* worker threads in use (CPU) */
    int32_t     reserved_;
    /* -- appended (filled when struct_size covers them) -- */
    uint64_t    mem_free;        /* device memory free now (CUDA: cudaMemGetInfo; CPU:
                                  * MemAvailable); 0 = unknown.  The engine sizes a
                                  * fractional [cache] kv_memory from it after the
                                  * weights are loaded (device backends) */
    int32_t     n_devices;       /* devices of this kind on the host (CPU: 1) */
    int32_t     device_index;    /* the device this instance runs on */
};

/* A host view of a GGUF tensor for weight_load().  data stays valid until
 * weight_free() (it points into the mmapped file), so a backend may keep it
 * instead of copying (zero copy) -- unless the backend reports
 * RX_KCAP_WEIGHT_COPY. */
struct rx_weight_view {
    const char *name;            /* for messages; may be NULL */
    int         dtype;           /* enum rx_dtype */
    uint32_t    n_dims;          /* 1..4 */
    uint64_t    ne[4];           /* ne[0] contiguous; unused dims are 1 */
    const void *data;            /* host pointer, GGML block layout */
    size_t      nbytes;          /* bytes at data (checked against ne/dtype) */
};

/* RoPE styles. */
enum rx_rope_mode {
    RX_ROPE_NORMAL = 0,          /* GGML "normal": rotate pairs (x[2i], x[2i+1]) */
    RX_ROPE_NEOX   = 2           /* NeoX: rotate (x[i], x[i + n_rot/2]) */
};

/* RoPE parameters, GGML's rope_ext semantics (YaRN included):
 * theta_i = pos * freq_base^(-2i/n_rot); YaRN blends interpolated
 * (theta*freq_scale) and extrapolated theta per dimension with ramp
 * [beta_fast, beta_slow] over n_ctx_orig, and scales cos/sin by attn_factor
 * (times 1 + 0.1 ln(1/freq_scale) where ext_factor != 0).  Plain RoPE:
 * freq_scale 1, ext_factor 0, attn_factor 1. */
struct rx_rope_params {
    uint32_t struct_size;        /* sizeof (struct rx_rope_params) */
    int32_t  mode;               /* enum rx_rope_mode */
    int32_t  n_rot;              /* rotated dims per head (even, <= head size) */
    int32_t  n_ctx_orig;         /* YaRN: original context length */
    float    freq_base;          /* e.g. 10000 */
    float    freq_scale;         /* 1 / context scaling factor */
    float    ext_factor;         /* YaRN extrapolation mix; 0 = off */
    float    attn_factor;        /* magnitude scale; 1 */
    float    beta_fast;          /* YaRN; 32 */
    float    beta_slow;          /* YaRN; 1 */
    const float *freq_factors;   /* device F32[n_rot/2] dividing each theta_i
                                  * (Llama 3 rope_freqs), or NULL */
};

/* One layer's paged KV pool: slot s of K holds n_kv_head rows of hd_k
 * elements ([n_slots][n_kv_head][hd_k]), likewise V with hd_v.  The pool
 * is device memory the core allocated with alloc(). */
struct rx_kv_pool {
    void    *k;
    void    *v;
    int32_t  dtype;              /* RX_F32; RX_F16 where RX_KCAP_KV_F16 */
    int32_t  n_kv_head;
    int32_t  hd_k;
    int32_t  hd_v;
    uint64_t n_slots;
};

/* A batch of sequences for attention.  Query rows of sequence i are
 * q_start[i] .. q_start[i+1]-1; its KV (positions 0..len-1, len =
 * kv_start[i+1]-kv_start[i]) sits in slots[kv_start[i] .. kv_start[i+1]-1];
 * q_pos[t] is the position of query row t within its sequence: it attends to
 * positions 0..q_pos[t] (causal), which must already be stored.  The arrays
 * are device int32 buffers; n_seq and n_tokens (= q_start[n_seq]) are host
 * copies for launch sizing. */
struct rx_attn_batch {
    int32_t        n_seq;
    int32_t        n_tokens;
    const int32_t *q_start;      /* [n_seq + 1] */
    const int32_t *kv_start;     /* [n_seq + 1] */
    const int32_t *slots;        /* [kv_start[n_seq]] */
    const int32_t *q_pos;        /* [n_tokens] */
};

struct rx_attn_params {
    uint32_t struct_size;        /* sizeof (struct rx_attn_params) */
    int32_t  n_head;             /* query heads; a multiple of the pool's n_kv_head */
    float    scale;              /* score scale, usually 1/sqrt(hd_k) */
    float    softcap;            /* 0 = none; else scores = softcap*tanh(s/softcap) */
    int32_t  window;             /* 0 = none; else attend to the last `window` positions */
    int32_t  reserved_;
};

/* matmul flags. */
#define RX_MM_ACCUMULATE (1u << 0)   /* Y += X W^T instead of Y = X W^T */

struct rx_kernels_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */

    /* -- instance -- */
    /* (required) host: the plugin's host table (log, its INI section via
     * cfg_*).  *be is the instance handed to every other call. */
    int  (*create) (const struct rx_host *host, const struct rx_kernels_params *p,
                    void **be, struct rx_err *err);
    /* (required) frees the instance and everything it still owns (buffers,
     * weights, streams).  NULL is a no-op. */
    void (*destroy) (void *be);
    /* (required) info->struct_size must be set by the caller. */
    int  (*info) (void *be, struct rx_kernels_info *info);

    /* -- device memory -- */
    /* (required) align: 0 (backend default, >= 64) or a power of two.
     * Memory is uninitialised. */
    int  (*alloc) (void *be, size_t bytes, size_t align, void **dptr, struct rx_err *err);
    /* (required) NULL is a no-op.  Waits for nothing: the caller must not
     * free memory that queued work still uses (synchronize first). */
    void (*free_) (void *be, void *dptr);
    /* (required) copies on a stream. */
    int  (*copy_h2d) (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                      struct rx_err *err);
    int  (*copy_d2h) (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                      struct rx_err *err);
    int  (*copy_d2d) (void *be, rx_kstream_t *s, void *dst, const void *src, size_t bytes,
                      struct rx_err *err);
    int  (*memset_) (void *be, rx_kstream_t *s, void *dst, int byte, size_t bytes,
                     struct rx_err *err);

    /* -- streams and graphs -- */
    /* (required) CPU: a token stream object; ops on it are synchronous. */
    int  (*stream_create) (void *be, rx_kstream_t **s, struct rx_err *err);
    void (*stream_destroy) (void *be, rx_kstream_t *s);
    int  (*synchronize) (void *be, rx_kstream_t *s, struct rx_err *err);
    /* (required) RX_ENOTSUP = not captured, run eagerly (see the header). */
    int  (*graph_begin) (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err);
    int  (*graph_end) (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err);
    int  (*graph_launch) (void *be, rx_kstream_t *s, uint64_t key, struct rx_err *err);
    /* 1 if graph key was captured and can be launched, else 0. */
    int  (*graph_has) (void *be, uint64_t key);

    /* -- weights -- */
    /* (required) make a weight from a host view (see rx_weight_view).  Any
     * dtype the backend cannot compute on is RX_ENOTSUP. */
    int  (*weight_load) (void *be, const struct rx_weight_view *v, rx_kweight_t **w,
                         struct rx_err *err);
    void (*weight_free) (void *be, rx_kweight_t *w);
    /* (required) the device pointer of an F32/F16/BF16 weight's elements in
     * GGUF order (norm weights, biases, routing bias); RX_ENOTSUP for a
     * quantized or repacked weight. */
    int  (*weight_data) (void *be, const rx_kweight_t *w, const void **dptr, struct rx_err *err);

    /* -- ops (all on a stream; x/y are device pointers) -- */

    /* (required) out[i][0..ne0) = dequantized row ids[i] of a 2-D weight
     * (embedding lookup); any weight dtype.  ids: device int32[n]. */
    int  (*get_rows) (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *ids,
                      size_t n, float *out, size_t ldo, struct rx_err *err);

    /* (required) y = x / sqrt(mean(x^2) + eps) * w per row of dim elements;
     * w: device F32[dim] or NULL (no weight).  y may equal x. */
    int  (*rms_norm) (void *be, rx_kstream_t *s, const float *x, size_t ldx, const float *w,
                      float *y, size_t ldy, size_t rows, size_t dim, float eps,
                      struct rx_err *err);

    /* (required) in place: for token t (row stride ldx) and head h (stride
     * ld_head), rotate the first n_rot elements of x + t*ldx + h*ld_head by
     * position pos[t] (device int32[n_tok]). */
    int  (*rope) (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t n_tok,
                  size_t n_head, size_t ld_head, const int32_t *pos,
                  const struct rx_rope_params *p, struct rx_err *err);

    /* (required) Y[n][out] = X[n][in] . W^T (flags RX_MM_ACCUMULATE: +=) for
     * W = [in, out] or one expert of W = [in, out, n_expert] (expert < 0 for a
     * 2-D weight).  n = 1 is the matvec (decode) path.  Quantized weights use
     * GGML's activation quantization (Q8_0 blocks for Q8_0/Q4_0/Q4_1, Q8_K
     * for K-quants), F16/BF16/F32 weights multiply F32 activations. */
    int  (*matmul) (void *be, rx_kstream_t *s, const rx_kweight_t *w, int expert,
                    const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                    uint32_t flags, struct rx_err *err);

    /* (required) out = silu(gate) * up, rows x dim. */
    int  (*swiglu) (void *be, rx_kstream_t *s, const float *gate, size_t ldg,
                    const float *up, size_t ldu, float *out, size_t ldo,
                    size_t rows, size_t dim, struct rx_err *err);

    /* (required) y = a + b / y = a * b elementwise, rows x dim.  ldb = 0
     * broadcasts b's first row to every row (a bias, a norm weight). */
    int  (*add) (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b,
                 size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err);
    int  (*mul) (void *be, rx_kstream_t *s, const float *a, size_t lda, const float *b,
                 size_t ldb, float *y, size_t ldy, size_t rows, size_t dim, struct rx_err *err);
    /* (required) y = alpha * x. */
    int  (*scale) (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy,
                   size_t rows, size_t dim, float alpha, struct rx_err *err);
    /* (required) in place, per row: x = softmax(scale * x). */
    int  (*softmax) (void *be, rx_kstream_t *s, float *x, size_t ldx, size_t rows, size_t dim,
                     float scale, struct rx_err *err);
    /* (required) y = 1 / (1 + exp(-x)). */
    int  (*sigmoid) (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y,
                     size_t ldy, size_t rows, size_t dim, struct rx_err *err);
    /* (required) strided copy of a rows x dim block (y and x do not overlap). */
    int  (*copy2d) (void *be, rx_kstream_t *s, const float *x, size_t ldx, float *y, size_t ldy,
                    size_t rows, size_t dim, struct rx_err *err);

    /* (required) out[r] = index of the largest x[r][.] (the lowest on ties). */
    int  (*argmax) (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows,
                    size_t dim, int32_t *out, struct rx_err *err);
    /* (required) the k largest of each row, descending (lower index first on
     * ties): vals[r*k + j], idx[r*k + j]; vals may be NULL.  1 <= k <= dim. */
    int  (*topk) (void *be, rx_kstream_t *s, const float *x, size_t ldx, size_t rows,
                  size_t dim, size_t k, float *vals, int32_t *idx, struct rx_err *err);

    /* (required) write n_tok new K/V rows into the pool: token t's K
     * (n_kv_head*hd_k values at k + t*ldk) goes to slot slots[t], same for V.
     * slots: device int32[n_tok], each < n_slots. */
    int  (*kv_store) (void *be, rx_kstream_t *s, const struct rx_kv_pool *pool,
                      const float *k, size_t ldk, const float *v, size_t ldv,
                      const int32_t *slots, size_t n_tok, struct rx_err *err);

    /* (required) causal attention over the paged pool: for query row t and
     * head h (q + t*ldq + h*hd_k, hd_k values), KV head h / (n_head/n_kv_head),
     * out + t*ldo + h*hd_v = softmax(scale * q.K^T) V over the sequence's
     * positions 0..q_pos[t]. */
    int  (*attention) (void *be, rx_kstream_t *s, const float *q, size_t ldq,
                       const struct rx_kv_pool *pool, const struct rx_attn_batch *b,
                       const struct rx_attn_params *p, float *out, size_t ldo,
                       struct rx_err *err);

    /* ---- ABI 1.0 ends here.  Append only below (optional members; check
     * with RX_HAS (struct rx_kernels_ops, ops, member)). ---- */

    /* (optional) mixture-of-experts routing of rows x n_expert scores, as
     * DeepSeek-V2/V3 route (model-deepseek2): sel (the selection scores --
     * probs plus a routing bias, or probs itself) chooses, probs weighs.
     * n_group > 1: the experts form n_group groups of n_expert / n_group; a
     * group scores the sum of its two best sel (its best alone when it has
     * one expert), the topk_group best groups are kept (the lower index on
     * ties), and the k best experts of the kept groups are chosen; n_group
     * <= 1: the k best of all.  The k best are in descending sel, the lower
     * index first on ties.  ids[r*k + j] = the j-th choice of row r,
     * w[r*k + j] = probs[r][that expert], divided by the k weights' sum
     * (summed in double) when norm, then times scale.  Rows of probs and
     * sel are ld floats apart.  All five arrays are device memory: a model
     * that needs no host copy of the choice (no expert recording, no
     * placement) routes without a synchronize. */
    int  (*moe_route) (void *be, rx_kstream_t *s, const float *probs, const float *sel, size_t ld,
                       size_t rows, size_t n_expert, size_t n_group, size_t topk_group, size_t k,
                       int norm, float scale, int32_t *ids, float *w, struct rx_err *err);

    /* -- appended in ABI 1.3: an MoE layer's expert pass on the device --
     * (optional, the four together: check RX_HAS (.., moe_combine)).  They
     * let a dispatcher and a model run an MoE layer on one rank without
     * copying the routing to the host (no synchronize, so a decode step
     * with MoE blocks can be captured as a graph): moe_sort orders the
     * choices by expert, gather_rows copies the token rows into that order,
     * matmul_grouped runs each expert over its rows, moe_combine sums the
     * weighted outputs back per token.  Every array is device memory; only
     * the sizes are host integers. */

    /* (optional) counting sort of n_tok x k expert choices by expert, stable
     * in (token, choice): ids is device int32 [n_tok][k].  Writes offsets
     * [n_expert + 1] (expert e's sorted rows are [offsets[e], offsets[e+1]),
     * offsets[0] = 0), row [n_tok*k] (row[t*k + j] = the sorted row of
     * choice j of token t) and src [n_tok*k] (src[r] = the token of sorted
     * row r).  A choice whose id is outside 0 .. n_expert-1 gets row -1 and
     * no sorted row, so offsets[n_expert] is the count of valid choices and
     * src is -1 from there on.  n_tok 0 writes offsets of zeros. */
    int  (*moe_sort) (void *be, rx_kstream_t *s, const int32_t *ids, size_t n_tok, size_t k,
                      size_t n_expert, int32_t *offsets, int32_t *row, int32_t *src,
                      struct rx_err *err);
    /* (optional) y[i][0..dim) = x[idx[i]][0..dim) for i < n (idx: device
     * int32 [n]); idx[i] < 0 writes a row of zeros.  y and x do not overlap.
     * The indices must be rows of x: not checked (device memory). */
    int  (*gather_rows) (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *idx,
                         size_t n, size_t dim, float *y, size_t ldy, struct rx_err *err);
    /* (optional) matmul of a 3-D weight W = [in, out, n_expert] over rows
     * sorted by expert: row i of x and y (i < n) is sorted row row0 + i,
     * which expert e runs when offsets[e] <= row0 + i < offsets[e+1]
     * (offsets: device int32 [n_expert + 1], nondecreasing, from moe_sort);
     * rows at or past offsets[n_expert] are not written.  Y[i] = X[i] W_e^T
     * (RX_MM_ACCUMULATE: +=) with matmul's numerics for that expert's rows
     * inside the window -- up to the kernel: kernels-cpu picks it by row
     * count as its matmul does (so an expert split over two windows may
     * differ in the last bits from one call over all its rows); kernels-
     * cuda runs its matvec for every n, which may differ in the last bits
     * from its matmul's GEMM path (within the matmul tolerance).  The offsets are trusted: the
     * CPU checks them, a GPU backend cannot without a copy to the host. */
    int  (*matmul_grouped) (void *be, rx_kstream_t *s, const rx_kweight_t *w, const int32_t *offsets,
                            size_t row0, const float *x, size_t ldx, float *y, size_t ldy, size_t n,
                            uint32_t flags, struct rx_err *err);
    /* (optional) for t < n_tok: acc = p_0, then acc = acc + p_j for j = 1 ..
     * k-1 in order, where p_j = w[t*k + j] * y[row[t*k + j]] rounded to
     * float (no fused multiply-add); out[t] = acc, or out[t] = out[t] + acc
     * with RX_MM_ACCUMULATE.  A choice with row < 0 is left out (a token with
     * none left gets zeros, or keeps out[t] with RX_MM_ACCUMULATE).  row and
     * w: device [n_tok][k], as moe_sort and the router wrote them (the
     * rows must be rows of y: not checked); dim columns; out does not
     * overlap y. */
    int  (*moe_combine) (void *be, rx_kstream_t *s, const float *y, size_t ldy, const int32_t *row,
                         const float *w, size_t n_tok, size_t k, size_t dim, float *out, size_t ldo,
                         uint32_t flags, struct rx_err *err);

    /* -- appended in ABI 1.4: host work ordered on a stream -- */
    /* (optional) enqueue fn(arg copy) on stream s, after the work issued
     * before it and before the work issued after it.  The backend copies
     * arg_bytes (<= RX_KHOST_FN_MAX_ARG) bytes of arg and hands fn a pointer
     * to its copy (aligned for any type).  During a graph capture it is
     * recorded instead: fn runs at every launch of the graph (with the copy
     * made at capture), not now.  On a synchronous backend (no
     * RX_KCAP_ASYNC) fn runs before host_fn returns (outside a capture) and
     * may call the backend's ops; on an asynchronous one it runs on a driver
     * thread and must not (CUDA's cudaLaunchHostFunc rule).  fn cannot
     * fail: it reports through its own state.  NULL fn or arg_bytes over
     * the limit (or a NULL arg with arg_bytes > 0): RX_EINVAL.  comm-shm
     * issues its blocking collectives through it so that a captured decode
     * step replays them (radix/comm.h graph_capturable).  kernels-cpu
     * implements it; kernels-cuda leaves it NULL (comm-nccl is captured by
     * CUDA natively; nothing else needs it there yet). */
    int  (*host_fn) (void *be, rx_kstream_t *s, void (*fn) (void *arg), const void *arg,
                     size_t arg_bytes, struct rx_err *err);

    /* -- appended in ABI 1.4: the low-latency expert-parallel exchange on
     * the device (optional, the two together: check RX_HAS (..,
     * moe_ll_unpack)).  DeepEP's low-latency layout: every peer gets a
     * fixed block of hrows + slots rows of dim floats every call, so the
     * exchange (one all_to_all_v of fixed counts each way) and everything
     * around it has the same shape and addresses every step and a decode
     * step with it can be captured as a graph; no count reaches the host.
     * Experts are split contiguously over n_rank ranks: rank p owns
     * [first(p), first(p+1)) with first(p) = p * n_expert / n_rank.  A block
     * is its header -- hrows rows holding rank p's expert counts as int32
     * bit patterns (count of expert first(p) + i at int32 index i), zeros
     * after them to the end of the header -- then up to `slots` rows. */

    /* (optional) the sending side, after moe_sort (offsets, row, src) of
     * ids [n_tok][k] over n_expert: block p = send + p * (hrows + slots) *
     * dim.  Writes every block's header; block p's row hrows + i, for i <
     * c_p = offsets[first(p+1)] - offsets[first(p)], is x[src[offsets[
     * first(p)] + i]] (dim floats of row ldx apart); rows from c_p on are
     * not written.  slot_of[t*k + j] = p * (hrows + slots) + hrows +
     * row[t*k + j] - offsets[first(p)] for the choice's rank p (the owner of
     * ids[t*k + j]), -1 where row[t*k + j] < 0: the row of send (counted in
     * rows of dim, headers included) that choice (t, j) left from, which is
     * where the reverse exchange brings its expert output back
     * (moe_combine's row).  n_tok 0 still writes every header (counts 0:
     * an idle rank takes part in the exchange); only offsets and send are
     * then read.  RX_EINVAL (checked on the host): n_tok * k > slots,
     * hrows * dim < the largest rank's expert count, n_rank 0 or above
     * n_expert. */
    int  (*moe_ll_pack) (void *be, rx_kstream_t *s, const float *x, size_t ldx, const int32_t *ids,
                         const int32_t *offsets, const int32_t *row, const int32_t *src, size_t n_tok,
                         size_t k, size_t n_expert, size_t n_rank, size_t slots, size_t hrows, size_t dim,
                         float *send, int32_t *slot_of, struct rx_err *err);
    /* (optional) the receiving side: recv holds n_rank blocks laid out as
     * moe_ll_pack writes them (block q from rank q), for this rank's
     * n_local experts (its header's first n_local counts).  The routed
     * rows are expert-major, rank-minor: expert e's rows are rank 0's rows
     * of e, then rank 1's, .. (rank q's rows of e start in block q after
     * its rows of the experts before e).  Writes offsets [n_local + 1]
     * (expert e's routed rows are [offsets[e], offsets[e+1])), order
     * [n_rank * slots] (order[r] = the recv row, counted in rows of dim,
     * headers included, of routed row r; -1 from offsets[n_local] on) and
     * back [n_rank * (hrows + slots)] (back[i] = the routed row of recv row
     * i; -1 for header rows and rows past a block's count) -- so
     * gather_rows (recv, order) makes the routed rows and gather_rows
     * (routed y, back) puts their outputs back in recv's layout.  Counts
     * cannot be checked (device memory): a negative one counts 0, and a
     * block's counts are cut where their sum passes slots.  RX_EINVAL:
     * n_local 0 or above hrows * dim; a backend may refuse (RX_ENOTSUP)
     * more n_rank x n_local counts than it can hold (kernels-cuda: (n_rank
     * + 1) x (n_local + 1) int32 in 96 KiB of shared memory). */
    int  (*moe_ll_unpack) (void *be, rx_kstream_t *s, const float *recv, size_t n_rank, size_t slots,
                           size_t hrows, size_t dim, size_t n_local, int32_t *offsets, int32_t *order,
                           int32_t *back, struct rx_err *err);
};

/* Largest argument copy host_fn takes, in bytes. */
#define RX_KHOST_FN_MAX_ARG 256

#define RX_KERNELS_OPS_SIZE_1_0 \
    (offsetof (struct rx_kernels_ops, attention) + sizeof (void *))

#ifdef __cplusplus
}
#endif
#endif /* RADIX_KERNEL_H */
