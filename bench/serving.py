#!/usr/bin/env python3
"""bench/serving.py -- a serving load generator in the shape of SGLang's
bench_serving: it drives an OpenAI-compatible server (radixd, llama.cpp's
llama-server, SGLang, vLLM) with streaming /v1/completions requests and reports
TTFT, ITL, TPOT, end-to-end latency, request and token throughput and the
prefix-cache hit rate.  Python 3 standard library only (threads + http.client).

usage:
  bench/serving.py --base-url http://127.0.0.1:PORT [--model NAME]
      (--concurrency N | --request-rate R [--max-concurrency N])
      [--num-prompts M] [--seed S] [--dataset random|shared-prefix|multi-turn]
      [--input-len I] [--output-len O]                  (random; multi-turn)
      [--num-groups G --prefix-len P --suffix-len X]    (shared-prefix)
      [--gsp-groups G --gsp-prompts-per-group K --gsp-system-len P
       --gsp-question-len X --gsp-output-len O]         (the same, SGLang's names)
      [--turns T]                                       (multi-turn)
      [--json OUT] [--warmup N] [--tokenize auto|off] [--extra-body JSON]

Load:
  --concurrency N   closed loop: N workers, each sends its next request when
                    the previous one finished (the default, N = 1).
  --request-rate R  open loop: requests arrive as a Poisson process of R per
                    second (exponential gaps from a seeded RNG); inf = all at
                    once.  --max-concurrency caps the requests in flight.
  A "job" is one request, or for multi-turn one whole conversation (its turns
  run one after the other, since each turn re-sends the previous answer).

Datasets (prompts are random English words, built before the clock starts;
when the server has POST /tokenize -- llama-server's {"content"} or radixd's
and SGLang's {"prompt"} shape -- each piece is trimmed until it tokenizes to
the requested length, otherwise a words-per-token estimate is used):
  random         M prompts of about --input-len tokens, --output-len out.
  shared-prefix  --num-groups system prompts of --prefix-len tokens, each
                 shared by M / G requests with distinct --suffix-len suffixes,
                 shuffled with the seed (SGLang's generated-shared-prefix
                 dataset; --gsp-* are its option names: --gsp-prompts-per-
                 group K means M = G x K).
  multi-turn     M conversations of --turns turns; turn k sends turn k-1's
                 prompt + its answer + --input-len new tokens, so the shared
                 prefix grows (a prefix cache that keeps generated tokens
                 hits it).

Every request asks for exactly --output-len tokens ("ignore_eos": true,
"max_tokens"), greedy by default (--temperature 0), with stream_options.
include_usage so the server's own token counts are used when it sends them.

Per request: TTFT = time to the first chunk with text; ITL = the gaps between
text chunks; TPOT = (e2e - TTFT) / (output tokens - 1); output tokens from
usage.completion_tokens, else the number of text chunks.  Cache hit rate =
sum(usage.prompt_tokens_details.cached_tokens) / sum(usage.prompt_tokens);
when a server sends no cached_tokens but llama.cpp's "timings" it is
sum(cache_n) / sum(cache_n + prompt_n); else n/a.

A failed request (HTTP status other than 200, an error event, a stream that
ends without [DONE] or a finish_reason, a timeout, a refused connection) is
counted and its message reported; the run goes on.  Exit status: 0 when every
request succeeded, 1 when some failed, 2 on bad arguments or an unreachable
server.
"""

import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse

# Common English words: each is one or two tokens in BPE vocabularies, so a
# prompt's token count is close to its word count and easy to trim.
WORDS = """the of and to in is was for that on with as by at from his her
they this which had not are but have one were all there been their has an
when who would more will other out some what time into only about two first
than them can new after over most made these also such years may where then
many through back well state now could world city during year since under
before while both school part people between would family around three same
later life another found being around among many called river known national
during still common small large every house water early without again local
place government series become group found second high point public number
several within power named often church album system order known country
because south north east west music field along line members team based light
under hand story order women work great left right form early history field
play island game human court area final general person major given night open
black white green blue red small short long little old young good best better
new full half real true""".split()

RNG_WORDS = sorted(set(WORDS))


def die(msg):
    print("serving.py: " + msg, file=sys.stderr)
    sys.exit(2)


# --------------------------------------------------------------- HTTP ----

