/* plugins/comm/blocking.h -- the blocking collectives of a comm plugin
 * (radix/comm.h) written once: each packs its arguments into a struct
 * rx_comm_op and hands it to the plugin's GO (void *comm, struct rx_comm_op
 * *op, struct rx_err *err), the function that runs one op (and that
 * start() uses too), so the blocking and started forms cannot drift apart.
 * Header-only: plugins link no shared code.
 *
 *   RX_COMM_BLOCKING_OPS (GO)      defines s_all_reduce_b, s_all_gather_b,
 *                                  s_reduce_scatter_b, s_all_to_all_v_b,
 *                                  s_broadcast_b
 *   RX_COMM_BLOCKING_BARRIER (GO)  defines s_barrier_b (a plugin whose
 *                                  barrier must also wait for its stream
 *                                  writes its own) */
#ifndef RX_COMM_BLOCKING_H
#define RX_COMM_BLOCKING_H

#include <radix/comm.h>

#define RX_COMM_BLOCKING_OPS(GO)                                                                   \
    static int s_all_reduce_b (void *comm, rx_kstream_t *s, const void *send, void *recv,          \
                               size_t count, int dtype, int red, struct rx_err *err)               \
    {                                                                                              \
        struct rx_comm_op op = { .struct_size = sizeof op, .kind = RX_COMM_ALL_REDUCE,             \
                                 .dtype = dtype, .red = red, .send = send, .recv = recv,           \
                                 .count = count, .stream = s };                                    \
        return GO (comm, &op, err);                                                                \
    }                                                                                              \
    static int s_all_gather_b (void *comm, rx_kstream_t *s, const void *send, void *recv,          \
                               size_t count, int dtype, struct rx_err *err)                        \
    {                                                                                              \
        struct rx_comm_op op = { .struct_size = sizeof op, .kind = RX_COMM_ALL_GATHER,             \
                                 .dtype = dtype, .send = send, .recv = recv, .count = count,       \
                                 .stream = s };                                                    \
        return GO (comm, &op, err);                                                                \
    }                                                                                              \
    static int s_reduce_scatter_b (void *comm, rx_kstream_t *s, const void *send, void *recv,      \
                                   size_t count, int dtype, int red, struct rx_err *err)           \
    {                                                                                              \
        struct rx_comm_op op = { .struct_size = sizeof op, .kind = RX_COMM_REDUCE_SCATTER,         \
                                 .dtype = dtype, .red = red, .send = send, .recv = recv,           \
                                 .count = count, .stream = s };                                    \
        return GO (comm, &op, err);                                                                \
    }                                                                                              \
    static int s_all_to_all_v_b (void *comm, rx_kstream_t *s, const void *send,                    \
                                 const size_t *send_counts, const size_t *send_displs, void *recv, \
                                 const size_t *recv_counts, const size_t *recv_displs, int dtype,  \
                                 struct rx_err *err)                                               \
    {                                                                                              \
        struct rx_comm_op op = { .struct_size = sizeof op, .kind = RX_COMM_ALL_TO_ALL_V,           \
                                 .dtype = dtype, .send = send, .recv = recv,                       \
                                 .send_counts = send_counts, .send_displs = send_displs,           \
                                 .recv_counts = recv_counts, .recv_displs = recv_displs,           \
                                 .stream = s };                                                    \
        return GO (comm, &op, err);                                                                \
    }                                                                                              \
    static int s_broadcast_b (void *comm, rx_kstream_t *s, void *buf, size_t count, int dtype,     \
                              int root, struct rx_err *err)                                        \
    {                                                                                              \
        struct rx_comm_op op = { .struct_size = sizeof op, .kind = RX_COMM_BROADCAST,              \
                                 .dtype = dtype, .root = root, .send = buf, .recv = buf,           \
                                 .count = count, .stream = s };                                    \
        return GO (comm, &op, err);                                                                \
    }

#define RX_COMM_BLOCKING_BARRIER(GO)                                                               \
    static int s_barrier_b (void *comm, rx_kstream_t *s, struct rx_err *err)                       \
    {                                                                                              \
        struct rx_comm_op op = { .struct_size = sizeof op, .kind = RX_COMM_BARRIER, .stream = s }; \
        return GO (comm, &op, err);                                                                \
    }

#endif
