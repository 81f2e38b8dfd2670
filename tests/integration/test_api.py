#!/usr/bin/env python3
"""radixd over HTTP: /v1/completions and /v1/chat/completions (plain and
streamed), stop strings, seeds, n > 1, logprobs, the prefix cache's
cached_tokens, and the small endpoints (/health, /v1/models, /tokenize,
/detokenize, /metrics, /get_server_info, /flush_cache).  One daemon on the
tiny random model (greedy output is gibberish, but deterministic)."""

import http.client
import json
import os
import re
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import (Daemon, Fail, cli_tokenize, diag, eq, expect, parse_metrics, run,  # noqa: E402
                    short, test)
import sibling_stop  # noqa: E402

D = None
PROMPT = "The quick brown fox jumps over the lazy dog"
MSGS = [{"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Name three colours."}]


def setup():
    global D
    # Small prefill chunks, so a few-hundred-token prompt is prefilled in
    # several steps (compared against the CLI's one-shot prefill below).
    D = Daemon("tiny", sections={"scheduler": {"chunked_prefill_size": 64}}).start()


def completion(**kw):
    body = {"model": D.model_id, "prompt": PROMPT, "max_tokens": 16, "temperature": 0,
            "ignore_eos": True}
    body.update(kw)
    return D.ok_json("POST", "/v1/completions", body)


def chat(**kw):
    body = {"model": D.model_id, "messages": MSGS, "max_tokens": 16, "temperature": 0,
            "ignore_eos": True}
    body.update(kw)
    return D.ok_json("POST", "/v1/chat/completions", body)


