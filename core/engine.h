/* core/engine.h -- the model runner: one model on one kernel backend.
 *
 * rx_engine_new opens the GGUF, picks the model plugin by
 * general.architecture (or [model] plugin), the kernel backend ([kernels]
 * backend, threads) and the attention backend ([attention] backend =
 * auto|mha|...), creates the model and reserves its KV pool and scratch.
 * rx_engine_step runs one forward pass over several sequences and copies
 * the logits asked for back to the host.
 *
 * KV slots: this runner hands each sequence one contiguous range of slots
 * (first fit), enough for the CLI and the reference tests; the serving
 * milestone drives the model plugin with slots from the radix-cache pool
 * instead (the model ABI takes arbitrary slot lists).
 *
 * Ownership: the engine borrows boot (its conf and loader must outlive the
 * engine) and owns the GGUF mapping, the backend instance and the model.
 * Thread-safety: one thread drives an engine. */
#ifndef RX_ENGINE_H
#define RX_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>
#include <radix/model.h>

#include "boot.h"
#include "gguf.h"

typedef struct rx_engine rx_engine_t;

struct rx_engine_opts {
    const char *model_path;   /* NULL: [model] path */
    int64_t     n_slots;      /* KV pool in tokens; 0: min(context length, 4096) */
    int32_t     max_tokens;   /* most tokens in one step; 0: min(n_slots, 512)
                                 (with kv_bytes: min(n_slots / 2, 512)) */
    uint64_t    kv_bytes;     /* KV memory in bytes ([cache] kv_memory, see
                                 rx_sched_kv_slots); when set, n_slots is ignored
                                 and becomes kv_bytes / the model's KV bytes per
                                 token, decided after the model reports its info
                                 and before its KV is reserved; capped at 64 x
                                 the context length and INT32_MAX.  Fewer than
                                 RX_ENGINE_MIN_KV_TOKENS, or than 2 x an explicit
                                 max_tokens, is an error naming [cache] kv_memory.
                                 0: n_slots as above. */
    /* Tensor parallelism: with tp_size > 1 this engine is rank tp_rank of a
     * group of tp_size engines (one per process, each with its own kernel
     * backend) that run the same steps; the model splits its heads and FFN
     * columns over them and all-reduces through the comm plugin, so every
     * rank ends each step with the same logits.  Every rank must make the
     * same calls in the same order (rx_engine_new included: it joins the
     * group and agrees on the KV pool size with the others). */
    int32_t     tp_rank;        /* this process's rank in its tensor-parallel group (0) */
    int32_t     tp_size;        /* ranks in the group; 0 or 1 = no TP */
    const char *comm;           /* comm plugin name ("shm", "zmq", "nccl"); NULL: [parallel] comm, default "shm" */
    const char *comm_group;     /* unique group name for the comm plugin (rx_comm_params.group) */
    const char *comm_bootstrap; /* ZMQ endpoint for the comm plugin's set-up (rx_comm_params.bootstrap) */
    double      comm_timeout_s; /* collective timeout; 0: 60 */
    /* DP attention ([parallel] dp_attention): with tp_size = N > 1 the
     * group is a DP-attention group instead: each rank runs its OWN steps
     * (its own sequences, its own KV pool, not agreed with the others) and
     * gets the logits of its own rows; the model splits only its dense FFN
     * over the ranks and gathers/scatters every rank's rows around it.
     * The ranks must step in lockstep: in each step of the group every
     * rank makes exactly one rx_engine_step / rx_engine_forward, or
     * rx_engine_idle when it has nothing to run.  rx_engine_new agrees on
     * max_tokens (the smallest of the ranks) instead of the KV pool. */
    int32_t     dp_attention;
    /* Devices and KV sizing on a device backend (appended): */
    int32_t     dp_rank;        /* this replica (DP without DP attention); with tp_rank
                                 * it picks the device of [kernels] device = auto */
    int32_t     local_ranks;    /* scheduler ranks on this host, which split a
                                 * fractional [cache] kv_memory; 0: 1 */
    double      kv_share;       /* > 0: [cache] kv_memory is this share of free memory
                                 * (rx_engine_kv_share) and kv_bytes the caller's host-
                                 * based figure; on a device backend (not
                                 * RX_KCAP_HOST_VISIBLE) the engine replaces kv_bytes by
                                 * rx_engine_kv_device_bytes of the device's free memory
                                 * after the weights are loaded.  0: kv_bytes as given */
};

