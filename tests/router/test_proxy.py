#!/usr/bin/env python3
"""radix-router as a proxy: the three generate endpoints and /v1/models
reach a worker and come back unchanged, round_robin spreads them evenly,
SSE streams pass through chunk by chunk as the worker sends them (the
first chunk reaches the client long before the worker finishes), bad JSON
is refused with 400 before any worker sees it, a worker's own 4xx is
passed back without a retry, and /health and /metrics answer with the
documented names.  Two fake workers, round_robin."""

import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routertest import (Router, answered_by, completion, fake_workers, run)  # noqa: E402
from rxtest import (eq, expect, expect_error, in_thread, parse_metrics, raw_http, wait_until,  # noqa: E402
                    short, test)

R = None
W = []


def setup():
    global R, W
    W = fake_workers(2)
    R = Router(W, policy="round_robin").start()
    R.wait_healthy([w.url for w in W])


def total_requests():
    return sum(w.requests() for w in W)


def reset():
    for w in W:
        w.reset()


# ---- plain proxying ------------------------------------------------------------


@test
def test_completions_proxied():
    reset()
    body = completion("the quick brown fox", max_tokens=3, temperature=0.5, seed=7,
                      stop=["\n"], user="itest")
    r = R.post("/v1/completions", body)
    eq(r.status, 200, "POST /v1/completions status (%s)" % short(r.body))
    expect((r.header("Content-Type") or "").startswith("application/json"),
           "Content-Type %r" % r.header("Content-Type"))
    j = r.json()
    eq(j["object"], "text_completion", "object")
    eq(j["choices"][0]["text"], "t0 t1 t2 ", "text the worker generated")
    eq(j["usage"]["completion_tokens"], 3, "usage.completion_tokens")
    who = j["worker"]
    w = [x for x in W if x.name == who]
    eq(len(w), 1, "answering worker %r is one of ours" % who)
    st = w[0].stats()
    eq(st["requests"], 1, "requests the answering worker got")
    eq(json.loads(st["last_body"]), body, "body the worker received (JSON)")
    eq(total_requests(), 1, "requests over all workers")


