"""tests/integration/rxtest.py -- the harness of radixd's integration tests.

Each test_*.py file registers its test functions with @test, then calls
run().  run() prints TAP (plan first, one "ok"/"not ok" line per test, "#"
diagnostics), which automake's tap-driver.sh counts.  A test fails by
raising Fail (expect(), eq() and friends) or any other exception; it skips
by raising Skip.

Daemon starts the real radixd binary ($RADIXD) with a generated INI on a
free port, waits for its "ready" log line, and offers small HTTP helpers
(stdlib http.client only, so the suite needs nothing but python3).  Its
stderr goes to a file whose tail is printed when a test fails.

models() makes the random-weight test models once per build tree with
`radix gguf-gen` (a fast tiny one with a 512-token context, and a slower
one for tests that need a generation to last seconds).

Environment (exported by tests/Makemodule.am's AM_TESTS_ENVIRONMENT):
RADIXD, RADIX, RX_PLUGIN_BUILD_DIR, RADIX_SHARED, RX_TOP_BUILDDIR.

Everything here is stdlib; tests run under `python3 -B` so nothing is
written into the source tree.
"""

import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# ---- TAP ---------------------------------------------------------------


class Fail(Exception):
    """A test's expectation did not hold."""


class Skip(Exception):
    """The test cannot run here (missing data, missing client)."""


class FileTimeout(BaseException):
    """The file's time budget ran out (SIGALRM).  A BaseException, so the
    tests' own `except Exception` (and socket timeouts, which are
    TimeoutError) never swallow or mimic it."""


_tests = []


def test(fn):
    """Register fn as one TAP test point, run in file order."""
    _tests.append(fn)
    return fn


def expect(cond, msg):
    if not cond:
        raise Fail(msg)


def eq(got, want, what):
    if got != want:
        raise Fail("%s: got %r, want %r" % (what, got, want))


def diag(text):
    """Print text as TAP diagnostics (every line behind "# ")."""
    for line in str(text).splitlines() or [""]:
        print("# " + line)
    sys.stdout.flush()


def short(obj, n=600):
    """A printable, bounded rendering of obj for failure messages."""
    if isinstance(obj, (bytes, bytearray)):
        s = obj.decode("utf-8", "replace")
    elif isinstance(obj, str):
        s = obj
    else:
        try:
            s = json.dumps(obj, ensure_ascii=False)
        except (TypeError, ValueError):
            s = repr(obj)
    return s if len(s) <= n else s[:n] + "...(%d more chars)" % (len(s) - n)


# Daemons started by this process: run() tears down whatever is left, and
# a failing test prints their log tails.
_daemons = []


def run(setup=None, teardown=None, timeout=150):
    """Run the registered tests and print TAP.

    setup() runs first (typically starting a shared Daemon); when it raises
    Skip every test is skipped, when it fails every test fails with the
    reason.  timeout bounds the whole file: on expiry the file bails out
    (TAP "Bail out!") after tearing its daemons down, so a hang never
    blocks the suite."""
    sys.stdout.reconfigure(line_buffering=True)
    print("1..%d" % len(_tests))

    def on_alarm(signum, frame):
        raise FileTimeout("test file exceeded its %d s budget" % timeout)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(timeout)
    failed = 0
    setup_err = None
    setup_skip = None
    n = 0
    try:
        missing = [v for v in ("RADIXD", "RADIX", "RX_PLUGIN_BUILD_DIR") if not os.environ.get(v)]
        if missing:
            setup_skip = "environment lacks %s (run through make check)" % ", ".join(missing)
        elif setup is not None:
            try:
                setup()
            except Skip as e:
                setup_skip = str(e)
            except Exception as e:  # noqa: BLE001 - reported as TAP
                setup_err = e
                setup_tb = traceback.format_exc()
        for fn in _tests:
            n += 1
            name = (fn.__name__[5:] if fn.__name__.startswith("test_") else fn.__name__)
            if setup_skip is not None:
                print("ok %d - %s # SKIP %s" % (n, name, setup_skip))
                continue
            if setup_err is not None:
                failed += 1
                print("not ok %d - %s" % (n, name))
                if n == 1:
                    diag("setup failed: %s" % setup_err)
                    diag(setup_tb)
                    _diag_daemons()
                else:
                    diag("setup failed (see test 1)")
                continue
            t0 = time.monotonic()
            try:
                fn()
            except Skip as e:
                print("ok %d - %s # SKIP %s" % (n, name, e))
                continue
            except Exception as e:  # noqa: BLE001 - reported as TAP
                failed += 1
                print("not ok %d - %s" % (n, name))
                if isinstance(e, Fail):
                    diag(str(e))
                else:
                    diag(traceback.format_exc())
                _diag_daemons()
                continue
            print("ok %d - %s (%.1f s)" % (n, name, time.monotonic() - t0))
    except FileTimeout as e:
        print("not ok %d - %s" % (max(n, 1), e))
        _diag_daemons()
        _teardown_all(teardown)
        print("Bail out! %s" % e)
        sys.exit(1)
    _teardown_all(teardown)
    signal.alarm(0)
    if failed:
        diag("%d of %d tests failed" % (failed, len(_tests)))
    # Failures are already counted from the "not ok" lines; a non-zero
    # status would make tap-driver.sh count the file once more as ERROR.
    sys.exit(0)


