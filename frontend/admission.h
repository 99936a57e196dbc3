// Admission of requests before any work is spent on them (docs/security.md, "Overload"): the
// front end asks Admit() before it applies a chat template or tokenizes, so that a request the
// server cannot serve in time is refused in microseconds, with a hint of when to retry.
//
// A request is "waiting" from Admit() until its first token (or its end). Admit() refuses when
//   - `max_waiting` requests are already waiting, or
//   - a TTFT SLO is set and the new request's predicted wait exceeds slo_headroom x the SLO.
// The prediction is (waiting + 1) x the measured interval between first tokens while requests
// waited (an exponentially weighted mean, weight 0.2 per observation): the rate at which this
// server turns waiting requests into running ones, whatever limits it (prefill speed, KV room,
// running-sequence cap, remote nodes). While requests wait, the time since the last first token
// is a lower bound on that interval: a server that has not produced a first token yet (just
// started) or has stalled admits only what that bound allows. It is then calibrated by how wrong such predictions were:
// each admitted request remembers its prediction (its Ticket), and when its first token comes the
// ratio actual / predicted joins a window of the last kCalibrationWindow ratios. Once 8 are in,
// predictions are multiplied by the window's 99th percentile. Under sustained overload every
// admitted request arrives at the limit, so this percentile is what keeps the admitted requests'
// p99 TTFT inside the SLO rather than their median.
//
// Thread safety: every method may be called from any thread. Times are passed in, for tests.
#pragma once

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pd::frontend {

struct AdmissionOptions {
  int max_waiting = 256;                          // 0 = no cap
  absl::Duration ttft_slo = absl::ZeroDuration();  // 0 = no SLO-based refusal
  double slo_headroom = 0.9;  // the calibrated prediction may use this much of the SLO
};

class Admission {
 public:
  static constexpr int kCalibrationWindow = 256;
  static constexpr int kMinCalibration = 8;

  // What an admitted request carries until it leaves the queue.
  struct Ticket {
    absl::Time admitted;
    absl::Duration predicted = absl::ZeroDuration();  // uncalibrated; 0: no prediction then
  };

  explicit Admission(AdmissionOptions options) : options_(options) {}

  // A ticket (the request now counts as waiting), or RESOURCE_EXHAUSTED with a retry hint
  // (RetryAfterSeconds in frontend.h).
  absl::StatusOr<Ticket> Admit(absl::Time now);
  // The request left the queue: its first token (`served`), or its end without one (cancelled,
  // failed: not a measure of the service rate).
  void Leave(absl::Time now, bool served, const Ticket& ticket);

  int waiting() const;
  // The measured interval between first tokens (zero before the first measure).
  absl::Duration interval() const;
  // The factor predictions are multiplied by (1 until kMinCalibration ratios are in).
  double calibration() const;

 private:
  double CalibrationLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AdmissionOptions options_;
  mutable absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time epoch_ ABSL_GUARDED_BY(mu_);  // start of the interval being measured
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::vector<double> ratios_ ABSL_GUARDED_BY(mu_);  // ring of actual / predicted
  size_t next_ratio_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd::frontend
