/* tests/unit/test_auth.c -- core/auth.c: bearer matching and the access
 * levels (open, API key, admin key) of radixd's and radix-router's
 * endpoints. */
#include <criterion/criterion.h>
#include <string.h>

#include "auth.h"

Test (auth, bearer_exact_match_only)
{
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer s3cret"), 1);
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "bearer s3cret"), 1);     /* scheme is case-insensitive */
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer   s3cret"), 1);
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer s3cre"), 0);      /* prefix */
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer s3cret2"), 0);    /* longer */
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer S3cret"), 0);     /* the key is case-sensitive */
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer s3crex"), 0);     /* last byte */
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer "), 0);
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Basic s3cret"), 0);
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "s3cret"), 0);
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", "Bearer"), 0);
    cr_assert_eq (rx_auth_bearer_ok ("s3cret", NULL), 0);
    cr_assert_eq (rx_auth_bearer_ok (NULL, "Bearer x"), 0);
    cr_assert_eq (rx_auth_bearer_ok ("", "Bearer "), 0);                /* an empty key never matches */
}

Test (auth, no_keys_everything_open)
{
    const char *why = "unset";
    for (int lv = RX_AUTH_API; lv <= RX_AUTH_ADMIN; lv++) {
        cr_assert_eq (rx_auth_check (NULL, NULL, lv, NULL, &why), 0, "level %d", lv);
        cr_assert_null (why);
        cr_assert_eq (rx_auth_check ("", "", lv, "Bearer junk", NULL), 0, "level %d", lv);
    }
}

Test (auth, api_key_only)
{
    const char *why = NULL;
    cr_assert_eq (rx_auth_check ("k", NULL, RX_AUTH_API, NULL, &why), 401);
    cr_assert (why && strstr (why, "API key"), "%s", why);
    cr_assert_eq (rx_auth_check ("k", NULL, RX_AUTH_API, "Bearer j", &why), 401);
    cr_assert_eq (rx_auth_check ("k", NULL, RX_AUTH_API, "Bearer k", &why), 0);
    cr_assert_eq (rx_auth_check ("k", NULL, RX_AUTH_OPEN, NULL, &why), 0);
    /* no admin key: admin endpoints take the API key */
    cr_assert_eq (rx_auth_check ("k", NULL, RX_AUTH_ADMIN, "Bearer k", &why), 0);
    cr_assert_eq (rx_auth_check ("k", NULL, RX_AUTH_ADMIN, NULL, &why), 401);
}

Test (auth, admin_key)
{
    const char *why = NULL;
    /* admin endpoint: admin key 200, API key 403, none/wrong 401 */
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_ADMIN, "Bearer adm", &why), 0);
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_ADMIN, "Bearer k", &why), 403);
    cr_assert (why && strstr (why, "admin_api_key"), "%s", why);
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_ADMIN, "Bearer x", &why), 401);
    cr_assert (why && strstr (why, "admin key"), "%s", why);
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_ADMIN, NULL, &why), 401);
    /* the admin key also opens the API endpoints */
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_API, "Bearer adm", &why), 0);
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_API, "Bearer k", &why), 0);
    cr_assert_eq (rx_auth_check ("k", "adm", RX_AUTH_API, "Bearer x", &why), 401);
    /* admin key without an API key: the API endpoints stay open */
    cr_assert_eq (rx_auth_check (NULL, "adm", RX_AUTH_API, NULL, &why), 0);
    cr_assert_eq (rx_auth_check (NULL, "adm", RX_AUTH_ADMIN, NULL, &why), 401);
    cr_assert_eq (rx_auth_check (NULL, "adm", RX_AUTH_ADMIN, "Bearer adm", &why), 0);
}
