/* kernels/cpu/guard.c -- guarded "device" memory (see guard.h). */
#include <errno.h>
#include <pthread.h>
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "guard.h"

struct s_blk {
    size_t off, len;               /* page multiples */
};

struct rx_kguard {
    uint8_t *base;
    size_t reserve;
    size_t page;
    struct s_blk *blk;             /* sorted by off */
    size_t n, cap;
    size_t hw;                     /* end of the last block: the range open() maps RW */
    size_t open_hw;                /* the most of the region made RW since open() */
    int depth;                     /* ops running (under mu) */
    pthread_mutex_t mu;            /* open/close from a comm plugin's progress
                                    * thread overlap the driving thread's ops */
    int slot;                      /* in s_regions, -1 if none was free */
};

/* The live regions, for the SIGSEGV handler (read in signal context). */
#define S_MAX_REGIONS 64
static _Atomic uintptr_t s_reg_base[S_MAX_REGIONS];
static _Atomic size_t s_reg_len[S_MAX_REGIONS];

static size_t s_round (size_t v, size_t a) { return (v + a - 1) / a * a; }

rx_kguard_t *rx_kguard_new (size_t reserve, struct rx_err *err)
{
    long ps = sysconf (_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t) ps : 4096;
    if (reserve == 0 || reserve > SIZE_MAX / 2) {
        rx_err_set (err, RX_EINVAL, "kernels-cpu guard: reserve %zu bytes is out of range", reserve);
        return NULL;
    }
    reserve = s_round (reserve, page);
    rx_kguard_t *g = calloc (1, sizeof *g);
    if (!g) {
        rx_err_set (err, RX_ENOMEM, "kernels-cpu guard: out of memory");
        return NULL;
    }
    void *m = mmap (NULL, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        rx_err_set (err, RX_ENOMEM, "kernels-cpu guard: cannot reserve %zu MiB of address space: %s",
                    reserve >> 20, strerror (errno));
        free (g);
        return NULL;
    }
    g->base = m;
    g->reserve = reserve;
    g->page = page;
    g->slot = -1;
    pthread_mutex_init (&g->mu, NULL);
    for (int i = 0; i < S_MAX_REGIONS; i++) {
        uintptr_t zero = 0;
        if (atomic_compare_exchange_strong (&s_reg_base[i], &zero, (uintptr_t) m)) {
            atomic_store (&s_reg_len[i], reserve);
            g->slot = i;
            break;
        }
    }
    return g;
}

void rx_kguard_destroy (rx_kguard_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_kguard_t *g = *self_p;
    if (g->slot >= 0) {
        atomic_store (&s_reg_len[g->slot], 0);
        atomic_store (&s_reg_base[g->slot], 0);
    }
    munmap (g->base, g->reserve);
    pthread_mutex_destroy (&g->mu);
    free (g->blk);
    free (g);
    *self_p = NULL;
}

static int s_alloc (rx_kguard_t *g, size_t bytes, size_t align, void **p, struct rx_err *err)
{
    if (!g || !p) return rx_err_set (err, RX_EINVAL, "kernels-cpu guard alloc: NULL argument");
    *p = NULL;
    if (align & (align - 1))
        return rx_err_set (err, RX_EINVAL, "kernels-cpu guard alloc: align %zu is not a power of two",
                           align);
    if (align < g->page) align = g->page;
    if (bytes > g->reserve)
        return rx_err_set (err, RX_ENOMEM, "kernels-cpu guard alloc: %zu bytes exceed the guard "
                           "region (%zu MiB)", bytes, g->reserve >> 20);
    size_t len = s_round (bytes ? bytes : 1, g->page);
    /* First fit: the gap before block i (or after the last one). */
    size_t at = 0, i = 0;
    for (;; i++) {
        /* Aligned as an address, not as an offset (base is only page aligned). */
        size_t start = s_round ((size_t) (uintptr_t) g->base + at, align) - (size_t) (uintptr_t) g->base;
        size_t end = i < g->n ? g->blk[i].off : g->reserve;
        if (start <= end && end - start >= len) {
            at = start;
            break;
        }
        if (i == g->n)
            return rx_err_set (err, RX_ENOMEM, "kernels-cpu guard alloc: no room for %zu bytes in "
                               "the guard region (%zu MiB, %zu blocks)", bytes, g->reserve >> 20,
                               g->n);
        at = g->blk[i].off + g->blk[i].len;
    }
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        struct s_blk *nb = realloc (g->blk, cap * sizeof *nb);
        if (!nb) return rx_err_set (err, RX_ENOMEM, "kernels-cpu guard alloc: out of memory");
        g->blk = nb;
        g->cap = cap;
    }
    memmove (g->blk + i + 1, g->blk + i, (g->n - i) * sizeof *g->blk);
    g->blk[i] = (struct s_blk) { at, len };
    g->n++;
    if (at + len > g->hw) g->hw = at + len;
    /* Inside an op the new block must be usable at once (close() covers it:
     * it protects everything up to hw). */
    if (g->depth > 0) {
        mprotect (g->base + at, len, PROT_READ | PROT_WRITE);
        if (at + len > g->open_hw) g->open_hw = at + len;
    }
    *p = g->base + at;
    return RX_OK;
}

