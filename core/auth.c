/* core/auth.c -- see auth.h. */
#include "config.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "auth.h"

static int s_set (const char *k) { return k && *k; }

int rx_auth_bearer_ok (const char *key, const char *authorization)
{
    if (!s_set (key) || !authorization || strncasecmp (authorization, "Bearer ", 7) != 0) return 0;
    const char *tok = authorization + 7;
    while (*tok == ' ') tok++;
    /* Constant time in the token: every key byte is compared, the token is
     * read up to the key's length only, and the lengths are folded in at
     * the end.  volatile keeps the compiler from adding an early exit. */
    size_t kl = strlen (key);
    volatile unsigned char diff = 0;
    size_t i = 0;
    int ended = 0;
    for (; i < kl; i++) {
        unsigned char t = ended ? 0 : (unsigned char) tok[i];
        ended |= t == 0;
        diff |= (unsigned char) ((unsigned char) key[i] ^ t) | (unsigned char) ended;
    }
    diff |= (unsigned char) (!ended && tok[kl] != '\0');
    return diff == 0;
}

int rx_auth_check (const char *api_key, const char *admin_key, int level, const char *authorization,
                   const char **why)
{
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    if (level == RX_AUTH_OPEN) return 0;
    int admin_ok = rx_auth_bearer_ok (admin_key, authorization);
    if (level == RX_AUTH_ADMIN && s_set (admin_key)) {
        if (admin_ok) return 0;
        if (rx_auth_bearer_ok (api_key, authorization)) {
            *why = "this endpoint needs the admin key ([server] admin_api_key), not the API key";
            return 403;
        }
        *why = "missing or wrong admin key (Authorization: Bearer ...)";
        return 401;
    }
    if (!s_set (api_key) || admin_ok || rx_auth_bearer_ok (api_key, authorization)) return 0;
    *why = "missing or wrong API key (Authorization: Bearer ...)";
    return 401;
}
