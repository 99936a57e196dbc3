// Admission of requests before any work is spent on them (docs/security.md, "Overload"): the
// front end asks Admit() before it applies a chat template or tokenizes, so that a request the
// server cannot serve in time is refused in microseconds, with a hint of when to retry.
//
// A request is "waiting" from Admit() until its first token (or its end). Admit() refuses when
//   - `max_waiting` requests are already waiting, or
//   - a TTFT SLO is set and the new request's expected wait, (waiting + 1) x the measured interval
//     between first tokens while requests waited, exceeds the SLO.
// The interval is an exponentially weighted mean (weight 0.2 on each new observation) of the time
// between consecutive first tokens while the queue stayed non-empty: the rate at which this
// server turns waiting requests into running ones, whatever limits it (prefill speed, KV room,
// running-sequence cap, remote nodes).
//
// Thread safety: every method may be called from any thread. Times are passed in, for tests.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pd::frontend {

struct AdmissionOptions {
  int max_waiting = 256;                          // 0 = no cap
  absl::Duration ttft_slo = absl::ZeroDuration();  // 0 = no SLO-based refusal
};

class Admission {
 public:
  explicit Admission(AdmissionOptions options) : options_(options) {}

  // OK (the request now counts as waiting) or RESOURCE_EXHAUSTED with a retry hint
  // (RetryAfterSeconds in frontend.h).
  absl::Status Admit(absl::Time now);
  // The request left the queue: its first token (`served`), or its end without one (cancelled,
  // failed: not a measure of the service rate).
  void Leave(absl::Time now, bool served);

  int waiting() const;
  // The measured interval between first tokens (zero before the first measure).
  absl::Duration interval() const;

 private:
  const AdmissionOptions options_;
  mutable absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time epoch_ ABSL_GUARDED_BY(mu_);  // start of the interval being measured
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace pd::frontend
