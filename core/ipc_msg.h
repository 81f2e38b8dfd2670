/* core/ipc_msg.h -- the binary messages radixd's processes exchange over ZMQ
 * (core/ipc.h): main -> scheduler (REQ_NEW, REQ_ABORT, control),
 * scheduler -> detokenizer (TOKENS), detokenizer -> main (TEXT), and the
 * scheduler's replies to main (REQ_ERROR, FLUSH_CACHE_REPLY, STATS); with
 * dp_size > 1 the DP controller (core/dp_proc.h) stands between main and
 * the replicas' schedulers, which also tell it REQ_DONE.
 *
 * Wire format, version RX_IPC_VERSION (all integers little-endian, floats
 * as their IEEE-754 bit pattern in a u32):
 *
 *   header (12 bytes): u32 magic "RXIP" | u16 version | u16 type | u32 payload length
 *   payload: exactly `payload length` bytes, laid out per type below.
 *
 *   str   = u32 length, bytes (no NUL on the wire)
 *   i32[] = u32 count, count x i32          (token ids are always int32)
 *
 *   REQ_NEW      u64 rid, i32 kind, u8 stream, u8 echo, i32[] input ids,
 *                sampling: f32 temperature, top_p; i32 top_k; f32 min_p,
 *                frequency_penalty, presence_penalty, repetition_penalty;
 *                i32 max_tokens, min_tokens, n, top_logprobs; u8 logprobs,
 *                ignore_eos, has_seed, skip_special_tokens; u64 seed;
 *                u8 n_stop, n_stop x str; u8 n_stop_ids, n_stop_ids x i32
 *   REQ_ABORT    u32 count, count x u64 rid
 *   TOKENS       u64 step, u32 count, count x entry:
 *                u64 rid, u32 index, u8 flags (1 = logprobs, 2 = first output),
 *                u8 finish, i32 matched, u32 prompt, cached, completion tokens,
 *                i32[] ids,
 *                [flags&1: u8 n_top, n x f32 logprob, n*n_top x i32 top ids,
 *                          n*n_top x f32 top logprobs      (n = number of ids)]
 *                [flags&2: u8 skip_special_tokens, u8 n_stop, n_stop x str]
 *   TEXT         u32 count, count x entry:
 *                u64 rid, u32 index, u8 flags (1 = logprobs), u8 finish, i32 matched,
 *                u32 prompt, cached, completion tokens, str text (UTF-8),
 *                [flags&1: u32 n, u8 n_top, n x i32 ids, n x f32 logprob,
 *                          n*n_top x i32 top ids, n*n_top x f32 top logprobs]
 *   FLUSH_CACHE  u64 cookie
 *   FLUSH_CACHE_REPLY  u64 cookie, i32 status (enum rx_status), str message
 *   GET_STATS    u64 cookie
 *   STATS        u64 cookie, u32 dp_rank, running, queued, u64 kv_used,
 *                kv_total, steps, prompt_tokens, gen_tokens, f32 cache_hit_rate,
 *                prompt_tps, gen_tps, u64 cached_tokens, cache_tokens,
 *                finished, retractions, u32 max_running_requests,
 *                context_len, n_vocab, f32 new_token_ratio, u64 cand_rows,
 *                cand_full, cand_tail, cand_lp_rows, cand_lp_full
 *   SHUTDOWN     u8 mode (enum rx_ipc_shutdown_mode), u32 deadline_ms
 *   REQ_ERROR    u64 rid, i32 status (enum rx_status, < 0), str message
 *   REQ_DONE     u32 count, count x u64 rid      (the layout of REQ_ABORT)
 *   EPLB         u64 cookie, u8 op (1 start, 2 stop, 3 dump: expert
 *                distribution recording, core/expert_record.h)
 *   EPLB_REPLY   the layout of FLUSH_CACHE_REPLY (message: the dump's path)
 *   EPLB_STATS   u32 dp_rank, u64 rebalanced, u64 skipped, u32 n (<= 4096),
 *                n x f32 balancedness per MoE layer (sent with the periodic
 *                STATS by a scheduler whose model is MoE; /metrics gauges)
 *   REQ_ABORT_SEQ u32 count, count x (u64 rid, u32 sibling index)
 *
 * History: version 2 added the sibling index to TOKENS and TEXT entries
 * (n > 1), the REQ_ERROR type and the STATS fields after gen_tps.  REQ_DONE
 * (type 11) and REQ_ABORT_SEQ (15) came later without a bump: a new type changes no layout, and
 * only processes of one build exchange it.  Version 3 appended the device
 * sampling counters to STATS (cand_rows, cand_full, cand_tail); version 4
 * the logprobs-from-candidates counters (cand_lp_rows, cand_lp_full).
 *
 * Any change to a layout bumps RX_IPC_VERSION: processes of one radixd are
 * always the same build, so a version mismatch means a stale binary or a
 * stray sender, and the decoder refuses it naming both versions.
 *
 * Decoding never trusts a count: every length is checked against the bytes
 * left BEFORE anything is allocated, every enum and flag byte is checked,
 * strings must be valid UTF-8 (stop strings also non-empty and NUL-free),
 * and trailing bytes are refused.  A bad message gives RX_EFORMAT with one
 * line "ipc message: <what> ..." and never reads outside the buffer.
 *
 * Semantic checks of sampling parameters (ranges) are not the decoder's job:
 * the receiver calls rx_sampling_params_validate.
 *
 * Ownership: rx_ipc_decode fills a caller-owned struct rx_ipc_msg whose
 * arrays and strings it allocates; release them with rx_ipc_msg_free.
 * rx_ipc_encode only reads the message: to send a request you own, copy the
 * struct shallowly into msg.u.req and do NOT call rx_ipc_msg_free on that
 * message. */
