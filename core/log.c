/* core/log.c -- see log.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static atomic_int s_level = RX_LOG_INFO;
static atomic_int s_fd = 2;
static pthread_mutex_t s_role_mu = PTHREAD_MUTEX_INITIALIZER;
static char s_role[48] = "radix";

static const char *const s_names[] = { "error", "warn", "info", "debug", "trace" };

void rx_log_set_role (const char *role, const char *rank_tag)
{
    pthread_mutex_lock (&s_role_mu);
    if (rank_tag && *rank_tag)
        snprintf (s_role, sizeof s_role, "%s %s", role, rank_tag);
    else
        snprintf (s_role, sizeof s_role, "%s", role);
    pthread_mutex_unlock (&s_role_mu);
}

void rx_log_set_level (int level)
{
    if (level < RX_LOG_ERROR) level = RX_LOG_ERROR;
    if (level > RX_LOG_TRACE) level = RX_LOG_TRACE;
    atomic_store (&s_level, level);
}

int rx_log_get_level (void) { return atomic_load (&s_level); }

int rx_log_enabled (int level) { return level <= atomic_load (&s_level); }

int rx_log_level_parse (const char *s)
{
    for (int i = 0; i < 5; i++)
        if (strcasecmp (s, s_names[i]) == 0)
            return i;
    if (strcasecmp (s, "warning") == 0)
        return RX_LOG_WARN;
    return -1;
}

const char *rx_log_level_name (int level)
{
    return level >= 0 && level <= RX_LOG_TRACE ? s_names[level] : "?";
}

int rx_log_set_file (const char *path)
{
    int fd = 2;
    if (path && *path && strcmp (path, "-") != 0) {
        fd = open (path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0)
            return -1;
    }
    int old = atomic_exchange (&s_fd, fd);
    if (old > 2)
        close (old);
    return 0;
}

void rx_log_tagged_v (int level, const char *tag, const char *fmt, va_list ap)
{
    if (!rx_log_enabled (level))
        return;
    static const char *const lv[] = { "ERROR", "WARN ", "INFO ", "DEBUG", "TRACE" };
    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime (CLOCK_REALTIME, &ts);
    gmtime_r (&ts.tv_sec, &tm);
    char role[48];
    pthread_mutex_lock (&s_role_mu);
    memcpy (role, s_role, sizeof role);
    pthread_mutex_unlock (&s_role_mu);
    int n = snprintf (line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s [%s]%s%s%s ",
                      tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                      tm.tm_sec, ts.tv_nsec / 1000000,
                      lv[level < 0 ? 0 : level > 4 ? 4 : level], role,
                      tag ? " " : "", tag ? tag : "", tag ? ":" : "");
    if (n < 0) return;
    if ((size_t) n >= sizeof line) n = sizeof line - 1;
    int m = vsnprintf (line + n, sizeof line - (size_t) n, fmt, ap);
    if (m < 0) m = 0;
    size_t len = (size_t) n + (size_t) m;
    if (len > sizeof line - 2) len = sizeof line - 2;
    while (len > 0 && line[len - 1] == '\n')
        len--;
    line[len++] = '\n';
    int fd = atomic_load (&s_fd);
    const char *p = line;
    while (len > 0) {
        ssize_t w = write (fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w;
        len -= (size_t) w;
    }
}

void rx_log (int level, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    rx_log_tagged_v (level, NULL, fmt, ap);
    va_end (ap);
}
