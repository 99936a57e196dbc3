#include "router/prefill_rate.h"

#include <algorithm>

namespace pd::router {

void PrefillRate::Active(int active, absl::Time now) {
  const int before = active_;
  active_ = std::max(0, active);
  if (before == 0 && active_ > 0) {
    busy_since_ = now;
  } else if (before > 0 && active_ == 0) {
    busy_ += std::max(absl::ZeroDuration(), now - busy_since_);
  }
}

void PrefillRate::Finished(int64_t tokens, absl::Time now) {
  if (tokens <= 0) return;
  if (active_ > 0) {  // fold the open period in, so that halving below covers it too
    busy_ += std::max(absl::ZeroDuration(), now - busy_since_);
    busy_since_ = now;
  }
  tokens_ += static_cast<double>(tokens);
  while (busy_ > kWindow) {
    busy_ /= 2;
    tokens_ /= 2;
  }
}

std::optional<double> PrefillRate::TokensPerSecond() const {
  // The busy time up to the last finished prefill: a period still open has done work whose
  // tokens are not counted yet, so including it would understate the rate.
  if (busy_ < kMinBusy || tokens_ < static_cast<double>(kMinTokens)) return std::nullopt;
  return tokens_ / absl::ToDoubleSeconds(busy_);
}

std::optional<absl::Duration> PrefillRate::Wait(int64_t backlog, int64_t tokens) const {
  const std::optional<double> rate = TokensPerSecond();
  if (!rate) return std::nullopt;
  const double work =
      static_cast<double>(std::max<int64_t>(0, backlog) + std::max<int64_t>(0, tokens));
  return absl::Seconds(work / *rate);
}

}  // namespace pd::router
