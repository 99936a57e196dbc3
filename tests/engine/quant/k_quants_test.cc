// Q4_0 and the k-quants (engine/quant/k_quants.h): layouts, hand-built blocks with known bits,
// bit-exact dequantization against llama.cpp / the gguf package (testdata/kquants, written by
// scripts/make_kquant_reference.py; run from the repository root), and round trips of over a
// million random values per type through our quantizers.
//
// Round-trip bounds checked per type (measured values are printed by RoundTrip):
//  - Nearest level: every stored weight is the level of its sub-block's stored grid nearest to
//    the input (ties either way), except the weights the quantizer pins (k_quants_quantize.cc):
//    the smallest weight of a sub-block with a nonzero min (code 0), the super-block's extreme
//    weight in its pinned sub-block (code qmin or qmax). Those stay within the bound below.
//  - Error bound: |x - x^| <= 2 h (1 + 2^-10) + c 2^-24 for every weight, where h is the
//    super-block's natural step: amax / |qmin| for the symmetric types (Q4_0, per 32 weights:
//    amax / 8; Q3_K: amax / 4; Q6_K: amax / 32) and (max(x_max, 0) - min(x_min, 0)) / qmax for
//    the types with mins (Q2_K: / 3; Q4_K: / 15; Q5_K: / 31). The quantizers never clip a weight
//    by more than two steps of its grid (kMaxClipSteps), and no grid step exceeds h but for f16
//    rounding of the super-scale; c 2^-24 covers that rounding where the super-scale is an f16
//    subnormal (tiny blocks), c being the pinned weight's factor |qmin * scmin| (Q3_K 128,
//    Q6_K 4096) or scmax * qmax (Q2_K 45, Q4_K 945, Q5_K 1953), 8 for Q4_0.
//    Q8_K: |x - x^| <= (1/2 + 2^-16) h with h = amax / 127 (plain rounding; f32 scale).
//    Measured maxima (printed): Q4_0 1.19 h, Q2_K 0.85 h, Q3_K 1.27 h, Q4_K 1.01 h,
//    Q5_K 1.37 h, Q6_K 3.4 h (a constant block of 1e-3, whose d is a 5-unit f16 subnormal: the
//    c 2^-24 term), Q8_K 0.5 h.
//  - Idempotence: quantizing the dequantized values again reproduces the same values for every
//    type (Q4_0 may flip the sign of d, storing 0 as -0; the k-quants with mins may pick another
//    encoding of the same values); Q8_K reproduces its codes (or all of them negated with d) and
//    d within a few ulps, as its f32 scale 1 / (-127 / m) is not exactly recoverable.
#include "engine/quant/k_quants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/q8_0.h"

