// engine/backend/kv_rotation.h against an explicit Hadamard matrix, and what the rotation is for:
// INT8 rows with outlier channels lose less to rounding once rotated.
#include "engine/backend/kv_rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/engine/backend/hadamard_reference.h"

namespace pd::engine {
namespace {

using testing::HadamardEntry;

// y = scale * (H x) per block of b, in double.
std::vector<double> Reference(const std::vector<float>& x, int b, double scale) {
  std::vector<double> y(x.size(), 0.0);
  for (size_t base = 0; base < x.size(); base += b) {
    for (int i = 0; i < b; ++i) {
      for (int j = 0; j < b; ++j) y[base + i] += HadamardEntry(i, j) * double{x[base + j]};
      y[base + i] *= scale;
    }
  }
  return y;
}

TEST(KvRotationTest, BlockIsTheLargestPowerOfTwoDividingTheHeadDim) {
  EXPECT_EQ(KvRotationBlock(256), 256);
  EXPECT_EQ(KvRotationBlock(128), 128);
  EXPECT_EQ(KvRotationBlock(80), 16);
  EXPECT_EQ(KvRotationBlock(96), 32);
  EXPECT_EQ(KvRotationBlock(20), 4);
  EXPECT_EQ(KvRotationBlock(7), 1);
}

TEST(KvRotationTest, EqualsTheHadamardMatrixAndUndoesItself) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int hd : {1, 4, 8, 20, 64, 80, 96, 128, 256}) {
    SCOPED_TRACE(hd);
    std::vector<float> x(hd);
    for (float& v : x) v = nd(rng);
    const int b = KvRotationBlock(hd);
    std::vector<float> in = x;
    RotateKvRowIn(in.data(), hd);
    const std::vector<double> want = Reference(x, b, 1.0 / b);
    double norm_x = 0, norm_in = 0;
    for (int i = 0; i < hd; ++i) {
      EXPECT_NEAR(in[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
      norm_x += double{x[i]} * x[i];
      norm_in += double{in[i]} * in[i] * b;  // H / sqrt(b) is orthonormal
    }
    EXPECT_NEAR(norm_in, norm_x, 1e-4 * norm_x);
    std::vector<float> back = in;
    RotateKvRowOut(back.data(), hd);
    for (int i = 0; i < hd; ++i) EXPECT_NEAR(back[i], x[i], 1e-5f * (1 + std::fabs(x[i])));
    // A query rotated out dotted with a row rotated in is the plain dot product.
    std::vector<float> q(hd);
    for (float& v : q) v = nd(rng);
    std::vector<float> rq = q;
    RotateKvRowOut(rq.data(), hd);
    double dot = 0, rdot = 0;
    for (int i = 0; i < hd; ++i) {
      dot += double{q[i]} * x[i];
      rdot += double{rq[i]} * in[i];
    }
    EXPECT_NEAR(rdot, dot, 1e-4 * (1 + std::fabs(dot)));
  }
}

// A 256-value head with four channels 30x the others (the shape of Gemma 3's keys): per-head INT8
// with the rotation has several times less rounding error than without.
TEST(KvRotationTest, RotatedInt8RowsRoundOutlierHeadsFinerThanPlainOnes) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int hd = 256;
  auto int8_error = [&](const std::vector<float>& x, bool rotate) {
    std::vector<float> y = x;
    if (rotate) RotateKvRowIn(y.data(), hd);
    float amax = 0;
    for (float v : y) amax = std::max(amax, std::fabs(v));
    const float d = amax / 127.f;
    for (float& v : y) v = d * std::nearbyint(v / d);
    if (rotate) RotateKvRowOut(y.data(), hd);
    double err = 0;
    for (int i = 0; i < hd; ++i) err += (double{y[i]} - x[i]) * (double{y[i]} - x[i]);
    return err;
  };
  double plain = 0, rotated = 0;
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> x(hd);
    for (float& v : x) v = nd(rng);
    for (int c : {3, 77, 130, 201}) x[c] *= 30.f;
    plain += int8_error(x, false);
    rotated += int8_error(x, true);
  }
  EXPECT_LT(rotated * 4, plain) << "squared error plain " << plain << ", rotated " << rotated;
}

}  // namespace
}  // namespace pd::engine
