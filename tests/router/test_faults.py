#!/usr/bin/env python3
"""radix-router under worker faults: a retryable status (408, 429, 500,
502, 503, 504) or a dropped connection before the first byte is retried
on another worker; max_attempts bounds the tries; a worker killed under
load fails no request that had not started streaming, and comes back when
it answers its health checks again; health checks mark a worker unhealthy
after failure_threshold failures (also timeouts) and healthy after
success_threshold passes; the circuit breaker opens after breaker_failures
failed requests, turns half-open after breaker_timeout (one trial at a
time) and closes after breaker_successes; a worker that dies mid-stream
ends the stream with an SSE error event and [DONE].  Three fake workers,
round_robin, plus one URL where nothing listens."""

import http.client
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routertest import (Router, answered_by, completion, fake_workers, run)  # noqa: E402
from rxtest import (Fail, diag, eq, expect, expect_error, free_port, in_thread, short,  # noqa: E402
                    test, wait_until)

R = None
W = []
DEAD = None
FAILURE_THRESHOLD = 2
SUCCESS_THRESHOLD = 2
BREAKER_FAILURES = 3
BREAKER_TIMEOUT = 1.0
BREAKER_SUCCESSES = 2
MAX_ATTEMPTS = 3


def setup():
    global R, W, DEAD
    W = fake_workers(3, prefix="f")
    DEAD = "http://127.0.0.1:%d" % free_port()
    R = Router(W + [DEAD], policy="round_robin", sections={"router": {
        "failure_threshold": FAILURE_THRESHOLD, "success_threshold": SUCCESS_THRESHOLD,
        "breaker_failures": BREAKER_FAILURES, "breaker_timeout": "%gs" % BREAKER_TIMEOUT,
        "breaker_successes": BREAKER_SUCCESSES, "max_attempts": MAX_ATTEMPTS,
        "health_check_interval": "100ms", "health_check_timeout": "300ms",
        "retry_backoff": "10ms"}}).start()
    R.wait_healthy([w.url for w in W])


def fresh():
    """Every fake worker healthy, answering at once, counters zeroed, and
    the router seeing them healthy with closed breakers (a half-open
    breaker closes only after successful trial requests: send some)."""
    for w in W:
        if not w.alive():
            w.restart()
        w.reset()
    urls = [w.url for w in W]
    expect(wait_until(lambda: all(R.workers()[u]["healthy"] is True for u in urls), 15, 0.05),
           "workers not all healthy: %s" % short(R.workers(), 1200))
    for i in range(40):
        if all(R.workers()[u]["breaker"] == "closed" for u in urls):
            break
        R.post("/v1/completions", completion("closing breakers"))
    R.wait_healthy(urls, timeout=1)
    for w in W:
        w.reset()


def ok(body=None, what="request"):
    r = R.post("/v1/completions", body or completion("x"))
    if r.status != 200:
        raise Fail("%s: HTTP %d %s" % (what, r.status, short(r.body)))
    return r


def stream_events(body, timeout=30):
    """POST a stream and collect what arrives, tolerating failures:
    (status, [event payloads], error or None)."""
    c = http.client.HTTPConnection("127.0.0.1", R.port, timeout=timeout)
    events = []
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return r.status, [r.read().decode("utf-8", "replace")], None
        buf = []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode("utf-8").rstrip("\r\n")
            if line == "":
                if buf:
                    events.append("\n".join(buf))
                    buf = []
            elif line.startswith("data:"):
                buf.append(line[5:].strip())
        return 200, events, None
    except (OSError, http.client.HTTPException) as e:
        return None, events, "%s: %s" % (type(e).__name__, e)
    finally:
        c.close()


def breaker(w):
    return R.workers()[w.url]["breaker"]


# ---- retries ---------------------------------------------------------------------


@test
def test_retry_on_retryable_status():
    fresh()
    x = W[0]
    for status in (408, 429, 500, 502, 503, 504):
        r0 = R.metric("radix_router_retries_total")
        inj = x.stats()["injected_failures"]
        x.control(fail_status=status, fail_count=1)
        for i in range(8):
            ok(what="request while %s answers %d once" % (x.name, status))
            if x.stats()["injected_failures"] > inj:
                break
        eq(x.stats()["injected_failures"], inj + 1, "%s answered %d once" % (x.name, status))
        expect(R.metric("radix_router_retries_total") >= r0 + 1,
               "radix_router_retries_total did not grow after a %d" % status)
        # a success on x between failures, so its breaker never opens here
        done = x.stats()["completed"]
        expect(wait_until(lambda: (ok(), x.stats()["completed"] > done)[1], 5, 0),
               "%s answered no request after its %d" % (x.name, status))