def check_usage(u, completion_tokens=None, what="usage"):
    expect(isinstance(u, dict), "%s missing: %r" % (what, u))
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        expect(isinstance(u.get(k), int), "%s.%s not an integer: %s" % (what, k, short(u)))
    eq(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"], what + ".total_tokens")
    det = u.get("prompt_tokens_details")
    expect(isinstance(det, dict) and isinstance(det.get("cached_tokens"), int),
           "%s.prompt_tokens_details.cached_tokens missing: %s" % (what, short(u)))
    expect(0 <= det["cached_tokens"] <= u["prompt_tokens"],
           "%s: cached_tokens %d outside [0, prompt_tokens %d]"
           % (what, det["cached_tokens"], u["prompt_tokens"]))
    if completion_tokens is not None:
        eq(u["completion_tokens"], completion_tokens, what + ".completion_tokens")


def cli_chat_ids(msgs):
    cmd = [os.environ["RADIX"], "tokenize", "--model", D.model_path, "--chat-template", "chatml"]
    for m in msgs:
        cmd += ["--chat", "%s=%s" % (m["role"], m["content"])]
    env = dict(os.environ, RADIX_PLUGIN_PATH=os.environ["RX_PLUGIN_BUILD_DIR"])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
    if r.returncode != 0:
        raise Fail("%s: %s" % (" ".join(cmd), short(r.stderr)))
    return [int(x) for x in r.stdout.split()]


# ---- small endpoints -------------------------------------------------------


@test
def test_health():
    r = D.get("/health")
    eq(r.status, 200, "GET /health")
    r = D.get("/health_generate", timeout=60)
    eq(r.status, 200, "GET /health_generate (%s)" % short(r.body))


@test
def test_models():
    j = D.ok_json("GET", "/v1/models")
    eq(j.get("object"), "list", "/v1/models object")
    data = j.get("data")
    expect(isinstance(data, list) and len(data) >= 1, "/v1/models data: %s" % short(j))
    m = data[0]
    eq(m.get("id"), "itest-model", "/v1/models data[0].id (served_model_name)")
    eq(m.get("object"), "model", "/v1/models data[0].object")
    expect(isinstance(m.get("created"), int), "data[0].created not an integer: %s" % short(m))
    expect(isinstance(m.get("owned_by"), str), "data[0].owned_by not a string: %s" % short(m))
    if "max_model_len" in m:
        eq(m["max_model_len"], D.ctx_len, "data[0].max_model_len")


@test
def test_tokenize_detokenize():
    j = D.ok_json("POST", "/tokenize", {"prompt": PROMPT})
    want = cli_tokenize(D.model_path, PROMPT, bos=True)
    eq(j.get("tokens"), want, "/tokenize tokens vs `radix tokenize --bos --special`")
    eq(j.get("count"), len(want), "/tokenize count")
    eq(j.get("max_model_len"), D.ctx_len, "/tokenize max_model_len")
    j = D.ok_json("POST", "/tokenize", {"prompt": PROMPT, "add_special_tokens": False})
    eq(j.get("tokens"), cli_tokenize(D.model_path, PROMPT, bos=False),
       "/tokenize add_special_tokens=false")
    j = D.ok_json("POST", "/detokenize", {"tokens": j["tokens"]})
    expect(isinstance(j.get("prompt"), str), "/detokenize prompt: %s" % short(j))
    eq(j["prompt"].strip(), PROMPT, "/detokenize of /tokenize")


@test
def test_get_server_info_and_flush():
    j = D.ok_json("GET", "/get_server_info")
    expect(isinstance(j, dict) and j, "/get_server_info is not a non-empty object: %s" % short(j))
    diag("/get_server_info keys: %s" % ", ".join(sorted(j)))
    r = D.post("/flush_cache")
    eq(r.status, 200, "POST /flush_cache (%s)" % short(r.body))


@test
def test_no_cors_headers_by_default():
    r = D.get("/v1/models", headers={"Origin": "https://evil.example"})
    eq(r.status, 200, "GET /v1/models with Origin")
    bad = [h for h in r.headers if h.startswith("access-control-")]
    eq(bad, [], "CORS headers without cors_allow_origins")


@test
def test_keep_alive():
    # Clients (the openai SDK among them) reuse one connection.
    conn = http.client.HTTPConnection("127.0.0.1", D.port, timeout=60)
    try:
        for i in range(3):
            body = json.dumps({"prompt": PROMPT, "max_tokens": 2, "ignore_eos": True})
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            eq(r.status, 200, "request %d on one kept-alive connection (%s)" % (i, short(data)))
            json.loads(data)
    finally:
        conn.close()


# ---- completions -----------------------------------------------------------


@test
def test_completion():
    j = completion()
    expect(isinstance(j.get("id"), str) and j["id"].startswith("cmpl-"), "id: %r" % j.get("id"))
    eq(j.get("object"), "text_completion", "object")
    expect(isinstance(j.get("created"), int), "created: %r" % j.get("created"))
    eq(j.get("model"), "itest-model", "model")
    ch = j.get("choices")
    expect(isinstance(ch, list) and len(ch) == 1, "choices: %s" % short(j))
    c = ch[0]
    eq(c.get("index"), 0, "choices[0].index")
    expect(isinstance(c.get("text"), str) and c["text"], "choices[0].text: %r" % c.get("text"))
    eq(c.get("finish_reason"), "length", "finish_reason with ignore_eos and max_tokens")
    expect(c.get("logprobs") is None, "logprobs not asked but given: %s" % short(c.get("logprobs")))
    check_usage(j.get("usage"), 16)
    eq(j["usage"]["prompt_tokens"], len(cli_tokenize(D.model_path, PROMPT)),
       "usage.prompt_tokens vs the tokenizer (BOS + text)")
    # greedy is deterministic
    eq(completion()["choices"][0]["text"], c["text"], "second greedy run's text")


@test
def test_completion_token_prompt():
    ids = cli_tokenize(D.model_path, PROMPT)
    a = completion()["choices"][0]["text"]
    j = completion(prompt=ids)
    eq(j["usage"]["prompt_tokens"], len(ids), "prompt_tokens of a token-id prompt")
    eq(j["choices"][0]["text"], a, "greedy text for the same prompt given as token ids")


@test
def test_completion_stream_equals_plain():
    want = completion()["choices"][0]["text"]
    _, chunks = D.stream("/v1/completions",
                         {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                          "stream": True, "stream_options": {"include_usage": True}})
    text = ""
    ids = set()
    finishes = []
    usage_chunks = []
    for i, c in enumerate(chunks):
        eq(c.get("object"), "text_completion", "chunk %d object" % i)
        ids.add(c.get("id"))
        expect(isinstance(c.get("created"), int), "chunk %d created: %s" % (i, short(c)))
        if c.get("choices") == []:
            usage_chunks.append(c)
            continue
        expect("usage" not in c or c["usage"] is None,
               "chunk %d carries usage before the end: %s" % (i, short(c)))
        expect(isinstance(c.get("choices"), list) and len(c["choices"]) == 1,
               "chunk %d choices: %s" % (i, short(c)))
        ch = c["choices"][0]
        eq(ch.get("index"), 0, "chunk %d index" % i)
        expect(isinstance(ch.get("text"), str), "chunk %d text: %s" % (i, short(c)))
        expect(not finishes, "chunk %d after the finishing chunk: %s" % (i, short(c)))
        text += ch["text"]
        if ch.get("finish_reason") is not None:
            finishes.append(ch["finish_reason"])
    eq(len(ids), 1, "distinct ids over the chunks")
    expect(list(ids)[0].startswith("cmpl-"), "chunk id %r" % list(ids)[0])
    eq(finishes, ["length"], "finish_reason over the chunks")
    eq(text, want, "concatenated stream text vs the non-stream text")
    eq(len(usage_chunks), 1, "usage chunks (stream_options.include_usage)")
    eq(chunks[-1], usage_chunks[0], "the usage chunk is the last before [DONE]")
    check_usage(usage_chunks[0].get("usage"), 16, "stream usage")


@test
def test_completion_echo():
    plain = completion(max_tokens=8)["choices"][0]["text"]
    j = completion(max_tokens=8, echo=True)
    eq(j["choices"][0]["text"], PROMPT + plain, "text with echo: prompt + completion")
    eq(j["usage"]["completion_tokens"], 8, "completion_tokens with echo")


@test
def test_many_concurrent_streams():
    # Two dozen streams at once, sharing one prompt (and so its cache
    # entry): each must arrive whole, in order, and equal the plain text.
    want = completion(max_tokens=16)["choices"][0]["text"]
    n = 24
    got = [None] * n
    errs = []
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        try:
            _, chunks = D.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                                     "ignore_eos": True, "stream": True})
            got[i] = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append("stream %d: %s" % (i, e))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    expect(not errs, "; ".join(errs[:3]))
    bad = [i for i in range(n) if got[i] != want]
    expect(not bad, "streams %s differ from the plain text %r (first: %r)"
           % (bad, want, got[bad[0]] if bad else None))


