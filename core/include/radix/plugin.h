/* radix/plugin.h -- the plugin descriptor: the one thing every radix plugin exports.
 *
 * ABI: stable since 1.0.  A plugin is a shared object that exports exactly one
 * function, rx_plugin_entry(), returning a pointer to a static const
 * struct rx_plugin_desc.  It is a function, not a data symbol, because dlsym
 * is only guaranteed to work for functions (PostgreSQL's PG_MODULE_MAGIC).
 *
 * Versioning (GStreamer's rule plus SQLite's append-only growth):
 *   - RX_ABI_MAJOR changes when anything is removed, reordered or retyped;
 *     the loader requires plugin major == radixd major.
 *   - RX_ABI_MINOR changes when something is appended (a struct member, a
 *     kind, a host function, a capability bit); the loader accepts
 *     plugin minor <= radixd minor.
 *   - Every growable struct (the descriptor, every kind's ops table, the host
 *     table) begins with uint32_t struct_size = sizeof as compiled, so the
 *     reader knows which members exist: see RX_HAS().
 *   - A growable struct is never put in an array (the stride would change);
 *     arrays hold pointers, or fixed-forever structs (rx_cfg_key).
 *
 * Thread-safety: descriptors are immutable.  Write a plugin with
 * RX_PLUGIN_DEFINE() below; docs/plugins.md is the guide for third parties. */
#ifndef RADIX_PLUGIN_H
#define RADIX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include <radix/err.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RX_ABI_MAJOR    1
#define RX_ABI_MINOR    4
#define RX_PLUGIN_MAGIC 0x58444152u           /* "RADX" in little-endian bytes */
#define RX_PLUGIN_ENTRY "rx_plugin_entry"     /* the exported symbol's name */

/* Build options both sides must agree on, compared key by key.
 * Format: "key=value;key=value". */
#define RX_BUILD_TAG_PTR_(n) #n
#define RX_BUILD_TAG_PTR(n)  RX_BUILD_TAG_PTR_(n)
#define RX_BUILD_TAG "ptr=" RX_BUILD_TAG_PTR(__SIZEOF_POINTER__) ";tokid=int32;endian=" \
    RX_BUILD_TAG_ENDIAN
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#  define RX_BUILD_TAG_ENDIAN "big"
#else
#  define RX_BUILD_TAG_ENDIAN "little"
#endif

/* Plugin kinds.  Values are ABI: never renumber, append only.  Each kind's
 * ops table is defined in its own header (kernel.h, attn.h, policy.h, ...). */
enum rx_kind {
    RX_KIND_KERNELS      = 1,   /* compute-kernel backend  (file prefix "kernels-") */
    RX_KIND_ATTENTION    = 2,   /* attention backend       ("attn-")    */
    RX_KIND_LAYOUT       = 3,   /* parallel layout         ("layout-")  */
    RX_KIND_MOE          = 4,   /* MoE dispatcher          ("moe-")     */
    RX_KIND_COMM         = 5,   /* collective communication ("comm-")   */
    RX_KIND_EPLB         = 6,   /* expert placement        ("eplb-")    */
    RX_KIND_SCHED_POLICY = 7,   /* scheduling policy       ("sched-")   */
    RX_KIND_ROUTE_POLICY = 8,   /* routing policy          ("route-")   */
    RX_KIND_MODEL        = 9,   /* model architecture      ("model-")   */
    RX_KIND_COUNT_       = 10   /* not a kind: one past the last (grows) */
};

/* Types of INI values a component declares (fixed values, append only). */
enum rx_cfg_type {
    RX_CFG_STRING   = 1,  /* any text */
    RX_CFG_INT      = 2,  /* decimal integer, e.g. -3, 42 */
    RX_CFG_FLOAT    = 3,  /* real number, e.g. 0.5, 1e-3 */
    RX_CFG_BOOL     = 4,  /* true/false, yes/no, on/off, 1/0 */
    RX_CFG_SIZE     = 5,  /* bytes: 512, 64K, 16MiB, 2GiB, 1.5G (binary units) */
    RX_CFG_DURATION = 6,  /* seconds: 30, 30s, 250ms, 2m, 1h */
    RX_CFG_ENUM     = 7,  /* one of choices ("a|b|c") */
    RX_CFG_PATH     = 8   /* a file-system path (not opened by the parser) */
};

