/* plugins/moe/ep.c -- the expert-parallel MoE dispatchers (radix/moe.h),
 * one source compiled three times (plugins/moe.am), EP_MODE picking the
 * descriptor, because a .so exports exactly one:
 *   EP_MODE 0  moe-ep_normal.so       EP_MODE 1  moe-ep_low_latency.so
 *   EP_MODE 2  moe-ep_auto.so
 *
 * Experts are sharded contiguously: rank r owns [r*NE/P, (r+1)*NE/P).
 * Every (token, choice) pair is one row (a token choosing two experts of
 * one rank is sent twice: simplest, and it keeps combine's order trivial).
 *
 * dispatch (both modes; low_latency's device path below does the same on
 * the device): the routing is copied to the host (the host
 * offsets of the ABI need the counts there anyway), the (t, j) pairs are
 * counting-sorted by global expert id, stable in (t, j) -- exactly
 * `local`'s order -- so the rows for peer p are one contiguous run, grouped
 * by p's local expert.  x rows are gathered into the send area in that
 * order, exchanged, and the receiver reorders them from (source rank,
 * expert) to (expert, source rank) order into routed.x: expert e's rows are
 * rank 0's tokens choosing e, then rank 1's, ..
 *
 *   normal: the per-(peer, expert) counts are exchanged first (an
 *     all_to_all_v of int32: I send p the counts of p's experts), then the
 *     rows with an all_to_all_v of exactly those sizes.  Dynamic shapes;
 *     the receive buffers grow on demand (up to P x max_tokens x k rows),
 *     so the memory follows the real load.  For prefill.
 *   low_latency: at create every peer gets a fixed slot block of
 *     B = H + S x n_embd floats, S = max_tokens x k rows, H = hrows x
 *     n_embd a header of whole rows (hrows = ceil(largest nl / n_embd))
 *     with the valid row count of each of the receiver's experts (int32
 *     bits, zeros after them): the block is hrows + S rows, the layout of
 *     the kernel ops moe_ll_pack / moe_ll_unpack (radix/kernel.h).
 *     dispatch is ONE all_to_all_v whose counts are B for every peer, every
 *     call; combine one of S x n_embd.  No count exchange on the critical
 *     path, the same buffers and sizes every call: that is what makes it
 *     capturable -- the collective's shape and addresses never change, so a
 *     graph of the step replays it (comm-nccl enqueues on the stream;
 *     comm-shm on kernels-cpu records it through host_fn).  The price:
 *     every call moves P x B floats whatever the batch, so keep max_tokens
 *     at the decode batch size.  For decode.
 *     Two paths.  The host path (routed.flags 0, and always for the
 *     asynchronous halves) sorts on the host and reads the receiver's P
 *     headers on the host (a synchronize each: the ABI's host offsets
 *     demand them).  The device path (routed.flags RX_MOE_ROUTED_DEVICE,
 *     blocking dispatch only, when the backend has moe_sort, gather_rows,
 *     moe_combine, moe_ll_pack and moe_ll_unpack) does the same on the
 *     device with no host copy and no synchronize, so a decode step with it
 *     can be captured as a graph (DeepEP's low-latency mode): moe_sort ->
 *     moe_ll_pack (headers, slot rows, slot_of) -> the exchange -> moe_ll_
 *     unpack (routed offsets, the recv row of each routed row and back) ->
 *     gather_rows into routed.x; routed.offsets NULL, d_offsets set, n_rows
 *     P x S (an upper bound).  combine: gather_rows of routed.y back into
 *     the receive blocks, the reverse exchange, one moe_combine over the
 *     send blocks (row = slot_of).  d_offsets - first_expert is valid as
 *     offsets over all NE experts (zero-length ranges outside this rank's:
 *     the header holds NE counts, zeros past the receiver's, and unpack
 *     reads NE - first of them), which matmul_grouped needs on a weight of
 *     every expert.  The sort, blocks, routed order and
 *     combine order are the host path's, so the outputs are bit for bit the
 *     host path's on kernels-cpu.  Its exchanges use count arrays set at
 *     create and never changed (a graph's all_to_all_v reads them at every
 *     launch on comm-shm).  An expert id out of range is left out of the
 *     layer there (the host path reports it); a backend that refuses
 *     moe_sort for the shape (RX_ENOTSUP) sends the instance to the host
 *     path for good.
 *   auto: normal or low-latency per call.  The ranks' n_tok differ, so the
 *     choice is made on the group's largest n_tok (an all_reduce MAX of one
 *     int32 first: every rank gets the same value and picks the same mode):
 *     low-latency when it is <= [moe.ep_auto] decode_max_tokens, else
 *     normal.  The low-latency buffers are sized from decode_max_tokens,
 *     not max_tokens.  Default decode_max_tokens 0 = the largest batch
 *     whose slot per peer fits 64 KiB, at most max_tokens (see
 *     DECODE_SLOT_BYTES: bench/moe-bench's crossover on comm-shm).  A
 *     caller that knows the group's largest n_tok passes it
 *     (routed.group_max_tok: the models do under DP attention, from the
 *     step's count exchange): no vote then, and a low-latency call asked
 *     for device offsets takes the device path below, as ep_low_latency.
 *
 * combine: routed.y goes back the way it came (reordered to (rank, expert)
 * order, the reverse all_to_all_v into the send area, in the rows the
 * tokens left from), then out[t] = w[t][0] y(t,0) + w[t][1] y(t,1) + .. in
 * choice order with the same kernel ops as `local` (scale, add, copy2d), so
 * the result equals `local`'s bitwise.  The send area is clobbered.
 *
 * ep_size 1 needs no comm: the "exchange" is one device copy.
 *
 * The asynchronous halves (radix/moe.h, two-batch overlap): dispatch_start
 * is everything up to the rows' exchange, which it starts (comm start());
 * dispatch_wait waits for it, reads the low-latency headers and reorders
 * into routed.x.  combine_start reorders routed.y and starts the reverse
 * exchange; combine_wait waits and sums into out.  The blocking dispatch /
 * combine are the same code with the exchange blocking.  What does not
 * overlap: normal's count exchange and auto's mode agreement (blocking
 * collectives inside dispatch_start, which on comm-shm first wait for the
 * operations already in flight -- the order every rank issues).  One
 * exchange in flight per instance (its send/receive areas and count arrays
 * belong to it): two micro-batches take two instances.
 *
 * Errors: a bad argument is found before the first collective of the call;
 * the failing rank returns it, and its peers, already in the collective,
 * time out (comm.h: the group is then broken and the core stops).
 * n_tok > max_tokens is RX_ERANGE before any memory is touched.
 *
 * Memory (device): normal: send area [max_tokens k][n_embd] at create,
 * receive + routed x/y grown on demand.  low-latency: 2 x P x B floats of
 * slots and routed x/y of P x S rows each, plus for the device path
 * 2 (NE + 1) + 4 S + P S + P (hrows + S) four-byte values, all at create.  Host scratch is
 * sized at create.  Thread-safety: see radix/moe.h. */
#include <stdint.h>
#include <string.h>

#include <radix/comm.h>
#include <radix/kernel.h>
#include <radix/moe.h>
#include <radix/plugin.h>

