#!/bin/sh
# bench/router-overhead.sh -- what a router costs: radix-router vs sgl-router
# (the PyPI wheel sglang-router) in front of the same fake workers, under the
# same closed-loop load, side by side in one run.
#
# usage: bench/router-overhead.sh [-k REPS] [-c CONCS] [-d SECONDS] [-n WORKERS]
#                                 [-s SERVERS] [-b BUILD_DIR] [-o OUT.md]
#   -k REPS     repetitions, medians reported (default 3)
#   -c CONCS    comma-separated client concurrencies (default 64,1: 64 is the
#               issue's load; 1 shows the per-request cost without queueing)
#   -d SECONDS  timed window of every run, after a 1 s warm-up (default 5)
#   -n WORKERS  fake workers (default 2)
#   -s SERVERS  comma-separated: radix, sgl (default radix,sgl)
#   -b DIR      a configured radix build dir (default: the current directory)
#   -o FILE     the markdown table (default .cache/bench/router-overhead.md)
#   env: SGL_PYTHON  a python with sglang_router (default .cache/venv/bin/python:
#                    `.cache/venv/bin/pip install sglang-router`)
#        BODY        the request body (default a small non-streamed completion)
#
# The workers are tests/router/fake-worker (C, libevent: answers at once, so
# the numbers are the router's), the load generator is bench/router-load (C,
# epoll, keep-alive connections: its own ceiling is the "direct" row, the
# same load sent straight to the workers).  Every repetition measures, per
# concurrency, back to back: direct, radix-router, sgl-router (each router
# started afresh with round_robin, then stopped), so background load on a
# shared box hits all alike.  "Added" latency is the router's percentile
# minus the direct percentile of the same repetition (paired by repetition),
# then the median over repetitions.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
reps=3
concs=64,1
dur=5
nw=2
servers=radix,sgl
build=$(pwd)
out="$top/.cache/bench/router-overhead.md"
usage () {
    echo "usage: $0 [-k REPS] [-c 64,1] [-d SECONDS] [-n WORKERS] [-s radix,sgl] [-b BUILD_DIR] [-o OUT.md]" >&2
    exit 2
}
while getopts k:c:d:n:s:b:o: opt; do
    case $opt in
        k) reps=$OPTARG ;;
        c) concs=$OPTARG ;;
        d) dur=$OPTARG ;;
        n) nw=$OPTARG ;;
        s) servers=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || usage
num () { case $2 in ''|*[!0-9]*|0) echo "router-overhead: $1 $2: want a count >= 1" >&2; exit 2 ;; esac; }
num -k "$reps"; num -d "$dur"; num -n "$nw"
for c in $(echo "$concs" | tr , ' '); do num -c "$c"; done
has () { case ",$1," in *",$2,"*) return 0 ;; *) return 1 ;; esac; }
for s in $(echo "$servers" | tr , ' '); do
    case $s in radix|sgl) ;; *) echo "router-overhead: -s: unknown server '$s' (radix, sgl)" >&2; exit 2 ;; esac
done
build=$(cd "$build" && pwd)
[ -f "$build/Makefile" ] || { echo "router-overhead: $build is not a configured build dir (-b)" >&2; exit 2; }
make -s -C "$build" router/radix-router tests/router/fake-worker bench/router-load >/dev/null
router="$build/router/radix-router"
fw="$build/tests/router/fake-worker"
load="$build/bench/router-load"
sglpy=${SGL_PYTHON:-$top/.cache/venv/bin/python}
if has "$servers" sgl; then
    "$sglpy" -c 'import sglang_router' 2>/dev/null || {
        echo "router-overhead: $sglpy cannot import sglang_router: $sglpy -m pip install sglang-router (or -s radix)" >&2
        exit 2
    }
    sglver=$("$sglpy" -c 'import importlib.metadata as m; print(m.version("sglang-router"))')
else
    sglver="not measured"
