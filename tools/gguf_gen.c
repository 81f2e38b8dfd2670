/* tools/gguf_gen.c -- `radix gguf-gen`: write a deterministic random-weight
 * model GGUF of a chosen architecture and size.
 *
 *   radix gguf-gen --arch llama --preset tiny --vocab V.gguf --type f16 --out F.gguf
 *   radix gguf-gen --arch llama --dims embd=256,layers=4,heads=8,kv_heads=2,ffn=512 ...
 *
 * Tests and benchmarks make their models with it, so the output must be
 * reproducible: every tensor's values come from a PRNG seeded by (--seed,
 * tensor name) and are built with integer and exact float arithmetic only (no
 * libm), so the same arguments give byte-identical files on any host, and
 * the same seed gives the same float weights whatever --type is (a q8_0 file
 * dequantizes close to the f32 file of the same seed).
 *
 * Architectures are a table (s_archs): each one fills the metadata of its
 * hyperparameters and lists its tensors; adding deepseek2 or moe is one more
 * entry. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "commands.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "quant.h"

/* --------------------------------------------------------- hyperparams -- */

struct s_hp {
    const char *preset;
    uint32_t embd, layers, heads, kv_heads, ffn, ctx, vocab;
    float    rope_base, eps;
    int      tied;          /* output.weight shares token_embd.weight */
};

static const struct s_hp s_presets[] = {
    /* the shape of shared/data/models/tiny-llama.gguf */
    { "tiny",         64,   2,  4, 2,  128,  512, 0, 10000.0f,  1e-5f, 0 },
    { "smollm2-135m", 576,  30, 9, 3,  1536, 8192, 0, 100000.0f, 1e-5f, 1 },
    { "smollm2-360m", 960,  32, 15, 5, 2560, 2048, 0, 100000.0f, 1e-5f, 1 },
    /* Llama-3.2-1B's shape (tied embeddings, as the real model); context
     * capped at 8192 because radix has no llama3 rope scaling yet. */
    { "llama-1b",     2048, 16, 32, 8, 8192, 8192, 0, 500000.0f, 1e-5f, 1 },
};

/* ----------------------------------------------------------------- PRNG -- */

static uint64_t s_splitmix (uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct s_rng { uint64_t s[4]; };

static uint64_t s_rotl (uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t s_next (struct s_rng *r)   /* xoshiro256** */
{
    uint64_t *s = r->s, res = s_rotl (s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl (s[3], 45);
    return res;
}

static uint64_t s_name_hash (const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t) *p) * 1099511628211ull;
    return h;
}

/* One stream per (seed, tensor name, row): rows can be made in any order, on
 * any number of threads, and give the same bytes. */
static void s_rng_seed (struct s_rng *r, uint64_t seed, uint64_t name_hash, uint64_t row)
{
    uint64_t sm = seed ^ name_hash ^ (row * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++) r->s[i] = s_splitmix (&sm);
}

/* Uniform in [0, 1) with 24 bits: exact in float. */
static float s_unif (struct s_rng *r) { return (float) (s_next (r) >> 40) * 0x1p-24f; }

/* Approximately normal(0, 1): the sum of 4 uniforms (Irwin-Hall) centred and
 * scaled to unit variance.  Pure arithmetic, so bit-identical everywhere. */
static float s_normal (struct s_rng *r)
{
    float s = s_unif (r) + s_unif (r) + s_unif (r) + s_unif (r) - 2.0f;
    return s * 1.7320508f;   /* sqrt(3): the sum has variance 4/12 */
}

/* ------------------------------------------------------------- tensors -- */

enum s_kind { K_NORM, K_MATRIX };

struct s_tspec {
    char     name[64];
    enum s_kind kind;
    uint32_t n_dims;
    uint64_t ne[4];
    float    std;           /* K_MATRIX: standard deviation */
    int      want;          /* type asked for (--type, or the mix recipe) */
    int      type;          /* type written: want, or a fallback that fits the rows */
};

struct s_tlist {
    struct s_tspec *v;
    size_t n, cap;
};

static int s_add (struct s_tlist *l, enum s_kind kind, float std, uint32_t n_dims, uint64_t ne0,
                  uint64_t ne1, const char *fmt, ...)
    __attribute__ ((format (printf, 7, 8)));

static int s_add (struct s_tlist *l, enum s_kind kind, float std, uint32_t n_dims, uint64_t ne0,
                  uint64_t ne1, const char *fmt, ...)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct s_tspec *p = realloc (l->v, cap * sizeof *p);
        if (!p) return -1;
        l->v = p;
        l->cap = cap;
    }
    struct s_tspec *t = &l->v[l->n++];
    memset (t, 0, sizeof *t);
    va_list ap;
    va_start (ap, fmt);
    vsnprintf (t->name, sizeof t->name, fmt, ap);
    va_end (ap);
    t->kind = kind;
    t->std = std;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = t->ne[3] = 1;
    return 0;
}

