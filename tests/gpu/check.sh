#!/bin/sh
# tests/gpu/check.sh OUTDIR -- verify the CUDA backend on a GPU machine.
#
# One script, under 8 minutes on one H100/H200 with 16 cores:
#   1. build:     configure --with-cuda (autoreconf first on a fresh checkout),
#                 make -j (kernels-cuda.so, radix, radixd, the tests);
#   2. host:      tests/unit/test_kernels_cuda_host (with a GPU its plugin
#                 test does a real alloc/copy round trip);
#   3. ops:       tests/gpu/compare -- every op of kernels-cuda against
#                 kernels-cpu on random inputs (matmul of each weight type
#                 on the matvec and the cuBLAS paths, attention GQA/F16/
#                 window/softcap/MLA shape, top-k ties, graphs);
#   4. models:    tests/unit/test_models_ref with [kernels] backend = cuda
#                 (RX_MODELS_REF_INI): the ../shared/data/models references,
#                 logits within the README tolerances, same greedy tokens;
#   5. ranks:     radixd with conf/radixd-dp-attention.ini (DP attention +
#                 expert parallelism, 2 ranks on the one GPU) on CUDA: its
#                 greedy completions must equal the CPU backend's;
#   6. bench:     a ~1B-parameter `radix gguf-gen` llama in BF16 and Q8_0:
#                 `radix bench` batch-1 decode, prefill of 512 tokens and
#                 batched decode at 1/16/64, against the measured
#                 device-to-device copy bandwidth and cuBLAS BF16 GEMM rate
#                 (tests/gpu/gpu_peak.cu).
# Full logs go to OUTDIR; the short table is printed last.  Exit status:
# 0 if every check passed, 1 otherwise (the table says which).
#
# Environment: JOBS (make -j, default nproc), CUDA_HOME (default
# /usr/local/cuda), SKIP_BENCH=1 to stop after step 5, RX_GPU_BUILD=DIR to
# reuse a configured build folder (a rerun) instead of OUTDIR/build,
# SKIP_MAKE=1 to use that folder as it is.
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=${RX_GPU_BUILD:-$OUT/build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SHARED=${RADIX_SHARED:-$SRC/../shared}
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
FAILED=0
T0=$(date +%s)

# row NAME STATUS DETAIL: one line of the final table.
row() {
  printf '%-28s %-5s %s\n' "$1" "$2" "$3" >> "$SUMMARY"
  [ "$2" = FAIL ] && FAILED=1
  printf '[%4ss] %-28s %-5s %s\n' "$(( $(date +%s) - T0 ))" "$1" "$2" "$3"
}

finish() {
  echo
  echo "== tests/gpu/check.sh: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) -- $(( $(date +%s) - T0 )) s, logs in $OUT"
  cat "$SUMMARY"
  exit $FAILED
}

# ------------------------------------------------------------------- build --
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
if [ "${SKIP_MAKE:-0}" = 1 ]; then
  row build skip "using $B as it is"
else
if [ ! -x "$SRC/configure" ]; then
  (cd "$SRC" && autoreconf -fi) > "$OUT/autoreconf.log" 2>&1 ||
    { row build FAIL "autoreconf -fi (see autoreconf.log)"; finish; }
fi
mkdir -p "$B"
if [ ! -f "$B/Makefile" ] &&
   ! (cd "$B" && "$SRC/configure" --with-cuda="$CUDA_HOME" --prefix="$B/inst") > "$OUT/configure.log" 2>&1; then
  row build FAIL "configure --with-cuda (see configure.log)"
  finish
fi
if ! make -C "$B" -j"$JOBS" > "$OUT/build.log" 2>&1 ||
   ! make -C "$B" -j"$JOBS" tests/unit/test_kernels_cuda_host tests/unit/test_models_ref \
        tests/gpu/compare >> "$OUT/build.log" 2>&1; then
  row build FAIL "make (see build.log)"
  finish
fi
row build ok "kernels-cuda.so $(du -k "$B/kernels/cuda/.libs/kernels-cuda.so" | cut -f1) KiB"
fi

export RADIX_SHARED="$SHARED" RX_TOP_SRCDIR="$SRC" RX_TOP_BUILDDIR="$B" \
       RX_PLUGIN_BUILD_DIR="$B/_plugins" RADIX_PLUGIN_PATH="$B/_plugins"

# -------------------------------------------------------------------- host --
if timeout 120 "$B/tests/unit/test_kernels_cuda_host" > "$OUT/host.log" 2>&1; then
  row host-tests ok "$(grep -o 'Tested: [0-9]* | Passing: [0-9]*' "$OUT/host.log" | tail -1)"
else
  row host-tests FAIL "see host.log"
fi

# --------------------------------------------------------------------- ops --
timeout 300 "$B/tests/gpu/compare" > "$OUT/compare.log" 2>&1
rc=$?
case $rc in
  0) row ops-vs-cpu ok "$(tail -1 "$OUT/compare.log")" ;;
  77) row ops-vs-cpu FAIL "no usable GPU: $(grep SKIP "$OUT/compare.log")"; finish ;;
  *) row ops-vs-cpu FAIL "$(grep -c '^FAIL' "$OUT/compare.log") failed (compare.log), rc $rc" ;;
esac

# ------------------------------------------------------------------ models --
CUDA_INI=$OUT/cuda.ini
# A fractional [cache] kv_memory is a share of the *host's* MemAvailable
# (core/kvpool.c), which could be more than the GPU holds: give a size.
printf '[kernels]\nbackend = cuda\n[cache]\nkv_memory = 4GiB\n' > "$CUDA_INI"
if RX_MODELS_REF_INI="$CUDA_INI" timeout 300 "$B/tests/unit/test_models_ref" --jobs=4 > "$OUT/models_ref.log" 2>&1; then
  row models-ref ok "$(grep -o 'Tested: [0-9]* | Passing: [0-9]*' "$OUT/models_ref.log" | tail -1)"
