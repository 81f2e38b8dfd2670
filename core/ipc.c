/* core/ipc.c -- ZMQ PUSH/PULL channels in a private run directory, and the
 * heartbeat page (see ipc.h for the socket options and why). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "ipc.h"

#define S_ENDPOINT_MAX 512

struct rx_ipc {
    void *ctx;
    char dir[PATH_MAX];
    int owner;                 /* created the run dir: remove it at destroy */
    int linger_ms;
    pthread_mutex_t lock;      /* guards the socket list */
    rx_ipc_sock_t *socks;      /* open sockets, closed at destroy */
};

struct rx_ipc_sock {
    rx_ipc_t *ipc;
    void *z;
    int kind;
    char endpoint[S_ENDPOINT_MAX];
    rx_ipc_sock_t *prev, *next;
};

/* ------------------------------------------------------------ run dir */

static rx_ipc_t *s_new (struct rx_err *err)
{
    rx_ipc_t *self = calloc (1, sizeof *self);
    if (!self) {
        rx_err_set (err, RX_ENOMEM, "ipc: out of memory");
        return NULL;
    }
    self->ctx = zmq_ctx_new ();
    if (!self->ctx) {
        rx_err_set (err, RX_EIO, "ipc: zmq_ctx_new: %s", zmq_strerror (zmq_errno ()));
        free (self);
        return NULL;
    }
    self->linger_ms = RX_IPC_LINGER_MS;
    pthread_mutex_init (&self->lock, NULL);
    return self;
}

rx_ipc_t *rx_ipc_create (const char *prefix, struct rx_err *err)
{
    if (!prefix || !*prefix || strchr (prefix, '/')) {
        rx_err_set (err, RX_EINVAL, "ipc: bad run directory prefix \"%s\"", prefix ? prefix : "");
        return NULL;
    }
    const char *base = getenv ("XDG_RUNTIME_DIR");
    struct stat st;
    /* Only use XDG_RUNTIME_DIR if it is a real directory we may write. */
    if (!base || base[0] != '/' || stat (base, &st) < 0 || !S_ISDIR (st.st_mode)
        || access (base, W_OK | X_OK) < 0)
        base = "/tmp";
    char tmpl[PATH_MAX];
    int n = snprintf (tmpl, sizeof tmpl, "%s/%s-XXXXXX", base, prefix);
    if (n < 0 || (size_t) n >= sizeof tmpl) {
        rx_err_set (err, RX_ERANGE, "ipc: run directory path %s/%s-XXXXXX too long", base, prefix);
        return NULL;
    }
    rx_ipc_t *self = s_new (err);
    if (!self) return NULL;
    if (!mkdtemp (tmpl)) {
        rx_err_set (err, RX_EIO, "ipc: cannot create run directory %s: %s", tmpl, strerror (errno));
        rx_ipc_destroy (&self);
        return NULL;
    }
    /* mkdtemp makes it 0700 already; say so explicitly in case of an odd libc. */
    chmod (tmpl, 0700);
    memcpy (self->dir, tmpl, (size_t) n + 1);
    self->owner = 1;
    return self;
}

rx_ipc_t *rx_ipc_join (const char *run_dir, struct rx_err *err)
{
    struct stat st;
    if (!run_dir || strlen (run_dir) >= PATH_MAX) {
        rx_err_set (err, RX_EINVAL, "ipc: bad run directory");
        return NULL;
    }
    if (stat (run_dir, &st) < 0 || !S_ISDIR (st.st_mode)) {
        rx_err_set (err, RX_ENOENT, "ipc: run directory %s: %s", run_dir,
                    errno ? strerror (errno) : "not a directory");
        return NULL;
    }
    rx_ipc_t *self = s_new (err);
    if (!self) return NULL;
    snprintf (self->dir, sizeof self->dir, "%s", run_dir);
    return self;
}

/* Remove the files (sockets, heartbeat pages) in our private directory and
 * the directory.  One level only: we never create subdirectories. */