/* 1/sqrt(n) by Newton's method in double (exact IEEE ops, no libm): weights
 * scaled so that a layer's output has about the variance of its input. */
static float s_inv_sqrt (double n)
{
    double x = 1.0;
    while (x * x * n > 2.0) x *= 0.5;   /* Newton needs x0 < sqrt(3/n) */
    for (int i = 0; i < 60; i++) x = x * (1.5 - 0.5 * n * x * x);
    return (float) x;
}

/* --------------------------------------------------------------- llama -- */

static int s_llama_meta (rx_gguf_writer_t *w, const struct s_hp *hp, struct rx_err *err)
{
    int rc = 0;
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.vocab_size", hp->vocab, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.context_length", hp->ctx, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.embedding_length", hp->embd, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.block_count", hp->layers, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.feed_forward_length", hp->ffn, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.attention.head_count", hp->heads, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.attention.head_count_kv", hp->kv_heads, err);
    rc = rc ? rc : rx_gguf_writer_add_f32 (w, "llama.attention.layer_norm_rms_epsilon", hp->eps, err);
    rc = rc ? rc : rx_gguf_writer_add_f32 (w, "llama.rope.freq_base", hp->rope_base, err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "llama.rope.dimension_count", hp->embd / hp->heads, err);
    return rc;
}

static int s_llama_tensors (struct s_tlist *l, const struct s_hp *hp)
{
    uint64_t e = hp->embd, hd = hp->embd / hp->heads, kv = hd * hp->kv_heads, f = hp->ffn;
    float se = s_inv_sqrt ((double) e), sf = s_inv_sqrt ((double) f);
    int rc = 0;
    rc |= s_add (l, K_MATRIX, se, 2, e, hp->vocab, "token_embd.weight");
    rc |= s_add (l, K_NORM, 0, 1, e, 1, "output_norm.weight");
    if (!hp->tied)
        rc |= s_add (l, K_MATRIX, se, 2, e, hp->vocab, "output.weight");
    for (uint32_t b = 0; b < hp->layers; b++) {
        rc |= s_add (l, K_NORM, 0, 1, e, 1, "blk.%u.attn_norm.weight", b);
        rc |= s_add (l, K_MATRIX, se, 2, e, e, "blk.%u.attn_q.weight", b);
        rc |= s_add (l, K_MATRIX, se, 2, e, kv, "blk.%u.attn_k.weight", b);
        rc |= s_add (l, K_MATRIX, se, 2, e, kv, "blk.%u.attn_v.weight", b);
        rc |= s_add (l, K_MATRIX, se, 2, e, e, "blk.%u.attn_output.weight", b);
        rc |= s_add (l, K_NORM, 0, 1, e, 1, "blk.%u.ffn_norm.weight", b);
        rc |= s_add (l, K_MATRIX, se, 2, e, f, "blk.%u.ffn_gate.weight", b);
        rc |= s_add (l, K_MATRIX, se, 2, e, f, "blk.%u.ffn_up.weight", b);
        rc |= s_add (l, K_MATRIX, sf, 2, f, e, "blk.%u.ffn_down.weight", b);
    }
    return rc;
}

