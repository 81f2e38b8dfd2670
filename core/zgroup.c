/* core/zgroup.c -- a group of n ranks over ZMQ (see zgroup.h).
 *
 * Wire protocol.  Every message is two frames: a fixed header (struct
 * s_hdr, host byte order: all ranks run the same build, whose RX_BUILD_TAG
 * pins the endianness) and a payload frame (possibly empty).  On rank 0's
 * ROUTER a routing-id frame comes first.  A non-zero rank's routing id is
 * "r<rank>.<pid>.<nonce>": it names the rank (rank 0 checks it against the
 * HELLO) and is unique per process, so two processes given the same rank are
 * told apart and the second one is rejected with a clear error instead of
 * being silently refused by the ROUTER.
 *
 * Join: each rank sends HELLO(rank, n_rank); rank 0 waits for all, then
 * sends WELCOME to each.  A HELLO with another n_rank, an impossible rank or
 * a rank already taken makes rank 0 fail and REJECT everyone (each then
 * fails with rank 0's reason).
 *
 * Collectives are all the same shape: every non-zero rank sends CONTRIB(kind,
 * seq, args, payload) to rank 0; rank 0 checks that kind, sequence number and
 * arguments (root, reduction, count) match its own, combines the payloads in
 * rank order and sends RESULT(kind, seq, result) back to each.  So every
 * collective is also a barrier, a divergence is always seen (no rank can run
 * ahead by more than one collective) and the reduction order is fixed.  It
 * costs one round trip per collective, which control traffic can afford.
 *
 * Failure: whichever rank fails first (timeout, divergence, a bad argument)
 * sends ABORT(code, reason) -- rank 0 to everyone, the others to rank 0, which
 * forwards it -- so the other ranks fail at once with the cause rather than
 * waiting out their timeout.  destroy sends BYE, so a rank still waiting
 * learns its peer left (RX_EIO).  A killed rank says nothing: the others
 * time out naming it. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "zgroup.h"

/* The reductions of radix/comm.h; the values are that header's ABI, repeated
 * here so this file needs no header beyond radix/err.h (it is compiled into
 * plugins that may not include comm.h's dependencies). */
enum { S_SUM = 0, S_MAX = 1, S_MIN = 2 };

#define S_MAGIC     0x5a475258u    /* "XRGZ" */
#define S_ID_MAX    64
#define S_EP_MAX    200            /* endpoint as shown in messages */
/* Linger of a healthy group's sockets at destroy: long enough for the last
 * RESULT / BYE still queued to reach a live peer, bounded so a dead peer
 * cannot hold destroy up (and never above the group's timeout).  Linger 0
 * would drop the last RESULT rank 0 queued just before destroy.  A broken
 * group lingers briefly so its ABORT / REJECT notices still go out. */
#define S_LINGER_MS        1000
#define S_LINGER_BROKEN_MS 100

enum s_type {
    S_HELLO = 1, S_WELCOME, S_REJECT, S_CONTRIB, S_RESULT, S_ABORT, S_BYE
};

enum s_kind {
    S_K_BCAST = 1, S_K_ALLGATHER, S_K_ALLREDUCE, S_K_BARRIER
};

struct s_hdr {
    uint32_t magic;
    uint16_t type;        /* enum s_type */
    uint16_t kind;        /* enum s_kind (CONTRIB/RESULT) */
    int32_t  rank;        /* sender */
    int32_t  aux0;        /* HELLO: n_rank; bcast: root; allreduce: red; ABORT/REJECT: status */
    int64_t  aux1;        /* allreduce: count */
    uint64_t seq;         /* collective number, from 1 */
};

struct rx_zgroup {
    int rank, n_rank;
    double timeout_s;     /* default of calls given a negative timeout */
    void *ctx, *sock;
    char endpoint[S_EP_MAX];
    uint64_t seq;         /* last collective started */
    int bound;            /* rank 0 bound endpoint (an ipc file to remove) */
    int broken;           /* an error happened: every call fails at once */
    struct rx_err why;    /* the first error */
    /* rank 0: the routing id of each rank (id_len 0: not joined) */
    unsigned char (*ids)[S_ID_MAX];
    size_t *id_len;
};

/* One received message. */
struct s_in {
    unsigned char id[S_ID_MAX];
    size_t id_len;
    struct s_hdr h;
    void *pay;            /* malloc'd (NULL when len 0) */
    size_t len;
};

/* ------------------------------------------------------------ helpers */

static double s_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* Deadline for a call's timeout (negative: the group's; 0: none).
 *
 * The non-zero ranks wait a little longer than rank 0 (10%, at most 1 s):
 * when a rank dies every survivor times out at about the same moment, and
 * only rank 0 knows which rank is missing; the grace lets its ABORT naming
 * that rank arrive before the others give up with a vaguer "rank 0 did not
 * complete".  Rank 0 itself never declares a rank dead before timeout_s. */
static double s_deadline (const rx_zgroup_t *g, double timeout_s)
{
    if (timeout_s < 0) timeout_s = g->timeout_s;
    if (timeout_s <= 0) return 0;
    double grace = 0;
    if (g->rank != 0) grace = timeout_s * 0.1 < 1.0 ? timeout_s * 0.1 : 1.0;
    return s_now () + timeout_s + grace;
}

