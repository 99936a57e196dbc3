// The pdserve_* Prometheus metrics of a serving process (docs/metrics.md), fed by the front end
// (per request) and the scheduler (per step). Implemented on common/metrics.h's registry.
// Thread safe: every method may be called from any thread.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "engine/sched/engine_api.h"

namespace pd {
class MetricsRegistry;  // common/metrics.h
}

namespace pd::router {

// One engine step (a batched forward), as the scheduler reports it.
struct StepStats {
  int prefill_tokens = 0;   // prompt tokens computed in the step
  int decode_tokens = 0;    // decode tokens computed in the step
  double seconds = 0;       // wall time of the forward + sampling
};

class ServingMetrics {
 public:
  // Registers the metrics in `registry`, which must outlive this object.
  explicit ServingMetrics(MetricsRegistry& registry);

  // A request was accepted by the engine.
  void RequestStarted();
  // Time between two consecutive output tokens of one stream (TPOT / inter-token latency).
  void TokenInterval(double seconds);
  // A request ended: finish reason counter, prompt/generated token counters, and the TTFT,
  // end-to-end and queue-time histograms from `timing`.
  void RequestFinished(std::string_view finish_reason, int prompt_tokens, int completion_tokens,
                       const engine::RequestTiming& timing);
  // A request was refused or failed: errors counter by status code name ("INVALID_ARGUMENT", ...).
  void Error(absl::StatusCode code);
  // A scheduler step: prefill / decode step-time histograms (a mixed step counts in both).
  void Step(const StepStats& step);
  // Gauges: running / waiting sequences and KV blocks used / free.
  void Load(const engine::EngineLoad& load);

 private:
  struct Impl;
  Impl* impl_;  // owned by the registry's lifetime; see serving_metrics.cc
};

}  // namespace pd::router
