#!/bin/sh
# run-bundle.sh -- on the GPU machine: unpack tests/gpu/bundle.sh's bundle
# (this script's folder) and run tests/gpu/check.sh on it.  Output folder:
# $OUT (default /tmp/gpu-out): summary.txt and check-logs.tgz (every log,
# the profiles included; not the generated models).  KERNELS=simple|fast|both
# and CHECK_LIMIT (seconds, default 480) pass through.  CUDA's libraries
# come from /usr/local/cuda, else from wherever find sees them (e.g. a
# Python venv's nvidia wheels).
set -u
D=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$D/.." && pwd)
O=${OUT:-/tmp/gpu-out}
mkdir -p "$O"
nvidia-smi -L
tar -xJf "$D/rxgpub.tar.xz" -C / || { echo "run-bundle: cannot unpack"; exit 1; }
LD_LIBRARY_PATH=$D/syslibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for lib in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
  if [ ! -e /usr/local/cuda/lib64/$lib ]; then
    f=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
  fi
done
export LD_LIBRARY_PATH
RADIX_SHARED=$D/shared SKIP_MAKE=1 RX_GPU_BUILD=/tmp/rxgpub timeout "${CHECK_LIMIT:-480}" \
  sh "$R/tests/gpu/check.sh" "$O/check"
st=$?
# One archive of every log (a device tool may bring back only a few files),
# the short table beside it.
cp "$O/check/summary.txt" "$O/summary.txt" 2>/dev/null
tar -czf "$O/check-logs.tgz" -C "$O" --exclude='*.gguf' --exclude=build check && rm -rf "$O/check"
exit $st
