#!/bin/sh
# bench/router-hitrate.sh -- what cache-aware routing buys: radix-router with
# cache_aware vs round_robin in front of the same radixd workers, under a
# multi-turn workload (many conversations, each turn re-sending its history),
# reporting the cached-token ratio and the throughput (SGLang's v0.4 blog
# compared the same two policies: 3.8x hit rate, 1.9x throughput).
#
# usage: bench/router-hitrate.sh [-k REPS] [-n WORKERS] [-t THREADS] [-p POLICIES]
#                                [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]
#   MODEL       default .cache/bench/smollm2-135m-q8_0.gguf, made when missing
#               by `radix gguf-gen --preset smollm2-135m` with the StarCoder
#               vocabulary from $RADIX_SHARED (random weights: the cost of
#               a token is the real model's, the text is noise)
#   -k REPS     repetitions, medians reported (default 3)
#   -n WORKERS  radixd workers (default 4)
#   -t THREADS  compute threads per worker (default 1)
#   -p LIST     policies compared (default cache_aware,round_robin,random:
#               random is the baseline whose affinity is 1/WORKERS by
#               construction; round_robin's depends on how the concurrency
#               and the worker count line up, see docs/benchmarks.md)
#   -b DIR      a configured radix build dir (default: the current directory)
#   -o FILE     the markdown table (default .cache/bench/router-hitrate.md)
#   env: WORKLOAD=multi-turn (default) or shared-prefix, and its sizes:
#        multi-turn: CONVS=16 TURNS=4 IN_LEN=128 OUT_LEN=16 CONC=8 KV=256MiB
#          (bench/serving.py --dataset multi-turn: CONVS conversations of
#          TURNS turns, each turn adds IN_LEN new tokens and asks for
#          OUT_LEN, CONC conversations at a time; KV per worker)
#        shared-prefix: GSP_GROUPS=16 GSP_PER_GROUP=12 GSP_SYS_LEN=256 GSP_Q_LEN=32
#          OUT_LEN=16 CONC=8 KV=64MiB (bench/serving.py --dataset
#          shared-prefix, SGLang's generated-shared-prefix: GSP_GROUPS system
#          prompts of GSP_SYS_LEN tokens, GSP_PER_GROUP questions of GSP_Q_LEN tokens
#          each, all GSP_GROUPS x GSP_PER_GROUP requests shuffled, CONC in flight).
#          The defaults put the working set (16 x 256 = 4096 tokens of
#          system prompts) at 2.8x one worker's KV (64MiB = 1456 tokens of
#          the default model's 46080 bytes/token) and 0.7x the 4 workers'
#          together: cache_aware can partition the groups (4 per worker,
#          1024 tokens, fit) while round_robin sends every group to every
#          worker and each one's LRU thrashes (docs/benchmarks.md).
#        RADIX_SHARED.
#
# The workers start once and stay up; before every run their prefix caches
# are flushed (POST /flush_cache) and the router is started afresh with the
# policy under test, so each run starts cold.  Within a repetition every
# policy sees the same prompts (same --seed); the order of the policies is
# reversed every other repetition.  The cached-token ratio is
# bench/serving.py's sum(usage.prompt_tokens_details.cached_tokens) /
# sum(usage.prompt_tokens).
set -eu
me="router-hitrate"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
reps=3
nw=4
threads=1
policies=cache_aware,round_robin,random
build=$(pwd)
out="$top/.cache/bench/router-hitrate.md"
usage () {
    echo "usage: $0 [-k REPS] [-n WORKERS] [-t THREADS] [-p cache_aware,round_robin,random] [-b BUILD_DIR] [-o OUT.md] [MODEL.gguf]" >&2
    exit 2
}
while getopts k:n:t:p:b:o: opt; do
    case $opt in
        k) reps=$OPTARG ;;
        n) nw=$OPTARG ;;
        t) threads=$OPTARG ;;
        p) policies=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || usage
