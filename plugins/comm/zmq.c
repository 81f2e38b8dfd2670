/* plugins/comm/zmq.c -- comm-zmq: collectives between CPU ranks on different
 * hosts, over the ZMQ control group (core/zgroup.c, compiled in).
 *
 * A correctness path, not a fast one: every collective is built on one
 * rx_zgroup_allgather (or bcast), i.e. one round trip through rank 0 with
 * whole tensors as single ZMQ messages.
 *
 *   all_reduce      allgather of every rank's send; every rank reduces the n
 *                   blocks itself in rank order 0..n-1 (f16/bf16 through
 *                   float) with the same code, so results are bitwise equal.
 *   reduce_scatter  allgather of every rank's whole send (n x the traffic of
 *                   a ring); each rank reduces only its slice.
 *   all_gather      allgather.
 *   all_to_all_v    allgather of each rank's send counts, recv counts and
 *                   send buffer; each rank picks its pieces.  Every rank sees
 *                   every rank's counts, so a pairwise mismatch fails on all
 *                   ranks alike.
 *   broadcast       bcast.   barrier: barrier.
 *
 * Each contribution starts with a small header (kind, dtype, reduction,
 * count): ranks that disagree on it fail on every rank with RX_EIO naming
 * the ranks and values, instead of reducing garbage.
 *
 * Buffers are host memory (kernels-cpu); streams are ignored (the CPU
 * backend is synchronous).  start() runs the operation at once and wait()
 * returns its status: correct, not concurrent (no progress thread).  That
 * is deliberate for now (comm.h allows it): a thread would have to own the
 * ZMQ sockets, which are not thread-safe, so every blocking call would go
 * through it too; comm-shm shows the design if zmq ever needs overlap.
 * Ordering (comm.h) holds trivially: every op has finished when its call
 * returns.
 *
 * Failure: a timeout, a dead peer, a disagreement or a bad argument breaks
 * the group (rx_zgroup_abort tells the others) and every later call fails
 * at once. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <radix/comm.h>
#include <radix/plugin.h>

#include "blocking.h"

#include "reduce.h"

#include "zgroup.h"

struct zc {
    const struct rx_host *host;
    const struct rx_kernels_ops *kops;   /* owner of the op buffers; NULL: host memory */
    void *kbe;
    rx_zgroup_t *g;
    int rank, n;
    char group[72];
    unsigned long long opno;
    int inflight;
};

struct rx_comm_req {
    int rc;
    struct rx_err err;
};

/* The header of every contribution. */
struct s_hd {
    int32_t kind, dtype, red, root;
    uint64_t count;
};

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

/* Break the group with a message (prefixed with plugin, group and rank) and
 * return its code. */
#if defined(__GNUC__)
__attribute__ ((format (printf, 4, 5)))
#endif
static int s_break (struct zc *c, struct rx_err *err, int code, const char *fmt, ...)
{
    struct rx_err e;
    char m[RX_ERR_MSG_MAX];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (m, sizeof m, fmt, ap);
    va_end (ap);
    rx_err_set (&e, code, "comm-zmq %s rank %d: %s", c->group, c->rank, m);
    rx_zgroup_abort (c->g, &e);
    return rx_err_set (err, code, "%s", e.msg);
}

/* ---- the collectives ------------------------------------------------------ */

/* Allgather hd + extra (xlen bytes) + data (len bytes); on success *all is
 * the concatenation (free()) and blk[r] points at rank r's block after its
 * header, blen[r] its length.  Checks that every rank's header equals ours
 * (counts too when same_count). */
