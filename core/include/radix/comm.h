/* radix/comm.h -- the collective-communication kind (RX_KIND_COMM).
 *
 * ABI: 1.0, being built (members may still be appended before the first
 * release; nothing below is reordered or retyped once released).
 *
 * A comm plugin connects the n_rank ranks of one group (a tensor-parallel
 * group, the ranks of a DP-attention layout, an expert-parallel group) and
 * moves tensors between them: the data plane.  Small control messages
 * (which requests arrived, the DP-attention step sync) go through the core's
 * ZMQ control group instead.  Plugins: `shm` (CPU ranks on one host, POSIX
 * shared memory), `nccl` (GPUs, one host or many), `zmq` (CPU ranks across
 * hosts, over ZMQ sockets).
 *
 * Buffers are device memory of the kernel backend given at create (plain
 * host memory on kernels-cpu, but a plugin must not rely on it: host-side
 * plugins -- shm, zmq -- move them with the backend's copy ops and
 * synchronize; kernels-cpu's guard mode makes a direct access crash).  Every rank of the group must call the same
 * collectives in the same order with the same counts and types -- the peer
 * schedulers guarantee it by scheduling identically.  Results are bitwise
 * identical on every rank (a reduction adds in one fixed order whatever the
 * rank), so ranks that sample from all-reduced logits agree.
 *
 * Streams.  Each collective takes the kernel stream it is ordered on (NULL
 * = the default stream).  On a synchronous backend (the CPU) the call
 * returns when the result is in place.  On an asynchronous one (CUDA +
 * NCCL) the call enqueues the work and returns; errors may surface later,
 * from any collective or from check().  On a CUDA kernel backend an
 * rx_kstream_t * IS a cudaStream_t (NULL = the legacy default stream), so
 * comm-nccl enqueues on it directly.
 *
 * Overlap.  start() begins one collective and returns a handle at once;
 * wait() blocks until it is done (and frees the handle).  The buffers
 * belong to the operation between the two calls; start() copies the
 * rx_comm_op, but its count and displacement arrays, like the buffers, must
 * stay valid until wait().  At most RX_COMM_MAX_INFLIGHT
 * operations may be started and not yet waited on, per instance (one more
 * is RX_EINVAL and breaks the group); they complete in start order.  A
 * blocking collective called while started operations are in flight runs
 * after them (it first waits until they are done; their wait() still has to
 * be called), so every rank runs all its collectives, started or blocking,
 * in the order it issued them.  destroy() with started operations lets them
 * finish (at most timeout_s).  Two-batch overlap computes one micro-batch
 * while the other's dispatch or combine is in flight.  comm-shm runs started
 * ops on a progress thread of the instance; comm-zmq runs them inside
 * start() (no overlap).
 *
 * Failure.  A collective that does not finish within params.timeout_s (a
 * peer died, or is stuck) fails with RX_ETIMEDOUT; a peer known to be gone
 * is RX_EIO.  After any failure the group is broken: every later call fails
 * at once (never hangs) and the caller must destroy it.  The core then
 * stops the daemon with the reason.
 *
 * Thread-safety: one thread drives an instance (start/wait included).
 * Different instances are independent. */
#ifndef RADIX_COMM_H
#define RADIX_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <radix/dtype.h>
#include <radix/err.h>
#include <radix/host.h>
#include <radix/kernel.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reductions (values are ABI; append only). */
enum rx_comm_red {
    RX_COMM_SUM = 0,
    RX_COMM_MAX = 1,
    RX_COMM_MIN = 2
};

#define RX_COMM_MAX_INFLIGHT 4

/* Parameters of create(): identical on every rank except rank. */
struct rx_comm_params {
    uint32_t struct_size;            /* sizeof (struct rx_comm_params) */
    int32_t  rank;                   /* 0 .. n_rank-1 */
    int32_t  n_rank;                 /* >= 1 */
    int32_t  device;                 /* device ordinal (GPU); 0 on the CPU */
    /* A name unique to this group among the groups alive on one host,
     * [A-Za-z0-9_.-], at most 64 bytes: shm names its segment after it;
     * every plugin uses it in messages. */
    const char *group;
    /* The ZMQ endpoint of the group's set-up: rank 0 binds it, the others
     * connect ("ipc:///run/radixd-x/comm-tp0", "tcp://10.0.0.1:29501").
     * NCCL sends its unique id over it; zmq carries everything through it;
     * shm ignores it (the segment name is enough on one host). */
    const char *bootstrap;
    /* Longest wait of create() and of every collective, in seconds
     * (0 = forever: only for tests that want a hang to show). */
    double timeout_s;
    /* The kernel backend that owns the buffers (borrowed; outlives the
     * instance). */
    const struct rx_kernels_ops *kops;
    void *kbe;
};

/* Kinds of a started operation (values are ABI; append only). */
enum rx_comm_kind {
    RX_COMM_ALL_REDUCE     = 1,
    RX_COMM_ALL_GATHER     = 2,
    RX_COMM_REDUCE_SCATTER = 3,
    RX_COMM_ALL_TO_ALL_V   = 4,
    RX_COMM_BROADCAST      = 5,
    RX_COMM_BARRIER        = 6
};

/* One operation for start(); the members mean what the arguments of the
 * blocking call of the same kind mean.  Counts are elements of dtype.
 * Fixed forever except by appending (struct_size). */
