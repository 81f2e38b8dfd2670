#!/bin/sh
# The third-party path, end to end: build plugins/examples/skeleton in a
# separate folder with only the *installed* headers and radix-plugin.pc,
# then have the installed radixd list it, describe it, validate a config
# that configures it, and refuse a bad value for one of its keys.
# usage: test-oot.sh PREFIX SRCDIR     (prints TAP)
set -u
prefix=$1
srcdir=$2
work=$(mktemp -d /tmp/radix-oot-XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
n=0; fail=0
ok()   { n=$((n+1)); echo "ok $n - $1"; }
nok()  { n=$((n+1)); fail=$((fail+1)); echo "not ok $n - $1"; }
check() { desc=$1; shift; if "$@" >"$work/out" 2>&1; then ok "$desc"; else nok "$desc"; sed 's/^/# /' "$work/out"; fi; }

cp "$srcdir/plugins/examples/skeleton/skeleton.c" "$srcdir/plugins/examples/skeleton/Makefile" "$work/"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# Nothing from the source tree may leak in: no -I to it, no core library.
check "pkg-config finds radix-plugin" pkg-config --exists radix-plugin
check "radix-plugin has no Libs" sh -c '[ -z "$(pkg-config --libs radix-plugin)" ]'
check "skeleton builds against installed headers" make -C "$work" sched-skeleton.so
mkdir -p "$work/plugins" && cp "$work/sched-skeleton.so" "$work/plugins/"
export RADIX_PLUGIN_PATH="$work/plugins"
abi=$(pkg-config --modversion radix-plugin)   # the ABI the skeleton was built against
check "installed radixd lists it" sh -c "'$prefix/bin/radixd' --list-plugins | grep -E '^scheduler +skeleton +0\.1\.0 +$abi '"
check "installed radixd lists installed plugins" sh -c "'$prefix/bin/radixd' --list-plugins | grep -E '^scheduler +fcfs .*$prefix/lib/radix/plugins/sched-fcfs.so'"
check "--help-plugin shows its keys" sh -c "'$prefix/bin/radixd' --help-plugin skeleton | grep -q 'long_first'"
cat > "$work/ok.ini" <<INI
[scheduler]
policy = skeleton
[scheduler.skeleton]
long_first = yes
cached_weight = 0.5
INI
check "a config using it validates" "$prefix/bin/radixd" -c "$work/ok.ini" --check-config
cat > "$work/bad.ini" <<INI
[scheduler]
policy = skeleton
[scheduler.skeleton]
cached_weight = 2
INI
check "a bad value for its key is refused with file:line" sh -c "! '$prefix/bin/radixd' -c '$work/bad.ini' --check-config 2>'$work/err' && grep -q 'bad.ini:4 \[scheduler.skeleton\]: cached_weight = \"2\": out of range' '$work/err'"
check "reference config installed" test -f "$prefix/share/radix/conf/radixd.ini"
echo "1..$n"
[ $fail -eq 0 ]
