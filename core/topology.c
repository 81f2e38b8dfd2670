/* core/topology.c -- see topology.h. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_proc.h"
#include "topology.h"

static int s_bad (const rx_conf_t *conf, const char *key, struct rx_err *err, const char *why)
{
    int line = 0;
    rx_conf_raw (conf, "parallel", key, &line);
    if (line > 0)
        return rx_err_set (err, RX_ECONFIG, "%s:%d [parallel] %s: %s", rx_conf_name (conf), line, key, why);
    return rx_err_set (err, RX_ECONFIG, "%s [parallel] %s: %s", rx_conf_name (conf), key, why);
}

int rx_topo_from_conf (const rx_conf_t *conf, struct rx_topo *t, struct rx_err *err)
{
    memset (t, 0, sizeof *t);
    t->tp_size = (int) rx_conf_int (conf, "parallel", "tp_size", 1);
    t->dp_size = (int) rx_conf_int (conf, "parallel", "dp_size", 1);
    t->nnodes = (int) rx_conf_int (conf, "parallel", "nnodes", 1);
    t->node_rank = (int) rx_conf_int (conf, "parallel", "node_rank", 0);
    t->comm = rx_conf_str (conf, "parallel", "comm", "shm");
    t->comm_timeout_s = rx_conf_float (conf, "parallel", "comm_timeout", 60);
    t->check_determinism = rx_conf_bool (conf, "parallel", "check_determinism", 0);
    t->dp_attention = rx_conf_bool (conf, "parallel", "dp_attention", 0);
    if (t->tp_size < 1 || t->dp_size < 1 || t->nnodes < 1)
        return s_bad (conf, "tp_size", err, "sizes must be at least 1");
    t->world = t->tp_size * t->dp_size;
    if (t->dp_attention) {
        if (t->tp_size != t->dp_size || t->tp_size < 2) {
            char why[160];
            snprintf (why, sizeof why, "needs tp_size = dp_size = the number of ranks (2 or more); "
                      "tp_size is %d, dp_size %d", t->tp_size, t->dp_size);
            return s_bad (conf, "dp_attention", err, why);
        }
        t->world = t->tp_size;
    }
    int64_t ep = rx_conf_int (conf, "parallel", "ep_size", 1);
    if (ep != 1 && !(t->dp_attention && ep == t->tp_size)) {
        char why[160];
        snprintf (why, sizeof why, "%lld: must be 1, or equal to tp_size (%d) with dp_attention on%s",
                  (long long) ep, t->tp_size, t->dp_attention ? "" : " (it is off)");
        return s_bad (conf, "ep_size", err, why);
    }
    if (t->node_rank >= t->nnodes) {
        char why[96];
        snprintf (why, sizeof why, "%d is not below nnodes = %d", t->node_rank, t->nnodes);
        return s_bad (conf, "node_rank", err, why);
    }
    if (t->nnodes > 1) {
        if (t->dp_size > 1)
            return s_bad (conf, "nnodes", err,
                          "several machines serve one TP group: dp_size must be 1 (run one radixd per replica behind radix-router instead)");
        if (t->tp_size % t->nnodes) {
            char why[96];
            snprintf (why, sizeof why, "tp_size = %d cannot be split evenly over %d machines", t->tp_size, t->nnodes);
            return s_bad (conf, "nnodes", err, why);
        }
        if (t->comm && !strcmp (t->comm, "shm"))
            return s_bad (conf, "comm", err,
                          "shm works on one machine only: use zmq (CPU) or nccl (GPU) with nnodes > 1");
        const char *a = rx_conf_str (conf, "parallel", "dist_init_addr", NULL);
        if (!a || !*a) return s_bad (conf, "dist_init_addr", err, "must be host:port when nnodes > 1");
        const char *colon = strrchr (a, ':');
        char *end = NULL;
        long port = colon ? strtol (colon + 1, &end, 10) : 0;
        size_t hl = colon ? (size_t) (colon - a) : 0;
        if (!colon || hl == 0 || hl >= sizeof t->dist_host || !end || *end || port < 1 || port > 65533)
            return s_bad (conf, "dist_init_addr", err,
                          "expected host:port with a port of 1..65533 (port and port+1 are used)");
        snprintf (t->dist_host, sizeof t->dist_host, "%.*s", (int) hl, a);   /* "[::1]" stays bracketed, as ZMQ wants */
        t->dist_port = (int) port;
    }
    t->n_local = t->world / t->nnodes;
    t->first = t->node_rank * t->n_local;
    return RX_OK;
}