struct rx_comm_op {
    uint32_t      struct_size;       /* sizeof (struct rx_comm_op) */
    int32_t       kind;              /* enum rx_comm_kind */
    int32_t       dtype;             /* RX_F32, RX_F16, RX_BF16, RX_I32, RX_I64 */
    int32_t       red;               /* enum rx_comm_red (reductions) */
    int32_t       root;              /* broadcast */
    const void   *send;
    void         *recv;
    size_t        count;             /* all_reduce: elements; all_gather / reduce_scatter: per rank; broadcast: elements */
    const size_t *send_counts;       /* all_to_all_v: [n_rank] */
    const size_t *send_displs;       /*   [n_rank], in elements */
    const size_t *recv_counts;       /*   [n_rank] */
    const size_t *recv_displs;       /*   [n_rank] */
    rx_kstream_t *stream;
};

typedef struct rx_comm_req rx_comm_req_t;   /* a started operation */

struct rx_comm_ops {
    uint32_t struct_size;
    /* ---- ABI 1.0 ---- */

    /* (required) join the group: blocks until every rank has joined or
     * timeout_s passed (RX_ETIMEDOUT naming the ranks that did not come).
     * host: the plugin's host table ([comm.<name>] keys). */
    int  (*create) (const struct rx_host *host, const struct rx_comm_params *p, void **comm,
                    struct rx_err *err);
    /* (required) leaves the group and frees everything; NULL is a no-op.
     * Never blocks longer than timeout_s. */
    void (*destroy) (void *comm);

    /* (required) recv[i] = red over ranks of send[i], i < count.  send ==
     * recv is allowed (in place). */
    int  (*all_reduce) (void *comm, rx_kstream_t *s, const void *send, void *recv, size_t count,
                        int dtype, int red, struct rx_err *err);
    /* (required) recv[r*count .. (r+1)*count-1] = send of rank r.  send may
     * be recv + rank*count (in place). */
    int  (*all_gather) (void *comm, rx_kstream_t *s, const void *send, void *recv, size_t count,
                        int dtype, struct rx_err *err);
    /* (required) recv[i] = red over ranks of send[rank*count + i]; send
     * holds n_rank*count elements. */
    int  (*reduce_scatter) (void *comm, rx_kstream_t *s, const void *send, void *recv, size_t count,
                            int dtype, int red, struct rx_err *err);
    /* (required) rank r's send[send_displs[p] ..+send_counts[p]] arrives at
     * rank p's recv[recv_displs[r] ..+recv_counts[r]].  Counts must agree
     * pairwise (my send_counts[p] == p's recv_counts[me]); a zero count is
     * allowed.  send and recv must not overlap. */
    int  (*all_to_all_v) (void *comm, rx_kstream_t *s, const void *send, const size_t *send_counts,
                          const size_t *send_displs, void *recv, const size_t *recv_counts,
                          const size_t *recv_displs, int dtype, struct rx_err *err);
    /* (required) buf of every rank = buf of root. */
    int  (*broadcast) (void *comm, rx_kstream_t *s, void *buf, size_t count, int dtype, int root,
                       struct rx_err *err);
    /* (required) returns when every rank has entered it. */
    int  (*barrier) (void *comm, rx_kstream_t *s, struct rx_err *err);

    /* (required) begin op; *req is waited on with wait().  A plugin without
     * real overlap may run the op inside start() (its wait() then returns
     * at once): correct, just not concurrent. */
    int  (*start) (void *comm, const struct rx_comm_op *op, rx_comm_req_t **req, struct rx_err *err);
    /* (required) finish a started op and free req; the op's error, if any. */
    int  (*wait) (void *comm, rx_comm_req_t *req, struct rx_err *err);

    /* (optional) an error of asynchronous work or of a peer, without
     * blocking: RX_OK while the group is healthy.  The core polls it while
     * idle so a broken GPU group is found between steps. */
    int  (*check) (void *comm, struct rx_err *err);

    /* ---- ABI 1.0 ends here.  Append only below. ---- */

    /* ---- appended in ABI 1.4 ---- */
    /* (optional; absent = 0) 1 if this instance's blocking collectives
     * issued on a stream during a kernel graph capture are captured:
     * recorded, and run at every launch of the graph (with the buffers and
     * counts of capture time, the data of launch time).  all_reduce,
     * all_gather, reduce_scatter, all_to_all_v, broadcast and barrier;
     * never start/wait.  all_to_all_v's count and displacement arrays are
     * host memory: comm-shm reads them when the collective runs (at every
     * launch), comm-nccl at capture (it enqueues ncclSend/ncclRecv with
     * them), so the caller keeps them valid and unchanged while the graph
     * lives.  Errors of a launched collective break the group: the launch
     * itself cannot report them, so check() and every later call do.
     * comm-nccl: 1 (NCCL >= 2.9 captures; its barrier waits on the host,
     * so not that one); comm-shm: 1 on a synchronous backend with host_fn
     * (kernels-cpu), else 0; comm-zmq: absent. */
    int  (*graph_capturable) (void *comm);
};

#define RX_COMM_OPS_SIZE_1_0 \
    (offsetof (struct rx_comm_ops, check) + sizeof (void *))

/* Bytes of one element of the types collectives accept; 0 for others. */
static inline size_t rx_comm_dtype_size (int dtype)
{
    switch (dtype) {
    case RX_F32: case RX_I32: return 4;
    case RX_F16: case RX_BF16: return 2;
    case RX_I64: return 8;
    default: return 0;
    }
}

#ifdef __cplusplus
}
#endif
#endif /* RADIX_COMM_H */
