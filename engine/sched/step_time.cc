#include "engine/sched/step_time.h"

#include <algorithm>
#include <cmath>

namespace pd::engine {

namespace {

// Feature scales: typical magnitudes map to ~1 so that one ridge weight suits every column.
constexpr double kDecodeScale = 16;
constexpr double kDecodeContextScale = 16.0 * 1024;
constexpr double kPrefillScale = 256;
constexpr double kPrefillContextScale = 256.0 * 1024;
// Ridge weight on every column but the intercept, relative to the column's own sum of squares
// (plus a floor for all-zero columns): keeps the normal equations solvable when a column never
// varies (a fixed number of streams) or is always zero (no long contexts yet), without biasing
// columns that do vary.
constexpr double kRidge = 1e-6;
constexpr int kMinSteps = 16;        // fitted steps before the fit is trusted
constexpr int kMinEachKind = 4;      // of those, with and without prompt tokens

}  // namespace

void StepShape::AddChunk(int start, int tokens) {
  prefill_tokens += tokens;
  // Token i of the chunk attends start + i + 1 positions.
  prefill_context += static_cast<double>(tokens) * start + 0.5 * tokens * (tokens + 1.0);
}

StepTimeModel::StepTimeModel(int window, int median_window)
    : window_(std::max(8, window)), median_window_(std::max(1, median_window)) {}

void StepTimeModel::Ring::Add(const Row& row, double t, int window) {
  if (static_cast<int>(rows.size()) < window) {
    rows.push_back(row);
    times.push_back(t);
  } else {
    rows[next] = row;
    times[next] = t;
    next = (next + 1) % window;
  }
}

StepTimeModel::Row StepTimeModel::Features(const StepShape& s) {
  return {1.0, s.decode_tokens / kDecodeScale, s.decode_context / kDecodeContextScale,
          s.prefill_tokens / kPrefillScale, s.prefill_context / kPrefillContextScale};
}

void StepTimeModel::Observe(const StepShape& shape, double seconds) {
  if (shape.decode_tokens + shape.prefill_tokens <= 0 || !(seconds > 0)) return;
  (shape.prefill_tokens > 0 ? with_prefill_ : without_prefill_)
      .Add(Features(shape), seconds, window_);
  if (shape.decode_tokens > 0) {
    if (static_cast<int>(decode_times_.size()) < median_window_) {
      decode_times_.push_back(seconds);
    } else {
      decode_times_[next_decode_] = seconds;
      next_decode_ = (next_decode_ + 1) % median_window_;
    }
  }
  Fit();
}

bool StepTimeModel::Identifiable() const {
  const int n_with = static_cast<int>(with_prefill_.rows.size());
  const int n_without = static_cast<int>(without_prefill_.rows.size());
  if (n_with + n_without < kMinSteps || n_with < kMinEachKind) return false;
  if (n_without >= kMinEachKind) return true;
  // Under steady load every step may carry prompt tokens: then their counts must vary enough
  // to tell the cost of a prompt token from the fixed cost of a step.
  double sum = 0, sum2 = 0;
  for (const Row& x : with_prefill_.rows) sum += x[3], sum2 += x[3] * x[3];
  const double mean = sum / n_with;
  return sum2 / n_with - mean * mean >= 0.25 * 0.25 * mean * mean;
}

void StepTimeModel::Fit() {
  if (!Identifiable()) return;
  // Normal equations X'WX c = X'Wy. Weighted by 1 / t^2: the fit minimizes relative errors. Step
  // times span two orders of magnitude (a decode step vs one with a long chunk) and their noise
  // is proportional to them; unweighted, the noise of the long steps would swamp the short
  // decode steps the budget is about.
  double xtx[kFeatures][kFeatures] = {}, xty[kFeatures] = {};
  for (const Ring* ring : {&with_prefill_, &without_prefill_}) {
    for (size_t k = 0; k < ring->rows.size(); ++k) {
      const Row& x = ring->rows[k];
      const double t = ring->times[k];
      const double w = 1.0 / (t * t);
      for (int i = 0; i < kFeatures; ++i) {
        for (int j = 0; j < kFeatures; ++j) xtx[i][j] += w * x[i] * x[j];
        xty[i] += w * x[i] * t;
      }
    }
  }
  // Costs cannot be negative, and MaxPrefill's search needs predictions that grow with tokens. A
  // negative slope is noise (or a column that never varied): such a column leaves the fit and
  // the rest is refitted without it (an active-set non-negative least squares).
  std::array<bool, kFeatures> active;
  active.fill(true);
  Row coef{};
  for (int round = 0; round < kFeatures; ++round) {
    // Solve the active columns' system, ridge-damped (relative to each column's own weight,
    // plus a floor for all-zero columns) so that it stays solvable when a column never varies.
    double a[kFeatures][kFeatures + 1] = {};
    for (int i = 0; i < kFeatures; ++i) {
      for (int j = 0; j < kFeatures; ++j) a[i][j] = active[i] && active[j] ? xtx[i][j] : 0;
      a[i][kFeatures] = active[i] ? xty[i] : 0;
      if (!active[i]) a[i][i] = 1;  // c_i = 0
      else if (i > 0) a[i][i] += kRidge * xtx[i][i] + 1e-12 * xtx[0][0];
    }
    for (int col = 0; col < kFeatures; ++col) {
      int pivot = col;
      for (int r = col + 1; r < kFeatures; ++r) {
        if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
      }
      if (std::abs(a[pivot][col]) < 1e-300) return;  // keep the last good fit
      if (pivot != col) std::swap(a[pivot], a[col]);
      for (int r = 0; r < kFeatures; ++r) {
        if (r == col) continue;
        const double f = a[r][col] / a[col][col];
        for (int c = col; c <= kFeatures; ++c) a[r][c] -= f * a[col][c];
      }
    }
    for (int i = 0; i < kFeatures; ++i) {
      coef[i] = a[i][kFeatures] / a[i][i];
      if (!std::isfinite(coef[i])) return;  // keep the last good fit
    }
    int worst = -1;
    for (int i = 1; i < kFeatures; ++i) {
      if (active[i] && coef[i] < 0 && (worst < 0 || coef[i] < coef[worst])) worst = i;
    }
    if (worst < 0) break;
    active[worst] = false;
  }
  for (int i = 1; i < kFeatures; ++i) coef[i] = std::max(0.0, coef[i]);
  if (coef[3] <= 0 && coef[4] <= 0) return;  // prompt tokens look free: noise; keep the last fit
  coef_ = coef;
  ready_ = true;
}

double StepTimeModel::Predict(const StepShape& shape) const {
  const Row x = Features(shape);
  double t = 0;
  for (int i = 0; i < kFeatures; ++i) t += coef_[i] * x[i];
  return t;
}

double StepTimeModel::TypicalDecodeStep() const {
  if (decode_times_.empty()) return 0;
  std::vector<double> t = decode_times_;
  auto mid = t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2);
  std::nth_element(t.begin(), mid, t.end());
  return *mid;
}

int StepTimeModel::MaxPrefill(const StepShape& base, int start, int want, double budget_s) const {
  if (!ready_ || want <= 0) return std::max(0, want);
  auto fits = [&](int tokens) {
    StepShape s = base;
    s.AddChunk(start, tokens);
    return Predict(s) <= budget_s;
  };
  if (fits(want)) return want;
  int lo = 0, hi = want;  // fits(lo) or lo == 0; !fits(hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace pd::engine