#ifndef RX_IPC_MSG_H
#define RX_IPC_MSG_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "request.h"

#define RX_IPC_MAGIC      0x50495852u    /* "RXIP" as little-endian bytes */
#define RX_IPC_VERSION    4
#define RX_IPC_HEADER_LEN 12
/* Upper bound of one encoded message (a sanity limit, not a buffer size). */
#define RX_IPC_MAX_MSG    (256u << 20)

enum rx_ipc_type {
    RX_IPC_REQ_NEW           = 1,   /* main -> scheduler */
    RX_IPC_REQ_ABORT         = 2,   /* main -> scheduler */
    RX_IPC_TOKENS            = 3,   /* scheduler -> detokenizer, one per step */
    RX_IPC_TEXT              = 4,   /* detokenizer -> main */
    RX_IPC_FLUSH_CACHE       = 5,   /* main -> scheduler */
    RX_IPC_FLUSH_CACHE_REPLY = 6,   /* scheduler -> main */
    RX_IPC_GET_STATS         = 7,   /* main -> scheduler */
    RX_IPC_STATS             = 8,   /* scheduler -> main (reply or periodic, cookie 0) */
    RX_IPC_SHUTDOWN          = 9,   /* main -> scheduler; scheduler -> detokenizer */
    RX_IPC_REQ_ERROR         = 10,  /* scheduler -> main: a REQ_NEW was refused (since v2) */
    RX_IPC_REQ_DONE          = 11,  /* scheduler -> DP controller: requests finished (dp_size > 1) */
    RX_IPC_EPLB              = 12,  /* main -> scheduler: expert distribution record control */
    RX_IPC_EPLB_REPLY        = 13,  /* scheduler -> main */
    RX_IPC_EPLB_STATS        = 14,  /* scheduler -> main: placement balancedness (periodic) */
    RX_IPC_REQ_ABORT_SEQ     = 15   /* main -> scheduler: stop single siblings (n > 1) */
};
#define RX_IPC_TYPE_MAX 15

/* Why a request stopped.  STOP_STR is decided by the detokenizer (stop
 * strings can span token boundaries); the others by the scheduler. */
enum rx_finish {
    RX_FINISH_NONE     = 0,   /* still running */
    RX_FINISH_EOS      = 1,   /* the model's end-of-sequence token; matched = that id */
    RX_FINISH_STOP_ID  = 2,   /* one of stop_ids; matched = that id */
    RX_FINISH_STOP_STR = 3,   /* one of the stop strings; matched = its index */
    RX_FINISH_LENGTH   = 4,   /* max_tokens or the context length */
    RX_FINISH_ABORT    = 5    /* client disconnect, REQ_ABORT, shutdown */
};
#define RX_FINISH_MAX 5

enum rx_ipc_shutdown_mode {
    RX_IPC_SHUTDOWN_NOW   = 0,   /* abort everything, exit */
    RX_IPC_SHUTDOWN_DRAIN = 1    /* admit nothing new, finish running requests, exit */
};

