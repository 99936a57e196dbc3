// Next-token distribution comparisons shared by the KV accuracy benchmarks (bench/kv_int8/kv_kl.cc,
// bench/kv_transfer/int8_wire_kl.cc): log-softmax over the full vocabulary in F64, the exact KL
// divergence between two such rows, and the argmax. Pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace pd::bench {

// log_softmax of one row of `n` logits, in F64.
inline void LogSoftmax(const float* x, int64_t n, std::vector<double>* out) {
  out->resize(n);
  double m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, double{x[i]});
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double{x[i]} - m);
  const double lse = m + std::log(sum);
  for (int64_t i = 0; i < n; ++i) (*out)[i] = double{x[i]} - lse;
}

// KL(p || q) in nats from the log-probabilities of p and q (same length, from LogSoftmax).
inline double KlDivergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (size_t v = 0; v < log_p.size(); ++v) kl += std::exp(log_p[v]) * (log_p[v] - log_q[v]);
  return kl;
}

inline int64_t ArgMax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

}  // namespace pd::bench
