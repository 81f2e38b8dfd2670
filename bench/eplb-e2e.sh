#!/bin/sh
# bench/eplb-e2e.sh -- the end-to-end effect of an EPLB placement on decode
# throughput: radixd with DP attention over RANKS ranks and expert
# parallelism (ep_size = RANKS, comm-shm), the same load under placements:
#   none      no [eplb] key: the identity, expert e on GPU e*RANKS/E
#   bad       a deliberately unbalanced placement with the same slot count
#             as the EPLB ones: GPU 0 holds the most-loaded experts (their
#             only copies), the other GPUs the rest, repeated
#   deepseek  `radix eplb --algorithm deepseek` of a recorded dump
#   greedy    `radix eplb --algorithm greedy` of the same dump
# (the last three with E + REDUNDANT physical slots, [eplb]
# init_expert_location = the placement file).
#
# 1. record: one radixd, POST /start_expert_distribution_record, the load
#    once, POST /dump_expert_distribution_record -> the load file (rank 0's
#    tokens: without rebalance_interval the window is rank 0's own);
# 2. plan: radix eplb for both algorithms, the bad placement here;
# 3. measure: per placement and repetition a fresh radixd, bench/serving.py
#    (random prompts of IN_LEN tokens, OUT_LEN output tokens each,
#    concurrency CONC spread over the ranks by the DP controller); the
#    medians of output tok/s and TPOT, and each placement's balancedness
#    (mean / max GPU load, a logical expert's load split evenly over its
#    copies, mean over MoE layers) under the recorded load.
#
# usage: bench/eplb-e2e.sh [-k REPS] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]
#   MODEL       default $RADIX_SHARED/data/models/tiny-moe.gguf
#               (RADIX_SHARED default: ../shared next to the source tree)
#   -k REPS     repetitions per placement, medians reported (default 3)
#   -b DIR      a configured radix build dir (default: the current directory)
#   -o FILE     the markdown table (default .cache/bench/eplb-e2e.md)
#   env: RANKS=4 REDUNDANT=4 IN_LEN=16 OUT_LEN=64 PROMPTS=32 CONC=8 THREADS=1
set -eu
me="eplb-e2e"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
reps=3
build=$(pwd)
out="$top/.cache/bench/eplb-e2e.md"
usage () {
    echo "usage: $0 [-k REPS] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]" >&2
    exit 2
}
while getopts k:b:o: opt; do
    case $opt in
        k) reps=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || usage
shared=${RADIX_SHARED:-$top/../shared}
model=${1:-$shared/data/models/tiny-moe.gguf}
case $reps in ''|*[!0-9]*|0) echo "eplb-e2e: -k $reps: want a count >= 1" >&2; exit 2 ;; esac
RANKS=${RANKS:-4}
REDUNDANT=${REDUNDANT:-4}
IN_LEN=${IN_LEN:-16}
OUT_LEN=${OUT_LEN:-64}
PROMPTS=${PROMPTS:-32}
CONC=${CONC:-8}
THREADS=${THREADS:-1}
for v in RANKS:$RANKS REDUNDANT:$REDUNDANT IN_LEN:$IN_LEN OUT_LEN:$OUT_LEN PROMPTS:$PROMPTS CONC:$CONC THREADS:$THREADS; do
    case ${v#*:} in ''|*[!0-9]*) echo "eplb-e2e: ${v%%:*}=${v#*:}: want a number" >&2; exit 2 ;; esac
done
[ "$RANKS" -ge 2 ] || { echo "eplb-e2e: RANKS=$RANKS: want >= 2 (expert parallelism)" >&2; exit 2; }
[ -r "$model" ] || { echo "eplb-e2e: $model: cannot read the model" >&2; exit 1; }
bl_find "$build"
[ -x "$RADIX" ] || { echo "eplb-e2e: $RADIX: radix not found (set RADIX or -b BUILD_DIR)" >&2; exit 1; }
command -v curl >/dev/null || { echo "eplb-e2e: curl is needed" >&2; exit 1; }

bl_workdir
work=$tmp

# start NAME [PLACEMENT_FILE]
start () {
    ini="$work/$1.ini"
    cat >"$ini" <<EOF
; written by bench/eplb-e2e.sh
[server]
host = 127.0.0.1
port = 0
[plugins]
path = $RX_PLUGIN_BUILD_DIR
[model]
path = $model
[kernels]
threads = $THREADS
[cache]
kv_memory = 64MiB
radix_cache = false
[parallel]
tp_size = $RANKS
dp_size = $RANKS
dp_attention = true
ep_size = $RANKS
comm = shm
[moe]
dispatcher = ep_auto
[dp]
policy = round_robin
[eplb]
record_dir = $work/rec
EOF
    [ $# -lt 2 ] || echo "init_expert_location = $2" >>"$ini"
    bl_radixd "$ini" "$work/$1.log" "$1"
}

# load NAME SEED: the serving load against the running radixd
load () {
    python3 "$top/bench/serving.py" --base-url "http://127.0.0.1:$port" --quiet --label "$1" \
        --dataset random --input-len "$IN_LEN" --output-len "$OUT_LEN" --num-prompts "$PROMPTS" \
        --concurrency "$CONC" --seed "$2" --json "$work/$1.json" >"$work/$1.out" 2>&1 \
        || { echo "eplb-e2e: bench/serving.py failed ($1):" >&2; tail -5 "$work/$1.out" >&2; exit 1; }
}

# 1. record
start record
curl -sf -X POST "http://127.0.0.1:$port/start_expert_distribution_record" >/dev/null \
    || { echo "eplb-e2e: /start_expert_distribution_record failed (a dense model?)" >&2; exit 1; }
load record 7
dump=$(curl -sf -X POST "http://127.0.0.1:$port/dump_expert_distribution_record" \
       | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])') \
    || { echo "eplb-e2e: /dump_expert_distribution_record failed" >&2; exit 1; }
bl_stop "$bl_pid"
cp "$dump" "$work/load.json"

# 2. plan
experts=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["load"][0]))' "$work/load.json")
phys=$((experts + REDUNDANT))
[ $((phys % RANKS)) -eq 0 ] || { echo "eplb-e2e: $experts experts + REDUNDANT=$REDUNDANT slots do not split over $RANKS ranks" >&2; exit 2; }
for a in deepseek greedy; do
    RADIX_PLUGIN_PATH=$RX_PLUGIN_BUILD_DIR "$RADIX" eplb --algorithm $a --load "$work/load.json" --physical $phys --groups 1 --nodes 1 \
        --gpus "$RANKS" >"$work/$a.place.json" \
        || { echo "eplb-e2e: radix eplb --algorithm $a failed" >&2; exit 1; }
