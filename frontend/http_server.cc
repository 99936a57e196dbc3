// The event-driven HTTP server (http_server.h): connections on Boost.Asio sockets, HTTP/1.1
// parsing by Boost.Beast, responses formatted here.
//
// A connection is a Session on its own strand. Its life: (TLS handshake) -> read a request header
// (deadline) -> read its body (deadline) -> route. Once a request is read, the session at once
// starts reading the next request's header with no deadline: that read notices a client that
// goes away while its response is generated (EOF or reset), and picks up a pipelined request.
// When the response is written, that pending read gets the idle deadline.
//
// Generation requests go to the worker pool (parse, Frontend::Start), then back to the session,
// which registers Stream::SetNotify: the engine's thread posts a wake-up to the session's strand,
// and the session drains the stream without blocking (Next with a past deadline). SSE text is
// written with chunked transfer coding; at most one write is in flight per connection, the rest
// accumulates (bounded by max_stream_buffer_bytes), and each write has its own deadline.
#include "frontend/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "frontend/openai_request.h"
#include "frontend/openai_response.h"

namespace pd::frontend {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

using openai::Api;
using openai::ApiError;
using openai::FromStatus;
using openai::kJsonType;

namespace {

constexpr int kListenBacklog = 1024;  // connections waiting for accept()
// Bytes a client may send ahead while its response is generated (a pipelined request); more is
// abuse and closes the connection.
constexpr size_t kMaxReadAhead = 64 << 10;
// File descriptors kept free for everything else (model files, gRPC, UCX, logs).
constexpr int kReservedFds = 256;


std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(absl::ToChronoNanoseconds(d));
}

// "HTTP/1.1 <status> <reason>\r\n" + headers + Content-Length + body.
std::string FormatResponse(int status, std::string_view content_type, std::string_view body,
                           const std::vector<std::pair<std::string, std::string>>& headers,
                           bool keep_alive) {
  std::string out = StrCat("HTTP/1.1 ", status, " ",
                           std::string_view(http::obsolete_reason(static_cast<http::status>(status))),
                           "\r\nContent-Type: ", content_type, "\r\nContent-Length: ", body.size(),
                           "\r\n");
  for (const auto& [k, v] : headers) out += StrCat(k, ": ", v, "\r\n");
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  out += body;
  return out;
}

// One chunk of chunked transfer coding.
void AppendChunk(std::string_view data, std::string* out) {
  if (data.empty()) return;
  char size[20];
  const int n = snprintf(size, sizeof(size), "%zx\r\n", data.size());
  out->append(size, n);
  out->append(data);
  out->append("\r\n");
}

// Open connections per client address and in total.
class ConnectionLimits {
 public:
  ConnectionLimits(int total, int per_address) : total_cap_(total), per_cap_(per_address) {}
  // Takes a slot for a connection from `address`; nullptr, or which cap refused it.
  const char* Acquire(const std::string& address) {
    absl::MutexLock lock(&mu_);
    if (open_ >= total_cap_) return "total";
    int& n = per_address_[address];
    if (per_cap_ > 0 && n >= per_cap_) return "per_address";
    ++n;
    ++open_;
    return nullptr;
  }
  void Release(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = per_address_.find(address);
    if (it == per_address_.end()) return;
    if (--it->second == 0) per_address_.erase(it);
    --open_;
  }
  int open() const {
    absl::MutexLock lock(&mu_);
    return open_;
  }

