// pdserve.node.v1.Prefill over a GenerationEngine: pd-prefill's service.
//
// Prefill runs a prompt (the engine's chunked prefill) and samples its first token. Pushing the
// prompt's KV to a decode node layer by layer needs kvtransfer/ (KvTransport) and a per-layer hook
// in Model::Forward; neither is built yet, so a request carrying a KV descriptor is UNIMPLEMENTED
// and one without computes the first token only (its KV is freed at once).
//
// Ownership: borrows the NodeState. Thread safety: one gRPC sync-server thread per call.
#pragma once

#include "decode_node/node_server.h"
#include "pdserve/node/v1/node.grpc.pb.h"

namespace pd::node {

class PrefillService final : public ::pdserve::node::v1::Prefill::Service {
 public:
  explicit PrefillService(NodeState& state) : state_(state) {}

  grpc::Status Prefill(grpc::ServerContext* context,
                       const ::pdserve::node::v1::PrefillRequest* request,
                       ::pdserve::node::v1::PrefillResponse* response) override;

 private:
  NodeState& state_;
};

}  // namespace pd::node
