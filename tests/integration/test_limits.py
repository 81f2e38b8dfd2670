#!/usr/bin/env python3
"""radixd's guards: the API key (401 without or with a wrong Bearer token,
/health exempt), the body limit (413), CORS only for the configured
origins (with preflight), and a full queue answered 503 with Retry-After
(max_running_requests = 1, max_queued_requests = 1).  One daemon on the
"slow" model so that concurrent requests overlap."""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import (Daemon, Fail, diag, eq, expect, expect_error, in_thread, raw_http, run,  # noqa: E402
                    short, test, wait_until)

D = None
KEY = "sk-itest-0123456789"
AUTH = {"Authorization": "Bearer " + KEY}
ORIGIN = "https://app.example"
LIMIT = 64 * 1024


def setup():
    global D
    D = Daemon("slow", sections={
        "server": {"api_key": KEY, "max_body_size": "64KiB",
                   "cors_allow_origins": ORIGIN + ",https://other.example"},
        "scheduler": {"max_running_requests": 1, "max_queued_requests": 1},
    }).start().wait_healthy()


def small():
    return {"prompt": "hello", "max_tokens": 2, "ignore_eos": True}


# ---- API key -----------------------------------------------------------------


@test
def test_api_key_required():
    for hdrs, what in (({}, "no Authorization"),
                       ({"Authorization": "Bearer wrong"}, "a wrong key"),
                       ({"Authorization": "Bearer " + KEY[:-1]}, "a prefix of the key"),
                       ({"Authorization": "Bearer " + KEY + "x"}, "the key plus one character"),
                       ({"Authorization": KEY}, "the key without Bearer"),
                       ({"Authorization": "Basic " + KEY}, "Basic scheme"),
                       ({"Authorization": "Bearer "}, "an empty Bearer token")):
        r = D.post("/v1/completions", small(), headers=hdrs)
        expect_error(r, 401, what="POST /v1/completions with %s" % what)
        r = D.get("/v1/models", headers=hdrs)
        expect_error(r, 401, what="GET /v1/models with %s" % what)
    for path in ("/v1/chat/completions", "/generate", "/tokenize", "/flush_cache", "/abort_request"):
        r = D.post(path, {"prompt": "x"})
        expect_error(r, 401, what="POST %s without a key" % path)


@test
def test_api_key_accepted():
    j = D.ok_json("POST", "/v1/completions", small(), headers=AUTH)
    eq(j["usage"]["completion_tokens"], 2, "completion with the key")
    eq(D.ok_json("GET", "/v1/models", headers=AUTH)["data"][0]["id"], "itest-model", "models with the key")


@test
def test_health_exempt():
    r = D.get("/health")
    eq(r.status, 200, "GET /health without a key (%s)" % short(r.body))


@test
def test_auth_checked_before_parsing():
    # A request without the key learns nothing about the API: 401, not 400.
    r = D.post("/v1/completions", b"{not json", headers={"Content-Type": "application/json"})
    expect_error(r, 401, what="malformed body without a key")


# ---- body limit ----------------------------------------------------------------


def padded(total):
    """A valid small completion request padded with JSON whitespace to
    total bytes."""
    b = json.dumps(small()).encode()
    return b[:-1] + b" " * (total - len(b)) + b"}"


@test
def test_body_limit_413():
    body = padded(LIMIT + 8 * 1024)
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY, len(body))).encode()
    r = raw_http(D.port, head + body)
    expect_error(r, 413, what="a %d-byte body over max_body_size %d" % (len(body), LIMIT))
    # just under the limit is served (the padding is whitespace)
    body = padded(LIMIT - 1024)
    r = D.post("/v1/completions", body, headers=dict(AUTH, **{"Content-Type": "application/json"}))
    eq(r.status, 200, "a %d-byte body under the limit (%s)" % (len(body), short(r.body)))
    D.check_alive()


@test
def test_body_limit_chunked_413():
    body = padded(LIMIT * 2)
    chunks = b""
    for i in range(0, len(body), 8192):
        part = body[i:i + 8192]
        chunks += b"%x\r\n" % len(part) + part + b"\r\n"
    chunks += b"0\r\n\r\n"
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" % KEY).encode()
    r = raw_http(D.port, head + chunks)
    expect_error(r, 413, what="a chunked %d-byte body" % len(body))
    eq(D.get("/health").status, 200, "GET /health after 413s")


