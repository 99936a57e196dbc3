#include "engine/quant/quantize/progress.h"

#include <unistd.h>

#include <algorithm>

namespace pd::engine::quantize {
namespace {

using Clock = std::chrono::steady_clock;

class StreamProgress final : public Progress {
 public:
  StreamProgress(std::FILE* out, bool terminal, double interval_s)
      : out_(out), terminal_(terminal), interval_(interval_s) {}

  void Start(std::string_view stage, int64_t total, std::string_view unit) override {
    stage_ = std::string(stage);
    unit_ = std::string(unit);
    total_ = std::max<int64_t>(total, 1);
    done_ = 0;
    printed_ = -1;
    start_ = last_ = Clock::now();
    active_ = true;
    Draw(/*force=*/true);
  }

  void Update(int64_t done, std::string_view detail) override {
    done_ = std::min(done, total_);
    detail_ = std::string(detail);
    Draw(/*force=*/false);
  }

  void Finish() override {
    if (!active_) return;
    done_ = total_;
    detail_.clear();
    Draw(/*force=*/true);
    if (terminal_) std::fputc('\n', out_);
    std::fflush(out_);
    active_ = false;
  }

  void Note(std::string_view line) override {
    if (terminal_ && active_) std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%.*s\n", static_cast<int>(line.size()), line.data());
    if (terminal_ && active_) Draw(/*force=*/true);
    std::fflush(out_);
  }

 private:
  void Draw(bool force) {
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double frac = static_cast<double>(done_) / static_cast<double>(total_);
    if (terminal_) {
      if (!force && since < 0.1) return;
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(frac * kWidth);
      std::string bar(filled, '#');
      bar.resize(kWidth, '.');
      std::fprintf(out_, "\r\033[K%s [%s] %3d%% %lld/%lld %s %.0fs %s", stage_.c_str(), bar.c_str(),
                   static_cast<int>(frac * 100), static_cast<long long>(done_),
                   static_cast<long long>(total_), unit_.c_str(), elapsed,
                   detail_.substr(0, 40).c_str());
    } else {
      if (!force && since < interval_) return;
      if (done_ == printed_ && printed_ >= 0) return;  // nothing new since the last line
      printed_ = done_;
      std::fprintf(out_, "%s: %3d%% (%lld/%lld %s, %.1fs)%s%s\n", stage_.c_str(),
                   static_cast<int>(frac * 100), static_cast<long long>(done_),
                   static_cast<long long>(total_), unit_.c_str(), elapsed,
                   detail_.empty() ? "" : " ", detail_.c_str());
    }
    std::fflush(out_);
    last_ = now;
  }

  std::FILE* out_;
  bool terminal_;
  double interval_;
  std::string stage_, unit_, detail_;
  int64_t total_ = 1, done_ = 0;
  int64_t printed_ = -1;  // `done_` of the last plain line
  Clock::time_point start_, last_;
  bool active_ = false;
};

class QuietProgress final : public Progress {
 public:
  void Start(std::string_view, int64_t, std::string_view) override {}
  void Update(int64_t, std::string_view) override {}
  void Finish() override {}
  void Note(std::string_view line) override {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
};

}  // namespace

std::unique_ptr<Progress> MakeStreamProgress(std::FILE* out, bool terminal, double interval_s) {
  return std::make_unique<StreamProgress>(out, terminal, interval_s);
}

std::unique_ptr<Progress> MakeStderrProgress() {
  return MakeStreamProgress(stderr, ::isatty(STDERR_FILENO) == 1);
}

std::unique_ptr<Progress> MakeQuietProgress() { return std::make_unique<QuietProgress>(); }

}  // namespace pd::engine::quantize