class Server:
    """Where to send requests; one new connection per request (localhost: the
    connect costs microseconds and nothing is shared between threads)."""

    def __init__(self, base_url, timeout, api_key=None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            die("--base-url %r: want http://HOST:PORT" % base_url)
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def conn(self):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def call(self, method, path, body=None):
        """A small non-streaming call: (status, parsed JSON or None, raw text).
        Raises OSError / http.client errors when the server is unreachable."""
        c = self.conn()
        try:
            data = None if body is None else json.dumps(body).encode()
            c.request(method, self.prefix + path, body=data, headers=self.headers)
            r = c.getresponse()
            raw = r.read().decode("utf-8", "replace")
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            return r.status, obj, raw
        finally:
            c.close()


# ---------------------------------------------------------- tokenizing ----

class Tokenizer:
    """Counts tokens through the server's /tokenize, whichever of the two
    common request shapes it speaks; falls back to an estimate."""

    PROBE = "the quick brown fox jumps over the lazy dog"

    def __init__(self, server, mode):
        self.server = server
        self.shape = None           # "content" (llama.cpp) or "prompt" (radixd, SGLang)
        self.per_word = 1.3         # tokens per word until measured
        if mode == "off":
            return
        for shape in ("content", "prompt"):
            try:
                st, obj, _ = server.call("POST", "/tokenize", {shape: self.PROBE})
            except (OSError, http.client.HTTPException):
                break
            # llama-server answers {"prompt": ...} with 200 and no tokens, so
            # an empty list means "not this shape", not "zero tokens".
            if st == 200 and isinstance(obj, dict) and isinstance(obj.get("tokens"), list) \
                    and obj["tokens"]:
                self.shape = shape
                self.per_word = len(obj["tokens"]) / len(self.PROBE.split())
                break

    def count(self, text):
        if self.shape is None:
            return int(round(len(text.split()) * self.per_word))
        st, obj, raw = self.server.call("POST", "/tokenize", {self.shape: text})
        if st != 200 or not isinstance(obj, dict) or not isinstance(obj.get("tokens"), list):
            raise RuntimeError("POST /tokenize answered %d: %s" % (st, raw[:200]))
        return len(obj["tokens"])

    def text(self, rng, n, lead=""):
        """Random words that, appended to lead, add about n tokens; returns
        (text, measured tokens of lead + text or an estimate)."""
        if n <= 0:
            return "", (self.count(lead) if lead else 0)
        base = self.count(lead) if lead else 0
        words = [rng.choice(RNG_WORDS) for _ in range(max(1, int(n / self.per_word)))]

        def measure():
            return self.count(lead + " " + " ".join(words) if lead else " ".join(words)) - base

        got = measure()
        for _ in range(12):
            if got == n or self.shape is None:
                break
            if got < n:
                words.extend(rng.choice(RNG_WORDS) for _ in range(max(1, int((n - got) / self.per_word))))
            else:
                drop = max(1, int((got - n) / self.per_word))
                del words[max(1, len(words) - drop):]
            got = measure()
        # land at or just under n: a word is one or two tokens
        while got > n and len(words) > 1 and self.shape is not None:
            words.pop()
            got = measure()
        return " ".join(words), base + got


# ------------------------------------------------------------ datasets ----

class Job:
    """One unit of load: a list of turns (one for single requests).  Each
    turn is the new text; turn k > 0 is appended to the previous prompt and
    answer."""

    def __init__(self, jid, turns, expect_in, group=None):
        self.jid = jid
        self.turns = turns
        self.expect_in = expect_in      # tokens of each turn's prompt as built (first turn exact)
        self.group = group


def build_random(args, tok, rng):
    jobs = []
    for i in range(args.num_prompts):
        text, n = tok.text(rng, args.input_len)
        jobs.append(Job(i, [text], [n]))
    return jobs


def build_shared_prefix(args, tok, rng):
    prefixes = []
    for g in range(args.num_groups):
        # Random words from the first one on: groups share no prefix.
        text, n = tok.text(rng, args.prefix_len)
        prefixes.append((text, n))
    jobs = []
    for i in range(args.num_prompts):
        g = i % args.num_groups
        ptext, _ = prefixes[g]
        stext, n = tok.text(rng, args.suffix_len, lead=ptext)
        jobs.append(Job(i, [ptext + " " + stext], [n], group=g))
    rng.shuffle(jobs)
    for i, j in enumerate(jobs):
        j.jid = i
    return jobs


def build_multi_turn(args, tok, rng):
    jobs = []
    for i in range(args.num_prompts):
        turns, first = [], None
        for t in range(args.turns):
            text, n = tok.text(rng, args.input_len)
            turns.append(text)
            first = n if t == 0 else first
        # later turns' lengths depend on the answers: the server's usage tells
        jobs.append(Job(i, turns, [first] + [None] * (args.turns - 1)))
    return jobs


# ----------------------------------------------------------- one request ----

class Result:
    __slots__ = ("job", "turn", "group", "ok", "error", "start", "ttft", "e2e", "itl",
                 "chunks", "text", "out_tokens", "out_source", "prompt_tokens", "cached_tokens",
                 "cache_n", "prompt_n", "expect_in", "finish_reason")

    def __init__(self, job, turn, group, expect_in):
        self.job, self.turn, self.group, self.expect_in = job, turn, group, expect_in
        self.ok = False
        self.error = None
        self.start = 0.0
        self.ttft = None
        self.e2e = None
        self.itl = []
        self.chunks = 0
        self.text = []
        self.out_tokens = 0
        self.out_source = "chunks"
        self.prompt_tokens = None
        self.cached_tokens = None
        self.cache_n = None
        self.prompt_n = None
        self.finish_reason = None

    def record(self, t0):
        return {
            "job": self.job, "turn": self.turn, "group": self.group, "ok": self.ok,
            "error": self.error, "start_s": self.start - t0 if self.start else None,
            "ttft_ms": ms(self.ttft), "e2e_ms": ms(self.e2e),
            "tpot_ms": ms(tpot(self)), "itl_ms": [round(x * 1e3, 3) for x in self.itl],
            "chunks": self.chunks, "output_tokens": self.out_tokens,
            "output_tokens_from": self.out_source, "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_built": self.expect_in, "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
        }


def ms(x):
    return None if x is None else round(x * 1e3, 3)


def tpot(r):
    if not r.ok or r.ttft is None or r.out_tokens < 2:
        return None
    return (r.e2e - r.ttft) / (r.out_tokens - 1)


def send(server, args, prompt, res):
    """POST /v1/completions with stream: true and parse the SSE stream into
    res.  Never raises: every failure lands in res.error."""
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.output_len,
            "temperature": args.temperature, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    body.update(args.extra_body)
    data = json.dumps(body).encode()
    c = None
    try:
        c = server.conn()
        res.start = time.perf_counter()
        c.request("POST", server.prefix + "/v1/completions", body=data, headers=server.headers)
        r = c.getresponse()
        if r.status != 200:
            raw = r.read().decode("utf-8", "replace").strip()
            res.error = "HTTP %d: %s" % (r.status, short_error(raw))
            return
        done = False
        last = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line or line.startswith(b":") or not line.startswith(b"data:"):
                continue        # blank separators, comments, "event:" lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            try:
                ev = json.loads(payload)
            except ValueError:
                res.error = "bad SSE data: %r" % payload[:120]
                return
            if not isinstance(ev, dict):
                res.error = "bad SSE data: %r" % payload[:120]
                return
            if "error" in ev:
                res.error = "error event: %s" % short_error(json.dumps(ev["error"]))
                return
            text = ""
            for ch in ev.get("choices") or []:
                t = ch.get("text")
                if t is None:
                    t = (ch.get("delta") or {}).get("content")
                if t:
                    text += t
                if ch.get("finish_reason"):
                    res.finish_reason = ch["finish_reason"]
            if text:
                if res.ttft is None:
                    res.ttft = now - res.start
                else:
                    res.itl.append(now - last)
                last = now
                res.chunks += 1
                res.text.append(text)
            u = ev.get("usage")
            if isinstance(u, dict):
                if isinstance(u.get("completion_tokens"), int):
                    res.out_tokens = u["completion_tokens"]
                    res.out_source = "usage"
                if isinstance(u.get("prompt_tokens"), int):
                    res.prompt_tokens = u["prompt_tokens"]
                d = u.get("prompt_tokens_details")
                if isinstance(d, dict) and isinstance(d.get("cached_tokens"), int):
                    res.cached_tokens = d["cached_tokens"]
            tm = ev.get("timings")
            if isinstance(tm, dict):     # llama.cpp's own counters
                if isinstance(tm.get("cache_n"), int):
                    res.cache_n = tm["cache_n"]
                if isinstance(tm.get("prompt_n"), int):
                    res.prompt_n = tm["prompt_n"]
        end = time.perf_counter()
        if not done and res.finish_reason is None:
            res.error = "stream ended before [DONE] (%d chunks)" % res.chunks
            return
        if res.ttft is None:
            res.error = "no text in the stream"
            return
        res.e2e = end - res.start
        if res.out_source != "usage":
            res.out_tokens = res.chunks
        res.ok = True
    except (OSError, http.client.HTTPException) as e:
        res.error = "%s: %s" % (type(e).__name__, e)
    except Exception as e:          # a bug here must not stop the other threads
        res.error = "client error %s: %s" % (type(e).__name__, e)
    finally:
        if c is not None:
            c.close()


def short_error(raw):
    try:
        o = json.loads(raw)
        if isinstance(o, dict) and isinstance(o.get("error"), dict):
            o = o["error"]
        if isinstance(o, dict) and o.get("message"):
            return str(o["message"])[:200]
    except ValueError:
        pass
    return raw[:200]


def run_job(server, args, job, out, lock):
    """One job: its turns in order; a failed turn ends the conversation (the
    next turn would need its answer) and the skipped turns are counted."""
    prompt = ""
    for t, new in enumerate(job.turns):
        prompt = new if t == 0 else prompt + "\n" + new
        res = Result(job.jid, t, job.group, job.expect_in[t])
        send(server, args, prompt, res)
        with lock:
            out.append(res)
        if not res.ok:
            for k in range(t + 1, len(job.turns)):
                s = Result(job.jid, k, job.group, None)
                s.error = "skipped: turn %d of this conversation failed" % t
                with lock:
                    out.append(s)
            return
        prompt += "".join(res.text)


# --------------------------------------------------------------- load ----

def run_load(server, args, jobs):
    out, lock = [], threading.Lock()
    t0 = time.perf_counter()
    if args.request_rate is None:
        queue = list(reversed(jobs))

        def worker():
            while True:
                with lock:
                    if not queue:
                        return
                    job = queue.pop()
                run_job(server, args, job, out, lock)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(args.concurrency, len(jobs)))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    else:
        rng = random.Random(args.seed ^ 0x5EED)
        cap = threading.BoundedSemaphore(args.max_concurrency) if args.max_concurrency else None
        threads = []
        next_at = t0

        def one(job):
            try:
                run_job(server, args, job, out, lock)
            finally:
                if cap:
                    cap.release()

        for job in jobs:
            now = time.perf_counter()
            if next_at > now:
                time.sleep(next_at - now)
            if cap:
                cap.acquire()
            th = threading.Thread(target=one, args=(job,), daemon=True)
            th.start()
            threads.append(th)
            if not math.isinf(args.request_rate):
                next_at += rng.expovariate(args.request_rate)
        for th in threads:
            th.join()
    t1 = time.perf_counter()
    return out, t0, t1


