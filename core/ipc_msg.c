/* core/ipc_msg.c -- encoder and bounds-checked decoder of radixd's IPC
 * messages (layout in ipc_msg.h).
 *
 * One writer serves both sizing and encoding: with buf == NULL it only
 * counts bytes, so rx_ipc_encoded_size and rx_ipc_encode_into cannot drift
 * apart.  The reader keeps a cursor and the bytes left; every primitive read
 * checks them, and every array read checks count * element size against
 * what is left before allocating, so a forged count cannot make us allocate
 * gigabytes or read past the end. */
#include <stdlib.h>
#include <string.h>

#include "ipc_msg.h"

#define S_FMT "ipc message: "

const char *rx_ipc_type_name (int type)
{
    switch (type) {
    case RX_IPC_REQ_NEW:           return "REQ_NEW";
    case RX_IPC_REQ_ABORT:         return "REQ_ABORT";
    case RX_IPC_TOKENS:            return "TOKENS";
    case RX_IPC_TEXT:              return "TEXT";
    case RX_IPC_FLUSH_CACHE:       return "FLUSH_CACHE";
    case RX_IPC_FLUSH_CACHE_REPLY: return "FLUSH_CACHE_REPLY";
    case RX_IPC_GET_STATS:         return "GET_STATS";
    case RX_IPC_STATS:             return "STATS";
    case RX_IPC_SHUTDOWN:          return "SHUTDOWN";
    case RX_IPC_REQ_ERROR:         return "REQ_ERROR";
    case RX_IPC_REQ_DONE:          return "REQ_DONE";
    case RX_IPC_EPLB:              return "EPLB";
    case RX_IPC_EPLB_REPLY:        return "EPLB_REPLY";
    case RX_IPC_EPLB_STATS:        return "EPLB_STATS";
    case RX_IPC_REQ_ABORT_SEQ:     return "REQ_ABORT_SEQ";
    default:                       return "?";
    }
}

const char *rx_finish_name (int finish)
{
    switch (finish) {
    case RX_FINISH_NONE:     return "none";
    case RX_FINISH_EOS:      return "eos";
    case RX_FINISH_STOP_ID:  return "stop_id";
    case RX_FINISH_STOP_STR: return "stop_str";
    case RX_FINISH_LENGTH:   return "length";
    case RX_FINISH_ABORT:    return "abort";
    default:                 return "?";
    }
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static int s_utf8_valid (const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0)      { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

/* ---------------------------------------------------------------- writer */

struct s_w {
    uint8_t *buf;     /* NULL: sizing pass */
    size_t   cap;
    size_t   pos;
};

static void s_put (struct s_w *w, const void *p, size_t n)
{
    if (w->buf && w->pos + n <= w->cap && n) memcpy (w->buf + w->pos, p, n);
    w->pos += n;
}
static void s_u8 (struct s_w *w, uint8_t v) { s_put (w, &v, 1); }
static void s_u16 (struct s_w *w, uint16_t v)
{
    uint8_t b[2] = { (uint8_t) v, (uint8_t) (v >> 8) };
    s_put (w, b, 2);
}
static void s_u32 (struct s_w *w, uint32_t v)
{
    uint8_t b[4] = { (uint8_t) v, (uint8_t) (v >> 8), (uint8_t) (v >> 16), (uint8_t) (v >> 24) };
    s_put (w, b, 4);
}
static void s_u64 (struct s_w *w, uint64_t v)
{
    s_u32 (w, (uint32_t) v);
    s_u32 (w, (uint32_t) (v >> 32));
}
static void s_i32 (struct s_w *w, int32_t v) { s_u32 (w, (uint32_t) v); }
static void s_f32 (struct s_w *w, float v)
{
    uint32_t u;
    memcpy (&u, &v, 4);
    s_u32 (w, u);
}
static void s_i32s (struct s_w *w, const int32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++) s_i32 (w, a[i]);
}
static void s_f32s (struct s_w *w, const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++) s_f32 (w, a[i]);
}
static void s_str (struct s_w *w, const char *s, size_t n)
{
    s_u32 (w, (uint32_t) n);
    s_put (w, s, n);
}

/* Encoder-side checks: refuse what the decoder would refuse, so every
 * message we send can be read back. */
static int s_check_stops (uint32_t n_stop, char *const *stop, const char *what, struct rx_err *err)
{
    if (n_stop > RX_MAX_STOP)
        return rx_err_set (err, RX_EINVAL, S_FMT "%s: %u stop strings (max %d)", what, n_stop,
                           RX_MAX_STOP);
    for (uint32_t i = 0; i < n_stop; i++) {
        if (!stop[i] || !stop[i][0])
            return rx_err_set (err, RX_EINVAL, S_FMT "%s: stop string %u is empty", what, i);
        size_t l = strlen (stop[i]);
        if (l > UINT32_MAX || !s_utf8_valid ((const uint8_t *) stop[i], l))
            return rx_err_set (err, RX_EINVAL, S_FMT "%s: stop string %u is not UTF-8", what, i);
    }
    return RX_OK;
}

static int s_check_lp (const struct rx_ipc_logprobs *lp, uint32_t n, int with_ids,
                       const char *what, struct rx_err *err)
{
    if (lp->n != n)
        return rx_err_set (err, RX_EINVAL, S_FMT "%s: logprobs for %u tokens, chunk has %u",
                           what, lp->n, n);
    if (lp->n_top > RX_MAX_TOP_LOGPROBS)
        return rx_err_set (err, RX_EINVAL, S_FMT "%s: %u top logprobs (max %d)", what, lp->n_top,
                           RX_MAX_TOP_LOGPROBS);
    if (n && (!lp->logprob || (with_ids && !lp->ids)
              || (lp->n_top && (!lp->top_ids || !lp->top_logprob))))
        return rx_err_set (err, RX_EINVAL, S_FMT "%s: logprob arrays missing", what);
    return RX_OK;
}