namespace pd::engine {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- Layouts -------------------------------------------------------------------------------

TEST(KQuantsLayoutTest, SizesAndOffsetsMatchGgml) {
  EXPECT_EQ(offsetof(BlockQ4_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ2_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ2_K, d), 80u);
  EXPECT_EQ(offsetof(BlockQ2_K, dmin), 82u);
  EXPECT_EQ(offsetof(BlockQ3_K, qs), 32u);
  EXPECT_EQ(offsetof(BlockQ3_K, scales), 96u);
  EXPECT_EQ(offsetof(BlockQ3_K, d), 108u);
  EXPECT_EQ(offsetof(BlockQ4_K, dmin), 2u);
  EXPECT_EQ(offsetof(BlockQ4_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ4_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qh), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
  EXPECT_EQ(offsetof(BlockQ6_K, qh), 128u);
  EXPECT_EQ(offsetof(BlockQ6_K, scales), 192u);
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
  EXPECT_EQ(offsetof(BlockQ8_K, qs), 4u);
  EXPECT_EQ(offsetof(BlockQ8_K, bsums), 260u);

  struct Want {
    DType t;
    uint32_t ggml;
    const char* name;
    int block;
    size_t bytes;
    double bpw;
  };
  const Want want[] = {
      {DType::kQ4_0, 2, "q4_0", 32, sizeof(BlockQ4_0), 4.5},
      {DType::kQ2_K, 10, "q2_K", 256, sizeof(BlockQ2_K), 2.625},
      {DType::kQ3_K, 11, "q3_K", 256, sizeof(BlockQ3_K), 3.4375},
      {DType::kQ4_K, 12, "q4_K", 256, sizeof(BlockQ4_K), 4.5},
      {DType::kQ5_K, 13, "q5_K", 256, sizeof(BlockQ5_K), 5.5},
      {DType::kQ6_K, 14, "q6_K", 256, sizeof(BlockQ6_K), 6.5625},
      {DType::kQ8_K, 15, "q8_K", 256, sizeof(BlockQ8_K), 9.125},
  };
  for (const Want& w : want) {
    SCOPED_TRACE(w.name);
    EXPECT_EQ(static_cast<uint32_t>(w.t), w.ggml);
    ASSERT_EQ(DTypeFromGgml(w.ggml), w.t);
    const DTypeTraits& tr = Traits(w.t);
    EXPECT_EQ(tr.name, w.name);
    EXPECT_EQ(tr.block_size, w.block);
    EXPECT_EQ(tr.block_bytes, w.bytes);
    EXPECT_EQ(8.0 * tr.block_bytes / tr.block_size, w.bpw);
    EXPECT_EQ(RawGgmlTypeName(w.ggml), w.name);
    EXPECT_EQ(RowBytes(w.t, 4096), 4096 / w.block * w.bytes);
  }
  EXPECT_FALSE(DTypeFromGgml(3).has_value());   // q4_1
  EXPECT_FALSE(DTypeFromGgml(7).has_value());   // q5_1
  EXPECT_FALSE(DTypeFromGgml(20).has_value());  // iq4_nl
}

// ---- Hand-built blocks ---------------------------------------------------------------------

// Dequantizes one block and checks every weight: `special` lists (weight, value) pairs, every
// other weight must equal default_value(weight).
template <typename Block>
void ExpectBlock(const Block& b, const std::vector<std::pair<int, float>>& special,
                 const std::function<float(int)>& default_value) {
  std::vector<float> y(Block::kWeights);
  DequantizeRow(&b, y.data(), Block::kWeights);
  std::vector<bool> seen(Block::kWeights, false);
  for (const auto& [w, v] : special) {
    EXPECT_EQ(y[w], v) << "weight " << w;
    seen[w] = true;
  }
  for (int w = 0; w < Block::kWeights; ++w) {
    if (!seen[w]) {
      EXPECT_EQ(y[w], default_value(w)) << "weight " << w;
    }
  }
}

TEST(KQuantsKnownBitsTest, Q4_0) {
  BlockQ4_0 b{};
  b.d = 0x3c00;     // 1.0
  b.qs[0] = 0x1F;   // weight 0: code 15 -> 7; weight 16: code 1 -> -7
  b.qs[15] = 0x80;  // weight 15: code 0 -> -8; weight 31: code 8 -> 0
  ExpectBlock(b, {{0, 7.f}, {16, -7.f}, {15, -8.f}, {31, 0.f}}, [](int) { return -8.f; });
}

TEST(KQuantsKnownBitsTest, Q2_K) {
  BlockQ2_K b{};
  b.d = 0x3c00;         // 1.0
  b.dmin = 0x3800;      // 0.5
  b.scales[0] = 0x21;   // sub-block 0: scale 1, min 2 -> q - 1
  b.scales[2] = 0x12;   // sub-block 2: scale 2, min 1 -> 2q - 0.5
  b.scales[4] = 0x04;   // sub-block 4: scale 4, min 0 -> 4q
  b.scales[6] = 0x30;   // sub-block 6: scale 0, min 3 -> -1.5
  b.scales[15] = 0xF3;  // sub-block 15: scale 3, min 15 -> 3q - 7.5
  // qs[0] holds weights 0, 32, 64, 96 in bits 0-1, 2-3, 4-5, 6-7: codes 0, 1, 2, 3.
  b.qs[0] = 0xE4;
  // qs[63] = qs[32 + 31] holds weights 159, 191, 223, 255: codes 0, 0, 0, 3.
  b.qs[63] = 0xC0;
  auto def = [](int w) {
    switch (w / 16) {
      case 0:
        return -1.f;
      case 2:
        return -0.5f;
      case 6:
        return -1.5f;
      case 15:
        return -7.5f;
      default:
        return 0.f;
    }
  };
  ExpectBlock(b, {{0, -1.f}, {32, 1.5f}, {64, 8.f}, {96, -1.5f}, {255, 1.5f}}, def);
}

TEST(KQuantsKnownBitsTest, Q3_K) {
  BlockQ3_K b{};
  b.d = 0x3800;  // 0.5
  // Scale values u_i (signed scale u_i - 32): u_0 = 33 (+1), u_8 = 63 (+31), u_15 = 0 (-32),
  // all others 32 (0). Low nibbles: u_0 in scales[0] low, u_8 in scales[0] high; high 2 bits
  // (2 = 0b10 for u = 32) of u_i at bits 2(i/4) of scales[8 + i % 4].
  const uint8_t scales[12] = {0xF1, 0, 0, 0, 0, 0, 0, 0, 0xBA, 0xAA, 0xAA, 0x2A};
  std::memcpy(b.scales, scales, 12);
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(GetScaleQ3K(i, b.scales), i == 0 ? 33 : i == 8 ? 63 : i == 15 ? 0 : 32) << i;
  }
  b.qs[0] = 0x03;         // weight 0: low bits 3
  b.hmask[0] = 0x01;      // weight 0: high bit set -> q = 3
  b.qs[32] = 0x02;        // weight 128 (h = 1, k = 0, l = 0): low bits 2, high bit clear -> q = -2
  b.qs[63] = 0x40;        // weight 255 (h = 1, k = 3, l = 31): low bits 1 ...
  b.hmask[31] = 0x80;     // ... high bit (bit 255 / 32 = 7 of hmask[31]) set -> q = 1
  auto def = [](int w) {  // every other weight: low bits 0, high bit clear -> q = -4
    switch (w / 16) {
      case 0:
        return 0.5f * 1 * -4;
      case 8:
        return 0.5f * 31 * -4;
      case 15:
        return 0.5f * -32 * -4;
      default:
        return 0.f;
    }
  };
  ExpectBlock(b, {{0, 1.5f}, {128, -31.f}, {255, -16.f}}, def);
}

// Scales sc_0 = 1, m_0 = 2, sc_5 = 35, m_5 = 50, all others 0, packed by hand:
// s[0] = sc_0; s[4] = m_0; s[1] = high bits of sc_5 (35 >> 4 = 2) << 6; s[5] = (50 >> 4 = 3) << 6;
// s[9] = (35 & 15) | (50 & 15) << 4.
constexpr uint8_t kK4Scales[12] = {0x01, 0x80, 0, 0, 0x02, 0xC0, 0, 0, 0, 0x23, 0, 0};

TEST(KQuantsKnownBitsTest, Q4_KScalePacking) {
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    GetScaleMinK4(j, kK4Scales, &sc, &m);
    EXPECT_EQ(sc, j == 0 ? 1 : j == 5 ? 35 : 0) << j;
    EXPECT_EQ(m, j == 0 ? 2 : j == 5 ? 50 : 0) << j;
  }
}

