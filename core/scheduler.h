/* core/scheduler.h -- the scheduler core of radixd: continuous batching over
 * one engine (core/engine.h) with the radix prefix cache (core/radix_cache.h)
 * and the KV slot pool (core/kvpool.h).  In-process: the scheduler process
 * that hosts it is a thin loop
 *
 *     for (;;) {
 *         for each REQ_NEW:   rx_sched_submit (s, req)   (RX_EAGAIN -> 503)
 *         for each REQ_ABORT: rx_sched_abort (s, rid)
 *         for each REQ_ABORT_SEQ entry: rx_sched_abort_seq (s, rid, index)
 *         rx_sched_step (s, &out);  send out.tokens as one TOKENS message
 *     }
 *
 * One step (SGLang's event loop, get_next_batch_to_run):
 *   1. re-match every waiting request in the radix cache (handles of
 *      unlocked nodes do not survive an eviction, so matches are never
 *      kept across steps), ask the schedule policy plugin for priorities and
 *      sort by (priority, arrival);
 *   2. form a PREFILL batch (SGLang's PrefillAdder): first the chunked
 *      request, if one is mid-prompt, then waiting requests in order while
 *      the token budgets (max_prefill_tokens, chunked_prefill_size, the
 *      engine's step size), max_running_requests and the KV room allow.  KV
 *      room = free + evictable slots minus what the running requests are
 *      expected to still need: remaining max_tokens (clipped to 4096) x
 *      new_token_ratio.  A request that does not fit the chunk budget is
 *      prefilled in chunks, one per step;
 *   3. if no prefill could be formed, a DECODE batch of every running
 *      request.  Prefill and decode alternate (SGLang without mixed chunks):
 *      a prefill batch carries no decode tokens.  When decode cannot get
 *      one slot per request even after evicting the cache, the running
 *      requests with the fewest generated tokens (then the longest prompt,
 *      then the newest) are retracted back to the waiting queue until the
 *      rest have room for 20 more steps; their computed tokens go into the
 *      radix cache so re-admission hits them, the tokens they generated are
 *      kept (already streamed), and new_token_ratio is raised as SGLang does;
 *      a decode step without retraction decays the ratio;
 *   4. one rx_engine_forward over the batch, sampling (penalties, min_tokens,
 *      temperature / top-k / top-p / min-p with the request's own seeded
 *      generator), logprobs, finish checks (EOS unless ignore_eos,
 *      stop_token_ids, max_tokens, context length);
 *   5. finished requests insert prompt + output into the radix cache and
 *      release their lock and their uncached slots; a request that ran a
 *      prefill (or a chunk) inserts what it has computed so far
 *      (cache_unfinished_req) so that later requests with the same prefix hit
 *      it while it decodes.
 *
 * Determinism: every decision is a function of the calls made (submit /
 * abort / step order, request contents, seeds): no clock, no address, no
 * process-local random number.  The radix cache's logical clock ticks once
 * per step; the policy's seed is derived from the step number.  So every
 * rank that makes the same calls forms the same batches, uses the same KV
 * slots and samples the same tokens.  Wall time is read only for the
 * throughput numbers of rx_sched_stats.
 *
 * Requests with n > 1 are expanded on submit into n siblings (same rid,
 * index 0..n-1) sharing the prompt; sibling i samples with seed + i (a
 * request without a seed uses a seed derived from its rid).  Stop STRINGS
 * are matched by the detokenizer, not here.
 *
 * Ownership: the scheduler borrows boot and engine (both must outlive it) and
 * drives the engine alone through rx_engine_forward with its own slots (do
 * not use the engine's seq_* API meanwhile).  It owns submitted requests.
 * Thread-safety: none; one thread drives a scheduler. */
#ifndef RX_SCHEDULER_H
#define RX_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "boot.h"
#include "engine.h"
#include "ipc_msg.h"
#include "request.h"

typedef struct rx_sched rx_sched_t;

/* Settings: rx_sched_opts_from_conf fills them from [cache] and [scheduler]
 * (the INI defaults when boot has no file); a caller may then change them. */
