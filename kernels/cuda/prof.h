/* kernels/cuda/prof.h -- the per-op time table of kernels-cuda's profiler
 * ([kernels.cuda] profile = true, or RADIX_KCUDA_PROFILE=1).
 *
 * The plugin brackets each op with two CUDA events on the op's stream and
 * hands the measured milliseconds here under the op's name ("rms_norm",
 * "matmul.matvec.bf16", "attention.tiled", "attention.split" ...); at the end it prints the
 * table, largest total first.  This part is plain C so the host unit test
 * checks it without a GPU.
 *
 * Not thread-safe: one table per backend instance, used by the thread
 * that drives it (as the backend itself). */
#ifndef RX_CUDA_PROF_H
#define RX_CUDA_PROF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Distinct op names kept; further names are counted under "(other)". */
#define RX_CUPROF_MAX 96

struct rx_cuprof_row {
    char     name[40];
    uint64_t calls;
    double   ms;
};

struct rx_cuprof {
    struct rx_cuprof_row rows[RX_CUPROF_MAX];
    size_t   n;
    double   total_ms;
    uint64_t syncs;           /* stream synchronizations (host waits) */
};

/* Adds one call of `name` that took `ms` (name truncated to 39 bytes). */
void rx_cuprof_add (struct rx_cuprof *p, const char *name, double ms);

/* The table as text, one line per op, largest total first:
 *   "kernels-cuda profile: <op> <calls> calls <total> ms <avg> us/call <share>%"
 * then a total line.  Writes at most cap bytes (NUL included); returns the
 * length it needed (as snprintf).  Sorts p->rows in place. */
size_t rx_cuprof_report (struct rx_cuprof *p, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