def _diag_daemons():
    for d in _daemons:
        if d.proc is None:
            continue
        rc = d.proc.poll()
        state = "running" if rc is None else "exited with status %s" % rc
        diag("radixd [%s] pid %d %s; last lines of its log:" % (d.name, d.proc.pid, state))
        diag(d.log_tail(25))


def _teardown_all(teardown):
    if teardown is not None:
        try:
            teardown()
        except Exception:  # noqa: BLE001
            diag("teardown: " + traceback.format_exc())
    for d in list(_daemons):
        d.close()


# ---- models ------------------------------------------------------------

VOCAB = "data/tokenizers/ggml-vocab-llama-spm.gguf"

# name -> (gguf-gen arguments, context length).  "tiny" is gguf-gen's tiny
# preset (2 layers, 64 wide: thousands of tokens per second even on one
# thread).  "slow" is wide and deep enough that one thread decodes about a
# hundred tokens per second, so a 2000-token generation lasts long enough to
# abort it, disconnect from it or send SIGTERM during it.
MODELS = {
    "tiny": (["--preset", "tiny"], 512),
    "slow": (["--preset", "tiny", "--dims",
              "embd=512,layers=8,heads=8,kv_heads=2,ffn=1536,ctx=4096"], 4096),
}


def shared_path(rel):
    """Path of a file of ../shared, or Skip when the data is absent."""
    root = os.environ.get("RADIX_SHARED", "")
    p = os.path.join(root, rel)
    if not root or not os.path.exists(p):
        raise Skip("%s not found (set RADIX_SHARED to the shared data folder)" % rel)
    return p


_model_tmp = None


def model(name="tiny"):
    """Path of test model `name`, generated when missing or older than
    the radix binary.  Cached in $RX_TOP_BUILDDIR/tests/integration so the
    files of one make check share it; written to a temporary name and
    renamed, so concurrent test files never read half a file."""
    global _model_tmp
    args, _ = MODELS[name]
    vocab = shared_path(VOCAB)
    radix = os.environ["RADIX"]
    top = os.environ.get("RX_TOP_BUILDDIR")
    if top and os.access(top, os.W_OK):
        folder = os.path.join(top, "tests", "integration")
    else:
        if _model_tmp is None:
            _model_tmp = tempfile.mkdtemp(prefix="rx-itest-models-")
            atexit.register(shutil.rmtree, _model_tmp, True)
        folder = _model_tmp
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "%s.gguf" % name)
    try:
        fresh = os.path.getmtime(out) >= os.path.getmtime(radix)
    except OSError:
        fresh = False
    if fresh:
        return out
    tmp = "%s.tmp%d" % (out, os.getpid())
    cmd = [radix, "gguf-gen", "--arch", "llama"] + args + [
        "--vocab", vocab, "--type", "f16", "--out", tmp]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if r.returncode != 0:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise Fail("%s failed (%d): %s" % (" ".join(cmd), r.returncode, short(r.stdout)))
    os.replace(tmp, out)
    return out


def ctx_len(name="tiny"):
    return MODELS[name][1]


def cli_tokenize(model_path, text, bos=True):
    """Token ids of text from the `radix tokenize` CLI (an independent path
    to the same tokenizer, to cross-check the HTTP answers)."""
    cmd = [os.environ["RADIX"], "tokenize", "--model", model_path, "--text", text, "--special"]
    if bos:
        cmd.append("--bos")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
                       env=_child_env())
    if r.returncode != 0:
        raise Fail("%s failed: %s" % (" ".join(cmd), short(r.stderr)))
    return [int(x) for x in r.stdout.split()]


