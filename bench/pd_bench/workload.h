// pd-bench's workload: how long each request's prompt and output are, and which class it belongs
// to. A workload is a list of classes; each class draws (prompt_len, output_len) either from two
// length distributions or from the rows of a distribution file, and arrives either through the
// shared arrival process (--rate / --concurrency, picked among the shared classes by weight) or
// through its own (`rate=` / `concurrency=` in --mix). Statistics are reported per class.
//
// Thread safety: the types are plain values; const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pd::bench {

// A token count drawn from a distribution. Spec strings:
//   "N"               always N
//   "uniform:A:B"     integer uniform on [A, B]
//   "normal:MU:SIGMA" rounded normal, clamped to at least 1
class LengthDist {
 public:
  // INVALID_ARGUMENT (naming the spec) for anything else, or for lengths < 1, A > B, SIGMA < 0.
  static absl::StatusOr<LengthDist> Parse(std::string_view spec);
  static LengthDist Fixed(int n);

  // Never below 1.
  int Sample(std::mt19937_64& rng) const;
  // The distribution's nominal mean (the clamp of `normal` is not accounted for).
  double Mean() const;
  // The spec this was parsed from, canonicalised ("uniform:32:96").
  std::string ToString() const;

 private:
  enum class Kind { kFixed, kUniform, kNormal };
  Kind kind_ = Kind::kFixed;
  double a_ = 1, b_ = 0;  // fixed: a; uniform: [a, b]; normal: mean a, sd b
};

struct LengthPair {
  int prompt_tokens = 0;
  int output_tokens = 0;
};

// One row of a distribution file; `cls` is "" when the file has no class column.
struct DistRow {
  LengthPair lengths;
  std::string cls;
};

// Distribution files (--dist), documented in bench/pd_bench/README.md:
//   CSV:  one `prompt_len,output_len[,class]` row per line; blank lines and lines starting with '#'
//         are skipped, as is a first line whose first field is not a number (a header).
//   JSON: an array whose items are [prompt_len, output_len] or
//         {"prompt_len": P, "output_len": O, "class": "name"} ("class" optional).
// Lengths must be integers >= 1. INVALID_ARGUMENT names the line / item at fault.
absl::StatusOr<std::vector<DistRow>> ParseDistCsv(std::string_view text);
absl::StatusOr<std::vector<DistRow>> ParseDistJson(std::string_view text);
// Reads `path` and parses it as JSON when its first non-blank character is '[', as CSV otherwise.
// NOT_FOUND when unreadable.
absl::StatusOr<std::vector<DistRow>> LoadDistFile(const std::string& path);

struct WorkloadClass {
  std::string name;
  LengthDist prompt = LengthDist::Fixed(256);
  LengthDist output = LengthDist::Fixed(128);
  // Non-empty: lengths are drawn uniformly from these rows instead of `prompt` / `output`.
  std::vector<LengthPair> rows;
  // Relative share of the shared arrival process (classes with their own arrivals ignore it).
  double weight = 1;
  // At most one is set: the class then has its own arrival process and takes no share above.
  std::optional<double> rate;      // Poisson arrivals, requests/s
  std::optional<int> concurrency;  // closed loop with this many requests in flight

  bool shared() const { return !rate && !concurrency; }
  LengthPair Draw(std::mt19937_64& rng) const;
  // Nominal mean lengths (of the rows, or of the distributions).
  double MeanPrompt() const;
  double MeanOutput() const;
};

// --mix "NAME:key=value,key=value;NAME:...". Keys: prompt, output (LengthDist specs), weight (> 0),
// rate (> 0, requests/s), concurrency (>= 1). Names must be unique and non-empty.
absl::StatusOr<std::vector<WorkloadClass>> ParseMix(std::string_view spec);

// One class per distinct class name in `rows` ("dist" for rows without one), in order of first
// appearance, each weighted by its row count so that drawing a class by weight and then a row
// uniformly is drawing a row uniformly. INVALID_ARGUMENT when `rows` is empty.
absl::StatusOr<std::vector<WorkloadClass>> ClassesFromDist(const std::vector<DistRow>& rows);

// Picks a shared class by weight. Precondition: `classes` has at least one shared class.
class ClassPicker {
 public:
  explicit ClassPicker(const std::vector<WorkloadClass>& classes);
  // An index into the `classes` given to the constructor.
  int Pick(std::mt19937_64& rng) const;
  bool empty() const { return indices_.empty(); }

 private:
  std::vector<int> indices_;
  std::vector<double> cumulative_;  // running sum of the weights of indices_
};

}  // namespace pd::bench
