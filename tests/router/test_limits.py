#!/usr/bin/env python3
"""radix-router's guards: the API key (401 without or with a wrong Bearer
token on every endpoint but /health, before any worker is touched), the
body limit (413, Content-Length and chunked), a full queue (429 with
max_concurrent_requests = 1 and max_queued_requests = 1), the request
timeout (504, and the worker's connection is closed), and a client that
goes away mid-stream (the worker's connection is closed too).  Two fake
workers, round_robin."""

import http.client
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routertest import (Router, completion, fake_workers, quote_url, run)  # noqa: E402
from rxtest import (eq, expect, expect_error, http_request, in_thread, raw_http, short,  # noqa: E402
                    test, wait_until)

R = None
W = []
KEY = "sk-router-0123456789"
AUTH = {"Authorization": "Bearer " + KEY}
LIMIT = 64 * 1024
TIMEOUT = 2.0


def setup():
    global R, W
    W = fake_workers(2, prefix="l")
    R = Router(W, policy="round_robin", sections={
        "server": {"api_key": KEY, "max_body_size": "64KiB", "request_timeout": "%gs" % TIMEOUT},
        "router": {"max_concurrent_requests": 1, "max_queued_requests": 1}}).start()
    R.wait_healthy([w.url for w in W])


def fresh():
    for w in W:
        w.reset()


def total():
    return sum(w.requests() for w in W)


def inflight():
    return sum(w.stats()["inflight"] for w in W)


# ---- API key --------------------------------------------------------------------


@test
def test_api_key_required():
    fresh()
    for hdrs, what in (({}, "no Authorization"), ({"Authorization": "Bearer wrong"}, "a wrong key"),
                       ({"Authorization": "Bearer " + KEY[:-1]}, "a prefix of the key"),
                       ({"Authorization": "Bearer " + KEY + "x"}, "the key plus one character"),
                       ({"Authorization": KEY}, "the key without Bearer"),
                       ({"Authorization": "Bearer "}, "an empty token")):
        for method, path, body in (("POST", "/v1/completions", completion()),
                                   ("POST", "/v1/chat/completions", {"messages": []}),
                                   ("POST", "/generate", {"text": "x"}),
                                   ("GET", "/v1/models", None), ("GET", "/metrics", None),
                                   ("GET", "/workers", None), ("GET", "/list_workers", None),
                                   ("POST", "/workers", {"url": "http://127.0.0.1:1"}),
                                   ("DELETE", "/workers/" + quote_url(W[0].url), None),
                                   ("POST", "/add_worker?url=http%3A%2F%2F127.0.0.1%3A1", None),
                                   ("POST", "/remove_worker?url=" + quote_url(W[0].url), None)):
            r = http_request(R.port, method, path, body, hdrs)
            expect_error(r, 401, what="%s %s with %s" % (method, path, what))
    # malformed body without a key: still 401, not 400
    r = http_request(R.port, "POST", "/v1/completions", b"{bad", {"Content-Type": "application/json"})
    expect_error(r, 401, what="bad JSON without a key")
    eq(total(), 0, "requests that reached a worker")
    eq(sorted(R.workers()), sorted(w.url for w in W), "workers after refused admin calls")


@test
def test_api_key_accepted_health_exempt():
    fresh()
    r = http_request(R.port, "POST", "/v1/completions", completion(), AUTH)
    eq(r.status, 200, "completion with the key (%s)" % short(r.body))
    r = http_request(R.port, "GET", "/health", None, {})
    eq(r.status, 200, "GET /health without a key")
    eq(total(), 1, "requests at the workers")


# ---- body limit ------------------------------------------------------------------


def padded(total_len):
    b = json.dumps(completion("pad")).encode()
    return b[:-1] + b" " * (total_len - len(b)) + b"}"


