#!/bin/sh
# tests/backend-modes.sh -- the reference models (test_models_ref) on
# kernels-cpu in the modes that stand in for other backends:
#   1. decode steps replayed as graphs: [scheduler] cuda_graph_max_bs = 8
#      on kernels-cpu's emulated graphs ([kernels.cpu] graphs: ops
#      recorded at capture, replayed at launch, as a GPU backend does);
#   2. the same with guard mode on as well (RADIX_KCPU_GUARD=1: replays
#      reach device memory through ops only);
#   3. the backend seen as an ABI 1.0 one ([kernels] ops_abi = 1.0: the
#      appended ops hidden, e.g. moe_route and the MoE expert ops), so the
#      models' fallbacks for such third-party backends run;
#   4. what a GPU runs by default: graphs with model-llama's fused Q/K/V
#      and gate/up weights (RADIX_LLAMA_FUSE=1, [model.llama] fuse_weights).
# Every reference test must pass as it does normally: same greedy tokens,
# logits within the README tolerances.  TAP; a few seconds.
set -u
b="${RX_TOP_BUILDDIR:?run through make check}/tests/unit"
echo "1..4"
ini=$(mktemp "${TMPDIR:-/tmp}/radix-modes-XXXXXX")
abi=$(mktemp "${TMPDIR:-/tmp}/radix-modes-XXXXXX")
log=$(mktemp "${TMPDIR:-/tmp}/radix-modes-XXXXXX")
trap 'rm -f "$ini" "$abi" "$log"' EXIT
printf '[kernels]\nthreads = 1\n[kernels.cpu]\ngraphs = true\n[scheduler]\ncuda_graph_max_bs = 8\n' > "$ini"
printf '[kernels]\nthreads = 1\nops_abi = 1.0\n' > "$abi"
i=0
for mode in graphs guarded abi fused; do
    i=$((i + 1))
    guard=0
    fuse=0
    conf=$ini
    case $mode in
        graphs) what="test_models_ref with graphs" ;;
        guarded) what="test_models_ref with graphs, guarded"; guard=1 ;;
        abi) what="test_models_ref on an ABI 1.0 view of the backend"; conf=$abi ;;
        fused) what="test_models_ref with graphs and fused projections"; fuse=1 ;;
    esac
    if [ ! -x "$b/test_models_ref" ]; then
        echo "ok $i - $what # SKIP not built"
        continue
    fi
    if RADIX_LLAMA_FUSE=$fuse RADIX_KCPU_GUARD=$guard RX_MODELS_REF_INI="$conf" "$b/test_models_ref" --jobs=2 >"$log" 2>&1; then
        echo "ok $i - $what: $(grep -o 'Tested: [0-9]*' "$log" | tail -1)"
    else
        echo "not ok $i - $what"
        grep -A12 -E 'host access to device memory|\[FAIL\]|Assertion' "$log" | head -60 | sed 's/^/# /'
        tail -3 "$log" | sed 's/^/# /'
    fi
done
