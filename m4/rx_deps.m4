# RX_REQUIRE_PKG(VARIABLE, MODULES, DEBIAN-PACKAGE)
# pkg-config lookup that stops configure with the package to install.
AC_DEFUN([RX_REQUIRE_PKG], [
  PKG_CHECK_MODULES([$1], [$2], [],
    [AC_MSG_ERROR([$2 not found by pkg-config ($$1_PKG_ERRORS).
    On Debian: apt-get install $3 (scripts/deps does it for you)])])
])

# RX_CHECK_PTHREAD: -pthread for compiling and linking.
AC_DEFUN([RX_CHECK_PTHREAD], [
  AC_MSG_CHECKING([whether $CC accepts -pthread])
  rx_save_CFLAGS=$CFLAGS
  CFLAGS="$CFLAGS -pthread"
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <pthread.h>
static void *f(void *a) { return a; }]],
                   [[pthread_t t; pthread_create(&t, 0, f, 0); pthread_join(t, 0);]])],
    [AC_MSG_RESULT([yes]); PTHREAD_CFLAGS=-pthread; PTHREAD_LIBS=-pthread],
    [AC_MSG_RESULT([no])
     AC_CHECK_LIB([pthread], [pthread_create], [PTHREAD_LIBS=-lpthread],
                  [AC_MSG_ERROR([POSIX threads are required])])])
  CFLAGS=$rx_save_CFLAGS
  AC_SUBST([PTHREAD_CFLAGS])
  AC_SUBST([PTHREAD_LIBS])
])
