# RX_CHECK_CUDA: --with-cuda[=DIR], auto-detected from nvcc (PATH, then
# /usr/local/cuda).  Sets NVCC, CUDA_CPPFLAGS, CUDA_LIBS and the BUILD_CUDA
# conditional.  Only the CUDA plugin uses these flags.
AC_DEFUN([RX_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA kernel plugin @<:@auto@:>@])],
    [], [with_cuda=check])
  NVCC=
  AS_IF([test "x$with_cuda" != xno], [
    AS_CASE([$with_cuda],
      [yes|check], [rx_cuda_path="$PATH$PATH_SEPARATOR/usr/local/cuda/bin"],
      [rx_cuda_path="$with_cuda/bin"])
    AC_PATH_PROG([NVCC], [nvcc], [], [$rx_cuda_path])
    AS_IF([test -n "$NVCC"], [
        cuda_prefix=`dirname "$NVCC"`; cuda_prefix=`dirname "$cuda_prefix"`
        CUDA_PREFIX=$cuda_prefix
        CUDA_CPPFLAGS="-I$cuda_prefix/include"
        rx_cuda_libdir="$cuda_prefix/lib64"
        test -d "$rx_cuda_libdir" || rx_cuda_libdir="$cuda_prefix/lib"
        CUDA_LIBS="-L$rx_cuda_libdir -Wl,-rpath,$rx_cuda_libdir -lcublasLt -lcublas -lcudart"
        with_cuda=yes],
      [test "x$with_cuda" = xcheck], [with_cuda=no],
      [AC_MSG_ERROR([--with-cuda=$with_cuda given but nvcc was not found in $rx_cuda_path])])
  ])
  AC_SUBST([NVCC])
  AC_SUBST([CUDA_PREFIX])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LIBS])
  AM_CONDITIONAL([BUILD_CUDA], [test "x$with_cuda" = xyes])
])

# RX_CHECK_NCCL: --with-nccl[=DIR]; looks beside CUDA by default.
AC_DEFUN([RX_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@], [build the NCCL comm plugin @<:@auto@:>@])],
    [], [with_nccl=check])
  NCCL_CPPFLAGS=
  NCCL_LIBS=
  AS_IF([test "x$with_nccl" != xno], [
    AS_CASE([$with_nccl],
      [yes|check], [rx_nccl_dirs="${CUDA_PREFIX:-/usr/local/cuda} /usr"],
      [rx_nccl_dirs="$with_nccl"])
    rx_nccl_found=no
    for rx_d in $rx_nccl_dirs; do
      AS_IF([test -f "$rx_d/include/nccl.h"], [
        for rx_l in "$rx_d/lib64" "$rx_d/lib" "$rx_d/lib/x86_64-linux-gnu"; do
          AS_IF([test -f "$rx_l/libnccl.so" || ls "$rx_l"/libnccl.so.* >/dev/null 2>&1], [
            NCCL_CPPFLAGS="-I$rx_d/include $CUDA_CPPFLAGS"
            NCCL_LIBS="-L$rx_l -Wl,-rpath,$rx_l -lnccl $CUDA_LIBS"
            rx_nccl_found=yes; break 2])
        done])
    done
    AC_MSG_CHECKING([for NCCL])
    AC_MSG_RESULT([$rx_nccl_found])
    AS_IF([test $rx_nccl_found = yes], [with_nccl=yes],
          [test "x$with_nccl" = xcheck], [with_nccl=no],
          [AC_MSG_ERROR([--with-nccl=$with_nccl given but nccl.h/libnccl.so were not found in $rx_nccl_dirs])])
  ])
  AC_SUBST([NCCL_CPPFLAGS])
  AC_SUBST([NCCL_LIBS])
  AM_CONDITIONAL([BUILD_NCCL], [test "x$with_nccl" = xyes])
])
