#!/usr/bin/env python3
"""radixd under a small KV pool and with the [server] length options:
concurrent requests that together need more KV than the pool holds all
finish with the same greedy output they get alone (admission control and
retraction must not corrupt anything), and default_max_tokens,
max_tokens_cap and truncate_prompts do what conf/radixd.ini says.  One
daemon on the tiny model (context 512) with a 640-token KV pool."""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import Daemon, Fail, diag, eq, expect, run, short, test  # noqa: E402

D = None
KV_TOKENS = 640          # tiny model: 512 bytes of KV per token


def setup():
    global D
    D = Daemon("tiny", sections={
        "cache": {"kv_memory": "%dKiB" % (KV_TOKENS * 512 // 1024)},
        "server": {"default_max_tokens": 7, "max_tokens_cap": 300, "truncate_prompts": "true"},
        # admit optimistically, so decode runs out of KV and must retract
        "scheduler": {"init_new_token_ratio": 0.05, "schedule_conservativeness": 0.3},
    }).start().wait_healthy()


def gen_ids(prompt, n):
    j = D.ok_json("POST", "/generate", {"text": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}, timeout=120)
    return [e[1] for e in j["meta_info"]["output_token_logprobs"]]


@test
def test_pool_size_reported():
    diag("KV usage field: %s = %s" % D.kv_usage())
    total = D.stat(r"kv_total(_tokens)?$")
    expect(total is not None, "neither /get_server_info nor /metrics reports the KV pool size")
    expect(abs(total - KV_TOKENS) <= 16, "KV pool of %s tokens, want about %d (kv_memory %dKiB)"
           % (total, KV_TOKENS, KV_TOKENS // 2))


@test
def test_kv_pressure_same_outputs():
    prompts = ["Story %d: %s" % (i, "once more " * (3 + i)) for i in range(8)]
    n = 150   # 8 x (~20 + 150) tokens: about twice the pool
    want = [gen_ids(p, n) for p in prompts]
    D.post("/flush_cache")
    before = D.stat(r"retractions?(_total)?$")
    got = [None] * len(prompts)
    errs = []
    barrier = threading.Barrier(len(prompts))

    def one(i):
        barrier.wait()
        try:
            got[i] = gen_ids(prompts[i], n)
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append("request %d: %s" % (i, e))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    expect(not errs, "; ".join(errs))
    for i in range(len(prompts)):
        eq(len(got[i]), n, "tokens of request %d" % i)
        if got[i] != want[i]:
            k = next(j for j in range(n) if got[i][j] != want[i][j])
            raise Fail("request %d under KV pressure differs from its lone run at token %d: "
                                 "%s vs %s" % (i, k, got[i][k:k + 5], want[i][k:k + 5]))
    after = D.stat(r"retractions?(_total)?$")
    if after is not None and before is not None:
        diag("retractions during the run: %d" % (after - before))
        expect(after > before, "no retraction although the requests needed about twice the KV pool: "
               "the test did not exercise retraction")
    D.check_alive()


@test
def test_default_max_tokens():
    j = D.ok_json("POST", "/v1/completions", {"prompt": "hello there", "ignore_eos": True})
    eq(j["usage"]["completion_tokens"], 7, "completion_tokens without max_tokens (default_max_tokens = 7)")


@test
def test_max_tokens_cap():
    j = D.ok_json("POST", "/v1/completions", {"prompt": "hello there", "max_tokens": 400, "ignore_eos": True})
    eq(j["usage"]["completion_tokens"], 300, "completion_tokens of max_tokens 400 (max_tokens_cap = 300)")
    eq(j["choices"][0]["finish_reason"], "length", "finish_reason")


@test
def test_truncate_prompts():
    ctx = D.ctx_len
    ids = [1] + [1000 + i % 5000 for i in range(ctx + 100)]
    j = D.ok_json("POST", "/v1/completions", {"prompt": ids, "ignore_eos": True})
    eq(j["usage"]["prompt_tokens"], ctx - 1, "prompt_tokens of an over-long prompt with truncate_prompts")
    eq(j["usage"]["completion_tokens"], 1, "completion_tokens (the room left)")
    # the kept part is the tail (BOS stays in front): same output as sending it directly
    tail = [1] + ids[-(ctx - 2):]
    k = D.ok_json("POST", "/v1/completions", {"prompt": tail, "ignore_eos": True, "temperature": 0})
    j2 = D.ok_json("POST", "/v1/completions", {"prompt": ids, "ignore_eos": True, "temperature": 0})
    eq(j2["choices"][0]["text"], k["choices"][0]["text"], "output of a truncated prompt vs its kept tail")
    r = D.post("/v1/completions", {"prompt": ids, "max_tokens": 5})
    eq(r.status, 200, "explicit max_tokens with truncation (%s)" % short(r.body))
    eq(r.json()["usage"]["completion_tokens"], 1, "max_tokens clamped to the room left")


if __name__ == "__main__":
    run(setup, timeout=150)
