/* tests/unit/test_models_ref.c -- the llama model plugin against reference
 * logits computed by another engine (llama.cpp), as
 * $RADIX_SHARED/data/models/README.md "How to compare" says:
 *   1. tokenizing each prompt with BOS gives prompt_ids;
 *   2. teacher-forced logits at every position: the 10 listed ids within
 *      tol, and the argmax equal to the reference where top2_gap > 2 tol;
 *   3. free-running greedy: the 32 tokens equal greedy_ids up to the first
 *      step whose reference gap is below 2 tol.
 * Each model runs the real plugins (model-llama, attn-mha, kernels-cpu)
 * through the engine, in several batch shapes: the whole sequence as one
 * prefill, one token at a time, two sequences batched together with mixed
 * prefill and decode steps, and scattered (non-contiguous, interleaved) KV
 * slots.  Tolerances: 1e-3 for the F32/F16 model, 0.1 for Q8_0/Q4_0 (the
 * kernels quantize activations to Q8_0 as llama.cpp does).
 *
 * No Criterion .timeout here: with it, Criterion 2.4 sometimes loses a
 * finished worker and hangs (Snaipe/Criterion#345). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot.h"
#include "engine.h"
#include "sampling.h"
#include "tokenizer.h"
#include "../testutil.h"

#define N_TOP 10

struct ref_step {
    int32_t token;
    int32_t top_id[N_TOP];
    double  top_logit[N_TOP];
    double  gap;
};

struct ref_prompt {
    char *text;
    int32_t *prompt, n_prompt;
    int32_t *greedy, n_greedy;
    struct ref_step *steps;
    int32_t n_steps;
};

struct ref {
    char *gguf;
    int32_t n_vocab;
    struct ref_prompt *p;
    size_t n;
};

static void s_ref_load (struct ref *r, const char *model)
{
    TU_REQUIRE_SHARED ();
    const char *shared = tu_env ("RADIX_SHARED");
    char path[4096];
    snprintf (path, sizeof path, "%s/data/models/%s.json", shared, model);
    json_error_t je;
    json_t *root = json_load_file (path, 0, &je);
    cr_assert_not_null (root, "%s:%d: %s", path, je.line, je.text);
    snprintf (path, sizeof path, "%s/data/models/%s.gguf", shared, model);
    r->gguf = strdup (path);
    r->n_vocab = (int32_t) json_integer_value (json_object_get (root, "n_vocab"));
    json_t *ps = json_object_get (root, "prompts");
    cr_assert (json_is_array (ps) && json_array_size (ps) > 0);
    r->n = json_array_size (ps);
    r->p = calloc (r->n, sizeof *r->p);
    for (size_t i = 0; i < r->n; i++) {
        json_t *p = json_array_get (ps, i);
        struct ref_prompt *rp = &r->p[i];
        rp->text = strdup (json_string_value (json_object_get (p, "text")));
        json_t *a = json_object_get (p, "prompt_ids");
        rp->n_prompt = (int32_t) json_array_size (a);
        rp->prompt = calloc ((size_t) rp->n_prompt, sizeof (int32_t));
        for (int32_t j = 0; j < rp->n_prompt; j++)
            rp->prompt[j] = (int32_t) json_integer_value (json_array_get (a, (size_t) j));
        a = json_object_get (p, "greedy_ids");
        rp->n_greedy = (int32_t) json_array_size (a);
        rp->greedy = calloc ((size_t) rp->n_greedy, sizeof (int32_t));
        for (int32_t j = 0; j < rp->n_greedy; j++)
            rp->greedy[j] = (int32_t) json_integer_value (json_array_get (a, (size_t) j));
        a = json_object_get (p, "steps");
        rp->n_steps = (int32_t) json_array_size (a);
        cr_assert_eq (rp->n_steps, rp->n_prompt + rp->n_greedy, "%s: steps", model);
        rp->steps = calloc ((size_t) rp->n_steps, sizeof *rp->steps);
        for (int32_t j = 0; j < rp->n_steps; j++) {
            json_t *s = json_array_get (a, (size_t) j);
            struct ref_step *st = &rp->steps[j];
            cr_assert_eq (json_integer_value (json_object_get (s, "pos")), j);
            st->token = (int32_t) json_integer_value (json_object_get (s, "token"));
            st->gap = json_number_value (json_object_get (s, "top2_gap"));
            json_t *top = json_object_get (s, "top");
            cr_assert_eq (json_array_size (top), N_TOP);
            for (int k = 0; k < N_TOP; k++) {
                json_t *pair = json_array_get (top, (size_t) k);
                st->top_id[k] = (int32_t) json_integer_value (json_array_get (pair, 0));
                st->top_logit[k] = json_number_value (json_array_get (pair, 1));
            }
        }
    }
    json_decref (root);
}

static void s_ref_free (struct ref *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free (r->p[i].text);
        free (r->p[i].prompt);
        free (r->p[i].greedy);
        free (r->p[i].steps);
    }
    free (r->p);
    free (r->gguf);
}

/* The whole sequence a prompt's steps consume: prompt_ids + greedy_ids. */
static int32_t *s_full_seq (const struct ref_prompt *p)
{
    int32_t *s = malloc ((size_t) p->n_steps * sizeof *s);
    memcpy (s, p->prompt, (size_t) p->n_prompt * sizeof *s);
    memcpy (s + p->n_prompt, p->greedy, (size_t) p->n_greedy * sizeof *s);
    for (int32_t i = 0; i < p->n_steps; i++)
        cr_assert_eq (s[i], p->steps[i].token, "reference: token at %d", i);
    return s;
}