static void s_put_lp (struct s_w *w, const struct rx_ipc_logprobs *lp, int with_ids)
{
    if (with_ids) s_u32 (w, lp->n);
    s_u8 (w, (uint8_t) lp->n_top);
    if (with_ids) s_i32s (w, lp->ids, lp->n);
    s_f32s (w, lp->logprob, lp->n);
    s_i32s (w, lp->top_ids, (size_t) lp->n * lp->n_top);
    s_f32s (w, lp->top_logprob, (size_t) lp->n * lp->n_top);
}

static int s_write (struct s_w *w, const struct rx_ipc_msg *m, struct rx_err *err)
{
    int rc;
    s_u32 (w, RX_IPC_MAGIC);
    s_u16 (w, RX_IPC_VERSION);
    s_u16 (w, m->type);
    size_t len_at = w->pos;
    s_u32 (w, 0);                    /* payload length, patched below */
    switch (m->type) {
    case RX_IPC_REQ_NEW: {
        const struct rx_request *r = &m->u.req;
        const struct rx_sampling_params *p = &r->sp;
        if (r->kind < RX_REQ_COMPLETION || r->kind > RX_REQ_GENERATE)
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_NEW: unknown request kind %d", r->kind);
        if (r->n_input && !r->input_ids)
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_NEW: %u input ids but no array",
                               r->n_input);
        if (p->n_stop_ids > RX_MAX_STOP_IDS)
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_NEW: %u stop ids (max %d)",
                               p->n_stop_ids, RX_MAX_STOP_IDS);
        if ((rc = s_check_stops (p->n_stop, p->stop, "REQ_NEW", err)) < 0) return rc;
        if (r->stream > 1 || r->echo > 1 || p->logprobs > 1 || p->ignore_eos > 1
            || p->has_seed > 1 || p->skip_special_tokens > 1)
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_NEW: a flag is neither 0 nor 1");
        s_u64 (w, r->rid);
        s_i32 (w, r->kind);
        s_u8 (w, r->stream);
        s_u8 (w, r->echo);
        s_u32 (w, r->n_input);
        s_i32s (w, r->input_ids, r->n_input);
        s_f32 (w, p->temperature);
        s_f32 (w, p->top_p);
        s_i32 (w, p->top_k);
        s_f32 (w, p->min_p);
        s_f32 (w, p->frequency_penalty);
        s_f32 (w, p->presence_penalty);
        s_f32 (w, p->repetition_penalty);
        s_i32 (w, p->max_tokens);
        s_i32 (w, p->min_tokens);
        s_i32 (w, p->n);
        s_i32 (w, p->top_logprobs);
        s_u8 (w, p->logprobs);
        s_u8 (w, p->ignore_eos);
        s_u8 (w, p->has_seed);
        s_u8 (w, p->skip_special_tokens);
        s_u64 (w, p->seed);
        s_u8 (w, (uint8_t) p->n_stop);
        for (uint32_t i = 0; i < p->n_stop; i++) s_str (w, p->stop[i], strlen (p->stop[i]));
        s_u8 (w, (uint8_t) p->n_stop_ids);
        s_i32s (w, p->stop_ids, p->n_stop_ids);
        break;
    }
    case RX_IPC_REQ_ABORT:
    case RX_IPC_REQ_DONE: {
        /* One layout; u.done and u.abort are the same struct in the union. */
        const struct rx_ipc_abort *a = m->type == RX_IPC_REQ_DONE ? &m->u.done : &m->u.abort;
        if (a->n && !a->rids)
            return rx_err_set (err, RX_EINVAL, S_FMT "%s: %u rids but no array",
                               rx_ipc_type_name (m->type), a->n);
        s_u32 (w, a->n);
        for (uint32_t i = 0; i < a->n; i++) s_u64 (w, a->rids[i]);
        break;
    }
    case RX_IPC_REQ_ABORT_SEQ: {
        const struct rx_ipc_abort_seq *a = &m->u.abort_seq;
        if (a->n && !a->seqs)
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_ABORT_SEQ: %u sequences but no array", a->n);
        s_u32 (w, a->n);
        for (uint32_t i = 0; i < a->n; i++) {
            s_u64 (w, a->seqs[i].rid);
            s_u32 (w, a->seqs[i].index);
        }
        break;
    }
    case RX_IPC_TOKENS: {
        const struct rx_ipc_tokens *t = &m->u.tokens;
        if (t->n && !t->out)
            return rx_err_set (err, RX_EINVAL, S_FMT "TOKENS: %u entries but no array", t->n);
        s_u64 (w, t->step);
        s_u32 (w, t->n);
        for (uint32_t i = 0; i < t->n; i++) {
            const struct rx_ipc_tok_out *o = &t->out[i];
            if (o->finish > RX_FINISH_MAX)
                return rx_err_set (err, RX_EINVAL, S_FMT "TOKENS: unknown finish %u", o->finish);
            if (o->n_ids && !o->ids)
                return rx_err_set (err, RX_EINVAL, S_FMT "TOKENS: %u ids but no array", o->n_ids);
            if (o->has_logprobs && (rc = s_check_lp (&o->lp, o->n_ids, 0, "TOKENS", err)) < 0)
                return rc;
            if (o->first) {
                if ((rc = s_check_stops (o->n_stop, o->stop, "TOKENS", err)) < 0) return rc;
                if (o->skip_special_tokens > 1)
                    return rx_err_set (err, RX_EINVAL, S_FMT "TOKENS: skip_special_tokens > 1");
            }
            s_u64 (w, o->rid);
            s_u32 (w, o->index);
            s_u8 (w, (uint8_t) ((o->has_logprobs ? 1 : 0) | (o->first ? 2 : 0)));
            s_u8 (w, o->finish);
            s_i32 (w, o->matched);
            s_u32 (w, o->usage.prompt_tokens);
            s_u32 (w, o->usage.cached_tokens);
            s_u32 (w, o->usage.completion_tokens);
            s_u32 (w, o->n_ids);
            s_i32s (w, o->ids, o->n_ids);
            if (o->has_logprobs) s_put_lp (w, &o->lp, 0);
            if (o->first) {
                s_u8 (w, o->skip_special_tokens);
                s_u8 (w, (uint8_t) o->n_stop);
                for (uint32_t k = 0; k < o->n_stop; k++) s_str (w, o->stop[k], strlen (o->stop[k]));
            }
        }
        break;
    }
    case RX_IPC_TEXT: {
        const struct rx_ipc_text *t = &m->u.text;
        if (t->n && !t->out)
            return rx_err_set (err, RX_EINVAL, S_FMT "TEXT: %u entries but no array", t->n);
        s_u32 (w, t->n);
        for (uint32_t i = 0; i < t->n; i++) {
            const struct rx_ipc_text_out *o = &t->out[i];
            if (o->finish > RX_FINISH_MAX)
                return rx_err_set (err, RX_EINVAL, S_FMT "TEXT: unknown finish %u", o->finish);
            if (o->text_len && !o->text)
                return rx_err_set (err, RX_EINVAL, S_FMT "TEXT: %u bytes of text but no text",
                                   o->text_len);
            if (!s_utf8_valid ((const uint8_t *) o->text, o->text_len))
                return rx_err_set (err, RX_EINVAL, S_FMT "TEXT: rid %llu: text is not UTF-8",
                                   (unsigned long long) o->rid);
            if (o->has_logprobs && (rc = s_check_lp (&o->lp, o->lp.n, 1, "TEXT", err)) < 0)
                return rc;
            s_u64 (w, o->rid);
            s_u32 (w, o->index);
            s_u8 (w, o->has_logprobs ? 1 : 0);
            s_u8 (w, o->finish);
            s_i32 (w, o->matched);
            s_u32 (w, o->usage.prompt_tokens);
            s_u32 (w, o->usage.cached_tokens);
            s_u32 (w, o->usage.completion_tokens);
            s_str (w, o->text, o->text_len);
            if (o->has_logprobs) s_put_lp (w, &o->lp, 1);
        }
        break;
    }
    case RX_IPC_FLUSH_CACHE:
    case RX_IPC_GET_STATS:
        s_u64 (w, m->u.cookie);
        break;
    case RX_IPC_EPLB:
        if (m->u.eplb.op < 1 || m->u.eplb.op > 3)
            return rx_err_set (err, RX_EINVAL, S_FMT "EPLB: unknown op %u", m->u.eplb.op);
        s_u64 (w, m->u.eplb.cookie);
        s_u8 (w, m->u.eplb.op);
        break;
    case RX_IPC_EPLB_STATS:
        if (m->u.eplb_stats.n > RX_IPC_EPLB_MAX_LAYERS || (m->u.eplb_stats.n && !m->u.eplb_stats.balancedness))
            return rx_err_set (err, RX_EINVAL, S_FMT "EPLB_STATS: %u layers", m->u.eplb_stats.n);
        s_u32 (w, m->u.eplb_stats.dp_rank);
        s_u64 (w, m->u.eplb_stats.rebalanced);
        s_u64 (w, m->u.eplb_stats.skipped);
        s_u32 (w, m->u.eplb_stats.n);
        s_f32s (w, m->u.eplb_stats.balancedness, m->u.eplb_stats.n);
        break;
    case RX_IPC_EPLB_REPLY:
    case RX_IPC_FLUSH_CACHE_REPLY: {
        const char *msg = m->u.flush_reply.message ? m->u.flush_reply.message : "";
        size_t l = strlen (msg);
        if (!s_utf8_valid ((const uint8_t *) msg, l))
            return rx_err_set (err, RX_EINVAL, S_FMT "FLUSH_CACHE_REPLY: message is not UTF-8");
        s_u64 (w, m->u.flush_reply.cookie);
        s_i32 (w, m->u.flush_reply.status);
        s_str (w, msg, l);
        break;
    }
    case RX_IPC_STATS: {
        const struct rx_ipc_stats *s = &m->u.stats;
        s_u64 (w, s->cookie);
        s_u32 (w, s->dp_rank);
        s_u32 (w, s->running);
        s_u32 (w, s->queued);
        s_u64 (w, s->kv_used);
        s_u64 (w, s->kv_total);
        s_u64 (w, s->steps);
        s_u64 (w, s->prompt_tokens);
        s_u64 (w, s->gen_tokens);
        s_f32 (w, s->cache_hit_rate);
        s_f32 (w, s->prompt_tps);
        s_f32 (w, s->gen_tps);
        s_u64 (w, s->cached_tokens);
        s_u64 (w, s->cache_tokens);
        s_u64 (w, s->finished);
        s_u64 (w, s->retractions);
        s_u32 (w, s->max_running_requests);
        s_u32 (w, s->context_len);
        s_u32 (w, s->n_vocab);
        s_f32 (w, s->new_token_ratio);
        s_u64 (w, s->cand_rows);
        s_u64 (w, s->cand_full);
        s_u64 (w, s->cand_tail);
        s_u64 (w, s->cand_lp_rows);
        s_u64 (w, s->cand_lp_full);
        break;
    }
    case RX_IPC_SHUTDOWN:
        if (m->u.shutdown.mode > RX_IPC_SHUTDOWN_DRAIN)
            return rx_err_set (err, RX_EINVAL, S_FMT "SHUTDOWN: unknown mode %u",
                               m->u.shutdown.mode);
        s_u8 (w, m->u.shutdown.mode);
        s_u32 (w, m->u.shutdown.deadline_ms);
        break;
    case RX_IPC_REQ_ERROR: {
        const char *msg = m->u.req_error.message ? m->u.req_error.message : "";
        size_t l = strlen (msg);
        if (m->u.req_error.status >= 0)
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_ERROR: status %d is not an error",
                               m->u.req_error.status);
        if (!s_utf8_valid ((const uint8_t *) msg, l))
            return rx_err_set (err, RX_EINVAL, S_FMT "REQ_ERROR: message is not UTF-8");
        s_u64 (w, m->u.req_error.rid);
        s_i32 (w, m->u.req_error.status);
        s_str (w, msg, l);
        break;
    }
    default:
        return rx_err_set (err, RX_EINVAL, S_FMT "cannot encode unknown type %u", m->type);
    }
    if (w->pos > RX_IPC_MAX_MSG)
        return rx_err_set (err, RX_EINVAL, S_FMT "%s: %zu bytes, over the %u-byte limit",
                           rx_ipc_type_name (m->type), w->pos, RX_IPC_MAX_MSG);
    if (w->buf && w->pos <= w->cap) {
        uint32_t pl = (uint32_t) (w->pos - RX_IPC_HEADER_LEN);
        struct s_w patch = { w->buf, w->cap, len_at };
        s_u32 (&patch, pl);
    }
    return RX_OK;
}