static const char *s_kind_name (int kind)
{
    switch (kind) {
    case S_K_BCAST: return "bcast";
    case S_K_ALLGATHER: return "allgather";
    case S_K_ALLREDUCE: return "allreduce";
    case S_K_BARRIER: return "barrier";
    default: return "?";
    }
}

static const char *s_red_name (int red)
{
    return red == S_SUM ? "sum" : red == S_MAX ? "max" : red == S_MIN ? "min" : "?";
}

/* "bcast #12 (root 1)", "allreduce #3 (max of 4)", "barrier #5". */
static void s_desc (char *buf, size_t n, int kind, uint64_t seq, int32_t aux0, int64_t aux1)
{
    if (kind == S_K_BCAST)
        snprintf (buf, n, "bcast #%" PRIu64 " (root %d)", seq, (int) aux0);
    else if (kind == S_K_ALLREDUCE)
        snprintf (buf, n, "allreduce #%" PRIu64 " (%s of %" PRId64 ")", seq, s_red_name (aux0), aux1);
    else
        snprintf (buf, n, "%s #%" PRIu64, s_kind_name (kind), seq);
}

static void s_in_free (struct s_in *in)
{
    free (in->pay);
    in->pay = NULL;
    in->len = 0;
}

/* Send header + payload (to routing id `id` on rank 0's ROUTER).  `flags`
 * ZMQ_DONTWAIT for best-effort notices (ABORT, BYE). */
static int s_send (rx_zgroup_t *g, const void *id, size_t id_len, const struct s_hdr *h,
                   const void *pay, size_t len, int flags)
{
    if (id && zmq_send (g->sock, id, id_len, ZMQ_SNDMORE | flags) < 0) return -1;
    if (zmq_send (g->sock, h, sizeof *h, ZMQ_SNDMORE | flags) < 0) return -1;
    if (zmq_send (g->sock, len ? pay : "", len, flags) < 0) return -1;
    return 0;
}

static struct s_hdr s_mkhdr (const rx_zgroup_t *g, int type, int kind, int32_t aux0, int64_t aux1)
{
    return (struct s_hdr) { .magic = S_MAGIC, .type = (uint16_t) type, .kind = (uint16_t) kind,
                            .rank = g->rank, .aux0 = aux0, .aux1 = aux1, .seq = g->seq };
}

/* Receive one well-formed message before deadline (0: none).  Malformed
 * messages (a stranger connected to a tcp port) are dropped.  Returns RX_OK,
 * RX_ETIMEDOUT (nothing came; err untouched) or RX_EIO. */
static int s_recv (rx_zgroup_t *g, double deadline, struct s_in *in, struct rx_err *err)
{
    for (;;) {
        long ms = -1;
        if (deadline > 0) {
            double left = deadline - s_now ();
            if (left <= 0) return RX_ETIMEDOUT;
            ms = (long) (left * 1000.0) + 1;
        }
        zmq_pollitem_t it = { g->sock, 0, ZMQ_POLLIN, 0 };
        int rc = zmq_poll (&it, 1, ms);
        if (rc < 0) {
            if (zmq_errno () == EINTR) continue;
            return rx_err_set (err, RX_EIO, "zgroup %s: rank %d: zmq_poll: %s", g->endpoint, g->rank,
                               zmq_strerror (zmq_errno ()));
        }
        if (rc == 0) continue;   /* re-check the deadline */

        /* Read every frame of the message. */
        zmq_msg_t fr[4];
        int nf = 0, more = 1, bad = 0;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init (&m);
            if (zmq_msg_recv (&m, g->sock, ZMQ_DONTWAIT) < 0) {
                int e = zmq_errno ();
                zmq_msg_close (&m);
                if (e == EAGAIN || e == EINTR) { if (nf == 0) break; continue; }
                for (int i = 0; i < nf; i++) zmq_msg_close (&fr[i]);
                return rx_err_set (err, RX_EIO, "zgroup %s: rank %d: receive: %s", g->endpoint,
                                   g->rank, zmq_strerror (e));
            }
            more = zmq_msg_more (&m);
            if (nf < 4) fr[nf++] = m;
            else { bad = 1; zmq_msg_close (&m); }
        }
        if (nf == 0) continue;
        int base = g->rank == 0 ? 1 : 0;
        if (nf != base + 2 || zmq_msg_size (&fr[base]) != sizeof (struct s_hdr)
            || (base && zmq_msg_size (&fr[0]) > S_ID_MAX))
            bad = 1;
        if (!bad) {
            memcpy (&in->h, zmq_msg_data (&fr[base]), sizeof in->h);
            if (in->h.magic != S_MAGIC) bad = 1;
        }
        if (!bad) {
            in->id_len = base ? zmq_msg_size (&fr[0]) : 0;
            if (base) memcpy (in->id, zmq_msg_data (&fr[0]), in->id_len);
            in->len = zmq_msg_size (&fr[base + 1]);
            in->pay = NULL;
            if (in->len) {
                in->pay = malloc (in->len);
                if (!in->pay) {
                    for (int i = 0; i < nf; i++) zmq_msg_close (&fr[i]);
                    return rx_err_set (err, RX_ENOMEM, "zgroup %s: rank %d: out of memory (%zu bytes)",
                                       g->endpoint, g->rank, in->len);
                }
                memcpy (in->pay, zmq_msg_data (&fr[base + 1]), in->len);
            }
        }
        for (int i = 0; i < nf; i++) zmq_msg_close (&fr[i]);
        if (!bad) return RX_OK;
    }
}

