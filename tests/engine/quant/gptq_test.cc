// GPTQ (engine/quant/gptq.h), the input statistics it is built from (hessian.h), the per-weight
// grids it stores codes through (block_grid.h), and importance-weighted rounding
// (matrix_quant.h):
//  - grids: every level a grid reports is what DequantizeRow gives for that code, and SetCode /
//    GetCode address exactly the bits the layouts in k_quants.h describe;
//  - the factorization: U^T U = (H + damp)^-1 in processing order, U upper triangular;
//  - on a random matrix with strongly correlated inputs, GPTQ's output error ||X W^T - X Q^T||
//    is lower than round-to-nearest's for every type (measured ratios printed);
//  - importance-weighted rounding lowers the importance-weighted error for every type.
#include "engine/quant/gptq.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/status_matchers.h"
#include "engine/quant/block_grid.h"
#include "engine/quant/hessian.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/matrix_quant.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;

const std::vector<DType> kGridTypes = {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ2_K,
                                       DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<float> Normal(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// ---- grids -------------------------------------------------------------------------------------

class GridTest : public ::testing::TestWithParam<DType> {};

TEST_P(GridTest, LevelsAreWhatTheDequantizerGivesAndCodesRoundTrip) {
  const DType t = GetParam();
  const int bs = Traits(t).block_size;
  const size_t bb = Traits(t).block_bytes;
  std::vector<float> x = Normal(bs * 64, 7);
  std::vector<uint8_t> q(RowBytes(t, bs * 64));
  QuantizeRow(t, x.data(), q.data(), bs * 64);
  std::vector<float> y(bs);
  std::mt19937 rng(3);
  for (int b = 0; b < 64; ++b) {
    uint8_t* blk = q.data() + b * bb;
    BlockGrid g;
    ReadGrid(t, blk, &g);
    ASSERT_EQ(g.n, bs);
    DequantizeRow(t, blk, y.data(), bs);
    for (int w = 0; w < bs; ++w) {
      const int code = GetCode(t, blk, w);
      ASSERT_GE(code, g.qmin);
      ASSERT_LE(code, g.qmax);
      // Bit for bit: Level() evaluates the dequantizer's expression.
      uint32_t a, e;
      const float lv = g.Level(w, code);
      std::memcpy(&a, &lv, 4);
      std::memcpy(&e, &y[w], 4);
      ASSERT_EQ(a, e) << Traits(t).name << " block " << b << " weight " << w;
    }
    // Random new codes: each lands where the dequantizer reads it, nothing else changes.
    std::vector<int> codes(bs);
    std::uniform_int_distribution<int> ud(g.qmin, g.qmax);
    for (int w = 0; w < bs; ++w) {
      codes[w] = ud(rng);
      SetCode(t, blk, w, codes[w]);
    }
    DequantizeRow(t, blk, y.data(), bs);
    BlockGrid g2;
    ReadGrid(t, blk, &g2);
    for (int w = 0; w < bs; ++w) {
      ASSERT_EQ(GetCode(t, blk, w), codes[w]);
      ASSERT_EQ(y[w], g.Level(w, codes[w]));
      ASSERT_EQ(g2.scale[w], g.scale[w]);
      ASSERT_EQ(g2.offset[w], g.offset[w]);
    }
    // Nearest() picks the level closest to a value.
    for (int w = 0; w < bs; ++w) {
      const float v = x[b * bs + w] * 1.3f;
      const int c = g.Nearest(w, v);
      for (int k = g.qmin; k <= g.qmax; ++k) {
        ASSERT_LE(std::fabs(g.Level(w, c) - v), std::fabs(g.Level(w, k) - v) * (1 + 1e-6f) + 1e-7f)
            << Traits(t).name << " w " << w << " code " << c << " vs " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GridTest, ::testing::ValuesIn(kGridTypes),
                         [](const auto& info) { return std::string(Traits(info.param).name); });

// ---- statistics and factorization ---------------------------------------------------------------

TEST(InputStatsTest, MatchesDirectSums) {
  const int64_t rows = 300, cols = 37;  // more rows than one slab, cols not a multiple of 4
  std::vector<float> x = Normal(rows * cols, 11);
  InputStats s(cols, /*full=*/true);
  s.Add(x.data(), 120, 2);
  s.Add(x.data() + 120 * cols, rows - 120, 1);
  ASSERT_EQ(s.samples(), rows);
  const std::vector<double> h = s.Hessian();
  const std::vector<float> ms = s.MeanSquare();
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0;
      for (int64_t r = 0; r < rows; ++r) want += double{x[r * cols + i]} * x[r * cols + j];
      want *= 2.0 / rows;
      ASSERT_NEAR(h[i * cols + j], want, 1e-5 * (1 + std::fabs(want)));
    }
    ASSERT_NEAR(ms[i], h[i * cols + i] / 2, 1e-5);
  }
}

// X = Z A: rows of inputs whose columns are strongly correlated and of uneven scale, as
// activations are.
std::vector<float> CorrelatedInputs(int64_t rows, int64_t cols, uint32_t seed) {
  const int64_t k = cols / 4;  // latent dimension: rank-deficient plus noise
  std::vector<float> z = Normal(rows * k, seed);
  std::vector<float> a = Normal(k * cols, seed + 1);
  std::vector<float> noise = Normal(rows * cols, seed + 2, 0.05f);
  std::vector<float> colscale = Normal(cols, seed + 3);
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = noise[r * cols + j];
      for (int64_t l = 0; l < k; ++l) s += double{z[r * k + l]} * a[l * cols + j];
      x[r * cols + j] = static_cast<float>(s * (0.3 + std::fabs(colscale[j])));
    }
  }
  return x;
}

TEST(GptqFactorTest, IsTheUpperCholeskyFactorOfTheInverse) {
  const int64_t rows = 400, cols = 48;
  std::vector<float> x = CorrelatedInputs(rows, cols, 5);
  InputStats s(cols, true);
  s.Add(x.data(), rows);
  std::vector<double> h = s.Hessian();
  GptqOptions o;
  o.damp = 0.01;
  auto f = GptqFactor::Create(h, cols, o);
  PD_ASSERT_OK(f);
  const auto& perm = (*f)->perm();
  const auto& u = (*f)->u();
  double mean = 0;
  for (int64_t i = 0; i < cols; ++i) mean += h[i * cols + i] / cols;
  // Act-order: decreasing diagonal.
  for (int64_t i = 1; i < cols; ++i) {
    EXPECT_GE(h[perm[i - 1] * cols + perm[i - 1]], h[perm[i] * cols + perm[i]]);
  }
  // (U^T U) P = I with P the dampened, permuted H.
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      if (j < i) {
        EXPECT_EQ(u[i * cols + j], 0.0);
      }
      double s_ij = 0;
      for (int64_t k = 0; k < cols; ++k) {
        double uu = 0;  // (U^T U)[i][k]
        for (int64_t l = 0; l <= std::min(i, k); ++l) uu += u[l * cols + i] * u[l * cols + k];
        const double p = h[perm[k] * cols + perm[j]] + (k == j ? 0.01 * mean : 0.0);
        s_ij += uu * p;
      }
      EXPECT_NEAR(s_ij, i == j ? 1.0 : 0.0, 1e-8) << i << "," << j;
    }
  }
}