size_t rx_ipc_encoded_size (const struct rx_ipc_msg *m, struct rx_err *err)
{
    struct s_w w = { NULL, 0, 0 };
    if (s_write (&w, m, err) < 0) return 0;
    return w.pos;
}

int rx_ipc_encode_into (const struct rx_ipc_msg *m, uint8_t *buf, size_t cap, size_t *len,
                        struct rx_err *err)
{
    size_t need = rx_ipc_encoded_size (m, err);
    if (!need) return err ? err->code : RX_EINVAL;
    if (need > cap)
        return rx_err_set (err, RX_ERANGE, S_FMT "%s needs %zu bytes, buffer has %zu",
                           rx_ipc_type_name (m->type), need, cap);
    struct s_w w = { buf, cap, 0 };
    int rc = s_write (&w, m, err);
    if (rc < 0) return rc;
    if (len) *len = w.pos;
    return RX_OK;
}

int rx_ipc_encode (const struct rx_ipc_msg *m, uint8_t **buf_p, size_t *len, struct rx_err *err)
{
    *buf_p = NULL;
    size_t need = rx_ipc_encoded_size (m, err);
    if (!need) return err ? err->code : RX_EINVAL;
    uint8_t *buf = malloc (need);
    if (!buf)
        return rx_err_set (err, RX_ENOMEM, S_FMT "out of memory for %zu bytes", need);
    int rc = rx_ipc_encode_into (m, buf, need, len, err);
    if (rc < 0) {
        free (buf);
        return rc;
    }
    *buf_p = buf;
    return RX_OK;
}