# -------------------------------------------------------------- report ----

def dist(v):
    """mean, median, p99 (linear interpolation), std, min, max in ms."""
    if not v:
        return None
    s = sorted(v)
    k = (len(s) - 1) * 0.99
    lo, hi = int(math.floor(k)), int(math.ceil(k))
    p99 = s[lo] + (s[hi] - s[lo]) * (k - lo)
    return {"mean": 1e3 * statistics.fmean(s), "median": 1e3 * statistics.median(s),
            "p99": 1e3 * p99, "std": 1e3 * (statistics.pstdev(s) if len(s) > 1 else 0.0),
            "min": 1e3 * s[0], "max": 1e3 * s[-1]}


def summarize(args, results, t0, t1):
    ok = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]
    dur = t1 - t0
    errors = {}
    for r in bad:
        errors[r.error] = errors.get(r.error, 0) + 1
    in_tok = sum(r.prompt_tokens if r.prompt_tokens is not None else (r.expect_in or 0) for r in ok)
    out_tok = sum(r.out_tokens for r in ok)
    with_cached = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    with_timings = [r for r in ok if r.cache_n is not None and r.prompt_n is not None]
    if with_cached:
        hit = sum(r.cached_tokens for r in with_cached) / max(1, sum(r.prompt_tokens for r in with_cached))
        hit_src = "usage.prompt_tokens_details.cached_tokens (%d of %d requests)" % (len(with_cached), len(ok))
    elif with_timings:
        hit = sum(r.cache_n for r in with_timings) / max(1, sum(r.cache_n + r.prompt_n for r in with_timings))
        hit_src = "timings.cache_n (%d of %d requests)" % (len(with_timings), len(ok))
    else:
        hit, hit_src = None, "n/a (the server reports no cached tokens)"
    per_turn = None
    if args.dataset == "multi-turn":
        per_turn = []
        for t in range(args.turns):
            rt = [r for r in ok if r.turn == t]
            per_turn.append({"turn": t, "completed": len(rt),
                             "ttft_ms": dist([r.ttft for r in rt]),
                             "prompt_tokens_mean": statistics.fmean([r.prompt_tokens for r in rt])
                             if rt and all(r.prompt_tokens is not None for r in rt) else None,
                             "cached_tokens_mean": statistics.fmean([r.cached_tokens for r in rt])
                             if rt and all(r.cached_tokens is not None for r in rt) else None})
    return {
        "completed": len(ok), "failed": len(bad),
        "errors": [{"error": k, "count": v} for k, v in sorted(errors.items(), key=lambda kv: -kv[1])],
        "short_outputs": sum(1 for r in ok if r.out_tokens < args.output_len),
        "output_tokens_from": sorted(set(r.out_source for r in ok)),
        "duration_s": dur,
        "total_input_tokens": in_tok, "total_output_tokens": out_tok,
        "request_throughput": len(ok) / dur if dur > 0 else None,
        "input_throughput": in_tok / dur if dur > 0 else None,
        "output_throughput": out_tok / dur if dur > 0 else None,
        "total_throughput": (in_tok + out_tok) / dur if dur > 0 else None,
        # Little's law: the mean number of requests in flight
        "concurrency_observed": sum(r.e2e for r in ok) / dur if dur > 0 else None,
        "ttft_ms": dist([r.ttft for r in ok]),
        "itl_ms": dist([x for r in ok for x in r.itl]),
        "tpot_ms": dist([tpot(r) for r in ok if tpot(r) is not None]),
        "e2e_ms": dist([r.e2e for r in ok]),
        "cache_hit_rate": hit, "cache_hit_from": hit_src,
        "per_turn": per_turn,
    }


