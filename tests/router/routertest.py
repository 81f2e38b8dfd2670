"""tests/router/routertest.py -- the harness of radix-router's integration
tests, on top of tests/integration/rxtest.py (TAP, HTTP helpers, radixd
daemons).

FakeWorker starts tests/router/fake-worker (a fake radixd in C: answers at
once or after a delay, streams, injects faults, counts what it got, says
who answered in a "worker" field).  Router starts router/radix-router with
a generated INI in front of given worker URLs, on a port it picks itself
(the "ready" line names it).  Both register with rxtest so that a failing
test prints their log tails and teardown stops them.

Environment: what rxtest needs (RADIXD, RADIX, RX_PLUGIN_BUILD_DIR,
RX_TOP_BUILDDIR), plus optionally RADIX_ROUTER and RX_FAKE_WORKER to point
at other binaries than the build tree's.
"""

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "integration"))
import rxtest  # noqa: E402
from rxtest import (Fail, Skip, eq, expect, http_request, parse_metrics, short,  # noqa: E402,F401
                    stream_json, wait_until)


def _built(env, rel):
    p = os.environ.get(env)
    if p:
        return p
    top = os.environ.get("RX_TOP_BUILDDIR")
    if not top:
        raise Skip("RX_TOP_BUILDDIR not set (run through make check)")
    return os.path.join(top, rel)


def router_bin():
    p = _built("RADIX_ROUTER", "router/radix-router")
    if not os.access(p, os.X_OK):
        raise Fail("%s is not built (make router/radix-router)" % p)
    return p


def fake_bin():
    p = _built("RX_FAKE_WORKER", "tests/router/fake-worker")
    if not os.access(p, os.X_OK):
        raise Fail("%s is not built (make tests/router/fake-worker)" % p)
    return p


def _child_env():
    env = dict(os.environ)
    env["RADIX_PLUGIN_PATH"] = os.environ.get("RX_PLUGIN_BUILD_DIR", "")
    return env


# ---- the fake worker -----------------------------------------------------


class FakeWorker:
    """One tests/router/fake-worker process.  args: extra command-line
    flags (see fake_worker.c), e.g. ["--delay-ms", "100"]."""

    def __init__(self, name, args=(), port=0):
        self.name = name
        self.args = list(args)
        self.port = port
        self.proc = None
        self.dir = tempfile.mkdtemp(prefix="rx-rtest-fw-")
        self.log_path = os.path.join(self.dir, "fake-worker.log")
        self.log_file = None
        rxtest._daemons.append(self)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self, timeout=10):
        self.log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen([fake_bin(), "--name", self.name, "--port", str(self.port)] + self.args,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.log_file, start_new_session=True)
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise Fail("fake-worker %s printed no ready line within %d s" % (self.name, timeout))
            b = self.proc.stdout.read1(256) if hasattr(self.proc.stdout, "read1") else os.read(self.proc.stdout.fileno(), 256)
            if not b:
                raise Fail("fake-worker %s exited (%s) before its ready line; log:\n%s"
                           % (self.name, self.proc.wait(), self.log_tail()))
            line += b
        m = re.search(rb"ready on http://[^:]+:(\d+)", line)
        expect(m is not None, "fake-worker ready line %r names no port" % line)
        self.port = int(m.group(1))
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stats(self):
        r = http_request(self.port, "GET", "/_stats", timeout=10)
        eq(r.status, 200, "fake-worker %s GET /_stats" % self.name)
        return r.json()

    def requests(self):
        return self.stats()["requests"]

    def control(self, **kw):
        r = http_request(self.port, "POST", "/_control", kw, timeout=10)
        if r.status != 200:
            raise Fail("fake-worker %s POST /_control %s: %r" % (self.name, kw, r))

    def reset(self):
        """Back to a healthy worker that answers at once, counters zeroed."""
        self.control(delay_ms=0, chunk_interval_ms=0, fail_count=0, health_status=200, hang=False,
                     hang_health=False, close_after_chunks=-1, die_after=-1, reset_stats=True)

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            self.proc.send_signal(sig)
            self.proc.wait()

    def restart(self):
        """Start again on the same port (after kill)."""
        self.kill()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        return self.start()

    def log_tail(self, n=25):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:]) if lines else "(empty)"

    def close(self):
        if self in rxtest._daemons:
            rxtest._daemons.remove(self)
        self.kill()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        shutil.rmtree(self.dir, ignore_errors=True)


def fake_workers(n, args=(), prefix="w"):
    return [FakeWorker("%s%d" % (prefix, i), args).start() for i in range(n)]


# ---- the router -----------------------------------------------------------


def quote_url(url):
    """A worker URL as one path segment of DELETE /workers/{url}."""
    return urllib.parse.quote(url, safe="")