 private:
  const int total_cap_, per_cap_;
  mutable absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> per_address_ ABSL_GUARDED_BY(mu_);
};

// Lets threads outside the event loop (the engine's, via Stream::SetNotify) post to it only while
// it exists.
class Poster {
 public:
  template <typename Executor, typename Fn>
  void Post(const Executor& ex, Fn&& fn) {
    absl::MutexLock lock(&mu_);
    if (open_) net::post(ex, std::forward<Fn>(fn));
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
};

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
  if (io_threads < 1) return absl::InvalidArgumentError("http io_threads must be >= 1");
  if (max_body_bytes < 1) return absl::InvalidArgumentError("http max_body_bytes must be >= 1");
  if (max_header_bytes < 256) {
    return absl::InvalidArgumentError("http max_header_bytes must be >= 256");
  }
  if (max_connections < 1) return absl::InvalidArgumentError("http max_connections must be >= 1");
  if (max_connections_per_address < 0) {
    return absl::InvalidArgumentError("http max_connections_per_address must be >= 0");
  }
  for (const auto& [name, d] : {std::pair<const char*, absl::Duration>{"header_timeout",
                                                                       header_timeout},
                                {"body_timeout", body_timeout},
                                {"idle_timeout", idle_timeout},
                                {"write_timeout", write_timeout},
                                {"stream_keepalive", stream_keepalive}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(StrCat("http ", name, " must be > 0"));
    }
  }
  if (stream_send_buffer_bytes < 0) {
    return absl::InvalidArgumentError("http stream_send_buffer_bytes must be >= 0");
  }
  if (max_stream_buffer_bytes < 1) {
    return absl::InvalidArgumentError("http max_stream_buffer_bytes must be >= 1");
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError("http TLS needs both tls_cert_file and tls_key_file");
  }
  if (request_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http request_timeout must be >= 0");
  }
  for (const std::string& key : api_keys) {
    if (key.empty()) return absl::InvalidArgumentError("http api_keys must not contain \"\"");
  }
  return absl::OkStatus();
}

// What every connection shares: options, the Frontend, metrics, the event loop and the workers.
struct HttpServer::Core {
  Core(const HttpServerOptions& options, Frontend& frontend, MetricsRegistry& registry,
       ServingMetrics* metrics, int connection_cap)
      : options(options),
        frontend(frontend),
        registry(registry),
        metrics(metrics),
        limits(connection_cap, options.max_connections_per_address),
        http_requests(registry.AddCounter("pdserve_http_requests_total",
                                          "HTTP requests by endpoint and HTTP status.",
                                          {"endpoint", "status"})),
        refused(registry.AddCounter(
            "pdserve_http_connections_refused_total",
            "Connections closed at accept because a cap was reached (total or per_address).",
            {"cap"})),
        timeouts(registry.AddCounter(
            "pdserve_http_timeouts_total",
            "Connections closed past a deadline: header (TLS handshake and first header), body, "
            "idle (next header on a keep-alive connection) or write (a client that stopped "
            "reading).",
            {"phase"})),
        open_connections(registry
                             .AddGauge("pdserve_http_connections",
                                       "Open HTTP connections (idle, reading, or streaming).")
                             .Get()),
        workers(options.threads) {}

  const HttpServerOptions& options;
  Frontend& frontend;
  MetricsRegistry& registry;
  ServingMetrics* metrics;
  ConnectionLimits limits;
  Family<Counter>& http_requests;
  Family<Counter>& refused;
  Family<Counter>& timeouts;
  Gauge& open_connections;
  std::atomic<bool> stopping{false};
  // Shared with every Stream's notify callback, which may outlive the server by a moment.
  std::shared_ptr<Poster> poster = std::make_shared<Poster>();
  std::optional<ssl::context> tls;

  // Live sessions, so that Stop() can close them.
  class SessionBase {
   public:
    virtual ~SessionBase() = default;
    virtual void Close() = 0;  // any thread: posts the close to the session's strand
  };
  absl::Mutex sessions_mu;
  absl::flat_hash_map<SessionBase*, std::weak_ptr<SessionBase>> sessions
      ABSL_GUARDED_BY(sessions_mu);

  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  net::thread_pool workers;
  std::vector<std::thread> io_threads;

  void Count(std::string_view path, int status) {
    static const char* const kEndpoints[] = {"/v1/chat/completions", "/v1/completions",
                                             "/v1/models", "/health", "/metrics"};
    std::string endpoint = "other";
    for (const char* e : kEndpoints) {
      if (path == e) endpoint = e;
    }
    http_requests.WithLabels({endpoint, std::to_string(status)}).Increment();
  }

  // The model name responses carry: the one asked for, else the served model's.
  std::string ServedModel(const ApiRequest& request) const {
    if (!request.model.empty()) return request.model;
    const std::vector<ModelCard> models = frontend.Models();
    return models.empty() ? "" : models.front().id;
  }

