#include "frontend/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"

namespace pd::frontend {

using json = nlohmann::json;

namespace {

constexpr const char* kJsonType = "application/json";

// ---------------------------------------------------------------------------------------------
// Errors

// An error as the HTTP layer answers it: a status code (for the HTTP status and `code`), the
// message, and the request field it concerns ("" = none).
struct ApiError {
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string message;
  std::string param;
  int http_status = 0;  // 0: HttpStatusFor(code)
};

ApiError InvalidField(std::string param, std::string message) {
  return ApiError{absl::StatusCode::kInvalidArgument, std::move(message), std::move(param)};
}

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
    case 413:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

int StatusOf(const ApiError& e) { return e.http_status ? e.http_status : HttpStatusFor(e.code); }

json ErrorBody(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", ErrorType(StatusOf(e))},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", absl::StatusCodeToString(e.code)}}}};
}

std::string Dump(const json& j) {
  // Generated text is valid UTF-8 by the Frontend's contract; `replace` keeps a bug there from
  // turning into an exception here.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The request fields a Frontend error message may start with ("temperature must be >= 0 ...").
// The leading field name becomes the error's `param`.
std::string ParamFromMessage(std::string_view message) {
  static const char* const kFields[] = {"model",
                                        "messages",
                                        "prompt",
                                        "temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "repetition_penalty",
                                        "seed",
                                        "max_tokens",
                                        "max_completion_tokens",
                                        "stop",
                                        "priority",
                                        "request_id",
                                        "ignore_eos",
                                        "stream_options",
                                        "n"};
  size_t end = 0;
  while (end < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '_' ||
          message[end] == '.' || message[end] == '[' || message[end] == ']')) {
    ++end;
  }
  const std::string_view token = message.substr(0, end);
  for (const char* field : kFields) {
    const std::string_view f(field);
    if (token == f || (token.size() > f.size() && token.substr(0, f.size()) == f &&
                       (token[f.size()] == '[' || token[f.size()] == '.'))) {
      return std::string(token);
    }
  }
  return "";
}

ApiError FromStatus(const absl::Status& status) {
  ApiError e{status.code(), std::string(status.message()), ""};
  if (status.code() == absl::StatusCode::kInvalidArgument) e.param = ParamFromMessage(e.message);
  if (status.code() == absl::StatusCode::kNotFound &&
      e.message.find("model") != std::string::npos) {
    e.param = "model";
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// UTF-8 (FirstInvalidUtf8: common/utf8.h)

// Path of the first string (value or key) in `j` that contains a NUL character, e.g.
// "messages[0].content"; "" when none.
std::string FindNulString(const json& j, const std::string& path) {
  if (j.is_string()) {
    return j.get_ref<const std::string&>().find('\0') != std::string::npos ? path : "";
  }
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      std::string p = FindNulString(j[i], pd::StrCat(path, "[", i, "]"));
      if (!p.empty()) return p;
    }
  } else if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      const std::string child = path.empty() ? key : pd::StrCat(path, ".", key);
      if (key.find('\0') != std::string::npos) return child;
      std::string p = FindNulString(value, child);
      if (!p.empty()) return p;
    }
  }
  return "";
}

// The error for a body that is not valid UTF-8. To name the field, the invalid bytes are replaced
// by a JSON escape of NUL and the body parsed again: the string holding a NUL is the culprit.
ApiError InvalidUtf8Error(std::string_view body, size_t first_bad) {
  std::string patched;
  patched.reserve(body.size() + 16);
  size_t i = 0;
  while (i < body.size()) {
    const size_t bad = FirstInvalidUtf8(body.substr(i));
    if (bad == std::string_view::npos) {
      patched.append(body.substr(i));
      break;
    }
    patched.append(body.substr(i, bad));
    patched += "\\u0000";
    i += bad + 1;
  }
  std::string param;
  const json j = json::parse(patched, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) param = FindNulString(j, "");
  if (param.empty()) {
    return InvalidField("", pd::StrCat("request body is not valid UTF-8 (byte ", first_bad, ")"));
  }
  return InvalidField(param, pd::StrCat(param, " is not valid UTF-8"));
}

