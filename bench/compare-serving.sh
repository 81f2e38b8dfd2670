#!/bin/sh
# bench/compare-serving.sh -- radixd vs llama.cpp's llama-server under serving
# load, side by side, in one run, on the same GGUF and thread count.
#
# usage: bench/compare-serving.sh [-k REPS] [-t THREADS] [-w WORKLOADS]
#                                 [-s SERVERS] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]
#   MODEL      default .cache/bench/smollm2-360m-q8_0.gguf
#   -k REPS    repetitions of every measurement, medians reported (default 3)
#   -t THREADS compute threads of both servers (default 2)
#   -w LIST    comma-separated workloads (default s1,s16,prefix):
#                s1      1 stream:   random dataset, ~IN_LEN prompt tokens,
#                        OUT_LEN output tokens, S1_PROMPTS requests in a row
#                s16     16 streams: the same, concurrency 16, S16_PROMPTS requests
#                prefix  shared-prefix dataset (SP_GROUPS system prompts of
#                        SP_PREFIX tokens, SP_SUFFIX-token questions, SP_OUT
#                        output tokens, SP_PROMPTS requests, concurrency
#                        SP_CONC): radixd with [cache] radix_cache = true and
#                        = false, and llama-server with its per-slot prompt cache
#   -s LIST    servers (default llama,radixd); "-s llama" measures the peer
#              alone and leaves the radixd column "not yet measured"
#   -b DIR     a configured radix build dir (default: the current directory)
#   -o FILE    the markdown table for docs/benchmarks.md
#              (default .cache/bench/serving.md)
#   env: RADIXD (default BUILD_DIR/core/radixd), RX_PLUGIN_BUILD_DIR (plugin
#        folder, default BUILD_DIR/_plugins), LLAMA_BIN (default
#        .cache/llamacpp/build-portable/bin, made by bench/build-llamacpp.sh),
#        the sizes above (IN_LEN=128 OUT_LEN=64 S1_PROMPTS=4 S16_PROMPTS=32
#        SP_GROUPS=2 SP_PREFIX=512 SP_SUFFIX=32 SP_OUT=16 SP_PROMPTS=32 SP_CONC=4:
#        16 requests per system prompt, as in SGLang's generated-shared-prefix
#        defaults; the first request of a group pays for the whole prefix, so
#        fewer requests per group bound the cache's TTFT gain lower).
#
# Each repetition starts every server afresh (empty caches), so the servers
# are interleaved and background load on this shared box hits both alike:
#   llama-server -m M -t T -np 16 -c 16xCTX --cont-batching: s1, s16, prefix
#   radixd, radix_cache = true:                              s1, s16, prefix
#   radixd, radix_cache = false:                             prefix
# Every workload of a repetition uses its own --seed, the same for every
# server, so the servers see the same prompts.  The load generator is
# bench/serving.py (streaming /v1/completions, ignore_eos, greedy).  The
# servers are always stopped on exit.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
reps=3
threads=2
workloads=s1,s16,prefix
servers=llama,radixd
build=$(pwd)
out="$top/.cache/bench/serving.md"
usage () {
    echo "usage: $0 [-k REPS] [-t THREADS] [-w s1,s16,prefix] [-s llama,radixd] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]" >&2
    exit 2
}
while getopts k:t:w:s:b:o: opt; do
    case $opt in
        k) reps=$OPTARG ;;
        t) threads=$OPTARG ;;
        w) workloads=$OPTARG ;;
        s) servers=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || usage
model=${1:-$top/.cache/bench/smollm2-360m-q8_0.gguf}
case $reps in ''|*[!0-9]*|0) echo "compare-serving: -k $reps: want a count >= 1" >&2; exit 2 ;; esac
case $threads in ''|*[!0-9]*|0) echo "compare-serving: -t $threads: want a count >= 1" >&2; exit 2 ;; esac
for w in $(echo "$workloads" | tr , ' '); do
    case $w in s1|s16|prefix) ;; *) echo "compare-serving: -w: unknown workload '$w' (s1, s16, prefix)" >&2; exit 2 ;; esac
done
has () { case ",$1," in *",$2,"*) return 0 ;; *) return 1 ;; esac; }
for s in $(echo "$servers" | tr , ' '); do
    case $s in llama|radixd) ;; *) echo "compare-serving: -s: unknown server '$s' (llama, radixd)" >&2; exit 2 ;; esac
done

