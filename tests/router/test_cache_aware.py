#!/usr/bin/env python3
"""cache_aware through the router.  With fake workers (which say who
answered): requests sharing a prefix go to the same worker, the routing
key is the prompt (string or first element), the chat messages' contents
joined with "\\n", or /generate's text; hits, misses and balance decisions
are counted in /metrics; per-worker tree sizes are reported; an imbalanced
pool sends a hit to the least loaded worker instead; a worker whose request
failed loses its cache affinity at once.  With two real radixd workers on
the tiny model: a repeated prefix lands where it is cached (the answer's
usage.prompt_tokens_details.cached_tokens covers the prefix)."""

import os
import random
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routertest import (Router, answered_by, completion, fake_workers, run)  # noqa: E402
from rxtest import (Daemon, diag, eq, expect, in_thread, short, test, wait_until)  # noqa: E402

R = None
W = []
RNG = random.Random(5)
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def words(n):
    """A fresh text: a unique head (so no two texts share more than a few
    characters of prefix) and n random words."""
    return uuid.uuid4().hex[:12] + " " + " ".join(RNG.choice(WORDS) for _ in range(n))


def setup():
    global R, W
    W = fake_workers(2, prefix="c")
    R = Router(W, policy="cache_aware", sections={
        "router.cache_aware": {"cache_threshold": "0.3", "balance_abs_threshold": "2",
                               "balance_rel_threshold": "1.5"}}).start()
    R.wait_healthy([w.url for w in W])


def decisions():
    return {d: R.metric("radix_router_route_decisions_total", decision=d)
            for d in ("cache_hit", "cache_miss", "balance", "plain")}


# ---- fake workers ------------------------------------------------------------------


@test
def test_same_prefix_same_worker():
    firsts = []
    for i in range(8):
        p = words(40)
        w1 = answered_by(R.post("/v1/completions", completion(p)))
        w2 = answered_by(R.post("/v1/completions", completion(p + " and then some more")))
        eq(w2, w1, "worker of prompt %d extended (first went to %s)" % (i, w1))
        firsts.append(w1)
    eq(set(firsts), {w.name for w in W}, "workers that got the 8 fresh prompts (misses spread)")


@test
def test_routing_key_per_endpoint():
    for i in range(4):
        s, u = words(20), words(20)
        chat = {"model": "fake-model", "max_tokens": 2,
                "messages": [{"role": "system", "content": s}, {"role": "user", "content": u}]}
        w1 = answered_by(R.post("/v1/chat/completions", chat))
        w2 = answered_by(R.post("/v1/completions", completion(s + "\n" + u + " tail")))
        eq(w2, w1, "a completion whose prompt extends chat %d's contents joined by \\n" % i)
        t = words(40)
        w3 = answered_by(R.post("/generate", {"text": t, "sampling_params": {"max_new_tokens": 2}}))
        w4 = answered_by(R.post("/v1/completions", completion([t + " tail", "ignored second prompt"])))
        eq(w4, w3, "a completion whose first prompt extends /generate %d's text" % i)


@test
def test_decisions_and_tree_size():
    d0 = decisions()
    ws0 = R.workers()
    p = words(60)
    w1 = answered_by(R.post("/v1/completions", completion(p)))
    d1 = decisions()
    eq(d1["cache_miss"] - d0["cache_miss"], 1.0, "cache_miss decisions after a fresh prompt")
    url = [w.url for w in W if w.name == w1][0]
    grew = R.workers()[url]["tree_size"] - ws0[url]["tree_size"]
    expect(len(p) - 12 <= grew <= len(p),
           "tree_size of %s grew by %d after a fresh %d-character prompt" % (w1, grew, len(p)))
    eq(R.metric("radix_router_tree_size", worker=url), float(R.workers()[url]["tree_size"]),
       "radix_router_tree_size gauge equals GET /workers tree_size")
    eq(answered_by(R.post("/v1/completions", completion(p + " again"))), w1, "the repeat's worker")
    d2 = decisions()
    eq(d2["cache_hit"] - d1["cache_hit"], 1.0, "cache_hit decisions after a repeat")
    eq(d2["plain"], d0["plain"], "plain decisions (cache_aware never makes them)")


