/* core/settings.c -- see settings.h.  Keep conf/radixd.ini in step. */
#include "config.h"

#include "settings.h"

const struct rx_cfg_key rx_settings_log_keys[] = {
    { "level", RX_CFG_ENUM, "info", "least severe level written", 0, 0,
      "error|warn|info|debug|trace" },
    { "file", RX_CFG_PATH, "-", "append log lines to this file; - is stderr", 0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

const struct rx_cfg_key rx_settings_plugins_keys[] = {
    { "path", RX_CFG_STRING, NULL,
      "colon-separated plugin directories searched before $RADIX_PLUGIN_PATH and the install dir",
      0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_kernels[] = {
    { "backend", RX_CFG_STRING, "cpu", "kernel backend plugin (kernels-<backend>.so): cpu, cuda",
      0, 0, NULL },
    { "threads", RX_CFG_INT, "0", "compute threads for the CPU backend; 0 = one per core",
      0, 4096, NULL },
    { "device", RX_CFG_STRING, "auto",
      "device index (GPU ordinal) of every scheduler rank, or auto: the rank's index on this "
      "host (dp_rank * tp_size + tp_rank) modulo the device count", 0, 0, NULL },
    { "ops_abi", RX_CFG_ENUM, "current",
      "test only: 1.0 hands the model and its plugins the backend's ops as an ABI 1.0 backend "
      "would have them (appended ops hidden), to run the fallbacks kept for such backends",
      0, 0, "current|1.0" },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_model[] = {
    { "path", RX_CFG_PATH, NULL, "the model's GGUF file (radix generate --model overrides it)",
      0, 0, NULL },
    { "plugin", RX_CFG_STRING, "auto",
      "model plugin (model-<plugin>.so); auto = the one whose architectures list has the file's general.architecture",
      0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_attention[] = {
    { "backend", RX_CFG_STRING, "auto",
      "attention plugin (attn-<backend>.so): mha, mla; auto = what the model plugin asks for (mha for dense models)",
      0, 0, NULL },
    { "kv_dtype", RX_CFG_ENUM, "f32", "element type of the KV cache (f16 needs kernel support)", 0, 0,
      "f32|f16" },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_cache[] = {
    { "kv_memory", RX_CFG_STRING, "0.8",
      "KV cache memory: a size (8GiB, 512M) or a fraction of free memory (0.8, 80%)", 0, 0, NULL },
    { "radix_cache", RX_CFG_BOOL, "true",
      "share prompt prefixes between requests through the radix cache", 0, 0, NULL },
    { "page_size", RX_CFG_INT, "1", "KV slots are handed out and cached in pages of this many tokens",
      1, 4096, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_scheduler[] = {
    { "policy", RX_CFG_STRING, "fcfs",
      "schedule policy plugin (sched-<policy>.so): fcfs, lpm, dfs_weight, random", 0, 0, NULL },
    { "max_running_requests", RX_CFG_INT, "0",
      "most requests in the running batch; 0 = half the KV slots, at most 1024", 0, 1 << 20, NULL },
    { "max_queued_requests", RX_CFG_INT, "0",
      "most waiting requests; more are refused (HTTP 503 + Retry-After); 0 = no limit", 0, 1 << 30,
      NULL },
    { "chunked_prefill_size", RX_CFG_INT, "8192",
      "most prompt tokens of one request per prefill step; -1 = no chunking (the engine's step size still applies)",
      -1, 1 << 30, NULL },
    { "max_prefill_tokens", RX_CFG_INT, "16384", "most prompt tokens in one prefill batch",
      1, 1 << 30, NULL },
    { "arrival_wait", RX_CFG_DURATION, "5ms",
      "an idle scheduler that receives a request waits this long for more before its first prefill, so a burst is prefilled as one batch; 0 = start at once",
      0, 1, NULL },
    { "schedule_conservativeness", RX_CFG_FLOAT, "1.0",
      "scales the initial new-token ratio: higher admits fewer requests (fewer retractions)",
      0.01, 100, NULL },
    { "init_new_token_ratio", RX_CFG_FLOAT, "0.7",
      "share of max_tokens a running request is assumed to still need (times conservativeness)",
      0, 1, NULL },
    { "min_new_token_ratio_factor", RX_CFG_FLOAT, "0.14",
      "the ratio decays to init_new_token_ratio times this", 0, 1, NULL },
    { "new_token_ratio_decay_steps", RX_CFG_INT, "600",
      "decode steps over which the ratio decays from its initial to its minimum value", 1, 1 << 30,
      NULL },
    { "two_batch_overlap", RX_CFG_BOOL, "false",
      "split each batch of an MoE model into two micro-batches and overlap one's computation with the other's expert dispatch/combine (same outputs; docs/parallel.md)",
      0, 0, NULL },
    { "cuda_graph_max_bs", RX_CFG_INT, "0",
      "decode steps of up to this many sequences replay a CUDA graph captured per batch size (kernel backends that capture, e.g. cuda; 0 = off; docs/gpu.md)",
      0, 4096, NULL },
    { "sampling_threads", RX_CFG_INT, "0",
      "threads that sample a step's rows on the host (temperature, top_p, penalties), each request's token the same whatever the count; 0 = auto: 1 on up to 4 CPUs, else a quarter of them, at most 8",
      0, 64, NULL },
    { "device_sampling", RX_CFG_ENUM, "auto",
      "sampled rows (no penalties, logprobs or min_tokens ban) draw from the device's sampling_candidates most likely tokens instead of copying the whole row to the host (the same distribution, not the same draws as the host path); auto = on for device backends (cuda), off for cpu",
      0, 0, "auto|on|off" },
    { "sampling_candidates", RX_CFG_INT, "64",
      "tokens per row device sampling copies back; a row whose top_p/min_p cut or draw falls past them is fetched whole and sampled on the host",
      1, 4096, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_server[] = {
    { "host", RX_CFG_STRING, "127.0.0.1",
      "address the HTTP server binds (0.0.0.0 or :: to listen on every interface)", 0, 0, NULL },
    { "port", RX_CFG_INT, "30000", "HTTP port; 0 = any free port (the ready line names it)",
      0, 65535, NULL },
    { "api_key", RX_CFG_STRING, NULL,
      "when set, every request except /health needs \"Authorization: Bearer <key>\"", 0, 0, NULL },
    { "served_model_name", RX_CFG_STRING, NULL,
      "the model name clients use; unset = the GGUF file name without .gguf", 0, 0, NULL },
    { "admin_api_key", RX_CFG_STRING, NULL,
      "when set, admin endpoints (/flush_cache, expert recording) need \"Authorization: Bearer <admin key>\" (the API key alone gets 403); the admin key also works wherever the API key does",
      0, 0, NULL },
    { "max_body_size", RX_CFG_SIZE, "8MiB", "largest request body; larger ones get HTTP 413",
      1024, (double) (1ull << 30), NULL },
    { "max_header_size", RX_CFG_SIZE, "64KiB",
      "largest request line + headers; larger ones get HTTP 431 (beyond twice this, the connection is closed)",
      1024, (double) (16ull << 20), NULL },
    { "cors_allow_origins", RX_CFG_STRING, NULL,
      "comma-separated origins allowed by CORS (or *); unset = no CORS headers", 0, 0, NULL },
    { "default_max_tokens", RX_CFG_INT, "0",
      "max_tokens of a request that names none; 0 = the room left in the context", 0, 1 << 30, NULL },
    { "max_tokens_cap", RX_CFG_INT, "0", "upper bound for any max_tokens; 0 = none", 0, 1 << 30,
      NULL },
    { "truncate_prompts", RX_CFG_BOOL, "false",
      "keep the last context-1 tokens of an over-long prompt instead of answering 400", 0, 0, NULL },
    { "chat_template", RX_CFG_STRING, "auto",
      "chat template family: auto (from the GGUF), chatml, llama2, llama3, mistral, deepseek2, deepseek3, zephyr",
      0, 0, NULL },
    { "watchdog_timeout", RX_CFG_DURATION, "300",
      "a scheduler without progress for this long is declared hung: the daemon exits non-zero",
      1, 86400, NULL },
    { "shutdown_timeout", RX_CFG_DURATION, "30",
      "on SIGTERM, in-flight requests get this long to finish before they are aborted", 0, 86400,
      NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_parallel[] = {
    { "tp_size", RX_CFG_INT, "1",
      "tensor-parallel ranks per replica: one scheduler process each, the model's heads and FFN split across them",
      1, 256, NULL },
    { "dp_size", RX_CFG_INT, "1",
      "data-parallel replicas; more than 1 starts a DP controller that dispatches requests ([dp] policy)",
      1, 256, NULL },
    { "comm", RX_CFG_STRING, "shm",
      "comm plugin (comm-<comm>.so) for tensors between ranks: shm (CPU, one host), zmq (CPU, across hosts), nccl (GPU)",
      0, 0, NULL },
    { "comm_timeout", RX_CFG_DURATION, "60",
      "a collective or control message that does not complete within this is fatal: the daemon exits with the reason",
      0.1, 86400, NULL },
    { "dp_attention", RX_CFG_BOOL, "false",
      "DP attention: tp_size = dp_size = N ranks, each with its own requests and KV; the FFN is split over them and their rows gathered around it",
      0, 0, NULL },
    { "ep_size", RX_CFG_INT, "1",
      "expert-parallel size of an MoE model's dispatcher ([moe] dispatcher): 1, or tp_size with dp_attention (experts sharded over the ranks)",
      1, 256, NULL },
    { "check_determinism", RX_CFG_BOOL, "false",
      "debug: every step, the ranks of a TP group compare a hash of their batch; the first mismatch stops the daemon",
      0, 0, NULL },
    { "nnodes", RX_CFG_INT, "1", "machines serving this model together (see docs/multi-node.md)",
      1, 256, NULL },
    { "node_rank", RX_CFG_INT, "0",
      "this machine's index, 0 .. nnodes-1; node 0 serves HTTP, the others run their share of the ranks",
      0, 255, NULL },
    { "dist_init_addr", RX_CFG_STRING, NULL,
      "host:port of node 0 that every node reaches (control plane over tcp, ports port..port+2); needed when nnodes > 1",
      0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_dp[] = {
    { "policy", RX_CFG_STRING, "round_robin",
      "route policy plugin (route-<policy>.so) the DP controller dispatches with: round_robin, shortest_queue, cache_aware, ...",
      0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_moe[] = {
    { "dispatcher", RX_CFG_STRING, "local",
      "MoE dispatcher plugin (moe-<dispatcher>.so) that moves mixture-of-experts rows between the router and the experts: local (one rank, no communication)",
      0, 0, NULL },
    { "max_tokens_per_rank", RX_CFG_INT, "0",
      "most tokens one dispatch carries (sizes the dispatcher's buffers; larger steps are dispatched in chunks); 0 = the engine's step size",
      0, 1 << 24, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

/* EPLB at run time (docs/eplb.md "At run time", core/expert_record.h). */
static const struct rx_cfg_key s_eplb[] = {
    { "algorithm", RX_CFG_STRING, "deepseek",
      "EPLB algorithm plugin (eplb-<algorithm>.so) that computes placements from loads: deepseek, greedy",
      0, 0, NULL },
    { "num_redundant_experts", RX_CFG_INT, "0",
      "extra expert slots per MoE layer (copies of hot experts) when a placement is computed from a load file",
      0, 1 << 16, NULL },
    { "init_expert_location", RX_CFG_PATH, NULL,
      "placement applied at load: a placement file (phy2log, from radix eplb) or a load / dump file (the algorithm runs on it)",
      0, 0, NULL },
    { "rebalance_interval", RX_CFG_INT, "0",
      "recompute the placement from the recorded window every this many steps (every rank at the same step); 0 = off",
      0, 1 << 30, NULL },
    { "min_rebalance_balancedness", RX_CFG_FLOAT, "0.9",
      "skip a rebalance while the current placement's mean balancedness over the MoE layers (mean / max GPU load, 1 = perfect) is at least this: 0 = always skip, 1 = rebalance unless perfect",
      0, 1, NULL },
    { "record_window", RX_CFG_INT, "1000",
      "expert-distribution recording keeps the counts of the last this many steps (memory: steps x MoE layers x experts x 4 bytes)",
      1, 1 << 20, NULL },
    { "record_dir", RX_CFG_PATH, "/tmp/radix-eplb",
      "directory POST /dump_expert_distribution_record writes its JSON files into (created 0700 if absent)",
      0, 0, NULL },
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_cfg_key s_none[] = {
    { NULL, 0, NULL, NULL, 0, 0, NULL }
};

static const struct rx_conf_section s_schema[] = {
    { "server", "the HTTP server of radixd", s_server, 0 },
    { "log", "logging", rx_settings_log_keys, 0 },
    { "plugins", "where plugins are found", rx_settings_plugins_keys, 0 },
    { "kernels", "compute kernels; [kernels.<backend>] configures one backend", s_kernels,
      RX_KIND_KERNELS },
    { "model", "the model; [model.<plugin>] configures one model plugin", s_model, RX_KIND_MODEL },
    { "attention", "attention backend and KV cache; [attention.<backend>] configures one backend",
      s_attention, RX_KIND_ATTENTION },
    { "cache", "KV memory and the radix prefix cache", s_cache, 0 },
    { "scheduler", "request scheduling; [scheduler.<policy>] configures one policy", s_scheduler,
      RX_KIND_SCHED_POLICY },
    { "parallel", "ranks: tensor and data parallelism, the comm plugin, several machines", s_parallel, 0 },
    { "comm", "[comm.<plugin>] configures one comm plugin (e.g. [comm.shm] buffer_size)", s_none,
      RX_KIND_COMM },
    { "dp", "the DP controller (dp_size > 1)", s_dp, 0 },
    { "moe", "MoE dispatcher; [moe.<name>] configures one", s_moe, RX_KIND_MOE },
    { "eplb", "expert placement at run time: recording, static and dynamic rebalance; [eplb.<algorithm>] configures one algorithm",
      s_eplb, RX_KIND_EPLB },
    { "router", "[router.<policy>] configures the DP controller's route policy (e.g. [router.cache_aware])",
      s_none, RX_KIND_ROUTE_POLICY },
    { NULL, NULL, NULL, 0 }
};

static const struct rx_plugin_ref s_refs[] = {
    { "kernels", "backend", RX_KIND_KERNELS },
    { "scheduler", "policy", RX_KIND_SCHED_POLICY },
    { "parallel", "comm", RX_KIND_COMM },
    { "dp", "policy", RX_KIND_ROUTE_POLICY },
    { "moe", "dispatcher", RX_KIND_MOE },
    { NULL, NULL, 0 }
};

const struct rx_conf_section *rx_settings_schema (void) { return s_schema; }
const struct rx_plugin_ref *rx_settings_plugin_refs (void) { return s_refs; }
