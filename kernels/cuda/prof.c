/* kernels/cuda/prof.c -- see prof.h. */
#include "prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rx_cuprof_add (struct rx_cuprof *p, const char *name, double ms)
{
    if (!p || !name) return;
    struct rx_cuprof_row *r = NULL;
    for (size_t i = 0; i < p->n && !r; i++)
        if (!strncmp (p->rows[i].name, name, sizeof r->name - 1)) r = &p->rows[i];
    if (!r) {
        if (p->n < RX_CUPROF_MAX - 1 ||
            (p->n == RX_CUPROF_MAX - 1 && !strcmp (name, "(other)"))) {
            r = &p->rows[p->n++];
        } else {
            /* The last row collects the names that did not fit. */
            r = &p->rows[RX_CUPROF_MAX - 1];
            if (p->n < RX_CUPROF_MAX) p->n = RX_CUPROF_MAX;
            name = "(other)";
        }
        if (!r->calls) snprintf (r->name, sizeof r->name, "%s", name);
    }
    r->calls++;
    r->ms += ms;
    p->total_ms += ms;
}

static int s_cmp (const void *a, const void *b)
{
    const struct rx_cuprof_row *x = a, *y = b;
    if (x->ms != y->ms) return x->ms < y->ms ? 1 : -1;
    return strcmp (x->name, y->name);
}

size_t rx_cuprof_report (struct rx_cuprof *p, char *out, size_t cap)
{
    size_t len = 0;
    char line[160];
    if (!p) return 0;
    qsort (p->rows, p->n, sizeof p->rows[0], s_cmp);
    if (cap) out[0] = 0;
    for (size_t i = 0; i <= p->n; i++) {
        int k;
        if (i < p->n) {
            const struct rx_cuprof_row *r = &p->rows[i];
            k = snprintf (line, sizeof line,
                          "kernels-cuda profile: %-28s %8llu calls %10.3f ms %9.2f us/call %5.1f%%\n",
                          r->name, (unsigned long long) r->calls, r->ms,
                          r->calls ? r->ms * 1000.0 / (double) r->calls : 0.0,
                          p->total_ms > 0 ? 100.0 * r->ms / p->total_ms : 0.0);
        } else {
            k = snprintf (line, sizeof line,
                          "kernels-cuda profile: total %.3f ms of device time in ops, %llu stream "
                          "synchronizations\n", p->total_ms, (unsigned long long) p->syncs);
        }
        if (k < 0) continue;
        if (len + (size_t) k < cap) memcpy (out + len, line, (size_t) k + 1);
        else if (len < cap) out[len] = 0;   /* truncated at a line boundary */
        len += (size_t) k;
    }
    return len;
}
