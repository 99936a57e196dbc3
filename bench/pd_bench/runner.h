// Drives a workload against an ApiClient: the warm-up, then the measured phase with its arrival
// processes, one thread per in-flight request, and the progress line on stderr.
//
// Arrival processes of the measured phase:
//   * the shared one, over the classes without their own (picked by weight): Poisson arrivals at
//     `rate`, or a closed loop of `concurrency` streams (each sends its next request when the
//     previous one ends);
//   * one per class that has `rate` or `concurrency` (--mix), of the same two kinds.
// All of them draw from one budget: `num_requests` measured requests in total, and no new request
// after `duration_s`; requests in flight at the end run to completion.
//
// Thread safety: RunBenchmark blocks its caller and owns (starts and joins) every thread it uses.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "bench/pd_bench/client.h"
#include "bench/pd_bench/conversation.h"
#include "bench/pd_bench/stats.h"
#include "bench/pd_bench/workload.h"

namespace pd::bench {

struct RunOptions {
  std::optional<double> rate;       // shared Poisson process, requests/s
  std::optional<int> concurrency;   // shared closed loop (default 1 when neither is set)
  std::optional<int> max_inflight;  // rate mode: an arrival waits while this many requests of its
                                    // Poisson process are in flight
  int64_t num_requests = 0;         // measured requests in total; 0 = no limit
  double duration_s = 0;            // no new request after this; 0 = no limit
  int warmup = 0;                   // warm-up requests (closed loop), excluded from the statistics
  uint64_t seed = 0;                // lengths, prompts and arrival times
  bool progress = true;             // progress line on stderr
  // Set from another thread (a signal handler) to stop sending; requests in flight finish.
  const std::atomic<bool>* stop = nullptr;
};

struct RunResult {
  std::vector<RequestRecord> records;  // warm-up and measured, in completion order
  double duration_s = 0;               // the measured phase: first send to last end
};

// Precondition: options and classes validated (ValidateRun), client probed.
RunResult RunBenchmark(const RunOptions& options, const std::vector<WorkloadClass>& classes,
                       ApiClient& client);

// INVALID_ARGUMENT when the combination cannot run: no stop condition, both rate and concurrency,
// shared classes without a process (never: concurrency 1 is the default), non-positive values.
absl::Status ValidateRun(const RunOptions& options, const std::vector<WorkloadClass>& classes);

// Multi-turn mode (conversation.h): the arrival process (`rate` or `concurrency`, as above) starts
// conversations instead of requests: a closed loop keeps `concurrency` conversations going, a
// Poisson process starts `rate` conversations per second (at most `max_inflight` at once). A
// conversation sends its turns one after another, each after the previous answer and the think
// time, and ends early when a turn fails. `conversations.conversations` is the budget (0 = none);
// no turn is sent after `duration_s`, nor once `stop` is set. `num_requests` is not used. The
// warm-up is `warmup` one-turn conversations with their own system prompts. The records have
// class_index 0, `conversation` and `turn` set.
// Precondition: ValidateConversationRun, client probed.
RunResult RunConversations(const RunOptions& options, const ConversationOptions& conversations,
                           ApiClient& client);

// INVALID_ARGUMENT as ValidateRun, and for invalid conversation options or no stop condition
// (neither conversations nor duration_s).
absl::Status ValidateConversationRun(const RunOptions& options,
                                     const ConversationOptions& conversations);

}  // namespace pd::bench