else
  row models-ref FAIL "$(grep -o 'Tested: .*' "$OUT/models_ref.log" | tail -1) (models_ref.log)"
fi

# ------------------------------------------------------------------- ranks --
# DP attention + EP: conf/radixd-dp-attention.ini, two ranks on this GPU
# (the engine puts every rank on device 0), against the same on the CPU.
serve() {   # serve BACKEND PORT LOG -> greedy completions on stdout
  sed -e "s|^backend = .*|backend = $1|" -e "s|^port = .*|port = $2|" \
      -e "s|^path = \\.\\./\\.\\./shared|path = $SHARED|" \
      "$SRC/conf/radixd-dp-attention.ini" > "$OUT/dp-$1.ini"
  "$B/core/radixd" -c "$OUT/dp-$1.ini" > "$3" 2>&1 &
  pid=$!
  python3 - "$2" <<'EOF'
import json, sys, time, urllib.request
port = sys.argv[1]
base = "http://127.0.0.1:%s" % port
for _ in range(240):
    try:
        urllib.request.urlopen(base + "/health", timeout=1).read()
        break
    except Exception:
        time.sleep(0.25)
else:
    print("radixd did not come up"); sys.exit(1)
for p in ["Hello world", "The capital of France is", "1 2 3 4 5", "Once upon a time"]:
    req = urllib.request.Request(base + "/v1/completions", method="POST",
        data=json.dumps({"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"})
    print(repr(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]))
EOF
  st=$?
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return $st
}
if serve cuda 30171 "$OUT/dp-cuda.log" > "$OUT/dp-cuda.out" 2>&1 &&
   serve cpu 30172 "$OUT/dp-cpu.log" > "$OUT/dp-cpu.out" 2>&1; then
  if cmp -s "$OUT/dp-cuda.out" "$OUT/dp-cpu.out"; then
    row dp-attention+ep ok "2 ranks on 1 GPU, 4 greedy completions equal the CPU's"
  else
    row dp-attention+ep FAIL "completions differ from the CPU's (dp-cuda.out vs dp-cpu.out)"
  fi
else
  row dp-attention+ep FAIL "radixd or a request failed (dp-*.log, dp-*.out)"
fi

[ "${SKIP_BENCH:-0}" = 1 ] && finish

# ------------------------------------------------------------------- bench --
GPU_PEAK=$OUT/gpu_peak
if "$CUDA_HOME/bin/nvcc" -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
     "$SRC/tests/gpu/gpu_peak.cu" -o "$GPU_PEAK" -lcublas > "$OUT/gpu_peak.log" 2>&1 &&
   "$GPU_PEAK" > "$OUT/gpu_peak.txt" 2>> "$OUT/gpu_peak.log"; then
  row gpu-peak ok "$(tr '\n' ' ' < "$OUT/gpu_peak.txt")"
else
  row gpu-peak FAIL "see gpu_peak.log"
fi
peak() { awk -v k="$1" '$1 == k { print $2 }' "$OUT/gpu_peak.txt" 2>/dev/null; }

for t in bf16 q8_0; do
  m=$OUT/llama-1b-$t.gguf
  if ! timeout 240 "$B/tools/radix" gguf-gen --arch llama --preset llama-1b \
         --vocab "$SHARED/data/models/tiny-llama.gguf" --type $t --out "$m" > "$OUT/gguf-gen-$t.log" 2>&1; then
    row "bench $t" FAIL "gguf-gen (gguf-gen-$t.log)"
    continue
  fi
  if timeout 300 "$B/tools/radix" bench --config "$CUDA_INI" --model "$m" --pp 512 --tg 64 \
       --batch 1,16,64 --reps 3 --bw-mib 64 --json > "$OUT/bench-$t.json" 2> "$OUT/bench-$t.log"; then
    python3 - "$OUT/bench-$t.json" "$(peak d2d_GBps)" "$(peak gemm_bf16_512_TFLOPS)" "$t" >> "$OUT/bench-table.txt" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
bw = float(sys.argv[2] or 0); tf = float(sys.argv[3] or 0); t = sys.argv[4]
by = {r["test"]: r for r in j["tests"]}
wb = j["model_bytes"]; npar = j["n_params"]
tg = [r for r in j["tests"] if r["kind"] == "tg"]
pp = [r for r in j["tests"] if r["kind"] == "pp"]
bt = [r for r in j["tests"] if r["kind"] == "batch"]
line = "%-5s %6.2f GB" % (t, wb / 1e9)
if tg:
    tps = tg[0]["tok_s"]; ach = wb * tps / 1e9
    line += " | decode b1 %7.1f tok/s, %6.0f GB/s = %3.0f%% of d2d" % (tps, ach, 100 * ach / bw if bw else 0)
if pp:
    tps = pp[0]["tok_s"]; flops = 2.0 * npar * tps / 1e12
    line += " | pp512 %8.0f tok/s, %5.1f TFLOPS = %3.0f%% of cuBLAS" % (tps, flops, 100 * flops / tf if tf else 0)
if bt:
    line += " | batch " + " ".join("b%d %.0f" % (r["batch"], r["tok_s"]) for r in bt) + " tok/s"
print(line)
EOF
    row "bench $t" ok "$(tail -1 "$OUT/bench-table.txt")"
  else
    row "bench $t" FAIL "radix bench (bench-$t.log)"
  fi
done
echo "targets (issue 9): decode b1 >= 70% of d2d bandwidth; pp512 >= 50% of cuBLAS BF16" >> "$SUMMARY"
finish
