// The OpenAI-compatible HTTP API of a serving process (docs/api.md, "HTTP"):
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
// (HttpStatusFor); a RESOURCE_EXHAUSTED refusal (overload) carries a Retry-After header.
//
// The server is event-driven (Boost.Beast over Boost.Asio; docs/security.md says why): one event
// loop owns every socket, so an idle, slow or half-open connection costs a socket and a few KiB,
// never a thread. Each connection has deadlines (TLS handshake and request header, body, idle
// keep-alive, each write), the server caps connections in total and per client address, and a
// response stream waits for tokens without holding any thread: the Stream wakes the loop when it
// has data (Stream::SetNotify). A client that goes away (its socket reads EOF or fails), stops
// reading (a write does not finish within write_timeout) or lets unsent text pile up beyond
// max_stream_buffer_bytes cancels its request, which frees its KV cache. With tls_cert_file and
// tls_key_file set the server speaks HTTPS only.
//
// This file and http_server.cc hold the server (connections, routes, API keys, the streaming
// loop); the OpenAI JSON is parsed in openai_request.h and rendered in openai_response.h.
//
// Ownership: the server borrows the Frontend, the registry and the ServingMetrics; they must
// outlive it. Threads: Start() runs `io_threads` event-loop threads and `threads` worker threads
// (JSON parsing, chat template and tokenization in Frontend::Start: the work that may take
// milliseconds stays off the event loop). Stop() (or the destructor) stops accepting, closes every
// connection (cancelling their requests) and joins them all. Start/Stop are called from one owner
// thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "frontend/frontend.h"
#include "frontend/serving_metrics.h"

namespace pd::frontend {

struct HttpServerOptions {
  // Worker threads: parse request JSON, apply the chat template, tokenize and submit. They never
  // wait for tokens, so a few serve any number of streams.
  int threads = 4;
  // Event-loop threads: every socket's reads and writes.
  int io_threads = 1;
  // Request bodies above this many bytes are refused with 413 (from Content-Length before the
  // body is read, else as soon as the limit is crossed); the connection is then closed.
  size_t max_body_bytes = 1 << 20;
  // Request line + headers above this many bytes: 431, connection closed.
  size_t max_header_bytes = 16 << 10;
  // Open connections at once, in total and per client IP address (0 = no per-address cap). A
  // connection beyond a cap gets a 503 with Retry-After and is closed at once. The total is
  // lowered at Start() to what the process's open-file limit allows.
  int max_connections = 4096;
  int max_connections_per_address = 512;
  // A new connection must deliver its TLS handshake and its first request's header within
  // header_timeout; a body must arrive within body_timeout of its header; between requests a
  // keep-alive connection may stay idle for idle_timeout (the next header must be complete by
  // then). Past a deadline the connection is closed (pdserve_http_timeouts_total{phase}).
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  absl::Duration idle_timeout = absl::Seconds(60);
  // A write that has not completed this long means a client that stopped reading: the
  // connection is closed and its request cancelled.
  absl::Duration write_timeout = absl::Seconds(10);
  // Response text of one stream waiting for a slow reader beyond this: the request is cancelled.
  size_t max_stream_buffer_bytes = 1 << 20;
  // SO_SNDBUF of a connection once it streams (0: the kernel's autotuned buffer, up to 4 MiB on
  // Linux, which a token stream takes minutes to fill). Small enough that a client that stops
  // reading stalls a write within seconds, and write_timeout then notices it.
  int stream_send_buffer_bytes = 64 << 10;
  // PEM files; both set: HTTPS only (TLS 1.2+). Both empty: plain HTTP.
  std::string tls_cert_file, tls_key_file;
  // When non-empty, /v1/* requires one of these keys in "Authorization: Bearer <key>" or
  // "x-api-key: <key>" (401 otherwise), compared in constant time. /health and /metrics stay open.
  std::vector<std::string> api_keys;
  // Deadline of each generation request (0 = none); past it the request ends with 504.
  absl::Duration request_timeout = absl::ZeroDuration();
  // An idle stream sends an SSE comment line this often, which keeps proxies from timing it out.
  // (A client that goes away is noticed at once from its socket, without waiting for this.)
  absl::Duration stream_keepalive = absl::Seconds(15);
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
  // Registers the pdserve_http_* metrics in the registry: one HttpServer per registry.
  // Errors: INVALID_ARGUMENT (bad options, unreadable TLS files), UNAVAILABLE (cannot bind),
  // FAILED_PRECONDITION (already started).
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, closes every connection (streams in progress are cancelled) and joins the
  // threads. Idempotent.
  void Stop();

  // The connections' shared state (http_server.cc).
  struct Core;

 private:

  HttpServerOptions options_;
  Frontend& frontend_;
  MetricsRegistry& registry_;
  ServingMetrics* metrics_;
  std::unique_ptr<Core> core_;
};

}  // namespace pd::frontend
