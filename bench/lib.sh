# bench/lib.sh -- what the bench scripts that start radixd workers share:
# finding radixd / radix-router / the plugins, a work folder that goes away
# at exit with every process started, starting radixd from an INI and
# waiting until it serves, stopping it.  Sourced, not run:
#
#     me=soak                     # the script's name in its messages
#     . "$(dirname "$0")/lib.sh"  # sets top (the source tree)
#
# POSIX sh (dash): sh has no local variables, so each helper's own
# variables start with bl_.  The functions (in the order a script uses them):
#
#   bl_count OPT VALUE      exit 2 ("me: OPT VALUE: want a count >= 1")
#                           unless VALUE is a whole number >= 1
#   bl_build DIR            DIR a configured build dir: make radix-router and
#                           radixd there (and, not stopping on failure,
#                           everything: the plugins); sets build (absolute),
#                           radixd, router, radix, plugins
#   bl_find DIR             radixd / radix from $RADIXD / $RADIX or the build
#                           dir DIR, the plugins from $RX_PLUGIN_BUILD_DIR or
#                           DIR/_plugins, nothing built; sets RADIXD, RADIX,
#                           RX_PLUGIN_BUILD_DIR (and radixd, radix, plugins)
#   bl_gen_model FILE       make FILE, when missing, as the smollm2-135m
#                           shape with random weights (radix gguf-gen, the
#                           StarCoder vocabulary of $RADIX_SHARED)
#   bl_workdir              tmp: a new folder /tmp/rx-$me.XXXXXX; at exit
#                           every pid in $pids is stopped (SIGTERM, up to
#                           15 s, SIGKILL) and tmp removed (kept, and said,
#                           when keep=1)
#   bl_radixd INI LOG WHAT  start radixd -c INI (output to LOG) in the
#                           background and wait (up to $BL_UP_S s, 180) for
#                           its "ready on" line and a 200 from /health; sets
#                           bl_pid and port, adds the pid to pids; exits 1
#                           with the log's end when it dies or is too slow
#                           (= bl_launch INI LOG, then bl_up PID LOG WHAT)
#   bl_workers N NAME       N radixd workers with the same INI (the model
#                           $model, $threads threads, kv_memory $KV, radix
#                           cache on, served_model_name NAME, the lines of
#                           $bl_server_extra in [server]), all up: sets
#                           bl_urls (space separated) and bl_wpid0..N-1
#   bl_stop PID             SIGTERM, up to 15 s, then SIGKILL; reaped and
#                           taken out of pids (nothing when PID is empty)
#   bl_wait_line FILE RE S  print the first line of FILE matching the ERE RE,
#                           waiting up to S s (1 with the file's end if none)
#   bl_port_of LINE         the port of the first http://HOST:PORT in LINE

# me, model, threads, KV come from the script; router, radix, ... go to it
# shellcheck shell=sh disable=SC2154,SC2034
top=$(cd "$(dirname "$0")/.." && pwd)
pids=""
tmp=""

bl_count () {
    case $2 in ''|*[!0-9]*|0) echo "$me: $1 $2: want a count >= 1" >&2; exit 2 ;; esac
}

bl_build () {
    build=$(cd "$1" && pwd)
    [ -f "$build/Makefile" ] || { echo "$me: $build is not a configured build dir (-b)" >&2; exit 2; }
    make -s -C "$build" router/radix-router core/radixd >/dev/null
    # the plugins; a target of someone else's work in progress that does not
    # build must not stop the run (the ones used here are checked by starting)
    make -s -k -C "$build" all >/dev/null 2>&1 || echo "$me: warning: \`make all\` in $build failed; using the plugins built" >&2
    router="$build/router/radix-router"
    radixd="$build/core/radixd"
    radix="$build/tools/radix"
    plugins="$build/_plugins"
}

bl_find () {
    RADIXD=${RADIXD:-$1/core/radixd}
    RADIX=${RADIX:-$1/tools/radix}
    RX_PLUGIN_BUILD_DIR=${RX_PLUGIN_BUILD_DIR:-$1/_plugins}
    [ -x "$RADIXD" ] || { echo "$me: $RADIXD: radixd not found (set RADIXD or -b BUILD_DIR)" >&2; exit 1; }
    radixd=$RADIXD
    radix=$RADIX
    plugins=$RX_PLUGIN_BUILD_DIR
}

bl_gen_model () {
    [ ! -f "$1" ] || return 0
    bl_shared=${RADIX_SHARED:-$top/../shared}
    bl_vocab="$bl_shared/data/tokenizers/ggml-vocab-starcoder.gguf"
    [ -f "$bl_vocab" ] || { echo "$me: $bl_vocab not found (set RADIX_SHARED)" >&2; exit 2; }
    mkdir -p "$(dirname "$1")"
    make -s -C "$build" tools/radix >/dev/null
    echo "$me: making $1" >&2
    "$build/tools/radix" gguf-gen --arch llama --preset smollm2-135m --vocab "$bl_vocab" --type q8_0 --out "$1" >&2
}

