#include "prefill_node/prefill_service.h"

#include "decode_node/decode_service.h"

namespace pd::node {
namespace nv1 = ::pdserve::node::v1;

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const nv1::PrefillRequest* request,
                                     nv1::PrefillResponse* response) {
  state_.active().fetch_add(1);
  struct Done {
    NodeState& s;
    ~Done() { s.active().fetch_sub(1); }
  } done{state_};
  if (state_.draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill node is draining (shutting down)");
  }
  if (request->has_kv() && !request->kv().transport().empty()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "kv: pushing KV to a decode node is not built yet (kvtransfer/ pending)");
  }
  engine::GenerationRequest g;
  g.id = request->request_id();
  g.prompt.assign(request->prompt().begin(), request->prompt().end());
  g.sampling = FromProto(request->sampling());
  g.max_tokens = 1;
  g.stop_token_ids.insert(request->stop_token_ids().begin(), request->stop_token_ids().end());
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    g.deadline = absl::FromChrono(context->deadline());
  }
  const std::string id = g.id;
  auto sink = std::make_shared<QueueSink>();
  const absl::Time start = absl::Now();
  if (absl::Status s = state_.engine().Submit(std::move(g), sink); !s.ok()) return ToGrpc(s);
  std::vector<int32_t> tokens;
  std::optional<engine::FinishInfo> finish;
  bool cancelled = false;
  while (!finish) {
    sink->Wait(absl::Now() + absl::Milliseconds(20), &tokens, &finish);
    if (!cancelled && context->IsCancelled()) {
      state_.engine().Cancel(id, engine::FinishReason::kCancelled);
      cancelled = true;
    }
  }
  if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
  if (finish->reason == engine::FinishReason::kError) return ToGrpc(finish->status);
  if (finish->reason == engine::FinishReason::kDeadline) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed during prefill");
  }
  response->set_stopped(tokens.empty());
  response->set_first_token(tokens.empty() ? -1 : tokens[0]);
  response->set_prefill_s(absl::ToDoubleSeconds(absl::Now() - start));
  return grpc::Status::OK;
}

}  // namespace pd::node