/* Rank 0: the rank whose routing id is id, or -1. */
static int s_rank_of (const rx_zgroup_t *g, const unsigned char *id, size_t len)
{
    for (int r = 1; r < g->n_rank; r++)
        if (g->id_len[r] == len && !memcmp (g->ids[r], id, len)) return r;
    return -1;
}

/* Mark the group broken with err's error (kept for later calls) and tell the
 * other ranks (best effort, never blocks): rank 0 tells everyone, the others
 * tell rank 0.  skip: a rank not to tell (the one that told us), or -1. */
static int s_fail (rx_zgroup_t *g, int skip, struct rx_err *err)
{
    int code = err && err->code ? err->code : RX_EIO;
    if (!g->broken) {
        g->broken = 1;
        g->why.code = code;
        snprintf (g->why.msg, sizeof g->why.msg, "%s", err ? err->msg : "error");
        if (g->sock) {
            struct s_hdr h = s_mkhdr (g, S_ABORT, 0, code, 0);
            size_t ml = strlen (g->why.msg);
            if (g->rank == 0) {
                for (int r = 1; r < g->n_rank; r++)
                    if (r != skip && g->id_len[r])
                        s_send (g, g->ids[r], g->id_len[r], &h, g->why.msg, ml, ZMQ_DONTWAIT);
            } else if (skip != 0) {
                s_send (g, NULL, 0, &h, g->why.msg, ml, ZMQ_DONTWAIT);
            }
        }
    }
    return code;
}

static int s_check (const rx_zgroup_t *g, struct rx_err *err)
{
    if (!g) return rx_err_set (err, RX_EINVAL, "zgroup: NULL group");
    if (g->broken)
        return rx_err_set (err, g->why.code, "zgroup %s: broken by an earlier error: %s", g->endpoint,
                           g->why.msg);
    return RX_OK;
}

/* The text of an ABORT/REJECT payload. */
static const char *s_reason (struct s_in *in, char *buf, size_t n)
{
    size_t k = in->len < n - 1 ? in->len : n - 1;
    if (k) memcpy (buf, in->pay, k);
    buf[k] = 0;
    return buf;
}

/* "2", "2, 3", "1, 2, 3 and 2 more": the ranks with !have[r] (r >= 1). */
static void s_missing (const rx_zgroup_t *g, const char *have, char *buf, size_t n, int *count)
{
    size_t o = 0;
    int c = 0;
    buf[0] = 0;
    for (int r = 1; r < g->n_rank; r++) {
        if (have[r]) continue;
        if (c < 8 && o < n) o += (size_t) snprintf (buf + o, n - o, "%s%d", c ? ", " : "", r);
        c++;
    }
    if (c > 8 && o < n) snprintf (buf + o, n - o, " and %d more", c - 8);
    *count = c;
}

/* ------------------------------------------------------------ join */

static int s_join0 (rx_zgroup_t *g, double deadline, struct rx_err *err)
{
    char *have = calloc ((size_t) g->n_rank, 1);
    if (!have) return rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", g->endpoint);
    have[0] = 1;
    int joined = 1, rc = RX_OK, culprit = -1;
    char tmp[RX_ERR_MSG_MAX];
    while (joined < g->n_rank) {
        struct s_in in;
        rc = s_recv (g, deadline, &in, err);
        if (rc == RX_ETIMEDOUT) {
            char miss[160];
            int c;
            s_missing (g, have, miss, sizeof miss, &c);
            rx_err_set (err, RX_ETIMEDOUT, "zgroup %s: rank%s %s never joined within %g s", g->endpoint,
                        c > 1 ? "s" : "", miss, g->timeout_s);
            break;
        }
        if (rc) break;
        int r = in.h.rank;
        if (in.h.type == S_HELLO) {
            if (in.h.aux0 != g->n_rank) {
                rc = rx_err_set (err, RX_EINVAL, "zgroup %s: rank %d says the group has %d ranks, rank 0 says %d",
                                 g->endpoint, r, (int) in.h.aux0, g->n_rank);
            } else if (r <= 0 || r >= g->n_rank) {
                rc = rx_err_set (err, RX_EINVAL, "zgroup %s: a process joined as rank %d of %d (rank 0 is this one)",
                                 g->endpoint, r, g->n_rank);
            } else if (have[r]) {
                rc = rx_err_set (err, RX_EINVAL, "zgroup %s: rank %d joined twice (two processes were given rank %d)",
                                 g->endpoint, r, r);
            } else {
                have[r] = 1;
                joined++;
                memcpy (g->ids[r], in.id, in.id_len);
                g->id_len[r] = in.id_len;
            }
            if (rc) {
                /* Tell the offender too (it is not in ids[]). */
                struct s_hdr h = s_mkhdr (g, S_REJECT, 0, rc, 0);
                s_send (g, in.id, in.id_len, &h, err->msg, strlen (err->msg), ZMQ_DONTWAIT);
            }
        } else if (in.h.type == S_ABORT || in.h.type == S_BYE) {
            int k = s_rank_of (g, in.id, in.id_len);
            if (k > 0) {
                culprit = k;
                if (in.h.type == S_BYE)
                    rc = rx_err_set (err, RX_EIO, "zgroup %s: rank %d left before the group formed",
                                     g->endpoint, k);
                else
                    rc = rx_err_set (err, in.h.aux0 < 0 ? in.h.aux0 : RX_EIO, "%s",
                                     s_reason (&in, tmp, sizeof tmp));
            }
        }
        /* anything else before WELCOME is a stray: dropped */
        s_in_free (&in);
        if (rc) break;
    }
    free (have);
    if (rc) {
        /* Everyone who joined learns why (REJECT, not ABORT: they are still
         * waiting for WELCOME). */
        struct s_hdr h = s_mkhdr (g, S_REJECT, 0, rc, 0);
        for (int r = 1; r < g->n_rank; r++)
            if (g->id_len[r] && r != culprit)
                s_send (g, g->ids[r], g->id_len[r], &h, err->msg, strlen (err->msg), ZMQ_DONTWAIT);
        g->broken = 1;
        return rc;
    }
    struct s_hdr h = s_mkhdr (g, S_WELCOME, 0, g->n_rank, 0);
    for (int r = 1; r < g->n_rank; r++)
        if (s_send (g, g->ids[r], g->id_len[r], &h, NULL, 0, 0) < 0)
            return rx_err_set (err, RX_EIO, "zgroup %s: cannot welcome rank %d: %s", g->endpoint, r,
                               zmq_strerror (zmq_errno ()));
    return RX_OK;
}