def _child_env():
    env = dict(os.environ)
    env["RADIX_PLUGIN_PATH"] = os.environ.get("RX_PLUGIN_BUILD_DIR", "")
    return env


def free_port():
    """A TCP port nothing listens on right now (bind to 0, read, close)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


# ---- HTTP --------------------------------------------------------------


class Resp:
    """A complete HTTP answer: status, headers (lower-case names), body."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise Fail("HTTP %d body is not JSON (%s): %s" % (self.status, e, short(self.body)))

    def __repr__(self):
        return "HTTP %d %s" % (self.status, short(self.body, 300))


def http_request(port, method, path, body=None, headers=None, timeout=60, host="127.0.0.1"):
    """One request on a fresh connection.  body: bytes, str, or an object
    sent as JSON.  Returns a Resp."""
    hdrs = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, bytearray)):
        if not isinstance(body, str):
            body = json.dumps(body)
            hdrs.setdefault("Content-Type", "application/json")
        body = body.encode("utf-8")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        conn.close()


def raw_http(port, data, timeout=30):
    """Send raw request bytes on a new connection and parse one answer.
    Tolerates the server closing (even resetting) the connection once it
    has answered, as it may after refusing a body it did not read."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got = b""
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
            r = _parse_raw(got)
            if r is not None:
                return r
    finally:
        s.close()
    r = _parse_raw(got, eof=True)
    if r is None:
        raise Fail("no complete HTTP answer (got %r)" % short(got, 300))
    return r


def _parse_raw(got, eof=False):
    head, sep, rest = got.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("iso-8859-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not m:
        raise Fail("not an HTTP status line: %r" % lines[0])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        return Resp(int(m.group(1)), hdrs, rest[:n]) if len(rest) >= n else None
    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size_line, sep, tail = rest.partition(b"\r\n")
            if not sep:
                return None
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                return Resp(int(m.group(1)), hdrs, body)
            if len(tail) < n + 2:
                return None
            body += tail[:n]
            rest = tail[n + 2:]
    return Resp(int(m.group(1)), hdrs, rest) if eof else None


def sse_events(resp, on_event=None):
    """Read an SSE body from an http.client response: the list of "data:"
    payloads in order.  Fails on a line that is neither "data: ...", a
    comment nor blank.  on_event(i, payload) is called as each arrives."""
    events = []
    buf = []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if line == "":
            if buf:
                payload = "\n".join(buf)
                events.append(payload)
                if on_event:
                    on_event(len(events) - 1, payload)
                buf = []
            continue
        if line.startswith(":"):
            continue
        if line.startswith("data:"):
            buf.append(line[5:].lstrip(" ") if line.startswith("data: ") else line[5:])
            continue
        raise Fail("SSE line is not a data line: %r" % line)
    if buf:
        raise Fail("SSE stream ended inside an event (no blank line after %r)" % buf)
    return events


def stream_json(port, path, body, headers=None, timeout=60, on_event=None):
    """POST body with streaming and return (resp, [parsed chunks]).
    Checks the SSE framing: Content-Type text/event-stream, every event
    JSON except the last, which must be [DONE]."""
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
        r = conn.getresponse()
        if r.status != 200:
            data = r.read()
            raise Fail("stream %s: HTTP %d %s" % (path, r.status, short(data)))
        ctype = r.getheader("Content-Type") or ""
        expect(ctype.startswith("text/event-stream"),
               "stream %s: Content-Type %r, want text/event-stream" % (path, ctype))
        events = sse_events(r, on_event)
    finally:
        conn.close()
    expect(events, "stream %s: no events at all" % path)
    expect(events[-1] == "[DONE]", "stream %s: last event is %r, not [DONE]" % (path, short(events[-1])))
    expect(events.count("[DONE]") == 1, "stream %s: [DONE] appears %d times" % (path, events.count("[DONE]")))
    chunks = []
    for e in events[:-1]:
        try:
            chunks.append(json.loads(e))
        except ValueError:
            raise Fail("stream %s: event is not JSON: %r" % (path, short(e)))
    return r, chunks


def expect_error(resp, status, code=None, param=None, what=""):
    """resp is an OpenAI-style JSON error: the given HTTP status and
    {"error": {"message": non-empty string, "type": string, "param",
    "code"}}; code and param are checked when given."""
    label = (what + ": ") if what else ""
    if resp.status != status:
        raise Fail("%sHTTP %d, want %d; body %s" % (label, resp.status, status, short(resp.body)))
    ctype = resp.header("Content-Type") or ""
    expect(ctype.startswith("application/json"),
           "%sHTTP %d error has Content-Type %r, want application/json" % (label, status, ctype))
    j = resp.json()
    expect(isinstance(j, dict) and isinstance(j.get("error"), dict),
           "%serror body lacks an \"error\" object: %s" % (label, short(resp.body)))
    e = j["error"]
    for k in ("message", "type", "param", "code"):
        expect(k in e, "%serror object lacks %r: %s" % (label, k, short(resp.body)))
    expect(isinstance(e["message"], str) and e["message"].strip(),
           "%serror message empty: %s" % (label, short(resp.body)))
    # core/api.h: "invalid_request_error" for every 4xx, "server_error" for 5xx
    want_type = "server_error" if status >= 500 else "invalid_request_error"
    eq(e["type"], want_type, label + "error.type")
    if code is not None:
        if e["code"] != code:
            raise Fail("%serror.code %r, want %r (message: %s)" % (label, e["code"], code, e["message"]))
    if param is not None:
        if e["param"] != param:
            raise Fail("%serror.param %r, want %r (message: %s)" % (label, e["param"], param, e["message"]))
    return e


def parse_metrics(text):
    """Prometheus text -> {sample name with labels: value}; comments and
    malformed lines are ignored (the format itself is checked separately)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)", line)
        if not m:
            continue
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            pass
    return out


