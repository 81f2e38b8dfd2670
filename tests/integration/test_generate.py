#!/usr/bin/env python3
"""radixd's SGLang-native endpoints and request cancellation: POST
/generate (text, input_ids, stream, logprobs, stop_token_ids), POST
/abort_request by rid (streamed and plain) and abort_all, and a client that
disconnects mid-request: its request is aborted and the KV pool comes back
to its baseline.  One daemon on the "slow" model (about a hundred tokens per
second on one thread), so a long generation is still running when the test
aborts it."""

import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import (Daemon, Fail, cli_tokenize, diag, eq, expect, in_thread, run, short,  # noqa: E402
                    stream_json, test, wait_until)

D = None
PROMPT = "Once upon a time"
LONG = 3000          # tokens: ~30 s of decoding, far longer than any abort takes


def setup():
    global D
    D = Daemon("slow").start().wait_healthy()


def gen(**kw):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                "ignore_eos": True}}
    sp = kw.pop("sampling_params", {})
    body["sampling_params"].update(sp)
    body.update(kw)
    return D.ok_json("POST", "/generate", body)


def check_meta(j, what):
    expect(isinstance(j, dict) and isinstance(j.get("text"), str), "%s: no text: %s" % (what, short(j)))
    mi = j.get("meta_info")
    expect(isinstance(mi, dict), "%s: no meta_info: %s" % (what, short(j)))
    for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        expect(isinstance(mi.get(k), int), "%s: meta_info.%s: %s" % (what, k, short(mi)))
    return mi


def finish_type(mi):
    fr = mi.get("finish_reason")
    return fr.get("type") if isinstance(fr, dict) else fr


# ---- /generate ----------------------------------------------------------------


@test
def test_generate_text():
    j = gen(rid="itest-gen-1")
    mi = check_meta(j, "/generate")
    eq(mi["completion_tokens"], 8, "completion_tokens")
    eq(mi["prompt_tokens"], len(cli_tokenize(D.model_path, PROMPT)), "prompt_tokens (BOS + text)")
    fr = mi.get("finish_reason")
    expect(isinstance(fr, dict), "finish_reason is not an object: %s" % short(mi))
    eq(fr.get("type"), "length", "finish_reason.type")
    eq(fr.get("length"), 8, "finish_reason.length")
    eq(mi.get("id"), "itest-gen-1", "meta_info.id (the rid)")
    expect(j["text"], "empty text")
    eq(gen()["text"], j["text"], "second greedy /generate")


