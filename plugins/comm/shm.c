/* plugins/comm/shm.c -- comm-shm.so: collectives between the CPU ranks of one
 * host over POSIX shared memory (kind RX_KIND_COMM, name "shm").
 *
 * Segment.  Rank 0 creates /dev/shm/radix-<group> (O_EXCL; a stale segment of
 * a crashed run is unlinked and recreated), the others open it, retrying
 * until it appears or timeout_s passes.  Once every rank has attached, rank 0
 * unlinks the name: the memory lives while a mapping does, and nothing is
 * left in /dev/shm whatever happens to the processes later.  Ranks may be
 * processes (radixd's scheduler processes) or threads of one process (each
 * instance maps the segment itself).
 *
 * Layout: the header (magic, n_rank, join counter, broken flag + reason),
 * one 64-byte aligned control block per rank (barrier counter, pid, the
 * signature of its current operation), then per rank two data buffers of
 * buffer_size bytes ([comm.shm] buffer_size).  Collectives larger than a
 * buffer run in chunks ("uses").  Use u writes the buffers of parity u & 1:
 * a rank that writes them for use u has passed a barrier of use u-1, which
 * every rank reached only after reading use u-2's data, so one barrier per
 * use suffices (all_reduce has two: reduce, then gather).
 *
 * Synchronisation: a barrier bumps the rank's own 32-bit counter (a futex
 * word, monotonically increasing; compared by signed difference, so wrapping
 * is harmless) and waits for every other rank's counter to reach the same
 * generation: a short spin, then FUTEX_WAIT (shared, not PRIVATE) in slices
 * of S_SLICE_MS, checking the group's broken flag, the deadline and whether
 * the awaited peer still exists between slices.
 *
 * Determinism.  all_reduce is a reduce-scatter in the buffers (slice c of a
 * chunk is reduced by rank c, adding ranks 0..n-1 in order, f16/bf16 in float
 * and rounded once) followed by an all-gather, so every rank copies the very
 * same bytes: results are bitwise identical on all ranks.
 *
 * Overlap.  The first start() creates a progress thread for the instance
 * (a caller that never starts an op never gets one).  start() copies the op
 * into one of RX_COMM_MAX_INFLIGHT request slots of the instance, queues it
 * and returns; the thread runs the queued ops one after the other, in start
 * order, with the same s_run as the blocking calls; wait() sleeps on a
 * condition variable until its op is done.  A blocking collective first
 * waits until every started op has run (so every rank runs its collectives,
 * started or not, in program order), then runs on the caller's thread.
 * Exactly one thread runs s_run at any time -- the progress thread while
 * ops are queued, the caller otherwise -- and the hand-over goes through
 * the mutex, so the instance's run state (generation, buffer use, broken
 * message) needs no lock of its own.  The driving thread never writes that
 * state while ops are queued: errors it finds then (bad start, destroy past
 * the timeout) break the group through the shared header only (s_mark),
 * and the thread adopts the reason.  destroy() waits for queued ops (at
 * most timeout_s; then it breaks the group so they fail at once) and joins
 * the thread.
 *
 * Failure.  A wait past timeout_s, a peer that is gone (pid no longer exists
 * or is a zombie), a peer that destroyed its instance, a mismatch between the
 * ranks' operations or a bad argument marks the shared header broken with a
 * reason and wakes everyone: every rank fails at once, and every later call
 * fails immediately with the same message.
 *
 * Graphs (ABI 1.4).  On a synchronous backend with host_fn (kernels-cpu)
 * every blocking collective is issued as a host_fn on its stream, a
 * closure of the instance and the op (by value): outside a
 * capture it runs at once, as before; during a graph capture the backend
 * records it and runs it at every launch (graph_capturable = 1).  The
 * closure runs s_run on the driving thread, so everything that changes per
 * call -- the op number and name of messages, the buffer parity -- is taken
 * when it runs, and eager collectives between launches interleave safely.
 * A launched collective cannot return its error (the launch has no way to):
 * like every failure it breaks the group, and check() and every later call
 * report it.  all_to_all_v's closure holds the count and displacement
 * POINTERS (the op by value), so the arrays are read when it runs: at once
 * when eager, at every launch when captured -- the caller keeps them valid
 * and unchanged while the graph lives (radix/comm.h graph_capturable).
 * Started ops stay uncapturable; on CUDA backends comm-shm never defers.
 *
 * Thread-safety: one thread drives an instance (comm.h); the progress
 * thread is internal. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <radix/comm.h>
#include <radix/plugin.h>

#include "blocking.h"

#include "reduce.h"

#define S_MAGIC      0x4d485358u     /* "XSHM" */
#define S_VERSION    1u
#define S_MAX_RANK   64
#define S_GROUP_MAX  64
#define S_SLICE_MS   20              /* futex wait slice between liveness checks */
#define S_SPIN       4000            /* polls before sleeping */
#define S_DEF_BUF    "8MiB"

/* ---- shared layout ------------------------------------------------------- */

struct s_sig {                        /* what a rank is doing: compared at the first barrier */
    int32_t  kind, dtype, red, root;
    uint64_t count, opno;
};

struct s_rank {
    _Atomic uint32_t arrive;          /* futex word: last barrier generation entered */
    _Atomic uint32_t waiters;         /* ranks sleeping on arrive (skip the wake if 0) */
    _Atomic int32_t  pid;
    _Atomic uint32_t joined;
    _Atomic uint32_t left;            /* destroy() was called */
    uint32_t pad_[11];
    struct s_sig sig[2];              /* per buffer parity */
    uint64_t a2a_need[2];             /* all_to_all_v: rounds this rank needs */
    uint64_t a2a_send[2][S_MAX_RANK]; /* all_to_all_v: my send_counts */
    uint64_t a2a_recv[2][S_MAX_RANK]; /*   and recv_counts (every rank checks every pair) */
} __attribute__ ((aligned (64)));

struct s_hdr {
    _Atomic uint32_t magic;           /* written last by rank 0 */
    uint32_t version;
    int32_t  n_rank;
    int32_t  creator_pid;
    uint64_t buf_size;
    uint64_t map_size;
    uint64_t data_off;
    _Atomic uint32_t joined;          /* futex word: ranks attached */
    _Atomic uint32_t broken;          /* 0 healthy, 1 being written, 2 broken */
    int32_t  broken_code;
    int32_t  pad_;
    char     reason[RX_ERR_MSG_MAX];
} __attribute__ ((aligned (64)));

/* ---- the instance -------------------------------------------------------- */

