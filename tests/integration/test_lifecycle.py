#!/usr/bin/env python3
"""radixd's process life: port 0 (the ready line names the port), SIGTERM
drains (a request in flight completes, new ones are refused, exit status
0), SIGTERM after shutdown_timeout aborts what is left and still exits 0,
and a dead or hung child (the scheduler killed, the detokenizer killed, the
scheduler stopped under the watchdog) brings the daemon down with a
non-zero status and the reason in the log -- never a hang, never an
orphaned child.  One fresh daemon per test, on the "slow" model."""

import http.client
import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import (Daemon, Fail, Skip, diag, eq, expect, in_thread, proc_name, run,  # noqa: E402
                    short, stream_json, test, wait_until)

PROMPT = "It was a bright cold day in April"


def no_orphans(d, what):
    """After radixd exited: every process it started is gone too."""
    left = wait_until(lambda: not d.live_known_pids(), 5)
    if not left:
        pids = d.live_known_pids()
        raise Fail("%s: radixd's children %s outlived it (%s)"
                   % (what, pids, "; ".join(proc_name(p) for p in pids)))


def started_stream(d, body, path="/v1/completions"):
    """Start a streaming request in a thread; wait for its first event.
    Returns the thread handle (its result: the parsed chunks, or an
    exception when the stream broke)."""
    first = threading.Event()

    def go():
        return stream_json(d.port, path, body, timeout=60,
                           on_event=lambda i, p: first.set())[1]

    h = in_thread(go)
    if not first.wait(30):
        if h.done():
            h.result()
        raise Fail("no stream event within 30 s")
    return h


def probe_refused(d):
    """A new request during the drain: refused (connection error) or 503.
    Returns a description; Fail when it is served."""
    try:
        r = d.post("/v1/completions", {"prompt": "late", "max_tokens": 2}, timeout=5)
    except (OSError, http.client.HTTPException) as e:
        return "connection failed (%s)" % type(e).__name__
    if r.status == 200:
        raise Fail("a new request was served after SIGTERM: %s" % short(r.body))
    expect_status = r.status == 503
    expect(expect_status, "a new request after SIGTERM got HTTP %d %s (want refused or 503)"
           % (r.status, short(r.body)))
    return "HTTP 503"


def find_child(d, word):
    kids = d.children()
    named = [(p, proc_name(p)) for p in kids]
    diag("radixd pid %d children: %s" % (d.proc.pid, "; ".join("%d %s" % x for x in named) or "none"))
    hit = [p for p, n in named if word in n.lower()]
    return hit[0] if len(hit) == 1 else None, kids


def expect_down(d, what, limit=15):
    rc = d.wait(limit)
    if rc is None:
        raise Fail("%s: radixd still running %d s later" % (what, limit))
    expect(rc != 0, "%s: radixd exited with status 0; want non-zero" % what)
    log = d.log_text()
    tail = "\n".join(log.splitlines()[-15:])
    expect(re.search(r"sched|detok|child|worker|process", log, re.I)
           and re.search(r"die|dead|exit|kill|signal|terminat|lost|crash|hung|hang|watchdog|stopped", log, re.I),
           "%s: the log does not say which process died and how; last lines:\n%s" % (what, tail))
    diag("%s: exit status %d; last log lines:\n%s" % (what, rc, tail))
    no_orphans(d, what)
    return rc


# ---- tests ---------------------------------------------------------------------


@test
def test_port_zero_ready_line():
    d = Daemon("slow", port=0, name="port0").start().wait_healthy()
    try:
        diag("ready line: %s" % d.ready_line)
        expect(d.port > 0, "port %d" % d.port)
        eq(d.get("/health").status, 200, "GET /health on the port from the ready line")
        d.remember_children()
        expect(d.known_pids, "radixd started no child processes")
        rc = d.stop(timeout=15)
        eq(rc, 0, "exit status after SIGTERM when idle")
        no_orphans(d, "idle SIGTERM")
    finally:
        d.close()


