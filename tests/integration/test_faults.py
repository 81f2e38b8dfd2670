#!/usr/bin/env python3
"""radixd under injected faults, with real processes (issue 10):

- a client that goes away at every stage of its request -- queued behind
  another, prefilling a long prompt, decoding (plain request), mid-stream --
  has its request aborted and the KV pool back at its baseline;
- slowloris: many sockets trickling a request's headers byte by byte do not
  block other clients (a normal request and /health answer in time);
- a flood far beyond [scheduler] max_queued_requests: the excess gets 503 +
  Retry-After at once, /health keeps answering, every request is accounted
  for (200 or 503), and the daemon serves normally afterwards;
- a hung collective (RADIX_TEST_COMM_HANG on comm-shm, test only): the
  peer's [parallel] comm_timeout ends the daemon, non-zero, with the reason
  in the log, within a few seconds;
- a request header block over [server] max_header_size is refused (413)
  without disturbing other clients.

- kill -9 of a rank of a tp_size 2 daemon under load: radixd exits
  non-zero within 5 s, the log names the pid and the signal, no child is
  left (test_parallel.py and test_lifecycle.py cover more process deaths).

One daemon on the
"slow" model for the first groups (one running request, four queued), a
tp_size 2 daemon on "tiny" for the hang and one for the kill."""

import json
import os
import re
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import (Daemon, Fail, Skip, diag, eq, expect, expect_error, in_thread, proc_name, raw_http,  # noqa: E402
                    run, short, stream_json, test, wait_until)

D = None
PROMPT = "Once upon a time"
LONG = 3000          # tokens: far longer than any test waits
MAX_QUEUED = 4
HEADER_LIMIT = 4096


def setup():
    global D
    D = Daemon("slow", name="faults", sections={
        "server": {"max_header_size": str(HEADER_LIMIT)},
        "scheduler": {"max_running_requests": "1", "max_queued_requests": str(MAX_QUEUED),
                      "chunked_prefill_size": "16", "arrival_wait": "0"},
    }).start().wait_healthy()


# ---- helpers --------------------------------------------------------------------


def raw_request(body_obj, path="/v1/completions"):
    """Send a request on a raw socket and leave it open (the caller closes
    it to disconnect)."""
    s = socket.create_connection(("127.0.0.1", D.port), timeout=30)
    body = json.dumps(body_obj).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(body)) + body)
    return s


def info():
    """The scheduler's live counters (running, queued, kv_used_tokens, ...)."""
    return D.ok_json("GET", "/get_server_info")["stats"]


def idle_baseline():
    """Nothing running or queued, the prefix cache flushed: the KV usage."""
    expect(wait_until(lambda: info()["running"] == 0 and info()["queued"] == 0, 15),
           "the daemon is not idle: %s" % short(info()))
    expect(wait_until(lambda: D.post("/flush_cache").status == 200, 10, 0.2), "POST /flush_cache never succeeded")
    return info()["kv_used_tokens"]


def back_to_baseline(base, what):
    expect(wait_until(lambda: info()["running"] == 0 and info()["queued"] == 0, 8),
           "%s: requests still running or queued 8 s after the client left: %s" % (what, short(info())))
    g0 = info()["generation_tokens"]
    time.sleep(0.5)
    eq(info()["generation_tokens"], g0, "%s: the generated-token counter still grows after the client left" % what)
    back = wait_until(lambda: D.post("/flush_cache").status == 200 and info()["kv_used_tokens"] == base, 10, 0.2)
    expect(back, "%s: kv_used_tokens %s, baseline %s (after /flush_cache)" % (what, info()["kv_used_tokens"], base))


def read_until(s, marker, count, limit):
    got = b""
    deadline = time.monotonic() + limit
    while got.count(marker) < count and time.monotonic() < deadline:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


# ---- client disconnects at every stage -> KV back to baseline ---------------------