/* The smallest KV pool kv_bytes may give (tokens). */
#define RX_ENGINE_MIN_KV_TOKENS 64

/* The kernel backend's create() parameters for the scheduler rank `rank`
 * (its index on this host: dp_rank * tp_size + tp_rank): [kernels] threads,
 * and [kernels] device -- "auto" (the default) passes RX_KDEVICE_AUTO, so
 * the backend takes rank modulo its device count (SGLang's base_gpu_id +
 * rank, base 0); a number >= 0 puts every rank on that device.  RX_ECONFIG
 * naming [kernels] device for anything else. */
struct rx_kernels_params;
int rx_engine_kernels_params (const rx_conf_t *conf, int32_t rank, struct rx_kernels_params *kp,
                              struct rx_err *err);

/* [cache] kv_memory as a share of free memory: 1 and *share in (0, 1] for
 * "0.8" or "80%" (the sizing parser's rule: a decimal point or a percent
 * sign), else 0 (a size, or unparsable: the sizing parser reports it). */
int rx_engine_kv_share (const char *spec, double *share);

/* KV bytes a rank gets from share of a device's free memory (measured after
 * the weights were loaded): the ranks of the host that sit on one device
 * split it -- all local_ranks when every rank uses one explicit device, else
 * ceil(local_ranks / n_devices) (device = auto spreads them).  0 when
 * dev_free is 0 (unknown). */
uint64_t rx_engine_kv_device_bytes (double share, uint64_t dev_free, int32_t local_ranks,
                                    int32_t n_devices, int one_device);

/* Errors: one line naming the file, plugin or key that is wrong.  Caller
 * owns the result; release with rx_engine_destroy.  With tp_size > 1 it
 * blocks until every rank of the group has joined (comm_timeout_s), and the
 * pool is the smallest n_slots of any rank (ranks may hold different KV
 * bytes per token when the heads do not split evenly; their schedulers
 * must agree on the pool). */
rx_engine_t *rx_engine_new (struct rx_boot *boot, const struct rx_engine_opts *o,
                            struct rx_err *err);
void rx_engine_destroy (rx_engine_t **self_p);

/* The model file the engine opens: path if not NULL, else [model] path
 * (a relative path in an INI file is relative to that file's folder), or
 * NULL when neither is set (or out of memory).  Caller frees.  For
 * processes that need the file without an engine (the detokenizer). */
char *rx_engine_model_path (const struct rx_boot *boot, const char *path);

const struct rx_model_info *rx_engine_info (const rx_engine_t *e);
/* The open model file (for the tokenizer); owned by the engine. */
const rx_gguf_t *rx_engine_gguf (const rx_engine_t *e);
int64_t rx_engine_n_slots (const rx_engine_t *e);
int32_t rx_engine_max_tokens (const rx_engine_t *e);
/* Tensor-parallel rank and size (0 and 1 without tensor parallelism); with
 * DP attention the rank and size of the DP-attention group. */
int32_t rx_engine_tp_rank (const rx_engine_t *e);
int32_t rx_engine_tp_size (const rx_engine_t *e);
/* 1 when the engine was made with opts.dp_attention. */
int rx_engine_dp_attention (const rx_engine_t *e);
/* EPLB at run time (core/expert_record.h): the recorder / placement state
 * of an MoE model, NULL for a dense one.  Owned by the engine; after every
 * forward pass the engine folds the step's expert counts into it (and
 * rebalances every [eplb] rebalance_interval steps). */
