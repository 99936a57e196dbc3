// The GenerationEngine of pd-router: places each request on a decode node of the NodeRegistry and
// relays the node's token stream to the request's sink, so that the same Frontend, gRPC service
// and HTTP server as pd-serve's run unchanged on top of a cluster.
//
// One request = one call thread that runs Decode.Generate on the chosen node. When the node fails
// (transport error, UNAVAILABLE, RESOURCE_EXHAUSTED, the node evicted by the health checks, or a
// server-side cancel while draining) and retries are left (router.max_retries), the request is
// re-run on another decode node with prompt + the tokens already sent as its prompt and
// max_tokens lowered by as many: the sink sees every token exactly once, in order, with no gap.
// (Greedy output is identical to an uninterrupted run; a sampled one continues with a fresh RNG
// state.)
//
// Not built yet: the disaggregated path (Prefill on a prefill node, KV pushed to the decode node)
// needs kvtransfer/; until then every decode node prefills its requests itself (the colocated
// fallback DESIGN.md names) and prefill nodes are health-checked but receive no work.
//
// Ownership: borrows the registry (and metrics), which must outlive it; owns the call threads,
// joined as calls end and by the destructor (which cancels what is still running).
// Thread safety: the GenerationEngine methods may be called from any thread; sinks are called on
// the request's call thread, in order.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "engine/sched/engine_api.h"
#include "router/node_registry.h"

namespace pd::router {

struct RemoteEngineOptions {
  int max_retries = 2;
  // Context when no decode node has reported one yet (the nodes' own limit is used once known).
  int default_context = 4096;
};

class RemoteEngine final : public engine::GenerationEngine {
 public:
  // `metrics` (nullable) gets pdserve_router_placements_total{node,role} and
  // pdserve_router_retries_total{reason}.
  RemoteEngine(NodeRegistry& registry, const RemoteEngineOptions& options,
               MetricsRegistry* metrics);
  ~RemoteEngine() override;  // Shutdown()

  // INVALID_ARGUMENT (empty id or prompt, max_tokens < 1, duplicate id), UNAVAILABLE when no
  // healthy decode node can hold prompt + max_tokens or when shutting down. Errors a node gives
  // later reach the sink as kError with the node's status.
  absl::Status Submit(engine::GenerationRequest request,
                      std::shared_ptr<engine::GenerationSink> sink) override;
  void Cancel(const std::string& id,
              engine::FinishReason reason = engine::FinishReason::kCancelled) override;
  // Sum over the healthy decode nodes (last polls).
  engine::EngineLoad Load() const override;
  int max_context() const override;

  // Refuses new requests, cancels the running ones and joins their threads. Idempotent.
  void Shutdown();

 private:
  struct Call;
  void Run(std::shared_ptr<Call> call);
  void NodeFailed(const NodeRegistry::Node* node);
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  NodeRegistry& registry_;
  const RemoteEngineOptions options_;
  Family<Counter>* placements_ = nullptr;
  Family<Counter>* retries_ = nullptr;

  mutable absl::Mutex mu_;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // ended, not yet joined
};

}  // namespace pd::router
