/* tests/unit/test_chat.c -- chat template families: detection from real
 * tokenizer.chat_template strings and rendering of one system + user +
 * assistant + user conversation with the generation prompt, compared with
 * the text each family's official template produces (written out by hand). */
#include <criterion/criterion.h>

#include "chat.h"
#include "../testutil.h"

static const struct rx_chat_msg s_conv[] = {
    { "system", "You are helpful." },
    { "user", "Hi!" },
    { "assistant", "Hello! How can I help?" },
    { "user", "Tell me a joke." },
};

/* The official templates (as shipped in tokenizer_config.json / GGUF). */
static const char s_tmpl_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char s_tmpl_llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char s_tmpl_mistral[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}\n"
    "        {%- else %}\n            {{- '[INST] ' + message['content'] + '[/INST]' }}\n"
    "        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- ' ' + message['content']|trim + eos_token}}\n    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n";

static const char s_tmpl_deepseek2[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'Assistant:' }}{% endif %}";

static const char s_tmpl_deepseek3[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}"
    "{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";

static const char s_tmpl_zephyr[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

static const char s_tmpl_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char s_tmpl_smollm2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

static const char s_tmpl_qwen25[] =
    "{%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\n"
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}\n";

/* Phi-3 (from ggml-vocab-phi-3.gguf): a family we do not render. */
static const char s_tmpl_phi3[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
    "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}"
    "{% endfor %}";

static char *s_render (const char *tmpl, enum rx_chat_family want_family, const struct rx_chat_msg *m,
                       size_t n, int gen, const char *bos, const char *eos)
{
    struct rx_chat_template t;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_chat_template_detect (&t, tmpl, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (t.family, want_family, "detected %s", rx_chat_family_name (t.family));
    char *out;
    size_t len;
    cr_assert_eq (rx_chat_render (&t, m, n, gen, bos, eos, &out, &len, &err), RX_OK, "%s", err.msg);
    cr_assert_eq (strlen (out), len);
    rx_chat_template_fini (&t);
    return out;
}

Test (render, chatml)
{
    char *s = s_render (s_tmpl_chatml, RX_CHAT_CHATML, s_conv, 4, 1, "", "<|im_end|>");
    cr_assert_str_eq (s,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\nTell me a joke.<|im_end|>\n"
        "<|im_start|>assistant\n");
    free (s);
    /* No generation prompt: ends after the last turn. */
    s = s_render (s_tmpl_chatml, RX_CHAT_CHATML, s_conv + 1, 1, 0, "", "");
    cr_assert_str_eq (s, "<|im_start|>user\nHi!<|im_end|>\n");
    free (s);
}

Test (render, chatml_default_system_smollm2)
{
    char *s = s_render (s_tmpl_smollm2, RX_CHAT_CHATML, s_conv + 1, 1, 1, "", "");
    cr_assert_str_eq (s,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n");
    free (s);
    /* A given system message replaces the default. */
    s = s_render (s_tmpl_smollm2, RX_CHAT_CHATML, s_conv, 2, 1, "", "");
    cr_assert_str_eq (s,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n");
    free (s);
}

Test (render, chatml_default_system_qwen25)
{
    char *s = s_render (s_tmpl_qwen25, RX_CHAT_CHATML, s_conv + 1, 1, 1, "", "");
    cr_assert_str_eq (s,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n");
    free (s);
}

Test (render, llama2)
{
    char *s = s_render (s_tmpl_llama2, RX_CHAT_LLAMA2, s_conv, 4, 1, "<s>", "</s>");
    cr_assert_str_eq (s,
        "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi! [/INST] Hello! How can I help? </s>"
        "<s>[INST] Tell me a joke. [/INST]");
    free (s);
}

Test (render, llama3)
{
    char *s = s_render (s_tmpl_llama3, RX_CHAT_LLAMA3, s_conv, 4, 1, "<|begin_of_text|>", "<|eot_id|>");
    cr_assert_str_eq (s,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free (s);
}

Test (render, mistral)
{
    char *s = s_render (s_tmpl_mistral, RX_CHAT_MISTRAL, s_conv, 4, 1, "<s>", "</s>");
    cr_assert_str_eq (s,
        "<s>[INST] Hi![/INST] Hello! How can I help?</s>[INST] You are helpful.\n\nTell me a joke.[/INST]");
    free (s);
}

Test (render, deepseek2)
{
    char *s = s_render (s_tmpl_deepseek2, RX_CHAT_DEEPSEEK2, s_conv, 4, 1,
                        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    cr_assert_str_eq (s,
        "<｜begin▁of▁sentence｜>You are helpful.\n\nUser: Hi!\n\nAssistant: Hello! How can I help?"
        "<｜end▁of▁sentence｜>User: Tell me a joke.\n\nAssistant:");
    free (s);
}

Test (render, deepseek3)
{
    char *s = s_render (s_tmpl_deepseek3, RX_CHAT_DEEPSEEK3, s_conv, 4, 1,
                        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    cr_assert_str_eq (s,
        "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi!<｜Assistant｜>Hello! How can I help?"
        "<｜end▁of▁sentence｜><｜User｜>Tell me a joke.<｜Assistant｜>");
    free (s);
}

Test (render, zephyr)
{
    char *s = s_render (s_tmpl_zephyr, RX_CHAT_ZEPHYR, s_conv, 4, 1, "<s>", "</s>");
    cr_assert_str_eq (s,
        "<|system|>\nYou are helpful.</s>\n<|user|>\nHi!</s>\n<|assistant|>\nHello! How can I help?</s>\n"
        "<|user|>\nTell me a joke.</s>\n<|assistant|>\n");
    free (s);
}

Test (detect, unknown_template_is_an_error)
{
    struct rx_chat_template t;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_chat_template_detect (&t, s_tmpl_phi3, &err), RX_ENOTSUP);
    cr_assert_eq (t.family, RX_CHAT_UNKNOWN);
    cr_assert (strstr (err.msg, "not recognised"), "%s", err.msg);
    cr_assert (strstr (err.msg, "{{ bos_token }}{% for message in messages %}"), "%s", err.msg);
    cr_assert (strstr (err.msg, "chatml"), "the message lists the families: %s", err.msg);
    rx_chat_template_fini (&t);
    cr_assert_eq (rx_chat_template_detect (&t, "{{ messages[0]['content'] }}<start_of_turn>", &err),
                  RX_ENOTSUP);
    /* Mistral v0.1 (" [/INST]", no system) renders differently from the
     * mistral family: not claimed. */
    static const char v01[] =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
        "{{ message['content'] + eos_token + ' ' }}{% endif %}{% endfor %}";
    cr_assert_eq (rx_chat_template_detect (&t, v01, &err), RX_ENOTSUP);
    cr_assert_eq (rx_chat_template_detect (&t, NULL, &err), RX_ENOTSUP);
    cr_assert (strstr (err.msg, "no chat template"), "%s", err.msg);
    cr_assert_eq (rx_chat_template_detect (&t, "", &err), RX_ENOTSUP);
}

Test (detect, named_override)
{
    struct rx_chat_template t;
    struct rx_err err = { 0 };
    cr_assert_eq (rx_chat_template_named (&t, "zephyr", &err), RX_OK);
    cr_assert_eq (t.family, RX_CHAT_ZEPHYR);
    char *out;
    cr_assert_eq (rx_chat_render (&t, s_conv + 1, 1, 1, "<s>", "</s>", &out, NULL, &err), RX_OK);
    cr_assert_str_eq (out, "<|user|>\nHi!</s>\n<|assistant|>\n");
    free (out);
    rx_chat_template_fini (&t);
    for (int f = RX_CHAT_CHATML; f <= RX_CHAT_ZEPHYR; f++) {
        cr_assert_eq (rx_chat_template_named (&t, rx_chat_family_name (f), &err), RX_OK);
        cr_assert_eq ((int) t.family, f);
    }
    cr_assert_eq (rx_chat_template_named (&t, "vicuna", &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "\"vicuna\""), "%s", err.msg);
    cr_assert (strstr (err.msg, "llama3"), "%s", err.msg);
    cr_assert_null (rx_chat_family_name (RX_CHAT_UNKNOWN));
}

Test (render, role_errors)
{
    struct rx_chat_template t;
    struct rx_err err = { 0 };
    char *out = NULL;
    static const struct rx_chat_msg bad_order[] = { { "assistant", "x" }, { "user", "y" } };
    cr_assert_eq (rx_chat_template_named (&t, "llama2", &err), RX_OK);
    cr_assert_eq (rx_chat_render (&t, bad_order, 2, 1, "<s>", "</s>", &out, NULL, &err), RX_EINVAL);
    cr_assert_null (out);
    cr_assert (strstr (err.msg, "message 0") && strstr (err.msg, "llama2"), "%s", err.msg);
    static const struct rx_chat_msg late_system[] = {
        { "user", "x" }, { "assistant", "y" }, { "system", "z" }
    };
    cr_assert_eq (rx_chat_template_named (&t, "mistral", &err), RX_OK);
    cr_assert_eq (rx_chat_render (&t, late_system, 3, 1, "<s>", "</s>", &out, NULL, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "message 2"), "%s", err.msg);
    static const struct rx_chat_msg tool[] = { { "user", "x" }, { "tool", "y" } };
    cr_assert_eq (rx_chat_template_named (&t, "deepseek2", &err), RX_OK);
    cr_assert_eq (rx_chat_render (&t, tool, 2, 1, "", "", &out, NULL, &err), RX_EINVAL);
    cr_assert (strstr (err.msg, "\"tool\""), "%s", err.msg);
    /* ChatML places any role. */
    cr_assert_eq (rx_chat_template_named (&t, "chatml", &err), RX_OK);
    cr_assert_eq (rx_chat_render (&t, tool, 2, 0, "", "", &out, NULL, &err), RX_OK);
    cr_assert_str_eq (out, "<|im_start|>user\nx<|im_end|>\n<|im_start|>tool\ny<|im_end|>\n");
    free (out);
    /* No family chosen. */
    struct rx_chat_template none = { 0 };
    cr_assert_eq (rx_chat_render (&none, tool, 2, 0, "", "", &out, NULL, &err), RX_EINVAL);
}