@test
def test_default_max_tokens_fills_context():
    ids = cli_tokenize(D.model_path, PROMPT)
    j = D.ok_json("POST", "/v1/completions", {"prompt": PROMPT, "ignore_eos": True})
    eq(j["usage"]["completion_tokens"], D.ctx_len - len(ids),
       "completion_tokens without max_tokens (the room left in the context)")
    eq(j["choices"][0]["finish_reason"], "length", "finish_reason")


def pick_stop(text):
    """A stop string from the middle of text: 5 characters without
    whitespace at the ends or U+FFFD, starting at its first occurrence
    after at least 3 characters of output."""
    for start in range(max(3, len(text) // 3), len(text) - 5):
        s = text[start:start + 5]
        if "\ufffd" in s or s != s.strip() or not s.strip():
            continue
        if text.find(s) >= 3:
            return s
    raise Fail("no usable stop string in the greedy output %r" % text)


@test
def test_stop_string():
    full = completion(max_tokens=48)["choices"][0]["text"]
    stop = pick_stop(full)
    want = full[:full.index(stop)]
    j = completion(max_tokens=48, stop=stop)
    c = j["choices"][0]
    eq(c["text"], want, "text with stop %r (full greedy text %r)" % (stop, full))
    eq(c["finish_reason"], "stop", "finish_reason on a stop string")
    expect(j["usage"]["completion_tokens"] < 48, "completion_tokens %d not below max_tokens"
           % j["usage"]["completion_tokens"])
    # streamed: the stop string may straddle chunks; no part of it is sent
    _, chunks = D.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 48, "temperature": 0,
                                             "ignore_eos": True, "stop": [stop], "stream": True})
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    eq(text, want, "streamed text with stop %r" % stop)
    eq([c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1], "stop",
       "streamed finish_reason")
    # the first of several stop strings to appear wins
    later = full[len(want) + 5:]
    if len(later) > 5:
        stops = [later[-4:], stop]
        cut = min(full.find(s) for s in stops if full.find(s) >= 0)
        j = completion(max_tokens=48, stop=stops)
        eq(j["choices"][0]["text"], full[:cut], "text with stop strings %r" % stops)


