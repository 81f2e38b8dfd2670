/* core/gguf.c -- see gguf.h.
 *
 * The whole file is validated by one forward pass at open time (s_parse), so
 * the getters never look at an unchecked byte.  Rules, in the order the pass
 * meets them:
 *   - header: "GGUF" magic, version 2 or 3 (a byte-swapped version means a
 *     big-endian file, refused by name), tensor and KV counts that the bytes
 *     left could possibly hold (each KV needs >= 13 bytes, each tensor info
 *     >= 28), so a huge count fails before anything is allocated;
 *   - KV: key length <= 65535 (the spec's limit), no NUL inside, unique; value
 *     type known; every length and count checked against the bytes left with
 *     division (never multiplication, which could overflow); arrays of arrays
 *     are refused (no GGUF writer produces them and llama.cpp refuses them);
 *     bools are 0 or 1;
 *   - general.alignment, when present: UINT32, non-zero power of two;
 *   - tensor info: name 1..64 bytes (the spec's limit), unique; n_dims 1..4;
 *     each dim 1..INT64_MAX with an overflow-checked product; type known to
 *     radix; ne[0] a multiple of the type's block; offset a multiple of the
 *     alignment; offset + size inside the file; no two tensors overlap.
 * Every failure is one message "FILE: what (at offset N)" naming the tensor or
 * key concerned.  Allocations are bounded by the file size (counts are checked
 * before any array is sized by them). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"

#define GGUF_MAGIC          0x46554747u   /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGN  32
#define GGUF_MAX_KEY        65535
#define GGUF_MAX_NAME       64
#define GGUF_MIN_KV_BYTES   (8 + 1 + 4)                      /* key len, 1-byte key, type */
#define GGUF_MIN_TI_BYTES   (8 + 1 + 4 + 8 + 4 + 8)          /* name, n_dims, 1 dim, type, offset */

struct s_kv {
    char    *key;          /* NUL-terminated copy */
    int      type;         /* enum rx_gguf_type */
    size_t   val_off;      /* value bytes (after the type field) in the map */
    size_t   val_len;
    /* STRING: len and bytes at str_off; ARRAY: elements */
    size_t   str_off;
    uint64_t str_len;
    int      elem_type;
    uint64_t n;
    size_t   data_off;     /* first element */
    size_t  *elem_off;     /* STRING arrays: offset of each element's length field */
};

struct rx_gguf {
    char          *path;
    const uint8_t *base;
    size_t         size;
    int            mapped;
    uint32_t       version;
    size_t         alignment;
    size_t         data_off;

    struct s_kv   *kv;
    size_t         n_kv;
    size_t        *kv_index;       /* open-addressing hash: slot -> kv index + 1 */
    size_t         kv_index_cap;

    struct rx_gguf_tensor *t;
    size_t         n_t;
    size_t        *t_index;
    size_t         t_index_cap;
};

/* ------------------------------------------------------------- helpers -- */

