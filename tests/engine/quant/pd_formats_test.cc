// pdserve's own weight formats W8A8 and W4A16 (engine/quant/w8a8.h, w4a16.h): traits and type
// numbers, pack/unpack round trips over more than a million random codes per width, quantizer
// error bounds, grids (GPTQ's per-weight access), and the SmoothQuant factors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "engine/quant/block_grid.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/w4a16.h"
#include "engine/quant/w8a8.h"

namespace pd::engine {
namespace {

TEST(PdFormatsTest, TraitsAndTypeNumbers) {
  EXPECT_EQ(static_cast<uint32_t>(DType::kW8A8), 0x50440001u);
  EXPECT_EQ(static_cast<uint32_t>(DType::kW4A16), 0x50440002u);
  // Both fit in a signed 32-bit enum (ggml reads the field as one) and are far above ggml's.
  EXPECT_LT(static_cast<uint32_t>(DType::kW4A16), 0x80000000u);
  EXPECT_EQ(DTypeFromGgml(0x50440001u), DType::kW8A8);
  EXPECT_EQ(DTypeFromGgml(0x50440002u), DType::kW4A16);
  EXPECT_EQ(DTypeFromGgml(0x50440003u), std::nullopt);
  EXPECT_EQ(RawGgmlTypeName(0x50440001u), "w8a8");
  EXPECT_EQ(RawGgmlTypeName(0x50440002u), "w4a16");
  EXPECT_EQ(Traits(DType::kW8A8).name, "w8a8");
  EXPECT_EQ(Traits(DType::kW4A16).name, "w4a16");
  EXPECT_EQ(RowBytes(DType::kW8A8, 4096), 4112u);  // 16-byte header + 1 byte per weight
  EXPECT_EQ(RowBytes(DType::kW8A8, 4096) % 16, 0u);
  EXPECT_EQ(W8A8RowBytes(96), RowBytes(DType::kW8A8, 96));
  EXPECT_EQ(RowBytes(DType::kW4A16, 4096), 32u * 66u);  // 4.125 bits per weight
  EXPECT_EQ(Traits(DType::kW4A16).block_size, 128);
  // ggml types have no row header.
  EXPECT_EQ(RowBytes(DType::kQ8_0, 64), 68u);
}

// 1,024,000 random codes in [-127, 127] written with PackRowW8A8 and read back exactly, with the
// scale; the header's padding is zero.
TEST(PdFormatsTest, W8A8PackUnpackRoundTripOverAMillionCodes) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> scale(-2.f, 2.f);
  constexpr int64_t kCols = 1024, kRows = 1000;
  std::vector<int8_t> q(kCols), back(kCols);
  std::vector<uint8_t> row(W8A8RowBytes(kCols));
  std::vector<float> deq(kCols);
  int64_t checked = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kCols; ++j) q[j] = static_cast<int8_t>(code(rng));
    const float d = scale(rng);
    PackRowW8A8(d, q.data(), row.data(), kCols);
    ASSERT_EQ(W8A8RowScale(row.data()), d);
    for (size_t b = 4; b < kW8A8HeaderBytes; ++b) ASSERT_EQ(row[b], 0);
    std::memcpy(back.data(), W8A8RowCodes(row.data()), kCols);
    ASSERT_EQ(back, q) << "row " << r;
    DequantizeRow(DType::kW8A8, row.data(), deq.data(), kCols);
    for (int64_t j = 0; j < kCols; ++j) ASSERT_EQ(deq[j], d * static_cast<float>(q[j]));
    checked += kCols;
  }
  EXPECT_GE(checked, 1000000);
}

