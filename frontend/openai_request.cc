#include "frontend/openai_request.h"

#include <cctype>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/strings.h"
#include "common/utf8.h"

namespace pd::frontend::openai {

using json = nlohmann::json;

namespace {

ApiError InvalidField(std::string param, std::string message) {
  return ApiError{absl::StatusCode::kInvalidArgument, std::move(message), std::move(param)};
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
                                        "speculative",
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

const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// Whether object `j` has the string `value` at `name`. (json::value(name, "") would throw
// type_error for a non-string there, and an exception escaping a worker ends the process.)
bool HasString(const json& j, const char* name, std::string_view value) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() && it->get_ref<const std::string&>() == value;
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
  if (rf != nullptr && !(rf->is_object() && HasString(*rf, "type", "text"))) {
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
  if (auto e = GetBool(body, "speculative", &r.speculative)) return e;
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
        if (!part.is_object() || !HasString(part, "type", "text") || !part.contains("text") ||
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

}  // namespace

ApiError FromStatus(const absl::Status& status) {
  ApiError e{status.code(), std::string(status.message()), ""};
  e.retry_after_s = RetryAfterSeconds(status);
  if (status.code() == absl::StatusCode::kInvalidArgument) e.param = ParamFromMessage(e.message);
  if (status.code() == absl::StatusCode::kNotFound &&
      e.message.find("model") != std::string::npos) {
    e.param = "model";
  }
  return e;
}

std::optional<ApiError> ParseRequest(Api api, const std::string& body, Parsed* out) {
  json j;
  if (auto e = ParseBody(body, &j)) return e;
  return api == Api::kChat ? ParseChat(j, out) : ParseCompletion(j, out);
}

}  // namespace pd::frontend::openai