@test
def test_sigterm_drains_in_flight():
    d = Daemon("slow", name="drain", sections={"server": {"shutdown_timeout": "30s"}}).start()
    try:
        n = 120
        h = started_stream(d, {"prompt": PROMPT, "max_tokens": n, "ignore_eos": True, "stream": True,
                               "stream_options": {"include_usage": True}})
        d.remember_children()
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        time.sleep(0.3)
        diag("a new request during the drain: %s" % probe_refused(d))
        chunks = h.result(timeout=60)
        fins = [c["choices"][0]["finish_reason"] for c in chunks
                if c.get("choices") and c["choices"][0].get("finish_reason")]
        eq(fins, ["length"], "finish_reason of the request in flight at SIGTERM")
        usage = [c["usage"] for c in chunks if c.get("usage")]
        expect(usage and usage[-1]["completion_tokens"] == n,
               "the drained request got %s tokens, want %d" % (usage[-1]["completion_tokens"] if usage else "?", n))
        rc = d.wait(30)
        expect(rc is not None, "radixd still running 30 s after the drained request finished")
        eq(rc, 0, "exit status after a SIGTERM drain")
        diag("drained and exited %.1f s after SIGTERM" % (time.monotonic() - t0))
        no_orphans(d, "SIGTERM drain")
    finally:
        d.close()


@test
def test_sigterm_aborts_after_shutdown_timeout():
    d = Daemon("slow", name="drain-timeout", sections={"server": {"shutdown_timeout": "1s"}}).start()
    try:
        h = started_stream(d, {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "stream": True})
        d.remember_children()
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        rc = d.wait(12)
        dt = time.monotonic() - t0
        expect(rc is not None, "radixd still running 12 s after SIGTERM with shutdown_timeout = 1s")
        eq(rc, 0, "exit status after SIGTERM with a request aborted at shutdown_timeout")
        try:
            chunks = h.result(timeout=10)
            fins = [c["choices"][0]["finish_reason"] for c in chunks
                    if c.get("choices") and c["choices"][0].get("finish_reason")]
            expect(fins in ([], ["abort"]), "finish_reason of a request cut by shutdown: %s" % fins)
            diag("the cut stream ended cleanly with finish_reason %s" % fins)
        except (OSError, http.client.HTTPException, Fail) as e:
            diag("the cut stream broke off: %s" % short(str(e), 200))
        diag("exited %.1f s after SIGTERM" % dt)
        no_orphans(d, "SIGTERM with shutdown_timeout")
    finally:
        d.close()


def kill_child_test(word, name, fallback_all):
    """Kill radixd's child named after word (or, when none is and
    fallback_all, every child) while a request streams."""
    d = Daemon("slow", name=name).start()
    try:
        pid, kids = find_child(d, word)
        expect(kids, "radixd has no child processes")
        if pid is None and not fallback_all:
            raise Skip("no child process named after the %s among %s" % (name, kids))
        victims = [pid] if pid is not None else kids
        if pid is None:
            diag("no child named after the %s: killing all of them" % name)
        h = started_stream(d, {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "stream": True})
        d.remember_children()
        for p in victims:
            os.kill(p, signal.SIGKILL)
        expect_down(d, "%s killed" % name)
        # the client in flight is not left hanging
        try:
            h.result(timeout=10)
            diag("the stream in flight ended")
        except (OSError, http.client.HTTPException, Fail) as e:
            diag("the stream in flight broke off: %s" % short(str(e), 200))
    finally:
        d.close()


@test
def test_killed_scheduler_brings_daemon_down():
    kill_child_test("sched", "scheduler", True)


@test
def test_killed_detokenizer_brings_daemon_down():
    kill_child_test("detok", "detokenizer", False)


@test
def test_hung_scheduler_watchdog():
    d = Daemon("slow", name="watchdog", sections={"server": {"watchdog_timeout": "2s"}}).start()
    try:
        pid, kids = find_child(d, "sched")
        expect(kids, "radixd has no child processes")
        h = started_stream(d, {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "stream": True})
        d.remember_children()
        for p in [pid] if pid is not None else kids:
            os.kill(p, signal.SIGSTOP)
        expect_down(d, "scheduler stopped (SIGSTOP) with watchdog_timeout = 2s", limit=15)
        try:
            h.result(timeout=10)
        except (OSError, http.client.HTTPException, Fail):
            pass
    finally:
        d.close()     # SIGCONT + SIGKILL for any stopped child left behind


