/* bench/tbo_bench.c -- two-batch overlap (TBO) throughput, on vs off.
 *
 *   bench/tbo-bench MODEL.gguf [--moe ep_normal] [--ranks 2] [--batch 16]
 *                   [--prompt 16] [--decode 32] [--repeat 5] [--threads 1]
 *
 * Forks `ranks` DP-attention ranks (comm-shm, ep_size = ranks, the given
 * dispatcher), each an engine with [scheduler] two_batch_overlap off, then
 * on (alternating, `repeat` times each): every rank prefills `batch`
 * sequences of `prompt` random tokens in one step, then decodes them for
 * `decode` steps (one step = all sequences).  Rank 0 times the prefill step
 * and the decode steps; the medians over the repeats are printed as
 * tokens/s, one line per mode, plus the on/off ratio.  Each run uses a
 * fresh engine (and comm group) so both modes pay the same start-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "boot.h"
#include "conf.h"
#include "engine.h"
#include "sampling.h"

struct opts {
    const char *model, *moe;
    int ranks, batch, prompt, decode, repeat, threads;
};

static double s_now (void)
{
    struct timespec t;
    clock_gettime (CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

/* One rank's run; rank 0 writes "prefill_s decode_s" to fd. */
static int s_rank (const struct opts *o, int rank, int tbo, const char *group, int fd)
{
    struct rx_boot b;
    struct rx_err err = { 0 };
    char num[16];
    int rc = rx_boot_open (&b, NULL, 0, &err);
    if (rc != RX_OK) goto out0;
    snprintf (num, sizeof num, "%d", o->threads);
    rc = rx_conf_set (b.conf, "kernels", "threads", num, &err);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "scheduler", "two_batch_overlap", tbo ? "true" : "false", &err);
    if (rc == RX_OK) rc = rx_conf_set (b.conf, "moe", "dispatcher", o->moe, &err);
    snprintf (num, sizeof num, "%d", o->ranks);
    if (rc == RX_OK && o->ranks > 1) rc = rx_conf_set (b.conf, "parallel", "ep_size", num, &err);
    if (rc != RX_OK) goto out1;
    int32_t T = o->batch * o->prompt > o->batch ? o->batch * o->prompt : o->batch;
    struct rx_engine_opts eo = {
        .model_path = o->model, .n_slots = (uint64_t) o->batch * (uint64_t) (o->prompt + o->decode + 1),
        .max_tokens = T, .tp_rank = rank, .tp_size = o->ranks > 1 ? o->ranks : 0,
        .comm = o->ranks > 1 ? "shm" : NULL, .comm_group = group, .comm_timeout_s = 120,
        .dp_attention = o->ranks > 1,
    };
    rx_engine_t *e = rx_engine_new (&b, &eo, &err);
    if (!e) {
        rc = err.code ? err.code : RX_EINTERNAL;
        goto out1;
    }
    const int32_t V = rx_engine_info (e)->n_vocab, B = o->batch;
    int32_t *tok = malloc ((size_t) B * (size_t) o->prompt * sizeof *tok), *last = malloc ((size_t) B * sizeof *last);
    int *seq = malloc ((size_t) B * sizeof *seq);
    float *logits = malloc ((size_t) B * (size_t) V * sizeof *logits);
    struct rx_engine_req *rq = malloc ((size_t) B * sizeof *rq);
    uint64_t rng = 12345 + (uint64_t) rank;
    for (int32_t i = 0; i < B * o->prompt; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t) ((rng >> 33) % (uint64_t) V);
    }
    for (int32_t i = 0; i < B && rc == RX_OK; i++) {
        seq[i] = rx_engine_seq_new (e, o->prompt + o->decode + 1, &err);
        if (seq[i] < 0) rc = seq[i];
        rq[i] = (struct rx_engine_req) { seq[i], o->prompt, tok + (size_t) i * o->prompt, 0 };
    }
    double t0 = s_now (), t1 = t0, t2 = t0;
    if (rc == RX_OK) rc = rx_engine_step (e, rq, B, logits, &err);
    t1 = s_now ();
    for (int d = 0; d < o->decode && rc == RX_OK; d++) {
        for (int32_t i = 0; i < B; i++) {
            last[i] = rx_argmax (logits + (size_t) i * V, V);
            rq[i] = (struct rx_engine_req) { seq[i], 1, &last[i], 0 };
        }
        rc = rx_engine_step (e, rq, B, logits, &err);
    }
    t2 = s_now ();
    if (rank == 0 && rc == RX_OK) {
        char line[64];
        int n = snprintf (line, sizeof line, "%.9f %.9f\n", t1 - t0, t2 - t1);
        if (write (fd, line, (size_t) n) != n) rc = RX_EIO;
    }
    free (tok);
    free (last);
    free (seq);
    free (logits);
    free (rq);
    rx_engine_destroy (&e);
