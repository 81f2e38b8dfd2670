/* core/ipc.h -- ZMQ channels between radixd's processes, their private run
 * directory, and the scheduler's heartbeat page.
 *
 * Topology (SGLang's): main --PUSH/PULL--> scheduler --PUSH/PULL-->
 * detokenizer --PUSH/PULL--> main.  Each PULL side binds "ipc://<run
 * dir>/<name>", each PUSH side connects to it.  A name that already has a
 * scheme ("ipc://...", "tcp://host:port") is used as given (multi-node).
 *
 * Run directory: rx_ipc_create makes a fresh directory with mkdtemp under
 * $XDG_RUNTIME_DIR (else /tmp), mode 0700, so only this user can connect to
 * the sockets or read the heartbeat; rx_ipc_destroy of the creating object
 * removes it with everything in it.  Another process of the same daemon
 * (after fork or exec) calls rx_ipc_join on the path; it never removes it.
 *
 * Socket options, and why (nothing is lost silently, shutdown never hangs):
 *   - SNDHWM = RCVHWM = 0 (no limit).  The pipeline is a cycle; with finite
 *     HWMs main could block on the scheduler while the scheduler blocks on
 *     the detokenizer which blocks on main.  Memory is bounded upstream by
 *     main's admission limit (full queue = HTTP 503), as in SGLang.  A PUSH
 *     socket never drops at its HWM anyway: it blocks.
 *   - ZMQ_IMMEDIATE = 1 on connecting sockets: messages are queued only to
 *     a completed connection, so a send with no live peer blocks (and with
 *     a timeout returns RX_ETIMEDOUT) instead of silently piling up for a
 *     peer that may never come.
 *   - LINGER = RX_IPC_LINGER_MS (1 s, rx_ipc_set_linger to change): on close,
 *     unsent messages get that long to reach the peer, then are dropped so a
 *     dead peer cannot hang shutdown.  The shutdown protocol (SHUTDOWN/DRAIN
 *     and waiting for the children) makes sure nothing needed is in flight.
 *
 * ZMQ contexts do not survive fork: a forked child must not touch its
 * parent's rx_ipc_t (not even destroy it); it calls rx_ipc_join.
 *
 * Threads: an rx_ipc_t may be shared; an rx_ipc_sock_t belongs to one thread
 * at a time (ZMQ sockets are not thread-safe).
 *
 * Errors name the endpoint and carry zmq_strerror's text. */
#ifndef RX_IPC_H
#define RX_IPC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <radix/err.h>

#include "ipc_msg.h"

#define RX_IPC_LINGER_MS 1000

typedef struct rx_ipc rx_ipc_t;
typedef struct rx_ipc_sock rx_ipc_sock_t;

enum rx_ipc_sock_kind {
    RX_IPC_PUSH = 1,
    RX_IPC_PULL = 2
};

/* A new ZMQ context and a new private run directory (owned: removed by
 * rx_ipc_destroy).  prefix names it, e.g. "radixd" -> /run/user/1000/radixd-Ab12Cd. */
rx_ipc_t *rx_ipc_create (const char *prefix, struct rx_err *err);
/* A new ZMQ context using an existing run directory (not removed). */
rx_ipc_t *rx_ipc_join (const char *run_dir, struct rx_err *err);
/* Close every socket still open, terminate the context, remove the run
 * directory if created here; NULL-safe, sets *self_p NULL. */
void rx_ipc_destroy (rx_ipc_t **self_p);

const char *rx_ipc_run_dir (const rx_ipc_t *self);
/* Linger (ms) of sockets opened from now on; -1 = wait forever (never in radixd). */
void rx_ipc_set_linger (rx_ipc_t *self, int linger_ms);

/* "ipc://<run dir>/<name>" into buf, or name itself if it has "://".
 * RX_ERANGE if the result does not fit buf, or an ipc path is longer than
 * a Unix socket path may be (107 bytes). */
int rx_ipc_endpoint (const rx_ipc_t *self, const char *name, char *buf, size_t cap,
                     struct rx_err *err);

/* A socket bound to / connected to name (see rx_ipc_endpoint).  Owned by
 * the caller (rx_ipc_close) or closed by rx_ipc_destroy. */
rx_ipc_sock_t *rx_ipc_bind (rx_ipc_t *self, int kind, const char *name, struct rx_err *err);
rx_ipc_sock_t *rx_ipc_connect (rx_ipc_t *self, int kind, const char *name, struct rx_err *err);
void rx_ipc_close (rx_ipc_sock_t **sock_p);
/* The resolved endpoint; for "tcp://host:0" binds, the port actually bound. */
const char *rx_ipc_sock_endpoint (const rx_ipc_sock_t *sock);