static void s_remove_dir (const char *dir)
{
    int dfd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        DIR *d = fdopendir (dfd);
        if (d) {
            struct dirent *e;
            while ((e = readdir (d)))
                if (strcmp (e->d_name, ".") && strcmp (e->d_name, ".."))
                    unlinkat (dfd, e->d_name, 0);
            closedir (d);   /* closes dfd */
        } else {
            close (dfd);
        }
    }
    rmdir (dir);
}

void rx_ipc_destroy (rx_ipc_t **self_p)
{
    if (!self_p || !*self_p) return;
    rx_ipc_t *self = *self_p;
    while (self->socks) {
        rx_ipc_sock_t *s = self->socks;
        rx_ipc_close (&s);
    }
    if (self->ctx) {
        /* Returns once every socket is closed and its linger has run out. */
        while (zmq_ctx_term (self->ctx) < 0 && zmq_errno () == EINTR) {}
    }
    if (self->owner && self->dir[0]) s_remove_dir (self->dir);
    pthread_mutex_destroy (&self->lock);
    free (self);
    *self_p = NULL;
}

const char *rx_ipc_run_dir (const rx_ipc_t *self) { return self->dir; }

void rx_ipc_set_linger (rx_ipc_t *self, int linger_ms) { self->linger_ms = linger_ms; }

int rx_ipc_endpoint (const rx_ipc_t *self, const char *name, char *buf, size_t cap,
                     struct rx_err *err)
{
    if (!name || !*name) return rx_err_set (err, RX_EINVAL, "ipc: empty endpoint name");
    int n;
    if (strstr (name, "://")) {
        n = snprintf (buf, cap, "%s", name);
    } else {
        if (strchr (name, '/'))
            return rx_err_set (err, RX_EINVAL, "ipc: endpoint name \"%s\" must not contain '/'",
                               name);
        n = snprintf (buf, cap, "ipc://%s/%s", self->dir, name);
    }
    if (n < 0 || (size_t) n >= cap)
        return rx_err_set (err, RX_ERANGE, "ipc: endpoint for \"%s\" longer than %zu bytes", name,
                           cap);
    /* The kernel limits a Unix socket path to sizeof sun_path - 1 bytes;
     * ZMQ would fail with a vaguer "Invalid argument". */
    if (strncmp (buf, "ipc://", 6) == 0 && strlen (buf + 6) >= sizeof ((struct sockaddr_un *) 0)->sun_path)
        return rx_err_set (err, RX_ERANGE, "ipc: socket path longer than %zu bytes: %s",
                           sizeof ((struct sockaddr_un *) 0)->sun_path - 1, buf + 6);
    return RX_OK;
}

/* ------------------------------------------------------------ sockets */

static rx_ipc_sock_t *s_open (rx_ipc_t *self, int kind, const char *name, int bind,
                              struct rx_err *err)
{
    if (kind != RX_IPC_PUSH && kind != RX_IPC_PULL) {
        rx_err_set (err, RX_EINVAL, "ipc: unknown socket kind %d", kind);
        return NULL;
    }
    rx_ipc_sock_t *s = calloc (1, sizeof *s);
    if (!s) {
        rx_err_set (err, RX_ENOMEM, "ipc: out of memory");
        return NULL;
    }
    if (rx_ipc_endpoint (self, name, s->endpoint, sizeof s->endpoint, err) < 0) {
        free (s);
        return NULL;
    }
    s->ipc = self;
    s->kind = kind;
    s->z = zmq_socket (self->ctx, kind == RX_IPC_PUSH ? ZMQ_PUSH : ZMQ_PULL);
    if (!s->z) {
        rx_err_set (err, RX_EIO, "ipc: socket for %s: %s", s->endpoint, zmq_strerror (zmq_errno ()));
        free (s);
        return NULL;
    }
    int zero = 0, one = 1, linger = self->linger_ms;
    const char *what = NULL;
    if (zmq_setsockopt (s->z, ZMQ_SNDHWM, &zero, sizeof zero) < 0) what = "ZMQ_SNDHWM";
    else if (zmq_setsockopt (s->z, ZMQ_RCVHWM, &zero, sizeof zero) < 0) what = "ZMQ_RCVHWM";
    else if (zmq_setsockopt (s->z, ZMQ_LINGER, &linger, sizeof linger) < 0) what = "ZMQ_LINGER";
    else if (!bind && zmq_setsockopt (s->z, ZMQ_IMMEDIATE, &one, sizeof one) < 0)
        what = "ZMQ_IMMEDIATE";
    if (what) {
        rx_err_set (err, RX_EIO, "ipc: %s on %s: %s", what, s->endpoint,
                    zmq_strerror (zmq_errno ()));
        zmq_close (s->z);
        free (s);
        return NULL;
    }
    if ((bind ? zmq_bind (s->z, s->endpoint) : zmq_connect (s->z, s->endpoint)) < 0) {
        rx_err_set (err, RX_EIO, "ipc: %s %s: %s", bind ? "bind" : "connect", s->endpoint,
                    zmq_strerror (zmq_errno ()));
        zmq_close (s->z);
        free (s);
        return NULL;
    }
    if (bind) {
        /* A tcp port 0 bind picks a port: record what was actually bound. */
        char last[S_ENDPOINT_MAX];
        size_t ln = sizeof last;
        if (zmq_getsockopt (s->z, ZMQ_LAST_ENDPOINT, last, &ln) == 0 && ln > 1 && ln <= sizeof last)
            memcpy (s->endpoint, last, ln);
    }
    pthread_mutex_lock (&self->lock);
    s->next = self->socks;
    if (self->socks) self->socks->prev = s;
    self->socks = s;
    pthread_mutex_unlock (&self->lock);
    return s;
}

