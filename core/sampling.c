/* core/sampling.c -- see sampling.h. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"

struct rx_sampler {
    struct rx_sampling p;
    int32_t n_vocab;
    uint64_t state;        /* splitmix64 */
    int32_t *idx;          /* [n_vocab] candidate ids */
    float *val;            /* [n_vocab] scratch values */
    uint64_t *rs;          /* [2 * n_vocab] radix sort items and their copy */
    uint32_t hist[3][2048];   /* radix sort bucket counts (11-bit digits) */
};

void rx_sampling_defaults (struct rx_sampling *p)
{
    p->temperature = 0;
    p->top_k = 0;
    p->top_p = 1;
    p->min_p = 0;
    p->seed = 0;
}

rx_sampler_t *rx_sampler_new (const struct rx_sampling *p, int32_t n_vocab, struct rx_err *err)
{
    if (n_vocab < 1) {
        rx_err_set (err, RX_EINVAL, "sampling: vocabulary of %d tokens", n_vocab);
        return NULL;
    }
    if (isnan (p->temperature) || isinf (p->temperature)) {
        rx_err_set (err, RX_EINVAL, "sampling: temperature must be a finite number");
        return NULL;
    }
    if (p->top_k < 0) {
        rx_err_set (err, RX_EINVAL, "sampling: top_k %d must be >= 0 (0 = off)", p->top_k);
        return NULL;
    }
    if (!(p->top_p > 0 && p->top_p <= 1)) {
        rx_err_set (err, RX_EINVAL, "sampling: top_p %g must be in (0, 1]", (double) p->top_p);
        return NULL;
    }
    if (!(p->min_p >= 0 && p->min_p < 1)) {
        rx_err_set (err, RX_EINVAL, "sampling: min_p %g must be in [0, 1)", (double) p->min_p);
        return NULL;
    }
    rx_sampler_t *s = calloc (1, sizeof *s);
    if (s) {
        s->idx = malloc ((size_t) n_vocab * sizeof *s->idx);
        s->val = malloc ((size_t) n_vocab * sizeof *s->val);
        s->rs = malloc (2 * (size_t) n_vocab * sizeof *s->rs);
    }
    if (!s || !s->idx || !s->val || !s->rs) {
        rx_sampler_destroy (&s);
        rx_err_set (err, RX_ENOMEM, "sampling: out of memory");
        return NULL;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    s->state = p->seed;
    return s;
}

void rx_sampler_destroy (rx_sampler_t **self_p)
{
    if (!self_p || !*self_p) return;
    free ((*self_p)->idx);
    free ((*self_p)->val);
    free ((*self_p)->rs);
    free (*self_p);
    *self_p = NULL;
}

int32_t rx_argmax (const float *x, int32_t n)
{
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan (x[i]) && (best < 0 || x[i] > x[best]))
            best = i;
    return best < 0 ? 0 : best;
}