@test
def test_generate_input_ids():
    ids = cli_tokenize(D.model_path, PROMPT)
    a = gen()["text"]
    j = D.ok_json("POST", "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}})
    mi = check_meta(j, "/generate input_ids")
    eq(mi["prompt_tokens"], len(ids), "prompt_tokens of input_ids")
    eq(j["text"], a, "greedy text from input_ids vs the same prompt as text")
    # max_new_tokens 0: prefill only
    j = D.ok_json("POST", "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}})
    eq(check_meta(j, "max_new_tokens 0")["completion_tokens"], 0, "completion_tokens with max_new_tokens 0")


@test
def test_generate_matches_cli_reference():
    # The engine without the server (`radix generate`) is the reference.
    cmd = [os.environ["RADIX"], "generate", "--model", D.model_path, "--prompt", PROMPT,
           "--max-tokens", "16", "--ignore-eos", "--ids", "--threads", "1"]
    env = dict(os.environ, RADIX_PLUGIN_PATH=os.environ["RX_PLUGIN_BUILD_DIR"])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=120)
    expect(r.returncode == 0, "radix generate failed: %s" % short(r.stderr))
    want = [int(x) for x in r.stdout.split()]
    j = gen(return_logprob=True, sampling_params={"max_new_tokens": 16})
    eq([e[1] for e in j["meta_info"]["output_token_logprobs"]], want, "greedy ids vs `radix generate --ids`")


@test
def test_generate_stream():
    want = gen(sampling_params={"max_new_tokens": 12})["text"]
    _, events = D.stream("/generate", {"text": PROMPT, "stream": True, "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    expect(len(events) >= 2, "only %d events for 12 tokens" % len(events))
    prev = ""
    for i, ev in enumerate(events):
        mi = check_meta(ev, "stream event %d" % i)
        # SGLang streams the cumulative text
        expect(ev["text"].startswith(prev.rstrip("\ufffd")),
               "event %d text %r does not extend the previous %r" % (i, ev["text"], prev))
        prev = ev["text"]
        if i < len(events) - 1:
            expect(mi.get("finish_reason") is None,
                   "event %d (not last) has finish_reason %s" % (i, short(mi.get("finish_reason"))))
    last = events[-1]["meta_info"]
    eq(finish_type(last), "length", "last event's finish_reason.type")
    eq(last["completion_tokens"], 12, "last event's completion_tokens")
    eq(events[-1]["text"], want, "final streamed text vs the plain /generate text")
    expect(all("index" not in ev for ev in events), "n = 1 stream events carry an index")


@test
def test_generate_stream_n2_events_name_their_sequence():
    # n = 2: each event says which sequence its cumulative text belongs to;
    # per index the texts extend each other and end with the plain answer's
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True, "n": 2}
    plain = gen(sampling_params=sp)
    expect(isinstance(plain, list) and len(plain) == 2, "n = 2 plain answer: %s" % short(plain))
    _, events = D.stream("/generate", {"text": PROMPT, "stream": True, "sampling_params": sp})
    seen = {0: "", 1: ""}
    for i, ev in enumerate(events):
        expect(ev.get("index") in (0, 1), "event %d has index %r" % (i, ev.get("index")))
        k = ev["index"]
        expect(ev["text"].startswith(seen[k].rstrip("\ufffd")),
               "event %d (index %d) text %r does not extend %r" % (i, k, ev["text"], seen[k]))
        seen[k] = ev["text"]
    for k in (0, 1):
        eq(seen[k], plain[k]["text"], "index %d's last streamed text vs the plain answer" % k)


@test
def test_generate_logprobs_and_stop_token():
    j = gen(return_logprob=True, top_logprobs_num=2, sampling_params={"max_new_tokens": 10})
    mi = check_meta(j, "/generate return_logprob")
    out = mi.get("output_token_logprobs")
    expect(isinstance(out, list) and len(out) == 10, "output_token_logprobs: %s" % short(mi))
    for i, e in enumerate(out):
        expect(isinstance(e, list) and len(e) == 3 and isinstance(e[1], int) and e[0] <= 1e-6,
               "output_token_logprobs[%d] = %s" % (i, short(e)))
    top = mi.get("output_top_logprobs")
    expect(isinstance(top, list) and len(top) == 10 and all(len(t) == 2 for t in top),
           "output_top_logprobs: %s" % short(top))
    for i in range(10):
        eq(top[i][0][1], out[i][1], "greedy token %d is the top alternative" % i)
    ids = [e[1] for e in out]
    # stop_token_ids: stop at the first occurrence of the 4th token
    k = ids.index(ids[3])
    j2 = gen(sampling_params={"max_new_tokens": 10, "stop_token_ids": [ids[3]]})
    mi2 = check_meta(j2, "stop_token_ids")
    fr = mi2.get("finish_reason")
    expect(isinstance(fr, dict) and fr.get("type") == "stop", "finish_reason with stop_token_ids: %s"
           % short(fr))
    eq(fr.get("matched"), ids[3], "finish_reason.matched (the stop token id)")
    eq(mi2["completion_tokens"], k + 1, "completion_tokens up to and including the stop token")


@test
def test_generate_stop_string():
    full = gen(sampling_params={"max_new_tokens": 40})["text"]
    stop = None
    for s in range(len(full) // 3, len(full) - 4):
        cand = full[s:s + 4]
        if "\ufffd" not in cand and cand.strip() == cand and full.find(cand) >= 2:
            stop = cand
            break
    expect(stop is not None, "no stop string candidate in %r" % full)
    j = gen(sampling_params={"max_new_tokens": 40, "stop": stop})
    mi = check_meta(j, "/generate stop")
    eq(j["text"], full[:full.index(stop)], "text with stop %r (full %r)" % (stop, full))
    fr = mi.get("finish_reason")
    eq(fr, {"type": "stop", "matched": stop}, "finish_reason")


# ---- abort -------------------------------------------------------------------


def long_stream(path, body, rid_events, abort_at=2, budget=15.0):
    """Stream body, calling rid_events() once abort_at events have arrived;
    after that the stream must end within budget seconds.  Returns the
    parsed events (without [DONE]) and the seconds from the call to the
    end."""
    mark = {}

    def on_event(i, payload):
        if i + 1 == abort_at:
            mark["t"] = time.monotonic()
            rid_events()
        if "t" in mark and time.monotonic() - mark["t"] > budget:
            raise Fail("stream still sending %.0f s after the abort (event %d)" % (budget, i))

    _, evs = stream_json(D.port, path, body, timeout=budget, on_event=on_event)
    expect("t" in mark, "stream ended after fewer than %d events" % abort_at)
    return evs, time.monotonic() - mark["t"]


@test
def test_abort_streaming_generate():
    rid = "itest-abort-stream"
    res = {}

    def abort():
        res["r"] = D.post("/abort_request", {"rid": rid})

    evs, dt = long_stream("/generate", {"text": PROMPT, "rid": rid, "stream": True, "sampling_params": {
        "max_new_tokens": LONG, "temperature": 0, "ignore_eos": True}}, abort)
    eq(res["r"].status, 200, "POST /abort_request (%s)" % short(res["r"].body))
    mi = evs[-1]["meta_info"]
    eq(finish_type(mi), "abort", "finish_reason.type of the last event after /abort_request")
    expect(mi["completion_tokens"] < LONG, "completion_tokens %d: not aborted" % mi["completion_tokens"])
    diag("aborted after %d tokens; stream ended %.2f s after the abort" % (mi["completion_tokens"], dt))
    expect(wait_until(lambda: D.running_count() in (0, None), 5), "a request still running after the abort")


@test
def test_abort_plain_generate():
    rid = "itest-abort-plain"
    h = in_thread(D.post, "/generate", {"text": PROMPT, "rid": rid, "sampling_params": {
        "max_new_tokens": LONG, "temperature": 0, "ignore_eos": True}}, timeout=60)
    started = wait_until(lambda: (D.running_count() or 0) >= 1, 5)
    if not started:
        time.sleep(1.0)
    t0 = time.monotonic()
    r = D.post("/abort_request", {"rid": rid})
    eq(r.status, 200, "POST /abort_request (%s)" % short(r.body))
    resp = h.result(timeout=20)
    dt = time.monotonic() - t0
    eq(resp.status, 200, "aborted /generate status (%s)" % short(resp.body))
    mi = check_meta(resp.json(), "aborted /generate")
    eq(finish_type(mi), "abort", "finish_reason.type of an aborted plain /generate")
    expect(dt < 10, "the aborted request answered %.1f s after /abort_request" % dt)


@test
def test_abort_all():
    hs = [in_thread(D.post, "/generate", {"text": PROMPT + str(i), "sampling_params": {
        "max_new_tokens": LONG, "ignore_eos": True}}, timeout=60) for i in range(2)]
    if not wait_until(lambda: (D.running_count() or 0) >= 1, 5):
        time.sleep(1.0)
    r = D.post("/abort_request", {"abort_all": True})
    eq(r.status, 200, "POST /abort_request abort_all (%s)" % short(r.body))
    for i, h in enumerate(hs):
        resp = h.result(timeout=20)
        eq(resp.status, 200, "request %d after abort_all (%s)" % (i, short(resp.body)))
        eq(finish_type(resp.json()["meta_info"]), "abort", "request %d finish_reason.type" % i)


# ---- client disconnect -> KV back to baseline ---------------------------------


def idle_baseline():
    """Flush the prefix cache once nothing runs, then the KV usage."""
    ok = wait_until(lambda: D.post("/flush_cache").status == 200, 10, 0.2)
    expect(ok, "POST /flush_cache never succeeded")
    return D.kv_usage()


def gen_tokens_total():
    return D.stat(r"(generation|generated|output|completion)_tokens(_total)?$")


def raw_request(body_obj, path="/v1/completions"):
    s = socket.create_connection(("127.0.0.1", D.port), timeout=30)
    body = json.dumps(body_obj).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(body)) + body)
    return s


def check_back_to_baseline(where, base, what):
    gone = wait_until(lambda: D.running_count() in (0, None), 8)
    expect(gone, "%s: still %s running request(s) 8 s after the client left"
           % (what, D.running_count()))
    t0 = gen_tokens_total()
    if t0 is not None:
        time.sleep(0.6)
        eq(gen_tokens_total(), t0, "%s: generated-token counter still growing after the client left" % what)
    back = wait_until(lambda: D.post("/flush_cache").status == 200 and D.kv_usage()[1] == base, 10, 0.2)
    expect(back, "%s: KV usage %s = %s, baseline %s (after /flush_cache)"
           % (what, where, D.kv_usage()[1], base))


@test
def test_disconnect_mid_stream_frees_kv():
    where, base = idle_baseline()
    diag("KV usage field: %s = %s at baseline" % (where, base))
    s = raw_request({"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True})
    try:
        got = b""
        deadline = time.monotonic() + 20
        while got.count(b"data:") < 4 and time.monotonic() < deadline:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        expect(got.startswith(b"HTTP/1.1 200"), "stream answer: %s" % short(got, 200))
        expect(got.count(b"data:") >= 4, "fewer than 4 events in 20 s: %s" % short(got, 300))
        during = D.kv_usage()[1]
        expect(during > base, "KV usage %s = %s while a request streams: not above the baseline %s"
               % (where, during, base))
    finally:
        s.close()
    check_back_to_baseline(where, base, "stream disconnect")


@test
def test_disconnect_while_waiting_frees_kv():
    where, base = idle_baseline()
    s = raw_request({"prompt": PROMPT + " again", "max_tokens": LONG, "ignore_eos": True})
    try:
        rose = wait_until(lambda: D.kv_usage()[1] > base, 10)
        expect(rose, "KV usage never rose above %s while a plain request ran" % base)
    finally:
        s.close()
    check_back_to_baseline(where, base, "plain-request disconnect")
    still = D.ok_json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    eq(still["usage"]["completion_tokens"], 2, "a request after the disconnects")


if __name__ == "__main__":
    run(setup, timeout=170)