@test
def test_chat_stop_string():
    full = chat(max_tokens=48)["choices"][0]["message"]["content"]
    stop = pick_stop(full)
    j = chat(max_tokens=48, stop=stop)
    eq(j["choices"][0]["message"]["content"], full[:full.index(stop)], "chat content with stop %r" % stop)
    eq(j["choices"][0]["finish_reason"], "stop", "chat finish_reason on a stop string")


@test
def test_seed_reproducible():
    kw = dict(max_tokens=24, temperature=0.8, top_p=0.95)
    a = completion(seed=1234, **kw)["choices"][0]["text"]
    b = completion(seed=1234, **kw)["choices"][0]["text"]
    eq(b, a, "text of a second run with the same seed")
    others = {completion(seed=s, **kw)["choices"][0]["text"] for s in (1, 2, 3)}
    others.add(a)
    expect(len(others) >= 2, "seeds 1234, 1, 2, 3 all gave the same text %r at temperature 0.8" % a)
    g = completion(max_tokens=24)["choices"][0]["text"]
    c1 = chat(seed=77, **kw)["choices"][0]["message"]["content"]
    c2 = chat(seed=77, **kw)["choices"][0]["message"]["content"]
    eq(c2, c1, "chat content of a second run with the same seed")
    expect(g != a or len(others) > 1, "sampling looks greedy")


@test
def test_n_choices():
    j = completion(n=3, max_tokens=8, temperature=0.9, seed=5)
    ch = j["choices"]
    eq(sorted(c["index"] for c in ch), [0, 1, 2], "completion choice indexes")
    for c in ch:
        expect(isinstance(c["text"], str) and c["text"], "choice %d text %r" % (c["index"], c["text"]))
        eq(c["finish_reason"], "length", "choice %d finish_reason" % c["index"])
    eq(j["usage"]["completion_tokens"], 24, "usage.completion_tokens over 3 choices of 8")
    j = chat(n=3, max_tokens=8, temperature=0.9, seed=5)
    eq(sorted(c["index"] for c in j["choices"]), [0, 1, 2], "chat choice indexes")
    for c in j["choices"]:
        eq(c["message"]["role"], "assistant", "chat choice %d role" % c["index"])
    # streamed: every index gets its deltas and exactly one finish_reason
    _, chunks = D.stream("/v1/chat/completions",
                         {"messages": MSGS, "n": 3, "max_tokens": 8, "temperature": 0.9, "seed": 5,
                          "ignore_eos": True, "stream": True})
    fin = {}
    roles = {}
    for c in chunks:
        for chc in c["choices"]:
            i = chc["index"]
            if chc.get("delta", {}).get("role"):
                roles[i] = chc["delta"]["role"]
            if chc.get("finish_reason"):
                fin.setdefault(i, []).append(chc["finish_reason"])
    eq(sorted(fin), [0, 1, 2], "indexes with a finish_reason in the n=3 stream")
    eq([fin[i] for i in range(3)], [["length"]] * 3, "finish_reasons per index")
    eq(roles, {0: "assistant", 1: "assistant", 2: "assistant"}, "role deltas per index")


