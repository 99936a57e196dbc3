// What pd-serve and pd-router share above their engines, so that a client cannot tell them
// apart: the model's tokenizer, chat template and card; the Frontend's options from the config;
// and the two public servers (gRPC pdserve.v1 and the OpenAI-compatible HTTP API) started,
// described and drained together.
//
// Ownership: PublicServers owns both servers and borrows the Frontend, the registry and the
// metrics, which must outlive it. Thread safety: the daemon's main thread only.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/metrics.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "frontend/frontend.h"
#include "frontend/grpc_service.h"
#include "frontend/http_server.h"
#include "frontend/serving_metrics.h"

namespace pd::frontend {

// What the front end reads from the model file.
struct FrontendModel {
  std::unique_ptr<engine::Tokenizer> tokenizer;
  engine::ChatTemplateKind chat_template{};
  ModelCard card;  // context_length left 0: it is the engine's
};

// The tokenizer, the chat template (`model.chat_template`, else detected from the file) and the
// card (id `model.id`, else the file name) of `file`, read from `path`. Errors: the tokenizer's,
// INVALID_ARGUMENT for an unknown template name.
absl::StatusOr<FrontendModel> LoadFrontendModel(const engine::GgufFile& file,
                                                const std::string& path,
                                                const ModelConfigOptions& model);

// The config's limits as FrontendOptions.
FrontendOptions FrontendOptionsFrom(const ServeOptions& o);

class PublicServers {
 public:
  // Starts gRPC on o.grpc and HTTP on o.http (each unless disabled) over `frontend`, with the
  // config's API keys and body limit; `refresh_metrics` runs before each /metrics rendering (may
  // be empty). UNAVAILABLE when a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<PublicServers>> Start(
      const ServeOptions& o, Frontend& frontend, MetricsRegistry& registry, ServingMetrics* metrics,
      std::function<void()> refresh_metrics);
  ~PublicServers();  // Shutdown(absl::ZeroDuration())

  // "grpc=HOST:PORT http=http://HOST:PORT" for the ready line; "off" for a disabled server.
  std::string Endpoints() const;

  // Both stop accepting at once; gRPC streams get `grace` to finish, HTTP streams end (their
  // requests cancelled). Returns when both have stopped. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  PublicServers() = default;

  std::string http_host_;

  bool http_tls_ = false;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<HttpServer> http_;
  int http_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace pd::frontend
