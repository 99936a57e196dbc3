// What every node daemon (pd-decode, pd-prefill) serves besides its role's service: the gRPC
// server with Node.Load and grpc.health.v1.Health, a small HTTP server for /metrics and /health,
// and the drain on SIGTERM. The engine comes from engine_builder.h.
//
// Ownership: NodeServer borrows the NodeState (and through it the engine) and the services it is
// given; they must outlive it. Thread safety: NodeServer's methods are called from the daemon's
// main thread; the services run on gRPC's threads and only read `draining()`.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/grpc_tls.h"
#include "common/metrics.h"
#include "engine/sched/engine_api.h"
#include "engine/sched/scheduler.h"
#include "pdserve/node/v1/node.pb.h"

namespace httplib {
class Server;
}

namespace pd::kvtransfer {
class KvTransport;
}

namespace pd::node {

// What a node's services share: the engine (a Scheduler), the KV transport (null when
// kv_transfer is off), the metrics registry, and the draining flag.
class NodeState {
 public:
  NodeState(std::string role, engine::Scheduler& scheduler, MetricsRegistry* metrics = nullptr)
      : role_(std::move(role)), scheduler_(scheduler), metrics_(metrics) {}
  const std::string& role() const { return role_; }
  engine::GenerationEngine& engine() { return scheduler_; }
  engine::Scheduler* scheduler() { return &scheduler_; }
  MetricsRegistry* metrics() { return metrics_; }
  // Set before the server starts; the transport outlives the server.
  void SetKvTransport(kvtransfer::KvTransport* transport, const KvTransferOptions& options = {}) {
    transport_ = transport;
    kv_transfer_options_ = options;
  }
  // The node's kv_transfer config (defaults when the transport was set without it).
  const KvTransferOptions& kv_transfer_options() const { return kv_transfer_options_; }
  kvtransfer::KvTransport* transport() { return transport_; }
  bool kv_transfer() const { return transport_ != nullptr; }
  bool draining() const { return draining_.load(); }
  void StartDraining() { draining_.store(true); }
  // Requests in the node's services right now (drain waits for 0).
  std::atomic<int>& active() { return active_; }
  // The loaded model's fingerprint (engine/model/fingerprint.h). Set before Start.
  void SetModelFingerprint(uint64_t f) { fingerprint_ = f; }
  uint64_t model_fingerprint() const { return fingerprint_; }
  // How many KV reservations the node's KvReceiver holds (Node.Audit); unset: the node has none.
  // Set before Start; what it reads outlives the server.
  void SetReservationCount(std::function<int()> count) { reservations_ = std::move(count); }
  int kv_reservations() const { return reservations_ ? reservations_() : 0; }
  // How this node calls other nodes (a prefill node's Decode.SendPrefix). Set before Start.
  void SetClusterChannels(ClusterChannels channels) { channels_ = std::move(channels); }
  const ClusterChannels& cluster_channels() const { return channels_; }

 private:
  const std::string role_;
  engine::Scheduler& scheduler_;
  MetricsRegistry* const metrics_;
  kvtransfer::KvTransport* transport_ = nullptr;
  KvTransferOptions kv_transfer_options_;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
  ClusterChannels channels_;
  uint64_t fingerprint_ = 0;
  std::function<int()> reservations_;
};

// OK when `kv` was reserved by a node running this node's model; else FAILED_PRECONDITION naming
// both fingerprints (`peer` says who reserved it: "the decode node").
grpc::Status CheckFingerprint(const pdserve::node::v1::KvTransferDescriptor& kv,
                              const NodeState& state, const char* peer);

struct NodeServerOptions {
  std::string name;  // "pd-decode" / "pd-prefill": the ready line's first word
  ListenOptions grpc;
  ListenOptions http;
  int max_message_bytes = 64 << 20;
  // Mutual TLS for the gRPC server: set (all three files), callers must show a certificate the CA
  // signed, or the handshake fails. Empty: plaintext. The /metrics HTTP server stays plaintext.
  TlsFiles tls;
};

class NodeServer {
 public:
  // Starts gRPC (the role's `service`, Node, health, reflection-free) and HTTP (/metrics,
  // /health; `refresh` runs before each /metrics rendering). UNAVAILABLE when a port cannot be
  // bound. Prints nothing; ReadyLine() gives the line the daemon prints.
  static absl::StatusOr<std::unique_ptr<NodeServer>> Start(const NodeServerOptions& options,
                                                           NodeState& state, grpc::Service* service,
                                                           MetricsRegistry& registry,
                                                           std::function<void()> refresh);
  ~NodeServer();

  std::string grpc_address() const;
  std::string http_url() const;  // "off" when disabled
  // "pd-decode ready: grpc=HOST:PORT http=http://HOST:PORT"
  std::string ReadyLine() const;

  // SIGTERM: health NOT_SERVING and Load.draining at once (routers stop placing within one
  // health interval), new requests UNAVAILABLE, running ones get `grace`, then the servers stop
  // (remaining calls cancelled). Idempotent.
  void Drain(absl::Duration grace);

 private:
  NodeServer() = default;

  NodeServerOptions options_;
  NodeState* state_ = nullptr;
  std::unique_ptr<grpc::Service> node_service_;
  std::unique_ptr<grpc::Server> server_;
  int grpc_port_ = 0;
  std::unique_ptr<httplib::Server> http_;
  int http_port_ = 0;
  std::thread http_thread_;
  bool drained_ = false;
};

}  // namespace pd::node
