#!/bin/sh
# bench/compare-llamacpp.sh -- radix vs llama.cpp, side by side, in one run.
#
# usage: bench/compare-llamacpp.sh [-r ROUNDS] [-t THREADS] [-o OUT.md] [MODEL.gguf ...]
#   env: RADIX (radix CLI, default ./tools/radix of the build dir we run in),
#        RADIX_PLUGIN_PATH (default ./_plugins when it exists),
#        LLAMA_BIN (llama.cpp binaries, default .cache/llamacpp/build-portable/bin),
#        RADIX_SHARED (default /work/shared: the tiny models for the check).
#   default models: .cache/bench/smollm2-360m-{f16,q8_0,q4_0}.gguf
#
# 1. Correctness of the llama.cpp build: llama-server's greedy continuation of
#    every prompt of tiny-llama{,-q8,-q4}.json must equal the reference
#    greedy_ids (a fast path can be wrong; then its speed means nothing).
# 2. Speed, interleaved so background load hits both alike: for each round,
#    for each model: `radix bench --reps 1` then `llama-bench -r 1`, both with
#    pp128, pp512, tg128 and the same thread count.  Each invocation warms up
#    once before its timed run.  Medians over the rounds, the ratio
#    radix / llama.cpp, radix's roofline ratio for tg (weight bytes x tok/s /
#    measured read bandwidth) and the load average seen at each round.
# Prints the table and writes it as a markdown fragment to OUT.md (default
# .cache/bench/compare.md) for docs/benchmarks.md.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
rounds=5
threads=2
out="$top/.cache/bench/compare.md"
while getopts r:t:o: opt; do
    case $opt in
        r) rounds=$OPTARG ;;
        t) threads=$OPTARG ;;
        o) out=$OPTARG ;;
        *) echo "usage: $0 [-r ROUNDS] [-t THREADS] [-o OUT.md] [MODEL.gguf ...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -eq 0 ]; then
    set -- "$top/.cache/bench/smollm2-360m-f16.gguf" "$top/.cache/bench/smollm2-360m-q8_0.gguf" \
           "$top/.cache/bench/smollm2-360m-q4_0.gguf"
fi
RADIX=${RADIX:-./tools/radix}
LLAMA_BIN=${LLAMA_BIN:-$top/.cache/llamacpp/build-portable/bin}
RADIX_SHARED=${RADIX_SHARED:-/work/shared}
if [ -z "${RADIX_PLUGIN_PATH:-}" ] && [ -d ./_plugins ]; then
    RADIX_PLUGIN_PATH=$(pwd)/_plugins
    export RADIX_PLUGIN_PATH
fi
for f in "$RADIX" "$LLAMA_BIN/llama-bench" "$LLAMA_BIN/llama-server"; do
    [ -x "$f" ] || { echo "compare-llamacpp: $f: not found or not executable (build it first)" >&2; exit 1; }
done
for m in "$@"; do
    [ -r "$m" ] || { echo "compare-llamacpp: $m: cannot read the model" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "compare-llamacpp: python3 is needed to parse the JSON" >&2; exit 1; }
command -v curl >/dev/null || { echo "compare-llamacpp: curl is needed for the llama.cpp check" >&2; exit 1; }

work=$(mktemp -d)
srv_pid=
cleanup () {
    if [ -n "$srv_pid" ]; then kill "$srv_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# ------------------------------------------------ 1. llama.cpp correctness --
check_log="$work/check.txt"
: >"$check_log"
port=$((18000 + $$ % 1000))
for name in tiny-llama tiny-llama-q8 tiny-llama-q4; do
    gguf="$RADIX_SHARED/data/models/$name.gguf"
    ref="$RADIX_SHARED/data/models/$name.json"
    [ -r "$gguf" ] && [ -r "$ref" ] || { echo "compare-llamacpp: $gguf or its .json missing" >&2; exit 1; }
    "$LLAMA_BIN/llama-server" -m "$gguf" -t "$threads" --port "$port" -c 512 -np 1 -ctk f32 -ctv f32 >"$work/srv.log" 2>&1 &
    srv_pid=$!
    i=0
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 120 ] || ! kill -0 "$srv_pid" 2>/dev/null; then
            echo "compare-llamacpp: llama-server did not come up for $name:" >&2
            tail -5 "$work/srv.log" >&2
            exit 1
        fi
        sleep 0.25
    done
    rc=0
    python3 - "$ref" "$port" "$name" >>"$check_log" <<'EOF' || rc=$?
