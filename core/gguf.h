/* core/gguf.h -- GGUF v2/v3 reader over mmap.
 *
 * rx_gguf_open maps the file and validates everything before returning:
 * magic, version, every count, string length, array length, value type,
 * tensor info (dims, type, offset, size, alignment) against the file size
 * with overflow checks.  A bad file gives one error naming the file and what
 * is wrong; never a crash.  After open, every getter is a bounds-safe read of
 * validated data.  Read-only after open: safe to share between threads. */
#ifndef RX_GGUF_H
#define RX_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include <radix/dtype.h>
#include <radix/err.h>

typedef struct rx_gguf rx_gguf_t;

/* GGUF metadata value types (file format values). */
enum rx_gguf_type {
    RX_GGUF_UINT8 = 0, RX_GGUF_INT8 = 1, RX_GGUF_UINT16 = 2, RX_GGUF_INT16 = 3,
    RX_GGUF_UINT32 = 4, RX_GGUF_INT32 = 5, RX_GGUF_FLOAT32 = 6, RX_GGUF_BOOL = 7,
    RX_GGUF_STRING = 8, RX_GGUF_ARRAY = 9, RX_GGUF_UINT64 = 10, RX_GGUF_INT64 = 11,
    RX_GGUF_FLOAT64 = 12
};

#define RX_GGUF_MAX_DIMS 4

struct rx_gguf_tensor {
    const char *name;                 /* NUL-terminated copy */
    int         type;                 /* enum rx_dtype */
    uint32_t    n_dims;
    uint64_t    ne[RX_GGUF_MAX_DIMS]; /* ne[0] contiguous; unused dims are 1 */
    uint64_t    n_elements;
    uint64_t    offset;               /* from the start of the data section */
    size_t      nbytes;
    const void *data;                 /* inside the mapping, aligned (to the
                                         file alignment, relative to the file
                                         start: mmap is page-aligned) */
};

/* Open and validate.  Caller owns the result; release with rx_gguf_close. */
rx_gguf_t *rx_gguf_open (const char *path, struct rx_err *err);
/* Same checks on a buffer (the fuzz harness); the buffer must outlive the
 * result.  name is used in messages. */
rx_gguf_t *rx_gguf_open_mem (const void *buf, size_t len, const char *name, struct rx_err *err);
void rx_gguf_close (rx_gguf_t **self_p);

const char *rx_gguf_path (const rx_gguf_t *g);
uint32_t    rx_gguf_version (const rx_gguf_t *g);
size_t      rx_gguf_alignment (const rx_gguf_t *g);
size_t      rx_gguf_file_size (const rx_gguf_t *g);

/* Metadata, by index or key. */
size_t      rx_gguf_kv_count (const rx_gguf_t *g);
const char *rx_gguf_kv_key (const rx_gguf_t *g, size_t i);
int         rx_gguf_kv_type (const rx_gguf_t *g, size_t i);       /* enum rx_gguf_type */
long        rx_gguf_find_key (const rx_gguf_t *g, const char *key); /* index or -1 */

/* Typed getters by key.  RX_ENOENT if absent; RX_EINVAL if the stored type
 * cannot represent the request (integers convert between widths when the
 * value fits; float accepts FLOAT32/FLOAT64).  An integer of the right kind
 * whose value does not fit the requested width (a negative value for an
 * unsigned getter, > UINT32_MAX for get_u32) gives RX_ERANGE. */
int rx_gguf_get_u32 (const rx_gguf_t *g, const char *key, uint32_t *out);
int rx_gguf_get_i64 (const rx_gguf_t *g, const char *key, int64_t *out);
int rx_gguf_get_u64 (const rx_gguf_t *g, const char *key, uint64_t *out);
int rx_gguf_get_f32 (const rx_gguf_t *g, const char *key, float *out);
int rx_gguf_get_bool (const rx_gguf_t *g, const char *key, int *out);
/* Strings are not NUL-terminated in GGUF: pointer + length into the map. */
int rx_gguf_get_str (const rx_gguf_t *g, const char *key, const char **s, size_t *len);

/* Arrays.  elem_type is enum rx_gguf_type of the elements. */
int rx_gguf_get_arr (const rx_gguf_t *g, const char *key, int *elem_type, size_t *n);
/* Numeric array data (little-endian, packed): pointer into the map. */
int rx_gguf_arr_data (const rx_gguf_t *g, const char *key, const void **data);
/* String array element i (random access through an index built at open);
 * RX_ERANGE if i >= the array length. */
int rx_gguf_arr_str (const rx_gguf_t *g, const char *key, size_t i, const char **s, size_t *len);

/* The encoded bytes of value i as the file stores them after its type field
 * (for ARRAY: element type, count, elements).  Lets a writer copy a value of
 * any type verbatim (core/gguf_writer.h: rx_gguf_writer_copy_kv). */
int rx_gguf_kv_raw (const rx_gguf_t *g, size_t i, const void **val, size_t *nbytes);
/* "uint32", "string", ... for an enum rx_gguf_type; "?" if unknown. */
const char *rx_gguf_type_name (int t);
/* Offset of the data section from the start of the file. */
size_t rx_gguf_data_offset (const rx_gguf_t *g);

/* Tensors. */
size_t rx_gguf_tensor_count (const rx_gguf_t *g);
const struct rx_gguf_tensor *rx_gguf_tensor (const rx_gguf_t *g, size_t i);
const struct rx_gguf_tensor *rx_gguf_find_tensor (const rx_gguf_t *g, const char *name);

#endif
