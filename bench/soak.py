#!/usr/bin/env python3
"""bench/soak.py -- the soak load driver and checker (issue 10, "Soak").

Drives a radix-router (or one radixd) at saturation for --duration seconds
with a mix of requests, samples the RSS of the given processes and the KV
usage of the given radixd workers every --interval seconds, and checks at
the end that nothing went wrong.  Python 3 standard library only.  Started
by bench/soak.sh, which launches the processes; usable on its own:

  bench/soak.py --url http://127.0.0.1:PORT [--worker URL ...]
      [--pid NAME=PID ...] [--duration S] [--concurrency N] [--seed S]
      [--warmup S] [--growth 0.05] [--json OUT]

The mix (per request, drawn from a seeded RNG by each client thread):
  stream    38%  POST /v1/completions, stream: true, read to [DONE]
  plain     22%  POST /v1/completions or /v1/chat/completions, not streamed
  abort     15%  a streamed request the client closes after 1-3 chunks
  bad       25%  bad input: broken JSON, a JSON array, a missing prompt,
                 max_tokens -5, temperature "hot", messages not a list,
                 n = 0, an unknown path; each must get a 4xx with a reason
Prompts are random words, half of them behind one of 8 shared 60-word
prefixes so that the workers' radix caches hit, grow and evict.

Outcome of every request sent (they must add up to the number sent):
  completed  200 and a complete answer (stream ended with [DONE] and a
             finish_reason; a body with choices)
  rejected   a 4xx with an error message, to a request meant to be bad
             (429 and 503 are counted here too, with their reason, when the
             router or a worker sheds load; they are reported)
  aborted    closed by this client mid-stream on purpose
  failed     anything else: a 5xx (other than a load-shedding 503), a
             2xx to bad input, a 4xx to good input, a truncated stream, a
             timeout, a refused or reset connection.  Every one is printed
             with its request.

Checks (exit 1 on any violation, 2 on bad arguments / nothing reachable):
  - failed == 0 and completed + rejected + aborted == sent;
  - every --pid still alive at the end;
  - RSS flat after warm-up: the largest RSS of each process in the last
    window (60 s, or a fifth of the run when shorter) is at most --growth
    (5%) above its largest in the first window after the warm-up (the
    first window too);
  - KV flat: the workers' KV slots held by requests (radix_kv_used_tokens
    minus radix_cache_tokens) never exceed the pool, and once the load
    has stopped and the workers are idle they come back to 0 (no slot
    leaked by an abort or an error); then POST /flush_cache brings
    radix_kv_used_tokens to 0;
  - with --worker: the workers' own counters (radix_requests_total) saw
    at least as many finished requests as this client completed.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse

WORDS = """the of and to in is was for that on with as by at from his her they
this which had not are but have one were all there been their has an when who
would more will other out some what time into only about two first than them
can new after over most made these also such years may where then many through
back well state now could world city during year since under before while both
school part people between family around three same later life another found
being among called river known national still common small large every house
water early without again local place government series become group second
high point public number several within power named often church album system
order country because south north east west music field along line members
team based light hand story women work great left right form history play
island game human court area final general person major given night open black
white green blue red short long little old young good best better full half
real true""".split()

MIX = (("stream", 38), ("plain", 22), ("abort", 15), ("bad", 25))

# (name, path, body bytes or a function of the model name): each must be a 4xx
BAD = (
    ("broken JSON", "/v1/completions", lambda m: b'{"model": "%s", "prompt": "x", ' % m.encode()),
    ("JSON array", "/v1/completions", lambda m: b'[1, 2, 3]'),
    ("missing prompt", "/v1/completions", lambda m: json.dumps({"model": m, "max_tokens": 4}).encode()),
    ("max_tokens -5", "/v1/completions",
     lambda m: json.dumps({"model": m, "prompt": "hello", "max_tokens": -5}).encode()),
    ("temperature \"hot\"", "/v1/completions",
     lambda m: json.dumps({"model": m, "prompt": "hello", "temperature": "hot"}).encode()),
    ("messages not a list", "/v1/chat/completions",
     lambda m: json.dumps({"model": m, "messages": "hello"}).encode()),
    ("n = 0", "/v1/completions", lambda m: json.dumps({"model": m, "prompt": "hello", "n": 0}).encode()),
    ("unknown path", "/v1/nothing-here", lambda m: b'{}'),
)


def die(msg):
    print("soak.py: " + msg, file=sys.stderr)
    sys.exit(2)


class Target:
    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname or not u.port:
            die("%r: want http://HOST:PORT" % url)
        self.url, self.host, self.port, self.timeout = url, u.hostname, u.port, timeout

    def conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def get(self, path, method="GET", body=None, timeout=10):
        c = self.conn(timeout)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            c.close()


def metrics(text):
    """Prometheus text -> {name{labels}: value} (samples only)."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def error_reason(raw):
    try:
        o = json.loads(raw)
    except ValueError:
        return None
    if isinstance(o, dict):
        e = o.get("error", o)
        if isinstance(e, dict) and e.get("message"):
            return str(e["message"])
        if isinstance(e, str) and e:
            return e
    return None


