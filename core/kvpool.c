/* core/kvpool.c -- KV slot allocator, request -> token-slot table, sizing.
 * See kvpool.h for the contract. */
#include "kvpool.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

/* ---- The token-slot allocator ---------------------------------------- */

struct rx_kvpool {
    uint32_t  n_slots;
    uint32_t  page_size;
    uint32_t  n_pages;
    uint32_t  n_free_pages;   /* entries in free_pages */
    uint32_t  n_used;         /* slots handed out */
    uint32_t *free_pages;     /* LIFO stack of free page ids */
    uint16_t *page_used;      /* handed-out slots per page (<= page_size <= 4096) */
    uint8_t  *slot_state;     /* per slot: S_FREE / S_USED / S_FREEING */
};

enum { S_FREE = 0, S_USED = 1, S_FREEING = 2 };

rx_kvpool_t *rx_kvpool_new (uint32_t n_slots, uint32_t page_size, struct rx_err *err)
{
    if (page_size < 1 || page_size > RX_KVPOOL_MAX_PAGE_SIZE) {
        rx_err_set (err, RX_EINVAL, "kvpool: page_size %u out of range (1..%u)", page_size,
                    RX_KVPOOL_MAX_PAGE_SIZE);
        return NULL;
    }
    if (n_slots == 0 || n_slots > RX_KVPOOL_MAX_SLOTS || n_slots % page_size) {
        rx_err_set (err, RX_EINVAL,
                    "kvpool: n_slots %u must be a positive multiple of page_size %u, at most %u",
                    n_slots, page_size, RX_KVPOOL_MAX_SLOTS);
        return NULL;
    }
    rx_kvpool_t *p = calloc (1, sizeof *p);
    if (!p) goto oom;
    p->n_slots = n_slots;
    p->page_size = page_size;
    p->n_pages = n_slots / page_size;
    p->free_pages = malloc ((size_t) p->n_pages * sizeof *p->free_pages);
    p->page_used = calloc (p->n_pages, sizeof *p->page_used);
    p->slot_state = calloc (n_slots, 1);
    if (!p->free_pages || !p->page_used || !p->slot_state) goto oom;
    /* Pushed in reverse so that a fresh pool hands out page 0 first. */
    for (uint32_t i = 0; i < p->n_pages; i++)
        p->free_pages[i] = p->n_pages - 1 - i;
    p->n_free_pages = p->n_pages;
    return p;
oom:
    rx_kvpool_destroy (&p);
    rx_err_set (err, RX_ENOMEM, "kvpool: out of memory for %u slots", n_slots);
    return NULL;
}

void rx_kvpool_destroy (rx_kvpool_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_kvpool_t *p = *self_p;
    free (p->free_pages);
    free (p->page_used);
    free (p->slot_state);
    free (p);
    *self_p = NULL;
}

uint32_t rx_kvpool_page_size (const rx_kvpool_t *p) { return p->page_size; }
uint32_t rx_kvpool_capacity (const rx_kvpool_t *p) { return p->n_slots; }
uint32_t rx_kvpool_available (const rx_kvpool_t *p) { return p->n_free_pages * p->page_size; }
uint32_t rx_kvpool_used (const rx_kvpool_t *p) { return p->n_used; }

int rx_kvpool_is_allocated (const rx_kvpool_t *p, int32_t slot)
{
    return slot >= 0 && (uint32_t) slot < p->n_slots && p->slot_state[slot] == S_USED;
}

/* Hand out slots first..first+n (all in one page, not handed out yet). */
static void s_take (rx_kvpool_t *p, uint32_t first, uint32_t n, int32_t *out)
{
    for (uint32_t i = 0; i < n; i++) {
        p->slot_state[first + i] = S_USED;
        out[i] = (int32_t) (first + i);
    }
    p->page_used[first / p->page_size] += (uint16_t) n;
    p->n_used += n;
}