@test
def test_n_choices_stop_one_sibling_early():
    # a sibling stopped by its stop string stops generating at once
    # (REQ_ABORT_SEQ), the others run on; n = 1 too
    sibling_stop.check(D, "api")


@test
def test_completion_logprobs():
    j = completion(max_tokens=6, logprobs=2)
    c = j["choices"][0]
    lp = c.get("logprobs")
    expect(isinstance(lp, dict), "logprobs: %s" % short(c))
    for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        expect(isinstance(lp.get(k), list) and len(lp[k]) == 6,
               "logprobs.%s is not a list of 6: %s" % (k, short(lp)))
    off = lp["text_offset"]
    expect(all(isinstance(o, int) for o in off) and off == sorted(off),
           "text_offset not non-decreasing integers: %r" % off)
    for i in range(6):
        tl = lp["token_logprobs"][i]
        expect(isinstance(tl, (int, float)) and tl <= 1e-6, "token_logprobs[%d] = %r" % (i, tl))
        top = lp["top_logprobs"][i]
        expect(isinstance(top, dict) and 1 <= len(top) <= 3, "top_logprobs[%d] = %s" % (i, short(top)))
        expect(all(v <= 1e-6 for v in top.values()), "top_logprobs[%d] > 0: %s" % (i, short(top)))
        # greedy: the sampled token is the most likely one
        expect(abs(max(top.values()) - tl) < 1e-3,
               "greedy token %d has logprob %r but the top alternative %r" % (i, tl, max(top.values())))
    joined = "".join(lp["tokens"])
    if "\ufffd" not in joined + c["text"]:
        eq(joined, c["text"], "concatenated logprobs.tokens vs text")
    expect(completion(max_tokens=6)["choices"][0]["text"] == c["text"],
           "asking for logprobs changed the greedy text")


@test
def test_chat_logprobs():
    j = chat(max_tokens=6, logprobs=True, top_logprobs=2)
    c = j["choices"][0]
    lp = c.get("logprobs")
    expect(isinstance(lp, dict) and isinstance(lp.get("content"), list),
           "chat logprobs.content: %s" % short(c))
    eq(len(lp["content"]), 6, "entries in logprobs.content")
    for i, e in enumerate(lp["content"]):
        expect(isinstance(e.get("token"), str), "content[%d].token: %s" % (i, short(e)))
        expect(isinstance(e.get("logprob"), (int, float)) and e["logprob"] <= 1e-6,
               "content[%d].logprob: %s" % (i, short(e)))
        b = e.get("bytes")
        expect(b is None or (isinstance(b, list) and all(isinstance(x, int) and 0 <= x < 256 for x in b)),
               "content[%d].bytes: %s" % (i, short(e)))
        top = e.get("top_logprobs")
        expect(isinstance(top, list) and len(top) == 2, "content[%d].top_logprobs: %s" % (i, short(e)))
        for t in top:
            expect(isinstance(t.get("token"), str) and isinstance(t.get("logprob"), (int, float)),
                   "content[%d].top_logprobs entry: %s" % (i, short(t)))
        expect(top[0]["logprob"] >= top[1]["logprob"], "top_logprobs not sorted: %s" % short(top))
        expect(abs(top[0]["logprob"] - e["logprob"]) < 1e-3,
               "greedy token %d logprob %r is not the top one %r" % (i, e["logprob"], top[0]["logprob"]))
    j = chat(max_tokens=4)
    expect(j["choices"][0].get("logprobs") is None, "chat logprobs given unasked")


# ---- chat ------------------------------------------------------------------


