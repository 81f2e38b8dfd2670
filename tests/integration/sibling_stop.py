"""Stop strings that end siblings early (core/server.c: REQ_ABORT_SEQ), as a
check any test can run on its daemon -- test_api.py on one scheduler,
test_parallel.py through the DP controller and TP ranks.

A sampled n = 3 completion (seed s: sibling i samples with seed s + i) is
run once without a stop string; then with a stop string found early in one
sibling's text and in no other: that sibling's text is cut before it
(finish "stop"), the others are unchanged (finish "length"), and the
scheduler's generated-token counter (/get_server_info stats, asked after
the reply) shows the stopped sibling did not run on to max_tokens -- it
would add about max_tokens to the counter if its sequence were only
stopped with the whole request.  The same for n = 1 (seed s + i gives
sibling i's text alone), which is stopped with the whole request at once."""

from rxtest import Fail, diag, eq, expect, short

PROMPT = "Once upon a time"
MAX = 200      # tokens per sibling (the tiny model's context is 512)
SLACK = MAX // 2   # steps a stopped sibling may run before its abort lands


def gen_tokens(d):
    st = d.ok_json("GET", "/get_server_info").get("stats") or {}
    g = st.get("generation_tokens")
    expect(isinstance(g, int), "[%s] /get_server_info stats lack generation_tokens: %s" % (d.name, short(st)))
    return g


def pick(texts):
    """(i, s): a 4-character stop string that starts early in texts[i]
    (at 3..40, its first occurrence) and occurs in no other text."""
    for i, t in enumerate(texts):
        for start in range(3, min(len(t) - 4, 40)):
            s = t[start:start + 4]
            if "\ufffd" in s or s != s.strip() or not s.strip() or t.find(s) < 3:
                continue
            if any(s in u for j, u in enumerate(texts) if j != i):
                continue
            return i, s
    raise Fail("no stop string early in one sibling only: %r" % texts)


def check(d, what, seed=5):
    body = {"prompt": PROMPT, "n": 3, "max_tokens": MAX, "temperature": 0.9, "seed": seed,
            "ignore_eos": True}
    if getattr(d, "model_id", None):
        body["model"] = d.model_id
    full = d.ok_json("POST", "/v1/completions", body)
    texts = [""] * 3
    for c in full["choices"]:
        texts[c["index"]] = c["text"]
    eq(full["usage"]["completion_tokens"], 3 * MAX, "[%s] completion_tokens of n=3 without a stop" % what)
    expect(len(set(texts)) == 3, "[%s] the siblings do not differ: %r" % (what, texts))
    i, stop = pick(texts)
    want = texts[i][:texts[i].index(stop)]

    g0 = gen_tokens(d)
    j = d.ok_json("POST", "/v1/completions", dict(body, stop=[stop]))
    g1 = gen_tokens(d)
    ch = {c["index"]: c for c in j["choices"]}
    eq(sorted(ch), [0, 1, 2], "[%s] choice indexes" % what)
    for k in range(3):
        if k == i:
            eq(ch[k]["text"], want, "[%s] sibling %d's text with stop %r" % (what, k, stop))
            eq(ch[k]["finish_reason"], "stop", "[%s] sibling %d's finish_reason" % (what, k))
        else:
            eq(ch[k]["text"], texts[k], "[%s] sibling %d's text (no stop string in it)" % (what, k))
            eq(ch[k]["finish_reason"], "length", "[%s] sibling %d's finish_reason" % (what, k))
    k_i = j["usage"]["completion_tokens"] - 2 * MAX
    expect(0 < k_i < MAX // 4, "[%s] the stopped sibling's completion_tokens %d" % (what, k_i))
    gen = g1 - g0
    diag("[%s] sibling %d stopped by %r after %d tokens; %d tokens generated in all (%d after its stop)"
         % (what, i, stop, k_i, gen, gen - 2 * MAX - k_i))
    expect(gen >= 2 * MAX + k_i, "[%s] generated %d tokens, below the %d reported" % (what, gen, 2 * MAX + k_i))
    expect(gen <= 2 * MAX + k_i + SLACK,
           "[%s] generated %d tokens for 2 x %d + %d: the stopped sibling ran on (%d more)"
           % (what, gen, MAX, k_i, gen - 2 * MAX - k_i))

    # n = 1: seed + i is sibling i's stream alone
    one = dict(body, n=1, seed=seed + i, stop=[stop])
    g0 = gen_tokens(d)
    j = d.ok_json("POST", "/v1/completions", one)
    g1 = gen_tokens(d)
    eq(j["choices"][0]["text"], want, "[%s] n=1 seed %d text with stop %r" % (what, seed + i, stop))
    eq(j["choices"][0]["finish_reason"], "stop", "[%s] n=1 finish_reason" % what)
    k1 = j["usage"]["completion_tokens"]
    diag("[%s] n=1: %d tokens reported, %d generated" % (what, k1, g1 - g0))
    expect(k1 <= g1 - g0 <= k1 + SLACK, "[%s] n=1: generated %d tokens for %d reported" % (what, g1 - g0, k1))
