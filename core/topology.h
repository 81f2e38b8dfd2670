/* core/topology.h -- where radixd's ranks run, from [parallel].
 *
 * A daemon serves one model with dp_size replicas of tp_size ranks each:
 * world = dp_size x tp_size scheduler processes, global rank g is rank
 * g % tp_size of replica g / tp_size.  With nnodes machines, node n runs
 * the world / nnodes consecutive ranks starting at n x world / nnodes;
 * node 0 also runs the HTTP server, the detokenizer and (dp_size > 1) the
 * DP controller.
 *
 * Endpoints.  On one machine every group meets in the run directory over
 * ipc:// (the control group "ctl.<d>", the comm bootstrap "comm.<d>").
 * Across machines ([parallel] dist_init_addr = host:port) the TP group
 * meets over tcp: the control group at host:port, the comm bootstrap at
 * host:port+1 -- rank 0 binds them, so host must be node 0's own address.
 *
 * DP attention ([parallel] dp_attention, SGLang's --enable-dp-attention):
 * tp_size = dp_size = N ranks in all (not N x N).  Each rank is a replica
 * of its own for the DP controller (its own requests and KV) and all N are
 * one group for the model: its control group ("ctl.attn") keeps them in
 * step and its comm ("comm.attn") carries the FFN's gathers.
 *
 * What is refused (RX_ECONFIG, one line naming the key): dp_attention with
 * tp_size != dp_size; tp_size or
 * dp_size that the ranks cannot be split by over nnodes; nnodes > 1 with
 * dp_size > 1 (one TP group across machines is what is supported); nnodes
 * > 1 without dist_init_addr, or with comm = shm (shared memory does not
 * cross machines); node_rank >= nnodes. */
#ifndef RX_TOPOLOGY_H
#define RX_TOPOLOGY_H

#include <radix/err.h>

#include "conf.h"
#include "sched_proc.h"

struct rx_topo {
    int tp_size, dp_size, world;
    int nnodes, node_rank;
    int first, n_local;          /* global ranks on this node */
    const char *comm;            /* [parallel] comm (borrowed from the conf) */
    double comm_timeout_s;
    int check_determinism;
    int dp_attention;            /* [parallel] dp_attention */
    char dist_host[256];         /* nnodes > 1 */
    int dist_port;
};

int rx_topo_from_conf (const rx_conf_t *conf, struct rx_topo *t, struct rx_err *err);

/* The process arguments of global rank g (on this node), with its strings
 * stored in the struct itself. */
struct rx_topo_rank {
    struct rx_sched_proc_opts o;
    char role[48];               /* log role / process name: "sched", "sched.tp1", "sched.dp1.tp0" */
    char in_sock[32], hb[32];
    char ctl[600], comm_boot[600], comm_group[96];
};
void rx_topo_rank (const struct rx_topo *t, int g, const char *run_dir, struct rx_topo_rank *r);

#endif