  void Accept();
  void OnAccept(beast::error_code ec, tcp::socket socket);
};

namespace {

using Core = HttpServer::Core;

// One connection. `S` is tcp::socket (HTTP) or ssl::stream<tcp::socket> (HTTPS). Every member is
// touched only on the session's strand.
template <typename S>
class Session final : public Core::SessionBase, public std::enable_shared_from_this<Session<S>> {
 public:
  Session(Core& core, S stream, std::string peer)
      : core_(core),
        stream_(std::move(stream)),
        peer_(std::move(peer)),
        buffer_(core.options.max_header_bytes + kMaxReadAhead),
        read_timer_(stream_.get_executor()),
        write_timer_(stream_.get_executor()),
        keepalive_timer_(stream_.get_executor()),
        notify_posted_(std::make_shared<std::atomic<bool>>(false)) {
    core_.open_connections.Increment();
  }

  ~Session() override {
    if (stream_handle_ != nullptr && !stream_done_) stream_handle_->Cancel();
    stream_handle_.reset();
    core_.limits.Release(peer_);
    core_.open_connections.Decrement();
    absl::MutexLock lock(&core_.sessions_mu);
    core_.sessions.erase(this);
  }

  void Run() {
    {
      absl::MutexLock lock(&core_.sessions_mu);
      core_.sessions[this] = this->shared_from_this();
    }
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] { self->Begin(); });
  }

