#!/usr/bin/env python3
"""Workers at run time: a router started with no worker answers 503, then
workers are added (POST /workers, legacy POST /add_worker?url=), listed
(GET /workers with state, load, tree size and breaker; legacy GET
/list_workers), refused when present (409) or malformed (400), and removed
(DELETE /workers/{url}, legacy POST /remove_worker?url=; 404 when unknown).
A removed worker gets no new traffic, while a stream in flight on it
finishes.  Fake workers, round_robin."""

import os
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routertest import (Router, answered_by, completion, fake_workers, quote_url, run)  # noqa: E402
from rxtest import (eq, expect, expect_error, in_thread, short, test, wait_until)  # noqa: E402

R = None
A = B = None


def setup():
    global R, A, B
    A, B = fake_workers(2, prefix="dyn")
    R = Router([], policy="round_robin").start()


@test
def test_no_workers():
    eq(R.ok_json("GET", "/workers").get("workers"), [], "GET /workers \"workers\" with none")
    eq(R.ok_json("GET", "/list_workers").get("urls"), [], "GET /list_workers \"urls\" with none")
    r = R.get("/health")
    eq(r.status, 503, "GET /health without workers (%s)" % short(r.body))
    expect_error(R.post("/v1/completions", completion()), 503, what="completion without workers")
    expect_error(R.get("/v1/models"), 503, what="GET /v1/models without workers")


@test
def test_add_worker():
    j = R.ok_json("POST", "/workers", {"url": A.url}, status=201)
    expect(isinstance(j, dict), "POST /workers answers a JSON object: %s" % short(j))
    ws = R.workers()
    expect(A.url in ws, "GET /workers lists %s: %s" % (A.url, short(ws)))
    w = ws[A.url]
    for k in ("url", "healthy", "load", "tree_size", "breaker", "consecutive_failures"):
        expect(k in w, "GET /workers entry lacks %r: %s" % (k, short(w)))
    eq(w["load"], 0, "load of an idle worker")
    eq(w["breaker"], "closed", "breaker of a new worker")
    R.wait_healthy([A.url])
    eq(R.get("/health").status, 200, "GET /health with one healthy worker")
    for i in range(3):
        r = R.post("/v1/completions", completion("to A %d" % i))
        eq(r.status, 200, "request %d (%s)" % (i, short(r.body)))
        eq(answered_by(r), A.name, "worker that answered")


@test
def test_add_present_409():
    before = len(R.workers())
    for url in (A.url, A.url + "/"):
        r = R.post("/workers", {"url": url})
        expect_error(r, 409, what="POST /workers with %s already present" % url)
    eq(len(R.workers()), before, "workers after the refused adds")


@test
def test_add_bad_url_400():
    for body in ({"url": "ftp://127.0.0.1:1"}, {"url": "not a url"}, {"url": ""}, {"url": 5},
                 {"url": "http://127.0.0.1:99999"}, {"url": "http://127.0.0.1:8000/v1/path"},
                 {"nourl": "http://127.0.0.1:1"}, "{not json", [1]):
        r = R.post("/workers", body, headers={"Content-Type": "application/json"})
        expect_error(r, 400, what="POST /workers %s" % short(body))
    eq(list(R.workers()), [A.url], "workers after the refused adds")


@test
def test_legacy_add_list_remove():
    r = R.post("/add_worker?url=" + urllib.parse.quote(B.url, safe=""))
    expect(r.status in (200, 201), "POST /add_worker?url=: HTTP %d %s" % (r.status, short(r.body)))
    urls = R.ok_json("GET", "/list_workers")["urls"]
    eq(sorted(urls), sorted([A.url, B.url]), "GET /list_workers")
    R.wait_healthy([A.url, B.url])
    seen = set()
    for i in range(6):
        r = R.post("/v1/completions", completion("both %d" % i))
        eq(r.status, 200, "request %d" % i)
        seen.add(answered_by(r))
    eq(seen, {A.name, B.name}, "workers that answered with both in the pool")
    expect_error(R.post("/add_worker?url=" + urllib.parse.quote(B.url, safe="")), 409,
                 what="legacy add of a present worker")
    expect_error(R.post("/add_worker"), 400, what="legacy add without url")
    r = R.post("/remove_worker?url=" + urllib.parse.quote(B.url, safe=""))
    eq(r.status, 200, "POST /remove_worker?url= (%s)" % short(r.body))
    eq(R.ok_json("GET", "/list_workers")["urls"], [A.url], "GET /list_workers after the removal")
    expect_error(R.post("/remove_worker?url=" + urllib.parse.quote(B.url, safe="")), 404,
                 what="legacy remove of an absent worker")
    b0 = B.requests()
    for i in range(4):
        r = R.post("/v1/completions", completion("after %d" % i))
        eq(answered_by(r), A.name, "request %d after B was removed" % i)
    eq(B.requests(), b0, "requests B got after its removal")


@test
def test_delete_worker():
    R.ok_json("POST", "/workers", {"url": B.url}, status=201)
    R.wait_healthy([A.url, B.url])
    r = R.request("DELETE", "/workers/" + quote_url(B.url))
    eq(r.status, 200, "DELETE /workers/{B} (%s)" % short(r.body))
    expect(B.url not in R.workers(), "B still listed after DELETE")
    expect_error(R.request("DELETE", "/workers/" + quote_url(B.url)), 404, what="second DELETE of B")
    expect_error(R.request("DELETE", "/workers/" + quote_url("http://127.0.0.1:1")), 404,
                 what="DELETE of a never-added worker")


@test
def test_remove_with_stream_in_flight():
    """A stream in flight on a worker that is removed finishes; no new
    request goes to it."""
    A.reset()
    body = completion("long stream", max_tokens=8, stream=True, fake_interval_ms=150)
    h = in_thread(R.stream, "/v1/completions", body)
    expect(wait_until(lambda: A.stats()["inflight"] == 1, 5, 0.02), "the stream never reached A")
    r = R.request("DELETE", "/workers/" + quote_url(A.url))
    eq(r.status, 200, "DELETE /workers/{A} during a stream (%s)" % short(r.body))
    _, chunks = h.result(30)
    eq(len(chunks), 8, "chunks of the stream that was in flight on the removed worker")
    eq({c["worker"] for c in chunks}, {A.name}, "worker of the chunks")
    expect_error(R.post("/v1/completions", completion("nobody left")), 503, what="request with no workers")
    eq(A.requests(), 1, "requests A got (only the stream)")
    eq(R.get("/health").status, 503, "GET /health with no workers")


@test
def test_worker_down_at_add_becomes_healthy_later():
    """A worker added while down is listed as unhealthy and gets traffic
    once it answers its health checks."""
    A.kill()
    r = R.post("/workers", {"url": A.url})
    eq(r.status, 201, "POST /workers for a worker that is down (%s)" % short(r.body))
    time.sleep(0.5)
    eq(R.workers()[A.url]["healthy"], False, "healthy of a worker that is down")
    expect_error(R.post("/v1/completions", completion("x")), 503, what="request with only a down worker")
    A.restart()
    R.wait_healthy([A.url], timeout=10)
    r = R.post("/v1/completions", completion("A is back"))
    eq(r.status, 200, "request once A is up (%s)" % short(r.body))
    eq(answered_by(r), A.name, "worker")
    R.check_alive()


if __name__ == "__main__":
    run(setup, timeout=60)