num () { bl_count "$@"; }
num -k "$reps"; num -n "$nw"; num -t "$threads"
WORKLOAD=${WORKLOAD:-multi-turn}
case $WORKLOAD in
    multi-turn)
        CONVS=${CONVS:-16} TURNS=${TURNS:-4} IN_LEN=${IN_LEN:-128} OUT_LEN=${OUT_LEN:-16} CONC=${CONC:-8} KV=${KV:-256MiB}
        for v in "$CONVS" "$TURNS" "$IN_LEN" "$OUT_LEN" "$CONC"; do num "workload size" "$v"; done
        wl_args="--dataset multi-turn --num-prompts $CONVS --turns $TURNS --input-len $IN_LEN"
        wl_desc="multi-turn: $CONVS conversations x $TURNS turns, +$IN_LEN tokens per turn, $OUT_LEN out, concurrency $CONC, KV $KV per worker" ;;
    shared-prefix)
        GSP_GROUPS=${GSP_GROUPS:-16} GSP_PER_GROUP=${GSP_PER_GROUP:-12} GSP_SYS_LEN=${GSP_SYS_LEN:-256} GSP_Q_LEN=${GSP_Q_LEN:-32}
        OUT_LEN=${OUT_LEN:-16} CONC=${CONC:-8} KV=${KV:-64MiB}
        for v in "$GSP_GROUPS" "$GSP_PER_GROUP" "$GSP_SYS_LEN" "$GSP_Q_LEN" "$OUT_LEN" "$CONC"; do num "workload size" "$v"; done
        wl_args="--dataset shared-prefix --gsp-groups $GSP_GROUPS --gsp-prompts-per-group $GSP_PER_GROUP --gsp-system-len $GSP_SYS_LEN --gsp-question-len $GSP_Q_LEN"
        wl_desc="shared-prefix: $GSP_GROUPS groups x $GSP_PER_GROUP requests, $GSP_SYS_LEN-token system prompts, $GSP_Q_LEN-token questions, $OUT_LEN out, shuffled, concurrency $CONC, KV $KV per worker" ;;
    *) echo "router-hitrate: WORKLOAD=$WORKLOAD: want multi-turn or shared-prefix" >&2; exit 2 ;;
esac
bl_build "$build"
serving="$top/bench/serving.py"
model=${1:-$top/.cache/bench/smollm2-135m-q8_0.gguf}
bl_gen_model "$model"
mkdir -p "$(dirname "$out")"
bl_workdir

# http METHOD URL [BODY]: status code of one request
http () {
    python3 - "$@" <<'EOF'
import sys, urllib.request, urllib.error
m, url = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
rq = urllib.request.Request(url, data=data, method=m, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(rq, timeout=30) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print(0)
EOF
}
bl_workers "$nw" hitrate
urls=$(echo "$bl_urls" | tr " " ,)
echo "router-hitrate: $nw radixd workers ($threads thread(s) each): $urls" >&2

start_router () { # POLICY
    cat >"$tmp/router.ini" <<EOF
[server]
host = 127.0.0.1
port = 0
[router]
policy = $1
workers = $urls
[log]
level = info
file = -
[plugins]
path = $plugins
EOF
    RADIX_PLUGIN_PATH= "$router" -c "$tmp/router.ini" >"$tmp/router-$1.log" 2>&1 &
    rpid=$!
    pids="$pids $rpid"
    l=$(bl_wait_line "$tmp/router-$1.log" '\bready\b' 20) || exit 1
    rport=$(bl_port_of "$l")
    # every worker healthy (the first health checks are done at start)
    python3 - "http://127.0.0.1:$rport/workers" "$nw" <<'EOF' || exit 1
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
end = time.time() + 30
while time.time() < end:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            ws = json.load(r)["workers"]
        if len(ws) == n and all(w["healthy"] for w in ws):
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit("router-hitrate: the router's workers are not all healthy within 30 s")
EOF
}

run () { # POLICY REP
    for u in $(echo "$urls" | tr , ' '); do
        [ "$(http POST "$u/flush_cache" '{}')" = 200 ] || { echo "router-hitrate: POST $u/flush_cache failed" >&2; exit 1; }
    done
    start_router "$1"
    echo "router-hitrate: rep $2/$reps: $1 (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    cut -d' ' -f1 /proc/loadavg >>"$tmp/loads"
    rc=0
    python3 "$serving" --base-url "http://127.0.0.1:$rport" --quiet --label "$1" \
        $wl_args --output-len "$OUT_LEN" --concurrency "$CONC" --seed $((1000 * $2)) --warmup 0 \
        --json "$tmp/$1-$2.json" >"$tmp/$1-$2.log" 2>&1 || rc=$?
    if [ $rc -ge 2 ] || [ ! -s "$tmp/$1-$2.json" ]; then
        echo "router-hitrate: bench/serving.py failed against the router ($1):" >&2
        tail -5 "$tmp/$1-$2.log" >&2
        exit 1
    fi
    python3 - "$tmp/$1-$2.json" "$rport" <<'EOF' >&2
import json, sys, urllib.request
s = json.load(open(sys.argv[1]))["summary"]
with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[2]) as r:
    dec = [l for l in r.read().decode().splitlines() if l.startswith("radix_router_route_decisions_total")]
print("router-hitrate:   hit rate %s, %.3f req/s, %.1f tok/s, failed %d; %s" % (
    s["cache_hit_rate"], s["request_throughput"], s["total_throughput"], s["failed"], "; ".join(dec)))
EOF
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
}

