/* core/chat.h -- chat templates: recognise the family of a GGUF's
 * tokenizer.chat_template and render a message list the way that family's
 * official Jinja template does.  Not a Jinja engine: a template that matches
 * no known family is an error that says so, and the operator names a family
 * instead (INI / CLI override, rx_chat_template_named).
 *
 * The rendered text is the whole prompt, including the BOS text where the
 * official template writes bos_token (Llama 2/3, Mistral, DeepSeek).  Encode
 * it with RX_TOK_PARSE_SPECIAL and without RX_TOK_ADD_SPECIAL, as Hugging
 * Face's apply_chat_template(tokenize=True) does, so BOS is never doubled.
 *
 * Families:
 *   chatml     <|im_start|>role\ncontent<|im_end|>\n  (Qwen, SmolLM2, ...; a
 *              default system prompt written in the template is used when
 *              the conversation has none)
 *   llama2     <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>
 *   llama3     <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *              (the Llama 3.0 form; 3.1+ templates also add a "Cutting
 *              Knowledge Date" system preamble, which is not reproduced)
 *   mistral    <s>[INST] user[/INST] answer</s>; the system prompt goes in
 *              front of the last user message (Mistral v0.2/v0.3 templates;
 *              v0.1, v3-tekken and v7 are not recognised)
 *   deepseek2  <bos>sys\n\nUser: ...\n\nAssistant: ...<eos>
 *   deepseek3  <bos>sys<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
 *   zephyr     <|role|>\ncontent</s>\n
 * Thread-safe: pure functions over caller data. */
#ifndef RX_CHAT_H
#define RX_CHAT_H

#include <stddef.h>

#include <radix/err.h>

enum rx_chat_family {
    RX_CHAT_UNKNOWN = 0,
    RX_CHAT_CHATML,
    RX_CHAT_LLAMA2,
    RX_CHAT_LLAMA3,
    RX_CHAT_MISTRAL,
    RX_CHAT_DEEPSEEK2,
    RX_CHAT_DEEPSEEK3,
    RX_CHAT_ZEPHYR
};

struct rx_chat_msg {
    const char *role;        /* "system", "user" or "assistant" */
    const char *content;     /* NUL-terminated */
};

/* A recognised template.  Owns default_system. */
struct rx_chat_template {
    enum rx_chat_family family;
    char *default_system;    /* chatml: system prompt used when none is given, or NULL */
    char *eos_override;      /* zephyr: a literal end-of-turn written in the template, or NULL */
};

/* "chatml", "llama2", ...; NULL for RX_CHAT_UNKNOWN. */
const char *rx_chat_family_name (enum rx_chat_family f);

/* Recognise a tokenizer.chat_template.  An empty or NULL template, or one of
 * no known family, is RX_ENOTSUP with a message that quotes its start and
 * says how to choose a family. */
int rx_chat_template_detect (struct rx_chat_template *t, const char *tmpl, struct rx_err *err);

/* A family by name (the INI/CLI override): RX_EINVAL naming the bad name and
 * listing the known ones. */
int rx_chat_template_named (struct rx_chat_template *t, const char *name, struct rx_err *err);

void rx_chat_template_fini (struct rx_chat_template *t);

/* Render msgs[0..n) (add_generation_prompt: end with the assistant header).
 * bos/eos: the vocabulary's BOS/EOS texts ("" if none).  *out is a new
 * NUL-terminated string (caller frees).  A role the family cannot place, or
 * roles that do not alternate where the family requires it, is RX_EINVAL
 * naming the message. */
int rx_chat_render (const struct rx_chat_template *t, const struct rx_chat_msg *msgs, size_t n,
                    int add_generation_prompt, const char *bos, const char *eos,
                    char **out, size_t *len, struct rx_err *err);

#endif
