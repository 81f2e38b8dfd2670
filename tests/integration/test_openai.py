#!/usr/bin/env python3
"""Wire compatibility with the official `openai` Python client (PyPI):
completions, chat completions (plain and streamed), models.list and the
client's error classes, against base_url http://127.0.0.1:PORT/v1 with an
API key.  The client comes from the venv scripts/pydeps makes; $RADIX_PYTHON
names its interpreter.  Without it every test is skipped."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _reexec_with_openai():
    """Run this file under $RADIX_PYTHON when this interpreter lacks openai."""
    try:
        import openai  # noqa: F401
        return None
    except ImportError:
        pass
    py = os.environ.get("RADIX_PYTHON")
    if not py:
        return "RADIX_PYTHON is unset (scripts/pydeps makes a venv with the openai client)"
    if os.environ.get("RX_OPENAI_REEXEC"):
        return "%s cannot import openai" % py
    if not os.access(py, os.X_OK):
        return "RADIX_PYTHON=%s is not executable" % py
    os.environ["RX_OPENAI_REEXEC"] = "1"
    sys.stdout.flush()
    os.execv(py, [py, "-B", os.path.abspath(__file__)] + sys.argv[1:])


SKIP_WHY = _reexec_with_openai()

from rxtest import Daemon, Fail, Skip, eq, expect, run, short, test  # noqa: E402

D = None
KEY = "sk-openai-itest"
CLIENT = None


def setup():
    global D, CLIENT
    if SKIP_WHY:
        raise Skip(SKIP_WHY)
    import openai
    D = Daemon("tiny", sections={"server": {"api_key": KEY}}).start().wait_healthy()
    CLIENT = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % D.port, api_key=KEY,
                           max_retries=0, timeout=60)


@test
def test_models_list():
    ms = list(CLIENT.models.list())
    expect(len(ms) >= 1, "models.list() is empty")
    eq(ms[0].id, "itest-model", "models.list()[0].id")
    eq(ms[0].object, "model", "models.list()[0].object")


@test
def test_completions_create():
    r = CLIENT.completions.create(model="itest-model", prompt="Hello, my name is", max_tokens=8,
                                  temperature=0, extra_body={"ignore_eos": True})
    eq(r.object, "text_completion", "object")
    eq(len(r.choices), 1, "choices")
    expect(isinstance(r.choices[0].text, str) and r.choices[0].text, "text %r" % r.choices[0].text)
    eq(r.choices[0].finish_reason, "length", "finish_reason")
    eq(r.usage.completion_tokens, 8, "usage.completion_tokens")
    eq(r.usage.total_tokens, r.usage.prompt_tokens + 8, "usage.total_tokens")
    # streamed through the client: same text
    text = ""
    fin = None
    for chunk in CLIENT.completions.create(model="itest-model", prompt="Hello, my name is", max_tokens=8,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices:
            text += chunk.choices[0].text
            fin = chunk.choices[0].finish_reason or fin
    eq(text, r.choices[0].text, "streamed completion text vs plain")
    eq(fin, "length", "streamed finish_reason")


MSGS = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi there!"}]


@test
def test_chat_create():
    r = CLIENT.chat.completions.create(model="itest-model", messages=MSGS, max_tokens=8, temperature=0,
                                       seed=3, extra_body={"ignore_eos": True})
    eq(r.object, "chat.completion", "object")
    m = r.choices[0].message
    eq(m.role, "assistant", "message.role")
    expect(isinstance(m.content, str) and m.content, "message.content %r" % m.content)
    eq(r.choices[0].finish_reason, "length", "finish_reason")
    eq(r.usage.completion_tokens, 8, "usage.completion_tokens")
    expect(r.usage.prompt_tokens_details is None or r.usage.prompt_tokens_details.cached_tokens >= 0,
           "usage.prompt_tokens_details %r" % r.usage.prompt_tokens_details)


@test
def test_chat_stream():
    plain = CLIENT.chat.completions.create(model="itest-model", messages=MSGS, max_tokens=10,
                                           temperature=0, extra_body={"ignore_eos": True})
    stream = CLIENT.chat.completions.create(model="itest-model", messages=MSGS, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    content = ""
    fin = None
    usage = None
    n = 0
    for chunk in stream:
        n += 1
        eq(chunk.object, "chat.completion.chunk", "chunk object")
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            content += c.delta.content or ""
            fin = c.finish_reason or fin
    expect(n >= 2, "only %d chunks" % n)
    eq(content, plain.choices[0].message.content, "streamed content vs plain")
    eq(fin, "length", "streamed finish_reason")
    expect(usage is not None and usage.completion_tokens == 10, "stream usage %r" % usage)


@test
def test_chat_logprobs():
    r = CLIENT.chat.completions.create(model="itest-model", messages=MSGS, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    expect(lp is not None and len(lp.content) == 4, "logprobs %s" % short(str(lp)))
    for t in lp.content:
        eq(len(t.top_logprobs), 3, "top_logprobs per token")


@test
def test_client_errors():
    import openai
    try:
        CLIENT.completions.create(model="itest-model", prompt="hi", max_tokens=4, temperature=-1)
    except openai.BadRequestError as e:
        eq(e.status_code, 400, "status of BadRequestError")
        body = e.body if isinstance(e.body, dict) else {}
        expect(body.get("param") == "temperature" or "temperature" in str(e),
               "error does not name temperature: %s" % e)
    else:
        raise Fail("temperature -1 accepted")
    try:
        CLIENT.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=4)
    except openai.NotFoundError as e:
        eq(e.status_code, 404, "status of NotFoundError")
    else:
        raise Fail("an unknown model accepted")
    bad = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % D.port, api_key="sk-wrong", max_retries=0)
    try:
        bad.models.list()
    except openai.AuthenticationError as e:
        eq(e.status_code, 401, "status of AuthenticationError")
    else:
        raise Fail("a wrong API key accepted")


if __name__ == "__main__":
    run(setup, timeout=120)