static int s_join (rx_zgroup_t *g, double deadline, struct rx_err *err)
{
    struct s_hdr h = s_mkhdr (g, S_HELLO, 0, g->n_rank, 0);
    if (s_send (g, NULL, 0, &h, NULL, 0, 0) < 0)
        return rx_err_set (err, RX_EIO, "zgroup %s: rank %d: cannot send hello: %s", g->endpoint,
                           g->rank, zmq_strerror (zmq_errno ()));
    char tmp[RX_ERR_MSG_MAX];
    for (;;) {
        struct s_in in;
        int rc = s_recv (g, deadline, &in, err);
        if (rc == RX_ETIMEDOUT)
            return rx_err_set (err, RX_ETIMEDOUT,
                               "zgroup %s: rank %d: rank 0 did not welcome it within %g s (is rank 0 up and are all %d ranks started?)",
                               g->endpoint, g->rank, g->timeout_s, g->n_rank);
        if (rc) return rc;
        int type = in.h.type;
        if (type == S_WELCOME) {
            s_in_free (&in);
            return RX_OK;
        }
        if (type == S_REJECT || type == S_ABORT) {
            rc = rx_err_set (err, in.h.aux0 < 0 ? in.h.aux0 : RX_EIO, "rank 0 refused rank %d: %s",
                             g->rank, s_reason (&in, tmp, sizeof tmp));
            s_in_free (&in);
            return rc;
        }
        s_in_free (&in);
    }
}

static int s_sockopt (rx_zgroup_t *g, int opt, const void *v, size_t n, const char *name,
                      struct rx_err *err)
{
    if (zmq_setsockopt (g->sock, opt, v, n) == 0) return RX_OK;
    return rx_err_set (err, RX_EIO, "zgroup %s: %s: %s", g->endpoint, name, zmq_strerror (zmq_errno ()));
}

