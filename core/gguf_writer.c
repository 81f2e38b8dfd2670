/* core/gguf_writer.c -- see gguf_writer.h.
 *
 * Metadata is serialized into one growing buffer as it is added (the file
 * encoding exactly), so begin only has to write the fixed header, that
 * buffer and the tensor infos.  GGUF is little-endian; radix only targets
 * little-endian hosts, and the build refuses others below rather than write
 * files no reader could use. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_writer.c writes host-order values: port it before using it on a big-endian host"
#endif

#define W_VERSION   3
#define W_MAX_KEY   65535
#define W_MAX_NAME  64

struct s_tensor {
    char    *name;
    int      type;
    uint32_t n_dims;
    uint64_t ne[RX_GGUF_MAX_DIMS];
    size_t   nbytes;
    uint64_t offset;
};

struct rx_gguf_writer {
    char    *path, *tmp;
    uint32_t alignment;
    /* metadata in file encoding */
    uint8_t *kv;
    size_t   kv_len, kv_cap;
    char   **keys;
    size_t   n_keys, keys_cap;
    /* tensors */
    struct s_tensor *t;
    size_t   n_t, t_cap;
    /* writing */
    FILE    *f;
    int      phase;            /* 0 declaring, 1 writing data, 2 finished, -1 failed */
    size_t   cur;              /* tensor being written */
    size_t   cur_done;         /* bytes of it written */
};

/* ---------------------------------------------------------------- buffer -- */

static int s_grow (rx_gguf_writer_t *w, size_t more, struct rx_err *err)
{
    if (more > SIZE_MAX - w->kv_len)
        return rx_err_set (err, RX_ENOMEM, "%s: metadata too large", w->path);
    if (w->kv_len + more <= w->kv_cap) return RX_OK;
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < w->kv_len + more) cap *= 2;
    uint8_t *p = realloc (w->kv, cap);
    if (!p) return rx_err_set (err, RX_ENOMEM, "%s: out of memory for metadata", w->path);
    w->kv = p;
    w->kv_cap = cap;
    return RX_OK;
}

