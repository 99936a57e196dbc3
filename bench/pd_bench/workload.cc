#include "bench/pd_bench/workload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace pd::bench {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<int> ParseLength(std::string_view s) {
  int v = 0;
  if (!absl::SimpleAtoi(ToAbsl(Trim(s)), &v) || v < 1) return std::nullopt;
  return v;
}

std::optional<double> ParseDouble(std::string_view s) {
  double v = 0;
  if (!absl::SimpleAtod(ToAbsl(Trim(s)), &v) || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.push_back(
        s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return pd::StrCat(static_cast<int64_t>(v));
  return pd::StrCat(v);
}

}  // namespace

absl::StatusOr<LengthDist> LengthDist::Parse(std::string_view spec) {
  const std::string_view s = Trim(spec);
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        pd::StrCat("length '", spec, "': ", why,
                   " (expected N, uniform:A:B or normal:MU:SIGMA with lengths >= 1)"));
  };
  const std::vector<std::string_view> parts = Split(s, ':');
  LengthDist d;
  if (parts.size() == 1) {
    const std::optional<int> n = ParseLength(parts[0]);
    if (!n) return bad("not an integer >= 1");
    d.kind_ = Kind::kFixed;
    d.a_ = *n;
    return d;
  }
  if (parts.size() != 3) return bad("wrong number of fields");
  if (parts[0] == "uniform") {
    const std::optional<int> a = ParseLength(parts[1]), b = ParseLength(parts[2]);
    if (!a || !b) return bad("bounds must be integers >= 1");
    if (*a > *b) return bad("lower bound above upper bound");
    d.kind_ = Kind::kUniform;
    d.a_ = *a;
    d.b_ = *b;
    return d;
  }
  if (parts[0] == "normal") {
    const std::optional<double> mu = ParseDouble(parts[1]), sigma = ParseDouble(parts[2]);
    if (!mu || !sigma) return bad("mean and standard deviation must be numbers");
    if (*mu < 1) return bad("mean below 1");
    if (*sigma < 0) return bad("negative standard deviation");
    d.kind_ = Kind::kNormal;
    d.a_ = *mu;
    d.b_ = *sigma;
    return d;
  }
  return bad(pd::StrCat("unknown distribution '", parts[0], "'"));
}

LengthDist LengthDist::Fixed(int n) {
  PD_CHECK(n >= 1);
  LengthDist d;
  d.a_ = n;
  return d;
}

int LengthDist::Sample(std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kFixed:
      return static_cast<int>(a_);
    case Kind::kUniform:
      return std::uniform_int_distribution<int>(static_cast<int>(a_), static_cast<int>(b_))(rng);
    case Kind::kNormal: {
      const double v = std::round(std::normal_distribution<double>(a_, b_)(rng));
      return static_cast<int>(std::clamp(v, 1.0, 1e9));
    }
  }
  return 1;
}

double LengthDist::Mean() const {
  switch (kind_) {
    case Kind::kFixed:
    case Kind::kNormal:
      return a_;
    case Kind::kUniform:
      return (a_ + b_) / 2;
  }
  return a_;
}

std::string LengthDist::ToString() const {
  switch (kind_) {
    case Kind::kFixed:
      return FormatNumber(a_);
    case Kind::kUniform:
      return pd::StrCat("uniform:", FormatNumber(a_), ":", FormatNumber(b_));
    case Kind::kNormal:
      return pd::StrCat("normal:", FormatNumber(a_), ":", FormatNumber(b_));
  }
  return "";
}

absl::StatusOr<std::vector<DistRow>> ParseDistCsv(std::string_view text) {
  std::vector<DistRow> rows;
  int line_no = 0;
  bool first_content_line = true;
  for (std::string_view line : Split(text, '\n')) {
    ++line_no;
    line = Trim(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<std::string_view> fields = Split(line, ',');
    const bool header = first_content_line && !ParseDouble(fields[0]);
    first_content_line = false;
    if (header) continue;
    if (fields.size() != 2 && fields.size() != 3) {
      return absl::InvalidArgumentError(pd::StrCat(
          "dist CSV line ", line_no, ": expected prompt_len,output_len[,class], got '", line, "'"));
    }
    const std::optional<int> p = ParseLength(fields[0]), o = ParseLength(fields[1]);
    if (!p || !o) {
      return absl::InvalidArgumentError(pd::StrCat(
          "dist CSV line ", line_no, ": lengths must be integers >= 1, got '", line, "'"));
    }
    DistRow row{{*p, *o}, fields.size() == 3 ? std::string(Trim(fields[2])) : std::string()};
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return absl::InvalidArgumentError("dist CSV has no rows");
  return rows;
}

absl::StatusOr<std::vector<DistRow>> ParseDistJson(std::string_view text) {
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("dist JSON does not parse");
  if (!doc.is_array()) return absl::InvalidArgumentError("dist JSON: expected an array of rows");
  const auto length = [](const nlohmann::json& v) -> std::optional<int> {
    if (!v.is_number_integer()) return std::nullopt;
    const int64_t n = v.get<int64_t>();
    if (n < 1 || n > (1 << 30)) return std::nullopt;
    return static_cast<int>(n);
  };
  std::vector<DistRow> rows;
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& item = doc[i];
    const auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(pd::StrCat("dist JSON item ", i, ": ", why));
    };
    DistRow row;
    std::optional<int> p, o;
    if (item.is_array()) {
      if (item.size() != 2) return bad("expected [prompt_len, output_len]");
      p = length(item[0]);
      o = length(item[1]);
    } else if (item.is_object()) {
      if (!item.contains("prompt_len") || !item.contains("output_len")) {
        return bad("expected keys prompt_len and output_len");
      }
      p = length(item["prompt_len"]);
      o = length(item["output_len"]);
      if (item.contains("class")) {
        if (!item["class"].is_string()) return bad("class must be a string");
        row.cls = item["class"].get<std::string>();
      }
    } else {
      return bad("expected [prompt_len, output_len] or an object");
    }
    if (!p || !o) return bad("lengths must be integers >= 1");
    row.lengths = {*p, *o};
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return absl::InvalidArgumentError("dist JSON has no rows");
  return rows;
}

absl::StatusOr<std::vector<DistRow>> LoadDistFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read dist file '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string_view trimmed = Trim(text);
  absl::StatusOr<std::vector<DistRow>> rows =
      !trimmed.empty() && trimmed.front() == '[' ? ParseDistJson(text) : ParseDistCsv(text);
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        pd::StrCat(path, ": ", std::string(rows.status().message())));
  }
  return rows;
}

