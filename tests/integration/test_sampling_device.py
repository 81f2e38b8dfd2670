#!/usr/bin/env python3
"""Device sampling ([scheduler] device_sampling, core/sampling.h
rx_sampler_sample_cands) end to end over HTTP.

Two daemons on the tiny random model and kernels-cpu: ON forces
device_sampling = on with sampling_candidates = 8 (the CPU backend is
host-visible, so `auto` would leave it off), OFF has device_sampling = off
(the whole-row host sampler).  Checked:

  - a seeded top_p request repeats its text; greedy text is the same with
    and without device sampling (greedy keeps the device argmax);
  - top_k 5 (inside the 8 candidates) draws what the host sampler draws
    with the same seed -- the promise of sampling.h for a cut inside the
    candidates -- so ON and OFF give the same text;
  - top_k, min_p, plain temperature 1.3 (draws past the candidates: the
    tail path), n = 2 and streaming complete with valid text, and /metrics
    counts the candidate rows by outcome (candidates / full / tail) on ON
    and none on OFF;
  - penalized greedy and top_k rows (frequency / presence / repetition)
    draw from candidates corrected for their penalties: the same text as
    OFF, counted as candidate rows;
  - logprobs come from candidates at temperature 1 on ON (a row sampled
    at 0.8 gets a second candidate row at 1): the same tokens and logprobs
    (within float rounding) as OFF's whole rows, counted by
    radix_device_logprobs_rows_total;
  - a bad device_sampling / sampling_candidates value in the INI makes
    radixd exit 1 with one line naming the file, the line and the key.
"""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import Daemon, diag, eq, expect, parse_metrics, run, short, test  # noqa: E402

ON = None
OFF = None
PROMPT = "The quick brown fox jumps over the lazy dog"
MAX = 16


def setup():
    global ON, OFF
    ON = Daemon("tiny", name="device-on",
                sections={"scheduler": {"device_sampling": "on", "sampling_candidates": 8}})
    OFF = Daemon("tiny", name="device-off", sections={"scheduler": {"device_sampling": "off"}})
    ON.start()
    OFF.start()
    ON.wait_healthy()
    OFF.wait_healthy()


def completion(d, **kw):
    body = {"model": d.model_id, "prompt": PROMPT, "max_tokens": MAX, "ignore_eos": True}
    body.update(kw)
    return d.ok_json("POST", "/v1/completions", body, timeout=120)


def check_choice(c, what, max_tokens=MAX):
    """One completion choice: non-empty text, finish_reason length or stop."""
    expect(isinstance(c, dict), "%s: choice is not an object: %s" % (what, short(c)))
    expect(isinstance(c.get("text"), str) and c["text"] != "",
           "%s: text is not a non-empty string: %s" % (what, short(c)))
    expect(c.get("finish_reason") in ("length", "stop"),
           "%s: finish_reason %r" % (what, c.get("finish_reason")))
    return c["text"]


def one(d, what, **kw):
    j = completion(d, **kw)
    ch = j.get("choices")
    expect(isinstance(ch, list) and len(ch) == 1, "%s: choices: %s" % (what, short(j)))
    text = check_choice(ch[0], what)
    u = j.get("usage") or {}
    # ignore_eos: every request runs to max_tokens
    eq(u.get("completion_tokens"), MAX, "%s: usage.completion_tokens" % what)
    eq(ch[0]["finish_reason"], "length", "%s: finish_reason (ignore_eos)" % what)
    return text


def cand_counts(d):
    """/metrics radix_device_sampling_rows_total by outcome (0 when absent)."""
    r = d.get("/metrics")
    eq(r.status, 200, "GET /metrics")
    m = parse_metrics(r.body.decode("utf-8"))
    return {o: int(m.get('radix_device_sampling_rows_total{outcome="%s"}' % o, 0))
            for o in ("candidates", "full", "tail")}


def lp_counts(d):
    """/metrics radix_device_logprobs_rows_total by outcome (0 when absent)."""
    r = d.get("/metrics")
    eq(r.status, 200, "GET /metrics")
    m = parse_metrics(r.body.decode("utf-8"))
    return {o: int(m.get('radix_device_logprobs_rows_total{outcome="%s"}' % o, 0)) for o in ("candidates", "full")}


