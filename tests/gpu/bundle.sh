#!/bin/sh
# tests/gpu/bundle.sh [DIR] -- make a prebuilt bundle for a GPU machine that
# has CUDA but not the project's build dependencies (no network there):
# builds with --with-cuda in /tmp/rxgpub (the same absolute path is restored
# on the GPU machine, so libtool's paths stay valid), then packs into DIR
# (default _gpu/, keep it out of git: .git/info/exclude) the build's
# programs and plugins, the shared libraries they load that are not glibc
# or CUDA, the reference models ($RADIX_SHARED/data/models) and
# tests/gpu/run-bundle.sh.  On the GPU machine, from the checkout:
#     sh _gpu/run-bundle.sh            # -> tests/gpu/check.sh's table
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
D=${1:-$top/_gpu}
case $D in /*) ;; *) D=$PWD/$D ;; esac   # the packing below runs from /
B=/tmp/rxgpub
shared=${RADIX_SHARED:-$top/../shared}
[ -x "$top/configure" ] || (cd "$top" && autoreconf -fi)
mkdir -p "$B"
[ -f "$B/Makefile" ] || (cd "$B" && "$top/configure" --with-cuda --prefix="$B/inst" >/dev/null)
make -C "$B" -j"$(nproc)" >/dev/null
make -C "$B" -j"$(nproc)" tests/unit/test_kernels_cuda_host tests/unit/test_models_ref tests/gpu/compare >/dev/null
rm -rf "$D" && mkdir -p "$D/syslibs" "$D/shared/data/models"
list=$D/files.txt
cd /
{ find "${B#/}" -path "${B#/}/inst" -prune -o -type f \( -name '*.so' -o -name '*.so.*' \) -print
  find "${B#/}" -path "${B#/}/inst" -prune -o -type f -perm -u+x ! -name '*.o' ! -name '*.lo' \
       ! -name config.status ! -name libtool -print
  find "${B#/}/_plugins" -type l; } | sort -u > "$list"
tar -cf - -T "$list" | xz -6 > "$D/rxgpub.tar.xz"
for f in $(cat "$list"); do ldd "/$f" 2>/dev/null; done | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so' |
  grep -v -E 'cuda|nvidia|nccl|cublas' | while read -r l; do cp -L "$l" "$D/syslibs/"; done
cp "$shared"/data/models/* "$D/shared/data/models/"
cp "$top/tests/gpu/run-bundle.sh" "$D/"
du -sh "$D"