@test
def test_disconnect_while_queued():
    base = idle_baseline()
    runner = raw_request({"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True})
    try:
        expect(b"data:" in read_until(runner, b"data:", 1, 20), "the running stream sent nothing in 20 s")
        q = raw_request({"prompt": "the queued one", "max_tokens": 50, "ignore_eos": True})
        expect(wait_until(lambda: info()["queued"] == 1, 10), "the second request never queued: %s" % short(info()))
        q.close()
        # dropped from the queue while the first still runs
        expect(wait_until(lambda: info()["queued"] == 0, 5),
               "the queued request stayed queued after its client left: %s" % short(info()))
        eq(info()["running"], 1, "running requests after the queued client left")
    finally:
        runner.close()
    back_to_baseline(base, "queued disconnect")


@test
def test_disconnect_while_prefilling():
    base = idle_baseline()
    g0 = info()["generation_tokens"]
    # ~2000 prompt tokens in chunks of 16: prefill lasts many steps
    prompt = " ".join("word%d" % i for i in range(900))
    s = raw_request({"prompt": prompt, "max_tokens": 5, "ignore_eos": True, "stream": True})
    try:
        rose = wait_until(lambda: info()["kv_used_tokens"] > base, 10, 0.02)
        expect(rose, "KV usage never rose while the long prompt was prefilled")
        during = info()
        diag("closing during prefill: kv_used_tokens %d, generation_tokens %d (was %d)"
             % (during["kv_used_tokens"], during["generation_tokens"], g0))
        expect(during["generation_tokens"] == g0, "the first token came before the test could disconnect "
               "during prefill (prefill too fast?): %s" % short(during))
    finally:
        s.close()
    back_to_baseline(base, "prefill disconnect")
    eq(info()["generation_tokens"], g0, "tokens generated for a request whose client left during prefill")


@test
def test_disconnect_while_decoding_plain():
    base = idle_baseline()
    g0 = info()["generation_tokens"]
    s = raw_request({"prompt": PROMPT + " plain", "max_tokens": LONG, "ignore_eos": True})
    try:
        expect(wait_until(lambda: info()["generation_tokens"] > g0 + 5, 15), "decoding never started")
    finally:
        s.close()
    back_to_baseline(base, "decode (plain) disconnect")


@test
def test_disconnect_mid_stream():
    base = idle_baseline()
    s = raw_request({"prompt": PROMPT + " streamed", "max_tokens": LONG, "ignore_eos": True, "stream": True})
    try:
        got = read_until(s, b"data:", 4, 20)
        expect(got.startswith(b"HTTP/1.1 200") and got.count(b"data:") >= 4, "stream answer: %s" % short(got, 300))
    finally:
        s.close()
    back_to_baseline(base, "mid-stream disconnect")
    r = D.ok_json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    eq(r["usage"]["completion_tokens"], 2, "a request after the disconnects")


# ---- slow clients -----------------------------------------------------------------


@test
def test_slowloris_does_not_block_others():
    n = 64
    socks = []
    stop = threading.Event()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", D.port), timeout=10)
        s.sendall(head[:5])
        socks.append(s)

    def trickle():
        i = 5
        while not stop.is_set() and i < len(head):
            for s in socks:
                try:
                    s.send(head[i:i + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(0.05)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        r = D.get("/health", timeout=5)
        eq(r.status, 200, "GET /health while %d slow clients trickle headers" % n)
        j = D.ok_json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4, "ignore_eos": True}, timeout=20)
        dt = time.monotonic() - t0
        eq(j["usage"]["completion_tokens"], 4, "completion tokens with slow clients connected")
        expect(dt < 10, "a 4-token request took %.1f s with %d slow clients connected" % (dt, n))
        expect(t.is_alive(), "the slow clients finished their headers before the normal request was served")
        diag("/health + a 4-token completion in %.2f s beside %d slowloris sockets" % (dt, n))
    finally:
        stop.set()
        t.join(5)
        for s in socks:
            s.close()
    D.wait_healthy(5)


# ---- header limit -------------------------------------------------------------------


@test
def test_header_limit():
    big = b"X-Big: " + b"h" * (HEADER_LIMIT + 100) + b"\r\n"
    req = (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + big + b"\r\n")
    try:
        r = raw_http(D.port, req, timeout=10)
        expect_error(r, 431, what="headers over max_header_size")
    except (OSError, Fail) as e:
        raise Fail("headers over max_header_size: no 431 answer (%s)" % short(str(e), 300))
    # far beyond the limit, libevent itself refuses and closes the connection
    huge = b"X-Huge: " + b"h" * (4 * HEADER_LIMIT + 65536) + b"\r\n"
    try:
        r = raw_http(D.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + huge + b"\r\n", timeout=10)
        expect(r.status >= 400, "huge headers accepted: HTTP %d" % r.status)
        diag("huge headers: HTTP %d" % r.status)
    except (OSError, Fail) as e:
        diag("huge headers: connection closed (%s)" % short(str(e), 120))
    small = b"X-Small: " + b"h" * (HEADER_LIMIT // 4) + b"\r\n"
    r = raw_http(D.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + small + b"\r\n", timeout=10)
    eq(r.status, 200, "headers under max_header_size")


# ---- flood beyond the queue ---------------------------------------------------------


@test
def test_flood_gets_503_and_health_answers():
    idle_baseline()
    n = 40
    results = [None] * n
    go = threading.Barrier(n + 1)

    def one(i):
        go.wait()
        t0 = time.monotonic()
        try:
            r = D.post("/v1/completions", {"prompt": "flood %d" % i, "max_tokens": 8, "ignore_eos": True},
                       timeout=120)
            results[i] = (r, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = (e, time.monotonic() - t0)

    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    go.wait()
    health = []
    while any(t.is_alive() for t in ts):
        t0 = time.monotonic()
        try:
            r = D.get("/health", timeout=5)
            health.append((r.status, time.monotonic() - t0))
        except OSError as e:
            health.append((repr(e), time.monotonic() - t0))
        time.sleep(0.1)
    for t in ts:
        t.join(1)
    counts = {}
    for i, (r, dt) in enumerate(results):
        if isinstance(r, Exception):
            raise Fail("flood request %d failed at the transport level after %.1f s: %r" % (i, dt, r))
        counts[r.status] = counts.get(r.status, 0) + 1
        if r.status == 503:
            expect_error(r, 503, what="flood request %d" % i)
            expect(r.header("Retry-After"), "503 without Retry-After")
            expect(dt < 3, "a 503 took %.1f s: a full queue should refuse at once" % dt)
        else:
            eq(r.status, 200, "flood request %d status (%s)" % (i, short(r.body)))
    diag("flood of %d: %s; /health probes %d, slowest %.2f s"
         % (n, counts, len(health), max([h[1] for h in health] or [0])))
    expect(counts.get(503, 0) >= 1, "no request of %d was refused with max_queued_requests = %d" % (n, MAX_QUEUED))
    expect(counts.get(200, 0) >= 1 + MAX_QUEUED - 1, "too few served: %s" % counts)
    bad = [h for h in health if h[0] != 200 or h[1] > 2]
    expect(not bad, "/health during the flood: %s" % bad[:5])
    r = D.ok_json("POST", "/v1/completions", {"prompt": "after", "max_tokens": 2, "ignore_eos": True})
    eq(r["usage"]["completion_tokens"], 2, "a request after the flood")


# ---- a hung collective --------------------------------------------------------------


@test
def test_hung_collective_comm_timeout():
    comm_timeout = 1.0
    h = Daemon("tiny", name="commhang", env={"RADIX_TEST_COMM_HANG": "1:400"}, sections={
        "kernels": {"threads": "1"},
        "parallel": {"tp_size": "2", "comm": "shm", "comm_timeout": "%gs" % comm_timeout},
    })
    try:
        h.start()
        h.remember_children()
        stop = threading.Event()

        def drive():   # requests until rank 1 reaches its hanging op
            while not stop.is_set() and h.proc.poll() is None:
                try:
                    h.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "ignore_eos": True}, timeout=30)
                except (OSError, Fail):
                    pass
        load = in_thread(drive)
        hung_at = None
        t_end = time.monotonic() + 60
        while time.monotonic() < t_end and h.proc.poll() is None:
            if "RADIX_TEST_COMM_HANG" in h.log_text():
                hung_at = time.monotonic()
                break
            time.sleep(0.02)
        stop.set()
        expect(hung_at is not None, "rank 1 never reached its injected hang; log:\n%s" % h.log_tail(20))
        rc = h.wait(15)
        dt = time.monotonic() - hung_at
        expect(rc is not None, "radixd still running 15 s after rank 1 hung (comm_timeout %g s)" % comm_timeout)
        expect(rc != 0, "radixd exited 0 after a hung collective")
        log = h.log_text()
        expect(re.search(r"did not reach \S+ #\d+ within", log),
               "the log does not name the timed-out collective; tail:\n%s" % h.log_tail(20))
        expect(dt < comm_timeout + 5, "radixd took %.1f s to stop after the hang (comm_timeout %g s)"
               % (dt, comm_timeout))
        diag("exit status %d %.1f s after the hang: %s" % (rc, dt, short(
            [ln for ln in log.splitlines() if "did not reach" in ln][:1], 300)))
        left = wait_until(lambda: not h.live_known_pids(), 5)
        expect(left, "radixd's children %s outlived it" % h.live_known_pids())
        load.result(timeout=40)
    finally:
        h.close()


# ---- a rank killed under load --------------------------------------------------------


@test
def test_kill9_rank_under_load_exits_within_5s():
    k, (_, victim), streams = _tp2_streaming("tiny", "kill9", 400, 4)
    try:
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        rc = k.wait(10)
        dt = time.monotonic() - t0
        expect(rc is not None, "radixd still running 10 s after a rank was killed")
        expect(rc != 0, "radixd exited 0 after a rank was killed")
        expect(dt < 5, "radixd took %.1f s to stop after kill -9 of a rank (want < 5 s)" % dt)
        # The victim, not the peer rank that saw it gone and exited 1, is
        # the named cause.
        _expect_named_cause(k, victim)
        diag("exit status %d %.2f s after kill -9 of pid %d" % (rc, dt, victim))
        _expect_all_gone(k, streams)
    finally:
        k.close()


@test
def test_kill9_rank_reaped_after_its_peer_is_still_named():
    # The race of the test above, forced: main is stopped while rank 1 is
    # killed and rank 0 (seeing it gone) exits, so main finds both dead at
    # once, and waitpid returns the older child, rank 0, first.  The named
    # cause must still be the killed rank, rank 0's exit its own warning.
    # Rank 0 notices at once only inside a shm collective; killed while it
    # waits in the per-step ZMQ sync, it would wait for its comm timeout:
    # that attempt is dropped and the scenario set up again.
    for attempt in range(1, 6):
        if _kill9_with_main_stopped(attempt):
            return
    raise Skip("rank 0 never exited inside a collective in 5 attempts: the race was not set up")


def _kill9_with_main_stopped(attempt):
    # the slow model: the streams are still generating when rank 1 dies (an
    # idle rank 0 would not notice its peer gone)
    k, (peer, victim), streams = _tp2_streaming("slow", "kill9-late", 3000, 2)
    try:
        os.kill(k.proc.pid, signal.SIGSTOP)
        try:
            os.kill(victim, signal.SIGKILL)
            # rank 0 is a zombie until main reaps it
            dead = wait_until(lambda: (_proc_state(peer) or "Z") == "Z", 3, 0.02)
        finally:
            os.kill(k.proc.pid, signal.SIGCONT)
        rc = k.wait(10)
        expect(rc is not None and rc != 0, "radixd exit status %s after a rank was killed (want 1)" % rc)
        if not dead:
            diag("attempt %d: rank 0 (pid %d) did not exit within 3 s of its peer's kill (not in a collective)"
                 % (attempt, peer))
            return False
        _expect_named_cause(k, victim)
        also = "(pid %d) exited with status" % peer
        expect([ln for ln in k.log_text().splitlines() if also in ln and "WARN" in ln],
               "no warning about rank 0's own exit (%r); tail:\n%s" % (also, k.log_tail(15)))
        _expect_all_gone(k, streams)
        return True
    finally:
        k.close()


def _tp2_streaming(model_name, name, max_tokens, n):
    """radixd with tp_size 2 (comm-shm) generating n streams of max_tokens:
    (the daemon, [rank 0's pid, rank 1's pid], the streams' handles)."""
    k = Daemon(model_name, name=name, sections={
        "kernels": {"threads": "1"}, "parallel": {"tp_size": "2", "comm": "shm"}}).start()
    try:
        kids = {p: proc_name(p) for p in k.children()}
        sched = sorted(p for p, n in kids.items() if "sched" in n)
        expect(len(sched) == 2, "want two scheduler processes (tp_size 2), got %s" % kids)
        # forked in rank order: the later one is rank 1
        streams = [in_thread(stream_json, k.port, "/v1/completions",
                             {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True},
                             timeout=30)
                   for _ in range(n)]
        expect(wait_until(lambda: info_of(k)["running"] >= 1, 10), "no request running before the kill")
        k.remember_children()
        return k, sched, streams
    except BaseException:
        k.close()
        raise


def _expect_named_cause(k, victim):
    """radixd's one "shutting down" line names the killed rank, and says
    radixd did not send the signal."""
    down = [ln for ln in k.log_text().splitlines() if "; shutting down" in ln]
    want = "(pid %d) was killed by signal 9" % victim
    expect(len(down) == 1 and want in down[0] and "did not send" in down[0],
           "the shutdown line does not name the killed rank (%r): %s; tail:\n%s" % (want, down, k.log_tail(15)))


def _expect_all_gone(k, streams):
    for h in streams:
        try:
            h.result(timeout=10)
        except Exception:  # noqa: BLE001 - a broken stream is expected here
            pass
    expect(wait_until(lambda: not k.live_known_pids(), 5), "children outlived radixd: %s" % k.live_known_pids())


def _proc_state(pid):
    """The state letter of /proc/PID/stat (R, S, Z, ...), None when gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def info_of(d):
    return d.ok_json("GET", "/get_server_info")["stats"]


if __name__ == "__main__":
    run(setup, timeout=240)