TEST(GptqFactorTest, RejectsMalformedHessians) {
  std::vector<double> h(9, 0.0);
  EXPECT_THAT(GptqFactor::Create(h, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  h[4] = std::nan("");
  EXPECT_THAT(GptqFactor::Create(h, 3), StatusIs(absl::StatusCode::kInvalidArgument));
  // All-zero H (no calibration signal): dead columns get the mean diagonal; still works.
  std::vector<double> zero(16, 0.0);
  PD_EXPECT_OK(GptqFactor::Create(zero, 4));
}

// ---- GPTQ vs round-to-nearest ---------------------------------------------------------------

// ||X (W - Q)^T||_F / ||X W^T||_F, computed from X directly.
double OutputError(const std::vector<float>& x, int64_t n, const std::vector<float>& w,
                   const std::vector<float>& q, int64_t rows, int64_t cols) {
  double num = 0, den = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double y = 0, e = 0;
      for (int64_t j = 0; j < cols; ++j) {
        y += double{x[t * cols + j]} * w[r * cols + j];
        e += double{x[t * cols + j]} * (w[r * cols + j] - q[r * cols + j]);
      }
      num += e * e;
      den += y * y;
    }
  }
  return std::sqrt(num / den);
}

class GptqTest : public ::testing::TestWithParam<DType> {};