rx_zgroup_t *rx_zgroup_new (const char *endpoint, int rank, int n_rank, double timeout_s,
                            struct rx_err *err)
{
    if (!endpoint || !*endpoint) {
        rx_err_set (err, RX_EINVAL, "zgroup: no endpoint");
        return NULL;
    }
    if (n_rank < 1 || rank < 0 || rank >= n_rank) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: rank %d of %d is out of range", endpoint, rank, n_rank);
        return NULL;
    }
    rx_zgroup_t *g = calloc (1, sizeof *g);
    if (!g) {
        rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", endpoint);
        return NULL;
    }
    g->rank = rank;
    g->n_rank = n_rank;
    g->timeout_s = timeout_s < 0 ? 0 : timeout_s;
    snprintf (g->endpoint, sizeof g->endpoint, "%s", endpoint);
    if (n_rank == 1) return g;    /* a group of one: no sockets at all */

    double deadline = s_deadline (g, -1);
    int rc;
    g->ctx = zmq_ctx_new ();
    if (!g->ctx) {
        rx_err_set (err, RX_EIO, "zgroup %s: zmq_ctx_new: %s", endpoint, zmq_strerror (zmq_errno ()));
        goto fail;
    }
    zmq_ctx_set (g->ctx, ZMQ_IO_THREADS, 1);
    g->sock = zmq_socket (g->ctx, rank == 0 ? ZMQ_ROUTER : ZMQ_DEALER);
    if (!g->sock) {
        rx_err_set (err, RX_EIO, "zgroup %s: zmq_socket: %s", endpoint, zmq_strerror (zmq_errno ()));
        goto fail;
    }
    int zero = 0, one = 1, ivl = 20, linger = 0;
    /* Lock-step traffic never queues much; no high-water mark means a send
     * never blocks or drops on one. */
    if (s_sockopt (g, ZMQ_SNDHWM, &zero, sizeof zero, "ZMQ_SNDHWM", err)
        || s_sockopt (g, ZMQ_RCVHWM, &zero, sizeof zero, "ZMQ_RCVHWM", err)
        || s_sockopt (g, ZMQ_LINGER, &linger, sizeof linger, "ZMQ_LINGER", err))
        goto fail;
    if (rank == 0) {
        g->ids = calloc ((size_t) n_rank, sizeof *g->ids);
        g->id_len = calloc ((size_t) n_rank, sizeof *g->id_len);
        if (!g->ids || !g->id_len) {
            rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", endpoint);
            goto fail;
        }
        /* A send to a rank that is gone fails (EHOSTUNREACH) instead of
         * vanishing. */
        if (s_sockopt (g, ZMQ_ROUTER_MANDATORY, &one, sizeof one, "ZMQ_ROUTER_MANDATORY", err))
            goto fail;
        if (zmq_bind (g->sock, endpoint) < 0) {
            rx_err_set (err, RX_EIO, "zgroup %s: rank 0 cannot bind it: %s", endpoint,
                        zmq_strerror (zmq_errno ()));
            goto fail;
        }
        g->bound = 1;
        rc = s_join0 (g, deadline, err);
    } else {
        char id[S_ID_MAX];
        struct timespec ts;
        clock_gettime (CLOCK_REALTIME, &ts);
        int n = snprintf (id, sizeof id, "r%d.%ld.%lx", rank, (long) getpid (),
                          (unsigned long) (ts.tv_nsec ^ ((long) ts.tv_sec << 20)));
        /* Retry a refused connection quickly: rank 0 may bind after us. */
        if (s_sockopt (g, ZMQ_ROUTING_ID, id, (size_t) n, "ZMQ_ROUTING_ID", err)
            || s_sockopt (g, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl, "ZMQ_RECONNECT_IVL", err))
            goto fail;
        if (zmq_connect (g->sock, endpoint) < 0) {
            rx_err_set (err, RX_EIO, "zgroup %s: rank %d cannot connect: %s", endpoint, rank,
                        zmq_strerror (zmq_errno ()));
            goto fail;
        }
        rc = s_join (g, deadline, err);
    }
    if (rc) goto fail;
    return g;
fail:
    g->broken = 1;   /* destroy: no BYE, short linger for the REJECTs */
    rx_zgroup_destroy (&g);
    return NULL;
}

