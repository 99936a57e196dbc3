// What pd-bench measures per request, and the statistics over a set of requests.
//
// Definitions (client side, std::chrono::steady_clock; bench/pd_bench/README.md has the long form):
//   TTFT  send -> first streamed chunk that carries text or token ids
//   E2E   send -> end of the stream (the finish message / [DONE])
//   TPOT  (E2E - TTFT) / (output_tokens - 1), for requests with at least 2 output tokens
//   ITL   gaps between consecutive content chunks of one stream
// output_tokens is the server's usage.completion_tokens when it reports it, else the tokens seen
// in the stream. Throughputs divide by the measured phase's wall time.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pd::bench {

struct RequestRecord {
  int64_t id = 0;
  int class_index = 0;
  bool warmup = false;  // warm-up requests are excluded from every statistic
  int requested_prompt_tokens = 0;
  int requested_output_tokens = 0;

  // Seconds since the benchmark's origin; scheduled_s is the Poisson arrival time (rate mode), or
  // equal to send_s (closed loop).
  double scheduled_s = 0;
  double send_s = 0;
  // Seconds since send_s. ttft_s is negative when no content chunk arrived.
  double ttft_s = -1;
  double e2e_s = 0;
  std::vector<double> itl_s;  // one gap per content chunk after the first

  int stream_tokens = 0;             // tokens seen in the stream (token ids, else 1 per chunk)
  std::optional<int> prompt_tokens;  // server's usage, when reported
  std::optional<int> completion_tokens;
  std::string finish_reason;

  bool ok = false;
  std::string error;  // status key: a gRPC code name, "http_503", "transport:...", ...
  std::string error_message;

  // The measured quantities, as defined above.
  int OutputTokens() const { return completion_tokens ? *completion_tokens : stream_tokens; }
  double Ttft() const { return ttft_s >= 0 ? ttft_s : e2e_s; }
  std::optional<double> Tpot() const;
};

// Linear interpolation between closest ranks (numpy's default "linear" method): the p-th
// percentile (0 <= p <= 100) of `sorted` (ascending, non-empty) sits at rank p/100 * (n - 1).
double Percentile(const std::vector<double>& sorted, double p);

struct DistStats {
  size_t n = 0;  // all fields but n are meaningless when n == 0
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
// Sorts `values` and summarises them.
DistStats Describe(std::vector<double> values);

// Service-level objectives for goodput; an unset objective is not checked.
struct Slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  bool any() const { return ttft_ms || tpot_ms; }
};
// A successful request whose TTFT and TPOT are within `slo`. A request with fewer than two output
// tokens has no TPOT and meets any TPOT objective.
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

struct Summary {
  int64_t requests = 0;  // measured requests sent
  int64_t completed = 0;
  int64_t failed = 0;
  std::map<std::string, int64_t> errors;  // status key -> count
  double duration_s = 0;

  int64_t output_tokens = 0;          // over completed requests
  int64_t prompt_tokens = 0;          // server-reported where available, else requested
  double request_throughput = 0;      // completed / duration
  double output_throughput = 0;       // output tokens / duration
  double total_token_throughput = 0;  // (prompt + output tokens) / duration

  double requested_prompt_mean = 0;
  std::optional<double> server_prompt_mean;  // over requests whose usage reported prompt_tokens
  double requested_output_mean = 0;
  double output_mean = 0;

  DistStats ttft_ms, tpot_ms, itl_ms, e2e_ms;
  DistStats dispatch_lag_ms;  // send - scheduled arrival (rate mode): the client falling behind

  int64_t good = 0;    // completed requests meeting the SLOs (all completed when none is set)
  double goodput = 0;  // good / duration
};

// Statistics over the non-warm-up records in `records` (callers pass one class's records for a
// per-class summary); `duration_s` is the measured phase's wall time (> 0).
Summary Summarize(const std::vector<const RequestRecord*>& records, double duration_s,
                  const Slo& slo);

}  // namespace pd::bench