rx_ipc_sock_t *rx_ipc_bind (rx_ipc_t *self, int kind, const char *name, struct rx_err *err)
{
    return s_open (self, kind, name, 1, err);
}

rx_ipc_sock_t *rx_ipc_connect (rx_ipc_t *self, int kind, const char *name, struct rx_err *err)
{
    return s_open (self, kind, name, 0, err);
}

void rx_ipc_close (rx_ipc_sock_t **sock_p)
{
    if (!sock_p || !*sock_p) return;
    rx_ipc_sock_t *s = *sock_p;
    rx_ipc_t *self = s->ipc;
    pthread_mutex_lock (&self->lock);
    if (s->prev) s->prev->next = s->next;
    else self->socks = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock (&self->lock);
    zmq_close (s->z);
    free (s);
    *sock_p = NULL;
}

const char *rx_ipc_sock_endpoint (const rx_ipc_sock_t *sock) { return sock->endpoint; }

static int64_t s_now_ms (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until deadline (-1: forever). */
static long s_left (int64_t deadline)
{
    if (deadline < 0) return -1;
    int64_t l = deadline - s_now_ms ();
    return l > 0 ? (long) l : 0;
}

/* Wait for events on one socket; RX_OK, RX_ETIMEDOUT or RX_EIO.  Retries
 * EINTR (a SIGCHLD must not turn into a spurious failure). */
static int s_wait (rx_ipc_sock_t *s, short events, int64_t deadline, struct rx_err *err)
{
    for (;;) {
        zmq_pollitem_t it = { s->z, 0, events, 0 };
        int n = zmq_poll (&it, 1, s_left (deadline));
        if (n > 0) return RX_OK;
        if (n == 0) {
            if (deadline >= 0 && s_left (deadline) == 0)
                return rx_err_set (err, RX_ETIMEDOUT, "ipc: %s on %s timed out",
                                   events == ZMQ_POLLIN ? "receive" : "send", s->endpoint);
            continue;
        }
        if (zmq_errno () == EINTR) continue;
        return rx_err_set (err, RX_EIO, "ipc: poll %s: %s", s->endpoint,
                           zmq_strerror (zmq_errno ()));
    }
}

static int64_t s_deadline (int timeout_ms)
{
    return timeout_ms < 0 ? -1 : s_now_ms () + timeout_ms;
}

/* Send an initialised zmq_msg (closed here in every case). */
static int s_send_msg (rx_ipc_sock_t *s, zmq_msg_t *msg, int timeout_ms, struct rx_err *err)
{
    if (s->kind != RX_IPC_PUSH) {
        zmq_msg_close (msg);
        return rx_err_set (err, RX_EINVAL, "ipc: send on PULL socket %s", s->endpoint);
    }
    int64_t deadline = s_deadline (timeout_ms);
    for (;;) {
        if (zmq_msg_send (msg, s->z, ZMQ_DONTWAIT) >= 0) return RX_OK;   /* ZMQ owns it now */
        int e = zmq_errno ();
        if (e != EAGAIN && e != EINTR) {
            zmq_msg_close (msg);
            return rx_err_set (err, RX_EIO, "ipc: send on %s: %s", s->endpoint, zmq_strerror (e));
        }
        int rc = s_wait (s, ZMQ_POLLOUT, deadline, err);
        if (rc < 0) {
            zmq_msg_close (msg);
            return rc;
        }
    }
}

static void s_free_buf (void *data, void *hint)
{
    (void) hint;
    free (data);
}

int rx_ipc_send (rx_ipc_sock_t *sock, const struct rx_ipc_msg *m, int timeout_ms,
                 struct rx_err *err)
{
    uint8_t *buf;
    size_t len;
    int rc = rx_ipc_encode (m, &buf, &len, err);
    if (rc < 0) return rc;
    zmq_msg_t msg;
    if (zmq_msg_init_data (&msg, buf, len, s_free_buf, NULL) < 0) {
        free (buf);
        return rx_err_set (err, RX_ENOMEM, "ipc: zmq_msg_init_data: %s", zmq_strerror (zmq_errno ()));
    }
    return s_send_msg (sock, &msg, timeout_ms, err);
}

int rx_ipc_send_raw (rx_ipc_sock_t *sock, const void *buf, size_t n, int timeout_ms,
                     struct rx_err *err)
{
    zmq_msg_t msg;
    if (zmq_msg_init_size (&msg, n) < 0)
        return rx_err_set (err, RX_ENOMEM, "ipc: zmq_msg_init_size: %s", zmq_strerror (zmq_errno ()));
    if (n) memcpy (zmq_msg_data (&msg), buf, n);
    return s_send_msg (sock, &msg, timeout_ms, err);
}

/* Receive one message into msg (initialised here; caller closes on RX_OK). */
static int s_recv_msg (rx_ipc_sock_t *s, zmq_msg_t *msg, int timeout_ms, struct rx_err *err)
{
    if (s->kind != RX_IPC_PULL)
        return rx_err_set (err, RX_EINVAL, "ipc: receive on PUSH socket %s", s->endpoint);
    int64_t deadline = s_deadline (timeout_ms);
    zmq_msg_init (msg);
    for (;;) {
        if (zmq_msg_recv (msg, s->z, ZMQ_DONTWAIT) >= 0) {
            /* We only ever send single-part messages; a multipart one comes
             * from a foreign sender: consume and refuse it whole. */
            if (zmq_msg_more (msg)) {
                while (zmq_msg_more (msg) && zmq_msg_recv (msg, s->z, 0) >= 0) {}
                zmq_msg_close (msg);
                return rx_err_set (err, RX_EFORMAT, "ipc message: multipart message on %s",
                                   s->endpoint);
            }
            return RX_OK;
        }
        int e = zmq_errno ();
        if (e != EAGAIN && e != EINTR) {
            zmq_msg_close (msg);
            return rx_err_set (err, RX_EIO, "ipc: receive on %s: %s", s->endpoint,
                               zmq_strerror (e));
        }
        int rc = s_wait (s, ZMQ_POLLIN, deadline, err);
        if (rc < 0) {
            zmq_msg_close (msg);
            return rc;
        }
    }
}

int rx_ipc_sock_fd (rx_ipc_sock_t *sock)
{
    int fd = -1;
    size_t sz = sizeof fd;
    if (!sock || zmq_getsockopt (sock->z, ZMQ_FD, &fd, &sz) != 0) return -1;
    return fd;
}

int rx_ipc_recv (rx_ipc_sock_t *sock, struct rx_ipc_msg *m, int timeout_ms, struct rx_err *err)
{
    memset (m, 0, sizeof *m);
    zmq_msg_t msg;
    int rc = s_recv_msg (sock, &msg, timeout_ms, err);
    if (rc < 0) return rc;
    rc = rx_ipc_decode (zmq_msg_data (&msg), zmq_msg_size (&msg), m, err);
    zmq_msg_close (&msg);
    return rc;
}

int rx_ipc_recv_raw (rx_ipc_sock_t *sock, void **buf_p, size_t *n, int timeout_ms,
                     struct rx_err *err)
{
    *buf_p = NULL;
    zmq_msg_t msg;
    int rc = s_recv_msg (sock, &msg, timeout_ms, err);
    if (rc < 0) return rc;
    size_t sz = zmq_msg_size (&msg);
    void *b = malloc (sz ? sz : 1);
    if (!b) {
        zmq_msg_close (&msg);
        return rx_err_set (err, RX_ENOMEM, "ipc: out of memory for a %zu-byte message", sz);
    }
    memcpy (b, zmq_msg_data (&msg), sz);
    zmq_msg_close (&msg);
    *buf_p = b;
    *n = sz;
    return RX_OK;
}

int rx_ipc_poll (rx_ipc_sock_t *const *socks, size_t n, unsigned char *ready, int timeout_ms,
                 struct rx_err *err)
{
    enum { S_MAX = 64 };
    if (n == 0 || n > S_MAX)
        return rx_err_set (err, RX_EINVAL, "ipc: poll on %zu sockets (1..%d)", n, S_MAX);
    zmq_pollitem_t it[S_MAX];
    int64_t deadline = s_deadline (timeout_ms);
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            it[i] = (zmq_pollitem_t) { socks[i]->z, 0, ZMQ_POLLIN, 0 };
            ready[i] = 0;
        }
        int r = zmq_poll (it, (int) n, s_left (deadline));
        if (r > 0) {
            int c = 0;
            for (size_t i = 0; i < n; i++)
                if (it[i].revents & ZMQ_POLLIN) ready[i] = 1, c++;
            if (c) return c;
        } else if (r == 0) {
            if (deadline >= 0 && s_left (deadline) == 0) return 0;
        } else if (zmq_errno () != EINTR) {
            return rx_err_set (err, RX_EIO, "ipc: poll: %s", zmq_strerror (zmq_errno ()));
        }
    }
}

