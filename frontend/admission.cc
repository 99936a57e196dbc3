#include "frontend/admission.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"
#include "frontend/frontend.h"

namespace pd::frontend {

namespace {
constexpr double kWeight = 0.2;      // of each new interval in the mean
constexpr double kQuantile = 0.99;   // of the prediction errors
}  // namespace

double Admission::CalibrationLocked() const {
  if (static_cast<int>(ratios_.size()) < kMinCalibration) return 1.0;
  std::vector<double> r = ratios_;
  const size_t k = static_cast<size_t>(std::ceil(kQuantile * (r.size() - 1)));
  std::nth_element(r.begin(), r.begin() + k, r.end());
  return r[k];
}

absl::StatusOr<Admission::Ticket> Admission::Admit(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (options_.max_waiting > 0 && waiting_ >= options_.max_waiting) {
    // Roughly when one slot frees up at the measured rate; at least a second.
    const int retry = std::max(1, static_cast<int>(std::ceil(absl::ToDoubleSeconds(interval_))));
    return OverloadedError(StrCat("server overloaded: ", waiting_,
                                  " requests are waiting for their first token (limit ",
                                  options_.max_waiting, "); retry in ", retry, " s"),
                           retry);
  }
  Ticket t;
  t.admitted = now;
  // While requests wait, the time since the last first token (or since the queue formed) bounds
  // the interval from below: a stalled or not yet measured server admits no more than it shows.
  const absl::Duration interval =
      waiting_ > 0 ? std::max(interval_, now - epoch_) : interval_;
  if (interval > absl::ZeroDuration()) t.predicted = interval * (waiting_ + 1);
  if (options_.ttft_slo > absl::ZeroDuration() && waiting_ > 0 && t.predicted > absl::ZeroDuration()) {
    const absl::Duration expected = t.predicted * CalibrationLocked();
    const absl::Duration allowed = options_.ttft_slo * options_.slo_headroom;
    if (expected > allowed) {
      // When the queue will have drained to what the SLO allows.
      const int retry =
          std::max(1, static_cast<int>(std::ceil(absl::ToDoubleSeconds(expected - allowed))));
      return OverloadedError(
          StrCat("server overloaded: ", waiting_, " requests are waiting; a new one would wait about ",
                 absl::ToInt64Milliseconds(expected), " ms for its first token (SLO ",
                 absl::ToInt64Milliseconds(options_.ttft_slo), " ms); retry in ", retry, " s"),
          retry);
    }
  }
  if (waiting_ == 0) epoch_ = now;
  ++waiting_;
  return t;
}

void Admission::Leave(absl::Time now, bool served, const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  if (waiting_ == 0) return;
  if (served && now >= epoch_) {
    const absl::Duration d = now - epoch_;
    interval_ = interval_ == absl::ZeroDuration() ? d : interval_ * (1 - kWeight) + d * kWeight;
  }
  if (served) epoch_ = now;
  if (served && ticket.predicted > absl::ZeroDuration() && now >= ticket.admitted) {
    const double ratio = absl::FDivDuration(now - ticket.admitted, ticket.predicted);
    if (static_cast<int>(ratios_.size()) < kCalibrationWindow) {
      ratios_.push_back(ratio);
    } else {
      ratios_[next_ratio_] = ratio;
      next_ratio_ = (next_ratio_ + 1) % kCalibrationWindow;
    }
  }
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

double Admission::calibration() const {
  absl::MutexLock lock(&mu_);
  return CalibrationLocked();
}

}  // namespace pd::frontend