/* Per-token log probabilities of one output chunk. */
struct rx_ipc_logprobs {
    uint32_t n;             /* tokens in the chunk */
    uint32_t n_top;         /* alternatives per token, 0..RX_MAX_TOP_LOGPROBS */
    int32_t *ids;           /* n chosen ids; TEXT only (in TOKENS they are entry.ids, this is NULL) */
    float   *logprob;       /* n: log p(chosen token) */
    int32_t *top_ids;       /* n * n_top, token-major; NULL when n_top = 0 */
    float   *top_logprob;   /* n * n_top */
};

/* Usage counts, cumulative for the request. */
struct rx_ipc_usage {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;      /* prompt tokens served from the radix cache */
    uint32_t completion_tokens;
};

/* One request's output of one scheduler step. */
struct rx_ipc_tok_out {
    uint64_t rid;
    uint32_t index;              /* sibling index, 0..n-1 (n > 1 requests); 0 otherwise */
    uint8_t  finish;             /* enum rx_finish */
    int32_t  matched;            /* see enum rx_finish; -1 when none */
    struct rx_ipc_usage usage;
    uint32_t n_ids;
    int32_t *ids;                /* the new token ids (may be 0 of them with a finish) */
    uint8_t  has_logprobs;
    struct rx_ipc_logprobs lp;   /* when has_logprobs: lp.n == n_ids, lp.ids NULL */
    /* The request's first output also tells the detokenizer how to render it,
     * so the detokenizer needs no channel from main. */
    uint8_t  first;
    uint8_t  skip_special_tokens;
    uint32_t n_stop;
    char    *stop[RX_MAX_STOP];
};

struct rx_ipc_tokens {
    uint64_t step;               /* the scheduler step that produced them */
    uint32_t n;
    struct rx_ipc_tok_out *out;
};

/* One request's text delta. */
struct rx_ipc_text_out {
    uint64_t rid;
    uint32_t index;              /* sibling index, as in TOKENS */
    uint8_t  finish;             /* enum rx_finish */
    int32_t  matched;
    struct rx_ipc_usage usage;
    uint32_t text_len;
    char    *text;               /* UTF-8, NUL-terminated (text_len excludes the NUL) */
    uint8_t  has_logprobs;
    struct rx_ipc_logprobs lp;   /* ids included */
};

struct rx_ipc_text {
    uint32_t n;
    struct rx_ipc_text_out *out;
};

/* REQ_ABORT's rids to abort, and REQ_DONE's rids that finished (every
 * sibling of each has finished: the DP controller's in-flight count of the
 * replica drops by one per rid). */
struct rx_ipc_abort {
    uint32_t n;
    uint64_t *rids;
};

/* REQ_ABORT_SEQ: single sequences to stop -- sibling `index` of request
 * `rid`, e.g. the one whose stop string the detokenizer found while its
 * siblings still run (core/server.c).  The other siblings go on. */
struct rx_ipc_seq_ref {
    uint64_t rid;
    uint32_t index;
};
struct rx_ipc_abort_seq {
    uint32_t n;
    struct rx_ipc_seq_ref *seqs;
};

struct rx_ipc_flush_reply {
    uint64_t cookie;
    int32_t  status;             /* RX_OK, or e.g. RX_EAGAIN "requests are running" */
    char    *message;            /* NUL-terminated, may be "" */
};

/* EPLB: a control of the expert-distribution recorder. */
struct rx_ipc_eplb {
    uint64_t cookie;
    uint8_t  op;                 /* RX_IPC_EPLB_OP_* (= enum rx_eplb_op of core/expert_record.h) */
};
enum { RX_IPC_EPLB_OP_START = 1, RX_IPC_EPLB_OP_STOP = 2, RX_IPC_EPLB_OP_DUMP = 3 };

/* EPLB_STATS: the current placement's balancedness over the recorded window. */
#define RX_IPC_EPLB_MAX_LAYERS 4096
struct rx_ipc_eplb_stats {
    uint32_t dp_rank;
    uint64_t rebalanced, skipped;
    uint32_t n;
    float   *balancedness;       /* [n] */
};