def fmt(x, nd=2):
    return "n/a" if x is None else "%.*f" % (nd, x)


def print_table(args, s, f=sys.stdout):
    load = ("concurrency %d (closed loop)" % args.concurrency if args.request_rate is None else
            "Poisson %s req/s%s" % (args.request_rate, ", max %d in flight" % args.max_concurrency
                                    if args.max_concurrency else ""))
    w = 44
    print("=" * 20 + " Serving Benchmark Result " + "=" * 20, file=f)
    rows = [
        ("Base URL", args.base_url), ("Dataset", args.dataset), ("Load", load),
        ("Successful requests", s["completed"]), ("Failed requests", s["failed"]),
        ("Benchmark duration (s)", fmt(s["duration_s"])),
        ("Total input tokens", s["total_input_tokens"]),
        ("Total output tokens", s["total_output_tokens"]),
        ("Request throughput (req/s)", fmt(s["request_throughput"], 3)),
        ("Input token throughput (tok/s)", fmt(s["input_throughput"])),
        ("Output token throughput (tok/s)", fmt(s["output_throughput"])),
        ("Total token throughput (tok/s)", fmt(s["total_throughput"])),
        ("Concurrency (mean in flight)", fmt(s["concurrency_observed"])),
        ("Cache hit rate", "n/a" if s["cache_hit_rate"] is None else "%.1f%%" % (100 * s["cache_hit_rate"])),
    ]
    for k, v in rows:
        print("%-*s%s" % (w, k + ":", v), file=f)
    for key, title in (("e2e_ms", "End-to-End Latency"), ("ttft_ms", "Time to First Token"),
                       ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                       ("itl_ms", "Inter-Token Latency")):
        print("-" * 20 + " " + title + " " + "-" * max(0, 44 - len(title)), file=f)
        d = s[key] or {}
        for stat in ("mean", "median", "p99"):
            print("%-*s%s" % (w, "%s %s (ms):" % (stat.capitalize(), key[:-3].upper()),
                              fmt(d.get(stat))), file=f)
    if s["per_turn"]:
        print("-" * 20 + " Per turn " + "-" * 36, file=f)
        for t in s["per_turn"]:
            d = t["ttft_ms"] or {}
            print("turn %-3d mean TTFT %10s ms   prompt tokens %8s   cached %8s" %
                  (t["turn"] + 1, fmt(d.get("mean")), fmt(t["prompt_tokens_mean"], 0),
                   fmt(t["cached_tokens_mean"], 0)), file=f)
    if s["short_outputs"]:
        print("WARNING: %d requests returned fewer than %d output tokens (ignore_eos not honoured?)"
              % (s["short_outputs"], args.output_len), file=f)
    for e in s["errors"][:10]:
        print("error x%d: %s" % (e["count"], e["error"]), file=f)
    print("=" * 66, file=f)