// ---------------------------------------------------------------------------------------------
// Request parsing. JSON null counts as absent, as in OpenAI's API.

struct Parsed {
  ApiRequest request;
  bool stream = false;
  bool include_usage = false;
  bool include_token_ids = false;
};

const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> GetString(const json& body, const char* name, std::string* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return std::nullopt;
  if (!f->is_string()) return InvalidField(name, pd::StrCat(name, " must be a string"));
  *out = f->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json& body, const char* name, bool* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return std::nullopt;
  if (!f->is_boolean()) return InvalidField(name, pd::StrCat(name, " must be a boolean"));
  *out = f->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetFloat(const json& body, const char* name, std::optional<float>* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return std::nullopt;
  if (!f->is_number()) return InvalidField(name, pd::StrCat(name, " must be a number"));
  *out = f->get<float>();
  return std::nullopt;
}

// Integers must be JSON integers within [lo, hi]; 2.0 is refused like OpenAI does.
std::optional<ApiError> GetInt(const json& body, const char* name, int64_t lo, int64_t hi,
                               std::optional<int64_t>* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return std::nullopt;
  if (!f->is_number_integer()) {
    return InvalidField(name, pd::StrCat(name, " must be an integer"));
  }
  if (f->is_number_unsigned() && f->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return InvalidField(name, pd::StrCat(name, " must be <= ", hi));
  }
  const int64_t v = f->get<int64_t>();
  if (v < lo || v > hi) {
    return InvalidField(name, pd::StrCat(name, " must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return std::nullopt;
}

// OpenAI fields pdserve does not implement: refused when set to a value that would change the
// result, so that a client never silently gets something else than it asked for.
std::optional<ApiError> RefuseUnsupported(const json& body) {
  for (const char* name : {"frequency_penalty", "presence_penalty"}) {
    const json* f = Field(body, name);
    if (f != nullptr && !(f->is_number() && f->get<double>() == 0)) {
      return InvalidField(name, pd::StrCat(name, " is not supported (use repetition_penalty)"));
    }
  }
  for (const char* name : {"logprobs", "echo"}) {
    const json* f = Field(body, name);
    if (f != nullptr && !(f->is_boolean() && !f->get<bool>())) {
      return InvalidField(name, pd::StrCat(name, " is not supported"));
    }
  }
  // Unset-equivalents ([], {}, "", 0) pass: some clients always send them.
  for (const char* name : {"top_logprobs", "tools", "functions", "logit_bias", "suffix"}) {
    const json* f = Field(body, name);
    if (f == nullptr) continue;
    const bool unset = ((f->is_array() || f->is_object()) && f->empty()) ||
                       (f->is_string() && f->get_ref<const std::string&>().empty()) ||
                       (f->is_number() && f->get<double>() == 0);
    if (!unset) return InvalidField(name, pd::StrCat(name, " is not supported"));
  }
  const json* rf = Field(body, "response_format");
  if (rf != nullptr && !(rf->is_object() && rf->value("type", "") == "text")) {
    return InvalidField("response_format",
                        "response_format: only {\"type\": \"text\"} is supported");
  }
  return std::nullopt;
}

// Fields common to both endpoints.
std::optional<ApiError> ParseCommon(const json& body, Parsed* p) {
  ApiRequest& r = p->request;
  if (auto e = GetString(body, "model", &r.model)) return e;
  if (auto e = RefuseUnsupported(body)) return e;

  std::optional<int64_t> n;
  if (auto e = GetInt(body, "n", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max(), &n)) {
    return e;
  }
  if (n.has_value() && *n != 1) {
    return InvalidField("n", pd::StrCat("n must be 1 (one choice per request), got ", *n));
  }
  for (const char* name : {"best_of"}) {
    std::optional<int64_t> v;
    if (auto e = GetInt(body, name, 1, 1, &v)) return e;
  }

  // max_completion_tokens is the newer name of max_tokens; both given must agree.
  std::optional<int64_t> max_tokens, max_completion_tokens;
  constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  if (auto e = GetInt(body, "max_tokens", kI32Min, kI32Max, &max_tokens)) return e;
  if (auto e = GetInt(body, "max_completion_tokens", kI32Min, kI32Max, &max_completion_tokens)) {
    return e;
  }
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens) {
    return InvalidField("max_completion_tokens",
                        "max_tokens and max_completion_tokens disagree; send one of them");
  }
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  if (max_tokens) r.max_tokens = static_cast<int32_t>(*max_tokens);

  if (auto e = GetFloat(body, "temperature", &r.temperature)) return e;
  if (auto e = GetFloat(body, "top_p", &r.top_p)) return e;
  if (auto e = GetFloat(body, "min_p", &r.min_p)) return e;
  if (auto e = GetFloat(body, "repetition_penalty", &r.repetition_penalty)) return e;
  std::optional<int64_t> top_k, seed, priority;
  if (auto e = GetInt(body, "top_k", kI32Min, kI32Max, &top_k)) return e;
  if (top_k) r.top_k = static_cast<int32_t>(*top_k);
  if (auto e = GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max(), &seed)) {
    return e;
  }
  if (seed) r.seed = static_cast<uint64_t>(*seed);  // negative seeds wrap: still deterministic
  if (auto e = GetInt(body, "priority", kI32Min, kI32Max, &priority)) return e;
  if (priority) r.priority = static_cast<int32_t>(*priority);
  if (auto e = GetBool(body, "ignore_eos", &r.ignore_eos)) return e;
  if (auto e = GetString(body, "request_id", &r.request_id)) return e;

  if (const json* stop = Field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          return InvalidField(pd::StrCat("stop[", i, "]"),
                              pd::StrCat("stop[", i, "] must be a string"));
        }
        r.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      return InvalidField("stop", "stop must be a string or a list of strings");
    }
  }

  if (auto e = GetBool(body, "stream", &p->stream)) return e;
  if (const json* so = Field(body, "stream_options")) {
    if (!so->is_object()) return InvalidField("stream_options", "stream_options must be an object");
    for (const auto& [name, out] : {std::pair{"include_usage", &p->include_usage},
                                    std::pair{"include_token_ids", &p->include_token_ids}}) {
      if (auto e = GetBool(*so, name, out)) {
        e->param = pd::StrCat("stream_options.", name);
        e->message = pd::StrCat("stream_options.", e->message);
        return e;
      }
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseChat(const json& body, Parsed* p) {
  if (auto e = ParseCommon(body, p)) return e;
  const json* messages = Field(body, "messages");
  if (messages == nullptr) return InvalidField("messages", "messages is required");
  if (!messages->is_array()) return InvalidField("messages", "messages must be a list");
  if (messages->empty()) return InvalidField("messages", "messages must not be empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string at = pd::StrCat("messages[", i, "]");
    if (!m.is_object()) return InvalidField(at, pd::StrCat(at, " must be an object"));
    engine::ChatMessage msg;
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return InvalidField(at + ".role", pd::StrCat(at, ".role must be a string"));
    }
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for system
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      return InvalidField(
          at + ".role",
          pd::StrCat(at, ".role must be \"system\", \"user\" or \"assistant\", got \"", msg.role,
                     "\""));
    }
    const json* content = Field(m, "content");
    if (content == nullptr) {
      return InvalidField(at + ".content", pd::StrCat(at, ".content is required"));
    }
    if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text parts, concatenated.
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pat = pd::StrCat(at, ".content[", k, "]");
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return InvalidField(pat, pd::StrCat(pat,
                                              " must be {\"type\": \"text\", \"text\": string}"
                                              " (only text content is supported)"));
        }
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return InvalidField(at + ".content",
                          pd::StrCat(at, ".content must be a string or a list of text parts"));
    }
    p->request.messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseCompletion(const json& body, Parsed* p) {
  if (auto e = ParseCommon(body, p)) return e;
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return InvalidField("prompt", "prompt is required");
  if (!prompt->is_string()) {
    return InvalidField("prompt",
                        "prompt must be a string (lists of strings or of token ids are not "
                        "supported: send one request per prompt)");
  }
  p->request.prompt = prompt->get<std::string>();
  return std::nullopt;
}

// A SAX consumer that only records the parse error's description.
struct ParseErrorSax : nlohmann::json_sax<json> {
  std::string error = "unexpected end of input";
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
};

// Parses a JSON body into an object; malformed JSON and invalid UTF-8 are 400s.
std::optional<ApiError> ParseBody(const std::string& body, json* out) {
  if (const size_t bad = FirstInvalidUtf8(body); bad != std::string_view::npos) {
    return InvalidUtf8Error(body, bad);
  }
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    ParseErrorSax sax;  // parse again, without exceptions, for the position of the error
    json::sax_parse(body, &sax);
    return InvalidField("", pd::StrCat("request body is not valid JSON: ", sax.error));
  }
  if (!out->is_object()) return InvalidField("", "request body must be a JSON object");
  return std::nullopt;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

enum class Api { kChat, kCompletion };

json Usage(const ApiChunk& last) {
  return json{{"prompt_tokens", last.prompt_tokens},
              {"completion_tokens", last.completion_tokens},
              {"total_tokens", last.prompt_tokens + last.completion_tokens}};
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

absl::Status HttpServerOptions::Validate() const {
  if (threads < 1) return absl::InvalidArgumentError("http threads must be >= 1");
  if (max_body_bytes < 1) return absl::InvalidArgumentError("http max_body_bytes must be >= 1");
  if (request_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http request_timeout must be >= 0");
  }
  if (stream_keepalive <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http stream_keepalive must be > 0");
  }
  for (const std::string& key : api_keys) {
    if (key.empty()) return absl::InvalidArgumentError("http api_keys must not contain \"\"");
  }
  return absl::OkStatus();
}

// The request handlers; one instance per server, shared by its handler threads.
struct HttpServer::Handlers {
  Handlers(const HttpServerOptions& options, Frontend& frontend, MetricsRegistry& registry,
           ServingMetrics* metrics)
      : options(options),
        frontend(frontend),
        registry(registry),
        metrics(metrics),
        http_requests(registry.AddCounter("pdserve_http_requests_total",
                                          "HTTP requests by endpoint and HTTP status.",
                                          {"endpoint", "status"})) {}

  const HttpServerOptions& options;
  Frontend& frontend;
  MetricsRegistry& registry;
  ServingMetrics* metrics;
  Family<Counter>& http_requests;
  std::atomic<bool> stopping{false};

  void Reply(httplib::Response& res, const ApiError& e, bool count) {
    if (count && metrics != nullptr) metrics->Error(e.code);
    res.status = StatusOf(e);
    res.set_content(Dump(ErrorBody(e)), kJsonType);
  }

  // The model name responses carry: the one asked for, else the served model's.
  std::string ServedModel(const ApiRequest& request) {
    if (!request.model.empty()) return request.model;
    const std::vector<ModelCard> models = frontend.Models();
    return models.empty() ? "" : models.front().id;
  }

  void Generate(Api api, const httplib::Request& req, httplib::Response& res) {
    json body;
    if (auto e = ParseBody(req.body, &body)) return Reply(res, *e, true);
    Parsed parsed;
    if (auto e = api == Api::kChat ? ParseChat(body, &parsed) : ParseCompletion(body, &parsed)) {
      return Reply(res, *e, true);
    }
    if (stopping.load()) {
      return Reply(res, ApiError{absl::StatusCode::kUnavailable, "server is shutting down", ""},
                   true);
    }
    if (options.request_timeout > absl::ZeroDuration()) {
      parsed.request.deadline = absl::Now() + options.request_timeout;
    }
    absl::StatusOr<std::unique_ptr<Stream>> started = frontend.Start(parsed.request);
    if (!started.ok()) return Reply(res, FromStatus(started.status()), false);

    auto state = std::make_shared<StreamState>();
    state->api = api;
    state->stream = std::move(started).value();
    state->model = ServedModel(parsed.request);
    state->id = pd::StrCat(api == Api::kChat ? "chatcmpl-" : "cmpl-", state->stream->request_id());
    state->created = absl::ToUnixSeconds(absl::Now());
    state->include_usage = parsed.include_usage;
    state->include_token_ids = parsed.include_token_ids;
    if (parsed.stream) {
      StreamResponse(std::move(state), res);
    } else {
      CompleteResponse(*state, res);
    }
  }

  struct StreamState {
    Api api = Api::kChat;
    std::unique_ptr<Stream> stream;
    std::string model, id;
    int64_t created = 0;
    bool include_usage = false, include_token_ids = false;
    bool sent_role = false;
    bool done = false;
  };

  // Non-streaming: collect the whole text, then answer once.
  void CompleteResponse(StreamState& s, httplib::Response& res) {
    std::string text;
    std::vector<int32_t> token_ids;
    ApiChunk chunk;
    for (;;) {
      ApiChunk c;
      if (!s.stream->Next(&c, absl::Now() + absl::Milliseconds(100))) {
        if (stopping.load()) {
          s.stream->Cancel();
          return Reply(res, ApiError{absl::StatusCode::kUnavailable, "server is shutting down", ""},
                       false);
        }
        continue;
      }
      text += c.text;
      token_ids.insert(token_ids.end(), c.token_ids.begin(), c.token_ids.end());
      if (c.finished) {
        chunk = std::move(c);
        break;
      }
    }
    if (!chunk.status.ok()) return Reply(res, FromStatus(chunk.status), false);
    json choice;
    if (s.api == Api::kChat) {
      choice = {{"index", 0},
                {"message", {{"role", "assistant"}, {"content", text}}},
                {"logprobs", nullptr},
                {"finish_reason", chunk.finish_reason}};
    } else {
      choice = {{"index", 0},
                {"text", text},
                {"logprobs", nullptr},
                {"finish_reason", chunk.finish_reason}};
    }
    if (s.include_token_ids) choice["token_ids"] = token_ids;
    json out = {{"id", s.id},
                {"object", s.api == Api::kChat ? "chat.completion" : "text_completion"},
                {"created", s.created},
                {"model", s.model},
                {"choices", json::array({std::move(choice)})},
                {"usage", Usage(chunk)}};
    res.status = 200;
    res.set_content(Dump(out), kJsonType);
  }

  // One SSE event "data: {...}\n\n" of the stream's object type, with one choice (or none).
  static std::string Event(const StreamState& s, json choices, const json* usage) {
    json out = {{"id", s.id},
                {"object", s.api == Api::kChat ? "chat.completion.chunk" : "text_completion"},
                {"created", s.created},
                {"model", s.model},
                {"choices", std::move(choices)}};
    // With include_usage, OpenAI sends "usage": null on every chunk but the last.
    if (s.include_usage) out["usage"] = usage != nullptr ? *usage : json(nullptr);
    return pd::StrCat("data: ", Dump(out), "\n\n");
  }

  static json Choice(const StreamState& s, const std::string& text,
                     const std::vector<int32_t>& token_ids, const std::string* finish_reason,
                     bool with_role) {
    json choice;
    if (s.api == Api::kChat) {
      json delta = json::object();
      if (with_role) delta["role"] = "assistant";
      if (!text.empty() || with_role) delta["content"] = text;
      choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
    } else {
      choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}};
    }
    choice["finish_reason"] = finish_reason != nullptr ? json(*finish_reason) : json(nullptr);
    if (s.include_token_ids) choice["token_ids"] = token_ids;
    return choice;
  }

  // The SSE text for one chunk of the stream (possibly several events), or "" for nothing.
  static std::string Render(StreamState& s, const ApiChunk& c) {
    std::string out;
    if (!c.finished) {
      if (c.text.empty() && !(s.include_token_ids && !c.token_ids.empty())) return out;
      const bool role = s.api == Api::kChat && !s.sent_role;
      s.sent_role = true;
      return Event(s, json::array({Choice(s, c.text, c.token_ids, nullptr, role)}), nullptr);
    }
    if (!c.status.ok()) {
      // The stream already answered 200: the error travels as an event, which OpenAI clients
      // raise as an APIError.
      return pd::StrCat("data: ", Dump(ErrorBody(FromStatus(c.status))), "\n\ndata: [DONE]\n\n");
    }
    const bool role = s.api == Api::kChat && !s.sent_role;
    s.sent_role = true;
    out += Event(s, json::array({Choice(s, c.text, c.token_ids, &c.finish_reason, role)}), nullptr);
    if (s.include_usage) {
      const json usage = Usage(c);
      out += Event(s, json::array(), &usage);
    }
    out += "data: [DONE]\n\n";
    return out;
  }

  void StreamResponse(std::shared_ptr<StreamState> state, httplib::Response& res) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const absl::Duration keepalive = options.stream_keepalive;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, state, keepalive](size_t /*offset*/, httplib::DataSink& sink) -> bool {
          StreamState& s = *state;
          if (s.done) return false;  // not reached: done() ends the loop
          ApiChunk chunk;
          if (!s.stream->Next(&chunk, absl::Now() + keepalive)) {
            if (stopping.load()) {
              s.stream->Cancel();
              return false;
            }
            // Nothing new: an SSE comment, which fails once the client has gone away.
            if (!sink.write(": keep-alive\n\n", 14)) {
              s.stream->Cancel();
              return false;
            }
            return true;
          }
          const std::string text = Render(s, chunk);
          if (!text.empty() && !sink.write(text.data(), text.size())) {
            s.stream->Cancel();  // the client went away: free its KV now
            return false;
          }
          if (chunk.finished) {
            s.done = true;
            sink.done();
          }
          return true;
        },
        [state](bool /*success*/) {
          // The stream ended or the connection broke: cancelling a finished stream is a no-op.
          state->stream->Cancel();
        });
  }

  void Models(httplib::Response& res) {
    json data = json::array();
    const int64_t created = absl::ToUnixSeconds(absl::Now());
    for (const ModelCard& m : frontend.Models()) {
      data.push_back({{"id", m.id},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "pdserve"},
                      {"architecture", m.architecture},
                      {"context_length", m.context_length},
                      {"parameters", m.parameters},
                      {"quantization", m.quantization}});
    }
    res.set_content(Dump(json{{"object", "list"}, {"data", std::move(data)}}), kJsonType);
  }

  // API keys for /v1/*. Returns true when the request was answered (refused).
  bool Authenticate(const httplib::Request& req, httplib::Response& res) {
    if (options.api_keys.empty() || req.path.rfind("/v1/", 0) != 0) return false;
    // "Authorization: Bearer KEY" (OpenAI clients) or "x-api-key: KEY", as the gRPC API.
    const std::string auth = req.get_header_value("Authorization");
    const std::string x_api_key = req.get_header_value("x-api-key");
    constexpr std::string_view kBearer = "Bearer ";
    std::string_view key = x_api_key;
    if (auth.size() > kBearer.size() &&
        std::string_view(auth).substr(0, kBearer.size()) == kBearer) {
      key = std::string_view(auth).substr(kBearer.size());
    }
    if (!key.empty()) {
      bool ok = false;
      for (const std::string& k : options.api_keys) ok |= ConstantTimeEquals(key, k);
      if (ok) return false;
    }
    Reply(res,
          ApiError{absl::StatusCode::kUnauthenticated,
                   auth.empty() && x_api_key.empty()
                       ? "missing API key: send \"Authorization: Bearer <key>\""
                       : "invalid API key",
                   ""},
          true);
    res.set_header("WWW-Authenticate", "Bearer");
    return true;
  }

  // Error handler: statuses >= 400 that httplib set itself (unknown path, body too large) get an
  // OpenAI-style body; the ones answered above already have theirs.
  void FillError(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      // httplib caps form-encoded bodies (curl -d's default type) at 8 KiB on its own.
      const bool form =
          req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0;
      Reply(res,
            ApiError{absl::StatusCode::kInvalidArgument,
                     form ? std::string("form-encoded request bodies are limited to 8192 bytes: "
                                        "send JSON with \"Content-Type: application/json\"")
                          : pd::StrCat("request body exceeds the limit of ", options.max_body_bytes,
                                       " bytes"),
                     "", 413},
            true);
    } else if (res.status == 404) {
      Reply(res,
            ApiError{absl::StatusCode::kNotFound,
                     pd::StrCat("unknown path: ", req.method, " ", req.path), ""},
            false);
    } else {
      const int status = res.status;
      Reply(res, ApiError{absl::StatusCode::kInvalidArgument, pd::StrCat("HTTP ", status), ""},
            false);
      res.status = status;
    }
  }

  void Count(const httplib::Request& req, const httplib::Response& res) {
    static const char* const kEndpoints[] = {"/v1/chat/completions", "/v1/completions",
                                             "/v1/models", "/health", "/metrics"};
    std::string endpoint = "other";
    for (const char* e : kEndpoints) {
      if (req.path == e) endpoint = e;
    }
    http_requests.WithLabels({endpoint, std::to_string(res.status)}).Increment();
  }
};

