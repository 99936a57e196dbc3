// The serving configuration: one YAML file (configs/*.yaml, every field in docs/config.md) parsed
// once into plain Options structs with documented defaults. Components never see YAML: the
// daemon's main turns these structs into each component's own options.
//
// Parsing is strict: an unknown key is INVALID_ARGUMENT naming its full path
// ("scheduler.token_budget"), and so is a value of the wrong type or out of range (Validate()).
// Every field is optional; a missing field keeps its default. Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pd {

struct ModelConfigOptions {
  std::string path;             // GGUF file; "" = the default model (`pdctl models`)
  std::string id;               // name clients pass as `model`; "" = the file name without .gguf
  std::string chat_template;    // gemma | chatml | llama3 | llama2; "" = detected from the file
  int context = 0;              // prompt + max_tokens accepted; 0 = min(training context, 4096)
  std::string backend = "cpu";  // cpu | cuda
  // backend: cuda only: the layers on the GPU, the rest on the CPU (docs/offload.md): "all"
  // (every layer; the default), a count N (the last N layers), or "auto" (as many as the GPU's
  // free memory holds, by the offload planner).
  std::string gpu_layers = "all";
  // "" = serve the weights as stored; a quantized type (q4_K, q8_0, ...): F32/F16/BF16 weights
  // (a GGUF or a Hugging Face folder) are quantized to it at load, in memory.
  std::string quantize;
};

struct ListenOptions {
  bool enabled = true;
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = pick a free port (printed when ready)
};

// The public HTTP server's defences against slow, idle and numerous clients
// (frontend::HttpServerOptions, docs/security.md).
struct HttpLimitsOptions {
  int max_connections = 4096;             // open at once; lowered to what `ulimit -n` allows
  int max_connections_per_address = 512;  // per client IP; 0 = no cap
  int header_timeout_ms = 10000;  // TLS handshake + first request header
  int body_timeout_ms = 30000;    // a body, from the end of its header
  int idle_timeout_ms = 60000;    // keep-alive connection between requests
  int write_timeout_ms = 10000;   // one write; past it the client counts as gone (request cancelled)
  int threads = 4;                // workers: JSON parsing, chat template, tokenization
  int io_threads = 1;             // event-loop threads
};

// TLS of the public gRPC and HTTP APIs (both or neither file): PEM certificate chain and key.
struct TlsOptions {
  std::string cert_file;
  std::string key_file;
};

// Mutual TLS between the cluster's daemons (docs/security.md): every node's gRPC server requires a
// client certificate signed by `ca_file`, and every daemon shows its own (cert_file, key_file) when
// it calls another. All three or none; none = plaintext. `server_name`: the name the nodes'
// certificates carry, checked instead of the host of their address ("" = the address's host).
struct ClusterTlsOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name;
};

// Refusal before tokenization (frontend/admission.h): pd-serve and pd-router.
struct AdmissionConfigOptions {
  int max_waiting = 256;  // requests waiting for their first token; beyond: 429; 0 = no cap
  int ttft_slo_ms = 0;    // > 0: refuse when the measured queue says a new request would wait longer
  double slo_headroom = 0.9;  // ... than this fraction of the SLO (after calibration)
};

struct SchedulerConfigOptions {
  int max_running_seqs = 32;     // sequences holding KV at once
  int max_waiting = 256;         // accepted requests not running; beyond: RESOURCE_EXHAUSTED
  int64_t max_total_tokens = 0;  // sum of prompt + max_tokens over live requests; 0 = no limit
  int token_budget = 512;        // tokens per engine step (decode tokens + prefill chunks)
  bool chunked_prefill = true;   // cut prompts into chunks mixed with decode steps
  int prefill_chunk = 512;       // tokens per prefill chunk
  // While sequences decode, a step's prompt tokens keep its predicted time <= this x its time
  // without them, or x the loaded step of all live sequences capped at the median recent step
  // (docs/scheduler.md; 0 = off: whole prefill_chunk chunks); at least min_prefill_chunk
  // tokens per step.
  double step_time_stretch = 1.4;
  int prefill_pace_steps = 32;  // prompt backlog drained over this many steps (0: no pacing)
  int prompt_rate_steps = 128;  // prompt arrival rate: a moving average over this many steps
  int min_prefill_chunk = 16;
  bool priority = true;          // honour GenerateRequest.priority (else FCFS)
};

struct KvConfigOptions {
  std::string dtype = "f16";  // f16 | int8 | f32
  int64_t memory_mib = 256;   // KV cache memory budget
  int block_size = 16;        // tokens per KV block
};

