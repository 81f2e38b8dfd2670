#!/usr/bin/env python3
"""radix-router in front of misbehaving workers (issue 10; test_faults.py
covers retryable statuses, dropped connections, a killed worker, health
and breaker transitions):

- a worker whose API answers are garbage -- not HTTP at all, a truncated
  body, a status line with a bad code -- while its /health says 200: no
  client request fails (each is retried on a good worker), the garbage
  counts as a failure and opens the worker's breaker;
- a worker that answers 200 with a body that is not JSON: the router passes
  it through untouched (it is the worker's answer) and keeps serving;
- a worker that hangs (API and /health) beside good ones: requests already
  sent to it end with 504 after request_timeout (reported, not lost), the
  health checks mark it unhealthy, and from then on every request is served
  by the others;
- the admin key: adding and removing workers needs [server] admin_api_key
  (the API key alone gets 403), the API endpoints take either key.

Two fake workers plus one garbage worker (a Python socket server), round
robin."""

import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routertest import Router, completion, fake_workers, quote_url, run  # noqa: E402
from rxtest import diag, eq, expect, expect_error, short, test, wait_until  # noqa: E402

R = None
W = []
G = None
BREAKER_FAILURES = 3
TIMEOUT = 2.0
KEY, ADMIN = "api-k3y", "adm1n-k3y"
AUTH = {"Authorization": "Bearer " + KEY}
ADMIN_AUTH = {"Authorization": "Bearer " + ADMIN}


class GarbageWorker:
    """GET /health: a proper 200.  Anything else: what `mode` says --
    "junk" (bytes that are not HTTP), "truncated" (a 200 whose body stops
    short of its Content-Length), "badstatus" (a status line "HTTP/1.1 2x0"),
    "notjson" (a well-formed 200 application/json whose body is not JSON)."""

    def __init__(self):
        self.mode = "junk"
        self.api = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        try:
            c.settimeout(5)
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            head = buf.split(b"\r\n", 1)[0]
            if head.startswith(b"GET /health"):
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                          b"Connection: close\r\n\r\n{}")
                return
            self.api += 1
            if self.mode == "junk":
                c.sendall(b"\x00\x17garbage, not HTTP \xff\xfe\r\n\r\n")
            elif self.mode == "truncated":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                          b'{"id":"cut')
            elif self.mode == "badstatus":
                c.sendall(b"HTTP/1.1 2x0 Whatever\r\nContent-Length: 2\r\n\r\n{}")
            else:
                body = b"<html>this is not JSON</html>"
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                          b"Connection: close\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        finally:
            c.close()


def setup():
    global R, W, G
    W = fake_workers(2, prefix="b")
    G = GarbageWorker()
    R = Router(W + [G.url], policy="round_robin", sections={
        "server": {"api_key": KEY, "admin_api_key": ADMIN, "request_timeout": "%gs" % TIMEOUT},
        "router": {"failure_threshold": 2, "success_threshold": 1, "breaker_failures": BREAKER_FAILURES,
                   "breaker_timeout": "60s", "max_attempts": 3, "health_check_interval": "100ms",
                   "health_check_timeout": "300ms", "retry_backoff": "5ms"}}).start()
    R.wait_healthy()


def post(prompt, **kw):
    return R.post("/v1/completions", completion(prompt, **kw), headers=AUTH, timeout=20)


def workers():
    j = R.ok_json("GET", "/workers", headers=AUTH)
    return {w["url"]: w for w in j["workers"]}


def fresh_garbage(mode):
    """A garbage worker in mode, healthy with a closed breaker: re-added."""
    G.mode = mode
    if G.url in workers():
        eq(R.request("DELETE", "/workers/" + quote_url(G.url), headers=ADMIN_AUTH).status, 200, "remove G")
    r = R.post("/workers", {"url": G.url}, headers=ADMIN_AUTH, timeout=10)
    expect(r.status in (200, 201), "re-adding the garbage worker: HTTP %d %s" % (r.status, short(r.body)))
    expect(wait_until(lambda: workers()[G.url]["healthy"] is True and workers()[G.url]["breaker"] == "closed", 5),
           "garbage worker not healthy: %s" % short(workers().get(G.url)))


def garbage_case(mode):
    fresh_garbage(mode)
    a0 = G.api
    statuses = []
    for i in range(12):
        r = post("%s %d" % (mode, i))
        statuses.append(r.status)
        expect(r.status == 200, "request %d with a %s worker in the pool: HTTP %d %s"
               % (i, mode, r.status, short(r.body)))
        expect(r.json().get("worker") in ("b0", "b1"), "answered by %s" % short(r.body))
    hit = G.api - a0
    diag("%s: 12 requests all 200; the garbage worker got %d of them; breaker %s"
         % (mode, hit, workers()[G.url]["breaker"]))
    expect(hit >= 1, "no request reached the %s worker" % mode)
    expect(hit <= BREAKER_FAILURES, "the %s worker got %d requests: its breaker (breaker_failures %d) did "
           "not open" % (mode, hit, BREAKER_FAILURES))
    if hit == BREAKER_FAILURES:
        eq(workers()[G.url]["breaker"], "open", "breaker of the %s worker after %d failures" % (mode, hit))


