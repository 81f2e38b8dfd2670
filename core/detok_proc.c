/* core/detok_proc.c -- the detokenizer process: TOKENS in, TEXT out (the
 * rules are in sched_proc.h).
 *
 * One rx_detok state per live (rid, sibling index), in a chained hash
 * table.  Each TOKENS message becomes at most one TEXT message: the deltas
 * of all its entries are appended to one growing byte buffer and the
 * entries point into it once the buffer stops moving; logprob arrays point
 * into the decoded TOKENS message, which lives until the TEXT is sent. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "detok.h"
#include "detok_proc.h"
#include "engine.h"
#include "grow.h"
#include "ipc.h"
#include "ipc_msg.h"
#include "log.h"
#include "sched_proc.h"
#include "tokenizer.h"

#define S_RECV_WAIT_MS 1000   /* wake up now and then even when nothing comes */

struct s_state {
    uint64_t rid;
    uint32_t index;
    int stopped;               /* a stop string finished it: drop output until the
                                  scheduler's own finish arrives */
    struct rx_detok d;
    struct s_state *next;
};

struct s_proc {
    rx_ipc_t *ipc;
    rx_ipc_sock_t *in, *to_main;
    rx_tokenizer_t *tok;
    struct s_state **bucket;   /* power-of-two count */
    size_t n_bucket, n_state;
    /* the TEXT being built */
    struct rx_ipc_text_out *out;
    size_t cap_out;
    size_t *off;               /* text offset of each entry in buf */
    size_t cap_off;
    char *buf;
    size_t n_buf, cap_buf;
};

/* ------------------------------------------------------------- states -- */

static size_t s_hash (const struct s_proc *p, uint64_t rid, uint32_t index)
{
    uint64_t x = rid ^ ((uint64_t) index * 0x9e3779b97f4a7c15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t) x & (p->n_bucket - 1);
}

static struct s_state **s_slot (struct s_proc *p, uint64_t rid, uint32_t index)
{
    struct s_state **pp = &p->bucket[s_hash (p, rid, index)];
    while (*pp && !((*pp)->rid == rid && (*pp)->index == index)) pp = &(*pp)->next;
    return pp;
}

static struct s_state *s_find (struct s_proc *p, uint64_t rid, uint32_t index)
{
    return *s_slot (p, rid, index);
}

/* Double the buckets when the table is full (load factor 1). */
static int s_grow_table (struct s_proc *p)
{
    size_t nb = p->n_bucket ? p->n_bucket * 2 : 64;
    struct s_state **b = calloc (nb, sizeof *b);
    if (!b) return RX_ENOMEM;
    struct s_state **old = p->bucket;
    size_t on = p->n_bucket;
    p->bucket = b;
    p->n_bucket = nb;
    for (size_t i = 0; i < on; i++)
        for (struct s_state *s = old[i], *nx; s; s = nx) {
            nx = s->next;
            size_t h = s_hash (p, s->rid, s->index);
            s->next = b[h];
            b[h] = s;
        }
    free (old);
    return RX_OK;
}

static struct s_state *s_add (struct s_proc *p, uint64_t rid, uint32_t index)
{
    if (p->n_state >= p->n_bucket && s_grow_table (p) != RX_OK) return NULL;
    struct s_state *s = calloc (1, sizeof *s);
    if (!s) return NULL;
    s->rid = rid;
    s->index = index;
    size_t h = s_hash (p, rid, index);
    s->next = p->bucket[h];
    p->bucket[h] = s;
    p->n_state++;
    return s;
}

static void s_remove (struct s_proc *p, struct s_state *s)
{
    struct s_state **pp = s_slot (p, s->rid, s->index);
    if (*pp != s) return;
    *pp = s->next;
    rx_detok_fini (&s->d);
    free (s);
    p->n_state--;
}

static void s_free_all (struct s_proc *p)
{
    for (size_t i = 0; i < p->n_bucket; i++)
        for (struct s_state *s = p->bucket[i], *nx; s; s = nx) {
            nx = s->next;
            rx_detok_fini (&s->d);
            free (s);
        }
    free (p->bucket);
    p->bucket = NULL;
    p->n_bucket = p->n_state = 0;
}

/* ------------------------------------------------------------ entries -- */

static int s_append (struct s_proc *p, const char *s, size_t n)
{
    if (rx_grow ((void **) &p->buf, &p->cap_buf, p->n_buf + n + 1, 1)) return RX_ENOMEM;
    if (n) memcpy (p->buf + p->n_buf, s, n);
    p->n_buf += n;
    return RX_OK;
}