// Reuse of computed prompt prefixes (docs/kv_cache.md, "Prefix cache"); engine::PrefixCacheOptions.
struct PrefixCacheConfigOptions {
  bool enabled = true;        // keep the full prompt blocks of ended sequences for later prompts
  int min_free_blocks = 0;    // released blocks beyond this many free ones are cached; 0: all
  int summary_blocks = 4096;  // cached-block hashes a node reports to the router (KV-aware routing)
  // > 0: cached blocks unused this long are compressed to INT8 (twice the prefixes per byte;
  // hits on them are no longer bit for bit the cache-off result). f16 KV, CPU backend. 0: off.
  int compress_idle_ms = 0;
  // An idle engine prefills each finished request's prompt + answer again so that the answer's
  // blocks are filed too (a chat's next turn finds them); yields to any request. Off: it spends
  // idle compute on every answer, which pays only for multi-turn chat.
  bool fill_generated = false;
};

// Speculative decoding (docs/speculative.md): a drafter proposes tokens that the target verifies
// in the same step; lossless. pd-serve and pd-decode (the node that decodes) use it.
struct SpeculativeConfigOptions {
  // off | ngram (prompt lookup, no model) | self (the model's own low-bit draft, found next to
  // the model or in ~/.cache/pdserve/drafts, built there on first use) | self-head (the model's
  // own layers with its head restricted to head_rows tokens; no file) | a draft GGUF's path.
  std::string drafter = "ngram";
  int max_k = 8;            // draft tokens per sequence and step, 1..16; K adapts below it
  // A draft qualifies only when its own return (extra tokens per extra second) beats the step's
  // tokens per second by this factor: the margin for what the cost model does not see.
  double min_gain = 1.25;
  int fixed_k = 0;          // > 0: every sequence drafts this many each step (benchmarks); 0: adaptive
  int ngram_min = 2;        // ngram: shortest suffix matched
  int ngram_max = 4;        // ngram: longest
  int64_t draft_kv_mib = 128;  // draft model: its own KV cache
  int head_rows = 32768;       // self-head: rows of the model's head the draft scores
};

struct LimitsOptions {
  int default_max_tokens = 256;      // max_tokens when a request leaves it unset
  int max_tokens = 4096;             // largest max_tokens a request may ask for
  int64_t max_body_bytes = 1 << 20;  // largest request body (HTTP) / message (gRPC)
  int max_stop = 8;                  // stop strings per request
};

// KV transfer between prefill and decode nodes (pd-prefill sends, pd-decode receives; UCX).
struct KvTransferOptions {
  bool enabled = true;       // open a UCX transport; off: pd-decode prefills every request itself
  std::string ucx_tls;       // UCX_TLS for this node's UCX context; "" = UCX's own choice
  // Ask UCX for peer failure detection (TCP only); off allows shared memory between processes on
  // one host (faster). A dead sender is noticed by the router either way.
  bool peer_failure = false;
  int64_t staging_mib = 256;  // idle staging buffers kept for reuse
  // pd-prefill: fetch the prompt prefix that the decode node holds and this node's prefix cache
  // lacks from the decode node (Decode.SendPrefix) instead of computing it, when it is at least
  // prefix_pull_min_tokens long (docs/cluster.md, "Prefix pull").
  bool prefix_pull = true;
  int prefix_pull_min_tokens = 64;
};

// One node the router sends work to (pd-router; configs/cluster-local.yaml).
struct NodeOptions {
  std::string name;     // unique; labels metrics and logs
  std::string role;     // prefill | decode
  std::string address;  // host:port of the node's gRPC server
};

