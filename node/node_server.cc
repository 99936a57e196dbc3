#include "node/node_server.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>

#include "common/log.h"
#include "common/net.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/fingerprint.h"
#include "kvtransfer/kv_transport.h"
#include "pdserve/node/v1/node.grpc.pb.h"

namespace pd::node {
namespace {

namespace nv1 = ::pdserve::node::v1;

class NodeService final : public nv1::Node::Service {
 public:
  explicit NodeService(NodeState& state) : state_(state) {}

  grpc::Status Load(grpc::ServerContext*, const nv1::LoadRequest*, nv1::EngineLoad* out) override {
    const engine::EngineLoad l = state_.engine().Load();
    out->set_role(state_.role());
    out->set_running(l.running);
    out->set_waiting(l.waiting);
    out->set_kv_blocks_total(l.kv_blocks_total);
    out->set_kv_blocks_free(l.kv_blocks_free);
    out->set_kv_block_size(l.kv_block_size);
    out->set_pending_prefill_tokens(l.pending_prefill_tokens);
    out->set_max_context(state_.engine().max_context());
    out->set_draining(state_.draining());
    out->set_kv_transfer(state_.kv_transfer());
    out->set_kv_blocks_cached(l.kv_blocks_cached);
    out->set_model_fingerprint(state_.model_fingerprint());
    if (l.cached_block_hashes != nullptr) {
      out->mutable_cached_block_hashes()->Add(l.cached_block_hashes->begin(),
                                              l.cached_block_hashes->end());
    }
    return grpc::Status::OK;
  }

  grpc::Status Audit(grpc::ServerContext*, const nv1::AuditRequest*,
                     nv1::AuditReport* out) override {
    const absl::Status audit = state_.scheduler()->AuditKvNow();
    if (absl::IsDeadlineExceeded(audit) || absl::IsUnavailable(audit)) return ToGrpc(audit);
    if (!audit.ok()) out->set_kv_error(std::string(audit.message()));
    const engine::EngineLoad l = state_.engine().Load();
    out->set_kv_blocks_used(l.kv_blocks_total - l.kv_blocks_free);
    out->set_live_requests(l.running + l.waiting);
    out->set_kv_reservations(state_.kv_reservations());
    kvtransfer::KvTransport* t = state_.transport();
    out->set_kv_transfers(t != nullptr ? t->active_transfers() : 0);
    return grpc::Status::OK;
  }

 private:
  NodeState& state_;
};

}  // namespace

grpc::Status CheckFingerprint(const pdserve::node::v1::KvTransferDescriptor& kv,
                              const NodeState& state, const char* peer) {
  if (kv.model_fingerprint() == state.model_fingerprint()) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      StrCat("kv: ", peer, " runs another model (fingerprint ",
             engine::FingerprintHex(kv.model_fingerprint()), ", this node ",
             engine::FingerprintHex(state.model_fingerprint()),
             "): its KV cannot be used here; start every node of the cluster with the same model "
             "file"));
}

absl::StatusOr<std::unique_ptr<NodeServer>> NodeServer::Start(const NodeServerOptions& options,
                                                              NodeState& state,
                                                              grpc::Service* service,
                                                              MetricsRegistry& registry,
                                                              std::function<void()> refresh) {
  std::unique_ptr<NodeServer> s(new NodeServer());
  s->options_ = options;
  s->state_ = &state;
  s->node_service_ = std::make_unique<NodeService>(state);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string addr = JoinHostPort(options.grpc.host, options.grpc.port);
  PD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      GrpcServerCredentials(options.tls));
  builder.AddListeningPort(addr, credentials, &s->grpc_port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  if (service != nullptr) builder.RegisterService(service);
  builder.RegisterService(s->node_service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->grpc_port_ == 0) {
    return absl::UnavailableError(StrCat("cannot listen for gRPC on ", addr));
  }
  if (grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
  }

  if (options.http.enabled) {
    s->http_ = std::make_unique<httplib::Server>();
    httplib::Server& svr = *s->http_;
    NodeState* st = &state;
    svr.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    svr.Get("/health", [st](const httplib::Request&, httplib::Response& res) {
      if (st->draining()) {
        res.status = 503;
        res.set_content("{\"status\":\"draining\"}", "application/json");
      } else {
        res.set_content("{\"status\":\"ok\"}", "application/json");
      }
    });
    svr.Get("/metrics", [&registry, refresh](const httplib::Request&, httplib::Response& res) {
      if (refresh) refresh();
      res.set_content(registry.Render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    int bound = options.http.port;
    if (bound == 0) {
      bound = svr.bind_to_any_port(options.http.host);
      if (bound <= 0) {
        return absl::UnavailableError(StrCat("cannot bind HTTP to ", options.http.host, ":any"));
      }
    } else if (!svr.bind_to_port(options.http.host, bound)) {
      return absl::UnavailableError(
          StrCat("cannot bind HTTP to ", JoinHostPort(options.http.host, bound)));
    }
    s->http_port_ = bound;
    NodeServer* self = s.get();
    s->http_thread_ = std::thread([self] { self->http_->listen_after_bind(); });
    while (!s->http_->is_running()) absl::SleepFor(absl::Milliseconds(1));
  }
  return s;
}

std::string NodeServer::grpc_address() const {
  return JoinHostPort(options_.grpc.host, grpc_port_);
}

std::string NodeServer::http_url() const {
  if (!http_) return "off";
  return StrCat("http://", JoinHostPort(options_.http.host, http_port_));
}

std::string NodeServer::ReadyLine() const {
  return StrCat(options_.name, " ready: grpc=", grpc_address(), " http=", http_url());
}

void NodeServer::Drain(absl::Duration grace) {
  if (drained_) return;
  drained_ = true;
  state_->StartDraining();
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  // Running requests finish within the grace; new ones are refused by the services.
  const absl::Time end = absl::Now() + grace;
  while (state_->active().load() > 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  if (http_) {
    http_->stop();
    if (http_thread_.joinable()) http_thread_.join();
  }
}

NodeServer::~NodeServer() {
  if (server_ != nullptr) Drain(absl::ZeroDuration());
}

}  // namespace pd::node
