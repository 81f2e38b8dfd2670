/* core/server.h -- radixd's main process: the HTTP front end, the table of
 * live requests, and the supervision of the scheduler and detokenizer
 * processes (SGLang's TokenizerManager + the launcher's watchdog, in C).
 *
 *   main (this)  --REQ_NEW/ABORT/FLUSH/GET_STATS/SHUTDOWN-->  scheduler
 *   scheduler    --TOKENS-->  detokenizer  --TEXT-->  main
 *   scheduler    --REQ_ERROR/FLUSH_CACHE_REPLY/STATS-->  main
 *
 * One thread runs a libevent loop: evhttp for HTTP/1.1 (keep-alive,
 * chunked SSE), the ZMQ_FD of main's PULL socket, signals (SIGTERM/SIGINT
 * drain, SIGCHLD), and a 100 ms timer for the watchdog and as a safety net
 * for ZMQ's edge-triggered descriptor.  Requests are tokenized here (the
 * tokenizer is thread-safe but there is only one thread), sent as REQ_NEW,
 * and answered from the TEXT deltas the detokenizer sends back.
 *
 * Start-up: open the GGUF for the tokenizer and chat template, create the
 * private run directory, fork the detokenizer and the scheduler
 * (core/supervisor.h) while main still has one thread, bind main's PULL
 * socket (ZMQ's threads start here), wait for the scheduler's first STATS
 * (model loaded, KV reserved), then bind the HTTP socket and log
 * "ready on http://HOST:PORT".
 *
 * Ending:
 *   - SIGTERM/SIGINT: drain.  The listener closes (new connections are
 *     refused), requests arriving on open connections get 503, the scheduler
 *     gets SHUTDOWN DRAIN with [server] shutdown_timeout; requests in flight
 *     finish (or are aborted at the deadline and answered with
 *     finish_reason "abort"); when both children exited the process exits 0.
 *     A second signal aborts at once.
 *   - a child that exits or is killed, or a scheduler whose heartbeat is
 *     older than [server] watchdog_timeout: the reason is logged, the other
 *     child is killed, open requests get a 500 (or their stream ends), and
 *     radixd exits 1.  Never a hang. */
#ifndef RX_SERVER_H
#define RX_SERVER_H

#include "boot.h"

/* Run the daemon for a booted configuration; returns the process exit
 * status (0 after a drain, 1 on a start-up failure or a dead child). */
int rx_server_main (struct rx_boot *boot);

#endif