static uint64_t s_next (uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double s_uniform (uint64_t *state)
{
    return (double) (s_next (state) >> 11) * (1.0 / 9007199254740992.0);
}

/* Order: larger logit first, then lower id (qsort_r: no shared state). */
static int s_cmp (const void *a, const void *b, void *ud)
{
    const float *l = ud;
    int32_t i = *(const int32_t *) a, j = *(const int32_t *) b;
    float x = l[i], y = l[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

static int s_before (const float *l, int32_t i, int32_t j)
{
    return l[i] > l[j] || (l[i] == l[j] && i < j);
}

/* Sift-down for a min-heap (the "worst" candidate on top) of ids by s_before. */
static void s_sift (const float *l, int32_t *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && s_before (l, h[c], h[c + 1])) c++;
        if (!s_before (l, h[i], h[c])) return;
        int32_t t = h[i]; h[i] = h[c]; h[c] = t;
        i = c;
    }
}

/* Sorting every finite logit (top_p / min_p without top_k: what every
 * OpenAI client asks for, the API has no top_k) with qsort_r costs
 * ~n log2 n = 2.2M indirect comparisons for a 128k vocabulary: 20-25 ms a
 * row on the 2-core development box, every decode step; 64 sampled
 * requests would spend a second or more a step on the host while the GPU
 * step takes ~10 ms.  An LSD radix sort of (32-bit key, id) items is 3
 * linear passes of 11-bit digits: ~1 ms for 128k there, and the whole
 * sample ~2.5-3 ms, of which ~1.7 ms (exp over every candidate, the cuts,
 * the draw) is what plain sampling pays as well (bench/sampling-bench,
 * docs/benchmarks.md).  4 passes of 8 bits measured no faster.
 *
 * The order is exactly s_cmp's, so the double sums below run in the same
 * order and every seed draws the same tokens as the qsort version did
 * (tests/unit/test_sampling.c checks it against a copy of that code): the
 * key maps a finite float to a uint32 that decreases as the float
 * increases (s_key), -0.0 and +0.0 map to the same key (s_cmp finds them
 * equal), and the items enter in ascending id order through stable
 * passes, so equal keys stay lower id first.  Only finite logits get here
 * (NaN would have no place in the order). */
static uint32_t s_key (float f)
{
    uint32_t u;
    memcpy (&u, &f, sizeof u);
    if (u == 0x80000000u) u = 0;   /* -0.0 is +0.0 */
    /* Descending: a positive float keeps its sign bit 0 and flips the rest
     * (larger magnitude, smaller key); a negative one keeps all its bits
     * (sign 1: after every positive; larger magnitude, larger key).  No
     * branch on the sign: logits are half negative, a mispredicted branch
     * per token made this loop 5x slower. */
    return u ^ (~(uint32_t) ((int32_t) u >> 31) & 0x7fffffffu);
}

/* Sort a[0..n) (key << 32 | id) ascending by key, stably, using tmp[0..n)
 * and the histograms h (filled by the caller while building a); returns
 * the array that holds the result (a or tmp).  A digit that is the same
 * for every item moves nothing and is skipped. */
static uint64_t *s_radix_sort (uint64_t *a, uint64_t *tmp, int32_t n, uint32_t h[3][2048])
{
    uint64_t *src = a, *dst = tmp;
    for (int pass = 0; pass < 3; pass++) {
        const int shift = 32 + 11 * pass;
        uint32_t *c = h[pass];
        if (c[(src[0] >> shift) & 2047] == (uint32_t) n) continue;
        uint32_t off = 0;
        for (int b = 0; b < 2048; b++) {
            uint32_t t = c[b];
            c[b] = off;
            off += t;
        }
        for (int32_t i = 0; i < n; i++) dst[c[(src[i] >> shift) & 2047]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* The cuts and the draw over candidates sorted best first, val their
 * (unnormalised) probabilities: shared by the whole-row sampler and the
 * device-candidate one, so both cut and draw alike. */

/* The shortest prefix of val[0..n) whose share of sum reaches top_p: its
 * length, or 0 when none does. */
static int32_t s_top_p_cut (const float *val, int32_t n, double sum, float top_p)
{
    double acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += val[i] / sum;
        if (acc >= top_p) return i + 1;
    }
    return 0;
}

/* The prefix of val[0..keep) (keep >= 1) at least min_p times val[0]. */
static int32_t s_min_p_cut (const float *val, int32_t keep, float min_p)
{
    int32_t j = 1;
    while (j < keep && val[j] >= min_p * val[0]) j++;
    return j;
}

/* idx[i] with probability val[i] / sum(val[0..keep)), for a uniform u in
 * [0, 1), walking best first. */
static int32_t s_draw_kept (const float *val, const int32_t *idx, int32_t keep, double u)
{
    double tot = 0;
    for (int32_t i = 0; i < keep; i++) tot += val[i];
    const double r = u * tot;
    double acc = 0;
    for (int32_t i = 0; i < keep; i++) {
        acc += val[i];
        if (r < acc) return idx[i];
    }
    return idx[keep - 1];
}

int32_t rx_sampler_sample (rx_sampler_t *s, const float *logits)
{
    return rx_sampler_sample_with (s, &s->p, &s->state, logits);
}

int32_t rx_sampler_sample_with (rx_sampler_t *s, const struct rx_sampling *p, uint64_t *state,
                                const float *logits)
{
    const int32_t V = s->n_vocab;
    if (p->temperature <= 0 || p->top_k == 1)
        return rx_argmax (logits, V);
    /* Candidates: finite logits only. */
    int32_t n = 0;
    int32_t k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
    if (k) {
        /* Keep the k best in a heap whose root is the worst kept. */
        for (int32_t i = 0; i < V; i++) {
            if (!isfinite (logits[i])) continue;
            if (n < k) {
                s->idx[n++] = i;
                if (n == k)
                    for (int32_t j = k / 2 - 1; j >= 0; j--) s_sift (logits, s->idx, n, j);
            } else if (s_before (logits, i, s->idx[0])) {
                s->idx[0] = i;
                s_sift (logits, s->idx, n, 0);
            }
        }
    } else if (p->top_p < 1 || p->min_p > 0) {
        /* All finite logits, sorted by radix sort (see s_key). */
        memset (s->hist, 0, sizeof s->hist);
        for (int32_t i = 0; i < V; i++) {
            if (!isfinite (logits[i])) continue;
            uint32_t key = s_key (logits[i]);
            s->hist[0][key & 2047]++;
            s->hist[1][(key >> 11) & 2047]++;
            s->hist[2][key >> 22]++;
            s->rs[n++] = (uint64_t) key << 32 | (uint32_t) i;
        }
        if (n > 0) {
            const uint64_t *r = s_radix_sort (s->rs, s->rs + V, n, s->hist);
            for (int32_t i = 0; i < n; i++) s->idx[i] = (int32_t) (uint32_t) r[i];
        }
    } else {
        for (int32_t i = 0; i < V; i++)
            if (isfinite (logits[i])) s->idx[n++] = i;
    }
    if (n == 0) return 0;
    /* Sorting is needed only to cut by rank or probability (top_k's k
     * survivors: qsort, k is small; the rest: sorted above); plain sampling
     * walks the candidates in id order (deterministic as well). */
    double mx;
    if (k || p->top_p < 1 || p->min_p > 0) {
        if (k) qsort_r (s->idx, (size_t) n, sizeof *s->idx, s_cmp, (void *) logits);
        mx = logits[s->idx[0]];
    } else {
        mx = logits[s->idx[0]];
        for (int32_t i = 1; i < n; i++)
            if (logits[s->idx[i]] > mx) mx = logits[s->idx[i]];
    }
    /* softmax of logits / T over the candidates */
    const double inv_t = 1.0 / p->temperature;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = exp (((double) logits[s->idx[i]] - mx) * inv_t);
        s->val[i] = (float) e;
        sum += e;
    }
    int32_t keep = n;
    if (p->top_p < 1) {
        const int32_t cut = s_top_p_cut (s->val, n, sum, p->top_p);
        if (cut) keep = cut;
    }
    /* sorted: val[0] is the best (exp(0) = 1). */
    if (p->min_p > 0) keep = s_min_p_cut (s->val, keep, p->min_p);
    return s_draw_kept (s->val, s->idx, keep, s_uniform (state));
}

/* ---- drawing from a device's candidates (see sampling.h) ------------------ */

int32_t rx_sampler_sample_cands (const struct rx_sampling *p, uint64_t *state, const float *probs,
                                 const int32_t *ids, int32_t k, int32_t n_vocab)
{
    const double u = s_uniform (state);
    if (p->temperature <= 0 || p->top_k == 1 || k < 1 || k > n_vocab) return RX_CANDS_FULL;
    /* n: the candidates with mass (descending, so zeros come last).  What
     * the device handed back must be a descending run of probabilities
     * with ids in range; anything else (a NaN row) goes to the host. */
    int32_t n = 0;
    for (int32_t i = 0; i < k; i++) {
        const float v = probs[i];
        if (!(v >= 0 && v <= 1.001f) || (i > 0 && v > probs[i - 1]) || ids[i] < 0 || ids[i] >= n_vocab)
            return RX_CANDS_FULL;
        if (v > 0) n = i + 1;
    }
    if (n == 0) return RX_CANDS_FULL;
    /* Every token with mass is a candidate: the whole row is here. */
    const int whole = n < k || k == n_vocab;
    const int32_t tk = p->top_k > 0 && p->top_k < n_vocab ? p->top_k : 0;
    int32_t keep = n;
    if (tk) {
        if (tk > k) return RX_CANDS_FULL;
        if (tk < keep) keep = tk;
        if (p->top_p < 1) {   /* over the top_k: their own softmax */
            double tot = 0;
            for (int32_t i = 0; i < keep; i++) tot += probs[i];
            const int32_t cut = s_top_p_cut (probs, keep, tot, p->top_p);
            if (cut) keep = cut;
        }
    } else if (p->top_p < 1) {   /* over the row: its probabilities sum to 1 */
        const int32_t cut = s_top_p_cut (probs, n, 1.0, p->top_p);
        if (!cut && !whole) return RX_CANDS_FULL;
        keep = cut ? cut : n;   /* whole: short of top_p by rounding only */
    }
    if (p->min_p > 0) {
        const int32_t j = s_min_p_cut (probs, keep, p->min_p);
        /* Every candidate passed and nothing else cut: the cut may lie
         * past the candidates. */
        if (j == keep && !tk && p->top_p >= 1 && !whole) return RX_CANDS_FULL;
        keep = j;
    }
    if (!tk && p->top_p >= 1 && p->min_p <= 0 && !whole) {
        /* Plain sampling: the row's mass is 1, the candidates hold part. */
        double acc = 0;
        for (int32_t i = 0; i < keep; i++) {
            acc += probs[i];
            if (u < acc) return ids[i];
        }
        return RX_CANDS_TAIL;
    }
    return s_draw_kept (probs, ids, keep, u);
}

/* ---- penalties, logit masks, log probabilities ---------------------------- */

void rx_penalties_apply (float *logits, int32_t n_vocab, const struct rx_penalties *pen,
                         const int32_t *prompt, size_t n_prompt, const int32_t *out, size_t n_out,
                         uint32_t *counts)
{
    const int freq = pen->frequency != 0 || pen->presence != 0;
    const int rep = pen->repetition != 1 && pen->repetition > 0;
    if (!freq && !rep) return;
    /* counts[t]: occurrences of t in out (low 31 bits); bit 31: t already
     * had the repetition penalty applied (each distinct token once). */
    const uint32_t SEEN = 0x80000000u;
    for (size_t i = 0; i < n_out; i++)
        if (out[i] >= 0 && out[i] < n_vocab) counts[out[i]]++;
    if (rep) {
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *t = pass ? out : prompt;
            size_t n = pass ? n_out : n_prompt;
            for (size_t i = 0; i < n; i++) {
                int32_t id = t[i];
                if (id < 0 || id >= n_vocab || (counts[id] & SEEN)) continue;
                counts[id] |= SEEN;
                float *l = &logits[id];
                *l = *l > 0 ? *l / pen->repetition : *l * pen->repetition;
            }
        }
    }
    for (size_t i = 0; i < n_out; i++) {
        int32_t id = out[i];
        if (id < 0 || id >= n_vocab) continue;
        uint32_t c = counts[id] & ~SEEN;
        if (c == 0) continue;   /* handled already (an earlier repeat of id) */
        logits[id] -= pen->frequency * (float) c + pen->presence;
        counts[id] &= SEEN;     /* count 0: later repeats skip it */
    }
    /* Leave the scratch zeroed for the next row. */
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < n_vocab) counts[prompt[i]] = 0;
    for (size_t i = 0; i < n_out; i++)
        if (out[i] >= 0 && out[i] < n_vocab) counts[out[i]] = 0;
}

