// pdserve.node.v1.Decode over a Scheduler: pd-decode's service.
//
// Generate runs one request on the engine and streams its token ids back; the last message carries
// the finish. Without a reservation the node prefills the prompt itself (the colocated fallback,
// and the path a router takes on retries: prompt + tokens already sent). Reserve accepts a request
// whose prompt's KV a prefill node pushes (KvReceiver); Generate with that reservation attaches to
// it and streams it (docs/kv_transfer.md, "In the cluster"). SendPrefix hands the part of a
// reservation's prompt that this node had cached to a prefill node that lacks it (docs/cluster.md,
// "Prefix pull").
//
// Ownership: borrows the NodeState (and through it the engine), which must outlive it. Thread
// safety: one gRPC sync-server thread per call; the engine's sinks only fill a per-call queue.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/sched/engine_api.h"
#include "node/kv_receiver.h"
#include "node/node_server.h"
#include "node/queue_sink.h"
#include "pdserve/node/v1/node.grpc.pb.h"

namespace pd::node {

class DecodeService final : public ::pdserve::node::v1::Decode::Service {
 public:
  // `receiver` (null when the node receives no KV) opens the node's KV reservations.
  explicit DecodeService(NodeState& state, KvReceiver* receiver = nullptr)
      : state_(state), receiver_(receiver) {}

  // FAILED_PRECONDITION when the node receives no KV; INVALID_ARGUMENT for a bad deadline;
  // otherwise the engine's acceptance errors (KvReceiver::Reserve).
  grpc::Status Reserve(grpc::ServerContext* context,
                       const ::pdserve::node::v1::ReserveRequest* request,
                       ::pdserve::node::v1::ReserveResponse* response) override;

  // FAILED_PRECONDITION when the node receives no KV; OK otherwise (KvReceiver::Drop).
  grpc::Status Release(grpc::ServerContext* context,
                       const ::pdserve::node::v1::ReleaseRequest* request,
                       ::pdserve::node::v1::ReleaseResponse* response) override;

  // UNAVAILABLE while draining (unless attaching to a reservation); the engine's Submit errors;
  // NOT_FOUND for an unknown reservation. A request that fails after it started ends with its
  // status instead of a finish.
  grpc::Status Generate(grpc::ServerContext* context,
                        const ::pdserve::node::v1::GenerateRequest* request,
                        grpc::ServerWriter<::pdserve::node::v1::GenerateResponse>* writer) override;

  // Runs the reservation's prompt prefix plus one token (the cached rows are reused: one row is
  // computed) and pushes the prefix's blocks to the caller's descriptor (kv_push.h). Errors as
  // the proto says (node.proto, Decode.SendPrefix).
  grpc::Status SendPrefix(grpc::ServerContext* context,
                          const ::pdserve::node::v1::SendPrefixRequest* request,
                          ::pdserve::node::v1::SendPrefixResponse* response) override;

 private:
  static engine::GenerationRequest ToEngine(const ::pdserve::node::v1::ReserveRequest& reserve);
  // Relays request `id`'s tokens and finish from `sink` to `writer`; cancels it when the call is.
  grpc::Status Stream(grpc::ServerContext* context, const std::string& id,
                      const std::shared_ptr<QueueSink>& sink,
                      grpc::ServerWriter<::pdserve::node::v1::GenerateResponse>* writer);

  NodeState& state_;
  KvReceiver* const receiver_;
};

}  // namespace pd::node
