#include "engine/quant/hessian.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "engine/quant/parallel.h"

namespace pd::engine {
namespace {

// Rows per slab: each slab is transposed once and its X^T X summed in float (<= 256 products per
// sum, relative error ~1e-6) before being added to the double accumulator.
constexpr int64_t kSlab = 256;
// Output tile: 4 x 4 dot products share their loads (16 multiply-adds per 8 loads).
constexpr int64_t kTile = 4;

}  // namespace

InputStats::InputStats(int64_t cols, bool full)
    : cols_(cols), full_(full), sum_sq_(cols, 0.0), abs_max_(cols, 0.f) {
  PD_CHECK(cols > 0);
  if (full_) xtx_.assign(static_cast<size_t>(cols) * cols, 0.0);
}

void InputStats::Add(const float* x, int64_t rows, int threads) {
  const int64_t c = cols_;
  for (int64_t r0 = 0; r0 < rows; r0 += kSlab) {
    const int64_t m = std::min(kSlab, rows - r0);
    // xt_[i * m + r] = x[r0 + r, i]
    xt_.resize(static_cast<size_t>(c) * m);
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + (r0 + r) * c;
      for (int64_t i = 0; i < c; ++i) {
        const float v = xr[i];
        xt_[i * m + r] = std::isfinite(v) ? v : 0.f;
      }
    }
    for (int64_t i = 0; i < c; ++i) {
      const float* xi = &xt_[i * m];
      double s = 0;
      float amax = abs_max_[i];
      for (int64_t r = 0; r < m; ++r) {
        s += double{xi[r]} * xi[r];
        amax = std::max(amax, std::fabs(xi[r]));
      }
      sum_sq_[i] += s;
      abs_max_[i] = amax;
    }
    if (full_) {
      // Upper triangle by 4 x 4 tiles; rows of tiles are spread over threads (later tile rows are
      // shorter, so small grains balance them).
      const int64_t tiles = (c + kTile - 1) / kTile;
      ParallelFor(tiles, threads, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t ti = t0; ti < t1; ++ti) {
          const int64_t i0 = ti * kTile, ni = std::min(kTile, c - i0);
          for (int64_t j0 = i0; j0 < c; j0 += kTile) {
            const int64_t nj = std::min(kTile, c - j0);
            float acc[kTile][kTile] = {};
            if (ni == kTile && nj == kTile) {
              const float* a[kTile];
              const float* b[kTile];
              for (int64_t k = 0; k < kTile; ++k) {
                a[k] = &xt_[(i0 + k) * m];
                b[k] = &xt_[(j0 + k) * m];
              }
              for (int64_t r = 0; r < m; ++r) {
                float x[kTile], y[kTile];
                for (int64_t k = 0; k < kTile; ++k) x[k] = a[k][r], y[k] = b[k][r];
                for (int64_t p = 0; p < kTile; ++p) {
                  for (int64_t q = 0; q < kTile; ++q) acc[p][q] += x[p] * y[q];
                }
              }
            } else {
              for (int64_t a = 0; a < ni; ++a) {
                for (int64_t b = 0; b < nj; ++b) {
                  const float* xa = &xt_[(i0 + a) * m];
                  const float* xb = &xt_[(j0 + b) * m];
                  float s = 0.f;
                  for (int64_t r = 0; r < m; ++r) s += xa[r] * xb[r];
                  acc[a][b] = s;
                }
              }
            }
            for (int64_t a = 0; a < ni; ++a) {
              for (int64_t b = 0; b < nj; ++b) {
                if (j0 + b >= i0 + a) xtx_[(i0 + a) * c + j0 + b] += acc[a][b];
              }
            }
          }
        }
      });
    }
    n_ += m;
  }
}

std::vector<float> InputStats::MeanSquare() const {
  std::vector<float> out(cols_, 0.f);
  if (n_ == 0) return out;
  for (int64_t i = 0; i < cols_; ++i) out[i] = static_cast<float>(sum_sq_[i] / n_);
  return out;
}

std::vector<double> InputStats::Hessian() const {
  PD_CHECK(full_);
  const int64_t c = cols_;
  std::vector<double> h(static_cast<size_t>(c) * c, 0.0);
  if (n_ == 0) return h;
  const double s = 2.0 / static_cast<double>(n_);
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = i; j < c; ++j) h[i * c + j] = h[j * c + i] = s * xtx_[i * c + j];
  }
  return h;
}

}  // namespace pd::engine