#define EP_NORMAL 0
#define EP_LL     1
#define EP_AUTO   2

#if !defined(EP_MODE)
#  error "compile with -DEP_MODE=0 (normal), 1 (low_latency) or 2 (auto)"
#elif EP_MODE == EP_NORMAL
#  define EP_NAME "ep_normal"
#elif EP_MODE == EP_LL
#  define EP_NAME "ep_low_latency"
#elif EP_MODE == EP_AUTO
#  define EP_NAME "ep_auto"
#else
#  error "bad EP_MODE"
#endif
#define EP_TAG "moe-" EP_NAME

#define EP_MAX_EXPERT 65536
#define EP_MAX_DIM    (1 << 20)
#define EP_MAX_RANKS  4096
/* ep_auto's default decode_max_tokens: the largest batch whose fixed slot
 * (batch x k x n_embd floats per peer) stays within 64 KiB.  Low-latency
 * saves one collective (the count exchange) but moves the whole slot every
 * call; on comm-shm that pays only while the slot copy is cheaper than a
 * collective round trip (bench/moe-bench: 1-4 tokens at k 4, n_embd 1024). */
#define DECODE_SLOT_BYTES ((size_t) 64 << 10)

struct ep {
    const struct rx_host *host;
    const struct rx_kernels_ops *K;
    void *be;
    rx_kstream_t *st;
    const struct rx_comm_ops *C;
    void *comm;
    int32_t NE, k, E, max_tokens, rank, P;
    int32_t nl;                 /* my local experts */
    int32_t ll_tokens;          /* low-latency slots are sized for this many tokens; 0 = no LL */

    /* host scratch, one allocation */
    void *hmem;
    int32_t *ids;               /* [max_tokens k] */
    float *w;                   /* [max_tokens k] */
    int32_t *row;               /* [max_tokens k]: sorted send row of choice (t, j) */
    int32_t *src;               /* [max_tokens k]: token of sorted row i */
    int32_t *cnt;               /* [NE + 1]: sorted rows of expert e are [cnt[e], cnt[e+1]) */
    int32_t *fill;              /* [NE] */
    int32_t *efirst;            /* [P + 1]: first global expert of rank p */
    int32_t *owner;             /* [NE]: rank owning expert e */
    int32_t *rcnt;              /* [P][nl]: rows from rank q for my expert e */
    int32_t *offsets;           /* [nl + 1]: routed.offsets */
    int32_t *hdr;               /* [H]: one header (low-latency) */
    size_t *sc, *sd, *rc, *rd;  /* [P] each: all_to_all_v arguments (elements) */
    size_t *rbase;              /* [P]: first row of rank q's rows in the receive area */

    /* device, normal mode */
    void *nmem;                 /* counts + send area */
    int32_t *dcnt_s;            /* [NE] */
    int32_t *dcnt_r;            /* [P nl] */
    int32_t *dmax;              /* [1]: auto's all_reduce */
    float *sendx;               /* [max_tokens k][E] */
    void *gmem;                 /* grown: receive area, routed x, routed y */
    float *recv, *rx, *ry;
    size_t cap;                 /* rows of each of the three */

    /* device, low-latency mode */
    void *lmem;
    size_t hrows;               /* header rows (of E floats) of a slot block */
    size_t H, S, B;             /* header floats (hrows E), rows per slot, floats per slot */
    float *lsend, *lrecv;       /* [P][B] */
    float *lrx, *lry;           /* [P S][E] */

    /* The low-latency device path (RX_MOE_ROUTED_DEVICE, see the top):
     * device scratch and the fixed all_to_all_v arguments, all set at
     * create and never changed (a captured graph's exchange reads the
     * arrays at every launch on comm-shm). */
    void *dmem;                 /* NULL: no device path (other mode, or backend lacks ops) */
    int32_t *d_off;             /* [NE + 1]: moe_sort offsets */
    int32_t *d_row, *d_src;     /* [S] each: moe_sort row / src */
    int32_t *d_slot;            /* [S]: moe_ll_pack slot_of (moe_combine's row) */
    float *d_w;                 /* [S]: the dispatch's weights */
    int32_t *d_goff;            /* [NE + 1]: routed offsets over ALL experts (zero-length
                                   ranges outside mine); routed.d_offsets = d_goff + first */
    int32_t *d_order;           /* [P S]: recv row of routed row r */
    int32_t *d_back;            /* [P (hrows + S)]: routed row of recv row i */
    size_t *dd_cnt, *dd_dsp;    /* [P]: dispatch exchange, B floats at q B (send = recv) */
    size_t *dc_cnt, *dc_dsp;    /* [P]: combine exchange, S E floats at q B + H */
    int dev;                    /* the last dispatch ran on the device */
    int no_dev;                 /* the backend refused moe_sort for our shape: host path for good */
    int dev_said;               /* the first device dispatch was logged */

    int mode;                   /* of the last dispatch */
    int32_t n_tok;              /* of the last dispatch; -1 = none */
    int32_t n_rows;

    /* The asynchronous halves (two-batch overlap): where the instance is
     * and the exchange in flight (NULL: none, or ep_size 1). */
    int phase;                  /* EP_IDLE, EP_DSTARTED, EP_DISPATCHED, EP_CSTARTED */
    rx_comm_req_t *req;
    int32_t pend_tok;           /* n_tok of the started dispatch */
    float *cout;                /* combine_start's out, ldo, flags */
    size_t cldo;
    uint32_t cflags;
};

enum { EP_IDLE = 0, EP_DSTARTED = 1, EP_DISPATCHED = 2, EP_CSTARTED = 3 };

static void s_destroy (void *p)
{
    struct ep *m = p;
    if (!m) return;
    /* An exchange still in flight owns our buffers: let it finish first. */
    if (m->req) m->C->wait (m->comm, m->req, NULL);
    m->req = NULL;
    if (m->nmem || m->gmem || m->lmem || m->dmem) m->K->synchronize (m->be, m->st, NULL);
    if (m->nmem) m->K->free_ (m->be, m->nmem);
    if (m->gmem) m->K->free_ (m->be, m->gmem);
    if (m->lmem) m->K->free_ (m->be, m->lmem);
    if (m->dmem) m->K->free_ (m->be, m->dmem);
    if (m->hmem) m->host->free_ (m->host, m->hmem);
    m->host->free_ (m->host, m);
}

#define EP_TRY(expr) do { int rc_ = (expr); if (rc_ != RX_OK) return rc_; } while (0)

static int s_alloc (struct ep *m, size_t bytes, void **d, const char *what, struct rx_err *err)
{
    int rc = m->K->alloc (m->be, bytes ? bytes : 64, 64, d, err);
    if (rc != RX_OK)
        return rx_err_set (err, rc, EP_TAG ": cannot allocate %.1f MiB of device memory for %s",
                           (double) bytes / (1024.0 * 1024.0), what);
    return RX_OK;
}