int rx_kvpool_alloc_extend (rx_kvpool_t *p, int32_t last_slot, uint32_t n, int32_t *out,
                            struct rx_err *err)
{
    if (n > 0 && !out)
        return rx_err_set (err, RX_EINVAL, "kvpool: alloc of %u slots into a NULL buffer", n);
    uint32_t ps = p->page_size, tail = 0;
    if (last_slot >= 0) {
        if (!rx_kvpool_is_allocated (p, last_slot))
            return rx_err_set (err, RX_EINVAL,
                               "kvpool: extend after slot %d, which is not allocated", last_slot);
        uint32_t next = (uint32_t) last_slot + 1;
        tail = ps - next % ps;              /* slots left in last_slot's page */
        if (tail == ps) tail = 0;           /* last_slot ends its page */
        if (tail > n) tail = n;
        for (uint32_t i = 0; i < tail; i++)
            if (p->slot_state[next + i] != S_FREE)
                return rx_err_set (err, RX_EINVAL,
                                   "kvpool: extend after slot %d: slot %u is already allocated "
                                   "(two sequences share a page)", last_slot, next + i);
    } else if (last_slot != -1) {
        return rx_err_set (err, RX_EINVAL, "kvpool: bad last_slot %d (-1 for none)", last_slot);
    }
    uint32_t rest = n - tail;
    uint32_t pages = rest / ps + (rest % ps != 0);
    if (pages > p->n_free_pages)
        return rx_err_set (err, RX_EAGAIN,
                           "kvpool: need %u slots (%u pages), %u available", n, pages,
                           rx_kvpool_available (p));
    if (tail)
        s_take (p, (uint32_t) last_slot + 1, tail, out);
    uint32_t done = tail;
    while (done < n) {
        uint32_t page = p->free_pages[--p->n_free_pages];
        uint32_t k = n - done < ps ? n - done : ps;
        s_take (p, page * ps, k, out + done);
        done += k;
    }
    return RX_OK;
}

int rx_kvpool_alloc (rx_kvpool_t *p, uint32_t n, int32_t *out, struct rx_err *err)
{
    return rx_kvpool_alloc_extend (p, -1, n, out, err);
}

int rx_kvpool_free (rx_kvpool_t *p, const int32_t *slots, uint32_t n, struct rx_err *err)
{
    if (n > 0 && !slots)
        return rx_err_set (err, RX_EINVAL, "kvpool: free of %u slots from a NULL buffer", n);
    /* Pass 1 marks, so that a slot listed twice in one call is caught and
     * the pool can be rolled back untouched. */
    for (uint32_t i = 0; i < n; i++) {
        int32_t s = slots[i];
        const char *why = NULL;
        if (s < 0 || (uint32_t) s >= p->n_slots) why = "out of range";
        else if (p->slot_state[s] == S_FREE) why = "not allocated (double free?)";
        else if (p->slot_state[s] == S_FREEING) why = "listed twice in one free";
        if (why) {
            for (uint32_t j = 0; j < i; j++)
                p->slot_state[slots[j]] = S_USED;
            return rx_err_set (err, RX_EINVAL, "kvpool: cannot free slot %d (of %u): %s", s,
                               p->n_slots, why);
        }
        p->slot_state[s] = S_FREEING;
    }
    for (uint32_t i = 0; i < n; i++) {
        int32_t s = slots[i];
        uint32_t page = (uint32_t) s / p->page_size;
        p->slot_state[s] = S_FREE;
        if (--p->page_used[page] == 0)
            p->free_pages[p->n_free_pages++] = page;
    }
    p->n_used -= n;
    return RX_OK;
}

/* ---- The request -> token-slot table ----------------------------------- */

struct rx_kvpool_rows {
    uint32_t  max_requests;
    uint32_t  max_context;
    int32_t  *table;          /* max_requests * max_context */
    uint32_t *len;            /* per row; UINT32_MAX = row free */
    uint32_t *free_rows;      /* LIFO stack */
    uint32_t  n_free;
};

#define ROW_FREE UINT32_MAX

rx_kvpool_rows_t *rx_kvpool_rows_new (uint32_t max_requests, uint32_t max_context,
                                      struct rx_err *err)
{
    if (max_requests == 0 || max_requests > (uint32_t) INT32_MAX || max_context == 0
        || max_context == ROW_FREE) {
        rx_err_set (err, RX_EINVAL, "kvpool: request table of %u rows x %u tokens: both must "
                    "be positive", max_requests, max_context);
        return NULL;
    }
    size_t cells = (size_t) max_requests * max_context;
    if (cells / max_requests != max_context || cells > SIZE_MAX / sizeof (int32_t)) {
        rx_err_set (err, RX_ERANGE, "kvpool: request table of %u rows x %u tokens is too large",
                    max_requests, max_context);
        return NULL;
    }
    rx_kvpool_rows_t *t = calloc (1, sizeof *t);
    if (!t) goto oom;
    t->max_requests = max_requests;
    t->max_context = max_context;
    /* calloc: the OS maps zero pages lazily, so an unused row costs nothing. */
    t->table = calloc (cells, sizeof *t->table);
    t->len = malloc ((size_t) max_requests * sizeof *t->len);
    t->free_rows = malloc ((size_t) max_requests * sizeof *t->free_rows);
    if (!t->table || !t->len || !t->free_rows) goto oom;
    for (uint32_t i = 0; i < max_requests; i++) {
        t->len[i] = ROW_FREE;
        t->free_rows[i] = max_requests - 1 - i;
    }
    t->n_free = max_requests;
    return t;
oom:
    rx_kvpool_rows_destroy (&t);
    rx_err_set (err, RX_ENOMEM, "kvpool: out of memory for a request table of %u rows x %u "
                "tokens", max_requests, max_context);
    return NULL;
}