static void s_put (rx_gguf_writer_t *w, const void *p, size_t n)
{
    if (n) memcpy (w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

static void s_put_u32 (rx_gguf_writer_t *w, uint32_t v) { s_put (w, &v, 4); }
static void s_put_u64 (rx_gguf_writer_t *w, uint64_t v) { s_put (w, &v, 8); }

static size_t s_scalar_size (int t)
{
    switch (t) {
    case RX_GGUF_UINT8: case RX_GGUF_INT8: case RX_GGUF_BOOL: return 1;
    case RX_GGUF_UINT16: case RX_GGUF_INT16: return 2;
    case RX_GGUF_UINT32: case RX_GGUF_INT32: case RX_GGUF_FLOAT32: return 4;
    case RX_GGUF_UINT64: case RX_GGUF_INT64: case RX_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Validate the key, remember it, reserve room and write "key, type". */
static int s_key (rx_gguf_writer_t *w, const char *key, int type, size_t value_bytes, struct rx_err *err)
{
    if (w->phase != 0)
        return rx_err_set (err, RX_EINVAL, "%s: metadata '%s' added after the header was written",
                           w->path, key ? key : "(null)");
    if (!key || !*key)
        return rx_err_set (err, RX_EINVAL, "%s: empty metadata key", w->path);
    size_t klen = strlen (key);
    if (klen > W_MAX_KEY)
        return rx_err_set (err, RX_EINVAL, "%s: metadata key of %zu bytes (the limit is %d)", w->path,
                           klen, W_MAX_KEY);
    for (size_t i = 0; i < w->n_keys; i++)
        if (strcmp (w->keys[i], key) == 0)
            return rx_err_set (err, RX_EINVAL, "%s: duplicate metadata key '%s'", w->path, key);
    if (w->n_keys == w->keys_cap) {
        size_t cap = w->keys_cap ? 2 * w->keys_cap : 32;
        char **k = realloc (w->keys, cap * sizeof *k);
        if (!k) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", w->path);
        w->keys = k;
        w->keys_cap = cap;
    }
    if (value_bytes > SIZE_MAX - 12 - klen)
        return rx_err_set (err, RX_ENOMEM, "%s: value of '%s' too large", w->path, key);
    int rc = s_grow (w, 8 + klen + 4 + value_bytes, err);
    if (rc) return rc;
    char *copy = strdup (key);
    if (!copy) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", w->path);
    w->keys[w->n_keys++] = copy;
    s_put_u64 (w, klen);
    s_put (w, key, klen);
    s_put_u32 (w, (uint32_t) type);
    return RX_OK;
}

static int s_scalar (rx_gguf_writer_t *w, const char *key, int type, const void *v, struct rx_err *err)
{
    size_t n = s_scalar_size (type);
    int rc = s_key (w, key, type, n, err);
    if (rc) return rc;
    s_put (w, v, n);
    return RX_OK;
}

/* ---------------------------------------------------------------- public -- */

rx_gguf_writer_t *rx_gguf_writer_new (const char *path, struct rx_err *err)
{
    if (!path || !*path) {
        rx_err_set (err, RX_EINVAL, "gguf writer: empty output path");
        return NULL;
    }
    rx_gguf_writer_t *w = calloc (1, sizeof *w);
    if (w) {
        w->path = strdup (path);
        w->tmp = malloc (strlen (path) + 5);
    }
    if (!w || !w->path || !w->tmp) {
        if (w) {
            free (w->path);
            free (w->tmp);
        }
        free (w);
        rx_err_set (err, RX_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    sprintf (w->tmp, "%s.tmp", path);
    w->alignment = 32;
    return w;
}

void rx_gguf_writer_destroy (rx_gguf_writer_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_gguf_writer_t *w = *self_p;
    if (w->f) {
        fclose (w->f);
        unlink (w->tmp);
    }
    for (size_t i = 0; i < w->n_keys; i++) free (w->keys[i]);
    for (size_t i = 0; i < w->n_t; i++) free (w->t[i].name);
    free (w->keys);
    free (w->t);
    free (w->kv);
    free (w->path);
    free (w->tmp);
    free (w);
    *self_p = NULL;
}

int rx_gguf_writer_set_alignment (rx_gguf_writer_t *w, uint32_t a, struct rx_err *err)
{
    if (a == 0 || (a & (a - 1)))
        return rx_err_set (err, RX_EINVAL, "%s: alignment %u is not a power of two", w->path, a);
    int rc = rx_gguf_writer_add_u32 (w, "general.alignment", a, err);
    if (rc) return rc;
    w->alignment = a;
    return RX_OK;
}

int rx_gguf_writer_add_u8 (rx_gguf_writer_t *w, const char *k, uint8_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_UINT8, &v, e); }
int rx_gguf_writer_add_i8 (rx_gguf_writer_t *w, const char *k, int8_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_INT8, &v, e); }
int rx_gguf_writer_add_u16 (rx_gguf_writer_t *w, const char *k, uint16_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_UINT16, &v, e); }
int rx_gguf_writer_add_i16 (rx_gguf_writer_t *w, const char *k, int16_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_INT16, &v, e); }
int rx_gguf_writer_add_u32 (rx_gguf_writer_t *w, const char *k, uint32_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_UINT32, &v, e); }
int rx_gguf_writer_add_i32 (rx_gguf_writer_t *w, const char *k, int32_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_INT32, &v, e); }
int rx_gguf_writer_add_u64 (rx_gguf_writer_t *w, const char *k, uint64_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_UINT64, &v, e); }
int rx_gguf_writer_add_i64 (rx_gguf_writer_t *w, const char *k, int64_t v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_INT64, &v, e); }
int rx_gguf_writer_add_f32 (rx_gguf_writer_t *w, const char *k, float v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_FLOAT32, &v, e); }
int rx_gguf_writer_add_f64 (rx_gguf_writer_t *w, const char *k, double v, struct rx_err *e)
{ return s_scalar (w, k, RX_GGUF_FLOAT64, &v, e); }

int rx_gguf_writer_add_bool (rx_gguf_writer_t *w, const char *k, int v, struct rx_err *e)
{
    uint8_t b = v != 0;
    return s_scalar (w, k, RX_GGUF_BOOL, &b, e);
}