def settled(d, counts=None):
    """cand_counts once it holds still: /metrics shows the scheduler's
    periodic stats (1 s), so two reads 1.2 s apart that agree include every
    request answered before the first."""
    counts = counts or cand_counts
    prev = counts(d)
    for _ in range(8):
        time.sleep(1.2)
        cur = counts(d)
        if cur == prev:
            return cur
        prev = cur
    raise AssertionError("device sampling counters still moving: %s" % prev)


def delta(after, before):
    return {k: after[k] - before[k] for k in after}


# ---- determinism and agreement with the host path -------------------------


@test
def test_seeded_top_p_repeats():
    kw = dict(temperature=0.8, top_p=0.9, seed=7)
    a = one(ON, "seeded top_p (1)", **kw)
    b = one(ON, "seeded top_p (2)", **kw)
    eq(b, a, "seed 7, T 0.8, top_p 0.9: second text vs first")
    c = one(ON, "seed 8", temperature=0.8, top_p=0.9, seed=8)
    diag("seed 7: %r; seed 8: %r" % (a, c))


@test
def test_greedy_same_as_host():
    a = one(ON, "greedy on", temperature=0)
    b = one(OFF, "greedy off", temperature=0)
    eq(a, b, "greedy text, device_sampling on vs off")


@test
def test_top_k_draws_as_host():
    # top_k 5 <= sampling_candidates 8: rx_sampler_sample_cands draws the
    # token rx_sampler_sample_with draws from the same uniform, so a seed
    # gives the same text on both daemons (barring a float-rounding tie at
    # a boundary: device probs are float softmax, the host uses double).
    before = settled(ON)
    for seed in (3, 4):
        kw = dict(temperature=1.0, top_k=5, seed=seed)
        a = one(ON, "top_k 5 seed %d on" % seed, **kw)
        b = one(OFF, "top_k 5 seed %d off" % seed, **kw)
        eq(a, b, "top_k 5 seed %d: device_sampling on vs off" % seed)
    # every sampled row of both requests drawn from its candidates (the
    # first output token comes from the prefill step, sampled as well)
    eq(delta(settled(ON), before), {"candidates": 2 * MAX, "full": 0, "tail": 0},
       "top_k 5: candidate rows by outcome")


# ---- every kind of request completes --------------------------------------


@test
def test_min_p():
    one(ON, "min_p 0.1", temperature=0.9, min_p=0.1, seed=5)
    one(ON, "min_p 0.1 top_p 0.5", temperature=0.9, min_p=0.1, top_p=0.5, seed=5)


@test
def test_plain_high_temperature_tail():
    before = settled(ON)
    texts = [one(ON, "T 1.3 seed %d" % s, temperature=1.3, seed=s) for s in (1, 2, 3)]
    eq(one(ON, "T 1.3 seed 1 again", temperature=1.3, seed=1), texts[0], "T 1.3 seed 1 repeated")
    # 4 x 16 plain rows, each either drawn from the candidates or past them
    # (tail); the random model's logits are flat, so 8 candidates hold a
    # small part of the mass and tail draws must occur.
    d = delta(settled(ON), before)
    diag("T 1.3, 64 rows: %s" % d)
    eq(sum(d.values()), 4 * MAX, "T 1.3: rows counted")
    eq(d["full"], 0, "plain sampling rows sent to the full host path")
    expect(d["tail"] > 0, "no tail draw in 64 plain rows at T 1.3 over 8 candidates: %s" % d)


