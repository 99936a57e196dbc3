// Second-moment statistics of a weight matrix's inputs, gathered during calibration:
//   H = 2/n X^T X      ([cols, cols], the Hessian of ||X W^T - X Q^T||^2 / n in each row of W)
//   a = mean x^2       ([cols], diag(H) / 2: what importance-weighted rounding weighs errors by)
//   m = max |x|        ([cols], what SmoothQuant's migration factors are computed from)
// over the n input rows (tokens) seen.
//
// Thread safety: not thread safe; one accumulator is fed by one thread (the calibration loop),
// although Add() itself uses up to `threads` threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pd::engine {

class InputStats {
 public:
  // `full`: also accumulate X^T X (cols^2 doubles); otherwise only sum x^2 per column.
  InputStats(int64_t cols, bool full);

  // Adds `rows` input rows x[rows, cols] (row-major). Non-finite values are counted as 0.
  void Add(const float* x, int64_t rows, int threads = 0);

  int64_t cols() const { return cols_; }
  int64_t samples() const { return n_; }
  bool full() const { return full_; }
  size_t bytes() const { return xtx_.size() * sizeof(double) + sum_sq_.size() * sizeof(double); }

  // mean x^2 per column ([cols]); zeros before any sample.
  std::vector<float> MeanSquare() const;
  // max |x| per column ([cols]) over the finite inputs seen; zeros before any sample.
  const std::vector<float>& AbsMax() const { return abs_max_; }
  // H = 2/n X^T X as a full symmetric row-major [cols, cols] matrix. Precondition: full().
  std::vector<double> Hessian() const;

 private:
  int64_t cols_;
  bool full_;
  int64_t n_ = 0;
  std::vector<double> sum_sq_;  // [cols]
  std::vector<float> abs_max_;  // [cols]
  std::vector<double> xtx_;     // [cols, cols], upper triangle (j >= i) filled
  std::vector<float> xt_;       // scratch: a transposed slab of rows
};

}  // namespace pd::engine
