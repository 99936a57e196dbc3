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
  // Multi-turn mode: the conversation (0, 1, ...) and its user turn (1-based); -1 and 0 otherwise.
  int64_t conversation = -1;
  int turn = 0;
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
  // Prompt tokens the server took from its prefix cache, when it reported them: HTTP
  // usage.prompt_tokens_details.cached_tokens, gRPC Usage.cached_tokens. The gRPC field is a
  // proto3 int32 without presence, so there 0 also stands for "not reported"
  // (cached_tokens_implicit; see EffectiveCachedTokens).
  std::optional<int> cached_tokens;
  bool cached_tokens_implicit = false;
  std::string finish_reason;
  std::string text;  // the streamed text, with BenchRequest::keep_text only

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

// Multi-turn mode (records with turn >= 1): statistics per user turn, and how much of the prompts
// the server's prefix cache served.

// Whether the measured records show that the server reports cached tokens at all: some record has
// an explicit count (HTTP), or an implicit one (gRPC) above 0.
bool ServerReportsCachedTokens(const std::vector<const RequestRecord*>& records);

// r's cached-token count as measured: unset when not reported, and an implicit 0 counts as not
// reported unless `server_reports` (ServerReportsCachedTokens over the run).
std::optional<int> EffectiveCachedTokens(const RequestRecord& r, bool server_reports);

struct TurnSummary {
  int turn = 0;  // 1-based; 0 in the pooled summaries
  int64_t requests = 0, completed = 0, failed = 0;
  DistStats ttft_ms, e2e_ms;  // over completed requests
  // Means over the completed requests whose usage has the count; unset when none has.
  std::optional<double> prompt_tokens_mean;  // the server's usage.prompt_tokens
  std::optional<double> cached_tokens_mean;  // EffectiveCachedTokens
  // Over the completed requests that report both counts (hit_rate_requests of them).
  int64_t hit_rate_requests = 0, prompt_tokens_sum = 0, cached_tokens_sum = 0;
  std::optional<double> cache_hit_rate;  // cached_tokens_sum / prompt_tokens_sum, when > 0
};

struct TurnReport {
  std::vector<TurnSummary> turns;  // turns 1 .. the highest measured one, in order
  TurnSummary all;                 // every turn pooled
  TurnSummary later;               // turns >= 2 pooled
  bool cached_reported = false;    // ServerReportsCachedTokens
  // Median TTFT of turns >= 2 (pooled) over the median TTFT of turn 1; unset without both.
  std::optional<double> ttft_p50_ratio;
};

// Over the non-warm-up records with turn >= 1 in `records`.
TurnReport SummarizeTurns(const std::vector<const RequestRecord*>& records);

}  // namespace pd::bench