/* ---------------------------------------------------------------- reader */

struct s_r {
    const uint8_t *p;
    size_t left;
    const char *what;        /* the message type, for error lines */
    struct rx_err *err;
};

static int s_short (struct s_r *r, const char *field, size_t need)
{
    return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: truncated at %s (need %zu bytes, %zu left)",
                       r->what, field, need, r->left);
}

static int s_get (struct s_r *r, void *dst, size_t n, const char *field)
{
    if (r->left < n) return s_short (r, field, n);
    memcpy (dst, r->p, n);
    r->p += n;
    r->left -= n;
    return RX_OK;
}

static int s_gu8 (struct s_r *r, uint8_t *v, const char *f) { return s_get (r, v, 1, f); }
static int s_gu32 (struct s_r *r, uint32_t *v, const char *f)
{
    uint8_t b[4] = { 0 };
    int rc = s_get (r, b, 4, f);
    if (rc < 0) return rc;
    *v = (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 | (uint32_t) b[3] << 24;
    return RX_OK;
}
static int s_gu64 (struct s_r *r, uint64_t *v, const char *f)
{
    uint32_t lo, hi;
    int rc = s_gu32 (r, &lo, f);
    if (rc < 0 || (rc = s_gu32 (r, &hi, f)) < 0) return rc;
    *v = (uint64_t) hi << 32 | lo;
    return RX_OK;
}
static int s_gi32 (struct s_r *r, int32_t *v, const char *f)
{
    uint32_t u;
    int rc = s_gu32 (r, &u, f);
    if (rc == RX_OK) *v = (int32_t) u;
    return rc;
}
static int s_gf32 (struct s_r *r, float *v, const char *f)
{
    uint32_t u;
    int rc = s_gu32 (r, &u, f);
    if (rc == RX_OK) memcpy (v, &u, 4);
    return rc;
}
static int s_gbool (struct s_r *r, uint8_t *v, const char *f)
{
    int rc = s_gu8 (r, v, f);
    if (rc == RX_OK && *v > 1)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %s is %u, not 0 or 1", r->what, f, *v);
    return rc;
}

/* Refuse a count whose elements (esize bytes each on the wire) cannot fit
 * in what is left -- called before any allocation sized by that count. */
static int s_fits (struct s_r *r, size_t count, size_t esize, const char *field)
{
    if (count > r->left / esize)
        return rx_err_set (r->err, RX_EFORMAT,
                           S_FMT "%s: %s claims %zu elements of %zu bytes, only %zu bytes left",
                           r->what, field, count, esize, r->left);
    return RX_OK;
}

/* count elements of msize bytes in memory, each at least esize on the wire. */
static int s_alloc (struct s_r *r, size_t count, size_t esize, size_t msize, void **out,
                    const char *field)
{
    *out = NULL;
    if (count == 0) return RX_OK;
    int rc = s_fits (r, count, esize, field);
    if (rc < 0) return rc;
    *out = calloc (count, msize);
    if (!*out)
        return rx_err_set (r->err, RX_ENOMEM, S_FMT "%s: out of memory for %s", r->what, field);
    return RX_OK;
}

static int s_gi32s (struct s_r *r, size_t n, int32_t **out, const char *f)
{
    int rc = s_alloc (r, n, 4, 4, (void **) out, f);
    for (size_t i = 0; rc == RX_OK && i < n; i++) rc = s_gi32 (r, &(*out)[i], f);
    return rc;
}
static int s_gf32s (struct s_r *r, size_t n, float **out, const char *f)
{
    int rc = s_alloc (r, n, 4, 4, (void **) out, f);
    for (size_t i = 0; rc == RX_OK && i < n; i++) rc = s_gf32 (r, &(*out)[i], f);
    return rc;
}

/* String kinds: TEXT deltas carry their length and may hold NUL bytes; C
 * strings (a reply message) may not; stop strings may not be empty either. */
enum { S_STR_BYTES = 0, S_STR_C = 1, S_STR_STOP = 2 };

/* A length-prefixed string into a new NUL-terminated buffer. */
static int s_gstr (struct s_r *r, char **out, uint32_t *len_out, int kind, const char *f)
{
    uint32_t n;
    int rc = s_gu32 (r, &n, f);
    if (rc < 0) return rc;
    if (n > r->left)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %s claims %u bytes, only %zu left",
                           r->what, f, n, r->left);
    if (kind == S_STR_STOP && n == 0)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %s is empty", r->what, f);
    if (kind != S_STR_BYTES && memchr (r->p, 0, n))
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %s contains NUL", r->what, f);
    if (!s_utf8_valid (r->p, n))
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %s is not valid UTF-8", r->what, f);
    char *s = malloc ((size_t) n + 1);
    if (!s) return rx_err_set (r->err, RX_ENOMEM, S_FMT "%s: out of memory for %s", r->what, f);
    memcpy (s, r->p, n);
    s[n] = '\0';
    r->p += n;
    r->left -= n;
    *out = s;
    if (len_out) *len_out = n;
    return RX_OK;
}

