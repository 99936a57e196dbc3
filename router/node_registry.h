// pd-router's view of the cluster: the nodes it places requests on, each polled with Node.Load
// by its own health thread, and the placement policies that pick a node for a request.
//
// Membership: the nodes named in the config (router.nodes) are added by Create; more come and go
// at run time through AddNode / RemoveNode (the etcd watcher, router/etcd_watcher.h). A removed
// node is never picked again and its health thread stops, but its Node stays valid (requests
// still running on it keep their pointer); a node added again under the same name, role and
// address reuses it.
//
// Health: a node receives work while its last poll succeeded and it is not draining. After
// `unhealthy_after` consecutive failed polls (each with a `health_timeout_ms` deadline, one every
// `health_interval_ms`), or at once when a request to it fails at the transport level
// (ReportFailure), it stops receiving work; the listeners given to OnUnhealthy are told (the
// RemoteEngine moves that node's streams elsewhere). With the defaults (250 ms, 400 ms, 2) a dead
// node is out within ~1.3 s; a node returns with its next successful poll.
//
// Placement (named in config, router.decode_policy / router.prefill_policy):
//   decode  (only healthy decode nodes whose KV cache can hold the request at all:
//           kv_blocks_total * block_size >= tokens; "sequences" below is the node's running +
//           waiting, or the router's own streams on it if more: they are fresher than the poll)
//           kv_aware (default): those with enough free blocks first, then the lowest cost
//             (prompt - prefix_weight * cached) + pending_prefill_tokens
//               + seq_cost_tokens * sequences,
//           in prompt tokens of work ahead of the request's first token; `cached` is how many of
//           the prompt's leading tokens the node holds, from the block-hash summary of its
//           prefix cache in its last poll (docs/cluster.md, "KV-aware routing").
//           least_loaded: those with enough free blocks first, then the fewest sequences, then
//           the most free blocks. round_robin: the next one. random: a uniformly random one.
//   prefill kv_aware (default): the healthy prefill node of lowest
//             pending + (prompt - prefix_weight * max(cached, decode_cached)),
//           pending being its pending prompt tokens (last poll plus the router's own in-flight
//           prompt tokens), cached the prompt's leading tokens in its cache summary, and
//           decode_cached those the chosen decode node holds (the prefill node pulls them from
//           there, docs/cluster.md "Prefix pull"). fewest_pending_tokens: the lowest pending;
//           round_robin.
//
// Ownership: owns the channels, the stubs and the health threads (joined by RemoveNode and the
// destructor). Thread safety: every method may be called from any thread; Node pointers stay
// valid for the registry's lifetime, also after RemoveNode.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/grpc_tls.h"
#include "common/metrics.h"
#include "engine/sched/engine_api.h"
#include "pdserve/node/v1/node.grpc.pb.h"
#include "router/prefill_rate.h"

namespace pd::router {

struct NodeStatus {
  std::string name, role, address;
  bool healthy = false;
  bool draining = false;
  int consecutive_failures = 0;
  engine::EngineLoad load;  // from the last successful poll
  int max_context = 0;
  // Chain hashes of the blocks in the node's prefix cache (its last poll); null if none.
  std::shared_ptr<const absl::flat_hash_set<uint64_t>> cached_blocks;
  int active = 0;             // the router's requests on the node now
  int64_t active_tokens = 0;  // their prompt tokens (prefill) or KV tokens (decode)
  // Prefill nodes: prompt tokens per second of busy time as the router measured them
  // (router/prefill_rate.h); 0 until measured.
  double prefill_tokens_per_s = 0;
};

class NodeRegistry {
 public:
  struct Node {
    NodeOptions options;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pdserve::node::v1::Decode::Stub> decode;
    std::unique_ptr<pdserve::node::v1::Prefill::Stub> prefill;
    std::unique_ptr<pdserve::node::v1::Node::Stub> node;
  };

  // Adds options.nodes (may be empty) and starts one health thread per node. `metrics`
  // (nullable) must outlive the registry: it gets pdserve_router_node_* gauges and
  // pdserve_router_node_evictions_total. INVALID_ARGUMENT / ALREADY_EXISTS as AddNode.
  // `channels`: how the router reaches the nodes (plaintext, or mutual TLS). `model_fingerprint`
  // (engine/model/fingerprint.h; 0 = not checked): a node that reports another one never
  // receives work, and the router logs why.
  static absl::StatusOr<std::unique_ptr<NodeRegistry>> Create(const RouterOptions& options,
                                                              MetricsRegistry* metrics,
                                                              ClusterChannels channels = {},
                                                              uint64_t model_fingerprint = 0);
  ~NodeRegistry();  // stops and joins the health threads

