#!/bin/sh
# tests/graphs.sh -- the reference models with decode steps replayed as
# graphs: [scheduler] cuda_graph_max_bs = 8 on kernels-cpu's emulated
# graphs ([kernels.cpu] graphs: ops recorded at capture, replayed at launch,
# as a GPU backend does), once plain and once with guard mode on as well
# (RADIX_KCPU_GUARD=1: replays reach device memory through ops only).  Every
# reference test must pass as it does op by op: same greedy tokens, logits
# within the README tolerances.  TAP; a few seconds.
set -u
b="${RX_TOP_BUILDDIR:?run through make check}/tests/unit"
echo "1..2"
ini=$(mktemp "${TMPDIR:-/tmp}/radix-graphs-XXXXXX")
log=$(mktemp "${TMPDIR:-/tmp}/radix-graphs-XXXXXX")
trap 'rm -f "$ini" "$log"' EXIT
printf '[kernels]\nthreads = 1\n[kernels.cpu]\ngraphs = true\n[scheduler]\ncuda_graph_max_bs = 8\n' > "$ini"
i=0
for guard in 0 1; do
    i=$((i + 1))
    what="test_models_ref with graphs$([ $guard = 1 ] && echo ', guarded')"
    if [ ! -x "$b/test_models_ref" ]; then
        echo "ok $i - $what # SKIP not built"
        continue
    fi
    if RADIX_KCPU_GUARD=$guard RX_MODELS_REF_INI="$ini" "$b/test_models_ref" --jobs=2 >"$log" 2>&1; then
        echo "ok $i - $what: $(grep -o 'Tested: [0-9]*' "$log" | tail -1)"
    else
        echo "not ok $i - $what"
        grep -A12 -E 'host access to device memory|\[FAIL\]|Assertion' "$log" | head -60 | sed 's/^/# /'
        tail -3 "$log" | sed 's/^/# /'
    fi
done
