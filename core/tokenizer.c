/* core/tokenizer.c -- SPM and byte-level BPE tokenizers (see tokenizer.h).
 *
 * The algorithms follow llama.cpp's src/llama-vocab.cpp closely, because the
 * test vectors (and the tokens a model was trained on) are defined by that
 * behaviour: llm_tokenizer_spm (merge adjacent pieces by score), the BPE
 * session (merge by rank within each pre-tokenized word), the special-token
 * partition and the per-family pre-tokenizer regexes. */
#include "config.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tokenizer.h"
#include "unicode.h"

/* ---- pre-tokenizer families ------------------------------------------- */

/* Regexes as llama.cpp uses them (its comments give the tokenizer.json
 * originals); PCRE2 runs them directly on UTF-8 with Unicode properties. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3 \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

static const char *const s_re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL
};
static const char *const s_re_gpt2[] = { RE_GPT2, NULL };
static const char *const s_re_llama3[] = { RE_LLAMA3, NULL };
static const char *const s_re_qwen2[] = { RE_QWEN2, NULL };
static const char *const s_re_starcoder[] = { "\\p{N}", RE_GPT2, NULL };
static const char *const s_re_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL
};
static const char *const s_re_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"
    "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}"
    "\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"
    "\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"
    "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}"
    "\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}"
    "\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}"
    "\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    RE_CJK,
    "\\p{N}+",
    NULL
};
static const char *const s_re_deepseek_coder[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}", NULL
};
static const char *const s_re_deepseek3[] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
static const char *const s_re_poro[] = { " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+", NULL };
/* Tekken and GPT-4o: tokenizer.json's own regexes (PCRE2 has \p{Lu} etc.). */
static const char *const s_re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
static const char *const s_re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
static const char *const s_re_seed_coder[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL
};
static const char *const s_re_bailing[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL
};

enum {
    PRE_IGNORE_MERGES = 1 << 0,  /* a word that is a whole token skips the merges */
    PRE_ADD_BOS       = 1 << 1,  /* add_bos defaults to true */
    PRE_NO_BOS        = 1 << 2   /* the family has no BOS token */
};

struct s_pre_family {
    const char *names;           /* '|'-separated tokenizer.ggml.pre values */
    const char *const *re;
    unsigned flags;
};

static const struct s_pre_family s_pre_families[] = {
    { "default", s_re_default, 0 },
    { "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
      s_re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
    { "dbrx|smaug-bpe", s_re_llama3, 0 },
    { "glm4|chatglm-bpe", s_re_llama3, PRE_NO_BOS },
    { "deepseek-llm", s_re_deepseek_llm, 0 },
    { "deepseek-coder", s_re_deepseek_coder, 0 },
    { "deepseek-v3|hunyuan-dense|joyai-llm", s_re_deepseek3, 0 },
    { "falcon", s_re_falcon, 0 },
    { "gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|"
      "exaone4|jina-v1-en|jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|granite-docling",
      s_re_gpt2, 0 },
    { "starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", s_re_starcoder, 0 },
    { "qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2",
      s_re_qwen2, 0 },
    { "poro-chat|bloom|gpt3-finnish", s_re_poro, 0 },
    { "tekken", s_re_tekken, PRE_IGNORE_MERGES | PRE_ADD_BOS },
    { "gpt-4o|llama4|kanana2|talkie|minimax-m2", s_re_gpt4o, 0 },
    { "seed-coder", s_re_seed_coder, 0 },
    { "bailingmoe|bailingmoe2|llada-moe", s_re_bailing, 0 },
};

static const struct s_pre_family *s_find_pre (const char *name)
{
    size_t nl = strlen (name);
    for (size_t i = 0; i < sizeof s_pre_families / sizeof s_pre_families[0]; i++) {
        const char *p = s_pre_families[i].names;
        while (*p) {
            const char *bar = strchr (p, '|');
            size_t l = bar ? (size_t) (bar - p) : strlen (p);
            if (l == nl && memcmp (p, name, l) == 0) return &s_pre_families[i];
            p += l + (bar != NULL);
        }
    }
    return NULL;
}

/* ---- string -> index hash map over (base, off[], len[]) ---------------- */

struct s_map {
    uint32_t *slot;          /* index + 1, 0 = empty */
    uint32_t mask;
};

static uint32_t s_hash (const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char) s[i];
        h *= 16777619u;
    }
    return h;
}

static int s_map_init (struct s_map *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    m->slot = calloc (cap, sizeof *m->slot);
    m->mask = (uint32_t) (cap - 1);
    return m->slot ? 0 : -1;
}

/* Find s in the map; returns the index or -1. */
static long s_map_find (const struct s_map *m, const char *base, const uint32_t *off,
                        const uint32_t *len, const char *s, size_t n)
{
    uint32_t i = s_hash (s, n) & m->mask;
    for (;;) {
        uint32_t v = m->slot[i];
        if (!v) return -1;
        v--;
        if (len[v] == n && memcmp (base + off[v], s, n) == 0) return v;
        i = (i + 1) & m->mask;
    }
}

/* Insert index idx; returns -1 if inserted, else the index already there. */
static long s_map_insert (struct s_map *m, const char *base, const uint32_t *off,
                          const uint32_t *len, uint32_t idx)
{
    const char *s = base + off[idx];
    size_t n = len[idx];
    uint32_t i = s_hash (s, n) & m->mask;
    for (;;) {
        uint32_t v = m->slot[i];
        if (!v) {
            m->slot[i] = idx + 1;
            return -1;
        }
        v--;
        if (len[v] == n && memcmp (base + off[v], s, n) == 0) return v;
        i = (i + 1) & m->mask;
    }
}

/* ---- the tokenizer ---------------------------------------------------- */

struct rx_tokenizer {
    int model;                  /* enum rx_tok_model */
    char *pre;                  /* family name as given */
    unsigned pre_flags;
    rx_pretok_t *pretok;        /* BPE only */

    size_t n_vocab;
    char *text;                 /* token texts, each NUL-terminated */
    uint32_t *tok_off, *tok_len;
    float *score;
    uint32_t *attr;
    struct s_map tok_map;

    char *ptext;                /* decoded pieces (specials rendered) */
    uint32_t *piece_off, *piece_len;

    char *mtext;                /* merges "left right", NUL-terminated */
    uint32_t *merge_off, *merge_len;
    size_t n_merges;
    struct s_map merge_map;