/* ------------------------------------------------------------ heartbeat */

#define S_HB_MAGIC 0x3154414542485852ull   /* "RXHBEAT1" little-endian */
#define S_HB_SIZE  4096

struct s_hb_page {
    uint64_t magic;
    _Atomic uint64_t beat;
    _Atomic uint64_t last_ns;
    _Atomic uint32_t pid;
    _Atomic uint32_t state;
};

struct rx_heartbeat {
    struct s_hb_page *page;
    int writer;
};

static uint64_t s_mono_ns (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

rx_heartbeat_t *rx_heartbeat_map (const char *path, int writer, struct rx_err *err)
{
    rx_heartbeat_t *self = calloc (1, sizeof *self);
    if (!self) {
        rx_err_set (err, RX_ENOMEM, "heartbeat: out of memory");
        return NULL;
    }
    int fd;
    char tmp[PATH_MAX];
    if (writer) {
        /* Build the page under a temporary name and rename it into place:
         * a reader never maps a half-initialised page, and a reader still
         * mapping an old page keeps its inode (no SIGBUS from truncation). */
        if (snprintf (tmp, sizeof tmp, "%s.%ld.tmp", path, (long) getpid ()) >= (int) sizeof tmp) {
            rx_err_set (err, RX_ERANGE, "heartbeat: path %s too long", path);
            free (self);
            return NULL;
        }
        fd = open (tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0 && ftruncate (fd, S_HB_SIZE) < 0) {
            rx_err_set (err, RX_EIO, "heartbeat: %s: %s", tmp, strerror (errno));
            close (fd);
            unlink (tmp);
            free (self);
            return NULL;
        }
    } else {
        fd = open (path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        int e = errno;
        rx_err_set (err, e == ENOENT ? RX_ENOENT : RX_EIO, "heartbeat: %s: %s",
                    writer ? tmp : path, strerror (e));
        free (self);
        return NULL;
    }
    struct stat st;
    if (!writer && (fstat (fd, &st) < 0 || st.st_size < S_HB_SIZE)) {
        rx_err_set (err, RX_EFORMAT, "heartbeat: %s is not a heartbeat page (%lld bytes)", path,
                    (long long) st.st_size);
        close (fd);
        free (self);
        return NULL;
    }
    void *p = mmap (NULL, S_HB_SIZE, writer ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close (fd);
    if (p == MAP_FAILED) {
        rx_err_set (err, RX_EIO, "heartbeat: mmap %s: %s", path, strerror (e));
        if (writer) unlink (tmp);
        free (self);
        return NULL;
    }
    self->page = p;
    self->writer = writer;
    if (writer) {
        atomic_store (&self->page->pid, (uint32_t) getpid ());
        atomic_store (&self->page->state, RX_HB_STARTING);
        self->page->magic = S_HB_MAGIC;
        if (rename (tmp, path) < 0) {
            rx_err_set (err, RX_EIO, "heartbeat: rename %s to %s: %s", tmp, path, strerror (errno));
            unlink (tmp);
            rx_heartbeat_close (&self);
            return NULL;
        }
    } else if (self->page->magic != S_HB_MAGIC) {
        rx_err_set (err, RX_EFORMAT, "heartbeat: %s is not a heartbeat page (bad magic)", path);
        rx_heartbeat_close (&self);
        return NULL;
    }
    return self;
}

static int s_hb_path (const rx_ipc_t *ipc, const char *name, char *buf, size_t cap,
                      struct rx_err *err)
{
    if (!name || !*name || strchr (name, '/'))
        return rx_err_set (err, RX_EINVAL, "heartbeat: bad name \"%s\"", name ? name : "");
    if (snprintf (buf, cap, "%s/%s.hb", ipc->dir, name) >= (int) cap)
        return rx_err_set (err, RX_ERANGE, "heartbeat: path for \"%s\" too long", name);
    return RX_OK;
}

rx_heartbeat_t *rx_heartbeat_create (const rx_ipc_t *ipc, const char *name, struct rx_err *err)
{
    char path[PATH_MAX];
    if (s_hb_path (ipc, name, path, sizeof path, err) < 0) return NULL;
    return rx_heartbeat_map (path, 1, err);
}

rx_heartbeat_t *rx_heartbeat_open (const rx_ipc_t *ipc, const char *name, struct rx_err *err)
{
    char path[PATH_MAX];
    if (s_hb_path (ipc, name, path, sizeof path, err) < 0) return NULL;
    return rx_heartbeat_map (path, 0, err);
}

void rx_heartbeat_close (rx_heartbeat_t **self_p)
{
    if (!self_p || !*self_p) return;
    munmap ((*self_p)->page, S_HB_SIZE);
    free (*self_p);
    *self_p = NULL;
}

void rx_heartbeat_beat (rx_heartbeat_t *self)
{
    if (!self->writer) return;
    /* Time first, then the count (release): a reader that sees the new
     * count also sees a time at least as new. */
    atomic_store_explicit (&self->page->last_ns, s_mono_ns (), memory_order_relaxed);
    atomic_fetch_add_explicit (&self->page->beat, 1, memory_order_release);
}

void rx_heartbeat_set_state (rx_heartbeat_t *self, uint32_t state)
{
    if (self->writer) atomic_store_explicit (&self->page->state, state, memory_order_release);
}

void rx_heartbeat_read (const rx_heartbeat_t *self, struct rx_heartbeat_info *info)
{
    struct s_hb_page *pg = self->page;
    info->beat = atomic_load_explicit (&pg->beat, memory_order_acquire);
    info->last_ns = atomic_load_explicit (&pg->last_ns, memory_order_relaxed);
    info->pid = atomic_load_explicit (&pg->pid, memory_order_relaxed);
    info->state = atomic_load_explicit (&pg->state, memory_order_acquire);
    uint64_t now = s_mono_ns ();
    info->age_ns = info->last_ns == 0 ? UINT64_MAX : now > info->last_ns ? now - info->last_ns : 0;
}