// Quantizing a dequantized row that uses the full range reproduces its codes exactly and its
// scale to within rounding (d' = (127 d) / 127); on random data every weight is within d / 2.
TEST(PdFormatsTest, W8A8QuantizerIsIdempotentAndWithinHalfAStep) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> code(-127, 127);
  std::normal_distribution<float> normal(0.f, 1.f);
  constexpr int64_t kCols = 2048;
  std::vector<int8_t> q(kCols);
  std::vector<uint8_t> row(W8A8RowBytes(kCols)), again(row.size());
  std::vector<float> x(kCols), deq(kCols);
  for (int r = 0; r < 200; ++r) {
    for (int64_t j = 0; j < kCols; ++j) q[j] = static_cast<int8_t>(code(rng));
    q[r % kCols] = r % 2 ? 127 : -127;
    const float d = std::exp(normal(rng));
    PackRowW8A8(d, q.data(), row.data(), kCols);
    DequantizeRowW8A8(row.data(), deq.data(), kCols);
    QuantizeRowW8A8(deq.data(), again.data(), kCols);
    ASSERT_EQ(std::memcmp(W8A8RowCodes(again.data()), q.data(), kCols), 0) << "row " << r;
    EXPECT_NEAR(W8A8RowScale(again.data()), d, d * 2e-7f);
  }
  for (int r = 0; r < 50; ++r) {
    for (int64_t j = 0; j < kCols; ++j) x[j] = normal(rng) * (j % 97 == 0 ? 40.f : 1.f);
    QuantizeRowW8A8(x.data(), row.data(), kCols);
    DequantizeRowW8A8(row.data(), deq.data(), kCols);
    const float d = W8A8RowScale(row.data());
    float amax = 0.f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(d, amax / 127.f);
    for (int64_t j = 0; j < kCols; ++j) {
      ASSERT_LE(std::fabs(x[j] - deq[j]), 0.5f * d * (1.f + 1e-5f)) << j;
      ASSERT_GE(W8A8RowCodes(row.data())[j], -127);
    }
  }
  // An all-zero row: d = 0, codes 0.
  std::fill(x.begin(), x.end(), 0.f);
  QuantizeRowW8A8(x.data(), row.data(), kCols);
  EXPECT_EQ(W8A8RowScale(row.data()), 0.f);
  for (int64_t j = 0; j < kCols; ++j) ASSERT_EQ(W8A8RowCodes(row.data())[j], 0);
}

TEST(PdFormatsTest, W8A8DotIsTheExactIntegerSumTimesBothScales) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> code(-127, 127);
  for (int64_t n : {32, 96, 4096}) {
    std::vector<int8_t> a(n), b(n);
    int64_t isum = 0;
    for (int64_t j = 0; j < n; ++j) {
      a[j] = static_cast<int8_t>(code(rng));
      b[j] = static_cast<int8_t>(code(rng));
      isum += a[j] * b[j];
    }
    std::vector<uint8_t> wa(W8A8RowBytes(n)), xb(W8A8RowBytes(n));
    PackRowW8A8(0.25f, a.data(), wa.data(), n);
    PackRowW8A8(-3.f, b.data(), xb.data(), n);
    EXPECT_EQ(DotW8A8(wa.data(), xb.data(), n), -0.75f * static_cast<float>(isum)) << n;
  }
}

// 1,000,064 random levels in [-8, 7] (7813 blocks): PackW4A16 / UnpackW4A16, GetCode / SetCode
// and DequantizeRow all agree on the nibble order.
TEST(PdFormatsTest, W4A16PackUnpackRoundTripOverAMillionCodes) {
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> level(-8, 7);
  std::uniform_real_distribution<float> scale(-4.f, 4.f);
  constexpr int kBlocks = 7813;
  int8_t q[128], back[128];
  float deq[128];
  int64_t checked = 0;
  for (int b = 0; b < kBlocks; ++b) {
    for (int j = 0; j < 128; ++j) q[j] = static_cast<int8_t>(level(rng));
    BlockW4A16 blk;
    const uint16_t d = F32ToF16(scale(rng));
    PackW4A16(d, q, &blk);
    // The documented layout, byte by byte.
    for (int j = 0; j < 64; ++j) {
      ASSERT_EQ(blk.qs[j] & 15, q[j] + 8);
      ASSERT_EQ(blk.qs[j] >> 4, q[j + 64] + 8);
    }
    UnpackW4A16(blk, back);
    ASSERT_EQ(std::memcmp(back, q, 128), 0) << "block " << b;
    DequantizeRow(DType::kW4A16, &blk, deq, 128);
    BlockW4A16 via_set;
    via_set.d = d;
    std::memset(via_set.qs, 0xff, sizeof(via_set.qs));
    for (int j = 0; j < 128; ++j) {
      ASSERT_EQ(GetCode(DType::kW4A16, &blk, j), q[j]);
      ASSERT_EQ(deq[j], static_cast<float>(q[j]) * F16ToF32(d));
      SetCode(DType::kW4A16, &via_set, (j * 37) % 128, q[(j * 37) % 128]);
    }
    ASSERT_EQ(std::memcmp(&via_set, &blk, sizeof(blk)), 0) << "block " << b;
    checked += 128;
  }
  EXPECT_GE(checked, 1000000);
}

