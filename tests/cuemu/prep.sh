#!/bin/sh
# tests/cuemu/prep.sh -- turn a CUDA source (kernels/cuda/kernels.cu) into
# C++17 that g++ compiles against the cuemu shim headers
# (tests/cuemu/README.md).  Usage: prep.sh IN.cu [OUT.cc]  (OUT: stdout).
#
# Only the two constructs C++ cannot parse are rewritten, line by line (the
# line count is kept, and a #line directive points diagnostics -- the
# compiler's and cuemu's deadlock reports -- at IN):
#   NAME<<<a, b[, c[, d]]>>> (args...)
#       -> cuemu::launch (NAME, cuemu::cfg (a, b[, c[, d]]).named ("NAME"), args...)
#      NAME may be a template-id (k<RX_CU_F32>); inside a #define whose
#      parameter is NAME's template (KERNEL<RX_CU_F32>), the name string is
#      #KERNEL "<RX_CU_F32>".  `<<<`, `>>>` and the `(` that opens the
#      arguments must be on one line (the arguments may continue).
#   extern __shared__ T name[];   ->  T *name = (T *) cuemu::dyn_smem ();
#   __shared__ T a[N], b[M];      ->  the same line (cuemu.h makes __shared__
#                                     `static`) + cuemu::shared_decl (&a, sizeof a);
#                                     per variable: poisons it when the first
#                                     thread of a block reaches it (one line)
#   #pragma unroll                ->  (an empty line: g++ warns about it)
# Anything else that looks like one of them but does not fit is an error
# (exit 1, a message naming IN:line), never silently passed through.
# POSIX sh + awk (mawk or gawk).
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: prep.sh IN.cu [OUT.cc]" >&2
    exit 2
fi
in=$1
if [ ! -r "$in" ]; then
    echo "prep.sh: cannot read $in" >&2
    exit 1
fi

