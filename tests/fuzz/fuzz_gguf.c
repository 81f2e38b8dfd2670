/* tests/fuzz/fuzz_gguf.c -- libFuzzer harness for the GGUF reader.
 *
 * Every input must either open, and then every getter over every key and
 * tensor stays inside the buffer (ASan checks each byte read), or be refused
 * with one message that starts with the name given.  Build and run with
 * tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static volatile uint64_t s_sink;

static void s_touch (const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) h = h * 31 + b[i];
    s_sink += h;
}

static void s_walk (const rx_gguf_t *g)
{
    for (size_t i = 0; i < rx_gguf_kv_count (g); i++) {
        const char *k = rx_gguf_kv_key (g, i);
        if ((size_t) rx_gguf_find_key (g, k) != i) abort ();   /* keys are unique */
        const void *raw;
        size_t n;
        if (rx_gguf_kv_raw (g, i, &raw, &n) != RX_OK) abort ();
        s_touch (raw, n);
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f;
        int b, et;
        const char *s;
        size_t len;
        (void) rx_gguf_get_u32 (g, k, &u32);
        (void) rx_gguf_get_u64 (g, k, &u64);
        (void) rx_gguf_get_i64 (g, k, &i64);
        (void) rx_gguf_get_f32 (g, k, &f);
        (void) rx_gguf_get_bool (g, k, &b);
        if (rx_gguf_get_str (g, k, &s, &len) == RX_OK) s_touch (s, len);
        if (rx_gguf_get_arr (g, k, &et, &n) == RX_OK) {
            if (et == RX_GGUF_STRING) {
                for (size_t j = 0; j < n; j++) {
                    if (rx_gguf_arr_str (g, k, j, &s, &len) != RX_OK) abort ();
                    s_touch (s, len);
                }
                if (rx_gguf_arr_str (g, k, n, &s, &len) != RX_ERANGE) abort ();
            } else {
                const void *d;
                static const size_t es[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
                if (rx_gguf_arr_data (g, k, &d) != RX_OK) abort ();
                s_touch (d, n * es[et]);
            }
        }
    }
    for (size_t i = 0; i < rx_gguf_tensor_count (g); i++) {
        const struct rx_gguf_tensor *t = rx_gguf_tensor (g, i);
        if (rx_gguf_find_tensor (g, t->name) != t) abort ();
        if (t->nbytes) {
            s_touch (t->data, 1);
            s_touch ((const uint8_t *) t->data + t->nbytes - 1, 1);
        }
    }
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    struct rx_err err = { 0 };
    rx_gguf_t *g = rx_gguf_open_mem (data, size, "fuzz.gguf", &err);
    if (g) {
        s_walk (g);
        rx_gguf_close (&g);
    } else if (strncmp (err.msg, "fuzz.gguf: ", 11) != 0 || strlen (err.msg) < 15 || err.code >= 0) {
        fprintf (stderr, "refused without a proper message: code %d \"%s\"\n", err.code, err.msg);
        abort ();
    }
    return 0;
}
