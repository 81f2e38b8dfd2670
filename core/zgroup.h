/* core/zgroup.h -- a group of n ranks over ZMQ: the host-side control group.
 *
 * Small control collectives between the ranks of radixd (the peer
 * schedulers' per-step broadcast of newly arrived requests, the batch-hash
 * determinism check, the DP-attention step sync) and the bootstrap of comm
 * plugins (NCCL's unique id).  Not for tensors of any size: the comm
 * plugins move those.
 *
 * Topology: a star.  Rank 0 binds a ROUTER socket at the endpoint; every
 * other rank connects a DEALER to it.  The endpoint is any ZMQ endpoint:
 * "ipc:///run/dir/ctl" on one host, "tcp://10.0.0.1:29500" across hosts
 * (rank 0 binds that address, so it must be one of rank 0's own).
 *
 * Every collective is called by every rank in the same order (as MPI's).
 * Each waits at most its timeout (a negative timeout_s means the group's
 * default given at create; 0 means forever): a rank that died or hangs
 * makes the others fail with RX_ETIMEDOUT naming it, and from then on the
 * group is broken (every later call fails at once).  A message from a rank
 * that is out of step (another collective's sequence number) is RX_EIO:
 * the ranks diverged.
 *
 * The file is compiled into radixd and, as is, into the plugins that need a
 * group (comm-zmq, comm-nccl's bootstrap): plugins link no core code, so it
 * depends on libzmq and libc only (errors through rx_err, no rx_log).
 *
 * Thread-safety: one thread drives a group. */
#ifndef RX_ZGROUP_H
#define RX_ZGROUP_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

typedef struct rx_zgroup rx_zgroup_t;

/* Join: rank 0 binds endpoint, the others connect; returns once all n_rank
 * ranks have said hello (or NULL with RX_ETIMEDOUT after timeout_s, naming
 * the ranks that never came; RX_EIO when the endpoint cannot be bound).
 * n_rank == 1 is a valid group of one (every collective is a copy). */
rx_zgroup_t *rx_zgroup_new (const char *endpoint, int rank, int n_rank, double timeout_s,
                            struct rx_err *err);
void rx_zgroup_destroy (rx_zgroup_t **self_p);

int rx_zgroup_rank (const rx_zgroup_t *g);
int rx_zgroup_size (const rx_zgroup_t *g);

/* Root's len bytes to every rank.  On root, data/len are the input and
 * *out (if out is not NULL) gets a malloc'd copy; on the others data is
 * ignored and *out and *out_len are the malloc'd bytes received (free()).
 * len may be 0 (*out is then a valid 1-byte allocation). */
int rx_zgroup_bcast (rx_zgroup_t *g, int root, const void *data, size_t len, void **out,
                     size_t *out_len, double timeout_s, struct rx_err *err);

/* Every rank gives len bytes (lengths may differ between ranks); every
 * rank gets *out = the concatenation in rank order (malloc'd; free()) and,
 * if lens is not NULL, lens[r] = rank r's length (lens has n_rank entries). */
int rx_zgroup_allgather (rx_zgroup_t *g, const void *data, size_t len, void **out, size_t *lens,
                         double timeout_s, struct rx_err *err);

/* vals[0..n-1] = red over ranks (red: RX_COMM_SUM/MAX/MIN of radix/comm.h),
 * in place; identical on every rank. */
int rx_zgroup_allreduce_i64 (rx_zgroup_t *g, int64_t *vals, size_t n, int red, double timeout_s,
                             struct rx_err *err);

int rx_zgroup_barrier (rx_zgroup_t *g, double timeout_s, struct rx_err *err);

/* Break the group on purpose (a caller found the ranks disagree, or got a
 * bad argument it cannot go on from): every later call fails at once with
 * why, and the other ranks are told (best effort, never blocks) so their
 * current or next collective fails with why instead of timing out.  Returns
 * why->code (RX_EIO if why is NULL or RX_OK). */
int rx_zgroup_abort (rx_zgroup_t *g, const struct rx_err *why);

/* RX_OK while the group is healthy; else the error that broke it (in err).
 * Never blocks, sends or receives. */
int rx_zgroup_status (const rx_zgroup_t *g, struct rx_err *err);

#endif
