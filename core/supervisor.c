/* core/supervisor.c -- see supervisor.h. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "supervisor.h"

pid_t rx_child_spawn (const char *role, rx_child_fn fn, void *arg, struct rx_err *err)
{
    pid_t parent = getpid ();
    pid_t pid = fork ();
    if (pid < 0) {
        rx_err_set (err, RX_EIO, "cannot start the %s process: fork: %s", role, strerror (errno));
        return -1;
    }
    if (pid > 0) return pid;

    /* Child. */
    prctl (PR_SET_PDEATHSIG, SIGKILL);
    if (getppid () != parent) _exit (1);   /* the parent died before prctl */
    struct sigaction sa;
    memset (&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction (SIGINT, &sa, NULL);
    sigaction (SIGTERM, &sa, NULL);
    sigaction (SIGPIPE, &sa, NULL);
    sa.sa_handler = SIG_DFL;
    sigaction (SIGCHLD, &sa, NULL);
    sigaction (SIGHUP, &sa, NULL);
    sigset_t none;
    sigemptyset (&none);
    sigprocmask (SIG_SETMASK, &none, NULL);
    /* ps / top show which child is which: "radixd:sched", or the role
     * alone ("sched.dp1.tp0") when the prefix would not fit the kernel's
     * 15 characters and ranks would look alike. */
    char comm[16];
    if (strlen ("radixd:") + strlen (role) < sizeof comm) snprintf (comm, sizeof comm, "radixd:%s", role);
    else snprintf (comm, sizeof comm, "%s", role);
    prctl (PR_SET_NAME, comm);
    rx_log_set_role (role, NULL);
    _exit (fn (arg));
}

void rx_child_describe (int st, char *buf, size_t cap)
{
    if (WIFEXITED (st))
        snprintf (buf, cap, "exited with status %d", WEXITSTATUS (st));
    else if (WIFSIGNALED (st))
        snprintf (buf, cap, "was killed by signal %d (%s)%s", WTERMSIG (st), strsignal (WTERMSIG (st)),
                  WCOREDUMP (st) ? ", core dumped" : "");
    else
        snprintf (buf, cap, "changed state (wait status 0x%x)", (unsigned) st);
}