@test
def test_garbage_not_http():
    garbage_case("junk")


@test
def test_garbage_truncated_body():
    garbage_case("truncated")


@test
def test_garbage_bad_status_line():
    garbage_case("badstatus")


@test
def test_not_json_passed_through():
    fresh_garbage("notjson")
    seen = 0
    for i in range(9):
        r = post("nj %d" % i)
        eq(r.status, 200, "request %d" % i)
        if b"not JSON" in r.body:
            seen += 1
    expect(seen >= 1, "no answer came from the non-JSON worker")
    diag("%d of 9 answers were the worker's non-JSON body, passed through" % seen)
    eq(R.get("/health").status, 200, "router /health")
    G.mode = "junk"


@test
def test_hung_worker_beside_good_ones():
    fresh_garbage("junk")
    eq(R.request("DELETE", "/workers/" + quote_url(G.url), headers=ADMIN_AUTH).status, 200, "remove G")
    h = W[1]
    h.control(hang=True, hang_health=True)
    try:
        t0 = time.monotonic()
        res = []
        lock = threading.Lock()

        def one(i):
            t = time.monotonic()
            try:
                r = post("hang %d" % i)
                rec = (r.status, time.monotonic() - t)
            except OSError as e:
                rec = (repr(e), time.monotonic() - t)
            with lock:
                res.append(rec)
        ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(TIMEOUT + 10)
        diag("6 requests while %s hangs: %s" % (h.name, [(s, round(d, 2)) for s, d in res]))
        for st, dt in res:
            expect(st in (200, 504), "a request while a worker hangs: %s after %.1f s (want 200, or 504 after "
                   "request_timeout)" % (st, dt))
            if st == 504:
                expect(dt >= TIMEOUT * 0.8, "504 after %.2f s, before request_timeout %g s" % (dt, TIMEOUT))
        expect(any(st == 200 for st, _ in res), "no request was served by the good worker")
        expect(wait_until(lambda: workers()[h.url]["healthy"] is False, 5, 0.05),
               "the hung worker is still healthy %.1f s after it hung: %s"
               % (time.monotonic() - t0, short(workers()[h.url])))
        for i in range(8):
            r = post("after %d" % i)
            eq(r.status, 200, "request %d once the hung worker is unhealthy" % i)
            eq(r.json().get("worker"), "b0", "request %d served by" % i)
    finally:
        h.control(hang=False, hang_health=False)
    expect(wait_until(lambda: workers()[h.url]["healthy"] is True, 5, 0.05), "the worker did not come back")


@test
def test_admin_key_for_worker_changes():
    url = "http://127.0.0.1:9"
    body = {"url": url}
    # R.request sends the API key unless the test overrides Authorization
    for hdrs, want in (({"Authorization": ""}, 401), ({"Authorization": "Bearer nope"}, 401), (AUTH, 403)):
        r = R.post("/workers", body, headers=hdrs, timeout=10)
        expect_error(r, want, what="POST /workers with %s" % hdrs)
        r = R.post("/add_worker?url=" + quote_url(url), headers=hdrs, timeout=10)
        expect_error(r, want, what="POST /add_worker with %s" % hdrs)
        r = R.request("DELETE", "/workers/" + quote_url(W[0].url), headers=hdrs, timeout=10)
        expect_error(r, want, what="DELETE /workers/... with %s" % hdrs)
        r = R.post("/remove_worker?url=" + quote_url(W[0].url), headers=hdrs, timeout=10)
        expect_error(r, want, what="POST /remove_worker with %s" % hdrs)
    r = R.post("/workers", body, headers=AUTH, timeout=10)
    expect("admin_api_key" in r.json()["error"]["message"], "403 message: %s" % short(r.body))
    eq(len(workers()), 2, "workers after refused changes")
    # reads take the API key or the admin key
    eq(R.get("/workers", headers=AUTH).status, 200, "GET /workers with the API key")
    eq(R.get("/workers", headers=ADMIN_AUTH).status, 200, "GET /workers with the admin key")
    eq(R.post("/v1/completions", completion("adm"), headers=ADMIN_AUTH).status, 200, "a completion, admin key")
    expect_error(R.post("/v1/completions", completion("no"), headers={"Authorization": ""}, timeout=10), 401,
                 what="a completion without a key")
    eq(R.get("/health").status, 200, "/health without a key")


if __name__ == "__main__":
    run(setup, timeout=150)