void rx_logits_ban (float *logits, int32_t n_vocab, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < n_vocab) logits[ids[i]] = -INFINITY;
}

float rx_logprobs (const float *logits, int32_t n_vocab, int32_t chosen, int32_t n_top,
                   int32_t *top_ids, float *top_lp)
{
    /* log_softmax: x - (max + log sum exp (x - max)), in double. */
    double mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++)
        if (!isnan (logits[i]) && logits[i] > mx) mx = logits[i];
    double sum = 0;
    if (isfinite (mx))
        for (int32_t i = 0; i < n_vocab; i++)
            if (!isnan (logits[i])) sum += exp ((double) logits[i] - mx);
    const double lse = isfinite (mx) ? mx + log (sum) : INFINITY;
    /* top n_top by (value desc, id asc): insertion into a short sorted list. */
    int32_t k = 0;
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        float v = logits[i];
        if (isnan (v)) continue;
        if (k == n_top && !(v > logits[top_ids[k - 1]])) continue;
        int32_t j = k < n_top ? k++ : k - 1;
        while (j > 0 && v > logits[top_ids[j - 1]]) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    for (int32_t j = 0; j < k; j++) top_lp[j] = (float) ((double) logits[top_ids[j]] - lse);
    for (int32_t j = k; j < n_top; j++) {   /* fewer than n_top non-NaN values */
        top_ids[j] = -1;
        top_lp[j] = -INFINITY;
    }
    if (chosen < 0 || chosen >= n_vocab || isnan (logits[chosen])) return -INFINITY;
    return (float) ((double) logits[chosen] - lse);
}

