#!/usr/bin/env python3
"""radixd answers every bad request with an OpenAI-style JSON error of the
right status -- malformed JSON, wrong types, out-of-range sampling values,
min_tokens > max_tokens, empty prompts, prompts over the context (ctx-1
tokens accepted), token ids outside the vocabulary, invalid UTF-8, an
unknown model, unknown paths and methods -- and keeps serving.  One
daemon on the tiny model (context 512)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import Daemon, cli_tokenize, eq, expect_error, run, short, test  # noqa: E402

D = None
N_VOCAB = 32000   # ggml-vocab-llama-spm


def setup():
    global D
    D = Daemon("tiny").start().wait_healthy()


def post_raw(path, body, ctype="application/json"):
    return D.post(path, body, headers={"Content-Type": ctype})


def still_serving(what):
    """After a bad request: /health is 200 and a small completion works."""
    D.check_alive()
    r = D.get("/health")
    eq(r.status, 200, "GET /health after %s" % what)
    j = D.ok_json("POST", "/v1/completions", {"prompt": "ok", "max_tokens": 2, "ignore_eos": True})
    eq(j["usage"]["completion_tokens"], 2, "completion after %s" % what)


def bad(path, body, status=400, code=None, param=None, what=None):
    r = D.post(path, body) if not isinstance(body, bytes) else post_raw(path, body)
    return expect_error(r, status, code, param, what or "%s %s" % (path, short(body, 120)))


CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
GEN = "/generate"
MSGS = [{"role": "user", "content": "hi"}]


@test
def test_malformed_json():
    for path in (CMPL, CHAT, GEN, "/tokenize", "/detokenize", "/abort_request"):
        for body in (b'{"prompt": "hi", "max_tokens": ', b"{'prompt': 'hi'}", b"not json at all",
                     b'{"prompt": "hi"} trailing'):
            bad(path, body, 400, "invalid_json", what="%s with %r" % (path, body))
    still_serving("malformed JSON")


@test
def test_not_an_object_or_empty():
    for path in (CMPL, CHAT, GEN):
        for body in (b"[1, 2]", b'"text"', b"42", b"null"):
            bad(path, body, 400, what="%s with %r" % (path, body))
        r = D.post(path, b"", headers={"Content-Type": "application/json"})
        expect_error(r, 400, what="%s with an empty body" % path)
    still_serving("non-object bodies")


@test
def test_wrong_types():
    cases = [
        (CMPL, {"prompt": 5}, "prompt"),
        (CMPL, {"prompt": "hi", "max_tokens": "10"}, "max_tokens"),
        (CMPL, {"prompt": "hi", "max_tokens": 10.5}, "max_tokens"),
        (CMPL, {"prompt": "hi", "temperature": "hot"}, "temperature"),
        (CMPL, {"prompt": "hi", "top_p": [1]}, "top_p"),
        (CMPL, {"prompt": "hi", "n": "2"}, "n"),
        (CMPL, {"prompt": "hi", "stream": "yes"}, "stream"),
        (CMPL, {"prompt": "hi", "stop": 7}, "stop"),
        (CMPL, {"prompt": "hi", "seed": "abc"}, "seed"),
        (CMPL, {"prompt": "hi", "logprobs": "2"}, "logprobs"),
        (CMPL, {"prompt": "hi", "ignore_eos": "true"}, "ignore_eos"),
        (CMPL, {"prompt": {"text": "hi"}}, "prompt"),
        (CHAT, {"messages": "hi"}, "messages"),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}, None),
        (CHAT, {"messages": MSGS, "logprobs": "yes"}, "logprobs"),
        (GEN, {"text": "hi", "sampling_params": {"max_new_tokens": "8"}}, None),
        (GEN, {"text": "hi", "sampling_params": "greedy"}, "sampling_params"),
        (GEN, {"text": 12}, "text"),
    ]
    for path, body, param in cases:
        bad(path, body, 400, "invalid_type", param)
    # integers may be written 16.0 (pydantic's lax mode)
    j = D.ok_json("POST", CMPL, {"prompt": "hi", "max_tokens": 2.0, "ignore_eos": True})
    eq(j["usage"]["completion_tokens"], 2, "completion_tokens with max_tokens 2.0")
    still_serving("wrong types")


@test
def test_out_of_range():
    cases = [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"min_tokens": -1}, "min_tokens"),
    ]
    for extra, param in cases:
        body = {"prompt": "hi", "max_tokens": 4}
        body.update(extra)
        bad(CMPL, body, 400, "invalid_value", param)
    for extra, param in ({"temperature": -1}, "temperature"), ({"top_logprobs": 21, "logprobs": True},
                                                                "top_logprobs"):
        body = {"messages": MSGS, "max_tokens": 4}
        body.update(extra)
        bad(CHAT, body, 400, "invalid_value", param)
    bad(GEN, {"text": "hi", "sampling_params": {"temperature": -1}}, 400, "invalid_value")
    bad(GEN, {"text": "hi", "sampling_params": {"top_p": 2}}, 400, "invalid_value")
    # the edges that are allowed
    for extra in ({"top_k": -1}, {"top_p": 1}, {"min_p": 0}, {"min_p": 1}, {"temperature": 0},
                  {"frequency_penalty": 2}, {"presence_penalty": -2}, {"logprobs": 0}):
        body = {"prompt": "hi", "max_tokens": 2, "ignore_eos": True}
        body.update(extra)
        r = D.post(CMPL, body)
        eq(r.status, 200, "completion with %s (%s)" % (extra, short(r.body)))
    still_serving("out-of-range values")


@test
def test_min_tokens_over_max_tokens():
    bad(CMPL, {"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, 400, "invalid_value")
    bad(CHAT, {"messages": MSGS, "max_tokens": 4, "min_tokens": 5}, 400, "invalid_value")
    bad(GEN, {"text": "hi", "sampling_params": {"max_new_tokens": 3, "min_new_tokens": 9}}, 400,
        "invalid_value")
    # min_tokens == max_tokens is fine, and is honoured without ignore_eos
    j = D.ok_json("POST", CMPL, {"prompt": "hi", "max_tokens": 5, "min_tokens": 5})
    eq(j["usage"]["completion_tokens"], 5, "completion_tokens with min_tokens = max_tokens = 5")
    still_serving("min_tokens > max_tokens")


@test
def test_top_logprobs_needs_logprobs():
    bad(CHAT, {"messages": MSGS, "top_logprobs": 2}, 400)
    still_serving("top_logprobs without logprobs")


@test
def test_empty_prompts():
    bad(CMPL, {"prompt": ""}, 400)
    bad(CMPL, {"prompt": []}, 400)
    bad(CMPL, {}, 400, "missing_required_parameter", "prompt")
    bad(CHAT, {"messages": []}, 400)
    bad(CHAT, {}, 400, "missing_required_parameter", "messages")
    bad(CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_value",
        "messages[0].role")
    bad(CHAT, {"messages": [{"content": "hi"}]}, 400)
    bad(GEN, {"text": ""}, 400)
    bad(GEN, {"input_ids": []}, 400)
    bad(GEN, {"sampling_params": {}}, 400)
    bad("/tokenize", {}, 400)
    still_serving("empty prompts")


def ids_of_len(n):
    """n valid token ids (BOS, then ordinary word pieces cycling)."""
    body = [1]
    i = 0
    while len(body) < n:
        body.append(1000 + (i * 37) % 20000)
        i += 1
    return body[:n]


@test
def test_context_length():
    ctx = D.ctx_len
    # ctx-1 prompt tokens leave room for exactly one generated token
    j = D.ok_json("POST", CMPL, {"prompt": ids_of_len(ctx - 1), "ignore_eos": True})
    eq(j["usage"]["prompt_tokens"], ctx - 1, "prompt_tokens of a ctx-1 prompt")
    eq(j["usage"]["completion_tokens"], 1, "completion_tokens of a ctx-1 prompt")
    eq(j["choices"][0]["finish_reason"], "length", "finish_reason of a ctx-1 prompt")
    for n in (ctx, ctx + 1, 2 * ctx):
        bad(CMPL, {"prompt": ids_of_len(n)}, 400, "context_length_exceeded", what="%d-token prompt" % n)
        bad(GEN, {"input_ids": ids_of_len(n)}, 400, "context_length_exceeded",
            what="/generate %d input_ids" % n)
    # the same with text: find a repeated word's token count with the CLI
    def words(k):
        return "hello" + " hello" * (k - 1)
    base = len(cli_tokenize(D.model_path, words(1)))          # BOS + "hello"
    per = len(cli_tokenize(D.model_path, words(3))) - len(cli_tokenize(D.model_path, words(2)))
    eq(per, 1, "tokens per extra \" hello\"")
    text_ok = words(ctx - 1 - base + 1)
    n_ok = len(cli_tokenize(D.model_path, text_ok))
    eq(n_ok, ctx - 1, "token count of the ctx-1 text")
    r = D.post(CMPL, {"prompt": text_ok, "max_tokens": 1, "ignore_eos": True})
    eq(r.status, 200, "ctx-1 token text prompt (%s)" % short(r.body))
    bad(CMPL, {"prompt": text_ok + " hello hello"}, 400, "context_length_exceeded",
        what="ctx+1 token text prompt")
    bad(CHAT, {"messages": [{"role": "user", "content": text_ok}]}, 400, "context_length_exceeded",
        what="chat over the context")
    # an explicit max_tokens that does not fit next to the prompt
    bad(CMPL, {"prompt": ids_of_len(ctx - 10), "max_tokens": 20}, 400,
        what="prompt + max_tokens over the context")
    still_serving("over-long prompts")


@test
def test_token_ids_outside_vocabulary():
    for ids in ([1, N_VOCAB], [1, -1], [1, 1 << 31], [1, 99999999]):
        bad(CMPL, {"prompt": ids, "max_tokens": 2}, 400, what="prompt ids %r" % ids)
        bad(GEN, {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}, 400,
            what="/generate input_ids %r" % ids)
    bad("/detokenize", {"tokens": [5, N_VOCAB]}, 400)
    bad(CMPL, {"prompt": [1, 2.5]}, 400)
    bad(CMPL, {"prompt": "hi", "stop_token_ids": [N_VOCAB]}, 400)
    # the last id is fine
    r = D.post(CMPL, {"prompt": [1, N_VOCAB - 1], "max_tokens": 1})
    eq(r.status, 200, "prompt with id n_vocab-1 (%s)" % short(r.body))
    still_serving("ids outside the vocabulary")


@test
def test_invalid_utf8():
    for path, body in ((CMPL, b'{"prompt": "caf\xc3 \xff\xfe", "max_tokens": 2}'),
                       (CHAT, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'),
                       (GEN, b'{"text": "\xc0\xaf"}'),
                       ("/tokenize", b'{"prompt": "\x80"}')):
        bad(path, body, 400, "invalid_utf8", what="%s with invalid UTF-8" % path)
    # valid multi-byte UTF-8 is of course fine
    r = D.post(CMPL, '{"prompt": "caf\u00e9 \u4f60\u597d \U0001f600", "max_tokens": 2}'.encode("utf-8"),
               headers={"Content-Type": "application/json"})
    eq(r.status, 200, "valid UTF-8 prompt (%s)" % short(r.body))
    still_serving("invalid UTF-8")


@test
def test_unknown_model():
    bad(CMPL, {"model": "no-such-model", "prompt": "hi"}, 404, "model_not_found", what="completions")
    e = bad(CHAT, {"model": "no-such-model", "messages": MSGS}, 404, "model_not_found", what="chat")
    eq(e["type"], "invalid_request_error", "type of a 404 model_not_found")
    still_serving("an unknown model")


@test
def test_unsupported_parameters():
    bad(CHAT, {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
        "unsupported_parameter", "tools")
    bad(CMPL, {"prompt": "hi", "logit_bias": {"50256": -100}}, 400, "unsupported_parameter", "logit_bias")
    bad(GEN, {"text": "hi", "sampling_params": {"no_such_knob": 1}}, 400)
    # unknown top-level fields are ignored (clients send newer fields)
    r = D.post(CMPL, {"prompt": "hi", "max_tokens": 1, "some_future_field": {"x": 1}})
    eq(r.status, 200, "unknown top-level field (%s)" % short(r.body))
    still_serving("unsupported parameters")


@test
def test_unknown_path_and_method():
    for method, path in (("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/v1/completions/x"),
                         ("GET", "/v2/models")):
        r = D.request(method, path)
        expect_error(r, 404, what="%s %s" % (method, path))
    for method, path in (("GET", CMPL), ("GET", CHAT), ("DELETE", "/v1/models"), ("PUT", GEN),
                         ("POST", "/v1/models")):
        r = D.request(method, path, body=b"{}" if method in ("PUT", "POST") else None)
        expect_error(r, 405, what="%s %s" % (method, path))
    still_serving("unknown paths and methods")


@test
def test_abort_request_bad_body():
    bad("/abort_request", {}, 400)
    bad("/abort_request", {"rid": 5}, 400, "invalid_type", "rid")
    still_serving("bad /abort_request bodies")


if __name__ == "__main__":
    run(setup, timeout=150)