/* The socket's ZMQ_FD, for an event loop (libevent in radixd's main).  It
 * signals edge-triggered that the socket's state MAY have changed: on each
 * wake-up, receive with timeout 0 until RX_ETIMEDOUT.  -1 on error. */
int rx_ipc_sock_fd (rx_ipc_sock_t *sock);

/* timeout_ms: -1 = block, 0 = do not wait, > 0 = at most that long. */

/* Encode m and send it as one ZMQ message (the encoded buffer is handed to
 * ZMQ without a copy).  RX_ETIMEDOUT if it could not be queued in time (the
 * message is then not sent; nothing is half-sent), RX_EINVAL if m cannot be
 * encoded, RX_EIO on a socket error. */
int rx_ipc_send (rx_ipc_sock_t *sock, const struct rx_ipc_msg *m, int timeout_ms,
                 struct rx_err *err);
/* Send bytes as they are (copied). */
int rx_ipc_send_raw (rx_ipc_sock_t *sock, const void *buf, size_t n, int timeout_ms,
                     struct rx_err *err);

/* Receive one message and decode it into *m (free with rx_ipc_msg_free).
 * RX_ETIMEDOUT when none came in time; RX_EFORMAT when one came but is
 * malformed (it is consumed; the error line says why); RX_EIO. */
int rx_ipc_recv (rx_ipc_sock_t *sock, struct rx_ipc_msg *m, int timeout_ms, struct rx_err *err);
/* Receive one message's bytes into a new malloc'ed *buf_p (caller frees). */
int rx_ipc_recv_raw (rx_ipc_sock_t *sock, void **buf_p, size_t *n, int timeout_ms,
                     struct rx_err *err);

/* Wait until at least one of socks[0..n) has a message to read: returns
 * the number ready (>= 1) with ready[i] = 1 for each, 0 = timed out (no
 * error), or a negative status. */
int rx_ipc_poll (rx_ipc_sock_t *const *socks, size_t n, unsigned char *ready, int timeout_ms,
                 struct rx_err *err);

/* ------------------------------------------------------------ heartbeat
 *
 * The liveness page behind /health: the scheduler bumps it once per step
 * and every N tokens of a long prefill; main reads it with plain loads (no
 * IPC round trip, so a busy scheduler still looks alive).  It is a 4 KiB
 * file in the run directory (<run dir>/<name>.hb, mode 0600) mmap'ed
 * MAP_SHARED by both sides; the writer's fields are C11 atomics:
 *
 *   u64 magic "RXHBEAT1" | u64 beat (bumps) | u64 last_ns (CLOCK_MONOTONIC
 *   of the last bump; same clock in every process of the host) | u32 pid |
 *   u32 state (enum rx_heartbeat_state)
 *
 * Readers decide "dead" from the age of last_ns (and the parent also
 * watches the child's pid); "busy" vs "idle" comes from state. */
typedef struct rx_heartbeat rx_heartbeat_t;

enum rx_heartbeat_state {
    RX_HB_STARTING = 0,
    RX_HB_IDLE     = 1,   /* waiting for requests */
    RX_HB_BUSY     = 2,   /* running a batch */
    RX_HB_DRAINING = 3,
    RX_HB_STOPPED  = 4
};

struct rx_heartbeat_info {
    uint64_t beat;        /* bumps so far */
    uint64_t last_ns;     /* CLOCK_MONOTONIC of the last bump, 0 = never */
    uint64_t age_ns;      /* now - last_ns (UINT64_MAX if never) */
    uint32_t pid;         /* the writer */
    uint32_t state;
};

/* Writer: create (or truncate) <run dir>/<name>.hb and map it writable. */
rx_heartbeat_t *rx_heartbeat_create (const rx_ipc_t *ipc, const char *name, struct rx_err *err);
/* Reader: map an existing page read-only (RX_ENOENT until the writer made it). */
rx_heartbeat_t *rx_heartbeat_open (const rx_ipc_t *ipc, const char *name, struct rx_err *err);
/* Same by path (either side). */
rx_heartbeat_t *rx_heartbeat_map (const char *path, int writer, struct rx_err *err);
void rx_heartbeat_close (rx_heartbeat_t **self_p);

/* Writer only: count one beat and stamp the time; optionally set state. */
void rx_heartbeat_beat (rx_heartbeat_t *self);
void rx_heartbeat_set_state (rx_heartbeat_t *self, uint32_t state);
/* Either side. */
void rx_heartbeat_read (const rx_heartbeat_t *self, struct rx_heartbeat_info *info);

#endif
