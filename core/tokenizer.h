/* core/tokenizer.h -- vocabularies loaded from GGUF metadata, encode and
 * decode.
 *
 * Two tokenizer models, reproducing llama.cpp (and so the Hugging Face
 * tokenizers its test vectors come from) token for token:
 *   "llama" -- SentencePiece BPE: spaces escaped as U+2581, a leading space
 *              added, pieces merged by score, unknown bytes as <0xXX> tokens;
 *   "gpt2"  -- byte-level BPE: the text is split by the pre-tokenizer named
 *              by tokenizer.ggml.pre (a list of PCRE2 regexes per family),
 *              each piece byte-mapped and merged by rank.
 * User-defined tokens (type 4) are always split out of the text before the
 * model runs; control tokens (<s>, <|im_start|>, ...) only with
 * RX_TOK_PARSE_SPECIAL, as llama.cpp's parse_special.
 *
 * Ownership: the tokenizer copies what it needs; the GGUF may be closed
 * after loading.  Thread-safety: read-only after construction; encode and
 * decode keep their state on the caller's stack or heap, so one tokenizer
 * may serve any number of threads (the HTTP process encodes, the
 * detokenizer process decodes with its own instance). */
#ifndef RX_TOKENIZER_H
#define RX_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#include "gguf.h"

typedef struct rx_tokenizer rx_tokenizer_t;

#define RX_TOKEN_NONE  (-1)   /* no such token (e.g. a model without EOT) */
#define RX_TOKEN_UNSET (-2)   /* in rx_vocab_desc: use the model's default */

enum rx_tok_model {
    RX_TOK_MODEL_SPM = 1,     /* tokenizer.ggml.model = "llama" */
    RX_TOK_MODEL_BPE = 2      /* tokenizer.ggml.model = "gpt2" */
};

/* tokenizer.ggml.token_type values (GGUF / llama.cpp). */
enum rx_tok_type {
    RX_TOKTYPE_UNDEFINED = 0, RX_TOKTYPE_NORMAL = 1, RX_TOKTYPE_UNKNOWN = 2,
    RX_TOKTYPE_CONTROL = 3, RX_TOKTYPE_USER_DEFINED = 4, RX_TOKTYPE_UNUSED = 5,
    RX_TOKTYPE_BYTE = 6
};

/* Per-token attribute bits (rx_tokenizer_attr). */
enum rx_tok_attr {
    RX_TOKATTR_NORMAL       = 1 << 0,
    RX_TOKATTR_UNKNOWN      = 1 << 1,
    RX_TOKATTR_CONTROL      = 1 << 2,
    RX_TOKATTR_USER_DEFINED = 1 << 3,
    RX_TOKATTR_UNUSED       = 1 << 4,
    RX_TOKATTR_BYTE         = 1 << 5,
    RX_TOKATTR_LSTRIP       = 1 << 6,  /* swallow whitespace left of it when split out */
    RX_TOKATTR_RSTRIP       = 1 << 7,  /* ... and right of it */
    RX_TOKATTR_EOG          = 1 << 8   /* ends generation (EOS, EOT, <|im_end|>, ...) */
};

/* Encode flags. */
enum {
    RX_TOK_ADD_SPECIAL   = 1 << 0, /* add BOS/EOS as the model says (add_bos_token, ...) */
    RX_TOK_PARSE_SPECIAL = 1 << 1  /* recognise control tokens written in the text */
};

/* Decode flags. */
enum {
    RX_DETOK_SPECIAL     = 1 << 0, /* render control/unknown tokens as their text */
    RX_DETOK_STRIP_SPACE = 1 << 1  /* SPM: drop the leading space the encoder added */
};

/* A string that need not be NUL-terminated. */
struct rx_str {
    const char *s;
    size_t len;
};

/* Everything a tokenizer is built from, independent of GGUF (the loader
 * fills it from tokenizer.* keys; tests build small vocabularies by hand).
 * Initialise with rx_vocab_desc_init, then set what you have.  Pointers are
 * only read during rx_tokenizer_new. */
