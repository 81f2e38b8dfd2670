/* policies/route/pick.h -- small helpers shared by the route-* plugins
 * (header-only: each plugin is its own shared object and links nothing). */
#ifndef RX_ROUTE_PICK_H
#define RX_ROUTE_PICK_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/route.h>

/* The arguments every pick must refuse: no candidate, no output. */
static inline int rx_route_pick_check (const char *policy, const struct rx_route_worker *w,
                                       size_t n, const size_t *chosen, struct rx_err *err)
{
    if (!chosen)
        return rx_err_set (err, RX_EINVAL, "route-%s: pick without a place for the choice", policy);
    if (n == 0 || !w)
        return rx_err_set (err, RX_EINVAL, "route-%s: pick among no candidates (n = %zu)", policy, n);
    return RX_OK;
}

/* splitmix64: a fixed, portable mixer of the caller's seed. */
static inline uint64_t rx_route_mix (uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A uniform index in [0, n) from 64 random bits (Lemire's multiply-shift,
 * no modulo bias worth the name for n far below 2^32; modulo where the
 * compiler has no 128-bit integers). */
static inline size_t rx_route_below (uint64_t r, size_t n)
{
#if defined(__SIZEOF_INT128__)
    return (size_t) (((unsigned __int128) r * n) >> 64);
#else
    return (size_t) (r % n);
#endif
}

/* Does a beat b: lower load, then lower id. */
static inline int rx_route_lighter (const struct rx_route_worker *a, const struct rx_route_worker *b)
{
    return a->load < b->load || (a->load == b->load && a->id < b->id);
}

#endif
