/* core/dp_proc.h -- radixd's DP controller process: with [parallel]
 * dp_size = N > 1 it stands between main and N data-parallel replicas
 * (each a TP group of schedulers; SGLang's DataParallelController).
 *
 * Topology (sockets in the run directory, core/ipc.h):
 *
 *   main --PUSH--> RX_SOCK_SCHED ("sched", PULL bound here instead of by a
 *                  scheduler; main sends exactly what it sends one scheduler)
 *   here --PUSH--> "sched.<d>" (PULL bound by replica d's rank 0;
 *                  rx_dp_sched_sock names it)
 *   replica d's rank 0 --PUSH--> RX_SOCK_DPC ("dpc", PULL bound here):
 *                  REQ_ERROR, FLUSH_CACHE_REPLY, STATS (dp_rank = d),
 *                  REQ_DONE, and SHUTDOWN when it stops (see below)
 *   here --PUSH--> RX_SOCK_MAIN: what main expects from one scheduler
 *   replica d's rank 0 --PUSH--> RX_SOCK_DETOK: TOKENS, as without DP (the
 *                  detokenizer stops after the SHUTDOWN of its N-th upstream,
 *                  rx_detok_proc_main_n)
 *
 * What the controller does:
 *   - REQ_NEW: picks a replica with the route-policy plugin [dp] policy
 *     (route-<policy>.so, default round_robin; any route policy: the
 *     replicas are its workers, ids 0..N-1, and a worker's load is the
 *     requests in flight on it as counted here: +1 on dispatch, -1 on its
 *     REQ_DONE or REQ_ERROR).  The routing text is the prompt's token ids,
 *     each as 3 ASCII bytes (7 bits each), so cache_aware matches exact
 *     token prefixes.  The policy plugin is configured in its loader
 *     section, [router.<policy>] (e.g. [router.cache_aware]), as in
 *     radix-router.  rid -> replica is remembered until DONE or ERROR.
 *   - REQ_ABORT: the rids split per replica (one REQ_ABORT each); rids not
 *     in flight here are dropped.  The load drops when the REQ_DONE comes.
 *   - REQ_ABORT_SEQ: the same per (rid, sibling index).
 *   - GET_STATS {cookie}: a GET_STATS with its own cookie to every replica;
 *     ONE STATS {cookie} to main when all answered, or after
 *     RX_DP_STATS_WAIT_MS with what it has (a missing replica's latest
 *     periodic STATS stands in; its rank is logged).  Aggregation: sums of
 *     the counts and the throughputs, steps the max, cache_hit_rate
 *     recomputed as cached / prompt tokens, new_token_ratio the mean,
 *     context_len and n_vocab from replica 0, dp_rank 0.
 *   - periodic STATS (cookie 0) from the replicas: the latest per replica
 *     is kept; main gets an aggregated cookie-0 STATS every
 *     stats_interval_ms, the first one as soon as EVERY replica has sent its
 *     first (main's "scheduler ready").
 *   - FLUSH_CACHE {cookie}: to every replica; one FLUSH_CACHE_REPLY: RX_OK
 *     when all flushed, else the first failure ("replica d: ..."); a
 *     replica silent for RX_DP_FLUSH_WAIT_MS counts as RX_ETIMEDOUT.
 *   - REQ_ERROR from a replica: forwarded to main (the rid's load dropped).
 *   - SHUTDOWN (NOW or DRAIN) from main: forwarded to every replica still
 *     running; from then on REQ_NEW is refused here with REQ_ERROR
 *     RX_EAGAIN "server is shutting down", FLUSH_CACHE with RX_EAGAIN, and
 *     GET_STATS answered from the latest periodic STATS.  The controller
 *     keeps relaying until every replica has confirmed its stop with a
 *     SHUTDOWN on RX_SOCK_DPC (sent by its rank 0 as it exits, after its
 *     last REQ_DONE; the controller counts them), then logs "dp controller:
 *     dispatched a / b ... requests" (per replica) and returns 0.  If not
 *     all confirmed within RX_DP_STOP_WAIT_MS after a NOW (or after a
 *     DRAIN's deadline + RX_DP_STOP_WAIT_MS) it logs how many did not and
 *     returns 1.  A SHUTDOWN goes to every replica each time (a later NOW
 *     after a DRAIN); one that cannot take it within 1 s has stopped.
 *   - never hangs: sends have RX_PROC_SEND_TIMEOUT_MS; a failed send means
 *     a peer is gone: logged, return 1.
 *
 * Thread-safety: single-threaded; runs in a forked child. */
#ifndef RX_DP_PROC_H
#define RX_DP_PROC_H

#include <stddef.h>

#include "boot.h"

#define RX_SOCK_DPC "dpc"   /* PULL bound by the DP controller; replicas' rank 0 PUSH to it */

#define RX_DP_MAX            1024   /* most replicas */
#define RX_DP_STATS_WAIT_MS  2000   /* GET_STATS fan-in limit */
#define RX_DP_FLUSH_WAIT_MS  10000  /* FLUSH_CACHE fan-in limit */
#define RX_DP_STOP_WAIT_MS   15000  /* after SHUTDOWN NOW (or a DRAIN's deadline) */

struct rx_dp_proc_opts {
    const char *run_dir;      /* the run directory main created (rx_ipc_run_dir) */
    int dp_size;              /* replicas, 1..RX_DP_MAX */
    int stats_interval_ms;    /* aggregated periodic STATS to main; 0 = 1000 */
};

/* The PULL socket name of replica dp_rank's rank 0, "sched.<dp_rank>",
 * into buf (always NUL-terminated when cap > 0). */
void rx_dp_sched_sock (int dp_rank, char *buf, size_t cap);

/* Body of the DP controller process (called in a forked child; the parent
 * already did rx_boot_open; the child calls rx_ipc_join(run_dir)).  Logs
 * "dp controller: N replicas, policy P" at start.  Returns the exit status:
 * 0 after a SHUTDOWN every replica confirmed, 1 on a start-up failure (bad
 * options, unknown policy plugin, socket trouble: one clear line logged at
 * error level first) or when a peer is gone. */
int rx_dp_proc_main (struct rx_boot *boot, const struct rx_dp_proc_opts *o);

#endif