    int32_t bos, eos, unk, pad, eot, eom;
    int add_bos, add_eos, add_space_prefix, ignore_merges;

    int32_t byte_tok[256];      /* SPM byte fallback: <0xXX> (or the raw byte) */
    char bmap[256][2];          /* BPE: byte -> UTF-8 of its mapped code point */
    unsigned char bmap_len[256];

    int32_t *special;           /* control/user-defined/unknown ids, longest first */
    size_t n_special;

    char *chat_template;
};

void rx_vocab_desc_init (struct rx_vocab_desc *d)
{
    memset (d, 0, sizeof *d);
    d->source = "vocab";
    d->bos = d->eos = d->unk = d->pad = d->eot = d->eom = RX_TOKEN_UNSET;
    d->add_bos = d->add_eos = d->add_space_prefix = -1;
}

void rx_tokenizer_free (rx_tokenizer_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_tokenizer_t *t = *self_p;
    rx_pretok_free (&t->pretok);
    free (t->pre);
    free (t->text);
    free (t->tok_off);
    free (t->tok_len);
    free (t->score);
    free (t->attr);
    free (t->tok_map.slot);
    free (t->ptext);
    free (t->piece_off);
    free (t->piece_len);
    free (t->mtext);
    free (t->merge_off);
    free (t->merge_len);
    free (t->merge_map.slot);
    free (t->special);
    free (t->chat_template);
    free (t);
    *self_p = NULL;
}

static long s_find (const rx_tokenizer_t *t, const char *s, size_t n)
{
    return s_map_find (&t->tok_map, t->text, t->tok_off, t->tok_len, s, n);
}

static const char *s_tok_text (const rx_tokenizer_t *t, int32_t id)
{
    return t->text + t->tok_off[id];
}

static int32_t s_find_cstr (const rx_tokenizer_t *t, const char *s)
{
    long id = s_find (t, s, strlen (s));
    return id < 0 ? RX_TOKEN_NONE : (int32_t) id;
}

static unsigned s_attr_from_type (int32_t type)
{
    switch (type) {
    case RX_TOKTYPE_NORMAL:       return RX_TOKATTR_NORMAL;
    case RX_TOKTYPE_UNKNOWN:      return RX_TOKATTR_UNKNOWN;
    case RX_TOKTYPE_CONTROL:      return RX_TOKATTR_CONTROL;
    case RX_TOKTYPE_USER_DEFINED: return RX_TOKATTR_USER_DEFINED;
    case RX_TOKTYPE_UNUSED:       return RX_TOKATTR_UNUSED;
    case RX_TOKTYPE_BYTE:         return RX_TOKATTR_BYTE;
    default:                      return 0;   /* undefined: decodes to nothing */
    }
}

/* A growing byte buffer for building arenas and outputs. */
struct s_buf {
    char *p;
    size_t n, cap;
};

