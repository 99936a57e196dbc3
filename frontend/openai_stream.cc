#include "frontend/openai_stream.h"

#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace pd::frontend {

void SseParser::Feed(std::string_view bytes, const Callback& on_event) {
  for (const char c : bytes) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') continue;
    }
    if (c == '\r' || c == '\n') {
      skip_lf_ = c == '\r';
      Line(line_, on_event);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::Finish(const Callback& on_event) {
  if (!line_.empty()) {
    Line(line_, on_event);
    line_.clear();
  }
  Line("", on_event);
  skip_lf_ = false;
}

void SseParser::Line(std::string_view line, const Callback& on_event) {
  if (line.empty()) {
    if (has_data_) on_event(pending_);
    pending_ = SseEvent();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment (keep-alive)
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) pending_.data.push_back('\n');
    pending_.data.append(value.data(), value.size());
    has_data_ = true;
  } else if (field == "event") {
    pending_.event = std::string(value);
  }
}

absl::StatusOr<OpenAiChunk> ParseOpenAiData(std::string_view data) {
  OpenAiChunk chunk;
  std::string_view trimmed = data;
  while (!trimmed.empty() && (trimmed.back() == ' ' || trimmed.back() == '\n')) {
    trimmed.remove_suffix(1);
  }
  if (trimmed == "[DONE]") {
    chunk.done = true;
    return chunk;
  }
  const nlohmann::json j =
      nlohmann::json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        pd::StrCat("stream data is not a JSON object: '", data.substr(0, 200), "'"));
  }
  const auto string_of = [](const nlohmann::json& obj, const char* key) -> std::string {
    const auto it = obj.find(key);
    if (it == obj.end()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return pd::StrCat(it->get<int64_t>());
    return "";
  };
  if (const auto err = j.find("error"); err != j.end()) {
    chunk.error = true;
    if (err->is_object()) {
      chunk.error_code = string_of(*err, "code");
      if (chunk.error_code.empty()) chunk.error_code = string_of(*err, "type");
      chunk.error_message = string_of(*err, "message");
    } else if (err->is_string()) {
      chunk.error_message = err->get<std::string>();
    }
    if (chunk.error_code.empty()) chunk.error_code = "error";
    return chunk;
  }
  if (const auto choices = j.find("choices");
      choices != j.end() && choices->is_array() && !choices->empty() && (*choices)[0].is_object()) {
    const nlohmann::json& choice = (*choices)[0];
    if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
      chunk.text = string_of(*delta, "content");
    } else {
      chunk.text = string_of(choice, "text");
    }
    chunk.finish_reason = string_of(choice, "finish_reason");
  }
  if (const auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    const auto count = [](const nlohmann::json& obj, const char* key) -> std::optional<int> {
      const auto it = obj.find(key);
      if (it == obj.end() || !it->is_number_integer()) return std::nullopt;
      return static_cast<int>(it->get<int64_t>());
    };
    chunk.prompt_tokens = count(*usage, "prompt_tokens");
    chunk.completion_tokens = count(*usage, "completion_tokens");
    if (const auto details = usage->find("prompt_tokens_details");
        details != usage->end() && details->is_object()) {
      chunk.cached_tokens = count(*details, "cached_tokens");
    }
  }
  return chunk;
}

}  // namespace pd::frontend