struct shm {
    const struct rx_host *host;
    const struct rx_kernels_ops *kops; /* the backend owning the op buffers; NULL: host memory */
    void *kbe;
    char group[S_GROUP_MAX + 1];
    char name[S_GROUP_MAX + 16];      /* "/radix-<group>" */
    int rank, n;
    double timeout_s;
    size_t buf_size;                  /* bytes of one buffer (one parity) */
    size_t map_size;
    int fd;
    unsigned char *map;
    struct s_hdr *hdr;
    struct s_rank *ranks;
    unsigned char *data;
    int unlinked;
    uint32_t gen;                     /* my barrier generation */
    uint64_t use;                     /* buffer uses so far (parity = use & 1) */
    uint64_t opno;                    /* operations so far (for messages) */
    const char *opname;
    int broken;
    int bcode;
    uint64_t hang_op;                 /* RADIX_TEST_COMM_HANG (tests only): this rank stops at op #hang_op; 0 = never */
    /* Graph capture (see "Graphs" at the top): blocking collectives go
     * through kops->host_fn; the last one that ran leaves its result here
     * (driving thread only). */
    int defer;
    int d_ran;                        /* s_deferred ran since the issue (eager) */
    int d_rc;
    struct rx_err d_err;
    char bmsg[RX_ERR_MSG_MAX + 96];    /* "comm-shm <group>: <reason>" (cut to rx_err's size) */

    /* Overlap (see the top): all below under mu once thr_on, except
     * thr_on itself (written and read by the driving thread only). */
    int thr_on;                       /* progress thread (and mu, cvs) exist */
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t work;              /* thread: an op was queued, or stop */
    pthread_cond_t done;              /* waiters: an op finished */
    uint64_t issued;                  /* ops started so far (seq of the last one) */
    uint64_t finished;                /* ops the thread has run (they finish in seq order) */
    int stop;
    struct rx_comm_req {
        struct shm *owner;
        int state;                    /* S_FREE, S_QUEUED, S_DONE */
        uint64_t seq;                 /* 1, 2, ... in start order */
        struct rx_comm_op op;         /* the caller's op, copied (its arrays stay the caller's) */
        int rc;
        struct rx_err err;
    } slot[RX_COMM_MAX_INFLIGHT];
};

enum { S_FREE = 0, S_QUEUED, S_DONE };