  // Adds a node and starts its health thread; it receives work after its first successful poll.
  // INVALID_ARGUMENT for an empty name, a role other than prefill / decode or an address without
  // a port; ALREADY_EXISTS when a node of that name, or another node at that address, is in the
  // registry (not removed).
  absl::Status AddNode(const NodeOptions& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the node named `name`: it is not picked any more, its health thread is stopped and
  // joined, and if it was healthy the OnUnhealthy listeners are told (so its streams move). Its
  // Node stays valid. NOT_FOUND when no such node is in the registry. Not to be called from an
  // OnUnhealthy listener.
  absl::Status RemoveNode(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // nullptr when no healthy node can take the request (`tokens`: prompt + max_tokens for decode,
  // prompt tokens for prefill). `exclude`: nodes already tried for this request.
  // `prompt` (may be empty): the request's prompt, for kv_aware; *cached_tokens (nullable) gets
  // how many of its leading tokens the picked node holds in its prefix cache (any policy).
  const Node* PickDecode(int64_t tokens, const std::vector<const Node*>& exclude,
                         absl::Span<const int32_t> prompt = {}, int* cached_tokens = nullptr);
  // The prompt's leading tokens whose K/V `status`'s node holds in its prefix cache, as far as
  // its last summary tells: whole blocks, within what its scheduler reuses
  // (engine::CacheablePrefix).
  static int CachedPrefixTokens(const NodeStatus& status, absl::Span<const int32_t> prompt);
  // `prompt` and `decode_cached` (the prompt's leading tokens the chosen decode node holds) are
  // for kv_aware.
  const Node* PickPrefill(int64_t tokens, const std::vector<const Node*>& exclude,
                          absl::Span<const int32_t> prompt = {}, int decode_cached = 0);

  // A request to `node` failed at the transport level: it stops receiving work until a poll
  // succeeds.
  void ReportFailure(const Node* node, const std::string& why);
  // The router's own in-flight requests on a node (placement counts them).
  void AddActive(const Node* node, int delta, int64_t tokens);
  // A prefill on `node` finished, having computed `tokens` prompt tokens: its rate
  // (router/prefill_rate.h). Call after the AddActive(node, -1, ...) of that prefill.
  void ObservePrefill(const Node* node, int64_t tokens);
  // How long a prompt of `tokens` placed on prefill node `node` now waits for its last layer:
  // the prompt tokens queued or running there (the node's last report, or the router's own
  // count, whichever is more) and its own, at the node's measured rate. nullopt before the rate
  // is known (or for a node not in the registry).
  std::optional<absl::Duration> PrefillWait(const Node* node, int64_t tokens);

  // Called (on a health thread, or the ReportFailure caller) when a node turns unhealthy.
  // Returns the listener's id for RemoveListener. A listener whose captures may die before the
  // registry must be removed first (RemoteEngine does in its destructor).
  int OnUnhealthy(std::function<void(const Node*)> listener) ABSL_LOCKS_EXCLUDED(mu_);
  // On return the listener `id` is not running on any thread and is never called again (a
  // notification under way when it is called is waited for). Not to be called from a listener.
  void RemoveListener(int id) ABSL_LOCKS_EXCLUDED(mu_);

  // The nodes in the registry (removed ones left out), in the order they were added.
  std::vector<NodeStatus> Snapshot() const;
  int HealthyCount(const std::string& role) const;
  // The smallest max_context reported by a decode node; 0 before any poll succeeded.
  int DecodeContext() const;
  // Sum of the healthy decode nodes' loads.
  engine::EngineLoad DecodeLoad() const;
  // Waits until `n` nodes of `role` are healthy, or `timeout`; true if they are.
  bool WaitForHealthy(const std::string& role, int n, absl::Duration timeout) const;
  bool WaitForDecodeNodes(int n_decode, absl::Duration timeout) const {
    return WaitForHealthy("decode", n_decode, timeout);
  }

 private:
  struct Entry;
  NodeRegistry(const RouterOptions& options, MetricsRegistry* metrics, ClusterChannels channels,
               uint64_t model_fingerprint);
  void HealthLoop(Entry* e, uint64_t generation);
  void MarkUnhealthy(Entry* e, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  const Node* Pick(const std::string& role, int64_t tokens, const std::vector<const Node*>& exclude,
                   absl::Span<const int32_t> prompt, int* cached_tokens, int decode_cached = 0);
  void Publish(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The entry of `node`, or nullptr.
  Entry* FindLocked(const Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RouterOptions options_;
  const ClusterChannels channels_;
  const uint64_t model_fingerprint_;

  mutable absl::Mutex mu_;
  // Only grows: removed entries stay (marked) so that Node pointers stay valid.
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<int, std::function<void(const Node*)>>> listeners_ ABSL_GUARDED_BY(mu_);
  int next_listener_ ABSL_GUARDED_BY(mu_) = 0;
  // MarkUnhealthy calls running with a copy of listeners_ (RemoveListener waits for zero).
  int notifying_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_robin_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t random_state_ ABSL_GUARDED_BY(mu_) = 0x9e3779b97f4a7c15ULL;  // decode_policy random

  Family<Gauge>* healthy_gauge_ = nullptr;
  Family<Gauge>* member_gauge_ = nullptr;
  Family<Gauge>* load_gauge_ = nullptr;  // {node, role, field}
  Family<Counter>* evictions_ = nullptr;
};

}  // namespace pd::router