HttpServer::HttpServer(HttpServerOptions options, Frontend& frontend, MetricsRegistry& registry,
                       ServingMetrics* metrics)
    : options_(std::move(options)), frontend_(frontend), registry_(registry), metrics_(metrics) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("HTTP server already started");
  PD_RETURN_IF_ERROR(options_.Validate());
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(pd::StrCat("http port must be in [0, 65535], got ", port));
  }
  handlers_ = std::make_unique<Handlers>(options_, frontend_, registry_, metrics_);
  server_ = std::make_unique<httplib::Server>();
  httplib::Server& svr = *server_;
  Handlers* h = handlers_.get();
  const int threads = options_.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(options_.max_body_bytes);
  svr.set_tcp_nodelay(true);  // tokens go out as they are produced

  svr.set_error_handler([h](const httplib::Request& req, httplib::Response& res) {
    h->FillError(req, res);
    h->Count(req, res);
  });
  // Responses are counted before they are written (a logger would run after, racing with the
  // client's next request): successes after routing, errors in the error handler, which sees
  // every status >= 400 including httplib's own.
  svr.set_post_routing_handler([h](const httplib::Request& req, httplib::Response& res) {
    if (res.status < 400) h->Count(req, res);
  });
  // httplib's default adds SO_REUSEPORT, which would let a second server share the port.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // API keys are checked in the handlers, after httplib has read the body: a pre-routing
  // handler runs before that, and the unread body of a refused request would then be parsed as
  // the connection's next request.
  svr.Post("/v1/chat/completions", [h](const httplib::Request& req, httplib::Response& res) {
    if (!h->Authenticate(req, res)) h->Generate(Api::kChat, req, res);
  });
  svr.Post("/v1/completions", [h](const httplib::Request& req, httplib::Response& res) {
    if (!h->Authenticate(req, res)) h->Generate(Api::kCompletion, req, res);
  });
  svr.Get("/v1/models", [h](const httplib::Request& req, httplib::Response& res) {
    if (!h->Authenticate(req, res)) h->Models(res);
  });
  svr.Get("/health", [h](const httplib::Request&, httplib::Response& res) {
    if (h->stopping.load()) {
      h->Reply(res, ApiError{absl::StatusCode::kUnavailable, "shutting down", ""}, false);
    } else {
      res.set_content("{\"status\":\"ok\"}", kJsonType);
    }
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    if (options_.refresh_metrics) options_.refresh_metrics();
    res.set_content(registry_.Render(), "text/plain; version=0.0.4; charset=utf-8");
  });

  int bound = port;
  if (port == 0) {
    bound = svr.bind_to_any_port(host);
    if (bound <= 0) {
      server_.reset();
      return absl::UnavailableError(pd::StrCat("cannot bind HTTP to ", host, ":any"));
    }
  } else if (!svr.bind_to_port(host, port)) {
    server_.reset();
    return absl::UnavailableError(pd::StrCat("cannot bind HTTP to ", host, ":", port));
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() is a no-op until the accept loop runs: wait for it, so that a Stop() right
  // after Start() cannot leave the loop running forever.
  while (!server_->is_running()) absl::SleepFor(absl::Milliseconds(1));
  return bound;
}

void HttpServer::Stop() {
  if (server_ == nullptr) return;
  handlers_->stopping.store(true);
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace pd::frontend
