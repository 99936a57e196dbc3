// Progress reporting for long offline jobs (calibration, quantization) on stderr: a bar redrawn
// in place when stderr is a terminal, otherwise a plain line at most every few seconds (and at
// 0% and 100%) so that logs stay readable.
//
// Thread safety: not thread safe; driven by the job's main thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace pd::engine::quantize {

class Progress {
 public:
  virtual ~Progress() = default;
  // Starts a stage of `total` units (`unit`: "tokens", "weights", ...).
  virtual void Start(std::string_view stage, int64_t total, std::string_view unit) = 0;
  // `done` units so far; `detail` (e.g. the tensor being worked on) is shown beside the bar.
  virtual void Update(int64_t done, std::string_view detail = {}) = 0;
  // Ends the stage (prints its final state and the elapsed time).
  virtual void Finish() = 0;
  // A message line (a warning, a note) that must not be overdrawn by the bar.
  virtual void Note(std::string_view line) = 0;
};

// Progress on `out` (stderr by default); `terminal` picks the bar, else plain lines every
// `interval_s` seconds.
std::unique_ptr<Progress> MakeStreamProgress(std::FILE* out, bool terminal, double interval_s = 5);
// Bar when stderr is a terminal (isatty), plain lines otherwise.
std::unique_ptr<Progress> MakeStderrProgress();
// Drops everything but notes, which go to stderr (tests).
std::unique_ptr<Progress> MakeQuietProgress();

}  // namespace pd::engine::quantize