static int s_create (const struct rx_host *host, const struct rx_moe_config *cfg, void **out,
                     struct rx_err *err)
{
    if (!out) return rx_err_set (err, RX_EINVAL, EP_TAG ": create: NULL result pointer");
    *out = NULL;
    if (!host || !host->alloc || !cfg)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": create: NULL host or config");
    if (cfg->struct_size < offsetof (struct rx_moe_config, comm_inst) + sizeof cfg->comm_inst)
        return rx_err_set (err, RX_EABI, EP_TAG ": create: config struct too short (%u bytes)",
                           cfg->struct_size);
    if (!cfg->kops || !cfg->kbe)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": create: NULL kernel backend");
    const struct rx_kernels_ops *K = cfg->kops;
    if (!K->alloc || !K->free_ || !K->copy_d2h || !K->copy_h2d || !K->copy_d2d || !K->synchronize
        || !K->copy2d || !K->scale || !K->add)
        return rx_err_set (err, RX_EABI, EP_TAG ": kernel backend lacks alloc, free, copy_h2d/d2h/d2d, synchronize, copy2d, scale or add");
    if (cfg->n_expert <= 0 || cfg->n_expert > EP_MAX_EXPERT || cfg->n_expert_used <= 0
        || cfg->n_expert_used > cfg->n_expert || cfg->n_embd <= 0 || cfg->n_embd > EP_MAX_DIM
        || cfg->max_tokens <= 0 || cfg->max_tokens > (1 << 24))
        return rx_err_set (err, RX_EINVAL,
                           EP_TAG ": bad config: %d experts (1 .. %d), %d used per token (1 .. n_expert), n_embd %d (1 .. %d), max_tokens %d (1 .. %d)",
                           cfg->n_expert, EP_MAX_EXPERT, cfg->n_expert_used, cfg->n_embd, EP_MAX_DIM,
                           cfg->max_tokens, 1 << 24);
    if (cfg->ep_size < 1 || cfg->ep_size > EP_MAX_RANKS || cfg->ep_rank < 0
        || cfg->ep_rank >= cfg->ep_size || cfg->ep_size > cfg->n_expert)
        return rx_err_set (err, RX_EINVAL,
                           EP_TAG ": bad config: ep_rank %d of ep_size %d (1 .. min(%d, n_expert %d) ranks, each owning at least one expert)",
                           cfg->ep_rank, cfg->ep_size, EP_MAX_RANKS, cfg->n_expert);
    const struct rx_comm_ops *C = cfg->comm;
    if (cfg->ep_size > 1 && (!C || !cfg->comm_inst))
        return rx_err_set (err, RX_EINVAL, EP_TAG ": ep_size %d needs the expert-parallel group's comm (config.comm is NULL)",
                           cfg->ep_size);
    if (cfg->ep_size > 1
        && (!C->all_to_all_v || !C->start || !C->wait || (EP_MODE == EP_AUTO && !C->all_reduce)))
        return rx_err_set (err, RX_EABI, EP_TAG ": comm lacks all_to_all_v, start/wait or all_reduce");

    int64_t ll_tokens = EP_MODE == EP_LL ? cfg->max_tokens : 0;
#if EP_MODE == EP_AUTO
    int64_t dm = 0;
    if (host->cfg_int && host->cfg_int (host, "decode_max_tokens", &dm) != RX_OK) dm = 0;
    if (dm < 0)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": [moe.ep_auto] decode_max_tokens %lld < 0",
                           (long long) dm);
    if (dm == 0) {   /* the batch whose slot per peer is DECODE_SLOT_BYTES */
        dm = (int64_t) (DECODE_SLOT_BYTES / ((size_t) cfg->n_expert_used * (size_t) cfg->n_embd * sizeof (float)));
        if (dm < 1) dm = 1;
    }
    ll_tokens = dm < cfg->max_tokens ? dm : cfg->max_tokens;
