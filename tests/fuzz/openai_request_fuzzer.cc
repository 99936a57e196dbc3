// Fuzz target: the OpenAI-compatible request parser (frontend/openai_request.h) and the Frontend
// behind it (frontend/frontend.h), as the HTTP server runs them on a request body.
//
// Input: byte 0 picks the endpoint (bit 0: chat or completion), the chat template (bits 1-2),
// the vocabulary (bit 3: SPM or BPE), how the engine ends the request (bits 4-5) and how the body
// is made (bit 6); then the request body; then the engine's output, token ids as 16-bit values.
// The body is either the input's bytes up to the first NUL byte, or (bit 6) JSON the harness
// writes from the input: objects whose keys are mostly the API's field names and whose values are
// of any JSON type, so that every field meets every type (a byte-level mutator rarely gets from
// {"type": "text"} to {"type": 7}).
//
// What must hold:
//  - ParseRequest never throws or crashes; it fails with INVALID_ARGUMENT and a message, or fills
//    a request whose every string is valid UTF-8 (the body must be, and JSON escapes cannot make
//    it otherwise), whose chat messages have API roles, and that has exactly the input of its
//    endpoint (messages or prompt).
//  - Frontend::Start validates: what it submits to the engine passes the engine's own checks
//    (GenerationEngine::Submit: a non-empty prompt of ids in the vocabulary, 1 <= max_tokens,
//    prompt + max_tokens within the context, valid sampling values). Its errors are statuses.
//  - The Stream turns whatever the engine emits into valid UTF-8 deltas, never shows a stop
//    string, ends exactly once with "stop" or "length" (or the engine's error), and drops the
//    request in the engine when it is destroyed.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/utf8.h"
#include "engine/sched/engine_api.h"
#include "engine/tokenizer/chat_template.h"
#include "frontend/frontend.h"
#include "frontend/openai_request.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_vocab.h"

namespace pd::fuzz {
namespace {

using engine::FinishInfo;
using engine::FinishReason;
using engine::GenerationRequest;
using engine::GenerationSink;
using frontend::openai::Api;
using frontend::openai::ApiError;
using frontend::openai::Parsed;

constexpr int kContext = 256;

// A GenerationEngine that checks what it is given against Submit's documented contract and lets
// the harness play the engine thread.
class FuzzEngine final : public engine::GenerationEngine {
 public:
  explicit FuzzEngine(int n_vocab) : n_vocab_(n_vocab) {}

  absl::Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) override {
    PD_CHECK_MSG(!request.id.empty(), "the front end submitted a request without an id");
    PD_CHECK_MSG(!request.prompt.empty(), "the front end submitted an empty prompt");
    for (int32_t id : request.prompt) {
      PD_CHECK_MSG(id >= 0 && id < n_vocab_, "the front end submitted an id out of range");
    }
    PD_CHECK_MSG(request.max_tokens >= 1, "the front end submitted max_tokens < 1");
    PD_CHECK_MSG(static_cast<int64_t>(request.prompt.size()) + request.max_tokens <= kContext,
                 "the front end submitted a request beyond the context");
    PD_CHECK_MSG(request.sampling.Validate().ok(), "the front end submitted bad sampling");
    PD_CHECK_MSG(sink_ == nullptr, "one request at a time in this harness");
    id_ = request.id;
    sink_ = std::move(sink);
    return absl::OkStatus();
  }
  // Like the real engine: a live request ends with OnFinish(reason); unknown ids are a no-op.
  void Cancel(const std::string& id, FinishReason reason) override {
    if (sink_ == nullptr || id != id_) return;
    FinishInfo info;
    info.reason = reason;
    Finish(info);
  }
  engine::EngineLoad Load() const override { return {}; }
  int max_context() const override { return kContext; }

  int n_vocab() const { return n_vocab_; }
  GenerationSink* sink() { return sink_.get(); }
  void Finish(const FinishInfo& info) {
    std::shared_ptr<GenerationSink> sink = std::move(sink_);
    sink_ = nullptr;
    sink->OnFinish(info);
  }