IN_LEN=${IN_LEN:-128}
OUT_LEN=${OUT_LEN:-64}
S1_PROMPTS=${S1_PROMPTS:-4}
S16_PROMPTS=${S16_PROMPTS:-32}
SP_GROUPS=${SP_GROUPS:-2}
SP_PREFIX=${SP_PREFIX:-512}
SP_SUFFIX=${SP_SUFFIX:-32}
SP_OUT=${SP_OUT:-16}
SP_PROMPTS=${SP_PROMPTS:-32}
SP_CONC=${SP_CONC:-4}
LLAMA_BIN=${LLAMA_BIN:-$top/.cache/llamacpp/build-portable/bin}
RADIXD=${RADIXD:-$build/core/radixd}
RX_PLUGIN_BUILD_DIR=${RX_PLUGIN_BUILD_DIR:-$build/_plugins}
serving="$top/bench/serving.py"

[ -r "$model" ] || { echo "compare-serving: $model: cannot read the model" >&2; exit 1; }
command -v python3 >/dev/null || { echo "compare-serving: python3 is needed (bench/serving.py)" >&2; exit 1; }
command -v curl >/dev/null || { echo "compare-serving: curl is needed to wait for /health" >&2; exit 1; }
if has "$servers" llama; then
    [ -x "$LLAMA_BIN/llama-server" ] || { echo "compare-serving: $LLAMA_BIN/llama-server: not found (run bench/build-llamacpp.sh)" >&2; exit 1; }
fi
if has "$servers" radixd; then
    [ -x "$RADIXD" ] || { echo "compare-serving: $RADIXD: radixd not found (set RADIXD, -b BUILD_DIR, or -s llama)" >&2; exit 1; }
    [ -d "$RX_PLUGIN_BUILD_DIR" ] || { echo "compare-serving: $RX_PLUGIN_BUILD_DIR: no plugin folder (set RX_PLUGIN_BUILD_DIR or -b BUILD_DIR)" >&2; exit 1; }
fi

work=$(mktemp -d)
srv_pid=
stop_server () {
    [ -n "$srv_pid" ] || return 0
    kill "$srv_pid" 2>/dev/null || true
    i=0
    while kill -0 "$srv_pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$srv_pid" 2>/dev/null || true
    wait "$srv_pid" 2>/dev/null || true
    srv_pid=
}
cli_pid=
cleanup () {
    if [ -n "$cli_pid" ]; then kill "$cli_pid" 2>/dev/null || true; fi
    stop_server
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free port (bind to 0 and read it back; the window before the server binds
# it is small, and a collision shows as "did not come up").
free_port () {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_up NAME LOG: poll /health until 200 while the server lives.
wait_up () {
    i=0
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 "$srv_pid" 2>/dev/null; then
            echo "compare-serving: $1 did not come up on port $port; the end of its log ($2):" >&2
            tail -5 "$2" >&2
            exit 1
        fi
        sleep 0.2
    done
}

# The context of one llama-server slot must hold the longest request;
# -np 16 splits -c evenly, so -c = 16 x that, rounded up to 256 tokens.
per_slot=$((IN_LEN + OUT_LEN))
sp=$((SP_PREFIX + SP_SUFFIX + SP_OUT))
[ $sp -le $per_slot ] || per_slot=$sp
per_slot=$(( (per_slot + 64 + 255) / 256 * 256 ))
llama_ctx=$((16 * per_slot))

start_llama () {
    port=$(free_port)
    "$LLAMA_BIN/llama-server" -m "$model" -t "$threads" -np 16 -c "$llama_ctx" --cont-batching \
        --host 127.0.0.1 --port "$port" >"$work/llama.log" 2>&1 &
    srv_pid=$!
    wait_up llama-server "$work/llama.log"
}

# start_radixd true|false
start_radixd () {
    port=$(free_port)
    ini="$work/radixd-$1.ini"
    cat >"$ini" <<EOF
; written by bench/compare-serving.sh
[server]
host = 127.0.0.1
port = $port
[plugins]
path = $RX_PLUGIN_BUILD_DIR
[model]
path = $model
[kernels]
threads = $threads
[cache]
kv_memory = 1GiB
radix_cache = $1
EOF
    "$RADIXD" -c "$ini" --check-config >"$work/radixd-check.log" 2>&1 \
        || { echo "compare-serving: radixd rejects $ini:" >&2; tail -5 "$work/radixd-check.log" >&2; exit 1; }
    "$RADIXD" -c "$ini" >"$work/radixd-$1.log" 2>&1 &
    srv_pid=$!
    wait_up radixd "$work/radixd-$1.log"
}

# run TAG WORKLOAD REP: one bench/serving.py run against the server up now.
run () {
    tag=$1 w=$2 rep=$3
    seed=$((1000 * rep))
    case $w in
        s1) set -- --dataset random --input-len "$IN_LEN" --output-len "$OUT_LEN" \
                   --num-prompts "$S1_PROMPTS" --concurrency 1 --seed $((seed + 1)) ;;
        s16) set -- --dataset random --input-len "$IN_LEN" --output-len "$OUT_LEN" \
                    --num-prompts "$S16_PROMPTS" --concurrency 16 --seed $((seed + 16)) ;;
        prefix) set -- --dataset shared-prefix --num-groups "$SP_GROUPS" --prefix-len "$SP_PREFIX" \
                       --suffix-len "$SP_SUFFIX" --output-len "$SP_OUT" --num-prompts "$SP_PROMPTS" \
                       --concurrency "$SP_CONC" --seed $((seed + 99)) ;;
    esac
    echo "rep $rep/$reps: $tag $w (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    rc=0
    # in the background + wait, so that a TERM reaches the trap at once
    python3 "$serving" --base-url "http://127.0.0.1:$port" --quiet --label "$tag $w" \
        --json "$work/$tag-$w-$rep.json" "$@" >"$work/$tag-$w-$rep.log" 2>&1 &
    cli_pid=$!
    wait "$cli_pid" || rc=$?
    cli_pid=
    # 1 = some requests failed: counted in the table; 2 = no run at all
    if [ $rc -ge 2 ] || [ ! -s "$work/$tag-$w-$rep.json" ]; then
        echo "compare-serving: bench/serving.py failed against $tag ($w):" >&2
        tail -5 "$work/$tag-$w-$rep.log" >&2
        exit 1
    fi
}