void rx_kvpool_rows_destroy (rx_kvpool_rows_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_kvpool_rows_t *t = *self_p;
    free (t->table);
    free (t->len);
    free (t->free_rows);
    free (t);
    *self_p = NULL;
}

uint32_t rx_kvpool_rows_max_requests (const rx_kvpool_rows_t *t) { return t->max_requests; }
uint32_t rx_kvpool_rows_max_context (const rx_kvpool_rows_t *t) { return t->max_context; }
uint32_t rx_kvpool_rows_available (const rx_kvpool_rows_t *t) { return t->n_free; }

static int s_row_ok (const rx_kvpool_rows_t *t, int row)
{
    return row >= 0 && (uint32_t) row < t->max_requests && t->len[row] != ROW_FREE;
}

static int s_bad_row (const rx_kvpool_rows_t *t, int row, const char *op, struct rx_err *err)
{
    if (row < 0 || (uint32_t) row >= t->max_requests)
        return rx_err_set (err, RX_EINVAL, "kvpool: %s: row %d out of range (0..%u)", op, row,
                           t->max_requests - 1);
    return rx_err_set (err, RX_EINVAL, "kvpool: %s: row %d is not in use", op, row);
}

int rx_kvpool_rows_alloc (rx_kvpool_rows_t *t, struct rx_err *err)
{
    if (t->n_free == 0)
        return rx_err_set (err, RX_EAGAIN, "kvpool: all %u request rows are in use",
                           t->max_requests);
    uint32_t row = t->free_rows[--t->n_free];
    t->len[row] = 0;
    return (int) row;
}

int rx_kvpool_rows_free (rx_kvpool_rows_t *t, int row, struct rx_err *err)
{
    if (!s_row_ok (t, row)) return s_bad_row (t, row, "free", err);
    t->len[row] = ROW_FREE;
    t->free_rows[t->n_free++] = (uint32_t) row;
    return RX_OK;
}

int rx_kvpool_rows_write (rx_kvpool_rows_t *t, int row, uint32_t pos, const int32_t *slots,
                          uint32_t n, struct rx_err *err)
{
    if (!s_row_ok (t, row)) return s_bad_row (t, row, "write", err);
    if (n > 0 && !slots)
        return rx_err_set (err, RX_EINVAL, "kvpool: write of %u slots from a NULL buffer", n);
    uint32_t len = t->len[row];
    if (pos > len)
        return rx_err_set (err, RX_EINVAL, "kvpool: write at %u past the end of row %d "
                           "(length %u)", pos, row, len);
    if ((uint64_t) pos + n > t->max_context)
        return rx_err_set (err, RX_ERANGE, "kvpool: row %d would hold %llu tokens, "
                           "max_context is %u", row, (unsigned long long) pos + n,
                           t->max_context);
    if (n) memcpy (t->table + (size_t) row * t->max_context + pos, slots, n * sizeof *slots);
    if (pos + n > len) t->len[row] = pos + n;
    return RX_OK;
}

int rx_kvpool_rows_append (rx_kvpool_rows_t *t, int row, const int32_t *slots, uint32_t n,
                           struct rx_err *err)
{
    if (!s_row_ok (t, row)) return s_bad_row (t, row, "append", err);
    return rx_kvpool_rows_write (t, row, t->len[row], slots, n, err);
}

int rx_kvpool_rows_truncate (rx_kvpool_rows_t *t, int row, uint32_t len, struct rx_err *err)
{
    if (!s_row_ok (t, row)) return s_bad_row (t, row, "truncate", err);
    if (len > t->len[row])
        return rx_err_set (err, RX_EINVAL, "kvpool: cannot truncate row %d of length %u to %u",
                           row, t->len[row], len);
    t->len[row] = len;
    return RX_OK;
}

