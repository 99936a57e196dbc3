// Test helper: Pearson's chi-square goodness-of-fit test of observed counts against exact
// probabilities, with cells of small expected count pooled (each pooled or kept cell expects at
// least min_expected), and its p-value from the regularized upper incomplete gamma function.
#pragma once

#include <cmath>
#include <vector>

#include "common/status.h"

namespace pd::engine::testing {

// Q(a, x) = Gamma(a, x) / Gamma(a): the series for x < a + 1, else Lentz's continued fraction.
inline double UpperRegularizedGamma(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_front = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && std::abs(term) > 1e-15 * std::abs(sum); ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - std::exp(log_front) * sum;
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1 - a, c = 1 / kTiny, d = 1 / b, f = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double delta = d * c;
    f *= delta;
    if (std::abs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_front) * f;
}

struct ChiSquare {
  double statistic = 0;
  int dof = 0;
  double p_value = 1;
};

// `observed[i]` counts of outcomes with exact probability `probs[i]` (summing to 1 over every
// possible outcome; outcomes never observed and never possible may be left out).
inline ChiSquare ChiSquareTest(const std::vector<double>& observed, const std::vector<double>& probs,
                               double min_expected = 5) {
  PD_CHECK(observed.size() == probs.size());
  double n = 0;
  for (double o : observed) n += o;
  ChiSquare r;
  int cells = 0;
  double pool_o = 0, pool_e = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = probs[i] * n;
    if (e < min_expected) {
      pool_o += observed[i];
      pool_e += e;
      continue;
    }
    r.statistic += (observed[i] - e) * (observed[i] - e) / e;
    ++cells;
  }
  if (pool_e > 0) {
    r.statistic += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++cells;
  } else if (pool_o > 0) {
    r.statistic = INFINITY;  // outcomes the exact distribution says cannot happen
  }
  r.dof = std::max(1, cells - 1);
  r.p_value = std::isinf(r.statistic) ? 0 : UpperRegularizedGamma(r.dof / 2.0, r.statistic / 2);
  return r;
}

}  // namespace pd::engine::testing
