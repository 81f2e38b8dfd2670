#!/bin/sh
# tests/fuzz/run.sh -- build a fuzz harness with clang's libFuzzer (+ ASan,
# UBSan) straight from the sources and run it.
#
#   tests/fuzz/run.sh [TARGET] [SECONDS] [more libFuzzer flags]  (default gguf, 60 s)
#
# TARGET: gguf  the GGUF reader (fuzz_gguf.c; regressions in tests/fuzz/regressions/,
#               replayed by test_gguf)
#         ipc   the IPC message decoder, core/ipc_msg.c (fuzz_ipc.c; regressions in
#               tests/fuzz/regressions-ipc/, replayed by test_ipc_msg)
#         api   radixd's HTTP request parser, core/api.c (fuzz_api.c; regressions in
#               tests/fuzz/regressions-api/, replayed by test_api; needs the
#               tiny-llama tokenizer: $RADIX_SHARED, default ../shared)
#         conf  the INI loader and schema validation, core/conf.c + core/settings.c +
#               router/router_settings.c (fuzz_conf.c)
#         routekey  radix-router's request parser and text extraction,
#               router/routekey.c (fuzz_routekey.c)
#         tokenizer  byte-level BPE encode->decode round trip, core/tokenizer.c
#               (fuzz_tokenizer.c; the GPT-2 and StarCoder vocabularies of $RADIX_SHARED)
#         detok the incremental UTF-8 detokenizer, core/detok.c (fuzz_detok.c;
#               GPT-2 and tiny-llama vocabularies of $RADIX_SHARED)
#       conf, routekey, tokenizer and detok keep their regressions in
#       tests/fuzz/regressions-TARGET/, replayed by tests/fuzz/replay_TARGET
#       (make check).
#
# Exit status: 0 when the time ran out without a finding; non-zero on a
# crash, a leak, a timeout (-timeout, default 10 s per input), an
# out-of-memory (-rss_limit_mb, default 2048) or a failing regression.
#
# Needs clang and libFuzzer: on Debian bookworm
#   apt-get install -y clang libclang-rt-14-dev
# Work files go to $FUZZ_WORK (default /tmp/radix-fuzz-TARGET): the binary, a
# working corpus seeded from tests/fuzz/corpus/TARGET (gguf: and the fixture
# corpus), and crash-* artifacts.  Copy a crasher into the target's
# regressions folder (it then runs in the unit tests) once the code is fixed.
set -eu
target=gguf
case "${1:-}" in
    gguf|ipc|api|conf|routekey|tokenizer|detok) target=$1; shift ;;
    -*|[0-9]*|'') ;;
    *) echo "run.sh: unknown target '$1' (gguf ipc api conf routekey tokenizer detok)" >&2; exit 2 ;;
esac
secs=${1:-60}
[ $# -gt 0 ] && shift
top=$(cd "$(dirname "$0")/../.." && pwd)
work=${FUZZ_WORK:-/tmp/radix-fuzz-$target}
cc=${CLANG:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
    echo "run.sh: $cc not found (apt-get install -y clang libclang-rt-14-dev)" >&2
    exit 1
fi
libs=
case $target in
    gguf)
        srcs="$top/core/gguf.c"
        regdir="$top/tests/fuzz/regressions"
        seeds="$top/tests/fuzz/corpus/gguf/* $top/tests/fixtures/gguf/*.gguf"
        opts="-max_len=16384 -dict=$top/tests/fuzz/gguf.dict" ;;
    ipc)
        srcs="$top/core/ipc_msg.c"
        regdir="$top/tests/fuzz/regressions-ipc"
        seeds="$top/tests/fuzz/corpus/ipc/*"
        opts="-max_len=8192" ;;
    api)
        srcs="$top/core/api.c $top/core/request.c $top/core/tokenizer.c $top/core/unicode.c
              $top/core/chat.c $top/core/gguf.c $top/core/log.c"
        libs="$(pkg-config --cflags --libs jansson libpcre2-8) -lm"
        regdir="$top/tests/fuzz/regressions-api"
        seeds="$top/tests/fuzz/corpus/api/*"
        opts="-max_len=4096 -dict=$top/tests/fuzz/api.dict"
        RADIX_SHARED=${RADIX_SHARED:-$top/../shared}; export RADIX_SHARED ;;
    conf)
        srcs="$top/core/conf.c $top/core/settings.c $top/router/router_settings.c"
        libs="$(pkg-config --cflags --libs inih) -lm"
        opts="-max_len=4096 -dict=$top/tests/fuzz/conf.dict" ;;
    routekey)
        srcs="$top/router/routekey.c $top/core/api.c $top/core/request.c $top/core/tokenizer.c
              $top/core/unicode.c $top/core/chat.c $top/core/gguf.c $top/core/log.c"
        libs="$(pkg-config --cflags --libs jansson libpcre2-8) -lm"
        opts="-max_len=8192 -dict=$top/tests/fuzz/api.dict" ;;
    tokenizer|detok)
        srcs="$top/core/tokenizer.c $top/core/unicode.c $top/core/gguf.c $top/core/log.c"
        [ $target = detok ] && srcs="$srcs $top/core/detok.c"
        libs="$(pkg-config --cflags --libs libpcre2-8) -lm"
        opts="-max_len=2048"
        RADIX_SHARED=${RADIX_SHARED:-$top/../shared}; export RADIX_SHARED ;;
esac
case $target in
    conf|routekey|tokenizer|detok)
        regdir="$top/tests/fuzz/regressions-$target"
        seeds="$top/tests/fuzz/corpus/$target/*" ;;
esac
mkdir -p "$work/corpus" "$work/crashes"
: > "$work/config.h"     # gguf.c includes config.h; it needs nothing from it
# shellcheck disable=SC2086
"$cc" -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$work" -I"$top/core" -I"$top/core/include" \
    -I"$top/router" \
    "$top/tests/fuzz/fuzz_$target.c" $srcs $libs -o "$work/fuzz_$target"
# replay the regressions first: each must pass
regs=$(ls "$regdir/" | grep -v '^README$' | sed "s|^|$regdir/|")
if [ -n "$regs" ]; then
    # shellcheck disable=SC2086
    "$work/fuzz_$target" $regs >"$work/regressions.log" 2>&1 || {
        cat "$work/regressions.log" >&2
        echo "run.sh: a regression input fails" >&2
        exit 1
    }
fi
# shellcheck disable=SC2086
cp $seeds "$work/corpus/"
# shellcheck disable=SC2086
exec "$work/fuzz_$target" -max_total_time="$secs" $opts -timeout=10 \
    -artifact_prefix="$work/crashes/" -print_final_stats=1 \
    "$@" "$work/corpus"