static uint32_t s_le32 (const uint8_t *p)
{
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint64_t s_le64 (const uint8_t *p)
{
    return (uint64_t) s_le32 (p) | (uint64_t) s_le32 (p + 4) << 32;
}

static uint64_t s_hash (const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t) s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static size_t s_pow2_cap (size_t n)
{
    size_t cap = 8;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* Size of one scalar value of type t; 0 for STRING/ARRAY/unknown. */
static size_t s_scalar_size (uint32_t t)
{
    switch (t) {
    case RX_GGUF_UINT8: case RX_GGUF_INT8: case RX_GGUF_BOOL: return 1;
    case RX_GGUF_UINT16: case RX_GGUF_INT16: return 2;
    case RX_GGUF_UINT32: case RX_GGUF_INT32: case RX_GGUF_FLOAT32: return 4;
    case RX_GGUF_UINT64: case RX_GGUF_INT64: case RX_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *rx_gguf_type_name (int t)
{
    switch (t) {
    case RX_GGUF_UINT8: return "uint8";     case RX_GGUF_INT8: return "int8";
    case RX_GGUF_UINT16: return "uint16";   case RX_GGUF_INT16: return "int16";
    case RX_GGUF_UINT32: return "uint32";   case RX_GGUF_INT32: return "int32";
    case RX_GGUF_FLOAT32: return "float32"; case RX_GGUF_BOOL: return "bool";
    case RX_GGUF_STRING: return "string";   case RX_GGUF_ARRAY: return "array";
    case RX_GGUF_UINT64: return "uint64";   case RX_GGUF_INT64: return "int64";
    case RX_GGUF_FLOAT64: return "float64";
    default: return "?";
    }
}

/* --------------------------------------------------------------- parser -- */

struct s_cur {
    const uint8_t *p;
    size_t size, pos;
    const char *name;
    struct rx_err *err;
};

static size_t s_left (const struct s_cur *c) { return c->size - c->pos; }

#if defined(__GNUC__)
__attribute__ ((format (printf, 3, 4)))
#endif
static int s_fail (struct s_cur *c, size_t at, const char *fmt, ...)
{
    char what[RX_ERR_MSG_MAX];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (what, sizeof what, fmt, ap);
    va_end (ap);
    return rx_err_set (c->err, RX_EFORMAT, "%s: %s (at offset %zu)", c->name, what, at);
}

/* Ensure n more bytes; "what" names the field for the message. */
static int s_need (struct s_cur *c, uint64_t n, const char *what)
{
    if (n > s_left (c))
        return s_fail (c, c->pos, "truncated file: %s needs %llu bytes, %zu left", what,
                       (unsigned long long) n, s_left (c));
    return RX_OK;
}

static int s_u32 (struct s_cur *c, uint32_t *v, const char *what)
{
    int rc = s_need (c, 4, what);
    if (rc) return rc;
    *v = s_le32 (c->p + c->pos);
    c->pos += 4;
    return RX_OK;
}

static int s_u64 (struct s_cur *c, uint64_t *v, const char *what)
{
    int rc = s_need (c, 8, what);
    if (rc) return rc;
    *v = s_le64 (c->p + c->pos);
    c->pos += 8;
    return RX_OK;
}

/* A GGUF string: u64 length then bytes.  sets *off and *len; bounds-checked. */
static int s_str (struct s_cur *c, size_t *off, uint64_t *len, const char *what)
{
    size_t at = c->pos;
    int rc = s_u64 (c, len, what);
    if (rc) return rc;
    if (*len > s_left (c))
        return s_fail (c, at, "%s: string length %llu runs past the end of the file (%zu bytes left)",
                       what, (unsigned long long) *len, s_left (c));
    *off = c->pos;
    c->pos += (size_t) *len;
    return RX_OK;
}

static int s_kv_find_slot (const rx_gguf_t *g, const char *key, size_t len, size_t *slot)
{
    size_t mask = g->kv_index_cap - 1;
    size_t i = (size_t) s_hash (key, len) & mask;
    while (g->kv_index[i]) {
        const struct s_kv *kv = &g->kv[g->kv_index[i] - 1];
        if (strlen (kv->key) == len && memcmp (kv->key, key, len) == 0) {
            *slot = i;
            return 1;
        }
        i = (i + 1) & mask;
    }
    *slot = i;
    return 0;
}

static int s_t_find_slot (const rx_gguf_t *g, const char *name, size_t len, size_t *slot)
{
    size_t mask = g->t_index_cap - 1;
    size_t i = (size_t) s_hash (name, len) & mask;
    while (g->t_index[i]) {
        const struct rx_gguf_tensor *t = &g->t[g->t_index[i] - 1];
        if (strlen (t->name) == len && memcmp (t->name, name, len) == 0) {
            *slot = i;
            return 1;
        }
        i = (i + 1) & mask;
    }
    *slot = i;
    return 0;
}

static int s_parse_array (struct s_cur *c, struct s_kv *kv)
{
    size_t at = c->pos;
    uint32_t et;
    uint64_t n;
    int rc = s_u32 (c, &et, "array element type");
    if (rc) return rc;
    if (et == RX_GGUF_ARRAY)
        return s_fail (c, at, "key '%s': arrays of arrays are not supported", kv->key);
    if (et != RX_GGUF_STRING && s_scalar_size (et) == 0)
        return s_fail (c, at, "key '%s': unknown array element type %u", kv->key, et);
    at = c->pos;
    if ((rc = s_u64 (c, &n, "array length"))) return rc;
    kv->elem_type = (int) et;
    kv->n = n;
    kv->data_off = c->pos;
    if (et == RX_GGUF_STRING) {
        /* every element takes at least its 8-byte length: bound n first */
        if (n > s_left (c) / 8)
            return s_fail (c, at, "key '%s': array of %llu strings cannot fit in the %zu bytes left",
                           kv->key, (unsigned long long) n, s_left (c));
        kv->elem_off = malloc ((n ? n : 1) * sizeof *kv->elem_off);
        if (!kv->elem_off)
            return rx_err_set (c->err, RX_ENOMEM, "%s: out of memory for key '%s'", c->name, kv->key);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            kv->elem_off[i] = c->pos;
            at = c->pos;
            if ((rc = s_u64 (c, &len, "array string length"))) return rc;
            if (len > s_left (c))
                return s_fail (c, at, "key '%s': string %llu of the array has length %llu, past the end of the file",
                               kv->key, (unsigned long long) i, (unsigned long long) len);
            c->pos += (size_t) len;
        }
    } else {
        size_t es = s_scalar_size (et);
        if (n > s_left (c) / es)
            return s_fail (c, at, "key '%s': array of %llu %s values runs past the end of the file (%zu bytes left)",
                           kv->key, (unsigned long long) n, rx_gguf_type_name ((int) et), s_left (c));
        if (et == RX_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (c->p[c->pos + i] > 1)
                    return s_fail (c, c->pos + (size_t) i, "key '%s': bool element %llu is %u (not 0 or 1)",
                                   kv->key, (unsigned long long) i, c->p[c->pos + i]);
        c->pos += (size_t) n * es;
    }
    return RX_OK;
}

static int s_parse_kv (struct s_cur *c, rx_gguf_t *g, size_t idx)
{
    struct s_kv *kv = &g->kv[idx];
    size_t at = c->pos, off, slot;
    uint64_t len;
    uint32_t type;
    int rc = s_u64 (c, &len, "key length");
    if (rc) return rc;
    if (len == 0)
        return s_fail (c, at, "metadata key %zu is empty", idx);
    if (len > GGUF_MAX_KEY)
        return s_fail (c, at, "metadata key %zu has length %llu (the limit is %d)", idx,
                       (unsigned long long) len, GGUF_MAX_KEY);
    if (len > s_left (c))
        return s_fail (c, at, "truncated file: metadata key %zu has length %llu, %zu bytes left", idx,
                       (unsigned long long) len, s_left (c));
    off = c->pos;
    if (memchr (c->p + off, 0, (size_t) len))
        return s_fail (c, at, "metadata key %zu contains a NUL byte", idx);
    kv->key = strndup ((const char *) c->p + off, (size_t) len);
    if (!kv->key)
        return rx_err_set (c->err, RX_ENOMEM, "%s: out of memory", c->name);
    c->pos += (size_t) len;
    if (s_kv_find_slot (g, kv->key, (size_t) len, &slot))
        return s_fail (c, at, "duplicate metadata key '%s'", kv->key);
    at = c->pos;
    if ((rc = s_u32 (c, &type, "value type"))) return rc;
    if (type > RX_GGUF_FLOAT64)
        return s_fail (c, at, "key '%s': unknown value type %u", kv->key, type);
    kv->type = (int) type;
    kv->val_off = c->pos;
    if (type == RX_GGUF_STRING) {
        char what[96];
        snprintf (what, sizeof what, "key '%.80s'", kv->key);
        if ((rc = s_str (c, &kv->str_off, &kv->str_len, what))) return rc;
    } else if (type == RX_GGUF_ARRAY) {
        if ((rc = s_parse_array (c, kv))) return rc;
    } else {
        size_t es = s_scalar_size (type);
        if ((rc = s_need (c, es, kv->key))) return rc;
        if (type == RX_GGUF_BOOL && c->p[c->pos] > 1)
            return s_fail (c, c->pos, "key '%s': bool value is %u (not 0 or 1)", kv->key, c->p[c->pos]);
        c->pos += es;
    }
    kv->val_len = c->pos - kv->val_off;
    g->kv_index[slot] = idx + 1;
    return RX_OK;
}

static int s_parse_tensor (struct s_cur *c, rx_gguf_t *g, size_t idx)
{
    struct rx_gguf_tensor *t = &g->t[idx];
    size_t at = c->pos, off, slot;
    uint64_t len;
    uint32_t n_dims, type;
    int rc = s_str (c, &off, &len, "tensor name");
    if (rc) return rc;
    if (len == 0)
        return s_fail (c, at, "tensor %zu has an empty name", idx);
    if (len > GGUF_MAX_NAME)
        return s_fail (c, at, "tensor %zu: name is %llu bytes long (the limit is %d)", idx,
                       (unsigned long long) len, GGUF_MAX_NAME);
    if (memchr (c->p + off, 0, (size_t) len))
        return s_fail (c, at, "tensor %zu: name contains a NUL byte", idx);
    t->name = strndup ((const char *) c->p + off, (size_t) len);
    if (!t->name)
        return rx_err_set (c->err, RX_ENOMEM, "%s: out of memory", c->name);
    if (s_t_find_slot (g, t->name, (size_t) len, &slot))
        return s_fail (c, at, "duplicate tensor name '%s'", t->name);
    at = c->pos;
    if ((rc = s_u32 (c, &n_dims, "tensor n_dims"))) return rc;
    if (n_dims == 0 || n_dims > RX_GGUF_MAX_DIMS)
        return s_fail (c, at, "tensor '%s': n_dims is %u (must be 1..%d)", t->name, n_dims, RX_GGUF_MAX_DIMS);
    t->n_dims = n_dims;
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < RX_GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        at = c->pos;
        if (d < n_dims) {
            if ((rc = s_u64 (c, &ne, "tensor dimension"))) return rc;
            if (ne == 0)
                return s_fail (c, at, "tensor '%s': dimension %u is 0", t->name, d);
            if (ne > INT64_MAX)
                return s_fail (c, at, "tensor '%s': dimension %u is %llu (more than INT64_MAX)", t->name, d,
                               (unsigned long long) ne);
            if (n_el > (uint64_t) INT64_MAX / ne)
                return s_fail (c, at, "tensor '%s': element count overflows at dimension %u", t->name, d);
            n_el *= ne;
        }
        t->ne[d] = ne;
    }
    t->n_elements = n_el;
    at = c->pos;
    if ((rc = s_u32 (c, &type, "tensor type"))) return rc;
    size_t blk = rx_dtype_block ((int) type), bb = rx_dtype_bytes ((int) type);
    if (type >= RX_DTYPE_LIMIT_ || blk == 0 || bb == 0)
        return s_fail (c, at, "tensor '%s': unknown or unsupported type %u", t->name, type);
    t->type = (int) type;
    if (t->ne[0] % blk)
        return s_fail (c, at, "tensor '%s': row length %llu is not a multiple of the %s block size %zu",
                       t->name, (unsigned long long) t->ne[0], rx_dtype_name (t->type), blk);
    /* bytes = ne0/blk*bb * (n_el/ne0), overflow-checked */
    uint64_t row = t->ne[0] / blk * bb, rows = n_el / t->ne[0];
    if (rows && row > (uint64_t) SIZE_MAX / rows)
        return s_fail (c, at, "tensor '%s': byte size overflows", t->name);
    t->nbytes = (size_t) (row * rows);
    at = c->pos;
    if ((rc = s_u64 (c, &t->offset, "tensor offset"))) return rc;
    g->t_index[slot] = idx + 1;
    return RX_OK;
}

struct s_span { uint64_t off; size_t idx; };

static int s_cmp_span (const void *a, const void *b)
{
    uint64_t x = ((const struct s_span *) a)->off, y = ((const struct s_span *) b)->off;
    return x < y ? -1 : x > y;
}

static int s_parse (rx_gguf_t *g, struct rx_err *err)
{
    struct s_cur c = { .p = g->base, .size = g->size, .pos = 0, .name = g->path, .err = err };
    uint32_t magic, version;
    uint64_t n_t, n_kv;
    int rc;

    if (g->size < 4)
        return s_fail (&c, 0, "not a GGUF file: only %zu bytes", g->size);
    magic = s_le32 (g->base);
    if (magic != GGUF_MAGIC)
        return s_fail (&c, 0, "not a GGUF file: bad magic %02x %02x %02x %02x (expected \"GGUF\")",
                       g->base[0], g->base[1], g->base[2], g->base[3]);
    c.pos = 4;
    if ((rc = s_u32 (&c, &version, "version"))) return rc;
    if (version != 2 && version != 3) {
        uint32_t sw = __builtin_bswap32 (version);
        if (sw == 2 || sw == 3)
            return s_fail (&c, 4, "big-endian GGUF (version %u byte-swapped) is not supported", sw);
        if (version == 1)
            return s_fail (&c, 4, "GGUF version 1 is not supported (only versions 2 and 3)");
        return s_fail (&c, 4, "unsupported GGUF version %u (only versions 2 and 3)", version);
    }
    g->version = version;
    size_t at = c.pos;
    if ((rc = s_u64 (&c, &n_t, "tensor count"))) return rc;
    if ((rc = s_u64 (&c, &n_kv, "metadata count"))) return rc;
    if (n_kv > s_left (&c) / GGUF_MIN_KV_BYTES)
        return s_fail (&c, at + 8, "metadata count %llu cannot fit in the %zu bytes left",
                       (unsigned long long) n_kv, s_left (&c));
    if (n_t > s_left (&c) / GGUF_MIN_TI_BYTES)
        return s_fail (&c, at, "tensor count %llu cannot fit in the %zu bytes left",
                       (unsigned long long) n_t, s_left (&c));

    g->kv_index_cap = s_pow2_cap ((size_t) n_kv);
    g->kv = calloc (n_kv ? (size_t) n_kv : 1, sizeof *g->kv);
    g->kv_index = calloc (g->kv_index_cap, sizeof *g->kv_index);
    g->t_index_cap = s_pow2_cap ((size_t) n_t);
    g->t = calloc (n_t ? (size_t) n_t : 1, sizeof *g->t);
    g->t_index = calloc (g->t_index_cap, sizeof *g->t_index);
    if (!g->kv || !g->kv_index || !g->t || !g->t_index)
        return rx_err_set (err, RX_ENOMEM, "%s: out of memory", g->path);

    for (size_t i = 0; i < n_kv; i++) {
        rc = s_parse_kv (&c, g, i);
        g->n_kv = i + 1;   /* so close frees the partial entry */
        if (rc) return rc;
    }

    g->alignment = GGUF_DEFAULT_ALIGN;
    long ai = rx_gguf_find_key (g, "general.alignment");
    if (ai >= 0) {
        const struct s_kv *kv = &g->kv[ai];
        if (kv->type != RX_GGUF_UINT32)
            return s_fail (&c, kv->val_off, "general.alignment has type %s (must be uint32)",
                           rx_gguf_type_name (kv->type));
        uint32_t a = s_le32 (g->base + kv->val_off);
        if (a == 0 || (a & (a - 1)))
            return s_fail (&c, kv->val_off, "general.alignment is %u (must be a non-zero power of two)", a);
        g->alignment = a;
    }

    for (size_t i = 0; i < n_t; i++) {
        rc = s_parse_tensor (&c, g, i);
        g->n_t = i + 1;
        if (rc) return rc;
    }

    /* The data section starts at the next multiple of the alignment. A file
     * without tensors (a vocabulary) may end without that padding. */
    size_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_off = c.pos + pad;
    if (n_t == 0) {
        if (g->data_off > g->size) g->data_off = g->size;
        return RX_OK;
    }
    if (pad > s_left (&c))
        return s_fail (&c, c.pos, "truncated file: the data section should start at offset %zu, file has %zu bytes",
                       g->data_off, g->size);
    size_t data_size = g->size - g->data_off;
    for (size_t i = 0; i < g->n_t; i++) {
        struct rx_gguf_tensor *t = &g->t[i];
        if (t->offset % g->alignment)
            return s_fail (&c, g->data_off, "tensor '%s': data offset %llu is not a multiple of the alignment %zu",
                           t->name, (unsigned long long) t->offset, g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return s_fail (&c, g->data_off, "tensor '%s': data [%llu, +%zu) runs past the end of the file "
                           "(data section has %zu bytes)", t->name, (unsigned long long) t->offset,
                           t->nbytes, data_size);
        t->data = g->base + g->data_off + t->offset;
    }
    /* no two tensors may share bytes */
    struct s_span *ord = malloc (g->n_t * sizeof *ord);
    if (!ord) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", g->path);
    for (size_t i = 0; i < g->n_t; i++) ord[i] = (struct s_span) { g->t[i].offset, i };
    qsort (ord, g->n_t, sizeof *ord, s_cmp_span);
    rc = RX_OK;
    for (size_t i = 1; i < g->n_t; i++) {
        const struct rx_gguf_tensor *a = &g->t[ord[i - 1].idx], *b = &g->t[ord[i].idx];
        if (a->offset + a->nbytes > b->offset) {
            rc = s_fail (&c, g->data_off, "tensors '%s' and '%s' overlap (offsets %llu+%zu and %llu)",
                         a->name, b->name, (unsigned long long) a->offset, a->nbytes,
                         (unsigned long long) b->offset);
            break;
        }
    }
    free (ord);
    return rc;
}

/* ---------------------------------------------------------------- public -- */

static rx_gguf_t *s_new (const char *name, struct rx_err *err)
{
    rx_gguf_t *g = calloc (1, sizeof *g);
    if (g) g->path = strdup (name ? name : "(buffer)");
    if (!g || !g->path) {
        free (g);
        rx_err_set (err, RX_ENOMEM, "%s: out of memory", name ? name : "(buffer)");
        return NULL;
    }
    return g;
}

rx_gguf_t *rx_gguf_open_mem (const void *buf, size_t len, const char *name, struct rx_err *err)
{
    static const uint8_t empty[1];
    rx_gguf_t *g = s_new (name, err);
    if (!g) return NULL;
    g->base = buf ? buf : empty;
    g->size = buf ? len : 0;
    if (s_parse (g, err) != RX_OK) {
        rx_gguf_close (&g);
        return NULL;
    }
    return g;
}

rx_gguf_t *rx_gguf_open (const char *path, struct rx_err *err)
{
    static const uint8_t empty[1];
    struct stat st;
    int fd = open (path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rx_err_set (err, errno == ENOENT ? RX_ENOENT : RX_EIO, "%s: cannot open: %s", path, strerror (errno));
        return NULL;
    }
    if (fstat (fd, &st) != 0) {
        rx_err_set (err, RX_EIO, "%s: cannot stat: %s", path, strerror (errno));
        close (fd);
        return NULL;
    }
    if (!S_ISREG (st.st_mode)) {
        rx_err_set (err, RX_EINVAL, "%s: not a regular file", path);
        close (fd);
        return NULL;
    }
    rx_gguf_t *g = s_new (path, err);
    if (!g) {
        close (fd);
        return NULL;
    }
    g->size = (size_t) st.st_size;
    if (g->size == 0) {
        g->base = empty;
    } else {
        void *m = mmap (NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rx_err_set (err, RX_EIO, "%s: cannot map %zu bytes: %s", path, g->size, strerror (errno));
            close (fd);
            g->size = 0;
            rx_gguf_close (&g);
            return NULL;
        }
        g->base = m;
        g->mapped = 1;
    }
    close (fd);
    if (s_parse (g, err) != RX_OK) {
        rx_gguf_close (&g);
        return NULL;
    }
    return g;
}

void rx_gguf_close (rx_gguf_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_gguf_t *g = *self_p;
    for (size_t i = 0; i < g->n_kv; i++) {
        free (g->kv[i].key);
        free (g->kv[i].elem_off);
    }
    for (size_t i = 0; i < g->n_t; i++)
        free ((char *) g->t[i].name);
    free (g->kv);
    free (g->kv_index);
    free (g->t);
    free (g->t_index);
    if (g->mapped) munmap ((void *) g->base, g->size);
    free (g->path);
    free (g);
    *self_p = NULL;
}

const char *rx_gguf_path (const rx_gguf_t *g) { return g->path; }
uint32_t rx_gguf_version (const rx_gguf_t *g) { return g->version; }
size_t rx_gguf_alignment (const rx_gguf_t *g) { return g->alignment; }
size_t rx_gguf_file_size (const rx_gguf_t *g) { return g->size; }
size_t rx_gguf_data_offset (const rx_gguf_t *g) { return g->data_off; }

size_t rx_gguf_kv_count (const rx_gguf_t *g) { return g->n_kv; }

const char *rx_gguf_kv_key (const rx_gguf_t *g, size_t i)
{
    return i < g->n_kv ? g->kv[i].key : NULL;
}

int rx_gguf_kv_type (const rx_gguf_t *g, size_t i)
{
    return i < g->n_kv ? g->kv[i].type : -1;
}

int rx_gguf_kv_raw (const rx_gguf_t *g, size_t i, const void **val, size_t *nbytes)
{
    if (i >= g->n_kv) return RX_ENOENT;
    if (val) *val = g->base + g->kv[i].val_off;
    if (nbytes) *nbytes = g->kv[i].val_len;
    return RX_OK;
}

long rx_gguf_find_key (const rx_gguf_t *g, const char *key)
{
    size_t slot;
    if (!key || !g->kv_index) return -1;
    if (!s_kv_find_slot (g, key, strlen (key), &slot)) return -1;
    return (long) g->kv_index[slot] - 1;
}

static const struct s_kv *s_kv_get (const rx_gguf_t *g, const char *key)
{
    long i = rx_gguf_find_key (g, key);
    return i < 0 ? NULL : &g->kv[i];
}

/* Integer value of an integer-typed KV: *neg set when negative. */
static int s_kv_int (const rx_gguf_t *g, const struct s_kv *kv, uint64_t *mag, int *neg)
{
    const uint8_t *p = g->base + kv->val_off;
    int64_t s;
    *neg = 0;
    switch (kv->type) {
    case RX_GGUF_UINT8:  *mag = p[0]; return RX_OK;
    case RX_GGUF_UINT16: *mag = (uint16_t) (p[0] | p[1] << 8); return RX_OK;
    case RX_GGUF_UINT32: *mag = s_le32 (p); return RX_OK;
    case RX_GGUF_UINT64: *mag = s_le64 (p); return RX_OK;
    case RX_GGUF_INT8:   s = (int8_t) p[0]; break;
    case RX_GGUF_INT16:  s = (int16_t) (uint16_t) (p[0] | p[1] << 8); break;
    case RX_GGUF_INT32:  s = (int32_t) s_le32 (p); break;
    case RX_GGUF_INT64:  s = (int64_t) s_le64 (p); break;
    default: return RX_EINVAL;
    }
    if (s < 0) {
        *neg = 1;
        *mag = (uint64_t) 0 - (uint64_t) s;
    } else {
        *mag = (uint64_t) s;
    }
    return RX_OK;
}

int rx_gguf_get_u64 (const rx_gguf_t *g, const char *key, uint64_t *out)
{
    const struct s_kv *kv = s_kv_get (g, key);
    uint64_t m;
    int neg;
    if (!kv) return RX_ENOENT;
    if (s_kv_int (g, kv, &m, &neg)) return RX_EINVAL;
    if (neg) return RX_ERANGE;
    *out = m;
    return RX_OK;
}

int rx_gguf_get_u32 (const rx_gguf_t *g, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = rx_gguf_get_u64 (g, key, &v);
    if (rc) return rc;
    if (v > UINT32_MAX) return RX_ERANGE;
    *out = (uint32_t) v;
    return RX_OK;
}

int rx_gguf_get_i64 (const rx_gguf_t *g, const char *key, int64_t *out)
{
    const struct s_kv *kv = s_kv_get (g, key);
    uint64_t m;
    int neg;
    if (!kv) return RX_ENOENT;
    if (s_kv_int (g, kv, &m, &neg)) return RX_EINVAL;
    if (neg) {
        if (m > (uint64_t) INT64_MAX + 1) return RX_ERANGE;
        *out = m == (uint64_t) INT64_MAX + 1 ? INT64_MIN : -(int64_t) m;
    } else {
        if (m > (uint64_t) INT64_MAX) return RX_ERANGE;
        *out = (int64_t) m;
    }
    return RX_OK;
}

int rx_gguf_get_f32 (const rx_gguf_t *g, const char *key, float *out)
{
    const struct s_kv *kv = s_kv_get (g, key);
    if (!kv) return RX_ENOENT;
    const uint8_t *p = g->base + kv->val_off;
    if (kv->type == RX_GGUF_FLOAT32) {
        uint32_t u = s_le32 (p);
        memcpy (out, &u, 4);
    } else if (kv->type == RX_GGUF_FLOAT64) {
        uint64_t u = s_le64 (p);
        double d;
        memcpy (&d, &u, 8);
        *out = (float) d;
    } else {
        return RX_EINVAL;
    }
    return RX_OK;
}

int rx_gguf_get_bool (const rx_gguf_t *g, const char *key, int *out)
{
    const struct s_kv *kv = s_kv_get (g, key);
    if (!kv) return RX_ENOENT;
    if (kv->type != RX_GGUF_BOOL) return RX_EINVAL;
    *out = g->base[kv->val_off] != 0;
    return RX_OK;
}

int rx_gguf_get_str (const rx_gguf_t *g, const char *key, const char **s, size_t *len)
{
    const struct s_kv *kv = s_kv_get (g, key);
    if (!kv) return RX_ENOENT;
    if (kv->type != RX_GGUF_STRING) return RX_EINVAL;
    *s = (const char *) g->base + kv->str_off;
    *len = (size_t) kv->str_len;
    return RX_OK;
}

int rx_gguf_get_arr (const rx_gguf_t *g, const char *key, int *elem_type, size_t *n)
{
    const struct s_kv *kv = s_kv_get (g, key);
    if (!kv) return RX_ENOENT;
    if (kv->type != RX_GGUF_ARRAY) return RX_EINVAL;
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = (size_t) kv->n;
    return RX_OK;
}

int rx_gguf_arr_data (const rx_gguf_t *g, const char *key, const void **data)
{
    const struct s_kv *kv = s_kv_get (g, key);
    if (!kv) return RX_ENOENT;
    if (kv->type != RX_GGUF_ARRAY || kv->elem_type == RX_GGUF_STRING) return RX_EINVAL;
    *data = g->base + kv->data_off;
    return RX_OK;
}

int rx_gguf_arr_str (const rx_gguf_t *g, const char *key, size_t i, const char **s, size_t *len)
{
    const struct s_kv *kv = s_kv_get (g, key);
    if (!kv) return RX_ENOENT;
    if (kv->type != RX_GGUF_ARRAY || kv->elem_type != RX_GGUF_STRING) return RX_EINVAL;
    if (i >= kv->n) return RX_ERANGE;
    size_t off = kv->elem_off[i];
    *len = (size_t) s_le64 (g->base + off);
    *s = (const char *) g->base + off + 8;
    return RX_OK;
}

size_t rx_gguf_tensor_count (const rx_gguf_t *g) { return g->n_t; }

const struct rx_gguf_tensor *rx_gguf_tensor (const rx_gguf_t *g, size_t i)
{
    return i < g->n_t ? &g->t[i] : NULL;
}

const struct rx_gguf_tensor *rx_gguf_find_tensor (const rx_gguf_t *g, const char *name)
{
    size_t slot;
    if (!name || !g->t_index) return NULL;
    if (!s_t_find_slot (g, name, strlen (name), &slot)) return NULL;
    return &g->t[g->t_index[slot] - 1];
}
