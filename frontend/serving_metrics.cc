#include "frontend/serving_metrics.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pd::frontend {
namespace {

// Request-level latencies (TTFT, end to end, queueing) of CPU serving: from a millisecond (a
// cached short prompt) to a minute (a long generation on a busy 2-core machine).
const std::vector<double>& RequestBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    20,   30,  60};
  return b;
}

// Per-token and per-step times: finer between 5 ms and 500 ms, where CPU decode steps live.
const std::vector<double>& StepBuckets() {
  static const std::vector<double> b = {0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05,
                                        0.075, 0.1,   0.15,  0.2,  0.3,  0.5,  0.75,
                                        1,     2.5,   5,     10,   30,   60};
  return b;
}

bool Reached(absl::Time t) { return t != absl::InfinitePast(); }

}  // namespace

ServingMetrics::ServingMetrics(MetricsRegistry& registry)
    : ttft_(registry
                .AddHistogram("pdserve_time_to_first_token_seconds",
                              "Time from a request's arrival to its first generated token.", {},
                              RequestBuckets())
                .Get()),
      tpot_(registry
                .AddHistogram("pdserve_time_per_output_token_seconds",
                              "Time between two consecutive output tokens of one request "
                              "(inter-token latency).",
                              {}, StepBuckets())
                .Get()),
      e2e_(registry
               .AddHistogram("pdserve_e2e_request_latency_seconds",
                             "Time from a request's arrival to its end.", {}, RequestBuckets())
               .Get()),
      queue_(registry
                 .AddHistogram("pdserve_queue_time_seconds",
                               "Time from a request's arrival to its first scheduled prefill "
                               "chunk.",
                               {}, RequestBuckets())
                 .Get()),
      prefill_step_(registry
                        .AddHistogram("pdserve_prefill_step_seconds",
                                      "Wall time of engine steps that computed prompt tokens.", {},
                                      StepBuckets())
                        .Get()),
      decode_step_(registry
                       .AddHistogram("pdserve_decode_step_seconds",
                                     "Wall time of engine steps that computed decode tokens.", {},
                                     StepBuckets())
                       .Get()),
      running_(registry
                   .AddGauge("pdserve_running_sequences",
                             "Sequences holding KV cache and taking part in steps.")
                   .Get()),
      waiting_(registry
                   .AddGauge("pdserve_waiting_sequences",
                             "Accepted sequences waiting to start (or preempted, waiting again).")
                   .Get()),
      kv_used_(registry.AddGauge("pdserve_kv_blocks_used", "KV cache blocks in use.").Get()),
      kv_free_(registry.AddGauge("pdserve_kv_blocks_free", "KV cache blocks free.").Get()),
      prompt_tokens_(
          registry.AddCounter("pdserve_prompt_tokens_total", "Prompt tokens of finished requests.")
              .Get()),
      cached_blocks_(registry
                         .AddGauge("pdserve_prefix_cache_blocks",
                                   "KV blocks filed in the prefix cache (held or not).")
                         .Get()),
      compressed_blocks_(registry
                             .AddGauge("pdserve_prefix_cache_compressed_blocks",
                                       "Prefix-cache blocks held compressed to INT8 "
                                       "(prefix_cache.compress_idle_ms).")
                             .Get()),
      evictions_(registry
                     .AddCounter("pdserve_prefix_cache_evictions_total",
                                 "Prefix-cache blocks evicted to make room for new KV.")
                     .Get()),
      fill_tokens_(registry
                       .AddCounter("pdserve_prefix_cache_fill_tokens_total",
                                   "Tokens an idle engine prefilled to file finished answers in "
                                   "the prefix cache (prefix_cache.fill_generated).")
                       .Get()),
      cache_queries_(registry
                         .AddCounter("pdserve_prefix_cache_queries_tokens_total",
                                     "Prompt tokens of finished requests looked up in the prefix "
                                     "cache.")
                         .Get()),
      cache_hits_(registry
                      .AddCounter("pdserve_prefix_cache_hits_tokens_total",
                                  "Prompt tokens of finished requests whose KV came from the "
                                  "prefix cache.")
                      .Get()),
      generation_tokens_(registry
                             .AddCounter("pdserve_generation_tokens_total",
                                         "Tokens generated by finished requests.")
                             .Get()),
      accepted_(
          registry.AddCounter("pdserve_requests_accepted_total", "Requests accepted by the engine.")
              .Get()),
      requests_(registry.AddCounter("pdserve_requests_total", "Finished requests by finish reason.",
                                    {"finish_reason"})),
      errors_(registry.AddCounter("pdserve_errors_total",
                                  "Requests refused or failed, by status code.", {"code"})),
      spec_drafts_(registry
                       .AddCounter("pdserve_spec_drafts_total",
                                   "Drafts verified by speculative decoding (one per sequence "
                                   "and step that drafted).")
                       .Get()),
      spec_draft_tokens_(
          registry
              .AddCounter("pdserve_spec_draft_tokens_total", "Draft tokens the target verified.")
              .Get()),
      spec_accepted_tokens_(registry
                                .AddCounter("pdserve_spec_accepted_tokens_total",
                                            "Draft tokens the target accepted (each one a "
                                            "target step saved).")
                                .Get()),
      spec_draft_seconds_(registry
                              .AddCounter("pdserve_spec_draft_seconds_total",
                                          "Seconds the engine spent in the drafter (a draft "
                                          "model's forwards; part of the step time).")
                              .Get()),
      spec_drafted_at_(registry.AddCounter("pdserve_spec_position_drafted_total",
                                           "Drafts that reached a position (every earlier one "
                                           "accepted), by position (1 = the first token).",
                                           {"position"})),
      spec_accepted_at_(registry.AddCounter("pdserve_spec_position_accepted_total",
                                            "Draft tokens accepted, by position in the draft.",
                                            {"position"})),
      graph_steps_(registry.AddCounter(
          "pdserve_cuda_graph_steps_total",
          "Decode steps recorded as CUDA graphs (PDSERVE_CUDA_GRAPHS=1): launched as one unit, or "
          "abandoned and run op by op.",
          {"result"})) {
  // The common outcomes exist from the start at 0, so that rate() sees their first increment.
  for (const char* reason : {"stop", "length"}) requests_.WithLabels({reason});
}

