// The decode role of a node (pd-decode): pdserve.node.v1.Decode over the node's engine, and, when
// the node has a KV transport, the KvReceiver that opens its KV reservations (docs/cluster.md).
// Ownership: owns the receiver and the service. Thread safety: NodeMain's thread only.
#pragma once

#include <memory>
#include <string_view>

#include "decode_node/decode_service.h"
#include "node/kv_receiver.h"
#include "node/node_role.h"

namespace pd::node {

class DecodeRole final : public NodeRole {
 public:
  std::string_view name() const override { return "decode"; }
  absl::StatusOr<grpc::Service*> Start(NodeState& state) override;
  // Ends the open reservations (their blocks go back to the engine).
  void Stop() override;

 private:
  std::unique_ptr<KvReceiver> receiver_;  // null when the node has no KV transport
  std::unique_ptr<DecodeService> service_;
};

}  // namespace pd::node