struct rx_sched_opts {
    const char *policy;             /* schedule policy plugin name ("fcfs"); NULL: [scheduler] policy */
    uint32_t n_slots;               /* KV pool in tokens; 0: the engine's n_slots (never more) */
    uint32_t page_size;             /* [cache] page_size */
    int      radix_cache;           /* [cache] radix_cache */
    int32_t  max_running_requests;  /* 0: n_slots / 2, at most 1024 */
    int32_t  max_queued_requests;   /* 0: no limit */
    int32_t  chunked_prefill_size;  /* -1: no chunking */
    int32_t  max_prefill_tokens;
    double   schedule_conservativeness;
    double   init_new_token_ratio;
    double   min_new_token_ratio_factor;
    int32_t  new_token_ratio_decay_steps;
    int32_t  eos_id;                /* -2: the model's tokenizer.ggml.eos_token_id; -1: none */
    int32_t  context_len;           /* 0: the model's context length */
    /* Floor of the new-token ratio in the admission reserve (0 .. 1; 0:
     * none).  rx_sched_opts_from_conf sets 1 under [parallel] dp_attention:
     * a prefill is admitted only when the rank's KV room after it still
     * holds every running request's whole remaining max_tokens (clipped to
     * 4096), since a DP-attention rank cannot borrow KV from its peers and
     * a retraction's recompute is a step the whole group takes part in. */
    double   min_reserve_ratio;
    /* [scheduler] sampling_threads: threads that sample host rows after a
     * step (core/sample_pool.h; 0 = auto). */
    int32_t  sampling_threads;
    /* [scheduler] device_sampling: -1 auto (on for a device backend, one
     * without RX_KCAP_HOST_VISIBLE), 0 off, 1 on -- a sampled row without
     * penalties, logprobs or a min_tokens ban draws from the device's
     * sampling_candidates most likely tokens (rx_sampler_sample_cands),
     * fetching its whole row only when the cut or the draw falls past
     * them.  The same distribution as the host path, not the same draws. */
    int32_t  device_sampling;
    int32_t  sampling_candidates;   /* 1 .. RX_SCHED_MAX_CANDIDATES */
};

#define RX_SCHED_MAX_CANDIDATES 4096

int rx_sched_opts_from_conf (const rx_conf_t *conf, struct rx_sched_opts *o, struct rx_err *err);

/* [cache] kv_memory as a slot count for a model with bytes_per_token of KV
 * (rx_engine_info (e)->kv_bytes_per_token); free_bytes NULL reads
 * MemAvailable.  For the host process to size the engine's n_slots. */
int rx_sched_kv_slots (const rx_conf_t *conf, uint64_t bytes_per_token, const uint64_t *free_bytes,
                       uint32_t *n_slots, struct rx_err *err);

/* o NULL: from boot's conf.  Loads the policy plugin through rx_boot_plugin
 * when o->policy is NULL ([scheduler] policy), else by name.  Errors: one
 * line (unknown policy plugin, pool larger than the engine's, bad option). */
rx_sched_t *rx_sched_new (struct rx_boot *boot, rx_engine_t *engine, const struct rx_sched_opts *o,
                          struct rx_err *err);
/* Aborts nothing and emits nothing: frees every request, the cache, the
 * pool and the policy instance.  Accepts NULL; sets *self_p to NULL. */
void rx_sched_destroy (rx_sched_t **self_p);

/* Queue a request.  Takes ownership of *r's contents on success (r is reset
 * to an empty request; the struct itself stays the caller's).  On failure
 * *r is untouched and still the caller's:
 *   RX_EAGAIN  max_queued_requests waiting already (HTTP 503 + Retry-After);
 *   RX_EINVAL  bad sampling parameters (message from validate), empty
 *              prompt, a token id outside the vocabulary, a rid already in
 *              use;
 *   RX_ERANGE  a prompt that can never run: prompt length >= the context
 *              length, or longer than the KV pool. */
int rx_sched_submit (rx_sched_t *s, struct rx_request *r, struct rx_err *err);

/* Abort every sibling of rid, waiting or running: their slots return to
 * the pool, their cache locks are released (what the cache held before
 * stays cached; tokens the request computed are freed, not cached), and
 * the next rx_sched_step reports finish = RX_FINISH_ABORT for each.
 * Returns the number of siblings aborted (0: unknown or finished rid). */
int rx_sched_abort (rx_sched_t *s, uint64_t rid);
/* Abort sibling `index` of rid alone (REQ_ABORT_SEQ: main saw that sibling
 * finish by a stop string while the others run): as rx_sched_abort for
 * that one sequence -- its KV returns to the pool now, and the next step
 * reports one finish = RX_FINISH_ABORT entry without tokens for it (the
 * detokenizer ends its state with it and forwards nothing to main, which
 * already counts the sibling done).  The other siblings run on to their
 * own finish.  Returns 1, or 0 for an unknown rid or index or a sibling
 * that has finished already (nothing happens then: not an error, the
 * sibling may well have finished in the meantime). */
int rx_sched_abort_seq (rx_sched_t *s, uint64_t rid, uint32_t index);
/* rx_sched_abort of every request waiting or running (shutdown).  Returns
 * the number of siblings aborted. */
int rx_sched_abort_all (rx_sched_t *s);

/* The outputs of one step.  tokens.out[i] is one request's entry, ready to
 * be sent as a TOKENS message as is (msg.u.tokens = out.tokens), its
 * sibling index (n > 1) in tokens.out[i].index; index[i] repeats it (kept
 * for existing callers).
 * Every array is owned by the scheduler and valid until the next call of
 * rx_sched_step or rx_sched_destroy. */
