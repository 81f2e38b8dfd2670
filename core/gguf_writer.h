/* core/gguf_writer.h -- write GGUF v3 files (little-endian).
 *
 * Use: create with the final path, add metadata and declare every tensor
 * (name, type, shape), then rx_gguf_writer_begin writes the header, the
 * metadata and the tensor infos; rx_gguf_writer_write streams the tensor
 * bytes in declaration order (any chunking: a row at a time is fine, so a
 * multi-GB model never has to sit in memory); rx_gguf_writer_finish checks
 * that every byte came, then renames the file into place.  The file is
 * written as "PATH.tmp" until finish, so a failed or abandoned write never
 * leaves a half file under PATH.
 *
 * Layout follows the GGUF spec as llama.cpp reads it: tensor data offsets are
 * consecutive, each tensor padded to the alignment (32 unless
 * rx_gguf_writer_set_alignment, which also writes general.alignment), and
 * the data section starts at the first aligned offset after the infos.
 * The same calls give the same bytes (no timestamps, no host data).
 *
 * Every function returns RX_OK or a negative rx_status with err set; a call
 * in the wrong phase (metadata after begin, write before begin...) is
 * RX_EINVAL.  Not thread-safe: one writer belongs to one thread. */
#ifndef RX_GGUF_WRITER_H
#define RX_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "gguf.h"

typedef struct rx_gguf_writer rx_gguf_writer_t;

/* path is copied.  Caller owns the result; release with
 * rx_gguf_writer_destroy (which removes the temporary file if the write was
 * not finished). */
rx_gguf_writer_t *rx_gguf_writer_new (const char *path, struct rx_err *err);
void rx_gguf_writer_destroy (rx_gguf_writer_t **self_p);

/* Power of two >= 1; adds general.alignment (uint32).  Before begin. */
int rx_gguf_writer_set_alignment (rx_gguf_writer_t *w, uint32_t alignment, struct rx_err *err);

/* Metadata, before begin.  Keys (1..65535 bytes, no NUL) must be unique:
 * a repeated key is RX_EINVAL.  Strings and arrays are copied. */
int rx_gguf_writer_add_u8   (rx_gguf_writer_t *w, const char *key, uint8_t v, struct rx_err *err);
int rx_gguf_writer_add_i8   (rx_gguf_writer_t *w, const char *key, int8_t v, struct rx_err *err);
int rx_gguf_writer_add_u16  (rx_gguf_writer_t *w, const char *key, uint16_t v, struct rx_err *err);
int rx_gguf_writer_add_i16  (rx_gguf_writer_t *w, const char *key, int16_t v, struct rx_err *err);
int rx_gguf_writer_add_u32  (rx_gguf_writer_t *w, const char *key, uint32_t v, struct rx_err *err);
int rx_gguf_writer_add_i32  (rx_gguf_writer_t *w, const char *key, int32_t v, struct rx_err *err);
int rx_gguf_writer_add_u64  (rx_gguf_writer_t *w, const char *key, uint64_t v, struct rx_err *err);
int rx_gguf_writer_add_i64  (rx_gguf_writer_t *w, const char *key, int64_t v, struct rx_err *err);
int rx_gguf_writer_add_f32  (rx_gguf_writer_t *w, const char *key, float v, struct rx_err *err);
int rx_gguf_writer_add_f64  (rx_gguf_writer_t *w, const char *key, double v, struct rx_err *err);
int rx_gguf_writer_add_bool (rx_gguf_writer_t *w, const char *key, int v, struct rx_err *err);
/* NUL-terminated string; add_strn for bytes that may contain NUL. */
int rx_gguf_writer_add_str  (rx_gguf_writer_t *w, const char *key, const char *s, struct rx_err *err);
int rx_gguf_writer_add_strn (rx_gguf_writer_t *w, const char *key, const char *s, size_t len,
                             struct rx_err *err);
/* Array of n numeric or bool elements (elem_type: enum rx_gguf_type, not
 * STRING/ARRAY); data holds them as C values of that width (bool: one byte
 * each, 0 or 1). */
int rx_gguf_writer_add_arr (rx_gguf_writer_t *w, const char *key, int elem_type, const void *data,
                            size_t n, struct rx_err *err);
/* Array of n strings; lens may be NULL (then each s[i] is NUL-terminated). */
int rx_gguf_writer_add_arr_str (rx_gguf_writer_t *w, const char *key, const char *const *s,
                                const size_t *lens, size_t n, struct rx_err *err);
/* Copy KV i of src verbatim (any type, arrays included). */
int rx_gguf_writer_copy_kv (rx_gguf_writer_t *w, const rx_gguf_t *src, size_t i, struct rx_err *err);

/* Declare a tensor, before begin.  name 1..64 bytes, unique; 1..4 dims,
 * each >= 1 (ggml order: ne[0] contiguous); type an enum rx_dtype whose size
 * radix knows, ne[0] a multiple of its block.  Data comes later through
 * rx_gguf_writer_write, in declaration order. */
int rx_gguf_writer_add_tensor (rx_gguf_writer_t *w, const char *name, int type, uint32_t n_dims,
                               const uint64_t *ne, struct rx_err *err);
/* Bytes of tensor i as declared (0 if no such tensor). */
size_t rx_gguf_writer_tensor_nbytes (const rx_gguf_writer_t *w, size_t i);

/* Write header, metadata and tensor infos. */
int rx_gguf_writer_begin (rx_gguf_writer_t *w, struct rx_err *err);
/* The next n bytes of tensor data (crossing tensor boundaries is allowed;
 * padding is inserted between tensors).  More bytes than declared: RX_EINVAL. */
int rx_gguf_writer_write (rx_gguf_writer_t *w, const void *data, size_t n, struct rx_err *err);
/* All data written?  Flush, close, rename to the final path. */
int rx_gguf_writer_finish (rx_gguf_writer_t *w, struct rx_err *err);

#endif