static const char *s_llama_check (const struct s_hp *hp)
{
    static char why[160];
    if (!hp->embd || !hp->layers || !hp->heads || !hp->kv_heads || !hp->ffn || !hp->ctx)
        return "embd, layers, heads, kv_heads, ffn and ctx must all be set and > 0";
    if (hp->embd % hp->heads) {
        snprintf (why, sizeof why, "embd %u is not a multiple of heads %u", hp->embd, hp->heads);
        return why;
    }
    if (hp->heads % hp->kv_heads) {
        snprintf (why, sizeof why, "heads %u is not a multiple of kv_heads %u", hp->heads, hp->kv_heads);
        return why;
    }
    if ((hp->embd / hp->heads) % 2) {
        snprintf (why, sizeof why, "head dim %u must be even (RoPE rotates pairs)", hp->embd / hp->heads);
        return why;
    }
    return NULL;
}

static const struct s_arch {
    const char *name;
    const char *(*check) (const struct s_hp *hp);
    int (*meta) (rx_gguf_writer_t *w, const struct s_hp *hp, struct rx_err *err);
    int (*tensors) (struct s_tlist *l, const struct s_hp *hp);
} s_archs[] = {
    { "llama", s_llama_check, s_llama_meta, s_llama_tensors },
};

/* --------------------------------------------------------------- types -- */

static const struct { const char *name; int type; uint32_t ftype; int mix; } s_types[] = {
    /* general.file_type values are llama.cpp's llama_ftype */
    { "f32", RX_F32, 0, 0 },   { "f16", RX_F16, 1, 0 },   { "bf16", RX_BF16, 32, 0 },
    { "q8_0", RX_Q8_0, 7, 0 }, { "q4_0", RX_Q4_0, 2, 0 }, { "q4_1", RX_Q4_1, 3, 0 },
    { "q4_k", RX_Q4_K, 14, 0 }, { "q5_k", RX_Q5_K, 16, 0 }, { "q6_k", RX_Q6_K, 18, 0 },
    { "q4_k_m", RX_Q4_K, 15, 1 },
};

/* llama.cpp's Q4_K_M recipe: output.weight q6_K; attn_v and ffn_down q6_K in
 * the layers that get more bits (first and last eighth, every third one in
 * between), q4_K elsewhere. */
static int s_q4_k_m_type (const char *name, uint32_t n_layer)
{
    unsigned l;
    char rest[48];
    if (!strcmp (name, "output.weight")) return RX_Q6_K;
    if (sscanf (name, "blk.%u.%47s", &l, rest) == 2
        && (!strcmp (rest, "attn_v.weight") || !strcmp (rest, "ffn_down.weight"))) {
        uint32_t e = n_layer / 8;
        int more = l < e || l >= 7 * n_layer / 8 || (l - e) % 3 == 2;
        return more ? RX_Q6_K : RX_Q4_K;
    }
    return RX_Q4_K;
}

/* The type a row of ne0 values is written in when `want` does not fit it:
 * llama.cpp's fallbacks (q4_K->q5_0, q5_K->q5_1, q6_K->q8_0), skipping those
 * radix cannot quantize, then q8_0, then f16 (any row length). */
static int s_fit_type (int want, uint64_t ne0)
{
    int chain[4], n = 0;
    switch (want) {
    case RX_Q4_K: chain[n++] = RX_Q5_0; break;
    case RX_Q5_K: chain[n++] = RX_Q5_1; break;
    default: break;
    }
    chain[n++] = RX_Q8_0;
    chain[n++] = RX_F16;
    if (ne0 % rx_dtype_block (want) == 0) return want;
    for (int i = 0; i < n; i++)
        if (rx_quant_supported (chain[i]) && ne0 % rx_dtype_block (chain[i]) == 0) return chain[i];
    return RX_F32;
}

/* ----------------------------------------------------------------- CLI -- */

static void s_usage (FILE *f)
{
    fprintf (f,
        "usage: radix gguf-gen --arch llama (--preset NAME | --dims K=V,...) [--vocab V.gguf]\n"
        "                      [--type TYPE] [--seed N] [--name NAME] [--threads N] --out F.gguf\n"
        "  --arch llama          architecture (llama: Llama/Mistral/Qwen2/SmolLM2 dense)\n"
        "  --preset NAME         tiny | smollm2-135m | smollm2-360m | llama-1b\n"
        "  --dims K=V,...        embd, layers, heads, kv_heads, ffn, ctx, rope_base, eps,\n"
        "                        tied (0/1), vocab (only without --vocab); override the preset\n"
        "  --vocab V.gguf        copy every tokenizer.* key from V (vocab size = its token count)\n"
        "  --type TYPE           2-D weights: f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k, or\n"
        "                        q4_k_m (llama.cpp's mix: q4_K, q6_K for output, some attn_v/ffn_down)\n"
        "                        (default f16; norms stay f32; rows that do not fit the block\n"
        "                        size fall back to another type, reported on stderr)\n"
        "  --seed N              PRNG seed (default 1); same arguments -> same bytes\n"
        "  --name NAME           general.name (default: the preset name, or \"random\")\n"
        "  --threads N           worker threads (default: online CPUs); never changes the output\n"
        "  --out F.gguf          output file (written as F.gguf.tmp, then renamed)\n");
}