@test
def test_chat():
    j = chat()
    expect(isinstance(j.get("id"), str) and j["id"].startswith("chatcmpl-"), "id: %r" % j.get("id"))
    eq(j.get("object"), "chat.completion", "object")
    eq(j.get("model"), "itest-model", "model")
    expect(isinstance(j.get("created"), int), "created")
    eq(len(j["choices"]), 1, "choices")
    c = j["choices"][0]
    eq(c.get("index"), 0, "index")
    msg = c.get("message")
    expect(isinstance(msg, dict), "message: %s" % short(c))
    eq(msg.get("role"), "assistant", "message.role")
    expect(isinstance(msg.get("content"), str) and msg["content"], "message.content: %s" % short(msg))
    eq(c.get("finish_reason"), "length", "finish_reason")
    check_usage(j.get("usage"), 16)
    eq(chat(max_tokens=None, max_completion_tokens=5)["usage"]["completion_tokens"], 5,
       "completion_tokens with max_completion_tokens 5")
    eq(j["usage"]["prompt_tokens"], len(cli_chat_ids(MSGS)),
       "chat usage.prompt_tokens vs `radix tokenize --chat ... --chat-template chatml`")
    # content given as an array of text parts means the same
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in MSGS]
    eq(chat(messages=parts)["choices"][0]["message"]["content"], msg["content"],
       "content as [{type: text}] parts")


@test
def test_chat_stream_equals_plain():
    want = chat()["choices"][0]["message"]["content"]
    _, chunks = D.stream("/v1/chat/completions",
                         {"messages": MSGS, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                          "stream": True, "stream_options": {"include_usage": True}})
    content = ""
    ids = set()
    fin = []
    role_first = None
    usage = None
    for i, c in enumerate(chunks):
        eq(c.get("object"), "chat.completion.chunk", "chunk %d object" % i)
        ids.add(c.get("id"))
        if c.get("choices") == []:
            usage = c.get("usage")
            continue
        ch = c["choices"][0]
        eq(ch.get("index"), 0, "chunk %d index" % i)
        d = ch.get("delta")
        expect(isinstance(d, dict), "chunk %d delta: %s" % (i, short(c)))
        if role_first is None:
            role_first = d.get("role")
        elif "role" in d:
            raise Fail("chunk %d repeats the role: %s" % (i, short(c)))
        expect(not fin, "chunk %d after the finish: %s" % (i, short(c)))
        if d.get("content") is not None:
            content += d["content"]
        if ch.get("finish_reason") is not None:
            fin.append(ch["finish_reason"])
    eq(role_first, "assistant", "role of the first delta")
    eq(len(ids), 1, "distinct ids over the chunks")
    expect(list(ids)[0].startswith("chatcmpl-"), "chunk id %r" % list(ids)[0])
    eq(fin, ["length"], "finish_reasons")
    eq(content, want, "concatenated chat deltas vs the non-stream content")
    check_usage(usage, 16, "stream usage")


@test
def test_model_names():
    eq(completion(model="itest-model")["model"], "itest-model", "model echoed")
    j = D.ok_json("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    eq(j["model"], "itest-model", "model of a request naming none")


# ---- the prefix cache --------------------------------------------------------


@test
def test_cached_tokens_and_flush():
    # A long prompt no other test sends, so the first run finds nothing.
    prompt = " ".join("token%d" % i for i in range(60))
    r = D.post("/flush_cache")
    eq(r.status, 200, "POST /flush_cache (%s)" % short(r.body))
    first = completion(prompt=prompt, max_tokens=4)["usage"]
    eq(first["prompt_tokens_details"]["cached_tokens"], 0, "cached_tokens of a new prompt")
    second = completion(prompt=prompt, max_tokens=4)["usage"]
    n = second["prompt_tokens"]
    c = second["prompt_tokens_details"]["cached_tokens"]
    expect(n - 2 <= c <= n, "cached_tokens %d of a repeated %d-token prompt (want >= %d)" % (c, n, n - 2))
    # a shared prefix hits partly
    third = completion(prompt=prompt + " and then something else entirely", max_tokens=4)["usage"]
    c3 = third["prompt_tokens_details"]["cached_tokens"]
    expect(n // 2 <= c3 < third["prompt_tokens"],
           "cached_tokens %d of a prompt extending a cached %d-token one" % (c3, n))
    r = D.post("/flush_cache")
    eq(r.status, 200, "POST /flush_cache (%s)" % short(r.body))
    again = completion(prompt=prompt, max_tokens=4)["usage"]
    eq(again["prompt_tokens_details"]["cached_tokens"], 0, "cached_tokens after /flush_cache")


def cli_generate_ids(prompt, n):
    """Greedy token ids from `radix generate` (the engine without the
    server: one request, one-shot prefill) -- the reference."""
    cmd = [os.environ["RADIX"], "generate", "--model", D.model_path, "--prompt", prompt,
           "--max-tokens", str(n), "--ignore-eos", "--ids", "--threads", "1"]
    env = dict(os.environ, RADIX_PLUGIN_PATH=os.environ["RX_PLUGIN_BUILD_DIR"])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=120)
    if r.returncode != 0:
        raise Fail("%s: %s" % (" ".join(cmd[:4]), short(r.stderr)))
    return [int(x) for x in r.stdout.split()]


