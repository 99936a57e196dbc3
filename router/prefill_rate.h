// How fast a prefill node computes prompts, as the router sees it, and so how long a prompt placed
// there now will wait for its KV (docs/cluster.md, "The disaggregated request": the transfer's
// deadline).
//
// The rate is prompt tokens finished per second of the node's busy time: the time during which
// at least one of the router's prefills was on the node. Idle gaps do not dilute it, and prompts
// that overlap on the node (its scheduler batches their chunks) do not inflate it, as a per-request
// time would. Older work fades: once the busy time counted passes the window, both the tokens and
// the time are halved, so the rate follows a node that slows down (or another tenant on its cores)
// within about one window of work.
//
// Not thread-safe: the owner (NodeRegistry) calls it under its lock. Time is passed in, so tests
// drive it without sleeping.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace pd::router {

class PrefillRate {
 public:
  // Busy time over which the rate is measured before older work is halved.
  static constexpr absl::Duration kWindow = absl::Seconds(120);
  // No rate before this much evidence: a first prefill's time is mostly fixed costs.
  static constexpr absl::Duration kMinBusy = absl::Milliseconds(500);
  static constexpr int64_t kMinTokens = 256;

  // The router's prefills on the node are now `active` (AddActive): a busy period starts when
  // they go from 0 to more and ends when they go back to 0.
  void Active(int active, absl::Time now);
  // A prefill finished on the node, having computed `tokens` prompt tokens (those its prefix
  // cache or a pull supplied are not counted).
  void Finished(int64_t tokens, absl::Time now);
  // Tokens per second of busy time; nullopt until kMinBusy and kMinTokens are reached.
  std::optional<double> TokensPerSecond() const;
  // The time until `backlog + tokens` prompt tokens are computed at the measured rate: how long a
  // prompt of `tokens` waits for its KV behind `backlog` tokens queued or running there. nullopt
  // while the rate is unknown.
  std::optional<absl::Duration> Wait(int64_t backlog, int64_t tokens) const;

 private:
  int active_ = 0;
  absl::Time busy_since_;  // while active_ > 0: start of the time not yet in busy_
  absl::Duration busy_;    // busy time up to the last finished prefill (or the last period's end)
  double tokens_ = 0;      // prompt tokens finished in busy_
};

}  // namespace pd::router
