// Poisson arrivals: exponential gaps of mean 1/rate, Poisson counts per window, fixed seed.
#include "bench/pd_bench/arrivals.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pd::bench {
namespace {

TEST(PoissonArrivalsTest, SameSeedSameSchedule) {
  PoissonArrivals a(5, 11), b(5, 11), c(5, 12);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double x = a.NextGap();
    EXPECT_EQ(x, b.NextGap());
    differs |= x != c.NextGap();
  }
  EXPECT_TRUE(differs);
}

TEST(PoissonArrivalsTest, GapsAreExponentialWithMeanOneOverRate) {
  constexpr double kRate = 8;
  constexpr int kN = 200000;
  PoissonArrivals arrivals(kRate, 2024);
  double sum = 0, sq = 0;
  int below_mean = 0;
  std::vector<double> times;
  times.reserve(kN);
  double t = 0;
  for (int i = 0; i < kN; ++i) {
    const double g = arrivals.NextGap();
    ASSERT_GT(g, 0);
    sum += g;
    sq += g * g;
    below_mean += g < 1 / kRate;
    t += g;
    times.push_back(t);
  }
  const double mean = sum / kN;
  const double sd = std::sqrt(sq / kN - mean * mean);
  EXPECT_NEAR(mean, 1 / kRate, 0.01 / kRate);  // standard error is 0.22% of the mean
  EXPECT_NEAR(sd / mean, 1.0, 0.02);           // exponential: coefficient of variation 1
  // P(gap < mean) = 1 - 1/e for an exponential.
  EXPECT_NEAR(static_cast<double>(below_mean) / kN, 1 - std::exp(-1.0), 0.005);

  // Counts in 1 s windows are Poisson(rate): mean = variance = rate (index of dispersion 1).
  const int windows = static_cast<int>(times.back());
  std::vector<int> counts(windows, 0);
  for (const double x : times) {
    if (x < windows) ++counts[static_cast<int>(x)];
  }
  double cm = 0, cv = 0;
  for (const int c : counts) cm += c;
  cm /= windows;
  for (const int c : counts) cv += (c - cm) * (c - cm);
  cv /= windows - 1;
  EXPECT_NEAR(cm, kRate, 0.1);
  EXPECT_NEAR(cv / cm, 1.0, 0.06);
}

}  // namespace
}  // namespace pd::bench
