#include "bench/pd_bench/stats.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"

namespace pd::bench {

std::optional<double> RequestRecord::Tpot() const {
  const int n = OutputTokens();
  if (!ok || n < 2) return std::nullopt;
  return std::max(0.0, e2e_s - Ttft()) / (n - 1);
}

double Percentile(const std::vector<double>& sorted, double p) {
  PD_CHECK(!sorted.empty());
  PD_CHECK(p >= 0 && p <= 100);
  const double rank = p / 100.0 * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - lo;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

DistStats Describe(std::vector<double> values) {
  DistStats d;
  d.n = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (const double v : values) sum += v;
  d.mean = sum / values.size();
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  d.max = values.back();
  return d;
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok) return false;
  if (slo.ttft_ms && r.Ttft() * 1e3 > *slo.ttft_ms) return false;
  if (slo.tpot_ms) {
    const std::optional<double> tpot = r.Tpot();
    if (tpot && *tpot * 1e3 > *slo.tpot_ms) return false;
  }
  return true;
}

Summary Summarize(const std::vector<const RequestRecord*>& records, double duration_s,
                  const Slo& slo) {
  PD_CHECK(duration_s > 0);
  Summary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e, lag;
  double requested_prompt = 0, requested_output = 0, server_prompt = 0, output = 0;
  int64_t server_prompt_n = 0;
  for (const RequestRecord* r : records) {
    if (r->warmup) continue;
    ++s.requests;
    requested_prompt += r->requested_prompt_tokens;
    requested_output += r->requested_output_tokens;
    lag.push_back(std::max(0.0, r->send_s - r->scheduled_s) * 1e3);
    if (!r->ok) {
      ++s.failed;
      ++s.errors[r->error.empty() ? "unknown" : r->error];
      continue;
    }
    ++s.completed;
    const int out = r->OutputTokens();
    s.output_tokens += out;
    output += out;
    if (r->prompt_tokens) {
      server_prompt += *r->prompt_tokens;
      ++server_prompt_n;
      s.prompt_tokens += *r->prompt_tokens;
    } else {
      s.prompt_tokens += r->requested_prompt_tokens;
    }
    ttft.push_back(r->Ttft() * 1e3);
    e2e.push_back(r->e2e_s * 1e3);
    if (const std::optional<double> t = r->Tpot()) tpot.push_back(*t * 1e3);
    for (const double gap : r->itl_s) itl.push_back(gap * 1e3);
    if (MeetsSlo(*r, slo)) ++s.good;
  }
  if (s.requests > 0) {
    s.requested_prompt_mean = requested_prompt / s.requests;
    s.requested_output_mean = requested_output / s.requests;
  }
  if (s.completed > 0) s.output_mean = output / s.completed;
  if (server_prompt_n > 0) s.server_prompt_mean = server_prompt / server_prompt_n;
  s.request_throughput = s.completed / duration_s;
  s.output_throughput = s.output_tokens / duration_s;
  s.total_token_throughput = (s.prompt_tokens + s.output_tokens) / duration_s;
  s.goodput = s.good / duration_s;
  s.ttft_ms = Describe(std::move(ttft));
  s.tpot_ms = Describe(std::move(tpot));
  s.itl_ms = Describe(std::move(itl));
  s.e2e_ms = Describe(std::move(e2e));
  s.dispatch_lag_ms = Describe(std::move(lag));
  return s;
}

bool ServerReportsCachedTokens(const std::vector<const RequestRecord*>& records) {
  for (const RequestRecord* r : records) {
    if (r->warmup || !r->cached_tokens) continue;
    if (!r->cached_tokens_implicit || *r->cached_tokens > 0) return true;
  }
  return false;
}

std::optional<int> EffectiveCachedTokens(const RequestRecord& r, bool server_reports) {
  if (!r.cached_tokens) return std::nullopt;
  if (r.cached_tokens_implicit && *r.cached_tokens == 0 && !server_reports) return std::nullopt;
  return r.cached_tokens;
}

namespace {

// Accumulates one TurnSummary.
class TurnAccumulator {
 public:
  void Add(const RequestRecord& r, bool server_reports) {
    ++s_.requests;
    if (!r.ok) {
      ++s_.failed;
      return;
    }
    ++s_.completed;
    ttft_.push_back(r.Ttft() * 1e3);
    e2e_.push_back(r.e2e_s * 1e3);
    const std::optional<int> cached = EffectiveCachedTokens(r, server_reports);
    if (r.prompt_tokens) {
      prompt_ += *r.prompt_tokens;
      ++prompt_n_;
    }
    if (cached) {
      cached_ += *cached;
      ++cached_n_;
    }
    if (r.prompt_tokens && cached) {
      ++s_.hit_rate_requests;
      s_.prompt_tokens_sum += *r.prompt_tokens;
      s_.cached_tokens_sum += *cached;
    }
  }

  TurnSummary Finish(int turn) {
    s_.turn = turn;
    s_.ttft_ms = Describe(std::move(ttft_));
    s_.e2e_ms = Describe(std::move(e2e_));
    if (prompt_n_ > 0) s_.prompt_tokens_mean = prompt_ / prompt_n_;
    if (cached_n_ > 0) s_.cached_tokens_mean = cached_ / cached_n_;
    if (s_.prompt_tokens_sum > 0) {
      s_.cache_hit_rate = static_cast<double>(s_.cached_tokens_sum) / s_.prompt_tokens_sum;
    }
    return s_;
  }

 private:
  TurnSummary s_;
  std::vector<double> ttft_, e2e_;
  double prompt_ = 0, cached_ = 0;
  int64_t prompt_n_ = 0, cached_n_ = 0;
};

}  // namespace

TurnReport SummarizeTurns(const std::vector<const RequestRecord*>& records) {
  TurnReport report;
  report.cached_reported = ServerReportsCachedTokens(records);
  std::vector<TurnAccumulator> turns;
  TurnAccumulator all, later;
  for (const RequestRecord* r : records) {
    if (r->warmup || r->turn < 1) continue;
    if (static_cast<size_t>(r->turn) > turns.size()) turns.resize(r->turn);
    turns[r->turn - 1].Add(*r, report.cached_reported);
    all.Add(*r, report.cached_reported);
    if (r->turn >= 2) later.Add(*r, report.cached_reported);
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    report.turns.push_back(turns[i].Finish(static_cast<int>(i) + 1));
  }
  report.all = all.Finish(0);
  report.later = later.Finish(0);
  if (!report.turns.empty() && report.turns[0].ttft_ms.n > 0 && report.later.ttft_ms.n > 0 &&
      report.turns[0].ttft_ms.p50 > 0) {
    report.ttft_p50_ratio = report.later.ttft_ms.p50 / report.turns[0].ttft_ms.p50;
  }
  return report;
}

}  // namespace pd::bench