run () {
    awk -v src="$in" '
function fail(msg) {
    printf "prep.sh: %s:%d: %s\n", src, NR, msg > "/dev/stderr"
    failed = 1
    exit 1
}
function trim(s) {
    sub(/^[ \t]+/, "", s)
    sub(/[ \t]+$/, "", s)
    return s
}
# The kernel name that ends `before` (identifier, optionally a template-id):
# sets NAME_START (index in before) and returns the name.
function kernel_name(before,    i, c, depth, end) {
    end = length(before)
    while (end > 0 && substr(before, end, 1) ~ /[ \t]/) end--
    i = end
    if (i > 0 && substr(before, i, 1) == ">") {
        depth = 0
        for (; i > 0; i--) {
            c = substr(before, i, 1)
            if (c == ">") depth++
            else if (c == "<") { depth--; if (depth == 0) break }
        }
        if (i == 0) fail("unbalanced template arguments before <<<")
        i--
        while (i > 0 && substr(before, i, 1) ~ /[ \t]/) i--
    }
    while (i > 0 && substr(before, i, 1) ~ /[A-Za-z0-9_:]/) i--
    NAME_START = i + 1
    if (NAME_START > end) fail("no kernel name before <<<")
    return substr(before, NAME_START, end - NAME_START + 1)
}
# A C string literal naming the kernel; in a macro body whose parameter
# is the template name, #PARAM "<args>".
function name_literal(name,    id, rest, k) {
    id = name
    sub(/[ \t]*<.*$/, "", id)
    rest = substr(name, length(id) + 1)
    if (in_macro) for (k in mparam) if (mparam[k] == id) return "#" id " \"" trim(rest) "\""
    return "\"" name "\""
}
# `__shared__ T a[N][M], b;` (one line) -> the line + a shared_decl per name.
function shared_decls(line,    d, depth, i, c, piece, n, out, nm) {
    d = line
    sub(/^[ \t]*(static[ \t]+)?__shared__[ \t]+/, "", d)
    sub(/;[ \t]*(\/\/.*|\/\*.*\*\/)?[ \t]*$/, "", d)
    gsub(/__align__[ \t]*\([^)]*\)/, "", d)
    # split at top-level commas
    n = 0; depth = 0; piece = ""
    for (i = 1; i <= length(d); i++) {
        c = substr(d, i, 1)
        if (c == "[" || c == "(" || c == "<") depth++
        else if (c == "]" || c == ")" || c == ">") depth--
        if (c == "," && depth == 0) { parts_[++n] = piece; piece = "" }
        else piece = piece c
    }
    parts_[++n] = piece
    out = ""
    for (i = 1; i <= n; i++) {
        nm = parts_[i]
        sub(/[ \t]*\[.*$/, "", nm)           # drop the dimensions
        nm = trim(nm)
        sub(/^.*[^A-Za-z0-9_]/, "", nm)        # the last identifier: the name
        if (nm == "" || nm ~ /^[0-9]/) fail("cannot find the name in a __shared__ declaration")
        out = out " cuemu::shared_decl (&" nm ", sizeof " nm ");"
    }
    return out
}
function rewrite_launch(line,    p, before, name, rest, q, conf, after, out) {
    out = ""
    while ((p = index(line, "<<<")) > 0) {
        before = substr(line, 1, p - 1)
        name = kernel_name(before)
        rest = substr(line, p + 3)
        q = index(rest, ">>>")
        if (q == 0) fail("<<< without >>> on the same line")
        conf = trim(substr(rest, 1, q - 1))
        if (conf == "") fail("empty launch configuration")
        after = substr(rest, q + 3)
        sub(/^[ \t]*/, "", after)
        if (substr(after, 1, 1) != "(") fail("launch without ( after >>> on the same line")
        after = substr(after, 2)
        out = out substr(before, 1, NAME_START - 1) "cuemu::launch (" name ", cuemu::cfg (" conf ").named (" name_literal(name) ")"
        if (after ~ /^[ \t]*\)/) line = after
        else line = ", " after
        sub(/^, [ \t]+/, ", ", line)
        if (line ~ /^, $/) line = ","
    }
    return out line
}
BEGIN { in_macro = 0; failed = 0; printf "#line 1 \"%s\"\n", src }
{
    line = $0
    # a #define with parameters: remember them while its body continues
    if (!in_macro && line ~ /^[ \t]*#[ \t]*define[ \t]+[A-Za-z_][A-Za-z0-9_]*\(/) {
        ps = line
        sub(/^[^(]*\(/, "", ps)
        sub(/\).*$/, "", ps)
        for (k in mparam) delete mparam[k]
        n = split(ps, parts, ",")
        for (k = 1; k <= n; k++) mparam[k] = trim(parts[k])
        in_macro = 1
    } else if (!in_macro && line ~ /^[ \t]*#[ \t]*define/) {
        for (k in mparam) delete mparam[k]
        in_macro = 1
    }
    if (line ~ /^[ \t]*#[ \t]*pragma[ \t]+unroll/) {
        line = ""
    } else if (line ~ /extern[ \t]+__shared__/) {
        if (line !~ /^[ \t]*extern[ \t]+__shared__[ \t]+[^;]*[A-Za-z_][A-Za-z0-9_]*[ \t]*\[[ \t]*\][ \t]*;[ \t]*$/)
            fail("extern __shared__ not of the form: extern __shared__ T name[];")
        ind = line
        sub(/[^ \t].*$/, "", ind)
        decl = line
        sub(/^[ \t]*extern[ \t]+__shared__[ \t]+/, "", decl)
        gsub(/__align__[ \t]*\([^)]*\)/, "", decl)
        sub(/[ \t]*\[[ \t]*\][ \t]*;[ \t]*$/, "", decl)
        var = decl
        sub(/^.*[^A-Za-z0-9_]/, "", var)
        type = trim(substr(decl, 1, length(decl) - length(var)))
        if (type == "" || var == "") fail("cannot split extern __shared__ declaration")
        line = ind type " *" var " = (" type " *) cuemu::dyn_smem ();"
    } else if (line ~ /^[ \t]*(static[ \t]+)?__shared__[ \t]/) {
        if (line !~ /;[ \t]*(\/\/.*|\/\*.*\*\/)?[ \t]*$/ || line ~ /=/)
            fail("__shared__ declaration not on one line, or with an initializer")
        line = line shared_decls(line)
    } else if (index(line, "<<<") > 0) {
        line = rewrite_launch(line)
    } else if (index(line, ">>>") > 0) {
        fail(">>> without <<< on the same line")
    }
    print line
    if (in_macro && $0 !~ /\\[ \t]*$/) in_macro = 0
}
END { if (failed) exit 1 }
' "$in"
}

if [ $# -eq 2 ]; then
    tmp="$2.tmp$$"
    if run > "$tmp"; then
        mv -f "$tmp" "$2"
    else
        rm -f "$tmp"
        exit 1
    fi
else
    run
fi