def find_number(obj, key_re, path=""):
    """Depth-first search of a JSON value for numeric fields whose dotted
    path matches key_re: list of (path, value)."""
    hits = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = "%s.%s" % (path, k) if path else str(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and re.search(key_re, p, re.I):
                hits.append((p, v))
            else:
                hits.extend(find_number(v, key_re, p))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            hits.extend(find_number(v, key_re, "%s[%d]" % (path, i)))
    return hits


# ---- the daemon --------------------------------------------------------


class LoggedProcess:
    """What a test daemon with a log file and a "ready" line shares (radixd
    here, radix-router in tests/router/routertest.py): self.proc (Popen),
    self.log_path, and `what` naming it in failures."""

    what = "the process"

    def _find_ready(self):
        try:
            with open(self.log_path, "rb") as f:
                for raw in f:
                    line = raw.decode("utf-8", "replace")
                    if re.search(r"\bready\b", line):
                        return line.rstrip("\n")
        except OSError:
            pass
        return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self):
        if not self.alive():
            raise Fail("%s is not running (exit status %s)" % (self.what, self.proc.poll()))

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n=25):
        lines = self.log_text().splitlines()
        return "\n".join(lines[-n:]) if lines else "(empty)"


class Daemon(LoggedProcess):
    """One radixd process with its own INI and log in a temporary folder.

    sections: {"server": {...}, "scheduler": {...}, ...} merged over the
    defaults below (a value of None removes a key).  port: "free" (pick a
    free port and write it), 0 (let radixd choose; parsed from the ready
    line) or a number.  env: extra environment variables for radixd."""

    READY_RE = re.compile(r"https?://(\[[^\]]*\]|[^\s/:]+):(\d+)")
    what = "radixd"

    def __init__(self, model_name="tiny", sections=None, port="free", name=None, env=None):
        self.name = name or model_name
        self.env = dict(env or {})   # extra environment variables for radixd
        self.model_name = model_name
        self.model_path = model(model_name)
        self.ctx_len = ctx_len(model_name)
        self.dir = tempfile.mkdtemp(prefix="rx-itest-")
        self.log_path = os.path.join(self.dir, "radixd.log")
        self.ini_path = os.path.join(self.dir, "radixd.ini")
        self.port = free_port() if port == "free" else int(port)
        conf = {
            "server": {"host": "127.0.0.1", "port": str(self.port), "shutdown_timeout": "20s",
                       "served_model_name": "itest-model", "chat_template": "chatml"},
            "log": {"level": "info", "file": "-"},
            "plugins": {"path": os.environ["RX_PLUGIN_BUILD_DIR"]},
            "model": {"path": self.model_path},
            "kernels": {"backend": "cpu", "threads": "1"},
            "cache": {"kv_memory": "64MiB", "radix_cache": "true"},
            "scheduler": {"policy": "fcfs"},
        }
        for sec, kv in (sections or {}).items():
            conf.setdefault(sec, {})
            for k, v in kv.items():
                if v is None:
                    conf[sec].pop(k, None)
                else:
                    conf[sec][k] = str(v)
        self.conf = conf
        self.model_id = conf["server"].get("served_model_name")
        key = conf["server"].get("api_key")
        # what the helpers below (metrics, kv_usage, running_count) send
        self.auth = {"Authorization": "Bearer " + key} if key else {}
        with open(self.ini_path, "w") as f:
            for sec, kv in conf.items():
                f.write("[%s]\n" % sec)
                for k, v in kv.items():
                    f.write("%s = %s\n" % (k, v))
                f.write("\n")
        self.proc = None
        self.log_file = None
        self.ready_line = None
        self.known_pids = set()
        _daemons.append(self)

    # -- process control --

    def start(self, timeout=60):
        """Start radixd and wait for its ready line; Fail (with the log
        tail) when it exits first or takes longer than timeout."""
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen([os.environ["RADIXD"], "-c", self.ini_path],
                                     stdin=subprocess.DEVNULL, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, env=dict(_child_env(), **self.env),
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            # children seen while starting, so a failed start that leaves
            # them behind is caught (live_known_pids) and cleaned up
            self.remember_children()
            line = self._find_ready()
            if line is not None:
                break
            rc = self.proc.poll()
            if rc is not None:
                raise Fail("radixd exited with status %d before logging \"ready\"; log:\n%s"
                           % (rc, self.log_tail(30)))
            if time.monotonic() > deadline:
                raise Fail("radixd logged no \"ready\" line within %d s; log:\n%s"
                           % (timeout, self.log_tail(30)))
            time.sleep(0.05)
        self.ready_line = line
        m = self.READY_RE.search(line)
        if self.port == 0:
            expect(m is not None, "ready line names no http://HOST:PORT: %r" % line)
            self.port = int(m.group(2))
            expect(self.port != 0, "ready line names port 0: %r" % line)
        elif m is not None:
            eq(int(m.group(2)), self.port, "port in the ready line %r" % line)
        self.remember_children()
        return self

    def wait_healthy(self, timeout=15):
        """Wait until GET /health answers 200 (Fail otherwise).  Files
        that test something else call this after start(), so a slow first
        heartbeat is reported by test_api's health test alone."""
        last = [None]

        def ok():
            try:
                last[0] = self.get("/health", timeout=5)
            except OSError as e:
                last[0] = e
                return False
            return last[0].status == 200
        if not wait_until(ok, timeout, 0.05):
            raise Fail("GET /health not 200 within %d s of the ready line: %r" % (timeout, last[0]))
        return self

    def children(self, pid=None):
        """Direct children of pid (default radixd) from /proc."""
        pid = self.proc.pid if pid is None else pid
        kids = []
        try:
            for tid in os.listdir("/proc/%d/task" % pid):
                try:
                    with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                        kids.extend(int(x) for x in f.read().split())
                except OSError:
                    pass
        except OSError:
            pass
        return sorted(set(kids))

    def descendants(self):
        out = []
        todo = [self.proc.pid]
        while todo:
            p = todo.pop()
            for c in self.children(p):
                if c not in out:
                    out.append(c)
                    todo.append(c)
        return out

    def remember_children(self):
        """Record radixd's descendants so teardown can find orphans."""
        for p in self.descendants():
            self.known_pids.add((p, _starttime(p)))

    def live_known_pids(self):
        """Recorded descendants still alive (same pid and start time, so a
        recycled pid is not mistaken for ours); zombies count as gone."""
        out = []
        for p, st in self.known_pids:
            if st is not None and _starttime(p) == st and _state(p) not in (None, "Z", "X"):
                out.append(p)
        return out

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """Exit status, or None when still running after timeout s."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=30):
        """SIGTERM, wait; returns the exit status (SIGKILL after timeout:
        then returns None)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.remember_children()
            self.proc.send_signal(signal.SIGTERM)
        rc = self.wait(timeout)
        if rc is None:
            self._kill()
        return rc

    def _kill(self):
        if self.proc.poll() is None:
            self.remember_children()
            self.proc.kill()
            self.proc.wait()

    def close(self):
        """Tear down: stop radixd, kill any descendant left behind (only the
        pids recorded as ours), remove the temporary folder."""
        if self in _daemons:
            _daemons.remove(self)
        if self.proc is not None:
            if self.proc.poll() is None:
                self.stop(timeout=10)
            for p in self.live_known_pids():
                try:
                    os.kill(p, signal.SIGCONT)
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- HTTP helpers --

    def request(self, method, path, body=None, headers=None, timeout=60):
        return http_request(self.port, method, path, body, headers, timeout)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def ok_json(self, method, path, body=None, headers=None, timeout=60):
        """Request that must answer 200 with a JSON body; returns it."""
        r = self.request(method, path, body, headers, timeout)
        if r.status != 200:
            raise Fail("%s %s: HTTP %d %s" % (method, path, r.status, short(r.body)))
        return r.json()

    def stream(self, path, body, **kw):
        return stream_json(self.port, path, body, **kw)

    def metrics(self, headers=None):
        r = self.get("/metrics", headers=headers if headers is not None else self.auth)
        eq(r.status, 200, "GET /metrics status")
        return r.body.decode("utf-8")

    def kv_usage(self):
        """(where, value) of the KV pool usage the daemon reports: a numeric
        field of /get_server_info whose name says KV/token usage, else a
        /metrics gauge.  Fails naming what was there when none is found."""
        info = self.ok_json("GET", "/get_server_info", headers=self.auth)
        key_re = r"(kv|token).*(used|usage)|used_?tokens|token_usage"
        hits = [h for h in find_number(info, key_re) if "max" not in h[0].lower()
                and "total" not in h[0].lower()]
        if hits:
            return hits[0]
        m = parse_metrics(self.metrics())
        mh = [(k, v) for k, v in m.items()
              if re.match(r"radix_\w*(kv|token)\w*(used|usage)", k) and not re.search(r"_(bucket|sum|count|total)\b", k)]
        if mh:
            return sorted(mh)[0]
        raise Fail("no KV usage reported: /get_server_info numeric fields %s; /metrics names %s"
                   % (short([p for p, _ in find_number(info, r".")], 400),
                      short(sorted({re.sub(r"\{.*", "", k) for k in m}), 600)))

    def stat(self, key_re):
        """A number the daemon reports, fresh: the first numeric field of
        /get_server_info (answered by the scheduler on demand) whose dotted
        path matches key_re, else the first /metrics sample whose name
        does (/metrics may lag: it shows the scheduler's periodic stats).
        None when neither has it."""
        info = self.ok_json("GET", "/get_server_info", headers=self.auth)
        hits = find_number(info, key_re)
        if hits:
            return hits[0][1]
        m = parse_metrics(self.metrics())
        for k, v in sorted(m.items()):
            name = re.sub(r"\{.*", "", k)
            if name.startswith("radix_") and re.search(key_re, name) and \
                    not re.search(r"_(bucket|sum|count)$", name):
                return v
        return None

    def running_count(self):
        """Requests in the running batch, or None when not reported."""
        return self.stat(r"(^|[._])running$")


def _proc_stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    return s[s.rindex(")") + 2:].split()


def _starttime(pid):
    st = _proc_stat(pid)
    return st[19] if st else None


def _state(pid):
    st = _proc_stat(pid)
    return st[0] if st else None


def proc_name(pid):
    """comm and cmdline of a pid, for recognising radixd's children."""
    out = []
    for f in ("comm", "cmdline"):
        try:
            with open("/proc/%d/%s" % (pid, f), "rb") as fh:
                out.append(fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip())
        except OSError:
            out.append("")
    return " | ".join(out)


def in_thread(fn, *args, **kw):
    """Run fn in a daemon thread; returns a handle whose .result() joins
    and returns fn's value (or raises its exception)."""
    box = {}

    def body():
        try:
            box["v"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to result()
            box["e"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()

    class Handle:
        def result(self, timeout=120):
            t.join(timeout)
            if t.is_alive():
                raise Fail("background request still running after %d s" % timeout)
            if "e" in box:
                raise box["e"]
            return box["v"]

        def done(self):
            return not t.is_alive()

    return Handle()


def wait_until(cond, timeout, interval=0.1):
    """Poll cond() until it is truthy (returned) or timeout s pass (None)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)