  void Close() override {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] { self->Abort(); });
  }

 private:
  static constexpr bool kTls = !std::is_same_v<S, tcp::socket>;

  tcp::socket& Socket() { return beast::get_lowest_layer(stream_); }

  void Begin() {
    if (core_.stopping.load()) return Abort();
    SetReadDeadline(core_.options.header_timeout, "header");
    if constexpr (kTls) {
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) return self->Abort();
                                self->StartHeaderRead();
                              });
    } else {
      StartHeaderRead();
    }
  }

  // ---- reading requests ----------------------------------------------------------------------

  // A deadline for what is being read now; past it the connection closes.
  void SetReadDeadline(absl::Duration d, const char* phase) {
    ++read_deadline_id_;
    read_timer_.expires_after(ToChrono(d));
    read_timer_.async_wait([self = this->shared_from_this(), id = read_deadline_id_,
                            phase](beast::error_code ec) {
      if (ec || id != self->read_deadline_id_) return;  // cancelled or replaced
      self->core_.timeouts.WithLabels({phase}).Increment();
      self->Abort();
    });
  }
  void ClearReadDeadline() {
    ++read_deadline_id_;
    read_timer_.cancel();
  }

  void StartHeaderRead() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(core_.options.max_header_bytes));
    parser_->body_limit(core_.options.max_body_bytes);
    reading_ = true;
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      // While a response is made: the client went away (or sent garbage); cancel it.
      if (busy_ || ClientWentAway(ec)) return Abort();
      ClearReadDeadline();
      if (ec == http::error::body_limit) {  // the parser checks Content-Length at the header
        return Refuse(413, StrCat("request body exceeds the limit of ",
                                  core_.options.max_body_bytes, " bytes"));
      }
      if (ec == http::error::header_limit) {
        return Refuse(431, StrCat("request header exceeds the limit of ",
                                  core_.options.max_header_bytes, " bytes"));
      }
      return Refuse(400, StrCat("malformed HTTP request: ", ec.message()));
    }
    if (busy_) {
      next_ready_ = true;  // a pipelined request: handled when this response is written
      if (buffer_.size() > kMaxReadAhead) Abort();
      return;
    }
    OnHeaderComplete();
  }

  static bool ClientWentAway(beast::error_code ec) {
    return ec == http::error::end_of_stream || ec == http::error::partial_message ||
           ec == net::error::eof || ec == net::error::operation_aborted ||
           ec == net::error::connection_reset || ec == net::error::broken_pipe ||
           ec == ssl::error::stream_truncated;
  }

  void OnHeaderComplete() {
    next_ready_ = false;
    const auto& h = parser_->get();
    const std::string_view target = h.target();
    path_ = std::string(target.substr(0, target.find('?')));
    const auto length = parser_->content_length();
    if (length.has_value() && *length > core_.options.max_body_bytes) {
      ClearReadDeadline();
      return Refuse(413, StrCat("request body exceeds the limit of ", core_.options.max_body_bytes,
                                " bytes"));
    }
    SetReadDeadline(core_.options.body_timeout, "body");
    auto read_body = [self = this->shared_from_this()] {
      self->reading_ = true;
      http::async_read(
          self->stream_, self->buffer_, *self->parser_,
          [self](beast::error_code ec, size_t) { self->OnBody(ec); });
    };
    if (parser_->is_done()) return OnBody({});
    if (beast::iequals(h[http::field::expect], "100-continue")) {
      // curl asks before sending bodies over 1 KiB; answer so that it does not wait a second.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue),
                       [self = this->shared_from_this(), read_body](beast::error_code ec, size_t) {
                         if (ec) return self->Abort();
                         read_body();
                       });
      return;
    }
    read_body();
  }

  void OnBody(beast::error_code ec) {
    reading_ = false;
    if (closed_) return;
    ClearReadDeadline();
    if (ec == http::error::body_limit) {
      return Refuse(413, StrCat("request body exceeds the limit of ", core_.options.max_body_bytes,
                                " bytes"));
    }
    if (ec) {
      if (ClientWentAway(ec)) return Abort();
      return Refuse(400, StrCat("malformed HTTP request: ", ec.message()));
    }
    request_ = parser_->release();
    keep_alive_ = request_.keep_alive();
    busy_ = true;
    // Watch the socket while the response is made: EOF cancels, a pipelined request waits.
    StartHeaderRead();
    Route();
  }

  // ---- routes --------------------------------------------------------------------------------

  void Route() {
    const http::verb verb = request_.method();
    const bool v1 = path_.rfind("/v1/", 0) == 0;
    if (v1 && Authenticate()) return;
    if (verb == http::verb::post && path_ == "/v1/chat/completions") return Generate(Api::kChat);
    if (verb == http::verb::post && path_ == "/v1/completions") return Generate(Api::kCompletion);
    if (verb == http::verb::get && path_ == "/v1/models") {
      const int64_t created = absl::ToUnixSeconds(absl::Now());
      return Reply(200, openai::ModelListJson(core_.frontend.Models(), created));
    }
    if (verb == http::verb::get && path_ == "/health") {
      if (core_.stopping.load()) {
        return ReplyError(ApiError{absl::StatusCode::kUnavailable, "shutting down", ""}, false);
      }
      return Reply(200, "{\"status\":\"ok\"}");
    }
    if (verb == http::verb::get && path_ == "/metrics") {
      if (core_.options.refresh_metrics) core_.options.refresh_metrics();
      return Reply(200, core_.registry.Render(), "text/plain; version=0.0.4; charset=utf-8");
    }
    ReplyError(ApiError{absl::StatusCode::kNotFound,
                        StrCat("unknown path: ", std::string_view(request_.method_string()), " ",
                               path_),
                        ""},
               false);
  }

  // API keys for /v1/*. Returns true when the request was answered (refused).
  bool Authenticate() {
    const std::vector<std::string>& keys = core_.options.api_keys;
    if (keys.empty()) return false;
    // "Authorization: Bearer KEY" (OpenAI clients) or "x-api-key: KEY", as the gRPC API.
    const std::string_view auth = request_[http::field::authorization];
    const std::string_view x_api_key = request_["x-api-key"];
    constexpr std::string_view kBearer = "Bearer ";
    std::string_view key = x_api_key;
    if (auth.size() > kBearer.size() && auth.substr(0, kBearer.size()) == kBearer) {
      key = auth.substr(kBearer.size());
    }
    if (!key.empty()) {
      bool ok = false;
      for (const std::string& k : keys) ok |= SecretEquals(key, k);
      if (ok) return false;
    }
    ReplyError(ApiError{absl::StatusCode::kUnauthenticated,
                        auth.empty() && x_api_key.empty()
                            ? "missing API key: send \"Authorization: Bearer <key>\""
                            : "invalid API key",
                        ""},
               true, {{"WWW-Authenticate", "Bearer"}});
    return true;
  }

  // Parses and starts the request on a worker (JSON, chat template and tokenization may take
  // milliseconds), then comes back to the strand.
  void Generate(Api api) {
    net::post(core_.workers, [self = this->shared_from_this(), api,
                              body = std::move(request_.body())]() mutable {
      Core& core = self->core_;
      auto parsed = std::make_shared<openai::Parsed>();
      std::optional<ApiError> error;
      try {
        error = openai::ParseRequest(api, body, parsed.get());
      } catch (const std::exception& e) {
        // A parser bug costs this request a 500, not the process (an exception escaping a worker
        // ends it). The body is not logged: it may hold a prompt.
        PD_LOG(kError, "the request parser failed (a bug): ", e.what());
        error = ApiError{absl::StatusCode::kInternal, "the request could not be parsed", ""};
      }
      bool counted = error.has_value();
      if (!error && core.stopping.load()) {
        error = ApiError{absl::StatusCode::kUnavailable, "server is shutting down", ""};
        counted = true;
      }
      std::shared_ptr<Stream> stream;
      if (!error) {
        if (core.options.request_timeout > absl::ZeroDuration()) {
          parsed->request.deadline = absl::Now() + core.options.request_timeout;
        }
        absl::StatusOr<std::unique_ptr<Stream>> started = core.frontend.Start(parsed->request);
        if (started.ok()) {
          stream = std::move(started).value();
        } else {
          error = FromStatus(started.status());
        }
      }
      std::string model = error ? "" : core.ServedModel(parsed->request);
      net::post(self->stream_.get_executor(),
                [self, api, parsed, error = std::move(error), counted, stream = std::move(stream),
                 model = std::move(model)]() mutable {
                  if (error) return self->ReplyError(*error, counted);
                  self->StartResponse(api, *parsed, std::move(stream), std::move(model));
                });
    });
  }

  void StartResponse(Api api, const openai::Parsed& parsed, std::shared_ptr<Stream> stream,
                     std::string model) {
    stream_handle_ = std::move(stream);
    stream_done_ = false;
    if (closed_) return;  // the destructor cancels it
    response_ = {};
    response_.api = api;
    response_.model = std::move(model);
    response_.id = StrCat(api == Api::kChat ? "chatcmpl-" : "cmpl-", stream_handle_->request_id());
    response_.created = absl::ToUnixSeconds(absl::Now());
    response_.include_usage = parsed.include_usage;
    response_.include_token_ids = parsed.include_token_ids;
    sse_ = parsed.stream;
    text_.clear();
    token_ids_.clear();
    if (sse_) {
      core_.Count(path_, 200);
      if (core_.options.stream_send_buffer_bytes > 0) {
        beast::error_code ignored;
        Socket().set_option(
            net::socket_base::send_buffer_size(core_.options.stream_send_buffer_bytes), ignored);
      }
      out_ += StrCat(
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
          "X-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n",
          keep_alive_ ? "" : "Connection: close\r\n", "\r\n");
      Flush();
    }
    std::weak_ptr<Session> weak = this->shared_from_this();
    stream_handle_->SetNotify([weak, ex = stream_.get_executor(), posted = notify_posted_,
                               poster = core_.poster] {
      if (posted->exchange(true)) return;  // a wake-up is already on its way
      poster->Post(ex, [weak, posted] {
        posted->store(false);
        if (auto self = weak.lock()) self->Pump();
      });
    });
  }

  // Drains what the stream has, without blocking.
  void Pump() {
    if (closed_ || stream_handle_ == nullptr || stream_done_) return;
    ApiChunk chunk;
    while (stream_handle_->Next(&chunk, absl::InfinitePast())) {
      const bool finished = chunk.finished;
      if (sse_) {
        AppendChunk(openai::Render(response_, chunk), &out_);
      } else {
        text_ += chunk.text;
        token_ids_.insert(token_ids_.end(), chunk.token_ids.begin(), chunk.token_ids.end());
      }
      if (finished) {
        stream_done_ = true;
        last_ = std::move(chunk);
        break;
      }
      chunk = ApiChunk{};
    }
    if (!sse_) {
      if (!stream_done_) return;
      stream_handle_.reset();
      if (!last_.status.ok()) return ReplyError(FromStatus(last_.status), false);
      return Reply(200, openai::CompletionJson(response_, text_, token_ids_, last_));
    }
    if (stream_done_) {
      stream_handle_.reset();
      out_ += "0\r\n\r\n";
      response_complete_ = true;
    } else if (out_.size() > core_.options.max_stream_buffer_bytes) {
      PD_LOG(kInfo, "HTTP: ", peer_, " reads its stream too slowly (", out_.size(),
             " bytes unsent): cancelling its request");
      core_.timeouts.WithLabels({"write"}).Increment();
      return Abort();
    }
    Flush();
  }

  // ---- writing -------------------------------------------------------------------------------

  void Reply(int status, std::string body, std::string_view content_type = kJsonType,
             const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    core_.Count(path_, status);
    out_ += FormatResponse(status, content_type, body, headers, keep_alive_);
    response_complete_ = true;
    Flush();
  }

  void ReplyError(const ApiError& e, bool count,
                  std::vector<std::pair<std::string, std::string>> headers = {}) {
    if (count && core_.metrics != nullptr) core_.metrics->Error(e.code);
    if (e.retry_after_s > 0) headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
    Reply(openai::StatusOf(e), openai::ErrorJson(e), kJsonType, headers);
  }

  // An error answered before the request was read in full: the connection closes after it.
  void Refuse(int status, std::string message) {
    if (core_.metrics != nullptr) core_.metrics->Error(absl::StatusCode::kInvalidArgument);
    keep_alive_ = false;
    linger_ = true;
    busy_ = true;
    ReplyError(ApiError{absl::StatusCode::kInvalidArgument, std::move(message), "", status}, false);
  }

  // After a refusal the client may still be sending its body: closing with unread bytes would
  // reset the connection and could destroy the answer before the client reads it. So: stop
  // sending, read and drop what comes for up to a second, then close.
  void LingerClose() {
    if constexpr (kTls) {
      Abort();
    } else {
      beast::error_code ignored;
      Socket().shutdown(tcp::socket::shutdown_send, ignored);
      ++read_deadline_id_;
      read_timer_.expires_after(std::chrono::seconds(1));
      read_timer_.async_wait([self = this->shared_from_this(), id = read_deadline_id_](
                                 beast::error_code ec) {
        if (!ec && id == self->read_deadline_id_) self->Abort();
      });
      Drain();
    }
  }
  void Drain() {
    buffer_.clear();
    Socket().async_read_some(buffer_.prepare(4096),
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               if (ec || self->closed_) return self->Abort();
                               self->Drain();
                             });
  }

  void Flush() {
    if (closed_ || write_in_flight_) return;
    if (out_.empty()) {
      if (response_complete_) {
        response_complete_ = false;
        OnResponseWritten();
      }
      return;
    }
    writing_.swap(out_);
    out_.clear();
    write_in_flight_ = true;
    ++write_id_;
    write_timer_.expires_after(ToChrono(core_.options.write_timeout));
    write_timer_.async_wait(
        [self = this->shared_from_this(), id = write_id_](beast::error_code ec) {
          if (ec || id != self->write_id_ || !self->write_in_flight_) return;
          self->core_.timeouts.WithLabels({"write"}).Increment();
          self->Abort();  // the client stopped reading
        });
    net::async_write(stream_, net::buffer(writing_),
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnWritten(ec);
                     });
  }

  void OnWritten(beast::error_code ec) {
    write_in_flight_ = false;
    ++write_id_;
    write_timer_.cancel();
    writing_.clear();
    if (ec) return Abort();
    if (sse_ && stream_handle_ != nullptr) ArmKeepalive();
    Flush();
  }

  // An idle stream sends an SSE comment now and then (proxies close silent connections).
  void ArmKeepalive() {
    ++keepalive_id_;
    keepalive_timer_.expires_after(ToChrono(core_.options.stream_keepalive));
    keepalive_timer_.async_wait(
        [self = this->shared_from_this(), id = keepalive_id_](beast::error_code ec) {
          if (ec || id != self->keepalive_id_ || self->closed_) return;
          if (self->stream_handle_ == nullptr || self->write_in_flight_) return;
          AppendChunk(": keep-alive\n\n", &self->out_);
          self->Flush();
        });
  }

  void OnResponseWritten() {
    busy_ = false;
    sse_ = false;
    ++keepalive_id_;
    keepalive_timer_.cancel();
    if (linger_) return LingerClose();
    if (!keep_alive_ || core_.stopping.load()) return Abort();
    // The next request: already read ahead, or its header must arrive within the idle deadline.
    if (next_ready_) return OnHeaderComplete();
    SetReadDeadline(core_.options.idle_timeout, "idle");
    if (!reading_) StartHeaderRead();
  }

  // Closes the connection; a request still running is cancelled.
  void Abort() {
    if (closed_) return;
    closed_ = true;
    if (stream_handle_ != nullptr && !stream_done_) stream_handle_->Cancel();
    stream_handle_.reset();
    ++read_deadline_id_;
    ++write_id_;
    ++keepalive_id_;
    read_timer_.cancel();
    write_timer_.cancel();
    keepalive_timer_.cancel();
    beast::error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close(ignored);
  }

  Core& core_;
  S stream_;
  const std::string peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::string path_;
  bool keep_alive_ = true;
  bool reading_ = false;     // a header or body read is outstanding
  bool busy_ = false;        // a request is being answered
  bool next_ready_ = false;  // the next request's header was read while busy
  bool linger_ = false;      // refused mid-request: drain, then close
  bool closed_ = false;

  net::steady_timer read_timer_, write_timer_, keepalive_timer_;
  uint64_t read_deadline_id_ = 0, write_id_ = 0, keepalive_id_ = 0;

  // The response being produced.
  std::shared_ptr<Stream> stream_handle_;
  bool stream_done_ = false;
  bool sse_ = false;
  openai::ResponseState response_;
  std::string text_;  // non-streaming: the whole text so far
  std::vector<int32_t> token_ids_;
  ApiChunk last_;
  std::shared_ptr<std::atomic<bool>> notify_posted_;

  std::string out_;      // bytes to write next
  std::string writing_;  // bytes of the write in flight
  bool write_in_flight_ = false;
  bool response_complete_ = false;  // out_ ends the response
};

}  // namespace

