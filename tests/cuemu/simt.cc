/* tests/cuemu/simt.cc -- the SIMT executor of the CUDA emulator
 * (tests/cuemu/README.md "The SIMT executor"): runs a kernel grid on the
 * CPU, block after block; the threads of a block are fibers.
 *
 * Why fibers: a CUDA thread may stop in the middle of the kernel at a
 * barrier (__syncthreads) or a warp op (__shfl_*_sync, __syncwarp, ...)
 * until the threads it waits for arrive, so each emulated thread needs its
 * own stack.  A switch is a few instructions of assembly (x86-64: push the
 * callee-saved registers, swap the stack pointer, pop), not swapcontext
 * (a syscall each; it is the fallback on other CPUs or with
 * -DCUEMU_UCONTEXT).
 *
 * Scheduling: a LIFO of ready threads, first 0, 1, 2, ...; a released
 * group goes on top, lowest lane first, so a warp tends to run to its end
 * before the next starts (CUEMU_ORDER=reverse: the other way round).  A
 * thread that blocks or ends does the bookkeeping itself (s_after: a warp's
 * waiting lanes are matched when no lane of the warp can run; a
 * __syncthreads when every thread of the block waits there or has exited)
 * and hands the CPU straight to the next ready thread (s_dispatch): a
 * fiber whose thread ended starts the next not-yet-started thread itself,
 * without any switch, so a block without barriers runs its threads one
 * after another on one stack at the cost of a function call each.  When no
 * thread is ready, control returns to the host thread (the scheduler
 * context): the block is done, or deadlocked -- reported with what each
 * thread waits at, and the grid is abandoned (fibers stopped mid-thread
 * are reset, never resumed).
 *
 * Thread-safety: one grid at a time (s_mutex); the built-in variables
 * (threadIdx, ...) are plain globals set for the running thread. */
#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuemu.h"

#if defined(__has_include)
#  if __has_include(<valgrind/valgrind.h>)
#    include <valgrind/valgrind.h>
#    define S_HAVE_VALGRIND 1
#  endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#  include <sanitizer/asan_interface.h>
#  include <sanitizer/common_interface_defs.h>
#  define S_ASAN 1
#endif

#if !defined(__x86_64__) || defined(CUEMU_UCONTEXT)
#  define S_UCONTEXT 1
#  include <ucontext.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* ------------------------------------------------------ context switch -- */

#ifndef S_UCONTEXT
/* cuemu_swap (save, load): pushes the callee-saved registers, stores the
 * stack pointer in *save, loads `load` and pops the other context's.
 * cuemu_fiber_start: where a new fiber's first switch returns to; calls
 * r13 (r12) -- s_fiber_main (fiber). */
extern "C" void cuemu_swap (void **save, void *load);
extern "C" void cuemu_fiber_start ();
__asm__ (
    ".pushsection .text\n"
    ".globl cuemu_swap\n"
    ".hidden cuemu_swap\n"
    ".type cuemu_swap, @function\n"
    "cuemu_swap:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size cuemu_swap, .-cuemu_swap\n"
    ".globl cuemu_fiber_start\n"
    ".hidden cuemu_fiber_start\n"
    ".type cuemu_fiber_start, @function\n"
    "cuemu_fiber_start:\n"
    "    movq %r12, %rdi\n"
    "    callq *%r13\n"
    "    ud2\n"
    ".size cuemu_fiber_start, .-cuemu_fiber_start\n"
    ".popsection\n");
#endif