@test
def test_imbalance_goes_to_least_loaded():
    """balance_abs_threshold 2, balance_rel_threshold 1.5: requests with
    one prefix, each held 1.5 s by its worker, pile on one worker until
    it has 3 more in flight than the other; then one goes to the other."""
    for w in W:
        w.reset()
    d0 = decisions()
    p = words(40)
    hs = []
    for i in range(6):
        hs.append(in_thread(R.post, "/v1/completions", completion(p, fake_delay_ms=1500), timeout=20))
        n = i + 1
        expect(wait_until(lambda: sum(w.stats()["inflight"] for w in W) == n, 3, 0.01),
               "request %d never reached a worker" % n)
    loads = {w.name: w.stats()["inflight"] for w in W}
    who = [answered_by(h.result(20)) for h in hs]
    diag("6 same-prefix requests went to %s (in flight %s)" % (who, loads))
    expect(len(set(who)) == 2, "every same-prefix request went to %s although its load grew" % who[0])
    eq(who[:4].count(who[0]), 3, "the first three requests on one worker, the fourth balanced (%s)" % who)
    expect(decisions()["balance"] - d0["balance"] >= 1, "no balance decision counted")


@test
def test_failed_worker_loses_affinity():
    for w in W:
        w.reset()
    p = words(50)
    x = answered_by(R.post("/v1/completions", completion(p)))
    X = [w for w in W if w.name == x][0]
    Y = [w for w in W if w.name != x][0]
    expect(R.workers()[X.url]["tree_size"] > 0, "tree of %s after a request" % x)
    X.control(fail_status=503, fail_count=1)
    r = R.post("/v1/completions", completion(p + " second"))
    eq(r.status, 200, "request retried after %s failed (%s)" % (x, short(r.body)))
    eq(answered_by(r), Y.name, "the retry's worker")
    eq(X.stats()["injected_failures"], 1, "%s got the request first (affinity) and failed" % x)
    eq(R.workers()[X.url]["tree_size"], 0, "tree of %s right after its failure" % x)
    eq(answered_by(R.post("/v1/completions", completion(p + " third"))), Y.name,
       "the prefix now follows the worker that served it")


# ---- real radixd workers ----------------------------------------------------------------


@test
def test_real_workers_prefix_is_cached():
    daemons = [Daemon("tiny", name="rx%d" % i).start() for i in range(2)]
    for d in daemons:
        d.wait_healthy()
    r2 = Router(["http://127.0.0.1:%d" % d.port for d in daemons], policy="cache_aware",
                name="radix-router-real").start()
    try:
        r2.wait_healthy(timeout=20)
        eq(r2.ok_json("GET", "/v1/models")["data"][0]["id"], "itest-model", "GET /v1/models through the router")
        prefixes = [words(60) for _ in range(4)]

        def ask(prompt):
            j = r2.ok_json("POST", "/v1/completions", {"model": "itest-model", "prompt": prompt,
                                                       "max_tokens": 2, "ignore_eos": True, "temperature": 0},
                           timeout=60)
            u = j["usage"]
            return u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        fresh = [ask(p + " first question") for p in prefixes]
        diag("fresh prompts (prompt, cached tokens): %s" % fresh)
        expect(all(c < pt // 4 for pt, c in fresh), "fresh prompts already cached: %s" % fresh)
        again = [ask(p + " second question") for p in prefixes]
        diag("repeated prefixes (prompt, cached tokens): %s" % again)
        for i, (pt, c) in enumerate(again):
            expect(c >= pt // 2, "prefix %d repeated: %d of %d prompt tokens cached: sent to the other worker?"
                   % (i, c, pt))
        dec = r2.metric("radix_router_route_decisions_total", decision="cache_hit")
        eq(dec, 4.0, "cache_hit decisions")
    finally:
        r2.close()
        for d in daemons:
            d.close()


if __name__ == "__main__":
    run(setup, timeout=120)