bl_cleanup () {
    for bl_p in $pids; do kill "$bl_p" 2>/dev/null || true; done
    bl_n=0
    while [ $bl_n -lt 150 ]; do
        bl_left=""
        for bl_p in $pids; do bl_alive "$bl_p" && bl_left=1; done
        [ -n "$bl_left" ] || break
        sleep 0.1
        bl_n=$((bl_n + 1))
    done
    for bl_p in $pids; do kill -9 "$bl_p" 2>/dev/null || true; wait "$bl_p" 2>/dev/null || true; done
    [ -n "$tmp" ] || return 0
    if [ "${keep:-0}" = 1 ]; then echo "$me: logs kept in $tmp" >&2; else rm -rf "$tmp"; fi
}

bl_workdir () {
    tmp=$(mktemp -d "/tmp/rx-$me.XXXXXX")
    trap bl_cleanup EXIT
    trap 'exit 130' INT TERM
}

bl_wait_line () {
    bl_n=0
    while [ $bl_n -lt $(($3 * 20)) ]; do
        bl_l=$(grep -m1 -E "$2" "$1" 2>/dev/null || true)
        [ -n "$bl_l" ] && { echo "$bl_l"; return 0; }
        sleep 0.05
        bl_n=$((bl_n + 1))
    done
    printf '%s: no line /%s/ in %s within %s s:\n' "$me" "$2" "$1" "$3" >&2
    tail -n 20 "$1" >&2
    return 1
}

bl_port_of () { echo "$1" | sed -n 's|.*http://[^ ]*:\([0-9][0-9]*\).*|\1|p' | head -n1; }

# alive and not a zombie (a child the shell has not reaped yet)
bl_alive () { kill -0 "$1" 2>/dev/null && [ "$(cut -d' ' -f3 /proc/"$1"/stat 2>/dev/null)" != Z ]; }

# GET URL answers 200 (python: curl is not needed)
bl_ok () {
    python3 -c 'import sys, urllib.request
try:
    sys.exit(urllib.request.urlopen(sys.argv[1], timeout=5).status != 200)
except Exception:
    sys.exit(1)' "$1"
}

bl_launch () {
    RADIX_PLUGIN_PATH='' "$radixd" -c "$1" >"$2" 2>&1 &
    bl_pid=$!
    pids="$pids $bl_pid"
}

bl_up () { # PID LOG WHAT
    bl_end=$(($(date +%s) + ${BL_UP_S:-180}))
    port=
    while :; do
        if [ -z "$port" ]; then
            bl_l=$(grep -m1 -E 'ready on https?://' "$2" 2>/dev/null || true)
            [ -z "$bl_l" ] || port=$(bl_port_of "$bl_l")
        fi
        [ -n "$port" ] && bl_ok "http://127.0.0.1:$port/health" && return 0
        if ! bl_alive "$1" || [ "$(date +%s)" -ge "$bl_end" ]; then
            echo "$me: radixd ($3) did not come up; the end of its log:" >&2
            tail -5 "$2" >&2
            exit 1
        fi
        sleep 0.1
    done
}

bl_radixd () {
    bl_launch "$1" "$2"
    bl_up "$bl_pid" "$2" "$3"
}

bl_workers () {
    bl_i=0
    while [ $bl_i -lt "$1" ]; do
        cat >"$tmp/radixd$bl_i.ini" <<EOF
; written by bench/$me.sh
[server]
host = 127.0.0.1
port = 0
served_model_name = $2
${bl_server_extra:-}
[plugins]
path = $plugins
[model]
path = $model
[kernels]
threads = $threads
[cache]
kv_memory = $KV
radix_cache = true
EOF
        # all start at once; then each is waited for
        bl_launch "$tmp/radixd$bl_i.ini" "$tmp/radixd$bl_i.log"
        eval "bl_wpid$bl_i=\$bl_pid"
        bl_i=$((bl_i + 1))
    done
    bl_urls=""
    bl_i=0
    while [ $bl_i -lt "$1" ]; do
        eval "bl_wp=\$bl_wpid$bl_i"
        bl_up "$bl_wp" "$tmp/radixd$bl_i.log" "worker $bl_i"
        bl_urls="${bl_urls:+$bl_urls }http://127.0.0.1:$port"
        bl_i=$((bl_i + 1))
    done
}

bl_stop () {
    [ -n "$1" ] || return 0
    kill "$1" 2>/dev/null || true
    bl_n=0
    while bl_alive "$1" && [ $bl_n -lt 150 ]; do sleep 0.1; bl_n=$((bl_n + 1)); done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    bl_rest=""
    for bl_p in $pids; do [ "$bl_p" = "$1" ] || bl_rest="$bl_rest $bl_p"; done
    pids=$bl_rest
    [ "${bl_pid:-}" != "$1" ] || bl_pid=
}
