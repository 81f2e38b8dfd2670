#!/bin/sh
# tests/cuemu.sh -- kernels/cuda on the CPU (tests/cuemu/README.md): the
# emulated kernels-cuda.so (tests/cuemu/kernels-cuda.la: the unmodified
# kernels/cuda sources on cuemu) against kernels-cpu, op by op, with
# tests/gpu/compare -- once per kernel set: the defaults ("simple"), and
# "fast" ([kernels.cuda] matvec = fast, attention = tiled,
# attention_splits = auto), as
# tests/gpu/check.sh does on a GPU.  TAP.
#
# The plugin folder is a temporary one: every plugin of RX_PLUGIN_BUILD_DIR
# (symlinks) except a real kernels-cuda.so (a --with-cuda build has one),
# plus the emulated one under that name.
#
# Then the reference models (tests/unit/test_models_ref) on the emulated
# backend, per kernel set ("fast" with decode steps replayed from CUDA
# graphs, [scheduler] cuda_graph_max_bs = 64, as check.sh does).  By
# default a short selection (make check already runs long): "simple" runs
# every model's last_rows_of_four_sequences (prefills of four sequences,
# ~6 s), "fast" the MoE and DeepSeek models' two_sequences_batched (decode
# steps replayed as graphs through the device MoE path and batched MLA
# heads, ~30 s).  CUEMU_MODELS=1 runs three tests per model (about 2
# minutes a set on an idle core), CUEMU_MODELS=0 none, any other value is
# a Criterion filter for both sets.  A sanitizer build (the plugin links
# libasan or libtsan) skips the models: 3-10x slower there, and compare
# already runs every kernel under the sanitizer.
#
# Last, device sampling through radixd on the emulated backend
# (tests/cuemu/sampling.py: penalized rows and logprobs from candidates
# against a CPU radixd's host path, ~15 s; skipped in a sanitizer build
# and without python3; CUEMU_SAMPLING=0 skips it).
#
# Environment: RX_TOP_BUILDDIR, RX_PLUGIN_BUILD_DIR (make check sets them);
# CUEMU_TIMEOUT (seconds per run, default 900); CUEMU_SETS ("simple fast"
# by default); CUEMU_MODELS (above).  A failure shows compare's FAIL lines and
# the emulator's "cuemu:" messages (a deadlocked barrier, a capture rule,
# a pointer outside device memory).
set -u
B=${RX_TOP_BUILDDIR:?run through make check}
P=${RX_PLUGIN_BUILD_DIR:?run through make check}
emu=$B/tests/cuemu/.libs/kernels-cuda.so
cmp=$B/tests/gpu/compare
sets=${CUEMU_SETS:-simple fast}
limit=${CUEMU_TIMEOUT:-900}

models=$B/tests/unit/test_models_ref
mfilt=${CUEMU_MODELS:-}
[ "$mfilt" = 1 ] && mfilt='*/@(teacher_forced_chunks_of_7|two_sequences_batched|last_rows_of_four_sequences)'
msan=
[ -z "$mfilt" ] && [ -f "$emu" ] && ldd "$emu" 2>/dev/null | grep -qE 'lib[at]san' && msan=1