rep=1
while [ "$rep" -le "$reps" ]; do
    order=$policies
    # alternate the order, so that neither policy always runs first
    [ $((rep % 2)) -eq 0 ] && order=$(echo "$policies" | tr , '\n' | tac | paste -sd, -)
    for pol in $(echo "$order" | tr , ' '); do
        run "$pol" "$rep"
    done
    rep=$((rep + 1))
done

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)
python3 - "$tmp" "$reps" "$policies" "$out" "$nw" "$threads" "$(nproc)" "$cpu" "$(basename "$model")" \
    "$wl_desc" <<'EOF'
import json, os, statistics, sys, time
tmp, reps, policies, out, nw, threads, ncpu, cpu, model, wl_desc = sys.argv[1:11]
reps = int(reps)
pols = policies.split(",")
med = statistics.median
rows = {}
for p in pols:
    runs = [json.load(open(os.path.join(tmp, "%s-%d.json" % (p, r))))["summary"] for r in range(1, reps + 1)]
    rows[p] = {
        "hit": med([x["cache_hit_rate"] or 0.0 for x in runs]),
        "rps": med([x["request_throughput"] for x in runs]),
        "tps": med([x["total_throughput"] for x in runs]),
        "ttft": med([x["ttft_ms"]["mean"] for x in runs if x["ttft_ms"]]),
        "e2e": med([x["e2e_ms"]["mean"] for x in runs if x["e2e_ms"]]),
        "failed": sum(x["failed"] for x in runs),
        "hits": [x["cache_hit_rate"] or 0.0 for x in runs],
    }
lines = ["| policy | cached-token ratio | req/s | total tok/s | mean TTFT ms | mean e2e ms | failed |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
for p in pols:
    r = rows[p]
    lines.append("| %s | %.1f%% (%s) | %.3f | %.1f | %.0f | %.0f | %d |" % (
        p, 100 * r["hit"], ", ".join("%.1f" % (100 * h) for h in r["hits"]), r["rps"], r["tps"],
        r["ttft"], r["e2e"], r["failed"]))
if "cache_aware" in rows:
    a = rows["cache_aware"]
    for p in pols:
        if p == "cache_aware":
            continue
        b = rows[p]
        lines.append("")
        lines.append("cache_aware / %s: hit rate %s, throughput (req/s) %.2fx, mean TTFT %.2fx" % (
            p, "%.2fx" % (a["hit"] / b["hit"]) if b["hit"] > 0 else "inf (%s 0)" % p, a["rps"] / b["rps"],
            a["ttft"] / b["ttft"] if b["ttft"] else float("nan")))
hdr = ["Router hit rate, %s, %s CPUs (%s); %s radixd workers x %s thread(s), %s; %s; %d repetitions, "
       "medians (per-repetition hit rates in parentheses); load average during the runs %s"
       % (time.strftime("%Y-%m-%d"), ncpu, cpu, nw, threads, model, wl_desc, reps,
          ", ".join(open(os.path.join(tmp, "loads")).read().split()) if os.path.exists(os.path.join(tmp, "loads")) else "n/a"), ""]
text = "\n".join(hdr + lines) + "\n"
open(out, "w").write(text)
print(text)
EOF
echo "router-hitrate: table written to $out" >&2