void rx_zgroup_destroy (rx_zgroup_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_zgroup_t *g = *self_p;
    if (g->sock) {
        int linger = 0;
        if (!g->broken) {
            /* Tell the others we are leaving: a rank still waiting on us
             * fails at once (RX_EIO) instead of timing out. */
            struct s_hdr h = s_mkhdr (g, S_BYE, 0, 0, 0);
            if (g->rank == 0) {
                for (int r = 1; r < g->n_rank; r++)
                    if (g->id_len[r]) s_send (g, g->ids[r], g->id_len[r], &h, NULL, 0, ZMQ_DONTWAIT);
            } else {
                s_send (g, NULL, 0, &h, NULL, 0, ZMQ_DONTWAIT);
            }
            linger = S_LINGER_MS;
        } else {
            linger = S_LINGER_BROKEN_MS;
        }
        if (g->timeout_s > 0 && g->timeout_s * 1000 < linger) linger = (int) (g->timeout_s * 1000);
        zmq_setsockopt (g->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close (g->sock);
    }
    if (g->ctx)
        while (zmq_ctx_term (g->ctx) < 0 && zmq_errno () == EINTR) {}
    /* libzmq leaves a bound ipc socket file behind; remove ours once the
     * socket is closed (zmq_unbind would drop the queued last messages).
     * "ipc://@name" is Linux's abstract namespace: no file. */
    if (g->bound && !strncmp (g->endpoint, "ipc://", 6) && g->endpoint[6] && g->endpoint[6] != '@')
        unlink (g->endpoint + 6);
    free (g->ids);
    free (g->id_len);
    free (g);
    *self_p = NULL;
}

int rx_zgroup_rank (const rx_zgroup_t *g) { return g->rank; }
int rx_zgroup_size (const rx_zgroup_t *g) { return g->n_rank; }

/* ------------------------------------------------------------ collectives */

/* Combines the contributions in[0..n) (lens[r] bytes each) into a malloc'd
 * result; returns a status (err set). */
typedef int (*s_combine_fn) (rx_zgroup_t *g, void *ctx, const void *const *in, const size_t *lens,
                             void **res, size_t *res_len, struct rx_err *err);

/* Rank 0 handles a non-CONTRIB message that came during a collective (from
 * rank k, -1 unknown): returns a status with err set, or RX_OK to ignore it. */
static int s_unexpected0 (rx_zgroup_t *g, struct s_in *in, int k, const char *now, int *culprit,
                          struct rx_err *err)
{
    char tmp[RX_ERR_MSG_MAX];
    switch (in->h.type) {
    case S_ABORT:
        if (k < 0) return RX_OK;
        *culprit = k;
        return rx_err_set (err, in->h.aux0 < 0 ? in->h.aux0 : RX_EIO, "%s", s_reason (in, tmp, sizeof tmp));
    case S_BYE:
        if (k < 0) return RX_OK;
        *culprit = k;
        return rx_err_set (err, RX_EIO, "zgroup %s: rank %d left the group while rank 0 is at %s",
                           g->endpoint, k, now);
    case S_HELLO: {
        /* A late joiner (a restarted rank, or one started twice): refuse
         * it; the group goes on if nobody else noticed. */
        struct rx_err e2;
        rx_err_set (&e2, RX_EINVAL, "zgroup %s: rank %d joined after the group formed (it is at %s)",
                    g->endpoint, (int) in->h.rank, now);
        struct s_hdr h = s_mkhdr (g, S_REJECT, 0, RX_EINVAL, 0);
        s_send (g, in->id, in->id_len, &h, e2.msg, strlen (e2.msg), ZMQ_DONTWAIT);
        return RX_OK;
    }
    default:
        return RX_OK;
    }
}

static int s_collective (rx_zgroup_t *g, int kind, int32_t aux0, int64_t aux1, const void *data,
                         size_t len, s_combine_fn combine, void *ctx, void **res, size_t *res_len,
                         double timeout_s, struct rx_err *err)
{
    *res = NULL;
    *res_len = 0;
    g->seq++;
    char now[96];
    s_desc (now, sizeof now, kind, g->seq, aux0, aux1);
    if (g->n_rank == 1) {
        const void *in[1] = { data };
        size_t lens[1] = { len };
        int rc = combine (g, ctx, in, lens, res, res_len, err);
        return rc ? s_fail (g, -1, err) : RX_OK;
    }
    double deadline = s_deadline (g, timeout_s);
    double tmo = timeout_s < 0 ? g->timeout_s : timeout_s;
    int rc = RX_OK;

    if (g->rank != 0) {
        struct s_hdr h = s_mkhdr (g, S_CONTRIB, kind, aux0, aux1);
        if (s_send (g, NULL, 0, &h, data, len, 0) < 0) {
            rx_err_set (err, RX_EIO, "zgroup %s: rank %d cannot send %s: %s", g->endpoint, g->rank, now,
                        zmq_strerror (zmq_errno ()));
            return s_fail (g, -1, err);
        }
        char tmp[RX_ERR_MSG_MAX];
        for (;;) {
            struct s_in in;
            rc = s_recv (g, deadline, &in, err);
            if (rc == RX_ETIMEDOUT) {
                rx_err_set (err, RX_ETIMEDOUT, "zgroup %s: rank 0 did not complete %s within %g s (rank %d waited)",
                            g->endpoint, now, tmo, g->rank);
                return s_fail (g, -1, err);
            }
            if (rc) return s_fail (g, -1, err);
            int type = in.h.type;
            if (type == S_RESULT) {
                if (in.h.seq != g->seq || in.h.kind != kind) {
                    char them[96];
                    s_desc (them, sizeof them, in.h.kind, in.h.seq, in.h.aux0, in.h.aux1);
                    s_in_free (&in);
                    rx_err_set (err, RX_EIO, "zgroup %s: ranks diverged: rank 0 sent %s while rank %d is at %s",
                                g->endpoint, them, g->rank, now);
                    return s_fail (g, -1, err);
                }
                *res = in.pay;
                *res_len = in.len;
                if (!*res) {
                    *res = malloc (1);
                    if (!*res) {
                        rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", g->endpoint);
                        return s_fail (g, -1, err);
                    }
                }
                return RX_OK;
            }
            if (type == S_ABORT) {
                rc = rx_err_set (err, in.h.aux0 < 0 ? in.h.aux0 : RX_EIO, "%s", s_reason (&in, tmp, sizeof tmp));
                s_in_free (&in);
                return s_fail (g, 0, err);
            }
            if (type == S_BYE) {
                s_in_free (&in);
                rx_err_set (err, RX_EIO, "zgroup %s: rank 0 left the group while rank %d is at %s",
                            g->endpoint, g->rank, now);
                return s_fail (g, 0, err);
            }
            s_in_free (&in);   /* a stray WELCOME/REJECT: ignore */
        }
    }

    /* rank 0: gather every contribution, combine, answer. */
    int n = g->n_rank, culprit = -1;
    void **bufs = calloc ((size_t) n, sizeof *bufs);
    size_t *lens = calloc ((size_t) n, sizeof *lens);
    char *have = calloc ((size_t) n, 1);
    if (!bufs || !lens || !have) {
        rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", g->endpoint);
        rc = RX_ENOMEM;
        goto out;
    }
    have[0] = 1;
    int got = 1;
    while (got < n) {
        struct s_in in;
        rc = s_recv (g, deadline, &in, err);
        if (rc == RX_ETIMEDOUT) {
            char miss[160];
            int c;
            s_missing (g, have, miss, sizeof miss, &c);
            rx_err_set (err, RX_ETIMEDOUT, "zgroup %s: rank%s %s did not reach %s within %g s (dead or stuck?)",
                        g->endpoint, c > 1 ? "s" : "", miss, now, tmo);
            goto out;
        }
        if (rc) goto out;
        int k = s_rank_of (g, in.id, in.id_len);
        if (in.h.type != S_CONTRIB || k < 0) {
            rc = s_unexpected0 (g, &in, k, now, &culprit, err);
            s_in_free (&in);
            if (rc) goto out;
            continue;
        }
        if (in.h.seq != g->seq || in.h.kind != kind || in.h.aux0 != aux0 || in.h.aux1 != aux1
            || have[k]) {
            char them[96];
            s_desc (them, sizeof them, in.h.kind, in.h.seq, in.h.aux0, in.h.aux1);
            s_in_free (&in);
            rc = rx_err_set (err, RX_EIO, "zgroup %s: ranks diverged: rank %d sent %s while rank 0 is at %s",
                             g->endpoint, k, them, now);
            goto out;
        }
        have[k] = 1;
        got++;
        bufs[k] = in.pay;
        lens[k] = in.len;
    }
    bufs[0] = (void *) data;
    lens[0] = len;
    rc = combine (g, ctx, (const void *const *) bufs, lens, res, res_len, err);
    bufs[0] = NULL;
    if (rc) goto out;
    struct s_hdr h = s_mkhdr (g, S_RESULT, kind, aux0, aux1);
    for (int r = 1; r < n; r++)
        if (s_send (g, g->ids[r], g->id_len[r], &h, *res, *res_len, 0) < 0) {
            int e = zmq_errno ();
            rc = rx_err_set (err, RX_EIO, "zgroup %s: rank 0 cannot send %s to rank %d: %s", g->endpoint,
                             now, r, e == EHOSTUNREACH ? "it is gone" : zmq_strerror (e));
            goto out;
        }
out:
    if (bufs)
        for (int r = 0; r < n; r++) free (bufs[r]);
    free (bufs);
    free (lens);
    free (have);
    if (rc) {
        free (*res);
        *res = NULL;
        *res_len = 0;
        return s_fail (g, culprit, err);
    }
    return RX_OK;
}

static void *s_dup (const void *p, size_t n)
{
    void *q = malloc (n ? n : 1);
    if (q && n) memcpy (q, p, n);
    return q;
}

static int s_comb_bcast (rx_zgroup_t *g, void *ctx, const void *const *in, const size_t *lens,
                         void **res, size_t *res_len, struct rx_err *err)
{
    int root = *(int *) ctx;
    *res = s_dup (in[root], lens[root]);
    if (!*res) return rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", g->endpoint);
    *res_len = lens[root];
    return RX_OK;
}

int rx_zgroup_bcast (rx_zgroup_t *g, int root, const void *data, size_t len, void **out,
                     size_t *out_len, double timeout_s, struct rx_err *err)
{
    int rc = s_check (g, err);
    if (rc) return rc;
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (root < 0 || root >= g->n_rank) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: bcast from root %d of %d", g->endpoint, root, g->n_rank);
        return s_fail (g, -1, err);
    }
    if (g->rank == root && len && !data) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: bcast of %zu bytes from NULL", g->endpoint, len);
        return s_fail (g, -1, err);
    }
    if (g->rank != root && !out) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: bcast: rank %d is not the root and has no out",
                    g->endpoint, g->rank);
        return s_fail (g, -1, err);
    }
    void *res;
    size_t res_len;
    rc = s_collective (g, S_K_BCAST, root, 0, g->rank == root ? data : NULL,
                       g->rank == root ? len : 0, s_comb_bcast, &root, &res, &res_len, timeout_s, err);
    if (rc) return rc;
    if (out) *out = res;
    else free (res);
    if (out_len) *out_len = res_len;
    return RX_OK;
}