static long s_find (const rx_kguard_t *g, const void *p)
{
    if (!g || !rx_kguard_contains (g, p)) return -1;
    size_t off = (size_t) ((const uint8_t *) p - g->base);
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g->blk[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo < g->n && g->blk[lo].off == off ? (long) lo : -1;
}

static int s_free (rx_kguard_t *g, void *p)
{
    long i = s_find (g, p);
    if (i < 0) return RX_EINVAL;
    struct s_blk b = g->blk[i];
    /* Give the pages back: a later block there reads zeros, not stale data. */
    madvise (g->base + b.off, b.len, MADV_DONTNEED);
    if (g->depth > 0) mprotect (g->base + b.off, b.len, PROT_NONE);
    memmove (g->blk + i, g->blk + i + 1, (g->n - (size_t) i - 1) * sizeof *g->blk);
    g->n--;
    g->hw = g->n ? g->blk[g->n - 1].off + g->blk[g->n - 1].len : 0;
    return RX_OK;
}

int rx_kguard_alloc (rx_kguard_t *g, size_t bytes, size_t align, void **p, struct rx_err *err)
{
    if (!g) return s_alloc (g, bytes, align, p, err);
    pthread_mutex_lock (&g->mu);
    int rc = s_alloc (g, bytes, align, p, err);
    pthread_mutex_unlock (&g->mu);
    return rc;
}

int rx_kguard_free (rx_kguard_t *g, void *p)
{
    if (!g) return RX_EINVAL;
    pthread_mutex_lock (&g->mu);
    int rc = s_free (g, p);
    pthread_mutex_unlock (&g->mu);
    return rc;
}

int rx_kguard_contains (const rx_kguard_t *g, const void *p)
{
    return g && (const uint8_t *) p >= g->base && (const uint8_t *) p < g->base + g->reserve;
}

size_t rx_kguard_size (const rx_kguard_t *g, const void *p)
{
    long i = s_find (g, p);
    return i < 0 ? 0 : g->blk[i].len;
}

size_t rx_kguard_count (const rx_kguard_t *g) { return g ? g->n : 0; }

void rx_kguard_open (rx_kguard_t *g)
{
    if (!g) return;
    pthread_mutex_lock (&g->mu);
    if (g->depth++ == 0) {
        /* Gaps between blocks become accessible too: harmless, their pages
         * are given back (zero) and no pointer into them was handed out. */
        g->open_hw = g->hw;
        if (g->hw) mprotect (g->base, g->hw, PROT_READ | PROT_WRITE);
    }
    pthread_mutex_unlock (&g->mu);
}

void rx_kguard_close (rx_kguard_t *g)
{
    if (!g) return;
    pthread_mutex_lock (&g->mu);
    if (g->depth > 0 && --g->depth == 0) {
        size_t end = g->open_hw > g->hw ? g->open_hw : g->hw;
        if (end) mprotect (g->base, end, PROT_NONE);
        g->open_hw = 0;
    }
    pthread_mutex_unlock (&g->mu);
}

/* ------------------------------------------------------------- handler -- */

static void s_segv (int sig, siginfo_t *si, void *uc)
{
    (void) uc;
    uintptr_t a = (uintptr_t) si->si_addr;
    for (int i = 0; i < S_MAX_REGIONS; i++) {
        uintptr_t b = atomic_load (&s_reg_base[i]);
        size_t n = atomic_load (&s_reg_len[i]);
        if (b && a >= b && a - b < n) {
            char msg[200];
            int len = snprintf (msg, sizeof msg, "kernels-cpu guard: host access to device memory "
                                "at %p (offset %zu of a guard region) outside a kernel op; "
                                "backtrace:\n", si->si_addr, (size_t) (a - b));
            if (len > 0) (void) !write (2, msg, (size_t) len < sizeof msg ? (size_t) len : sizeof msg - 1);
            void *bt[48];
            int nb = backtrace (bt, 48);
            backtrace_symbols_fd (bt, nb, 2);
            break;
        }
    }
    /* SA_RESETHAND restored the default action: returning re-runs the
     * faulting access, which now ends the process with SIGSEGV. */
    (void) sig;
}

void rx_kguard_install_handler (void)
{
    static atomic_int done;
    if (atomic_exchange (&done, 1)) return;
    struct sigaction old;
    if (sigaction (SIGSEGV, NULL, &old) != 0) return;
    if ((old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != NULL : old.sa_handler != SIG_DFL) return;
    void *bt[2];
    backtrace (bt, 2);   /* loads libgcc now, not inside the handler */
    struct sigaction sa;
    memset (&sa, 0, sizeof sa);
    sa.sa_sigaction = s_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset (&sa.sa_mask);
    sigaction (SIGSEGV, &sa, NULL);
}
