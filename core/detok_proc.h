/* core/detok_proc.h -- the body of radixd's detokenizer process: TOKENS
 * from the scheduler in, TEXT to the main process out.  The protocol (socket
 * names, message flow, stop-string and finish rules) is documented with the
 * scheduler process in core/sched_proc.h, which includes this header. */
#ifndef RX_DETOK_PROC_H
#define RX_DETOK_PROC_H

#include "boot.h"

/* Body of the detokenizer process (called in a forked child; the parent
 * already did rx_boot_open; the child calls rx_ipc_join(run_dir)): opens
 * [model] path's GGUF for the tokenizer, binds RX_SOCK_DETOK, connects to
 * RX_SOCK_MAIN.  Returns the exit status: 0 after a SHUTDOWN, 1 on a
 * start-up failure (bad model file, socket trouble: one clear line logged at
 * error level first) or when main is gone. */
int rx_detok_proc_main (struct rx_boot *boot, const char *run_dir);

/* The same with n_upstream schedulers PUSHing TOKENS to it (dp_size
 * replicas' rank 0 each, core/dp_proc.h): it exits 0 only after the
 * SHUTDOWN of the LAST of them (each sends one as it stops), so a replica
 * that stops late still gets its final TOKENS rendered.  n_upstream < 1 is
 * taken as 1.  rx_detok_proc_main is this with n_upstream 1. */
int rx_detok_proc_main_n (struct rx_boot *boot, const char *run_dir, int n_upstream);

#endif
