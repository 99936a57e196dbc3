// MatMul kernels of pdserve's own formats: W8A8 (x per-token INT8 rows) and W4A16 (x F32), the
// AVX2 tiles against their scalar twins and against double-precision references, the W8A8
// activation quantizer, and MatMul / GetRows through the CPU backend, on random data with odd
// sizes (tiles of 1..4 x 1..4, row counts and token counts that leave tails).
//
// Tolerances (documented in docs/quantization.md):
//  - W8A8: the integer dot of a row is exact in both tables and the same two f32 products are
//    taken, so scalar and AVX2 results must be EQUAL (bit for bit), and both equal
//    (d_w * d_x) * float(exact integer sum). Against the double reference sum_j (d_w q_w)(d_x q_x):
//    |y - ref| <= 3 * 2^-24 * |ref| + tiny (three roundings: d_w * d_x, the int -> float
//    conversion, the product).
//  - The W8A8 activation quantizer: bit-exact between the tables (scale, codes, zero padding),
//    ties (x / d exactly k + 0.5) included.
//  - W4A16: |y - ref| <= (k / 8 + 128 + k / 128 + 8) * 2^-24 * T with T = sum_j |w^_j x_j| (a
//    first-order bound on the roundings of either summation order: sequential per 128-block in
//    the scalar kernel, 8 lanes in AVX2); with unit scales and small integer activations every
//    operation is exact and scalar, AVX2 and the reference must be EQUAL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/w4a16.h"
#include "engine/quant/w8a8.h"

namespace pd::engine::cpu {
namespace {

using ::pd::testing::IsOk;

constexpr double kU = 1.0 / (1 << 24);

// Random rows of a type: weights drawn from a normal distribution with a few large outliers,
// quantized by the scalar reference quantizer.
std::vector<char> RandomRows(DType t, int rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<char> out(RowBytes(t, k) * rows + 64);
  std::vector<float> x(k);
  for (int r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) x[j] = normal(rng) * (j % 53 == 7 ? 30.f : 1.f);
    QuantizeRow(t, x.data(), out.data() + r * RowBytes(t, k), k);
  }
  return out;
}

std::vector<float> RandomF32(int64_t n, std::mt19937& rng, float outlier = 20.f) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 41 == 3 ? outlier : 1.f);
  return x;
}

class PdFormatKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scalar_ = &ScalarKernels();
    avx2_ = Avx2Kernels();
    if (avx2_ != nullptr && &SelectKernels(false) != avx2_) avx2_ = nullptr;  // CPU lacks AVX2
  }
  const Kernels* scalar_ = nullptr;
  const Kernels* avx2_ = nullptr;  // nullptr: the AVX2 comparisons are skipped
};

TEST_F(PdFormatKernelsTest, W8A8ActivationQuantizerBitExactIncludingTies) {
  if (avx2_ == nullptr) GTEST_SKIP() << "no AVX2 on this CPU/build";
  std::mt19937 rng(11);
  for (int64_t k : {32, 64, 96, 1056, 4096}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> x = RandomF32(k, rng, rep % 2 ? 50.f : 1.f);
      if (rep == 0) {
        // amax 127 gives d = 1: x.5 values are exact ties for roundf (away from zero).
        for (int64_t j = 0; j < k; ++j) x[j] = static_cast<float>(j % 21) - 10.5f;
        x[0] = 127.f;
      }
      if (rep == 1) std::fill(x.begin(), x.end(), 0.f);
      std::vector<char> a(W8A8RowBytes(k), 1), b(W8A8RowBytes(k), 2);
      scalar_->quantize_w8a8(x.data(), a.data(), k);
      avx2_->quantize_w8a8(x.data(), b.data(), k);
      ASSERT_EQ(a, b) << "k " << k << " rep " << rep;
      std::vector<char> ref(W8A8RowBytes(k));
      QuantizeRowW8A8(x.data(), ref.data(), k);
      ASSERT_EQ(a, ref);
      if (rep == 0) {
        EXPECT_EQ(W8A8RowCodes(a.data())[1], -10);  // -9.5 -> -10
      }
    }
  }
}

