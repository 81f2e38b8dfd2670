/* plugins/comm/nccl.c -- comm-nccl: collectives between GPU ranks (one host
 * or many) through NCCL.
 *
 * Streams: the rx_kstream_t * a CUDA kernel backend hands out IS a
 * cudaStream_t (cast, not wrapped); NULL is the legacy default stream.  Every
 * collective is enqueued on the stream it is given, so it is ordered after
 * the kernels that produced its input and before those that read its output.
 * Buffers are device memory of params->device.
 *
 * Bootstrap: rank 0 makes the NCCL unique id and sends it to the others with
 * rx_zgroup_bcast over params->bootstrap (core/zgroup.c, compiled in); the
 * group is closed once the communicator exists.
 *
 * Non-blocking communicator (config.blocking = 0), so that nothing can hang
 * past timeout_s: after each NCCL call the plugin polls ncclCommGetAsyncError
 * while it says ncclInProgress, up to timeout_s; then ncclCommAbort and
 * RX_ETIMEDOUT.  Any error aborts the communicator and breaks the instance:
 * every later call fails at once.
 *
 * Synchronous calls enqueue and return (errors surface later, from any call
 * or from check()); barrier waits for its one-element all_reduce on the
 * stream (polling an event, with the timeout).  start() enqueues and records
 * a cudaEvent; wait() polls the event and the communicator's async error up
 * to timeout_s.
 *
 * Thread-safety: one thread drives an instance; each call makes
 * params->device current on the calling thread. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <radix/comm.h>
#include <radix/plugin.h>

#include "blocking.h"

#include "zgroup.h"

struct nc {
    const struct rx_host *host;
    ncclComm_t comm;
    int rank, n, device;
    double timeout_s;
    char group[72];
    int *scratch;                 /* device int: the barrier's all_reduce */
    int broken;
    struct rx_err why;            /* first error */
    unsigned long long opno;
    int inflight;
    int capturable;               /* NCCL >= 2.9.6: collectives are captured by CUDA graphs */
};