out1:
    rx_boot_close (&b);
out0:
    if (rc != RX_OK) fprintf (stderr, "tbo-bench rank %d: %s\n", rank, err.msg);
    return rc;
}

static int s_cmp (const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

int main (int argc, char **argv)
{
    struct opts o = { .moe = "ep_normal", .ranks = 2, .batch = 16, .prompt = 16, .decode = 32,
                      .repeat = 5, .threads = 1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') { o.model = a; continue; }
        if (!v) { fprintf (stderr, "tbo-bench: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp (a, "--moe")) o.moe = v;
        else if (!strcmp (a, "--ranks")) o.ranks = atoi (v);
        else if (!strcmp (a, "--batch")) o.batch = atoi (v);
        else if (!strcmp (a, "--prompt")) o.prompt = atoi (v);
        else if (!strcmp (a, "--decode")) o.decode = atoi (v);
        else if (!strcmp (a, "--repeat")) o.repeat = atoi (v);
        else if (!strcmp (a, "--threads")) o.threads = atoi (v);
        else { fprintf (stderr, "tbo-bench: unknown option %s\n", a); return 2; }
    }
    if (!o.model || o.ranks < 1 || o.ranks > 8 || o.batch < 1 || o.prompt < 1 || o.decode < 0
        || o.repeat < 1 || o.repeat > 100 || o.threads < 1) {
        fprintf (stderr, "usage: tbo-bench MODEL.gguf [--moe ep_normal] [--ranks 2] [--batch 16] [--prompt 16] [--decode 32] [--repeat 5] [--threads 1]\n");
        return 2;
    }
    double pre[2][100], dec[2][100];
    for (int r = 0; r < o.repeat; r++)
        for (int tbo = 0; tbo < 2; tbo++) {
            int pfd[2];
            if (pipe (pfd) != 0) return 1;
            char group[64];
            snprintf (group, sizeof group, "tbo-bench-%ld-%d-%d", (long) getpid (), r, tbo);
            pid_t pid[8];
            fflush (NULL);
            for (int k = 0; k < o.ranks; k++) {
                pid[k] = fork ();
                if (pid[k] == 0) {
                    close (pfd[0]);
                    _exit (s_rank (&o, k, tbo, group, pfd[1]) == RX_OK ? 0 : 1);
                }
            }
            close (pfd[1]);
            char buf[128] = { 0 };
            ssize_t n = read (pfd[0], buf, sizeof buf - 1);
            close (pfd[0]);
            int bad = n <= 0;
            for (int k = 0; k < o.ranks; k++) {
                int st;
                waitpid (pid[k], &st, 0);
                if (!WIFEXITED (st) || WEXITSTATUS (st) != 0) bad = 1;
            }
            if (bad || sscanf (buf, "%lf %lf", &pre[tbo][r], &dec[tbo][r]) != 2) {
                fprintf (stderr, "tbo-bench: run %d (TBO %s) failed\n", r, tbo ? "on" : "off");
                return 1;
            }
        }
    double med[2][2];
    for (int tbo = 0; tbo < 2; tbo++) {
        qsort (pre[tbo], (size_t) o.repeat, sizeof (double), s_cmp);
        qsort (dec[tbo], (size_t) o.repeat, sizeof (double), s_cmp);
        med[tbo][0] = pre[tbo][o.repeat / 2];
        med[tbo][1] = dec[tbo][o.repeat / 2];
    }
    printf ("model %s, %d ranks (ep_size %d, moe-%s), %d threads each; per rank: batch %d x prompt %d, %d decode steps; medians of %d\n",
            o.model, o.ranks, o.ranks, o.moe, o.threads, o.batch, o.prompt, o.decode, o.repeat);
    for (int tbo = 0; tbo < 2; tbo++)
        printf ("TBO %-3s  prefill %8.1f tok/s/rank (%.2f ms)   decode %8.1f tok/s/rank (%.2f ms/step)\n",
                tbo ? "on" : "off", (double) o.batch * o.prompt / med[tbo][0], med[tbo][0] * 1e3,
                o.decode ? (double) o.batch * o.decode / med[tbo][1] : 0.0,
                o.decode ? med[tbo][1] * 1e3 / o.decode : 0.0);
    printf ("on/off throughput: prefill %.3f, decode %.3f\n", med[0][0] / med[1][0],
            o.decode ? med[0][1] / med[1][1] : 0.0);
    return 0;
}