// Every tile shape over random rows: scalar == AVX2 == (d_w d_x) float(exact int sum), and
// within 3 roundings of the double reference.
TEST_F(PdFormatKernelsTest, W8A8TilesExact) {
  std::mt19937 rng(12);
  for (int64_t k : {32, 96, 1056, 4096}) {
    const size_t ws = RowBytes(DType::kW8A8, k);
    const std::vector<char> w = RandomRows(DType::kW8A8, kGemmTileW, k, rng);
    std::vector<char> x(ws * kGemmTileX);
    for (int c = 0; c < kGemmTileX; ++c) {
      const std::vector<float> xf = RandomF32(k, rng);
      QuantizeRowW8A8(xf.data(), x.data() + c * ws, k);
    }
    for (int nr = 1; nr <= kGemmTileW; ++nr) {
      for (int nc = 1; nc <= kGemmTileX; ++nc) {
        float ys[16], ya[16];
        const int gi = static_cast<int>(GemmType::kW8A8);
        scalar_->gemm[gi](k, w.data(), ws, nr, x.data(), ws, nc, ys, 4);
        if (avx2_ != nullptr) {
          avx2_->gemm[gi](k, w.data(), ws, nr, x.data(), ws, nc, ya, 4);
        }
        for (int c = 0; c < nc; ++c) {
          for (int r = 0; r < nr; ++r) {
            const char* wr = w.data() + r * ws;
            const char* xr = x.data() + c * ws;
            int64_t isum = 0;
            double deq = 0, mag = 0;  // over the dequantized (f32-rounded) values
            for (int64_t j = 0; j < k; ++j) {
              isum += W8A8RowCodes(wr)[j] * W8A8RowCodes(xr)[j];
              const double t = double{W8A8RowScale(wr) * W8A8RowCodes(wr)[j]} *
                               double{W8A8RowScale(xr) * W8A8RowCodes(xr)[j]};
              deq += t, mag += std::fabs(t);
            }
            const float exact = (W8A8RowScale(wr) * W8A8RowScale(xr)) * static_cast<float>(isum);
            ASSERT_EQ(ys[c * 4 + r], exact) << "k " << k << " tile " << nr << "x" << nc;
            if (avx2_ != nullptr) {
              ASSERT_EQ(ya[c * 4 + r], exact) << "avx2 k " << k;
            }
            // The exact value of the stored row scales and codes, and the dot of the dequantized
            // rows (each element rounded once more: 2 roundings of each term).
            const double ref =
                double{W8A8RowScale(wr)} * W8A8RowScale(xr) * static_cast<double>(isum);
            ASSERT_LE(std::fabs(ys[c * 4 + r] - ref), 3 * kU * std::fabs(ref) + 1e-30);
            ASSERT_LE(std::fabs(ys[c * 4 + r] - deq), 3 * kU * std::fabs(ref) + 2 * kU * mag);
          }
        }
      }
    }
  }
}

// T = sum |w^ x| and the double reference of one W4A16 row dot.
void W4A16Reference(const char* w, const float* x, int64_t k, double* ref, double* mag) {
  std::vector<float> wf(k);
  DequantizeRow(DType::kW4A16, w, wf.data(), k);
  *ref = 0, *mag = 0;
  for (int64_t j = 0; j < k; ++j) {
    *ref += double{wf[j]} * x[j];
    *mag += std::fabs(double{wf[j]} * x[j]);
  }
}

TEST_F(PdFormatKernelsTest, W4A16TilesWithinBound) {
  std::mt19937 rng(13);
  double worst = 0;  // largest |y - ref| / T seen, for the record
  for (int64_t k : {128, 384, 1152, 4096}) {
    const size_t ws = RowBytes(DType::kW4A16, k);
    const size_t xs = k * sizeof(float);
    const std::vector<char> w = RandomRows(DType::kW4A16, kGemmTileW, k, rng);
    std::vector<float> x;
    for (int c = 0; c < kGemmTileX; ++c) {
      const std::vector<float> xc = RandomF32(k, rng);
      x.insert(x.end(), xc.begin(), xc.end());
    }
    const double bound = (k / 8 + 128 + k / 128 + 8) * kU;
    for (int nr = 1; nr <= kGemmTileW; ++nr) {
      for (int nc = 1; nc <= kGemmTileX; ++nc) {
        float ys[16], ya[16];
        const int gi = static_cast<int>(GemmType::kW4A16);
        scalar_->gemm[gi](k, w.data(), ws, nr, x.data(), xs, nc, ys, 4);
        if (avx2_ != nullptr) {
          avx2_->gemm[gi](k, w.data(), ws, nr, x.data(), xs, nc, ya, 4);
        }
        for (int c = 0; c < nc; ++c) {
          for (int r = 0; r < nr; ++r) {
            double ref, mag;
            W4A16Reference(w.data() + r * ws, x.data() + c * k, k, &ref, &mag);
            ASSERT_LE(std::fabs(ys[c * 4 + r] - ref), bound * mag) << "scalar k " << k;
            // The scalar tile is the reference dot.
            ASSERT_EQ(ys[c * 4 + r],
                      DotW4A16F32(reinterpret_cast<const BlockW4A16*>(w.data() + r * ws),
                                  x.data() + c * k, k));
            worst = std::max(worst, std::fabs(ys[c * 4 + r] - ref) / mag);
            if (avx2_ != nullptr) {
              ASSERT_LE(std::fabs(ya[c * 4 + r] - ref), bound * mag) << "avx2 k " << k;
              ASSERT_LE(std::fabs(ya[c * 4 + r] - ys[c * 4 + r]), 2 * bound * mag);
              worst = std::max(worst, std::fabs(ya[c * 4 + r] - ref) / mag);
            }
          }
        }
      }
    }
  }
  RecordProperty("worst_error_over_T", std::to_string(worst));
  std::printf("W4A16 worst |y - ref| / T = %.3g (bound at k = 4096: %.3g)\n", worst,
              (4096 / 8 + 128 + 32 + 8) * kU);
}