#endif

    const size_t P = (size_t) cfg->ep_size, NE = (size_t) cfg->n_expert, E = (size_t) cfg->n_embd;
    const size_t R = (size_t) cfg->max_tokens * (size_t) cfg->n_expert_used;
    /* Worst cases: the normal receive area holds P x R rows (x3), the
     * low-latency slots 2 P (H + S E) + 2 P S E floats. */
    if (R > INT32_MAX / P || P * R > SIZE_MAX / E / 4 / sizeof (float))
        return rx_err_set (err, RX_EINVAL, EP_TAG ": %zu ranks x %d tokens x %d choices x %d floats overflow",
                           P, cfg->max_tokens, cfg->n_expert_used, cfg->n_embd);

    struct ep *m = host->alloc (host, sizeof *m, 0);
    if (!m) return rx_err_set (err, RX_ENOMEM, EP_TAG ": out of memory");
    memset (m, 0, sizeof *m);
    m->host = host;
    m->K = K;
    m->be = cfg->kbe;
    m->st = cfg->stream;
    m->C = cfg->ep_size > 1 ? C : NULL;
    m->comm = cfg->ep_size > 1 ? cfg->comm_inst : NULL;
    m->NE = cfg->n_expert;
    m->k = cfg->n_expert_used;
    m->E = cfg->n_embd;
    m->max_tokens = cfg->max_tokens;
    m->rank = cfg->ep_rank;
    m->P = cfg->ep_size;
    m->ll_tokens = (int32_t) ll_tokens;
    m->n_tok = -1;
    m->mode = EP_MODE == EP_LL ? EP_LL : EP_NORMAL;
    const int32_t first = (int32_t) ((int64_t) m->rank * m->NE / m->P);
    m->nl = (int32_t) ((int64_t) (m->rank + 1) * m->NE / m->P) - first;
    const size_t nl = (size_t) m->nl;
    /* The low-latency header: whole rows of E floats (moe_ll_pack's
     * layout), so a block is hrows + S rows.  It holds NE counts, not just
     * the largest rank's ceil(NE / P): the device path unpacks the counts
     * of experts first .. NE-1 (mine, then the header's zeros) so that its
     * offsets cover every expert (see d_goff).  One row while NE <= E. */
    m->hrows = (NE + E - 1) / E;
    m->H = m->hrows * E;
    m->S = (size_t) m->ll_tokens * (size_t) m->k;
    m->B = m->H + m->S * E;

    size_t hbytes = R * (3 * sizeof (int32_t) + sizeof (float)) + (NE + 1 + NE + NE) * sizeof (int32_t)
                    + (P + 1) * sizeof (int32_t) + (P * nl + nl + 1 + m->H) * sizeof (int32_t) + 64
                    + 9 * P * sizeof (size_t);
    if (!(m->hmem = host->alloc (host, hbytes, 64))) {
        s_destroy (m);
        return rx_err_set (err, RX_ENOMEM, EP_TAG ": out of memory (%zu bytes of routing scratch)", hbytes);
    }
    size_t *zp = m->hmem;
    m->sc = zp; m->sd = zp + P; m->rc = zp + 2 * P; m->rd = zp + 3 * P; m->rbase = zp + 4 * P;
    m->dd_cnt = zp + 5 * P; m->dd_dsp = zp + 6 * P; m->dc_cnt = zp + 7 * P; m->dc_dsp = zp + 8 * P;
    m->ids = (int32_t *) (zp + 9 * P);
    m->w = (float *) (m->ids + R);
    m->row = (int32_t *) (m->w + R);
    m->src = m->row + R;
    m->cnt = m->src + R;
    m->fill = m->cnt + NE + 1;
    m->owner = m->fill + NE;
    m->efirst = m->owner + NE;
    m->rcnt = m->efirst + P + 1;
    m->offsets = m->rcnt + P * nl;
    m->hdr = m->offsets + nl + 1;
    for (size_t p = 0; p <= P; p++) m->efirst[p] = (int32_t) ((int64_t) p * m->NE / m->P);
    for (size_t p = 0; p < P; p++)
        for (int32_t e = m->efirst[p]; e < m->efirst[p + 1]; e++) m->owner[e] = (int32_t) p;

    int rc;
    void *d;
    if (EP_MODE != EP_LL) {
        /* counts (NE + P nl + 1 int32, padded to 64 bytes) then the send area */
        size_t ci = (NE + P * nl + 1 + 15) / 16 * 16;
        if ((rc = s_alloc (m, ci * sizeof (int32_t) + R * E * sizeof (float), &d, "the send rows", err))) {
            s_destroy (m);
            return rc;
        }
        m->nmem = d;
        m->dcnt_s = d;
        m->dcnt_r = m->dcnt_s + NE;
        m->dmax = m->dcnt_r + P * nl;
        m->sendx = (float *) ((int32_t *) d + ci);
    }
    if (m->ll_tokens > 0) {
        size_t fl = 2 * P * m->B + 2 * P * m->S * E;
        if ((rc = s_alloc (m, fl * sizeof (float), &d, "the low-latency slots", err))) {
            s_destroy (m);
            return rc;
        }
        m->lmem = d;
        m->lsend = d;
        m->lrecv = m->lsend + P * m->B;
        m->lrx = m->lrecv + P * m->B;
        m->lry = m->lrx + P * m->S * E;
    }
    /* The device path (low-latency only, see the top): sort, pack, unpack
     * and combine on the device. */
    const int dev_ops = EP_MODE != EP_NORMAL && m->ll_tokens > 0 && RX_HAS (struct rx_kernels_ops, K, moe_ll_unpack) && K->moe_sort
                        && K->gather_rows && K->moe_combine && K->moe_ll_pack && K->moe_ll_unpack;
    if (dev_ops) {
        /* int32 / float arrays, each padded to 16 elements (64 bytes) */
#define EP_PAD(n) (((size_t) (n) + 15) / 16 * 16)
        const size_t S = m->S, o_off = 0, o_row = o_off + EP_PAD (NE + 1), o_src = o_row + EP_PAD (S),
                     o_slot = o_src + EP_PAD (S), o_w = o_slot + EP_PAD (S), o_goff = o_w + EP_PAD (S),
                     o_ord = o_goff + EP_PAD (NE + 1), o_back = o_ord + EP_PAD (P * S),
                     words = o_back + EP_PAD (P * (m->hrows + S));
#undef EP_PAD
        if ((rc = s_alloc (m, words * 4, &d, "the device routing", err))) {
            s_destroy (m);
            return rc;
        }
        m->dmem = d;
        int32_t *w0 = d;
        m->d_off = w0 + o_off;
        m->d_row = w0 + o_row;
        m->d_src = w0 + o_src;
        m->d_slot = w0 + o_slot;
        m->d_w = (float *) (w0 + o_w);
        m->d_goff = w0 + o_goff;
        m->d_order = w0 + o_ord;
        m->d_back = w0 + o_back;
        for (size_t q = 0; q < P; q++) {
            m->dd_cnt[q] = m->B;
            m->dd_dsp[q] = q * m->B;
            m->dc_cnt[q] = m->S * E;
            m->dc_dsp[q] = q * m->B + m->H;
        }
        /* d_goff's entries before my experts stay 0 (moe_ll_unpack writes
         * from my first on): set once here.  m->fill is NE int32 of host
         * scratch, free at create. */
        const int32_t firstx = m->efirst[m->rank];
        if (firstx > 0) {
            memset (m->fill, 0, (size_t) firstx * sizeof (int32_t));
            if ((rc = K->copy_h2d (m->be, m->st, m->d_goff, m->fill, (size_t) firstx * sizeof (int32_t), err))
                || (rc = K->synchronize (m->be, m->st, err))) {
                s_destroy (m);
                return rc;
            }
        }
    }
    *out = m;
    return RX_OK;
}

/* The all_to_all_v of the arrays sc, sd, rc, rd (m's own, or the device
 * path's fixed ones); ep_size 1 copies. */
static int s_a2a_arr (struct ep *m, const void *send, const size_t *sc, const size_t *sd, void *recv,
                      const size_t *rc_, const size_t *rd, int dtype, struct rx_err *err)
{
    if (m->P == 1) {
        if (!sc[0]) return RX_OK;
        const size_t es = rx_comm_dtype_size (dtype);
        return m->K->copy_d2d (m->be, m->st, (char *) recv + rd[0] * es, (const char *) send + sd[0] * es,
                               sc[0] * es, err);
    }
    int rc = m->C->all_to_all_v (m->comm, m->st, send, sc, sd, recv, rc_, rd, dtype, err);
    if (rc != RX_OK) return rx_err_set (err, rc, EP_TAG " rank %d: %s", m->rank, err ? err->msg : "");
    return RX_OK;
}

static int s_a2a (struct ep *m, const void *send, void *recv, int dtype, struct rx_err *err)
{
    return s_a2a_arr (m, send, m->sc, m->sd, recv, m->rc, m->rd, dtype, err);
}

/* s_a2a_arr, started (async) or blocking: started, m->req holds the
 * exchange (the arrays stay untouched until s_a2a_wait); ep_size 1 copies
 * at once either way. */
static int s_a2a_go_arr (struct ep *m, const void *send, const size_t *sc, const size_t *sd, void *recv,
                         const size_t *rc_, const size_t *rd, int dtype, int async, struct rx_err *err)
{
    if (!async || m->P == 1) return s_a2a_arr (m, send, sc, sd, recv, rc_, rd, dtype, err);
    const struct rx_comm_op op = {
        .struct_size = sizeof op, .kind = RX_COMM_ALL_TO_ALL_V, .dtype = dtype, .send = send,
        .recv = recv, .send_counts = sc, .send_displs = sd, .recv_counts = rc_,
        .recv_displs = rd, .stream = m->st,
    };
    int rc = m->C->start (m->comm, &op, &m->req, err);
    if (rc != RX_OK) {
        m->req = NULL;
        return rx_err_set (err, rc, EP_TAG " rank %d: %s", m->rank, err ? err->msg : "");
    }
    return RX_OK;
}

static int s_a2a_go (struct ep *m, const void *send, void *recv, int dtype, int async,
                     struct rx_err *err)
{
    return s_a2a_go_arr (m, send, m->sc, m->sd, recv, m->rc, m->rd, dtype, async, err);
}

static int s_a2a_wait (struct ep *m, struct rx_err *err)
{
    if (!m->req) return RX_OK;
    rx_comm_req_t *q = m->req;
    m->req = NULL;   /* wait frees it, success or not */
    int rc = m->C->wait (m->comm, q, err);
    if (rc != RX_OK) return rx_err_set (err, rc, EP_TAG " rank %d: %s", m->rank, err ? err->msg : "");
    return RX_OK;
}