# ---------------------------------------------------------------- main ----

def positive_int(v):
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not an integer" % v)
    if n < 1:
        raise argparse.ArgumentTypeError("%r must be >= 1" % v)
    return n


def nonneg_int(v):
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not an integer" % v)
    if n < 0:
        raise argparse.ArgumentTypeError("%r must be >= 0" % v)
    return n


def rate(v):
    try:
        r = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % v)
    if not r > 0:
        raise argparse.ArgumentTypeError("%r must be > 0 (or inf)" % v)
    return r


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="http://HOST:PORT of the server")
    p.add_argument("--backend", default="openai", choices=["openai"],
                   help="API: openai = POST /v1/completions with stream: true")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--concurrency", type=positive_int, help="closed loop with N workers (default 1)")
    g.add_argument("--request-rate", type=rate, help="Poisson arrivals, R requests/s (inf = all at once)")
    p.add_argument("--max-concurrency", type=positive_int, help="with --request-rate: most jobs in flight")
    p.add_argument("--num-prompts", type=positive_int,
                   help="requests (conversations for multi-turn); default 16")
    p.add_argument("--seed", type=int, default=1, help="RNG seed for prompts and arrivals (default 1)")
    p.add_argument("--dataset", default="random", choices=["random", "shared-prefix", "multi-turn"])
    p.add_argument("--input-len", type=positive_int, default=128,
                   help="prompt tokens (random), new tokens per turn (multi-turn); default 128")
    p.add_argument("--output-len", type=positive_int, default=64, help="tokens generated per request (64)")
    p.add_argument("--num-groups", type=positive_int, default=4, help="shared-prefix: system prompts (4)")
    p.add_argument("--prefix-len", type=positive_int, default=512, help="shared-prefix: tokens per system prompt (512)")
    p.add_argument("--suffix-len", type=positive_int, default=32, help="shared-prefix: tokens per question (32)")
    p.add_argument("--turns", type=positive_int, default=4, help="multi-turn: turns per conversation (4)")
    # SGLang bench_serving's names for its generated-shared-prefix dataset
    # (--gsp-num-groups etc. there); each sets the option named in its help.
    p.add_argument("--gsp-groups", type=positive_int, help="shared-prefix: = --num-groups")
    p.add_argument("--gsp-prompts-per-group", type=positive_int,
                   help="shared-prefix: requests per group; sets --num-prompts to groups x this")
    p.add_argument("--gsp-system-len", type=positive_int, help="shared-prefix: = --prefix-len")
    p.add_argument("--gsp-question-len", type=positive_int, help="shared-prefix: = --suffix-len")
    p.add_argument("--gsp-output-len", type=positive_int, help="shared-prefix: = --output-len")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--extra-body", default="{}", help="JSON object merged into every request body")
    p.add_argument("--warmup", type=nonneg_int, default=1,
                   help="untimed requests sent first, one at a time (default 1)")
    p.add_argument("--tokenize", default="auto", choices=["auto", "off"],
                   help="auto: size prompts with the server's /tokenize when it has one")
    p.add_argument("--timeout", type=float, default=600.0, help="socket timeout per request, s (600)")
    p.add_argument("--json", metavar="OUT", help="write config, summary and every request here")
    p.add_argument("--label", default="", help="free text stored in the JSON")
    p.add_argument("--quiet", action="store_true", help="no table on stdout")
    a = p.parse_args(argv)
    if a.request_rate is None and a.concurrency is None:
        a.concurrency = 1
    if a.max_concurrency and a.request_rate is None:
        p.error("--max-concurrency goes with --request-rate (use --concurrency for a closed loop)")
    try:
        a.extra_body = json.loads(a.extra_body)
    except ValueError as e:
        p.error("--extra-body: not JSON: %s" % e)
    if not isinstance(a.extra_body, dict):
        p.error("--extra-body: want a JSON object")
    if a.temperature < 0:
        p.error("--temperature must be >= 0")
    gsp = {"gsp_groups": "num_groups", "gsp_system_len": "prefix_len",
           "gsp_question_len": "suffix_len", "gsp_output_len": "output_len"}
    given = [k for k in list(gsp) + ["gsp_prompts_per_group"] if getattr(a, k) is not None]
    if given and a.dataset != "shared-prefix":
        p.error("--%s: only with --dataset shared-prefix" % given[0].replace("_", "-"))
    for k, v in gsp.items():
        if getattr(a, k) is not None:
            setattr(a, v, getattr(a, k))
    if a.gsp_prompts_per_group is not None:
        if a.num_prompts is not None:
            p.error("--num-prompts and --gsp-prompts-per-group: give one of them")
        a.num_prompts = a.num_groups * a.gsp_prompts_per_group
    if a.num_prompts is None:
        a.num_prompts = 16
    if a.dataset == "shared-prefix" and a.num_prompts < a.num_groups:
        p.error("--num-prompts (%d) must be >= --num-groups (%d)" % (a.num_prompts, a.num_groups))
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    server = Server(args.base_url, args.timeout, args.api_key)
    try:
        st, obj, raw = server.call("GET", "/v1/models")
    except (OSError, http.client.HTTPException) as e:
        die("%s: cannot reach the server: %s" % (args.base_url, e))
    if args.model is None:
        try:
            args.model = obj["data"][0]["id"]
        except (TypeError, KeyError, IndexError):
            die("%s/v1/models answered %d without a model id (%s); pass --model"
                % (args.base_url, st, raw[:120]))

    tok = Tokenizer(server, args.tokenize)
    # The dataset's name is in the seed so that two workloads with one --seed
    # do not start with the same words (a server's prefix cache would hit).
    rng = random.Random("%d/%s" % (args.seed, args.dataset))
    t_build = time.perf_counter()
    try:
        jobs = {"random": build_random, "shared-prefix": build_shared_prefix,
                "multi-turn": build_multi_turn}[args.dataset](args, tok, rng)
        warm = [tok.text(random.Random(args.seed + 7919 * (i + 1)), min(args.input_len, 32))[0]
                for i in range(args.warmup)]
    except (OSError, http.client.HTTPException, RuntimeError) as e:
        die("building the prompts: %s" % e)
    t_build = time.perf_counter() - t_build
    if not args.quiet:
        print("serving.py: %d %s jobs built in %.1fs (token counts: %s)" %
              (len(jobs), args.dataset, t_build,
               "POST /tokenize {%s}" % tok.shape if tok.shape else "estimated, %.2f per word" % tok.per_word),
              file=sys.stderr)

    for i, w in enumerate(warm):
        res = Result(-1 - i, 0, None, None)
        send(server, args, "warm up " + w, res)
        if not res.ok:
            print("serving.py: warm-up request failed: %s" % res.error, file=sys.stderr)

    results, t0, t1 = run_load(server, args, jobs)
    results.sort(key=lambda r: (r.job, r.turn))
    s = summarize(args, results, t0, t1)
    if not args.quiet:
        print_table(args, s)
    if args.json:
        cfg = {k: v for k, v in vars(args).items() if k not in ("api_key", "json")}
        cfg["tokenize_shape"] = tok.shape
        doc = {"config": cfg, "summary": s, "requests": [r.record(t0) for r in results],
               "started_unix": time.time() - (time.perf_counter() - t0)}
        try:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
        except OSError as e:
            die("--json %s: %s" % (args.json, e))
    return 0 if s["failed"] == 0 and s["completed"] > 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("serving.py: interrupted", file=sys.stderr)
        sys.exit(130)
