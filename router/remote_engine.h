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
// The disaggregated path (docs/architecture.md, "The request path"; docs/kv_transfer.md, "In the
// cluster"): on the first attempt, when router.disaggregate is on, the prompt has at least
// router.disaggregate_min_prompt tokens that the chosen decode node does not hold in its prefix
// cache (NodeRegistry::CachedPrefixTokens) and a prefill node is healthy, the router reserves the
// request on the chosen decode node (Decode.Reserve -> descriptor), has the prefill node with the
// fewest pending prompt tokens run the prompt and push its KV there (Prefill.Prefill -> first
// token, which goes to the sink at once: that is TTFT), then attaches to the request on the
// decode node (Decode.Generate with the reservation and the first token) and relays the rest.
// Failures: a prefill node that is unreachable or draining -> the prefill is retried on another
// prefill node with a fresh reservation (the old one released); any other prefill or transfer
// failure, or no second prefill node -> the router attaches without a first token and the decode
// node prefills the prompt itself; a decode node without KV transfer, or no prefill node at
// all -> plain Decode.Generate (the colocated fallback).
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
  bool disaggregate = true;        // router.disaggregate
  int disaggregate_min_prompt = 0;  // router.disaggregate_min_prompt
  bool int8_wire = false;          // router.kv_wire == "int8"
  // The transfer's allowance beyond the prefill node's expected queue (TransferBudgetSeconds).
  double kv_transfer_timeout_s = 30;
  // Context when no decode node has reported one yet (the nodes' own limit is used once known).
  int default_context = 4096;
};

class RemoteEngine final : public engine::GenerationEngine {
 public:
  // `metrics` (nullable) gets pdserve_router_placements_total{node,role},
  // pdserve_router_retries_total{reason}, pdserve_router_prefill_path_total{path} and
  // pdserve_router_ttft_phase_seconds{phase} (docs/metrics.md).
  RemoteEngine(NodeRegistry& registry, const RemoteEngineOptions& options,
               MetricsRegistry* metrics);
  ~RemoteEngine() override;  // Shutdown(), then leaves the registry's listeners

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
  // Decode.Reserve's deadline and the prefill call's, in seconds from now, for a prompt of
  // `n_prompt` tokens placed on `prefill` now: router.kv_transfer_timeout_ms plus the node's
  // expected queue (NodeRegistry::PrefillWait).
  double TransferBudgetSeconds(const NodeRegistry::Node* prefill, int64_t n_prompt);
  // The disaggregated prefill for the first attempt on decode node `decode`: on return `nreq`
  // carries the reservation (and the first token when a prefill node computed it); the first
  // token, unless a stop token, was given to the sink and appended to `sent`. Returns false when
  // the request should go the plain way (nreq untouched). Sets *cancelled when the client
  // cancelled meanwhile.
  bool Disaggregate(Call& call, const NodeRegistry::Node* decode,
                    pdserve::node::v1::GenerateRequest& nreq, std::vector<int32_t>& sent,
                    engine::FinishInfo& info, bool* cancelled, int decode_cached);
  void Path(const char* path);
  void Phase(const char* phase, double seconds);
  void NodeFailed(const NodeRegistry::Node* node);
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  NodeRegistry& registry_;
  const RemoteEngineOptions options_;
  int listener_ = -1;  // registry_.OnUnhealthy's id, removed by the destructor
  Family<Counter>* placements_ = nullptr;
  Family<Counter>* retries_ = nullptr;
  Family<Counter>* paths_ = nullptr;     // {path}
  Family<Histogram>* phases_ = nullptr;  // {phase}

  mutable absl::Mutex mu_;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // ended, not yet joined
};

}  // namespace pd::router