@test
def test_body_limit_413():
    fresh()
    body = padded(LIMIT + 8 * 1024)
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY, len(body))).encode()
    expect_error(raw_http(R.port, head + body), 413, what="a %d-byte body over %d" % (len(body), LIMIT))
    chunks = b""
    big = padded(LIMIT * 2)
    for i in range(0, len(big), 8192):
        part = big[i:i + 8192]
        chunks += b"%x\r\n" % len(part) + part + b"\r\n"
    chunks += b"0\r\n\r\n"
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" % KEY).encode()
    expect_error(raw_http(R.port, head + chunks), 413, what="a chunked %d-byte body" % len(big))
    eq(total(), 0, "requests that reached a worker")
    body = padded(LIMIT - 1024)
    r = R.post("/v1/completions", body, headers={"Content-Type": "application/json"})
    eq(r.status, 200, "a %d-byte body under the limit (%s)" % (len(body), short(r.body)))
    got = [json.loads(w.stats()["last_body"] or "null") for w in W if w.requests()]
    eq(got, [json.loads(body)], "the body under the limit reached a worker intact")
    R.check_alive()


# ---- queue -------------------------------------------------------------------------


@test
def test_queue_full_429():
    fresh()
    for w in W:
        w.control(delay_ms=600)             # two in a row fit in request_timeout
    first = in_thread(R.post, "/v1/completions", completion("first"), timeout=20)
    expect(wait_until(lambda: inflight() == 1, 5, 0.02), "the first request never reached a worker")
    second = in_thread(R.post, "/v1/completions", completion("second"), timeout=20)
    time.sleep(0.2)                     # the second is queued now
    eq(inflight(), 1, "requests at the workers with max_concurrent_requests = 1")
    t = time.monotonic()
    r = R.post("/v1/completions", completion("third"), timeout=20)
    expect_error(r, 429, what="a request over max_concurrent_requests + max_queued_requests")
    expect(time.monotonic() - t < 1.0, "the 429 took %.2f s: it must not wait" % (time.monotonic() - t))
    eq(first.result(20).status, 200, "the first request")
    eq(second.result(20).status, 200, "the queued request")
    eq(total(), 2, "requests at the workers")
    for w in W:
        w.control(delay_ms=0)
    eq(R.post("/v1/completions", completion("after")).status, 200, "a request once the queue drained")


# ---- timeouts and clients that leave --------------------------------------------------------


@test
def test_request_timeout_504():
    fresh()
    for w in W:
        w.control(hang=True)
    t = time.monotonic()
    r = R.post("/v1/completions", completion("hang"), timeout=20)
    took = time.monotonic() - t
    expect_error(r, 504, what="a request to a worker that never answers")
    expect(TIMEOUT * 0.8 <= took <= TIMEOUT + 2.0,
           "the 504 came after %.2f s, request_timeout is %g s" % (took, TIMEOUT))
    expect(wait_until(lambda: inflight() == 0, 3, 0.05),
           "the router left its connection to the hung worker open (worker inflight %d)" % inflight())
    for w in W:
        w.control(hang=False)
    eq(R.post("/v1/completions", completion("after")).status, 200, "a request after the timeout")


@test
def test_client_gone_mid_stream_closes_upstream():
    fresh()
    body = json.dumps(completion("leave", max_tokens=100, stream=True, fake_interval_ms=100)).encode()
    s = socket.create_connection(("127.0.0.1", R.port), timeout=10)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY, len(body))).encode() + body)
    got = s.recv(4096)
    expect(b" 200 " in got.split(b"\r\n")[0], "stream answer: %r" % got[:200])
    expect(inflight() == 1, "the stream is at a worker")
    s.close()
    expect(wait_until(lambda: inflight() == 0, 3, 0.05),
           "a client that left mid-stream: the worker still streams (inflight %d)" % inflight())
    R.check_alive()


@test
def test_client_gone_while_waiting_closes_upstream():
    fresh()
    for w in W:
        w.control(delay_ms=3000)
    c = http.client.HTTPConnection("127.0.0.1", R.port, timeout=0.5)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(completion("leave early")),
                  headers=dict(AUTH, **{"Content-Type": "application/json"}))
        c.getresponse()
    except OSError:
        pass
    finally:
        c.close()
    expect(wait_until(lambda: inflight() == 0, 2.4, 0.05),
           "a client that left before the answer: the worker's request is still open (inflight %d)" % inflight())
    for w in W:
        w.control(delay_ms=0)


if __name__ == "__main__":
    run(setup, timeout=60)
