#include "node/queue_sink.h"

namespace pd::node {

void QueueSink::OnTokens(const std::vector<int32_t>& tokens) {
  absl::MutexLock lock(&mu_);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

void QueueSink::OnFinish(const engine::FinishInfo& info) {
  absl::MutexLock lock(&mu_);
  finish_ = info;
}

bool QueueSink::Wait(absl::Time deadline, std::vector<int32_t>* tokens,
                     std::optional<engine::FinishInfo>* finish) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !tokens_.empty() || finish_.has_value();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!ready()) return false;
  tokens->insert(tokens->end(), tokens_.begin(), tokens_.end());
  tokens_.clear();
  if (finish_) *finish = finish_;
  return true;
}

}  // namespace pd::node