const int32_t *rx_kvpool_rows_get (const rx_kvpool_rows_t *t, int row, uint32_t *len)
{
    if (!s_row_ok (t, row)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->len[row];
    return t->table + (size_t) row * t->max_context;
}

const int32_t *rx_kvpool_rows_table (const rx_kvpool_rows_t *t, uint32_t *stride)
{
    if (stride) *stride = t->max_context;
    return t->table;
}

/* ---- Sizing ------------------------------------------------------------ */

#define KV_KEY "[cache] kv_memory"
#define KV_EXPECT "expected a size (e.g. 8GiB, 512MiB) or a fraction of free memory " \
                  "(e.g. 0.8 or 80%%)"

/* A fraction written as "0.8" or "80%": returns 1 and sets *frac, 0 if spec
 * is not written as a fraction, -1 if it is but out of range. */
static int s_parse_fraction (const char *spec, double *frac)
{
    const char *p = spec;
    while (isspace ((unsigned char) *p)) p++;
    errno = 0;
    char *end;
    double v = strtod (p, &end);
    if (end == p || errno == ERANGE || !isfinite (v)) return 0;
    int percent = 0;
    const char *q = end;
    while (isspace ((unsigned char) *q)) q++;
    if (*q == '%') { percent = 1; q++; }
    while (isspace ((unsigned char) *q)) q++;
    if (*q) return 0;                                  /* has a unit: a size */
    if (!percent) {
        /* A unitless integer is a byte count; a decimal point makes it a
         * fraction ("1" is one byte, "1.0" all free memory). */
        if (!memchr (p, '.', (size_t) (end - p))) return 0;
        if (!(v > 0 && v <= 1)) return -1;
        *frac = v;
        return 1;
    }
    if (!(v > 0 && v <= 100)) return -1;
    *frac = v / 100;
    return 1;
}

int rx_kvpool_size_slots (const char *spec, uint64_t bytes_per_token, uint64_t free_bytes,
                          uint32_t page_size, uint32_t *n_slots, struct rx_err *err)
{
    if (!spec || !*spec)
        return rx_err_set (err, RX_ECONFIG, KV_KEY " is empty: " KV_EXPECT);
    if (bytes_per_token == 0)
        return rx_err_set (err, RX_EINVAL, KV_KEY ": bytes per token is 0 (model has no KV?)");
    if (page_size < 1 || page_size > RX_KVPOOL_MAX_PAGE_SIZE)
        return rx_err_set (err, RX_EINVAL, KV_KEY ": page_size %u out of range (1..%u)",
                           page_size, RX_KVPOOL_MAX_PAGE_SIZE);
    uint64_t bytes;
    double frac;
    int fr = s_parse_fraction (spec, &frac);
    if (fr < 0)
        return rx_err_set (err, RX_ECONFIG, KV_KEY " = \"%s\": a fraction of free memory must "
                           "be in (0, 1] or (0%%, 100%%] (write a size with a unit, e.g. "
                           "16GiB)", spec);
    if (fr > 0) {
        bytes = (uint64_t) ((double) free_bytes * frac);   /* rounds down */
    } else {
        static const struct rx_cfg_key k = { "kv_memory", RX_CFG_SIZE, NULL, "", 0, 0, NULL };
        struct rx_cfg_value v;
        char why[128];
        if (rx_cfg_value_parse (&k, spec, &v, why, sizeof why) != RX_OK)
            return rx_err_set (err, RX_ECONFIG, KV_KEY " = \"%s\": " KV_EXPECT, spec);
        bytes = v.u;
    }
    uint64_t tokens = bytes / bytes_per_token;
    uint64_t cap = RX_KVPOOL_MAX_SLOTS / page_size * page_size;
    if (tokens > cap) tokens = cap;
    tokens = tokens / page_size * page_size;
    if (tokens == 0)
        return rx_err_set (err, RX_ECONFIG, KV_KEY " = \"%s\": %llu bytes hold no page of %u "
                           "tokens at %llu bytes per token%s", spec,
                           (unsigned long long) bytes, page_size,
                           (unsigned long long) bytes_per_token,
                           fr > 0 ? " (fraction of free memory)" : "");
    *n_slots = (uint32_t) tokens;
    return RX_OK;
}

int rx_kvpool_meminfo_available (const char *path, uint64_t *bytes, struct rx_err *err)
{
    if (!path) path = "/proc/meminfo";
    FILE *f = fopen (path, "r");
    if (!f)
        return rx_err_set (err, RX_EIO, "%s: cannot open: %s", path, strerror (errno));
    char line[256];
    int found = 0, bad = 0;
    while (!found && !bad && fgets (line, sizeof line, f)) {
        unsigned long long kb;
        char unit[8] = "";
        if (strncmp (line, "MemAvailable:", 13) != 0) continue;
        int got = sscanf (line + 13, " %llu %7s", &kb, unit);
        if (got < 1 || (got == 2 && strcmp (unit, "kB") != 0) || kb > UINT64_MAX / 1024) {
            bad = 1;
            break;
        }
        *bytes = (uint64_t) kb * 1024;
        found = 1;
    }
    fclose (f);
    if (bad)
        return rx_err_set (err, RX_EFORMAT, "%s: cannot read the MemAvailable line", path);
    if (!found)
        return rx_err_set (err, RX_EFORMAT, "%s: no MemAvailable line", path);
    return RX_OK;
}