class Router(rxtest.LoggedProcess):
    """One radix-router with its own INI and log in a temporary folder.

    workers: URLs (or FakeWorkers) for [router] workers.  sections:
    {"router": {...}, "server": {...}, "router.cache_aware": {...}} merged
    over the defaults below (None removes a key).  The defaults make health
    checks fast (every 100 ms) so that tests do not wait."""

    READY_RE = re.compile(r"https?://(\[[^\]]*\]|[^\s/:]+):(\d+)")
    what = "radix-router"

    def __init__(self, workers=(), policy="round_robin", sections=None, name="radix-router"):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="rx-rtest-")
        self.log_path = os.path.join(self.dir, "router.log")
        self.ini_path = os.path.join(self.dir, "router.ini")
        urls = [w.url if isinstance(w, FakeWorker) else str(w) for w in workers]
        conf = {
            "server": {"host": "127.0.0.1", "port": "0"},
            "router": {"policy": policy, "workers": ",".join(urls),
                       "health_check_interval": "100ms", "health_check_timeout": "1s",
                       "retry_backoff": "10ms"},
            "log": {"level": "info", "file": "-"},
            "plugins": {"path": os.environ.get("RX_PLUGIN_BUILD_DIR", "")},
        }
        for sec, kv in (sections or {}).items():
            conf.setdefault(sec, {})
            for k, v in kv.items():
                if v is None:
                    conf[sec].pop(k, None)
                else:
                    conf[sec][k] = str(v)
        self.conf = conf
        key = conf["server"].get("api_key")
        self.auth = {"Authorization": "Bearer " + key} if key else {}
        with open(self.ini_path, "w") as f:
            for sec, kv in conf.items():
                f.write("[%s]\n" % sec)
                for k, v in kv.items():
                    f.write("%s = %s\n" % (k, v))
                f.write("\n")
        self.proc = None
        self.port = None
        self.log_file = None
        rxtest._daemons.append(self)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self, timeout=20):
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen([router_bin(), "-c", self.ini_path], stdin=subprocess.DEVNULL,
                                     stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=_child_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            line = self._find_ready()
            if line is not None:
                break
            rc = self.proc.poll()
            if rc is not None:
                raise Fail("radix-router exited with status %d before logging \"ready\"; log:\n%s"
                           % (rc, self.log_tail(30)))
            if time.monotonic() > deadline:
                raise Fail("radix-router logged no \"ready\" line within %d s; log:\n%s"
                           % (timeout, self.log_tail(30)))
            time.sleep(0.02)
        m = self.READY_RE.search(line)
        expect(m is not None, "radix-router ready line names no http://HOST:PORT: %r" % line)
        self.port = int(m.group(2))
        expect(self.port != 0, "ready line names port 0: %r" % line)
        self.ready_line = line
        return self

    def stop(self, timeout=15):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def close(self):
        if self in rxtest._daemons:
            rxtest._daemons.remove(self)
        self.stop()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- HTTP --

    def request(self, method, path, body=None, headers=None, timeout=30):
        h = dict(self.auth)
        h.update(headers or {})
        return http_request(self.port, method, path, body, h, timeout)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def ok_json(self, method, path, body=None, headers=None, timeout=30, status=200):
        r = self.request(method, path, body, headers, timeout)
        if r.status != status:
            raise Fail("router %s %s: HTTP %d, want %d: %s" % (method, path, r.status, status, short(r.body)))
        return r.json()

    def stream(self, path, body, headers=None, **kw):
        h = dict(self.auth)
        h.update(headers or {})
        return stream_json(self.port, path, body, headers=h, **kw)

    def metrics(self):
        r = self.get("/metrics")
        eq(r.status, 200, "router GET /metrics status")
        return r.body.decode("utf-8")

    def metric(self, name, **labels):
        """The value of one sample of /metrics (0.0 when absent)."""
        want = name
        if labels:
            want += "{" + ",".join('%s="%s"' % kv for kv in sorted(labels.items())) + "}"
        for k, v in parse_metrics(self.metrics()).items():
            if _canon(k) == want:
                return v
        return 0.0

    def workers(self):
        """GET /workers as {url: entry}."""
        j = self.ok_json("GET", "/workers")
        expect(isinstance(j.get("workers"), list), "GET /workers: no \"workers\" list: %s" % short(j))
        return {w["url"]: w for w in j["workers"]}

    def wait_healthy(self, urls=None, timeout=10):
        """Wait until every worker (or those of urls) is healthy with a
        closed breaker, as GET /workers says."""
        urls = [u.url if isinstance(u, FakeWorker) else u for u in urls] if urls is not None else None
        last = [None]

        def ok():
            ws = self.workers()
            last[0] = ws
            want = urls if urls is not None else list(ws)
            return all(u in ws and ws[u]["healthy"] is True and ws[u]["breaker"] == "closed" for u in want)
        if not wait_until(ok, timeout, 0.05):
            raise Fail("workers not all healthy within %d s: %s" % (timeout, short(last[0], 1200)))
        return self


def _canon(sample):
    """name{b="2",a="1"} -> name{a="1",b="2"} (label order is free)."""
    m = re.match(r"^([^{]+)\{(.*)\}$", sample)
    if not m:
        return sample
    labels = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2))
    return m.group(1) + "{" + ",".join('%s="%s"' % kv for kv in sorted(labels)) + "}"


def completion(prompt="hello", **kw):
    body = {"model": "fake-model", "prompt": prompt, "max_tokens": 2}
    body.update(kw)
    return body


def answered_by(resp):
    """The fake worker that produced a JSON answer."""
    j = resp.json()
    expect("worker" in j, "answer has no \"worker\" field (not from a fake worker?): %s" % short(j))
    return j["worker"]


def run(setup=None, teardown=None, timeout=150):
    rxtest.run(setup, teardown, timeout)