static int s_gstops (struct s_r *r, uint32_t *n_stop, char **stop)
{
    uint8_t n;
    int rc = s_gu8 (r, &n, "n_stop");
    if (rc < 0) return rc;
    if (n > RX_MAX_STOP)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %u stop strings (max %d)", r->what, n,
                           RX_MAX_STOP);
    for (uint32_t i = 0; i < n; i++) {
        if ((rc = s_gstr (r, &stop[i], NULL, S_STR_STOP, "stop string")) < 0) return rc;
        *n_stop = i + 1;      /* so the free function sees what was allocated */
    }
    return RX_OK;
}

static int s_glp (struct s_r *r, struct rx_ipc_logprobs *lp, uint32_t n, int with_ids)
{
    int rc;
    uint8_t n_top;
    if (with_ids && (rc = s_gu32 (r, &n, "logprobs count")) < 0) return rc;
    if ((rc = s_gu8 (r, &n_top, "n_top")) < 0) return rc;
    if (n_top > RX_MAX_TOP_LOGPROBS)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: %u top logprobs (max %d)", r->what,
                           n_top, RX_MAX_TOP_LOGPROBS);
    lp->n = n;
    lp->n_top = n_top;
    size_t nt = (size_t) n * n_top;
    /* Check the whole block against what is left before the first alloc. */
    size_t need = (size_t) n * 4 * (with_ids ? 2 : 1) + nt * 8;
    if (need > r->left)
        return rx_err_set (r->err, RX_EFORMAT,
                           S_FMT "%s: logprobs of %u tokens x %u need %zu bytes, only %zu left",
                           r->what, n, n_top, need, r->left);
    if (with_ids && (rc = s_gi32s (r, n, &lp->ids, "logprob ids")) < 0) return rc;
    if ((rc = s_gf32s (r, n, &lp->logprob, "logprobs")) < 0) return rc;
    if ((rc = s_gi32s (r, nt, &lp->top_ids, "top ids")) < 0) return rc;
    return s_gf32s (r, nt, &lp->top_logprob, "top logprobs");
}

static int s_gfinish (struct s_r *r, uint8_t *finish, int32_t *matched)
{
    int rc = s_gu8 (r, finish, "finish");
    if (rc < 0) return rc;
    if (*finish > RX_FINISH_MAX)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "%s: unknown finish reason %u", r->what,
                           *finish);
    return s_gi32 (r, matched, "matched");
}

static int s_gusage (struct s_r *r, struct rx_ipc_usage *u)
{
    int rc;
    if ((rc = s_gu32 (r, &u->prompt_tokens, "prompt_tokens")) < 0) return rc;
    if ((rc = s_gu32 (r, &u->cached_tokens, "cached_tokens")) < 0) return rc;
    return s_gu32 (r, &u->completion_tokens, "completion_tokens");
}