struct rx_ipc_stats {
    uint64_t cookie;             /* of the GET_STATS it answers; 0 = periodic */
    uint32_t dp_rank;
    uint32_t running;            /* requests in the running batch */
    uint32_t queued;             /* waiting requests */
    uint64_t kv_used;            /* KV slots (tokens) in use */
    uint64_t kv_total;
    uint64_t steps;              /* scheduler steps so far */
    uint64_t prompt_tokens;      /* totals since start */
    uint64_t gen_tokens;
    float    cache_hit_rate;     /* cached / prompt tokens, 0..1 */
    float    prompt_tps;         /* recent throughput, tokens/s */
    float    gen_tps;
    /* since v2 */
    uint64_t cached_tokens;      /* prompt tokens served from the radix cache, total */
    uint64_t cache_tokens;       /* tokens now held by the radix cache */
    uint64_t finished;           /* requests (siblings) finished, total */
    uint64_t retractions;        /* requests retracted, total */
    uint32_t max_running_requests;  /* the limit the scheduler enforces */
    uint32_t context_len;        /* the context length it enforces (prompt + output) */
    uint32_t n_vocab;
    float    new_token_ratio;    /* the admission estimate now */
    /* since v3: device sampling (struct rx_sched_stats), totals */
    uint64_t cand_rows, cand_full, cand_tail;
    uint64_t cand_lp_rows, cand_lp_full;   /* since v4 */
};

/* A REQ_NEW the scheduler refused (main answers the client with it):
 * RX_EAGAIN queue full or shutting down (HTTP 503), RX_EINVAL bad
 * parameters (400), RX_ERANGE prompt over the context or the KV pool (400
 * context_length_exceeded). */
struct rx_ipc_req_error {
    uint64_t rid;
    int32_t  status;             /* enum rx_status, always < 0 */
    char    *message;            /* NUL-terminated one line, may be "" */
};

struct rx_ipc_shutdown {
    uint8_t  mode;               /* enum rx_ipc_shutdown_mode */
    uint32_t deadline_ms;        /* DRAIN: abort what is left after this; 0 = none */
};

struct rx_ipc_msg {
    uint16_t type;               /* enum rx_ipc_type */
    union {
        struct rx_request         req;         /* REQ_NEW */
        struct rx_ipc_abort       abort;       /* REQ_ABORT */
        struct rx_ipc_tokens      tokens;      /* TOKENS */
        struct rx_ipc_text        text;        /* TEXT */
        uint64_t                  cookie;      /* FLUSH_CACHE, GET_STATS */
        struct rx_ipc_flush_reply flush_reply; /* FLUSH_CACHE_REPLY, EPLB_REPLY */
        struct rx_ipc_eplb        eplb;        /* EPLB */
        struct rx_ipc_eplb_stats  eplb_stats;  /* EPLB_STATS */
        struct rx_ipc_stats       stats;       /* STATS */
        struct rx_ipc_shutdown    shutdown;    /* SHUTDOWN */
        struct rx_ipc_req_error   req_error;   /* REQ_ERROR */
        struct rx_ipc_abort       done;        /* REQ_DONE (REQ_ABORT's shape) */
        struct rx_ipc_abort_seq   abort_seq;   /* REQ_ABORT_SEQ */
    } u;
};

/* "REQ_NEW", ...; "?" for an unknown type. */
const char *rx_ipc_type_name (int type);
const char *rx_finish_name (int finish);

/* Size of m encoded, or 0 with *err set (RX_EINVAL) when m cannot be
 * encoded (a count over its limit, a NULL array with a count, an empty stop
 * string, invalid UTF-8 text, an unknown type or enum). */
size_t rx_ipc_encoded_size (const struct rx_ipc_msg *m, struct rx_err *err);

/* Encode m into buf[0..cap); *len = bytes written.  RX_ERANGE if cap is
 * too small (see rx_ipc_encoded_size), RX_EINVAL as above. */
int rx_ipc_encode_into (const struct rx_ipc_msg *m, uint8_t *buf, size_t cap, size_t *len,
                        struct rx_err *err);

/* Encode m into a new malloc'ed buffer *buf_p (caller frees) of *len bytes. */
int rx_ipc_encode (const struct rx_ipc_msg *m, uint8_t **buf_p, size_t *len, struct rx_err *err);

/* Read just the header: RX_OK with *type and *payload_len, or RX_EFORMAT
 * (short, bad magic, other version, unknown type, length not matching n). */
int rx_ipc_peek (const void *buf, size_t n, uint16_t *type, uint32_t *payload_len,
                 struct rx_err *err);

/* Decode buf[0..n) into *m (overwritten; on error *m is left empty, nothing
 * leaks).  Free with rx_ipc_msg_free. */
int rx_ipc_decode (const void *buf, size_t n, struct rx_ipc_msg *m, struct rx_err *err);

/* Free what rx_ipc_decode allocated in *m and zero it; NULL-safe, idempotent. */
void rx_ipc_msg_free (struct rx_ipc_msg *m);

#endif