n=1
for k in $sets; do n=$((n + 2)); done
echo "1..$n"
if [ ! -f "$emu" ] || [ ! -x "$cmp" ]; then
    i=0
    for k in $sets; do
        echo "ok $((i + 1)) - ops-vs-cpu $k # SKIP not built ($emu, $cmp)"
        echo "ok $((i + 2)) - models-ref $k # SKIP not built"
        i=$((i + 2))
    done
    echo "ok $n - device-sampling # SKIP not built"
    exit 0
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/radix-cuemu-XXXXXX") || exit 1
log=$dir.log
mini=$dir.ini
trap 'rm -rf "$dir" "$log" "$mini"' EXIT
for so in "$P"/*.so; do
    [ -e "$so" ] || continue
    [ "$(basename "$so")" = kernels-cuda.so ] && continue
    ln -s "$so" "$dir/"
done
ln -s "$emu" "$dir/kernels-cuda.so"

i=0
for k in $sets; do
    i=$((i + 1))
    case $k in
        simple) ini= ;;
        fast) ini='[kernels.cuda]\nmatvec = fast\nattention = tiled\nattention_splits = auto' ;;
        *) echo "not ok $i - ops-vs-cpu $k: unknown kernel set (simple|fast)"
           i=$((i + 1))
           echo "not ok $i - models-ref $k: unknown kernel set"
           continue ;;
    esac
    t0=$(date +%s)
    RX_COMPARE_INI="$ini" timeout "$limit" "$cmp" "$dir" > "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    pass=$(grep -c '^PASS' "$log")
    fail=$(grep -c '^FAIL' "$log")
    dev=$(sed -n 's/^# cuda: //p' "$log" | head -1)
    if [ $rc -eq 0 ]; then
        echo "ok $i - ops-vs-cpu $k: $pass cases pass on $dev (${secs} s)"
    else
        case $rc in
            77) why="compare could not create the emulated backend" ;;
            124) why="timed out after $limit s" ;;
            *) why="exit $rc" ;;
        esac
        echo "not ok $i - ops-vs-cpu $k: $fail of $((pass + fail)) cases fail, $why (${secs} s)"
        grep -E '^(FAIL|SKIP)|cuemu:|compare:' "$log" | head -40 | sed 's/^/# /'
        tail -5 "$log" | sed 's/^/# /'
    fi

    # The reference models on the emulated backend (opt-in: CUEMU_MODELS).
    i=$((i + 1))
    filt=$mfilt
    if [ -z "$filt" ]; then
        case $k in
            simple) filt='*/last_rows_of_four_sequences' ;;
            fast) filt='@(tiny_moe|tiny_deepseek2)/two_sequences_batched' ;;
        esac
    fi
    if [ "$filt" = 0 ]; then
        echo "ok $i - models-ref $k # SKIP CUEMU_MODELS=0"
        continue
    fi
    if [ -n "$msan" ]; then
        echo "ok $i - models-ref $k # SKIP sanitizer build (CUEMU_MODELS=1 runs it anyway)"
        continue
    fi
    if [ ! -x "$models" ]; then
        echo "ok $i - models-ref $k # SKIP tests/unit/test_models_ref not built"
        continue
    fi
    printf '[kernels]\nbackend = cuda\n[cache]\nkv_memory = 256MiB\n' > "$mini"
    [ "$k" = fast ] && printf '[kernels.cuda]\nmatvec = fast\nattention = tiled\nattention_splits = auto\n[scheduler]\ncuda_graph_max_bs = 64\n' >> "$mini"
    t0=$(date +%s)
    CUEMU_STATS=1 RX_PLUGIN_BUILD_DIR="$dir" RX_MODELS_REF_INI="$mini" timeout "$limit" "$models" \
        --filter="$filt" --jobs=1 > "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    res=$(grep -o 'Tested: [0-9]* | Passing: [0-9]*' "$log" | tail -1)
    stats=$(sed -n 's/^cuemu: stats: //p' "$log" | awk '{ c += $7; g += $12 } END { printf "%d captures, %d graph launches", c, g }')
    if [ $rc -eq 0 ]; then
        echo "ok $i - models-ref $k: $res ($stats; ${secs} s)"
    else
        echo "not ok $i - models-ref $k: ${res:-no summary}, exit $rc (${secs} s)"
        grep -E '\[FAIL\]|Assert|cuemu:' "$log" | grep -v 'cuemu: stats' | head -30 | sed 's/^/# /'
        tail -3 "$log" | sed 's/^/# /'
    fi
done

# Device sampling through radixd (tests/cuemu/sampling.py).
i=$((i + 1))
src=$(cd "$(dirname "$0")" && pwd)
if [ "${CUEMU_SAMPLING:-1}" = 0 ]; then
    echo "ok $i - device-sampling # SKIP CUEMU_SAMPLING=0"
elif [ -n "$msan" ]; then
    echo "ok $i - device-sampling # SKIP sanitizer build"
elif ! command -v python3 > /dev/null; then
    echo "ok $i - device-sampling # SKIP no python3"
else
    t0=$(date +%s)
    timeout "$limit" python3 "$src/cuemu/sampling.py" "$dir" > "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then
        echo "ok $i - device-sampling: $(tail -1 "$log") (${secs} s)"
    else
        echo "not ok $i - device-sampling: exit $rc (${secs} s)"
        tail -15 "$log" | sed 's/^/# /'
    fi
fi
