// The API-independent half of the public front end, shared by the gRPC service and the
// OpenAI-compatible HTTP server (and, in the cluster, by pd-router): validates a request, applies
// the chat template, tokenizes, submits to a GenerationEngine, and turns the token stream back
// into UTF-8 text deltas with stop strings applied.
//
// Thread safety: Frontend is thread safe (one per process, shared by all handler threads).
// A Stream belongs to the handler thread that started it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/utf8.h"
#include "engine/sched/engine_api.h"
#include "engine/sched/sampler.h"
#include "engine/tokenizer/chat_template.h"
#include "frontend/admission.h"

namespace pd::frontend {

// One request as both APIs express it; unset optionals take FrontendOptions defaults.
struct ApiRequest {
  std::string model;                          // "" = the served model
  std::vector<engine::ChatMessage> messages;  // chat (exactly one of messages / prompt)
  std::optional<std::string> prompt;          // raw completion
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int32_t priority = 0;
  bool speculative = true;  // false: no speculative decoding for it (same output law)
  std::string request_id;  // "" = generate one
  absl::Time deadline = absl::InfiniteFuture();
};

// One step of a stream: a text delta, or the end.
struct ApiChunk {
  std::string text;                // UTF-8, never splits a character
  std::vector<int32_t> token_ids;  // tokens whose text is (or is being held back) in `text`
  bool finished = false;           // last chunk: the fields below are set
  std::string finish_reason;       // "stop" | "length" (OpenAI's names)
  absl::Status status;             // non-OK: the request failed after it was accepted
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  int draft_tokens = 0;     // speculative decoding: draft tokens verified
  int accepted_tokens = 0;  // ... and accepted
  engine::RequestTiming timing;
};

// A running request. Next() blocks until the next chunk or `deadline` (a past deadline polls);
// destroying the Stream (or calling Cancel) before the end cancels the request and frees its KV.
// An event-driven reader registers a notification instead of blocking (SetNotify) and polls.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual const std::string& request_id() const = 0;
  // false on timeout (chunk untouched); true with a chunk otherwise. After the finished chunk,
  // returns false at once.
  virtual bool Next(ApiChunk* chunk, absl::Time deadline) = 0;
  virtual void Cancel() = 0;
  // `notify` is called whenever Next may have something new: from the producer's thread (the
  // engine's), or from this call when data is already waiting. Calls may be spurious; `notify`
  // must be cheap, must not block, and must be safe to call from any thread. The Stream drops it
  // when destroyed, but a call the producer began just before may still run: capture weak
  // references. Replaces an earlier one.
  virtual void SetNotify(std::function<void()> notify) = 0;
};

struct ModelCard {
  std::string id;  // name clients use
  std::string architecture;
  int context_length = 0;
  int64_t parameters = 0;
  std::string quantization;
};

class Frontend {
 public:
  virtual ~Frontend() = default;
  // Validates and starts `request`. Errors: INVALID_ARGUMENT naming the field, NOT_FOUND for an
  // unknown model, and whatever GenerationEngine::Submit returns (RESOURCE_EXHAUSTED, ...).
  virtual absl::StatusOr<std::unique_ptr<Stream>> Start(const ApiRequest& request) = 0;
  virtual std::vector<ModelCard> Models() const = 0;
};

}  // namespace pd::frontend

// ---- the local front end: one engine in this process (pd-serve) ------------------------------

namespace pd::engine {
class Tokenizer;
}  // namespace pd::engine

namespace pd::frontend {

class ServingMetrics;

// RESOURCE_EXHAUSTED carrying a retry hint: HTTP answers 429 with "Retry-After: <s>", gRPC adds
// "retry-after" trailing metadata.
absl::Status OverloadedError(std::string_view message, int retry_after_s);
// The hint of an OverloadedError; 0 when the status carries none.
int RetryAfterSeconds(const absl::Status& status);

struct FrontendOptions {
  // Sampling values a request leaves unset (engine::SamplingParams' defaults otherwise).
  engine::SamplingParams default_sampling;
  int default_max_tokens = 256;  // max_tokens when unset (lowered to what the context leaves)
  int max_tokens_limit = 4096;   // larger max_tokens: INVALID_ARGUMENT
  int max_stop = 8;              // stop strings per request
  int max_stop_bytes = 256;      // bytes per stop string
  // Refusal before tokenization when the server is full (frontend/admission.h).
  AdmissionOptions admission;
};

// A Frontend over `engine` in this process. Borrows engine, tokenizer and metrics (nullable),
// which must outlive it and every Stream it returns. `model` describes the one served model;
// requests naming another model get NOT_FOUND.
std::unique_ptr<Frontend> MakeLocalFrontend(FrontendOptions options,
                                            engine::GenerationEngine& engine,
                                            const engine::Tokenizer& tokenizer,
                                            engine::ChatTemplateKind chat_template, ModelCard model,
                                            ServingMetrics* metrics);

// The strict check of common/utf8.h, by the name the front end's callers use.
using ::pd::IsValidUtf8;

}  // namespace pd::frontend
