// pdserve.node.v1.Prefill over a Scheduler: pd-prefill's service.
//
// Prefill runs a prompt (the engine's chunked prefill) and samples its first token. With a KV
// descriptor (Decode.Reserve's) it also pushes the prompt's K/V to that decode node: the
// Scheduler's export hook hands each layer to the transfer as soon as the last prompt chunk has
// computed it (KvSendStream::Push packs and queues it; the network overlaps the later layers), and
// the call answers once the decode node acknowledged every layer. Any transfer failure fails the
// call (the router then lets the decode node prefill).
//
// Metrics (docs/metrics.md): pdserve_kv_transfer_seconds (first layer pushed -> acknowledged),
// pdserve_kv_transfer_tail_seconds (last layer pushed -> acknowledged: what the transfer adds to
// TTFT), pdserve_kv_transfer_bytes_total, pdserve_kv_transfer_failures_total{code}.
//
// Ownership: borrows the NodeState. Thread safety: one gRPC sync-server thread per call.
#pragma once

#include "common/metrics.h"
#include "node/node_server.h"
#include "pdserve/node/v1/node.grpc.pb.h"

namespace pd::node {

class PrefillService final : public ::pdserve::node::v1::Prefill::Service {
 public:
  explicit PrefillService(NodeState& state);

  // UNAVAILABLE while draining; FAILED_PRECONDITION for a descriptor when the node has no KV
  // transport or its cache does not match the descriptor's shape; INVALID_ARGUMENT for a bad
  // descriptor; the engine's errors; the transfer's final status when it fails.
  grpc::Status Prefill(grpc::ServerContext* context,
                       const ::pdserve::node::v1::PrefillRequest* request,
                       ::pdserve::node::v1::PrefillResponse* response) override;

 private:
  NodeState& state_;
  Histogram* transfer_s_ = nullptr;
  Histogram* tail_s_ = nullptr;
  Counter* bytes_ = nullptr;
  Family<Counter>* failures_ = nullptr;
};

}  // namespace pd::node
