// Q8_0 layout and quantization, and the scalar F16/BF16 row converters, against hand-computed
// values and independent double-precision references.
#include "engine/quant/q8_0.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/quant/fp16.h"

namespace pd::engine {
namespace {

// Value of IEEE binary16 bits computed from the definition, in double.
double HalfValue(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f)
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

double Bf16Value(uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int exp = (b >> 7) & 0xff;
  const int mant = b & 0x7f;
  if (exp == 0xff)
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -133);
  return sign * std::ldexp(128 + mant, exp - 134);
}

TEST(Q8_0Test, LayoutMatchesGgml) {
  EXPECT_EQ(sizeof(BlockQ8_0), 34u);
  EXPECT_EQ(offsetof(BlockQ8_0, d), 0u);
  EXPECT_EQ(offsetof(BlockQ8_0, qs), 2u);
}

TEST(Q8_0Test, KnownValuesRoundHalfAwayFromZero) {
  float x[32] = {127.f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49999f, -126.6f, 3.5f, -0.4f};
  BlockQ8_0 b;
  QuantizeRowQ8_0(x, &b, 32);
  EXPECT_EQ(b.d, 0x3c00);  // amax 127 -> d = 1.0
  const int8_t want[9] = {127, 3, -3, 1, -1, 1, -127, 4, 0};
  for (int j = 0; j < 9; ++j) EXPECT_EQ(b.qs[j], want[j]) << "j=" << j;
  for (int j = 9; j < 32; ++j) EXPECT_EQ(b.qs[j], 0) << "j=" << j;
}

TEST(Q8_0Test, KnownValuesWithInexactScale) {
  // x_j = j/4 - 4: amax 4 (at j = 0), d = 4/127 = 0.0314960..., stored as f16 0x2808
  // (2^-5 * (1 + 8/1024) = 0.0314941...); q_j = round(x_j * 31.75).
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = j * 0.25f - 4.f;
  BlockQ8_0 b;
  QuantizeRowQ8_0(x, &b, 32);
  EXPECT_EQ(b.d, 0x2808);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], -119);  // -3.75 * 31.75 = -119.0625
  EXPECT_EQ(b.qs[2], -111);  // -111.125
  EXPECT_EQ(b.qs[14], -16);  // -0.5 * 31.75 = -15.875
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[18], 16);   // 15.875
  EXPECT_EQ(b.qs[31], 119);  // 3.75 * 31.75 = 119.0625
}

TEST(Q8_0Test, ZeroBlock) {
  std::vector<float> x(64, 0.f);
  x[40] = -0.f;
  std::vector<BlockQ8_0> b(2);
  QuantizeRowQ8_0(x.data(), b.data(), 64);
  for (const BlockQ8_0& blk : b) {
    EXPECT_EQ(blk.d, 0);
    for (int8_t q : blk.qs) EXPECT_EQ(q, 0);
  }
  std::vector<float> y(64, 1.f);
  DequantizeRowQ8_0(b.data(), y.data(), 64);
  for (float v : y) EXPECT_EQ(v, 0.f);
}

TEST(Q8_0Test, DequantizeKnownValues) {
  BlockQ8_0 b;
  b.d = 0x3800;                                                             // 0.5
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);  // -128 ... 120
  float y[32];
  DequantizeRowQ8_0(&b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j * 8 - 128)) << j;
}

TEST(Q8_0Test, RandomRoundTripWithinHalfStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  // Block scales stay within f16's normal range (amax from ~2^-6 to ~2^15), where the stored
  // scale has a relative error of at most 2^-11.
  std::uniform_real_distribution<float> log_scale(-4.f, 12.f);
  const int kBlocks = 2000;
  std::vector<float> x(kBlocks * 32);
  for (int b = 0; b < kBlocks; ++b) {
    const float s = std::exp2(log_scale(rng));
    for (int j = 0; j < 32; ++j) x[b * 32 + j] = s * normal(rng);
  }
  std::vector<BlockQ8_0> q(kBlocks);
  QuantizeRowQ8_0(x.data(), q.data(), x.size());
  std::vector<float> y(x.size());
  DequantizeRowQ8_0(q.data(), y.data(), x.size());
  for (int b = 0; b < kBlocks; ++b) {
    double amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double{x[b * 32 + j]}));
    const double d = amax / 127;
    const double d16 = HalfValue(q[b].d);
    ASSERT_LE(std::fabs(d16 - d), d * std::ldexp(1.0, -11) * 1.0001) << "block " << b;
    for (int j = 0; j < 32; ++j) {
      const int i = b * 32 + j;
      ASSERT_LE(std::abs(q[b].qs[j]), 127);
      // With the f32 scale the rounding error is at most half a step ...
      ASSERT_LE(std::fabs(x[i] - d * q[b].qs[j]), d / 2 * (1 + 1e-5)) << "i=" << i;
      // ... and the stored f16 scale adds at most |q| * |d16 - d|.
      ASSERT_LE(std::fabs(x[i] - double{y[i]}),
                d / 2 * (1 + 1e-5) + std::abs(q[b].qs[j]) * std::fabs(d16 - d) + 1e-45)
          << "i=" << i;
    }
  }
}