/* Where row i of rank q's rows sits in the receive area. */
static float *s_rrow (struct ep *m, int mode, int32_t q, size_t i)
{
    const size_t E = (size_t) m->E;
    if (mode == EP_NORMAL) return m->recv + (m->rbase[q] + i) * E;
    return m->lrecv + (size_t) q * m->B + m->H + i * E;
}

/* Peer of sorted row i: the owner of its expert.  Rows of peer p are
 * [cnt[efirst[p]], cnt[efirst[p+1]]). */
static float *s_send_row (struct ep *m, int mode, int32_t i, int32_t *peer)
{
    const size_t E = (size_t) m->E;
    if (mode == EP_NORMAL) {
        *peer = 0;
        return m->sendx + (size_t) i * E;
    }
    /* the last peer whose first row is <= i (binary search over P) */
    int32_t lo = 0, hi = m->P - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (m->cnt[m->efirst[mid]] <= i) lo = mid; else hi = mid - 1;
    }
    *peer = lo;
    return m->lsend + (size_t) lo * m->B + m->H + (size_t) (i - m->cnt[m->efirst[lo]]) * E;
}

static int s_grow (struct ep *m, size_t rows, struct rx_err *err)
{
    if (rows <= m->cap && m->gmem) return RX_OK;
    size_t want = rows + rows / 2;
    const size_t most = (size_t) m->P * (size_t) m->max_tokens * (size_t) m->k;
    if (want > most) want = most;
    if (want < (size_t) m->max_tokens * (size_t) m->k) want = (size_t) m->max_tokens * (size_t) m->k;
    if (want < rows) want = rows;
    if (m->gmem) {
        m->K->synchronize (m->be, m->st, NULL);
        m->K->free_ (m->be, m->gmem);
        m->gmem = NULL;
        m->cap = 0;
    }
    void *d;
    EP_TRY (s_alloc (m, 3 * want * (size_t) m->E * sizeof (float), &d, "the received rows", err));
    m->gmem = d;
    m->recv = d;
    m->rx = m->recv + want * (size_t) m->E;
    m->ry = m->rx + want * (size_t) m->E;
    m->cap = want;
    return RX_OK;
}

/* The checks every dispatch starts with (before any collective). */
static int s_dcheck (struct ep *m, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                     const float *w, struct rx_err *err)
{
    if (m->phase == EP_DSTARTED || m->phase == EP_CSTARTED)
        return rx_err_set (err, RX_EINVAL, EP_TAG " rank %d: dispatch while an exchange is in flight (dispatch_wait / combine_wait first)",
                           m->rank);
    m->n_tok = -1;
    m->phase = EP_IDLE;
    m->dev = 0;
    if (n_tok < 0 || n_tok > m->max_tokens)
        return rx_err_set (err, n_tok < 0 ? RX_EINVAL : RX_ERANGE,
                           EP_TAG " rank %d: dispatch of %d tokens (0 .. max_tokens %d)", m->rank, n_tok,
                           m->max_tokens);
    if (n_tok > 0 && (!x || !ids || !w || ldx < (size_t) m->E))
        return rx_err_set (err, RX_EINVAL, EP_TAG ": dispatch: NULL x, ids or weights, or ldx %zu < n_embd %d",
                           ldx, m->E);
    return RX_OK;
}

/* The first half of a host-path dispatch: checks, routing to the host,
 * the sort, the gather into the send area and the exchanges -- the last
 * (the rows) started when async, so it runs while the caller computes.
 * normal: the count exchange before it is blocking (the rows' sizes depend
 * on it). */
static int s_dstart (struct ep *m, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                     const float *w, int async, int32_t gmax_hint, struct rx_err *err)
{
    EP_TRY (s_dcheck (m, x, ldx, n_tok, ids, w, err));
    const struct rx_kernels_ops *K = m->K;
    const int32_t k = m->k, NE = m->NE, P = m->P, nl = m->nl;
    const size_t n = (size_t) n_tok * (size_t) k, E = (size_t) m->E;
    if (n > 0) {
        EP_TRY (K->copy_d2h (m->be, m->st, m->ids, ids, n * sizeof *m->ids, err));
        EP_TRY (K->copy_d2h (m->be, m->st, m->w, w, n * sizeof *m->w, err));
        EP_TRY (K->synchronize (m->be, m->st, err));
    }
    /* Counting sort by global expert, stable in (token, choice). */
    memset (m->cnt, 0, ((size_t) NE + 1) * sizeof *m->cnt);
    for (size_t i = 0; i < n; i++) {
        int32_t e = m->ids[i];
        if (e < 0 || e >= NE)
            return rx_err_set (err, RX_EINVAL, EP_TAG ": dispatch: token %zu choice %zu: expert id %d out of 0 .. %d",
                               i / (size_t) k, i % (size_t) k, e, NE - 1);
        m->cnt[e + 1]++;
    }
    for (int32_t e = 0; e < NE; e++) {
        m->cnt[e + 1] += m->cnt[e];
        m->fill[e] = m->cnt[e];
    }
    for (size_t i = 0; i < n; i++) {
        m->row[i] = m->fill[m->ids[i]]++;
        m->src[m->row[i]] = (int32_t) (i / (size_t) k);
    }

    /* The mode of this call. */
    int mode = EP_MODE == EP_LL ? EP_LL : EP_NORMAL;
    (void) gmax_hint;
#if EP_MODE == EP_AUTO
    int32_t gmax = gmax_hint > 0 ? gmax_hint : n_tok;
    if (P > 1 && gmax_hint <= 0) {
        EP_TRY (K->copy_h2d (m->be, m->st, m->dmax, &gmax, sizeof gmax, err));
        int rc = m->C->all_reduce (m->comm, m->st, m->dmax, m->dmax, 1, RX_I32, RX_COMM_MAX, err);
        if (rc != RX_OK) return rx_err_set (err, rc, EP_TAG " rank %d: %s", m->rank, err ? err->msg : "");
        EP_TRY (K->copy_d2h (m->be, m->st, &gmax, m->dmax, sizeof gmax, err));
        EP_TRY (K->synchronize (m->be, m->st, err));
    }
    mode = gmax <= m->ll_tokens ? EP_LL : EP_NORMAL;
#endif

    /* Gather x into the send area: runs of consecutive tokens landing in
     * consecutive rows of one peer's block become one copy. */
    const int32_t n_rows_s = (int32_t) n;
    for (int32_t r = 0; r < n_rows_s;) {
        int32_t peer, peer2;
        float *dst = s_send_row (m, mode, r, &peer);
        int32_t len = 1;
        while (r + len < n_rows_s && m->src[r + len] == m->src[r] + len) {
            s_send_row (m, mode, r + len, &peer2);
            if (peer2 != peer) break;
            len++;
        }
        EP_TRY (K->copy2d (m->be, m->st, x + (size_t) m->src[r] * ldx, ldx, dst, E, (size_t) len, E, err));
        r += len;
    }

    if (mode == EP_NORMAL) {
        /* 1. counts: I send p the counts of p's experts. */
        for (int32_t e = 0; e < NE; e++) m->fill[e] = m->cnt[e + 1] - m->cnt[e];
        if (NE > 0) EP_TRY (K->copy_h2d (m->be, m->st, m->dcnt_s, m->fill, (size_t) NE * sizeof (int32_t), err));
        for (int32_t q = 0; q < P; q++) {
            m->sc[q] = (size_t) (m->efirst[q + 1] - m->efirst[q]);
            m->sd[q] = (size_t) m->efirst[q];
            m->rc[q] = (size_t) nl;
            m->rd[q] = (size_t) q * (size_t) nl;
        }
        EP_TRY (s_a2a (m, m->dcnt_s, m->dcnt_r, RX_I32, err));
        EP_TRY (K->copy_d2h (m->be, m->st, m->rcnt, m->dcnt_r, (size_t) P * (size_t) nl * sizeof (int32_t), err));
        EP_TRY (K->synchronize (m->be, m->st, err));
        size_t total = 0;
        for (int32_t q = 0; q < P; q++) {
            m->rbase[q] = total;
            for (int32_t e = 0; e < nl; e++) {
                int32_t c = m->rcnt[(size_t) q * nl + e];
                if (c < 0 || c > m->max_tokens * k)
                    return rx_err_set (err, RX_EIO, EP_TAG " rank %d: rank %d sent a row count %d for expert %d (0 .. %d)",
                                       m->rank, q, c, m->efirst[m->rank] + e, m->max_tokens * k);
                total += (size_t) c;
            }
        }
        EP_TRY (s_grow (m, total, err));
        /* 2. rows, exactly the counts. */
        for (int32_t q = 0; q < P; q++) {
            m->sc[q] = (size_t) (m->cnt[m->efirst[q + 1]] - m->cnt[m->efirst[q]]) * E;
            m->sd[q] = (size_t) m->cnt[m->efirst[q]] * E;
            m->rc[q] = (q + 1 < P ? m->rbase[q + 1] : total) - m->rbase[q];
            m->rc[q] *= E;
            m->rd[q] = m->rbase[q] * E;
        }
        EP_TRY (s_a2a_go (m, m->sendx, m->recv, RX_F32, async, err));
    } else {
        /* One fixed-size slot per peer: header (valid rows per expert of
         * the peer) then the rows. */
        for (int32_t q = 0; q < P; q++) {
            /* the counts and zeros up to NE (rounded to 16): the receiver
             * reads nl of them; the header's rest is not written here */
            const size_t hn = ((size_t) NE + 15) / 16 * 16 < m->H ? ((size_t) NE + 15) / 16 * 16 : m->H;
            memset (m->hdr, 0, hn * sizeof *m->hdr);
            for (int32_t e = m->efirst[q]; e < m->efirst[q + 1]; e++)
                m->hdr[e - m->efirst[q]] = m->cnt[e + 1] - m->cnt[e];
            EP_TRY (K->copy_h2d (m->be, m->st, m->lsend + (size_t) q * m->B, m->hdr, hn * sizeof *m->hdr, err));
            m->sc[q] = m->rc[q] = m->B;
            m->sd[q] = m->rd[q] = (size_t) q * m->B;
        }
        EP_TRY (s_a2a_go (m, m->lsend, m->lrecv, RX_F32, async, err));
    }
    m->mode = mode;
    m->pend_tok = n_tok;
    m->phase = EP_DSTARTED;
    return RX_OK;
}