static int s_parse_u32 (const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull (s, &end, 10);
    if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-') return -1;
    *out = (uint32_t) v;
    return 0;
}

static int s_parse_dims (const char *spec, struct s_hp *hp, uint32_t *vocab_dim)
{
    char *copy = strdup (spec), *save = NULL;
    int rc = 0;
    if (!copy) return -1;
    for (char *tok = strtok_r (copy, ",", &save); tok; tok = strtok_r (NULL, ",", &save)) {
        char *eq = strchr (tok, '=');
        if (!eq) {
            fprintf (stderr, "radix gguf-gen: --dims: '%s' is not KEY=VALUE\n", tok);
            rc = -1;
            break;
        }
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        uint32_t u = 0;
        int bad = 0;
        if (!strcmp (k, "rope_base") || !strcmp (k, "eps")) {
            char *end;
            float f = strtof (v, &end);
            bad = end == v || *end || !(f > 0);
            if (!bad) *(!strcmp (k, "eps") ? &hp->eps : &hp->rope_base) = f;
        } else if (s_parse_u32 (v, &u)) {
            bad = 1;
        } else if (!strcmp (k, "embd")) hp->embd = u;
        else if (!strcmp (k, "layers")) hp->layers = u;
        else if (!strcmp (k, "heads")) hp->heads = u;
        else if (!strcmp (k, "kv_heads")) hp->kv_heads = u;
        else if (!strcmp (k, "ffn")) hp->ffn = u;
        else if (!strcmp (k, "ctx")) hp->ctx = u;
        else if (!strcmp (k, "vocab")) *vocab_dim = u;
        else if (!strcmp (k, "tied") && u <= 1) hp->tied = (int) u;
        else {
            fprintf (stderr, "radix gguf-gen: --dims: unknown key '%s' (embd, layers, heads, kv_heads, "
                             "ffn, ctx, rope_base, eps, tied, vocab)\n", k);
            rc = -1;
            break;
        }
        if (bad) {
            fprintf (stderr, "radix gguf-gen: --dims: bad value '%s' for %s\n", v, k);
            rc = -1;
            break;
        }
    }
    free (copy);
    return rc;
}

/* Rows [row0, row0 + nrows) of a tensor, generated and converted into out. */
struct s_job {
    const struct s_tspec *t;
    uint64_t seed, hash, row0, nrows;
    size_t   row_bytes;
    float   *row;            /* ne[0] floats of scratch */
    uint8_t *out;
    int      fail;
    int      joinable;
    pthread_t th;
};

static void *s_job_run (void *arg)
{
    struct s_job *j = arg;
    const struct s_tspec *t = j->t;
    size_t ne0 = (size_t) t->ne[0];
    for (uint64_t i = 0; i < j->nrows; i++) {
        struct s_rng r;
        s_rng_seed (&r, j->seed, j->hash, j->row0 + i);
        for (size_t k = 0; k < ne0; k++)
            j->row[k] = t->kind == K_NORM ? 1.0f + 0.1f * (s_unif (&r) - 0.5f) : t->std * s_normal (&r);
        if (rx_quantize_row (t->type, j->row, j->out + i * j->row_bytes, ne0) != j->row_bytes) {
            j->fail = 1;
            break;
        }
    }
    return NULL;
}

/* Write one tensor: batches of rows (about 8 MiB), each split across the
 * threads, written in order. */