@test
def test_logprobs_sampled_at_another_temperature():
    # T 0.8: the draw from candidates at 0.8, the logprobs from a second
    # candidate row at temperature 1 (the raw row's log_softmax); top_k 5
    # draws the host's tokens, so the logprobs compare with OFF's
    before, lp_before = settled(ON), settled(ON, lp_counts)
    kw = dict(temperature=0.8, top_k=5, seed=9, logprobs=2)
    a, b = completion(ON, **kw), completion(OFF, **kw)
    c = a["choices"][0]
    text = check_choice(c, "logprobs at T 0.8")
    lp = c.get("logprobs")
    expect(isinstance(lp, dict), "logprobs missing: %s" % short(c))
    for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        expect(isinstance(lp.get(k), list) and len(lp[k]) == MAX,
               "logprobs.%s is not a list of %d: %s" % (k, MAX, short(lp)))
    for i in range(MAX):
        tl = lp["token_logprobs"][i]
        expect(isinstance(tl, (int, float)) and tl <= 1e-6, "token_logprobs[%d] = %r" % (i, tl))
        top = lp["top_logprobs"][i]
        expect(isinstance(top, dict) and 1 <= len(top) <= 3, "top_logprobs[%d] = %s" % (i, short(top)))
        # the drawn token is at most as likely as the best one
        expect(tl <= max(top.values()) + 1e-4, "token_logprobs[%d] %r above its top %s" % (i, tl, top))
    eq("".join(lp["tokens"]), text, "concatenated logprobs.tokens vs text")
    eq(text, b["choices"][0]["text"], "T 0.8 top_k 5 with logprobs: text on vs off")
    same_logprobs(a, b, "T 0.8 top_k 5")
    eq(delta(settled(ON), before), {"candidates": MAX, "full": 0, "tail": 0}, "sampled rows by outcome")
    eq(delta(settled(ON, lp_counts), lp_before), {"candidates": MAX, "full": 0}, "logprob rows by outcome")


def same_logprobs(a, b, what):
    """Two completions' logprobs: the same tokens and top ids, values within
    1e-4 (ON's are float logs of the device softmax, OFF's double)."""
    la, lb = a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]
    eq(la["tokens"], lb["tokens"], "%s: logprobs.tokens" % what)
    for i in range(MAX):
        x, y = la["token_logprobs"][i], lb["token_logprobs"][i]
        expect(abs(x - y) <= 1e-4, "%s: token_logprobs[%d] %r vs %r" % (what, i, x, y))
        ta, tb = la["top_logprobs"][i], lb["top_logprobs"][i]
        eq(sorted(ta), sorted(tb), "%s: top_logprobs[%d] tokens" % (what, i))
        for k in ta:
            expect(abs(ta[k] - tb[k]) <= 1e-4, "%s: top_logprobs[%d][%r] %r vs %r" % (what, i, k, ta[k], tb[k]))


@test
def test_penalties_from_candidates():
    before = settled(ON)
    for what, kw in (("greedy, presence -1.5", dict(temperature=0, presence_penalty=-1.5)),
                     ("greedy, repetition 1.8", dict(temperature=0, repetition_penalty=1.8)),
                     ("top_k 5, frequency 1", dict(temperature=1.0, top_k=5, frequency_penalty=1.0, seed=23))):
        eq(one(ON, what + " on", **kw), one(OFF, what + " off", **kw), "%s: text on vs off" % what)
    d = delta(settled(ON), before)
    diag("penalized rows: %s" % d)
    eq(sum(d.values()), 3 * MAX, "penalized rows counted as candidate rows")
    # with logprobs too: the raw row's, from candidates at temperature 1
    lp_before = settled(ON, lp_counts)
    kw = dict(temperature=0, repetition_penalty=1.8, logprobs=2)
    a, b = completion(ON, **kw), completion(OFF, **kw)
    eq(a["choices"][0]["text"], b["choices"][0]["text"], "greedy, repetition 1.8, logprobs: text on vs off")
    same_logprobs(a, b, "greedy, repetition 1.8")
    eq(delta(settled(ON, lp_counts), lp_before), {"candidates": MAX, "full": 0}, "penalized logprob rows")


@test
def test_logprobs_from_candidates():
    before = settled(ON, lp_counts)
    for what, kw in (("greedy", dict(temperature=0)), ("T 1 top_k 5", dict(temperature=1.0, top_k=5, seed=17))):
        a = completion(ON, logprobs=3, **kw)
        b = completion(OFF, logprobs=3, **kw)
        eq(a["choices"][0]["text"], b["choices"][0]["text"], "%s with logprobs: text on vs off" % what)
        same_logprobs(a, b, what)
    # both requests' rows (the first from the prefill step) took their
    # logprobs from the candidates, none read whole
    eq(delta(settled(ON, lp_counts), before), {"candidates": 2 * MAX, "full": 0},
       "logprob rows from candidates by outcome")
    eq(settled(OFF, lp_counts), {"candidates": 0, "full": 0}, "device_sampling = off: logprob rows")