TEST(HalfRowsTest, F16ExhaustiveAgainstDefinition) {
  std::vector<uint16_t> h(65536);
  for (int i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  F16ToF32Row(h.data(), f.data(), 65536);
  std::vector<uint16_t> back(65536);
  F32ToF16Row(f.data(), back.data(), 65536);
  for (int i = 0; i < 65536; ++i) {
    const double want = HalfValue(h[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f[i])) << i;
      EXPECT_EQ(back[i] & 0x7c00, 0x7c00) << i;
      EXPECT_NE(back[i] & 0x3ff, 0) << i;
      continue;
    }
    ASSERT_EQ(double{f[i]}, want) << "h=" << i;
    ASSERT_EQ(std::signbit(f[i]), (i & 0x8000) != 0) << i;
    ASSERT_EQ(back[i], h[i]) << "h=" << i;
  }
}

TEST(HalfRowsTest, Bf16ExhaustiveAgainstDefinition) {
  std::vector<uint16_t> h(65536);
  for (int i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  Bf16ToF32Row(h.data(), f.data(), 65536);
  std::vector<uint16_t> back(65536);
  F32ToBf16Row(f.data(), back.data(), 65536);
  for (int i = 0; i < 65536; ++i) {
    const double want = Bf16Value(h[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f[i])) << i;
      EXPECT_TRUE(std::isnan(Bf16Value(back[i]))) << i;
      continue;
    }
    ASSERT_EQ(double{f[i]}, want) << "b=" << i;
    ASSERT_EQ(back[i], h[i]) << "b=" << i;
  }
}

// Narrowing picks the nearest representable value, ties to the even bit pattern.
template <typename ValueFn>
void ExpectNearestEven(float x, uint16_t got, ValueFn value, const char* what) {
  const double v = value(got);
  ASSERT_FALSE(std::isnan(v)) << what << " x=" << x;
  const double err = std::fabs(v - double{x});
  for (int delta : {-1, 1}) {
    const uint16_t nb = static_cast<uint16_t>(got + delta);
    const double w = value(nb);
    if (std::isnan(w) || ((nb ^ got) & 0x8000)) continue;  // crossed into NaN or the sign bit
    const double nerr = std::fabs(w - double{x});
    if (std::isinf(v)) continue;  // overflow cases are checked separately
    ASSERT_LE(err, nerr) << what << " x=" << x << " got=" << got;
    if (err == nerr) {
      ASSERT_EQ(got & 1, 0) << what << " tie not to even, x=" << x;
    }
  }
}

TEST(HalfRowsTest, NarrowingRoundsToNearestEven) {
  std::mt19937 rng(11);
  std::vector<float> x;
  std::uniform_int_distribution<uint32_t> bits;
  // Random values within f16 range (including subnormals) and exact ties.
  for (int i = 0; i < 200000; ++i) {
    const float f = std::ldexp(static_cast<float>(bits(rng) % 2000000) / 1e6f - 1.f,
                               static_cast<int>(bits(rng) % 40) - 24);
    x.push_back(f);
  }
  for (int h = 0; h < 0x7bff; h += 7) {
    x.push_back(static_cast<float>((HalfValue(h) + HalfValue(h + 1)) / 2));  // tie
    x.push_back(-static_cast<float>((HalfValue(h) + HalfValue(h + 1)) / 2));
  }
  std::vector<uint16_t> y(x.size());
  F32ToF16Row(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ExpectNearestEven(x[i], y[i], HalfValue, "f16");

  // BF16 over random bit patterns (finite).
  std::vector<float> xb;
  for (int i = 0; i < 200000; ++i) {
    const float f = Fp32FromBits(bits(rng));
    if (std::isfinite(f) && std::fabs(f) < 3.38e38f) xb.push_back(f);
  }
  for (uint32_t b = 0; b < 0x7f7f; b += 13) xb.push_back(Fp32FromBits((b << 16) | 0x8000u));  // tie
  std::vector<uint16_t> yb(xb.size());
  F32ToBf16Row(xb.data(), yb.data(), xb.size());
  for (size_t i = 0; i < xb.size(); ++i) ExpectNearestEven(xb[i], yb[i], Bf16Value, "bf16");
}

TEST(HalfRowsTest, F16OverflowAndSpecials) {
  const float x[] = {65504.f,
                     65519.f,
                     65520.f,
                     1e10f,
                     -1e10f,
                     INFINITY,
                     -INFINITY,
                     NAN,
                     std::ldexp(1.f, -25),
                     std::ldexp(1.5f, -25),
                     std::ldexp(1.f, -26)};
  const uint16_t want[] = {0x7bff, 0x7bff, 0x7c00, 0x7c00, 0xfc00, 0x7c00,
                           0xfc00, 0,      0x0000, 0x0001, 0x0000};
  uint16_t y[11];
  F32ToF16Row(x, y, 11);
  for (int i = 0; i < 11; ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(HalfValue(y[i])));
    } else {
      EXPECT_EQ(y[i], want[i]) << "x=" << x[i];
    }
  }
}

}  // namespace
}  // namespace pd::engine