static int s_pair_cmp (const void *a, const void *b)
{
    const struct rx_cand_pair *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t rx_cands_penalized (const int32_t *tok, const float *raw, const float *pen, int32_t m, int32_t k, float p1,
                            float t, int32_t *ids, float *probs, struct rx_cand_pair *scratch)
{
    if (!tok || !raw || !pen || !ids || !probs || !scratch || k < 1 || m < k || !(t > 0) || !isfinite (t))
        return -1;
    if (!isnormal (p1) || p1 < 0) return -1;
    for (int32_t q = 0; q < m; q++)
        if (isnan (raw[q]) || raw[q] == INFINITY || isnan (pen[q]) || pen[q] == INFINITY) return -1;
    const double l1 = raw[0], lk = raw[k - 1];
    if (!isfinite (l1)) return -1;
    const double S = 1.0 / (double) p1;
    double Sp = S;
    int32_t nh = 0;
    for (int32_t q = 0; q < m; q++) {
        const int moved = pen[q] != raw[q];
        if (moved) Sp += exp (((double) pen[q] - l1) / t) - exp (((double) raw[q] - l1) / t);
        if (moved ? pen[q] > lk : q < k) scratch[nh++] = (struct rx_cand_pair) { pen[q], tok[q] };
    }
    if (!(Sp > 1e-3 * S) || !isfinite (Sp) || nh == 0) return -1;
    qsort (scratch, (size_t) nh, sizeof *scratch, s_pair_cmp);
    for (int32_t q = 0; q < nh; q++) {
        ids[q] = scratch[q].id;
        probs[q] = (float) (exp (((double) scratch[q].l - l1) / t) / Sp);
    }
    return nh;
}

/* log of a candidate's probability: <= 0 (a rounded sum can leave the
 * best one a hair above 1, where the double log_softmax is <= 0). */
static float s_logp (float p)
{
    const double l = log ((double) p);
    return (float) (l < 0 ? l : 0);
}

int rx_logprobs_cands (const float *probs, const int32_t *ids, int32_t k, int32_t chosen, int32_t n_top,
                       float *lp, int32_t *top_ids, float *top_lp)
{
    if (!probs || !ids || k < 1 || n_top < 0 || n_top > k) return -1;
    int32_t at = -1;
    for (int32_t j = 0; j < k && at < 0; j++)
        if (ids[j] == chosen) at = j;
    /* isnormal: neither 0 (underflow, a -inf logit), subnormal, inf nor NaN */
    if (at < 0 || !isnormal (probs[at]) || probs[at] < 0) return -1;
    for (int32_t j = 0; j < n_top; j++)
        if (!isnormal (probs[j]) || probs[j] < 0) return -1;
    if (lp) *lp = s_logp (probs[at]);
    for (int32_t j = 0; j < n_top; j++) {
        if (top_ids) top_ids[j] = ids[j];
        if (top_lp) top_lp[j] = s_logp (probs[j]);
    }
    return 0;
}