// pd-router: the node registry, health checks and placement (docs/config.md, "router").
struct RouterOptions {
  std::vector<NodeOptions> nodes;
  int health_interval_ms = 250;  // Node.Load poll per node
  int health_timeout_ms = 400;   // deadline of one poll
  int unhealthy_after = 2;       // consecutive failed polls before a node stops receiving work
  // kv_aware | least_loaded | round_robin | random (docs/cluster.md, "KV-aware routing")
  std::string decode_policy = "kv_aware";
  // kv_aware | fewest_pending_tokens | round_robin (router/node_registry.h)
  std::string prefill_policy = "kv_aware";
  // kv_aware: a decode node's cost for a request, in prompt tokens of work ahead of its first
  // token, is  (prompt - prefix_weight * cached) + pending_prefill + seq_cost_tokens * sequences
  // (cached: the prompt's leading tokens whose blocks the node reports in its cache summary).
  double prefix_weight = 1.0;
  int seq_cost_tokens = 64;
  int max_retries = 2;  // other decode nodes tried when one fails (also mid-stream)
  // Disaggregated path: prompts run on a prefill node and their KV is pushed to the decode node.
  // Off (or no healthy prefill node): decode nodes prefill themselves (colocated fallback).
  bool disaggregate = true;
  std::string kv_wire = "f16";         // f16 | int8: what KV travels as (int8: half the bytes)
  // Reserve -> every layer landed, beyond the prefill node's expected queue (the prompt tokens
  // ahead there at the rate the router measured: router/prefill_rate.h); past it the transfer is
  // aborted and the decode node prefills.
  int kv_transfer_timeout_ms = 30000;
  // Prompts shorter than this run on the decode node itself: their prefill is short enough to
  // share the decode node's steps, and sending them to a prefill node makes them queue there
  // behind long prompts (bench/results/pd_vs_colocated_2026-11-29*.md). 0: every prompt goes to
  // a prefill node.
  int disaggregate_min_prompt = 512;
};

// Dynamic cluster membership through etcd (docs/cluster.md, "etcd membership"): nodes register
// `<prefix>nodes/<role>/<name>` under a lease; the router watches the prefix. Off when
// `endpoints` is empty; router.nodes keeps working either way.
struct EtcdOptions {
  std::vector<std::string> endpoints;  // etcd v3 gateways, "http://host:port"; empty = off
  std::string prefix = "/pdserve/";    // key prefix shared by the nodes and the router; ends in /
  int lease_ttl_s = 3;                 // node lease; a dead node is dropped this long after it died
  int poll_interval_ms = 250;          // router: how often it reads the prefix
  std::string node_name;               // nodes: the name registered; "" = <role>-<host>-<port>
};

struct ServeOptions {
  ModelConfigOptions model;
  int threads = 0;  // CPU backend threads; 0 = all cores
  ListenOptions grpc{true, "127.0.0.1", 50051};
  ListenOptions http{true, "127.0.0.1", 8080};
  HttpLimitsOptions http_limits;  // YAML: the other keys of `http:`
  TlsOptions tls;                 // public gRPC and HTTP
  ClusterTlsOptions cluster_tls;  // pd-router, pd-prefill, pd-decode
  AdmissionConfigOptions admission;
  // Accepted API keys ("authorization: Bearer KEY" or "x-api-key: KEY"); empty = no auth.
  // PDSERVE_API_KEYS (comma-separated) adds to these.
  std::vector<std::string> api_keys;
  // A file of more keys, one per line ('#' comments and blank lines ignored), read at start
  // (LoadApiKeysFile). Keeps keys out of the config and off command lines (`ps` shows those).
  std::string api_keys_file;
  SchedulerConfigOptions scheduler;
  KvConfigOptions kv;
  PrefixCacheConfigOptions prefix_cache;
  SpeculativeConfigOptions speculative;
  LimitsOptions limits;
  KvTransferOptions kv_transfer;  // pd-prefill / pd-decode
  double shutdown_grace_s = 10;  // on SIGINT/SIGTERM, time streams get to finish before cancel
  RouterOptions router;          // pd-router only; the other daemons ignore it
  EtcdOptions etcd;              // pd-router, pd-decode, pd-prefill

  // INVALID_ARGUMENT naming the field (full path) and the bad value.
  absl::Status Validate() const;
};

// Parses YAML text. `source` names it in error messages (a file name). INVALID_ARGUMENT for YAML
// syntax errors (with line and column), unknown keys, wrong types; then runs Validate().
absl::StatusOr<ServeOptions> ParseServeOptions(std::string_view yaml, std::string_view source);
// Reads and parses a file. NOT_FOUND when it cannot be read.
absl::StatusOr<ServeOptions> LoadServeOptions(const std::string& path);

// Appends the keys of PDSERVE_API_KEYS-style text ("k1,k2", blanks trimmed, empties dropped).
void AddApiKeys(std::string_view comma_separated, std::vector<std::string>* keys);
// Appends the keys of a key file (one per line, surrounding blanks trimmed, '#' comment lines and
// blank lines ignored). NOT_FOUND when it cannot be read; INVALID_ARGUMENT when it holds no key.
// Error messages name the file and line numbers, never a key.
absl::Status LoadApiKeysFile(const std::string& path, std::vector<std::string>* keys);

}  // namespace pd