done
python3 - "$work/load.json" "$phys" "$RANKS" "$work/bad.place.json" <<'EOF'
# GPU 0 takes the S = P/G most-loaded experts of each layer (only copies);
# the other experts fill the other GPUs' slots round-robin.
import json, sys
load = json.load(open(sys.argv[1]))["load"]
P, G = int(sys.argv[2]), int(sys.argv[3])
S = P // G
p2l = []
for row in load:
    order = sorted(range(len(row)), key=lambda e: (-row[e], e))
    hot, rest = order[:S], order[S:] or order[:1]
    p2l.append(hot + [rest[i % len(rest)] for i in range(P - S)])
json.dump({"phy2log": p2l}, open(sys.argv[4], "w"))
EOF

# 3. measure
r=1
while [ $r -le "$reps" ]; do
    for c in none bad deepseek greedy; do
        if [ $c = none ]; then start "$c-$r"; else start "$c-$r" "$work/$c.place.json"; fi
        echo "rep $r/$reps: $c (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        load "$c-$r" $((1000 * r))
        bl_stop "$bl_pid"
    done
    r=$((r + 1))
done

mkdir -p "$(dirname "$out")"
python3 - "$work" "$reps" "$out" "$model" "$RANKS" "$phys" "$IN_LEN" "$OUT_LEN" "$PROMPTS" "$CONC" "$THREADS" <<'EOF'
import json, os, statistics as st, sys
work, reps, out, model, G, P, inl, outl, n, conc, th = sys.argv[1:12]
reps, G = int(reps), int(G)
load = json.load(open(os.path.join(work, "load.json")))["load"]
E = len(load[0])

def balancedness(p2l):
    """mean / max GPU load per layer, averaged over the layers."""
    out = []
    for l, row in enumerate(load):
        slots = p2l[l] if p2l else list(range(E))
        cnt = [slots.count(e) for e in range(E)]
        S = len(slots) // G
        gl = [sum(row[e] / cnt[e] for e in slots[g * S:(g + 1) * S]) for g in range(G)]
        out.append(st.mean(gl) / max(gl) if max(gl) > 0 else 1.0)
    return st.mean(out)

tot = [sum(r) for r in load]
skew = st.mean(max(r) / (t / E) for r, t in zip(load, tot) if t)
rows, base = [], None
for c in ("none", "bad", "deepseek", "greedy"):
    p2l = None if c == "none" else json.load(open(os.path.join(work, c + ".place.json")))["phy2log"]
    tps, tpot = [], []
    for r in range(1, reps + 1):
        p = os.path.join(work, "%s-%d.json" % (c, r))
        if os.path.exists(p):
            s = json.load(open(p))["summary"]
            tps.append(s["output_throughput"])
            tpot.append(s["tpot_ms"]["median"])
    if not tps:
        continue
    t = st.median(tps)
    base = base or t
    rows.append("| %s | %d | %.3f | %.1f | %.2fx | %.1f | %s |" % (
        c, len(p2l[0]) if p2l else E, balancedness(p2l), t, t / base, st.median(tpot),
        " ".join("%.1f" % x for x in tps)))
with open(out, "w") as f:
    f.write("model %s (%d MoE layers x %d experts), DP attention %d ranks, ep_size %d (comm-shm, ep_auto), "
            "%s thread(s) per rank, %d cores; %s prompts of %s tokens -> %s tokens, concurrency %s; "
            "median of %d. Recorded load (rank 0): hottest expert %.2fx the mean per layer.\n\n"
            % (os.path.basename(model), len(load), E, G, G, th, os.cpu_count(), n, inl, outl, conc, reps, skew))
    f.write("| placement | slots | balancedness (recorded load) | output tok/s | vs none | median TPOT ms | runs tok/s |\n"
            "|---|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(out).read())
EOF