static int s_read_req (struct s_r *r, struct rx_request *q)
{
    struct rx_sampling_params *p = &q->sp;
    uint8_t n8;
    int rc;
    if ((rc = s_gu64 (r, &q->rid, "rid")) < 0) return rc;
    if ((rc = s_gi32 (r, &q->kind, "kind")) < 0) return rc;
    if (q->kind < RX_REQ_COMPLETION || q->kind > RX_REQ_GENERATE)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "REQ_NEW: unknown request kind %d", q->kind);
    if ((rc = s_gbool (r, &q->stream, "stream")) < 0) return rc;
    if ((rc = s_gbool (r, &q->echo, "echo")) < 0) return rc;
    if ((rc = s_gu32 (r, &q->n_input, "n_input")) < 0) return rc;
    if ((rc = s_gi32s (r, q->n_input, &q->input_ids, "input ids")) < 0) return rc;
    if ((rc = s_gf32 (r, &p->temperature, "temperature")) < 0) return rc;
    if ((rc = s_gf32 (r, &p->top_p, "top_p")) < 0) return rc;
    if ((rc = s_gi32 (r, &p->top_k, "top_k")) < 0) return rc;
    if ((rc = s_gf32 (r, &p->min_p, "min_p")) < 0) return rc;
    if ((rc = s_gf32 (r, &p->frequency_penalty, "frequency_penalty")) < 0) return rc;
    if ((rc = s_gf32 (r, &p->presence_penalty, "presence_penalty")) < 0) return rc;
    if ((rc = s_gf32 (r, &p->repetition_penalty, "repetition_penalty")) < 0) return rc;
    if ((rc = s_gi32 (r, &p->max_tokens, "max_tokens")) < 0) return rc;
    if ((rc = s_gi32 (r, &p->min_tokens, "min_tokens")) < 0) return rc;
    if ((rc = s_gi32 (r, &p->n, "n")) < 0) return rc;
    if ((rc = s_gi32 (r, &p->top_logprobs, "top_logprobs")) < 0) return rc;
    if ((rc = s_gbool (r, &p->logprobs, "logprobs")) < 0) return rc;
    if ((rc = s_gbool (r, &p->ignore_eos, "ignore_eos")) < 0) return rc;
    if ((rc = s_gbool (r, &p->has_seed, "has_seed")) < 0) return rc;
    if ((rc = s_gbool (r, &p->skip_special_tokens, "skip_special_tokens")) < 0) return rc;
    if ((rc = s_gu64 (r, &p->seed, "seed")) < 0) return rc;
    if ((rc = s_gstops (r, &p->n_stop, p->stop)) < 0) return rc;
    if ((rc = s_gu8 (r, &n8, "n_stop_ids")) < 0) return rc;
    if (n8 > RX_MAX_STOP_IDS)
        return rx_err_set (r->err, RX_EFORMAT, S_FMT "REQ_NEW: %u stop ids (max %d)", n8,
                           RX_MAX_STOP_IDS);
    p->n_stop_ids = n8;
    for (uint32_t i = 0; i < n8; i++)
        if ((rc = s_gi32 (r, &p->stop_ids[i], "stop id")) < 0) return rc;
    return RX_OK;
}

static int s_read_tokens (struct s_r *r, struct rx_ipc_tokens *t)
{
    int rc;
    if ((rc = s_gu64 (r, &t->step, "step")) < 0) return rc;
    uint32_t n;
    if ((rc = s_gu32 (r, &n, "entry count")) < 0) return rc;
    /* smallest entry: rid 8 + index 4 + flags 1 + finish 1 + matched 4 + usage 12 + n_ids 4 */
    if ((rc = s_alloc (r, n, 34, sizeof *t->out, (void **) &t->out, "entries")) < 0) return rc;
    for (uint32_t i = 0; i < n; i++) {
        struct rx_ipc_tok_out *o = &t->out[i];
        uint8_t flags;
        t->n = i + 1;
        if ((rc = s_gu64 (r, &o->rid, "rid")) < 0) return rc;
        if ((rc = s_gu32 (r, &o->index, "index")) < 0) return rc;
        if ((rc = s_gu8 (r, &flags, "flags")) < 0) return rc;
        if (flags & ~3u)
            return rx_err_set (r->err, RX_EFORMAT, S_FMT "TOKENS: unknown flags 0x%02x", flags);
        o->has_logprobs = flags & 1;
        o->first = (flags >> 1) & 1;
        if ((rc = s_gfinish (r, &o->finish, &o->matched)) < 0) return rc;
        if ((rc = s_gusage (r, &o->usage)) < 0) return rc;
        if ((rc = s_gu32 (r, &o->n_ids, "n_ids")) < 0) return rc;
        if ((rc = s_gi32s (r, o->n_ids, &o->ids, "ids")) < 0) return rc;
        if (o->has_logprobs && (rc = s_glp (r, &o->lp, o->n_ids, 0)) < 0) return rc;
        if (o->first) {
            if ((rc = s_gbool (r, &o->skip_special_tokens, "skip_special_tokens")) < 0) return rc;
            if ((rc = s_gstops (r, &o->n_stop, o->stop)) < 0) return rc;
        }
    }
    return RX_OK;
}

static int s_read_text (struct s_r *r, struct rx_ipc_text *t)
{
    int rc;
    uint32_t n;
    if ((rc = s_gu32 (r, &n, "entry count")) < 0) return rc;
    /* smallest entry: rid 8 + index 4 + flags 1 + finish 1 + matched 4 + usage 12 + text len 4 */
    if ((rc = s_alloc (r, n, 34, sizeof *t->out, (void **) &t->out, "entries")) < 0) return rc;
    for (uint32_t i = 0; i < n; i++) {
        struct rx_ipc_text_out *o = &t->out[i];
        uint8_t flags;
        t->n = i + 1;
        if ((rc = s_gu64 (r, &o->rid, "rid")) < 0) return rc;
        if ((rc = s_gu32 (r, &o->index, "index")) < 0) return rc;
        if ((rc = s_gu8 (r, &flags, "flags")) < 0) return rc;
        if (flags & ~1u)
            return rx_err_set (r->err, RX_EFORMAT, S_FMT "TEXT: unknown flags 0x%02x", flags);
        o->has_logprobs = flags & 1;
        if ((rc = s_gfinish (r, &o->finish, &o->matched)) < 0) return rc;
        if ((rc = s_gusage (r, &o->usage)) < 0) return rc;
        if ((rc = s_gstr (r, &o->text, &o->text_len, S_STR_BYTES, "text")) < 0) return rc;
        if (o->has_logprobs && (rc = s_glp (r, &o->lp, 0, 1)) < 0) return rc;
    }
    return RX_OK;
}

