#!/bin/sh
# tests/guard.sh -- run the model, MoE, TP, DP-attention and TBO tests with
# kernels-cpu's guard mode on (RADIX_KCPU_GUARD=1: every alloc()ed buffer and
# plain weight is PROT_NONE outside kernel ops), so any host dereference of
# device memory in the models, attention backends, MoE dispatchers, comm
# plugins or the engine crashes here as it would break on a GPU, and a host
# pointer handed to an op or a copy's wrong side fails with RX_EINVAL.  TAP;
# a failure shows the guard's "host access to device memory" backtrace.
# Forked ranks inherit the variable.  The slowest model tests are left out
# (they repeat what the others cover); about 40 s on 2 shared cores.
set -u
b="${RX_TOP_BUILDDIR:?run through make check}/tests/unit"
RADIX_KCPU_GUARD=1
export RADIX_KCPU_GUARD

# binary|criterion filter (extglob)
runs='test_models_ref|!(tiny_deepseek2/@(teacher_forced_one_token_at_a_time|free_running_greedy|scattered_kv_slots)|tiny_moe/teacher_forced_one_token_at_a_time)
test_engine|*/*
test_deepseek2|*/*
test_moe|*/*
test_moe_ep|*/*
test_expert_record|*/*
test_procs|*/*
test_tp|tp/@(tiny_llama_q8|tiny_deepseek2_tp3_uneven|dp_attention_three_ranks_q8|dp_attention_moe_ep_normal|dp_attention_moe_ep_low_latency)
test_tbo|@(dispatcher/*|engine/@(alone_local_on_equals_off|dp_ep_normal_on_equals_off|dp_ep_low_latency_on_equals_off))'

n=$(printf '%s\n' "$runs" | wc -l)
echo "1..$n"
i=0
log=$(mktemp "${TMPDIR:-/tmp}/radix-guard-XXXXXX")
trap 'rm -f "$log"' EXIT
printf '%s\n' "$runs" | while IFS='|' read -r bin filt; do
    i=$((i + 1))
    if [ ! -x "$b/$bin" ]; then
        echo "ok $i - $bin # SKIP not built"
        continue
    fi
    if "$b/$bin" --filter="$filt" --jobs=2 >"$log" 2>&1; then
        echo "ok $i - $bin guarded: $(grep -o 'Tested: [0-9]*' "$log" | tail -1)"
    else
        echo "not ok $i - $bin guarded ($filt)"
        grep -A12 -E 'host access to device memory|\[FAIL\]|Assertion' "$log" | head -60 | sed 's/^/# /'
        tail -3 "$log" | sed 's/^/# /'
    fi
done