struct rx_eplb_rt;
struct rx_eplb_rt *rx_engine_eplb (rx_engine_t *e);
/* The engine's kernel backend: its ops and instance (owned by the engine;
 * for tools and tests, e.g. to ask graph_has). */
void rx_engine_kernels (const rx_engine_t *e, const struct rx_kernels_ops **ops, void **be);
/* "model-llama (llama) on kernels-cpu [device], attn-mha" (and "tp 2
 * (rank 0, comm shm)" with tensor parallelism, "dp attention 2 (rank 0,
 * comm shm)" with DP attention): for logs. */
const char *rx_engine_describe (const rx_engine_t *e);

/* A sequence with room for `capacity` tokens of KV (contiguous slots).
 * Returns its id (>= 0), or RX_EAGAIN when no free range is large enough,
 * RX_EINVAL for capacity < 1. */
int rx_engine_seq_new (rx_engine_t *e, int32_t capacity, struct rx_err *err);
/* Frees the sequence's slots.  RX_EINVAL for an unknown id. */
int rx_engine_seq_free (rx_engine_t *e, int32_t seq);
/* Tokens stored so far; -1 for an unknown id. */
int32_t rx_engine_seq_len (const rx_engine_t *e, int32_t seq);
/* Tokens that still fit (capacity - length); -1 for an unknown id. */
int32_t rx_engine_seq_room (const rx_engine_t *e, int32_t seq);
/* Forget the tokens from position len on (len <= length): the next step
 * overwrites their KV.  Lets a chat keep the prefix it shares with the
 * re-rendered conversation.  RX_EINVAL for an unknown id or a bad len. */
int rx_engine_seq_truncate (rx_engine_t *e, int32_t seq, int32_t len);

/* One sequence's part of a step: n_tokens new tokens appended at the end. */
struct rx_engine_req {
    int32_t        seq;
    int32_t        n_tokens;     /* >= 1 */
    const int32_t *tokens;
    int            all_logits;   /* 1: logits for every new token; 0: for the last only */
};

/* Number of logit rows a step with these requests produces. */
int32_t rx_engine_n_out (const struct rx_engine_req *reqs, int32_t n_req);

/* One forward pass over n_req requests of distinct sequences (a mix of
 * prefill and decode).  logits: host [n_out][n_vocab] in request order
 * (rx_engine_n_out rows), or NULL for none.  On success each sequence's
 * length grows by its n_tokens; on failure nothing changes.  RX_EINVAL when
 * the tokens do not fit a sequence's capacity or the step exceeds
 * max_tokens (split it). */
int rx_engine_step (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req,
                    float *logits, struct rx_err *err);

/* Lower level: one forward pass over a batch with caller-chosen KV slots,
 * any slot of the pool (the serving scheduler's path; the sequences above
 * are neither used nor updated, so do not mix the two on one engine).
 * b->logits is ignored: the logits of b->out_rows are copied to the host
 * buffer logits [n_out][n_vocab] (NULL allowed when n_out == 0).  Batch
 * errors are the model plugin's one-line messages. */
int rx_engine_forward (rx_engine_t *e, const struct rx_model_batch *b, float *logits,
                       struct rx_err *err);
/* rx_engine_forward, and on the device the argmax of every output row into
 * ids[0 .. n_out) (the host's rx_argmax exactly: NaN never wins, the first
 * of equal maxima does, an all-NaN row is 0), when ids is not NULL.  Only
 * the rows j with want[j] nonzero are copied into logits (want NULL: every
 * row, or none when logits is NULL too): a greedy request needs its
 * id, not n_vocab floats, which on a GPU is most of a decode step's
 * transfer. */
int rx_engine_forward_ids (rx_engine_t *e, const struct rx_model_batch *b, float *logits,
                           const uint8_t *want, int32_t *ids, struct rx_err *err);
