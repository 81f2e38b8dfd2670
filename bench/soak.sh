#!/bin/sh
# bench/soak.sh -- the bounded soak of issue 10: radixd workers behind
# radix-router at saturation for DURATION seconds with a mix of streaming,
# non-streaming, client aborts mid-stream and bad requests (bench/soak.py),
# then a clean shutdown.  Fails (exit 1) on any crash, unexpected 5xx, lost
# request, RSS growth after warm-up, or KV slot leak; the numbers are in
# docs/reliability.md ("## Soak").
#
# usage: bench/soak.sh [-d DURATION] [-n WORKERS] [-c CONCURRENCY] [-t THREADS]
#                      [-b BUILD_DIR] [-o OUT.json] [MODEL.gguf]
#   -d S        seconds of load (default 300)
#   -n N        radixd workers (default 2)
#   -c N        client threads (default 16: more than the workers can run at
#               once, so the schedulers always have a queue)
#   -t N        compute threads per worker (default 1)
#   -b DIR      a configured radix build dir (default: the current directory)
#   -o FILE     bench/soak.py's JSON (samples, counts, every request that was
#               not completed; default .cache/bench/soak.json)
#   MODEL       default .cache/bench/smollm2-135m-q8_0.gguf (the default
#               model's shape, random weights; made by `radix gguf-gen` when
#               missing, as bench/router-hitrate.sh does), else any gguf
#   env: KV=48MiB per worker (small, so that the radix caches fill and evict
#        during the run), RADIX_SHARED (for the vocabulary).
#
# What is checked beyond bench/soak.py's own checks (its header lists them):
# every process -- the router, each radixd and each radixd's child processes
# (scheduler, detokenizer) -- is alive at the end; SIGTERM then stops each
# one with exit status 0 within 30 s; no log has a sanitizer report, a
# "Segmentation fault", an "Aborted" or a "core dumped" line.
set -eu
me=soak
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
dur=300
nw=2
conc=16
threads=1
build=$(pwd)
out="$top/.cache/bench/soak.json"
usage () {
    echo "usage: $0 [-d DURATION] [-n WORKERS] [-c CONCURRENCY] [-t THREADS] [-b BUILD_DIR] [-o OUT.json] [MODEL.gguf]" >&2
    exit 2
}
while getopts d:n:c:t:b:o: opt; do
    case $opt in
        d) dur=$OPTARG ;;
        n) nw=$OPTARG ;;
        c) conc=$OPTARG ;;
        t) threads=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || usage
bl_count -d "$dur"; bl_count -n "$nw"; bl_count -c "$conc"; bl_count -t "$threads"
KV=${KV:-48MiB}
bl_build "$build"
model=${1:-$top/.cache/bench/smollm2-135m-q8_0.gguf}
bl_gen_model "$model"
mkdir -p "$(dirname "$out")"
bl_workdir
children () { cat /proc/"$1"/task/*/children 2>/dev/null | tr ' ' '\n' | grep . || true; }

bl_server_extra='; gguf-gen models carry no chat template; /v1/chat/completions needs one
chat_template = chatml'
bl_workers "$nw" soak
urls=""
watch=""
i=0
for u in $bl_urls; do
    urls="$urls $u"
    eval "p=\$bl_wpid$i"
    watch="$watch --pid radixd$i=$p"
    k=0
    for c in $(children "$p"); do
        watch="$watch --pid radixd$i.child$k=$c"
        k=$((k + 1))
    done
    [ $k -gt 0 ] || echo "soak: radixd$i (pid $p) has no child processes to watch" >&2
    i=$((i + 1))
done
cat >"$tmp/router.ini" <<EOF
; written by bench/soak.sh
[server]
host = 127.0.0.1
port = 0
[router]
policy = cache_aware
workers = $(echo $urls | tr ' ' ,)
health_check_interval = 2s
[router.cache_aware]
; the approximate tree keeps request text until it is cut back: cut it often
; and small, so that its eviction runs under load and the router's RSS must
; be flat (with the defaults, 120 s and 2^26 characters, it only grows here)
eviction_interval = 10s
max_tree_size = 65536
[log]
level = info
file = -
[plugins]
path = $plugins
EOF
RADIX_PLUGIN_PATH= "$router" -c "$tmp/router.ini" >"$tmp/router.log" 2>&1 &
rpid=$!
pids="$pids $rpid"
l=$(bl_wait_line "$tmp/router.log" '\bready\b' 20) || exit 1
rurl="http://127.0.0.1:$(bl_port_of "$l")"
sleep 3     # the first health checks
echo "soak: router $rurl (pid $rpid) -> $nw workers:$urls; ${dur}s at concurrency $conc; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

rc=0
wargs=""
for u in $urls; do wargs="$wargs --worker $u"; done
# shellcheck disable=SC2086
python3 "$top/bench/soak.py" --url "$rurl" $wargs --pid "router=$rpid" $watch \
    --duration "$dur" --concurrency "$conc" --json "$out" || rc=$?
echo "soak: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# a clean shutdown: SIGTERM, exit status 0 within 30 s, for each process
stop_one () { # NAME PID
    if ! kill -0 "$2" 2>/dev/null; then
        echo "soak: VIOLATION: $1 (pid $2) already gone" >&2; rc=1; return
    fi
    kill -TERM "$2"
    so_n=0
    while kill -0 "$2" 2>/dev/null && [ "$(cut -d' ' -f3 /proc/"$2"/stat 2>/dev/null)" != Z ] && [ $so_n -lt 300 ]; do
        sleep 0.1
        so_n=$((so_n + 1))
    done
    st=0
    wait "$2" || st=$?
    if [ "$st" -ne 0 ]; then
        echo "soak: VIOLATION: $1 (pid $2) exited with status $st after SIGTERM" >&2; rc=1
    else
        echo "soak: $1 (pid $2) exited 0 after SIGTERM" >&2
    fi
}
stop_one router "$rpid"
i=0
while [ $i -lt "$nw" ]; do
    eval "p=\$bl_wpid$i"
    stop_one "radixd$i" "$p"
    i=$((i + 1))
done
pids=""
if grep -l -E 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:|Segmentation fault|core dumped|\bAborted\b' \
        "$tmp"/*.log >"$tmp/bad-logs" 2>/dev/null; then
    for f in $(cat "$tmp/bad-logs"); do
        echo "soak: VIOLATION: $(basename "$f"):" >&2
        grep -m5 -E 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:|Segmentation fault|core dumped|\bAborted\b' "$f" >&2
    done
    rc=1
fi
[ $rc -eq 0 ] || keep=1
echo "soak: $([ $rc -eq 0 ] && echo PASS || echo "FAIL (status $rc)"); JSON in $out" >&2
exit $rc
