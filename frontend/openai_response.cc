#include "frontend/openai_response.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/strings.h"
#include "frontend/http_server.h"

namespace pd::frontend::openai {

using json = nlohmann::json;

namespace {

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

json Usage(const ApiChunk& last) {
  return json{{"prompt_tokens", last.prompt_tokens},
              {"completion_tokens", last.completion_tokens},
              {"total_tokens", last.prompt_tokens + last.completion_tokens},
              {"prompt_tokens_details", json{{"cached_tokens", last.cached_tokens}}},
              // OpenAI's names for proposed tokens the model accepted or rejected (its
              // Predicted Outputs): here the speculative decoder's draft tokens.
              {"completion_tokens_details",
               json{{"accepted_prediction_tokens", last.accepted_tokens},
                    {"rejected_prediction_tokens", last.draft_tokens - last.accepted_tokens}}}};
}

// One SSE event "data: {...}\n\n" of the stream's object type, with one choice (or none).
std::string Event(const ResponseState& s, json choices, const json* usage) {
  json out = {{"id", s.id},
              {"object", s.api == Api::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", s.created},
              {"model", s.model},
              {"choices", std::move(choices)}};
  // With include_usage, OpenAI sends "usage": null on every chunk but the last.
  if (s.include_usage) out["usage"] = usage != nullptr ? *usage : json(nullptr);
  return pd::StrCat("data: ", Dump(out), "\n\n");
}

json Choice(const ResponseState& s, const std::string& text, const std::vector<int32_t>& token_ids,
            const std::string* finish_reason, bool with_role) {
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

}  // namespace

int StatusOf(const ApiError& e) { return e.http_status ? e.http_status : HttpStatusFor(e.code); }

std::string ErrorJson(const ApiError& e) { return Dump(ErrorBody(e)); }

std::string CompletionJson(const ResponseState& s, const std::string& text,
                           const std::vector<int32_t>& token_ids, const ApiChunk& last) {
  json choice;
  if (s.api == Api::kChat) {
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", text}}},
              {"logprobs", nullptr},
              {"finish_reason", last.finish_reason}};
  } else {
    choice = {
        {"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", last.finish_reason}};
  }
  if (s.include_token_ids) choice["token_ids"] = token_ids;
  json out = {{"id", s.id},
              {"object", s.api == Api::kChat ? "chat.completion" : "text_completion"},
              {"created", s.created},
              {"model", s.model},
              {"choices", json::array({std::move(choice)})},
              {"usage", Usage(last)}};
  return Dump(out);
}

std::string Render(ResponseState& s, const ApiChunk& c) {
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

std::string ModelListJson(const std::vector<ModelCard>& models, int64_t created) {
  json data = json::array();
  for (const ModelCard& m : models) {
    data.push_back({{"id", m.id},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "pdserve"},
                    {"architecture", m.architecture},
                    {"context_length", m.context_length},
                    {"parameters", m.parameters},
                    {"quantization", m.quantization}});
  }
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace pd::frontend::openai
