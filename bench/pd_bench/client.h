// pd-bench's view of a serving endpoint: sends one streaming request and times it. Two
// implementations, created by factories: the public gRPC API (pdserve.v1.Chat/Generate) and the
// OpenAI-compatible HTTP API (POST /v1/completions or /v1/chat/completions with stream: true).
//
// Thread safety: an ApiClient is shared by every request thread; Run may be called concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/pd_bench/stats.h"
#include "common/net.h"

namespace pd::bench {

using Clock = std::chrono::steady_clock;

struct ClientOptions {
  std::string target;                // HOST:PORT ([V6ADDR]:PORT for IPv6 literals)
  std::string model;                 // "" = the server's model (the first one it lists)
  bool chat = false;                 // chat messages (template applied) instead of a raw prompt
  double timeout_s = 600;            // per request, send to end of stream
  std::optional<float> temperature;  // unset = the server's default
  int grpc_channels = 4;             // gRPC: connections the streams are spread over
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct BenchRequest {
  int64_t id = 0;
  std::string prompt;
  // Non-empty: sent as these chat messages (GenerateRequest.messages, /v1/chat/completions)
  // instead of `prompt`, whatever ClientOptions::chat says. Multi-turn conversations use it.
  std::vector<ChatMessage> messages;
  int max_tokens = 1;  // sent with ignore_eos, so that the output is exactly this long
  // Keep the streamed text in RequestRecord::text (a conversation sends it back as the
  // assistant's message of the next turn).
  bool keep_text = false;
};

class ApiClient {
 public:
  virtual ~ApiClient() = default;

  // Asks the server for its models (gRPC ListModels / GET /v1/models); returns the first id.
  // UNAVAILABLE (with the target) when the server does not answer, NOT_FOUND when it lists none.
  virtual absl::StatusOr<std::string> Probe() = 0;

  // Sets the model every later request names ("" = none: the server's default).
  virtual void SetModel(const std::string& model) = 0;

  // Sends `request` as a streaming call and fills the timing, token, cached-token and status
  // fields of `record` (send_s relative to `origin`; `text` only with request.keep_text). Blocks
  // until the stream ends, fails or times out. Never throws; failures land in record->ok / error /
  // error_message.
  virtual void Run(const BenchRequest& request, Clock::time_point origin,
                   RequestRecord* record) = 0;
};

// Records the arrival of a stream's pieces into a RequestRecord.
class StreamTimer {
 public:
  StreamTimer(Clock::time_point origin, RequestRecord* record) : origin_(origin), record_(record) {}

  // Call right before sending.
  void Sent();
  // A chunk carrying `tokens` (>= 1) tokens of content arrived.
  void Content(int tokens);
  // The stream ended (finish message, [DONE], or failure); only the first call counts.
  void Ended();

 private:
  Clock::time_point origin_, sent_, last_;
  bool have_content_ = false, ended_ = false;
  RequestRecord* record_;
};

// "host:port" / "[v6]:port" (common/net.h).
using ::pd::SplitHostPort;

// INVALID_ARGUMENT for a malformed target. No connection is made before the first call.
absl::StatusOr<std::unique_ptr<ApiClient>> MakeGrpcClient(const ClientOptions& options);
absl::StatusOr<std::unique_ptr<ApiClient>> MakeHttpClient(const ClientOptions& options);

}  // namespace pd::bench
