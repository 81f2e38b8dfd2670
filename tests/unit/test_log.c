/* tests/unit/test_log.c -- log line format, levels, file output; metrics. */
#include <criterion/criterion.h>
#include <regex.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "../testutil.h"

static char *s_read (const char *path)
{
    FILE *f = fopen (path, "r");
    cr_assert_not_null (f);
    char *t = tu_slurp_fd (fileno (f));
    fclose (f);
    return t;
}

Test (log, line_format_role_and_levels)
{
    char *dir = tu_tmpdir ();
    char *path = tu_path (dir, "radix.log");
    cr_assert_eq (rx_log_set_file (path), 0);
    rx_log_set_role ("sched", "TP1");
    rx_log_set_level (RX_LOG_INFO);
    rx_info ("hello %d", 42);
    rx_debug ("hidden %d", 1);
    rx_log (RX_LOG_ERROR, "bad thing\n");
    rx_log_set_level (RX_LOG_DEBUG);
    rx_debug ("now visible");
    cr_assert_eq (rx_log_set_file ("-"), 0);
    char *text = s_read (path);
    regex_t re;
    cr_assert_eq (regcomp (&re,
        "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z INFO  \\[sched TP1\\] hello 42\n"
        "[0-9T:.Z-]+ ERROR \\[sched TP1\\] bad thing\n"
        "[0-9T:.Z-]+ DEBUG \\[sched TP1\\] now visible\n$", REG_EXTENDED), 0);
    cr_assert_eq (regexec (&re, text, 0, NULL, 0), 0, "log text:\n%s", text);
    regfree (&re);
    free (text);
    unlink (path);
    rmdir (dir);
    free (path);
    free (dir);
}

Test (log, level_names)
{
    cr_assert_eq (rx_log_level_parse ("error"), RX_LOG_ERROR);
    cr_assert_eq (rx_log_level_parse ("WARN"), RX_LOG_WARN);
    cr_assert_eq (rx_log_level_parse ("warning"), RX_LOG_WARN);
    cr_assert_eq (rx_log_level_parse ("trace"), RX_LOG_TRACE);
    cr_assert_eq (rx_log_level_parse ("loud"), -1);
    cr_assert_str_eq (rx_log_level_name (RX_LOG_DEBUG), "debug");
}

Test (log, unwritable_file_keeps_stream)
{
    cr_assert_eq (rx_log_set_file ("/nonexistent/dir/x.log"), -1);
}

Test (metrics, register_add_set_render)
{
    int c = rx_metrics_register ("radix_test_requests-total", RX_METRIC_COUNTER, "requests");
    cr_assert_geq (c, 0);
    cr_assert_eq (rx_metrics_register ("radix_test_requests-total", RX_METRIC_COUNTER, "x"), c);
    cr_assert_eq (rx_metrics_register ("radix_test_requests-total", RX_METRIC_GAUGE, "x"), RX_EINVAL);
    int g = rx_metrics_register ("radix_test_queue", RX_METRIC_GAUGE, "queued");
    rx_metrics_add (c, 2);
    rx_metrics_add (c, 3);
    rx_metrics_set (g, 7.5);
    cr_assert_float_eq (rx_metrics_get (c), 5.0, 1e-12);
    char buf[4096];
    size_t n = rx_metrics_render (buf, sizeof buf);
    cr_assert_lt (n, sizeof buf);
    cr_assert (strstr (buf, "# TYPE radix_test_requests_total counter\nradix_test_requests_total 5\n"), "%s", buf);
    cr_assert (strstr (buf, "# TYPE radix_test_queue gauge\nradix_test_queue 7.5\n"), "%s", buf);
    /* a short buffer reports the length it needed and stays terminated */
    char small[16];
    size_t need = rx_metrics_render (small, sizeof small);
    cr_assert_eq (need, n);
    cr_assert_eq (strlen (small), sizeof small - 1);
}