struct rx_vocab_desc {
    const char *source;            /* for messages: file name or "vocab" */
    const char *model;             /* "llama" or "gpt2" (required) */
    const char *pre;               /* pre-tokenizer name; NULL = "default" */
    const char *name;              /* general.name (a few per-model quirks) */
    size_t n_tokens;
    const struct rx_str *tokens;   /* required */
    const float *scores;           /* NULL = all 0 */
    const int32_t *types;          /* enum rx_tok_type; NULL = all NORMAL */
    size_t n_merges;
    const struct rx_str *merges;   /* "left right", required for gpt2 */
    int32_t bos, eos, unk, pad, eot, eom;  /* RX_TOKEN_UNSET = model default */
    int add_bos, add_eos, add_space_prefix; /* -1 = model default */
    struct rx_str chat_template;   /* tokenizer.chat_template, may be empty */
};

void rx_vocab_desc_init (struct rx_vocab_desc *d);

/* Build a tokenizer.  A bad description (unknown model or pre-tokenizer,
 * duplicate token, missing merges, special id out of range, ...) gives one
 * error naming d->source and the problem.  Caller owns the result. */
rx_tokenizer_t *rx_tokenizer_new (const struct rx_vocab_desc *d, struct rx_err *err);

/* From the tokenizer.* metadata of an open GGUF. */
rx_tokenizer_t *rx_tokenizer_from_gguf (const rx_gguf_t *g, struct rx_err *err);

/* Open path, load the tokenizer, close the file. */
rx_tokenizer_t *rx_tokenizer_open (const char *path, struct rx_err *err);

void rx_tokenizer_free (rx_tokenizer_t **self_p);

/* ---- encode ----------------------------------------------------------- */

/* Tokenize text[0..len) (any bytes; invalid UTF-8 does not fail: SPM
 * byte-falls-back, BPE sees U+FFFD).  *ids is allocated (caller frees with
 * free(); NULL when *n == 0), *n set.  flags: RX_TOK_*.  Thread-safe. */
int rx_tokenizer_encode (const rx_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                         int32_t **ids, size_t *n, struct rx_err *err);

/* ---- decode ----------------------------------------------------------- */

/* The bytes token id stands for (SPM: U+2581 unescaped, <0xXX> as one raw
 * byte; BPE: byte-level mapping undone).  Not NUL-terminated, may be an
 * incomplete UTF-8 sequence; owned by t.  Control/unknown tokens give ""
 * unless flags has RX_DETOK_SPECIAL.  RX_EINVAL for an id out of range. */
int rx_tokenizer_piece (const rx_tokenizer_t *t, int32_t id, unsigned flags,
                        const char **s, size_t *len);

/* Concatenate the pieces of ids into a new NUL-terminated string (caller
 * frees).  Raw bytes: may hold invalid UTF-8 when the ids do (see detok.h
 * for a decoder that never does). */
int rx_tokenizer_decode (const rx_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                         char **text, size_t *len, struct rx_err *err);

/* ---- vocabulary queries ---------------------------------------------- */

int         rx_tokenizer_model (const rx_tokenizer_t *t);     /* enum rx_tok_model */
const char *rx_tokenizer_pre (const rx_tokenizer_t *t);       /* "default", "llama3", ... */
size_t      rx_tokenizer_n_vocab (const rx_tokenizer_t *t);
int32_t     rx_tokenizer_bos (const rx_tokenizer_t *t);       /* or RX_TOKEN_NONE */
int32_t     rx_tokenizer_eos (const rx_tokenizer_t *t);
int32_t     rx_tokenizer_eot (const rx_tokenizer_t *t);
int32_t     rx_tokenizer_unk (const rx_tokenizer_t *t);
int32_t     rx_tokenizer_pad (const rx_tokenizer_t *t);
int         rx_tokenizer_add_bos (const rx_tokenizer_t *t);
int         rx_tokenizer_add_eos (const rx_tokenizer_t *t);
/* Token text as stored in the vocabulary (escaped form), or NULL. */
const char *rx_tokenizer_token_text (const rx_tokenizer_t *t, int32_t id, size_t *len);
/* Id of an exact vocabulary string, or RX_TOKEN_NONE. */
int32_t     rx_tokenizer_find (const rx_tokenizer_t *t, const char *text, size_t len);
unsigned    rx_tokenizer_attr (const rx_tokenizer_t *t, int32_t id);  /* RX_TOKATTR_*; 0 if out of range */
int         rx_tokenizer_is_eog (const rx_tokenizer_t *t, int32_t id);
/* tokenizer.chat_template (NUL-terminated copy), or NULL when absent. */
const char *rx_tokenizer_chat_template (const rx_tokenizer_t *t);

#endif
