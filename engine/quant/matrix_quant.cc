#include "engine/quant/matrix_quant.h"

#include <cmath>
#include <vector>

#include "engine/quant/k_quants.h"
#include "engine/quant/parallel.h"

namespace pd::engine {

void QuantizeMatrix(DType type, const float* w, int64_t rows, int64_t cols, const float* importance,
                    int threads, uint8_t* out) {
  const size_t rb = RowBytes(type, cols);
  ParallelFor(rows, threads, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      QuantizeRow(type, w + r * cols, out + r * rb, cols, importance);
  });
}

void DequantizeMatrix(DType type, const uint8_t* q, int64_t rows, int64_t cols, int threads,
                      float* out) {
  const size_t rb = RowBytes(type, cols);
  ParallelFor(rows, threads, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) DequantizeRow(type, q + r * rb, out + r * cols, cols);
  });
}

double RelativeError(const float* w, const float* q, int64_t n) {
  double num = 0, den = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double e = double{w[k]} - q[k];
    num += e * e;
    den += double{w[k]} * w[k];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

double WeightedRelativeError(const float* w, const float* q, int64_t rows, int64_t cols,
                             const float* a) {
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const double x = w[r * cols + j], e = x - q[r * cols + j];
      num += a[j] * e * e;
      den += a[j] * x * x;
    }
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

double OutputRelativeError(const float* w, const float* q, int64_t rows, int64_t cols,
                           const double* h, int threads) {
  std::vector<double> num(rows), den(rows);
  ParallelFor(rows, threads, 16, [&](int64_t r0, int64_t r1) {
    std::vector<double> e(cols), x(cols);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        x[j] = w[r * cols + j];
        e[j] = x[j] - q[r * cols + j];
      }
      double sn = 0, sd = 0;
      for (int64_t i = 0; i < cols; ++i) {
        const double* hi = h + i * cols;
        double tn = 0, td = 0;
        for (int64_t j = 0; j < cols; ++j) {
          tn += hi[j] * e[j];
          td += hi[j] * x[j];
        }
        sn += e[i] * tn;
        sd += x[i] * td;
      }
      num[r] = sn;
      den[r] = sd;
    }
  });
  double sn = 0, sd = 0;
  for (int64_t r = 0; r < rows; ++r) sn += num[r], sd += den[r];
  return sd > 0 ? std::sqrt(std::max(0.0, sn) / sd) : 0.0;
}

}  // namespace pd::engine