// The grid reproduces the dequantizer bit for bit, and quantizing a dequantized block with a
// positive scale whose levels include -8 gives back the same bytes (the search's candidate
// max|x| / 8 reproduces the scale exactly and has zero error).
TEST(PdFormatsTest, W4A16GridAndIdempotence) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(-8, 7);
  std::uniform_real_distribution<float> scale(0.01f, 2.f);
  for (int b = 0; b < 2000; ++b) {
    int8_t q[128];
    for (int j = 0; j < 128; ++j) q[j] = static_cast<int8_t>(level(rng));
    q[b % 128] = -8;
    BlockW4A16 blk, again;
    PackW4A16(F32ToF16(scale(rng)), q, &blk);
    float deq[128];
    DequantizeRowW4A16(&blk, deq, 128);
    BlockGrid g;
    ReadGrid(DType::kW4A16, &blk, &g);
    ASSERT_EQ(g.n, 128);
    for (int j = 0; j < 128; ++j) {
      ASSERT_EQ(g.Level(j, q[j]), deq[j]);
      ASSERT_EQ(g.Nearest(j, deq[j]), q[j]);
    }
    QuantizeRowW4A16(deq, &again, 128, nullptr);
    ASSERT_EQ(std::memcmp(&again, &blk, sizeof(blk)), 0) << "block " << b;
  }
}

// The scale search never does worse than the plain rule d = max|x| / 7 (one of its candidates),
// weighted or not, and beats it on average (by ~20 % in squared error on Gaussian weights); every
// weight inside the grid's range is within d / 2.
TEST(PdFormatsTest, W4A16SearchBeatsPlainRounding) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  constexpr int kN = 128 * 64;
  std::vector<float> x(kN), imp(kN), deq(kN);
  for (int i = 0; i < kN; ++i) x[i] = normal(rng), imp[i] = uni(rng);
  std::vector<BlockW4A16> out(kN / 128);
  double total_search = 0, total_plain = 0;
  const std::vector<const float*> weightings = {nullptr, imp.data()};
  for (const float* importance : weightings) {
    QuantizeRowW4A16(x.data(), out.data(), kN, importance);
    DequantizeRowW4A16(out.data(), deq.data(), kN);
    for (int b = 0; b < kN / 128; ++b) {
      float amax = 0.f;
      for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(x[b * 128 + j]));
      const float d_plain = F16ToF32(F32ToF16(amax / 7.f));
      const float d = std::fabs(F16ToF32(out[b].d));
      double e_search = 0, e_plain = 0;
      for (int j = 0; j < 128; ++j) {
        const int i = b * 128 + j;
        const float w = importance ? importance[i] : 1.f;
        const float qp = std::clamp(std::nearbyint(x[i] / d_plain), -8.f, 7.f);
        e_plain += w * std::pow(double{x[i]} - double{qp * d_plain}, 2);
        e_search += w * std::pow(double{x[i]} - double{deq[i]}, 2);
        if (std::fabs(x[i]) <= 7.f * d) {
          ASSERT_LE(std::fabs(x[i] - deq[i]), 0.5f * d * 1.0001f);
        }
      }
      ASSERT_LE(e_search, e_plain * (1 + 1e-9)) << "block " << b;
      total_search += e_search, total_plain += e_plain;
    }
  }
  std::printf("W4A16 squared error of the search / plain max/7 rounding: %.4f\n",
              total_search / total_plain);
  EXPECT_LT(total_search, 0.85 * total_plain);  // measured 0.79
}

TEST(PdFormatsTest, SmoothingFactors) {
  const std::vector<float> act = {4.f, 0.f, 1.f, 9.f, 100.f};
  const std::vector<float> w = {1.f, 2.f, 0.f, 4.f, 0.01f};
  const std::vector<float> s = SmoothingFactors(act, w, 0.5f);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_FLOAT_EQ(s[0], 2.f);    // sqrt(4) / sqrt(1)
  EXPECT_FLOAT_EQ(s[1], 1.f);    // channel never active
  EXPECT_FLOAT_EQ(s[2], 1.f);    // weights all zero
  EXPECT_FLOAT_EQ(s[3], 1.5f);   // 3 / 2
  EXPECT_FLOAT_EQ(s[4], 100.f);  // 10 / 0.1
  // alpha = 1: s = max|X| (activations become +-1 at most); alpha = 0: s = 1 / max|W|.
  EXPECT_FLOAT_EQ(SmoothingFactors(act, w, 1.f)[3], 9.f);
  EXPECT_FLOAT_EQ(SmoothingFactors(act, w, 0.f)[3], 0.25f);
}

}  // namespace
}  // namespace pd::engine