static int s_write_tensor (rx_gguf_writer_t *w, const struct s_tspec *t, uint64_t seed, int n_threads,
                           struct s_job *jobs, uint8_t *buf, size_t buf_size, struct rx_err *err)
{
    size_t row_bytes = rx_dtype_row_bytes (t->type, (size_t) t->ne[0]);
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], hash = s_name_hash (t->name);
    uint64_t batch = row_bytes ? buf_size / row_bytes : 0;
    if (batch == 0)
        return rx_err_set (err, RX_EINTERNAL, "%s: no buffer for a row of %s", t->name, rx_dtype_name (t->type));
    for (uint64_t r0 = 0; r0 < rows; r0 += batch) {
        uint64_t n = rows - r0 < batch ? rows - r0 : batch;
        int nt = (uint64_t) n_threads < n ? n_threads : (int) n;
        uint64_t per = (n + (uint64_t) nt - 1) / (uint64_t) nt, at = 0;
        int started = 0;
        for (int k = 0; k < nt && at < n; k++, started++) {
            struct s_job *j = &jobs[k];
            j->t = t;
            j->seed = seed;
            j->hash = hash;
            j->row0 = r0 + at;
            j->nrows = n - at < per ? n - at : per;
            j->row_bytes = row_bytes;
            j->out = buf + at * row_bytes;
            j->fail = 0;
            at += j->nrows;
            j->joinable = k > 0 && pthread_create (&j->th, NULL, s_job_run, j) == 0;
            if (k > 0 && !j->joinable)
                s_job_run (j);          /* no thread: do it here */
        }
        s_job_run (&jobs[0]);
        int fail = 0;
        for (int k = 0; k < started; k++) {
            if (jobs[k].joinable) pthread_join (jobs[k].th, NULL);
            fail |= jobs[k].fail;
        }
        if (fail)
            return rx_err_set (err, RX_EINTERNAL, "%s: cannot convert a row of %" PRIu64 " to %s", t->name,
                               t->ne[0], rx_dtype_name (t->type));
        int rc = rx_gguf_writer_write (w, buf, (size_t) n * row_bytes, err);
        if (rc) return rc;
    }
    return RX_OK;
}

