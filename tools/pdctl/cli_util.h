// Small helpers the pdctl subcommands share: the error exit, token id and file reading, and the
// process's peak memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pd::tools {

// Prints "pdctl: error: STATUS" on stderr; returns the exit code: 2 for INVALID_ARGUMENT (bad
// input), 1 otherwise.
int Fail(const absl::Status& s);

// Space-separated token ids ("2 1000 17"). INVALID_ARGUMENT names a word that is not an id in
// [0, INT32_MAX].
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text);

// The whole file. NOT_FOUND when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// This process's peak resident memory so far, in MiB.
double PeakRssMiB();

// While alive, SIGINT and SIGTERM remove `tmp_path` (a writer's OUT.tmp) before the process dies
// of the signal; the writers remove it on every other failure. One at a time per process.
class TmpFileGuard {
 public:
  explicit TmpFileGuard(const std::string& tmp_path);
  ~TmpFileGuard();
  TmpFileGuard(const TmpFileGuard&) = delete;
  TmpFileGuard& operator=(const TmpFileGuard&) = delete;
};

}  // namespace pd::tools
