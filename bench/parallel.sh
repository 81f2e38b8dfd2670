#!/bin/sh
# bench/parallel.sh -- radixd with several ranks on this machine: throughput
# of tp_size 1 vs 2 and dp_size 1 vs 2 under the same load, and the cost of
# the peer schedulers' step sync (rank 0's per-step broadcast), which each
# rank logs at shutdown as a share of the mean decode step.
#
# usage: bench/parallel.sh [-k REPS] [-c CONFIGS] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]
#   MODEL       default .cache/bench/smollm2-360m-q8_0.gguf
#   -k REPS     repetitions, medians reported (default 3)
#   -c LIST     configurations (default tp1,tp2,dp2): tp1 = one rank with
#               every core's thread, tp2 / dp2 = two ranks with CORES/2
#               threads each (the same cores in all three)
#   -b DIR      a configured radix build dir (default: the current directory)
#   -o FILE     the markdown table (default .cache/bench/parallel.md)
#   env: IN_LEN=128 OUT_LEN=64 PROMPTS=24 CONC=8 CORES=$(nproc)
set -eu
me=parallel
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
reps=3
configs=tp1,tp2,dp2
build=$(pwd)
out="$top/.cache/bench/parallel.md"
usage () {
    echo "usage: $0 [-k REPS] [-c tp1,tp2,dp2] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]" >&2
    exit 2
}
while getopts k:c:b:o: opt; do
    case $opt in
        k) reps=$OPTARG ;;
        c) configs=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || usage
model=${1:-$top/.cache/bench/smollm2-360m-q8_0.gguf}
case $reps in ''|*[!0-9]*|0) echo "parallel: -k $reps: want a count >= 1" >&2; exit 2 ;; esac
for c in $(echo "$configs" | tr , ' '); do
    case $c in tp1|tp2|dp2) ;; *) echo "parallel: -c: unknown configuration '$c' (tp1, tp2, dp2)" >&2; exit 2 ;; esac
done
IN_LEN=${IN_LEN:-128}
OUT_LEN=${OUT_LEN:-64}
PROMPTS=${PROMPTS:-24}
CONC=${CONC:-8}
CORES=${CORES:-$(nproc)}
half=$((CORES / 2)); [ $half -ge 1 ] || half=1
[ -r "$model" ] || { echo "parallel: $model: cannot read the model" >&2; exit 1; }
bl_find "$build"

bl_workdir
work=$tmp

# start CONFIG REP
start () {
    case $1 in
        tp1) tp=1 dp=1 th=$CORES ;;
        tp2) tp=2 dp=1 th=$half ;;
        dp2) tp=1 dp=2 th=$half ;;
    esac
    ini="$work/$1.ini"
    cat >"$ini" <<EOF
; written by bench/parallel.sh
[server]
host = 127.0.0.1
port = 0
[plugins]
path = $RX_PLUGIN_BUILD_DIR
[model]
path = $model
[kernels]
threads = $th
[cache]
kv_memory = 512MiB
[parallel]
tp_size = $tp
dp_size = $dp
comm = shm
[dp]
policy = shortest_queue
EOF
    bl_radixd "$ini" "$work/$1-$2.log" "$1"
}

r=1
while [ $r -le "$reps" ]; do
    for c in $(echo "$configs" | tr , ' '); do
        start "$c" "$r"
        echo "rep $r/$reps: $c (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        python3 "$top/bench/serving.py" --base-url "http://127.0.0.1:$port" --quiet --label "$c" \
            --dataset random --input-len "$IN_LEN" --output-len "$OUT_LEN" --num-prompts "$PROMPTS" \
            --concurrency "$CONC" --seed $((1000 * r)) --json "$work/$c-$r.json" >"$work/$c-$r.out" 2>&1 \
            || { echo "parallel: bench/serving.py failed against $c:" >&2; tail -5 "$work/$c-$r.out" >&2; exit 1; }
        bl_stop "$bl_pid"
    done
    r=$((r + 1))
done

mkdir -p "$(dirname "$out")"
python3 - "$work" "$reps" "$configs" "$out" "$model" "$CORES" "$IN_LEN" "$OUT_LEN" "$PROMPTS" "$CONC" <<'EOF'
import glob, json, os, re, statistics as st, sys
work, reps, configs, out, model, cores, inl, outl, n, conc = sys.argv[1:11]
reps = int(reps)
rows = []
base = None
for c in configs.split(","):
    tps, ttft, sync = [], [], []
    for r in range(1, reps + 1):
        p = "%s/%s-%d.json" % (work, c, r)
        if os.path.exists(p):
            s = json.load(open(p))["summary"]
            tps.append(s["output_throughput"])
            ttft.append(s["ttft_ms"]["median"])
        log = "%s/%s-%d.log" % (work, c, r)
        if os.path.exists(log):
            for m in re.finditer(r"step sync ([0-9.]+) us per decode step, ([0-9.]+)% of the mean step \(([0-9.]+) ms",
                                 open(log, errors="replace").read()):
                sync.append((float(m.group(1)), float(m.group(2)), float(m.group(3))))
    if not tps:
        continue
    t = st.median(tps)
    if base is None:
        base = t
    share = "-"
    if sync:
        worst = max(sync, key=lambda x: x[1])
        share = "%.1f us = %.2f%% of a %.1f ms step (worst rank, median over runs %.2f%%)" % (
            worst[0], worst[1], worst[2], st.median(x[1] for x in sync))
    rows.append("| %s | %.1f | %.2fx | %.0f | %s |" % (c, t, t / base, st.median(ttft), share))
with open(out, "w") as f:
    f.write("model %s, %s cores, %s prompts of %s tokens -> %s tokens, concurrency %s, median of %d\n\n"
            % (os.path.basename(model), cores, n, inl, outl, conc, reps))
    f.write("| config | output tok/s | vs first | median TTFT ms | step sync |\n|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(out).read())
EOF