static const struct rx_cfg_key s_keys[] = {
    { "buffer_size", RX_CFG_SIZE, S_DEF_BUF,
      "bytes of each rank's shared buffer; bigger collectives run in chunks of this size",
      4096, 1073741824.0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

/* ---- small helpers ------------------------------------------------------- */

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void s_sleep_ms (int ms)
{
    struct timespec ts = { ms / 1000, (long) (ms % 1000) * 1000000L };
    nanosleep (&ts, NULL);
}

static void s_futex_wait (_Atomic uint32_t *w, uint32_t v, double secs)
{
    if (secs <= 0) return;
    struct timespec ts = { (time_t) secs, (long) ((secs - (double) (time_t) secs) * 1e9) };
    syscall (SYS_futex, (uint32_t *) w, FUTEX_WAIT, v, &ts, NULL, 0);
}

static void s_futex_wake (_Atomic uint32_t *w)
{
    syscall (SYS_futex, (uint32_t *) w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void s_relax (void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause ();
#elif defined(__aarch64__)
    __asm__ __volatile__ ("yield");
#endif
}

/* Is process pid gone (no such process, or a zombie nobody reaped yet)? */
static int s_pid_gone (int pid)
{
    if (pid <= 0 || pid == (int) getpid ()) return 0;
    if (kill (pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[256];
    snprintf (path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen (path, "re");
    if (!f) return 0;
    size_t n = fread (buf, 1, sizeof buf - 1, f);
    fclose (f);
    buf[n] = '\0';
    const char *p = strrchr (buf, ')');           /* comm may contain spaces */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static inline struct s_rank *s_rk (struct shm *c, int r)
{
    return &c->ranks[r];
}

static inline unsigned char *s_buf (struct shm *c, int r, int par)
{
    return c->data + ((size_t) r * 2 + (size_t) par) * c->buf_size;
}

static const char *s_kind_name (int kind)
{
    switch (kind) {
    case RX_COMM_ALL_REDUCE: return "all_reduce";
    case RX_COMM_ALL_GATHER: return "all_gather";
    case RX_COMM_REDUCE_SCATTER: return "reduce_scatter";
    case RX_COMM_ALL_TO_ALL_V: return "all_to_all_v";
    case RX_COMM_BROADCAST: return "broadcast";
    case RX_COMM_BARRIER: return "barrier";
    default: return "?";
    }
}

static const char *s_red_name (int red)
{
    switch (red) {
    case RX_COMM_SUM: return "sum";
    case RX_COMM_MAX: return "max";
    case RX_COMM_MIN: return "min";
    default: return "?";
    }
}

/* ---- broken state -------------------------------------------------------- */

static int s_fail (struct shm *c, struct rx_err *err)
{
    return rx_err_set (err, c->bcode, "%s", c->bmsg);
}

/* The shared reason as this rank reports it, into err, code and msg (both
 * optional); touches nothing of the instance, so the driving thread may
 * call it while the progress thread runs ops. */
static int s_shared_reason (struct shm *c, struct rx_err *err, int *code, char *msg, size_t cap)
{
    /* the breaker is between its two stores: let it finish (bounded) */
    for (int i = 0; i < 101000 && atomic_load (&c->hdr->broken) != 2; i++)
        if (i < 100000) s_relax (); else sched_yield ();
    int bc = c->hdr->broken_code ? c->hdr->broken_code : RX_EIO;
    char reason[RX_ERR_MSG_MAX];
    memcpy (reason, c->hdr->reason, sizeof reason);
    reason[sizeof reason - 1] = '\0';
    char full[RX_ERR_MSG_MAX + 96];
    snprintf (full, sizeof full, "comm-shm %s: %s", c->group, reason);
    if (code) *code = bc;
    if (msg) snprintf (msg, cap, "%s", full);
    return rx_err_set (err, bc, "%s", full);
}

/* Adopt the shared reason (someone broke the group). */
static int s_adopt (struct shm *c, struct rx_err *err)
{
    c->broken = 1;
    return s_shared_reason (c, err, &c->bcode, c->bmsg, sizeof c->bmsg);
}

/* Mark the shared header broken with a reason (the first reason wins) and
 * wake everyone.  Writes nothing of the instance (see s_shared_reason). */
static void s_mark (struct shm *c, int code, const char *fmt, va_list ap)
{
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong (&c->hdr->broken, &zero, 1)) {
        vsnprintf (c->hdr->reason, sizeof c->hdr->reason, fmt, ap);
        c->hdr->broken_code = code;
        atomic_store (&c->hdr->broken, 2);
        for (int r = 0; r < c->n; r++) s_futex_wake (&s_rk (c, r)->arrive);
        s_futex_wake (&c->hdr->joined);
    }
}

/* Break the group with a reason and adopt it (the thread running ops). */
#if defined(__GNUC__)
__attribute__ ((format (printf, 4, 5)))
#endif
static int s_break (struct shm *c, struct rx_err *err, int code, const char *fmt, ...)
{
    if (c->broken) return s_fail (c, err);
    va_list ap;
    va_start (ap, fmt);
    s_mark (c, code, fmt, ap);
    va_end (ap);
    return s_adopt (c, err);
}

/* Break the group from the driving thread while the progress thread may be
 * running ops: the shared header only; the thread adopts the reason. */
#if defined(__GNUC__)
__attribute__ ((format (printf, 4, 5)))
#endif
static int s_break_shared (struct shm *c, struct rx_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    s_mark (c, code, fmt, ap);
    va_end (ap);
    return s_shared_reason (c, err, NULL, NULL, 0);
}

static inline int s_is_broken (struct shm *c)
{
    return atomic_load_explicit (&c->hdr->broken, memory_order_acquire) != 0;
}

/* ---- barrier ------------------------------------------------------------- */

static inline int s_reached (struct s_rank *p, uint32_t g)
{
    return (int32_t) (atomic_load_explicit (&p->arrive, memory_order_acquire) - g) >= 0;
}

static int s_wait_rank (struct shm *c, int r, uint32_t g, struct rx_err *err)
{
    struct s_rank *p = s_rk (c, r);
    for (int i = 0; i < S_SPIN; i++) {
        if (s_reached (p, g)) return RX_OK;
        if (s_is_broken (c)) return s_adopt (c, err);
        s_relax ();
    }
    double t0 = s_now ();
    double deadline = c->timeout_s > 0 ? t0 + c->timeout_s : 0;
    for (int yields = 0;; yields++) {
        if (s_reached (p, g)) return RX_OK;
        if (s_is_broken (c)) return s_adopt (c, err);
        if (yields < 8) {                 /* ranks may outnumber cores: let the peer run */
            sched_yield ();
            continue;
        }
        double now = s_now ();
        if (deadline && now >= deadline)
            return s_break (c, err, RX_ETIMEDOUT, "rank %d did not reach %s #%llu within %g s",
                            r, c->opname, (unsigned long long) c->opno, c->timeout_s);
        if (atomic_load (&p->left) && !s_reached (p, g))
            return s_break (c, err, RX_EIO, "rank %d left the group before %s #%llu",
                            r, c->opname, (unsigned long long) c->opno);
        int pid = atomic_load (&p->pid);
        if (s_pid_gone (pid) && !s_reached (p, g))
            return s_break (c, err, RX_EIO, "rank %d (pid %d) is gone (during %s #%llu)",
                            r, pid, c->opname, (unsigned long long) c->opno);
        double slice = S_SLICE_MS / 1000.0;
        if (deadline && deadline - now < slice) slice = deadline - now;
        uint32_t v = atomic_load (&p->arrive);
        if ((int32_t) (v - g) >= 0) return RX_OK;
        atomic_fetch_add (&p->waiters, 1);
        s_futex_wait (&p->arrive, v, slice);
        atomic_fetch_sub (&p->waiters, 1);
    }
}

static int s_barrier (struct shm *c, struct rx_err *err)
{
    if (s_is_broken (c)) return s_adopt (c, err);
    uint32_t g = ++c->gen;
    struct s_rank *me = s_rk (c, c->rank);
    atomic_store (&me->arrive, g);                 /* seq_cst: pairs with waiters++ */
    if (atomic_load (&me->waiters)) s_futex_wake (&me->arrive);
    for (int r = 0; r < c->n; r++) {
        if (r == c->rank) continue;
        int rc = s_wait_rank (c, r, g, err);
        if (rc) return rc;
    }
    return RX_OK;
}

/* The first barrier of an operation: publish my signature in parity par,
 * pass the barrier, then check that every rank runs the same operation. */
static int s_sync_first (struct shm *c, int par, const struct rx_comm_op *op, struct rx_err *err)
{
    struct s_sig *mine = &s_rk (c, c->rank)->sig[par];
    mine->kind = op->kind;
    mine->dtype = op->kind == RX_COMM_BARRIER ? 0 : op->dtype;
    mine->red = (op->kind == RX_COMM_ALL_REDUCE || op->kind == RX_COMM_REDUCE_SCATTER) ? op->red : 0;
    mine->root = op->kind == RX_COMM_BROADCAST ? op->root : 0;
    mine->count = (op->kind == RX_COMM_BARRIER || op->kind == RX_COMM_ALL_TO_ALL_V) ? 0 : op->count;
    mine->opno = c->opno;
    int rc = s_barrier (c, err);
    if (rc) return rc;
    for (int r = 0; r < c->n; r++) {
        const struct s_sig *o = &s_rk (c, r)->sig[par];
        if (o->kind != mine->kind || o->dtype != mine->dtype || o->red != mine->red
            || o->root != mine->root || o->count != mine->count)
            return s_break (c, err, RX_EINVAL,
                            "%s #%llu: rank %d called %s (count %llu, %s, %s, root %d), rank %d %s (count %llu, %s, %s, root %d)",
                            c->opname, (unsigned long long) c->opno,
                            r, s_kind_name (o->kind), (unsigned long long) o->count,
                            rx_dtype_name (o->dtype), s_red_name (o->red), o->root,
                            c->rank, s_kind_name (mine->kind), (unsigned long long) mine->count,
                            rx_dtype_name (mine->dtype), s_red_name (mine->red), mine->root);
    }
    return RX_OK;
}

/* ---- collectives --------------------------------------------------------- */

static inline size_t s_min (size_t a, size_t b) { return a < b ? a : b; }

/* The op's buffers are device memory of the kernel backend (radix/comm.h):
 * they move to and from the (host) segment through its copy ops, and the
 * host waits for each copy (synchronize) before the segment is read or
 * reused.  Without a backend (tests on plain memory) a memcpy.  The copy
 * may run on the progress thread while the driving thread issues ops: the
 * backends' copies allow that (CUDA streams; kernels-cpu memmove). */
static int s_xfer (struct shm *c, const struct rx_comm_op *op, int to_dev, void *dst,
                   const void *src, size_t bytes, struct rx_err *err)
{
    if (!bytes) return RX_OK;
    if (!c->kops) {
        memcpy (dst, src, bytes);
        return RX_OK;
    }
    struct rx_err e = { 0 };
    int rc = to_dev ? c->kops->copy_h2d (c->kbe, op->stream, dst, src, bytes, &e)
                    : c->kops->copy_d2h (c->kbe, op->stream, dst, src, bytes, &e);
    if (rc == RX_OK) rc = c->kops->synchronize (c->kbe, op->stream, &e);
    if (rc != RX_OK)
        return s_break (c, err, rc, "%s #%llu: %s of %zu bytes: %s", c->opname,
                        (unsigned long long) c->opno, to_dev ? "copy_h2d" : "copy_d2h", bytes, e.msg);
    return RX_OK;
}
#define S_D2H(dst, src, bytes) do { int xrc_ = s_xfer (c, op, 0, dst, src, bytes, err); \
                                    if (xrc_) return xrc_; } while (0)
#define S_H2D(dst, src, bytes) do { int xrc_ = s_xfer (c, op, 1, dst, src, bytes, err); \
                                    if (xrc_) return xrc_; } while (0)

/* Slice [*lo, *hi) of m elements that rank r reduces (16-element aligned). */
static inline void s_slice (size_t m, int n, int r, size_t *lo, size_t *hi)
{
    size_t per = (m + (size_t) n - 1) / (size_t) n;
    per = (per + 15) & ~(size_t) 15;
    *lo = s_min ((size_t) r * per, m);
    *hi = s_min (*lo + per, m);
}

static int s_all_reduce (struct shm *c, const struct rx_comm_op *op, size_t elt, struct rx_err *err)
{
    rx_red_fn fn = rx_red_pick (op->dtype, op->red);
    const unsigned char *send = op->send;
    unsigned char *recv = op->recv;
    size_t ch = c->buf_size / elt, off = 0;
    const void *src[S_MAX_RANK];
    int first = 1;
    do {
        size_t m = s_min (ch, op->count - off);
        int par = (int) (c->use++ & 1);
        S_D2H (s_buf (c, c->rank, par), send + off * elt, m * elt);
        int rc = first ? s_sync_first (c, par, op, err) : s_barrier (c, err);
        if (rc) return rc;
        first = 0;
        size_t lo, hi;
        s_slice (m, c->n, c->rank, &lo, &hi);
        if (hi > lo) {
            for (int r = 0; r < c->n; r++) src[r] = s_buf (c, r, par) + lo * elt;
            fn (s_buf (c, c->rank, par) + lo * elt, src, c->n, hi - lo);
        }
        if ((rc = s_barrier (c, err))) return rc;
        for (int r = 0; r < c->n; r++) {
            s_slice (m, c->n, r, &lo, &hi);
            if (hi > lo) S_H2D (recv + (off + lo) * elt, s_buf (c, r, par) + lo * elt, (hi - lo) * elt);
        }
        off += m;
    } while (off < op->count);
    return RX_OK;
}

static int s_all_gather (struct shm *c, const struct rx_comm_op *op, size_t elt, struct rx_err *err)
{
    const unsigned char *send = op->send;
    unsigned char *recv = op->recv;
    size_t ch = c->buf_size / elt, off = 0, cnt = op->count;
    int in_place = send == recv + (size_t) c->rank * cnt * elt;
    int first = 1;
    do {
        size_t m = s_min (ch, cnt - off);
        int par = (int) (c->use++ & 1);
        S_D2H (s_buf (c, c->rank, par), send + off * elt, m * elt);
        int rc = first ? s_sync_first (c, par, op, err) : s_barrier (c, err);
        if (rc) return rc;
        first = 0;
        for (int r = 0; r < c->n && m; r++) {
            if (r == c->rank && in_place) continue;
            S_H2D (recv + ((size_t) r * cnt + off) * elt, s_buf (c, r, par), m * elt);
        }
        off += m;
    } while (off < cnt);
    return RX_OK;
}

static int s_reduce_scatter (struct shm *c, const struct rx_comm_op *op, size_t elt,
                             struct rx_err *err)
{
    rx_red_fn fn = rx_red_pick (op->dtype, op->red);
    const unsigned char *send = op->send;
    unsigned char *recv = op->recv;
    size_t cnt = op->count, ch = c->buf_size / ((size_t) c->n * elt), off = 0;
    const void *src[S_MAX_RANK];
    int first = 1;
    do {
        size_t m = s_min (ch, cnt - off);
        int par = (int) (c->use++ & 1);
        unsigned char *mine = s_buf (c, c->rank, par);
        for (int d = 0; d < c->n && m; d++)
            S_D2H (mine + (size_t) d * ch * elt, send + ((size_t) d * cnt + off) * elt, m * elt);
        int rc = first ? s_sync_first (c, par, op, err) : s_barrier (c, err);
        if (rc) return rc;
        first = 0;
        if (m) {
            /* Reduce into my own slot of my buffer (only I read it; the
             * reduction allows dst == src[rank]), then up to the device. */
            for (int r = 0; r < c->n; r++) src[r] = s_buf (c, r, par) + (size_t) c->rank * ch * elt;
            fn (mine + (size_t) c->rank * ch * elt, src, c->n, m);
            S_H2D (recv + off * elt, mine + (size_t) c->rank * ch * elt, m * elt);
        }
        off += m;
    } while (off < cnt);
    return RX_OK;
}

static int s_broadcast (struct shm *c, const struct rx_comm_op *op, size_t elt, struct rx_err *err)
{
    unsigned char *buf = op->recv;
    size_t ch = c->buf_size / elt, off = 0;
    int first = 1;
    do {
        size_t m = s_min (ch, op->count - off);
        int par = (int) (c->use++ & 1);
        if (c->rank == op->root) S_D2H (s_buf (c, c->rank, par), buf + off * elt, m * elt);
        int rc = first ? s_sync_first (c, par, op, err) : s_barrier (c, err);
        if (rc) return rc;
        first = 0;
        if (c->rank != op->root) S_H2D (buf + off * elt, s_buf (c, op->root, par), m * elt);
        off += m;
    } while (off < op->count);
    return RX_OK;
}

/* Round k moves bytes [k*S, (k+1)*S) of every (sender, receiver) segment
 * through slot <receiver> (S bytes) of the sender's buffer.  The number of
 * rounds is the largest any rank needs, learnt at the first barrier. */
static int s_all_to_all_v (struct shm *c, const struct rx_comm_op *op, size_t elt,
                           struct rx_err *err)
{
    const unsigned char *send = op->send;
    unsigned char *recv = op->recv;
    size_t S = (c->buf_size / (size_t) c->n) & ~(size_t) 63;
    uint64_t need = 1, rounds = 1;
    for (int p = 0; p < c->n; p++) {
        uint64_t k = (op->send_counts[p] * elt + S - 1) / S;
        if (k > need) need = k;
    }
    for (uint64_t k = 0; k < rounds; k++) {
        int par = (int) (c->use++ & 1);
        unsigned char *mine = s_buf (c, c->rank, par);
        for (int p = 0; p < c->n; p++) {
            size_t len = op->send_counts[p] * elt, lo = k * S;
            if (lo < len)
                S_D2H (mine + (size_t) p * S, send + op->send_displs[p] * elt + lo, s_min (S, len - lo));
        }
        int rc;
        if (k == 0) {
            struct s_rank *me = s_rk (c, c->rank);
            me->a2a_need[par] = need;
            for (int p = 0; p < c->n; p++) {
                me->a2a_send[par][p] = op->send_counts[p];
                me->a2a_recv[par][p] = op->recv_counts[p];
            }
            if ((rc = s_sync_first (c, par, op, err))) return rc;
            /* every rank checks every pair, so all of them fail together */
            for (int r = 0; r < c->n; r++) {
                const struct s_rank *o = s_rk (c, r);
                if (o->a2a_need[par] > rounds) rounds = o->a2a_need[par];
                for (int p = 0; p < c->n; p++) {
                    uint64_t sent = o->a2a_send[par][p], want = s_rk (c, p)->a2a_recv[par][r];
                    if (sent != want)
                        return s_break (c, err, RX_EINVAL,
                                        "all_to_all_v #%llu: rank %d sends %llu elements to rank %d, which expects %llu",
                                        (unsigned long long) c->opno, r, (unsigned long long) sent,
                                        p, (unsigned long long) want);
                }
            }
        } else if ((rc = s_barrier (c, err))) {
            return rc;
        }
        for (int r = 0; r < c->n; r++) {
            size_t len = op->recv_counts[r] * elt, lo = k * S;
            if (lo < len)
                S_H2D (recv + op->recv_displs[r] * elt + lo,
                       s_buf (c, r, par) + (size_t) c->rank * S, s_min (S, len - lo));
        }
    }
    return RX_OK;
}

/* Validate op (breaking the group on a bad argument: the peers would
 * otherwise wait for this rank until the timeout) and run it. */
static int s_run (struct shm *c, const struct rx_comm_op *op, struct rx_err *err)
{
    if (c->broken) return s_fail (c, err);
    if (s_is_broken (c)) return s_adopt (c, err);
    c->opno++;
    c->opname = s_kind_name (op->kind);
    unsigned long long no = (unsigned long long) c->opno;
    if (c->hang_op && c->opno == c->hang_op) {
        /* Injected hang (test only, see s_create): this rank never joins the
         * collective, like a stuck kernel; the peers' comm_timeout breaks
         * the group, and then this rank fails too. */
        c->host->log (c->host, RX_LOG_WARN, "comm-shm %s: RADIX_TEST_COMM_HANG: rank %d hangs in %s #%llu",
                      c->group, c->rank, c->opname, no);
        while (!s_is_broken (c)) s_sleep_ms (20);
        return s_adopt (c, err);
    }
    const char *kn = c->opname;
    int k = op->kind;
    if (k < RX_COMM_ALL_REDUCE || k > RX_COMM_BARRIER)
        return s_break (c, err, RX_EINVAL, "rank %d: operation #%llu: unknown kind %d", c->rank, no, k);
    if (k == RX_COMM_BARRIER) {
        int par = (int) (c->use++ & 1);
        return s_sync_first (c, par, op, err);
    }
    size_t elt = rx_comm_dtype_size (op->dtype);
    if (!elt)
        return s_break (c, err, RX_EINVAL,
                        "rank %d: %s #%llu: dtype %s (%d) is not supported (f32, f16, bf16, i32, i64)",
                        c->rank, kn, no, rx_dtype_name (op->dtype), op->dtype);
    if ((k == RX_COMM_ALL_REDUCE || k == RX_COMM_REDUCE_SCATTER)
        && (op->red < RX_COMM_SUM || op->red > RX_COMM_MIN))
        return s_break (c, err, RX_EINVAL, "rank %d: %s #%llu: unknown reduction %d (sum, max, min)",
                        c->rank, kn, no, op->red);
    if (k == RX_COMM_ALL_TO_ALL_V) {
        if (!op->send_counts || !op->send_displs || !op->recv_counts || !op->recv_displs)
            return s_break (c, err, RX_EINVAL, "rank %d: all_to_all_v #%llu: NULL counts or displacements",
                            c->rank, no);
        for (int p = 0; p < c->n; p++) {
            if ((op->send_counts[p] && !op->send) || (op->recv_counts[p] && !op->recv))
                return s_break (c, err, RX_EINVAL, "rank %d: all_to_all_v #%llu: NULL buffer with a non-zero count",
                                c->rank, no);
            if (op->send_counts[p] > SIZE_MAX / 16 / elt || op->recv_counts[p] > SIZE_MAX / 16 / elt
                || op->send_displs[p] > SIZE_MAX / 16 / elt || op->recv_displs[p] > SIZE_MAX / 16 / elt)
                return s_break (c, err, RX_EINVAL, "rank %d: all_to_all_v #%llu: count or displacement too large",
                                c->rank, no);
        }
        return s_all_to_all_v (c, op, elt, err);
    }
    if (op->count > SIZE_MAX / 16 / elt / (size_t) c->n)
        return s_break (c, err, RX_EINVAL, "rank %d: %s #%llu: count %zu too large", c->rank, kn, no,
                        op->count);
    if (op->count && (!op->recv || (k != RX_COMM_BROADCAST && !op->send)))
        return s_break (c, err, RX_EINVAL, "rank %d: %s #%llu: NULL buffer with count %zu",
                        c->rank, kn, no, op->count);
    switch (k) {
    case RX_COMM_ALL_REDUCE: return s_all_reduce (c, op, elt, err);
    case RX_COMM_ALL_GATHER: return s_all_gather (c, op, elt, err);
    case RX_COMM_REDUCE_SCATTER: return s_reduce_scatter (c, op, elt, err);
    default:
        if (op->root < 0 || op->root >= c->n)
            return s_break (c, err, RX_EINVAL, "rank %d: broadcast #%llu: root %d is out of range (0..%d)",
                            c->rank, no, op->root, c->n - 1);
        return s_broadcast (c, op, elt, err);
    }
}

/* ---- create / destroy ---------------------------------------------------- */

static void s_unmap (struct shm *c)
{
    if (c->map) munmap (c->map, c->map_size);
    if (c->fd >= 0) close (c->fd);
    c->map = NULL;
    c->hdr = NULL;
    c->fd = -1;
}

static void s_set_layout (struct shm *c)
{
    c->hdr = (struct s_hdr *) c->map;
    c->ranks = (struct s_rank *) (c->map + sizeof (struct s_hdr));
    c->data = c->map + c->hdr->data_off;
}

static int s_create_seg (struct shm *c, struct rx_err *err)
{
    size_t ctl = sizeof (struct s_hdr) + (size_t) c->n * sizeof (struct s_rank);
    size_t data_off = (ctl + 4095) & ~(size_t) 4095;
    if (c->buf_size > (SIZE_MAX / 4 - data_off) / 2 / (size_t) c->n)
        return rx_err_set (err, RX_EINVAL, "comm-shm %s: buffer_size %zu is too large for %d ranks",
                           c->group, c->buf_size, c->n);
    c->map_size = data_off + (size_t) c->n * 2 * c->buf_size;
    for (int tries = 0;; tries++) {
        c->fd = shm_open (c->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (c->fd >= 0) break;
        if (errno == EEXIST && tries < 3) {        /* stale segment of a crashed run */
            RX_HLOG (c->host, RX_LOG_WARN, "comm-shm %s: removing stale segment /dev/shm%s",
                     c->group, c->name);
            shm_unlink (c->name);
            continue;
        }
        return rx_err_set (err, RX_EIO, "comm-shm %s: shm_open %s: %s", c->group, c->name,
                           strerror (errno));
    }
    if (ftruncate (c->fd, (off_t) c->map_size) != 0) {
        int e = errno;
        shm_unlink (c->name);
        return rx_err_set (err, e == ENOSPC || e == ENOMEM ? RX_ENOMEM : RX_EIO,
                           "comm-shm %s: ftruncate %s to %zu bytes: %s", c->group, c->name,
                           c->map_size, strerror (e));
    }
    /* Reserve the pages now: on a small /dev/shm (containers default to
     * 64 MiB) touching a sparse page later would be a SIGBUS, not an error. */
    int fe = posix_fallocate (c->fd, 0, (off_t) c->map_size);
    if (fe != 0 && fe != EOPNOTSUPP && fe != EINVAL) {
        shm_unlink (c->name);
        return rx_err_set (err, RX_ENOMEM,
                           "comm-shm %s: /dev/shm has no room for %zu bytes (%s): lower [comm.shm] buffer_size (%zu) or enlarge /dev/shm",
                           c->group, c->map_size, strerror (fe), c->buf_size);
    }
    void *m = mmap (NULL, c->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        shm_unlink (c->name);
        return rx_err_set (err, RX_ENOMEM, "comm-shm %s: mmap %zu bytes: %s", c->group,
                           c->map_size, strerror (e));
    }
    c->map = m;
    struct s_hdr *h = (struct s_hdr *) c->map;
    h->version = S_VERSION;
    h->n_rank = c->n;
    h->creator_pid = (int32_t) getpid ();
    h->buf_size = c->buf_size;
    h->map_size = c->map_size;
    h->data_off = data_off;
    s_set_layout (c);
    atomic_store (&h->magic, S_MAGIC);
    return RX_OK;
}

/* Try once to attach to the segment: 1 attached, 0 not there (yet), < 0 error. */
static int s_try_attach (struct shm *c, struct rx_err *err)
{
    int fd = shm_open (c->name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        return rx_err_set (err, RX_EIO, "comm-shm %s: shm_open %s: %s", c->group, c->name,
                           strerror (errno));
    }
    struct stat st;
    if (fstat (fd, &st) != 0 || st.st_size < (off_t) sizeof (struct s_hdr)) {
        close (fd);
        return 0;
    }
    void *m = mmap (NULL, (size_t) st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close (fd);
        return rx_err_set (err, RX_ENOMEM, "comm-shm %s: mmap: %s", c->group, strerror (errno));
    }
    struct s_hdr *h = m;
    if (atomic_load (&h->magic) != S_MAGIC || s_pid_gone (h->creator_pid)) {
        munmap (m, (size_t) st.st_size);           /* not ready, or stale: rank 0 replaces it */
        close (fd);
        return 0;
    }
    if (h->version != S_VERSION || h->n_rank != c->n || h->buf_size != c->buf_size
        || h->map_size != (uint64_t) st.st_size) {
        int rc = rx_err_set (err, RX_EINVAL,
                             "comm-shm %s: rank 0 set the group up with %d ranks and buffer_size %llu, rank %d with %d ranks and buffer_size %zu",
                             c->group, h->n_rank, (unsigned long long) h->buf_size, c->rank, c->n,
                             c->buf_size);
        munmap (m, (size_t) st.st_size);
        close (fd);
        return rc;
    }
    c->fd = fd;
    c->map = m;
    c->map_size = (size_t) st.st_size;
    s_set_layout (c);
    return 1;
}

/* Is our mapping no longer what the name refers to (rank 0 replaced a
 * stale segment we attached to)? */
static int s_replaced (struct shm *c)
{
    int fd = shm_open (c->name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct stat a, b;
    int r = fstat (fd, &a) == 0 && fstat (c->fd, &b) == 0 && a.st_ino != b.st_ino;
    close (fd);
    return r;
}

static void s_destroy (void *comm);

static int s_create (const struct rx_host *host, const struct rx_comm_params *p, void **out,
                     struct rx_err *err)
{
    if (out) *out = NULL;
    if (!host || !p || !out)
        return rx_err_set (err, RX_EINVAL, "comm-shm: create: NULL host, params or result");
    if (p->struct_size < offsetof (struct rx_comm_params, kbe) + sizeof p->kbe)
        return rx_err_set (err, RX_EINVAL, "comm-shm: params struct too short (%u bytes)", p->struct_size);
    const char *g = p->group;
    size_t gl = g ? strlen (g) : 0;
    if (!g || gl == 0 || gl > S_GROUP_MAX)
        return rx_err_set (err, RX_EINVAL, "comm-shm: group name must be 1..%d characters (got %zu)",
                           S_GROUP_MAX, gl);
    for (size_t i = 0; i < gl; i++) {
        char ch = g[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
              || ch == '_' || ch == '.' || ch == '-'))
            return rx_err_set (err, RX_EINVAL,
                               "comm-shm: group name \"%.64s\" has a bad character at %zu (allowed: A-Z a-z 0-9 _ . -)",
                               g, i);
    }
    if (p->n_rank < 1 || p->n_rank > S_MAX_RANK)
        return rx_err_set (err, RX_EINVAL, "comm-shm %s: n_rank %d is out of range (1..%d)", g,
                           p->n_rank, S_MAX_RANK);
    if (p->rank < 0 || p->rank >= p->n_rank)
        return rx_err_set (err, RX_EINVAL, "comm-shm %s: rank %d is out of range (0..%d)", g, p->rank,
                           p->n_rank - 1);
    if (!(p->timeout_s >= 0) || p->timeout_s > 1e9)
        return rx_err_set (err, RX_EINVAL, "comm-shm %s: timeout_s %g is not in 0..1e9", g, p->timeout_s);
    uint64_t bs = 0;
    if (!host->cfg_size || host->cfg_size (host, "buffer_size", &bs) != RX_OK) bs = 8u << 20;
    if (bs < 4096 || bs > (1u << 30))
        return rx_err_set (err, RX_EINVAL, "comm-shm %s: buffer_size %llu is not in 4KiB..1GiB", g,
                           (unsigned long long) bs);

    struct shm *c = host->alloc (host, sizeof *c, 64);
    if (!c) return rx_err_set (err, RX_ENOMEM, "comm-shm %s: out of memory", g);
    memset (c, 0, sizeof *c);
    c->host = host;
    c->kops = p->kops;
    c->kbe = p->kbe;
    memcpy (c->group, g, gl + 1);
    snprintf (c->name, sizeof c->name, "/radix-%s", g);
    c->rank = p->rank;
    c->n = p->n_rank;
    c->timeout_s = p->timeout_s;
    /* RADIX_TEST_COMM_HANG=<rank>:<op> (fault-injection tests only, see
     * docs/reliability.md): rank <rank> hangs at its <op>-th operation. */
    const char *hang = getenv ("RADIX_TEST_COMM_HANG");
    int hr = -1;
    unsigned long long hop = 0;
    if (hang && sscanf (hang, "%d:%llu", &hr, &hop) == 2 && hr == p->rank) c->hang_op = hop;
    c->buf_size = (size_t) bs & ~(size_t) 63;
    c->fd = -1;
    c->opname = "create";
    /* Defer blocking collectives through host_fn (graph capture) on a
     * synchronous backend that has it (see "Graphs" at the top). */
    if (c->kops && RX_HAS (struct rx_kernels_ops, c->kops, host_fn) && c->kops->info) {
        struct rx_kernels_info ki;
        memset (&ki, 0, sizeof ki);
        ki.struct_size = sizeof ki;
        if (c->kops->info (c->kbe, &ki) == RX_OK && !(ki.caps & RX_KCAP_ASYNC)) c->defer = 1;
    }

    double t0 = s_now (), deadline = c->timeout_s > 0 ? t0 + c->timeout_s : 0;
    int rc;
attach:
    if (c->rank == 0) {
        rc = s_create_seg (c, err);
        if (rc) goto fail;
    } else {
        int ms = 1;
        while ((rc = s_try_attach (c, err)) == 0) {
            if (deadline && s_now () >= deadline) {
                rc = rx_err_set (err, RX_ETIMEDOUT,
                                 "comm-shm %s: rank 0 did not create segment %s within %g s (rank %d waited)",
                                 c->group, c->name, c->timeout_s, c->rank);
                goto fail;
            }
            s_sleep_ms (ms);
            if (ms < 16) ms *= 2;
        }
        if (rc < 0) goto fail;
    }
    struct s_rank *me = s_rk (c, c->rank);
    if (atomic_exchange (&me->joined, 1) != 0) {
        rc = s_break (c, err, RX_EINVAL, "rank %d joined twice (two processes claim it)", c->rank);
        goto fail;
    }
    atomic_store (&me->pid, (int32_t) getpid ());
    atomic_fetch_add (&c->hdr->joined, 1);
    s_futex_wake (&c->hdr->joined);
    for (;;) {
        uint32_t j = atomic_load (&c->hdr->joined);
        if (j >= (uint32_t) c->n) break;
        if (s_is_broken (c)) {
            rc = s_adopt (c, err);
            goto fail;
        }
        double now = s_now ();
        if (deadline && now >= deadline) {
            char miss[128] = "";
            size_t len = 0;
            for (int r = 0; r < c->n && len < sizeof miss - 8; r++)
                if (!atomic_load (&s_rk (c, r)->joined))
                    len += (size_t) snprintf (miss + len, sizeof miss - len, "%s%d", len ? ", " : "", r);
            rc = s_break (c, err, RX_ETIMEDOUT, "rank(s) %s did not join within %g s", miss,
                          c->timeout_s);
            goto fail;
        }
        if (c->rank != 0 && s_replaced (c)) {        /* we joined a stale segment */
            s_unmap (c);
            goto attach;
        }
        double slice = S_SLICE_MS / 1000.0;
        if (deadline && deadline - now < slice) slice = deadline - now;
        s_futex_wait (&c->hdr->joined, j, slice);
    }
    if (c->rank == 0) {
        shm_unlink (c->name);
        c->unlinked = 1;
    }
    c->gen = 0;
    *out = c;
    return RX_OK;
fail:
    if (c->rank == 0 && c->map && !c->unlinked) {
        shm_unlink (c->name);
        c->unlinked = 1;
    }
    if (c->rank != 0 && c->map && s_pid_gone (c->hdr->creator_pid)) shm_unlink (c->name);
    s_unmap (c);
    host->free_ (host, c);
    return rc;
}

static void s_stop_thread (struct shm *c);

static void s_destroy (void *comm)
{
    struct shm *c = comm;
    if (!c) return;
    if (c->thr_on) s_stop_thread (c);
    if (c->map) {
        struct s_rank *me = s_rk (c, c->rank);
        atomic_store (&me->left, 1);
        s_futex_wake (&me->arrive);
    }
    if (c->rank == 0 && c->map && !c->unlinked) shm_unlink (c->name);
    s_unmap (c);
    c->host->free_ (c->host, c);
}

/* ---- progress thread ----------------------------------------------------- */

/* The queued op with sequence number seq (mu held). */
static struct rx_comm_req *s_slot_of (struct shm *c, uint64_t seq)
{
    for (int i = 0; i < RX_COMM_MAX_INFLIGHT; i++)
        if (c->slot[i].state == S_QUEUED && c->slot[i].seq == seq) return &c->slot[i];
    return NULL;
}

/* Runs the queued ops in start order until stop is set and the queue is
 * empty.  s_run outside the lock: the driving thread only touches a queued
 * slot's rc/err/state under mu after the op is marked done. */
static void *s_progress (void *arg)
{
    struct shm *c = arg;
    pthread_mutex_lock (&c->mu);
    for (;;) {
        while (c->finished == c->issued && !c->stop) pthread_cond_wait (&c->work, &c->mu);
        if (c->finished == c->issued) break;           /* stop, nothing left */
        struct rx_comm_req *q = s_slot_of (c, c->finished + 1);
        pthread_mutex_unlock (&c->mu);
        struct rx_err e = { 0 };
        int rc = q ? s_run (c, &q->op, &e) : RX_EINVAL;  /* q is always found */
        pthread_mutex_lock (&c->mu);
        if (q) {
            q->rc = rc;
            q->err = e;
            q->state = S_DONE;
        }
        c->finished++;
        pthread_cond_broadcast (&c->done);
    }
    pthread_mutex_unlock (&c->mu);
    return NULL;
}

static int s_start_thread (struct shm *c, struct rx_err *err)
{
    pthread_condattr_t ca;
    int e = pthread_mutex_init (&c->mu, NULL);
    if (e) goto no_mu;
    if ((e = pthread_condattr_init (&ca))) goto no_attr;
    pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);   /* destroy's timed wait */
    if ((e = pthread_cond_init (&c->work, &ca))) goto no_work;
    if ((e = pthread_cond_init (&c->done, &ca))) goto no_done;
    /* The thread takes no signals: the process's handlers keep running
     * on the threads that expect them. */
    sigset_t all, old;
    sigfillset (&all);
    pthread_sigmask (SIG_SETMASK, &all, &old);
    e = pthread_create (&c->thr, NULL, s_progress, c);
    pthread_sigmask (SIG_SETMASK, &old, NULL);
    if (e) goto no_thr;
    pthread_condattr_destroy (&ca);
    c->thr_on = 1;
    return RX_OK;
no_thr:
    pthread_cond_destroy (&c->done);
no_done:
    pthread_cond_destroy (&c->work);
no_work:
    pthread_condattr_destroy (&ca);
no_attr:
    pthread_mutex_destroy (&c->mu);
no_mu:
    return s_break (c, err, e == ENOMEM || e == EAGAIN ? RX_ENOMEM : RX_EIO,
                    "rank %d: start: cannot create the progress thread: %s", c->rank, strerror (e));
}

/* destroy(): let the queued ops finish (at most timeout_s, so the peers
 * that run them too are not left waiting for this rank), else break the
 * group so they fail at once; then join the thread. */
static void s_stop_thread (struct shm *c)
{
    pthread_mutex_lock (&c->mu);
    if (c->finished != c->issued && c->timeout_s > 0) {
        struct timespec dl;
        clock_gettime (CLOCK_MONOTONIC, &dl);
        double t = (double) dl.tv_nsec * 1e-9 + c->timeout_s;
        dl.tv_sec += (time_t) t;
        dl.tv_nsec = (long) ((t - (double) (time_t) t) * 1e9);
        while (c->finished != c->issued)
            if (pthread_cond_timedwait (&c->done, &c->mu, &dl) == ETIMEDOUT) break;
        if (c->finished != c->issued) {
            uint64_t left = c->issued - c->finished;
            pthread_mutex_unlock (&c->mu);
            s_break_shared (c, NULL, RX_ETIMEDOUT,
                            "rank %d was destroyed with %llu started operation(s) not done within %g s",
                            c->rank, (unsigned long long) left, c->timeout_s);
            pthread_mutex_lock (&c->mu);
        }
    }
    c->stop = 1;
    pthread_cond_signal (&c->work);
    pthread_mutex_unlock (&c->mu);
    pthread_join (c->thr, NULL);
    pthread_cond_destroy (&c->done);
    pthread_cond_destroy (&c->work);
    pthread_mutex_destroy (&c->mu);
    c->thr_on = 0;
}

/* Every started op has run (the caller may then run one itself). */
static void s_drain (struct shm *c)
{
    if (!c->thr_on) return;
    pthread_mutex_lock (&c->mu);
    while (c->finished != c->issued) pthread_cond_wait (&c->done, &c->mu);
    pthread_mutex_unlock (&c->mu);
}

/* ---- ops table ----------------------------------------------------------- */

/* A deferred blocking collective (host_fn's argument, copied by the
 * backend; the op by value: its buffers are device pointers, its stream a
 * handle, nothing points into the caller's frame). */
struct s_closure {
    struct shm *c;
    struct rx_comm_op op;
};
_Static_assert (sizeof (struct s_closure) <= RX_KHOST_FN_MAX_ARG, "host_fn copies at most RX_KHOST_FN_MAX_ARG bytes");

/* Runs a deferred collective: now (eager) or at a graph launch.  The same
 * path as a plain blocking call; the result stays in the instance. */
static void s_deferred (void *arg)
{
    const struct s_closure *cl = arg;
    struct shm *c = cl->c;
    s_drain (c);
    memset (&c->d_err, 0, sizeof c->d_err);
    c->d_rc = s_run (c, &cl->op, &c->d_err);
    c->d_ran = 1;
}

/* A blocking collective: after the started ops, on the caller's thread --
 * or, with a graph-capable backend, through host_fn (see the top). */
static int s_go (void *comm, const struct rx_comm_op *op, struct rx_err *err)
{
    struct shm *c = comm;
    if (!c) return rx_err_set (err, RX_EINVAL, "comm-shm: NULL instance");
    if (c->defer) {
        struct s_closure cl = { .c = c, .op = *op };
        struct rx_err e = { 0 };
        c->d_ran = 0;
        int rc = c->kops->host_fn (c->kbe, op->stream, s_deferred, &cl, sizeof cl, &e);
        if (rc != RX_OK) {
            /* never ran: the peers would wait for this rank */
            s_drain (c);
            return s_break (c, err, rc, "rank %d: %s: host_fn: %s", c->rank,
                            s_kind_name (op->kind), e.msg);
        }
        if (!c->d_ran) return RX_OK;          /* recorded into a graph */
        c->d_ran = 0;
        if (c->d_rc != RX_OK) rx_err_set (err, c->d_rc, "%s", c->d_err.msg);
        return c->d_rc;
    }
    s_drain (c);
    return s_run (c, op, err);
}

RX_COMM_BLOCKING_OPS (s_go)
RX_COMM_BLOCKING_BARRIER (s_go)

/* Queue op for the progress thread (created on the first call). */
static int s_start (void *comm, const struct rx_comm_op *op, rx_comm_req_t **req, struct rx_err *err)
{
    struct shm *c = comm;
    if (req) *req = NULL;
    if (!c || !op || !req)
        return rx_err_set (err, RX_EINVAL, "comm-shm: start: NULL instance, op or req");
    /* c->broken is the progress thread's while ops are queued: the shared
     * flag says the same (it is set first) and is safe to read. */
    if (s_is_broken (c)) return s_shared_reason (c, err, NULL, NULL, 0);
    if (op->struct_size < offsetof (struct rx_comm_op, stream) + sizeof op->stream)
        return s_break_shared (c, err, RX_EINVAL, "rank %d: start: op struct too short (%u bytes)",
                               c->rank, op->struct_size);
    if (!c->thr_on) {
        int rc = s_start_thread (c, err);
        if (rc) return rc;
    }
    pthread_mutex_lock (&c->mu);
    struct rx_comm_req *q = NULL;
    int busy = 0;
    for (int i = 0; i < RX_COMM_MAX_INFLIGHT; i++) {
        if (c->slot[i].state != S_FREE) busy++;
        else if (!q) q = &c->slot[i];
    }
    if (!q) {
        pthread_mutex_unlock (&c->mu);
        return s_break_shared (c, err, RX_EINVAL,
                               "rank %d: start: %d operations already in flight (max %d; wait() for one first)",
                               c->rank, busy, RX_COMM_MAX_INFLIGHT);
    }
    memset (q, 0, sizeof *q);
    memcpy (&q->op, op, s_min (op->struct_size, sizeof q->op));
    q->op.struct_size = sizeof q->op;
    q->owner = c;
    q->seq = ++c->issued;
    q->state = S_QUEUED;
    pthread_cond_signal (&c->work);
    pthread_mutex_unlock (&c->mu);
    *req = q;
    return RX_OK;
}

static int s_wait (void *comm, rx_comm_req_t *req, struct rx_err *err)
{
    struct shm *c = comm;
    if (!c || !req) return rx_err_set (err, RX_EINVAL, "comm-shm: wait: NULL instance or req");
    /* Only this instance's slots; a slot already waited on is free. */
    int ok = c->thr_on && req >= &c->slot[0] && req < &c->slot[RX_COMM_MAX_INFLIGHT]
             && req == &c->slot[req - &c->slot[0]];
    if (ok) {
        pthread_mutex_lock (&c->mu);
        ok = req->state != S_FREE;
        if (!ok) pthread_mutex_unlock (&c->mu);
    }
    if (!ok)
        return rx_err_set (err, RX_EINVAL,
                           "comm-shm %s: wait: rank %d: req %p is not a started, unwaited operation of this instance",
                           c->group, c->rank, (void *) req);
    while (req->state != S_DONE) pthread_cond_wait (&c->done, &c->mu);
    int rc = req->rc;
    if (rc) rx_err_set (err, rc, "%s", req->err.msg);
    req->state = S_FREE;
    pthread_mutex_unlock (&c->mu);
    return rc;
}

static int s_check (void *comm, struct rx_err *err)
{
    struct shm *c = comm;
    if (!c) return rx_err_set (err, RX_EINVAL, "comm-shm: check: NULL instance");
    int busy = 0;
    if (c->thr_on) {
        pthread_mutex_lock (&c->mu);
        busy = c->finished != c->issued;
        pthread_mutex_unlock (&c->mu);
    }
    if (busy)            /* the progress thread owns c->broken: read the shared flag */
        return s_is_broken (c) ? s_shared_reason (c, err, NULL, NULL, 0) : RX_OK;
    if (c->broken) return s_fail (c, err);
    if (s_is_broken (c)) return s_adopt (c, err);
    return RX_OK;
}

static int s_graph_capturable (void *comm)
{
    const struct shm *c = comm;
    return c && c->defer;
}

static const struct rx_comm_ops s_ops = {
    .struct_size = sizeof (struct rx_comm_ops),
    .create = s_create,
    .destroy = s_destroy,
    .all_reduce = s_all_reduce_b,
    .all_gather = s_all_gather_b,
    .reduce_scatter = s_reduce_scatter_b,
    .all_to_all_v = s_all_to_all_v_b,
    .broadcast = s_broadcast_b,
    .barrier = s_barrier_b,
    .start = s_start,
    .wait = s_wait,
    .check = s_check,
    .graph_capturable = s_graph_capturable,
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_COMM, .name = "shm", .version = "1.0",
                  .description = "collectives between CPU ranks of one host over POSIX shared memory",
                  .keys = s_keys, .ops = &s_ops)
