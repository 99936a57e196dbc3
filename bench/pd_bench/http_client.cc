// ApiClient over the OpenAI-compatible HTTP API: POST /v1/completions (or /v1/chat/completions)
// with "stream": true, the body read as server-sent events by cpp-httplib's content receiver.
// One connection per request (opened inside the timed interval; on loopback that is tens of µs).
#include <httplib.h>

#include "bench/pd_bench/client.h"
#include "frontend/openai_stream.h"
#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace pd::bench {
namespace {

using frontend::OpenAiChunk;
using frontend::ParseOpenAiData;
using frontend::SseEvent;
using frontend::SseParser;

class HttpClient final : public ApiClient {
 public:
  HttpClient(const ClientOptions& options, std::string host, int port)
      : options_(options), host_(std::move(host)), port_(port) {}

  absl::StatusOr<std::string> Probe() override {
    httplib::Client cli(host_, port_);
    cli.set_connection_timeout(10);
    cli.set_read_timeout(10);
    const httplib::Result res = cli.Get("/v1/models");
    if (!res) {
      return absl::UnavailableError(pd::StrCat("GET http://", options_.target,
                                               "/v1/models: ", httplib::to_string(res.error())));
    }
    if (res->status != 200) {
      return absl::UnavailableError(pd::StrCat("GET http://", options_.target, "/v1/models: HTTP ",
                                               res->status, ": ", res->body.substr(0, 300)));
    }
    const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array()) {
      return absl::UnavailableError(
          pd::StrCat("GET http://", options_.target, "/v1/models: not an OpenAI model list"));
    }
    for (const nlohmann::json& m : j["data"]) {
      if (m.is_object() && m.contains("id") && m["id"].is_string()) {
        return m["id"].get<std::string>();
      }
    }
    return absl::NotFoundError(pd::StrCat(options_.target, " lists no model"));
  }

  void SetModel(const std::string& model) override { options_.model = model; }

  void Run(const BenchRequest& request, Clock::time_point origin, RequestRecord* record) override {
    nlohmann::json body;
    if (!options_.model.empty()) body["model"] = options_.model;
    if (!request.messages.empty()) {
      body["messages"] = nlohmann::json::array();
      for (const ChatMessage& m : request.messages) {
        body["messages"].push_back({{"role", m.role}, {"content", m.content}});
      }
    } else if (options_.chat) {
      body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt}}});
    } else {
      body["prompt"] = request.prompt;
    }
    body["max_tokens"] = request.max_tokens;
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    // Not in OpenAI's API: pdserve's (and vLLM's) extension that keeps generating past EOS, so
    // that every request produces exactly max_tokens tokens.
    body["ignore_eos"] = true;
    if (options_.temperature) body["temperature"] = *options_.temperature;

    httplib::Client cli(host_, port_);
    const auto timeout = std::chrono::duration<double>(options_.timeout_s);
    cli.set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    cli.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    cli.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));

    int http_status = 0;
    std::string error_body;
    SseParser parser;
    bool done = false, finished = false;
    StreamTimer timer(origin, record);
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    bool timed_out = false;

    const auto on_event = [&](const SseEvent& ev) {
      if (done || !record->error.empty()) return;
      absl::StatusOr<OpenAiChunk> chunk = ParseOpenAiData(ev.data);
      if (!chunk.ok()) {
        record->error = "bad_stream";
        record->error_message = std::string(chunk.status().message());
        return;
      }
      if (chunk->done) {
        timer.Ended();
        done = true;
        return;
      }
      if (chunk->error) {
        timer.Ended();
        record->error = pd::StrCat("stream_error:", chunk->error_code);
        record->error_message = chunk->error_message;
        return;
      }
      if (!chunk->text.empty()) {
        timer.Content(1);
        if (request.keep_text) record->text += chunk->text;
      }
      if (!chunk->finish_reason.empty()) {
        finished = true;
        record->finish_reason = chunk->finish_reason;
      }
      if (chunk->prompt_tokens) record->prompt_tokens = chunk->prompt_tokens;
      if (chunk->completion_tokens) record->completion_tokens = chunk->completion_tokens;
      if (chunk->cached_tokens) record->cached_tokens = chunk->cached_tokens;
    };

    httplib::Request req;
    req.method = "POST";
    req.path =
        options_.chat || !request.messages.empty() ? "/v1/chat/completions" : "/v1/completions";
    req.set_header("Accept", "text/event-stream");
    req.set_header("Content-Type", "application/json");
    req.body = body.dump();
    req.response_handler = [&](const httplib::Response& res) {
      http_status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (http_status != 200) {
        if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(n, 4096));
        return true;
      }
      parser.Feed(std::string_view(data, n), on_event);
      if (Clock::now() > deadline) {
        timed_out = true;
        return false;
      }
      // Stop reading once the stream failed; the server sees the connection close.
      return record->error.empty();
    };

    timer.Sent();
    const httplib::Result res = cli.send(req);
    if (http_status == 200) parser.Finish(on_event);
    timer.Ended();

    if (!record->error.empty()) {
      record->ok = false;
    } else if (timed_out) {
      record->error = "timeout";
      record->error_message = pd::StrCat("no end of stream within ", options_.timeout_s, " s");
    } else if (http_status != 0 && http_status != 200) {
      record->error = pd::StrCat("http_", http_status);
      record->error_message = ErrorMessage(error_body);
    } else if (!res) {
      record->error = pd::StrCat("transport:", httplib::to_string(res.error()));
      record->error_message = pd::StrCat("POST ", req.path, " to ", options_.target, " failed");
    } else if (!done && !finished) {
      record->error = "incomplete_stream";
      record->error_message = "the stream ended without a finish_reason or [DONE]";
    } else {
      record->ok = true;
    }
  }

 private:
  // The "message" of an OpenAI error body, else the body's start.
  static std::string ErrorMessage(const std::string& body) {
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
        j["error"].contains("message") && j["error"]["message"].is_string()) {
      return j["error"]["message"].get<std::string>();
    }
    return body.substr(0, 300);
  }

  ClientOptions options_;  // model set once by SetModel before the requests start
  std::string host_;
  int port_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ApiClient>> MakeHttpClient(const ClientOptions& options) {
  std::string host;
  int port = 0;
  PD_RETURN_IF_ERROR(SplitHostPort(options.target, &host, &port));
  return std::make_unique<HttpClient>(options, host, port);
}

}  // namespace pd::bench