/* Result: the concatenation, then n uint64 lengths (so the result buffer is
 * itself the caller's *out, with a tail it ignores). */
static int s_comb_allgather (rx_zgroup_t *g, void *ctx, const void *const *in, const size_t *lens,
                             void **res, size_t *res_len, struct rx_err *err)
{
    size_t tot = 0;
    for (int r = 0; r < g->n_rank; r++) tot += lens[r];
    size_t n = tot + (size_t) g->n_rank * sizeof (uint64_t);
    char *p = malloc (n);
    if (!p) return rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory (%zu bytes)", g->endpoint, n);
    size_t o = 0;
    for (int r = 0; r < g->n_rank; r++) {
        if (lens[r]) memcpy (p + o, in[r], lens[r]);
        o += lens[r];
    }
    for (int r = 0; r < g->n_rank; r++) {
        uint64_t l = lens[r];
        memcpy (p + tot + (size_t) r * sizeof l, &l, sizeof l);
    }
    *res = p;
    *res_len = n;
    return RX_OK;
}

int rx_zgroup_allgather (rx_zgroup_t *g, const void *data, size_t len, void **out, size_t *lens,
                         double timeout_s, struct rx_err *err)
{
    int rc = s_check (g, err);
    if (rc) return rc;
    if (!out || (len && !data)) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: allgather: %s", g->endpoint, !out ? "no out" : "NULL data");
        return s_fail (g, -1, err);
    }
    *out = NULL;
    void *res;
    size_t res_len;
    rc = s_collective (g, S_K_ALLGATHER, 0, 0, data, len, s_comb_allgather, NULL, &res, &res_len,
                       timeout_s, err);
    if (rc) return rc;
    size_t tail = (size_t) g->n_rank * sizeof (uint64_t);
    if (res_len < tail) {
        free (res);
        rx_err_set (err, RX_EFORMAT, "zgroup %s: allgather #%" PRIu64 ": short result (%zu bytes)",
                    g->endpoint, g->seq, res_len);
        return s_fail (g, -1, err);
    }
    size_t tot = 0;
    for (int r = 0; r < g->n_rank; r++) {
        uint64_t l;
        memcpy (&l, (char *) res + res_len - tail + (size_t) r * sizeof l, sizeof l);
        if (lens) lens[r] = (size_t) l;
        tot += (size_t) l;
    }
    if (tot != res_len - tail) {
        free (res);
        rx_err_set (err, RX_EFORMAT, "zgroup %s: allgather #%" PRIu64 ": lengths do not add up",
                    g->endpoint, g->seq);
        return s_fail (g, -1, err);
    }
    *out = res;
    return RX_OK;
}

