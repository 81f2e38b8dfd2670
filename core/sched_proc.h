/* core/sched_proc.h -- the bodies of radixd's two child processes and the
 * contract between them and the main process (core/radixd.c, core/server.c).
 *
 * Process model (SGLang's): main (HTTP, tokenizer, live request table)
 * --REQ_NEW/REQ_ABORT/control--> scheduler process (engine + scheduler,
 * core/scheduler.h) --TOKENS--> detokenizer process (core/detok.h) --TEXT-->
 * main; the scheduler also answers main directly (REQ_ERROR, STATS,
 * FLUSH_CACHE_REPLY).  Messages: core/ipc_msg.h; channels: core/ipc.h, every
 * PULL socket bound in the run directory under the names below.
 *
 * Start-up, as main does it: rx_boot_open; rx_ipc_create; bind RX_SOCK_MAIN
 * (PULL) BEFORE forking; fork the scheduler and the detokenizer (each child
 * sets PR_SET_PDEATHSIG, ignores SIGINT/SIGTERM/SIGPIPE, sets its log role,
 * calls its function below and _exit()s with the result -- it must not
 * touch the parent's rx_ipc_t, it joins the run directory itself); connect
 * PUSH to RX_SOCK_SCHED; open the heartbeat RX_HB_SCHED read-only; wait for
 * the first STATS (cookie 0): the scheduler sends it once its engine and
 * scheduler are up, before it serves anything ("scheduler ready").
 *
 * Scheduler process:
 *   - REQ_NEW: rx_sched_submit; a refusal goes back to main as REQ_ERROR
 *     {rid, status, message}: RX_EAGAIN queue full or shutting down (503),
 *     RX_EINVAL bad parameters (400), RX_ERANGE prompt over the context or
 *     the KV pool (400 context_length_exceeded).
 *   - REQ_ABORT: rx_sched_abort of each rid (unknown rids are fine); the
 *     aborted siblings finish with RX_FINISH_ABORT through TOKENS/TEXT.
 *   - REQ_ABORT_SEQ: rx_sched_abort_seq of each (rid, index); that sibling
 *     alone finishes with RX_FINISH_ABORT in TOKENS (the detokenizer drops
 *     it after the stop string it had reported) and counts for REQ_DONE.
 *   - FLUSH_CACHE {cookie}: FLUSH_CACHE_REPLY {cookie, status, message}
 *     (RX_EAGAIN while requests run).
 *   - GET_STATS {cookie}: STATS {cookie}; plus a STATS with cookie 0 every
 *     stats_interval_ms, and the first one at start-up.
 *   - every step's outputs: ONE TOKENS message to the detokenizer.
 *   - SHUTDOWN NOW: abort everything, flush the abort outputs to the
 *     detokenizer, forward SHUTDOWN to it, heartbeat STOPPED, exit 0.
 *   - SHUTDOWN DRAIN {deadline_ms}: new REQ_NEW get REQ_ERROR RX_EAGAIN
 *     "server is shutting down"; running and waiting requests go on until
 *     none is left, or until deadline_ms (0 = no deadline) and then the rest
 *     is aborted; then as NOW.  A later NOW, or a DRAIN with an earlier
 *     deadline, shortens it.
 *   - heartbeat RX_HB_SCHED: STARTING before the model loads; IDLE before
 *     the first STATS; then beats before and after every step (at least
 *     every ~100 ms while idle) with state BUSY while requests wait or run
 *     (set before the step, so a long prefill reads busy), IDLE, or
 *     DRAINING; STOPPED on exit (also after a start-up failure).
 *   - never hangs: every send has a bounded timeout (RX_PROC_SEND_TIMEOUT_MS);
 *     a send that fails means a peer is gone: logged, exit 1.  Engine errors
 *     of a step are logged and the loop goes on (the batch's requests finish
 *     with ABORT).
 *
 * Detokenizer process: one rx_detok state per (rid, index), created by the
 * entry flagged `first` (RX_DETOK_SPECIAL unless skip_special_tokens, the
 * request's stop strings); ONE TEXT message per TOKENS message, one entry
 * per live TOKENS entry (text delta, usage, finish, matched, logprobs with
 * the ids).  A completed stop string finishes that entry with
 * RX_FINISH_STOP_STR (matched = the stop's index, the text cut before it);
 * later TOKENS for that (rid, index) are dropped silently until the
 * scheduler's own finish arrives (main answers a STOP_STR with REQ_ABORT_SEQ
 * for that sibling while others run, on the last unfinished one with
 * REQ_ABORT).  A scheduler finish (EOS, STOP_ID,
 * LENGTH, ABORT) flushes the held text into that last delta and frees the
 * state.  An entry for an unknown (rid, index) without `first` is logged at
 * debug and dropped.  SHUTDOWN: exit 0.
 *
 * Both functions run in a forked child and return its exit status: 0 after
 * a SHUTDOWN, 1 on a start-up failure (bad model file, KV too small, socket
 * trouble: one clear line logged at error level first) or when a peer is
 * gone.  They borrow boot (the parent's, already open). */