@test
def test_long_prefill_is_busy_not_dead():
    # One 4000-token prefill step (a single chunk) takes several seconds on
    # the slow model, well over watchdog_timeout.  The scheduler must keep
    # beating through it, so /health says 200 (busy) and the watchdog does
    # not fire.  3 s leaves room for the beats' own granularity (here about
    # one per 512 prompt tokens, 0.5-2 s apart).
    d = Daemon("slow", name="long-prefill", sections={
        "server": {"watchdog_timeout": "3s"}, "scheduler": {"chunked_prefill_size": 8192}}).start()
    try:
        d.wait_healthy()
        ids = [1] + [1000 + (i * 37) % 20000 for i in range(4000)]
        t0 = time.monotonic()
        h = in_thread(d.post, "/v1/completions", {"prompt": ids, "max_tokens": 1}, timeout=120)
        bad = []
        while not h.done():
            try:
                r = d.get("/health", timeout=5)
                if r.status != 200:
                    bad.append("%.1f s: HTTP %d %s" % (time.monotonic() - t0, r.status, short(r.body, 120)))
            except (OSError, http.client.HTTPException) as e:
                bad.append("%.1f s: %s" % (time.monotonic() - t0, type(e).__name__))
            time.sleep(0.25)
        dt = time.monotonic() - t0
        try:
            r = h.result(timeout=5)
            outcome = "HTTP %d" % r.status
        except (OSError, http.client.HTTPException) as e:
            r, outcome = None, type(e).__name__
        expect(not bad and r is not None and r.status == 200 and d.alive(),
               "during a %.1f s prefill with watchdog_timeout = 3s: /health answers %s; the request "
               "ended with %s; radixd %s; log tail:\n%s"
               % (dt, bad[:4], outcome, "alive" if d.alive() else "exited with %s" % d.proc.poll(),
                  d.log_tail(4)))
        if dt < 4.5:
            raise Skip("the prefill took only %.1f s: too fast to outlast the 3 s watchdog here" % dt)
        diag("prefill of 4001 tokens: %.1f s, /health 200 throughout" % dt)
    finally:
        d.close()


@test
def test_bad_config_one_line():
    # A bad INI is refused with one line naming the file, before "ready".
    d = Daemon("tiny", name="badconf", sections={"server": {"port": "99999"}})
    try:
        try:
            d.start(timeout=20)
        except Fail:
            pass
        else:
            raise Fail("radixd started with port = 99999")
        rc = d.wait(5)
        expect(rc not in (None, 0), "exit status %s for a bad INI" % rc)
        log = d.log_text()
        expect(os.path.basename(d.ini_path) in log and "port" in log,
               "the error does not name the file and key: %s" % short(log, 400))
    finally:
        d.close()


@test
def test_bad_model_one_line():
    # A truncated GGUF and a missing one: refused naming the file, exit != 0.
    d0 = Daemon("tiny", name="badmodel")
    bad = os.path.join(d0.dir, "truncated.gguf")
    with open(d0.model_path, "rb") as f, open(bad, "wb") as g:
        g.write(f.read(3000))
    d0.close()
    for path in (bad, "/nonexistent/dir/model.gguf"):
        d = Daemon("tiny", name="badmodel", sections={"model": {"path": path}})
        try:
            try:
                d.start(timeout=20)
            except Fail:
                pass
            else:
                raise Fail("radixd started with model %s" % path)
            rc = d.wait(10)
            expect(rc not in (None, 0), "exit status %s for model %s" % (rc, path))
            log = d.log_text()
            expect(os.path.basename(path) in log, "the error does not name %s: %s" % (path, short(log, 400)))
            no_orphans(d, "bad model %s" % path)
        finally:
            d.close()


if __name__ == "__main__":
    run(timeout=170)
