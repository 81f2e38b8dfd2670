/* tests/cli/test_tokenize.c -- the built `radix tokenize` as a real process. */
#include <criterion/criterion.h>

#include "../testutil.h"

static char *s_model (const char *rel)
{
    const char *root = getenv ("RADIX_SHARED");
    if (!root || !*root) cr_skip_test ("RADIX_SHARED is not set: no shared test data");
    char *p = tu_path (root, rel);
    if (access (p, R_OK) != 0) {
        free (p);
        cr_skip_test ("shared test data %s/%s is absent", root, rel);
    }
    return p;
}

static struct tu_run s_run (char *const argv[])
{
    return tu_run_env (argv, NULL);
}

Test (tokenize, prompt_with_and_without_bos)
{
    char *m = s_model ("data/models/tiny-llama.gguf");
    char *radix = (char *) tu_env ("RADIX");
    struct tu_run r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--text", "Once upon a time",
                                          "--bos", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert_str_eq (r.out, "1 9038 2501 263 931\n");   /* tiny-llama.json prompt_ids */
    tu_run_free (&r);
    r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--text", "Once upon a time", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert_str_eq (r.out, "9038 2501 263 931\n");
    tu_run_free (&r);
    free (m);
}

Test (tokenize, bpe_vocabulary)
{
    char *m = s_model ("data/tokenizers/ggml-vocab-gpt-2.gguf");
    char *radix = (char *) tu_env ("RADIX");
    struct tu_run r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--text", "Hello world", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert_str_eq (r.out, "15496 995\n");
    tu_run_free (&r);
    /* Control tokens only with --special. */
    r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--text", "<|endoftext|>", "--special", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert_str_eq (r.out, "50256\n");
    tu_run_free (&r);
    free (m);
}

Test (tokenize, chat_prompt)
{
    char *m = s_model ("data/models/tiny-llama.gguf");
    char *radix = (char *) tu_env ("RADIX");
    /* tiny-llama has no chat template: an error that says so. */
    struct tu_run r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--chat", "user=Hi", NULL });
    cr_assert_eq (r.status, 1);
    cr_assert (strstr (r.err, "no chat template"), "stderr: %s", r.err);
    cr_assert_str_eq (r.out, "");
    tu_run_free (&r);
    /* Naming a family renders and tokenizes the prompt. */
    r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--chat", "system=Be brief.", "--chat", "user=Hi",
                            "--chat-template", "llama2", "--show-prompt", NULL });
    cr_assert_eq (r.status, 0, "stderr: %s", r.err);
    cr_assert (strstr (r.err, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"), "stderr: %s", r.err);
    cr_assert_eq (tu_lines (r.out), 1);
    cr_assert (strncmp (r.out, "1 ", 2) == 0, "BOS from the template text: %s", r.out);
    tu_run_free (&r);
    r = s_run ((char *[]) { radix, "tokenize", "--model", m, "--chat", "user=Hi", "--chat-template",
                            "nosuch", NULL });
    cr_assert_eq (r.status, 1);
    cr_assert (strstr (r.err, "\"nosuch\""), "stderr: %s", r.err);
    tu_run_free (&r);
    free (m);
}

Test (tokenize, bad_usage_and_files)
{
    char *radix = (char *) tu_env ("RADIX");
    struct tu_run r = s_run ((char *[]) { radix, "tokenize", "--text", "x", NULL });
    cr_assert_eq (r.status, 2);
    cr_assert (strstr (r.err, "--model"), "stderr: %s", r.err);
    tu_run_free (&r);
    r = s_run ((char *[]) { radix, "tokenize", "--model", "/nonexistent/x.gguf", NULL });
    cr_assert_eq (r.status, 2);
    tu_run_free (&r);
    r = s_run ((char *[]) { radix, "tokenize", "--model", "/nonexistent/x.gguf", "--text", "x", NULL });
    cr_assert_eq (r.status, 1);
    cr_assert (strstr (r.err, "/nonexistent/x.gguf"), "stderr: %s", r.err);
    cr_assert_str_eq (r.out, "");
    tu_run_free (&r);
    r = s_run ((char *[]) { radix, "tokenize", "--bogus", NULL });
    cr_assert_eq (r.status, 2);
    tu_run_free (&r);
}
