#!/usr/bin/env python3
"""EPLB at run time through the real radixd (docs/eplb.md "At run time"),
on tiny-moe (2 MoE layers x 4 experts, top-2):

- POST /start_expert_distribution_record, /stop_..., /dump_...: the dump is
  written into [eplb] record_dir (never a path from the request), the
  response names it, every layer's counts sum to the tokens forwarded x k,
  and `radix eplb --load` reads it; a dense model answers 400.
- a static placement with redundant copies ([eplb] init_expert_location),
  on one rank and on 2 DP-attention ranks with ep_size 2: the same greedy
  tokens as without.
- dynamic rebalance (rebalance_interval 3) on 2 DP-attention ranks with
  ep_size 2: min_rebalance_balancedness 1 switches placements (logged) and
  the tokens equal the run without EPLB; 0 only logs skips.
- a bad init_expert_location file stops radixd at start with one line
  naming the file.

Random-weight models have near ties: a different grouping of the expert
rows can flip a greedy choice whose top-2 logprob gap is within rounding;
such a difference is accepted only where the reference's gap is < 1e-3 and
the output took the reference's second choice."""

import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import (Daemon, Fail, diag, eq, expect, parse_metrics, run, shared_path, short, test,  # noqa: E402
                    wait_until)

MOE = shared_path("data/models/tiny-moe.gguf")
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "def fibonacci(n):"]
NTOK = 12
TIE = 1e-3
_daemons = []
_ref = {}


def secs(par=None, eplb=None, **extra):
    out = {"model": {"path": MOE}, "kernels": {"threads": "1"}, "cache": {"kv_memory": "64MiB", "radix_cache": "false"}}
    if par:
        out["parallel"] = {k: str(v) for k, v in par.items()}
        out["moe"] = {"dispatcher": "ep_auto"}
    if eplb:
        out["eplb"] = {k: str(v) for k, v in eplb.items()}
    out.update(extra)
    return out


DPA = {"tp_size": 2, "dp_size": 2, "dp_attention": "true", "ep_size": 2, "comm": "shm"}


def start(name, sections):
    d = Daemon("tiny", name=name, sections=sections)
    _daemons.append(d)
    return d.start().wait_healthy()


def generate(d, prompt, top=0):
    b = {"text": prompt, "return_logprob": True,
         "sampling_params": {"max_new_tokens": NTOK, "temperature": 0, "ignore_eos": True}}
    if top:
        b["top_logprobs_num"] = top
    j = d.ok_json("POST", "/generate", b)
    mi = j.get("meta_info") or {}
    out = mi.get("output_token_logprobs")
    expect(isinstance(out, list) and len(out) == NTOK, "[%s] /generate %r: %s" % (d.name, prompt, short(mi)))
    return [e[1] for e in out], mi.get("output_top_logprobs"), mi


def same_as(ref_d, d, what):
    """d's greedy ids of PROMPTS equal ref_d's, up to a near tie."""
    for p in PROMPTS:
        key = (ref_d.name, p)
        if key not in _ref:
            ids, top, _ = generate(ref_d, p, top=2)
            _ref[key] = (ids, top)
        want, top = _ref[key]
        got = generate(d, p)[0]
        for i, (a, b) in enumerate(zip(got, want)):
            if a == b:
                continue
            (lp0, _, _), (lp1, id1, _) = top[i][0], top[i][1]
            expect(lp0 - lp1 < TIE and a == id1,
                   "%s: %r differs from %s at token %d: got %d, want %d (top-2 gap %.3g: not a near tie)"
                   % (what, p, ref_d.name, i, a, b, lp0 - lp1))
            diag("%s: %r differs at token %d, a near tie (gap %.2g)" % (what, p, i, lp0 - lp1))
            break