import json, sys, urllib.request
# The rule of $RADIX_SHARED/data/models/README.md "How to compare", step 3:
# greedy tokens must equal greedy_ids up to the first step whose reference
# top2_gap is below 2*tol (tol 5e-3 for F16 -- ggml rounds activations to F16
# before an F16 matmul -- and 0.1 for Q8_0/Q4_0); past it they may diverge.
ref, port, name = sys.argv[1], sys.argv[2], sys.argv[3]
tol = 5e-3 if name == "tiny-llama" else 0.1
d = json.load(open(ref))
ok = 0
for p in d["prompts"]:
    want, np_ = p["greedy_ids"], len(p["prompt_ids"])
    n_cmp = 0
    while n_cmp < len(want) and p["steps"][np_ - 1 + n_cmp]["top2_gap"] >= 2 * tol:
        n_cmp += 1
    body = json.dumps({"prompt": p["prompt_ids"], "n_predict": len(want),
                       "temperature": 0, "top_k": 1, "return_tokens": True,
                       "cache_prompt": False, "ignore_eos": True}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/completion" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    got = json.load(urllib.request.urlopen(req, timeout=120))["tokens"]
    same = 0
    while same < min(len(got), len(want)) and got[same] == want[same]:
        same += 1
    good = same >= n_cmp
    print("%s: \"%s\": %d of %d greedy tokens equal the reference (%d must, tol %g)%s" %
          (name, p["text"][:30], same, len(want), n_cmp, tol, "" if good else "  MISMATCH"))
    ok += good
print("%s: %d of %d prompts pass (greedy vs reference, README rule)" % (name, ok, len(d["prompts"])))
sys.exit(0 if ok == len(d["prompts"]) else 3)
EOF
    kill "$srv_pid" 2>/dev/null || true
    wait "$srv_pid" 2>/dev/null || true
    srv_pid=
    [ $rc -eq 0 ] || { cat "$check_log"; echo "compare-llamacpp: llama.cpp's greedy output differs from the reference: not benchmarking a wrong build" >&2; exit 1; }
done
grep 'prompts pass' "$check_log" >&2

# ----------------------------------------------------- 2. interleaved runs --
r=1
while [ $r -le "$rounds" ]; do
    for m in "$@"; do
        b=$(basename "$m" .gguf)
        echo "round $r/$rounds: $b" >&2
        cut -d' ' -f1 /proc/loadavg >>"$work/load"
        "$RADIX" bench --model "$m" --threads "$threads" --pp 128,512 --tg 128 --batch none --reps 1 --json \
            >"$work/radix-$b-$r.json" 2>"$work/radix-$b-$r.err" \
            || { cat "$work/radix-$b-$r.err" >&2; exit 1; }
        "$LLAMA_BIN/llama-bench" -m "$m" -t "$threads" -p 128,512 -n 128 -r 1 -o json \
            >"$work/llama-$b-$r.json" 2>"$work/llama-$b-$r.err" \
            || { tail -5 "$work/llama-$b-$r.err" >&2; exit 1; }
    done
    r=$((r + 1))
done
cut -d' ' -f1 /proc/loadavg >>"$work/load"

mkdir -p "$(dirname "$out")"
python3 - "$work" "$rounds" "$threads" "$out" "$check_log" "$@" <<'EOF'
import json, os, statistics as st, sys, glob
work, rounds, threads, out, check = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
models = sys.argv[6:]
def med(v): return st.median(v) if v else float("nan")
rows, roof = [], []
for m in models:
    b = os.path.basename(m)[:-5]
    rx, ll, bw = {}, {}, []
    size = None
    for r in range(1, rounds + 1):
        d = json.load(open("%s/radix-%s-%d.json" % (work, b, r)))
        size = d["model_bytes"]
        bw.append(d["bandwidth_gbs"])
        for t in d["tests"]:
            rx.setdefault(t["test"], []).append(t["tok_s"])
        for t in json.load(open("%s/llama-%s-%d.json" % (work, b, r))):
            name = "pp%d" % t["n_prompt"] if t["n_gen"] == 0 else "tg%d" % t["n_gen"]
            ll.setdefault(name, []).extend(t["samples_ts"])
    for test in ("pp128", "pp512", "tg128"):
        a, c = rx.get(test, []), ll.get(test, [])
        rows.append((b, test, med(a), min(a), max(a), med(c), min(c), max(c), med(a) / med(c)))
    tg_rx, tg_ll, bwm = med(rx["tg128"]), med(ll["tg128"]), med(bw)
    roof.append((b, size, bwm, min(bw), max(bw), tg_rx, size * tg_rx / (bwm * 1e9), tg_ll,
                 size * tg_ll / (bwm * 1e9)))
load = [float(x) for x in open(work + "/load").read().split()]
L = []
L.append("| model | test | radix tok/s (min..max) | llama.cpp tok/s (min..max) | radix / llama.cpp |")
L.append("|---|---|---:|---:|---:|")
for b, t, a, amin, amax, c, cmin, cmax, ratio in rows:
    L.append("| %s | %s | %.2f (%.2f..%.2f) | %.2f (%.2f..%.2f) | **%.2f** |" % (b, t, a, amin, amax, c, cmin, cmax, ratio))
L.append("")
L.append("| model | weight bytes | read bandwidth GB/s, median (min..max) | radix tg128 | radix roofline | llama.cpp tg128 | llama.cpp roofline |")
L.append("|---|---:|---:|---:|---:|---:|---:|")
for b, size, bwm, bmin, bmax, trx, frx, tll, fll in roof:
    L.append("| %s | %d | %.2f (%.2f..%.2f) | %.2f | %.2f | %.2f | %.2f |" % (b, size, bwm, bmin, bmax, trx, frx, tll, fll))
L.append("")
L.append("%d interleaved rounds (radix, llama.cpp, per model), %s threads, medians; "
         "1-minute load average at the start of each round: %s." %
         (rounds, threads, " ".join("%.2f" % x for x in load)))
L.append("")
L.append("llama.cpp build check (greedy continuation vs the reference greedy_ids):")
L.append("")
for line in open(check):
    if "prompts pass" in line:
        L.append("- " + line.strip())
text = "\n".join(L) + "\n"
open(out, "w").write(text)
sys.stdout.write(text)
print("(written to %s)" % out, file=sys.stderr)
EOF
