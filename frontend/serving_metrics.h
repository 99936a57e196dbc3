// The pdserve_* Prometheus metrics of a serving process (docs/metrics.md), fed by the front end
// (per request) and the scheduler (per step). Implemented on common/metrics.h's registry.
// Thread safe: every method may be called from any thread; updates are lock-free atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "engine/sched/engine_api.h"

namespace pd::frontend {

// One engine step (a batched forward), as the scheduler reports it.
struct StepStats {
  int prefill_tokens = 0;  // prompt tokens computed in the step
  int decode_tokens = 0;   // decode tokens computed in the step
  double seconds = 0;      // wall time of the forward + sampling
};

class ServingMetrics {
 public:
  // Registers the metrics in `registry`, which must outlive this object. One ServingMetrics per
  // registry (a second one would register the same names: PD_CHECK).
  explicit ServingMetrics(MetricsRegistry& registry);

  // A request was accepted by the engine (pdserve_requests_accepted_total). Every accepted
  // request later ends in exactly one RequestFinished.
  void RequestStarted();
  // Time between two consecutive output tokens of one stream (TPOT / inter-token latency).
  void TokenInterval(double seconds);
  // A request ended: finish reason counter ("stop", "length", "cancelled", "deadline", "error"),
  // prompt/generated token counters, the prefix cache's query and hit token counters (its prompt
  // tokens, of which cached_tokens came from the cache), and the TTFT, end-to-end and queue-time
  // histograms from `timing` (phases never reached, absl::InfinitePast(), are not observed).
  void RequestFinished(std::string_view finish_reason, int prompt_tokens, int completion_tokens,
                       int cached_tokens, const engine::RequestTiming& timing);
  // A request was refused or failed: errors counter by status code name ("INVALID_ARGUMENT", ...).
  void Error(absl::StatusCode code);
  // A scheduler step: prefill / decode step-time histograms (a mixed step counts in both).
  void Step(const StepStats& step);
  // Gauges: running / waiting sequences, KV blocks used / free, prefix-cached blocks; the
  // eviction and fill-token counters follow load.prefix_cache_evictions and
  // load.prefix_fill_tokens (one caller at a time: the engine).
  void Load(const engine::EngineLoad& load);
  // A step's speculative decoding (docs/speculative.md): sequences that verified a draft, draft
  // tokens verified and accepted, and both by position in the draft (index 0: first token).
  void Speculation(int sequences, int drafted, int accepted, const std::vector<int>& drafted_at,
                   const std::vector<int>& accepted_at, double draft_seconds);

  ServingMetrics(const ServingMetrics&) = delete;
  ServingMetrics& operator=(const ServingMetrics&) = delete;

 private:
  // Families and children owned by the registry (stable for its lifetime); children without
  // labels are looked up once here.
  Histogram& ttft_;
  Histogram& tpot_;
  Histogram& e2e_;
  Histogram& queue_;
  Histogram& prefill_step_;
  Histogram& decode_step_;
  Gauge& running_;
  Gauge& waiting_;
  Gauge& kv_used_;
  Gauge& kv_free_;
  Counter& prompt_tokens_;
  Gauge& cached_blocks_;
  Gauge& compressed_blocks_;
  Counter& evictions_;
  Counter& fill_tokens_;
  Counter& cache_queries_;
  Counter& cache_hits_;
  std::atomic<int64_t> evictions_seen_{0};
  std::atomic<int64_t> fill_tokens_seen_{0};
  Counter& generation_tokens_;
  Counter& accepted_;
  Family<Counter>& requests_;  // {finish_reason}
  Family<Counter>& errors_;    // {code}
  Counter& spec_drafts_;
  Counter& spec_draft_tokens_;
  Counter& spec_accepted_tokens_;
  Counter& spec_draft_seconds_;
  Family<Counter>& spec_drafted_at_;   // {position}
  Family<Counter>& spec_accepted_at_;  // {position}
  Family<Counter>& graph_steps_;       // {result}: launched, abandoned
  std::atomic<int64_t> graph_launched_seen_{0};
  std::atomic<int64_t> graph_abandoned_seen_{0};
};

}  // namespace pd::frontend