static int s_comb_allreduce (rx_zgroup_t *g, void *ctx, const void *const *in, const size_t *lens,
                             void **res, size_t *res_len, struct rx_err *err)
{
    int red = *(int *) ctx;
    size_t nb = lens[0];
    for (int r = 1; r < g->n_rank; r++)
        if (lens[r] != nb)
            return rx_err_set (err, RX_EIO, "zgroup %s: allreduce #%" PRIu64 ": rank %d sent %zu bytes, rank 0 %zu",
                               g->endpoint, g->seq, r, lens[r], nb);
    size_t n = nb / sizeof (int64_t);
    int64_t *acc = malloc (nb ? nb : 1);
    if (!acc) return rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", g->endpoint);
    if (nb) memcpy (acc, in[0], nb);
    for (int r = 1; r < g->n_rank; r++) {
        const char *p = in[r];
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy (&v, p + i * sizeof v, sizeof v);
            if (red == S_SUM) acc[i] = (int64_t) ((uint64_t) acc[i] + (uint64_t) v);   /* wraps, no UB */
            else if (red == S_MAX) { if (v > acc[i]) acc[i] = v; }
            else if (v < acc[i]) acc[i] = v;
        }
    }
    *res = acc;
    *res_len = nb;
    return RX_OK;
}

int rx_zgroup_allreduce_i64 (rx_zgroup_t *g, int64_t *vals, size_t n, int red, double timeout_s,
                             struct rx_err *err)
{
    int rc = s_check (g, err);
    if (rc) return rc;
    if (red != S_SUM && red != S_MAX && red != S_MIN) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: allreduce: unknown reduction %d", g->endpoint, red);
        return s_fail (g, -1, err);
    }
    if (n && !vals) {
        rx_err_set (err, RX_EINVAL, "zgroup %s: allreduce of %zu values from NULL", g->endpoint, n);
        return s_fail (g, -1, err);
    }
    void *res;
    size_t res_len;
    rc = s_collective (g, S_K_ALLREDUCE, red, (int64_t) n, vals, n * sizeof *vals, s_comb_allreduce,
                       &red, &res, &res_len, timeout_s, err);
    if (rc) return rc;
    if (res_len != n * sizeof *vals) {
        free (res);
        rx_err_set (err, RX_EFORMAT, "zgroup %s: allreduce #%" PRIu64 ": %zu bytes back for %zu values",
                    g->endpoint, g->seq, res_len, n);
        return s_fail (g, -1, err);
    }
    if (n) memcpy (vals, res, res_len);
    free (res);
    return RX_OK;
}

static int s_comb_none (rx_zgroup_t *g, void *ctx, const void *const *in, const size_t *lens,
                        void **res, size_t *res_len, struct rx_err *err)
{
    *res = malloc (1);
    *res_len = 0;
    return *res ? RX_OK : rx_err_set (err, RX_ENOMEM, "zgroup %s: out of memory", g->endpoint);
}

int rx_zgroup_barrier (rx_zgroup_t *g, double timeout_s, struct rx_err *err)
{
    int rc = s_check (g, err);
    if (rc) return rc;
    void *res;
    size_t res_len;
    rc = s_collective (g, S_K_BARRIER, 0, 0, NULL, 0, s_comb_none, NULL, &res, &res_len, timeout_s, err);
    free (res);
    return rc;
}

int rx_zgroup_abort (rx_zgroup_t *g, const struct rx_err *why)
{
    if (!g) return RX_EINVAL;
    if (g->broken) return g->why.code;
    struct rx_err e;
    rx_err_set (&e, why && why->code ? why->code : RX_EIO, "%s", why ? why->msg : "aborted");
    return s_fail (g, -1, &e);
}

int rx_zgroup_status (const rx_zgroup_t *g, struct rx_err *err)
{
    return s_check (g, err);
}
