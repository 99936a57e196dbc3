// The client side of the OpenAI-compatible streaming API: server-sent events (text/event-stream),
// as OpenAI-compatible servers stream completions, and the OpenAI stream chunk format carried in
// their `data:` fields. Read by pd-bench and `pdctl up --complete`.
//
// Thread safety: SseParser is used by one thread; ParseOpenAiData is a pure function.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pd::frontend {

struct SseEvent {
  std::string event;  // the `event:` field; "" when absent ("message")
  std::string data;   // `data:` lines joined with '\n'
};

// Incremental text/event-stream parser (WHATWG HTML, "event stream interpretation"): bytes may be
// split anywhere between Feed calls. Lines end in "\n", "\r\n" or "\r"; `data:` lines (one space
// after the colon is dropped) accumulate into the event's data, `event:` sets its name, comment
// lines (":...") and other fields are ignored, and a blank line dispatches an event that has data.
class SseParser {
 public:
  using Callback = std::function<void(const SseEvent&)>;

  // Parses `bytes`, calling `on_event` for every event completed by them.
  void Feed(std::string_view bytes, const Callback& on_event);
  // End of the body: a last line without its line end, and a last event without its blank line,
  // are taken as if they had been terminated (more lenient than the standard, which drops them).
  void Finish(const Callback& on_event);

 private:
  void Line(std::string_view line, const Callback& on_event);

  std::string line_;      // the current, unterminated line
  bool skip_lf_ = false;  // the previous byte was '\r': a following '\n' ends nothing
  SseEvent pending_;
  bool has_data_ = false;
};

// One `data:` payload of an OpenAI-style completions / chat completions stream.
struct OpenAiChunk {
  bool done = false;                 // the "[DONE]" sentinel
  std::string text;                  // choices[0].delta.content (chat) or choices[0].text
  std::string finish_reason;         // "" until the choice finishes
  std::optional<int> prompt_tokens;  // from "usage", when the chunk carries it
  std::optional<int> completion_tokens;
  // usage.prompt_tokens_details.cached_tokens: prompt tokens the server took from its prefix
  // cache. Unset when the server does not report it, which is not the same as 0.
  std::optional<int> cached_tokens;
  // An in-stream {"error": {...}}: `error_code` is its "code" (string or number) or else its
  // "type", "error" when it has neither; `error_message` its "message".
  bool error = false;
  std::string error_code;
  std::string error_message;
};

// INVALID_ARGUMENT when `data` is neither "[DONE]" nor a JSON object.
absl::StatusOr<OpenAiChunk> ParseOpenAiData(std::string_view data);

}  // namespace pd::frontend