int rx_ipc_peek (const void *buf, size_t n, uint16_t *type, uint32_t *payload_len,
                 struct rx_err *err)
{
    const uint8_t *b = buf;
    if (!buf || n < RX_IPC_HEADER_LEN)
        return rx_err_set (err, RX_EFORMAT, S_FMT "%zu bytes, shorter than the %d-byte header", n,
                           RX_IPC_HEADER_LEN);
    uint32_t magic = (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16
                     | (uint32_t) b[3] << 24;
    uint16_t ver = (uint16_t) (b[4] | b[5] << 8);
    uint16_t ty = (uint16_t) (b[6] | b[7] << 8);
    uint32_t pl = (uint32_t) b[8] | (uint32_t) b[9] << 8 | (uint32_t) b[10] << 16
                  | (uint32_t) b[11] << 24;
    if (magic != RX_IPC_MAGIC)
        return rx_err_set (err, RX_EFORMAT, S_FMT "bad magic 0x%08x (not a radix IPC message)",
                           magic);
    if (ver != RX_IPC_VERSION)
        return rx_err_set (err, RX_EFORMAT,
                           S_FMT "format version %u, this build speaks version %u "
                           "(processes from different radix builds?)", ver, RX_IPC_VERSION);
    if (ty < 1 || ty > RX_IPC_TYPE_MAX)
        return rx_err_set (err, RX_EFORMAT, S_FMT "unknown message type %u", ty);
    if ((size_t) pl != n - RX_IPC_HEADER_LEN)
        return rx_err_set (err, RX_EFORMAT, S_FMT "%s: header says %u payload bytes, got %zu",
                           rx_ipc_type_name (ty), pl, n - RX_IPC_HEADER_LEN);
    if (type) *type = ty;
    if (payload_len) *payload_len = pl;
    return RX_OK;
}

int rx_ipc_decode (const void *buf, size_t n, struct rx_ipc_msg *m, struct rx_err *err)
{
    memset (m, 0, sizeof *m);
    uint16_t ty;
    int rc = rx_ipc_peek (buf, n, &ty, NULL, err);
    if (rc < 0) return rc;
    struct s_r r = { (const uint8_t *) buf + RX_IPC_HEADER_LEN, n - RX_IPC_HEADER_LEN,
                     rx_ipc_type_name (ty), err };
    m->type = ty;
    switch (ty) {
    case RX_IPC_REQ_NEW:
        rc = s_read_req (&r, &m->u.req);
        break;
    case RX_IPC_REQ_ABORT:
    case RX_IPC_REQ_DONE: {
        struct rx_ipc_abort *a = ty == RX_IPC_REQ_DONE ? &m->u.done : &m->u.abort;
        uint32_t c;
        if ((rc = s_gu32 (&r, &c, "rid count")) < 0) break;
        if ((rc = s_alloc (&r, c, 8, 8, (void **) &a->rids, "rids")) < 0) break;
        a->n = c;
        for (uint32_t i = 0; rc == RX_OK && i < c; i++) rc = s_gu64 (&r, &a->rids[i], "rid");
        break;
    }
    case RX_IPC_REQ_ABORT_SEQ: {
        struct rx_ipc_abort_seq *a = &m->u.abort_seq;
        uint32_t c;
        if ((rc = s_gu32 (&r, &c, "sequence count")) < 0) break;
        if ((rc = s_alloc (&r, c, 12, sizeof *a->seqs, (void **) &a->seqs, "sequences")) < 0) break;
        a->n = c;
        for (uint32_t i = 0; rc == RX_OK && i < c; i++)
            if ((rc = s_gu64 (&r, &a->seqs[i].rid, "rid")) == RX_OK)
                rc = s_gu32 (&r, &a->seqs[i].index, "sibling index");
        break;
    }
    case RX_IPC_TOKENS:
        rc = s_read_tokens (&r, &m->u.tokens);
        break;
    case RX_IPC_TEXT:
        rc = s_read_text (&r, &m->u.text);
        break;
    case RX_IPC_FLUSH_CACHE:
    case RX_IPC_GET_STATS:
        rc = s_gu64 (&r, &m->u.cookie, "cookie");
        break;
    case RX_IPC_EPLB:
        if ((rc = s_gu64 (&r, &m->u.eplb.cookie, "cookie")) < 0) break;
        if ((rc = s_gu8 (&r, &m->u.eplb.op, "op")) < 0) break;
        if (m->u.eplb.op < 1 || m->u.eplb.op > 3)
            rc = rx_err_set (err, RX_EFORMAT, S_FMT "EPLB: unknown op %u", m->u.eplb.op);
        break;
    case RX_IPC_EPLB_STATS: {
        struct rx_ipc_eplb_stats *e = &m->u.eplb_stats;
        if ((rc = s_gu32 (&r, &e->dp_rank, "dp_rank")) < 0 || (rc = s_gu64 (&r, &e->rebalanced, "rebalanced")) < 0
            || (rc = s_gu64 (&r, &e->skipped, "skipped")) < 0 || (rc = s_gu32 (&r, &e->n, "n")) < 0)
            break;
        if (e->n > RX_IPC_EPLB_MAX_LAYERS) {
            rc = rx_err_set (err, RX_EFORMAT, S_FMT "EPLB_STATS: %u layers (at most %d)", e->n, RX_IPC_EPLB_MAX_LAYERS);
            break;
        }
        rc = s_gf32s (&r, e->n, &e->balancedness, "balancedness");
        break;
    }
    case RX_IPC_EPLB_REPLY:
    case RX_IPC_FLUSH_CACHE_REPLY:
        if ((rc = s_gu64 (&r, &m->u.flush_reply.cookie, "cookie")) < 0) break;
        if ((rc = s_gi32 (&r, &m->u.flush_reply.status, "status")) < 0) break;
        rc = s_gstr (&r, &m->u.flush_reply.message, NULL, S_STR_C, "message");
        break;
    case RX_IPC_STATS: {
        struct rx_ipc_stats *s = &m->u.stats;
        if ((rc = s_gu64 (&r, &s->cookie, "cookie")) < 0
            || (rc = s_gu32 (&r, &s->dp_rank, "dp_rank")) < 0
            || (rc = s_gu32 (&r, &s->running, "running")) < 0
            || (rc = s_gu32 (&r, &s->queued, "queued")) < 0
            || (rc = s_gu64 (&r, &s->kv_used, "kv_used")) < 0
            || (rc = s_gu64 (&r, &s->kv_total, "kv_total")) < 0
            || (rc = s_gu64 (&r, &s->steps, "steps")) < 0
            || (rc = s_gu64 (&r, &s->prompt_tokens, "prompt_tokens")) < 0
            || (rc = s_gu64 (&r, &s->gen_tokens, "gen_tokens")) < 0
            || (rc = s_gf32 (&r, &s->cache_hit_rate, "cache_hit_rate")) < 0
            || (rc = s_gf32 (&r, &s->prompt_tps, "prompt_tps")) < 0
            || (rc = s_gf32 (&r, &s->gen_tps, "gen_tps")) < 0
            || (rc = s_gu64 (&r, &s->cached_tokens, "cached_tokens")) < 0
            || (rc = s_gu64 (&r, &s->cache_tokens, "cache_tokens")) < 0
            || (rc = s_gu64 (&r, &s->finished, "finished")) < 0
            || (rc = s_gu64 (&r, &s->retractions, "retractions")) < 0
            || (rc = s_gu32 (&r, &s->max_running_requests, "max_running_requests")) < 0
            || (rc = s_gu32 (&r, &s->context_len, "context_len")) < 0
            || (rc = s_gu32 (&r, &s->n_vocab, "n_vocab")) < 0
            || (rc = s_gf32 (&r, &s->new_token_ratio, "new_token_ratio")) < 0
            || (rc = s_gu64 (&r, &s->cand_rows, "cand_rows")) < 0
            || (rc = s_gu64 (&r, &s->cand_full, "cand_full")) < 0
            || (rc = s_gu64 (&r, &s->cand_tail, "cand_tail")) < 0
            || (rc = s_gu64 (&r, &s->cand_lp_rows, "cand_lp_rows")) < 0)
            break;
        rc = s_gu64 (&r, &s->cand_lp_full, "cand_lp_full");
        break;
    }
    case RX_IPC_SHUTDOWN:
        if ((rc = s_gu8 (&r, &m->u.shutdown.mode, "mode")) < 0) break;
        if (m->u.shutdown.mode > RX_IPC_SHUTDOWN_DRAIN) {
            rc = rx_err_set (err, RX_EFORMAT, S_FMT "SHUTDOWN: unknown mode %u",
                             m->u.shutdown.mode);
            break;
        }
        rc = s_gu32 (&r, &m->u.shutdown.deadline_ms, "deadline_ms");
        break;
    case RX_IPC_REQ_ERROR:
        if ((rc = s_gu64 (&r, &m->u.req_error.rid, "rid")) < 0) break;
        if ((rc = s_gi32 (&r, &m->u.req_error.status, "status")) < 0) break;
        if (m->u.req_error.status >= 0) {
            rc = rx_err_set (err, RX_EFORMAT, S_FMT "REQ_ERROR: status %d is not an error",
                             m->u.req_error.status);
            break;
        }
        rc = s_gstr (&r, &m->u.req_error.message, NULL, S_STR_C, "message");
        break;
    default:
        rc = rx_err_set (err, RX_EINTERNAL, S_FMT "type %u passed peek", ty);
    }
    if (rc == RX_OK && r.left)
        rc = rx_err_set (err, RX_EFORMAT, S_FMT "%s: %zu trailing bytes after the payload",
                         r.what, r.left);
    if (rc < 0) rx_ipc_msg_free (m);
    return rc;
}

static void s_lp_free (struct rx_ipc_logprobs *lp)
{
    free (lp->ids);
    free (lp->logprob);
    free (lp->top_ids);
    free (lp->top_logprob);
}

void rx_ipc_msg_free (struct rx_ipc_msg *m)
{
    if (!m) return;
    switch (m->type) {
    case RX_IPC_REQ_NEW:
        /* Not rx_request_free: that may also free the struct itself, and the
         * request here lives inside the message. */
        free (m->u.req.input_ids);
        for (uint32_t i = 0; i < m->u.req.sp.n_stop && i < RX_MAX_STOP; i++)
            free (m->u.req.sp.stop[i]);
        break;
    case RX_IPC_REQ_ABORT:
        free (m->u.abort.rids);
        break;
    case RX_IPC_REQ_DONE:
        free (m->u.done.rids);
        break;
    case RX_IPC_REQ_ABORT_SEQ:
        free (m->u.abort_seq.seqs);
        break;
    case RX_IPC_TOKENS:
        for (uint32_t i = 0; m->u.tokens.out && i < m->u.tokens.n; i++) {
            struct rx_ipc_tok_out *o = &m->u.tokens.out[i];
            free (o->ids);
            s_lp_free (&o->lp);
            for (uint32_t k = 0; k < o->n_stop && k < RX_MAX_STOP; k++) free (o->stop[k]);
        }
        free (m->u.tokens.out);
        break;
    case RX_IPC_TEXT:
        for (uint32_t i = 0; m->u.text.out && i < m->u.text.n; i++) {
            free (m->u.text.out[i].text);
            s_lp_free (&m->u.text.out[i].lp);
        }
        free (m->u.text.out);
        break;
    case RX_IPC_FLUSH_CACHE_REPLY:
    case RX_IPC_EPLB_REPLY:
        free (m->u.flush_reply.message);
        break;
    case RX_IPC_EPLB_STATS:
        free (m->u.eplb_stats.balancedness);
        break;
    case RX_IPC_REQ_ERROR:
        free (m->u.req_error.message);
        break;
    default:
        break;
    }
    memset (m, 0, sizeof *m);
}