# ---- CORS ------------------------------------------------------------------------


@test
def test_cors_allowed_origin():
    r = D.get("/v1/models", headers=dict(AUTH, Origin=ORIGIN))
    eq(r.status, 200, "GET /v1/models from an allowed origin")
    eq(r.header("Access-Control-Allow-Origin"), ORIGIN, "Access-Control-Allow-Origin")
    r = D.post("/v1/completions", small(), headers=dict(AUTH, Origin="https://other.example"))
    eq(r.status, 200, "POST from the second allowed origin")
    eq(r.header("Access-Control-Allow-Origin"), "https://other.example",
       "Access-Control-Allow-Origin for the second origin")


@test
def test_cors_other_origin():
    r = D.get("/v1/models", headers=dict(AUTH, Origin="https://evil.example"))
    acao = r.header("Access-Control-Allow-Origin")
    expect(acao is None, "Access-Control-Allow-Origin %r for an origin not in the list" % acao)


@test
def test_cors_preflight():
    # Browsers send the preflight without credentials: it must not need the key.
    r = D.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    expect(r.status in (200, 204), "OPTIONS preflight: HTTP %d %s" % (r.status, short(r.body)))
    eq(r.header("Access-Control-Allow-Origin"), ORIGIN, "preflight Access-Control-Allow-Origin")
    methods = (r.header("Access-Control-Allow-Methods") or "").upper()
    expect("POST" in methods or methods == "*", "Access-Control-Allow-Methods %r lacks POST" % methods)
    allowed = (r.header("Access-Control-Allow-Headers") or "").lower()
    for h in ("authorization", "content-type"):
        expect(h in allowed or allowed == "*", "Access-Control-Allow-Headers %r lacks %s" % (allowed, h))
    r = D.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    expect(r.header("Access-Control-Allow-Origin") is None,
           "preflight from a foreign origin allowed: %r" % r.header("Access-Control-Allow-Origin"))


# ---- a full queue ------------------------------------------------------------------


@test
def test_full_queue_503():
    # One request running (max_running_requests = 1), then five at once:
    # exactly one may wait (max_queued_requests = 1), four are refused.
    first = in_thread(D.post, "/v1/completions", {"prompt": "the running one", "max_tokens": 300,
                                                  "ignore_eos": True}, headers=AUTH, timeout=90)
    expect(wait_until(lambda: D.running_count() == 1, 10), "the first request never ran (running = %s)"
           % D.running_count())
    n = 5
    results = [None] * n
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        t0 = time.monotonic()
        try:
            r = D.post("/v1/completions", {"prompt": "request %d" % i, "max_tokens": 20,
                                           "ignore_eos": True}, headers=AUTH, timeout=90)
            results[i] = (r, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - recorded and reported below
            results[i] = (e, time.monotonic() - t0)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    statuses = []
    for i, (r, dt) in enumerate(results):
        if isinstance(r, Exception):
            raise Fail("request %d failed at the transport level after %.1f s: %r" % (i, dt, r))
        statuses.append(r.status)
        diag("request %d: HTTP %d after %.1f s" % (i, r.status, dt))
        if r.status == 503:
            e = expect_error(r, 503, what="request %d" % i)
            ra = r.header("Retry-After")
            expect(ra is not None and ra.strip().isdigit(),
                   "503 without an integer Retry-After header (%r): %s" % (ra, short(e)))
            expect(dt < 2, "the 503 took %.1f s: a full queue should refuse at once" % dt)
        elif r.status == 200:
            eq(r.json()["usage"]["completion_tokens"], 20, "request %d completion_tokens" % i)
        else:
            raise Fail("request %d: HTTP %d %s (want 200 or 503)" % (i, r.status, short(r.body)))
    r = first.result(timeout=90)
    eq(r.status, 200, "the running request (%s)" % short(r.body))
    eq(sorted(statuses), [200] + [503] * 4,
       "statuses of 5 concurrent requests with one running and room for one waiting")
    # and afterwards the server serves again
    j = D.ok_json("POST", "/v1/completions", small(), headers=AUTH)
    eq(j["usage"]["completion_tokens"], 2, "a request after the queue drained")


if __name__ == "__main__":
    run(setup, timeout=150)
