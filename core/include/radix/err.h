/* radix/err.h -- status codes and the error buffer shared by the core and plugins.
 *
 * ABI: stable since 1.0.  Thread-safety: an rx_err belongs to one caller;
 * functions fill the buffer the caller hands them and never allocate on the
 * error path (nginx/collectd style fixed buffers).
 *
 * Convention: functions return int, RX_OK (0) or a negative enum rx_status.
 * errno carries no meaning across the plugin boundary: translate syscall,
 * CUDA or NCCL failures into a status plus a message that includes the native
 * error string. */
#ifndef RADIX_ERR_H
#define RADIX_ERR_H

#include <stdarg.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rx_status {
    RX_OK        =   0,
    RX_EINVAL    =  -1,  /* bad argument or input */
    RX_ENOMEM    =  -2,  /* out of host or device memory */
    RX_ENOTSUP   =  -3,  /* not supported by this implementation */
    RX_EIO       =  -4,  /* read/write/socket failure */
    RX_EABI      =  -5,  /* plugin ABI mismatch */
    RX_EDEVICE   =  -6,  /* accelerator error (CUDA, NCCL) */
    RX_ENOENT    =  -7,  /* not found */
    RX_ERANGE    =  -8,  /* value out of range */
    RX_EAGAIN    =  -9,  /* temporarily unavailable (queue full, ...) */
    RX_ETIMEDOUT = -10,  /* deadline passed */
    RX_EFORMAT   = -11,  /* malformed file or message */
    RX_ECONFIG   = -12,  /* invalid configuration */
    RX_EINTERNAL = -13   /* a bug: an invariant did not hold */
    /* Values are ABI: never renumber; append only. */
};

#define RX_ERR_MSG_MAX 256

/* The error buffer: code plus a one-line, human readable message. */
struct rx_err {
    int  code;
    char msg[RX_ERR_MSG_MAX];
};

/* Fill *err (if non-NULL) and return code, so that
 *     return rx_err_set (err, RX_EINVAL, "bad head_dim %d", hd);
 * works as a one-liner.  Messages longer than the buffer are truncated. */
static inline int rx_err_vset (struct rx_err *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf (err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

#if defined(__GNUC__)
__attribute__ ((format (printf, 3, 4)))
#endif
static inline int rx_err_set (struct rx_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start (ap, fmt);
    rx_err_vset (err, code, fmt, ap);
    va_end (ap);
    return code;
}

static inline void rx_err_clear (struct rx_err *err)
{
    if (err) {
        err->code = RX_OK;
        err->msg[0] = '\0';
    }
}

/* A short name for a status ("EINVAL"); never NULL. */
static inline const char *rx_status_name (int code)
{
    switch (code) {
    case RX_OK:        return "OK";
    case RX_EINVAL:    return "EINVAL";
    case RX_ENOMEM:    return "ENOMEM";
    case RX_ENOTSUP:   return "ENOTSUP";
    case RX_EIO:       return "EIO";
    case RX_EABI:      return "EABI";
    case RX_EDEVICE:   return "EDEVICE";
    case RX_ENOENT:    return "ENOENT";
    case RX_ERANGE:    return "ERANGE";
    case RX_EAGAIN:    return "EAGAIN";
    case RX_ETIMEDOUT: return "ETIMEDOUT";
    case RX_EFORMAT:   return "EFORMAT";
    case RX_ECONFIG:   return "ECONFIG";
    case RX_EINTERNAL: return "EINTERNAL";
    default:           return "EUNKNOWN";
    }
}

#ifdef __cplusplus
}
#endif
#endif /* RADIX_ERR_H */