/* One INI key a component accepts.  Fixed forever (it lives in arrays): new
 * per-key information goes into a new, separate table, never here.
 * A table ends with an entry whose name is NULL. */
struct rx_cfg_key {
    const char *name;     /* key, [a-z0-9_]+ */
    int         type;     /* enum rx_cfg_type */
    const char *def;      /* default as INI text; NULL: no default (unset) */
    const char *help;     /* one line for --help-plugin and docs */
    double      min;      /* range for INT/FLOAT/SIZE/DURATION; */
    double      max;      /*   checked only when min < max */
    const char *choices;  /* RX_CFG_ENUM: "a|b|c"; else NULL */
};

struct rx_host;

/* The descriptor.  The first four members are the frozen header, identical in
 * every ABI, and read before anything else. */
struct rx_plugin_desc {
    uint32_t magic;         /* RX_PLUGIN_MAGIC */
    uint16_t abi_major;     /* RX_ABI_MAJOR of the headers the plugin was built with */
    uint16_t abi_minor;     /* RX_ABI_MINOR of the same */
    uint32_t struct_size;   /* sizeof (struct rx_plugin_desc) as compiled */
    uint32_t kind;          /* enum rx_kind */
    /* ---- ABI 1.0 ---- */
    const char *name;        /* (required) component name, [a-z0-9_]+, e.g. "cpu", "fcfs" */
    const char *version;     /* (required) the plugin's own version, e.g. "0.3.1" */
    const char *description; /* (required) one line */
    const char *build_tag;   /* RX_BUILD_TAG as compiled; checked key by key */
    const struct rx_cfg_key *keys; /* (optional) keys of its INI section [<kind>.<name>] */
    const void *ops;         /* (required) the kind's ops table; begins with uint32_t struct_size */
    /* (optional) once per process after a successful load, before any ops call;
     * *state is handed back to fini.  If NULL the core skips it. */
    int  (*init) (const struct rx_host *host, void **state, struct rx_err *err);
    /* (optional) at shutdown, after every instance is destroyed. */
    void (*fini) (void *state);
    /* ---- ABI 1.0 ends here.  Append only below; never reorder or retype. ---- */
};

/* The size of the 1.0 descriptor: the loader refuses anything shorter. */
#define RX_PLUGIN_DESC_SIZE_1_0 \
    (offsetof (struct rx_plugin_desc, fini) + sizeof (void (*) (void *)))

/* Every ops table begins with this member. */
struct rx_ops_head {
    uint32_t struct_size;
};

/* Is member m present in the plugin's (possibly older, shorter) layout of
 * struct `type` and set?  For function-pointer members of ops tables. */
#define RX_HAS(type, p, m) \
    ((p)->struct_size >= offsetof (type, m) + sizeof ((p)->m) && (p)->m != NULL)

#if defined(__GNUC__)
#  define RX_EXPORT __attribute__ ((visibility ("default")))
#else
#  define RX_EXPORT
#endif

/* RX_PLUGIN_DEFINE(.kind = ..., .name = ..., ...) emits rx_plugin_entry()
 * and fills in magic, ABI version, struct_size and build tag; the plugin
 * supplies the rest as designated initializers:
 *
 *     RX_PLUGIN_DEFINE (.kind = RX_KIND_SCHED_POLICY, .name = "fcfs",
 *                       .version = "1.0", .description = "first come, first served",
 *                       .ops = &s_ops)
 */
#define RX_PLUGIN_DEFINE(...)                                                   \
    RX_EXPORT const struct rx_plugin_desc *rx_plugin_entry (void);              \
    const struct rx_plugin_desc *rx_plugin_entry (void)                         \
    {                                                                           \
        static const struct rx_plugin_desc s_rx_desc = {                        \
            .magic = RX_PLUGIN_MAGIC, .abi_major = RX_ABI_MAJOR,                \
            .abi_minor = RX_ABI_MINOR, .struct_size = sizeof (struct rx_plugin_desc), \
            .build_tag = RX_BUILD_TAG, __VA_ARGS__ };                           \
        return &s_rx_desc;                                                      \
    }

typedef const struct rx_plugin_desc *(*rx_plugin_entry_fn) (void);

#ifdef __cplusplus
}
#endif
#endif /* RADIX_PLUGIN_H */