/* One TOKENS entry into out (its text appended to buf).  *emit = 0 when
 * the entry is dropped (unknown request, or output after a stop string). */
static int s_entry (struct s_proc *p, const struct rx_ipc_tok_out *t, struct rx_ipc_text_out *o,
                    int *emit)
{
    struct rx_err err = { 0 };
    *emit = 0;
    struct s_state *st = s_find (p, t->rid, t->index);
    if (t->first) {
        if (st) {
            rx_log (RX_LOG_WARN, "detokenizer: request %llu/%u: a second first output; "
                    "its text starts over", (unsigned long long) t->rid, t->index);
            s_remove (p, st);
        }
        if (!(st = s_add (p, t->rid, t->index))) return RX_ENOMEM;
        rx_detok_init (&st->d, p->tok, t->skip_special_tokens ? 0 : RX_DETOK_SPECIAL);
        if (rx_detok_set_stops (&st->d, (const char *const *) t->stop, t->n_stop, &err) != RX_OK) {
            s_remove (p, st);
            return err.code ? err.code : RX_ENOMEM;
        }
    } else if (!st) {
        rx_log (RX_LOG_DEBUG, "detokenizer: output for unknown request %llu/%u dropped",
                (unsigned long long) t->rid, t->index);
        return RX_OK;
    }
    if (st->stopped) {
        /* Its stop string went out already; the scheduler's finish (the
         * ABORT main asked for, or its own) ends the state. */
        if (t->finish != RX_FINISH_NONE) s_remove (p, st);
        return RX_OK;
    }

    *emit = 1;
    memset (o, 0, sizeof *o);
    o->rid = t->rid;
    o->index = t->index;
    o->usage = t->usage;
    o->finish = RX_FINISH_NONE;
    o->matched = -1;
    size_t start = p->n_buf;
    uint32_t n_used = t->n_ids;
    int stopped = 0;
    struct rx_detok_delta d;
    for (uint32_t k = 0; k < t->n_ids; k++) {
        if (rx_detok_push (&st->d, t->ids[k], &d, &err) != RX_OK) {
            rx_log (RX_LOG_WARN, "detokenizer: request %llu/%u: %s", (unsigned long long) t->rid,
                    t->index, err.msg);
            continue;
        }
        if (s_append (p, d.text, d.len)) return RX_ENOMEM;
        if (d.stopped) {
            stopped = 1;
            o->finish = RX_FINISH_STOP_STR;
            o->matched = d.stop_index;
            n_used = k + 1;
            break;
        }
    }
    if (!stopped && t->finish != RX_FINISH_NONE) {
        /* The end: what was held (a partial character, a possible stop
         * string's start) goes out now. */
        if (rx_detok_finish (&st->d, &d, &err) == RX_OK && s_append (p, d.text, d.len))
            return RX_ENOMEM;
        o->finish = t->finish;
        o->matched = t->matched;
    }
    if (t->finish != RX_FINISH_NONE)
        s_remove (p, st);
    else if (stopped)
        st->stopped = 1;
    o->text_len = (uint32_t) (p->n_buf - start);
    if (s_append (p, "", 0)) return RX_ENOMEM;
    p->buf[p->n_buf++] = '\0';
    if (t->has_logprobs) {
        o->has_logprobs = 1;
        o->lp = t->lp;
        o->lp.n = n_used;
        o->lp.ids = t->ids;
        if (!n_used) o->lp.ids = NULL;
    }
    return RX_OK;
}

/* One TOKENS message: at most one TEXT message to main.  Returns 1 when
 * main is gone. */
