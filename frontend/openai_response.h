// The response side of the OpenAI-compatible HTTP API (http_server.h), rendered as JSON text:
// chat.completion / text_completion bodies, their chat.completion.chunk / text_completion SSE
// events, the model list, and OpenAI-style error bodies {"error": {"message", "type", "param",
// "code"}}. Internal to pd_http. Stateless functions, safe to call from any thread; a
// ResponseState belongs to one request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "frontend/frontend.h"
#include "frontend/openai_request.h"

namespace pd::frontend::openai {

inline constexpr char kJsonType[] = "application/json";

// The HTTP status of an error: its own when set, else HttpStatusFor(e.code).
int StatusOf(const ApiError& e);
// The error's body: {"error": {"message", "type", "param", "code"}}.
std::string ErrorJson(const ApiError& e);

// What every response to one request repeats, and how far its SSE stream got.
struct ResponseState {
  Api api = Api::kChat;
  std::string model, id;
  int64_t created = 0;
  bool include_usage = false, include_token_ids = false;
  bool sent_role = false;
};

// The non-streaming response: the whole `text` (and its `token_ids`) with the finish reason and
// usage of `last`, the request's final chunk.
std::string CompletionJson(const ResponseState& s, const std::string& text,
                           const std::vector<int32_t>& token_ids, const ApiChunk& last);

// The SSE text for one chunk of the stream (possibly several events, ending with "data: [DONE]"
// after the final chunk), or "" for nothing. A failed final chunk becomes an error event.
std::string Render(ResponseState& s, const ApiChunk& c);

// The /v1/models list, every model `created` at that Unix time.
std::string ModelListJson(const std::vector<ModelCard>& models, int64_t created);

}  // namespace pd::frontend::openai