r=1
while [ $r -le "$reps" ]; do
    cut -d' ' -f1 /proc/loadavg >>"$work/load"
    if has "$servers" llama; then
        start_llama
        for w in s1 s16 prefix; do
            if has "$workloads" $w; then run llama $w $r; fi
        done
        stop_server
    fi
    if has "$servers" radixd; then
        start_radixd true
        for w in s1 s16 prefix; do
            if has "$workloads" $w; then run radixd $w $r; fi
        done
        stop_server
        if has "$workloads" prefix; then
            start_radixd false
            run radixd-nocache prefix $r
            stop_server
        fi
    fi
    r=$((r + 1))
done
cut -d' ' -f1 /proc/loadavg >>"$work/load"

mkdir -p "$(dirname "$out")"
export IN_LEN OUT_LEN S1_PROMPTS S16_PROMPTS SP_GROUPS SP_PREFIX SP_SUFFIX SP_OUT SP_PROMPTS SP_CONC
python3 - "$work" "$reps" "$threads" "$out" "$model" "$workloads" "$servers" "$llama_ctx" <<'EOF'
import json, os, statistics as st, sys
work, reps, threads, out, model, workloads, servers, ctx = sys.argv[1:9]
reps = int(reps)
W, S = workloads.split(","), servers.split(",")
E = lambda k: int(os.environ[k])
IN, OUT = E("IN_LEN"), E("OUT_LEN")
SP = dict(groups=E("SP_GROUPS"), prefix=E("SP_PREFIX"), suffix=E("SP_SUFFIX"), out=E("SP_OUT"),
          n=E("SP_PROMPTS"), conc=E("SP_CONC"))
N1, N16 = E("S1_PROMPTS"), E("S16_PROMPTS")

def runs(tag, w):
    v = []
    for r in range(1, reps + 1):
        p = "%s/%s-%s-%d.json" % (work, tag, w, r)
        if os.path.exists(p):
            v.append(json.load(open(p))["summary"])
    return v

def get(s, key):
    if "." in key:
        a, b = key.split(".")
        return (s.get(a) or {}).get(b)
    return s.get(key)

def med(tag, w, key):
    v = [get(s, key) for s in runs(tag, w)]
    v = [x for x in v if x is not None]
    return (st.median(v), min(v), max(v)) if v else None

def failed(tag, w):
    return sum(s["failed"] for s in runs(tag, w))

def cell(m, nd=1, pct=False):
    if m is None:
        return "n/a"
    k = 100 if pct else 1
    if reps == 1:
        return "%.*f%s" % (nd, k * m[0], "%" if pct else "")
    return "%.*f (%.*f..%.*f)%s" % (nd, k * m[0], nd, k * m[1], nd, k * m[2], "%" if pct else "")

