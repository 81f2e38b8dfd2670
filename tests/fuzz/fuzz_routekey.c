/* tests/fuzz/fuzz_routekey.c -- libFuzzer harness for radix-router's request
 * parser and text extraction (router/routekey.c: the only code in the router
 * that reads a client's body; router/proxy.c hands it the raw bytes).
 *
 * Every body, for every request kind, must give RX_OK with a NUL-terminated
 * key of valid UTF-8 inside the caller's buffer, or RX_EINVAL with one 400
 * error that has a type and a message and serialises to JSON.  The buffer
 * is reused across calls as the proxy does, and a second extraction of the
 * same body gives the same key.  Any leak, bad read or undefined behaviour
 * is a finding.  Build and run: tests/fuzz/run.sh routekey.  Inputs it once
 * failed on live in tests/fuzz/regressions-routekey/ (replayed by
 * tests/fuzz/replay_routekey). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routekey.h"
#include "unicode.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static int s_extract (int kind, const char *body, size_t len, struct rx_routekey_buf *b,
                      const char **key, size_t *klen)
{
    struct rx_api_error e;
    memset (&e, 0, sizeof e);
    *key = NULL;
    *klen = (size_t) -1;
    int rc = rx_routekey_extract (kind, body, len, b, key, klen, &e);
    if (rc == RX_OK) {
        if (!*key || *klen == (size_t) -1 || (*klen && (*key < b->p || *key + *klen >= b->p + b->cap)))
            abort ();
        if ((*key)[*klen] != '\0' || !rx_utf8_valid (*key, *klen)) abort ();
        if (kind == RX_ROUTEKEY_NONE && *klen != 0) abort ();
        return rc;
    }
    if (rc != RX_EINVAL || e.status != 400 || !e.type || !e.message[0]) {
        fprintf (stderr, "rc %d status %d\n", rc, e.status);
        abort ();
    }
    char *js = NULL;
    if (rx_api_error_json (&e, &js) != RX_OK || !js) abort ();
    free (js);
    return rc;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    /* an exact-size copy, so ASan sees any read past the body */
    char *body = malloc (size ? size : 1);
    if (!body) return 0;
    memcpy (body, data, size);
    struct rx_routekey_buf b = { 0 };
    int rc_body = -1;
    for (int kind = RX_ROUTEKEY_NONE; kind <= RX_ROUTEKEY_CHAT; kind++) {
        const char *k1, *k2;
        size_t n1, n2;
        int rc1 = s_extract (kind, body, size, &b, &k1, &n1);
        char *copy = rc1 == RX_OK ? malloc (n1 + 1) : NULL;
        if (copy) memcpy (copy, k1, n1 + 1);
        int rc2 = s_extract (kind, body, size, &b, &k2, &n2);
        if (rc1 != rc2) abort ();
        if (copy && (n1 != n2 || memcmp (copy, k2, n1) != 0)) abort ();
        free (copy);
        /* The kinds that read a body agree on whether it is acceptable. */
        if (kind != RX_ROUTEKEY_NONE) {
            if (rc_body != -1 && rc_body != rc1) abort ();
            rc_body = rc1;
        }
    }
    rx_routekey_buf_fini (&b);
    if (b.p || b.cap) abort ();
    free (body);
    return 0;
}