def gen_ids(prompt, n, **sp):
    params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    params.update(sp)
    j = D.ok_json("POST", "/generate", {"text": prompt, "return_logprob": True, "sampling_params": params})
    return [e[1] for e in j["meta_info"]["output_token_logprobs"]]


LONG_PROMPT = " ".join("word%d," % i for i in range(90))     # ~300 tokens: 5 prefill chunks of 64


@test
def test_matches_cli_reference():
    for p in (PROMPT, LONG_PROMPT):
        n_prompt = len(cli_tokenize(D.model_path, p))
        D.post("/flush_cache")
        eq(gen_ids(p, 12), cli_generate_ids(p, 12),
           "greedy ids of radixd vs `radix generate` for a %d-token prompt" % n_prompt)
        # and again with the prompt in the prefix cache
        eq(gen_ids(p, 12), cli_generate_ids(p, 12), "greedy ids with the prompt cached (%d tokens)" % n_prompt)


@test
def test_concurrent_equals_sequential():
    # Continuous batching must not let requests disturb each other.
    prompts = ["Request number %d says: %s" % (i, "la " * (i * 7)) for i in range(8)]
    D.post("/flush_cache")
    want = [gen_ids(p, 20) for p in prompts]
    D.post("/flush_cache")
    got = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def one(i):
        barrier.wait()
        got[i] = gen_ids(prompts[i], 20)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    for i in range(len(prompts)):
        eq(got[i], want[i], "greedy ids of request %d run with 7 others vs alone" % i)


@test
def test_partial_prefix_hit_same_output():
    base = " ".join("alpha%d" % i for i in range(40))
    ext = base + " and a different ending here"
    D.post("/flush_cache")
    cold = completion(prompt=ext, max_tokens=16)
    eq(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "cold run cached_tokens")
    D.post("/flush_cache")
    completion(prompt=base, max_tokens=4)
    warm = completion(prompt=ext, max_tokens=16)
    expect(warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 20,
           "the extended prompt reused only %d cached tokens"
           % warm["usage"]["prompt_tokens_details"]["cached_tokens"])
    eq(warm["choices"][0]["text"], cold["choices"][0]["text"], "greedy text with a partial prefix hit vs cold")