/* DP attention: rank g is replica g (a TP group of one) for the DP
 * controller, and rank g of the attention group. */
static void s_attn_rank (const struct rx_topo *t, int g, const char *run_dir, struct rx_topo_rank *r)
{
    struct rx_sched_proc_opts *o = &r->o;
    o->run_dir = run_dir;
    o->stats_interval_ms = 1000;
    o->tp_rank = 0;
    o->tp_size = 1;
    o->dp_rank = g;
    o->dp_size = t->world;
    o->comm_timeout_s = t->comm_timeout_s;
    o->dp_attention = 1;
    o->attn_rank = g;
    o->attn_size = t->world;
    snprintf (r->role, sizeof r->role, "sched.dp%d", g);
    rx_dp_sched_sock (g, r->in_sock, sizeof r->in_sock);
    o->in_sock = r->in_sock;
    o->up_sock = RX_SOCK_DPC;
    if (g > 0) {
        snprintf (r->hb, sizeof r->hb, "%s.%d", RX_HB_SCHED, g);
        o->hb_name = r->hb;
    }
    const char *base = strrchr (run_dir, '/');
    base = base ? base + 1 : run_dir;
    snprintf (r->ctl, sizeof r->ctl, "ipc://%s/ctl.attn", run_dir);
    snprintf (r->comm_boot, sizeof r->comm_boot, "ipc://%s/comm.attn", run_dir);
    snprintf (r->comm_group, sizeof r->comm_group, "%.60s.attn", base);
    o->ctl_endpoint = r->ctl;
    o->comm_bootstrap = r->comm_boot;
    o->comm_group = r->comm_group;
}

void rx_topo_rank (const struct rx_topo *t, int g, const char *run_dir, struct rx_topo_rank *r)
{
    memset (r, 0, sizeof *r);
    if (t->dp_attention) {
        s_attn_rank (t, g, run_dir, r);
        return;
    }
    int d = g / t->tp_size, k = g % t->tp_size;
    struct rx_sched_proc_opts *o = &r->o;
    o->run_dir = run_dir;
    o->stats_interval_ms = 1000;
    o->tp_rank = k;
    o->tp_size = t->tp_size;
    o->dp_rank = d;
    o->dp_size = t->dp_size;
    o->comm_timeout_s = t->comm_timeout_s;
    o->check_determinism = t->check_determinism;
    if (t->world == 1) snprintf (r->role, sizeof r->role, "sched");
    else if (t->dp_size == 1) snprintf (r->role, sizeof r->role, "sched.tp%d", k);
    else if (t->tp_size == 1) snprintf (r->role, sizeof r->role, "sched.dp%d", d);
    else snprintf (r->role, sizeof r->role, "sched.dp%d.tp%d", d, k);
    if (t->dp_size > 1) {
        rx_dp_sched_sock (d, r->in_sock, sizeof r->in_sock);
        o->in_sock = r->in_sock;
        o->up_sock = RX_SOCK_DPC;
    }
    if (d > 0) {
        snprintf (r->hb, sizeof r->hb, "%s.%d", RX_HB_SCHED, d);
        o->hb_name = r->hb;
    }
    if (t->tp_size == 1) return;
    const char *base = strrchr (run_dir, '/');
    base = base ? base + 1 : run_dir;
    if (t->nnodes > 1) {
        snprintf (r->ctl, sizeof r->ctl, "tcp://%s:%d", t->dist_host, t->dist_port);
        snprintf (r->comm_boot, sizeof r->comm_boot, "tcp://%s:%d", t->dist_host, t->dist_port + 1);
        snprintf (r->comm_group, sizeof r->comm_group, "radixd-%d.tp%d", t->dist_port, d);
    } else {
        snprintf (r->ctl, sizeof r->ctl, "ipc://%s/ctl.%d", run_dir, d);
        snprintf (r->comm_boot, sizeof r->comm_boot, "ipc://%s/comm.%d", run_dir, d);
        snprintf (r->comm_group, sizeof r->comm_group, "%.60s.tp%d", base, d);
    }
    o->ctl_endpoint = r->ctl;
    o->comm_bootstrap = r->comm_boot;
    o->comm_group = r->comm_group;
}