def write_json(obj):
    fd, path = tempfile.mkstemp(prefix="rx-eplb-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    return path


# 2 MoE layers x 4 experts in 6 slots (copies of a hot expert per layer), a
# permuted order: slot s of GPU g = s // 3 under ep_size 2
PLACEMENT = {"phy2log": [[0, 3, 1, 0, 2, 3], [3, 2, 1, 0, 1, 2]]}


@test
def test_record_endpoints_and_dump():
    rdir = tempfile.mkdtemp(prefix="rx-eplb-rec-")
    d = start("eplb-rec", secs(eplb={"record_dir": rdir, "record_window": 10000}))
    r = d.post("/start_expert_distribution_record")
    eq(r.status, 200, "start (%s)" % short(r.body))
    ids, _, mi = generate(d, PROMPTS[0])
    prompt_tokens = mi.get("prompt_tokens")
    expect(isinstance(prompt_tokens, int) and prompt_tokens > 0, "prompt_tokens in %s" % short(mi))
    r = d.post("/stop_expert_distribution_record")
    eq(r.status, 200, "stop (%s)" % short(r.body))
    generate(d, PROMPTS[1])   # not recorded
    # a path in the request is ignored: the file goes into record_dir
    evil = os.path.join(tempfile.gettempdir(), "rx-eplb-evil-%d.json" % os.getpid())
    r = d.post("/dump_expert_distribution_record", {"path": evil, "file": evil})
    eq(r.status, 200, "dump (%s)" % short(r.body))
    path = r.json().get("path")
    expect(isinstance(path, str) and os.path.dirname(path) == rdir, "dump path %r not in record_dir %s" % (path, rdir))
    expect(not os.path.exists(evil), "the request's path was written")
    with open(path) as f:
        j = json.load(f)
    eq((j.get("layers"), j.get("experts")), (2, 4), "dump shape")
    eq(len(j["load"]), 2, "load rows")
    # the prompt's tokens, then one decode step per token but the last
    want = (prompt_tokens + NTOK - 1) * 2
    for l, row in enumerate(j["load"]):
        eq(sum(row), want, "layer %d: tokens routed (prompt %d + %d decode) x k 2" % (l, prompt_tokens, NTOK - 1))
    eq(j.get("n_steps"), NTOK, "steps recorded (1 prefill + %d decode)" % (NTOK - 1))
    # the offline planner reads the dump as it is
    p = subprocess.run([os.environ["RADIX"], "eplb", "--algorithm", "deepseek", "--load", path, "--physical", "6",
                        "--groups", "1", "--nodes", "1", "--gpus", "2"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
                       env=dict(os.environ, RADIX_PLUGIN_PATH=os.environ["RX_PLUGIN_BUILD_DIR"]))
    eq(p.returncode, 0, "radix eplb --load %s: %s" % (path, short(p.stderr)))
    out = json.loads(p.stdout)
    eq(len(out["phy2log"]), 2, "radix eplb layers")
    eq(len(out["phy2log"][0]), 6, "radix eplb slots")
    d.close()


@test
def test_dense_model_refuses():
    rdir = tempfile.mkdtemp(prefix="rx-eplb-dense-")
    d = start("eplb-dense", {"eplb": {"record_dir": rdir}})
    for ep in ("/start_expert_distribution_record", "/dump_expert_distribution_record"):
        r = d.post(ep)
        eq(r.status, 400, "%s on a dense model (%s)" % (ep, short(r.body)))
        expect("mixture-of-experts" in r.body.decode(), "%s: message %s" % (ep, short(r.body)))
    eq(os.listdir(rdir), [], "nothing written")
    d.close()


@test
def test_static_placement_one_rank():
    pf = write_json(PLACEMENT)
    ref = start("eplb-ref1", secs())
    d = start("eplb-static1", secs(eplb={"init_expert_location": pf}))
    expect("eplb: placement from %s" % pf in d.log_text(), "no placement line in the log")
    same_as(ref, d, "static placement, one rank")
    d.close()
    ref.close()


@test
def test_static_and_dynamic_dp_attention_ep2():
    pf = write_json(PLACEMENT)
    ref = start("eplb-ref-dpa", secs(DPA))
    try:
        st = start("eplb-static-dpa", secs(DPA, eplb={"init_expert_location": pf}))
        same_as(ref, st, "static placement, DP attention, ep_size 2")
        st.close()
        dyn = start("eplb-dyn-dpa", secs(DPA, eplb={"rebalance_interval": 3, "min_rebalance_balancedness": 1,
                                                    "num_redundant_experts": 2}))
        same_as(ref, dyn, "dynamic rebalance, DP attention, ep_size 2")
        log = dyn.log_text()
        n = len(re.findall(r"eplb: step \d+: rebalanced", log))
        diag("dynamic: %d switches logged" % n)
        expect(n >= 2, "fewer than 2 rebalances logged (2 ranks): %s" % short(log[-1500:]))
        # /metrics: balancedness per MoE layer and the switch counter (the
        # scheduler sends them with its periodic stats)
        m = wait_until(lambda: (lambda x: x if x.get('radix_eplb_rebalances_total{outcome="switched"}', 0) >= 1
                                else None)(parse_metrics(dyn.metrics())), 10)
        expect(m is not None, "no switched rebalance in /metrics: %s" % short(dyn.metrics()[-600:]))
        for l in (0, 1):
            b = m.get('radix_eplb_balancedness{layer="%d"}' % l)
            expect(b is not None and 0 < b <= 1, "radix_eplb_balancedness of layer %d: %r" % (l, b))
        expect('radix_eplb_balancedness{layer="2"}' not in m, "a third MoE layer in /metrics")
        dyn.close()
        skip = start("eplb-skip-dpa", secs(DPA, eplb={"rebalance_interval": 3, "min_rebalance_balancedness": 0}))
        same_as(ref, skip, "rebalance always skipped")
        log = skip.log_text()
        expect("rebalance skipped" in log, "no skip logged")
        expect("rebalanced" not in log, "rebalanced although min_rebalance_balancedness = 0")
        m = wait_until(lambda: (lambda x: x if x.get('radix_eplb_rebalances_total{outcome="skipped"}', 0) >= 1
                                else None)(parse_metrics(skip.metrics())), 10)
        expect(m is not None and m.get('radix_eplb_rebalances_total{outcome="switched"}') == 0,
               "skips not counted in /metrics: %s" % short(skip.metrics()[-600:]))
        skip.close()
    finally:
        ref.close()


@test
def test_bad_init_file_stops_radixd():
    for text, want in (('{"phy2log": [[0, 1, 2, 3]]}', "1 layers x 4 experts"), ("nope", "")):
        pf = write_json({})
        with open(pf, "w") as f:
            f.write(text)
        d = Daemon("tiny", name="eplb-bad", sections=secs(eplb={"init_expert_location": pf}))
        _daemons.append(d)
        try:
            d.start(timeout=30)
            raise Fail("radixd started with init_expert_location %s" % text)
        except Fail as e:
            if "started with" in str(e):
                raise
        log = d.log_text()
        expect(pf in log and "init_expert_location" in log and want in log,
               "the log does not name the bad file %s (%s): %s" % (pf, want, short(log[-800:])))
        d.close()


def teardown():
    for d in _daemons:
        d.close()


if __name__ == "__main__":
    run(None, teardown, timeout=400)
