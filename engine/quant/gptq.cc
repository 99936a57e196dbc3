#include "engine/quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/status.h"
#include "common/strings.h"
#include "engine/quant/block_grid.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/parallel.h"

namespace pd::engine {
namespace {

// Work per parallel step below which the factorization loops stay on one thread (spawning
// threads costs tens of microseconds).
constexpr int64_t kParallelWork = 1 << 18;

double Dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += a[k] * b[k];
    s1 += a[k + 1] * b[k + 1];
    s2 += a[k + 2] * b[k + 2];
    s3 += a[k + 3] * b[k + 3];
  }
  for (; k < n; ++k) s0 += a[k] * b[k];
  return (s0 + s1) + (s2 + s3);
}

// In-place Cholesky A = L L^T of a row-major [n, n] matrix whose lower triangle holds A; L
// overwrites the lower triangle. False when a pivot is not positive.
bool CholeskyLower(double* a, int64_t n, int threads) {
  for (int64_t j = 0; j < n; ++j) {
    double* aj = a + j * n;
    const double s = aj[j] - Dot(aj, aj, j);
    if (!(s > 0) || !std::isfinite(s)) return false;
    const double ljj = std::sqrt(s);
    aj[j] = ljj;
    auto rows = [&](int64_t b, int64_t e) {
      for (int64_t i = j + 1 + b; i < j + 1 + e; ++i) {
        double* ai = a + i * n;
        ai[j] = (ai[j] - Dot(ai, aj, j)) / ljj;
      }
    };
    const int64_t m = n - j - 1;
    if (m * j >= kParallelWork && threads != 1) {
      ParallelFor(m, threads, std::max<int64_t>(16, m / 64), rows);
    } else {
      rows(0, m);
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptqFactor>> GptqFactor::Create(absl::Span<const double> h,
                                                               int64_t cols, const GptqOptions& o) {
  const int64_t n = cols;
  if (n <= 0 || h.size() != static_cast<size_t>(n) * n) {
    return absl::InvalidArgumentError(
        pd::StrCat("GPTQ: Hessian has ", h.size(), " entries, expected ", n, "^2"));
  }
  for (double v : h) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("GPTQ: non-finite Hessian entry");
  }
  // Dead inputs (never nonzero in calibration) get the mean diagonal, so that their columns are
  // still quantized sensibly and H stays invertible.
  std::vector<double> diag(n);
  double sum = 0;
  int64_t live = 0;
  for (int64_t i = 0; i < n; ++i) {
    diag[i] = h[i * n + i];
    if (diag[i] > 0) sum += diag[i], ++live;
  }
  const double live_mean = live > 0 ? sum / live : 1.0;
  for (double& d : diag) {
    if (!(d > 0)) d = live_mean;
  }
  const double mean_diag = std::accumulate(diag.begin(), diag.end(), 0.0) / n;

  auto f = std::unique_ptr<GptqFactor>(new GptqFactor());
  f->cols_ = n;
  f->perm_.resize(n);
  std::iota(f->perm_.begin(), f->perm_.end(), 0);
  if (o.act_order) {
    std::stable_sort(f->perm_.begin(), f->perm_.end(),
                     [&](int64_t a, int64_t b) { return diag[a] > diag[b]; });
  }
  const std::vector<int64_t>& perm = f->perm_;
  const int threads = o.threads > 0 ? o.threads : DefaultThreads();

  std::vector<double> q(static_cast<size_t>(n) * n);
  for (int attempt = 0; attempt < 6; ++attempt) {
    const double damp = (o.damp > 0 ? o.damp : 1e-6) * std::pow(10.0, attempt);
    const double add = damp * mean_diag;
    // Q = J P J with P = H[perm][perm] + add * I, J the reversal: Q[a][b] = P[n-1-a][n-1-b].
    // Only the lower triangle is read by the factorization.
    for (int64_t a = 0; a < n; ++a) {
      const int64_t ca = perm[n - 1 - a];
      for (int64_t b = 0; b <= a; ++b) {
        const int64_t cb = perm[n - 1 - b];
        q[a * n + b] = a == b ? diag[ca] + add : h[ca * n + cb];
      }
    }
    if (!CholeskyLower(q.data(), n, threads)) continue;
    // T = (M^-1)^T, row j holding column j of the lower-triangular inverse of M.
    std::vector<double> t(static_cast<size_t>(n) * n, 0.0);
    auto columns = [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        double* tj = t.data() + j * n;
        tj[j] = 1.0 / q[j * n + j];
        for (int64_t i = j + 1; i < n; ++i) {
          const double* mi = q.data() + i * n;
          tj[i] = -Dot(mi + j, tj + j, i - j) / mi[i];
        }
      }
    };
    if (n * n * n / 6 >= kParallelWork && threads != 1) {
      ParallelFor(n, threads, std::max<int64_t>(1, n / (8 * threads)), columns);
    } else {
      columns(0, n);
    }
    // U = J M^-1 J: U[a][b] = M^-1[n-1-a][n-1-b] = T[n-1-b][n-1-a] for b >= a.
    f->u_.assign(static_cast<size_t>(n) * n, 0.0);
    for (int64_t a = 0; a < n; ++a) {
      for (int64_t b = a; b < n; ++b) f->u_[a * n + b] = t[(n - 1 - b) * n + (n - 1 - a)];
    }
    f->importance_.resize(n);
    for (int64_t c = 0; c < n; ++c) f->importance_[c] = static_cast<float>(diag[c] + add);
    f->damp_used_ = damp;
    return f;
  }
  return absl::FailedPreconditionError(
      "GPTQ: the Hessian is not positive definite even with 1e5x the dampening");
}

absl::Status GptqQuantize(DType type, const float* w, int64_t rows, int64_t cols,
                          const GptqFactor& factor, const GptqOptions& o, uint8_t* out) {
  if (!HasGrid(type)) {
    return absl::InvalidArgumentError(
        pd::StrCat("GPTQ: no code grid for type ", Traits(type).name));
  }
  const int64_t bs = Traits(type).block_size;
  const size_t bb = Traits(type).block_bytes;
  if (cols != factor.cols() || cols % bs != 0) {
    return absl::InvalidArgumentError(pd::StrCat("GPTQ: ", cols, " columns do not fit a ",
                                                 factor.cols(), "-column Hessian and ",
                                                 Traits(type).name, " blocks of ", bs));
  }
  for (int64_t k = 0; k < rows * cols; ++k) {
    if (!std::isfinite(w[k])) return absl::InvalidArgumentError("GPTQ: non-finite weight");
  }
  const int64_t n = cols, n_blocks = cols / bs;
  const size_t row_bytes = RowBytes(type, cols);
  const std::vector<int64_t>& perm = factor.perm();
  const double* u = factor.u().data();
  const float* importance = factor.importance().data();
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[perm[i]] = i;
  // The block whose scales are chosen at processing position i (its first column), or -1.
  std::vector<int64_t> starts(n, -1);
  for (int64_t b = 0; b < n_blocks; ++b) {
    int64_t first = n;
    for (int64_t k = 0; k < bs; ++k) first = std::min(first, pos[b * bs + k]);
    starts[first] = b;
  }
  const int64_t batch = std::max(1, o.block_size);

  // Each row is independent; a task takes a few rows so the buffers stay warm.
  ParallelFor(rows, o.threads, 4, [&](int64_t r0, int64_t r1) {
    std::vector<double> wp(n);
    std::vector<double> err(batch);
    std::vector<BlockGrid> grids(n_blocks);
    std::vector<float> vals(bs);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = w + r * cols;
      uint8_t* orow = out + r * row_bytes;
      std::memset(orow, 0, row_bytes);
      for (int64_t i = 0; i < n; ++i) wp[i] = wr[perm[i]];
      for (int64_t i1 = 0; i1 < n; i1 += batch) {
        const int64_t i2 = std::min(n, i1 + batch);
        for (int64_t i = i1; i < i2; ++i) {
          if (const int64_t b = starts[i]; b >= 0) {
            // The block's current weights: columns beyond this batch still miss the updates
            // of the batch's columns quantized so far.
            for (int64_t k = 0; k < bs; ++k) {
              const int64_t p = pos[b * bs + k];
              double v = wp[p];
              if (p >= i2) {
                for (int64_t t = i1; t < i; ++t) v -= err[t - i1] * u[t * n + p];
              }
              vals[k] = static_cast<float>(v);
            }
            QuantizeRow(type, vals.data(), orow + b * bb, bs, importance + b * bs);
            ReadGrid(type, orow + b * bb, &grids[b]);
          }
          const int64_t c = perm[i];
          const int64_t b = c / bs;
          const int wi = static_cast<int>(c % bs);
          const BlockGrid& g = grids[b];
          const int code = g.Nearest(wi, static_cast<float>(wp[i]));
          SetCode(type, orow + b * bb, wi, code);
          const double e = (wp[i] - g.Level(wi, code)) / u[i * n + i];
          err[i - i1] = e;
          const double* ui = u + i * n;
          for (int64_t j = i + 1; j < i2; ++j) wp[j] -= e * ui[j];
        }
        // Lazy update of the columns after the batch.
        for (int64_t t = i1; t < i2; ++t) {
          const double e = err[t - i1];
          if (e == 0) continue;
          const double* ut = u + t * n;
          for (int64_t p = i2; p < n; ++p) wp[p] -= e * ut[p];
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pd::engine
