// The seam between a front end (pd-serve's APIs, later the router) and whatever generates tokens:
// a colocated Scheduler today, a remote decode node tomorrow. Token ids in, token ids out; chat
// templates, tokenization of the prompt, detokenization and stop strings belong to the front end
// (router/frontend.h), as DESIGN.md's request flow says.
//
// Threading: Submit/Cancel/Load may be called from any thread. A GenerationSink is called from
// the engine's own thread, in order, and must not block (it hands the data to a queue).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/sched/sampler.h"

namespace pd::engine {

struct GenerationRequest {
  std::string id;                 // unique among the engine's live requests; non-empty
  std::vector<int32_t> prompt;    // token ids, already templated and tokenized; non-empty
  SamplingParams sampling;
  int max_tokens = 128;           // >= 1
  // Generation ends, finish reason "stop", when one of these is sampled (the token itself is
  // not emitted). The front end fills in the model's end-of-generation tokens unless ignore_eos.
  absl::flat_hash_set<int32_t> stop_token_ids;
  int priority = 0;               // higher runs first; FCFS among equals
  absl::Time deadline = absl::InfiniteFuture();  // past it: finish kDeadlineExceeded, KV freed
};

enum class FinishReason {
  kStop,       // a stop token (or the front end's stop string, which cancels with kStop)
  kLength,     // max_tokens reached, or the context is full
  kCancelled,  // Cancel() (client went away)
  kDeadline,   // the request's deadline passed
  kError,      // FinishInfo::status says why (e.g. RESOURCE_EXHAUSTED after preemption limits)
};
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", ...

// Where the request's time went; absl::InfinitePast() for phases never reached.
struct RequestTiming {
  absl::Time arrival;          // Submit accepted it
  absl::Time first_scheduled;  // its first prefill chunk ran
  absl::Time first_token;      // first generated token emitted (TTFT = first_token - arrival)
  absl::Time finished;
  int preemptions = 0;         // times its KV was dropped and recomputed
  bool kv_imported = false;    // its prompt's K/V came from outside (Scheduler::CompleteImport)
};

struct FinishInfo {
  FinishReason reason = FinishReason::kStop;
  absl::Status status;         // OK unless reason == kError
  int prompt_tokens = 0;
  int completion_tokens = 0;
  RequestTiming timing;
};

// Receives one request's output. OnTokens is called once per engine step that produced tokens
// for it (one token per step without speculative decoding), OnFinish exactly once, last.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnTokens(const std::vector<int32_t>& tokens) = 0;
  virtual void OnFinish(const FinishInfo& info) = 0;
};

// A point-in-time view of the engine's load, for placement, /metrics and admission.
struct EngineLoad {
  int running = 0;                  // sequences holding KV and taking part in steps
  int waiting = 0;                  // accepted, not yet started (or preempted, waiting again)
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int kv_block_size = 0;            // tokens per block
  int64_t pending_prefill_tokens = 0;  // prompt tokens not yet computed, over all sequences
};

class GenerationEngine {
 public:
  virtual ~GenerationEngine() = default;
  // Accepts a request; its sink then receives its output. Errors (nothing is queued, the sink is
  // never called): INVALID_ARGUMENT naming the field (empty prompt, token id out of range,
  // max_tokens < 1, prompt + max_tokens beyond the context, bad sampling values, duplicate id);
  // RESOURCE_EXHAUSTED when the waiting queue or the total-token limit is full; UNAVAILABLE when
  // shutting down.
  virtual absl::Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) = 0;
  // Ends a live request: its KV is freed before the next step and its sink gets OnFinish with
  // `reason` (kCancelled, or kStop when the front end matched a stop string). No-op if unknown or
  // already finished.
  virtual void Cancel(const std::string& id, FinishReason reason = FinishReason::kCancelled) = 0;
  virtual EngineLoad Load() const = 0;
  // Context length the engine accepts (prompt + max_tokens).
  virtual int max_context() const = 0;
};

}  // namespace pd::engine
