/* tests/sampling_ref.h -- rx_sampler_sample_with as it was before the radix
 * sort (core/sampling.c): the full qsort_r of the candidates by larger
 * logit, then lower id.  The reference the radix sort must match draw for
 * draw (tests/unit/test_sampling.c) and the "before" of its benchmark
 * (bench/sampling_bench.c).  Header-only, file-local functions; the
 * includer provides <math.h>, <stdlib.h> and "sampling.h". */
#ifndef RX_TESTS_SAMPLING_REF_H
#define RX_TESTS_SAMPLING_REF_H

static uint64_t s_ref_next (uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int s_ref_cmp (const void *a, const void *b, void *ud)
{
    const float *l = ud;
    int32_t i = *(const int32_t *) a, j = *(const int32_t *) b;
    float x = l[i], y = l[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

static int s_ref_before (const float *l, int32_t i, int32_t j)
{
    return l[i] > l[j] || (l[i] == l[j] && i < j);
}

static void s_ref_sift (const float *l, int32_t *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && s_ref_before (l, h[c], h[c + 1])) c++;
        if (!s_ref_before (l, h[i], h[c])) return;
        int32_t t = h[i]; h[i] = h[c]; h[c] = t;
        i = c;
    }
}

static int32_t s_ref_sample (const struct rx_sampling *p, uint64_t *state, const float *logits,
                             int32_t V, int32_t *idx, float *val)
{
    if (p->temperature <= 0 || p->top_k == 1)
        return rx_argmax (logits, V);
    int32_t n = 0;
    int32_t k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
    if (k) {
        for (int32_t i = 0; i < V; i++) {
            if (!isfinite (logits[i])) continue;
            if (n < k) {
                idx[n++] = i;
                if (n == k)
                    for (int32_t j = k / 2 - 1; j >= 0; j--) s_ref_sift (logits, idx, n, j);
            } else if (s_ref_before (logits, i, idx[0])) {
                idx[0] = i;
                s_ref_sift (logits, idx, n, 0);
            }
        }
    } else {
        for (int32_t i = 0; i < V; i++)
            if (isfinite (logits[i])) idx[n++] = i;
    }
    if (n == 0) return 0;
    double mx;
    if (k || p->top_p < 1 || p->min_p > 0) {
        qsort_r (idx, (size_t) n, sizeof *idx, s_ref_cmp, (void *) logits);
        mx = logits[idx[0]];
    } else {
        mx = logits[idx[0]];
        for (int32_t i = 1; i < n; i++)
            if (logits[idx[i]] > mx) mx = logits[idx[i]];
    }
    const double inv_t = 1.0 / p->temperature;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = exp (((double) logits[idx[i]] - mx) * inv_t);
        val[i] = (float) e;
        sum += e;
    }
    int32_t keep = n;
    if (p->top_p < 1) {
        double acc = 0;
        for (int32_t i = 0; i < n; i++) {
            acc += val[i] / sum;
            if (acc >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        int32_t j = 1;
        while (j < keep && val[j] >= p->min_p * val[0]) j++;
        keep = j;
    }
    double tot = 0;
    for (int32_t i = 0; i < keep; i++) tot += val[i];
    double r = (double) (s_ref_next (state) >> 11) * (1.0 / 9007199254740992.0) * tot;
    double acc = 0;
    for (int32_t i = 0; i < keep; i++) {
        acc += val[i];
        if (r < acc) return idx[i];
    }
    return idx[keep - 1];
}

#endif /* RX_TESTS_SAMPLING_REF_H */