struct rx_comm_req {
    cudaEvent_t ev;
    int rc;
    struct rx_err err;
};

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void s_nap (void)
{
    struct timespec ts = { 0, 50000 };   /* 50 us */
    nanosleep (&ts, NULL);
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

static int s_fail (struct nc *c, struct rx_err *err)
{
    return rx_err_set (err, c->why.code, "comm-nccl %s rank %d: broken by an earlier error: %s", c->group,
                       c->rank, c->why.msg);
}

/* Break the instance (aborting the communicator: NCCL may not be used after
 * an error) with a message; returns code. */
#if defined(__GNUC__)
__attribute__ ((format (printf, 4, 5)))
#endif
static int s_break (struct nc *c, struct rx_err *err, int code, const char *fmt, ...)
{
    char m[RX_ERR_MSG_MAX];
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (m, sizeof m, fmt, ap);
    va_end (ap);
    if (!c->broken) {
        c->broken = 1;
        rx_err_set (&c->why, code, "%s", m);
        if (c->comm) ncclCommAbort (c->comm);
        c->comm = NULL;
    }
    return rx_err_set (err, code, "comm-nccl %s rank %d: %s", c->group, c->rank, m);
}

/* Wait while the communicator reports ncclInProgress (non-blocking mode),
 * up to the timeout.  rc: what the NCCL call returned. */
static int s_settle (struct nc *c, ncclResult_t rc, const char *what, struct rx_err *err)
{
    double deadline = c->timeout_s > 0 ? s_now () + c->timeout_s : 0;
    ncclResult_t st = rc;
    if (rc == ncclSuccess || rc == ncclInProgress) {
        for (;;) {
            if (ncclCommGetAsyncError (c->comm, &st) != ncclSuccess) break;
            if (st != ncclInProgress) break;
            if (deadline > 0 && s_now () > deadline)
                return s_break (c, err, RX_ETIMEDOUT, "%s did not complete within %g s (a peer died or is stuck)",
                                what, c->timeout_s);
            s_nap ();
        }
    }
    if (st != ncclSuccess)
        return s_break (c, err, RX_EDEVICE, "%s: %s (%s)", what, ncclGetErrorString (st),
                        c->comm ? ncclGetLastError (c->comm) : "");
    return RX_OK;
}

/* Wait for an event recorded after the work, polling the communicator too. */
static int s_wait_event (struct nc *c, cudaEvent_t ev, const char *what, struct rx_err *err)
{
    double deadline = c->timeout_s > 0 ? s_now () + c->timeout_s : 0;
    for (;;) {
        cudaError_t e = cudaEventQuery (ev);
        if (e == cudaSuccess) return RX_OK;
        if (e != cudaErrorNotReady)
            return s_break (c, err, RX_EDEVICE, "%s: cudaEventQuery: %s", what, cudaGetErrorString (e));
        ncclResult_t st;
        if (ncclCommGetAsyncError (c->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
            return s_break (c, err, RX_EDEVICE, "%s: %s (%s)", what, ncclGetErrorString (st),
                            ncclGetLastError (c->comm));
        if (deadline > 0 && s_now () > deadline)
            return s_break (c, err, RX_ETIMEDOUT, "%s did not complete within %g s (a peer died or is stuck)",
                            what, c->timeout_s);
        s_nap ();
    }
}

static int s_nccl_type (int dtype, ncclDataType_t *t)
{
    switch (dtype) {
    case RX_F32: *t = ncclFloat32; return 1;
    case RX_F16: *t = ncclFloat16; return 1;
    case RX_BF16: *t = ncclBfloat16; return 1;
    case RX_I32: *t = ncclInt32; return 1;
    case RX_I64: *t = ncclInt64; return 1;
    default: return 0;
    }
}

/* Validate and enqueue op on its stream (no waiting for the GPU). */
static int s_enqueue (struct nc *c, const struct rx_comm_op *op, struct rx_err *err)
{
    if (c->broken) return s_fail (c, err);
    c->opno++;
    char what[64];
    snprintf (what, sizeof what, "%s #%llu", s_kind_name (op->kind), c->opno);
    int k = op->kind;
    if (k < RX_COMM_ALL_REDUCE || k > RX_COMM_BARRIER)
        return s_break (c, err, RX_EINVAL, "operation #%llu: unknown kind %d", c->opno, k);
    cudaStream_t st = (cudaStream_t) op->stream;
    cudaError_t ce = cudaSetDevice (c->device);
    if (ce != cudaSuccess)
        return s_break (c, err, RX_EDEVICE, "%s: cudaSetDevice (%d): %s", what, c->device, cudaGetErrorString (ce));
    if (k == RX_COMM_BARRIER)
        return s_settle (c, ncclAllReduce (c->scratch, c->scratch, 1, ncclInt32, ncclSum, c->comm, st), what, err);
    ncclDataType_t t;
    size_t elt = rx_comm_dtype_size (op->dtype);
    if (!elt || !s_nccl_type (op->dtype, &t))
        return s_break (c, err, RX_EINVAL, "%s: dtype %s (%d) is not supported (f32, f16, bf16, i32, i64)",
                        what, rx_dtype_name (op->dtype), op->dtype);
    ncclRedOp_t red = ncclSum;
    if (k == RX_COMM_ALL_REDUCE || k == RX_COMM_REDUCE_SCATTER) {
        if (op->red == RX_COMM_SUM) red = ncclSum;
        else if (op->red == RX_COMM_MAX) red = ncclMax;
        else if (op->red == RX_COMM_MIN) red = ncclMin;
        else return s_break (c, err, RX_EINVAL, "%s: unknown reduction %d (sum, max, min)", what, op->red);
    }
    if (k == RX_COMM_ALL_TO_ALL_V) {
        if (!op->send_counts || !op->send_displs || !op->recv_counts || !op->recv_displs)
            return s_break (c, err, RX_EINVAL, "%s: NULL counts or displacements", what);
        for (int p = 0; p < c->n; p++)
            if ((op->send_counts[p] && !op->send) || (op->recv_counts[p] && !op->recv))
                return s_break (c, err, RX_EINVAL, "%s: NULL buffer with a non-zero count", what);
        ncclResult_t rc = ncclGroupStart ();
        for (int p = 0; p < c->n && (rc == ncclSuccess || rc == ncclInProgress); p++) {
            if (op->send_counts[p])
                rc = ncclSend ((const char *) op->send + op->send_displs[p] * elt, op->send_counts[p], t, p,
                               c->comm, st);
            if ((rc == ncclSuccess || rc == ncclInProgress) && op->recv_counts[p])
                rc = ncclRecv ((char *) op->recv + op->recv_displs[p] * elt, op->recv_counts[p], t, p,
                               c->comm, st);
        }
        ncclResult_t rc2 = ncclGroupEnd ();
        return s_settle (c, rc == ncclSuccess || rc == ncclInProgress ? rc2 : rc, what, err);
    }
    if (op->count && (!op->recv || (k != RX_COMM_BROADCAST && !op->send)))
        return s_break (c, err, RX_EINVAL, "%s: NULL buffer with count %zu", what, op->count);
    switch (k) {
    case RX_COMM_ALL_REDUCE:
        return s_settle (c, ncclAllReduce (op->send, op->recv, op->count, t, red, c->comm, st), what, err);
    case RX_COMM_REDUCE_SCATTER:
        return s_settle (c, ncclReduceScatter (op->send, op->recv, op->count, t, red, c->comm, st), what, err);
    case RX_COMM_ALL_GATHER:
        return s_settle (c, ncclAllGather (op->send, op->recv, op->count, t, c->comm, st), what, err);
    default:
        if (op->root < 0 || op->root >= c->n)
            return s_break (c, err, RX_EINVAL, "%s: root %d is out of range (0..%d)", what, op->root, c->n - 1);
        return s_settle (c, ncclBroadcast (op->recv, op->recv, op->count, t, op->root, c->comm, st), what, err);
    }
}

/* ---- create / destroy ------------------------------------------------------ */

static void s_destroy (void *comm)
{
    struct nc *c = comm;
    if (!c) return;
    cudaSetDevice (c->device);
    if (c->comm) {
        /* Finalize flushes outstanding work; bounded by the timeout, then
         * abort (which never blocks on peers). */
        ncclResult_t rc = ncclCommFinalize (c->comm);
        int ok = rc == ncclSuccess || rc == ncclInProgress;
        double deadline = c->timeout_s > 0 ? s_now () + c->timeout_s : 0;
        while (ok) {
            ncclResult_t st;
            if (ncclCommGetAsyncError (c->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
                ok = 0;
            else if (st == ncclSuccess) break;
            else if (deadline > 0 && s_now () > deadline) ok = 0;
            else s_nap ();
        }
        if (ok) ncclCommDestroy (c->comm);
        else ncclCommAbort (c->comm);
    }
    if (c->scratch) cudaFree (c->scratch);
    c->host->free_ (c->host, c);
}

static int s_create (const struct rx_host *host, const struct rx_comm_params *p, void **out,
                     struct rx_err *err)
{
    if (out) *out = NULL;
    if (!host || !p || !out)
        return rx_err_set (err, RX_EINVAL, "comm nccl: create: NULL host, params or result");
    if (p->struct_size < offsetof (struct rx_comm_params, kbe) + sizeof p->kbe)
        return rx_err_set (err, RX_EINVAL, "comm nccl: params struct too short (%u bytes)", p->struct_size);
    const char *g = p->group && *p->group ? p->group : "?";
    if (p->n_rank < 1 || p->rank < 0 || p->rank >= p->n_rank)
        return rx_err_set (err, RX_EINVAL, "comm nccl %.64s: rank %d of %d is out of range", g, p->rank, p->n_rank);
    if (p->n_rank > 1 && (!p->bootstrap || !*p->bootstrap))
        return rx_err_set (err, RX_EINVAL, "comm nccl %.64s: no bootstrap endpoint (params.bootstrap)", g);
    if (p->timeout_s < 0)
        return rx_err_set (err, RX_EINVAL, "comm nccl %.64s: negative timeout %g", g, p->timeout_s);
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount (&ndev);
    if (ce != cudaSuccess || ndev == 0)
        return rx_err_set (err, RX_EDEVICE, "comm nccl %.64s rank %d: no CUDA device (cudaGetDeviceCount: %s)", g,
                           p->rank, ce != cudaSuccess ? cudaGetErrorString (ce) : "0 devices");
    if (p->device < 0 || p->device >= ndev)
        return rx_err_set (err, RX_EDEVICE, "comm nccl %.64s rank %d: device %d does not exist (%d CUDA devices)",
                           g, p->rank, p->device, ndev);
    if ((ce = cudaSetDevice (p->device)) != cudaSuccess)
        return rx_err_set (err, RX_EDEVICE, "comm nccl %.64s rank %d: cudaSetDevice (%d): %s", g, p->rank,
                           p->device, cudaGetErrorString (ce));

    struct nc *c = host->alloc (host, sizeof *c, 0);
    if (!c) return rx_err_set (err, RX_ENOMEM, "comm nccl %.64s: out of memory", g);
    memset (c, 0, sizeof *c);
    c->host = host;
    c->rank = p->rank;
    c->n = p->n_rank;
    c->device = p->device;
    c->timeout_s = p->timeout_s;
    snprintf (c->group, sizeof c->group, "%.64s", g);
    int nver = 0;   /* NCCL_VERSION_CODE of the library loaded, e.g. 21805 for 2.18.5 */
    c->capturable = ncclGetVersion (&nver) == ncclSuccess && nver >= 20906;
    if ((ce = cudaMalloc ((void **) &c->scratch, sizeof (int))) != cudaSuccess) {
        c->scratch = NULL;
        s_destroy (c);
        return rx_err_set (err, RX_ENOMEM, "comm nccl %.64s rank %d: cudaMalloc: %s", g, p->rank,
                           cudaGetErrorString (ce));
    }

    /* The unique id: made by rank 0, sent over the bootstrap group. */
    ncclUniqueId id;
    memset (&id, 0, sizeof id);
    int rc = RX_OK;
    if (p->rank == 0) {
        ncclResult_t nr = ncclGetUniqueId (&id);
        if (nr != ncclSuccess)
            rc = rx_err_set (err, RX_EDEVICE, "comm nccl %.64s rank 0: ncclGetUniqueId: %s", g,
                             ncclGetErrorString (nr));
    }
    if (!rc && p->n_rank > 1) {
        rx_zgroup_t *zg = rx_zgroup_new (p->bootstrap, p->rank, p->n_rank, p->timeout_s, err);
        if (!zg) {
            rc = err && err->code ? err->code : RX_EIO;
        } else {
            void *buf = NULL;
            size_t len = 0;
            rc = rx_zgroup_bcast (zg, 0, &id, sizeof id, &buf, &len, -1, err);
            if (!rc && len != sizeof id)
                rc = rx_err_set (err, RX_EIO, "comm nccl %.64s rank %d: the unique id from rank 0 has %zu bytes, not %zu",
                                 g, p->rank, len, sizeof id);
            if (!rc) memcpy (&id, buf, sizeof id);
            free (buf);
            rx_zgroup_destroy (&zg);
        }
        if (rc) {
            char m[RX_ERR_MSG_MAX];
            snprintf (m, sizeof m, "%s", err ? err->msg : "");
            rx_err_set (err, rc, "comm nccl %.64s rank %d: bootstrap: %s", g, p->rank, m);
        }
    }
    if (rc) {
        s_destroy (c);
        return rc;
    }

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t nr = ncclCommInitRankConfig (&c->comm, p->n_rank, id, p->rank, &cfg);
    if (nr != ncclSuccess && nr != ncclInProgress) {
        if (c->comm) ncclCommAbort (c->comm);
        c->comm = NULL;
        s_destroy (c);
        return rx_err_set (err, RX_EDEVICE, "comm nccl %.64s rank %d: ncclCommInitRankConfig: %s", g, p->rank,
                           ncclGetErrorString (nr));
    }
    rc = s_settle (c, nr, "ncclCommInitRankConfig", err);   /* aborts on timeout */
    if (rc) {
        s_destroy (c);
        return rc;
    }
    *out = c;
    return RX_OK;
}

/* ---- the ops table ---------------------------------------------------------- */

static int s_go (void *comm, struct rx_comm_op *op, struct rx_err *err)
{
    if (!comm) return rx_err_set (err, RX_EINVAL, "comm nccl: NULL instance");
    op->struct_size = sizeof *op;
    return s_enqueue (comm, op, err);
}

RX_COMM_BLOCKING_OPS (s_go)

/* Enqueue the one-element all_reduce, then wait for it on the stream. */
static int s_barrier_b (void *comm, rx_kstream_t *s, struct rx_err *err)
{
    struct nc *c = comm;
    struct rx_comm_op op = { .kind = RX_COMM_BARRIER, .stream = s };
    int rc = s_go (comm, &op, err);
    if (rc) return rc;
    cudaEvent_t ev;
    cudaError_t ce = cudaEventCreateWithFlags (&ev, cudaEventDisableTiming);
    if (ce != cudaSuccess)
        return s_break (c, err, RX_EDEVICE, "barrier #%llu: cudaEventCreate: %s", c->opno, cudaGetErrorString (ce));
    ce = cudaEventRecord (ev, (cudaStream_t) s);
    if (ce != cudaSuccess) rc = s_break (c, err, RX_EDEVICE, "barrier #%llu: cudaEventRecord: %s", c->opno,
                                         cudaGetErrorString (ce));
    else rc = s_wait_event (c, ev, "barrier", err);
    cudaEventDestroy (ev);
    return rc;
}

/* Enqueue op and record an event behind it; wait() polls the event. */
static int s_start (void *comm, const struct rx_comm_op *op, rx_comm_req_t **req, struct rx_err *err)
{
    struct nc *c = comm;
    if (req) *req = NULL;
    if (!c || !op || !req)
        return rx_err_set (err, RX_EINVAL, "comm nccl: start: NULL instance, op or req");
    if (c->broken) return s_fail (c, err);
    if (op->struct_size < offsetof (struct rx_comm_op, stream) + sizeof op->stream)
        return s_break (c, err, RX_EINVAL, "start: op struct too short (%u bytes)", op->struct_size);
    if (c->inflight >= RX_COMM_MAX_INFLIGHT)
        return s_break (c, err, RX_EINVAL, "start: %d operations already in flight (max %d)", c->inflight,
                        RX_COMM_MAX_INFLIGHT);
    int rc = s_enqueue (c, op, err);
    if (rc) return rc;
    struct rx_comm_req *r = c->host->alloc (c->host, sizeof *r, 0);
    if (!r) return s_break (c, err, RX_ENOMEM, "start: out of memory");
    memset (r, 0, sizeof *r);
    cudaError_t ce = cudaEventCreateWithFlags (&r->ev, cudaEventDisableTiming);
    if (ce == cudaSuccess) {
        ce = cudaEventRecord (r->ev, (cudaStream_t) op->stream);
        if (ce != cudaSuccess) cudaEventDestroy (r->ev);
    }
    if (ce != cudaSuccess) {
        c->host->free_ (c->host, r);
        return s_break (c, err, RX_EDEVICE, "start: cudaEvent: %s", cudaGetErrorString (ce));
    }
    c->inflight++;
    *req = r;
    return RX_OK;
}

static int s_wait (void *comm, rx_comm_req_t *req, struct rx_err *err)
{
    struct nc *c = comm;
    if (!c || !req) return rx_err_set (err, RX_EINVAL, "comm nccl: wait: NULL instance or req");
    cudaSetDevice (c->device);
    int rc = c->broken ? s_fail (c, err) : s_wait_event (c, req->ev, "wait", err);
    cudaEventDestroy (req->ev);
    c->inflight--;
    c->host->free_ (c->host, req);
    return rc;
}

/* The communicator's asynchronous error, without blocking. */
static int s_check (void *comm, struct rx_err *err)
{
    struct nc *c = comm;
    if (!c) return rx_err_set (err, RX_EINVAL, "comm nccl: check: NULL instance");
    if (c->broken) return s_fail (c, err);
    ncclResult_t st;
    ncclResult_t rc = ncclCommGetAsyncError (c->comm, &st);
    if (rc != ncclSuccess)
        return s_break (c, err, RX_EDEVICE, "ncclCommGetAsyncError: %s", ncclGetErrorString (rc));
    if (st != ncclSuccess && st != ncclInProgress)
        return s_break (c, err, RX_EDEVICE, "asynchronous error: %s (%s)", ncclGetErrorString (st),
                        ncclGetLastError (c->comm));
    return RX_OK;
}

/* CUDA captures NCCL's kernels natively (NCCL >= 2.9.6), barrier excepted:
 * it waits for its all_reduce on the host. */
static int s_graph_capturable (void *comm)
{
    const struct nc *c = comm;
    return c && c->capturable;
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

RX_PLUGIN_DEFINE (.kind = RX_KIND_COMM, .name = "nccl", .version = "1.0",
                  .description = "collectives between GPU ranks through NCCL (non-blocking, with timeouts)",
                  .ops = &s_ops)