TEST_P(GptqTest, LowerOutputErrorThanRoundToNearest) {
  const DType t = GetParam();
  const int64_t rows = 24, cols = 512, n_cal = 1024, n_test = 512;
  std::vector<float> w = Normal(rows * cols, 21, 0.05f);
  std::vector<float> x = CorrelatedInputs(n_cal + n_test, cols, 31);
  InputStats s(cols, true);
  s.Add(x.data(), n_cal, 2);
  const std::vector<double> h = s.Hessian();
  GptqOptions o;
  o.threads = 2;
  auto f = GptqFactor::Create(h, cols, o);
  PD_ASSERT_OK(f);

  const size_t bytes = RowBytes(t, cols) * rows;
  std::vector<uint8_t> rtn(bytes), gptq(bytes);
  QuantizeMatrix(t, w.data(), rows, cols, nullptr, 2, rtn.data());
  PD_ASSERT_OK(GptqQuantize(t, w.data(), rows, cols, **f, o, gptq.data()));
  std::vector<float> q_rtn(rows * cols), q_gptq(rows * cols);
  DequantizeMatrix(t, rtn.data(), rows, cols, 1, q_rtn.data());
  DequantizeMatrix(t, gptq.data(), rows, cols, 1, q_gptq.data());

  // On the calibration inputs, and on held-out inputs from the same distribution.
  const double cal_rtn = OutputError(x, n_cal, w, q_rtn, rows, cols);
  const double cal_gptq = OutputError(x, n_cal, w, q_gptq, rows, cols);
  std::vector<float> held(x.begin() + n_cal * cols, x.end());
  const double test_rtn = OutputError(held, n_test, w, q_rtn, rows, cols);
  const double test_gptq = OutputError(held, n_test, w, q_gptq, rows, cols);
  // The same through the Hessian (what pdctl reports as x_err).
  const double via_h = OutputRelativeError(w.data(), q_gptq.data(), rows, cols, h.data(), 2);
  std::printf(
      "%-5s output error rtn %.5f gptq %.5f (x%.2f); held out rtn %.5f gptq %.5f; "
      "weight error rtn %.4f gptq %.4f\n",
      std::string(Traits(t).name).c_str(), cal_rtn, cal_gptq, cal_gptq / cal_rtn, test_rtn,
      test_gptq, RelativeError(w.data(), q_rtn.data(), rows * cols),
      RelativeError(w.data(), q_gptq.data(), rows * cols));
  EXPECT_NEAR(via_h, cal_gptq, 1e-3 * cal_gptq);
  EXPECT_LT(cal_gptq, 0.9 * cal_rtn);
  EXPECT_LT(test_gptq, 0.9 * test_rtn);
}

TEST_P(GptqTest, WithoutActOrderAndWithSmallBatchesStillBeatsRoundToNearest) {
  const DType t = GetParam();
  const int64_t rows = 8, cols = 256, n = 768;
  std::vector<float> w = Normal(rows * cols, 41, 0.05f);
  std::vector<float> x = CorrelatedInputs(n, cols, 43);
  InputStats s(cols, true);
  s.Add(x.data(), n);
  GptqOptions o;
  o.act_order = false;
  o.block_size = 5;  // batches that do not align with the format's blocks
  o.threads = 1;
  auto f = GptqFactor::Create(s.Hessian(), cols, o);
  PD_ASSERT_OK(f);
  const size_t bytes = RowBytes(t, cols) * rows;
  std::vector<uint8_t> rtn(bytes), gptq(bytes);
  QuantizeMatrix(t, w.data(), rows, cols, nullptr, 1, rtn.data());
  PD_ASSERT_OK(GptqQuantize(t, w.data(), rows, cols, **f, o, gptq.data()));
  std::vector<float> q_rtn(rows * cols), q_gptq(rows * cols);
  DequantizeMatrix(t, rtn.data(), rows, cols, 1, q_rtn.data());
  DequantizeMatrix(t, gptq.data(), rows, cols, 1, q_gptq.data());
  EXPECT_LT(OutputError(x, n, w, q_gptq, rows, cols), OutputError(x, n, w, q_rtn, rows, cols));
}