@test
def test_retry_on_dropped_connection():
    fresh()
    x = W[0]
    x.control(fail_status=0, fail_count=1)     # close the connection without answering, once
    for i in range(6):
        ok(what="request %d with a connection dropped" % i)
    eq(x.stats()["injected_failures"], 1, "connections dropped")
    r = R.metric("radix_router_retries_total")
    x.control(fail_status=0, fail_count=1)
    for i in range(6):
        ok(what="request %d with a connection dropped" % i)
    expect(R.metric("radix_router_retries_total") >= r + 1, "radix_router_retries_total did not grow")


@test
def test_max_attempts_bounds_tries():
    fresh()
    for w in W:
        w.control(fail_status=503, fail_count=1)
    r = R.post("/v1/completions", completion("doomed"))
    expect(r.status in (502, 503), "after %d failed attempts: HTTP %d %s (want 502 or 503)"
           % (MAX_ATTEMPTS, r.status, short(r.body)))
    expect_error(r, r.status, what="the error after all attempts failed")
    eq(sum(w.stats()["injected_failures"] for w in W), MAX_ATTEMPTS, "attempts made (max_attempts)")
    ok(what="the next request")


# ---- health checks ---------------------------------------------------------------


def _watch_health(w, want, timeout=5):
    """Poll GET /workers until w's healthy flag is want; returns the number
    of health checks w answered meanwhile (read right at the flip; checks
    come every 100 ms, so a slow poll may count one or two more)."""
    h0 = w.stats()["health"]
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if R.workers()[w.url]["healthy"] is want:
            return w.stats()["health"] - h0
        time.sleep(0.01)
    raise Fail("%s not healthy=%s within %d s: %s" % (w.name, want, timeout, short(R.workers()[w.url])))


@test
def test_health_transitions():
    fresh()
    y = W[1]
    y.control(health_status=503)
    n = _watch_health(y, False)
    expect(FAILURE_THRESHOLD <= n <= FAILURE_THRESHOLD + 2,
           "marked unhealthy after %d failed checks, failure_threshold is %d" % (n, FAILURE_THRESHOLD))
    eq(R.metric("radix_router_worker_healthy", worker=y.url), 0.0, "worker_healthy gauge of the unhealthy worker")
    eq(R.get("/health").status, 200, "router /health with other workers healthy")
    before = y.requests()
    for i in range(6):
        ok(what="request %d while %s is unhealthy" % (i, y.name))
    eq(y.requests(), before, "requests the unhealthy worker got")
    y.control(health_status=200)
    n = _watch_health(y, True)
    expect(SUCCESS_THRESHOLD <= n <= SUCCESS_THRESHOLD + 2,
           "healthy again after %d passed checks, success_threshold is %d" % (n, SUCCESS_THRESHOLD))
    got = set()
    for i in range(6):
        got.add(answered_by(ok()))
    expect(y.name in got, "%s gets traffic again once healthy (answers from %s)" % (y.name, got))


@test
def test_health_check_timeout():
    fresh()
    y = W[1]
    y.control(hang_health=True)
    _watch_health(y, False)
    y.control(hang_health=False)
    _watch_health(y, True)


@test
def test_dead_worker_at_start():
    ws = R.workers()
    expect(DEAD in ws, "the worker that was down at start is listed: %s" % short(list(ws)))
    eq(ws[DEAD]["healthy"], False, "healthy of a worker nothing listens on")
    eq(R.metric("radix_router_worker_healthy", worker=DEAD), 0.0, "worker_healthy gauge of the dead worker")
    for i in range(6):
        ok(what="request %d with a dead worker in the list" % i)


# ---- circuit breaker ----------------------------------------------------------------


@test
def test_breaker_open_half_open_closed():
    fresh()
    z = W[2]
    z.control(fail_status=500, fail_count=1000000)
    for i in range(30):
        ok(what="request %d while %s fails" % (i, z.name))
        if breaker(z) == "open":
            break
    eq(breaker(z), "open", "breaker of a worker that failed every request")
    eq(z.stats()["injected_failures"], BREAKER_FAILURES, "failed requests before the breaker opened")
    eq(R.metric("radix_router_breaker_state", worker=z.url), 1.0, "breaker_state gauge when open")
    t_open = time.monotonic()
    before = z.requests()
    for i in range(8):
        ok(what="request %d while the breaker is open" % i)
    if time.monotonic() - t_open < BREAKER_TIMEOUT:
        eq(z.requests(), before, "requests an open breaker let through")
    # half-open, still failing: one trial, which opens it again
    time.sleep(BREAKER_TIMEOUT + 0.2)
    before = z.requests()
    for i in range(8):
        ok(what="request %d after breaker_timeout" % i)
        if z.requests() > before:
            break
    eq(z.requests(), before + 1, "trial requests of a half-open breaker")
    eq(breaker(z), "open", "breaker after a failed trial")
    # half-open, healthy but slow: the trial is in flight -> half_open shows
    z.control(fail_count=0, delay_ms=700)
    time.sleep(BREAKER_TIMEOUT + 0.2)
    hs = [in_thread(ok) for _ in range(4)]
    seen = wait_until(lambda: z.stats()["inflight"] == 1 and breaker(z) == "half_open", 3, 0.02)
    expect(seen, "breaker not half_open while a trial is in flight: %s" % short(R.workers()[z.url]))
    eq(R.metric("radix_router_breaker_state", worker=z.url), 2.0, "breaker_state gauge when half-open")
    for h in hs:
        h.result(10)
    eq(z.stats()["inflight"], 0, "requests in flight on the trial worker afterwards")
    z.control(delay_ms=0)
    c0 = z.stats()["completed"] - 1                # the slow trial succeeded
    for i in range(20):
        ok(what="request %d to close the breaker" % i)
        if breaker(z) == "closed":
            break
    eq(breaker(z), "closed", "breaker after successful trials")
    eq(z.stats()["completed"] - c0, BREAKER_SUCCESSES, "successful trials before the breaker closed")
    eq(R.metric("radix_router_breaker_state", worker=z.url), 0.0, "breaker_state gauge when closed")