static int s_exchange (struct zc *c, const struct s_hd *hd, const void *extra, size_t xlen,
                       const void *data, size_t len, int same_count, unsigned char **all,
                       const unsigned char **blk, size_t *blen, const char *what, struct rx_err *err)
{
    size_t n = sizeof *hd + xlen + len;
    unsigned char *mine = malloc (n);
    if (!mine) return s_break (c, err, RX_ENOMEM, "%s: out of memory (%zu bytes)", what, n);
    memcpy (mine, hd, sizeof *hd);
    if (xlen) memcpy (mine + sizeof *hd, extra, xlen);
    if (len) memcpy (mine + sizeof *hd + xlen, data, len);
    size_t *lens = malloc ((size_t) c->n * sizeof *lens);
    void *out = NULL;
    int rc = lens ? rx_zgroup_allgather (c->g, mine, n, &out, lens, -1, err) : RX_ENOMEM;
    free (mine);
    if (rc) {
        free (lens);
        if (rc == RX_ENOMEM && !out) return s_break (c, err, RX_ENOMEM, "%s: out of memory", what);
        /* the group is broken already; say which operation */
        char m[RX_ERR_MSG_MAX];
        snprintf (m, sizeof m, "%s", err ? err->msg : "");
        return rx_err_set (err, rc, "comm-zmq %s rank %d: %s: %s", c->group, c->rank, what, m);
    }
    unsigned char *p = out;
    size_t o = 0;
    for (int r = 0; r < c->n; r++) {
        struct s_hd h;
        if (lens[r] < sizeof h) {
            free (lens);
            free (out);
            return s_break (c, err, RX_EIO, "%s: rank %d sent %zu bytes, no header", what, r, lens[r]);
        }
        memcpy (&h, p + o, sizeof h);
        if (h.kind != hd->kind || h.dtype != hd->dtype || h.red != hd->red || h.root != hd->root
            || (same_count && h.count != hd->count)) {
            free (lens);
            free (out);
            return s_break (c, err, RX_EIO,
                            "%s: ranks diverged: rank %d calls %s (dtype %d, red %d, root %d, count %llu), rank %d %s (dtype %d, red %d, root %d, count %llu)",
                            what, r, s_kind_name (h.kind), (int) h.dtype, (int) h.red, (int) h.root,
                            (unsigned long long) h.count, c->rank, s_kind_name (hd->kind),
                            (int) hd->dtype, (int) hd->red, (int) hd->root,
                            (unsigned long long) hd->count);
        }
        blk[r] = p + o + sizeof h;
        blen[r] = lens[r] - sizeof h;
        o += lens[r];
    }
    free (lens);
    *all = out;
    return RX_OK;
}

static int s_blocks (struct zc *c, const unsigned char ***blk, size_t **blen, const char *what,
                     struct rx_err *err)
{
    *blk = malloc ((size_t) c->n * sizeof **blk);
    *blen = malloc ((size_t) c->n * sizeof **blen);
    if (*blk && *blen) return RX_OK;
    free (*blk);
    free (*blen);
    return s_break (c, err, RX_ENOMEM, "%s: out of memory", what);
}

/* all_reduce (slice -1: all count elements) and reduce_scatter (each rank
 * sends n*count, reduces its slice). */
static int s_reduce (struct zc *c, const struct rx_comm_op *op, size_t elt, int scatter,
                     const char *what, struct rx_err *err)
{
    rx_red_fn fn = rx_red_pick (op->dtype, op->red);
    size_t bytes = op->count * elt * (scatter ? (size_t) c->n : 1);
    struct s_hd hd = { op->kind, op->dtype, op->red, 0, op->count };
    const unsigned char **blk;
    size_t *blen;
    unsigned char *all = NULL;
    int rc = s_blocks (c, &blk, &blen, what, err);
    if (rc) return rc;
    rc = s_exchange (c, &hd, NULL, 0, op->send, bytes, 1, &all, blk, blen, what, err);
    if (!rc) {
        if (scatter) {
            size_t off = (size_t) c->rank * op->count * elt;
            for (int r = 0; r < c->n; r++) blk[r] += off;
        }
        fn (op->recv, (const void *const *) blk, c->n, op->count);
    }
    free (all);
    free (blk);
    free (blen);
    return rc;
}

static int s_all_gather (struct zc *c, const struct rx_comm_op *op, size_t elt, const char *what,
                         struct rx_err *err)
{
    struct s_hd hd = { op->kind, op->dtype, 0, 0, op->count };
    size_t bytes = op->count * elt;
    const unsigned char **blk;
    size_t *blen;
    unsigned char *all = NULL;
    int rc = s_blocks (c, &blk, &blen, what, err);
    if (rc) return rc;
    rc = s_exchange (c, &hd, NULL, 0, op->send, bytes, 1, &all, blk, blen, what, err);
    if (!rc)
        for (int r = 0; r < c->n; r++)   /* memmove: send may be recv + rank*count */
            if (bytes) memmove ((unsigned char *) op->recv + (size_t) r * bytes, blk[r], bytes);
    free (all);
    free (blk);
    free (blen);
    return rc;
}