struct rx_sched_out {
    struct rx_ipc_tokens tokens;
    uint32_t *index;
    /* what ran: 0 = nothing, 1 = prefill, 2 = decode */
    int      kind;
    int32_t  n_seq;            /* sequences in the forward pass */
    int32_t  n_tokens;         /* tokens in the forward pass */
    int32_t  n_retracted;      /* requests retracted this step */
    int32_t  all_decode;       /* rx_model_batch.all_decode the model was given: 1 for a decode
                                  step whose group flag (rx_sched_set_group_decode) is 1 */
};
enum { RX_SCHED_IDLE = 0, RX_SCHED_PREFILL = 1, RX_SCHED_DECODE = 2 };

/* One iteration (see the header comment).  With nothing to do it returns
 * RX_OK with kind IDLE (and any pending abort outputs).  An engine failure
 * is returned (the batch's requests are aborted, their outputs reported in
 * out) -- the caller logs it and may go on. */
int rx_sched_step (rx_sched_t *s, struct rx_sched_out *out, struct rx_err *err);

/* Called by rx_sched_step after the batch is formed and before the model
 * runs, with the step number and a hash of the batch (kind; per sequence
 * its rid, sibling index, new tokens, KV length and last token).  A
 * non-OK return fails the step before the forward pass, exactly as an
 * engine error does (the batch's requests are aborted, the error returned).
 * The peer schedulers' determinism check ([parallel] check_determinism)
 * compares the hash across ranks here, before mismatched batches reach the
 * model's collectives.  fn NULL removes the hook. */
typedef int (*rx_sched_batch_hook) (void *ud, uint64_t step, uint64_t hash, struct rx_err *err);
void rx_sched_set_batch_hook (rx_sched_t *s, rx_sched_batch_hook fn, void *ud);

/* 1 when nothing is waiting, running or pending output. */
int rx_sched_idle (const rx_sched_t *s);

/* 1 when the next rx_sched_step may run a prefill (a request waits or one
 * is mid-prompt); 0 guarantees it runs a decode or nothing.  DP attention
 * all-gathers it before the step (core/sched_proc.c) -- a 1 that ends in a
 * decode (no room to admit) only makes the group's flag conservative. */
int rx_sched_may_prefill (const rx_sched_t *s);

/* The group's "every rank decodes" flag for the next steps (DP attention:
 * the AND over the ranks of !rx_sched_may_prefill, an idle rank counting
 * as decoding, as SGLang's prepare_dp_attn_batch all-reduces it with MIN).
 * A decode step hands the model rx_model_batch.all_decode = this flag; a
 * prefill step 0.  Default 1 (one rank, or TP ranks running one batch). */
void rx_sched_set_group_decode (rx_sched_t *s, int all_decode);

/* POST /flush_cache: only when idle (like SGLang); RX_EAGAIN "requests are
 * running" otherwise.  *freed (may be NULL) gets the tokens dropped. */
int rx_sched_flush_cache (rx_sched_t *s, size_t *freed, struct rx_err *err);

struct rx_sched_stats {
    uint32_t running;           /* requests in the running batch (incl. a chunked prefill) */
    uint32_t queued;            /* waiting requests (siblings counted) */
    uint64_t kv_used;           /* slots handed out (requests + cache) */
    uint64_t kv_total;
    uint64_t kv_free;           /* rx_kvpool_available */
    uint64_t cache_tokens;      /* tokens in the radix cache */
    uint64_t cache_evictable;
    uint64_t cache_protected;
    uint64_t steps;
    uint64_t prompt_tokens;     /* prompt tokens of admitted requests (first admission) */
    uint64_t cached_tokens;     /* ... of them served from the cache */
    uint64_t computed_tokens;   /* tokens run through prefill (re-admission included) */
    uint64_t gen_tokens;        /* tokens sampled */
    uint64_t retractions;
    uint64_t finished;
    double   new_token_ratio;
    double   cache_hit_rate;    /* cached / prompt tokens */
    uint32_t max_running_requests;  /* the limit in force (after defaults) */
    uint32_t context_len;       /* the context length enforced (prompt + output) */
    double   prompt_tps;        /* since the previous rx_sched_stats call (wall time) */
    double   gen_tps;
    /* device sampling: rows drawn from candidates, and of them the ones
     * whose whole row was fetched (a cut past the candidates: full; a
     * plain draw past them: tail) */
    uint64_t cand_rows, cand_full, cand_tail;
    /* rows with logprobs that got candidates (greedy or temperature 1),
     * and of them the ones whose whole row was fetched all the same */
    uint64_t cand_lp_rows, cand_lp_full;
};
void rx_sched_stats (rx_sched_t *s, struct rx_sched_stats *st);

/* For tests and debug: the cache and the pool (borrowed). */
struct rx_radix_cache;
struct rx_kvpool;
struct rx_radix_cache *rx_sched_cache (rx_sched_t *s);
struct rx_kvpool *rx_sched_pool (rx_sched_t *s);
/* Walks the bookkeeping: every slot handed out is owned exactly once (by
 * the cache or one request), lock counts match the requests.  RX_EINTERNAL
 * with the first violation. */
int rx_sched_check (rx_sched_t *s, struct rx_err *err);

#endif