/* The second half: wait for the rows, (low-latency) read the slot headers,
 * reorder (rank, expert) -> (expert, rank) into routed.x. */
static int s_dfinish (struct ep *m, struct rx_moe_routed *routed, struct rx_err *err)
{
    if (m->phase != EP_DSTARTED)
        return rx_err_set (err, RX_EINVAL, EP_TAG " rank %d: dispatch_wait without a started dispatch", m->rank);
    m->phase = EP_IDLE;
    EP_TRY (s_a2a_wait (m, err));
    const struct rx_kernels_ops *K = m->K;
    const int32_t P = m->P, nl = m->nl;
    const size_t E = (size_t) m->E;
    const int mode = m->mode;
    if (mode == EP_LL) {
        for (int32_t q = 0; q < P; q++) {
            EP_TRY (K->copy_d2h (m->be, m->st, m->rcnt + (size_t) q * nl, m->lrecv + (size_t) q * m->B,
                                 (size_t) nl * sizeof (int32_t), err));
        }
        EP_TRY (K->synchronize (m->be, m->st, err));
        for (int32_t q = 0; q < P; q++) {
            size_t tq = 0;
            for (int32_t e = 0; e < nl; e++) {
                int32_t c = m->rcnt[(size_t) q * nl + e];
                if (c < 0 || (size_t) c > m->S - tq)
                    return rx_err_set (err, RX_EIO, EP_TAG " rank %d: rank %d's slot header says %d rows for expert %d (slot of %zu rows)",
                                       m->rank, q, c, m->efirst[m->rank] + e, m->S);
                tq += (size_t) c;
            }
            m->rbase[q] = 0;
        }
    }

    /* Reorder (rank, expert) -> (expert, rank) into routed.x. */
    float *rxp = mode == EP_NORMAL ? m->rx : m->lrx;
    size_t at = 0;
    m->offsets[0] = 0;
    for (int32_t e = 0; e < nl; e++) {
        for (int32_t q = 0; q < P; q++) {
            size_t sub = 0;
            for (int32_t f = 0; f < e; f++) sub += (size_t) m->rcnt[(size_t) q * nl + f];
            size_t c = (size_t) m->rcnt[(size_t) q * nl + e];
            if (c) EP_TRY (K->copy2d (m->be, m->st, s_rrow (m, mode, q, sub), E, rxp + at * E, E, c, E, err));
            at += c;
        }
        m->offsets[e + 1] = (int32_t) at;
    }
    struct rx_moe_routed o = {
        .struct_size = routed->struct_size, .first_expert = m->efirst[m->rank], .n_local_expert = nl,
        .offsets = m->offsets, .n_rows = (int32_t) at, .x = rxp,
        .y = mode == EP_NORMAL ? m->ry : m->lry,
    };
    size_t sz = routed->struct_size < sizeof o ? routed->struct_size : sizeof o;
    memcpy (routed, &o, sz);
    m->n_rows = (int32_t) at;
    m->n_tok = m->pend_tok;
    m->phase = EP_DISPATCHED;
    return RX_OK;
}

static int s_routed_ok (const struct rx_moe_routed *routed, struct rx_err *err)
{
    if (routed->struct_size < offsetof (struct rx_moe_routed, y) + sizeof routed->y)
        return rx_err_set (err, RX_EABI, EP_TAG ": dispatch: routed struct too short (%u bytes)",
                           routed->struct_size);
    return RX_OK;
}

/* The low-latency dispatch on the device (see the top): the host path's
 * sort, blocks and routed order, without a host copy or a synchronize.
 * RX_ENOTSUP (err cleared) when the backend refuses moe_sort for the
 * shape: the caller takes the host path (for good: no_dev). */
