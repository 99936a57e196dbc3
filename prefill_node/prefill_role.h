// The prefill role of a node (pd-prefill): pdserve.node.v1.Prefill over the node's engine, which
// pushes each prompt's KV to the decode node that reserved it (docs/cluster.md).
// Ownership: owns the service. Thread safety: NodeMain's thread only.
#pragma once

#include <memory>
#include <string_view>

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
    service_ = std::make_unique<PrefillService>(state);
    return service_.get();
  }

 private:
  std::unique_ptr<PrefillService> service_;
};

}  // namespace pd::node