static int s_buf_put (struct s_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc (b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy (b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* Parse "<0xXX>"; returns the byte or -1. */
static int s_parse_byte_token (const char *s, size_t n)
{
    if (n != 6 || memcmp (s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The bytes a token stands for, with specials rendered (decode drops them
 * later unless asked).  Mirrors llama.cpp's token_to_piece. */
static int s_build_piece (rx_tokenizer_t *t, int32_t id, struct s_buf *out)
{
    const char *s = s_tok_text (t, id);
    size_t n = t->tok_len[id];
    unsigned a = t->attr[id];
    if (a & (RX_TOKATTR_UNKNOWN | RX_TOKATTR_CONTROL | RX_TOKATTR_USER_DEFINED))
        return s_buf_put (out, s, n);
    if (a & RX_TOKATTR_NORMAL) {
        if (t->model == RX_TOK_MODEL_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp (s + i, "\xE2\x96\x81", 3) == 0) {
                    if (s_buf_put (out, " ", 1) < 0) return -1;
                    i += 3;
                } else {
                    if (s_buf_put (out, s + i, 1) < 0) return -1;
                    i++;
                }
            }
            return 0;
        }
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = rx_utf8_decode (s + i, n - i, &cp);
            int b = rx_unicode_to_byte (cp);
            if (b >= 0) {
                char c = (char) b;
                if (s_buf_put (out, &c, 1) < 0) return -1;
            } else if (s_buf_put (out, s + i, k) < 0) {   /* not byte-level: keep as written */
                return -1;
            }
            i += k;
        }
        return 0;
    }
    if (a & RX_TOKATTR_BYTE) {
        int b = s_parse_byte_token (s, n);
        if (b < 0) return s_buf_put (out, s, n);
        char c = (char) b;
        return s_buf_put (out, &c, 1);
    }
    return 0;   /* unused / undefined tokens decode to nothing */
}

static int s_cmp_special (const void *a, const void *b, void *ctx)
{
    const rx_tokenizer_t *t = ctx;
    int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
    if (t->tok_len[x] != t->tok_len[y]) return t->tok_len[x] > t->tok_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Resolve a special id: the description's value if set and in range,
 * otherwise the default (if in range). */
static int32_t s_pick_id (const rx_tokenizer_t *t, const char *src, const char *what,
                          int32_t given, int32_t dflt)
{
    if (given != RX_TOKEN_UNSET) {
        if (given >= 0 && (size_t) given < t->n_vocab) return given;
        if (given != RX_TOKEN_NONE)
            rx_warn ("%s: %s token id %d is out of range (vocab size %zu), using the default",
                     src, what, given, t->n_vocab);
        else
            return RX_TOKEN_NONE;
    }
    return dflt >= 0 && (size_t) dflt < t->n_vocab ? dflt : RX_TOKEN_NONE;
}

static char *s_strndup (const char *s, size_t n)
{
    char *p = malloc (n + 1);
    if (p) {
        memcpy (p, s, n);
        p[n] = '\0';
    }
    return p;
}

rx_tokenizer_t *rx_tokenizer_new (const struct rx_vocab_desc *d, struct rx_err *err)
{
    const char *src = d->source ? d->source : "vocab";
    rx_tokenizer_t *t = calloc (1, sizeof *t);
    struct s_buf arena = { 0 }, pieces = { 0 };
    if (!t) goto oom;

    if (!d->model) {
        rx_err_set (err, RX_EFORMAT, "%s: tokenizer.ggml.model is missing", src);
        goto fail;
    }
    if (strcmp (d->model, "llama") == 0) t->model = RX_TOK_MODEL_SPM;
    else if (strcmp (d->model, "gpt2") == 0) t->model = RX_TOK_MODEL_BPE;
    else {
        rx_err_set (err, RX_ENOTSUP, "%s: unsupported tokenizer model \"%s\" (supported: llama, gpt2)",
                    src, d->model);
        goto fail;
    }
    if (!d->tokens || d->n_tokens == 0) {
        rx_err_set (err, RX_EFORMAT, "%s: tokenizer.ggml.tokens is missing or empty", src);
        goto fail;
    }
    if (d->n_tokens > (size_t) INT32_MAX) {
        rx_err_set (err, RX_EFORMAT, "%s: %zu tokens is too many", src, d->n_tokens);
        goto fail;
    }

    /* Pre-tokenizer (BPE only; SPM works on the whole text). */
    const struct s_pre_family *fam = NULL;
    const char *pre = d->pre && *d->pre ? d->pre : "default";
    if (!(t->pre = strdup (pre))) goto oom;
    if (t->model == RX_TOK_MODEL_BPE) {
        fam = s_find_pre (pre);
        if (!fam) {
            rx_err_set (err, RX_ENOTSUP, "%s: unknown pre-tokenizer \"%s\" (tokenizer.ggml.pre)", src, pre);
            goto fail;
        }
        if (!d->pre || !*d->pre)
            rx_warn ("%s: no tokenizer.ggml.pre, using the \"default\" pre-tokenizer", src);
        t->pre_flags = fam->flags;
        size_t nre = 0;
        while (fam->re[nre]) nre++;
        if (!(t->pretok = rx_pretok_new (fam->re, nre, err))) goto fail;
    }

    /* Token texts, scores and attributes. */
    t->n_vocab = d->n_tokens;
    t->tok_off = malloc (t->n_vocab * sizeof *t->tok_off);
    t->tok_len = malloc (t->n_vocab * sizeof *t->tok_len);
    t->score = malloc (t->n_vocab * sizeof *t->score);
    t->attr = malloc (t->n_vocab * sizeof *t->attr);
    if (!t->tok_off || !t->tok_len || !t->score || !t->attr) goto oom;
    for (size_t i = 0; i < t->n_vocab; i++) {
        const char *s = d->tokens[i].s;
        size_t n = s ? d->tokens[i].len : 0;
        char empty[32];
        if (n == 0) {
            /* As llama.cpp: an empty token gets a placeholder name. */
            snprintf (empty, sizeof empty, "[EMPTY_%zu]", i);
            s = empty;
            n = strlen (empty);
        }
        if (arena.n + n + 1 > UINT32_MAX) {
            rx_err_set (err, RX_EFORMAT, "%s: token texts too large", src);
            goto fail;
        }
        t->tok_off[i] = (uint32_t) arena.n;
        t->tok_len[i] = (uint32_t) n;
        if (s_buf_put (&arena, s, n) < 0 || s_buf_put (&arena, "", 1) < 0) goto oom;
        t->score[i] = d->scores ? d->scores[i] : 0.0f;
        t->attr[i] = d->types ? s_attr_from_type (d->types[i]) : RX_TOKATTR_NORMAL;
    }
    t->text = arena.p;
    arena.p = NULL;
    if (s_map_init (&t->tok_map, t->n_vocab) < 0) goto oom;
    for (size_t i = 0; i < t->n_vocab; i++) {
        long dup = s_map_insert (&t->tok_map, t->text, t->tok_off, t->tok_len, (uint32_t) i);
        if (dup >= 0) {
            rx_err_set (err, RX_EFORMAT, "%s: duplicate token \"%.40s\" (ids %ld and %zu)",
                        src, s_tok_text (t, (int32_t) i), dup, i);
            goto fail;
        }
    }

    /* Merges (BPE): rank = index of "left right"; the first occurrence wins. */
    if (t->model == RX_TOK_MODEL_BPE) {
        if (!d->merges || d->n_merges == 0) {
            rx_err_set (err, RX_EFORMAT, "%s: tokenizer.ggml.merges is missing (required for gpt2)", src);
            goto fail;
        }
        struct s_buf m = { 0 };
        t->n_merges = d->n_merges;
        t->merge_off = malloc (t->n_merges * sizeof *t->merge_off);
        t->merge_len = malloc (t->n_merges * sizeof *t->merge_len);
        if (!t->merge_off || !t->merge_len) goto oom;
        for (size_t i = 0; i < t->n_merges; i++) {
            size_t n = d->merges[i].s ? d->merges[i].len : 0;
            if (m.n + n + 1 > UINT32_MAX) {
                free (m.p);
                rx_err_set (err, RX_EFORMAT, "%s: merges too large", src);
                goto fail;
            }
            t->merge_off[i] = (uint32_t) m.n;
            t->merge_len[i] = (uint32_t) n;
            if ((n && s_buf_put (&m, d->merges[i].s, n) < 0) || s_buf_put (&m, "", 1) < 0) {
                free (m.p);
                goto oom;
            }
        }
        t->mtext = m.p;
        if (s_map_init (&t->merge_map, t->n_merges) < 0) goto oom;
        for (size_t i = 0; i < t->n_merges; i++) {
            /* A merge without a separating space (index >= 1) can never apply. */
            const char *ms = t->mtext + t->merge_off[i];
            if (t->merge_len[i] < 3 || !memchr (ms + 1, ' ', t->merge_len[i] - 1)) continue;
            (void) s_map_insert (&t->merge_map, t->mtext, t->merge_off, t->merge_len, (uint32_t) i);
        }
    }

    /* Defaults per model, then the description's overrides (llama.cpp). */
    int32_t dbos, deos, dunk;
    if (t->model == RX_TOK_MODEL_SPM) {
        dbos = 1; deos = 2; dunk = 0;
        t->add_space_prefix = 1;
        t->add_bos = 1;
    } else {
        dbos = (t->pre_flags & PRE_NO_BOS) ? RX_TOKEN_NONE : 11;
        deos = 11;
        dunk = RX_TOKEN_NONE;
        t->add_bos = (t->pre_flags & PRE_ADD_BOS) != 0;
        t->ignore_merges = (t->pre_flags & PRE_IGNORE_MERGES) != 0;
    }
    t->bos = s_pick_id (t, src, "BOS", d->bos, dbos);
    t->eos = s_pick_id (t, src, "EOS", d->eos, deos);
    t->unk = s_pick_id (t, src, "UNK", d->unk, dunk);
    t->pad = s_pick_id (t, src, "PAD", d->pad, RX_TOKEN_NONE);
    t->eot = s_pick_id (t, src, "EOT", d->eot, RX_TOKEN_NONE);
    t->eom = s_pick_id (t, src, "EOM", d->eom, RX_TOKEN_NONE);
    if (d->add_bos >= 0) t->add_bos = d->add_bos != 0;
    if (d->add_eos >= 0) t->add_eos = d->add_eos != 0;
    if (d->add_space_prefix >= 0) t->add_space_prefix = d->add_space_prefix != 0;
    if (t->add_bos && t->bos < 0) {
        rx_err_set (err, RX_EFORMAT, "%s: add_bos_token is true but there is no BOS token", src);
        goto fail;
    }
    if (t->add_eos && t->eos < 0) {
        rx_err_set (err, RX_EFORMAT, "%s: add_eos_token is true but there is no EOS token", src);
        goto fail;
    }

    /* End-of-generation tokens, found by text as llama.cpp does; they are
     * control tokens whatever the file says. */
    static const char *const eot_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>", NULL
    };
    static const char *const eog_extra[] = { "<|eom_id|>", NULL };
    for (size_t i = 0; eot_names[i]; i++) {
        int32_t id = s_find_cstr (t, eot_names[i]);
        if (id < 0) continue;
        if (t->eot == RX_TOKEN_NONE && d->eot == RX_TOKEN_UNSET) t->eot = id;
        t->attr[id] |= RX_TOKATTR_CONTROL | RX_TOKATTR_EOG;
    }
    for (size_t i = 0; eog_extra[i]; i++) {
        int32_t id = s_find_cstr (t, eog_extra[i]);
        if (id < 0) continue;
        if (t->eom == RX_TOKEN_NONE && d->eom == RX_TOKEN_UNSET) t->eom = id;
        t->attr[id] |= RX_TOKATTR_CONTROL | RX_TOKATTR_EOG;
    }
    if (t->eos >= 0) t->attr[t->eos] |= RX_TOKATTR_EOG;
    if (t->eot >= 0) t->attr[t->eot] |= RX_TOKATTR_EOG;
    if (t->eom >= 0) t->attr[t->eom] |= RX_TOKATTR_EOG;

    /* Tokens split out of the text before the model runs. */
    t->special = malloc (t->n_vocab * sizeof *t->special);
    if (!t->special) goto oom;
    for (size_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (RX_TOKATTR_CONTROL | RX_TOKATTR_USER_DEFINED | RX_TOKATTR_UNKNOWN))
            t->special[t->n_special++] = (int32_t) i;
    qsort_r (t->special, t->n_special, sizeof *t->special, s_cmp_special, t);

    /* Phi-3 quirk (llama.cpp): its specials swallow whitespace to their right. */
    if (d->name) {
        char lname[128];
        size_t k = 0;
        for (; d->name[k] && k + 1 < sizeof lname; k++)
            lname[k] = (char) tolower ((unsigned char) d->name[k]);
        lname[k] = '\0';
        if (strstr (lname, "phi-3") || strstr (lname, "phi3")) {
            for (size_t i = 0; i < t->n_special; i++) t->attr[t->special[i]] |= RX_TOKATTR_RSTRIP;
            int32_t id = s_find_cstr (t, "</s>");
            if (id >= 0) t->attr[id] |= RX_TOKATTR_RSTRIP;
            static const char *const keep[] = { "<unk>", "<s>", "<|endoftext|>", NULL };
            for (size_t i = 0; keep[i]; i++)
                if ((id = s_find_cstr (t, keep[i])) >= 0) t->attr[id] &= ~(unsigned) RX_TOKATTR_RSTRIP;
        }
    }

    /* Byte fallback and byte-level mapping tables. */
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf (name, sizeof name, "<0x%02X>", b);
        int32_t id = s_find_cstr (t, name);
        if (id < 0) {
            char c = (char) b;
            long l = s_find (t, &c, 1);
            id = l < 0 ? RX_TOKEN_NONE : (int32_t) l;
        }
        t->byte_tok[b] = id;
        uint32_t cp = rx_byte_to_unicode ((uint8_t) b);
        t->bmap_len[b] = (unsigned char) rx_utf8_encode (cp, t->bmap[b]);
    }
    if (t->model == RX_TOK_MODEL_BPE) {
        /* A byte-level vocabulary may lack a byte its training data never
         * had (StarCoder: 0xF1, the lead byte of the unassigned planes 4-7).
         * Encode then drops that byte, as llama.cpp and HF tokenizers do;
         * say so once here rather than per request.  Only bytes that valid
         * UTF-8 can hold count (the others become U+FFFD first). */
        char list[256 * 5 + 1];
        size_t o = 0, nlost = 0;
        for (int b = 0; b < 256; b++) {
            if (b == 0xC0 || b == 0xC1 || b > 0xF4) continue;
            if (s_find (t, t->bmap[b], t->bmap_len[b]) >= 0) continue;
            o += (size_t) snprintf (list + o, sizeof list - o, " 0x%02X", b);
            nlost++;
        }
        if (nlost)
            rx_info ("%s: byte-level vocabulary has no token for byte(s)%s; text containing "
                     "them loses those bytes when encoded (as llama.cpp)", src, list);
    }

    /* Pieces for decoding. */
    t->piece_off = malloc (t->n_vocab * sizeof *t->piece_off);
    t->piece_len = malloc (t->n_vocab * sizeof *t->piece_len);
    if (!t->piece_off || !t->piece_len) goto oom;
    for (size_t i = 0; i < t->n_vocab; i++) {
        size_t before = pieces.n;
        if (s_build_piece (t, (int32_t) i, &pieces) < 0) goto oom;
        t->piece_off[i] = (uint32_t) before;
        t->piece_len[i] = (uint32_t) (pieces.n - before);
    }
    if (!pieces.p && s_buf_put (&pieces, "", 0) < 0) goto oom;
    t->ptext = pieces.p;
    pieces.p = NULL;

    if (d->chat_template.s && d->chat_template.len) {
        if (!(t->chat_template = s_strndup (d->chat_template.s, d->chat_template.len))) goto oom;
    }
    return t;

oom:
    rx_err_set (err, RX_ENOMEM, "%s: out of memory loading the tokenizer", src);
fail:
    free (arena.p);
    free (pieces.p);
    rx_tokenizer_free (&t);
    return NULL;
}

/* ---- GGUF loading ----------------------------------------------------- */

static int s_gguf_str (const rx_gguf_t *g, const char *key, char **out, struct rx_err *err)
{
    const char *s;
    size_t n;
    *out = NULL;
    int rc = rx_gguf_get_str (g, key, &s, &n);
    if (rc == RX_ENOENT) return RX_OK;
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: %s is not a string", rx_gguf_path (g), key);
    if (!(*out = s_strndup (s, n)))
        return rx_err_set (err, RX_ENOMEM, "%s: out of memory", rx_gguf_path (g));
    return RX_OK;
}

static int s_gguf_id (const rx_gguf_t *g, const char *key, int32_t *out, struct rx_err *err)
{
    uint32_t v;
    int rc = rx_gguf_get_u32 (g, key, &v);
    if (rc == RX_ENOENT) return RX_OK;
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: %s is not an unsigned integer", rx_gguf_path (g), key);
    *out = v > (uint32_t) INT32_MAX ? INT32_MAX : (int32_t) v;
    return RX_OK;
}

static int s_gguf_flag (const rx_gguf_t *g, const char *key, int *out, struct rx_err *err)
{
    int v;
    int rc = rx_gguf_get_bool (g, key, &v);
    if (rc == RX_ENOENT) return RX_OK;
    if (rc != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: %s is not a bool", rx_gguf_path (g), key);
    *out = v != 0;
    return RX_OK;
}

/* A string array as rx_str views into the mapping (caller frees the array). */
static int s_gguf_str_array (const rx_gguf_t *g, const char *key, struct rx_str **out, size_t *n,
                             int required, struct rx_err *err)
{
    int et;
    *out = NULL;
    *n = 0;
    int rc = rx_gguf_get_arr (g, key, &et, n);
    if (rc == RX_ENOENT) {
        if (required) return rx_err_set (err, RX_EFORMAT, "%s: %s is missing", rx_gguf_path (g), key);
        return RX_OK;
    }
    if (rc != RX_OK || et != RX_GGUF_STRING)
        return rx_err_set (err, RX_EFORMAT, "%s: %s is not an array of strings", rx_gguf_path (g), key);
    if (*n == 0) return RX_OK;
    struct rx_str *v = malloc (*n * sizeof *v);
    if (!v) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", rx_gguf_path (g));
    for (size_t i = 0; i < *n; i++) {
        if (rx_gguf_arr_str (g, key, i, &v[i].s, &v[i].len) != RX_OK) {
            free (v);
            return rx_err_set (err, RX_EFORMAT, "%s: %s[%zu] cannot be read", rx_gguf_path (g), key, i);
        }
    }
    *out = v;
    return RX_OK;
}

/* A numeric array of at least n_min 4-byte elements of type want (or
 * alt), copied out (GGUF arrays need not be aligned). */
static int s_gguf_num_array (const rx_gguf_t *g, const char *key, int want, int alt, size_t n_min,
                             void **out, int *type, struct rx_err *err)
{
    int et;
    size_t n;
    const void *data;
    *out = NULL;
    int rc = rx_gguf_get_arr (g, key, &et, &n);
    if (rc == RX_ENOENT) return RX_OK;
    if (rc != RX_OK || (et != want && et != alt))
        return rx_err_set (err, RX_EFORMAT, "%s: %s has the wrong element type", rx_gguf_path (g), key);
    if (n < n_min)
        return rx_err_set (err, RX_EFORMAT, "%s: %s has %zu entries, fewer than the %zu tokens",
                           rx_gguf_path (g), key, n, n_min);
    if (rx_gguf_arr_data (g, key, &data) != RX_OK)
        return rx_err_set (err, RX_EFORMAT, "%s: %s cannot be read", rx_gguf_path (g), key);
    void *v = malloc (n_min * 4 + 4);
    if (!v) return rx_err_set (err, RX_ENOMEM, "%s: out of memory", rx_gguf_path (g));
    memcpy (v, data, n_min * 4);
    *out = v;
    *type = et;
    return RX_OK;
}

rx_tokenizer_t *rx_tokenizer_from_gguf (const rx_gguf_t *g, struct rx_err *err)
{
    struct rx_vocab_desc d;
    rx_vocab_desc_init (&d);
    d.source = rx_gguf_path (g);
    char *model = NULL, *pre = NULL, *name = NULL;
    struct rx_str *tokens = NULL, *merges = NULL;
    void *scores = NULL, *types = NULL;
    float *fscores = NULL;
    rx_tokenizer_t *t = NULL;
    int st = 0, tt = 0;

    if (s_gguf_str (g, "tokenizer.ggml.model", &model, err) != RX_OK) goto done;
    if (!model) {
        rx_err_set (err, RX_EFORMAT, "%s: no tokenizer in this file (tokenizer.ggml.model is missing)",
                    rx_gguf_path (g));
        goto done;
    }
    if (s_gguf_str (g, "tokenizer.ggml.pre", &pre, err) != RX_OK) goto done;
    if (s_gguf_str (g, "general.name", &name, err) != RX_OK) goto done;
    if (s_gguf_str_array (g, "tokenizer.ggml.tokens", &tokens, &d.n_tokens, 1, err) != RX_OK) goto done;
    if (!tokens) {
        rx_err_set (err, RX_EFORMAT, "%s: tokenizer.ggml.tokens is empty", rx_gguf_path (g));
        goto done;
    }
    if (s_gguf_num_array (g, "tokenizer.ggml.scores", RX_GGUF_FLOAT32, RX_GGUF_INT32, d.n_tokens,
                          &scores, &st, err) != RX_OK)
        goto done;
    if (scores && st == RX_GGUF_INT32) {
        /* Integer scores (some converters): as floats. */
        if (!(fscores = malloc (d.n_tokens * sizeof *fscores))) goto oom;
        for (size_t i = 0; i < d.n_tokens; i++) fscores[i] = (float) ((const int32_t *) scores)[i];
        d.scores = fscores;
    } else {
        d.scores = scores;
    }
    if (s_gguf_num_array (g, "tokenizer.ggml.token_type", RX_GGUF_INT32, RX_GGUF_INT32, d.n_tokens,
                          &types, &tt, err) != RX_OK)
        goto done;
    d.types = types;
    if (s_gguf_str_array (g, "tokenizer.ggml.merges", &merges, &d.n_merges, 0, err) != RX_OK) goto done;
    d.merges = merges;
    if (s_gguf_id (g, "tokenizer.ggml.bos_token_id", &d.bos, err) != RX_OK ||
        s_gguf_id (g, "tokenizer.ggml.eos_token_id", &d.eos, err) != RX_OK ||
        s_gguf_id (g, "tokenizer.ggml.eot_token_id", &d.eot, err) != RX_OK ||
        s_gguf_id (g, "tokenizer.ggml.eom_token_id", &d.eom, err) != RX_OK ||
        s_gguf_id (g, "tokenizer.ggml.unknown_token_id", &d.unk, err) != RX_OK ||
        s_gguf_id (g, "tokenizer.ggml.padding_token_id", &d.pad, err) != RX_OK ||
        s_gguf_flag (g, "tokenizer.ggml.add_bos_token", &d.add_bos, err) != RX_OK ||
        s_gguf_flag (g, "tokenizer.ggml.add_eos_token", &d.add_eos, err) != RX_OK ||
        s_gguf_flag (g, "tokenizer.ggml.add_space_prefix", &d.add_space_prefix, err) != RX_OK)
        goto done;
    {
        const char *s;
        size_t n;
        int rc = rx_gguf_get_str (g, "tokenizer.chat_template", &s, &n);
        if (rc == RX_OK) {
            d.chat_template.s = s;
            d.chat_template.len = n;
        } else if (rc != RX_ENOENT) {
            rx_err_set (err, RX_EFORMAT, "%s: tokenizer.chat_template is not a string", rx_gguf_path (g));
            goto done;
        }
    }
    d.model = model;
    d.pre = pre;
    d.name = name;
    d.tokens = tokens;
    t = rx_tokenizer_new (&d, err);
    goto done;
oom:
    rx_err_set (err, RX_ENOMEM, "%s: out of memory", rx_gguf_path (g));
done:
    free (model);
    free (pre);
    free (name);
    free (tokens);
    free (merges);
    free (scores);
    free (fscores);
    free (types);
    return t;
}

rx_tokenizer_t *rx_tokenizer_open (const char *path, struct rx_err *err)
{
    rx_gguf_t *g = rx_gguf_open (path, err);
    if (!g) return NULL;
    rx_tokenizer_t *t = rx_tokenizer_from_gguf (g, err);
    rx_gguf_close (&g);
    return t;
}

/* ---- encode ----------------------------------------------------------- */

struct s_ids {
    int32_t *v;
    size_t n, cap;
    int oom;
};

static void s_ids_push (struct s_ids *o, int32_t id)
{
    if (o->oom) return;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc (o->v, cap * sizeof *v);
        if (!v) {
            o->oom = 1;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* A symbol: a run of bytes of the text being merged, in a linked list. */
struct s_sym {
    int prev, next;
    size_t off, n;
};

/* A candidate merge of two adjacent symbols.  Lower key first, then the
 * leftmost: SPM uses key = -score, BPE key = rank. */
struct s_bigram {
    int left, right;
    double key;
    size_t size;
};

struct s_heap {
    struct s_bigram *v;
    size_t n, cap;
    int oom;
};

static int s_bg_less (const struct s_bigram *a, const struct s_bigram *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static void s_heap_push (struct s_heap *h, struct s_bigram b)
{
    if (h->oom) return;
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct s_bigram *v = realloc (h->v, cap * sizeof *v);
        if (!v) {
            h->oom = 1;
            return;
        }
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_bg_less (&b, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
}

static struct s_bigram s_heap_pop (struct s_heap *h)
{
    struct s_bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && s_bg_less (&h->v[c + 1], &h->v[c])) c++;
        if (!s_bg_less (&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* Split s[0..n) into UTF-8 characters (lenient lengths, as llama.cpp). */
static struct s_sym *s_symbols (const char *s, size_t n, int *count)
{
    struct s_sym *sym = malloc ((n ? n : 1) * sizeof *sym);
    if (!sym) return NULL;
    int k = 0;
    for (size_t off = 0; off < n;) {
        size_t len = rx_utf8_len ((unsigned char) s[off]);
        if (len > n - off) len = n - off;
        sym[k].off = off;
        sym[k].n = len;
        sym[k].prev = k - 1;
        off += len;
        sym[k].next = off == n ? -1 : k + 1;
        k++;
    }
    *count = k;
    return sym;
}

static void s_merge (struct s_sym *sym, const struct s_bigram *b)
{
    struct s_sym *l = &sym[b->left], *r = &sym[b->right];
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) sym[r->next].prev = b->left;
}

static void s_spm_try (const rx_tokenizer_t *t, const char *s, struct s_sym *sym, struct s_heap *h,
                       int left, int right)
{
    if (left < 0 || right < 0) return;
    size_t len = sym[left].n + sym[right].n;
    long id = s_find (t, s + sym[left].off, len);
    if (id < 0) return;
    struct s_bigram b = { left, right, -(double) t->score[id], len };
    s_heap_push (h, b);
}

/* SentencePiece BPE on one already-escaped fragment. */
static int s_spm_encode (const rx_tokenizer_t *t, const char *s, size_t n, struct s_ids *out)
{
    int count;
    struct s_sym *sym = s_symbols (s, n, &count);
    if (!sym) return -1;
    struct s_heap h = { 0 };
    for (int i = 1; i < count; i++) s_spm_try (t, s, sym, &h, i - 1, i);
    while (h.n && !h.oom) {
        struct s_bigram b = s_heap_pop (&h);
        struct s_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;   /* stale */
        s_merge (sym, &b);
        s_spm_try (t, s, sym, &h, l->prev, b.left);
        s_spm_try (t, s, sym, &h, b.left, l->next);
    }
    int oom = h.oom;
    free (h.v);
    if (!oom && count > 0) {
        for (int i = 0; i != -1; i = sym[i].next) {
            long id = s_find (t, s + sym[i].off, sym[i].n);
            if (id >= 0) {
                s_ids_push (out, (int32_t) id);
                continue;
            }
            /* Not in the vocabulary: one token per byte. */
            for (size_t j = 0; j < sym[i].n; j++) {
                int32_t bt = t->byte_tok[(unsigned char) s[sym[i].off + j]];
                if (bt < 0) bt = t->unk;
                if (bt >= 0) s_ids_push (out, bt);
            }
        }
    }
    free (sym);
    return oom ? -1 : 0;
}

static long s_merge_rank (const rx_tokenizer_t *t, const char *w, const struct s_sym *a,
                          const struct s_sym *b, char *scratch)
{
    memcpy (scratch, w + a->off, a->n);
    scratch[a->n] = ' ';
    memcpy (scratch + a->n + 1, w + b->off, b->n);
    return s_map_find (&t->merge_map, t->mtext, t->merge_off, t->merge_len, scratch, a->n + 1 + b->n);
}

static void s_bpe_try (const rx_tokenizer_t *t, const char *w, struct s_sym *sym, struct s_heap *h,
                       int left, int right, char *scratch)
{
    if (left < 0 || right < 0) return;
    long rank = s_merge_rank (t, w, &sym[left], &sym[right], scratch);
    if (rank < 0) return;
    struct s_bigram b = { left, right, (double) rank, sym[left].n + sym[right].n };
    s_heap_push (h, b);
}

/* Byte-level BPE on one byte-mapped word. */
static int s_bpe_word (const rx_tokenizer_t *t, const char *w, size_t n, struct s_ids *out)
{
    if (t->ignore_merges) {
        long id = s_find (t, w, n);
        if (id >= 0) {
            s_ids_push (out, (int32_t) id);
            return 0;
        }
    }
    int count;
    struct s_sym *sym = s_symbols (w, n, &count);
    char *scratch = malloc (n + 2);
    if (!sym || !scratch) {
        free (sym);
        free (scratch);
        return -1;
    }
    struct s_heap h = { 0 };
    for (int i = 1; i < count; i++) s_bpe_try (t, w, sym, &h, i - 1, i, scratch);
    while (h.n && !h.oom) {
        struct s_bigram b = s_heap_pop (&h);
        struct s_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;   /* stale */
        s_merge (sym, &b);
        s_bpe_try (t, w, sym, &h, l->prev, b.left, scratch);
        s_bpe_try (t, w, sym, &h, b.left, l->next, scratch);
    }
    int oom = h.oom;
    free (h.v);
    if (!oom && count > 0) {
        for (int i = 0; i != -1; i = sym[i].next) {
            long id = s_find (t, w + sym[i].off, sym[i].n);
            if (id >= 0) {
                s_ids_push (out, (int32_t) id);
                continue;
            }
            /* As llama.cpp: try each byte of the mapped text on its own.  A
             * mapped byte the vocabulary lacks (StarCoder's 0xF1 -> U+00F1)
             * ends up with no token: it is dropped, as in llama.cpp. */
            for (size_t j = 0; j < sym[i].n; j++) {
                long b = s_find (t, w + sym[i].off + j, 1);
                if (b >= 0) s_ids_push (out, (int32_t) b);
            }
        }
    }
    free (sym);
    free (scratch);
    return oom ? -1 : 0;
}

static int s_bpe_encode (const rx_tokenizer_t *t, const char *text, size_t len, struct s_ids *out,
                         struct rx_err *err)
{
    size_t n;
    char *s = rx_utf8_sanitize (text, len, &n);
    if (!s) return rx_err_set (err, RX_ENOMEM, "tokenizer: out of memory");
    struct rx_span *sp = NULL;
    size_t nsp = 0;
    int rc = rx_pretok_split (t->pretok, s, n, &sp, &nsp, err);
    struct s_buf w = { 0 };
    for (size_t i = 0; rc == RX_OK && i < nsp; i++) {
        w.n = 0;
        for (size_t j = 0; j < sp[i].len; j++) {
            unsigned char c = (unsigned char) s[sp[i].off + j];
            if (s_buf_put (&w, t->bmap[c], t->bmap_len[c]) < 0) {
                rc = rx_err_set (err, RX_ENOMEM, "tokenizer: out of memory");
                break;
            }
        }
        if (rc == RX_OK && w.n && s_bpe_word (t, w.p, w.n, out) < 0)
            rc = rx_err_set (err, RX_ENOMEM, "tokenizer: out of memory");
    }
    free (w.p);
    free (sp);
    free (s);
    return rc;
}

/* A piece of the input: raw text or an already-known token. */
struct s_frag {
    int32_t id;          /* >= 0: a token; -1: raw text */
    size_t off, len;
};

struct s_frags {
    struct s_frag *v;
    size_t n, cap;
};

static int s_frag_push (struct s_frags *f, int32_t id, size_t off, size_t len)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        struct s_frag *v = realloc (f->v, cap * sizeof *v);
        if (!v) return -1;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n].id = id;
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->n++;
    return 0;
}

static int s_isspace (char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Split special tokens out of the raw fragments, longest tokens first
 * (llama.cpp's tokenizer_st_partition). */
static int s_partition (const rx_tokenizer_t *t, const char *text, size_t len, int parse_special,
                        struct s_frags *out)
{
    struct s_frags cur = { 0 }, next = { 0 };
    if (s_frag_push (&cur, -1, 0, len) < 0) return -1;
    unsigned char present[256] = { 0 };
    for (size_t i = 0; i < len; i++) present[(unsigned char) text[i]] = 1;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        unsigned a = t->attr[id];
        if (!parse_special && (a & (RX_TOKATTR_CONTROL | RX_TOKATTR_UNKNOWN))) continue;
        const char *tt = s_tok_text (t, id);
        size_t tl = t->tok_len[id];
        if (tl > len || !present[(unsigned char) tt[0]] || !memmem (text, len, tt, tl)) continue;
        next.n = 0;
        for (size_t i = 0; i < cur.n; i++) {
            struct s_frag f = cur.v[i];
            if (f.id >= 0) {
                if (s_frag_push (&next, f.id, 0, 0) < 0) goto oom;
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            for (;;) {
                const char *m = pos < end ? memmem (text + pos, end - pos, tt, tl) : NULL;
                if (!m) {
                    if (pos < end && s_frag_push (&next, -1, pos, end - pos) < 0) goto oom;
                    break;
                }
                size_t ms = (size_t) (m - text), llen = ms - pos;
                if (a & RX_TOKATTR_LSTRIP)
                    while (llen > 0 && s_isspace (text[pos + llen - 1])) llen--;
                if (llen > 0 && s_frag_push (&next, -1, pos, llen) < 0) goto oom;
                if (s_frag_push (&next, id, 0, 0) < 0) goto oom;
                pos = ms + tl;
                if (pos >= end) break;
                if (a & RX_TOKATTR_RSTRIP)
                    while (pos < end && s_isspace (text[pos])) pos++;
            }
        }
        struct s_frags tmp = cur;
        cur = next;
        next = tmp;
    }
    free (next.v);
    *out = cur;
    return 0;
oom:
    free (cur.v);
    free (next.v);
    return -1;
}

int rx_tokenizer_encode (const rx_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                         int32_t **ids, size_t *n, struct rx_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!text && len) return rx_err_set (err, RX_EINVAL, "tokenizer: NULL text");
    struct s_ids out = { 0 };
    struct s_frags fr = { 0 };
    int rc = RX_OK;
    const int add_special = (flags & RX_TOK_ADD_SPECIAL) != 0;

    if (len > 0 && s_partition (t, text, len, (flags & RX_TOK_PARSE_SPECIAL) != 0, &fr) < 0) {
        rc = rx_err_set (err, RX_ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (add_special && t->add_bos) s_ids_push (&out, t->bos);

    if (t->model == RX_TOK_MODEL_SPM) {
        int prev_special = 1;        /* the first text gets the space prefix */
        struct s_buf esc = { 0 };
        for (size_t i = 0; i < fr.n && rc == RX_OK; i++) {
            if (fr.v[i].id >= 0) {
                s_ids_push (&out, fr.v[i].id);
                prev_special = 1;
                continue;
            }
            esc.n = 0;
            int bad = 0;
            if (t->add_space_prefix && prev_special) bad |= s_buf_put (&esc, "\xE2\x96\x81", 3);
            for (size_t j = 0; j < fr.v[i].len && !bad; j++) {
                char c = text[fr.v[i].off + j];
                bad |= c == ' ' ? s_buf_put (&esc, "\xE2\x96\x81", 3) : s_buf_put (&esc, &c, 1);
            }
            if (bad || s_spm_encode (t, esc.p, esc.n, &out) < 0)
                rc = rx_err_set (err, RX_ENOMEM, "tokenizer: out of memory");
            prev_special = 0;
        }
        free (esc.p);
    } else {
        for (size_t i = 0; i < fr.n && rc == RX_OK; i++) {
            if (fr.v[i].id >= 0) s_ids_push (&out, fr.v[i].id);
            else rc = s_bpe_encode (t, text + fr.v[i].off, fr.v[i].len, &out, err);
        }
    }
    if (rc == RX_OK && add_special && t->add_eos) s_ids_push (&out, t->eos);
    if (rc == RX_OK && out.oom) rc = rx_err_set (err, RX_ENOMEM, "tokenizer: out of memory");
done:
    free (fr.v);
    if (rc != RX_OK) {
        free (out.v);
        return rc;
    }
    *ids = out.v;
    *n = out.n;
    return RX_OK;
}

/* ---- decode ----------------------------------------------------------- */

int rx_tokenizer_piece (const rx_tokenizer_t *t, int32_t id, unsigned flags,
                        const char **s, size_t *len)
{
    if (id < 0 || (size_t) id >= t->n_vocab) {
        *s = "";
        *len = 0;
        return RX_EINVAL;
    }
    if (!(flags & RX_DETOK_SPECIAL) && (t->attr[id] & (RX_TOKATTR_CONTROL | RX_TOKATTR_UNKNOWN))) {
        *s = "";
        *len = 0;
        return RX_OK;
    }
    *s = t->ptext + t->piece_off[id];
    *len = t->piece_len[id];
    return RX_OK;
}

int rx_tokenizer_decode (const rx_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                         char **text, size_t *len, struct rx_err *err)
{
    struct s_buf b = { 0 };
    int strip = (flags & RX_DETOK_STRIP_SPACE) && t->add_space_prefix;
    *text = NULL;
    if (len) *len = 0;
    if (s_buf_put (&b, "", 0) < 0) goto oom;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        if (rx_tokenizer_piece (t, ids[i], flags, &s, &l) != RX_OK) {
            free (b.p);
            return rx_err_set (err, RX_EINVAL, "detokenize: token id %d at position %zu is out of range "
                               "(vocab size %zu)", ids[i], i, t->n_vocab);
        }
        if (strip && l > 0) {
            if (s[0] == ' ') {
                s++;
                l--;
            }
            strip = 0;
        }
        if (s_buf_put (&b, s, l) < 0) goto oom;
    }
    *text = b.p;
    if (len) *len = b.n;
    return RX_OK;
oom:
    free (b.p);
    return rx_err_set (err, RX_ENOMEM, "detokenize: out of memory");
}

/* ---- queries ---------------------------------------------------------- */

int rx_tokenizer_model (const rx_tokenizer_t *t) { return t->model; }
const char *rx_tokenizer_pre (const rx_tokenizer_t *t) { return t->pre; }
size_t rx_tokenizer_n_vocab (const rx_tokenizer_t *t) { return t->n_vocab; }
int32_t rx_tokenizer_bos (const rx_tokenizer_t *t) { return t->bos; }
int32_t rx_tokenizer_eos (const rx_tokenizer_t *t) { return t->eos; }
int32_t rx_tokenizer_eot (const rx_tokenizer_t *t) { return t->eot; }
int32_t rx_tokenizer_unk (const rx_tokenizer_t *t) { return t->unk; }
int32_t rx_tokenizer_pad (const rx_tokenizer_t *t) { return t->pad; }
int rx_tokenizer_add_bos (const rx_tokenizer_t *t) { return t->add_bos; }
int rx_tokenizer_add_eos (const rx_tokenizer_t *t) { return t->add_eos; }

const char *rx_tokenizer_token_text (const rx_tokenizer_t *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t) id >= t->n_vocab) return NULL;
    if (len) *len = t->tok_len[id];
    return s_tok_text (t, id);
}

int32_t rx_tokenizer_find (const rx_tokenizer_t *t, const char *text, size_t len)
{
    long id = s_find (t, text, len);
    return id < 0 ? RX_TOKEN_NONE : (int32_t) id;
}

unsigned rx_tokenizer_attr (const rx_tokenizer_t *t, int32_t id)
{
    if (id < 0 || (size_t) id >= t->n_vocab) return 0;
    return t->attr[id];
}

int rx_tokenizer_is_eog (const rx_tokenizer_t *t, int32_t id)
{
    return (rx_tokenizer_attr (t, id) & RX_TOKATTR_EOG) != 0;
}

const char *rx_tokenizer_chat_template (const rx_tokenizer_t *t)
{
    return t->chat_template;
}