TEST(KQuantsKnownBitsTest, Q4_K) {
  BlockQ4_K b{};
  b.d = 0x3c00;     // 1.0
  b.dmin = 0x3c00;  // 1.0
  std::memcpy(b.scales, kK4Scales, 12);
  b.qs[0] = 0x07;   // weight 0 (sub-block 0): 7; weight 32 (sub-block 1, high nibble): 0
  b.qs[65] = 0xA0;  // weight 161 = 64 * 2 + 32 + 1 (sub-block 5, high nibble): 10
  auto def = [](int w) { return w / 32 == 0 ? -2.f : w / 32 == 5 ? -50.f : 0.f; };
  ExpectBlock(b, {{0, 5.f}, {161, 300.f}}, def);
}

TEST(KQuantsKnownBitsTest, Q5_K) {
  BlockQ5_K b{};
  b.d = 0x3c00;
  b.dmin = 0x3c00;
  std::memcpy(b.scales, kK4Scales, 12);
  b.qs[0] = 0x07;
  b.qs[65] = 0xA0;
  b.qh[0] = 0x01;  // bit 0 of qh[0]: fifth bit of weight 0 -> 7 + 16
  b.qh[1] = 0x20;  // bit 5 of qh[1]: fifth bit of weight 161 -> 10 + 16
  b.qh[2] = 0x02;  // bit 1 of qh[2]: weight 34 (sub-block 1, scale 0, min 0) -> 0
  auto def = [](int w) { return w / 32 == 0 ? -2.f : w / 32 == 5 ? -50.f : 0.f; };
  ExpectBlock(b, {{0, 21.f}, {161, 35.f * 26 - 50}, {34, 0.f}}, def);
}

TEST(KQuantsKnownBitsTest, Q6_K) {
  BlockQ6_K b{};
  b.d = 0x3400;  // 0.25
  b.scales[0] = 2;
  b.scales[6] = 1;
  b.scales[9] = 100;
  b.scales[15] = -3;
  b.ql[0] = 0x05;         // weight 0: low 5 ...
  b.qh[0] = 0x42;         // ... high 2 (bits 0-1) -> 37 - 32 = 5; weight 96: high 1 (bits 6-7)
  b.ql[32] = 0x30;        // weight 96 (h 0, k 3, l 0): high nibble 3 -> 3 | 1 << 4 = 19 -> -13
  b.ql[127] = 0xF0;       // weight 255 (h 1, k 3, l 31): high nibble 15 ...
  b.qh[63] = 0xC0;        // ... high 3 (bits 6-7 of qh[32 + 31]) -> 63 - 32 = 31
  b.ql[86] = 0x0C;        // weight 150 (h 1, k 0, l 22): low nibble 12 of ql[64 + 22] ...
  b.qh[54] = 0x01;        // ... high 1 (bits 0-1 of qh[32 + 22]) -> 28 - 32 = -4
  auto def = [](int w) {  // code 0 -> q = -32
    switch (w / 16) {
      case 0:
        return 0.25f * 2 * -32;
      case 6:
        return 0.25f * 1 * -32;
      case 9:
        return 0.25f * 100 * -32;
      case 15:
        return 0.25f * -3 * -32;
      default:
        return 0.f;
    }
  };
  ExpectBlock(b, {{0, 2.5f}, {96, -3.25f}, {255, -23.25f}, {150, -100.f}}, def);
}