static int s_dispatch_dev (struct ep *m, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                           const float *w, struct rx_moe_routed *routed, struct rx_err *err)
{
    EP_TRY (s_dcheck (m, x, ldx, n_tok, ids, w, err));
    const struct rx_kernels_ops *K = m->K;
    const size_t n = (size_t) n_tok * (size_t) m->k, E = (size_t) m->E, P = (size_t) m->P;
    int rc = K->moe_sort (m->be, m->st, ids, (size_t) n_tok, (size_t) m->k, (size_t) m->NE, m->d_off, m->d_row,
                          m->d_src, err);
    if (rc == RX_ENOTSUP) {
        rx_err_clear (err);
        m->no_dev = 1;
        return RX_ENOTSUP;
    }
    EP_TRY (rc);
    /* the weights are the instance's (the caller may reuse w, as on the
     * host path, which copies them to the host) */
    if (n > 0) EP_TRY (K->copy_d2d (m->be, m->st, m->d_w, w, n * sizeof (float), err));
    EP_TRY (K->moe_ll_pack (m->be, m->st, x, ldx, ids, m->d_off, m->d_row, m->d_src, (size_t) n_tok,
                            (size_t) m->k, (size_t) m->NE, P, m->S, m->hrows, E, m->lsend, m->d_slot, err));
    EP_TRY (s_a2a_arr (m, m->lsend, m->dd_cnt, m->dd_dsp, m->lrecv, m->dd_cnt, m->dd_dsp, RX_F32, err));
    /* n_local = NE - first: my experts' counts, then the header's zeros, so
     * d_goff + first gets [NE - first + 1] offsets: mine, then the total */
    const int32_t first = m->efirst[m->rank];
    EP_TRY (K->moe_ll_unpack (m->be, m->st, m->lrecv, P, m->S, m->hrows, E, (size_t) (m->NE - first),
                              m->d_goff + first, m->d_order, m->d_back, err));
    EP_TRY (K->gather_rows (m->be, m->st, m->lrecv, E, m->d_order, P * m->S, E, m->lrx, E, err));
    struct rx_moe_routed o = {
        .struct_size = routed->struct_size, .first_expert = m->efirst[m->rank], .n_local_expert = m->nl,
        .offsets = NULL, .n_rows = (int32_t) (P * m->S), .x = m->lrx, .y = m->lry,
        .flags = routed->flags, .d_offsets = m->d_goff + first,
    };
    memcpy (routed, &o, routed->struct_size < sizeof o ? routed->struct_size : sizeof o);
    m->mode = EP_LL;
    m->dev = 1;
    if (!m->dev_said) {
        m->dev_said = 1;
        RX_HLOG (m->host, RX_LOG_INFO,
                 "rank %d: dispatching on the device (moe_ll_pack / moe_ll_unpack: no routing on the host, graph-capturable)",
                 m->rank);
    }
    m->n_rows = (int32_t) (P * m->S);
    m->n_tok = n_tok;
    m->phase = EP_DISPATCHED;
    return RX_OK;
}

static int s_dispatch (void *p, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                       const float *w, struct rx_moe_routed *routed, struct rx_err *err)
{
    struct ep *m = p;
    if (!m || !routed)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": dispatch: NULL instance or routed");
    EP_TRY (s_routed_ok (routed, err));
    /* ep_auto: the group's largest n_tok from the caller (moe.h
     * group_max_tok) saves the mode vote; a hint below n_tok would make the
     * ranks disagree on the mode: refused before any collective. */
    const int32_t hint = routed->struct_size >= offsetof (struct rx_moe_routed, group_max_tok) + sizeof routed->group_max_tok
                             ? routed->group_max_tok : 0;
    if (hint > 0 && hint < n_tok)
        return rx_err_set (err, RX_EINVAL, EP_TAG " rank %d: dispatch: group_max_tok %d is below this rank's n_tok %d",
                           m->rank, hint, n_tok);
    /* The device path: ep_low_latency always; ep_auto when the hint says
     * the group is in low-latency range (its vote would read the host). */
    const int dev_mode = EP_MODE == EP_LL || (EP_MODE == EP_AUTO && hint > 0 && hint <= m->ll_tokens);
    if (dev_mode && m->dmem && !m->no_dev
        && routed->struct_size >= offsetof (struct rx_moe_routed, d_offsets) + sizeof routed->d_offsets
        && (routed->flags & RX_MOE_ROUTED_DEVICE)) {
        int rc = s_dispatch_dev (m, x, ldx, n_tok, ids, w, routed, err);
        if (rc != RX_ENOTSUP) return rc;
    }
    EP_TRY (s_dstart (m, x, ldx, n_tok, ids, w, 0, hint, err));
    return s_dfinish (m, routed, err);
}

static int s_dispatch_start (void *p, const float *x, size_t ldx, int32_t n_tok, const int32_t *ids,
                             const float *w, struct rx_err *err)
{
    struct ep *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, EP_TAG ": dispatch_start: NULL instance");
    return s_dstart (m, x, ldx, n_tok, ids, w, 1, 0, err);
}

static int s_dispatch_wait (void *p, struct rx_moe_routed *routed, struct rx_err *err)
{
    struct ep *m = p;
    if (!m || !routed)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": dispatch_wait: NULL instance or routed");
    if (m->phase == EP_DSTARTED && s_routed_ok (routed, err) != RX_OK) {
        /* The exchange is in flight: finish it (peers take part), then fail
         * with s_routed_ok's message. */
        struct rx_err e2 = { 0 };
        s_a2a_wait (m, &e2);
        m->phase = EP_IDLE;
        return RX_EABI;
    }
    return s_dfinish (m, routed, err);
}

/* The host path's half of s_cstart: routed.y back to (rank, expert) order
 * in the receive area, the reverse exchange started (async) or done. */
static int s_cstart_host (struct ep *m, int mode, int async, struct rx_err *err)
{
    const struct rx_kernels_ops *K = m->K;
    const int32_t P = m->P, nl = m->nl;
    const size_t E = (size_t) m->E;
    /* routed.y (expert, rank) -> the receive area in (rank, expert) order. */
    const float *ryp = mode == EP_NORMAL ? m->ry : m->lry;
    size_t at = 0;
    for (int32_t e = 0; e < nl; e++)
        for (int32_t q = 0; q < P; q++) {
            size_t sub = 0;
            for (int32_t f = 0; f < e; f++) sub += (size_t) m->rcnt[(size_t) q * nl + f];
            size_t c = (size_t) m->rcnt[(size_t) q * nl + e];
            if (c) EP_TRY (K->copy2d (m->be, m->st, ryp + at * E, E, s_rrow (m, mode, q, sub), E, c, E, err));
            at += c;
        }
    /* The reverse exchange: the rows return to where the tokens left from. */
    if (mode == EP_NORMAL) {
        for (int32_t q = 0; q < P; q++) {
            size_t rows = (q + 1 < P ? m->rbase[q + 1] : (size_t) m->n_rows) - m->rbase[q];
            m->sc[q] = rows * E;
            m->sd[q] = m->rbase[q] * E;
            m->rc[q] = (size_t) (m->cnt[m->efirst[q + 1]] - m->cnt[m->efirst[q]]) * E;
            m->rd[q] = (size_t) m->cnt[m->efirst[q]] * E;
        }
        EP_TRY (s_a2a_go (m, m->recv, m->sendx, RX_F32, async, err));
    } else {
        for (int32_t q = 0; q < P; q++) {
            m->sc[q] = m->rc[q] = m->S * E;
            m->sd[q] = m->rd[q] = (size_t) q * m->B + m->H;
        }
        EP_TRY (s_a2a_go (m, m->lrecv, m->lsend, RX_F32, async, err));
    }
    return RX_OK;
}