LengthPair WorkloadClass::Draw(std::mt19937_64& rng) const {
  if (!rows.empty()) {
    return rows[std::uniform_int_distribution<size_t>(0, rows.size() - 1)(rng)];
  }
  LengthPair p;
  p.prompt_tokens = prompt.Sample(rng);
  p.output_tokens = output.Sample(rng);
  return p;
}

double WorkloadClass::MeanPrompt() const {
  if (rows.empty()) return prompt.Mean();
  double sum = 0;
  for (const LengthPair& r : rows) sum += r.prompt_tokens;
  return sum / rows.size();
}

double WorkloadClass::MeanOutput() const {
  if (rows.empty()) return output.Mean();
  double sum = 0;
  for (const LengthPair& r : rows) sum += r.output_tokens;
  return sum / rows.size();
}

absl::StatusOr<std::vector<WorkloadClass>> ParseMix(std::string_view spec) {
  std::vector<WorkloadClass> classes;
  for (std::string_view item : Split(spec, ';')) {
    item = Trim(item);
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    WorkloadClass c;
    c.name = std::string(Trim(item.substr(0, colon)));
    const auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(pd::StrCat("--mix class '", item, "': ", why));
    };
    if (c.name.empty()) return bad("empty class name");
    for (const WorkloadClass& other : classes) {
      if (other.name == c.name) return bad("duplicate class name");
    }
    if (colon != std::string_view::npos) {
      for (std::string_view kv : Split(item.substr(colon + 1), ',')) {
        kv = Trim(kv);
        if (kv.empty()) continue;
        const size_t eq = kv.find('=');
        if (eq == std::string_view::npos) return bad(pd::StrCat("'", kv, "' is not key=value"));
        const std::string_view key = Trim(kv.substr(0, eq)), value = Trim(kv.substr(eq + 1));
        if (key == "prompt" || key == "output") {
          absl::StatusOr<LengthDist> d = LengthDist::Parse(value);
          if (!d.ok()) return bad(std::string(d.status().message()));
          (key == "prompt" ? c.prompt : c.output) = *d;
        } else if (key == "weight") {
          const std::optional<double> w = ParseDouble(value);
          if (!w || *w <= 0) return bad("weight must be a number > 0");
          c.weight = *w;
        } else if (key == "rate") {
          const std::optional<double> r = ParseDouble(value);
          if (!r || *r <= 0) return bad("rate must be a number > 0");
          c.rate = *r;
        } else if (key == "concurrency") {
          const std::optional<int> n = ParseLength(value);
          if (!n) return bad("concurrency must be an integer >= 1");
          c.concurrency = *n;
        } else {
          return bad(pd::StrCat("unknown key '", key,
                                "' (known: prompt, output, weight, rate, concurrency)"));
        }
      }
    }
    if (c.rate && c.concurrency) return bad("give rate or concurrency, not both");
    classes.push_back(std::move(c));
  }
  if (classes.empty()) return absl::InvalidArgumentError("--mix names no class");
  return classes;
}

absl::StatusOr<std::vector<WorkloadClass>> ClassesFromDist(const std::vector<DistRow>& rows) {
  if (rows.empty()) return absl::InvalidArgumentError("distribution has no rows");
  std::vector<WorkloadClass> classes;
  std::map<std::string, size_t> index;
  for (const DistRow& row : rows) {
    const std::string name = row.cls.empty() ? "dist" : row.cls;
    auto [it, inserted] = index.emplace(name, classes.size());
    if (inserted) {
      WorkloadClass c;
      c.name = name;
      c.weight = 0;
      classes.push_back(std::move(c));
    }
    WorkloadClass& c = classes[it->second];
    c.rows.push_back(row.lengths);
    c.weight += 1;
  }
  return classes;
}

ClassPicker::ClassPicker(const std::vector<WorkloadClass>& classes) {
  double sum = 0;
  for (size_t i = 0; i < classes.size(); ++i) {
    if (!classes[i].shared()) continue;
    sum += classes[i].weight;
    indices_.push_back(static_cast<int>(i));
    cumulative_.push_back(sum);
  }
}

int ClassPicker::Pick(std::mt19937_64& rng) const {
  PD_CHECK(!indices_.empty());
  if (indices_.size() == 1) return indices_[0];
  const double u = std::uniform_real_distribution<double>(0, cumulative_.back())(rng);
  const size_t k =
      std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin();
  return indices_[std::min(k, indices_.size() - 1)];
}

}  // namespace pd::bench