# ------------------------------------------------------------ requests ----

class Rec:
    __slots__ = ("rid", "kind", "what", "outcome", "status", "reason", "t")

    def __init__(self, rid, kind, what):
        self.rid, self.kind, self.what = rid, kind, what
        self.outcome, self.status, self.reason, self.t = None, None, None, time.time()

    def fail(self, why):
        self.outcome, self.reason = "failed", why

    def as_dict(self):
        return {"id": self.rid, "kind": self.kind, "request": self.what, "outcome": self.outcome,
                "status": self.status, "reason": self.reason}


def prompt(rng, prefixes):
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 80)))
    return (rng.choice(prefixes) + " " + words) if rng.random() < 0.5 else words


def do_good(t, model, rng, prefixes, rec, stream, abort):
    chat = not stream and rng.random() < 0.5
    mt = rng.randint(1, 24) if not abort else 64
    p = prompt(rng, prefixes)
    if chat:
        path = "/v1/chat/completions"
        body = {"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": mt}
    else:
        path = "/v1/completions"
        body = {"model": model, "prompt": p, "max_tokens": mt}
    body["temperature"] = rng.choice([0.0, 0.7])
    if stream:
        body["stream"] = True
    rec.what = "POST %s max_tokens=%d stream=%s%s prompt=%d words" % (
        path, mt, stream, " (client aborts)" if abort else "", len(p.split()))
    c = t.conn()
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        rec.status = r.status
        if r.status != 200:
            raw = r.read().decode("utf-8", "replace")
            reason = error_reason(raw)
            if r.status in (429, 503) and reason:
                rec.outcome, rec.reason = "rejected", "%d %s" % (r.status, reason)
            else:
                rec.fail("HTTP %d to a good request: %s" % (r.status, raw[:200]))
            return
        if not stream:
            raw = r.read().decode("utf-8", "replace")
            try:
                o = json.loads(raw)
                ok = isinstance(o.get("choices"), list) and o["choices"] and o["choices"][0].get("finish_reason")
            except (ValueError, AttributeError, TypeError):
                ok = False
            if ok:
                rec.outcome = "completed"
            else:
                rec.fail("200 without a complete answer: %s" % raw[:200])
            return
        stop_after = rng.randint(1, 3) if abort else None
        chunks, finish, done = 0, None, False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                ev = json.loads(payload)
            except ValueError:
                rec.fail("bad SSE data: %r" % payload[:120])
                return
            if isinstance(ev, dict) and "error" in ev:
                rec.fail("error event: %s" % json.dumps(ev["error"])[:200])
                return
            for ch in (ev.get("choices") or []) if isinstance(ev, dict) else []:
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                # the abort: shut the socket down under the response
                rec.outcome, rec.reason = "aborted", "closed by the client after %d chunks" % chunks
                return
        if abort and (done or finish):
            rec.outcome, rec.reason = "completed", "finished before the client could abort"
        elif done and finish:
            rec.outcome = "completed"
        else:
            rec.fail("stream ended without [DONE] and a finish_reason (%d chunks)" % chunks)
    except (OSError, http.client.HTTPException) as e:
        rec.fail("%s: %s" % (type(e).__name__, e))
    finally:
        c.close()