fi
body=${BODY:-'{"model":"fake-model","prompt":"The router overhead benchmark sends this prompt.","max_tokens":4}'}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d /tmp/rx-router-overhead.XXXXXX)
pids=""
cleanup () {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_line FILE REGEX SECONDS: the first line of FILE matching REGEX
# (sh has no local variables: the helpers' counters have names of their own)
wait_line () {
    wl_n=0
    while [ $wl_n -lt $(($3 * 20)) ]; do
        l=$(grep -m1 -E "$2" "$1" 2>/dev/null || true)
        [ -n "$l" ] && { echo "$l"; return 0; }
        sleep 0.05
        wl_n=$((wl_n + 1))
    done
    printf 'router-overhead: no line /%s/ in %s within %s s:\n' "$2" "$1" "$3" >&2
    tail -n 20 "$1" >&2
    return 1
}
port_of () { echo "$1" | sed -n 's|.*http://[^ ]*:\([0-9][0-9]*\).*|\1|p' | head -n1; }
# wait_ok URL SECONDS: until GET URL answers 200
wait_ok () {
    python3 - "$1" "$2" <<'EOF'
import sys, time, urllib.request
url, t = sys.argv[1], float(sys.argv[2])
end = time.time() + t
while time.time() < end:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit("router-overhead: %s not 200 within %g s" % (url, t))
EOF
}
free_port () { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

urls=""
i=0
while [ $i -lt "$nw" ]; do
    "$fw" --quiet --name "w$i" --port 0 >"$tmp/fw$i.out" 2>&1 &
    pids="$pids $!"
    l=$(wait_line "$tmp/fw$i.out" 'ready on' 10) || exit 1
    p=$(port_of "$l")
    urls="${urls:+$urls,}http://127.0.0.1:$p"
    i=$((i + 1))
done
echo "router-overhead: $nw fake workers: $urls" >&2

start_radix () {
    cat >"$tmp/router.ini" <<EOF
[server]
host = 127.0.0.1
port = 0
[router]
policy = round_robin
workers = $urls
max_concurrent_requests = 1024
[log]
level = info
file = -
[plugins]
path = $build/_plugins
EOF
    : >"$tmp/router.log"
    RADIX_PLUGIN_PATH= "$router" -c "$tmp/router.ini" >>"$tmp/router.log" 2>&1 &
    rpid=$!
    pids="$pids $rpid"
    l=$(wait_line "$tmp/router.log" '\bready\b' 20) || exit 1
    rport=$(port_of "$l")
    wait_ok "http://127.0.0.1:$rport/health" 20 || exit 1
    rurl="http://127.0.0.1:$rport"
}
start_sgl () {
    rport=$(free_port)
    # shellcheck disable=SC2046
    "$sglpy" -m sglang_router.launch_router --host 127.0.0.1 --port "$rport" --policy round_robin \
        --log-level warn --worker-urls $(echo "$urls" | tr , ' ') >"$tmp/sgl.log" 2>&1 &
    rpid=$!
    pids="$pids $rpid"
    wait_ok "http://127.0.0.1:$rport/health" 60 || exit 1
    # /health may answer before the workers are registered: wait for a routed answer
    wait_post "http://127.0.0.1:$rport" 60 || exit 1
    rurl="http://127.0.0.1:$rport"
}
wait_post () {
    python3 - "$1" "$2" "$body" <<'EOF'
import sys, time, urllib.request
url, t, body = sys.argv[1], float(sys.argv[2]), sys.argv[3].encode()
end = time.time() + t
while time.time() < end:
    try:
        rq = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=5) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit("router-overhead: %s routes no request within %g s" % (url, t))
EOF
}
stop_router () {
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
}
measure () { # NAME URLS CONC REP
    "$load" --url "$2" --concurrency "$3" --duration "$dur" --warmup 1 --body "$body" >"$tmp/r$4-c$3-$1.json"
    echo "router-overhead: rep $4 c=$3 $1: $(cat "$tmp/r$4-c$3-$1.json")" >&2
}

rep=1
while [ "$rep" -le "$reps" ]; do
    for c in $(echo "$concs" | tr , ' '); do
        measure direct "$urls" "$c" "$rep"
        if has "$servers" radix; then
            start_radix
            measure radix "$rurl" "$c" "$rep"
            stop_router
        fi
        if has "$servers" sgl; then
            start_sgl
            measure sgl "$rurl" "$c" "$rep"
            stop_router
        fi
    done
    rep=$((rep + 1))
done

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)
python3 - "$tmp" "$reps" "$concs" "$servers" "$out" "$nw" "$dur" "$(nproc)" "$cpu" "$sglver" "$body" <<'EOF'
import json, os, statistics, sys, time
tmp, reps, concs, servers, out, nw, dur, ncpu, cpu, sglver, body = sys.argv[1:12]
reps = int(reps)
names = [("direct", "direct to the workers (load generator ceiling)")]
if "radix" in servers.split(","):
    names.append(("radix", "radix-router (round_robin)"))
if "sgl" in servers.split(","):
    names.append(("sgl", "sgl-router %s (round_robin)" % sglver))
def load(rep, c, n):
    with open(os.path.join(tmp, "r%d-c%s-%s.json" % (rep, c, n))) as f:
        return json.load(f)
med = statistics.median
lines = []
lines.append("| concurrency | target | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | errors |")
lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in concs.split(","):
    for n, label in names:
        runs = [load(r, c, n) for r in range(1, reps + 1)]
        base = [load(r, c, "direct") for r in range(1, reps + 1)]
        rps = med([x["rps"] for x in runs])
        p50 = med([x["lat_us"]["p50"] for x in runs]) / 1000
        p99 = med([x["lat_us"]["p99"] for x in runs]) / 1000
        err = sum(x["errors"] for x in runs)
        if n == "direct":
            a50 = a99 = "--"
        else:
            a50 = "%.3f" % (med([x["lat_us"]["p50"] - b["lat_us"]["p50"] for x, b in zip(runs, base)]) / 1000)
            a99 = "%.3f" % (med([x["lat_us"]["p99"] - b["lat_us"]["p99"] for x, b in zip(runs, base)]) / 1000)
        lines.append("| %s | %s | %.0f | %.3f | %.3f | %s | %s | %d |" % (c, label, rps, p50, p99, a50, a99, err))
hdr = ["Router overhead, %s, %s CPUs (%s); %s fake workers; %d repetitions of %s s, medians; body %s"
       % (time.strftime("%Y-%m-%d"), ncpu, cpu, nw, reps, dur, body), ""]
text = "\n".join(hdr + lines) + "\n"
with open(out, "w") as f:
    f.write(text)
print(text)
EOF
echo "router-overhead: table written to $out" >&2
