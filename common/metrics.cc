#include "common/metrics.h"

#include <charconv>
#include <cmath>
#include <set>
#include <type_traits>
#include <utility>

#include "common/status.h"
#include "common/strings.h"

namespace pd {
namespace {

bool IsMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsLabelName(std::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// HELP text escaping: backslash and line feed (quotes stay as they are).
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

// `{a="x",b="y"` without the closing brace (so that histograms can append le), or "" when there
// are no labels and no extra label.
void AppendLabels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                  std::string_view extra_name, std::string_view extra_value, std::string* out) {
  if (names.empty() && extra_name.empty()) return;
  *out += '{';
  bool first = true;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!first) *out += ',';
    first = false;
    *out += pd::StrCat(names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!first) *out += ',';
    *out += pd::StrCat(extra_name, "=\"", extra_value, "\"");
  }
  *out += '}';
}

void AppendSample(std::string_view name, std::string_view suffix,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, std::string_view extra_name,
                  std::string_view extra_value, std::string_view value, std::string* out) {
  *out += name;
  *out += suffix;
  AppendLabels(label_names, label_values, extra_name, extra_value, out);
  *out += ' ';
  *out += value;
  *out += '\n';
}

template <typename T>
constexpr const char* TypeName() {
  if constexpr (std::is_same_v<T, Counter>) {
    return "counter";
  } else if constexpr (std::is_same_v<T, Gauge>) {
    return "gauge";
  } else {
    return "histogram";
  }
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  PD_CHECK(ec == std::errc());
  return std::string(buf, end);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  PD_CHECK(start > 0 && factor > 1 && count >= 1);
  std::vector<double> bounds;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

void Counter::Increment(double amount) {
  PD_CHECK_MSG(amount >= 0, "a counter only goes up");
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // Buckets are few (~20): a linear scan beats a binary search's branches.
  size_t i = 0;
  while (i < bounds_->size() && value > (*bounds_)[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.cumulative.resize(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& label_values) {
  PD_CHECK_MSG(label_values.size() == label_names_.size(), name_.c_str());
  absl::MutexLock lock(&mu_);
  auto& child = children_[label_values];
  if (child == nullptr) {
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<Histogram>(&bounds_);
    } else {
      child = std::make_unique<T>();
    }
  }
  return *child;
}

template <typename T>
void Family<T>::Render(std::string* out) const {
  *out += pd::StrCat("# HELP ", name_, " ", EscapeHelp(help_), "\n");
  *out += pd::StrCat("# TYPE ", name_, " ", TypeName<T>(), "\n");
  absl::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = child->Read();
      for (size_t i = 0; i < bounds_.size(); ++i) {
        AppendSample(name_, "_bucket", label_names_, values, "le", FormatMetricValue(bounds_[i]),
                     std::to_string(s.cumulative[i]), out);
      }
      AppendSample(name_, "_bucket", label_names_, values, "le", "+Inf", std::to_string(s.count),
                   out);
      AppendSample(name_, "_sum", label_names_, values, "", "", FormatMetricValue(s.sum), out);
      AppendSample(name_, "_count", label_names_, values, "", "", std::to_string(s.count), out);
    } else {
      AppendSample(name_, "", label_names_, values, "", "", FormatMetricValue(child->value()), out);
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

template <typename T>
Family<T>& MetricsRegistry::Add(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names, std::vector<double> bounds) {
  PD_CHECK_MSG(IsMetricName(name), std::string(name).c_str());
  std::set<std::string_view> seen;
  for (const std::string& label : label_names) {
    PD_CHECK_MSG(IsLabelName(label), label.c_str());
    PD_CHECK_MSG(seen.insert(label).second, label.c_str());
    if constexpr (std::is_same_v<T, Histogram>) PD_CHECK_MSG(label != "le", label.c_str());
  }
  if constexpr (std::is_same_v<T, Counter>) {
    PD_CHECK_MSG(name.size() > 6 && name.substr(name.size() - 6) == "_total",
                 std::string(name).c_str());
  }
  if constexpr (std::is_same_v<T, Histogram>) {
    PD_CHECK(!bounds.empty());
    for (size_t i = 0; i < bounds.size(); ++i) {
      PD_CHECK(std::isfinite(bounds[i]));
      PD_CHECK(i == 0 || bounds[i] > bounds[i - 1]);
    }
  }
  auto* family = new Family<T>(std::string(name), std::string(help), std::move(label_names),
                               std::move(bounds));
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) {
    PD_CHECK_MSG(f->name() != name, pd::StrCat("metric registered twice: ", name).c_str());
  }
  families_.emplace_back(family);
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
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) f->Render(&out);
  return out;
}

}  // namespace pd