def do_bad(t, model, rng, rec):
    name, path, mk = rng.choice(BAD)
    rec.what = "POST %s (%s)" % (path, name)
    c = t.conn()
    try:
        c.request("POST", path, body=mk(model), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        rec.status = r.status
        raw = r.read().decode("utf-8", "replace")
        reason = error_reason(raw)
        if 400 <= r.status < 500 and reason:
            rec.outcome, rec.reason = "rejected", "%d %s" % (r.status, reason)
        elif 400 <= r.status < 500:
            rec.fail("HTTP %d without an error message: %s" % (r.status, raw[:200]))
        else:
            rec.fail("HTTP %d to bad input: %s" % (r.status, raw[:200]))
    except (OSError, http.client.HTTPException) as e:
        rec.fail("%s: %s" % (type(e).__name__, e))
    finally:
        c.close()


def client(t, model, seed, prefixes, deadline, recs, lock, counter):
    rng = random.Random(seed)
    kinds = [k for k, w in MIX for _ in range(w)]
    while time.time() < deadline:
        with lock:
            rid = counter[0]
            counter[0] += 1
        kind = rng.choice(kinds)
        rec = Rec(rid, kind, None)
        try:
            if kind == "bad":
                do_bad(t, model, rng, rec)
            else:
                do_good(t, model, rng, prefixes, rec, kind != "plain", kind == "abort")
        except Exception as e:          # a bug here is counted, not lost
            rec.fail("client error %s: %s" % (type(e).__name__, e))
        if rec.outcome is None:
            rec.fail("no outcome (driver bug)")
        with lock:
            recs.append(rec)
        if rec.outcome == "failed":
            print("soak.py: FAILED request #%d %s: %s" % (rec.rid, rec.what, rec.reason), file=sys.stderr)


# ------------------------------------------------------------ sampling ----

def router_metrics(t):
    try:
        st, text = t.get("/metrics", timeout=5)
        return metrics(text) if st == 200 else {}
    except (OSError, http.client.HTTPException):
        return {}


def sample(workers, pids, router=None):
    s = {"t": time.time(), "rss_kib": {n: rss_kib(p) for n, p in pids}, "kv": {}}
    if router is not None:
        # the cache_aware policy's approximate tree keeps request text (up to
        # max_tree_size, evicted every eviction_interval): the router's RSS
        # grows with it by design, so it is sampled next to the RSS
        m = router_metrics(router)
        s["router_tree"] = sum(v for k, v in m.items() if k.startswith("radix_router_tree_size"))
    for w in workers:
        try:
            st, text = w.get("/metrics", timeout=5)
            m = metrics(text) if st == 200 else {}
        except (OSError, http.client.HTTPException):
            m = {}
        s["kv"][w.url] = {k: m.get("radix_" + k) for k in
                          ("kv_used_tokens", "kv_total_tokens", "cache_tokens",
                           "requests_running", "requests_queued")}
    return s


def sampler(workers, pids, interval, stop, out, router):
    while True:
        out.append(sample(workers, pids, router))
        if stop.wait(interval):
            return


# ---------------------------------------------------------------- main ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="http://HOST:PORT of the router (or one radixd)")
    ap.add_argument("--worker", action="append", default=[], help="a radixd URL to sample (repeat)")
    ap.add_argument("--pid", action="append", default=[], help="NAME=PID of a process to watch (repeat)")
    ap.add_argument("--model", help="model name (default: GET /v1/models)")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load (300)")
    ap.add_argument("--concurrency", type=int, default=16, help="client threads (16)")
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between samples (3)")
    ap.add_argument("--warmup", type=float, help="seconds not judged for RSS (default: the window)")
    ap.add_argument("--growth", type=float, default=0.05, help="RSS growth allowed after warm-up (0.05)")
    ap.add_argument("--timeout", type=float, default=120.0, help="socket timeout per request, s (120)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the samples, counts and every non-completed request here")
    a = ap.parse_args()
    if a.duration <= 0 or a.concurrency < 1 or a.interval <= 0 or a.growth < 0:
        die("--duration, --interval > 0, --concurrency >= 1, --growth >= 0")
    pids = []
    for p in a.pid:
        n, _, v = p.partition("=")
        if not n or not v.isdigit():
            die("--pid %r: want NAME=PID" % p)
        pids.append((n, int(v)))
    t = Target(a.url, a.timeout)
    workers = [Target(u, a.timeout) for u in a.worker]
    model = a.model
    try:
        st, raw = t.get("/v1/models")
    except (OSError, http.client.HTTPException) as e:
        die("%s: unreachable: %s" % (a.url, e))
    if model is None:
        try:
            model = json.loads(raw)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            die("%s/v1/models answered %d without a model id" % (a.url, st))

    window = min(60.0, a.duration / 5)
    warmup = window if a.warmup is None else a.warmup
    prng = random.Random(a.seed)
    prefixes = [" ".join(prng.choice(WORDS) for _ in range(60)) for _ in range(8)]
    recs, lock, counter = [], threading.Lock(), [0]
    samples, stop = [], threading.Event()
    sth = threading.Thread(target=sampler, args=(workers, pids, a.interval, stop, samples, t), daemon=True)
    t0 = time.time()
    sth.start()
    deadline = t0 + a.duration
    ths = [threading.Thread(target=client, args=(t, model, a.seed * 1000 + i, prefixes, deadline,
                                                 recs, lock, counter), daemon=True)
           for i in range(a.concurrency)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(a.duration + 2 * a.timeout + 30)
    t_load = time.time() - t0
    stop.set()
    sth.join()
    violations = []
    if any(th.is_alive() for th in ths):
        violations.append("client threads still running %.0f s after the deadline" % (a.timeout + 30))

    # ---- accounting
    sent = counter[0]
    by = {}
    for r in recs:
        by.setdefault(r.outcome, []).append(r)
    n = {k: len(by.get(k, [])) for k in ("completed", "rejected", "aborted", "failed")}
    if len(recs) != sent or sum(n.values()) != sent:
        violations.append("accounting: sent %d, recorded %d, outcomes add up to %d"
                          % (sent, len(recs), sum(n.values())))
    if n["failed"]:
        violations.append("%d requests failed (each printed above)" % n["failed"])
    reasons = {}
    for r in by.get("rejected", []):
        key = "%s: %s" % (r.what.split("(", 1)[-1].rstrip(")") if r.kind == "bad" else r.kind, r.reason)
        reasons[key] = reasons.get(key, 0) + 1
    shed = sum(1 for r in by.get("rejected", []) if r.kind != "bad")
    kinds = {k: sum(1 for r in recs if r.kind == k) for k, _ in MIX}

    # ---- processes alive
    for name, pid in pids:
        if not alive(pid):
            violations.append("process %s (pid %d) is gone" % (name, pid))

    # ---- idle KV: wait for the workers to drain, then check the slots
    kv_end = {}
    for w in workers:
        end = time.time() + 30
        s = None
        while time.time() < end:
            s = sample([w], [])["kv"][w.url]
            if s["requests_running"] == 0 and s["requests_queued"] == 0:
                break
            time.sleep(0.5)
        time.sleep(1.0)                 # the stats reach the HTTP process with a small delay
        s = sample([w], [])["kv"][w.url]
        held = None if s["kv_used_tokens"] is None else s["kv_used_tokens"] - (s["cache_tokens"] or 0)
        try:
            fst, _ = w.get("/flush_cache", method="POST", body=b"{}")
        except (OSError, http.client.HTTPException):
            fst = None
        time.sleep(1.0)
        f = sample([w], [])["kv"][w.url]
        kv_end[w.url] = {"idle": s, "held_by_requests": held, "flush_status": fst, "after_flush": f}
        if s["kv_used_tokens"] is None:
            violations.append("%s: no radix_kv_used_tokens in /metrics" % w.url)
            continue
        if s["requests_running"] or s["requests_queued"]:
            violations.append("%s: still %s running / %s queued 30 s after the load"
                              % (w.url, s["requests_running"], s["requests_queued"]))
        if held != 0:
            violations.append("%s: idle, yet %s KV slots held outside the radix cache (leak)" % (w.url, held))
        if fst != 200 or f["kv_used_tokens"] != 0:
            violations.append("%s: after POST /flush_cache (%s) radix_kv_used_tokens = %s, want 0"
                              % (w.url, fst, f["kv_used_tokens"]))
    for s in samples:
        for u, k in s["kv"].items():
            if k["kv_used_tokens"] is not None and k["kv_total_tokens"] and k["kv_used_tokens"] > k["kv_total_tokens"]:
                violations.append("%s: KV used %d > pool %d" % (u, k["kv_used_tokens"], k["kv_total_tokens"]))

    # ---- the workers' own counters
    worker_finished, worker_outcomes = None, {}
    if workers:
        worker_finished = 0
        for w in workers:
            try:
                st, text = w.get("/metrics")
                m = metrics(text)
                worker_finished += int(m.get('radix_requests_total{outcome="finished"}', 0))
                for o in ("finished", "aborted", "rejected", "disconnected"):
                    worker_outcomes[o] = worker_outcomes.get(o, 0) + int(
                        m.get('radix_requests_total{outcome="%s"}' % o, 0))
            except (OSError, http.client.HTTPException):
                violations.append("%s: /metrics unreachable at the end" % w.url)
        if worker_finished < n["completed"]:
            violations.append("the workers count %d finished requests, this client completed %d"
                              % (worker_finished, n["completed"]))

    # ---- RSS / KV: first window after warm-up vs last window
    def win(lo, hi):
        return [s for s in samples if lo <= s["t"] - t0 < hi]
    first, last = win(warmup, warmup + window), win(t_load - window, t_load + 1)
    if not first or not last:
        violations.append("too few samples to judge RSS (%d): run longer" % len(samples))
    rss = {}
    for name, _ in pids:
        f = [s["rss_kib"][name] for s in first if s["rss_kib"].get(name)]
        l = [s["rss_kib"][name] for s in last if s["rss_kib"].get(name)]
        if not f or not l:
            continue
        g = (max(l) - max(f)) / max(f)
        rss[name] = {"first_max_kib": max(f), "last_max_kib": max(l), "growth": g,
                     "start_kib": samples[0]["rss_kib"].get(name)}
        if g > a.growth:
            violations.append("RSS of %s grew %.1f%% (%d -> %d KiB) after warm-up, > %.0f%%"
                              % (name, 100 * g, max(f), max(l), 100 * a.growth))
    tree = {"first_max": max([s.get("router_tree", 0) for s in first] or [0]),
            "last_max": max([s.get("router_tree", 0) for s in last] or [0])}
    rm = router_metrics(t)
    router_status = {k.split('"')[1]: int(v) for k, v in rm.items() if k.startswith("radix_router_requests_total{")}
    kv = {}
    for w in workers:
        def col(ss, key):
            return [s["kv"][w.url][key] for s in ss if s["kv"][w.url][key] is not None]
        def held(ss):
            return [s["kv"][w.url]["kv_used_tokens"] - (s["kv"][w.url]["cache_tokens"] or 0)
                    for s in ss if s["kv"][w.url]["kv_used_tokens"] is not None]
        kv[w.url] = {"total": (col(samples, "kv_total_tokens") or [None])[0],
                     "first_used_max": max(col(first, "kv_used_tokens") or [0]),
                     "last_used_max": max(col(last, "kv_used_tokens") or [0]),
                     "first_held_max": max(held(first) or [0]), "last_held_max": max(held(last) or [0]),
                     "first_cache_mean": statistics.fmean(col(first, "cache_tokens") or [0]),
                     "last_cache_mean": statistics.fmean(col(last, "cache_tokens") or [0])}

    # ---- report
    print("soak: %.0f s of load at concurrency %d against %s (%s), %d samples every %.0f s"
          % (t_load, a.concurrency, a.url, model, len(samples), a.interval))
    print("soak: sent %d (%s) = completed %d + rejected %d + aborted %d + failed %d; %.1f req/s"
          % (sent, ", ".join("%s %d" % kv_ for kv_ in kinds.items()), n["completed"], n["rejected"],
             n["aborted"], n["failed"], sent / t_load))
    if shed:
        print("soak: %d good requests shed with 429/503" % shed)
    for k, v in sorted(reasons.items(), key=lambda kv_: -kv_[1]):
        print("soak:   rejected x%d  %s" % (v, k))
    if worker_finished is not None:
        print("soak: the workers' radix_requests_total: %s" % ", ".join(
            "%s %d" % kv_ for kv_ in worker_outcomes.items()))
    for name, r in rss.items():
        print("soak: RSS %-14s start %7s KiB, first window max %7d KiB, last window max %7d KiB: %+.1f%%"
              % (name, r["start_kib"], r["first_max_kib"], r["last_max_kib"], 100 * r["growth"]))
    print("soak: the router's approximate tree (cache_aware): %d -> %d characters (first vs last window)"
          % (tree["first_max"], tree["last_max"]))
    print("soak: the router's radix_router_requests_total by status: %s (sum %d)"
          % (", ".join("%s %d" % kv_ for kv_ in sorted(router_status.items())), sum(router_status.values())))
    for u, k in kv.items():
        e = kv_end.get(u, {})
        print("soak: KV %s pool %s: used max %d -> %d, held by requests max %d -> %d, cache mean %.0f -> %.0f; "
              "idle: held %s, after flush used %s"
              % (u, k["total"], k["first_used_max"], k["last_used_max"], k["first_held_max"], k["last_held_max"],
                 k["first_cache_mean"], k["last_cache_mean"], e.get("held_by_requests"),
                 (e.get("after_flush") or {}).get("kv_used_tokens")))
    print("soak: windows: warm-up %.0f s, compared %.0f-%.0f s vs the last %.0f s"
          % (warmup, warmup, warmup + window, window))
    for v in violations:
        print("soak: VIOLATION: " + v)
    print("soak: %s" % ("PASS" if not violations else "FAIL (%d violations)" % len(violations)))
    if a.json:
        doc = {"duration_s": t_load, "concurrency": a.concurrency, "sent": sent, "outcomes": n,
               "kinds": kinds, "rejected_reasons": reasons, "worker_finished": worker_finished,
               "worker_outcomes": worker_outcomes, "router_tree": tree,
               "router_status": router_status, "rss": rss, "kv": kv, "kv_end": kv_end, "violations": violations, "samples": samples,
               "not_completed": [r.as_dict() for r in recs if r.outcome != "completed"]}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 1 if violations else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
