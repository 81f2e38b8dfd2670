#!/usr/bin/env python3
"""tests/cuemu/sampling.py PLUGIN_DIR -- device sampling through radixd on
the emulated CUDA backend (tests/cuemu.sh's last step).

Two daemons on the tiny model: EMU runs `[kernels] backend = cuda` from
PLUGIN_DIR (the emulated kernels-cuda.so: the unmodified kernels/cuda
sources on cuemu), where `device_sampling = auto` is on; CPU is the CPU
backend with it off (the whole-row host path).  Penalized and
min_tokens-banned greedy and top_k rows (rx_cands_penalized over logits
gathered by kernels-cuda's gather_rows) and logprobs (candidates at
temperature 1: kernels-cuda's softmax and topk; a second candidate row
for a row sampled at 0.8) must give CPU's texts, the logprobs within
1e-4, and EMU's /metrics must count those rows as taken from candidates.
Prints one summary line; exit 0 or 1."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from rxtest import Daemon, parse_metrics  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog"
MAX = 10
CASES = (
    ("greedy, repetition 1.8", dict(temperature=0, repetition_penalty=1.8)),
    ("greedy, presence -1.5", dict(temperature=0, presence_penalty=-1.5)),
    ("top_k 5, frequency 1", dict(temperature=1.0, top_k=5, frequency_penalty=1.0, seed=3)),
    ("greedy, logprobs 3", dict(temperature=0, logprobs=3)),
    ("T 1 top_k 5, logprobs 3", dict(temperature=1.0, top_k=5, seed=4, logprobs=3)),
    ("T 0.8 top_k 5, logprobs 2", dict(temperature=0.8, top_k=5, seed=5, logprobs=2)),
    ("greedy, repetition 1.8, logprobs 2", dict(temperature=0, repetition_penalty=1.8, logprobs=2)),
    ("greedy, min_tokens, stop ids", dict(temperature=0, min_tokens=MAX, stop_token_ids=[13, 29892, 29889])),
)


def main():
    emu = Daemon("tiny", name="cuemu-sampling",
                 sections={"kernels": {"backend": "cuda"}, "plugins": {"path": sys.argv[1]}})
    cpu = Daemon("tiny", name="cpu-sampling", sections={"scheduler": {"device_sampling": "off"}})
    bad = []
    try:
        emu.start().wait_healthy()
        cpu.start().wait_healthy()

        def comp(d, kw):
            body = {"model": d.model_id, "prompt": PROMPT, "max_tokens": MAX, "ignore_eos": True}
            body.update(kw)
            return d.ok_json("POST", "/v1/completions", body, timeout=600)["choices"][0]

        worst = 0.0
        for what, kw in CASES:
            a, b = comp(emu, kw), comp(cpu, kw)
            if a["text"] != b["text"]:
                bad.append("%s: text %r, the CPU's %r" % (what, a["text"], b["text"]))
            if "logprobs" in kw:
                la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
                d = max(abs(x - y) for x, y in zip(la, lb))
                worst = max(worst, d)
                if d > 1e-4:
                    bad.append("%s: logprobs differ by %g" % (what, d))
        m = parse_metrics(emu.get("/metrics").body.decode("utf-8"))
        rows = int(m.get('radix_device_sampling_rows_total{outcome="candidates"}', 0))
        lp = int(m.get('radix_device_logprobs_rows_total{outcome="candidates"}', 0))
        # the periodic stats lag up to 1 s: at least one request's rows
        if rows < MAX or lp < MAX:
            bad.append("/metrics: %d sampled and %d logprob rows from candidates" % (rows, lp))
        if "penalized rows too" not in emu.log_text():
            bad.append("the scheduler did not take penalized rows to candidates")
    finally:
        emu.close()
        cpu.close()
    if bad:
        print("; ".join(bad))
        return 1
    print("%d requests equal the CPU's, logprobs within %.1e, %d sampled / %d logprob rows from candidates"
          % (len(CASES), worst, rows, lp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