@test
def test_n2():
    j = completion(ON, temperature=0.9, top_p=0.95, n=2, seed=21)
    ch = j.get("choices")
    expect(isinstance(ch, list) and len(ch) == 2, "n = 2: choices: %s" % short(j))
    eq(sorted(c.get("index") for c in ch), [0, 1], "n = 2: choice indexes")
    for c in ch:
        check_choice(c, "n = 2 choice %s" % c.get("index"))
    eq((j.get("usage") or {}).get("completion_tokens"), 2 * MAX, "n = 2: usage.completion_tokens")


@test
def test_stream():
    body = {"model": ON.model_id, "prompt": PROMPT, "max_tokens": MAX, "ignore_eos": True,
            "temperature": 0.8, "top_k": 6, "seed": 13, "stream": True}
    _, chunks = ON.stream("/v1/completions", body, timeout=120)
    text = ""
    fins = []
    for ch in chunks:
        for c in ch.get("choices") or []:
            if isinstance(c.get("text"), str):
                text += c["text"]
            if c.get("finish_reason") is not None:
                fins.append(c["finish_reason"])
    expect(text != "", "stream: no text in %d chunks" % len(chunks))
    eq(fins, ["length"], "stream: finish_reason(s)")
    body.pop("stream")
    eq(completion(ON, **{k: v for k, v in body.items() if k not in ("model", "prompt")})["choices"][0]["text"],
       text, "stream text vs the same seeded request unstreamed")


@test
def test_counters_off():
    one(OFF, "off T 0.8", temperature=0.8, top_p=0.9, seed=7)
    eq(settled(OFF), {"candidates": 0, "full": 0, "tail": 0},
       "device_sampling = off: candidate counters")
    c = cand_counts(ON)
    diag("device_sampling = on, after every test: %s" % c)
    expect(c["candidates"] > 0, "device_sampling = on: no row drawn from candidates: %s" % c)


# ---- bad INI values -------------------------------------------------------


def refused(what, sched, key):
    """radixd with [scheduler] sched exits 1 with one line naming the
    INI file, the key's line number and the key."""
    d = Daemon("tiny", name=what, sections={"scheduler": sched})
    try:
        with open(d.ini_path) as f:
            lines = f.read().splitlines()
        lineno = [i + 1 for i, ln in enumerate(lines) if ln.split("=")[0].strip() == key]
        eq(len(lineno), 1, "%s: lines of %s in the INI" % (what, key))
        lineno = lineno[0]
        d.log_file = open(d.log_path, "wb")
        d.proc = subprocess.Popen([os.environ["RADIXD"], "-c", d.ini_path], stdin=subprocess.DEVNULL,
                                  stdout=d.log_file, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, RADIX_PLUGIN_PATH=os.environ["RX_PLUGIN_BUILD_DIR"]),
                                  start_new_session=True)
        rc = d.wait(20)
        expect(rc is not None, "%s: radixd still running 20 s later; log:\n%s" % (what, d.log_tail(15)))
        expect(rc != 0, "%s: exit status 0 (log: %s)" % (what, d.log_tail(5)))
        log = d.log_text()
        expect(not re.search(r"\bready\b", log), "%s: radixd logged ready" % what)
        hit = [ln for ln in log.splitlines() if key in ln]
        expect(len(hit) == 1, "%s: want one line naming %s, got:\n%s" % (what, key, log))
        ln = hit[0]
        expect(d.ini_path in ln or os.path.basename(d.ini_path) in ln,
               "%s: the error names no file: %s" % (what, ln))
        expect(re.search(r"(:|line )%d\b" % lineno, ln),
               "%s: the error names no line %d: %s" % (what, lineno, ln))
        diag("%s: exit %d: %s" % (what, rc, ln))
    finally:
        d.close()


@test
def test_ini_sampling_candidates_zero():
    refused("candidates-0", {"sampling_candidates": 0}, "sampling_candidates")


@test
def test_ini_sampling_candidates_too_many():
    refused("candidates-4097", {"sampling_candidates": 4097}, "sampling_candidates")


@test
def test_ini_device_sampling_maybe():
    refused("device-maybe", {"device_sampling": "maybe"}, "device_sampling")


if __name__ == "__main__":
    run(setup, timeout=240)