void ServingMetrics::RequestStarted() { accepted_.Increment(); }

void ServingMetrics::TokenInterval(double seconds) { tpot_.Observe(seconds); }

void ServingMetrics::RequestFinished(std::string_view finish_reason, int prompt_tokens,
                                     int completion_tokens, int cached_tokens,
                                     const engine::RequestTiming& timing) {
  requests_.WithLabels({std::string(finish_reason)}).Increment();
  if (prompt_tokens > 0) {
    prompt_tokens_.Increment(prompt_tokens);
    cache_queries_.Increment(prompt_tokens);
  }
  if (cached_tokens > 0) cache_hits_.Increment(cached_tokens);
  if (completion_tokens > 0) generation_tokens_.Increment(completion_tokens);
  const absl::Time arrival = timing.arrival;
  if (!Reached(arrival)) return;
  // A phase before the arrival was never reached (left at a default such as the Unix epoch).
  auto observe = [arrival](Histogram& h, absl::Time t) {
    if (Reached(t) && t >= arrival) h.Observe(absl::ToDoubleSeconds(t - arrival));
  };
  observe(ttft_, timing.first_token);
  observe(queue_, timing.first_scheduled);
  observe(e2e_, timing.finished);
}

void ServingMetrics::Error(absl::StatusCode code) {
  errors_.WithLabels({absl::StatusCodeToString(code)}).Increment();
}

void ServingMetrics::Step(const StepStats& step) {
  if (step.prefill_tokens > 0) prefill_step_.Observe(step.seconds);
  if (step.decode_tokens > 0) decode_step_.Observe(step.seconds);
}

void ServingMetrics::Speculation(int sequences, int drafted, int accepted,
                                 const std::vector<int>& drafted_at,
                                 const std::vector<int>& accepted_at, double draft_seconds) {
  spec_drafts_.Increment(sequences);
  if (draft_seconds > 0) spec_draft_seconds_.Increment(draft_seconds);
  spec_draft_tokens_.Increment(drafted);
  spec_accepted_tokens_.Increment(accepted);
  for (size_t i = 0; i < drafted_at.size(); ++i) {
    const std::string position = std::to_string(i + 1);
    if (drafted_at[i] > 0) spec_drafted_at_.WithLabels({position}).Increment(drafted_at[i]);
    if (i < accepted_at.size() && accepted_at[i] > 0) {
      spec_accepted_at_.WithLabels({position}).Increment(accepted_at[i]);
    }
  }
}

void ServingMetrics::Load(const engine::EngineLoad& load) {
  running_.Set(load.running);
  waiting_.Set(load.waiting);
  kv_used_.Set(load.kv_blocks_total - load.kv_blocks_free);
  kv_free_.Set(load.kv_blocks_free);
  cached_blocks_.Set(load.kv_blocks_cached);
  compressed_blocks_.Set(load.kv_blocks_compressed);
  const int64_t seen = evictions_seen_.exchange(load.prefix_cache_evictions);
  if (load.prefix_cache_evictions > seen) evictions_.Increment(load.prefix_cache_evictions - seen);
  const int64_t filled = fill_tokens_seen_.exchange(load.prefix_fill_tokens);
  if (load.prefix_fill_tokens > filled) fill_tokens_.Increment(load.prefix_fill_tokens - filled);
  const int64_t launched = graph_launched_seen_.exchange(load.graph_steps);
  if (load.graph_steps > launched) {
    graph_steps_.WithLabels({"launched"}).Increment(load.graph_steps - launched);
  }
  const int64_t abandoned = graph_abandoned_seen_.exchange(load.graph_abandoned);
  if (load.graph_abandoned > abandoned) {
    graph_steps_.WithLabels({"abandoned"}).Increment(load.graph_abandoned - abandoned);
  }
}

}  // namespace pd::frontend