NOT = "not yet measured"
L = []
tp = [w for w in ("s1", "s16") if w in W]
if tp:
    L.append("| workload | metric | llama-server | radixd | radixd / llama-server |")
    L.append("|---|---|---:|---:|---:|")
    names = {"s1": "1 stream, %d x (%d in, %d out)" % (N1, IN, OUT),
             "s16": "16 streams, %d x (%d in, %d out)" % (N16, IN, OUT)}
    metrics = [("output_throughput", "output tok/s", 1, True), ("request_throughput", "requests/s", 3, True),
               ("ttft_ms.mean", "mean TTFT ms", 0, False), ("tpot_ms.mean", "mean TPOT ms", 1, False),
               ("itl_ms.median", "median ITL ms", 1, False)]
    for w in tp:
        for key, label, nd, higher in metrics:
            a = med("llama", w, key) if "llama" in S else None
            b = med("radixd", w, key) if "radixd" in S else None
            ratio = "-"
            if a and b and a[0] > 0 and b[0] > 0:
                ratio = "%.2f" % (b[0] / a[0])
                if key == "output_throughput":
                    ratio = "**%s**" % ratio
            L.append("| %s | %s | %s | %s | %s |" % (names[w], label, cell(a, nd) if "llama" in S else NOT,
                                                    cell(b, nd) if "radixd" in S else NOT, ratio))
    L.append("")
if "prefix" in W:
    L.append("Shared prefix: %d system prompts of %d tokens, %d requests (%d-token questions, %d out), concurrency %d:"
             % (SP["groups"], SP["prefix"], SP["n"], SP["suffix"], SP["out"], SP["conc"]))
    L.append("")
    L.append("| server | mean TTFT ms | median TTFT ms | p99 TTFT ms | cache hit rate | output tok/s |")
    L.append("|---|---:|---:|---:|---:|---:|")
    rows = [("llama", "llama-server (per-slot prompt cache)", "llama" in S),
            ("radixd", "radixd, radix_cache = true", "radixd" in S),
            ("radixd-nocache", "radixd, radix_cache = false", "radixd" in S)]
    for tag, label, on in rows:
        if not on:
            L.append("| %s | %s | %s | %s | %s | %s |" % ((label,) + (NOT,) * 5))
            continue
        L.append("| %s | %s | %s | %s | %s | %s |" % (label, cell(med(tag, "prefix", "ttft_ms.mean"), 0),
                 cell(med(tag, "prefix", "ttft_ms.median"), 0), cell(med(tag, "prefix", "ttft_ms.p99"), 0),
                 cell(med(tag, "prefix", "cache_hit_rate"), 1, True),
                 cell(med(tag, "prefix", "output_throughput"), 1)))
    L.append("")
    on, off = med("radixd", "prefix", "ttft_ms.mean"), med("radixd-nocache", "prefix", "ttft_ms.mean")
    mon, moff = med("radixd", "prefix", "ttft_ms.median"), med("radixd-nocache", "prefix", "ttft_ms.median")
    if on and off:
        # the mean carries the cold first requests of each group, which
        # cost the same with the cache on or off; the median shows the hits
        L.append("Mean TTFT, radix cache off / on: **%.2fx** (target >= 5x); median: %.2fx." %
                 (off[0] / on[0], moff[0] / mon[0]))
    else:
        L.append("Mean TTFT, radix cache off / on: %s (target >= 5x)." % NOT)
    L.append("")
a, b = med("llama", "s16", "output_throughput"), med("radixd", "s16", "output_throughput")
if "s16" in W:
    L.append("Output throughput at 16 streams, radixd / llama-server: %s (target >= 1.5x)." %
             ("**%.2fx**" % (b[0] / a[0]) if a and b else NOT))
    L.append("")
fails = [(t, w, failed(t, w)) for t in ("llama", "radixd", "radixd-nocache") for w in ("s1", "s16", "prefix")
         if runs(t, w) and failed(t, w)]
for t, w, n in fails:
    L.append("WARNING: %d failed requests in %s %s (see the runs' JSON)." % (n, t, w))
load = [float(x) for x in open(work + "/load").read().split()]
peer = ", llama-server -np 16 -c %s --cont-batching" % ctx if "llama" in S else ""
L.append("%s, %s threads%s; %d repetition(s), median (min..max); "
         "1-minute load average at the start of each repetition: %s." %
         (os.path.basename(model), threads, peer, reps, " ".join("%.2f" % x for x in load)))
text = "\n".join(L) + "\n"
open(out, "w").write(text)
sys.stdout.write(text)
print("(written to %s)" % out, file=sys.stderr)
EOF