#ifndef RX_SCHED_PROC_H
#define RX_SCHED_PROC_H

#include "boot.h"
#include "detok_proc.h"   /* rx_detok_proc_main: the other child, same contract */

#define RX_SOCK_SCHED "sched"  /* PULL bound by the scheduler; main PUSHes REQ_NEW, REQ_ABORT, FLUSH_CACHE, GET_STATS, SHUTDOWN */
#define RX_SOCK_DETOK "detok"  /* PULL bound by the detokenizer; the scheduler PUSHes TOKENS (and forwards SHUTDOWN when it exits) */
#define RX_SOCK_MAIN  "main"   /* PULL bound by main BEFORE it forks; detok PUSHes TEXT; the scheduler PUSHes REQ_ERROR, FLUSH_CACHE_REPLY, STATS */
#define RX_HB_SCHED   "sched"  /* the scheduler's heartbeat page name */

/* How long a child waits to queue one message before it declares the peer
 * gone (ms). */
#define RX_PROC_SEND_TIMEOUT_MS 10000

/* Ranks (tensor / data parallelism, [parallel]).  A replica is a TP group
 * of tp_size scheduler processes running identical schedulers (SGLang's
 * peer schedulers): only rank 0 binds in_sock and talks to the other
 * processes; at the start of every iteration it broadcasts the raw
 * messages it received (and its time-based decisions: the drain deadline)
 * through the group's ZMQ control group (core/zgroup.h), every rank applies
 * them in the same order and steps; the model's collectives go through the
 * comm plugin.  Only rank 0 sends TOKENS, STATS, replies and heartbeats.
 * With check_determinism every rank all-gathers a hash of each step's
 * outputs and the first mismatch stops the daemon.  A lost control group
 * (a rank died, a broadcast late by more than comm_timeout_s) is fatal:
 * exit 1.
 * With dp_size > 1 rank 0 of replica d reads from "sched.<d>" and answers
 * the DP controller (up_sock, RX_SOCK_DPC), adding REQ_DONE after each step
 * with the rids that finished. */
struct rx_sched_proc_opts {
    const char *run_dir;       /* the run directory main created (rx_ipc_run_dir) */
    int stats_interval_ms;     /* periodic STATS (cookie 0) to main; 0 = 1000 */
    int tp_rank, tp_size;      /* this rank in its TP group; 0/0 = 0/1 */
    int dp_rank, dp_size;      /* this replica; 0/0 = 0/1 */
    const char *in_sock;       /* rank 0's PULL socket; NULL = RX_SOCK_SCHED */
    const char *up_sock;       /* where replies and STATS go; NULL = RX_SOCK_MAIN */
    const char *hb_name;       /* rank 0's heartbeat page; NULL = RX_HB_SCHED */
    const char *ctl_endpoint;  /* the TP group's control group (tp_size > 1) */
    const char *comm_group;    /* the comm plugin's group name (tp_size > 1) */
    const char *comm_bootstrap;/* the comm plugin's set-up endpoint (tp_size > 1) */
    double comm_timeout_s;     /* [parallel] comm_timeout; 0 = 60 */
    int check_determinism;     /* [parallel] check_determinism */
    /* DP attention (tp_size 1 here: this rank is a replica of its own):
     * every iteration the attention group's ranks all-gather whether they
     * have work; when any has, every rank runs exactly one forward pass --
     * its batch, or an idle one (rx_engine_idle) -- so the model's
     * collectives always pair up.  ctl_endpoint / comm_* name the group. */
    int dp_attention;
    int attn_rank, attn_size;
};

/* Body of the scheduler process (called in a forked child; the parent
 * already did rx_boot_open; the child calls rx_ipc_join(run_dir)).  The KV
 * pool is sized from [cache] kv_memory (see rx_sched_kv_slots) through
 * rx_engine_opts.kv_bytes.  Returns the process exit status: 0 after a
 * SHUTDOWN, 1 on a startup failure (bad model file, KV too small ... logged
 * as one clear line with rx_log error first) or a lost peer. */
int rx_sched_proc_main (struct rx_boot *boot, const struct rx_sched_proc_opts *o);

#endif
