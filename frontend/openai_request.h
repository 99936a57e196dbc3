// The request side of the OpenAI-compatible HTTP API (http_server.h): a JSON request body parsed
// and checked into a frontend::ApiRequest, and ApiError, the error type the HTTP layer answers
// with. Used by pd_http only (its own library, pd_openai_request, so that tests/fuzz can fuzz it
// alone). Stateless functions, safe to call from any thread.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "frontend/frontend.h"

namespace pd::frontend::openai {

// An error as the HTTP layer answers it: a status code (for the HTTP status and `code`), the
// message, and the request field it concerns ("" = none).
struct ApiError {
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string message;
  std::string param;
  int http_status = 0;  // 0: HttpStatusFor(code)
  int retry_after_s = 0;  // > 0: a Retry-After header (overload refusals)
};

// The Frontend's error as the HTTP layer answers it. INVALID_ARGUMENT names the request field its
// message starts with ("temperature must be >= 0 ..." -> "temperature"); NOT_FOUND about the
// model names "model".
ApiError FromStatus(const absl::Status& status);

// The endpoint a request came to: /v1/chat/completions or /v1/completions.
enum class Api { kChat, kCompletion };

// A parsed request body: the request for the Frontend, and the fields the HTTP layer answers
// itself (streaming and its options).
struct Parsed {
  ApiRequest request;
  bool stream = false;
  bool include_usage = false;
  bool include_token_ids = false;
};

// Parses `body` as a request to the `api` endpoint into `*out`. JSON null counts as absent, as in
// OpenAI's API. Returns nullopt, or the INVALID_ARGUMENT error naming the field: malformed JSON,
// invalid UTF-8, a field of the wrong type or out of range, a missing required field, an OpenAI
// field pdserve does not implement set to a value that would change the result.
std::optional<ApiError> ParseRequest(Api api, const std::string& body, Parsed* out);

}  // namespace pd::frontend::openai