@test
def test_chat_and_generate_proxied():
    reset()
    chat = {"model": "fake-model", "max_tokens": 2,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    j = R.ok_json("POST", "/v1/chat/completions", chat)
    eq(j["object"], "chat.completion", "chat object")
    eq(j["choices"][0]["message"]["content"], "t0 t1 ", "chat content")
    gen = {"text": "once upon a time", "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    j2 = R.ok_json("POST", "/generate", gen)
    eq(j2["text"], "t0 t1 t2 ", "/generate text")
    eq(j2["meta_info"]["completion_tokens"], 3, "/generate meta_info.completion_tokens")
    by = {}
    for w in W:
        st = w.stats()
        for p, n in st["by_path"].items():
            by[p] = by.get(p, 0) + n
        if st["by_path"]["/generate"]:
            eq(json.loads(st["last_body"]), gen, "/generate body at the worker")
    eq(by, {"/v1/completions": 0, "/v1/chat/completions": 1, "/generate": 1}, "requests per path at the workers")


@test
def test_round_robin_spreads_evenly():
    reset()
    seen = []
    for i in range(20):
        r = R.post("/v1/completions", completion("request %d" % i))
        eq(r.status, 200, "request %d (%s)" % (i, short(r.body)))
        seen.append(answered_by(r))
    counts = [w.requests() for w in W]
    eq(counts, [10, 10], "requests per worker after 20 round_robin requests")
    # strictly alternating: no worker twice in a row
    for a, b in zip(seen, seen[1:]):
        expect(a != b, "round_robin sent two requests in a row to %s: %s" % (a, seen))


@test
def test_models_from_a_worker():
    reset()
    j = R.ok_json("GET", "/v1/models")
    eq(j.get("object"), "list", "GET /v1/models object")
    eq(j["data"][0]["id"], "fake-model", "model id")
    eq(sum(w.stats()["models"] for w in W), 1, "GET /v1/models reached one worker once")


# ---- streaming ----------------------------------------------------------------------


@test
def test_stream_each_endpoint():
    reset()
    cases = [
        ("/v1/completions", completion("stream me", max_tokens=5, stream=True,
                                       stream_options={"include_usage": True}), 6),
        ("/v1/chat/completions", {"model": "fake-model", "max_tokens": 4, "stream": True,
                                  "messages": [{"role": "user", "content": "hi"}]}, 4),
        ("/generate", {"text": "abc", "sampling_params": {"max_new_tokens": 3}, "stream": True}, 3),
    ]
    for path, body, n in cases:
        resp, chunks = R.stream(path, body)
        eq(len(chunks), n, "%s: JSON events before [DONE] (%s)" % (path, short(chunks)))
        workers = {c.get("worker") for c in chunks}
        eq(len(workers), 1, "%s: every chunk from one worker (%s)" % (path, workers))
        if path == "/v1/completions":
            eq("".join(c["choices"][0]["text"] for c in chunks if c["choices"]), "t0 t1 t2 t3 t4 ",
               "streamed text")
            eq(chunks[-1]["usage"]["completion_tokens"], 5, "usage chunk")
    eq(total_requests(), 3, "requests at the workers")


@test
def test_stream_chunks_not_buffered():
    """The worker sends 6 chunks 300 ms apart: each must reach the client
    as it is sent, not all at the end."""
    reset()
    arrivals = []
    t0 = time.monotonic()

    def on_event(i, payload):
        arrivals.append(time.monotonic() - t0)
    body = completion("slow stream", max_tokens=6, stream=True, fake_interval_ms=300)
    _, chunks = R.stream("/v1/completions", body, on_event=on_event)
    total = time.monotonic() - t0
    eq(len(chunks), 6, "chunks")
    expect(total >= 1.4, "the stream took %.2f s, the worker needs >= 1.5 s" % total)
    expect(arrivals[0] < 0.6,
           "first chunk reached the client after %.2f s (stream total %.2f s): buffered?" % (arrivals[0], total))
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:6])]
    expect(all(g > 0.12 for g in gaps),
           "chunks arrived bunched together (gaps %s s): the router buffers" % ["%.2f" % g for g in gaps])


# ---- errors -----------------------------------------------------------------------


@test
def test_bad_json_400_no_worker_touched():
    reset()
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        for body in (b"{bad json", b"", b"[1, 2]", b"\"a string\"", b"{\"prompt\": \"x\"", b"nul"):
            r = R.post(path, body, headers={"Content-Type": "application/json"})
            expect_error(r, 400, what="POST %s with body %r" % (path, body))
    eq(total_requests(), 0, "requests that reached a worker")
    R.check_alive()
    eq(R.post("/v1/completions", completion()).status, 200, "a good request after the bad ones")


@test
def test_worker_4xx_passed_back_not_retried():
    reset()
    for w in W:
        w.control(fail_status=400, fail_count=1)
    r = R.post("/v1/completions", completion("x"))
    e = expect_error(r, 400, what="worker's own 400")
    expect("injected failure" in e["message"], "the worker's error message passed back: %s" % short(r.body))
    eq(total_requests(), 1, "a 400 is not retried (requests at the workers)")
    eq(R.metric("radix_router_retries_total"), 0.0, "radix_router_retries_total after a 400")


@test
def test_unknown_path_404():
    for method, path in (("GET", "/nope"), ("POST", "/v1/embeddings_nope"), ("GET", "/v1/completions/x")):
        r = R.request(method, path)
        expect_error(r, 404, what="%s %s" % (method, path))


@test
def test_health():
    r = R.get("/health")
    eq(r.status, 200, "GET /health with healthy workers (%s)" % short(r.body))