// Unit scales and small integer activations: every operation is exact, so the tables and the
// reference agree exactly (a wrong nibble, half or scale cannot hide in a tolerance).
TEST_F(PdFormatKernelsTest, W4A16ExactWithUnitScales) {
  std::mt19937 rng(14);
  std::uniform_int_distribution<int> level(-8, 7), act(-8, 8);
  const int64_t k = 640;
  const size_t ws = RowBytes(DType::kW4A16, k), xs = k * sizeof(float);
  std::vector<char> w(ws * kGemmTileW);
  for (int r = 0; r < kGemmTileW; ++r) {
    for (int64_t b = 0; b < k / 128; ++b) {
      int8_t q[128];
      for (int j = 0; j < 128; ++j) q[j] = static_cast<int8_t>(level(rng));
      PackW4A16(F32ToF16(1.f), q, reinterpret_cast<BlockW4A16*>(w.data() + r * ws) + b);
    }
  }
  std::vector<float> x(k * kGemmTileX);
  for (float& v : x) v = static_cast<float>(act(rng));
  float ys[16], ya[16];
  const int gi = static_cast<int>(GemmType::kW4A16);
  scalar_->gemm[gi](k, w.data(), ws, 4, x.data(), xs, 4, ys, 4);
  if (avx2_ != nullptr) {
    avx2_->gemm[gi](k, w.data(), ws, 4, x.data(), xs, 4, ya, 4);
  }
  for (int c = 0; c < 4; ++c) {
    for (int r = 0; r < 4; ++r) {
      double ref, mag;
      W4A16Reference(w.data() + r * ws, x.data() + c * k, k, &ref, &mag);
      ASSERT_EQ(ys[c * 4 + r], ref);
      if (avx2_ != nullptr) {
        ASSERT_EQ(ya[c * 4 + r], ref);
      }
    }
  }
}

// MatMul and GetRows through the CPU backend (scalar and, when present, AVX2), with row and token
// counts that leave partial tiles and several work chunks.
class PdFormatBackendTest : public ::testing::TestWithParam<bool> {};

TEST_P(PdFormatBackendTest, MatMulAndGetRows) {
  const bool force_scalar = GetParam();
  std::unique_ptr<Backend> be = CreateCpuBackend({.threads = 3, .force_scalar = force_scalar});
  std::mt19937 rng(15);
  for (DType t : {DType::kW8A8, DType::kW4A16}) {
    const int64_t k = t == DType::kW8A8 ? 96 : 384;
    const int m = 7, n = 5;
    std::vector<char> wb = RandomRows(t, m, k, rng);
    const std::vector<float> xf = RandomF32(n * k, rng);
    Tensor w{t, k, m, wb.data()};
    Tensor x{DType::kF32, k, n, const_cast<float*>(xf.data())};
    std::vector<float> yv(n * m, -1.f);
    Tensor y{DType::kF32, m, n, yv.data()};
    ASSERT_THAT(be->MatMul(w, x, y), IsOk());
    std::vector<float> wf(k);
    std::vector<char> xq(W8A8RowBytes(k));
    std::vector<float> xd(k);
    for (int i = 0; i < n; ++i) {
      // The companion activations: W8A8 quantizes each token row, W4A16 keeps F32.
      if (t == DType::kW8A8) {
        QuantizeRowW8A8(xf.data() + i * k, xq.data(), k);
        DequantizeRowW8A8(xq.data(), xd.data(), k);
      } else {
        std::copy(xf.begin() + i * k, xf.begin() + (i + 1) * k, xd.begin());
      }
      for (int r = 0; r < m; ++r) {
        DequantizeRow(t, wb.data() + r * RowBytes(t, k), wf.data(), k);
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < k; ++j)
          ref += double{wf[j]} * xd[j], mag += std::fabs(wf[j] * xd[j]);
        ASSERT_NEAR(yv[i * m + r], ref, 1e-5 * mag) << Traits(t).name << " " << i << "," << r;
      }
    }
    // GetRows dequantizes rows exactly as DequantizeRow does.
    const std::vector<int32_t> ids = {6, 0, 3};
    std::vector<float> out(ids.size() * k);
    Tensor o{DType::kF32, k, static_cast<int64_t>(ids.size()), out.data()};
    ASSERT_THAT(be->GetRows(w, ids, o), IsOk());
    for (size_t i = 0; i < ids.size(); ++i) {
      DequantizeRow(t, wb.data() + ids[i] * RowBytes(t, k), wf.data(), k);
      for (int64_t j = 0; j < k; ++j) ASSERT_EQ(out[i * k + j], wf[j]);
    }
    // A row length that is not a multiple of the block size is refused.
    Tensor bad{t, k + 16, 1, wb.data()};
    std::vector<float> bxv(k + 16);
    Tensor bx{DType::kF32, k + 16, 1, bxv.data()};
    std::vector<float> by(1);
    Tensor byt{DType::kF32, 1, 1, by.data()};
    EXPECT_FALSE(be->MatMul(bad, bx, byt).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, PdFormatBackendTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "scalar" : "selected"; });

}  // namespace
}  // namespace pd::engine::cpu