TEST(KQuantsKnownBitsTest, Q8_K) {
  BlockQ8_K b{};
  b.d = 0.5f;
  for (int j = 0; j < 256; ++j) b.qs[j] = static_cast<int8_t>(j - 128);
  ExpectBlock(b, {}, [](int w) { return 0.5f * (w - 128); });
}

// ---- Bit-exact dequantization against llama.cpp / gguf ------------------------------------

constexpr int kRefInputWeights = 112 * 256;  // scripts/make_kquant_reference.py: N_INPUT
constexpr int kRefRandomWeights = 64 * 256;  // N_RANDOM

template <typename T>
std::vector<T> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path
                        << " (run from the repository root; regenerate with "
                           "scripts/make_kquant_reference.py)";
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  EXPECT_EQ(bytes.size() % sizeof(T), 0u) << path;
  return v;
}

std::string RefPath(DType t, const char* ext) {
  return std::string("testdata/kquants/") + std::string(Traits(t).name) + ext;
}

class KQuantsReferenceTest : public ::testing::TestWithParam<DType> {};

TEST_P(KQuantsReferenceTest, DequantizeIsBitExact) {
  const DType t = GetParam();
  const std::vector<uint8_t> raw = ReadFile<uint8_t>(RefPath(t, ".bin"));
  const std::vector<float> want = ReadFile<float>(RefPath(t, ".f32"));
  const int64_t n = kRefInputWeights + kRefRandomWeights;
  ASSERT_EQ(raw.size(), RowBytes(t, n));
  ASSERT_EQ(want.size(), static_cast<size_t>(n));
  std::vector<float> got(n);
  DequantizeRow(t, raw.data(), got.data(), n);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (Bits(got[i]) != Bits(want[i])) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << Traits(t).name << " weight " << i << " (block " << i / Traits(t).block_size
                      << "): got " << got[i] << ", want " << want[i];
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  RecordProperty("weights_compared", std::to_string(n));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KQuantsReferenceTest,
                         ::testing::Values(DType::kQ4_0, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
                                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K),
                         [](const auto& info) { return std::string(Traits(info.param).name); });

