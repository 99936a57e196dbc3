// Prometheus metrics: counters, gauges and fixed-bucket histograms, grouped in families with
// label names, rendered in the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
//   MetricsRegistry registry;
//   auto& requests = registry.AddCounter("pd_requests_total", "Requests.", {"code"});
//   requests.WithLabels({"OK"}).Increment();
//   auto& latency = registry.AddHistogram("pd_latency_seconds", "Latency.", {}, {0.1, 1, 10});
//   latency.Get().Observe(0.25);
//   std::string text = registry.Render();
//
// The metrics live in a prometheus-cpp registry (prometheus::Registry and its families) and are
// written by its prometheus::TextSerializer; this API keeps what the rest of the tree relies on:
// label values given in the order of the family's label names, no exceptions (the preconditions
// below are PD_CHECKs, checked before prometheus-cpp would throw), NaN observations dropped,
// families rendered in registration order with HELP and TYPE even before their first child.
// Serving /metrics is the caller's business (our HTTP servers call Render()).
//
// Ownership: the registry owns every family and child; the references it hands out stay valid
// for its lifetime, so hot paths look a child up once and keep the reference.
// Thread safety: everything is thread safe. Counter and gauge updates are lock-free atomics; a
// histogram observation takes its child's mutex (prometheus-cpp's, so that a scrape never sees a
// bucket without its sum); creating a child and rendering take the family's mutex.
// Names are programming constants: an invalid or duplicate name, or a wrong number of label
// values, is a bug and fails a PD_CHECK.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
enum class MetricType;
}  // namespace prometheus

namespace pd {

template <typename T>
class Family;
class MetricsRegistry;

// A value that only goes up (resets only when the process restarts).
class Counter {
 public:
  // `amount` must be >= 0 (PD_CHECK).
  void Increment(double amount = 1);
  double value() const;

 private:
  friend class Family<Counter>;
  friend class MetricsRegistry;
  using Impl = prometheus::Counter;
  explicit Counter(Impl* impl) : impl_(impl) {}
  Impl* const impl_;  // a child of the family's prometheus::Family
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value);
  void Increment(double amount = 1);
  void Decrement(double amount = 1);
  double value() const;

 private:
  friend class Family<Gauge>;
  friend class MetricsRegistry;
  using Impl = prometheus::Gauge;
  explicit Gauge(Impl* impl) : impl_(impl) {}
  Impl* const impl_;
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is implicit). An
// observation equal to a bound counts in that bound's bucket (le: less or equal).
class Histogram {
 public:
  // NaN observations are dropped (they would poison _sum).
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // A consistent histogram: cumulative, and count equals the +Inf bucket.
  Snapshot Read() const;

 private:
  friend class Family<Histogram>;
  friend class MetricsRegistry;
  using Impl = prometheus::Histogram;
  explicit Histogram(Impl* impl) : impl_(impl) {}
  Impl* const impl_;
};

namespace internal {
// What the registry keeps of each family, whatever its type.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual const std::string& name() const = 0;
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

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::vector<std::string> label_names, std::vector<double> bounds,
         prometheus::Family<typename T::Impl>* impl);

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  // Owned by the registry's prometheus::Registry.
  prometheus::Family<typename T::Impl>* const impl_;
  mutable absl::Mutex mu_;
  // Our handles on impl_'s children, by label values in label_names_ order.
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family. `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*, does not start with "__" and is
  // not yet registered; label names match [a-zA-Z_][a-zA-Z0-9_]*, do not start with "__", and are
  // distinct. Counters' names end in "_total" (the convention promtool checks).
  Family<Counter>& AddCounter(std::string_view name, std::string_view help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(std::string_view name, std::string_view help,
                          std::vector<std::string> label_names = {});
  // `bounds`: bucket upper bounds, finite and strictly ascending, at least one; "le" is not a
  // label name.
  Family<Histogram>& AddHistogram(std::string_view name, std::string_view help,
                                  std::vector<std::string> label_names, std::vector<double> bounds);

  // Every family in registration order, each family's children sorted by their labels (written
  // in label name order, "le" last), as text format 0.0.4
  // (Content-Type: text/plain; version=0.0.4; charset=utf-8).
  std::string Render() const;

 private:
  template <typename T>
  Family<T>& Add(std::string_view name, std::string_view help, std::vector<std::string> label_names,
                 std::vector<double> bounds);

  struct Registered {
    std::unique_ptr<internal::FamilyBase> family;
    std::string help;  // as given (prometheus-cpp 1.0.1 writes HELP unescaped; Render escapes it)
    prometheus::MetricType type;
  };

  const std::unique_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  std::vector<Registered> families_ ABSL_GUARDED_BY(mu_);  // in registration order
};

// Exponential bucket bounds: start, start*factor, ... (count values). start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

}  // namespace pd
