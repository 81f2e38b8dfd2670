/* core/grow.h -- the one growable-array helper the core modules share. */
#ifndef RX_GROW_H
#define RX_GROW_H

#include <stdint.h>
#include <stdlib.h>

/* Make *p (an array of *cap elements of elt bytes) hold at least need
 * elements, doubling from 64; contents are kept.  0 on success, -1 when out
 * of memory or the size would overflow (*p and *cap unchanged). */
static inline int rx_grow (void **p, size_t *cap, size_t need, size_t elt)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return -1;
        nc *= 2;
    }
    if (elt && nc > SIZE_MAX / elt) return -1;
    void *np = realloc (*p, nc * elt);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

#endif