@test
def test_generated_tokens_cached():
    # The radix cache keeps generated tokens too, so a follow-up whose
    # prompt is the old prompt + the old output (+ more) hits all of it.
    D.post("/flush_cache")
    ids = cli_tokenize(D.model_path, "In a village at the foot of the mountains")
    j = D.ok_json("POST", "/generate", {"input_ids": ids, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
    out = [e[1] for e in j["meta_info"]["output_token_logprobs"]]
    follow = ids + out + [1000, 1001, 1002]
    j = D.ok_json("POST", "/generate", {"input_ids": follow, "sampling_params": {"max_new_tokens": 2}})
    c = j["meta_info"]["cached_tokens"]
    # the last generated token has no KV yet when the request ends
    expect(c >= len(ids) + len(out) - 1, "follow-up reused %d cached tokens; prompt %d + output %d"
           % (c, len(ids), len(out)))


@test
def test_multi_turn_chat_hits_cache():
    D.post("/flush_cache")
    turn1 = [{"role": "user", "content": "Tell me a story about a dragon and a castle."}]
    a = chat(messages=turn1, max_tokens=24)
    reply = a["choices"][0]["message"]["content"]
    turn2 = turn1 + [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And then what happened?"}]
    b = chat(messages=turn2, max_tokens=4)
    c = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    p1 = a["usage"]["prompt_tokens"]
    # At least the whole first prompt; how much of the reply hits depends on
    # whether its text re-tokenizes to the sampled ids (gibberish often
    # does not), which test_generated_tokens_cached checks exactly.
    expect(c >= p1, "second turn reused %d cached tokens; the first prompt alone is %d" % (c, p1))
    diag("second turn: %d cached of %d prompt tokens (first prompt %d, reply %d)"
         % (c, b["usage"]["prompt_tokens"], p1, a["usage"]["completion_tokens"]))


@test
def test_stream_equals_plain_sampled():
    # Longer sampled outputs break multi-byte characters across tokens more
    # often: the stream must hold partial UTF-8 back and still add up.
    for seed in (11, 12, 13):
        body = {"prompt": PROMPT, "max_tokens": 64, "temperature": 1.0, "seed": seed, "ignore_eos": True}
        want = D.ok_json("POST", "/v1/completions", body)["choices"][0]["text"]
        _, chunks = D.stream("/v1/completions", dict(body, stream=True))
        got = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        eq(got, want, "seed %d: streamed text vs plain" % seed)


# ---- metrics -----------------------------------------------------------------

# concept -> regex over metric names (exact names are the daemon's choice)
METRIC_CONCEPTS = {
    "time-to-first-token histogram": r"^radix_\w*(ttft|time_to_first_token)\w*_bucket$",
    "inter-token latency histogram": r"^radix_\w*(itl|inter_token|time_per_output_token|tpot)\w*_bucket$",
    "end-to-end latency histogram": r"^radix_\w*(e2e|request_latency|request_duration)\w*_bucket$",
    "running requests": r"^radix_\w*running\w*$",
    "queued requests": r"^radix_\w*(queue|queued|waiting)\w*$",
    "KV cache usage": r"^radix_\w*(kv|token_usage|cache_usage)\w*$",
    "prefix cache hit rate": r"^radix_\w*(hit)\w*$",
    "generated tokens": r"^radix_\w*(generation|output|completion|generated)_tokens\w*$",
}


@test
def test_metrics():
    completion(max_tokens=4)
    r = D.get("/metrics")
    eq(r.status, 200, "GET /metrics")
    ctype = r.header("Content-Type") or ""
    expect(ctype.startswith("text/plain"), "/metrics Content-Type %r" % ctype)
    text = r.body.decode("utf-8")
    for line in text.splitlines():
        if line and not line.startswith("#"):
            expect(re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?\s+[-+0-9.eEinfNaI]+(\s+\d+)?$", line),
                   "not a Prometheus sample line: %r" % line)
    samples = parse_metrics(text)
    names = sorted({re.sub(r"\{.*", "", k) for k in samples})
    missing = [c for c, rx in METRIC_CONCEPTS.items() if not any(re.match(rx, n) for n in names)]
    if missing:
        raise Fail("/metrics lacks %s; radix_ names present: %s"
                   % (", ".join(missing), ", ".join(n for n in names if n.startswith("radix_")) or "none"))
    e2e = [k for k in samples if re.match(r"radix_\w*(e2e|request_latency|request_duration)\w*_count", k)]
    expect(e2e and max(samples[k] for k in e2e) >= 1,
           "end-to-end latency histogram counted no request after several: %s" % e2e)


if __name__ == "__main__":
    run(setup, timeout=150)