int rx_gguf_writer_add_strn (rx_gguf_writer_t *w, const char *key, const char *s, size_t len,
                             struct rx_err *err)
{
    if (!s && len)
        return rx_err_set (err, RX_EINVAL, "%s: NULL string for '%s'", w->path, key ? key : "(null)");
    if (len > SIZE_MAX - 8)
        return rx_err_set (err, RX_EINVAL, "%s: string for '%s' too long", w->path, key ? key : "(null)");
    int rc = s_key (w, key, RX_GGUF_STRING, 8 + len, err);
    if (rc) return rc;
    s_put_u64 (w, len);
    s_put (w, s, len);
    return RX_OK;
}

int rx_gguf_writer_add_str (rx_gguf_writer_t *w, const char *key, const char *s, struct rx_err *err)
{
    return rx_gguf_writer_add_strn (w, key, s, s ? strlen (s) : 0, err);
}

int rx_gguf_writer_add_arr (rx_gguf_writer_t *w, const char *key, int et, const void *data, size_t n,
                            struct rx_err *err)
{
    size_t es = s_scalar_size (et);
    if (es == 0)
        return rx_err_set (err, RX_EINVAL, "%s: array '%s': element type %d is not numeric or bool",
                           w->path, key ? key : "(null)", et);
    if ((!data && n) || n > (SIZE_MAX - 12) / es)
        return rx_err_set (err, RX_EINVAL, "%s: array '%s': bad data", w->path, key ? key : "(null)");
    if (et == RX_GGUF_BOOL)
        for (size_t i = 0; i < n; i++)
            if (((const uint8_t *) data)[i] > 1)
                return rx_err_set (err, RX_EINVAL, "%s: array '%s': bool element %zu is not 0 or 1",
                                   w->path, key, i);
    int rc = s_key (w, key, RX_GGUF_ARRAY, 12 + n * es, err);
    if (rc) return rc;
    s_put_u32 (w, (uint32_t) et);
    s_put_u64 (w, n);
    s_put (w, data, n * es);
    return RX_OK;
}

int rx_gguf_writer_add_arr_str (rx_gguf_writer_t *w, const char *key, const char *const *s,
                                const size_t *lens, size_t n, struct rx_err *err)
{
    size_t total = 12;
    if (!s && n)
        return rx_err_set (err, RX_EINVAL, "%s: array '%s': NULL strings", w->path, key ? key : "(null)");
    for (size_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : (s[i] ? strlen (s[i]) : 0);
        if (!s[i] && l)
            return rx_err_set (err, RX_EINVAL, "%s: array '%s': string %zu is NULL", w->path, key, i);
        if (l > SIZE_MAX - 8 - total)
            return rx_err_set (err, RX_EINVAL, "%s: array '%s' too large", w->path, key);
        total += 8 + l;
    }
    int rc = s_key (w, key, RX_GGUF_ARRAY, total, err);
    if (rc) return rc;
    s_put_u32 (w, RX_GGUF_STRING);
    s_put_u64 (w, n);
    for (size_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : (s[i] ? strlen (s[i]) : 0);
        s_put_u64 (w, l);
        s_put (w, s[i], l);
    }
    return RX_OK;
}

int rx_gguf_writer_copy_kv (rx_gguf_writer_t *w, const rx_gguf_t *src, size_t i, struct rx_err *err)
{
    const void *val;
    size_t n;
    if (rx_gguf_kv_raw (src, i, &val, &n) != RX_OK)
        return rx_err_set (err, RX_ENOENT, "%s: no metadata %zu in %s", w->path, i, rx_gguf_path (src));
    const char *key = rx_gguf_kv_key (src, i);
    if (strcmp (key, "general.alignment") == 0)
        return rx_err_set (err, RX_EINVAL, "%s: copy general.alignment with rx_gguf_writer_set_alignment",
                           w->path);
    int rc = s_key (w, key, rx_gguf_kv_type (src, i), n, err);
    if (rc) return rc;
    s_put (w, val, n);
    return RX_OK;
}

