// What every node daemon (pd-decode, pd-prefill) is made of besides its own service: the engine
// built from the config (backend, model, Scheduler), the gRPC server with Node.Load and
// grpc.health.v1.Health, a small HTTP server for /metrics and /health, and the drain on SIGTERM.
//
// Ownership: NodeEngine owns backend, model file, tokenizer-free model and Scheduler (the
// Scheduler owns the Model). NodeServer borrows the engine and the services it is given; they
// must outlive it. Thread safety: NodeServer's methods are called from the daemon's main thread;
// the services run on gRPC's threads and only read `draining()`.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/metrics.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"
#include "engine/sched/engine_api.h"
#include "engine/sched/scheduler.h"
#include "router/serving_metrics.h"

namespace httplib {
class Server;
}

namespace pd::kvtransfer {
class KvTransport;
}

namespace pd::node {

class KvReceiver;

// absl and gRPC share the canonical codes.
grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

// The engine of a node, built from the shared config's model / threads / scheduler / kv sections
// exactly as pd-serve builds its colocated engine.
struct NodeEngine {
  std::unique_ptr<engine::Backend> backend;
  std::shared_ptr<engine::GgufFile> file;
  std::unique_ptr<engine::Scheduler> scheduler;
  std::string model_path;
};

// Loads the model (the default model when model.path is empty) and starts its Scheduler; the step
// observer feeds `metrics` (nullable, must outlive the engine). Errors: the model's (NOT_FOUND,
// INVALID_ARGUMENT, ...) and the Scheduler's.
absl::StatusOr<NodeEngine> BuildNodeEngine(const ServeOptions& o, router::ServingMetrics* metrics);

// What a node's services share: the engine (a Scheduler), the KV transport and, on a decode
// node, the KV receiver (both null when kv_transfer is off), the metrics registry, and the
// draining flag.
class NodeState {
 public:
  NodeState(std::string role, engine::Scheduler& scheduler, MetricsRegistry* metrics = nullptr)
      : role_(std::move(role)), scheduler_(scheduler), metrics_(metrics) {}
  const std::string& role() const { return role_; }
  engine::GenerationEngine& engine() { return scheduler_; }
  engine::Scheduler* scheduler() { return &scheduler_; }
  MetricsRegistry* metrics() { return metrics_; }
  // Set before the server starts; both outlive the server.
  void SetKvTransfer(kvtransfer::KvTransport* transport, KvReceiver* receiver) {
    transport_ = transport;
    receiver_ = receiver;
  }
  kvtransfer::KvTransport* transport() { return transport_; }
  KvReceiver* receiver() { return receiver_; }
  bool kv_transfer() const { return transport_ != nullptr; }
  bool draining() const { return draining_.load(); }
  void StartDraining() { draining_.store(true); }
  // Requests in the node's services right now (drain waits for 0).
  std::atomic<int>& active() { return active_; }

 private:
  const std::string role_;
  engine::Scheduler& scheduler_;
  MetricsRegistry* const metrics_;
  kvtransfer::KvTransport* transport_ = nullptr;
  KvReceiver* receiver_ = nullptr;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
};

struct NodeServerOptions {
  std::string name;  // "pd-decode" / "pd-prefill": the ready line's first word
  ListenOptions grpc;
  ListenOptions http;
  int max_message_bytes = 64 << 20;
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

// Blocks SIGINT and SIGTERM in the calling thread (call first in main, before any thread starts)
// and returns the signal set to sigwait on.
sigset_t BlockStopSignals();

}  // namespace pd::node
