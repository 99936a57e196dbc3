// The public gRPC API of a serving process: pdserve.v1.Chat (proto/pdserve/v1/chat.proto) over a
// Frontend, plus the standard grpc.health.v1.Health service and server reflection.
//
// Generate runs on a gRPC sync-server thread per call: it starts a Stream, then polls it with a
// short timeout so that a client cancellation or a passed deadline (ServerContext::IsCancelled)
// cancels the request in the engine, and frees its KV, within one poll interval.
//
// Ownership: GrpcServer borrows the Frontend (and metrics), which must outlive it; it owns the
// grpc::Server and its threads. Thread safety: Shutdown and the accessors may be called from any
// thread; Shutdown is idempotent.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "frontend/frontend.h"

namespace pdserve::v1 {
class GenerateResponse;
class ListModelsRequest;
class ListModelsResponse;
namespace wire {
class GenerateRequest;
}  // namespace wire
}  // namespace pdserve::v1

namespace pd::frontend {

class ServingMetrics;

// absl and gRPC share the canonical status codes: the mapping is one to one (common/).
using ::pd::ToGrpc;

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = pick a free port (see GrpcServer::port())
  // Keys accepted in "authorization: Bearer KEY" or "x-api-key: KEY" metadata; empty = no
  // authentication. Health and reflection never ask for a key.
  std::vector<std::string> api_keys;
  int max_message_bytes = 1 << 20;  // larger requests: RESOURCE_EXHAUSTED (by gRPC)
  // PEM files; both set: TLS only. Both empty: plaintext. tls_ca_file (with both): clients must
  // show a certificate this CA signed (mutual TLS), else the handshake fails.
  std::string tls_cert_file, tls_key_file, tls_ca_file;
  // How often a Generate handler wakes up to notice a cancelled call while no tokens arrive.
  absl::Duration poll_interval = absl::Milliseconds(20);
};

// The pdserve.v1.Chat service. Written against grpc::Service directly (not the generated
// Chat::Service) so that Generate can parse its request as pdserve.v1.wire.GenerateRequest
// (chat_wire.proto): invalid UTF-8 then becomes INVALID_ARGUMENT naming the field instead of a
// parse failure. The method names and message types on the wire are chat.proto's.
class ChatService final : public grpc::Service {
 public:
  ChatService(Frontend& frontend, const GrpcServerOptions& options, ServingMetrics* metrics);

  grpc::Status Generate(grpc::ServerContext* context,
                        const pdserve::v1::wire::GenerateRequest* request,
                        grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer);
  grpc::Status ListModels(grpc::ServerContext* context,
                          const pdserve::v1::ListModelsRequest* request,
                          pdserve::v1::ListModelsResponse* response);

  // New Generate calls get UNAVAILABLE; running ones go on.
  void StopAccepting() { accepting_.store(false); }

 private:
  grpc::Status Authenticate(const grpc::ServerContext& context) const;

  Frontend& frontend_;
  const std::vector<std::string> api_keys_;
  const absl::Duration poll_interval_;
  ServingMetrics* const metrics_;
  std::atomic<bool> accepting_{true};
};

class GrpcServer {
 public:
  // Builds and starts the server on host:port. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(Frontend& frontend,
                                                           const GrpcServerOptions& options,
                                                           ServingMetrics* metrics);
  ~GrpcServer();  // Shutdown(absl::ZeroDuration())

  int port() const { return port_; }
  std::string address() const;  // "host:port", ready for grpc::CreateChannel

  // Health turns NOT_SERVING, new calls are refused, running streams get `grace` to finish and
  // are then cancelled (their KV freed); returns when every handler has returned.
  void Shutdown(absl::Duration grace);

 private:
  GrpcServer() = default;

  std::string host_;
  int port_ = 0;
  std::unique_ptr<ChatService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace pd::frontend
