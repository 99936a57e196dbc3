// The sink through which a node's RPC thread waits for its request's tokens: the engine thread
// fills it (OnTokens / OnFinish), the RPC thread drains it (Wait). Used by both roles' services.
// Thread safety: every method from any thread.
#pragma once

#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/sched/engine_api.h"

namespace pd::node {

// A GenerationSink that hands tokens and the finish to the RPC thread waiting on it.
class QueueSink final : public engine::GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>& tokens) override;
  void OnFinish(const engine::FinishInfo& info) override;
  // Waits until tokens or the finish are there, or `deadline`; moves the tokens out. Returns
  // true when something arrived.
  bool Wait(absl::Time deadline, std::vector<int32_t>* tokens,
            std::optional<engine::FinishInfo>* finish);

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::optional<engine::FinishInfo> finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::node