int rx_gguf_writer_add_tensor (rx_gguf_writer_t *w, const char *name, int type, uint32_t n_dims,
                               const uint64_t *ne, struct rx_err *err)
{
    if (w->phase != 0)
        return rx_err_set (err, RX_EINVAL, "%s: tensor '%s' declared after the header was written",
                           w->path, name ? name : "(null)");
    size_t len = name ? strlen (name) : 0;
    if (len == 0 || len > W_MAX_NAME)
        return rx_err_set (err, RX_EINVAL, "%s: tensor name '%s' must be 1..%d bytes", w->path,
                           name ? name : "", W_MAX_NAME);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp (w->t[i].name, name) == 0)
            return rx_err_set (err, RX_EINVAL, "%s: duplicate tensor name '%s'", w->path, name);
    if (n_dims == 0 || n_dims > RX_GGUF_MAX_DIMS || !ne)
        return rx_err_set (err, RX_EINVAL, "%s: tensor '%s': n_dims %u (must be 1..%d)", w->path, name,
                           n_dims, RX_GGUF_MAX_DIMS);
    size_t blk = rx_dtype_block (type), bb = rx_dtype_bytes (type);
    if (type < 0 || type >= RX_DTYPE_LIMIT_ || blk == 0 || bb == 0)
        return rx_err_set (err, RX_EINVAL, "%s: tensor '%s': unknown type %d", w->path, name, type);
    struct s_tensor t = { .type = type, .n_dims = n_dims };
    uint64_t rows = 1;
    for (uint32_t d = 0; d < RX_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > INT64_MAX)
            return rx_err_set (err, RX_EINVAL, "%s: tensor '%s': dimension %u is %llu", w->path, name, d,
                               (unsigned long long) t.ne[d]);
        if (d > 0) {
            if (rows > (uint64_t) INT64_MAX / t.ne[d])
                return rx_err_set (err, RX_EINVAL, "%s: tensor '%s': too many elements", w->path, name);
            rows *= t.ne[d];
        }
    }
    if (t.ne[0] % blk)
        return rx_err_set (err, RX_EINVAL, "%s: tensor '%s': row length %llu is not a multiple of the %s block %zu",
                           w->path, name, (unsigned long long) t.ne[0], rx_dtype_name (type), blk);
    uint64_t row = t.ne[0] / blk * bb;
    if (row > (uint64_t) (SIZE_MAX / 2) / rows)
        return rx_err_set (err, RX_EINVAL, "%s: tensor '%s': too large", w->path, name);
    t.nbytes = (size_t) (row * rows);
    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap ? 2 * w->t_cap : 64;
        struct s_tensor *p = realloc (w->t, cap * sizeof *p);
        if (!p) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", w->path);
        w->t = p;
        w->t_cap = cap;
    }
    t.name = strdup (name);
    if (!t.name) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", w->path);
    w->t[w->n_t++] = t;
    return RX_OK;
}

size_t rx_gguf_writer_tensor_nbytes (const rx_gguf_writer_t *w, size_t i)
{
    return i < w->n_t ? w->t[i].nbytes : 0;
}

static int s_io_fail (rx_gguf_writer_t *w, struct rx_err *err)
{
    int e = errno;
    w->phase = -1;
    return rx_err_set (err, RX_EIO, "%s: write failed: %s", w->tmp, strerror (e ? e : EIO));
}

static int s_pad (rx_gguf_writer_t *w, uint64_t pos, struct rx_err *err)
{
    static const uint8_t zero[256];
    size_t pad = (size_t) ((w->alignment - pos % w->alignment) % w->alignment);
    while (pad) {
        size_t n = pad < sizeof zero ? pad : sizeof zero;
        if (fwrite (zero, 1, n, w->f) != n) return s_io_fail (w, err);
        pad -= n;
    }
    return RX_OK;
}