namespace cuemu {
namespace {

constexpr size_t S_STACK = 256 * 1024;   /* per fiber, lazily committed */
constexpr int S_MAXT = max_threads_per_block;

enum { T_READY = 0, T_WAIT = 1, T_DONE = 2 };

/* A context to switch to: the scheduler's (the host thread running the
 * grid) or a fiber's. */
struct context {
    void *sp;
#ifdef S_UCONTEXT
    ucontext_t uc;
#endif
    const void *lo;      /* the stack (ASan's fiber annotations) */
    size_t size;
};

struct fiber {
    context c;
    int id;
    char *lo;            /* usable stack: [lo, lo + S_STACK) above a guard page */
    unsigned vg_id;      /* valgrind's stack id (S_HAVE_VALGRIND) */
};

struct thread_rec {
    int state;
    int fib;             /* the fiber running it, -1 before it starts / after */
    int kind;            /* T_WAIT: enum op_kind */
    unsigned mask;
    int b, c;
    const char *file;
    int line;
    uint64_t val, res;
};

struct grid_state {
    /* the launch */
    const char *name;
    const void *kernel;
    thread_fn fn;
    void *ctx;
    unsigned bx, by, n;   /* block dims, threads per block */
    uint3 tid[S_MAXT];    /* threadIdx of each linear thread id */
    /* the block */
    thread_rec th[S_MAXT];
    int ready[S_MAXT], nready;
    int pending[S_MAXT / 32];     /* lanes of the warp that are runnable */
    unsigned live[S_MAXT / 32];   /* lanes that have not exited */
    unsigned waiting[S_MAXT / 32];/* lanes waiting at a warp op (not __syncthreads) */
    unsigned nbar, ndone;
    void *shared_seen[64];        /* __shared__ variables poisoned in this block */
    int nshared;
    int cur;
    bool running, failed;
    std::string err;
    /* fibers */
    fiber *fib[S_MAXT];
    int nfib;
    int idle[S_MAXT], nidle;
    context sched;          /* the host thread's context */
    context *from;          /* the context the last switch left */
};

grid_state g;
std::mutex s_mutex;
thread_local bool s_in_grid;   /* this host thread is running a grid */
unsigned char *s_smem;
/* CUEMU_ORDER=reverse: threads start, and released groups resume, highest
 * first -- a missing barrier between a write by a lower thread and a read
 * by a higher one then shows (the default order hides it). */
bool s_reverse;

void s_fiber_main (fiber *f);

#ifdef S_UCONTEXT
void s_uc_entry (unsigned hi, unsigned lo)
{
    s_fiber_main ((fiber *) (((uintptr_t) hi << 32) | lo));
}
#endif

void s_fiber_init (fiber *f)
{
#ifdef S_ASAN
    /* an abandoned fiber's frames leave their redzones poisoned */
    __asan_unpoison_memory_region (f->lo, S_STACK);
#endif
    f->c.lo = f->lo;
    f->c.size = S_STACK;
#ifdef S_UCONTEXT
    getcontext (&f->c.uc);
    f->c.uc.uc_stack.ss_sp = f->lo;
    f->c.uc.uc_stack.ss_size = S_STACK;
    f->c.uc.uc_link = nullptr;
    const uintptr_t p = (uintptr_t) f;
    makecontext (&f->c.uc, (void (*) ()) s_uc_entry, 2, (unsigned) (p >> 32), (unsigned) p);
#else
    /* The frame cuemu_swap pops: r15 r14 r13 r12 rbx rbp, then the return
     * address; cuemu_fiber_start is entered with rsp 16-byte aligned. */
    uintptr_t top = ((uintptr_t) (f->lo + S_STACK)) & ~(uintptr_t) 15;
    void **sp = (void **) (top - 16 - 8 - 6 * sizeof (void *));
    sp[0] = nullptr;                         /* r15 */
    sp[1] = nullptr;                         /* r14 */
    sp[2] = (void *) &s_fiber_main;          /* r13 */
    sp[3] = (void *) f;                      /* r12 */
    sp[4] = nullptr;                         /* rbx */
    sp[5] = nullptr;                         /* rbp */
    sp[6] = (void *) &cuemu_fiber_start;     /* return address */
    f->c.sp = sp;
#endif
}

fiber *s_fiber_new ()
{
    const size_t page = (size_t) sysconf (_SC_PAGESIZE);
    void *m = mmap (nullptr, S_STACK + page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect (m, page, PROT_NONE);   /* a stack overflow faults instead of corrupting */
    fiber *f = new fiber ();
    f->lo = (char *) m + page;
#ifdef S_HAVE_VALGRIND
    f->vg_id = VALGRIND_STACK_REGISTER (f->lo, f->lo + S_STACK);
#endif
    s_fiber_init (f);
    return f;
}

/* At exit or when the plugin is unloaded (dlclose): the fibers' stacks
 * and records and the shared memory go back, so neither LeakSanitizer nor
 * valgrind sees them as lost once the globals that held them are gone. */
__attribute__ ((destructor)) void s_release_all ()
{
    const size_t page = (size_t) sysconf (_SC_PAGESIZE);
    for (int i = 0; i < g.nfib; i++) {
        fiber *f = g.fib[i];
#ifdef S_HAVE_VALGRIND
        VALGRIND_STACK_DEREGISTER (f->vg_id);
#endif
        munmap (f->lo - page, S_STACK + page);
        delete f;
        g.fib[i] = nullptr;
    }
    g.nfib = 0;
    g.nidle = 0;
    free (s_smem);
    s_smem = nullptr;
}

/* Switch from context `from` (the running one) to `to`; returns when
 * something switches back to `from`. */
inline void s_switch (context *from, context *to)
{
    g.from = from;
#ifdef S_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber (&fake, to->lo, to->size);
#endif
#ifdef S_UCONTEXT
    swapcontext (&from->uc, &to->uc);
#else
    cuemu_swap (&from->sp, to->sp);
#endif
#ifdef S_ASAN
    const void *lo;
    size_t size;
    __sanitizer_finish_switch_fiber (fake, &lo, &size);
    if (g.from == &g.sched) {   /* learn the host thread's stack */
        g.sched.lo = lo;
        g.sched.size = size;
    }
#endif
}

void s_dispatch (fiber *self, bool self_free);
bool s_after (int t);

/* A fiber runs one emulated thread after another: the thread is g.cur
 * when the fiber is first resumed, and whenever s_dispatch returns to
 * this loop after the thread ended. */
void s_fiber_main (fiber *f)
{
#ifdef S_ASAN
    const void *lo;
    size_t size;
    __sanitizer_finish_switch_fiber (nullptr, &lo, &size);
    if (g.from == &g.sched) {
        g.sched.lo = lo;
        g.sched.size = size;
    }
#endif
    for (;;) {
        g.fn (g.ctx);
        const int t = g.cur;
        g.th[t].state = T_DONE;
        s_after (t);
        s_dispatch (f, true);
    }
}

/* ------------------------------------------------------------ messages -- */

const char *s_op_name (int kind)
{
    switch (kind) {
    case OP_SYNCTHREADS: return "__syncthreads";
    case OP_SYNCWARP: return "__syncwarp";
    case OP_SHFL_IDX: return "__shfl_sync";
    case OP_SHFL_UP: return "__shfl_up_sync";
    case OP_SHFL_DOWN: return "__shfl_down_sync";
    case OP_SHFL_XOR: return "__shfl_xor_sync";
    case OP_MATCH_ANY: return "__match_any_sync";
    case OP_BALLOT: return "__ballot_sync";
    case OP_ANY: return "__any_sync";
    case OP_ALL: return "__all_sync";
    default: return "?";
    }
}

const char *s_base (const char *path)
{
    const char *s = path ? strrchr (path, '/') : nullptr;
    return s ? s + 1 : path ? path : "?";
}

std::string s_fmt (const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));
std::string s_fmt (const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (buf, sizeof buf, fmt, ap);
    va_end (ap);
    return buf;
}

std::string s_thread_name (int t)
{
    if (g.n == g.bx) return s_fmt ("%d", t);
    return s_fmt ("%d (%u,%u,%u)", t, t % g.bx, t / g.bx % g.by, t / (g.bx * g.by));
}

std::string s_where ()
{
    return s_fmt ("kernel %s: block (%u,%u,%u) of grid (%u,%u,%u), block (%u,%u,%u)",
                  g.name ? g.name : "?", blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y,
                  gridDim.z, blockDim.x, blockDim.y, blockDim.z);
}

std::string s_wait_desc (int t)
{
    const thread_rec &r = g.th[t];
    if (r.state == T_DONE) return "exited";
    if (r.state == T_READY) return "runnable";
    if (r.kind == OP_SYNCTHREADS)
        return s_fmt ("at __syncthreads (%s:%d)", s_base (r.file), r.line);
    return s_fmt ("at %s (%s:%d, mask 0x%08x)", s_op_name (r.kind), s_base (r.file), r.line,
                  r.mask);
}

/* Every thread's state, consecutive threads with the same one as a range. */
std::string s_all_threads ()
{
    std::string out;
    int groups = 0;
    for (unsigned t = 0; t < g.n;) {
        const std::string d = s_wait_desc ((int) t);
        unsigned e = t + 1;
        while (e < g.n && s_wait_desc ((int) e) == d) e++;
        if (groups++ == 24) {
            out += "; ...";
            break;
        }
        out += groups > 1 ? "; " : "";
        out += e - t == 1 ? "thread " + s_thread_name ((int) t)
                          : "threads " + s_thread_name ((int) t) + "-" + s_thread_name ((int) e - 1);
        out += (d == "exited" || d == "runnable" ? (e - t == 1 ? " is " : " are ")
                                                  : (e - t == 1 ? " waits " : " wait ")) + d;
        t = e;
    }
    return out;
}

void s_fail (const std::string &msg)
{
    if (g.failed) return;
    g.failed = true;
    g.err = msg;
}

/* ---------------------------------------------------------- matching -- */

inline bool s_same_site (const thread_rec &a, const thread_rec &b)
{
    return a.kind == b.kind && a.line == b.line &&
           (a.file == b.file || (a.file && b.file && strcmp (a.file, b.file) == 0));
}

inline void s_push (int t)
{
    g.ready[g.nready++] = t;
}

/* The op result of lane i of a matched group (lanes `grp` of the warp at
 * base, all waiting at the same op). */
uint64_t s_result (int base, unsigned grp, int i)
{
    const thread_rec &r = g.th[base + i];
    switch (r.kind) {
    case OP_SHFL_IDX: case OP_SHFL_UP: case OP_SHFL_DOWN: case OP_SHFL_XOR: {
        /* PTX shfl.sync: b[4:0], segmask = c[12:8], clamp c[4:0] */
        const int bval = r.b & 31, segmask = (r.c >> 8) & 31, cval = r.c & 31;
        const int max_lane = (i & segmask) | (cval & ~segmask), min_lane = i & segmask;
        int j;
        bool p;
        switch (r.kind) {
        case OP_SHFL_UP: j = i - bval; p = j >= max_lane; break;
        case OP_SHFL_DOWN: j = i + bval; p = j <= max_lane; break;
        case OP_SHFL_XOR: j = i ^ bval; p = j <= max_lane; break;
        default: j = min_lane | (bval & ~segmask); p = j <= max_lane; break;
        }
        if (!p) j = i;
        /* A source lane that exited or is not in the mask: undefined in
         * CUDA; here the thread's own value. */
        if (!(grp & (1u << j))) j = i;
        return g.th[base + j].val;
    }
    case OP_MATCH_ANY: {
        unsigned m = 0;
        for (int j = 0; j < 32; j++)
            if ((grp & (1u << j)) && g.th[base + j].val == r.val) m |= 1u << j;
        return m;
    }
    case OP_BALLOT: case OP_ANY: case OP_ALL: {
        unsigned m = 0;
        for (int j = 0; j < 32; j++)
            if ((grp & (1u << j)) && g.th[base + j].val) m |= 1u << j;
        if (r.kind == OP_BALLOT) return m;
        if (r.kind == OP_ANY) return m != 0;
        return m == grp;
    }
    default:
        return 0;
    }
}

/* Release every group of warp w whose lanes (those of its mask that have
 * not exited) all wait at the same warp op.  Called when no lane of w is
 * runnable. */
void s_match_warp (int w)
{
    const int base = w * 32;
    const unsigned live = g.live[w];
    unsigned todo = g.waiting[w];
    while (todo) {
        const int l = __builtin_ctz (todo);
        const thread_rec &r = g.th[base + l];
        const unsigned grp = r.mask & live;
        bool ok = true;
        for (unsigned m = grp; m && ok; m &= m - 1) {
            const int j = __builtin_ctz (m);
            const thread_rec &o = g.th[base + j];
            if (!(g.waiting[w] & (1u << j)) || !s_same_site (o, r)) {
                ok = false;
            } else if (o.mask != r.mask) {
                s_fail (s_where () + s_fmt (": lanes of warp %d reach %s (%s:%d) with different masks "
                                            "(thread %s: 0x%08x, thread %s: 0x%08x)",
                                            w, s_op_name (r.kind), s_base (r.file), r.line,
                                            s_thread_name (base + l).c_str (), r.mask,
                                            s_thread_name (base + j).c_str (), o.mask));
                return;
            }
        }
        todo &= ~grp & ~(1u << l);
        if (!ok) continue;
        for (unsigned m = grp; m; m &= m - 1) {
            const int j = __builtin_ctz (m);
            g.th[base + j].res = s_result (base, grp, j);
        }
        g.waiting[w] &= ~grp;
        for (unsigned m = grp; m;) {   /* pushed highest first: the lowest lane runs next */
            const int j = s_reverse ? __builtin_ctz (m) : 31 - __builtin_clz (m);
            m &= ~(1u << j);
            g.th[base + j].state = T_READY;
            s_push (base + j);
            g.pending[w]++;
        }
    }
}

/* Every thread waits at a __syncthreads or has exited: release them if it
 * is the same __syncthreads. */
void s_match_barrier ()
{
    int first = -1;
    for (unsigned t = 0; t < g.n; t++) {
        const thread_rec &r = g.th[t];
        if (r.state != T_WAIT) continue;
        if (first < 0) first = (int) t;
        else if (!s_same_site (r, g.th[first])) {
            s_fail (s_where () + ": divergent __syncthreads: " + s_all_threads ());
            return;
        }
    }
    for (int i = 0; i < (int) g.n; i++) {
        const int t = s_reverse ? i : (int) g.n - 1 - i;
        if (g.th[t].state == T_WAIT) {
            g.th[t].state = T_READY;
            s_push (t);
            g.pending[t >> 5]++;
        }
    }
    g.nbar = 0;
}

/* A thread just blocked at its op: the checks CUDA states as rules. */
bool s_check_op (int t)
{
    const thread_rec &r = g.th[t];
    if (r.kind == OP_SYNCTHREADS) return true;
    const int lane = t & 31;
    if (!(r.mask & (1u << lane))) {
        s_fail (s_where () + s_fmt (": thread %s calls %s (%s:%d) with mask 0x%08x, which does not "
                                    "include its lane %d",
                                    s_thread_name (t).c_str (), s_op_name (r.kind), s_base (r.file),
                                    r.line, r.mask, lane));
        return false;
    }
    if (r.kind >= OP_SHFL_IDX && r.kind <= OP_SHFL_XOR) {
        const int width = 32 - ((r.c >> 8) & 0xff);
        if (width < 1 || width > 32 || (width & (width - 1)) || (r.c >> 8) > 31) {
            s_fail (s_where () + s_fmt (": thread %s calls %s (%s:%d) with width %d (a power of 2 "
                                        "in 1..32)",
                                        s_thread_name (t).c_str (), s_op_name (r.kind),
                                        s_base (r.file), r.line, 32 - (r.c >> 8)));
            return false;
        }
    }
    return true;
}

int s_take_fiber ()
{
    if (g.nidle > 0) return g.idle[--g.nidle];
    if (g.nfib == S_MAXT) return -1;
    fiber *f = s_fiber_new ();
    if (!f) return -1;
    f->id = g.nfib;
    g.fib[g.nfib] = f;
    return g.nfib++;
}

/* Bookkeeping after thread t (the running one) ended (T_DONE) or
 * blocked at its op (T_WAIT): counts, then the matching that may release
 * threads.  Runs on t's fiber.  False when the block failed. */
bool s_after (int t)
{
    thread_rec &r = g.th[t];
    const int w = t >> 5;
    if (r.state == T_DONE) {
        r.fib = -1;   /* the fiber goes on running: s_dispatch decides where */
        g.ndone++;
        g.live[w] &= ~(1u << (t & 31));
    } else {
        if (!s_check_op (t)) return false;
        if (r.kind == OP_SYNCTHREADS) g.nbar++;
        else g.waiting[w] |= 1u << (t & 31);
    }
    if (--g.pending[w] == 0) s_match_warp (w);
    if (g.failed) return false;
    if (g.nbar > 0 && g.nbar + g.ndone == g.n) s_match_barrier ();
    return !g.failed;
}

/* Hands the CPU from the running context -- fiber self, or the scheduler
 * (self == nullptr) -- to the next ready thread: the same fiber when that
 * is its own thread again, or, when self is free (its thread ended) and
 * the next thread has not started, by returning to self's loop to start it
 * there (no switch at all: a block without barriers runs its threads one
 * after another on one stack); otherwise by switching to the next thread's
 * fiber (a fresh thread takes an idle fiber).  No ready thread, or a
 * failure: to the scheduler, which then finds the block done, deadlocked or
 * failed.  Returns when self is resumed with g.cur its thread to continue
 * or (self free) to start. */
void s_dispatch (fiber *self, bool self_free)
{
    context *me = self ? &self->c : &g.sched;
    int t = -1;
    if (!g.failed && g.nready > 0) {
        t = g.ready[--g.nready];
        thread_rec &r = g.th[t];
        if (r.fib < 0) {
            if (self_free) {
                r.fib = self->id;
                g.cur = t;
                threadIdx = g.tid[t];
                return;
            }
            r.fib = s_take_fiber ();
            if (r.fib < 0) {
                s_fail (s_where () + ": out of memory for thread stacks");
                t = -1;
            }
        }
    }
    if (self_free) g.idle[g.nidle++] = self->id;
    if (t < 0) {
        if (self) s_switch (me, &g.sched);
        return;
    }
    g.cur = t;
    threadIdx = g.tid[t];
    fiber *to = g.fib[g.th[t].fib];
    if (to != self) s_switch (me, &to->c);
}

/* Runs the current block; false when it failed (g.err). */
bool s_run_block ()
{
    const unsigned n = g.n;
    for (unsigned t = 0; t < n; t++) {
        g.th[t].state = T_READY;
        g.th[t].fib = -1;
    }
    for (unsigned w = 0; w < (n + 31) / 32; w++) {
        const unsigned lanes = n - w * 32 < 32 ? n - w * 32 : 32;
        g.pending[w] = (int) lanes;
        g.live[w] = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        g.waiting[w] = 0;
    }
    g.nready = 0;
    for (int i = 0; i < (int) n; i++) s_push (s_reverse ? i : (int) n - 1 - i);
    g.nbar = g.ndone = 0;
    g.nshared = 0;
    s_dispatch (nullptr, false);   /* back here when no thread is ready */
    if (g.failed) return false;
    if (g.ndone < n) {
        s_fail (s_where () + ": deadlock, no thread can continue: " + s_all_threads ());
        return false;
    }
    return true;
}

/* After a failed block: fibers stopped mid-thread are reset, never
 * resumed (their stacks are simply reused). */
void s_abandon ()
{
    for (unsigned t = 0; t < g.n; t++) {
        thread_rec &r = g.th[t];
        if (r.fib >= 0) {
            s_fiber_init (g.fib[r.fib]);
            g.idle[g.nidle++] = r.fib;
            r.fib = -1;
        }
    }
}

}  // namespace

/* -------------------------------------------------------------- API -- */

void *dyn_smem ()
{
    return s_smem;
}

void shared_decl (void *p, size_t bytes)
{
    if (!g.running) return;
    for (int i = 0; i < g.nshared; i++)
        if (g.shared_seen[i] == p) return;
    if (g.nshared == 64) return;
    g.shared_seen[g.nshared++] = p;
    memset (p, 0xff, bytes);
}

bool check_cfg (const launch_cfg &c, const void *kernel)
{
    const char *name = c.name ? c.name : "?";
    char msg[256];
    const unsigned long long nt = (unsigned long long) c.block.x * c.block.y * c.block.z;
    if (nt < 1 || nt > (unsigned long long) max_threads_per_block || c.block.x > 1024 ||
        c.block.y > 1024 || c.block.z > 64) {
        snprintf (msg, sizeof msg,
                  "kernel %s: launch with block (%u,%u,%u): 1..1024 threads, at most (1024,1024,64)",
                  name, c.block.x, c.block.y, c.block.z);
        set_error (cudaErrorInvalidConfiguration, msg);
        return false;
    }
    if (c.grid.x < 1 || c.grid.y < 1 || c.grid.z < 1 || c.grid.x > 0x7fffffffu ||
        c.grid.y > 65535 || c.grid.z > 65535) {
        snprintf (msg, sizeof msg,
                  "kernel %s: launch with grid (%u,%u,%u): each dimension >= 1, at most "
                  "(2^31-1,65535,65535)",
                  name, c.grid.x, c.grid.y, c.grid.z);
        set_error (cudaErrorInvalidConfiguration, msg);
        return false;
    }
    const size_t lim = max_dyn_smem (kernel);
    if (c.smem > lim) {
        snprintf (msg, sizeof msg,
                  "kernel %s: launch with %zu bytes of dynamic shared memory, over its limit of %zu "
                  "(cudaFuncSetAttribute MaxDynamicSharedMemorySize)",
                  name, c.smem, lim);
        set_error (cudaErrorInvalidValue, msg);
        return false;
    }
    return true;
}

cudaError_t run_grid (const launch_cfg &c, const void *kernel, thread_fn fn, void *ctx)
{
    if (s_in_grid) {
        /* a launch from inside a kernel (dynamic parallelism) */
        set_error (cudaErrorNotSupported, "kernel launch from a kernel: not emulated");
        return cudaErrorNotSupported;
    }
    std::lock_guard<std::mutex> lock (s_mutex);
    if (!s_smem) {
        const char *o = getenv ("CUEMU_ORDER");
        s_reverse = o && strcmp (o, "reverse") == 0;
        s_smem = (unsigned char *) aligned_alloc (128, max_smem_optin);
        if (!s_smem) {
            set_error (cudaErrorMemoryAllocation, "out of memory for shared memory");
            return cudaErrorMemoryAllocation;
        }
    }
    g.name = c.name;
    g.kernel = kernel;
    g.fn = fn;
    g.ctx = ctx;
    g.bx = c.block.x;
    g.by = c.block.y;
    g.n = c.block.x * c.block.y * c.block.z;
    g.failed = false;
    g.running = true;
    s_in_grid = true;
    g.err.clear ();
    blockDim = c.block;
    gridDim = c.grid;
    for (unsigned t = 0; t < g.n; t++)
        g.tid[t] = uint3 { t % g.bx, t / g.bx % g.by, t / (g.bx * g.by) };
    for (unsigned z = 0; z < c.grid.z && !g.failed; z++)
        for (unsigned y = 0; y < c.grid.y && !g.failed; y++)
            for (unsigned x = 0; x < c.grid.x; x++) {
                blockIdx.x = x;
                blockIdx.y = y;
                blockIdx.z = z;
                if (c.smem) memset (s_smem, 0xff, c.smem);
                if (!s_run_block ()) {
                    s_abandon ();
                    break;
                }
            }
    g.running = false;
    s_in_grid = false;
    g.cur = -1;
    if (g.failed) {
        set_error (cudaErrorLaunchFailure, g.err.c_str ());
        return cudaErrorLaunchFailure;
    }
    return cudaSuccess;
}

uint64_t sync_op (int kind, unsigned mask, uint64_t val, int b, int c, const char *file, int line)
{
    if (!g.running || g.cur < 0) {
        fprintf (stderr, "cuemu: %s (%s:%d) called outside a kernel\n", s_op_name (kind),
                 s_base (file), line);
        abort ();
    }
    const int t = g.cur;
    thread_rec &r = g.th[t];
    r.kind = kind;
    r.mask = mask;
    r.val = val;
    r.b = b;
    r.c = c;
    r.file = file;
    r.line = line;
    r.state = T_WAIT;
    fiber *self = g.fib[r.fib];
    s_after (t);
    s_dispatch (self, false);
    return g.th[t].res;
}

}  // namespace cuemu