/* Device sampling (core/sampling.h rx_sampler_sample_cands): for output
 * row j with inv_t[j] > 0, probs = softmax(logits * inv_t[j]) over the
 * vocabulary on the device, and its k largest (descending, the lower id
 * first on ties) copied to the host -- k * 8 bytes instead of n_vocab * 4,
 * and no host pass over the row.  Candidate rows are packed in output-row
 * order: the c-th row with inv_t > 0 has probs[c*k ..] and ids[c*k ..].
 * k is clamped to 1 .. n_vocab. */
struct rx_engine_cands {
    int32_t      k;
    const float *inv_t;     /* [n_out]: 1 / temperature, or 0: no candidates */
    float       *probs;     /* host [rows with inv_t > 0, then with inv_t2 > 0][k] */
    int32_t     *ids;
    /* NULL, or [n_out]: a second candidate row at 1 / inv_t2[j] where > 0,
     * packed after every inv_t row (in output-row order): a row sampled
     * at T whose logprobs need temperature 1. */
    const float *inv_t2;
};
/* rx_engine_forward_ids, and the candidates of cands' rows (NULL: none). */
int rx_engine_forward_sample (rx_engine_t *e, const struct rx_model_batch *b, float *logits,
                              const uint8_t *want, int32_t *ids, const struct rx_engine_cands *cands,
                              struct rx_err *err);
/* After a forward: copy more of its output rows (want[j] nonzero) into
 * logits [n_out][n_vocab] -- the rows whose candidates were not enough.
 * Valid until the next forward. */
int rx_engine_logits_rows (rx_engine_t *e, float *logits, int32_t n_out, const uint8_t *want,
                           struct rx_err *err);
/* After a forward: out[i] = the logit at flat index idx[i] of its output
 * rows (row j, token t: j * n_vocab + t), gathered on the device (the
 * gather_rows op, ABI 1.3) and copied back -- a few values of many rows
 * instead of the rows.  Device sampling's penalized rows read their
 * candidates' and their penalized tokens' raw logits this way.  Valid
 * until the next forward; RX_ENOTSUP without gather_rows
 * (rx_engine_can_gather), RX_EINVAL for an index past the last step's
 * rows' storage. */
int rx_engine_logits_gather (rx_engine_t *e, const int32_t *idx, size_t n, float *out, struct rx_err *err);
int rx_engine_can_gather (const rx_engine_t *e);
/* Whether the backend's memory is the device's own (not RX_KCAP_HOST_VISIBLE):
 * where [scheduler] device_sampling = auto samples from candidates. */
int rx_engine_device_sampling (const rx_engine_t *e);

/* rx_engine_step with the device argmax of each output row into ids
 * (rx_engine_n_out rows) instead of its logits: greedy decoding
 * (radix bench --greedy). */
int rx_engine_step_ids (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req,
                        int32_t *ids, struct rx_err *err);
/* rx_engine_step_ids with device sampling's candidates of the output rows
 * (struct rx_engine_cands; inv_t has rx_engine_n_out entries): radix bench
 * --sample measures the device's share of device sampling. */
int rx_engine_step_sample (rx_engine_t *e, const struct rx_engine_req *reqs, int32_t n_req,
                           int32_t *ids, const struct rx_engine_cands *cands, struct rx_err *err);

/* DP attention: this rank's step when it has no work -- one forward of
 * zero tokens, which still takes part in every layer's collectives so the
 * ranks that do have work never wait for it.  A no-op with a group of one.
 * RX_EINVAL without opts.dp_attention. */
int rx_engine_idle (rx_engine_t *e, struct rx_err *err);

/* rx_engine_idle handing the model the group's "every rank decodes" flag
 * (rx_model_batch.all_decode: the serving scheduler's group flag, see
 * rx_sched_set_group_decode), as the ranks with work get it in their
 * batches; rx_engine_idle passes 0 (not known). */
int rx_engine_idle_group (rx_engine_t *e, int32_t all_decode, struct rx_err *err);

#endif
