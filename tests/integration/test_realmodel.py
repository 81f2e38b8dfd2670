#!/usr/bin/env python3
"""radixd serving the real default model (SmolLM2-135M-Instruct Q4_1, what
scripts/serve runs): a greedy chat answer is fluent English that names
Paris, streamed and plain agree, and a second turn hits the radix cache.
Skipped when .cache/models lacks the file (scripts/fetch-model)."""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rxtest import Daemon, Skip, eq, expect, run, short, stream_json, test  # noqa: E402

REAL = os.path.join(os.environ.get("RX_TOP_SRCDIR", "."), ".cache", "models",
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
D = None
# Phrased so that the greedy answer is not a near tie (see
# tests/cli/test_generate.c): the model answers "The capital of France is Paris."
Q = [{"role": "user", "content": "Tell me the capital of France."}]


def setup():
    global D
    if not os.access(REAL, os.R_OK):
        raise Skip("%s is absent: run scripts/fetch-model to test the real model" % REAL)
    # chat_template None: recognised from the GGUF, as scripts/serve does
    D = Daemon("tiny", sections={"model": {"path": REAL}, "server": {"chat_template": None},
                                 "kernels": {"threads": "2"}}).start().wait_healthy()


def fluent(t):
    words = re.findall(r"[A-Za-z]+", t)
    ascii_share = sum(1 for c in t if ord(c) < 128) / max(1, len(t))
    return len(words) >= 4 and ascii_share > 0.95


@test
def test_chat_answer_is_fluent_and_right():
    j = D.ok_json("POST", "/v1/chat/completions",
                  {"model": "itest-model", "messages": Q, "max_tokens": 48, "temperature": 0})
    text = j["choices"][0]["message"]["content"]
    expect(fluent(text), "not fluent English: %r" % text)
    expect("Paris" in text, "the answer does not name Paris: %r" % text)
    # streamed: the same text
    _, events = stream_json(D.port, "/v1/chat/completions",
                         {"model": "itest-model", "messages": Q, "max_tokens": 48, "temperature": 0,
                          "stream": True})
    got = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    eq(got, text, "streamed chat text")


@test
def test_second_turn_hits_the_cache():
    j = D.ok_json("POST", "/v1/chat/completions",
                  {"model": "itest-model", "messages": Q, "max_tokens": 24, "temperature": 0})
    answer = j["choices"][0]["message"]["content"]
    turn2 = Q + [{"role": "assistant", "content": answer},
                 {"role": "user", "content": "And of Germany?"}]
    j2 = D.ok_json("POST", "/v1/chat/completions",
                   {"model": "itest-model", "messages": turn2, "max_tokens": 24, "temperature": 0})
    cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"]
    expect(cached >= j["usage"]["prompt_tokens"],
           "second turn cached %d tokens, the first turn's prompt alone has %d: %s"
           % (cached, j["usage"]["prompt_tokens"], short(j2["usage"])))


if __name__ == "__main__":
    run(setup, timeout=120)