static int s_tokens (struct s_proc *p, const struct rx_ipc_tokens *tk)
{
    struct rx_err err = { 0 };
    if (!tk->n) return 0;
    if (rx_grow ((void **) &p->out, &p->cap_out, tk->n, sizeof *p->out)
        || rx_grow ((void **) &p->off, &p->cap_off, tk->n, sizeof *p->off)) {
        rx_log (RX_LOG_ERROR, "detokenizer: out of memory for %u outputs; dropped", tk->n);
        return 0;
    }
    p->n_buf = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < tk->n; i++) {
        int emit;
        size_t at = p->n_buf;
        int rc = s_entry (p, &tk->out[i], &p->out[n], &emit);
        if (rc != RX_OK) {
            rx_log (RX_LOG_ERROR, "detokenizer: request %llu/%u: out of memory; output dropped",
                    (unsigned long long) tk->out[i].rid, tk->out[i].index);
            p->n_buf = at;
            continue;
        }
        if (emit) p->off[n++] = at;
    }
    if (!n) return 0;
    for (uint32_t i = 0; i < n; i++) p->out[i].text = p->buf + p->off[i];
    struct rx_ipc_msg m;
    memset (&m, 0, sizeof m);
    m.type = RX_IPC_TEXT;
    m.u.text.n = n;
    m.u.text.out = p->out;
    int rc = rx_ipc_send (p->to_main, &m, RX_PROC_SEND_TIMEOUT_MS, &err);
    if (rc == RX_OK) return 0;
    if (rc == RX_EINVAL) {
        rx_log (RX_LOG_ERROR, "detokenizer: TEXT not sent: %s", err.msg);
        return 0;
    }
    rx_log (RX_LOG_ERROR, "detokenizer: cannot send TEXT to main (gone?): %s", err.msg);
    return 1;
}

/* -------------------------------------------------------------- main -- */

static int s_start (struct s_proc *p, struct rx_boot *boot, const char *run_dir)
{
    struct rx_err err = { 0 };
    if (!run_dir) {
        rx_log (RX_LOG_ERROR, "detokenizer: no run directory given");
        return 1;
    }
    if (!(p->ipc = rx_ipc_join (run_dir, &err))
        || !(p->in = rx_ipc_bind (p->ipc, RX_IPC_PULL, RX_SOCK_DETOK, &err))
        || !(p->to_main = rx_ipc_connect (p->ipc, RX_IPC_PUSH, RX_SOCK_MAIN, &err))) {
        rx_log (RX_LOG_ERROR, "detokenizer: %s", err.msg);
        return 1;
    }
    char *path = rx_engine_model_path (boot, NULL);
    if (!path) {
        rx_log (RX_LOG_ERROR, "detokenizer: no model: set [model] path");
        return 1;
    }
    p->tok = rx_tokenizer_open (path, &err);
    free (path);
    if (!p->tok) {
        rx_log (RX_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    if (s_grow_table (p) != RX_OK) {
        rx_log (RX_LOG_ERROR, "detokenizer: out of memory");
        return 1;
    }
    return 0;
}

int rx_detok_proc_main (struct rx_boot *boot, const char *run_dir)
{
    return rx_detok_proc_main_n (boot, run_dir, 1);
}

int rx_detok_proc_main_n (struct rx_boot *boot, const char *run_dir, int n_upstream)
{
    struct s_proc p;
    memset (&p, 0, sizeof p);
    int n_shutdown = 0;
    if (n_upstream < 1) n_upstream = 1;
    int status = s_start (&p, boot, run_dir);
    while (status == 0) {
        struct rx_ipc_msg m;
        struct rx_err err = { 0 };
        int rc = rx_ipc_recv (p.in, &m, S_RECV_WAIT_MS, &err);
        if (rc == RX_ETIMEDOUT) continue;
        if (rc == RX_EFORMAT) {
            rx_log (RX_LOG_WARN, "detokenizer: dropped a message: %s", err.msg);
            continue;
        }
        if (rc != RX_OK) {
            rx_log (RX_LOG_ERROR, "detokenizer: cannot receive: %s", err.msg);
            status = 1;
            break;
        }
        if (m.type == RX_IPC_TOKENS)
            status = s_tokens (&p, &m.u.tokens);
        else if (m.type == RX_IPC_SHUTDOWN) {
            /* Each upstream scheduler sends one as it stops; the others
             * may still have TOKENS on the way. */
            if (++n_shutdown < n_upstream) {
                rx_log (RX_LOG_DEBUG, "detokenizer: %d of %d schedulers stopped", n_shutdown,
                        n_upstream);
                rx_ipc_msg_free (&m);
                continue;
            }
            rx_log (RX_LOG_INFO, "detokenizer: stopped (%zu requests unfinished)", p.n_state);
            rx_ipc_msg_free (&m);
            break;
        } else
            rx_log (RX_LOG_WARN, "detokenizer: unexpected %s message; ignored",
                    rx_ipc_type_name (m.type));
        rx_ipc_msg_free (&m);
    }
    s_free_all (&p);
    free (p.out);
    free (p.off);
    free (p.buf);
    rx_tokenizer_free (&p.tok);
    /* Closes the sockets: the last TEXT gets the linger time to leave. */
    rx_ipc_destroy (&p.ipc);
    return status;
}