/* The first half of a combine: routed.y back to (rank, expert) order in the
 * receive area, the reverse exchange started (async) or done. */
static int s_cstart (struct ep *m, float *out, size_t ldo, uint32_t flags, int async, struct rx_err *err)
{
    if (m->phase == EP_DSTARTED || m->phase == EP_CSTARTED)
        return rx_err_set (err, RX_EINVAL, EP_TAG " rank %d: combine while an exchange is in flight (dispatch_wait / combine_wait first)",
                           m->rank);
    if (m->n_tok < 0 || m->phase != EP_DISPATCHED)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": combine without a successful dispatch before it");
    const int32_t n_tok = m->n_tok, P = m->P;
    const size_t E = (size_t) m->E;
    const int mode = m->mode;
    m->n_tok = -1;   /* combine consumes (and clobbers) the dispatch */
    m->phase = EP_IDLE;
    if (n_tok > 0 && (!out || ldo < E))
        return rx_err_set (err, RX_EINVAL, EP_TAG ": combine: NULL out or ldo %zu < n_embd %zu", ldo, E);
    if (flags & ~RX_MM_ACCUMULATE)
        return rx_err_set (err, RX_EINVAL, EP_TAG ": combine: unknown flags 0x%x", flags);
    const struct rx_kernels_ops *K = m->K;

    if (m->dev) {
        /* routed.y back into the receive blocks (header rows and unused
         * slot rows become zeros), then the slot parts go home. */
        EP_TRY (K->gather_rows (m->be, m->st, m->lry, E, m->d_back, (size_t) P * (m->hrows + m->S), E, m->lrecv, E,
                                err));
        EP_TRY (s_a2a_go_arr (m, m->lrecv, m->dc_cnt, m->dc_dsp, m->lsend, m->dc_cnt, m->dc_dsp, RX_F32, async, err));
    } else {
        EP_TRY (s_cstart_host (m, mode, async, err));
    }
    m->pend_tok = n_tok;
    m->cout = out;
    m->cldo = ldo;
    m->cflags = flags;
    m->phase = EP_CSTARTED;
    return RX_OK;
}

/* The second half: wait for the rows, then out[t] = sum_j w[t][j] y(t, j)
 * in choice order, as `local` does. */
static int s_cfinish (struct ep *m, struct rx_err *err)
{
    if (m->phase != EP_CSTARTED)
        return rx_err_set (err, RX_EINVAL, EP_TAG " rank %d: combine_wait without a started combine", m->rank);
    m->phase = EP_IDLE;
    EP_TRY (s_a2a_wait (m, err));
    const int32_t n_tok = m->pend_tok, k = m->k;
    const size_t E = (size_t) m->E, ldo = m->cldo;
    const uint32_t flags = m->cflags;
    const int mode = m->mode;
    const struct rx_kernels_ops *K = m->K;
    float *out = m->cout;
    if (m->dev) {
        /* one moe_combine: the host loop's float operations in its order */
        m->dev = 0;
        if (n_tok == 0) return RX_OK;
        return K->moe_combine (m->be, m->st, m->lsend, E, m->d_slot, m->d_w, (size_t) n_tok, (size_t) k, E, out,
                               ldo, flags, err);
    }
    for (int32_t t = 0; t < n_tok; t++) {
        const int32_t *row = m->row + (size_t) t * k;
        const float *w = m->w + (size_t) t * k;
        int32_t peer;
        float *acc = s_send_row (m, mode, row[0], &peer);
        float *o = out + (size_t) t * ldo;
        if (k == 1 && !(flags & RX_MM_ACCUMULATE)) {
            EP_TRY (K->scale (m->be, m->st, acc, E, o, E, 1, E, w[0], err));
            continue;
        }
        EP_TRY (K->scale (m->be, m->st, acc, E, acc, E, 1, E, w[0], err));
        for (int32_t j = 1; j < k; j++) {
            float *yj = s_send_row (m, mode, row[j], &peer);
            EP_TRY (K->scale (m->be, m->st, yj, E, yj, E, 1, E, w[j], err));
            EP_TRY (K->add (m->be, m->st, acc, E, yj, E, acc, E, 1, E, err));
        }
        if (flags & RX_MM_ACCUMULATE)
            EP_TRY (K->add (m->be, m->st, o, E, acc, E, o, E, 1, E, err));
        else
            EP_TRY (K->copy2d (m->be, m->st, acc, E, o, E, 1, E, err));
    }
    return RX_OK;
}

static int s_combine (void *p, float *out, size_t ldo, uint32_t flags, struct rx_err *err)
{
    struct ep *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, EP_TAG ": combine: NULL instance");
    EP_TRY (s_cstart (m, out, ldo, flags, 0, err));
    return s_cfinish (m, err);
}

static int s_combine_start (void *p, float *out, size_t ldo, uint32_t flags, struct rx_err *err)
{
    struct ep *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, EP_TAG ": combine_start: NULL instance");
    return s_cstart (m, out, ldo, flags, 1, err);
}

static int s_combine_wait (void *p, struct rx_err *err)
{
    struct ep *m = p;
    if (!m) return rx_err_set (err, RX_EINVAL, EP_TAG ": combine_wait: NULL instance");
    return s_cfinish (m, err);
}

static const struct rx_moe_ops s_ops = {
    .struct_size = sizeof (struct rx_moe_ops),
    .create = s_create,
    .destroy = s_destroy,
    .dispatch = s_dispatch,
    .combine = s_combine,
    .dispatch_start = s_dispatch_start,
    .dispatch_wait = s_dispatch_wait,
    .combine_start = s_combine_start,
    .combine_wait = s_combine_wait,
};

#if EP_MODE == EP_AUTO
static const struct rx_cfg_key s_keys[] = {
    { "decode_max_tokens", RX_CFG_INT, "0",
      "low-latency mode when the group's largest batch (tokens per rank) is at most this, else normal; its slots are sized from it; 0 = the largest batch whose slot per peer (tokens x k x n_embd floats) fits 64 KiB",
      0, 16777216.0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};
#  define EP_KEYS .keys = s_keys,
#  define EP_DESC "expert-parallel MoE dispatcher: low-latency for small (decode) batches, normal for large (prefill) ones, chosen per call on the group's largest batch"
#elif EP_MODE == EP_LL
#  define EP_KEYS
#  define EP_DESC "expert-parallel MoE dispatcher, low-latency: fixed slots per peer sized from max_tokens, one fixed-shape all_to_all_v each way (decode)"
#else
#  define EP_KEYS
#  define EP_DESC "expert-parallel MoE dispatcher, normal: exchanges the per-expert counts, then all_to_all_v of the real rows (prefill)"
#endif

RX_PLUGIN_DEFINE (.kind = RX_KIND_MOE, .name = EP_NAME, .version = "0.1.0", .description = EP_DESC,
                  EP_KEYS .ops = &s_ops)
