/* core/auth.h -- who may call an HTTP endpoint: the API key and the admin
 * key of radixd and radix-router ([server] api_key, admin_api_key).
 *
 * Three access levels, one per endpoint (a route table entry):
 *   RX_AUTH_OPEN   anyone (/health: load balancers and probes carry no key);
 *   RX_AUTH_API    the API key when one is set -- the admin key also works;
 *   RX_AUTH_ADMIN  the admin key when one is set (the API key alone gets
 *                  403); with no admin key, the same as RX_AUTH_API.
 * Keys are compared in constant time (no early exit on the first differing
 * byte), so response timing does not reveal a key prefix.  Any handler may
 * call rx_auth_check (e.g. an endpoint that is admin-only for some bodies).
 * Pure functions: thread-safe, no allocation. */
#ifndef RX_AUTH_H
#define RX_AUTH_H

/* Values 0 and 1 match the old "open" flag of the route tables. */
enum rx_auth_level { RX_AUTH_API = 0, RX_AUTH_OPEN = 1, RX_AUTH_ADMIN = 2 };

/* 1 when authorization (an "Authorization" header value, may be NULL) is
 * "Bearer <key>" (scheme case-insensitive, spaces after it skipped), else 0.
 * key NULL or "" never matches. */
int rx_auth_bearer_ok (const char *key, const char *authorization);

/* The HTTP status for a request at this level: 0 = allowed, 401 = no or a
 * wrong key (the caller adds "WWW-Authenticate: Bearer"), 403 = a valid API
 * key on an admin endpoint.  *why (if why is not NULL) gets a one-line
 * message for the error body.  api_key/admin_key NULL or "" = not set. */
int rx_auth_check (const char *api_key, const char *admin_key, int level, const char *authorization,
                   const char **why);

#endif
