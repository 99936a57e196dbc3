// A small Prometheus metrics registry: counters, gauges and fixed-bucket histograms, grouped in
// families with label names, rendered in the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
//   MetricsRegistry registry;
//   auto& requests = registry.AddCounter("pd_requests_total", "Requests.", {"code"});
//   requests.WithLabels({"OK"}).Increment();
//   auto& latency = registry.AddHistogram("pd_latency_seconds", "Latency.", {}, {0.1, 1, 10});
//   latency.Get().Observe(0.25);
//   std::string text = registry.Render();
//
// Ownership: the registry owns every family and child; the references it hands out stay valid
// for its lifetime, so hot paths look a child up once and keep the reference.
// Thread safety: everything is thread safe. Updates of a child are lock-free atomics; creating a
// child and rendering take the family's mutex.
// Names are programming constants: an invalid or duplicate name, or a wrong number of label
// values, is a bug and fails a PD_CHECK.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pd {

// A value that only goes up (resets only when the process restarts).
class Counter {
 public:
  // `amount` must be >= 0 (PD_CHECK).
  void Increment(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void Decrement(double amount = 1) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  // NaN observations are dropped (they would poison _sum).
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Bucket counts are read one by one while other threads may observe; the snapshot is
  // cumulative and count equals the +Inf bucket, so it is always a consistent histogram.
  Snapshot Read() const;

 private:
  const std::vector<double>* bounds_;                // the family's, ascending
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (not cumulative), +Inf last
  std::atomic<double> sum_{0};
};

class MetricsRegistry;

namespace internal {
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual const std::string& name() const = 0;
  // Appends HELP, TYPE and every child's samples.
  virtual void Render(std::string* out) const = 0;
};
}  // namespace internal

// Children of one metric name, one per distinct tuple of label values.
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  // The child for `label_values` (in the order of the family's label names), created at 0 on
  // first use. The number of values must equal the number of label names (PD_CHECK).
  T& WithLabels(const std::vector<std::string>& label_values);
  // The child of a family without labels.
  T& Get() { return WithLabels({}); }

  const std::string& name() const override { return name_; }
  void Render(std::string* out) const override;

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds);

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family. `name` matches [a-zA-Z_:][a-zA-Z0-9_:]* and is not yet registered;
  // label names match [a-zA-Z_][a-zA-Z0-9_]*, do not start with "__", and are distinct.
  // Counters' names end in "_total" (the convention promtool checks).
  Family<Counter>& AddCounter(std::string_view name, std::string_view help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(std::string_view name, std::string_view help,
                          std::vector<std::string> label_names = {});
  // `bounds`: bucket upper bounds, finite and strictly ascending, at least one; "le" is not a
  // label name.
  Family<Histogram>& AddHistogram(std::string_view name, std::string_view help,
                                  std::vector<std::string> label_names, std::vector<double> bounds);

  // Every family in registration order, as text format 0.0.4
  // (Content-Type: text/plain; version=0.0.4; charset=utf-8).
  std::string Render() const;

 private:
  template <typename T>
  Family<T>& Add(std::string_view name, std::string_view help, std::vector<std::string> label_names,
                 std::vector<double> bounds);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<internal::FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// Exponential bucket bounds: start, start*factor, ... (count values). start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Text-format helpers, exposed for tests.
// A sample value as Prometheus writes it: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double value);
// Label value escaping: backslash, double quote and line feed.
std::string EscapeLabelValue(std::string_view value);

}  // namespace pd
