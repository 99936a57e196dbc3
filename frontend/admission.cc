#include "frontend/admission.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"
#include "frontend/frontend.h"

namespace pd::frontend {

namespace {
constexpr double kWeight = 0.2;  // of each new interval in the mean
}  // namespace

absl::Status Admission::Admit(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (options_.max_waiting > 0 && waiting_ >= options_.max_waiting) {
    // Roughly when one slot frees up at the measured rate; at least a second.
    const int retry = std::max(1, static_cast<int>(std::ceil(absl::ToDoubleSeconds(interval_))));
    return OverloadedError(StrCat("server overloaded: ", waiting_,
                                  " requests are waiting for their first token (limit ",
                                  options_.max_waiting, "); retry in ", retry, " s"),
                           retry);
  }
  if (options_.ttft_slo > absl::ZeroDuration() && waiting_ > 0 &&
      interval_ > absl::ZeroDuration()) {
    const absl::Duration expected = interval_ * (waiting_ + 1);
    if (expected > options_.ttft_slo) {
      // When the queue will have drained to what the SLO allows.
      const int retry = std::max(
          1, static_cast<int>(std::ceil(absl::ToDoubleSeconds(expected - options_.ttft_slo))));
      return OverloadedError(
          StrCat("server overloaded: ", waiting_, " requests are waiting; a new one would wait about ",
                 absl::ToInt64Milliseconds(expected), " ms for its first token (SLO ",
                 absl::ToInt64Milliseconds(options_.ttft_slo), " ms); retry in ", retry, " s"),
          retry);
    }
  }
  if (waiting_ == 0) epoch_ = now;
  ++waiting_;
  return absl::OkStatus();
}

void Admission::Leave(absl::Time now, bool served) {
  absl::MutexLock lock(&mu_);
  if (waiting_ == 0) return;
  if (served && now >= epoch_) {
    const absl::Duration d = now - epoch_;
    interval_ = interval_ == absl::ZeroDuration() ? d : interval_ * (1 - kWeight) + d * kWeight;
  }
  if (served) epoch_ = now;
  --waiting_;
}

int Admission::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

absl::Duration Admission::interval() const {
  absl::MutexLock lock(&mu_);
  return interval_;
}

}  // namespace pd::frontend