static int s_all_to_all_v (struct zc *c, const struct rx_comm_op *op, size_t elt, const char *what,
                           struct rx_err *err)
{
    int n = c->n;
    /* extra: my send counts, then my recv counts (uint64 each); data: my
     * send pieces packed in peer order. */
    size_t xlen = 2 * (size_t) n * sizeof (uint64_t), tot = 0;
    for (int p = 0; p < n; p++) tot += op->send_counts[p] * elt;
    uint64_t *x = malloc (xlen);
    unsigned char *pk = malloc (tot ? tot : 1);
    const unsigned char **blk = NULL;
    size_t *blen = NULL;
    unsigned char *all = NULL;
    int rc = RX_OK;
    if (!x || !pk) {
        rc = s_break (c, err, RX_ENOMEM, "%s: out of memory (%zu bytes)", what, tot);
        goto out;
    }
    size_t o = 0;
    for (int p = 0; p < n; p++) {
        x[p] = op->send_counts[p];
        x[n + p] = op->recv_counts[p];
        size_t b = op->send_counts[p] * elt;
        if (b) memcpy (pk + o, (const unsigned char *) op->send + op->send_displs[p] * elt, b);
        o += b;
    }
    struct s_hd hd = { op->kind, op->dtype, 0, 0, 0 };
    rc = s_blocks (c, &blk, &blen, what, err);
    if (rc) goto out;
    rc = s_exchange (c, &hd, x, xlen, pk, tot, 0, &all, blk, blen, what, err);
    if (rc) goto out;
    /* Every rank checks every pair, so all fail alike on a mismatch. */
    for (int r = 0; r < n; r++) {
        if (blen[r] < xlen) {
            rc = s_break (c, err, RX_EIO, "%s: rank %d sent a short block", what, r);
            goto out;
        }
        const unsigned char *sc = blk[r];   /* rank r's send counts */
        uint64_t sum = 0;
        for (int p = 0; p < n; p++) {
            uint64_t k;
            memcpy (&k, sc + (size_t) p * sizeof k, sizeof k);
            sum += k;
        }
        if (blen[r] != xlen + sum * elt) {
            rc = s_break (c, err, RX_EIO, "%s: rank %d sent %zu bytes for its counts", what, r, blen[r]);
            goto out;
        }
        for (int p = 0; p < n; p++) {
            uint64_t want, k;
            memcpy (&k, sc + (size_t) p * sizeof k, sizeof k);
            memcpy (&want, blk[p] + ((size_t) n + (size_t) r) * sizeof want, sizeof want);
            if (k != want) {
                rc = s_break (c, err, RX_EINVAL,
                              "%s: counts disagree: rank %d sends %llu elements to rank %d, which expects %llu",
                              what, r, (unsigned long long) k, p, (unsigned long long) want);
                goto out;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        const unsigned char *d = blk[r] + xlen;
        for (int p = 0; p < c->rank; p++) {
            uint64_t k;
            memcpy (&k, blk[r] + (size_t) p * sizeof k, sizeof k);
            d += k * elt;
        }
        size_t b = op->recv_counts[r] * elt;
        if (b) memcpy ((unsigned char *) op->recv + op->recv_displs[r] * elt, d, b);
    }
out:
    free (x);
    free (pk);
    free (all);
    free (blk);
    free (blen);
    return rc;
}

static int s_broadcast (struct zc *c, const struct rx_comm_op *op, size_t elt, const char *what,
                        struct rx_err *err)
{
    size_t bytes = op->count * elt;
    void *out = NULL;
    size_t len = 0;
    int me = c->rank == op->root;
    int rc = rx_zgroup_bcast (c->g, op->root, me ? op->recv : NULL, me ? bytes : 0, me ? NULL : &out,
                              &len, -1, err);
    if (rc) {
        char m[RX_ERR_MSG_MAX];
        snprintf (m, sizeof m, "%s", err ? err->msg : "");
        return rx_err_set (err, rc, "comm-zmq %s rank %d: %s: %s", c->group, c->rank, what, m);
    }
    if (!me) {
        if (len != bytes) {
            free (out);
            return s_break (c, err, RX_EIO, "%s: root %d sent %zu bytes, rank %d expects %zu (count %zu)",
                            what, op->root, len, c->rank, bytes, op->count);
        }
        if (bytes) memcpy (op->recv, out, bytes);
        free (out);
    }
    return RX_OK;
}

/* One collective on host buffers. */
static int s_exec (struct zc *c, const struct rx_comm_op *op, size_t elt, const char *what,
                   struct rx_err *err)
{
    switch (op->kind) {
    case RX_COMM_ALL_TO_ALL_V: return s_all_to_all_v (c, op, elt, what, err);
    case RX_COMM_ALL_REDUCE: return s_reduce (c, op, elt, 0, what, err);
    case RX_COMM_REDUCE_SCATTER: return s_reduce (c, op, elt, 1, what, err);
    case RX_COMM_ALL_GATHER: return s_all_gather (c, op, elt, what, err);
    default: return s_broadcast (c, op, elt, what, err);
    }
}

/* The op's buffers are device memory of the kernel backend (radix/comm.h):
 * copy them to host staging buffers (the receive buffer too: an op may
 * leave parts of it alone -- all_to_all_v gaps, the broadcast root), run
 * the collective there and copy the receive buffer back.  Without a
 * backend (tests on plain memory) the op runs on the buffers directly. */
static int s_staged (struct zc *c, const struct rx_comm_op *op, size_t elt, const char *what,
                     struct rx_err *err)
{
    if (!c->kops) return s_exec (c, op, elt, what, err);
    size_t sb = 0, rb = 0, n = (size_t) c->n;
    switch (op->kind) {
    case RX_COMM_ALL_REDUCE: sb = rb = op->count * elt; break;
    case RX_COMM_REDUCE_SCATTER: sb = n * op->count * elt; rb = op->count * elt; break;
    case RX_COMM_ALL_GATHER: sb = op->count * elt; rb = n * op->count * elt; break;
    case RX_COMM_BROADCAST: rb = op->count * elt; break;
    default:
        for (size_t p = 0; p < n; p++) {
            size_t se = (op->send_displs[p] + op->send_counts[p]) * elt;
            size_t re = (op->recv_displs[p] + op->recv_counts[p]) * elt;
            if (op->send_counts[p] && se > sb) sb = se;
            if (op->recv_counts[p] && re > rb) rb = re;
        }
    }
    unsigned char *hs = sb ? c->host->alloc (c->host, sb, 64) : NULL;
    unsigned char *hr = rb ? c->host->alloc (c->host, rb, 64) : NULL;
    int rc = RX_OK;
    struct rx_err e = { 0 };
    if ((sb && !hs) || (rb && !hr)) {
        rc = s_break (c, err, RX_ENOMEM, "%s: out of memory staging %zu bytes on the host", what,
                      sb + rb);
        goto done;
    }
    if (sb) rc = c->kops->copy_d2h (c->kbe, op->stream, hs, op->send, sb, &e);
    if (rc == RX_OK && rb) rc = c->kops->copy_d2h (c->kbe, op->stream, hr, op->recv, rb, &e);
    if (rc == RX_OK) rc = c->kops->synchronize (c->kbe, op->stream, &e);
    if (rc != RX_OK) {
        rc = s_break (c, err, rc, "%s: copy to the host: %s", what, e.msg);
        goto done;
    }
    struct rx_comm_op h = *op;
    h.send = hs;
    h.recv = hr;
    if ((rc = s_exec (c, &h, elt, what, err)) != RX_OK) goto done;
    if (rb) {
        rc = c->kops->copy_h2d (c->kbe, op->stream, op->recv, hr, rb, &e);
        if (rc == RX_OK) rc = c->kops->synchronize (c->kbe, op->stream, &e);
        if (rc != RX_OK) rc = s_break (c, err, rc, "%s: copy to the device: %s", what, e.msg);
    }
done:
    if (hs) c->host->free_ (c->host, hs);
    if (hr) c->host->free_ (c->host, hr);
    return rc;
}

/* Validate op (a bad argument breaks the group: the peers would otherwise
 * wait for this rank until the timeout) and run it. */
static int s_run (struct zc *c, const struct rx_comm_op *op, struct rx_err *err)
{
    /* A broken group fails at once (zgroup keeps the first error). */
    int rc = rx_zgroup_status (c->g, err);
    if (rc) return rc;
    c->opno++;
    int k = op->kind;
    char what[64];
    snprintf (what, sizeof what, "%s #%llu", s_kind_name (k), c->opno);
    if (k < RX_COMM_ALL_REDUCE || k > RX_COMM_BARRIER)
        return s_break (c, err, RX_EINVAL, "operation #%llu: unknown kind %d", c->opno, k);
    if (k == RX_COMM_BARRIER) {
        rc = rx_zgroup_barrier (c->g, -1, err);
        if (rc) {
            char m[RX_ERR_MSG_MAX];
            snprintf (m, sizeof m, "%s", err ? err->msg : "");
            return rx_err_set (err, rc, "comm-zmq %s rank %d: %s: %s", c->group, c->rank, what, m);
        }
        return RX_OK;
    }
    size_t elt = rx_comm_dtype_size (op->dtype);
    if (!elt)
        return s_break (c, err, RX_EINVAL, "%s: dtype %s (%d) is not supported (f32, f16, bf16, i32, i64)",
                        what, rx_dtype_name (op->dtype), op->dtype);
    if ((k == RX_COMM_ALL_REDUCE || k == RX_COMM_REDUCE_SCATTER)
        && (op->red < RX_COMM_SUM || op->red > RX_COMM_MIN))
        return s_break (c, err, RX_EINVAL, "%s: unknown reduction %d (sum, max, min)", what, op->red);
    /* ZMQ frames and our sizes: stay far below SIZE_MAX. */
    const size_t lim = SIZE_MAX / 16 / elt / (size_t) c->n;
    if (k == RX_COMM_ALL_TO_ALL_V) {
        if (!op->send_counts || !op->send_displs || !op->recv_counts || !op->recv_displs)
            return s_break (c, err, RX_EINVAL, "%s: NULL counts or displacements", what);
        for (int p = 0; p < c->n; p++) {
            if ((op->send_counts[p] && !op->send) || (op->recv_counts[p] && !op->recv))
                return s_break (c, err, RX_EINVAL, "%s: NULL buffer with a non-zero count", what);
            if (op->send_counts[p] > lim || op->recv_counts[p] > lim || op->send_displs[p] > lim
                || op->recv_displs[p] > lim)
                return s_break (c, err, RX_EINVAL, "%s: count or displacement too large", what);
        }
        return s_staged (c, op, elt, what, err);
    }
    if (op->count > lim)
        return s_break (c, err, RX_EINVAL, "%s: count %zu too large", what, op->count);
    if (op->count && (!op->recv || (k != RX_COMM_BROADCAST && !op->send)))
        return s_break (c, err, RX_EINVAL, "%s: NULL buffer with count %zu", what, op->count);
    if (k == RX_COMM_BROADCAST && (op->root < 0 || op->root >= c->n))
        return s_break (c, err, RX_EINVAL, "%s: root %d is out of range (0..%d)", what, op->root,
                        c->n - 1);
    return s_staged (c, op, elt, what, err);
}

/* ---- create / destroy ------------------------------------------------------ */

static void s_destroy (void *comm)
{
    struct zc *c = comm;
    if (!c) return;
    rx_zgroup_destroy (&c->g);
    c->host->free_ (c->host, c);
}

static int s_create (const struct rx_host *host, const struct rx_comm_params *p, void **out,
                     struct rx_err *err)
{
    if (out) *out = NULL;
    if (!host || !p || !out)
        return rx_err_set (err, RX_EINVAL, "comm-zmq: create: NULL host, params or result");
    if (p->struct_size < offsetof (struct rx_comm_params, kbe) + sizeof p->kbe)
        return rx_err_set (err, RX_EINVAL, "comm-zmq: params struct too short (%u bytes)", p->struct_size);
    const char *g = p->group && *p->group ? p->group : "?";
    if (!p->bootstrap || !*p->bootstrap)
        return rx_err_set (err, RX_EINVAL, "comm-zmq %.64s: no bootstrap endpoint (params.bootstrap)", g);
    if (p->n_rank < 1 || p->rank < 0 || p->rank >= p->n_rank)
        return rx_err_set (err, RX_EINVAL, "comm-zmq %.64s: rank %d of %d is out of range", g, p->rank,
                           p->n_rank);
    if (p->timeout_s < 0)
        return rx_err_set (err, RX_EINVAL, "comm-zmq %.64s: negative timeout %g", g, p->timeout_s);
    struct zc *c = host->alloc (host, sizeof *c, 0);
    if (!c) return rx_err_set (err, RX_ENOMEM, "comm-zmq %.64s: out of memory", g);
    memset (c, 0, sizeof *c);
    c->host = host;
    c->kops = p->kops;
    c->kbe = p->kbe;
    c->rank = p->rank;
    c->n = p->n_rank;
    snprintf (c->group, sizeof c->group, "%.64s", g);
    c->g = rx_zgroup_new (p->bootstrap, p->rank, p->n_rank, p->timeout_s, err);
    if (!c->g) {
        char m[RX_ERR_MSG_MAX];
        snprintf (m, sizeof m, "%s", err ? err->msg : "");
        int code = err && err->code ? err->code : RX_EIO;
        host->free_ (host, c);
        return rx_err_set (err, code, "comm-zmq %.64s rank %d: %s", g, p->rank, m);
    }
    *out = c;
    return RX_OK;
}

/* ---- the ops table ---------------------------------------------------------- */

static int s_go (void *comm, struct rx_comm_op *op, struct rx_err *err)
{
    if (!comm) return rx_err_set (err, RX_EINVAL, "comm-zmq: NULL instance");
    op->struct_size = sizeof *op;
    return s_run (comm, op, err);
}

RX_COMM_BLOCKING_OPS (s_go)
RX_COMM_BLOCKING_BARRIER (s_go)

/* Runs the op here (no progress thread); wait() returns its status. */
static int s_start (void *comm, const struct rx_comm_op *op, rx_comm_req_t **req, struct rx_err *err)
{
    struct zc *c = comm;
    if (req) *req = NULL;
    if (!c || !op || !req)
        return rx_err_set (err, RX_EINVAL, "comm-zmq: start: NULL instance, op or req");
    if (op->struct_size < offsetof (struct rx_comm_op, stream) + sizeof op->stream)
        return s_break (c, err, RX_EINVAL, "start: op struct too short (%u bytes)", op->struct_size);
    if (c->inflight >= RX_COMM_MAX_INFLIGHT)
        return s_break (c, err, RX_EINVAL, "start: %d operations already in flight (max %d)",
                        c->inflight, RX_COMM_MAX_INFLIGHT);
    struct rx_comm_req *r = c->host->alloc (c->host, sizeof *r, 0);
    if (!r) return s_break (c, err, RX_ENOMEM, "start: out of memory");
    rx_err_clear (&r->err);
    r->rc = s_run (c, op, &r->err);
    c->inflight++;
    *req = r;
    return RX_OK;
}

static int s_wait (void *comm, rx_comm_req_t *req, struct rx_err *err)
{
    struct zc *c = comm;
    if (!c || !req) return rx_err_set (err, RX_EINVAL, "comm-zmq: wait: NULL instance or req");
    int rc = req->rc;
    if (rc) rx_err_set (err, rc, "%s", req->err.msg);
    c->inflight--;
    c->host->free_ (c->host, req);
    return rc;
}

/* The group's state; does not block or talk to the peers (an ABORT a peer
 * sent surfaces at the next collective). */
static int s_check (void *comm, struct rx_err *err)
{
    struct zc *c = comm;
    if (!c) return rx_err_set (err, RX_EINVAL, "comm-zmq: check: NULL instance");
    return rx_zgroup_status (c->g, err);
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
};

RX_PLUGIN_DEFINE (.kind = RX_KIND_COMM, .name = "zmq", .version = "1.0",
                  .description = "collectives between CPU ranks on any hosts over ZMQ (a correctness path)",
                  .ops = &s_ops)
