#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "prometheus/check_names.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace pd {
namespace {

// HELP text escaping: backslash and line feed (quotes stay as they are). prometheus-cpp 1.0.1's
// TextSerializer writes HELP as it is, so a line feed would end the comment early.
std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  PD_CHECK(start > 0 && factor > 1 && count >= 1);
  std::vector<double> bounds;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

void Counter::Increment(double amount) {
  // prometheus-cpp ignores a negative amount; for us it is a bug.
  PD_CHECK_MSG(amount >= 0, "a counter only goes up");
  impl_->Increment(amount);
}

double Counter::value() const { return impl_->Value(); }

void Gauge::Set(double value) { impl_->Set(value); }
void Gauge::Increment(double amount) { impl_->Increment(amount); }
void Gauge::Decrement(double amount) { impl_->Decrement(amount); }
double Gauge::value() const { return impl_->Value(); }

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  impl_->Observe(value);
}

Histogram::Snapshot Histogram::Read() const {
  // Collect() reads under the child's mutex: the counts and the sum belong together.
  const prometheus::ClientMetric m = impl_->Collect();
  Snapshot s;
  s.cumulative.reserve(m.histogram.bucket.size());
  for (const auto& b : m.histogram.bucket) s.cumulative.push_back(b.cumulative_count);
  s.count = m.histogram.sample_count;
  s.sum = m.histogram.sample_sum;
  return s;
}

template <typename T>
Family<T>::Family(std::string name, std::vector<std::string> label_names,
                  std::vector<double> bounds, prometheus::Family<typename T::Impl>* impl)
    : name_(std::move(name)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)),
      impl_(impl) {}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& label_values) {
  PD_CHECK_MSG(label_values.size() == label_names_.size(), name_.c_str());
  absl::MutexLock lock(&mu_);
  auto& child = children_[label_values];
  if (child == nullptr) {
    prometheus::Labels labels;
    for (size_t i = 0; i < label_names_.size(); ++i) labels[label_names_[i]] = label_values[i];
    typename T::Impl* impl;
    if constexpr (std::is_same_v<T, Histogram>) {
      impl = &impl_->Add(labels, bounds_);
    } else {
      impl = &impl_->Add(labels);
    }
    child.reset(new T(impl));
  }
  return *child;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

MetricsRegistry::MetricsRegistry() : registry_(std::make_unique<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

template <typename T>
Family<T>& MetricsRegistry::Add(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names, std::vector<double> bounds) {
  // Everything prometheus-cpp would throw std::invalid_argument for is checked here first.
  const std::string name_str(name);
  PD_CHECK_MSG(prometheus::CheckMetricName(name_str), name_str.c_str());
  std::set<std::string_view> seen;
  for (const std::string& label : label_names) {
    PD_CHECK_MSG(prometheus::CheckLabelName(label), label.c_str());
    PD_CHECK_MSG(seen.insert(label).second, label.c_str());
    if constexpr (std::is_same_v<T, Histogram>) PD_CHECK_MSG(label != "le", label.c_str());
  }
  if constexpr (std::is_same_v<T, Counter>) {
    PD_CHECK_MSG(name.size() > 6 && name.substr(name.size() - 6) == "_total", name_str.c_str());
  }
  if constexpr (std::is_same_v<T, Histogram>) {
    PD_CHECK(!bounds.empty());
    for (size_t i = 0; i < bounds.size(); ++i) {
      PD_CHECK(std::isfinite(bounds[i]));
      PD_CHECK(i == 0 || bounds[i] > bounds[i - 1]);
    }
  }
  absl::MutexLock lock(&mu_);
  for (const Registered& r : families_) {
    PD_CHECK_MSG(r.family->name() != name, pd::StrCat("metric registered twice: ", name).c_str());
  }
  prometheus::detail::Builder<typename T::Impl> builder;
  if constexpr (std::is_same_v<T, Counter>) {
    builder = prometheus::BuildCounter();
  } else if constexpr (std::is_same_v<T, Gauge>) {
    builder = prometheus::BuildGauge();
  } else {
    builder = prometheus::BuildHistogram();
  }
  auto& impl = builder.Name(name_str).Help(std::string(help)).Register(*registry_);
  auto* family = new Family<T>(name_str, std::move(label_names), std::move(bounds), &impl);
  families_.push_back(
      {std::unique_ptr<internal::FamilyBase>(family), std::string(help), T::Impl::metric_type});
  return *family;
}

Family<Counter>& MetricsRegistry::AddCounter(std::string_view name, std::string_view help,
                                             std::vector<std::string> label_names) {
  return Add<Counter>(name, help, std::move(label_names), {});
}

Family<Gauge>& MetricsRegistry::AddGauge(std::string_view name, std::string_view help,
                                         std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, std::move(label_names), {});
}

Family<Histogram>& MetricsRegistry::AddHistogram(std::string_view name, std::string_view help,
                                                 std::vector<std::string> label_names,
                                                 std::vector<double> bounds) {
  return Add<Histogram>(name, help, std::move(label_names), std::move(bounds));
}

std::string MetricsRegistry::Render() const {
  // prometheus::Registry::Collect() groups families by type, lists a family's children in hash
  // order and leaves out families without children. Put them back in registration order, sort
  // the children, and keep empty families' HELP and TYPE (a scrape then shows every metric the
  // process has, e.g. pdserve_errors_total before the first error).
  std::vector<prometheus::MetricFamily> out;
  {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> collected = registry_->Collect();
    std::map<std::string_view, prometheus::MetricFamily*> by_name;
    for (prometheus::MetricFamily& f : collected) by_name[f.name] = &f;
    out.reserve(families_.size());
    for (const Registered& r : families_) {
      prometheus::MetricFamily& f = out.emplace_back();
      f.name = r.family->name();
      f.help = EscapeHelp(r.help);
      f.type = r.type;
      if (auto it = by_name.find(f.name); it != by_name.end()) {
        f.metric = std::move(it->second->metric);
      }
      std::sort(f.metric.begin(), f.metric.end(),
                [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
                  return a.label < b.label;
                });
    }
  }
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, out);
  return std::move(text).str();
}

}  // namespace pd