TEST(GptqQuantizeTest, RejectsBadShapesAndTypes) {
  std::vector<double> h(64 * 64, 0.0);
  for (int i = 0; i < 64; ++i) h[i * 64 + i] = 1.0;
  auto f = GptqFactor::Create(h, 64);
  PD_ASSERT_OK(f);
  std::vector<float> w(64, 0.5f);
  std::vector<uint8_t> out(1024);
  EXPECT_THAT(GptqQuantize(DType::kQ4_K, w.data(), 1, 64, **f, {}, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));  // 64 % 256
  EXPECT_THAT(GptqQuantize(DType::kF16, w.data(), 1, 64, **f, {}, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GptqQuantize(DType::kQ8_0, w.data(), 1, 32, **f, {}, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));  // Hessian of 64 columns
  w[3] = INFINITY;
  EXPECT_THAT(GptqQuantize(DType::kQ8_0, w.data(), 1, 64, **f, {}, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// An identity Hessian has nothing to compensate through: GPTQ reduces to rounding each weight to
// the nearest level of the grid the block search picked with uniform importance.
TEST(GptqQuantizeTest, IdentityHessianGivesNearestLevels) {
  const int64_t cols = 512;
  std::vector<double> h(cols * cols, 0.0);
  for (int64_t i = 0; i < cols; ++i) h[i * cols + i] = 2.0;
  GptqOptions o;
  o.act_order = false;
  auto f = GptqFactor::Create(h, cols, o);
  PD_ASSERT_OK(f);
  for (DType t : kGridTypes) {
    std::vector<float> w = Normal(cols * 3, 9);
    std::vector<uint8_t> out(RowBytes(t, cols) * 3);
    PD_ASSERT_OK(GptqQuantize(t, w.data(), 3, cols, **f, o, out.data()));
    const int bs = Traits(t).block_size;
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t b = 0; b < cols / bs; ++b) {
        const uint8_t* blk = out.data() + r * RowBytes(t, cols) + b * Traits(t).block_bytes;
        BlockGrid g;
        ReadGrid(t, blk, &g);
        for (int k = 0; k < bs; ++k) {
          ASSERT_EQ(GetCode(t, blk, k), g.Nearest(k, w[r * cols + b * bs + k]))
              << Traits(t).name << " row " << r << " weight " << b * bs + k;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GptqTest, ::testing::ValuesIn(kGridTypes),
                         [](const auto& info) { return std::string(Traits(info.param).name); });

// ---- importance-weighted rounding -----------------------------------------------------------

TEST(ImportanceTest, LowersTheWeightedErrorForEveryType) {
  const int64_t rows = 64, cols = 512;
  std::vector<float> w = Normal(rows * cols, 51);
  // Importance spanning four orders of magnitude, as mean x^2 of activations does.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ud(-2.f, 2.f);
  std::vector<float> a(cols);
  for (float& v : a) v = std::pow(10.f, ud(rng));
  for (DType t : kGridTypes) {
    std::vector<uint8_t> plain(RowBytes(t, cols) * rows), weighted(plain.size());
    QuantizeMatrix(t, w.data(), rows, cols, nullptr, 2, plain.data());
    QuantizeMatrix(t, w.data(), rows, cols, a.data(), 2, weighted.data());
    std::vector<float> qp(rows * cols), qw(rows * cols);
    DequantizeMatrix(t, plain.data(), rows, cols, 1, qp.data());
    DequantizeMatrix(t, weighted.data(), rows, cols, 1, qw.data());
    const double ep = WeightedRelativeError(w.data(), qp.data(), rows, cols, a.data());
    const double ew = WeightedRelativeError(w.data(), qw.data(), rows, cols, a.data());
    std::printf("%-5s weighted error plain %.5f importance %.5f (x%.2f)\n",
                std::string(Traits(t).name).c_str(), ep, ew, ew / ep);
    if (t == DType::kQ8_0 || t == DType::kQ5_0) {
      EXPECT_EQ(ep, ew);  // ggml's reference Q8_0 / Q5_0 quantizers take no importance
    } else {
      EXPECT_LT(ew, 0.97 * ep) << Traits(t).name;
    }
  }
}

}  // namespace
}  // namespace pd::engine