 private:
  const int n_vocab_;
  std::string id_;
  std::shared_ptr<GenerationSink> sink_;
};

struct Env {
  std::unique_ptr<FuzzEngine> engine;
  std::unique_ptr<frontend::Frontend> frontend;
};

// ---- JSON written from the input (bit 6) --------------------------------------------------

// The names the parser reads (and a few it does not), as object keys.
// clang-format off
constexpr const char* kKeys[] = {
    "model", "messages", "role", "content", "type", "text", "prompt", "temperature", "top_p",
    "top_k", "min_p", "repetition_penalty", "seed", "max_tokens", "max_completion_tokens", "stop",
    "priority", "request_id", "ignore_eos", "speculative", "stream", "stream_options",
    "include_usage", "include_token_ids", "n", "best_of", "frequency_penalty", "presence_penalty",
    "logprobs", "top_logprobs", "echo", "tools", "functions", "logit_bias", "suffix",
    "response_format", "image_url", "name"};
constexpr const char* kStrings[] = {
    "text", "user", "system", "assistant", "developer", "tool", "", "json_object", "tiny",
    "the cat", "\\u0000"};
constexpr const char* kNumbers[] = {
    "0", "1", "-1", "2", "0.5", "1e309", "-0.0", "2147483648", "-2147483649",
    "9223372036854775807", "18446744073709551615", "18446744073709551616", "1e-400"};
// clang-format on

void JsonString(std::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      *out += "\\u00";
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 15]);
    } else {
      out->push_back(static_cast<char>(c));  // bytes >= 0x80 as they are: maybe not UTF-8
    }
  }
  out->push_back('"');
}

void JsonValue(FuzzInput& in, int depth, std::string* out);

void JsonObject(FuzzInput& in, int depth, std::string* out) {
  out->push_back('{');
  const size_t n = in.Pick(6);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out->push_back(',');
    const size_t k = in.Pick(std::size(kKeys) + 1);
    JsonString(k < std::size(kKeys) ? std::string_view(kKeys[k]) : in.Short(), out);
    out->push_back(':');
    JsonValue(in, depth + 1, out);
  }
  out->push_back('}');
}

void JsonValue(FuzzInput& in, int depth, std::string* out) {
  switch (in.Pick(depth >= 4 ? 6 : 8)) {
    case 0:
      *out += "null";
      break;
    case 1:
      *out += in.Bool() ? "true" : "false";
      break;
    case 2:
      *out += std::to_string(static_cast<int64_t>(in.Int<uint32_t>()) - (int64_t{1} << 31));
      break;
    case 3:
      *out += kNumbers[in.Pick(std::size(kNumbers))];
      break;
    case 4:
      JsonString(in.Short(), out);
      break;
    case 5:
      out->push_back('"');
      *out += kStrings[in.Pick(std::size(kStrings))];
      out->push_back('"');
      break;
    case 6: {
      out->push_back('[');
      const size_t n = in.Pick(4);
      for (size_t i = 0; i < n; ++i) {
        if (i > 0) out->push_back(',');
        JsonValue(in, depth + 1, out);
      }
      out->push_back(']');
      break;
    }
    case 7:
      JsonObject(in, depth, out);
      break;
  }
}

// One Frontend per (vocabulary, template), built on first use.
Env& GetEnv(bool bpe, engine::ChatTemplateKind kind) {
  static Env* envs = new Env[8];
  Env& e = envs[(bpe ? 4 : 0) + static_cast<int>(kind)];
  if (e.frontend == nullptr) {
    const engine::Tokenizer& tok = GetTokenizer(bpe ? FuzzVocab::kBpeQwen2 : FuzzVocab::kSpm);
    e.engine = std::make_unique<FuzzEngine>(tok.n_vocab());
    e.frontend = frontend::MakeLocalFrontend(frontend::FrontendOptions(), *e.engine, tok, kind,
                                             frontend::ModelCard{"tiny", "llama", kContext, 0, ""},
                                             /*metrics=*/nullptr);
  }
  return e;
}