int rx_gguf_writer_begin (rx_gguf_writer_t *w, struct rx_err *err)
{
    if (w->phase != 0)
        return rx_err_set (err, RX_EINVAL, "%s: header already written", w->path);
    /* consecutive, aligned offsets, as llama.cpp expects */
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        uint64_t padded = (w->t[i].nbytes + w->alignment - 1) / w->alignment * w->alignment;
        if (padded > UINT64_MAX - off)
            return rx_err_set (err, RX_EINVAL, "%s: tensor data too large", w->path);
        off += padded;
    }
    w->f = fopen (w->tmp, "wb");
    if (!w->f)
        return rx_err_set (err, RX_EIO, "%s: cannot create: %s", w->tmp, strerror (errno));
    setvbuf (w->f, NULL, _IOFBF, 1 << 20);
    uint32_t hdr32[2] = { 0x46554747u, W_VERSION };
    uint64_t hdr64[2] = { w->n_t, w->n_keys };
    uint64_t pos = 24 + w->kv_len;
    if (fwrite (hdr32, 4, 2, w->f) != 2 || fwrite (hdr64, 8, 2, w->f) != 2
        || (w->kv_len && fwrite (w->kv, 1, w->kv_len, w->f) != w->kv_len))
        return s_io_fail (w, err);
    for (size_t i = 0; i < w->n_t; i++) {
        const struct s_tensor *t = &w->t[i];
        uint64_t len = strlen (t->name);
        uint32_t type = (uint32_t) t->type;
        if (fwrite (&len, 8, 1, w->f) != 1 || fwrite (t->name, 1, len, w->f) != len
            || fwrite (&t->n_dims, 4, 1, w->f) != 1 || fwrite (t->ne, 8, t->n_dims, w->f) != t->n_dims
            || fwrite (&type, 4, 1, w->f) != 1 || fwrite (&t->offset, 8, 1, w->f) != 1)
            return s_io_fail (w, err);
        pos += 8 + len + 4 + 8 * t->n_dims + 4 + 8;
    }
    int rc = s_pad (w, pos, err);
    if (rc) return rc;
    w->phase = 1;
    w->cur = 0;
    w->cur_done = 0;
    return RX_OK;
}

int rx_gguf_writer_write (rx_gguf_writer_t *w, const void *data, size_t n, struct rx_err *err)
{
    const uint8_t *p = data;
    if (w->phase != 1)
        return rx_err_set (err, RX_EINVAL, "%s: tensor data written %s", w->path,
                           w->phase == 0 ? "before rx_gguf_writer_begin" : "after the write ended");
    while (n) {
        if (w->cur >= w->n_t)
            return rx_err_set (err, RX_EINVAL, "%s: more tensor data than the tensors declared", w->path);
        struct s_tensor *t = &w->t[w->cur];
        size_t take = t->nbytes - w->cur_done;
        if (take > n) take = n;
        if (fwrite (p, 1, take, w->f) != take) return s_io_fail (w, err);
        p += take;
        n -= take;
        w->cur_done += take;
        if (w->cur_done == t->nbytes) {
            int rc = s_pad (w, t->nbytes, err);
            if (rc) return rc;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return RX_OK;
}

int rx_gguf_writer_finish (rx_gguf_writer_t *w, struct rx_err *err)
{
    if (w->phase == 0) {
        int rc = rx_gguf_writer_begin (w, err);
        if (rc) return rc;
    }
    if (w->phase != 1)
        return rx_err_set (err, RX_EINVAL, "%s: writer already finished or failed", w->path);
    if (w->cur < w->n_t)
        return rx_err_set (err, RX_EINVAL, "%s: tensor '%s' has %zu of its %zu bytes (data missing)",
                           w->path, w->t[w->cur].name, w->cur_done, w->t[w->cur].nbytes);
    FILE *f = w->f;
    w->f = NULL;
    if (fflush (f) != 0 || fsync (fileno (f)) != 0) {
        int e = errno;
        fclose (f);
        unlink (w->tmp);
        w->phase = -1;
        return rx_err_set (err, RX_EIO, "%s: write failed: %s", w->tmp, strerror (e));
    }
    if (fclose (f) != 0) {
        int e = errno;
        unlink (w->tmp);
        w->phase = -1;
        return rx_err_set (err, RX_EIO, "%s: write failed: %s", w->tmp, strerror (e));
    }
    if (rename (w->tmp, w->path) != 0) {
        int e = errno;
        unlink (w->tmp);
        w->phase = -1;
        return rx_err_set (err, RX_EIO, "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror (e));
    }
    w->phase = 2;
    return RX_OK;
}