struct fixture {
    struct rx_boot b;
    rx_engine_t *e;
};

static const char *s_kv_dtype = NULL;   /* [attention] kv_dtype override */
static const char *s_moe_max = NULL;    /* [moe] max_tokens_per_rank override */

static void s_open (struct fixture *f, const struct ref *r, int64_t n_slots)
{
    setenv ("RADIX_PLUGIN_PATH", tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    struct rx_err err = { 0 };
    /* RX_MODELS_REF_INI: an INI for other runs ([kernels] threads = 2,
     * [kernels.cpu] isa = scalar ...).  By default one kernel thread: these
     * tests check the model's numerics (the kernels' threading has its own
     * tests, and the CLI tests run the default thread count), and make check
     * runs test programs in parallel on small machines. */
    const char *ini = getenv ("RX_MODELS_REF_INI");
    cr_assert_eq (rx_boot_open (&f->b, ini, 0, &err), RX_OK, "%s", err.msg);
    if (!ini) cr_assert_eq (rx_conf_set (f->b.conf, "kernels", "threads", "1", &err), RX_OK, "%s", err.msg);
    if (s_kv_dtype)
        cr_assert_eq (rx_conf_set (f->b.conf, "attention", "kv_dtype", s_kv_dtype, &err), RX_OK, "%s", err.msg);
    if (s_moe_max)
        cr_assert_eq (rx_conf_set (f->b.conf, "moe", "max_tokens_per_rank", s_moe_max, &err), RX_OK, "%s", err.msg);
    struct rx_engine_opts o = { .model_path = r->gguf, .n_slots = n_slots, .max_tokens = 256 };
    f->e = rx_engine_new (&f->b, &o, &err);
    cr_assert_not_null (f->e, "%s", err.msg);
    cr_assert_eq (rx_engine_info (f->e)->n_vocab, r->n_vocab);
}

static void s_close (struct fixture *f)
{
    rx_engine_destroy (&f->e);
    rx_boot_close (&f->b);
}

/* Compare one row of logits with reference step `pos`. */
static void s_check_row (const char *what, const struct ref_prompt *p, int32_t pos,
                         const float *row, int32_t n_vocab, double tol, double *max_dev)
{
    const struct ref_step *st = &p->steps[pos];
    for (int k = 0; k < N_TOP; k++) {
        double d = fabs ((double) row[st->top_id[k]] - st->top_logit[k]);
        if (d > *max_dev) *max_dev = d;
        cr_assert (d <= tol, "%s: \"%.20s\" pos %d: logit of id %d is %.6f, reference %.6f (|d| %.2e > tol %g)",
                   what, p->text, pos, st->top_id[k], (double) row[st->top_id[k]], st->top_logit[k], d, tol);
    }
    if (st->gap > 2 * tol) {
        int32_t am = rx_argmax (row, n_vocab);
        cr_assert_eq (am, st->top_id[0], "%s: \"%.20s\" pos %d: argmax %d, reference %d (gap %.4f)",
                      what, p->text, pos, am, st->top_id[0], st->gap);
    }
}

/* ---- 1. tokenization ---- */

static void s_tokenization (const char *model)
{
    struct ref r;
    s_ref_load (&r, model);
    struct rx_err err = { 0 };
    rx_tokenizer_t *t = rx_tokenizer_open (r.gguf, &err);
    cr_assert_not_null (t, "%s", err.msg);
    for (size_t i = 0; i < r.n; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        cr_assert_eq (rx_tokenizer_encode (t, r.p[i].text, strlen (r.p[i].text), RX_TOK_ADD_SPECIAL,
                                           &ids, &n, &err), RX_OK, "%s", err.msg);
        cr_assert_eq ((int32_t) n, r.p[i].n_prompt, "%s: \"%s\": %zu tokens, reference %d", model,
                      r.p[i].text, n, r.p[i].n_prompt);
        for (size_t j = 0; j < n; j++)
            cr_assert_eq (ids[j], r.p[i].prompt[j], "%s: \"%s\": token %zu", model, r.p[i].text, j);
        free (ids);
    }
    rx_tokenizer_free (&t);
    s_ref_free (&r);
}

/* ---- 2. teacher-forced: one prefill, or chunks of `chunk` tokens ---- */

static void s_teacher_forced (const char *model, double tol, int32_t chunk)
{
    struct ref r;
    s_ref_load (&r, model);
    struct fixture f;
    s_open (&f, &r, 1024);
    struct rx_err err = { 0 };
    double max_dev = 0;
    for (size_t i = 0; i < r.n; i++) {
        const struct ref_prompt *p = &r.p[i];
        int32_t *seq = s_full_seq (p);
        int id = rx_engine_seq_new (f.e, p->n_steps, &err);
        cr_assert_geq (id, 0, "%s", err.msg);
        float *logits = malloc ((size_t) p->n_steps * (size_t) r.n_vocab * sizeof *logits);
        for (int32_t off = 0; off < p->n_steps;) {
            int32_t n = chunk > 0 && chunk < p->n_steps - off ? chunk : p->n_steps - off;
            struct rx_engine_req q = { id, n, seq + off, 1 };
            cr_assert_eq (rx_engine_step (f.e, &q, 1, logits + (size_t) off * r.n_vocab, &err), RX_OK,
                          "%s", err.msg);
            off += n;
        }
        cr_assert_eq (rx_engine_seq_len (f.e, id), p->n_steps);
        char what[96];
        snprintf (what, sizeof what, "%s (chunks of %d)", model, chunk);
        for (int32_t pos = 0; pos < p->n_steps; pos++)
            s_check_row (what, p, pos, logits + (size_t) pos * r.n_vocab, r.n_vocab, tol, &max_dev);
        cr_assert_eq (rx_engine_seq_free (f.e, id), RX_OK);
        free (logits);
        free (seq);
    }
    cr_log_info ("%s, chunks of %d: max |logit - reference| over the listed ids = %.3g (tol %g)",
                 model, chunk, max_dev, tol);
    s_close (&f);
    s_ref_free (&r);
}

/* ---- 3. free-running greedy ---- */

static void s_greedy (const char *model, double tol)
{
    struct ref r;
    s_ref_load (&r, model);
    struct fixture f;
    s_open (&f, &r, 1024);
    struct rx_err err = { 0 };
    float *logits = malloc ((size_t) r.n_vocab * sizeof *logits);
    for (size_t i = 0; i < r.n; i++) {
        const struct ref_prompt *p = &r.p[i];
        int id = rx_engine_seq_new (f.e, p->n_steps, &err);
        cr_assert_geq (id, 0, "%s", err.msg);
        struct rx_engine_req q = { id, p->n_prompt, p->prompt, 0 };
        cr_assert_eq (rx_engine_step (f.e, &q, 1, logits, &err), RX_OK, "%s", err.msg);
        int32_t compared = 0;
        for (int32_t k = 0; k < p->n_greedy; k++) {
            int32_t tok = rx_argmax (logits, r.n_vocab);
            if (p->steps[p->n_prompt - 1 + k].gap < 2 * tol) break;   /* may diverge from here */
            cr_assert_eq (tok, p->greedy[k], "%s: \"%.20s\": greedy token %d is %d, reference %d",
                          model, p->text, k, tok, p->greedy[k]);
            compared++;
            struct rx_engine_req d = { id, 1, &tok, 0 };
            cr_assert_eq (rx_engine_step (f.e, &d, 1, logits, &err), RX_OK, "%s", err.msg);
        }
        cr_log_info ("%s: \"%.20s\": %d of %d greedy tokens compared", model, p->text, compared,
                     p->n_greedy);
        if (tol <= 1e-3)   /* the README: every prompt of tiny-llama compares over all 32 */
            cr_assert_eq (compared, p->n_greedy);
        rx_engine_seq_free (f.e, id);
    }
    free (logits);
    s_close (&f);
    s_ref_free (&r);
}

/* ---- 4. two sequences per step: mixed prefill and decode ---- */

static void s_batched_pair (const char *model, double tol)
{
    struct ref r;
    s_ref_load (&r, model);
    cr_assert_geq (r.n, 3);
    struct fixture f;
    s_open (&f, &r, 1024);
    struct rx_err err = { 0 };
    /* A: prompt 0 (short), B: prompt 2 (the long paragraph). */
    const struct ref_prompt *pa = &r.p[0], *pb = &r.p[2];
    int32_t *sa = s_full_seq (pa), *sb = s_full_seq (pb);
    int ia = rx_engine_seq_new (f.e, pa->n_steps, &err), ib = rx_engine_seq_new (f.e, pb->n_steps, &err);
    cr_assert (ia >= 0 && ib >= 0, "%s", err.msg);
    float *la = malloc ((size_t) pa->n_steps * r.n_vocab * sizeof (float));
    float *lb = malloc ((size_t) pb->n_steps * r.n_vocab * sizeof (float));
    float *step = malloc ((size_t) (pa->n_steps + pb->n_steps) * r.n_vocab * sizeof (float));
    /* Step 1: 3 tokens of A and all of B's prompt.  Step 2: the rest of A's
     * prompt with B's first decode.  Then both decode together; when A is
     * done B goes on alone. */
    int32_t oa = 0, ob = 0, k = 0;
    while (oa < pa->n_steps || ob < pb->n_steps) {
        int32_t na = k == 0 ? 3 : k == 1 ? pa->n_prompt - 3 : 1;
        int32_t nb = k == 0 ? pb->n_prompt : 1;
        if (na > pa->n_steps - oa) na = pa->n_steps - oa;
        if (nb > pb->n_steps - ob) nb = pb->n_steps - ob;
        struct rx_engine_req q[2];
        int nq = 0;
        if (na > 0) q[nq++] = (struct rx_engine_req) { ia, na, sa + oa, 1 };
        if (nb > 0) q[nq++] = (struct rx_engine_req) { ib, nb, sb + ob, 1 };
        if (k == 1 && nq == 2) {   /* B first in this step: order must not matter */
            struct rx_engine_req t = q[0]; q[0] = q[1]; q[1] = t;
        }
        cr_assert_eq (rx_engine_step (f.e, q, nq, step, &err), RX_OK, "%s", err.msg);
        size_t row = 0;
        for (int j = 0; j < nq; j++) {
            float *dst = q[j].seq == ia ? la + (size_t) oa * r.n_vocab : lb + (size_t) ob * r.n_vocab;
            memcpy (dst, step + row * r.n_vocab, (size_t) q[j].n_tokens * r.n_vocab * sizeof (float));
            row += (size_t) q[j].n_tokens;
        }
        oa += na;
        ob += nb;
        k++;
    }
    double max_dev = 0;
    char what[96];
    snprintf (what, sizeof what, "%s (two sequences batched)", model);
    for (int32_t pos = 0; pos < pa->n_steps; pos++)
        s_check_row (what, pa, pos, la + (size_t) pos * r.n_vocab, r.n_vocab, tol, &max_dev);
    for (int32_t pos = 0; pos < pb->n_steps; pos++)
        s_check_row (what, pb, pos, lb + (size_t) pos * r.n_vocab, r.n_vocab, tol, &max_dev);
    cr_log_info ("%s: max deviation %.3g", what, max_dev);
    free (la);
    free (lb);
    free (step);
    free (sa);
    free (sb);
    s_close (&f);
    s_ref_free (&r);
}

/* ---- 5. scattered KV slots through the raw forward ---- */

static void s_scattered (const char *model, double tol)
{
    struct ref r;
    s_ref_load (&r, model);
    struct fixture f;
    const int64_t n_slots = 400;
    s_open (&f, &r, n_slots);
    struct rx_err err = { 0 };
    const struct ref_prompt *pa = &r.p[1], *pb = &r.p[3];
    int32_t *sa = s_full_seq (pa), *sb = s_full_seq (pb);
    cr_assert (pa->n_steps + pb->n_steps <= n_slots);
    /* A fixed permutation of the pool: A takes the even draws, B the odd
     * ones, so their slots interleave and run backwards and forwards. */
    int32_t *perm = malloc ((size_t) n_slots * sizeof *perm);
    for (int32_t i = 0; i < n_slots; i++) perm[i] = i;
    uint64_t x = 12345;
    for (int32_t i = (int32_t) n_slots - 1; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t) ((x >> 33) % (uint64_t) (i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    int32_t *slot_a = malloc ((size_t) pa->n_steps * sizeof (int32_t));
    int32_t *slot_b = malloc ((size_t) pb->n_steps * sizeof (int32_t));
    for (int32_t i = 0; i < pa->n_steps; i++) slot_a[i] = perm[2 * i];
    for (int32_t i = 0; i < pb->n_steps; i++) slot_b[i] = perm[2 * i + 1];
    float *la = malloc ((size_t) pa->n_steps * r.n_vocab * sizeof (float));
    float *lb = malloc ((size_t) pb->n_steps * r.n_vocab * sizeof (float));
    float *step = malloc ((size_t) (pa->n_steps + pb->n_steps) * r.n_vocab * sizeof (float));
    int32_t tokens[512], pos[512], kv_slots[1024], out_rows[512];
    int32_t oa = 0, ob = 0, k = 0;
    while (oa < pa->n_steps || ob < pb->n_steps) {
        /* A in chunks of 4, B: its prompt, then one at a time. */
        int32_t na = pa->n_steps - oa < 4 ? pa->n_steps - oa : 4;
        int32_t nb = k == 0 ? pb->n_prompt : (ob < pb->n_steps ? 1 : 0);
        int32_t n = 0, nk = 0, ns = 0;
        int32_t q_start[3], kv_start[3];
        int which[2];
        if (na > 0) {
            q_start[ns] = n;
            kv_start[ns] = nk;
            for (int32_t i = 0; i < na; i++, n++) { tokens[n] = sa[oa + i]; pos[n] = oa + i; }
            for (int32_t i = 0; i < oa + na; i++) kv_slots[nk++] = slot_a[i];
            which[ns++] = 0;
        }
        if (nb > 0) {
            q_start[ns] = n;
            kv_start[ns] = nk;
            for (int32_t i = 0; i < nb; i++, n++) { tokens[n] = sb[ob + i]; pos[n] = ob + i; }
            for (int32_t i = 0; i < ob + nb; i++) kv_slots[nk++] = slot_b[i];
            which[ns++] = 1;
        }
        q_start[ns] = n;
        kv_start[ns] = nk;
        for (int32_t i = 0; i < n; i++) out_rows[i] = i;
        struct rx_model_batch b = {
            .struct_size = sizeof b, .n_tokens = n, .tokens = tokens, .pos = pos, .n_seq = ns,
            .q_start = q_start, .kv_start = kv_start, .kv_slots = kv_slots, .n_out = n,
            .out_rows = out_rows,
        };
        cr_assert_eq (rx_engine_forward (f.e, &b, step, &err), RX_OK, "%s", err.msg);
        for (int j = 0; j < ns; j++) {
            int32_t cnt = q_start[j + 1] - q_start[j];
            float *dst = which[j] == 0 ? la + (size_t) oa * r.n_vocab : lb + (size_t) ob * r.n_vocab;
            memcpy (dst, step + (size_t) q_start[j] * r.n_vocab, (size_t) cnt * r.n_vocab * sizeof (float));
        }
        oa += na;
        ob += nb;
        k++;
    }
    double max_dev = 0;
    char what[96];
    snprintf (what, sizeof what, "%s (scattered slots)", model);
    for (int32_t p = 0; p < pa->n_steps; p++)
        s_check_row (what, pa, p, la + (size_t) p * r.n_vocab, r.n_vocab, tol, &max_dev);
    for (int32_t p = 0; p < pb->n_steps; p++)
        s_check_row (what, pb, p, lb + (size_t) p * r.n_vocab, r.n_vocab, tol, &max_dev);
    cr_log_info ("%s: max deviation %.3g", what, max_dev);
    free (perm);
    free (slot_a);
    free (slot_b);
    free (la);
    free (lb);
    free (step);
    free (sa);
    free (sb);
    s_close (&f);
    s_ref_free (&r);
}

/* ---- only the last row of each sequence: gathered output rows ---- */

static void s_last_rows (const char *model, double tol)
{
    struct ref r;
    s_ref_load (&r, model);
    struct fixture f;
    s_open (&f, &r, 1024);
    struct rx_err err = { 0 };
    /* All four prompts in one step, logits of each prompt's last token. */
    struct rx_engine_req q[8];
    for (size_t i = 0; i < r.n && i < 8; i++) {
        int id = rx_engine_seq_new (f.e, r.p[i].n_prompt, &err);
        cr_assert_geq (id, 0, "%s", err.msg);
        q[i] = (struct rx_engine_req) { id, r.p[i].n_prompt, r.p[i].prompt, 0 };
    }
    int32_t nq = (int32_t) (r.n < 8 ? r.n : 8);
    cr_assert_eq (rx_engine_n_out (q, nq), nq);
    float *l = malloc ((size_t) nq * r.n_vocab * sizeof (float));
    cr_assert_eq (rx_engine_step (f.e, q, nq, l, &err), RX_OK, "%s", err.msg);
    double max_dev = 0;
    for (int32_t i = 0; i < nq; i++)
        s_check_row ("last rows", &r.p[i], r.p[i].n_prompt - 1, l + (size_t) i * r.n_vocab,
                     r.n_vocab, tol, &max_dev);
    free (l);
    s_close (&f);
    s_ref_free (&r);
}

#define MODEL_TESTS(tag, model, tol)                                                  \
    Test (tag, tokenization) { s_tokenization (model); }                               \
    Test (tag, teacher_forced_one_prefill) { s_teacher_forced (model, tol, 0); } \
    Test (tag, teacher_forced_one_token_at_a_time) { s_teacher_forced (model, tol, 1); } \
    Test (tag, teacher_forced_chunks_of_7) { s_teacher_forced (model, tol, 7); } \
    Test (tag, free_running_greedy) { s_greedy (model, tol); }          \
    Test (tag, two_sequences_batched) { s_batched_pair (model, tol); }  \
    Test (tag, scattered_kv_slots) { s_scattered (model, tol); }        \
    Test (tag, last_rows_of_four_sequences) { s_last_rows (model, tol); }

MODEL_TESTS (tiny_llama, "tiny-llama", 1e-3)
MODEL_TESTS (tiny_llama_q8, "tiny-llama-q8", 0.1)
MODEL_TESTS (tiny_llama_q4, "tiny-llama-q4", 0.1)
/* Mixtral-style MoE through the moe-local dispatcher ([moe] dispatcher's
 * default). */
MODEL_TESTS (tiny_moe, "tiny-moe", 1e-3)
MODEL_TESTS (tiny_deepseek2, "tiny-deepseek2", 1e-3)   /* MLA + DeepSeek MoE (model-deepseek2, attn-mla, moe-local) */

/* F16 KV cache (llama.cpp's default cache type): the README puts its effect
 * at up to about 7e-3 on these logits, so tol 1e-2 -- close enough to catch a
 * miswired F16 pool (garbage is off by whole units), loose enough for the
 * rounding. */
Test (tiny_llama_kv_f16, teacher_forced_prefill_and_decode)
{
    s_kv_dtype = "f16";
    s_teacher_forced ("tiny-llama", 1e-2, 0);
    s_teacher_forced ("tiny-llama", 1e-2, 1);
}

/* [moe] max_tokens_per_rank = 3: the dispatcher holds 3 tokens, so every
 * prefill step goes through it in chunks of 3 (the last one shorter). */
Test (tiny_moe_chunked_dispatch, teacher_forced_prefill_and_chunks_of_7)
{
    s_moe_max = "3";
    s_teacher_forced ("tiny-moe", 1e-3, 0);
    s_teacher_forced ("tiny-moe", 1e-3, 7);
}

/* The engine with the plugins of dir (NULL: every built plugin) and
 * [moe] dispatcher = dispatcher (NULL: the default); NULL + err on failure. */
static rx_engine_t *s_engine (struct rx_boot *b, const char *model, const char *dir,
                              const char *dispatcher, struct rx_err *err)
{
    TU_REQUIRE_SHARED ();
    setenv ("RADIX_PLUGIN_PATH", dir ? dir : tu_env ("RX_PLUGIN_BUILD_DIR"), 1);
    cr_assert_eq (rx_boot_open (b, NULL, 0, err), RX_OK, "%s", err->msg);
    cr_assert_eq (rx_conf_set (b->conf, "kernels", "threads", "1", err), RX_OK, "%s", err->msg);
    if (dispatcher)
        cr_assert_eq (rx_conf_set (b->conf, "moe", "dispatcher", dispatcher, err), RX_OK, "%s", err->msg);
    char path[4096];
    snprintf (path, sizeof path, "%s/data/models/%s.gguf", tu_env ("RADIX_SHARED"), model);
    struct rx_engine_opts o = { .model_path = path, .n_slots = 256, .max_tokens = 64 };
    return rx_engine_new (b, &o, err);
}

Test (tiny_moe, unknown_dispatcher_is_refused)
{
    struct rx_boot b;
    struct rx_err err = { 0 };
    rx_engine_t *e = s_engine (&b, "tiny-moe", NULL, "nope", &err);
    cr_assert_null (e);
    cr_assert (strstr (err.msg, "[moe] dispatcher = nope"), "%s", err.msg);
    rx_boot_close (&b);
    /* Explicitly configured and unknown: refused for a dense model too. */
    err = (struct rx_err) { 0 };
    e = s_engine (&b, "tiny-llama", NULL, "nope", &err);
    cr_assert_null (e);
    cr_assert (strstr (err.msg, "[moe] dispatcher = nope"), "%s", err.msg);
    rx_boot_close (&b);
}

/* No moe-*.so installed: a dense model still runs, an MoE model is refused
 * naming the missing dispatcher. */
Test (tiny_moe, no_dispatcher_installed)
{
    /* The loader always searches the install dir last: an installed
     * moe-local.so (scripts/build installs before the tests run) would be
     * found there. */
    char *inst = tu_path (RX_PLUGINDIR, "moe-local.so");
    int installed = access (inst, F_OK) == 0;
    free (inst);
    if (installed) cr_skip_test ("moe-local.so is installed in " RX_PLUGINDIR ", which the loader always searches");
    char *dir = tu_tmpdir ();
    const char *keep[] = { "kernels-cpu.so", "model-llama.so", "attn-mha.so" };
    for (size_t i = 0; i < 3; i++) {
        char *from = tu_path (tu_env ("RX_PLUGIN_BUILD_DIR"), keep[i]), *to = tu_path (dir, keep[i]);
        cr_assert_eq (symlink (from, to), 0, "symlink %s", to);
        free (from);
        free (to);
    }
    struct rx_boot b;
    struct rx_err err = { 0 };
    rx_engine_t *e = s_engine (&b, "tiny-llama", dir, NULL, &err);
    cr_assert_not_null (e, "%s", err.msg);
    rx_engine_destroy (&e);
    rx_boot_close (&b);
    err = (struct rx_err) { 0 };
    e = s_engine (&b, "tiny-moe", dir, NULL, &err);
    cr_assert_null (e);
    cr_assert_eq (err.code, RX_ENOTSUP, "%s", err.msg);
    cr_assert (strstr (err.msg, "needs a MoE dispatcher"), "%s", err.msg);
    rx_boot_close (&b);
    for (size_t i = 0; i < 3; i++) {
        char *to = tu_path (dir, keep[i]);
        unlink (to);
        free (to);
    }
    rmdir (dir);
    free (dir);
}