// Q8_K (activations) and Q8_0 quantize exactly as llama.cpp does.
TEST(KQuantsReferenceQuantizeTest, Q8_KAndQ8_0MatchLlamaCppBytes) {
  const std::vector<float> x = ReadFile<float>("testdata/kquants/input.f32");
  ASSERT_EQ(x.size(), static_cast<size_t>(kRefInputWeights));
  for (DType t : {DType::kQ8_K, DType::kQ8_0}) {
    SCOPED_TRACE(Traits(t).name);
    const std::vector<uint8_t> raw = ReadFile<uint8_t>(RefPath(t, ".bin"));
    std::vector<uint8_t> got(RowBytes(t, kRefInputWeights));
    QuantizeRow(t, x.data(), got.data(), kRefInputWeights);
    ASSERT_GE(raw.size(), got.size());
    const size_t bb = Traits(t).block_bytes;
    int bad = 0;
    for (size_t b = 0; b < got.size() / bb; ++b) {
      if (std::memcmp(got.data() + b * bb, raw.data() + b * bb, bb) != 0 && ++bad <= 5) {
        ADD_FAILURE() << "block " << b << " differs";
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// Our quantizers against llama.cpp's reference ones on the same input: squared error no worse
// than theirs by more than a few percent per type (ours is usually lower; both are printed).
TEST(KQuantsReferenceQuantizeTest, ErrorComparableToLlamaCpp) {
  const std::vector<float> x = ReadFile<float>("testdata/kquants/input.f32");
  ASSERT_EQ(x.size(), static_cast<size_t>(kRefInputWeights));
  for (DType t :
       {DType::kQ4_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(Traits(t).name);
    const std::vector<float> theirs = ReadFile<float>(RefPath(t, ".f32"));
    std::vector<uint8_t> q(RowBytes(t, kRefInputWeights));
    QuantizeRow(t, x.data(), q.data(), kRefInputWeights);
    std::vector<float> ours(kRefInputWeights);
    DequantizeRow(t, q.data(), ours.data(), kRefInputWeights);
    // Relative squared error summed per super-block, so that every block counts alike.
    double e_ours = 0, e_theirs = 0;
    int worse_blocks = 0;
    for (int b = 0; b < kRefInputWeights / 256; ++b) {
      double ss = 0, eo = 0, et = 0;
      for (int j = b * 256; j < (b + 1) * 256; ++j) {
        ss += double{x[j]} * x[j];
        eo += (double{x[j]} - ours[j]) * (double{x[j]} - ours[j]);
        et += (double{x[j]} - theirs[j]) * (double{x[j]} - theirs[j]);
      }
      if (ss == 0) continue;
      e_ours += eo / ss;
      e_theirs += et / ss;
      worse_blocks += eo > et * 1.25 + 1e-30;
    }
    std::printf(
        "%-5s mean relative squared error over %d super-blocks: ours %.4g, llama.cpp %.4g"
        " (ours worse by >25%% in %d blocks)\n",
        std::string(Traits(t).name).c_str(), kRefInputWeights / 256, e_ours / 112, e_theirs / 112,
        worse_blocks);
    EXPECT_LE(e_ours, e_theirs * 1.05);
  }
}

// ---- Random round trips --------------------------------------------------------------------

// The stored grid of weight w of a quantized row: x^ = dl * q - ml for q in [qmin, qmax],
// evaluated in the dequantizer's order.
struct Grid {
  float dl = 0, ml = 0;
  int qmin = 0, qmax = 0;
  float Level(int q) const { return dl * static_cast<float>(q) - ml; }
};

Grid GridAt(DType t, const uint8_t* row, int64_t w) {
  Grid g;
  const int64_t b = w / Traits(t).block_size;
  const int k = static_cast<int>(w % Traits(t).block_size);
  switch (t) {
    case DType::kQ4_0: {
      const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
      g.dl = F16ToF32(blk.d);
      g.qmin = -8, g.qmax = 7;
      break;
    }
    case DType::kQ2_K: {
      const auto& blk = reinterpret_cast<const BlockQ2_K*>(row)[b];
      g.dl = F16ToF32(blk.d) * static_cast<float>(blk.scales[k / 16] & 15);
      g.ml = F16ToF32(blk.dmin) * static_cast<float>(blk.scales[k / 16] >> 4);
      g.qmin = 0, g.qmax = 3;
      break;
    }
    case DType::kQ3_K: {
      const auto& blk = reinterpret_cast<const BlockQ3_K*>(row)[b];
      g.dl = F16ToF32(blk.d) * static_cast<float>(GetScaleQ3K(k / 16, blk.scales) - 32);
      g.qmin = -4, g.qmax = 3;
      break;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const uint8_t* p = row + b * Traits(t).block_bytes;
      uint16_t d, dmin;
      std::memcpy(&d, p, 2);
      std::memcpy(&dmin, p + 2, 2);
      int sc, m;
      GetScaleMinK4(k / 32, p + 4, &sc, &m);
      g.dl = F16ToF32(d) * static_cast<float>(sc);
      g.ml = F16ToF32(dmin) * static_cast<float>(m);
      g.qmin = 0, g.qmax = t == DType::kQ4_K ? 15 : 31;
      break;
    }
    case DType::kQ6_K: {
      const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[b];
      g.dl = F16ToF32(blk.d) * static_cast<float>(blk.scales[k / 16]);
      g.qmin = -32, g.qmax = 31;
      break;
    }
    case DType::kQ8_K: {
      g.dl = reinterpret_cast<const BlockQ8_K*>(row)[b].d;
      g.qmin = -128, g.qmax = 127;
      break;
    }
    default:
      ADD_FAILURE() << "no grid for " << Traits(t).name;
  }
  return g;
}

float MaxAbs(const float* x, int n) {
  float m = 0;
  for (int j = 0; j < n; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}

bool HasMins(DType t) { return t == DType::kQ2_K || t == DType::kQ4_K || t == DType::kQ5_K; }
int SubBlock(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
      return 32;
    case DType::kQ8_K:
      return 256;
    default:
      return 16;
  }
}

// Natural step h of a super-block (see the file comment).
double NaturalStep(DType t, const float* x, int n) {
  double lo = 0, hi = 0, amax = 0;
  for (int j = 0; j < n; ++j) {
    lo = std::min(lo, double{x[j]});
    hi = std::max(hi, double{x[j]});
    amax = std::max(amax, std::fabs(double{x[j]}));
  }
  switch (t) {
    case DType::kQ4_0:
      return amax / 8;
    case DType::kQ3_K:
      return amax / 4;
    case DType::kQ6_K:
      return amax / 32;
    case DType::kQ8_K:
      return amax / 127;
    case DType::kQ2_K:
      return (hi - lo) / 3;
    case DType::kQ4_K:
      return (hi - lo) / 15;
    case DType::kQ5_K:
      return (hi - lo) / 31;
    default:
      return 0;
  }
}

// Over a million values: per super-block a distribution and a scale, plus degenerate blocks.
std::vector<float> RandomRows(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::exponential_distribution<float> expo(1.f);
  std::uniform_real_distribution<float> log_scale(-3.f, 2.f);
  std::vector<float> x;
  const int kBlocks = 4096 + 64;  // 1,064,960 values
  for (int b = 0; b < kBlocks; ++b) {
    const float s = std::pow(10.f, log_scale(rng));
    float v[256];
    switch (b % 8) {
      case 0:
      case 1:  // gaussian weights
        for (float& f : v) f = s * normal(rng);
        break;
      case 2:  // uniform
        for (float& f : v) f = s * uni(rng);
        break;
      case 3:  // laplace with 1% outliers 30x
        for (float& f : v) {
          f = s * expo(rng) * (uni(rng) < 0 ? -1.f : 1.f);
          if (uni(rng) > 0.98f) f *= 30.f;
        }
        break;
      case 4:  // sub-blocks of 16 at scales spanning three decades
        for (int i = 0; i < 16; ++i) {
          const float si = s * std::pow(10.f, -3.f * (uni(rng) + 1.f) / 2.f);
          for (int j = 0; j < 16; ++j) v[i * 16 + j] = si * normal(rng);
        }
        break;
      case 5:  // offset gaussian: all or mostly one sign
        for (float& f : v) f = s * (normal(rng) * 0.2f + (b % 16 < 8 ? 1.f : -1.f));
        break;
      case 6:  // few distinct values (idempotence-prone structure)
        for (float& f : v) f = s * static_cast<float>(static_cast<int>(uni(rng) * 3.f));
        break;
      default:  // degenerate blocks, in turn
        std::fill(v, v + 256, 0.f);
        switch ((b / 8) % 6) {
          case 0:
            break;  // all zero
          case 1:
            std::fill(v, v + 256, s);
            break;
          case 2:
            std::fill(v, v + 256, -s);
            break;
          case 3:
            v[b % 256] = s;
            break;  // one-hot
          case 4:
            for (int j = 0; j < 256; ++j) v[j] = s * (j % 32 == 0 ? 1.f : 0.f);
            break;
          default:
            for (float& f : v) f = s * normal(rng);
            std::fill(v, v + 128, 0.f);
        }
    }
    x.insert(x.end(), v, v + 256);
  }
  return x;
}

struct RoundTripParam {
  DType type;
  double steps;  // |x - x^| <= steps * h + pin_factor * 2^-24 (see the file comment)
  double pin_factor;
};

class KQuantsRoundTripTest : public ::testing::TestWithParam<RoundTripParam> {};

TEST_P(KQuantsRoundTripTest, ErrorBoundedAndIdempotent) {
  const DType t = GetParam().type;
  const std::vector<float> x = RandomRows(11 + static_cast<uint32_t>(t));
  const int64_t n = static_cast<int64_t>(x.size());
  ASSERT_GE(n, 1000000);
  const int bs = Traits(t).block_size;
  std::vector<uint8_t> q(RowBytes(t, n));
  QuantizeRow(t, x.data(), q.data(), n);
  std::vector<float> y(n);
  DequantizeRow(t, q.data(), y.data(), n);

  // Nearest level and the bound per super-block of 256 (Q4_0: per block of 32).
  const int hblock = t == DType::kQ4_0 ? 32 : 256;
  const int sub = SubBlock(t);
  double worst_ratio = 0, sq_err = 0, sq_x = 0;
  int64_t not_nearest = 0, over_bound = 0, bad_levels = 0;
  for (int64_t b0 = 0; b0 < n; b0 += hblock) {
    const double h = NaturalStep(t, x.data() + b0, hblock);
    for (int64_t i = b0; i < b0 + hblock; ++i) {
      const double err = std::fabs(double{x[i]} - y[i]);
      sq_err += err * err;
      sq_x += double{x[i]} * x[i];
      if (h == 0) {
        ASSERT_EQ(y[i], 0.f) << "i=" << i;
        continue;
      }
      worst_ratio = std::max(worst_ratio, err / h);
      const double bound = GetParam().steps * h + GetParam().pin_factor * std::ldexp(1.0, -24);
      if (err > bound && ++over_bound <= 3) {
        ADD_FAILURE() << Traits(t).name << " weight " << i << " = " << x[i] << " stored as " << y[i]
                      << ": error " << err / h << " h";
      }
      // The nearest level of the stored grid.
      const Grid g = GridAt(t, q.data(), i);
      double nearest = INFINITY;
      for (int l = g.qmin; l <= g.qmax; ++l) {
        nearest = std::min(nearest, std::fabs(double{x[i]} - g.Level(l)));
      }
      // Near-ties may round either way: (x + ml) / dl is evaluated in float.
      if (err > nearest + 1e-4 * std::fabs(double{g.dl}) + 1e-30) {
        // Allowed only for pinned weights: a sub-block's smallest (code 0 of a grid with a min)
        // or the weight of largest magnitude of the super-block (its sub-block's extreme).
        const int64_t s0 = i / sub * sub;
        const float* xs = x.data() + s0;
        const bool is_min =
            HasMins(t) && x[i] == *std::min_element(xs, xs + sub) && y[i] == g.Level(0);
        const bool is_extreme = HasMins(t) ? x[i] == *std::max_element(xs, xs + sub)
                                           : std::fabs(x[i]) == MaxAbs(x.data() + b0, hblock);
        if (!is_min && !is_extreme && ++bad_levels <= 3) {
          ADD_FAILURE() << Traits(t).name << " weight " << i << " = " << x[i] << " stored as "
                        << y[i] << ", nearest level is " << nearest << " away";
        }
        ++not_nearest;
      }
    }
  }
  EXPECT_EQ(over_bound, 0);
  EXPECT_EQ(bad_levels, 0);

  // Idempotence.
  std::vector<uint8_t> q2(q.size());
  QuantizeRow(t, y.data(), q2.data(), n);
  std::vector<float> y2(n);
  DequantizeRow(t, q2.data(), y2.data(), n);
  const size_t bb = Traits(t).block_bytes;
  int64_t value_changes = 0, byte_changes = 0;
  for (int64_t b = 0; b < n / bs; ++b) {
    byte_changes += std::memcmp(q.data() + b * bb, q2.data() + b * bb, bb) != 0;
    bool same = true;  // as values: Q4_0 may flip the sign of d, turning 0 into -0
    for (int64_t i = b * bs; i < (b + 1) * bs; ++i) same &= y[i] == y2[i];
    if (!same && t != DType::kQ8_K && ++value_changes <= 3) {
      ADD_FAILURE() << Traits(t).name << " block " << b << " changes when quantized again";
    }
  }
  if (t == DType::kQ8_K) {
    // Codes are recovered exactly, or all negated with d (when +127 and -127 both occur, the
    // first becomes the reference); d within a few ulps.
    for (int64_t b = 0; b < n / bs; ++b) {
      const auto& b1 = reinterpret_cast<const BlockQ8_K*>(q.data())[b];
      const auto& b2 = reinterpret_cast<const BlockQ8_K*>(q2.data())[b];
      const int sign = (b1.d < 0) == (b2.d < 0) ? 1 : -1;
      for (int j = 0; j < 256; ++j) ASSERT_EQ(b2.qs[j], sign * b1.qs[j]) << b;
      for (int i = 0; i < 16; ++i) ASSERT_EQ(b2.bsums[i], sign * b1.bsums[i]) << b;
      ASSERT_LE(std::fabs(b1.d - sign * b2.d), std::fabs(b1.d) * 4e-7f) << b;
    }
  } else {
    EXPECT_EQ(value_changes, 0);
  }
  std::printf(
      "%-5s %lld values: rms error / rms value %.4g, max |err| / h %.3f, "
      "pinned off-nearest %lld, requantized blocks with other bytes %lld of %lld\n",
      std::string(Traits(t).name).c_str(), static_cast<long long>(n), std::sqrt(sq_err / sq_x),
      worst_ratio, static_cast<long long>(not_nearest), static_cast<long long>(byte_changes),
      static_cast<long long>(n / bs));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KQuantsRoundTripTest,
                         ::testing::Values(RoundTripParam{DType::kQ4_0, 2 * (1 + 0x1p-10), 8},
                                           RoundTripParam{DType::kQ2_K, 2 * (1 + 0x1p-10), 45},
                                           RoundTripParam{DType::kQ3_K, 2 * (1 + 0x1p-10), 128},
                                           RoundTripParam{DType::kQ4_K, 2 * (1 + 0x1p-10), 945},
                                           RoundTripParam{DType::kQ5_K, 2 * (1 + 0x1p-10), 1953},
                                           RoundTripParam{DType::kQ6_K, 2 * (1 + 0x1p-10), 4096},
                                           RoundTripParam{DType::kQ8_K, 0.5 + 0x1p-16, 0}),
                         [](const auto& info) {
                           return std::string(Traits(info.param.type).name);
                         });

// ---- Importance weights --------------------------------------------------------------------

class KQuantsImportanceTest : public ::testing::TestWithParam<DType> {};

TEST_P(KQuantsImportanceTest, WeightsSteerTheError) {
  const DType t = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  const int64_t n = 256 * 512;
  std::vector<float> x(n), imp(n), ones(n, 1.f);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = normal(rng);
    imp[i] = uni(rng) < 0.1f ? 50.f : uni(rng);  // a few weights matter a lot
  }
  auto weighted_error = [&](const float* importance) {
    std::vector<uint8_t> q(RowBytes(t, n));
    QuantizeRow(t, x.data(), q.data(), n, importance);
    std::vector<float> y(n);
    DequantizeRow(t, q.data(), y.data(), n);
    double e = 0;
    for (int64_t i = 0; i < n; ++i) e += imp[i] * (double{x[i]} - y[i]) * (x[i] - y[i]);
    return std::make_pair(e, q);
  };
  const auto [e_plain, q_plain] = weighted_error(nullptr);
  const auto [e_imp, q_imp] = weighted_error(imp.data());
  const auto [e_ones, q_ones] = weighted_error(ones.data());
  std::printf("%-5s importance-weighted error: uniform search %.5g, weighted search %.5g\n",
              std::string(Traits(t).name).c_str(), e_plain, e_imp);
  EXPECT_LT(e_imp, e_plain * 0.97);
  EXPECT_EQ(q_ones, q_plain);  // all-ones importance is the uniform search

  // A sub-block whose importance is all zero falls back to uniform weights.
  std::vector<float> zero(n, 0.f);
  EXPECT_EQ(weighted_error(zero.data()).second, q_plain);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KQuantsImportanceTest,
                         ::testing::Values(DType::kQ4_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                                           DType::kQ5_K, DType::kQ6_K),
                         [](const auto& info) { return std::string(Traits(info.param).name); });

// ---- Dispatch and Q8_K details -------------------------------------------------------------

TEST(KQuantsDispatchTest, DTypeRowsMatchTemplates) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int64_t n = 512;
  std::vector<float> x(n);
  for (float& f : x) f = normal(rng);
  auto check = [&](DType t, auto* block_tag) {
    using Block = std::remove_pointer_t<decltype(block_tag)>;
    SCOPED_TRACE(Traits(t).name);
    std::vector<Block> a(n / Traits(t).block_size);
    std::vector<uint8_t> b(RowBytes(t, n));
    ASSERT_EQ(a.size() * sizeof(Block), b.size());
    QuantizeRow(x.data(), a.data(), n);
    QuantizeRow(t, x.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), b.size()), 0);
    std::vector<float> ya(n), yb(n);
    DequantizeRow(a.data(), ya.data(), n);
    DequantizeRow(t, b.data(), yb.data(), n);
    EXPECT_EQ(ya, yb);
  };
  check(DType::kQ4_0, static_cast<BlockQ4_0*>(nullptr));
  check(DType::kQ2_K, static_cast<BlockQ2_K*>(nullptr));
  check(DType::kQ3_K, static_cast<BlockQ3_K*>(nullptr));
  check(DType::kQ4_K, static_cast<BlockQ4_K*>(nullptr));
  check(DType::kQ5_K, static_cast<BlockQ5_K*>(nullptr));
  check(DType::kQ6_K, static_cast<BlockQ6_K*>(nullptr));
  check(DType::kQ8_K, static_cast<BlockQ8_K*>(nullptr));
  check(DType::kQ8_0, static_cast<BlockQ8_0*>(nullptr));

  // Float types: exact copy / round to nearest even and back.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> b(RowBytes(t, n));
    QuantizeRow(t, x.data(), b.data(), n);
    std::vector<float> y(n);
    DequantizeRow(t, b.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = t == DType::kF32   ? x[i]
                         : t == DType::kF16 ? F16ToF32(F32ToF16(x[i]))
                                            : Bf16ToF32(F32ToBf16(x[i]));
      ASSERT_EQ(y[i], want) << i;
    }
  }
}

