// The OpenAI-compatible HTTP API of a serving process (docs/api.md, "HTTP"), on cpp-httplib:
//
//   POST /v1/chat/completions   chat.completion, or with "stream": true chat.completion.chunk SSE
//   POST /v1/completions        text_completion, or its SSE stream
//   GET  /v1/models             the served models
//   GET  /health                200 {"status":"ok"} while serving
//   GET  /metrics               the registry in Prometheus text format 0.0.4
//
// Requests are parsed into a frontend::ApiRequest and handed to the Frontend, the same one the gRPC
// service uses, so both APIs validate alike. Errors are OpenAI-style JSON
// {"error": {"message", "type", "param", "code"}} with the HTTP status of the absl::StatusCode
// (HttpStatusFor). A client that disconnects during a stream cancels its request, which frees its
// KV cache.
//
// This file and http_server.cc hold the server (routes, API keys, the streaming loop); the OpenAI
// JSON is parsed in openai_request.h and rendered in openai_response.h.
//
// Ownership: the server borrows the Frontend, the registry and the ServingMetrics; they must
// outlive it. Threads: Start() runs cpp-httplib's accept loop on a thread the server owns, and
// requests on a pool of `options.threads` handler threads (a streaming response holds its thread
// until the stream ends). Stop() (or the destructor) stops accepting and joins them all.
// Start/Stop are called from one owner thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "frontend/frontend.h"
#include "frontend/serving_metrics.h"

namespace httplib {
class Server;
}

namespace pd::frontend {

struct HttpServerOptions {
  // Handler threads: concurrent requests (each stream holds one until it ends; further
  // connections wait for a free thread). Keep it above the scheduler's max_running_seqs (32 by
  // default) so that every running sequence can stream at once.
  int threads = 64;
  // Request bodies above this many bytes are refused with 413 before they are parsed.
  size_t max_body_bytes = 1 << 20;
  // When non-empty, /v1/* requires one of these keys in "Authorization: Bearer <key>" or
  // "x-api-key: <key>" (401 otherwise). /health and /metrics stay open.
  std::vector<std::string> api_keys;
  // Deadline of each generation request (0 = none); past it the request ends with 504.
  absl::Duration request_timeout = absl::ZeroDuration();
  // Idle streams send an SSE comment line this often; a client that went away is then noticed
  // (the write fails) and its request cancelled, also while it waits in the queue.
  absl::Duration stream_keepalive = absl::Milliseconds(200);
  // Called before each /metrics rendering, e.g. to feed GenerationEngine::Load() into
  // ServingMetrics::Load(). May be empty.
  std::function<void()> refresh_metrics;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// The HTTP status of a status code: INVALID_ARGUMENT / FAILED_PRECONDITION / OUT_OF_RANGE 400,
// UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS 409,
// RESOURCE_EXHAUSTED 429, CANCELLED 499, UNIMPLEMENTED 501, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, everything else 500.
int HttpStatusFor(absl::StatusCode code);

class HttpServer {
 public:
  // `metrics` may be null; when set, requests refused by the HTTP layer itself (malformed JSON,
  // bad field types, API key, body size) are counted in pdserve_errors_total. Requests that
  // reach the Frontend are counted by it.
  HttpServer(HttpServerOptions options, Frontend& frontend, MetricsRegistry& registry,
             ServingMetrics* metrics = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: any free port) and starts serving. Returns the bound port.
  // Registers pdserve_http_requests_total in the registry: one HttpServer per registry.
  // Errors: INVALID_ARGUMENT (bad options), UNAVAILABLE (cannot bind), FAILED_PRECONDITION
  // (already started).
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, ends the streams in progress (their requests are cancelled) and joins the
  // threads. Idempotent.
  void Stop();

 private:
  struct Handlers;

  HttpServerOptions options_;
  Frontend& frontend_;
  MetricsRegistry& registry_;
  ServingMetrics* metrics_;
  std::unique_ptr<Handlers> handlers_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
};

}  // namespace pd::frontend
