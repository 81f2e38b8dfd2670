/* core/log.h -- leveled, timestamped log lines with a process-role prefix.
 *
 * Every line: "2026-11-29T10:06:24.123Z INFO  [sched TP1] message".
 * One write(2) per line, so lines from threads and processes sharing the
 * stream do not interleave.  Thread-safe. */
#ifndef RX_LOG_H
#define RX_LOG_H

#include <stdarg.h>

#include <radix/host.h>   /* enum rx_log_level */

/* Set the role shown in the prefix: rx_log_set_role ("sched", "TP1").
 * rank_tag may be NULL.  Copied. */
void rx_log_set_role (const char *role, const char *rank_tag);
void rx_log_set_level (int level);
int  rx_log_get_level (void);
/* Parse "error|warn|info|debug|trace"; returns the level or -1. */
int  rx_log_level_parse (const char *s);
const char *rx_log_level_name (int level);
/* Send lines to PATH (appended) instead of stderr; NULL or "" or "-" means
 * stderr.  Returns 0, or -1 with errno set (the stream stays as it was). */
int  rx_log_set_file (const char *path);
int  rx_log_enabled (int level);

#if defined(__GNUC__)
__attribute__ ((format (printf, 2, 3)))
#endif
void rx_log (int level, const char *fmt, ...);
/* As rx_log, with a sub-tag after the role, e.g. the plugin name. */
void rx_log_tagged_v (int level, const char *tag, const char *fmt, va_list ap);

#define rx_error(...) rx_log (RX_LOG_ERROR, __VA_ARGS__)
#define rx_warn(...)  rx_log (RX_LOG_WARN,  __VA_ARGS__)
#define rx_info(...)  rx_log (RX_LOG_INFO,  __VA_ARGS__)
#define rx_debug(...) do { if (rx_log_enabled (RX_LOG_DEBUG)) rx_log (RX_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