TEST(KQuantsQ8_KTest, ScaleCodesAndBlockSums) {
  float x[512] = {};
  for (int j = 0; j < 256; ++j) x[j] = 0.01f * (j - 100);
  x[7] = 2.54f;  // largest magnitude, positive: q = -127 there, d < 0
  BlockQ8_K b[2];
  QuantizeRow(x, b, 512);
  EXPECT_EQ(b[0].d, 1.f / (-127.f / 2.54f));
  EXPECT_EQ(b[0].qs[7], -127);
  for (int i = 0; i < 16; ++i) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += b[0].qs[16 * i + j];
    EXPECT_EQ(b[0].bsums[i], sum) << i;
  }
  // All-zero block: d = 0, codes and sums 0.
  EXPECT_EQ(b[1].d, 0.f);
  for (int8_t v : b[1].qs) EXPECT_EQ(v, 0);
  for (int16_t v : b[1].bsums) EXPECT_EQ(v, 0);
}

TEST(KQuantsZeroTest, AllZeroRowsStoreZeros) {
  const int64_t n = 1024;
  std::vector<float> x(n, 0.f), y(n, 1.f);
  for (DType t : {DType::kQ4_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K, DType::kQ8_K}) {
    SCOPED_TRACE(Traits(t).name);
    std::vector<uint8_t> q(RowBytes(t, n), 0xAB);
    QuantizeRow(t, x.data(), q.data(), n);
    DequantizeRow(t, q.data(), y.data(), n);
    for (float v : y) ASSERT_EQ(v, 0.f);
  }
}

}  // namespace
}  // namespace pd::engine