# ---- streams ------------------------------------------------------------------------


@test
def test_mid_stream_failure_ends_with_error_event():
    fresh()
    for w in W:
        w.control(close_after_chunks=2, chunk_interval_ms=50)
    status, events, err = stream_events(completion("cut me", max_tokens=6, stream=True))
    expect(err is None, "the client saw a broken stream instead of an error event: %s (events %s)"
           % (err, short(events)))
    eq(status, 200, "status of a stream that began")
    expect(len(events) >= 4, "events: %s" % short(events))
    eq(events[-1], "[DONE]", "last event")
    data = [json.loads(e) for e in events[:-1]]
    eq(len([d for d in data if "choices" in d]), 2, "chunks the worker sent before it died")
    errs = [d for d in data if "error" in d]
    eq(len(errs), 1, "error events (%s)" % short(events))
    expect(data[-1] is errs[0], "the error event comes last before [DONE]")
    e = errs[0]["error"]
    expect(isinstance(e.get("message"), str) and e["message"], "error event message: %s" % short(e))
    eq(sum(w.requests() for w in W), 1, "a stream that began is not retried (worker requests)")
    R.check_alive()


@test
def test_killed_worker_under_load():
    """Clients keep 6 requests in flight (non-streamed and streamed, each
    held 100 ms by the worker) while one worker is killed: no request that
    had not started streaming fails."""
    fresh()
    victim = W[0]
    stop = time.monotonic() + 3.0
    results = []
    lock = threading.Lock()

    def client(k):
        i = 0
        while time.monotonic() < stop:
            i += 1
            if (i + k) % 2:
                try:
                    r = R.post("/v1/completions", completion("load %d %d" % (k, i), fake_delay_ms=100), timeout=20)
                    rec = ("plain", r.status, 0, None if r.status == 200 else short(r.body, 200))
                except OSError as e:
                    rec = ("plain", None, 0, str(e))
            else:
                st, ev, err = stream_events(completion("load %d %d" % (k, i), stream=True, max_tokens=3,
                                                       fake_delay_ms=100, fake_interval_ms=20))
                good = [e for e in ev if e != "[DONE]" and "error" not in e]
                failed = st != 200 or err is not None or not ev or ev[-1] != "[DONE]" or len(good) != 3
                rec = ("stream", st, len(good), (err or short(ev, 200)) if failed else None)
            with lock:
                results.append(rec)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    inflight = victim.stats()["inflight"]
    victim.kill(signal.SIGKILL)
    for t in threads:
        t.join(30)
    diag("%d requests, %d in flight on %s when it was killed" % (len(results), inflight, victim.name))
    bad = [r for r in results if r[3] is not None and not (r[0] == "stream" and r[2] > 0)]
    expect(not bad, "%d of %d requests failed although they had not started streaming: %s"
           % (len(bad), len(results), short(bad[:5], 800)))
    expect(len(results) >= 30, "only %d requests completed in 3 s" % len(results))
    # the killed worker is marked unhealthy, and comes back when restarted
    expect(wait_until(lambda: R.workers()[victim.url]["healthy"] is False, 5, 0.05),
           "killed worker still healthy: %s" % short(R.workers()[victim.url]))
    victim.restart()
    expect(wait_until(lambda: R.workers()[victim.url]["healthy"] is True, 10, 0.05),
           "restarted worker not healthy again: %s" % short(R.workers()[victim.url]))
    # its breaker may have opened while it was down: half-open trials close it
    for i in range(20):
        ok(what="request %d after the restart" % i)
        if victim.stats()["completed"] >= 2:
            break
    expect(victim.stats()["completed"] >= 2, "restarted worker got no traffic again")


if __name__ == "__main__":
    run(setup, timeout=90)