@test
def test_metrics_names():
    reset()
    before = R.metric("radix_router_requests_total", status="200")
    for i in range(3):
        eq(R.post("/v1/completions", completion("m %d" % i)).status, 200, "request %d" % i)
    # every answer counts, scrapes of /metrics too: the scrape that read
    # `before` was counted after it rendered, so the next one shows 3 + 1
    after = R.metric("radix_router_requests_total", status="200")
    eq(after - before, 4.0, "radix_router_requests_total{status=\"200\"} growth over 3 requests and 1 scrape")
    text = R.metrics()
    m = parse_metrics(text)
    names = {re.sub(r"\{.*", "", k) for k in m}
    for n in ("radix_router_requests_total", "radix_router_request_duration_seconds_bucket",
              "radix_router_request_duration_seconds_sum", "radix_router_request_duration_seconds_count",
              "radix_router_worker_load", "radix_router_worker_healthy", "radix_router_breaker_state",
              "radix_router_retries_total", "radix_router_route_decisions_total",
              "radix_router_tree_size"):
        expect(n in names, "/metrics lacks %s; it has %s" % (n, sorted(names)))
    for t, n in (("counter", "radix_router_requests_total"), ("histogram", "radix_router_request_duration_seconds"),
                 ("gauge", "radix_router_worker_load"), ("counter", "radix_router_retries_total")):
        expect(re.search(r"^# TYPE %s %s$" % (n, t), text, re.M), "no '# TYPE %s %s' line" % (n, t))
    for w in W:
        eq(R.metric("radix_router_worker_healthy", worker=w.url), 1.0, "worker_healthy{worker=%s}" % w.url)
        eq(R.metric("radix_router_breaker_state", worker=w.url), 0.0, "breaker_state{worker=%s}" % w.url)
        eq(R.metric("radix_router_worker_load", worker=w.url), 0.0, "worker_load{worker=%s} when idle" % w.url)
    expect(R.metric("radix_router_route_decisions_total", decision="plain") >= 3,
           "round_robin decisions are counted as plain")
    # +Inf bucket equals the count
    inf = [v for k, v in m.items() if k.startswith("radix_router_request_duration_seconds_bucket") and 'le="+Inf"' in k]
    expect(inf and inf[0] == m.get("radix_router_request_duration_seconds_count"),
           "the +Inf bucket equals _count")


@test
def test_chunked_request_body():
    """A client that sends its body chunked is proxied like any other."""
    reset()
    body = json.dumps(completion("chunked body")).encode()
    chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    r = raw_http(R.port, head + chunks)
    eq(r.status, 200, "chunked request body (%s)" % short(r.body))
    eq(total_requests(), 1, "requests at the workers")


@test
def test_keepalive_client():
    """Several requests on one client connection."""
    import http.client
    reset()
    c = http.client.HTTPConnection("127.0.0.1", R.port, timeout=10)
    try:
        for i in range(5):
            c.request("POST", "/v1/completions", body=json.dumps(completion("ka %d" % i)),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            eq(r.status, 200, "keep-alive request %d (%s)" % (i, short(data)))
    finally:
        c.close()
    eq(total_requests(), 5, "requests at the workers")


@test
def test_other_policies():
    """random, power_of_two and shortest_queue load and route; with one
    worker busy, shortest_queue sends everything else to the idle one."""
    reset()
    for policy in ("random", "power_of_two", "shortest_queue"):
        r2 = Router(W, policy=policy, name="radix-router-" + policy).start()
        try:
            r2.wait_healthy([w.url for w in W])
            seen = set()
            for i in range(12):
                r = r2.post("/v1/completions", completion("%s %d" % (policy, i)))
                eq(r.status, 200, "%s: request %d (%s)" % (policy, i, short(r.body)))
                seen.add(answered_by(r))
            if policy != "shortest_queue":
                eq(seen, {w.name for w in W}, "%s: workers that answered 12 requests" % policy)
            else:
                busy = in_thread(r2.post, "/v1/completions", completion("hold", fake_delay_ms=1500), timeout=20)
                expect(wait_until(lambda: sum(w.stats()["inflight"] for w in W) == 1, 5, 0.01),
                       "the held request never reached a worker")
                held = [w.name for w in W if w.stats()["inflight"] == 1][0]
                for i in range(4):
                    r = r2.post("/v1/completions", completion("quick %d" % i))
                    expect(answered_by(r) != held, "shortest_queue sent request %d to the busy worker %s"
                           % (i, held))
                eq(busy.result(20).status, 200, "the held request")
        finally:
            r2.close()


if __name__ == "__main__":
    run(setup, timeout=60)
