// pdserve.node.v1.Prefill over a Scheduler: pd-prefill's service.
//
// Prefill runs a prompt (the engine's chunked prefill) and samples its first token. With a KV
// descriptor (Decode.Reserve's) it also pushes the prompt's K/V to that decode node (kv_push.h):
// the Scheduler's export hook hands each layer to the transfer as soon as the last prompt chunk has
// computed it, and the call answers once the decode node acknowledged every layer. Any transfer
// failure fails the call (the router then lets the decode node prefill).
//
// Prefix pull (docs/cluster.md): the descriptor says how many leading blocks of the prompt the
// decode node already holds. When this node's prefix cache lacks at least
// kv_transfer.prefix_pull_min_tokens of them, it reserves them in its own cache (a KvReceiver
// reservation of the prefix) and asks that decode node (PrefillRequest.kv_source) to send them
// (Decode.SendPrefix); they are filed in its prefix cache, and the prompt's prefill then starts
// after them. A pull that fails for any reason costs only the attempt: the prefix is computed.
//
// Metrics (docs/metrics.md): pdserve_kv_transfer_seconds (first layer pushed -> acknowledged),
// pdserve_kv_transfer_tail_seconds (last layer pushed -> acknowledged: what the transfer adds to
// TTFT), pdserve_kv_transfer_bytes_total, pdserve_kv_transfer_failures_total{code},
// pdserve_kv_prefix_pulls_total{result}, pdserve_kv_prefix_pull_tokens_total.
//
// Ownership: borrows the NodeState and the receiver. Thread safety: one gRPC sync-server thread
// per call.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "kvtransfer/kv_transport.h"
#include "node/kv_receiver.h"
#include "node/node_server.h"
#include "pdserve/node/v1/node.grpc.pb.h"

namespace pd::node {

class PrefillService final : public ::pdserve::node::v1::Prefill::Service {
 public:
  // `receiver` (null: no prefix pulls) opens this node's reservations of pulled prefixes.
  explicit PrefillService(NodeState& state, KvReceiver* receiver = nullptr);

  // UNAVAILABLE while draining; FAILED_PRECONDITION for a descriptor when the node has no KV
  // transport or its cache does not match the descriptor's shape; INVALID_ARGUMENT for a bad
  // descriptor; the engine's errors; the transfer's final status when it fails.
  grpc::Status Prefill(grpc::ServerContext* context,
                       const ::pdserve::node::v1::PrefillRequest* request,
                       ::pdserve::node::v1::PrefillResponse* response) override;

 private:
  // Fetches the prompt's leading blocks that the decode node holds (d.geometry.first_block) and
  // this node's cache lacks; returns the tokens pulled (0: none, for whatever reason).
  int PullPrefix(grpc::ServerContext* context, const ::pdserve::node::v1::PrefillRequest& request,
                 const kvtransfer::TransferDescriptor& d);
  // How many leading blocks of `prompt` this node's last cache summary holds.
  int OwnCachedBlocks(absl::Span<const int32_t> prompt, int max_blocks) const;
  // The gRPC client (generated Decode::Stub) of the decode node at `address`, made once.
  ::pdserve::node::v1::Decode::Stub& DecodeClient(const std::string& address);
  void CountPull(std::string_view result);

  NodeState& state_;
  KvReceiver* const receiver_;
  Histogram* transfer_s_ = nullptr;
  Histogram* tail_s_ = nullptr;
  Counter* bytes_ = nullptr;
  Family<Counter>* failures_ = nullptr;
  Family<Counter>* pulls_ = nullptr;  // {result}
  Counter* pull_tokens_ = nullptr;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<::pdserve::node::v1::Decode::Stub>> decode_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::node