int rx_cmd_gguf_gen (int argc, char **argv)
{
    static const struct option opts[] = {
        { "arch", required_argument, NULL, 'a' },  { "preset", required_argument, NULL, 'p' },
        { "dims", required_argument, NULL, 'd' },  { "vocab", required_argument, NULL, 'v' },
        { "type", required_argument, NULL, 't' },  { "seed", required_argument, NULL, 's' },
        { "name", required_argument, NULL, 'n' },  { "out", required_argument, NULL, 'o' },
        { "threads", required_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *arch_name = NULL, *preset = NULL, *vocab = NULL, *type_name = "f16";
    const char *dims[16];
    int n_dims = 0;
    const char *name = NULL, *out = NULL;
    uint64_t seed = 1;
    long ncpu = sysconf (_SC_NPROCESSORS_ONLN);
    int n_threads = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int) ncpu;
    int c;
    optind = 1;
    while ((c = getopt_long (argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'a': arch_name = optarg; break;
        case 'p': preset = optarg; break;
        case 'd':
            if (n_dims == (int) (sizeof dims / sizeof dims[0])) {
                fprintf (stderr, "radix gguf-gen: too many --dims\n");
                return 2;
            }
            dims[n_dims++] = optarg;     /* applied in order, after the preset */
            break;
        case 'v': vocab = optarg; break;
        case 't': type_name = optarg; break;
        case 'n': name = optarg; break;
        case 'o': out = optarg; break;
        case 's': {
            char *end;
            errno = 0;
            seed = strtoull (optarg, &end, 0);
            if (errno || end == optarg || *end || optarg[0] == '-') {
                fprintf (stderr, "radix gguf-gen: --seed: '%s' is not a non-negative integer\n", optarg);
                return 2;
            }
            break;
        }
        case 'j': {
            uint32_t v;
            if (s_parse_u32 (optarg, &v) || v < 1 || v > 256) {
                fprintf (stderr, "radix gguf-gen: --threads: '%s' is not 1..256\n", optarg);
                return 2;
            }
            n_threads = (int) v;
            break;
        }
        case 'h': s_usage (stdout); return 0;
        default: s_usage (stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf (stderr, "radix gguf-gen: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!arch_name || !out || (!preset && !n_dims)) {
        fprintf (stderr, "radix gguf-gen: --arch, --out and one of --preset/--dims are required\n");
        s_usage (stderr);
        return 2;
    }
    const struct s_arch *arch = NULL;
    for (size_t i = 0; i < sizeof s_archs / sizeof s_archs[0]; i++)
        if (!strcmp (s_archs[i].name, arch_name)) arch = &s_archs[i];
    if (!arch) {
        fprintf (stderr, "radix gguf-gen: unknown --arch '%s' (known: llama)\n", arch_name);
        return 2;
    }
    int type = -1, mix = 0;
    uint32_t ftype = 0;
    for (size_t i = 0; i < sizeof s_types / sizeof s_types[0]; i++)
        if (!strcasecmp (s_types[i].name, type_name)) {
            type = s_types[i].type;
            ftype = s_types[i].ftype;
            mix = s_types[i].mix;
        }
    if (type < 0) {
        fprintf (stderr, "radix gguf-gen: unknown --type '%s' (f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k "
                 "q4_k_m)\n", type_name);
        return 2;
    }
    if (!rx_quant_supported (type)) {
        fprintf (stderr, "radix gguf-gen: --type %s: this build cannot quantize to %s\n", type_name,
                 rx_dtype_name (type));
        return 1;
    }

    struct s_hp hp = { .preset = NULL, .rope_base = 10000.0f, .eps = 1e-5f };
    if (preset) {
        size_t i, n = sizeof s_presets / sizeof s_presets[0];
        for (i = 0; i < n && strcmp (s_presets[i].preset, preset); i++) {}
        if (i == n) {
            fprintf (stderr, "radix gguf-gen: unknown --preset '%s' (tiny, smollm2-135m, smollm2-360m, "
                             "llama-1b)\n", preset);
            return 2;
        }
        hp = s_presets[i];
    } else {
        hp.ctx = 2048;
    }
    uint32_t vocab_dim = 0;
    for (int i = 0; i < n_dims; i++)
        if (s_parse_dims (dims[i], &hp, &vocab_dim)) return 2;
    if (!preset && !hp.kv_heads) hp.kv_heads = hp.heads;
    const char *why = arch->check (&hp);
    if (why) {
        fprintf (stderr, "radix gguf-gen: --arch %s: %s\n", arch->name, why);
        return 2;
    }

    struct rx_err err = { 0 };
    rx_gguf_t *voc = NULL;
    if (vocab) {
        if (vocab_dim) {
            fprintf (stderr, "radix gguf-gen: --dims vocab= and --vocab exclude each other "
                             "(the vocabulary size is the token count of %s)\n", vocab);
            return 2;
        }
        voc = rx_gguf_open (vocab, &err);
        if (!voc) {
            fprintf (stderr, "radix gguf-gen: %s\n", err.msg);
            return 1;
        }
        int et;
        size_t n;
        if (rx_gguf_get_arr (voc, "tokenizer.ggml.tokens", &et, &n) != RX_OK || et != RX_GGUF_STRING || !n) {
            fprintf (stderr, "radix gguf-gen: %s: no tokenizer.ggml.tokens string array (not a vocabulary?)\n",
                     vocab);
            rx_gguf_close (&voc);
            return 1;
        }
        if (n > UINT32_MAX) {
            fprintf (stderr, "radix gguf-gen: %s: %zu tokens is too many\n", vocab, n);
            rx_gguf_close (&voc);
            return 1;
        }
        hp.vocab = (uint32_t) n;
    } else {
        if (!vocab_dim) {
            fprintf (stderr, "radix gguf-gen: give --vocab V.gguf (or --dims vocab=N for a model without "
                             "a tokenizer)\n");
            return 2;
        }
        hp.vocab = vocab_dim;
    }

    struct s_tlist tl = { 0 };
    rx_gguf_writer_t *w = NULL;
    uint8_t *buf = NULL;
    struct s_job *jobs = NULL;
    float *rows = NULL;
    int status = 1, rc;
    if (arch->tensors (&tl, &hp)) {
        fprintf (stderr, "radix gguf-gen: out of memory\n");
        goto done;
    }

    /* choose each tensor's type; report fallbacks once per (from, to, row) */
    uint64_t max_ne0 = 0, n_params = 0;
    for (size_t i = 0; i < tl.n; i++) {
        struct s_tspec *t = &tl.v[i];
        t->want = t->kind == K_NORM ? RX_F32 : mix ? s_q4_k_m_type (t->name, hp.layers) : type;
        t->type = s_fit_type (t->want, t->ne[0]);
        if (t->ne[0] > max_ne0) max_ne0 = t->ne[0];
        n_params += t->ne[0] * t->ne[1];
    }
    for (size_t i = 0; i < tl.n; i++) {
        const struct s_tspec *t = &tl.v[i];
        if (t->type == t->want) continue;
        int seen = 0;
        size_t count = 0;
        for (size_t j = 0; j < tl.n; j++) {
            const struct s_tspec *u = &tl.v[j];
            if (u->type == u->want) continue;
            if (u->want == t->want && u->type == t->type && u->ne[0] == t->ne[0]) {
                if (j < i) seen = 1;
                count++;
            }
        }
        if (!seen)
            fprintf (stderr, "radix gguf-gen: %s needs rows that are a multiple of %zu; %zu tensor(s) with "
                     "rows of %" PRIu64 " (e.g. %s) are written as %s instead\n", rx_dtype_name (t->want),
                     rx_dtype_block (t->want), count, t->ne[0], t->name, rx_dtype_name (t->type));
    }

    w = rx_gguf_writer_new (out, &err);
    if (!w) goto fail;
    char desc[128];
    snprintf (desc, sizeof desc, "random weights from radix gguf-gen (seed %" PRIu64 ")", seed);
    rc = rx_gguf_writer_add_str (w, "general.architecture", arch->name, &err);
    rc = rc ? rc : rx_gguf_writer_add_str (w, "general.name", name ? name : preset ? preset : "random", &err);
    rc = rc ? rc : rx_gguf_writer_add_str (w, "general.description", desc, &err);
    rc = rc ? rc : rx_gguf_writer_add_u32 (w, "general.file_type", ftype, &err);
    if (!rc && type != RX_F32 && type != RX_F16 && type != RX_BF16)
        rc = rx_gguf_writer_add_u32 (w, "general.quantization_version", 2, &err);
    for (size_t i = 0; voc && !rc && i < rx_gguf_kv_count (voc); i++)
        if (!strncmp (rx_gguf_kv_key (voc, i), "tokenizer.", 10))
            rc = rx_gguf_writer_copy_kv (w, voc, i, &err);
    rc = rc ? rc : arch->meta (w, &hp, &err);
    for (size_t i = 0; !rc && i < tl.n; i++)
        rc = rx_gguf_writer_add_tensor (w, tl.v[i].name, tl.v[i].type, tl.v[i].n_dims, tl.v[i].ne, &err);
    rc = rc ? rc : rx_gguf_writer_begin (w, &err);
    if (rc) goto fail;

    /* a batch buffer of at least one row of the widest tensor in f32 */
    size_t buf_size = (size_t) 8 << 20;
    if (buf_size < max_ne0 * sizeof (float)) buf_size = (size_t) max_ne0 * sizeof (float);
    buf = malloc (buf_size);
    jobs = calloc ((size_t) n_threads, sizeof *jobs);
    rows = malloc ((size_t) n_threads * (size_t) max_ne0 * sizeof *rows);
    if (!buf || !jobs || !rows) {
        fprintf (stderr, "radix gguf-gen: out of memory\n");
        goto done;
    }
    for (int k = 0; k < n_threads; k++) jobs[k].row = rows + (size_t) k * max_ne0;
    for (size_t i = 0; i < tl.n; i++)
        if ((rc = s_write_tensor (w, &tl.v[i], seed, n_threads, jobs, buf, buf_size, &err))) goto fail;
    if ((rc = rx_gguf_writer_finish (w, &err))) goto fail;
    printf ("wrote %s: %s, %zu tensors, %" PRIu64 " parameters, vocab %u, type %s, seed %" PRIu64 "\n",
            out, arch->name, tl.n, n_params, hp.vocab, rx_dtype_name (type), seed);
    status = 0;
    goto done;
fail:
    fprintf (stderr, "radix gguf-gen: %s\n", err.msg);
done:
    free (buf);
    free (jobs);
    free (rows);
    free (tl.v);
    rx_gguf_writer_destroy (&w);
    rx_gguf_close (&voc);
    return status;
}
