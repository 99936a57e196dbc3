#include "common/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace pd {
namespace {

TEST(MetricsTest, CounterWithoutLabelsExactText) {
  MetricsRegistry registry;
  auto& c = registry.AddCounter("pd_things_total", "Things done.");
  c.Get().Increment();
  c.Get().Increment(2.5);
  EXPECT_EQ(registry.Render(),
            "# HELP pd_things_total Things done.\n"
            "# TYPE pd_things_total counter\n"
            "pd_things_total 3.5\n");
}

TEST(MetricsTest, GaugeAndCounterWithLabelsExactText) {
  MetricsRegistry registry;
  auto& g = registry.AddGauge("pd_queue", "Queue length.");
  auto& c = registry.AddCounter("pd_requests_total", "Requests by code.", {"code", "path"});
  g.Get().Set(7);
  g.Get().Decrement(2);
  c.WithLabels({"OK", "/v1/x"}).Increment();
  c.WithLabels({"NOT_FOUND", "/nope"}).Increment(3);
  c.WithLabels({"OK", "/v1/x"}).Increment();
  // Children render sorted by label values; families in registration order.
  EXPECT_EQ(registry.Render(),
            "# HELP pd_queue Queue length.\n"
            "# TYPE pd_queue gauge\n"
            "pd_queue 5\n"
            "# HELP pd_requests_total Requests by code.\n"
            "# TYPE pd_requests_total counter\n"
            "pd_requests_total{code=\"NOT_FOUND\",path=\"/nope\"} 3\n"
            "pd_requests_total{code=\"OK\",path=\"/v1/x\"} 2\n");
}

TEST(MetricsTest, HistogramExactText) {
  MetricsRegistry registry;
  auto& h = registry.AddHistogram("pd_latency_seconds", "Latency.", {"phase"}, {0.005, 0.1, 1});
  auto& p = h.WithLabels({"prefill"});
  p.Observe(0.001);
  p.Observe(0.005);  // on a bound: counts in that bucket (le = less or equal)
  p.Observe(0.05);
  p.Observe(2);
  p.Observe(std::numeric_limits<double>::quiet_NaN());  // dropped
  // prometheus-cpp writes _count and _sum before the buckets (the format leaves the order of a
  // histogram's series open; promtool and Prometheus accept it).
  EXPECT_EQ(registry.Render(),
            "# HELP pd_latency_seconds Latency.\n"
            "# TYPE pd_latency_seconds histogram\n"
            "pd_latency_seconds_count{phase=\"prefill\"} 4\n"
            "pd_latency_seconds_sum{phase=\"prefill\"} 2.056\n"
            "pd_latency_seconds_bucket{phase=\"prefill\",le=\"0.005\"} 2\n"
            "pd_latency_seconds_bucket{phase=\"prefill\",le=\"0.1\"} 3\n"
            "pd_latency_seconds_bucket{phase=\"prefill\",le=\"1\"} 3\n"
            "pd_latency_seconds_bucket{phase=\"prefill\",le=\"+Inf\"} 4\n");
}

TEST(MetricsTest, HistogramWithoutLabelsAndEmptyFamily) {
  MetricsRegistry registry;
  auto& h = registry.AddHistogram("pd_step_seconds", "Step.", {}, {1, 10});
  registry.AddCounter("pd_errors_total", "Errors.", {"code"});  // no child yet: HELP/TYPE only
  h.Get().Observe(10);
  h.Get().Observe(11);
  EXPECT_EQ(registry.Render(),
            "# HELP pd_step_seconds Step.\n"
            "# TYPE pd_step_seconds histogram\n"
            "pd_step_seconds_count 2\n"
            "pd_step_seconds_sum 21\n"
            "pd_step_seconds_bucket{le=\"1\"} 0\n"
            "pd_step_seconds_bucket{le=\"10\"} 1\n"
            "pd_step_seconds_bucket{le=\"+Inf\"} 2\n"
            "# HELP pd_errors_total Errors.\n"
            "# TYPE pd_errors_total counter\n");
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  auto& c = registry.AddCounter("pd_x_total", "Help with \\ and\nnewline and \"quotes\".", {"v"});
  c.WithLabels({"a\"b\\c\nd"}).Increment();
  EXPECT_EQ(registry.Render(),
            "# HELP pd_x_total Help with \\\\ and\\nnewline and \"quotes\".\n"
            "# TYPE pd_x_total counter\n"
            "pd_x_total{v=\"a\\\"b\\\\c\\nd\"} 1\n");
}

// Sample values as prometheus-cpp's TextSerializer writes them: up to 16 significant digits,
// "+Inf", "-Inf" and "Nan" (Prometheus parses NaN case-insensitively; promtool accepts it).
TEST(MetricsTest, FormatsValues) {
  MetricsRegistry registry;
  auto& g = registry.AddGauge("pd_v", "V.", {"i"});
  const double values[] = {0,
                           42,
                           0.1,
                           -2.5,
                           1e-9,
                           123456789012,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()};
  for (size_t i = 0; i < std::size(values); ++i) g.WithLabels({std::to_string(i)}).Set(values[i]);
  EXPECT_EQ(registry.Render(),
            "# HELP pd_v V.\n"
            "# TYPE pd_v gauge\n"
            "pd_v{i=\"0\"} 0\n"
            "pd_v{i=\"1\"} 42\n"
            "pd_v{i=\"2\"} 0.1\n"
            "pd_v{i=\"3\"} -2.5\n"
            "pd_v{i=\"4\"} 1e-09\n"
            "pd_v{i=\"5\"} 123456789012\n"
            "pd_v{i=\"6\"} +Inf\n"
            "pd_v{i=\"7\"} -Inf\n"
            "pd_v{i=\"8\"} Nan\n");
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_THAT(ExponentialBuckets(0.001, 2, 4), ::testing::ElementsAre(0.001, 0.002, 0.004, 0.008));
}

TEST(MetricsTest, ChildReferencesAreStable) {
  MetricsRegistry registry;
  auto& c = registry.AddCounter("pd_y_total", "Y.", {"k"});
  Counter* first = &c.WithLabels({"a"});
  for (int i = 0; i < 100; ++i) c.WithLabels({std::to_string(i)});
  EXPECT_EQ(first, &c.WithLabels({"a"}));
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry registry;
  auto& c = registry.AddCounter("pd_z_total", "Z.", {"t"});
  auto& h = registry.AddHistogram("pd_z_seconds", "Z.", {}, {0.5});
  constexpr int kThreads = 8, kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        c.WithLabels({std::to_string(t % 2)}).Increment();
        h.Get().Observe(i % 2 ? 1.0 : 0.25);
        if (i % 1000 == 0) registry.Render();  // rendering while updating is safe
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c.WithLabels({"0"}).value() + c.WithLabels({"1"}).value(), kThreads * kIters);
  const Histogram::Snapshot s = h.Get().Read();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kIters);
  EXPECT_EQ(s.cumulative[0], uint64_t{kThreads} * kIters / 2);
  EXPECT_DOUBLE_EQ(s.sum, kThreads * kIters / 2 * 1.25);
}

TEST(MetricsDeathTest, RejectsBadNamesAndLabelCounts) {
  MetricsRegistry registry;
  EXPECT_DEATH(registry.AddGauge("9bad", "x"), "9bad");
  EXPECT_DEATH(registry.AddCounter("pd_no_suffix", "x"), "pd_no_suffix");
  EXPECT_DEATH(registry.AddGauge("pd_g", "x", {"__reserved"}), "__reserved");
  EXPECT_DEATH(registry.AddHistogram("pd_h", "x", {"le"}, {1}), "le");
  EXPECT_DEATH(registry.AddHistogram("pd_h", "x", {}, {2, 1}), "");
  registry.AddGauge("pd_dup", "x", {"a"});
  EXPECT_DEATH(registry.AddGauge("pd_dup", "x"), "registered twice");
  auto& g = registry.AddGauge("pd_g2", "x", {"a", "b"});
  EXPECT_DEATH(g.WithLabels({"only-one"}), "pd_g2");
}

}  // namespace
}  // namespace pd
