#include "frontend/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "frontend/openai_request.h"
#include "frontend/openai_response.h"

namespace pd::frontend {

using openai::Api;
using openai::ApiError;
using openai::FromStatus;
using openai::kJsonType;

namespace {

constexpr int kListenBacklog = 1024;  // connections waiting for accept()

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
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
    res.status = openai::StatusOf(e);
    res.set_content(openai::ErrorJson(e), kJsonType);
  }

  // The model name responses carry: the one asked for, else the served model's.
  std::string ServedModel(const ApiRequest& request) {
    if (!request.model.empty()) return request.model;
    const std::vector<ModelCard> models = frontend.Models();
    return models.empty() ? "" : models.front().id;
  }

  void Generate(Api api, const httplib::Request& req, httplib::Response& res) {
    openai::Parsed parsed;
    if (auto e = openai::ParseRequest(api, req.body, &parsed)) return Reply(res, *e, true);
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
    state->response.api = api;
    state->stream = std::move(started).value();
    state->response.model = ServedModel(parsed.request);
    state->response.id =
        pd::StrCat(api == Api::kChat ? "chatcmpl-" : "cmpl-", state->stream->request_id());
    state->response.created = absl::ToUnixSeconds(absl::Now());
    state->response.include_usage = parsed.include_usage;
    state->response.include_token_ids = parsed.include_token_ids;
    if (parsed.stream) {
      StreamResponse(std::move(state), res);
    } else {
      CompleteResponse(*state, res);
    }
  }

  // One request's response: what it repeats, and the stream the response is read from.
  struct StreamState {
    openai::ResponseState response;
    std::unique_ptr<Stream> stream;
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
    res.status = 200;
    res.set_content(openai::CompletionJson(s.response, text, token_ids, chunk), kJsonType);
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
          const std::string text = openai::Render(s.response, chunk);
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
    const int64_t created = absl::ToUnixSeconds(absl::Now());
    res.set_content(openai::ModelListJson(frontend.Models(), created), kJsonType);
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
  // httplib's default adds SO_REUSEPORT, which would let a second server share the port. The
  // last socket httplib set up is the one it bound (it closes the candidates that fail).
  auto listen_socket = std::make_shared<socket_t>(INVALID_SOCKET);
  svr.set_socket_options([listen_socket](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    *listen_socket = sock;
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
  // Debian's cpp-httplib is a compiled library that listens with a backlog of 5
  // (CPPHTTPLIB_LISTEN_BACKLOG is fixed inside it): 64 clients connecting at once overflowed
  // the accept queue, the kernel dropped their SYNs, and pd-bench saw a third of a 64-stream
  // burst fail with a read error after the 1 s SYN retry. listen() again on the bound socket
  // raises the backlog (capped by net.core.somaxconn).
  if (*listen_socket != INVALID_SOCKET && ::listen(*listen_socket, kListenBacklog) != 0) {
    PD_LOG(kWarning, "HTTP: could not raise the listen backlog to ", kListenBacklog,
           " (errno ", errno, "); bursts of connections may be dropped");
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