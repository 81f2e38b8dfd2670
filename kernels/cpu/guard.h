/* kernels/cpu/guard.h -- guarded "device" memory for kernels-cpu
 * ([kernels.cpu] guard_device_memory = true, test only).
 *
 * On the CPU backend device memory is host memory, so code that
 * dereferences a device pointer on the host (instead of copy_d2h or an op)
 * works here and breaks on a GPU.  A guard region makes such code crash on
 * the CPU too: alloc() hands out pages of one reserved mmap region that is
 * kept PROT_NONE, except while an op or copy of the backend runs
 * (rx_kguard_open .. rx_kguard_close around every op; the backend's worker
 * threads only touch memory inside ops).  A host dereference outside an op
 * is a SIGSEGV; rx_kguard_install_handler prints where it happened.
 *
 * Allocation: page granular, first fit over a sorted block table, freed
 * pages are given back (MADV_DONTNEED) and read back as zero.
 *
 * Thread-safety: alloc, free, open and close take the guard's mutex:
 * open/close nest (a count of running ops), so a copy that a comm plugin's
 * progress thread runs while the driving thread is inside another op keeps
 * the region open for both.  size/count/contains read without it. */
#ifndef RX_KCPU_GUARD_H
#define RX_KCPU_GUARD_H

#include <stddef.h>

#include <radix/err.h>

typedef struct rx_kguard rx_kguard_t;

/* Reserves `reserve` bytes of address space (rounded up to pages), all
 * PROT_NONE, no memory committed.  NULL + err (RX_ENOMEM) if mmap fails. */
rx_kguard_t *rx_kguard_new (size_t reserve, struct rx_err *err);
/* Unmaps the region (every block with it).  NULL / *NULL is a no-op. */
void rx_kguard_destroy (rx_kguard_t **self_p);

/* bytes (0 allowed: one page) aligned to align (a power of two; page
 * alignment at least).  RX_ENOMEM when the region has no gap large enough,
 * RX_EINVAL for a bad align.  The block is accessible only while open. */
int rx_kguard_alloc (rx_kguard_t *g, size_t bytes, size_t align, void **p, struct rx_err *err);
/* RX_OK, or RX_EINVAL when p is not the start of a live block (nothing
 * changes then). */
int rx_kguard_free (rx_kguard_t *g, void *p);
/* 1 if p lies inside the region (live block or not), else 0. */
int rx_kguard_contains (const rx_kguard_t *g, const void *p);
/* Bytes of the live block starting at p, or 0 if p starts none. */
size_t rx_kguard_size (const rx_kguard_t *g, const void *p);
/* Live blocks. */
size_t rx_kguard_count (const rx_kguard_t *g);

/* Make every block read/write (depth 0 -> 1) / PROT_NONE again (1 -> 0). */
void rx_kguard_open (rx_kguard_t *g);
void rx_kguard_close (rx_kguard_t *g);

/* A SIGSEGV handler (installed once per process, only where no handler is
 * set) that names a fault inside a guard region as a host access to device
 * memory, prints a backtrace to stderr and lets the default action (a core)
 * follow. */
void rx_kguard_install_handler (void);

#endif /* RX_KCPU_GUARD_H */