void HttpServer::Core::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void HttpServer::Core::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (stopping.load() || ec == net::error::operation_aborted) return;
  if (ec) {
    // Out of file descriptors (EMFILE) and the like: pause instead of spinning.
    static std::atomic<int64_t> last_log{0};
    const int64_t now = absl::ToUnixSeconds(absl::Now());
    if (now - last_log.exchange(now) >= 10) {
      PD_LOG(kWarning, "HTTP: accept failed: ", ec.message(), "; retrying in 100 ms");
    }
    accept_retry.expires_after(std::chrono::milliseconds(100));
    accept_retry.async_wait([this](beast::error_code e) {
      if (!e) Accept();
    });
    return;
  }
  beast::error_code addr_ec;
  const tcp::endpoint peer = socket.remote_endpoint(addr_ec);
  const std::string address = addr_ec ? std::string("?") : peer.address().to_string();
  if (const char* cap = limits.Acquire(address)) {
    refused.WithLabels({cap}).Increment();
    if (!tls.has_value()) {
      // Best effort, never blocking: the client learns why before the close.
      static const std::string kBusy = FormatResponse(
          503, kJsonType,
          openai::ErrorJson(ApiError{absl::StatusCode::kUnavailable,
                                     "too many connections; retry later", ""}),
          {{"Retry-After", "1"}}, false);
      ::send(socket.native_handle(), kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    beast::error_code ignored;
    socket.close(ignored);
    return Accept();
  }
  socket.set_option(tcp::no_delay(true), addr_ec);  // tokens go out as they are produced
  if (tls.has_value()) {
    std::make_shared<Session<ssl::stream<tcp::socket>>>(
        *this, ssl::stream<tcp::socket>(std::move(socket), *tls), address)
        ->Run();
  } else {
    std::make_shared<Session<tcp::socket>>(*this, std::move(socket), address)->Run();
  }
  Accept();
}

HttpServer::HttpServer(HttpServerOptions options, Frontend& frontend, MetricsRegistry& registry,
                       ServingMetrics* metrics)
    : options_(std::move(options)), frontend_(frontend), registry_(registry), metrics_(metrics) {}

HttpServer::~HttpServer() { Stop(); }

namespace {

// Raises the soft open-file limit to the hard one; returns the connections it leaves room for.
int ConnectionCapForFdLimit(int wanted) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return wanted;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur == RLIM_INFINITY) return wanted;
  const int64_t room = static_cast<int64_t>(rl.rlim_cur) - kReservedFds;
  if (room >= wanted) return wanted;
  const int cap = static_cast<int>(std::max<int64_t>(room, 16));
  PD_LOG(kWarning, "HTTP: the open-file limit (", rl.rlim_cur, ") leaves room for ", cap,
         " connections, not http max_connections = ", wanted, "; raise `ulimit -n`");
  return cap;
}

}  // namespace

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  if (core_ != nullptr) return absl::FailedPreconditionError("HTTP server already started");
  PD_RETURN_IF_ERROR(options_.Validate());
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(pd::StrCat("http port must be in [0, 65535], got ", port));
  }
  auto core = std::make_unique<Core>(options_, frontend_, registry_, metrics_,
                                     ConnectionCapForFdLimit(options_.max_connections));
  if (!options_.tls_cert_file.empty()) {
    core->tls.emplace(ssl::context::tls_server);
    ssl::context& ctx = *core->tls;
    ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                    ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                    ssl::context::single_dh_use);
    beast::error_code ec;
    ctx.use_certificate_chain_file(options_.tls_cert_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(StrCat("http TLS certificate '", options_.tls_cert_file,
                                               "': ", ec.message()));
    }
    ctx.use_private_key_file(options_.tls_key_file, ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          StrCat("http TLS key '", options_.tls_key_file, "': ", ec.message()));
    }
  }
  beast::error_code ec;
  tcp::resolver resolver(core->ioc);
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return absl::UnavailableError(
        StrCat("cannot bind HTTP to ", host, ":", port, ": ", ec ? ec.message() : "no address"));
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  tcp::acceptor& acceptor = core->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(kListenBacklog, ec);
  if (ec) {
    return absl::UnavailableError(StrCat("cannot bind HTTP to ", host, ":", port, ": ",
                                         ec.message()));
  }
  const int bound = acceptor.local_endpoint().port();
  core->Accept();
  for (int i = 0; i < options_.io_threads; ++i) {
    core->io_threads.emplace_back([c = core.get()] {
      // The loop runs until Stop(): the acceptor always has an accept pending.
      for (;;) {
        try {
          c->ioc.run();
          return;
        } catch (const std::exception& e) {
          PD_LOG(kError, "HTTP: event loop handler threw: ", e.what());
        }
      }
    });
  }
  core_ = std::move(core);
  return bound;
}

void HttpServer::Stop() {
  if (core_ == nullptr) return;
  Core& core = *core_;
  core.stopping.store(true);
  net::post(core.acceptor.get_executor(), [&core] {
    beast::error_code ignored;
    core.acceptor.close(ignored);
    core.accept_retry.cancel();
  });
  std::vector<std::shared_ptr<Core::SessionBase>> live;
  {
    absl::MutexLock lock(&core.sessions_mu);
    for (auto& [ptr, weak] : core.sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->Close();
  live.clear();
  // Sessions end once their last handler has run; requests on the workers finish quickly.
  const absl::Time give_up = absl::Now() + absl::Seconds(3);
  for (;;) {
    {
      absl::MutexLock lock(&core.sessions_mu);
      if (core.sessions.empty()) break;
    }
    if (absl::Now() > give_up) {
      PD_LOG(kWarning, "HTTP: connections still open 3 s after Stop(); closing them anyway");
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  core.workers.join();
  core.poster->Close();
  core.ioc.stop();
  for (std::thread& t : core.io_threads) t.join();
  core_.reset();  // destroys handlers never run, and with them the last sessions
}

}  // namespace pd::frontend