void CheckParsed(Api api, const Parsed& p) {
  const frontend::ApiRequest& r = p.request;
  PD_CHECK(IsValidUtf8(r.model) && IsValidUtf8(r.request_id));
  for (const std::string& s : r.stop) PD_CHECK(IsValidUtf8(s));
  if (api == Api::kChat) {
    PD_CHECK_MSG(!r.messages.empty() && !r.prompt.has_value(), "a chat request without messages");
    for (const engine::ChatMessage& m : r.messages) {
      PD_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant");
      PD_CHECK(IsValidUtf8(m.content));
    }
  } else {
    PD_CHECK_MSG(r.prompt.has_value() && r.messages.empty(), "a completion without a prompt");
    PD_CHECK(IsValidUtf8(*r.prompt));
  }
}

// Starts the parsed request on the Frontend, plays the engine with `output`, reads the stream.
void RunFrontend(Env& env, const Parsed& p, FinishReason end, FuzzInput& output) {
  absl::StatusOr<std::unique_ptr<frontend::Stream>> stream = env.frontend->Start(p.request);
  if (!stream.ok()) {
    PD_CHECK(!stream.status().message().empty());
    PD_CHECK_MSG(env.engine->sink() == nullptr, "a refused request reached the engine");
    return;
  }
  PD_CHECK_MSG(env.engine->sink() != nullptr, "a started request never reached the engine");
  std::string text;
  bool finished = false;
  auto drain = [&] {
    frontend::ApiChunk c;
    while (!finished && (*stream)->Next(&c, absl::InfinitePast())) {
      PD_CHECK_MSG(IsValidUtf8(c.text), "a stream chunk is not valid UTF-8");
      text += c.text;
      if (c.finished) {
        finished = true;
        if (c.status.ok()) PD_CHECK(c.finish_reason == "stop" || c.finish_reason == "length");
      }
    }
  };
  int emitted = 0;
  while (!output.empty() && env.engine->sink() != nullptr) {
    std::vector<int32_t> step;
    const size_t n = 1 + output.Pick(4);
    for (size_t i = 0; i < n && !output.empty(); ++i) {
      step.push_back(static_cast<int32_t>(output.Int<uint16_t>() % env.engine->n_vocab()));
    }
    env.engine->sink()->OnTokens(step);
    emitted += static_cast<int>(step.size());
    drain();  // a stop string may have cancelled the request here
  }
  if (env.engine->sink() != nullptr) {
    FinishInfo info;
    info.reason = end;
    info.completion_tokens = emitted;
    if (end == FinishReason::kError) info.status = absl::ResourceExhaustedError("fuzz: preempted");
    env.engine->Finish(info);
  }
  drain();
  PD_CHECK_MSG(finished, "the stream did not end after the engine's finish");
  for (const std::string& s : p.request.stop) {
    PD_CHECK_MSG(text.find(s) == std::string::npos, "a stop string reached the client");
  }
  stream->reset();
  PD_CHECK(env.engine->sink() == nullptr);
}

}  // namespace

int FuzzOpenAiRequest(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const uint8_t head = in.Byte();
  const Api api = head & 1 ? Api::kCompletion : Api::kChat;
  const auto kind = static_cast<engine::ChatTemplateKind>((head >> 1) & 3);
  const bool bpe = (head & 8) != 0;
  static const FinishReason kEnds[] = {FinishReason::kLength, FinishReason::kStop,
                                       FinishReason::kError, FinishReason::kDeadline};
  const FinishReason end = kEnds[(head >> 4) & 3];
  std::string body;
  if (head & 0x40) {
    JsonObject(in, 0, &body);
  } else {
    body = std::string(in.Until('\0'));
  }

  Parsed parsed;
  const std::optional<ApiError> error = frontend::openai::ParseRequest(api, body, &parsed);
  if (error.has_value()) {
    PD_CHECK(error->code == absl::StatusCode::kInvalidArgument);
    PD_CHECK(!error->message.empty());
    return 0;
  }
  CheckParsed(api, parsed);
  RunFrontend(GetEnv(bpe, kind), parsed, end, in);
  return 0;
}

}  // namespace pd::fuzz
