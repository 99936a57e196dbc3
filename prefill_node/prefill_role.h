// The prefill role of a node (pd-prefill): pdserve.node.v1.Prefill over the node's engine, which
// pushes each prompt's KV to the decode node that reserved it, and, when the node has a KV
// transport, the KvReceiver through which it fetches prompt prefixes that decode node already
// holds (docs/cluster.md, "Prefix pull").
// Ownership: owns the receiver and the service. Thread safety: NodeMain's thread only.
#pragma once

#include <memory>
#include <string_view>

#include "node/kv_receiver.h"
#include "node/node_role.h"
#include "prefill_node/prefill_service.h"

namespace pd::node {

class PrefillRole final : public NodeRole {
 public:
  std::string_view name() const override { return "prefill"; }
  // The service holds each prompt's blocks until its transfer ended (SubmitExport hold_kv), so
  // f16 layers go to the network straight from the cache.
  void ConfigureTransport(kvtransfer::TransportOptions& options) const override {
    options.zero_copy_send = true;
  }
  absl::StatusOr<grpc::Service*> Start(NodeState& state) override {
    if (state.transport() != nullptr && state.kv_transfer_options().prefix_pull) {
      receiver_ =
          std::make_unique<KvReceiver>(*state.scheduler(), *state.transport(), state.metrics());
      state.SetReservationCount([r = receiver_.get()] { return r->live(); });
    }
    service_ = std::make_unique<PrefillService>(state, receiver_.get());
    return service_.get();
  }
  // Ends the open prefix reservations (their blocks go back to the engine).
  void Stop() override {
    if (receiver_ != nullptr) receiver_->Shutdown();
  }

 private:
  std::unique_ptr<KvReceiver> receiver_;  // null without a KV transport or prefix pulls
  std::unique_ptr<PrefillService> service_;
};

}  // namespace pd::node
