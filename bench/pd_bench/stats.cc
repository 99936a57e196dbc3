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

}  // namespace pd::bench
