#include "decode_node/decode_role.h"

namespace pd::node {

absl::StatusOr<grpc::Service*> DecodeRole::Start(NodeState& state) {
  if (state.transport() != nullptr) {
    receiver_ =
        std::make_unique<KvReceiver>(*state.scheduler(), *state.transport(), state.metrics());
    state.SetReservationCount([r = receiver_.get()] { return r->live(); });
  }
  service_ = std::make_unique<DecodeService>(state, receiver_.get());
  return service_.get();
}

void DecodeRole::Stop() {
  if (receiver_ != nullptr) receiver_->Shutdown();
}

}  // namespace pd::node
