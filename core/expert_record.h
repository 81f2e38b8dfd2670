/* core/expert_record.h -- EPLB at run time (docs/eplb.md "At run time"):
 * the expert-distribution recorder and the engine's placement state.
 *
 * Two layers:
 *
 *   rx_expert_record  a sliding window over the last `window` steps of
 *                     per-step counts [n_layer][n_expert] (tokens routed to
 *                     each MoE layer's logical expert).  A ring of per-step
 *                     uint32 rows plus their running int64 sum: adding a
 *                     step is O(layers x experts), no allocation; memory is
 *                     window x layers x experts x 4 bytes (1000 steps of 58
 *                     layers x 256 experts: 59 MB; the tiny models: KB).
 *
 *   rx_eplb_rt        what an engine runs: the host array the model counts
 *                     into (rx_model_env.expert_count), the window, the
 *                     current placement (static [eplb] init_expert_location
 *                     at load, dynamic every [eplb] rebalance_interval
 *                     steps) and the HTTP record / dump controls.
 *
 * Dynamic rebalance: the engine counts its forward passes (idle ones of a
 * DP-attention group included, so every rank of the group has the same
 * count); under a DP-attention group with rebalance on, each step's counts
 * are all-reduced (sum, one int64 [layers x experts] collective after the
 * forward, ordered with the model's own), so every rank's window holds the
 * group's counts.  At every rebalance_interval-th step each rank computes
 * the mean balancedness over the MoE layers of the current placement under
 * the window (GPU = EP rank: ep_size GPUs); at or above [eplb]
 * min_rebalance_balancedness it logs a skip, else it runs [eplb] algorithm
 * (same input, deterministic: the same placement on every rank) for the
 * static placement's slot count (experts + num_redundant_experts without
 * one) over ep_size GPUs and
 * switches the model at this step boundary (rx_model_ops.set_placement).
 * Requests in flight are not disturbed: a placement changes where experts
 * run, not what they compute.
 *
 * Thread-safety: none; one thread (the engine's) drives both. */
#ifndef RX_EXPERT_RECORD_H
#define RX_EXPERT_RECORD_H

#include <stdint.h>
#include <stdio.h>

#include <radix/comm.h>
#include <radix/err.h>
#include <radix/kernel.h>
#include <radix/model.h>

#include "conf.h"
#include "eplb.h"
#include "gguf.h"
#include "loader.h"

/* ------------------------------------------------------------- the window */

typedef struct rx_expert_record rx_expert_record_t;

/* n_layer, n_expert >= 1, window >= 1 (RX_EINVAL otherwise). */
rx_expert_record_t *rx_expert_record_new (int32_t n_layer, int32_t n_expert, int32_t window,
                                          struct rx_err *err);
void rx_expert_record_free (rx_expert_record_t **self_p);
/* Append one step's counts step[n_layer][n_expert] (each 0 .. UINT32_MAX;
 * larger values saturate); the oldest step leaves a full window. */
void rx_expert_record_add (rx_expert_record_t *r, const int64_t *step);
void rx_expert_record_reset (rx_expert_record_t *r);
/* Steps now in the window (<= window) and steps added since the reset. */
int32_t rx_expert_record_steps (const rx_expert_record_t *r);
int64_t rx_expert_record_total_steps (const rx_expert_record_t *r);
/* The window's sum [n_layer][n_expert] (owned by r, valid until the next call). */
const int64_t *rx_expert_record_sum (const rx_expert_record_t *r);
int32_t rx_expert_record_n_layer (const rx_expert_record_t *r);
int32_t rx_expert_record_n_expert (const rx_expert_record_t *r);
/* The window as a load file (core/eplb.h): {"load": [[...]], "n_steps",
 * "window", "layers", "experts", "tokens_per_layer": [...]} plus, when p
 * is given, "balancedness": [per layer] of p over n_gpu GPUs. */
int rx_expert_record_write (const rx_expert_record_t *r, FILE *f, const struct rx_placement *p,
                            int32_t n_gpu, struct rx_err *err);

/* ------------------------------------------------------ the engine's part */

typedef struct rx_eplb_rt rx_eplb_rt_t;

enum rx_eplb_op {
    RX_EPLB_START = 1,   /* reset the window, record */
    RX_EPLB_STOP  = 2,   /* stop recording (the window is kept for a dump) */
    RX_EPLB_DUMP  = 3    /* write the window into [eplb] record_dir */
};

/* Before the model is created: *out = NULL (RX_OK) for a dense model (no
 * <arch>.expert_count), else the recorder with its host array sized from
 * <arch>.block_count x <arch>.expert_count; env_set fills the env members. */
int rx_eplb_rt_new (const rx_conf_t *conf, const rx_gguf_t *g, const char *arch, rx_eplb_rt_t **out,
                    struct rx_err *err);
void rx_eplb_rt_env (rx_eplb_rt_t *rt, struct rx_model_env *env);

/* What the runtime drives (borrowed; outlive it). */
struct rx_eplb_rt_attach {
    rx_loader_t *loader;
    const struct rx_model_ops *M;
    void *model;
    const struct rx_model_info *info;  /* n_moe_layer, n_expert */
    const struct rx_kernels_ops *K;
    void *be;
    const struct rx_comm_ops *C;       /* the DP-attention group's comm, or NULL */
    void *comm;
    int32_t rank;                      /* this rank in the group (0) */
    int32_t dp_group;                  /* 1: DP-attention group of several ranks */
    int32_t ep_size;                   /* GPUs of the balancedness (>= 1) */
};
/* After create, before reserve: the window and the static placement
 * ([eplb] init_expert_location; errors name the file).  A model that does
 * not report n_moe_layer (an older plugin) leaves recording off. */
int rx_eplb_rt_start (rx_eplb_rt_t *rt, const struct rx_eplb_rt_attach *a, struct rx_err *err);
/* Whether the next forward's expert counts are read (recording started or
 * rebalance on): the engine tells the model (rx_model_batch.count_experts),
 * which otherwise skips the host copy of its routing.  NULL: 0. */
int rx_eplb_rt_counting (const rx_eplb_rt_t *rt);
/* After every successful forward pass (idle ones included). */
int rx_eplb_rt_step (rx_eplb_rt_t *rt, struct rx_err *err);
/* An HTTP control; msg gets one line for the client (the dump's path). */
int rx_eplb_rt_control (rx_eplb_rt_t *rt, int op, char *msg, size_t cap, struct rx_err *err);
/* Balancedness of the current placement under the window, per MoE layer
 * (out[n], n <= layers); returns the layers written. */
int32_t rx_eplb_rt_balancedness (rx_eplb_rt_t *rt, double *out, int32_t n);
/* Rebalances done and skipped so far. */
void rx_eplb_rt_counters (const rx_eplb_rt_t *rt, uint64_t *done, uint64_t *skipped);
void rx_eplb_rt_free (rx_eplb_rt_t **self_p);

#endif /* RX_EXPERT_RECORD_H */
