/* core/supervisor.h -- radixd's child processes: fork one with a body
 * function, and say in words how one ended.
 *
 * The parent (radixd's main process) forks its children right after boot,
 * while it still has a single thread and before it creates anything a child
 * must not inherit (ZMQ's I/O threads, which start with the first socket;
 * the kernel thread pool; the HTTP listener): a child runs its body on a
 * copy of the booted
 * configuration and loaded plugins, and opens its own ZMQ context
 * (rx_ipc_join).  Each child:
 *   - dies with its parent (PR_SET_PDEATHSIG SIGKILL), so a killed main
 *     never leaves a scheduler holding the model and the KV memory;
 *   - ignores SIGINT, SIGTERM and SIGPIPE: the parent alone decides how the
 *     daemon stops (a terminal's Ctrl-C reaches the whole process group)
 *     and tells the children over IPC (SHUTDOWN);
 *   - ends with _exit(body's result), never returning into the parent's
 *     code or running its atexit handlers. */
#ifndef RX_SUPERVISOR_H
#define RX_SUPERVISOR_H

#include <stddef.h>
#include <sys/types.h>

#include <radix/err.h>

typedef int (*rx_child_fn) (void *arg);

/* Fork a child that sets its log role to role and runs fn(arg).  Returns
 * its pid, or -1 with err set. */
pid_t rx_child_spawn (const char *role, rx_child_fn fn, void *arg, struct rx_err *err);

/* "exited with status 1", "was killed by signal 9 (Killed)" from a waitpid
 * status, into buf. */
void rx_child_describe (int wstatus, char *buf, size_t cap);

#endif
