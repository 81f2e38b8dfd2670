/* router/routekey.h -- the routing key of a proxied request: the text a
 * route policy (cache_aware) matches against what each worker has seen.
 *
 *   POST /generate             "text" (a string, or the first string of an array)
 *   POST /v1/completions       "prompt" (a string, or the first element when it
 *                              is an array of strings; token ids give no key)
 *   POST /v1/chat/completions  the "content" of every message, joined with "\n"
 *                              (string contents, and the "text" of
 *                              {"type":"text"} parts)
 *
 * The body must be a JSON object, else the request is a 400 that never
 * reaches a worker; everything else (missing or odd fields) is left to the
 * worker to judge, and only gives an empty key here.  Pure, no state. */
#ifndef RX_ROUTEKEY_H
#define RX_ROUTEKEY_H

#include <stddef.h>

#include "api.h"

enum rx_routekey_kind {
    RX_ROUTEKEY_NONE        = 0,   /* no body expected (GET): always an empty key */
    RX_ROUTEKEY_GENERATE    = 1,
    RX_ROUTEKEY_COMPLETIONS = 2,
    RX_ROUTEKEY_CHAT        = 3
};

/* A growable byte buffer the caller keeps between calls (no allocation per
 * request once it is big enough).  Zero-initialise; release with
 * rx_routekey_buf_fini. */
struct rx_routekey_buf {
    char  *p;
    size_t cap;
};
void rx_routekey_buf_fini (struct rx_routekey_buf *b);

/* Parse body[0..len) and copy the key into b: *key points into b->p (NUL
 * terminated), *klen its length (0 when the request has no key).
 * Returns RX_OK; RX_EINVAL with e filled (400 invalid_json / invalid_type)
 * when the body is not a JSON object or not valid UTF-8; RX_ENOMEM. */
int rx_routekey_extract (int kind, const char *body, size_t len, struct rx_routekey_buf *b,
                         const char **key, size_t *klen, struct rx_api_error *e);

#endif
