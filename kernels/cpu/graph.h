/* kernels/cpu/graph.h -- emulated graphs for kernels-cpu ([kernels.cpu]
 * graphs = true, or RADIX_KCPU_GRAPHS=1; test mode).
 *
 * A real graph backend (kernels-cuda) records the ops issued on a stream
 * between graph_begin and graph_end without running them, and replays them
 * at graph_launch with the argument values of capture time, reading device
 * memory as it is at launch.  This table does the same on the CPU: each op
 * issued during a capture becomes a record (a replay function and a copy
 * of its arguments), graph_launch runs the records in order.  So a model's
 * graph path -- what it captures, that every value a step varies reaches
 * the replay through device memory, and when it must capture again -- is
 * tested without a GPU.  No speed-up: the CPU runs the same ops.  A
 * host_fn (ABI 1.4) is a record too: its function runs at every launch and
 * may call the backend's ops then (comm-shm's captured collectives).
 *
 * Not thread-safe: one instance per backend, driven by its one thread. */
#ifndef RX_KCPU_GRAPH_H
#define RX_KCPU_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/kernel.h>

typedef struct rx_kgraphs rx_kgraphs_t;

/* Replays one record: args is the copy rx_kgraphs_record took. */
typedef int (*rx_kgraph_fn) (void *be, rx_kstream_t *s, const void *args, struct rx_err *err);

/* A table keeping at most max_graphs graphs (the least recently launched
 * or captured one is dropped for a new one).  NULL + err on no memory. */
rx_kgraphs_t *rx_kgraphs_new (size_t max_graphs, struct rx_err *err);
void rx_kgraphs_destroy (rx_kgraphs_t **self_p);

/* Starts capturing graph key (replacing it if it exists at end).
 * RX_EINVAL when a capture is already in progress, or from inside a
 * launch (a recorded host_fn). */
int rx_kgraphs_begin (rx_kgraphs_t *g, uint64_t key, struct rx_err *err);
/* 1 while a capture is in progress (its key in *key when key is not NULL). */
int rx_kgraphs_capturing (const rx_kgraphs_t *g, uint64_t *key);
/* Appends a record to the capture: fn and a copy of bytes of args. */
int rx_kgraphs_record (rx_kgraphs_t *g, rx_kgraph_fn fn, const void *args, size_t bytes,
                       struct rx_err *err);
/* Ends the capture of key: the graph exists from now on.  RX_EINVAL when
 * no capture or another key is in progress (the capture is then dropped). */
int rx_kgraphs_end (rx_kgraphs_t *g, uint64_t key, struct rx_err *err);
/* Drops a capture in progress (an op that cannot be captured was issued). */
void rx_kgraphs_abort (rx_kgraphs_t *g);
/* Runs graph key's records in order on stream s; the first error stops it.
 * RX_ENOENT when key was never captured (or was dropped); RX_EINVAL from
 * inside a launch.  A record may call back into the backend (host_fn):
 * its ops run, as nothing is being captured. */
int rx_kgraphs_launch (rx_kgraphs_t *g, void *be, rx_kstream_t *s, uint64_t key,
                       struct rx_err *err);
int rx_kgraphs_has (const rx_kgraphs_t *g, uint64_t key);
/* Drops every graph (device memory was freed: a graph may point into it,
 * as kernels-cuda invalidates them).  A capture in progress stays.  Called
 * during a launch (a host_fn freed memory), it drops them when the launch
 * ends. */
void rx_kgraphs_clear (rx_kgraphs_t *g);
/* Graphs kept, records replayed since creation (for tests and the log). */
size_t rx_kgraphs_count (const rx_kgraphs_t *g);
uint64_t rx_kgraphs_launches (const rx_kgraphs_t *g);

#endif
